//! # konn-core: the tunnel engine
//!
//! Shared by `proxy-server` and `proxy-agent`. Two layers:
//! - `proto`: sans-IO state machines (HTTP/2 connection, gRPC streams, the
//!   Konnectivity dial/data/close tables). No sockets, no clock, no
//!   randomness: time and ids are passed in.
//! - `io`: the thread-per-core monoio runtime, io engine selection
//!   (io_uring with epoll fallback), buffer pools, TLS, and the drivers that
//!   pump bytes between sockets and the state machines.
//!
//! Errors of every module are [`Error`].

pub mod alloc;
pub mod cli;
pub mod error;
pub mod http1;
pub mod io;
pub mod log;
pub mod metrics;
pub mod proto;

pub use error::Error;
