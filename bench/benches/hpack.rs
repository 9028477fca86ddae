//! HPACK benchmarks (`konn_frames::hpack`).
//!
//! The header list is the request grpc-go sends when a Konnectivity agent
//! connects (`/AgentService/Connect`). The decode inputs are the bytes
//! golang.org/x/net v0.62.0 `http2/hpack.Encoder` (grpc-go's encoder)
//! produces for it: every field indexed on a full match, otherwise
//! incrementally indexed, Huffman when shorter.
//!
//! - `decode/cold`: the first block on a connection (empty dynamic table):
//!   Huffman strings, literals and seven insertions. Each iteration gets a
//!   fresh decoder (made outside the timing).
//! - `decode/warm`: the second block, all nine fields indexed.
//! - `encode/cold`, `encode/warm`: our encoder producing the two blocks
//!   (the same bytes as Go's but for one equally long name index).
//! - `huffman/decode`, `huffman/encode`: the Huffman coder alone, on the
//!   list's values concatenated (throughput in Huffman-coded bytes).
//!
//! Throughput is in bytes of header block decoded or written.
use std::hint::black_box;

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use konn_frames::hpack::{Decoder, Encoder, Field, HeaderField, huffman};

/// The agent's Connect request headers, in grpc-go's order.
const REQUEST: [(&[u8], &[u8]); 9] = [
    (b":method", b"POST"),
    (b":scheme", b"https"),
    (b":path", b"/AgentService/Connect"),
    (b":authority", b"127.0.0.1:8091"),
    (b"content-type", b"application/grpc"),
    (b"user-agent", b"grpc-go/1.81.1"),
    (b"te", b"trailers"),
    (b"agentid", b"6f1e2b4c-9a3d-4e7f-8b21-5c0d9e8f7a61"),
    (b"agentidentifiers", b"host=node1&ipv4=10.0.0.5"),
];

fn fields() -> impl Iterator<Item = Field<'static>> {
    REQUEST.iter().map(|&(n, v)| Field::new(n, v))
}

/// grpc-go's first block for [`REQUEST`] on a connection (hex).
const GO_COLD: &str = "8387458f62198b527716cee62158bc7aaa2913418a089d5c0b8170dc780f875f8b1d75d0620d263d4c4d\
    65647a8a9acac8b4c7602bbc15c340027465864d833505b11f40851cc5a926939a72509451b4459f1b322cd15d956\
    7a310566c8091f2bd2ba3703f408b1cc5a92690b524d298b623919ce84c151e4287e0d5f76a0081702e05db";

/// grpc-go's second block for [`REQUEST`]: all indexed.
const GO_WARM: &str = "8387c4c3c2c1c0bfbe";

fn unhex(hex: &str) -> Vec<u8> {
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex"))
        .collect()
}

/// Our encoder's first and second blocks for [`REQUEST`].
fn blocks() -> (Vec<u8>, Vec<u8>) {
    let mut enc = Encoder::new();
    let mut cold = Vec::new();
    enc.encode(fields(), &mut cold);
    let mut warm = Vec::new();
    enc.encode(fields(), &mut warm);
    (cold, warm)
}

/// Decodes `block`, folding every field into a value the optimizer keeps.
fn decode(dec: &mut Decoder, block: &[u8]) -> usize {
    let mut total = 0;
    dec.decode(block, &mut |f: HeaderField<'_>| {
        total += f.name.len() ^ f.value.len()
    })
    .expect("block decodes");
    total
}

fn bench_decode(c: &mut Criterion) {
    let (cold, warm) = (unhex(GO_COLD), unhex(GO_WARM));
    let mut group = c.benchmark_group("hpack/decode");

    group.throughput(Throughput::Bytes(cold.len() as u64));
    group.bench_function("cold", |b| {
        b.iter_batched_ref(
            || Decoder::new(4096),
            |dec| black_box(decode(dec, black_box(&cold))),
            BatchSize::SmallInput,
        )
    });

    let mut dec = Decoder::new(4096);
    decode(&mut dec, &cold);
    group.throughput(Throughput::Bytes(warm.len() as u64));
    group.bench_function("warm", |b| {
        b.iter(|| black_box(decode(&mut dec, black_box(&warm))))
    });
    group.finish();
}

fn bench_encode(c: &mut Criterion) {
    let (cold, warm) = blocks();
    let mut group = c.benchmark_group("hpack/encode");

    group.throughput(Throughput::Bytes(cold.len() as u64));
    group.bench_function("cold", |b| {
        b.iter_batched_ref(
            || (Encoder::new(), Vec::with_capacity(256)),
            |(enc, out)| {
                enc.encode(fields(), out);
                black_box(out.len())
            },
            BatchSize::SmallInput,
        )
    });

    let mut enc = Encoder::new();
    enc.encode(fields(), &mut Vec::new());
    let mut out = Vec::with_capacity(256);
    group.throughput(Throughput::Bytes(warm.len() as u64));
    group.bench_function("warm", |b| {
        b.iter(|| {
            out.clear();
            enc.encode(fields(), &mut out);
            black_box(out.len())
        })
    });
    group.finish();
}

fn bench_huffman(c: &mut Criterion) {
    // Every value of the request, concatenated: typical header text.
    let text: Vec<u8> = REQUEST
        .iter()
        .flat_map(|&(_, v)| v.iter().copied())
        .collect();
    let mut encoded = Vec::new();
    huffman::encode(&text, &mut encoded);
    let mut group = c.benchmark_group("hpack/huffman");
    group.throughput(Throughput::Bytes(encoded.len() as u64));
    let mut out = Vec::with_capacity(2 * text.len());
    group.bench_function("decode", |b| {
        b.iter(|| {
            out.clear();
            huffman::decode(black_box(&encoded), &mut out).expect("valid");
            black_box(out.len())
        })
    });
    let mut out = Vec::with_capacity(text.len());
    group.bench_function("encode", |b| {
        b.iter(|| {
            out.clear();
            huffman::encode(black_box(&text), &mut out);
            black_box(out.len())
        })
    });
    group.finish();
}

criterion_group!(benches, bench_decode, bench_encode, bench_huffman);
criterion_main!(benches);
