//! # konn-server: the proxy-server binary's library
//!
//! Everything `proxy-server` does lives here so tests can drive it in-process;
//! `main.rs` only parses flags, sets up logging and starts it. The protocol
//! itself — the per-core router and the backend directory with the proxy
//! strategies — is sans-IO and lives in `konn_protocol::server`; this crate
//! is the IO and the wiring around it.
//!
//! - [`options`]: the command line (every upstream v0.36 flag, konn's own).
//! - [`clusters`]: `--clusters-config`, one server for many clusters.
//! - [`settings`]: run-time settings built from the options.
//! - [`worker`]: one worker's state and the hand-off between connections.
//! - [`agents`]: the agent port (`/AgentService/Connect` → backends);
//!   [`auth`]: agent token authentication (calls held for a TokenReview).
//! - [`kube`]: the Kubernetes side: TokenReview and the lease controller on
//!   the control-plane thread.
//! - [`frontend`]: gRPC frontends (`/ProxyService/Proxy` → frontends).
//! - [`connect`]: HTTP CONNECT frontends.
//! - [`budget`]: `--memory-budget` for data queued towards gRPC frontends.
//! - [`overload`]: `--overload-memory-watermark`: new dials refused while
//!   pooled memory in use is above it (the admission limits themselves are
//!   sans-IO, `konn_protocol::server::limits`).
//! - [`resume`]: resumable tunnels (`konn-resume`): tokens, parked
//!   backends, resuming them on a new stream.
//! - [`reverse`]: the reverse direction (KEP-2025): dialling allowed
//!   control-plane destinations for agents.
//! - [`serve`]: listeners, workers, cross-core announcements, migration.
//! - [`metrics`], [`health`]: upstream's metrics and endpoints.
//! - [`accounting`], [`audit`]: per-connection accounting (konn): byte and
//!   duration metrics, the dial audit log, `/debug/connections`.

pub mod accounting;
pub mod agents;
pub mod audit;
pub mod auth;
pub mod budget;
pub mod cluster;
pub mod clusters;
pub mod connect;
pub mod error;
pub mod frontend;
pub mod health;
pub mod kube;
pub mod metrics;
pub mod options;
pub mod overload;
pub mod resume;
pub mod reverse;
pub mod serve;
pub mod settings;
pub mod worker;

pub use error::Error;
