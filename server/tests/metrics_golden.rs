//! proxy-server's metrics against upstream v0.36.0.
//!
//! `metrics_upstream_help.txt` holds every `# HELP` / `# TYPE` line of
//! upstream's scrape (all families touched, `go_*` left out: konn has no Go
//! runtime); `metrics_upstream_ops.txt` holds the `konnectivity_*` part of
//! upstream's scrape after the sequence of updates `apply_upstream_ops`
//! replays. Both were produced with upstream's own `pkg/server/metrics`
//! package (v0.36.0) and client_golang v1.23.2.

use std::time::Duration;

use konn_frames::{GrpcStatus, packet::PacketType};
use konn_server::metrics::{
    DialFailureReason, PREFIX, Segment, ServerMetrics, ServiceMethod, Strategy,
};

fn comment_lines(text: &str) -> String {
    text.lines()
        .filter(|l| l.starts_with("# "))
        .map(|l| format!("{l}\n"))
        .collect()
}

#[test]
fn every_family_has_upstream_help_and_type() {
    let metrics = ServerMetrics::new(1);
    let core = metrics.core(0).unwrap();
    // One update per family, through the same entry points upstream uses.
    core.dial_duration().observe(0.001);
    core.frontend_write_duration().observe(0.001);
    core.grpc_connections(ServiceMethod::Proxy).inc();
    core.http_connections().inc();
    metrics.set_ready_backend_connections(1);
    metrics.set_ready_backends(Strategy::Default, 1);
    core.pending_backend_dials().inc();
    core.established_connections().inc();
    core.full_receive_channels(ServiceMethod::Proxy).inc();
    core.dial_failures(DialFailureReason::NoAgent).inc();
    core.stream_packets(Segment::FromAgent, PacketType::Data)
        .inc();
    core.stream_errors(
        Segment::FromAgent,
        GrpcStatus::UNAVAILABLE,
        Some(PacketType::Data),
    )
    .inc();
    metrics.culled_leases_inc();
    metrics.observe_lease_delete_latency(200, Duration::from_millis(1));
    metrics.observe_lease_delete(200, "");
    metrics.observe_lease_list_latency(200, Duration::from_millis(1));
    metrics.observe_lease_list(200, "");
    let ours = comment_lines(&metrics.registry().render_to_string());
    let upstream = include_str!("metrics_upstream_help.txt");
    for (a, b) in ours.lines().zip(upstream.lines()) {
        assert_eq!(a, b);
    }
    assert_eq!(ours, upstream);
}

/// The updates upstream's golden scrape was produced with, through konn's
/// API, spread over two workers and the process-wide handle.
fn apply_upstream_ops(metrics: &ServerMetrics) {
    let a = metrics.core(0).unwrap();
    let b = metrics.core(1).unwrap();
    a.dial_duration().observe_duration(Duration::from_millis(3));
    b.dial_duration()
        .observe_duration(Duration::from_millis(40));
    a.frontend_write_duration()
        .observe_duration(Duration::from_micros(2));
    a.grpc_connections(ServiceMethod::Proxy).inc();
    b.grpc_connections(ServiceMethod::Proxy).inc();
    a.grpc_connections(ServiceMethod::Proxy).dec();
    b.grpc_connections(ServiceMethod::Connect).inc();
    b.http_connections().inc();
    metrics.set_ready_backend_connections(2);
    metrics.set_ready_backends(Strategy::Default, 2);
    metrics.set_ready_backends(Strategy::DestHost, 1);
    metrics.set_pending_backend_dials(3);
    a.established_connections().set(2.0);
    b.established_connections().set(3.0);
    a.full_receive_channels(ServiceMethod::Proxy).touch();
    b.full_receive_channels(ServiceMethod::Connect).inc();
    a.dial_failures(DialFailureReason::NoAgent).inc();
    a.dial_failures(DialFailureReason::BackendDialTimeout).inc();
    metrics
        .dial_failure(DialFailureReason::BackendDialTimeout)
        .inc();
    a.stream_packets(Segment::FromClient, PacketType::DialReq)
        .inc();
    a.stream_packets(Segment::ToAgent, PacketType::DialReq)
        .inc();
    b.stream_packets(Segment::FromAgent, PacketType::DialRsp)
        .inc();
    b.stream_packets(Segment::FromAgent, PacketType::Data)
        .add(2);
    a.stream_packets(Segment::FromAgent, PacketType::Data).inc();
    a.stream_packets(Segment::ToClient, PacketType::Data).inc();
    b.stream_errors(
        Segment::FromAgent,
        GrpcStatus::UNAVAILABLE,
        Some(PacketType::Data),
    )
    .inc();
    a.stream_errors(Segment::ToAgent, GrpcStatus::CANCELLED, None)
        .inc();
    a.stream_errors(
        Segment::ToClient,
        GrpcStatus::DEADLINE_EXCEEDED,
        Some(PacketType::CloseRsp),
    )
    .inc();
    metrics.culled_leases_inc();
    metrics.observe_lease_delete_latency(200, Duration::from_millis(20));
    metrics.observe_lease_delete(200, "");
    metrics.observe_lease_delete(404, "NotFound");
    metrics.observe_lease_list_latency(500, Duration::from_millis(1500));
    metrics.observe_lease_list(500, "InternalError");
}

#[test]
fn same_updates_same_text_as_upstream() {
    let metrics = ServerMetrics::new(2);
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

#[test]
fn process_and_promhttp_families_come_with_the_registry() {
    let metrics = ServerMetrics::new(1);
    let scrape = String::from_utf8(metrics.registry().scrape()).unwrap();
    for family in [
        "process_cpu_seconds_total",
        "process_open_fds",
        "process_max_fds",
        "process_virtual_memory_bytes",
        "process_virtual_memory_max_bytes",
        "process_resident_memory_bytes",
        "process_start_time_seconds",
        "process_network_receive_bytes_total",
        "process_network_transmit_bytes_total",
        "promhttp_metric_handler_requests_in_flight",
        "promhttp_metric_handler_requests_total",
    ] {
        assert!(scrape.contains(&format!("# TYPE {family} ")), "{family}");
    }
    assert!(!scrape.contains("go_"), "no Go runtime metrics");
    assert!(
        !scrape.contains("connection_duration_seconds"),
        "master only"
    );
}
