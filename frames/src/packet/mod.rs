//! The Konnectivity `Packet` message (`proto/client.proto`), hand-rolled.
//!
//! Every byte a tunnel carries travels inside a `Packet`, so this codec is on
//! the hot path and is written to do no work it does not have to:
//!
//! - **Decoding is zero-copy.** [`Packet::decode`] takes the gRPC message body
//!   as [`Bytes`] and returns string and bytes fields as slices of it
//!   ([`ByteStr`], `Bytes`), so it does not allocate. The DATA payload handed
//!   to a socket write is the very memory the frame was received into.
//! - **Encoding is prost-identical.** [`Packet::encode`] produces exactly the
//!   bytes prost produces: fields in ascending number order, default scalars
//!   and empty strings left out, the oneof message always present even when
//!   empty, `type` left out when it is `DIAL_REQ` (0).
//! - **DATA headers without a copy.** [`encode_data_header`] writes the 5-byte
//!   gRPC prefix plus everything of a DATA packet that precedes its payload, so
//!   a driver can append the payload straight after (or hand it to a vectored
//!   write) instead of assembling the message in a scratch buffer.
//!
//! The message is small and fixed, so the decoder is a single non-generic pass
//! that records *where* fields are (the `wire` submodule) and builds the packet
//! at the end; the encoder lists each variant's fields once (`Field`) and
//! derives both the length and the bytes from that list.
//!
//! ## What the decoder accepts
//!
//! Anything a conforming proto3 encoder can emit for this schema, with prost
//! 0.14's rules for everything else (the tests compare with prost on random
//! input):
//!
//! - fields in any order; unknown fields of every wire type skipped at both
//!   levels; groups nested up to prost's recursion limit of 100;
//! - a scalar or string field repeated: the last value wins;
//! - a oneof member repeated: merged (its fields from later occurrences win);
//!   a *different* member replaces the earlier one entirely;
//! - non-minimal varints, and negative `int64`s as 10-byte varints; `type` is
//!   an `int32`, so a varint wider than 32 bits is truncated, as in prost and
//!   protobuf-go;
//! - `type` absent means `DIAL_REQ`; a missing payload means the payload's
//!   defaults (upstream's Go getters are nil-safe, so e.g. a DRAIN without a
//!   `drain` message is an ordinary drain).
//!
//! Deliberate differences:
//!
//! - konn's flow-control extension: `type` 100 (`PAUSE`) and 101 (`RESUME`)
//!   with the oneof members 100 (`pause`) and 101 (`resume`), each a message
//!   `{ int64 connectID = 1; }` (see [`Packet::Pause`]). An upstream decoder
//!   skips fields 100/101 as unknown and rejects nothing; konn decodes them.
//!   They are only ever sent to a peer that negotiated them
//!   (docs/design/tunnel.md, "Flow control").
//! - konn's node-to-control-plane extension (KEP-2025): `type` 102
//!   (`REVERSE_DIAL_REQ`) and 103 (`REVERSE_DIAL_RSP`) with the oneof members
//!   102 and 103, shaped like `DialRequest` and `DialResponse` (see
//!   [`Packet::ReverseDialReq`]). Only sent to a peer that negotiated them
//!   (docs/design/reverse.md).
//! - konn's resume extension: `type` 104 (`ACK`, member 104, `{ int64
//!   connectID = 1; int64 offset = 2; }`) and 105 (`RESUMED`, member 105,
//!   empty); see [`Packet::Ack`]. Only sent to a peer that negotiated
//!   `konn-resume` (docs/design/resume.md).
//! - prost and Go treat `type` as an open enum and never compare it with the
//!   payload. Here an unknown `type` is [`Error::UnknownPacketType`] and a
//!   payload that is not the one `type` names is [`Error::PacketTypeMismatch`]
//!   (Go's handlers would silently read an all-default payload).
//! - A known field with a wrong wire type is [`Error::ProtoWrongWireType`], as
//!   in prost; protobuf-go instead keeps such a field as an unknown field.
//!   No conforming encoder produces it.
//! - Group nesting beyond prost's limit is [`Error::ProtoBadGroup`]; protobuf-go
//!   allows up to 10 000 levels.

mod bytestr;
mod wire;

use bytes::{BufMut, Bytes};

pub use bytestr::ByteStr;
use wire::{Cursor, RECURSION_LIMIT, Scratch, Span};

use crate::Error;

/// Length of the gRPC message prefix (compressed flag + 4-byte length).
const GRPC_PREFIX_LEN: usize = 5;

/// HTTP/2's default (and minimum) SETTINGS_MAX_FRAME_SIZE.
const H2_DEFAULT_MAX_FRAME_SIZE: usize = 16_384;

/// The largest DATA payload for which the whole gRPC message — 5-byte prefix
/// plus a DATA packet with *any* `connect_id` (negative ones take 10 bytes)
/// and an empty `error` — fits in one default-sized (16 384-byte) HTTP/2 DATA
/// frame. Chunking reads to this size keeps one packet per frame.
///
/// It is 16 360: 24 bytes of header (5 prefix, 2 `type`, 1 + 2 payload key
/// and length, 1 + 10 `connectID`, 1 + 2 `data` key and length).
pub const MAX_DATA_PAYLOAD: usize = max_data_payload(H2_DEFAULT_MAX_FRAME_SIZE);

/// Field number of `Packet.type`.
const TYPE_FIELD: u32 = 1;

/// The Konnectivity packet types (`PacketType` in `client.proto`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PacketType {
    /// `DIAL_REQ` (0): open a connection to an address.
    DialReq = 0,
    /// `DIAL_RSP` (1): result of a dial.
    DialRsp = 1,
    /// `CLOSE_REQ` (2): close a connection.
    CloseReq = 2,
    /// `CLOSE_RSP` (3): a connection was closed.
    CloseRsp = 3,
    /// `DATA` (4): bytes of a connection.
    Data = 4,
    /// `DIAL_CLS` (5): abandon a pending dial.
    DialCls = 5,
    /// `DRAIN` (6): the agent is shutting down; stop sending it new dials.
    Drain = 6,
    /// `PAUSE` (100, konn extension): stop reading the source of a flow.
    Pause = 100,
    /// `RESUME` (101, konn extension): read the source of a flow again.
    Resume = 101,
    /// `REVERSE_DIAL_REQ` (102, konn extension): an agent asks the server to
    /// dial a control-plane destination.
    ReverseDialReq = 102,
    /// `REVERSE_DIAL_RSP` (103, konn extension): the server's answer.
    ReverseDialRsp = 103,
    /// `ACK` (104, konn extension): cumulative acknowledgement of a flow's
    /// bytes (resume).
    Ack = 104,
    /// `RESUMED` (105, konn extension): every parked flow of a resumed
    /// tunnel has been announced.
    Resumed = 105,
}

impl PacketType {
    /// Upstream's packet types, in wire-value order (the `packet_type`
    /// label values of the stream metrics; `ty as usize` indexes it).
    pub const ALL: [Self; 7] = [
        Self::DialReq,
        Self::DialRsp,
        Self::CloseReq,
        Self::CloseRsp,
        Self::Data,
        Self::DialCls,
        Self::Drain,
    ];

    /// konn's extension types (never sent to a peer that did not
    /// negotiate them).
    pub const EXTENSIONS: [Self; 6] = [
        Self::Pause,
        Self::Resume,
        Self::ReverseDialReq,
        Self::ReverseDialRsp,
        Self::Ack,
        Self::Resumed,
    ];

    /// Whether this is one of konn's extension types.
    pub const fn is_extension(self) -> bool {
        matches!(
            self,
            Self::Pause
                | Self::Resume
                | Self::ReverseDialReq
                | Self::ReverseDialRsp
                | Self::Ack
                | Self::Resumed
        )
    }

    /// The name in `client.proto` (`"DIAL_REQ"`, …), which upstream uses as
    /// a metric label value.
    pub const fn name(self) -> &'static str {
        match self {
            Self::DialReq => "DIAL_REQ",
            Self::DialRsp => "DIAL_RSP",
            Self::CloseReq => "CLOSE_REQ",
            Self::CloseRsp => "CLOSE_RSP",
            Self::Data => "DATA",
            Self::DialCls => "DIAL_CLS",
            Self::Drain => "DRAIN",
            Self::Pause => "PAUSE",
            Self::Resume => "RESUME",
            Self::ReverseDialReq => "REVERSE_DIAL_REQ",
            Self::ReverseDialRsp => "REVERSE_DIAL_RSP",
            Self::Ack => "ACK",
            Self::Resumed => "RESUMED",
        }
    }

    /// Field number of the `payload` oneof member this type carries.
    const fn payload_field(self) -> u32 {
        match self {
            Self::DialReq => 2,
            Self::DialRsp => 3,
            Self::Data => 4,
            Self::CloseReq => 5,
            Self::CloseRsp => 6,
            Self::DialCls => 7,
            Self::Drain => 8,
            Self::Pause => PAUSE_FIELD,
            Self::Resume => RESUME_FIELD,
            Self::ReverseDialReq => REVERSE_DIAL_REQ_FIELD,
            Self::ReverseDialRsp => REVERSE_DIAL_RSP_FIELD,
            Self::Ack => ACK_FIELD,
            Self::Resumed => RESUMED_FIELD,
        }
    }
}

/// Field number of the `pause` oneof member (konn extension).
const PAUSE_FIELD: u32 = 100;
/// Field number of the `resume` oneof member (konn extension).
const RESUME_FIELD: u32 = 101;
/// Field number of the `reverseDialRequest` oneof member (konn extension).
const REVERSE_DIAL_REQ_FIELD: u32 = 102;
/// Field number of the `reverseDialResponse` oneof member (konn extension).
const REVERSE_DIAL_RSP_FIELD: u32 = 103;
/// Field number of the `ack` oneof member (konn extension).
const ACK_FIELD: u32 = 104;
/// Field number of the `resumed` oneof member (konn extension).
const RESUMED_FIELD: u32 = 105;

impl TryFrom<i32> for PacketType {
    type Error = Error;

    /// Fails with [`Error::UnknownPacketType`] for values outside 0–6 and
    /// 100–105.
    fn try_from(ty: i32) -> Result<Self, Error> {
        match ty {
            100 => Ok(Self::Pause),
            101 => Ok(Self::Resume),
            102 => Ok(Self::ReverseDialReq),
            103 => Ok(Self::ReverseDialRsp),
            104 => Ok(Self::Ack),
            105 => Ok(Self::Resumed),
            _ => usize::try_from(ty)
                .ok()
                .and_then(|i| Self::ALL.get(i).copied())
                .ok_or(Error::UnknownPacketType { ty }),
        }
    }
}

impl From<PacketType> for i32 {
    fn from(ty: PacketType) -> Self {
        ty as Self
    }
}

impl core::fmt::Display for PacketType {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.name())
    }
}

/// A Konnectivity packet: `Packet.type` together with its `payload`.
///
/// Field names follow `client.proto` (`connectID` → `connect_id`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Packet {
    /// `DIAL_REQ` with a `DialRequest`.
    DialReq {
        /// Network, `"tcp"` in practice.
        protocol: ByteStr,
        /// `host:port` to dial.
        address: ByteStr,
        /// The dialer's token that the `DIAL_RSP` echoes.
        random: i64,
    },
    /// `DIAL_RSP` with a `DialResponse`.
    DialRsp {
        /// Why the dial failed; empty on success.
        error: ByteStr,
        /// The new connection's id (on success).
        connect_id: i64,
        /// The `random` of the `DIAL_REQ` this answers.
        random: i64,
    },
    /// `CLOSE_REQ` with a `CloseRequest`.
    CloseReq {
        /// Connection to close.
        connect_id: i64,
    },
    /// `CLOSE_RSP` with a `CloseResponse`.
    CloseRsp {
        /// Why the close failed, or why the connection ended; may be empty.
        error: ByteStr,
        /// The connection that closed.
        connect_id: i64,
    },
    /// `DATA` with a `Data`.
    Data {
        /// Connection the bytes belong to.
        connect_id: i64,
        /// An error report instead of (or alongside) data; usually empty.
        error: ByteStr,
        /// The bytes. After [`Packet::decode`], a slice of the input buffer.
        data: Bytes,
    },
    /// `DIAL_CLS` with a `CloseDial`.
    DialCls {
        /// The `random` of the dial being abandoned.
        random: i64,
    },
    /// `DRAIN` with an (empty) `Drain`.
    Drain,
    /// `PAUSE` with a `Pause` (konn extension, type 100, member 100): the
    /// receiver of this flow's data has more than its high-water mark
    /// queued; the sender stops reading this flow's source.
    Pause {
        /// The flow.
        connect_id: i64,
    },
    /// `RESUME` with a `Resume` (konn extension, type 101, member 101): the
    /// queue drained below the low-water mark; read the source again.
    Resume {
        /// The flow.
        connect_id: i64,
    },
    /// `REVERSE_DIAL_REQ` (konn extension, type 102, member 102, shaped
    /// like `DialRequest`): the agent asks the server to dial `address`, a
    /// key of the server's allow-list; the server dials the destination it
    /// configured for that key, never the string itself.
    ReverseDialReq {
        /// Network, `"tcp"` (anything else is refused).
        protocol: ByteStr,
        /// The allow-list key (`host:port`).
        address: ByteStr,
        /// The agent's token that the answer echoes.
        random: i64,
    },
    /// `REVERSE_DIAL_RSP` (konn extension, type 103, member 103, shaped like
    /// `DialResponse`): the server's answer; a connection of the reverse
    /// direction has a negative, server-assigned id.
    ReverseDialRsp {
        /// Why the dial failed (one generic text); empty on success.
        error: ByteStr,
        /// The new connection's id (negative) on success.
        connect_id: i64,
        /// The `random` of the request this answers.
        random: i64,
    },
    /// `ACK` with an `Ack` (konn extension, type 104, member 104): the
    /// sender has received (accepted into the flow's queue) every byte of
    /// the flow below `offset`, the flow's close counting as one byte
    /// after the last. On a resumed tunnel, the first ACK of a flow
    /// announces where the replay starts.
    Ack {
        /// The flow.
        connect_id: i64,
        /// Bytes received (a non-negative byte offset).
        offset: i64,
    },
    /// `RESUMED` with an (empty) `Resumed` (konn extension, type 105,
    /// member 105): on a resumed tunnel, every parked flow has been
    /// announced with its ACK; flows the peer parked and did not announce
    /// are gone.
    Resumed,
}

impl Packet {
    /// This packet's type.
    pub const fn ty(&self) -> PacketType {
        match self {
            Self::DialReq { .. } => PacketType::DialReq,
            Self::DialRsp { .. } => PacketType::DialRsp,
            Self::CloseReq { .. } => PacketType::CloseReq,
            Self::CloseRsp { .. } => PacketType::CloseRsp,
            Self::Data { .. } => PacketType::Data,
            Self::DialCls { .. } => PacketType::DialCls,
            Self::Drain => PacketType::Drain,
            Self::Pause { .. } => PacketType::Pause,
            Self::Resume { .. } => PacketType::Resume,
            Self::ReverseDialReq { .. } => PacketType::ReverseDialReq,
            Self::ReverseDialRsp { .. } => PacketType::ReverseDialRsp,
            Self::Ack { .. } => PacketType::Ack,
            Self::Resumed => PacketType::Resumed,
        }
    }

    /// Decodes a whole `Packet` message (a gRPC message body, without the
    /// 5-byte prefix).
    ///
    /// String and bytes fields are `buf.slice(..)`s of `buf`, so this does not
    /// copy and does not allocate — provided `buf` is already in the shared
    /// representation (as `BytesMut::split_to(..).freeze()` yields); the first
    /// slice of a `Bytes` made directly from a `Vec` makes `bytes` allocate
    /// its shared header once. See the module docs for what is accepted.
    pub fn decode(buf: &Bytes) -> Result<Self, Error> {
        RawPacket::parse(buf)?.into_packet(buf)
    }

    /// Length of [`Packet::encode`]'s output.
    pub fn encoded_len(&self) -> usize {
        let ty = self.ty();
        type_field_len(ty) + wire::message_field_len(ty.payload_field(), body_len(&self.fields()))
    }

    /// Appends the protobuf encoding, byte-for-byte what prost produces.
    ///
    /// `dst` must have room for [`Packet::encoded_len`] bytes if it cannot
    /// grow (a `BufMut` panics otherwise).
    pub fn encode(&self, dst: &mut impl BufMut) {
        let fields = self.fields();
        let ty = self.ty();
        // Keys, lengths and integers gather in `head`; string and bytes
        // contents go to `dst` directly, never through an extra copy.
        let mut head = Scratch::new();
        if ty != PacketType::DialReq {
            head.byte(wire::key(TYPE_FIELD as u8, wire::VARINT));
            head.varint(ty as u64);
        }
        head.len_prefix(ty.payload_field(), body_len(&fields));
        for field in fields {
            match field {
                Field::Int64(number, v) => head.int64_field(number, v),
                Field::Bytes(number, v) if !v.is_empty() => {
                    head.len_prefix(u32::from(number), v.len());
                    dst.put_slice(head.as_slice());
                    head = Scratch::new();
                    dst.put_slice(v);
                }
                Field::Bytes(..) | Field::None => {}
            }
        }
        dst.put_slice(head.as_slice());
    }

    /// Appends the packet as a gRPC length-prefixed message: the 5-byte
    /// prefix (uncompressed) followed by [`Packet::encode`]'s output, i.e.
    /// [`Packet::encoded_len`]` + 5` bytes.
    ///
    /// # Panics
    ///
    /// If the packet is 4 GiB or larger, which gRPC's 32-bit length cannot
    /// express (and no peer would accept).
    pub fn encode_grpc(&self, dst: &mut impl BufMut) {
        let mut head = Scratch::new();
        grpc_prefix(&mut head, self.encoded_len());
        dst.put_slice(head.as_slice());
        self.encode(dst);
    }

    /// The fields of the payload message, in field-number order.
    fn fields(&self) -> [Field<'_>; 3] {
        use Field::{Bytes as B, Int64 as I, None as N};
        match self {
            Self::DialReq {
                protocol,
                address,
                random,
            }
            | Self::ReverseDialReq {
                protocol,
                address,
                random,
            } => [
                B(1, protocol.as_bytes()),
                B(2, address.as_bytes()),
                I(3, *random),
            ],
            Self::DialRsp {
                error,
                connect_id,
                random,
            }
            | Self::ReverseDialRsp {
                error,
                connect_id,
                random,
            } => [B(1, error.as_bytes()), I(2, *connect_id), I(3, *random)],
            Self::CloseReq { connect_id } => [I(1, *connect_id), N, N],
            Self::CloseRsp { error, connect_id } => [B(1, error.as_bytes()), I(2, *connect_id), N],
            Self::Data {
                connect_id,
                error,
                data,
            } => [I(1, *connect_id), B(2, error.as_bytes()), B(3, data)],
            Self::DialCls { random } => [I(1, *random), N, N],
            Self::Drain | Self::Resumed => [N, N, N],
            Self::Ack { connect_id, offset } => [I(1, *connect_id), I(2, *offset), N],
            Self::Pause { connect_id } | Self::Resume { connect_id } => [I(1, *connect_id), N, N],
        }
    }
}

/// One field of a payload message, for encoding.
#[derive(Clone, Copy)]
enum Field<'a> {
    /// An `int64` field: number and value.
    Int64(u8, i64),
    /// A `string` or `bytes` field: number and contents.
    Bytes(u8, &'a [u8]),
    /// No field in this position.
    None,
}

/// Encoded length of a payload message's body.
fn body_len(fields: &[Field<'_>]) -> usize {
    fields
        .iter()
        .map(|field| match *field {
            Field::Int64(_, v) => wire::int64_field_len(v),
            Field::Bytes(_, v) => wire::bytes_field_len(v.len()),
            Field::None => 0,
        })
        .sum()
}

/// Encoded length of `Packet.type` (absent for `DIAL_REQ`, the default).
const fn type_field_len(ty: PacketType) -> usize {
    match ty {
        PacketType::DialReq => 0,
        // Key plus a 1-byte varint: every type value is below 128.
        _ => 2,
    }
}

/// Writes the 5-byte gRPC prefix of an uncompressed message of `len` bytes.
fn grpc_prefix(head: &mut Scratch, len: usize) {
    let Ok(len) = u32::try_from(len) else {
        panic!("gRPC message of {len} bytes does not fit a 32-bit length prefix");
    };
    head.byte(0);
    head.bytes(&len.to_be_bytes());
}

/// Length of the body of a `Data` message with an empty `error`.
const fn data_body_len(connect_id: i64, payload_len: usize) -> usize {
    wire::int64_field_len(connect_id) + wire::bytes_field_len(payload_len)
}

/// Length of what [`encode_data_header`] writes: the gRPC prefix and
/// everything of the DATA packet before its payload.
///
/// The whole gRPC message is `data_header_len(..) + payload_len` bytes.
pub const fn data_header_len(connect_id: i64, payload_len: usize) -> usize {
    let packet = type_field_len(PacketType::Data)
        + wire::message_field_len(
            PacketType::Data.payload_field(),
            data_body_len(connect_id, payload_len),
        );
    GRPC_PREFIX_LEN + packet - payload_len
}

/// Appends the gRPC prefix and the protobuf header of a DATA packet with
/// `connect_id`, an empty `error` and a `payload_len`-byte payload; the
/// caller appends (or separately writes) the payload itself.
///
/// Header + payload are byte-for-byte what [`Packet::encode_grpc`] writes for
/// `Packet::Data { connect_id, error: ByteStr::new(), data }`. An empty
/// payload gets no `data` field at all, as proto3 requires.
///
/// # Panics
///
/// If the message would be 4 GiB or larger (see [`Packet::encode_grpc`]).
pub fn encode_data_header(connect_id: i64, payload_len: usize, dst: &mut impl BufMut) {
    let body = data_body_len(connect_id, payload_len);
    let packet = type_field_len(PacketType::Data)
        + wire::message_field_len(PacketType::Data.payload_field(), body);
    let mut head = Scratch::new();
    grpc_prefix(&mut head, packet);
    head.byte(wire::key(TYPE_FIELD as u8, wire::VARINT));
    head.byte(PacketType::Data as u8);
    head.len_prefix(PacketType::Data.payload_field(), body);
    head.int64_field(1, connect_id);
    if payload_len != 0 {
        head.len_prefix(3, payload_len);
    }
    dst.put_slice(head.as_slice());
}

/// The largest DATA payload whose whole gRPC message (prefix included), with
/// any `connect_id` and an empty `error`, fits in `budget` bytes; 0 if not
/// even an empty DATA packet fits. [`MAX_DATA_PAYLOAD`] is this for one
/// default-sized HTTP/2 frame.
pub const fn max_data_payload(budget: usize) -> usize {
    // Negative ids are the longest (10-byte varints).
    const WORST_ID: i64 = -1;
    // gRPC cannot express (much) more anyway, and this keeps the sums below
    // far from overflowing.
    const MAX_GRPC_MESSAGE: usize = u32::MAX as usize;
    let budget = if budget < MAX_GRPC_MESSAGE {
        budget
    } else {
        MAX_GRPC_MESSAGE
    };
    if data_header_len(WORST_ID, 0) > budget {
        return 0;
    }
    // The header grows with the payload (its length varints do), so a
    // payload of `budget - header(budget)` fits; step up while the next size
    // still fits (a few steps at most, across varint length boundaries).
    let mut payload = budget.saturating_sub(data_header_len(WORST_ID, budget));
    while payload + 1 + data_header_len(WORST_ID, payload + 1) <= budget {
        payload += 1;
    }
    payload
}

/// Everything [`Packet::decode`] gathers in its pass over the message.
#[derive(Default)]
struct RawPacket {
    /// `Packet.type` as received.
    ty: i32,
    /// Field number of the oneof member seen last; 0 if none.
    member: u32,
    /// That member's fields 1–3.
    slots: [Slot; 3],
}

/// Where a payload field's contents are (`string`/`bytes`) or its value
/// (`int64`).
#[derive(Clone, Copy, Default)]
struct Slot {
    span: Span,
    int: i64,
}

/// Type of a payload message's field, for decoding.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Not in the schema: skipped as an unknown field.
    Unknown,
    /// `string` (checked to be UTF-8).
    Str,
    /// `bytes`.
    Bytes,
    /// `int64`.
    Int64,
}

/// Types of fields 1–3 of the oneof member with field number `member`.
const fn schema(member: u32) -> [Kind; 3] {
    use Kind::{Bytes, Int64, Str, Unknown};
    match member {
        // DialRequest{protocol, address, random}; konn's ReverseDialRequest
        2 | REVERSE_DIAL_REQ_FIELD => [Str, Str, Int64],
        // DialResponse{error, connectID, random}; konn's ReverseDialResponse
        3 | REVERSE_DIAL_RSP_FIELD => [Str, Int64, Int64],
        4 => [Int64, Str, Bytes],       // Data{connectID, error, data}
        5 => [Int64, Unknown, Unknown], // CloseRequest{connectID}
        6 => [Str, Int64, Unknown],     // CloseResponse{error, connectID}
        7 => [Int64, Unknown, Unknown], // CloseDial{random}
        // konn extension: Pause{connectID}, Resume{connectID}
        PAUSE_FIELD | RESUME_FIELD => [Int64, Unknown, Unknown],
        // konn extension: Ack{connectID, offset}
        ACK_FIELD => [Int64, Int64, Unknown],
        _ => [Unknown; 3], // Drain{}, konn's Resumed{}
    }
}

/// Fails unless a known field has the wire type its schema type requires.
fn expect_wire_type(field: u32, wire_type: u8, expected: u8) -> Result<(), Error> {
    if wire_type == expected {
        Ok(())
    } else {
        Err(Error::ProtoWrongWireType { field, wire_type })
    }
}

impl RawPacket {
    /// Reads the top-level `Packet` message.
    fn parse(input: &[u8]) -> Result<Self, Error> {
        let mut raw = Self::default();
        let mut cursor = Cursor::new(input);
        while !cursor.is_empty() {
            let (field, wire_type) = cursor.read_key()?;
            match field {
                TYPE_FIELD => {
                    expect_wire_type(field, wire_type, wire::VARINT)?;
                    // An int32 on the wire is a 64-bit varint truncated to 32
                    // bits (prost and protobuf-go alike).
                    raw.ty = cursor.read_varint()? as i32;
                }
                2..=8
                | PAUSE_FIELD
                | RESUME_FIELD
                | REVERSE_DIAL_REQ_FIELD
                | REVERSE_DIAL_RSP_FIELD
                | ACK_FIELD
                | RESUMED_FIELD => {
                    expect_wire_type(field, wire_type, wire::LEN)?;
                    let span = cursor.read_len()?;
                    if raw.member != field {
                        // Another oneof member replaces the previous one
                        // entirely; the same member merges into it.
                        raw.member = field;
                        raw.slots = Default::default();
                    }
                    // Entering the embedded message costs one level.
                    raw.merge_payload(cursor.sub(span), RECURSION_LIMIT - 1)?;
                }
                _ => cursor.skip_field(field, wire_type, RECURSION_LIMIT)?,
            }
        }
        Ok(raw)
    }

    /// Merges one occurrence of the current oneof member's message.
    fn merge_payload(&mut self, mut cursor: Cursor<'_>, budget: u32) -> Result<(), Error> {
        let schema = schema(self.member);
        while !cursor.is_empty() {
            let (field, wire_type) = cursor.read_key()?;
            let index = field.wrapping_sub(1) as usize;
            let (kind, slot) = match (schema.get(index), self.slots.get_mut(index)) {
                (Some(&kind), Some(slot)) if kind != Kind::Unknown => (kind, slot),
                _ => {
                    cursor.skip_field(field, wire_type, budget)?;
                    continue;
                }
            };
            if kind == Kind::Int64 {
                expect_wire_type(field, wire_type, wire::VARINT)?;
                slot.int = cursor.read_varint()? as i64;
            } else {
                expect_wire_type(field, wire_type, wire::LEN)?;
                let span = cursor.read_len()?;
                if kind == Kind::Str && core::str::from_utf8(cursor.slice(span)).is_err() {
                    return Err(Error::ProtoInvalidUtf8 { field });
                }
                slot.span = span;
            }
        }
        Ok(())
    }

    /// Checks `type` against the payload and builds the packet, slicing
    /// strings and bytes out of `buf`.
    fn into_packet(self, buf: &Bytes) -> Result<Packet, Error> {
        let ty = PacketType::try_from(self.ty)?;
        if self.member != 0 && self.member != ty.payload_field() {
            return Err(Error::PacketTypeMismatch {
                ty: self.ty,
                payload_field: self.member,
            });
        }
        let [a, b, c] = self.slots;
        let bytes = |slot: Slot| slice(buf, slot.span);
        let string = |slot: Slot| ByteStr::from_checked(slice(buf, slot.span));
        Ok(match ty {
            PacketType::DialReq => Packet::DialReq {
                protocol: string(a),
                address: string(b),
                random: c.int,
            },
            PacketType::DialRsp => Packet::DialRsp {
                error: string(a),
                connect_id: b.int,
                random: c.int,
            },
            PacketType::CloseReq => Packet::CloseReq { connect_id: a.int },
            PacketType::CloseRsp => Packet::CloseRsp {
                error: string(a),
                connect_id: b.int,
            },
            PacketType::Data => Packet::Data {
                connect_id: a.int,
                error: string(b),
                data: bytes(c),
            },
            PacketType::DialCls => Packet::DialCls { random: a.int },
            PacketType::Drain => Packet::Drain,
            PacketType::Pause => Packet::Pause { connect_id: a.int },
            PacketType::Resume => Packet::Resume { connect_id: a.int },
            PacketType::ReverseDialReq => Packet::ReverseDialReq {
                protocol: string(a),
                address: string(b),
                random: c.int,
            },
            PacketType::ReverseDialRsp => Packet::ReverseDialRsp {
                error: string(a),
                connect_id: b.int,
                random: c.int,
            },
            PacketType::Ack => Packet::Ack {
                connect_id: a.int,
                offset: b.int,
            },
            PacketType::Resumed => Packet::Resumed,
        })
    }
}

/// `buf[span]` without a copy. An empty span (an absent field) gives the
/// static empty `Bytes`, without touching `buf`'s reference count.
fn slice(buf: &Bytes, span: Span) -> Bytes {
    // Spans come from `Cursor::read_len` over `buf`, so they are in range;
    // the check keeps this panic-free regardless.
    if span.start < span.end && span.end <= buf.len() {
        buf.slice(span.start..span.end)
    } else {
        Bytes::new()
    }
}

#[cfg(test)]
mod tests;
