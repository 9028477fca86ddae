//! The running proxy-agent: worker threads, the tunnels to the
//! proxy-servers, the sync loop that keeps one tunnel per server, DRAIN,
//! and the health and admin ports.
//!
//! ```text
//!   main thread ── drain()/stop() ──┐        (signals: see main.rs)
//!                                   ▼ mesh
//!  worker 0: sync loop (ServerSet) ──Open/Close──► worker k: tunnel attempt
//!            health + admin HTTP    ◄──Report────        │ dial, TLS, Connect
//!                                                       ▼
//!                                  TunnelHandler + its endpoints (worker k)
//! ```
//!
//! **Placement.** Worker 0 runs the sync loop ([`konn_protocol::agent::sync`]) and the two
//! HTTP servers. Each tunnel attempt is placed on the worker holding the
//! fewest tunnels, ties broken round-robin (so with tunnels that never end
//! this is plain round-robin, and a worker that lost its tunnel gets the
//! replacement). A tunnel's endpoints live on its worker, so one tunnel's
//! traffic never crosses cores; only connection-level events do.
//!
//! **Messages** ([`Msg`], through `io::xcore`): the sync loop sends `Open`
//! and `Close` to a worker; every worker sends each tunnel's `Report`s to
//! worker 0: `Connected` (response headers), `Rejected`/`Failed` (the
//! attempt failed), and exactly one `Ended` when the attempt is over,
//! however it ended. Reports of one tunnel arrive in order, so `Ended` is
//! always last.
//!
//! **Drain** ([`AgentHandle::drain`], the first SIGTERM/SIGINT): the
//! draining flag is set, which stops the sync loop connecting, and every
//! worker sends DRAIN on each of its tunnels, including one still being
//! opened (it sends DRAIN as soon as its Connect call exists). Tunnels
//! keep serving.
//!
//! **Stop** ([`AgentHandle::stop`], the second signal): every worker closes
//! its tunnels (cancel the Connect call, GOAWAY), waits until they and
//! their endpoints are gone (bounded by [`AgentSettings::stop_timeout`]),
//! and returns; the HTTP servers end their connections.
//!
//! **Metrics.** Packets, dial outcomes and endpoints are counted per core
//! by a [`TunnelObserver`] over the worker's [`AgentCoreMetrics`] (no
//! shared atomics on the data path); `open_server_connections` and
//! `known_server_count` are set by the sync loop. Readiness (`/readyz`) is
//! "at least one server in the set", read from an atomic the sync loop
//! maintains.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::fmt;
use std::net::{SocketAddr, TcpListener};
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use konn_core::Error;
use konn_core::http1::{self, Router};
use konn_core::io::listen::accept_loop;
use konn_core::io::listen::{bind_tcp, tcp_into_monoio};
use konn_core::io::notify::Notify;
use konn_core::io::pool::BufPool;
use konn_core::io::runtime::{Either, Engine, StopToken, WorkerCtx, Workers, race};
use konn_core::io::xcore::{DetachedTcp, MeshSender, detach_tcp};
use konn_frames::GrpcStatus;
use konn_frames::packet::PacketType;
use konn_protocol::h2;

use crate::client::{TunnelHandle, open_tunnel_with};
use crate::conn::{TunnelEvent, TunnelHandler, TunnelObserver};
use crate::health::{admin_router, health_router};
use crate::metrics::{
    AgentCoreMetrics, AgentMetrics, DialFailureReason, Direction, ReverseRefusal, Segment,
};
use crate::settings::AgentSettings;
use konn_core::metrics::common::{ReverseDirection, ReverseResult};
use konn_protocol::agent::sync::{Admission, Outcome, Rng, Round, ServerSet, TunnelId};
use konn_protocol::agent::tunnel::DialFailure;

/// Messages between the agent's workers (see the module docs).
#[derive(Debug)]
pub enum Msg {
    /// Open tunnel `0` on the receiving worker.
    Open(TunnelId),
    /// Close tunnel `0` (duplicate, no answer in time).
    Close(TunnelId),
    /// Send DRAIN on every tunnel of the receiving worker, now and later.
    Drain,
    /// What happened to a tunnel (to worker 0).
    Report(TunnelId, Report),
    /// A connection accepted on `--target` listener `1` of a worker with
    /// no tunnel that offers the reverse direction, for one that has
    /// (`crate::reverse`).
    Reverse(DetachedTcp, usize),
    /// The number of valid server Leases changed (to worker 0, from the
    /// lease counter; `crate::leases`).
    LeaseCount(usize),
}

/// A tunnel's news for the sync loop.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Report {
    /// The server answered the Connect call.
    Connected {
        /// `serverid`.
        server_id: String,
        /// `servercount`.
        server_count: usize,
    },
    /// The server refused the call, or its headers were malformed.
    Rejected(String),
    /// The tunnel could not be opened (dial, token file).
    Failed(String),
    /// The attempt is over: last report of every tunnel.
    Ended,
}

/// Process-wide facts (connection-level updates only).
#[derive(Debug, Default)]
struct Shared {
    /// Servers in the set (readiness).
    connected: AtomicUsize,
    /// The count the sync loop aims at.
    known_server_count: AtomicUsize,
    draining: AtomicBool,
    /// Tunnels attempted.
    attempts: AtomicU64,
    /// Attempts answered by a server already held.
    duplicates: AtomicU64,
    /// Attempts that failed or timed out.
    failures: AtomicU64,
    /// Per worker: tunnels that offer the reverse direction.
    reverse_tunnels: Vec<AtomicUsize>,
}

/// A snapshot of the sync loop's state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AgentStatus {
    /// Servers the agent holds a tunnel to.
    pub connected_servers: usize,
    /// The server count the agent aims at (`known_server_count`).
    pub known_server_count: usize,
    /// DRAIN was requested.
    pub draining: bool,
    /// Tunnels attempted so far.
    pub attempts: u64,
    /// Attempts that reached a server already held (and were closed).
    pub duplicates: u64,
    /// Attempts that failed or got no answer in time.
    pub failures: u64,
}

/// What every worker shares.
struct Inner {
    settings: AgentSettings,
    metrics: AgentMetrics,
    shared: Arc<Shared>,
    health: Option<TcpListener>,
    admin: Option<TcpListener>,
    health_port: u16,
    /// `--target` listeners (and the address added for them).
    reverse: Option<crate::reverse::Listeners>,
}

/// A running agent. Dropping it stops it.
pub struct AgentHandle {
    workers: Option<Workers<Msg>>,
    /// The Kubernetes client thread (lease counting).
    kube: Option<konn_core::kube::ControlPlane>,
    shared: Arc<Shared>,
    metrics: AgentMetrics,
    health_addr: Option<SocketAddr>,
    admin_addr: Option<SocketAddr>,
}

impl fmt::Debug for AgentHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AgentHandle")
            .field("status", &self.status())
            .field("health_addr", &self.health_addr)
            .field("admin_addr", &self.admin_addr)
            .finish_non_exhaustive()
    }
}

impl AgentHandle {
    /// The health port's bound address.
    pub fn health_addr(&self) -> Option<SocketAddr> {
        self.health_addr
    }

    /// The admin port's bound address.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin_addr
    }

    /// The metrics.
    pub fn metrics(&self) -> &AgentMetrics {
        &self.metrics
    }

    /// The engine the workers run on.
    pub fn engine(&self) -> Option<Engine> {
        self.workers.as_ref().map(|w| w.engine().engine())
    }

    /// The sync loop's state now.
    pub fn status(&self) -> AgentStatus {
        let s = &self.shared;
        AgentStatus {
            connected_servers: s.connected.load(Ordering::Acquire),
            known_server_count: s.known_server_count.load(Ordering::Acquire),
            draining: s.draining.load(Ordering::Acquire),
            attempts: s.attempts.load(Ordering::Relaxed),
            duplicates: s.duplicates.load(Ordering::Relaxed),
            failures: s.failures.load(Ordering::Relaxed),
        }
    }

    /// Ready: at least one server tunnel is connected (`/readyz`).
    pub fn is_ready(&self) -> bool {
        self.shared.connected.load(Ordering::Acquire) > 0
    }

    /// Start draining (first shutdown signal): DRAIN on every tunnel, no new
    /// server connections; tunnels keep serving. Idempotent.
    pub fn drain(&self) {
        if self.shared.draining.swap(true, Ordering::AcqRel) {
            return;
        }
        let Some(workers) = &self.workers else { return };
        for worker in 0..workers.len() {
            if workers.mesh().send(worker, Msg::Drain).is_err() {
                tracing::warn!(worker, "could not ask a worker to drain");
            }
        }
    }

    /// Stop: close every tunnel and wait for the workers.
    ///
    /// # Errors
    ///
    /// A worker panicked.
    pub fn stop(mut self) -> Result<(), Error> {
        self.stop_inner()
    }

    fn stop_inner(&mut self) -> Result<(), Error> {
        if let Some(k) = self.kube.take() {
            k.stop();
        }
        match self.workers.take() {
            Some(w) => {
                w.stop();
                w.join()
            }
            None => Ok(()),
        }
    }
}

impl Drop for AgentHandle {
    fn drop(&mut self) {
        let _ = self.stop_inner();
    }
}

/// Bind the first address of `addrs` that works.
fn bind_first(addrs: &[SocketAddr]) -> Result<Option<TcpListener>, Error> {
    let mut last = None;
    for addr in addrs {
        match bind_tcp(*addr, 128, false) {
            Ok(l) => return Ok(Some(l)),
            Err(e) => last = Some(e),
        }
    }
    last.map_or(Ok(None), Err)
}

/// Bind the health and admin ports and start the workers; the sync loop
/// starts connecting at once.
///
/// # Errors
///
/// A port cannot be bound ([`Error::Bind`]), or the runtime cannot start.
pub fn start(settings: AgentSettings) -> Result<AgentHandle, Error> {
    let health = bind_first(&settings.health)?;
    let admin = bind_first(&settings.admin)?;
    let health_addr = health.as_ref().and_then(|l| l.local_addr().ok());
    let admin_addr = admin.as_ref().and_then(|l| l.local_addr().ok());
    let workers = settings.runtime.workers.max(1);
    let metrics = AgentMetrics::new(workers);
    // Present from the first scrape (tooling reads it as soon as /healthz
    // answers); the sync loop keeps it current.
    metrics.set_open_server_connections(0);
    let lease_counting = settings.lease_counting.clone();
    let reverse = crate::reverse::Listeners::bind(&settings.reverse, workers)?;
    let shared = Arc::new(Shared {
        reverse_tunnels: (0..workers).map(|_| AtomicUsize::new(0)).collect(),
        ..Shared::default()
    });
    let mut runtime = settings.runtime.clone();
    runtime.workers = workers;
    let inner = Arc::new(Inner {
        settings,
        metrics: metrics.clone(),
        shared: shared.clone(),
        health,
        admin,
        health_port: health_addr.map_or(0, |a| a.port()),
        reverse,
    });
    let workers = Workers::start(runtime, move |ctx| worker_main(ctx, inner.clone()))?;
    let kube = match &lease_counting {
        Some(l) => match crate::leases::start(l, workers.mesh().clone(), metrics.clone()) {
            Ok(k) => Some(k),
            Err(e) => {
                workers.stop();
                let _ = workers.join();
                return Err(e);
            }
        },
        None => None,
    };
    tracing::info!(
        ?health_addr,
        ?admin_addr,
        workers = workers.len(),
        "proxy-agent started"
    );
    Ok(AgentHandle {
        workers: Some(workers),
        kube,
        shared,
        metrics,
        health_addr,
        admin_addr,
    })
}

/// One tunnel attempt on a worker.
enum Slot {
    /// Dialling; notify to give up.
    Dialing(Rc<Notify>),
    /// Open (handshaking or connected).
    Running(TunnelHandle),
}

/// One worker's state.
struct Worker {
    inner: Arc<Inner>,
    h2: h2::Config,
    pool: BufPool,
    mesh: MeshSender<Msg>,
    observer: Rc<CoreObserver>,
    slots: RefCell<HashMap<TunnelId, Slot>>,
    draining: Cell<bool>,
    /// Attempt tasks still running.
    live: Cell<usize>,
    /// This worker's index.
    index: usize,
    /// Random numbers for reverse connections (which tunnel, dial ids).
    rng: RefCell<Rng>,
}

async fn worker_main(mut ctx: WorkerCtx<Msg>, inner: Arc<Inner>) {
    let index = ctx.index();
    let stop = ctx.stop_token().clone();
    let worker = Rc::new(Worker {
        h2: inner.settings.h2_config(),
        pool: ctx.pool().clone(),
        mesh: ctx.mesh().clone(),
        observer: Rc::new(CoreObserver::new(inner.metrics.core(index))),
        slots: RefCell::new(HashMap::new()),
        draining: Cell::new(false),
        live: Cell::new(0),
        index,
        rng: RefCell::new(Rng::new(konn_core::io::clock::seed())),
        inner: inner.clone(),
    });
    let mut tasks = Vec::new();
    if let Some(listeners) = &inner.reverse {
        for (target, l) in listeners.per_target.iter().enumerate() {
            let Some(l) = l.take(index).and_then(|l| tcp_into_monoio(l).ok()) else {
                continue;
            };
            let (w, stop) = (worker.clone(), stop.clone());
            tasks.push(Some(monoio::spawn(async move {
                let _ = accept_loop(&l, &stop, |sock| w.reverse_accept(sock, target, true)).await;
            })));
        }
    }
    let controller =
        (index == 0).then(|| Rc::new(Controller::new(&inner, ctx.mesh().clone(), ctx.workers())));
    if let Some(ctl) = &controller {
        tasks.push(spawn_http(&inner, &stop, true));
        tasks.push(spawn_http(&inner, &stop, false));
        let (ctl, stop) = (ctl.clone(), stop.clone());
        tasks.push(Some(monoio::spawn(async move { ctl.run(&stop).await })));
    }
    if let Some(mut inbox) = ctx.take_inbox() {
        let w = worker.clone();
        inbox
            .serve(&stop, 64, move |msg| match msg {
                Msg::Open(tunnel) => w.open(tunnel),
                Msg::Close(tunnel) => w.close(tunnel),
                Msg::Drain => {
                    w.drain();
                    if let Some(ctl) = &controller {
                        ctl.set.borrow_mut().set_draining();
                    }
                }
                Msg::Report(tunnel, report) => {
                    if let Some(ctl) = &controller {
                        ctl.on_report(tunnel, report);
                    }
                }
                Msg::Reverse(fd, target) => match fd.attach() {
                    Ok(sock) => w.reverse_accept(sock, target, false),
                    Err(e) => {
                        tracing::debug!(error = %e, "could not take over a reverse connection")
                    }
                },
                Msg::LeaseCount(n) => {
                    if let Some(ctl) = &controller {
                        ctl.on_lease_count(n);
                    }
                }
            })
            .await;
    } else {
        stop.stopped().await;
    }
    worker.close_all();
    worker.wait_idle(inner.settings.stop_timeout).await;
    for task in tasks.into_iter().flatten() {
        task.await;
    }
}

/// Serve the health (`true`) or admin port on this worker until stopped.
fn spawn_http(
    inner: &Arc<Inner>,
    stop: &StopToken,
    health: bool,
) -> Option<monoio::task::JoinHandle<()>> {
    let listener = if health { &inner.health } else { &inner.admin };
    let listener = listener.as_ref()?.try_clone().ok()?;
    let router: Router = if health {
        let shared = inner.shared.clone();
        health_router(
            move || shared.connected.load(Ordering::Acquire) > 0,
            inner.metrics.registry().clone(),
        )
    } else {
        admin_router(inner.health_port, inner.settings.enable_profiling)
    };
    let config = Rc::new(inner.settings.http.clone());
    let stop = stop.clone();
    Some(monoio::spawn(async move {
        let listener = match tcp_into_monoio(listener) {
            Ok(l) => l,
            Err(e) => {
                tracing::error!(error = %e, "health/admin server could not listen");
                return;
            }
        };
        if let Err(e) = http1::serve(&listener, &stop, Rc::new(router), config).await {
            tracing::error!(error = %e, "health/admin server stopped");
        }
    }))
}

impl Worker {
    /// Start tunnel attempt `tunnel` on this worker.
    fn open(self: &Rc<Self>, tunnel: TunnelId) {
        let cancel = Rc::new(Notify::new());
        self.slots
            .borrow_mut()
            .insert(tunnel, Slot::Dialing(cancel.clone()));
        self.live.set(self.live.get() + 1);
        monoio::spawn(self.clone().attempt(tunnel, cancel));
    }

    /// Close tunnel `tunnel` if it is still here. A tunnel still dialling
    /// loses its slot, so it is dropped even if its dial completes in the
    /// same instant.
    fn close(&self, tunnel: TunnelId) {
        let mut slots = self.slots.borrow_mut();
        let handle = match slots.get(&tunnel) {
            Some(Slot::Dialing(cancel)) => {
                cancel.notify();
                slots.remove(&tunnel);
                None
            }
            Some(Slot::Running(h)) => Some(h.clone()),
            None => None,
        };
        drop(slots);
        if let Some(h) = handle {
            let _ = h.with(|g, t| t.close(g));
        }
    }

    /// Send DRAIN on every tunnel here, and on those opened later.
    fn drain(&self) {
        self.draining.set(true);
        let running = self.running();
        tracing::info!(
            tunnels = running.len(),
            "sending DRAIN to the proxy-servers"
        );
        for h in running {
            let _ = h.with(|g, t| t.drain(g));
        }
    }

    /// Close everything (stop).
    fn close_all(&self) {
        let ids: Vec<TunnelId> = self.slots.borrow().keys().copied().collect();
        for id in ids {
            self.close(id);
        }
    }

    fn running(&self) -> Vec<TunnelHandle> {
        self.slots
            .borrow()
            .values()
            .filter_map(|s| match s {
                Slot::Running(h) => Some(h.clone()),
                Slot::Dialing(_) => None,
            })
            .collect()
    }

    /// Wait until no attempt and no endpoint is left, at most `limit`.
    async fn wait_idle(&self, limit: Duration) {
        let deadline = monoio::time::Instant::now() + limit;
        while self.live.get() > 0 || self.observer.endpoints.get() > 0 {
            let sleep = monoio::time::sleep_until(deadline);
            if let Either::Right(()) = race(self.observer.idle.notified(), sleep).await {
                tracing::warn!(
                    tunnels = self.live.get(),
                    endpoints = self.observer.endpoints.get(),
                    "stopping with tunnels or endpoints still closing"
                );
                return;
            }
        }
    }

    /// A connection accepted on `--target` listener `target`: a random
    /// tunnel of this worker that offers the reverse direction asks for it;
    /// with none here, it moves (`may_move`) to a worker that has one; with
    /// none anywhere it is closed and counted.
    fn reverse_accept(&self, sock: monoio::net::TcpStream, target: usize, may_move: bool) {
        // Small requests (kubelet's, a watch's) must not wait for Nagle.
        let _ = sock.set_nodelay(true);
        let Some(dest) = self.inner.settings.reverse.targets.get(target) else {
            return;
        };
        let tunnels: Vec<TunnelHandle> = self
            .running()
            .into_iter()
            .filter(|h| h.with(|_, t| t.reverse_ready()).unwrap_or(false))
            .collect();
        let (pick, random) = {
            let mut rng = self.rng.borrow_mut();
            (rng.next_u64(), (rng.next_u64() >> 1) as i64)
        };
        if tunnels.is_empty() {
            let others = &self.inner.shared.reverse_tunnels;
            let to = (0..others.len())
                .map(|i| (self.index + 1 + i) % others.len())
                .find(|w| *w != self.index && others[*w].load(Ordering::Acquire) > 0);
            if let (true, Some(to)) = (may_move, to) {
                match detach_tcp(sock) {
                    Ok(fd) => {
                        if self.mesh.send(to, Msg::Reverse(fd, target)).is_ok() {
                            return;
                        }
                        tracing::debug!(worker = to, "reverse connection not handed over");
                    }
                    Err((_, e)) => tracing::debug!(error = %e, "reverse connection cannot move"),
                }
            }
            self.refuse_reverse(&dest.destination);
            return;
        }
        let h = &tunnels[(pick % tunnels.len() as u64) as usize];
        let asked = h.with(|g, t| t.reverse_accept(g, sock, &dest.destination, random));
        if !matches!(asked, Ok(Ok(()))) {
            self.refuse_reverse(&dest.destination);
        }
    }

    fn refuse_reverse(&self, destination: &str) {
        tracing::debug!(%destination, "node-to-control-plane connection closed: no tunnel offers it");
        if let Some(m) = &self.observer.metrics {
            m.reverse_dials(ReverseResult::Refused).inc();
            m.reverse_refusals(ReverseRefusal::NoTunnel).inc();
        }
    }

    fn report(mesh: &MeshSender<Msg>, tunnel: TunnelId, report: Report) {
        if mesh.send(0, Msg::Report(tunnel, report)).is_err() {
            tracing::debug!(tunnel, "could not report to the sync loop (stopping?)");
        }
    }

    /// Open, run and end one tunnel; always ends with [`Report::Ended`].
    async fn attempt(self: Rc<Self>, tunnel: TunnelId, cancel: Rc<Notify>) {
        let mesh = self.mesh.clone();
        // Whether this tunnel counts in `reverse_tunnels` (until it ends).
        let reverse = Rc::new(Cell::new(false));
        let (flag, shared, index) = (reverse.clone(), self.inner.shared.clone(), self.index);
        let wants_reverse = !self.inner.settings.reverse.targets.is_empty();
        let report = Box::new(move |event: TunnelEvent| {
            if let TunnelEvent::Connected { reverse: true, .. } = &event
                && !flag.replace(true)
                && let Some(n) = shared.reverse_tunnels.get(index)
            {
                n.fetch_add(1, Ordering::AcqRel);
            }
            if let TunnelEvent::Connected {
                reverse: false,
                server_id,
                ..
            } = &event
                && wants_reverse
            {
                tracing::warn!(
                    server_id = %server_id,
                    "this proxy-server does not offer konn's node-to-control-plane direction (KEP-2025, \
                     no konn-reverse answer): --target connections never use this tunnel"
                );
            }
            let report = match event {
                TunnelEvent::Connected {
                    server_id,
                    server_count,
                    ..
                } => Report::Connected {
                    server_id,
                    server_count,
                },
                TunnelEvent::Rejected(why) => Report::Rejected(why),
                // The attempt reports its own end below.
                TunnelEvent::Closed => return,
            };
            Self::report(&mesh, tunnel, report);
        });
        let params = &self.inner.settings.connect;
        let handler = TunnelHandler::with_observer(
            params.settings.clone(),
            self.pool.clone(),
            report,
            self.observer.clone(),
        );
        let open = open_tunnel_with(
            params,
            self.h2.clone(),
            self.inner.settings.max_message,
            handler,
        );
        match race(open, cancel.notified()).await {
            // Closed while dialling: the connection is dropped unused.
            Either::Left(Ok(_)) if !self.slots.borrow().contains_key(&tunnel) => {}
            Either::Left(Ok((handle, stream))) => {
                if self.draining.get() {
                    let _ = handle.with(|g, t| t.drain(g));
                }
                self.slots
                    .borrow_mut()
                    .insert(tunnel, Slot::Running(handle.clone()));
                if let Err(e) = handle.run(stream).await {
                    tracing::debug!(tunnel, error = %e, "tunnel connection ended");
                }
            }
            Either::Left(Err(e)) => Self::report(&self.mesh, tunnel, Report::Failed(e.to_string())),
            Either::Right(()) => {}
        }
        self.slots.borrow_mut().remove(&tunnel);
        if reverse.get()
            && let Some(n) = self.inner.shared.reverse_tunnels.get(self.index)
        {
            n.fetch_sub(1, Ordering::AcqRel);
        }
        Self::report(&self.mesh, tunnel, Report::Ended);
        self.live.set(self.live.get() - 1);
        self.observer.idle.notify();
    }
}

/// Per-core metrics of every tunnel on a worker, and its endpoint count.
struct CoreObserver {
    metrics: Option<AgentCoreMetrics>,
    endpoints: Cell<usize>,
    /// Woken when an endpoint or an attempt ends (stop waits on it).
    idle: Notify,
}

impl CoreObserver {
    fn new(metrics: Option<AgentCoreMetrics>) -> Self {
        if metrics.is_none() {
            tracing::warn!("no metrics slab for this worker; its traffic is not counted");
        }
        Self {
            metrics,
            endpoints: Cell::new(0),
            idle: Notify::new(),
        }
    }
}

impl TunnelObserver for CoreObserver {
    fn received(&self, ty: PacketType) {
        if let Some(m) = &self.metrics {
            m.stream_packets(Segment::ToAgent, ty).inc();
        }
    }

    fn sent(&self, ty: PacketType) {
        if let Some(m) = &self.metrics {
            m.stream_packets(Segment::FromAgent, ty).inc();
        }
    }

    fn stream_error(&self, status: GrpcStatus) {
        if let Some(m) = &self.metrics {
            m.stream_errors(Segment::ToAgent, status, None).inc();
            m.server_connection_failures(Direction::FromServer).inc();
        }
    }

    fn dial_succeeded(&self, elapsed: Duration) {
        if let Some(m) = &self.metrics {
            m.dial_duration().observe_duration(elapsed);
        }
    }

    fn dial_failed(&self, why: DialFailure) {
        if let Some(m) = &self.metrics {
            let reason = match why {
                DialFailure::Timeout => DialFailureReason::Timeout,
                DialFailure::Unknown => DialFailureReason::Unknown,
            };
            m.endpoint_dial_failures(reason).inc();
        }
    }

    fn endpoint_opened(&self) {
        self.endpoints.set(self.endpoints.get() + 1);
        if let Some(m) = &self.metrics {
            m.open_endpoint_connections().inc();
        }
    }

    fn endpoint_closed(&self) {
        self.endpoints.set(self.endpoints.get().saturating_sub(1));
        if let Some(m) = &self.metrics {
            m.open_endpoint_connections().dec();
        }
        self.idle.notify();
    }

    fn reverse_dialed(&self, ok: bool) {
        if let Some(m) = &self.metrics {
            if ok {
                m.reverse_dials(ReverseResult::Ok).inc();
            } else {
                m.reverse_dials(ReverseResult::Refused).inc();
                m.reverse_refusals(ReverseRefusal::Refused).inc();
            }
        }
    }

    fn reverse_connection(&self, open: bool) {
        // Counted with the endpoints for a clean stop.
        if open {
            self.endpoints.set(self.endpoints.get() + 1);
        } else {
            self.endpoints.set(self.endpoints.get().saturating_sub(1));
            self.idle.notify();
        }
        if let Some(m) = &self.metrics {
            if open {
                m.reverse_connections().inc();
            } else {
                m.reverse_connections().dec();
            }
        }
    }

    fn reverse_bytes(&self, to_control_plane: bool, n: usize) {
        if let Some(m) = &self.metrics {
            let direction = if to_control_plane {
                ReverseDirection::ToControlPlane
            } else {
                ReverseDirection::ToNode
            };
            m.reverse_bytes(direction).add(n as u64);
        }
    }
}

/// The attempt the sync loop is waiting for.
struct Pending {
    tunnel: TunnelId,
    result: Option<Result<Outcome, String>>,
}

/// The sync loop and the server set (worker 0 only).
struct Controller {
    set: RefCell<ServerSet>,
    /// Tunnels (pending or live) per worker.
    load: RefCell<Vec<usize>>,
    cursor: Cell<usize>,
    /// The worker of every tunnel not yet ended.
    placed: RefCell<HashMap<TunnelId, usize>>,
    pending: RefCell<Option<Pending>>,
    resolved: Notify,
    /// Cuts the pause short (the server count changed).
    wake: Notify,
    next_id: Cell<TunnelId>,
    mesh: MeshSender<Msg>,
    shared: Arc<Shared>,
    metrics: AgentMetrics,
}

impl Controller {
    fn new(inner: &Inner, mesh: MeshSender<Msg>, workers: usize) -> Self {
        Self {
            set: RefCell::new(ServerSet::new(
                inner.settings.sync,
                Rng::new(konn_core::io::clock::seed()),
            )),
            load: RefCell::new(vec![0; workers.max(1)]),
            cursor: Cell::new(0),
            placed: RefCell::new(HashMap::new()),
            pending: RefCell::new(None),
            resolved: Notify::new(),
            wake: Notify::new(),
            next_id: Cell::new(1),
            mesh,
            shared: inner.shared.clone(),
            metrics: inner.metrics.clone(),
        }
    }

    /// upstream's `sync()`: a round, a pause, until stopped.
    async fn run(&self, stop: &StopToken) {
        loop {
            let Some(outcome) = self.connect_once(stop).await else {
                return;
            };
            let pause = self.set.borrow_mut().pause(outcome);
            let sleep = race(monoio::time::sleep(pause), self.wake.notified());
            if let Either::Right(()) = race(sleep, stop.stopped()).await {
                return;
            }
        }
    }

    /// One round (upstream's `connectOnce`); `None` when stopped.
    async fn connect_once(&self, stop: &StopToken) -> Option<Outcome> {
        if self.shared.draining.load(Ordering::Acquire) {
            self.set.borrow_mut().set_draining();
        }
        let round = self.set.borrow().round();
        let server_count = match round {
            Round::Draining => {
                tracing::debug!("skipping connectOnce - agent is draining");
                return Some(Outcome::Ok);
            }
            Round::Full { server_count } => {
                self.publish_count(server_count);
                return Some(Outcome::Ok);
            }
            Round::Connect { server_count } => server_count,
        };
        self.publish_count(server_count);
        let tunnel = self.next_id.get();
        self.next_id.set(tunnel + 1);
        let worker = self.place(tunnel);
        self.shared.attempts.fetch_add(1, Ordering::Relaxed);
        *self.pending.borrow_mut() = Some(Pending {
            tunnel,
            result: None,
        });
        if self.mesh.send(worker, Msg::Open(tunnel)).is_err() {
            self.unplace(tunnel);
            *self.pending.borrow_mut() = None;
            tracing::warn!(worker, "could not hand a tunnel to its worker");
            return Some(Outcome::Failed);
        }
        let timeout = self.set.borrow().config().header_timeout;
        let deadline = monoio::time::Instant::now() + timeout;
        let result = loop {
            let done = self
                .pending
                .borrow_mut()
                .as_mut()
                .and_then(|p| p.result.take());
            if let Some(r) = done {
                break r;
            }
            let wait = race(
                self.resolved.notified(),
                monoio::time::sleep_until(deadline),
            );
            match race(wait, stop.stopped()).await {
                Either::Left(Either::Left(())) => {}
                Either::Left(Either::Right(())) => {
                    self.close_tunnel(tunnel);
                    break Err(format!(
                        "no answer from the proxy-server within {timeout:?} (dial, TLS and the Connect response headers)"
                    ));
                }
                Either::Right(()) => {
                    *self.pending.borrow_mut() = None;
                    return None;
                }
            }
        };
        *self.pending.borrow_mut() = None;
        Some(match result {
            Ok(outcome) => outcome,
            Err(error) => {
                self.shared.failures.fetch_add(1, Ordering::Relaxed);
                tracing::error!(%error, "cannot connect once");
                Outcome::Failed
            }
        })
    }

    /// The lease counter's news: when the server count changed, publish it
    /// and run a round now.
    fn on_lease_count(&self, leases: usize) {
        let changed = self.set.borrow_mut().set_lease_count(leases);
        if changed {
            let count = self.set.borrow().server_count();
            tracing::info!(
                leases,
                server_count = count,
                "server count changed (leases)"
            );
            self.publish_count(count);
            self.wake.notify();
        }
    }

    /// What a worker said about `tunnel`.
    fn on_report(&self, tunnel: TunnelId, report: Report) {
        match report {
            Report::Connected {
                server_id,
                server_count,
            } => {
                if !self.is_pending(tunnel) {
                    // Answered after the sync loop gave up on it.
                    self.close_tunnel(tunnel);
                    return;
                }
                let admission = self
                    .set
                    .borrow_mut()
                    .admit(tunnel, &server_id, server_count);
                match admission {
                    Admission::New => {
                        tracing::info!(
                            server_id = %server_id,
                            new_server_count = server_count,
                            "successfully connected to new proxy server"
                        );
                        self.publish_set();
                        self.resolve(tunnel, Ok(Outcome::Ok));
                    }
                    Admission::Duplicate => {
                        tracing::debug!(server_id = %server_id, "duplicate server connection attempt");
                        self.shared.duplicates.fetch_add(1, Ordering::Relaxed);
                        self.close_tunnel(tunnel);
                        self.resolve(tunnel, Ok(Outcome::Duplicate));
                    }
                }
            }
            Report::Rejected(why) | Report::Failed(why) => self.resolve(tunnel, Err(why)),
            Report::Ended => {
                self.resolve(
                    tunnel,
                    Err("the connection to the proxy-server closed before it answered".to_owned()),
                );
                self.unplace(tunnel);
                let removed = self.set.borrow_mut().remove(tunnel);
                if let Some(server_id) = removed {
                    tracing::info!(server_id = %server_id, "proxy-server connection closed");
                    self.publish_set();
                }
            }
        }
    }

    fn is_pending(&self, tunnel: TunnelId) -> bool {
        self.pending
            .borrow()
            .as_ref()
            .is_some_and(|p| p.tunnel == tunnel && p.result.is_none())
    }

    /// Settle the pending attempt if it is `tunnel` (first answer wins).
    fn resolve(&self, tunnel: TunnelId, result: Result<Outcome, String>) {
        if let Some(p) = self.pending.borrow_mut().as_mut()
            && p.tunnel == tunnel
            && p.result.is_none()
        {
            p.result = Some(result);
            self.resolved.notify();
        }
    }

    fn close_tunnel(&self, tunnel: TunnelId) {
        let worker = self.placed.borrow().get(&tunnel).copied();
        if let Some(w) = worker {
            let _ = self.mesh.send(w, Msg::Close(tunnel));
        }
    }

    /// The worker for a new tunnel: fewest tunnels, ties round-robin.
    fn place(&self, tunnel: TunnelId) -> usize {
        let mut load = self.load.borrow_mut();
        let n = load.len();
        let start = self.cursor.get() % n;
        let chosen = (0..n)
            .map(|i| (start + i) % n)
            .min_by_key(|&w| load[w])
            .unwrap_or(0);
        load[chosen] += 1;
        self.cursor.set(chosen + 1);
        self.placed.borrow_mut().insert(tunnel, chosen);
        chosen
    }

    fn unplace(&self, tunnel: TunnelId) {
        if let Some(w) = self.placed.borrow_mut().remove(&tunnel)
            && let Some(l) = self.load.borrow_mut().get_mut(w)
        {
            *l = l.saturating_sub(1);
        }
    }

    fn publish_set(&self) {
        let n = self.set.borrow().len();
        self.shared.connected.store(n, Ordering::Release);
        self.metrics.set_open_server_connections(n);
    }

    fn publish_count(&self, count: usize) {
        self.shared
            .known_server_count
            .store(count, Ordering::Release);
        self.metrics.set_known_server_count(count);
    }
}
