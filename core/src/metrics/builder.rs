//! Declaring families: [`RegistryBuilder`] checks names, labels and
//! buckets (a bad one is a bug and panics at start-up), numbers every
//! series of a fixed family, pre-renders its label text and exposition
//! order, and lays out the cells of every slab once ([`RegistryBuilder::build`]).

use std::fmt;
use std::sync::Arc;

use super::family::{Dynamic, Family, FamilyKind, Fixed};
use super::ids::{
    CounterVec, DynamicCounterVec, DynamicHistogramVec, GaugeVec, HistogramVec, Layout,
};
use super::process::ProcessMetric;
use super::registry::Registry;
use super::slab::{Inner, Slab};
use super::{MAX_FIXED_LABELS, MetricType, text};

/// Declares the families of a [`Registry`].
///
/// Names, label names and bucket lists are program constants: an invalid
/// one is a bug and panics here, at start-up.
pub struct RegistryBuilder {
    families: Vec<Family>,
    series: u32,
    cells: u32,
    scrape: Option<ScrapeIds>,
}

impl fmt::Debug for RegistryBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RegistryBuilder")
            .field("families", &self.families.len())
            .finish_non_exhaustive()
    }
}

impl Default for RegistryBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl RegistryBuilder {
    /// An empty builder.
    pub fn new() -> Self {
        Self {
            families: Vec::new(),
            series: 0,
            cells: 0,
            scrape: None,
        }
    }

    /// A counter without labels.
    pub fn counter(&mut self, name: &'static str, help: &'static str) -> CounterVec {
        CounterVec(self.fixed(name, help, MetricType::Counter, &[], &[], &[]))
    }

    /// A counter family with `labels`, where `values[i]` lists every value of
    /// `labels[i]`.
    pub fn counter_vec(
        &mut self,
        name: &'static str,
        help: &'static str,
        labels: &[&'static str],
        values: &[&[&str]],
    ) -> CounterVec {
        CounterVec(self.fixed(name, help, MetricType::Counter, labels, values, &[]))
    }

    /// A gauge without labels.
    pub fn gauge(&mut self, name: &'static str, help: &'static str) -> GaugeVec {
        GaugeVec(self.fixed(name, help, MetricType::Gauge, &[], &[], &[]))
    }

    /// A gauge family with `labels` and their complete value lists.
    pub fn gauge_vec(
        &mut self,
        name: &'static str,
        help: &'static str,
        labels: &[&'static str],
        values: &[&[&str]],
    ) -> GaugeVec {
        GaugeVec(self.fixed(name, help, MetricType::Gauge, labels, values, &[]))
    }

    /// A histogram without labels, with upper bounds `buckets` (finite,
    /// strictly increasing; `+Inf` is implicit).
    pub fn histogram(
        &mut self,
        name: &'static str,
        help: &'static str,
        buckets: &[f64],
    ) -> HistogramVec {
        HistogramVec(self.fixed(name, help, MetricType::Histogram, &[], &[], buckets))
    }

    /// A histogram family with `labels` and their complete value lists.
    pub fn histogram_vec(
        &mut self,
        name: &'static str,
        help: &'static str,
        buckets: &[f64],
        labels: &[&'static str],
        values: &[&[&str]],
    ) -> HistogramVec {
        HistogramVec(self.fixed(name, help, MetricType::Histogram, labels, values, buckets))
    }

    /// A counter family whose label values are only known at run time.
    pub fn dynamic_counter_vec(
        &mut self,
        name: &'static str,
        help: &'static str,
        labels: &[&'static str],
    ) -> DynamicCounterVec {
        let family = self.dynamic(name, help, MetricType::Counter, labels, &[]);
        DynamicCounterVec { family }
    }

    /// [`RegistryBuilder::dynamic_counter_vec`] keeping up to `limit`
    /// series instead of [`super::DYNAMIC_SERIES_LIMIT`] (for labels that
    /// are bounded but many, such as agent ids).
    pub fn dynamic_counter_vec_limit(
        &mut self,
        name: &'static str,
        help: &'static str,
        labels: &[&'static str],
        limit: usize,
    ) -> DynamicCounterVec {
        let family = self.dynamic(name, help, MetricType::Counter, labels, &[]);
        self.set_dynamic_limit(family, limit);
        DynamicCounterVec { family }
    }

    /// [`RegistryBuilder::dynamic_histogram_vec`] keeping up to `limit`
    /// series.
    pub fn dynamic_histogram_vec_limit(
        &mut self,
        name: &'static str,
        help: &'static str,
        buckets: &[f64],
        labels: &[&'static str],
        limit: usize,
    ) -> DynamicHistogramVec {
        let family = self.dynamic(name, help, MetricType::Histogram, labels, buckets);
        self.set_dynamic_limit(family, limit);
        DynamicHistogramVec { family }
    }

    fn set_dynamic_limit(&mut self, family: u16, limit: usize) {
        if let Some(Family {
            kind: FamilyKind::Dynamic(d),
            ..
        }) = self.families.get_mut(usize::from(family))
        {
            d.limit = std::sync::atomic::AtomicUsize::new(limit);
        }
    }

    /// A histogram family whose label values are only known at run time.
    pub fn dynamic_histogram_vec(
        &mut self,
        name: &'static str,
        help: &'static str,
        buckets: &[f64],
        labels: &[&'static str],
    ) -> DynamicHistogramVec {
        let family = self.dynamic(name, help, MetricType::Histogram, labels, buckets);
        DynamicHistogramVec { family }
    }

    /// Adds the nine `process_*` families of `client_golang`'s process
    /// collector, read from `/proc` at each scrape.
    pub fn process_metrics(&mut self) -> &mut Self {
        for (metric, name, help, counter) in ProcessMetric::ALL {
            let ty = if counter {
                MetricType::Counter
            } else {
                MetricType::Gauge
            };
            self.push_family(name, help, ty, FamilyKind::Process(metric));
        }
        self
    }

    /// Adds `promhttp_metric_handler_requests_in_flight` and
    /// `promhttp_metric_handler_requests_total{code}` (codes `200`, `500`,
    /// `503`, present from the start), which upstream's
    /// `promhttp.Handler()` registers and [`Registry::scrape`] maintains.
    pub fn scrape_metrics(&mut self) -> &mut Self {
        if self.scrape.is_none() {
            let in_flight = self.gauge(
                "promhttp_metric_handler_requests_in_flight",
                "Current number of scrapes being served.",
            );
            let total = self.counter_vec(
                "promhttp_metric_handler_requests_total",
                "Total number of scrapes by HTTP status code.",
                &["code"],
                &[&SCRAPE_CODES],
            );
            self.scrape = Some(ScrapeIds { in_flight, total });
        }
        self
    }

    /// Lays out the cells and allocates `cores` slabs (one per worker).
    pub fn build(self, cores: usize) -> Registry {
        let cells = self.cells as usize;
        let series = self.series as usize;
        let mut order: Vec<usize> = (0..self.families.len()).collect();
        order.sort_by(|&a, &b| {
            let name = |i: usize| self.families.get(i).map_or("", |f| f.name);
            name(a).cmp(name(b))
        });
        let inner = Inner {
            global: Slab::new(cells, series),
            slabs: (0..cores)
                .map(|_| Arc::new(Slab::new(cells, series)))
                .collect(),
            families: self.families,
            order: order.into_boxed_slice(),
            scrape: self.scrape,
        };
        let registry = Registry {
            inner: Arc::new(inner),
        };
        if let Some(ids) = registry.inner.scrape {
            if let Some(id) = ids.in_flight.single() {
                registry.gauge(id).touch();
            }
            for code in 0..SCRAPE_CODES.len() {
                if let Some(id) = ids.total.at(&[code]) {
                    registry.counter(id).touch();
                }
            }
        }
        registry
    }

    fn push_family(
        &mut self,
        name: &'static str,
        help: &'static str,
        ty: MetricType,
        kind: FamilyKind,
    ) -> u16 {
        assert!(
            text::is_valid_metric_name(name),
            "invalid metric name {name:?}"
        );
        assert!(
            self.families.iter().all(|f| f.name != name),
            "metric {name:?} registered twice"
        );
        let index = u16::try_from(self.families.len()).expect("too many metric families");
        self.families.push(Family {
            name,
            help,
            ty,
            kind,
        });
        index
    }

    fn fixed(
        &mut self,
        name: &'static str,
        help: &'static str,
        ty: MetricType,
        labels: &[&'static str],
        values: &[&[&str]],
        buckets: &[f64],
    ) -> Layout {
        assert!(
            labels.len() <= MAX_FIXED_LABELS,
            "{name}: more than {MAX_FIXED_LABELS} labels"
        );
        assert_eq!(
            labels.len(),
            values.len(),
            "{name}: one value list per label"
        );
        check_labels(name, ty, labels);
        check_buckets(name, ty, buckets);
        let mut dims = [0u16; MAX_FIXED_LABELS];
        for (dim, vals) in dims.iter_mut().zip(values) {
            *dim = u16::try_from(vals.len()).expect("too many label values");
        }
        let rank = u8::try_from(labels.len()).unwrap_or(0);
        let cells_per_series = match ty {
            MetricType::Histogram => buckets.len() as u32 + 2,
            _ => 1,
        };
        let family = u16::try_from(self.families.len()).expect("too many metric families");
        let layout = Layout {
            family,
            first_series: self.series,
            first_cell: self.cells,
            cells_per_series,
            dims,
            rank,
        };
        let count = layout.series_count();
        let count32 = u32::try_from(count).expect("too many series");
        self.series = self.series.checked_add(count32).expect("too many series");
        self.cells = count32
            .checked_mul(cells_per_series)
            .and_then(|n| self.cells.checked_add(n))
            .expect("too many cells");
        let (labels_text, order) = fixed_series_labels(labels, values);
        let fixed = Fixed {
            layout,
            bounds: buckets.into(),
            le: buckets.iter().map(|&b| text::format_f64(b)).collect(),
            labels: labels_text,
            order,
        };
        self.push_family(name, help, ty, FamilyKind::Fixed(fixed));
        layout
    }

    fn dynamic(
        &mut self,
        name: &'static str,
        help: &'static str,
        ty: MetricType,
        labels: &[&'static str],
        buckets: &[f64],
    ) -> u16 {
        check_labels(name, ty, labels);
        check_buckets(name, ty, buckets);
        let mut sorted: Vec<usize> = (0..labels.len()).collect();
        sorted.sort_by_key(|&i| labels.get(i).copied().unwrap_or(""));
        let dynamic = Dynamic {
            labels: labels.into(),
            sorted: sorted.into_boxed_slice(),
            bounds: buckets.into(),
            le: buckets.iter().map(|&b| text::format_f64(b)).collect(),
            limit: std::sync::atomic::AtomicUsize::new(super::DYNAMIC_SERIES_LIMIT),
            #[allow(clippy::disallowed_types)]
            table: std::sync::Mutex::new(Vec::new()),
        };
        self.push_family(name, help, ty, FamilyKind::Dynamic(dynamic))
    }
}

fn check_labels(name: &str, ty: MetricType, labels: &[&str]) {
    for (i, label) in labels.iter().enumerate() {
        assert!(
            text::is_valid_label_name(label),
            "{name}: invalid label name {label:?}"
        );
        assert!(
            !(ty == MetricType::Histogram && *label == "le"),
            "{name}: a histogram cannot have an `le` label"
        );
        assert!(
            !labels.iter().take(i).any(|l| l == label),
            "{name}: duplicate label {label:?}"
        );
    }
}

fn check_buckets(name: &str, ty: MetricType, buckets: &[f64]) {
    if ty == MetricType::Histogram {
        assert!(
            buckets.iter().all(|b| b.is_finite())
                && buckets.windows(2).all(|w| matches!(w, [a, b] if a < b)),
            "{name}: buckets must be finite and strictly increasing"
        );
    }
}

/// The label text of every series of a fixed family and their exposition
/// order.
fn fixed_series_labels(labels: &[&str], values: &[&[&str]]) -> (Box<[String]>, Box<[u32]>) {
    let count: usize = values.iter().map(|v| v.len()).product();
    let mut sorted: Vec<usize> = (0..labels.len()).collect();
    sorted.sort_by_key(|&i| labels.get(i).copied().unwrap_or(""));
    // Per series, its value index for each label (mixed radix, first label
    // most significant).
    let indexes = |mut flat: usize| -> Vec<usize> {
        let mut idx = vec![0; values.len()];
        for (slot, vals) in idx.iter_mut().zip(values).rev() {
            let n = vals.len().max(1);
            *slot = flat % n;
            flat /= n;
        }
        idx
    };
    let value_of = |series: usize, label: usize| -> &str {
        let idx = indexes(series);
        idx.get(label)
            .and_then(|&i| values.get(label).and_then(|v| v.get(i)))
            .copied()
            .unwrap_or("")
    };
    let mut text = Vec::with_capacity(count);
    for series in 0..count {
        let mut out = Vec::new();
        for (n, &label) in sorted.iter().enumerate() {
            if n > 0 {
                out.push(b',');
            }
            out.extend_from_slice(labels.get(label).copied().unwrap_or("").as_bytes());
            out.extend_from_slice(b"=\"");
            text::write_escaped_label_value(&mut out, value_of(series, label));
            out.push(b'"');
        }
        text.push(String::from_utf8(out).unwrap_or_default());
    }
    let mut order: Vec<u32> = (0..count as u32).collect();
    order.sort_by(|&a, &b| {
        let key = |s: u32| -> Vec<&str> {
            sorted
                .iter()
                .map(|&label| value_of(s as usize, label))
                .collect()
        };
        key(a).cmp(&key(b))
    });
    (text.into_boxed_slice(), order.into_boxed_slice())
}

pub(super) const SCRAPE_CODES: [&str; 3] = ["200", "500", "503"];

#[derive(Debug, Clone, Copy)]
pub(super) struct ScrapeIds {
    pub(super) in_flight: GaugeVec,
    pub(super) total: CounterVec,
}
