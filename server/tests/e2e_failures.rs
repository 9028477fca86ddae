//! Acceptance: failures, seen from the frontend, in both frontend modes
//! and under each io engine.
//!
//! - A dial that fails ends with upstream's DIAL_RSP error text (gRPC) or
//!   upstream's HTTP status and body (CONNECT): refused, unknown host,
//!   the agent's dial timeout, the server's backend dial timeout, no agent.
//! - An agent killed mid-stream closes every frontend of its connections
//!   (and fails its pending dials) within 1 s; connections through another
//!   agent go on as if nothing happened.
//! - A frontend that vanishes releases its connection and its pending dial
//!   on the server and on the agent.
//!
//! Each scenario ends with the leak check of `e2e_common::assert_idle`
//! and one audit record per dial, saying how it failed or ended.

mod e2e_common;

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use e2e_common::*;
use konn_core::io::runtime::{Either, Engine, available_engines, block_on};
use konn_protocol::server::backends::Strategy;
use konn_server::settings::Mode;
use konn_testkit::dest::{Destination, Unresponsive};
use konn_testkit::relay::LoadBalancer;

const MODES: [Mode; 2] = [Mode::Grpc, Mode::HttpConnect];

/// What a frontend gets for a failed dial: the DIAL_RSP error (gRPC), or
/// the whole HTTP answer (CONNECT).
#[derive(Debug, PartialEq, Eq)]
enum Failure {
    Dial(String),
    Http(u16, String),
}

/// Dial `target` through the server; the failure (a success fails the test).
async fn dial_failure(mode: Mode, frontend: &FrontendAddr, target: &str) -> Failure {
    dial_failure_at(mode, frontend, target).await.0
}

/// [`dial_failure`], and when the frontend had it.
async fn dial_failure_at(
    mode: Mode,
    frontend: &FrontendAddr,
    target: &str,
) -> (Failure, std::time::Instant) {
    match mode {
        Mode::Grpc => {
            let fe = frontend.grpc().await.unwrap();
            let r = fe.dial(target, T).await;
            let at = konn_core::io::clock::now();
            fe.close().await;
            match r {
                Err(konn_testkit::Error::DialFailed(e)) => (Failure::Dial(e), at),
                Err(e) => panic!("dial {target}: {e}"),
                Ok(_) => panic!("dial {target} succeeded"),
            }
        }
        Mode::HttpConnect => match frontend.connect(target).await {
            Err(konn_testkit::Error::Refused { status, response }) => {
                (Failure::Http(status, response), konn_core::io::clock::now())
            }
            Err(e) => panic!("CONNECT {target}: {e}"),
            Ok(_) => panic!("CONNECT {target} succeeded"),
        },
    }
}

/// The answer proxy-server writes for an agent's dial error (Go's
/// `http.Response.Write`, status from `mapDialErrorToHTTPStatus`).
fn dial_error_answer(status: &str, error: &str) -> String {
    format!(
        "HTTP/1.1 {status}\r\nConnection: close\r\nContent-Type: text/plain; charset=utf-8\r\n\r\n{error}"
    )
}

fn closed_port() -> u16 {
    konn_testkit::ports::free_port()
}

/// Refused, unknown host, the agent's dial timeout, no agent: the error
/// texts of Go's dialer in DIAL_RSP, and upstream's CONNECT answers (502,
/// 502, 504, 500).
#[test]
fn dial_failures_map_to_upstream_errors_and_statuses() {
    let _serial = serial();
    let hole = Unresponsive::start().unwrap();
    for engine in available_engines() {
        for mode in MODES {
            let what = format!("{mode:?} on {engine}");
            let before = Baseline::take();
            let dir = TempDir::new("dialfail");
            let audit = dir.path("audit.log");
            let mut server = ServerSpec {
                tweak: Some(audit_to(audit.clone())),
                ..ServerSpec::new(engine, mode, Transport::Unix, &dir)
            }
            .start();
            let mut agent = server.agent_with("agent-f", "", None, |s| {
                s.connect.settings.dial_timeout = Duration::from_millis(300);
            });
            wait_backends(&server, 1);
            let idle = Baseline::take();
            let frontend = server.frontend();
            let refused = format!("127.0.0.1:{}", closed_port());
            let refused_text = format!("dial tcp {refused}: connect: connection refused");
            // An empty label: the resolver refuses the name without asking
            // a DNS server (so does Go's), which keeps the test hermetic.
            let unknown_text = "dial tcp: lookup nowhere..invalid: no such host";
            let silent = hole.addr().to_string();
            let timeout_text = format!("dial tcp {silent}: i/o timeout");
            block_on(engine, async {
                let got = dial_failure(mode, &frontend, &refused).await;
                let unknown = dial_failure(mode, &frontend, "nowhere..invalid:80").await;
                let timeout = dial_failure(mode, &frontend, &silent).await;
                match mode {
                    Mode::Grpc => {
                        assert_eq!(got, Failure::Dial(refused_text.clone()));
                        assert_eq!(unknown, Failure::Dial(unknown_text.into()));
                        assert_eq!(timeout, Failure::Dial(timeout_text.clone()));
                    }
                    Mode::HttpConnect => {
                        let answer = |status, text| {
                            Failure::Http(
                                status,
                                dial_error_answer(
                                    if status == 502 {
                                        "502 Bad Gateway"
                                    } else {
                                        "504 Gateway Timeout"
                                    },
                                    text,
                                ),
                            )
                        };
                        assert_eq!(got, answer(502, &refused_text));
                        assert_eq!(unknown, answer(502, unknown_text));
                        assert_eq!(timeout, answer(504, &timeout_text));
                    }
                }
            })
            .unwrap();
            assert_idle(&server, &[&agent], idle, &what);

            // No agent at all.
            agent.stop();
            wait_backends(&server, 0);
            block_on(engine, async {
                let got = dial_failure(mode, &frontend, &refused).await;
                let want = match mode {
                    Mode::Grpc => Failure::Dial("No agent available".into()),
                    Mode::HttpConnect => Failure::Http(
                        500,
                        "HTTP/1.1 500 Internal Server Error\r\nContent-Type: text/plain\r\n\r\ncurrently no tunnels available: No agent available".into(),
                    ),
                };
                assert_eq!(got, want);
            })
            .unwrap();
            assert_idle(&server, &[], idle, &what);
            // Every dial audited, with why it failed.
            assert_audited(&server, &audit, &what);
            assert_eq!(
                audited_outcomes(&audit),
                [
                    "failed/dial_failed",
                    "failed/dial_failed",
                    "failed/dial_failed",
                    "refused/no_backend"
                ],
                "{what}"
            );
            server.stop();
            drop(dir);
            assert_released(before, &format!("{what}, stopped"));
        }
    }
}

/// `--backend-dial-timeout`: an agent that does not answer a dial in time
/// fails it with upstream's text (gRPC) or 504 and upstream's body
/// (CONNECT), and the agent is told to give the dial up (DIAL_CLS), so
/// nothing is left dialling.
#[test]
fn backend_dial_timeout_fails_the_dial_and_cancels_it_on_the_agent() {
    let _serial = serial();
    let hole = Unresponsive::start().unwrap();
    for engine in available_engines() {
        for mode in MODES {
            let what = format!("{mode:?} on {engine}");
            let before = Baseline::take();
            let dir = TempDir::new("backendtimeout");
            let audit = dir.path("audit.log");
            let mut server = ServerSpec {
                tweak: Some(audit_and(audit.clone(), |s| {
                    s.router.dial_timeout = Duration::from_millis(300)
                })),
                ..ServerSpec::new(engine, mode, Transport::Unix, &dir)
            }
            .start();
            // The agent would wait far longer than the leak check does.
            let mut agent = server.agent_with("agent-slow", "", None, |s| {
                s.connect.settings.dial_timeout = Duration::from_secs(600);
            });
            wait_backends(&server, 1);
            let idle = Baseline::take();
            let frontend = server.frontend();
            let silent = hole.addr().to_string();
            let got = block_on(engine, dial_failure(mode, &frontend, &silent)).unwrap();
            let want = match mode {
                Mode::Grpc => Failure::Dial("timed out waiting for backend dial".into()),
                Mode::HttpConnect => Failure::Http(
                    504,
                    "HTTP/1.1 504 Gateway Timeout\r\nContent-Type: text/plain; charset=utf-8\r\n\r\nBackend dial timeout: timed out waiting for backend dial\r\n".into(),
                ),
            };
            assert_eq!(got, want, "{what}");
            // The agent's dialling socket is gone too (it counts in the
            // descriptors), long before its own timeout.
            assert_idle(&server, &[&agent], idle, &what);
            assert_audited(&server, &audit, &what);
            assert_eq!(audited_outcomes(&audit), ["failed/dial_timeout"], "{what}");
            agent.stop();
            server.stop();
            drop(dir);
            assert_released(before, &format!("{what}, stopped"));
        }
    }
}

const A: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));
const B: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 3));

/// Connections per agent in the kill test.
const FLOWS: usize = 5;

/// The bound on closing the frontends of a dead agent.
const CLOSE_BOUND: Duration = Duration::from_secs(1);

/// Two agents, destHost: agent A serves 127.0.0.2, agent B 127.0.0.3.
/// A's tunnel is cut (through a balancer, as if its process died) while
/// connections through both agents carry data and a dial through A is
/// pending. Within 1 s of the cut every frontend of A's connections sees
/// the end (gRPC: CLOSE_RSP without error, as upstream; CONNECT: the
/// connection closes) and A's pending dial fails (konn does not leave it
/// hanging, unlike upstream #126); B's connections keep flowing; A's
/// destination host has no agent any more; the agent gives its endpoints
/// up.
#[test]
fn agent_killed_mid_stream_closes_its_frontends_within_a_second() {
    let _serial = serial();
    let pki = Pki::new();
    let echo_a = Destination::echo_on(A).unwrap();
    let echo_b = Destination::echo_on(B).unwrap();
    let hole_a = Unresponsive::start_on(A).unwrap();
    let (echo_a, echo_b, hole_a) = (
        echo_a.addr().to_string(),
        echo_b.addr().to_string(),
        hole_a.addr().to_string(),
    );
    for engine in available_engines() {
        for (mode, transport) in [
            (Mode::Grpc, Transport::Unix),
            (Mode::HttpConnect, Transport::Tls),
        ] {
            let what = format!("{mode:?} over {transport:?} on {engine}");
            let before = Baseline::take();
            let dir = TempDir::new("kill");
            let audit = dir.path("audit.log");
            let mut server = ServerSpec {
                pki: Some(&pki),
                strategies: vec![Strategy::DestHost],
                tweak: Some(audit_to(audit.clone())),
                ..ServerSpec::new(engine, mode, transport, &dir)
            }
            .start();
            let lb = LoadBalancer::start(vec![server.agent_addr()]).unwrap();
            let mut a = server.agent("agent-a", "host=127.0.0.2", Some(lb.addr()));
            let mut b = server.agent("agent-b", "host=127.0.0.3", None);
            wait_backends(&server, 2);
            let idle = Baseline::take();
            let frontend = server.frontend();
            block_on(
                engine,
                kill_scenario(
                    engine,
                    mode,
                    &frontend,
                    &server,
                    &lb,
                    [&echo_a, &echo_b, &hole_a],
                ),
            )
            .unwrap();
            wait_backends(&server, 1);
            assert_idle(&server, &[&a, &b], idle, &what);
            // One record per connection and dial, cut ones included.
            assert_audited(&server, &audit, &what);
            let outcomes = audited_outcomes(&audit);
            let cut = outcomes
                .iter()
                .filter(|o| *o == "closed/backend_gone")
                .count();
            assert_eq!(cut, FLOWS, "{what}: {outcomes:?}");
            a.stop();
            b.stop();
            drop(lb);
            server.stop();
            drop(dir);
            assert_released(before, &format!("{what}, stopped"));
        }
    }
}

/// One open connection of either mode.
enum Flow {
    Grpc(
        konn_testkit::frontend::GrpcFrontend,
        konn_testkit::frontend::Tunnel,
    ),
    Connect(konn_testkit::connect::ConnectTunnel),
}

impl Flow {
    async fn open(mode: Mode, frontend: &FrontendAddr, target: &str) -> Self {
        match mode {
            Mode::Grpc => {
                let fe = frontend.grpc().await.unwrap();
                let t = fe.dial(target, T).await.unwrap();
                Self::Grpc(fe, t)
            }
            Mode::HttpConnect => Self::Connect(frontend.connect(target).await.unwrap()),
        }
    }

    async fn echo(&mut self, msg: &[u8]) {
        let got = match self {
            Self::Grpc(_, t) => {
                t.write(msg).await.unwrap();
                t.read_exact(msg.len(), T).await.unwrap()
            }
            Self::Connect(t) => {
                t.write(msg).await.unwrap();
                t.read_exact(msg.len(), T).await.unwrap()
            }
        };
        assert_eq!(got, msg);
    }

    /// Wait for the server to end this connection; `Err` with what came
    /// instead.
    async fn ended(&mut self, limit: Duration) -> Result<(), String> {
        match self {
            Self::Grpc(_, t) => match t.read(limit).await {
                Ok(None) => Ok(()),
                other => Err(format!("{other:?}")),
            },
            Self::Connect(t) => match t.read(limit).await {
                Ok(None) => Ok(()),
                other => Err(format!("{other:?}")),
            },
        }
    }

    /// Let go of a connection the server ended.
    async fn discard(self) {
        if let Self::Grpc(fe, _) = self {
            fe.close().await;
        }
    }

    async fn close(self) {
        match self {
            Self::Grpc(fe, t) => {
                t.close(T).await.unwrap();
                fe.close().await;
            }
            Self::Connect(t) => t.close().await,
        }
    }
}

async fn kill_scenario(
    engine: Engine,
    mode: Mode,
    frontend: &FrontendAddr,
    server: &TestServer,
    lb: &LoadBalancer,
    [echo_a, echo_b, hole_a]: [&String; 3],
) {
    let mut via_a = Vec::new();
    let mut via_b = Vec::new();
    for _ in 0..FLOWS {
        via_a.push(Flow::open(mode, frontend, echo_a).await);
        via_b.push(Flow::open(mode, frontend, echo_b).await);
    }
    for f in via_a.iter_mut().chain(via_b.iter_mut()) {
        f.echo(b"before the cut").await;
    }
    // A dial through A that its agent is still working on.
    let pending = {
        let (frontend, hole_a) = (frontend.clone(), hole_a.clone());
        monoio::spawn(async move { dial_failure_at(mode, &frontend, &hole_a).await })
    };
    assert!(
        wait_until_async(|| server.load().pending_dials == 1).await,
        "the dial through A is pending: {:?}",
        server.load()
    );
    assert!(
        wait_until_async(|| server.load().established == 2 * FLOWS as i64).await,
        "{:?}",
        server.load()
    );

    // Kill A: it cannot come back (nothing behind the balancer).
    lb.set_backends(Vec::new());
    let cut = konn_core::io::clock::now();
    lb.cut();
    let ends: Vec<_> = via_a
        .into_iter()
        .map(|mut f| {
            monoio::spawn(async move {
                let r = f.ended(Duration::from_secs(5)).await;
                (r, konn_core::io::clock::now(), f)
            })
        })
        .collect();
    for (i, end) in ends.into_iter().enumerate() {
        let (r, at, f) = end.await;
        assert_eq!(r, Ok(()), "{mode:?} on {engine}: connection {i} through A");
        assert!(
            at - cut <= CLOSE_BOUND,
            "{mode:?} on {engine}: connection {i} through A closed {:?} after the cut",
            at - cut
        );
        f.discard().await;
    }
    let (failure, at) = pending.await;
    let gone = "backend connection closed before the dial completed";
    let want = match mode {
        Mode::Grpc => Failure::Dial(gone.into()),
        Mode::HttpConnect => Failure::Http(
            502,
            format!(
                "HTTP/1.1 502 Bad Gateway\r\nContent-Type: text/plain; charset=utf-8\r\n\r\nBackend context error: {gone}\r\n"
            ),
        ),
    };
    assert_eq!(
        failure, want,
        "{mode:?} on {engine}: the pending dial through A"
    );
    assert!(
        at - cut <= CLOSE_BOUND,
        "the pending dial failed {:?} after the cut",
        at - cut
    );

    // B's connections did not notice; A's host has no agent now.
    for f in &mut via_b {
        f.echo(b"after the cut").await;
    }
    assert!(
        wait_until_async(|| server.load().established == FLOWS as i64).await,
        "{:?}",
        server.load()
    );
    let none = dial_failure(mode, frontend, echo_a).await;
    match none {
        Failure::Dial(e) => assert_eq!(e, "No agent available"),
        Failure::Http(status, _) => assert_eq!(status, 500),
    }
    for f in via_b {
        f.close().await;
    }
}

/// A frontend that disappears without a word (kube-apiserver killed):
/// its established connection is closed at the agent and the destination,
/// and its pending dial is cancelled on the agent (DIAL_CLS), in both
/// modes.
#[test]
fn a_vanished_frontend_releases_its_connection_and_its_dial() {
    let _serial = serial();
    let echo = Destination::echo().unwrap();
    let hole = Unresponsive::start().unwrap();
    let (echo, hole) = (echo.addr().to_string(), hole.addr().to_string());
    for engine in available_engines() {
        for mode in MODES {
            let what = format!("{mode:?} on {engine}");
            let before = Baseline::take();
            let dir = TempDir::new("vanish");
            let audit = dir.path("audit.log");
            let mut server = ServerSpec {
                tweak: Some(audit_to(audit.clone())),
                ..ServerSpec::new(engine, mode, Transport::Unix, &dir)
            }
            .start();
            // A dial left to the agent would outlast the leak check.
            let mut agent = server.agent_with("agent-v", "", None, |s| {
                s.connect.settings.dial_timeout = Duration::from_secs(600);
            });
            wait_backends(&server, 1);
            let idle = Baseline::take();
            let frontend = server.frontend();
            block_on(engine, async {
                // Established, then gone.
                match mode {
                    Mode::Grpc => {
                        let fe = frontend.grpc().await.unwrap();
                        let t = fe.dial(&echo, T).await.unwrap();
                        t.write(b"x").await.unwrap();
                        assert_eq!(t.read_exact(1, T).await.unwrap(), b"x");
                        fe.abort().await;
                    }
                    Mode::HttpConnect => {
                        let mut t = frontend.connect(&echo).await.unwrap();
                        t.write(b"x").await.unwrap();
                        assert_eq!(t.read_exact(1, T).await.unwrap(), b"x");
                        drop(t);
                    }
                }
                assert!(
                    wait_until_async(|| server.load() == Load::default()).await,
                    "{what}: {:?}",
                    server.load()
                );
                // Pending, then gone: the frontend leaves once the server
                // has sent the dial to the agent.
                let pending = || async {
                    assert!(
                        wait_until_async(|| server.load().pending_dials == 1).await,
                        "{what}: the dial is pending: {:?}",
                        server.load()
                    );
                };
                match mode {
                    Mode::Grpc => {
                        let fe = frontend.grpc().await.unwrap();
                        let dial = fe.dial(&hole, T);
                        let r = konn_core::io::runtime::race(dial, pending()).await;
                        assert!(matches!(r, Either::Right(())), "{what}: the dial ended");
                        fe.abort().await;
                    }
                    Mode::HttpConnect => {
                        let dial = frontend.connect(&hole);
                        let r = konn_core::io::runtime::race(dial, pending()).await;
                        assert!(matches!(r, Either::Right(())), "{what}: the dial ended");
                    }
                }
            })
            .unwrap();
            assert_idle(&server, &[&agent], idle, &what);
            assert_audited(&server, &audit, &what);
            assert_eq!(
                audited_outcomes(&audit),
                ["cancelled/frontend_close", "closed/"],
                "{what}"
            );
            agent.stop();
            server.stop();
            drop(dir);
            assert_released(before, &format!("{what}, stopped"));
        }
    }
}
