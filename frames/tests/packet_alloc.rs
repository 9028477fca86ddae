//! Proof that the packet hot path does not allocate: decoding a DATA (or any)
//! packet from a shared receive buffer and encoding one into a buffer with
//! room make zero heap allocations.
//!
//! The counting global allocator is konn-testkit's: it forwards to
//! `System` and counts per thread, so the other tests running in parallel
//! threads do not disturb the count.

use bytes::{BufMut, BytesMut};
use konn_frames::packet::{ByteStr, MAX_DATA_PAYLOAD, Packet, data_header_len, encode_data_header};
use konn_testkit::alloc::{CountingAlloc, allocations_in, assert_counting};

/// Counts each thread's allocations (konn-testkit's).
#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

#[test]
fn the_counter_counts() {
    assert_counting();
}

#[test]
fn decoding_from_a_shared_buffer_does_not_allocate() {
    let payload = vec![0x5a; MAX_DATA_PAYLOAD];
    let packets = [
        Packet::Data {
            connect_id: -7,
            error: ByteStr::from_static("late error"),
            data: payload.into(),
        },
        Packet::DialReq {
            protocol: ByteStr::from_static("tcp"),
            address: ByteStr::from_static("10.0.0.1:10250"),
            random: 42,
        },
        Packet::CloseRsp {
            error: ByteStr::from_static("reset"),
            connect_id: 1,
        },
        Packet::Drain,
    ];
    // As a driver receives: into a BytesMut, split off and frozen. Splitting
    // moves the buffer to the shared representation (allocating once per
    // receive buffer, not per packet).
    let mut rx = BytesMut::with_capacity(64 * 1024);
    for p in &packets {
        p.encode(&mut rx);
        let frozen = rx.split().freeze();
        let (n, decoded) = allocations_in(|| Packet::decode(&frozen));
        assert_eq!(n, 0, "decoding {:?} allocated", p.ty());
        let (n, ()) = allocations_in(|| drop(decoded));
        assert_eq!(n, 0);
    }
}

#[test]
fn a_vec_backed_buffer_allocates_its_shared_header_once() {
    // The caveat documented on `Packet::decode`, and a check that the
    // counter sees allocations made inside `decode` at all.
    let p = Packet::Data {
        connect_id: 1,
        error: ByteStr::new(),
        data: vec![1u8; 100].into(),
    };
    let mut v = Vec::new();
    p.encode(&mut v);
    let buf = bytes::Bytes::from(v);
    let (n, first) = allocations_in(|| Packet::decode(&buf));
    assert_eq!(n, 1, "promotion to the shared representation");
    let (n, second) = allocations_in(|| Packet::decode(&buf));
    assert_eq!(n, 0);
    assert_eq!(first, second);
}

#[test]
fn encoding_into_a_buffer_with_room_does_not_allocate() {
    let data = bytes::Bytes::from(vec![0xc3; MAX_DATA_PAYLOAD]);
    let packet = Packet::Data {
        connect_id: 12,
        error: ByteStr::new(),
        data: data.clone(),
    };
    let mut tx = BytesMut::with_capacity(4 * 16_384);
    let (n, ()) = allocations_in(|| {
        packet.encode_grpc(&mut tx);
        encode_data_header(12, data.len(), &mut tx);
        tx.put_slice(&data);
        let _ = packet.encoded_len() + data_header_len(-1, data.len());
    });
    assert_eq!(n, 0);
    let one = data_header_len(12, data.len()) + data.len();
    assert_eq!(tx.len(), 2 * one);
    assert_eq!(tx[..one], tx[one..]);
}
