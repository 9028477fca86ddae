//! `konn-bench soak`: konn under mixed load for a long time, with restarts.
//! One server and one agent (a [`Topology`], gRPC frontend) carry the
//! benchmark plan's workloads in turn — S1 (bulk download, 4 streams), S3
//! (open-loop ping, 16 connections, 1 KiB at 2000 messages/s) and S4 (dial
//! churn, 4 dialers), a few seconds each — for the whole run; every
//! `restart_every` the agent, then next time the server, is SIGKILLed and
//! started again. A thread of its own samples both processes every second:
//! resident memory, descriptors and threads.
//!
//! The report says whether the run held: every workload run succeeded, and
//! after the warm-up the processes' resident memory and descriptors did not
//! grow (the last tenth of the run against the first tenth after the first
//! restart: the server and the agent started afresh at each restart, so each
//! sample is compared with samples of the same process age). [`svg`] plots
//! the samples with the restarts marked.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use konn_core::io::clock::now;
use konn_core::io::runtime::{Engine, block_on};
use konn_testkit::Error;
use konn_testkit::pki::PkiFiles;

use super::dests::Dests;
use super::scenarios::{self, Direction, Target, Window};
use super::{Binaries, Mode, Topology, fd_count, rss_kib, thread_count};

/// What to run.
#[derive(Clone, Debug)]
pub struct Config {
    /// The run's length.
    pub duration: Duration,
    /// Restart the agent, then the server, in turn, this often.
    pub restart_every: Duration,
    /// konn's binaries.
    pub konn: Binaries,
}

/// One second's sample of both processes.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Point {
    /// Seconds since the start.
    pub t: f64,
    /// Server resident memory, KiB.
    pub server_kib: u64,
    /// Agent resident memory, KiB.
    pub agent_kib: u64,
    /// Server descriptors.
    pub server_fds: u64,
    /// Agent descriptors.
    pub agent_fds: u64,
    /// Server threads.
    pub server_threads: u64,
    /// Agent threads.
    pub agent_threads: u64,
}

/// One workload run.
#[derive(Clone, Debug)]
pub struct Run {
    /// Seconds since the start.
    pub t: f64,
    /// `S1`, `S3` or `S4`.
    pub scenario: &'static str,
    /// Its headline figure (MB/s, p99 µs, dials/s), or the error.
    pub result: Result<f64, String>,
}

/// Everything a soak measured.
#[derive(Clone, Debug, Default)]
pub struct Report {
    /// The samples.
    pub points: Vec<Point>,
    /// The workload runs.
    pub runs: Vec<Run>,
    /// When each restart happened, and of what.
    pub restarts: Vec<(f64, &'static str)>,
}

/// The pids the sampler watches (updated at restarts).
#[derive(Default)]
struct Pids {
    server: AtomicU32,
    agent: AtomicU32,
    stop: AtomicBool,
}

fn sampler(pids: Arc<Pids>) -> std::thread::JoinHandle<Vec<Point>> {
    std::thread::spawn(move || {
        let start = now();
        let mut out = Vec::new();
        let mut next = start;
        while !pids.stop.load(Ordering::Acquire) {
            let (s, a) = (
                pids.server.load(Ordering::Acquire),
                pids.agent.load(Ordering::Acquire),
            );
            out.push(Point {
                t: (now() - start).as_secs_f64(),
                server_kib: rss_kib(s).unwrap_or(0),
                agent_kib: rss_kib(a).unwrap_or(0),
                server_fds: fd_count(s).unwrap_or(0),
                agent_fds: fd_count(a).unwrap_or(0),
                server_threads: thread_count(s).unwrap_or(0),
                agent_threads: thread_count(a).unwrap_or(0),
            });
            next += Duration::from_secs(1);
            std::thread::sleep(next.saturating_duration_since(now()));
        }
        out
    })
}

const WINDOW: Window = Window {
    warm: Duration::from_secs(1),
    secs: Duration::from_secs(4),
};

/// Runs the soak.
///
/// # Errors
/// The topology does not start, or does not come back after a restart.
pub fn run(cfg: &Config, dir: &Path, pki: &PkiFiles) -> Result<Report, Error> {
    let mut topo = Topology::start(&cfg.konn, Mode::Grpc, dir, pki, None)?;
    let pids = Arc::new(Pids::default());
    let publish = |t: &Topology| {
        pids.server.store(t.server.pid(), Ordering::Release);
        pids.agent.store(t.agent.pid(), Ordering::Release);
    };
    publish(&topo);
    let samples = sampler(pids.clone());
    let mut report = Report::default();
    let outcome = block_on(Engine::Epoll, async {
        let dests = Dests::start().map_err(|e| Error::Closed(format!("destinations: {e}")))?;
        let start = now();
        let mut next_restart = cfg.restart_every;
        let mut agent_next = true;
        while now() - start < cfg.duration {
            for scenario in ["S1", "S3", "S4"] {
                let t = Target {
                    route: topo.route(),
                    pids: Some((topo.server.pid(), topo.agent.pid())),
                    dests: &dests,
                };
                let at = (now() - start).as_secs_f64();
                let r = match scenario {
                    "S1" => scenarios::bulk(&t, Direction::Download, 4, WINDOW)
                        .await
                        .map(|s| s.get("MB/s").copied().unwrap_or(0.0)),
                    "S3" => scenarios::ping(&t, 16, 1024, Some(2000.0), WINDOW)
                        .await
                        .map(|s| s.get("p99 µs").copied().unwrap_or(0.0)),
                    _ => scenarios::dial_churn(&t, 4, WINDOW)
                        .await
                        .map(|s| s.get("dials/s").copied().unwrap_or(0.0)),
                };
                report.runs.push(Run {
                    t: at,
                    scenario,
                    result: r.map_err(|e| e.to_string()),
                });
            }
            if now() - start >= next_restart {
                let what = if agent_next {
                    topo.restart_agent()?;
                    "agent"
                } else {
                    topo.restart_server()?;
                    "server"
                };
                topo.settle()?;
                publish(&topo);
                report.restarts.push(((now() - start).as_secs_f64(), what));
                agent_next = !agent_next;
                next_restart += cfg.restart_every;
            }
        }
        Ok::<(), Error>(())
    });
    pids.stop.store(true, Ordering::Release);
    report.points = samples.join().unwrap_or_default();
    topo.stop(Duration::from_secs(5));
    outcome.map_err(|e| Error::Closed(e.to_string()))??;
    Ok(report)
}

/// Medians of `f` over the points in `[from, to)` seconds.
fn median_in(points: &[Point], from: f64, to: f64, f: impl Fn(&Point) -> u64) -> Option<u64> {
    let mut v: Vec<u64> = points
        .iter()
        .filter(|p| p.t >= from && p.t < to)
        .map(f)
        .collect();
    v.sort_unstable();
    v.get(v.len() / 2).copied()
}

/// Whether the run held, and why not.
pub fn verdict(r: &Report) -> Result<(), String> {
    let failed: Vec<String> = r
        .runs
        .iter()
        .filter_map(|run| {
            run.result
                .as_ref()
                .err()
                .map(|e| format!("{} at {:.0} s: {e}", run.scenario, run.t))
        })
        .collect();
    if !failed.is_empty() {
        return Err(format!(
            "{} workload runs failed: {}",
            failed.len(),
            failed.join("; ")
        ));
    }
    let end = r.points.last().map_or(0.0, |p| p.t);
    let first_restart = r.restarts.first().map_or(0.0, |x| x.0);
    let tenth = (end - first_restart) / 10.0;
    if tenth < 5.0 {
        return Ok(()); // too short to judge drift
    }
    let early = (first_restart + 2.0, first_restart + 2.0 + tenth);
    let late = (end - tenth, end + 1.0);
    type Field = fn(&Point) -> u64;
    let checks: [(&str, Field, u64); 4] = [
        ("server RSS (KiB)", |p| p.server_kib, 8 * 1024),
        ("agent RSS (KiB)", |p| p.agent_kib, 8 * 1024),
        ("server descriptors", |p| p.server_fds, 8),
        ("agent descriptors", |p| p.agent_fds, 8),
    ];
    for (what, f, slack) in checks {
        let (Some(a), Some(b)) = (
            median_in(&r.points, early.0, early.1, f),
            median_in(&r.points, late.0, late.1, f),
        ) else {
            continue;
        };
        if b > a + a / 5 + slack {
            return Err(format!(
                "{what} grew from a median of {a} early to {b} late in the run"
            ));
        }
    }
    Ok(())
}

/// A markdown summary: each workload's runs (median, worst), restarts,
/// and the memory and descriptors of both processes over the run.
pub fn markdown(r: &Report) -> String {
    let mut s =
        String::from("| workload | runs | failed | median | worst |\n|---|---:|---:|---:|---:|\n");
    for (sc, unit, lower_better) in [
        ("S1", "MB/s", false),
        ("S3", "p99 µs", true),
        ("S4", "dials/s", false),
    ] {
        let mut v: Vec<f64> = r
            .runs
            .iter()
            .filter(|x| x.scenario == sc)
            .filter_map(|x| x.result.as_ref().ok().copied())
            .collect();
        let failed = r
            .runs
            .iter()
            .filter(|x| x.scenario == sc && x.result.is_err())
            .count();
        v.sort_by(f64::total_cmp);
        let median = v.get(v.len() / 2).copied().unwrap_or(0.0);
        let worst = if lower_better { v.last() } else { v.first() }
            .copied()
            .unwrap_or(0.0);
        s.push_str(&format!(
            "| {sc} | {} | {failed} | {median:.0} {unit} | {worst:.0} {unit} |\n",
            v.len() + failed
        ));
    }
    let max = |f: fn(&Point) -> u64| r.points.iter().map(f).max().unwrap_or(0);
    s.push_str(&format!(
        "\n{} samples over {:.0} s; {} restarts ({} agent, {} server); peak RSS server {:.1} MiB, agent {:.1} MiB; \
         peak descriptors server {}, agent {}; peak threads server {}, agent {}\n",
        r.points.len(),
        r.points.last().map_or(0.0, |p| p.t),
        r.restarts.len(),
        r.restarts.iter().filter(|x| x.1 == "agent").count(),
        r.restarts.iter().filter(|x| x.1 == "server").count(),
        max(|p| p.server_kib) as f64 / 1024.0,
        max(|p| p.agent_kib) as f64 / 1024.0,
        max(|p| p.server_fds),
        max(|p| p.agent_fds),
        max(|p| p.server_threads),
        max(|p| p.agent_threads),
    ));
    s
}

/// Two panels, resident memory (MiB) and descriptors, server and agent
/// over time, with a dashed line at every restart.
pub fn svg(r: &Report) -> String {
    let (w, h, pad) = (900.0, 220.0, 40.0);
    let end = r.points.last().map_or(1.0, |p| p.t.max(1.0));
    let x = |t: f64| pad + t / end * (w - 2.0 * pad);
    let mut out = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{}\" font-family=\"sans-serif\" font-size=\"11\">\n",
        2.0 * h + 20.0
    );
    type Series = (&'static str, &'static str, fn(&Point) -> f64);
    let panels: [(&str, [Series; 2]); 2] = [
        (
            "resident memory (MiB)",
            [
                ("server", "#1f77b4", |p| p.server_kib as f64 / 1024.0),
                ("agent", "#ff7f0e", |p| p.agent_kib as f64 / 1024.0),
            ],
        ),
        (
            "descriptors",
            [
                ("server", "#1f77b4", |p| p.server_fds as f64),
                ("agent", "#ff7f0e", |p| p.agent_fds as f64),
            ],
        ),
    ];
    for (i, (title, series)) in panels.iter().enumerate() {
        let top = i as f64 * (h + 10.0) + 10.0;
        let ymax = r
            .points
            .iter()
            .flat_map(|p| series.iter().map(move |s| (s.2)(p)))
            .fold(1.0f64, f64::max)
            * 1.1;
        let y = |v: f64| top + h - pad / 2.0 - v / ymax * (h - pad);
        out.push_str(&format!(
            "<text x=\"{pad}\" y=\"{}\">{title} — max {ymax:.0}; x: {end:.0} s</text>\n",
            top + 12.0
        ));
        out.push_str(&format!(
            "<line x1=\"{pad}\" y1=\"{0}\" x2=\"{1}\" y2=\"{0}\" stroke=\"#999\"/>\n",
            y(0.0),
            w - pad
        ));
        for (t, what) in &r.restarts {
            out.push_str(&format!(
                "<line x1=\"{0:.1}\" y1=\"{1:.1}\" x2=\"{0:.1}\" y2=\"{2:.1}\" stroke=\"#bbb\" stroke-dasharray=\"3,3\"><title>{what} restart</title></line>\n",
                x(*t),
                y(ymax),
                y(0.0)
            ));
        }
        for (k, (name, colour, f)) in series.iter().enumerate() {
            let pts: Vec<String> = r
                .points
                .iter()
                .map(|p| format!("{:.1},{:.1}", x(p.t), y(f(p))))
                .collect();
            out.push_str(&format!(
                "<polyline fill=\"none\" stroke=\"{colour}\" stroke-width=\"1.2\" points=\"{}\"/>\n",
                pts.join(" ")
            ));
            out.push_str(&format!(
                "<text x=\"{}\" y=\"{}\" fill=\"{colour}\">{name}</text>\n",
                w - pad - 60.0 + k as f64 * 35.0,
                top + 12.0
            ));
        }
    }
    out.push_str("</svg>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(late_server_kib: u64) -> Report {
        let points = (0..200)
            .map(|i| Point {
                t: f64::from(i),
                server_kib: if i > 180 { late_server_kib } else { 20_000 },
                agent_kib: 5_000,
                server_fds: 30,
                agent_fds: 20,
                server_threads: 3,
                agent_threads: 3,
            })
            .collect();
        Report {
            points,
            runs: vec![Run {
                t: 1.0,
                scenario: "S1",
                result: Ok(500.0),
            }],
            restarts: vec![(10.0, "agent"), (100.0, "server")],
        }
    }

    #[test]
    fn a_flat_run_holds_and_a_growing_one_does_not() {
        assert_eq!(verdict(&report(20_500)), Ok(()));
        let e = verdict(&report(60_000)).unwrap_err();
        assert!(e.contains("server RSS"), "{e}");
    }

    #[test]
    fn a_failed_run_fails_the_soak() {
        let mut r = report(20_000);
        r.runs.push(Run {
            t: 50.0,
            scenario: "S4",
            result: Err("dial timed out".into()),
        });
        assert!(verdict(&r).unwrap_err().contains("S4 at 50 s"));
    }

    #[test]
    fn svg_and_table_render() {
        let r = report(20_000);
        let svg = svg(&r);
        assert!(svg.starts_with("<svg") && svg.contains("polyline"));
        assert_eq!(svg.matches("stroke-dasharray").count(), 4);
        let md = markdown(&r);
        assert!(md.contains("| S1 | 1 | 0 | 500 MB/s | 500 MB/s |"), "{md}");
        assert!(md.contains("2 restarts (1 agent, 1 server)"), "{md}");
    }
}
