//! The receive half of one resumable connection: exactly-once, in-order
//! delivery and the cumulative acknowledgement.

use std::collections::BTreeMap;
use std::time::Instant;

use bytes::{Bytes, BytesMut};

use super::{ResumeLimits, span, violation};
use crate::Error;

/// Where one connection's incoming byte stream stands.
///
/// Plain DATA carries no offset: it continues at [`cursor`](Self::cursor),
/// which a resume resets to the offset the replay starts at. Any segment
/// — plain or replayed, duplicated, overlapping or early — goes through
/// [`segment`](Self::segment), which delivers each byte of the stream
/// exactly once and in order: bytes below [`received`](Self::received) are
/// dropped, early segments are held (bounded) until the gap fills.
#[derive(Debug)]
pub struct Receiver {
    /// Bytes delivered in order (everything below this offset).
    received: u64,
    /// The offset of the next plain DATA payload.
    cursor: u64,
    /// The last cumulative acknowledgement sent.
    ack_sent: u64,
    /// Segments delivered since then.
    unacked_segments: u32,
    /// When the pending acknowledgement ripens and falls due by time.
    ack_at: Option<AckTimes>,
    /// Early segments by offset (all above `received` when not delivering).
    held: BTreeMap<u64, Bytes>,
    /// Bytes in `held`.
    held_len: usize,
    /// The offset of the peer's close, once it arrived. The close counts
    /// as one unit: delivered (and acknowledged) as `received` passes it.
    fin_at: Option<u64>,
}

/// When an armed acknowledgement becomes worth carrying along with DATA
/// going the other way (half the delay: [`Receiver::ack_ripe`], fixed when
/// armed rather than computed on every DATA sent) and when it is due by
/// time.
#[derive(Clone, Copy, Debug)]
struct AckTimes {
    ripe: Instant,
    due: Instant,
}

impl Default for Receiver {
    fn default() -> Self {
        Self::new()
    }
}

impl Receiver {
    /// A receiver at offset 0.
    pub fn new() -> Self {
        Self {
            received: 0,
            cursor: 0,
            ack_sent: 0,
            unacked_segments: 0,
            ack_at: None,
            held: BTreeMap::new(),
            held_len: 0,
            fin_at: None,
        }
    }

    /// A plain DATA payload: the segment at the cursor (which then moves
    /// past it). Returns the new bytes: in order (the usual case, and the
    /// only one on a wire without replays) the payload itself, with no
    /// handle cloned and no closure; nothing for a duplicate; and should
    /// held segments follow it, all of them joined into one buffer. See
    /// [`segment`](Self::segment).
    #[inline]
    pub fn data(
        &mut self,
        now: Instant,
        data: Bytes,
        limits: &ResumeLimits,
    ) -> Result<Option<Bytes>, Error> {
        if self.cursor == self.received && self.held_len == 0 && self.fin_at.is_none() {
            if data.is_empty() {
                return Ok(None);
            }
            self.received = self.received.saturating_add(data.len() as u64);
            self.cursor = self.received;
            self.note_segment(now, limits);
            return Ok(Some(data));
        }
        self.data_joined(now, data, limits)
    }

    /// [`data`](Self::data) past a resume: through
    /// [`segment`](Self::segment), its deliveries joined.
    #[cold]
    #[inline(never)]
    fn data_joined(
        &mut self,
        now: Instant,
        data: Bytes,
        limits: &ResumeLimits,
    ) -> Result<Option<Bytes>, Error> {
        let mut got: Option<Bytes> = None;
        self.segment(now, self.cursor, data, limits, &mut |b: Bytes| {
            got = Some(match got.take() {
                None => b,
                Some(a) => {
                    let mut j = BytesMut::with_capacity(a.len() + b.len());
                    j.extend_from_slice(&a);
                    j.extend_from_slice(&b);
                    j.freeze()
                }
            });
        })?;
        Ok(got)
    }

    /// The segment of the stream at `offset`: delivers (through
    /// `deliver`, zero-copy slices of `data` and of held segments) every
    /// byte of it and of the held segments that now continue the stream,
    /// each byte once and in order. A segment that starts beyond the
    /// stream is held; holding more than [`ResumeLimits::hold_limit`]
    /// bytes is a protocol violation. The cursor moves to the segment's end
    /// if that is further.
    pub fn segment(
        &mut self,
        now: Instant,
        offset: u64,
        data: Bytes,
        limits: &ResumeLimits,
        deliver: &mut impl FnMut(Bytes),
    ) -> Result<(), Error> {
        let end = offset.saturating_add(data.len() as u64);
        // Plain DATA after a replay continues where the replay ended,
        // whatever order its segments came in.
        self.cursor = self.cursor.max(end);
        if end <= self.received {
            return Ok(()); // all duplicate (or empty)
        }
        if offset > self.received {
            return self.hold(offset, data, limits);
        }
        if self.fin_at.is_some_and(|fin| end > fin) {
            return Err(violation("DATA beyond the close"));
        }
        let before = self.received;
        self.take(offset, data, deliver);
        self.release_held(deliver);
        self.take_fin(now);
        self.note_received(now, before, limits);
        Ok(())
    }

    /// The peer's close (CLOSE_REQ / CLOSE_RSP), plain: at the cursor.
    /// [`closed`](Self::closed) tells when every byte before it is
    /// delivered; its acknowledgement is due at once.
    pub fn close(&mut self, now: Instant, limits: &ResumeLimits) -> Result<(), Error> {
        self.close_at(now, self.cursor, limits)
    }

    /// The peer's close at `offset` (after the byte at `offset - 1`).
    pub fn close_at(
        &mut self,
        now: Instant,
        offset: u64,
        limits: &ResumeLimits,
    ) -> Result<(), Error> {
        match self.fin_at {
            Some(fin) if fin == offset => return Ok(()), // a replayed close
            Some(_) => return Err(violation("two different closes")),
            None => {}
        }
        if offset < self.received || self.held.keys().any(|&k| k >= offset) {
            return Err(violation("a close before delivered data"));
        }
        self.fin_at = Some(offset);
        let before = self.received;
        self.take_fin(now);
        self.note_received(now, before, limits);
        Ok(())
    }

    /// Counts the close as received once everything before it is.
    fn take_fin(&mut self, now: Instant) {
        if self.fin_at == Some(self.received) {
            self.received = self.received.saturating_add(1);
            // Due at once: the peer forgets the connection once this is
            // acknowledged.
            self.ack_at = Some(AckTimes {
                ripe: now,
                due: now,
            });
        }
    }

    /// Whether the peer's close arrived with every byte before it.
    pub fn closed(&self) -> bool {
        self.fin_at.is_some_and(|fin| self.received > fin)
    }

    /// Delivers the part of `data` (at `offset` ≤ `received`) beyond
    /// `received`.
    fn take(&mut self, offset: u64, data: Bytes, deliver: &mut impl FnMut(Bytes)) {
        let skip = span(offset, self.received);
        if skip >= data.len() {
            return;
        }
        // In order (the usual case): the payload itself, no new handle.
        let fresh = if skip == 0 { data } else { data.slice(skip..) };
        self.received = self.received.saturating_add(fresh.len() as u64);
        deliver(fresh);
    }

    /// Delivers the held segments that continue the stream.
    fn release_held(&mut self, deliver: &mut impl FnMut(Bytes)) {
        // Bounded: every round removes one held segment or ends.
        while let Some(entry) = self.held.first_entry() {
            if *entry.key() > self.received {
                break;
            }
            let (offset, seg) = entry.remove_entry();
            self.held_len = self.held_len.saturating_sub(seg.len());
            self.take(offset, seg, deliver);
        }
    }

    /// Holds an early segment (the longer one wins at an equal offset).
    fn hold(&mut self, offset: u64, data: Bytes, limits: &ResumeLimits) -> Result<(), Error> {
        let old = self.held.get(&offset).map_or(0, Bytes::len);
        if data.len() <= old {
            return Ok(());
        }
        let held_len = self.held_len.saturating_add(data.len() - old);
        if held_len > limits.hold_limit {
            return Err(violation("replayed data beyond the hold limit"));
        }
        self.held_len = held_len;
        self.held.insert(offset, data);
        Ok(())
    }

    /// Arms the acknowledgement after bytes arrived.
    fn note_received(&mut self, now: Instant, before: u64, limits: &ResumeLimits) {
        if self.received > before {
            self.note_segment(now, limits);
        }
    }

    /// Counts one segment of new bytes; the first after an acknowledgement
    /// arms its deadline, and when it becomes worth carrying along
    /// ([`ack_ripe`](Self::ack_ripe): half the delay, computed here once
    /// rather than on every DATA sent).
    fn note_segment(&mut self, now: Instant, limits: &ResumeLimits) {
        self.unacked_segments = self.unacked_segments.saturating_add(1);
        if self.ack_at.is_none() {
            let after = |d| now.checked_add(d).unwrap_or(now);
            self.ack_at = Some(AckTimes {
                ripe: after(limits.ack_delay / 2),
                due: after(limits.ack_delay),
            });
        }
    }

    /// The cumulative acknowledgement to send now, if one is due: once
    /// [`ResumeLimits::ack_bytes`] or [`ResumeLimits::ack_segments`]
    /// arrived unacknowledged, or when the delay since the first of them
    /// ran out. Returns the offset to acknowledge and counts it as sent.
    pub fn poll_ack(&mut self, now: Instant, limits: &ResumeLimits) -> Option<u64> {
        let pending = self.received.saturating_sub(self.ack_sent);
        let due = pending >= limits.ack_bytes.max(1)
            || self.unacked_segments >= limits.ack_segments.max(1)
            || self.ack_at.is_some_and(|t| t.due <= now);
        if pending == 0 || !due {
            return None;
        }
        Some(self.mark_acked())
    }

    /// Whether an acknowledgement is worth sending along with DATA going
    /// the other way: something is unacknowledged and it is half due (by
    /// bytes, segments or time). A reply right after each request thus
    /// carries an ACK every few exchanges, not one per exchange — each is a
    /// packet to encode and decode — and a quiet connection still gets its
    /// ACK by [`poll_ack`](Self::poll_ack) in time.
    pub fn ack_ripe(&self, now: Option<Instant>, limits: &ResumeLimits) -> bool {
        let pending = self.received.saturating_sub(self.ack_sent);
        pending > 0
            && (pending.saturating_mul(2) >= limits.ack_bytes.max(1)
                || self.unacked_segments.saturating_mul(2) >= limits.ack_segments.max(1)
                || self.ack_at.zip(now).is_some_and(|(t, now)| now >= t.ripe))
    }

    /// Counts everything received as acknowledged and returns the offset
    /// (the resume handshake announces it unconditionally).
    pub fn mark_acked(&mut self) -> u64 {
        self.ack_sent = self.received;
        self.unacked_segments = 0;
        self.ack_at = None;
        self.received
    }

    /// Whether something received is not acknowledged yet.
    pub fn ack_pending(&self) -> bool {
        self.received > self.ack_sent
    }

    /// When [`poll_ack`](Self::poll_ack) has something to send by time.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.ack_at
            .filter(|_| self.received > self.ack_sent)
            .map(|t| t.due)
    }

    /// The tunnel broke: held segments are dropped (the replay brings them
    /// again) and the next plain DATA will be the replay from `received`,
    /// announced in the handshake.
    pub fn park(&mut self) {
        self.held = BTreeMap::new();
        self.held_len = 0;
        self.cursor = self.received;
        self.ack_at = None;
    }

    /// Everything below this offset was delivered.
    pub fn received(&self) -> u64 {
        self.received
    }

    /// The offset of the next plain DATA payload.
    pub fn cursor(&self) -> u64 {
        self.cursor
    }

    /// Bytes held out of order.
    pub fn held(&self) -> usize {
        self.held_len
    }

    #[doc(hidden)]
    /// The invariant, for tests and the fuzz harness.
    pub fn check_invariants(&self) -> Result<(), String> {
        let held: usize = self.held.values().map(Bytes::len).sum();
        if held != self.held_len {
            return Err(format!("hold counts {} of {held} bytes", self.held_len));
        }
        if self.held.keys().any(|&k| k <= self.received) {
            return Err("a held segment is already deliverable".into());
        }
        if self.ack_sent > self.received {
            return Err("acknowledged beyond what was received".into());
        }
        Ok(())
    }
}
