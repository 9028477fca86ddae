//! konn-bench: benchmarks of konn, and the tools the demo, process-level
//! tests and benchmarks share.
//!
//! - `benches/`: criterion micro-benchmarks of the wire codecs
//!   (`cargo bench -p konn-bench`), reported in docs/BENCHMARKS.md.
//! - [`pki`]: a throw-away CA and certificates written to disk.
//! - [`dest`]: destinations (echo, HTTP) on plain threads.
//! - [`frontend`]: a konnectivity-client-like gRPC frontend client.
//! - [`procs`]: running the real binaries as child processes.
//! - [`relay`]: a TCP load balancer whose connections can be cut.
//! - `src/bin/konn-demo.rs`: the README's demo.

pub mod dest;
pub mod frontend;
pub mod pki;
pub mod procs;
pub mod relay;

/// SHA-256 of `data`, as lower-case hex.
pub fn sha256_hex(data: &[u8]) -> String {
    aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, data)
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}
