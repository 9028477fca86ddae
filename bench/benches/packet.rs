//! Konnectivity `Packet` codec: konn's hand-rolled encoder/decoder against
//! prost on DATA packets of 64 B, 4 KiB (what the Go agent sends) and
//! `MAX_DATA_PAYLOAD` (one full 16 KiB HTTP/2 frame), plus a DIAL_REQ, whose
//! strings prost must allocate.
//!
//! Throughput is the gRPC message size. Encoding writes the 5-byte gRPC prefix
//! too (prost's side writes it by hand, as tonic does), into a reused buffer;
//! decoding starts from a shared `Bytes` as a driver would hold it. prost's
//! types use `Bytes` for `Data.data` (the oracle in `frames/tests/oracle/`),
//! so its decode is zero-copy for the payload as well.

use std::hint::black_box;

use bytes::{BufMut, Bytes, BytesMut};
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use konn_frames::packet::{ByteStr, MAX_DATA_PAYLOAD, Packet, encode_data_header};
use prost::Message as _;

#[allow(
    missing_docs,
    unreachable_pub,
    clippy::all,
    clippy::pedantic,
    clippy::use_self
)]
mod oracle {
    include!("../../frames/tests/oracle/konnectivity.rs");
}

const SIZES: [usize; 3] = [64, 4096, MAX_DATA_PAYLOAD];
const CONNECT_ID: i64 = 123_456;

fn data_packet(len: usize) -> Packet {
    Packet::Data {
        connect_id: CONNECT_ID,
        error: ByteStr::new(),
        data: Bytes::from(vec![0x5a; len]),
    }
}

fn prost_data(len: usize) -> oracle::Packet {
    oracle::Packet {
        r#type: oracle::PacketType::Data as i32,
        payload: Some(oracle::packet::Payload::Data(oracle::Data {
            connect_id: CONNECT_ID,
            error: String::new(),
            data: Bytes::from(vec![0x5a; len]),
        })),
    }
}

/// `bytes` in the shared representation a receive path produces (so the
/// benchmark does not measure `Bytes`' one-time promotion from a `Vec`).
fn shared(bytes: &[u8]) -> Bytes {
    let mut buf = BytesMut::with_capacity(bytes.len());
    buf.put_slice(bytes);
    let shared = buf.split().freeze();
    drop(shared.clone());
    shared
}

fn prost_encode_grpc(m: &oracle::Packet, dst: &mut BytesMut) {
    let len = m.encoded_len();
    dst.put_u8(0);
    dst.put_u32(len as u32);
    m.encode(dst).expect("buffer grows");
}

fn encode(c: &mut Criterion) {
    let mut group = c.benchmark_group("packet/encode_data");
    for len in SIZES {
        let packet = data_packet(len);
        let Packet::Data { data, .. } = &packet else {
            unreachable!()
        };
        let m = prost_data(len);
        let mut dst = BytesMut::with_capacity(2 * MAX_DATA_PAYLOAD);
        group.throughput(Throughput::Bytes((packet.encoded_len() + 5) as u64));
        group.bench_function(BenchmarkId::new("konn/encode_grpc", len), |b| {
            b.iter(|| {
                dst.clear();
                black_box(&packet).encode_grpc(&mut dst);
                black_box(dst.len())
            })
        });
        group.bench_function(BenchmarkId::new("konn/data_header+payload", len), |b| {
            b.iter(|| {
                dst.clear();
                encode_data_header(black_box(CONNECT_ID), data.len(), &mut dst);
                dst.put_slice(black_box(data));
                black_box(dst.len())
            })
        });
        group.bench_function(BenchmarkId::new("konn/data_header_only", len), |b| {
            b.iter(|| {
                dst.clear();
                encode_data_header(black_box(CONNECT_ID), black_box(len), &mut dst);
                black_box(dst.len())
            })
        });
        group.bench_function(BenchmarkId::new("prost/encode_grpc", len), |b| {
            b.iter(|| {
                dst.clear();
                prost_encode_grpc(black_box(&m), &mut dst);
                black_box(dst.len())
            })
        });
    }
    group.finish();
}

fn decode(c: &mut Criterion) {
    let mut group = c.benchmark_group("packet/decode_data");
    for len in SIZES {
        let mut encoded = Vec::new();
        data_packet(len).encode(&mut encoded);
        let input = shared(&encoded);
        group.throughput(Throughput::Bytes(input.len() as u64));
        group.bench_function(BenchmarkId::new("konn", len), |b| {
            b.iter(|| Packet::decode(black_box(&input)).expect("valid"))
        });
        group.bench_function(BenchmarkId::new("prost", len), |b| {
            b.iter(|| oracle::Packet::decode(black_box(&input).clone()).expect("valid"))
        });
        // The floor: one reference-counted slice of the input and its drop,
        // which any zero-copy decoder pays (an atomic increment and
        // decrement); on a loaded VM it is nearly all of the decode time.
        group.bench_function(BenchmarkId::new("floor_bytes_slice", len), |b| {
            b.iter(|| black_box(&input).slice(10..))
        });
    }
    group.finish();
}

fn dial_req(c: &mut Criterion) {
    let packet = Packet::DialReq {
        protocol: ByteStr::from_static("tcp"),
        address: ByteStr::from_static("kube-dns.kube-system.svc.cluster.local:53"),
        random: -4_242_424_242_424_242,
    };
    let mut encoded = Vec::new();
    packet.encode(&mut encoded);
    let input = shared(&encoded);
    let mut group = c.benchmark_group("packet/dial_req");
    group.throughput(Throughput::Bytes(input.len() as u64));
    group.bench_function("konn/decode", |b| {
        b.iter(|| Packet::decode(black_box(&input)).expect("valid"))
    });
    group.bench_function("prost/decode", |b| {
        b.iter(|| oracle::Packet::decode(black_box(&input).clone()).expect("valid"))
    });
    let mut dst = BytesMut::with_capacity(256);
    group.bench_function("konn/encode", |b| {
        b.iter(|| {
            dst.clear();
            black_box(&packet).encode(&mut dst);
        })
    });
    let m = oracle::Packet::decode(input.clone()).expect("valid");
    group.bench_function("prost/encode", |b| {
        b.iter(|| {
            dst.clear();
            black_box(&m).encode(&mut dst).expect("buffer grows");
        })
    });
    group.finish();
}

criterion_group!(benches, encode, decode, dial_req);
criterion_main!(benches);
