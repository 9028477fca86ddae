//! Fuzz target for the HPACK decoder and encoder.
//!
//! The input is a sequence of chunks `[ctrl] [len] [len bytes of block]`,
//! decoded in order by one `Decoder` (so the dynamic table carries over, as
//! on a connection). If `ctrl`'s high bit is set, our table size setting
//! becomes `(ctrl & 0x7f) * 64` before the block. Decoding must never
//! panic. A connection error ends the run, as it would end a connection;
//! `HeaderListTooLarge` does not.
//!
//! Every list that decodes is encoded by a fresh `Encoder` and decoded by a
//! fresh `Decoder`, which must give back the same list (never-indexed
//! marks included). The whole input also goes through a Huffman round trip.
#![no_main]
use konn_frames::Error;
use konn_frames::hpack::{Decoder, Encoder, Field, huffman};
use libfuzzer_sys::fuzz_target;

/// An owned decoded field: `(name, value, never_indexed)`.
type Owned = (Vec<u8>, Vec<u8>, bool);

fuzz_target!(|data: &[u8]| {
    huffman_round_trip(data);
    let mut dec = Decoder::new(4096);
    let mut rest = data;
    while let [ctrl, len, tail @ ..] = rest {
        let (block, tail) = tail.split_at(usize::from(*len).min(tail.len()));
        rest = tail;
        if ctrl & 0x80 != 0 {
            dec.set_max_table_size(u32::from(ctrl & 0x7f) * 64);
        }
        let mut list: Vec<Owned> = Vec::new();
        let res = dec.decode(block, &mut |f| {
            list.push((f.name.to_vec(), f.value.to_vec(), f.never_indexed))
        });
        match res {
            Ok(()) => re_encode(&list),
            Err(Error::HeaderListTooLarge { .. }) => {}
            Err(e) => {
                assert!(e.h2().is_some(), "HPACK errors map to HTTP/2 errors");
                break;
            }
        }
    }
});

/// Encodes `list` with a fresh encoder; a fresh decoder must return it.
fn re_encode(list: &[Owned]) {
    let mut enc = Encoder::new();
    let mut block = Vec::new();
    enc.encode(
        list.iter().map(|(name, value, sensitive)| Field {
            name,
            value,
            sensitive: *sensitive,
        }),
        &mut block,
    );
    let mut again: Vec<Owned> = Vec::new();
    Decoder::new(4096)
        .decode(&block, &mut |f| {
            again.push((f.name.to_vec(), f.value.to_vec(), f.never_indexed))
        })
        .expect("re-encoded list decodes");
    assert_eq!(again, list);
}

/// Huffman-encodes `data` and decodes it back.
fn huffman_round_trip(data: &[u8]) {
    let mut enc = Vec::new();
    huffman::encode(data, &mut enc);
    assert_eq!(enc.len(), huffman::encoded_len(data));
    let mut dec = Vec::new();
    huffman::decode(&enc, &mut dec).expect("own Huffman output decodes");
    assert_eq!(dec, data);
}
