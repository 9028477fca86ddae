//! `konn-bench icount`: instruction counts of the packet path, the
//! regression gate that does not flake on a shared machine.
//!
//! Wall-clock figures on a 2-vCPU VM shared with compilers move by ±50 %;
//! the number of instructions konn executes for a fixed workload barely
//! moves. The gate runs the release `proxy-server` and `proxy-agent`
//! (epoll, one worker, the harness's mTLS topology) under valgrind's
//! callgrind (this VM exposes no hardware counters, so `perf stat -e
//! instructions` is not an option), once per workload:
//!
//! | run | workload |
//! |---|---|
//! | `idle` | start, connect the agent, stop |
//! | `download` | one tunnel, [`DOWNLOAD_MB`] MB destination → frontend (S1) |
//! | `upload` | one tunnel, [`UPLOAD_MB`] MB frontend → destination (S2) |
//! | `dials` | [`DIALS`] sequential kube-apiserver-style dials, 1 KiB echo each (S4) |
//! | `connect-dials` | the same dials through the HTTP CONNECT frontend (S8's dial churn) |
//! | `messages` | [`MESSAGES`] 64 B round trips on one connection (S3's closed loop) |
//! | `messages-1k` | [`MESSAGES`] 1 KiB round trips on one connection (S3's larger message) |
//!
//! each [`REPEAT`] times, and reports the median instructions per MB, per
//! dial and per message for each process (workload run minus the `idle` run). The load generator runs natively;
//! only the two proxies are counted. With `--check FILE` the figures are
//! compared with a committed baseline and the run fails when any of them
//! grew by more than the baseline's `tolerance` (a few percent);
//! `--write FILE` records a new baseline.
//!
//! [`measure_kernel`] runs the same workloads natively, with `perf stat`
//! attached to each process for the workload only, and reports what the
//! instruction count cannot see: system calls, context switches and
//! io_uring completions per MB, per dial and per message (software tracepoints, which
//! a VM without hardware counters still has), plus CPU time (noisy on a
//! shared machine). That is how the io engines are compared on work done
//! rather than on wall-clock time alone.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use bytes::Bytes;

use super::dests::Dests;
use super::load::Conn;
use super::scenarios::DIAL_TIMEOUT;
use super::{Binaries, Mode, Topology};
use konn_testkit::Error;
use konn_testkit::pki::PkiFiles;

/// Megabytes (10^6 bytes) of the download run.
pub const DOWNLOAD_MB: u64 = 16;
/// Megabytes of the upload run.
pub const UPLOAD_MB: u64 = 16;
/// Dials of the dial run.
pub const DIALS: u64 = 600;
/// Round trips of the message run.
pub const MESSAGES: u64 = 2000;
/// Size of one message of the message run (S3's small message).
const MESSAGE: usize = 64;
/// Size of one message of the `messages-1k` run (S3's 1 KiB message).
const MESSAGE_KIB: usize = 1024;

/// Upload write size (as S2).
const CHUNK: usize = 64 * 1024;

/// Runs of each workload; the gate uses the median.
const REPEAT: usize = 3;

/// One counted run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Run {
    /// Start, connect, stop.
    Idle,
    /// [`DOWNLOAD_MB`] MB downloaded through one tunnel.
    Download,
    /// [`UPLOAD_MB`] MB uploaded through one tunnel.
    Upload,
    /// [`DIALS`] sequential dials with a 1 KiB echo.
    Dials,
    /// The same dials through the HTTP CONNECT frontend (S8).
    ConnectDials,
    /// [`MESSAGES`] round trips of a 64 B message on one connection
    /// (S3's closed loop: the per-message cost of small exchanges).
    Messages,
    /// [`MESSAGES`] round trips of a 1 KiB message on one connection
    /// (S3's larger message: what a payload copy costs).
    MessagesKib,
}

impl Run {
    /// Every run, `Idle` first (the others are measured against it).
    pub const ALL: [Self; 7] = [
        Self::Idle,
        Self::Download,
        Self::Upload,
        Self::Dials,
        Self::ConnectDials,
        Self::Messages,
        Self::MessagesKib,
    ];

    /// Name in reports and baselines.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Idle => "idle",
            Self::Download => "download",
            Self::Upload => "upload",
            Self::Dials => "dials",
            Self::ConnectDials => "connect-dials",
            Self::Messages => "messages",
            Self::MessagesKib => "messages-1k",
        }
    }

    /// What the run's difference to `idle` is divided by, and its unit.
    const fn per(self) -> (u64, &'static str) {
        match self {
            Self::Idle => (1, "run"),
            Self::Download => (DOWNLOAD_MB, "MB"),
            Self::Upload => (UPLOAD_MB, "MB"),
            Self::Dials | Self::ConnectDials => (DIALS, "dial"),
            Self::Messages | Self::MessagesKib => (MESSAGES, "msg"),
        }
    }

    /// The frontend the run's load comes through. `Idle` is the gRPC
    /// topology's, which the CONNECT one differs from only in its
    /// frontend's flags: the difference is the dials' cost.
    const fn mode(self) -> Mode {
        match self {
            Self::ConnectDials => Mode::HttpConnect,
            _ => Mode::Grpc,
        }
    }
}

/// Wrapper scripts that start `bins`' binaries under callgrind, writing
/// their counts to `out/<run>-{server,agent}.cg`; with `lines`, per source
/// line (for `callgrind_annotate`), else only the totals the gate reads.
fn wrapped(bins: &Binaries, dir: &Path, run: Run, lines: bool) -> Result<Binaries, Error> {
    let mut b = bins.clone();
    for (what, real) in [("server", &bins.server), ("agent", &bins.agent)] {
        let script = dir.join(format!("{}-{what}.sh", run.name()));
        let out = dir.join(format!("{}-{what}.cg", run.name()));
        let detail = if lines { "yes" } else { "no" };
        let text = format!(
            "#!/bin/sh\nexec valgrind --tool=callgrind --callgrind-out-file={} --dump-line={detail} \
             --compress-strings=no --trace-children=no -q {} \"$@\"\n",
            out.display(),
            real.display()
        );
        std::fs::write(&script, text).map_err(|e| Error::Write(script.clone(), e))?;
        set_executable(&script)?;
        if what == "server" {
            b.server = script;
        } else {
            b.agent = script;
        }
    }
    Ok(b)
}

fn set_executable(p: &Path) -> Result<(), Error> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755))
        .map_err(|e| Error::Write(p.to_owned(), e))
}

/// The total instructions (`Ir`) in a callgrind output file.
pub fn callgrind_total(path: &Path) -> Result<u64, Error> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::Write(path.to_owned(), e))?;
    text.lines()
        .find_map(|l| {
            l.strip_prefix("summary:")
                .or_else(|| l.strip_prefix("totals:"))
        })
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| Error::Closed(format!("no instruction total in {}", path.display())))
}

/// The workload of `run`, through `t`'s route.
async fn workload(route: &super::load::Route, dests: &Dests, run: Run) -> Result<(), Error> {
    match run {
        Run::Idle => Ok(()),
        Run::Download => {
            let mut c = Conn::open(route, dests.source, DIAL_TIMEOUT).await?;
            let want = DOWNLOAD_MB * 1_000_000;
            c.write(Bytes::copy_from_slice(&want.to_be_bytes())).await?;
            let mut got = 0u64;
            while got < want {
                match c.read_some(Duration::from_secs(60)).await? {
                    0 => return Err(Error::Closed(format!("download ended at {got} B"))),
                    n => got += n as u64,
                }
            }
            c.close(DIAL_TIMEOUT).await;
            Ok(())
        }
        Run::Upload => {
            let mut c = Conn::open(route, dests.sink, DIAL_TIMEOUT).await?;
            let total = UPLOAD_MB * 1_000_000;
            c.write(Bytes::copy_from_slice(&total.to_be_bytes()))
                .await?;
            let mut sent = 0u64;
            let mut off = 0;
            while sent < total {
                let n = CHUNK.min(usize::try_from(total - sent).unwrap_or(CHUNK));
                c.write(dests.block.slice(off..off + n)).await?;
                off = (off + CHUNK) % dests.block.len();
                sent += n as u64;
            }
            // The sink answers with the count once it has everything.
            c.read_n(8, Duration::from_secs(60)).await?;
            c.close(DIAL_TIMEOUT).await;
            Ok(())
        }
        Run::Dials | Run::ConnectDials => {
            let msg = Bytes::from(vec![0x42; 1024]);
            for k in 0..DIALS as usize {
                let mut c = Conn::open(route, dests.echo_for(k), DIAL_TIMEOUT).await?;
                c.write(msg.clone()).await?;
                c.read_n(msg.len(), DIAL_TIMEOUT).await?;
                c.close(DIAL_TIMEOUT).await;
            }
            Ok(())
        }
        Run::Messages | Run::MessagesKib => {
            let size = if run == Run::Messages {
                MESSAGE
            } else {
                MESSAGE_KIB
            };
            let msg = Bytes::from(vec![0x42; size]);
            let mut c = Conn::open(route, dests.echo_for(0), DIAL_TIMEOUT).await?;
            for _ in 0..MESSAGES {
                c.write(msg.clone()).await?;
                c.read_n(msg.len(), DIAL_TIMEOUT).await?;
            }
            c.close(DIAL_TIMEOUT).await;
            Ok(())
        }
    }
}

/// Instructions of one run: (server, agent).
async fn count(
    bins: &Binaries,
    dir: &Path,
    certs: &PkiFiles,
    dests: &Dests,
    run: Run,
    lines: bool,
) -> Result<(u64, u64), Error> {
    let wrapped = wrapped(bins, dir, run, lines)?;
    let topo = Topology::start(&wrapped, run.mode(), dir, certs, None)?;
    let route = topo.route();
    let r = workload(&route, dests, run).await;
    // Let the last CLOSE_RSP and the frontend's goodbye settle, so every
    // run ends in the same state.
    monoio::time::sleep(Duration::from_millis(300)).await;
    let clean = topo.stop(Duration::from_secs(60));
    r?;
    if !clean {
        return Err(Error::Closed(format!(
            "{} run: a process did not stop on SIGTERM",
            run.name()
        )));
    }
    let total = |what| callgrind_total(&dir.join(format!("{}-{what}.cg", run.name())));
    Ok((total("server")?, total("agent")?))
}

/// `perf stat` attached to `pid`, counting `EVENTS` until interrupted.
struct PerfStat {
    child: std::process::Child,
    out: std::path::PathBuf,
}

/// Software events counted by [`measure_kernel`].
const EVENTS: [&str; 5] = [
    "raw_syscalls:sys_enter",
    "context-switches",
    "page-faults",
    "io_uring:io_uring_complete",
    "task-clock",
];

impl PerfStat {
    /// Counts [`EVENTS`], and the events named in the environment
    /// variable `KONN_BENCH_PERF_EVENTS` (comma-separated, e.g.
    /// `syscalls:sys_enter_io_uring_enter`: which system calls).
    fn attach(pid: u32, out: &Path) -> Result<Self, Error> {
        let mut events = EVENTS.join(",");
        if let Ok(extra) = std::env::var("KONN_BENCH_PERF_EVENTS") {
            events = format!("{events},{extra}");
        }
        let child = std::process::Command::new("perf")
            .args(["stat", "-x", ",", "-o"])
            .arg(out)
            .args(["-e", &events, "-p", &pid.to_string()])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .map_err(|e| Error::Socket(format!("perf: {e}")))?;
        Ok(Self {
            child,
            out: out.to_owned(),
        })
    }

    /// Stops counting and returns event → count.
    #[allow(unsafe_code)]
    fn finish(mut self) -> Result<BTreeMap<String, f64>, Error> {
        let pid = libc::pid_t::try_from(self.child.id()).unwrap_or(0);
        // SAFETY: kill(2) on our own child's pid; SIGINT makes perf print
        // its counts and exit.
        unsafe { libc::kill(pid, libc::SIGINT) };
        let _ = self.child.wait();
        let text =
            std::fs::read_to_string(&self.out).map_err(|e| Error::Write(self.out.clone(), e))?;
        let mut counts = BTreeMap::new();
        for line in text.lines() {
            let f: Vec<&str> = line.split(',').collect();
            if let (Some(v), Some(name)) = (f.first(), f.get(2))
                && let Ok(v) = v.parse::<f64>()
            {
                counts.insert((*name).to_owned(), v);
            }
        }
        Ok(counts)
    }
}

/// [`Run`]s other than `Idle`, natively, with `perf stat` on each process
/// during the workload: `"<run> <process> <event>/<unit>"` → value.
/// `bins` selects the engine through its flags.
pub async fn measure_kernel(
    bins: &Binaries,
    dir: &Path,
    certs: &PkiFiles,
) -> Result<Figures, Error> {
    let dests = Dests::start().map_err(|e| Error::Socket(format!("destinations: {e}")))?;
    let mut out = Figures::new();
    for run in Run::ALL.into_iter().filter(|r| *r != Run::Idle) {
        let topo = Topology::start(bins, run.mode(), dir, certs, None)?;
        let perf = [
            (
                "server",
                PerfStat::attach(topo.server.pid(), &dir.join("perf-server.txt"))?,
            ),
            (
                "agent",
                PerfStat::attach(topo.agent.pid(), &dir.join("perf-agent.txt"))?,
            ),
        ];
        // perf needs a moment to attach to every thread.
        monoio::time::sleep(Duration::from_millis(300)).await;
        let r = workload(&topo.route(), &dests, run).await;
        let (per, unit) = run.per();
        for (what, p) in perf {
            for (event, v) in p.finish()? {
                let event = event
                    .trim_start_matches("raw_syscalls:sys_enter")
                    .to_owned();
                let event = if event.is_empty() {
                    "syscalls".to_owned()
                } else {
                    event
                };
                out.insert(
                    format!("{} {what} {event}/{unit}", run.name()),
                    v / per as f64,
                );
            }
        }
        topo.stop(Duration::from_secs(10));
        r?;
    }
    Ok(out)
}

/// The figures of one gate run: `"<run> <process> instr/<unit>"` → value,
/// plus the idle run's totals.
pub type Figures = BTreeMap<String, f64>;

/// Counts every run for `bins` (konn's release binaries; the flags must
/// select epoll and one worker) in `dir`.
pub async fn measure(bins: &Binaries, dir: &Path, certs: &PkiFiles) -> Result<Figures, Error> {
    let dests = Dests::start().map_err(|e| Error::Socket(format!("destinations: {e}")))?;
    let mut raw = BTreeMap::new();
    for run in Run::ALL {
        // The median of a few runs: how data batches into reads and writes
        // depends on timing even under valgrind, which moves single counts
        // by a few percent.
        let mut counts = Vec::with_capacity(REPEAT);
        for _ in 0..REPEAT {
            let (s, a) = count(bins, dir, certs, &dests, run, false).await?;
            eprintln!("  {:<9} server {s:>14} Ir   agent {a:>14} Ir", run.name());
            counts.push((s, a));
        }
        let median = |mut v: Vec<u64>| {
            v.sort_unstable();
            v.get(v.len() / 2).copied().unwrap_or(0)
        };
        raw.insert(
            run,
            (
                median(counts.iter().map(|c| c.0).collect()),
                median(counts.iter().map(|c| c.1).collect()),
            ),
        );
    }
    let idle = raw.get(&Run::Idle).copied().unwrap_or_default();
    let mut out = Figures::new();
    for (run, (s, a)) in raw {
        let (per, unit) = run.per();
        let (s, a) = if run == Run::Idle {
            (s, a)
        } else {
            (s.saturating_sub(idle.0), a.saturating_sub(idle.1))
        };
        out.insert(
            format!("{} server Ir/{unit}", run.name()),
            s as f64 / per as f64,
        );
        out.insert(
            format!("{} agent Ir/{unit}", run.name()),
            a as f64 / per as f64,
        );
    }
    Ok(out)
}

/// Runs each of `runs` once under callgrind with per-line detail and
/// leaves `<run>-{server,agent}.cg` in `out`, for `callgrind_annotate`
/// (instructions by function: where a dial or a megabyte goes). Returns
/// each run's totals, (server, agent).
pub async fn profile(
    bins: &Binaries,
    out: &Path,
    certs: &PkiFiles,
    runs: &[Run],
) -> Result<Vec<(Run, u64, u64)>, Error> {
    let dests = Dests::start().map_err(|e| Error::Socket(format!("destinations: {e}")))?;
    let mut totals = Vec::with_capacity(runs.len());
    for &run in runs {
        let (s, a) = count(bins, out, certs, &dests, run, true).await?;
        totals.push((run, s, a));
    }
    Ok(totals)
}

/// A committed baseline: the figures and how much each may grow.
#[derive(Debug, Clone)]
pub struct Baseline {
    /// Largest accepted growth, as a fraction (0.03: 3 %).
    pub tolerance: f64,
    /// The figures.
    pub figures: Figures,
}

impl Baseline {
    /// Reads a baseline written by [`Baseline::write`].
    pub fn read(path: &Path) -> Result<Self, Error> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::Write(path.to_owned(), e))?;
        let v: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| Error::Closed(format!("{}: {e}", path.display())))?;
        let tolerance = v["tolerance"].as_f64().unwrap_or(0.03);
        let figures = v["figures"]
            .as_object()
            .map(|m| {
                m.iter()
                    .filter_map(|(k, v)| Some((k.clone(), v.as_f64()?)))
                    .collect()
            })
            .unwrap_or_default();
        Ok(Self { tolerance, figures })
    }

    /// Writes `self` as JSON, with `note` saying where it was measured.
    pub fn write(&self, path: &Path, note: &str) -> Result<(), Error> {
        let v = serde_json::json!({
            "note": note,
            "tolerance": self.tolerance,
            "figures": self.figures,
        });
        let text = serde_json::to_string_pretty(&v).unwrap_or_default() + "\n";
        std::fs::write(path, text).map_err(|e| Error::Write(path.to_owned(), e))
    }

    /// One line per figure (`PASS`/`FAIL`/`NEW`), and whether all passed.
    /// Only growth fails; a figure that shrank beyond the tolerance is
    /// reported as `BETTER` (time to record a new baseline).
    pub fn check(&self, now: &Figures) -> (Vec<String>, bool) {
        let mut ok = true;
        let mut lines = Vec::new();
        for (name, &base) in &self.figures {
            let Some(&cur) = now.get(name) else {
                ok = false;
                lines.push(format!("FAIL {name}: not measured"));
                continue;
            };
            let change = if base > 0.0 { cur / base - 1.0 } else { 0.0 };
            let verdict = if change > self.tolerance {
                ok = false;
                "FAIL"
            } else if change < -self.tolerance {
                "BETTER"
            } else {
                "PASS"
            };
            lines.push(format!(
                "{verdict} {name}: {cur:.0} vs baseline {base:.0} ({:+.2} %, limit +{:.1} %)",
                change * 100.0,
                self.tolerance * 100.0
            ));
        }
        for name in now.keys().filter(|k| !self.figures.contains_key(*k)) {
            lines.push(format!("NEW {name}: {:.0}", now[name]));
        }
        (lines, ok)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gate_fails_growth_only() {
        let figures: Figures = [("a".to_owned(), 100.0), ("b".to_owned(), 100.0)].into();
        let base = Baseline {
            tolerance: 0.03,
            figures,
        };
        let now: Figures = [("a".to_owned(), 102.9), ("b".to_owned(), 90.0)].into();
        let (lines, ok) = base.check(&now);
        assert!(ok, "{lines:?}");
        assert!(lines[1].starts_with("BETTER"), "{lines:?}");
        let now: Figures = [("a".to_owned(), 103.5), ("b".to_owned(), 100.0)].into();
        let (lines, ok) = base.check(&now);
        assert!(!ok && lines[0].starts_with("FAIL a"), "{lines:?}");
        let now: Figures = [("a".to_owned(), 100.0)].into();
        assert!(!base.check(&now).1, "a missing figure fails");
    }

    #[test]
    fn callgrind_totals_are_read() {
        let dir = std::env::temp_dir().join(format!("konn-icount-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("x.cg");
        std::fs::write(&f, "version: 1\nevents: Ir\nfn=main\n1 5\nsummary: 12345\n").unwrap();
        assert_eq!(callgrind_total(&f).unwrap(), 12345);
        std::fs::write(&f, "events: Ir\n").unwrap();
        assert!(callgrind_total(&f).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
