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
//! and only then do PAUSE/RESUME travel on its tunnel. A Go agent never
//! sends the metadata and never sees the header. The reverse direction's
//! `konn-reverse: 1` (KEP-2025) is negotiated the same way.
//!
//! Resumable tunnels (docs/design/resume.md, `crate::resume`): an agent
//! offering `konn-resume: v1` gets `konn-resume: v1` and a fresh
//! `konn-resume-token` when `--resume-window` is not zero. When such a
//! tunnel's connection is lost its backend is parked instead of removed.
//! A Connect call presenting a token of this server (`konn-resume-token:
//! <hex>:<serverid>`) is moved first to the worker that issued the token
//! (the connection migrates as frontends do, before authentication), and
//! once authenticated claims the parked backend: the response says
//! `konn-resumed: 1` and the new stream is bound to the parked backend's
//! id.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;

use bytes::Bytes;
use konn_core::io::driver::{Handler, WeakConnHandle};
use konn_frames::GrpcStatus;
use konn_frames::packet::{Packet, PacketType};
use konn_protocol::grpc::{Grpc, GrpcEvent};
use konn_protocol::h2::Headers;
use konn_protocol::maps::IdMap;
use konn_protocol::resume;
use konn_protocol::resume::ResumeToken;

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
    /// The token the agent presented for a tunnel parked on this server.
    claim: Option<ResumeToken>,
    /// The user its token was reviewed as (token authentication).
    user: Option<String>,
}

/// An agent connection leaving for the worker that parked the tunnel its
/// token names (see the module docs).
pub struct AgentPlan {
    /// That worker.
    pub target: usize,
    /// Events to replay there, in order (the Connect call first).
    pub stashed: Vec<GrpcEvent>,
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
    /// Connect streams that negotiated resume: what parking them needs.
    resumable: HashMap<u32, crate::resume::Resumable>,
    /// This connection (its TLS state tells the agent's certificate).
    me: WeakConnHandle<Grpc, Self>,
    /// The driver's detach flag, and the plan of a move.
    detach: Rc<Cell<bool>>,
    plan: Rc<RefCell<Option<AgentPlan>>>,
    /// A connection that moved once does not move again.
    may_move: bool,
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
            resumable: HashMap::new(),
            me: WeakConnHandle::default(),
            detach: Rc::new(Cell::new(false)),
            plan: Rc::new(RefCell::new(None)),
            may_move: true,
        }
    }

    /// This connection's handle (for its TLS state), its driver's detach
    /// flag and where a move's plan goes; `may_move`: false for a
    /// connection that moved here already.
    pub fn set_driver(
        &mut self,
        me: WeakConnHandle<Grpc, Self>,
        detach: Rc<Cell<bool>>,
        plan: Rc<RefCell<Option<AgentPlan>>>,
        may_move: bool,
    ) {
        self.me = me;
        self.detach = detach;
        self.plan = plan;
        self.may_move = may_move;
    }

    /// The token of a parked tunnel of this server among those presented,
    /// if the agent offers resume and this server answers it.
    fn presented(&self, metadata: &Headers) -> Option<ResumeToken> {
        if self.worker.settings.resume_window.is_zero() {
            return None;
        }
        let id = &self.worker.settings.server_id;
        metadata
            .get_all(resume::RESUME_TOKEN_METADATA.as_bytes())
            .find_map(|v| ResumeToken::parse_presented(v, id))
    }

    /// Whether a Connect call must first move to the worker that parked
    /// the tunnel its token names; if so, the plan is made and the driver
    /// asked to stop.
    fn should_move(&mut self, path: &[u8], metadata: &Headers) -> bool {
        if !self.may_move
            || !self.streams.is_empty()
            || !self.held.is_empty()
            || path != b"/AgentService/Connect"
        {
            return false;
        }
        let Some(token) = self.presented(metadata) else {
            return false;
        };
        let target = crate::resume::token_core(&token);
        if target == self.worker.index || target >= self.worker.workers {
            return false;
        }
        tracing::debug!(
            worker = target,
            "agent reconnect for a parked tunnel; moving it to the worker that parked it"
        );
        *self.plan.borrow_mut() = Some(AgentPlan {
            target,
            stashed: Vec::new(),
        });
        self.detach.set(true);
        true
    }

    /// The agent's client certificate's common name, when mTLS gave one.
    fn peer_cn(&self) -> Option<String> {
        let handle = self.me.upgrade()?;
        handle.with_tls(|t| {
            t?.peer_certificates()
                .and_then(|certs| certs.first())
                .and_then(|der| crate::accounting::subject_cn(der))
        })
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
        let resume = !self.worker.settings.resume_window.is_zero()
            && metadata
                .get(resume::RESUME_METADATA.as_bytes())
                .is_some_and(|v| v == resume::RESUME_VERSION);
        let claim = if resume {
            self.presented(metadata)
        } else {
            None
        };
        let call = Registration {
            agent_id,
            identifiers,
            flow_control,
            reverse,
            resume,
            claim,
            user: None,
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
    fn decide(&mut self, grpc: &mut Grpc, id: u32, mut call: Registration, outcome: Outcome) {
        let result = AuthResult::of(&outcome.verdict);
        match outcome.verdict {
            Verdict::Allowed { username } => {
                self.count_auth(result, Some(outcome.source));
                tracing::debug!(agent_id = %call.agent_id, %username, "Agent successfully authenticated via token");
                call.user = Some(username);
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

    /// Answer the call with the response headers and register the backend
    /// (or bind the stream to the parked backend its token claims).
    fn register(&mut self, grpc: &mut Grpc, id: u32, call: Registration) {
        let Registration {
            agent_id,
            identifiers,
            flow_control,
            reverse,
            resume,
            claim,
            user,
        } = call;
        let (w, c) = (self.worker.clone(), self.cluster.clone());
        let s = &w.settings;
        let now = konn_core::io::clock::now();
        let identity = crate::resume::identity(self.peer_cn().as_deref(), user.as_deref());
        let resumed = claim
            .as_ref()
            .and_then(|t| crate::resume::claim(&w, &c, t, &agent_id, &identity, now));
        // A tunnel without a token cannot be resumed: it does without.
        let token = resume.then(|| crate::resume::new_token(w.index)).flatten();
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
        if token.is_some() || resumed.is_some() {
            md.push(
                Bytes::from_static(resume::RESUME_METADATA.as_bytes()),
                Bytes::from_static(resume::RESUME_VERSION.as_bytes()),
            );
        }
        if let Some(t) = &token {
            md.push_sensitive(
                Bytes::from_static(resume::RESUME_TOKEN_METADATA.as_bytes()),
                Bytes::from(t.to_hex()),
            );
        }
        if resumed.is_some() {
            md.push(
                Bytes::from_static(resume::RESUMED_METADATA.as_bytes()),
                Bytes::from_static(b"1"),
            );
        }
        if grpc.accept(id, &md).is_err() {
            if let Some(bid) = resumed {
                // The stream went meanwhile: the claimed backend ends.
                let info = crate::resume::ParkedInfo {
                    agent_id: agent_id.clone(),
                    connections: 0,
                    held: 0,
                };
                crate::resume::end(
                    &w,
                    &c,
                    bid,
                    &info,
                    konn_core::metrics::common::ResumeResult::Refused,
                );
            }
            return;
        }
        let bid = resumed.unwrap_or_else(|| w.next_id());
        match resumed {
            Some(bid) => {
                tracing::info!(agent_id = %agent_id, backend = bid, cluster = c.name(), "agent tunnel resumed");
                // The parked backend's ref keeps the credit it holds back.
                let mut backends = c.backends.borrow_mut();
                match backends.get_mut(&bid) {
                    Some(b) => {
                        b.outbox = self.outbox.clone();
                        b.stream = id;
                        b.queued.set(0);
                    }
                    None => {
                        backends.insert(bid, self.backend_ref(id));
                    }
                }
                drop(backends);
                let mut router = c.router.borrow_mut();
                router.set_flow_control(bid, flow_control);
                router.set_reverse(bid, reverse);
                router.backend_resumed(bid);
            }
            None => {
                tracing::info!(agent_id = %agent_id, backend = bid, flow_control, resume = token.is_some(), cluster = c.name(), "agent connected");
                let mut router = c.router.borrow_mut();
                router.backend_connected(bid, agent_id.clone(), identifiers, w.index);
                router.set_flow_control(bid, flow_control);
                router.set_reverse(bid, reverse);
                if token.is_some() {
                    router.set_resume(bid, Some(crate::resume::limits(&w)));
                }
                drop(router);
                c.backends.borrow_mut().insert(bid, self.backend_ref(id));
            }
        }
        if let Some(token) = token {
            self.resumable.insert(
                id,
                crate::resume::Resumable {
                    token,
                    agent_id,
                    identity,
                },
            );
        }
        self.streams.insert(id, bid);
        bump(&w.shared.connect_streams, true);
        bump(&w.shared.backends, true);
        c.metrics.grpc_connections(ServiceMethod::Connect).inc();
        // The announcement and replay of a resumed tunnel go out now.
        c.apply(&w);
        c.backend_drained(&w, bid);
        self.publish_backends();
        let entry = c.router.borrow().directory().get(bid).cloned();
        if let Some(e) = entry {
            let load = c
                .loads
                .borrow_mut()
                .entry(bid)
                .or_insert_with(|| std::sync::Arc::new(crate::worker::BackendLoad::default()))
                .clone();
            c.announce(&w, || ClusterMsg::BackendUp(e.clone(), load.clone()));
        }
    }

    /// How the cluster reaches this connection's stream `id`.
    fn backend_ref(&self, id: u32) -> BackendRef {
        BackendRef {
            outbox: self.outbox.clone(),
            stream: id,
            queued: Cell::new(0),
            waiting: RefCell::new(Vec::new()),
            drained: Rc::new(konn_core::io::notify::Broadcast::new()),
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

    /// Stream `id` ended; `lost`: because its connection was lost (a
    /// tunnel that negotiated resume is then parked, not removed).
    fn gone(&mut self, id: u32, lost: bool) {
        let Some(bid) = self.streams.remove(&id) else {
            return;
        };
        let resumable = self.resumable.remove(&id);
        let (w, c) = (&*self.worker, &*self.cluster);
        if lost
            && !c.removed.get()
            && let Some(r) = &resumable
            && crate::resume::park(w, c, bid, r, konn_core::io::clock::now())
        {
            bump(&w.shared.connect_streams, false);
            bump(&w.shared.backends, false);
            c.metrics.grpc_connections(ServiceMethod::Connect).dec();
            self.publish_backends();
            c.publish(w);
            // Elsewhere it is gone: no new dials, no relayed flows.
            c.announce(w, || ClusterMsg::BackendDown(bid));
            return;
        }
        tracing::info!(
            backend = bid,
            cluster = self.cluster.name(),
            "agent disconnected"
        );
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
        if let Some(plan) = self.plan.borrow_mut().as_mut() {
            plan.stashed.push(event);
            return;
        }
        match event {
            GrpcEvent::Call {
                id,
                path,
                metadata,
                timeout,
            } => {
                if self.should_move(&path, &metadata) {
                    if let Some(plan) = self.plan.borrow_mut().as_mut() {
                        plan.stashed.push(GrpcEvent::Call {
                            id,
                            path,
                            metadata,
                            timeout,
                        });
                    }
                    return;
                }
                self.on_call(grpc, id, &path, &metadata)
            }
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
                            let now = konn_core::io::clock::now();
                            let mut router = c.router.borrow_mut();
                            credit = router.backend_packet(now, bid, p, framed, flow);
                            // An ACK now owed by time: the timer wakes for it.
                            let ack_timer = router.take_resume_timer();
                            drop(router);
                            if ack_timer {
                                w.poke_timer(now + crate::resume::limits(w).ack_delay);
                            }
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
                self.gone(id, false);
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
                // Lost with its connection (not ended by the agent).
                let lost = grpc.conn().error().is_some();
                self.gone(id, lost);
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
            self.gone(id, error.is_some());
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
