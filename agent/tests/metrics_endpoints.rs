//! proxy-agent's health and admin endpoints, compared with what upstream
//! v0.36.0's proxy-agent answered to the same requests (health port 18093,
//! admin port 18094 in those runs): readiness bodies and statuses, and the
//! admin port's `/metrics` redirect (Location and body), via the routers
//! and over real sockets under every io engine.

use std::{
    io::{Read, Write},
    net::{SocketAddr, TcpStream},
    rc::Rc,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use konn_agent::{
    health::{admin_router, health_router},
    metrics::AgentMetrics,
};
use konn_core::{
    http1::{Config, Request, Response, Router, serve},
    io::{
        listen::{bind_tcp, tcp_into_monoio},
        runtime::{Stopper, available_engines, block_on},
    },
};

fn get(router: &Router, raw: &str) -> Response {
    let (request, _) = Request::parse(raw.as_bytes(), 1 << 20).unwrap().unwrap();
    router.handle(&request)
}

fn request(path: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nHost: localhost:18093\r\n\r\n")
}

const FAILED: &str = "[+]ping ok\n[-]server-connected failed: no servers connected\n";
const PASSED: &str = "[+]ping ok\n[+]server-connected ok\ncheck passed\n";

#[test]
fn readiness_like_upstream() {
    let metrics = AgentMetrics::new(1);
    let connected = Arc::new(AtomicBool::new(false));
    let flag = connected.clone();
    let router = health_router(
        move || flag.load(Ordering::Relaxed),
        metrics.registry().clone(),
    );
    assert_eq!(
        get(&router, &request("/healthz")),
        Response::text(200, "ok")
    );
    // Failing: always verbose, 503, no "check passed".
    for path in ["/readyz", "/readyz?verbose", "/ready", "/ready?verbose=0"] {
        assert_eq!(
            get(&router, &request(path)),
            Response::text(503, FAILED),
            "{path}"
        );
    }
    connected.store(true, Ordering::Relaxed);
    assert_eq!(get(&router, &request("/readyz")), Response::text(200, "ok"));
    assert_eq!(get(&router, &request("/ready")), Response::text(200, "ok"));
    for path in [
        "/readyz?verbose",
        "/ready?verbose=false",
        "/readyz?x=1&verbose",
        "/readyz?verb%6Fse",
    ] {
        assert_eq!(
            get(&router, &request(path)),
            Response::text(200, PASSED),
            "{path}"
        );
    }
    // Not a `verbose` key, as Go's query parser sees it.
    assert_eq!(
        get(&router, &request("/readyz?verbosity")),
        Response::text(200, "ok")
    );
    assert_eq!(
        get(&router, &request("/readyz?verbose;x")),
        Response::text(200, "ok")
    );
    let scrape = String::from_utf8(get(&router, &request("/metrics")).body).unwrap();
    assert!(scrape.contains("konnectivity_network_proxy_agent_known_server_count 0\n"));
}

/// (request, Location, body) as upstream's agent answered with health port
/// 18093.
const REDIRECTS: [(&str, &str, &str); 7] = [
    (
        "GET /metrics HTTP/1.1\r\nHost: localhost:18094\r\n\r\n",
        "//localhost:18093/metrics",
        "<a href=\"//localhost:18093/metrics\">Moved Permanently</a>.\n\n",
    ),
    (
        "GET /metrics?a=b&c HTTP/1.1\r\nHost: example.com\r\n\r\n",
        "//example.com:18093/metrics?a=b&c",
        "<a href=\"//example.com:18093/metrics?a=b&amp;c\">Moved Permanently</a>.\n\n",
    ),
    (
        "GET /metrics HTTP/1.1\r\nHost: [::1]:99\r\n\r\n",
        "//[::1]:18093/metrics",
        "<a href=\"//[::1]:18093/metrics\">Moved Permanently</a>.\n\n",
    ),
    (
        "GET /metrics HTTP/1.0\r\n\r\n",
        "//:18093/metrics",
        "<a href=\"//:18093/metrics\">Moved Permanently</a>.\n\n",
    ),
    (
        "GET /met%72ics HTTP/1.0\r\nHost: a\r\n\r\n",
        "//a:18093/met%72ics",
        "<a href=\"//a:18093/met%72ics\">Moved Permanently</a>.\n\n",
    ),
    (
        "GET /metrics?q=%zz HTTP/1.0\r\nHost: a\r\n\r\n",
        "//a:18093/metrics?q=%zz",
        "<a href=\"//a:18093/metrics?q=%zz\">Moved Permanently</a>.\n\n",
    ),
    (
        "GET /metrics?q=<a>\"' HTTP/1.0\r\nHost: a\r\n\r\n",
        "//a:18093/metrics?q=<a>\"'",
        "<a href=\"//a:18093/metrics?q=&lt;a&gt;&#34;&#39;\">Moved Permanently</a>.\n\n",
    ),
];

#[test]
fn admin_metrics_redirect_like_upstream() {
    let router = admin_router(18093, false);
    for (raw, location, body) in REDIRECTS {
        let answer = get(&router, raw);
        assert_eq!(answer.status, 301, "{raw:?}");
        assert_eq!(answer.header("Location"), Some(location), "{raw:?}");
        assert_eq!(
            answer.header("Content-Type"),
            Some("text/html; charset=utf-8")
        );
        assert_eq!(String::from_utf8(answer.body).unwrap(), body, "{raw:?}");
    }
    // HEAD: same fields, no body.
    let head = get(
        &router,
        "HEAD /metrics HTTP/1.1\r\nHost: localhost:18094\r\n\r\n",
    );
    assert_eq!(head.header("Location"), Some("//localhost:18093/metrics"));
    assert!(head.body.is_empty());
    // An absolute-form target keeps its scheme.
    let absolute = get(
        &router,
        "GET http://h:1/metrics HTTP/1.1\r\nHost: other\r\n\r\n",
    );
    assert_eq!(absolute.header("Location"), Some("http://h:18093/metrics"));
    assert_eq!(get(&router, &request("/healthz")).status, 404);
    assert_eq!(get(&router, &request("/debug/pprof/")).status, 404);
    let profiling = admin_router(18093, true);
    assert_eq!(get(&profiling, &request("/debug/pprof/")).status, 501);
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

/// Serves `router()` on `listener` on a runtime of `engine` in a new
/// thread until `stopper` fires.
fn spawn_server(
    engine: konn_core::io::runtime::Engine,
    listener: std::net::TcpListener,
    stopper: &Stopper,
    router: impl FnOnce() -> Router + Send + 'static,
) -> std::thread::JoinHandle<()> {
    let stopper = stopper.clone();
    std::thread::spawn(move || {
        block_on(engine, async move {
            let listener = tcp_into_monoio(listener).unwrap();
            let token = stopper.token();
            serve(
                &listener,
                &token,
                Rc::new(router()),
                Rc::new(Config::default()),
            )
            .await
            .unwrap();
            token.close().await;
        })
        .unwrap();
    })
}

#[test]
fn admin_and_health_ports_over_sockets_on_every_engine() {
    for engine in available_engines() {
        let stopper = Stopper::new();
        let health = bind_tcp("127.0.0.1:0".parse().unwrap(), 16, false).unwrap();
        let admin = bind_tcp("127.0.0.1:0".parse().unwrap(), 16, false).unwrap();
        let (health_addr, admin_addr) = (health.local_addr().unwrap(), admin.local_addr().unwrap());
        let health_port = health_addr.port();
        let metrics = AgentMetrics::new(1);
        let registry = metrics.registry().clone();
        let threads = [
            spawn_server(engine, health, &stopper, move || {
                health_router(|| true, registry)
            }),
            spawn_server(engine, admin, &stopper, move || {
                admin_router(health_port, false)
            }),
        ];
        let redirect = roundtrip(
            admin_addr,
            "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1:1\r\nConnection: close\r\n\r\n",
        );
        let location = format!("Location: //127.0.0.1:{health_port}/metrics\r\n");
        assert!(
            redirect.starts_with("HTTP/1.1 301 Moved Permanently\r\n"),
            "{engine}: {redirect}"
        );
        assert!(redirect.contains(&location), "{redirect}");
        // Follow it by hand.
        let scrape = roundtrip(
            health_addr,
            "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
        );
        assert!(scrape.contains("konnectivity_network_proxy_agent_known_server_count 0\n"));
        let ready = roundtrip(health_addr, "GET /readyz?verbose HTTP/1.0\r\n\r\n");
        assert!(ready.ends_with(&format!("\r\n\r\n{PASSED}")), "{ready}");
        stopper.stop();
        for thread in threads {
            thread.join().unwrap();
        }
    }
}
