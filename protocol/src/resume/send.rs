//! The send half of one resumable connection: byte offsets and the replay
//! buffer.

use std::collections::VecDeque;

use bytes::{Buf, Bytes};

use super::{span, violation};
use crate::Error;

/// The bytes of one connection and direction that were sent but are not
/// yet acknowledged, as the payloads themselves (refcounted [`Bytes`], no
/// copy), with their offsets.
///
/// The connection's close (CLOSE_REQ / CLOSE_RSP) counts as one more
/// sequence unit after the last byte, like TCP's FIN: a close lost in a cut
/// is replayed, and the connection may be forgotten only once the peer
/// acknowledged `sent + 1` ([`done`](Self::done)).
///
/// Invariant: the held segments cover exactly `[acked, sent)` (nothing
/// once the close is acknowledged), in order, none empty.
#[derive(Debug, Default)]
pub struct ReplayBuffer {
    /// The peer has everything below this offset.
    acked: u64,
    /// The offset of the next byte to send (bytes sent so far).
    sent: u64,
    /// `[acked, sent)` in order.
    segs: VecDeque<Bytes>,
    /// The close was sent (at offset `sent`).
    fin: bool,
}

impl ReplayBuffer {
    /// An empty buffer at offset 0.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records a payload about to be sent; returns its offset. The buffer
    /// keeps a reference to `data` until the peer acknowledges it. Nothing
    /// is recorded after the close (a caller bug, ignored).
    pub fn push(&mut self, data: &Bytes) -> u64 {
        let offset = self.sent;
        if !data.is_empty() && !self.fin {
            self.sent = self.sent.saturating_add(data.len() as u64);
            self.segs.push_back(data.clone());
        }
        offset
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
            if front.len() <= left {
                left -= front.len();
                self.segs.pop_front();
            } else {
                front.advance(left);
                left = 0;
            }
        }
        self.acked = offset;
        Ok(released)
    }

    /// The segments still unacknowledged, each with its offset, in order:
    /// what to replay once the peer said it received everything below
    /// [`acked`](Self::acked) (call [`ack`](Self::ack) with its receive
    /// offset first).
    pub fn segments(&self) -> impl Iterator<Item = (u64, &Bytes)> + '_ {
        let mut offset = self.acked;
        self.segs.iter().map(move |seg| {
            let at = offset;
            offset = offset.saturating_add(seg.len() as u64);
            (at, seg)
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
        if self.segs.iter().any(Bytes::is_empty) {
            return Err("replay buffer holds an empty segment".into());
        }
        Ok(())
    }
}
