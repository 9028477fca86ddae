//! The one place the drivers read the clock and draw entropy.
//!
//! The sans-IO state machines (`konn-protocol`) take `Instant`s and random
//! numbers as arguments; drivers call [`now`] and [`seed`] and pass the
//! results in. Going through monoio's clock keeps the door open for its
//! paused test clock.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::time::Instant;

/// The current time, for feeding the state machines.
pub fn now() -> Instant {
    monoio::time::Instant::now().into_std()
}

/// 64 bits to seed a non-cryptographic generator (backoff jitter, backend
/// selection): the standard library's per-process random hash keys, so two
/// processes, and two calls, differ. Not for anything secret.
pub fn seed() -> u64 {
    RandomState::new().build_hasher().finish()
}

#[cfg(test)]
mod tests {
    #[test]
    fn seeds_differ() {
        assert_ne!(super::seed(), super::seed());
    }
}
