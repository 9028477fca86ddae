//! # konn-agent: the proxy-agent binary's library
//!
//! Everything `proxy-agent` does lives here so tests can drive it in-process;
//! `main.rs` only parses flags, sets up logging and starts it.
//! Being built (issue "proxy-agent"); modules are added as they land.

pub mod health;
pub mod metrics;
pub mod options;
