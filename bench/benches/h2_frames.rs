//! HTTP/2 frame codec benchmarks (`konn_frames::h2`).
//!
//! - `decode/data_16k_x64`: parse 64 back-to-back 16 KiB DATA frames (1 MiB),
//!   the shape of a bulk transfer at the default SETTINGS_MAX_FRAME_SIZE.
//! - `decode/control_mix`: parse a buffer of small control frames (SETTINGS,
//!   ACKs, PING, WINDOW_UPDATE, HEADERS, RST_STREAM, GOAWAY), where per-frame
//!   overhead dominates.
//! - `encode/data_head_x64`: write the 9-byte DATA headers for 64 frames,
//!   the per-frame cost on the send side when payloads go out by
//!   scatter-gather.
//!
//! Throughput is in bytes of wire data parsed or written.
use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use konn_frames::Reason;
use konn_frames::h2::{self, Frame, SettingId};

const FRAMES: usize = 64;
const FRAME_LEN: usize = 16 * 1024;

/// 64 DATA frames of 16 KiB on stream 1, the last with END_STREAM.
fn data_buffer() -> Vec<u8> {
    let payload = vec![0xa5; FRAME_LEN];
    let mut buf = Vec::with_capacity(FRAMES * (h2::HEAD_LEN + FRAME_LEN));
    for i in 0..FRAMES {
        h2::encode_data(1, &payload, i == FRAMES - 1, &mut buf);
    }
    buf
}

/// A mix of the control frames a gRPC connection exchanges.
fn control_buffer() -> Vec<u8> {
    let mut buf = Vec::new();
    for i in 0..32u32 {
        let stream = 2 * i + 1;
        h2::encode_settings(
            &[
                (SettingId::ENABLE_PUSH, 0),
                (SettingId::INITIAL_WINDOW_SIZE, 1 << 22),
            ],
            &mut buf,
        );
        h2::encode_settings_ack(&mut buf);
        h2::encode_window_update(0, 983_041, &mut buf);
        h2::encode_window_update(stream, 65_535, &mut buf);
        h2::encode_ping(
            false,
            i.to_be_bytes().repeat(2).try_into().unwrap(),
            &mut buf,
        );
        h2::encode_ping(true, [0; 8], &mut buf);
        h2::encode_headers(stream, &[0x82; 60], false, 16_384, &mut buf);
        h2::encode_rst_stream(stream, Reason::CANCEL, &mut buf);
    }
    h2::encode_goaway(63, Reason::NO_ERROR, b"shutdown", &mut buf);
    buf
}

/// Decodes every frame in `buf` and folds something out of each so the
/// work cannot be optimised away.
fn decode_all(buf: &[u8]) -> usize {
    let mut pos = 0;
    let mut acc = 0;
    while let Ok(Some((frame, used))) = h2::decode(&buf[pos..], h2::DEFAULT_MAX_FRAME_SIZE) {
        acc += match frame {
            Frame::Data { data, .. } => data.len(),
            other => other.stream_id() as usize,
        };
        pos += used;
    }
    assert_eq!(pos, buf.len());
    acc
}

fn decode(c: &mut Criterion) {
    let mut group = c.benchmark_group("h2_frames/decode");
    let data = data_buffer();
    group.throughput(Throughput::Bytes(data.len() as u64));
    group.bench_function("data_16k_x64", |b| b.iter(|| decode_all(black_box(&data))));
    let control = control_buffer();
    group.throughput(Throughput::Bytes(control.len() as u64));
    group.bench_function("control_mix", |b| {
        b.iter(|| decode_all(black_box(&control)))
    });
    group.finish();
}

fn encode(c: &mut Criterion) {
    let mut group = c.benchmark_group("h2_frames/encode");
    group.throughput(Throughput::Bytes((FRAMES * h2::HEAD_LEN) as u64));
    let mut out = Vec::with_capacity(FRAMES * h2::HEAD_LEN);
    group.bench_function("data_head_x64", |b| {
        b.iter(|| {
            out.clear();
            for i in 0..FRAMES {
                h2::encode_data_head(black_box(1), FRAME_LEN as u32, i == FRAMES - 1, &mut out);
            }
            black_box(&out);
        })
    });
    group.finish();
}

criterion_group!(benches, decode, encode);
criterion_main!(benches);
