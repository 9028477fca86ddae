//! Waiting for a condition with a deadline: the suites' only way to wait
//! for something another thread does (a fixed sleep is not
//! synchronisation).

use std::time::Duration;

/// The bound of every wait that is not itself under test.
pub const WAIT: Duration = Duration::from_secs(20);

/// Polls `cond` every 5 ms until it holds (true) or `limit` passes (false).
pub fn wait_until(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = konn_core::io::clock::now() + limit;
    loop {
        if cond() {
            return true;
        }
        if konn_core::io::clock::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn true_at_once_false_after_the_limit() {
        assert!(wait_until(Duration::ZERO, || true));
        let mut calls = 0;
        assert!(!wait_until(Duration::from_millis(20), || {
            calls += 1;
            false
        }));
        assert!(calls >= 2, "polled more than once: {calls}");
    }
}
