//! One server worker's state: the [`Router`], how to reach each frontend
//! and backend of this core, and the hand-off of packets between
//! connections.
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
//! Flows across cores (docs/design/cross-core.md): the router's
//! [`Action::Relay`]s travel to the other worker as [`Msg::Relay`] through
//! the worker's [`Outbound`] (ordered, never dropped), and a relayed
//! frontend's credit makes the round trip through the tunnel's worker
//! ([`Msg::FrontendCredit`] → [`Msg::ReleaseFrontend`]), which holds it
//! while its tunnel is congested — the same rule as for a local frontend.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};

use bytes::{Bytes, BytesMut};
use konn_core::io::notify::{Broadcast, Notify};
use konn_core::io::outbound::Outbound;
use konn_core::io::pool::BufPool;
use konn_core::io::xcore::MeshSender;
use konn_frames::GrpcStatus;
use konn_protocol::grpc::Grpc;

use konn_frames::packet::{Packet, PacketType};

use crate::connect::ConnectFrontend;
use crate::metrics::{DialFailureReason, Segment, ServerCoreMetrics, ServerMetrics};
use crate::settings::ServerSettings;
use konn_protocol::server::backends::{BackendId, Entry};
use konn_protocol::server::router::{Action, DialFailure, FrontendId, Payload, Relay, Router};

/// Something queued for one gRPC connection.
#[derive(Debug)]
pub enum Out {
    /// Send a framed message on a stream.
    Send(u32, Bytes),
    /// Return flow-control credit on a stream.
    Release(u32, usize),
    /// End a call with a status.
    Finish(u32, GrpcStatus, &'static str),
}

/// Work queued for one gRPC connection by others (see the module docs).
#[derive(Default)]
pub struct Outbox {
    items: RefCell<VecDeque<Out>>,
    poke: RefCell<Option<Box<dyn Fn()>>>,
}

impl std::fmt::Debug for Outbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Outbox")
            .field("items", &self.items.borrow().len())
            .finish()
    }
}

impl Outbox {
    /// An empty outbox; `poke` flushes it when its connection is idle.
    pub fn new() -> Self {
        Self::default()
    }

    /// Install the poke (usually `|| { let _ = handle.with(|_, _| ()); }`
    /// through a weak handle, whose dispatch flushes the outbox).
    pub fn set_poke(&self, poke: Box<dyn Fn()>) {
        *self.poke.borrow_mut() = Some(poke);
    }

    /// Queue an item and poke the connection.
    pub fn push(&self, item: Out) {
        self.items.borrow_mut().push_back(item);
        self.poke();
    }

    /// Poke the connection: its handler runs (and flushes this outbox).
    pub fn poke(&self) {
        let poke = self.poke.borrow();
        if let Some(p) = poke.as_ref() {
            p();
        }
    }

    /// Apply everything queued to the connection's session.
    pub fn flush(&self, grpc: &mut Grpc) {
        loop {
            let next = self.items.borrow_mut().pop_front();
            let Some(item) = next else { return };
            match item {
                Out::Send(stream, b) => {
                    let _ = grpc.send_framed(stream, b);
                }
                Out::Release(stream, n) => grpc.release(stream, n),
                Out::Finish(stream, status, msg) => {
                    let _ = grpc.finish(stream, status, msg);
                }
            }
        }
    }

    /// Forget the poke (the connection is gone) and what is queued.
    pub fn close(&self) {
        self.poke.borrow_mut().take();
        self.items.borrow_mut().clear();
    }
}

/// How to reach a backend (an agent tunnel) of this core.
pub struct BackendRef {
    /// Its connection's outbox.
    pub outbox: Rc<Outbox>,
    /// The Connect stream.
    pub stream: u32,
    /// Bytes queued towards the agent (last seen): the tunnel is congested
    /// above the high-water mark.
    pub queued: Cell<usize>,
    /// Frontend credit held back while congested.
    pub waiting: RefCell<Vec<Waiting>>,
    /// Woken when the tunnel drains (CONNECT readers pause on it).
    pub drained: Rc<Broadcast>,
}

/// Frontend credit a congested tunnel holds back.
pub enum Waiting {
    /// A frontend stream of this core: (its outbox, stream, bytes).
    Local(Rc<Outbox>, u32, usize),
    /// A frontend of another core, whose flow is relayed through this
    /// tunnel: answered with [`Msg::ReleaseFrontend`].
    Remote {
        /// Its core.
        core: usize,
        /// The frontend.
        frontend: FrontendId,
        /// Bytes of credit.
        credit: usize,
    },
}

/// How to reach a frontend of this core.
pub enum FrontendRef {
    /// A `/ProxyService/Proxy` stream.
    Grpc {
        /// Its connection's outbox.
        outbox: Rc<Outbox>,
        /// The stream.
        stream: u32,
    },
    /// An HTTP CONNECT connection.
    Connect(Rc<ConnectFrontend>),
}

/// Process-wide facts every worker shares (connection-level updates only,
/// never per packet).
#[derive(Debug, Default)]
pub struct Shared {
    /// Backends connected, per strategy index (readiness and
    /// `ready_backends`): maintained by the owning workers.
    pub backends: AtomicUsize,
    /// gRPC frontend streams open (`grpc_connections{service_method="Proxy"}`).
    pub proxy_streams: AtomicUsize,
    /// Agent streams open (`grpc_connections{service_method="Connect"}`).
    pub connect_streams: AtomicUsize,
    /// HTTP CONNECT connections open.
    pub http_connections: AtomicUsize,
    /// Pending dials, all workers (each adds its change when it publishes
    /// its router's gauges, see [`Worker::publish`]).
    pub pending_dials: AtomicI64,
    /// Established connections, all workers (as `pending_dials`).
    pub established: AtomicI64,
    /// A graceful shutdown started: not ready, accept nothing new.
    pub shutting_down: std::sync::atomic::AtomicBool,
}

/// The number of a worker's live tasks (see [`Worker::spawn`]).
#[derive(Default)]
pub struct TaskCount {
    /// Tasks not yet ended.
    pub live: Cell<usize>,
    /// Notified whenever a task ends.
    pub ended: Notify,
}

/// Counts a task as ended when dropped (also when the task is cancelled).
struct TaskDone(Rc<TaskCount>);

impl Drop for TaskDone {
    fn drop(&mut self) {
        self.0.live.set(self.0.live.get() - 1);
        self.0.ended.notify();
    }
}

/// Asks one connection to stop.
pub type StopFn = Box<dyn Fn(Stop)>;

/// How a connection is asked to stop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// Graceful shutdown: GOAWAY, calls in progress may finish.
    Graceful,
    /// The worker is stopping: close now.
    Now,
}

/// A backend's load, written by the worker that owns it (on dials and
/// closes, never per packet) and read by any worker (`/debug/backends`).
#[derive(Debug, Default)]
pub struct BackendLoad {
    open: std::sync::atomic::AtomicU64,
    pending: std::sync::atomic::AtomicU64,
}

impl BackendLoad {
    /// (open connections, pending dials).
    pub fn get(&self) -> (u64, u64) {
        (
            self.open.load(Ordering::Relaxed),
            self.pending.load(Ordering::Relaxed),
        )
    }

    /// Publish new values.
    pub fn set(&self, open: usize, pending: usize) {
        self.open.store(open as u64, Ordering::Relaxed);
        self.pending.store(pending as u64, Ordering::Relaxed);
    }
}

/// Messages between server workers.
pub enum Msg {
    /// A backend connected on another worker (with its load, shared by
    /// every worker's replica).
    BackendUp(Entry, Arc<BackendLoad>),
    /// A backend went away on another worker.
    BackendDown(BackendId),
    /// A backend announced DRAIN on another worker.
    BackendDraining(BackendId),
    /// A frontend moving to this worker (see `crate::serve`).
    Adopt(Box<crate::serve::Migrant>),
    /// A relayed flow's packet or credit from worker `from`'s router (see
    /// [`Relay`]).
    Relay {
        /// The sending worker.
        from: usize,
        /// What its router sent.
        relay: Relay,
    },
    /// Credit of a frontend of worker `from` that sent through `backend`, a
    /// tunnel of this worker: answer with [`Msg::ReleaseFrontend`] once the
    /// tunnel is not congested.
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
    /// The answer to [`Msg::FrontendCredit`]: the frontend may send this
    /// much more.
    ReleaseFrontend {
        /// The frontend (of this worker).
        frontend: FrontendId,
        /// Bytes of credit.
        credit: usize,
    },
    /// Start a graceful shutdown: GOAWAY on every connection.
    Shutdown,
    /// The verdict of an agent's token review (from the control-plane
    /// thread; see `crate::auth`).
    AuthVerdict {
        /// The hold it answers.
        id: u64,
        /// The verdict.
        outcome: konn_core::kube::review::Outcome,
    },
}

/// One worker's state.
pub struct Worker {
    /// Worker index.
    pub index: usize,
    /// The protocol state machine.
    pub router: RefCell<Router>,
    /// This core's frontends.
    pub frontends: RefCell<HashMap<FrontendId, FrontendRef>>,
    /// This core's backends.
    pub backends: RefCell<HashMap<BackendId, BackendRef>>,
    /// Every backend's load (all workers'; see [`BackendLoad`]).
    pub loads: RefCell<HashMap<BackendId, Arc<BackendLoad>>>,
    next_id: Cell<u64>,
    rng: Cell<u64>,
    /// Settings.
    pub settings: Arc<ServerSettings>,
    /// This core's buffers.
    pub pool: BufPool,
    /// Process-wide counters.
    pub shared: Arc<Shared>,
    /// Live connections of this worker: how to stop each one (see
    /// [`Stop`]). Every connection task registers here and removes itself
    /// when it ends, so an empty map means no connection task is left.
    pub connections: RefCell<HashMap<u64, StopFn>>,
    /// Set, and `stopping` notified, when the worker stops: tasks not in
    /// `connections` yet (reading a CONNECT head) end too.
    pub stopped: Cell<bool>,
    /// See `stopped`.
    pub stopping: Broadcast,
    /// Tasks started with [`Worker::spawn`] that have not ended.
    pub tasks: Rc<TaskCount>,
    /// This core's metric slab.
    pub metrics: ServerCoreMetrics,
    /// The process-wide metrics (gauges set by whoever knows the value).
    pub all_metrics: ServerMetrics,
    /// Type of the packet being routed now (what `Payload::Forward`s are).
    pub forwarding: Cell<PacketType>,
    /// This core's (pending dials, established connections) as last added
    /// to the process-wide counters in [`Shared`].
    published: Cell<(usize, usize)>,
    /// The other workers, reliably and in order.
    pub out: Outbound<Msg>,
    /// This worker itself, for tasks its actions start (reverse dials).
    me: std::cell::OnceCell<std::rc::Weak<Self>>,
    /// Agent token authentication, when enabled (set once at start).
    pub auth: std::cell::OnceCell<crate::auth::Auth>,
}

impl Worker {
    /// A worker's state.
    #[allow(clippy::too_many_arguments)] // one-time construction of a worker
    pub fn new(
        index: usize,
        router: Router,
        settings: Arc<ServerSettings>,
        pool: BufPool,
        shared: Arc<Shared>,
        seed: u64,
        metrics: ServerCoreMetrics,
        all_metrics: ServerMetrics,
        mesh: MeshSender<Msg>,
    ) -> Self {
        Self {
            index,
            router: RefCell::new(router),
            frontends: RefCell::new(HashMap::new()),
            backends: RefCell::new(HashMap::new()),
            loads: RefCell::new(HashMap::new()),
            next_id: Cell::new(1),
            rng: Cell::new(seed | 1),
            settings,
            pool,
            shared,
            connections: RefCell::new(HashMap::new()),
            stopped: Cell::new(false),
            stopping: Broadcast::new(),
            tasks: Rc::new(TaskCount::default()),
            metrics,
            all_metrics,
            forwarding: Cell::new(PacketType::Data),
            published: Cell::new((0, 0)),
            out: Outbound::new(mesh),
            me: std::cell::OnceCell::new(),
            auth: std::cell::OnceCell::new(),
        }
    }

    /// Tell the worker where it lives (`Rc`), so its actions can start tasks
    /// that own it.
    pub fn set_self(self: &Rc<Self>) {
        let _ = self.me.set(Rc::downgrade(self));
    }

    /// Remember connection `id` and how to stop it (see `connections`). A
    /// connection that registers after the worker stopped is stopped at
    /// once, so a late accept cannot outlive the worker.
    pub fn track(&self, id: u64, stop: StopFn) {
        self.connections.borrow_mut().insert(id, stop);
        if self.stopped.get() {
            let conns = self.connections.borrow();
            if let Some(f) = conns.get(&id) {
                f(Stop::Now);
            }
        }
    }

    /// Start a task this worker waits for when it stops: a task still
    /// pending when its runtime is dropped is never freed (its waker keeps
    /// it alive), and neither are its sockets or the ring they use.
    pub fn spawn<F: Future + 'static>(&self, fut: F) {
        let count = self.tasks.clone();
        count.live.set(count.live.get() + 1);
        drop(monoio::spawn(async move {
            let _done = TaskDone(count);
            fut.await;
        }));
    }

    /// A process-unique id (worker index in the top bits).
    pub fn next_id(&self) -> u64 {
        let n = self.next_id.get();
        self.next_id.set(n + 1);
        ((self.index as u64) << 48) | n
    }

    /// A pseudo-random number (xorshift64*; for backend selection and
    /// CONNECT dial ids — not for anything secret).
    pub fn random(&self) -> u64 {
        let mut x = self.rng.get();
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng.set(x);
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A CONNECT dial id: a positive int63, as Go's `rand.Int63`.
    pub fn dial_random(&self) -> i64 {
        (self.random() >> 1) as i64
    }

    /// Whether a backend's tunnel is congested.
    pub fn congested(&self, backend: BackendId) -> bool {
        self.backends
            .borrow()
            .get(&backend)
            .is_some_and(|b| b.queued.get() >= self.settings.tunnel_high_water)
    }

    /// Return a gRPC frontend's credit now, or when the agent resumes it,
    /// or when its backend drains.
    pub fn credit(
        &self,
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
        if flow > 0 && !self.hold_if_congested(fid, backend, outbox, stream, flow) {
            grpc.release(stream, flow);
        }
    }

    /// Keep a frontend's credit while its tunnel is congested: in the
    /// backend's list for a tunnel of this worker, or by sending it to the
    /// tunnel's worker, which answers when it may go back. Returns whether
    /// it was kept.
    fn hold_if_congested(
        &self,
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
            if be.queued.get() < self.settings.tunnel_high_water {
                return false;
            }
            be.waiting
                .borrow_mut()
                .push(Waiting::Local(outbox.clone(), stream, flow));
            return true;
        }
        self.credit_via_tunnel(fid, b, flow)
    }

    /// A relayed frontend's credit goes to its tunnel's worker
    /// ([`Msg::FrontendCredit`]); false when `backend` is not relayed.
    pub fn credit_via_tunnel(&self, fid: FrontendId, backend: BackendId, credit: usize) -> bool {
        let Some(core) = self.router.borrow().remote_core(backend) else {
            return false;
        };
        let msg = Msg::FrontendCredit {
            from: self.index,
            backend,
            frontend: fid,
            credit,
        };
        // A stopped worker takes the tunnel with it; the flow ends anyway.
        let _ = self.out.send(core, msg);
        true
    }

    /// A backend's tunnel drained: give back held credit, wake readers.
    pub fn backend_drained(&self, backend: BackendId) {
        let waiting = {
            let backends = self.backends.borrow();
            let Some(b) = backends.get(&backend) else {
                return;
            };
            b.drained.notify_all();
            std::mem::take(&mut *b.waiting.borrow_mut())
        };
        for w in waiting {
            match w {
                Waiting::Local(outbox, stream, flow) => outbox.push(Out::Release(stream, flow)),
                Waiting::Remote {
                    core,
                    frontend,
                    credit,
                } => {
                    let _ = self
                        .out
                        .send(core, Msg::ReleaseFrontend { frontend, credit });
                }
            }
        }
    }

    /// Handle a message from another worker (everything but the messages
    /// `crate::serve` handles itself: frontends moving, shutdown).
    pub fn on_message(&self, msg: Msg) {
        match msg {
            Msg::BackendUp(e, load) => {
                self.loads.borrow_mut().insert(e.id, load);
                self.router.borrow_mut().directory_mut().add(e);
            }
            Msg::BackendDown(id) => {
                self.loads.borrow_mut().remove(&id);
                // Flows of this worker's frontends through it end too.
                self.router.borrow_mut().backend_gone(id);
                self.apply();
                self.publish();
            }
            Msg::BackendDraining(id) => self.router.borrow_mut().directory_mut().set_draining(id),
            Msg::Relay { from, relay } => self.on_relay(from, relay),
            Msg::AuthVerdict { id, outcome } => {
                if let Some(auth) = self.auth.get() {
                    auth.resolve(id, outcome);
                }
            }
            Msg::FrontendCredit {
                from,
                backend,
                frontend,
                credit,
            } => {
                let held = self.backends.borrow().get(&backend).is_some_and(|b| {
                    let congested = b.queued.get() >= self.settings.tunnel_high_water;
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
                    let _ = self
                        .out
                        .send(from, Msg::ReleaseFrontend { frontend, credit });
                }
            }
            Msg::ReleaseFrontend { frontend, credit } => {
                let f = self.frontends.borrow();
                match f.get(&frontend) {
                    Some(FrontendRef::Grpc { outbox, stream }) => {
                        outbox.push(Out::Release(*stream, credit))
                    }
                    Some(FrontendRef::Connect(cf)) => cf.credit_back(credit),
                    None => {}
                }
            }
            Msg::Adopt(_) | Msg::Shutdown => {}
        }
    }

    fn on_relay(&self, from: usize, relay: Relay) {
        let now = konn_core::io::clock::now();
        match relay {
            Relay::ToBackend { backend, payload } => {
                let Some((packet, framed)) = decoded(payload) else {
                    return;
                };
                self.forwarding.set(packet.ty());
                self.router
                    .borrow_mut()
                    .relayed_packet(from, backend, packet, framed);
                self.apply();
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
                self.forwarding.set(ty);
                // A relayed backend's credit goes back as a Relay action.
                let _ = self
                    .router
                    .borrow_mut()
                    .backend_packet(now, backend, packet, framed, credit);
                self.apply();
                if ty != PacketType::Data {
                    self.publish();
                }
            }
        }
    }

    /// Perform every action the router has queued.
    pub fn apply(&self) {
        loop {
            let action = self.router.borrow_mut().poll_action();
            let Some(action) = action else { return };
            match action {
                Action::ToBackend { backend, payload } => {
                    let ty = self.payload_type(&payload);
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
                        let ty = self.payload_type(&payload);
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
                    tracing::debug!(frontend, backend, connect_id, "CONNECT tunnel established");
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
                        if !self.hold_if_congested(frontend, backend, &outbox, stream, credit) {
                            outbox.push(Out::Release(stream, credit));
                        }
                    }
                }
                Action::Relay { core, relay } => {
                    let msg = Msg::Relay {
                        from: self.index,
                        relay,
                    };
                    if self.out.send(core, msg).is_err() {
                        tracing::debug!(worker = core, "relay to a stopped worker dropped");
                    }
                }
                Action::ReverseDial {
                    backend,
                    random,
                    target,
                } => {
                    if let Some(me) = self.me.get().and_then(std::rc::Weak::upgrade) {
                        self.spawn(crate::reverse::dial_and_serve(me, backend, random, target));
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
                Action::DialFailed(why) => {
                    tracing::debug!(reason = ?failure_reason(why), "dial failed");
                    self.metrics.dial_failures(failure_reason(why)).inc();
                }
                Action::DialSucceeded(d) => {
                    tracing::debug!(elapsed = ?d, "dial succeeded");
                    self.metrics.dial_duration().observe_duration(d);
                }
            }
        }
    }

    fn payload_type(&self, p: &Payload) -> PacketType {
        match p {
            Payload::Packet(p) => p.ty(),
            Payload::Forward(_) => self.forwarding.get(),
        }
    }

    /// After a control event: publish the router's gauges and loads.
    pub fn publish(&self) {
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
            self.shared
                .pending_dials
                .fetch_add(delta(now.0, before.0), Ordering::Relaxed);
            self.shared
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

/// A relayed payload as (packet, wire bytes), for the router.
fn decoded(payload: Payload) -> Option<(Packet, Bytes)> {
    match payload {
        Payload::Forward(framed) => {
            if framed.len() < 5 {
                return None;
            }
            let packet = Packet::decode(&framed.slice(5..)).ok()?;
            Some((packet, framed))
        }
        Payload::Packet(p) => {
            let framed = encode(Payload::Packet(p.clone()));
            Some((p, framed))
        }
    }
}

/// The wire bytes of a payload (control packets are encoded here; forwarded
/// ones already are).
pub fn encode(payload: Payload) -> Bytes {
    match payload {
        Payload::Forward(b) => b,
        Payload::Packet(p) => {
            let mut b = BytesMut::with_capacity(p.encoded_len() + 5);
            p.encode_grpc(&mut b);
            b.freeze()
        }
    }
}

/// Relaxed add for the connection-level counters.
pub fn bump(counter: &AtomicUsize, up: bool) {
    if up {
        counter.fetch_add(1, Ordering::Relaxed);
    } else {
        counter.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use bytes::BytesMut;
    use konn_frames::packet::{ByteStr, Packet};

    use super::*;
    use crate::settings::{FrontendListen, Mode};
    use konn_protocol::server::backends::{Directory, Identifiers, Strategy};
    use konn_protocol::server::router::{FrontendKind, RouterConfig};

    fn framed(p: &Packet) -> Bytes {
        let mut b = BytesMut::new();
        p.encode_grpc(&mut b);
        b.freeze()
    }

    fn worker(index: usize, shared: &Arc<Shared>, metrics: &ServerMetrics) -> Worker {
        let settings =
            ServerSettings::for_tests(FrontendListen::Unix("/nonexistent".into()), Mode::Grpc);
        let budget = konn_core::io::pool::MemoryBudget::new(1 << 20);
        Worker::new(
            index,
            Router::new(
                RouterConfig::default(),
                Directory::new(vec![Strategy::Default]),
            ),
            Arc::new(settings),
            BufPool::new(&budget, &konn_core::io::pool::PoolConfig::default()),
            shared.clone(),
            1,
            metrics.core(index).expect("slab"),
            metrics.clone(),
            konn_core::io::xcore::Mesh::new(2, 16).sender(),
        )
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
        for (i, w) in workers.iter().enumerate() {
            let mut r = w.router.borrow_mut();
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
            w.publish();
        }
        assert_eq!(counts(), (2, 0));
        let rsp = Packet::DialRsp {
            error: ByteStr::new(),
            connect_id: 3,
            random: 5,
        };
        let f = framed(&rsp);
        let _ = workers[0]
            .router
            .borrow_mut()
            .backend_packet(now, 7, rsp, f, 0);
        workers[0].publish();
        assert_eq!(counts(), (1, 1));
        workers[0].publish();
        assert_eq!(counts(), (1, 1), "publishing twice counts once");
        for w in &workers {
            w.router.borrow_mut().frontend_gone(1);
            w.publish();
        }
        assert_eq!(counts(), (0, 0));
    }
}
