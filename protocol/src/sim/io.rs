//! The simulated IO layers of [`Sim`]: one tick of the clock moves what
//! each party can move — dials finish, frontends send while their window
//! (gRPC) or the server (CONNECT) lets them, the tunnel stream carries what
//! its window allows each way, destinations read and echo, the agent reads
//! destinations, frontends read — and every action of the router and the
//! tunnel is performed as the real IO layers would.

use std::time::Duration;

use bytes::{Buf, Bytes};
use konn_frames::packet::{ByteStr, Packet};

use super::{
    AGENT_SEND_QUEUE, CHUNK, DIAL_LATENCY, Dest, DestKind, RATE, Sim, TICK, framed, pattern,
};
use crate::agent::tunnel::{self, Action as T};
use crate::server::router::{Action, FrontendId, Payload};

impl Sim {
    /// One tick of the clock.
    pub(super) fn tick(&mut self) {
        self.now += TICK;
        let now = self.now;
        if self.router.poll_timeout().is_some_and(|t| t <= now) {
            let counted: Vec<FrontendId> = self
                .order
                .iter()
                .copied()
                .filter(|&f| self.router.frontend_queued(f).is_some_and(|q| q > 0))
                .collect();
            self.router.handle_timeout(now);
            // A queue the timer dropped was closed as stuck: the router no
            // longer counts what that frontend has not read.
            for fid in counted {
                if self.router.frontend_queued(fid).is_none_or(|q| q == 0)
                    && let Some(fe) = self.fes.get_mut(&fid)
                {
                    fe.stuck = true;
                }
            }
        }
        if self.tunnel.poll_timeout().is_some_and(|t| t <= now) {
            self.tunnel.handle_timeout(now);
        }
        self.pump();
        self.finish_dials();
        self.frontends_send();
        self.deliver();
        self.destinations();
        self.frontends_read();
        self.pump();
    }

    /// A gRPC frontend sends `p` (if its window allows) and the server
    /// passes it to the router, then returns its credit as the router says.
    pub(super) fn frontend_sends(&mut self, fid: FrontendId, p: Packet, random: u64) -> bool {
        let f = framed(&p);
        let Some(fe) = self.fes.get_mut(&fid) else {
            return false;
        };
        if fe.window < f.len() {
            return false;
        }
        fe.window -= f.len();
        let len = f.len();
        self.router.frontend_packet(self.now, fid, p, f, random);
        let now_credit = self.router.frontend_credit(fid, len);
        if let Some(fe) = self.fes.get_mut(&fid) {
            fe.window += now_credit;
            fe.held += len - now_credit.min(len);
        }
        self.pump();
        true
    }

    fn finish_dials(&mut self) {
        let now = self.now;
        let (due, later): (Vec<_>, Vec<_>) = self.dialing.drain(..).partition(|d| d.0 <= now);
        self.dialing = later;
        for (_, connect_id, kind) in due {
            match kind {
                DestKind::Echo => {
                    if self.tunnel.dial_succeeded(connect_id) {
                        self.dests.insert(
                            connect_id,
                            Dest {
                                reading: true,
                                ..Dest::default()
                            },
                        );
                    }
                }
                DestKind::Refuse | DestKind::Hang => self.tunnel.dial_failed(
                    connect_id,
                    format!("dial tcp {}: connect: connection refused", kind.address()),
                    tunnel::DialFailure::Unknown,
                ),
            }
            self.pump();
        }
    }

    /// Frontends send their pattern as DATA: a gRPC frontend while its
    /// stream window lasts, a CONNECT frontend while the server reads it.
    fn frontends_send(&mut self) {
        for fid in self.order.clone() {
            let mut budget = RATE;
            while let Some(fe) = self.fes.get(&fid) {
                let Some(connect_id) = fe.connect_id else {
                    break;
                };
                if fe.gone
                    || fe.to_send == 0
                    || budget == 0
                    || fe.close_rsp.is_some()
                    || (fe.connect && fe.paused)
                {
                    break;
                }
                let n = fe.to_send.min(CHUNK).min(budget);
                let data: Bytes = (fe.sent..fe.sent + n).map(|i| pattern(fid, i)).collect();
                let connect = fe.connect;
                let p = Packet::Data {
                    connect_id,
                    error: ByteStr::new(),
                    data,
                };
                let sent = if connect {
                    let taken = self.router.connect_data(fid, framed(&p), n);
                    self.pump();
                    taken
                } else {
                    self.frontend_sends(fid, p, 0)
                };
                if !sent {
                    break;
                }
                if let Some(fe) = self.fes.get_mut(&fid) {
                    fe.sent += n;
                    fe.to_send -= n;
                }
                budget -= n;
            }
        }
    }

    /// Moves what each stream window allows across the tunnel.
    fn deliver(&mut self) {
        while let Some((_, f)) = self.s2a.queue.front()
            && f.len() <= self.s2a.window
        {
            let Some((p, f)) = self.s2a.queue.pop_front() else {
                break;
            };
            self.s2a.window -= f.len();
            self.tunnel.server_packet(self.now, p, f.len());
            self.pump();
        }
        while let Some((_, f)) = self.a2s.queue.front()
            && f.len() <= self.a2s.window
        {
            let Some((p, f)) = self.a2s.queue.pop_front() else {
                break;
            };
            self.a2s.window -= f.len();
            let credit = f.len();
            let now_credit = self
                .router
                .backend_packet(self.now, self.backend, p, f, credit);
            if now_credit > credit {
                self.violate(format!("router returned {now_credit} of {credit} credit"));
            }
            self.a2s.window += now_credit;
            self.pump();
        }
    }

    /// Destinations read and echo; the agent reads what they echo and
    /// reports a destination's EOF once its echo is out.
    fn destinations(&mut self) {
        let mut ids: Vec<i64> = self.dests.keys().copied().collect();
        ids.sort_unstable();
        for connect_id in ids {
            let Some(d) = self.dests.get_mut(&connect_id) else {
                continue;
            };
            if d.closed {
                continue;
            }
            let mut read = 0;
            while d.reading && read < RATE {
                let Some(mut b) = d.inbox.pop_front() else {
                    break;
                };
                let n = b.len().min(RATE - read);
                d.outbox.push_back(b.split_to(n));
                if !b.is_empty() {
                    d.inbox.push_front(b);
                }
                read += n;
            }
            if read > 0 {
                self.tunnel.endpoint_drained(connect_id, read, self.now);
                self.pump();
            }
            // The agent's endpoint reader: DATA straight to the tunnel.
            while let Some(d) = self.dests.get_mut(&connect_id) {
                if d.read_paused || d.closed || self.a2s.queue.len() >= AGENT_SEND_QUEUE {
                    break;
                }
                let Some(mut b) = d.outbox.pop_front() else {
                    if d.eof {
                        self.tunnel.endpoint_closed(connect_id);
                        self.pump();
                    }
                    break;
                };
                let chunk = b.split_to(b.len().min(CHUNK));
                if !b.is_empty() {
                    d.outbox.push_front(b);
                }
                // konn-resume keeps it for replay (sent with the replay
                // while parked).
                if !self.tunnel.data_sent(self.now, connect_id, &chunk) {
                    continue;
                }
                let p = Packet::Data {
                    connect_id,
                    error: ByteStr::new(),
                    data: chunk,
                };
                let f = framed(&p);
                self.a2s.queue.push_back((p, f));
            }
        }
    }

    /// Frontends read their streams; the server reports each queue's level.
    fn frontends_read(&mut self) {
        for fid in self.order.clone() {
            let Some(fe) = self.fes.get_mut(&fid) else {
                continue;
            };
            if !fe.reading || fe.gone {
                continue;
            }
            let mut budget = RATE;
            let mut read_any = false;
            let mut bad = None;
            while budget > 0 {
                let Some((p, f, forwarded)) = fe.stream.pop_front() else {
                    break;
                };
                read_any = true;
                let (data, connect_id) = match p {
                    None => (f.clone(), fe.connect_id),
                    Some(Packet::Data {
                        data, connect_id, ..
                    }) => (data, Some(connect_id)),
                    Some(p) => {
                        if let Err(e) = fe.control(p, forwarded) {
                            bad.get_or_insert(format!("frontend {fid}: {e}"));
                        }
                        continue;
                    }
                };
                budget = budget.saturating_sub(f.len());
                if fe.connect_id.is_none() || connect_id != fe.connect_id || fe.agent_closed {
                    bad.get_or_insert(format!(
                        "frontend {fid} (connection {:?}, agent closed {}) got DATA of {connect_id:?}",
                        fe.connect_id, fe.agent_closed
                    ));
                }
                let mut data = data;
                while data.has_remaining() {
                    let (got, want) = (data.get_u8(), pattern(fid, fe.received));
                    if got != want {
                        bad.get_or_insert(format!(
                            "frontend {fid}: echoed byte {} is {got}, sent {want}",
                            fe.received
                        ));
                        break;
                    }
                    fe.received += 1;
                }
            }
            if let Some(b) = bad {
                self.violate(b);
            }
            if read_any {
                let level = self.fes.get(&fid).map_or(0, |f| f.level());
                self.router.frontend_level(self.now, fid, level);
                self.pump();
            }
        }
    }

    /// Performs every action both state machines produced.
    pub(super) fn pump(&mut self) {
        // Each round performs at least one action; the machines produce
        // finitely many per input, so this ends.
        loop {
            let mut any = false;
            while let Some(a) = self.router.poll_action() {
                any = true;
                self.router_action(a);
            }
            while let Some(a) = self.tunnel.poll_action() {
                any = true;
                self.tunnel_action(a);
            }
            if !any {
                return;
            }
        }
    }

    fn router_action(&mut self, a: Action) {
        match a {
            Action::ToBackend { backend, payload } => {
                // A gone backend's packets are dropped with it, and so are
                // a parked one's (it has no stream).
                if backend == self.backend && !self.parked {
                    match decode(payload) {
                        Ok(pf) => self.s2a.queue.push_back(pf),
                        Err(e) => self.violate(e),
                    }
                }
            }
            Action::ToFrontend { frontend, payload } => {
                let forwarded = matches!(payload, Payload::Forward(_));
                let pf = match decode(payload) {
                    Ok(pf) => pf,
                    Err(e) => return self.violate(e),
                };
                match self.fes.get_mut(&frontend) {
                    Some(fe) if fe.connect => {
                        self.violate(format!("gRPC packet for CONNECT frontend {frontend}"));
                    }
                    Some(fe) if !fe.gone => fe.stream.push_back((Some(pf.0), pf.1, forwarded)),
                    _ => {}
                }
            }
            Action::ConnectEstablished {
                frontend,
                backend,
                connect_id,
            } => {
                if backend != self.backend {
                    self.violate(format!("CONNECT {frontend} established on {backend}"));
                }
                match self.fes.get_mut(&frontend) {
                    Some(fe) if fe.connect && fe.connect_id.is_none() => {
                        fe.connect_id = Some(connect_id);
                    }
                    other => {
                        let what = format!("ConnectEstablished for {frontend}: {other:?}");
                        self.violate(what);
                    }
                }
            }
            Action::ConnectData { frontend, data } => match self.fes.get_mut(&frontend) {
                Some(fe) if fe.connect => {
                    if !fe.gone {
                        fe.stream.push_back((None, data, false));
                    }
                }
                _ => self.violate(format!("ConnectData for {frontend}")),
            },
            Action::ConnectFailed { frontend, response } => match self.fes.get_mut(&frontend) {
                Some(fe) if fe.connect && fe.connect_id.is_none() => {
                    fe.dial_error = Some(String::from_utf8_lossy(&response).into_owned());
                    fe.close_rsp = Some(String::new());
                    fe.gone = true;
                    fe.stream.clear();
                }
                other => {
                    let what = format!("ConnectFailed for {frontend}: {other:?}");
                    self.violate(what);
                }
            },
            Action::CloseFrontend { frontend } | Action::AbortFrontend { frontend } => {
                let abort = matches!(a, Action::AbortFrontend { .. });
                match self.fes.get_mut(&frontend) {
                    Some(fe) if fe.connect => {
                        // The socket flushes (or drops) what is queued, then
                        // closes; the router has forgotten the frontend.
                        fe.close_rsp.get_or_insert_with(String::new);
                        if abort {
                            fe.gone = true;
                            fe.stream.clear();
                        }
                    }
                    _ => self.violate(format!("{a:?} for a gRPC frontend")),
                }
            }
            Action::ReleaseBackend { backend, credit } => {
                if backend == self.backend {
                    self.a2s.window += credit;
                }
            }
            // Only a CONNECT socket stops being read (a gRPC frontend's
            // credit is held by the router instead), as in the server.
            Action::PauseFrontend { frontend } => {
                if let Some(fe) = self.fes.get_mut(&frontend)
                    && fe.connect
                {
                    fe.paused = true;
                }
            }
            Action::ResumeFrontend { frontend, credit } => {
                if let Some(fe) = self.fes.get_mut(&frontend) {
                    if fe.connect {
                        fe.paused = false;
                    }
                    if credit > fe.held {
                        let what = format!(
                            "frontend {frontend}: router returned {credit} credit, held {}",
                            fe.held
                        );
                        self.violate(what);
                    } else if !fe.gone {
                        fe.held -= credit;
                        fe.window += credit;
                    }
                }
            }
            Action::ConnEnded(s) => {
                let Some(fe) = self.fes.get_mut(&s.frontend) else {
                    return self.violate(format!("summary of unknown frontend {}", s.frontend));
                };
                fe.summaries += 1;
                // The router counts what it forwarded: at most what the
                // frontend sent, at least what it received.
                let what = if fe.summaries > 1 {
                    Some(format!("frontend {}: a second summary", s.frontend))
                } else if s.bytes_to_agent > fe.sent as u64
                    || s.bytes_from_agent < fe.received as u64
                {
                    Some(format!(
                        "frontend {}: summary bytes {}/{} vs sent {} received {}",
                        s.frontend, s.bytes_to_agent, s.bytes_from_agent, fe.sent, fe.received
                    ))
                } else {
                    None
                };
                if let Some(w) = what {
                    self.violate(w);
                }
            }
            Action::DialFailed(_) | Action::DialRefused { .. } | Action::DialSucceeded { .. } => {}
            // One core, and the reverse direction is not negotiated here.
            Action::Relay { .. }
            | Action::ReverseDial { .. }
            | Action::ReverseRefused(_)
            | Action::ReverseDialed => self.violate(format!("unexpected router action {a:?}")),
        }
    }

    fn tunnel_action(&mut self, a: T) {
        match a {
            T::ToServer(p) if !self.parked => {
                let f = framed(&p);
                self.a2s.queue.push_back((p, f));
            }
            T::ToServer(_) => {} // no stream while parked
            T::Dial {
                connect_id,
                address,
            } => {
                let Some(kind) = DestKind::of(&address) else {
                    return self.violate(format!("dial to unknown address {address}"));
                };
                let at = match kind {
                    DestKind::Hang => self.now + Duration::from_secs(1 << 20),
                    _ => self.now + DIAL_LATENCY,
                };
                self.dialing.push((at, connect_id, kind));
            }
            T::CancelDial { connect_id } => {
                let before = self.dialing.len();
                self.dialing.retain(|d| d.1 != connect_id);
                if before != self.dialing.len() + 1 {
                    self.violate(format!("cancelled unknown dial {connect_id}"));
                }
                self.cancelled_dials += 1;
            }
            T::Write { connect_id, data } => match self.dests.get_mut(&connect_id) {
                Some(d) if !d.closed => d.inbox.push_back(data),
                other => {
                    let what = format!("write to endpoint {connect_id}: {other:?}");
                    self.violate(what);
                }
            },
            T::Close { connect_id } | T::Abort { connect_id } => {
                let abort = matches!(a, T::Abort { .. });
                match self.dests.get_mut(&connect_id) {
                    Some(d) if !d.closed => {
                        d.closed = true;
                        if abort {
                            d.aborted = true;
                            d.inbox.clear();
                        }
                    }
                    other => {
                        let what = format!("{a:?} of endpoint {connect_id}: {other:?}");
                        self.violate(what);
                    }
                }
            }
            T::Release(n) => self.s2a.window += n,
            T::PauseRead { connect_id } | T::ResumeRead { connect_id } => {
                let paused = matches!(a, T::PauseRead { .. });
                match self.dests.get_mut(&connect_id) {
                    Some(d) if d.read_paused != paused => d.read_paused = paused,
                    other => {
                        let what = format!("{a:?} of endpoint {connect_id}: {other:?}");
                        self.violate(what);
                    }
                }
            }
            T::DialFailed(_) | T::DialSucceeded => {}
            T::ReverseEstablished { .. } | T::ReverseFailed { .. } => {
                self.violate(format!("unexpected tunnel action {a:?}"))
            }
        }
    }
}

impl super::Frontend {
    /// A gRPC frontend reads a packet other than DATA.
    /// `forwarded`: the agent's own packet (else the router's).
    fn control(&mut self, p: Packet, forwarded: bool) -> Result<(), String> {
        match p {
            Packet::DialRsp {
                error, connect_id, ..
            } => {
                if error.is_empty() {
                    if self.connect_id.is_some() {
                        return Err(format!("second connection {connect_id}"));
                    }
                    self.connect_id = Some(connect_id);
                } else {
                    self.dial_error = Some(error.to_string());
                }
            }
            Packet::CloseRsp { error, connect_id } => {
                // The agent's CLOSE_RSP for our connection ends it: nothing
                // of it may follow.
                if forwarded && self.connect_id == Some(connect_id) {
                    self.agent_closed = true;
                }
                self.close_rsp.get_or_insert_with(|| error.to_string());
            }
            Packet::DialCls { .. } => self.dial_cls = true,
            other => return Err(format!("got {other:?}")),
        }
        Ok(())
    }
}

/// What the router sent, decoded, with its gRPC message bytes.
fn decode(p: Payload) -> Result<(Packet, Bytes), String> {
    match p {
        Payload::Packet(p) => {
            let f = framed(&p);
            Ok((p, f))
        }
        Payload::Forward(b) => {
            let packet = b
                .get(5..)
                .map(|m| Packet::decode(&b.slice(5..5 + m.len())))
                .ok_or_else(|| "forwarded message without a prefix".to_owned())?
                .map_err(|e| format!("forwarded message does not decode: {e}"))?;
            Ok((packet, b))
        }
    }
}
