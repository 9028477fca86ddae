//! The agent runtime (`konn_agent::run`) against in-process konn servers
//! over real sockets: connecting and readiness, the health and admin ports
//! as upstream answers them, a frontend dial through the agent, metrics,
//! reconnecting after a server restart, and no descriptor left behind.
//! Every test runs under each io engine this machine has.

mod run_common;

use std::net::SocketAddr;
use std::time::Duration;

use konn_agent::run::{self, AgentHandle};
use konn_core::io::runtime::available_engines;
use run_common::*;

const T: Duration = Duration::from_secs(20);

fn scrape(agent: &AgentHandle) -> String {
    http_get(agent.health_addr().unwrap(), "/metrics").1
}

fn series(agent: &AgentHandle, name: &str) -> f64 {
    metric(
        &scrape(agent),
        &format!("konnectivity_network_proxy_agent_{name}"),
    )
    .unwrap_or(0.0)
}

#[test]
fn connects_becomes_ready_and_relays_a_dial() {
    let _serial = serial();
    let echo = Echo::start();
    for engine in available_engines() {
        let dir = TempDir::new("ready");
        // The agent starts before any server listens on its address.
        let port = free_port();
        let address: SocketAddr = ([127, 0, 0, 1], port).into();
        let mut settings = agent_settings(engine, address.to_string(), "agent-ready");
        settings.health = vec!["127.0.0.1:0".parse().unwrap()];
        settings.admin = vec!["127.0.0.1:0".parse().unwrap()];
        let agent = run::start(settings).unwrap();
        assert_eq!(agent.engine(), Some(engine));
        let health = agent.health_addr().unwrap();
        let admin = agent.admin_addr().unwrap();

        // Not ready: upstream's 503 and check list, whatever the query.
        assert_eq!(http_get(health, "/healthz"), (200, "ok".to_owned()));
        assert_eq!(http_get(health, "/readyz"), (503, FAILED.to_owned()));
        assert_eq!(http_get(health, "/ready?verbose"), (503, FAILED.to_owned()));
        assert!(!agent.is_ready());
        assert!(
            wait_until(T, || agent.status().failures >= 2),
            "the sync loop keeps retrying: {:?}",
            agent.status()
        );
        assert_eq!(series(&agent, "known_server_count"), 1.0);

        let server = ServerSpec {
            agent_addr: Some(address),
            ..ServerSpec::new(engine, &dir, "s1")
        }
        .start();
        assert!(wait_until(T, || agent.is_ready()), "{:?}", agent.status());
        assert!(wait_until(T, || server.backends() == 1));
        assert_eq!(http_get(health, "/readyz"), (200, "ok".to_owned()));
        assert_eq!(http_get(health, "/ready"), (200, "ok".to_owned()));
        assert_eq!(
            http_get(health, "/readyz?verbose"),
            (200, PASSED.to_owned())
        );
        let status = agent.status();
        assert_eq!(status.connected_servers, 1);
        assert_eq!(status.known_server_count, 1);
        assert_eq!(status.duplicates, 0);
        assert_eq!(series(&agent, "open_server_connections"), 1.0);

        // Admin /metrics: 301 to the health port, as upstream.
        let mut s = std::net::TcpStream::connect(admin).unwrap();
        use std::io::{Read, Write};
        s.write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1:9\r\n\r\n")
            .unwrap();
        let mut answer = String::new();
        s.read_to_string(&mut answer).unwrap();
        assert!(
            answer.starts_with("HTTP/1.0 301 Moved Permanently\r\n"),
            "{answer}"
        );
        assert!(
            answer.contains(&format!(
                "Location: //127.0.0.1:{}/metrics\r\n",
                health.port()
            )),
            "{answer}"
        );

        // A frontend dial through the agent.
        let mut stream = server.connect(&echo.addr).expect("dial through the agent");
        echo_once(&mut stream, b"hello through konn");
        assert!(wait_until(T, || series(
            &agent,
            "open_endpoint_connections"
        ) == 1.0));
        let text = scrape(&agent);
        let packets = |segment: &str, ty: &str| {
            metric(
                &text,
                &format!(
                    "konnectivity_network_proxy_agent_stream_packets_total{{packet_type=\"{ty}\",segment=\"{segment}\"}}"
                ),
            )
            .unwrap_or(0.0)
        };
        assert_eq!(packets("to_agent", "DIAL_REQ"), 1.0, "{text}");
        assert_eq!(packets("from_agent", "DIAL_RSP"), 1.0, "{text}");
        assert!(packets("to_agent", "DATA") >= 1.0, "{text}");
        assert!(packets("from_agent", "DATA") >= 1.0, "{text}");
        assert_eq!(
            metric(
                &text,
                "konnectivity_network_proxy_agent_dial_duration_seconds_count"
            ),
            Some(1.0),
            "{text}"
        );
        drop(stream);
        assert!(wait_until(T, || series(
            &agent,
            "open_endpoint_connections"
        ) == 0.0));

        // A refused dial: the agent's error reaches the frontend and is
        // counted by reason.
        let closed = free_port();
        let err = server
            .connect(&format!("127.0.0.1:{closed}"))
            .expect_err("nothing listens there");
        assert!(err.contains("connect: connection refused"), "{err}");
        assert!(wait_until(T, || {
            metric(
                &scrape(&agent),
                "konnectivity_network_proxy_agent_endpoint_dial_failure_total{reason=\"unknown\"}",
            ) == Some(1.0)
        }));

        agent.stop().unwrap();
        assert!(
            wait_until(T, || server.backends() == 0),
            "the server saw the tunnel end"
        );
    }
}

/// A server restart behind an address: the tunnel ends, the agent backs
/// off while nothing answers, and connects to the new server.
///
/// The agent reaches the servers through a TCP relay standing for the
/// server's Service: when the first server stops, the relay cuts its
/// connections (as the death of the server's process would) and sends new
/// ones to the second server. (A restart on the same port, which works
/// since `stop` releases every descriptor, is in the server's
/// `e2e_lifecycle` test.)
#[test]
fn reconnects_after_a_server_restart() {
    let _serial = serial();
    for engine in available_engines() {
        let dir = TempDir::new("restart");
        let mut first = ServerSpec::new(engine, &dir, "first").start();
        let lb = LoadBalancer::start(vec![first.agent_addr()]).unwrap();
        let agent = run::start(agent_settings(
            engine,
            lb.addr().to_string(),
            "agent-restart",
        ))
        .unwrap();
        assert!(wait_until(T, || first.backends() == 1 && agent.is_ready()));
        assert_eq!(agent.status().attempts, 1);

        // The server dies; while it is away, nothing answers.
        first.stop();
        lb.set_backends(vec![([127, 0, 0, 1], free_port()).into()]);
        lb.cut();
        assert!(
            wait_until(T, || !agent.is_ready()),
            "the agent noticed the server going away: {:?}",
            agent.status()
        );
        assert_eq!(agent.status().connected_servers, 0);
        assert!(
            wait_until(T, || agent.status().failures >= 2),
            "{:?}",
            agent.status()
        );

        let second = ServerSpec::new(engine, &dir, "second").start();
        lb.set_backends(vec![second.agent_addr()]);
        assert!(
            wait_until(T, || second.backends() == 1 && agent.is_ready()),
            "{:?}",
            agent.status()
        );
        let status = agent.status();
        assert_eq!(status.connected_servers, 1);
        assert!(status.attempts >= 4, "{status:?}");

        agent.stop().unwrap();
        assert!(wait_until(T, || second.backends() == 0));
    }
}

/// TLS towards the server: with the right CA the agent connects; with
/// another CA every attempt fails in the handshake and is retried with
/// backoff, and nothing is left open.
#[test]
fn tls_to_the_server_and_a_certificate_it_does_not_trust() {
    use konn_core::io::tls::{ClientTlsOptions, PemSource};
    let _serial = serial();
    let good = pki();
    let other = pki();
    for engine in available_engines() {
        let dir = TempDir::new("tls");
        let server = ServerSpec {
            tls: Some(server_tls(&good)),
            ..ServerSpec::new(engine, &dir, "tls")
        }
        .start();
        let address = server.agent_addr().to_string();
        let client = |ca: &str| {
            ClientTlsOptions::new(PemSource::memory("ca.crt", ca.to_owned()), "127.0.0.1")
                .build()
                .unwrap()
        };
        let fds = open_fds();
        let mut settings = agent_settings(engine, address.clone(), "agent-untrusting");
        settings.connect.tls = Some(client(&other.ca_cert));
        settings.sync.interval = Duration::from_millis(20);
        settings.sync.interval_cap = Duration::from_millis(40);
        let agent = run::start(settings).unwrap();
        assert!(
            wait_until(T, || agent.status().failures >= 3),
            "{:?}",
            agent.status()
        );
        assert!(!agent.is_ready());
        assert_eq!(server.backends(), 0);
        agent.stop().unwrap();
        assert_fds_back_to(fds, "after failed TLS attempts");

        let mut settings = agent_settings(engine, address, "agent-trusting");
        settings.connect.tls = Some(client(&good.ca_cert));
        let agent = run::start(settings).unwrap();
        assert!(wait_until(T, || agent.is_ready() && server.backends() == 1));
        assert_eq!(agent.status().failures, 0);
        agent.stop().unwrap();
        assert!(wait_until(T, || server.backends() == 0));
    }
}
