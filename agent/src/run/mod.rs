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
//! **`/debug/connections`** (admin port, `crate::debug`): worker 0 reads
//! its own endpoints live and sends [`Msg::Watch`] to the others, which
//! then publish theirs every half second for a minute.
//!
//! **Metrics.** Packets, dial outcomes and endpoints are counted per core
//! by a [`TunnelObserver`](crate::conn::TunnelObserver) over the worker's [`AgentCoreMetrics`] (no
//! shared atomics on the data path); `open_server_connections` and
//! `known_server_count` are set by the sync loop. Readiness (`/readyz`) is
//! "at least one server in the set", read from an atomic the sync loop
//! maintains.

use std::fmt;
use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use konn_core::Error;
use konn_core::io::listen::bind_tcp;
use konn_core::io::runtime::{Engine, Workers};
use konn_core::io::xcore::DetachedTcp;
use konn_protocol::agent::sync::TunnelId;

use crate::metrics::AgentMetrics;
use crate::settings::AgentSettings;

mod controller;
mod worker;

use worker::worker_main;

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
    /// Someone asked for `/debug/connections` (from worker 0): publish
    /// this worker's listing while it is watched (`crate::debug`).
    Watch,
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
        /// It resumed a tunnel parked on this worker (`konn-resume`).
        resumed: bool,
    },
    /// The tunnel's connection broke and its endpoints are parked on its
    /// worker for a resume (before [`Report::Ended`]).
    Parked {
        /// The server.
        server_id: String,
    },
    /// A parked tunnel closed without a resume (after [`Report::Ended`]).
    ParkEnded {
        /// The server.
        server_id: String,
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
    /// The workers' `/debug/connections` listings.
    conns: crate::debug::EndpointBoard,
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
        conns: crate::debug::EndpointBoard::new(workers, konn_core::io::clock::now()),
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
