//! `konn-bench compare`: every scenario of the benchmark plan for the
//! direct baseline, upstream and konn (one entry per io engine) in one
//! invocation, interleaved by repetition (the order of the
//! implementations rotates every repetition: A B C D, B C D A, …), with
//! the same certificates, flags and CPU pinning; and the quick
//! regression check built on the same cells.
//!
//! The load generator (and its destinations) runs on this thread, pinned
//! to CPU 0; every server and agent runs pinned to CPU 1 with one worker
//! (konn `--workers=1`, Go `GOMAXPROCS=1`), so on a 2-CPU machine the
//! proxies have one core between them, as the plan's pinning asks.

use std::path::{Path, PathBuf};
use std::time::Duration;

use monoio::time::{Instant, sleep};

use super::dests::Dests;
use super::load::{Conn, Route};
use super::report::{Cell, DIRECT, ImplSamples, Sample, UPSTREAM};
use super::scenarios::{self, DIAL_TIMEOUT, Direction, Target, Window};
use super::stats::median;
use super::{Binaries, Mode, Topology, fd_count, rss_kib};
use konn_testkit::Error;
use konn_testkit::pki::PkiFiles;

/// What to run.
#[derive(Clone, Debug)]
pub struct Config {
    /// The short CI subset (S1 and S3 only, shorter windows).
    pub quick: bool,
    /// Repetitions of every cell.
    pub reps: usize,
    /// The implementations besides the direct baseline (upstream first).
    pub impls: Vec<Binaries>,
    /// Idle connections of S5 (0: skip S5).
    pub idle_conns: usize,
    /// Only these scenarios (`S1`, `S8`, …); all when empty.
    pub only: Vec<String>,
    /// CPU of the load generator and CPUs of the proxies (`None`: no
    /// pinning, on a machine with one CPU).
    pub pin: Option<(usize, Vec<usize>)>,
}

/// The target of implementation `i` of a run: 0 is the direct
/// baseline, `i ≥ 1` is `topos[i - 1]`.
fn target<'d>(topos: &[Topology], i: usize, dests: &'d Dests) -> Target<'d> {
    match i.checked_sub(1).and_then(|k| topos.get(k)) {
        None => Target {
            route: Route::Direct,
            pids: None,
            dests,
        },
        Some(t) => Target {
            route: t.route(),
            pids: Some((t.server.pid(), t.agent.pid())),
            dests,
        },
    }
}

fn names(topos: &[Topology]) -> Vec<String> {
    std::iter::once(DIRECT.to_owned())
        .chain(topos.iter().map(|t| t.name().to_owned()))
        .collect()
}

/// A workload of one cell.
#[derive(Clone, Copy, Debug)]
enum Work {
    Bulk(Direction, usize),
    Ping {
        conns: usize,
        size: usize,
        rate: Option<f64>,
    },
    Hol {
        conns: usize,
        size: usize,
        rate: f64,
    },
    Dials(usize),
}

/// One cell of the run.
struct Case {
    scenario: &'static str,
    case: String,
    work: Work,
    window: Window,
    headline: &'static [&'static str],
    plot: &'static str,
}

const BULK_HEAD: &[&str] = &[
    "MB/s",
    "% of direct",
    "server CPU s/GB",
    "agent CPU s/GB",
    "CPU s/GB",
    "kernel CPU s/GB",
];
const OPEN_HEAD: &[&str] = &[
    "added p50 µs",
    "added p99 µs",
    "added p99.9 µs",
    "server CPU µs/msg",
    "agent CPU µs/msg",
    "timeouts",
];
const CLOSED_HEAD: &[&str] = &["msg/s", "p50 µs", "p99 µs", "CPU µs/msg"];
const HOL_HEAD: &[&str] = &["p99 µs (no stall)", "p99 µs", "HOL p99 ×", "timeouts"];
const DIAL_HEAD: &[&str] = &[
    "dials/s",
    "dial p50 µs",
    "dial p99 µs",
    "server CPU µs/dial",
    "agent CPU µs/dial",
    "kernel CPU µs/dial",
    "failed dials",
];

fn win(warm_ms: u64, secs_ms: u64) -> Window {
    Window {
        warm: Duration::from_millis(warm_ms),
        secs: Duration::from_millis(secs_ms),
    }
}

fn open_loop(conns: usize, size: usize, rate: f64) -> Work {
    Work::Ping {
        conns,
        size,
        rate: Some(rate),
    }
}

/// The gRPC-mode cells (S1–S4, S6) and the HTTP-CONNECT cells (S8).
fn cases(quick: bool) -> (Vec<Case>, Vec<Case>) {
    let s1 = |streams, w| Case {
        scenario: "S1",
        case: format!("download, {streams} stream(s)"),
        work: Work::Bulk(Direction::Download, streams),
        window: w,
        headline: BULK_HEAD,
        plot: "MB/s",
    };
    let s3 = |conns, size, rate: f64, w| Case {
        scenario: "S3",
        case: format!("open loop {conns} conn × {size} B at {rate} msg/s"),
        work: open_loop(conns, size, rate),
        window: w,
        headline: OPEN_HEAD,
        plot: "added p99 µs",
    };
    let s4 = |w| Case {
        scenario: "S4",
        case: "dial churn, 8 dialers, 1 KiB echo".into(),
        work: Work::Dials(8),
        window: w,
        headline: DIAL_HEAD,
        plot: "dials/s",
    };
    if quick {
        return (
            vec![
                s1(1, win(300, 1500)),
                s3(16, 64, 1000.0, win(300, 2000)),
                s4(win(300, 1500)),
            ],
            Vec::new(),
        );
    }
    let grpc = vec![
        s1(1, win(500, 2000)),
        s1(8, win(500, 2000)),
        Case {
            scenario: "S2",
            case: "upload, 1 stream".into(),
            work: Work::Bulk(Direction::Upload, 1),
            window: win(500, 2000),
            headline: BULK_HEAD,
            plot: "MB/s",
        },
        s3(16, 64, 1000.0, win(500, 3000)),
        s3(16, 1024, 10_000.0, win(500, 3000)),
        Case {
            scenario: "S3",
            case: "closed loop 1 conn × 64 B".into(),
            work: Work::Ping {
                conns: 1,
                size: 64,
                rate: None,
            },
            window: win(300, 2000),
            headline: CLOSED_HEAD,
            plot: "msg/s",
        },
        s4(win(500, 2000)),
        Case {
            scenario: "S6",
            case: "16 conn × 64 B at 1000 msg/s, + 1 stalled upload".into(),
            work: Work::Hol {
                conns: 16,
                size: 64,
                rate: 1000.0,
            },
            window: win(300, 2500),
            headline: HOL_HEAD,
            plot: "p99 µs",
        },
    ];
    let connect = vec![
        Case {
            scenario: "S8",
            case: "CONNECT download, 1 stream".into(),
            work: Work::Bulk(Direction::Download, 1),
            window: win(500, 2000),
            headline: BULK_HEAD,
            plot: "MB/s",
        },
        Case {
            scenario: "S8",
            case: "CONNECT open loop 16 conn × 64 B at 1000 msg/s".into(),
            work: open_loop(16, 64, 1000.0),
            window: win(500, 2500),
            headline: OPEN_HEAD,
            plot: "added p99 µs",
        },
        Case {
            scenario: "S8",
            case: "CONNECT dial churn, 8 dialers".into(),
            work: Work::Dials(8),
            window: win(500, 2000),
            headline: DIAL_HEAD,
            plot: "dials/s",
        },
    ];
    (grpc, connect)
}

async fn run_work(t: &Target<'_>, c: &Case) -> Result<Sample, Error> {
    match c.work {
        Work::Bulk(dir, streams) => scenarios::bulk(t, dir, streams, c.window).await,
        Work::Ping { conns, size, rate } => scenarios::ping(t, conns, size, rate, c.window).await,
        Work::Dials(n) => scenarios::dial_churn(t, n, c.window).await,
        Work::Hol { conns, size, rate } => {
            let free = scenarios::ping(t, conns, size, Some(rate), c.window).await?;
            sleep(Duration::from_millis(200)).await;
            let stall = Duration::from_millis(1000);
            let mut s = scenarios::ping_with_stall(t, conns, size, rate, stall, c.window).await?;
            let (with, without) = (s["p99 µs"], free["p99 µs"]);
            s.insert("p99 µs (no stall)".into(), without);
            if without > 0.0 {
                s.insert("HOL p99 ×".into(), with / without);
            }
            Ok(s)
        }
    }
}

fn new_cell(c: &Case, names: &[String], reps: usize) -> Cell {
    Cell {
        scenario: c.scenario.into(),
        case: c.case.clone(),
        headline: c.headline.iter().map(|s| (*s).to_owned()).collect(),
        plot: Some(c.plot.into()),
        impls: names
            .iter()
            .map(|n| ImplSamples {
                name: n.clone(),
                reps: vec![Sample::new(); reps],
            })
            .collect(),
        notes: Vec::new(),
    }
}

/// Run `cases` for the direct baseline and every topology, `reps` times,
/// rotating the order of the implementations every repetition. A
/// topology that no longer passes one echo through a fresh dial after a
/// cell is restarted (noted in the cell), so one wedged proxy costs its
/// own cell, not the rest of the run.
async fn run_cases(
    cases: &[Case],
    topos: &mut [Topology],
    dests: &Dests,
    reps: usize,
) -> Vec<Cell> {
    let names = names(topos);
    let mut cells: Vec<Cell> = cases.iter().map(|c| new_cell(c, &names, reps)).collect();
    for rep in 0..reps {
        for (ci, case) in cases.iter().enumerate() {
            for k in 0..names.len() {
                let ui = (k + rep) % names.len();
                let name = &names[ui];
                let started = Instant::now();
                let r = run_work(&target(topos, ui, dests), case).await;
                let took = started.elapsed();
                match r {
                    Ok(s) => {
                        eprintln!(
                            "  rep {} {} {name:<14} {took:>6.1?}  {}",
                            rep + 1,
                            case.scenario,
                            brief(&s, case.plot)
                        );
                        cells[ci].impls[ui].reps[rep] = s;
                    }
                    Err(e) => {
                        eprintln!("  rep {} {} {name}: {e}", rep + 1, case.scenario);
                        cells[ci]
                            .notes
                            .push(format!("{name} repetition {}: {e}", rep + 1));
                    }
                }
                // A proxy that no longer passes one echo through a fresh
                // dial (upstream after a stalled connection, say) is
                // restarted, so it costs its own cell, not the rest.
                if ui > 0 {
                    sleep(Duration::from_millis(300)).await;
                    let probe = target(topos, ui, dests);
                    if first_good_dial(&probe, Duration::from_secs(3))
                        .await
                        .is_none()
                    {
                        eprintln!("  {name} no longer tunnels: restarting it");
                        let note = match topos[ui - 1].restart_both() {
                            Ok(()) => "no longer tunnelled afterwards; restarted".into(),
                            Err(e) => {
                                format!("no longer tunnelled afterwards; restart failed: {e}")
                            }
                        };
                        cells[ci]
                            .notes
                            .push(format!("{name} repetition {}: {note}", rep + 1));
                    }
                }
                // Let the proxies finish closing before the next cell.
                sleep(Duration::from_millis(300)).await;
            }
        }
    }
    for c in &mut cells {
        c.derive();
    }
    cells
}

fn brief(s: &Sample, metric: &str) -> String {
    s.get(metric)
        .or_else(|| s.get(metric.trim_start_matches("added ")))
        .map_or_else(String::new, |v| format!("{metric} {v:.1}"))
}

/// S5 for every proxy: RSS growth per idle tunnelled connection.
async fn run_idle(topos: &[Topology], dests: &Dests, n: usize) -> Cell {
    let mut cell = Cell {
        scenario: "S5".into(),
        case: format!("{n} idle tunnelled connections"),
        headline: vec!["server KiB/conn".into(), "agent KiB/conn".into()],
        plot: Some("server KiB/conn".into()),
        impls: Vec::new(),
        notes: Vec::new(),
    };
    for (i, t) in topos.iter().enumerate() {
        let r = scenarios::idle(&target(topos, i + 1, dests), n, Duration::from_millis(2500)).await;
        let mut reps = vec![Sample::new()];
        match r {
            Ok(s) => {
                eprintln!("  S5 {:<14} {s:?}", t.name());
                reps[0] = s;
            }
            Err(e) => cell.notes.push(format!("{}: {e}", t.name())),
        }
        cell.impls.push(ImplSamples {
            name: t.name().to_owned(),
            reps,
        });
        sleep(Duration::from_millis(1500)).await;
    }
    cell
}

/// One 16-byte echo through a fresh dial.
async fn try_dial(t: &Target<'_>) -> bool {
    let msg = bytes::Bytes::from_static(b"are you there?!!");
    let one = async {
        let mut c = Conn::open(&t.route, t.dests.echo_for(0), DIAL_TIMEOUT).await?;
        c.write(msg.clone()).await?;
        let r = c.read_n(msg.len(), DIAL_TIMEOUT).await;
        c.abort().await;
        r
    };
    matches!(
        monoio::time::timeout(Duration::from_secs(2), one).await,
        Ok(Ok(()))
    )
}

/// Dial through `t` until one 16-byte echo succeeds; the time it took.
async fn first_good_dial(t: &Target<'_>, limit: Duration) -> Option<Duration> {
    let start = Instant::now();
    while start.elapsed() < limit {
        if try_dial(t).await {
            return Some(start.elapsed());
        }
        sleep(Duration::from_millis(20)).await;
    }
    None
}

/// After a restart of topology `i` at `since`: dial until one echo
/// succeeds, starting again any process that exited meanwhile. The time
/// since `since` and the number of such restarts.
async fn recovered(
    topos: &mut [Topology],
    i: usize,
    dests: &Dests,
    since: Instant,
    limit: Duration,
) -> (Option<Duration>, u32) {
    let mut failed = 0;
    while since.elapsed() < limit {
        if try_dial(&target(topos, i + 1, dests)).await {
            return (Some(since.elapsed()), failed);
        }
        match topos[i].revive() {
            Ok(n) => failed += n,
            Err(_) => return (None, failed),
        }
        sleep(Duration::from_millis(20)).await;
    }
    (None, failed)
}

/// S7 for every proxy: kill the agent 3 times and the server once; time
/// until a dial through the tunnel works again; file descriptors and RSS
/// of the server after the agent restarts against before (leak check).
async fn run_churn(topos: &mut [Topology], dests: &Dests) -> Cell {
    const RESTARTS: usize = 3;
    let mut cell = Cell {
        scenario: "S7".into(),
        case: "agent killed ×3, server killed ×1".into(),
        headline: vec![
            "agent reconnect ms".into(),
            "server restart ms".into(),
            "server fd delta".into(),
            "server RSS delta KiB".into(),
            "failed starts".into(),
        ],
        plot: Some("agent reconnect ms".into()),
        impls: Vec::new(),
        notes: Vec::new(),
    };
    let limit = Duration::from_secs(30);
    for i in 0..topos.len() {
        let name = topos[i].name().to_owned();
        let mut reps = vec![Sample::new(); RESTARTS];
        let spid = topos[i].server.pid();
        let (fd0, rss0) = (fd_count(spid), rss_kib(spid));
        for (r, rep) in reps.iter_mut().enumerate() {
            let since = Instant::now();
            if let Err(e) = topos[i].restart_agent() {
                cell.notes
                    .push(format!("{name}: restarting the agent: {e}"));
                break;
            }
            let (d, failed) = recovered(topos, i, dests, since, limit).await;
            if failed > 0 {
                rep.insert("failed starts".into(), f64::from(failed));
            }
            match d {
                Some(d) => {
                    rep.insert("agent reconnect ms".into(), d.as_secs_f64() * 1e3);
                }
                None => cell.notes.push(format!(
                    "{name}: no dial within {limit:?} after agent restart {}",
                    r + 1
                )),
            }
            sleep(Duration::from_millis(300)).await;
        }
        sleep(Duration::from_millis(1500)).await;
        if let (Some(a), Some(b)) = (fd0, fd_count(spid)) {
            reps[0].insert("server fd delta".into(), b as f64 - a as f64);
        }
        if let (Some(a), Some(b)) = (rss0, rss_kib(spid)) {
            reps[0].insert("server RSS delta KiB".into(), b as f64 - a as f64);
        }
        let since = Instant::now();
        match topos[i].restart_server() {
            Ok(()) => {
                let (d, failed) = recovered(topos, i, dests, since, limit).await;
                if failed > 0 {
                    cell.notes.push(format!(
                        "{name}: after the server restart, {failed} process start(s) failed (port still bound)"
                    ));
                }
                match d {
                    Some(d) => {
                        reps[0].insert("server restart ms".into(), d.as_secs_f64() * 1e3);
                    }
                    None => cell.notes.push(format!(
                        "{name}: no dial within {limit:?} after server restart"
                    )),
                }
            }
            Err(e) => cell
                .notes
                .push(format!("{name}: restarting the server: {e}")),
        }
        eprintln!("  S7 {name:<14} {reps:?}");
        cell.impls.push(ImplSamples { name, reps });
    }
    cell
}

fn start_all(
    cfg: &Config,
    mode: Mode,
    dir: &Path,
    certs: &PkiFiles,
) -> Result<Vec<Topology>, Error> {
    let cpus = cfg.pin.as_ref().map(|(_, p)| p.as_slice());
    let mut out = Vec::new();
    for b in &cfg.impls {
        // On error the started ones are dropped, which kills them.
        out.push(Topology::start(b, mode, dir, certs, cpus)?);
    }
    Ok(out)
}

fn stop_all(topos: Vec<Topology>) {
    for t in topos {
        let name = t.name().to_owned();
        if !t.stop(Duration::from_secs(5)) {
            eprintln!("  {name}: a process did not stop on SIGTERM (killed)");
        }
    }
}

/// Run the whole comparison (or the quick subset) on the current monoio
/// runtime; the topologies are started in `dir` and stopped before this
/// returns, also on errors (a dropped topology kills its processes).
pub async fn run(cfg: &Config, dir: &Path, certs: &PkiFiles) -> Result<Vec<Cell>, Error> {
    let dests = Dests::start().map_err(|e| Error::Socket(format!("destinations: {e}")))?;
    let wanted =
        |s: &str| cfg.only.is_empty() || cfg.only.iter().any(|o| o.eq_ignore_ascii_case(s));
    let (mut grpc_cases, mut connect_cases) = cases(cfg.quick);
    grpc_cases.retain(|c| wanted(c.scenario));
    connect_cases.retain(|c| wanted(c.scenario));
    let mut cells = Vec::new();

    eprintln!("starting the gRPC-mode topologies");
    let mut topos = start_all(cfg, Mode::Grpc, dir, certs)?;
    // S5 first, on fresh processes: after the bulk scenarios the
    // allocators hold freed memory that new connections would reuse,
    // which would understate the cost of an idle connection.
    let idle = if !cfg.quick && cfg.idle_conns > 0 && wanted("S5") {
        Some(run_idle(&topos, &dests, cfg.idle_conns).await)
    } else {
        None
    };
    cells.extend(run_cases(&grpc_cases, &mut topos, &dests, cfg.reps).await);
    cells.extend(idle);
    if !cfg.quick && wanted("S7") {
        cells.push(run_churn(&mut topos, &dests).await);
    }
    stop_all(topos);

    if !connect_cases.is_empty() {
        eprintln!("starting the HTTP-CONNECT-mode topologies");
        let mut topos = start_all(cfg, Mode::HttpConnect, dir, certs)?;
        cells.extend(run_cases(&connect_cases, &mut topos, &dests, cfg.reps).await);
        stop_all(topos);
    }
    Ok(cells)
}

/// Margins of the quick regression check: konn's S1 throughput must be
/// at least `min_s1` × upstream's, its S3 p99 at most `max_s3` ×
/// upstream's, and its S4 dial rate at least `min_s4` × upstream's
/// (medians of the per-repetition ratios).
#[derive(Clone, Copy, Debug)]
pub struct Margins {
    /// Lowest acceptable konn/upstream S1 MB/s ratio.
    pub min_s1: f64,
    /// Highest acceptable konn/upstream S3 p99 ratio.
    pub max_s3: f64,
    /// Lowest acceptable konn/upstream S4 dials/s ratio.
    pub min_s4: f64,
}

/// The quick check's verdict for `contender`: one line per check, and
/// whether all passed. A check without data fails (a regression that
/// breaks the tunnel must not pass).
pub fn quick_verdict(cells: &[Cell], contender: &str, m: Margins) -> (Vec<String>, bool) {
    let mut lines = Vec::new();
    let mut ok = true;
    let mut check = |scenario: &str, metric: &str, pass: &dyn Fn(f64) -> bool, want: String| {
        let r = cells
            .iter()
            .find(|c| c.scenario == scenario)
            .map(|c| c.ratios(contender, metric))
            .unwrap_or_default();
        let med = median(&r);
        let good = med.is_finite() && pass(med);
        ok &= good;
        lines.push(format!(
            "{} {scenario} {metric}: {contender}/{UPSTREAM} = {} (pairs {:?}; want {want})",
            if good { "PASS" } else { "FAIL" },
            if med.is_finite() {
                format!("{med:.2}")
            } else {
                "no data".into()
            },
            r.iter()
                .map(|x| (x * 100.0).round() / 100.0)
                .collect::<Vec<_>>(),
        ));
    };
    check("S1", "MB/s", &|x| x >= m.min_s1, format!("≥ {}", m.min_s1));
    // Raw p99 rather than added p99: the added value can be near zero or
    // negative for both, which makes its ratio meaningless.
    check(
        "S3",
        "p99 µs",
        &|x| x <= m.max_s3,
        format!("≤ {}", m.max_s3),
    );
    check(
        "S4",
        "dials/s",
        &|x| x >= m.min_s4,
        format!("≥ {}", m.min_s4),
    );
    (lines, ok)
}

/// Paths of the outputs under `dir`: JSON, markdown, and an SVG per
/// scenario.
pub fn write_outputs(
    dir: &Path,
    cells: &[Cell],
    meta: serde_json::Value,
) -> Result<Vec<PathBuf>, Error> {
    use super::report::{cell_json, markdown, svg_chart};
    std::fs::create_dir_all(dir).map_err(|e| Error::Write(dir.to_owned(), e))?;
    let mut written = Vec::new();
    let mut write = |name: &str, text: String| -> Result<(), Error> {
        let p = dir.join(name);
        std::fs::write(&p, text).map_err(|e| Error::Write(p.clone(), e))?;
        written.push(p);
        Ok(())
    };
    let json = serde_json::json!({
        "meta": meta,
        "cells": cells.iter().map(cell_json).collect::<Vec<_>>(),
    });
    write(
        "results.json",
        serde_json::to_string_pretty(&json).unwrap_or_default() + "\n",
    )?;
    let mut md = String::from(
        "<!-- generated by `konn-bench compare`; values: median (min–max) over the repetitions; ratios: median (min–max) of the per-repetition konn/upstream ratios -->\n\n",
    );
    md.push_str(&markdown(cells));
    let notes: Vec<String> = cells
        .iter()
        .flat_map(|c| {
            c.notes
                .iter()
                .map(move |n| format!("- {} {}: {n}", c.scenario, c.case))
        })
        .collect();
    if !notes.is_empty() {
        md.push_str("\nNotes:\n\n");
        md.push_str(&notes.join("\n"));
        md.push('\n');
    }
    write("results.md", md)?;
    let mut scenarios: Vec<&str> = cells.iter().map(|c| c.scenario.as_str()).collect();
    scenarios.dedup();
    for s in scenarios {
        let these: Vec<&Cell> = cells.iter().filter(|c| c.scenario == s).collect();
        write(
            &format!("{}.svg", s.to_lowercase()),
            svg_chart(&format!("konn-bench compare: {s}"), &these),
        )?;
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cell(scenario: &str, metric: &str, up: &[f64], konn: &[f64]) -> Cell {
        let reps = |v: &[f64]| {
            v.iter()
                .map(|x| std::iter::once((metric.to_owned(), *x)).collect())
                .collect()
        };
        Cell {
            scenario: scenario.into(),
            impls: vec![
                ImplSamples {
                    name: UPSTREAM.into(),
                    reps: reps(up),
                },
                ImplSamples {
                    name: "konn".into(),
                    reps: reps(konn),
                },
            ],
            ..Cell::default()
        }
    }

    const M: Margins = Margins {
        min_s1: 1.0,
        max_s3: 2.0,
        min_s4: 1.0,
    };

    #[test]
    fn quick_check_passes_a_faster_konn() {
        let cells = [
            cell("S1", "MB/s", &[100.0, 120.0, 90.0], &[400.0, 100.0, 300.0]),
            cell(
                "S3",
                "p99 µs",
                &[500.0, 400.0, 450.0],
                &[300.0, 900.0, 400.0],
            ),
            cell("S4", "dials/s", &[100.0; 3], &[250.0, 90.0, 300.0]),
        ];
        let (lines, ok) = quick_verdict(&cells, "konn", M);
        assert!(ok, "{lines:?}");
        assert_eq!(lines.len(), 3);
        assert!(lines[0].starts_with("PASS S1"), "{}", lines[0]);
    }

    #[test]
    fn quick_check_fails_slower_throughput_worse_latency_or_missing_data() {
        let slow = [
            cell("S1", "MB/s", &[100.0, 100.0, 100.0], &[90.0, 95.0, 120.0]),
            cell("S3", "p99 µs", &[500.0; 3], &[500.0; 3]),
            cell("S4", "dials/s", &[100.0; 3], &[300.0; 3]),
        ];
        let (lines, ok) = quick_verdict(&slow, "konn", M);
        assert!(!ok && lines[0].starts_with("FAIL S1"), "{lines:?}");
        let laggy = [
            cell("S1", "MB/s", &[100.0; 3], &[400.0; 3]),
            cell("S3", "p99 µs", &[100.0; 3], &[250.0, 150.0, 300.0]),
            cell("S4", "dials/s", &[100.0; 3], &[300.0; 3]),
        ];
        let (lines, ok) = quick_verdict(&laggy, "konn", M);
        assert!(!ok && lines[1].starts_with("FAIL S3"), "{lines:?}");
        let dull = [
            cell("S1", "MB/s", &[100.0; 3], &[400.0; 3]),
            cell("S3", "p99 µs", &[100.0; 3], &[100.0; 3]),
            cell("S4", "dials/s", &[100.0; 3], &[80.0, 120.0, 90.0]),
        ];
        let (lines, ok) = quick_verdict(&dull, "konn", M);
        assert!(!ok && lines[2].starts_with("FAIL S4"), "{lines:?}");
        // konn failed every repetition: no data is a failure.
        let broken = [cell("S1", "MB/s", &[100.0; 3], &[])];
        let (lines, ok) = quick_verdict(&broken, "konn", M);
        assert!(
            !ok && lines.iter().all(|l| l.starts_with("FAIL")),
            "{lines:?}"
        );
    }
}
