//! `konn-bench guards`: the cost of issue 17's guards — the dial audit log,
//! every admission limit, the overload manager, per-destination metrics
//! and the agent's allow-list — measured as the issue asks: S1 and S4 with
//! all of it on against all of it off, same binaries, same run,
//! interleaved by repetition ([`compare::run`](super::compare::run) with
//! the two as its implementations), reported as paired ratios with the
//! 5 % verdict.
//!
//! The limits are set high enough never to refuse (every dial still goes
//! through every check: concurrency counters and rate buckets of every
//! class, the frontend's identity, the watermark), the audit log writes a
//! record per connection to a file (rotated, bounded), and the agent dials
//! through its allow-list (resolve once, check, connect).

use std::fmt::Write as _;
use std::path::Path;

use super::Binaries;
use super::report::Cell;
use super::stats::{paired_ratios, spread};

/// Name of the run with every guard on.
pub const GUARDED: &str = "konn-guarded";

/// Name of the run with every guard off (konn's defaults).
pub const PLAIN: &str = "konn-off";

/// A limit no benchmark reaches: the checks run, nothing is refused.
const NEVER: u32 = 1_000_000;

/// `base` with every guard on; the audit log goes to `dir`.
pub fn guarded(base: &Binaries, dir: &Path) -> Binaries {
    let mut b = base.clone();
    b.name = GUARDED.to_owned();
    for class in ["agent", "destination", "frontend", "cluster"] {
        b.server_flags
            .push(format!("--max-{class}-connections={NEVER}"));
        b.server_flags
            .push(format!("--max-{class}-dial-rate={NEVER}"));
    }
    b.server_flags.extend([
        "--overload-memory-watermark=0.9".to_owned(),
        format!("--audit-log-path={}", dir.join("audit.log").display()),
        "--audit-log-maxsize=64".to_owned(),
        "--audit-log-maxbackup=1".to_owned(),
        "--metrics-per-destination-limit=100".to_owned(),
    ]);
    b.agent_flags
        .push("--allowed-destination-cidrs=127.0.0.0/8,::1/128".to_owned());
    b
}

/// The metrics compared, per scenario: (metric, whether it is a
/// throughput the 5 % criterion applies to).
fn metrics(scenario: &str) -> &'static [(&'static str, bool)] {
    match scenario {
        "S1" | "S2" => &[
            ("MB/s", true),
            ("CPU s/GB", false),
            ("server CPU s/GB", false),
            ("agent CPU s/GB", false),
        ],
        "S4" => &[
            ("dials/s", true),
            ("dial p99 µs", false),
            ("server CPU µs/dial", false),
            ("agent CPU µs/dial", false),
        ],
        _ => &[],
    }
}

/// The markdown table of `cells` (guarded against plain), and whether
/// every throughput's median paired ratio is at least `1 - tolerance`.
pub fn report(cells: &[Cell], tolerance: f64) -> (String, bool) {
    let mut out = String::from(
        "| cell | metric | off (median, min–max) | guarded (median, min–max) | guarded / off (median, min–max) | |\n\
         |---|---|---:|---:|---:|---|\n",
    );
    let mut ok = true;
    let fmt = |v: &[f64]| {
        let (m, lo, hi) = spread(v);
        format!("{m:.1} ({lo:.1}–{hi:.1})")
    };
    for cell in cells {
        for &(metric, throughput) in metrics(&cell.scenario) {
            let off = cell.values(PLAIN, metric);
            let on = cell.values(GUARDED, metric);
            let ratios = paired_ratios(&on, &off);
            let (r, lo, hi) = spread(&ratios);
            let verdict = if !throughput {
                ""
            } else if r.is_finite() && r >= 1.0 - tolerance {
                "within"
            } else {
                ok = false;
                "**below**"
            };
            let _ = writeln!(
                out,
                "| {} {} | {metric} | {} | {} | {r:.3} ({lo:.3}–{hi:.3}) | {verdict} |",
                cell.scenario,
                cell.case,
                fmt(&off),
                fmt(&on),
            );
        }
    }
    if cells.iter().all(|c| metrics(&c.scenario).is_empty()) {
        ok = false;
    }
    (out, ok)
}

/// The 1-minute load average now (`/proc/loadavg`), for the record.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().map(str::to_owned))
        .unwrap_or_else(|| "?".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::report::{ImplSamples, Sample};

    fn cell(scenario: &str, metric: &str, off: &[f64], on: &[f64]) -> Cell {
        let reps = |v: &[f64]| -> Vec<Sample> {
            v.iter()
                .map(|x| Sample::from([(metric.to_owned(), *x)]))
                .collect()
        };
        Cell {
            scenario: scenario.into(),
            case: "c".into(),
            impls: vec![
                ImplSamples {
                    name: PLAIN.into(),
                    reps: reps(off),
                },
                ImplSamples {
                    name: GUARDED.into(),
                    reps: reps(on),
                },
            ],
            ..Cell::default()
        }
    }

    #[test]
    fn the_verdict_uses_paired_ratios_of_throughputs() {
        // Noisy repetitions that move together: within 5 %.
        let s1 = cell("S1", "MB/s", &[100.0, 200.0, 150.0], &[98.0, 197.0, 149.0]);
        let (table, ok) = report(&[s1], 0.05);
        assert!(ok, "{table}");
        assert!(
            table.contains("| S1 c | MB/s | 150.0 (100.0–200.0) |"),
            "{table}"
        );
        assert!(table.contains("within"));
        // 8 % fewer dials per second: below.
        let s4 = cell(
            "S4",
            "dials/s",
            &[1000.0, 1000.0, 1000.0],
            &[920.0, 920.0, 920.0],
        );
        let (table, ok) = report(&[s4], 0.05);
        assert!(!ok && table.contains("**below**"), "{table}");
        // No data at all is no pass.
        let (_, ok) = report(&[], 0.05);
        assert!(!ok);
        let missing = cell("S4", "dials/s", &[], &[]);
        assert!(!report(&[missing], 0.05).1);
    }

    #[test]
    fn every_guard_is_switched_on() {
        let base = Binaries::in_dir("konn", Path::new("/bin"));
        let g = guarded(&base, Path::new("/tmp/x"));
        assert_eq!(g.name, GUARDED);
        let flags = g.server_flags.join(" ");
        for f in [
            "--max-agent-connections=",
            "--max-agent-dial-rate=",
            "--max-destination-connections=",
            "--max-destination-dial-rate=",
            "--max-frontend-connections=",
            "--max-frontend-dial-rate=",
            "--max-cluster-connections=",
            "--max-cluster-dial-rate=",
            "--overload-memory-watermark=",
            "--audit-log-path=/tmp/x/audit.log",
            "--metrics-per-destination-limit=",
        ] {
            assert!(flags.contains(f), "{f} missing: {flags}");
        }
        assert!(g.agent_flags[0].starts_with("--allowed-destination-cidrs="));
    }
}
