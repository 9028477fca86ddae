//! Ports for tests.
//!
//! [`free_port`] is the one way the suites pick a port they do not bind
//! themselves: for a child process's listener (which must pass upstream's
//! port checks) and for an address nothing listens on.

use std::sync::atomic::{AtomicU32, Ordering};

/// A free TCP port on 127.0.0.1 (bound and released): for a child
/// process's listener started on it right away, or as an address nothing
/// listens on.
///
/// Drawn from 20000–32767, not from the kernel's ephemeral range: upstream's
/// flag validation (which konn keeps) refuses ports above 49151, and a port
/// outside the ephemeral range cannot be taken meanwhile by an outgoing
/// connection.
pub fn free_port() -> u16 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let seed = std::process::id().wrapping_mul(2_654_435_761);
    for _ in 0..2000 {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = 20_000 + (seed.wrapping_add(n.wrapping_mul(7919)) % 12_768) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_distinct_and_accepted_by_upstream() {
        let a = free_port();
        let b = free_port();
        assert_ne!(a, b);
        for port in [a, b] {
            assert!((20_000..32_768).contains(&port), "{port}");
        }
    }
}
