//! Frame loading tests: every frame type's fields, flags and padding, and
//! the RFC 9113 errors with their scope.

use super::*;
use crate::error::Scope;
use crate::h2::{SettingId, decode, raw};

/// Loads a frame built from its parts.
fn load(ty: FrameType, flags: u8, stream_id: u32, payload: &[u8]) -> Result<Frame<'_>, Error> {
    let len = len_u32(payload.len());
    Frame::load(
        Head {
            len,
            ty,
            flags,
            stream_id,
        },
        payload,
    )
}

/// Asserts that a frame fails with `want`, and that it maps to `reason`
/// and `scope`, through both `Frame::load` and `decode`.
#[track_caller]
fn assert_err(
    (ty, flags, stream_id): (FrameType, u8, u32),
    payload: &[u8],
    want: Error,
    reason: Reason,
    scope: Scope,
) {
    assert_eq!(load(ty, flags, stream_id, payload), Err(want));
    assert_eq!(want.h2(), Some((reason, scope)), "{want:?}");
    let bytes = raw(ty, flags, stream_id, payload);
    assert_eq!(decode(&bytes, 1 << 14).map(|_| ()), Err(want));
}

const CONN: Scope = Scope::Connection;
const PROTO: Reason = Reason::PROTOCOL_ERROR;
const SIZE: Reason = Reason::FRAME_SIZE_ERROR;

#[test]
fn stream_id_required() {
    for (ty, payload) in [
        (FrameType::DATA, &[][..]),
        (FrameType::HEADERS, &[]),
        (FrameType::PRIORITY, &[0, 0, 0, 1, 16]),
        (FrameType::RST_STREAM, &[0, 0, 0, 8]),
        (FrameType::PUSH_PROMISE, &[0, 0, 0, 2]),
        (FrameType::CONTINUATION, &[]),
    ] {
        let want = Error::StreamIdRequired { ty: ty.0 };
        assert_err((ty, 0, 0), payload, want, PROTO, CONN);
    }
}

#[test]
fn stream_id_forbidden() {
    for (ty, payload) in [
        (FrameType::SETTINGS, &[][..]),
        (FrameType::PING, &[0; 8]),
        (FrameType::GOAWAY, &[0; 8]),
    ] {
        let want = Error::StreamIdForbidden {
            ty: ty.0,
            stream_id: 3,
        };
        assert_err((ty, 0, 3), payload, want, PROTO, CONN);
    }
}

#[test]
fn fixed_sizes() {
    let cases: [(FrameType, u32, &[usize]); 6] = [
        (FrameType::PING, 0, &[0, 7, 9]),
        (FrameType::RST_STREAM, 1, &[0, 3, 5]),
        (FrameType::WINDOW_UPDATE, 0, &[0, 3, 5]),
        (FrameType::WINDOW_UPDATE, 7, &[3, 8]),
        (FrameType::SETTINGS, 0, &[1, 5, 7, 13]),
        (FrameType::GOAWAY, 0, &[0, 7]),
    ];
    for (ty, stream_id, lens) in cases {
        for &len in lens {
            let payload = vec![1; len];
            let want = Error::BadFrameSize {
                ty: ty.0,
                len: len_u32(len),
                stream_id,
            };
            assert_err((ty, 0, stream_id), &payload, want, SIZE, CONN);
        }
    }
}

#[test]
fn priority_size_is_a_stream_error() {
    for len in [0, 4, 6] {
        let payload = vec![0; len];
        let want = Error::BadFrameSize {
            ty: 2,
            len: len_u32(len),
            stream_id: 9,
        };
        assert_err(
            (FrameType::PRIORITY, 0, 9),
            &payload,
            want,
            SIZE,
            Scope::Stream(9),
        );
    }
}

#[test]
fn settings_ack_must_be_empty() {
    let want = Error::BadFrameSize {
        ty: 4,
        len: 6,
        stream_id: 0,
    };
    assert_err(
        (FrameType::SETTINGS, flags::ACK, 0),
        &[0, 2, 0, 0, 0, 0],
        want,
        SIZE,
        CONN,
    );
    let ack = load(FrameType::SETTINGS, flags::ACK, 0, &[]).unwrap();
    assert_eq!(
        ack,
        Frame::Settings {
            ack: true,
            params: SettingsParams::EMPTY
        }
    );
}

#[test]
fn padding_field_missing_is_a_size_error() {
    let p = flags::PADDED;
    let size = |ty: FrameType, len| Error::BadFrameSize {
        ty: ty.0,
        len,
        stream_id: 1,
    };
    let cases: [(FrameType, u8, &[u8]); 6] = [
        (FrameType::DATA, p, &[]),
        (FrameType::HEADERS, p, &[]),
        // PRIORITY fields need 5 bytes after the Pad Length.
        (FrameType::HEADERS, p | flags::PRIORITY, &[0, 0, 0, 0, 3]),
        (FrameType::HEADERS, flags::PRIORITY, &[0, 0, 0, 3]),
        // The promised stream id needs 4 bytes.
        (FrameType::PUSH_PROMISE, p, &[0, 0, 0, 2]),
        (FrameType::PUSH_PROMISE, 0, &[0, 0, 2]),
    ];
    for (ty, flags, payload) in cases {
        let want = size(ty, len_u32(payload.len()));
        assert_err((ty, flags, 1), payload, want, SIZE, CONN);
    }
}

#[test]
fn padding_longer_than_payload() {
    let p = flags::PADDED;
    let too_long = |ty: FrameType, pad_len, len| Error::PaddingTooLong {
        ty: ty.0,
        pad_len,
        len,
    };
    let cases: [(FrameType, u8, &[u8]); 6] = [
        (FrameType::DATA, p, &[1]),
        (FrameType::DATA, p, &[4, 0, 0, 0]),
        (FrameType::DATA, p, &[255, 0, 0]),
        (FrameType::HEADERS, p, &[3, 0, 0]),
        // 10 bytes: Pad Length, 5 priority bytes, 4 left for 5 padding.
        (
            FrameType::HEADERS,
            p | flags::PRIORITY,
            &[5, 0, 0, 0, 3, 9, 0, 0, 0, 0],
        ),
        (FrameType::PUSH_PROMISE, p, &[2, 0, 0, 0, 2, 0]),
    ];
    for (ty, flags, payload) in cases {
        let pad_len = payload[0];
        let want = too_long(ty, pad_len, len_u32(payload.len()));
        assert_err((ty, flags, 1), payload, want, PROTO, CONN);
    }
}

#[test]
fn padding_filling_the_payload_is_fine() {
    let frame = load(FrameType::DATA, flags::PADDED, 1, &[3, 0, 0, 0]).unwrap();
    let want = Frame::Data {
        stream_id: 1,
        end_stream: false,
        data: &[],
        pad_len: Some(3),
    };
    assert_eq!(frame, want);
    assert_eq!(frame.flow_controlled_len(), 4);
    let payload = [4, 0, 0, 0, 3, 9, 0, 0, 0, 0];
    let frame = load(
        FrameType::HEADERS,
        flags::PADDED | flags::PRIORITY,
        1,
        &payload,
    )
    .unwrap();
    let Frame::Headers {
        fragment,
        pad_len,
        priority,
        ..
    } = frame
    else {
        panic!("{frame:?}")
    };
    assert_eq!((fragment, pad_len), (&[][..], Some(4)));
    assert_eq!(
        priority,
        Some(Priority {
            dependency: 3,
            exclusive: false,
            weight: 9
        })
    );
}

#[test]
fn padding_is_stripped_and_counted() {
    let frame = load(
        FrameType::DATA,
        flags::PADDED | flags::END_STREAM,
        5,
        b"\x02abc\0\0",
    );
    let frame = frame.unwrap();
    let want = Frame::Data {
        stream_id: 5,
        end_stream: true,
        data: b"abc",
        pad_len: Some(2),
    };
    assert_eq!(frame, want);
    assert_eq!(frame.flow_controlled_len(), 6);
    assert!(frame.is_end_stream());
    // Non-zero padding is accepted (RFC 9113 §6.1 makes checking optional).
    let frame = load(FrameType::DATA, flags::PADDED, 5, b"\x01ab\xff").unwrap();
    assert_eq!(frame.flow_controlled_len(), 4);
}

#[test]
fn zero_window_increment() {
    for (stream_id, scope) in [(0, CONN), (5, Scope::Stream(5))] {
        let want = Error::ZeroWindowIncrement { stream_id };
        assert_err(
            (FrameType::WINDOW_UPDATE, 0, stream_id),
            &[0; 4],
            want,
            PROTO,
            scope,
        );
        // The reserved bit alone is still an increment of 0.
        let payload = [0x80, 0, 0, 0];
        assert_err(
            (FrameType::WINDOW_UPDATE, 0, stream_id),
            &payload,
            want,
            PROTO,
            scope,
        );
    }
    let frame = load(FrameType::WINDOW_UPDATE, 0, 0, &[0xff; 4]).unwrap();
    assert_eq!(
        frame,
        Frame::WindowUpdate {
            stream_id: 0,
            increment: (1 << 31) - 1
        }
    );
}

#[test]
fn self_dependency_is_a_stream_error() {
    let want = Error::SelfDependency { stream_id: 3 };
    for dep in [[0, 0, 0, 3, 15], [0x80, 0, 0, 3, 15]] {
        assert_err(
            (FrameType::PRIORITY, 0, 3),
            &dep,
            want,
            PROTO,
            Scope::Stream(3),
        );
        let mut payload = dep.to_vec();
        payload.extend_from_slice(b"block");
        let flags = flags::PRIORITY | flags::END_HEADERS;
        assert_err(
            (FrameType::HEADERS, flags, 3),
            &payload,
            want,
            PROTO,
            Scope::Stream(3),
        );

        // The escape hatch keeps the fragment for HPACK.
        let head = Head {
            len: len_u32(payload.len()),
            ty: FrameType::HEADERS,
            flags,
            stream_id: 3,
        };
        let frame = Frame::load_allowing_self_dependency(head, &payload).unwrap();
        let Frame::Headers {
            fragment,
            end_headers,
            priority,
            ..
        } = frame
        else {
            panic!("{frame:?}")
        };
        assert_eq!((fragment, end_headers), (&b"block"[..], true));
        assert_eq!(
            priority.map(|p| (p.dependency, p.exclusive)),
            Some((3, dep[0] != 0))
        );
    }
    // The escape hatch changes nothing else.
    let head = Head {
        len: 5,
        ty: FrameType::PRIORITY,
        flags: 0,
        stream_id: 3,
    };
    let err = Frame::load_allowing_self_dependency(head, &[0, 0, 0, 3, 15]);
    assert_eq!(err, Err(want));
}

#[test]
fn invalid_setting_values() {
    let cases = [
        (SettingId::ENABLE_PUSH, 2, PROTO),
        (SettingId::ENABLE_PUSH, u32::MAX, PROTO),
        (
            SettingId::INITIAL_WINDOW_SIZE,
            1 << 31,
            Reason::FLOW_CONTROL_ERROR,
        ),
        (
            SettingId::INITIAL_WINDOW_SIZE,
            u32::MAX,
            Reason::FLOW_CONTROL_ERROR,
        ),
        (SettingId::MAX_FRAME_SIZE, 16_383, PROTO),
        (SettingId::MAX_FRAME_SIZE, 0, PROTO),
        (SettingId::MAX_FRAME_SIZE, 1 << 24, PROTO),
        (SettingId::ENABLE_CONNECT_PROTOCOL, 2, PROTO),
        (SettingId::NO_RFC7540_PRIORITIES, 7, PROTO),
    ];
    for (id, value, reason) in cases {
        // Put a valid parameter first: the whole frame is still rejected.
        let mut payload = vec![0, 1, 0, 0, 0x10, 0];
        payload.extend_from_slice(&id.0.to_be_bytes());
        payload.extend_from_slice(&value.to_be_bytes());
        let want = Error::InvalidSetting { id: id.0, value };
        assert_err((FrameType::SETTINGS, 0, 0), &payload, want, reason, CONN);
    }
}

#[test]
fn valid_setting_bounds_and_unknown_ids() {
    let params: [(u16, u32); 9] = [
        (0x2, 0),
        (0x2, 1),
        (0x4, (1 << 31) - 1),
        (0x5, 16_384),
        (0x5, (1 << 24) - 1),
        (0x3, u32::MAX),
        (0x1, u32::MAX),
        (0x0, u32::MAX),
        (0xabcd, u32::MAX),
    ];
    let payload: Vec<u8> = params
        .iter()
        .flat_map(|(i, v)| [&i.to_be_bytes()[..], &v.to_be_bytes()].concat())
        .collect();
    let frame = load(FrameType::SETTINGS, 0, 0, &payload).unwrap();
    let Frame::Settings {
        ack: false,
        params: got,
    } = frame
    else {
        panic!("{frame:?}")
    };
    assert_eq!(got.len(), 9);
    let got: Vec<(u16, u32)> = got.iter().map(|(id, v)| (id.0, v)).collect();
    assert_eq!(got, params);
}

#[test]
fn reserved_bits_and_undefined_flags_are_ignored() {
    // DATA with every flag but PADDED set: END_STREAM counts, the rest not.
    let frame = load(FrameType::DATA, !flags::PADDED, 1, b"x").unwrap();
    assert_eq!(
        frame,
        Frame::Data {
            stream_id: 1,
            end_stream: true,
            data: b"x",
            pad_len: None
        }
    );
    let mut out = Vec::new();
    frame.encode(&mut out);
    assert_eq!(out, raw(FrameType::DATA, flags::END_STREAM, 1, b"x"));

    let frame = load(
        FrameType::GOAWAY,
        0xff,
        0,
        &[0x80, 0, 0, 7, 0, 0, 0, 2, b'!'],
    )
    .unwrap();
    let want = Frame::GoAway {
        last_stream_id: 7,
        reason: Reason(2),
        debug_data: b"!",
    };
    assert_eq!(frame, want);

    let frame = load(
        FrameType::PUSH_PROMISE,
        flags::END_HEADERS,
        1,
        &[0xff, 0xff, 0xff, 0xfe],
    );
    let Frame::PushPromise {
        promised_id,
        end_headers: true,
        ..
    } = frame.unwrap()
    else {
        panic!()
    };
    assert_eq!(promised_id, 0x7fff_fffe);

    let frame = load(FrameType::RST_STREAM, 0xff, 3, &[0, 0, 0, 0xff]).unwrap();
    assert_eq!(
        frame,
        Frame::RstStream {
            stream_id: 3,
            reason: Reason(0xff)
        }
    );

    let frame = load(FrameType::PING, 0xfe, 0, b"pingpong").unwrap();
    assert_eq!(
        frame,
        Frame::Ping {
            ack: false,
            payload: *b"pingpong"
        }
    );
}

#[test]
fn unknown_types_are_kept_whole() {
    let frame = load(FrameType(0xa), 0xff, 0, b"whatever").unwrap();
    let head = Head {
        len: 8,
        ty: FrameType(0xa),
        flags: 0xff,
        stream_id: 0,
    };
    assert_eq!(
        frame,
        Frame::Unknown {
            head,
            payload: b"whatever"
        }
    );
    assert_eq!((frame.frame_type(), frame.stream_id()), (FrameType(0xa), 0));
    assert_eq!(frame.flow_controlled_len(), 0);
}

#[test]
fn accessors() {
    let data = Frame::Data {
        stream_id: 7,
        end_stream: false,
        data: b"abc",
        pad_len: None,
    };
    assert_eq!(
        (
            data.stream_id(),
            data.frame_type(),
            data.flow_controlled_len()
        ),
        (7, FrameType::DATA, 3)
    );
    assert!(!data.is_end_stream());
    let ping = Frame::Ping {
        ack: true,
        payload: [0; 8],
    };
    assert_eq!(
        (ping.stream_id(), ping.frame_type(), ping.encoded_len()),
        (0, FrameType::PING, 17)
    );
    let cont = Frame::Continuation {
        stream_id: 9,
        end_headers: true,
        fragment: b"",
    };
    assert_eq!(
        cont.head(),
        Head {
            len: 0,
            ty: FrameType::CONTINUATION,
            flags: flags::END_HEADERS,
            stream_id: 9
        }
    );
}
