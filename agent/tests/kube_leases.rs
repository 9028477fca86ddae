//! Lease-based server counting against a real kube-apiserver (v1.36 from
//! `target/kube/`, see `konn_testkit::kube`): three konn proxy-servers with
//! `--enable-lease-controller` behind one round-robin address; a konn agent
//! with `--count-server-leases` converges to three tunnels; one server is
//! killed (its lease is not deleted), its lease expires and the agent
//! counts two; it comes back and the agent holds three again. Then
//! upstream's v0.36.0 agent against the konn servers, and the konn agent
//! against upstream's servers, converge too.
//!
//! Skipped with a loud message when the control-plane binaries are absent;
//! `KONN_KUBE_REQUIRED=1` (scripts/test in CI) makes them mandatory.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use konn_testkit::kube::{Cluster, require_or_skip};
use konn_testkit::ports::free_port;
use konn_testkit::procs::{Proc, binary, http_get, upstream_binary, wait_http_ok};
use konn_testkit::relay::LoadBalancer;

struct Server {
    proc: Option<Proc>,
    args: Vec<String>,
    bin: PathBuf,
    log: PathBuf,
    agent: SocketAddr,
    health: SocketAddr,
}

impl Server {
    fn start(
        bin: &Path,
        id: &str,
        dir: &Path,
        pki: &konn_testkit::pki::PkiFiles,
        kubeconfig: &Path,
    ) -> Self {
        let (agent_port, health_port) = (free_port(), free_port());
        let args: Vec<String> = vec![
            "--mode=grpc".into(),
            format!("--uds-name={}", dir.join(format!("{id}.sock")).display()),
            "--server-port=0".into(),
            "--agent-bind-address=127.0.0.1".into(),
            format!("--agent-port={agent_port}"),
            "--health-bind-address=127.0.0.1".into(),
            format!("--health-port={health_port}"),
            format!("--admin-port={}", free_port()),
            format!("--cluster-cert={}", pki.server_cert.display()),
            format!("--cluster-key={}", pki.server_key.display()),
            "--enable-lease-controller".into(),
            format!("--kubeconfig={}", kubeconfig.display()),
            format!("--server-id={id}"),
            "--v=2".into(),
        ];
        let mut s = Self {
            proc: None,
            args,
            bin: bin.to_owned(),
            log: dir.join(format!("{id}.log")),
            agent: format!("127.0.0.1:{agent_port}").parse().unwrap(),
            health: format!("127.0.0.1:{health_port}").parse().unwrap(),
        };
        s.restart();
        s
    }

    fn restart(&mut self) {
        let p = Proc::spawn(&self.bin, &self.args, &self.log).expect("server starts");
        assert!(
            wait_http_ok(self.health, "/healthz", Duration::from_secs(30)),
            "{}",
            p.log_tail(20)
        );
        self.proc = Some(p);
    }

    fn kill(&mut self) {
        if let Some(mut p) = self.proc.take() {
            p.kill();
        }
    }

    fn ready(&self) -> bool {
        self.proc.is_some() && wait_http_ok(self.health, "/readyz", Duration::from_millis(100))
    }
}

fn gauge(health: SocketAddr, name: &str) -> Option<f64> {
    let (_, m) = http_get(health, "/metrics").ok()?;
    m.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

/// Poll `cond` every 200 ms for at most `limit`.
fn eventually(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    for _ in 0..(limit.as_millis() / 200).max(1) {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    false
}

fn agent(
    bin: &Path,
    name: &str,
    lb: SocketAddr,
    dir: &Path,
    pki: &konn_testkit::pki::PkiFiles,
    kubeconfig: &Path,
) -> (Proc, SocketAddr) {
    let health: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let args: Vec<String> = vec![
        "--proxy-server-host=127.0.0.1".into(),
        format!("--proxy-server-port={}", lb.port()),
        format!("--ca-cert={}", pki.ca_cert.display()),
        "--health-server-host=127.0.0.1".into(),
        format!("--health-server-port={}", health.port()),
        format!("--admin-server-port={}", free_port()),
        "--sync-interval=200ms".into(),
        "--sync-interval-cap=1s".into(),
        "--count-server-leases".into(),
        format!("--kubeconfig={}", kubeconfig.display()),
        format!("--agent-id={name}"),
        "--v=2".into(),
    ];
    let p = Proc::spawn(bin, &args, &dir.join(format!("{name}.log"))).expect("agent starts");
    (p, health)
}

#[test]
fn agents_count_server_leases_on_a_real_kube_apiserver() {
    let Some(bins) = require_or_skip("kube_leases") else {
        return;
    };
    let tmp = std::env::temp_dir().join(format!("konn-kube-leases-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).unwrap();
    let dir = tmp.as_path();
    let cluster = Cluster::start(bins, &dir.join("cluster"));
    let kc = cluster.kubeconfig.clone();
    let pki = konn_testkit::pki::write(&dir.join("pki")).unwrap();
    let konn_server = binary("proxy-server").unwrap();
    let mut servers: Vec<Server> = ["s1", "s2", "s3"]
        .iter()
        .map(|id| Server::start(&konn_server, id, dir, &pki, &kc))
        .collect();
    let lb = LoadBalancer::start(servers.iter().map(|s| s.agent).collect()).unwrap();
    assert!(
        eventually(Duration::from_secs(30), || cluster
            .kubectl(&[
                "-n",
                "kube-system",
                "get",
                "leases",
                "-l",
                "k8s-app=konnectivity-server",
                "-o",
                "name"
            ])
            .lines()
            .count()
            == 3),
        "three leases"
    );
    let (a, ah) = agent(
        &binary("proxy-agent").unwrap(),
        "konn-agent",
        lb.addr(),
        dir,
        &pki,
        &kc,
    );
    let converged = |n: f64| {
        eventually(Duration::from_secs(20), || {
            gauge(ah, "konnectivity_network_proxy_agent_known_server_count") == Some(n)
                && gauge(
                    ah,
                    "konnectivity_network_proxy_agent_open_server_connections",
                ) == Some(n)
        })
    };
    assert!(converged(3.0), "konn agent: 3 tunnels\n{}", a.log_tail(30));
    assert!(servers.iter().all(Server::ready));
    // One server dies without deleting its lease: once it expires (30 s)
    // the agent counts two.
    servers[2].kill();
    assert!(
        eventually(Duration::from_secs(60), || gauge(
            ah,
            "konnectivity_network_proxy_agent_known_server_count"
        ) == Some(2.0)),
        "lease expiry seen\n{}",
        a.log_tail(30)
    );
    assert_eq!(
        gauge(
            ah,
            "konnectivity_network_proxy_agent_open_server_connections"
        ),
        Some(2.0)
    );
    // Back: three again, at once (a watch event, not a sync round).
    servers[2].restart();
    assert!(
        converged(3.0),
        "konn agent: 3 tunnels again\n{}",
        a.log_tail(30)
    );
    drop(a);

    // Upstream's agent against konn's servers.
    if let Some(bin) = upstream_binary("proxy-agent") {
        let (u, uh) = agent(&bin, "upstream-agent", lb.addr(), dir, &pki, &kc);
        assert!(
            eventually(Duration::from_secs(30), || gauge(
                uh,
                "konnectivity_network_proxy_agent_open_server_connections"
            ) == Some(3.0)),
            "upstream agent against konn servers\n{}",
            u.log_tail(30)
        );
        drop(u);
    } else {
        eprintln!("kube_leases: upstream's proxy-agent not built; interop skipped");
    }
    for s in &mut servers {
        s.kill();
    }
    drop(lb);

    // konn's agent against upstream's servers (their leases).
    if let Some(bin) = upstream_binary("proxy-server") {
        let ups: Vec<Server> = ["u1", "u2", "u3"]
            .iter()
            .map(|id| Server::start(&bin, id, dir, &pki, &kc))
            .collect();
        let lb = LoadBalancer::start(ups.iter().map(|s| s.agent).collect()).unwrap();
        let (a, ah) = agent(
            &binary("proxy-agent").unwrap(),
            "konn-agent-2",
            lb.addr(),
            dir,
            &pki,
            &kc,
        );
        // s1..s3's leases may still be valid for up to 30 s: wait for 3
        // tunnels to the upstream servers.
        assert!(
            eventually(Duration::from_secs(60), || ups.iter().all(Server::ready)
                && gauge(ah, "konnectivity_network_proxy_agent_known_server_count")
                    == Some(3.0)),
            "konn agent against upstream servers\n{}",
            a.log_tail(30)
        );
        drop(a);
    }
    drop(cluster);
    let _ = std::fs::remove_dir_all(&tmp);
}
