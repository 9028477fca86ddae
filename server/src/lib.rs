//! # konn-server: the proxy-server binary's library
//!
//! Everything `proxy-server` does lives here so tests can drive it in-process;
//! `main.rs` only parses flags, sets up logging and starts it.
//! Being built (issue "proxy-server"); modules are added as they land.

pub mod health;
pub mod metrics;
pub mod options;
