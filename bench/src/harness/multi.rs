//! S10 (`konn-bench multi`): N clusters on one konn proxy-server
//! (`--clusters-config`, one agent port, SNI per cluster) against N
//! upstream proxy-servers, one per cluster — what a seed runs today. Each
//! cluster has its own PKI, a gRPC frontend on a Unix socket and one agent
//! (konn's agents for konn, upstream's for upstream). Measured per stack:
//!
//! - **set-up**: from spawning every agent until every cluster is ready
//!   (konn: `/readyz?verbose` lists every cluster `[+]`; upstream: every
//!   server's `/readyz` is 200), polled every 10 ms;
//! - **idle**: resident memory of all servers and of all agents, and
//!   their CPU (utime + stime from `/proc/<pid>/stat`) over a window;
//! - **load**: S3's open-loop ping (64 B messages, a fixed total rate)
//!   spread over one tunnelled connection per cluster: the same figures
//!   during the window, and the round-trip latency.
//!
//! Agents send their cluster's name (`c<i>.konn.test`) as SNI, so the
//! names must resolve to 127.0.0.1: the caller runs this in a mount
//! namespace with its own `/etc/hosts` ([`hosts_file`]). Nothing is
//! pinned and every process runs with its defaults (konn: a worker per
//! CPU; Go: `GOMAXPROCS` = CPUs): the comparison is of deployments, not of
//! per-core efficiency (S1–S8 measure that). Every wait has a deadline.

use std::cell::RefCell;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use monoio::time::sleep_until;

use super::dests::Dests;
use super::load::{Conn, Route};
use super::stats::Lat;
use super::{Binaries, cpu_ticks, rss_kib};
use konn_core::io::clock::now;
use konn_core::io::runtime::{Engine, block_on};
use konn_testkit::Error;
use konn_testkit::pki::{PkiFiles, Spec, write_for};
use konn_testkit::procs::{Proc, http_get, wait_http_ok};

/// The SNI name of cluster `i`.
pub fn server_name(i: usize) -> String {
    format!("c{i}.konn.test")
}

/// An `/etc/hosts` that resolves the names of clusters `0..n` (and
/// `localhost`) to 127.0.0.1.
pub fn hosts_file(n: usize) -> String {
    let mut s = String::from("127.0.0.1 localhost\n::1 localhost\n");
    for i in 0..n {
        s.push_str(&format!("127.0.0.1 {}\n", server_name(i)));
    }
    s
}

/// What to run.
#[derive(Clone, Debug)]
pub struct Config {
    /// Cluster counts, one run of each stack per count.
    pub clusters: Vec<usize>,
    /// konn's binaries.
    pub konn: Binaries,
    /// Upstream's binaries (`None`: konn only).
    pub upstream: Option<Binaries>,
    /// Idle measurement window.
    pub idle: Duration,
    /// Load: unmeasured warm-up, then the measured window.
    pub warm: Duration,
    /// See `warm`.
    pub window: Duration,
    /// Total messages per second over all clusters.
    pub rate: f64,
    /// Message size.
    pub size: usize,
}

/// Memory and CPU of a stack over a window.
#[derive(Clone, Copy, Debug, Default)]
pub struct Usage {
    /// Resident memory of every server, KiB, at the window's end.
    pub servers_rss_kib: u64,
    /// Resident memory of every agent, KiB.
    pub agents_rss_kib: u64,
    /// CPU of every server over the window, in cores (1.0 = one core busy).
    pub servers_cpu: f64,
    /// CPU of every agent, in cores.
    pub agents_cpu: f64,
}

/// One stack's figures for one cluster count.
#[derive(Clone, Debug)]
pub struct Row {
    /// `konn` or `upstream`.
    pub name: String,
    /// Clusters.
    pub clusters: usize,
    /// Server processes.
    pub servers: usize,
    /// From spawning the agents until every cluster was ready.
    pub setup: Duration,
    /// At idle (every agent connected).
    pub idle: Usage,
    /// Under load.
    pub load: Usage,
    /// Round trips answered in the measured window.
    pub messages: u64,
    /// Round-trip latency, µs.
    pub p50_us: f64,
    /// See `p50_us`.
    pub p99_us: f64,
    /// Messages not answered in time (their connection then stops).
    pub timeouts: u64,
}

/// Every process of one stack.
struct Stack {
    servers: Vec<Proc>,
    agents: Vec<Proc>,
    /// Each cluster's frontend socket.
    sockets: Vec<PathBuf>,
    /// Each server's health port.
    health: Vec<SocketAddr>,
    /// The agent port each cluster's agent connects to.
    agent_ports: Vec<u16>,
    /// One server for every cluster (`/readyz?verbose`), or one each.
    shared: bool,
}

/// How long the servers may take to start.
const START_WAIT: Duration = Duration::from_secs(60);

/// Let connection set-up settle before reading RSS and CPU (longer than
/// konn's idle-buffer release, 1 s).
const SETTLE: Duration = Duration::from_millis(2500);

/// Bound on one round trip; a connection that misses it stops.
const RTT_TIMEOUT: Duration = Duration::from_secs(2);

fn free_port() -> u16 {
    konn_testkit::ports::free_port()
}

fn local(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

fn spawn(bins: &Binaries, program: &Path, args: &[String], log: &Path) -> Result<Proc, Error> {
    Proc::spawn_with(program, args, log, &bins.env, None).map_err(|e| Error::Write(log.into(), e))
}

impl Stack {
    /// konn: one server with every cluster in its `--clusters-config`.
    fn konn(bins: &Binaries, dir: &Path, pkis: &[PkiFiles]) -> Result<Self, Error> {
        let mut yaml = String::from("clusters:\n");
        let mut sockets = Vec::new();
        for (i, p) in pkis.iter().enumerate() {
            let sock = dir.join(format!("konn-c{i}.sock"));
            yaml.push_str(&format!(
                "- name: c{i}\n  frontend:\n    uds: {}\n  agents:\n    serverNames: [{}]\n    \
                 cert: {}\n    key: {}\n    clientCA: {}\n",
                sock.display(),
                server_name(i),
                p.server_cert.display(),
                p.server_key.display(),
                p.ca_cert.display(),
            ));
            sockets.push(sock);
        }
        let config = dir.join("clusters.yaml");
        std::fs::write(&config, yaml).map_err(|e| Error::Write(config.clone(), e))?;
        let (agent, health, admin) = (free_port(), free_port(), free_port());
        let mut args = vec![
            format!("--clusters-config={}", config.display()),
            "--agent-bind-address=127.0.0.1".into(),
            format!("--agent-port={agent}"),
            "--health-bind-address=127.0.0.1".into(),
            format!("--health-port={health}"),
            "--admin-bind-address=127.0.0.1".into(),
            format!("--admin-port={admin}"),
            "--server-count=1".into(),
        ];
        args.extend_from_slice(&bins.server_flags);
        let server = spawn(bins, &bins.server, &args, &dir.join("konn-server.log"))?;
        let me = Self {
            servers: vec![server],
            agents: Vec::new(),
            sockets,
            health: vec![local(health)],
            agent_ports: vec![agent; pkis.len()],
            shared: true,
        };
        me.wait_started()?;
        Ok(me)
    }

    /// Upstream: a server per cluster, each with its own ports.
    fn upstream(bins: &Binaries, dir: &Path, pkis: &[PkiFiles]) -> Result<Self, Error> {
        let mut me = Self {
            servers: Vec::new(),
            agents: Vec::new(),
            sockets: Vec::new(),
            health: Vec::new(),
            agent_ports: Vec::new(),
            shared: false,
        };
        for (i, p) in pkis.iter().enumerate() {
            let sock = dir.join(format!("up-c{i}.sock"));
            let (agent, health, admin) = (free_port(), free_port(), free_port());
            let mut args = vec![
                "--mode=grpc".into(),
                format!("--uds-name={}", sock.display()),
                "--server-port=0".into(),
                "--delete-existing-uds-file=true".into(),
                format!("--cluster-cert={}", p.server_cert.display()),
                format!("--cluster-key={}", p.server_key.display()),
                format!("--cluster-ca-cert={}", p.ca_cert.display()),
                "--agent-bind-address=127.0.0.1".into(),
                format!("--agent-port={agent}"),
                "--health-bind-address=127.0.0.1".into(),
                format!("--health-port={health}"),
                "--admin-bind-address=127.0.0.1".into(),
                format!("--admin-port={admin}"),
                "--server-count=1".into(),
            ];
            args.extend_from_slice(&bins.server_flags);
            let log = dir.join(format!("up-server-c{i}.log"));
            me.servers.push(spawn(bins, &bins.server, &args, &log)?);
            me.sockets.push(sock);
            me.health.push(local(health));
            me.agent_ports.push(agent);
        }
        me.wait_started()?;
        Ok(me)
    }

    fn wait_started(&self) -> Result<(), Error> {
        for (s, h) in self.servers.iter().zip(&self.health) {
            if !wait_http_ok(*h, "/healthz", START_WAIT) {
                return Err(Error::Closed(format!(
                    "a server did not start:\n{}",
                    s.log_tail(20)
                )));
            }
        }
        Ok(())
    }

    /// Spawn one agent per cluster and wait until every cluster is ready;
    /// returns how long that took.
    fn connect_agents(
        &mut self,
        bins: &Binaries,
        dir: &Path,
        pkis: &[PkiFiles],
    ) -> Result<Duration, Error> {
        let n = pkis.len();
        let started = now();
        for (i, p) in pkis.iter().enumerate() {
            let port = self.agent_ports.get(i).copied().unwrap_or_default();
            let mut args = vec![
                format!("--proxy-server-host={}", server_name(i)),
                format!("--proxy-server-port={port}"),
                format!("--ca-cert={}", p.ca_cert.display()),
                format!("--agent-cert={}", p.agent_cert.display()),
                format!("--agent-key={}", p.agent_key.display()),
                format!("--agent-id=c{i}"),
                "--health-server-host=127.0.0.1".into(),
                format!("--health-server-port={}", free_port()),
                "--admin-bind-address=127.0.0.1".into(),
                format!("--admin-server-port={}", free_port()),
            ];
            args.extend_from_slice(&bins.agent_flags);
            let log = dir.join(format!("{}-agent-c{i}.log", bins.name));
            self.agents.push(spawn(bins, &bins.agent, &args, &log)?);
        }
        // Generous: spawning and handshakes of hundreds of processes on a
        // small shared machine.
        let deadline = started + Duration::from_secs(30) + Duration::from_millis(300) * n as u32;
        let mut done = vec![false; n];
        loop {
            if self.ready(&mut done) >= n {
                return Ok(now() - started);
            }
            if now() > deadline {
                let tail = self
                    .agents
                    .first()
                    .map(|a| a.log_tail(10))
                    .unwrap_or_default();
                return Err(Error::Closed(format!(
                    "{} of {n} clusters ready after {:?}; an agent's log:\n{tail}",
                    self.ready(&mut done),
                    now() - started
                )));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Clusters ready now.
    fn ready(&self, done: &mut [bool]) -> usize {
        if self.shared {
            return match http_get(self.health[0], "/readyz?verbose") {
                Ok((_, body)) => body.lines().filter(|l| l.starts_with("[+]")).count(),
                Err(_) => 0,
            };
        }
        for (i, h) in self.health.iter().enumerate() {
            if let Some(d) = done.get_mut(i)
                && !*d
            {
                *d = matches!(http_get(*h, "/readyz"), Ok((200, _)));
            }
        }
        done.iter().filter(|d| **d).count()
    }

    fn pids(&self) -> (Vec<u32>, Vec<u32>) {
        (
            self.servers.iter().map(Proc::pid).collect(),
            self.agents.iter().map(Proc::pid).collect(),
        )
    }
}

/// CPU time of every process in `pids`.
fn cpu_sum(pids: &[u32]) -> Duration {
    pids.iter().filter_map(|p| cpu_ticks(*p)).sum()
}

fn rss_sum(pids: &[u32]) -> u64 {
    pids.iter().filter_map(|p| rss_kib(*p)).sum()
}

/// CPU of `servers` and `agents` at one instant.
struct CpuAt(Duration, Duration, Instant);

impl CpuAt {
    fn take(servers: &[u32], agents: &[u32]) -> Self {
        Self(cpu_sum(servers), cpu_sum(agents), now())
    }

    /// Usage from `self` until now, with RSS read now.
    fn usage(&self, servers: &[u32], agents: &[u32]) -> Usage {
        let end = Self::take(servers, agents);
        let secs = (end.2 - self.2).as_secs_f64().max(1e-3);
        Usage {
            servers_rss_kib: rss_sum(servers),
            agents_rss_kib: rss_sum(agents),
            servers_cpu: end.0.saturating_sub(self.0).as_secs_f64() / secs,
            agents_cpu: end.1.saturating_sub(self.1).as_secs_f64() / secs,
        }
    }
}

/// What the load thread reports.
struct LoadResult {
    lat: Lat,
    timeouts: u64,
}

/// The load generator, on its own thread and runtime: one connection per
/// socket, opened, then (on `go`) pinged at `rate` messages per second in
/// total for `warm + window`, latency recorded in the window only.
fn load_thread(
    sockets: Vec<PathBuf>,
    cfg: &Config,
    opened: mpsc::Sender<Result<(), String>>,
    go: mpsc::Receiver<()>,
) -> std::thread::JoinHandle<Result<LoadResult, String>> {
    let (rate, size, warm, window) = (cfg.rate, cfg.size, cfg.warm, cfg.window);
    std::thread::spawn(move || {
        block_on(Engine::Epoll, async move {
            let dests = Dests::start().map_err(|e| format!("destinations: {e}"))?;
            let mut conns = Vec::with_capacity(sockets.len());
            for (i, s) in sockets.iter().enumerate() {
                let route = Route::Grpc(s.clone());
                match Conn::open(&route, dests.echo_for(i), Duration::from_secs(5)).await {
                    Ok(c) => conns.push(c),
                    Err(e) => {
                        let msg = format!("cluster {i}: dial: {e}");
                        let _ = opened.send(Err(msg.clone()));
                        return Err(msg);
                    }
                }
            }
            let _ = opened.send(Ok(()));
            go.recv_timeout(Duration::from_secs(60))
                .map_err(|_| "no go".to_owned())?;
            let n = conns.len().max(1);
            let origin = monoio::time::Instant::now();
            let from = origin + warm;
            let end = from + window;
            let interval = Duration::from_secs_f64(n as f64 / rate);
            let total = Rc::new(RefCell::new(LoadResult {
                lat: Lat::new(),
                timeouts: 0,
            }));
            let msg = bytes::Bytes::from(vec![0x5a; size]);
            let mut tasks = Vec::with_capacity(n);
            for (i, mut c) in conns.into_iter().enumerate() {
                let (total, msg) = (total.clone(), msg.clone());
                let offset = interval * i as u32 / n as u32;
                tasks.push(monoio::spawn(async move {
                    let mut lat = Lat::new();
                    let mut timeouts = 0;
                    let mut k = 0u32;
                    loop {
                        let intended = origin + offset + interval * k;
                        if intended >= end {
                            break;
                        }
                        k += 1;
                        sleep_until(intended).await;
                        let r = async {
                            c.write(msg.clone()).await?;
                            c.read_n(size, RTT_TIMEOUT).await
                        };
                        match monoio::time::timeout(RTT_TIMEOUT, r).await {
                            Ok(Ok(())) => {
                                // From the intended start: a late send
                                // counts (coordinated omission).
                                if intended >= from {
                                    lat.record(intended.elapsed());
                                }
                            }
                            _ => {
                                timeouts += 1;
                                break;
                            }
                        }
                    }
                    c.close(Duration::from_secs(2)).await;
                    let mut t = total.borrow_mut();
                    t.lat.merge(&lat);
                    t.timeouts += timeouts;
                }));
            }
            for t in tasks {
                t.await;
            }
            drop(dests);
            Rc::try_unwrap(total)
                .map(RefCell::into_inner)
                .map_err(|_| "load tasks still running".to_owned())
        })
        .map_err(|e| format!("runtime: {e}"))?
    })
}

/// Run one stack for `pkis.len()` clusters: konn's one server for all
/// (`shared`), or upstream's one per cluster.
fn run_stack(
    cfg: &Config,
    bins: &Binaries,
    shared: bool,
    dir: &Path,
    pkis: &[PkiFiles],
) -> Result<Row, Error> {
    let mut stack = if shared {
        Stack::konn(bins, dir, pkis)?
    } else {
        Stack::upstream(bins, dir, pkis)?
    };
    let setup = stack.connect_agents(bins, dir, pkis)?;
    let (servers, agents) = stack.pids();
    std::thread::sleep(SETTLE);
    let at = CpuAt::take(&servers, &agents);
    std::thread::sleep(cfg.idle);
    let idle = at.usage(&servers, &agents);

    let (opened_tx, opened_rx) = mpsc::channel();
    let (go_tx, go_rx) = mpsc::channel();
    let load = load_thread(stack.sockets.clone(), cfg, opened_tx, go_rx);
    let opened = opened_rx
        .recv_timeout(START_WAIT)
        .map_err(|_| Error::Timeout("load connections to open"))
        .and_then(|r| r.map_err(Error::Closed));
    if let Err(e) = opened {
        let _ = load.join();
        return Err(e);
    }
    let _ = go_tx.send(());
    std::thread::sleep(cfg.warm);
    let at = CpuAt::take(&servers, &agents);
    std::thread::sleep(cfg.window);
    let busy = at.usage(&servers, &agents);
    let result = load
        .join()
        .map_err(|_| Error::Closed("load thread panicked".into()))?
        .map_err(Error::Closed)?;
    drop(stack);
    Ok(Row {
        name: bins.name.clone(),
        clusters: pkis.len(),
        servers: servers.len(),
        setup,
        idle,
        load: busy,
        messages: result.lat.count(),
        p50_us: result.lat.quantile_us(0.5),
        p99_us: result.lat.quantile_us(0.99),
        timeouts: result.timeouts,
    })
}

/// Every cluster count, konn then upstream; `progress` is told of each
/// row as it is measured.
pub fn run(cfg: &Config, dir: &Path, mut progress: impl FnMut(&Row)) -> Result<Vec<Row>, Error> {
    let most = cfg.clusters.iter().copied().max().unwrap_or(0);
    let mut pkis = Vec::with_capacity(most);
    for i in 0..most {
        let name = server_name(i);
        pkis.push(write_for(
            &dir.join(format!("pki-c{i}")),
            Spec {
                server_names: &[name.as_str()],
                client_ou: None,
            },
        )?);
    }
    let mut rows = Vec::new();
    for &n in &cfg.clusters {
        let stacks =
            std::iter::once((&cfg.konn, true)).chain(cfg.upstream.as_ref().map(|u| (u, false)));
        for (bins, shared) in stacks {
            let row = run_stack(cfg, bins, shared, dir, &pkis[..n])?;
            progress(&row);
            rows.push(row);
        }
    }
    Ok(rows)
}

/// The rows as a markdown table.
pub fn markdown(rows: &[Row]) -> String {
    let mib = |k: u64| k as f64 / 1024.0;
    let pct = |c: f64| c * 100.0;
    let mut s = String::from(
        "| clusters | stack | server processes | all agents ready in | idle RSS servers / agents (MiB) | \
         idle CPU servers / agents (% of a core) | load RSS servers (MiB) | load CPU servers / agents (%) | \
         RTT p50 / p99 (µs) | round trips | timeouts |\n|---:|---|---:|---:|---|---|---:|---|---|---:|---:|\n",
    );
    for r in rows {
        s.push_str(&format!(
            "| {} | {} | {} | {:.2} s | {:.1} / {:.1} | {:.1} / {:.1} | {:.1} | {:.1} / {:.1} | {:.0} / {:.0} | {} | {} |\n",
            r.clusters,
            r.name,
            r.servers,
            r.setup.as_secs_f64(),
            mib(r.idle.servers_rss_kib),
            mib(r.idle.agents_rss_kib),
            pct(r.idle.servers_cpu),
            pct(r.idle.agents_cpu),
            mib(r.load.servers_rss_kib),
            pct(r.load.servers_cpu),
            pct(r.load.agents_cpu),
            r.p50_us,
            r.p99_us,
            r.messages,
            r.timeouts,
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_name_every_cluster() {
        let h = hosts_file(3);
        assert!(h.contains("127.0.0.1 c0.konn.test\n"));
        assert!(h.contains("127.0.0.1 c2.konn.test\n"));
        assert!(!h.contains("c3."));
    }

    #[test]
    fn markdown_has_a_row_per_stack() {
        let row = Row {
            name: "konn".into(),
            clusters: 10,
            servers: 1,
            setup: Duration::from_millis(250),
            idle: Usage {
                servers_rss_kib: 2048,
                agents_rss_kib: 10240,
                servers_cpu: 0.001,
                agents_cpu: 0.002,
            },
            load: Usage::default(),
            messages: 5000,
            p50_us: 120.4,
            p99_us: 900.0,
            timeouts: 0,
        };
        let md = markdown(&[row]);
        assert_eq!(md.lines().count(), 3, "{md}");
        assert!(
            md.contains("| 10 | konn | 1 | 0.25 s | 2.0 / 10.0 | 0.1 / 0.2 |"),
            "{md}"
        );
    }
}
