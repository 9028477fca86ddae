//! Shared set-up of the proxy-server acceptance suite (`e2e_*.rs`): an
//! in-process proxy-server on real sockets (gRPC or HTTP CONNECT frontend,
//! over a Unix socket or TCP with mTLS), konn agents (the full agent
//! runtime), frontends from konn-testkit, and the leak check every scenario
//! ends with: no frontend, pending dial, established connection or agent
//! endpoint left, every descriptor given back and every thread of the
//! parts under test ended.
//!
//! Descriptor counts are per process, so the tests of one binary take
//! [`serial`] first.

#![allow(dead_code, unreachable_pub, unused_imports)]

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::Duration;

use konn_agent::run::{self, AgentHandle};
use konn_agent::settings::AgentSettings;
use konn_core::io::runtime::Engine;
use konn_core::io::tls::{ClientTls, ClientTlsOptions, PemSource, ServerTls, ServerTlsOptions};
use konn_protocol::server::backends::Strategy;
use konn_server::serve::{ServerHandle, start};
use konn_server::settings::{FrontendListen, Mode, ServerSettings};
use konn_testkit::connect::{ConnectTunnel, Requested, http1_tls};
pub use konn_testkit::engine_flag;
pub use konn_testkit::fds::{assert_fds_back_to, fd_targets, open_fds};
pub use konn_testkit::files::TempDir;
use konn_testkit::frontend::GrpcFrontend;
use konn_testkit::pki::PkiFiles;
pub use konn_testkit::wait::{WAIT as T, wait_until};

/// Holds konn-testkit's descriptor-counting lock (the tests of one binary
/// must not overlap). The process-wide parts konn creates once (the
/// blocking-call thread pool of `konn_core::io::runtime`) exist from then
/// on, so they are not counted as a scenario's threads.
#[allow(clippy::disallowed_types)]
pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    let guard = konn_testkit::fds::serial();
    konn_core::io::runtime::block_on(Engine::Epoll, async {}).unwrap();
    guard
}

/// A throw-away PKI on disk (konn-testkit's), and the TLS settings of each
/// party built from it.
pub struct Pki {
    pub files: PkiFiles,
    _dir: TempDir,
}

impl Pki {
    pub fn new() -> Self {
        let dir = TempDir::new("pki");
        let files = konn_testkit::pki::write(&dir.0).unwrap();
        Self { files, _dir: dir }
    }

    /// The server's side of a port that requires client certificates
    /// signed by the CA (the frontend port over TCP, the agent port).
    pub fn server_mtls(&self) -> ServerTls {
        let f = &self.files;
        let mut o = ServerTlsOptions::new(
            PemSource::File(f.server_cert.clone()),
            PemSource::File(f.server_key.clone()),
        );
        o.client_ca = Some(PemSource::File(f.ca_cert.clone()));
        o.build().unwrap()
    }

    fn client(&self, cert: &Path, key: &Path) -> ClientTls {
        let mut o = ClientTlsOptions::new(PemSource::File(self.files.ca_cert.clone()), "127.0.0.1");
        o.identity = Some((
            PemSource::File(cert.to_owned()),
            PemSource::File(key.to_owned()),
        ));
        o.build().unwrap()
    }

    /// kube-apiserver's client certificate (gRPC: ALPN h2).
    pub fn frontend_client(&self) -> ClientTls {
        self.client(&self.files.frontend_cert, &self.files.frontend_key)
    }

    /// The agent's client certificate.
    pub fn agent_client(&self) -> ClientTls {
        self.client(&self.files.agent_cert, &self.files.agent_key)
    }
}

/// How frontends reach the server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    /// A Unix socket, plaintext (`--uds-name`).
    Unix,
    /// TCP with mTLS (`--server-port`); the agent port uses mTLS too.
    Tls,
}

/// A change to the settings before the server starts.
pub type Tweak<'a> = Box<dyn FnOnce(&mut ServerSettings) + 'a>;

/// What to start.
pub struct ServerSpec<'a> {
    pub engine: Engine,
    pub mode: Mode,
    pub transport: Transport,
    pub dir: &'a TempDir,
    pub pki: Option<&'a Pki>,
    pub workers: usize,
    pub strategies: Vec<Strategy>,
    /// The agent port's address (default: any free port).
    pub agent_addr: Option<std::net::SocketAddr>,
    /// Adjust the settings further.
    pub tweak: Option<Tweak<'a>>,
}

impl<'a> ServerSpec<'a> {
    pub fn new(engine: Engine, mode: Mode, transport: Transport, dir: &'a TempDir) -> Self {
        Self {
            engine,
            mode,
            transport,
            dir,
            pki: None,
            workers: 2,
            strategies: vec![Strategy::Default],
            agent_addr: None,
            tweak: None,
        }
    }

    pub fn start(self) -> TestServer {
        let frontend = match self.transport {
            Transport::Unix => FrontendListen::Unix(self.dir.path("konn.sock")),
            Transport::Tls => FrontendListen::Tcp("127.0.0.1:0".parse().unwrap()),
        };
        let mut s = ServerSettings::for_tests(frontend, self.mode);
        s.runtime.workers = self.workers;
        s.runtime.engine = engine_flag(self.engine);
        s.strategies = self.strategies;
        if let Some(a) = self.agent_addr {
            s.agent_addr = a;
        }
        let mut frontend_tls = None;
        let mut agent_tls = None;
        if self.transport == Transport::Tls {
            let pki = self.pki.expect("TLS needs a PKI");
            s.frontend_tls = Some(pki.server_mtls());
            s.agent_tls = Some(pki.server_mtls());
            frontend_tls = Some(match self.mode {
                Mode::Grpc => pki.frontend_client(),
                Mode::HttpConnect => http1_tls(&pki.frontend_client()),
            });
            agent_tls = Some(pki.agent_client());
        }
        if let Some(t) = self.tweak {
            t(&mut s);
        }
        let handle = start(s).unwrap();
        TestServer {
            engine: self.engine,
            mode: self.mode,
            handle: Some(handle),
            frontend_tls,
            agent_tls,
        }
    }
}

/// A running in-process proxy-server.
pub struct TestServer {
    pub engine: Engine,
    pub mode: Mode,
    pub handle: Option<ServerHandle>,
    frontend_tls: Option<ClientTls>,
    agent_tls: Option<ClientTls>,
}

/// Where and how a frontend connects (cheap to clone into tasks).
#[derive(Clone)]
pub struct FrontendAddr {
    pub unix: Option<PathBuf>,
    pub tcp: Option<String>,
    pub tls: Option<ClientTls>,
}

impl FrontendAddr {
    /// A new gRPC frontend connection (one per dial, as kube-apiserver).
    pub async fn grpc(&self) -> Result<GrpcFrontend, konn_testkit::Error> {
        match (&self.unix, &self.tcp, &self.tls) {
            (Some(p), _, _) => GrpcFrontend::connect_unix(p).await,
            (None, Some(a), Some(tls)) => GrpcFrontend::connect_tls(a, tls).await,
            _ => unreachable!("a server has a frontend"),
        }
    }

    /// A CONNECT request to `target`, its answer not read yet.
    pub async fn connect_request(&self, target: &str) -> Result<Requested, konn_testkit::Error> {
        match (&self.unix, &self.tcp, &self.tls) {
            (Some(p), _, _) => ConnectTunnel::request_unix(p, target).await,
            (None, Some(a), Some(tls)) => ConnectTunnel::request_tls(a, tls, target).await,
            _ => unreachable!("a server has a frontend"),
        }
    }

    /// A CONNECT to `target` through the server.
    pub async fn connect(&self, target: &str) -> Result<ConnectTunnel, konn_testkit::Error> {
        match (&self.unix, &self.tcp, &self.tls) {
            (Some(p), _, _) => ConnectTunnel::unix(p, target, T).await,
            (None, Some(a), Some(tls)) => ConnectTunnel::tls(a, tls, target, T).await,
            _ => unreachable!("a server has a frontend"),
        }
    }
}

/// The server's per-connection counters and tables, all zero when idle.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Load {
    pub proxy_streams: usize,
    pub http_connections: usize,
    pub pending_dials: i64,
    pub established: i64,
    /// `pending_backend_dials` as /metrics reports it.
    pub pending_metric: i64,
    /// `established_connections` as /metrics reports it.
    pub established_metric: i64,
}

impl TestServer {
    pub fn h(&self) -> &ServerHandle {
        self.handle.as_ref().unwrap()
    }

    pub fn agent_addr(&self) -> std::net::SocketAddr {
        self.h().agent_addr()
    }

    pub fn frontend(&self) -> FrontendAddr {
        FrontendAddr {
            unix: self.h().frontend_path().map(Path::to_path_buf),
            tcp: self.h().frontend_addr().map(|a| a.to_string()),
            tls: self.frontend_tls.clone(),
        }
    }

    /// Agent tunnels the server holds now.
    pub fn backends(&self) -> usize {
        self.h().shared().backends.load(Ordering::Acquire)
    }

    pub fn load(&self) -> Load {
        let s = self.h().shared();
        let text = self.h().metrics().registry().render_to_string();
        let gauge = |name: &str| {
            metric(&text, &format!("konnectivity_network_proxy_server_{name}")).unwrap_or(-1.0)
                as i64
        };
        Load {
            proxy_streams: s.proxy_streams.load(Ordering::Acquire),
            http_connections: s.http_connections.load(Ordering::Acquire),
            pending_dials: s.pending_dials.load(Ordering::Acquire),
            established: s.established.load(Ordering::Acquire),
            pending_metric: gauge("pending_backend_dials"),
            established_metric: gauge("established_connections"),
        }
    }

    /// An agent (the full runtime, one worker) connected to this server
    /// (or to `via`, a balancer in front of it), with `identifiers`.
    pub fn agent(&self, id: &str, identifiers: &str, via: Option<std::net::SocketAddr>) -> Agent {
        self.agent_with(id, identifiers, via, |_| {})
    }

    /// [`TestServer::agent`] with its settings adjusted by `tweak`.
    pub fn agent_with(
        &self,
        id: &str,
        identifiers: &str,
        via: Option<std::net::SocketAddr>,
        tweak: impl FnOnce(&mut AgentSettings),
    ) -> Agent {
        let address = via.unwrap_or_else(|| self.agent_addr()).to_string();
        let mut s = AgentSettings::for_tests(address, id);
        s.runtime.engine = engine_flag(self.engine);
        s.runtime.workers = 1;
        s.connect.agent_identifiers = identifiers.to_owned();
        s.connect.tls = self.agent_tls.clone();
        tweak(&mut s);
        Agent::start(s)
    }

    pub fn stop(&mut self) {
        if let Some(h) = self.handle.take() {
            h.stop().unwrap();
        }
    }
}

/// A running agent.
pub struct Agent {
    pub handle: Option<AgentHandle>,
}

impl Agent {
    pub fn start(settings: AgentSettings) -> Self {
        Self {
            handle: Some(run::start(settings).unwrap()),
        }
    }

    pub fn h(&self) -> &AgentHandle {
        self.handle.as_ref().unwrap()
    }

    /// `open_endpoint_connections`: destinations the agent holds open.
    pub fn endpoints(&self) -> i64 {
        let text = self.h().metrics().registry().render_to_string();
        // (No series before the first endpoint.)
        metric(
            &text,
            "konnectivity_network_proxy_agent_open_endpoint_connections",
        )
        .unwrap_or(0.0) as i64
    }

    pub fn stop(&mut self) {
        if let Some(h) = self.handle.take() {
            h.stop().unwrap();
        }
    }
}

/// The value of the metric line starting with `series ` in a scrape.
pub fn metric(scrape: &str, series: &str) -> Option<f64> {
    scrape.lines().find_map(|l| {
        l.strip_prefix(series)
            .and_then(|rest| rest.strip_prefix(' '))
            .and_then(|v| v.parse().ok())
    })
}

/// A [`Tweak`] that turns the audit log on, into `path`.
pub fn audit_to<'a>(path: PathBuf) -> Tweak<'a> {
    Box::new(move |s| {
        s.observe.audit = Some(konn_server::audit::AuditConfig {
            sink: konn_server::audit::Sink::File(path),
            max_size: 0,
            max_backups: 0,
            queue: 4096,
        });
    })
}

/// [`audit_to`] and then `more`.
pub fn audit_and<'a>(path: PathBuf, more: impl FnOnce(&mut ServerSettings) + 'a) -> Tweak<'a> {
    let log = audit_to(path);
    Box::new(move |s| {
        log(s);
        more(s);
    })
}

/// The audit records at `path` as `result/reason` words, sorted.
pub fn audited_outcomes(path: &Path) -> Vec<String> {
    let mut out: Vec<String> = std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).ok()?;
            Some(format!(
                "{}/{}",
                v["result"].as_str()?,
                v["reason"].as_str()?
            ))
        })
        .collect();
    out.sort();
    out
}

/// With every connection closed: the audit log at `path` holds exactly one
/// record per ended connection or dial (`konn_connections_ended_total`),
/// with one `closed` record per connection established (counted apart, by
/// `dial_duration_seconds`), each a JSON object, and nothing was dropped.
pub fn assert_audited(server: &TestServer, path: &Path, what: &str) {
    let text = || server.h().metrics().registry().render_to_string();
    let ended = || -> f64 {
        text()
            .lines()
            .filter(|l| l.starts_with("konn_connections_ended_total{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    let lines = || -> Vec<String> {
        std::fs::read_to_string(path)
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    };
    assert!(
        wait_until(T, || lines().len() as f64 == ended()),
        "{what}: {} audit records, {} ended connections and dials",
        lines().len(),
        ended()
    );
    let established = metric(
        &text(),
        "konnectivity_network_proxy_server_dial_duration_seconds_count",
    )
    .unwrap_or(0.0);
    let closed = lines()
        .iter()
        .filter(|l| {
            assert!(l.starts_with('{') && l.ends_with('}'), "{what}: {l}");
            l.contains("\"result\":\"closed\"")
        })
        .count();
    assert_eq!(closed as f64, established, "{what}: closed records");
    assert_eq!(
        metric(&text(), "konn_audit_records_dropped_total"),
        Some(0.0)
    );
}

/// [`assert_audited`], and the bytes: the `closed` records' payload bytes
/// each way are, as a multiset, exactly what the destinations' sockets
/// counted for the connections of this scenario
/// (`konn_testkit::dest::take_transfers`; call that at the scenario's start
/// to forget earlier ones, and this after [`assert_idle`], when every
/// destination connection ended). For scenarios whose connections all end
/// cleanly (each side read what the other sent); connections that moved
/// nothing either way are left out of both sides (a dial cancelled after
/// the agent connected leaves one at the destination and none closed).
pub fn assert_audited_bytes(server: &TestServer, path: &Path, what: &str) {
    assert_audited(server, path, what);
    let records = std::fs::read_to_string(path).unwrap_or_default();
    let mut audited: Vec<(u64, u64)> = records
        .lines()
        .filter_map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).ok()?;
            (v["result"] == "closed").then(|| {
                (
                    v["bytes_to_agent"].as_u64().unwrap_or(u64::MAX),
                    v["bytes_from_agent"].as_u64().unwrap_or(u64::MAX),
                )
            })
        })
        .filter(|b| *b != (0, 0))
        .collect();
    let mut counted: Vec<(u64, u64)> = konn_testkit::dest::take_transfers()
        .into_iter()
        .map(|t| (t.received, t.sent))
        .filter(|b| *b != (0, 0))
        .collect();
    audited.sort_unstable();
    counted.sort_unstable();
    assert_eq!(
        audited, counted,
        "{what}: audited bytes (to, from the destination) differ from what the destinations counted"
    );
    assert!(!audited.is_empty(), "{what}: no bytes audited at all");
}

/// Waits until `server` holds `n` agent tunnels, or panics.
pub fn wait_backends(server: &TestServer, n: usize) {
    assert!(
        wait_until(T, || server.backends() == n),
        "the server holds {} agent tunnels, expected {n}",
        server.backends()
    );
}

/// The process's resources at one moment: descriptors, and the threads
/// of the parts under test (see [`component_threads`]).
#[derive(Clone, Copy, Debug)]
pub struct Baseline {
    pub fds: usize,
    pub threads: usize,
}

impl Baseline {
    pub fn take() -> Self {
        Self {
            fds: open_fds(),
            threads: component_threads().len(),
        }
    }
}

/// Threads named by konn (`konn-worker-*`, `konn-agent-*`) and the
/// per-connection threads of the test tools (`dest-conn`, `lb-relay`:
/// they end when konn closes their connection); not the tools' accept
/// threads, nor libtest's.
pub fn component_threads() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir("/proc/self/task")
        .map(|d| {
            d.filter_map(Result::ok)
                .filter_map(|t| std::fs::read_to_string(t.path().join("comm")).ok())
                .map(|n| n.trim_end().to_owned())
                .filter(|n| {
                    ["konn-", "dest-conn", "lb-relay"]
                        .iter()
                        .any(|p| n.starts_with(p))
                })
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// After everything a scenario started has stopped: descriptors and
/// threads back to `before` (waits, bounded, for other threads to let go).
pub fn assert_released(before: Baseline, what: &str) {
    let ok = wait_until(T, || {
        open_fds() <= before.fds && component_threads().len() <= before.threads
    });
    assert!(
        ok,
        "{what}: {} descriptors open (before: {}), threads {:?} (before: {}): {:?}",
        open_fds(),
        before.fds,
        component_threads(),
        before.threads,
        fd_targets()
    );
}

/// The leak check after a scenario, with the set-up still running: no
/// frontend stream or CONNECT connection, no pending dial, no established
/// connection (counters and /metrics), no agent endpoint, and no
/// descriptor more than when it was idle. Waits (bounded) for all of it.
pub fn assert_idle(server: &TestServer, agents: &[&Agent], idle: Baseline, what: &str) {
    let clean = || {
        server.load() == Load::default()
            && agents.iter().all(|a| a.endpoints() == 0)
            && open_fds() <= idle.fds
            && component_threads().len() <= idle.threads
    };
    assert!(
        wait_until(T, clean),
        "{what}: left behind: server {:?}, agent endpoints {:?}, threads {:?} (idle: {}), {} descriptors open (idle: {}): {:?}",
        server.load(),
        agents.iter().map(|a| a.endpoints()).collect::<Vec<_>>(),
        component_threads(),
        idle.threads,
        open_fds(),
        idle.fds,
        fd_targets()
    );
}

/// Polls `cond` (bounded by [`T`]) without blocking the runtime.
pub async fn wait_until_async(mut cond: impl FnMut() -> bool) -> bool {
    let deadline = konn_core::io::clock::now() + T;
    while !cond() {
        if konn_core::io::clock::now() >= deadline {
            return false;
        }
        monoio::time::sleep(Duration::from_millis(2)).await;
    }
    true
}

/// `fut`, or a panic naming `what` if it has not finished within [`T`]
/// (writes wait for the peer's window or socket buffer: a flow that
/// stalls must fail the test, not hang it).
pub async fn within<F: Future>(what: &str, fut: F) -> F::Output {
    match monoio::time::timeout(T, fut).await {
        Ok(out) => out,
        Err(_) => panic!("{what}: no progress within {T:?}"),
    }
}
