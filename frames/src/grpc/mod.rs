//! gRPC over HTTP/2: the pieces of the gRPC wire protocol that sit on top of
//! HTTP/2 frames and HPACK header lists (gRPC's "PROTOCOL-HTTP2" document).
//!
//! ```text
//!   DATA payloads ──► message::Deframer ──► one Bytes per Length-Prefixed-Message
//!                        (5-byte prefix: compressed flag + u32 big-endian length)
//!
//!   header values ──► status::   grpc-status, grpc-message (percent-encoding)
//!                     timeout::  grpc-timeout (≤ 8 digits + H/M/S/m/u/n)
//!                     metadata:: key/value validation, base64 for `-bin` keys
//! ```
//!
//! ## Design
//! - **Sans-IO and allocation-aware.** The deframer hands out zero-copy
//!   slices of the DATA payload whenever a message body lies inside one
//!   chunk; only a message split across DATA frames is copied, into a buffer
//!   allocated once for exactly its declared length.
//! - **Limits before buffering.** The receive limit is checked on the 5-byte
//!   prefix, before a single body byte is stored
//!   ([`Error::GrpcMessageTooLarge`](crate::Error::GrpcMessageTooLarge)).
//! - **No compression.** konn never negotiates a `grpc-encoding`, so a
//!   message with the compressed flag set is an error
//!   ([`Error::GrpcCompressed`](crate::Error::GrpcCompressed), reported as
//!   `UNIMPLEMENTED` like grpc-go's missing-decompressor case).
//! - **Header values are bytes.** HPACK yields octets, so every parser takes
//!   `&[u8]`; encoders write into a caller-owned [`bytes::BufMut`].
//! - **Lenient where the spec says so.** `grpc-message` decoding never fails,
//!   binary metadata accepts padded and unpadded base64.

pub mod message;
pub mod metadata;
pub mod status;
pub mod timeout;

pub use message::{
    DEFAULT_MAX_RECV_MESSAGE_SIZE, Deframer, MessageHeader, PREFIX_LEN, decode_prefix,
    encode_prefix,
};
pub use metadata::{
    base64_encoded_len, decode_base64, encode_base64, is_binary_key, split_binary_values,
    validate_ascii_value, validate_custom_key, validate_key,
};
pub use status::{decode_status_message, encode_status, encode_status_message, parse_status};
pub use timeout::{MAX_TIMEOUT_VALUE, encode_timeout, parse_timeout};

/// Writes `n` in decimal ASCII without leading zeros ("0" for zero).
fn put_decimal(mut n: u64, dst: &mut impl bytes::BufMut) {
    // u64::MAX has 20 decimal digits.
    let mut digits = [0u8; 20];
    let mut start = digits.len();
    loop {
        start -= 1;
        if let Some(d) = digits.get_mut(start) {
            // `n % 10` is below 10, so the cast cannot truncate.
            *d = b'0' + (n % 10) as u8;
        }
        n /= 10;
        if n == 0 || start == 0 {
            break;
        }
    }
    dst.put_slice(digits.get(start..).unwrap_or_default());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimal_formatting() {
        for (n, s) in [(0u64, "0"), (7, "7"), (10, "10"), (99_999_999, "99999999")] {
            let mut v = Vec::new();
            put_decimal(n, &mut v);
            assert_eq!(v, s.as_bytes());
        }
        let mut v = Vec::new();
        put_decimal(u64::MAX, &mut v);
        assert_eq!(v, u64::MAX.to_string().as_bytes());
    }
}
