//! The reverse direction (KEP-2025, docs/design/reverse.md) over real
//! sockets, under each io engine: a connection accepted on a konn agent's
//! `--target` listener reaches an `--allowed-destination` through the
//! server, bytes intact both ways; nothing gets through without an
//! allow-list; and every entry of reliability-security.md §4.5's bypass
//! corpus that an agent can put on the wire is refused by the real server
//! with the one generic answer, while the allowed destination works.
//! (The corpus's DNS cases need a resolver of their own:
//! `reverse_dns.rs`.)

mod e2e_common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::rc::Rc;
use std::time::Duration;

use e2e_common::*;
use konn_agent::client::open_tunnel_with;
use konn_agent::conn::{TunnelEvent, TunnelHandler, TunnelSettings};
use konn_agent::reverse::ReverseSettings;
use konn_agent::settings::AgentSettings;
use konn_core::io::pool::{BufPool, MemoryBudget, PoolConfig};
use konn_core::io::runtime::{available_engines, block_on};
use konn_server::settings::Mode;
use konn_testkit::Pattern;
use konn_testkit::blocking::ReadRetry;
use konn_testkit::dest::Destination;
use konn_testkit::ports::free_port;

/// A server whose allow-list is `allowed` (keys as given).
fn server(engine: konn_core::io::runtime::Engine, dir: &TempDir, allowed: &[String]) -> TestServer {
    let allowed = allowed.to_vec();
    ServerSpec {
        tweak: Some(Box::new(move |s| {
            s.reverse = konn_server::settings::ReverseSettings::parse(
                &allowed,
                Duration::from_secs(5),
                &mut s.router.reverse,
            )
            .unwrap();
        })),
        ..ServerSpec::new(engine, Mode::Grpc, Transport::Unix, dir)
    }
    .start()
}

/// An agent (two workers, so accepted connections may move between them)
/// forwarding 127.0.0.1:`local` to `destination`.
fn agent(server: &TestServer, local: u16, destination: &str) -> Agent {
    server.agent_with("reverse-agent", "", None, |s: &mut AgentSettings| {
        s.runtime.workers = 2;
        s.reverse =
            ReverseSettings::parse(&[format!("{local}:{destination}")], "127.0.0.1").unwrap();
        s.connect.settings.reverse = true;
    })
}

fn metric_of(server: &TestServer, series: &str) -> f64 {
    let text = server.h().metrics().registry().render_to_string();
    metric(&text, series).unwrap_or(0.0)
}

/// Waits until the agent offers the reverse direction (its tunnel is up).
fn wait_reverse_ready(local: u16) {
    // A connection is refused at once while no tunnel offers it; the
    // agent is ready when one stays open long enough to echo.
    assert!(
        wait_until(T, || {
            let Ok(mut s) = TcpStream::connect(("127.0.0.1", local)) else {
                return false;
            };
            let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
            let mut b = [0u8; 1];
            s.write_all(b"x").is_ok() && s.read_exact(&mut b).is_ok() && b == *b"x"
        }),
        "the agent's reverse listener never got through"
    );
}

#[test]
fn reverse_direction_carries_bytes_both_ways() {
    let _serial = serial();
    let echo = Destination::echo().unwrap();
    let dest = echo.addr().to_string();
    for engine in available_engines() {
        let what = format!("reverse on {engine}");
        let before = Baseline::take();
        let dir = TempDir::new("reverse");
        let mut server = server(engine, &dir, std::slice::from_ref(&dest));
        let local = free_port();
        let mut a = agent(&server, local, &dest);
        wait_backends(&server, 1);
        wait_reverse_ready(local);
        let idle = Baseline::take();
        let ok_before = metric_of(&server, "konn_reverse_dials_total{result=\"ok\"}");
        // 20 connections at once, 1 MiB each way on each, checked.
        let threads: Vec<_> = (0..20u64)
            .map(|i| {
                std::thread::spawn(move || {
                    let mut s = TcpStream::connect(("127.0.0.1", local)).unwrap();
                    s.set_read_timeout(Some(T)).unwrap();
                    let mut data = vec![0u8; 1 << 20];
                    Pattern::new(i).fill(&mut data);
                    let mut w = s.try_clone().unwrap();
                    let sent = data.clone();
                    let writer = std::thread::spawn(move || w.write_all(&sent).unwrap());
                    let mut got = vec![0u8; data.len()];
                    s.read_exact(&mut got).unwrap();
                    writer.join().unwrap();
                    assert!(got == data, "connection {i}: bytes differ");
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let ok = metric_of(&server, "konn_reverse_dials_total{result=\"ok\"}") - ok_before;
        assert_eq!(ok, 20.0, "{what}: one reverse dial per connection");
        assert!(
            metric_of(
                &server,
                "konn_reverse_bytes_total{direction=\"to_control_plane\"}"
            ) >= 20.0 * f64::from(1u32 << 20)
        );
        assert!(
            wait_until(T, || metric_of(&server, "konn_reverse_connections") == 0.0),
            "{what}: reverse connections left open"
        );
        assert_idle(&server, &[&a], idle, &what);
        a.stop();
        server.stop();
        drop(dir);
        assert_released(before, &format!("{what}, stopped"));
    }
}

#[test]
fn nothing_gets_through_without_an_allow_list() {
    let _serial = serial();
    let echo = Destination::echo().unwrap();
    let dest = echo.addr().to_string();
    for engine in available_engines() {
        let dir = TempDir::new("reverse-none");
        let mut server = server(engine, &dir, &[]);
        let local = free_port();
        let mut a = agent(&server, local, &dest);
        wait_backends(&server, 1);
        // Every connection is closed without a byte, and counted.
        let count = || {
            metric_of(
                &server,
                "konn_reverse_refusals_total{reason=\"not_allowed\"}",
            )
        };
        let refused = |n: f64| wait_until(T, || count() >= n);
        let attempt = || {
            let mut s = TcpStream::connect(("127.0.0.1", local)).unwrap();
            s.set_read_timeout(Some(T)).unwrap();
            let _ = s.write_all(b"GET / HTTP/1.1\r\n\r\n");
            let mut b = [0u8; 16];
            let n = s.read_retry(&mut b).unwrap_or(0);
            assert_eq!(n, 0, "{engine}: bytes came back without an allow-list");
        };
        // Until its tunnel offers the reverse direction the agent closes
        // a connection itself, and the server never sees it: the server
        // registering the agent (`wait_backends`) does not mean that yet.
        assert!(
            wait_until(T, || {
                attempt();
                count() >= 1.0
            }),
            "{engine}: no refusal counted"
        );
        let first = count();
        for i in 1..=2 {
            attempt();
            assert!(
                refused(first + f64::from(i)),
                "{engine}: refusal not counted"
            );
        }
        assert_eq!(echo.connections(), 0, "the destination was never dialled");
        a.stop();
        server.stop();
    }
}

/// reliability-security.md §4.5, every spelling an agent can send: with
/// only the echo server's `127.0.0.1:<port>` allowed, each is refused
/// with the same answer, and the allowed key itself works.
#[test]
fn the_bypass_corpus_is_refused_by_the_real_server() {
    let _serial = serial();
    let echo = Destination::echo().unwrap();
    let port = echo.addr().port();
    let allowed = format!("127.0.0.1:{port}");
    let corpus: Vec<(String, &str)> = [
        "127.1:{p}",
        "127.0.1:{p}",
        "2130706433:{p}",
        "0x7f000001:{p}",
        "0X7F.0.0.1:{p}",
        "0177.0.0.1:{p}",
        "017700000001:{p}",
        "127.000.000.001:{p}",
        "localhost:{p}",
        "LOCALHOST.:{p}",
        "localhost.localdomain:{p}",
        "0.0.0.0:{p}",
        "0:{p}",
        "[::]:{p}",
        "[::1]:{p}",
        "[0:0:0:0:0:0:0:1]:{p}",
        "[::0001]:{p}",
        "[::ffff:127.0.0.1]:{p}",
        "[::ffff:7f00:1]:{p}",
        "[::127.0.0.1]:{p}",
        "[64:ff9b::7f00:1]:{p}",
        "[2002:7f00:1::]:{p}",
        "[fe80::1%25eth0]:{p}",
        "[fe80::1%eth0]:{p}",
        "169.254.169.254:80",
        "2852039166:80",
        "[fd00:ec2::254]:80",
        "[::ffff:169.254.169.254]:80",
        "127.0.0.1:0{p}",
        "127.0.0.1:+{p}",
        "127.0.0.1:{p}.0",
        "127.0.0.1:{p65536}",
        "127.0.0.1:0",
        "127.0.0.1:-1",
        "127.0.0.1",
        "127.0.0.1:{p}:22",
        "::1:{p}",
        "127.0.0.1:{p}\n",
        "127.0.0.1:{p} ",
        " 127.0.0.1:{p}",
        "127.0.0.1\0.evil:{p}",
        "user@127.0.0.1:{p}",
        "127.0.0.1@127.0.0.1:{p}",
        "%31%32%37.0.0.1:{p}",
        "１２７.0.0.1:{p}",
        "127.0.0.1.:{p}",
        "tcp://127.0.0.1:{p}",
        "",
    ]
    .iter()
    .map(|t| {
        (
            t.replace("{p65536}", &(u32::from(port) + 65536).to_string())
                .replace("{p}", &port.to_string()),
            "tcp",
        )
    })
    .chain(
        ["unix", "udp", "tcp4", "tcp6", "", "TCP"]
            .iter()
            .map(|p| (allowed.clone(), *p)),
    )
    .collect();
    for engine in available_engines() {
        let dir = TempDir::new("reverse-corpus");
        let mut server = server(engine, &dir, std::slice::from_ref(&allowed));
        let answers = block_on(engine, raw_agent(server.agent_addr(), &corpus, &allowed)).unwrap();
        let tcp = corpus.iter().filter(|(_, p)| *p == "tcp");
        for ((spelling, _), got) in tcp.zip(&answers.refused) {
            assert!(
                *got,
                "{engine}: {spelling:?} got through (only {allowed} is allowed)"
            );
        }
        assert!(
            answers.allowed_works,
            "{engine}: the allowed destination failed"
        );
        let refusals: f64 = ["not_allowed", "protocol"]
            .iter()
            .map(|r| {
                metric_of(
                    &server,
                    &format!("konn_reverse_refusals_total{{reason=\"{r}\"}}"),
                )
            })
            .sum();
        assert_eq!(
            refusals,
            corpus.len() as f64,
            "{engine}: every refusal counted"
        );
        server.stop();
    }
    assert_eq!(
        echo.connections(),
        available_engines().len() as u64,
        "only the allowed dial reached it, once per engine"
    );
}

struct Answers {
    refused: Vec<bool>,
    allowed_works: bool,
}

/// A konn agent tunnel driven by hand: one reverse dial per corpus entry
/// (the tunnel sends whatever string it is given), each on a fresh
/// loopback connection whose far end tells whether the server answered
/// (open, echoing) or refused (closed at once).
async fn raw_agent(agent_addr: SocketAddr, corpus: &[(String, &str)], allowed: &str) -> Answers {
    let mut settings = AgentSettings::for_tests(agent_addr.to_string(), "raw");
    settings.connect.settings = TunnelSettings {
        reverse: true,
        ..TunnelSettings::default()
    };
    let budget = MemoryBudget::new(64 << 20);
    let pool = BufPool::new(&budget, &PoolConfig::default());
    let connected = Rc::new(konn_core::io::notify::Notify::new());
    let c = connected.clone();
    let handler = TunnelHandler::new(
        settings.connect.settings.clone(),
        pool,
        Box::new(move |e| {
            if matches!(e, TunnelEvent::Connected { reverse: true, .. }) {
                c.notify();
            }
        }),
    );
    let (handle, stream) = open_tunnel_with(
        &settings.connect,
        settings.h2_config(),
        settings.max_message,
        handler,
    )
    .await
    .unwrap();
    let run = handle.clone();
    let task = monoio::spawn(async move { run.run(stream).await });
    within("reverse negotiated", connected.notified()).await;
    let listener = monoio::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let laddr = listener.local_addr().unwrap();
    let mut refused = Vec::new();
    let mut random = 1000;
    for (spelling, protocol) in corpus {
        random += 1;
        // The tunnel always asks for "tcp"; other protocols go out as raw
        // packets, whose refusals the caller finds in the server's metrics
        // (and in a destination that was never dialled).
        if *protocol == "tcp" {
            let (near, far) = pair(&listener, laddr).await;
            handle
                .with(|g, t| t.reverse_accept(g, far, spelling, random))
                .unwrap()
                .unwrap();
            refused.push(closed_without_bytes(near).await);
        } else {
            let p = konn_frames::packet::Packet::ReverseDialReq {
                protocol: konn_frames::packet::ByteStr::from(protocol.to_string()),
                address: konn_frames::packet::ByteStr::from(spelling.clone()),
                random,
            };
            let mut b = bytes::BytesMut::new();
            p.encode_grpc(&mut b);
            handle
                .with(|g, _| g.send_framed(1, b.freeze()))
                .unwrap()
                .unwrap();
        }
    }
    // The allowed key works.
    let (mut near, far) = pair(&listener, laddr).await;
    random += 1;
    handle
        .with(|g, t| t.reverse_accept(g, far, allowed, random))
        .unwrap()
        .unwrap();
    use monoio::io::{AsyncReadRentExt, AsyncWriteRentExt};
    let (w, _) = near.write_all(b"ping".to_vec()).await;
    let (r, got) = within("echo", near.read_exact(vec![0u8; 4])).await;
    let allowed_works = w.is_ok() && r.is_ok() && got == b"ping";
    drop(near);
    handle.abort();
    let _ = task.await;
    Answers {
        refused,
        allowed_works,
    }
}

async fn pair(
    listener: &monoio::net::TcpListener,
    addr: SocketAddr,
) -> (monoio::net::TcpStream, monoio::net::TcpStream) {
    let (near, far) =
        konn_core::io::runtime::join(monoio::net::TcpStream::connect(addr), listener.accept())
            .await;
    (near.unwrap(), far.unwrap().0)
}

/// The connection was closed by the agent without a byte (refused), as
/// opposed to staying open (a dial in progress or established).
async fn closed_without_bytes(mut near: monoio::net::TcpStream) -> bool {
    use monoio::io::AsyncReadRent;
    let (r, _) = within("refusal", near.read(vec![0u8; 16])).await;
    matches!(r, Ok(0)) || r.is_err()
}
