//! Acceptance: the lifecycle around the tunnels, in both frontend modes
//! and under each io engine.
//!
//! - A server that restarts (same agent port, same frontend socket) gets
//!   its agents back without anyone's help, and proxies again; the
//!   connection open across the restart ends on both sides.
//! - DRAIN: once an agent announces it, new dials go to the other agents
//!   while its own connections keep flowing; with only draining agents
//!   left, the server uses one anyway (upstream's rule).
//!
//! Each scenario ends with the leak check of `e2e_common::assert_idle` and
//! one audit record per connection (a server's stop writes the records of
//! the connections it cuts).

mod e2e_common;

use std::time::Duration;

use e2e_common::*;
use konn_core::io::runtime::{Engine, available_engines, block_on};
use konn_server::settings::Mode;
use konn_testkit::dest::Destination;

const SETUPS: [(Mode, Transport); 2] = [
    (Mode::Grpc, Transport::Unix),
    (Mode::HttpConnect, Transport::Tls),
];

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

    /// True once the connection is over (whatever the way), false if it
    /// is still open after `limit`.
    async fn ends_within(&mut self, limit: Duration) -> bool {
        match self {
            Self::Grpc(_, t) => !matches!(
                t.read(limit).await,
                Err(konn_testkit::Error::Timeout(_)) | Ok(Some(_))
            ),
            Self::Connect(t) => !matches!(
                t.read(limit).await,
                Err(konn_testkit::Error::Timeout(_)) | Ok(Some(_))
            ),
        }
    }

    async fn close(self) {
        match self {
            Self::Grpc(fe, t) => {
                let _ = t.close(T).await;
                fe.close().await;
            }
            Self::Connect(t) => t.close().await,
        }
    }
}

/// The server stops (as its process would) and a new one starts on the
/// same agent port and frontend socket: both agents reconnect by
/// themselves and the new server proxies through them; the connection
/// that was open ends at the frontend, and the agents let its
/// destination go.
#[test]
fn agents_reconnect_after_a_server_restart() {
    let _serial = serial();
    let pki = Pki::new();
    let echo = Destination::echo().unwrap();
    let echo = echo.addr().to_string();
    for engine in available_engines() {
        for (mode, transport) in SETUPS {
            let what = format!("{mode:?} over {transport:?} on {engine}");
            let before = Baseline::take();
            let dir = TempDir::new("restart");
            let (log1, log2) = (dir.path("audit-1.log"), dir.path("audit-2.log"));
            let spec = |agent_addr, log: &std::path::Path| ServerSpec {
                pki: Some(&pki),
                agent_addr,
                tweak: Some(audit_to(log.to_owned())),
                ..ServerSpec::new(engine, mode, transport, &dir)
            };
            let mut server = spec(None, &log1).start();
            let agent_addr = server.agent_addr();
            let mut agents = [
                server.agent("agent-r1", "", None),
                server.agent("agent-r2", "", None),
            ];
            wait_backends(&server, 2);
            let idle = Baseline::take();
            let frontend = server.frontend();
            // (The frontend lives on one runtime: its connection is a task.)
            block_on(engine, async {
                let mut open = Flow::open(mode, &frontend, &echo).await;
                open.echo(b"before the restart").await;
                server.stop();
                assert!(
                    wait_until(T, || agents.iter().all(|a| !a.h().is_ready())),
                    "{what}: the agents noticed the server going away"
                );
                assert!(
                    open.ends_within(T).await,
                    "{what}: the connection open across the restart ended"
                );
                open.close().await;
            })
            .unwrap();

            // The stop wrote the record of the connection it cut.
            assert_eq!(audited_outcomes(&log1).len(), 1, "{what}");
            let server = spec(Some(agent_addr), &log2).start();
            assert_eq!(server.agent_addr(), agent_addr);
            wait_backends(&server, 2);
            assert!(
                wait_until(T, || agents.iter().all(|a| a.h().is_ready())),
                "{what}: the agents are ready again"
            );
            let frontend = server.frontend();
            block_on(engine, async {
                for _ in 0..4 {
                    let mut f = Flow::open(mode, &frontend, &echo).await;
                    f.echo(b"after the restart").await;
                    f.close().await;
                }
            })
            .unwrap();
            assert_idle(&server, &agents.iter().collect::<Vec<_>>(), idle, &what);
            assert_audited(&server, &log2, &what);
            assert_eq!(audited_outcomes(&log2), ["closed/"; 4], "{what}");
            let mut server = server;
            for a in &mut agents {
                a.stop();
            }
            server.stop();
            drop(dir);
            assert_released(before, &format!("{what}, stopped"));
        }
    }
}

/// DRAIN packets the server has received.
fn drains_received(server: &TestServer) -> usize {
    server
        .h()
        .metrics()
        .registry()
        .render_to_string()
        .lines()
        .filter(|l| {
            l.starts_with("konnectivity_network_proxy_server_stream_packets_total{")
                && l.contains("\"DRAIN\"")
                && l.contains("\"from_agent\"")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as usize
}

/// New connections after the drain (all must go to the other agent).
const AFTER_DRAIN: usize = 20;

/// Two agents, one server worker (so the choice between agents is purely
/// random). Before DRAIN both agents serve dials; after agent A's DRAIN
/// reached the server every new dial goes to B while A's connection keeps
/// flowing; once B is gone, A (draining) serves again.
#[test]
fn drain_moves_new_dials_away_and_keeps_what_is_open() {
    let _serial = serial();
    let pki = Pki::new();
    let echo = Destination::echo().unwrap();
    let echo = echo.addr().to_string();
    for engine in available_engines() {
        for (mode, transport) in SETUPS {
            let what = format!("{mode:?} over {transport:?} on {engine}");
            let before = Baseline::take();
            let dir = TempDir::new("drain");
            let audit = dir.path("audit.log");
            let mut server = ServerSpec {
                pki: Some(&pki),
                workers: 1,
                tweak: Some(audit_to(audit.clone())),
                ..ServerSpec::new(engine, mode, transport, &dir)
            }
            .start();
            let mut a = server.agent("agent-a", "", None);
            let mut b = server.agent("agent-b", "", None);
            wait_backends(&server, 2);
            let idle = Baseline::take();
            let frontend = server.frontend();
            drain_scenario(engine, mode, &what, &server, &frontend, &a, &mut b, &echo);
            assert_idle(&server, &[&a], idle, &what);
            assert_audited(&server, &audit, &what);
            a.stop();
            server.stop();
            drop(dir);
            assert_released(before, &format!("{what}, stopped"));
        }
    }
}

#[allow(clippy::too_many_arguments)] // one scenario's cast
fn drain_scenario(
    engine: Engine,
    mode: Mode,
    what: &str,
    server: &TestServer,
    frontend: &FrontendAddr,
    a: &Agent,
    b: &mut Agent,
    echo: &str,
) {
    // Which agent serves each new connection, from the agents' counts.
    let b_ref: &Agent = b;
    let endpoints = || (a.endpoints(), b_ref.endpoints());
    block_on(engine, async {
        // Before: both agents are chosen; keep one connection through A.
        let mut kept = None;
        let mut others = Vec::new();
        let mut seen_b = false;
        for _ in 0..60 {
            let (a0, b0) = endpoints();
            let f = Flow::open(mode, frontend, echo).await;
            assert!(
                wait_until_async(|| endpoints().0 + endpoints().1 == a0 + b0 + 1).await,
                "{what}: an agent holds the new connection"
            );
            if endpoints().0 > a0 && kept.is_none() {
                kept = Some(f);
            } else {
                seen_b |= endpoints().1 > b0;
                others.push(f);
            }
            if kept.is_some() && seen_b {
                break;
            }
        }
        assert!(
            kept.is_some() && seen_b,
            "{what}: the server chose only one agent before DRAIN"
        );
        let mut kept = kept.unwrap();
        for f in others {
            f.close().await;
        }
        assert!(
            wait_until_async(|| endpoints() == (1, 0)).await,
            "{what}: {:?}",
            endpoints()
        );

        a.h().drain();
        assert!(
            wait_until_async(|| drains_received(server) >= 1).await,
            "{what}: the server got A's DRAIN"
        );
        // After: every new connection goes to B, A's keeps flowing.
        let mut after = Vec::new();
        for _ in 0..AFTER_DRAIN {
            after.push(Flow::open(mode, frontend, echo).await);
        }
        assert!(
            wait_until_async(|| endpoints() == (1, AFTER_DRAIN as i64)).await,
            "{what}: (A, B) endpoints {:?} after DRAIN",
            endpoints()
        );
        kept.echo(b"still flowing after DRAIN").await;
        for mut f in after {
            f.echo(b"through B").await;
            f.close().await;
        }
        kept.close().await;
    })
    .unwrap();
    assert!(
        a.h().status().draining && a.h().is_ready(),
        "{what}: A drains, still ready"
    );

    // Only draining agents left: the server still uses one.
    b.stop();
    wait_backends(server, 1);
    block_on(engine, async {
        let mut f = Flow::open(mode, frontend, echo).await;
        f.echo(b"through A, draining").await;
        assert_eq!(a.endpoints(), 1, "{what}");
        f.close().await;
    })
    .unwrap();
}
