//! Running proxy-server: listeners on every worker, the per-worker
//! [`Worker`] state, cross-core backend announcements, and frontend
//! migration.
//!
//! ```text
//!  agent port (TCP+TLS, SO_REUSEPORT on every worker) ──► AgentConn ──┐
//!                                                                      ▼
//!  frontend (UDS or TCP+mTLS, accepted on every worker) ──► FrontendConn / CONNECT ─► Router (per core)
//!        │ first DIAL_REQ picks an agent of another core
//!        └──► detach between two reads ── mesh ──► that core resumes it
//! ```
//!
//! Each worker keeps a replica of the backend directory; a worker that
//! gains, loses or drains a backend tells the others through the mesh
//! (connection-level events, never per packet). Everything a worker sends
//! another goes through its `Outbound` (ordered; a full inbox queues, never
//! drops). A frontend that cannot move — several streams on one
//! connection, one that moved already, a socket that cannot be duplicated —
//! stays where it is and its flows are relayed through the mesh
//! (docs/design/cross-core.md).
//!
//! `conns` takes one connection from accept (or from another core) to its
//! handler; this module starts the server, its workers and listeners.

use std::cell::RefCell;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::Arc;

use bytes::BytesMut;
use konn_core::Error;
use konn_core::http1;
use konn_core::io::driver::{ConnHandle, Handler};
use konn_core::io::listen::bind_tcp;
use konn_core::io::listen::{TcpListeners, accept_loop, tcp_into_monoio, unix_into_monoio};
use konn_core::io::runtime::{Either, StopToken, Stopper, WorkerCtx, Workers, race};
use konn_core::io::sock::ReadReady;
use konn_core::io::tls::TlsLayer;
use konn_core::io::xcore::{DetachedTcp, DetachedUnix, detach_tcp, detach_unix};
use konn_protocol::grpc::Grpc;
use konn_protocol::h2::Connection;
use monoio::io::{AsyncReadRent, AsyncWriteRent, Split};
use monoio::net::{TcpStream, UnixStream};

use std::sync::atomic::Ordering;
use std::time::Duration;

use crossbeam_utils::atomic::AtomicCell;

use crate::agents::{AgentConn, AgentPlan};
use crate::cluster::{Cluster, ClusterId};
pub use crate::clusters::reload::{ClusterListeners, ClusterStart};
use crate::clusters::reload::{Control, ReloadSummary, WATCH_INTERVAL, Watcher};
use crate::connect::{Head, Sock, Wire, read_head, serve_connect};
use crate::frontend::{FrontendConn, Plan, Who};
use crate::health::{BackendIdentifiers, BackendInfo, ClusterBackends, LimitsInfo};
use crate::metrics::{ServerMetrics, Strategy as MetricStrategy};
use crate::settings::{Mode, ServerSettings};
use crate::worker::{Msg, Outbox, Shared, Stop, Worker};

mod conns;
use conns::{FrontSock, adopt, serve_agent, serve_frontend};

/// A socket in transit between workers.
pub enum MovingFd {
    /// A TCP connection.
    Tcp(DetachedTcp),
    /// A Unix-socket connection.
    Unix(DetachedUnix),
}

/// A connection moving to another worker: a frontend following its
/// agent, or an agent resuming a tunnel parked there.
pub struct Migrant {
    /// Its cluster (the same on every worker).
    pub cluster: ClusterId,
    /// Its socket.
    pub fd: MovingFd,
    /// Its state.
    pub kind: MigrantKind,
}

/// The state that moves with a frontend.
pub enum MigrantKind {
    /// A gRPC connection stopped between two reads.
    Grpc {
        /// The HTTP/2 + gRPC state.
        session: Box<Grpc>,
        /// TLS state (TCP frontends).
        tls: Option<TlsLayer>,
        /// Unprocessed input.
        input: (BytesMut, BytesMut),
        /// Streams and events to replay.
        plan: Plan,
    },
    /// An agent connection whose Connect call presents a resume token
    /// issued by the receiving worker, stopped right after the call.
    Agent {
        /// The HTTP/2 + gRPC state.
        session: Box<Grpc>,
        /// TLS state.
        tls: Option<TlsLayer>,
        /// Unprocessed input.
        input: (BytesMut, BytesMut),
        /// Events to replay (the Connect call first).
        stashed: Vec<konn_protocol::grpc::GrpcEvent>,
    },
    /// A CONNECT whose head was read.
    Connect {
        /// TLS state (TCP frontends).
        tls: Option<Box<TlsLayer>>,
        /// Client bytes after the head.
        plain: BytesMut,
        /// The CONNECT target.
        target: String,
    },
}

/// A running server.
pub struct ServerHandle {
    workers: Option<Workers<Msg>>,
    agent_addr: SocketAddr,
    frontend_addr: Option<SocketAddr>,
    frontend_path: Option<PathBuf>,
    health_addr: Option<SocketAddr>,
    admin_addr: Option<SocketAddr>,
    shared: Arc<Shared>,
    metrics: ServerMetrics,
    listen_stop: Stopper,
    /// The frontend listeners of the clusters served from the start.
    frontends: Vec<Arc<ClusterListeners>>,
    kube: Option<crate::kube::KubeServices>,
    /// With `--clusters-config`: the running clusters (until watching
    /// starts) or their watcher.
    control: Option<Control>,
    watcher: Option<Watcher>,
    /// The audit log's writer thread, stopped after the workers.
    audit_writer: Option<crate::audit::AuditWriter>,
}

impl ServerHandle {
    /// With `--clusters-config`: each cluster's frontend, name → (TCP
    /// address, Unix socket path). Only before [`ServerHandle::watch`].
    pub fn cluster_frontends(&self) -> Vec<(String, Option<SocketAddr>, Option<PathBuf>)> {
        self.control
            .as_ref()
            .map(Control::frontends)
            .unwrap_or_default()
    }

    /// With `--clusters-config`: read the file again and apply it now (see
    /// `crate::clusters::reload`). Only before [`ServerHandle::watch`].
    ///
    /// # Errors
    ///
    /// Why the file was refused (the running clusters are kept).
    pub fn reload(&mut self) -> Result<ReloadSummary, String> {
        match &mut self.control {
            Some(c) => c.reload(),
            None => Err("no --clusters-config, or it is being watched".to_owned()),
        }
    }

    /// With `--clusters-config`: reload on [`ServerHandle::poke_reload`]
    /// and whenever the file changes (checked every `interval`; `None`:
    /// every second), on a thread of its own.
    ///
    /// # Errors
    ///
    /// The thread cannot start.
    pub fn watch(&mut self, interval: Option<Duration>) -> std::io::Result<()> {
        if let Some(c) = self.control.take() {
            self.watcher = Some(Watcher::start(c, interval.unwrap_or(WATCH_INTERVAL))?);
        }
        Ok(())
    }

    /// Something any thread can send `false` to, to reload now (SIGHUP),
    /// once watching.
    pub fn reload_poker(&self) -> Option<std::sync::mpsc::Sender<bool>> {
        self.watcher.as_ref().and_then(Watcher::poker)
    }

    /// Reload now (SIGHUP), once watching.
    pub fn poke_reload(&self) {
        if let Some(w) = &self.watcher {
            w.poke();
        }
    }

    /// The agent port's bound address.
    pub fn agent_addr(&self) -> SocketAddr {
        self.agent_addr
    }

    /// The TCP frontend's bound address (TCP mode).
    pub fn frontend_addr(&self) -> Option<SocketAddr> {
        self.frontend_addr
    }

    /// The Unix-socket frontend's path (UDS mode).
    pub fn frontend_path(&self) -> Option<&std::path::Path> {
        self.frontend_path.as_deref()
    }

    /// The health port's bound address.
    pub fn health_addr(&self) -> Option<SocketAddr> {
        self.health_addr
    }

    /// The admin port's bound address.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin_addr
    }

    /// Process-wide counters.
    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// The metrics registry.
    pub fn metrics(&self) -> &ServerMetrics {
        &self.metrics
    }

    /// Graceful shutdown, as upstream's with `--graceful-shutdown-timeout`:
    /// not ready any more, no new connections, GOAWAY on every connection;
    /// then wait until the frontends are gone or `timeout` passed, and stop.
    #[allow(clippy::disallowed_methods)] // the main thread's wait, not a data path
    pub fn shutdown(mut self, timeout: Duration) -> Result<(), Error> {
        self.shared.shutting_down.store(true, Ordering::SeqCst);
        self.listen_stop.stop();
        // A Unix-socket frontend listener is shared by every worker (TCP
        // listeners close with their accept loops): shut it down so new
        // clients are refused (ECONNREFUSED) instead of waiting unaccepted
        // in its backlog until the process exits. (Clusters added by a
        // reload close theirs when the watcher stops them.)
        for f in &self.frontends {
            f.refuse_new();
        }
        if let Some(w) = &self.workers {
            for i in 0..w.len() {
                let _ = w.mesh().send(i, Msg::Shutdown);
            }
        }
        let deadline = std::time::Instant::now() + timeout;
        while std::time::Instant::now() < deadline {
            let open = self.shared.proxy_streams.load(Ordering::Relaxed)
                + self.shared.http_connections.load(Ordering::Relaxed);
            if open == 0 {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.stop_inner()
    }

    /// Stop now and wait for the workers.
    pub fn stop(mut self) -> Result<(), Error> {
        self.stop_inner()
    }

    fn stop_inner(&mut self) -> Result<(), Error> {
        self.listen_stop.stop();
        let r = match self.workers.take() {
            Some(w) => {
                w.stop();
                w.join()
            }
            None => Ok(()),
        };
        // After the workers (upstream stops its lease controller after the
        // servers): delete this server's lease, stop the client thread.
        if let Some(k) = self.kube.take() {
            k.stop();
        }
        let control = match self.watcher.take() {
            Some(w) => w.stop(),
            None => self.control.take(),
        };
        if let Some(mut c) = control {
            c.stop();
        }
        // After the workers: every record they queued is written.
        if let Some(a) = self.audit_writer.take() {
            a.stop();
        }
        r
    }
}

impl Drop for ServerHandle {
    fn drop(&mut self) {
        let _ = self.stop_inner();
    }
}

/// Listeners created before the workers start, handed out per worker
/// (the clusters' frontends are in their [`ClusterStart`]s).
struct Listeners {
    agent: TcpListeners,
    health: AtomicCell<Option<std::net::TcpListener>>,
    admin: AtomicCell<Option<std::net::TcpListener>>,
}

/// Bind every listener and start the workers.
pub fn start(settings: ServerSettings) -> Result<ServerHandle, Error> {
    let workers = settings.runtime.workers.max(1);
    let agent = TcpListeners::bind(settings.agent_addr, workers, 1024)?;
    let agent_addr = agent.local_addr();
    let bind_http = |addr: Option<SocketAddr>| -> Result<Option<std::net::TcpListener>, Error> {
        addr.map(|a| bind_tcp(a, 128, false)).transpose()
    };
    let health = bind_http(settings.health_addr)?;
    let admin = bind_http(settings.admin_addr)?;
    let health_addr = health.as_ref().and_then(|l| l.local_addr().ok());
    let admin_addr = admin.as_ref().and_then(|l| l.local_addr().ok());
    let listeners = Arc::new(Listeners {
        agent,
        health: AtomicCell::new(health),
        admin: AtomicCell::new(admin),
    });
    let (metrics, kube, mut control, starts) = match &settings.clusters {
        // One cluster from the flags: upstream's server, one registry.
        None => {
            let metrics = ServerMetrics::new(workers);
            for s in &settings.strategies {
                metrics.init_backend_storage(metric_strategy(*s));
            }
            metrics.init_connect_channels();
            let kube = settings
                .kubernetes
                .as_ref()
                .map(|k| crate::kube::KubeServices::start(k, &metrics))
                .transpose()?;
            let cluster = settings.implicit_cluster();
            let listeners = ClusterListeners::bind(
                &cluster.frontend.listen,
                cluster.frontend.delete_existing_uds,
                workers,
            )?;
            let start = ClusterStart {
                id: 1,
                settings: Arc::new(cluster),
                listeners: Arc::new(listeners),
                metrics: metrics.clone(),
                reviewer: kube.as_ref().and_then(|k| k.reviewer()),
            };
            (metrics, kube, None, vec![start])
        }
        Some(source) => {
            let metrics = ServerMetrics::process(workers);
            let mut control = Control::new(
                source.path.clone(),
                source.defaults.clone(),
                workers,
                metrics.clone(),
            );
            let starts = control.initial(source.initial.clone())?;
            (metrics, None, Some(control), starts)
        }
    };
    let (frontend_addr, frontend_path) = starts
        .first()
        .map(|s| (s.listeners.addr, s.listeners.path.clone()))
        .unwrap_or_default();
    let starts = Arc::new(starts);
    let audit = settings
        .observe
        .audit
        .clone()
        .map(|cfg| crate::audit::AuditLog::start(cfg, workers))
        .transpose()
        .map_err(Error::Io)?;
    if audit.is_some() {
        metrics.audit_dropped().touch();
    }
    let (audit, audit_writer) = audit.unzip();
    let shared = Arc::new(Shared {
        audit,
        conns: Some(Arc::new(crate::accounting::ConnBoard::new(
            workers,
            konn_core::io::clock::now(),
        ))),
        ..Shared::default()
    });
    let settings = Arc::new(settings);
    let listen_stop = Stopper::new();
    let (shared2, metrics2, stop2) = (shared.clone(), metrics.clone(), listen_stop.clone());
    let mut runtime = settings.runtime.clone();
    runtime.workers = workers;
    let frontends: Vec<_> = starts.iter().map(|s| s.listeners.clone()).collect();
    let workers = Workers::start(runtime, move |ctx| {
        worker_main(
            ctx,
            settings.clone(),
            listeners.clone(),
            starts.clone(),
            shared2.clone(),
            metrics2.clone(),
            stop2.clone(),
        )
    })?;
    if let Some(c) = &mut control {
        c.set_mesh(workers.mesh().clone());
    }
    Ok(ServerHandle {
        workers: Some(workers),
        agent_addr,
        frontend_addr,
        frontend_path,
        health_addr,
        admin_addr,
        shared,
        metrics,
        listen_stop,
        frontends,
        kube,
        control,
        watcher: None,
        audit_writer,
    })
}

/// The metrics label of a proxy strategy.
pub fn metric_strategy(s: konn_protocol::server::backends::Strategy) -> MetricStrategy {
    match s {
        konn_protocol::server::backends::Strategy::Default => MetricStrategy::Default,
        konn_protocol::server::backends::Strategy::DestHost => MetricStrategy::DestHost,
        konn_protocol::server::backends::Strategy::DefaultRoute => MetricStrategy::DefaultRoute,
    }
}

async fn worker_main(
    mut ctx: WorkerCtx<Msg>,
    settings: Arc<ServerSettings>,
    listeners: Arc<Listeners>,
    starts: Arc<Vec<ClusterStart>>,
    shared: Arc<Shared>,
    metrics: ServerMetrics,
    listen_stop: Stopper,
) {
    let index = ctx.index();
    let seed =
        (index as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ u64::from(std::process::id());
    let worker = Rc::new(Worker::new(
        index,
        ctx.workers(),
        settings.clone(),
        ctx.pool().clone(),
        shared,
        seed,
        metrics.clone(),
        ctx.mesh().clone(),
    ));
    worker.set_self();
    // Listeners stop on a graceful shutdown; the worker itself on stop.
    let stop = listen_stop.token();
    let worker_stop = ctx.stop_token().clone();
    serve_http(&worker, &listeners, &stop);
    worker.spawn(router_timer(worker.clone()));
    {
        let (w, s) = (worker.clone(), worker_stop.clone());
        worker.spawn(async move { w.out.run(&s).await });
    }

    // Agent port.
    if let Some(l) = listeners
        .agent
        .take(index)
        .and_then(|l| tcp_into_monoio(l).ok())
    {
        let (w, s) = (worker.clone(), stop.clone());
        worker.spawn(async move {
            let _ = accept_loop(&l, &s, |sock: TcpStream| {
                let _ = sock.set_nodelay(true);
                serve_agent(&w, sock);
            })
            .await;
        });
    }

    // Frontends, one listener per cluster.
    let w = Rc::downgrade(&worker);
    let migrate: Rc<dyn Fn(usize, Migrant)> = Rc::new(move |to, m| {
        let Some(w) = w.upgrade() else { return };
        if w.out.send(to, Msg::Adopt(Box::new(m))).is_err() {
            // Only while stopping: that worker's connections close too.
            tracing::debug!(worker = to, "frontend not handed to a stopped worker");
        }
    });
    for start in starts.iter() {
        start_cluster(&worker, start, &stop, &migrate);
    }

    // Cross-core messages until stopped.
    if let Some(mut inbox) = ctx.take_inbox() {
        let w = worker.clone();
        let m = migrate.clone();
        let s = stop.clone();
        inbox
            .serve(&worker_stop, 64, move |msg| match msg {
                Msg::Cluster { cluster, msg } => w.cluster_message(cluster, msg),
                Msg::Adopt(m2) => {
                    adopt(&w, *m2, m.clone());
                }
                Msg::Shutdown => stop_connections(&w, Stop::Graceful),
                Msg::ClusterUp(start) => start_cluster(&w, &start, &s, &m),
                Msg::ClusterDown(id) => w.remove_cluster(id),
            })
            .await;
    } else {
        worker_stop.stopped().await;
    }
    // Stopping: close every connection now and wait (bounded) for their
    // tasks, so nothing of this worker outlives its runtime.
    worker.stopped.set(true);
    worker.stopping.notify_all();
    stop_connections(&worker, Stop::Now);
    stop.close().await;
    // Every task, not only the registered connections: one accepted just
    // now registers late (and is stopped by `Worker::track`).
    let deadline = monoio::time::Instant::now() + STOP_WAIT;
    while worker.tasks.live.get() > 0 {
        let ended = worker.tasks.ended.notified();
        if let Either::Right(()) = race(ended, monoio::time::sleep_until(deadline)).await {
            break;
        }
    }
    let left = worker.tasks.live.get();
    if left > 0 {
        tracing::warn!(
            worker = index,
            left,
            connections = worker.connections.borrow().len(),
            "tasks still running when the worker stopped"
        );
    }
}

/// Serve a cluster on this worker: its state, its frontend listener.
fn start_cluster(
    worker: &Rc<Worker>,
    start: &ClusterStart,
    stop: &StopToken,
    migrate: &Rc<dyn Fn(usize, Migrant)>,
) {
    let index = worker.index;
    let Some(core_metrics) = start.metrics.core(index) else {
        tracing::error!(worker = index, "no metrics slab for this worker");
        return;
    };
    let auth = start.reviewer.clone().map(|(reviewer, timeout)| {
        crate::auth::Auth::new(reviewer, worker.mesh.clone(), index, start.id, timeout)
    });
    let cluster = Cluster::new(
        start.id,
        index,
        start.settings.clone(),
        core_metrics,
        start.metrics.clone(),
        auth,
    );
    worker.add_cluster(cluster.clone());
    if let Some(l) = start
        .listeners
        .take_tcp(index)
        .and_then(|l| tcp_into_monoio(l).ok())
    {
        let (w, c, m, s) = (
            worker.clone(),
            cluster.clone(),
            migrate.clone(),
            stop.clone(),
        );
        worker.spawn(async move {
            let accept = accept_loop(&l, &s, |sock: TcpStream| {
                let _ = sock.set_nodelay(true);
                serve_frontend(&w, c.clone(), FrontSock::Tcp(sock), m.clone());
            });
            let _ = race(accept, c.stopping.wait()).await;
        });
    }
    if let Some(l) = start
        .listeners
        .unix()
        .and_then(|l| unix_into_monoio(l).ok())
    {
        let (w, c, m, s) = (
            worker.clone(),
            cluster.clone(),
            migrate.clone(),
            stop.clone(),
        );
        worker.spawn(async move {
            let accept = accept_loop(&l, &s, |sock: UnixStream| {
                serve_frontend(&w, c.clone(), FrontSock::Unix(sock), m.clone());
            });
            let _ = race(accept, c.stopping.wait()).await;
        });
    }
}

/// How long a stopping worker waits for its tasks to end.
const STOP_WAIT: Duration = Duration::from_secs(2);

/// The longest the router's timer sleeps: deadlines that appear meanwhile
/// are seen at most this late.
const TIMER_TICK: Duration = Duration::from_secs(1);

/// The router's deadlines: pending dials that time out, frontends that
/// drained nothing for the stuck timeout (both checked at least every
/// [`TIMER_TICK`]), and the resume timers (ACKs due by time, lingering
/// closes, parked tunnels' windows), which wake it on their own: an agent
/// packet that leaves an ACK owed pokes it ([`Worker::poke_timer`]), and
/// between two full turns only the resume timers run (they cost
/// O(tunnels owing one), the full turn O(frontends)). Ends when the
/// worker stops.
async fn router_timer(worker: Rc<Worker>) {
    let mut full_at = konn_core::io::clock::now();
    while !worker.stopped.get() {
        let now = konn_core::io::clock::now();
        let full = now >= full_at;
        let clusters: Vec<Rc<Cluster>> = worker.clusters.borrow().values().cloned().collect();
        let mut flows: Option<std::time::Instant> = None;
        let mut resume: Option<std::time::Instant> = None;
        let min = |a: Option<std::time::Instant>, b: Option<std::time::Instant>| match (a, b) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        for c in clusters {
            crate::resume::expire(&worker, &c, now);
            if full {
                c.router.borrow_mut().handle_timeout(now);
            } else {
                c.router.borrow_mut().handle_resume_timeout(now);
            }
            c.apply(&worker);
            if full {
                c.publish(&worker);
            }
            let r = c.router.borrow();
            flows = min(flows, r.flows_poll_timeout());
            resume = min(resume, r.resume_poll_timeout());
        }
        if full {
            crate::accounting::tick(&worker, now);
            full_at = flows.map_or(now + TIMER_TICK, |d| d.min(now + TIMER_TICK));
        }
        let wake = min(Some(full_at), resume).unwrap_or(full_at);
        worker.timer_at.set(Some(wake));
        let wait = wake
            .saturating_duration_since(now)
            .clamp(Duration::from_millis(1), TIMER_TICK);
        let sleep = race(monoio::time::sleep(wait), worker.timer.notified());
        if let Either::Right(()) = race(sleep, worker.stopping.wait()).await {
            return;
        }
    }
}

/// Ask every connection of this worker to stop.
fn stop_connections(worker: &Worker, how: Stop) {
    // The closures only poke weak handles; a connection may end (and
    // unregister) while others are asked, so look each one up again.
    let all: Vec<u64> = worker.connections.borrow().keys().copied().collect();
    for id in all {
        let conns = worker.connections.borrow();
        if let Some(f) = conns.get(&id) {
            f(how);
        }
    }
}

/// One cluster's agents as `/debug/backends` shows them.
fn backend_infos(cluster: &Cluster) -> Vec<BackendInfo> {
    let router = cluster.router.borrow();
    let loads = cluster.loads.borrow();
    router
        .directory()
        .entries()
        .map(|e| {
            let (open, pending) = loads.get(&e.id).map_or((0, 0), |l| l.get());
            BackendInfo {
                agent_id: e.agent_id.clone(),
                identifiers: BackendIdentifiers {
                    host: e.identifiers.host.clone(),
                    ipv4: e.identifiers.ipv4.clone(),
                    ipv6: e.identifiers.ipv6.clone(),
                    cidr: e.identifiers.cidr.clone(),
                    default_route: e.identifiers.default_route,
                },
                draining: e.draining,
                connections_open: open,
                connections_pending: pending,
                worker: e.core,
                limits: cluster
                    .settings
                    .router
                    .limits
                    .as_ref()
                    .filter(|l| l.enabled())
                    .map(|l| {
                        let (counted, refused) = l.agent_load(&e.agent_id);
                        (u64::from(counted), refused)
                    }),
            }
        })
        .collect()
}

/// The health and admin endpoints' view of a server with
/// `--clusters-config` (its directory replicas are complete on every
/// worker).
struct WorkerView(Rc<Worker>);

impl WorkerView {
    fn sorted(&self) -> Vec<Rc<Cluster>> {
        let mut all: Vec<Rc<Cluster>> = self.0.clusters.borrow().values().cloned().collect();
        all.sort_by(|a, b| a.name().cmp(b.name()));
        all
    }
}

impl crate::health::ClustersView for WorkerView {
    fn ready(&self) -> Result<(), String> {
        if self.0.shared.shutting_down.load(Ordering::Relaxed) {
            Err(crate::health::NOT_READY.to_owned())
        } else {
            Ok(())
        }
    }

    fn clusters_ready(&self) -> Vec<(String, Result<(), String>)> {
        let stopping = self.0.shared.shutting_down.load(Ordering::Relaxed);
        self.sorted()
            .iter()
            .map(|c| {
                let ready = !stopping && c.router.borrow().directory().is_ready();
                let r = if ready {
                    Ok(())
                } else {
                    Err(crate::health::NOT_READY.to_owned())
                };
                (c.name().to_owned(), r)
            })
            .collect()
    }

    fn scrape(&self) -> Vec<u8> {
        let all = self.sorted();
        let parts: Vec<(&str, &ServerMetrics)> =
            all.iter().map(|c| (c.name(), &c.all_metrics)).collect();
        self.0.all_metrics.scrape(&parts)
    }

    fn backends(&self) -> Vec<ClusterBackends> {
        self.sorted()
            .iter()
            .map(|c| ClusterBackends {
                name: c.name().to_owned(),
                agents: backend_infos(c),
                limits: LimitsInfo::of(c.settings.router.limits.as_deref()),
            })
            .collect()
    }
}

/// `/debug/backends` without `--clusters-config`: the one cluster.
struct FirstCluster(Rc<Worker>);

impl crate::health::BackendsSource for FirstCluster {
    fn backends(&self) -> Vec<BackendInfo> {
        self.0
            .first_cluster()
            .map(|c| backend_infos(&c))
            .unwrap_or_default()
    }

    fn limits(&self) -> Option<LimitsInfo> {
        let c = self.0.first_cluster()?;
        LimitsInfo::of(c.settings.router.limits.as_deref())
    }
}

/// Health and admin HTTP servers (on the worker that gets the listeners).
fn serve_http(worker: &Rc<Worker>, listeners: &Listeners, stop: &StopToken) {
    let multi = worker.settings.multi_cluster();
    let profiling = worker.settings.enable_profiling;
    let view: Rc<dyn crate::health::ClustersView> = Rc::new(WorkerView(worker.clone()));
    let registry = worker.all_metrics.registry().clone();
    let serve = |l: monoio::net::TcpListener, router: http1::Router| {
        let stop = stop.clone();
        let router = Rc::new(router);
        worker.spawn(async move {
            let _ = http1::serve(&l, &stop, router, Rc::new(http1::Config::default())).await;
        });
    };
    if let Some(l) = listeners
        .health
        .take()
        .and_then(|l| tcp_into_monoio(l).ok())
    {
        let router = if multi {
            crate::health::health_router_clusters(view.clone())
        } else {
            let w = worker.clone();
            let readiness = move || {
                let ready = !w.shared.shutting_down.load(Ordering::Relaxed)
                    && w.first_cluster()
                        .is_some_and(|c| c.router.borrow().directory().is_ready());
                if ready {
                    Ok(())
                } else {
                    Err(crate::health::NOT_READY.to_owned())
                }
            };
            crate::health::health_router(readiness, registry.clone())
        };
        serve(l, router);
    }
    if let Some(l) = listeners.admin.take().and_then(|l| tcp_into_monoio(l).ok()) {
        let router = if multi {
            crate::health::admin_router_clusters(view, profiling)
        } else {
            crate::health::admin_router(registry, FirstCluster(worker.clone()), profiling)
        };
        let w = worker.clone();
        let router = router.route("/debug/connections", move |req| {
            http1::Response::new(200)
                .with_header("Content-Type", "application/json")
                .with_body(crate::accounting::connections_json(&w, req.query()))
        });
        serve(l, router);
    }
}

/// Everything in a [`Migrant`] must be able to cross threads.
const _: fn() = || {
    fn send<T: Send>() {}
    send::<Migrant>();
};
