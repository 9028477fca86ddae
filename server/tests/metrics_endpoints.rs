//! proxy-server's health and admin endpoints: statuses, bodies and headers
//! as upstream v0.36.0 answers them (checked against its responses), via
//! the routers and over real sockets under every io engine.

use std::{
    io::{Read, Write},
    net::{SocketAddr, TcpStream},
    rc::Rc,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
        mpsc,
    },
    time::Duration,
};

use konn_core::{
    http1::{Config, PROFILING_UNAVAILABLE, Request, Response, Router, serve},
    io::{
        listen::{bind_tcp, tcp_into_monoio},
        runtime::{Stopper, available_engines, block_on},
    },
};
use konn_server::{
    health::{BackendIdentifiers, BackendInfo, NOT_READY, admin_router, health_router},
    metrics::{Segment, ServerMetrics},
};

fn get(router: &Router, raw: &str) -> Response {
    let (request, _) = Request::parse(raw.as_bytes(), 1 << 20).unwrap().unwrap();
    router.handle(&request)
}

fn request(path: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nHost: localhost:8092\r\n\r\n")
}

#[test]
fn health_port_answers_like_upstream() {
    let metrics = ServerMetrics::new(1);
    let ready = Arc::new(AtomicBool::new(false));
    let flag = ready.clone();
    let router = health_router(
        move || {
            if flag.load(Ordering::Relaxed) {
                Ok(())
            } else {
                Err(NOT_READY.to_owned())
            }
        },
        metrics.registry().clone(),
    );
    let healthz = get(&router, &request("/healthz"));
    assert_eq!(healthz, Response::text(200, "ok"));
    assert_eq!(
        healthz.header("Content-Type"),
        Some("text/plain; charset=utf-8")
    );
    for path in ["/readyz", "/ready", "/readyz?verbose"] {
        let answer = get(&router, &request(path));
        assert_eq!(answer.status, 500, "{path}");
        assert_eq!(answer.body, b"no connection to any proxy agent");
    }
    ready.store(true, Ordering::Relaxed);
    for path in ["/readyz", "/ready"] {
        assert_eq!(get(&router, &request(path)), Response::text(200, "ok"));
    }
    let scrape = get(&router, &request("/metrics"));
    assert_eq!(scrape.status, 200);
    assert_eq!(
        scrape.header("Content-Type"),
        Some("text/plain; version=0.0.4; charset=utf-8; escaping=underscores")
    );
    let body = String::from_utf8(scrape.body).unwrap();
    assert!(body.contains("konnectivity_network_proxy_server_http_connections 0\n"));
    assert!(body.contains("promhttp_metric_handler_requests_in_flight 1\n"));
    assert_eq!(get(&router, &request("/debug/backends")).status, 404);
    assert_eq!(get(&router, &request("/")), Response::not_found());
}

fn backends() -> Vec<BackendInfo> {
    vec![BackendInfo {
        agent_id: "node-1".into(),
        identifiers: BackendIdentifiers {
            host: vec!["node-1".into()],
            ipv4: vec!["10.0.0.1".into()],
            ..BackendIdentifiers::default()
        },
        draining: false,
        connections_open: 3,
        connections_pending: 1,
        worker: 0,
        limits: None,
    }]
}

#[test]
fn admin_port_answers() {
    let metrics = ServerMetrics::new(1);
    let core = metrics.core(0).unwrap();
    core.stream_packets(Segment::ToAgent, konn_frames::packet::PacketType::DialReq)
        .inc();
    let router = admin_router(metrics.registry().clone(), backends, false);
    let body = String::from_utf8(get(&router, &request("/metrics")).body).unwrap();
    assert!(body.contains(
        "konnectivity_network_proxy_server_stream_packets_total{packet_type=\"DIAL_REQ\",segment=\"to_agent\"} 1\n"
    ));
    let debug = get(&router, &request("/debug/backends"));
    assert_eq!(debug.header("Content-Type"), Some("application/json"));
    assert_eq!(
        String::from_utf8(debug.body).unwrap(),
        "{\"agents\":[{\"id\":\"node-1\",\"identifiers\":{\"host\":[\"node-1\"],\
         \"ipv4\":[\"10.0.0.1\"],\"ipv6\":[],\"cidr\":[],\"defaultRoute\":false},\
         \"draining\":false,\"worker\":0,\"connections\":{\"open\":3,\"pending\":1}}]}\n"
    );
    // Profiling off: not there, as upstream.
    assert_eq!(get(&router, &request("/debug/pprof/")).status, 404);
    assert_eq!(get(&router, &request("/debug/pprof")).status, 404);
    assert_eq!(get(&router, &request("/healthz")).status, 404);
    // Profiling on: upstream's redirect, then konn's 501.
    let router = admin_router(metrics.registry().clone(), backends, true);
    let moved = get(&router, &request("/debug/pprof"));
    assert_eq!(moved.status, 301);
    assert_eq!(moved.header("Location"), Some("/debug/pprof/"));
    let profile = get(&router, &request("/debug/pprof/profile?seconds=5"));
    assert_eq!(profile.status, 501);
    assert_eq!(profile.body, PROFILING_UNAVAILABLE.as_bytes());
}

fn roundtrip(addr: SocketAddr, raw: &str) -> String {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    stream.write_all(raw.as_bytes()).unwrap();
    let mut out = String::new();
    stream.read_to_string(&mut out).unwrap();
    out
}

/// The answer without its `Date` field (which changes every second).
fn without_date(answer: &str) -> String {
    answer
        .split("\r\n")
        .filter(|l| !l.starts_with("Date: "))
        .collect::<Vec<_>>()
        .join("\r\n")
}

#[test]
fn health_port_over_sockets_on_every_engine() {
    for engine in available_engines() {
        let stopper = Stopper::new();
        let (tx, rx) = mpsc::channel();
        let server = std::thread::spawn({
            let stopper = stopper.clone();
            move || {
                block_on(engine, async move {
                    let metrics = ServerMetrics::new(1);
                    let listener = bind_tcp("127.0.0.1:0".parse().unwrap(), 16, false).unwrap();
                    tx.send(listener.local_addr().unwrap()).unwrap();
                    let listener = tcp_into_monoio(listener).unwrap();
                    let token = stopper.token();
                    let router =
                        health_router(|| Err(NOT_READY.to_owned()), metrics.registry().clone());
                    serve(
                        &listener,
                        &token,
                        Rc::new(router),
                        Rc::new(Config::default()),
                    )
                    .await
                    .unwrap();
                    token.close().await;
                })
                .unwrap();
            }
        });
        let addr = rx.recv_timeout(Duration::from_secs(20)).unwrap();
        // Byte for byte what upstream's proxy-server sends, minus `Date`.
        assert_eq!(
            without_date(&roundtrip(
                addr,
                "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
            )),
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain; charset=utf-8\r\n\
             Content-Length: 2\r\nConnection: close\r\n\r\nok",
            "{engine}"
        );
        assert_eq!(
            without_date(&roundtrip(addr, "GET /readyz HTTP/1.0\r\n\r\n")),
            "HTTP/1.0 500 Internal Server Error\r\nContent-Type: text/plain; charset=utf-8\r\n\
             Content-Length: 32\r\n\r\nno connection to any proxy agent"
        );
        let scrape = roundtrip(addr, "GET /metrics HTTP/1.0\r\n\r\n");
        assert!(scrape.starts_with("HTTP/1.0 200 OK\r\n"), "{scrape}");
        assert!(
            scrape
                .contains("# TYPE konnectivity_network_proxy_server_culled_leases_count counter\n")
        );
        stopper.stop();
        server.join().unwrap();
    }
}
