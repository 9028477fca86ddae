//! # konn-frames: the wire codecs of konn
//!
//! Pure, sans-IO codecs for every wire format konn speaks with peers it does
//! not control (kube-apiserver's konnectivity-client, grpc-go agents and
//! servers, curl and kube-apiserver over HTTP CONNECT):
//!
//! ```text
//!   TCP/TLS bytes
//!        │
//!        ▼
//!   h2::  ── 9-byte frame header, every RFC 9113 frame type, preface
//!        │ HEADERS/CONTINUATION fragments        DATA payloads
//!        ▼                                            ▼
//!   hpack:: ── RFC 7541 decoder/encoder      grpc:: ── 5-byte message prefix,
//!        │                                        │    status, timeout, metadata
//!        ▼                                        ▼
//!   request/response headers               packet:: ── Konnectivity `Packet`
//!
//!   connect:: ── HTTP/1.1 CONNECT request parser and response writer
//!   url:: ── percent-decoding and query parsing as Go's net/url
//!   addr::    ── strict host:port destinations (the reverse direction)
//! ```
//!
//! ## Rules this crate keeps
//! - **No IO, no clock, no randomness, no runtime.** Bytes in, typed values
//!   out, and back. The only dependency is `bytes`.
//! - **Incomplete input is not an error.** Incremental decoders return
//!   `Ok(None)` ("need more bytes") and report how many bytes they consumed.
//! - **Limits are checked before buffering.** Frame and message sizes are
//!   rejected from their headers alone.
//! - **Encoding writes into caller-owned buffers** (`BufMut`).
//! - **Zero-copy where it matters:** a decoded DATA packet's payload is a
//!   slice of the receive buffer.
//! - **No input panics.** Every decoder has a fuzz target in `fuzz/`.
//! - One error type, [`Error`]; wire codes are open newtypes ([`Reason`],
//!   [`GrpcStatus`]).
#![forbid(unsafe_code)]

pub mod addr;
pub mod codes;
pub mod connect;
pub mod error;
pub mod grpc;
pub mod h2;
pub mod hpack;
pub mod packet;
pub mod url;

pub use codes::{GrpcStatus, Reason};
pub use error::{Error, Scope};
