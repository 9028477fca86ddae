//! One cluster's state on one worker: its [`Router`] (backend directory
//! inside), how to reach each of its frontends and backends on this core,
//! the loads it publishes, its metric slab, and the hand-off of packets
//! between its connections.
//!
//! Every connection belongs to exactly one cluster, chosen when it is
//! admitted (the frontend listener it came in on, the SNI of an agent), and
//! its handler holds that cluster's `Rc<Cluster>`: a packet is routed
//! through its own cluster's router without any lookup, so a frontend can
//! never reach another cluster's agents (docs/MULTI-CLUSTER.md). Without
//! `--clusters-config` there is one cluster, upstream's single server.
//!
//! Connections never call into each other directly: a packet for a gRPC
//! connection goes into that connection's [`Outbox`] and the connection is
//! *poked*. If it is idle the poke flushes the outbox at once; if it is
//! busy further up the call stack (e.g. the agent connection that produced
//! the packet is itself being answered), its own dispatch loop flushes the
//! outbox when it gets there. So no connection's state is ever borrowed
//! twice, and nothing on this path allocates.
//!
//! Flow control between a frontend and its backend (docs/design/tunnel.md):
//! a frontend's HTTP/2 credit is returned only while the agent has not
//! paused that frontend (PAUSE; the router holds the credit until RESUME)
//! and its backend's tunnel is not congested (the credit waits in the
//! backend's list and is returned when the tunnel drains). The other way,
//! the router decides when the tunnel's credit for a frontend's data goes
//! back ([`Action::ReleaseBackend`]).
//!
//! Flows across cores (docs/design/cross-core.md) stay within a cluster:
//! the router's [`Action::Relay`]s travel to the same cluster on the other
//! worker as [`ClusterMsg::Relay`] through the worker's `Outbound` (ordered,
//! never dropped), and a relayed frontend's credit makes the round trip
//! through the tunnel's worker ([`ClusterMsg::FrontendCredit`] →
//! [`ClusterMsg::ReleaseFrontend`]), which holds it while its tunnel is
//! congested — the same rule as for a local frontend.

use std::cell::{Cell, RefCell};
use std::rc::{Rc, Weak};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use konn_core::io::notify::Broadcast;
use konn_core::log::GoDuration;
use konn_frames::GrpcStatus;
use konn_frames::packet::{Packet, PacketType};
use konn_protocol::grpc::Grpc;
use konn_protocol::maps::{IdMap, IdSet};
use konn_protocol::server::backends::{BackendId, Directory, Entry};
use konn_protocol::server::router::{
    Action, DialFailure, FrontendId, Payload, Relay, Router, RouterConfig,
};

use crate::auth::Auth;
use crate::clusters::config::ClusterSettings;
use crate::connect::ConnectFrontend;
use crate::metrics::{DialFailureReason, Segment, ServerCoreMetrics, ServerMetrics};
use crate::worker::{
    BackendLoad, BackendRef, FrontendRef, Msg, Out, Outbox, Waiting, Worker, decoded, encode,
};

/// A cluster's identity within the process: unique, never reused (a
/// cluster changed by a reload is a new one).
pub type ClusterId = u64;

/// Messages between the workers' states of one cluster.
pub enum ClusterMsg {
    /// A backend connected on another worker (with its load, shared by
    /// every worker's replica).
    BackendUp(Entry, Arc<BackendLoad>),
    /// A backend went away on another worker.
    BackendDown(BackendId),
    /// A backend announced DRAIN on another worker.
    BackendDraining(BackendId),
    /// A relayed flow's packet or credit from worker `from`'s router (see
    /// [`Relay`]).
    Relay {
        /// The sending worker.
        from: usize,
        /// What its router sent.
        relay: Relay,
    },
    /// Credit of a frontend of worker `from` that sent through `backend`, a
    /// tunnel of this worker: answer with [`ClusterMsg::ReleaseFrontend`]
    /// once the tunnel is not congested.
    FrontendCredit {
        /// The frontend's worker.
        from: usize,
        /// The tunnel.
        backend: BackendId,
        /// The frontend.
        frontend: FrontendId,
        /// Bytes: HTTP/2 credit of a gRPC frontend, bytes sent by a CONNECT
        /// one.
        credit: usize,
    },
    /// The answer to [`ClusterMsg::FrontendCredit`]: the frontend may send
    /// this much more.
    ReleaseFrontend {
        /// The frontend (of this worker).
        frontend: FrontendId,
        /// Bytes of credit.
        credit: usize,
    },
    /// The verdict of an agent's token review (from the control-plane
    /// thread; see `crate::auth`).
    AuthVerdict {
        /// The hold it answers.
        id: u64,
        /// The verdict.
        outcome: konn_core::kube::review::Outcome,
    },
}

/// One cluster on one worker (see the module docs).
pub struct Cluster {
    /// Its process-wide id.
    pub id: ClusterId,
    /// What the configuration says of it.
    pub settings: Arc<ClusterSettings>,
    /// The protocol state machine (this cluster's backends only).
    pub router: RefCell<Router>,
    /// This core's frontends of the cluster.
    pub frontends: RefCell<IdMap<FrontendId, FrontendRef>>,
    /// This core's backends of the cluster.
    pub backends: RefCell<IdMap<BackendId, BackendRef>>,
    /// Every backend's load (all workers'; see [`BackendLoad`]).
    pub loads: RefCell<IdMap<BackendId, Arc<BackendLoad>>>,
    /// This core's slab of the cluster's metrics.
    pub metrics: ServerCoreMetrics,
    /// The cluster's metrics (process-wide handles).
    pub all_metrics: ServerMetrics,
    /// Agent token review, when the cluster uses it.
    pub auth: Option<Auth>,
    /// This core's connections of the cluster (ids in
    /// `Worker::connections`), closed when the cluster is removed.
    pub connections: RefCell<IdSet<u64>>,
    /// Set, and `stopping` notified, when the cluster is removed: its
    /// listeners stop accepting.
    pub removed: Cell<bool>,
    /// See `removed`.
    pub stopping: Broadcast,
    /// This core's parked backends of the cluster (`konn-resume`,
    /// `crate::resume`).
    pub parked: RefCell<crate::resume::Parked>,
    /// This core's (pending dials, established connections) as last added
    /// to the process-wide counters in `Shared`.
    published: Cell<(usize, usize)>,
    me: std::cell::OnceCell<Weak<Self>>,
}

impl Cluster {
    /// A cluster's state on worker `core`, with an empty router.
    pub fn new(
        id: ClusterId,
        core: usize,
        settings: Arc<ClusterSettings>,
        metrics: ServerCoreMetrics,
        all_metrics: ServerMetrics,
        auth: Option<Auth>,
    ) -> Rc<Self> {
        let router = Router::new(
            RouterConfig {
                core,
                ..settings.router.clone()
            },
            Directory::new(settings.strategies.clone()),
        );
        let cluster = Rc::new(Self {
            id,
            settings,
            router: RefCell::new(router),
            frontends: RefCell::new(IdMap::default()),
            backends: RefCell::new(IdMap::default()),
            loads: RefCell::new(IdMap::default()),
            metrics,
            all_metrics,
            auth,
            connections: RefCell::new(IdSet::default()),
            removed: Cell::new(false),
            stopping: Broadcast::new(),
            parked: RefCell::new(crate::resume::Parked::default()),
            published: Cell::new((0, 0)),
            me: std::cell::OnceCell::new(),
        });
        let _ = cluster.me.set(Rc::downgrade(&cluster));
        cluster
    }

    /// The cluster's name (empty for the one cluster without
    /// `--clusters-config`).
    pub fn name(&self) -> &str {
        &self.settings.name
    }

    /// This cluster itself, for tasks its actions start.
    pub fn upgrade(&self) -> Option<Rc<Self>> {
        self.me.get().and_then(Weak::upgrade)
    }

    /// Send `msg` to this cluster on worker `to` (dropped only when that
    /// worker stopped: its connections end with it).
    pub fn send(&self, w: &Worker, to: usize, msg: ClusterMsg) {
        let msg = Msg::Cluster {
            cluster: self.id,
            msg,
        };
        if w.out.send(to, msg).is_err() {
            tracing::debug!(worker = to, "message to a stopped worker dropped");
        }
    }

    /// Remember connection `id` of this cluster (`Worker::track`) so the
    /// cluster's removal can stop it.
    pub fn track(&self, w: &Worker, id: u64, stop: crate::worker::StopFn) {
        self.connections.borrow_mut().insert(id);
        w.track(id, stop);
        if self.removed.get() {
            let conns = w.connections.borrow();
            if let Some(f) = conns.get(&id) {
                f(crate::worker::Stop::Now);
            }
        }
    }

    /// Connection `id` ended.
    pub fn untrack(&self, w: &Worker, id: u64) {
        self.connections.borrow_mut().remove(&id);
        w.connections.borrow_mut().remove(&id);
    }

    /// Tell this cluster on every other worker.
    pub fn announce(&self, w: &Worker, msg: impl Fn() -> ClusterMsg) {
        for to in (0..w.workers).filter(|&to| to != w.index) {
            self.send(w, to, msg());
        }
    }

    /// Whether a backend's tunnel is congested.
    pub fn congested(&self, w: &Worker, backend: BackendId) -> bool {
        self.backends
            .borrow()
            .get(&backend)
            .is_some_and(|b| b.queued.get() >= w.settings.tunnel_high_water)
    }

    /// Return a gRPC frontend's credit now, or when the agent resumes it,
    /// or when its backend drains.
    pub fn credit(
        &self,
        w: &Worker,
        fid: FrontendId,
        outbox: &Rc<Outbox>,
        stream: u32,
        flow: usize,
        grpc: &mut Grpc,
    ) {
        let (flow, backend) = {
            let mut router = self.router.borrow_mut();
            (
                router.frontend_credit(fid, flow),
                router.frontend_backend(fid),
            )
        };
        if flow > 0 && !self.hold_if_congested(w, fid, backend, outbox, stream, flow) {
            grpc.release(stream, flow);
        }
    }

    /// Keep a frontend's credit while its tunnel is congested: in the
    /// backend's list for a tunnel of this worker, or by sending it to the
    /// tunnel's worker, which answers when it may go back. Returns whether
    /// it was kept.
    fn hold_if_congested(
        &self,
        w: &Worker,
        fid: FrontendId,
        backend: Option<BackendId>,
        outbox: &Rc<Outbox>,
        stream: u32,
        flow: usize,
    ) -> bool {
        let Some(b) = backend else {
            return false;
        };
        if let Some(be) = self.backends.borrow().get(&b) {
            if be.queued.get() < w.settings.tunnel_high_water {
                return false;
            }
            be.waiting
                .borrow_mut()
                .push(Waiting::Local(outbox.clone(), stream, flow));
            return true;
        }
        self.credit_via_tunnel(w, fid, b, flow)
    }

    /// A relayed frontend's credit goes to its tunnel's worker
    /// ([`Msg::FrontendCredit`]); false when `backend` is not relayed.
    pub fn credit_via_tunnel(
        &self,
        w: &Worker,
        fid: FrontendId,
        backend: BackendId,
        credit: usize,
    ) -> bool {
        let Some(core) = self.router.borrow().remote_core(backend) else {
            return false;
        };
        let msg = ClusterMsg::FrontendCredit {
            from: w.index,
            backend,
            frontend: fid,
            credit,
        };
        // A stopped worker takes the tunnel with it; the flow ends anyway.
        self.send(w, core, msg);
        true
    }

    /// A backend's tunnel drained: give back held credit, wake readers.
    pub fn backend_drained(&self, w: &Worker, backend: BackendId) {
        let waiting = {
            let backends = self.backends.borrow();
            let Some(b) = backends.get(&backend) else {
                return;
            };
            b.drained.notify_all();
            std::mem::take(&mut *b.waiting.borrow_mut())
        };
        for held in waiting {
            match held {
                Waiting::Local(outbox, stream, flow) => outbox.push(Out::Release(stream, flow)),
                Waiting::Remote {
                    core,
                    frontend,
                    credit,
                } => self.send(w, core, ClusterMsg::ReleaseFrontend { frontend, credit }),
            }
        }
    }

    /// Handle a message from another worker (everything but the messages
    /// `crate::serve` handles itself: frontends moving, shutdown).
    pub fn on_message(&self, w: &Worker, msg: ClusterMsg) {
        match msg {
            ClusterMsg::BackendUp(e, load) => {
                self.loads.borrow_mut().insert(e.id, load);
                self.router.borrow_mut().directory_mut().add(e);
                self.publish_backends();
            }
            ClusterMsg::BackendDown(id) => {
                self.loads.borrow_mut().remove(&id);
                // Flows of this worker's frontends through it end too.
                self.router.borrow_mut().backend_gone(id);
                self.apply(w);
                self.publish(w);
                self.publish_backends();
            }
            ClusterMsg::BackendDraining(id) => {
                self.router.borrow_mut().directory_mut().set_draining(id)
            }
            ClusterMsg::Relay { from, relay } => self.on_relay(w, from, relay),
            ClusterMsg::AuthVerdict { id, outcome } => {
                if let Some(auth) = &self.auth {
                    auth.resolve(id, outcome);
                }
            }
            ClusterMsg::FrontendCredit {
                from,
                backend,
                frontend,
                credit,
            } => {
                let held = self.backends.borrow().get(&backend).is_some_and(|b| {
                    let congested = b.queued.get() >= w.settings.tunnel_high_water;
                    if congested {
                        b.waiting.borrow_mut().push(Waiting::Remote {
                            core: from,
                            frontend,
                            credit,
                        });
                    }
                    congested
                });
                if !held {
                    self.send(w, from, ClusterMsg::ReleaseFrontend { frontend, credit });
                }
            }
            ClusterMsg::ReleaseFrontend { frontend, credit } => {
                let f = self.frontends.borrow();
                match f.get(&frontend) {
                    Some(FrontendRef::Grpc { outbox, stream }) => {
                        outbox.push(Out::Release(*stream, credit))
                    }
                    Some(FrontendRef::Connect(cf)) => cf.credit_back(credit),
                    None => {}
                }
            }
        }
    }

    fn on_relay(&self, w: &Worker, from: usize, relay: Relay) {
        let now = konn_core::io::clock::now();
        match relay {
            Relay::ToBackend { backend, payload } => {
                let Some((packet, framed)) = decoded(payload) else {
                    return;
                };
                w.forwarding.set(packet.ty());
                self.router
                    .borrow_mut()
                    .relayed_packet(from, backend, packet, framed);
                self.apply(w);
            }
            Relay::Release { backend, credit } => {
                let target = self
                    .backends
                    .borrow()
                    .get(&backend)
                    .map(|b| (b.outbox.clone(), b.stream));
                if let Some((outbox, stream)) = target {
                    outbox.push(Out::Release(stream, credit));
                }
            }
            Relay::FromBackend {
                backend,
                payload,
                credit,
            } => {
                let Some((packet, framed)) = decoded(payload) else {
                    return;
                };
                let ty = packet.ty();
                w.forwarding.set(ty);
                // A relayed backend's credit goes back as a Relay action.
                let _ = self
                    .router
                    .borrow_mut()
                    .backend_packet(now, backend, packet, framed, credit);
                self.apply(w);
                if ty != PacketType::Data {
                    self.publish(w);
                }
            }
        }
    }

    /// Perform every action the router has queued.
    pub fn apply(&self, w: &Worker) {
        loop {
            let action = self.router.borrow_mut().poll_action();
            let Some(action) = action else { return };
            match action {
                Action::ToBackend { backend, payload } => {
                    let ty = Self::payload_type(w, &payload);
                    self.metrics.stream_packets(Segment::ToAgent, ty).inc();
                    match &payload {
                        Payload::Packet(Packet::Pause { connect_id }) => tracing::debug!(
                            backend,
                            connection_id = *connect_id,
                            "frontend queue above its high-water mark; sending PAUSE"
                        ),
                        Payload::Packet(Packet::Resume { connect_id }) => tracing::debug!(
                            backend,
                            connection_id = *connect_id,
                            "frontend queue drained; sending RESUME"
                        ),
                        _ => {}
                    }
                    let bytes = encode(payload);
                    let target = self.backends.borrow().get(&backend).map(|b| {
                        b.queued.set(b.queued.get() + bytes.len());
                        (b.outbox.clone(), b.stream)
                    });
                    if let Some((outbox, stream)) = target {
                        outbox.push(Out::Send(stream, bytes));
                    }
                }
                Action::ToFrontend { frontend, payload } => {
                    let target = match self.frontends.borrow().get(&frontend) {
                        Some(FrontendRef::Grpc { outbox, stream }) => {
                            Some((outbox.clone(), *stream))
                        }
                        _ => None,
                    };
                    if let Some((outbox, stream)) = target {
                        let ty = Self::payload_type(w, &payload);
                        self.metrics.stream_packets(Segment::ToClient, ty).inc();
                        // upstream's frontend_write_duration: the time the
                        // hand-off to the frontend's stream takes (konn's
                        // never blocks; a stream over its window queues).
                        let start = konn_core::io::clock::now();
                        outbox.push(Out::Send(stream, encode(payload)));
                        self.metrics.frontend_write_duration().observe_duration(
                            konn_core::io::clock::now().saturating_duration_since(start),
                        );
                    }
                }
                Action::ConnectEstablished {
                    frontend,
                    backend,
                    connect_id,
                } => {
                    if let Some(cf) = self.connect_frontend(frontend) {
                        cf.established(backend, connect_id);
                    }
                }
                Action::ConnectData { frontend, data } => {
                    if let Some(cf) = self.connect_frontend(frontend) {
                        let start = konn_core::io::clock::now();
                        cf.push(data);
                        self.metrics.frontend_write_duration().observe_duration(
                            konn_core::io::clock::now().saturating_duration_since(start),
                        );
                    }
                }
                Action::ConnectFailed { frontend, response } => {
                    tracing::debug!(frontend, "CONNECT dial failed; answering with the error");
                    if let Some(cf) = self.connect_frontend(frontend) {
                        cf.fail(response);
                    }
                    self.frontends.borrow_mut().remove(&frontend);
                }
                Action::CloseFrontend { frontend } => {
                    tracing::debug!(frontend, "frontend connection closed");
                    let f = self.frontends.borrow_mut().remove(&frontend);
                    match f {
                        Some(FrontendRef::Grpc { outbox, stream }) => {
                            outbox.push(Out::Finish(stream, GrpcStatus::OK, ""))
                        }
                        Some(FrontendRef::Connect(cf)) => cf.close(),
                        None => {}
                    }
                }
                Action::AbortFrontend { frontend } => {
                    tracing::debug!(frontend, "frontend aborted (stopped reading)");
                    let f = self.frontends.borrow_mut().remove(&frontend);
                    if let Some(FrontendRef::Connect(cf)) = f {
                        cf.abort();
                    }
                }
                Action::ReleaseBackend { backend, credit } => {
                    let target = self
                        .backends
                        .borrow()
                        .get(&backend)
                        .map(|b| (b.outbox.clone(), b.stream));
                    if let Some((outbox, stream)) = target {
                        outbox.push(Out::Release(stream, credit));
                    }
                }
                Action::PauseFrontend { frontend } => {
                    tracing::debug!(frontend, "PAUSE from the agent: frontend not read");
                    if let Some(cf) = self.connect_frontend(frontend) {
                        cf.set_paused(true);
                    }
                }
                Action::ResumeFrontend { frontend, credit } => {
                    tracing::debug!(frontend, "RESUME from the agent: frontend read again");
                    let target = match self.frontends.borrow().get(&frontend) {
                        Some(FrontendRef::Grpc { outbox, stream }) => {
                            Some((outbox.clone(), *stream))
                        }
                        Some(FrontendRef::Connect(cf)) => {
                            cf.set_paused(false);
                            None
                        }
                        None => None,
                    };
                    if let Some((outbox, stream)) = target
                        && credit > 0
                    {
                        let backend = self.router.borrow().frontend_backend(frontend);
                        if !self.hold_if_congested(w, frontend, backend, &outbox, stream, credit) {
                            outbox.push(Out::Release(stream, credit));
                        }
                    }
                }
                Action::Relay { core, relay } => {
                    let msg = ClusterMsg::Relay {
                        from: w.index,
                        relay,
                    };
                    self.send(w, core, msg);
                }
                Action::ReverseDial {
                    backend,
                    random,
                    target,
                } => {
                    if let (Some(me), Some(cluster)) = (w.upgrade(), self.upgrade()) {
                        w.spawn(crate::reverse::dial_and_serve(
                            me, cluster, backend, random, target,
                        ));
                    }
                }
                Action::ReverseRefused(why) => {
                    tracing::debug!(reason = why.label(), "reverse dial refused");
                    self.metrics.reverse_refusals(why).inc();
                    self.metrics
                        .reverse_dials(konn_core::metrics::common::ReverseResult::Refused)
                        .inc();
                }
                Action::ReverseDialed => {
                    self.metrics
                        .reverse_dials(konn_core::metrics::common::ReverseResult::Ok)
                        .inc();
                }
                Action::DialRefused {
                    frontend,
                    reason,
                    backend,
                    ..
                } => {
                    tracing::debug!(frontend, backend, reason = reason.as_str(), "dial refused");
                    self.all_metrics.dial_refusal(reason);
                }
                Action::DialFailed(why) => {
                    tracing::debug!(reason = ?failure_reason(why), "dial failed");
                    self.metrics.dial_failures(failure_reason(why)).inc();
                }
                Action::DialSucceeded {
                    frontend,
                    backend,
                    connect_id,
                    elapsed,
                } => {
                    tracing::debug!(
                        frontend,
                        backend,
                        connect_id,
                        elapsed = %GoDuration(elapsed),
                        "dial succeeded"
                    );
                    self.metrics.dial_duration().observe_duration(elapsed);
                }
                Action::ConnEnded(s) => crate::accounting::conn_ended(w, self, s),
            }
        }
    }

    fn payload_type(w: &Worker, p: &Payload) -> PacketType {
        match p {
            Payload::Packet(p) => p.ty(),
            Payload::Forward(_) => w.forwarding.get(),
        }
    }

    /// `ready_backends{proxy_strategy}` and the deprecated
    /// `ready_backend_connections` from this worker's directory (upstream:
    /// written by every storage, the last one wins). Every worker writes them
    /// after each change of its directory, its own agents' and the ones
    /// other workers announce, so once the announcements are delivered the
    /// last write is a complete count (a worker that wrote only on its own
    /// agents left the gauge short by the announcements it had not yet
    /// received: 4995 of 5000 tunnels in S9).
    pub fn publish_backends(&self) {
        let router = self.router.borrow();
        let dir = router.directory();
        for s in dir.strategies() {
            let n = dir.ready_backends(*s);
            self.all_metrics
                .set_ready_backends(crate::serve::metric_strategy(*s), n);
            self.all_metrics.set_ready_backend_connections(n);
        }
    }

    /// After a control event: publish the router's gauges and loads.
    pub fn publish(&self, w: &Worker) {
        let router = self.router.borrow();
        let stats = router.stats();
        self.metrics
            .pending_backend_dials()
            .set(stats.pending_dials as f64);
        self.metrics
            .established_connections()
            .set(stats.established as f64);
        let now = (stats.pending_dials, stats.established);
        let before = self.published.replace(now);
        if now != before {
            let delta = |a: usize, b: usize| a as i64 - b as i64;
            w.shared
                .pending_dials
                .fetch_add(delta(now.0, before.0), Ordering::Relaxed);
            w.shared
                .established
                .fetch_add(delta(now.1, before.1), Ordering::Relaxed);
        }
        let loads = self.loads.borrow();
        for (id, open, pending) in router.backend_loads() {
            if let Some(l) = loads.get(&id) {
                l.set(open, pending);
            }
        }
    }

    fn connect_frontend(&self, id: FrontendId) -> Option<Rc<ConnectFrontend>> {
        match self.frontends.borrow().get(&id) {
            Some(FrontendRef::Connect(cf)) => Some(cf.clone()),
            _ => None,
        }
    }
}

/// The metric label of a router dial failure.
fn failure_reason(f: DialFailure) -> DialFailureReason {
    match f {
        DialFailure::NoAgent => DialFailureReason::NoAgent,
        DialFailure::ErrorResponse => DialFailureReason::ErrorResponse,
        DialFailure::UnrecognizedResponse => DialFailureReason::UnrecognizedResponse,
        DialFailure::SendResponse => DialFailureReason::SendResponse,
        DialFailure::BackendClose => DialFailureReason::BackendClose,
        DialFailure::BackendDialTimeout => DialFailureReason::BackendDialTimeout,
        DialFailure::FrontendClose => DialFailureReason::FrontendClose,
    }
}

#[cfg(test)]
mod tests {
    use bytes::{Bytes, BytesMut};
    use konn_core::io::pool::BufPool;
    use konn_frames::packet::{ByteStr, Packet};

    use super::*;
    use crate::settings::{FrontendListen, Mode, ServerSettings};
    use crate::worker::Shared;
    use konn_protocol::server::backends::Identifiers;
    use konn_protocol::server::router::FrontendKind;

    fn framed(p: &Packet) -> Bytes {
        let mut b = BytesMut::new();
        p.encode_grpc(&mut b);
        b.freeze()
    }

    fn worker(
        index: usize,
        shared: &Arc<Shared>,
        metrics: &ServerMetrics,
    ) -> (Worker, Rc<Cluster>) {
        let settings =
            ServerSettings::for_tests(FrontendListen::Unix("/nonexistent".into()), Mode::Grpc);
        let cluster = Arc::new(settings.implicit_cluster());
        let budget = konn_core::io::pool::MemoryBudget::new(1 << 20);
        let w = Worker::new(
            index,
            2,
            Arc::new(settings),
            BufPool::new(&budget, &konn_core::io::pool::PoolConfig::default()),
            shared.clone(),
            1,
            metrics.clone(),
            konn_core::io::xcore::Mesh::new(2, 16).sender(),
        );
        let c = Cluster::new(
            1,
            index,
            cluster,
            metrics.core(index).expect("slab"),
            metrics.clone(),
            None,
        );
        w.add_cluster(c.clone());
        (w, c)
    }

    /// Each worker adds its own change, so the process-wide counters are
    /// the sum over workers, and go back to zero.
    #[test]
    fn publish_keeps_the_process_wide_dial_and_connection_counts() {
        let shared = Arc::new(Shared::default());
        let metrics = ServerMetrics::new(2);
        let workers = [worker(0, &shared, &metrics), worker(1, &shared, &metrics)];
        let now = konn_core::io::clock::now();
        let counts = || {
            (
                shared.pending_dials.load(Ordering::Relaxed),
                shared.established.load(Ordering::Relaxed),
            )
        };
        for (i, (w, c)) in workers.iter().enumerate() {
            let mut r = c.router.borrow_mut();
            r.backend_connected(7, "agent".into(), Identifiers::default(), i);
            r.frontend_opened(1, FrontendKind::Grpc);
            let dial = Packet::DialReq {
                protocol: ByteStr::from_static("tcp"),
                address: ByteStr::from_static("10.0.0.1:80"),
                random: 5,
            };
            let f = framed(&dial);
            r.frontend_packet(now, 1, dial, f, 0);
            drop(r);
            c.publish(w);
        }
        assert_eq!(counts(), (2, 0));
        let rsp = Packet::DialRsp {
            error: ByteStr::new(),
            connect_id: 3,
            random: 5,
        };
        let f = framed(&rsp);
        let (w0, c0) = &workers[0];
        let _ = c0.router.borrow_mut().backend_packet(now, 7, rsp, f, 0);
        c0.publish(w0);
        assert_eq!(counts(), (1, 1));
        c0.publish(w0);
        assert_eq!(counts(), (1, 1), "publishing twice counts once");
        for (w, c) in &workers {
            c.router.borrow_mut().frontend_gone(1);
            c.publish(w);
        }
        assert_eq!(counts(), (0, 0));
    }

    /// A message for a cluster this worker does not know yet waits for it;
    /// one for a cluster it removed is dropped.
    #[test]
    fn early_messages_wait_for_their_cluster() {
        let shared = Arc::new(Shared::default());
        let metrics = ServerMetrics::new(2);
        let (w, _) = worker(0, &shared, &metrics);
        let entry = Entry {
            id: 9,
            agent_id: "late".into(),
            identifiers: Identifiers::default(),
            core: 1,
            draining: false,
            flow_control: false,
        };
        let up = || ClusterMsg::BackendUp(entry.clone(), Arc::new(BackendLoad::default()));
        w.cluster_message(5, up());
        assert_eq!(w.early.borrow().len(), 1);
        let settings =
            ServerSettings::for_tests(FrontendListen::Unix("/nonexistent".into()), Mode::Grpc);
        let late = Cluster::new(
            5,
            0,
            Arc::new(settings.implicit_cluster()),
            ServerMetrics::cluster(2).core(0).expect("slab"),
            ServerMetrics::cluster(2),
            None,
        );
        w.add_cluster(late.clone());
        assert!(w.early.borrow().is_empty());
        assert!(late.router.borrow().directory().get(9).is_some());
        w.remove_cluster(5);
        assert!(late.removed.get());
        w.cluster_message(5, up());
        w.cluster_message(3, up());
        assert!(
            w.early.borrow().is_empty(),
            "removed or older clusters' messages are dropped"
        );
    }
}
