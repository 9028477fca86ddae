//! Acceptance: proxy-server relays TCP connections through a konn agent in
//! both frontend modes (gRPC `/ProxyService/Proxy`, HTTP CONNECT), over a
//! Unix socket and over TCP with mTLS (the agent port then uses mTLS too),
//! one at a time and 100 at once. Every scenario runs under each io
//! engine and ends with the leak check of `e2e_common::assert_idle`, and
//! with every descriptor given back once server and agents stopped, and
//! with exactly one audit record per connection whose bytes each way are
//! what the destination's socket counted (`assert_audited_bytes`).

mod e2e_common;

use std::cell::Cell;
use std::rc::Rc;
use std::time::Duration;

use e2e_common::*;
use konn_core::io::runtime::{available_engines, block_on};
use konn_server::settings::Mode;
use konn_testkit::dest::{Destination, Unresponsive};
use konn_testkit::{Pattern, sha256_hex};

const TRANSPORTS: [Transport; 2] = [Transport::Unix, Transport::Tls];

fn pattern(seed: u64, n: usize) -> Vec<u8> {
    let mut v = vec![0u8; n];
    Pattern::new(seed).fill(&mut v);
    v
}

/// One server in `mode` with one agent, per engine and transport; `body`
/// runs the frontends (on a runtime of the same engine); then the leak
/// checks.
fn each_setup(mode: Mode, agents: usize, body: impl Fn(&TestServer, &[Agent], &FrontendAddr)) {
    let pki = Pki::new();
    for engine in available_engines() {
        for transport in TRANSPORTS {
            let what = format!("{mode:?} over {transport:?} on {engine}");
            let before = Baseline::take();
            let dir = TempDir::new("proxy");
            let audit = dir.path("audit.log");
            let mut server = ServerSpec {
                pki: Some(&pki),
                tweak: Some(audit_to(audit.clone())),
                ..ServerSpec::new(engine, mode, transport, &dir)
            }
            .start();
            let mut agents: Vec<Agent> = (0..agents)
                .map(|i| server.agent(&format!("agent-{i}"), "", None))
                .collect();
            wait_backends(&server, agents.len());
            let idle = Baseline::take();
            let frontend = server.frontend();
            konn_testkit::dest::take_transfers();
            body(&server, &agents, &frontend);
            assert_idle(&server, &agents.iter().collect::<Vec<_>>(), idle, &what);
            assert_audited_bytes(&server, &audit, &what);
            for a in &mut agents {
                a.stop();
            }
            server.stop();
            drop(dir);
            assert_released(before, &format!("{what}, stopped"));
        }
    }
}

/// A gRPC frontend dials an echo server and an HTTP server through the
/// agent: DIAL_RSP carries a connectID, bytes come back unchanged and in
/// order in both directions, CLOSE_REQ is answered with CLOSE_RSP, and a
/// destination that closes first ends the call with CLOSE_RSP after its
/// last byte.
#[test]
fn grpc_frontend_proxies_over_unix_socket_and_mtls() {
    let _serial = serial();
    let echo = Destination::echo().unwrap();
    let http = Destination::http().unwrap();
    let (echo, http) = (echo.addr().to_string(), http.addr().to_string());
    each_setup(Mode::Grpc, 1, |server, _, frontend| {
        block_on(server.engine, async {
            let fe = frontend.grpc().await.unwrap();
            let t = fe.dial(&echo, T).await.unwrap();
            assert_ne!(t.connect_id(), 0);
            for (seed, n) in [(1, 1), (2, 16_360), (3, 16_361), (4, 300_000)] {
                let data = pattern(seed, n);
                within("write", t.write(&data)).await.unwrap();
                let got = t.read_exact(n, T).await.unwrap();
                assert!(got == data, "{n} bytes echoed differently");
            }
            t.close(T).await.unwrap();
            fe.close().await;

            // The destination answers and closes: everything it sent
            // arrives, then CLOSE_RSP.
            let fe = frontend.grpc().await.unwrap();
            let t = fe.dial(&http, T).await.unwrap();
            t.write(b"GET /x?bytes=200000 HTTP/1.1\r\nHost: d\r\nConnection: close\r\n\r\n")
                .await
                .unwrap();
            let answer = t.read_to_end(T).await.unwrap();
            let text = String::from_utf8_lossy(&answer[..answer.len().min(200)]).into_owned();
            assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{text}");
            let body = answer.len() - answer.windows(4).position(|w| w == b"\r\n\r\n").unwrap() - 4;
            assert_eq!(
                body,
                "hello from the node network: you asked for /x?bytes=200000\n".len() + 200_000
            );
            fe.close().await;
        })
        .unwrap();
    });
}

/// The same through HTTP CONNECT: exactly `200 Connection Established`
/// first, bytes sent right behind the request head are delivered, data
/// flows both ways, and a destination that closes first closes the
/// client's connection after its last byte.
#[test]
fn http_connect_proxies_over_unix_socket_and_mtls() {
    let _serial = serial();
    let echo = Destination::echo().unwrap();
    let http = Destination::http().unwrap();
    let (echo, http) = (echo.addr().to_string(), http.addr().to_string());
    each_setup(Mode::HttpConnect, 1, |server, _, frontend| {
        block_on(server.engine, async {
            let mut t = frontend.connect(&echo).await.unwrap();
            assert_eq!(
                t.response_head(),
                "HTTP/1.1 200 Connection Established\r\n\r\n"
            );
            for (seed, n) in [(1, 1), (2, 16_360), (3, 16_361), (4, 300_000)] {
                let data = pattern(seed, n);
                within("write", t.write(&data)).await.unwrap();
                let got = t.read_exact(n, T).await.unwrap();
                assert!(got == data, "{n} bytes echoed differently");
            }
            t.close().await;

            let mut t = frontend.connect(&http).await.unwrap();
            t.write(b"GET /y?bytes=200000 HTTP/1.1\r\nHost: d\r\nConnection: close\r\n\r\n")
                .await
                .unwrap();
            let mut answer = Vec::new();
            while let Some(b) = t.read(T).await.unwrap() {
                answer.extend_from_slice(&b);
            }
            let text = String::from_utf8_lossy(&answer[..answer.len().min(200)]).into_owned();
            assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{text}");
            let body = answer.len() - answer.windows(4).position(|w| w == b"\r\n\r\n").unwrap() - 4;
            assert_eq!(
                body,
                "hello from the node network: you asked for /y?bytes=200000\n".len() + 200_000
            );
        })
        .unwrap();
    });
}

/// CONNECT: bytes the client sends while the agent is still dialling
/// (more than the server keeps aside before the answer) reach the
/// destination after the 200, complete and in order.
#[test]
fn http_connect_delivers_bytes_sent_while_the_dial_is_pending() {
    let _serial = serial();
    let pki = Pki::new();
    for engine in available_engines() {
        for transport in TRANSPORTS {
            let what = format!("over {transport:?} on {engine}");
            // Its connects hang until it starts answering.
            let mut late = Unresponsive::start().unwrap();
            let target = late.addr().to_string();
            let before = Baseline::take();
            let dir = TempDir::new("early");
            let mut server = ServerSpec {
                pki: Some(&pki),
                ..ServerSpec::new(engine, Mode::HttpConnect, transport, &dir)
            }
            .start();
            let mut agent = server.agent("agent-early", "", None);
            wait_backends(&server, 1);
            let idle = Baseline::take();
            let frontend = server.frontend();
            let early = pattern(9, 100 * 1024);
            block_on(engine, async {
                let mut r = frontend.connect_request(&target).await.unwrap();
                assert!(
                    wait_until_async(|| server.load().pending_dials == 1).await,
                    "{what}: the dial is pending"
                );
                within("early write", r.write(&early[..60 * 1024]))
                    .await
                    .unwrap();
                monoio::time::sleep(Duration::from_millis(20)).await;
                within("early write", r.write(&early[60 * 1024..]))
                    .await
                    .unwrap();
                late.start_echo().unwrap();
                let mut t = r.answer(T).await.unwrap();
                let got = t.read_exact(early.len(), T).await.unwrap();
                assert!(got == early, "{what}: early bytes echoed differently");
                t.write(b"after").await.unwrap();
                assert_eq!(t.read_exact(5, T).await.unwrap(), b"after");
                t.close().await;
            })
            .unwrap();
            assert_idle(&server, &[&agent], idle, &what);
            agent.stop();
            server.stop();
            drop(dir);
            assert_released(before, &format!("{what}, stopped"));
        }
    }
}

/// Connections open at the same time, and checked while all are open.
const CONCURRENT: usize = 100;

/// 100 connections open at once through two agents, in both modes: the
/// server counts 100 frontends and 100 established connections, the
/// agents 100 endpoints, while each connection echoes its own data; all
/// of it goes away afterwards.
#[test]
fn hundred_concurrent_connections() {
    let _serial = serial();
    let echo = Destination::echo().unwrap();
    let echo = echo.addr().to_string();
    for mode in [Mode::Grpc, Mode::HttpConnect] {
        each_setup(mode, 2, |server, agents, frontend| {
            let open = Rc::new(Cell::new(0usize));
            let checked = Rc::new(Cell::new(false));
            block_on(server.engine, async {
                let tasks: Vec<_> = (0..CONCURRENT)
                    .map(|i| {
                        let (frontend, echo) = (frontend.clone(), echo.clone());
                        let (open, checked) = (open.clone(), checked.clone());
                        monoio::spawn(async move {
                            let data = pattern(i as u64, 64 * 1024);
                            // Counted open; wait until the counts were checked.
                            let all_open = || async {
                                open.set(open.get() + 1);
                                let deadline = konn_core::io::clock::now() + T;
                                while !checked.get() {
                                    assert!(
                                        konn_core::io::clock::now() < deadline,
                                        "only {} of {CONCURRENT} connections opened",
                                        open.get()
                                    );
                                    monoio::time::sleep(Duration::from_millis(2)).await;
                                }
                            };
                            match mode {
                                Mode::Grpc => {
                                    let fe = frontend.grpc().await.unwrap();
                                    let t = fe.dial(&echo, T).await.unwrap();
                                    all_open().await;
                                    within("write", t.write(&data)).await.unwrap();
                                    let got = t.read_exact(data.len(), T).await.unwrap();
                                    assert!(sha256_hex(&got) == sha256_hex(&data), "flow {i}");
                                    t.close(T).await.unwrap();
                                    fe.close().await;
                                }
                                Mode::HttpConnect => {
                                    let mut t = frontend.connect(&echo).await.unwrap();
                                    all_open().await;
                                    within("write", t.write(&data)).await.unwrap();
                                    let got = t.read_exact(data.len(), T).await.unwrap();
                                    assert!(sha256_hex(&got) == sha256_hex(&data), "flow {i}");
                                    t.close().await;
                                }
                            }
                        })
                    })
                    .collect();
                // While every connection is open: count them everywhere.
                let deadline = konn_core::io::clock::now() + T;
                while open.get() < CONCURRENT {
                    assert!(
                        konn_core::io::clock::now() < deadline,
                        "connections not opened"
                    );
                    monoio::time::sleep(Duration::from_millis(2)).await;
                }
                // (The server counts right after it answers a dial.)
                let frontends = |load: Load| match mode {
                    Mode::Grpc => load.proxy_streams,
                    Mode::HttpConnect => load.http_connections,
                };
                wait_until_async(|| {
                    let load = server.load();
                    frontends(load) == CONCURRENT && load.established == CONCURRENT as i64
                })
                .await;
                let load = server.load();
                let frontends = frontends(load);
                assert_eq!(frontends, CONCURRENT, "{load:?}");
                assert_eq!(load.established, CONCURRENT as i64, "{load:?}");
                assert_eq!(load.established_metric, CONCURRENT as i64, "{load:?}");
                assert_eq!(load.pending_dials, 0, "{load:?}");
                let endpoints: i64 = agents.iter().map(Agent::endpoints).sum();
                assert_eq!(endpoints, CONCURRENT as i64);
                checked.set(true);
                for t in tasks {
                    t.await;
                }
            })
            .unwrap();
        });
    }
}
