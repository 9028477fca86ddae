//! Leases: how proxy-servers announce themselves and how proxy-agents count
//! them (upstream `pkg/server/leases`, `pkg/agent/lease_counter.go`,
//! `pkg/util/leases.go`).
//!
//! **Validity** ([`expiry`], [`LeaseTable`]): a lease is valid while its
//! `renewTime` (else `acquireTime`) plus `leaseDurationSeconds` lies in the
//! future; one with neither time is expired (upstream's `IsLeaseValid`).
//!
//! **Server** ([`LeaseController`], `--enable-lease-controller`): the Lease
//! `konnectivity-proxy-server-<server-id>` in `--lease-namespace`, holder
//! the server id, labels `--lease-label`, duration 30 s, renewed every 15 s
//! (4 % jitter) as client-go's `component-helpers` lease controller does it
//! (update the last lease seen; on failure get-or-create with a backoff of
//! 200 ms doubling up to 7 s, then update, up to 5 tries on conflicts); a
//! garbage collector lists the leases matching `--lease-label` every 15 s
//! and deletes the expired ones with a resourceVersion precondition,
//! counting upstream's `lease_list_*`, `lease_delete_*` and
//! `culled_leases_count`. On a graceful stop the server deletes its own
//! lease (bounded wait).
//!
//! **Agent** ([`start_counter`], `--count-server-leases`): upstream lists
//! the leases through an informer and re-counts them only when its sync
//! loop asks (#648). konn lists, then **watches** the leases matching the
//! selector and re-counts on every event and at the instant the next valid
//! lease expires, handing each new count to the sync loop at once. While
//! kube-apiserver cannot be reached the last good count stays (upstream's
//! fallback on a failed list); the list is retried with a backoff.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures_util::StreamExt;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{
    Api, DeleteParams, ListParams, PostParams, Preconditions, WatchEvent, WatchParams,
};
use tokio::sync::{oneshot, watch};
use tokio::time::Instant;

use super::{CallError, ControlPlane, Limiter, call, wall_now};

/// Lease duration (upstream's `LeaseDuration`).
pub const LEASE_DURATION: Duration = Duration::from_secs(30);
/// Renewal period (upstream's `LeaseRenewalInterval`).
pub const RENEW_INTERVAL: Duration = Duration::from_secs(15);
/// Garbage collection period (upstream's `LeaseGCInterval`).
pub const GC_INTERVAL: Duration = Duration::from_secs(15);
/// Bound on one lease API call.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// Renewal jitter (client-go's lease controller: 0.04).
const RENEW_JITTER: f64 = 0.04;
/// client-go's `maxUpdateRetries`.
const MAX_UPDATE_RETRIES: usize = 5;
/// client-go's `maxBackoff` for ensuring the lease exists.
const ENSURE_BACKOFF_CAP: Duration = Duration::from_secs(7);
/// Server-side timeout of one watch call.
const WATCH_TIMEOUT_SECS: u32 = 290;
/// A watch that shows nothing (not even a bookmark) this long is renewed.
const WATCH_IDLE: Duration = Duration::from_secs(330);
/// Re-list backoff of the agent's counter: first, cap.
const RELIST_BACKOFF: (Duration, Duration) = (Duration::from_millis(500), Duration::from_secs(30));

/// The name of a server's lease.
pub fn lease_name(server_id: &str) -> String {
    format!("konnectivity-proxy-server-{server_id}")
}

/// `k=v,k2=v2` in key order (apimachinery's `labels.FormatLabels`).
pub fn format_labels(labels: &BTreeMap<String, String>) -> String {
    labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

fn to_system(t: &MicroTime) -> SystemTime {
    SystemTime::from(t.0)
}

fn micro_now() -> Option<MicroTime> {
    k8s_openapi::jiff::Timestamp::try_from(wall_now())
        .ok()
        .map(MicroTime)
}

/// The instant `lease` stops being valid; `None` when it has neither a
/// renew nor an acquire time (never valid).
pub fn expiry(lease: &Lease) -> Option<SystemTime> {
    let spec = lease.spec.as_ref()?;
    let last = spec.renew_time.as_ref().or(spec.acquire_time.as_ref())?;
    let secs = u64::try_from(spec.lease_duration_seconds.unwrap_or(0)).unwrap_or(0);
    Some(to_system(last) + Duration::from_secs(secs))
}

/// Whether `lease` is valid at `now` (upstream's `IsLeaseValid`).
pub fn is_valid(lease: &Lease, now: SystemTime) -> bool {
    expiry(lease).is_some_and(|e| e > now)
}

/// The leases an agent knows, by name, with their expiry.
#[derive(Debug, Default, Clone)]
pub struct LeaseTable {
    leases: HashMap<String, Option<SystemTime>>,
}

impl LeaseTable {
    /// Replace everything with a fresh list.
    pub fn reset<'a>(&mut self, leases: impl IntoIterator<Item = &'a Lease>) {
        self.leases.clear();
        for l in leases {
            self.upsert(l);
        }
    }

    /// A lease was added or changed.
    pub fn upsert(&mut self, lease: &Lease) {
        if let Some(name) = &lease.metadata.name {
            self.leases.insert(name.clone(), expiry(lease));
        }
    }

    /// A lease was deleted.
    pub fn remove(&mut self, lease: &Lease) {
        if let Some(name) = &lease.metadata.name {
            self.leases.remove(name);
        }
    }

    /// Valid leases at `now`, and when the next of them expires.
    pub fn count(&self, now: SystemTime) -> (usize, Option<SystemTime>) {
        let mut n = 0;
        let mut next: Option<SystemTime> = None;
        for e in self.leases.values().flatten() {
            if *e > now {
                n += 1;
                next = Some(next.map_or(*e, |x| x.min(*e)));
            }
        }
        (n, next)
    }
}

/// Told about the server's lease API calls (upstream's lease metrics).
pub trait LeaseGcObserver: Send + Sync + 'static {
    /// A list call of the garbage collector ended with `code` and `reason`
    /// (200 and "" on success).
    fn list(&self, code: u16, reason: &str, latency: Duration);
    /// A delete call of the garbage collector ended.
    fn delete(&self, code: u16, reason: &str, latency: Duration);
    /// An expired lease was deleted.
    fn culled(&self);
}

/// The server's lease (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseConfig {
    /// `--lease-namespace`.
    pub namespace: String,
    /// `--server-id`: the holder, and part of the name.
    pub server_id: String,
    /// `--lease-label`, parsed.
    pub labels: BTreeMap<String, String>,
    /// Lease duration.
    pub duration: Duration,
    /// Renewal period.
    pub renew_interval: Duration,
    /// Garbage collection period.
    pub gc_interval: Duration,
}

impl LeaseConfig {
    /// Upstream's timings for this server.
    pub fn new(
        namespace: impl Into<String>,
        server_id: impl Into<String>,
        labels: BTreeMap<String, String>,
    ) -> Self {
        Self {
            namespace: namespace.into(),
            server_id: server_id.into(),
            labels,
            duration: LEASE_DURATION,
            renew_interval: RENEW_INTERVAL,
            gc_interval: GC_INTERVAL,
        }
    }
}

/// The running lease controller of a server.
pub struct LeaseController {
    stop: Option<(watch::Sender<bool>, oneshot::Receiver<()>)>,
    limiter: Arc<Limiter>,
    api: Api<Lease>,
    name: String,
}

impl fmt::Debug for LeaseController {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaseController")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl LeaseController {
    /// Start acquiring, renewing and garbage-collecting on `control`'s
    /// thread.
    pub fn start(
        control: &ControlPlane,
        config: LeaseConfig,
        observer: Arc<dyn LeaseGcObserver>,
    ) -> Self {
        let api: Api<Lease> = Api::namespaced(control.client(), &config.namespace);
        let limiter = control.limiter();
        let name = lease_name(&config.server_id);
        let (stop_tx, stop_rx) = watch::channel(false);
        let (gone_tx, gone_rx) = oneshot::channel();
        let renewer = Renewer {
            api: api.clone(),
            limiter: limiter.clone(),
            name: name.clone(),
            config: config.clone(),
            latest: None,
            rng: crate::io::clock::seed() | 1,
        };
        let gc = Collector {
            api: api.clone(),
            limiter: limiter.clone(),
            selector: format_labels(&config.labels),
            observer,
        };
        tracing::info!(lease = %name, namespace = %config.namespace, "starting the lease controller");
        let (mut s1, mut s2) = (stop_rx.clone(), stop_rx);
        control.spawn(async move {
            tokio::select! {
                () = renewer.run() => {}
                _ = s1.wait_for(|s| *s) => {}
            }
            let _ = gone_tx.send(());
        });
        let period = config.gc_interval;
        control.spawn(async move {
            tokio::select! {
                () = gc.run(period) => {}
                _ = s2.wait_for(|s| *s) => {}
            }
        });
        Self {
            stop: Some((stop_tx, gone_rx)),
            limiter,
            api,
            name,
        }
    }

    /// The lease's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Stop renewing and delete this server's lease, waiting at most
    /// `timeout` (called from a thread that is not the control plane's).
    pub fn stop(mut self, control: &ControlPlane, timeout: Duration) {
        let Some((stop, gone)) = self.stop.take() else {
            return;
        };
        let _ = stop.send(true);
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let (api, limiter, name) = (self.api.clone(), self.limiter.clone(), self.name.clone());
        control.spawn(async move {
            // Let a renewal in progress end first, so it cannot re-create
            // the lease after the delete.
            let _ = tokio::time::timeout(Duration::from_secs(1), gone).await;
            let deadline = Instant::now() + timeout;
            let r = call(
                &limiter,
                deadline,
                api.delete(&name, &DeleteParams::default()),
            )
            .await;
            let _ = tx.send(r.map(|_| ()));
        });
        match rx.recv_timeout(timeout + Duration::from_secs(1)) {
            Ok(Ok(())) => tracing::info!(lease = %self.name, "deleted this server's lease"),
            Ok(Err(e)) if e.is_not_found() => {}
            Ok(Err(e)) => {
                tracing::error!(lease = %self.name, error = %e, "could not clean up this server's lease");
            }
            Err(_) => {
                tracing::error!(lease = %self.name, "could not clean up this server's lease in time")
            }
        }
    }
}

/// client-go's `component-helpers` lease controller, for one lease.
struct Renewer {
    api: Api<Lease>,
    limiter: Arc<Limiter>,
    name: String,
    config: LeaseConfig,
    latest: Option<Lease>,
    rng: u64,
}

impl Renewer {
    fn next_f64(&mut self) -> f64 {
        // xorshift64*; only spreads renewals apart.
        let mut x = self.rng;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng = x;
        (x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 / (1u64 << 53) as f64
    }

    async fn run(mut self) {
        loop {
            self.sync().await;
            let r = self.next_f64();
            let pause = self.config.renew_interval.mul_f64(1.0 + r * RENEW_JITTER);
            tokio::time::sleep(pause).await;
        }
    }

    fn deadline() -> Instant {
        Instant::now() + CALL_TIMEOUT
    }

    /// The lease as it should be written now (client-go's `newLease`).
    fn desired(&self, base: Option<&Lease>) -> Lease {
        let mut lease = base.cloned().unwrap_or_else(|| Lease {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                namespace: Some(self.config.namespace.clone()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(self.config.server_id.clone()),
                ..LeaseSpec::default()
            }),
        });
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        spec.lease_duration_seconds = i32::try_from(self.config.duration.as_secs()).ok();
        spec.renew_time = micro_now();
        lease.metadata.labels = Some(self.config.labels.clone());
        lease
    }

    async fn sync(&mut self) {
        if let Some(latest) = self.latest.clone() {
            match self.update(latest).await {
                Ok(()) => return,
                Err(e) => {
                    tracing::info!(lease = %self.name, error = %e, "failed to update lease using latest lease, fallback to ensure lease")
                }
            }
        }
        let (lease, created) = self.ensure_with_backoff().await;
        self.latest = Some(lease.clone());
        if !created && let Err(e) = self.update(lease).await {
            tracing::error!(lease = %self.name, error = %e, interval = ?self.config.renew_interval, "will retry updating lease");
        }
    }

    async fn ensure_with_backoff(&mut self) -> (Lease, bool) {
        let mut sleep = Duration::from_millis(100);
        loop {
            match self.ensure().await {
                Ok(r) => return r,
                Err(e) => {
                    sleep = (sleep * 2).min(ENSURE_BACKOFF_CAP);
                    tracing::error!(lease = %self.name, error = %e, interval = ?sleep, "failed to ensure lease exists, will retry");
                    tokio::time::sleep(sleep).await;
                }
            }
        }
    }

    async fn ensure(&self) -> Result<(Lease, bool), CallError> {
        match call(&self.limiter, Self::deadline(), self.api.get(&self.name)).await {
            Ok(l) => Ok((l, false)),
            Err(e) if e.is_not_found() => {
                let lease = self.desired(None);
                let created = call(
                    &self.limiter,
                    Self::deadline(),
                    self.api.create(&PostParams::default(), &lease),
                )
                .await?;
                tracing::info!(lease = %self.name, "created this server's lease");
                Ok((created, true))
            }
            Err(e) => Err(e),
        }
    }

    async fn update(&mut self, base: Lease) -> Result<(), CallError> {
        let mut base = base;
        for _ in 0..MAX_UPDATE_RETRIES {
            let lease = self.desired(Some(&base));
            match call(
                &self.limiter,
                Self::deadline(),
                self.api.replace(&self.name, &PostParams::default(), &lease),
            )
            .await
            {
                Ok(l) => {
                    tracing::trace!(lease = %self.name, "renewed");
                    self.latest = Some(l);
                    return Ok(());
                }
                Err(e) => {
                    tracing::error!(lease = %self.name, error = %e, "failed to update lease");
                    if e.is_conflict() {
                        base = self.ensure_with_backoff().await.0;
                    }
                }
            }
        }
        Err(CallError::Transport(format!(
            "failed {MAX_UPDATE_RETRIES} attempts to update lease"
        )))
    }
}

/// Upstream's `GarbageCollectionController`.
struct Collector {
    api: Api<Lease>,
    limiter: Arc<Limiter>,
    selector: String,
    observer: Arc<dyn LeaseGcObserver>,
}

impl Collector {
    async fn run(self, period: Duration) {
        loop {
            self.gc().await;
            tokio::time::sleep(period).await;
        }
    }

    async fn gc(&self) {
        let start = Instant::now();
        let lp = ListParams::default().labels(&self.selector);
        let leases = match call(&self.limiter, start + CALL_TIMEOUT, self.api.list(&lp)).await {
            Ok(l) => {
                self.observer.list(200, "", start.elapsed());
                l
            }
            Err(e) => {
                tracing::error!(error = %e, "could not list leases to garbage collect");
                if let CallError::Api { code, reason, .. } = &e {
                    self.observer.list(*code, reason, start.elapsed());
                }
                return;
            }
        };
        let now = wall_now();
        for lease in leases.items.iter().filter(|l| !is_valid(l, now)) {
            let Some(name) = lease.metadata.name.as_deref() else {
                continue;
            };
            let dp = DeleteParams {
                preconditions: Some(Preconditions {
                    resource_version: lease.metadata.resource_version.clone(),
                    uid: None,
                }),
                ..DeleteParams::default()
            };
            let t = Instant::now();
            match call(&self.limiter, t + CALL_TIMEOUT, self.api.delete(name, &dp)).await {
                Ok(_) => {
                    tracing::info!(lease = %name, "deleted an expired lease");
                    self.observer.culled();
                    self.observer.delete(200, "", t.elapsed());
                }
                Err(e) => {
                    if e.is_not_found() {
                        tracing::debug!(lease = %name, "lease was already deleted");
                    } else {
                        tracing::error!(lease = %name, error = %e, "could not delete lease");
                    }
                    if let CallError::Api { code, reason, .. } = &e {
                        self.observer.delete(*code, reason, t.elapsed());
                    }
                }
            }
        }
    }
}

/// Told about the agent's lease API calls (upstream's agent lease metrics).
pub trait LeaseCountObserver: Send + Sync + 'static {
    /// A list call ended with `code` and `reason` (200 and "" on success).
    fn list(&self, code: u16, reason: &str, latency: Duration);
    /// A watch call started (200) or was refused.
    fn watch(&self, code: u16, reason: &str);
}

/// What the agent's counter wants to count.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CountConfig {
    /// `--lease-namespace`.
    pub namespace: String,
    /// `--lease-label-selector` (a Kubernetes label selector).
    pub selector: String,
}

/// The result of handing a count to the sync loop.
pub enum CountDelivery {
    /// Delivered.
    Delivered,
    /// The inbox is full: try again shortly.
    Full,
    /// The sync loop is gone: stop counting.
    Gone,
}

/// Receives every new count of valid leases (called on the control-plane
/// thread).
pub type CountSink = Box<dyn FnMut(usize) -> CountDelivery + Send>;

/// Start counting leases on `control`'s thread; `sink` gets the number of
/// valid leases each time it changes (first after the first list).
pub fn start_counter(
    control: &ControlPlane,
    config: CountConfig,
    observer: Arc<dyn LeaseCountObserver>,
    sink: CountSink,
) {
    let api: Api<Lease> = Api::namespaced(control.client(), &config.namespace);
    let counter = Counter {
        api,
        limiter: control.limiter(),
        selector: config.selector,
        observer,
        sink,
        table: LeaseTable::default(),
        published: None,
    };
    control.spawn(counter.run());
}

struct Counter {
    api: Api<Lease>,
    limiter: Arc<Limiter>,
    selector: String,
    observer: Arc<dyn LeaseCountObserver>,
    sink: CountSink,
    table: LeaseTable,
    published: Option<usize>,
}

/// Why a watch ended.
enum WatchEnd {
    /// Watch again from the last resource version.
    Rewatch,
    /// List again (the version is too old, or the watch failed).
    Relist,
    /// The sync loop is gone.
    Stop,
}

impl Counter {
    async fn run(mut self) {
        let mut backoff = RELIST_BACKOFF.0;
        loop {
            let Some(mut version) = self.list().await else {
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(RELIST_BACKOFF.1);
                continue;
            };
            if !self.publish().await {
                return;
            }
            loop {
                match self.watch(&mut version).await {
                    WatchEnd::Rewatch => backoff = RELIST_BACKOFF.0,
                    WatchEnd::Relist => break,
                    WatchEnd::Stop => return,
                }
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(RELIST_BACKOFF.1);
        }
    }

    /// List the leases; the resource version to watch from.
    async fn list(&mut self) -> Option<String> {
        let start = Instant::now();
        let lp = ListParams::default().labels(&self.selector);
        match call(&self.limiter, start + CALL_TIMEOUT, self.api.list(&lp)).await {
            Ok(list) => {
                self.observer.list(200, "", start.elapsed());
                self.table.reset(list.items.iter());
                Some(list.metadata.resource_version.unwrap_or_default())
            }
            Err(e) => {
                tracing::error!(error = %e, fallback = ?self.published, "could not list leases to update server count, keeping the last count");
                if let CallError::Api { code, reason, .. } = &e {
                    self.observer.list(*code, reason, start.elapsed());
                }
                None
            }
        }
    }

    async fn watch(&mut self, version: &mut String) -> WatchEnd {
        let wp = WatchParams::default()
            .labels(&self.selector)
            .timeout(WATCH_TIMEOUT_SECS);
        let started = call(
            &self.limiter,
            Instant::now() + CALL_TIMEOUT,
            self.api.watch(&wp, version),
        )
        .await;
        let stream = match started {
            Ok(s) => {
                self.observer.watch(200, "");
                s
            }
            Err(e) => {
                tracing::error!(error = %e, "could not watch leases");
                if let CallError::Api { code, reason, .. } = &e {
                    self.observer.watch(*code, reason);
                }
                return WatchEnd::Relist;
            }
        };
        let mut stream = std::pin::pin!(stream);
        loop {
            let (_, next) = self.table.count(wall_now());
            let expiry = next.map_or(WATCH_IDLE, |e| {
                e.duration_since(wall_now()).unwrap_or(Duration::ZERO) + Duration::from_millis(1)
            });
            tokio::select! {
                ev = tokio::time::timeout(WATCH_IDLE, stream.next()) => {
                    let Ok(ev) = ev else { return WatchEnd::Rewatch };
                    match ev {
                        Some(Ok(WatchEvent::Added(l) | WatchEvent::Modified(l))) => {
                            if let Some(v) = &l.metadata.resource_version { version.clone_from(v); }
                            self.table.upsert(&l);
                        }
                        Some(Ok(WatchEvent::Deleted(l))) => {
                            if let Some(v) = &l.metadata.resource_version { version.clone_from(v); }
                            self.table.remove(&l);
                        }
                        Some(Ok(WatchEvent::Bookmark(b))) => version.clone_from(&b.metadata.resource_version),
                        Some(Ok(WatchEvent::Error(s))) => {
                            tracing::debug!(code = s.code, reason = %s.reason, "lease watch ended with an error");
                            return WatchEnd::Relist;
                        }
                        Some(Err(e)) => {
                            tracing::debug!(error = %e, "lease watch broke");
                            return WatchEnd::Relist;
                        }
                        None => return WatchEnd::Rewatch,
                    }
                }
                () = tokio::time::sleep(expiry.min(WATCH_IDLE)) => {}
            }
            if !self.publish().await {
                return WatchEnd::Stop;
            }
        }
    }

    /// Hand the current count to the sync loop if it changed; `false` when
    /// the sync loop is gone.
    async fn publish(&mut self) -> bool {
        let (n, _) = self.table.count(wall_now());
        if self.published == Some(n) {
            return true;
        }
        let mut pause = Duration::from_millis(1);
        loop {
            match (self.sink)(n) {
                CountDelivery::Delivered => break,
                CountDelivery::Gone => return false,
                CountDelivery::Full => {
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(50));
                }
            }
        }
        tracing::info!(leases = n, "server lease count changed");
        self.published = Some(n);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(
        name: &str,
        renew: Option<SystemTime>,
        acquire: Option<SystemTime>,
        secs: i32,
    ) -> Lease {
        let mt = |t: SystemTime| MicroTime(k8s_openapi::jiff::Timestamp::try_from(t).unwrap());
        Lease {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                renew_time: renew.map(mt),
                acquire_time: acquire.map(mt),
                lease_duration_seconds: Some(secs),
                ..LeaseSpec::default()
            }),
        }
    }

    #[test]
    fn validity_follows_is_lease_valid() {
        let now = wall_now();
        let s = Duration::from_secs;
        assert!(is_valid(&lease("a", Some(now - s(10)), None, 30), now));
        assert!(!is_valid(&lease("a", Some(now - s(31)), None, 30), now));
        // Renew time wins over acquire time.
        assert!(!is_valid(
            &lease("a", Some(now - s(40)), Some(now), 30),
            now
        ));
        assert!(is_valid(&lease("a", None, Some(now - s(1)), 30), now));
        assert!(!is_valid(&lease("a", None, None, 30), now));
        assert!(!is_valid(&Lease::default(), now));
    }

    #[test]
    fn table_counts_valid_leases_and_the_next_expiry() {
        let now = wall_now();
        let s = Duration::from_secs;
        let mut t = LeaseTable::default();
        let (a, b, c) = (
            lease("a", Some(now - s(10)), None, 30),
            lease("b", Some(now - s(25)), None, 30),
            lease("c", Some(now - s(60)), None, 30),
        );
        t.reset([&a, &b, &c]);
        let (n, next) = t.count(now);
        assert_eq!(n, 2);
        assert_eq!(next, expiry(&b));
        // b expires: one left.
        assert_eq!(t.count(now + s(6)).0, 1);
        // b renewed: two again; c deleted changes nothing.
        t.upsert(&lease("b", Some(now), None, 30));
        t.remove(&c);
        assert_eq!(t.count(now + s(6)).0, 2);
        t.remove(&a);
        assert_eq!(t.count(now).0, 1);
        t.reset([]);
        assert_eq!(t.count(now), (0, None));
    }

    #[test]
    fn names_and_labels() {
        assert_eq!(lease_name("abc"), "konnectivity-proxy-server-abc");
        let mut l = BTreeMap::new();
        l.insert("z".to_owned(), "1".to_owned());
        l.insert("k8s-app".to_owned(), "konnectivity-server".to_owned());
        assert_eq!(format_labels(&l), "k8s-app=konnectivity-server,z=1");
    }
}
