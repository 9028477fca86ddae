//! # konn-agent: the proxy-agent binary's library
//!
//! Everything `proxy-agent` does lives here so tests can drive it in-process;
//! `main.rs` only parses flags, sets up logging and starts it.
//!
//! - [`tunnel`]: the per-tunnel protocol state machine (sans-IO).
//! - [`conn`]: one tunnel on a socket, with the endpoints it relays.
//! - [`client`]: opening a tunnel (dial, TLS, HTTP/2, the Connect call).

pub mod client;
pub mod conn;
pub mod tunnel;
