//! Per-stream state of the HTTP/2 connection: the RFC 9113 §5.1 state, the
//! flow-control windows, the send queue, and the table that maps stream ids
//! to streams.
//!
//! Idle streams are not stored: a stream exists from its first HEADERS until
//! it is closed in both directions *and* (for peer-initiated streams) the
//! application has released it. Keeping a reset stream until its handler is
//! done is what makes it count against MAX_CONCURRENT_STREAMS for as long as
//! it costs us work (the Rapid Reset defence, CVE-2023-44487).
//!
//! Closed streams leave a trace in [`ClosedRing`] so late frames can be told
//! apart from frames on never-opened ids (RFC 9113 §5.1: ignore frames after
//! our RST_STREAM, STREAM_CLOSED for frames after a normal close).

use std::collections::VecDeque;
use std::hash::{BuildHasherDefault, Hasher};

use bytes::Bytes;

use super::flow::{RecvWindow, SendWindow};
use super::headers::Headers;

/// RFC 9113 §5.1 stream states that konn stores (no push, so no "reserved").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum State {
    /// Both directions open.
    Open,
    /// We sent END_STREAM; the peer may still send.
    HalfClosedLocal,
    /// The peer sent END_STREAM; we may still send.
    HalfClosedRemote,
    /// Both directions done, or reset.
    Closed,
}

/// Something queued for sending on a stream, in wire order.
#[derive(Debug)]
pub(crate) enum SendItem {
    /// Initial headers (request or response).
    Headers { headers: Headers, end_stream: bool },
    /// Data; may be sent in several frames.
    Data { data: Bytes, end_stream: bool },
    /// Trailers (always END_STREAM).
    Trailers(Headers),
}

/// One stream.
#[derive(Debug)]
pub(crate) struct Stream {
    pub(crate) state: State,
    /// Opened by the peer (counts against our MAX_CONCURRENT_STREAMS).
    pub(crate) remote_initiated: bool,
    /// The application still owns the stream (peer-initiated streams only).
    pub(crate) app_held: bool,
    pub(crate) recv: RecvWindow,
    pub(crate) send: SendWindow,
    /// What waits to be sent; add with [`Stream::enqueue`].
    pub(crate) queue: VecDeque<SendItem>,
    /// Data bytes in `queue`.
    pub(crate) queued: usize,
    /// An item ending our side (END_STREAM or trailers) was queued: nothing
    /// may follow it. Kept as a flag so checking is O(1) per send.
    pub(crate) end_queued: bool,
    /// In the connection's ready list.
    pub(crate) in_ready: bool,
    /// The initial headers from the peer arrived (client: the final response).
    pub(crate) headers_received: bool,
    /// Declared `content-length` of what the peer sends, and bytes seen.
    pub(crate) content_length: Option<u64>,
    pub(crate) data_received: u64,
    /// Emit `Event::Writable` once `queued` falls to this many bytes.
    pub(crate) drain_notify: Option<usize>,
}

impl Stream {
    pub(crate) fn new(remote_initiated: bool, recv: RecvWindow, send: SendWindow) -> Self {
        Self {
            state: State::Open,
            remote_initiated,
            app_held: remote_initiated,
            recv,
            send,
            queue: VecDeque::new(),
            queued: 0,
            end_queued: false,
            in_ready: false,
            headers_received: false,
            content_length: None,
            data_received: 0,
            drain_notify: None,
        }
    }

    /// The peer may still send on this stream.
    pub(crate) fn recv_open(&self) -> bool {
        matches!(self.state, State::Open | State::HalfClosedLocal)
    }

    /// We may still queue sends on this stream.
    pub(crate) fn send_open(&self) -> bool {
        matches!(self.state, State::Open | State::HalfClosedRemote) && !self.end_queued
    }

    /// Queue `item` for sending (the caller checked [`Stream::send_open`]).
    pub(crate) fn enqueue(&mut self, item: SendItem) {
        match &item {
            SendItem::Headers { end_stream, .. } => self.end_queued |= *end_stream,
            SendItem::Data { data, end_stream } => {
                self.queued += data.len();
                self.end_queued |= *end_stream;
            }
            SendItem::Trailers(_) => self.end_queued = true,
        }
        self.queue.push_back(item);
    }

    /// The peer ended its side.
    pub(crate) fn close_remote(&mut self) {
        self.state = match self.state {
            State::Open => State::HalfClosedRemote,
            _ => State::Closed,
        };
    }

    /// We ended our side (END_STREAM written).
    pub(crate) fn close_local(&mut self) {
        self.state = match self.state {
            State::Open => State::HalfClosedLocal,
            _ => State::Closed,
        };
    }

    /// Nothing more will happen on the wire for this stream and the
    /// application is done with it: it can be forgotten.
    pub(crate) fn is_finished(&self) -> bool {
        self.state == State::Closed && !self.app_held
    }
}

/// Fast hasher for stream ids (odd/even u32s): one multiply.
#[derive(Default, Clone, Copy)]
pub(crate) struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8 | u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u32(&mut self, n: u32) {
        self.0 = u64::from(n).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

/// Stream table: a kube-apiserver dial's connection holds one stream.
pub(crate) type StreamMap = crate::maps::SmallMap<u32, Stream, BuildHasherDefault<IdHasher>>;

/// How a remembered stream was closed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Closed {
    /// We sent RST_STREAM: frames the peer had in flight are ignored.
    ResetByUs,
    /// Reset by the peer (or refused by its GOAWAY): further frames are a
    /// stream error STREAM_CLOSED.
    Other,
    /// Closed by END_STREAM in both directions: a further DATA or HEADERS
    /// frame is a connection error STREAM_CLOSED (RFC 9113 §5.1).
    Ended,
}

/// The most recently closed stream ids (bounded). It grows as streams
/// close, up to `cap`: a connection that closes one stream (a
/// kube-apiserver dial) holds one entry, not `cap`.
#[derive(Debug)]
pub(crate) struct ClosedRing {
    ids: VecDeque<(u32, Closed)>,
    cap: usize,
}

impl ClosedRing {
    pub(crate) fn new(cap: usize) -> Self {
        Self {
            ids: VecDeque::new(),
            cap,
        }
    }

    pub(crate) fn push(&mut self, id: u32, how: Closed) {
        if self.ids.len() == self.cap {
            self.ids.pop_front();
        }
        self.ids.push_back((id, how));
    }

    /// Ids remembered.
    pub(crate) fn len(&self) -> usize {
        self.ids.len()
    }

    pub(crate) fn get(&self, id: u32) -> Option<Closed> {
        self.ids
            .iter()
            .rev()
            .find(|(i, _)| *i == id)
            .map(|&(_, how)| how)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_transitions() {
        let w = RecvWindow::new(10, 10);
        let mut s = Stream::new(true, w, SendWindow::new(10));
        assert!(s.recv_open() && s.send_open());
        s.close_remote();
        assert_eq!(s.state, State::HalfClosedRemote);
        assert!(!s.recv_open() && s.send_open());
        s.close_local();
        assert_eq!(s.state, State::Closed);
        assert!(!s.is_finished(), "held by the application");
        s.app_held = false;
        assert!(s.is_finished());
    }

    #[test]
    fn send_open_false_once_end_stream_queued() {
        let mut s = Stream::new(false, RecvWindow::new(1, 1), SendWindow::new(1));
        s.enqueue(SendItem::Data {
            data: Bytes::new(),
            end_stream: false,
        });
        assert!(s.send_open());
        s.enqueue(SendItem::Data {
            data: Bytes::new(),
            end_stream: true,
        });
        assert!(!s.send_open());
    }

    #[test]
    fn closed_ring_is_bounded_and_remembers_latest() {
        let mut r = ClosedRing::new(2);
        r.push(1, Closed::Other);
        r.push(3, Closed::ResetByUs);
        r.push(5, Closed::Other);
        assert_eq!(r.get(1), None);
        assert_eq!(r.get(3), Some(Closed::ResetByUs));
        assert_eq!(r.get(5), Some(Closed::Other));
    }

    #[test]
    fn id_hasher_spreads_ids() {
        let mut m: StreamMap = StreamMap::default();
        for id in (1..2000).step_by(2) {
            m.insert(
                id,
                Stream::new(true, RecvWindow::new(1, 1), SendWindow::new(1)),
            );
        }
        assert_eq!(m.len(), 1000);
        assert!(m.contains_key(&1999));
    }
}
