//! Protobuf wire-format primitives for the `Packet` codec: varints, field
//! keys, skipping unknown fields, and the matching encoders.
//!
//! Decoding works on a [`Cursor`] over the *whole* received message, so every
//! position it reports is an absolute offset into the caller's buffer. That is
//! what lets the packet decoder hand out `Bytes::slice`s of the input instead
//! of copies.
//!
//! Acceptance follows prost 0.14 exactly (the tests check it against prost on
//! random input): a varint has at most 10 bytes and its 10th byte is 0 or 1; a
//! key must fit in 32 bits, have a wire type of 0–5 and a field number ≥ 1;
//! groups must close with the field number they opened with; and nesting is
//! bounded by a recursion budget of [`RECURSION_LIMIT`] shared with embedded
//! messages, spent the way prost spends it.

use crate::Error;

/// Wire type 0: varint.
pub(super) const VARINT: u8 = 0;
/// Wire type 1: 8-byte little-endian value.
pub(super) const FIXED64: u8 = 1;
/// Wire type 2: length-delimited (strings, bytes, embedded messages).
pub(super) const LEN: u8 = 2;
/// Wire type 3: start of a (deprecated) group.
pub(super) const START_GROUP: u8 = 3;
/// Wire type 4: end of a group.
pub(super) const END_GROUP: u8 = 4;
/// Wire type 5: 4-byte little-endian value.
pub(super) const FIXED32: u8 = 5;

/// Recursion budget of a top-level message, as in prost: entering an
/// embedded message or a group costs one level, and skipping any field needs
/// at least one level left. Go's limit is far higher (10 000); no conforming
/// sender nests unknown groups anywhere near 100 deep.
pub(super) const RECURSION_LIMIT: u32 = 100;

/// Longest varint encoding of a `u64`.
pub(super) const MAX_VARINT_LEN: usize = 10;

/// A read position in a protobuf message.
///
/// `buf` ends where the message being parsed ends (for an embedded message,
/// where its length says), while positions stay absolute in the outermost
/// buffer.
pub(super) struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    /// A cursor over all of `buf`.
    pub(super) fn new(buf: &'a [u8]) -> Self {
        Self { buf, pos: 0 }
    }

    /// A cursor over `span` of the same buffer (an embedded message).
    pub(super) fn sub(&self, span: Span) -> Self {
        // `span` came from `read_len`, so it lies inside `buf`; the fallback
        // keeps this panic-free regardless.
        let buf = self.buf.get(..span.end).unwrap_or(self.buf);
        Self {
            buf,
            pos: span.start,
        }
    }

    /// Whether the message has been fully read.
    pub(super) fn is_empty(&self) -> bool {
        self.pos >= self.buf.len()
    }

    /// The bytes from the current position to the end of the message.
    fn rest(&self) -> &'a [u8] {
        self.buf.get(self.pos..).unwrap_or_default()
    }

    /// The bytes of `span` (from `read_len`, so in range; empty otherwise).
    pub(super) fn slice(&self, span: Span) -> &'a [u8] {
        self.buf.get(span.start..span.end).unwrap_or_default()
    }

    /// Reads a varint (up to 10 bytes; the 10th may only carry bit 63).
    pub(super) fn read_varint(&mut self) -> Result<u64, Error> {
        let rest = self.rest();
        // Keys, lengths below 128 and small ids take one byte, most other
        // lengths two: read those without the general loop.
        match *rest {
            [b0, ..] if b0 < 0x80 => {
                self.pos += 1;
                return Ok(u64::from(b0));
            }
            [b0, b1, ..] if b1 < 0x80 => {
                self.pos += 2;
                return Ok(u64::from(b0 & 0x7f) | u64::from(b1) << 7);
            }
            _ => {}
        }
        let mut value = 0u64;
        for (i, &byte) in rest.iter().take(MAX_VARINT_LEN).enumerate() {
            value |= u64::from(byte & 0x7f) << (7 * i);
            if byte < 0x80 {
                // The 10th byte holds bit 63 only; anything more overflows
                // 64 bits (prost and protobuf-go both reject it).
                if i == MAX_VARINT_LEN - 1 && byte > 1 {
                    return Err(Error::ProtoVarintOverflow);
                }
                self.pos += i + 1;
                return Ok(value);
            }
        }
        if rest.len() >= MAX_VARINT_LEN {
            Err(Error::ProtoVarintOverflow)
        } else {
            Err(Error::ProtoTruncated)
        }
    }

    /// Reads a field key and returns `(field number, wire type)`.
    pub(super) fn read_key(&mut self) -> Result<(u32, u8), Error> {
        let key = self.read_varint()?;
        let invalid = Error::ProtoInvalidTag { tag: key };
        let key = u32::try_from(key).map_err(|_| invalid)?;
        let wire_type = (key & 7) as u8;
        let field = key >> 3;
        if field == 0 || wire_type > FIXED32 {
            return Err(invalid);
        }
        Ok((field, wire_type))
    }

    /// Reads the length prefix of a length-delimited field and steps over
    /// its contents, returning where they are.
    pub(super) fn read_len(&mut self) -> Result<Span, Error> {
        let len = self.read_varint()?;
        let start = self.pos;
        self.advance(len)?;
        Ok(Span {
            start,
            end: self.pos,
        })
    }

    /// Steps over `len` bytes, which must all be present.
    fn advance(&mut self, len: u64) -> Result<(), Error> {
        let remaining = self.buf.len().saturating_sub(self.pos);
        match usize::try_from(len) {
            Ok(len) if len <= remaining => {
                self.pos += len;
                Ok(())
            }
            _ => Err(Error::ProtoTruncated),
        }
    }

    /// Skips the value of an unknown field whose key was just read.
    ///
    /// `budget` is the recursion budget left at this level (see
    /// [`RECURSION_LIMIT`]); it bounds group nesting so hostile input cannot
    /// recurse without limit.
    pub(super) fn skip_field(
        &mut self,
        field: u32,
        wire_type: u8,
        budget: u32,
    ) -> Result<(), Error> {
        if budget == 0 {
            return Err(Error::ProtoBadGroup);
        }
        match wire_type {
            VARINT => self.read_varint().map(drop),
            FIXED64 => self.advance(8),
            LEN => self.read_len().map(drop),
            START_GROUP => loop {
                let (inner, inner_type) = self.read_key()?;
                if inner_type == END_GROUP {
                    // A group closes with the field number it opened with.
                    return if inner == field {
                        Ok(())
                    } else {
                        Err(Error::ProtoBadGroup)
                    };
                }
                self.skip_field(inner, inner_type, budget - 1)?;
            },
            FIXED32 => self.advance(4),
            // END_GROUP without a matching START_GROUP (`read_key` has
            // already rejected wire types 6 and 7).
            _ => Err(Error::ProtoBadGroup),
        }
    }
}

/// A byte range of the outermost message: where a string or bytes field's
/// contents are.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Span {
    /// First byte.
    pub(super) start: usize,
    /// One past the last byte.
    pub(super) end: usize,
}

/// Length of the varint encoding of `v` (1–10).
pub(super) const fn varint_len(v: u64) -> usize {
    // Bits needed (at least 1), 7 per byte, rounded up.
    let bits = 64 - (v | 1).leading_zeros() as usize;
    bits.div_ceil(7)
}

/// Length of a non-default `int64` field (1-byte key + varint), or 0 for 0,
/// which proto3 leaves out.
pub(super) const fn int64_field_len(v: i64) -> usize {
    if v == 0 { 0 } else { 1 + varint_len(v as u64) }
}

/// Length of a non-empty `string`/`bytes` field (1-byte key + length +
/// contents), or 0 when empty, which proto3 leaves out.
pub(super) const fn bytes_field_len(len: usize) -> usize {
    if len == 0 {
        0
    } else {
        1 + varint_len(len as u64) + len
    }
}

/// Length of embedded-message field `field` with a body of `len` bytes: it
/// is always emitted, even empty, because it is a oneof member. The key is
/// one byte for fields 1–15 and two for konn's extension members (100, 101).
pub(super) const fn message_field_len(field: u32, len: usize) -> usize {
    varint_len(((field as u64) << 3) | LEN as u64) + varint_len(len as u64) + len
}

/// The 1-byte key of field `field` (1–15) with wire type `wire_type`.
pub(super) const fn key(field: u8, wire_type: u8) -> u8 {
    (field << 3) | wire_type
}

/// A small stack buffer for assembling keys, varints and prefixes, so they
/// reach the destination `BufMut` in one `put_slice` instead of one call per
/// byte.
pub(super) struct Scratch {
    buf: [u8; Self::CAPACITY],
    len: usize,
}

impl Scratch {
    /// Room for the largest header this module writes: the gRPC prefix plus
    /// a DATA packet's type, payload key and length, connect id and data
    /// key and length (5 + 2 + 11 + 11 + 11 = 40 bytes).
    const CAPACITY: usize = 48;

    /// An empty scratch buffer.
    pub(super) const fn new() -> Self {
        Self {
            buf: [0; Self::CAPACITY],
            len: 0,
        }
    }

    /// Appends one byte.
    pub(super) fn byte(&mut self, b: u8) {
        // Every caller writes a bounded header well below CAPACITY, so the
        // `None` arm cannot happen; it only keeps this panic-free.
        debug_assert!(self.len < Self::CAPACITY, "Scratch overflow");
        if let Some(slot) = self.buf.get_mut(self.len) {
            *slot = b;
            self.len += 1;
        }
    }

    /// Appends several bytes.
    pub(super) fn bytes(&mut self, bs: &[u8]) {
        for &b in bs {
            self.byte(b);
        }
    }

    /// Appends `v` as a varint.
    pub(super) fn varint(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.byte((v as u8) | 0x80);
            v >>= 7;
        }
        self.byte(v as u8);
    }

    /// Appends an `int64` field unless it is 0.
    pub(super) fn int64_field(&mut self, field: u8, v: i64) {
        if v != 0 {
            self.byte(key(field, VARINT));
            // Negative values are sign-extended to 64 bits: always 10 bytes.
            self.varint(v as u64);
        }
    }

    /// Appends the key and length of length-delimited field `field` (any
    /// number; the caller writes the contents).
    pub(super) fn len_prefix(&mut self, field: u32, len: usize) {
        self.varint((u64::from(field) << 3) | u64::from(LEN));
        self.varint(len as u64);
    }

    /// The bytes written so far.
    pub(super) fn as_slice(&self) -> &[u8] {
        self.buf.get(..self.len).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn varint(bytes: &[u8]) -> Result<(u64, usize), Error> {
        let mut c = Cursor::new(bytes);
        c.read_varint().map(|v| (v, c.pos))
    }

    #[test]
    fn varints_decode() {
        assert_eq!(varint(&[0]), Ok((0, 1)));
        assert_eq!(varint(&[0x7f, 0xff]), Ok((127, 1)));
        assert_eq!(varint(&[0xac, 0x02]), Ok((300, 2)));
        // Non-minimal encodings are fine.
        assert_eq!(varint(&[0x80, 0x00]), Ok((0, 2)));
        assert_eq!(
            varint(&[0x81, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x00]),
            Ok((1, 10))
        );
        // u64::MAX: nine 0xff and a final 0x01.
        let mut max = [0xff; 10];
        max[9] = 0x01;
        assert_eq!(varint(&max), Ok((u64::MAX, 10)));
    }

    #[test]
    fn malformed_varints() {
        assert_eq!(varint(&[]), Err(Error::ProtoTruncated));
        assert_eq!(varint(&[0x80]), Err(Error::ProtoTruncated));
        assert_eq!(varint(&[0xff; 9]), Err(Error::ProtoTruncated));
        assert_eq!(varint(&[0xff; 10]), Err(Error::ProtoVarintOverflow));
        assert_eq!(varint(&[0xff; 11]), Err(Error::ProtoVarintOverflow));
        // A 10th byte of 2 would set bit 64.
        let mut over = [0xff; 10];
        over[9] = 0x02;
        assert_eq!(varint(&over), Err(Error::ProtoVarintOverflow));
    }

    #[test]
    fn varint_lengths_match_encoding() {
        for v in [
            0,
            1,
            127,
            128,
            16_383,
            16_384,
            u64::from(u32::MAX),
            u64::MAX >> 1,
            u64::MAX,
        ] {
            let mut s = Scratch::new();
            s.varint(v);
            assert_eq!(s.as_slice().len(), varint_len(v), "{v}");
            assert_eq!(varint(s.as_slice()), Ok((v, varint_len(v))));
        }
        assert_eq!(varint_len(0), 1);
        assert_eq!(varint_len(u64::MAX), 10);
    }

    #[test]
    fn keys() {
        let key_of = |bytes: &[u8]| Cursor::new(bytes).read_key();
        assert_eq!(key_of(&[0x08]), Ok((1, VARINT)));
        assert_eq!(key_of(&[0x22]), Ok((4, LEN)));
        // Largest field number, 2^29 - 1, with wire type 5: key u32::MAX - 2.
        assert_eq!(
            key_of(&[0xfd, 0xff, 0xff, 0xff, 0x0f]),
            Ok(((1 << 29) - 1, FIXED32))
        );
        assert_eq!(key_of(&[0x02]), Err(Error::ProtoInvalidTag { tag: 2 }));
        assert_eq!(key_of(&[0x0e]), Err(Error::ProtoInvalidTag { tag: 0x0e }));
        assert_eq!(key_of(&[0x0f]), Err(Error::ProtoInvalidTag { tag: 0x0f }));
        assert_eq!(
            key_of(&[0x80, 0x80, 0x80, 0x80, 0x10]),
            Err(Error::ProtoInvalidTag { tag: 1 << 32 })
        );
        assert_eq!(key_of(&[0x88]), Err(Error::ProtoTruncated));
    }

    fn skip(bytes: &[u8], budget: u32) -> Result<usize, Error> {
        let mut c = Cursor::new(bytes);
        let (field, wire_type) = c.read_key()?;
        c.skip_field(field, wire_type, budget).map(|()| c.pos)
    }

    #[test]
    fn skips_every_wire_type() {
        assert_eq!(skip(&[0x48, 0x96, 0x01, 0xaa], 1), Ok(3));
        assert_eq!(skip(&[0x49, 1, 2, 3, 4, 5, 6, 7, 8, 0xaa], 1), Ok(9));
        assert_eq!(skip(&[0x4a, 2, 0xff, 0xfe, 0xaa], 1), Ok(4));
        assert_eq!(skip(&[0x4d, 1, 2, 3, 4, 0xaa], 1), Ok(5));
        // Group 9 containing a varint and a nested group 10.
        assert_eq!(skip(&[0x4b, 0x08, 0x01, 0x53, 0x54, 0x4c, 0xaa], 3), Ok(6));
    }

    #[test]
    fn skipping_malformed_fields() {
        assert_eq!(
            skip(&[0x49, 1, 2, 3, 4, 5, 6, 7], 1),
            Err(Error::ProtoTruncated)
        );
        assert_eq!(skip(&[0x4d, 1, 2, 3], 1), Err(Error::ProtoTruncated));
        assert_eq!(skip(&[0x4a, 3, 0, 0], 1), Err(Error::ProtoTruncated));
        assert_eq!(skip(&[0x48], 1), Err(Error::ProtoTruncated));
        // A length that does not fit in usize, or is absurd.
        assert_eq!(
            skip(
                &[
                    0x4a, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01
                ],
                1
            ),
            Err(Error::ProtoTruncated)
        );
        // End group with no start; group closed by another field number;
        // group never closed.
        assert_eq!(skip(&[0x4c], 1), Err(Error::ProtoBadGroup));
        assert_eq!(skip(&[0x4b, 0x54], 1), Err(Error::ProtoBadGroup));
        assert_eq!(skip(&[0x4b, 0x08, 0x01], 2), Err(Error::ProtoTruncated));
        // Out of budget: a group at budget 1 may not contain fields...
        assert_eq!(
            skip(&[0x4b, 0x08, 0x01, 0x4c], 1),
            Err(Error::ProtoBadGroup)
        );
        // ...but may be empty.
        assert_eq!(skip(&[0x4b, 0x4c], 1), Ok(2));
        assert_eq!(skip(&[0x48, 0x00], 0), Err(Error::ProtoBadGroup));
    }

    #[test]
    fn field_lengths() {
        assert_eq!(int64_field_len(0), 0);
        assert_eq!(int64_field_len(1), 2);
        assert_eq!(int64_field_len(-1), 11);
        assert_eq!(int64_field_len(i64::MAX), 10);
        assert_eq!(bytes_field_len(0), 0);
        assert_eq!(bytes_field_len(3), 5);
        assert_eq!(bytes_field_len(128), 131);
        assert_eq!(message_field_len(4, 0), 2);
        assert_eq!(message_field_len(15, 200), 203);
        // konn's extension members have two-byte keys.
        assert_eq!(message_field_len(100, 2), 5);
        assert_eq!(message_field_len(101, 0), 3);
    }
}
