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
use konn_core::io::listen::{
    TcpListeners, UnixListenOptions, accept_loop, bind_unix, tcp_into_monoio, unix_into_monoio,
};
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

use crate::agents::AgentConn;
use crate::connect::{Head, Sock, Wire, read_head, serve_connect};
use crate::frontend::{FrontendConn, Plan};
use crate::health::{BackendIdentifiers, BackendInfo};
use crate::metrics::{ServerMetrics, Strategy as MetricStrategy};
use crate::settings::{FrontendListen, Mode, ServerSettings};
use crate::worker::{Msg, Outbox, Shared, Stop, Worker};
use konn_protocol::server::backends::Directory;
use konn_protocol::server::router::{Router, RouterConfig};

/// A socket in transit between workers.
pub enum MovingFd {
    /// A TCP connection.
    Tcp(DetachedTcp),
    /// A Unix-socket connection.
    Unix(DetachedUnix),
}

/// A frontend connection moving to another worker.
pub struct Migrant {
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
    /// A CONNECT whose head was read.
    Connect {
        /// TLS state (TCP frontends).
        tls: Option<TlsLayer>,
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
    listeners: Arc<Listeners>,
    kube: Option<crate::kube::KubeServices>,
}

impl ServerHandle {
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
        // The Unix-socket frontend listener is shared by every worker (TCP
        // listeners close with their accept loops): shut it down so new
        // clients are refused (ECONNREFUSED) instead of waiting unaccepted
        // in its backlog until the process exits.
        if let Some(l) = &self.listeners.frontend_unix
            && let Err(err) = socket2::SockRef::from(l).shutdown(std::net::Shutdown::Both)
        {
            tracing::warn!("cannot shut the frontend socket down: {err}");
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
        r
    }
}

impl Drop for ServerHandle {
    fn drop(&mut self) {
        let _ = self.stop_inner();
    }
}

/// Listeners created before the workers start, handed out per worker.
struct Listeners {
    agent: TcpListeners,
    frontend_tcp: Option<TcpListeners>,
    frontend_unix: Option<std::os::unix::net::UnixListener>,
    health: AtomicCell<Option<std::net::TcpListener>>,
    admin: AtomicCell<Option<std::net::TcpListener>>,
}

/// Bind every listener and start the workers.
pub fn start(settings: ServerSettings) -> Result<ServerHandle, Error> {
    let workers = settings.runtime.workers.max(1);
    let agent = TcpListeners::bind(settings.agent_addr, workers, 1024)?;
    let agent_addr = agent.local_addr();
    let (frontend_tcp, frontend_unix, frontend_addr, frontend_path) = match &settings.frontend {
        FrontendListen::Tcp(addr) => {
            let l = TcpListeners::bind(*addr, workers, 1024)?;
            let a = l.local_addr();
            (Some(l), None, Some(a), None)
        }
        FrontendListen::Unix(path) => {
            let opts = UnixListenOptions {
                remove_existing: settings.delete_existing_uds,
                mode: 0o770,
                backlog: 1024,
            };
            (
                None,
                Some(bind_unix(path, &opts)?),
                None,
                Some(path.clone()),
            )
        }
    };
    let bind_http = |addr: Option<SocketAddr>| -> Result<Option<std::net::TcpListener>, Error> {
        addr.map(|a| bind_tcp(a, 128, false)).transpose()
    };
    let health = bind_http(settings.health_addr)?;
    let admin = bind_http(settings.admin_addr)?;
    let health_addr = health.as_ref().and_then(|l| l.local_addr().ok());
    let admin_addr = admin.as_ref().and_then(|l| l.local_addr().ok());
    let listeners = Arc::new(Listeners {
        agent,
        frontend_tcp,
        frontend_unix,
        health: AtomicCell::new(health),
        admin: AtomicCell::new(admin),
    });
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
    let reviewer = kube.as_ref().and_then(|k| k.reviewer());
    let shared = Arc::new(Shared::default());
    let settings = Arc::new(settings);
    let listen_stop = Stopper::new();
    let (shared2, metrics2, stop2) = (shared.clone(), metrics.clone(), listen_stop.clone());
    let mut runtime = settings.runtime.clone();
    runtime.workers = workers;
    let listeners2 = listeners.clone();
    let workers = Workers::start(runtime, move |ctx| {
        worker_main(
            ctx,
            settings.clone(),
            listeners2.clone(),
            shared2.clone(),
            metrics2.clone(),
            stop2.clone(),
            reviewer.clone(),
        )
    })?;
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
        listeners,
        kube,
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
    shared: Arc<Shared>,
    metrics: ServerMetrics,
    listen_stop: Stopper,
    reviewer: Option<(konn_core::kube::review::TokenReviewer, Duration)>,
) {
    let index = ctx.index();
    let router = Router::new(
        RouterConfig {
            core: index,
            ..settings.router.clone()
        },
        Directory::new(settings.strategies.clone()),
    );
    let seed =
        (index as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ u64::from(std::process::id());
    let Some(core_metrics) = metrics.core(index) else {
        tracing::error!(worker = index, "no metrics slab for this worker");
        return;
    };
    let worker = Rc::new(Worker::new(
        index,
        router,
        settings.clone(),
        ctx.pool().clone(),
        shared,
        seed,
        core_metrics,
        metrics.clone(),
        ctx.mesh().clone(),
    ));
    worker.set_self();
    if let Some((reviewer, timeout)) = reviewer {
        let auth = crate::auth::Auth::new(reviewer, ctx.mesh().clone(), index, timeout);
        let _ = worker.auth.set(auth);
    }
    let workers = ctx.workers();
    let w = Rc::downgrade(&worker);
    let announce: Rc<dyn Fn(Msg)> = Rc::new(move |msg: Msg| {
        let Some(w) = w.upgrade() else { return };
        for to in (0..workers).filter(|w| *w != index) {
            let copy = match &msg {
                Msg::BackendUp(e, l) => Msg::BackendUp(e.clone(), l.clone()),
                Msg::BackendDown(b) => Msg::BackendDown(*b),
                Msg::BackendDraining(b) => Msg::BackendDraining(*b),
                _ => return,
            };
            if w.out.send(to, copy).is_err() {
                tracing::debug!(worker = to, "stopped worker not told of a backend change");
            }
        }
    });
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
        let (w, a, s) = (worker.clone(), announce.clone(), stop.clone());
        worker.spawn(async move {
            let _ = accept_loop(&l, &s, |sock: TcpStream| {
                let _ = sock.set_nodelay(true);
                w.spawn(serve_agent(w.clone(), sock, a.clone()));
            })
            .await;
        });
    }

    // Frontend.
    let w = Rc::downgrade(&worker);
    let migrate: Rc<dyn Fn(usize, Migrant)> = Rc::new(move |to, m| {
        let Some(w) = w.upgrade() else { return };
        if w.out.send(to, Msg::Adopt(Box::new(m))).is_err() {
            // Only while stopping: that worker's connections close too.
            tracing::debug!(worker = to, "frontend not handed to a stopped worker");
        }
    });
    if let Some(tcp) = &listeners.frontend_tcp
        && let Some(l) = tcp.take(index).and_then(|l| tcp_into_monoio(l).ok())
    {
        let (w, m, s) = (worker.clone(), migrate.clone(), stop.clone());
        worker.spawn(async move {
            let _ = accept_loop(&l, &s, |sock: TcpStream| {
                let _ = sock.set_nodelay(true);
                w.spawn(serve_frontend(w.clone(), FrontSock::Tcp(sock), m.clone()));
            })
            .await;
        });
    }
    if let Some(unix) = &listeners.frontend_unix
        && let Some(l) = unix.try_clone().ok().and_then(|l| unix_into_monoio(l).ok())
    {
        let (w, m, s) = (worker.clone(), migrate.clone(), stop.clone());
        worker.spawn(async move {
            let _ = accept_loop(&l, &s, |sock: UnixStream| {
                w.spawn(serve_frontend(w.clone(), FrontSock::Unix(sock), m.clone()));
            })
            .await;
        });
    }

    // Cross-core messages until stopped.
    if let Some(mut inbox) = ctx.take_inbox() {
        let w = worker.clone();
        let m = migrate.clone();
        inbox
            .serve(&worker_stop, 64, move |msg| match msg {
                Msg::Adopt(m2) => {
                    w.spawn(adopt(w.clone(), *m2, m.clone()));
                }
                Msg::Shutdown => stop_connections(&w, Stop::Graceful),
                other => w.on_message(other),
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

/// How long a stopping worker waits for its tasks to end.
const STOP_WAIT: Duration = Duration::from_secs(2);

/// The longest the router's timer sleeps: deadlines that appear meanwhile
/// are seen at most this late.
const TIMER_TICK: Duration = Duration::from_secs(1);

/// The router's deadlines: pending dials that time out, and frontends
/// that drained nothing for the stuck timeout. Ends when the worker stops.
async fn router_timer(worker: Rc<Worker>) {
    while !worker.stopped.get() {
        let now = konn_core::io::clock::now();
        worker.router.borrow_mut().handle_timeout(now);
        worker.apply();
        worker.publish();
        let next = worker.router.borrow().poll_timeout();
        let wait = next.map_or(TIMER_TICK, |d| {
            d.saturating_duration_since(now)
                .clamp(Duration::from_millis(1), TIMER_TICK)
        });
        if let Either::Right(()) = race(monoio::time::sleep(wait), worker.stopping.wait()).await {
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

/// Health and admin HTTP servers (on the worker that gets the listeners).
fn serve_http(worker: &Rc<Worker>, listeners: &Listeners, stop: &StopToken) {
    let registry = worker.all_metrics.registry().clone();
    if let Some(l) = listeners
        .health
        .take()
        .and_then(|l| tcp_into_monoio(l).ok())
    {
        let w = worker.clone();
        let readiness = move || {
            let ready = !w.shared.shutting_down.load(Ordering::Relaxed)
                && w.router.borrow().directory().is_ready();
            if ready {
                Ok(())
            } else {
                Err(crate::health::NOT_READY.to_owned())
            }
        };
        let router = Rc::new(crate::health::health_router(readiness, registry.clone()));
        let stop = stop.clone();
        worker.spawn(async move {
            let _ = http1::serve(&l, &stop, router, Rc::new(http1::Config::default())).await;
        });
    }
    if let Some(l) = listeners.admin.take().and_then(|l| tcp_into_monoio(l).ok()) {
        let w = worker.clone();
        let backends = move || {
            let router = w.router.borrow();
            let loads = w.loads.borrow();
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
                    }
                })
                .collect()
        };
        let profiling = worker.settings.enable_profiling;
        let router = Rc::new(crate::health::admin_router(registry, backends, profiling));
        let stop = stop.clone();
        worker.spawn(async move {
            let _ = http1::serve(&l, &stop, router, Rc::new(http1::Config::default())).await;
        });
    }
}

/// Remember a connection for a graceful shutdown; forget it when it ends.
fn register<H: Handler<Grpc> + 'static>(worker: &Worker, handle: &ConnHandle<Grpc, H>) -> u64 {
    let id = worker.next_id();
    let weak = handle.downgrade();
    worker.track(
        id,
        Box::new(move |how| {
            if let Some(h) = weak.upgrade() {
                match how {
                    Stop::Graceful => h.shutdown(),
                    Stop::Now => h.abort(),
                }
            }
        }),
    );
    id
}

async fn serve_agent(worker: Rc<Worker>, sock: TcpStream, announce: Rc<dyn Fn(Msg)>) {
    let s = &worker.settings;
    let tls = match s.agent_tls.as_ref().map(|t| t.layer()).transpose() {
        Ok(t) => t,
        Err(e) => {
            tracing::warn!(error = %e, "agent TLS setup failed");
            return;
        }
    };
    let grpc = Grpc::new(
        Connection::new(s.agent_h2(), konn_core::io::clock::now()),
        s.max_message,
    );
    let outbox = Rc::new(Outbox::new());
    let handle = ConnHandle::new(
        grpc,
        tls,
        AgentConn::new(worker.clone(), outbox.clone(), announce),
        s.driver,
    );
    install_poke(&outbox, &handle);
    let id = register(&worker, &handle);
    if let Err(e) = handle.run(sock).await {
        tracing::debug!(error = %e, "agent connection ended");
    }
    worker.connections.borrow_mut().remove(&id);
}

/// The outbox of a connection flushes itself by poking its driver.
fn install_poke<H: Handler<Grpc> + 'static>(outbox: &Outbox, handle: &ConnHandle<Grpc, H>) {
    let weak = handle.downgrade();
    outbox.set_poke(Box::new(move || {
        if let Some(h) = weak.upgrade() {
            let _ = h.with(|_, _| ());
        }
    }));
}

/// A frontend socket of either kind.
enum FrontSock {
    Tcp(TcpStream),
    Unix(UnixStream),
}

async fn serve_frontend(worker: Rc<Worker>, sock: FrontSock, migrate: Rc<dyn Fn(usize, Migrant)>) {
    let s = worker.settings.clone();
    let tls = match (&sock, s.frontend_tls.as_ref()) {
        (FrontSock::Tcp(_), Some(t)) => match t.layer() {
            Ok(l) => Some(l),
            Err(e) => {
                tracing::warn!(error = %e, "frontend TLS setup failed");
                return;
            }
        },
        _ => None,
    };
    match s.mode {
        Mode::Grpc => {
            let grpc = Grpc::new(
                Connection::new(s.frontend_h2(), konn_core::io::clock::now()),
                s.max_message,
            );
            match sock {
                FrontSock::Tcp(t) => run_grpc_frontend(worker, t, grpc, tls, None, migrate).await,
                FrontSock::Unix(u) => run_grpc_frontend(worker, u, grpc, tls, None, migrate).await,
            }
        }
        Mode::HttpConnect => {
            let wire = Wire::new(
                match sock {
                    FrontSock::Tcp(t) => Sock::Tcp(t),
                    FrontSock::Unix(u) => Sock::Unix(u),
                },
                tls,
                BytesMut::new(),
            );
            // Boxed: the CONNECT state is larger than the gRPC one and
            // would otherwise size every gRPC frontend's task.
            Box::pin(connect_frontend(worker, wire, migrate)).await;
        }
    }
}

/// Sockets a frontend can move with.
trait Movable: Split + AsyncReadRent + AsyncWriteRent + ReadReady + Sized + 'static {
    /// Detach for a move; on failure the socket comes back, to be served
    /// where it is.
    fn detach(self) -> Result<MovingFd, (Self, Error)>;
}

impl Movable for TcpStream {
    fn detach(self) -> Result<MovingFd, (Self, Error)> {
        detach_tcp(self).map(MovingFd::Tcp)
    }
}

impl Movable for UnixStream {
    fn detach(self) -> Result<MovingFd, (Self, Error)> {
        detach_unix(self).map(MovingFd::Unix)
    }
}

/// Run a gRPC frontend connection; move it when its first dial says so.
/// `resumed` carries the state of a connection that moved here.
///
/// The set-up is synchronous and only the driver loop is async, so the
/// task's state does not keep room for `grpc` and `tls` after they moved
/// into the driver (an `async fn` keeps its arguments' slots alive: 2.4 KiB
/// per idle connection).
fn run_grpc_frontend<IO: Movable>(
    worker: Rc<Worker>,
    io: IO,
    grpc: Grpc,
    tls: Option<TlsLayer>,
    resumed: Option<((BytesMut, BytesMut), Plan)>,
    migrate: Rc<dyn Fn(usize, Migrant)>,
) -> impl Future<Output = ()> {
    let s = worker.settings.clone();
    let outbox = Rc::new(Outbox::new());
    let plan = Rc::new(RefCell::new(None));
    let mut handler = FrontendConn::new(worker.clone(), outbox.clone(), plan.clone());
    let (handle, replay) = match resumed {
        Some((input, moved)) => {
            handler.adopt(&moved.streams);
            // A connection moves at most once.
            handler.no_more_moves();
            (
                ConnHandle::resume(grpc, tls, input, handler, s.driver),
                moved.stashed,
            )
        }
        None => (ConnHandle::new(grpc, tls, handler, s.driver), Vec::new()),
    };
    // The driver's own detach flag is the one the handler sets.
    let flag = handle.detach_flag();
    let _ = handle.with(|_, h| h.set_detach_flag(flag));
    install_poke(&outbox, &handle);
    let id = register(&worker, &handle);
    if !replay.is_empty() {
        let _ = handle.with(|g, h| {
            for ev in replay {
                h.on_event(g, ev);
            }
        });
    }
    async move {
        let outcome = handle.run_detachable(io).await;
        worker.connections.borrow_mut().remove(&id);
        match outcome {
            Ok(Some(detached)) => {
                let Some(plan) = plan.borrow_mut().take() else {
                    return;
                };
                let target = plan.target;
                match detached.io.detach() {
                    Ok(fd) => migrate(
                        target,
                        Migrant {
                            fd,
                            kind: MigrantKind::Grpc {
                                session: Box::new(detached.session),
                                tls: detached.tls,
                                input: detached.input,
                                plan,
                            },
                        },
                    ),
                    Err((io, e)) => {
                        // Served here after all; its flows are relayed.
                        tracing::debug!(error = %e, "frontend connection cannot move; serving it here");
                        let here = run_grpc_frontend(
                            worker.clone(),
                            io,
                            detached.session,
                            detached.tls,
                            Some((detached.input, plan)),
                            migrate,
                        );
                        Box::pin(here).await;
                    }
                }
            }
            Ok(None) => {}
            Err(e) => tracing::debug!(error = %e, "frontend connection ended"),
        }
    }
}

async fn connect_frontend(worker: Rc<Worker>, mut wire: Wire, migrate: Rc<dyn Fn(usize, Migrant)>) {
    if worker.stopped.get() {
        return;
    }
    let head = race(
        read_head(&mut wire, worker.settings.connect_header_timeout),
        worker.stopping.wait(),
    )
    .await;
    let target = match head {
        Either::Left(Head::Connect(t)) => t,
        Either::Left(Head::Done) | Either::Right(()) => return,
    };
    let core = {
        let router = worker.router.borrow();
        router
            .directory()
            .pick(&target, worker.random(), worker.index)
            .map(|e| e.core)
    };
    match core {
        Some(to) if to != worker.index => {
            let (sock, tls, plain) = wire.into_parts();
            let fd = match sock {
                Sock::Tcp(t) => t.detach().map_err(|(t, e)| (Sock::Tcp(t), e)),
                Sock::Unix(u) => u.detach().map_err(|(u, e)| (Sock::Unix(u), e)),
            };
            match fd {
                Ok(fd) => migrate(
                    to,
                    Migrant {
                        fd,
                        kind: MigrantKind::Connect { tls, plain, target },
                    },
                ),
                Err((sock, e)) => {
                    // Served here after all; its flow is relayed.
                    tracing::debug!(error = %e, "CONNECT connection cannot move; serving it here");
                    serve_connect(worker, Wire::new(sock, tls, plain), target).await;
                }
            }
        }
        _ => serve_connect(worker, wire, target).await,
    }
}

/// Continue a frontend that moved to this worker.
async fn adopt(worker: Rc<Worker>, m: Migrant, migrate: Rc<dyn Fn(usize, Migrant)>) {
    match (m.fd, m.kind) {
        (
            fd,
            MigrantKind::Grpc {
                session,
                tls,
                input,
                plan,
            },
        ) => match fd {
            MovingFd::Tcp(f) => match f.attach() {
                Ok(sock) => {
                    run_grpc_frontend(worker, sock, *session, tls, Some((input, plan)), migrate)
                        .await
                }
                Err(e) => tracing::warn!(error = %e, "could not adopt a frontend"),
            },
            MovingFd::Unix(f) => match f.attach() {
                Ok(sock) => {
                    run_grpc_frontend(worker, sock, *session, tls, Some((input, plan)), migrate)
                        .await
                }
                Err(e) => tracing::warn!(error = %e, "could not adopt a frontend"),
            },
        },
        (fd, MigrantKind::Connect { tls, plain, target }) => {
            let sock = match fd {
                MovingFd::Tcp(f) => f.attach().map(Sock::Tcp),
                MovingFd::Unix(f) => f.attach().map(Sock::Unix),
            };
            match sock {
                Ok(sock) => {
                    // Boxed for the reason given in `serve_frontend`.
                    Box::pin(serve_connect(worker, Wire::new(sock, tls, plain), target)).await
                }
                Err(e) => tracing::warn!(error = %e, "could not adopt a CONNECT connection"),
            }
        }
    }
}

/// Everything in a [`Migrant`] must be able to cross threads.
const _: fn() = || {
    fn send<T: Send>() {}
    send::<Migrant>();
};
