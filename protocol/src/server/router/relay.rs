//! Flows across cores (module docs of [`super`], "Flows across cores"): the
//! tunnel core's relay tables and the frontend core's addressing of proxies.

use super::*;
use resume::Out;

impl Router {
    /// A packet from a frontend of core `from` for this core's tunnel
    /// `backend` ([`Relay::ToBackend`]): remembered for routing the agent's
    /// answers back, and forwarded. A dial that cannot be accepted here is
    /// answered at once with an error DIAL_RSP. Packets for a tunnel that
    /// is gone are dropped: core `from` learns of its end from the same
    /// announcement that ends its proxy.
    pub fn relayed_packet(
        &mut self,
        from: usize,
        backend: BackendId,
        packet: Packet,
        framed: Bytes,
    ) {
        let max = self.cfg.max_pending_per_backend;
        let in_use = self.pending.contains_key(&match packet {
            Packet::DialReq { random, .. } => random,
            _ => 0,
        });
        let Some(b) = self
            .backends
            .get_mut(&backend)
            .filter(|b| b.remote.is_none())
        else {
            return;
        };
        match packet {
            Packet::DialReq { random, .. } => {
                let refuse = if in_use || b.relay_pending.contains_key(&random) {
                    Some(DIAL_ID_IN_USE)
                } else if b.pending.len() + b.relay_pending.len() >= max {
                    Some(TOO_MANY_PENDING)
                } else {
                    None
                };
                if let Some(why) = refuse {
                    self.actions.push_back(Action::Relay {
                        core: from,
                        relay: Relay::FromBackend {
                            backend,
                            payload: Payload::Packet(Packet::DialRsp {
                                error: ByteStr::from_static(why),
                                connect_id: 0,
                                random,
                            }),
                            credit: 0,
                        },
                    });
                    return;
                }
                b.relay_pending.insert(random, from);
            }
            Packet::DialCls { random } => {
                if b.relay_pending.get(&random) == Some(&from) {
                    b.relay_pending.remove(&random);
                }
            }
            Packet::Data { connect_id, .. }
            | Packet::CloseReq { connect_id }
            | Packet::Pause { connect_id }
            | Packet::Resume { connect_id } => {
                // Only connections of that core's frontends.
                if b.relay_established.get(&connect_id) != Some(&from) {
                    return;
                }
            }
            Packet::DialRsp { .. }
            | Packet::CloseRsp { .. }
            | Packet::Drain
            | Packet::ReverseDialReq { .. }
            | Packet::ReverseDialRsp { .. }
            | Packet::Ack { .. }
            | Packet::Resumed => return,
        }
        self.send_backend(backend, Payload::Forward(framed));
    }

    /// Send a packet to a backend: its tunnel here, or through the mesh to
    /// the core of a proxy's tunnel.
    pub(super) fn send_backend(&mut self, backend: BackendId, payload: Payload) {
        self.send_backend_as(backend, payload, None);
    }

    /// [`send_backend`](Self::send_backend) for framed DATA of `connect_id`
    /// whose payload the caller holds decoded (`data`, a slice of
    /// `framed`): konn-resume records it without decoding `framed` again.
    pub(super) fn send_backend_data(
        &mut self,
        backend: BackendId,
        framed: Bytes,
        connect_id: i64,
        data: &Bytes,
    ) {
        self.send_backend_as(backend, Payload::Forward(framed), Some((connect_id, data)));
    }

    fn send_backend_as(
        &mut self,
        backend: BackendId,
        payload: Payload,
        data: Option<(i64, &Bytes)>,
    ) {
        let action = match self.remote_core(backend) {
            Some(core) => Action::Relay {
                core,
                relay: Relay::ToBackend { backend, payload },
            },
            None => match self.resume_out(backend, &payload, data) {
                Out::Later => return, // with the replay
                Out::Now => Action::ToBackend { backend, payload },
                Out::WithAck => {
                    // The ACK the connection owed rides with the DATA.
                    self.actions
                        .push_back(Action::ToBackend { backend, payload });
                    self.flush_resume(backend);
                    return;
                }
            },
        };
        self.actions.push_back(action);
    }

    /// Return tunnel credit to a backend (here, or through the mesh).
    pub(super) fn release_backend(&mut self, backend: BackendId, credit: usize) {
        let action = match self.remote_core(backend) {
            Some(core) => Action::Relay {
                core,
                relay: Relay::Release { backend, credit },
            },
            None => Action::ReleaseBackend { backend, credit },
        };
        self.actions.push_back(action);
    }
}

/// The core of another core's frontend an agent's packet belongs to, if it
/// is one of `b`'s relayed dials or connections; updates the relay tables
/// (a dial's answer establishes or ends it, CLOSE_RSP ends a connection).
pub(super) fn relay_target(b: &mut Backend, packet: &Packet) -> Option<usize> {
    if b.relay_pending.is_empty() && b.relay_established.is_empty() {
        return None;
    }
    match packet {
        Packet::DialRsp {
            random,
            connect_id,
            error,
        } => {
            let core = b.relay_pending.remove(random)?;
            if error.is_empty() && *connect_id != 0 {
                b.relay_established.insert(*connect_id, core);
            }
            Some(core)
        }
        Packet::DialCls { random } => b.relay_pending.remove(random),
        Packet::CloseRsp { connect_id, .. } => b.relay_established.remove(connect_id),
        Packet::Data { connect_id, .. }
        | Packet::Pause { connect_id }
        | Packet::Resume { connect_id } => b.relay_established.get(connect_id).copied(),
        Packet::DialReq { .. }
        | Packet::CloseReq { .. }
        | Packet::Drain
        | Packet::ReverseDialReq { .. }
        | Packet::ReverseDialRsp { .. }
        | Packet::Ack { .. }
        | Packet::Resumed => None,
    }
}
