//! The text exposition compared byte for byte with what Go's client_golang
//! v1.23.2 writes for the same families and values, Go's float formatting
//! on a thousand values, the process collector's families and the promhttp
//! scrape counters.
//!
//! `metrics_go_sample.txt` and `metrics_go_floats.txt` were produced by a
//! small Go program against client_golang v1.23.2 / prometheus/common
//! v0.68.0 (the versions upstream v0.36.0 pins): the sample registers the
//! families built in `go_sample_registry` below and applies the same
//! updates; the float file lists `math.Float64bits(v)` and
//! `strconv.FormatFloat(v, 'g', -1, 64)` for random values of every
//! magnitude.

use konn_core::metrics::{Registry, text};

/// client_golang's `prometheus.DefBuckets`.
const DEF_BUCKETS: [f64; 11] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// The Go sample, rebuilt with konn's registry. Updates are spread over two
/// cores and the global area to show that aggregation does not change the
/// text.
fn go_sample_registry() -> Registry {
    let mut b = Registry::builder();
    let zeta = b.counter_vec(
        "zeta_total",
        "A counter with \\ backslash and\nnewline and \"quotes\".",
        &["segment", "kind"],
        &[
            &["to_agent", "from_agent", "a\\b\"c\nd"],
            &["DATA", "CLOSE_REQ", "x"],
        ],
    );
    let alpha = b.gauge_vec(
        "alpha_gauge",
        "Gauge.",
        &["b_label", "a_label"],
        &[&["x", "w"], &["y", "z"]],
    );
    let mid = b.gauge("mid_plain", "");
    let beta = b.histogram(
        "beta_seconds",
        "Histogram.",
        &[0.000001, 0.00001, 0.0001, 0.005, 0.025, 0.1, 0.5, 2.5, 12.5],
    );
    let gamma = b.histogram_vec(
        "gamma_seconds",
        "Labelled histogram.",
        &[1.0, 5.0, 15.0],
        &["code"],
        &[&["500", "200"]],
    );
    let delta = b.histogram("delta_default", "Default buckets.", &DEF_BUCKETS);
    let epsilon = b.dynamic_counter_vec(
        "epsilon_total",
        "Dynamic counter.",
        &["http_status_code", "reason"],
    );
    let eta = b.dynamic_histogram_vec(
        "eta_seconds",
        "Dynamic histogram.",
        &DEF_BUCKETS,
        &["http_status_code"],
    );
    let reg = b.build(2);
    let core0 = reg.claim(0).unwrap();
    let core1 = reg.claim(1).unwrap();

    core0.counter(zeta.at(&[0, 0]).unwrap()).add(2);
    core1.counter(zeta.at(&[0, 0]).unwrap()).inc();
    core1.counter(zeta.at(&[1, 0]).unwrap()).add(12_345_678);
    reg.counter(zeta.at(&[1, 1]).unwrap()).inc();
    core0.counter(zeta.at(&[2, 2]).unwrap()).add(0);

    reg.gauge(alpha.at(&[0, 0]).unwrap()).set(-1.0);
    core0.gauge(alpha.at(&[0, 1]).unwrap()).set(1e21);
    core0.gauge(alpha.at(&[1, 1]).unwrap()).add(123_000.0);
    core1.gauge(alpha.at(&[1, 1]).unwrap()).add(456.0);
    reg.gauge(mid.single().unwrap()).set(0.000123);

    // Go adds the observations in this order; one core keeps that order.
    let beta = core0.histogram(beta.single().unwrap());
    for v in [0.000_000_5, 0.003, 0.003, 0.2, 20.0, 12.5] {
        beta.observe(v);
    }
    core1.histogram(gamma.at(&[0]).unwrap()).observe(3.0);
    core0.histogram(gamma.at(&[1]).unwrap()).observe(0.1);
    core0.histogram(gamma.at(&[1]).unwrap()).observe(100.0);
    reg.histogram(delta.single().unwrap()).observe(0.3);

    reg.dynamic_counter_add(epsilon, &["404", "NotFound"], 1);
    reg.dynamic_counter_add(epsilon, &["200", ""], 1);
    reg.dynamic_counter_add(epsilon, &["200", ""], 1);
    reg.dynamic_histogram_observe(eta, &["500"], 7.0);
    reg.dynamic_histogram_observe(eta, &["200"], 0.02);
    reg
}

#[test]
fn text_matches_client_golang_byte_for_byte() {
    let reg = go_sample_registry();
    let ours = reg.render_to_string();
    let go = include_str!("metrics_go_sample.txt");
    for (n, (a, b)) in ours.lines().zip(go.lines()).enumerate() {
        assert_eq!(a, b, "line {}", n + 1);
    }
    assert_eq!(ours, go);
}

#[test]
fn untouched_series_and_families_are_left_out() {
    let mut b = Registry::builder();
    let c = b.counter_vec("c_total", "C.", &["l"], &[&["a", "b"]]);
    let g = b.gauge("g", "G.");
    let h = b.histogram("h", "H.", &[1.0]);
    let reg = b.build(1);
    assert_eq!(reg.render_to_string(), "");
    // A gauge set back to zero stays, like a Go child once created.
    let core = reg.claim(0).unwrap();
    core.gauge(g.single().unwrap()).inc();
    core.gauge(g.single().unwrap()).dec();
    core.histogram(h.single().unwrap()).touch();
    core.counter(c.at(&[1]).unwrap()).touch();
    assert_eq!(
        reg.render_to_string(),
        "# HELP c_total C.\n# TYPE c_total counter\nc_total{l=\"b\"} 0\n\
         # HELP g G.\n# TYPE g gauge\ng 0\n\
         # HELP h H.\n# TYPE h histogram\nh_bucket{le=\"1\"} 0\nh_bucket{le=\"+Inf\"} 0\n\
         h_sum 0\nh_count 0\n"
    );
}

#[test]
fn floats_match_go_strconv() {
    let fixture = include_str!("metrics_go_floats.txt");
    let mut checked = 0;
    let mut wrong = Vec::new();
    for line in fixture.lines() {
        let (bits, want) = line.split_once(' ').unwrap();
        let v = f64::from_bits(u64::from_str_radix(bits, 16).unwrap());
        let ours = text::format_f64(v);
        if ours != want {
            wrong.push(format!("{bits}: ours {ours}, Go {want}"));
        }
        checked += 1;
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
    assert!(checked > 1000, "{checked}");
}

/// The process collector's HELP and TYPE lines as client_golang v1.23.2
/// writes them (taken from a scrape of upstream's proxy-server v0.36.0).
const PROCESS_HELP: &str = "\
# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.
# TYPE process_cpu_seconds_total counter
# HELP process_max_fds Maximum number of open file descriptors.
# TYPE process_max_fds gauge
# HELP process_network_receive_bytes_total Number of bytes received by the process over the network.
# TYPE process_network_receive_bytes_total counter
# HELP process_network_transmit_bytes_total Number of bytes sent by the process over the network.
# TYPE process_network_transmit_bytes_total counter
# HELP process_open_fds Number of open file descriptors.
# TYPE process_open_fds gauge
# HELP process_resident_memory_bytes Resident memory size in bytes.
# TYPE process_resident_memory_bytes gauge
# HELP process_start_time_seconds Start time of the process since unix epoch in seconds.
# TYPE process_start_time_seconds gauge
# HELP process_virtual_memory_bytes Virtual memory size in bytes.
# TYPE process_virtual_memory_bytes gauge
# HELP process_virtual_memory_max_bytes Maximum amount of virtual memory available in bytes.
# TYPE process_virtual_memory_max_bytes gauge
";

#[test]
fn process_metrics_have_go_names_and_plausible_values() {
    let mut b = Registry::builder();
    b.process_metrics();
    let reg = b.build(0);
    let text = reg.render_to_string();
    let comments: String = text
        .lines()
        .filter(|l| l.starts_with('#'))
        .map(|l| format!("{l}\n"))
        .collect();
    assert_eq!(comments, PROCESS_HELP);
    let value = |name: &str| -> f64 {
        let line = text
            .lines()
            .find(|l| l.split(' ').next() == Some(name))
            .unwrap_or_else(|| panic!("{name} missing:\n{text}"));
        line.rsplit(' ').next().unwrap().parse().unwrap()
    };
    let fds = std::fs::read_dir("/proc/self/fd").unwrap().count() as f64;
    assert!((value("process_open_fds") - fds).abs() <= 4.0);
    assert!(value("process_resident_memory_bytes") > 1e5);
    assert!(value("process_virtual_memory_bytes") >= value("process_resident_memory_bytes"));
    assert!(value("process_max_fds") >= value("process_open_fds"));
    assert!(value("process_cpu_seconds_total") >= 0.0);
    assert!(value("process_start_time_seconds") > 1.5e9);
    assert!(value("process_network_receive_bytes_total") >= 0.0);
}

#[test]
fn scrapes_count_themselves_like_promhttp() {
    let mut b = Registry::builder();
    b.scrape_metrics();
    let reg = b.build(0);
    let first = String::from_utf8(reg.scrape()).unwrap();
    assert_eq!(
        first,
        "# HELP promhttp_metric_handler_requests_in_flight Current number of scrapes being served.\n\
         # TYPE promhttp_metric_handler_requests_in_flight gauge\n\
         promhttp_metric_handler_requests_in_flight 1\n\
         # HELP promhttp_metric_handler_requests_total Total number of scrapes by HTTP status code.\n\
         # TYPE promhttp_metric_handler_requests_total counter\n\
         promhttp_metric_handler_requests_total{code=\"200\"} 0\n\
         promhttp_metric_handler_requests_total{code=\"500\"} 0\n\
         promhttp_metric_handler_requests_total{code=\"503\"} 0\n"
    );
    let second = String::from_utf8(reg.scrape()).unwrap();
    assert!(second.contains("promhttp_metric_handler_requests_total{code=\"200\"} 1\n"));
    assert!(reg.render_to_string().contains("requests_in_flight 0\n"));
}
