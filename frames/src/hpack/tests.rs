//! Tests across the decoder and encoder: RFC 7541 Appendix C, malformed
//! input, limits, table size signaling and round-trip properties.

use proptest::prelude::*;

use super::vectors::{GRPC_GO_BLOCKS, GRPC_GO_REQUEST, SEQUENCES, unhex};
use super::{Decoder, DecoderLimits, Encoder, Field, Repr};
use crate::{Error, Reason, Scope};

/// An owned decoded field: `(name, value, never_indexed)`.
type Owned = (Vec<u8>, Vec<u8>, bool);

/// Decodes `block`, collecting what was emitted even when it fails.
fn decode(dec: &mut Decoder, block: &[u8]) -> (Vec<Owned>, Result<(), Error>) {
    let mut out = Vec::new();
    let res = dec.decode(block, &mut |f| {
        out.push((f.name.to_vec(), f.value.to_vec(), f.never_indexed))
    });
    (out, res)
}

/// Decodes `block`, expecting success.
fn decode_ok(dec: &mut Decoder, block: &[u8]) -> Vec<Owned> {
    let (out, res) = decode(dec, block);
    res.unwrap();
    out
}

/// Decodes `block`, expecting exactly `err`.
fn decode_err(dec: &mut Decoder, block: &[u8]) -> Error {
    decode(dec, block).1.unwrap_err()
}

fn table_of_decoder(dec: &Decoder) -> Vec<(Vec<u8>, Vec<u8>)> {
    dec.dynamic_table()
        .map(|(n, v)| (n.to_vec(), v.to_vec()))
        .collect()
}

fn table_of_encoder(enc: &Encoder) -> Vec<(Vec<u8>, Vec<u8>)> {
    enc.dynamic_table()
        .map(|(n, v)| (n.to_vec(), v.to_vec()))
        .collect()
}

fn owned_table(t: &[(&str, &str)]) -> Vec<(Vec<u8>, Vec<u8>)> {
    t.iter()
        .map(|(n, v)| (n.as_bytes().to_vec(), v.as_bytes().to_vec()))
        .collect()
}

const COMPRESSION: Option<(Reason, Scope)> = Some((Reason::COMPRESSION_ERROR, Scope::Connection));

// ----- RFC 7541 Appendix C -----

#[test]
fn rfc_examples_decode_with_table_state() {
    for seq in SEQUENCES {
        let mut dec = Decoder::new(seq.table_size);
        for (i, block) in seq.blocks.iter().enumerate() {
            let what = format!("{} block {}", seq.name, i + 1);
            let got = decode_ok(&mut dec, &unhex(block.hex));
            let want: Vec<Owned> = block
                .fields
                .iter()
                .map(|&(n, v, r)| (n.into(), v.into(), r == Repr::NeverIndexed))
                .collect();
            assert_eq!(got, want, "{what}: header list");
            assert_eq!(
                table_of_decoder(&dec),
                owned_table(block.table),
                "{what}: table"
            );
            assert_eq!(dec.table_size(), block.table_size, "{what}: table size");
        }
    }
}

#[test]
fn rfc_examples_encode_byte_exact() {
    for seq in SEQUENCES {
        let mut enc = Encoder::with_table_size(seq.table_size);
        for (i, block) in seq.blocks.iter().enumerate() {
            let what = format!("{} block {}", seq.name, i + 1);
            let mut out = Vec::new();
            enc.begin_block(&mut out);
            for &(name, value, repr) in block.fields {
                let field = Field::new(name.as_bytes(), value.as_bytes());
                enc.encode_field(field, repr, seq.huffman, &mut out);
            }
            assert_eq!(out, unhex(block.hex), "{what}: bytes");
            assert_eq!(
                table_of_encoder(&enc),
                owned_table(block.table),
                "{what}: table"
            );
            assert_eq!(enc.table_size(), block.table_size, "{what}: table size");
        }
    }
}

#[test]
fn rfc_lists_through_the_policy_encoder() {
    // The policy encoder picks its own representations; what matters is
    // that a decoder gets the same lists and both tables agree.
    for seq in SEQUENCES {
        let mut enc = Encoder::with_table_size(seq.table_size);
        let mut dec = Decoder::new(seq.table_size);
        for block in seq.blocks {
            let fields = block.fields.iter().map(|&(n, v, r)| Field {
                name: n.as_bytes(),
                value: v.as_bytes(),
                sensitive: r == Repr::NeverIndexed,
            });
            let mut out = Vec::new();
            enc.encode(fields.clone(), &mut out);
            let got = decode_ok(&mut dec, &out);
            let want: Vec<Owned> = fields
                .map(|f| (f.name.to_vec(), f.value.to_vec(), f.sensitive))
                .collect();
            assert_eq!(got, want, "{}", seq.name);
            assert_eq!(
                table_of_decoder(&dec),
                table_of_encoder(&enc),
                "{}",
                seq.name
            );
        }
    }
}

#[test]
fn policy_matches_the_rfc_for_indexable_requests() {
    // C.4: every field indexed or incrementally indexed, Huffman shorter.
    let seq = SEQUENCES.iter().find(|s| s.name == "C.4").unwrap();
    let mut enc = Encoder::new();
    for block in seq.blocks {
        let mut out = Vec::new();
        enc.encode(
            block
                .fields
                .iter()
                .map(|&(n, v, _)| Field::new(n.as_bytes(), v.as_bytes())),
            &mut out,
        );
        assert_eq!(out, unhex(block.hex));
    }
}

#[test]
fn grpc_go_request_blocks() {
    let want: Vec<Owned> = GRPC_GO_REQUEST
        .iter()
        .map(|&(n, v)| (n.into(), v.into(), false))
        .collect();
    let mut dec = Decoder::new(4096);
    for hex in GRPC_GO_BLOCKS {
        assert_eq!(decode_ok(&mut dec, &unhex(hex)), want);
        // `:method: POST` and `:scheme: https` are static entries.
        assert_eq!(dec.table_len(), 7);
    }
    let newest_first: Vec<_> = GRPC_GO_REQUEST[2..].iter().rev().copied().collect();
    assert_eq!(table_of_decoder(&dec), owned_table(&newest_first));

    // Our policy makes the same choices, except that for a name-only match
    // in the static table Go names the last index with that name and we
    // the first (as the RFC examples do): `:path` is 4, not 5.
    let mut enc = Encoder::new();
    for hex in GRPC_GO_BLOCKS {
        let mut out = Vec::new();
        enc.encode(
            GRPC_GO_REQUEST
                .iter()
                .map(|&(n, v)| Field::new(n.as_bytes(), v.as_bytes())),
            &mut out,
        );
        let mut go = unhex(hex);
        if go[2] == 0x45 {
            go[2] = 0x44;
        }
        assert_eq!(out, go);
    }
}

// ----- Representations and policy -----

#[test]
fn sensitive_fields_are_never_indexed() {
    let mut enc = Encoder::new();
    let mut out = Vec::new();
    enc.encode(
        [Field::sensitive(b"authorization", b"Bearer abc")],
        &mut out,
    );
    // 0001 1111 + (23 - 15): never indexed, name index 23.
    assert_eq!(&out[..2], [0x1f, 0x08]);
    assert_eq!(enc.table_len(), 0);
    let mut dec = Decoder::default();
    let got = decode_ok(&mut dec, &out);
    assert_eq!(
        got,
        [(b"authorization".to_vec(), b"Bearer abc".to_vec(), true)]
    );
    assert_eq!(dec.table_len(), 0);
    // A second time still not indexed (no full match is ever used).
    let mut again = Vec::new();
    enc.encode(
        [Field::sensitive(b"authorization", b"Bearer abc")],
        &mut again,
    );
    assert_eq!(again, out);
}

#[test]
fn repeated_only_indexes_a_field_the_second_time_it_is_sent() {
    let mut enc = Encoder::new();
    enc.set_index_repeated_only(true);
    let mut dec = Decoder::default();
    let block = [
        Field::new(b"content-type", b"application/grpc"),
        Field::new(b"grpc-status", b"0"),
    ];
    let want: Vec<Owned> = block
        .iter()
        .map(|f| (f.name.to_vec(), f.value.to_vec(), false))
        .collect();
    let mut sizes = Vec::new();
    for round in 0..3 {
        let mut out = Vec::new();
        enc.encode(block, &mut out);
        assert_eq!(decode_ok(&mut dec, &out), want, "round {round}");
        assert_eq!(
            table_of_decoder(&dec),
            table_of_encoder(&enc),
            "round {round}"
        );
        sizes.push((out.len(), enc.table_len()));
    }
    // Sent once: no table; twice: indexed; then sent as two index bytes.
    assert_eq!(sizes[0].1, 0, "a field sent once entered the table");
    assert_eq!(sizes[1].1, 2);
    assert_eq!(sizes[2], (2, 2));
    // Many distinct fields, each sent once: the table stays empty.
    let values: Vec<String> = (0..100).map(|i| format!("v{i}")).collect();
    let mut once = Encoder::new();
    once.set_index_repeated_only(true);
    for v in &values {
        let mut out = Vec::new();
        once.encode([Field::new(b"x-once", v.as_bytes())], &mut out);
    }
    assert_eq!(once.table_len(), 0);
}

#[test]
fn large_fields_are_not_indexed() {
    let mut enc = Encoder::with_table_size(256);
    let mut out = Vec::new();
    // 10 + 150 + 32 = 192 = 3/4 of 256: indexed.
    enc.encode([Field::new(b"x-abcdefgh", &[b'v'; 150])], &mut out);
    assert_eq!(enc.table_len(), 1);
    out.clear();
    // 193: sent without indexing, table untouched.
    enc.encode([Field::new(b"x-abcdefgh", &[b'w'; 151])], &mut out);
    assert_eq!(out[0], 0x0f); // without indexing, name index 62 = 15 + 47
    assert_eq!(enc.table_len(), 1);
}

#[test]
fn huffman_only_when_shorter() {
    let mut enc = Encoder::new();
    let mut out = Vec::new();
    // "307" is 3 bytes either way: raw.
    enc.encode([Field::new(b":status", b"307")], &mut out);
    assert_eq!(out, [0x48, 0x03, b'3', b'0', b'7']);
    // "aaa" takes 15 bits; bytes 0xff and 0xfe take 26 and 27.
    out.clear();
    enc.encode([Field::new(b"aaa", &[0xff, 0xfe])], &mut out);
    assert_eq!(out[..2], [0x40, 0x82], "name is Huffman-coded");
    assert_eq!(out[4..], [0x02, 0xff, 0xfe], "value is raw");
}

#[test]
fn indexed_repr_without_match_falls_back_to_literal() {
    let mut enc = Encoder::new();
    let mut out = Vec::new();
    enc.encode_field(Field::new(b"custom", b"v"), Repr::Indexed, false, &mut out);
    assert_eq!(
        out,
        [0x00, 0x06, b'c', b'u', b's', b't', b'o', b'm', 0x01, b'v']
    );
    assert_eq!(enc.table_len(), 0);
    let mut dec = Decoder::default();
    assert_eq!(
        decode_ok(&mut dec, &out),
        [(b"custom".to_vec(), b"v".to_vec(), false)]
    );
}

#[test]
fn literal_name_from_an_entry_its_own_insertion_evicts() {
    // RFC 7541 §4.4: the name of entry 62 must survive its eviction.
    let mut dec = Decoder::new(100);
    let mut enc = Encoder::with_table_size(100);
    let first = Field::new(b"abcdefghij", &[b'a'; 40]); // 82 bytes
    let second = Field::new(b"abcdefghij", &[b'b'; 41]); // 83: evicts the first
    let mut out = Vec::new();
    enc.encode_field(first, Repr::IncrementalIndexing, false, &mut out);
    enc.encode_field(second, Repr::IncrementalIndexing, false, &mut out);
    assert_eq!(out[53], 0x7e, "second field uses name index 62");
    let got = decode_ok(&mut dec, &out);
    assert_eq!(got[1], (b"abcdefghij".to_vec(), vec![b'b'; 41], false));
    assert_eq!(
        table_of_decoder(&dec),
        [(b"abcdefghij".to_vec(), vec![b'b'; 41])]
    );
    assert_eq!(table_of_decoder(&dec), table_of_encoder(&enc));
}

#[test]
fn never_indexed_with_dynamic_name() {
    let mut dec = Decoder::default();
    // Insert custom-key: custom-header, then never-indexed with name 62.
    let mut block = unhex("400a637573746f6d2d6b65790d637573746f6d2d686561646572");
    block.extend_from_slice(&[0x1f, 0x2f, 0x01, b'z']);
    let got = decode_ok(&mut dec, &block);
    assert_eq!(got[1], (b"custom-key".to_vec(), b"z".to_vec(), true));
    assert_eq!(dec.table_len(), 1);
}

// ----- Table size updates -----

#[test]
fn encoder_signals_size_changes() {
    let mut enc = Encoder::new();
    let mut out = Vec::new();
    enc.set_max_table_size(4096);
    enc.set_max_table_size(65536); // capped at 4096: nothing to signal
    enc.begin_block(&mut out);
    assert!(out.is_empty());

    enc.set_max_table_size(256);
    enc.begin_block(&mut out);
    assert_eq!(out, [0x3f, 0xe1, 0x01]);
    assert_eq!(enc.table_max_size(), 256);

    // Shrink then grow between blocks: smallest first, then the final.
    out.clear();
    enc.set_max_table_size(0);
    enc.set_max_table_size(4096);
    enc.begin_block(&mut out);
    assert_eq!(out, [0x20, 0x3f, 0xe1, 0x1f]);
    assert_eq!(enc.table_max_size(), 4096);

    // Shrinking twice: one update, the final value.
    out.clear();
    enc.set_max_table_size(100);
    enc.set_max_table_size(50);
    enc.begin_block(&mut out);
    assert_eq!(out, [0x3f, 0x13]);
    // Dipping no lower than the current size, then growing: one update.
    out.clear();
    enc.set_max_table_size(80);
    enc.set_max_table_size(200);
    enc.begin_block(&mut out);
    assert_eq!(out, [0x3f, 0xa9, 0x01]);
    // Signaled once only.
    out.clear();
    enc.begin_block(&mut out);
    assert!(out.is_empty());
}

#[test]
fn shrink_then_grow_evicts_on_both_sides() {
    let mut enc = Encoder::new();
    let mut dec = Decoder::new(4096);
    let mut out = Vec::new();
    enc.encode([Field::new(b"k", b"v")], &mut out);
    decode_ok(&mut dec, &out);
    assert_eq!(dec.table_len(), 1);
    for size in [0, 4096] {
        enc.set_max_table_size(size);
        dec.set_max_table_size(size);
    }
    out.clear();
    enc.encode([Field::new(b"k", b"v")], &mut out);
    assert_eq!(&out[..4], [0x20, 0x3f, 0xe1, 0x1f]);
    decode_ok(&mut dec, &out);
    assert_eq!(dec.table_len(), 1);
    assert_eq!(table_of_decoder(&dec), table_of_encoder(&enc));
    assert_eq!(dec.table_max_size(), 4096);
}

#[test]
fn decoder_size_updates() {
    let mut dec = Decoder::new(4096);
    // Two updates at the start are fine; the table follows the last.
    decode_ok(&mut dec, &[0x20, 0x3f, 0xe1, 0x01, 0x82]);
    assert_eq!(dec.table_max_size(), 256);
    // Exactly our limit is fine.
    decode_ok(&mut dec, &[0x3f, 0xe1, 0x1f]);
    assert_eq!(dec.table_max_size(), 4096);
    // Above it is not.
    let e = decode_err(&mut dec, &[0x3f, 0xe2, 0x1f]);
    assert_eq!(
        e,
        Error::HpackSizeUpdateTooLarge {
            size: 4097,
            max: 4096
        }
    );
    assert_eq!(e.h2(), COMPRESSION);
    // After a field it is misplaced.
    let e = decode_err(&mut Decoder::default(), &[0x82, 0x20]);
    assert_eq!(e, Error::HpackSizeUpdateMisplaced);
    assert_eq!(e.h2(), COMPRESSION);
}

#[test]
fn lowering_our_setting_bounds_updates_and_shrinks() {
    let mut dec = Decoder::new(4096);
    decode_ok(
        &mut dec,
        &unhex("400a637573746f6d2d6b65790d637573746f6d2d686561646572"),
    );
    dec.set_max_table_size(40);
    assert_eq!(dec.table_len(), 0, "55-byte entry no longer fits");
    assert_eq!(
        decode_err(&mut dec, &[0x3f, 0x0a]),
        Error::HpackSizeUpdateTooLarge { size: 41, max: 40 }
    );
    // Raising it does not grow the table until the peer says so.
    dec.set_max_table_size(8192);
    assert_eq!(dec.table_max_size(), 40);
    decode_ok(&mut dec, &[0x3f, 0xe1, 0x3f]);
    assert_eq!(dec.table_max_size(), 8192);
}

// ----- Malformed input -----

#[test]
fn invalid_indices() {
    let e = decode_err(&mut Decoder::default(), &[0x80]);
    assert_eq!(e, Error::HpackInvalidIndex { index: 0 });
    assert_eq!(e.h2(), COMPRESSION);
    // 62 with an empty dynamic table.
    assert_eq!(
        decode_err(&mut Decoder::default(), &[0xbe]),
        Error::HpackInvalidIndex { index: 62 }
    );
    // Literal name index 62 with an empty table.
    assert_eq!(
        decode_err(&mut Decoder::default(), &[0x7e, 0x01, b'v']),
        Error::HpackInvalidIndex { index: 62 }
    );
    assert_eq!(
        decode_err(&mut Decoder::default(), &[0x0f, 0x2f, 0x01, b'v']),
        Error::HpackInvalidIndex { index: 62 }
    );
    // 62 is valid once an entry exists; 63 is not.
    let mut dec = Decoder::default();
    decode_ok(&mut dec, &[0x40, 0x01, b'k', 0x01, b'v', 0xbe]);
    assert_eq!(
        decode_err(&mut dec, &[0xbf]),
        Error::HpackInvalidIndex { index: 63 }
    );
    // A huge index.
    assert_eq!(
        decode_err(
            &mut Decoder::default(),
            &[0xff, 0x80, 0x80, 0x80, 0x80, 0x01]
        ),
        Error::HpackInvalidIndex {
            index: 127 + (1 << 28)
        }
    );
}

#[test]
fn truncated_blocks() {
    let cases: &[&[u8]] = &[
        &[0xff],                   // index needs continuation
        &[0xff, 0x80],             // continuation needs more
        &[0x40],                   // literal name length missing
        &[0x40, 0x03, b'a', b'b'], // name shorter than declared
        &[0x41],                   // value missing
        &[0x41, 0x05, b'a'],       // value shorter than declared
        &[0x41, 0x85, 0xff],       // Huffman value shorter than declared
        &[0x3f],                   // size update needs continuation
        &[0x82, 0x04, 0x7f],       // value length needs continuation
    ];
    for case in cases {
        let e = decode_err(&mut Decoder::default(), case);
        assert_eq!(e, Error::HpackTruncated, "{case:x?}");
        assert_eq!(e.h2(), COMPRESSION);
    }
}

#[test]
fn integer_overflow() {
    let cases: &[&[u8]] = &[
        &[0xff, 0xff, 0xff, 0xff, 0xff, 0x7f],       // index > u32::MAX
        &[0x3f, 0x80, 0x80, 0x80, 0x80, 0x80, 0x00], // six continuation bytes
        &[0x40, 0x7f, 0xff, 0xff, 0xff, 0xff, 0x7f], // string length
    ];
    for case in cases {
        let e = decode_err(&mut Decoder::default(), case);
        assert_eq!(e, Error::HpackIntegerOverflow, "{case:x?}");
        assert_eq!(e.h2(), COMPRESSION);
    }
}

#[test]
fn invalid_huffman() {
    let cases: &[&[u8]] = &[
        &[0x41, 0x84, 0xff, 0xff, 0xff, 0xff], // EOS inside
        &[0x41, 0x82, 0x1f, 0xff],             // 'a' + 11 bits of padding
        &[0x41, 0x81, 0x18],                   // padding 000
        &[0x40, 0x81, 0x1d, 0x00],             // name with padding 101
    ];
    for case in cases {
        let e = decode_err(&mut Decoder::default(), case);
        assert_eq!(e, Error::HpackInvalidHuffman, "{case:x?}");
        assert_eq!(e.h2(), COMPRESSION);
    }
}

#[test]
fn string_length_limit() {
    let limits = DecoderLimits {
        max_string_len: 10,
        ..DecoderLimits::default()
    };
    let mut dec = Decoder::with_limits(4096, limits);
    // Declared 11: rejected before the (missing) bytes are looked at.
    let e = decode_err(&mut dec, &[0x41, 0x0b]);
    assert_eq!(e, Error::HpackStringTooLong { len: 11, max: 10 });
    assert_eq!(e.h2(), COMPRESSION);
    // 10 is fine.
    decode_ok(
        &mut dec,
        &[
            0x41, 0x0a, b'0', b'1', b'2', b'3', b'4', b'5', b'6', b'7', b'8', b'9',
        ],
    );
    // 8 Huffman bytes that decode to 12 characters.
    let mut block = vec![0x41, 0x88];
    super::huffman::encode(b"000000000000", &mut block);
    assert_eq!(block.len(), 10);
    assert_eq!(
        decode_err(&mut dec, &block),
        Error::HpackStringTooLong { len: 12, max: 10 }
    );
}

#[test]
fn work_limits() {
    let limits = DecoderLimits {
        max_fields: 3,
        max_size_updates: 2,
        ..DecoderLimits::default()
    };
    let calm = Some((Reason::ENHANCE_YOUR_CALM, Scope::Connection));
    let mut dec = Decoder::with_limits(4096, limits);
    decode_ok(&mut dec, &[0x82, 0x82, 0x82]);
    let e = decode_err(&mut dec, &[0x82, 0x82, 0x82, 0x82]);
    assert_eq!(e, Error::HpackWorkLimit);
    assert_eq!(e.h2(), calm);
    let mut dec = Decoder::with_limits(4096, limits);
    decode_ok(&mut dec, &[0x20, 0x20, 0x82]);
    let e = decode_err(&mut dec, &[0x20, 0x20, 0x20]);
    assert_eq!(e, Error::HpackWorkLimit);
    assert_eq!(e.h2(), calm);
    // The defaults stop a block of 2000 indexed fields.
    assert_eq!(
        decode_err(&mut Decoder::default(), &[0x82; 2000]),
        Error::HpackWorkLimit
    );
}

#[test]
fn header_list_too_large_keeps_the_table_in_sync() {
    let limits = DecoderLimits {
        max_header_list_size: 100,
        ..DecoderLimits::default()
    };
    let mut dec = Decoder::with_limits(4096, limits);
    let mut enc = Encoder::new();
    let big = [b'x'; 40];
    let fields = [
        Field::new(b"a", &big), // 73
        Field::new(b"b", &big), // 146 > 100: not emitted
        Field::new(b"c", b"d"), // still decoded and indexed
    ];
    let mut out = Vec::new();
    enc.encode(fields, &mut out);
    let (got, res) = decode(&mut dec, &out);
    assert_eq!(
        res,
        Err(Error::HeaderListTooLarge {
            size: 146 + 34,
            max: 100
        })
    );
    assert_eq!(
        res.unwrap_err().h2(),
        Some((Reason::PROTOCOL_ERROR, Scope::Stream(0)))
    );
    assert_eq!(got, [(b"a".to_vec(), big.to_vec(), false)]);
    assert_eq!(dec.table_len(), 3);
    assert_eq!(table_of_decoder(&dec), table_of_encoder(&enc));
    // The connection goes on: the next block references those entries.
    out.clear();
    enc.encode([Field::new(b"c", b"d")], &mut out);
    assert_eq!(out, [0xbe]);
    assert_eq!(
        decode_ok(&mut dec, &out),
        [(b"c".to_vec(), b"d".to_vec(), false)]
    );
}

#[test]
fn empty_block_and_empty_strings() {
    let mut dec = Decoder::default();
    assert!(decode_ok(&mut dec, &[]).is_empty());
    let got = decode_ok(&mut dec, &[0x40, 0x00, 0x00, 0x00, 0x80, 0x80, 0xbe]);
    assert_eq!(got, vec![(vec![], vec![], false); 3]);
    assert_eq!(dec.table_size(), 32);
}

// ----- Properties -----

fn name() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        4 => prop::sample::select(vec![
            ":method", ":path", ":status", ":authority", "content-type", "te",
            "grpc-status", "grpc-message", "authorization", "user-agent", "agentid", "x",
        ])
        .prop_map(|s| s.as_bytes().to_vec()),
        2 => "[a-z0-9-]{1,16}".prop_map(String::into_bytes),
        1 => prop::collection::vec(any::<u8>(), 0..20),
    ]
}

fn value() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        4 => prop::sample::select(vec![
            "", "GET", "POST", "/", "200", "0", "application/grpc", "trailers", "gzip",
        ])
        .prop_map(|s| s.as_bytes().to_vec()),
        3 => prop::collection::vec(any::<u8>(), 0..48),
        1 => prop::collection::vec(any::<u8>(), 0..3000),
    ]
}

fn field() -> impl Strategy<Value = Owned> {
    (name(), value(), prop::bool::weighted(0.1))
}

/// One block: the table size settings applied before it, then its fields.
fn step() -> impl Strategy<Value = (Vec<u32>, Vec<Owned>)> {
    (
        prop::collection::vec(prop_oneof![0u32..300, 0u32..6000], 0..3),
        prop::collection::vec(field(), 0..12),
    )
}

fn roomy_limits() -> DecoderLimits {
    DecoderLimits {
        max_header_list_size: u32::MAX,
        max_string_len: u32::MAX,
        max_fields: u32::MAX,
        max_size_updates: 8,
    }
}

fn repr() -> impl Strategy<Value = Repr> {
    prop::sample::select(vec![
        Repr::Indexed,
        Repr::IncrementalIndexing,
        Repr::WithoutIndexing,
        Repr::NeverIndexed,
    ])
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn policy_round_trip(cap in 0u32..5000, steps in prop::collection::vec(step(), 1..8)) {
        let mut enc = Encoder::with_table_size(cap);
        let mut dec = Decoder::with_limits(cap, roomy_limits());
        for (settings, fields) in steps {
            for s in settings {
                enc.set_max_table_size(s);
                dec.set_max_table_size(s);
            }
            let mut out = Vec::new();
            enc.encode(
                fields.iter().map(|(n, v, s)| Field { name: n, value: v, sensitive: *s }),
                &mut out,
            );
            let got = decode_ok(&mut dec, &out);
            prop_assert_eq!(got, fields);
            prop_assert_eq!(table_of_decoder(&dec), table_of_encoder(&enc));
            prop_assert_eq!(dec.table_size(), enc.table_size());
            prop_assert_eq!(dec.table_max_size(), enc.table_max_size());
        }
    }

    #[test]
    fn explicit_repr_round_trip(
        blocks in prop::collection::vec(
            prop::collection::vec((field(), repr(), any::<bool>()), 0..10), 1..6),
    ) {
        let mut enc = Encoder::with_table_size(512);
        let mut dec = Decoder::with_limits(512, roomy_limits());
        for block in blocks {
            let mut out = Vec::new();
            enc.begin_block(&mut out);
            for ((n, v, _), repr, huffman) in &block {
                enc.encode_field(Field::new(n, v), *repr, *huffman, &mut out);
            }
            let got = decode_ok(&mut dec, &out);
            let want: Vec<Owned> = block
                .iter()
                .map(|((n, v, _), r, _)| (n.clone(), v.clone(), *r == Repr::NeverIndexed))
                .collect();
            prop_assert_eq!(got, want);
            prop_assert_eq!(table_of_decoder(&dec), table_of_encoder(&enc));
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic(
        table in 0u32..5000,
        blocks in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..64), 1..6),
    ) {
        let mut dec = Decoder::new(table);
        for block in blocks {
            let _ = decode(&mut dec, &block);
        }
    }
}
