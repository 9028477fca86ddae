//! Shared pieces of the interop tests against grpc-go (`interop_grpc.rs`):
//! the deterministic packet sequences (`seq`, twin of the Go peer's), konn's
//! side of an exchange as a driver handler (`peer`), and building and running
//! the Go peer program (`go`).

#![allow(dead_code, unreachable_pub)]

pub mod go;
pub mod peer;
pub mod seq;
