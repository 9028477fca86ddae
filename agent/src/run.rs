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
use std::net::{SocketAddr, TcpListener, ToSocketAddrs};
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use konn_core::Error;
use konn_core::http1::{self, Router};
use konn_core::io::driver::DriverConfig;
use konn_core::io::listen::{bind_tcp, tcp_into_monoio};
use konn_core::io::notify::Notify;
use konn_core::io::pool::BufPool;
use konn_core::io::runtime::{Either, Engine, RuntimeConfig, StopToken, WorkerCtx, Workers, race};
use konn_core::io::tls::{ClientTlsOptions, PemSource};
use konn_core::io::xcore::MeshSender;
use konn_frames::GrpcStatus;
use konn_frames::packet::PacketType;
use konn_protocol::flow::FlowLimits;
use konn_protocol::h2;

use crate::client::{ConnectParams, TunnelHandle, open_tunnel_with};
use crate::conn::{TunnelEvent, TunnelHandler, TunnelObserver, TunnelSettings};
use crate::health::{admin_router, health_router, join_host_port};
use crate::metrics::{AgentCoreMetrics, AgentMetrics, DialFailureReason, Direction, Segment};
use crate::options::AgentOptions;
use konn_protocol::agent::sync::{
    Admission, CountSource, Outcome, Rng, Round, ServerSet, SyncConfig, TunnelId,
};
use konn_protocol::agent::tunnel::DialFailure;
use konn_protocol::agent::tunnel::TunnelConfig;

/// Timeout of one destination dial (upstream's `dialTimeout`).
pub const DIAL_TIMEOUT: Duration = Duration::from_secs(5);

/// Timeout of the TCP connect to the server: grpc-go's minimum connect
/// timeout, which bounds upstream's dial of a silent address.
pub const SERVER_CONNECT_TIMEOUT: Duration = Duration::from_secs(20);

/// How long [`AgentHandle::stop`] lets tunnels and endpoints close.
pub const DEFAULT_STOP_TIMEOUT: Duration = Duration::from_secs(5);

/// Stands for "no timeout" where a timer needs a value (a year).
const NEVER: Duration = Duration::from_secs(365 * 24 * 3600);

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

/// Everything the running agent needs, independent of how it was given
/// ([`AgentSettings::from_options`] maps the flags; tests build it).
#[derive(Clone)]
pub struct AgentSettings {
    /// The server address, TLS, identity, token, keepalive and relay
    /// settings of every tunnel.
    pub connect: ConnectParams,
    /// HTTP/2 receive windows of a tunnel: per stream, per connection.
    pub h2_windows: (u32, u32),
    /// Largest gRPC message accepted from a server.
    pub max_message: u32,
    /// The sync policy.
    pub sync: SyncConfig,
    /// Where the health server may listen, tried in order (empty: no
    /// health server).
    pub health: Vec<SocketAddr>,
    /// Where the admin server may listen, tried in order (empty: none).
    pub admin: Vec<SocketAddr>,
    /// `--enable-profiling`: the admin port answers the pprof paths (501).
    pub enable_profiling: bool,
    /// Limits of the HTTP servers (upstream's 60 s header timeout, 1 MiB
    /// headers).
    pub http: http1::Config,
    /// Threads and io engine.
    pub runtime: RuntimeConfig,
    /// How long stopping waits for tunnels and endpoints to close.
    pub stop_timeout: Duration,
    /// `--count-server-leases`, when on.
    pub lease_counting: Option<crate::leases::LeaseSettings>,
}

impl fmt::Debug for AgentSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AgentSettings")
            .field("address", &self.connect.address)
            .field("agent_id", &self.connect.agent_id)
            .field("tls", &self.connect.tls.is_some())
            .field("sync", &self.sync)
            .field("health", &self.health)
            .field("admin", &self.admin)
            .field("workers", &self.runtime.workers)
            .finish_non_exhaustive()
    }
}

impl AgentSettings {
    /// Settings for tests: plaintext tunnels to `address`, agent id
    /// `agent_id`, no health or admin port, two workers, 100 ms sync
    /// interval capped at 500 ms.
    pub fn for_tests(address: impl Into<String>, agent_id: impl Into<String>) -> Self {
        Self {
            connect: ConnectParams {
                address: address.into(),
                tls: None,
                agent_id: agent_id.into(),
                agent_identifiers: String::new(),
                token_path: None,
                keepalive_time: Duration::from_secs(3600),
                connect_timeout: SERVER_CONNECT_TIMEOUT,
                settings: TunnelSettings::default(),
                driver: DriverConfig::default(),
            },
            h2_windows: (1 << 20, 4 << 20),
            max_message: konn_frames::grpc::DEFAULT_MAX_RECV_MESSAGE_SIZE,
            sync: SyncConfig {
                interval: Duration::from_millis(100),
                interval_cap: Duration::from_millis(500),
                sync_forever: false,
                header_timeout: Duration::from_secs(10),
                ..SyncConfig::default()
            },
            health: Vec::new(),
            admin: Vec::new(),
            enable_profiling: false,
            http: http1::Config::default(),
            runtime: RuntimeConfig {
                workers: 2,
                thread_name: "konn-agent".to_owned(),
                ..RuntimeConfig::default()
            },
            stop_timeout: DEFAULT_STOP_TIMEOUT,
            lease_counting: None,
        }
    }

    /// The settings the flags ask for. Reads the TLS files now, so a bad
    /// certificate stops the agent at start-up with one clear line.
    ///
    /// # Errors
    ///
    /// No `--ca-cert`, unreadable or invalid TLS files, a health or admin
    /// host that does not resolve.
    pub fn from_options(o: &AgentOptions) -> Result<Self, crate::Error> {
        let ca = o.ca_cert.as_ref().ok_or(crate::Error::NoCaCert)?;
        let mut tls = ClientTlsOptions::new(PemSource::file(ca), o.proxy_server_host.clone());
        if let Some(pair) = &o.client_cert {
            tls.identity = Some((PemSource::file(&pair.cert), PemSource::file(&pair.key)));
        }
        tls.extra_alpn = o
            .alpn_protos
            .iter()
            .map(|p| p.as_bytes().to_vec())
            .collect();
        let tls = tls.build().map_err(crate::Error::Tls)?;
        let e = &o.engine;
        let settings = TunnelSettings {
            dial_timeout: DIAL_TIMEOUT,
            endpoint_queue: o.xfr_channel_size,
            // What a server's PAUSE may still find queued here for one
            // flow (docs/design/tunnel.md, "Choosing the marks").
            tunnel_high_water: e.conn_queue_size,
            tunnel_low_water: e.conn_queue_size / 4,
            tunnel: TunnelConfig {
                flow: FlowLimits::from_queue_size(
                    e.conn_queue_size,
                    e.stuck_timeout.unwrap_or(NEVER),
                ),
                ..TunnelConfig::default()
            },
            warn_on_queue_limit: o.warn_on_channel_limit,
            ..TunnelSettings::default()
        };
        let driver = DriverConfig {
            write_timeout: e.write_timeout.unwrap_or(NEVER),
            ..DriverConfig::default()
        };
        let mut runtime = RuntimeConfig {
            workers: e.workers.max(1),
            pin_cores: e.pin_cores,
            engine: e.io_engine,
            thread_name: "konn-agent".to_owned(),
            ..RuntimeConfig::default()
        };
        runtime.pool.budget_bytes = e.memory_budget;
        Ok(Self {
            connect: ConnectParams {
                address: join_host_port(&o.proxy_server_host, o.proxy_server_port),
                tls: Some(tls),
                agent_id: o.agent_id.clone(),
                agent_identifiers: o.agent_identifiers.clone(),
                token_path: o.service_account_token_path.clone(),
                keepalive_time: o.keepalive_time,
                connect_timeout: SERVER_CONNECT_TIMEOUT,
                settings,
                driver,
            },
            h2_windows: (e.h2_stream_window, e.h2_conn_window),
            max_message: e.grpc_max_message_size,
            sync: SyncConfig {
                interval: o.sync_interval,
                interval_cap: o.sync_interval_cap,
                sync_forever: o.sync_forever,
                header_timeout: konn_protocol::agent::sync::DEFAULT_HEADER_TIMEOUT,
                count_source: match (&o.lease_counting, o.server_count_source) {
                    (None, _) => CountSource::Responses,
                    (Some(_), crate::options::ServerCountSource::Default) => CountSource::Leases,
                    (Some(_), crate::options::ServerCountSource::Max) => CountSource::Max,
                },
            },
            health: listen_addrs("health-server-host", &o.health.bind_address, o.health.port)?,
            admin: listen_addrs("admin-bind-address", &o.admin.bind_address, o.admin.port)?,
            enable_profiling: o.enable_profiling,
            http: http1::Config::default(),
            runtime,
            stop_timeout: DEFAULT_STOP_TIMEOUT,
            lease_counting: o
                .lease_counting
                .as_ref()
                .map(|l| crate::leases::LeaseSettings {
                    client: konn_core::kube::KubeSettings {
                        kubeconfig: o.kubeconfig.clone(),
                        qps: 0.0,
                        burst: 0,
                        content_type: o.kube_api_content_type.clone(),
                    },
                    count: konn_core::kube::lease::CountConfig {
                        namespace: l.namespace.clone(),
                        selector: konn_core::kube::lease::format_labels(&l.selector),
                    },
                }),
        })
    }

    /// A tunnel's HTTP/2 settings: keepalive from
    /// [`ConnectParams::h2_config`], the configured windows.
    pub fn h2_config(&self) -> h2::Config {
        let mut c = self.connect.h2_config();
        c.stream_window = self.h2_windows.0;
        c.conn_window = self.h2_windows.1;
        c
    }
}

/// Addresses for a listener on `host` (Go's `net.JoinHostPort(host,
/// port)`): an empty host means every interface, IPv6 and IPv4 (`[::]`,
/// else `0.0.0.0` where IPv6 is off); a name is resolved now.
fn listen_addrs(
    flag: &'static str,
    host: &str,
    port: u16,
) -> Result<Vec<SocketAddr>, crate::Error> {
    if host.is_empty() {
        return Ok(vec![
            SocketAddr::from(([0u16; 8], port)),
            SocketAddr::from(([0u8; 4], port)),
        ]);
    }
    let bare = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    let addrs: Vec<SocketAddr> = (bare, port)
        .to_socket_addrs()
        .map_err(|source| crate::Error::Resolve {
            flag,
            host: host.to_owned(),
            source,
        })?
        .collect();
    Ok(addrs)
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
    let shared = Arc::new(Shared::default());
    let mut runtime = settings.runtime.clone();
    runtime.workers = workers;
    let inner = Arc::new(Inner {
        settings,
        metrics: metrics.clone(),
        shared: shared.clone(),
        health,
        admin,
        health_port: health_addr.map_or(0, |a| a.port()),
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
        inner: inner.clone(),
    });
    let mut tasks = Vec::new();
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

    fn report(mesh: &MeshSender<Msg>, tunnel: TunnelId, report: Report) {
        if mesh.send(0, Msg::Report(tunnel, report)).is_err() {
            tracing::debug!(tunnel, "could not report to the sync loop (stopping?)");
        }
    }

    /// Open, run and end one tunnel; always ends with [`Report::Ended`].
    async fn attempt(self: Rc<Self>, tunnel: TunnelId, cancel: Rc<Notify>) {
        let mesh = self.mesh.clone();
        let report = Box::new(move |event: TunnelEvent| {
            let report = match event {
                TunnelEvent::Connected {
                    server_id,
                    server_count,
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
