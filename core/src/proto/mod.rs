//! Sans-IO protocol state machines.
//!
//! Nothing in this module touches sockets, threads or the clock: time is
//! passed in as `Instant` arguments and output goes into caller-owned
//! buffers. The drivers in `crate::io` run these machines on real sockets;
//! the tests run them against each other in memory with a simulated clock.
//!
//! - [`h2`]: one HTTP/2 connection, client or server role.
//! - [`grpc`]: gRPC streaming calls on top of an HTTP/2 connection.
//! - [`flow`]: receive-side flow control of one proxied connection (credit
//!   withholding, PAUSE/RESUME marks, stuck detection), shared by the
//!   agent's tunnel and the server's router.

pub mod flow;
pub mod grpc;
pub mod h2;

/// A fixed point in time for tests that simulate a clock (`t0 + d`).
#[cfg(test)]
pub(crate) fn test_epoch() -> std::time::Instant {
    use std::sync::OnceLock;
    static EPOCH: OnceLock<std::time::Instant> = OnceLock::new();
    // Reading the clock once gives the simulated clock its origin; every
    // other instant in a test is derived from it.
    #[allow(clippy::disallowed_methods)]
    *EPOCH.get_or_init(std::time::Instant::now)
}
