//! Resumable tunnels on real sockets (docs/design/resume.md): an
//! in-process proxy-server and proxy-agent (both with `--resume-window`),
//! the testkit's chaos proxy between them, gRPC frontends and a real echo
//! destination, under each io engine. The tunnel is cut — RST on the
//! connection, and the path blackholed for a while so the reconnects fail
//! too — and what was proxied must go on byte-exact when the cut is
//! shorter than the window, and close cleanly, with everything back to
//! baseline, when it is longer.

// The chaos proxy, the waits and the outages read the real clock.
#![allow(clippy::disallowed_methods)]

use std::path::PathBuf;
use std::time::{Duration, Instant};

use konn_agent::run::{self, AgentHandle};
use konn_agent::settings::AgentSettings;
use konn_core::io::runtime::{Engine, available_engines, block_on};
use konn_server::serve::{ServerHandle, start};
use konn_server::settings::{FrontendListen, Mode, ServerSettings};
use konn_testkit::chaos::{ChaosProxy, Faults};
use konn_testkit::dest::Destination;
use konn_testkit::frontend::{GrpcFrontend, Tunnel};
use konn_testkit::wait::wait_until;
use konn_testkit::{Pattern, engine_flag};

/// Upper bound of any single wait.
const WAIT: Duration = Duration::from_secs(60);

/// The resume window both sides run with.
const WINDOW: Duration = Duration::from_secs(5);

/// A server with two workers, an agent with two, the chaos proxy between
/// them.
struct Rig {
    server: Option<ServerHandle>,
    agent: Option<AgentHandle>,
    chaos: ChaosProxy,
    socket: PathBuf,
    _dir: tempfile::TempDir,
}

impl Rig {
    fn start(engine: Engine, window: Duration) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let mut settings =
            ServerSettings::for_tests(FrontendListen::Unix(dir.path().join("s.sock")), Mode::Grpc);
        settings.runtime.workers = 2;
        settings.runtime.engine = engine_flag(engine);
        settings.resume_window = window;
        let server = start(settings).unwrap();
        let socket = server.frontend_path().unwrap().to_path_buf();
        let chaos = ChaosProxy::start(server.agent_addr()).unwrap();
        let mut a = AgentSettings::for_tests(chaos.addr().to_string(), "agent-resume");
        a.runtime.engine = engine_flag(engine);
        a.connect.settings.resume_window = window;
        let agent = run::start(a).unwrap();
        let rig = Self {
            server: Some(server),
            agent: Some(agent),
            chaos,
            socket,
            _dir: dir,
        };
        assert!(
            wait_until(WAIT, || rig.server_metric(
                "konnectivity_network_proxy_server_ready_backend_connections"
            ) >= 1.0),
            "{engine}: the agent never connected"
        );
        rig
    }

    fn server(&self) -> &ServerHandle {
        self.server.as_ref().unwrap()
    }

    /// The sum of a metric's series on the server (0 when absent).
    fn server_metric(&self, name: &str) -> f64 {
        metric(&self.server().metrics().registry().render_to_string(), name)
    }

    /// The same on the agent.
    fn agent_metric(&self, name: &str) -> f64 {
        let agent = self.agent.as_ref().unwrap();
        metric(&agent.metrics().registry().render_to_string(), name)
    }

    /// Cut the tunnel: the path swallows everything, the open connection
    /// is reset on both sides, and the path heals after `outage`.
    async fn cut(&self, outage: Duration) {
        self.chaos.set_both(Faults {
            blackhole: true,
            ..Faults::default()
        });
        self.chaos.reset();
        monoio::time::sleep(outage).await;
        self.chaos.heal();
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        if let Some(a) = self.agent.take() {
            let _ = a.stop();
        }
        if let Some(s) = self.server.take() {
            let _ = s.stop();
        }
    }
}

/// The sum of the series of `name` (exactly that name, any labels) in a
/// scrape.
fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with(' ') || rest.starts_with('{'))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// One interactive round: `n` bytes out, the same back.
async fn round(t: &Tunnel, seed: u64, n: usize) -> bool {
    let mut data = vec![0u8; n];
    Pattern::new(seed).fill(&mut data);
    t.write(&data).await.unwrap();
    t.read_exact(n, WAIT).await.unwrap() == data
}

#[test]
fn a_cut_below_the_window_keeps_an_echo_alive() {
    let echo = Destination::echo().unwrap();
    let dest = echo.addr().to_string();
    for engine in available_engines() {
        let rig = Rig::start(engine, WINDOW);
        let resumed = r#"konn_resumes_total{result="resumed"}"#;
        block_on(engine, async {
            let fe = GrpcFrontend::connect_unix(&rig.socket).await.unwrap();
            let t = fe.dial(&dest, WAIT).await.unwrap();
            assert!(round(&t, 1, 64 << 10).await, "{engine}: before the cut");
            let started = Instant::now();
            let cut = rig.cut(Duration::from_secs(1));
            // What the frontend sends during the outage waits for the
            // resume.
            let mut during = vec![0u8; 16 << 10];
            Pattern::new(2).fill(&mut during);
            let (_, w) = konn_core::io::runtime::join(cut, t.write(&during)).await;
            w.unwrap();
            let back = t.read_exact(during.len(), WAIT).await.unwrap();
            assert!(back == during, "{engine}: the echo across the cut differs");
            eprintln!(
                "{engine}: the echo across a 1 s cut came back after {:?}",
                started.elapsed()
            );
            for seed in 3..6 {
                assert!(round(&t, seed, 256 << 10).await, "{engine}: after the cut");
            }
            t.close(WAIT).await.unwrap();
            fe.close().await;
        })
        .unwrap();
        assert!(
            rig.server_metric(resumed) >= 1.0,
            "{engine}: server resumed"
        );
        assert!(rig.agent_metric(resumed) >= 1.0, "{engine}: agent resumed");
        assert!(
            wait_until(WAIT, || rig.server_metric("konn_resume_parked_tunnels")
                == 0.0
                && rig.agent_metric("konn_resume_parked_tunnels") == 0.0
                && rig
                    .server()
                    .shared()
                    .established
                    .load(std::sync::atomic::Ordering::Relaxed)
                    == 0),
            "{engine}: back to baseline"
        );
    }
}
