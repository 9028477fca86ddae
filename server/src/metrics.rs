//! proxy-server's Prometheus metrics: every family upstream v0.36.0
//! registers (`pkg/server/metrics`), with the same names, types, label
//! names, label values, HELP text and buckets, as typed handles.
//!
//! [`ServerMetrics`] owns the registry and is shared by the whole process
//! (cheap to clone, any thread). Each worker claims a [`ServerCoreMetrics`]
//! with [`ServerMetrics::core`] and counts the data path on it: the handles
//! it returns update memory only that core writes, for example
//!
//! ```
//! # use konn_server::metrics::*;
//! # use konn_frames::packet::PacketType;
//! let metrics = ServerMetrics::new(1);
//! let core = metrics.core(0).unwrap();
//! core.stream_packets(Segment::FromAgent, PacketType::Data).inc();
//! core.grpc_connections(ServiceMethod::Connect).inc();
//! ```
//!
//! # When series appear
//!
//! As in Go, a series shows up in scrapes from its first update. Plain
//! (non-vector) metrics upstream are present from start-up and are touched
//! by [`ServerMetrics::new`]: `http_connections` and
//! `culled_leases_count`. Upstream also sets `ready_backend_connections`
//! and `ready_backends{proxy_strategy}` to 0 when it creates each backend
//! storage; the server does the same through
//! [`ServerMetrics::init_backend_storage`] for every configured strategy.
//! `full_receive_channels{service_method}` appears when a stream of that
//! method starts (upstream fetches the gauge then): call
//! `full_receive_channels(method).touch()`.
//!
//! # Gauges
//!
//! A gauge's value is the sum of a process-wide part (the `set_*` methods
//! here, last writer wins like Go's `Set`) and every core's share (the
//! [`LocalGauge`] handles of [`ServerCoreMetrics`]: `inc`/`dec`, or `set` of
//! the core's own part). Use one style per gauge: counts kept per core go
//! through the core handles, counts of process-wide state through `set_*`.
//!
//! # Not reproduced
//!
//! `connection_duration_seconds` exists on upstream master only, not in
//! v0.36.0, so konn does not register it. Go runtime metrics (`go_*`) have
//! no equivalent; `process_*` and `promhttp_*` are registered as upstream's
//! default registry has them (see `konn_core::metrics`).

use std::time::Duration;

pub use konn_core::metrics::common::Segment;
use konn_core::metrics::{
    CoreMetrics, CounterVec, DynamicCounterVec, DynamicHistogramVec, GaugeVec, HistogramVec,
    LocalCounter, LocalGauge, LocalHistogram, Registry, SharedCounter, SharedGauge,
    common::{
        ConnEnd, ConnFamilies, ResumeFamilies, ResumeResult, ReverseDirection, ReverseFamilies,
        ReverseResult, StreamFamilies,
    },
};
use konn_frames::{GrpcStatus, packet::PacketType};
use konn_protocol::server::router::ReverseRefusal;

/// The prefix of every server family (`Namespace` + `Subsystem`).
pub const PREFIX: &str = "konnectivity_network_proxy_server_";

/// Buckets of the dial and frontend-write latencies, 1 µs to 12.5 s.
pub const LATENCY_BUCKETS: [f64; 9] =
    [0.000001, 0.00001, 0.0001, 0.005, 0.025, 0.1, 0.5, 2.5, 12.5];

/// Buckets of the lease latencies: client_golang's `DefBuckets` (upstream
/// sets none for them).
pub const LEASE_BUCKETS: [f64; 11] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// The gRPC service method a connection serves (`service_method` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ServiceMethod {
    /// `ProxyService.Proxy`: a frontend stream.
    Proxy = 0,
    /// `AgentService.Connect`: an agent tunnel.
    Connect = 1,
}

impl ServiceMethod {
    /// The label value.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Proxy => "Proxy",
            Self::Connect => "Connect",
        }
    }
}

const SERVICE_METHODS: [&str; 2] = [
    ServiceMethod::Proxy.as_str(),
    ServiceMethod::Connect.as_str(),
];

/// A backend strategy (`proxy_strategy` label of `ready_backends`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Strategy {
    /// `default`.
    Default = 0,
    /// `destHost`.
    DestHost = 1,
    /// `defaultRoute`.
    DefaultRoute = 2,
}

impl Strategy {
    /// The label value (upstream's `ProxyStrategy.String()`).
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Default => "default",
            Self::DestHost => "destHost",
            Self::DefaultRoute => "defaultRoute",
        }
    }
}

const STRATEGIES: [&str; 3] = [
    Strategy::Default.as_str(),
    Strategy::DestHost.as_str(),
    Strategy::DefaultRoute.as_str(),
];

/// Why a dial failed (`reason` label of `dial_failure_count`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DialFailureReason {
    /// No agent is connected.
    NoAgent = 0,
    /// The agent reported the dial failure.
    ErrorResponse = 1,
    /// A DIAL_RSP for a dial id the server does not know.
    UnrecognizedResponse = 2,
    /// The agent dialled, but the DIAL_RSP could not be sent to the frontend.
    SendResponse = 3,
    /// A DIAL_CLS from the agent before the dial completed.
    BackendClose = 4,
    /// Timed out sending DIAL_REQ or waiting for DIAL_RSP.
    BackendDialTimeout = 5,
    /// A DIAL_CLS from the frontend before the dial completed.
    FrontendClose = 6,
}

impl DialFailureReason {
    /// The label value.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::NoAgent => "no_agent",
            Self::ErrorResponse => "error_response",
            Self::UnrecognizedResponse => "unrecognized_response",
            Self::SendResponse => "send_rsp",
            Self::BackendClose => "backend_close",
            Self::BackendDialTimeout => "backend_dial_timeout",
            Self::FrontendClose => "frontend_close",
        }
    }
}

const DIAL_FAILURE_REASONS: [&str; 7] = [
    DialFailureReason::NoAgent.as_str(),
    DialFailureReason::ErrorResponse.as_str(),
    DialFailureReason::UnrecognizedResponse.as_str(),
    DialFailureReason::SendResponse.as_str(),
    DialFailureReason::BackendClose.as_str(),
    DialFailureReason::BackendDialTimeout.as_str(),
    DialFailureReason::FrontendClose.as_str(),
];

/// The families, by handle.
#[derive(Debug, Clone, Copy)]
struct Families {
    dial_duration: HistogramVec,
    frontend_write_duration: HistogramVec,
    grpc_connections: GaugeVec,
    http_connections: GaugeVec,
    ready_backend_connections: GaugeVec,
    ready_backends: GaugeVec,
    pending_backend_dials: GaugeVec,
    established_connections: GaugeVec,
    full_receive_channels: GaugeVec,
    dial_failures: CounterVec,
    stream: StreamFamilies,
    culled_leases: CounterVec,
    lease_delete_latency: DynamicHistogramVec,
    lease_deletes: DynamicCounterVec,
    lease_list_latency: DynamicHistogramVec,
    lease_lists: DynamicCounterVec,
    reverse: ReverseFamilies,
    budget_resets: DynamicCounterVec,
    tls_reloads: DynamicCounterVec,
    agent_auth: DynamicCounterVec,
    token_reviews: DynamicCounterVec,
    clusters: GaugeVec,
    cluster_reloads: DynamicCounterVec,
    sni_refusals: DynamicCounterVec,
    dial_refusals: DynamicCounterVec,
    conns: ConnFamilies,
    audit_dropped: CounterVec,
    resume: ResumeFamilies,
}

/// `reason` labels of `konn_reverse_refusals_total`, in
/// [`ReverseRefusal::ALL`] order.
const REVERSE_REASONS: [&str; 10] = {
    let mut out = [""; 10];
    let mut i = 0;
    while i < 10 {
        out[i] = ReverseRefusal::ALL[i].label();
        i += 1;
    }
    out
};

impl Families {
    fn register(b: &mut konn_core::metrics::RegistryBuilder) -> Self {
        let dial_duration = b.histogram(
            "konnectivity_network_proxy_server_dial_duration_seconds",
            "Latency of dial to the remote endpoint in seconds",
            &LATENCY_BUCKETS,
        );
        let frontend_write_duration = b.histogram(
            "konnectivity_network_proxy_server_frontend_write_duration_seconds",
            "Latency of write to the frontend in seconds",
            &LATENCY_BUCKETS,
        );
        let grpc_connections = b.gauge_vec(
            "konnectivity_network_proxy_server_grpc_connections",
            "Number of current grpc connections, partitioned by service method.",
            &["service_method"],
            &[&SERVICE_METHODS],
        );
        let http_connections = b.gauge(
            "konnectivity_network_proxy_server_http_connections",
            "Number of current HTTP CONNECT connections",
        );
        let ready_backend_connections = b.gauge(
            "konnectivity_network_proxy_server_ready_backend_connections",
            "Number of konnectivity agent connected to the proxy server. DEPRECATED, please use ready_backends",
        );
        let ready_backends = b.gauge_vec(
            "konnectivity_network_proxy_server_ready_backends",
            "Number of konnectivity agent connected to the proxy server",
            &["proxy_strategy"],
            &[&STRATEGIES],
        );
        let pending_backend_dials = b.gauge(
            "konnectivity_network_proxy_server_pending_backend_dials",
            "Current number of pending backend dial requests",
        );
        let established_connections = b.gauge(
            "konnectivity_network_proxy_server_established_connections",
            "Current number of established end-to-end connections (post-dial).",
        );
        let full_receive_channels = b.gauge_vec(
            "konnectivity_network_proxy_server_full_receive_channels",
            "Number of current connections blocked by a full receive channel, partitioned by service method.",
            &["service_method"],
            &[&SERVICE_METHODS],
        );
        let dial_failures = b.counter_vec(
            "konnectivity_network_proxy_server_dial_failure_count",
            "Number of dial failures observed. Multiple failures can occur for a single dial request.",
            &["reason"],
            &[&DIAL_FAILURE_REASONS],
        );
        let stream = StreamFamilies::register(
            b,
            "konnectivity_network_proxy_server_stream_packets_total",
            "konnectivity_network_proxy_server_stream_errors_total",
        );
        let culled_leases = b.counter(
            "konnectivity_network_proxy_server_culled_leases_count",
            "Count of expired leases that the lease garbage collection controller has culled.",
        );
        let lease_delete_latency = b.dynamic_histogram_vec(
            "konnectivity_network_proxy_server_lease_delete_latency_seconds",
            "Latency of lease deletion calls by the garbage collection controller in seconds.",
            &LEASE_BUCKETS,
            &["http_status_code"],
        );
        // "delection" and "deletion calls" for the list counter are
        // upstream's text, kept verbatim.
        let lease_deletes = b.dynamic_counter_vec(
            "konnectivity_network_proxy_server_lease_delete_total",
            "Count of lease delection calls by the garbage collection controller. Labeled by HTTP status code and reason.",
            &["http_status_code", "reason"],
        );
        let lease_list_latency = b.dynamic_histogram_vec(
            "konnectivity_network_proxy_server_lease_list_latency_seconds",
            "Latency of lease list calls by the garbage collection controller in seconds.",
            &LEASE_BUCKETS,
            &["http_status_code"],
        );
        let lease_lists = b.dynamic_counter_vec(
            "konnectivity_network_proxy_server_lease_list_total",
            "Count of lease deletion calls by the garbage collection controller. Labeled by HTTP status code and reason.",
            &["http_status_code", "reason"],
        );
        // konn's own families (no upstream counterpart).
        let agent_auth = b.dynamic_counter_vec(
            "konn_server_agent_auth_total",
            "Agent token authentications, by result (allowed, missing_token, too_many_tokens, no_bearer_prefix, denied, unavailable, timeout, busy) and where the verdict came from (header, api, cache, coalesced, reviewer).",
            &["result", "source"],
        );
        let token_reviews = b.dynamic_counter_vec(
            "konn_server_token_reviews_total",
            "TokenReview calls made to kube-apiserver, by HTTP status code (none: no answer).",
            &["code"],
        );
        let budget_resets = b.dynamic_counter_vec(
            "konn_memory_budget_resets_total",
            "Streams reset, or parked tunnels closed, because the data queued for them did not fit --memory-budget, by queue (frontend: towards a gRPC frontend; parked: held for a tunnel's resume).",
            &["queue"],
        );
        let tls_reloads = b.dynamic_counter_vec(
            "konn_tls_reloads_total",
            "Certificate, key and CA files reloaded after a change on disk, by listener (agent, frontend) and result (ok, error: the previous material stays in use).",
            &["listener", "result"],
        );
        let reverse = ReverseFamilies::register(b, &REVERSE_REASONS);
        // --clusters-config only (never touched without it).
        let clusters = b.gauge(
            "konn_server_clusters",
            "Clusters served (--clusters-config).",
        );
        let cluster_reloads = b.dynamic_counter_vec(
            "konn_server_clusters_config_reloads_total",
            "Reloads of --clusters-config, by result (ok, error: the file was refused whole and the running configuration kept).",
            &["result"],
        );
        let sni_refusals = b.dynamic_counter_vec(
            "konn_server_agent_sni_refusals_total",
            "Agent connections refused before TLS by --clusters-config, by reason (no_server_name, unknown_server_name, not_tls, timeout).",
            &["reason"],
        );
        let dial_refusals = b.dynamic_counter_vec(
            "konn_server_dial_refusals_total",
            "Dials refused before reaching an agent by konn's admission limits or overload manager, by reason (limit_agent_conns, limit_agent_rate, limit_dest_conns, limit_dest_rate, limit_frontend_conns, limit_frontend_rate, limit_cluster_conns, limit_cluster_rate, overload).",
            &["reason"],
        );
        let conns = ConnFamilies::register(b);
        let audit_dropped = b.counter(
            "konn_audit_records_dropped_total",
            "Audit records dropped because the audit log's queue was full or its file could not be written (--audit-log-path); traffic is never held for the audit log.",
        );
        let resume = ResumeFamilies::register(b);
        Self {
            resume,
            conns,
            audit_dropped,
            clusters,
            cluster_reloads,
            sni_refusals,
            dial_refusals,
            budget_resets,
            tls_reloads,
            reverse,
            agent_auth,
            token_reviews,
            dial_duration,
            frontend_write_duration,
            grpc_connections,
            http_connections,
            ready_backend_connections,
            ready_backends,
            pending_backend_dials,
            established_connections,
            full_receive_channels,
            dial_failures,
            stream,
            culled_leases,
            lease_delete_latency,
            lease_deletes,
            lease_list_latency,
            lease_lists,
        }
    }
}

/// proxy-server's metrics: the registry plus typed access. Shared by the
/// whole process.
#[derive(Debug, Clone)]
pub struct ServerMetrics {
    registry: Registry,
    families: Families,
}

impl ServerMetrics {
    /// Registers every server family, the `process_*` and `promhttp_*`
    /// families, with one slab per worker (`cores`): the one registry of a
    /// server without `--clusters-config`.
    pub fn new(cores: usize) -> Self {
        Self::build(cores, true, true)
    }

    /// With `--clusters-config`, the process-wide registry: `process_*`,
    /// `promhttp_*`, leases, token reviews, reloads. The families of the
    /// clusters are counted in their own registries ([`ServerMetrics::cluster`])
    /// and scraped with a `cluster` label ([`ServerMetrics::scrape`]).
    pub fn process(cores: usize) -> Self {
        Self::build(cores, true, false)
    }

    /// With `--clusters-config`, one cluster's registry.
    pub fn cluster(cores: usize) -> Self {
        Self::build(cores, false, true)
    }

    fn build(cores: usize, process: bool, cluster: bool) -> Self {
        let mut b = Registry::builder();
        let families = Families::register(&mut b);
        if process {
            b.process_metrics().scrape_metrics();
        }
        let registry = b.build(cores);
        // Plain NewGauge / NewCounter metrics upstream: present from start.
        if cluster {
            registry
                .gauge(families.http_connections.series(&[]))
                .touch();
        }
        if process {
            registry.counter(families.culled_leases.series(&[])).touch();
        }
        Self { registry, families }
    }

    /// A scrape of this registry with `clusters`' registries, each series
    /// of a cluster labelled `cluster="name"` (clusters sorted by name).
    pub fn scrape(&self, clusters: &[(&str, &Self)]) -> Vec<u8> {
        if clusters.is_empty() {
            return self.registry.scrape();
        }
        let parts: Vec<(&str, &Registry)> =
            clusters.iter().map(|(n, m)| (*n, &m.registry)).collect();
        self.registry.scrape_merged("cluster", &parts)
    }

    /// `konn_server_clusters` (with `--clusters-config`).
    pub fn set_clusters(&self, n: usize) {
        self.shared_gauge(self.families.clusters, &[]).set(n as f64);
    }

    /// `konn_server_clusters_config_reloads_total{result}` += 1.
    pub fn cluster_reload(&self, ok: bool) {
        let result = if ok { "ok" } else { "error" };
        self.registry
            .dynamic_counter_add(self.families.cluster_reloads, &[result], 1);
    }

    /// Count a tunnelled connection's end (`konn_connection_*`,
    /// `konn_connections_ended_total`; `konn_destination_bytes_total` for up
    /// to `destination_limit` destinations).
    pub fn conn_ended(&self, end: &ConnEnd<'_>, destination_limit: usize) {
        self.families
            .conns
            .record(&self.registry, end, destination_limit);
    }

    /// An agent left: its `konn_connection_*` series go.
    pub fn forget_agent(&self, agent_id: &str) {
        self.families.conns.forget_agent(&self.registry, agent_id);
    }

    /// `konn_audit_records_dropped_total`.
    pub fn audit_dropped(&self) -> SharedCounter<'_> {
        self.registry
            .counter(self.families.audit_dropped.series(&[]))
    }

    /// `konn_server_agent_sni_refusals_total{reason}` += 1.
    pub fn sni_refusal(&self, reason: &str) {
        self.registry
            .dynamic_counter_add(self.families.sni_refusals, &[reason], 1);
    }

    /// `konn_server_dial_refusals_total{reason}` += 1.
    pub fn dial_refusal(&self, reason: konn_protocol::server::limits::Refusal) {
        self.registry
            .dynamic_counter_add(self.families.dial_refusals, &[reason.as_str()], 1);
    }

    /// The registry (scrapes, `/metrics`).
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The data-path handle of worker `index`; `None` if out of range or
    /// already claimed.
    pub fn core(&self, index: usize) -> Option<ServerCoreMetrics> {
        Some(ServerCoreMetrics {
            core: self.registry.claim(index)?,
            families: self.families,
        })
    }

    /// What upstream does when it creates a backend storage: both backend
    /// gauges set to 0, for `strategy`.
    pub fn init_backend_storage(&self, strategy: Strategy) {
        self.set_ready_backend_connections(0);
        self.set_ready_backends(strategy, 0);
    }

    /// `full_receive_channels{service_method}` at 0 for both methods, from
    /// the start: alerts are written on the series. (Upstream creates a
    /// series only when a channel is first full; konn never blocks a
    /// receive loop on a full channel — flows are paused one by one — so
    /// the value stays 0.)
    pub fn init_connect_channels(&self) {
        for m in [ServiceMethod::Proxy, ServiceMethod::Connect] {
            self.registry
                .gauge(self.families.full_receive_channels.series(&[m as usize]))
                .touch();
        }
    }

    /// `ready_backend_connections` (deprecated; upstream's last writer
    /// among strategies wins).
    pub fn set_ready_backend_connections(&self, count: usize) {
        self.shared_gauge(self.families.ready_backend_connections, &[])
            .set(count as f64);
    }

    /// `ready_backends{proxy_strategy}`.
    pub fn set_ready_backends(&self, strategy: Strategy, count: usize) {
        self.shared_gauge(self.families.ready_backends, &[strategy as usize])
            .set(count as f64);
    }

    /// `pending_backend_dials`, process-wide part.
    pub fn set_pending_backend_dials(&self, count: usize) {
        self.shared_gauge(self.families.pending_backend_dials, &[])
            .set(count as f64);
    }

    /// `established_connections`, process-wide part.
    pub fn set_established_connections(&self, count: usize) {
        self.shared_gauge(self.families.established_connections, &[])
            .set(count as f64);
    }

    /// A dial failure counted from outside a worker.
    pub fn dial_failure(&self, reason: DialFailureReason) -> SharedCounter<'_> {
        self.registry
            .counter(self.families.dial_failures.series(&[reason as usize]))
    }

    /// `konn_memory_budget_resets_total{queue}` += `n`.
    pub fn budget_resets(&self, queue: &str, n: u64) {
        self.registry
            .dynamic_counter_add(self.families.budget_resets, &[queue], n);
    }

    /// `konn_tls_reloads_total{listener, result}` += 1.
    pub fn tls_reload(&self, listener: &str, ok: bool) {
        let result = if ok { "ok" } else { "error" };
        self.registry
            .dynamic_counter_add(self.families.tls_reloads, &[listener, result], 1);
    }

    /// `konn_server_agent_auth_total{result, source}` += 1.
    pub fn agent_auth(&self, result: &str, source: &str) {
        self.registry
            .dynamic_counter_add(self.families.agent_auth, &[result, source], 1);
    }

    /// `konn_server_token_reviews_total{code}` += 1 (`None`: no answer).
    pub fn token_review_call(&self, code: Option<u16>) {
        let code = code.map_or_else(|| "none".to_owned(), |c| c.to_string());
        self.registry
            .dynamic_counter_add(self.families.token_reviews, &[&code], 1);
    }

    /// `culled_leases_count` += 1.
    pub fn culled_leases_inc(&self) {
        self.registry
            .counter(self.families.culled_leases.series(&[]))
            .inc();
    }

    /// `lease_delete_total{http_status_code, reason}` += 1.
    pub fn observe_lease_delete(&self, http_code: u16, reason: &str) {
        let code = http_code.to_string();
        self.registry
            .dynamic_counter_add(self.families.lease_deletes, &[&code, reason], 1);
    }

    /// `lease_delete_latency_seconds{http_status_code}`.
    pub fn observe_lease_delete_latency(&self, http_code: u16, latency: Duration) {
        let code = http_code.to_string();
        self.registry.dynamic_histogram_observe(
            self.families.lease_delete_latency,
            &[&code],
            latency.as_secs_f64(),
        );
    }

    /// `lease_list_total{http_status_code, reason}` += 1.
    pub fn observe_lease_list(&self, http_code: u16, reason: &str) {
        let code = http_code.to_string();
        self.registry
            .dynamic_counter_add(self.families.lease_lists, &[&code, reason], 1);
    }

    /// `lease_list_latency_seconds{http_status_code}`.
    pub fn observe_lease_list_latency(&self, http_code: u16, latency: Duration) {
        let code = http_code.to_string();
        self.registry.dynamic_histogram_observe(
            self.families.lease_list_latency,
            &[&code],
            latency.as_secs_f64(),
        );
    }

    fn shared_gauge(&self, family: GaugeVec, idx: &[usize]) -> SharedGauge<'_> {
        self.registry.gauge(family.series(idx))
    }
}

/// One worker's data-path metrics. `Send` but not `Sync`: move it to its
/// worker and share it there with `Rc`.
#[derive(Debug)]
pub struct ServerCoreMetrics {
    core: CoreMetrics,
    families: Families,
}

impl ServerCoreMetrics {
    /// The worker index this handle counts for.
    pub fn index(&self) -> usize {
        self.core.index()
    }

    /// `stream_packets_total{segment, packet_type}` (upstream's
    /// `ObservePacket`).
    #[inline]
    pub fn stream_packets(&self, segment: Segment, ty: PacketType) -> LocalCounter<'_> {
        self.core.counter(self.families.stream.packets(segment, ty))
    }

    /// `stream_errors_total{segment, code, packet_type}`; `ty` is `None` for
    /// an error without a packet (`ObserveStreamErrorNoPacket`).
    #[inline]
    pub fn stream_errors(
        &self,
        segment: Segment,
        code: GrpcStatus,
        ty: Option<PacketType>,
    ) -> LocalCounter<'_> {
        self.core
            .counter(self.families.stream.errors(segment, code, ty))
    }

    /// `dial_failure_count{reason}`.
    #[inline]
    pub fn dial_failures(&self, reason: DialFailureReason) -> LocalCounter<'_> {
        self.core
            .counter(self.families.dial_failures.series(&[reason as usize]))
    }

    /// `dial_duration_seconds`: from DIAL_REQ to a successful DIAL_RSP.
    #[inline]
    pub fn dial_duration(&self) -> LocalHistogram<'_> {
        self.core.histogram(self.families.dial_duration.series(&[]))
    }

    /// `frontend_write_duration_seconds`: time to hand a packet to the
    /// frontend stream.
    #[inline]
    pub fn frontend_write_duration(&self) -> LocalHistogram<'_> {
        self.core
            .histogram(self.families.frontend_write_duration.series(&[]))
    }

    /// `grpc_connections{service_method}`, this core's share.
    #[inline]
    pub fn grpc_connections(&self, method: ServiceMethod) -> LocalGauge<'_> {
        self.core
            .gauge(self.families.grpc_connections.series(&[method as usize]))
    }

    /// `http_connections`, this core's share.
    #[inline]
    pub fn http_connections(&self) -> LocalGauge<'_> {
        self.core.gauge(self.families.http_connections.series(&[]))
    }

    /// `full_receive_channels{service_method}`, this core's share.
    #[inline]
    pub fn full_receive_channels(&self, method: ServiceMethod) -> LocalGauge<'_> {
        self.core.gauge(
            self.families
                .full_receive_channels
                .series(&[method as usize]),
        )
    }

    /// `pending_backend_dials`, this core's share.
    #[inline]
    pub fn pending_backend_dials(&self) -> LocalGauge<'_> {
        self.core
            .gauge(self.families.pending_backend_dials.series(&[]))
    }

    /// `established_connections`, this core's share.
    #[inline]
    pub fn established_connections(&self) -> LocalGauge<'_> {
        self.core
            .gauge(self.families.established_connections.series(&[]))
    }

    /// `konn_reverse_dials_total{result}` (konn only).
    pub fn reverse_dials(&self, result: ReverseResult) -> LocalCounter<'_> {
        self.core.counter(self.families.reverse.dials(result))
    }

    /// `konn_reverse_refusals_total{reason}` (konn only).
    pub fn reverse_refusals(&self, why: ReverseRefusal) -> LocalCounter<'_> {
        let slot = ReverseRefusal::ALL
            .iter()
            .position(|r| *r == why)
            .unwrap_or_default();
        self.core.counter(self.families.reverse.refusals(slot))
    }

    /// `konn_reverse_connections`, this core's share (konn only).
    pub fn reverse_connections(&self) -> LocalGauge<'_> {
        self.core.gauge(self.families.reverse.connections())
    }

    /// `konn_reverse_bytes_total{direction}` (konn only).
    #[inline]
    pub fn reverse_bytes(&self, direction: ReverseDirection) -> LocalCounter<'_> {
        self.core.counter(self.families.reverse.bytes(direction))
    }

    /// `konn_resumes_total{result}` (konn only).
    pub fn resumes(&self, result: ResumeResult) -> LocalCounter<'_> {
        self.core.counter(self.families.resume.resumes(result))
    }

    /// `konn_resume_parked_tunnels`, this core's share (konn only).
    pub fn parked_tunnels(&self) -> LocalGauge<'_> {
        self.core.gauge(self.families.resume.parked_tunnels())
    }

    /// `konn_resume_parked_connections`, this core's share (konn only).
    pub fn parked_connections(&self) -> LocalGauge<'_> {
        self.core.gauge(self.families.resume.parked_connections())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_tables_follow_the_enums() {
        assert_eq!(SERVICE_METHODS[ServiceMethod::Connect as usize], "Connect");
        assert_eq!(STRATEGIES[Strategy::DefaultRoute as usize], "defaultRoute");
        assert_eq!(
            DIAL_FAILURE_REASONS[DialFailureReason::FrontendClose as usize],
            "frontend_close"
        );
    }

    #[test]
    fn fresh_scrape_matches_upstream_start_up() {
        let metrics = ServerMetrics::new(2);
        let text = metrics.registry().render_to_string();
        let ours: Vec<&str> = text.lines().filter(|l| l.starts_with(PREFIX)).collect();
        // What upstream v0.36.0 shows before any backend storage exists.
        assert_eq!(
            ours,
            [
                "konnectivity_network_proxy_server_culled_leases_count 0",
                "konnectivity_network_proxy_server_http_connections 0",
            ]
        );
        metrics.init_backend_storage(Strategy::Default);
        let text = metrics.registry().render_to_string();
        assert!(text.contains("konnectivity_network_proxy_server_ready_backend_connections 0\n"));
        assert!(text.contains(
            "konnectivity_network_proxy_server_ready_backends{proxy_strategy=\"default\"} 0\n"
        ));
    }
}
