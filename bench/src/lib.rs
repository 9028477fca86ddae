//! konn-bench: benchmarks of konn, and the tools the demo, process-level
//! tests and benchmarks share.
//!
//! - `benches/`: criterion micro-benchmarks of the wire codecs
//!   (`cargo bench -p konn-bench`), reported in docs/BENCHMARKS.md.
//! - [`pki`]: a throw-away CA and certificates written to disk.
//! - [`dest`]: destinations (echo, HTTP) on plain threads.
//! - [`dest`]: destinations (echo, HTTP, bulk sink and source, an
//!   address that never answers) on plain threads.
//! - [`frontend`]: a konnectivity-client-like gRPC frontend client.
//! - [`connect`]: an HTTP CONNECT frontend client, as kube-apiserver dials.
//! - [`relay`]: a TCP load balancer whose connections can be cut.
//! - [`procs`]: running the real binaries as child processes.
//! - [`agentprobe`]: a raw `/AgentService/Connect` call with any metadata.
//! - [`fakekube`]: a fake kube-apiserver answering TokenReviews.
//! - [`kube`]: a real etcd + kube-apiserver (`target/kube/`) for the
//!   token and lease suites.
//! - [`Pattern`], [`Sha256`]: reproducible bulk data and its digest.
//! - `src/bin/konn-demo.rs`: the README's demo.

pub mod agentprobe;
pub mod connect;
pub mod dest;
pub mod error;
pub mod fakekube;
pub mod fds;
pub mod frontend;
pub mod harness;
pub mod kube;
pub mod pki;
pub mod procs;
pub mod relay;

pub use error::Error;

/// SHA-256 of `data`, as lower-case hex.
pub fn sha256_hex(data: &[u8]) -> String {
    aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, data)
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Incremental SHA-256.
pub struct Sha256(aws_lc_rs::digest::Context);

impl Default for Sha256 {
    fn default() -> Self {
        Self::new()
    }
}

impl Sha256 {
    /// An empty digest.
    pub fn new() -> Self {
        Self(aws_lc_rs::digest::Context::new(&aws_lc_rs::digest::SHA256))
    }

    /// Add `data`.
    pub fn update(&mut self, data: &[u8]) {
        self.0.update(data);
    }

    /// The digest of everything added, as lower-case hex (as [`sha256_hex`]).
    pub fn finish_hex(self) -> String {
        self.0
            .finish()
            .as_ref()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }
}

/// A reproducible, endless byte stream for bulk transfers: pseudo-random
/// bytes from `seed`, with the stream offset stamped (big-endian `u64`)
/// at every 4 KiB boundary, so no two 4 KiB blocks are alike and a lost,
/// repeated or reordered chunk changes the digest. Cheap to produce (one
/// copy per byte), so it is not the bottleneck of a transfer.
pub struct Pattern {
    table: Vec<u8>,
    offset: u64,
}

/// Length of the pseudo-random table behind a [`Pattern`] (prime, so
/// its repetitions do not line up with packet or stamp boundaries).
const PATTERN_TABLE: usize = 65_521;

/// Distance between two offset stamps of a [`Pattern`].
const PATTERN_STAMP: u64 = 4096;

impl Pattern {
    /// The stream of `seed`, from its start.
    pub fn new(seed: u64) -> Self {
        let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let mut table = Vec::with_capacity(PATTERN_TABLE + 8);
        while table.len() < PATTERN_TABLE {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            table.extend_from_slice(&x.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes());
        }
        table.truncate(PATTERN_TABLE);
        Self { table, offset: 0 }
    }

    /// Bytes produced so far.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Fill `buf` with the next `buf.len()` bytes of the stream.
    pub fn fill(&mut self, buf: &mut [u8]) {
        let start = self.offset;
        let mut done = 0;
        while done < buf.len() {
            let at = ((start + done as u64) % PATTERN_TABLE as u64) as usize;
            let n = (PATTERN_TABLE - at).min(buf.len() - done);
            buf[done..done + n].copy_from_slice(&self.table[at..at + n]);
            done += n;
        }
        // Stamps overlapping this range (one may have begun before it).
        let end = start + buf.len() as u64;
        let mut stamp = start.saturating_sub(7) / PATTERN_STAMP * PATTERN_STAMP;
        while stamp < end {
            for (k, byte) in stamp.to_be_bytes().iter().enumerate() {
                let at = stamp + k as u64;
                if (start..end).contains(&at) {
                    buf[(at - start) as usize] = *byte;
                }
            }
            stamp += PATTERN_STAMP;
        }
        self.offset = end;
    }
}

#[cfg(test)]
mod pattern_tests {
    use super::{Pattern, Sha256, sha256_hex};

    #[test]
    fn the_stream_does_not_depend_on_how_it_is_cut() {
        let mut whole = vec![0u8; 300_000];
        Pattern::new(7).fill(&mut whole);
        let mut pieces = Vec::new();
        let mut p = Pattern::new(7);
        for size in [1, 4095, 3, 8, 5, 65_521, 100_000, 1] {
            let mut b = vec![0u8; size];
            p.fill(&mut b);
            pieces.extend_from_slice(&b);
        }
        let mut rest = vec![0u8; whole.len() - pieces.len()];
        p.fill(&mut rest);
        pieces.extend_from_slice(&rest);
        assert_eq!(pieces, whole);
        assert_eq!(p.offset(), 300_000);
        // Stamped offsets, and no two 4 KiB blocks alike.
        assert_eq!(whole[8192..8200], 8192u64.to_be_bytes());
        let blocks: std::collections::HashSet<&[u8]> = whole.chunks(4096).collect();
        assert_eq!(blocks.len(), whole.len().div_ceil(4096));
        let mut other = vec![0u8; 4096];
        Pattern::new(8).fill(&mut other);
        assert_ne!(other[8..], whole[8..4096]);
    }

    #[test]
    fn incremental_digest_equals_one_shot() {
        let data: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        let mut h = Sha256::new();
        for c in data.chunks(777) {
            h.update(c);
        }
        assert_eq!(h.finish_hex(), sha256_hex(&data));
    }
}
