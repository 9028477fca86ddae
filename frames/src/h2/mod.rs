//! HTTP/2 framing (RFC 9113 §3.4, §4, §6): the connection preface, the
//! frame header, every frame type, and their encoders.
//!
//! This is the codec under konn's sans-IO HTTP/2 connection (client and
//! server roles, peer grpc-go). It knows single frames, not connections:
//!
//! - [`decode`] takes the receive buffer and returns the next [`Frame`],
//!   borrowing from the buffer, and how many bytes it used; `Ok(None)` if
//!   the frame is not complete yet. A frame larger than our
//!   SETTINGS_MAX_FRAME_SIZE is rejected from its 9-byte header, before its
//!   payload is buffered.
//! - [`Frame::load`] does all per-frame validation of RFC 9113 §6 and
//!   reports violations as [`Error`] variants whose [`Error::h2`] gives the
//!   exact error code and whether it is a connection or a stream error.
//!   Rules that need connection state (CONTINUATION sequencing, stream
//!   states, stream id parity, PUSH_PROMISE to a server) are the
//!   connection's; [`Frame::stream_id`] and [`Frame::frame_type`] make them
//!   one comparison each.
//! - [`Frame::encode`] writes any frame byte-exactly; the `encode_*`
//!   functions ([`encode_data_head`], [`encode_headers`],
//!   [`encode_window_update`], …) write the frames a connection sends most
//!   without building a `Frame`.
//! - [`Settings`] holds one side's SETTINGS with RFC defaults.
//!
//! Nothing here allocates, and [`decode`] plus [`Frame::load`] form one
//! non-generic function body.
//!
//! # A receive loop
//!
//! ```
//! use konn_frames::h2::{self, Frame};
//! use konn_frames::Scope;
//!
//! # let mut out = Vec::new();
//! # // WINDOW_UPDATE with increment 0 on stream 1: a stream error.
//! # out.extend_from_slice(&[0, 0, 4, 8, 0, 0, 0, 0, 1, 0, 0, 0, 0]);
//! # h2::encode_ping(false, *b"12345678", &mut out);
//! # let buf = &out[..];
//! let mut pos = 0;
//! loop {
//!     let rest = &buf[pos..];
//!     match h2::decode(rest, h2::DEFAULT_MAX_FRAME_SIZE) {
//!         Ok(Some((frame, used))) => {
//!             pos += used;
//!             // … hand `frame` to the connection state machine …
//! #           assert!(matches!(frame, Frame::Ping { .. }));
//!         }
//!         Ok(None) => break, // read more bytes, then come back
//!         Err(e) => match e.h2() {
//!             // A stream error only ends that stream: the frame was
//!             // complete, so skip it (RST_STREAM the stream) and go on.
//!             Some((_reason, Scope::Stream(_id))) => {
//!                 let head = h2::decode_head(rest, u32::MAX).unwrap().unwrap();
//!                 pos += head.frame_len();
//!             }
//!             // Anything else ends the connection with GOAWAY.
//!             _ => break,
//!         },
//!     }
//! }
//! # assert_eq!(pos, buf.len());
//! ```
//!
//! A HEADERS frame that fails with [`Error::SelfDependency`] still has to
//! go through HPACK: re-load it with [`Frame::load_allowing_self_dependency`].

mod encode;
mod frame;
mod head;
mod settings;

pub use encode::{
    encode_data, encode_data_head, encode_goaway, encode_headers, encode_ping, encode_rst_stream,
    encode_settings, encode_settings_ack, encode_window_update,
};
pub use frame::{Frame, Priority};
pub use head::{FrameType, HEAD_LEN, Head, MAX_FRAME_LEN, flags};
pub use settings::{
    DEFAULT_HEADER_TABLE_SIZE, DEFAULT_INITIAL_WINDOW_SIZE, DEFAULT_MAX_FRAME_SIZE,
    MAX_WINDOW_SIZE, SettingId, Settings, SettingsIter, SettingsParams, check_setting,
};

use crate::error::Error;

/// The client connection preface (RFC 9113 §3.4), sent by the client before
/// its first SETTINGS frame.
pub const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Checks the start of a server's receive buffer against the client
/// preface.
///
/// `Ok(None)` while `buf` is a strict prefix of [`PREFACE`] (read more),
/// [`Error::InvalidPreface`] as soon as a byte differs (so an HTTP/1.1
/// request or garbage is rejected early), `Ok(Some(24))` once it is all
/// there: consume 24 bytes; frames follow.
pub fn decode_preface(buf: &[u8]) -> Result<Option<usize>, Error> {
    let n = buf.len().min(PREFACE.len());
    if buf.get(..n) != PREFACE.get(..n) {
        return Err(Error::InvalidPreface);
    }
    Ok((n == PREFACE.len()).then_some(PREFACE.len()))
}

/// Parses the next frame header and checks its length against
/// `max_frame_size` (the SETTINGS_MAX_FRAME_SIZE we advertised).
///
/// `Ok(None)` if fewer than 9 bytes are buffered. Use it to learn how many
/// bytes the frame needs ([`Head::frame_len`]) or how many to skip after a
/// stream error.
#[inline]
pub fn decode_head(buf: &[u8], max_frame_size: u32) -> Result<Option<Head>, Error> {
    let Some(bytes) = buf.first_chunk::<HEAD_LEN>() else {
        return Ok(None);
    };
    let head = Head::parse(bytes);
    if head.len > max_frame_size {
        return Err(Error::FrameTooLarge {
            len: head.len,
            max: max_frame_size,
        });
    }
    Ok(Some(head))
}

/// Decodes the frame at the start of `buf`.
///
/// Returns `Ok(None)` while the frame is incomplete (never an error),
/// [`Error::FrameTooLarge`] as soon as the 9-byte header shows a payload
/// longer than `max_frame_size`, any [`Frame::load`] error once the frame
/// is complete, and otherwise the frame with the number of bytes it
/// occupies (header plus payload) to consume.
///
/// On an error whose [`Error::h2`] scope is a stream, the whole frame was
/// in `buf`: skip [`Head::frame_len`] bytes and carry on.
#[inline]
pub fn decode(buf: &[u8], max_frame_size: u32) -> Result<Option<(Frame<'_>, usize)>, Error> {
    let Some(head) = decode_head(buf, max_frame_size)? else {
        return Ok(None);
    };
    let end = head.frame_len();
    let Some(payload) = buf.get(HEAD_LEN..end) else {
        return Ok(None);
    };
    Ok(Some((Frame::load(head, payload)?, end)))
}

/// Builds the wire bytes of a frame from raw parts (tests only).
#[cfg(test)]
fn raw(ty: FrameType, flags: u8, stream_id: u32, payload: &[u8]) -> Vec<u8> {
    let len = frame::len_u32(payload.len());
    let mut out = Head {
        len,
        ty,
        flags,
        stream_id,
    }
    .to_bytes()
    .to_vec();
    out.extend_from_slice(payload);
    out
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::codes::Reason;
    use crate::error::Scope;

    #[test]
    fn preface_prefixes_wait() {
        for n in 0..PREFACE.len() {
            assert_eq!(decode_preface(&PREFACE[..n]), Ok(None), "prefix of {n}");
        }
        assert_eq!(decode_preface(PREFACE), Ok(Some(24)));
        let mut more = PREFACE.to_vec();
        more.extend_from_slice(&[0, 0, 0, 4, 0, 0, 0, 0, 0]);
        assert_eq!(decode_preface(&more), Ok(Some(24)));
    }

    #[test]
    fn preface_fails_at_first_wrong_byte() {
        for n in 0..PREFACE.len() {
            let mut bad = PREFACE[..=n].to_vec();
            bad[n] ^= 0x20;
            assert_eq!(decode_preface(&bad), Err(Error::InvalidPreface), "byte {n}");
            let mut long = PREFACE.to_vec();
            long[n] ^= 1;
            assert_eq!(
                decode_preface(&long),
                Err(Error::InvalidPreface),
                "byte {n}"
            );
        }
        assert_eq!(
            decode_preface(b"GET / HTTP/1.1\r\n"),
            Err(Error::InvalidPreface)
        );
        assert_eq!(decode_preface(b"P"), Ok(None));
        assert_eq!(
            Error::InvalidPreface.h2(),
            Some((Reason::PROTOCOL_ERROR, Scope::Connection))
        );
    }

    #[test]
    fn too_large_from_the_header_alone() {
        let bytes = raw(FrameType::DATA, 0, 1, &[0; 16_385]);
        for n in 0..HEAD_LEN {
            assert_eq!(decode(&bytes[..n], 16_384), Ok(None));
        }
        let err = Error::FrameTooLarge {
            len: 16_385,
            max: 16_384,
        };
        assert_eq!(decode(&bytes[..HEAD_LEN], 16_384), Err(err));
        assert_eq!(decode_head(&bytes[..HEAD_LEN], 16_384), Err(err));
        assert_eq!(
            err.h2(),
            Some((Reason::FRAME_SIZE_ERROR, Scope::Connection))
        );
        // Unknown types and connection frames are limited just the same.
        let head = Head {
            len: 100,
            ty: FrameType(0xee),
            flags: 0,
            stream_id: 0,
        };
        let want = Err(Error::FrameTooLarge { len: 100, max: 99 });
        assert_eq!(decode(&head.to_bytes(), 99), want);
        // Exactly the limit is fine.
        assert!(matches!(
            decode(&bytes, 16_385),
            Ok(Some((Frame::Data { .. }, 16_394)))
        ));
    }

    #[test]
    fn unknown_types_are_skipped() {
        let mut buf = raw(FrameType(0x42), 0xff, 0x8000_0003, b"extension payload");
        buf.extend(raw(FrameType::PING, 0, 0, b"12345678"));
        let (frame, used) = decode(&buf, 16_384).unwrap().unwrap();
        let head = Head {
            len: 17,
            ty: FrameType(0x42),
            flags: 0xff,
            stream_id: 3,
        };
        assert_eq!(
            frame,
            Frame::Unknown {
                head,
                payload: b"extension payload"
            }
        );
        assert_eq!(used, 26);
        let (frame, used) = decode(&buf[used..], 16_384).unwrap().unwrap();
        assert_eq!(
            (frame, used),
            (
                Frame::Ping {
                    ack: false,
                    payload: *b"12345678"
                },
                17
            )
        );
    }

    #[test]
    fn back_to_back_frames() {
        let mut buf = Vec::new();
        Settings {
            enable_push: false,
            initial_window_size: 1 << 20,
            ..Settings::default()
        }
        .encode_changes(&Settings::default(), &mut buf);
        encode_settings_ack(&mut buf);
        encode_window_update(0, 983_041, &mut buf);
        encode_headers(1, &[0x82; 40_000], false, 16_384, &mut buf);
        buf.extend(raw(FrameType::DATA, flags::PADDED, 1, b"\x03hello\0\0\0"));
        encode_data(1, b"world", true, &mut buf);
        encode_ping(true, *b"\0\0\0\0\0\0\0\x01", &mut buf);
        encode_rst_stream(1, Reason::CANCEL, &mut buf);
        encode_goaway(1, Reason::NO_ERROR, b"bye", &mut buf);

        let mut frames = Vec::new();
        let mut pos = 0;
        while let Some((frame, used)) = decode(&buf[pos..], 16_384).unwrap() {
            frames.push(frame);
            pos += used;
        }
        assert_eq!(pos, buf.len());
        let types: Vec<FrameType> = frames.iter().map(Frame::frame_type).collect();
        use FrameType as T;
        #[rustfmt::skip]
        let want = [T::SETTINGS, T::SETTINGS, T::WINDOW_UPDATE, T::HEADERS, T::CONTINUATION,
            T::CONTINUATION, T::DATA, T::DATA, T::PING, T::RST_STREAM, T::GOAWAY];
        assert_eq!(types, want);
        let block: Vec<u8> = frames[3..6]
            .iter()
            .flat_map(|f| match *f {
                Frame::Headers { fragment, .. } | Frame::Continuation { fragment, .. } => fragment,
                _ => &[],
            })
            .copied()
            .collect();
        assert_eq!(block, [0x82; 40_000]);
        assert_eq!(
            frames[6],
            Frame::Data {
                stream_id: 1,
                end_stream: false,
                data: b"hello",
                pad_len: Some(3)
            }
        );
        assert_eq!(frames[6].flow_controlled_len(), 9);
        assert_eq!(
            frames[10],
            Frame::GoAway {
                last_stream_id: 1,
                reason: Reason::NO_ERROR,
                debug_data: b"bye"
            }
        );
    }

    #[test]
    fn stream_errors_can_be_skipped() {
        let mut buf = raw(FrameType::PRIORITY, 0, 5, &[0, 0, 0]);
        encode_window_update(5, 10, &mut buf);
        let err = decode(&buf, 16_384).unwrap_err();
        assert_eq!(err.h2(), Some((Reason::FRAME_SIZE_ERROR, Scope::Stream(5))));
        let head = decode_head(&buf, 16_384).unwrap().unwrap();
        assert_eq!(head.frame_len(), 12);
        let (frame, _) = decode(&buf[head.frame_len()..], 16_384).unwrap().unwrap();
        assert_eq!(
            frame,
            Frame::WindowUpdate {
                stream_id: 5,
                increment: 10
            }
        );
    }

    /// Owned parts from which a valid frame of any type is built.
    #[derive(Debug, Clone)]
    struct Parts {
        kind: u8,
        stream_id: u32,
        other_id: u32,
        a: bool,
        b: bool,
        pad_len: Option<u8>,
        priority: Option<Priority>,
        bytes: Vec<u8>,
        settings: Vec<u8>,
        ping: [u8; 8],
        code: u32,
        unknown: (u8, u8),
    }

    /// A valid value for a known setting, any value for an unknown one.
    fn valid_setting((id, value): (u16, u32)) -> [u8; 6] {
        let value = match SettingId(id) {
            SettingId::ENABLE_PUSH
            | SettingId::ENABLE_CONNECT_PROTOCOL
            | SettingId::NO_RFC7540_PRIORITIES => value & 1,
            SettingId::INITIAL_WINDOW_SIZE => value & MAX_WINDOW_SIZE,
            SettingId::MAX_FRAME_SIZE => 16_384 + value % (MAX_FRAME_LEN - 16_383),
            _ => value,
        };
        let [i0, i1] = id.to_be_bytes();
        let [v0, v1, v2, v3] = value.to_be_bytes();
        [i0, i1, v0, v1, v2, v3]
    }

    fn parts() -> impl Strategy<Value = Parts> {
        let priority =
            (any::<u32>(), any::<bool>(), any::<u8>()).prop_map(|(d, exclusive, weight)| {
                Priority {
                    dependency: d >> 1,
                    exclusive,
                    weight,
                }
            });
        let setting = (prop_oneof![1u16..=9, any::<u16>()], any::<u32>()).prop_map(valid_setting);
        (
            (
                0u8..11,
                1u32..=0x7fff_ffff,
                0u32..=0x7fff_ffff,
                any::<bool>(),
                any::<bool>(),
            ),
            (
                proptest::option::of(any::<u8>()),
                proptest::option::of(priority),
            ),
            proptest::collection::vec(any::<u8>(), 0..300),
            proptest::collection::vec(setting, 0..8),
            (any::<[u8; 8]>(), any::<u32>(), 10u8.., any::<u8>()),
        )
            .prop_map(
                |((kind, stream_id, other_id, a, b), (pad_len, priority), bytes, s, rest)| {
                    let (ping, code, unknown_ty, unknown_flags) = rest;
                    Parts {
                        kind,
                        stream_id,
                        other_id,
                        a,
                        b,
                        pad_len,
                        // A stream cannot depend on itself.
                        priority: priority.map(|p| Priority {
                            dependency: if p.dependency == stream_id {
                                0
                            } else {
                                p.dependency
                            },
                            ..p
                        }),
                        bytes,
                        settings: s.concat(),
                        ping,
                        code,
                        unknown: (unknown_ty, unknown_flags),
                    }
                },
            )
    }

    /// The frame `p` describes.
    fn build(p: &Parts) -> Frame<'_> {
        let stream_id = p.stream_id;
        match p.kind {
            0 => Frame::Data {
                stream_id,
                end_stream: p.a,
                data: &p.bytes,
                pad_len: p.pad_len,
            },
            1 => Frame::Headers {
                stream_id,
                end_stream: p.a,
                end_headers: p.b,
                priority: p.priority,
                pad_len: p.pad_len,
                fragment: &p.bytes,
            },
            2 => Frame::Priority {
                stream_id,
                priority: p.priority.unwrap_or(Priority {
                    dependency: 0,
                    exclusive: p.a,
                    weight: 7,
                }),
            },
            3 => Frame::RstStream {
                stream_id,
                reason: Reason(p.code),
            },
            4 if p.a => Frame::Settings {
                ack: true,
                params: SettingsParams::EMPTY,
            },
            4 => Frame::Settings {
                ack: false,
                params: SettingsParams::new(&p.settings).unwrap(),
            },
            5 => Frame::PushPromise {
                stream_id,
                end_headers: p.a,
                promised_id: p.other_id,
                pad_len: p.pad_len,
                fragment: &p.bytes,
            },
            6 => Frame::Ping {
                ack: p.a,
                payload: p.ping,
            },
            7 => Frame::GoAway {
                last_stream_id: p.other_id,
                reason: Reason(p.code),
                debug_data: &p.bytes,
            },
            8 => Frame::WindowUpdate {
                stream_id: if p.a { 0 } else { stream_id },
                increment: p.other_id.max(1),
            },
            9 => Frame::Continuation {
                stream_id,
                end_headers: p.a,
                fragment: &p.bytes,
            },
            _ => Frame::Unknown {
                head: Head {
                    len: frame::len_u32(p.bytes.len()),
                    ty: FrameType(p.unknown.0),
                    flags: p.unknown.1,
                    stream_id: if p.a { 0 } else { stream_id },
                },
                payload: &p.bytes,
            },
        }
    }

    proptest! {
        #[test]
        fn round_trip_every_frame_type(p in parts()) {
            let frame = build(&p);
            let mut out = Vec::new();
            frame.encode(&mut out);
            prop_assert_eq!(out.len(), frame.encoded_len());
            let (back, used) = decode(&out, 16_384).unwrap().unwrap();
            prop_assert_eq!(back, frame);
            prop_assert_eq!(used, out.len());
            let mut again = Vec::new();
            back.encode(&mut again);
            prop_assert_eq!(&again, &out);
            for n in 0..out.len() {
                prop_assert_eq!(decode(&out[..n], 16_384), Ok(None), "prefix {}", n);
            }
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let mut rest = &bytes[..];
            while let Ok(Some((frame, used))) = decode(rest, 256) {
                let mut out = Vec::new();
                frame.encode(&mut out);
                prop_assert_eq!(out.len(), used);
                prop_assert_eq!(decode(&out, 256), Ok(Some((frame, used))));
                rest = &rest[used..];
            }
            if let Err(e) = decode(rest, 256) {
                prop_assert!(e.h2().is_some());
            }
            let _ = decode_preface(&bytes);
        }
    }
}
