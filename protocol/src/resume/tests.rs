//! Unit tests and the property test of the resume state machine.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use bytes::Bytes;
use proptest::prelude::*;

use super::*;
use crate::{Error, test_epoch};

fn limits() -> ResumeLimits {
    ResumeLimits {
        ack_bytes: 100,
        ack_segments: 1000,
        ack_delay: Duration::from_millis(10),
        hold_limit: 4096,
        replay_limit: 1000,
        close_linger: Duration::from_secs(30),
    }
}

fn collect(out: &mut Vec<u8>) -> impl FnMut(Bytes) + '_ {
    |b: Bytes| out.extend_from_slice(&b)
}

/// Appends what a plain DATA delivered (nothing for a duplicate).
fn append(out: &mut Vec<u8>, got: Option<Bytes>) {
    out.extend_from_slice(&got.unwrap_or_default());
}

#[test]
fn replay_buffer_releases_on_ack() {
    let mut tx = ReplayBuffer::new();
    let a = Bytes::from_static(b"hello ");
    let b = Bytes::from_static(b"world");
    assert_eq!(tx.push(&a), 0);
    assert_eq!(tx.push(&Bytes::new()), 6);
    assert_eq!(tx.push(&b), 6);
    assert_eq!(tx.unacked(), 11);
    assert_eq!(tx.ack(3), Ok(3));
    assert_eq!(tx.ack(2), Ok(0), "stale ack releases nothing");
    tx.check_invariants().unwrap();
    // Small payloads that follow each other replay as one segment.
    let segs: Vec<(u64, Bytes)> = tx.segments().collect();
    assert_eq!(segs, vec![(3, Bytes::from_static(b"lo world"))]);
    assert!(tx.ack(12).is_err(), "beyond what was sent");
    assert_eq!(tx.ack(11), Ok(8));
    assert_eq!(tx.unacked(), 0);
    tx.check_invariants().unwrap();
}

#[test]
fn replay_buffer_holds_large_payloads_and_copies_small_ones() {
    let mut tx = ReplayBuffer::new();
    // A small payload is a slice of a larger read buffer: the buffer must
    // not stay pinned by the replay.
    let read = Bytes::from(vec![7u8; 16 * 1024]);
    let small = read.slice(..64);
    drop(read);
    let big = Bytes::from(vec![9u8; COPY_MAX + 1]);
    tx.push(&small);
    assert!(small.is_unique(), "a small payload is copied, not held");
    tx.push(&big);
    assert!(!big.is_unique(), "a large payload is held, not copied");
    tx.push(&small);
    tx.check_invariants().unwrap();
    let segs: Vec<(u64, Bytes)> = tx.segments().collect();
    assert_eq!(segs.len(), 3);
    assert_eq!(segs[0], (0, small.clone()));
    assert_eq!(segs[1].1.as_ptr(), big.as_ptr(), "the held buffer itself");
    assert_eq!(segs[2], (64 + big.len() as u64, small.clone()));
    // Acknowledging into the middle of each kind.
    assert_eq!(tx.ack(32), Ok(32));
    assert_eq!(tx.segments().next().unwrap(), (32, small.slice(32..)));
    tx.check_invariants().unwrap();
    assert_eq!(tx.ack(100), Ok(68));
    assert_eq!(tx.segments().next().unwrap(), (100, big.slice(36..)));
    tx.check_invariants().unwrap();
    assert_eq!(tx.ack(tx.sent()), Ok(big.len() - 36 + 64));
    assert_eq!(tx.segments().count(), 0);
    tx.check_invariants().unwrap();
}

#[test]
fn copied_runs_stay_inside_a_frame_and_the_ring_small() {
    let mut tx = ReplayBuffer::new();
    let msg = Bytes::from(vec![1u8; 1000]);
    for i in 0..40 {
        tx.push(&msg);
        // The ring holds 8 KiB at most; the payloads beyond are held.
        assert_eq!(msg.is_unique(), i < 8, "after {} payloads", i + 1);
    }
    tx.check_invariants().unwrap();
    let segs: Vec<(u64, Bytes)> = tx.segments().collect();
    assert!(segs.iter().all(|(_, s)| s.len() <= 8192), "{segs:?}");
    let total: usize = segs.iter().map(|(_, s)| s.len()).sum();
    assert_eq!(total, 40_000);
    // Offsets are contiguous.
    let mut at = 0;
    for (o, s) in &segs {
        assert_eq!(*o, at);
        at += s.len() as u64;
    }
    assert_eq!(tx.ack(40_000), Ok(40_000));
    tx.check_invariants().unwrap();
}

#[test]
fn receiver_delivers_each_byte_once_in_order() {
    let t0 = test_epoch();
    let l = limits();
    let mut rx = Receiver::new();
    let mut out = Vec::new();
    let stream = Bytes::from_static(b"0123456789abcdef");
    // Early, then overlapping, then duplicate, then the gap.
    rx.segment(t0, 10, stream.slice(10..16), &l, &mut collect(&mut out))
        .unwrap();
    assert_eq!(rx.held(), 6);
    rx.segment(t0, 4, stream.slice(4..12), &l, &mut collect(&mut out))
        .unwrap();
    rx.segment(t0, 10, stream.slice(10..12), &l, &mut collect(&mut out))
        .unwrap();
    assert!(out.is_empty());
    rx.segment(t0, 0, stream.slice(0..6), &l, &mut collect(&mut out))
        .unwrap();
    assert_eq!(out, &stream[..]);
    assert_eq!(rx.held(), 0);
    rx.segment(t0, 3, stream.slice(3..9), &l, &mut collect(&mut out))
        .unwrap();
    assert_eq!(out, &stream[..]);
    rx.check_invariants().unwrap();
    // Plain DATA continues after the furthest segment.
    append(&mut out, rx.data(t0, Bytes::from_static(b"!"), &l).unwrap());
    assert_eq!(rx.received(), 17);
}

#[test]
fn receiver_bounds_what_it_holds() {
    let t0 = test_epoch();
    let l = limits();
    let mut rx = Receiver::new();
    let big = Bytes::from(vec![0u8; l.hold_limit + 1]);
    assert_eq!(
        rx.segment(t0, 1, big, &l, &mut |_| {}),
        Err(Error::Resume("replayed data beyond the hold limit"))
    );
    assert_eq!(rx.held(), 0);
}

#[test]
fn acks_are_due_by_size_or_by_time() {
    let t0 = test_epoch();
    let l = limits();
    let mut rx = Receiver::new();
    rx.data(t0, Bytes::from(vec![1u8; 40]), &l).unwrap();
    assert_eq!(rx.poll_ack(t0, &l), None);
    assert_eq!(rx.poll_timeout(), Some(t0 + l.ack_delay));
    assert_eq!(rx.poll_ack(t0 + l.ack_delay, &l), Some(40));
    assert_eq!(rx.poll_timeout(), None);
    rx.data(t0, Bytes::from(vec![1u8; 100]), &l).unwrap();
    assert_eq!(rx.poll_ack(t0, &l), Some(140));
    assert_eq!(rx.poll_ack(t0 + Duration::from_secs(1), &l), None);
}

#[test]
fn acks_are_due_by_segment_count() {
    // Every segment keeps a pooled buffer referenced at the sender: many
    // small ones are acknowledged before their bytes or the delay add up.
    let t0 = test_epoch();
    let l = ResumeLimits {
        ack_segments: 3,
        ..limits()
    };
    let mut rx = Receiver::new();
    for i in 1..=3u64 {
        assert_eq!(rx.poll_ack(t0, &l), None, "{i} segments");
        rx.data(t0, Bytes::from_static(b"x"), &l).unwrap();
    }
    assert_eq!(rx.poll_ack(t0, &l), Some(3));
    // A duplicate delivers nothing and counts nothing.
    rx.segment(t0, 0, Bytes::from_static(b"xyz"), &l, &mut |_| {})
        .unwrap();
    rx.data(t0, Bytes::from_static(b"y"), &l).unwrap();
    assert_eq!(rx.poll_ack(t0, &l), None);
}

#[test]
fn data_going_back_carries_the_ack_once_half_due() {
    let t0 = test_epoch();
    let l = limits();
    let half = l.ack_delay / 2;
    let mut c = ConnResume::new();
    assert_eq!(c.piggyback_ack(Some(t0), &l), None, "nothing received");
    c.data(t0, Bytes::from_static(b"ping"), &l).unwrap();
    assert_eq!(c.piggyback_ack(Some(t0), &l), None, "not half due");
    assert_eq!(c.piggyback_ack(None, &l), None, "no time seen");
    let just_before = t0 + half - Duration::from_nanos(1);
    assert_eq!(c.piggyback_ack(Some(just_before), &l), None);
    assert_eq!(c.piggyback_ack(Some(t0 + half), &l), Some(4));
    assert_eq!(c.poll_timeout(), None, "nothing left for the timer");
    assert_eq!(c.poll_ack(t0 + l.ack_delay, &l), None);
    assert_eq!(
        c.piggyback_ack(Some(t0 + l.ack_delay), &l),
        None,
        "sent once"
    );
    // Half the bytes ripen it at once.
    let big = Bytes::from(vec![0u8; usize::try_from(l.ack_bytes / 2).unwrap()]);
    c.data(t0, big, &l).unwrap();
    assert_eq!(c.piggyback_ack(Some(t0), &l), Some(4 + l.ack_bytes / 2));
    // Not while parked: the resume handshake announces the offset.
    c.data(t0, Bytes::from_static(b"!"), &l).unwrap();
    c.park();
    assert_eq!(c.piggyback_ack(Some(t0 + l.ack_delay), &l), None);
}

#[test]
fn a_session_queues_the_piggybacked_ack_with_the_data() {
    let t0 = test_epoch();
    let l = limits();
    let mut s = ResumeSession::new(l);
    s.open(7);
    s.received(t0, 7, Bytes::from_static(b"request")).unwrap();
    assert!(!s.has_packets(), "due by time only");
    assert!(s.ack_timer_pending());
    assert_eq!(s.sent(Some(t0), 7, &Bytes::from_static(b"reply")), Ok(true));
    assert!(!s.has_packets(), "a reply at once carries nothing");
    // The next request comes half the delay later: its reply carries the
    // ACK for both.
    let half = t0 + l.ack_delay / 2;
    s.received(half, 7, Bytes::from_static(b"again")).unwrap();
    assert_eq!(
        s.sent(Some(half), 7, &Bytes::from_static(b"reply")),
        Ok(true)
    );
    assert_eq!(
        s.poll_packet(),
        Some(Packet::Ack {
            connect_id: 7,
            offset: 12
        })
    );
    assert!(!s.has_packets());
    // The timer finds nothing left to send.
    s.handle_timeout(t0 + Duration::from_secs(1));
    assert_eq!(s.poll_packet(), None);
    assert!(!s.ack_timer_pending());
    // Data with nothing owed queues nothing.
    assert_eq!(
        s.sent(Some(half), 7, &Bytes::from_static(b"more")),
        Ok(true)
    );
    assert_eq!(s.poll_packet(), None);
}

#[test]
fn one_timer_wake_sends_the_acks_falling_due_soon_after() {
    let t0 = test_epoch();
    let l = limits();
    let mut s = ResumeSession::new(l);
    for id in [1, 2, 3] {
        s.open(id);
    }
    // Owed ACKs due at t0 + delay, an eighth of it later, and half later.
    s.received(t0, 1, Bytes::from_static(b"a")).unwrap();
    s.received(t0 + l.ack_delay / 8, 2, Bytes::from_static(b"b"))
        .unwrap();
    s.received(t0 + l.ack_delay / 2, 3, Bytes::from_static(b"c"))
        .unwrap();
    assert_eq!(s.poll_timeout(), Some(t0 + l.ack_delay));
    s.handle_timeout(t0 + l.ack_delay);
    let acked: Vec<i64> = std::iter::from_fn(|| s.poll_packet())
        .map(|p| match p {
            Packet::Ack { connect_id, .. } => connect_id,
            other => panic!("unexpected {other:?}"),
        })
        .collect();
    assert_eq!(
        acked,
        vec![1, 2],
        "the one due, and the one due within a quarter delay after it"
    );
    assert_eq!(s.poll_timeout(), Some(t0 + l.ack_delay / 2 + l.ack_delay));
}

#[test]
fn a_resume_replays_from_the_peers_offset() {
    let t0 = test_epoch();
    let l = limits();
    let (mut a, mut b) = (ConnResume::new(), ConnResume::new());
    let data = Bytes::from_static(b"abcdefghij");
    a.send(&data);
    let mut got = Vec::new();
    // Only "abcd" arrives before the cut.
    append(&mut got, b.data(t0, data.slice(..4), &l).unwrap());
    a.park();
    b.park();
    assert!(!a.may_read(&l));
    assert!(!a.may_read(&l), "parked: the source waits");
    assert!(b.data(t0, data.clone(), &l).is_err());
    assert_eq!(a.begin_sync(), 0);
    assert_eq!(b.begin_sync(), 4);
    assert_eq!(a.ack(4), Ok(true));
    let replay: Vec<(u64, Bytes)> = a.replay().collect();
    assert_eq!(replay, vec![(4, data.slice(4..))]);
    for (_, seg) in replay {
        append(&mut got, b.data(t0, seg, &l).unwrap());
    }
    assert_eq!(got, &data[..]);
    assert_eq!(b.ack(0), Ok(true));
    assert!(a.may_read(&l) && b.may_read(&l));
}

#[test]
fn a_close_lost_in_a_cut_is_replayed_and_acknowledged() {
    let t0 = test_epoch();
    let l = limits();
    let (mut a, mut b) = (ConnResume::new(), ConnResume::new());
    let data = Bytes::from_static(b"last words");
    a.send(&data);
    assert_eq!(a.send_close(), 10);
    assert!(!a.may_read(&l) && !a.done());
    // The cut loses both the DATA and the close.
    a.park();
    b.park();
    a.begin_sync();
    assert_eq!(b.begin_sync(), 0);
    assert_eq!(a.ack(0), Ok(true));
    assert!(a.tx().fin_unacked());
    let mut got = Vec::new();
    for (_, seg) in a.replay() {
        append(&mut got, b.data(t0, seg, &l).unwrap());
    }
    b.close_received(t0, &l).unwrap();
    assert!(b.rx().closed());
    assert_eq!(got, &data[..]);
    // Once `b` is live again (it had `a`'s announcement), the close's
    // acknowledgement is due at once and lets `a` forget.
    assert_eq!(b.poll_ack(t0, &l), None);
    assert_eq!(b.ack(0), Ok(true));
    assert_eq!(b.poll_ack(t0, &l), Some(11));
    assert_eq!(a.ack(11), Ok(false));
    assert!(a.done());
    assert!(
        b.data(t0, data.clone(), &l).is_err(),
        "DATA after the close"
    );
}

#[test]
fn a_resume_below_the_acknowledged_offset_is_refused() {
    let mut a = ConnResume::new();
    a.send(&Bytes::from_static(b"abcdef"));
    a.ack(4).unwrap();
    a.park();
    a.begin_sync();
    assert!(a.ack(2).is_err(), "the peer lost acknowledged bytes");
}

#[test]
fn tokens_round_trip_and_never_show() {
    let t = ResumeToken::from_random([0xa5; 16]);
    let hex = t.to_hex();
    assert_eq!(hex, "a5".repeat(16));
    assert_eq!(ResumeToken::parse(hex.as_bytes()), Some(t));
    assert_eq!(ResumeToken::parse(b"a5"), None);
    assert_eq!(ResumeToken::parse(&[b'g'; 32]), None);
    assert_eq!(ResumeToken::parse(&[b'+'; 32]), None);
    assert_eq!(format!("{t:?}"), "ResumeToken(..)");
    let v = t.presented("server-1");
    assert_eq!(v, format!("{hex}:server-1"));
    assert_eq!(
        ResumeToken::parse_presented(v.as_bytes(), "server-1"),
        Some(t)
    );
    assert_eq!(ResumeToken::parse_presented(v.as_bytes(), "server-2"), None);
    assert_eq!(
        ResumeToken::parse_presented(hex.as_bytes(), "server-1"),
        None
    );
    assert_eq!(
        ResumeToken::parse_presented(b"a5:server-1", "server-1"),
        None
    );
}

#[test]
fn a_parked_tunnel_is_claimed_only_by_its_agent_and_in_time() {
    let t0 = test_epoch();
    let mut table = ParkTable::new(2);
    let tok = ResumeToken::from_random([1; 16]);
    let other = ResumeToken::from_random([2; 16]);
    let deadline = t0 + Duration::from_secs(5);
    assert_eq!(table.park(tok, "agent-a", "cn=a", deadline, 7), None);
    assert_eq!(
        table.claim(&other, "agent-a", "cn=a", t0),
        Err(ClaimError::Unknown)
    );
    assert_eq!(
        table.claim(&tok, "agent-b", "cn=a", t0),
        Err(ClaimError::WrongIdentity)
    );
    assert_eq!(
        table.claim(&tok, "agent-a", "cn=b", t0),
        Err(ClaimError::WrongIdentity)
    );
    assert_eq!(
        table.claim(&tok, "agent-a", "cn=a", deadline),
        Err(ClaimError::Unknown)
    );
    assert_eq!(table.claim(&tok, "agent-a", "cn=a", t0), Ok(7));
    assert!(table.is_empty());
    // Full: the oldest goes; the window's end removes the rest.
    table.park(tok, "a", "a", deadline, 1);
    table.park(other, "b", "b", deadline + Duration::from_secs(1), 2);
    assert_eq!(table.park(tok, "c", "c", deadline, 3), Some(1));
    assert_eq!(table.poll_timeout(), Some(deadline));
    let mut gone = table.expire(deadline);
    gone.sort_unstable();
    assert_eq!(gone, vec![3]);
    assert_eq!(table.len(), 1);
    assert_eq!(table.drain().collect::<Vec<_>>(), vec![2]);
}

// ---- the property test ------------------------------------------------

/// What travels on one direction of the simulated tunnel.
#[derive(Clone, Debug)]
enum Msg {
    /// Plain DATA (live, or a replay sent in order).
    Data(Bytes),
    /// A replayed segment with its offset (split, duplicated, reordered).
    Seg(u64, Bytes),
    Ack(u64),
    /// CLOSE_REQ / CLOSE_RSP, plain.
    Close,
    /// A replayed close with its offset.
    CloseAt(u64),
}

#[derive(Clone, Debug)]
enum Op {
    /// Side sends the next `len` bytes of its source, if it may read.
    Send(usize, usize),
    /// Up to `n` messages travel towards side `to`.
    Deliver(usize, usize),
    /// Side sends its ACK if one is due.
    Ack(usize),
    /// Side closes, if it sent its whole source.
    Close(usize),
    /// The clock moves.
    Tick(u64),
    /// The tunnel breaks after `k0` / `k1` of the in-flight messages
    /// towards side 0 / 1 got through.
    Cut(usize, usize),
    /// The agent reconnects.
    Resume,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..2usize, 1..700usize).prop_map(|(s, l)| Op::Send(s, l)),
        6 => (0..2usize, 1..8usize).prop_map(|(s, n)| Op::Deliver(s, n)),
        3 => (0..2usize).prop_map(Op::Ack),
        2 => (0..2usize).prop_map(Op::Close),
        2 => (0..30u64).prop_map(Op::Tick),
        2 => (0..20usize, 0..20usize).prop_map(|(a, b)| Op::Cut(a, b)),
        2 => Just(Op::Resume),
    ]
}

struct Side {
    conn: ConnResume,
    /// The source stream this side sends (and how much of it it read).
    source: Vec<u8>,
    read: usize,
    /// What this side delivered of the peer's stream.
    delivered: Vec<u8>,
}

struct Model {
    sides: [Side; 2],
    /// `wire[i]`: messages travelling towards side `i`.
    wire: [VecDeque<Msg>; 2],
    now: Instant,
    parked: bool,
    limits: ResumeLimits,
}

/// A tiny deterministic generator for mangling replays.
fn next(seed: &mut u64) -> u64 {
    *seed ^= *seed << 13;
    *seed ^= *seed >> 7;
    *seed ^= *seed << 17;
    *seed
}

impl Model {
    fn new(seed: u8, lens: [usize; 2]) -> Self {
        let side = |k: u8, len: usize| Side {
            conn: ConnResume::new(),
            source: (0..len).map(|i| (i as u8) ^ k ^ seed).collect(),
            read: 0,
            delivered: Vec::new(),
        };
        Self {
            sides: [side(0, lens[0]), side(0x5a, lens[1])],
            wire: [VecDeque::new(), VecDeque::new()],
            now: test_epoch(),
            parked: false,
            limits: limits(),
        }
    }

    fn step(&mut self, op: &Op) {
        match *op {
            Op::Send(s, len) => {
                let side = &mut self.sides[s];
                if side.read < side.source.len() && side.conn.may_read(&self.limits) {
                    let end = (side.read + len).min(side.source.len());
                    let data = Bytes::copy_from_slice(&side.source[side.read..end]);
                    side.read = end;
                    side.conn.send(&data);
                    self.wire[1 - s].push_back(Msg::Data(data));
                    if let Some(off) = side.conn.piggyback_ack(Some(self.now), &self.limits) {
                        self.wire[1 - s].push_back(Msg::Ack(off));
                    }
                }
            }
            Op::Deliver(to, n) => {
                if !self.parked {
                    for _ in 0..n {
                        let Some(m) = self.wire[to].pop_front() else {
                            break;
                        };
                        self.receive(to, m);
                    }
                }
            }
            Op::Ack(s) => {
                if let Some(off) = self.sides[s].conn.poll_ack(self.now, &self.limits) {
                    self.wire[1 - s].push_back(Msg::Ack(off));
                }
            }
            Op::Close(s) => {
                let side = &mut self.sides[s];
                if side.read == side.source.len()
                    && side.conn.phase() == Phase::Live
                    && !side.conn.tx().fin_sent()
                {
                    side.conn.send_close();
                    self.wire[1 - s].push_back(Msg::Close);
                }
            }
            Op::Tick(ms) => self.now += Duration::from_millis(ms),
            Op::Cut(k0, k1) => {
                if !self.parked {
                    for (to, k) in [(0, k0), (1, k1)] {
                        for _ in 0..k {
                            let Some(m) = self.wire[to].pop_front() else {
                                break;
                            };
                            self.receive(to, m);
                        }
                    }
                    // The rest is lost, and so is whatever the deliveries
                    // just sent (the connection is gone).
                    for w in &mut self.wire {
                        w.clear();
                    }
                    for side in &mut self.sides {
                        side.conn.park();
                    }
                    self.parked = true;
                }
            }
            Op::Resume => self.resume(),
        }
        for side in &self.sides {
            side.conn.check_invariants().unwrap();
        }
    }

    fn resume(&mut self) {
        if !self.parked {
            return;
        }
        self.parked = false;
        for s in 0..2 {
            let off = self.sides[s].conn.begin_sync();
            self.wire[1 - s].push_back(Msg::Ack(off));
        }
    }

    fn receive(&mut self, to: usize, m: Msg) {
        let now = self.now;
        let limits = self.limits;
        let side = &mut self.sides[to];
        let out = &mut side.delivered;
        match m {
            Msg::Data(d) => append(out, side.conn.data(now, d, &limits).unwrap()),
            Msg::Seg(o, d) => side
                .conn
                .segment(now, o, d, &limits, &mut collect(out))
                .unwrap(),
            Msg::Close => side.conn.close_received(now, &limits).unwrap(),
            Msg::CloseAt(o) => side.conn.close_received_at(now, o, &limits).unwrap(),
            Msg::Ack(off) => {
                if side.conn.ack(off).unwrap() {
                    // The replay as a mangling wire would deliver it (the
                    // property must hold for duplicated and reordered
                    // segments too).
                    let mut seed = off ^ 0x9e37_79b9_7f4a_7c15 ^ (to as u64);
                    let fin = side.conn.tx().fin_unacked().then(|| side.conn.tx().sent());
                    let batch = mangle(side.conn.replay(), fin, &mut seed);
                    self.wire[1 - to].extend(batch);
                }
            }
        }
    }

    /// Ends the scenario: resume if parked, then run until everything is
    /// sent, delivered and acknowledged.
    fn finish(&mut self) {
        self.resume();
        for _ in 0..100_000 {
            let busy = self.wire.iter().any(|w| !w.is_empty())
                || self
                    .sides
                    .iter()
                    .any(|s| !s.conn.done() || !s.conn.rx().closed());
            if !busy {
                break;
            }
            self.step(&Op::Send(0, 512));
            self.step(&Op::Send(1, 512));
            self.step(&Op::Close(0));
            self.step(&Op::Close(1));
            self.step(&Op::Deliver(0, 16));
            self.step(&Op::Deliver(1, 16));
            self.step(&Op::Tick(10));
            self.step(&Op::Ack(0));
            self.step(&Op::Ack(1));
        }
        for s in 0..2 {
            let (me, peer) = (&self.sides[s], &self.sides[1 - s]);
            assert_eq!(
                peer.delivered.len(),
                me.source.len(),
                "side {s}'s stream length"
            );
            assert!(peer.delivered == me.source, "side {s}'s stream differs");
            assert!(me.conn.done(), "side {s}'s close acknowledged");
            assert!(peer.conn.rx().closed(), "side {s}'s close delivered");
            assert_eq!(me.conn.tx().unacked(), 0);
            assert_eq!(peer.conn.rx().held(), 0);
        }
    }
}

/// A replay as a mangling wire delivers it: segments split at random
/// points, some pieces duplicated, the batch shuffled — unless `seed`
/// says to send it plain, as the real wire does.
fn mangle(segs: impl Iterator<Item = (u64, Bytes)>, fin: Option<u64>, seed: &mut u64) -> Vec<Msg> {
    let plain = next(seed).is_multiple_of(4);
    let mut out = Vec::new();
    for (off, seg) in segs {
        if plain {
            out.push(Msg::Data(seg.clone()));
            continue;
        }
        let cut = (next(seed) as usize) % (seg.len() + 1);
        for (o, piece) in [
            (off, seg.slice(..cut)),
            (off + cut as u64, seg.slice(cut..)),
        ] {
            if !piece.is_empty() {
                out.push(Msg::Seg(o, piece));
            }
        }
        // Duplicates that overlap the pieces: the whole segment, or a
        // random part of it.
        match next(seed) % 3 {
            0 => out.push(Msg::Seg(off, seg.clone())),
            1 => {
                let a = (next(seed) as usize) % (seg.len() + 1);
                let b = a + (next(seed) as usize) % (seg.len() - a + 1);
                out.push(Msg::Seg(off + a as u64, seg.slice(a..b)));
            }
            _ => {}
        }
    }
    if let Some(at) = fin {
        out.push(if plain { Msg::Close } else { Msg::CloseAt(at) });
        if !plain && next(seed).is_multiple_of(3) {
            out.push(Msg::CloseAt(at));
        }
    }
    if !plain {
        // Fisher–Yates with the seed.
        for i in (1..out.len()).rev() {
            let j = (next(seed) as usize) % (i + 1);
            out.swap(i, j);
        }
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Random sends, closes, deliveries, ACK timing, cuts (with random
    /// parts of the in-flight data lost) and resumes whose replays are
    /// split, duplicated and reordered: each side delivers exactly the
    /// other's stream, every byte once and in order, then its close, and
    /// both end with everything acknowledged and nothing held.
    #[test]
    fn delivered_stream_equals_sent_stream(
        seed in any::<u8>(),
        lens in [0..3000usize, 0..3000usize],
        ops in proptest::collection::vec(op(), 0..400),
    ) {
        let mut m = Model::new(seed, lens);
        for op in &ops {
            m.step(op);
        }
        m.finish();
    }
}

#[test]
fn per_connection_state_is_small() {
    // The S5 budget: resume may add at most 1 KiB per connection; an idle
    // connection's resume state allocates nothing beyond this.
    assert!(size_of::<ConnResume>() <= 256);
    let c = ConnResume::new();
    assert_eq!(c.held_bytes(), 0);
}

// ---- ResumeSession: a tunnel's connections across a cut ---------------

/// What one side of a tunnel puts on the wire in these tests.
#[derive(Clone, Debug, PartialEq)]
enum W {
    Data(i64, Bytes),
    Close(i64),
    P(Packet),
}

use konn_frames::packet::Packet;

/// One side: its session, what it delivered per connection, the closes
/// it saw, and what it has sent towards the other side.
struct End {
    s: ResumeSession,
    got: std::collections::HashMap<i64, Vec<u8>>,
    closed: Vec<i64>,
    out: VecDeque<W>,
}

impl End {
    fn new(ids: &[i64]) -> Self {
        let mut s = ResumeSession::new(limits());
        for &id in ids {
            s.open(id);
        }
        Self {
            s,
            got: Default::default(),
            closed: Vec::new(),
            out: VecDeque::new(),
        }
    }

    fn send(&mut self, id: i64, data: &'static [u8]) {
        let b = Bytes::from_static(data);
        self.s.sent(None, id, &b).unwrap();
        self.out.push_back(W::Data(id, b));
    }

    fn close(&mut self, id: i64) {
        self.s.close_sent(id).unwrap();
        self.out.push_back(W::Close(id));
    }

    fn flush_acks(&mut self, now: Instant) {
        self.s.handle_timeout(now);
        while let Some(p) = self.s.poll_packet() {
            self.out.push_back(W::P(p));
        }
    }

    fn receive(&mut self, now: Instant, w: W) {
        match w {
            W::Data(id, d) => {
                let got = self.got.entry(id).or_default();
                append(got, self.s.received(now, id, d).unwrap());
            }
            W::Close(id) => {
                if self.s.close_received(now, id).unwrap() {
                    self.closed.push(id);
                }
            }
            W::P(Packet::Ack { connect_id, offset }) => {
                // An announcement for a connection we forgot is answered
                // with a close by the caller; nothing to do here.
                if let Ok(Some(r)) = self.s.ack(connect_id, offset) {
                    for d in r.data {
                        self.out.push_back(W::Data(connect_id, d));
                    }
                    if r.close {
                        self.out.push_back(W::Close(connect_id));
                    }
                }
            }
            W::P(Packet::Resumed) => {
                for id in self.s.peer_resumed() {
                    self.closed.push(id);
                }
            }
            W::P(p) => panic!("unexpected {p:?}"),
        }
        self.s.check_invariants().unwrap();
    }
}

/// Moves everything both ways until quiet (bounded).
fn pump(now: Instant, a: &mut End, b: &mut End) {
    for _ in 0..100 {
        a.flush_acks(now);
        b.flush_acks(now);
        if a.out.is_empty() && b.out.is_empty() {
            return;
        }
        while let Some(w) = a.out.pop_front() {
            b.receive(now, w);
        }
        while let Some(w) = b.out.pop_front() {
            a.receive(now, w);
        }
    }
    panic!("no quiescence");
}

#[test]
fn a_session_resumes_data_and_closes_lost_in_a_cut() {
    let t0 = test_epoch();
    let (mut srv, mut agt) = (End::new(&[1, 2, 3]), End::new(&[1, 2, 3]));
    srv.send(1, b"kubectl ");
    agt.send(1, b"exec ");
    pump(t0, &mut srv, &mut agt);
    // Connection 2 ends at the agent (destination EOF): CLOSE_RSP arrives,
    // the server acknowledges it, and the ACK is lost in the cut.
    agt.close(2);
    while let Some(w) = agt.out.pop_front() {
        srv.receive(t0, w);
    }
    assert_eq!(srv.closed, vec![2]);
    srv.flush_acks(t0);
    assert!(!srv.s.contains(2), "acknowledged and forgotten");
    // In flight and lost: more data both ways, and connection 3's last
    // bytes and close.
    srv.send(1, b"-it pod ");
    agt.send(1, b"sh-5.2# ");
    agt.send(3, b"bye");
    agt.close(3);
    srv.out.clear();
    agt.out.clear();
    let window = Duration::from_secs(3);
    srv.s.park(t0, window);
    agt.s.park(t0, window);
    assert!(!srv.s.may_read(1) && !agt.s.may_read(1));
    assert_eq!(srv.s.poll_timeout(), Some(t0 + window));
    assert!(!srv.s.expired(t0 + window - Duration::from_millis(1)));
    // The reconnect: both announce, replay, and settle.
    srv.s.resume();
    agt.s.resume();
    pump(t0, &mut srv, &mut agt);
    assert_eq!(srv.s.state(), SessionState::Live);
    assert_eq!(srv.got[&1], b"exec sh-5.2# ");
    assert_eq!(agt.got[&1], b"kubectl -it pod ");
    assert_eq!(srv.got[&3], b"bye");
    assert_eq!(srv.closed, vec![2, 3]);
    // The agent's connection 2 was not announced by the server: gone.
    assert_eq!(agt.closed, vec![2]);
    assert!(!agt.s.contains(2) && !agt.s.contains(3) && !srv.s.contains(3));
    assert!(srv.s.may_read(1) && agt.s.may_read(1));
    // Both sides hold nothing once ACKs flowed.
    srv.send(1, b"ls\n");
    pump(t0 + Duration::from_millis(20), &mut srv, &mut agt);
    pump(t0 + Duration::from_millis(40), &mut srv, &mut agt);
    assert_eq!(srv.s.held_bytes(), 0);
    assert_eq!(agt.s.held_bytes(), 0);
}

#[test]
fn a_parked_session_expires_and_abandons_everything() {
    let t0 = test_epoch();
    let mut s = ResumeSession::new(limits());
    s.open(4);
    s.open(-1);
    s.sent(Some(t0), 4, &Bytes::from_static(b"x")).unwrap();
    s.park(t0, Duration::from_secs(1));
    assert_eq!(
        s.sent(Some(t0), 4, &Bytes::from_static(b"y")),
        Ok(false),
        "kept for the replay"
    );
    assert!(s.expired(t0 + Duration::from_secs(1)));
    let mut gone = s.abandon();
    gone.sort_unstable();
    assert_eq!(gone, vec![-1, 4]);
    assert!(s.is_empty());
    assert_eq!(s.held_bytes(), 0);
}

#[test]
fn a_close_the_peer_never_acknowledges_is_forgotten_after_the_linger() {
    let t0 = test_epoch();
    let linger = limits().close_linger;
    let mut s = ResumeSession::new(limits());
    for id in [1, 2] {
        s.open(id);
        s.received(t0, id, Bytes::from_static(b"x")).unwrap();
    }
    // Closes are stamped with the latest time the session saw.
    let t1 = t0 + Duration::from_millis(10);
    s.handle_timeout(t1);
    while s.poll_packet().is_some() {}
    assert_eq!(s.close_sent(1), Ok(true));
    assert_eq!(s.close_sent(2), Ok(true));
    // The peer acknowledges 2's close (its byte and the close), never 1's.
    assert_eq!(s.ack(2, 1), Ok(None));
    assert!(s.contains(1) && !s.contains(2));
    // Parked, nothing lingers out: the resume will tell.
    s.park(t1, Duration::from_secs(600));
    s.handle_timeout(t1 + linger);
    assert!(s.contains(1));
    s.resume();
    assert_eq!(s.ack(1, 0).map(|r| r.map(|r| r.close)), Ok(Some(true)));
    assert!(s.peer_resumed().is_empty());
    assert_eq!(s.poll_timeout(), Some(t1 + linger));
    s.handle_timeout(t1 + linger);
    assert!(s.is_empty(), "the unacknowledged close is forgotten");
    assert_eq!(s.poll_timeout(), None);
}

#[test]
fn a_session_refuses_bad_acks() {
    let mut s = ResumeSession::new(limits());
    s.open(1);
    assert!(s.ack(1, -5).is_err());
    assert!(s.ack(1, 1).is_err(), "nothing sent");
    assert!(s.ack(9, 0).is_err(), "unknown connection");
    assert_eq!(s.ack(1, 0), Ok(None));
}

#[test]
fn in_order_data_is_not_copied_and_untracked_data_passes_through() {
    let t0 = test_epoch();
    let mut s = ResumeSession::new(limits());
    s.open(1);
    let sent = Bytes::from(vec![7u8; 100]);
    let got = s.received(t0, 1, sent.clone()).unwrap();
    let got = got.expect("the payload delivered");
    assert_eq!(
        got.as_ptr(),
        sent.as_ptr(),
        "the payload's bytes, not a copy"
    );
    assert_eq!(got.len(), 100);
    // A connection without resume state: delivered whole, nothing tracked.
    let other = Bytes::from_static(b"no resume state");
    assert_eq!(s.received(t0, 9, other.clone()), Ok(Some(other)));
    assert!(!s.contains(9));
    assert_eq!(s.len(), 1);
}
