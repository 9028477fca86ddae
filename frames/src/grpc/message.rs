//! Length-prefixed messages: the 5-byte prefix and the [`Deframer`] that
//! reassembles messages from HTTP/2 DATA payloads.
//!
//! On the wire every gRPC message is `flag:u8 len:u32be body[len]`. DATA
//! frame boundaries have no relation to message boundaries: one DATA payload
//! may hold several messages, a message may span many DATA frames, and even
//! the 5-byte prefix may be split.
//!
//! ## Design of the deframer
//! The deframer is a three-state machine (idle, partial prefix, partial
//! body) fed one DATA payload (`Bytes`) at a time:
//! - A message whose body lies entirely inside the current chunk is returned
//!   as a zero-copy `Bytes` slice of that chunk (no allocation, no copy).
//!   This is the common case: grpc-go writes the prefix and body of a
//!   message into consecutive DATA frames of up to 16 KiB.
//! - Otherwise the body is copied into a `BytesMut` allocated once, after the
//!   size check, for exactly the declared length; when complete it is frozen
//!   and returned without a further copy. Like grpc-go, the whole declared
//!   length is reserved up front: callers doing memory accounting should use
//!   [`Deframer::reserved`], not only [`Deframer::buffered`].
//! - Errors are sticky: after one, the stream is unusable and every later
//!   call returns the same error.

use bytes::{Buf, BufMut, Bytes, BytesMut};

use crate::Error;

/// Length of the message prefix: 1 flag byte plus a 4-byte big-endian length.
pub const PREFIX_LEN: usize = 5;

/// grpc-go's default maximum size of a received message, 4 MiB
/// (`defaultServerMaxReceiveMessageSize`, also the client default). Go peers
/// reject anything larger with `RESOURCE_EXHAUSTED`.
pub const DEFAULT_MAX_RECV_MESSAGE_SIZE: u32 = 4 * 1024 * 1024;

/// A decoded 5-byte message prefix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MessageHeader {
    /// The compressed flag (prefix byte 0 equal to 1).
    pub compressed: bool,
    /// The declared body length.
    pub len: u32,
}

/// Decodes a message prefix from the start of `buf`.
///
/// Returns `Ok(None)` if `buf` holds fewer than [`PREFIX_LEN`] bytes. The
/// length is checked against `max_len` (a length equal to `max_len` is
/// allowed) before the flag, in the order grpc-go checks them, so an
/// oversized message is reported as
/// [`GrpcMessageTooLarge`](Error::GrpcMessageTooLarge) (`RESOURCE_EXHAUSTED`)
/// whatever its flag. A flag byte above 1 is
/// [`GrpcBadCompressedFlag`](Error::GrpcBadCompressedFlag); flag 1 is
/// reported in [`MessageHeader::compressed`] and left to the caller.
pub fn decode_prefix(buf: &[u8], max_len: u32) -> Result<Option<MessageHeader>, Error> {
    match buf.first_chunk::<PREFIX_LEN>() {
        Some(prefix) => parse_prefix(prefix, max_len).map(Some),
        None => Ok(None),
    }
}

/// Writes an uncompressed message prefix (flag 0, `len` big-endian).
pub fn encode_prefix(len: u32, dst: &mut impl BufMut) {
    dst.put_u8(0);
    dst.put_u32(len);
}

fn parse_prefix(prefix: &[u8; PREFIX_LEN], max_len: u32) -> Result<MessageHeader, Error> {
    let [flag, l0, l1, l2, l3] = *prefix;
    let len = u32::from_be_bytes([l0, l1, l2, l3]);
    if len > max_len {
        return Err(Error::GrpcMessageTooLarge { len, max: max_len });
    }
    let compressed = match flag {
        0 => false,
        1 => true,
        _ => return Err(Error::GrpcBadCompressedFlag { flag }),
    };
    Ok(MessageHeader { compressed, len })
}

/// Where the deframer is between two calls.
#[derive(Debug)]
enum State {
    /// At a message boundary, nothing buffered.
    Idle,
    /// `have` (1 to 4) bytes of the next prefix are in `prefix`.
    Prefix {
        prefix: [u8; PREFIX_LEN],
        have: usize,
    },
    /// Accumulating a body of `len` bytes; `body` was allocated with
    /// capacity `len` and holds the bytes received so far.
    Body { body: BytesMut, len: usize },
    /// An error was returned; the stream must be abandoned.
    Failed(Error),
}

/// Incremental reassembly of length-prefixed messages from the DATA payloads
/// of one gRPC stream.
///
/// Feed each DATA payload with [`next`](Self::next), calling it again while
/// it returns `Ok(Some(_))`; `Ok(None)` means the chunk is used up. At
/// END_STREAM call [`finish`](Self::finish).
///
/// ```
/// use bytes::Bytes;
/// use konn_frames::grpc::{DEFAULT_MAX_RECV_MESSAGE_SIZE, Deframer};
///
/// let mut d = Deframer::new(DEFAULT_MAX_RECV_MESSAGE_SIZE);
/// let mut chunk = Bytes::from_static(b"\0\0\0\0\x02hi\0\0");
/// assert_eq!(d.next(&mut chunk).unwrap().as_deref(), Some(&b"hi"[..]));
/// assert_eq!(d.next(&mut chunk).unwrap(), None); // half a prefix is pending
/// let mut chunk = Bytes::from_static(b"\0\0\0");
/// assert_eq!(d.next(&mut chunk).unwrap().as_deref(), Some(&b""[..]));
/// d.finish().unwrap();
/// ```
#[derive(Debug)]
pub struct Deframer {
    max_len: u32,
    state: State,
}

impl Deframer {
    /// A deframer that rejects messages longer than `max_len` bytes
    /// (typically [`DEFAULT_MAX_RECV_MESSAGE_SIZE`]).
    pub fn new(max_len: u32) -> Self {
        Self {
            max_len,
            state: State::Idle,
        }
    }

    /// The receive limit this deframer enforces.
    pub fn max_len(&self) -> u32 {
        self.max_len
    }

    /// Takes the next complete message out of `chunk`.
    ///
    /// Consumes bytes from the front of `chunk`. Returns `Ok(Some(message))`
    /// when a message is complete (`chunk` may hold more: call again), and
    /// `Ok(None)` once `chunk` is empty with no message complete. A message
    /// whose body lies inside `chunk` is a zero-copy slice of it.
    ///
    /// # Errors
    /// [`GrpcMessageTooLarge`](Error::GrpcMessageTooLarge),
    /// [`GrpcBadCompressedFlag`](Error::GrpcBadCompressedFlag) or
    /// [`GrpcCompressed`](Error::GrpcCompressed), detected from the prefix
    /// before any body byte is buffered. A prefix that arrived whole in
    /// `chunk` is left in it; one split across chunks is partly consumed.
    /// Either way the stream must be abandoned: the deframer keeps
    /// returning the error.
    pub fn next(&mut self, chunk: &mut Bytes) -> Result<Option<Bytes>, Error> {
        match &mut self.state {
            State::Failed(err) => Err(*err),
            State::Idle => {
                if let Some(prefix) = chunk.first_chunk::<PREFIX_LEN>() {
                    let len = self.check_prefix(prefix)?;
                    chunk.advance(PREFIX_LEN);
                    Ok(self.start_body(len, chunk))
                } else {
                    // Fewer than 5 bytes (possibly none): keep them.
                    let mut prefix = [0; PREFIX_LEN];
                    let have = chunk.len();
                    if let Some(dst) = prefix.get_mut(..have) {
                        dst.copy_from_slice(chunk);
                        chunk.clear();
                        if have > 0 {
                            self.state = State::Prefix { prefix, have };
                        }
                    }
                    Ok(None)
                }
            }
            State::Prefix { prefix, have } => {
                let take = (PREFIX_LEN - *have).min(chunk.len());
                if let Some(dst) = prefix.get_mut(*have..*have + take) {
                    dst.copy_from_slice(chunk.get(..take).unwrap_or_default());
                }
                chunk.advance(take);
                *have += take;
                if *have < PREFIX_LEN {
                    return Ok(None);
                }
                let prefix = *prefix;
                let len = self.check_prefix(&prefix)?;
                self.state = State::Idle;
                Ok(self.start_body(len, chunk))
            }
            State::Body { body, len } => {
                let take = (*len - body.len()).min(chunk.len());
                body.extend_from_slice(chunk.get(..take).unwrap_or_default());
                chunk.advance(take);
                if body.len() < *len {
                    return Ok(None);
                }
                let message = core::mem::take(body).freeze();
                self.state = State::Idle;
                Ok(Some(message))
            }
        }
    }

    /// Checks that the stream ended at a message boundary (call it on
    /// END_STREAM).
    ///
    /// # Errors
    /// [`GrpcTruncatedMessage`](Error::GrpcTruncatedMessage) if part of a
    /// prefix or body is pending, or the error the deframer already failed
    /// with.
    pub fn finish(&self) -> Result<(), Error> {
        match &self.state {
            State::Idle => Ok(()),
            State::Prefix { .. } | State::Body { .. } => Err(Error::GrpcTruncatedMessage),
            State::Failed(err) => Err(*err),
        }
    }

    /// Bytes received and held for the message in progress (prefix bytes
    /// or body bytes), `0` at a message boundary.
    pub fn buffered(&self) -> usize {
        match &self.state {
            State::Prefix { have, .. } => *have,
            State::Body { body, .. } => body.len(),
            State::Idle | State::Failed(_) => 0,
        }
    }

    /// Bytes of heap memory held for the message in progress: the declared
    /// body length once a split body has started (it is reserved up front),
    /// `0` otherwise. This is the number to charge to a memory budget.
    pub fn reserved(&self) -> usize {
        match &self.state {
            State::Body { body, .. } => body.capacity(),
            State::Idle | State::Prefix { .. } | State::Failed(_) => 0,
        }
    }

    /// Validates a complete prefix; on error the deframer fails for good.
    fn check_prefix(&mut self, prefix: &[u8; PREFIX_LEN]) -> Result<usize, Error> {
        let result = parse_prefix(prefix, self.max_len).and_then(|h| {
            if h.compressed {
                Err(Error::GrpcCompressed)
            } else {
                Ok(h.len)
            }
        });
        match result {
            // A u32 always fits in usize on the 32- and 64-bit targets konn
            // supports; saturate rather than truncate anywhere else.
            Ok(len) => Ok(usize::try_from(len).unwrap_or(usize::MAX)),
            Err(err) => {
                self.state = State::Failed(err);
                Err(err)
            }
        }
    }

    /// Starts the body of a `len`-byte message whose prefix was consumed.
    fn start_body(&mut self, len: usize, chunk: &mut Bytes) -> Option<Bytes> {
        if chunk.len() >= len {
            // The whole body is here: hand out a slice, no copy.
            return Some(chunk.split_to(len));
        }
        // The size was checked against max_len, so this reservation is
        // bounded by the configured limit.
        let mut body = BytesMut::with_capacity(len);
        body.extend_from_slice(chunk);
        chunk.clear();
        self.state = State::Body { body, len };
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn frame(messages: &[&[u8]]) -> Vec<u8> {
        let mut out = Vec::new();
        for m in messages {
            encode_prefix(u32::try_from(m.len()).unwrap(), &mut out);
            out.extend_from_slice(m);
        }
        out
    }

    /// Feeds `chunks` one after the other, collecting every message.
    fn deframe_chunks(d: &mut Deframer, chunks: &[&[u8]]) -> Result<Vec<Bytes>, Error> {
        let mut out = Vec::new();
        for c in chunks {
            let mut chunk = Bytes::copy_from_slice(c);
            while let Some(m) = d.next(&mut chunk)? {
                out.push(m);
            }
            assert!(chunk.is_empty(), "Ok(None) must mean the chunk is used up");
        }
        Ok(out)
    }

    #[test]
    fn prefix_round_trip_and_limits() {
        let mut buf = Vec::new();
        encode_prefix(0x0102_0304, &mut buf);
        assert_eq!(buf, [0, 1, 2, 3, 4]);
        assert_eq!(
            decode_prefix(&buf, u32::MAX),
            Ok(Some(MessageHeader {
                compressed: false,
                len: 0x0102_0304
            }))
        );
        assert_eq!(decode_prefix(&buf[..4], u32::MAX), Ok(None));
        assert_eq!(decode_prefix(&[], 0), Ok(None));
        assert_eq!(
            decode_prefix(&buf, 0x0102_0303),
            Err(Error::GrpcMessageTooLarge {
                len: 0x0102_0304,
                max: 0x0102_0303
            })
        );
        // Exactly the limit is allowed, as in grpc-go (`length > max` fails).
        assert!(decode_prefix(&buf, 0x0102_0304).unwrap().is_some());
    }

    #[test]
    fn prefix_flags() {
        assert_eq!(
            decode_prefix(&[1, 0, 0, 0, 9], 100),
            Ok(Some(MessageHeader {
                compressed: true,
                len: 9
            }))
        );
        assert_eq!(
            decode_prefix(&[2, 0, 0, 0, 9], 100),
            Err(Error::GrpcBadCompressedFlag { flag: 2 })
        );
        assert_eq!(
            decode_prefix(&[0x16, 3, 1, 2, 0], 100),
            Err(Error::GrpcMessageTooLarge {
                len: 0x0301_0200,
                max: 100
            }),
            "the size is checked before the flag, as grpc-go does"
        );
    }

    #[test]
    fn default_limit_is_grpc_go_4_mib() {
        assert_eq!(DEFAULT_MAX_RECV_MESSAGE_SIZE, 4_194_304);
    }

    #[test]
    fn whole_message_in_chunk_is_zero_copy() {
        let data = Bytes::from(frame(&[b"hello", b"world!"]));
        let base = data.as_ptr() as usize;
        let mut chunk = data.clone();
        let mut d = Deframer::new(1024);
        let a = d.next(&mut chunk).unwrap().unwrap();
        let b = d.next(&mut chunk).unwrap().unwrap();
        assert_eq!((&a[..], &b[..]), (&b"hello"[..], &b"world!"[..]));
        assert_eq!(
            a.as_ptr() as usize,
            base + 5,
            "first message must alias the chunk"
        );
        assert_eq!(
            b.as_ptr() as usize,
            base + 15,
            "second message must alias the chunk"
        );
        assert_eq!(d.next(&mut chunk), Ok(None));
        assert_eq!(d.reserved(), 0);
        d.finish().unwrap();
    }

    #[test]
    fn split_prefix_then_whole_body_is_zero_copy() {
        let data = frame(&[b"abcdef"]);
        let mut d = Deframer::new(1024);
        let mut first = Bytes::copy_from_slice(&data[..2]);
        assert_eq!(d.next(&mut first), Ok(None));
        assert_eq!(d.buffered(), 2);
        let second = Bytes::copy_from_slice(&data[2..]);
        let base = second.as_ptr() as usize;
        let mut chunk = second.clone();
        let m = d.next(&mut chunk).unwrap().unwrap();
        assert_eq!(&m[..], b"abcdef");
        assert_eq!(
            m.as_ptr() as usize,
            base + 3,
            "body must alias the second chunk"
        );
        assert_eq!(d.buffered(), 0);
    }

    #[test]
    fn split_body_is_copied_into_exact_reservation() {
        let data = frame(&[&[7u8; 100]]);
        let mut d = Deframer::new(1024);
        let mut c = Bytes::copy_from_slice(&data[..30]);
        assert_eq!(d.next(&mut c), Ok(None));
        assert_eq!(d.buffered(), 25);
        assert_eq!(d.reserved(), 100);
        assert_eq!(d.finish(), Err(Error::GrpcTruncatedMessage));
        let mut c = Bytes::copy_from_slice(&data[30..]);
        let m = d.next(&mut c).unwrap().unwrap();
        assert_eq!(&m[..], &[7u8; 100][..]);
        assert_eq!((d.buffered(), d.reserved()), (0, 0));
        d.finish().unwrap();
    }

    #[test]
    fn zero_length_messages() {
        let data = frame(&[b"", b"x", b""]);
        let mut d = Deframer::new(0);
        assert_eq!(
            deframe_chunks(&mut d, &[&data]),
            Err(Error::GrpcMessageTooLarge { len: 1, max: 0 })
        );
        let mut d = Deframer::new(1);
        let got = deframe_chunks(&mut d, &[&data]).unwrap();
        assert_eq!(got, [&b""[..], b"x", b""]);
        // A zero-length message whose prefix ends a chunk is returned at once.
        let mut d = Deframer::new(1);
        let got = deframe_chunks(&mut d, &[&data[..3], &data[3..5]]).unwrap();
        assert_eq!(got, [&b""[..]]);
        d.finish().unwrap();
    }

    #[test]
    fn byte_by_byte() {
        let msgs: [&[u8]; 4] = [b"a", b"", b"0123456789", b"zz"];
        let data = frame(&msgs);
        let chunks: Vec<&[u8]> = data.chunks(1).collect();
        let mut d = Deframer::new(64);
        assert_eq!(deframe_chunks(&mut d, &chunks).unwrap(), msgs);
        d.finish().unwrap();
    }

    #[test]
    fn empty_chunks_change_nothing() {
        let mut d = Deframer::new(64);
        assert_eq!(d.next(&mut Bytes::new()), Ok(None));
        let data = frame(&[b"abc"]);
        let got = deframe_chunks(&mut d, &[&data[..1], b"", &data[1..6], b"", &data[6..]]);
        assert_eq!(got.unwrap(), [&b"abc"[..]]);
    }

    #[test]
    fn too_large_is_detected_from_the_prefix_alone() {
        let mut d = Deframer::new(DEFAULT_MAX_RECV_MESSAGE_SIZE);
        // A 16 MiB message: only its prefix has arrived.
        let mut c = Bytes::from_static(&[0, 1, 0, 0, 0]);
        let err = Error::GrpcMessageTooLarge {
            len: 1 << 24,
            max: 4 << 20,
        };
        assert_eq!(d.next(&mut c), Err(err));
        assert_eq!(c.len(), 5, "the offending prefix is not consumed");
        assert_eq!(d.reserved(), 0, "nothing was reserved");
        // Sticky.
        assert_eq!(d.next(&mut Bytes::from_static(b"\0\0\0\0\0")), Err(err));
        assert_eq!(d.finish(), Err(err));
    }

    #[test]
    fn split_prefix_errors() {
        let mut d = Deframer::new(10);
        assert_eq!(
            deframe_chunks(&mut d, &[&[0, 0], &[0, 0, 11]]),
            Err(Error::GrpcMessageTooLarge { len: 11, max: 10 })
        );
        let mut d = Deframer::new(10);
        assert_eq!(
            deframe_chunks(&mut d, &[&[1, 0], &[0, 0, 1, 0xff]]),
            Err(Error::GrpcCompressed)
        );
        let mut d = Deframer::new(10);
        assert_eq!(
            deframe_chunks(&mut d, &[&[0xff, 0, 0, 0]]).map(|v| v.len()),
            Ok(0),
            "the flag cannot be judged before the prefix is complete"
        );
        assert_eq!(
            deframe_chunks(&mut d, &[&[1]]),
            Err(Error::GrpcBadCompressedFlag { flag: 0xff })
        );
    }

    #[test]
    fn compressed_message_is_rejected() {
        let mut d = Deframer::new(10);
        let mut c = Bytes::from_static(&[1, 0, 0, 0, 1, 0xaa]);
        assert_eq!(d.next(&mut c), Err(Error::GrpcCompressed));
        assert_eq!(
            Error::GrpcCompressed.grpc_status(),
            crate::GrpcStatus::UNIMPLEMENTED
        );
    }

    #[test]
    fn truncated_prefix_at_end_of_stream() {
        let mut d = Deframer::new(10);
        deframe_chunks(&mut d, &[&[0, 0, 0]]).unwrap();
        assert_eq!(d.buffered(), 3);
        assert_eq!(d.finish(), Err(Error::GrpcTruncatedMessage));
    }

    fn messages_and_cuts() -> impl Strategy<Value = (Vec<Vec<u8>>, Vec<usize>)> {
        let sizes = prop_oneof![3 => 0usize..40, 1 => 0usize..3000];
        let msgs = prop::collection::vec(
            sizes.prop_flat_map(|n| prop::collection::vec(any::<u8>(), n)),
            0..12,
        );
        (msgs, prop::collection::vec(any::<usize>(), 0..20))
    }

    proptest! {
        #[test]
        fn random_chunking_reproduces_messages((msgs, cuts) in messages_and_cuts()) {
            let refs: Vec<&[u8]> = msgs.iter().map(Vec::as_slice).collect();
            let data = frame(&refs);
            let mut points: Vec<usize> = cuts
                .iter()
                .map(|c| c % (data.len() + 1))
                .collect();
            points.push(0);
            points.push(data.len());
            points.sort_unstable();
            let chunks: Vec<&[u8]> = points.windows(2).map(|w| &data[w[0]..w[1]]).collect();
            let mut d = Deframer::new(3000);
            let got = deframe_chunks(&mut d, &chunks).unwrap();
            prop_assert_eq!(got.len(), msgs.len());
            for (g, m) in got.iter().zip(&msgs) {
                prop_assert_eq!(&g[..], &m[..]);
            }
            prop_assert_eq!(d.finish(), Ok(()));
            prop_assert_eq!(d.buffered(), 0);
        }

        #[test]
        fn truncation_is_always_detected((msgs, cut) in messages_and_cuts()) {
            let refs: Vec<&[u8]> = msgs.iter().map(Vec::as_slice).collect();
            let data = frame(&refs);
            prop_assume!(!data.is_empty());
            let end = cut.first().copied().unwrap_or(0) % data.len();
            let mut d = Deframer::new(3000);
            let got = deframe_chunks(&mut d, &[&data[..end]]).unwrap();
            // The cut is at a boundary exactly when the messages returned
            // so far account for every byte.
            let consumed: usize = got.iter().map(|m| m.len() + PREFIX_LEN).sum();
            prop_assert_eq!(d.finish().is_ok(), consumed == end);
        }
    }
}
