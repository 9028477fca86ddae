//! The router's backend side: agent tunnels arriving, leaving and sending
//! packets (DIAL_RSP, DATA, CLOSE_RSP, DIAL_CLS, DRAIN, PAUSE/RESUME).

use super::*;

impl Router {
    // ----- backends ---------------------------------------------------------

    /// An agent tunnel opened on this core (metadata already validated).
    pub fn backend_connected(
        &mut self,
        id: BackendId,
        agent_id: String,
        identifiers: Identifiers,
        core: usize,
    ) {
        self.backends.insert(id, Backend::default());
        self.directory.add(Entry {
            id,
            agent_id,
            identifiers,
            core,
            draining: false,
            flow_control: false,
        });
    }

    /// The agent negotiated konn's flow-control extension
    /// (`konn-flow-control`): PAUSE and RESUME may be sent to it and are
    /// honoured from it.
    pub fn set_flow_control(&mut self, id: BackendId, on: bool) {
        if let Some(b) = self.backends.get_mut(&id) {
            b.flow_control = on;
        }
        self.directory.set_flow_control(id, on);
    }

    /// The core whose tunnel backend `id` is, when it is not this one's
    /// (the IO layer routes frontend credit there).
    pub fn remote_core(&self, id: BackendId) -> Option<usize> {
        self.backends.get(&id).and_then(|b| b.remote)
    }

    /// The agent tunnel is gone (on this core, or — announced by its core —
    /// on another one this core has flows through): its connections close
    /// and its pending dials fail now. Relayed flows of other cores end
    /// there, on the same announcement.
    pub fn backend_gone(&mut self, id: BackendId) {
        self.resume_forget(id);
        self.directory.remove(id);
        let Some(b) = self.backends.remove(&id) else {
            return;
        };
        let mut established: Vec<(i64, FrontendId)> = b.established.into_iter().collect();
        established.sort_unstable();
        for (connect_id, fid) in established {
            let Some(f) = self.frontends.get_mut(&fid) else {
                continue;
            };
            f.account
                .end(ConnResult::Closed, "backend_gone", Side::Agent);
            f.established
                .retain(|&(bid, c)| !(bid == id && c == connect_id));
            // Nobody will RESUME it now.
            let held = std::mem::take(&mut f.held);
            f.paused = false;
            match f.kind {
                FrontendKind::Grpc => {
                    if held > 0 {
                        self.actions.push_back(Action::ResumeFrontend {
                            frontend: fid,
                            credit: held,
                        });
                    }
                    self.actions.push_back(Action::ToFrontend {
                        frontend: fid,
                        payload: Payload::Packet(Packet::CloseRsp {
                            error: ByteStr::new(),
                            connect_id,
                        }),
                    });
                }
                FrontendKind::HttpConnect | FrontendKind::Reverse => self.close_frontend(fid),
            }
        }
        for random in b.pending {
            let Some(p) = self.pending.remove(&random) else {
                continue;
            };
            if let Some(a) = self.account(p.frontend) {
                a.end(ConnResult::Failed, "backend_gone", Side::Agent);
            }
            self.actions
                .push_back(Action::DialFailed(DialFailure::BackendClose));
            self.fail_dial(p.frontend, random, BACKEND_GONE, DialFail::BackendGone);
        }
    }

    /// A packet from an agent. `framed` is its received gRPC message, which
    /// came with `credit` bytes of the tunnel stream's HTTP/2 credit.
    /// Returns the credit to return now; the rest follows as
    /// [`Action::ReleaseBackend`].
    ///
    /// For a backend of another core (a [`Relay::FromBackend`]), credit
    /// that goes back is sent there as [`Relay::Release`] and 0 returned.
    #[must_use]
    pub fn backend_packet(
        &mut self,
        now: Instant,
        id: BackendId,
        packet: Packet,
        framed: Bytes,
        credit: usize,
    ) -> usize {
        if !self.backends.contains_key(&id) {
            return credit;
        }
        let Some((packet, framed)) = self.resume_in(now, id, packet, framed) else {
            return credit; // konn-resume's own, a duplicate or a violation
        };
        let Some(b) = self.backends.get_mut(&id) else {
            return credit;
        };
        if let Some(core) = relay_target(b, &packet) {
            // A flow of another core's frontend: its router decides.
            self.actions.push_back(Action::Relay {
                core,
                relay: Relay::FromBackend {
                    backend: id,
                    payload: Payload::Forward(framed),
                    credit,
                },
            });
            return 0;
        }
        let remote = b.remote;
        let now_credit = self.local_backend_packet(now, id, packet, framed, credit);
        match remote {
            Some(core) if now_credit > 0 => {
                self.actions.push_back(Action::Relay {
                    core,
                    relay: Relay::Release {
                        backend: id,
                        credit: now_credit,
                    },
                });
                0
            }
            _ => now_credit,
        }
    }

    /// A packet of a local backend that is not relayed: upstream's packet
    /// semantics; returns the credit to return now.
    pub(super) fn local_backend_packet(
        &mut self,
        now: Instant,
        id: BackendId,
        packet: Packet,
        framed: Bytes,
        credit: usize,
    ) -> usize {
        let Some(b) = self.backends.get(&id) else {
            return credit;
        };
        let flow_control = b.flow_control;
        match packet {
            Packet::DialRsp {
                error,
                connect_id,
                random,
            } => self.on_dial_rsp(now, id, random, connect_id, &error, framed),
            Packet::DialCls { random } => {
                let Some(p) = self.take_pending(random, |p| p.backend == id) else {
                    return credit;
                };
                self.unlink_pending(&p, random);
                if let Some(a) = self.account(p.frontend) {
                    a.end(ConnResult::Failed, "dial_closed", Side::Agent);
                }
                self.actions
                    .push_back(Action::DialFailed(DialFailure::BackendClose));
                match self.frontends.get(&p.frontend).map(|f| f.kind) {
                    Some(FrontendKind::Grpc) => self.actions.push_back(Action::ToFrontend {
                        frontend: p.frontend,
                        payload: Payload::Forward(framed),
                    }),
                    Some(FrontendKind::HttpConnect | FrontendKind::Reverse) => {
                        self.close_frontend(p.frontend)
                    }
                    None => {}
                }
            }
            Packet::Data {
                connect_id, data, ..
            } => {
                if connect_id == 0 {
                    return credit;
                }
                let Some(fid) = self.established(id, connect_id) else {
                    self.close_req(id, connect_id);
                    return credit;
                };
                let may_pause = flow_control;
                let lim = self.cfg.flow;
                let Some(f) = self.frontends.get_mut(&fid) else {
                    self.close_req(id, connect_id);
                    return credit;
                };
                // Flow-controlled credit only from the frontend's own backend.
                let (held_credit, now_credit) = if f.rx_backend == Some(id) {
                    (credit, 0)
                } else {
                    (0, credit)
                };
                let data_len = data.len() as u64;
                let (len, action) = match f.kind {
                    FrontendKind::Grpc => (
                        framed.len(),
                        Action::ToFrontend {
                            frontend: fid,
                            payload: Payload::Forward(framed),
                        },
                    ),
                    FrontendKind::HttpConnect | FrontendKind::Reverse => (
                        data.len(),
                        Action::ConnectData {
                            frontend: fid,
                            data,
                        },
                    ),
                };
                f.account.down += data_len;
                let step = f.rx.push(len, held_credit, &lim, may_pause, now);
                self.actions.push_back(action);
                return now_credit + self.flow_step(fid, step, true);
            }
            Packet::Pause { connect_id } if flow_control => {
                if let Some(fid) = self.established(id, connect_id)
                    && let Some(f) = self.frontends.get_mut(&fid)
                    && !f.paused
                {
                    f.paused = true;
                    self.actions
                        .push_back(Action::PauseFrontend { frontend: fid });
                }
            }
            Packet::Resume { connect_id } if flow_control => {
                if let Some(fid) = self.established(id, connect_id)
                    && let Some(f) = self.frontends.get_mut(&fid)
                    && f.paused
                {
                    f.paused = false;
                    let credit = std::mem::take(&mut f.held);
                    self.actions.push_back(Action::ResumeFrontend {
                        frontend: fid,
                        credit,
                    });
                }
            }
            Packet::CloseRsp { connect_id, .. } => {
                let Some(fid) = self
                    .backends
                    .get_mut(&id)
                    .and_then(|b| b.established.remove(&connect_id))
                else {
                    return credit; // already closed
                };
                let Some(f) = self.frontends.get_mut(&fid) else {
                    return credit;
                };
                f.established
                    .retain(|&(b, c)| !(b == id && c == connect_id));
                if f.established.is_empty() {
                    f.permits.clear();
                }
                f.account.closed(Side::Agent);
                f.paused = false;
                let held = std::mem::take(&mut f.held);
                if held > 0 {
                    // Whatever the frontend still sends is answered, not
                    // forwarded: its credit need not wait.
                    self.actions.push_back(Action::ResumeFrontend {
                        frontend: fid,
                        credit: held,
                    });
                }
                match f.kind {
                    FrontendKind::Grpc => self.actions.push_back(Action::ToFrontend {
                        frontend: fid,
                        payload: Payload::Forward(framed),
                    }),
                    FrontendKind::HttpConnect | FrontendKind::Reverse => self.close_frontend(fid),
                }
            }
            Packet::Drain => self.directory.set_draining(id),
            // The reverse direction (KEP-2025), negotiated per tunnel.
            Packet::ReverseDialReq {
                protocol,
                address,
                random,
            } => self.reverse_dial_req(now, id, &protocol, &address, random),
            Packet::CloseReq { connect_id } if connect_id < 0 => {
                self.reverse_close_req(id, connect_id);
            }
            // An agent never sends these, and PAUSE/RESUME need the
            // extension; upstream ignores unexpected packets too.
            Packet::DialReq { .. }
            | Packet::CloseReq { .. }
            | Packet::Pause { .. }
            | Packet::Resume { .. }
            | Packet::ReverseDialRsp { .. }
            // konn-resume's are consumed by `resume_in` when negotiated.
            | Packet::Ack { .. }
            | Packet::Resumed => {}
        }
        credit
    }

    /// DIAL_RSP from backend `id` for dial `random`.
    pub(super) fn on_dial_rsp(
        &mut self,
        now: Instant,
        id: BackendId,
        random: i64,
        connect_id: i64,
        error: &str,
        framed: Bytes,
    ) {
        // Only the backend the dial went to may answer it.
        let Some(mut p) = self.take_pending(random, |p| p.backend == id) else {
            self.actions
                .push_back(Action::DialFailed(DialFailure::UnrecognizedResponse));
            if connect_id != 0 {
                self.close_req(id, connect_id);
            }
            return;
        };
        self.unlink_pending(&p, random);
        let fid = p.frontend;
        let Some(kind) = self.frontends.get(&fid).map(|f| f.kind) else {
            if connect_id != 0 {
                self.close_req(id, connect_id);
            }
            return;
        };
        if let Some(a) = self.account(fid)
            && (!error.is_empty() || connect_id == 0)
        {
            // A konn agent's allow-list refusal is audited as a refusal.
            if error.ends_with(crate::server::limits::NOT_ALLOWED) {
                let reason = Refusal::DestinationNotAllowed.as_str();
                a.end(ConnResult::Refused, reason, Side::Agent);
            } else {
                a.end(ConnResult::Failed, "dial_failed", Side::Agent);
            }
        }
        if !error.is_empty() {
            self.actions
                .push_back(Action::DialFailed(DialFailure::ErrorResponse));
            match kind {
                FrontendKind::Grpc => self.actions.push_back(Action::ToFrontend {
                    frontend: fid,
                    payload: Payload::Forward(framed),
                }),
                FrontendKind::HttpConnect | FrontendKind::Reverse => {
                    self.actions.push_back(Action::ConnectFailed {
                        frontend: fid,
                        response: dial_error_response(error),
                    });
                    self.forget_frontend(fid);
                }
            }
            return;
        }
        if connect_id == 0 {
            // A success without an id cannot carry data.
            self.actions
                .push_back(Action::DialFailed(DialFailure::ErrorResponse));
            self.fail_dial(
                fid,
                random,
                "dial response without a connection id",
                DialFail::Error,
            );
            return;
        }
        let Some(b) = self.backends.get_mut(&id) else {
            return;
        };
        b.established.insert(connect_id, fid);
        if let Some(f) = self.frontends.get_mut(&fid) {
            push_one(&mut f.established, (id, connect_id));
            f.rx_backend.get_or_insert(id);
            push_one(&mut f.permits, std::mem::take(&mut p.permit));
            f.account.connect_id = connect_id;
        }
        self.actions.push_back(Action::DialSucceeded {
            frontend: fid,
            backend: id,
            connect_id,
            elapsed: now.saturating_duration_since(p.started),
        });
        match kind {
            FrontendKind::Grpc => self.actions.push_back(Action::ToFrontend {
                frontend: fid,
                payload: Payload::Forward(framed),
            }),
            FrontendKind::HttpConnect | FrontendKind::Reverse => {
                self.actions.push_back(Action::ConnectEstablished {
                    frontend: fid,
                    backend: id,
                    connect_id,
                })
            }
        }
    }
}
