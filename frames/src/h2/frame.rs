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
mod tests;
