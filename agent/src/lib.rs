//! # konn-agent: the proxy-agent binary's library
//!
//! Everything `proxy-agent` does lives here so tests can drive it in-process;
//! `main.rs` only parses flags, sets up logging and starts it. The protocol
//! — the per-tunnel state machine and the server set with its sync timing —
//! is sans-IO and lives in `konn_protocol::agent`; this crate is the IO and
//! the wiring around it.
//!
//! - [`options`]: the command line (every upstream v0.36 flag, konn's own).
//! - [`settings`]: the run-time settings the options map onto (tests build
//!   them directly).
//! - [`allow`]: `--allowed-destination-cidrs`, what the control plane may
//!   dial into the node network.
//! - [`conn`]: one tunnel on a socket, with the endpoints it relays.
//! - [`client`]: opening a tunnel (dial, TLS, HTTP/2, the Connect call).
//! - [`resume`]: resumable tunnels (`konn-resume`): where a worker's broken
//!   tunnels wait for the reconnect that resumes them.
//! - [`metrics`], [`health`]: upstream's metrics and endpoints;
//!   [`debug`]: konn's `/debug/connections`.
//! - [`leases`]: `--count-server-leases` (a watch on the server Leases).
//! - [`run`]: the running agent: workers, tunnels, sync loop, DRAIN, the
//!   health and admin ports.

pub mod allow;
pub mod client;
pub mod conn;
pub mod debug;
pub mod error;
pub mod health;
pub mod leases;
pub mod metrics;
pub mod netaddr;
pub mod options;
pub mod resume;
pub mod reverse;
pub mod run;
pub mod settings;

pub use error::Error;
