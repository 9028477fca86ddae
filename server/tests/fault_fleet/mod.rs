//! Rows of the fault matrix about fleets rather than single connections:
//! a reconnect storm of many agents when their server restarts (row 7) and
//! a rolling update that grows the server count while old servers still
//! report the stale one (row 8), and ten thousand concurrent streams (row
//! 13). Both run real agent processes of each
//! implementation behind konn-testkit's load balancer, which also counts the
//! tunnel connections they make.

use std::rc::Rc;

use konn_testkit::relay::LoadBalancer;

use crate::fault_common::rss_of;

use super::*;

/// Agents of the reconnect storm: `KONN_STORM_AGENTS` (default 100; the
/// reference's full form is 500).
fn storm_agents() -> usize {
    std::env::var("KONN_STORM_AGENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100)
}

/// The most connection attempts one agent makes while its server is down
/// for `down`: upstream's backoff (100 ms, ×1.5, capped at [`CAP`], each
/// step jittered by up to +10 %) gives one attempt per step, counted here
/// with no jitter (the most steps), plus the first immediate one and the
/// one that succeeds.
fn max_attempts(down: Duration) -> usize {
    let (mut step, mut t, mut n) = (Duration::from_millis(100), Duration::ZERO, 2);
    while t < down {
        t += step;
        n += 1;
        step = (step * 3 / 2).min(CAP);
    }
    n
}

#[test]
fn row07_reconnect_storm() {
    let n = storm_agents();
    run_row(
        "07",
        &format!("Reconnect storm ({n} agents; 500 with KONN_STORM_AGENTS=500)"),
        &format!(
            "{n} agent processes (backoff 100 ms ×1.5 capped at 1 s, 10 % jitter) hold tunnels to one server behind a load balancer; SIGKILL the server and start it again 2 s later: the tunnel connections the agents make meanwhile stay within the backoff's envelope ({} per agent at most), and every agent is back within the cap + jitter + 3 s + 4 ms per agent of the restart (one connection each); a dial then echoes byte-exact",
            max_attempts(Duration::from_secs(2))
        ),
        |imp, dir, pki| {
            let echo = Echo::start();
            let mut server = Server::start(imp, dir, pki, 0, &[]);
            let lb = LoadBalancer::start(vec![at(server.agent_port)]).map_err(|e| e.to_string())?;
            let mut agents = Vec::with_capacity(n);
            for i in 0..n {
                agents.push(Agent::start(
                    imp,
                    dir,
                    pki,
                    &format!("agent-{i}"),
                    lb.addr().port(),
                ));
            }
            check(
                wait_until(Duration::from_secs(120), || server.ready() >= n as f64),
                || format!("{} of {n} agents connected", server.ready()),
            )?;
            let before = lb.accepted();
            server.proc.kill();
            let down = Duration::from_secs(2);
            let killed = Instant::now();
            // The fault's length, not synchronisation.
            std::thread::sleep(down);
            let server = Server::start(imp, dir, pki, server.agent_port, &[]);
            // The cap and its jitter, 3 s, and 4 ms of handshake work per
            // agent on the 2-vCPU reference machine (both fleets at once).
            let bound =
                CAP + CAP / 10 + Duration::from_secs(3) + Duration::from_millis(4) * n as u32;
            let back = measure(bound, "every agent back", || server.ready() >= n as f64)
                .map_err(|e| format!("{e}: {} of {n}", server.ready()))?;
            let attempts = lb.accepted() - before;
            let envelope = n * max_attempts(killed.elapsed());
            check(attempts <= envelope, || {
                format!("{attempts} tunnel connections, more than the envelope of {envelope}")
            })?;
            fresh_echo(&server, echo.addr, 7)?;
            for a in &mut agents {
                a.proc.kill();
            }
            Ok(Measured {
                recovery: Some(back),
                note: format!(
                    "{attempts} tunnel connections by {n} agents during the outage and the return ({:.1} per agent)",
                    attempts as f64 / n as f64
                ),
                ..Measured::default()
            })
        },
    );
}

#[test]
fn row08_ha_count_skew() {
    run_row(
        "08",
        "HA count skew (rolling 3 → 6 servers)",
        "Two agents (default sync, not --sync-forever) behind a load balancer that picks a server at random (as a Service does) hold tunnels to 3 servers started with --server-count=3. The roll: 3 new servers with --server-count=6 join the balancer while the old 3 still say 3, then each old server is replaced, one at a time, by one saying 6. Within 20 s of the roll's end every one of the 6 servers has both agents ready and a dial through each echoes byte-exact (no \"No agent available\")",
        |imp, dir, pki| {
            let echo = Echo::start();
            let start = |id: usize, count: usize| {
                Server::start(
                    imp,
                    dir,
                    pki,
                    0,
                    &[
                        &format!("--server-id=s{id}"),
                        &format!("--server-count={count}"),
                    ],
                )
            };
            let mut servers: Vec<Server> = (1..=3).map(|i| start(i, 3)).collect();
            let backends = |s: &[Server]| s.iter().map(|s| at(s.agent_port)).collect::<Vec<_>>();
            let lb =
                LoadBalancer::start_random(backends(&servers), 8).map_err(|e| e.to_string())?;
            let _agents: Vec<Agent> = ["agent-a", "agent-b"]
                .iter()
                .map(|id| {
                    Agent::start_with(
                        imp,
                        dir,
                        pki,
                        id,
                        lb.addr().port(),
                        &["--sync-forever=false"],
                    )
                })
                .collect();
            let all_ready = |s: &[Server]| s.iter().all(|s| s.ready() >= 2.0);
            check(wait_until(T, || all_ready(&servers)), || {
                "the agents did not reach the first 3 servers".to_owned()
            })?;

            let roll = Instant::now();
            let accepted = lb.accepted();
            servers.extend((4..=6).map(|i| start(i, 6)));
            lb.set_backends(backends(&servers));
            for i in 0..3 {
                let old = std::mem::replace(&mut servers[i], start(i + 1, 6));
                lb.set_backends(backends(&servers));
                drop(old);
            }
            let rolled = Instant::now();
            let converged = measure(
                Duration::from_secs(20),
                "both agents on all 6 servers",
                || all_ready(&servers),
            )
            .map_err(|e| {
                let ready: Vec<f64> = servers.iter().map(Server::ready).collect();
                format!("{e}: ready agents per server {ready:?}")
            })?;
            let attempts = lb.accepted() - accepted;
            for (i, s) in servers.iter().enumerate() {
                fresh_echo(s, echo.addr, 80 + i as u64)
                    .map_err(|e| format!("server s{}: {e}", i + 1))?;
            }
            Ok(Measured {
                recovery: Some(converged),
                note: format!(
                    "recovery: from the roll's end (it took {:.1} s) to both agents on all 6; {attempts} tunnel connections through the balancer meanwhile",
                    (rolled - roll).as_secs_f64()
                ),
                ..Measured::default()
            })
        },
    );
}

/// Streams of row 13: `KONN_STREAMS` (default 2000; the reference's full
/// form is 10000), half HTTP CONNECT, half gRPC streams over
/// [`GRPC_CONNS`] HTTP/2 connections.
fn row13_streams() -> usize {
    std::env::var("KONN_STREAMS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000)
}

/// HTTP/2 connections the gRPC half shares (konnectivity-client's
/// `ReusableTunnel` multiplexes many dials over one).
const GRPC_CONNS: usize = 10;

/// Connections being opened at once (a Unix socket's accept backlog is
/// finite; a non-blocking connect past it fails with EAGAIN).
const OPENING: usize = 64;

/// What the streams of row 13 saw.
#[derive(Default)]
struct StreamStats {
    /// Round trips of 1 KiB that came back byte-exact.
    ok: std::cell::Cell<u64>,
    /// Dials, round trips or comparisons that failed, with the first why.
    errors: std::cell::Cell<u64>,
    first_error: std::cell::RefCell<Option<String>>,
    /// Round-trip times, µs.
    rtt_us: std::cell::RefCell<Vec<u64>>,
    /// Streams open at once.
    open: std::cell::Cell<usize>,
}

impl StreamStats {
    fn fail(&self, e: impl std::fmt::Display) {
        self.errors.set(self.errors.get() + 1);
        self.first_error
            .borrow_mut()
            .get_or_insert_with(|| e.to_string());
    }
}

/// A monoio echo destination: one task per connection.
fn echo_dest(stop: Arc<AtomicBool>) -> (SocketAddr, JoinHandle<()>) {
    let (tx, rx) = std::sync::mpsc::channel();
    let t = std::thread::spawn(move || {
        let _ =
            konn_core::io::runtime::block_on(konn_core::io::runtime::Engine::Epoll, async move {
                use monoio::io::{AsyncReadRent, AsyncWriteRentExt};
                let l = monoio::net::TcpListener::bind("127.0.0.1:0").unwrap();
                tx.send(l.local_addr().unwrap()).unwrap();
                while !stop.load(Ordering::Acquire) {
                    let accepted =
                        monoio::time::timeout(Duration::from_millis(200), l.accept()).await;
                    let Ok(Ok((mut s, _))) = accepted else {
                        continue;
                    };
                    monoio::spawn(async move {
                        // monoio reads into the spare capacity and sets the length.
                        let mut buf = Vec::with_capacity(4096);
                        loop {
                            let (r, b) = s.read(buf).await;
                            if !matches!(r, Ok(n) if n > 0) {
                                return;
                            }
                            let (w, mut b) = s.write_all(b).await;
                            if w.is_err() {
                                return;
                            }
                            b.clear();
                            buf = b;
                        }
                    });
                }
            });
    });
    (rx.recv().unwrap(), t)
}

/// Runs row 13's load against a CONNECT server and a gRPC server for
/// `secs` after every stream is open: `n` streams, each sending 1 KiB every
/// second and reading it back.
fn streams_load(
    connect_uds: &Path,
    grpc_uds: &Path,
    dest: SocketAddr,
    n: usize,
    secs: Duration,
) -> StreamStatsOut {
    use konn_testkit::connect::ConnectTunnel;
    use konn_testkit::frontend::GrpcFrontend;
    let (connect_uds, grpc_uds) = (connect_uds.to_owned(), grpc_uds.to_owned());
    let run = async move {
        let stats = Rc::new(StreamStats::default());
        let opening = Rc::new(std::cell::Cell::new(0usize));
        let target = dest.to_string();
        let started = monoio::time::Instant::now();
        // Everyone opens, then all send for `secs` from `go`.
        let ramp = Duration::from_secs(5) + Duration::from_millis(2) * n as u32;
        let go = started + ramp;
        let end = go + secs;
        let mut frontends = Vec::new();
        for _ in 0..GRPC_CONNS {
            match GrpcFrontend::connect_unix(&grpc_uds).await {
                Ok(f) => frontends.push(Rc::new(f)),
                Err(e) => stats.fail(format!("gRPC connection: {e}")),
            }
        }
        let mut tasks = Vec::new();
        for i in 0..n {
            let (stats, opening, target) = (stats.clone(), opening.clone(), target.clone());
            let connect_uds = connect_uds.clone();
            let frontend = frontends.get(i % GRPC_CONNS.max(1)).cloned();
            tasks.push(monoio::spawn(async move {
                while opening.get() >= OPENING {
                    monoio::time::sleep(Duration::from_millis(1)).await;
                }
                opening.set(opening.get() + 1);
                let mut payload = vec![0u8; 1024];
                Pattern::new(i as u64).fill(&mut payload);
                // Even streams: CONNECT; odd: a gRPC stream.
                enum S {
                    C(ConnectTunnel),
                    G(konn_testkit::frontend::Tunnel),
                }
                let opened = if i % 2 == 0 {
                    ConnectTunnel::unix(&connect_uds, &target, T)
                        .await
                        .map(S::C)
                } else {
                    match &frontend {
                        Some(f) => f.dial(&target, T).await.map(S::G),
                        None => Err(konn_testkit::Error::Closed("no gRPC connection".into())),
                    }
                };
                opening.set(opening.get() - 1);
                let mut s = match opened {
                    Ok(s) => s,
                    Err(e) => return stats.fail(format!("dial {i}: {e}")),
                };
                stats.open.set(stats.open.get() + 1);
                // Spread the streams' sends over the second.
                let mut next =
                    go + Duration::from_micros((i as u64 * 1_000_000 / n as u64) % 1_000_000);
                while next < end {
                    monoio::time::sleep_until(next).await;
                    let sent = monoio::time::Instant::now();
                    let echoed = match &mut s {
                        S::C(c) => match c.write(&payload).await {
                            Ok(()) => c.read_exact(1024, T).await,
                            Err(e) => Err(e),
                        },
                        S::G(g) => match g.write(&payload).await {
                            Ok(()) => g.read_exact(1024, T).await,
                            Err(e) => Err(e),
                        },
                    };
                    match echoed {
                        Ok(b) if b == payload => {
                            stats.ok.set(stats.ok.get() + 1);
                            stats
                                .rtt_us
                                .borrow_mut()
                                .push(sent.elapsed().as_micros() as u64);
                        }
                        Ok(_) => stats.fail(format!("stream {i}: the echo differs")),
                        Err(e) => return stats.fail(format!("stream {i}: {e}")),
                    }
                    next += Duration::from_secs(1);
                }
                match s {
                    S::C(c) => c.close().await,
                    S::G(g) => {
                        let _ = g.close(T).await;
                    }
                }
            }));
        }
        // The peak of open streams, read while every stream is open.
        monoio::time::sleep_until(go).await;
        let peak = stats.open.get();
        for t in tasks {
            t.await;
        }
        for f in frontends {
            if let Ok(f) = Rc::try_unwrap(f) {
                f.close().await;
            }
        }
        let mut rtt = stats.rtt_us.take();
        rtt.sort_unstable();
        let q = |p: f64| {
            rtt.get(((rtt.len() as f64 * p) as usize).min(rtt.len().saturating_sub(1)))
                .copied()
        };
        StreamStatsOut {
            ok: stats.ok.get(),
            errors: stats.errors.get(),
            first_error: stats.first_error.take(),
            p50_us: q(0.5),
            p99_us: q(0.99),
            peak_open: peak,
        }
    };
    konn_core::io::runtime::block_on(konn_core::io::runtime::Engine::Epoll, run).unwrap_or_else(
        |e| StreamStatsOut {
            errors: 1,
            first_error: Some(format!("runtime: {e}")),
            ..StreamStatsOut::default()
        },
    )
}

#[derive(Debug, Default)]
struct StreamStatsOut {
    ok: u64,
    errors: u64,
    first_error: Option<String>,
    p50_us: Option<u64>,
    p99_us: Option<u64>,
    peak_open: usize,
}

/// utime + stime of `pid`, seconds.
fn cpu_s(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or(Vec::new(), |(_, r)| r.split_whitespace().collect());
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // Fields after the command: state is 0, utime 11, stime 12; 100 Hz.
    (ticks(11) + ticks(12)) / 100.0
}

#[test]
fn row13_concurrent_streams() {
    let n = row13_streams();
    let id = "13";
    let title = format!("{n} concurrent streams (10000 with KONN_STREAMS=10000)");
    let criterion = format!(
        "{n} echo streams, half HTTP CONNECT over the Unix socket, half gRPC streams over {GRPC_CONNS} HTTP/2 connections (ReusableTunnel-style), each to its own server process with one agent; every stream sends 1 KiB every second for 10 s and reads it back: 0 errors and every byte echoed; p50/p99 round trip, server memory per stream (under the 512 MiB --memory-budget) and the CPU of both servers and agents over the window recorded. Implementations run one after the other (each needs about 1.5 descriptors per stream in this process)"
    );
    // Descriptors: streams, and the destination's side of each.
    konn_testkit::procs::raise_nofile(20_000);
    for imp in imps() {
        let r = (|| -> Result<Measured, String> {
            let dir = TempDir::new(&format!("fault-13-{}", imp.name()));
            let pki = konn_testkit::pki::write(&dir.0).map_err(|e| e.to_string())?;
            let stop = Arc::new(AtomicBool::new(false));
            let (dest, dest_thread) = echo_dest(stop.clone());
            let grpc = Server::start(imp, &dir, &pki, 0, &["--mode=grpc"]);
            let connect = Server::start(imp, &dir, &pki, 0, &[]);
            let ga = Agent::start(imp, &dir, &pki, "agent-g", grpc.agent_port);
            let ca = Agent::start(imp, &dir, &pki, "agent-c", connect.agent_port);
            check(
                wait_until(T, || grpc.ready() >= 1.0 && connect.ready() >= 1.0),
                || "agents did not connect".to_owned(),
            )?;
            let pids = [
                grpc.proc.pid(),
                connect.proc.pid(),
                ga.proc.pid(),
                ca.proc.pid(),
            ];
            let before: Vec<u64> = pids.iter().map(|p| rss_of(*p).0).collect();
            let cpu0: Vec<f64> = pids.iter().map(|p| cpu_s(*p)).collect();
            let secs = Duration::from_secs(10);
            let started = Instant::now();
            let out = streams_load(&connect.uds, &grpc.uds, dest, n, secs);
            let took = started.elapsed().as_secs_f64();
            let cpu: Vec<f64> = pids.iter().zip(&cpu0).map(|(p, c)| cpu_s(*p) - c).collect();
            let peak: Vec<u64> = pids.iter().map(|p| rss_of(*p).1).collect();
            stop.store(true, Ordering::Release);
            let _ = dest_thread.join();
            let per_stream =
                |i: usize| peak[i].saturating_sub(before[i]) as f64 / (n as f64 / 2.0) / 1024.0;
            check(out.errors == 0, || {
                format!(
                    "{} errors ({} round trips fine); the first: {}",
                    out.errors,
                    out.ok,
                    out.first_error.clone().unwrap_or_default()
                )
            })?;
            check(out.peak_open == n, || {
                format!("{} of {n} streams open at once", out.peak_open)
            })?;
            let expected = n as u64 * 10;
            check(out.ok + n as u64 >= expected, || {
                format!("{} round trips, expected about {expected}", out.ok)
            })?;
            check(peak[0].max(peak[1]) < 512 << 20, || {
                format!("a server's peak RSS {} MiB", peak[0].max(peak[1]) >> 20)
            })?;
            check(
                wait_until(T, || grpc.tables_empty() && connect.tables_empty()),
                || "server tables not back to empty".to_owned(),
            )?;
            Ok(Measured {
                note: format!(
                    "{} round trips; RTT p50 {} µs, p99 {} µs; server peak memory per stream {:.1} KiB (gRPC) / {:.1} KiB (CONNECT); CPU over the {took:.0} s run: servers {:.2} s + {:.2} s, agents {:.2} s + {:.2} s",
                    out.ok,
                    out.p50_us.unwrap_or(0),
                    out.p99_us.unwrap_or(0),
                    per_stream(0),
                    per_stream(1),
                    cpu[0],
                    cpu[1],
                    cpu[2],
                    cpu[3],
                ),
                ..Measured::default()
            })
        })();
        record(id, &title, &criterion, imp, &r);
        if imp == Imp::Konn
            && let Err(e) = r
        {
            panic!("row {id} ({title}), konn: {e}");
        }
    }
}
