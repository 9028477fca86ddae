//! Typed HTTP/2 frames borrowing from the receive buffer: validation
//! ([`Frame::load`]) and byte-exact encoding ([`Frame::encode`]).
//!
//! [`Frame::load`] checks everything RFC 9113 §6 says about one frame in
//! isolation — stream id 0 or not, fixed payload sizes, padding, priority
//! self-dependency, WINDOW_UPDATE increments, SETTINGS values — and reports
//! it as an [`Error`] whose [`Error::h2`] gives the exact error code and
//! scope. Rules that need connection state (CONTINUATION sequencing, stream
//! states, PUSH_PROMISE sent to a server, stream id parity and ordering)
//! belong to the connection; [`Frame::stream_id`] and friends make them
//! cheap to apply.
//!
//! Decoding is zero-copy: data, field block fragments and GOAWAY debug data
//! are slices of the payload, with padding stripped but its length kept, so
//! that [`Frame::encode`] reproduces the frame byte for byte (padding is
//! written as zeros, which is what RFC 9113 requires senders to send;
//! non-zero padding is accepted on receipt, which the RFC allows).
//!
//! Unknown frame types come back as [`Frame::Unknown`] and flags a type does
//! not define are ignored, as RFC 9113 §4.1 and §5.5 require.

use bytes::BufMut;

use super::head::{FrameType, Head, STREAM_ID_MASK, flags};
use super::settings::SettingsParams;
use crate::codes::Reason;
use crate::error::Error;

/// Stream prioritisation fields of HEADERS and PRIORITY frames (RFC 9113
/// §5.3.2, deprecated but still on the wire).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Priority {
    /// The stream this one depends on (31 bits).
    pub dependency: u32,
    /// Exclusive flag (the top bit of the dependency field).
    pub exclusive: bool,
    /// The Weight field as sent: the effective weight is `weight + 1`.
    pub weight: u8,
}

impl Priority {
    /// Encoded size: 4-byte dependency with the E bit, 1-byte weight.
    pub const LEN: usize = 5;

    /// Parses the 5 priority bytes.
    #[inline]
    fn parse(b: &[u8; Self::LEN]) -> Self {
        let [d0, d1, d2, d3, weight] = *b;
        let dep = u32::from_be_bytes([d0, d1, d2, d3]);
        Self {
            dependency: dep & STREAM_ID_MASK,
            exclusive: dep & !STREAM_ID_MASK != 0,
            weight,
        }
    }

    /// The 5 priority bytes.
    #[inline]
    fn to_bytes(self) -> [u8; Self::LEN] {
        let e = if self.exclusive { !STREAM_ID_MASK } else { 0 };
        let [d0, d1, d2, d3] = ((self.dependency & STREAM_ID_MASK) | e).to_be_bytes();
        [d0, d1, d2, d3, self.weight]
    }
}

/// One HTTP/2 frame, borrowing its variable-length parts from the input.
///
/// Fields are exactly what is needed to re-encode the frame; flags a frame
/// type does not define and reserved bits are not kept (they must be
/// ignored on receipt and sent as zero).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Frame<'a> {
    /// DATA (§6.1).
    Data {
        /// Stream id (never 0).
        stream_id: u32,
        /// END_STREAM flag.
        end_stream: bool,
        /// Payload with the Pad Length field and padding removed.
        data: &'a [u8],
        /// Padding length if the PADDED flag was set (`Some(0)` is one
        /// Pad Length byte and no padding). Padding counts against flow
        /// control: see [`Frame::flow_controlled_len`].
        pad_len: Option<u8>,
    },
    /// HEADERS (§6.2).
    Headers {
        /// Stream id (never 0).
        stream_id: u32,
        /// END_STREAM flag.
        end_stream: bool,
        /// END_HEADERS flag: `false` means CONTINUATION frames follow.
        end_headers: bool,
        /// Priority fields if the PRIORITY flag was set.
        priority: Option<Priority>,
        /// Padding length if the PADDED flag was set.
        pad_len: Option<u8>,
        /// Field block fragment (HPACK), padding removed.
        fragment: &'a [u8],
    },
    /// PRIORITY (§6.3).
    Priority {
        /// Stream id (never 0).
        stream_id: u32,
        /// The priority fields.
        priority: Priority,
    },
    /// RST_STREAM (§6.4).
    RstStream {
        /// Stream id (never 0).
        stream_id: u32,
        /// Error code.
        reason: Reason,
    },
    /// SETTINGS (§6.5), always on stream 0.
    Settings {
        /// ACK flag (then `params` is empty).
        ack: bool,
        /// The validated parameters (empty when `ack` is set; encoding an
        /// ACK with parameters produces a frame the peer must reject).
        params: SettingsParams<'a>,
    },
    /// PUSH_PROMISE (§6.6).
    PushPromise {
        /// Stream id of the associated request (never 0).
        stream_id: u32,
        /// END_HEADERS flag.
        end_headers: bool,
        /// The reserved stream (31 bits; its validity is connection state).
        promised_id: u32,
        /// Padding length if the PADDED flag was set.
        pad_len: Option<u8>,
        /// Field block fragment, padding removed.
        fragment: &'a [u8],
    },
    /// PING (§6.7), always on stream 0.
    Ping {
        /// ACK flag.
        ack: bool,
        /// Opaque data, echoed in the ACK.
        payload: [u8; 8],
    },
    /// GOAWAY (§6.8), always on stream 0.
    GoAway {
        /// Highest peer-initiated stream that was or may be processed.
        last_stream_id: u32,
        /// Error code.
        reason: Reason,
        /// Opaque diagnostic data.
        debug_data: &'a [u8],
    },
    /// WINDOW_UPDATE (§6.9); stream 0 is the connection window.
    WindowUpdate {
        /// Stream id, 0 for the connection.
        stream_id: u32,
        /// Window increment, 1 ..= 2^31 - 1.
        increment: u32,
    },
    /// CONTINUATION (§6.10).
    Continuation {
        /// Stream id (never 0).
        stream_id: u32,
        /// END_HEADERS flag.
        end_headers: bool,
        /// Field block fragment.
        fragment: &'a [u8],
    },
    /// A frame of a type this crate does not know, to be skipped.
    Unknown {
        /// The header as received.
        head: Head,
        /// The whole payload.
        payload: &'a [u8],
    },
}

impl<'a> Frame<'a> {
    /// Validates and types one frame given its header and complete payload.
    ///
    /// `head.len` is not consulted: `payload` is the payload. The size limit
    /// (SETTINGS_MAX_FRAME_SIZE) is checked by [`decode`](super::decode),
    /// not here. See the module docs for what is and is not validated.
    ///
    /// Kept non-generic and out of line so the per-type loaders inline into
    /// one function that is compiled once.
    #[inline(never)]
    pub fn load(head: Head, payload: &'a [u8]) -> Result<Self, Error> {
        match head.ty {
            FrameType::DATA => load_data(head, payload),
            FrameType::HEADERS => load_headers(head, payload, true),
            FrameType::PRIORITY => load_priority(head, payload),
            FrameType::RST_STREAM => load_rst_stream(head, payload),
            FrameType::SETTINGS => load_settings(head, payload),
            FrameType::PUSH_PROMISE => load_push_promise(head, payload),
            FrameType::PING => load_ping(head, payload),
            FrameType::GOAWAY => load_goaway(head, payload),
            FrameType::WINDOW_UPDATE => load_window_update(head, payload),
            FrameType::CONTINUATION => load_continuation(head, payload),
            _ => Ok(Self::Unknown { head, payload }),
        }
    }

    /// Like [`Frame::load`] for a HEADERS frame, but accepts a stream that
    /// depends on itself.
    ///
    /// For the one case where the connection needs a frame that `load`
    /// rejects: [`Error::SelfDependency`] on HEADERS is a *stream* error,
    /// yet its field block must still be decompressed to keep the HPACK
    /// state in sync (RFC 9113 §4.3), and END_HEADERS still decides whether
    /// CONTINUATION frames follow. Every other check still applies; other
    /// frame types behave exactly as in `load`.
    pub fn load_allowing_self_dependency(head: Head, payload: &'a [u8]) -> Result<Self, Error> {
        if head.ty == FrameType::HEADERS {
            load_headers(head, payload, false)
        } else {
            Self::load(head, payload)
        }
    }

    /// The frame's type.
    pub fn frame_type(&self) -> FrameType {
        match self {
            Self::Data { .. } => FrameType::DATA,
            Self::Headers { .. } => FrameType::HEADERS,
            Self::Priority { .. } => FrameType::PRIORITY,
            Self::RstStream { .. } => FrameType::RST_STREAM,
            Self::Settings { .. } => FrameType::SETTINGS,
            Self::PushPromise { .. } => FrameType::PUSH_PROMISE,
            Self::Ping { .. } => FrameType::PING,
            Self::GoAway { .. } => FrameType::GOAWAY,
            Self::WindowUpdate { .. } => FrameType::WINDOW_UPDATE,
            Self::Continuation { .. } => FrameType::CONTINUATION,
            Self::Unknown { head, .. } => head.ty,
        }
    }

    /// The stream the frame is on; 0 for connection-level frames.
    pub fn stream_id(&self) -> u32 {
        match *self {
            Self::Data { stream_id, .. }
            | Self::Headers { stream_id, .. }
            | Self::Priority { stream_id, .. }
            | Self::RstStream { stream_id, .. }
            | Self::PushPromise { stream_id, .. }
            | Self::WindowUpdate { stream_id, .. }
            | Self::Continuation { stream_id, .. } => stream_id,
            Self::Settings { .. } | Self::Ping { .. } | Self::GoAway { .. } => 0,
            Self::Unknown { head, .. } => head.stream_id,
        }
    }

    /// END_STREAM of DATA and HEADERS; `false` for other types.
    pub fn is_end_stream(&self) -> bool {
        match *self {
            Self::Data { end_stream, .. } | Self::Headers { end_stream, .. } => end_stream,
            _ => false,
        }
    }

    /// The bytes this frame counts against flow-control windows: the whole
    /// DATA payload including the Pad Length field and padding (RFC 9113
    /// §6.1); 0 for every other type.
    pub fn flow_controlled_len(&self) -> u32 {
        match *self {
            Self::Data { data, pad_len, .. } => len_u32(data.len() + padding_len(pad_len)),
            _ => 0,
        }
    }

    /// The header [`Frame::encode`] writes: payload length, type, the flags
    /// the fields imply, and stream id.
    pub fn head(&self) -> Head {
        let (ty, stream_id) = (self.frame_type(), self.stream_id());
        let (flags, len) = match *self {
            Self::Data {
                end_stream,
                data,
                pad_len,
                ..
            } => (
                flag(end_stream, flags::END_STREAM) | flag(pad_len.is_some(), flags::PADDED),
                data.len() + padding_len(pad_len),
            ),
            Self::Headers {
                end_stream,
                end_headers,
                priority,
                pad_len,
                fragment,
                ..
            } => (
                flag(end_stream, flags::END_STREAM)
                    | flag(end_headers, flags::END_HEADERS)
                    | flag(pad_len.is_some(), flags::PADDED)
                    | flag(priority.is_some(), flags::PRIORITY),
                fragment.len() + padding_len(pad_len) + priority.map_or(0, |_| Priority::LEN),
            ),
            Self::Priority { .. } => (0, Priority::LEN),
            Self::RstStream { .. } | Self::WindowUpdate { .. } => (0, 4),
            Self::Settings { ack, params } => (flag(ack, flags::ACK), params.as_bytes().len()),
            Self::PushPromise {
                end_headers,
                pad_len,
                fragment,
                ..
            } => (
                flag(end_headers, flags::END_HEADERS) | flag(pad_len.is_some(), flags::PADDED),
                4 + fragment.len() + padding_len(pad_len),
            ),
            Self::Ping { ack, .. } => (flag(ack, flags::ACK), 8),
            Self::GoAway { debug_data, .. } => (0, 8 + debug_data.len()),
            Self::Continuation {
                end_headers,
                fragment,
                ..
            } => (flag(end_headers, flags::END_HEADERS), fragment.len()),
            Self::Unknown { head, payload } => (head.flags, payload.len()),
        };
        Head {
            len: len_u32(len),
            ty,
            flags,
            stream_id,
        }
    }

    /// Bytes [`Frame::encode`] writes (header plus payload).
    pub fn encoded_len(&self) -> usize {
        self.head().frame_len()
    }

    /// Writes the frame. Decoding the output gives back an equal frame, and
    /// a frame decoded from the wire is reproduced byte for byte (as long as
    /// its padding was zero and it set no undefined flags or reserved bits).
    ///
    /// # Panics
    /// If the payload would exceed 2^24 - 1 bytes (see [`Head::encode`]).
    pub fn encode<B: BufMut + ?Sized>(&self, dst: &mut B) {
        self.head().encode(dst);
        match *self {
            Self::Data { data, pad_len, .. } => {
                put_padded(dst, pad_len, |dst| dst.put_slice(data));
            }
            Self::Headers {
                priority,
                pad_len,
                fragment,
                ..
            } => {
                put_padded(dst, pad_len, |dst| {
                    if let Some(p) = priority {
                        dst.put_slice(&p.to_bytes());
                    }
                    dst.put_slice(fragment);
                });
            }
            Self::Priority { priority, .. } => dst.put_slice(&priority.to_bytes()),
            Self::RstStream { reason, .. } => dst.put_u32(reason.0),
            Self::Settings { params, .. } => dst.put_slice(params.as_bytes()),
            Self::PushPromise {
                promised_id,
                pad_len,
                fragment,
                ..
            } => {
                put_padded(dst, pad_len, |dst| {
                    dst.put_u32(promised_id & STREAM_ID_MASK);
                    dst.put_slice(fragment);
                });
            }
            Self::Ping { payload, .. } => dst.put_slice(&payload),
            Self::GoAway {
                last_stream_id,
                reason,
                debug_data,
            } => {
                dst.put_u32(last_stream_id & STREAM_ID_MASK);
                dst.put_u32(reason.0);
                dst.put_slice(debug_data);
            }
            Self::WindowUpdate { increment, .. } => dst.put_u32(increment & STREAM_ID_MASK),
            Self::Continuation { fragment, .. } => dst.put_slice(fragment),
            Self::Unknown { payload, .. } => dst.put_slice(payload),
        }
    }
}

/// `bit` if `on`, else 0.
#[inline]
fn flag(on: bool, bit: u8) -> u8 {
    if on { bit } else { 0 }
}

/// Payload bytes that padding occupies: the Pad Length byte plus padding.
#[inline]
fn padding_len(pad_len: Option<u8>) -> usize {
    pad_len.map_or(0, |p| 1 + usize::from(p))
}

/// Saturating `usize` → `u32` for lengths (decoded payloads always fit).
#[inline]
pub(crate) fn len_u32(len: usize) -> u32 {
    u32::try_from(len).unwrap_or(u32::MAX)
}

/// Writes the Pad Length field, the body, and zero padding.
#[inline]
fn put_padded<B: BufMut + ?Sized>(dst: &mut B, pad_len: Option<u8>, body: impl FnOnce(&mut B)) {
    if let Some(p) = pad_len {
        dst.put_u8(p);
    }
    body(dst);
    if let Some(p) = pad_len {
        dst.put_bytes(0, usize::from(p));
    }
}

/// The frame's stream id, or [`Error::StreamIdRequired`] if it is 0.
#[inline]
fn require_stream(head: &Head) -> Result<u32, Error> {
    match head.stream_id {
        0 => Err(Error::StreamIdRequired { ty: head.ty.0 }),
        id => Ok(id),
    }
}

/// [`Error::StreamIdForbidden`] unless the frame is on stream 0.
#[inline]
fn forbid_stream(head: &Head) -> Result<(), Error> {
    match head.stream_id {
        0 => Ok(()),
        stream_id => Err(Error::StreamIdForbidden {
            ty: head.ty.0,
            stream_id,
        }),
    }
}

/// The frame-size error for this frame.
#[inline]
fn bad_size(head: &Head, payload: &[u8]) -> Error {
    Error::BadFrameSize {
        ty: head.ty.0,
        len: len_u32(payload.len()),
        stream_id: head.stream_id,
    }
}

/// A payload of exactly `N` bytes, or a frame-size error.
#[inline]
fn exact<'p, const N: usize>(head: &Head, payload: &'p [u8]) -> Result<&'p [u8; N], Error> {
    payload.try_into().map_err(|_| bad_size(head, payload))
}

/// A padded payload taken apart by [`split_padded`].
struct Padded<'p, const FIXED: usize> {
    /// Pad Length field, if the PADDED flag is set.
    pad_len: Option<u8>,
    /// The mandatory fields after the Pad Length.
    fixed: &'p [u8; FIXED],
    /// What lies between the mandatory fields and the padding.
    body: &'p [u8],
}

/// Splits a (possibly padded) payload into the Pad Length, `FIXED` bytes of
/// mandatory fields that follow it, and the body between them and the
/// padding.
///
/// A payload too short for the Pad Length and mandatory fields is a frame
/// size error; padding that does not fit what remains is a protocol error
/// (RFC 9113 §6.1, §6.2, §6.6). Checking the mandatory fields first makes
/// that distinction exact for HEADERS with PRIORITY and for PUSH_PROMISE.
#[inline]
fn split_padded<'p, const FIXED: usize>(
    head: &Head,
    payload: &'p [u8],
) -> Result<Padded<'p, FIXED>, Error> {
    let (pad_len, rest) = if head.has(flags::PADDED) {
        let (&p, rest) = payload
            .split_first()
            .ok_or_else(|| bad_size(head, payload))?;
        (Some(p), rest)
    } else {
        (None, payload)
    };
    let (fixed, rest) = rest
        .split_first_chunk::<FIXED>()
        .ok_or_else(|| bad_size(head, payload))?;
    let pad = pad_len.map_or(0, usize::from);
    let body_len = rest.len().checked_sub(pad).ok_or(Error::PaddingTooLong {
        ty: head.ty.0,
        pad_len: pad_len.unwrap_or(0),
        len: len_u32(payload.len()),
    })?;
    let (body, _padding) = rest.split_at(body_len);
    Ok(Padded {
        pad_len,
        fixed,
        body,
    })
}

/// DATA (§6.1): on a stream, optionally padded.
#[inline]
fn load_data(head: Head, payload: &[u8]) -> Result<Frame<'_>, Error> {
    let stream_id = require_stream(&head)?;
    let Padded {
        pad_len,
        body: data,
        ..
    } = split_padded::<0>(&head, payload)?;
    Ok(Frame::Data {
        stream_id,
        end_stream: head.has(flags::END_STREAM),
        data,
        pad_len,
    })
}

/// HEADERS (§6.2): on a stream, optionally padded and with priority fields.
#[inline]
fn load_headers(head: Head, payload: &[u8], check_dependency: bool) -> Result<Frame<'_>, Error> {
    let stream_id = require_stream(&head)?;
    let (pad_len, priority, fragment) = if head.has(flags::PRIORITY) {
        let p = split_padded::<{ Priority::LEN }>(&head, payload)?;
        (p.pad_len, Some(Priority::parse(p.fixed)), p.body)
    } else {
        let p = split_padded::<0>(&head, payload)?;
        (p.pad_len, None, p.body)
    };
    if check_dependency && priority.is_some_and(|p| p.dependency == stream_id) {
        return Err(Error::SelfDependency { stream_id });
    }
    Ok(Frame::Headers {
        stream_id,
        end_stream: head.has(flags::END_STREAM),
        end_headers: head.has(flags::END_HEADERS),
        priority,
        pad_len,
        fragment,
    })
}

/// PRIORITY (§6.3): on a stream, exactly 5 bytes (a *stream* error otherwise).
#[inline]
fn load_priority(head: Head, payload: &[u8]) -> Result<Frame<'_>, Error> {
    let stream_id = require_stream(&head)?;
    let priority = Priority::parse(exact(&head, payload)?);
    if priority.dependency == stream_id {
        return Err(Error::SelfDependency { stream_id });
    }
    Ok(Frame::Priority {
        stream_id,
        priority,
    })
}

/// RST_STREAM (§6.4): on a stream, exactly 4 bytes.
#[inline]
fn load_rst_stream(head: Head, payload: &[u8]) -> Result<Frame<'_>, Error> {
    let stream_id = require_stream(&head)?;
    let reason = Reason(u32::from_be_bytes(*exact(&head, payload)?));
    Ok(Frame::RstStream { stream_id, reason })
}

/// SETTINGS (§6.5): stream 0; an ACK is empty, otherwise a multiple of 6
/// bytes with valid values.
#[inline]
fn load_settings(head: Head, payload: &[u8]) -> Result<Frame<'_>, Error> {
    forbid_stream(&head)?;
    let ack = head.has(flags::ACK);
    if ack && !payload.is_empty() {
        return Err(bad_size(&head, payload));
    }
    let params = SettingsParams::new(payload)?;
    Ok(Frame::Settings { ack, params })
}

/// PUSH_PROMISE (§6.6): on a stream, optionally padded, 4-byte promised id.
#[inline]
fn load_push_promise(head: Head, payload: &[u8]) -> Result<Frame<'_>, Error> {
    let stream_id = require_stream(&head)?;
    let p = split_padded::<4>(&head, payload)?;
    Ok(Frame::PushPromise {
        stream_id,
        end_headers: head.has(flags::END_HEADERS),
        promised_id: u32::from_be_bytes(*p.fixed) & STREAM_ID_MASK,
        pad_len: p.pad_len,
        fragment: p.body,
    })
}

/// PING (§6.7): stream 0, exactly 8 bytes.
#[inline]
fn load_ping(head: Head, payload: &[u8]) -> Result<Frame<'_>, Error> {
    forbid_stream(&head)?;
    let payload = *exact(&head, payload)?;
    Ok(Frame::Ping {
        ack: head.has(flags::ACK),
        payload,
    })
}

/// GOAWAY (§6.8): stream 0, at least 8 bytes.
#[inline]
fn load_goaway(head: Head, payload: &[u8]) -> Result<Frame<'_>, Error> {
    forbid_stream(&head)?;
    let (fixed, debug_data) = payload
        .split_first_chunk::<8>()
        .ok_or_else(|| bad_size(&head, payload))?;
    let [l0, l1, l2, l3, r0, r1, r2, r3] = *fixed;
    Ok(Frame::GoAway {
        last_stream_id: u32::from_be_bytes([l0, l1, l2, l3]) & STREAM_ID_MASK,
        reason: Reason(u32::from_be_bytes([r0, r1, r2, r3])),
        debug_data,
    })
}

/// WINDOW_UPDATE (§6.9): any stream, exactly 4 bytes, increment ≠ 0.
#[inline]
fn load_window_update(head: Head, payload: &[u8]) -> Result<Frame<'_>, Error> {
    let increment = u32::from_be_bytes(*exact(&head, payload)?) & STREAM_ID_MASK;
    let stream_id = head.stream_id;
    if increment == 0 {
        return Err(Error::ZeroWindowIncrement { stream_id });
    }
    Ok(Frame::WindowUpdate {
        stream_id,
        increment,
    })
}

/// CONTINUATION (§6.10): on a stream.
#[inline]
fn load_continuation(head: Head, payload: &[u8]) -> Result<Frame<'_>, Error> {
    let stream_id = require_stream(&head)?;
    Ok(Frame::Continuation {
        stream_id,
        end_headers: head.has(flags::END_HEADERS),
        fragment: payload,
    })
}

#[cfg(test)]
mod tests {
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
}
