//! `ServerHandle::stop` ends every connection (agents, gRPC frontends,
//! half-open sockets) and releases every descriptor, under each io engine.
//! One test in its own binary, so no other test opens descriptors meanwhile.

use std::io::Read;
use std::rc::Rc;
use std::time::Duration;

use konn_agent::client::{ConnectParams, run_tunnel};
use konn_agent::conn::TunnelSettings;
use konn_core::io::driver::DriverConfig;
use konn_core::io::pool::{BufPool, MemoryBudget, PoolConfig};
use konn_core::io::runtime::{Engine, IoEngine, available_engines, block_on};
use konn_server::serve::start;
use konn_server::settings::{FrontendListen, Mode, ServerSettings};
use konn_testkit::dest::Destination;
use konn_testkit::fds::{fd_targets, open_fds};
use konn_testkit::frontend::GrpcFrontend;

/// Wait (bounded) for the descriptor count to come back to `base`.
fn settles_to(base: usize) -> usize {
    for _ in 0..300 {
        let n = open_fds();
        if n <= base {
            return n;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    open_fds()
}

/// Join `t`, failing the test if it has not ended within `limit`.
fn join_within<T>(t: std::thread::JoinHandle<T>, limit: Duration, what: &str) -> T {
    for _ in 0..limit.as_millis() / 10 {
        if t.is_finished() {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(
        t.is_finished(),
        "{what} still running {limit:?} after stop()"
    );
    t.join().unwrap()
}

fn engine_flag(e: Engine) -> IoEngine {
    match e {
        Engine::IoUring => IoEngine::IoUring,
        Engine::Epoll => IoEngine::Epoll,
    }
}

#[test]
fn stop_closes_every_connection_and_frees_every_descriptor() {
    let echo = Destination::echo().unwrap();
    let dest = echo.addr().to_string();
    for engine in available_engines().into_iter().rev() {
        let dir = tempfile::tempdir().unwrap();
        let base = open_fds();
        let before = fd_targets();
        let mut settings =
            ServerSettings::for_tests(FrontendListen::Unix(dir.path().join("s.sock")), Mode::Grpc);
        settings.runtime.workers = 2;
        settings.runtime.engine = engine_flag(engine);
        let server = start(settings).unwrap();
        let socket = server.frontend_path().unwrap().to_path_buf();

        let address = server.agent_addr().to_string();
        let agent = std::thread::spawn(move || {
            block_on(engine, async move {
                let budget = MemoryBudget::new(16 << 20);
                let pool = BufPool::new(&budget, &PoolConfig::default());
                let params = ConnectParams {
                    address,
                    tls: None,
                    agent_id: "agent-stop".into(),
                    agent_identifiers: String::new(),
                    token_path: None,
                    keepalive_time: Duration::from_secs(3600),
                    connect_timeout: Duration::from_secs(5),
                    settings: TunnelSettings::default(),
                    driver: DriverConfig::default(),
                };
                run_tunnel(Rc::new(params), pool, Box::new(|_| {})).await
            })
        });
        for _ in 0..500 {
            if server
                .shared()
                .backends
                .load(std::sync::atomic::Ordering::Relaxed)
                > 0
            {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }

        // A frontend with an open tunnel, waiting for data when the server stops.
        let (tx, rx) = std::sync::mpsc::channel();
        let sock = socket.clone();
        let dest2 = dest.clone();
        let client = std::thread::spawn(move || {
            block_on(engine, async move {
                let fe = GrpcFrontend::connect_unix(&sock).await.unwrap();
                let t = fe.dial(&dest2, Duration::from_secs(10)).await.unwrap();
                t.write(b"ping").await.unwrap();
                let got = t.read_exact(4, Duration::from_secs(10)).await.unwrap();
                assert_eq!(got, b"ping");
                tx.send(()).unwrap();
                // Ends when the server closes the call.
                let end = t.read(Duration::from_secs(20)).await;
                assert!(end.is_err() || matches!(end, Ok(None)), "{end:?}");
                fe.close().await;
            })
            .unwrap();
        });
        rx.recv_timeout(Duration::from_secs(20)).unwrap();
        // A socket that never says anything.
        let mut silent = std::os::unix::net::UnixStream::connect(&socket).unwrap();

        server.stop().unwrap();

        silent
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let mut buf = Vec::new();
        let _ = silent.read_to_end(&mut buf); // EOF (after the server's preface), not a timeout
        drop(silent);
        join_within(client, Duration::from_secs(5), "the frontend client");
        // The tunnel ended (how does not matter here), so the thread ends.
        let _ = join_within(agent, Duration::from_secs(5), "the agent tunnel");
        drop(dir);
        let now = settles_to(base);
        if now != base {
            for f in ["/proc/net/tcp", "/proc/net/tcp6", "/proc/net/unix"] {
                eprintln!("{f}:\n{}", std::fs::read_to_string(f).unwrap_or_default());
            }
            let threads: Vec<String> = std::fs::read_dir("/proc/self/task")
                .into_iter()
                .flatten()
                .flatten()
                .map(|t| {
                    let p = t.path();
                    format!(
                        "{}:{} {}",
                        t.file_name().to_string_lossy(),
                        std::fs::read_to_string(p.join("comm"))
                            .unwrap_or_default()
                            .trim(),
                        std::fs::read_to_string(p.join("stack")).unwrap_or_default()
                    )
                })
                .collect();
            eprintln!("threads: {threads:?}");
        }
        assert_eq!(
            now,
            base,
            "{engine}: descriptors leaked by stop(): before {before:?}, after {:?}",
            fd_targets()
        );
    }
}
