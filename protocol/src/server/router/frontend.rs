//! The router's frontend side: gRPC streams and CONNECT connections
//! arriving, dialling, sending and leaving, and the deadlines of their dials
//! and queues.

use std::sync::Arc;

use super::*;

impl Router {
    // ----- frontends --------------------------------------------------------

    /// A frontend appeared.
    pub fn frontend_opened(&mut self, id: FrontendId, kind: FrontendKind) {
        self.frontends.insert(id, Box::new(Frontend::new(kind)));
    }

    /// Name the client of a frontend for the per-frontend limits: the IO
    /// layer's identity (the server's: `uid=…` of a Unix-socket peer,
    /// `cn=…` of a client certificate), shared by the streams of one
    /// connection. A frontend without one counts as the empty identity.
    pub fn set_frontend_identity(&mut self, id: FrontendId, identity: Arc<str>) {
        if let Some(f) = self.frontends.get_mut(&id) {
            f.identity = Some(identity);
        }
    }

    /// A packet from a gRPC frontend. `framed` is its received gRPC message;
    /// `random` seeds backend selection.
    pub fn frontend_packet(
        &mut self,
        now: Instant,
        id: FrontendId,
        packet: Packet,
        framed: Bytes,
        random: u64,
    ) {
        self.resume_clock(now);
        let Some(f) = self.frontends.get(&id) else {
            return;
        };
        if f.done {
            return;
        }
        match packet {
            Packet::DialReq {
                address,
                random: dial,
                ..
            } => self.dial(now, id, &address, dial, random, Some(framed)),
            Packet::Data {
                connect_id, data, ..
            } => {
                let Some(backend) = f.backend else {
                    self.send_close_rsp(id, connect_id, "backend not initialized");
                    self.mark_done(id);
                    return;
                };
                if connect_id == 0 {
                    return;
                }
                let Some(f) = self.frontends.get_mut(&id) else {
                    return;
                };
                if f.first_conn_id == 0 {
                    f.first_conn_id = connect_id;
                } else if f.first_conn_id != connect_id {
                    let first = f.first_conn_id;
                    for c in [connect_id, first] {
                        self.close_req(backend, c);
                    }
                    for c in [connect_id, first] {
                        self.send_close_rsp(id, c, "mismatched connection IDs");
                    }
                    if let Some(a) = self.account(id) {
                        a.end(ConnResult::Closed, "mismatched_ids", Side::Server);
                    }
                    self.mark_done(id);
                    return;
                }
                // konn: only connections this frontend established.
                match f.established.iter().find(|(_, c)| *c == connect_id) {
                    Some(&(b, _)) => {
                        f.account.up += data.len() as u64;
                        self.send_backend_data(b, framed, connect_id, &data)
                    }
                    None => self.send_close_rsp(id, connect_id, "unrecognized connectID"),
                }
            }
            Packet::CloseReq { connect_id } => {
                let Some(backend) = f.backend else {
                    self.send_close_rsp(id, connect_id, "backend uninitialized");
                    return;
                };
                let target = f
                    .established
                    .iter()
                    .find(|(_, c)| *c == connect_id)
                    .map_or(backend, |&(b, _)| b);
                self.send_backend(target, Payload::Forward(framed));
                if let Some(a) = self.account(id) {
                    a.closed(Side::Frontend);
                }
                // Upstream stops serving the stream after CLOSE_REQ; the
                // agent's CLOSE_RSP still reaches it.
                self.mark_done(id);
            }
            Packet::DialCls { random } => {
                let Some(p) = self.take_pending(random, |p| p.frontend == id) else {
                    return;
                };
                self.unlink_pending(&p, random);
                if let Some(a) = self.account(id) {
                    a.end(ConnResult::Cancelled, "frontend_cancelled", Side::Frontend);
                }
                self.actions
                    .push_back(Action::DialFailed(DialFailure::FrontendClose));
                // konn: tell the agent, which stops dialling.
                self.send_backend(p.backend, Payload::Forward(framed));
            }
            // Not for a server; upstream ignores them.
            Packet::DialRsp { .. }
            | Packet::ReverseDialReq { .. }
            | Packet::ReverseDialRsp { .. }
            | Packet::CloseRsp { .. }
            | Packet::Drain
            | Packet::Pause { .. }
            | Packet::Resume { .. }
            | Packet::Ack { .. }
            | Packet::Resumed => {}
        }
    }

    /// An HTTP CONNECT frontend asks for `address`; `dial_random` is the dial
    /// id the server chose, `random` seeds backend selection.
    pub fn connect_request(
        &mut self,
        now: Instant,
        id: FrontendId,
        address: &str,
        dial_random: i64,
        random: u64,
    ) {
        self.dial(now, id, address, dial_random, random, None);
    }

    /// A CONNECT frontend sent `len` payload bytes (already framed as a
    /// DATA packet by the IO layer) for its connection.
    pub fn connect_data(&mut self, id: FrontendId, framed: Bytes, len: usize) -> bool {
        let Some(f) = self.frontends.get_mut(&id) else {
            return false;
        };
        let Some(&(backend, connect_id)) = f.established.first() else {
            return false;
        };
        f.account.up += len as u64;
        // The IO layer's framing puts the payload last.
        let data = framed.slice(framed.len().saturating_sub(len)..);
        self.send_backend_data(backend, framed, connect_id, &data);
        true
    }

    /// A frontend went away (stream ended, socket closed, or the IO layer
    /// gave up on it): its dials are cancelled and its connections closed
    /// at the agent.
    pub fn frontend_gone(&mut self, id: FrontendId) {
        let Some(mut f) = self.frontends.remove(&id) else {
            return;
        };
        self.reverse_forgotten(&f);
        self.release_rx(&mut f);
        f.account.closed(Side::Frontend);
        self.account_ended(id, &mut f);
        for random in f.pending {
            let Some(p) = self.pending.remove(&random) else {
                continue;
            };
            if let Some(b) = self.backends.get_mut(&p.backend) {
                b.pending.remove(&random);
            }
            self.actions
                .push_back(Action::DialFailed(DialFailure::FrontendClose));
            self.send_backend(p.backend, Payload::Packet(Packet::DialCls { random }));
        }
        for (backend, connect_id) in f.established {
            if let Some(b) = self.backends.get_mut(&backend) {
                b.established.remove(&connect_id);
            }
            self.close_req(backend, connect_id);
        }
    }

    /// An established connection could not be served (its frontend stopped
    /// reading for too long): close it on both sides, with `reason`, and
    /// return the tunnel credit its queue held back. A CONNECT socket is
    /// closed without writing what is queued for it.
    pub fn frontend_stuck(&mut self, id: FrontendId, reason: &str) {
        let Some(f) = self.frontends.get(&id) else {
            return;
        };
        let conns = f.established.clone();
        let kind = f.kind;
        if let Some(a) = self.account(id) {
            a.end(ConnResult::Closed, "frontend_stuck", Side::Server);
        }
        for (backend, connect_id) in conns {
            if let Some(b) = self.backends.get_mut(&backend) {
                b.established.remove(&connect_id);
            }
            self.close_req(backend, connect_id);
            if kind == FrontendKind::Grpc {
                self.send_close_rsp(id, connect_id, reason);
            }
        }
        if let Some(mut f) = self.frontends.remove(&id) {
            self.reverse_forgotten(&f);
            self.release_rx(&mut f);
            f.established.clear();
            f.permits.clear();
            f.done = true;
            f.paused = false;
            if f.held > 0 {
                self.actions.push_back(Action::ResumeFrontend {
                    frontend: id,
                    credit: std::mem::take(&mut f.held),
                });
            }
            if kind == FrontendKind::Grpc {
                // Still there for the stream's end; nothing flows any more.
                f.rx_backend = None;
                self.frontends.insert(id, f);
            } else {
                self.account_ended(id, &mut f);
            }
        }
        if kind != FrontendKind::Grpc {
            self.forget_frontend(id);
            self.actions
                .push_back(Action::AbortFrontend { frontend: id });
        }
    }

    // ----- timers -----------------------------------------------------------

    /// The earliest deadline: a pending dial's, the moment a frontend
    /// that drains nothing becomes stuck, or a resume timer's.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.flows_poll_timeout()
            .into_iter()
            .chain(self.resume_timeout())
            .min()
    }

    /// [`Router::poll_timeout`] without the resume timers (which
    /// [`Router::resume_poll_timeout`] tells): pending dials and stuck
    /// frontends.
    pub fn flows_poll_timeout(&self) -> Option<Instant> {
        let lim = &self.cfg.flow;
        let dials = self.pending.values().map(|p| p.deadline);
        let flows = self.frontends.values().filter_map(|f| f.rx.deadline(lim));
        dials.chain(flows).min()
    }

    /// Expire pending dials due at `now`, and close frontends that are
    /// stuck at `now` (nothing drained from their queue for the stuck
    /// timeout).
    pub fn handle_timeout(&mut self, now: Instant) {
        self.resume_handle_timeout(now);
        let mut due: Vec<i64> = self
            .pending
            .iter()
            .filter(|(_, p)| p.deadline <= now)
            .map(|(r, _)| *r)
            .collect();
        due.sort_unstable();
        for random in due {
            let Some(p) = self.pending.remove(&random) else {
                continue;
            };
            self.unlink_pending(&p, random);
            if let Some(a) = self.account(p.frontend) {
                a.end(ConnResult::Failed, "dial_timeout", Side::Server);
            }
            self.actions
                .push_back(Action::DialFailed(DialFailure::BackendDialTimeout));
            // Tell the agent to stop dialling (konn's agent honours it).
            self.send_backend(p.backend, Payload::Packet(Packet::DialCls { random }));
            self.fail_dial(p.frontend, random, BACKEND_DIAL_TIMEOUT, DialFail::Timeout);
        }
        let lim = self.cfg.flow;
        let mut stuck: Vec<FrontendId> = self
            .frontends
            .iter()
            .filter(|(_, f)| f.rx.is_stuck(&lim, now))
            .map(|(id, _)| *id)
            .collect();
        stuck.sort_unstable();
        for fid in stuck {
            self.frontend_stuck(fid, FRONTEND_STUCK);
        }
    }

    pub(super) fn dial(
        &mut self,
        now: Instant,
        id: FrontendId,
        address: &str,
        dial: i64,
        random: u64,
        framed: Option<Bytes>,
    ) {
        let Some(kind) = self.frontends.get(&id).map(|f| f.kind) else {
            return;
        };
        self.account_dial(now, id, address);
        let Some(entry) = self.directory.pick(address, random, self.cfg.core) else {
            if let Some(a) = self.account(id) {
                a.end(ConnResult::Refused, "no_backend", Side::Server);
            }
            self.actions
                .push_back(Action::DialFailed(DialFailure::NoAgent));
            match kind {
                FrontendKind::Grpc => {
                    self.send_dial_error(id, dial, NO_AGENT);
                    self.mark_done(id);
                }
                FrontendKind::HttpConnect | FrontendKind::Reverse => {
                    self.actions.push_back(Action::ConnectFailed {
                        frontend: id,
                        response: no_tunnel_response(),
                    });
                    self.forget_frontend(id);
                }
            }
            return;
        };
        let admitted = match &self.cfg.limits {
            None => Ok(Permit::default()),
            Some(l) => l.admit(
                now,
                &entry.agent_id,
                dest_host(address),
                self.frontends
                    .get(&id)
                    .and_then(|f| f.identity.as_deref())
                    .unwrap_or(""),
            ),
        };
        let permit = match admitted {
            Ok(p) => p,
            Err(reason) => {
                let backend = entry.id;
                if let Some(a) = self.account(id) {
                    a.end(ConnResult::Refused, reason.as_str(), Side::Server);
                }
                self.refuse_admission(id, kind, dial, reason, backend, address);
                return;
            }
        };
        let backend = entry.id;
        let agent_id: Arc<str> = Arc::from(entry.agent_id.as_str());
        if entry.core != self.cfg.core && !self.backends.contains_key(&backend) {
            // A tunnel of another core: flows through it are relayed.
            self.backends.insert(
                backend,
                Backend {
                    remote: Some(entry.core),
                    flow_control: entry.flow_control,
                    ..Backend::default()
                },
            );
        }
        let Some(b) = self.backends.get(&backend) else {
            // Only a directory out of step with this core's tunnels.
            if let Some(a) = self.account(id) {
                a.end(ConnResult::Refused, "no_backend", Side::Server);
            }
            self.actions
                .push_back(Action::DialFailed(DialFailure::NoAgent));
            self.fail_dial(id, dial, NO_AGENT, DialFail::Error);
            return;
        };
        let over = self
            .frontends
            .get(&id)
            .is_some_and(|f| f.pending.len() >= self.cfg.max_pending_per_frontend)
            || b.pending.len() + b.relay_pending.len() >= self.cfg.max_pending_per_backend;
        let reused = self.pending.contains_key(&dial) || b.relay_pending.contains_key(&dial);
        if over || reused {
            let (why, reason) = if reused {
                (DIAL_ID_IN_USE, "dial_id_in_use")
            } else {
                (TOO_MANY_PENDING, "too_many_pending")
            };
            if let Some(a) = self.account(id) {
                a.end(ConnResult::Refused, reason, Side::Server);
            }
            self.actions
                .push_back(Action::DialFailed(DialFailure::NoAgent));
            self.fail_dial(id, dial, why, DialFail::Error);
            return;
        }
        let (Some(f), Some(b)) = (self.frontends.get_mut(&id), self.backends.get_mut(&backend))
        else {
            return;
        };
        f.backend = Some(backend);
        f.account.backend = Some(backend);
        f.account.agent_id = Some(agent_id);
        push_one(&mut f.pending, dial);
        b.pending.insert(dial);
        self.pending.insert(
            dial,
            Pending {
                frontend: id,
                permit,
                backend,
                started: now,
                deadline: now + self.cfg.dial_timeout,
            },
        );
        let payload = match framed {
            Some(b) => Payload::Forward(b),
            None => Payload::Packet(Packet::DialReq {
                protocol: ByteStr::from_static("tcp"),
                address: ByteStr::from(address.to_owned()),
                random: dial,
            }),
        };
        self.send_backend(backend, payload);
    }

    /// Refuse a dial at admission: a DIAL_RSP error to a gRPC frontend, 503
    /// to a CONNECT one; [`Action::DialRefused`] for metrics and audit.
    fn refuse_admission(
        &mut self,
        fid: FrontendId,
        kind: FrontendKind,
        random: i64,
        reason: Refusal,
        backend: BackendId,
        address: &str,
    ) {
        self.actions.push_back(Action::DialRefused {
            frontend: fid,
            reason,
            backend,
            address: address.into(),
        });
        match kind {
            FrontendKind::Grpc => self.send_dial_error(fid, random, &reason.message()),
            FrontendKind::HttpConnect | FrontendKind::Reverse => {
                self.actions.push_back(Action::ConnectFailed {
                    frontend: fid,
                    response: refused_response(reason),
                });
                self.forget_frontend(fid);
            }
        }
    }

    /// End a dial with an error towards its frontend.
    pub(super) fn fail_dial(&mut self, fid: FrontendId, random: i64, error: &str, why: DialFail) {
        let Some(f) = self.frontends.get_mut(&fid) else {
            return;
        };
        f.pending.retain(|r| *r != random);
        match f.kind {
            FrontendKind::Grpc => self.send_dial_error(fid, random, error),
            FrontendKind::HttpConnect | FrontendKind::Reverse => {
                let response = match why {
                    DialFail::Timeout => {
                        raw_response(504, &format!("Backend dial timeout: {error}\r\n"))
                    }
                    DialFail::BackendGone => {
                        raw_response(502, &format!("Backend context error: {error}\r\n"))
                    }
                    DialFail::Error => dial_error_response(error),
                };
                self.actions.push_back(Action::ConnectFailed {
                    frontend: fid,
                    response,
                });
                self.forget_frontend(fid);
            }
        }
    }
}
