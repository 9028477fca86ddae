//! One tunnel's resume state: every connection's [`ConnResume`], the ACKs
//! due, parking and the resume handshake — the layer the agent's tunnel
//! and the router's backend embed behind small hooks.

use crate::maps::{IdMap, IdSet};
use std::collections::VecDeque;
use std::time::{Duration, Instant};

use bytes::Bytes;
use konn_frames::packet::Packet;

use super::{ConnResume, Phase, ResumeLimits, violation};
use crate::Error;

/// Where the tunnel stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SessionState {
    /// The tunnel is up.
    Live,
    /// The tunnel broke; its connections wait until `deadline`.
    Parked {
        /// The end of the resume window.
        deadline: Instant,
    },
    /// On the resumed tunnel, before the peer's RESUMED.
    Syncing,
}

/// What to send for one connection once the peer announced its offset:
/// the unacknowledged payloads (as plain DATA, in order), then the close if
/// it was sent and not acknowledged.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Replay {
    /// The payloads, in order (the sent buffers themselves for large
    /// payloads, fresh copies of the ring for small ones).
    pub data: Vec<Bytes>,
    /// Re-send the close (CLOSE_REQ / CLOSE_RSP) after them.
    pub close: bool,
}

/// The resume state of one tunnel's connections.
#[derive(Debug)]
pub struct ResumeSession {
    limits: ResumeLimits,
    /// Boxed: a hash table keeps about twice its entries' room, and a
    /// 200-byte entry inline made this the largest part of an idle
    /// tunnelled connection on the server (docs/BENCHMARKS.md, S5).
    conns: IdMap<i64, Box<ConnResume>>,
    state: SessionState,
    /// Connections whose ACK is due by time (each listed once, flagged in
    /// [`ConnResume`]; ids of forgotten ones are skipped).
    ack_owed: Vec<i64>,
    /// Handshake packets to send (ACKs announcing offsets, RESUMED).
    out: VecDeque<Packet>,
    /// The connections the peer announced during the handshake.
    announced: IdSet<i64>,
    /// The latest time seen (input and timers carry it); closes are
    /// stamped with it.
    now: Option<Instant>,
    /// Connections whose close we sent, in order, with when they are
    /// forgotten if the peer has not acknowledged it (see
    /// [`ResumeLimits::close_linger`]).
    lingering: VecDeque<(i64, Instant)>,
}

impl ResumeSession {
    /// A live session with no connections.
    pub fn new(limits: ResumeLimits) -> Self {
        Self {
            limits,
            conns: IdMap::default(),
            state: SessionState::Live,
            ack_owed: Vec::new(),
            out: VecDeque::new(),
            announced: IdSet::default(),
            now: None,
            lingering: VecDeque::new(),
        }
    }

    /// The tunnel's state.
    pub fn state(&self) -> SessionState {
        self.state
    }

    /// The limits.
    pub fn limits(&self) -> &ResumeLimits {
        &self.limits
    }

    /// A connection was established (DIAL_RSP): track it from offset 0.
    pub fn open(&mut self, id: i64) {
        self.conns.entry(id).or_default();
    }

    /// Whether the connection is tracked.
    pub fn contains(&self, id: i64) -> bool {
        self.conns.contains_key(&id)
    }

    /// The connection's state.
    pub fn conn(&self, id: i64) -> Option<&ConnResume> {
        self.conns.get(&id).map(Box::as_ref)
    }

    /// Connections tracked (live, parked or lingering after their close).
    pub fn len(&self) -> usize {
        self.conns.len()
    }

    /// Whether no connection is tracked.
    pub fn is_empty(&self) -> bool {
        self.conns.is_empty()
    }

    /// Whether the connection's source may be read now.
    pub fn may_read(&self, id: i64) -> bool {
        self.state == SessionState::Live
            && self
                .conns
                .get(&id)
                .is_some_and(|c| c.may_read(&self.limits))
    }

    /// A DATA payload for `id` follows its last byte: kept for replay.
    /// Returns whether to send it now; `false` while the connection is
    /// parked or syncing — the replay sends it. When it is sent now and
    /// the connection owes an ACK that is half due at `now` (or the latest
    /// time seen, if not given), the ACK is queued to go with it
    /// ([`poll_packet`](Self::poll_packet); [`ConnResume::piggyback_ack`]).
    pub fn sent(&mut self, now: Option<Instant>, id: i64, data: &Bytes) -> Result<bool, Error> {
        if let Some(now) = now {
            self.now = Some(self.now.map_or(now, |t| t.max(now)));
        }
        let conn = self.conns.get_mut(&id).ok_or(UNKNOWN)?;
        conn.send(data);
        let live = conn.phase() == Phase::Live;
        if let Some(offset) = conn.piggyback_ack(self.now, &self.limits) {
            self.out.push_back(ack_packet(id, offset));
        }
        Ok(live)
    }

    /// Whether packets wait in [`poll_packet`](Self::poll_packet).
    pub fn has_packets(&self) -> bool {
        !self.out.is_empty()
    }

    /// Our close for `id` follows its last byte: the connection lingers
    /// until the peer acknowledges it ([`ack`](Self::ack) forgets it then,
    /// see [`ConnResume::finished`]). Returns whether to send the close
    /// now; `false` while the connection is parked or syncing — the replay
    /// sends it ([`Replay::close`]).
    pub fn close_sent(&mut self, id: i64) -> Result<bool, Error> {
        let linger = self.limits.close_linger;
        let conn = self.conns.get_mut(&id).ok_or(UNKNOWN)?;
        conn.send_close();
        let live = conn.phase() == Phase::Live;
        if let Some(now) = self.now {
            self.lingering
                .push_back((id, now.checked_add(linger).unwrap_or(now)));
        }
        Ok(live)
    }

    /// A plain DATA payload for `id` arrived: returns the new bytes —
    /// normally the payload itself (no handle cloned), nothing for a
    /// duplicate, and, should held segments follow it (never on a plain
    /// wire), all of them joined into one buffer. A connection the session
    /// does not track has no resume state: its payload comes back as is
    /// (one lookup per packet either way).
    pub fn received(&mut self, now: Instant, id: i64, data: Bytes) -> Result<Option<Bytes>, Error> {
        self.now = Some(now);
        let Some(conn) = self.conns.get_mut(&id) else {
            return Ok(Some(data));
        };
        let got = conn.data(now, data, &self.limits)?;
        if ack_after_input(
            conn,
            id,
            now,
            &self.limits,
            &mut self.out,
            &mut self.ack_owed,
        ) {
            self.conns.remove(&id);
        }
        Ok(got)
    }

    /// The peer's close for `id` arrived; returns whether it is new (the
    /// caller acts on it) rather than a replayed duplicate. Its ACK is due
    /// at once; once that is sent (and our own close, if any, is
    /// acknowledged) the connection is forgotten.
    pub fn close_received(&mut self, now: Instant, id: i64) -> Result<bool, Error> {
        let limits = self.limits;
        self.now = Some(now);
        let conn = self.conns.get_mut(&id).ok_or(UNKNOWN)?;
        let before = conn.rx().closed();
        conn.close_received(now, &limits)?;
        let fresh = !before && conn.rx().closed();
        self.ack_if_due(now, id);
        Ok(fresh)
    }

    /// After input for `id` (see [`ack_after_input`]).
    fn ack_if_due(&mut self, now: Instant, id: i64) {
        let limits = self.limits;
        let Some(conn) = self.conns.get_mut(&id) else {
            return;
        };
        if ack_after_input(conn, id, now, &limits, &mut self.out, &mut self.ack_owed) {
            self.conns.remove(&id);
        }
    }

    /// The peer's ACK for `id`. Live: releases replay bytes, and forgets a
    /// connection whose close is now acknowledged. Syncing: the peer's
    /// announcement — the answer is what to replay now.
    pub fn ack(&mut self, id: i64, offset: i64) -> Result<Option<Replay>, Error> {
        let offset = u64::try_from(offset).map_err(|_| violation("negative ACK offset"))?;
        if self.state == SessionState::Syncing {
            self.announced.insert(id);
        }
        let conn = self.conns.get_mut(&id).ok_or(UNKNOWN)?;
        let replay = if conn.ack(offset)? {
            Some(Replay {
                data: conn.replay().map(|(_, b)| b).collect(),
                close: conn.tx().fin_unacked(),
            })
        } else {
            None
        };
        if conn.finished() {
            self.forget(id);
        }
        Ok(replay)
    }

    /// The next packet to send: the handshake's, and ACKs that came due
    /// (on input, or in [`handle_timeout`](Self::handle_timeout)).
    pub fn poll_packet(&mut self) -> Option<Packet> {
        self.out.pop_front()
    }

    /// ACKs due by time at `now` move to [`poll_packet`](Self::poll_packet),
    /// and so do those falling due within a quarter of the ACK delay: one
    /// wake-up serves them all, so the timer wakes at most about four
    /// times per delay however many connections owe ACKs. (Most owed ACKs
    /// ride on DATA going the other way before they are due, after the
    /// driver's timer was set for them: woken for each, it would mostly
    /// find nothing to do.) Walks the timer list once (the timer path, not
    /// per packet).
    pub fn handle_timeout(&mut self, now: Instant) {
        let limits = self.limits;
        self.now = Some(now);
        self.expire_lingering(now);
        let horizon = now.checked_add(limits.ack_delay / 4).unwrap_or(now);
        let mut i = 0;
        // Bounded: each round removes an entry or moves past one.
        while let Some(&id) = self.ack_owed.get(i) {
            let keep = match self.conns.get_mut(&id) {
                None => false,
                Some(conn) => match conn.poll_ack(horizon, &limits) {
                    Some(offset) => {
                        let finished = conn.finished();
                        self.out.push_back(ack_packet(id, offset));
                        if finished {
                            self.conns.remove(&id);
                        }
                        false
                    }
                    // Still owed (not yet due, or syncing), or nothing.
                    None => conn.rx().ack_pending(),
                },
            };
            if keep {
                i += 1;
            } else {
                self.ack_owed.swap_remove(i);
                if let Some(c) = self.conns.get_mut(&id) {
                    c.timer_listed = false;
                }
            }
        }
    }

    /// Whether some connection owes an ACK by time (O(1): the driver asks
    /// after input whether its timer must be woken).
    pub fn ack_timer_pending(&self) -> bool {
        !self.ack_owed.is_empty()
    }

    /// When an ACK is due by time, a close lingered long enough, or the
    /// window ends.
    pub fn poll_timeout(&self) -> Option<Instant> {
        if let SessionState::Parked { deadline } = self.state {
            return Some(deadline);
        }
        let linger = match self.state {
            SessionState::Live => self.lingering.front().map(|(_, at)| *at),
            _ => None,
        };
        self.ack_owed
            .iter()
            .filter_map(|id| self.conns.get(id)?.poll_timeout())
            .chain(linger)
            .min()
    }

    /// Forgets live connections whose close the peer has not acknowledged
    /// in [`ResumeLimits::close_linger`] (only while the tunnel is up: a
    /// parked or syncing one waits for the resume). Returns how many.
    fn expire_lingering(&mut self, now: Instant) -> usize {
        if self.state != SessionState::Live {
            return 0;
        }
        let mut forgotten = 0;
        // Bounded: each round removes an entry.
        while let Some(&(id, at)) = self.lingering.front() {
            if at > now {
                break;
            }
            self.lingering.pop_front();
            let stale = self
                .conns
                .get(&id)
                .is_some_and(|c| c.tx().fin_sent() && !c.done());
            if stale {
                self.conns.remove(&id);
                forgotten += 1;
            }
        }
        forgotten
    }

    /// Forgets a connection (closed without a resume to wait for, or fully
    /// acknowledged); returns the bytes it held.
    pub fn forget(&mut self, id: i64) -> u64 {
        self.conns.remove(&id).map_or(0, |c| c.held_bytes())
    }

    /// The tunnel broke: park every connection until `now + window`.
    pub fn park(&mut self, now: Instant, window: Duration) {
        self.now = Some(now);
        for conn in self.conns.values_mut() {
            conn.park();
            conn.timer_listed = false;
        }
        self.ack_owed.clear();
        self.out.clear();
        self.announced.clear();
        self.state = SessionState::Parked {
            deadline: now.checked_add(window).unwrap_or(now),
        };
    }

    /// Whether the window of a parked tunnel ended at `now`: the caller
    /// closes every connection as on a lost tunnel ([`abandon`](Self::abandon)).
    pub fn expired(&self, now: Instant) -> bool {
        matches!(self.state, SessionState::Parked { deadline } if deadline <= now)
    }

    /// The tunnel resumed: announce every parked connection's receive
    /// offset (ACKs), then RESUMED; see [`poll_packet`](Self::poll_packet).
    pub fn resume(&mut self) {
        let mut ids: Vec<i64> = self.conns.keys().copied().collect();
        ids.sort_unstable();
        for id in ids {
            if let Some(conn) = self.conns.get_mut(&id) {
                let offset = conn.begin_sync();
                self.out.push_back(ack_packet(id, offset));
            }
        }
        self.out.push_back(Packet::Resumed);
        self.announced.clear();
        self.state = SessionState::Syncing;
    }

    /// The peer's RESUMED: the connections it did not announce are gone at
    /// its end; they are forgotten here and returned, for the caller to
    /// close as on a lost tunnel. The session is live again.
    pub fn peer_resumed(&mut self) -> Vec<i64> {
        let gone: Vec<i64> = self
            .conns
            .iter()
            .filter(|(id, c)| c.phase() == Phase::Syncing && !self.announced.contains(id))
            .map(|(id, _)| *id)
            .collect();
        for id in &gone {
            self.forget(*id);
        }
        self.announced.clear();
        self.state = SessionState::Live;
        gone
    }

    /// Every connection, forgotten (the window ended, the resume was
    /// refused, or the tunnel closed for good); returns their ids for the
    /// caller to close as on a lost tunnel.
    pub fn abandon(&mut self) -> Vec<i64> {
        let ids: Vec<i64> = self.conns.keys().copied().collect();
        self.conns.clear();
        self.lingering.clear();
        self.ack_owed.clear();
        self.out.clear();
        self.announced.clear();
        self.state = SessionState::Live;
        ids
    }

    /// Bytes held for replay and out of order by all connections (what
    /// counts against the memory budget).
    pub fn held_bytes(&self) -> u64 {
        self.conns.values().map(|c| c.held_bytes()).sum()
    }

    #[doc(hidden)]
    /// The invariants of every connection.
    pub fn check_invariants(&self) -> Result<(), String> {
        for (id, c) in &self.conns {
            c.check_invariants()
                .map_err(|e| format!("connection {id}: {e}"))?;
        }
        Ok(())
    }
}

/// After input for connection `id`: its ACK goes out now (into `out`) if
/// due by size (or a close), else it waits in the timer list `owed` —
/// constant work per packet, with the entry in hand (no second lookup).
/// Returns whether the connection is finished and may be forgotten.
fn ack_after_input(
    conn: &mut ConnResume,
    id: i64,
    now: Instant,
    limits: &ResumeLimits,
    out: &mut VecDeque<Packet>,
    owed: &mut Vec<i64>,
) -> bool {
    if let Some(offset) = conn.poll_ack(now, limits) {
        out.push_back(ack_packet(id, offset));
        return conn.finished();
    }
    if conn.rx().ack_pending() && !conn.timer_listed {
        conn.timer_listed = true;
        owed.push(id);
    }
    false
}

/// `ACK{connectID, offset}`.
fn ack_packet(id: i64, offset: u64) -> Packet {
    Packet::Ack {
        connect_id: id,
        offset: i64::try_from(offset).unwrap_or(i64::MAX),
    }
}

/// A resume event for a connection the session does not track.
const UNKNOWN: Error = violation("resume state for an unknown connection");
