//! # konn-testkit: what the test suites of konn share
//!
//! The acceptance suites of proxy-server and proxy-agent (`server/tests`,
//! `agent/tests`), the socket and allocation tests of konn-core and
//! konn-frames (a dev-dependency cycle, which cargo allows), and
//! konn-bench's demo and harness use these tools; nothing here runs in
//! production.
//!
//! - [`alloc`]: a global allocator counting each thread's allocations.
//! - [`blocking`]: a blocking socket read that retries `EINTR`.
//! - [`ports`]: free ports for listeners of child processes and addresses
//!   nothing listens on.
//! - [`fds`]: this process's descriptors, the serialisation of the tests
//!   that count them, and the leak check back to a baseline.
//! - [`files`]: temporary directories and files, a path that does not exist.
//! - [`wait`]: polling a condition with a deadline (never a fixed sleep).
//! - [`pki`]: a throw-away CA and certificates, in memory or written to disk.
//! - [`procs`]: running the real binaries as child processes.
//! - [`dest`]: destinations (echo, HTTP, bulk sink and source, an address
//!   that never answers) on plain threads.
//! - [`frontend`]: a konnectivity-client-like gRPC frontend client.
//! - [`connect`]: an HTTP CONNECT frontend client, as kube-apiserver dials.
//! - [`relay`]: a TCP load balancer whose connections can be cut.
//! - [`chaos`]: a TCP relay with faults switched at run time (delay,
//!   jitter, bandwidth cap, stall, blackhole, RST, corruption, half-close).
//! - [`bulk`]: [`Pattern`], [`Sha256`]: reproducible bulk data and its digest.
//! - [`h2raw`]: a blocking raw-frame HTTP/2 client (TCP or Unix socket)
//!   for attack tests.
//! - [`agentprobe`]: a raw `/AgentService/Connect` call with any metadata.
//! - [`fakekube`]: a fake kube-apiserver answering TokenReviews.
//! - [`kube`]: a real etcd + kube-apiserver (`target/kube/`) for the
//!   token and lease suites.
//! - [`netns`]: network namespaces of a test's own (`ip netns`, `setns`).
//! - [`dns`]: a tiny DNS server whose answers can change per query.
//! - [`engine_flag`]: the io engine setting that runs a test on an engine.

pub mod agentprobe;
pub mod alloc;
pub mod blocking;
pub mod bulk;
pub mod chaos;
pub mod connect;
pub mod dest;
pub mod dns;
pub mod error;
pub mod fakekube;
pub mod fds;
pub mod files;
pub mod frontend;
pub mod h2raw;
pub mod kube;
pub mod netns;
pub mod pki;
pub mod ports;
pub mod procs;
pub mod relay;
pub mod wait;

pub use bulk::{Pattern, Sha256, sha256_hex};
pub use error::Error;

use konn_core::io::runtime::{Engine, IoEngine};

/// The io engine setting that makes a runtime use `engine` (tests run once
/// per available engine).
pub fn engine_flag(engine: Engine) -> IoEngine {
    match engine {
        Engine::IoUring => IoEngine::IoUring,
        Engine::Epoll => IoEngine::Epoll,
    }
}
