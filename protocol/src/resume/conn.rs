//! One resumable connection: both halves and its phase across a cut.

use std::time::Instant;

use bytes::Bytes;

use super::{Receiver, ReplayBuffer, ResumeLimits, violation};
use crate::Error;

/// Where a connection stands with respect to its tunnel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// The tunnel is up: DATA flows, ACKs are sent when due.
    Live,
    /// The tunnel broke: nothing is sent, the source is not read, the
    /// connection waits for a resume until the window ends.
    Parked,
    /// On a resumed tunnel: our receive offset is announced, the peer's
    /// not yet known, so nothing new is sent.
    Syncing,
}

/// The resume state of one connection (one connectID on one tunnel).
///
/// Life: [`Live`](Phase::Live) while the tunnel is up; [`park`](Self::park)
/// when it breaks; on a resumed tunnel [`begin_sync`](Self::begin_sync)
/// gives the ACK that announces our receive offset, and the peer's own
/// announcement ([`ack`](Self::ack) returning `true`) says to replay
/// [`replay`](Self::replay) and go live again.
#[derive(Debug)]
pub struct ConnResume {
    tx: ReplayBuffer,
    rx: Receiver,
    phase: Phase,
    /// Listed in its session's ACK-timer list.
    pub(super) timer_listed: bool,
}

impl Default for ConnResume {
    fn default() -> Self {
        Self::new()
    }
}

impl ConnResume {
    /// A new connection, live at offset 0 both ways.
    pub fn new() -> Self {
        Self {
            tx: ReplayBuffer::new(),
            rx: Receiver::new(),
            phase: Phase::Live,
            timer_listed: false,
        }
    }

    /// The phase.
    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// Whether the connection's source may be read: live, not closed, and
    /// the replay buffer below [`ResumeLimits::replay_limit`].
    pub fn may_read(&self, limits: &ResumeLimits) -> bool {
        self.phase == Phase::Live && !self.tx.fin_sent() && self.tx.unacked() < limits.replay_limit
    }

    /// A DATA payload follows the connection's last byte; the buffer keeps
    /// it for replay. Returns its offset. Allowed in any phase: what a
    /// source produced as the tunnel broke (or a frontend's in-flight
    /// messages) is recorded here, and the caller sends it now only while
    /// [`Live`](Phase::Live) — otherwise the replay does. Nothing is
    /// recorded after the close.
    #[inline]
    pub fn send(&mut self, data: &Bytes) -> u64 {
        self.tx.push(data)
    }

    /// A plain DATA payload arrived: the new bytes, see [`Receiver::data`].
    #[inline]
    pub fn data(
        &mut self,
        now: Instant,
        data: Bytes,
        limits: &ResumeLimits,
    ) -> Result<Option<Bytes>, Error> {
        if self.phase == Phase::Parked {
            return Err(violation("DATA for a parked connection"));
        }
        self.rx.data(now, data, limits)
    }

    /// A segment at an explicit offset arrived: see [`Receiver::segment`].
    pub fn segment(
        &mut self,
        now: Instant,
        offset: u64,
        data: Bytes,
        limits: &ResumeLimits,
        deliver: &mut impl FnMut(Bytes),
    ) -> Result<(), Error> {
        if self.phase == Phase::Parked {
            return Err(violation("DATA for a parked connection"));
        }
        self.rx.segment(now, offset, data, limits, deliver)
    }

    /// Our close (CLOSE_REQ / CLOSE_RSP) follows the last byte. The
    /// connection lingers until [`done`](Self::done). Allowed in any phase:
    /// a connection that ends while parked or syncing (its destination
    /// closed) records the close here, and the caller sends it only with
    /// the replay ([`ReplayBuffer::fin_unacked`]), not now.
    pub fn send_close(&mut self) -> u64 {
        self.tx.push_fin()
    }

    /// The peer's close arrived (plain, at the cursor): see
    /// [`Receiver::close`].
    pub fn close_received(&mut self, now: Instant, limits: &ResumeLimits) -> Result<(), Error> {
        if self.phase == Phase::Parked {
            return Err(violation("CLOSE for a parked connection"));
        }
        self.rx.close(now, limits)
    }

    /// The peer's close at an explicit offset: see [`Receiver::close_at`].
    pub fn close_received_at(
        &mut self,
        now: Instant,
        offset: u64,
        limits: &ResumeLimits,
    ) -> Result<(), Error> {
        if self.phase == Phase::Parked {
            return Err(violation("CLOSE for a parked connection"));
        }
        self.rx.close_at(now, offset, limits)
    }

    /// Whether our close and every byte before it are acknowledged: the
    /// connection's state may go.
    pub fn done(&self) -> bool {
        self.tx.done()
    }

    /// Whether the connection ended and nothing about it is owed: a close
    /// was sent or received; ours (if sent) is acknowledged, and the
    /// peer's (if received) has its ACK sent. Konnectivity has no
    /// half-close, so either close ends the connection.
    pub fn finished(&self) -> bool {
        let own = self.tx.fin_sent();
        let peer = self.rx.closed();
        (own || peer) && (!own || self.tx.done()) && (!peer || !self.rx.ack_pending())
    }

    /// The peer's ACK: it received everything below `offset`. Live, it
    /// releases replay bytes; syncing, it is the peer's announcement and
    /// the answer is `true`: send [`replay`](Self::replay) now, then live
    /// data. An ACK beyond what was sent, or a sync below what the peer
    /// had already acknowledged (it lost bytes: a different process), is a
    /// violation.
    pub fn ack(&mut self, offset: u64) -> Result<bool, Error> {
        match self.phase {
            Phase::Parked => Err(violation("ACK for a parked connection")),
            Phase::Live => self.tx.ack(offset).map(|_| false),
            Phase::Syncing => {
                if offset < self.tx.acked() {
                    return Err(violation("resume below the acknowledged offset"));
                }
                self.tx.ack(offset)?;
                self.phase = Phase::Live;
                Ok(true)
            }
        }
    }

    /// What to replay after the peer's announcement: the unacknowledged
    /// segments from its receive offset, in order. Sent as plain DATA,
    /// before any new data, and followed by the close if
    /// [`ReplayBuffer::fin_unacked`].
    pub fn replay(&self) -> impl Iterator<Item = (u64, Bytes)> + '_ {
        self.tx.segments()
    }

    /// The cumulative ACK due now, if any (live only).
    pub fn poll_ack(&mut self, now: Instant, limits: &ResumeLimits) -> Option<u64> {
        if self.phase != Phase::Live {
            return None;
        }
        self.rx.poll_ack(now, limits)
    }

    /// The cumulative ACK to send along with DATA of this connection going
    /// the other way at `now` (the latest time seen), if one is half due
    /// ([`Receiver::ack_ripe`]; live only): it rides in the same write as
    /// the DATA, so request/response traffic acknowledges without a timer
    /// or wake-up of its own.
    pub fn piggyback_ack(&mut self, now: Option<Instant>, limits: &ResumeLimits) -> Option<u64> {
        (self.phase == Phase::Live && self.rx.ack_ripe(now, limits)).then(|| self.rx.mark_acked())
    }

    /// When [`poll_ack`](Self::poll_ack) is due by time.
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.phase != Phase::Live {
            return None;
        }
        self.rx.poll_timeout()
    }

    /// The tunnel broke: park (idempotent).
    pub fn park(&mut self) {
        self.phase = Phase::Parked;
        self.rx.park();
    }

    /// On the resumed tunnel: start syncing, and return our receive
    /// offset to announce (as an ACK) before anything else for this
    /// connection. A second cut during the sync parks again, and the next
    /// resume syncs from the offsets reached.
    pub fn begin_sync(&mut self) -> u64 {
        self.phase = Phase::Syncing;
        self.rx.park();
        self.rx.mark_acked()
    }

    /// Bytes this connection holds for resume (replay buffer and
    /// out-of-order hold): what counts against the memory budget.
    pub fn held_bytes(&self) -> u64 {
        self.tx.unacked().saturating_add(self.rx.held() as u64)
    }

    /// The send half.
    pub fn tx(&self) -> &ReplayBuffer {
        &self.tx
    }

    /// The receive half.
    pub fn rx(&self) -> &Receiver {
        &self.rx
    }

    /// The connection is gone without a resume (window over, tunnel
    /// refused): release everything held.
    pub fn abandon(&mut self) {
        self.tx.clear();
        self.rx.park();
    }

    #[doc(hidden)]
    /// The invariants of both halves.
    pub fn check_invariants(&self) -> Result<(), String> {
        self.tx.check_invariants()?;
        self.rx.check_invariants()
    }
}
