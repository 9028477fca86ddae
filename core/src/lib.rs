//! # konn-core: the tunnel engine
//!
//! Shared by `proxy-server` and `proxy-agent`: everything that does IO
//! around the sans-IO state machines of `konn-protocol` (HTTP/2, gRPC, the
//! Konnectivity tables).
//! - `io`: the thread-per-core monoio runtime, io engine selection
//!   (io_uring with epoll fallback), buffer pools, TLS, and the drivers that
//!   pump bytes between sockets and the state machines.
//! - `cli`, `log`, `metrics`, `http1`: the operator surface (pflag-style
//!   flags, klog-style logging, Prometheus metrics, the health/admin HTTP
//!   server); `app`: the start-up sequence both binaries share (signals,
//!   flags, logging, validated options).
//! - `kube` (cargo feature `kube`): the Kubernetes API client on its own
//!   control-plane thread — TokenReview with a cache, the server's Lease
//!   controller, the agent's Lease counter.
//!
//! Errors of every module are [`Error`]; it wraps `konn_protocol::Error`.

pub mod alloc;
pub mod app;
pub mod cli;
pub mod error;
pub mod http1;
pub mod io;
#[cfg(feature = "kube")]
pub mod kube;
pub mod log;
pub mod memcpy;
pub mod metrics;

pub use error::Error;
