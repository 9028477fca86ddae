//! KEP-2025 against upstream's proxy-server (v0.36): a konn proxy-agent
//! with `--target` connects to it like any agent, offers `konn-reverse`,
//! gets no answer, and so never sends it a reverse packet. Connections
//! accepted on the `--target` listener are closed at once and counted
//! (`konn_reverse_refusals_total{reason="no_tunnel"}`), nothing reaches the
//! destination, the agent logs one clear line, and the forward direction
//! through the same tunnel keeps working.
//!
//! Needs `target/interop/upstream/proxy-server` (scripts/test builds it);
//! skips without it unless `KONN_UPSTREAM_REQUIRED` is set.

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use konn_testkit::blocking::ReadRetry;
use konn_testkit::dest::Destination;
use konn_testkit::ports::free_port;
use konn_testkit::procs::{Proc, binary, http_get, upstream_binary, wait_http_ok};
use konn_testkit::wait::wait_until;

fn metric(addr: SocketAddr, series: &str) -> f64 {
    http_get(addr, "/metrics")
        .ok()
        .and_then(|(_, body)| {
            body.lines()
                .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        })
        .unwrap_or(0.0)
}

#[test]
fn a_konn_agent_never_sends_reverse_packets_to_an_upstream_server() {
    let Some(upstream) = upstream_binary("proxy-server") else {
        assert!(
            std::env::var_os("KONN_UPSTREAM_REQUIRED").is_none(),
            "KONN_UPSTREAM_REQUIRED is set but upstream's proxy-server is not built"
        );
        eprintln!("skipped: upstream's proxy-server is not built (scripts/test builds it)");
        return;
    };
    let tmp = konn_testkit::files::TempDir::new("reverse-upstream");
    let dir = tmp.0.as_path();
    let pki = konn_testkit::pki::write(&dir.join("pki")).unwrap();
    let echo = Destination::echo().unwrap();
    let uds = dir.join("upstream.sock");
    let (agent_port, health_port, admin_port) = (free_port(), free_port(), free_port());
    let server_args: Vec<String> = vec![
        "--mode=grpc".into(),
        format!("--uds-name={}", uds.display()),
        "--server-port=0".into(),
        "--agent-bind-address=127.0.0.1".into(),
        format!("--agent-port={agent_port}"),
        "--health-bind-address=127.0.0.1".into(),
        format!("--health-port={health_port}"),
        format!("--admin-port={admin_port}"),
        format!("--cluster-cert={}", pki.server_cert.display()),
        format!("--cluster-key={}", pki.server_key.display()),
        "--v=5".into(),
    ];
    let server = Proc::spawn(&upstream, &server_args, &dir.join("upstream-server.log")).unwrap();
    let server_health: SocketAddr = format!("127.0.0.1:{health_port}").parse().unwrap();
    assert!(
        wait_http_ok(server_health, "/healthz", Duration::from_secs(30)),
        "upstream proxy-server not healthy:\n{}",
        server.log_tail(20)
    );

    let (agent_health, agent_admin, local) = (free_port(), free_port(), free_port());
    let agent_args: Vec<String> = vec![
        "--proxy-server-host=127.0.0.1".into(),
        format!("--proxy-server-port={agent_port}"),
        format!("--ca-cert={}", pki.ca_cert.display()),
        format!("--agent-cert={}", pki.agent_cert.display()),
        format!("--agent-key={}", pki.agent_key.display()),
        "--agent-id=konn-reverse".into(),
        "--health-server-host=127.0.0.1".into(),
        format!("--health-server-port={agent_health}"),
        "--admin-bind-address=127.0.0.1".into(),
        format!("--admin-server-port={agent_admin}"),
        format!("--target={local}:{}", echo.addr()),
        "--bind-address=127.0.0.1".into(),
        "--v=2".into(),
    ];
    let agent = Proc::spawn(
        &binary("proxy-agent").unwrap(),
        &agent_args,
        &dir.join("konn-agent.log"),
    )
    .unwrap();
    let agent_addr: SocketAddr = format!("127.0.0.1:{agent_health}").parse().unwrap();
    assert!(
        wait_http_ok(agent_addr, "/readyz", Duration::from_secs(30))
            && wait_http_ok(server_health, "/readyz", Duration::from_secs(30)),
        "the konn agent did not connect to upstream's server:\n{}\n{}",
        agent.log_tail(20),
        server.log_tail(20)
    );

    // Every connection on the --target listener ends without a byte.
    const TRIES: usize = 5;
    for i in 0..TRIES {
        let mut s = TcpStream::connect(("127.0.0.1", local)).expect("the --target listener");
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let _ = s.write_all(b"ping");
        let mut b = [0u8; 1];
        match s.read_retry(&mut b) {
            Ok(0) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
            other => panic!("connection {i} through an upstream server: {other:?}"),
        }
    }
    assert!(
        wait_until(Duration::from_secs(10), || {
            metric(
                agent_addr,
                "konn_reverse_refusals_total{reason=\"no_tunnel\"}",
            ) == TRIES as f64
        }),
        "every connection counted as no_tunnel"
    );
    assert_eq!(
        metric(agent_addr, "konn_reverse_dials_total{result=\"ok\"}"),
        0.0
    );
    assert_eq!(echo.connections(), 0, "nothing reached the destination");

    // The forward direction through the same tunnel still works: a dial
    // from upstream's frontend socket reaches the echo server.
    let reached =
        konn_core::io::runtime::block_on(konn_core::io::runtime::Engine::Epoll, async move {
            let fe = konn_testkit::frontend::GrpcFrontend::connect_unix(&uds).await?;
            let t = fe
                .dial(&echo.addr().to_string(), Duration::from_secs(10))
                .await?;
            t.write(b"forward").await?;
            let got = t.read_exact(7, Duration::from_secs(10)).await?;
            fe.close().await;
            Ok::<_, konn_testkit::Error>((got, echo))
        })
        .unwrap();
    let (got, echo) = reached.expect("a forward dial through the konn agent");
    assert_eq!(got, b"forward");
    assert_eq!(echo.connections(), 1);

    // Upstream saw nothing it does not understand, and the agent said why
    // the reverse direction is off.
    let server_log = std::fs::read_to_string(dir.join("upstream-server.log")).unwrap();
    for bad in ["nrecognized", "nknown packet", "unknown type"] {
        assert!(
            !server_log.contains(bad),
            "upstream's server log mentions {bad:?}:\n{}",
            server.log_tail(30)
        );
    }
    let agent_log = std::fs::read_to_string(dir.join("konn-agent.log")).unwrap();
    assert!(
        agent_log.contains("does not offer konn's node-to-control-plane direction"),
        "the agent logs why --target is off:\n{}",
        agent.log_tail(20)
    );
}
