//! The send half of one resumable connection: byte offsets and the replay
//! buffer.

use std::collections::VecDeque;

use bytes::{Buf, Bytes};

use super::{span, violation};
use crate::Error;

/// Payloads up to this size are copied into the connection's own byte ring
/// instead of being held by reference. A small payload is usually a slice
/// of a much larger pool buffer (one read); holding it until the peer's
/// ACK would pin that whole buffer — memory the byte count does not show —
/// and the driver's next read could not reuse it and had to take a fresh
/// one.
pub const COPY_MAX: usize = 2048;

/// Copied payloads that follow each other join one segment up to this
/// size, so a replay sends them as a few DATA packets, each well inside
/// one 16 KiB HTTP/2 frame.
const RUN_MAX: usize = 8192;

/// Unacknowledged copied bytes per connection stay below this; a small
/// payload that would go beyond is held by reference like a large one.
/// The ring is per-connection state outside the pools' global budget, so
/// it is kept small; held pool buffers are counted by the budget.
const RING_MAX: usize = 8192;

/// Once every copied byte is acknowledged, a ring that grew beyond this is
/// freed rather than kept: an idle connection keeps at most this much.
const RING_KEEP: usize = 4096;

/// One unacknowledged segment.
#[derive(Debug)]
enum Seg {
    /// A large payload, held by reference (no copy).
    Shared(Bytes),
    /// This many bytes at the front of the unconsumed part of the ring.
    Copied(usize),
}

impl Seg {
    fn len(&self) -> usize {
        match self {
            Self::Shared(b) => b.len(),
            Self::Copied(n) => *n,
        }
    }
}

/// The bytes of one connection and direction that were sent but are not
/// yet acknowledged, with their offsets: large payloads as the refcounted
/// [`Bytes`] themselves (no copy), small ones (at most [`COPY_MAX`]) copied
/// into a byte ring of the connection's own while it holds less than
/// 8 KiB.
///
/// The connection's close (CLOSE_REQ / CLOSE_RSP) counts as one more
/// sequence unit after the last byte, like TCP's FIN: a close lost in a cut
/// is replayed, and the connection may be forgotten only once the peer
/// acknowledged `sent + 1` ([`done`](Self::done)).
///
/// Invariant: the held segments cover exactly `[acked, sent)` (nothing
/// once the close is acknowledged), in order, none empty; the ring holds
/// exactly the bytes of the copied segments, in order.
#[derive(Debug, Default)]
pub struct ReplayBuffer {
    /// The peer has everything below this offset.
    acked: u64,
    /// The offset of the next byte to send (bytes sent so far).
    sent: u64,
    /// `[acked, sent)` in order.
    segs: VecDeque<Seg>,
    /// The bytes of the [`Seg::Copied`] segments, in order.
    ring: VecDeque<u8>,
    /// The close was sent (at offset `sent`).
    fin: bool,
}

impl ReplayBuffer {
    /// An empty buffer at offset 0.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records a payload about to be sent; returns its offset. The buffer
    /// keeps a reference to `data` (a copy if it is small, see
    /// [`COPY_MAX`]) until the peer acknowledges it. Nothing is recorded
    /// after the close (a caller bug, ignored).
    #[inline]
    pub fn push(&mut self, data: &Bytes) -> u64 {
        let offset = self.sent;
        if data.is_empty() || self.fin {
            return offset;
        }
        self.sent = self.sent.saturating_add(data.len() as u64);
        if data.len() > COPY_MAX || self.ring.len() + data.len() > RING_MAX {
            self.push_seg(Seg::Shared(data.clone()));
            return offset;
        }
        self.ring.extend(data.iter());
        match self.segs.back_mut() {
            Some(Seg::Copied(n)) if *n + data.len() <= RUN_MAX => *n += data.len(),
            _ => self.push_seg(Seg::Copied(data.len())),
        }
        offset
    }

    /// Appends a segment. The first gets room for one only (a queue's
    /// first growth makes room for four): small payloads merge into one
    /// copied run, so most connections — a request and its reply, then
    /// idle — never hold more, and the queue keeps its room while the
    /// connection lives.
    #[inline]
    fn push_seg(&mut self, seg: Seg) {
        if self.segs.capacity() == 0 {
            self.segs.reserve_exact(1);
        }
        self.segs.push_back(seg);
    }

    /// Records the close, sent after every byte; returns its offset.
    pub fn push_fin(&mut self) -> u64 {
        self.fin = true;
        self.sent
    }

    /// The offset after the last sequence unit sent (bytes, and the close).
    fn end(&self) -> u64 {
        self.sent.saturating_add(u64::from(self.fin))
    }

    /// The peer's cumulative acknowledgement: it received everything
    /// below `offset`. Releases those bytes and returns how many. A stale
    /// (smaller) acknowledgement releases nothing; one beyond what was
    /// sent is a protocol violation.
    pub fn ack(&mut self, offset: u64) -> Result<usize, Error> {
        if offset > self.end() {
            return Err(violation("acknowledgement beyond the bytes sent"));
        }
        if offset <= self.acked {
            return Ok(0);
        }
        let released = span(self.acked.min(self.sent), offset.min(self.sent));
        let mut left = released;
        // Bounded: every round removes a segment or ends.
        while left > 0 {
            let Some(front) = self.segs.front_mut() else {
                break;
            };
            let take = front.len().min(left);
            match front {
                Seg::Shared(b) => b.advance(take),
                Seg::Copied(n) => {
                    *n -= take;
                    self.ring.drain(..take.min(self.ring.len()));
                }
            }
            left -= take;
            if front.len() == 0 {
                self.segs.pop_front();
            }
        }
        if self.ring.is_empty() && self.ring.capacity() > RING_KEEP {
            self.ring = VecDeque::new();
        }
        self.acked = offset;
        Ok(released)
    }

    /// The segments still unacknowledged, each with its offset, in order:
    /// what to replay once the peer said it received everything below
    /// [`acked`](Self::acked) (call [`ack`](Self::ack) with its receive
    /// offset first). Held payloads come back as they were pushed; copied
    /// ones as fresh buffers of at most 8 KiB (a replay is rare, its
    /// allocations are not on the packet path).
    pub fn segments(&self) -> impl Iterator<Item = (u64, Bytes)> + '_ {
        let (mut offset, mut in_ring) = (self.acked, 0);
        self.segs.iter().map(move |seg| {
            let at = offset;
            offset = offset.saturating_add(seg.len() as u64);
            let bytes = match seg {
                Seg::Shared(b) => b.clone(),
                Seg::Copied(n) => {
                    let end = (in_ring + n).min(self.ring.len());
                    let run = self.ring.range(in_ring.min(end)..end);
                    in_ring = end;
                    Bytes::from(run.copied().collect::<Vec<u8>>())
                }
            };
            (at, bytes)
        })
    }

    /// Everything below this offset is acknowledged.
    pub fn acked(&self) -> u64 {
        self.acked
    }

    /// Bytes sent so far (the offset of the next byte).
    pub fn sent(&self) -> u64 {
        self.sent
    }

    /// Bytes held for replay.
    pub fn unacked(&self) -> u64 {
        self.sent.saturating_sub(self.acked)
    }

    /// Whether the close was sent.
    pub fn fin_sent(&self) -> bool {
        self.fin
    }

    /// Whether the close was sent and must follow a replay.
    pub fn fin_unacked(&self) -> bool {
        self.fin && self.acked <= self.sent
    }

    /// Whether the close was sent and everything, close included, is
    /// acknowledged: nothing is left to replay.
    pub fn done(&self) -> bool {
        self.fin && self.acked > self.sent
    }

    /// Drops everything held (the connection is gone without a resume).
    pub fn clear(&mut self) {
        self.segs = VecDeque::new();
        self.ring = VecDeque::new();
        self.acked = self.end();
    }

    #[doc(hidden)]
    /// The invariant, for tests and the fuzz harness.
    pub fn check_invariants(&self) -> Result<(), String> {
        let held: u64 = self.segs.iter().map(|s| s.len() as u64).sum();
        if self.acked > self.end() || held != self.unacked() {
            return Err(format!(
                "replay buffer holds {held} bytes for [{}, {})",
                self.acked, self.sent
            ));
        }
        if self.segs.iter().any(|s| s.len() == 0) {
            return Err("replay buffer holds an empty segment".into());
        }
        let copied: usize = self
            .segs
            .iter()
            .map(|s| match s {
                Seg::Copied(n) => *n,
                Seg::Shared(_) => 0,
            })
            .sum();
        if copied != self.ring.len() {
            return Err(format!(
                "copied segments of {copied} bytes, a ring of {}",
                self.ring.len()
            ));
        }
        Ok(())
    }
}
