//! One server worker's state: its clusters (`crate::cluster`; one without
//! `--clusters-config`), its connections and tasks, and the messages
//! between workers ([`Msg`]): per-cluster ones are handed to that
//! cluster's state, reload ones add or remove a cluster here.
//!
//! Also what every connection uses to reach another: its [`Outbox`] (work
//! queued for a gRPC connection, flushed by a *poke*: see
//! `crate::cluster`), and the refs a cluster keeps of its frontends and
//! backends ([`FrontendRef`], [`BackendRef`]).

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
use konn_protocol::maps::IdMap;

use konn_frames::packet::{Packet, PacketType};

use crate::cluster::{Cluster, ClusterId, ClusterMsg};
use crate::connect::ConnectFrontend;
use crate::metrics::ServerMetrics;
use crate::settings::ServerSettings;
use konn_protocol::server::router::{FrontendId, Payload};

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
        self.flush_with(grpc, |_, _| {});
    }

    /// [`Outbox::flush`], telling `refused` about each message the session
    /// would not send (its stream or connection is gone): the message's
    /// packet type, read from its first bytes, and the error.
    pub fn flush_with(
        &self,
        grpc: &mut Grpc,
        mut refused: impl FnMut(Option<PacketType>, &konn_protocol::Error),
    ) {
        loop {
            let next = self.items.borrow_mut().pop_front();
            let Some(item) = next else { return };
            match item {
                Out::Send(stream, b) => {
                    // Two byte loads, in case the send fails (the message
                    // goes with it).
                    let head = (
                        b.get(PACKET_TYPE_AT).copied(),
                        b.get(PACKET_TYPE_AT + 1).copied(),
                    );
                    if let Err(e) = grpc.send_framed(stream, b) {
                        refused(packet_type(head), &e);
                    }
                }
                Out::Release(stream, n) => grpc.release(stream, n),
                Out::Finish(stream, status, msg) => {
                    let _ = grpc.finish(stream, status, msg);
                }
            }
        }
    }

    /// Give back the queue's capacity if it is empty (an idle
    /// connection).
    pub fn release_idle(&self) {
        let mut items = self.items.borrow_mut();
        if items.is_empty() {
            *items = VecDeque::new();
        }
    }

    /// Forget the poke (the connection is gone) and what is queued.
    pub fn close(&self) {
        self.poke.borrow_mut().take();
        self.items.borrow_mut().clear();
    }
}

/// Where a framed Konnectivity `Packet` has its `type` field's tag: right
/// after the 5-byte gRPC prefix.
const PACKET_TYPE_AT: usize = 5;

/// The packet type of a framed `Packet` from its first two bytes after the
/// prefix: `type` is field 1, a varint (tag 0x08); proto3 leaves it out
/// when it is 0 (`DIAL_REQ`).
fn packet_type((tag, value): (Option<u8>, Option<u8>)) -> Option<PacketType> {
    match (tag, value) {
        (Some(0x08), Some(v)) => PacketType::try_from(i32::from(v)).ok(),
        (Some(0x08), None) => None,
        (Some(_), _) => Some(PacketType::DialReq),
        (None, _) => None,
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
    /// The audit log (`--audit-log-path`), when on.
    pub audit: Option<Arc<crate::audit::AuditLog>>,
    /// The workers' `/debug/connections` listings.
    pub conns: Option<Arc<crate::accounting::ConnBoard>>,
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

/// Messages between server workers (and from the control thread).
pub enum Msg {
    /// For one cluster's state on this worker (dropped when the cluster was
    /// removed here meanwhile).
    Cluster {
        /// Which.
        cluster: ClusterId,
        /// What.
        msg: ClusterMsg,
    },
    /// A frontend moving to this worker (see `crate::serve`).
    Adopt(Box<crate::serve::Migrant>),
    /// Start a graceful shutdown: GOAWAY on every connection.
    Shutdown,
    /// A cluster added by a reload: serve it here too (`crate::serve`).
    ClusterUp(Box<crate::serve::ClusterStart>),
    /// A cluster removed by a reload: close its listeners and connections
    /// here (`crate::serve`).
    ClusterDown(ClusterId),
}

/// One worker's state.
pub struct Worker {
    /// Worker index.
    pub index: usize,
    /// How many workers there are.
    pub workers: usize,
    /// The clusters this worker serves (one without `--clusters-config`).
    pub clusters: RefCell<HashMap<ClusterId, Rc<Cluster>>>,
    /// With `--clusters-config`: SNI name → its cluster.
    pub by_sni: RefCell<HashMap<String, Rc<Cluster>>>,
    /// Messages for clusters this worker has not been told of yet (a
    /// reload's `ClusterUp` races other workers' announcements), replayed
    /// when it is; bounded by [`EARLY_MESSAGES`].
    pub early: RefCell<Vec<(ClusterId, ClusterMsg)>>,
    /// The highest cluster id this worker was told of (older unknown ids
    /// are removed clusters: their messages are dropped).
    pub newest_cluster: Cell<ClusterId>,
    next_id: Cell<u64>,
    rng: Cell<u64>,
    /// Settings.
    pub settings: Arc<ServerSettings>,
    /// The agent port's HTTP/2 configuration, shared by its connections.
    pub agent_h2: Arc<konn_protocol::h2::Config>,
    /// The gRPC frontend's HTTP/2 configuration, shared likewise.
    pub frontend_h2: Arc<konn_protocol::h2::Config>,
    /// This core's buffers.
    pub pool: BufPool,
    /// Process-wide counters.
    pub shared: Arc<Shared>,
    /// Live connections of this worker: how to stop each one (see
    /// [`Stop`]). Every connection task registers here and removes itself
    /// when it ends, so an empty map means no connection task is left.
    pub connections: RefCell<IdMap<u64, StopFn>>,
    /// Set, and `stopping` notified, when the worker stops: tasks not in
    /// `connections` yet (reading a CONNECT head) end too.
    pub stopped: Cell<bool>,
    /// See `stopped`.
    pub stopping: Broadcast,
    /// Wakes the router timer (`crate::serve`) for a deadline that came
    /// sooner than the one it sleeps towards ([`Worker::poke_timer`]).
    pub timer: Notify,
    /// When the router timer wakes next.
    pub timer_at: Cell<Option<std::time::Instant>>,
    /// Tasks started with [`Worker::spawn`] that have not ended.
    pub tasks: Rc<TaskCount>,
    /// The process-wide metrics (without `--clusters-config` they hold the
    /// one cluster's families too).
    pub all_metrics: ServerMetrics,
    /// Type of the packet being routed now (what `Payload::Forward`s are).
    pub forwarding: Cell<PacketType>,
    /// The other workers, reliably and in order.
    pub out: Outbound<Msg>,
    /// The mesh itself (for verdicts sent from the control-plane thread).
    pub mesh: MeshSender<Msg>,
    /// This worker itself, for tasks its actions start (reverse dials).
    me: std::cell::OnceCell<std::rc::Weak<Self>>,
}

/// Messages held for not-yet-known clusters at most (beyond, they are
/// dropped with a warning: the cluster's directory replica here misses an
/// agent until it reconnects).
pub const EARLY_MESSAGES: usize = 4096;

impl Worker {
    /// A worker's state (its clusters are added with
    /// [`Worker::add_cluster`]).
    #[allow(clippy::too_many_arguments)] // one-time construction of a worker
    pub fn new(
        index: usize,
        workers: usize,
        settings: Arc<ServerSettings>,
        pool: BufPool,
        shared: Arc<Shared>,
        seed: u64,
        all_metrics: ServerMetrics,
        mesh: MeshSender<Msg>,
    ) -> Self {
        Self {
            index,
            workers,
            clusters: RefCell::new(HashMap::new()),
            by_sni: RefCell::new(HashMap::new()),
            early: RefCell::new(Vec::new()),
            newest_cluster: Cell::new(0),
            next_id: Cell::new(1),
            rng: Cell::new(seed | 1),
            agent_h2: Arc::new(settings.agent_h2()),
            frontend_h2: Arc::new(settings.frontend_h2()),
            settings,
            pool,
            shared,
            connections: RefCell::new(IdMap::default()),
            stopped: Cell::new(false),
            stopping: Broadcast::new(),
            timer: Notify::new(),
            timer_at: Cell::new(None),
            tasks: Rc::new(TaskCount::default()),
            all_metrics,
            forwarding: Cell::new(PacketType::Data),
            out: Outbound::new(mesh.clone()),
            mesh,
            me: std::cell::OnceCell::new(),
        }
    }

    /// This worker, for tasks that own it.
    pub fn upgrade(&self) -> Option<Rc<Self>> {
        self.me.get().and_then(std::rc::Weak::upgrade)
    }

    /// Serve `cluster` here: register it (and its SNI names), then replay
    /// what other workers said of it before this one knew it.
    pub fn add_cluster(&self, cluster: Rc<Cluster>) {
        let id = cluster.id;
        self.newest_cluster.set(self.newest_cluster.get().max(id));
        for name in &cluster.settings.agents.server_names {
            self.by_sni
                .borrow_mut()
                .insert(name.clone(), cluster.clone());
        }
        self.clusters.borrow_mut().insert(id, cluster.clone());
        let early = std::mem::take(&mut *self.early.borrow_mut());
        let (mine, others): (Vec<_>, Vec<_>) = early.into_iter().partition(|(c, _)| *c == id);
        *self.early.borrow_mut() = others;
        for (_, msg) in mine {
            cluster.on_message(self, msg);
        }
    }

    /// Stop serving cluster `id` here: no new connection, every one of its
    /// connections closed now (their handlers then leave its router).
    pub fn remove_cluster(&self, id: ClusterId) {
        self.newest_cluster.set(self.newest_cluster.get().max(id));
        let Some(cluster) = self.clusters.borrow_mut().remove(&id) else {
            return;
        };
        self.by_sni.borrow_mut().retain(|_, c| c.id != id);
        cluster.removed.set(true);
        cluster.stopping.notify_all();
        let conns: Vec<u64> = cluster.connections.borrow().iter().copied().collect();
        for conn in conns {
            let stop = self.connections.borrow();
            if let Some(f) = stop.get(&conn) {
                f(Stop::Now);
            }
        }
    }

    /// Frontends (gRPC streams and CONNECT connections) of every cluster on
    /// this core.
    pub fn frontend_count(&self) -> usize {
        self.clusters
            .borrow()
            .values()
            .map(|c| c.frontends.borrow().len())
            .sum()
    }

    /// Hand a message to its cluster, if it is served here; one for a
    /// cluster not known yet is kept for [`Worker::add_cluster`].
    pub fn cluster_message(&self, id: ClusterId, msg: ClusterMsg) {
        let cluster = self.clusters.borrow().get(&id).cloned();
        match cluster {
            Some(c) => c.on_message(self, msg),
            None if id > self.newest_cluster.get() => {
                let mut early = self.early.borrow_mut();
                if early.len() < EARLY_MESSAGES {
                    early.push((id, msg));
                } else {
                    tracing::warn!(cluster = id, "message for a cluster not known yet dropped");
                }
            }
            None => {} // a removed cluster
        }
    }

    /// The one cluster without `--clusters-config` (the oldest with it).
    pub fn first_cluster(&self) -> Option<Rc<Cluster>> {
        self.clusters
            .borrow()
            .values()
            .min_by_key(|c| c.id)
            .cloned()
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
        // `with_guard`, not `async move { let _done = …; fut.await }`: the
        // latter keeps `fut` twice in the task (S5: 15.0 → 12.3 KiB per
        // idle connection).
        drop(monoio::spawn(konn_core::io::future::with_guard(
            fut,
            TaskDone(count),
        )));
    }

    /// The router timer must wake by `at` (a resume ACK due by time, a
    /// parked tunnel's window): wakes it if it sleeps longer.
    pub fn poke_timer(&self, at: std::time::Instant) {
        if self.timer_at.get().is_none_or(|t| t > at) {
            self.timer_at.set(Some(at));
            self.timer.notify();
        }
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
}

/// A relayed payload as (packet, wire bytes), for the router.
pub(crate) fn decoded(payload: Payload) -> Option<(Packet, Bytes)> {
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
    use super::*;
    use konn_protocol::h2::{Config, Connection, Role};

    fn framed(packet: &[u8]) -> Bytes {
        let mut b = vec![0, 0, 0, 0, u8::try_from(packet.len()).unwrap()];
        b.extend_from_slice(packet);
        Bytes::from(b)
    }

    #[test]
    fn a_message_for_a_stream_that_is_gone_is_reported_with_its_type() {
        let mut grpc = Grpc::new(
            Connection::new(Config::new(Role::Server), konn_core::io::clock::now()),
            4 << 20,
        );
        let outbox = Outbox::new();
        // DIAL_RSP (type 1), DATA (type 4), and DIAL_REQ (type 0: proto3
        // leaves the field out, so the first tag is another field's).
        outbox.push(Out::Send(1, framed(&[0x08, 0x01, 0x1a, 0x00])));
        outbox.push(Out::Send(3, framed(&[0x08, 0x04])));
        outbox.push(Out::Send(5, framed(&[0x12, 0x00])));
        let mut refused = Vec::new();
        outbox.flush_with(&mut grpc, |ty, e| refused.push((ty, e.to_string())));
        let types: Vec<_> = refused.iter().map(|(ty, _)| *ty).collect();
        assert_eq!(
            types,
            [
                Some(PacketType::DialRsp),
                Some(PacketType::Data),
                Some(PacketType::DialReq)
            ]
        );
        assert!(outbox.items.borrow().is_empty());
    }

    #[test]
    fn packet_types_from_the_first_bytes() {
        assert_eq!(packet_type((None, None)), None);
        assert_eq!(packet_type((Some(0x08), None)), None);
        assert_eq!(
            packet_type((Some(0x08), Some(2))),
            Some(PacketType::CloseReq)
        );
        assert_eq!(packet_type((Some(0x08), Some(0x7f))), None);
        assert_eq!(
            packet_type((Some(0x22), Some(0))),
            Some(PacketType::DialReq)
        );
    }
}
