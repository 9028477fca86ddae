//! S9 (`konn-bench agents`): how many agent tunnels one proxy-server
//! holds, and what they cost. Agent processes are too heavy to run by the
//! thousand, so a load generator in this process speaks the agent's side
//! of the protocol — TCP, TLS with the agent's client certificate (mTLS),
//! HTTP/2, the `/AgentService/Connect` call with its `agentid` — for N
//! agents at once, on a few threads with a monoio runtime each. The same
//! generator runs against konn's server and upstream's. Measured per
//! server:
//!
//! - **connect**: from starting the generator until the server reports N
//!   ready backends (`…_ready_backend_connections`, polled every 20 ms);
//!   TLS handshakes per second = N / that time, with at most
//!   [`IN_FLIGHT`] handshakes in flight per generator thread; the server's
//!   CPU (utime + stime) meanwhile;
//! - **memory**: the server's resident memory with N tunnels minus its
//!   resident memory before the first, per tunnel;
//! - **storm**: SIGKILL the server and start it again on the same port; the
//!   generator's agents reconnect as upstream's agents do: each agent's
//!   sync loop wakes every `--sync-interval` (1 s, 10 % jitter) and opens
//!   a tunnel when it has none, waiting ×1.5 longer after each failure
//!   (capped at 10 s) — see [`agent`]; the time from the new server's spawn
//!   until all N are back, its CPU and its peak resident memory (`VmHWM`),
//!   and the generator's connection attempts.
//!
//! The generator shares the machine with the server (on the 2-vCPU
//! reference machine, both cores), the same for both implementations.
//! Every wait has a deadline.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::path::Path;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use konn_core::io::clock::now;
use konn_core::io::driver::{ConnHandle, DriverConfig, Handler};
use konn_core::io::notify::Notify;
use konn_core::io::resolve::dial_tcp;
use konn_core::io::runtime::{Engine, block_on, race};
use konn_core::io::tls::{ClientTls, ClientTlsOptions, PemSource};
use konn_protocol::grpc::{Grpc, GrpcEvent};
use konn_protocol::h2::{Config as H2Config, Connection, Headers, Role};
use konn_testkit::Error;
use konn_testkit::pki::PkiFiles;
use konn_testkit::procs::{Proc, http_get, wait_http_ok};

use super::{Binaries, cpu_ticks, rss_kib};

/// Handshakes one generator thread keeps in flight.
pub const IN_FLIGHT: usize = 128;

/// Bound on one dial, handshake and Connect answer.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(10);

/// Let set-up settle before reading resident memory (longer than konn's
/// idle-buffer release, 1 s).
const SETTLE: Duration = Duration::from_millis(2500);

const READY: &str = "konnectivity_network_proxy_server_ready_backend_connections";

/// What to run.
#[derive(Clone, Debug)]
pub struct Config {
    /// Agent tunnels.
    pub agents: usize,
    /// Generator threads.
    pub threads: usize,
    /// konn's binaries.
    pub konn: Binaries,
    /// Upstream's binaries (`None`: konn only).
    pub upstream: Option<Binaries>,
}

/// One server's figures.
#[derive(Clone, Debug, Default)]
pub struct Row {
    /// `konn` or `upstream`.
    pub name: String,
    /// Agent tunnels.
    pub agents: usize,
    /// From the generator's start until every tunnel was ready.
    pub connect: Duration,
    /// The server's CPU over `connect`, seconds.
    pub connect_cpu_s: f64,
    /// Resident memory before the first tunnel, KiB.
    pub rss_before_kib: u64,
    /// With every tunnel, KiB.
    pub rss_full_kib: u64,
    /// From the restarted server's spawn until every tunnel was back.
    pub storm: Duration,
    /// The restarted server's CPU until then, seconds.
    pub storm_cpu_s: f64,
    /// The restarted server's peak resident memory, KiB.
    pub storm_peak_kib: u64,
    /// The generator's connection attempts during the storm.
    pub storm_attempts: u64,
}

impl Row {
    /// TLS handshakes (tunnels) per second while connecting.
    pub fn handshakes_per_s(&self) -> f64 {
        self.agents as f64 / self.connect.as_secs_f64().max(1e-9)
    }

    /// Resident memory per tunnel, KiB.
    pub fn kib_per_tunnel(&self) -> f64 {
        self.rss_full_kib.saturating_sub(self.rss_before_kib) as f64 / self.agents.max(1) as f64
    }
}

/// What the generator threads share.
#[derive(Default)]
struct Shared {
    /// Tunnels accepted and still open.
    connected: AtomicUsize,
    /// Connection attempts so far.
    attempts: AtomicU64,
    /// Stop reconnecting.
    stop: AtomicBool,
}

/// The Connect call's answer.
#[derive(Default)]
struct Answer {
    accepted: Rc<Cell<Option<bool>>>,
    done: Rc<Notify>,
}

impl Handler<Grpc> for Answer {
    fn on_event(&mut self, _g: &mut Grpc, ev: GrpcEvent) {
        let accepted = match ev {
            GrpcEvent::ResponseHeaders { .. } => true,
            GrpcEvent::Finished { .. } => false,
            _ => return,
        };
        if self.accepted.get().is_none() {
            self.accepted.set(Some(accepted));
            self.done.notify();
        }
    }
}

/// A small splitmix64 generator for the backoff's jitter.
struct Rng(u64);

impl Rng {
    fn unit(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(1);
        konn_testkit::relay::splitmix(self.0) as f64 / u64::MAX as f64
    }
}

/// Where one connection attempt of an agent stands.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Tunnel {
    /// Dialling, handshaking, waiting for the Connect answer.
    Opening,
    /// Accepted and open.
    Open,
    /// Ended (refused, failed, or closed by the server).
    Ended,
}

/// One connection attempt: dial, TLS, Connect. Returns once the server has
/// answered (or the attempt failed), with whether it accepted; an accepted
/// tunnel goes on in its own task, and `state` says when it has ended.
/// `slot` is released once the handshake phase is over.
async fn open_tunnel(
    addr: &str,
    tls: &ClientTls,
    md: &Headers,
    sh: &Arc<Shared>,
    state: &Rc<Cell<Tunnel>>,
    slot: SlotGuard,
) -> bool {
    sh.attempts.fetch_add(1, Ordering::Relaxed);
    let Ok(stream) = dial_tcp(addr, ATTEMPT_TIMEOUT).await else {
        return false;
    };
    let Ok(layer) = tls.layer() else { return false };
    let answer = Answer::default();
    let (accepted, done) = (answer.accepted.clone(), answer.done.clone());
    let grpc = Grpc::new(
        Connection::new(H2Config::new(Role::Client), now()),
        konn_frames::grpc::DEFAULT_MAX_RECV_MESSAGE_SIZE,
    );
    let handle = ConnHandle::new(grpc, Some(layer), answer, DriverConfig::default());
    let started = handle.with(|g, _| {
        g.start_call(
            "https",
            Bytes::copy_from_slice(addr.as_bytes()),
            Bytes::from_static(b"/AgentService/Connect"),
            md,
        )
    });
    if !matches!(started, Ok(Ok(_))) {
        return false;
    }
    let (h2, ended, shared) = (handle.clone(), state.clone(), sh.clone());
    // Detached when accepted (monoio's `JoinHandle` does not cancel on
    // drop): the tunnel lives until the server ends it.
    let run = monoio::spawn(async move {
        let _ = h2.run(stream).await;
        if ended.replace(Tunnel::Ended) == Tunnel::Open {
            shared.connected.fetch_sub(1, Ordering::AcqRel);
        }
    });
    let _ = race(done.notified(), monoio::time::sleep(ATTEMPT_TIMEOUT)).await;
    drop(slot);
    if accepted.get() == Some(true) && state.get() == Tunnel::Opening {
        state.set(Tunnel::Open);
        sh.connected.fetch_add(1, Ordering::AcqRel);
        true
    } else {
        handle.abort();
        run.await;
        false
    }
}

/// A generator thread's handshake slots: at most [`IN_FLIGHT`] taken, the
/// other agents wait their turn in order (woken once each, not polling).
#[derive(Default)]
struct Slots {
    taken: Cell<usize>,
    waiting: RefCell<VecDeque<Rc<Notify>>>,
}

impl Slots {
    async fn take(self: &Rc<Self>) -> SlotGuard {
        if self.taken.get() < IN_FLIGHT && self.waiting.borrow().is_empty() {
            self.taken.set(self.taken.get() + 1);
        } else {
            let turn = Rc::new(Notify::new());
            self.waiting.borrow_mut().push_back(turn.clone());
            // The slot is handed over by the guard that frees it.
            turn.notified().await;
        }
        SlotGuard(self.clone())
    }
}

/// A taken slot, handed to the next waiter (or freed) on drop.
struct SlotGuard(Rc<Slots>);

impl Drop for SlotGuard {
    fn drop(&mut self) {
        let next = self.0.waiting.borrow_mut().pop_front();
        match next {
            Some(turn) => turn.notify(),
            None => self.0.taken.set(self.0.taken.get().saturating_sub(1)),
        }
    }
}

/// Sleeps `d` in slices of at most a few seconds, returning early once the
/// generator stops.
async fn pause(d: Duration, sh: &Shared) {
    let end = now() + d;
    while !sh.stop.load(Ordering::Acquire) && now() < end {
        monoio::time::sleep((end - now()).min(Duration::from_secs(2))).await;
    }
}

/// One agent, as upstream's agent keeps its connections (`ClientSet.sync`,
/// v0.36): a loop that wakes every `--sync-interval` (1 s, +0–10 %
/// jitter) whether or not a tunnel is open, and opens one when there is
/// none; after a failed attempt it waits ×1.5 longer each time (capped at
/// 10 s), after a success or an idle turn the plain interval again. The
/// tunnel itself runs apart from the loop, so when it is cut the next
/// attempt comes at the loop's next turn — anywhere up to a second later,
/// not a whole interval after the cut.
async fn agent(addr: Rc<str>, tls: ClientTls, id: usize, sh: Arc<Shared>, slots: Rc<Slots>) {
    let mut md = Headers::new();
    md.push(
        Bytes::from_static(b"agentid"),
        Bytes::from(format!("s9-agent-{id:05}")),
    );
    md.push(Bytes::from_static(b"agentidentifiers"), Bytes::new());
    let (base, cap) = (Duration::from_secs(1), Duration::from_secs(10));
    let mut rng = Rng(id as u64);
    let mut jitter = |d: Duration| d.mul_f64(1.0 + 0.1 * rng.unit());
    let mut backoff = base;
    let mut state = Rc::new(Cell::new(Tunnel::Ended));
    while !sh.stop.load(Ordering::Acquire) {
        let ok = state.get() != Tunnel::Ended || {
            state = Rc::new(Cell::new(Tunnel::Opening));
            let slot = slots.take().await;
            let ok = open_tunnel(&addr, &tls, &md, &sh, &state, slot).await;
            if !ok {
                state.set(Tunnel::Ended);
            }
            ok
        };
        let wait = if ok {
            backoff = base;
            jitter(base)
        } else {
            let d = jitter(backoff);
            backoff = backoff.mul_f64(1.5).min(cap);
            d
        };
        pause(wait, &sh).await;
    }
}

/// The generator: `threads` threads, each with its share of `agents`.
struct Generator {
    shared: Arc<Shared>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Generator {
    fn start(addr: SocketAddr, tls: &ClientTls, agents: usize, threads: usize) -> Self {
        let shared = Arc::new(Shared::default());
        let threads = (0..threads)
            .map(|t| {
                let (sh, tls) = (shared.clone(), tls.clone());
                let mine: Vec<usize> = (0..agents).filter(|i| i % threads == t).collect();
                std::thread::spawn(move || {
                    let _ = block_on(Engine::Epoll, async move {
                        let addr: Rc<str> = Rc::from(addr.to_string());
                        let slots = Rc::new(Slots::default());
                        let tasks: Vec<_> = mine
                            .into_iter()
                            .map(|id| {
                                monoio::spawn(agent(
                                    addr.clone(),
                                    tls.clone(),
                                    id,
                                    sh.clone(),
                                    slots.clone(),
                                ))
                            })
                            .collect();
                        for t in tasks {
                            t.await;
                        }
                    });
                })
            })
            .collect();
        Self { shared, threads }
    }

    fn attempts(&self) -> u64 {
        self.shared.attempts.load(Ordering::Relaxed)
    }

    /// Stops reconnecting; the caller then ends the tunnels (kills the
    /// server) and joins.
    fn stop(&self) {
        self.shared.stop.store(true, Ordering::Release);
    }

    fn join(self) {
        for t in self.threads {
            let _ = t.join();
        }
    }
}

/// A server under test.
struct Server {
    proc: Proc,
    agent_port: u16,
    admin: SocketAddr,
}

fn local(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

impl Server {
    fn start(bins: &Binaries, pki: &PkiFiles, dir: &Path, agent_port: u16) -> Result<Self, Error> {
        let free = konn_testkit::ports::free_port;
        let (health, admin) = (free(), free());
        let sock = dir.join(format!("{}-{}.sock", bins.name, health));
        let mut args = vec![
            "--mode=grpc".into(),
            format!("--uds-name={}", sock.display()),
            "--delete-existing-uds-file=true".into(),
            "--server-port=0".into(),
            format!("--cluster-cert={}", pki.server_cert.display()),
            format!("--cluster-key={}", pki.server_key.display()),
            format!("--cluster-ca-cert={}", pki.ca_cert.display()),
            "--agent-bind-address=127.0.0.1".into(),
            format!("--agent-port={agent_port}"),
            "--health-bind-address=127.0.0.1".into(),
            format!("--health-port={health}"),
            "--admin-bind-address=127.0.0.1".into(),
            format!("--admin-port={admin}"),
            "--server-count=1".into(),
        ];
        args.extend_from_slice(&bins.server_flags);
        let log = dir.join(format!("{}-server-{health}.log", bins.name));
        let proc = Proc::spawn_with(&bins.server, &args, &log, &bins.env, None)
            .map_err(|e| Error::Write(log.clone(), e))?;
        if !wait_http_ok(local(health), "/healthz", Duration::from_secs(60)) {
            return Err(Error::Closed(format!(
                "{} server did not start:\n{}",
                bins.name,
                proc.log_tail(20)
            )));
        }
        Ok(Self {
            proc,
            agent_port,
            admin: local(admin),
        })
    }

    fn ready(&self) -> usize {
        http_get(self.admin, "/metrics")
            .ok()
            .and_then(|(_, body)| {
                body.lines().find_map(|l| {
                    l.strip_prefix(READY)
                        .and_then(|r| r.strip_prefix(' '))
                        .and_then(|v| v.parse::<f64>().ok())
                })
            })
            .map_or(0, |v| v as usize)
    }

    /// Waits until `n` tunnels are ready; how long that took.
    fn wait_ready(&self, n: usize, limit: Duration) -> Result<Duration, Error> {
        let start = now();
        loop {
            let got = self.ready();
            if got >= n {
                return Ok(now() - start);
            }
            if now() - start > limit {
                return Err(Error::Closed(format!(
                    "{got} of {n} tunnels ready after {limit:?}"
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn cpu_s(&self) -> f64 {
        cpu_ticks(self.proc.pid()).unwrap_or_default().as_secs_f64()
    }
}

/// `VmHWM` of `pid`, KiB.
fn peak_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(0)
}

/// S9 for one server implementation.
fn run_one(cfg: &Config, bins: &Binaries, pki: &PkiFiles, dir: &Path) -> Result<Row, Error> {
    let n = cfg.agents;
    let mut tls = ClientTlsOptions::new(PemSource::File(pki.ca_cert.clone()), "127.0.0.1");
    tls.identity = Some((
        PemSource::File(pki.agent_cert.clone()),
        PemSource::File(pki.agent_key.clone()),
    ));
    let tls = tls
        .build()
        .map_err(|e| Error::Closed(format!("agent TLS: {e}")))?;
    let mut server = Server::start(bins, pki, dir, konn_testkit::ports::free_port())?;
    std::thread::sleep(SETTLE);
    let rss_before_kib = rss_kib(server.proc.pid()).unwrap_or(0);
    let cpu0 = server.cpu_s();
    // Generous: thousands of handshakes on a small shared machine.
    let limit = Duration::from_secs(60) + Duration::from_millis(20) * n as u32;
    let generator = Generator::start(local(server.agent_port), &tls, n, cfg.threads);
    let state = |server: &Server, e: Error| {
        Error::Closed(format!(
            "{e}; the generator holds {} tunnels after {} attempts; the server's log ends:\n{}",
            generator.shared.connected.load(Ordering::Acquire),
            generator.attempts(),
            server.proc.log_tail(15)
        ))
    };
    let result = (|| {
        let connect = server.wait_ready(n, limit).map_err(|e| state(&server, e))?;
        let connect_cpu_s = server.cpu_s() - cpu0;
        std::thread::sleep(SETTLE);
        let rss_full_kib = rss_kib(server.proc.pid()).unwrap_or(0);

        let attempts = generator.attempts();
        server.proc.kill();
        let spawned = now();
        server = Server::start(bins, pki, dir, server.agent_port)?;
        server.wait_ready(n, limit).map_err(|e| state(&server, e))?;
        let storm = now() - spawned;
        Ok(Row {
            name: bins.name.clone(),
            agents: n,
            connect,
            connect_cpu_s,
            rss_before_kib,
            rss_full_kib,
            storm,
            storm_cpu_s: server.cpu_s(),
            storm_peak_kib: peak_kib(server.proc.pid()),
            storm_attempts: generator.attempts() - attempts,
        })
    })();
    generator.stop();
    server.proc.kill();
    generator.join();
    result
}

/// S9 for konn, then upstream (when given); `progress` sees each row.
///
/// # Errors
/// A server does not start, or the tunnels are not all ready in time.
pub fn run(cfg: &Config, dir: &Path, mut progress: impl FnMut(&Row)) -> Result<Vec<Row>, Error> {
    let pki = konn_testkit::pki::write(&dir.join("pki"))?;
    let mut rows = Vec::new();
    for bins in std::iter::once(&cfg.konn).chain(cfg.upstream.as_ref()) {
        let row = run_one(cfg, bins, &pki, dir)?;
        progress(&row);
        rows.push(row);
    }
    Ok(rows)
}

/// The rows as a markdown table, with konn's ratios to upstream.
pub fn markdown(rows: &[Row]) -> String {
    let mut s = String::from(
        "| server | agent tunnels | all connected in | TLS handshakes/s | server CPU while connecting (s) | \
         RSS before / with all (MiB) | RSS per tunnel (KiB) | storm: all back in | storm server CPU (s) | \
         storm peak RSS (MiB) | storm attempts |\n|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|\n",
    );
    let mib = |k: u64| k as f64 / 1024.0;
    for r in rows {
        s.push_str(&format!(
            "| {} | {} | {:.2} s | {:.0} | {:.2} | {:.1} / {:.1} | {:.1} | {:.2} s | {:.2} | {:.1} | {} |\n",
            r.name,
            r.agents,
            r.connect.as_secs_f64(),
            r.handshakes_per_s(),
            r.connect_cpu_s,
            mib(r.rss_before_kib),
            mib(r.rss_full_kib),
            r.kib_per_tunnel(),
            r.storm.as_secs_f64(),
            r.storm_cpu_s,
            mib(r.storm_peak_kib),
            r.storm_attempts,
        ));
    }
    if let [k, u] = rows {
        s.push_str(&format!(
            "\nkonn / upstream: RSS per tunnel {:.2}×, storm time {:.2}×, handshakes/s {:.2}×\n",
            k.kib_per_tunnel() / u.kib_per_tunnel().max(1e-9),
            k.storm.as_secs_f64() / u.storm.as_secs_f64().max(1e-9),
            k.handshakes_per_s() / u.handshakes_per_s().max(1e-9),
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratios_and_table() {
        let row = |name: &str, kib: u64, storm: u64| Row {
            name: name.into(),
            agents: 1000,
            connect: Duration::from_secs(2),
            rss_before_kib: 10_000,
            rss_full_kib: 10_000 + kib * 1000,
            storm: Duration::from_secs(storm),
            ..Row::default()
        };
        let (k, u) = (row("konn", 10, 2), row("upstream", 40, 8));
        assert!((k.kib_per_tunnel() - 10.0).abs() < 1e-9);
        assert!((k.handshakes_per_s() - 500.0).abs() < 1e-9);
        let md = markdown(&[k, u]);
        assert_eq!(md.lines().count(), 6, "{md}");
        assert!(
            md.contains("RSS per tunnel 0.25×, storm time 0.25×"),
            "{md}"
        );
    }

    #[test]
    fn a_freed_slot_goes_to_the_first_waiter() {
        block_on(Engine::Epoll, async {
            let slots = Rc::new(Slots::default());
            let mut held = Vec::new();
            for _ in 0..IN_FLIGHT {
                held.push(slots.take().await);
            }
            let got = Rc::new(Cell::new(Vec::new()));
            let waiters: Vec<_> = (0..2)
                .map(|i| {
                    let (slots, got) = (slots.clone(), got.clone());
                    monoio::spawn(async move {
                        let g = slots.take().await;
                        let mut v = got.take();
                        v.push(i);
                        got.set(v);
                        g
                    })
                })
                .collect();
            konn_core::io::runtime::yield_now().await;
            assert_eq!(slots.waiting.borrow().len(), 2, "both wait");
            drop(held.pop());
            let mut waiters = waiters.into_iter();
            let first = waiters.next().unwrap().await;
            assert_eq!(got.take(), vec![0]);
            assert_eq!(slots.taken.get(), IN_FLIGHT, "handed over, not freed");
            drop(first);
            let second = waiters.next().unwrap().await;
            drop(second);
            held.clear();
            assert_eq!(slots.taken.get(), 0);
            assert!(slots.waiting.borrow().is_empty());
        })
        .unwrap();
    }

    #[test]
    fn jitter_stays_in_unit_interval() {
        let mut r = Rng(7);
        assert!(
            (0..1000)
                .map(|_| r.unit())
                .all(|x| (0.0..=1.0).contains(&x))
        );
    }
}
