//! Custom metadata: key and value rules, and base64 for binary (`-bin`)
//! values.
//!
//! ## Keys
//! The spec's Header-Name is `1*( 0-9 / a-z / "_" / "-" / "." )`; upper case
//! is rejected (HTTP/2 requires lower-case field names anyway).
//! [`validate_key`] checks only that syntax and is what to apply to headers
//! received from a peer, because gRPC's own headers (`grpc-status`,
//! `grpc-timeout`, …) share it. The spec reserves names starting with
//! `grpc-` for gRPC itself: "should not be used by applications as
//! Custom-Metadata". That is a rule for what an application *sends*, so
//! only [`validate_custom_key`] enforces it; a received unknown `grpc-*`
//! header is not an error (grpc-go passes it through to the application).
//!
//! ## Values
//! ASCII values are printable ASCII, `0x20..=0x7E` ([`validate_ascii_value`]).
//! The spec writes `1*(…)`, but an empty value is a valid HTTP field value
//! and grpc-go sends and accepts it, so empty is allowed. The spec also says
//! a receiver "must not error" on a value that HTTP allows but this rule
//! does not: use this check for values we send or echo, not to fail calls.
//!
//! Binary values (keys ending in `-bin`, see [`is_binary_key`]) are base64
//! (RFC 4648 §4, standard alphabet). We emit it unpadded, as grpc-go does,
//! and accept it padded or unpadded, as the spec requires. Like Go's
//! non-strict decoder we ignore non-zero bits in the last character (e.g.
//! `QR` decodes like `QQ`). Several values joined with `,` under one key
//! are split with [`split_binary_values`] before decoding.

use bytes::BufMut;

use crate::Error;

/// Suffix that marks a binary metadata key.
const BIN_SUFFIX: &[u8] = b"-bin";

/// Prefix reserved for gRPC's own headers.
const RESERVED_PREFIX: &[u8] = b"grpc-";

/// The base64 alphabet (RFC 4648 §4).
const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Checks the syntax of a metadata key: non-empty, only `0-9 a-z _ - .`.
///
/// # Errors
/// [`InvalidMetadataKey`](Error::InvalidMetadataKey).
pub fn validate_key(key: &[u8]) -> Result<(), Error> {
    let valid = |c: &u8| matches!(c, b'0'..=b'9' | b'a'..=b'z' | b'_' | b'-' | b'.');
    if key.is_empty() || !key.iter().all(valid) {
        return Err(Error::InvalidMetadataKey);
    }
    Ok(())
}

/// Checks a key an application wants to send as custom metadata: the
/// syntax of [`validate_key`], and not in the `grpc-` namespace the spec
/// reserves.
///
/// # Errors
/// [`InvalidMetadataKey`](Error::InvalidMetadataKey).
pub fn validate_custom_key(key: &[u8]) -> Result<(), Error> {
    validate_key(key)?;
    if key.starts_with(RESERVED_PREFIX) {
        return Err(Error::InvalidMetadataKey);
    }
    Ok(())
}

/// Whether `key` names a binary (base64-encoded) value: it ends in `-bin`.
pub fn is_binary_key(key: &[u8]) -> bool {
    key.ends_with(BIN_SUFFIX)
}

/// Checks an ASCII (non-`-bin`) metadata value: every byte in `0x20..=0x7E`.
///
/// # Errors
/// [`InvalidMetadataValue`](Error::InvalidMetadataValue).
pub fn validate_ascii_value(value: &[u8]) -> Result<(), Error> {
    if value.iter().all(|b| (0x20..=0x7e).contains(b)) {
        Ok(())
    } else {
        Err(Error::InvalidMetadataValue)
    }
}

/// Splits a binary metadata value carrying several values joined with `,`
/// (the spec allows a proxy to join duplicate headers), trimming spaces and
/// tabs around each part. A value without commas yields itself.
pub fn split_binary_values(value: &[u8]) -> impl Iterator<Item = &[u8]> {
    value.split(|&b| b == b',').map(|part| part.trim_ascii())
}

/// Length of the unpadded base64 encoding of `n` bytes.
pub fn base64_encoded_len(n: usize) -> usize {
    let tail = match n % 3 {
        0 => 0,
        1 => 2,
        _ => 3,
    };
    (n / 3).saturating_mul(4).saturating_add(tail)
}

/// Writes `src` base64-encoded, standard alphabet, without padding (what
/// grpc-go sends for `-bin` metadata).
pub fn encode_base64(src: &[u8], dst: &mut impl BufMut) {
    let sextet = |acc: u32, shift: u32| ALPHABET[((acc >> shift) & 0x3f) as usize];
    let mut groups = src.chunks_exact(3);
    for g in &mut groups {
        let acc = u32::from_be_bytes([0, g[0], g[1], g[2]]);
        dst.put_slice(&[
            sextet(acc, 18),
            sextet(acc, 12),
            sextet(acc, 6),
            sextet(acc, 0),
        ]);
    }
    match *groups.remainder() {
        [a] => {
            let acc = u32::from(a) << 16;
            dst.put_slice(&[sextet(acc, 18), sextet(acc, 12)]);
        }
        [a, b] => {
            let acc = u32::from(a) << 16 | u32::from(b) << 8;
            dst.put_slice(&[sextet(acc, 18), sextet(acc, 12), sextet(acc, 6)]);
        }
        _ => {}
    }
}

/// Decodes a base64 `-bin` value, padded or unpadded, into `dst`.
///
/// The input is validated completely before anything is written, so `dst`
/// is untouched on error.
///
/// # Errors
/// [`InvalidBase64`](Error::InvalidBase64): a character outside the
/// standard alphabet, `=` anywhere but as the padding of a value whose
/// length is a multiple of 4, or a length that no encoding produces
/// (4k + 1 characters of data).
pub fn decode_base64(src: &[u8], dst: &mut impl BufMut) -> Result<(), Error> {
    let data = strip_padding(src);
    if data.len() % 4 == 1 || !data.iter().all(|&c| sextet_value(c).is_some()) {
        return Err(Error::InvalidBase64);
    }
    for group in data.chunks(4) {
        // Pack the group's sextets into the top of a 24-bit number, then
        // emit one byte fewer than there are characters.
        let mut acc: u32 = 0;
        for &c in group {
            acc = acc << 6 | u32::from(sextet_value(c).unwrap_or(0));
        }
        // `group.len()` is 2, 3 or 4 here (never 1, checked above).
        let missing = 4 - group.len() as u32;
        acc <<= 6 * missing;
        let bytes = acc.to_be_bytes();
        dst.put_slice(bytes.get(1..4 - missing as usize).unwrap_or_default());
    }
    Ok(())
}

/// Removes the `=` padding of a padded value (whose length is a multiple
/// of 4). Unpadded values, and `=` anywhere else, are left for the
/// alphabet check to reject.
fn strip_padding(src: &[u8]) -> &[u8] {
    if !src.len().is_multiple_of(4) {
        return src;
    }
    let src = src.strip_suffix(b"=").unwrap_or(src);
    src.strip_suffix(b"=").unwrap_or(src)
}

/// Value of one base64 character, `None` outside the alphabet.
fn sextet_value(c: u8) -> Option<u8> {
    match c {
        b'A'..=b'Z' => Some(c - b'A'),
        b'a'..=b'z' => Some(c - b'a' + 26),
        b'0'..=b'9' => Some(c - b'0' + 52),
        b'+' => Some(62),
        b'/' => Some(63),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn enc(src: &[u8]) -> Vec<u8> {
        let mut v = Vec::new();
        encode_base64(src, &mut v);
        v
    }

    fn dec(src: &[u8]) -> Result<Vec<u8>, Error> {
        let mut v = Vec::new();
        decode_base64(src, &mut v).map(|()| v)
    }

    #[test]
    fn keys() {
        for good in [
            &b"a"[..],
            b"agentid",
            b"x-request-id",
            b"my_key.v2",
            b"0",
            b"trace-bin",
        ] {
            assert_eq!(validate_key(good), Ok(()), "{good:?}");
            assert_eq!(validate_custom_key(good), Ok(()), "{good:?}");
        }
        for bad in [
            &b""[..],
            b"Agentid",
            b"a b",
            b":path",
            b"k\0",
            b"caf\xc3\xa9",
            b"a/b",
        ] {
            assert_eq!(validate_key(bad), Err(Error::InvalidMetadataKey), "{bad:?}");
            assert_eq!(validate_custom_key(bad), Err(Error::InvalidMetadataKey));
        }
        // gRPC's own headers are well-formed keys but not custom metadata.
        for reserved in [&b"grpc-status"[..], b"grpc-foo", b"grpc-x-bin"] {
            assert_eq!(validate_key(reserved), Ok(()));
            assert_eq!(
                validate_custom_key(reserved),
                Err(Error::InvalidMetadataKey)
            );
        }
        assert_eq!(validate_custom_key(b"grpcfoo"), Ok(()));
        assert_eq!(validate_custom_key(b"my-grpc-key"), Ok(()));
    }

    #[test]
    fn binary_keys() {
        assert!(is_binary_key(b"trace-proto-bin"));
        assert!(!is_binary_key(b"trace-proto"));
        assert!(!is_binary_key(b"bin"));
        assert!(!is_binary_key(b"x-binary"));
    }

    #[test]
    fn ascii_values() {
        assert_eq!(validate_ascii_value(b""), Ok(()));
        assert_eq!(validate_ascii_value(b" Bearer abc~ "), Ok(()));
        for bad in [&b"a\tb"[..], b"a\r\n", b"\x7f", b"caf\xc3\xa9", b"\0"] {
            assert_eq!(
                validate_ascii_value(bad),
                Err(Error::InvalidMetadataValue),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn rfc4648_vectors_unpadded() {
        let vectors: [(&[u8], &[u8]); 7] = [
            (b"", b""),
            (b"f", b"Zg"),
            (b"fo", b"Zm8"),
            (b"foo", b"Zm9v"),
            (b"foob", b"Zm9vYg"),
            (b"fooba", b"Zm9vYmE"),
            (b"foobar", b"Zm9vYmFy"),
        ];
        for (plain, coded) in vectors {
            assert_eq!(enc(plain), coded);
            assert_eq!(base64_encoded_len(plain.len()), coded.len());
            assert_eq!(dec(coded).unwrap(), plain);
        }
        assert_eq!(enc(&[0xfb, 0xff, 0xfe]), b"+//+");
    }

    #[test]
    fn padded_input_is_accepted() {
        assert_eq!(dec(b"Zg==").unwrap(), b"f");
        assert_eq!(dec(b"Zm8=").unwrap(), b"fo");
        assert_eq!(dec(b"Zm9vYg==").unwrap(), b"foob");
    }

    #[test]
    fn invalid_base64_is_rejected_and_writes_nothing() {
        let bad: [&[u8]; 14] = [
            b"Z",
            b"Zm9vY",
            b"Zg=",
            b"Zg===",
            b"Z===",
            b"====",
            b"=",
            b"Zg==Zg==",
            b"Z=g=",
            b"Zm9v\n",
            b"Zm 9v",
            b"Zm9-",
            b"Zm9_",
            b"Zm\xc3\xa9",
        ];
        for b in bad {
            let mut v = b"keep".to_vec();
            assert_eq!(decode_base64(b, &mut v), Err(Error::InvalidBase64), "{b:?}");
            assert_eq!(v, b"keep");
        }
    }

    #[test]
    fn trailing_bits_are_ignored_like_go() {
        assert_eq!(dec(b"Zh").unwrap(), b"f");
        assert_eq!(dec(b"Zh==").unwrap(), b"f");
    }

    #[test]
    fn joined_binary_values() {
        let parts: Vec<&[u8]> = split_binary_values(b"Zg, Zm8=,Zm9v").collect();
        assert_eq!(parts, [&b"Zg"[..], b"Zm8=", b"Zm9v"]);
        let decoded: Vec<Vec<u8>> = parts.into_iter().map(|p| dec(p).unwrap()).collect();
        assert_eq!(decoded, [&b"f"[..], b"fo", b"foo"]);
        assert_eq!(split_binary_values(b"").count(), 1);
    }

    proptest! {
        #[test]
        fn base64_round_trip(data in prop::collection::vec(any::<u8>(), 0..100)) {
            let e = enc(&data);
            prop_assert_eq!(e.len(), base64_encoded_len(data.len()));
            prop_assert!(!e.contains(&b'='));
            prop_assert_eq!(dec(&e).unwrap(), data.clone());
            // The same value with padding decodes identically.
            let mut padded = e.clone();
            while !padded.len().is_multiple_of(4) {
                padded.push(b'=');
            }
            prop_assert_eq!(dec(&padded).unwrap(), data);
        }

        #[test]
        fn base64_decoder_never_panics(data in prop::collection::vec(any::<u8>(), 0..40)) {
            if let Ok(plain) = dec(&data) {
                // Whatever it accepts re-encodes to the same data.
                let again = enc(&plain);
                prop_assert_eq!(dec(&again).unwrap(), plain);
            }
        }
    }
}
