//! The one error type of `konn-frames`.
//!
//! Every decoder in this crate returns [`Error`]. It is `Copy`, never
//! allocates, and each variant names the problem precisely enough for a log
//! line. "Need more bytes" is **not** an error: incremental decoders return
//! `Ok(None)` for incomplete input.
//!
//! For HTTP/2 and HPACK errors, [`Error::h2`] gives the RFC 9113 error code
//! and whether it is a connection error (GOAWAY) or a stream error
//! (RST_STREAM). For gRPC and packet errors, [`Error::grpc_status`] gives the
//! status a gRPC peer would report.

use crate::codes::{GrpcStatus, Reason};

/// Whether an HTTP/2 error ends the connection or one stream (RFC 9113 §5.4).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// Connection error: send GOAWAY with the reason and close.
    Connection,
    /// Stream error: send RST_STREAM on this stream id; the connection lives on.
    /// For [`Error::HeaderListTooLarge`] the decoder does not know the stream
    /// and reports `0`; the caller substitutes the stream it was decoding.
    Stream(u32),
}

/// Everything that can be wrong with bytes handed to a `konn-frames` decoder.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Error {
    // ----- HTTP/2 framing (RFC 9113 §4–§6) -----
    /// The 24-byte client connection preface is not `PRI * HTTP/2.0…`.
    InvalidPreface,
    /// A frame's length exceeds the SETTINGS_MAX_FRAME_SIZE we advertised.
    /// Detected from the 9-byte header alone, before the payload is buffered.
    FrameTooLarge {
        /// Length field of the frame header.
        len: u32,
        /// Our advertised maximum.
        max: u32,
    },
    /// A frame whose payload length is wrong for its type (PING ≠ 8,
    /// WINDOW_UPDATE ≠ 4, SETTINGS not a multiple of 6, …).
    BadFrameSize {
        /// Frame type.
        ty: u8,
        /// Payload length.
        len: u32,
        /// Stream the frame was on.
        stream_id: u32,
    },
    /// A frame type that must be on a stream arrived on stream 0.
    StreamIdRequired {
        /// Frame type.
        ty: u8,
    },
    /// A connection-level frame type (SETTINGS, PING, GOAWAY) arrived on a
    /// non-zero stream.
    StreamIdForbidden {
        /// Frame type.
        ty: u8,
        /// The offending stream id.
        stream_id: u32,
    },
    /// The Pad Length field is not smaller than the remaining payload.
    PaddingTooLong {
        /// Frame type.
        ty: u8,
        /// Pad Length field.
        pad_len: u8,
        /// Payload length.
        len: u32,
    },
    /// A SETTINGS parameter with a value outside its allowed range.
    InvalidSetting {
        /// Setting identifier.
        id: u16,
        /// Received value.
        value: u32,
    },
    /// WINDOW_UPDATE with an increment of 0.
    ZeroWindowIncrement {
        /// Stream the frame was on (0 = connection).
        stream_id: u32,
    },
    /// HEADERS or PRIORITY making a stream depend on itself.
    SelfDependency {
        /// The stream.
        stream_id: u32,
    },

    // ----- HPACK (RFC 7541) -----
    /// The header block ended in the middle of a representation.
    HpackTruncated,
    /// An HPACK integer does not fit the decoder's limits.
    HpackIntegerOverflow,
    /// An index that is 0 or beyond the static plus dynamic table.
    HpackInvalidIndex {
        /// The index as decoded.
        index: u64,
    },
    /// Invalid Huffman code: EOS symbol, padding longer than 7 bits, or
    /// padding that is not the EOS prefix.
    HpackInvalidHuffman,
    /// A dynamic table size update after the first header representation of
    /// a block (RFC 7541 §4.2).
    HpackSizeUpdateMisplaced,
    /// A dynamic table size update above the limit we advertised.
    HpackSizeUpdateTooLarge {
        /// Requested size.
        size: u64,
        /// Our SETTINGS_HEADER_TABLE_SIZE.
        max: u32,
    },
    /// A string literal longer than the decoder accepts.
    HpackStringTooLong {
        /// Declared length.
        len: u64,
        /// Decoder limit.
        max: u32,
    },
    /// The block needs more work than allowed (e.g. a flood of indexed
    /// fields or table size updates): the peer is abusive.
    HpackWorkLimit,
    /// The decoded header list exceeds our SETTINGS_MAX_HEADER_LIST_SIZE
    /// (RFC 9113 §6.5.2: name + value + 32 bytes per field). The block was
    /// still fully processed, so the HPACK state stays in sync.
    HeaderListTooLarge {
        /// Size counted so far.
        size: u64,
        /// Our limit.
        max: u32,
    },

    // ----- gRPC over HTTP/2 -----
    /// A length-prefixed message larger than the receive limit, detected
    /// from the 5-byte prefix before any of the message is buffered.
    GrpcMessageTooLarge {
        /// Declared message length.
        len: u32,
        /// Receive limit.
        max: u32,
    },
    /// The message is compressed but no compression was negotiated.
    GrpcCompressed,
    /// The compressed-flag byte is neither 0 nor 1.
    GrpcBadCompressedFlag {
        /// The flag byte.
        flag: u8,
    },
    /// The stream ended in the middle of a length-prefixed message.
    GrpcTruncatedMessage,
    /// A `grpc-timeout` value that is not 1–8 ASCII digits plus a unit.
    GrpcInvalidTimeout,
    /// A `grpc-status` value that is not a decimal number.
    GrpcInvalidStatus,
    /// A metadata key with characters outside `0-9 a-z _ - .`.
    InvalidMetadataKey,
    /// A metadata value with characters not allowed in an ASCII value.
    InvalidMetadataValue,
    /// A `-bin` metadata value that is not valid base64.
    InvalidBase64,

    // ----- Protobuf / Konnectivity `Packet` -----
    /// A varint or length-delimited field runs past the end of the message.
    ProtoTruncated,
    /// A varint longer than 10 bytes, or whose 10th byte sets bits beyond 64.
    ProtoVarintOverflow,
    /// A tag with field number 0 or a wire type that does not exist.
    ProtoInvalidTag {
        /// The raw tag value.
        tag: u64,
    },
    /// A known field encoded with a wire type protobuf does not allow for it.
    ProtoWrongWireType {
        /// Field number.
        field: u32,
        /// Wire type found.
        wire_type: u8,
    },
    /// A group (wire types 3/4) that is unbalanced or nested too deeply.
    ProtoBadGroup,
    /// A `string` field that is not valid UTF-8.
    ProtoInvalidUtf8 {
        /// Field number within its message.
        field: u32,
    },
    /// `Packet.type` names a packet type this version does not know.
    UnknownPacketType {
        /// The received `type` value.
        ty: i32,
    },
    /// `Packet.type` and the `payload` oneof disagree (e.g. type DATA with a
    /// `dialRequest` payload).
    PacketTypeMismatch {
        /// The received `type` value.
        ty: i32,
        /// Field number of the oneof member that was set.
        payload_field: u32,
    },

    // ----- HTTP/1.1 CONNECT -----
    /// The request head (request line plus headers) is longer than allowed.
    ConnectHeadTooLarge {
        /// The limit in bytes.
        max: u32,
    },
    /// More header fields than allowed.
    ConnectTooManyHeaders {
        /// The limit.
        max: u32,
    },
    /// The request line is not `METHOD SP target SP HTTP/1.x`.
    ConnectBadRequestLine,
    /// The HTTP version is not HTTP/1.0 or HTTP/1.1.
    ConnectBadVersion,
    /// A header line without a colon, or with an invalid name or value.
    ConnectBadHeader,
    /// The CONNECT target is not in authority form (`host:port`).
    ConnectBadTarget,

    // ----- URL parts (Go's net/url) -----
    /// A `%` not followed by two hex digits (Go's `EscapeError`).
    UrlInvalidEscape {
        /// The `%` and up to two bytes after it, as Go reports them.
        escape: [u8; 3],
        /// How many bytes of `escape` are used.
        len: u8,
    },
    /// A query setting containing `;` (Go refuses it since 1.17).
    UrlSemicolon,
    /// More query settings than `url.ParseQuery` accepts.
    UrlTooManyParams,

    // ----- destinations (addr) -----
    /// A `host:port` destination that is not in its one accepted spelling.
    BadDestination {
        /// What is wrong with it.
        what: &'static str,
    },
}

impl Error {
    /// The HTTP/2 error code and scope for an HTTP/2 or HPACK error, or
    /// `None` for errors of the other codecs.
    pub fn h2(&self) -> Option<(Reason, Scope)> {
        use Scope::{Connection, Stream};
        let conn = |r| Some((r, Connection));
        match *self {
            Self::InvalidPreface
            | Self::StreamIdRequired { .. }
            | Self::StreamIdForbidden { .. }
            | Self::PaddingTooLong { .. } => conn(Reason::PROTOCOL_ERROR),
            Self::FrameTooLarge { .. } => conn(Reason::FRAME_SIZE_ERROR),
            Self::BadFrameSize { ty, stream_id, .. } => {
                // PRIORITY is the one frame whose wrong size only kills its
                // stream (RFC 9113 §6.3); everything else is connection-wide.
                if ty == 0x2 && stream_id != 0 {
                    Some((Reason::FRAME_SIZE_ERROR, Stream(stream_id)))
                } else {
                    conn(Reason::FRAME_SIZE_ERROR)
                }
            }
            Self::InvalidSetting { id, .. } => {
                // SETTINGS_INITIAL_WINDOW_SIZE above 2^31-1 is a flow-control
                // error (RFC 9113 §6.5.2); other bad values are protocol errors.
                if id == 0x4 {
                    conn(Reason::FLOW_CONTROL_ERROR)
                } else {
                    conn(Reason::PROTOCOL_ERROR)
                }
            }
            Self::ZeroWindowIncrement { stream_id } => {
                if stream_id == 0 {
                    conn(Reason::PROTOCOL_ERROR)
                } else {
                    Some((Reason::PROTOCOL_ERROR, Stream(stream_id)))
                }
            }
            Self::SelfDependency { stream_id } => Some((Reason::PROTOCOL_ERROR, Stream(stream_id))),
            Self::HpackTruncated
            | Self::HpackIntegerOverflow
            | Self::HpackInvalidIndex { .. }
            | Self::HpackInvalidHuffman
            | Self::HpackSizeUpdateMisplaced
            | Self::HpackSizeUpdateTooLarge { .. }
            | Self::HpackStringTooLong { .. } => conn(Reason::COMPRESSION_ERROR),
            Self::HpackWorkLimit => conn(Reason::ENHANCE_YOUR_CALM),
            Self::HeaderListTooLarge { .. } => Some((Reason::PROTOCOL_ERROR, Stream(0))),
            _ => None,
        }
    }

    /// The gRPC status a peer reports for this error when it ends a call.
    ///
    /// Oversized messages are `RESOURCE_EXHAUSTED` (as grpc-go reports them);
    /// malformed messages and metadata are `INTERNAL`; everything else
    /// (HTTP/2 or CONNECT problems seen through gRPC) is `INTERNAL` too.
    pub fn grpc_status(&self) -> GrpcStatus {
        match self {
            Self::GrpcMessageTooLarge { .. } | Self::HeaderListTooLarge { .. } => {
                GrpcStatus::RESOURCE_EXHAUSTED
            }
            Self::GrpcCompressed => GrpcStatus::UNIMPLEMENTED,
            _ => GrpcStatus::INTERNAL,
        }
    }
}

impl core::fmt::Display for Error {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match *self {
            Self::InvalidPreface => f.write_str("invalid HTTP/2 client connection preface"),
            Self::FrameTooLarge { len, max } => {
                write!(
                    f,
                    "HTTP/2 frame of {len} bytes exceeds SETTINGS_MAX_FRAME_SIZE {max}"
                )
            }
            Self::BadFrameSize { ty, len, stream_id } => write!(
                f,
                "HTTP/2 {} frame on stream {stream_id} has invalid length {len}",
                frame_type_name(ty)
            ),
            Self::StreamIdRequired { ty } => {
                write!(f, "HTTP/2 {} frame on stream 0", frame_type_name(ty))
            }
            Self::StreamIdForbidden { ty, stream_id } => write!(
                f,
                "HTTP/2 {} frame must be on stream 0, got stream {stream_id}",
                frame_type_name(ty)
            ),
            Self::PaddingTooLong { ty, pad_len, len } => write!(
                f,
                "HTTP/2 {} frame padding {pad_len} does not fit payload of {len} bytes",
                frame_type_name(ty)
            ),
            Self::InvalidSetting { id, value } => {
                write!(
                    f,
                    "HTTP/2 SETTINGS parameter {id:#x} has invalid value {value}"
                )
            }
            Self::ZeroWindowIncrement { stream_id } => {
                write!(
                    f,
                    "HTTP/2 WINDOW_UPDATE with increment 0 on stream {stream_id}"
                )
            }
            Self::SelfDependency { stream_id } => {
                write!(f, "HTTP/2 stream {stream_id} depends on itself")
            }
            Self::HpackTruncated => f.write_str("HPACK block ends inside a field representation"),
            Self::HpackIntegerOverflow => f.write_str("HPACK integer too large"),
            Self::HpackInvalidIndex { index } => write!(f, "HPACK index {index} is out of range"),
            Self::HpackInvalidHuffman => {
                f.write_str("HPACK string has an invalid Huffman encoding")
            }
            Self::HpackSizeUpdateMisplaced => {
                f.write_str("HPACK dynamic table size update after the start of a block")
            }
            Self::HpackSizeUpdateTooLarge { size, max } => write!(
                f,
                "HPACK dynamic table size update to {size} exceeds the advertised {max}"
            ),
            Self::HpackStringTooLong { len, max } => {
                write!(f, "HPACK string of {len} bytes exceeds the limit of {max}")
            }
            Self::HpackWorkLimit => f.write_str("HPACK block exceeds the per-block work limit"),
            Self::HeaderListTooLarge { size, max } => {
                write!(
                    f,
                    "header list of at least {size} bytes exceeds the limit of {max}"
                )
            }
            Self::GrpcMessageTooLarge { len, max } => write!(
                f,
                "grpc: received message larger than max ({len} vs. {max})"
            ),
            Self::GrpcCompressed => {
                f.write_str("grpc: compressed message received but no compression was negotiated")
            }
            Self::GrpcBadCompressedFlag { flag } => {
                write!(f, "grpc: invalid compressed-flag byte {flag:#x}")
            }
            Self::GrpcTruncatedMessage => f.write_str("grpc: stream ended inside a message"),
            Self::GrpcInvalidTimeout => f.write_str("grpc: malformed grpc-timeout"),
            Self::GrpcInvalidStatus => f.write_str("grpc: malformed grpc-status"),
            Self::InvalidMetadataKey => f.write_str("grpc: invalid metadata key"),
            Self::InvalidMetadataValue => f.write_str("grpc: invalid metadata value"),
            Self::InvalidBase64 => f.write_str("grpc: invalid base64 in a -bin metadata value"),
            Self::ProtoTruncated => f.write_str("protobuf: message truncated"),
            Self::ProtoVarintOverflow => f.write_str("protobuf: varint overflows 64 bits"),
            Self::ProtoInvalidTag { tag } => write!(f, "protobuf: invalid tag {tag}"),
            Self::ProtoWrongWireType { field, wire_type } => write!(
                f,
                "protobuf: field {field} has unexpected wire type {wire_type}"
            ),
            Self::ProtoBadGroup => f.write_str("protobuf: unbalanced or too deeply nested group"),
            Self::ProtoInvalidUtf8 { field } => {
                write!(f, "protobuf: string field {field} is not valid UTF-8")
            }
            Self::UnknownPacketType { ty } => write!(f, "unknown Konnectivity packet type {ty}"),
            Self::PacketTypeMismatch { ty, payload_field } => write!(
                f,
                "Konnectivity packet type {ty} does not match its payload (field {payload_field})"
            ),
            Self::ConnectHeadTooLarge { max } => {
                write!(f, "HTTP request head exceeds {max} bytes")
            }
            Self::ConnectTooManyHeaders { max } => {
                write!(f, "HTTP request has more than {max} header fields")
            }
            Self::ConnectBadRequestLine => f.write_str("malformed HTTP request line"),
            Self::ConnectBadVersion => f.write_str("unsupported HTTP version"),
            Self::ConnectBadHeader => f.write_str("malformed HTTP header field"),
            Self::ConnectBadTarget => f.write_str("CONNECT target is not host:port"),
            Self::UrlInvalidEscape { escape, len } => {
                let escape = escape.get(..usize::from(len)).unwrap_or_default();
                write!(
                    f,
                    "invalid URL escape {:?}",
                    String::from_utf8_lossy(escape)
                )
            }
            Self::UrlSemicolon => f.write_str("invalid semicolon separator in query"),
            Self::UrlTooManyParams => f.write_str("number of URL query parameters exceeded limit"),
            Self::BadDestination { what } => write!(f, "bad destination: {what}"),
        }
    }
}

impl std::error::Error for Error {}

/// Name of an HTTP/2 frame type for messages.
fn frame_type_name(ty: u8) -> &'static str {
    match ty {
        0x0 => "DATA",
        0x1 => "HEADERS",
        0x2 => "PRIORITY",
        0x3 => "RST_STREAM",
        0x4 => "SETTINGS",
        0x5 => "PUSH_PROMISE",
        0x6 => "PING",
        0x7 => "GOAWAY",
        0x8 => "WINDOW_UPDATE",
        0x9 => "CONTINUATION",
        _ => "unknown",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes_follow_rfc_9113() {
        assert_eq!(
            Error::BadFrameSize {
                ty: 0x2,
                len: 4,
                stream_id: 3
            }
            .h2(),
            Some((Reason::FRAME_SIZE_ERROR, Scope::Stream(3)))
        );
        assert_eq!(
            Error::BadFrameSize {
                ty: 0x6,
                len: 4,
                stream_id: 0
            }
            .h2(),
            Some((Reason::FRAME_SIZE_ERROR, Scope::Connection))
        );
        assert_eq!(
            Error::InvalidSetting {
                id: 4,
                value: u32::MAX
            }
            .h2(),
            Some((Reason::FLOW_CONTROL_ERROR, Scope::Connection))
        );
        assert_eq!(
            Error::ZeroWindowIncrement { stream_id: 5 }.h2(),
            Some((Reason::PROTOCOL_ERROR, Scope::Stream(5)))
        );
        assert_eq!(
            Error::ZeroWindowIncrement { stream_id: 0 }.h2(),
            Some((Reason::PROTOCOL_ERROR, Scope::Connection))
        );
        assert_eq!(
            Error::HpackInvalidHuffman.h2(),
            Some((Reason::COMPRESSION_ERROR, Scope::Connection))
        );
        assert_eq!(Error::ProtoTruncated.h2(), None);
    }

    #[test]
    fn grpc_statuses() {
        assert_eq!(
            Error::GrpcMessageTooLarge {
                len: 5 << 20,
                max: 4 << 20
            }
            .grpc_status(),
            GrpcStatus::RESOURCE_EXHAUSTED
        );
        assert_eq!(Error::ProtoTruncated.grpc_status(), GrpcStatus::INTERNAL);
    }

    #[test]
    fn messages_name_the_problem() {
        let e = Error::FrameTooLarge {
            len: 20000,
            max: 16384,
        };
        assert_eq!(
            e.to_string(),
            "HTTP/2 frame of 20000 bytes exceeds SETTINGS_MAX_FRAME_SIZE 16384"
        );
        let e = Error::PacketTypeMismatch {
            ty: 4,
            payload_field: 2,
        };
        assert!(e.to_string().contains("type 4"));
    }
}
