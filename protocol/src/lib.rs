//! # konn-protocol: the sans-IO state machines
//!
//! Everything that decides what konn says on the wire, and nothing that
//! does IO. The crate depends only on `bytes` and `konn-frames`; it never
//! touches a socket, a thread, the clock or a source of randomness: time
//! arrives as `Instant` arguments (`now`), randomness as numbers the caller
//! drew, and output leaves through `poll_*` methods into caller-owned
//! buffers — the model of quinn-proto. The drivers in `konn-core` (and the
//! binaries' wiring in `konn-server` / `konn-agent`) run these machines on
//! real sockets; the tests run them against each other in memory with a
//! simulated clock.
//!
//! - [`h2`]: one HTTP/2 connection, client or server role.
//! - [`grpc`]: gRPC streaming calls on top of an HTTP/2 connection.
//! - [`flow`]: receive-side flow control of one proxied connection (credit
//!   withholding, PAUSE/RESUME marks, stuck detection), shared by the
//!   agent's tunnel and the server's router.
//! - [`resume`]: resumable tunnels (`konn-resume`): per-connection byte
//!   offsets, replay buffers, exactly-once delivery across a reconnect,
//!   resume tokens and the server's parked tunnels.
//! - [`server`]: proxy-server's per-core router (frontends, backends,
//!   pending dials, established connections) and its backend directory
//!   (the proxy strategies).
//! - [`agent`]: proxy-agent's per-tunnel state machine and the server set
//!   it keeps tunnels to.
//! - [`maps`]: `SmallMap`, a map sized for the one entry most connections
//!   hold (an HTTP/2 stream, a gRPC call).
//! - `sim` (feature `sim`): the in-memory harness that drives the router
//!   and the tunnel against each other on a simulated clock and checks
//!   their invariants after every step (for tests and fuzz targets).
//!
//! A protocol path never panics on any input: the crate denies `unwrap`,
//! `expect`, indexing and `panic!` outside tests, and its decoders and
//! state machines are fuzzed (`fuzz/`).

#![forbid(unsafe_code)]
#![cfg_attr(
    not(test),
    deny(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::indexing_slicing,
        clippy::panic
    )
)]

pub mod agent;
pub mod error;
pub mod flow;
pub mod grpc;
pub mod h2;
pub mod maps;
pub mod resume;
pub mod server;
#[cfg(any(test, feature = "sim"))]
pub mod sim;

pub use error::Error;

// The simulated clock's origin lives outside `src/`: nothing here reads
// the clock, not even a test.
#[cfg(test)]
#[path = "../testsupport/epoch.rs"]
mod epoch;
#[cfg(test)]
pub(crate) use epoch::test_epoch;
