//! Unit tests of the packet codec on hand-built input. Comparisons with prost
//! (byte equality, random packets, differential acceptance) are in
//! `frames/tests/packet_prost.rs`.

use bytes::{BufMut, Bytes, BytesMut};

use super::*;
use crate::GrpcStatus;

/// A protobuf message built field by field, independently of the encoder
/// under test.
#[derive(Clone, Default)]
struct Msg(Vec<u8>);

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

impl Msg {
    fn new() -> Self {
        Self::default()
    }

    fn key(mut self, field: u32, wire_type: u8) -> Self {
        put_varint(&mut self.0, u64::from(field) << 3 | u64::from(wire_type));
        self
    }

    fn varint(self, field: u32, v: u64) -> Self {
        let mut m = self.key(field, 0);
        put_varint(&mut m.0, v);
        m
    }

    fn len(self, field: u32, contents: &[u8]) -> Self {
        let mut m = self.key(field, 2);
        put_varint(&mut m.0, contents.len() as u64);
        m.0.extend_from_slice(contents);
        m
    }

    fn msg(self, field: u32, inner: Self) -> Self {
        self.len(field, &inner.0)
    }

    fn fixed64(self, field: u32) -> Self {
        self.key(field, 1).raw(&[1, 2, 3, 4, 5, 6, 7, 8])
    }

    fn fixed32(self, field: u32) -> Self {
        self.key(field, 5).raw(&[1, 2, 3, 4])
    }

    fn raw(mut self, bytes: &[u8]) -> Self {
        self.0.extend_from_slice(bytes);
        self
    }

    /// One unknown field of every wire type, numbered from `base`.
    fn unknowns(self, base: u32) -> Self {
        self.varint(base, 150)
            .fixed64(base + 1)
            .len(base + 2, b"junk")
            .key(base + 3, 3)
            .varint(1, 7)
            .len(2, b"x")
            .key(base + 3, 4)
            .fixed32(base + 4)
    }

    fn decode(&self) -> Result<Packet, Error> {
        Packet::decode(&Bytes::copy_from_slice(&self.0))
    }
}

fn s(v: &'static str) -> ByteStr {
    ByteStr::from_static(v)
}

fn data(connect_id: i64, payload: &'static [u8]) -> Packet {
    Packet::Data {
        connect_id,
        error: ByteStr::new(),
        data: Bytes::from_static(payload),
    }
}

fn encode(p: &Packet) -> Vec<u8> {
    let mut out = Vec::new();
    p.encode(&mut out);
    assert_eq!(out.len(), p.encoded_len(), "encoded_len of {p:?}");
    out
}

// ----- PacketType -----

#[test]
fn packet_type_values_and_names() {
    let names = [
        "DIAL_REQ",
        "DIAL_RSP",
        "CLOSE_REQ",
        "CLOSE_RSP",
        "DATA",
        "DIAL_CLS",
        "DRAIN",
    ];
    for (i, ty) in PacketType::ALL.into_iter().enumerate() {
        assert_eq!(i32::from(ty), i as i32);
        assert_eq!(PacketType::try_from(i as i32), Ok(ty));
        assert_eq!(ty.name(), names[i]);
        assert_eq!(ty.to_string(), names[i]);
    }
    for bad in [7, 99, 106, -1, -100, i32::MIN, i32::MAX] {
        assert_eq!(
            PacketType::try_from(bad),
            Err(Error::UnknownPacketType { ty: bad })
        );
    }
}

#[test]
fn extension_types_are_far_from_upstreams() {
    for (ty, value, name) in [
        (PacketType::Pause, 100, "PAUSE"),
        (PacketType::Resume, 101, "RESUME"),
        (PacketType::Ack, 104, "ACK"),
        (PacketType::Resumed, 105, "RESUMED"),
    ] {
        assert!(ty.is_extension());
        assert!(!PacketType::ALL.contains(&ty), "not a metric label value");
        assert!(PacketType::EXTENSIONS.contains(&ty));
        assert_eq!(i32::from(ty), value);
        assert_eq!(PacketType::try_from(value), Ok(ty));
        assert_eq!(ty.name(), name);
        assert_eq!(ty.payload_field(), value as u32);
    }
    assert!(PacketType::ALL.iter().all(|t| !t.is_extension()));
    assert_eq!(Packet::Pause { connect_id: 1 }.ty(), PacketType::Pause);
    assert_eq!(Packet::Resume { connect_id: 1 }.ty(), PacketType::Resume);
    let ack = Packet::Ack {
        connect_id: 1,
        offset: 2,
    };
    assert_eq!(ack.ty(), PacketType::Ack);
    assert_eq!(Packet::Resumed.ty(), PacketType::Resumed);
}

#[test]
fn ty_matches_variant() {
    let packets = [
        Packet::DialReq {
            protocol: s(""),
            address: s(""),
            random: 0,
        },
        Packet::DialRsp {
            error: s(""),
            connect_id: 0,
            random: 0,
        },
        Packet::CloseReq { connect_id: 0 },
        Packet::CloseRsp {
            error: s(""),
            connect_id: 0,
        },
        data(0, b""),
        Packet::DialCls { random: 0 },
        Packet::Drain,
    ];
    for (p, ty) in packets.iter().zip(PacketType::ALL) {
        assert_eq!(p.ty(), ty);
    }
}

// ----- Encoding (exact bytes; prost equality is in tests/packet_prost.rs) -----

#[test]
fn encodes_known_bytes() {
    let dial = Packet::DialReq {
        protocol: s("tcp"),
        address: s("a:1"),
        random: 5,
    };
    // No `type` (DIAL_REQ is 0); payload 2 = {1: "tcp", 2: "a:1", 3: 5}.
    assert_eq!(encode(&dial), b"\x12\x0c\x0a\x03tcp\x12\x03a:1\x18\x05");
    assert_eq!(encode(&Packet::Drain), b"\x08\x06\x42\x00");
    assert_eq!(
        encode(&data(1, b"hi")),
        b"\x08\x04\x22\x06\x08\x01\x1a\x02hi"
    );
    assert_eq!(encode(&data(0, b"")), b"\x08\x04\x22\x00");
    assert_eq!(
        encode(&Packet::CloseReq { connect_id: -1 }),
        b"\x08\x02\x2a\x0b\x08\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01"
    );
    let rsp = Packet::DialRsp {
        error: s("no"),
        connect_id: 300,
        random: 0,
    };
    assert_eq!(encode(&rsp), b"\x08\x01\x1a\x07\x0a\x02no\x10\xac\x02");
    let cls = Packet::CloseRsp {
        error: s(""),
        connect_id: 2,
    };
    assert_eq!(encode(&cls), b"\x08\x03\x32\x02\x10\x02");
    assert_eq!(
        encode(&Packet::DialCls { random: 9 }),
        b"\x08\x05\x3a\x02\x08\x09"
    );
    let with_error = Packet::Data {
        connect_id: 3,
        error: s("e"),
        data: Bytes::from_static(b"z"),
    };
    assert_eq!(
        encode(&with_error),
        b"\x08\x04\x22\x08\x08\x03\x12\x01e\x1a\x01z"
    );
}

#[test]
fn encodes_extension_packets_to_known_bytes() {
    // type 100; member 100 has the two-byte key (100 << 3 | 2) = 802 =
    // 0xa2 0x06; body {1: connectID}.
    assert_eq!(
        encode(&Packet::Pause { connect_id: 1 }),
        b"\x08\x64\xa2\x06\x02\x08\x01"
    );
    // type 101; key 810 = 0xaa 0x06; connectID 300.
    assert_eq!(
        encode(&Packet::Resume { connect_id: 300 }),
        b"\x08\x65\xaa\x06\x03\x08\xac\x02"
    );
    // connectID 0 is left out; the member is still there.
    assert_eq!(
        encode(&Packet::Pause { connect_id: 0 }),
        b"\x08\x64\xa2\x06\x00"
    );
    assert_eq!(
        encode(&Packet::Resume { connect_id: -1 }),
        b"\x08\x65\xaa\x06\x0b\x08\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01"
    );
    let mut framed = Vec::new();
    Packet::Pause { connect_id: 1 }.encode_grpc(&mut framed);
    assert_eq!(framed, b"\0\0\0\0\x07\x08\x64\xa2\x06\x02\x08\x01");
}

#[test]
fn decodes_extension_packets_like_other_members() {
    let m = Msg::new()
        .varint(1, 100)
        .msg(100, Msg::new().varint(1, 9).unknowns(20));
    assert_eq!(m.decode(), Ok(Packet::Pause { connect_id: 9 }));
    // Members merge and the last scalar wins, as everywhere.
    let m = Msg::new()
        .msg(101, Msg::new().varint(1, 1))
        .varint(1, 101)
        .msg(101, Msg::new().varint(1, 2));
    assert_eq!(m.decode(), Ok(Packet::Resume { connect_id: 2 }));
    // An absent payload is all defaults.
    assert_eq!(
        Msg::new().varint(1, 100).decode(),
        Ok(Packet::Pause { connect_id: 0 })
    );
    // PAUSE's member under RESUME's type, and vice versa, are mismatches.
    assert_eq!(
        Msg::new().varint(1, 101).msg(100, Msg::new()).decode(),
        Err(Error::PacketTypeMismatch {
            ty: 101,
            payload_field: 100
        })
    );
    assert_eq!(
        Msg::new().varint(1, 4).msg(101, Msg::new()).decode(),
        Err(Error::PacketTypeMismatch {
            ty: 4,
            payload_field: 101
        })
    );
    // Field 106 is not a member: skipped as unknown.
    assert_eq!(
        Msg::new().varint(1, 6).msg(106, Msg::new()).decode(),
        Ok(Packet::Drain)
    );
    // The reverse-direction members are DialRequest/DialResponse-shaped.
    let m = Msg::new().varint(1, 102).msg(
        102,
        Msg::new()
            .len(1, b"tcp")
            .len(2, b"10.0.0.10:6443")
            .varint(3, 9),
    );
    assert_eq!(
        m.decode(),
        Ok(Packet::ReverseDialReq {
            protocol: ByteStr::from_static("tcp"),
            address: ByteStr::from_static("10.0.0.10:6443"),
            random: 9,
        })
    );
    assert_eq!(
        Msg::new().varint(1, 1).msg(103, Msg::new()).decode(),
        Err(Error::PacketTypeMismatch {
            ty: 1,
            payload_field: 103
        })
    );
}

#[test]
fn encode_grpc_prefixes_the_message() {
    let p = data(7, b"abc");
    let mut out = BytesMut::new();
    p.encode_grpc(&mut out);
    let body = encode(&p);
    assert_eq!(&out[..5], &[0, 0, 0, 0, body.len() as u8]);
    assert_eq!(&out[5..], &body[..]);
}

#[test]
fn encodes_into_a_fixed_slice_of_exact_size() {
    let p = Packet::DialReq {
        protocol: s("tcp"),
        address: s("10.0.0.1:10250"),
        random: -42,
    };
    let mut buf = vec![0u8; p.encoded_len()];
    let mut dst = &mut buf[..];
    p.encode(&mut dst);
    assert!(dst.is_empty());
    assert_eq!(buf, encode(&p));
}

#[test]
fn data_header_matches_encode_grpc() {
    let ids = [0, 1, 127, 128, -1, i64::MIN, i64::MAX];
    let lens = [
        0,
        1,
        127,
        128,
        16_383,
        16_384,
        MAX_DATA_PAYLOAD,
        70_000,
        2_097_152,
    ];
    let payload = vec![0xa5u8; 2_097_152];
    for connect_id in ids {
        for len in lens {
            let data = Bytes::copy_from_slice(&payload[..len]);
            let packet = Packet::Data {
                connect_id,
                error: ByteStr::new(),
                data: data.clone(),
            };
            let mut expected = Vec::new();
            packet.encode_grpc(&mut expected);

            let mut out = Vec::new();
            encode_data_header(connect_id, len, &mut out);
            assert_eq!(
                out.len(),
                data_header_len(connect_id, len),
                "{connect_id} {len}"
            );
            out.extend_from_slice(&data);
            assert_eq!(out, expected, "connect_id {connect_id}, payload {len}");
        }
    }
}

#[test]
fn max_data_payload_fills_one_default_frame() {
    assert_eq!(MAX_DATA_PAYLOAD, 16_360);
    let message_len = |connect_id, len| data_header_len(connect_id, len) + len;
    // Every connect_id is at most as long as a negative one.
    for connect_id in [0, 1, -1, i64::MIN, i64::MAX] {
        assert!(
            message_len(connect_id, MAX_DATA_PAYLOAD) <= 16_384,
            "{connect_id}"
        );
    }
    assert_eq!(message_len(i64::MIN, MAX_DATA_PAYLOAD), 16_384);
    assert_eq!(message_len(-1, MAX_DATA_PAYLOAD + 1), 16_385);

    // And as actually encoded.
    let payload = Bytes::from(vec![0u8; MAX_DATA_PAYLOAD + 1]);
    let grpc_len = |data: Bytes| {
        let mut out = Vec::new();
        Packet::Data {
            connect_id: i64::MIN,
            error: ByteStr::new(),
            data,
        }
        .encode_grpc(&mut out);
        out.len()
    };
    assert_eq!(grpc_len(payload.slice(..MAX_DATA_PAYLOAD)), 16_384);
    assert_eq!(grpc_len(payload), 16_385);
}

#[test]
fn max_data_payload_for_other_budgets() {
    assert_eq!(max_data_payload(0), 0);
    // An empty DATA packet with a negative id: 5 + 2 + 2 + 11 bytes.
    assert_eq!(max_data_payload(19), 0);
    assert_eq!(max_data_payload(20), 0);
    // One byte of payload adds 3 (key, length, byte).
    assert_eq!(max_data_payload(22), 0);
    assert_eq!(max_data_payload(23), 1);
    for budget in [23, 100, 150, 151, 152, 16_384, 65_536, 1 << 21, 1 << 28] {
        let p = max_data_payload(budget);
        assert!(data_header_len(-1, p) + p <= budget, "{budget}");
        assert!(data_header_len(-1, p + 1) + p + 1 > budget, "{budget}");
    }
    // Absurd budgets are clamped instead of overflowing.
    assert!(max_data_payload(usize::MAX) < u32::MAX as usize);
}

// ----- Decoding: acceptance -----

#[test]
fn decodes_each_type() {
    let cases = [
        Packet::DialReq {
            protocol: s("tcp"),
            address: s("[::1]:443"),
            random: i64::MIN,
        },
        Packet::DialRsp {
            error: s("refused"),
            connect_id: 1,
            random: -1,
        },
        Packet::CloseReq {
            connect_id: i64::MAX,
        },
        Packet::CloseRsp {
            error: s("éé"),
            connect_id: 42,
        },
        Packet::Data {
            connect_id: -5,
            error: s("eof"),
            data: Bytes::from_static(b"\0\xff"),
        },
        Packet::DialCls { random: 77 },
        Packet::Drain,
        Packet::Pause { connect_id: 5 },
        Packet::Resume {
            connect_id: i64::MIN,
        },
    ];
    for p in cases {
        let bytes = Bytes::from(encode(&p));
        assert_eq!(Packet::decode(&bytes), Ok(p));
    }
}

#[test]
fn fields_in_any_order() {
    let payload = Msg::new().len(3, b"xyz").len(2, b"e").varint(1, 9);
    let m = Msg::new().msg(4, payload).varint(1, 4);
    let expected = Packet::Data {
        connect_id: 9,
        error: s("e"),
        data: Bytes::from_static(b"xyz"),
    };
    assert_eq!(m.decode(), Ok(expected));
}

#[test]
fn skips_unknown_fields_at_both_levels() {
    let payload = Msg::new()
        .unknowns(4)
        .varint(1, 2)
        .unknowns(100)
        .len(3, b"d")
        .unknowns(1 << 20);
    let m = Msg::new()
        .unknowns(9)
        .varint(1, 4)
        .unknowns(20)
        .msg(4, payload)
        .unknowns((1 << 29) - 5);
    assert_eq!(m.decode(), Ok(data(2, b"d")));
    // Fields 2 and 3 of CloseRequest are unknown there: skipped whatever
    // their wire type.
    let close = Msg::new()
        .varint(1, 2)
        .msg(5, Msg::new().len(2, b"?").fixed32(3).varint(1, 8));
    assert_eq!(close.decode(), Ok(Packet::CloseReq { connect_id: 8 }));
    // Drain has no fields at all.
    let drain = Msg::new()
        .varint(1, 6)
        .msg(8, Msg::new().varint(1, 1).len(2, b"\xff"));
    assert_eq!(drain.decode(), Ok(Packet::Drain));
}

#[test]
fn last_scalar_wins() {
    let payload = Msg::new()
        .varint(1, 1)
        .len(3, b"first")
        .len(2, b"a")
        .varint(1, 2)
        .len(3, b"second")
        .len(2, b"");
    let m = Msg::new().varint(1, 0).varint(1, 4).msg(4, payload);
    assert_eq!(m.decode(), Ok(data(2, b"second")));
}

#[test]
fn same_oneof_member_merges() {
    let m = Msg::new()
        .varint(1, 4)
        .msg(4, Msg::new().varint(1, 5).len(3, b"abc"))
        .msg(4, Msg::new().len(2, b"err"))
        .msg(4, Msg::new());
    let expected = Packet::Data {
        connect_id: 5,
        error: s("err"),
        data: Bytes::from_static(b"abc"),
    };
    assert_eq!(m.decode(), Ok(expected));

    let m = Msg::new()
        .msg(2, Msg::new().len(1, b"tcp").varint(3, 1))
        .msg(2, Msg::new().len(2, b"h:1").varint(3, 2));
    let expected = Packet::DialReq {
        protocol: s("tcp"),
        address: s("h:1"),
        random: 2,
    };
    assert_eq!(m.decode(), Ok(expected));
}

#[test]
fn different_oneof_member_replaces() {
    // DATA, then DIAL_REQ, then DATA again: the second DATA starts afresh.
    let m = Msg::new()
        .varint(1, 4)
        .msg(4, Msg::new().varint(1, 5).len(3, b"abc"))
        .msg(2, Msg::new().len(1, b"tcp"))
        .msg(4, Msg::new().len(2, b"e"));
    let expected = Packet::Data {
        connect_id: 0,
        error: s("e"),
        data: Bytes::new(),
    };
    assert_eq!(m.decode(), Ok(expected));

    let m = Msg::new()
        .msg(4, Msg::new().varint(1, 5))
        .msg(2, Msg::new().len(2, b"h:1"));
    let expected = Packet::DialReq {
        protocol: s(""),
        address: s("h:1"),
        random: 0,
    };
    assert_eq!(m.decode(), Ok(expected));
}

#[test]
fn negative_and_non_minimal_varints() {
    let minus_one = [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01];
    let min = [0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01];
    let payload = Msg::new().key(2, 0).raw(&minus_one).key(3, 0).raw(&min);
    let m = Msg::new()
        .key(1, 0)
        .raw(&[0x81, 0x80, 0x00])
        .msg(3, payload);
    let expected = Packet::DialRsp {
        error: s(""),
        connect_id: -1,
        random: i64::MIN,
    };
    assert_eq!(m.decode(), Ok(expected));

    // Non-minimal key and length varints too.
    let m = Msg::new().raw(&[0x88, 0x00, 0x04, 0xa2, 0x80, 0x00, 0x82, 0x00, 0x08, 0x07]);
    assert_eq!(m.decode(), Ok(data(7, b"")));
}

#[test]
fn type_is_an_int32() {
    // Wider varints are truncated to 32 bits, like prost and protobuf-go.
    let m = Msg::new()
        .varint(1, (1 << 32) | 4)
        .msg(4, Msg::new().varint(1, 3));
    assert_eq!(m.decode(), Ok(data(3, b"")));
    let m = Msg::new().varint(1, u64::MAX);
    assert_eq!(m.decode(), Err(Error::UnknownPacketType { ty: -1 }));
}

#[test]
fn absent_type_is_dial_req() {
    assert_eq!(
        Msg::new().msg(2, Msg::new().len(1, b"tcp")).decode(),
        Ok(Packet::DialReq {
            protocol: s("tcp"),
            address: s(""),
            random: 0
        })
    );
    assert_eq!(
        Msg::new().decode(),
        Ok(Packet::DialReq {
            protocol: s(""),
            address: s(""),
            random: 0
        })
    );
}

#[test]
fn absent_payload_is_all_defaults() {
    let expected = [
        Packet::DialReq {
            protocol: s(""),
            address: s(""),
            random: 0,
        },
        Packet::DialRsp {
            error: s(""),
            connect_id: 0,
            random: 0,
        },
        Packet::CloseReq { connect_id: 0 },
        Packet::CloseRsp {
            error: s(""),
            connect_id: 0,
        },
        data(0, b""),
        Packet::DialCls { random: 0 },
        Packet::Drain,
    ];
    for (ty, p) in expected.into_iter().enumerate() {
        assert_eq!(Msg::new().varint(1, ty as u64).decode(), Ok(p.clone()));
        // An empty payload message is the same thing.
        let with_empty = Msg::new()
            .varint(1, ty as u64)
            .msg(p.ty().payload_field(), Msg::new());
        assert_eq!(with_empty.decode(), Ok(p));
    }
}

#[test]
fn bytes_field_need_not_be_utf8() {
    let m = Msg::new()
        .varint(1, 4)
        .msg(4, Msg::new().len(3, b"\xff\xfe"));
    assert_eq!(m.decode(), Ok(data(0, b"\xff\xfe")));
}

#[test]
fn groups_nest_up_to_the_recursion_limit() {
    // prost's budget: 100 levels at the top, one level fewer inside the
    // payload; a group whose innermost level has a field needs one more.
    let nested = |depth: u32, with_field: bool| {
        let mut m = Msg::new();
        for _ in 0..depth {
            m = m.key(15, 3);
        }
        if with_field {
            m = m.varint(1, 1);
        }
        for _ in 0..depth {
            m = m.key(15, 4);
        }
        m
    };
    let top = |inner: Msg| Msg::new().raw(&inner.0).varint(1, 6).decode();
    assert_eq!(top(nested(99, true)), Ok(Packet::Drain));
    assert_eq!(top(nested(100, true)), Err(Error::ProtoBadGroup));
    assert_eq!(top(nested(100, false)), Ok(Packet::Drain));
    assert_eq!(top(nested(101, false)), Err(Error::ProtoBadGroup));
    let sub = |inner: Msg| Msg::new().varint(1, 6).msg(8, inner).decode();
    assert_eq!(sub(nested(98, true)), Ok(Packet::Drain));
    assert_eq!(sub(nested(99, true)), Err(Error::ProtoBadGroup));
    assert_eq!(sub(nested(99, false)), Ok(Packet::Drain));
    assert_eq!(sub(nested(100, false)), Err(Error::ProtoBadGroup));
    // Hostile depth is cut off, not followed.
    assert_eq!(top(nested(100_000, false)), Err(Error::ProtoBadGroup));
}

// ----- Decoding: zero copy -----

#[test]
fn decoded_fields_point_into_the_input() {
    let p = Packet::Data {
        connect_id: 3,
        error: s("something broke"),
        data: Bytes::from(vec![7u8; 4096]),
    };
    let input = Bytes::from(encode(&p));
    let range = input.as_ptr_range();
    let Ok(Packet::Data { data, error, .. }) = Packet::decode(&input) else {
        panic!("not DATA");
    };
    assert_eq!(data.len(), 4096);
    assert!(range.contains(&data.as_ptr()), "payload was copied");
    assert!(data.as_ptr_range().end <= range.end);
    assert!(
        range.contains(&error.as_bytes().as_ptr()),
        "error string was copied"
    );

    let dial = Packet::DialReq {
        protocol: s("tcp"),
        address: s("10.1.2.3:22"),
        random: 1,
    };
    let input = Bytes::from(encode(&dial));
    let range = input.as_ptr_range();
    let Ok(Packet::DialReq {
        protocol, address, ..
    }) = Packet::decode(&input)
    else {
        panic!("not DIAL_REQ");
    };
    assert!(range.contains(&protocol.as_bytes().as_ptr()));
    assert!(range.contains(&address.as_bytes().as_ptr()));
}

// ----- Decoding: errors -----

#[test]
fn type_payload_mismatch() {
    let m = Msg::new().varint(1, 4).msg(2, Msg::new());
    assert_eq!(
        m.decode(),
        Err(Error::PacketTypeMismatch {
            ty: 4,
            payload_field: 2
        })
    );
    // Absent type is DIAL_REQ, which does not carry Data.
    let m = Msg::new().msg(4, Msg::new().len(3, b"x"));
    assert_eq!(
        m.decode(),
        Err(Error::PacketTypeMismatch {
            ty: 0,
            payload_field: 4
        })
    );
    // Every (type, member) pair other than the right one.
    for ty in PacketType::ALL.into_iter().chain(PacketType::EXTENSIONS) {
        for member in (2..=8).chain([100, 101, 104, 105]) {
            let m = Msg::new().varint(1, ty as u64).msg(member, Msg::new());
            let expected = if member == ty.payload_field() {
                Ok(ty)
            } else {
                Err(Error::PacketTypeMismatch {
                    ty: ty as i32,
                    payload_field: member,
                })
            };
            assert_eq!(m.decode().map(|p| p.ty()), expected, "{ty} with {member}");
        }
    }
}

#[test]
fn unknown_type() {
    assert_eq!(
        Msg::new().varint(1, 7).decode(),
        Err(Error::UnknownPacketType { ty: 7 })
    );
    // Also when a payload is present: the type is judged first.
    let m = Msg::new().varint(1, 99).msg(4, Msg::new());
    assert_eq!(m.decode(), Err(Error::UnknownPacketType { ty: 99 }));
    let m = Msg::new().varint(1, (-3i64) as u64);
    assert_eq!(m.decode(), Err(Error::UnknownPacketType { ty: -3 }));
}

#[test]
fn invalid_utf8_in_each_string_field() {
    let bad = b"ok\xc3";
    let cases = [(0, 2, 1), (0, 2, 2), (1, 3, 1), (3, 6, 1), (4, 4, 2)];
    for (ty, member, field) in cases {
        let m = Msg::new()
            .varint(1, ty)
            .msg(member, Msg::new().len(field, bad));
        assert_eq!(
            m.decode(),
            Err(Error::ProtoInvalidUtf8 { field }),
            "{member}.{field}"
        );
    }
    // Even when a later valid value would replace it (as in prost).
    let m = Msg::new().msg(2, Msg::new().len(1, b"\xff").len(1, b"tcp"));
    assert_eq!(m.decode(), Err(Error::ProtoInvalidUtf8 { field: 1 }));
    // And in a member that a later one replaces.
    let m = Msg::new()
        .varint(1, 4)
        .msg(2, Msg::new().len(2, b"\xff"))
        .msg(4, Msg::new());
    assert_eq!(m.decode(), Err(Error::ProtoInvalidUtf8 { field: 2 }));
}

#[test]
fn wrong_wire_type_for_known_fields() {
    let wrong = |field, wire_type| Err(Error::ProtoWrongWireType { field, wire_type });
    // `type` must be a varint.
    assert_eq!(Msg::new().len(1, b"\x04").decode(), wrong(1, 2));
    assert_eq!(Msg::new().fixed32(1).decode(), wrong(1, 5));
    assert_eq!(Msg::new().fixed64(1).decode(), wrong(1, 1));
    assert_eq!(Msg::new().key(1, 3).key(1, 4).decode(), wrong(1, 3));
    // Oneof members must be length-delimited.
    for member in (2..=8).chain([100, 101]) {
        assert_eq!(Msg::new().varint(member, 0).decode(), wrong(member, 0));
        assert_eq!(Msg::new().fixed32(member).decode(), wrong(member, 5));
        assert_eq!(
            Msg::new().key(member, 3).key(member, 4).decode(),
            wrong(member, 3)
        );
    }
    // Payload fields: int64 needs a varint, string/bytes a length.
    let inner = |ty: u64, member, m: Msg| Msg::new().varint(1, ty).msg(member, m).decode();
    assert_eq!(inner(4, 4, Msg::new().len(1, b"\x01")), wrong(1, 2));
    assert_eq!(inner(4, 4, Msg::new().varint(2, 1)), wrong(2, 0));
    assert_eq!(inner(4, 4, Msg::new().fixed64(3)), wrong(3, 1));
    assert_eq!(inner(0, 2, Msg::new().varint(1, 1)), wrong(1, 0));
    assert_eq!(inner(0, 2, Msg::new().fixed32(3)), wrong(3, 5));
    assert_eq!(inner(1, 3, Msg::new().len(2, b"")), wrong(2, 2));
    assert_eq!(inner(2, 5, Msg::new().fixed64(1)), wrong(1, 1));
    assert_eq!(inner(3, 6, Msg::new().varint(1, 0)), wrong(1, 0));
    assert_eq!(inner(5, 7, Msg::new().len(1, b"")), wrong(1, 2));
}

#[test]
fn truncated_input() {
    let full = encode(&Packet::DialReq {
        protocol: s("tcp"),
        address: s("a:1"),
        random: 300,
    });
    // Every proper prefix that ends inside a field is truncated. (Cutting
    // the outer message right after a complete field would be a valid,
    // shorter message; this one has a single outer field.)
    for cut in 1..full.len() {
        let m = Msg::new().raw(&full[..cut]);
        assert_eq!(m.decode(), Err(Error::ProtoTruncated), "cut at {cut}");
    }
    // An embedded length that runs past the end of its own message, though
    // not past the end of the buffer.
    let m = Msg::new()
        .msg(2, Msg::new().raw(&[0x0a, 0x05, b'a']))
        .varint(9, 0)
        .varint(9, 0);
    assert_eq!(m.decode(), Err(Error::ProtoTruncated));
    // A key alone, at both levels.
    assert_eq!(Msg::new().raw(&[0x08]).decode(), Err(Error::ProtoTruncated));
    assert_eq!(
        Msg::new().msg(2, Msg::new().raw(&[0x18])).decode(),
        Err(Error::ProtoTruncated)
    );
    // Fixed-width unknowns cut short.
    assert_eq!(
        Msg::new().key(9, 1).raw(&[0; 7]).decode(),
        Err(Error::ProtoTruncated)
    );
    assert_eq!(
        Msg::new().key(9, 5).raw(&[0; 3]).decode(),
        Err(Error::ProtoTruncated)
    );
    // A group that never closes.
    assert_eq!(
        Msg::new().key(9, 3).varint(1, 1).decode(),
        Err(Error::ProtoTruncated)
    );
    // A length of 2^64 - 1.
    let huge = Msg::new()
        .key(2, 2)
        .raw(&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 1]);
    assert_eq!(huge.decode(), Err(Error::ProtoTruncated));
}

#[test]
fn varint_overflow() {
    let eleven = [0xff; 11];
    assert_eq!(
        Msg::new().raw(&eleven).decode(),
        Err(Error::ProtoVarintOverflow)
    );
    assert_eq!(
        Msg::new().key(1, 0).raw(&eleven).decode(),
        Err(Error::ProtoVarintOverflow)
    );
    let mut ten = [0xff; 10];
    ten[9] = 0x02;
    let m = Msg::new()
        .varint(1, 4)
        .msg(4, Msg::new().key(1, 0).raw(&ten));
    assert_eq!(m.decode(), Err(Error::ProtoVarintOverflow));
    // As a length.
    assert_eq!(
        Msg::new().key(4, 2).raw(&ten).decode(),
        Err(Error::ProtoVarintOverflow)
    );
}

#[test]
fn invalid_tags() {
    let invalid = |tag| Err(Error::ProtoInvalidTag { tag });
    assert_eq!(Msg::new().raw(&[0x00]).decode(), invalid(0));
    assert_eq!(Msg::new().raw(&[0x02, 0x00]).decode(), invalid(2));
    assert_eq!(Msg::new().raw(&[0x0e]).decode(), invalid(0x0e));
    assert_eq!(Msg::new().raw(&[0x0f]).decode(), invalid(0x0f));
    assert_eq!(
        Msg::new().raw(&[0x80, 0x80, 0x80, 0x80, 0x10]).decode(),
        invalid(1 << 32)
    );
    // Inside the payload, and inside a group.
    assert_eq!(
        Msg::new().msg(2, Msg::new().raw(&[0x1e])).decode(),
        invalid(0x1e)
    );
    assert_eq!(Msg::new().key(9, 3).raw(&[0x07]).decode(), invalid(7));
}

#[test]
fn unbalanced_groups() {
    assert_eq!(Msg::new().key(9, 4).decode(), Err(Error::ProtoBadGroup));
    assert_eq!(
        Msg::new().key(9, 3).key(10, 4).decode(),
        Err(Error::ProtoBadGroup)
    );
    let m = Msg::new().key(9, 3).key(10, 3).key(9, 4).key(10, 4);
    assert_eq!(m.decode(), Err(Error::ProtoBadGroup));
    let m = Msg::new().msg(2, Msg::new().key(4, 4));
    assert_eq!(m.decode(), Err(Error::ProtoBadGroup));
    // A group may not straddle the end of the payload message.
    let m = Msg::new().msg(2, Msg::new().key(4, 3)).key(4, 4);
    assert_eq!(m.decode(), Err(Error::ProtoTruncated));
}

#[test]
fn decode_errors_are_grpc_internal() {
    let errors = [
        Msg::new().raw(&[0x08]).decode(),
        Msg::new().raw(&[0xff; 11]).decode(),
        Msg::new().raw(&[0x00]).decode(),
        Msg::new().len(1, b"").decode(),
        Msg::new().key(9, 4).decode(),
        Msg::new().msg(2, Msg::new().len(1, b"\xff")).decode(),
        Msg::new().varint(1, 7).decode(),
        Msg::new().varint(1, 4).msg(2, Msg::new()).decode(),
    ];
    let mut seen = Vec::new();
    for e in errors {
        let e = e.expect_err("malformed");
        assert_eq!(e.grpc_status(), GrpcStatus::INTERNAL, "{e}");
        assert_eq!(e.h2(), None);
        seen.push(core::mem::discriminant(&e));
    }
    seen.dedup();
    assert_eq!(seen.len(), 8, "one of each variant");
}

#[test]
fn decode_of_encode_round_trips_and_reencodes_identically() {
    let p = Packet::CloseRsp {
        error: s("connection reset"),
        connect_id: i64::MIN,
    };
    let bytes = Bytes::from(encode(&p));
    let q = Packet::decode(&bytes).unwrap();
    assert_eq!(q, p);
    let mut again = BytesMut::new();
    again.put_slice(&encode(&q));
    assert_eq!(&again[..], &bytes[..]);
}
