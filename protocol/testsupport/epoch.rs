//! The origin of the simulated clock of konn-protocol's unit tests.
//!
//! The crate's sources never read the clock (the sans-IO rule, checked by
//! grepping `src/`); its tests need one real `Instant` to derive every
//! other instant from (`t0 + d`), so they read the clock once, here,
//! outside `src/`.

use std::sync::OnceLock;
use std::time::Instant;

/// A fixed point in time (`t0 + d` for every instant of a test).
pub(crate) fn test_epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    #[allow(clippy::disallowed_methods)] // the simulated clock's origin
    *EPOCH.get_or_init(Instant::now)
}
