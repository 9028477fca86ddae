//! One proxy-server for several clusters (`--clusters-config`,
//! docs/MULTI-CLUSTER.md), on real sockets and processes.
//!
//! Each cluster's "node network" is an *island*: a user, network, mount and
//! PID namespace (`unshare -Urnmp`) with its own loopback, where
//! - `X.konn.test` resolves to 127.0.0.1 (a bind-mounted `/etc/hosts`),
//! - a bridge listens on 127.0.0.1:8132 and carries agent connections over
//!   a Unix socket to the server's one agent port (outside),
//! - destinations listen on the *same* addresses in every island:
//!   127.0.0.1:7000 answers with the island's name and then echoes,
//!   127.0.0.1:7002 is a sink that answers with the SHA-256 of what it got;
//!   only island `b` has 127.0.0.1:7001;
//! - two agents dial `X.konn.test:8132` with cluster X's client
//!   certificate: konn's `proxy-agent` and, when it was built (scripts/test
//!   builds it into `target/interop/upstream`), upstream's.
//!
//! The bridge and the destinations are this test binary re-run inside the
//! island (`island_helper`, driven by an environment variable). Killing the
//! island's `unshare` kills everything in it (PID namespace).
//!
//! Scenarios: every cluster's frontend reaches its own island only (the
//! same address answers with the cluster's name; an address only `b` has
//! fails for the others); an agent with cluster A's SNI and cluster B's
//! certificate is refused, as are unknown and missing SNI; a reload (file
//! watch) adds a fourth cluster and removes the first while bulk uploads
//! run in two others, which complete byte-exact; a cluster's `limits`
//! refuse its own dials only, and reloads retune them in place around a
//! held connection; tables and descriptors go back to baseline. The
//! isolation scenario runs on every io engine.

mod e2e_common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use e2e_common::{Baseline, T, assert_released, serial, wait_until};
use konn_core::io::runtime::{Engine, available_engines, block_on};
use konn_core::io::tls::{ClientTls, ClientTlsOptions, PemSource};
use konn_server::clusters::config::{self, ClusterDefaults};
use konn_server::serve::{self, ServerHandle};
use konn_server::settings::{ClustersSource, FrontendListen, Mode, ServerSettings};
use konn_testkit::agentprobe::{ProbeResult, connect_call};
use konn_testkit::blocking::ReadRetry;
use konn_testkit::bulk::{Pattern, Sha256};
use konn_testkit::connect::ConnectTunnel;
use konn_testkit::files::TempDir;
use konn_testkit::frontend::GrpcFrontend;
use konn_testkit::pki::{PkiFiles, Spec, write_for};
use konn_testkit::procs::{Proc, binary, http_get};

/// The environment variable that turns `island_helper` on.
const HELPER_ENV: &str = "KONN_MULTI_CLUSTER_ISLAND";

/// How a cluster's frontend is reached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Front {
    GrpcUnix,
    ConnectUnix,
    GrpcTls,
}

/// One cluster: its PKI, frontend and island.
struct Fixture {
    name: &'static str,
    front: Front,
    pki: PkiFiles,
    island: Option<Proc>,
    /// More of the cluster's YAML (indented as its fields).
    extra: String,
}

impl Fixture {
    fn sni(&self) -> String {
        format!("{}.konn.test", self.name)
    }

    fn uds(&self, dir: &TempDir) -> PathBuf {
        dir.path(&format!("front-{}.sock", self.name))
    }

    fn yaml(&self, dir: &TempDir, tcp_port: u16) -> String {
        let frontend = match self.front {
            Front::GrpcUnix => format!("    uds: {}\n", self.uds(dir).display()),
            Front::ConnectUnix => format!(
                "    uds: {}\n    mode: http-connect\n",
                self.uds(dir).display()
            ),
            Front::GrpcTls => format!(
                "    port: {tcp_port}\n    bindAddress: 127.0.0.1\n    cert: {}\n    key: {}\n    clientCA: {}\n    allowedClients: [{{commonName: kube-apiserver}}]\n",
                self.pki.server_cert.display(),
                self.pki.server_key.display(),
                self.pki.ca_cert.display()
            ),
        };
        format!(
            "- name: {name}\n  frontend:\n{frontend}  agents:\n    serverNames: [{sni}]\n    cert: {cert}\n    key: {key}\n    clientCA: {ca}\n    allowedClients: [{{organizationalUnit: {name}}}]\n  backendDialTimeout: 10s\n{extra}",
            name = self.name,
            extra = self.extra,
            sni = self.sni(),
            cert = self.pki.server_cert.display(),
            key = self.pki.server_key.display(),
            ca = self.pki.ca_cert.display(),
        )
    }

    /// The TLS of a client of this cluster's agent port (`identity`: whose
    /// client certificate).
    fn agent_tls(&self, identity: &PkiFiles) -> ClientTls {
        let mut o = ClientTlsOptions::new(PemSource::File(self.pki.ca_cert.clone()), self.sni());
        o.identity = Some((
            PemSource::File(identity.agent_cert.clone()),
            PemSource::File(identity.agent_key.clone()),
        ));
        o.build().unwrap()
    }
}

/// Upstream's proxy-agent, if it was built (`$UPSTREAM_BIN_DIR`, else
/// `target/interop/upstream`). Required in CI.
fn upstream_agent() -> Option<PathBuf> {
    let dir = std::env::var_os("UPSTREAM_BIN_DIR")
        .map(PathBuf::from)
        .or_else(|| {
            let exe = std::env::current_exe().ok()?;
            // target/debug/deps/<test> → target/interop/upstream
            Some(exe.parent()?.parent()?.parent()?.join("interop/upstream"))
        })?;
    let bin = dir.join("proxy-agent");
    if bin.is_file() {
        return Some(bin);
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "upstream proxy-agent not found at {} (scripts/test builds it)",
        bin.display()
    );
    eprintln!("upstream proxy-agent not built: both agents of each cluster are konn's");
    None
}

/// Start cluster `f`'s island; its agents reach the server through
/// `bridge` (a Unix socket relayed to the agent port).
fn start_island(f: &mut Fixture, dir: &TempDir, bridge: &Path) {
    let hosts = dir.path(&format!("hosts-{}", f.name));
    std::fs::write(
        &hosts,
        format!("127.0.0.1 localhost\n127.0.0.1 {}\n", f.sni()),
    )
    .unwrap();
    let exe = std::env::current_exe().unwrap();
    let konn = binary("proxy-agent").unwrap();
    let agent = |bin: &Path, id: &str, health: u16, admin: u16, extra: &str| {
        format!(
            "{bin} --proxy-server-host={sni} --proxy-server-port=8132 --ca-cert={ca} \
             --agent-cert={cert} --agent-key={key} --agent-id={id} --health-server-port={health} \
             --admin-server-port={admin} --sync-interval=200ms --sync-interval-cap=1s {extra} &\n",
            bin = bin.display(),
            sni = f.sni(),
            ca = f.pki.ca_cert.display(),
            cert = f.pki.agent_cert.display(),
            key = f.pki.agent_key.display(),
        )
    };
    let second = match upstream_agent() {
        Some(up) => agent(&up, &format!("{}-go", f.name), 8095, 8096, ""),
        None => agent(&konn, &format!("{}-konn2", f.name), 8095, 8096, ""),
    };
    let script = format!(
        "set -e\nmount --bind {hosts} /etc/hosts\nip link set lo up\n\
         {HELPER_ENV}={name}:{bridge} {exe} --exact island_helper --nocapture --test-threads=1 &\n\
         {first}{second}wait\n",
        hosts = hosts.display(),
        name = f.name,
        bridge = bridge.display(),
        exe = exe.display(),
        first = agent(&konn, &format!("{}-konn", f.name), 8093, 8094, ""),
    );
    let path = dir.path(&format!("island-{}.sh", f.name));
    std::fs::write(&path, script).unwrap();
    let args: Vec<String> = [
        "-Urnmp",
        "--fork",
        "--kill-child",
        "sh",
        path.to_str().unwrap(),
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    let log = dir.path(&format!("island-{}.log", f.name));
    f.island = Some(Proc::spawn(Path::new("unshare"), &args, &log).unwrap());
}

/// Inside an island: the bridge and the destinations (see the module docs).
/// Without the environment variable this does nothing.
#[test]
fn island_helper() {
    let Ok(spec) = std::env::var(HELPER_ENV) else {
        return;
    };
    let (name, bridge) = spec.split_once(':').unwrap();
    let (name, bridge) = (name.to_owned(), PathBuf::from(bridge));
    let serve = |port: u16, handle: fn(TcpStream, &str)| {
        let l = TcpListener::bind(("127.0.0.1", port)).unwrap();
        let name = name.clone();
        std::thread::spawn(move || {
            for s in l.incoming().flatten() {
                let name = name.clone();
                std::thread::spawn(move || handle(s, &name));
            }
        });
    };
    serve(7000, |mut s, name| {
        let _ = writeln!(s, "{name}");
        let mut r = s.try_clone().unwrap();
        let _ = std::io::copy(&mut r, &mut s);
    });
    if name == "b" {
        serve(7001, |mut s, _| {
            let _ = s.write_all(b"b-only\n");
            let _ = std::io::copy(&mut s, &mut std::io::sink());
        });
    }
    serve(7002, |mut s, _| {
        let mut head = [0u8; 8];
        if s.read_exact(&mut head).is_err() {
            return;
        }
        let mut left = u64::from_be_bytes(head);
        let mut h = Sha256::new();
        let mut buf = vec![0u8; 64 * 1024];
        while left > 0 {
            let want = buf.len().min(left as usize);
            match s.read_retry(&mut buf[..want]) {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    h.update(&buf[..n]);
                    left -= n as u64;
                }
            }
        }
        let _ = s.write_all(h.finish_hex().as_bytes());
    });
    // The bridge: agents dial 127.0.0.1:8132 here.
    let l = TcpListener::bind("127.0.0.1:8132").unwrap();
    for s in l.incoming().flatten() {
        let Ok(u) = UnixStream::connect(&bridge) else {
            continue;
        };
        pump(s, u);
    }
}

/// Copy both ways between a TCP and a Unix stream until either ends.
fn pump(t: TcpStream, u: UnixStream) {
    let (mut t2, mut u2) = (t.try_clone().unwrap(), u.try_clone().unwrap());
    let (mut t1, mut u1) = (t, u);
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut t1, &mut u1);
        let _ = u1.shutdown(std::net::Shutdown::Both);
        let _ = t1.shutdown(std::net::Shutdown::Both);
    });
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut u2, &mut t2);
        let _ = t2.shutdown(std::net::Shutdown::Both);
        let _ = u2.shutdown(std::net::Shutdown::Both);
    });
}

/// The server side of the islands' bridges: a Unix socket whose
/// connections are relayed to the agent port.
struct Bridge {
    path: PathBuf,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Bridge {
    fn start(path: PathBuf, agent: SocketAddr) -> Self {
        let l = UnixListener::bind(&path).unwrap();
        l.set_nonblocking(true).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                match l.accept() {
                    Ok((u, _)) => {
                        u.set_nonblocking(false).unwrap();
                        if let Ok(t) = TcpStream::connect(agent) {
                            pump(t, u);
                        }
                    }
                    // Polling the stop flag, not waiting for an event.
                    Err(_) => std::thread::sleep(Duration::from_millis(20)),
                }
            }
        });
        Self {
            path,
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Bridge {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

struct World {
    dir: TempDir,
    config: PathBuf,
    tcp_port: u16,
    server: Option<ServerHandle>,
    bridge: Option<Bridge>,
    clusters: Vec<Fixture>,
}

impl World {
    fn new(names: &[(&'static str, Front)]) -> Self {
        let dir = TempDir::new("multi-cluster");
        let clusters = names
            .iter()
            .map(|&(name, front)| {
                let sni = format!("{name}.konn.test");
                let pki = write_for(
                    &dir.path(&format!("pki-{name}")),
                    Spec {
                        server_names: &[sni.as_str()],
                        client_ou: Some(name),
                    },
                )
                .unwrap();
                Fixture {
                    name,
                    front,
                    pki,
                    island: None,
                    extra: String::new(),
                }
            })
            .collect();
        let tcp_port = konn_testkit::ports::free_port();
        let config = dir.path("clusters.yaml");
        Self {
            dir,
            config,
            tcp_port,
            server: None,
            bridge: None,
            clusters,
        }
    }

    fn write_config(&self, names: &[&str]) {
        let mut text = String::from("clusters:\n");
        for f in self.clusters.iter().filter(|f| names.contains(&f.name)) {
            text.push_str(&f.yaml(&self.dir, self.tcp_port));
        }
        // Write and rename, as a ConfigMap update does.
        let tmp = self.dir.path("clusters.yaml.tmp");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, &self.config).unwrap();
    }

    fn start(&mut self, engine: Engine, names: &[&str]) {
        self.write_config(names);
        let mut s = ServerSettings::for_tests(
            FrontendListen::Unix(self.dir.path("unused.sock")),
            Mode::Grpc,
        );
        s.runtime.engine = konn_testkit::engine_flag(engine);
        s.runtime.workers = 2;
        s.health_addr = Some("127.0.0.1:0".parse().unwrap());
        s.admin_addr = Some("127.0.0.1:0".parse().unwrap());
        let defaults = ClusterDefaults::default();
        let initial = config::load(&self.config, &defaults).unwrap();
        s.clusters = Some(ClustersSource {
            path: self.config.clone(),
            defaults,
            initial,
        });
        let server = serve::start(s).unwrap();
        self.bridge = Some(Bridge::start(
            self.dir.path("agents.sock"),
            server.agent_addr(),
        ));
        self.server = Some(server);
        let bridge = self.dir.path("agents.sock");
        for f in self.clusters.iter_mut().filter(|f| names.contains(&f.name)) {
            start_island(f, &self.dir, &bridge);
        }
    }

    fn server(&self) -> &ServerHandle {
        self.server.as_ref().unwrap()
    }

    fn fixture(&self, name: &str) -> &Fixture {
        self.clusters.iter().find(|f| f.name == name).unwrap()
    }

    fn admin(&self, path: &str) -> (u16, String) {
        http_get(self.server().admin_addr().unwrap(), path).unwrap()
    }

    fn health(&self, path: &str) -> (u16, String) {
        http_get(self.server().health_addr().unwrap(), path).unwrap()
    }

    /// Wait until `/debug/backends` lists these agents per cluster (and no
    /// other cluster).
    fn wait_agents(&self, names: &[&str]) {
        let want: Vec<String> = names
            .iter()
            .map(|n| format!("{{\"name\":\"{n}\",\"agents\":[{{\"id\":\"{n}-"))
            .collect();
        let ok = wait_until(Duration::from_secs(30), || {
            let (_, body) = self.admin("/debug/backends");
            want.iter().all(|w| body.contains(w.as_str()))
                && body.matches("\"id\":").count() == 2 * names.len()
                && body.matches("\"name\":").count() == names.len()
        });
        assert!(
            ok,
            "agents not connected: {}",
            self.admin("/debug/backends").1
        );
    }

    /// Dial `address` through cluster `name`'s frontend and read one line
    /// (`Err`: the dial failed).
    fn hello(&self, engine: Engine, name: &str, address: &str) -> Result<String, String> {
        let f = self.fixture(name);
        let path = f.uds(&self.dir);
        let tcp = format!("127.0.0.1:{}", self.tcp_port);
        let tls = f.front_tls();
        let front = f.front;
        block_on(engine, async move {
            let line = |b: Vec<u8>| String::from_utf8_lossy(&b).trim_end().to_owned();
            match front {
                Front::ConnectUnix => {
                    let mut t = ConnectTunnel::unix(&path, address, T)
                        .await
                        .map_err(|e| format!("{e:?}"))?;
                    let first = t.read(T).await.map_err(|e| format!("{e:?}"))?;
                    t.close().await;
                    Ok(line(first.map(|b| b.to_vec()).unwrap_or_default()))
                }
                Front::GrpcUnix | Front::GrpcTls => {
                    let fe = if front == Front::GrpcTls {
                        GrpcFrontend::connect_tls(&tcp, &tls).await
                    } else {
                        GrpcFrontend::connect_unix(&path).await
                    }
                    .map_err(|e| format!("{e:?}"))?;
                    let r = async {
                        let t = fe.dial(address, T).await.map_err(|e| format!("{e:?}"))?;
                        let first = t.read(T).await.map_err(|e| format!("{e:?}"))?;
                        let _ = t.close(T).await;
                        Ok(line(first.map(|b| b.to_vec()).unwrap_or_default()))
                    }
                    .await;
                    fe.close().await;
                    r
                }
            }
        })
        .unwrap()
    }

    fn stop(&mut self) {
        for f in &mut self.clusters {
            f.island.take();
        }
        if let Some(s) = self.server.take() {
            s.stop().unwrap();
        }
        self.bridge.take();
    }
}

impl Fixture {
    /// kube-apiserver's client TLS for a TCP frontend.
    fn front_tls(&self) -> ClientTls {
        let mut o = ClientTlsOptions::new(PemSource::File(self.pki.ca_cert.clone()), "127.0.0.1");
        o.identity = Some((
            PemSource::File(self.pki.frontend_cert.clone()),
            PemSource::File(self.pki.frontend_key.clone()),
        ));
        o.build().unwrap()
    }
}

impl Drop for World {
    fn drop(&mut self) {
        self.stop();
    }
}

const CLUSTERS: [(&str, Front); 4] = [
    ("a", Front::GrpcUnix),
    ("b", Front::ConnectUnix),
    ("c", Front::GrpcTls),
    ("d", Front::GrpcUnix),
];

#[test]
fn each_cluster_reaches_only_its_own_agents() {
    let _serial = serial();
    for engine in available_engines() {
        let before = Baseline::take();
        let mut w = World::new(&CLUSTERS[..3]);
        w.start(engine, &["a", "b", "c"]);
        w.wait_agents(&["a", "b", "c"]);
        for name in ["a", "b", "c"] {
            // Enough dials to go through both agents of the cluster.
            for _ in 0..6 {
                assert_eq!(
                    w.hello(engine, name, "127.0.0.1:7000").as_deref(),
                    Ok(name),
                    "{engine}: cluster {name}"
                );
            }
            let only_b = w.hello(engine, name, "127.0.0.1:7001");
            if name == "b" {
                assert_eq!(only_b.as_deref(), Ok("b-only"));
            } else {
                assert!(
                    only_b.is_err(),
                    "{engine}: {name} reached b's 7001: {only_b:?}"
                );
            }
        }
        // Agent admission on the shared port.
        let agent = w.server().agent_addr().to_string();
        let md: [(&str, &[u8]); 1] = [("agentid", b"probe")];
        let (a, b) = (w.fixture("a"), w.fixture("b"));
        let ok = connect_call(&agent, Some(&a.agent_tls(&a.pki)), &md, T);
        assert!(matches!(ok, ProbeResult::Accepted { .. }), "{ok:?}");
        let wrong = connect_call(&agent, Some(&a.agent_tls(&b.pki)), &md, T);
        // (TLS 1.3: the client's handshake ends before the server checks
        // its certificate, so it sees the connection close.)
        let refused = |r: &ProbeResult| !matches!(r, ProbeResult::Accepted { .. });
        assert!(refused(&wrong), "a's SNI, b's certificate: {wrong:?}");
        let mut other = a.agent_tls(&a.pki);
        other.server_name = "z.konn.test".try_into().unwrap();
        let unknown = connect_call(&agent, Some(&other), &md, T);
        assert!(refused(&unknown), "unknown SNI: {unknown:?}");
        other.server_name = "127.0.0.1".try_into().unwrap();
        let none = connect_call(&agent, Some(&other), &md, T);
        assert!(refused(&none), "no SNI: {none:?}");
        let (_, metrics) = w.health("/metrics");
        for want in [
            "konn_server_agent_sni_refusals_total{reason=\"unknown_server_name\"} 1",
            "konn_server_agent_sni_refusals_total{reason=\"no_server_name\"} 1",
            "konn_server_clusters 3",
            "konnectivity_network_proxy_server_ready_backends{cluster=\"a\",proxy_strategy=\"default\"} 2",
            "konnectivity_network_proxy_server_ready_backends{cluster=\"c\",proxy_strategy=\"default\"} 2",
        ] {
            assert!(
                metrics.contains(want),
                "{engine}: no {want:?} in\n{metrics}"
            );
        }
        assert_eq!(w.health("/readyz"), (200, "ok".to_owned()));
        assert_eq!(w.health("/readyz/b"), (200, "ok".to_owned()));
        assert_eq!(w.health("/readyz/nope").0, 404);
        assert_eq!(
            w.health("/readyz?verbose"),
            (
                200,
                "[+]cluster a ok\n[+]cluster b ok\n[+]cluster c ok\nreadyz check passed".to_owned()
            )
        );
        // Nothing left in the tables once the frontends are gone.
        let shared = w.server().shared().clone();
        assert!(
            wait_until(T, || shared.pending_dials.load(Ordering::Relaxed) == 0
                && shared.established.load(Ordering::Relaxed) == 0
                && shared.proxy_streams.load(Ordering::Relaxed) == 0
                && shared.http_connections.load(Ordering::Relaxed) == 0),
            "{engine}: tables not empty"
        );
        w.stop();
        drop(w);
        assert_released(before, &format!("{engine}: stopped"));
    }
}

/// Upload `size` bytes of a pattern to the island's sink through cluster
/// `name`'s gRPC frontend, calling `halfway` after half of them; returns
/// the sink's digest and the pattern's.
fn upload(
    w: &World,
    engine: Engine,
    name: &str,
    (size, seed): (u64, u64),
    halfway: impl FnOnce(),
) -> (String, String) {
    let f = w.fixture(name);
    assert_eq!(f.front, Front::GrpcUnix);
    let path = f.uds(&w.dir);
    block_on(engine, async move {
        let fe = GrpcFrontend::connect_unix(&path).await.unwrap();
        let t = fe.dial("127.0.0.1:7002", T).await.unwrap();
        t.write(&size.to_be_bytes()).await.unwrap();
        let (mut p, mut h) = (Pattern::new(seed), Sha256::new());
        let mut buf = vec![0u8; 128 * 1024];
        let mut left = size;
        let mut halfway = Some(halfway);
        while left > 0 {
            if left <= size / 2
                && let Some(f) = halfway.take()
            {
                f();
            }
            let k = buf.len().min(left as usize);
            p.fill(&mut buf[..k]);
            h.update(&buf[..k]);
            t.write(&buf[..k]).await.unwrap();
            left -= k as u64;
        }
        let got = t.read_exact(64, Duration::from_secs(60)).await.unwrap();
        let _ = t.close(T).await;
        fe.close().await;
        (String::from_utf8_lossy(&got).into_owned(), h.finish_hex())
    })
    .unwrap()
}

#[test]
fn a_reload_adds_and_removes_clusters_while_others_transfer() {
    let _serial = serial();
    let engine = Engine::Epoll;
    let before = Baseline::take();
    let mut w = World::new(&[
        ("a", Front::GrpcUnix),
        ("b", Front::GrpcUnix),
        ("c", Front::GrpcUnix),
        ("d", Front::GrpcUnix),
    ]);
    w.start(engine, &["a", "b", "c"]);
    w.wait_agents(&["a", "b", "c"]);
    w.server
        .as_mut()
        .unwrap()
        .watch(Some(Duration::from_millis(100)))
        .unwrap();
    let bridge = w.dir.path("agents.sock");
    let d = w.clusters.iter_mut().find(|f| f.name == "d").unwrap();
    start_island(d, &w.dir, &bridge);
    const SIZE: u64 = 48 << 20;
    let (results, reloaded) = std::thread::scope(|s| {
        // Each upload stops halfway until the reload is applied.
        let (half_tx, half_rx) = std::sync::mpsc::channel::<()>();
        let mut go = Vec::new();
        let uploads: Vec<_> = [("b", 21), ("c", 22)]
            .into_iter()
            .map(|(name, seed)| {
                let (w, half) = (&w, half_tx.clone());
                let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
                go.push(go_tx);
                s.spawn(move || {
                    upload(w, engine, name, (SIZE, seed), move || {
                        half.send(()).unwrap();
                        go_rx.recv().unwrap();
                    })
                })
            })
            .collect();
        for _ in 0..2 {
            half_rx
                .recv_timeout(Duration::from_secs(60))
                .expect("uploads halfway");
        }
        w.write_config(&["b", "c", "d"]);
        let reloaded = wait_until(Duration::from_secs(30), || {
            let (_, body) = w.admin("/debug/backends");
            body.contains("{\"name\":\"d\",\"agents\":[{")
                && body.matches("\"id\":\"d-").count() == 2
                && !body.contains("\"name\":\"a\"")
        });
        for g in go {
            g.send(()).unwrap();
        }
        let results: Vec<_> = uploads.into_iter().map(|u| u.join().unwrap()).collect();
        (results, reloaded)
    });
    assert!(
        reloaded,
        "reload not applied: {}",
        w.admin("/debug/backends").1
    );
    for (got, want) in results {
        assert_eq!(got, want, "an upload of a cluster the reload kept");
    }
    assert_eq!(w.hello(engine, "d", "127.0.0.1:7000").as_deref(), Ok("d"));
    assert!(
        w.hello(engine, "a", "127.0.0.1:7000").is_err(),
        "a was removed"
    );
    assert!(
        !w.fixture("a").uds(&w.dir).exists(),
        "a's socket file removed"
    );
    let (_, m) = w.health("/metrics");
    assert!(
        m.contains("konn_server_clusters_config_reloads_total{result=\"ok\"} 1"),
        "{m}"
    );
    assert!(!m.contains("cluster=\"a\""), "a's series are gone: {m}");
    // A bad file is refused whole: the running clusters stay.
    std::fs::write(&w.config, "clusters:\n- name: b\n  frontend: {}\n").unwrap();
    assert!(wait_until(T, || w.health("/metrics").1.contains(
        "konn_server_clusters_config_reloads_total{result=\"error\"} 1"
    )));
    assert_eq!(w.hello(engine, "c", "127.0.0.1:7000").as_deref(), Ok("c"));
    assert_eq!(w.hello(engine, "d", "127.0.0.1:7000").as_deref(), Ok("d"));
    w.stop();
    drop(w);
    assert_released(before, "reload scenario stopped");
}

/// The binary: SIGHUP reloads `--clusters-config` (here a cluster whose
/// certificate file changed, which watching the file alone would not see);
/// without the flag SIGHUP ends the process, as upstream's.
#[test]
fn sighup_reloads_the_binary_only_with_clusters_config() {
    const SIGHUP: i32 = 1;
    let _serial = serial();
    let w = World::new(&CLUSTERS[..1]);
    w.write_config(&["a"]);
    let port = konn_testkit::ports::free_port;
    let (agent, health, admin) = (port(), port(), port());
    let mut args: Vec<String> = [
        format!("--clusters-config={}", w.config.display()),
        format!("--agent-port={agent}"),
        format!("--health-port={health}"),
        format!("--admin-port={admin}"),
        "--agent-bind-address=127.0.0.1".into(),
        "--health-bind-address=127.0.0.1".into(),
    ]
    .to_vec();
    let log = w.dir.path("server.log");
    let server = binary("proxy-server").unwrap();
    let mut proc = Proc::spawn(&server, &args, &log).unwrap();
    let at = SocketAddr::from(([127, 0, 0, 1], health));
    let metrics = || http_get(at, "/metrics").map(|(_, m)| m).unwrap_or_default();
    assert!(
        wait_until(T, || metrics().contains("konn_server_clusters 1")),
        "{}",
        proc.log_tail(20)
    );
    // Same config file, another serving certificate: only SIGHUP sees it.
    let a = w.fixture("a");
    let fresh = write_for(
        &w.dir.path("pki-a2"),
        Spec {
            server_names: &["a.konn.test"],
            client_ou: Some("a"),
        },
    )
    .unwrap();
    std::fs::copy(&fresh.server_cert, &a.pki.server_cert).unwrap();
    std::fs::copy(&fresh.server_key, &a.pki.server_key).unwrap();
    proc.signal(SIGHUP);
    let reloaded = "konn_server_clusters_config_reloads_total{result=\"ok\"} 1";
    assert!(
        wait_until(T, || metrics().contains(reloaded)),
        "{}",
        proc.log_tail(20)
    );
    assert!(proc.is_running(), "SIGHUP must not end the server");
    // No agent in a: the server stays ready, the cluster is not.
    let get = |path| http_get(at, path).unwrap();
    assert_eq!(get("/readyz"), (200, "ok".to_owned()));
    assert_eq!(
        get("/readyz/a"),
        (500, "no connection to any proxy agent".to_owned())
    );
    assert_eq!(
        get("/readyz?verbose").1,
        "[-]cluster a failed: no connection to any proxy agent\nreadyz check passed"
    );
    proc.terminate();
    assert!(proc.wait_timeout(T).is_some_and(|s| s.success()));

    // Without --clusters-config: SIGHUP's default action.
    args.remove(0);
    args.extend([
        format!("--uds-name={}", w.dir.path("single.sock").display()),
        "--server-port=0".into(),
        format!("--cluster-cert={}", a.pki.server_cert.display()),
        format!("--cluster-key={}", a.pki.server_key.display()),
    ]);
    let mut single = Proc::spawn(&server, &args, &w.dir.path("single.log")).unwrap();
    assert!(konn_testkit::procs::wait_http_ok(at, "/healthz", T));
    // The single-cluster surface is upstream's: no `cluster` label.
    let m = metrics();
    assert!(
        m.contains(
            "konnectivity_network_proxy_server_ready_backends{proxy_strategy=\"default\"} 0"
        ),
        "{m}"
    );
    assert!(
        !m.contains("cluster=") && !m.contains("konn_server_clusters"),
        "{m}"
    );
    single.signal(SIGHUP);
    let status = single.wait_timeout(T);
    assert!(
        status.is_some_and(|s| !s.success()),
        "SIGHUP without --clusters-config: {status:?}"
    );
}

/// A CONNECT through the Unix socket at `path` with blocking std IO, kept
/// open: the stream after the answer's head and the island's greeting
/// line, or the answer when the dial was refused.
fn hold_connect(path: &Path, target: &str) -> Result<UnixStream, String> {
    let mut s = UnixStream::connect(path).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(T)).unwrap();
    write!(s, "CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match s.read_retry(&mut byte) {
            Ok(1) => head.push(byte[0]),
            _ => break,
        }
    }
    let head = String::from_utf8_lossy(&head).into_owned();
    if !head.starts_with("HTTP/1.1 200") {
        let mut rest = String::new();
        let _ = s.read_to_string(&mut rest);
        return Err(head + &rest);
    }
    Ok(s)
}

/// Echo a line through a held connection (after the greeting).
fn echo_line(s: &mut UnixStream, line: &str) -> String {
    writeln!(s, "{line}").unwrap();
    let mut got = Vec::new();
    let mut byte = [0u8; 1];
    while !got.ends_with(b"\n") {
        match s.read_retry(&mut byte) {
            Ok(1) => got.push(byte[0]),
            other => panic!("echo of {line:?} ended: {other:?} after {got:?}"),
        }
    }
    String::from_utf8_lossy(&got).into_owned()
}

/// Per-cluster limits (`limits:` in the file): a cluster's limit refuses
/// its own dials only, and a reload that changes limits alone retunes them
/// in place — no tunnel or connection restarts, the counts stay true —
/// whether it raises a limit, switches them all off or on again.
#[test]
fn a_reload_retunes_a_clusters_limits_in_place() {
    let _serial = serial();
    let engine = Engine::Epoll;
    let before = Baseline::take();
    let mut w = World::new(&[("a", Front::ConnectUnix), ("b", Front::GrpcUnix)]);
    let limit = |n: u32| format!("  limits:\n    maxClusterConnections: {n}\n");
    w.clusters[0].extra = limit(1);
    w.start(engine, &["a", "b"]);
    w.wait_agents(&["a", "b"]);
    let sock = w.fixture("a").uds(&w.dir);
    let greeting = "a\n";
    let open = || -> Result<UnixStream, String> {
        let mut s = hold_connect(&sock, "127.0.0.1:7000")?;
        let mut hello = [0u8; 2];
        s.read_exact(&mut hello).unwrap();
        assert_eq!(&hello, greeting.as_bytes());
        Ok(s)
    };
    let refused = |r: Result<UnixStream, String>| match r {
        Ok(_) => panic!("admitted over the limit"),
        Err(answer) => {
            assert!(
                answer.starts_with("HTTP/1.1 503")
                    && answer.ends_with("konn: dial refused: limit_cluster_conns"),
                "{answer}"
            );
        }
    };
    let mut held = open().unwrap();
    refused(open());
    // Another cluster's dials are not counted against a's limit.
    for _ in 0..3 {
        assert_eq!(w.hello(engine, "b", "127.0.0.1:7000").as_deref(), Ok("b"));
    }
    // Counted on the agents of a (whichever took each dial), not of b.
    let (_, backends) = w.admin("/debug/backends");
    let v: serde_json::Value = serde_json::from_str(&backends).unwrap();
    let sum = |cluster: usize, field: &str| -> u64 {
        v["clusters"][cluster]["agents"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a["limits"][field].as_u64().unwrap_or(0))
            .sum()
    };
    assert_eq!(
        (sum(0, "connections"), sum(0, "refused")),
        (1, 1),
        "{backends}"
    );
    let b_agents = v["clusters"][1]["agents"].as_array().unwrap();
    assert!(
        b_agents.iter().all(|a| a.get("limits").is_none()),
        "b has no limits: {backends}"
    );
    let (_, metrics) = w.health("/metrics");
    let refusals =
        "konn_server_dial_refusals_total{cluster=\"a\",reason=\"limit_cluster_conns\"} 1";
    assert!(metrics.contains(refusals), "{metrics}");

    let reload = |w: &mut World, a_limits: String| {
        w.clusters[0].extra = a_limits;
        w.write_config(&["a", "b"]);
        w.server.as_mut().unwrap().reload().unwrap()
    };
    // Raised: the held connection goes on; one more fits.
    let s = reload(&mut w, limit(2));
    assert_eq!(s.retuned, ["a"], "{s:?}");
    assert!(s.added.is_empty() && s.changed.is_empty() && s.removed.is_empty());
    assert_eq!(echo_line(&mut held, "still here"), "still here\n");
    let mut second = open().unwrap();
    refused(open());
    // All off: no limit, no per-agent counts shown.
    let s = reload(&mut w, String::new());
    assert_eq!(s.retuned, ["a"]);
    let more: Vec<UnixStream> = (0..3).map(|_| open().unwrap()).collect();
    let (_, backends) = w.admin("/debug/backends");
    assert!(!backends.contains("\"limits\""), "{backends}");
    drop(more);
    // On again: the two connections admitted under a limit still count,
    // those admitted while it was off do not.
    let s = reload(&mut w, limit(3));
    assert_eq!(s.retuned, ["a"]);
    let third = open().unwrap();
    refused(open());
    assert_eq!(
        echo_line(&mut held, "after three reloads"),
        "after three reloads\n"
    );
    assert_eq!(echo_line(&mut second, "and this one"), "and this one\n");
    // An unchanged file changes nothing.
    let s = w.server.as_mut().unwrap().reload().unwrap();
    assert!(s.is_empty(), "{s:?}");
    drop((held, second, third));
    let (_, m) = w.health("/metrics");
    assert!(
        m.contains("konn_server_clusters_config_reloads_total{result=\"ok\"} 4"),
        "{m}"
    );
    w.stop();
    drop(w);
    assert_released(before, "limits reload scenario stopped");
}
