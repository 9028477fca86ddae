//! `konn_frames::packet` against prost, the reference protobuf implementation.
//!
//! The prost types are generated from `proto/client.proto` with protox and
//! prost-build (no `protoc` needed) and checked in as `oracle/konnectivity.rs`;
//! [`oracle_is_up_to_date`] regenerates them and fails if they differ, so the
//! oracle cannot drift from the proto. Run with `KONN_BLESS=1` to rewrite the
//! checked-in file (and the fuzz seeds) instead.
//!
//! konn's flow-control extension (`PAUSE`/`RESUME`, type and oneof member
//! 100/101) is checked against a second oracle, `oracle/konnectivity_flow.rs`,
//! generated from `oracle/konn_flow.proto`: client.proto plus marked lines
//! ([`flow_proto_is_client_proto_plus_the_extension`]). It is a superset of
//! the upstream oracle, so every comparison below uses it; the upstream
//! oracle checks that both agree on upstream's packets and what an upstream
//! decoder makes of an extension packet.
//!
//! What is checked:
//! - encoding is byte-identical to prost for edge values and random packets;
//! - decoding prost's bytes gives the packet back, and decode∘encode = id;
//! - on arbitrary field sequences and arbitrary bytes, the decoder accepts
//!   exactly what prost accepts, with the same result, except for the two
//!   documented extra checks (`type` known, and matching the payload).

use std::path::{Path, PathBuf};

use bytes::Bytes;
use konn_frames::Error;
use konn_frames::packet::{
    ByteStr, MAX_DATA_PAYLOAD, Packet, PacketType, data_header_len, encode_data_header,
};
use proptest::collection::vec;
use proptest::prelude::*;
use prost::Message as _;

#[allow(
    missing_docs,
    unreachable_pub,
    clippy::all,
    clippy::pedantic,
    clippy::use_self
)]
mod oracle {
    include!("oracle/konnectivity_flow.rs");
}

#[allow(
    missing_docs,
    unreachable_pub,
    clippy::all,
    clippy::pedantic,
    clippy::use_self
)]
mod oracle_upstream {
    include!("oracle/konnectivity.rs");
}

use oracle::packet::Payload;

// ----- Conversions between our packets and prost's -----

fn to_prost(p: &Packet) -> oracle::Packet {
    let payload = match p.clone() {
        Packet::DialReq {
            protocol,
            address,
            random,
        } => Payload::DialRequest(oracle::DialRequest {
            protocol: protocol.to_string(),
            address: address.to_string(),
            random,
        }),
        Packet::DialRsp {
            error,
            connect_id,
            random,
        } => Payload::DialResponse(oracle::DialResponse {
            error: error.to_string(),
            connect_id,
            random,
        }),
        Packet::CloseReq { connect_id } => {
            Payload::CloseRequest(oracle::CloseRequest { connect_id })
        }
        Packet::CloseRsp { error, connect_id } => Payload::CloseResponse(oracle::CloseResponse {
            error: error.to_string(),
            connect_id,
        }),
        Packet::Data {
            connect_id,
            error,
            data,
        } => Payload::Data(oracle::Data {
            connect_id,
            error: error.to_string(),
            data,
        }),
        Packet::DialCls { random } => Payload::CloseDial(oracle::CloseDial { random }),
        Packet::Drain => Payload::Drain(oracle::Drain {}),
        Packet::Pause { connect_id } => Payload::Pause(oracle::Pause { connect_id }),
        Packet::Resume { connect_id } => Payload::Resume(oracle::Resume { connect_id }),
        Packet::ReverseDialReq {
            protocol,
            address,
            random,
        } => Payload::ReverseDialRequest(oracle::DialRequest {
            protocol: protocol.to_string(),
            address: address.to_string(),
            random,
        }),
        Packet::ReverseDialRsp {
            error,
            connect_id,
            random,
        } => Payload::ReverseDialResponse(oracle::DialResponse {
            error: error.to_string(),
            connect_id,
            random,
        }),
        Packet::Ack { connect_id, offset } => Payload::Ack(oracle::Ack { connect_id, offset }),
        Packet::Resumed => Payload::Resumed(oracle::Resumed {}),
    };
    oracle::Packet {
        r#type: p.ty().into(),
        payload: Some(payload),
    }
}

/// What our decoder must return for bytes that prost decodes to `m`: the
/// same packet, unless `type` is unknown or names another payload.
fn expected(m: &oracle::Packet) -> Result<Packet, Error> {
    let ty = PacketType::try_from(m.r#type)?;
    let s = |v: &str| ByteStr::from(v.to_owned());
    let Some(payload) = &m.payload else {
        return Ok(default_packet(ty));
    };
    let (field, packet) = match payload.clone() {
        Payload::DialRequest(d) => (
            2,
            Packet::DialReq {
                protocol: s(&d.protocol),
                address: s(&d.address),
                random: d.random,
            },
        ),
        Payload::DialResponse(d) => (
            3,
            Packet::DialRsp {
                error: s(&d.error),
                connect_id: d.connect_id,
                random: d.random,
            },
        ),
        Payload::Data(d) => (
            4,
            Packet::Data {
                connect_id: d.connect_id,
                error: s(&d.error),
                data: d.data,
            },
        ),
        Payload::CloseRequest(d) => (
            5,
            Packet::CloseReq {
                connect_id: d.connect_id,
            },
        ),
        Payload::CloseResponse(d) => (
            6,
            Packet::CloseRsp {
                error: s(&d.error),
                connect_id: d.connect_id,
            },
        ),
        Payload::CloseDial(d) => (7, Packet::DialCls { random: d.random }),
        Payload::Drain(_) => (8, Packet::Drain),
        Payload::Pause(d) => (
            100,
            Packet::Pause {
                connect_id: d.connect_id,
            },
        ),
        Payload::Resume(d) => (
            101,
            Packet::Resume {
                connect_id: d.connect_id,
            },
        ),
        Payload::ReverseDialRequest(d) => (
            102,
            Packet::ReverseDialReq {
                protocol: s(&d.protocol),
                address: s(&d.address),
                random: d.random,
            },
        ),
        Payload::ReverseDialResponse(d) => (
            103,
            Packet::ReverseDialRsp {
                error: s(&d.error),
                connect_id: d.connect_id,
                random: d.random,
            },
        ),
        Payload::Ack(d) => (
            104,
            Packet::Ack {
                connect_id: d.connect_id,
                offset: d.offset,
            },
        ),
        Payload::Resumed(_) => (105, Packet::Resumed),
    };
    if packet.ty() == ty {
        Ok(packet)
    } else {
        Err(Error::PacketTypeMismatch {
            ty: m.r#type,
            payload_field: field,
        })
    }
}

fn default_packet(ty: PacketType) -> Packet {
    match ty {
        PacketType::DialReq => Packet::DialReq {
            protocol: ByteStr::new(),
            address: ByteStr::new(),
            random: 0,
        },
        PacketType::DialRsp => Packet::DialRsp {
            error: ByteStr::new(),
            connect_id: 0,
            random: 0,
        },
        PacketType::CloseReq => Packet::CloseReq { connect_id: 0 },
        PacketType::CloseRsp => Packet::CloseRsp {
            error: ByteStr::new(),
            connect_id: 0,
        },
        PacketType::Data => Packet::Data {
            connect_id: 0,
            error: ByteStr::new(),
            data: Bytes::new(),
        },
        PacketType::DialCls => Packet::DialCls { random: 0 },
        PacketType::Drain => Packet::Drain,
        PacketType::Pause => Packet::Pause { connect_id: 0 },
        PacketType::Resume => Packet::Resume { connect_id: 0 },
        PacketType::ReverseDialReq => Packet::ReverseDialReq {
            protocol: ByteStr::new(),
            address: ByteStr::new(),
            random: 0,
        },
        PacketType::ReverseDialRsp => Packet::ReverseDialRsp {
            error: ByteStr::new(),
            connect_id: 0,
            random: 0,
        },
        PacketType::Ack => Packet::Ack {
            connect_id: 0,
            offset: 0,
        },
        PacketType::Resumed => Packet::Resumed,
    }
}

fn ours(p: &Packet) -> Vec<u8> {
    let mut out = Vec::new();
    p.encode(&mut out);
    out
}

/// Checks everything about one packet against prost.
fn check_against_prost(p: &Packet) {
    let m = to_prost(p);
    let theirs = m.encode_to_vec();
    assert_eq!(ours(p), theirs, "encoding of {p:?}");
    assert_eq!(p.encoded_len(), m.encoded_len(), "encoded_len of {p:?}");
    let mut grpc = Vec::new();
    p.encode_grpc(&mut grpc);
    assert_eq!(grpc[0], 0);
    assert_eq!(grpc[1..5], (theirs.len() as u32).to_be_bytes());
    assert_eq!(grpc[5..], theirs[..]);
    let decoded = Packet::decode(&Bytes::from(theirs)).expect("prost's encoding decodes");
    assert_eq!(&decoded, p);
}

// ----- The oracle itself -----

fn manifest_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn bless() -> bool {
    std::env::var_os("KONN_BLESS").is_some_and(|v| v == "1")
}

/// Generates the prost types of `proto` (found in `include`) into a fresh
/// directory and returns them.
fn generate(proto: &str, include: &Path, tag: &str) -> String {
    let out_dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(tag);
    std::fs::create_dir_all(&out_dir).unwrap();
    let fds = protox::compile([proto], [include]).expect("the proto compiles");
    prost_build::Config::new()
        .out_dir(&out_dir)
        // `Data.data` as `Bytes`, like ours: a fair benchmark and no copies.
        .bytes(["."])
        .compile_fds(fds)
        .expect("prost-build generates");
    // The proto has no `package`, so prost-build names the file `_.rs`.
    std::fs::read_to_string(out_dir.join("_.rs")).unwrap()
}

/// Fails unless the checked-in `oracle/{name}` is `generated` (or rewrites it
/// under `KONN_BLESS=1`).
fn check_checked_in(name: &str, generated: &str) {
    let checked_in_path = manifest_dir().join("tests/oracle").join(name);
    if bless() {
        std::fs::write(&checked_in_path, generated).unwrap();
    }
    let checked_in = std::fs::read_to_string(&checked_in_path).unwrap();
    assert!(
        generated == checked_in,
        "tests/oracle/{name} is stale; rerun with KONN_BLESS=1:\n{generated}"
    );
}

#[test]
fn oracle_is_up_to_date() {
    let proto_dir = manifest_dir().join("../proto");
    let generated = generate("client.proto", &proto_dir, "packet-oracle");
    check_checked_in("konnectivity.rs", &generated);
    let oracle_dir = manifest_dir().join("tests/oracle");
    let generated = generate("konn_flow.proto", &oracle_dir, "packet-oracle-flow");
    check_checked_in("konnectivity_flow.rs", &generated);
}

/// The extension's schema cannot drift from upstream's: without its marked
/// lines it is client.proto, byte for byte.
#[test]
fn flow_proto_is_client_proto_plus_the_extension() {
    let flow =
        std::fs::read_to_string(manifest_dir().join("tests/oracle/konn_flow.proto")).unwrap();
    let upstream = std::fs::read_to_string(manifest_dir().join("../proto/client.proto")).unwrap();
    let stripped: Vec<&str> = flow
        .split('\n')
        .filter(|l| !l.contains("// konn-flow-control"))
        .collect();
    assert_eq!(stripped.join("\n"), upstream);
    for needle in [
        "PAUSE = 100;",
        "RESUME = 101;",
        "Pause pause = 100;",
        "Resume resume = 101;",
        "message Pause { int64 connectID = 1; }",
        "message Resume { int64 connectID = 1; }",
        "REVERSE_DIAL_REQ = 102;",
        "REVERSE_DIAL_RSP = 103;",
        "DialRequest reverseDialRequest = 102;",
        "DialResponse reverseDialResponse = 103;",
        "ACK = 104;",
        "RESUMED = 105;",
        "Ack ack = 104;",
        "Resumed resumed = 105;",
        "message Ack { int64 connectID = 1; int64 offset = 2; }",
        "message Resumed {}",
    ] {
        assert!(flow.contains(needle), "{needle}");
    }
}

/// Both oracles agree on upstream's packets, so comparing with the
/// extended one loses nothing.
#[test]
fn extended_oracle_encodes_upstream_packets_like_upstream() {
    for (_, p) in seed_packets() {
        if p.ty().is_extension() {
            continue;
        }
        let ours = to_prost(&p).encode_to_vec();
        let theirs = oracle_upstream::Packet::decode(&ours[..]).expect("upstream decodes");
        assert_eq!(theirs.encode_to_vec(), ours, "{p:?}");
    }
}

/// What a Go peer would make of PAUSE if it ever got one: an unknown
/// `type` value (protobuf enums are open) and no payload — the extension
/// fields are skipped as unknown. konn never sends it un-negotiated.
#[test]
fn upstream_decoder_skips_the_extension() {
    for p in [
        Packet::Pause { connect_id: 7 },
        Packet::Resume { connect_id: -7 },
        Packet::ReverseDialReq {
            protocol: ByteStr::from_static("tcp"),
            address: ByteStr::from_static("10.0.0.10:6443"),
            random: 5,
        },
        Packet::ReverseDialRsp {
            error: ByteStr::new(),
            connect_id: -1,
            random: 5,
        },
        Packet::Ack {
            connect_id: 7,
            offset: 1 << 20,
        },
        Packet::Resumed,
    ] {
        let m = oracle_upstream::Packet::decode(&ours(&p)[..]).expect("decodes");
        assert_eq!(m.r#type, i32::from(p.ty()));
        assert_eq!(m.payload, None, "{p:?}");
    }
}

// ----- Fuzz seeds: one prost encoding per packet type -----

fn seed_packets() -> Vec<(&'static str, Packet)> {
    let s = ByteStr::from_static;
    vec![
        (
            "dial-req",
            Packet::DialReq {
                protocol: s("tcp"),
                address: s("10.0.0.5:10250"),
                random: 8_812_345,
            },
        ),
        (
            "dial-rsp",
            Packet::DialRsp {
                error: s(""),
                connect_id: 1,
                random: 8_812_345,
            },
        ),
        ("close-req", Packet::CloseReq { connect_id: 1 }),
        (
            "close-rsp",
            Packet::CloseRsp {
                error: s("connection reset"),
                connect_id: 1,
            },
        ),
        (
            "data",
            Packet::Data {
                connect_id: -2,
                error: s(""),
                data: Bytes::from_static(b"GET / HTTP/1.1\r\n\r\n"),
            },
        ),
        ("dial-cls", Packet::DialCls { random: -8_812_345 }),
        ("drain", Packet::Drain),
        ("pause", Packet::Pause { connect_id: 3 }),
        ("resume", Packet::Resume { connect_id: 3 }),
        (
            "reverse-dial-req",
            Packet::ReverseDialReq {
                protocol: s("tcp"),
                address: s("10.0.0.10:6443"),
                random: 77,
            },
        ),
        (
            "reverse-dial-rsp",
            Packet::ReverseDialRsp {
                error: s(""),
                connect_id: -1,
                random: 77,
            },
        ),
        (
            "ack",
            Packet::Ack {
                connect_id: 3,
                offset: 65_536,
            },
        ),
        ("resumed", Packet::Resumed),
    ]
}

#[test]
fn fuzz_seeds_are_prost_encodings() {
    let dir = manifest_dir().join("../fuzz/seeds/packet");
    for (name, packet) in seed_packets() {
        let bytes = to_prost(&packet).encode_to_vec();
        let path = dir.join(format!("seed-{name}"));
        if bless() {
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(&path, &bytes).unwrap();
        }
        let seed = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert_eq!(seed, bytes, "{name}: stale seed; rerun with KONN_BLESS=1");
        assert_eq!(Packet::decode(&Bytes::from(seed)), Ok(packet));
    }
}

// ----- Byte equality on edge values -----

const INTS: [i64; 9] = [0, 1, -1, 127, 128, 300, i64::MIN, i64::MAX, i64::MIN + 1];

fn strings() -> Vec<String> {
    vec![
        String::new(),
        "a".into(),
        "tcp".into(),
        "ünïcödé ✓".into(),
        "x".repeat(127),
        "y".repeat(128),
        "z".repeat(20_000),
    ]
}

fn payloads() -> Vec<Bytes> {
    [
        0,
        1,
        127,
        128,
        4096,
        16_383,
        16_384,
        MAX_DATA_PAYLOAD,
        2_097_152,
    ]
    .into_iter()
    .map(|n| Bytes::from((0..n).map(|i| i as u8).collect::<Vec<u8>>()))
    .collect()
}

#[test]
fn edge_values_encode_like_prost() {
    let strs: Vec<ByteStr> = strings().into_iter().map(ByteStr::from).collect();
    check_against_prost(&Packet::Drain);
    check_against_prost(&Packet::Resumed);
    for &a in &INTS {
        for &b in &INTS {
            check_against_prost(&Packet::Ack {
                connect_id: a,
                offset: b,
            });
        }
        check_against_prost(&Packet::CloseReq { connect_id: a });
        check_against_prost(&Packet::DialCls { random: a });
        check_against_prost(&Packet::Pause { connect_id: a });
        check_against_prost(&Packet::Resume { connect_id: a });
        for s in &strs {
            check_against_prost(&Packet::CloseRsp {
                error: s.clone(),
                connect_id: a,
            });
            for &b in &INTS {
                check_against_prost(&Packet::DialRsp {
                    error: s.clone(),
                    connect_id: a,
                    random: b,
                });
            }
            for t in &strs {
                check_against_prost(&Packet::DialReq {
                    protocol: s.clone(),
                    address: t.clone(),
                    random: a,
                });
            }
            for data in payloads() {
                check_against_prost(&Packet::Data {
                    connect_id: a,
                    error: s.clone(),
                    data,
                });
            }
        }
    }
}

#[test]
fn data_header_plus_payload_is_prosts_message() {
    for &connect_id in &INTS {
        for data in payloads() {
            let m = to_prost(&Packet::Data {
                connect_id,
                error: ByteStr::new(),
                data: data.clone(),
            });
            let theirs = m.encode_to_vec();
            let mut out = Vec::new();
            encode_data_header(connect_id, data.len(), &mut out);
            assert_eq!(out.len(), data_header_len(connect_id, data.len()));
            assert_eq!(
                out[..5],
                [&[0u8][..], &(theirs.len() as u32).to_be_bytes()].concat()[..]
            );
            out.extend_from_slice(&data);
            assert_eq!(
                out[5..],
                theirs[..],
                "connect_id {connect_id}, {} bytes",
                data.len()
            );
        }
    }
}

// ----- Random packets -----

fn any_i64() -> impl Strategy<Value = i64> {
    prop_oneof![
        3 => any::<i64>(),
        2 => prop::sample::select(INTS.to_vec()),
        1 => 0i64..300,
    ]
}

fn any_string() -> impl Strategy<Value = ByteStr> {
    prop_oneof![
        Just(String::new()),
        "[a-z0-9.:\\[\\]-]{1,40}",
        any::<String>(),
        (100usize..300).prop_map(|n| "é".repeat(n)),
    ]
    .prop_map(ByteStr::from)
}

fn any_bytes() -> impl Strategy<Value = Bytes> {
    prop_oneof![
        4 => vec(any::<u8>(), 0..300),
        1 => (16_000usize..17_000).prop_map(|n| vec![0xa5; n]),
    ]
    .prop_map(Bytes::from)
}

fn any_packet() -> impl Strategy<Value = Packet> {
    prop_oneof![
        (any_string(), any_string(), any_i64()).prop_map(|(protocol, address, random)| {
            Packet::DialReq {
                protocol,
                address,
                random,
            }
        }),
        (any_string(), any_i64(), any_i64()).prop_map(|(error, connect_id, random)| {
            Packet::DialRsp {
                error,
                connect_id,
                random,
            }
        }),
        any_i64().prop_map(|connect_id| Packet::CloseReq { connect_id }),
        (any_string(), any_i64())
            .prop_map(|(error, connect_id)| Packet::CloseRsp { error, connect_id }),
        (any_i64(), any_string(), any_bytes()).prop_map(|(connect_id, error, data)| Packet::Data {
            connect_id,
            error,
            data
        }),
        any_i64().prop_map(|random| Packet::DialCls { random }),
        Just(Packet::Drain),
        any_i64().prop_map(|connect_id| Packet::Pause { connect_id }),
        any_i64().prop_map(|connect_id| Packet::Resume { connect_id }),
        (any_string(), any_string(), any_i64()).prop_map(|(protocol, address, random)| {
            Packet::ReverseDialReq {
                protocol,
                address,
                random,
            }
        }),
        (any_string(), any_i64(), any_i64()).prop_map(|(error, connect_id, random)| {
            Packet::ReverseDialRsp {
                error,
                connect_id,
                random,
            }
        }),
        (any_i64(), any_i64()).prop_map(|(connect_id, offset)| Packet::Ack { connect_id, offset }),
        Just(Packet::Resumed),
    ]
}

/// Any prost message, including ones our decoder refuses (unknown `type`,
/// mismatched or missing payload).
fn any_prost_message() -> impl Strategy<Value = oracle::Packet> {
    let ty = prop_oneof![4 => 0i32..7, 1 => 100i32..106, 1 => any::<i32>()];
    let payload = prop_oneof![
        1 => Just(None),
        6 => any_packet().prop_map(|p| to_prost(&p).payload),
    ];
    (ty, payload).prop_map(|(r#type, payload)| oracle::Packet { r#type, payload })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn random_packets_encode_like_prost(p in any_packet()) {
        let m = to_prost(&p);
        prop_assert_eq!(ours(&p), m.encode_to_vec());
        prop_assert_eq!(p.encoded_len(), m.encoded_len());
    }

    #[test]
    fn prost_encodings_decode_to_the_packet(p in any_packet()) {
        let bytes = Bytes::from(to_prost(&p).encode_to_vec());
        prop_assert_eq!(Packet::decode(&bytes), Ok(p));
    }

    #[test]
    fn decode_inverts_encode(p in any_packet()) {
        let bytes = Bytes::from(ours(&p));
        prop_assert_eq!(Packet::decode(&bytes), Ok(p));
    }

    #[test]
    fn any_prost_message_decodes_as_expected(m in any_prost_message()) {
        let bytes = Bytes::from(m.encode_to_vec());
        prop_assert_eq!(Packet::decode(&bytes), expected(&m));
    }

    #[test]
    fn data_header_matches_prost(connect_id in any_i64(), len in 0usize..70_000) {
        let data = Bytes::from(vec![1u8; len]);
        let theirs = to_prost(&Packet::Data { connect_id, error: ByteStr::new(), data }).encode_to_vec();
        let mut out = Vec::new();
        encode_data_header(connect_id, len, &mut out);
        prop_assert_eq!(out.len(), data_header_len(connect_id, len));
        prop_assert_eq!(&out[5..], &theirs[..theirs.len() - len]);
        prop_assert_eq!(&out[1..5], &(theirs.len() as u32).to_be_bytes()[..]);
    }
}

// ----- Differential acceptance on arbitrary input -----

/// A field as it may appear on the wire, conforming or not.
#[derive(Clone, Debug)]
enum WireField {
    /// Varint field, optionally padded to a non-minimal encoding.
    Varint {
        field: u32,
        value: u64,
        pad: bool,
    },
    Fixed32(u32),
    Fixed64(u32),
    /// Length-delimited field with raw contents (UTF-8 or not).
    Len(u32, Vec<u8>),
    /// Length-delimited field holding an embedded message.
    Message(u32, Vec<Self>),
    /// A group, closed by `close` (normally the same field number).
    Group {
        field: u32,
        close: u32,
        inner: Vec<Self>,
    },
    /// Arbitrary bytes, most likely malformed.
    Junk(Vec<u8>),
}

fn put_varint(out: &mut Vec<u8>, mut v: u64, pad: bool) {
    let start = out.len();
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
    if pad && out.len() - start < 10 {
        *out.last_mut().unwrap() |= 0x80;
        out.push(0);
    }
}

fn put_key(out: &mut Vec<u8>, field: u32, wire_type: u8) {
    put_varint(out, u64::from(field) << 3 | u64::from(wire_type), false);
}

fn serialize(fields: &[WireField], out: &mut Vec<u8>) {
    for f in fields {
        match f {
            WireField::Varint { field, value, pad } => {
                put_key(out, *field, 0);
                put_varint(out, *value, *pad);
            }
            WireField::Fixed32(field) => {
                put_key(out, *field, 5);
                out.extend_from_slice(&[0xde, 0xad, 0xbe, 0xef]);
            }
            WireField::Fixed64(field) => {
                put_key(out, *field, 1);
                out.extend_from_slice(&[1, 2, 3, 4, 5, 6, 7, 8]);
            }
            WireField::Len(field, contents) => {
                put_key(out, *field, 2);
                put_varint(out, contents.len() as u64, false);
                out.extend_from_slice(contents);
            }
            WireField::Message(field, inner) => {
                let mut body = Vec::new();
                serialize(inner, &mut body);
                put_key(out, *field, 2);
                put_varint(out, body.len() as u64, false);
                out.extend_from_slice(&body);
            }
            WireField::Group {
                field,
                close,
                inner,
            } => {
                put_key(out, *field, 3);
                serialize(inner, out);
                put_key(out, *close, 4);
            }
            WireField::Junk(bytes) => out.extend_from_slice(bytes),
        }
    }
}

fn any_field_number() -> impl Strategy<Value = u32> {
    prop_oneof![
        8 => 1u32..=9,
        1 => 10u32..100,
        1 => 100u32..=102,
        1 => Just((1 << 29) - 1)
    ]
}

fn any_wire_field() -> impl Strategy<Value = WireField> {
    let contents = prop_oneof![
        Just(b"tcp".to_vec()),
        Just("ü".as_bytes().to_vec()),
        Just(b"\xff\xfe".to_vec()),
        vec(any::<u8>(), 0..8),
    ];
    let value = prop_oneof![0u64..8, any::<u64>(), Just(u64::MAX)];
    let leaf = prop_oneof![
        6 => (any_field_number(), value, any::<bool>())
            .prop_map(|(field, value, pad)| WireField::Varint { field, value, pad }),
        1 => any_field_number().prop_map(WireField::Fixed32),
        1 => any_field_number().prop_map(WireField::Fixed64),
        4 => (any_field_number(), contents).prop_map(|(f, c)| WireField::Len(f, c)),
        1 => vec(any::<u8>(), 1..4).prop_map(WireField::Junk),
    ];
    leaf.prop_recursive(3, 24, 6, |inner| {
        prop_oneof![
            4 => (any_field_number(), vec(inner.clone(), 0..6))
                .prop_map(|(field, fields)| WireField::Message(field, fields)),
            1 => (any_field_number(), prop_oneof![9 => Just(None), 1 => any_field_number().prop_map(Some)],
                  vec(inner, 0..3))
                .prop_map(|(field, close, inner)| WireField::Group { field, close: close.unwrap_or(field), inner }),
        ]
    })
}

/// An occurrence of a oneof member whose fields mostly have the right wire
/// type, so that merging is exercised on packets that decode.
fn any_member() -> impl Strategy<Value = WireField> {
    let inner = prop_oneof![
        (1u32..=4, any_i64(), any::<bool>()).prop_map(|(field, v, pad)| WireField::Varint {
            field,
            value: v as u64,
            pad
        }),
        (
            1u32..=4,
            prop_oneof![
                Just(b"".to_vec()),
                Just(b"tcp".to_vec()),
                vec(b'a'..=b'z', 1..5)
            ]
        )
            .prop_map(|(field, c)| WireField::Len(field, c)),
    ];
    let member = prop_oneof![7 => 2u32..=8, 1 => 100u32..=105];
    (member, vec(inner, 0..5)).prop_map(|(member, fields)| WireField::Message(member, fields))
}

/// The `type` value that goes with oneof member `member`.
fn type_of_member(member: u32) -> u64 {
    match member {
        100..=105 => u64::from(member),
        _ => [0, 1, 4, 2, 3, 5, 6][member as usize - 2],
    }
}

/// Decodes with both and checks that they agree.
fn differential(bytes: &[u8]) -> Result<(), TestCaseError> {
    let buf = Bytes::copy_from_slice(bytes);
    let ours = Packet::decode(&buf);
    match oracle::Packet::decode(buf.clone()) {
        Ok(m) => prop_assert_eq!(ours, expected(&m), "prost decoded {:?}", m),
        Err(e) => prop_assert!(
            ours.is_err(),
            "prost refused ({}), we accepted {:?}",
            e,
            ours
        ),
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4096))]

    #[test]
    fn accepts_what_prost_accepts(fields in vec(any_wire_field(), 0..8), cut in any::<Option<prop::sample::Index>>()) {
        let mut bytes = Vec::new();
        serialize(&fields, &mut bytes);
        if let Some(cut) = cut {
            bytes.truncate(cut.index(bytes.len() + 1));
        }
        differential(&bytes)?;
    }

    #[test]
    fn oneof_merging_like_prost(
        members in vec(any_member(), 1..5),
        type_at in any::<prop::sample::Index>(),
        right_type in prop::bool::weighted(0.9),
    ) {
        let WireField::Message(last, _) = members[members.len() - 1] else { unreachable!() };
        let value = if right_type { type_of_member(last) } else { 4 };
        let mut fields = members;
        let at = type_at.index(fields.len() + 1);
        fields.insert(at, WireField::Varint { field: 1, value, pad: false });
        let mut bytes = Vec::new();
        serialize(&fields, &mut bytes);
        differential(&bytes)?;
    }

    #[test]
    fn random_bytes_like_prost(bytes in vec(any::<u8>(), 0..64)) {
        differential(&bytes)?;
    }

    #[test]
    fn mutated_packets_like_prost(p in any_packet(), at in any::<prop::sample::Index>(), byte in any::<u8>()) {
        let mut bytes = ours(&p);
        if !bytes.is_empty() {
            let i = at.index(bytes.len());
            bytes[i] = byte;
        }
        differential(&bytes)?;
    }
}
