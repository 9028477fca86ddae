//! The router's `konn-resume` hooks (docs/design/resume.md): one
//! [`ResumeSession`] per local backend that negotiated resume, kept at the
//! tunnel's boundary — every packet from the agent passes
//! [`Router::resume_in`] before routing, every packet to it
//! [`Router::resume_out`] — so flows of this core's frontends and flows
//! relayed for other cores are counted alike. When the tunnel breaks
//! ([`Router::backend_broken`]) the backend leaves the directory, its
//! pending dials fail, its local frontends are paused and its relayed
//! flows close (they cannot be paused from here); the rest waits for
//! [`Router::backend_resumed`] or the window's end. Inert unless
//! [`Router::set_resume`] was called.

use crate::maps::IdMap;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use konn_frames::packet::{ByteStr, Packet};

use super::*;
use crate::resume::{Replay, ResumeLimits, ResumeSession, SessionState};

/// The CLOSE_RSP error a frontend gets when its agent broke the resume
/// protocol for its connection.
pub const RESUME_VIOLATION: &str = "konn: resume protocol violation; connection closed";

/// What [`Router::resume_out`] says about a packet to a backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Out {
    /// Send it now.
    Now,
    /// Send it now, then the session's ACK that goes with it
    /// ([`Router::flush_resume`]).
    WithAck,
    /// Not now: the replay sends it.
    Later,
}

impl Out {
    fn when(now: bool) -> Self {
        if now { Self::Now } else { Self::Later }
    }
}

/// DATA of `connect_id` leaving on session `s`'s tunnel: recorded for
/// replay in any phase (a parked or syncing connection's data goes out
/// with its replay), with the ACK the connection owes if it is half due.
fn data_out(
    s: &mut ResumeSession,
    now: Option<Instant>,
    connect_id: i64,
    data: &Bytes,
    live: bool,
) -> Out {
    // An untracked connection (no resume state) is sent as is.
    let send = s.sent(now, connect_id, data).unwrap_or(live);
    if send && s.has_packets() {
        Out::WithAck
    } else {
        Out::when(send)
    }
}

/// The router's resume state: sessions of local backends, and the
/// directory entries of parked ones.
#[derive(Debug, Default)]
pub(super) struct ResumeState {
    sessions: IdMap<BackendId, ResumeSession>,
    parked: IdMap<BackendId, Entry>,
    /// A packet from an agent left an ACK owed by time (see
    /// [`Router::take_resume_timer`]).
    timer_armed: bool,
    /// The latest time a packet came in with: whether an owed ACK is half
    /// due when DATA leaves ([`Router::resume_out`] has no time of its own).
    now: Option<Instant>,
}

impl Router {
    /// Backend `id` (a local tunnel) negotiated `konn-resume` (`Some`), or
    /// not.
    pub fn set_resume(&mut self, id: BackendId, limits: Option<ResumeLimits>) {
        match limits {
            Some(l) if self.backends.contains_key(&id) => {
                self.resume.sessions.insert(id, ResumeSession::new(l));
            }
            _ => {
                self.resume.sessions.remove(&id);
            }
        }
    }

    /// Backend `id`'s resume state, when negotiated.
    pub fn resume_session(&self, id: BackendId) -> Option<&ResumeSession> {
        self.resume.sessions.get(&id)
    }

    /// Whether backend `id` is parked (its tunnel broke; it waits for a
    /// resume until its window ends).
    pub fn backend_parked(&self, id: BackendId) -> bool {
        self.resume.parked.contains_key(&id)
    }

    /// The tunnel of backend `id` broke at `now`. With resume negotiated,
    /// a `window` and nothing in the way, the backend is parked and `true`
    /// returned; otherwise `false`, and the caller ends it with
    /// [`Router::backend_gone`] as before.
    pub fn backend_broken(&mut self, now: Instant, id: BackendId, window: Duration) -> bool {
        let local = self.backends.get(&id).is_some_and(|b| b.remote.is_none());
        if window.is_zero() || !local || !self.resume.sessions.contains_key(&id) {
            return false;
        }
        let Some(entry) = self.directory.remove(id) else {
            return false;
        };
        if entry.draining {
            // The agent announced its shutdown: nothing to wait for.
            self.directory.add(entry);
            return false;
        }
        self.resume.parked.insert(id, entry);
        let Some(b) = self.backends.get_mut(&id) else {
            return false;
        };
        let pending: Vec<i64> = std::mem::take(&mut b.pending).into_iter().collect();
        let relayed: Vec<(i64, usize)> = b.relay_established.drain().collect();
        let relay_dials: Vec<(i64, usize)> = b.relay_pending.drain().collect();
        let mut local_flows: Vec<(i64, FrontendId)> =
            b.established.iter().map(|(c, f)| (*c, *f)).collect();
        local_flows.sort_unstable();
        // Dials fail as on a lost tunnel: they have no bytes to lose.
        for random in pending {
            let Some(p) = self.pending.remove(&random) else {
                continue;
            };
            self.actions
                .push_back(Action::DialFailed(DialFailure::BackendClose));
            self.fail_dial(p.frontend, random, BACKEND_GONE, DialFail::BackendGone);
        }
        // Other cores' dials and flows end there (their routers cannot be
        // paused from here); the agent closes its side after the resume.
        for (random, core) in relay_dials {
            self.relay_from_backend(core, id, Packet::DialCls { random });
        }
        for (connect_id, core) in relayed {
            if let Some(s) = self.resume.sessions.get_mut(&id) {
                s.forget(connect_id);
            }
            let close = Packet::CloseRsp {
                error: ByteStr::new(),
                connect_id,
            };
            self.relay_from_backend(core, id, close);
        }
        // This core's frontends stop being read until their flow resumes.
        for (_, fid) in local_flows {
            if let Some(f) = self.frontends.get_mut(&fid) {
                if f.rx_backend == Some(id) {
                    f.rx.stream_gone();
                }
                if !std::mem::replace(&mut f.paused, true) {
                    self.actions
                        .push_back(Action::PauseFrontend { frontend: fid });
                }
            }
        }
        if let Some(s) = self.resume.sessions.get_mut(&id) {
            s.park(now, window);
        }
        true
    }

    /// The agent presented backend `id`'s token on a new stream, which the
    /// IO layer bound to the same id: back in the directory, every parked
    /// connection announced, then RESUMED.
    pub fn backend_resumed(&mut self, id: BackendId) {
        let Some(entry) = self.resume.parked.remove(&id) else {
            return;
        };
        self.directory.add(entry);
        if let Some(s) = self.resume.sessions.get_mut(&id) {
            s.resume();
        }
        self.flush_resume(id);
    }

    /// A packet from backend `id`, before routing: the packet to route
    /// (`None`: consumed — an ACK or RESUMED, a duplicate, a violation).
    pub(super) fn resume_in(
        &mut self,
        now: Instant,
        id: BackendId,
        packet: Packet,
        framed: Bytes,
    ) -> Option<(Packet, Bytes)> {
        self.resume.now = Some(now);
        let Some(s) = self.resume.sessions.get_mut(&id) else {
            return Some((packet, framed));
        };
        match packet {
            Packet::DialRsp {
                ref error,
                connect_id,
                ..
            } if error.is_empty() && connect_id != 0 => s.open(connect_id),
            Packet::Data {
                connect_id,
                data,
                error,
            } => {
                // The payload moves through the session and, in order,
                // comes back as itself: no handle is cloned.
                let whole = data.len();
                let res = s.received(now, connect_id, data);
                let armed = s.ack_timer_pending();
                let flush = s.has_packets();
                self.resume.timer_armed |= armed;
                if flush {
                    self.flush_resume(id);
                }
                return match res {
                    Err(_) => {
                        self.resume_violation(now, id, connect_id);
                        None
                    }
                    Ok(None) => None, // a duplicate
                    Ok(Some(data)) if data.len() == whole => Some((
                        Packet::Data {
                            connect_id,
                            error,
                            data,
                        },
                        framed,
                    )),
                    Ok(Some(data)) => {
                        // Partly new (this wire does not produce it): the
                        // new part, re-encoded.
                        let p = Packet::Data {
                            connect_id,
                            error: ByteStr::new(),
                            data,
                        };
                        let framed = encode(&p);
                        Some((p, framed))
                    }
                };
            }
            Packet::CloseRsp { connect_id, .. } | Packet::CloseReq { connect_id }
                if s.contains(connect_id) =>
            {
                let fresh = s.close_received(now, connect_id).unwrap_or(true);
                self.flush_resume(id);
                if !fresh {
                    return None;
                }
            }
            Packet::Ack { connect_id, offset } => {
                let known = s.contains(connect_id);
                let res = s.ack(connect_id, offset);
                let syncing = s.state() == SessionState::Syncing;
                match res {
                    Ok(Some(replay)) => self.replay(id, connect_id, replay),
                    Ok(None) => {}
                    Err(_) if !known => {
                        if syncing {
                            // Announced by the agent, unknown here: gone.
                            let p = Packet::CloseReq { connect_id };
                            self.send_backend(id, Payload::Packet(p));
                        }
                    }
                    Err(_) => self.resume_violation(now, id, connect_id),
                }
                self.flush_resume(id);
                return None;
            }
            Packet::Resumed => {
                let gone = s.peer_resumed();
                for connect_id in gone {
                    self.end_flow(now, id, connect_id, "");
                }
                return None;
            }
            _ => {}
        }
        Some((packet, framed))
    }

    /// A frontend's packet came in at `now` (see [`ResumeState::now`]).
    pub(super) fn resume_clock(&mut self, now: Instant) {
        self.resume.now = Some(now);
    }

    /// A packet about to be sent to local backend `id`: whether to send it
    /// now. DATA and closes are recorded for replay; while the tunnel is
    /// parked or syncing they wait for the replay instead of being sent.
    /// DATA sent now may carry an ACK its connection owed
    /// ([`Out::WithAck`]). `data`: the DATA's connection and payload when
    /// the caller has them decoded already (the frontends' DATA, every
    /// packet of a flow), so `payload` need not be decoded again.
    pub(super) fn resume_out(
        &mut self,
        id: BackendId,
        payload: &Payload,
        data: Option<(i64, &Bytes)>,
    ) -> Out {
        if self.resume.sessions.is_empty() {
            return Out::Now;
        }
        let now = self.resume.now;
        let Some(s) = self.resume.sessions.get_mut(&id) else {
            return Out::Now;
        };
        let live = s.state() == SessionState::Live;
        if let Some((connect_id, data)) = data {
            return data_out(s, now, connect_id, data, live);
        }
        let decoded;
        let packet = match payload {
            Payload::Packet(p) => p,
            Payload::Forward(framed) if framed.len() >= 5 => {
                decoded = Packet::decode(&framed.slice(5..));
                match &decoded {
                    Ok(p) => p,
                    Err(_) => return Out::when(live),
                }
            }
            Payload::Forward(_) => return Out::when(live),
        };
        match packet {
            Packet::Data {
                connect_id, data, ..
            } => data_out(s, now, *connect_id, data, live),
            Packet::CloseReq { connect_id } | Packet::CloseRsp { connect_id, .. }
                if s.contains(*connect_id) =>
            {
                Out::when(s.close_sent(*connect_id).unwrap_or(live))
            }
            _ => Out::when(live),
        }
    }

    /// Sends one connection's replay and lets its frontend be read again.
    fn replay(&mut self, id: BackendId, connect_id: i64, replay: Replay) {
        for data in replay.data {
            let p = Packet::Data {
                connect_id,
                error: ByteStr::new(),
                data,
            };
            self.actions.push_back(Action::ToBackend {
                backend: id,
                payload: Payload::Packet(p),
            });
        }
        if replay.close {
            let p = if connect_id < 0 {
                Packet::CloseRsp {
                    error: ByteStr::new(),
                    connect_id,
                }
            } else {
                Packet::CloseReq { connect_id }
            };
            self.actions.push_back(Action::ToBackend {
                backend: id,
                payload: Payload::Packet(p),
            });
        }
        if let Some(fid) = self.established(id, connect_id)
            && let Some(f) = self.frontends.get_mut(&fid)
            && std::mem::replace(&mut f.paused, false)
        {
            let credit = std::mem::take(&mut f.held);
            self.actions.push_back(Action::ResumeFrontend {
                frontend: fid,
                credit,
            });
        }
    }

    /// The agent broke the resume protocol for `connect_id`: close it on
    /// both sides.
    fn resume_violation(&mut self, now: Instant, id: BackendId, connect_id: i64) {
        self.send_backend(id, Payload::Packet(Packet::CloseReq { connect_id }));
        self.end_flow(now, id, connect_id, RESUME_VIOLATION);
    }

    /// Ends flow `connect_id` of backend `id` at this end as if the agent
    /// had closed it (CLOSE_RSP with `error`), forgetting its resume state.
    fn end_flow(&mut self, now: Instant, id: BackendId, connect_id: i64, error: &str) {
        if let Some(s) = self.resume.sessions.get_mut(&id) {
            s.forget(connect_id);
        }
        let p = Packet::CloseRsp {
            error: if error.is_empty() {
                ByteStr::new()
            } else {
                ByteStr::from(error.to_owned())
            },
            connect_id,
        };
        let framed = encode(&p);
        // No credit came with it: nothing to return.
        let _ = self.backend_packet(now, id, p, framed, 0);
    }

    /// Sends backend `id`'s session packets (handshake, ACKs due).
    pub(super) fn flush_resume(&mut self, id: BackendId) {
        let Some(s) = self.resume.sessions.get_mut(&id) else {
            return;
        };
        // Bounded: each round takes one packet off the session's queue.
        while let Some(p) = s.poll_packet() {
            self.actions.push_back(Action::ToBackend {
                backend: id,
                payload: Payload::Packet(p),
            });
        }
    }

    /// Backend `id` is gone for good: forget its resume state.
    pub(super) fn resume_forget(&mut self, id: BackendId) {
        self.resume.sessions.remove(&id);
        self.resume.parked.remove(&id);
    }

    /// Whether a packet from an agent left an ACK owed by time since the
    /// last call (O(1); the IO layer then makes sure its timer wakes
    /// within the ACK delay, [`ResumeLimits::ack_delay`]).
    pub fn take_resume_timer(&mut self) -> bool {
        std::mem::take(&mut self.resume.timer_armed)
    }

    /// The resume state's next deadline alone (ACKs due by time, lingering
    /// closes, parked windows): what [`Router::handle_resume_timeout`]
    /// handles. O(sessions), unlike [`Router::poll_timeout`].
    pub fn resume_poll_timeout(&self) -> Option<Instant> {
        self.resume_timeout()
    }

    /// The resume state's timers alone at `now` (see
    /// [`Router::resume_poll_timeout`]); a parked backend whose window
    /// ended goes as a lost tunnel does.
    pub fn handle_resume_timeout(&mut self, now: Instant) {
        self.resume_handle_timeout(now);
    }

    /// The earliest ACK or window deadline.
    pub(super) fn resume_timeout(&self) -> Option<Instant> {
        self.resume
            .sessions
            .values()
            .filter_map(ResumeSession::poll_timeout)
            .min()
    }

    /// ACKs due at `now`; parked backends whose window ended go as lost
    /// tunnels do.
    pub(super) fn resume_handle_timeout(&mut self, now: Instant) {
        if self.resume.sessions.is_empty() {
            return;
        }
        let mut expired: Vec<BackendId> = Vec::new();
        let mut live: Vec<BackendId> = Vec::new();
        for (id, s) in &self.resume.sessions {
            if s.expired(now) {
                expired.push(*id);
            } else if s.poll_timeout().is_some_and(|t| t <= now) {
                live.push(*id);
            }
        }
        expired.sort_unstable();
        for id in expired {
            self.backend_gone(id);
        }
        for id in live {
            if let Some(s) = self.resume.sessions.get_mut(&id) {
                s.handle_timeout(now);
            }
            self.flush_resume(id);
        }
    }

    /// Relays a packet of local backend `id` to the frontend core `core`.
    fn relay_from_backend(&mut self, core: usize, id: BackendId, p: Packet) {
        self.actions.push_back(Action::Relay {
            core,
            relay: Relay::FromBackend {
                backend: id,
                payload: Payload::Packet(p),
                credit: 0,
            },
        });
    }
}

/// `p` as a gRPC message (prefix included), for the rare packets the
/// resume path makes up but routes like received ones.
fn encode(p: &Packet) -> Bytes {
    let mut b = BytesMut::with_capacity(p.encoded_len() + 5);
    p.encode_grpc(&mut b);
    b.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::backends::{Directory, Identifiers, Strategy};

    fn t0() -> Instant {
        crate::test_epoch()
    }

    fn framed(p: &Packet) -> Bytes {
        encode(p)
    }

    fn actions(r: &mut Router) -> Vec<Action> {
        std::iter::from_fn(|| r.poll_action()).collect()
    }

    fn decode(p: &Payload) -> Packet {
        match p {
            Payload::Packet(p) => p.clone(),
            Payload::Forward(b) => Packet::decode(&b.slice(5..)).unwrap(),
        }
    }

    fn to_backend(acts: &[Action]) -> Vec<Packet> {
        acts.iter()
            .filter_map(|a| match a {
                Action::ToBackend { payload, .. } => Some(decode(payload)),
                _ => None,
            })
            .collect()
    }

    fn to_frontend(acts: &[Action]) -> Vec<Packet> {
        acts.iter()
            .filter_map(|a| match a {
                Action::ToFrontend { payload, .. } => Some(decode(payload)),
                _ => None,
            })
            .collect()
    }

    fn data(connect_id: i64, d: &'static [u8]) -> Packet {
        Packet::Data {
            connect_id,
            error: ByteStr::new(),
            data: Bytes::from_static(d),
        }
    }

    fn ack(connect_id: i64, offset: i64) -> Packet {
        Packet::Ack { connect_id, offset }
    }

    fn from_frontend(r: &mut Router, fid: FrontendId, p: Packet) {
        let f = framed(&p);
        r.frontend_packet(t0(), fid, p, f, 0);
    }

    fn from_backend(r: &mut Router, now: Instant, p: Packet) {
        let f = framed(&p);
        let _ = r.backend_packet(now, 1, p, f, 0);
    }

    /// Agent 1 negotiated resume; gRPC frontend 10 has connection 7.
    fn established() -> Router {
        let mut r = Router::new(
            RouterConfig::default(),
            Directory::new(vec![Strategy::Default]),
        );
        r.backend_connected(1, "agent-1".into(), Identifiers::default(), 0);
        r.set_resume(1, Some(ResumeLimits::default()));
        r.frontend_opened(10, FrontendKind::Grpc);
        from_frontend(
            &mut r,
            10,
            Packet::DialReq {
                protocol: ByteStr::from_static("tcp"),
                address: ByteStr::from_static("10.0.0.5:10250"),
                random: 42,
            },
        );
        from_backend(
            &mut r,
            t0(),
            Packet::DialRsp {
                error: ByteStr::new(),
                connect_id: 7,
                random: 42,
            },
        );
        actions(&mut r);
        r
    }

    #[test]
    fn flows_are_counted_and_acknowledged() {
        let mut r = established();
        from_frontend(&mut r, 10, data(7, b"ls"));
        assert_eq!(to_backend(&actions(&mut r)), vec![data(7, b"ls")]);
        from_backend(&mut r, t0(), data(7, b"out"));
        assert_eq!(to_frontend(&actions(&mut r)), vec![data(7, b"out")]);
        let due = r.poll_timeout().unwrap();
        r.handle_timeout(due);
        assert_eq!(to_backend(&actions(&mut r)), vec![ack(7, 3)]);
        let s = r.resume_session(1).unwrap();
        assert_eq!(s.conn(7).unwrap().tx().unacked(), 2);
        from_backend(&mut r, t0(), ack(7, 2));
        assert!(actions(&mut r).is_empty(), "an ACK is consumed");
        assert_eq!(r.resume_session(1).unwrap().held_bytes(), 0);
    }

    #[test]
    fn the_next_request_carries_the_ack_for_the_reply() {
        let mut r = established();
        from_frontend(&mut r, 10, data(7, b"ls"));
        from_backend(&mut r, t0(), data(7, b"out"));
        actions(&mut r);
        // A request right after the reply carries nothing; one half the
        // delay later goes out with the ACK right behind it (in the same
        // write), and the timer has nothing left to do.
        from_frontend(&mut r, 10, data(7, b"cd"));
        assert_eq!(to_backend(&actions(&mut r)), vec![data(7, b"cd")]);
        let half = t0() + ResumeLimits::default().ack_delay / 2;
        let p = data(7, b"pwd");
        let f = framed(&p);
        r.frontend_packet(half, 10, p, f, 0);
        assert_eq!(
            to_backend(&actions(&mut r)),
            vec![data(7, b"pwd"), ack(7, 3)]
        );
        if let Some(due) = r.resume_poll_timeout() {
            r.handle_resume_timeout(due);
        }
        assert_eq!(to_backend(&actions(&mut r)), vec![]);
    }

    #[test]
    fn connect_frontends_data_is_recorded_for_replay() {
        let mut r = established();
        r.frontend_opened(20, FrontendKind::HttpConnect);
        r.connect_request(t0(), 20, "10.0.0.6:22", 77, 0);
        from_backend(
            &mut r,
            t0(),
            Packet::DialRsp {
                error: ByteStr::new(),
                connect_id: 9,
                random: 77,
            },
        );
        actions(&mut r);
        assert!(r.connect_data(20, framed(&data(9, b"SSH-2.0")), 7));
        assert_eq!(to_backend(&actions(&mut r)), vec![data(9, b"SSH-2.0")]);
        let s = r.resume_session(1).unwrap();
        assert_eq!(s.conn(9).unwrap().tx().unacked(), 7);
        let replay: Vec<Bytes> = s.conn(9).unwrap().replay().map(|(_, b)| b).collect();
        assert_eq!(replay, vec![Bytes::from_static(b"SSH-2.0")]);
    }

    #[test]
    fn a_broken_tunnel_parks_its_flows_and_replays_on_resume() {
        let mut r = established();
        from_frontend(&mut r, 10, data(7, b"ls"));
        from_backend(&mut r, t0(), data(7, b"out"));
        actions(&mut r);
        let window = Duration::from_secs(3);
        assert!(r.backend_broken(t0(), 1, window));
        assert_eq!(
            actions(&mut r),
            vec![Action::PauseFrontend { frontend: 10 }]
        );
        assert!(r.backend_parked(1));
        assert!(r.directory().get(1).is_none(), "no new dials");
        // What a frontend still sends waits for the replay.
        from_frontend(&mut r, 10, data(7, b"pwd"));
        assert!(to_backend(&actions(&mut r)).is_empty());
        assert_eq!(r.poll_timeout(), Some(t0() + window));
        r.backend_resumed(1);
        assert_eq!(
            to_backend(&actions(&mut r)),
            vec![ack(7, 3), Packet::Resumed]
        );
        assert!(r.directory().get(1).is_some());
        // The agent had "l" only: "s" and "pwd" follow, joined (small
        // payloads are copied into one run).
        from_backend(&mut r, t0(), ack(7, 1));
        let acts = actions(&mut r);
        assert_eq!(to_backend(&acts), vec![data(7, b"spwd")]);
        assert!(acts.contains(&Action::ResumeFrontend {
            frontend: 10,
            credit: 0
        }));
        from_backend(&mut r, t0(), Packet::Resumed);
        from_backend(&mut r, t0(), data(7, b"more"));
        assert_eq!(to_frontend(&actions(&mut r)), vec![data(7, b"more")]);
        r.check_invariants().unwrap();
    }

    #[test]
    fn flows_the_agent_did_not_announce_close() {
        let mut r = established();
        assert!(r.backend_broken(t0(), 1, Duration::from_secs(3)));
        r.backend_resumed(1);
        actions(&mut r);
        from_backend(&mut r, t0(), Packet::Resumed);
        let acts = actions(&mut r);
        assert_eq!(
            to_frontend(&acts),
            vec![Packet::CloseRsp {
                error: ByteStr::new(),
                connect_id: 7
            }]
        );
        assert_eq!(r.stats().established, 0);
    }

    #[test]
    fn the_window_ends_like_a_lost_tunnel() {
        let mut r = established();
        assert!(r.backend_broken(t0(), 1, Duration::from_secs(3)));
        actions(&mut r);
        r.handle_timeout(t0() + Duration::from_secs(3));
        let acts = actions(&mut r);
        assert!(to_frontend(&acts).contains(&Packet::CloseRsp {
            error: ByteStr::new(),
            connect_id: 7
        }));
        assert!(!r.backend_parked(1));
        assert!(r.resume_session(1).is_none());
        assert_eq!(r.stats().backends, 0);
    }

    #[test]
    fn without_resume_or_window_nothing_parks() {
        let mut r = established();
        assert!(!r.backend_broken(t0(), 1, Duration::ZERO));
        r.set_resume(1, None);
        assert!(!r.backend_broken(t0(), 1, Duration::from_secs(3)));
        assert!(!r.backend_parked(1));
    }
}
