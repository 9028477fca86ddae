//! # konn-server: the proxy-server binary's library
//!
//! Everything `proxy-server` does lives here so tests can drive it in-process;
//! `main.rs` only parses flags, sets up logging and starts it.
//!
//! - [`backends`]: the backend directory and the proxy strategies.
//! - [`router`]: the per-core protocol state machine (sans-IO).

pub mod backends;
pub mod router;
