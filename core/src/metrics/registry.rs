//! The [`Registry`]: claiming a core's slab, updates from any thread,
//! reading values back, and the text exposition (families by name, series
//! in label order, `client_golang`'s number and escaping rules).

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use super::builder::RegistryBuilder;
use super::family::{Dynamic, DynamicSeries, Family, FamilyKind, Fixed};
use super::handle::{CoreMetrics, SharedCounter, SharedGauge, SharedHistogram};
use super::ids::{CounterId, DynamicCounterVec, DynamicHistogramVec, GaugeId, HistogramId};
use super::slab::{Inner, bucket_index};
use super::{MetricType, process, text};

/// The metric registry: families, per-core slabs and the global area. Cheap
/// to clone (shared), usable from any thread.
#[derive(Clone)]
pub struct Registry {
    pub(super) inner: Arc<Inner>,
}

impl fmt::Debug for Registry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registry")
            .field("families", &self.inner.families.len())
            .field("cores", &self.inner.slabs.len())
            .finish_non_exhaustive()
    }
}

impl Registry {
    /// Starts declaring families.
    pub fn builder() -> RegistryBuilder {
        RegistryBuilder::new()
    }

    /// Number of per-core slabs.
    pub fn cores(&self) -> usize {
        self.inner.slabs.len()
    }

    /// The handle for slab `index`, for the one thread that will write it.
    /// `None` if there is no such slab or its handle is already out (it is
    /// released when that handle is dropped).
    pub fn claim(&self, index: usize) -> Option<CoreMetrics> {
        let slab = self.inner.slabs.get(index)?.clone();
        if slab.claimed.swap(true, Relaxed) {
            return None;
        }
        Some(CoreMetrics {
            registry: self.clone(),
            slab,
            index,
            _not_sync: PhantomData,
        })
    }

    /// A counter updated from any thread (`fetch_add` on the global area).
    pub fn counter(&self, id: CounterId) -> SharedCounter<'_> {
        SharedCounter {
            slab: &self.inner.global,
            slot: id.slot,
        }
    }

    /// A gauge updated from any thread. Its value is added to the per-core
    /// shares at scrape time.
    pub fn gauge(&self, id: GaugeId) -> SharedGauge<'_> {
        SharedGauge {
            slab: &self.inner.global,
            slot: id.slot,
        }
    }

    /// A histogram observed from any thread.
    pub fn histogram(&self, id: HistogramId) -> SharedHistogram<'_> {
        SharedHistogram {
            slab: &self.inner.global,
            slot: id.slot,
            bounds: self.inner.bounds(id.family),
        }
    }

    /// Adds `n` to the dynamic counter series with `values` (one per label,
    /// in declared order). Ignored if the count of values is wrong or the
    /// family is full.
    pub fn dynamic_counter_add(&self, family: DynamicCounterVec, values: &[&str], n: u64) {
        self.dynamic_counter_add_or(family, values, None, n);
    }

    /// [`Registry::dynamic_counter_add`], adding to the series with
    /// `overflow` instead when the family is full (e.g. `other` for a
    /// capped label).
    pub fn dynamic_counter_add_or(
        &self,
        family: DynamicCounterVec,
        values: &[&str],
        overflow: Option<&[&str]>,
        n: u64,
    ) {
        if let Some(d) = self.inner.dynamic(family.family) {
            d.update(values, overflow, |s| {
                if let Some(c) = s.counts.first_mut() {
                    *c = c.wrapping_add(n);
                }
            });
        }
    }

    /// Records `v` in the dynamic histogram series with `values`.
    pub fn dynamic_histogram_observe(&self, family: DynamicHistogramVec, values: &[&str], v: f64) {
        self.dynamic_histogram_observe_or(family, values, None, v);
    }

    /// [`Registry::dynamic_histogram_observe`] with an overflow series, as
    /// [`Registry::dynamic_counter_add_or`].
    pub fn dynamic_histogram_observe_or(
        &self,
        family: DynamicHistogramVec,
        values: &[&str],
        overflow: Option<&[&str]>,
        v: f64,
    ) {
        if let Some(d) = self.inner.dynamic(family.family) {
            let i = bucket_index(&d.bounds, v);
            d.update(values, overflow, |s| {
                if let Some(c) = s.counts.get_mut(i) {
                    *c += 1;
                }
                s.sum += v;
            });
        }
    }

    /// Removes the series of dynamic counter family `family` whose label
    /// `label` (declared position) is `value` (e.g. an agent that left).
    pub fn dynamic_counter_remove(&self, family: DynamicCounterVec, label: usize, value: &str) {
        if let Some(d) = self.inner.dynamic(family.family) {
            d.remove(label, value);
        }
    }

    /// Sets the most series dynamic counter family `family` keeps (series
    /// beyond it already kept stay).
    pub fn set_dynamic_counter_limit(&self, family: DynamicCounterVec, limit: usize) {
        if let Some(d) = self.inner.dynamic(family.family) {
            d.limit.store(limit, Relaxed);
        }
    }

    /// [`Registry::dynamic_counter_remove`] for a histogram family.
    pub fn dynamic_histogram_remove(&self, family: DynamicHistogramVec, label: usize, value: &str) {
        if let Some(d) = self.inner.dynamic(family.family) {
            d.remove(label, value);
        }
    }

    /// The current total of a counter (all cores plus the global area).
    pub fn counter_value(&self, id: CounterId) -> u64 {
        self.inner.sum_u64(id.slot.cell)
    }

    /// The current value of a gauge (global value plus every core's share).
    pub fn gauge_value(&self, id: GaugeId) -> f64 {
        self.inner.sum_f64(id.slot.cell)
    }

    /// The current count and sum of a histogram.
    pub fn histogram_value(&self, id: HistogramId) -> (u64, f64) {
        let buckets = self.inner.bounds(id.family).len() as u32;
        let cell = id.slot.cell;
        let count = (0..=buckets).fold(0u64, |acc, b| {
            acc.wrapping_add(self.inner.sum_u64(cell.saturating_add(b)))
        });
        (count, self.inner.sum_f64(cell.saturating_add(buckets + 1)))
    }

    /// Appends the text exposition of every family to `out`.
    pub fn render(&self, out: &mut Vec<u8>) {
        let needs_process = self
            .inner
            .families
            .iter()
            .any(|f| matches!(f.kind, FamilyKind::Process(_)));
        let snapshot = if needs_process {
            process::snapshot()
        } else {
            process::ProcessSnapshot::default()
        };
        for &index in self.inner.order.iter() {
            if let Some(family) = self.inner.families.get(index) {
                self.render_family(out, family, &snapshot);
            }
        }
    }

    /// [`render`](Self::render) of this registry together with `parts`,
    /// other registries whose series each get the extra label
    /// `label="value"` (one proxy-server for many clusters: a registry per
    /// cluster, `cluster="name"`). Families of the same name are written
    /// once, in name order; within a family this registry's series come
    /// first, then each part's in the order given. `label` must sort before
    /// every label name of the parts' families (it is written first), and
    /// `parts` should be sorted by value, so the series stay in
    /// client_golang's order.
    pub fn render_merged(&self, out: &mut Vec<u8>, label: &str, parts: &[(&str, &Self)]) {
        let needs_process = self
            .inner
            .families
            .iter()
            .any(|f| matches!(f.kind, FamilyKind::Process(_)));
        let snapshot = if needs_process {
            process::snapshot()
        } else {
            process::ProcessSnapshot::default()
        };
        let registries: Vec<(String, &Self)> = std::iter::once((String::new(), self))
            .chain(parts.iter().map(|(value, r)| {
                let mut prefix = Vec::new();
                prefix.extend_from_slice(label.as_bytes());
                prefix.extend_from_slice(b"=\"");
                text::write_escaped_label_value(&mut prefix, value);
                prefix.push(b'"');
                (String::from_utf8(prefix).unwrap_or_default(), *r)
            }))
            .collect();
        let mut all: Vec<(&'static str, usize, usize)> = Vec::new();
        for (i, (_, r)) in registries.iter().enumerate() {
            for &index in r.inner.order.iter() {
                if let Some(f) = r.inner.families.get(index) {
                    all.push((f.name, i, index));
                }
            }
        }
        all.sort_by(|a, b| a.0.cmp(b.0).then(a.1.cmp(&b.1)));
        for group in all.chunk_by(|a, b| a.0 == b.0) {
            let mut body = Vec::new();
            let mut header = None;
            for &(_, i, index) in group {
                let Some((prefix, r)) = registries.get(i) else {
                    continue;
                };
                if let Some(family) = r.inner.families.get(index) {
                    r.family_body(&mut body, family, &snapshot, prefix);
                    header.get_or_insert(family);
                }
            }
            if let Some(family) = header
                && !body.is_empty()
            {
                write_header(out, family);
                out.extend_from_slice(&body);
            }
        }
    }

    /// [`Registry::scrape`] of [`Registry::render_merged`].
    pub fn scrape_merged(&self, label: &str, parts: &[(&str, &Self)]) -> Vec<u8> {
        let ids = self.inner.scrape;
        let in_flight = ids.and_then(|ids| ids.in_flight.single());
        if let Some(id) = in_flight {
            self.gauge(id).inc();
        }
        let mut out = Vec::with_capacity(16 * 1024);
        self.render_merged(&mut out, label, parts);
        if let Some(id) = in_flight {
            self.gauge(id).dec();
        }
        if let Some(id) = ids.and_then(|ids| ids.total.at(&[0])) {
            self.counter(id).inc();
        }
        out
    }

    /// [`render`](Self::render) into a new `String`.
    pub fn render_to_string(&self) -> String {
        let mut out = Vec::with_capacity(16 * 1024);
        self.render(&mut out);
        String::from_utf8(out).unwrap_or_default()
    }

    /// Serves one scrape as `promhttp.Handler()` does: counts it in
    /// `promhttp_metric_handler_requests_in_flight` while rendering, and in
    /// `promhttp_metric_handler_requests_total{code="200"}` afterwards (if
    /// [`RegistryBuilder::scrape_metrics`] added them), so a scrape shows
    /// itself in flight and the scrapes before it in the total.
    pub fn scrape(&self) -> Vec<u8> {
        let ids = self.inner.scrape;
        let in_flight = ids.and_then(|ids| ids.in_flight.single());
        if let Some(id) = in_flight {
            self.gauge(id).inc();
        }
        let mut out = Vec::with_capacity(16 * 1024);
        self.render(&mut out);
        if let Some(id) = in_flight {
            self.gauge(id).dec();
        }
        if let Some(id) = ids.and_then(|ids| ids.total.at(&[0])) {
            self.counter(id).inc();
        }
        out
    }

    fn render_family(&self, out: &mut Vec<u8>, family: &Family, snap: &process::ProcessSnapshot) {
        let mut body = Vec::new();
        self.family_body(&mut body, family, snap, "");
        if body.is_empty() {
            return;
        }
        write_header(out, family);
        out.extend_from_slice(&body);
    }

    /// The sample lines of one family; `prefix` (`name="value"`) goes
    /// first in every series' labels.
    fn family_body(
        &self,
        body: &mut Vec<u8>,
        family: &Family,
        snap: &process::ProcessSnapshot,
        prefix: &str,
    ) {
        match &family.kind {
            FamilyKind::Fixed(fixed) => self.render_fixed(body, family, fixed, prefix),
            FamilyKind::Dynamic(dynamic) => render_dynamic(body, family, dynamic, prefix),
            FamilyKind::Process(metric) => {
                if let Some(v) = metric.value(snap) {
                    write_sample(body, family.name, "", prefix, None, v);
                }
            }
        }
    }

    fn render_fixed(&self, out: &mut Vec<u8>, family: &Family, fixed: &Fixed, prefix: &str) {
        let layout = &fixed.layout;
        let inner = &self.inner;
        for &rel in fixed.order.iter() {
            let series = layout.first_series + rel;
            let cell = layout.first_cell + rel * layout.cells_per_series;
            let own = fixed.labels.get(rel as usize).map_or("", String::as_str);
            let joined;
            let labels = if prefix.is_empty() {
                own
            } else {
                joined = join_labels(prefix, own);
                joined.as_str()
            };
            match family.ty {
                MetricType::Counter => {
                    let v = inner.sum_u64(cell);
                    if v != 0 || inner.touched(series) {
                        write_sample(out, family.name, "", labels, None, v as f64);
                    }
                }
                MetricType::Gauge => {
                    if inner.touched(series) {
                        let v = inner.sum_f64(cell);
                        write_sample(out, family.name, "", labels, None, v);
                    }
                }
                MetricType::Histogram => {
                    let n = fixed.bounds.len() as u32;
                    let counts: Vec<u64> = (0..=n).map(|b| inner.sum_u64(cell + b)).collect();
                    let total = counts.iter().fold(0u64, |a, &c| a.wrapping_add(c));
                    if total != 0 || inner.touched(series) {
                        let sum = inner.sum_f64(cell + n + 1);
                        write_histogram(out, family.name, labels, &fixed.le, &counts, sum);
                    }
                }
            }
        }
    }
}

/// `# HELP` and `# TYPE` of a family.
fn write_header(out: &mut Vec<u8>, family: &Family) {
    out.extend_from_slice(b"# HELP ");
    out.extend_from_slice(family.name.as_bytes());
    out.push(b' ');
    text::write_escaped_help(out, family.help);
    out.extend_from_slice(b"\n# TYPE ");
    out.extend_from_slice(family.name.as_bytes());
    out.push(b' ');
    out.extend_from_slice(family.ty.as_str().as_bytes());
    out.push(b'\n');
}

/// `prefix,labels` (either may be empty).
fn join_labels(prefix: &str, labels: &str) -> String {
    match (prefix.is_empty(), labels.is_empty()) {
        (_, true) => prefix.to_owned(),
        (true, false) => labels.to_owned(),
        (false, false) => format!("{prefix},{labels}"),
    }
}

fn render_dynamic(out: &mut Vec<u8>, family: &Family, dynamic: &Dynamic, prefix: &str) {
    let table = dynamic.lock();
    let mut rows: Vec<(Vec<&str>, String, &DynamicSeries)> = table
        .iter()
        .map(|s| {
            let key: Vec<&str> = dynamic
                .sorted
                .iter()
                .map(|&i| s.values.get(i).map_or("", |v| &**v))
                .collect();
            let mut text = Vec::new();
            for (n, (&i, value)) in dynamic.sorted.iter().zip(&key).enumerate() {
                if n > 0 {
                    text.push(b',');
                }
                text.extend_from_slice(dynamic.labels.get(i).copied().unwrap_or("").as_bytes());
                text.extend_from_slice(b"=\"");
                text::write_escaped_label_value(&mut text, value);
                text.push(b'"');
            }
            let own = String::from_utf8(text).unwrap_or_default();
            (key, join_labels(prefix, &own), s)
        })
        .collect();
    rows.sort_by(|a, b| a.0.cmp(&b.0));
    for (_, labels, series) in rows {
        match family.ty {
            MetricType::Histogram => {
                write_histogram(
                    out,
                    family.name,
                    &labels,
                    &dynamic.le,
                    &series.counts,
                    series.sum,
                );
            }
            _ => {
                let v = series.counts.first().copied().unwrap_or(0);
                write_sample(out, family.name, "", &labels, None, v as f64);
            }
        }
    }
}

/// One sample line: `name{labels,le="x"} value`.
fn write_sample(
    out: &mut Vec<u8>,
    name: &str,
    suffix: &str,
    labels: &str,
    le: Option<&str>,
    value: f64,
) {
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(suffix.as_bytes());
    if !labels.is_empty() || le.is_some() {
        out.push(b'{');
        out.extend_from_slice(labels.as_bytes());
        if let Some(le) = le {
            if !labels.is_empty() {
                out.push(b',');
            }
            out.extend_from_slice(b"le=\"");
            out.extend_from_slice(le.as_bytes());
            out.push(b'"');
        }
        out.push(b'}');
    }
    out.push(b' ');
    text::write_f64(out, value);
    out.push(b'\n');
}

/// The bucket, sum and count lines of one histogram series; `counts` holds
/// per-bucket (not cumulative) counts with `+Inf` last.
fn write_histogram(
    out: &mut Vec<u8>,
    name: &str,
    labels: &str,
    le: &[String],
    counts: &[u64],
    sum: f64,
) {
    let mut cumulative = 0u64;
    for (i, &c) in counts.iter().enumerate() {
        cumulative = cumulative.wrapping_add(c);
        let bound = le.get(i).map_or("+Inf", String::as_str);
        write_sample(out, name, "_bucket", labels, Some(bound), cumulative as f64);
    }
    write_sample(out, name, "_sum", labels, None, sum);
    write_sample(out, name, "_count", labels, None, cumulative as f64);
}
