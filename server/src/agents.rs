//! The agent port: `/AgentService/Connect` calls become backends.
//!
//! A Connect call is validated like upstream (`NewBackend`): exactly one
//! `agentid`, at most one `agentidentifiers` (URL query, unknown keys
//! ignored). It is answered with the `serverid` and `servercount` response
//! headers before any packet, then registered with this core's router and
//! announced to the other cores. Every packet from the agent goes through
//! the router, which says when the tunnel's flow-control credit goes back:
//! at once, unless the frontend the data is for is behind (then as it
//! drains; docs/design/tunnel.md, "Flow control").
//!
//! konn's flow-control extension is negotiated here: an agent that sends
//! the request metadata `konn-flow-control: 1` gets the response header
//! `konn-flow-control: 1` (unless `flow_control` is off in the settings),
//! `konn-resume: v1` gets `konn-resume: v1` when the `resume` setting is
//! on (docs/design/resume.md),
//! and only then do PAUSE/RESUME travel on its tunnel. A Go agent never
//! sends the metadata and never sees the header. The reverse direction's
//! `konn-reverse: 1` (KEP-2025) is negotiated the same way.

use std::rc::Rc;

use bytes::Bytes;
use konn_core::io::driver::Handler;
use konn_frames::GrpcStatus;
use konn_frames::packet::{Packet, PacketType};
use konn_protocol::grpc::{Grpc, GrpcEvent};
use konn_protocol::h2::Headers;
use konn_protocol::maps::IdMap;
use konn_protocol::resume;

use crate::auth::{AuthResult, Verdicts};
use crate::cluster::{Cluster, ClusterMsg};
use crate::metrics::{Segment, ServiceMethod};
use crate::worker::{BackendRef, Outbox, Worker, bump};
use konn_core::kube::review::{Outcome, Source, Verdict};
use konn_protocol::server::backends::{BackendId, Identifiers};

/// The request metadata key (and response header) of konn's flow-control
/// extension; its value is `1`.
pub const FLOW_CONTROL_KEY: &str = "konn-flow-control";

/// The request metadata key (and response header) of konn's reverse
/// direction (KEP-2025, docs/design/reverse.md); its value is `1`. The
/// server always answers it: what an agent may reach is decided per dial
/// by `--allowed-destination` (nothing when that is empty).
pub const REVERSE_KEY: &str = "konn-reverse";

/// What a Connect call registers once accepted.
struct Registration {
    agent_id: String,
    identifiers: Identifiers,
    flow_control: bool,
    reverse: bool,
    /// The agent offered `konn-resume: v1` and the server answers it.
    resume: bool,
}

/// The handler of one agent connection.
pub struct AgentConn {
    worker: Rc<Worker>,
    outbox: Rc<Outbox>,
    /// Connect streams of this connection → backends.
    streams: IdMap<u32, BackendId>,
    /// Connect calls held for a token review: stream → (hold, what to
    /// register).
    held: IdMap<u32, (u64, Registration)>,
    /// Verdicts delivered for held calls.
    verdicts: Rc<Verdicts>,
    /// The cluster this connection was admitted to (by SNI with
    /// `--clusters-config`).
    cluster: Rc<Cluster>,
}

impl AgentConn {
    /// A handler for one connection on the agent port.
    pub fn new(worker: Rc<Worker>, cluster: Rc<Cluster>, outbox: Rc<Outbox>) -> Self {
        Self {
            worker,
            outbox,
            streams: IdMap::default(),
            held: IdMap::default(),
            verdicts: Rc::new(Verdicts::default()),
            cluster,
        }
    }

    fn on_call(&mut self, grpc: &mut Grpc, id: u32, path: &[u8], metadata: &Headers) {
        if path != b"/AgentService/Connect" {
            let msg = unknown_method(path, "AgentService");
            let _ = grpc.finish(id, GrpcStatus::UNIMPLEMENTED, &msg);
            return;
        }
        let ids: Vec<&Bytes> = metadata.get_all(b"agentid").collect();
        let [agent_id] = ids.as_slice() else {
            let msg = format!(
                "expected one agent ID in the context, got {}",
                go_slice(&ids)
            );
            let _ = grpc.finish(id, GrpcStatus::UNKNOWN, &msg);
            return;
        };
        let agent_id = String::from_utf8_lossy(agent_id).into_owned();
        let idents: Vec<&Bytes> = metadata.get_all(b"agentidentifiers").collect();
        let identifiers = match idents.as_slice() {
            [] => Identifiers::default(),
            [one] => match Identifiers::parse(&String::from_utf8_lossy(one)) {
                Ok(i) => i,
                Err(e) => {
                    let msg = format!("fail to parse url encoded string: {e}");
                    let _ = grpc.finish(id, GrpcStatus::UNKNOWN, &msg);
                    return;
                }
            },
            more => {
                let msg = format!(
                    "expected at most one set of agent identifiers in the context, got {}",
                    go_slice(more)
                );
                let _ = grpc.finish(id, GrpcStatus::UNKNOWN, &msg);
                return;
            }
        };
        let flow_control = self.worker.settings.flow_control
            && metadata
                .get(FLOW_CONTROL_KEY.as_bytes())
                .is_some_and(|v| v == "1");
        let reverse = metadata
            .get(REVERSE_KEY.as_bytes())
            .is_some_and(|v| v == "1");
        let resume = self.worker.settings.resume
            && metadata
                .get(resume::RESUME_METADATA.as_bytes())
                .is_some_and(|v| v == resume::RESUME_VERSION);
        let call = Registration {
            agent_id,
            identifiers,
            flow_control,
            reverse,
            resume,
        };
        // Token authentication (upstream: after the agent id and
        // identifiers, before the response headers): hold the call until
        // the verdict arrives (crate::auth).
        if let Some(auth) = &self.cluster.auth {
            let token = match crate::auth::bearer_token(metadata) {
                Ok(t) => t,
                Err((result, msg)) => {
                    self.refuse(grpc, id, &call.agent_id, result, None, &msg);
                    return;
                }
            };
            match auth.hold(&self.worker, &token, id, &self.verdicts, &self.outbox) {
                Ok(hold) => {
                    self.held.insert(id, (hold, call));
                }
                Err(verdict) => self.decide(
                    grpc,
                    id,
                    call,
                    Outcome {
                        verdict,
                        source: Source::Reviewer,
                    },
                ),
            }
            return;
        }
        self.register(grpc, id, call);
    }

    /// A held call's verdict arrived.
    fn decide(&mut self, grpc: &mut Grpc, id: u32, call: Registration, outcome: Outcome) {
        let result = AuthResult::of(&outcome.verdict);
        match outcome.verdict {
            Verdict::Allowed { username } => {
                self.count_auth(result, Some(outcome.source));
                tracing::debug!(agent_id = %call.agent_id, %username, "Agent successfully authenticated via token");
                self.register(grpc, id, call);
            }
            Verdict::Refused { message, .. } => {
                let msg = format!("{}{message}", crate::auth::VALIDATE_PREFIX);
                self.refuse(grpc, id, &call.agent_id, result, Some(outcome.source), &msg);
            }
        }
    }

    fn count_auth(&self, result: AuthResult, source: Option<Source>) {
        self.cluster
            .all_metrics
            .agent_auth(result.as_str(), crate::auth::source_label(source));
    }

    /// Refuse a Connect call as upstream does: status Unknown, its text.
    fn refuse(
        &mut self,
        grpc: &mut Grpc,
        id: u32,
        agent_id: &str,
        result: AuthResult,
        source: Option<Source>,
        msg: &str,
    ) {
        self.count_auth(result, source);
        tracing::error!(agent_id = %agent_id, error = %msg, "Client authentication failed");
        let _ = grpc.finish(id, GrpcStatus::UNKNOWN, msg);
    }

    /// Answer the call with the response headers and register the backend.
    fn register(&mut self, grpc: &mut Grpc, id: u32, call: Registration) {
        let Registration {
            agent_id,
            identifiers,
            flow_control,
            reverse,
            resume,
        } = call;
        let s = &self.worker.settings;
        let mut md = Headers::new();
        md.push(
            Bytes::from_static(b"serverid"),
            Bytes::from(s.server_id.clone()),
        );
        md.push(
            Bytes::from_static(b"servercount"),
            Bytes::from(s.server_count.to_string()),
        );
        if flow_control {
            md.push(
                Bytes::from_static(FLOW_CONTROL_KEY.as_bytes()),
                Bytes::from_static(b"1"),
            );
        }
        if reverse {
            md.push(
                Bytes::from_static(REVERSE_KEY.as_bytes()),
                Bytes::from_static(b"1"),
            );
        }
        if resume {
            md.push(
                Bytes::from_static(resume::RESUME_METADATA.as_bytes()),
                Bytes::from_static(resume::RESUME_VERSION.as_bytes()),
            );
        }
        if grpc.accept(id, &md).is_err() {
            return;
        }
        let bid = self.worker.next_id();
        tracing::info!(agent_id = %agent_id, backend = bid, flow_control, cluster = self.cluster.name(), "agent connected");
        {
            let mut router = self.cluster.router.borrow_mut();
            router.backend_connected(bid, agent_id, identifiers, self.worker.index);
            router.set_flow_control(bid, flow_control);
            router.set_reverse(bid, reverse);
            if resume {
                let q = s.router.flow.high.saturating_mul(2);
                router.set_resume(bid, Some(resume::ResumeLimits::from_queue_size(q)));
            }
        }
        let entry = self.cluster.router.borrow().directory().get(bid).cloned();
        self.cluster.backends.borrow_mut().insert(
            bid,
            BackendRef {
                outbox: self.outbox.clone(),
                stream: id,
                queued: std::cell::Cell::new(0),
                waiting: std::cell::RefCell::new(Vec::new()),
                drained: Rc::new(konn_core::io::notify::Broadcast::new()),
            },
        );
        self.streams.insert(id, bid);
        bump(&self.worker.shared.connect_streams, true);
        bump(&self.worker.shared.backends, true);
        self.cluster
            .metrics
            .grpc_connections(ServiceMethod::Connect)
            .inc();
        self.publish_backends();
        if let Some(e) = entry {
            let load = std::sync::Arc::new(crate::worker::BackendLoad::default());
            self.cluster.loads.borrow_mut().insert(bid, load.clone());
            self.cluster.announce(&self.worker, || {
                ClusterMsg::BackendUp(e.clone(), load.clone())
            });
        }
    }

    /// A held call's stream went away: drop the hold.
    fn unhold(&mut self, id: u32) {
        if let Some((hold, _)) = self.held.remove(&id)
            && let Some(auth) = &self.cluster.auth
        {
            auth.forget(hold);
        }
    }

    fn gone(&mut self, id: u32) {
        let Some(bid) = self.streams.remove(&id) else {
            return;
        };
        tracing::info!(
            backend = bid,
            cluster = self.cluster.name(),
            "agent disconnected"
        );
        let (w, c) = (&*self.worker, &*self.cluster);
        let agent_id = c
            .router
            .borrow()
            .directory()
            .get(bid)
            .map(|e| e.agent_id.clone());
        c.router.borrow_mut().backend_gone(bid);
        c.backend_drained(w, bid); // give back any held credit
        c.backends.borrow_mut().remove(&bid);
        c.loads.borrow_mut().remove(&bid);
        c.apply(w);
        bump(&w.shared.connect_streams, false);
        bump(&w.shared.backends, false);
        c.metrics.grpc_connections(ServiceMethod::Connect).dec();
        self.publish_backends();
        c.publish(w);
        c.announce(w, || ClusterMsg::BackendDown(bid));
        if let Some(agent_id) = agent_id {
            crate::accounting::agent_gone(c, &agent_id);
        }
    }

    fn publish_backends(&self) {
        self.cluster.publish_backends();
    }
}

impl Handler<Grpc> for AgentConn {
    fn on_event(&mut self, grpc: &mut Grpc, event: GrpcEvent) {
        match event {
            GrpcEvent::Call {
                id, path, metadata, ..
            } => self.on_call(grpc, id, &path, &metadata),
            GrpcEvent::Message {
                id,
                msg,
                framed,
                flow,
            } => {
                // Credit the router does not keep goes back now.
                let mut credit = flow;
                if let Some(&bid) = self.streams.get(&id) {
                    match Packet::decode(&msg) {
                        Ok(p) => {
                            let ty = p.ty();
                            let (w, c) = (&*self.worker, &*self.cluster);
                            c.metrics.stream_packets(Segment::FromAgent, ty).inc();
                            w.forwarding.set(ty);
                            let drain = matches!(p, Packet::Drain);
                            let framed = framed.unwrap_or_else(|| reframe(&msg));
                            credit = c.router.borrow_mut().backend_packet(
                                konn_core::io::clock::now(),
                                bid,
                                p,
                                framed,
                                flow,
                            );
                            c.apply(w);
                            if ty != PacketType::Data {
                                c.publish(w);
                            }
                            if drain {
                                tracing::info!(backend = bid, "agent is draining");
                                c.announce(w, || ClusterMsg::BackendDraining(bid));
                            }
                        }
                        Err(e) => {
                            tracing::debug!(error = %e, backend = bid, "ignoring an undecodable packet from an agent")
                        }
                    }
                }
                grpc.release(id, credit);
            }
            GrpcEvent::Writable { id } => {
                if let Some(&bid) = self.streams.get(&id) {
                    if let Some(b) = self.cluster.backends.borrow().get(&bid) {
                        b.queued.set(grpc.queued_bytes(id));
                    }
                    self.cluster.backend_drained(&self.worker, bid);
                }
            }
            GrpcEvent::HalfClose { id } => {
                self.unhold(id);
                self.gone(id);
                let _ = grpc.finish(id, GrpcStatus::OK, "");
            }
            GrpcEvent::Finished { id, status, .. } => {
                if status != GrpcStatus::OK && self.streams.contains_key(&id) {
                    let code = crate::frontend::upstream_recv_code(status);
                    self.cluster
                        .metrics
                        .stream_errors(Segment::FromAgent, code, None)
                        .inc();
                }
                self.unhold(id);
                self.gone(id);
            }
            GrpcEvent::ResponseHeaders { .. } | GrpcEvent::GoAway { .. } => {}
        }
    }

    fn after_dispatch(&mut self, grpc: &mut Grpc) {
        for (stream, outcome) in self.verdicts.take() {
            if let Some((_, call)) = self.held.remove(&stream) {
                self.decide(grpc, stream, call, outcome);
            }
        }
        self.outbox.flush(grpc);
        let s = &self.worker.settings;
        for (&stream, bid) in &self.streams {
            let queued = grpc.queued_bytes(stream);
            if let Some(b) = self.cluster.backends.borrow().get(bid) {
                b.queued.set(queued);
            }
            if queued >= s.tunnel_high_water {
                grpc.notify_when_drained(stream, s.tunnel_low_water);
            }
        }
    }

    fn on_close(&mut self, _grpc: &mut Grpc, error: Option<&konn_core::Error>) {
        if let Some(e) = error {
            tracing::debug!(error = %e, "agent connection ended");
        }
        let held: Vec<u32> = self.held.keys().copied().collect();
        for id in held {
            self.unhold(id);
        }
        let ids: Vec<u32> = self.streams.keys().copied().collect();
        for id in ids {
            self.gone(id);
        }
        self.outbox.close();
    }
}

/// A message re-framed with its 5-byte prefix (only for messages that were
/// reassembled from several HTTP/2 frames).
pub fn reframe(msg: &Bytes) -> Bytes {
    let mut b = bytes::BytesMut::with_capacity(msg.len() + 5);
    konn_frames::grpc::encode_prefix(u32::try_from(msg.len()).unwrap_or(u32::MAX), &mut b);
    b.extend_from_slice(msg);
    b.freeze()
}

/// grpc-go's status message for a path the server does not serve;
/// `registered` is the one service of that port.
pub fn unknown_method(path: &[u8], registered: &str) -> String {
    let path = String::from_utf8_lossy(path);
    let trimmed = path.trim_start_matches('/');
    match trimmed.split_once('/') {
        Some((service, method)) if service == registered => {
            format!("unknown method {method} for service {service}")
        }
        Some((service, _)) => format!("unknown service {service}"),
        None => format!("malformed method name: {path:?}"),
    }
}

/// Go's `%v` of a `[]string`: `[a b]`.
fn go_slice(v: &[&Bytes]) -> String {
    let parts: Vec<String> = v
        .iter()
        .map(|b| String::from_utf8_lossy(b).into_owned())
        .collect();
    format!("[{}]", parts.join(" "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_go_texts() {
        assert_eq!(
            unknown_method(b"/ProxyService/Proxy2", "ProxyService"),
            "unknown method Proxy2 for service ProxyService"
        );
        assert_eq!(
            unknown_method(b"/ProxyService/Proxy", "AgentService"),
            "unknown service ProxyService"
        );
        assert_eq!(
            unknown_method(b"/foo.Bar/Baz", "AgentService"),
            "unknown service foo.Bar"
        );
        let a = Bytes::from_static(b"a");
        let b = Bytes::from_static(b"b");
        assert_eq!(go_slice(&[]), "[]");
        assert_eq!(go_slice(&[&a, &b]), "[a b]");
        let framed = reframe(&Bytes::from_static(b"xyz"));
        assert_eq!(&framed[..], &[0, 0, 0, 0, 3, b'x', b'y', b'z']);
    }
}
