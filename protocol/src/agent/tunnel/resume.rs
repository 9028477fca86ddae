//! The tunnel's `konn-resume` hooks (docs/design/resume.md): the agent's
//! side of [`ResumeSession`] — DATA and closes counted both ways, ACKs
//! sent when due, endpoints parked when the tunnel breaks, announced and
//! replayed when it resumes, closed when the window ends. Inert unless
//! [`Tunnel::set_resume`] was called (the server accepted the offer).

use std::time::{Duration, Instant};

use bytes::Bytes;
use konn_frames::packet::{ByteStr, Packet};

use super::{Action, Endpoint, Tunnel, UNKNOWN_CONNECT_ID};
use crate::resume::{Replay, ResumeLimits, ResumeSession, SessionState};

/// The CLOSE_RSP error of an endpoint whose server broke the resume
/// protocol.
pub const RESUME_VIOLATION: &str = "konn: resume protocol violation; connection closed";

impl Tunnel {
    /// The server accepted the agent's `konn-resume` offer (`Some`), or
    /// not: from now on this tunnel counts, acknowledges and parks.
    pub fn set_resume(&mut self, limits: Option<ResumeLimits>) {
        self.resume = limits.map(ResumeSession::new);
    }

    /// The resume state, when negotiated.
    pub fn resume_session(&self) -> Option<&ResumeSession> {
        self.resume.as_ref()
    }

    /// Whether the tunnel is parked: broken, its endpoints waiting for a
    /// resume until the window ends.
    pub fn resume_parked(&self) -> bool {
        self.resume
            .as_ref()
            .is_some_and(|s| matches!(s.state(), SessionState::Parked { .. }))
    }

    /// When the resume state alone needs
    /// [`handle_resume_timeout`](Self::handle_resume_timeout): an ACK due
    /// by time, or a parked tunnel's window (O(connections owing an ACK),
    /// unlike [`Tunnel::poll_timeout`], which looks at every endpoint).
    pub fn resume_poll_timeout(&self) -> Option<Instant> {
        self.resume_timeout()
    }

    /// The resume state's timers at `now` alone: ACKs due by time, a
    /// parked tunnel whose window ended (it closes as in
    /// [`Tunnel::tunnel_gone`]).
    pub fn handle_resume_timeout(&mut self, now: Instant) {
        self.resume_handle_timeout(now);
    }

    /// A DATA payload read from `connect_id`'s destination is about to be
    /// sent (the IO layer encodes DATA itself): keep it for replay.
    /// Returns whether to send it now; `false` while the tunnel is parked
    /// or syncing — the replay sends it (a read that raced the break loses
    /// nothing). An ACK this connection owes, half due at `now`, goes with
    /// it: it is among the actions after this call ([`Tunnel::poll_action`]).
    pub fn data_sent(&mut self, now: Instant, connect_id: i64, payload: &Bytes) -> bool {
        let Some(s) = self.resume.as_mut() else {
            return true;
        };
        // An untracked connection (no resume state) is sent as is.
        let send = s.sent(Some(now), connect_id, payload).unwrap_or(true);
        if s.has_packets() {
            self.flush_resume();
        }
        send
    }

    /// The tunnel's stream or connection broke at `now`. With resume
    /// negotiated and a `window`, the open endpoints are parked (their
    /// readers paused, their queues kept) and `true` is returned: the IO
    /// layer keeps them and reconnects. Otherwise everything closes as in
    /// [`Tunnel::tunnel_gone`].
    pub fn tunnel_broken(&mut self, now: Instant, window: Duration) -> bool {
        if window.is_zero() || self.resume.is_none() || self.draining {
            self.tunnel_gone();
            return false;
        }
        for random in std::mem::take(&mut self.reverse_pending) {
            self.actions.push_back(Action::ReverseFailed { random });
        }
        let mut ids: Vec<i64> = self.endpoints.keys().copied().collect();
        ids.sort_unstable();
        for connect_id in ids {
            match self.endpoints.get_mut(&connect_id) {
                // The server failed the dial; its answer cannot arrive.
                Some(Endpoint::Dialing { .. }) => {
                    self.endpoints.remove(&connect_id);
                    self.actions.push_back(Action::CancelDial { connect_id });
                }
                Some(Endpoint::Open(f)) => {
                    f.rx.stream_gone();
                    if !std::mem::replace(&mut f.read_paused, true) {
                        self.actions.push_back(Action::PauseRead { connect_id });
                    }
                }
                None => {}
            }
        }
        if let Some(s) = self.resume.as_mut() {
            s.park(now, window);
        }
        true
    }

    /// The agent reconnected and the server resumed this tunnel: announce
    /// every parked connection's receive offset, then RESUMED.
    pub fn tunnel_resumed(&mut self) {
        if let Some(s) = self.resume.as_mut() {
            s.resume();
        }
        self.flush_resume();
    }

    /// DATA for `connect_id`: the bytes to queue for the endpoint (`None`:
    /// nothing new — a duplicate — or the connection was closed for
    /// breaking the protocol).
    pub(super) fn resume_received(
        &mut self,
        now: Instant,
        connect_id: i64,
        data: Bytes,
    ) -> Option<Bytes> {
        let Some(s) = self.resume.as_mut() else {
            return Some(data);
        };
        let res = s.received(now, connect_id, data);
        let flush = s.has_packets();
        let out = match res {
            Ok(out) => out,
            Err(_) => {
                self.resume_violation(connect_id);
                None
            }
        };
        if flush {
            self.flush_resume();
        }
        out
    }

    /// The server's close of `connect_id` arrived: whether to act on it
    /// (false: a replayed duplicate, already handled).
    pub(super) fn resume_close_received(&mut self, now: Instant, connect_id: i64) -> bool {
        let fresh = match self.resume.as_mut() {
            Some(s) if s.contains(connect_id) => s.close_received(now, connect_id).unwrap_or(true),
            _ => true,
        };
        // The close's ACK is due at once.
        self.flush_resume();
        fresh
    }

    /// Our close of `connect_id` follows its data: whether to send it now
    /// (not while parked or syncing: the replay sends it).
    pub(super) fn resume_close_sent(&mut self, connect_id: i64) -> bool {
        match self.resume.as_mut() {
            Some(s) if s.contains(connect_id) => s.close_sent(connect_id).unwrap_or(true),
            _ => true,
        }
    }

    /// A connection was established (DIAL_RSP sent, or a reverse dial
    /// answered).
    pub(super) fn resume_open(&mut self, connect_id: i64) {
        if let Some(s) = self.resume.as_mut() {
            s.open(connect_id);
        }
    }

    /// ACK and RESUMED from the server.
    pub(super) fn resume_packet(&mut self, packet: Packet) {
        let Some(s) = self.resume.as_mut() else {
            return; // not negotiated: ignored like any unexpected packet
        };
        match packet {
            Packet::Ack { connect_id, offset } => match s.ack(connect_id, offset) {
                Ok(Some(replay)) => self.replay(connect_id, replay),
                Ok(None) => {}
                Err(_) if !s.contains(connect_id) => {
                    if s.state() == SessionState::Syncing {
                        // Announced by the server, unknown here: gone.
                        self.close_rsp(connect_id, UNKNOWN_CONNECT_ID);
                    }
                }
                Err(_) => self.resume_violation(connect_id),
            },
            Packet::Resumed => {
                for connect_id in s.peer_resumed() {
                    if self.remove_open(connect_id) {
                        self.actions.push_back(Action::Close { connect_id });
                    }
                }
            }
            _ => {}
        }
        self.flush_resume();
    }

    /// Sends the replay of one connection and lets its reader go again.
    fn replay(&mut self, connect_id: i64, replay: Replay) {
        for data in replay.data {
            self.actions.push_back(Action::ToServer(Packet::Data {
                connect_id,
                error: ByteStr::new(),
                data,
            }));
        }
        if replay.close {
            let close = if connect_id < 0 {
                Packet::CloseReq { connect_id }
            } else {
                Packet::CloseRsp {
                    error: ByteStr::new(),
                    connect_id,
                }
            };
            self.actions.push_back(Action::ToServer(close));
        }
        if let Some(Endpoint::Open(f)) = self.endpoints.get_mut(&connect_id)
            && std::mem::replace(&mut f.read_paused, false)
        {
            self.actions.push_back(Action::ResumeRead { connect_id });
        }
    }

    /// The server broke the resume protocol for `connect_id`: close it.
    fn resume_violation(&mut self, connect_id: i64) {
        if let Some(s) = self.resume.as_mut() {
            s.forget(connect_id);
        }
        if self.remove_open(connect_id) {
            self.actions.push_back(Action::Abort { connect_id });
            self.closed(connect_id, RESUME_VIOLATION);
        }
    }

    /// Moves the session's packets (handshake, ACKs due) to the actions.
    pub(super) fn flush_resume(&mut self) {
        let Some(s) = self.resume.as_mut() else {
            return;
        };
        // Bounded: each round takes one packet off the session's queue.
        while let Some(p) = s.poll_packet() {
            self.actions.push_back(Action::ToServer(p));
        }
    }

    /// When the resume state needs [`Tunnel::handle_timeout`].
    pub(super) fn resume_timeout(&self) -> Option<Instant> {
        self.resume.as_ref().and_then(ResumeSession::poll_timeout)
    }

    /// ACKs due by time; a parked tunnel whose window ended closes.
    pub(super) fn resume_handle_timeout(&mut self, now: Instant) {
        let Some(s) = self.resume.as_mut() else {
            return;
        };
        if s.expired(now) {
            self.tunnel_gone();
            return;
        }
        s.handle_timeout(now);
        self.flush_resume();
    }
}

#[cfg(test)]
mod tests {
    use super::super::TunnelConfig;
    use super::*;

    fn t0() -> Instant {
        crate::test_epoch()
    }

    fn actions(t: &mut Tunnel) -> Vec<Action> {
        std::iter::from_fn(|| t.poll_action()).collect()
    }

    fn limits() -> ResumeLimits {
        ResumeLimits::default()
    }

    fn data(connect_id: i64, d: &'static [u8]) -> Packet {
        Packet::Data {
            connect_id,
            error: ByteStr::new(),
            data: Bytes::from_static(d),
        }
    }

    /// A resumable tunnel with endpoint 1 open and endpoint 2 dialling.
    fn tunnel() -> Tunnel {
        let mut t = Tunnel::new(TunnelConfig::default());
        t.set_resume(Some(limits()));
        for random in [7, 8] {
            t.server_packet(
                t0(),
                Packet::DialReq {
                    protocol: ByteStr::from_static("tcp"),
                    address: ByteStr::from_static("10.0.0.5:10250"),
                    random,
                },
                0,
            );
        }
        assert!(t.dial_succeeded(1));
        actions(&mut t);
        t
    }

    #[test]
    fn data_is_acknowledged_when_due() {
        let mut t = tunnel();
        t.server_packet(t0(), data(1, b"abc"), 8);
        let acts = actions(&mut t);
        assert!(acts.contains(&Action::Write {
            connect_id: 1,
            data: Bytes::from_static(b"abc")
        }));
        assert!(
            !acts
                .iter()
                .any(|a| matches!(a, Action::ToServer(Packet::Ack { .. })))
        );
        let due = t.poll_timeout().unwrap();
        assert_eq!(due, t0() + limits().ack_delay);
        t.handle_timeout(due);
        assert_eq!(
            actions(&mut t),
            vec![Action::ToServer(Packet::Ack {
                connect_id: 1,
                offset: 3
            })]
        );
    }

    #[test]
    fn a_reply_carries_the_ack_its_connection_owes_once_half_due() {
        let mut t = tunnel();
        t.server_packet(t0(), data(1, b"abc"), 8);
        let _ = actions(&mut t);
        assert!(t.data_sent(t0(), 1, &Bytes::from_static(b"reply")));
        assert!(
            !actions(&mut t)
                .iter()
                .any(|a| matches!(a, Action::ToServer(Packet::Ack { .. }))),
            "not yet half due"
        );
        let half = t0() + limits().ack_delay / 2;
        t.server_packet(half, data(1, b"de"), 8);
        let _ = actions(&mut t);
        assert!(t.data_sent(half, 1, &Bytes::from_static(b"reply")));
        assert_eq!(
            actions(&mut t),
            vec![Action::ToServer(Packet::Ack {
                connect_id: 1,
                offset: 5
            })]
        );
        // Nothing is left for the timer, and a second reply carries none.
        if let Some(due) = t.resume_poll_timeout() {
            t.handle_resume_timeout(due);
        }
        assert!(t.data_sent(t0(), 1, &Bytes::from_static(b"more")));
        assert!(
            !actions(&mut t)
                .iter()
                .any(|a| matches!(a, Action::ToServer(Packet::Ack { .. })))
        );
    }

    #[test]
    fn a_broken_tunnel_parks_then_announces_and_replays() {
        let mut t = tunnel();
        t.server_packet(t0(), data(1, b"abc"), 8);
        assert!(t.data_sent(t0(), 1, &Bytes::from_static(b"xyz")));
        actions(&mut t);
        let window = Duration::from_secs(3);
        assert!(t.tunnel_broken(t0(), window));
        assert_eq!(
            actions(&mut t),
            vec![
                Action::PauseRead { connect_id: 1 },
                Action::CancelDial { connect_id: 2 }
            ]
        );
        assert!(t.is_open(1));
        assert_eq!(t.poll_timeout(), Some(t0() + window));
        // A read that raced the break: recorded, sent with the replay.
        assert!(!t.data_sent(t0(), 1, &Bytes::from_static(b"no")));
        t.tunnel_resumed();
        assert_eq!(
            actions(&mut t),
            vec![
                Action::ToServer(Packet::Ack {
                    connect_id: 1,
                    offset: 3
                }),
                Action::ToServer(Packet::Resumed)
            ]
        );
        // The server received "x" only: "yz" and "no" are replayed (small
        // payloads, copied, as one segment), then reading goes on.
        t.server_packet(
            t0(),
            Packet::Ack {
                connect_id: 1,
                offset: 1,
            },
            0,
        );
        assert_eq!(
            actions(&mut t),
            vec![
                Action::ToServer(data(1, b"yzno")),
                Action::ResumeRead { connect_id: 1 }
            ]
        );
        t.server_packet(t0(), Packet::Resumed, 0);
        assert!(t.is_open(1));
        assert!(t.data_sent(t0(), 1, &Bytes::from_static(b"more")));
        t.check_invariants().unwrap();
    }

    #[test]
    fn a_close_while_parked_is_sent_with_the_replay() {
        let mut t = tunnel();
        assert!(t.data_sent(t0(), 1, &Bytes::from_static(b"tail")));
        assert!(t.tunnel_broken(t0(), Duration::from_secs(3)));
        actions(&mut t);
        t.endpoint_closed(1);
        assert_eq!(actions(&mut t), vec![Action::Close { connect_id: 1 }]);
        t.tunnel_resumed();
        actions(&mut t);
        t.server_packet(
            t0(),
            Packet::Ack {
                connect_id: 1,
                offset: 0,
            },
            0,
        );
        assert_eq!(
            actions(&mut t),
            vec![
                Action::ToServer(data(1, b"tail")),
                Action::ToServer(Packet::CloseRsp {
                    error: ByteStr::new(),
                    connect_id: 1
                }),
            ]
        );
        // Acknowledged with its close: forgotten.
        t.server_packet(
            t0(),
            Packet::Ack {
                connect_id: 1,
                offset: 5,
            },
            0,
        );
        assert!(t.resume_session().unwrap().is_empty());
    }

    #[test]
    fn connections_the_server_did_not_announce_close() {
        let mut t = tunnel();
        assert!(t.tunnel_broken(t0(), Duration::from_secs(3)));
        t.tunnel_resumed();
        actions(&mut t);
        t.server_packet(t0(), Packet::Resumed, 0);
        assert_eq!(actions(&mut t), vec![Action::Close { connect_id: 1 }]);
        assert!(!t.is_open(1));
    }

    #[test]
    fn a_close_from_the_server_is_acknowledged_at_once() {
        let mut t = tunnel();
        t.server_packet(t0(), data(1, b"ab"), 0);
        actions(&mut t);
        t.server_packet(t0(), Packet::CloseReq { connect_id: 1 }, 0);
        let acts = actions(&mut t);
        assert!(acts.contains(&Action::ToServer(Packet::Ack {
            connect_id: 1,
            offset: 3
        })));
        assert!(acts.contains(&Action::ToServer(Packet::CloseRsp {
            error: ByteStr::new(),
            connect_id: 1
        })));
        // The server acknowledges the CLOSE_RSP: nothing is left.
        t.server_packet(
            t0(),
            Packet::Ack {
                connect_id: 1,
                offset: 1,
            },
            0,
        );
        assert!(t.resume_session().unwrap().is_empty());
    }

    #[test]
    fn the_window_ends_like_a_lost_tunnel() {
        let mut t = tunnel();
        assert!(t.tunnel_broken(t0(), Duration::from_secs(3)));
        actions(&mut t);
        t.handle_timeout(t0() + Duration::from_secs(3));
        assert_eq!(actions(&mut t), vec![Action::Close { connect_id: 1 }]);
        assert_eq!(t.endpoints(), 0);
        assert!(t.resume_session().unwrap().is_empty());
    }

    #[test]
    fn without_resume_or_window_a_break_closes_everything() {
        for (resume, window) in [(false, 3), (true, 0)] {
            let mut t = tunnel();
            if !resume {
                t.set_resume(None);
            }
            assert!(!t.tunnel_broken(t0(), Duration::from_secs(window)));
            let acts = actions(&mut t);
            assert!(acts.contains(&Action::Close { connect_id: 1 }));
            assert_eq!(t.endpoints(), 0);
        }
    }
}
