//! proxy-agent's Prometheus metrics: every family upstream v0.36.0
//! registers (`pkg/agent/metrics`), with the same names, types, label
//! names, label values, HELP text and buckets, as typed handles.
//!
//! [`AgentMetrics`] owns the registry and is shared by the whole process;
//! each worker claims an [`AgentCoreMetrics`] with [`AgentMetrics::core`]
//! for the data path:
//!
//! ```
//! # use konn_agent::metrics::*;
//! # use konn_frames::packet::PacketType;
//! let metrics = AgentMetrics::new(1);
//! let core = metrics.core(0).unwrap();
//! core.stream_packets(Segment::ToAgent, PacketType::DialReq).inc();
//! core.open_endpoint_connections().inc();
//! ```
//!
//! As in Go, a series shows up in scrapes from its first update; the one
//! plain (non-vector) gauge, `known_server_count`, is present from
//! start-up. Gauges add a process-wide part (`set_*` here) to every core's
//! share (the core handles); use one style per gauge.
//!
//! **Upstream's lease-watch bug is kept.** In v0.36.0
//! `ObserveLeaseWatch` increments `lease_lists_total`, so
//! `lease_watches_total` never gets a series and never appears in a
//! scrape. [`AgentMetrics::observe_lease_watch`] does the same, so
//! dashboards built on upstream see the same numbers; the family is
//! registered (and documented) all the same.
//!
//! The deprecated `server_connection_failure_count{direction}` is kept, HELP
//! text included (which names a `stream_events_error_total` that never
//! existed; the replacement is `stream_errors_total`).

use konn_protocol::server::limits::Refusal;
use std::time::Duration;

pub use konn_core::metrics::common::Segment;
use konn_core::metrics::{
    CoreMetrics, CounterVec, DynamicCounterVec, DynamicHistogramVec, GaugeVec, HistogramVec,
    LocalCounter, LocalGauge, LocalHistogram, Registry, RegistryBuilder,
    common::{
        ConnEnd, ConnFamilies, ResumeFamilies, ResumeResult, ReverseDirection, ReverseFamilies,
        ReverseResult, StreamFamilies,
    },
};
use konn_frames::{GrpcStatus, packet::PacketType};

/// The prefix of every agent family (`Namespace` + `Subsystem`).
pub const PREFIX: &str = "konnectivity_network_proxy_agent_";

/// Buckets of the dial and lease-list latencies, 5 ms to 30 s.
pub const LATENCY_BUCKETS: [f64; 7] = [0.005, 0.025, 0.1, 0.5, 2.5, 10.0, 30.0];

/// Which way a failed server stream operation went (`direction` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Direction {
    /// Sending to the proxy server.
    ToServer = 0,
    /// Receiving from the proxy server.
    FromServer = 1,
}

impl Direction {
    /// The label value.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::ToServer => "to_server",
            Self::FromServer => "from_server",
        }
    }
}

const DIRECTIONS: [&str; 2] = [Direction::ToServer.as_str(), Direction::FromServer.as_str()];

/// Why dialling an endpoint failed (`reason` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DialFailureReason {
    /// The dial timed out.
    Timeout = 0,
    /// Any other error.
    Unknown = 1,
}

impl DialFailureReason {
    /// The label value.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Timeout => "timeout",
            Self::Unknown => "unknown",
        }
    }
}

const DIAL_FAILURE_REASONS: [&str; 2] = [
    DialFailureReason::Timeout.as_str(),
    DialFailureReason::Unknown.as_str(),
];

#[derive(Debug, Clone, Copy)]
struct Families {
    dial_duration: HistogramVec,
    server_failures: CounterVec,
    dial_failures: CounterVec,
    open_server_connections: GaugeVec,
    known_server_count: GaugeVec,
    open_endpoint_connections: GaugeVec,
    stream: StreamFamilies,
    lease_lists: DynamicCounterVec,
    lease_watches: DynamicCounterVec,
    tls_reloads: DynamicCounterVec,
    lease_list_latency: DynamicHistogramVec,
    reverse: ReverseFamilies,
    dial_refusals: CounterVec,
    conns: ConnFamilies,
    resume: ResumeFamilies,
}

/// Why the agent refused or lost a reverse connection (`reason` of
/// `konn_reverse_refusals_total` on the agent).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReverseRefusal {
    /// No tunnel offers the reverse direction (no konn server, or none
    /// connected).
    NoTunnel = 0,
    /// The server refused or could not dial (its reason is on the server).
    Refused = 1,
}

const REVERSE_REASONS: [&str; 2] = ["no_tunnel", "refused"];

/// `reason` labels of `konn_agent_dial_refusals_total`.
const DIAL_REFUSAL_REASONS: [&str; 1] = [Refusal::DestinationNotAllowed.as_str()];

impl Families {
    fn register(b: &mut RegistryBuilder) -> Self {
        let dial_duration = b.histogram(
            "konnectivity_network_proxy_agent_dial_duration_seconds",
            "Latency of dial to the remote endpoint in seconds",
            &LATENCY_BUCKETS,
        );
        let server_failures = b.counter_vec(
            "konnectivity_network_proxy_agent_server_connection_failure_count",
            "Count of failures to send to or receive from the proxy server, labeled by the direction (from_server or to_server). DEPRECATED, please use stream_events_error_total",
            &["direction"],
            &[&DIRECTIONS],
        );
        let dial_failures = b.counter_vec(
            "konnectivity_network_proxy_agent_endpoint_dial_failure_total",
            "Number of failures dialing the remote endpoint, by reason (example: timeout).",
            &["reason"],
            &[&DIAL_FAILURE_REASONS],
        );
        let open_server_connections = b.gauge(
            "konnectivity_network_proxy_agent_open_server_connections",
            "Current number of open server connections.",
        );
        let known_server_count = b.gauge(
            "konnectivity_network_proxy_agent_known_server_count",
            "Current number of servers agent is trying to connect to.",
        );
        let open_endpoint_connections = b.gauge(
            "konnectivity_network_proxy_agent_open_endpoint_connections",
            "Current number of open endpoint connections.",
        );
        let lease_lists = b.dynamic_counter_vec(
            "konnectivity_network_proxy_agent_lease_lists_total",
            "Count of server lease list calls made by the agent to the k8s apiserver, labeled by HTTP response code and reason",
            &["http_response_code", "reason"],
        );
        let lease_watches = b.dynamic_counter_vec(
            "konnectivity_network_proxy_agent_lease_watches_total",
            "Count of server lease watch calls made by the agent to the k8s apiserver, labeled by HTTP response code and reason",
            &["http_response_code", "reason"],
        );
        let lease_list_latency = b.dynamic_histogram_vec(
            "konnectivity_network_proxy_agent_lease_list_latency_seconds",
            "Latency of server lease listing in seconds",
            &LATENCY_BUCKETS,
            &["http_response_code"],
        );
        let stream = StreamFamilies::register(
            b,
            "konnectivity_network_proxy_agent_stream_packets_total",
            "konnectivity_network_proxy_agent_stream_errors_total",
        );
        let tls_reloads = b.dynamic_counter_vec(
            "konn_tls_reloads_total",
            "Certificate, key and CA files reloaded after a change on disk, by listener (tunnel: the agent's client side) and result (ok, error: the previous material stays in use).",
            &["listener", "result"],
        );
        let reverse = ReverseFamilies::register(b, &REVERSE_REASONS);
        let dial_refusals = b.counter_vec(
            "konn_agent_dial_refusals_total",
            "Dials refused by the agent before connecting, by reason (destination_not_allowed: no resolved address is inside --allowed-destination-cidrs).",
            &["reason"],
            &[&DIAL_REFUSAL_REASONS],
        );
        let conns = ConnFamilies::register(b);
        let resume = ResumeFamilies::register(b);
        Self {
            resume,
            dial_refusals,
            conns,
            tls_reloads,
            reverse,
            dial_duration,
            server_failures,
            dial_failures,
            open_server_connections,
            known_server_count,
            open_endpoint_connections,
            stream,
            lease_lists,
            lease_watches,
            lease_list_latency,
        }
    }
}

/// proxy-agent's metrics: the registry plus typed access. Shared by the
/// whole process.
#[derive(Debug, Clone)]
pub struct AgentMetrics {
    registry: Registry,
    families: Families,
}

impl AgentMetrics {
    /// Registers every agent family, the `process_*` and `promhttp_*`
    /// families, with one slab per worker (`cores`).
    pub fn new(cores: usize) -> Self {
        let mut b = Registry::builder();
        let families = Families::register(&mut b);
        b.process_metrics().scrape_metrics();
        let registry = b.build(cores);
        // Upstream's one plain NewGauge: present from start-up.
        registry
            .gauge(families.known_server_count.series(&[]))
            .touch();
        Self { registry, families }
    }

    /// The registry (scrapes, `/metrics`).
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The data-path handle of worker `index`; `None` if out of range or
    /// already claimed.
    pub fn core(&self, index: usize) -> Option<AgentCoreMetrics> {
        Some(AgentCoreMetrics {
            core: self.registry.claim(index)?,
            families: self.families,
        })
    }

    /// `open_server_connections` (upstream sets it to the client set's
    /// size).
    pub fn set_open_server_connections(&self, count: usize) {
        self.registry
            .gauge(self.families.open_server_connections.series(&[]))
            .set(count as f64);
    }

    /// `known_server_count`: how many servers the agent tries to hold.
    pub fn set_known_server_count(&self, count: usize) {
        self.registry
            .gauge(self.families.known_server_count.series(&[]))
            .set(count as f64);
    }

    /// `lease_lists_total{http_response_code, reason}` += 1.
    pub fn observe_lease_list(&self, http_code: u16, reason: &str) {
        let code = http_code.to_string();
        self.registry
            .dynamic_counter_add(self.families.lease_lists, &[&code, reason], 1);
    }

    /// A lease watch call. Like upstream v0.36.0 this counts in
    /// `lease_lists_total`, not `lease_watches_total` (see the module docs).
    pub fn observe_lease_watch(&self, http_code: u16, reason: &str) {
        self.observe_lease_list(http_code, reason);
    }

    /// `open_endpoint_connections`, all workers together.
    pub fn open_endpoints(&self) -> f64 {
        self.families
            .open_endpoint_connections
            .single()
            .map_or(0.0, |id| self.registry.gauge_value(id))
    }

    /// `konn_tls_reloads_total{listener, result}` += 1.
    pub fn tls_reload(&self, listener: &str, ok: bool) {
        let result = if ok { "ok" } else { "error" };
        self.registry
            .dynamic_counter_add(self.families.tls_reloads, &[listener, result], 1);
    }

    /// `lease_watches_total{http_response_code, reason}` += 1: what
    /// upstream meant to count; unused while konn keeps upstream's numbers.
    pub fn observe_lease_watch_fixed(&self, http_code: u16, reason: &str) {
        let code = http_code.to_string();
        self.registry
            .dynamic_counter_add(self.families.lease_watches, &[&code, reason], 1);
    }

    /// `lease_list_latency_seconds{http_response_code}`.
    pub fn observe_lease_list_latency(&self, latency: Duration, http_code: u16) {
        let code = http_code.to_string();
        self.registry.dynamic_histogram_observe(
            self.families.lease_list_latency,
            &[&code],
            latency.as_secs_f64(),
        );
    }
}

/// One worker's data-path metrics. `Send` but not `Sync`: move it to its
/// worker and share it there with `Rc`.
#[derive(Debug)]
pub struct AgentCoreMetrics {
    core: CoreMetrics,
    families: Families,
}

impl AgentCoreMetrics {
    /// The worker index this handle counts for.
    pub fn index(&self) -> usize {
        self.core.index()
    }

    /// `stream_packets_total{segment, packet_type}`: the agent counts
    /// `from_agent` when it sends and `to_agent` when it receives.
    #[inline]
    pub fn stream_packets(&self, segment: Segment, ty: PacketType) -> LocalCounter<'_> {
        self.core.counter(self.families.stream.packets(segment, ty))
    }

    /// `stream_errors_total{segment, code, packet_type}`; `ty` is `None` for
    /// a receive error (no packet, label `Unknown`).
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

    /// `server_connection_failure_count{direction}` (deprecated upstream,
    /// still counted next to `stream_errors_total`).
    #[inline]
    pub fn server_connection_failures(&self, direction: Direction) -> LocalCounter<'_> {
        self.core
            .counter(self.families.server_failures.series(&[direction as usize]))
    }

    /// `endpoint_dial_failure_total{reason}`.
    #[inline]
    pub fn endpoint_dial_failures(&self, reason: DialFailureReason) -> LocalCounter<'_> {
        self.core
            .counter(self.families.dial_failures.series(&[reason as usize]))
    }

    /// `konn_agent_dial_refusals_total{reason}` (konn only; the one
    /// reason the agent has: `destination_not_allowed`).
    pub fn dial_refusals(&self, reason: Refusal) -> LocalCounter<'_> {
        let slot = DIAL_REFUSAL_REASONS
            .iter()
            .position(|r| *r == reason.as_str())
            .unwrap_or_default();
        self.core
            .counter(self.families.dial_refusals.series(&[slot]))
    }

    /// `dial_duration_seconds`: successful endpoint dials.
    #[inline]
    pub fn dial_duration(&self) -> LocalHistogram<'_> {
        self.core.histogram(self.families.dial_duration.series(&[]))
    }

    /// `open_endpoint_connections`, this core's share.
    #[inline]
    pub fn open_endpoint_connections(&self) -> LocalGauge<'_> {
        self.core
            .gauge(self.families.open_endpoint_connections.series(&[]))
    }

    /// `open_server_connections`, this core's share (when tunnels are
    /// counted per core instead of with
    /// [`AgentMetrics::set_open_server_connections`]).
    #[inline]
    pub fn open_server_connections(&self) -> LocalGauge<'_> {
        self.core
            .gauge(self.families.open_server_connections.series(&[]))
    }

    /// `konn_reverse_dials_total{result}` (konn only).
    pub fn reverse_dials(&self, result: ReverseResult) -> LocalCounter<'_> {
        self.core.counter(self.families.reverse.dials(result))
    }

    /// `konn_reverse_refusals_total{reason}` (konn only).
    pub fn reverse_refusals(&self, why: ReverseRefusal) -> LocalCounter<'_> {
        self.core
            .counter(self.families.reverse.refusals(why as usize))
    }

    /// `konn_reverse_connections`, this core's share (konn only).
    pub fn reverse_connections(&self) -> LocalGauge<'_> {
        self.core.gauge(self.families.reverse.connections())
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

    /// `konn_reverse_bytes_total{direction}` (konn only).
    #[inline]
    pub fn reverse_bytes(&self, direction: ReverseDirection) -> LocalCounter<'_> {
        self.core.counter(self.families.reverse.bytes(direction))
    }

    /// A destination connection ended: `konn_connection_bytes_total`,
    /// `konn_connection_duration_seconds`, `konn_connections_ended_total`
    /// (the server's names; once per connection, never per packet).
    pub fn conn_ended(&self, end: &ConnEnd<'_>) {
        self.families.conns.record(self.core.registry(), end, 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fresh_scrape_matches_upstream_start_up() {
        let metrics = AgentMetrics::new(1);
        let text = metrics.registry().render_to_string();
        let ours: Vec<&str> = text.lines().filter(|l| l.starts_with(PREFIX)).collect();
        assert_eq!(
            ours,
            ["konnectivity_network_proxy_agent_known_server_count 0"]
        );
    }

    #[test]
    fn lease_watch_counts_as_a_list_like_upstream() {
        let metrics = AgentMetrics::new(0);
        metrics.observe_lease_watch(200, "");
        let text = metrics.registry().render_to_string();
        assert!(text.contains(
            "konnectivity_network_proxy_agent_lease_lists_total{http_response_code=\"200\",reason=\"\"} 1\n"
        ));
        assert!(!text.contains("lease_watches_total"));
        metrics.observe_lease_watch_fixed(200, "");
        assert!(
            metrics
                .registry()
                .render_to_string()
                .contains("lease_watches_total{")
        );
    }
}
