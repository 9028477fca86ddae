//! proxy-agent's metrics against upstream v0.36.0.
//!
//! `metrics_upstream_help.txt` holds every `# HELP` / `# TYPE` line of
//! upstream's scrape (all families touched through upstream's own API,
//! `go_*` left out); `metrics_upstream_ops.txt` the `konnectivity_*` part of
//! its scrape after the updates `apply_upstream_ops` replays. Both were
//! produced with upstream's `pkg/agent/metrics` (v0.36.0) and client_golang
//! v1.23.2.

use std::time::Duration;

use konn_agent::metrics::{AgentMetrics, DialFailureReason, Direction, PREFIX, Segment};
use konn_frames::{GrpcStatus, packet::PacketType};

fn comment_lines(text: &str) -> String {
    text.lines()
        .filter(|l| l.starts_with("# "))
        .map(|l| format!("{l}\n"))
        .collect()
}

#[test]
fn every_family_has_upstream_help_and_type() {
    let metrics = AgentMetrics::new(1);
    let core = metrics.core(0).unwrap();
    core.dial_duration().observe(0.001);
    core.server_connection_failures(Direction::ToServer).inc();
    core.endpoint_dial_failures(DialFailureReason::Timeout)
        .inc();
    metrics.set_open_server_connections(1);
    metrics.set_known_server_count(1);
    core.open_endpoint_connections().inc();
    core.stream_packets(Segment::FromAgent, PacketType::Data)
        .inc();
    core.stream_errors(
        Segment::FromAgent,
        GrpcStatus::UNAVAILABLE,
        Some(PacketType::Data),
    )
    .inc();
    metrics.observe_lease_list(200, "");
    // Upstream's bug: this lands in lease_lists_total, so
    // lease_watches_total never shows (and is not in the golden file).
    metrics.observe_lease_watch(200, "");
    metrics.observe_lease_list_latency(Duration::from_millis(1), 200);
    let ours = comment_lines(&metrics.registry().render_to_string());
    let upstream = include_str!("metrics_upstream_help.txt");
    for (a, b) in ours.lines().zip(upstream.lines()) {
        assert_eq!(a, b);
    }
    assert_eq!(ours, upstream);
    // The family is registered with upstream's text all the same.
    metrics.observe_lease_watch_fixed(200, "");
    let text = metrics.registry().render_to_string();
    assert!(text.contains(
        "# HELP konnectivity_network_proxy_agent_lease_watches_total Count of server lease watch \
         calls made by the agent to the k8s apiserver, labeled by HTTP response code and reason\n\
         # TYPE konnectivity_network_proxy_agent_lease_watches_total counter\n"
    ));
}

fn apply_upstream_ops(metrics: &AgentMetrics) {
    let a = metrics.core(0).unwrap();
    let b = metrics.core(1).unwrap();
    a.dial_duration().observe_duration(Duration::from_millis(7));
    b.server_connection_failures(Direction::ToServer).inc();
    a.endpoint_dial_failures(DialFailureReason::Timeout).inc();
    b.endpoint_dial_failures(DialFailureReason::Timeout).inc();
    b.endpoint_dial_failures(DialFailureReason::Unknown).inc();
    metrics.set_open_server_connections(2);
    metrics.set_known_server_count(3);
    a.open_endpoint_connections().inc();
    b.open_endpoint_connections().inc();
    b.open_endpoint_connections().inc();
    a.open_endpoint_connections().dec();
    a.stream_packets(Segment::FromAgent, PacketType::DialRsp)
        .inc();
    b.stream_packets(Segment::ToAgent, PacketType::DialReq)
        .inc();
    a.stream_errors(Segment::ToAgent, GrpcStatus::UNAVAILABLE, None)
        .inc();
    b.stream_errors(
        Segment::FromAgent,
        GrpcStatus::UNAVAILABLE,
        Some(PacketType::Data),
    )
    .inc();
    metrics.observe_lease_list(200, "");
    metrics.observe_lease_watch(403, "Forbidden");
    metrics.observe_lease_list_latency(Duration::from_millis(120), 200);
}

#[test]
fn same_updates_same_text_as_upstream() {
    let metrics = AgentMetrics::new(2);
    apply_upstream_ops(&metrics);
    let text = metrics.registry().render_to_string();
    let ours: String = text
        .lines()
        .filter(|l| l.starts_with(PREFIX) || l.contains(&format!(" {PREFIX}")))
        .map(|l| format!("{l}\n"))
        .collect();
    let upstream = include_str!("metrics_upstream_ops.txt");
    for (a, b) in ours.lines().zip(upstream.lines()) {
        assert_eq!(a, b);
    }
    assert_eq!(ours, upstream);
}
