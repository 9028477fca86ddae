//! Agent token authentication against a real kube-apiserver (v1.36 from
//! `target/kube/`, see `konn_testkit::kube`), konn's proxy-server next to
//! upstream's v0.36.0 (`target/interop/upstream/proxy-server`): the same
//! verdicts for every case (a TokenRequest token for the right audience and
//! service account; wrong audience, namespace, service account; users that
//! are not service accounts; an expired token; missing, two values, no
//! `Bearer `), refused calls leave no backend; a real agent carries traffic,
//! picks up a rotated token on its next connect, keeps working while
//! kube-apiserver is down while new agents are refused, and gets in again
//! when it is back; a reconnect storm of 200 connections with 20 tokens,
//! counted by kube-apiserver itself, konn against upstream.
//!
//! Skipped with a loud message when the control-plane binaries are absent;
//! `KONN_KUBE_REQUIRED=1` (scripts/test in CI) turns that into a failure.
//! The verdict table is written to `$CARGO_TARGET_DIR/kube-auth-table.md`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use konn_core::io::tls::{ClientTls, ClientTlsOptions, PemSource};
use konn_testkit::agentprobe::{ProbeResult, connect_call};
use konn_testkit::kube::{ALICE_TOKEN, Cluster, NODE_TOKEN, require_or_skip};
use konn_testkit::ports::free_port;
use konn_testkit::procs::{Proc, binary, http_get, upstream_binary, wait_http_ok};

const AUD: &str = "system:konnectivity-server";
const NS: &str = "kube-system";
const SA: &str = "konnectivity-agent";

struct Server {
    _proc: Proc,
    agent_port: u16,
    health: std::net::SocketAddr,
    uds: PathBuf,
}

fn start_server(
    bin: &Path,
    name: &str,
    dir: &Path,
    pki: &konn_testkit::pki::PkiFiles,
    kubeconfig: &Path,
) -> Server {
    let (agent_port, health_port, admin_port) = (free_port(), free_port(), free_port());
    let uds = dir.join(format!("{name}.sock"));
    let args: Vec<String> = vec![
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
        format!("--agent-namespace={NS}"),
        format!("--agent-service-account={SA}"),
        format!("--authentication-audience={AUD}"),
        format!("--kubeconfig={}", kubeconfig.display()),
        format!("--server-id={name}"),
        "--v=2".into(),
    ];
    let proc = Proc::spawn(bin, &args, &dir.join(format!("{name}.log"))).expect("server starts");
    let health: std::net::SocketAddr = format!("127.0.0.1:{health_port}").parse().unwrap();
    assert!(
        wait_http_ok(health, "/healthz", Duration::from_secs(30)),
        "{name} not healthy:\n{}",
        proc.log_tail(20)
    );
    Server {
        _proc: proc,
        agent_port,
        health,
        uds,
    }
}

fn tls(pki: &konn_testkit::pki::PkiFiles) -> ClientTls {
    ClientTlsOptions::new(PemSource::file(&pki.ca_cert), "127.0.0.1".to_owned())
        .build()
        .expect("client TLS")
}

fn probe(s: &Server, tls: &ClientTls, auth: &[&str]) -> ProbeResult {
    let mut md: Vec<(&str, &[u8])> = vec![("agentid", b"probe"), ("agentidentifiers", b"")];
    for a in auth {
        md.push(("authorization", a.as_bytes()));
    }
    connect_call(
        &format!("127.0.0.1:{}", s.agent_port),
        Some(tls),
        &md,
        Duration::from_secs(30),
    )
}

fn verdict(r: &ProbeResult) -> String {
    match r {
        ProbeResult::Accepted { .. } => "accepted".to_owned(),
        ProbeResult::Refused { status, message } => format!("refused, {status:?}: {message}"),
        ProbeResult::Failed(e) => format!("no answer: {e}"),
    }
}

#[test]
fn tokens_against_a_real_kube_apiserver_konn_and_upstream() {
    let Some(bins) = require_or_skip("kube_auth") else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let mut cluster = Cluster::start(bins, &dir.join("cluster"));
    for (ns, sa) in [(NS, SA), ("default", SA), (NS, "other")] {
        cluster.service_account(ns, sa);
    }
    let pki = konn_testkit::pki::write(&dir.join("pki")).unwrap();
    let tls = tls(&pki);
    let good = cluster.token(NS, SA, AUD);
    let bearer = |t: &str| format!("Bearer {t}");
    let cases: Vec<(&str, Vec<String>)> = vec![
        (
            "TokenRequest token, right audience and service account",
            vec![bearer(&good)],
        ),
        (
            "wrong audience",
            vec![bearer(&cluster.token(NS, SA, "wrong-audience"))],
        ),
        (
            "wrong namespace",
            vec![bearer(&cluster.token("default", SA, AUD))],
        ),
        (
            "wrong service account",
            vec![bearer(&cluster.token(NS, "other", AUD))],
        ),
        ("non-SA user (alice)", vec![bearer(ALICE_TOKEN)]),
        (
            "non-SA user (system:node:konn-node:x)",
            vec![bearer(NODE_TOKEN)],
        ),
        (
            "expired token",
            vec![bearer(&cluster.expired_token(NS, SA, AUD))],
        ),
        ("missing", vec![]),
        ("two values", vec![bearer(&good), bearer(&good)]),
        ("no `Bearer ` prefix", vec![good.clone()]),
    ];
    let konn = start_server(
        &binary("proxy-server").unwrap(),
        "konn",
        dir,
        &pki,
        &cluster.kubeconfig,
    );
    let upstream = upstream_binary("proxy-server")
        .map(|b| start_server(&b, "upstream", dir, &pki, &cluster.kubeconfig));
    if upstream.is_none() {
        eprintln!(
            "kube_auth: upstream's proxy-server not built (target/interop/upstream); konn only"
        );
    }
    let mut table = String::from("| Case | konn | upstream v0.36.0 |\n|---|---|---|\n");
    for (name, auth) in &cases {
        let auth: Vec<&str> = auth.iter().map(String::as_str).collect();
        let k = verdict(&probe(&konn, &tls, &auth));
        let u = upstream.as_ref().map(|u| verdict(&probe(u, &tls, &auth)));
        let expect_in = name.starts_with("TokenRequest");
        assert_eq!(k == "accepted", expect_in, "{name}: {k}");
        if let Some(u) = &u {
            assert_eq!(&k, u, "{name}: konn and upstream differ");
        }
        let cell = |v: &str| v.replace('|', "\\|");
        table.push_str(&format!(
            "| {name} | {} | {} |\n",
            cell(&k),
            u.as_deref().map_or("(not run)".to_owned(), cell)
        ));
    }
    // Refused calls left no backend on konn (the probe of the accepted one
    // hung up at once).
    let (_, m) = http_get(konn.health, "/metrics").unwrap();
    assert!(
        m.contains(
            "konnectivity_network_proxy_server_ready_backends{proxy_strategy=\"default\"} 0"
        ),
        "{m}"
    );
    assert!(
        m.contains("konn_server_agent_auth_total{result=\"denied\",source=\"api\"} 6"),
        "{m}"
    );
    println!("{table}");
    let out = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"));
    let _ = std::fs::write(out.join("kube-auth-table.md"), &table);

    // A real agent with a token file carries traffic.
    let echo = konn_testkit::dest::Destination::echo().unwrap();
    let token_file = dir.join("token");
    std::fs::write(&token_file, &good).unwrap();
    let agent_health = free_port();
    let agent_args: Vec<String> = vec![
        "--proxy-server-host=127.0.0.1".into(),
        format!("--proxy-server-port={}", konn.agent_port),
        format!("--ca-cert={}", pki.ca_cert.display()),
        format!("--service-account-token-path={}", token_file.display()),
        "--health-server-host=127.0.0.1".into(),
        format!("--health-server-port={agent_health}"),
        format!("--admin-server-port={}", free_port()),
        "--sync-interval=200ms".into(),
        "--sync-interval-cap=1s".into(),
        "--agent-id=agent-1".into(),
    ];
    let agent = Proc::spawn(
        &binary("proxy-agent").unwrap(),
        &agent_args,
        &dir.join("agent.log"),
    )
    .unwrap();
    assert!(
        wait_http_ok(konn.health, "/readyz", Duration::from_secs(20)),
        "the agent did not get in:\n{}",
        agent.log_tail(20)
    );
    let echo_once = |uds: &Path| -> bool {
        let uds = uds.to_owned();
        let addr = echo.addr().to_string();
        konn_core::io::runtime::block_on(konn_core::io::runtime::Engine::Epoll, async move {
            let Ok(f) = konn_testkit::frontend::GrpcFrontend::connect_unix(&uds).await else {
                return false;
            };
            let Ok(t) = f.dial(&addr, Duration::from_secs(5)).await else {
                return false;
            };
            let ok = t.write(b"ping").await.is_ok()
                && t.read_exact(4, Duration::from_secs(5))
                    .await
                    .is_ok_and(|b| b == b"ping");
            let _ = t.close(Duration::from_secs(2)).await;
            f.close().await;
            ok
        })
        .unwrap_or(false)
    };
    assert!(
        echo_once(&konn.uds),
        "traffic through the authenticated agent"
    );

    // kube-apiserver stops: a new agent (a token never seen) is refused at
    // once; the connected agent keeps carrying traffic.
    let fresh = cluster.token(NS, SA, AUD);
    let fresh2 = cluster.token(NS, SA, AUD);
    cluster.stop_apiserver();
    let r = probe(&konn, &tls, &[&bearer(&fresh)]);
    assert!(
        matches!(&r, ProbeResult::Refused { message, .. } if message.starts_with("Failed to validate authentication token, err:Failed to authenticate request. err:")),
        "{r:?}"
    );
    assert!(echo_once(&konn.uds), "the connected agent keeps working");
    // It comes back: new agents get in.
    cluster.start_apiserver();
    assert!(matches!(
        probe(&konn, &tls, &[&bearer(&fresh2)]),
        ProbeResult::Accepted { .. }
    ));

    // A rotated token file is read on the next connect: an invalid token,
    // then the server restarts (the agent reconnects) and refuses it; a
    // valid one, and the agent is back.
    drop(agent);
    std::fs::write(&token_file, "not-a-token").unwrap();
    let agent = Proc::spawn(
        &binary("proxy-agent").unwrap(),
        &agent_args,
        &dir.join("agent2.log"),
    )
    .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    assert!(
        !wait_http_ok(konn.health, "/readyz", Duration::from_millis(500)),
        "refused with the bad token"
    );
    std::fs::write(&token_file, cluster.token(NS, SA, AUD)).unwrap();
    assert!(
        wait_http_ok(konn.health, "/readyz", Duration::from_secs(20)),
        "the rotated token was not picked up:\n{}",
        agent.log_tail(20)
    );
    drop(agent);

    // Storm: 200 connections with 20 distinct tokens, 20 at a time; count
    // kube-apiserver's TokenReview creations for konn and for upstream.
    let tokens: Arc<Vec<String>> = Arc::new(
        (0..20)
            .map(|_| bearer(&cluster.token(NS, SA, AUD)))
            .collect(),
    );
    let storm = |s: &Server| -> (u64, usize) {
        let before = cluster.token_reviews();
        let port = s.agent_port;
        let accepted: usize = std::thread::scope(|sc| {
            let hs: Vec<_> = (0..20)
                .map(|t| {
                    let (tokens, tls) = (tokens.clone(), tls.clone());
                    sc.spawn(move || {
                        let mut ok = 0;
                        for i in 0..10 {
                            let tok = &tokens[(t + i * 7) % 20];
                            let md: Vec<(&str, &[u8])> = vec![
                                ("agentid", b"storm"),
                                ("agentidentifiers", b""),
                                ("authorization", tok.as_bytes()),
                            ];
                            if matches!(
                                connect_call(
                                    &format!("127.0.0.1:{port}"),
                                    Some(&tls),
                                    &md,
                                    Duration::from_secs(60)
                                ),
                                ProbeResult::Accepted { .. }
                            ) {
                                ok += 1;
                            }
                        }
                        ok
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap_or(0)).sum()
        });
        (cluster.token_reviews() - before, accepted)
    };
    let (k_reviews, k_ok) = storm(&konn);
    println!("storm (200 connections, 20 tokens): konn {k_reviews} TokenReviews, {k_ok} accepted");
    assert!(k_reviews <= 20, "konn made {k_reviews} TokenReviews");
    if let Some(u) = &upstream {
        let (u_reviews, u_ok) = storm(u);
        println!(
            "storm (200 connections, 20 tokens): upstream {u_reviews} TokenReviews, {u_ok} accepted"
        );
        let _ = std::fs::write(
            out.join("kube-auth-storm.txt"),
            format!(
                "konn {k_reviews} reviews {k_ok} accepted; upstream {u_reviews} reviews {u_ok} accepted\n"
            ),
        );
    }
    drop(upstream);
    drop(konn);
}
