//! Results of a harness run and their presentation: derived metrics
//! (% of direct, added latency), ratios paired by repetition, JSON, a
//! markdown table and simple SVG bar charts (no plotting dependency).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde_json::{Value, json};

use super::stats::{paired_ratios, spread};

/// Name of the no-proxy baseline among the implementations.
pub const DIRECT: &str = "direct";

/// Name of the implementation the others are compared with.
pub const UPSTREAM: &str = "upstream";

/// One repetition's measurements: metric name → value.
pub type Sample = BTreeMap<String, f64>;

/// All repetitions of one implementation in one cell.
#[derive(Clone, Debug, Default)]
pub struct ImplSamples {
    /// Implementation name (`direct`, `upstream`, `konn-epoll`, …).
    pub name: String,
    /// One sample per repetition, in repetition order (pairing relies on
    /// it; a failed repetition is an empty sample).
    pub reps: Vec<Sample>,
}

/// One scenario cell: the same workload run for every implementation.
#[derive(Clone, Debug, Default)]
pub struct Cell {
    /// Scenario id (`S1` … `S8`).
    pub scenario: String,
    /// The case within the scenario (`download 1 × 2048 MiB`).
    pub case: String,
    /// Metrics shown in the markdown table, in order.
    pub headline: Vec<String>,
    /// The metric of the bar chart, if any.
    pub plot: Option<String>,
    /// Per implementation, in the order of the run.
    pub impls: Vec<ImplSamples>,
    /// Free-text remarks (errors, timeouts) for the report.
    pub notes: Vec<String>,
}

/// Whether a larger value of `metric` is better (throughputs and rates).
pub fn higher_is_better(metric: &str) -> bool {
    metric.ends_with("/s") || metric == "% of direct"
}

/// Latency metrics whose "added" variant (tunnel − direct) is derived.
const LATENCIES: [&str; 3] = ["p50 µs", "p99 µs", "p99.9 µs"];

impl Cell {
    /// The samples of implementation `name`.
    pub fn get(&self, name: &str) -> Option<&ImplSamples> {
        self.impls.iter().find(|i| i.name == name)
    }

    /// Values of `metric` for `name`, one per repetition (`NaN` where
    /// missing).
    pub fn values(&self, name: &str, metric: &str) -> Vec<f64> {
        self.get(name).map_or_else(Vec::new, |i| {
            i.reps
                .iter()
                .map(|r| r.get(metric).copied().unwrap_or(f64::NAN))
                .collect()
        })
    }

    /// Add the derived metrics to every non-direct implementation: `% of
    /// direct` for `MB/s`, and `added pXX µs` (tunnel minus direct, same
    /// repetition) for the latency percentiles.
    pub fn derive(&mut self) {
        let Some(direct) = self.get(DIRECT).cloned() else {
            return;
        };
        for imp in self.impls.iter_mut().filter(|i| i.name != DIRECT) {
            for (r, sample) in imp.reps.iter_mut().enumerate() {
                let Some(base) = direct.reps.get(r) else {
                    continue;
                };
                if let (Some(v), Some(d)) = (sample.get("MB/s"), base.get("MB/s"))
                    && *d > 0.0
                {
                    let pct = 100.0 * v / d;
                    sample.insert("% of direct".into(), pct);
                }
                for l in LATENCIES {
                    if let (Some(v), Some(d)) = (sample.get(l), base.get(l)) {
                        let added = v - d;
                        sample.insert(format!("added {l}"), added);
                    }
                }
            }
        }
    }

    /// Ratios `name / upstream` of `metric`, paired by repetition.
    pub fn ratios(&self, name: &str, metric: &str) -> Vec<f64> {
        paired_ratios(&self.values(name, metric), &self.values(UPSTREAM, metric))
    }

    /// Every metric any implementation reported, sorted.
    pub fn metrics(&self) -> Vec<String> {
        let mut m: Vec<String> = self
            .impls
            .iter()
            .flat_map(|i| i.reps.iter().flat_map(|r| r.keys().cloned()))
            .collect();
        m.sort();
        m.dedup();
        m
    }

    /// Names of the implementations compared with upstream.
    pub fn contenders(&self) -> Vec<&str> {
        self.impls
            .iter()
            .map(|i| i.name.as_str())
            .filter(|n| *n != DIRECT && *n != UPSTREAM)
            .collect()
    }
}

fn num(x: f64) -> Value {
    if x.is_finite() {
        json!((x * 1000.0).round() / 1000.0)
    } else {
        Value::Null
    }
}

fn spread_json(v: &[f64]) -> Value {
    let (m, lo, hi) = spread(v);
    json!({"median": num(m), "min": num(lo), "max": num(hi), "n": v.iter().filter(|x| x.is_finite()).count()})
}

/// A cell as JSON: raw repetitions, per-metric median/min/max, and the
/// paired ratios against upstream.
pub fn cell_json(cell: &Cell) -> Value {
    let mut impls = serde_json::Map::new();
    for imp in &cell.impls {
        let reps: Vec<Value> = imp
            .reps
            .iter()
            .map(|r| Value::Object(r.iter().map(|(k, v)| (k.clone(), num(*v))).collect()))
            .collect();
        let mut summary = serde_json::Map::new();
        for m in cell.metrics() {
            let v = cell.values(&imp.name, &m);
            if v.iter().any(|x| x.is_finite()) {
                summary.insert(m, spread_json(&v));
            }
        }
        impls.insert(
            imp.name.clone(),
            json!({"reps": reps, "summary": Value::Object(summary)}),
        );
    }
    let mut ratios = serde_json::Map::new();
    if cell.get(UPSTREAM).is_some() {
        for c in cell.contenders() {
            let mut per = serde_json::Map::new();
            for m in cell.metrics() {
                let r = cell.ratios(c, &m);
                if !r.is_empty() {
                    let mut s = spread_json(&r);
                    s["pairs"] = Value::Array(r.iter().map(|x| num(*x)).collect());
                    per.insert(m, s);
                }
            }
            ratios.insert(format!("{c}/{UPSTREAM}"), Value::Object(per));
        }
    }
    json!({
        "scenario": cell.scenario,
        "case": cell.case,
        "headline": cell.headline,
        "impls": Value::Object(impls),
        "ratios": Value::Object(ratios),
        "notes": cell.notes,
    })
}

/// A value for a table: 3 significant digits, thousands plain.
pub fn fmt_num(x: f64) -> String {
    if !x.is_finite() {
        return "—".into();
    }
    let a = x.abs();
    if a >= 100.0 {
        format!("{x:.0}")
    } else if a >= 10.0 {
        format!("{x:.1}")
    } else if a >= 1.0 {
        format!("{x:.2}")
    } else {
        format!("{x:.3}")
    }
}

/// `median (min–max)`, or just the median for one repetition.
pub fn fmt_spread(v: &[f64]) -> String {
    let (m, lo, hi) = spread(v);
    if !m.is_finite() {
        return "—".into();
    }
    if v.iter().filter(|x| x.is_finite()).count() < 2 {
        return fmt_num(m);
    }
    format!("{} ({}–{})", fmt_num(m), fmt_num(lo), fmt_num(hi))
}

/// The markdown table of `cells`: one row per (case, headline metric);
/// a column per implementation with the median and min–max over the
/// repetitions, and a column per contender with its ratio to upstream
/// (median and min–max of the per-repetition ratios).
pub fn markdown(cells: &[Cell]) -> String {
    let mut names: Vec<String> = Vec::new();
    for c in cells {
        for i in &c.impls {
            if !names.contains(&i.name) {
                names.push(i.name.clone());
            }
        }
    }
    let contenders: Vec<&String> = names
        .iter()
        .filter(|n| *n != DIRECT && *n != UPSTREAM)
        .collect();
    let mut out = String::new();
    let _ = write!(out, "| scenario | case | metric |");
    for n in &names {
        let _ = write!(out, " {n} |");
    }
    for c in &contenders {
        let _ = write!(out, " {c} / upstream |");
    }
    out.push('\n');
    out.push_str("|---|---|---|");
    for _ in 0..names.len() + contenders.len() {
        out.push_str("---:|");
    }
    out.push('\n');
    for cell in cells {
        for m in &cell.headline {
            let _ = write!(out, "| {} | {} | {} |", cell.scenario, cell.case, m);
            for n in &names {
                let _ = write!(out, " {} |", fmt_spread(&cell.values(n, m)));
            }
            for c in &contenders {
                let r = cell.ratios(c, m);
                let _ = write!(out, " {} |", fmt_spread(&r));
            }
            out.push('\n');
        }
    }
    out
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// Bar colours per implementation, in order of first appearance.
const COLOURS: [&str; 6] = [
    "#7f7f7f", "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e",
];

/// A horizontal bar chart of each cell's plot metric: one panel per cell,
/// one bar per implementation (median) with a min–max whisker and the
/// value written beside it.
pub fn svg_chart(title: &str, cells: &[&Cell]) -> String {
    let panels: Vec<(&Cell, &str)> = cells
        .iter()
        .filter_map(|c| c.plot.as_deref().map(|m| (*c, m)))
        .collect();
    let (width, label_w, bar_h, gap) = (760.0, 130.0, 18.0, 6.0);
    let mut names: Vec<String> = Vec::new();
    for (c, _) in &panels {
        for i in &c.impls {
            if !names.contains(&i.name) {
                names.push(i.name.clone());
            }
        }
    }
    let panel_h = |c: &Cell| 28.0 + c.impls.len() as f64 * (bar_h + gap) + 10.0;
    let height: f64 = 40.0 + panels.iter().map(|(c, _)| panel_h(c)).sum::<f64>();
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = write!(
        s,
        r#"<rect width="100%" height="100%" fill="white"/><text x="10" y="22" font-size="15" font-weight="bold">{}</text>"#,
        esc(title)
    );
    let mut y = 40.0;
    for (cell, metric) in panels {
        let better = if higher_is_better(metric) {
            "higher is better"
        } else {
            "lower is better"
        };
        let _ = write!(
            s,
            r#"<text x="10" y="{}" font-weight="bold">{} — {} ({better})</text>"#,
            y + 14.0,
            esc(&cell.case),
            esc(metric)
        );
        let rows: Vec<(String, f64, f64, f64)> = cell
            .impls
            .iter()
            .map(|i| {
                let (m, lo, hi) = spread(&cell.values(&i.name, metric));
                (i.name.clone(), m, lo, hi)
            })
            .collect();
        let top = rows
            .iter()
            .map(|r| if r.3.is_finite() { r.3 } else { r.1 })
            .filter(|v| v.is_finite())
            .fold(0.0f64, f64::max)
            .max(1e-9);
        let scale = (width - label_w - 90.0) / top;
        let mut by = y + 26.0;
        for (name, m, lo, hi) in rows {
            let colour =
                COLOURS[names.iter().position(|n| *n == name).unwrap_or(0) % COLOURS.len()];
            let _ = write!(
                s,
                r#"<text x="{}" y="{}" text-anchor="end">{}</text>"#,
                label_w - 6.0,
                by + bar_h - 5.0,
                esc(&name)
            );
            if m.is_finite() {
                let w = (m.max(0.0) * scale).max(0.5);
                let _ = write!(
                    s,
                    r#"<rect x="{label_w}" y="{by}" width="{w:.1}" height="{bar_h}" fill="{colour}"/>"#
                );
                if lo.is_finite() && hi.is_finite() && hi > lo {
                    let (x1, x2, cy) = (
                        label_w + lo.max(0.0) * scale,
                        label_w + hi.max(0.0) * scale,
                        by + bar_h / 2.0,
                    );
                    let _ = write!(
                        s,
                        r#"<line x1="{x1:.1}" y1="{cy}" x2="{x2:.1}" y2="{cy}" stroke="black"/><line x1="{x1:.1}" y1="{}" x2="{x1:.1}" y2="{}" stroke="black"/><line x1="{x2:.1}" y1="{}" x2="{x2:.1}" y2="{}" stroke="black"/>"#,
                        cy - 4.0,
                        cy + 4.0,
                        cy - 4.0,
                        cy + 4.0
                    );
                }
                let tx = label_w + hi.max(m).max(0.0) * scale + 6.0;
                let _ = write!(
                    s,
                    r#"<text x="{tx:.1}" y="{}">{}</text>"#,
                    by + bar_h - 5.0,
                    fmt_num(m)
                );
            } else {
                let _ = write!(
                    s,
                    r#"<text x="{}" y="{}">no data</text>"#,
                    label_w + 4.0,
                    by + bar_h - 5.0
                );
            }
            by += bar_h + gap;
        }
        y += panel_h(cell);
    }
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(pairs: &[(&str, f64)]) -> Sample {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect()
    }

    fn cell() -> Cell {
        Cell {
            scenario: "S1".into(),
            case: "download".into(),
            headline: vec!["MB/s".into(), "% of direct".into(), "added p99 µs".into()],
            plot: Some("MB/s".into()),
            impls: vec![
                ImplSamples {
                    name: DIRECT.into(),
                    reps: vec![
                        sample(&[("MB/s", 2000.0), ("p99 µs", 10.0)]),
                        sample(&[("MB/s", 1000.0), ("p99 µs", 20.0)]),
                    ],
                },
                ImplSamples {
                    name: UPSTREAM.into(),
                    reps: vec![
                        sample(&[("MB/s", 200.0), ("p99 µs", 110.0)]),
                        sample(&[("MB/s", 100.0), ("p99 µs", 220.0)]),
                    ],
                },
                ImplSamples {
                    name: "konn-epoll".into(),
                    reps: vec![
                        sample(&[("MB/s", 1000.0), ("p99 µs", 30.0)]),
                        sample(&[("MB/s", 300.0), ("p99 µs", 40.0)]),
                    ],
                },
            ],
            notes: vec![],
        }
    }

    #[test]
    fn derived_metrics_pair_with_the_same_repetition() {
        let mut c = cell();
        c.derive();
        assert_eq!(c.values("konn-epoll", "% of direct"), vec![50.0, 30.0]);
        assert_eq!(c.values("upstream", "added p99 µs"), vec![100.0, 200.0]);
        assert_eq!(c.values("konn-epoll", "added p99 µs"), vec![20.0, 20.0]);
        // direct gets no derived metrics
        assert!(c.values(DIRECT, "% of direct").iter().all(|x| x.is_nan()));
        // ratios per repetition: 1000/200 and 300/100, not median/median
        assert_eq!(c.ratios("konn-epoll", "MB/s"), vec![5.0, 3.0]);
        assert_eq!(c.contenders(), vec!["konn-epoll"]);
    }

    #[test]
    fn json_has_summaries_and_paired_ratios() {
        let mut c = cell();
        c.derive();
        let j = cell_json(&c);
        assert_eq!(j["impls"]["upstream"]["summary"]["MB/s"]["median"], 150.0);
        assert_eq!(j["impls"]["upstream"]["summary"]["MB/s"]["n"], 2);
        let r = &j["ratios"]["konn-epoll/upstream"]["MB/s"];
        assert_eq!(r["median"], 4.0);
        assert_eq!(r["min"], 3.0);
        assert_eq!(r["pairs"], json!([5.0, 3.0]));
        assert_eq!(j["impls"]["direct"]["reps"][1]["MB/s"], 1000.0);
        // Round trip through text.
        let text = serde_json::to_string_pretty(&j).unwrap();
        let back: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(back, j);
    }

    #[test]
    fn markdown_and_svg_render() {
        let mut c = cell();
        c.derive();
        let md = markdown(std::slice::from_ref(&c));
        let lines: Vec<&str> = md.lines().collect();
        assert_eq!(lines.len(), 2 + 3);
        assert!(lines[0].contains("konn-epoll / upstream"));
        assert!(lines[2].starts_with("| S1 | download | MB/s | 1500 (1000–2000) | 150 (100–200) | 650 (300–1000) | 4.00 (3.00–5.00) |"), "{}", lines[2]);
        let svg = svg_chart("S1 <bulk>", &[&c]);
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert!(svg.contains("S1 &lt;bulk&gt;"));
        assert_eq!(svg.matches("<rect x=").count(), 3);
    }

    #[test]
    fn formatting() {
        assert_eq!(fmt_num(1234.4), "1234");
        assert_eq!(fmt_num(12.345), "12.3");
        assert_eq!(fmt_num(0.01234), "0.012");
        assert_eq!(fmt_num(f64::NAN), "—");
        assert_eq!(fmt_spread(&[2.0]), "2.00");
        assert!(higher_is_better("MB/s") && higher_is_better("dials/s"));
        assert!(!higher_is_better("p99 µs"));
    }
}
