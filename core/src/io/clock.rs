//! The one place the drivers read the clock.
//!
//! The sans-IO state machines take `Instant`s as arguments; drivers call
//! [`now`] and pass the result in. Going through monoio's clock keeps the
//! door open for its paused test clock.

use std::time::Instant;

/// The current time, for feeding the state machines.
pub fn now() -> Instant {
    monoio::time::Instant::now().into_std()
}
