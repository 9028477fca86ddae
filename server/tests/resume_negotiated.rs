//! `konn-resume` negotiated over real sockets, under each io engine: an
//! in-process proxy-server and a konn agent tunnel that both offer it,
//! gRPC frontends, a real echo destination (docs/design/resume.md). With
//! resume negotiated every DATA is counted, acknowledged and kept for
//! replay until acknowledged; concurrent bulk echoes must still arrive
//! byte-exact (SHA-256) through an agent whose buffer budget is smaller
//! than what they move (so acknowledged bytes are released), and a side
//! that offers it to one that does not gets upstream's protocol. (Parking across a broken tunnel:
//! `sim_resume.rs` in memory, `resume.rs` on real sockets.)

// The agent thread and the wait for its connection read the real clock.
#![allow(clippy::disallowed_methods)]

use std::cell::RefCell;
use std::path::PathBuf;
use std::rc::Rc;
use std::time::{Duration, Instant};

use konn_agent::client::{ConnectParams, run_tunnel};
use konn_agent::conn::{TunnelEvent, TunnelSettings};
use konn_core::io::driver::DriverConfig;
use konn_core::io::pool::{BufPool, MemoryBudget, PoolConfig};
use konn_core::io::runtime::{Engine, IoEngine, available_engines, block_on, join};
use konn_server::serve::{ServerHandle, start};
use konn_server::settings::{FrontendListen, Mode, ServerSettings};
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

/// A server with one worker and one konn agent tunnel to it; `server` /
/// `agent`: whether each offers resume. `resumed` tells what the agent
/// learnt from the server's answer.
struct Rig {
    server: Option<ServerHandle>,
    socket: PathBuf,
    agent: Option<std::thread::JoinHandle<()>>,
    resumed: std::sync::mpsc::Receiver<bool>,
    _dir: tempfile::TempDir,
}

impl Rig {
    fn start(engine: Engine, server_resume: bool, agent_resume: bool) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let mut settings =
            ServerSettings::for_tests(FrontendListen::Unix(dir.path().join("s.sock")), Mode::Grpc);
        settings.runtime.workers = 1;
        settings.runtime.engine = engine_flag(engine);
        settings.resume_window = if server_resume {
            Duration::from_secs(5)
        } else {
            Duration::ZERO
        };
        let server = start(settings).unwrap();
        let socket = server.frontend_path().unwrap().to_path_buf();
        let address = server.agent_addr().to_string();
        let (tx, resumed) = std::sync::mpsc::channel();
        let agent = std::thread::spawn(move || {
            let _ = block_on(engine, async move {
                // Less than the 32 MiB echoed: replay buffers must be
                // released by the server's ACKs, or the pool runs dry.
                let budget = MemoryBudget::new(16 << 20);
                let pool = BufPool::new(&budget, &PoolConfig::default());
                let params = ConnectParams {
                    address,
                    tls: None,
                    agent_id: "agent-resume".into(),
                    agent_identifiers: String::new(),
                    token_path: None,
                    keepalive_time: Duration::from_secs(3600),
                    connect_timeout: Duration::from_secs(5),
                    settings: TunnelSettings {
                        resume_window: if agent_resume {
                            Duration::from_secs(5)
                        } else {
                            Duration::ZERO
                        },
                        ..TunnelSettings::default()
                    },
                    driver: DriverConfig::default(),
                };
                let report = Box::new(move |e: TunnelEvent| {
                    if let TunnelEvent::Connected { resume, .. } = e {
                        let _ = tx.send(resume);
                    }
                });
                let _ = run_tunnel(Rc::new(params), pool, report).await;
            });
        });
        Self {
            server: Some(server),
            socket,
            agent: Some(agent),
            resumed,
            _dir: dir,
        }
    }

    /// Whether the tunnel negotiated resume (waits for it to connect).
    fn negotiated(&self) -> bool {
        let r = self
            .resumed
            .recv_timeout(WAIT)
            .expect("the agent connected");
        let deadline = Instant::now() + WAIT;
        let backends = || {
            self.server
                .as_ref()
                .unwrap()
                .shared()
                .backends
                .load(std::sync::atomic::Ordering::Relaxed)
        };
        while backends() == 0 {
            assert!(Instant::now() < deadline, "the server has no backend");
            std::thread::sleep(Duration::from_millis(10));
        }
        r
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        if let Some(s) = self.server.take() {
            let _ = s.stop();
        }
        if let Some(a) = self.agent.take() {
            let _ = a.join();
        }
    }
}

fn pattern(n: usize, seed: u64) -> Vec<u8> {
    (0..n as u64)
        .map(|i| ((i ^ seed).wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect()
}

async fn echo(t: &Tunnel, data: &[u8]) -> Vec<u8> {
    let (w, r) = join(t.write(data), t.read_exact(data.len(), WAIT)).await;
    w.unwrap();
    r.unwrap()
}

/// `flows` concurrent echoes of `size` bytes; returns the SHA-256 of each
/// echo next to that of what was sent.
async fn echoes(fe: &GrpcFrontend, dest: &str, flows: usize, size: usize) -> Vec<(String, String)> {
    let mut tunnels = Vec::new();
    for _ in 0..flows {
        tunnels.push(Rc::new(fe.dial(dest, WAIT).await.unwrap()));
    }
    let out = Rc::new(RefCell::new(Vec::new()));
    let mut tasks = Vec::new();
    for (i, t) in tunnels.into_iter().enumerate() {
        let out = out.clone();
        tasks.push(monoio::spawn(async move {
            let data = pattern(size, i as u64);
            let back = echo(&t, &data).await;
            out.borrow_mut()
                .push((sha256_hex(&data), sha256_hex(&back)));
            let t = Rc::try_unwrap(t).ok().unwrap();
            t.close(WAIT).await.unwrap();
        }));
    }
    for t in tasks {
        t.await;
    }
    out.take()
}

#[test]
fn concurrent_echoes_are_byte_exact_with_resume_negotiated() {
    let echo_dest = Destination::echo().unwrap();
    let dest = echo_dest.addr().to_string();
    for engine in available_engines() {
        let rig = Rig::start(engine, true, true);
        assert!(rig.negotiated(), "{engine}: resume negotiated");
        let socket = rig.socket.clone();
        let dest = dest.clone();
        let hashes = block_on(engine, async move {
            let fe = GrpcFrontend::connect_unix(&socket).await.unwrap();
            let h = echoes(&fe, &dest, 8, 4 << 20).await;
            fe.close().await;
            h
        })
        .unwrap();
        assert_eq!(hashes.len(), 8, "{engine}");
        for (sent, back) in hashes {
            assert_eq!(sent, back, "{engine}: an echo differs");
        }
    }
}

#[test]
fn resume_needs_both_sides() {
    for (server, agent) in [(false, true), (true, false)] {
        let engine = available_engines()[0];
        let rig = Rig::start(engine, server, agent);
        assert!(!rig.negotiated(), "server {server} agent {agent}");
    }
}
