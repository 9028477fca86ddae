//! Rows of the fault matrix about fleets rather than single connections:
//! a reconnect storm of many agents when their server restarts (row 7) and
//! a rolling update that grows the server count while old servers still
//! report the stale one (row 8). Both run real agent processes of each
//! implementation behind konn-testkit's load balancer, which also counts the
//! tunnel connections they make.

use konn_testkit::relay::LoadBalancer;

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
