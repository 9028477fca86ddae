//! Checks the HPACK allocation claims with a counting allocator: once a
//! decoder or encoder has seen a connection's blocks, decoding and encoding
//! more blocks like them allocates nothing (no allocation per field or per
//! dynamic table insertion).
//!
//! This is a separate test binary because it installs a global allocator
//! (konn-testkit's, counting per thread).

use konn_frames::hpack::{Decoder, Encoder, Field};
use konn_testkit::alloc::{CountingAlloc, allocations_in, assert_counting};

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

/// Allocations `f` makes on this thread.
fn allocations(f: impl FnOnce()) -> u64 {
    allocations_in(f).0
}

/// A request list with Huffman-coded, literal and indexed fields; `n`
/// varies two values so every block inserts (and evicts) entries.
fn request(n: usize, id: &mut String) -> [Field<'_>; 8] {
    use std::fmt::Write;
    id.clear();
    write!(id, "6f1e2b4c-9a3d-4e7f-8b21-{n:012}").unwrap();
    let id = id.as_bytes();
    [
        Field::new(b":method", b"POST"),
        Field::new(b":scheme", b"https"),
        Field::new(b":path", b"/AgentService/Connect"),
        Field::new(b":authority", b"127.0.0.1:8091"),
        Field::new(b"content-type", b"application/grpc"),
        Field::new(b"agentid", id),
        Field::new(b"x-request-id", id),
        Field::sensitive(b"authorization", b"Bearer c2VjcmV0"),
    ]
}

#[test]
fn steady_state_decoding_and_encoding_do_not_allocate() {
    assert_counting();

    let mut enc = Encoder::new();
    let mut dec = Decoder::new(4096);
    let mut block = Vec::with_capacity(4096);
    let mut id = String::with_capacity(64);
    let mut seen = 0usize;

    let mut round = |n: usize, enc: &mut Encoder, dec: &mut Decoder, seen: &mut usize| {
        block.clear();
        enc.encode(request(n, &mut id), &mut block);
        dec.decode(&block, &mut |f| *seen += f.name.len() + f.value.len())
            .unwrap();
    };

    // Warm up: fill the dynamic tables until they evict and let the
    // scratch buffers reach their working size.
    for n in 0..200 {
        round(n, &mut enc, &mut dec, &mut seen);
    }
    assert!(dec.table_size() > 4096 - 200, "table is full and evicting");

    let count = allocations(|| {
        for n in 200..1200 {
            round(n, &mut enc, &mut dec, &mut seen);
        }
    });
    assert_eq!(count, 0, "steady-state HPACK allocated {count} times");
    assert!(seen > 0);
}
