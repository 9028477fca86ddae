//! The 9-byte HTTP/2 frame header (RFC 9113 §4.1), frame types and flags.
//!
//! ```text
//! +-----------------------------------------------+
//! |                 Length (24)                   |
//! +---------------+---------------+---------------+
//! |   Type (8)    |   Flags (8)   |
//! +-+-------------+---------------+-------------------------------+
//! |R|                 Stream Identifier (31)                      |
//! +=+=============================================================+
//! ```
//!
//! The header is parsed from a fixed-size array, so it cannot fail: every
//! bit pattern is a header. Whether the header is *acceptable* (its length
//! against our SETTINGS_MAX_FRAME_SIZE, its stream id against its type) is
//! decided by [`decode`](super::decode) and [`Frame::load`](super::Frame::load).
//! Frame types are an open newtype because RFC 9113 §4.1 requires unknown
//! types to be ignored, not rejected.

use bytes::BufMut;

/// Length of the frame header in bytes.
pub const HEAD_LEN: usize = 9;

/// The largest value the 24-bit Length field can carry (2^24 - 1), which is
/// also the largest allowed SETTINGS_MAX_FRAME_SIZE.
pub const MAX_FRAME_LEN: u32 = (1 << 24) - 1;

/// Mask of the 31-bit stream identifier; the top bit is reserved.
pub(crate) const STREAM_ID_MASK: u32 = 0x7fff_ffff;

/// An HTTP/2 frame type (RFC 9113 §6, §11.2).
///
/// Open: values this crate does not know are kept (and decoded as
/// [`Frame::Unknown`](super::Frame::Unknown)) so the caller can skip them.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FrameType(pub u8);

impl FrameType {
    /// DATA: stream payload, flow controlled (§6.1).
    pub const DATA: Self = Self(0x0);
    /// HEADERS: opens a stream and carries a field block fragment (§6.2).
    pub const HEADERS: Self = Self(0x1);
    /// PRIORITY: deprecated stream prioritisation, still parsed (§6.3).
    pub const PRIORITY: Self = Self(0x2);
    /// RST_STREAM: terminates a stream (§6.4).
    pub const RST_STREAM: Self = Self(0x3);
    /// SETTINGS: connection parameters or their acknowledgement (§6.5).
    pub const SETTINGS: Self = Self(0x4);
    /// PUSH_PROMISE: server push (§6.6).
    pub const PUSH_PROMISE: Self = Self(0x5);
    /// PING: liveness and round-trip measurement (§6.7).
    pub const PING: Self = Self(0x6);
    /// GOAWAY: connection shutdown (§6.8).
    pub const GOAWAY: Self = Self(0x7);
    /// WINDOW_UPDATE: flow-control credit (§6.9).
    pub const WINDOW_UPDATE: Self = Self(0x8);
    /// CONTINUATION: further field block fragments (§6.10).
    pub const CONTINUATION: Self = Self(0x9);

    /// The type's RFC name, or `None` for a type this crate does not know.
    pub const fn name(self) -> Option<&'static str> {
        Some(match self.0 {
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
            _ => return None,
        })
    }
}

impl core::fmt::Debug for FrameType {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self.name() {
            Some(name) => f.write_str(name),
            None => write!(f, "FrameType({:#x})", self.0),
        }
    }
}

impl core::fmt::Display for FrameType {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        core::fmt::Debug::fmt(self, f)
    }
}

/// Frame flag bits (RFC 9113 §6). A bit means something only for the frame
/// types listed on it; on other types it is ignored.
pub mod flags {
    /// DATA, HEADERS: the last frame the sender sends on this stream.
    pub const END_STREAM: u8 = 0x1;
    /// SETTINGS, PING: this frame acknowledges the peer's frame.
    pub const ACK: u8 = 0x1;
    /// HEADERS, PUSH_PROMISE, CONTINUATION: the field block is complete.
    pub const END_HEADERS: u8 = 0x4;
    /// DATA, HEADERS, PUSH_PROMISE: a Pad Length field and padding are present.
    pub const PADDED: u8 = 0x8;
    /// HEADERS: the Exclusive/Stream Dependency/Weight fields are present.
    pub const PRIORITY: u8 = 0x20;
}

/// A parsed frame header.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Head {
    /// Payload length in bytes (24 bits on the wire, header excluded).
    pub len: u32,
    /// Frame type.
    pub ty: FrameType,
    /// Flag bits as received, including ones the type does not define.
    pub flags: u8,
    /// Stream identifier with the reserved bit masked off (0 = connection).
    pub stream_id: u32,
}

impl Head {
    /// Parses a frame header. Infallible: the reserved bit of the stream id
    /// is ignored as RFC 9113 §4.1 requires.
    #[inline]
    pub fn parse(b: &[u8; HEAD_LEN]) -> Self {
        let [l0, l1, l2, ty, flags, s0, s1, s2, s3] = *b;
        Self {
            len: u32::from_be_bytes([0, l0, l1, l2]),
            ty: FrameType(ty),
            flags,
            stream_id: u32::from_be_bytes([s0, s1, s2, s3]) & STREAM_ID_MASK,
        }
    }

    /// Writes the 9-byte header. The reserved bit is always sent as 0
    /// (bit 31 of `stream_id` is dropped).
    ///
    /// # Panics
    /// If `len` exceeds [`MAX_FRAME_LEN`]: such a frame cannot be expressed
    /// on the wire, so this is a bug in the caller, never an input problem.
    #[inline]
    pub fn encode<B: BufMut + ?Sized>(&self, dst: &mut B) {
        dst.put_slice(&self.to_bytes());
    }

    /// The 9 header bytes (see [`Head::encode`], including its panic).
    #[inline]
    pub fn to_bytes(&self) -> [u8; HEAD_LEN] {
        assert!(
            self.len <= MAX_FRAME_LEN,
            "HTTP/2 frame payload of {} bytes exceeds the 24-bit length field",
            self.len
        );
        let [_, l0, l1, l2] = self.len.to_be_bytes();
        let [s0, s1, s2, s3] = (self.stream_id & STREAM_ID_MASK).to_be_bytes();
        [l0, l1, l2, self.ty.0, self.flags, s0, s1, s2, s3]
    }

    /// Whether all bits of `flag` are set.
    #[inline]
    pub fn has(&self, flag: u8) -> bool {
        self.flags & flag == flag
    }

    /// Bytes the whole frame occupies on the wire: header plus payload.
    /// After a stream-scoped decode error this is how much to skip.
    #[inline]
    pub fn frame_len(&self) -> usize {
        // u32 -> usize is lossless on every target this crate supports
        // (16-bit targets are not among them).
        HEAD_LEN + self.len as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_masks_reserved_bit() {
        let h = Head::parse(&[0x01, 0x02, 0x03, 0x0, 0x9, 0xff, 0xff, 0xff, 0xff]);
        assert_eq!(
            h,
            Head {
                len: 0x010203,
                ty: FrameType::DATA,
                flags: 0x9,
                stream_id: 0x7fff_ffff
            }
        );
        assert!(h.has(flags::END_STREAM));
        assert!(h.has(flags::PADDED));
        assert!(!h.has(flags::END_HEADERS));
        assert_eq!(h.frame_len(), 9 + 0x010203);
    }

    #[test]
    fn encode_is_parse_inverse() {
        let h = Head {
            len: MAX_FRAME_LEN,
            ty: FrameType(0xfe),
            flags: 0xa5,
            stream_id: 7,
        };
        let mut out = Vec::new();
        h.encode(&mut out);
        assert_eq!(out, [0xff, 0xff, 0xff, 0xfe, 0xa5, 0, 0, 0, 7]);
        assert_eq!(Head::parse(&h.to_bytes()), h);
    }

    #[test]
    fn encode_drops_reserved_bit() {
        let h = Head {
            len: 0,
            ty: FrameType::PING,
            flags: 0,
            stream_id: 0x8000_0001,
        };
        assert_eq!(h.to_bytes()[5..], [0, 0, 0, 1]);
    }

    #[test]
    #[should_panic(expected = "24-bit length")]
    fn encode_rejects_oversized_length() {
        let h = Head {
            len: MAX_FRAME_LEN + 1,
            ty: FrameType::DATA,
            flags: 0,
            stream_id: 1,
        };
        h.encode(&mut Vec::new());
    }

    #[test]
    fn frame_type_names() {
        assert_eq!(format!("{:?}", FrameType::WINDOW_UPDATE), "WINDOW_UPDATE");
        assert_eq!(FrameType::CONTINUATION.to_string(), "CONTINUATION");
        assert_eq!(format!("{:?}", FrameType(0xb)), "FrameType(0xb)");
        assert_eq!(FrameType(0xa).name(), None);
    }
}
