//! DRAIN (the first SIGTERM/SIGINT) against an in-process konn server:
//! the server stops choosing the draining agent for new dials while
//! another agent is there, the draining agent keeps serving what it has
//! and stays ready, and it opens no new server connections.

mod run_common;

use std::time::Duration;

use konn_agent::run::{self, AgentHandle};
use konn_core::io::runtime::available_engines;
use run_common::*;

const T: Duration = Duration::from_secs(20);

/// The text agent B answers every dial with (it accepts no endpoint), so
/// a frontend can tell which agent the server chose.
const B_REFUSES: &str = "konn: too many connections on this tunnel";

fn drains_sent(agent: &AgentHandle) -> f64 {
    metric(
        &agent.metrics().registry().render_to_string(),
        "konnectivity_network_proxy_agent_stream_packets_total{packet_type=\"DRAIN\",segment=\"from_agent\"}",
    )
    .unwrap_or(0.0)
}

/// Dial the echo server through `server`; true when agent A served it.
fn served_by_a(server: &TestServer, echo: &Echo) -> bool {
    match server.connect(&echo.addr) {
        Ok(mut s) => {
            echo_once(&mut s, b"a");
            true
        }
        Err(answer) => {
            assert!(answer.contains(B_REFUSES), "{answer:?}");
            false
        }
    }
}

#[test]
fn drain_moves_new_dials_to_other_agents_and_keeps_serving() {
    let _serial = serial();
    let echo = Echo::start();
    for engine in available_engines() {
        let dir = TempDir::new("drain");
        // One worker: the server's choice among agents is purely random.
        let server = ServerSpec::new(engine, &dir, "s").start();
        let address = server.agent_addr().to_string();
        let mut a = agent_settings(engine, address.clone(), "agent-a");
        a.sync.sync_forever = true;
        a.sync.interval = Duration::from_millis(20);
        a.sync.interval_cap = Duration::from_millis(40);
        a.health = vec!["127.0.0.1:0".parse().unwrap()];
        let a = run::start(a).unwrap();
        let mut b = agent_settings(engine, address, "agent-b");
        b.connect.settings.tunnel.max_endpoints = 0;
        let b = run::start(b).unwrap();
        assert!(wait_until(T, || server.backends() == 2));

        // Before DRAIN the server picks either agent.
        let picks: Vec<bool> = (0..40).map(|_| served_by_a(&server, &echo)).collect();
        assert!(picks.contains(&true) && picks.contains(&false), "{picks:?}");
        // A connection through A, open across the drain.
        let mut kept = (0..100)
            .find_map(|_| server.connect(&echo.addr).ok())
            .expect("A is chosen within 100 dials");

        a.drain();
        assert!(a.status().draining);
        // (A duplicate tunnel still closing at this moment gets one too.)
        assert!(wait_until(T, || drains_sent(&a) >= 1.0));
        // Once the server has it, every new dial goes to B.
        assert!(
            wait_until(T, || (0..10).all(|_| !served_by_a(&server, &echo))),
            "the server kept choosing the draining agent"
        );
        assert!((0..30).all(|_| !served_by_a(&server, &echo)));
        // A still relays the connection it had, and is still ready.
        echo_once(&mut kept, b"still flowing after DRAIN");
        let health = a.health_addr().unwrap();
        assert_eq!(http_get(health, "/readyz"), (200, "ok".to_owned()));
        // No new server connections while draining (sync-forever would
        // dial every 20 ms otherwise).
        let attempts = a.status().attempts;
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(a.status().attempts, attempts);
        // Draining is idempotent: one DRAIN per tunnel.
        let sent = drains_sent(&a);
        a.drain();
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(drains_sent(&a), sent);
        drop(kept);

        b.stop().unwrap();
        assert!(wait_until(T, || server.backends() == 1));
        // Only draining agents left: the server uses one anyway.
        assert!(served_by_a(&server, &echo));
        a.stop().unwrap();
        assert!(wait_until(T, || server.backends() == 0));
    }
}
