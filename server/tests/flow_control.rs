//! Per-connection flow control over real sockets, under each io engine: an
//! in-process proxy-server and a konn agent tunnel, gRPC frontends, real
//! destinations (docs/design/tunnel.md, "Flow control").
//!
//! - a bulk echo larger than every queue and window arrives intact, with
//!   konn's PAUSE/RESUME extension and without it (the fallback a Go peer
//!   gets: withheld HTTP/2 credit) — the demo's 64 MiB case — through a
//!   gRPC frontend and through HTTP CONNECT;
//! - a destination that stops reading does not stop four other flows on
//!   the same agent, and is closed with an error after the stuck timeout;
//!   without the extension the other flows wait for that close instead
//!   (upstream's head-of-line blocking, bounded by the stuck timeout) and
//!   still lose nothing;
//! - the same for a gRPC frontend that stops reading its call while its
//!   destination keeps sending;
//! - every connection, the stuck ones included, leaves one audit record.
//!
//! Timing: the only deadlines are upper bounds on waits; "the others are not
//! affected" is checked as an order of events (they finish while the stuck
//! flow is still open), not as a duration. Those rigs' stuck timeout is as
//! long as the longest wait, so the order does not depend on the machine's
//! load; the stuck close itself is checked on rigs of its own, with a short
//! timeout and no other flows to race it.

// Tests time their own phases and hold destination sockets across threads.
#![allow(clippy::disallowed_methods)]

use std::cell::{Cell, RefCell};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use konn_agent::client::{ConnectParams, run_tunnel};
use konn_agent::conn::TunnelSettings;
use konn_core::io::driver::DriverConfig;
use konn_core::io::pool::{BufPool, MemoryBudget, PoolConfig};
use konn_core::io::runtime::{Engine, IoEngine, available_engines, block_on, join};
use konn_protocol::agent::tunnel::{STUCK, TunnelConfig};
use konn_protocol::flow::FlowLimits;
use konn_protocol::server::router::FRONTEND_STUCK;
use konn_server::serve::{ServerHandle, start};
use konn_server::settings::{FrontendListen, Mode, ServerSettings};
use konn_testkit::blocking::ReadRetry;
use konn_testkit::dest::Destination;
use konn_testkit::frontend::{GrpcFrontend, Tunnel};
use konn_testkit::sha256_hex;

/// Upper bound of any single wait in these tests.
const WAIT: Duration = Duration::from_secs(60);

fn engine_flag(e: Engine) -> IoEngine {
    match e {
        Engine::IoUring => IoEngine::IoUring,
        Engine::Epoll => IoEngine::Epoll,
    }
}

/// A server with one worker and one konn agent tunnel to it.
struct Rig {
    server: Option<ServerHandle>,
    socket: PathBuf,
    agent: Option<std::thread::JoinHandle<()>>,
    _dir: tempfile::TempDir,
}

impl Rig {
    /// Production-like windows and queues (`--conn-queue-size` 1 MiB, 1 MiB
    /// stream windows); `extension`: both sides offer konn-flow-control.
    fn start(engine: Engine, extension: bool, stuck: Duration) -> Self {
        Self::start_mode(engine, Mode::Grpc, extension, stuck)
    }

    fn start_mode(engine: Engine, mode: Mode, extension: bool, stuck: Duration) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let mut settings =
            ServerSettings::for_tests(FrontendListen::Unix(dir.path().join("s.sock")), mode);
        settings.runtime.workers = 1;
        settings.runtime.engine = engine_flag(engine);
        settings.windows = (1 << 20, 4 << 20);
        settings.router.flow = FlowLimits::from_queue_size(1 << 20, stuck);
        settings.flow_control = extension;
        settings.observe.audit = Some(konn_server::audit::AuditConfig {
            sink: konn_server::audit::Sink::File(dir.path().join("audit.log")),
            max_size: 0,
            max_backups: 0,
            queue: 4096,
        });
        let server = start(settings).unwrap();
        let socket = server.frontend_path().unwrap().to_path_buf();
        let address = server.agent_addr().to_string();
        let agent = std::thread::spawn(move || {
            let _ = block_on(engine, async move {
                let budget = MemoryBudget::new(256 << 20);
                let pool = BufPool::new(&budget, &PoolConfig::default());
                let params = ConnectParams {
                    address,
                    tls: None,
                    agent_id: "agent-flow".into(),
                    agent_identifiers: String::new(),
                    token_path: None,
                    keepalive_time: Duration::from_secs(3600),
                    connect_timeout: Duration::from_secs(5),
                    settings: TunnelSettings {
                        tunnel: TunnelConfig {
                            flow: FlowLimits::from_queue_size(1 << 20, stuck),
                            ..TunnelConfig::default()
                        },
                        flow_control: extension,
                        ..TunnelSettings::default()
                    },
                    driver: DriverConfig::default(),
                };
                let _ = run_tunnel(Rc::new(params), pool, Box::new(|_| {})).await;
            });
        });
        let deadline = Instant::now() + WAIT;
        while server
            .shared()
            .backends
            .load(std::sync::atomic::Ordering::Relaxed)
            == 0
        {
            assert!(Instant::now() < deadline, "the agent did not connect");
            std::thread::sleep(Duration::from_millis(10));
        }
        Self {
            server: Some(server),
            socket,
            agent: Some(agent),
            _dir: dir,
        }
    }
}

impl Rig {
    /// Every connection and dial that ended left one audit record (stuck
    /// closes included), none dropped.
    fn check_audit(&self, server: &ServerHandle) {
        let scrape = || server.metrics().registry().render_to_string();
        let ended = || -> f64 {
            scrape()
                .lines()
                .filter(|l| l.starts_with("konn_connections_ended_total{"))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum()
        };
        let records = || {
            std::fs::read_to_string(self._dir.path().join("audit.log"))
                .unwrap_or_default()
                .lines()
                .count() as f64
        };
        let deadline = Instant::now() + WAIT;
        while records() != ended() {
            assert!(
                Instant::now() < deadline,
                "{} audit records, {} ended connections and dials",
                records(),
                ended()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(
            scrape().contains("konn_audit_records_dropped_total 0"),
            "records dropped"
        );
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        if let Some(s) = &self.server
            && !std::thread::panicking()
        {
            self.check_audit(s);
        }
        if let Some(s) = self.server.take() {
            let _ = s.stop();
        }
        if let Some(a) = self.agent.take() {
            let _ = a.join();
        }
    }
}

/// `n` bytes of a pattern that shows shifts and repeats.
fn pattern(n: usize, seed: u64) -> Vec<u8> {
    pattern_from(0, n, seed)
}

/// Bytes `offset..offset + n` of `pattern(_, seed)`.
fn pattern_from(offset: usize, n: usize, seed: u64) -> Vec<u8> {
    (offset as u64..(offset + n) as u64)
        .map(|i| ((i ^ seed).wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect()
}

/// Send `data` through `t` to an echo destination and read it back.
async fn echo(t: &Tunnel, data: &[u8]) -> Vec<u8> {
    let (w, r) = join(t.write(data), t.read_exact(data.len(), WAIT)).await;
    w.unwrap();
    r.unwrap()
}

/// A destination that accepts and never reads; the accepted sockets come
/// out of the channel (so the test decides when they close).
fn sink() -> (String, mpsc::Receiver<TcpStream>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(s) = s else { return };
            if tx.send(s).is_err() {
                return;
            }
        }
    });
    (addr, rx)
}

/// A destination that writes `pattern(limit, 7)` as fast as it is taken
/// and reports how much it wrote and whether the connection failed.
fn source(limit: usize) -> (String, mpsc::Receiver<(usize, bool)>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let Ok((mut s, _)) = l.accept() else { return };
        let mut sent = 0;
        let mut failed = false;
        while sent < limit {
            let chunk = pattern_from(sent, 16 << 10, 7);
            if s.write_all(&chunk).is_err() {
                failed = true;
                break;
            }
            sent += chunk.len();
        }
        let _ = tx.send((sent, failed));
    });
    (addr, rx)
}

/// Run `n` echo flows of `size` bytes each on `fe` at once; every byte must
/// come back in order.
async fn echo_flows(fe: &GrpcFrontend, dest: &str, n: usize, size: usize) {
    let mut tunnels = Vec::new();
    for _ in 0..n {
        tunnels.push(Rc::new(fe.dial(dest, WAIT).await.unwrap()));
    }
    let mut tasks = Vec::new();
    for (i, t) in tunnels.into_iter().enumerate() {
        tasks.push(monoio::spawn(async move {
            let data = pattern(size, i as u64);
            let back = echo(&t, &data).await;
            assert_eq!(back.len(), data.len(), "flow {i}: bytes lost");
            assert!(back == data, "flow {i}: bytes changed");
            let t = Rc::try_unwrap(t).ok().unwrap();
            t.close(WAIT).await.unwrap();
        }));
    }
    for t in tasks {
        t.await;
    }
}

/// Wait (bounded) until `progress` has not moved for a while: the flow it
/// counts is stalled. Returns its value.
async fn stalled(progress: &Cell<usize>) -> usize {
    let deadline = Instant::now() + WAIT;
    let mut last = progress.get();
    let mut quiet = 0;
    while quiet < 10 {
        assert!(Instant::now() < deadline, "never stalled");
        monoio::time::sleep(Duration::from_millis(50)).await;
        let now = progress.get();
        if now == last {
            quiet += 1;
        } else {
            (last, quiet) = (now, 0);
        }
    }
    last
}

// ----- a) bulk transfer ------------------------------------------------------

#[test]
fn a_64_mib_echo_arrives_intact_with_and_without_the_extension() {
    const BULK: usize = 64 << 20;
    let echo_dest = Destination::echo().unwrap();
    let dest = echo_dest.addr().to_string();
    let data = Rc::new(pattern(BULK, 1));
    let sent_hash = sha256_hex(&data);
    for engine in available_engines() {
        for extension in [true, false] {
            let rig = Rig::start(engine, extension, Duration::from_secs(30));
            let (socket, dest, data) = (rig.socket.clone(), dest.clone(), data.clone());
            let back = block_on(engine, async move {
                let fe = GrpcFrontend::connect_unix(&socket).await.unwrap();
                let t = fe.dial(&dest, WAIT).await.unwrap();
                let back = echo(&t, &data).await;
                t.close(WAIT).await.unwrap();
                fe.close().await;
                back
            })
            .unwrap();
            assert_eq!(back.len(), BULK, "{engine} extension={extension}");
            assert_eq!(
                sha256_hex(&back),
                sent_hash,
                "{engine} extension={extension}"
            );
        }
    }
}

#[test]
fn a_64_mib_echo_through_http_connect_arrives_intact() {
    const BULK: usize = 64 << 20;
    let echo_dest = Destination::echo().unwrap();
    let dest = echo_dest.addr().to_string();
    let data = std::sync::Arc::new(pattern(BULK, 5));
    let sent_hash = sha256_hex(&data);
    for engine in available_engines() {
        for extension in [true, false] {
            let rig = Rig::start_mode(engine, Mode::HttpConnect, extension, WAIT);
            let mut s = std::os::unix::net::UnixStream::connect(&rig.socket).unwrap();
            s.set_read_timeout(Some(WAIT)).unwrap();
            write!(s, "CONNECT {dest} HTTP/1.1\r\nHost: {dest}\r\n\r\n").unwrap();
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") {
                s.read_exact(&mut byte).unwrap();
                head.push(byte[0]);
            }
            assert!(
                head.starts_with(b"HTTP/1.1 200"),
                "{}",
                String::from_utf8_lossy(&head)
            );
            let mut w = s.try_clone().unwrap();
            let d = data.clone();
            let writer = std::thread::spawn(move || w.write_all(&d).unwrap());
            let mut back = vec![0u8; BULK];
            s.read_exact(&mut back).unwrap();
            writer.join().unwrap();
            assert_eq!(
                sha256_hex(&back),
                sent_hash,
                "{engine} extension={extension}"
            );
            drop(s);
            drop(rig);
        }
    }
}

// ----- b) a destination that stops reading ---------------------------------

/// What happened to the stuck flow, seen from its frontend.
#[derive(Default)]
struct StuckFlow {
    /// Bytes its writer handed to the frontend connection.
    written: Cell<usize>,
    /// The CLOSE_RSP error, once it arrived.
    closed: RefCell<Option<String>>,
}

/// Dial `dest` on `fe` and keep writing to it (up to 256 MiB) while
/// reading whatever comes back; `state` records what happens.
async fn stuck_writer(fe: &GrpcFrontend, dest: &str, state: Rc<StuckFlow>) {
    let t = Rc::new(fe.dial(dest, WAIT).await.unwrap());
    let (w, r) = (t.clone(), t);
    let st = state.clone();
    monoio::spawn(async move {
        let chunk = pattern(256 << 10, 3);
        for _ in 0..1024 {
            if w.write(&chunk).await.is_err() {
                return;
            }
            st.written.set(st.written.get() + chunk.len());
        }
    });
    monoio::spawn(async move {
        loop {
            match r.read(Duration::from_secs(3600)).await {
                Ok(Some(_)) => {}
                Ok(None) => {
                    *state.closed.borrow_mut() = Some(r.close_error().unwrap_or_default());
                    return;
                }
                Err(e) => {
                    *state.closed.borrow_mut() = Some(format!("error: {e}"));
                    return;
                }
            }
        }
    });
}

/// Stuck timeout of the rigs that check an order of events: far longer
/// than any flow here takes, so "the others finished while the stuck flow
/// was still open" does not depend on how loaded the machine is. Without
/// the extension these tests still fail: the others either time out or
/// finish only after the stuck close.
const NOT_BEFORE_THE_OTHERS: Duration = WAIT;

/// Stuck timeout of the rigs that wait for a stuck close.
const SHORT_STUCK: Duration = Duration::from_secs(1);

#[test]
fn b_a_destination_that_stops_reading_does_not_stop_the_other_flows() {
    let echo_dest = Destination::echo().unwrap();
    let echo_addr = echo_dest.addr().to_string();
    for engine in available_engines() {
        let rig = Rig::start(engine, true, NOT_BEFORE_THE_OTHERS);
        let (sink_addr, accepted) = sink();
        let (socket, echo_addr) = (rig.socket.clone(), echo_addr.clone());
        let st = Rc::new(StuckFlow::default());
        block_on(engine, async move {
            let fe_stuck = GrpcFrontend::connect_unix(&socket).await.unwrap();
            stuck_writer(&fe_stuck, &sink_addr, st.clone()).await;
            let written = stalled(&st.written).await;
            assert!(written < 64 << 20, "flow control stopped the writer");
            // Four flows on the same agent tunnel, each well over the
            // tunnel's 1 MiB window, while the stuck flow holds its data.
            let fe = GrpcFrontend::connect_unix(&socket).await.unwrap();
            echo_flows(&fe, &echo_addr, 4, 4 << 20).await;
            assert_eq!(
                *st.closed.borrow(),
                None,
                "{engine}: the others finished while the stuck flow was still open"
            );
            fe.close().await;
            fe_stuck.close().await;
        })
        .unwrap();
        drop(accepted);
        drop(rig);
    }
}

#[test]
fn b_a_destination_that_stops_reading_is_closed_after_the_stuck_timeout() {
    let echo_dest = Destination::echo().unwrap();
    let echo_addr = echo_dest.addr().to_string();
    for engine in available_engines() {
        let rig = Rig::start(engine, true, SHORT_STUCK);
        let (sink_addr, accepted) = sink();
        let (socket, echo_addr) = (rig.socket.clone(), echo_addr.clone());
        let st = Rc::new(StuckFlow::default());
        block_on(engine, async move {
            let fe_stuck = GrpcFrontend::connect_unix(&socket).await.unwrap();
            stuck_writer(&fe_stuck, &sink_addr, st.clone()).await;
            let deadline = Instant::now() + SHORT_STUCK + WAIT;
            while st.closed.borrow().is_none() {
                assert!(Instant::now() < deadline, "the stuck flow was never closed");
                monoio::time::sleep(Duration::from_millis(20)).await;
            }
            assert_eq!(st.closed.borrow().as_deref(), Some(STUCK));
            assert!(
                st.written.get() < 64 << 20,
                "flow control stopped the writer"
            );
            // The other flows on the same agent still work.
            let fe = GrpcFrontend::connect_unix(&socket).await.unwrap();
            echo_flows(&fe, &echo_addr, 4, 64 << 10).await;
            fe.close().await;
            fe_stuck.close().await;
        })
        .unwrap();
        // The agent closed the destination's connection.
        let mut dest_side = accepted.recv_timeout(WAIT).unwrap();
        dest_side.set_read_timeout(Some(WAIT)).unwrap();
        let mut buf = vec![0; 1 << 16];
        loop {
            match dest_side.read_retry(&mut buf) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
                Err(e) => panic!("{engine}: destination socket not closed: {e}"),
            }
        }
        drop(rig);
    }
}

#[test]
fn b_without_the_extension_the_others_wait_for_the_stuck_close_and_lose_nothing() {
    let stuck_timeout = Duration::from_secs(2);
    let echo_dest = Destination::echo().unwrap();
    let echo_addr = echo_dest.addr().to_string();
    for engine in available_engines() {
        let rig = Rig::start(engine, false, stuck_timeout);
        let (sink_addr, accepted) = sink();
        let (socket, echo_addr) = (rig.socket.clone(), echo_addr.clone());
        let st = Rc::new(StuckFlow::default());
        block_on(engine, async move {
            let fe_stuck = GrpcFrontend::connect_unix(&socket).await.unwrap();
            stuck_writer(&fe_stuck, &sink_addr, st.clone()).await;
            let written = stalled(&st.written).await;
            assert!(written < 64 << 20, "withheld credit stopped the writer");
            let fe = GrpcFrontend::connect_unix(&socket).await.unwrap();
            echo_flows(&fe, &echo_addr, 4, 1 << 20).await;
            // Upstream's behaviour, bounded: the tunnel's window went to the
            // stuck flow, so the others could finish only after it closed.
            assert_eq!(st.closed.borrow().as_deref(), Some(STUCK), "{engine}");
            fe.close().await;
            fe_stuck.close().await;
        })
        .unwrap();
        drop(accepted);
        drop(rig);
    }
}

// ----- c) a frontend that stops reading ------------------------------------

#[test]
fn c_a_frontend_that_stops_reading_does_not_stop_the_other_flows() {
    const FLOOD: usize = 1 << 30;
    let echo_dest = Destination::echo().unwrap();
    let echo_addr = echo_dest.addr().to_string();
    for engine in available_engines() {
        let rig = Rig::start(engine, true, NOT_BEFORE_THE_OTHERS);
        let (source_addr, outcome) = source(FLOOD);
        let (socket, echo_addr) = (rig.socket.clone(), echo_addr.clone());
        let open_when_others_done = block_on(engine, async move {
            // The flow whose frontend never reads: its destination floods.
            let fe_stuck = GrpcFrontend::connect_unix(&socket).await.unwrap();
            let _stuck = fe_stuck.dial(&source_addr, WAIT).await.unwrap();
            let fe = GrpcFrontend::connect_unix(&socket).await.unwrap();
            echo_flows(&fe, &echo_addr, 4, 4 << 20).await;
            // The destination is still sending (blocked): not closed yet.
            let open_when_others_done = outcome.try_recv().is_err();
            fe.close().await;
            fe_stuck.close().await;
            open_when_others_done
        })
        .unwrap();
        assert!(
            open_when_others_done,
            "{engine}: the others finished while the stuck flow was still open"
        );
        drop(rig);
    }
}

#[test]
fn c_a_frontend_that_stops_reading_is_closed_after_the_stuck_timeout() {
    const FLOOD: usize = 1 << 30;
    for engine in available_engines() {
        let rig = Rig::start(engine, true, SHORT_STUCK);
        let (source_addr, outcome) = source(FLOOD);
        let socket = rig.socket.clone();
        let (got, error, outcome) = block_on(engine, async move {
            let fe_stuck = GrpcFrontend::connect_unix(&socket).await.unwrap();
            let stuck = fe_stuck.dial(&source_addr, WAIT).await.unwrap();
            // After the stuck timeout the server closes the flow: the agent
            // closes the destination's connection.
            let deadline = Instant::now() + SHORT_STUCK + WAIT;
            let ended = loop {
                if let Ok(r) = outcome.try_recv() {
                    break r;
                }
                assert!(Instant::now() < deadline, "the stuck flow was never closed");
                monoio::time::sleep(Duration::from_millis(20)).await;
            };
            // Now read the stuck flow: what was queued for it, in order,
            // then CLOSE_RSP with the server's error.
            let mut got = Vec::new();
            while let Some(b) = stuck.read(WAIT).await.unwrap() {
                got.extend_from_slice(&b);
            }
            let error = stuck.close_error();
            fe_stuck.close().await;
            (got, error, ended)
        })
        .unwrap();
        let (sent, failed) = outcome;
        assert_eq!(error.as_deref(), Some(FRONTEND_STUCK), "{engine}");
        assert!(failed, "{engine}: the destination's connection was closed");
        assert!(sent < FLOOD, "{engine}: flow control stopped the flood");
        assert!(got.len() <= sent);
        assert!(
            got == pattern(got.len(), 7),
            "{engine}: what arrived is an intact prefix"
        );
        drop(rig);
    }
}
