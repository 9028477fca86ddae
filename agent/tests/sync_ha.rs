//! The agent's sync loop against several in-process konn servers behind a
//! round-robin TCP load balancer (the HA deployment upstream's ClientSet
//! exists for): it ends up with one tunnel per distinct `serverid`, closes
//! duplicates, replaces a server that goes away, keeps dialling with
//! `--sync-forever`, and gives up on a server that never answers.

mod run_common;

use std::io::Read;
use std::net::TcpListener;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use konn_agent::run::{self, AgentHandle};
use konn_core::io::runtime::available_engines;
use run_common::*;

const T: Duration = Duration::from_secs(20);

fn gauge(agent: &AgentHandle, name: &str) -> Option<f64> {
    metric(
        &agent.metrics().registry().render_to_string(),
        &format!("konnectivity_network_proxy_agent_{name}"),
    )
}

#[test]
fn holds_one_tunnel_per_server_behind_a_load_balancer() {
    let _serial = serial();
    for engine in available_engines() {
        let dir = TempDir::new("ha");
        let spec = |name| ServerSpec {
            server_count: 3,
            ..ServerSpec::new(engine, &dir, name)
        };
        let servers = [spec("s1").start(), spec("s2").start(), spec("s3").start()];
        // The replacement for s2, started now so that the descriptor count
        // below covers every server.
        let s2b = spec("s2b").start();
        let lb = LoadBalancer::start(servers.iter().map(TestServer::agent_addr).collect()).unwrap();
        let fds = open_fds();

        let agent = run::start(agent_settings(engine, lb.addr().to_string(), "agent-ha")).unwrap();
        let backends = |s: &[&TestServer]| s.iter().map(|s| s.backends()).collect::<Vec<_>>();
        let all = [&servers[0], &servers[1], &servers[2]];
        // A server counts the backend when it accepts the stream, the agent
        // when the response headers arrive a moment later: wait for both.
        assert!(
            wait_until(T, || backends(&all) == [1, 1, 1]
                && agent.status().connected_servers == 3),
            "{:?} {:?}",
            backends(&all),
            agent.status()
        );
        assert_eq!(agent.status().known_server_count, 3);
        // The set is full: no more dialling (the round-robin balancer gave
        // three distinct servers to three attempts).
        std::thread::sleep(Duration::from_millis(500));
        let status = agent.status();
        assert_eq!((status.attempts, status.duplicates), (3, 0), "{status:?}");
        assert_eq!(gauge(&agent, "open_server_connections"), Some(3.0));
        assert_eq!(gauge(&agent, "known_server_count"), Some(3.0));

        // s2 goes away: its tunnel ends. The agent still wants 3 servers,
        // but only s1 and s3 answer, so every attempt is a duplicate and is
        // closed at once.
        lb.set_backends(vec![servers[0].agent_addr(), servers[2].agent_addr()]);
        lb.cut();
        assert!(
            wait_until(T, || agent.status().duplicates >= 4),
            "{:?}",
            agent.status()
        );
        let survivors = [&servers[0], &servers[2]];
        assert!(
            wait_until(T, || backends(&survivors) == [1, 1]
                && agent.status().connected_servers == 2),
            "duplicates are closed: {:?} {:?}",
            backends(&survivors),
            agent.status()
        );
        assert_eq!(servers[1].backends(), 0);
        assert_eq!(gauge(&agent, "open_server_connections"), Some(2.0));
        assert!(agent.is_ready(), "ready with 2 of 3, as upstream");

        // A new server joins behind the balancer: the set is whole again.
        lb.set_backends(vec![
            servers[0].agent_addr(),
            s2b.agent_addr(),
            servers[2].agent_addr(),
        ]);
        let now = [&servers[0], &s2b, &servers[2]];
        assert!(
            wait_until(T, || backends(&now) == [1, 1, 1]
                && agent.status().connected_servers == 3),
            "{:?} {:?}",
            backends(&now),
            agent.status()
        );

        agent.stop().unwrap();
        assert!(wait_until(T, || backends(&now) == [0, 0, 0]));
        lb.cut();
        assert_fds_back_to(fds, "after stopping the agent");
    }
}

#[test]
fn sync_forever_keeps_dialling_and_closes_every_duplicate() {
    let _serial = serial();
    for engine in available_engines() {
        let dir = TempDir::new("forever");
        let spec = |name| ServerSpec {
            server_count: 2,
            ..ServerSpec::new(engine, &dir, name)
        };
        let servers = [spec("a").start(), spec("b").start()];
        let lb = LoadBalancer::start(servers.iter().map(TestServer::agent_addr).collect()).unwrap();
        let mut settings = agent_settings(engine, lb.addr().to_string(), "agent-forever");
        settings.sync.sync_forever = true;
        settings.sync.interval = Duration::from_millis(20);
        settings.sync.interval_cap = Duration::from_millis(40);
        let agent = run::start(settings).unwrap();
        assert!(
            wait_until(T, || agent.status().duplicates >= 10),
            "{:?}",
            agent.status()
        );
        assert!(
            wait_until(T, || servers.iter().all(|s| s.backends() == 1)
                && agent.status().connected_servers == 2),
            "{:?} {:?}",
            servers.iter().map(TestServer::backends).collect::<Vec<_>>(),
            agent.status()
        );
        let status = agent.status();
        assert_eq!(status.failures, 0, "{status:?}");
        assert!(lb.accepted() >= 12);
        agent.stop().unwrap();
        assert!(wait_until(T, || servers.iter().all(|s| s.backends() == 0)));
    }
}

/// A "server" that accepts connections and never says a word: each attempt
/// is given up after the header timeout and its connection closed.
#[test]
fn a_server_that_never_answers_is_given_up_on() {
    let _serial = serial();
    for engine in available_engines() {
        let silent = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = silent.local_addr().unwrap();
        let closed_by_agent = Arc::new(AtomicUsize::new(0));
        let closed = closed_by_agent.clone();
        std::thread::spawn(move || {
            for s in silent.incoming() {
                let Ok(mut s) = s else { return };
                let closed = closed.clone();
                std::thread::spawn(move || {
                    // Read (and drop) the preface until the agent hangs up.
                    let mut buf = [0u8; 4096];
                    loop {
                        match s.read(&mut buf) {
                            Ok(0) => break,
                            Ok(_) => {}
                            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                            Err(_) => break,
                        }
                    }
                    closed.fetch_add(1, Ordering::Relaxed);
                });
            }
        });
        let fds = open_fds();
        let mut settings = agent_settings(engine, address.to_string(), "agent-silent");
        settings.sync.header_timeout = Duration::from_millis(200);
        settings.sync.interval = Duration::from_millis(20);
        settings.sync.interval_cap = Duration::from_millis(40);
        let agent = run::start(settings).unwrap();
        assert!(
            wait_until(T, || agent.status().failures >= 3),
            "{:?}",
            agent.status()
        );
        assert!(
            wait_until(T, || closed_by_agent.load(Ordering::Relaxed) >= 2),
            "the agent closes the connections it gave up on"
        );
        assert!(!agent.is_ready());
        assert_eq!(agent.status().connected_servers, 0);
        agent.stop().unwrap();
        assert_fds_back_to(fds, "after stopping the agent");
    }
}

/// A server whose accept queue is full never completes the TCP handshake:
/// the attempt is given up while still dialling, and its socket closed.
#[test]
fn a_dial_that_never_connects_is_abandoned() {
    let _serial = serial();
    for engine in available_engines() {
        // Backlog 1 and no accept: two connections fill the queue, and
        // further SYNs are dropped.
        let full =
            konn_core::io::listen::bind_tcp("127.0.0.1:0".parse().unwrap(), 1, false).unwrap();
        let address = full.local_addr().unwrap();
        let fillers: Vec<_> = (0..3)
            .filter_map(|_| {
                std::net::TcpStream::connect_timeout(&address, Duration::from_millis(200)).ok()
            })
            .collect();
        let probe = std::net::TcpStream::connect_timeout(&address, Duration::from_millis(300));
        assert!(
            probe.is_err(),
            "the queue must be full ({} fillers)",
            fillers.len()
        );
        let fds = open_fds();
        let mut settings = agent_settings(engine, address.to_string(), "agent-blackhole");
        settings.sync.header_timeout = Duration::from_millis(200);
        settings.sync.interval = Duration::from_millis(20);
        settings.sync.interval_cap = Duration::from_millis(40);
        let agent = run::start(settings).unwrap();
        assert!(
            wait_until(T, || agent.status().failures >= 3),
            "{:?}",
            agent.status()
        );
        assert_eq!(agent.status().connected_servers, 0);
        agent.stop().unwrap();
        assert_fds_back_to(fds, "after abandoned dials");
        drop(fillers);
    }
}
