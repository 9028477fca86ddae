//! Direct encoders for the frames a connection sends on its hot path.
//!
//! [`Frame::encode`](super::Frame::encode) handles every frame, but a
//! connection rarely has a `Frame` at hand when it sends: it has a stream
//! id, a window increment, a payload living elsewhere. These helpers write
//! the wire bytes straight from those values, without building a frame
//! first; DATA gets a header-only encoder so the payload can be sent with scatter-gather IO
//! instead of being copied behind the header.

use bytes::BufMut;

use super::head::{FrameType, Head, MAX_FRAME_LEN, STREAM_ID_MASK, flags};
use super::settings::SettingId;
use crate::codes::Reason;

/// Writes the 9-byte header of a DATA frame carrying `len` payload bytes
/// (unpadded); the caller sends the payload itself.
///
/// # Panics
/// If `len` exceeds 2^24 - 1 (a caller bug; it must also respect the peer's
/// SETTINGS_MAX_FRAME_SIZE, which is not known here).
#[inline]
pub fn encode_data_head<B: BufMut + ?Sized>(
    stream_id: u32,
    len: u32,
    end_stream: bool,
    dst: &mut B,
) {
    let flags = if end_stream { flags::END_STREAM } else { 0 };
    Head {
        len,
        ty: FrameType::DATA,
        flags,
        stream_id,
    }
    .encode(dst);
}

/// Writes an unpadded DATA frame: header and payload.
///
/// # Panics
/// If `data` is longer than 2^24 - 1 bytes.
#[inline]
pub fn encode_data<B: BufMut + ?Sized>(stream_id: u32, data: &[u8], end_stream: bool, dst: &mut B) {
    encode_data_head(
        stream_id,
        super::frame::len_u32(data.len()),
        end_stream,
        dst,
    );
    dst.put_slice(data);
}

/// Writes a field block as one HEADERS frame followed by as many
/// CONTINUATION frames as needed so that no payload exceeds
/// `max_frame_size` (the peer's SETTINGS_MAX_FRAME_SIZE). END_STREAM goes on
/// the HEADERS frame, END_HEADERS on the last frame, as RFC 9113 §6.2 and
/// §6.10 require. An empty block gives one empty HEADERS frame.
///
/// The frames must reach the wire back to back (no other frame in between,
/// §6.10), so write them in one go. `max_frame_size` is clamped to
/// `1 ..= 2^24 - 1` to guarantee progress.
pub fn encode_headers<B: BufMut + ?Sized>(
    stream_id: u32,
    block: &[u8],
    end_stream: bool,
    max_frame_size: u32,
    dst: &mut B,
) {
    // Lossless: at most 2^24 - 1.
    let max = max_frame_size.clamp(1, MAX_FRAME_LEN) as usize;
    let mut ty = FrameType::HEADERS;
    let mut flags = if end_stream { flags::END_STREAM } else { 0 };
    let mut rest = block;
    loop {
        let (chunk, tail) = rest.split_at(rest.len().min(max));
        if tail.is_empty() {
            flags |= flags::END_HEADERS;
        }
        let len = super::frame::len_u32(chunk.len());
        Head {
            len,
            ty,
            flags,
            stream_id,
        }
        .encode(dst);
        dst.put_slice(chunk);
        if tail.is_empty() {
            return;
        }
        (ty, flags, rest) = (FrameType::CONTINUATION, 0, tail);
    }
}

/// Writes a SETTINGS frame with the given parameters in order. Values are
/// not checked: sending an invalid one is a caller bug the peer will report.
///
/// # Panics
/// If there are more than 2^24 / 6 parameters.
pub fn encode_settings<B: BufMut + ?Sized>(params: &[(SettingId, u32)], dst: &mut B) {
    let len = super::frame::len_u32(params.len().saturating_mul(6));
    Head {
        len,
        ty: FrameType::SETTINGS,
        flags: 0,
        stream_id: 0,
    }
    .encode(dst);
    for &(id, value) in params {
        let [i0, i1] = id.0.to_be_bytes();
        let [v0, v1, v2, v3] = value.to_be_bytes();
        dst.put_slice(&[i0, i1, v0, v1, v2, v3]);
    }
}

/// Writes an empty SETTINGS frame with the ACK flag.
#[inline]
pub fn encode_settings_ack<B: BufMut + ?Sized>(dst: &mut B) {
    Head {
        len: 0,
        ty: FrameType::SETTINGS,
        flags: flags::ACK,
        stream_id: 0,
    }
    .encode(dst);
}

/// Writes a PING frame (with ACK to answer a received PING with its payload).
#[inline]
pub fn encode_ping<B: BufMut + ?Sized>(ack: bool, payload: [u8; 8], dst: &mut B) {
    let flags = if ack { flags::ACK } else { 0 };
    let head = Head {
        len: 8,
        ty: FrameType::PING,
        flags,
        stream_id: 0,
    };
    put_fixed(dst, head, payload);
}

/// Writes a GOAWAY frame.
///
/// # Panics
/// If `debug_data` is longer than 2^24 - 9 bytes.
pub fn encode_goaway<B: BufMut + ?Sized>(
    last_stream_id: u32,
    reason: Reason,
    debug_data: &[u8],
    dst: &mut B,
) {
    let len = super::frame::len_u32(debug_data.len().saturating_add(8));
    Head {
        len,
        ty: FrameType::GOAWAY,
        flags: 0,
        stream_id: 0,
    }
    .encode(dst);
    let [l0, l1, l2, l3] = (last_stream_id & STREAM_ID_MASK).to_be_bytes();
    let [r0, r1, r2, r3] = reason.0.to_be_bytes();
    dst.put_slice(&[l0, l1, l2, l3, r0, r1, r2, r3]);
    dst.put_slice(debug_data);
}

/// Writes a RST_STREAM frame.
#[inline]
pub fn encode_rst_stream<B: BufMut + ?Sized>(stream_id: u32, reason: Reason, dst: &mut B) {
    let head = Head {
        len: 4,
        ty: FrameType::RST_STREAM,
        flags: 0,
        stream_id,
    };
    put_fixed(dst, head, reason.0.to_be_bytes());
}

/// Writes a WINDOW_UPDATE frame (stream 0 for the connection window).
/// `increment` must be in `1 ..= 2^31 - 1`; its top bit is not sent.
#[inline]
pub fn encode_window_update<B: BufMut + ?Sized>(stream_id: u32, increment: u32, dst: &mut B) {
    debug_assert!(
        (1..=STREAM_ID_MASK).contains(&increment),
        "WINDOW_UPDATE increment {increment} out of range"
    );
    let head = Head {
        len: 4,
        ty: FrameType::WINDOW_UPDATE,
        flags: 0,
        stream_id,
    };
    put_fixed(dst, head, (increment & STREAM_ID_MASK).to_be_bytes());
}

/// Writes a header and a fixed-size payload.
#[inline]
fn put_fixed<B: BufMut + ?Sized, const N: usize>(dst: &mut B, head: Head, payload: [u8; N]) {
    head.encode(dst);
    dst.put_slice(&payload);
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::h2::{Frame, decode, raw};

    fn bytes(f: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
        let mut out = Vec::new();
        f(&mut out);
        out
    }

    fn encoded(frame: Frame<'_>) -> Vec<u8> {
        bytes(|out| frame.encode(out))
    }

    #[test]
    fn known_bytes() {
        assert_eq!(bytes(encode_settings_ack), [0, 0, 0, 4, 1, 0, 0, 0, 0]);
        assert_eq!(
            bytes(|o| encode_window_update(0, 0x00ff_0001, o)),
            [0, 0, 4, 8, 0, 0, 0, 0, 0, 0, 0xff, 0, 1]
        );
        assert_eq!(
            bytes(|o| encode_data_head(3, 0x01_0000, true, o)),
            [1, 0, 0, 0, 1, 0, 0, 0, 3]
        );
        assert_eq!(
            bytes(|o| encode_rst_stream(0x7fff_ffff, Reason::CANCEL, o)),
            [0, 0, 4, 3, 0, 0x7f, 0xff, 0xff, 0xff, 0, 0, 0, 8]
        );
    }

    #[test]
    fn helpers_agree_with_frame_encode() {
        let data = Frame::Data {
            stream_id: 9,
            end_stream: true,
            data: b"payload",
            pad_len: None,
        };
        assert_eq!(
            bytes(|o| encode_data(9, b"payload", true, o)),
            encoded(data)
        );
        let mut head_only = bytes(|o| encode_data_head(9, 7, true, o));
        head_only.extend_from_slice(b"payload");
        assert_eq!(head_only, encoded(data));

        for ack in [false, true] {
            let ping = Frame::Ping {
                ack,
                payload: *b"abcdefgh",
            };
            assert_eq!(bytes(|o| encode_ping(ack, *b"abcdefgh", o)), encoded(ping));
        }
        let goaway = Frame::GoAway {
            last_stream_id: 11,
            reason: Reason::ENHANCE_YOUR_CALM,
            debug_data: b"x",
        };
        assert_eq!(
            bytes(|o| encode_goaway(11, Reason::ENHANCE_YOUR_CALM, b"x", o)),
            encoded(goaway)
        );
        let rst = Frame::RstStream {
            stream_id: 5,
            reason: Reason::REFUSED_STREAM,
        };
        assert_eq!(
            bytes(|o| encode_rst_stream(5, Reason::REFUSED_STREAM, o)),
            encoded(rst)
        );
        let wu = Frame::WindowUpdate {
            stream_id: 5,
            increment: 65_535,
        };
        assert_eq!(bytes(|o| encode_window_update(5, 65_535, o)), encoded(wu));
        let params = [(SettingId::ENABLE_PUSH, 0), (SettingId(0x99), 12)];
        let out = bytes(|o| encode_settings(&params, o));
        let (frame, _) = decode(&out, 16_384).unwrap().unwrap();
        let Frame::Settings {
            ack: false,
            params: got,
        } = frame
        else {
            panic!("{frame:?}")
        };
        assert_eq!(got.iter().collect::<Vec<_>>(), params);
        assert_eq!(encoded(frame), out);
    }

    #[test]
    fn headers_split_into_continuations() {
        let block: Vec<u8> = (0..40).collect();
        let out = bytes(|o| encode_headers(3, &block, true, 16, o));
        let mut want = raw(FrameType::HEADERS, flags::END_STREAM, 3, &block[..16]);
        want.extend(raw(FrameType::CONTINUATION, 0, 3, &block[16..32]));
        want.extend(raw(
            FrameType::CONTINUATION,
            flags::END_HEADERS,
            3,
            &block[32..],
        ));
        assert_eq!(out, want);

        let flags = flags::END_HEADERS;
        let one = bytes(|o| encode_headers(3, &block[..16], false, 16, o));
        assert_eq!(one, raw(FrameType::HEADERS, flags, 3, &block[..16]));
        let empty = bytes(|o| encode_headers(3, &[], true, 16, o));
        assert_eq!(
            empty,
            raw(FrameType::HEADERS, flags | flags::END_STREAM, 3, &[])
        );
        // A zero limit still makes progress, one byte per frame.
        let tiny = bytes(|o| encode_headers(1, b"ab", false, 0, o));
        let mut want = raw(FrameType::HEADERS, 0, 1, b"a");
        want.extend(raw(FrameType::CONTINUATION, flags, 1, b"b"));
        assert_eq!(tiny, want);
    }

    proptest! {
        #[test]
        fn headers_reassemble(
            block in proptest::collection::vec(any::<u8>(), 0..2000),
            max in 1u32..700,
            end_stream in any::<bool>(),
        ) {
            let out = bytes(|o| encode_headers(7, &block, end_stream, max, o));
            let mut rest = &out[..];
            let mut got = Vec::new();
            let mut first = true;
            while let Some((frame, used)) = decode(rest, max).unwrap() {
                rest = &rest[used..];
                let (fragment, end_headers) = match frame {
                    Frame::Headers { stream_id: 7, end_stream: es, end_headers, priority: None, pad_len: None, fragment }
                        if first && es == end_stream => (fragment, end_headers),
                    Frame::Continuation { stream_id: 7, end_headers, fragment } if !first => (fragment, end_headers),
                    other => return Err(TestCaseError::fail(format!("{other:?}"))),
                };
                prop_assert!(fragment.len() == max as usize || end_headers);
                got.extend_from_slice(fragment);
                first = false;
                prop_assert_eq!(end_headers, rest.is_empty());
            }
            prop_assert!(rest.is_empty());
            prop_assert_eq!(got, block);
        }
    }
}
