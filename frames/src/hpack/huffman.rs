//! HPACK Huffman coding of string literals (RFC 7541 §5.2, Appendix B).
//!
//! **Encoding** looks each byte's code up in `CODES` and shifts it into a
//! 64-bit accumulator, flushing 32 bits at a time; the last byte is padded
//! with one-bits (the most significant bits of EOS).
//!
//! **Decoding** is a table-driven state machine over *nibbles*. The states are
//! the 256 internal nodes of the code tree (257 leaves need exactly 256
//! internal nodes, so a state fits a `u8`). For every state and every 4-bit
//! input the table `DECODE` gives the next state and at most one emitted
//! symbol: the shortest code is 5 bits, so 4 bits can never finish two
//! symbols. Both tables are computed at compile time by `const fn`s from
//! `CODES`, so there is no generated file to keep in sync.
//!
//! The three ways a Huffman string can be invalid all become
//! [`Error::HpackInvalidHuffman`]:
//! - the EOS symbol inside the string: a transition that completes EOS is
//!   marked as failing;
//! - padding longer than 7 bits, or padding that is not all ones: the string
//!   must end in a state whose path from the root is at most 7 one-bits
//!   (`ACCEPT`); every other final state is a partial code or bad padding.

use bytes::BufMut;

use super::huffman_table::{CODES, EOS, SYMBOLS};
use crate::Error;

/// Marks a child slot in the code tree as a leaf; the low bits are the symbol.
const LEAF: u16 = 0x8000;

/// Number of internal nodes of a complete binary code over 257 symbols.
const NODES: usize = SYMBOLS - 1;

/// The code tree: `TREE[node][bit]` is an internal node id, or `LEAF | sym`.
/// Node 0 is the root; 0 never appears as a child, so it also means "empty"
/// while the tree is being built.
const TREE: [[u16; 2]; NODES] = build_tree();

/// Transition flag: this nibble completes a symbol (in bits 8..16).
const EMIT: u32 = 1 << 16;
/// Transition flag: this nibble completes EOS, which is invalid in a string.
const FAIL: u32 = 1 << 17;

/// `DECODE[state][nibble]`: next state in bits 0..8, symbol in bits 8..16,
/// plus [`EMIT`] / [`FAIL`].
static DECODE: [[u32; 16]; NODES] = build_decode_table();

/// States in which a string may end: the root, and the nodes reached from it
/// by one to seven one-bits (valid EOS-prefix padding).
static ACCEPT: [bool; NODES] = build_accept_table();

/// Builds [`TREE`] from [`CODES`]. A malformed code table fails compilation
/// (out-of-bounds index in const evaluation).
const fn build_tree() -> [[u16; 2]; NODES] {
    let mut tree = [[0u16; 2]; NODES];
    let mut next_free = 1usize;
    let mut sym = 0usize;
    while sym < SYMBOLS {
        let (code, len) = CODES[sym];
        let mut node = 0usize;
        let mut remaining = len as u32;
        while remaining > 0 {
            remaining -= 1;
            let bit = ((code >> remaining) & 1) as usize;
            if remaining == 0 {
                tree[node][bit] = LEAF | sym as u16;
            } else if tree[node][bit] == 0 {
                tree[node][bit] = next_free as u16;
                node = next_free;
                next_free += 1;
            } else {
                node = tree[node][bit] as usize;
            }
        }
        sym += 1;
    }
    tree
}

/// Builds [`DECODE`]: walks four bits from every internal node.
const fn build_decode_table() -> [[u32; 16]; NODES] {
    let mut table = [[0u32; 16]; NODES];
    let mut state = 0usize;
    while state < NODES {
        let mut nibble = 0usize;
        while nibble < 16 {
            let mut node = state;
            let mut out = 0u32;
            let mut bit = 4;
            while bit > 0 {
                bit -= 1;
                let child = TREE[node][(nibble >> bit) & 1];
                if child & LEAF == 0 {
                    node = child as usize;
                    continue;
                }
                let sym = (child & !LEAF) as usize;
                if sym == EOS {
                    out = FAIL;
                    node = 0;
                    break;
                }
                out = EMIT | ((sym as u32) << 8);
                node = 0;
            }
            table[state][nibble] = out | node as u32;
            nibble += 1;
        }
        state += 1;
    }
    table
}

/// Builds [`ACCEPT`]: the root plus up to seven steps down the one-branch.
const fn build_accept_table() -> [bool; NODES] {
    let mut accept = [false; NODES];
    let mut node = 0usize;
    let mut depth = 0;
    loop {
        accept[node] = true;
        if depth == 7 {
            break;
        }
        // The all-ones path is EOS (30 bits), so the first 7 steps are
        // internal nodes.
        node = TREE[node][1] as usize;
        depth += 1;
    }
    accept
}

/// Number of bytes `src` takes Huffman-encoded.
pub fn encoded_len(src: &[u8]) -> usize {
    let bits: usize = src
        .iter()
        .map(|&b| usize::from(CODES[usize::from(b)].1))
        .sum();
    bits.div_ceil(8)
}

/// Appends the Huffman encoding of `src` (exactly [`encoded_len`] bytes).
pub fn encode(src: &[u8], dst: &mut impl BufMut) {
    // At most 31 pending bits plus one 30-bit code: fits in 64.
    let mut acc: u64 = 0;
    let mut bits: u32 = 0;
    for &b in src {
        let (code, len) = CODES[usize::from(b)];
        acc = (acc << len) | u64::from(code);
        bits += u32::from(len);
        if bits >= 32 {
            bits -= 32;
            dst.put_u32((acc >> bits) as u32);
        }
    }
    while bits >= 8 {
        bits -= 8;
        dst.put_u8((acc >> bits) as u8);
    }
    if bits > 0 {
        // Pad with the high bits of EOS, i.e. ones.
        let pad = 8 - bits;
        dst.put_u8(((acc << pad) as u8) | ((1u8 << pad) - 1));
    }
}

/// Appends the decoding of the Huffman string `src` to `dst`.
///
/// Fails with [`Error::HpackInvalidHuffman`] on EOS inside the string, on
/// padding longer than 7 bits and on padding that is not all ones. On error
/// `dst` holds a partial result.
pub fn decode(src: &[u8], dst: &mut Vec<u8>) -> Result<(), Error> {
    // Each symbol takes at least 5 bits.
    dst.reserve(src.len() * 8 / 5);
    let mut state = 0u8;
    for &byte in src {
        state = step(state, byte >> 4, dst)?;
        state = step(state, byte & 0x0f, dst)?;
    }
    if ACCEPT[usize::from(state)] {
        Ok(())
    } else {
        Err(Error::HpackInvalidHuffman)
    }
}

/// One nibble of [`decode`]. The loop's speed is bound by the chain of
/// dependent table loads (one per nibble), not by the branches here: a
/// branch-free variant measured the same.
#[inline(always)]
fn step(state: u8, nibble: u8, dst: &mut Vec<u8>) -> Result<u8, Error> {
    let t = DECODE[usize::from(state)][usize::from(nibble & 0x0f)];
    if t & (EMIT | FAIL) != 0 {
        if t & FAIL != 0 {
            return Err(Error::HpackInvalidHuffman);
        }
        dst.push((t >> 8) as u8);
    }
    Ok(t as u8)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Decodes bit by bit by walking [`CODES`] directly, independent of the
    /// generated tables: the reference the table-driven decoder is compared
    /// against.
    fn naive_decode(src: &[u8]) -> Result<Vec<u8>, Error> {
        let mut out = Vec::new();
        let (mut code, mut len) = (0u32, 0u8);
        for i in 0..src.len() * 8 {
            let bit = (src[i / 8] >> (7 - i % 8)) & 1;
            code = (code << 1) | u32::from(bit);
            len += 1;
            if let Some(sym) = CODES.iter().position(|&c| c == (code, len)) {
                if sym == EOS {
                    return Err(Error::HpackInvalidHuffman);
                }
                out.push(sym as u8);
                (code, len) = (0, 0);
            }
        }
        let padding_ok = len <= 7 && code == (1u32 << len) - 1;
        if padding_ok {
            Ok(out)
        } else {
            Err(Error::HpackInvalidHuffman)
        }
    }

    #[test]
    fn code_table_is_complete_canonical_prefix_code() {
        // Every symbol has a code of 5..=30 bits that fits its length.
        for (sym, &(code, len)) in CODES.iter().enumerate() {
            assert!((5..=30).contains(&len), "symbol {sym} has length {len}");
            assert!(u64::from(code) < 1u64 << len, "symbol {sym} code too wide");
        }
        // Canonical: in (length, symbol) order each code is the previous
        // plus one, shifted by the length difference. Canonical codes are
        // prefix-free by construction.
        let mut order: Vec<usize> = (0..SYMBOLS).collect();
        order.sort_by_key(|&s| (CODES[s].1, s));
        let mut expect = 0u64;
        let mut prev_len = CODES[order[0]].1;
        for (i, &sym) in order.iter().enumerate() {
            let (code, len) = CODES[sym];
            if i > 0 {
                expect = (expect + 1) << (len - prev_len);
            }
            assert_eq!(u64::from(code), expect, "symbol {sym} is not canonical");
            prev_len = len;
        }
        // Complete (Kraft sum exactly 1): the last code is all ones, and it
        // is EOS, 30 bits.
        let kraft: u64 = CODES.iter().map(|&(_, len)| 1u64 << (30 - len)).sum();
        assert_eq!(kraft, 1 << 30);
        assert_eq!(CODES[EOS], (0x3fff_ffff, 30));
        // Spot checks against RFC 7541 Appendix B.
        assert_eq!(CODES[0], (0x1ff8, 13));
        assert_eq!(CODES[usize::from(b'a')], (0x3, 5));
        assert_eq!(CODES[usize::from(b' ')], (0x14, 6));
        assert_eq!(CODES[255], (0x3ff_ffee, 26));
    }

    #[test]
    fn accept_states_are_the_ones_prefixes() {
        assert_eq!(ACCEPT.iter().filter(|&&a| a).count(), 8);
        assert!(ACCEPT[0]);
    }

    #[test]
    fn rfc_examples() {
        let mut out = Vec::new();
        decode(
            &[
                0xf1, 0xe3, 0xc2, 0xe5, 0xf2, 0x3a, 0x6b, 0xa0, 0xab, 0x90, 0xf4, 0xff,
            ],
            &mut out,
        )
        .unwrap();
        assert_eq!(out, b"www.example.com");
        let mut enc = Vec::new();
        encode(b"no-cache", &mut enc);
        assert_eq!(enc, [0xa8, 0xeb, 0x10, 0x64, 0x9c, 0xbf]);
        assert_eq!(encoded_len(b"no-cache"), 6);
    }

    #[test]
    fn empty_string() {
        let mut out = Vec::new();
        decode(&[], &mut out).unwrap();
        assert!(out.is_empty());
        let mut enc = Vec::new();
        encode(b"", &mut enc);
        assert!(enc.is_empty());
    }

    #[test]
    fn rejects_eos_inside_string() {
        // 32 one-bits: EOS (30) is complete before the end.
        let mut out = Vec::new();
        assert_eq!(
            decode(&[0xff; 4], &mut out),
            Err(Error::HpackInvalidHuffman)
        );
        // 'a' (00011) then EOS then padding.
        let mut bits: u64 = 0b00011;
        bits = (bits << 30) | 0x3fff_ffff;
        bits = (bits << 5) | 0b11111; // pad to 40 bits
        let bytes = bits.to_be_bytes();
        assert_eq!(
            decode(&bytes[3..], &mut out),
            Err(Error::HpackInvalidHuffman)
        );
    }

    #[test]
    fn rejects_long_or_bad_padding() {
        let mut out = Vec::new();
        // 'a' = 00011 + 111 is fine.
        decode(&[0x1f], &mut out).unwrap();
        assert_eq!(out, b"a");
        // 'a' + 11 one-bits of padding: too long.
        assert_eq!(
            decode(&[0x1f, 0xff], &mut out),
            Err(Error::HpackInvalidHuffman)
        );
        // A whole byte of padding alone.
        assert_eq!(decode(&[0xff], &mut out), Err(Error::HpackInvalidHuffman));
        // 'a' + padding 000: not the EOS prefix.
        assert_eq!(decode(&[0x18], &mut out), Err(Error::HpackInvalidHuffman));
        // 'a' + padding 101.
        assert_eq!(decode(&[0x1d], &mut out), Err(Error::HpackInvalidHuffman));
    }

    #[test]
    fn every_symbol_round_trips() {
        let all: Vec<u8> = (0..=255).collect();
        let mut enc = Vec::new();
        encode(&all, &mut enc);
        assert_eq!(enc.len(), encoded_len(&all));
        let mut dec = Vec::new();
        decode(&enc, &mut dec).unwrap();
        assert_eq!(dec, all);
    }

    proptest! {
        #[test]
        fn round_trip(data in proptest::collection::vec(any::<u8>(), 0..300)) {
            let mut enc = Vec::new();
            encode(&data, &mut enc);
            prop_assert_eq!(enc.len(), encoded_len(&data));
            let mut dec = Vec::new();
            decode(&enc, &mut dec).unwrap();
            prop_assert_eq!(dec, data);
        }

        #[test]
        fn table_decoder_matches_naive(data in proptest::collection::vec(any::<u8>(), 0..40)) {
            let mut out = Vec::new();
            let got = decode(&data, &mut out).map(|()| out);
            prop_assert_eq!(got, naive_decode(&data));
        }
    }
}
