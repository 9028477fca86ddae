//! Acceptance (issue 17): every tunnelled connection leaves exactly one
//! audit record with the bytes the test sent each way, a refused dial
//! leaves one too; a blocked audit sink never stalls traffic (records are
//! dropped and counted); `/debug/connections` lists open connections with
//! their bytes and filters by agent, on the server and on the agent (every
//! worker's endpoints, with their server and flow-control state). Real
//! sockets, both frontend modes, every io engine.

mod e2e_common;

use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use e2e_common::*;
use konn_core::io::runtime::{Engine, available_engines, block_on};
use konn_server::audit::{AuditConfig, Sink};
use konn_server::settings::Mode;
use konn_testkit::Pattern;
use konn_testkit::blocking::ReadRetry;
use konn_testkit::dest::Destination;
use konn_testkit::procs::http_get;
use serde_json::Value;

fn pattern(seed: u64, n: usize) -> Vec<u8> {
    let mut v = vec![0u8; n];
    Pattern::new(seed).fill(&mut v);
    v
}

fn audited(engine: Engine, mode: Mode, dir: &TempDir, sink: PathBuf, queue: usize) -> TestServer {
    ServerSpec {
        tweak: Some(Box::new(move |s| {
            s.admin_addr = Some("127.0.0.1:0".parse().unwrap());
            s.observe.audit = Some(AuditConfig {
                sink: Sink::File(sink),
                max_size: 0,
                max_backups: 0,
                queue,
            });
        })),
        ..ServerSpec::new(engine, mode, Transport::Unix, dir)
    }
    .start()
}

fn records(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

/// Echo `sizes[i]` bytes through connection i, one connection after the
/// other, through a gRPC or CONNECT frontend.
async fn echo_each(frontend: &FrontendAddr, mode: Mode, echo: &str, sizes: &[usize]) {
    for (i, &n) in sizes.iter().enumerate() {
        let data = pattern(i as u64, n);
        match mode {
            Mode::Grpc => {
                let fe = frontend.grpc().await.unwrap();
                let t = fe.dial(echo, T).await.unwrap();
                within("write", t.write(&data)).await.unwrap();
                assert!(t.read_exact(n, T).await.unwrap() == data);
                t.close(T).await.unwrap();
                fe.close().await;
            }
            Mode::HttpConnect => {
                let mut t = frontend.connect(echo).await.unwrap();
                within("write", t.write(&data)).await.unwrap();
                assert!(t.read_exact(n, T).await.unwrap() == data);
                t.close().await;
            }
        }
    }
}

/// N connections with known sizes, plus one refused dial: N + 1 records,
/// each with the right bytes, result, agent and peer.
#[test]
fn every_connection_leaves_one_record_with_its_bytes() {
    let _serial = serial();
    let echo = Destination::echo().unwrap();
    let echo = echo.addr().to_string();
    let sizes = [1usize, 100, 16_384, 70_000, 250_000];
    for engine in available_engines() {
        for mode in [Mode::Grpc, Mode::HttpConnect] {
            let what = format!("{mode:?} on {engine}");
            let dir = TempDir::new("audit");
            let log = dir.path("audit.log");
            let mut server = audited(engine, mode, &dir, log.clone(), 1024);
            let frontend = server.frontend();
            // No agent yet: refused.
            block_on(engine, async {
                match mode {
                    Mode::Grpc => {
                        let fe = frontend.grpc().await.unwrap();
                        assert!(fe.dial(&echo, T).await.is_err());
                        fe.close().await;
                    }
                    Mode::HttpConnect => {
                        let r = frontend.connect_request(&echo).await.unwrap();
                        drop(r);
                    }
                }
            })
            .unwrap();
            let mut agent = server.agent("agent-0", "", None);
            wait_backends(&server, 1);
            let idle = Baseline::take();
            block_on(engine, echo_each(&frontend, mode, &echo, &sizes)).unwrap();
            assert_idle(&server, &[&agent], idle, &what);
            assert!(
                wait_until(T, || records(&log).len() == sizes.len() + 1),
                "{what}: {} records: {:?}",
                records(&log).len(),
                records(&log)
            );
            let all = records(&log);
            let refused: Vec<&Value> = all.iter().filter(|r| r["result"] == "refused").collect();
            assert_eq!(refused.len(), 1, "{what}: {all:?}");
            assert_eq!(refused[0]["reason"], "no_backend");
            assert_eq!(refused[0]["agent_id"], Value::Null);
            let mut closed: Vec<&Value> = all.iter().filter(|r| r["result"] == "closed").collect();
            assert_eq!(closed.len(), sizes.len(), "{what}: {all:?}");
            closed.sort_by_key(|r| r["bytes_to_agent"].as_u64());
            for (r, &n) in closed.iter().zip(&sizes) {
                assert_eq!(r["bytes_to_agent"].as_u64(), Some(n as u64), "{what}: {r}");
                assert_eq!(
                    r["bytes_from_agent"].as_u64(),
                    Some(n as u64),
                    "{what}: {r}"
                );
                assert_eq!(r["agent_id"], "agent-0");
                assert_eq!(r["destination"].as_str(), Some(echo.as_str()));
                assert_eq!(r["closed_by"], "frontend", "{what}: {r}");
                let frontend_kind = match mode {
                    Mode::Grpc => "grpc",
                    Mode::HttpConnect => "http-connect",
                };
                assert_eq!(r["frontend"], frontend_kind);
                let peer = r["peer"].as_str().unwrap_or("");
                assert!(peer.starts_with("uid="), "{what}: {r}");
                assert!(r["connection_id"].as_i64().unwrap() != 0);
                assert!(r["duration_seconds"].as_f64().unwrap() >= 0.0);
            }
            // The same bytes in the per-agent metrics.
            let text = server.h().metrics().registry().render_to_string();
            let sum: u64 = sizes.iter().map(|&n| n as u64).sum();
            assert_eq!(
                metric(
                    &text,
                    "konn_connection_bytes_total{agent_id=\"agent-0\",direction=\"to_destination\"}"
                ),
                Some(sum as f64),
                "{text}"
            );
            // The agent counts the same bytes under the same names once its
            // endpoints are released.
            let series =
                "konn_connection_bytes_total{agent_id=\"agent-0\",direction=\"from_destination\"}";
            let agent_counted = || {
                let text = agent.h().metrics().registry().render_to_string();
                metric(&text, series)
            };
            assert!(
                wait_until(T, || agent_counted() == Some(sum as f64)),
                "{what}: agent counted {:?}, sent {sum}",
                agent_counted()
            );
            agent.stop();
            server.stop();
        }
    }
}

/// A sink nobody drains (a FIFO whose reader never reads): connections go
/// on at full speed, the records that do not fit are dropped and counted.
#[test]
fn a_blocked_sink_never_stalls_traffic() {
    let _serial = serial();
    let echo = Destination::echo().unwrap();
    let echo = echo.addr().to_string();
    for engine in available_engines() {
        let dir = TempDir::new("audit-fifo");
        let fifo = dir.path("audit.fifo");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        assert!(made.unwrap().success(), "mkfifo");
        // A reader exists (so the writer's open does not wait) but reads
        // nothing until the end.
        let mut reader = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&fifo)
            .unwrap();
        let mut server = audited(engine, Mode::HttpConnect, &dir, fifo.clone(), 4);
        let mut agent = server.agent("agent-0", "", None);
        wait_backends(&server, 1);
        let frontend = server.frontend();
        // Far more records than the pipe (64 KiB) and the queues hold.
        let sizes = vec![64usize; 600];
        block_on(engine, async {
            within(
                "600 connections",
                echo_each(&frontend, Mode::HttpConnect, &echo, &sizes),
            )
            .await;
        })
        .unwrap();
        let metrics = server.h().metrics().clone();
        let dropped = || {
            let text = metrics.registry().render_to_string();
            metric(&text, "konn_audit_records_dropped_total").unwrap_or(0.0)
        };
        assert!(
            wait_until(T, || dropped() > 0.0),
            "nothing counted as dropped"
        );
        // Drain the FIFO so the writer can end, then stop.
        let drain = std::thread::spawn(move || {
            let mut all = Vec::new();
            let mut buf = [0u8; 65536];
            // Bounded: about T of 2 ms naps at most.
            for _ in 0..T.as_millis() / 2 {
                match reader.read_retry(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => all.extend_from_slice(&buf[..n]),
                    Err(_) => std::thread::sleep(Duration::from_millis(2)),
                }
            }
            all
        });
        agent.stop();
        server.stop();
        let written = drain.join().unwrap();
        let lines = written.iter().filter(|&&b| b == b'\n').count();
        assert!(lines > 0 && lines < sizes.len(), "{lines} records written");
        assert!(dropped() as usize + lines >= sizes.len());
    }
}

/// `/debug/connections` shows an open connection with its bytes so far,
/// its agent and destination, and filters by agent and cluster.
#[test]
fn debug_connections_lists_open_connections() {
    let _serial = serial();
    let echo = Destination::echo().unwrap();
    let echo = echo.addr().to_string();
    for engine in available_engines() {
        let dir = TempDir::new("audit-debug");
        let mut server = audited(engine, Mode::Grpc, &dir, dir.path("audit.log"), 16);
        let mut agent = server.agent("agent-0", "", None);
        wait_backends(&server, 1);
        let admin = server.h().admin_addr().unwrap();
        let frontend = server.frontend();
        block_on(engine, async {
            let fe = frontend.grpc().await.unwrap();
            let t = fe.dial(&echo, T).await.unwrap();
            let data = pattern(9, 1000);
            t.write(&data).await.unwrap();
            assert!(t.read_exact(1000, T).await.unwrap() == data);
            // Other workers publish on their next tick after a request:
            // ask until the connection shows (bounded).
            let listed = |q: &str| -> Value {
                let (status, body) = http_get(admin, &format!("/debug/connections{q}")).unwrap();
                assert_eq!(status, 200);
                serde_json::from_str(&body).unwrap()
            };
            let mut found = Value::Null;
            let deadline = konn_core::io::clock::now() + T;
            while konn_core::io::clock::now() < deadline {
                let v = listed("");
                if let Some(c) = v["connections"].as_array().and_then(|a| a.first()) {
                    found = c.clone();
                    break;
                }
                monoio::time::sleep(Duration::from_millis(50)).await;
            }
            assert_eq!(found["agent_id"], "agent-0", "{found}");
            assert!(
                wait_until_async(|| listed("")["complete"] == true).await,
                "every worker publishes once asked"
            );
            assert_eq!(found["destination"].as_str(), Some(echo.as_str()));
            assert_eq!(found["bytes_to_agent"], 1000);
            assert_eq!(found["bytes_from_agent"], 1000);
            assert_eq!(found["state"], "flowing");
            assert_eq!(
                found["flow"]["queued"].as_u64().map(|q| q <= 1100),
                Some(true)
            );
            assert_eq!(
                listed("?agent=agent-0")["connections"]
                    .as_array()
                    .map(Vec::len),
                Some(1)
            );
            assert_eq!(
                listed("?agent=nobody")["connections"]
                    .as_array()
                    .map(Vec::len),
                Some(0)
            );
            assert_eq!(
                listed("?cluster=other")["connections"]
                    .as_array()
                    .map(Vec::len),
                Some(0)
            );
            t.close(T).await.unwrap();
            fe.close().await;
        })
        .unwrap();
        agent.stop();
        server.stop();
    }
}

/// The agent's `/debug/connections`: its endpoints on every worker (one
/// tunnel per server, on different workers), each with its server,
/// destination, bytes each way and flow-control state — a download its
/// frontend does not read shows as paused by the server — filtered by
/// server and destination, empty again once everything closed.
#[test]
fn agent_debug_connections_lists_every_workers_endpoints() {
    let _serial = serial();
    let echo = Destination::echo().unwrap();
    let source = Destination::source().unwrap();
    let (echo, src) = (echo.addr().to_string(), source.addr().to_string());
    for engine in available_engines() {
        let what = format!("agent /debug/connections on {engine}");
        let dirs = [TempDir::new("agent-debug-1"), TempDir::new("agent-debug-2")];
        let mut servers: Vec<TestServer> = ["s1", "s2"]
            .iter()
            .zip(&dirs)
            .map(|(id, dir)| {
                ServerSpec {
                    tweak: Some(Box::new(move |s| {
                        s.server_id = (*id).to_owned();
                        s.server_count = 2;
                    })),
                    ..ServerSpec::new(engine, Mode::Grpc, Transport::Unix, dir)
                }
                .start()
            })
            .collect();
        let lb = konn_testkit::relay::LoadBalancer::start(
            servers.iter().map(TestServer::agent_addr).collect(),
        )
        .unwrap();
        let mut agent = servers[0].agent_with("agent-0", "", Some(lb.addr()), |s| {
            s.admin = vec!["127.0.0.1:0".parse().unwrap()];
            s.runtime.workers = 2;
        });
        for s in &servers {
            wait_backends(s, 1);
        }
        let admin = agent.h().admin_addr().unwrap();
        let listed = |q: &str| -> Value {
            let (status, body) = http_get(admin, &format!("/debug/connections{q}")).unwrap();
            assert_eq!(status, 200);
            serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"))
        };
        let count = |v: &Value| v["connections"].as_array().map_or(0, Vec::len);
        let frontends: Vec<FrontendAddr> = servers.iter().map(TestServer::frontend).collect();
        block_on(engine, async {
            let mut open = Vec::new();
            for (i, fe) in frontends.iter().enumerate() {
                let g = fe.grpc().await.unwrap();
                let t = g.dial(&echo, T).await.unwrap();
                let data = pattern(i as u64, 1000 * (i + 1));
                t.write(&data).await.unwrap();
                assert!(t.read_exact(data.len(), T).await.unwrap() == data);
                open.push((g, t));
            }
            // A download its frontend does not read: the server pauses it.
            let g = frontends[0].grpc().await.unwrap();
            let stalled = g.dial(&src, T).await.unwrap();
            let mut head = (48u64 << 20).to_be_bytes().to_vec();
            head.extend_from_slice(&3u64.to_be_bytes());
            stalled.write(&head).await.unwrap();
            // Other workers publish once asked: ask until all is there.
            let deadline = konn_core::io::clock::now() + T;
            let mut all = Value::Null;
            loop {
                let v = listed("");
                let paused = v["connections"]
                    .as_array()
                    .is_some_and(|a| a.iter().any(|c| c["flow"]["paused_by_server"] == true));
                if v["complete"] == true && count(&v) == 3 && paused {
                    all = v;
                    break;
                }
                if konn_core::io::clock::now() > deadline {
                    break;
                }
                monoio::time::sleep(Duration::from_millis(50)).await;
            }
            let list = all["connections"].as_array().cloned().unwrap_or_default();
            assert_eq!(list.len(), 3, "{what}: {all}");
            let mut workers: Vec<u64> = list.iter().filter_map(|c| c["worker"].as_u64()).collect();
            workers.sort_unstable();
            workers.dedup();
            assert_eq!(workers, [0, 1], "{what}: one tunnel per worker: {all}");
            for (server, n) in [("s1", 1000u64), ("s2", 2000)] {
                let c = list
                    .iter()
                    .find(|c| c["server"] == server && c["destination"] == echo.as_str())
                    .unwrap_or_else(|| panic!("{what}: no echo via {server}: {all}"));
                assert_eq!(c["bytes_to_destination"], n, "{c}");
                assert_eq!(c["bytes_from_destination"], n, "{c}");
                assert_eq!(c["state"], "flowing", "{c}");
                assert!(c["connection_id"].as_i64().unwrap() > 0);
                assert!(c["age_seconds"].as_f64().unwrap() >= 0.0);
            }
            let paused = list
                .iter()
                .find(|c| c["destination"] == src.as_str())
                .unwrap();
            assert_eq!(paused["server"], "s1");
            assert_eq!(paused["state"], "paused", "{paused}");
            assert_eq!(paused["bytes_to_destination"], 16);
            assert!(paused["bytes_from_destination"].as_u64().unwrap() > 0);
            assert_eq!(count(&listed("?server=s2")), 1);
            let dest = format!("?destination={}", echo.replace(':', "%3A"));
            assert_eq!(count(&listed(&dest)), 2);
            assert_eq!(count(&listed("?server=nobody")), 0);
            let _ = stalled.close(T).await;
            g.close().await;
            for (g, t) in open {
                t.close(T).await.unwrap();
                g.close().await;
            }
            assert!(
                wait_until_async(|| {
                    let v = listed("");
                    v["complete"] == true && count(&v) == 0
                })
                .await,
                "{what}: still listed: {}",
                listed("")
            );
        })
        .unwrap();
        agent.stop();
        for s in &mut servers {
            s.stop();
        }
    }
}
