//! The clusters a server runs, and changing them while it runs.
//!
//! [`Control`] lives outside the workers (on the thread that started the
//! server, then on the watcher's): it binds each cluster's frontend
//! listeners, creates its metric registry and token reviewer, and tells
//! every worker to serve it ([`Msg::ClusterUp`]) or to stop
//! ([`Msg::ClusterDown`]). A reload ([`Control::apply`]) compares the new
//! file's clusters with the running ones by name and fingerprint:
//!
//! - unchanged clusters are not touched (their tunnels and connections go
//!   on);
//! - a removed cluster's listeners stop and its agents and frontends are
//!   closed, on every worker;
//! - a changed cluster is removed and added again under a new id (its own
//!   connections restart with the new settings);
//! - a cluster whose admission `limits` alone changed is retuned in place
//!   (`Limits::reconfigure` on the limits its routers share): nothing
//!   restarts, counts stay true;
//! - everything new is bound *before* anything is removed, so a listener
//!   that cannot bind refuses the reload whole and nothing changes.
//!
//! [`Watcher`] runs reloads on its own thread: when poked (SIGHUP, see
//! `main.rs`) and when the file changes (checked every
//! [`WATCH_INTERVAL`]: size, modification time, inode — which also catches
//! a Kubernetes ConfigMap's symlink swap — then the contents). A file that
//! is refused is logged and counted
//! (`konn_server_clusters_config_reloads_total{result="error"}`) and the
//! running configuration is kept.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::mpsc;
use std::time::Duration;

use konn_core::Error;
use konn_core::io::listen::{TcpListeners, UnixListenOptions, bind_unix};
use konn_core::io::xcore::{MeshSender, SendError};
use konn_core::kube::ControlPlane;
use konn_core::kube::review::TokenReviewer;

use super::config::{self, ClusterDefaults, ClusterSettings, TokenSpec};
use crate::cluster::ClusterId;
use crate::metrics::ServerMetrics;
use crate::serve::metric_strategy;
use crate::settings::FrontendListen;
use crate::worker::Msg;

/// How often the watcher looks at the file.
pub const WATCH_INTERVAL: Duration = Duration::from_secs(1);

/// How long the control thread retries a full worker inbox.
const SEND_PATIENCE: Duration = Duration::from_secs(5);

/// A cluster's frontend listeners, bound once and taken by each worker.
#[derive(Debug)]
pub struct ClusterListeners {
    tcp: Option<TcpListeners>,
    unix: Option<std::os::unix::net::UnixListener>,
    /// The bound TCP address.
    pub addr: Option<std::net::SocketAddr>,
    /// The Unix socket's path.
    pub path: Option<PathBuf>,
}

impl ClusterListeners {
    /// Refuse new connections on the Unix socket (graceful shutdown):
    /// shutdown(2) makes connect(2) fail at once instead of queueing in the
    /// backlog of a listener nobody accepts on any more.
    pub fn refuse_new(&self) {
        if let Some(l) = &self.unix
            && let Err(err) = socket2::SockRef::from(l).shutdown(std::net::Shutdown::Both)
        {
            tracing::warn!("cannot shut the frontend socket down: {err}");
        }
    }

    /// Bind `listen` for `workers` workers (TCP: one `SO_REUSEPORT` socket
    /// each; a Unix socket is shared).
    ///
    /// # Errors
    ///
    /// The address or path cannot be bound.
    pub fn bind(
        listen: &FrontendListen,
        delete_existing: bool,
        workers: usize,
    ) -> Result<Self, Error> {
        match listen {
            FrontendListen::Tcp(addr) => {
                let l = TcpListeners::bind(*addr, workers, 1024)?;
                Ok(Self {
                    addr: Some(l.local_addr()),
                    tcp: Some(l),
                    unix: None,
                    path: None,
                })
            }
            FrontendListen::Unix(path) => {
                let opts = UnixListenOptions {
                    remove_existing: delete_existing,
                    mode: 0o770,
                    backlog: 1024,
                };
                Ok(Self {
                    unix: Some(bind_unix(path, &opts)?),
                    tcp: None,
                    addr: None,
                    path: Some(path.clone()),
                })
            }
        }
    }

    /// Worker `index`'s TCP listener (once).
    pub fn take_tcp(&self, index: usize) -> Option<std::net::TcpListener> {
        self.tcp.as_ref().and_then(|t| t.take(index))
    }

    /// A handle on the Unix listener.
    pub fn unix(&self) -> Option<std::os::unix::net::UnixListener> {
        self.unix.as_ref().and_then(|u| u.try_clone().ok())
    }
}

/// What a worker needs to serve a cluster.
#[derive(Clone)]
pub struct ClusterStart {
    /// The cluster's id.
    pub id: ClusterId,
    /// Its settings.
    pub settings: Arc<ClusterSettings>,
    /// Its frontend listeners.
    pub listeners: Arc<ClusterListeners>,
    /// Its metrics (the server's own registry without `--clusters-config`).
    pub metrics: ServerMetrics,
    /// Its token reviewer and deadline, when it reviews tokens.
    pub reviewer: Option<(TokenReviewer, Duration)>,
}

/// A cluster running now.
struct Running {
    start: ClusterStart,
    fingerprint: u64,
}

/// What a reload did (names).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ReloadSummary {
    /// New clusters.
    pub added: Vec<String>,
    /// Clusters whose settings changed (restarted).
    pub changed: Vec<String>,
    /// Clusters no longer in the file.
    pub removed: Vec<String>,
    /// Clusters whose admission limits alone changed (retuned in place).
    pub retuned: Vec<String>,
}

impl ReloadSummary {
    /// Nothing changed.
    pub fn is_empty(&self) -> bool {
        self.added.is_empty()
            && self.changed.is_empty()
            && self.removed.is_empty()
            && self.retuned.is_empty()
    }
}

/// The running clusters (see the module docs).
pub struct Control {
    workers: usize,
    mesh: Option<MeshSender<Msg>>,
    metrics: ServerMetrics,
    defaults: ClusterDefaults,
    path: PathBuf,
    next_id: ClusterId,
    running: BTreeMap<String, Running>,
    /// One Kubernetes client thread per kubeconfig clusters review tokens
    /// with.
    planes: HashMap<Option<PathBuf>, ControlPlane>,
}

impl std::fmt::Debug for Control {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Control")
            .field("path", &self.path)
            .field("clusters", &self.running.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl Control {
    /// Control of the clusters of `path`, for `workers` workers;
    /// `metrics` is the process-wide registry.
    pub fn new(
        path: PathBuf,
        defaults: ClusterDefaults,
        workers: usize,
        metrics: ServerMetrics,
    ) -> Self {
        Self {
            workers,
            mesh: None,
            metrics,
            defaults,
            path,
            next_id: 1,
            running: BTreeMap::new(),
            planes: HashMap::new(),
        }
    }

    /// The workers' inboxes, once they run.
    pub fn set_mesh(&mut self, mesh: MeshSender<Msg>) {
        self.mesh = Some(mesh);
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Bind and prepare the clusters of the first configuration (before the
    /// workers start); they are served by every worker from the start.
    ///
    /// # Errors
    ///
    /// A listener cannot bind, a Kubernetes client cannot start.
    pub fn initial(&mut self, clusters: Vec<ClusterSettings>) -> Result<Vec<ClusterStart>, Error> {
        let mut out = Vec::new();
        for c in clusters {
            let fingerprint = c.fingerprint;
            let start = self.prepare(c)?;
            out.push(start.clone());
            self.running
                .insert(start.settings.name.clone(), Running { start, fingerprint });
        }
        self.metrics.set_clusters(self.running.len());
        Ok(out)
    }

    /// The running clusters' frontends: name → (TCP address, Unix path).
    pub fn frontends(&self) -> Vec<(String, Option<std::net::SocketAddr>, Option<PathBuf>)> {
        self.running
            .iter()
            .map(|(n, r)| {
                (
                    n.clone(),
                    r.start.listeners.addr,
                    r.start.listeners.path.clone(),
                )
            })
            .collect()
    }

    fn prepare(&mut self, c: ClusterSettings) -> Result<ClusterStart, Error> {
        let listeners = ClusterListeners::bind(
            &c.frontend.listen,
            c.frontend.delete_existing_uds,
            self.workers,
        )?;
        let metrics = ServerMetrics::cluster(self.workers);
        for s in &c.strategies {
            metrics.init_backend_storage(metric_strategy(*s));
        }
        metrics.init_connect_channels();
        let reviewer = c
            .agents
            .token
            .as_ref()
            .map(|t| self.reviewer(t))
            .transpose()?;
        let id = self.next_id;
        self.next_id += 1;
        Ok(ClusterStart {
            id,
            settings: Arc::new(c),
            listeners: Arc::new(listeners),
            metrics,
            reviewer,
        })
    }

    fn reviewer(&mut self, t: &TokenSpec) -> Result<(TokenReviewer, Duration), Error> {
        let key = t
            .kubeconfig
            .clone()
            .or_else(|| self.defaults.kube.kubeconfig.clone());
        let observer = Arc::new(crate::kube::Observer(self.metrics.clone()));
        let plane = match self.planes.entry(key.clone()) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(v) => {
                let settings = konn_core::kube::KubeSettings {
                    kubeconfig: key,
                    ..self.defaults.kube.clone()
                };
                v.insert(ControlPlane::start(&settings, "konn-kube")?)
            }
        };
        let reviewer = TokenReviewer::start(plane, t.policy.clone(), observer);
        Ok((reviewer, t.policy.timeout))
    }

    /// Read the file again and apply it (see the module docs). A refused
    /// file changes nothing and is counted.
    ///
    /// # Errors
    ///
    /// Why the file or one of its listeners was refused.
    pub fn reload(&mut self) -> Result<ReloadSummary, String> {
        let result = config::load(&self.path, &self.defaults)
            .map_err(|e| e.to_string())
            .and_then(|clusters| self.apply(clusters).map_err(|e| e.to_string()));
        self.metrics.cluster_reload(result.is_ok());
        match &result {
            Ok(s) if s.is_empty() => tracing::info!("clusters config unchanged"),
            Ok(s) => tracing::info!(
                added = ?s.added,
                changed = ?s.changed,
                removed = ?s.removed,
                retuned = ?s.retuned,
                "clusters config reloaded"
            ),
            Err(e) => {
                tracing::error!(error = %e, "clusters config refused; keeping the running one")
            }
        }
        result
    }

    /// Run `clusters` instead of the running ones.
    ///
    /// # Errors
    ///
    /// A new listener cannot bind (nothing changed then).
    pub fn apply(&mut self, clusters: Vec<ClusterSettings>) -> Result<ReloadSummary, Error> {
        let mut summary = ReloadSummary::default();
        let mut fresh = Vec::new();
        let mut retune = Vec::new();
        let names: Vec<String> = clusters.iter().map(|c| c.name.clone()).collect();
        for c in clusters {
            match self.running.get(&c.name) {
                Some(r) if r.fingerprint == c.fingerprint => {
                    // Only its limits may differ: retuned in place (below),
                    // on the `Limits` every worker's router of it shares.
                    if let (Some(old), Some(new)) =
                        (&r.start.settings.router.limits, &c.router.limits)
                        && old.config() != new.config()
                    {
                        summary.retuned.push(c.name.clone());
                        retune.push((old.clone(), new.config()));
                    }
                }
                Some(_) => {
                    summary.changed.push(c.name.clone());
                    fresh.push(c);
                }
                None => {
                    summary.added.push(c.name.clone());
                    fresh.push(c);
                }
            }
        }
        summary.removed = self
            .running
            .keys()
            .filter(|n| !names.contains(n))
            .cloned()
            .collect();
        // Bind everything new first: a failure leaves the running set as is.
        let mut prepared = Vec::new();
        for c in fresh {
            let fingerprint = c.fingerprint;
            prepared.push((self.prepare(c)?, fingerprint));
        }
        for (limits, cfg) in retune {
            limits.reconfigure(cfg);
        }
        let new_paths: Vec<PathBuf> = prepared
            .iter()
            .filter_map(|(s, _)| s.listeners.path.clone())
            .collect();
        for name in summary.removed.iter().chain(&summary.changed) {
            if let Some(old) = self.running.remove(name) {
                self.broadcast(|| Msg::ClusterDown(old.start.id));
                if let Some(p) = &old.start.listeners.path
                    && !new_paths.contains(p)
                {
                    let _ = std::fs::remove_file(p);
                }
            }
        }
        for (start, fingerprint) in prepared {
            self.broadcast(|| Msg::ClusterUp(Box::new(start.clone())));
            self.running
                .insert(start.settings.name.clone(), Running { start, fingerprint });
        }
        self.metrics.set_clusters(self.running.len());
        Ok(summary)
    }

    /// Send a message to every worker, waiting (bounded) while an inbox is
    /// full; a stopped worker is skipped.
    #[allow(clippy::disallowed_methods)] // the control thread's bounded wait
    fn broadcast(&self, msg: impl Fn() -> Msg) {
        let Some(mesh) = &self.mesh else { return };
        for to in 0..self.workers {
            let deadline = std::time::Instant::now() + SEND_PATIENCE;
            let mut m = msg();
            loop {
                match mesh.send(to, m) {
                    Ok(()) => break,
                    Err(SendError::Full(back)) if std::time::Instant::now() < deadline => {
                        m = back;
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    Err(_) => {
                        tracing::warn!(worker = to, "worker not told of a cluster change");
                        break;
                    }
                }
            }
        }
    }

    /// Stop the Kubernetes clients and remove the running clusters' socket
    /// files (the server is stopping).
    pub fn stop(&mut self) {
        for (_, plane) in self.planes.drain() {
            plane.stop();
        }
        for r in self.running.values() {
            if let Some(p) = &r.start.listeners.path {
                let _ = std::fs::remove_file(p);
            }
        }
    }
}

/// Reloads on a poke or a file change, on its own thread (see the module
/// docs).
pub struct Watcher {
    /// `false`: reload now; `true`: stop (others may hold senders).
    poke: Option<mpsc::Sender<bool>>,
    thread: Option<std::thread::JoinHandle<Control>>,
}

impl std::fmt::Debug for Watcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watcher").finish_non_exhaustive()
    }
}

/// What identifies one version of the file cheaply.
fn stamp(path: &Path) -> Option<(u64, u64, i64, i64)> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).ok()?;
    Some((m.ino(), m.len(), m.mtime(), m.mtime_nsec()))
}

impl Watcher {
    /// Start watching `control`'s file every `interval`.
    ///
    /// # Errors
    ///
    /// The thread cannot start.
    pub fn start(mut control: Control, interval: Duration) -> std::io::Result<Self> {
        let (tx, rx) = mpsc::channel::<bool>();
        let thread = std::thread::Builder::new()
            .name("konn-clusters".into())
            .spawn(move || {
                let path = control.path().to_owned();
                let mut seen = stamp(&path);
                let mut contents = std::fs::read(&path).ok();
                loop {
                    let poked = match rx.recv_timeout(interval) {
                        Ok(false) => true,
                        Err(mpsc::RecvTimeoutError::Timeout) => false,
                        Ok(true) | Err(mpsc::RecvTimeoutError::Disconnected) => return control,
                    };
                    let now = stamp(&path);
                    if !poked && now == seen {
                        continue;
                    }
                    seen = now;
                    let bytes = std::fs::read(&path).ok();
                    if !poked && bytes == contents {
                        continue;
                    }
                    contents = bytes;
                    if poked {
                        tracing::info!("SIGHUP: reloading the clusters config");
                    }
                    let _ = control.reload();
                }
            })?;
        Ok(Self {
            poke: Some(tx),
            thread: Some(thread),
        })
    }

    /// A handle that asks for a reload from any thread (the SIGHUP
    /// thread): send `false`; `send` fails once the watcher stopped.
    pub fn poker(&self) -> Option<mpsc::Sender<bool>> {
        self.poke.clone()
    }

    /// Reload now (SIGHUP).
    pub fn poke(&self) {
        if let Some(p) = &self.poke {
            let _ = p.send(false);
        }
    }

    /// Stop watching; the [`Control`] comes back.
    pub fn stop(mut self) -> Option<Control> {
        self.halt()
    }

    fn halt(&mut self) -> Option<Control> {
        if let Some(p) = self.poke.take() {
            let _ = p.send(true);
        }
        self.thread.take().and_then(|t| t.join().ok())
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.halt();
    }
}
