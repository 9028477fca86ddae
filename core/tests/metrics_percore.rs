//! Per-core counting: totals add up across worker threads (plain threads and
//! konn's `Workers`), concurrent scrapes see monotonic counters, and the
//! per-core and global update paths never allocate.

use std::{
    sync::{Arc, Barrier, mpsc},
    time::Duration,
};

use konn_core::{
    io::runtime::{IoEngine, RuntimeConfig, Workers},
    metrics::{CounterVec, GaugeVec, HistogramVec, Registry},
};

use konn_testkit::alloc::{CountingAlloc, allocations, assert_counting};

/// Counts each thread's allocations (konn-testkit's).
#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

struct Families {
    packets: CounterVec,
    open: GaugeVec,
    latency: HistogramVec,
}

fn registry(cores: usize) -> (Registry, Families) {
    let mut b = Registry::builder();
    let packets = b.counter_vec(
        "packets_total",
        "Packets.",
        &["segment", "packet_type"],
        &[
            &["from_agent", "to_agent"],
            &["DATA", "DIAL_REQ", "CLOSE_REQ"],
        ],
    );
    let open = b.gauge_vec("open", "Open.", &["method"], &[&["Proxy", "Connect"]]);
    let latency = b.histogram("latency_seconds", "Latency.", &[0.001, 0.01, 0.1]);
    (
        b.build(cores),
        Families {
            packets,
            open,
            latency,
        },
    )
}

fn sample(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("{series} missing in\n{text}"))
        .parse()
        .unwrap()
}

#[test]
fn the_counter_sees_allocations() {
    assert_counting();
}

#[test]
fn updates_do_not_allocate() {
    let (reg, f) = registry(1);
    let core = reg.claim(0).unwrap();
    let data = f.packets.at(&[0, 0]).unwrap();
    let dial = f.packets.at(&[1, 1]).unwrap();
    let open = f.open.at(&[1]).unwrap();
    let latency = f.latency.single().unwrap();
    let before = allocations();
    for i in 0..10_000u64 {
        core.counter(data).inc();
        core.counter(dial).add(i % 3);
        core.gauge(open).inc();
        core.gauge(open).dec();
        core.gauge(open).set(4.0);
        core.histogram(latency).observe(0.002);
        core.histogram(latency)
            .observe_duration(Duration::from_micros(i));
        core.counter(f.packets.at(&[1, 2]).unwrap()).touch();
        reg.counter(data).inc();
        reg.gauge(open).add(1.0);
        reg.histogram(latency).observe(0.5);
    }
    assert_eq!(allocations() - before, 0, "the update paths allocated");
    assert_eq!(reg.counter_value(data), 20_000);
}

#[test]
fn totals_add_up_across_threads_while_scraping() {
    const CORES: usize = 4;
    const ROUNDS: u64 = 200_000;
    let (reg, f) = registry(CORES);
    let data = f.packets.at(&[0, 0]).unwrap();
    let open = f.open.at(&[0]).unwrap();
    let latency = f.latency.single().unwrap();
    let start = Arc::new(Barrier::new(CORES + 1));
    let threads: Vec<_> = (0..CORES)
        .map(|i| {
            let core = reg.claim(i).unwrap();
            let start = start.clone();
            std::thread::spawn(move || {
                start.wait();
                for n in 0..ROUNDS {
                    core.counter(data).inc();
                    if n % 1000 == 0 {
                        core.gauge(open).inc();
                        core.histogram(latency).observe(0.005);
                    }
                }
                // Each core ends with one net open connection: the others
                // were closed again, possibly by another core.
                core.gauge(open).add(-((ROUNDS / 1000 - 1) as f64));
            })
        })
        .collect();
    start.wait();
    // Scrapes during the updates see a counter that never goes back.
    let mut last = 0.0;
    for _ in 0..50 {
        let text = reg.render_to_string();
        if text.is_empty() {
            continue;
        }
        if let Some(v) = text.lines().find_map(|l| {
            l.strip_prefix("packets_total{packet_type=\"DATA\",segment=\"from_agent\"} ")
        }) {
            let v: f64 = v.parse().unwrap();
            assert!(v >= last, "counter went back from {last} to {v}");
            last = v;
        }
    }
    for t in threads {
        t.join().unwrap();
    }
    let text = reg.render_to_string();
    let total = (CORES as u64 * ROUNDS) as f64;
    assert_eq!(
        sample(
            &text,
            "packets_total{packet_type=\"DATA\",segment=\"from_agent\"}"
        ),
        total
    );
    assert_eq!(sample(&text, "open{method=\"Proxy\"}"), CORES as f64);
    let observations = (CORES as u64 * ROUNDS / 1000) as f64;
    assert_eq!(sample(&text, "latency_seconds_count"), observations);
    assert_eq!(
        sample(&text, "latency_seconds_bucket{le=\"0.01\"}"),
        observations
    );
    assert_eq!(sample(&text, "latency_seconds_bucket{le=\"0.001\"}"), 0.0);
    assert_eq!(reg.counter_value(data), CORES as u64 * ROUNDS);
    assert_eq!(reg.gauge_value(open), CORES as f64);
}

#[test]
fn konn_workers_count_on_their_own_slabs() {
    const WORKERS: usize = 2;
    let (reg, f) = registry(WORKERS);
    let (tx, rx) = mpsc::channel();
    let workers = Workers::<()>::start(
        RuntimeConfig {
            workers: WORKERS,
            engine: IoEngine::Epoll,
            ..RuntimeConfig::default()
        },
        {
            let reg = reg.clone();
            move |ctx| {
                let (reg, tx) = (reg.clone(), tx.clone());
                let data = f.packets.at(&[1, 0]).unwrap();
                async move {
                    let core = std::rc::Rc::new(reg.claim(ctx.index()).expect("own slab"));
                    // Two tasks of one worker share the handle.
                    let other = core.clone();
                    let task = monoio::spawn(async move {
                        for _ in 0..500 {
                            other.counter(data).inc();
                        }
                    });
                    for _ in 0..(ctx.index() + 1) * 1000 {
                        core.counter(data).inc();
                    }
                    task.await;
                    tx.send(ctx.index()).unwrap();
                    ctx.stop_token().stopped().await;
                }
            }
        },
    )
    .unwrap();
    for _ in 0..WORKERS {
        rx.recv_timeout(Duration::from_secs(20)).unwrap();
    }
    let text = reg.render_to_string();
    assert_eq!(
        sample(
            &text,
            "packets_total{packet_type=\"DATA\",segment=\"to_agent\"}"
        ),
        (1000 + 2000 + 2 * 500) as f64
    );
    workers.stop();
    workers.join().unwrap();
    // The slabs were released with their handles.
    assert!(reg.claim(0).is_some());
}
