//! Acceptance: konn's dial admission limits, the overload manager and the
//! agent's `--allowed-destination-cidrs` (docs/design/limits.md), on real
//! sockets in both frontend modes and under each io engine.
//!
//! - Each limit — per agent, destination host, frontend identity (client
//!   certificate CN, Unix-socket uid) and cluster, concurrency and rate —
//!   refuses the dial over it with its documented answer (gRPC:
//!   `DIAL_RSP{error:"konn: dial refused: <reason>"}`, CONNECT: 503 with
//!   that text) and lets the others through; a released connection makes
//!   room again.
//! - Above the memory watermark new dials are refused (`overload`) while an
//!   established transfer goes on to its last byte; once it drained, dials
//!   are admitted again.
//! - An agent with an allow-list refuses a destination outside it (also
//!   when named by a host name that resolves there) with upstream's
//!   DIAL_RSP error shape (CONNECT: 502, as any agent dial error), counts
//!   it, and dials the one inside; the server audits the refusal.
//!
//! Each scenario ends with the leak check of `e2e_common::assert_idle`;
//! the limit scenarios also with one audit record per dial, admitted or
//! refused, with the bytes the destination counted.

mod e2e_common;

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use e2e_common::*;
use konn_core::io::runtime::{Engine, available_engines, block_on};
use konn_protocol::server::backends::Strategy;
use konn_protocol::server::limits::{Limit, Limits, LimitsConfig};
use konn_server::settings::Mode;
use konn_testkit::connect::ConnectTunnel;
use konn_testkit::dest::Destination;
use konn_testkit::frontend::{GrpcFrontend, Tunnel};

const MODES: [Mode; 2] = [Mode::Grpc, Mode::HttpConnect];
const A: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));
const B: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 3));

/// An open connection through the server.
enum Held {
    Grpc(GrpcFrontend, Tunnel),
    Connect(ConnectTunnel),
}

impl Held {
    /// Echo a few bytes through it.
    async fn echo(&mut self) {
        match self {
            Self::Grpc(_, t) => {
                t.write(b"ping").await.unwrap();
                assert_eq!(t.read_exact(4, T).await.unwrap(), b"ping");
            }
            Self::Connect(c) => {
                c.write(b"ping").await.unwrap();
                assert_eq!(c.read_exact(4, T).await.unwrap(), b"ping");
            }
        }
    }

    async fn close(self) {
        match self {
            Self::Grpc(fe, t) => {
                let _ = t.close(T).await;
                fe.close().await;
            }
            Self::Connect(c) => c.close().await,
        }
    }
}

/// Dial `target`: the open connection, or the failure as the frontend saw
/// it (gRPC: the DIAL_RSP error; CONNECT: status and whole response).
async fn open(mode: Mode, frontend: &FrontendAddr, target: &str) -> Result<Held, (u16, String)> {
    match mode {
        Mode::Grpc => {
            let fe = frontend.grpc().await.unwrap();
            match fe.dial(target, T).await {
                Ok(t) => Ok(Held::Grpc(fe, t)),
                Err(konn_testkit::Error::DialFailed(e)) => {
                    fe.close().await;
                    Err((0, e))
                }
                Err(e) => panic!("dial {target}: {e}"),
            }
        }
        Mode::HttpConnect => match frontend.connect(target).await {
            Ok(c) => Ok(Held::Connect(c)),
            Err(konn_testkit::Error::Refused { status, response }) => Err((status, response)),
            Err(e) => panic!("CONNECT {target}: {e}"),
        },
    }
}

/// What a frontend gets for a dial refused by the server for `reason`.
fn refusal(mode: Mode, reason: &str) -> (u16, String) {
    let text = format!("konn: dial refused: {reason}");
    match mode {
        Mode::Grpc => (0, text),
        Mode::HttpConnect => (
            503,
            format!(
                "HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n\r\n{text}"
            ),
        ),
    }
}

/// Open `target`, which must succeed, and echo through it.
async fn open_ok(mode: Mode, frontend: &FrontendAddr, target: &str) -> Held {
    let mut h = open(mode, frontend, target)
        .await
        .unwrap_or_else(|e| panic!("{mode:?} {target}: {e:?}"));
    h.echo().await;
    h
}

/// Dial `target` until it is admitted (a released permit reaches the
/// server a little after the frontend saw its connection end).
async fn open_eventually(mode: Mode, frontend: &FrontendAddr, target: &str) -> Held {
    let deadline = konn_core::io::clock::now() + T;
    loop {
        match open(mode, frontend, target).await {
            Ok(mut h) => {
                h.echo().await;
                return h;
            }
            Err(e) => assert!(
                konn_core::io::clock::now() < deadline,
                "{mode:?} {target} still refused: {e:?}"
            ),
        }
        monoio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

/// A server with `cfg` (destHost: agent `a` serves 127.0.0.2, agent `b`
/// 127.0.0.3) runs `scenario` with the two destinations' addresses, then
/// the leak check.
fn with_limits(
    engine: Engine,
    mode: Mode,
    cfg: LimitsConfig,
    scenario: impl AsyncFnOnce(&Frontends, String, String),
) {
    with_limits_on(
        engine,
        mode,
        Transport::Unix,
        cfg,
        async |fe: &Frontends, a, b| scenario(fe, a, b).await,
    );
}

/// Two ways into the server: `main` (the frontend certificate, CN
/// `kube-apiserver`, over TCP+mTLS; the test's uid over the Unix socket),
/// and `other` over TCP+mTLS (the agent's certificate, CN
/// `konnectivity-agent`: another frontend identity).
struct Frontends {
    main: FrontendAddr,
    other: Option<FrontendAddr>,
    /// The audit log.
    audit: std::path::PathBuf,
    /// The admin port.
    admin: std::net::SocketAddr,
}

impl Frontends {
    /// `/debug/backends`.
    fn backends(&self) -> serde_json::Value {
        let (status, body) = konn_testkit::procs::http_get(self.admin, "/debug/backends").unwrap();
        assert_eq!(status, 200);
        serde_json::from_str(&body).unwrap()
    }
}

/// [`with_limits`] over `transport`, the scenario given [`Frontends`].
fn with_limits_on(
    engine: Engine,
    mode: Mode,
    transport: Transport,
    cfg: LimitsConfig,
    scenario: impl AsyncFnOnce(&Frontends, String, String),
) {
    let what = format!("{mode:?} over {transport:?} on {engine}, {cfg:?}");
    let before = Baseline::take();
    let dir = TempDir::new("limits");
    let pki = (transport == Transport::Tls).then(Pki::new);
    let dest_a = Destination::echo_on(A).unwrap();
    let dest_b = Destination::echo_on(B).unwrap();
    let limits = Arc::new(Limits::new(cfg, konn_core::io::clock::now()));
    let audit = dir.path("audit.log");
    let log = audit_to(audit.clone());
    let mut server = ServerSpec {
        strategies: vec![Strategy::DestHost],
        pki: pki.as_ref(),
        tweak: Some(Box::new(move |s| {
            s.router.limits = Some(limits);
            s.admin_addr = Some("127.0.0.1:0".parse().unwrap());
            log(s);
        })),
        ..ServerSpec::new(engine, mode, transport, &dir)
    }
    .start();
    let mut a = server.agent("a", "ipv4=127.0.0.2", None);
    let mut b = server.agent("b", "ipv4=127.0.0.3", None);
    wait_backends(&server, 2);
    let idle = Baseline::take();
    let main = server.frontend();
    let other = pki.as_ref().map(|pki| {
        let tls = pki.agent_client();
        FrontendAddr {
            tls: Some(match mode {
                Mode::Grpc => tls,
                Mode::HttpConnect => konn_testkit::connect::http1_tls(&tls),
            }),
            ..main.clone()
        }
    });
    let admin = server.h().admin_addr().unwrap();
    let frontends = Frontends {
        main,
        other,
        audit,
        admin,
    };
    konn_testkit::dest::take_transfers();
    block_on(
        engine,
        scenario(
            &frontends,
            dest_a.addr().to_string(),
            dest_b.addr().to_string(),
        ),
    )
    .unwrap();
    assert_idle(&server, &[&a, &b], idle, &what);
    assert_audited_bytes(&server, &frontends.audit, &what);
    // Every refusal counted and audited, with its limit as the reason.
    let scrape = server.h().metrics().registry().render_to_string();
    let counted: f64 = scrape
        .lines()
        .filter(|l| l.starts_with("konn_server_dial_refusals_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    let outcomes = audited_outcomes(&frontends.audit);
    let audited = outcomes
        .iter()
        .filter(|o| o.starts_with("refused/limit_"))
        .count();
    assert!(counted >= 1.0, "{what}: nothing refused");
    assert_eq!(counted, audited as f64, "{what}: {outcomes:?}");
    a.stop();
    b.stop();
    server.stop();
    drop((dir, dest_a, dest_b));
    assert_released(before, &format!("{what}, stopped"));
}

fn refusals(server_scrape: &str, reason: &str) -> f64 {
    metric(
        server_scrape,
        &format!("konn_server_dial_refusals_total{{reason=\"{reason}\"}}"),
    )
    .unwrap_or(0.0)
}

#[test]
fn agent_connection_limit_refuses_only_that_agents_dials() {
    let _serial = serial();
    for engine in available_engines() {
        for mode in MODES {
            let cfg = LimitsConfig {
                agent: Limit {
                    max_conns: 1,
                    ..Limit::default()
                },
                ..LimitsConfig::default()
            };
            with_limits(engine, mode, cfg, async |fx, a, b| {
                let fe = &fx.main;
                let held = open_ok(mode, fe, &a).await;
                assert_eq!(
                    open(mode, fe, &a).await.err(),
                    Some(refusal(mode, "limit_agent_conns"))
                );
                // /debug/backends: the limit in force, agent a's count.
                let v = fx.backends();
                assert_eq!(v["limits"]["agent"]["connections"], 1, "{v}");
                assert_eq!(v["limits"]["overloaded"], false, "{v}");
                let agent = |id: &str| {
                    v["agents"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .find(|x| x["id"] == id)
                        .map(|x| x["limits"].clone())
                        .unwrap()
                };
                assert_eq!(agent("a")["connections"], 1, "{v}");
                assert_eq!(agent("a")["refused"], 1, "{v}");
                assert_eq!(agent("b")["connections"], 0, "{v}");
                // Agent b is not limited by a's connections.
                open_ok(mode, fe, &b).await.close().await;
                held.close().await;
                open_eventually(mode, fe, &a).await.close().await;
            });
        }
    }
}

/// A rate limit of one dial in two seconds (burst 1) on the class `limit`
/// selects: a second dial to agent `a`'s destination is refused with
/// `reason`, one to agent `b`'s destination goes through.
fn rate_limit_refuses_only_the_second_dial_to_a(
    limit: impl Fn(&mut LimitsConfig) -> &mut Limit,
    reason: &str,
) {
    let _serial = serial();
    for engine in available_engines() {
        for mode in MODES {
            let mut cfg = LimitsConfig::default();
            *limit(&mut cfg) = Limit {
                rate: 0.5,
                burst: 1,
                ..Limit::default()
            };
            with_limits(engine, mode, cfg, async |fx, a, b| {
                let fe = &fx.main;
                open_ok(mode, fe, &a).await.close().await;
                assert_eq!(open(mode, fe, &a).await.err(), Some(refusal(mode, reason)));
                open_ok(mode, fe, &b).await.close().await;
            });
        }
    }
}

#[test]
fn destination_rate_limit_refuses_only_that_host() {
    rate_limit_refuses_only_the_second_dial_to_a(|c| &mut c.dest, "limit_dest_rate");
}

#[test]
fn cluster_connection_limit_counts_every_agent() {
    let _serial = serial();
    for engine in available_engines() {
        for mode in MODES {
            let cfg = LimitsConfig {
                cluster: Limit {
                    max_conns: 2,
                    ..Limit::default()
                },
                ..LimitsConfig::default()
            };
            with_limits(engine, mode, cfg, async |fx, a, b| {
                let fe = &fx.main;
                let one = open_ok(mode, fe, &a).await;
                let two = open_ok(mode, fe, &b).await;
                for target in [&a, &b] {
                    assert_eq!(
                        open(mode, fe, target).await.err(),
                        Some(refusal(mode, "limit_cluster_conns"))
                    );
                }
                one.close().await;
                let three = open_eventually(mode, fe, &b).await;
                two.close().await;
                three.close().await;
            });
        }
    }
}

#[test]
fn agent_rate_limit_refuses_only_that_agents_dials() {
    rate_limit_refuses_only_the_second_dial_to_a(|c| &mut c.agent, "limit_agent_rate");
}

#[test]
fn destination_connection_limit_refuses_only_that_host() {
    let _serial = serial();
    for engine in available_engines() {
        for mode in MODES {
            let cfg = LimitsConfig {
                dest: Limit {
                    max_conns: 1,
                    ..Limit::default()
                },
                ..LimitsConfig::default()
            };
            with_limits(engine, mode, cfg, async |fx, a, b| {
                let fe = &fx.main;
                let held = open_ok(mode, fe, &a).await;
                assert_eq!(
                    open(mode, fe, &a).await.err(),
                    Some(refusal(mode, "limit_dest_conns"))
                );
                let other = open_ok(mode, fe, &b).await;
                held.close().await;
                open_eventually(mode, fe, &a).await.close().await;
                other.close().await;
            });
        }
    }
}

#[test]
fn cluster_rate_limit_counts_every_agent() {
    let _serial = serial();
    for engine in available_engines() {
        for mode in MODES {
            let cfg = LimitsConfig {
                cluster: Limit {
                    rate: 0.5,
                    burst: 2,
                    ..Limit::default()
                },
                ..LimitsConfig::default()
            };
            with_limits(engine, mode, cfg, async |fx, a, b| {
                let fe = &fx.main;
                open_ok(mode, fe, &a).await.close().await;
                open_ok(mode, fe, &b).await.close().await;
                for target in [&a, &b] {
                    assert_eq!(
                        open(mode, fe, target).await.err(),
                        Some(refusal(mode, "limit_cluster_rate"))
                    );
                }
            });
        }
    }
}

/// The audit records' `peer` fields, in order.
fn audited_peers(path: &std::path::Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).ok()?;
            Some(format!("{} {}", v["result"], v["peer"]))
        })
        .collect()
}

/// The per-frontend limits count each client certificate's CN apart: the
/// second connection of one identity is refused while another identity's
/// dial goes through; the audit log names both by their CN.
#[test]
fn frontend_limits_are_per_client_certificate() {
    let _serial = serial();
    for engine in available_engines() {
        for mode in MODES {
            let conns = LimitsConfig {
                frontend: Limit {
                    max_conns: 1,
                    ..Limit::default()
                },
                ..LimitsConfig::default()
            };
            with_limits_on(engine, mode, Transport::Tls, conns, async |fe, a, b| {
                let other = fe.other.as_ref().unwrap();
                let held = open_ok(mode, &fe.main, &a).await;
                for target in [&a, &b] {
                    assert_eq!(
                        open(mode, &fe.main, target).await.err(),
                        Some(refusal(mode, "limit_frontend_conns"))
                    );
                }
                let theirs = open_ok(mode, other, &a).await;
                assert_eq!(
                    open(mode, other, &b).await.err(),
                    Some(refusal(mode, "limit_frontend_conns"))
                );
                held.close().await;
                open_eventually(mode, &fe.main, &b).await.close().await;
                theirs.close().await;
                // Both identities by their CN in the audit log (written
                // off the packet path: wait for the last records).
                let cn = |result: &str, cn: &str| {
                    audited_peers(&fe.audit)
                        .iter()
                        .filter(|p| p.starts_with(&format!("\"{result}\" \"addr=127.0.0.1:")))
                        .filter(|p| p.ends_with(&format!(" cn={cn}\"")))
                        .count()
                };
                let complete = || {
                    // (`open_eventually` may be refused a few times more.)
                    cn("refused", "kube-apiserver") >= 2
                        && cn("refused", "konnectivity-agent") == 1
                        && cn("closed", "kube-apiserver") == 2
                        && cn("closed", "konnectivity-agent") == 1
                };
                assert!(
                    wait_until_async(complete).await,
                    "{:?}",
                    audited_peers(&fe.audit)
                );
            });
            let rate = LimitsConfig {
                frontend: Limit {
                    rate: 0.5,
                    burst: 1,
                    ..Limit::default()
                },
                ..LimitsConfig::default()
            };
            with_limits_on(engine, mode, Transport::Tls, rate, async |fe, a, b| {
                let other = fe.other.as_ref().unwrap();
                open_ok(mode, &fe.main, &a).await.close().await;
                assert_eq!(
                    open(mode, &fe.main, &b).await.err(),
                    Some(refusal(mode, "limit_frontend_rate"))
                );
                open_ok(mode, other, &b).await.close().await;
                assert_eq!(
                    open(mode, other, &a).await.err(),
                    Some(refusal(mode, "limit_frontend_rate"))
                );
            });
        }
    }
}

/// Over the Unix socket a frontend is its user: every connection of the
/// test's uid shares one budget.
#[test]
fn frontend_limits_over_the_unix_socket_count_the_uid() {
    let _serial = serial();
    for engine in available_engines() {
        for mode in MODES {
            let cfg = LimitsConfig {
                frontend: Limit {
                    max_conns: 2,
                    ..Limit::default()
                },
                ..LimitsConfig::default()
            };
            with_limits(engine, mode, cfg, async |fx, a, b| {
                let fe = &fx.main;
                let one = open_ok(mode, fe, &a).await;
                let two = open_ok(mode, fe, &b).await;
                assert_eq!(
                    open(mode, fe, &a).await.err(),
                    Some(refusal(mode, "limit_frontend_conns"))
                );
                one.close().await;
                open_eventually(mode, fe, &a).await.close().await;
                two.close().await;
            });
        }
    }
}

/// Bytes the stalled download asks for: more than the kernel's socket
/// buffers on loopback, so the server's queue for the frontend fills.
const DOWNLOAD: u64 = 48 << 20;

#[test]
fn overload_refuses_new_dials_while_established_ones_drain_then_recovers() {
    let _serial = serial();
    for engine in available_engines() {
        for mode in MODES {
            let what = format!("overload, {mode:?} on {engine}");
            let before = Baseline::take();
            let dir = TempDir::new("overload");
            let source = Destination::source().unwrap();
            let echo = Destination::echo().unwrap();
            // A stalled flow queues up to its PAUSE mark (half of
            // --conn-queue-size: 512 KiB) at the server, well above this;
            // an idle server has no buffer lent between reads.
            let cfg = LimitsConfig {
                overload_high: 256 << 10,
                overload_low: 128 << 10,
                ..LimitsConfig::default()
            };
            let limits = Arc::new(Limits::new(cfg, konn_core::io::clock::now()));
            let seen = limits.clone();
            let mut server = ServerSpec {
                tweak: Some(Box::new(move |s| s.router.limits = Some(limits))),
                ..ServerSpec::new(engine, mode, Transport::Unix, &dir)
            }
            .start();
            let mut agent = server.agent("a", "", None);
            wait_backends(&server, 1);
            let idle = Baseline::take();
            let fe = server.frontend();
            let (src, dst) = (source.addr().to_string(), echo.addr().to_string());
            block_on(engine, async {
                open_ok(mode, &fe, &dst).await.close().await;
                // A download nobody reads yet.
                let mut head = DOWNLOAD.to_be_bytes().to_vec();
                head.extend_from_slice(&7u64.to_be_bytes());
                let mut stalled = open(mode, &fe, &src).await.unwrap();
                match &mut stalled {
                    Held::Grpc(_, t) => t.write(&head).await.unwrap(),
                    Held::Connect(c) => c.write(&head).await.unwrap(),
                }
                // New dials are refused once the queued data passes the
                // watermark (seen at the pools' next maintenance pass).
                let deadline = konn_core::io::clock::now() + T;
                loop {
                    match open(mode, &fe, &dst).await {
                        Err(e) => {
                            assert_eq!(e, refusal(mode, "overload"), "{what}");
                            break;
                        }
                        Ok(h) => h.close().await,
                    }
                    assert!(
                        konn_core::io::clock::now() < deadline,
                        "{what}: never overloaded"
                    );
                    monoio::time::sleep(std::time::Duration::from_millis(20)).await;
                }
                assert!(seen.overloaded());
                // The established download goes on, to its last byte.
                let mut got = 0u64;
                let mut check = konn_testkit::bulk::Pattern::new(7);
                while got < DOWNLOAD {
                    let chunk = match &mut stalled {
                        Held::Grpc(_, t) => t.read(T).await.unwrap(),
                        Held::Connect(c) => c.read(T).await.unwrap(),
                    }
                    .unwrap_or_else(|| panic!("{what}: ended after {got} bytes"));
                    let mut expect = vec![0u8; chunk.len()];
                    check.fill(&mut expect);
                    assert!(chunk[..] == expect[..], "{what}: corrupt at {got}");
                    got += chunk.len() as u64;
                }
                stalled.close().await;
                // Drained: dials are admitted again.
                open_eventually(mode, &fe, &dst).await.close().await;
                assert!(!seen.overloaded());
            })
            .unwrap();
            let scrape = server.h().metrics().registry().render_to_string();
            assert!(refusals(&scrape, "overload") >= 1.0, "{what}");
            assert_idle(&server, &[&agent], idle, &what);
            agent.stop();
            server.stop();
            drop((dir, source, echo));
            assert_released(before, &format!("{what}, stopped"));
        }
    }
}

#[test]
fn agent_allow_list_refuses_destinations_outside_it() {
    let _serial = serial();
    for engine in available_engines() {
        for mode in MODES {
            let what = format!("allow-list, {mode:?} on {engine}");
            let before = Baseline::take();
            let dir = TempDir::new("allowlist");
            let audit = dir.path("audit.log");
            let inside = Destination::echo_on(A).unwrap();
            let outside = Destination::echo().unwrap();
            let mut server = ServerSpec {
                tweak: Some(audit_to(audit.clone())),
                ..ServerSpec::new(engine, mode, Transport::Unix, &dir)
            }
            .start();
            let allowed =
                konn_agent::allow::AllowList::parse(&["127.0.0.2/32".to_owned()]).unwrap();
            let mut agent = server.agent_with("a", "", None, |s| {
                s.connect.settings.allowed = Arc::new(allowed);
            });
            wait_backends(&server, 1);
            let idle = Baseline::take();
            let fe = server.frontend();
            let port = outside.addr().port();
            block_on(engine, async {
                for target in [outside.addr().to_string(), format!("localhost:{port}")] {
                    let text = format!(
                        "dial tcp {target}: konn: destination not allowed by --allowed-destination-cidrs"
                    );
                    let want = match mode {
                        Mode::Grpc => (0, text),
                        Mode::HttpConnect => (
                            502,
                            format!(
                                "HTTP/1.1 502 Bad Gateway\r\nConnection: close\r\nContent-Type: text/plain; charset=utf-8\r\n\r\n{text}"
                            ),
                        ),
                    };
                    assert_eq!(open(mode, &fe, &target).await.err(), Some(want), "{what}");
                }
                open_ok(mode, &fe, &inside.addr().to_string())
                    .await
                    .close()
                    .await;
            })
            .unwrap();
            assert_eq!(
                outside.connections(),
                0,
                "{what}: the refused dial connected"
            );
            let scrape = agent.h().metrics().registry().render_to_string();
            assert_eq!(
                metric(
                    &scrape,
                    "konn_agent_dial_refusals_total{reason=\"destination_not_allowed\"}"
                ),
                Some(2.0),
                "{what}"
            );
            assert_idle(&server, &[&agent], idle, &what);
            // The control plane's audit log says the agent refused them.
            assert_audited(&server, &audit, &what);
            assert_eq!(
                audited_outcomes(&audit),
                [
                    "closed/",
                    "refused/destination_not_allowed",
                    "refused/destination_not_allowed"
                ],
                "{what}"
            );
            agent.stop();
            server.stop();
            drop((dir, inside, outside));
            assert_released(before, &format!("{what}, stopped"));
        }
    }
}
