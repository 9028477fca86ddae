//! What one 16 KiB copy costs by the distance of its destination from its
//! source modulo 4 KiB (`konn_core::memcpy`, docs/decisions/0008).
//!
//! konn's copies behind a TLS record header (5 bytes) or an HTTP/2 frame
//! header (9) move data between buffers that share their page offset, so
//! their distance is such a header's length. With glibc before 2.40 on an
//! AMD CPU with FSRM, `memcpy` uses `rep movsb` from 2112 bytes up, and
//! that is about 25× slower at distances of 1–31 bytes. Run it as it is
//! (glibc's choice; a criterion process does not execute itself again)
//! and with `GLIBC_TUNABLES=glibc.cpu.x86_rep_movsb_threshold=1099511627776`
//! (what konn's binaries set there) to see both.

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};

const SIZE: usize = 16 * 1024;
/// Distances of the destination from the source, in bytes modulo 4 KiB.
const DISTANCES: [usize; 5] = [0, 5, 9, 14, 32];

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("memcpy_16k");
    group.throughput(Throughput::Bytes(SIZE as u64));
    // Both page-aligned, as two large buffers of one size class are.
    let src = PageBuf::new(SIZE);
    let mut dst = PageBuf::new(SIZE + 4096);
    for distance in DISTANCES {
        group.bench_with_input(
            BenchmarkId::new("distance", distance),
            &distance,
            |b, &d| {
                b.iter(|| {
                    dst.bytes_mut()[d..d + SIZE].copy_from_slice(std::hint::black_box(src.bytes()));
                    std::hint::black_box(dst.bytes());
                });
            },
        );
    }
    group.finish();
}

/// A zeroed buffer whose first byte starts a page.
struct PageBuf {
    raw: Vec<u8>,
    start: usize,
    len: usize,
}

impl PageBuf {
    fn new(len: usize) -> Self {
        let raw = vec![0u8; len + 4096];
        let start = raw.as_ptr().align_offset(4096);
        Self { raw, start, len }
    }
    fn bytes(&self) -> &[u8] {
        &self.raw[self.start..self.start + self.len]
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.raw[self.start..self.start + self.len]
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
