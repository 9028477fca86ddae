//! I/O side of the engine: what the binaries share to run the sans-IO state
//! machines on real sockets.
//!
//! - [`tls`]: the TLS layer (rustls) that drivers put between a socket and the
//!   HTTP/2 state machine, and the configuration builders for the Go flags.

pub mod clock;
pub mod driver;
pub mod notify;
pub mod tls;
