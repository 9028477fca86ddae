//! S11: the reverse direction (KEP-2025, `docs/NODE-TO-CONTROL-PLANE.md`)
//! against the direct baseline and the forward direction, on one konn
//! topology: the agent has a `--target` listener for every destination
//! (echo addresses, bulk source) and the server allows each of them, so the
//! same workloads run three ways — direct TCP, forward (a gRPC frontend
//! dialling through the agent), reverse (TCP to the agent's listener,
//! dialled by the server). Throughput of one and of 8 downloads, added
//! latency of an open-loop ping, and the rate of short connections.
//!
//! In the reverse route the client's TCP connect completes at the agent's
//! listener before the server has dialled, so its "dial" latency is only
//! the local connect; compare the loops' rates (dials/s), which include the
//! whole round trip.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::Path;
use std::rc::Rc;

use konn_testkit::Error;
use konn_testkit::pki::PkiFiles;

use super::dests::Dests;
use super::load::Route;
use super::report::Sample;
use super::scenarios::{self, Direction, Target, Window};
use super::{Binaries, Mode, Topology};

/// The routes, in report order.
pub const ROUTES: [&str; 3] = ["direct", "forward", "reverse"];

/// One workload of S11.
#[derive(Clone, Copy)]
enum Work {
    /// Downloads from the bulk source, this many at once.
    Download(usize),
    /// The open-loop ping (16 connections × 64 B at 1000 msg/s).
    Ping,
    /// Short connections (8 loops, 1 KiB echo each).
    Dials,
}

struct Case {
    name: &'static str,
    work: Work,
    /// The sample keys shown, in order.
    keys: &'static [&'static str],
}

fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "download, 1 stream",
            work: Work::Download(1),
            keys: &["MB/s", "CPU s/GB"],
        },
        Case {
            name: "download, 8 streams",
            work: Work::Download(8),
            keys: &["MB/s", "CPU s/GB"],
        },
        Case {
            name: "open loop 16 conn × 64 B at 1000 msg/s",
            work: Work::Ping,
            keys: &["p50 µs", "p99 µs", "CPU µs/msg", "timeouts"],
        },
        Case {
            name: "short connections, 8 loops, 1 KiB echo",
            work: Work::Dials,
            keys: &["dials/s", "CPU µs/dial", "failed dials"],
        },
    ]
}

async fn run_work(t: &Target<'_>, work: Work, w: Window) -> Result<Sample, Error> {
    match work {
        Work::Download(n) => scenarios::bulk(t, Direction::Download, n, w).await,
        Work::Ping => scenarios::ping(t, 16, 64, Some(1000.0), w).await,
        Work::Dials => scenarios::dial_churn(t, 8, w).await,
    }
}

/// One case's results.
pub struct Row {
    /// The case.
    pub case: &'static str,
    /// The sample keys shown, in order.
    pub keys: &'static [&'static str],
    /// Per route (in [`ROUTES`] order), the samples of every repetition.
    pub samples: Vec<Vec<Sample>>,
}

/// The results of S11.
pub struct Results {
    /// One row per case.
    pub rows: Vec<Row>,
}

/// The `--target`s, `--allowed-destination`s and the route map for
/// `dests`: one local port per destination, from `base`.
fn reverse_flags(
    dests: &Dests,
    base: u16,
) -> (Vec<String>, Vec<String>, HashMap<SocketAddr, SocketAddr>) {
    // Limits raised to measure capacity, not the defaults' protection
    // (100 new dials per second per agent).
    let mut server = vec![
        "--reverse-dial-rate=1000000".to_owned(),
        "--reverse-max-per-agent=100000".to_owned(),
    ];
    let mut agent = vec!["--bind-address=127.0.0.1".to_owned()];
    let mut map = HashMap::new();
    for (i, d) in dests.echo.iter().chain([&dests.source]).enumerate() {
        let port = base + i as u16;
        server.push(format!("--allowed-destination={d}"));
        agent.push(format!("--target={port}:{d}"));
        map.insert(*d, SocketAddr::from(([127, 0, 0, 1], port)));
    }
    (server, agent, map)
}

/// Run S11 with `bins` (konn's) in `dir`, `reps` times each, interleaving
/// the routes per repetition. `window` is each workload's window; the
/// server and agent run on `cpus`.
pub async fn run(
    bins: &Binaries,
    dir: &Path,
    certs: &PkiFiles,
    reps: usize,
    window: Window,
    cpus: Option<&[usize]>,
) -> Result<Results, Error> {
    let dests = Dests::start().map_err(|e| Error::Socket(format!("destinations: {e}")))?;
    let base = konn_testkit::ports::free_port()
        .saturating_sub(16)
        .max(20_000);
    let (server_flags, agent_flags, map) = reverse_flags(&dests, base);
    let mut bins = bins.clone();
    bins.server_flags.extend(server_flags);
    bins.agent_flags.extend(agent_flags);
    let topo = Topology::start(&bins, Mode::Grpc, dir, certs, cpus)?;
    let pids = Some((topo.server.pid(), topo.agent.pid()));
    let targets = [
        Target {
            route: Route::Direct,
            pids: None,
            dests: &dests,
        },
        Target {
            route: topo.route(),
            pids,
            dests: &dests,
        },
        Target {
            route: Route::Reverse(Rc::new(map)),
            pids,
            dests: &dests,
        },
    ];
    let mut rows = Vec::new();
    for case in cases() {
        let mut per_route = vec![Vec::new(); ROUTES.len()];
        for rep in 0..reps {
            for (i, t) in targets.iter().enumerate() {
                let s = run_work(t, case.work, window).await?;
                eprintln!("  S11 {:<40} {:<8} rep {rep}: {s:?}", case.name, ROUTES[i]);
                per_route[i].push(s);
            }
        }
        rows.push(Row {
            case: case.name,
            keys: case.keys,
            samples: per_route,
        });
    }
    if !topo.stop(std::time::Duration::from_secs(5)) {
        eprintln!("  S11: a process did not stop on SIGTERM (killed)");
    }
    Ok(Results { rows })
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    v.retain(|x| x.is_finite());
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    Some(v[v.len() / 2])
}

impl Results {
    /// A markdown table: one row per case and key, one column per route
    /// (medians over the repetitions), and reverse ÷ forward.
    pub fn markdown(&self) -> String {
        let mut out = String::from(
            "| S11 case | value | direct | forward | reverse | reverse ÷ forward |\n|---|---|---|---|---|---|\n",
        );
        for Row {
            case,
            keys,
            samples: per_route,
        } in &self.rows
        {
            for key in *keys {
                let m: Vec<Option<f64>> = per_route
                    .iter()
                    .map(|reps| median(reps.iter().filter_map(|s| s.get(*key).copied()).collect()))
                    .collect();
                let cell = |v: Option<f64>| v.map_or_else(|| "–".to_owned(), |x| format!("{x:.1}"));
                let ratio = match (m[1], m[2]) {
                    (Some(f), Some(r)) if f != 0.0 => format!("{:.2}", r / f),
                    _ => "–".to_owned(),
                };
                let _ = writeln!(
                    out,
                    "| {case} | {key} | {} | {} | {} | {ratio} |",
                    cell(m[0]),
                    cell(m[1]),
                    cell(m[2])
                );
            }
        }
        out
    }
}
