//! HPACK prefixed integers (RFC 7541 §5.1).
//!
//! A value below `2^N - 1` fits in the N-bit prefix of the first byte;
//! otherwise the prefix is all ones and the rest follows in 7-bit groups,
//! least significant first, with the high bit marking continuation.
//!
//! The decoder accepts values up to `u32::MAX` and at most five
//! continuation bytes (enough for any `u32` with a prefix); anything longer,
//! including an endless run of zero-valued continuation bytes, is
//! [`Error::HpackIntegerOverflow`]. Every integer HPACK carries (indices,
//! lengths, table sizes) is bounded far below that by other limits.

use bytes::BufMut;

use crate::Error;

/// Most continuation bytes accepted after an all-ones prefix.
const MAX_CONTINUATION: usize = 5;

/// Decodes an integer with a `prefix_bits`-bit prefix from `buf` at `*pos`
/// (the first byte's high bits are the representation's flags and are
/// ignored), advancing `*pos` past it.
pub(super) fn decode(buf: &[u8], pos: &mut usize, prefix_bits: u32) -> Result<u32, Error> {
    let max_prefix = (1u32 << prefix_bits) - 1;
    let first = *buf.get(*pos).ok_or(Error::HpackTruncated)?;
    *pos += 1;
    let prefix = u32::from(first) & max_prefix;
    if prefix < max_prefix {
        return Ok(prefix);
    }
    let mut value = u64::from(max_prefix);
    for i in 0..MAX_CONTINUATION {
        let byte = *buf.get(*pos).ok_or(Error::HpackTruncated)?;
        *pos += 1;
        value += u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            return u32::try_from(value).map_err(|_| Error::HpackIntegerOverflow);
        }
    }
    Err(Error::HpackIntegerOverflow)
}

/// Encodes `value` with a `prefix_bits`-bit prefix; `flags` supplies the
/// first byte's bits above the prefix.
pub(super) fn encode(value: u64, prefix_bits: u32, flags: u8, dst: &mut impl BufMut) {
    let max_prefix = (1u64 << prefix_bits) - 1;
    if value < max_prefix {
        dst.put_u8(flags | value as u8);
        return;
    }
    dst.put_u8(flags | max_prefix as u8);
    let mut rest = value - max_prefix;
    while rest >= 0x80 {
        dst.put_u8(0x80 | (rest & 0x7f) as u8);
        rest >>= 7;
    }
    dst.put_u8(rest as u8);
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn enc(value: u64, prefix: u32, flags: u8) -> Vec<u8> {
        let mut out = Vec::new();
        encode(value, prefix, flags, &mut out);
        out
    }

    fn dec(buf: &[u8], prefix: u32) -> Result<(u32, usize), Error> {
        let mut pos = 0;
        decode(buf, &mut pos, prefix).map(|v| (v, pos))
    }

    #[test]
    fn rfc_c1_examples() {
        // C.1.1: 10 with a 5-bit prefix.
        assert_eq!(enc(10, 5, 0), [0x0a]);
        assert_eq!(dec(&[0xea], 5), Ok((10, 1))); // flag bits ignored
        // C.1.2: 1337 with a 5-bit prefix.
        assert_eq!(enc(1337, 5, 0), [0x1f, 0x9a, 0x0a]);
        assert_eq!(dec(&[0x1f, 0x9a, 0x0a], 5), Ok((1337, 3)));
        // C.1.3: 42 at an octet boundary (8-bit prefix).
        assert_eq!(enc(42, 8, 0), [0x2a]);
        assert_eq!(dec(&[0x2a], 8), Ok((42, 1)));
    }

    #[test]
    fn boundaries() {
        assert_eq!(enc(30, 5, 0xe0), [0xfe]);
        assert_eq!(enc(31, 5, 0), [0x1f, 0x00]);
        assert_eq!(dec(&[0x1f, 0x00], 5), Ok((31, 2)));
        assert_eq!(enc(u64::from(u32::MAX), 1, 0).len(), 6);
        assert_eq!(dec(&enc(u64::from(u32::MAX), 1, 0), 1), Ok((u32::MAX, 6)));
    }

    #[test]
    fn truncated() {
        assert_eq!(dec(&[], 5), Err(Error::HpackTruncated));
        assert_eq!(dec(&[0x1f], 5), Err(Error::HpackTruncated));
        assert_eq!(dec(&[0x1f, 0x80, 0x80], 5), Err(Error::HpackTruncated));
    }

    #[test]
    fn overflow() {
        // u32::MAX + 1.
        assert_eq!(
            dec(&enc(1 << 32, 5, 0), 5),
            Err(Error::HpackIntegerOverflow)
        );
        // Six continuation bytes, even if they are zero.
        assert_eq!(
            dec(&[0x1f, 0x80, 0x80, 0x80, 0x80, 0x80, 0x00], 5),
            Err(Error::HpackIntegerOverflow)
        );
        assert_eq!(
            dec(&[0x7f, 0xff, 0xff, 0xff, 0xff, 0x7f], 7),
            Err(Error::HpackIntegerOverflow)
        );
    }

    proptest! {
        #[test]
        fn round_trip(value in any::<u32>(), prefix in 1u32..=8, flags in any::<u8>()) {
            let flags = flags & !(((1u16 << prefix) - 1) as u8);
            let bytes = enc(u64::from(value), prefix, flags);
            prop_assert_eq!(bytes[0] & flags, flags);
            prop_assert_eq!(dec(&bytes, prefix), Ok((value, bytes.len())));
        }
    }
}
