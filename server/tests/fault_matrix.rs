//! The fault-injection matrix (reference reliability-security.md §4.4),
//! short form: real `proxy-server` and `proxy-agent` processes — konn's,
//! and upstream's v0.36 where they are built (`UPSTREAM_BIN_DIR`; skipped
//! when absent unless `KONN_UPSTREAM_REQUIRED` is set) — with mTLS on the
//! agent port, an HTTP-CONNECT frontend on a Unix socket, echo
//! destinations, and the chaos proxy of konn-testkit on the agent ↔ server
//! or agent ↔ destination path.
//!
//! konn runs with `--resume-window=0` unless a row says otherwise: the
//! reference's criteria are those of a tunnel whose break cuts its
//! connections, as upstream's does; row 06d shows the same cut with
//! konn's resumable tunnels on (docs/design/resume.md).
//!
//! Every row states its pass criterion, checks the SHA-256 of the bytes on
//! every path that should survive (and that a path that dies delivered only
//! a correct prefix), checks the servers' tables (established connections,
//! pending dials, ready backends) and the processes' descriptors back to
//! their baseline, and bounds every detection time. konn must pass; for
//! upstream the outcome is only recorded. Each outcome is written to
//! `target/reliability/<row>.<impl>.json`; `scripts/reliability-report`
//! renders docs/RELIABILITY.md from them.

#![allow(clippy::disallowed_methods)] // measuring detection times needs the clock

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use konn_testkit::blocking::ReadRetry;
use konn_testkit::chaos::{ChaosProxy, Dir, Faults};
use konn_testkit::files::TempDir;
use konn_testkit::pki::PkiFiles;
use konn_testkit::ports::free_port;
use konn_testkit::procs::{Proc, binary, file_tail, http_get, upstream_binary, wait_http_ok};
use konn_testkit::wait::wait_until;
use konn_testkit::{Pattern, Sha256};

mod fault_attacks;
mod fault_common;
mod fault_fleet;

/// Bound on start-up and on waits that are not themselves measured.
const T: Duration = Duration::from_secs(20);

/// The agents' reconnect backoff cap in these rows (`--sync-interval-cap`).
const CAP: Duration = Duration::from_secs(1);

/// Bound on noticing a peer that sent FIN or RST (§4.1 promise 5).
const FIN_BOUND: Duration = Duration::from_secs(1);

// ---------------------------------------------------------------------------
// Implementations and processes

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Imp {
    Konn,
    Upstream,
}

impl Imp {
    fn name(self) -> &'static str {
        match self {
            Self::Konn => "konn",
            Self::Upstream => "upstream",
        }
    }

    fn bin(self, name: &str) -> PathBuf {
        match self {
            Self::Konn => binary(name).expect("konn binary"),
            Self::Upstream => upstream_binary(name).expect("upstream binary"),
        }
    }
}

/// konn, and upstream when its binaries are there.
fn imps() -> Vec<Imp> {
    let mut v = vec![Imp::Konn];
    if upstream_binary("proxy-server").is_some() && upstream_binary("proxy-agent").is_some() {
        v.push(Imp::Upstream);
    } else {
        assert!(
            std::env::var_os("KONN_UPSTREAM_REQUIRED").is_none(),
            "KONN_UPSTREAM_REQUIRED is set but upstream's binaries are not built"
        );
        eprintln!("upstream binaries not found (UPSTREAM_BIN_DIR): konn only");
    }
    v
}

/// `--resume-window=0` unless `extra` sets the window (see the module
/// docs).
fn no_resume(extra: &[&str]) -> Option<String> {
    (!extra.iter().any(|a| a.starts_with("--resume-window")))
        .then(|| "--resume-window=0".to_owned())
}

/// konn's flags for a row with resumable tunnels on (upstream has none).
fn resume_on(imp: Imp) -> &'static [&'static str] {
    match imp {
        Imp::Konn => &["--resume-window=10s"],
        Imp::Upstream => &[],
    }
}

fn at(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// Descriptors of process `pid`.
fn fds_of(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, Iterator::count)
}

/// The value of `series` in a scrape.
fn metric(scrape: &str, series: &str) -> Option<f64> {
    scrape.lines().find_map(|l| {
        l.strip_prefix(series)
            .and_then(|rest| rest.strip_prefix(' '))
            .and_then(|v| v.parse().ok())
    })
}

struct Server {
    proc: Proc,
    uds: PathBuf,
    agent_port: u16,
    admin: SocketAddr,
}

const READY: &str = "konnectivity_network_proxy_server_ready_backend_connections";
const ESTABLISHED: &str = "konnectivity_network_proxy_server_established_connections";
const PENDING: &str = "konnectivity_network_proxy_server_pending_backend_dials";

impl Server {
    /// Starts `imp`'s server with the agent port `agent_port` (0: a free
    /// one) and waits until it is healthy.
    fn start(imp: Imp, dir: &TempDir, pki: &PkiFiles, agent_port: u16, extra: &[&str]) -> Self {
        let agent_port = if agent_port == 0 {
            free_port()
        } else {
            agent_port
        };
        let (health, admin) = (free_port(), free_port());
        let uds = dir.path(&format!("{}-{agent_port}.sock", imp.name()));
        let p = |p: &Path| p.display().to_string();
        let mut args = vec![
            "--mode=http-connect".to_owned(),
            format!("--uds-name={}", p(&uds)),
            "--delete-existing-uds-file=true".to_owned(),
            "--server-port=0".to_owned(),
            format!("--cluster-cert={}", p(&pki.server_cert)),
            format!("--cluster-key={}", p(&pki.server_key)),
            format!("--cluster-ca-cert={}", p(&pki.ca_cert)),
            "--agent-bind-address=127.0.0.1".to_owned(),
            format!("--agent-port={agent_port}"),
            "--health-bind-address=127.0.0.1".to_owned(),
            format!("--health-port={health}"),
            "--admin-bind-address=127.0.0.1".to_owned(),
            format!("--admin-port={admin}"),
            "--server-count=1".to_owned(),
        ];
        if imp == Imp::Konn {
            args.push("--workers=1".to_owned());
            args.extend(no_resume(extra));
        }
        args.extend(extra.iter().map(|s| (*s).to_owned()));
        let log = dir.path(&format!("server-{}-{agent_port}.log", imp.name()));
        let proc = Proc::spawn(&imp.bin("proxy-server"), &args, &log).expect("spawn server");
        assert!(
            wait_http_ok(at(health), "/healthz", T),
            "{} server did not start:\n{}",
            imp.name(),
            proc.log_tail(30)
        );
        Self {
            proc,
            uds,
            agent_port,
            admin: at(admin),
        }
    }

    fn metric(&self, series: &str) -> f64 {
        http_get(self.admin, "/metrics")
            .ok()
            .and_then(|(_, body)| metric(&body, series))
            .unwrap_or(0.0)
    }

    fn ready(&self) -> f64 {
        self.metric(READY)
    }

    /// Established connections and pending dials both zero.
    fn tables_empty(&self) -> bool {
        self.metric(ESTABLISHED) == 0.0 && self.metric(PENDING) == 0.0
    }

    fn connect(&self, dest: SocketAddr) -> Result<UnixStream, String> {
        connect_through(&self.uds, dest)
    }
}

/// A new CONNECT through `uds` is refused: the connect fails, or the
/// answer is an error or EOF within 300 ms (no answer at all is not a
/// refusal: the client would hang).
fn refuses(uds: &Path, dest: SocketAddr) -> bool {
    let Ok(mut s) = UnixStream::connect(uds) else {
        return true;
    };
    let _ = s.set_read_timeout(Some(Duration::from_millis(300)));
    if s.write_all(format!("CONNECT {dest} HTTP/1.1\r\nHost: {dest}\r\n\r\n").as_bytes())
        .is_err()
    {
        return true;
    }
    let mut head = [0u8; 12];
    match s.read_retry(&mut head) {
        Ok(0) => true,
        Ok(n) => !head[..n].starts_with(b"HTTP/1.1 200"),
        Err(e) => !matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut),
    }
}

/// CONNECT to `dest` through the Unix socket `uds`.
fn connect_through(uds: &Path, dest: SocketAddr) -> Result<UnixStream, String> {
    let mut s = UnixStream::connect(uds).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(T)).map_err(|e| e.to_string())?;
    s.write_all(format!("CONNECT {dest} HTTP/1.1\r\nHost: {dest}\r\n\r\n").as_bytes())
        .map_err(|e| e.to_string())?;
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") && head.len() < 4096 {
        match s.read(&mut byte) {
            Ok(1) => head.push(byte[0]),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            _ => break,
        }
    }
    let text = String::from_utf8_lossy(&head).into_owned();
    if text.starts_with("HTTP/1.1 200") {
        Ok(s)
    } else {
        Err(text)
    }
}

struct Agent {
    proc: Proc,
    health: SocketAddr,
    admin: SocketAddr,
}

const OPEN_ENDPOINTS: &str = "konnectivity_network_proxy_agent_open_endpoint_connections";
const DIALS: &str = "konnectivity_network_proxy_agent_dial_duration_seconds_count";

impl Agent {
    fn start(imp: Imp, dir: &TempDir, pki: &PkiFiles, id: &str, server_port: u16) -> Self {
        Self::start_with(imp, dir, pki, id, server_port, &[])
    }

    /// [`Agent::start`] with `extra` flags after the usual ones.
    fn start_with(
        imp: Imp,
        dir: &TempDir,
        pki: &PkiFiles,
        id: &str,
        server_port: u16,
        extra: &[&str],
    ) -> Self {
        let (health, admin) = (free_port(), free_port());
        let p = |p: &Path| p.display().to_string();
        let mut args = vec![
            "--proxy-server-host=127.0.0.1".to_owned(),
            format!("--proxy-server-port={server_port}"),
            format!("--ca-cert={}", p(&pki.ca_cert)),
            format!("--agent-cert={}", p(&pki.agent_cert)),
            format!("--agent-key={}", p(&pki.agent_key)),
            format!("--agent-id={id}"),
            "--health-server-host=127.0.0.1".to_owned(),
            format!("--health-server-port={health}"),
            "--admin-bind-address=127.0.0.1".to_owned(),
            format!("--admin-server-port={admin}"),
            "--sync-interval=100ms".to_owned(),
            format!("--sync-interval-cap={}ms", CAP.as_millis()),
            "--probe-interval=100ms".to_owned(),
            "--sync-forever=true".to_owned(),
        ];
        if imp == Imp::Konn {
            args.push("--workers=1".to_owned());
            args.extend(no_resume(extra));
        }
        args.extend(extra.iter().map(|s| (*s).to_owned()));
        let log = dir.path(&format!("agent-{}-{id}-{health}.log", imp.name()));
        let proc = Proc::spawn(&imp.bin("proxy-agent"), &args, &log).expect("spawn agent");
        Self {
            proc,
            health: at(health),
            admin: at(admin),
        }
    }

    /// A series from the health or the admin port (where each
    /// implementation serves its metrics).
    fn metric(&self, series: &str) -> Option<f64> {
        [self.health, self.admin].into_iter().find_map(|a| {
            http_get(a, "/metrics")
                .ok()
                .and_then(|(_, body)| metric(&body, series))
        })
    }

    fn open_endpoints(&self) -> f64 {
        self.metric(OPEN_ENDPOINTS).unwrap_or(-1.0)
    }

    /// The destinations this agent has dialed (the dial-latency
    /// histogram's count), or why no scrape gave it (each port's error or
    /// status), so a failing row says which it was. Both implementations
    /// leave the histogram out until the first dial: a scrape that has
    /// the open-endpoint gauge but not the count is 0.
    fn dials(&self) -> Result<f64, String> {
        let mut why = Vec::new();
        for at in [self.health, self.admin] {
            match http_get(at, "/metrics") {
                Ok((status, body)) => match (metric(&body, DIALS), metric(&body, OPEN_ENDPOINTS)) {
                    (Some(n), _) => return Ok(n),
                    (None, Some(_)) => return Ok(0.0),
                    (None, None) => why.push(format!("{at}: HTTP {status} without the series")),
                },
                Err(e) => why.push(format!("{at}: {e}")),
            }
        }
        Err(why.join("; "))
    }
}

/// The destinations agents `a` and `b` dialed, once both answer and
/// dialed `n` together. A count, not the open-endpoint gauge: it holds
/// after the flows end, so a scrape that fails or answers late while the
/// machine runs the whole suite is simply asked again within `T` (with
/// the gauge, a stall longer than the flows lost the row).
fn dials_on(a: &Agent, b: &Agent, n: f64) -> Result<(f64, f64), String> {
    let started = Instant::now();
    let mut scrapes = 0u32;
    let mut held: (Result<f64, String>, Result<f64, String>) =
        (Err("not read".into()), Err("not read".into()));
    let ok = wait_until(T, || {
        scrapes += 1;
        held = (a.dials(), b.dials());
        matches!(held, (Ok(x), Ok(y)) if x + y == n)
    });
    match held {
        (Ok(x), Ok(y)) if ok => Ok((x, y)),
        _ => Err(format!(
            "agents dialed {:?} + {:?}, not {n} (the last of {scrapes} scrapes in {:?})",
            held.0,
            held.1,
            started.elapsed()
        )),
    }
}

// ---------------------------------------------------------------------------
// Destinations and flows

/// A TCP echo destination counting its open connections; optionally it
/// sends `greeting` and closes right after accepting.
struct Echo {
    addr: SocketAddr,
    open: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
}

impl Echo {
    fn start() -> Self {
        Self::start_with(None)
    }

    fn start_with(greeting: Option<&'static [u8]>) -> Self {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let open = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (o, st) = (open.clone(), stop.clone());
        std::thread::spawn(move || {
            for s in l.incoming() {
                if st.load(Ordering::Acquire) {
                    return;
                }
                let Ok(mut s) = s else { continue };
                o.fetch_add(1, Ordering::AcqRel);
                let o = o.clone();
                std::thread::spawn(move || {
                    let _ = s.set_read_timeout(Some(Duration::from_secs(120)));
                    if let Some(g) = greeting {
                        let _ = s.write_all(g);
                    } else {
                        let mut r = s.try_clone().unwrap();
                        let _ = std::io::copy(&mut r, &mut s);
                    }
                    drop(s);
                    o.fetch_sub(1, Ordering::AcqRel);
                });
            }
        });
        Self { addr, open, stop }
    }

    fn open(&self) -> usize {
        self.open.load(Ordering::Acquire)
    }
}

impl Drop for Echo {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        let _ = TcpStream::connect(self.addr);
    }
}

/// How a flow ended.
#[derive(Debug, PartialEq, Eq, Clone, Copy)]
enum End {
    /// Every byte came back.
    Complete,
    /// EOF or an error before that.
    Cut,
    /// Nothing for `T`: the connection hung.
    Hung,
}

struct FlowEnd {
    end: End,
    at: Instant,
    received: u64,
    /// What came back equals what was sent (whole or prefix).
    intact: bool,
}

/// An echo transfer of up to `chunks` × 16 KiB of a [`Pattern`], paced
/// at one chunk per 5 ms so that it is still running when a fault strikes.
/// [`Flow::finish`] stops the sending early; the flow is complete once the
/// echo of everything sent is back.
struct Flow {
    received: Arc<AtomicU64>,
    finish: Arc<AtomicBool>,
    reader: JoinHandle<FlowEnd>,
}

const CHUNK: usize = 16 * 1024;

/// A flow that receives nothing for this long hangs: longer than every
/// detection bound.
const HUNG: Duration = Duration::from_secs(40);

impl Flow {
    fn start(s: UnixStream, seed: u64, chunks: usize) -> Self {
        let finish = Arc::new(AtomicBool::new(false));
        // Bytes sent, and whether that count is final.
        let sent = Arc::new(AtomicU64::new(0));
        let sent_all = Arc::new(AtomicBool::new(false));
        let mut w = s.try_clone().unwrap();
        let (stop, sent_w, sent_all_w) = (finish.clone(), sent.clone(), sent_all.clone());
        std::thread::spawn(move || {
            let mut p = Pattern::new(seed);
            let mut buf = vec![0u8; CHUNK];
            for _ in 0..chunks {
                if stop.load(Ordering::Acquire) {
                    break;
                }
                p.fill(&mut buf);
                if w.write_all(&buf).is_err() {
                    return;
                }
                sent_w.fetch_add(CHUNK as u64, Ordering::Release);
                // Pacing the load (not synchronisation).
                std::thread::sleep(Duration::from_millis(5));
            }
            sent_all_w.store(true, Ordering::Release);
        });
        let received = Arc::new(AtomicU64::new(0));
        let got = received.clone();
        let mut r = s;
        // Short reads, so that the end of the sending is noticed.
        r.set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        let reader = std::thread::spawn(move || {
            let mut h = Sha256::new();
            let mut buf = vec![0u8; 64 * 1024];
            let mut n_total = 0u64;
            let mut progress = Instant::now();
            let end = loop {
                if sent_all.load(Ordering::Acquire) && n_total >= sent.load(Ordering::Acquire) {
                    break End::Complete;
                }
                match r.read(&mut buf) {
                    Ok(0) => break End::Cut,
                    Ok(n) => {
                        h.update(&buf[..n]);
                        n_total += n as u64;
                        got.store(n_total, Ordering::Release);
                        progress = Instant::now();
                    }
                    Err(e) if e.kind() == ErrorKind::Interrupted => {}
                    Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                        if progress.elapsed() >= HUNG {
                            break End::Hung;
                        }
                    }
                    Err(_) => break End::Cut,
                }
            };
            let at = Instant::now();
            let intact = h.finish_hex() == pattern_sha(seed, n_total);
            FlowEnd {
                end,
                at,
                received: n_total,
                intact,
            }
        });
        Self {
            received,
            finish,
            reader,
        }
    }

    /// Send no more chunks.
    fn finish(&self) {
        self.finish.store(true, Ordering::Release);
    }

    fn received(&self) -> u64 {
        self.received.load(Ordering::Acquire)
    }

    /// The reader has not ended (the flow is still sending or receiving).
    fn open(&self) -> bool {
        !self.reader.is_finished()
    }

    fn join(self) -> FlowEnd {
        self.reader.join().unwrap()
    }
}

/// SHA-256 of the first `len` bytes of `Pattern::new(seed)`.
fn pattern_sha(seed: u64, len: u64) -> String {
    let mut p = Pattern::new(seed);
    let mut h = Sha256::new();
    let mut buf = vec![0u8; CHUNK];
    let mut left = len;
    while left > 0 {
        let n = left.min(CHUNK as u64) as usize;
        p.fill(&mut buf[..n]);
        h.update(&buf[..n]);
        left -= n as u64;
    }
    h.finish_hex()
}

/// One byte-exact echo of 256 KiB through a new connection to `dest`.
fn fresh_echo(server: &Server, dest: SocketAddr, seed: u64) -> Result<(), String> {
    let s = server.connect(dest)?;
    let f = Flow::start(s, seed, 16).join();
    if f.end == End::Complete && f.intact {
        Ok(())
    } else {
        Err(format!(
            "a new connection did not echo byte-exact: {:?} after {} bytes",
            f.end, f.received
        ))
    }
}

/// Retries [`fresh_echo`] until it works or `limit` passes; the time it took.
fn echo_within(server: &Server, dest: SocketAddr, limit: Duration) -> Result<Duration, String> {
    let start = Instant::now();
    let mut last = String::new();
    let ok = wait_until(limit, || match fresh_echo(server, dest, 99) {
        Ok(()) => true,
        Err(e) => {
            last = e;
            false
        }
    });
    if ok {
        Ok(start.elapsed())
    } else {
        Err(format!("no working dial within {limit:?}: {last}"))
    }
}

// ---------------------------------------------------------------------------
// Results

/// What a row measured.
#[derive(Default)]
struct Measured {
    detection: Option<Duration>,
    recovery: Option<Duration>,
    bytes_lost: Option<u64>,
    note: String,
}

/// Fails the row with `why` unless `cond`.
fn check(cond: bool, why: impl FnOnce() -> String) -> Result<(), String> {
    if cond { Ok(()) } else { Err(why()) }
}

fn json_str(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c if (c as u32) < 0x20 => out.push(' '),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Writes the outcome of row `id` for `imp`.
fn record(id: &str, title: &str, criterion: &str, imp: Imp, r: &Result<Measured, String>) {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("../reliability");
    let _ = std::fs::create_dir_all(&dir);
    let ms = |d: Option<Duration>| d.map_or("null".to_owned(), |d| d.as_millis().to_string());
    let (pass, m, failure) = match r {
        Ok(m) => (true, Some(m), String::new()),
        Err(e) => (false, None, e.clone()),
    };
    let json = format!(
        "{{\"row\":{},\"title\":{},\"criterion\":{},\"impl\":{},\"pass\":{pass},\"detection_ms\":{},\"recovery_ms\":{},\"bytes_lost\":{},\"note\":{},\"failure\":{}}}\n",
        json_str(id),
        json_str(title),
        json_str(criterion),
        json_str(imp.name()),
        ms(m.and_then(|m| m.detection)),
        ms(m.and_then(|m| m.recovery)),
        m.and_then(|m| m.bytes_lost)
            .map_or("null".to_owned(), |b| b.to_string()),
        json_str(m.map_or("", |m| m.note.as_str())),
        json_str(&failure),
    );
    let _ = std::fs::write(dir.join(format!("{id}.{}.json", imp.name())), &json);
    eprintln!("row {id} {}: {}", imp.name(), json.trim_end());
}

/// Records that row `id` does not apply to upstream, and why.
fn record_not_applicable(id: &str, title: &str, criterion: &str, why: &str) {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("../reliability");
    let _ = std::fs::create_dir_all(&dir);
    let json = format!(
        "{{\"row\":{},\"title\":{},\"criterion\":{},\"impl\":\"upstream\",\"pass\":null,\"detection_ms\":null,\"recovery_ms\":null,\"bytes_lost\":null,\"note\":{},\"failure\":\"\"}}\n",
        json_str(id),
        json_str(title),
        json_str(criterion),
        json_str(why),
    );
    let _ = std::fs::write(dir.join(format!("{id}.upstream.json")), &json);
}

/// Runs `row` for every implementation.
fn run_row(
    id: &str,
    title: &str,
    criterion: &str,
    row: impl Fn(Imp, &TempDir, &PkiFiles) -> Result<Measured, String> + Sync,
) {
    // The implementations side by side, at the same time: a row's wall
    // time is that of its slower run.
    let results: Vec<(Imp, Result<Measured, String>)> = std::thread::scope(|scope| {
        let runs: Vec<_> = imps()
            .into_iter()
            .map(|imp| {
                let row = &row;
                scope.spawn(move || {
                    let dir = TempDir::new(&format!("fault-{id}-{}", imp.name()));
                    let pki = konn_testkit::pki::write(&dir.0).unwrap();
                    let r = row(imp, &dir, &pki).map_err(|e| format!("{e}{}", log_tails(&dir)));
                    (imp, r)
                })
            })
            .collect();
        runs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut konn = Ok(());
    for (imp, r) in results {
        record(id, title, criterion, imp, &r);
        if imp == Imp::Konn {
            konn = r.map(drop);
        }
    }
    if let Err(e) = konn {
        panic!("row {id} ({title}), konn: {e}");
    }
}

/// The last lines of every process log in `dir`, for a failed row's
/// message (the directory is removed when the row ends).
fn log_tails(dir: &TempDir) -> String {
    let Ok(entries) = std::fs::read_dir(&dir.0) else {
        return String::new();
    };
    let mut logs: Vec<_> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "log"))
        .collect();
    logs.sort();
    let mut out = String::new();
    for p in logs {
        out += &format!("\n--- {}\n{}", p.display(), file_tail(&p, 20));
    }
    out
}

/// The server's descriptors come back to at most `baseline`.
fn server_fds_back(server: &Server, baseline: usize) -> Result<(), String> {
    let pid = server.proc.pid();
    check(wait_until(T, || fds_of(pid) <= baseline), || {
        format!("server fds {} > baseline {baseline}", fds_of(pid))
    })
}

/// Waits for `cond`; the time it took, or an error naming `what`.
fn measure(limit: Duration, what: &str, cond: impl FnMut() -> bool) -> Result<Duration, String> {
    let start = Instant::now();
    if wait_until(limit, cond) {
        Ok(start.elapsed())
    } else {
        Err(format!("{what} not within {limit:?}"))
    }
}

/// At most this many chunks in the flows a fault must cut mid-transfer
/// (rows 01 and 06c): paced for 30 s, so the fault lands while every flow
/// is in full swing even when the agents' dial counts took several scrapes
/// on a loaded machine; [`end_after_cut`] ends them early.
const FAULT_FLOW_CHUNKS: usize = 6000;

/// Once `cut` of `flows` have ended (those the fault cut; or after [`T`]),
/// finishes the others and collects every end.
fn end_after_cut(flows: Vec<Flow>, cut: f64) -> Vec<FlowEnd> {
    wait_until(T, || {
        flows.iter().filter(|f| !f.open()).count() as f64 >= cut
    });
    for f in &flows {
        f.finish();
    }
    flows.into_iter().map(Flow::join).collect()
}

/// Every flow still open when the fault comes; otherwise the row would
/// measure a fault that cut nothing.
fn open_at_fault(flows: &[Flow]) -> Result<(), String> {
    check(flows.iter().all(Flow::open), || {
        "a transfer ended before the fault (the agents' counts took too long); rerun".into()
    })
}

/// Starts `n` flows through `server` to `dest` and waits until each has
/// echoed something.
fn start_flows(
    server: &Server,
    dest: SocketAddr,
    n: usize,
    chunks: usize,
) -> Result<Vec<Flow>, String> {
    let flows: Vec<Flow> = (0..n)
        .map(|i| {
            server
                .connect(dest)
                .map(|s| Flow::start(s, i as u64 + 1, chunks))
        })
        .collect::<Result<_, _>>()?;
    check(
        wait_until(T, || flows.iter().all(|f| f.received() >= CHUNK as u64)),
        || "flows did not start".to_owned(),
    )?;
    Ok(flows)
}

// ---------------------------------------------------------------------------
// Rows

#[test]
fn row01_kill_agent_mid_transfer() {
    run_row(
        "01",
        "Kill agent mid-transfer",
        "SIGKILL one of two agents during 8 echo transfers: every transfer through it is cut within 1 s having delivered only a correct prefix; every transfer through the other completes byte-exact; server tables and descriptors back to baseline; the killed agent's tunnel leaves the server",
        |imp, dir, pki| {
            let echo = Echo::start();
            let server = Server::start(imp, dir, pki, 0, &[]);
            let mut a = Agent::start(imp, dir, pki, "agent-a", server.agent_port);
            let b = Agent::start(imp, dir, pki, "agent-b", server.agent_port);
            check(wait_until(T, || server.ready() == 2.0), || {
                "agents not ready".into()
            })?;
            let baseline = fds_of(server.proc.pid());
            let flows = start_flows(&server, echo.addr, 8, FAULT_FLOW_CHUNKS)?;
            let (on_a, _) = dials_on(&a, &b, 8.0)?;
            open_at_fault(&flows)?;
            let killed = Instant::now();
            a.proc.kill();
            let ends = end_after_cut(flows, on_a);
            let cut: Vec<&FlowEnd> = ends.iter().filter(|e| e.end != End::Complete).collect();
            check(cut.len() as f64 == on_a, || {
                format!("{} transfers cut, agent A had {on_a}", cut.len())
            })?;
            check(cut.iter().all(|e| e.end == End::Cut), || {
                "a transfer hung".into()
            })?;
            check(ends.iter().all(|e| e.intact), || "bytes changed".into())?;
            let detection = cut.iter().map(|e| e.at - killed).max().unwrap_or_default();
            check(detection <= FIN_BOUND, || {
                format!("cut after {detection:?}")
            })?;
            check(wait_until(T, || server.ready() == 1.0), || {
                "killed tunnel stays".into()
            })?;
            check(wait_until(T, || server.tables_empty()), || {
                "tables not empty".into()
            })?;
            check(wait_until(T, || echo.open() == 0), || {
                "destination sockets stay open".into()
            })?;
            server_fds_back(&server, baseline)?;
            Ok(Measured {
                detection: Some(detection),
                bytes_lost: Some(0),
                note: format!("{on_a} of 8 transfers on the killed agent"),
                ..Measured::default()
            })
        },
    );
}

#[test]
fn row03_kill_server() {
    run_row(
        "03",
        "Kill server",
        "SIGKILL the server during 4 echo transfers: the agent closes every destination socket within 1 s, reconnects to the restarted server within the backoff cap (1 s) + jitter, and a new dial echoes byte-exact; agent descriptors back to baseline",
        |imp, dir, pki| {
            let echo = Echo::start();
            let mut server = Server::start(imp, dir, pki, 0, &[]);
            let agent = Agent::start(imp, dir, pki, "agent", server.agent_port);
            check(wait_until(T, || server.ready() == 1.0), || {
                "agent not ready".into()
            })?;
            let baseline = fds_of(agent.proc.pid());
            let flows = start_flows(&server, echo.addr, 4, 400)?;
            server.proc.kill();
            let detection = measure(T, "destination sockets closed", || echo.open() == 0)?;
            let ends: Vec<FlowEnd> = flows.into_iter().map(Flow::join).collect();
            check(ends.iter().all(|e| e.end == End::Cut && e.intact), || {
                "a frontend was not cut, or got wrong bytes".into()
            })?;
            check(detection <= FIN_BOUND, || {
                format!("destinations closed after {detection:?}")
            })?;
            let restarted = Instant::now();
            let server = Server::start(imp, dir, pki, server.agent_port, &[]);
            // The backoff cap plus its jitter, counted once the new server
            // is healthy.
            let up = measure(CAP * 3, "agent reconnected", || server.ready() == 1.0)?;
            let recovery = restarted.elapsed();
            echo_within(&server, echo.addr, T)?;
            check(
                wait_until(T, || fds_of(agent.proc.pid()) <= baseline),
                || {
                    format!(
                        "agent fds {} > baseline {baseline}",
                        fds_of(agent.proc.pid())
                    )
                },
            )?;
            Ok(Measured {
                detection: Some(detection),
                recovery: Some(recovery),
                bytes_lost: Some(0),
                note: format!(
                    "reconnect {}ms after the new server was healthy",
                    up.as_millis()
                ),
            })
        },
    );
}

/// Agent `id` through a chaos proxy in front of `server`'s agent port.
fn agent_via_chaos(
    imp: Imp,
    dir: &TempDir,
    pki: &PkiFiles,
    server: &Server,
    id: &str,
) -> (ChaosProxy, Agent) {
    let proxy = ChaosProxy::start(at(server.agent_port)).unwrap();
    let agent = Agent::start(imp, dir, pki, id, proxy.addr().port());
    (proxy, agent)
}

#[test]
fn row06_partition() {
    run_row(
        "06",
        "Partition (agent ↔ server)",
        "Nothing forwarded either way between agent and server (no FIN, no RST, nothing lost for good), server --keepalive-time=1s: the server drops the tunnel within 1 s + 20 s keepalive timeout + 2 s; the frontend on it is closed; after healing the agent reconnects within the cap (1 s) + jitter + FIN notice, exactly one tunnel is ready (no half-open tunnel carries traffic) and a new dial echoes byte-exact",
        |imp, dir, pki| {
            let echo = Echo::start();
            let server = Server::start(imp, dir, pki, 0, &["--keepalive-time=1s"]);
            let (proxy, _agent) = agent_via_chaos(imp, dir, pki, &server, "agent");
            check(wait_until(T, || server.ready() == 1.0), || {
                "agent not ready".into()
            })?;
            let flow = start_flows(&server, echo.addr, 1, 100_000)?;
            // A partition loses no packet for good (TCP retransmits after
            // healing): nothing is forwarded either way, FIN included,
            // until the proxy heals.
            proxy.set_both(Faults {
                stall: true,
                ..Faults::default()
            });
            let bound = Duration::from_secs(23);
            let detection = measure(bound, "server dropped the tunnel", || server.ready() == 0.0)?;
            let cut = flow.into_iter().next().map(Flow::join);
            check(
                cut.as_ref().is_some_and(|e| e.end == End::Cut && e.intact),
                || "the frontend on the dead tunnel was not closed".into(),
            )?;
            proxy.heal();
            let recovery = measure(
                CAP * 3 + Duration::from_secs(5),
                "reconnect after healing",
                || server.ready() == 1.0,
            )?;
            echo_within(&server, echo.addr, T)?;
            check(server.ready() == 1.0, || {
                format!("{} tunnels ready", server.ready())
            })?;
            check(wait_until(T, || server.tables_empty()), || {
                "tables not empty".into()
            })?;
            Ok(Measured {
                detection: Some(detection),
                recovery: Some(recovery),
                bytes_lost: Some(0),
                note: "keepalive 1 s + 20 s timeout (grpc-go's default)".into(),
            })
        },
    );
}

#[test]
fn row06b_reset_between_agent_and_server() {
    run_row(
        "06b",
        "RST between agent and server",
        "RST both sides of the agent's tunnel during 4 transfers: every transfer on it is cut within 1 s with a correct prefix; the agent reconnects within the cap (1 s) + jitter; a new dial echoes byte-exact; tables and server descriptors back to baseline; destination sockets closed",
        |imp, dir, pki| {
            let echo = Echo::start();
            let server = Server::start(imp, dir, pki, 0, &[]);
            let (proxy, _agent) = agent_via_chaos(imp, dir, pki, &server, "agent");
            check(wait_until(T, || server.ready() == 1.0), || {
                "agent not ready".into()
            })?;
            let baseline = fds_of(server.proc.pid());
            let flows = start_flows(&server, echo.addr, 4, 400)?;
            let reset = Instant::now();
            proxy.reset();
            let ends: Vec<FlowEnd> = flows.into_iter().map(Flow::join).collect();
            check(ends.iter().all(|e| e.end == End::Cut && e.intact), || {
                "a transfer was not cut, or got wrong bytes".into()
            })?;
            let detection = ends.iter().map(|e| e.at - reset).max().unwrap_or_default();
            check(detection <= FIN_BOUND, || {
                format!("cut after {detection:?}")
            })?;
            let recovery = measure(CAP * 3, "reconnect", || server.ready() == 1.0)?;
            echo_within(&server, echo.addr, T)?;
            check(wait_until(T, || server.tables_empty()), || {
                "tables not empty".into()
            })?;
            check(wait_until(T, || echo.open() == 0), || {
                "destination sockets stay open".into()
            })?;
            server_fds_back(&server, baseline)?;
            Ok(Measured {
                detection: Some(detection),
                recovery: Some(recovery),
                bytes_lost: Some(0),
                note: String::new(),
            })
        },
    );
}

#[test]
fn row06d_reset_between_agent_and_server_resumed() {
    run_row(
        "06d",
        "RST and a 2 s outage between agent and server, resumable tunnels on",
        "konn with --resume-window=10s on both (upstream has no resume): RST both sides of the agent's tunnel during 4 transfers, the path then blackholed for 2 s (reconnects fail too): every transfer completes byte-exact, the tunnel is resumed (konn_resumes_total{result=\"resumed\"} 1 on both), exactly one tunnel is ready, tables, server descriptors and destination sockets back to baseline",
        |imp, dir, pki| {
            let echo = Echo::start();
            let server = Server::start(imp, dir, pki, 0, resume_on(imp));
            let proxy = ChaosProxy::start(at(server.agent_port)).unwrap();
            let agent =
                Agent::start_with(imp, dir, pki, "agent", proxy.addr().port(), resume_on(imp));
            check(wait_until(T, || server.ready() == 1.0), || {
                "agent not ready".into()
            })?;
            let baseline = fds_of(server.proc.pid());
            let flows = start_flows(&server, echo.addr, 4, 400)?;
            let cut = Instant::now();
            proxy.set_both(Faults {
                blackhole: true,
                ..Faults::default()
            });
            proxy.reset();
            // The outage itself (not synchronisation).
            std::thread::sleep(Duration::from_secs(2));
            proxy.heal();
            let ends: Vec<FlowEnd> = flows.into_iter().map(Flow::join).collect();
            let done = cut.elapsed();
            let complete = ends.iter().filter(|e| e.end == End::Complete).count();
            check(ends.iter().all(|e| e.intact), || {
                "wrong bytes were delivered".into()
            })?;
            check(complete == 4, || {
                format!("{complete} of 4 transfers completed")
            })?;
            let resumed = r#"konn_resumes_total{result="resumed"}"#;
            check(server.metric(resumed) == 1.0, || {
                format!("server resumed {}", server.metric(resumed))
            })?;
            check(agent.metric(resumed) == Some(1.0), || {
                format!("agent resumed {:?}", agent.metric(resumed))
            })?;
            check(server.ready() == 1.0, || {
                format!("{} tunnels ready", server.ready())
            })?;
            check(wait_until(T, || server.tables_empty()), || {
                "tables not empty".into()
            })?;
            check(wait_until(T, || echo.open() == 0), || {
                "destination sockets stay open".into()
            })?;
            server_fds_back(&server, baseline)?;
            Ok(Measured {
                recovery: Some(done),
                bytes_lost: Some(0),
                note: "recovery: from the RST until every transfer completed".into(),
                ..Measured::default()
            })
        },
    );
}

#[test]
fn row06c_corruption_between_agent_and_server() {
    run_row(
        "06c",
        "Byte corruption between agent and server",
        "Flip one byte of agent A's TLS stream during transfers over agents A and B: A's tunnel is reset (TLS record MAC) and every transfer on it is cut having delivered only correct bytes; transfers on B complete byte-exact; A reconnects; tables back to empty",
        |imp, dir, pki| {
            let echo = Echo::start();
            let server = Server::start(imp, dir, pki, 0, &[]);
            let (proxy, a) = agent_via_chaos(imp, dir, pki, &server, "agent-a");
            let b = Agent::start(imp, dir, pki, "agent-b", server.agent_port);
            check(wait_until(T, || server.ready() == 2.0), || {
                "agents not ready".into()
            })?;
            let flows = start_flows(&server, echo.addr, 8, FAULT_FLOW_CHUNKS)?;
            let (on_a, _) = dials_on(&a, &b, 8.0)?;
            check(on_a >= 1.0, || "no transfer on agent A; rerun".into())?;
            open_at_fault(&flows)?;
            let corrupt = Instant::now();
            // Relative to the tunnel's own stream: the agent's duplicate
            // connection attempts (--sync-forever) pass the proxy too.
            proxy.corrupt(Dir::Up, 64 * 1024);
            let ends = end_after_cut(flows, on_a);
            check(ends.iter().all(|e| e.intact), || {
                "corrupted bytes were delivered".into()
            })?;
            let cut = ends.iter().filter(|e| e.end != End::Complete).count();
            check(cut as f64 == on_a, || {
                format!("{cut} transfers cut, agent A had {on_a}")
            })?;
            check(ends.iter().all(|e| e.end != End::Hung), || {
                "a transfer hung".into()
            })?;
            let detection = ends
                .iter()
                .filter(|e| e.end == End::Cut)
                .map(|e| e.at - corrupt)
                .max()
                .unwrap_or_default();
            check(wait_until(CAP * 3 + T, || server.ready() == 2.0), || {
                "A did not reconnect".into()
            })?;
            check(wait_until(T, || server.tables_empty()), || {
                "tables not empty".into()
            })?;
            Ok(Measured {
                detection: Some(detection),
                bytes_lost: Some(0),
                note: format!("{on_a} of 8 transfers on the corrupted tunnel"),
                ..Measured::default()
            })
        },
    );
}

#[test]
fn row10_destination_reset_and_close() {
    run_row(
        "10",
        "Destination faults (RST, close after writing)",
        "A destination connection reset by a chaos proxy: its frontend is cut within 1 s, a transfer to another destination through the same agent completes byte-exact, the agent's endpoint count and the server's tables return to baseline. A destination that writes then closes: the frontend reads every byte, then EOF",
        |imp, dir, pki| {
            let echo = Echo::start();
            let greeter = Echo::start_with(Some(b"all of this arrives before the close"));
            let dest_proxy = ChaosProxy::start(echo.addr).unwrap();
            let server = Server::start(imp, dir, pki, 0, &[]);
            let agent = Agent::start(imp, dir, pki, "agent", server.agent_port);
            check(wait_until(T, || server.ready() == 1.0), || {
                "agent not ready".into()
            })?;
            let victim = start_flows(&server, dest_proxy.addr(), 1, 400)?;
            let other = start_flows(&server, echo.addr, 1, 100)?;
            let reset = Instant::now();
            dest_proxy.reset();
            let v = victim.into_iter().next().map(Flow::join);
            let detection = v.as_ref().map(|e| e.at - reset).unwrap_or_default();
            check(
                v.as_ref().is_some_and(|e| e.end == End::Cut && e.intact),
                || "the frontend of the reset destination was not cut cleanly".into(),
            )?;
            check(detection <= FIN_BOUND, || {
                format!("cut after {detection:?}")
            })?;
            let o = other.into_iter().next().map(Flow::join);
            check(
                o.is_some_and(|e| e.end == End::Complete && e.intact),
                || "the other transfer was disturbed".into(),
            )?;
            // Close after writing: every byte, then EOF.
            let mut s = server
                .connect(greeter.addr)
                .map_err(|e| format!("CONNECT to a destination that writes and closes: {e:?}"))?;
            let mut got = Vec::new();
            let read = s.read_to_end(&mut got);
            check(
                read.is_ok() && got == b"all of this arrives before the close",
                || format!("got {:?} then {read:?}", String::from_utf8_lossy(&got)),
            )?;
            check(wait_until(T, || agent.open_endpoints() == 0.0), || {
                "agent endpoints stay".into()
            })?;
            check(wait_until(T, || server.tables_empty()), || {
                "tables not empty".into()
            })?;
            Ok(Measured {
                detection: Some(detection),
                bytes_lost: Some(0),
                ..Measured::default()
            })
        },
    );
}

/// Process `pid`'s soft RLIMIT_NOFILE.
fn soft_nofile(pid: u32) -> Option<usize> {
    std::fs::read_to_string(format!("/proc/{pid}/limits"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("Max open files"))
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
}

/// Sets process `pid`'s soft RLIMIT_NOFILE with prlimit(1).
fn set_nofile(pid: u32, n: usize) -> Result<(), String> {
    let ok = std::process::Command::new("prlimit")
        .args([format!("--pid={pid}"), format!("--nofile={n}:")])
        .status()
        .map_err(|e| format!("prlimit: {e}"))?
        .success();
    check(ok, || "prlimit failed".into())
}

#[test]
fn row20_emfile_at_accept() {
    run_row(
        "20",
        "Accept-loop exhaustion (EMFILE)",
        "Lower the running server's RLIMIT_NOFILE to its open descriptors + 8, hold 64 frontend connections (most fail in the server with EMFILE), release them: the server never exits, stays healthy, and a new dial echoes byte-exact within 5 s; server descriptors back to baseline",
        |imp, dir, pki| {
            let echo = Echo::start();
            let mut server = Server::start(imp, dir, pki, 0, &[]);
            let _agent = Agent::start(imp, dir, pki, "agent", server.agent_port);
            check(wait_until(T, || server.ready() == 1.0), || {
                "agent not ready".into()
            })?;
            echo_within(&server, echo.addr, T)?;
            let pid = server.proc.pid();
            check(wait_until(T, || server.tables_empty()), || {
                "tables not empty".into()
            })?;
            let baseline = fds_of(pid);
            let original = soft_nofile(pid).ok_or("no RLIMIT_NOFILE in /proc")?;
            set_nofile(pid, baseline + 8)?;
            let flood: Vec<UnixStream> = (0..64)
                .filter_map(|_| UnixStream::connect(&server.uds).ok())
                .collect();
            // The server hits its limit: some of these are never served.
            check(wait_until(T, || fds_of(pid) >= baseline + 8), || {
                format!("fds {} never reached the limit", fds_of(pid))
            })?;
            drop(flood);
            set_nofile(pid, original)?;
            let recovery = measure(Duration::from_secs(5), "a working dial", || {
                fresh_echo(&server, echo.addr, 5).is_ok()
            })?;
            check(server.proc.is_running(), || "the server exited".into())?;
            check(wait_until(T, || fds_of(pid) <= baseline + 1), || {
                format!("server fds {} > baseline {baseline}", fds_of(pid))
            })?;
            Ok(Measured {
                recovery: Some(recovery),
                bytes_lost: Some(0),
                note: format!("{} descriptors at the limit", baseline + 8),
                ..Measured::default()
            })
        },
    );
}

#[test]
fn row02_freeze_agent() {
    run_row(
        "02",
        "Freeze agent (SIGSTOP)",
        "SIGSTOP the agent during a transfer, server --keepalive-time=1s: server peak RSS stays under 256 MiB (window-limited); the server drops the tunnel within 1 s + 20 s keepalive timeout + 2 s and closes the frontend having delivered only correct bytes; after SIGCONT the agent reconnects within the cap (1 s) + jitter + 2 s and a new dial echoes byte-exact; tables back to empty",
        |imp, dir, pki| {
            let echo = Echo::start();
            let server = Server::start(imp, dir, pki, 0, &["--keepalive-time=1s"]);
            let agent = Agent::start(imp, dir, pki, "agent", server.agent_port);
            check(wait_until(T, || server.ready() == 1.0), || {
                "agent not ready".into()
            })?;
            let flows = start_flows(&server, echo.addr, 1, 100_000)?;
            agent.proc.signal(libc::SIGSTOP);
            let detection = measure(Duration::from_secs(23), "server dropped the tunnel", || {
                server.ready() == 0.0
            });
            let peak = rss_peak(server.proc.pid());
            let ends: Vec<FlowEnd> = flows.into_iter().map(Flow::join).collect();
            agent.proc.signal(libc::SIGCONT);
            let detection = detection?;
            check(ends.iter().all(|e| e.end == End::Cut && e.intact), || {
                "the frontend was not closed cleanly".into()
            })?;
            check(peak < 256 << 20, || format!("server peak RSS {peak} bytes"))?;
            let recovery = measure(
                CAP * 3 + Duration::from_secs(2),
                "reconnect after SIGCONT",
                || server.ready() == 1.0,
            )?;
            echo_within(&server, echo.addr, T)?;
            check(wait_until(T, || server.tables_empty()), || {
                "tables not empty".into()
            })?;
            Ok(Measured {
                detection: Some(detection),
                recovery: Some(recovery),
                bytes_lost: Some(0),
                note: format!("server peak RSS {} MiB", peak >> 20),
            })
        },
    );
}

/// `VmHWM` of process `pid`, in bytes.
fn rss_peak(pid: u32) -> u64 {
    fault_common::rss_of(pid).1
}

#[test]
fn row04_graceful_server_shutdown() {
    run_row(
        "04",
        "Graceful server shutdown (SIGTERM)",
        "SIGTERM the server with --graceful-shutdown-timeout=5s during 4 transfers of about 2 s: new frontends are refused within 1 s while the server still runs; every transfer completes byte-exact; the server exits by the deadline (5 s + 1 s). With 0s: it exits within 1 s",
        |imp, dir, pki| {
            let echo = Echo::start();
            let mut server = Server::start(imp, dir, pki, 0, &["--graceful-shutdown-timeout=5s"]);
            let _agent = Agent::start(imp, dir, pki, "agent", server.agent_port);
            check(wait_until(T, || server.ready() == 1.0), || {
                "agent not ready".into()
            })?;
            let flows = start_flows(&server, echo.addr, 4, 400)?;
            let term = Instant::now();
            server.proc.terminate();
            let refused = measure(FIN_BOUND, "new frontends refused", || {
                refuses(&server.uds, echo.addr)
            });
            let running_when_refused = server.proc.is_running();
            let ends: Vec<FlowEnd> = flows.into_iter().map(Flow::join).collect();
            let exited = server.proc.wait_timeout(Duration::from_secs(6)).is_some();
            let took = term.elapsed();
            let refused = refused?;
            let done = ends
                .iter()
                .filter(|e| e.end == End::Complete && e.intact)
                .count();
            let lost: u64 = ends
                .iter()
                .filter(|e| e.end != End::Complete)
                .map(|e| (400 * CHUNK) as u64 - e.received)
                .sum();
            check(running_when_refused, || "refused only by exiting".into())?;
            check(done == 4, || {
                format!("{done} of 4 transfers complete, {lost} bytes lost")
            })?;
            check(exited, || "not exited by the deadline".into())?;
            // And with no grace period: at once.
            let mut server0 = Server::start(imp, dir, pki, 0, &[]);
            let term0 = Instant::now();
            server0.proc.terminate();
            let exited0 = server0.proc.wait_timeout(FIN_BOUND).is_some();
            check(exited0, || "with 0s: not exited within 1 s".into())?;
            Ok(Measured {
                detection: Some(refused),
                recovery: None,
                bytes_lost: Some(lost),
                note: format!(
                    "exit {} ms after SIGTERM (5 s grace), {} ms with 0s",
                    took.as_millis(),
                    term0.elapsed().as_millis()
                ),
            })
        },
    );
}

#[test]
fn row05_agent_drain() {
    run_row(
        "05",
        "Agent drain (first SIGTERM)",
        "First SIGTERM to agent A of two, with a transfer through A open: within 1 s every new dial goes to B (10 of 10); the transfer through A completes byte-exact; a second SIGTERM stops A",
        |imp, dir, pki| {
            let echo = Echo::start();
            let server = Server::start(imp, dir, pki, 0, &[]);
            let mut a = Agent::start(imp, dir, pki, "agent-a", server.agent_port);
            check(wait_until(T, || server.ready() == 1.0), || {
                "A not ready".into()
            })?;
            // Only A is there: this transfer goes through A.
            let kept = start_flows(&server, echo.addr, 1, 200)?;
            let b = Agent::start(imp, dir, pki, "agent-b", server.agent_port);
            check(wait_until(T, || server.ready() == 2.0), || {
                "B not ready".into()
            })?;
            a.proc.terminate();
            let drained = Instant::now();
            // Batches of 10 dials (kept open) until a whole batch lands on B.
            let mut conns = Vec::new();
            let mut detection = None;
            let all_on_b = wait_until(Duration::from_secs(3), || {
                let batch_start = drained.elapsed();
                let before = b.open_endpoints();
                let batch: Vec<UnixStream> = (0..10)
                    .filter_map(|_| server.connect(echo.addr).ok())
                    .collect();
                let ok = batch.len() == 10
                    && wait_until(Duration::from_millis(300), || {
                        b.open_endpoints() == before + 10.0
                    });
                conns.extend(batch);
                if ok {
                    detection = Some(batch_start);
                }
                ok
            });
            let end = kept.into_iter().next().map(Flow::join);
            check(all_on_b, || {
                "new dials still reach the draining agent".into()
            })?;
            let detection = detection.unwrap_or_default();
            check(detection <= FIN_BOUND, || {
                format!("new dials reached A for {detection:?}")
            })?;
            check(
                end.is_some_and(|e| e.end == End::Complete && e.intact),
                || "the transfer through the draining agent did not complete byte-exact".into(),
            )?;
            drop(conns);
            if imp == Imp::Upstream || a.proc.is_running() {
                a.proc.terminate();
            }
            check(a.proc.wait_timeout(T).is_some(), || {
                "the second SIGTERM did not stop A".into()
            })?;
            Ok(Measured {
                detection: Some(detection),
                bytes_lost: Some(0),
                note: "detection: until a whole batch of 10 dials lands on the other agent".into(),
                ..Measured::default()
            })
        },
    );
}

#[test]
fn row12_unresponsive_dialer() {
    run_row(
        "12",
        "Unresponsive dialer (agent frozen during a dial)",
        "SIGSTOP the only agent, then dial with --backend-dial-timeout=2s: the frontend gets an error within 2 s + 1 s and the pending-dial table returns to 0; after SIGCONT a new dial echoes byte-exact",
        |imp, dir, pki| {
            let echo = Echo::start();
            let server = Server::start(imp, dir, pki, 0, &["--backend-dial-timeout=2s"]);
            let agent = Agent::start(imp, dir, pki, "agent", server.agent_port);
            check(wait_until(T, || server.ready() == 1.0), || {
                "agent not ready".into()
            })?;
            agent.proc.signal(libc::SIGSTOP);
            let start = Instant::now();
            let answer = server.connect(echo.addr);
            let detection = start.elapsed();
            let pending = wait_until(T, || server.metric(PENDING) == 0.0);
            agent.proc.signal(libc::SIGCONT);
            check(answer.is_err(), || {
                "the dial succeeded with a frozen agent".into()
            })?;
            check(detection <= Duration::from_secs(3), || {
                format!("dial failed after {detection:?}")
            })?;
            check(pending, || "pending dials stay".into())?;
            echo_within(&server, echo.addr, T)?;
            check(wait_until(T, || server.tables_empty()), || {
                "tables not empty".into()
            })?;
            Ok(Measured {
                detection: Some(detection),
                bytes_lost: Some(0),
                note: answer
                    .err()
                    .map(|a| a.lines().next().unwrap_or("").to_owned())
                    .unwrap_or_default(),
                ..Measured::default()
            })
        },
    );
}

#[test]
fn row11_blackholed_dial() {
    run_row(
        "11",
        "Blackholed dial (destination drops SYN)",
        "Dial a destination whose SYNs are dropped while another dial runs: the blackholed dial fails at the agent's 5 s dial timeout (bound 5 s + 2 s) with an error answer; a concurrent dial to an echo destination completes byte-exact meanwhile; pending dials and agent endpoints back to 0",
        |imp, dir, pki| {
            let echo = Echo::start();
            let hole = konn_testkit::dest::Unresponsive::start().map_err(|e| e.to_string())?;
            let server = Server::start(imp, dir, pki, 0, &[]);
            let agent = Agent::start(imp, dir, pki, "agent", server.agent_port);
            check(wait_until(T, || server.ready() == 1.0), || {
                "agent not ready".into()
            })?;
            let uds = server.uds.clone();
            let target = hole.addr();
            let start = Instant::now();
            let blackholed = std::thread::spawn(move || {
                let r = connect_through(&uds, target);
                (r.map(drop), Instant::now())
            });
            check(wait_until(T, || server.metric(PENDING) == 1.0), || {
                "the dial is not pending".into()
            })?;
            let concurrent = fresh_echo(&server, echo.addr, 3);
            let concurrent_done = start.elapsed();
            let (answer, at) = blackholed.join().unwrap();
            let detection = at - start;
            concurrent?;
            check(concurrent_done < Duration::from_secs(4), || {
                format!("the concurrent dial took {concurrent_done:?}")
            })?;
            check(answer.is_err(), || "the blackholed dial succeeded".into())?;
            check(detection <= Duration::from_secs(7), || {
                format!("failed after {detection:?}")
            })?;
            check(wait_until(T, || server.tables_empty()), || {
                "tables not empty".into()
            })?;
            check(wait_until(T, || agent.open_endpoints() == 0.0), || {
                "agent endpoints stay".into()
            })?;
            Ok(Measured {
                detection: Some(detection),
                bytes_lost: Some(0),
                note: answer
                    .err()
                    .map(|a| format!("answer: {}", a.lines().next().unwrap_or("")))
                    .unwrap_or_default(),
                ..Measured::default()
            })
        },
    );
}

#[test]
fn row22_close_notify_mid_handshake() {
    run_row(
        "22",
        "TLS: close_notify mid-handshake, truncated ClientHello",
        "On the agent port, 20 connections each send the first record of a fragmented ClientHello then a close_notify alert, and 20 send a ClientHello record header one byte per write then close their side: the server closes every one within 2 s of the last byte, stays healthy, keeps serving its agent (a new dial echoes byte-exact) and its descriptors return to baseline",
        |imp, dir, pki| {
            let echo = Echo::start();
            let server = Server::start(imp, dir, pki, 0, &[]);
            let _agent = Agent::start(imp, dir, pki, "agent", server.agent_port);
            check(wait_until(T, || server.ready() == 1.0), || {
                "agent not ready".into()
            })?;
            let baseline = fds_of(server.proc.pid());
            // One handshake record of 35 bytes: the start of a ClientHello
            // that announces 508 bytes (the rest would follow in more records).
            let mut first = vec![
                0x16, 0x03, 0x01, 0x00, 0x23, 0x01, 0x00, 0x01, 0xfc, 0x03, 0x03,
            ];
            first.extend_from_slice(&[0x42; 29]);
            let close_notify = [0x15, 0x03, 0x03, 0x00, 0x02, 0x01, 0x00];
            let mut conns = Vec::new();
            for i in 0..40 {
                let mut s = TcpStream::connect(at(server.agent_port)).map_err(|e| e.to_string())?;
                s.set_nodelay(true).map_err(|e| e.to_string())?;
                if i % 2 == 0 {
                    let _ = s.write_all(&first);
                    let _ = s.write_all(&close_notify);
                } else {
                    for b in &first[..5] {
                        let _ = s.write_all(std::slice::from_ref(b));
                    }
                    let _ = s.shutdown(std::net::Shutdown::Write);
                }
                conns.push((i, s));
            }
            let sent = Instant::now();
            let deadline = sent + Duration::from_secs(2);
            let mut open = Vec::new();
            let mut worst = Duration::ZERO;
            for (i, mut s) in conns {
                let left = deadline.saturating_duration_since(Instant::now());
                s.set_read_timeout(Some(left.max(Duration::from_millis(1))))
                    .map_err(|e| e.to_string())?;
                let mut sink = Vec::new();
                match s.read_to_end(&mut sink) {
                    Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                        open.push(if i % 2 == 0 {
                            "close_notify"
                        } else {
                            "header+FIN"
                        });
                    }
                    _ => worst = worst.max(sent.elapsed()),
                }
            }
            check(open.is_empty(), || {
                format!(
                    "{} of 40 connections still open after 2 s: {open:?}",
                    open.len()
                )
            })?;
            check(wait_http_ok(server.admin, "/metrics", T), || {
                "the server stopped answering".into()
            })?;
            echo_within(&server, echo.addr, T)?;
            server_fds_back(&server, baseline)?;
            Ok(Measured {
                detection: Some(worst),
                bytes_lost: Some(0),
                note: "detection: the slowest close of the 40".into(),
                ..Measured::default()
            })
        },
    );
}

/// A seccomp filter that makes `io_uring_setup` fail with EPERM and
/// allows every other system call (x86_64 and aarch64).
#[allow(unsafe_code)]
fn deny_io_uring(cmd: &mut std::process::Command) {
    use std::os::unix::process::CommandExt;
    const IO_URING_SETUP: u32 = 425; // the same number on x86_64 and aarch64
    const SECCOMP_RET_ALLOW: u32 = 0x7fff_0000;
    const SECCOMP_RET_ERRNO: u32 = 0x0005_0000;
    let stmt = |code: u16, k: u32| libc::sock_filter {
        code,
        jt: 0,
        jf: 0,
        k,
    };
    let jeq = |k: u32, jt: u8, jf: u8| libc::sock_filter {
        code: (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16,
        jt,
        jf,
        k,
    };
    let filter = [
        // Load the system call number (seccomp_data.nr, offset 0).
        stmt((libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16, 0),
        jeq(IO_URING_SETUP, 0, 1),
        stmt(
            (libc::BPF_RET | libc::BPF_K) as u16,
            SECCOMP_RET_ERRNO | libc::EPERM as u32,
        ),
        stmt((libc::BPF_RET | libc::BPF_K) as u16, SECCOMP_RET_ALLOW),
    ];
    // SAFETY: the closure runs in the forked child before exec and only
    // makes two prctl calls on memory it owns (`filter`, moved in and
    // alive for the calls); it allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            let prog = libc::sock_fprog {
                len: filter.len() as u16,
                filter: filter.as_ptr().cast_mut(),
            };
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
                || libc::prctl(
                    libc::PR_SET_SECCOMP,
                    libc::SECCOMP_MODE_FILTER,
                    &prog as *const libc::sock_fprog,
                ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

#[test]
fn row21_io_uring_denied() {
    let id = "21";
    let title = "io_uring denied (seccomp)";
    let criterion = "Under a seccomp filter that fails io_uring_setup: with --io-engine=auto the server starts on epoll, says so in its log and relays a dial byte-exact; with --io-engine=io-uring it exits 1 within 5 s with a clear message and never reports ready";
    let r = (|| -> Result<Measured, String> {
        let dir = TempDir::new("fault-21-konn");
        let pki = konn_testkit::pki::write(&dir.0).unwrap();
        let echo = Echo::start();
        type Run = (std::process::Child, SocketAddr, PathBuf, PathBuf, u16);
        let run = |engine: &str| -> Result<Run, String> {
            let (agent, health, admin) = (free_port(), free_port(), free_port());
            let uds = dir.path(&format!("{engine}.sock"));
            let log = dir.path(&format!("{engine}.log"));
            let out = std::fs::File::create(&log).map_err(|e| e.to_string())?;
            let mut cmd = std::process::Command::new(Imp::Konn.bin("proxy-server"));
            cmd.args([
                "--mode=http-connect".to_owned(),
                format!("--uds-name={}", uds.display()),
                "--server-port=0".to_owned(),
                format!("--cluster-cert={}", pki.server_cert.display()),
                format!("--cluster-key={}", pki.server_key.display()),
                format!("--cluster-ca-cert={}", pki.ca_cert.display()),
                "--agent-bind-address=127.0.0.1".to_owned(),
                format!("--agent-port={agent}"),
                "--health-bind-address=127.0.0.1".to_owned(),
                format!("--health-port={health}"),
                "--admin-bind-address=127.0.0.1".to_owned(),
                format!("--admin-port={admin}"),
                "--workers=1".to_owned(),
                format!("--io-engine={engine}"),
            ])
            .stdin(std::process::Stdio::null())
            .stdout(out.try_clone().map_err(|e| e.to_string())?)
            .stderr(out);
            deny_io_uring(&mut cmd);
            let child = cmd.spawn().map_err(|e| e.to_string())?;
            Ok((child, at(health), uds, log, agent))
        };
        // auto: epoll, and it relays.
        let (mut child, health, uds, log, agent_port) = run("auto")?;
        let started = wait_http_ok(health, "/healthz", T);
        let relays = started && {
            let _agent = Agent::start(Imp::Konn, &dir, &pki, "agent", agent_port);
            wait_until(T, || {
                connect_through(&uds, echo.addr).is_ok_and(|s| {
                    let f = Flow::start(s, 21, 16).join();
                    f.end == End::Complete && f.intact
                })
            })
        };
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let _ = child.kill();
        let _ = child.wait();
        check(started, || format!("auto did not start:\n{text}"))?;
        check(relays, || "auto: no byte-exact dial".into())?;
        check(text.contains("epoll"), || {
            format!("no word of epoll in the log:\n{text}")
        })?;
        // io-uring required: a clean exit.
        let (mut child, health, _, log, _) = run("io-uring")?;
        let start = Instant::now();
        let mut status = None;
        let mut ever_ready = false;
        wait_until(Duration::from_secs(5), || {
            ever_ready |= http_get(health, "/readyz").is_ok_and(|(c, _)| c == 200);
            status = child.try_wait().ok().flatten();
            status.is_some()
        });
        let took = start.elapsed();
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if status.is_none() {
            let _ = child.kill();
            let _ = child.wait();
        }
        check(status.is_some_and(|s| s.code() == Some(1)), || {
            format!("io-uring under the filter: {status:?}\n{text}")
        })?;
        check(!ever_ready, || "reported ready".into())?;
        check(
            text.to_lowercase().contains("io_uring") || text.contains("io-uring"),
            || format!("the message does not name io_uring:\n{text}"),
        )?;
        // klog's error lines start with E (or F).
        let line = text
            .lines()
            .find(|l| (l.starts_with('E') || l.starts_with('F')) && l.contains("io_uring"))
            .unwrap_or("")
            .to_owned();
        Ok(Measured {
            detection: Some(took),
            note: format!("exit message: {}", line.split("] ").last().unwrap_or(&line)),
            ..Measured::default()
        })
    })();
    record(id, title, criterion, Imp::Konn, &r);
    record_not_applicable(id, title, criterion, "Go's runtime does not use io_uring");
    if let Err(e) = r {
        panic!("row {id} ({title}), konn: {e}");
    }
}

/// A destination for one connection: reads until EOF, answers with the
/// SHA-256 of what it read, closes; the digest also goes to the test.
fn collector() -> (SocketAddr, std::sync::mpsc::Receiver<(String, u64)>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let Ok((mut s, _)) = l.accept() else { return };
        let _ = s.set_read_timeout(Some(T));
        let mut h = Sha256::new();
        let mut buf = vec![0u8; 64 * 1024];
        let mut count = 0u64;
        loop {
            match s.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    h.update(&buf[..n]);
                    count += n as u64;
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
        let digest = h.finish_hex();
        let _ = s.write_all(digest.as_bytes());
        let _ = tx.send((digest, count));
    });
    (addr, rx)
}

#[test]
fn row14_half_close() {
    run_row(
        "14",
        "Half-close (client SHUT_WR, then reads)",
        "The client sends 1 MiB, shuts its write side and reads: every byte reaches the destination byte-exact and the client's connection ends (EOF, detection column) within 2 s of its SHUT_WR; whether the destination's answer after the half-close reaches the client is recorded (upstream ends the tunnel at the client's EOF)",
        |imp, dir, pki| {
            let (dest, digest) = collector();
            let server = Server::start(imp, dir, pki, 0, &[]);
            let _agent = Agent::start(imp, dir, pki, "agent", server.agent_port);
            check(wait_until(T, || server.ready() == 1.0), || {
                "agent not ready".into()
            })?;
            let mut s = server.connect(dest)?;
            let len = 1 << 20;
            let mut data = vec![0u8; len];
            Pattern::new(14).fill(&mut data);
            s.write_all(&data).map_err(|e| e.to_string())?;
            s.shutdown(std::net::Shutdown::Write)
                .map_err(|e| e.to_string())?;
            let shut = Instant::now();
            let mut answer = Vec::new();
            let read = s.read_to_end(&mut answer);
            let took = shut.elapsed();
            let (got, count) = digest
                .recv_timeout(T)
                .map_err(|_| "the destination never saw EOF".to_owned())?;
            check(got == konn_testkit::sha256_hex(&data), || {
                format!(
                    "the destination got {count} of the {len} bytes sent before SHUT_WR ({} lost)",
                    len as u64 - count.min(len as u64)
                )
            })?;
            check(read.is_ok(), || {
                format!("client read: {read:?} after {took:?}")
            })?;
            check(took <= Duration::from_secs(2), || {
                format!("EOF after {took:?}")
            })?;
            let propagated = answer == got.as_bytes();
            check(answer.is_empty() || propagated, || {
                "a corrupted answer".into()
            })?;
            check(wait_until(T, || server.tables_empty()), || {
                "tables not empty".into()
            })?;
            Ok(Measured {
                detection: Some(took),
                bytes_lost: Some(0),
                note: if propagated {
                    "half-close propagated: the destination's answer arrived after the client's SHUT_WR".into()
                } else {
                    "no half-close: the tunnel ended at the client's EOF, the destination's answer was dropped".into()
                },
                ..Measured::default()
            })
        },
    );
}

#[test]
fn row09_slow_frontend() {
    run_row(
        "09",
        "Slow frontend (a CONNECT client stops reading)",
        "A CONNECT client reads nothing while its destination floods; meanwhile a 2 MiB echo transfer through the same agent completes byte-exact within 10 s (paced: about 0.7 s unhindered); server peak RSS stays under 256 MiB; konn (--stuck-timeout=2s) closes the stalled connection within 2 s + 3 s of the transfer's end and its tables return to empty",
        |imp, dir, pki| {
            let echo = Echo::start();
            let flood = konn_testkit::dest::Destination::flood().map_err(|e| e.to_string())?;
            let extra: &[&str] = if imp == Imp::Konn {
                &["--stuck-timeout=2s"]
            } else {
                &[]
            };
            let server = Server::start(imp, dir, pki, 0, extra);
            let _agent = Agent::start(imp, dir, pki, "agent", server.agent_port);
            check(wait_until(T, || server.ready() == 1.0), || {
                "agent not ready".into()
            })?;
            let stalled = server
                .connect(flood.addr())
                .map_err(|e| format!("CONNECT to the flooding destination: {e:?}"))?;
            let start = Instant::now();
            // Bounded here rather than by the flow's own read timeout.
            let conn = server
                .connect(echo.addr)
                .map_err(|e| format!("a CONNECT next to the stalled connection: {e:?}"))?;
            let flow = Flow::start(conn, 9, 128);
            let total = (128 * CHUNK) as u64;
            let done = wait_until(Duration::from_secs(10), || flow.received() >= total);
            let took = start.elapsed();
            let peak = rss_peak(server.proc.pid());
            check(done, || {
                format!(
                    "the transfer next to the stalled connection got {} of {total} bytes in 10 s",
                    flow.received()
                )
            })?;
            let end = flow.join();
            check(end.end == End::Complete && end.intact, || {
                "the other transfer did not complete byte-exact".into()
            })?;
            check(peak < 256 << 20, || format!("server peak RSS {peak} bytes"))?;
            let closed = measure(
                Duration::from_secs(5),
                "the stalled connection closed",
                || server.metric(ESTABLISHED) == 0.0,
            );
            drop(stalled);
            let closed = if imp == Imp::Konn {
                closed?
            } else {
                closed.map_err(|e| format!("{e} (upstream has no stuck timeout)"))?
            };
            check(wait_until(T, || server.tables_empty()), || {
                "tables not empty".into()
            })?;
            Ok(Measured {
                detection: Some(closed),
                bytes_lost: Some(0),
                note: format!(
                    "other transfer {} ms; server peak RSS {} MiB",
                    took.as_millis(),
                    peak >> 20
                ),
                ..Measured::default()
            })
        },
    );
}
