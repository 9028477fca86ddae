//! Fuzzes `grpc::Deframer`.
//!
//! Input layout: byte 0 selects how many of the following bytes (1–8) are
//! chunk sizes; the rest is the byte stream of one gRPC stream's DATA
//! payloads. The stream is fed in chunks of those sizes (cycled; 0 makes an
//! empty chunk) and must give exactly what feeding it in one chunk gives.
//! Every returned message is then re-framed with `encode_prefix`: the result
//! must equal the consumed part of the input and deframe, in one chunk, to
//! the same messages.
#![no_main]

use bytes::Bytes;
use konn_frames::Error;
use konn_frames::grpc::{Deframer, PREFIX_LEN, encode_prefix};
use libfuzzer_sys::fuzz_target;

/// Small enough that a hostile prefix cannot make each run allocate MiBs.
const MAX: u32 = 64 * 1024;

/// Deframes `chunks` in order: the messages and how the stream ended.
fn deframe(chunks: impl IntoIterator<Item = Bytes>) -> (Vec<Bytes>, Result<(), Error>) {
    let mut d = Deframer::new(MAX);
    let mut messages = Vec::new();
    for mut chunk in chunks {
        loop {
            match d.next(&mut chunk) {
                Ok(Some(m)) => {
                    assert!(m.len() <= MAX as usize);
                    messages.push(m);
                }
                Ok(None) => {
                    assert!(chunk.is_empty(), "Ok(None) with bytes left in the chunk");
                    break;
                }
                Err(e) => {
                    assert_eq!(d.finish(), Err(e), "errors must be sticky");
                    return (messages, Err(e));
                }
            }
        }
        assert!(d.buffered() <= d.reserved().max(PREFIX_LEN));
    }
    (messages, d.finish())
}

/// Cuts `stream` into chunks whose sizes cycle through `sizes`.
fn chunks(stream: &Bytes, sizes: &[u8]) -> Vec<Bytes> {
    let mut out = Vec::new();
    let mut rest = stream.clone();
    let mut last_empty = false;
    for &s in sizes.iter().cycle() {
        if rest.is_empty() {
            break;
        }
        // At most one empty chunk in a row, so the loop always progresses.
        let size = if s == 0 && last_empty {
            1
        } else {
            usize::from(s)
        };
        last_empty = size == 0;
        out.push(rest.split_to(size.min(rest.len())));
    }
    out
}

fuzz_target!(|data: &[u8]| {
    let Some((&n, rest)) = data.split_first() else {
        return;
    };
    let n_sizes = usize::from(n % 8) + 1;
    let (sizes, stream) = rest.split_at(n_sizes.min(rest.len()));
    if sizes.is_empty() {
        return;
    }
    let stream = Bytes::copy_from_slice(stream);

    let whole = deframe([stream.clone()]);
    let chunked = deframe(chunks(&stream, sizes));
    assert_eq!(whole, chunked, "chunking changed the outcome");

    let (messages, _) = whole;
    let mut reframed = Vec::new();
    for m in &messages {
        encode_prefix(u32::try_from(m.len()).unwrap(), &mut reframed);
        reframed.extend_from_slice(m);
    }
    assert_eq!(&stream[..reframed.len()], &reframed[..]);
    let again = deframe([Bytes::from(reframed)]);
    assert_eq!(again, (messages, Ok(())));
});
