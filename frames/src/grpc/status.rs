//! The `grpc-status` and `grpc-message` trailers.
//!
//! `grpc-status` is a decimal status code. `grpc-message` is UTF-8 text
//! percent-encoded with gRPC's own rule: every byte outside `0x20..=0x7E`,
//! and `%` itself, becomes `%XX` (upper-case hex). Decoding is lenient, as
//! the spec requires ("implementations MUST NOT error or throw away the
//! message"): a `%` not followed by two hex digits is kept as is. Decoding
//! borrows when there is nothing to decode and only allocates when the
//! value contains a valid `%XX` sequence.

use std::borrow::Cow;

use bytes::BufMut;

use crate::{Error, GrpcStatus};

/// Parses a `grpc-status` value.
///
/// The spec sends the code "without any leading zeros"; like grpc-go we
/// accept them on receipt. Codes unknown to this crate are kept
/// ([`GrpcStatus`] is open).
///
/// # Errors
/// [`GrpcInvalidStatus`](Error::GrpcInvalidStatus) unless the value is one
/// or more ASCII digits whose value fits in a `u32`.
pub fn parse_status(value: &[u8]) -> Result<GrpcStatus, Error> {
    if value.is_empty() {
        return Err(Error::GrpcInvalidStatus);
    }
    let mut code: u32 = 0;
    for &d in value {
        if !d.is_ascii_digit() {
            return Err(Error::GrpcInvalidStatus);
        }
        code = code
            .checked_mul(10)
            .and_then(|c| c.checked_add(u32::from(d - b'0')))
            .ok_or(Error::GrpcInvalidStatus)?;
    }
    Ok(GrpcStatus(code))
}

/// Writes `status` as a `grpc-status` value (decimal, no leading zeros).
pub fn encode_status(status: GrpcStatus, dst: &mut impl BufMut) {
    super::put_decimal(u64::from(status.0), dst);
}

/// Whether a `grpc-message` byte can be sent as is.
fn is_unreserved(b: u8) -> bool {
    (0x20..=0x7e).contains(&b) && b != b'%'
}

/// Writes `message` (normally UTF-8 text) percent-encoded as a
/// `grpc-message` value.
pub fn encode_status_message(message: &[u8], dst: &mut impl BufMut) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let mut rest = message;
    while !rest.is_empty() {
        // Copy the longest run that needs no escaping in one go.
        let run = rest
            .iter()
            .position(|&b| !is_unreserved(b))
            .unwrap_or(rest.len());
        let (plain, tail) = rest.split_at(run);
        dst.put_slice(plain);
        let Some((&b, tail)) = tail.split_first() else {
            break;
        };
        dst.put_slice(&[b'%', HEX[usize::from(b >> 4)], HEX[usize::from(b & 0xf)]]);
        rest = tail;
    }
}

/// Decodes a `grpc-message` value. Never fails: invalid `%` sequences are
/// passed through unchanged. Borrows `value` when it contains no valid
/// `%XX` sequence.
///
/// The result is normally UTF-8; use `String::from_utf8_lossy` to display
/// it.
pub fn decode_status_message(value: &[u8]) -> Cow<'_, [u8]> {
    let Some(first) = find_escape(value, 0) else {
        return Cow::Borrowed(value);
    };
    let mut out = Vec::with_capacity(value.len());
    out.extend_from_slice(value.get(..first).unwrap_or_default());
    let mut i = first;
    while let Some(&b) = value.get(i) {
        match escape_at(value, i) {
            Some(decoded) => {
                out.push(decoded);
                i += 3;
            }
            None => {
                out.push(b);
                i += 1;
            }
        }
    }
    Cow::Owned(out)
}

/// Position of the first valid `%XX` sequence at or after `from`.
fn find_escape(value: &[u8], from: usize) -> Option<usize> {
    (from..value.len()).find(|&i| escape_at(value, i).is_some())
}

/// The byte encoded by a valid `%XX` sequence at `i`, if there is one.
fn escape_at(value: &[u8], i: usize) -> Option<u8> {
    match value.get(i..i.checked_add(3)?)? {
        [b'%', hi, lo] => Some(hex_value(*hi)? << 4 | hex_value(*lo)?),
        _ => None,
    }
}

/// Value of one hex digit; lower case is accepted on receipt (grpc-go does).
fn hex_value(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'A'..=b'F' => Some(c - b'A' + 10),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn enc(m: &[u8]) -> Vec<u8> {
        let mut v = Vec::new();
        encode_status_message(m, &mut v);
        v
    }

    #[test]
    fn status_values() {
        assert_eq!(parse_status(b"0"), Ok(GrpcStatus::OK));
        assert_eq!(parse_status(b"14"), Ok(GrpcStatus::UNAVAILABLE));
        assert_eq!(parse_status(b"014"), Ok(GrpcStatus::UNAVAILABLE));
        assert_eq!(parse_status(b"4294967295"), Ok(GrpcStatus(u32::MAX)));
        for bad in [
            &b""[..],
            b"4294967296",
            b"-1",
            b"+1",
            b" 1",
            b"1 ",
            b"0x1",
            b"OK",
        ] {
            assert_eq!(parse_status(bad), Err(Error::GrpcInvalidStatus), "{bad:?}");
        }
        let mut v = Vec::new();
        encode_status(GrpcStatus::RESOURCE_EXHAUSTED, &mut v);
        assert_eq!(v, b"8");
    }

    #[test]
    fn message_encoding() {
        assert_eq!(enc(b"no escapes here ~"), b"no escapes here ~");
        assert_eq!(enc(b"100%"), b"100%25");
        assert_eq!(enc(b"a\r\nb\tc\x7f"), b"a%0D%0Ab%09c%7F");
        assert_eq!(enc("día ☃".as_bytes()), b"d%C3%ADa %E2%98%83");
        assert_eq!(enc(b""), b"");
    }

    #[test]
    fn message_decoding_is_lenient() {
        assert!(matches!(
            decode_status_message(b"plain"),
            Cow::Borrowed(b"plain")
        ));
        assert_eq!(&*decode_status_message(b"d%C3%ADa"), "día".as_bytes());
        assert_eq!(&*decode_status_message(b"%e2%98%83"), "☃".as_bytes());
        // Broken sequences pass through, valid ones around them decode.
        assert_eq!(&*decode_status_message(b"%"), b"%");
        assert_eq!(&*decode_status_message(b"50%"), b"50%");
        assert_eq!(&*decode_status_message(b"%4"), b"%4");
        assert_eq!(&*decode_status_message(b"%zz%41"), b"%zzA");
        assert_eq!(&*decode_status_message(b"%%41"), b"%A");
        assert_eq!(&*decode_status_message(b"%41%"), b"A%");
        assert!(matches!(decode_status_message(b"%zz%"), Cow::Borrowed(_)));
    }

    proptest! {
        #[test]
        fn message_round_trip(m in prop::collection::vec(any::<u8>(), 0..200)) {
            let e = enc(&m);
            prop_assert!(e.iter().all(|&b| (0x20..=0x7e).contains(&b)));
            prop_assert_eq!(&*decode_status_message(&e), &m[..]);
        }

        #[test]
        fn status_round_trip(code in any::<u32>()) {
            let mut v = Vec::new();
            encode_status(GrpcStatus(code), &mut v);
            prop_assert_eq!(parse_status(&v), Ok(GrpcStatus(code)));
        }

        #[test]
        fn decoding_never_grows(v in prop::collection::vec(any::<u8>(), 0..200)) {
            prop_assert!(decode_status_message(&v).len() <= v.len());
        }
    }
}
