//! Cross-core correctness with `--workers=2` (docs/design/cross-core.md):
//! a frontend connection whose dials go to agents on *both* workers — what
//! konnectivity-client's reusable tunnel (several Proxy streams on one
//! HTTP/2 connection) does — is served where it is and its flows through
//! the other worker's tunnel are relayed through the mesh. Every dial
//! succeeds, bytes arrive intact both ways, a full inbox delays messages
//! but loses none, and agents that come and go while dials are in flight
//! leave every table back at its baseline. Every dial leaves one audit
//! record (with the bytes the destination counted, where no agent went
//! mid-transfer). Under each io engine.
//!
//! Which worker holds an agent's tunnel is the kernel's choice
//! (`SO_REUSEPORT` hashing); the tests start agents until both workers
//! have one (read from `/debug/backends`), bounded.

mod e2e_common;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use e2e_common::*;
use konn_core::io::runtime::{available_engines, block_on, join};
use konn_protocol::server::backends::Strategy;
use konn_server::settings::Mode;
use konn_testkit::Pattern;
use konn_testkit::dest::Destination;
use konn_testkit::procs::http_get;

/// The most agents started to cover both workers (the chance that this
/// many all land on one worker is 2⁻³¹).
const MAX_AGENTS: usize = 32;

/// An agent announcing `ipv4=<ip>` and an echo server on that address:
/// with the `destHost` strategy a dial to the echo server goes through
/// exactly that agent.
struct Routed {
    agent: Agent,
    echo: Destination,
    worker: usize,
}

fn ip(i: usize) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 1, 10 + i as u8))
}

/// `worker` of each agent in the admin port's `/debug/backends`.
fn workers_of(admin: SocketAddr) -> Vec<(String, usize)> {
    let (status, body) = http_get(admin, "/debug/backends").unwrap();
    assert_eq!(status, 200, "{body}");
    body.split("{\"id\":\"")
        .skip(1)
        .map(|a| {
            let id = a[..a.find('"').unwrap()].to_owned();
            let w = &a[a.find("\"worker\":").unwrap() + 9..];
            let w = w[..w.find(',').unwrap()].parse().unwrap();
            (id, w)
        })
        .collect()
}

/// A server with two workers (`inbox` messages per worker inbox) and
/// routed agents until both workers hold one; returns the agents, one per
/// worker first.
fn setup(
    engine: konn_core::io::runtime::Engine,
    dir: &TempDir,
    inbox: usize,
) -> (TestServer, Vec<Routed>) {
    let log = audit_to(dir.path("audit.log"));
    let server = ServerSpec {
        strategies: vec![Strategy::DestHost],
        tweak: Some(Box::new(move |s| {
            s.runtime.inbox_capacity = inbox;
            s.admin_addr = Some("127.0.0.1:0".parse().unwrap());
            log(s);
        })),
        ..ServerSpec::new(engine, Mode::Grpc, Transport::Unix, dir)
    }
    .start();
    let admin = server.h().admin_addr().unwrap();
    let mut routed: Vec<Routed> = Vec::new();
    for i in 0..MAX_AGENTS {
        let agent = server.agent(&format!("a{i:02}"), &format!("ipv4={}", ip(i)), None);
        wait_backends(&server, i + 1);
        let echo = Destination::echo_on(ip(i)).unwrap();
        let worker = workers_of(admin)
            .into_iter()
            .find(|(id, _)| *id == format!("a{i:02}"))
            .unwrap()
            .1;
        routed.push(Routed {
            agent,
            echo,
            worker,
        });
        let on = |w| routed.iter().any(|r| r.worker == w);
        if on(0) && on(1) {
            // One agent per worker first.
            let first = routed.iter().position(|r| r.worker != routed[0].worker);
            routed.swap(1, first.unwrap());
            return (server, routed);
        }
    }
    panic!("{MAX_AGENTS} agents all landed on one worker");
}

fn pattern(seed: u64, n: usize) -> Vec<u8> {
    let mut v = vec![0u8; n];
    Pattern::new(seed).fill(&mut v);
    v
}

/// One frontend connection, many streams at once to the agents of both
/// workers: `rounds` × (one stream per agent, `size` bytes echoed on each,
/// writes and reads concurrent).
async fn multi_stream(frontend: &FrontendAddr, routed: &[Routed], rounds: usize, size: usize) {
    let fe = frontend.grpc().await.unwrap();
    for round in 0..rounds {
        let mut tunnels = Vec::new();
        for r in routed {
            let t = fe
                .dial(&r.echo.addr().to_string(), T)
                .await
                .unwrap_or_else(|e| panic!("round {round}: dial via worker {}: {e}", r.worker));
            tunnels.push(t);
        }
        for (i, t) in tunnels.iter().enumerate() {
            let data = pattern((round * 100 + i) as u64, size);
            let (w, got) = within("echo", join(t.write(&data), t.read_exact(size, T))).await;
            w.unwrap();
            assert!(
                got.unwrap() == data,
                "round {round}, stream {i}: bytes differ"
            );
        }
        for t in tunnels {
            t.close(T).await.unwrap();
        }
    }
    fe.close().await;
}

fn scenario(inbox: usize, rounds: usize, size: usize) {
    for engine in available_engines() {
        let what = format!("{engine}, inbox {inbox}");
        let before = Baseline::take();
        let dir = TempDir::new("xcore");
        let (mut server, mut routed) = setup(engine, &dir, inbox);
        let idle = Baseline::take();
        konn_testkit::dest::take_transfers();
        block_on(
            engine,
            multi_stream(&server.frontend(), &routed, rounds, size),
        )
        .unwrap();
        let agents: Vec<&Agent> = routed.iter().map(|r| &r.agent).collect();
        assert_idle(&server, &agents, idle, &what);
        // Relayed flows are accounted on their frontend's worker.
        assert_audited_bytes(&server, &dir.path("audit.log"), &what);
        for r in &mut routed {
            r.agent.stop();
        }
        server.stop();
        drop(routed);
        drop(dir);
        assert_released(before, &format!("{what}, stopped"));
    }
}

/// The reproduction of the bug this fixes: before, every dial whose agent
/// was on the other worker failed with "No agent available".
#[test]
fn a_multi_stream_frontend_reaches_agents_on_every_worker() {
    let _serial = serial();
    scenario(4096, 20, 64 << 10);
}

/// Flow control holds across the relay: megabytes each way on every
/// stream, the sender held back by the receiver, nothing lost.
#[test]
fn relayed_flows_carry_bulk_both_ways() {
    let _serial = serial();
    scenario(4096, 2, 6 << 20);
}

/// An inbox of one message: almost every cross-core message waits in the
/// sender's queue; none is lost or reordered.
#[test]
fn a_full_inbox_delays_but_loses_nothing() {
    let _serial = serial();
    scenario(1, 5, 256 << 10);
}

/// Agents join and leave while one multi-stream frontend keeps dialling
/// all of them: every dial ends (succeeds, or fails with a dial error)
/// within the test's bound, rounds without churn lose no dial, and nothing
/// is left behind.
#[test]
fn agents_come_and_go_while_dials_are_in_flight() {
    let _serial = serial();
    for engine in available_engines() {
        let what = format!("{engine}, churn");
        let before = Baseline::take();
        let dir = TempDir::new("xcore-churn");
        let (mut server, mut routed) = setup(engine, &dir, 64);
        let idle = Baseline::take();
        let frontend = server.frontend();
        let targets: Vec<String> = routed.iter().map(|r| r.echo.addr().to_string()).collect();
        let (mut ok, mut failed) = (0, 0);
        for round in 0..6 {
            // Half the rounds with the first two agents reconnecting under
            // the dials: restart them from the main thread while the
            // frontend works on its own runtime thread.
            let dials = std::thread::scope(|s| {
                let fe_thread = s.spawn(|| {
                    block_on(engine, async {
                        let fe = frontend.grpc().await.unwrap();
                        let mut res = (0, 0);
                        for n in 0..40 {
                            let target = &targets[n % targets.len()];
                            match fe.dial(target, T).await {
                                Ok(t) => {
                                    let data = pattern(n as u64, 4096);
                                    // The agent may go mid-transfer: the
                                    // stream then ends, which is fine.
                                    let (w, got) =
                                        join(t.write(&data), t.read_exact(4096, T)).await;
                                    if w.is_ok() && got.is_ok_and(|g| g == data) {
                                        res.0 += 1;
                                    } else {
                                        res.1 += 1;
                                    }
                                    let _ = t.close(T).await;
                                }
                                Err(_) => res.1 += 1,
                            }
                        }
                        fe.close().await;
                        res
                    })
                    .unwrap()
                });
                if round % 2 == 1 {
                    for r in routed.iter_mut().take(2) {
                        r.agent.stop();
                        let id = r.agent_id();
                        r.agent = server.agent(&id, &format!("ipv4={}", r.echo.addr().ip()), None);
                    }
                }
                fe_thread.join().unwrap()
            });
            if round % 2 == 0 {
                assert_eq!(
                    dials.1, 0,
                    "{what}: round {round} had no churn, yet dials failed"
                );
            }
            ok += dials.0;
            failed += dials.1;
            wait_backends(&server, routed.len());
        }
        assert!(ok > 0, "{what}: no dial succeeded ({failed} failed)");
        let agents: Vec<&Agent> = routed.iter().map(|r| &r.agent).collect();
        assert_idle(&server, &agents, idle, &what);
        // One record per dial, whatever became of it (agents that go
        // mid-transfer cut their flows: no byte comparison here).
        assert_audited(&server, &dir.path("audit.log"), &what);
        for r in &mut routed {
            r.agent.stop();
        }
        server.stop();
        drop(routed);
        drop(dir);
        assert_released(before, &format!("{what}, stopped"));
    }
}

impl Routed {
    fn agent_id(&self) -> String {
        let i = match self.echo.addr().ip() {
            IpAddr::V4(v4) => usize::from(v4.octets()[3]) - 10,
            IpAddr::V6(_) => unreachable!(),
        };
        format!("a{i:02}")
    }
}
