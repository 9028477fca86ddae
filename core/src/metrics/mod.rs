//! Prometheus metrics counted per core and exposed in `client_golang`'s
//! text format.
//!
//! # Why not a Prometheus crate
//!
//! konn counts packets on the data path of every worker. A shared atomic
//! per counter would bounce its cache line between cores on every packet,
//! and a label lookup through a hash map (what Prometheus client libraries
//! do for `with_label_values`) costs more than the packet work it measures.
//! Upstream's label values are all known in advance (segments, packet
//! types, gRPC codes, dial failure reasons, service methods, strategies), so
//! every series gets a fixed slot at start-up and an increment is a couple
//! of instructions on memory only its core writes.
//!
//! # Design
//!
//! A [`RegistryBuilder`] declares families (counter, gauge, histogram with
//! fixed buckets), each with its label names and, per label, the complete
//! list of values. Every combination of values becomes a *series* with its
//! own *cells* (one 64-bit cell for a counter or gauge; one per bucket, plus
//! `+Inf` and the sum, for a histogram). [`RegistryBuilder::build`] lays the
//! cells out once and allocates:
//!
//! - one **slab** per worker: cache-line-aligned cells written by that
//!   worker only, through a [`CoreMetrics`] handle that is `Send` but not
//!   `Sync` and can be claimed once per slab ([`Registry::claim`]). Its
//!   operations are relaxed `load` + `store` pairs on an atomic the core
//!   owns: no lock, no read-modify-write, no contended cache line, no
//!   allocation;
//! - one **global** area with the same layout for updates from any thread
//!   ([`Registry::counter`], [`Registry::gauge`], [`Registry::histogram`]),
//!   which use `fetch_add` and are meant for paths that are not per packet
//!   (gauges that are set to a process-wide value, lease bookkeeping).
//!
//! A scrape ([`Registry::render`]) adds up the global area and every slab:
//! counters and histogram buckets are sums, a gauge is the global value plus
//! every core's signed share (so a per-core gauge is kept with
//! `inc`/`dec`, or `set` to the core's own part). Counters are `u64`;
//! gauges, like Go's, are `f64` (exact for counts up to 2^53). Histogram
//! counts are derived from the bucket cells, so `_count` always equals the
//! `+Inf` bucket; the `_sum` of a scrape that races an observation may miss
//! that one observation.
//!
//! Families whose label values are not known in advance (HTTP status codes
//! and reasons of lease API calls) are *dynamic*: a small locked table on the
//! global side, capped at [`DYNAMIC_SERIES_LIMIT`] series per family, off
//! the data path.
//!
//! # Exposition, as client_golang writes it
//!
//! - Families in byte order of name; a family without series is left out.
//! - A series appears once it was touched: any update, or an explicit
//!   `touch()` (Go creates a child of a vector on its first
//!   `WithLabelValues`, and plain `NewGauge`/`NewCounter` metrics exist from
//!   registration). Counters and histograms with a non-zero value count as
//!   touched.
//! - Label pairs sorted by label name; series sorted by their label values in
//!   that order; histogram `le` comes last, after the sorted labels.
//! - Numbers, escaping and the content type as described in [`text`].
//!
//! `go_*` metrics (Go runtime and GC statistics) have no Rust equivalent and
//! are absent. [`RegistryBuilder::process_metrics`] adds the nine `process_*`
//! families (read from `/proc` at each scrape, as the Go process collector
//! does) and [`RegistryBuilder::scrape_metrics`] the two `promhttp_*`
//! families that upstream's `promhttp.Handler()` registers. [`common`] holds
//! what both binaries share (segments, the stream families).

pub mod common;
mod process;
pub mod text;

use std::{
    cell::Cell,
    fmt,
    marker::PhantomData,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering::Relaxed},
    },
    time::Duration,
};

use self::process::ProcessMetric;

/// Most series a dynamic family keeps; updates for new label values beyond
/// it are dropped (a guard against unbounded label values such as error
/// reasons).
pub const DYNAMIC_SERIES_LIMIT: usize = 256;

/// Most labels a family with fixed label values may have.
pub const MAX_FIXED_LABELS: usize = 4;

/// Cells per cache-line-aligned block of a slab.
const LINE_CELLS: usize = 16;

/// Touched flags per aligned block.
const FLAG_LINE: usize = 128;

/// The metric type, as written on the `# TYPE` line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricType {
    /// A monotonic count.
    Counter,
    /// A value that goes up and down.
    Gauge,
    /// Observations counted into fixed buckets, with their sum.
    Histogram,
}

impl MetricType {
    /// The word on the `# TYPE` line.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Counter => "counter",
            Self::Gauge => "gauge",
            Self::Histogram => "histogram",
        }
    }
}

// ----- identifiers -----------------------------------------------------------

/// Position of one series: its index and its first cell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Slot {
    series: u32,
    cell: u32,
}

/// A family's layout: where its series and cells start, and the number of
/// values of each label (mixed-radix series numbering, first label most
/// significant).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Layout {
    family: u16,
    first_series: u32,
    first_cell: u32,
    cells_per_series: u32,
    dims: [u16; MAX_FIXED_LABELS],
    rank: u8,
}

impl Layout {
    /// The slot for label value indexes `idx` (one per label, in declared
    /// order), or `None` if their number or any value is out of range.
    #[inline]
    fn slot(&self, idx: &[usize]) -> Option<Slot> {
        if idx.len() != usize::from(self.rank) {
            return None;
        }
        let mut flat: usize = 0;
        for (&i, &dim) in idx.iter().zip(&self.dims) {
            let dim = usize::from(dim);
            if i >= dim {
                return None;
            }
            flat = flat * dim + i;
        }
        let flat = u32::try_from(flat).ok()?;
        Some(Slot {
            series: self.first_series + flat,
            cell: self.first_cell + flat * self.cells_per_series,
        })
    }

    fn series_count(&self) -> usize {
        self.dims
            .iter()
            .take(usize::from(self.rank))
            .map(|&d| usize::from(d))
            .product()
    }
}

/// The slot of an out-of-range series: no slab has such a cell or flag.
const VOID: Slot = Slot {
    series: u32::MAX,
    cell: u32::MAX,
};

macro_rules! family_id {
    ($(#[$doc:meta])* $vec:ident, $(#[$idoc:meta])* $id:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub struct $vec(Layout);

        impl $vec {
            /// The series with these label value indexes, one per label in
            /// declared order (`&[]` for a family without labels). `None`
            /// if the count or an index is out of range.
            #[inline]
            pub fn at(self, idx: &[usize]) -> Option<$id> {
                self.0.slot(idx).map(|slot| $id { family: self.0.family, slot })
            }

            /// The series of a family without labels.
            pub fn single(self) -> Option<$id> {
                self.at(&[])
            }

            /// Like [`at`](Self::at), but infallible for hot paths: an
            /// out-of-range index gives a void series whose updates are
            /// ignored (typed wrappers index with enums, so this never
            /// happens in practice).
            #[inline]
            pub fn series(self, idx: &[usize]) -> $id {
                $id {
                    family: self.0.family,
                    slot: self.0.slot(idx).unwrap_or(VOID),
                }
            }

            /// Number of series (the product of the label value counts).
            pub fn len(self) -> usize {
                self.0.series_count()
            }

            /// Whether the family has no series (a label with no values).
            pub fn is_empty(self) -> bool {
                self.len() == 0
            }
        }

        $(#[$idoc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub struct $id {
            family: u16,
            slot: Slot,
        }
    };
}

family_id!(
    /// A counter family with fixed label values (from
    /// [`RegistryBuilder::counter_vec`]).
    CounterVec,
    /// One counter series.
    CounterId
);
family_id!(
    /// A gauge family with fixed label values (from
    /// [`RegistryBuilder::gauge_vec`]).
    GaugeVec,
    /// One gauge series.
    GaugeId
);
family_id!(
    /// A histogram family with fixed label values (from
    /// [`RegistryBuilder::histogram_vec`]).
    HistogramVec,
    /// One histogram series.
    HistogramId
);

/// A counter family whose label values are only known at run time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DynamicCounterVec {
    family: u16,
}

/// A histogram family whose label values are only known at run time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DynamicHistogramVec {
    family: u16,
}

// ----- families --------------------------------------------------------------

/// A declared family.
struct Family {
    name: &'static str,
    help: &'static str,
    ty: MetricType,
    kind: FamilyKind,
}

enum FamilyKind {
    Fixed(Fixed),
    Dynamic(Dynamic),
    Process(ProcessMetric),
}

/// Storage description of a fixed family.
struct Fixed {
    layout: Layout,
    /// Histogram upper bounds (empty for counters and gauges).
    bounds: Box<[f64]>,
    /// The bounds pre-formatted for the `le` label.
    le: Box<[String]>,
    /// Per series (in series order): the label pairs as written inside the
    /// braces, sorted by label name and escaped (empty without labels).
    labels: Box<[String]>,
    /// Series indexes (relative to the family) in exposition order.
    order: Box<[u32]>,
}

/// A dynamic family: a locked table of series.
struct Dynamic {
    labels: Box<[&'static str]>,
    /// Label positions in label-name order.
    sorted: Box<[usize]>,
    bounds: Box<[f64]>,
    le: Box<[String]>,
    // Not on any data path: updated by lease bookkeeping a few times a
    // minute, read by scrapes.
    #[allow(clippy::disallowed_types)]
    table: std::sync::Mutex<Vec<DynamicSeries>>,
}

struct DynamicSeries {
    values: Box<[Box<str>]>,
    /// Counter value, or histogram count per bucket (`+Inf` last).
    counts: Box<[u64]>,
    sum: f64,
}

impl Dynamic {
    #[allow(clippy::disallowed_types)]
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<DynamicSeries>> {
        self.table
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Applies `update` to the series with `values`, creating it if there is
    /// room.
    fn update(&self, values: &[&str], update: impl FnOnce(&mut DynamicSeries)) {
        if values.len() != self.labels.len() {
            return;
        }
        let mut table = self.lock();
        let found = table
            .iter()
            .position(|s| s.values.iter().map(|v| &**v).eq(values.iter().copied()));
        let index = match found {
            Some(i) => i,
            None if table.len() < DYNAMIC_SERIES_LIMIT => {
                table.push(DynamicSeries {
                    values: values.iter().map(|&v| Box::from(v)).collect(),
                    counts: vec![0; self.bounds.len() + 1].into_boxed_slice(),
                    sum: 0.0,
                });
                table.len() - 1
            }
            None => return,
        };
        if let Some(series) = table.get_mut(index) {
            update(series);
        }
    }
}

// ----- builder ---------------------------------------------------------------

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

const SCRAPE_CODES: [&str; 3] = ["200", "500", "503"];

#[derive(Debug, Clone, Copy)]
struct ScrapeIds {
    in_flight: GaugeVec,
    total: CounterVec,
}

// ----- storage ---------------------------------------------------------------

#[repr(align(128))]
struct Line([AtomicU64; LINE_CELLS]);

#[repr(align(128))]
struct FlagLine([AtomicU8; FLAG_LINE]);

/// Cells and touched flags of one core (or of the global area). The
/// alignment keeps two cores' cells off each other's cache lines.
struct Slab {
    lines: Box<[Line]>,
    flags: Box<[FlagLine]>,
    claimed: AtomicBool,
}

impl Slab {
    fn new(cells: usize, series: usize) -> Self {
        Self {
            lines: (0..cells.div_ceil(LINE_CELLS))
                .map(|_| Line(std::array::from_fn(|_| AtomicU64::new(0))))
                .collect(),
            flags: (0..series.div_ceil(FLAG_LINE))
                .map(|_| FlagLine(std::array::from_fn(|_| AtomicU8::new(0))))
                .collect(),
            claimed: AtomicBool::new(false),
        }
    }

    #[inline]
    fn cell(&self, cell: u32) -> Option<&AtomicU64> {
        let cell = cell as usize;
        self.lines.get(cell / LINE_CELLS)?.0.get(cell % LINE_CELLS)
    }

    #[inline]
    fn flag(&self, series: u32) -> Option<&AtomicU8> {
        let series = series as usize;
        self.flags
            .get(series / FLAG_LINE)?
            .0
            .get(series % FLAG_LINE)
    }

    fn load(&self, cell: u32) -> u64 {
        self.cell(cell).map_or(0, |c| c.load(Relaxed))
    }

    fn touched(&self, series: u32) -> bool {
        self.flag(series).is_some_and(|f| f.load(Relaxed) != 0)
    }

    /// Single-writer add: only the owning core writes this cell.
    #[inline]
    fn local_add(&self, cell: u32, n: u64) {
        if let Some(c) = self.cell(cell) {
            c.store(c.load(Relaxed).wrapping_add(n), Relaxed);
        }
    }

    #[inline]
    fn local_touch(&self, series: u32) {
        if let Some(f) = self.flag(series) {
            f.store(1, Relaxed);
        }
    }
}

struct Inner {
    global: Slab,
    slabs: Box<[Arc<Slab>]>,
    families: Vec<Family>,
    /// Family indexes sorted by name.
    order: Box<[usize]>,
    scrape: Option<ScrapeIds>,
}

impl Inner {
    fn bounds(&self, family: u16) -> &[f64] {
        match self.families.get(usize::from(family)).map(|f| &f.kind) {
            Some(FamilyKind::Fixed(f)) => &f.bounds,
            _ => &[],
        }
    }

    fn dynamic(&self, family: u16) -> Option<&Dynamic> {
        match self.families.get(usize::from(family)).map(|f| &f.kind) {
            Some(FamilyKind::Dynamic(d)) => Some(d),
            _ => None,
        }
    }

    /// Every storage area: the global one, then the slabs.
    fn areas(&self) -> impl Iterator<Item = &Slab> {
        std::iter::once(&self.global).chain(self.slabs.iter().map(|s| &**s))
    }

    fn sum_u64(&self, cell: u32) -> u64 {
        self.areas()
            .fold(0u64, |acc, s| acc.wrapping_add(s.load(cell)))
    }

    fn sum_f64(&self, cell: u32) -> f64 {
        self.areas()
            .fold(0.0, |acc, s| acc + f64::from_bits(s.load(cell)))
    }

    fn touched(&self, series: u32) -> bool {
        self.areas().any(|s| s.touched(series))
    }
}

/// Index of the bucket `v` falls into (`bounds.len()` for `+Inf`, also for
/// NaN, as in Go).
#[inline]
fn bucket_index(bounds: &[f64], v: f64) -> usize {
    bounds.iter().position(|&b| v <= b).unwrap_or(bounds.len())
}

// ----- registry --------------------------------------------------------------

/// The metric registry: families, per-core slabs and the global area. Cheap
/// to clone (shared), usable from any thread.
#[derive(Clone)]
pub struct Registry {
    inner: Arc<Inner>,
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
        if let Some(d) = self.inner.dynamic(family.family) {
            d.update(values, |s| {
                if let Some(c) = s.counts.first_mut() {
                    *c = c.wrapping_add(n);
                }
            });
        }
    }

    /// Records `v` in the dynamic histogram series with `values`.
    pub fn dynamic_histogram_observe(&self, family: DynamicHistogramVec, values: &[&str], v: f64) {
        if let Some(d) = self.inner.dynamic(family.family) {
            let i = bucket_index(&d.bounds, v);
            d.update(values, |s| {
                if let Some(c) = s.counts.get_mut(i) {
                    *c += 1;
                }
                s.sum += v;
            });
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
        match &family.kind {
            FamilyKind::Fixed(fixed) => self.render_fixed(&mut body, family, fixed),
            FamilyKind::Dynamic(dynamic) => render_dynamic(&mut body, family, dynamic),
            FamilyKind::Process(metric) => {
                if let Some(v) = metric.value(snap) {
                    write_sample(&mut body, family.name, "", "", None, v);
                }
            }
        }
        if body.is_empty() {
            return;
        }
        out.extend_from_slice(b"# HELP ");
        out.extend_from_slice(family.name.as_bytes());
        out.push(b' ');
        text::write_escaped_help(out, family.help);
        out.extend_from_slice(b"\n# TYPE ");
        out.extend_from_slice(family.name.as_bytes());
        out.push(b' ');
        out.extend_from_slice(family.ty.as_str().as_bytes());
        out.push(b'\n');
        out.extend_from_slice(&body);
    }

    fn render_fixed(&self, out: &mut Vec<u8>, family: &Family, fixed: &Fixed) {
        let layout = &fixed.layout;
        let inner = &self.inner;
        for &rel in fixed.order.iter() {
            let series = layout.first_series + rel;
            let cell = layout.first_cell + rel * layout.cells_per_series;
            let labels = fixed.labels.get(rel as usize).map_or("", String::as_str);
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

fn render_dynamic(out: &mut Vec<u8>, family: &Family, dynamic: &Dynamic) {
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
            (key, String::from_utf8(text).unwrap_or_default(), s)
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

// ----- per-core handles ------------------------------------------------------

/// One core's writing handle on the registry. Increments through it touch
/// only this core's cache lines. `Send` (hand it to the worker it is for) but
/// not `Sync`: share it between the tasks of one worker with `Rc`.
pub struct CoreMetrics {
    registry: Registry,
    slab: Arc<Slab>,
    index: usize,
    _not_sync: PhantomData<Cell<()>>,
}

impl fmt::Debug for CoreMetrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CoreMetrics")
            .field("index", &self.index)
            .finish_non_exhaustive()
    }
}

impl Drop for CoreMetrics {
    fn drop(&mut self) {
        self.slab.claimed.store(false, Relaxed);
    }
}

impl CoreMetrics {
    /// The slab index this handle writes.
    pub fn index(&self) -> usize {
        self.index
    }

    /// The registry this handle belongs to.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// This core's view of a counter.
    #[inline]
    pub fn counter(&self, id: CounterId) -> LocalCounter<'_> {
        LocalCounter {
            slab: &self.slab,
            slot: id.slot,
        }
    }

    /// This core's share of a gauge.
    #[inline]
    pub fn gauge(&self, id: GaugeId) -> LocalGauge<'_> {
        LocalGauge {
            slab: &self.slab,
            slot: id.slot,
        }
    }

    /// This core's part of a histogram.
    #[inline]
    pub fn histogram(&self, id: HistogramId) -> LocalHistogram<'_> {
        LocalHistogram {
            slab: &self.slab,
            slot: id.slot,
            bounds: self.registry.inner.bounds(id.family),
        }
    }
}

/// A counter series on the current core's slab.
#[derive(Clone, Copy)]
pub struct LocalCounter<'a> {
    slab: &'a Slab,
    slot: Slot,
}

impl LocalCounter<'_> {
    /// Adds one.
    #[inline]
    pub fn inc(self) {
        self.slab.local_add(self.slot.cell, 1);
    }

    /// Adds `n` (`add(0)` makes the series appear, like Go's `Add(0)`).
    #[inline]
    pub fn add(self, n: u64) {
        if n == 0 {
            self.touch();
        }
        self.slab.local_add(self.slot.cell, n);
    }

    /// Makes the series appear in scrapes with its current value.
    pub fn touch(self) {
        self.slab.local_touch(self.slot.series);
    }

    /// This core's part of the count.
    pub fn get(self) -> u64 {
        self.slab.load(self.slot.cell)
    }
}

/// A gauge series: this core's signed share of the value.
#[derive(Clone, Copy)]
pub struct LocalGauge<'a> {
    slab: &'a Slab,
    slot: Slot,
}

impl LocalGauge<'_> {
    /// Adds one.
    #[inline]
    pub fn inc(self) {
        self.add(1.0);
    }

    /// Subtracts one.
    #[inline]
    pub fn dec(self) {
        self.add(-1.0);
    }

    /// Adds `v` (may be negative).
    #[inline]
    pub fn add(self, v: f64) {
        self.slab.local_touch(self.slot.series);
        if let Some(c) = self.slab.cell(self.slot.cell) {
            c.store((f64::from_bits(c.load(Relaxed)) + v).to_bits(), Relaxed);
        }
    }

    /// Sets this core's share to `v`.
    #[inline]
    pub fn set(self, v: f64) {
        self.slab.local_touch(self.slot.series);
        if let Some(c) = self.slab.cell(self.slot.cell) {
            c.store(v.to_bits(), Relaxed);
        }
    }

    /// Makes the series appear in scrapes with its current value.
    pub fn touch(self) {
        self.slab.local_touch(self.slot.series);
    }

    /// This core's share.
    pub fn get(self) -> f64 {
        f64::from_bits(self.slab.load(self.slot.cell))
    }
}

/// A histogram series on the current core's slab.
#[derive(Clone, Copy)]
pub struct LocalHistogram<'a> {
    slab: &'a Slab,
    slot: Slot,
    bounds: &'a [f64],
}

impl LocalHistogram<'_> {
    /// Records one observation.
    #[inline]
    pub fn observe(self, v: f64) {
        let i = bucket_index(self.bounds, v) as u32;
        self.slab.local_add(self.slot.cell.saturating_add(i), 1);
        let sum = self.slot.cell.saturating_add(self.bounds.len() as u32 + 1);
        if let Some(c) = self.slab.cell(sum) {
            c.store((f64::from_bits(c.load(Relaxed)) + v).to_bits(), Relaxed);
        }
    }

    /// Records a duration in seconds (as Go's `Duration.Seconds()`).
    #[inline]
    pub fn observe_duration(self, d: Duration) {
        self.observe(d.as_secs_f64());
    }

    /// Makes the series appear in scrapes even without observations.
    pub fn touch(self) {
        self.slab.local_touch(self.slot.series);
    }
}

// ----- any-thread handles ----------------------------------------------------

/// A counter series updated from any thread.
#[derive(Clone, Copy)]
pub struct SharedCounter<'a> {
    slab: &'a Slab,
    slot: Slot,
}

impl SharedCounter<'_> {
    /// Adds one.
    pub fn inc(self) {
        self.add(1);
    }

    /// Adds `n`.
    pub fn add(self, n: u64) {
        if n == 0 {
            self.touch();
        }
        if let Some(c) = self.slab.cell(self.slot.cell) {
            c.fetch_add(n, Relaxed);
        }
    }

    /// Makes the series appear in scrapes with its current value.
    pub fn touch(self) {
        self.slab.local_touch(self.slot.series);
    }
}

/// A gauge series updated from any thread (the global part of its value).
#[derive(Clone, Copy)]
pub struct SharedGauge<'a> {
    slab: &'a Slab,
    slot: Slot,
}

impl SharedGauge<'_> {
    /// Adds one.
    pub fn inc(self) {
        self.add(1.0);
    }

    /// Subtracts one.
    pub fn dec(self) {
        self.add(-1.0);
    }

    /// Adds `v` (may be negative).
    pub fn add(self, v: f64) {
        self.touch();
        if let Some(c) = self.slab.cell(self.slot.cell) {
            let _ = c.fetch_update(Relaxed, Relaxed, |bits| {
                Some((f64::from_bits(bits) + v).to_bits())
            });
        }
    }

    /// Sets the global part to `v` (the last writer wins, as in Go).
    pub fn set(self, v: f64) {
        self.touch();
        if let Some(c) = self.slab.cell(self.slot.cell) {
            c.store(v.to_bits(), Relaxed);
        }
    }

    /// Makes the series appear in scrapes with its current value.
    pub fn touch(self) {
        self.slab.local_touch(self.slot.series);
    }
}

/// A histogram series observed from any thread.
#[derive(Clone, Copy)]
pub struct SharedHistogram<'a> {
    slab: &'a Slab,
    slot: Slot,
    bounds: &'a [f64],
}

impl SharedHistogram<'_> {
    /// Records one observation.
    pub fn observe(self, v: f64) {
        let i = bucket_index(self.bounds, v) as u32;
        if let Some(c) = self.slab.cell(self.slot.cell.saturating_add(i)) {
            c.fetch_add(1, Relaxed);
        }
        let sum = self.slot.cell.saturating_add(self.bounds.len() as u32 + 1);
        if let Some(c) = self.slab.cell(sum) {
            let _ = c.fetch_update(Relaxed, Relaxed, |bits| {
                Some((f64::from_bits(bits) + v).to_bits())
            });
        }
    }

    /// Records a duration in seconds.
    pub fn observe_duration(self, d: Duration) {
        self.observe(d.as_secs_f64());
    }

    /// Makes the series appear in scrapes even without observations.
    pub fn touch(self) {
        self.slab.local_touch(self.slot.series);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small() -> (Registry, CounterVec, GaugeVec, HistogramVec) {
        let mut b = Registry::builder();
        let c = b.counter_vec(
            "c_total",
            "C.",
            &["seg", "kind"],
            &[&["b", "a"], &["x", "y", "z"]],
        );
        let g = b.gauge("g", "G.");
        let h = b.histogram("h_seconds", "H.", &[0.5, 1.0]);
        (b.build(2), c, g, h)
    }

    #[test]
    fn mixed_radix_slots() {
        let (_, c, _, h) = small();
        assert_eq!(c.len(), 6);
        let at = |i: &[usize]| c.at(i).map(|id| (id.slot.series, id.slot.cell));
        assert_eq!(at(&[0, 0]), Some((0, 0)));
        assert_eq!(at(&[0, 2]), Some((2, 2)));
        assert_eq!(at(&[1, 0]), Some((3, 3)));
        assert_eq!(at(&[1, 2]), Some((5, 5)));
        assert_eq!(at(&[2, 0]), None);
        assert_eq!(at(&[0, 3]), None);
        assert_eq!(at(&[0]), None);
        // The histogram comes after the counter (6 cells) and the gauge (1):
        // 2 bounds + Inf + sum = 4 cells.
        let hid = h.single().unwrap();
        assert_eq!((hid.slot.series, hid.slot.cell), (7, 7));
    }

    #[test]
    fn void_series_ignore_updates() {
        let (reg, c, g, h) = small();
        let core = reg.claim(0).unwrap();
        let void = c.series(&[9, 9]);
        core.counter(void).inc();
        core.counter(void).add(0);
        reg.counter(void).inc();
        core.gauge(g.series(&[1])).inc();
        let hv = h.series(&[0]);
        core.histogram(hv).observe(1.0);
        reg.histogram(hv).observe(1.0);
        assert_eq!(reg.histogram_value(hv), (0, 0.0));
        assert_eq!(reg.counter_value(void), 0);
        assert_eq!(reg.render_to_string(), "");
        assert_eq!(c.series(&[1, 1]), c.at(&[1, 1]).unwrap());
    }

    #[test]
    fn claims_are_exclusive_and_released() {
        let (reg, ..) = small();
        let a = reg.claim(0).unwrap();
        assert!(reg.claim(0).is_none());
        assert!(reg.claim(2).is_none());
        let b = reg.claim(1).unwrap();
        assert_eq!((a.index(), b.index()), (0, 1));
        drop(a);
        assert!(reg.claim(0).is_some());
    }

    #[test]
    fn series_order_and_presence() {
        let (reg, c, g, h) = small();
        let core = reg.claim(0).unwrap();
        core.counter(c.at(&[0, 1]).unwrap()).inc(); // seg=b kind=y
        core.counter(c.at(&[1, 2]).unwrap()).add(0); // seg=a kind=z, touched at 0
        core.counter(c.at(&[1, 0]).unwrap()).add(2); // seg=a kind=x
        let text = reg.render_to_string();
        assert_eq!(
            text,
            "# HELP c_total C.\n# TYPE c_total counter\n\
             c_total{kind=\"x\",seg=\"a\"} 2\n\
             c_total{kind=\"y\",seg=\"b\"} 1\n\
             c_total{kind=\"z\",seg=\"a\"} 0\n"
        );
        reg.gauge(g.single().unwrap()).set(5.0);
        core.gauge(g.single().unwrap()).dec();
        core.histogram(h.single().unwrap()).observe(0.7);
        let text = reg.render_to_string();
        assert!(text.contains("# TYPE g gauge\ng 4\n"), "{text}");
        assert!(
            text.contains(
                "h_seconds_bucket{le=\"0.5\"} 0\nh_seconds_bucket{le=\"1\"} 1\n\
                 h_seconds_bucket{le=\"+Inf\"} 1\nh_seconds_sum 0.7\nh_seconds_count 1\n"
            ),
            "{text}"
        );
        assert_eq!(reg.histogram_value(h.single().unwrap()), (1, 0.7));
    }

    #[test]
    fn dynamic_families_sort_and_cap() {
        let mut b = Registry::builder();
        let d = b.dynamic_counter_vec("d_total", "D.", &["z", "a"]);
        let dh = b.dynamic_histogram_vec("dh", "DH.", &[1.0], &["code"]);
        let reg = b.build(0);
        assert_eq!(reg.render_to_string(), "", "no series, no family");
        reg.dynamic_counter_add(d, &["1", "b"], 1);
        reg.dynamic_counter_add(d, &["2", "a"], 3);
        reg.dynamic_counter_add(d, &["1", "b"], 1);
        reg.dynamic_counter_add(d, &["wrong arity"], 1);
        reg.dynamic_histogram_observe(dh, &["200"], 0.5);
        assert_eq!(
            reg.render_to_string(),
            "# HELP d_total D.\n# TYPE d_total counter\n\
             d_total{a=\"a\",z=\"2\"} 3\nd_total{a=\"b\",z=\"1\"} 2\n\
             # HELP dh DH.\n# TYPE dh histogram\n\
             dh_bucket{code=\"200\",le=\"1\"} 1\ndh_bucket{code=\"200\",le=\"+Inf\"} 1\n\
             dh_sum{code=\"200\"} 0.5\ndh_count{code=\"200\"} 1\n"
        );
        for i in 0..DYNAMIC_SERIES_LIMIT + 10 {
            reg.dynamic_counter_add(d, &["x", &i.to_string()], 1);
        }
        let lines = reg
            .render_to_string()
            .lines()
            .filter(|l| l.starts_with("d_total"))
            .count();
        assert_eq!(lines, DYNAMIC_SERIES_LIMIT);
    }

    #[test]
    #[should_panic(expected = "invalid metric name")]
    fn bad_names_are_caught_at_build() {
        Registry::builder().counter("bad-name", "");
    }

    #[test]
    #[should_panic(expected = "strictly increasing")]
    fn bad_buckets_are_caught_at_build() {
        Registry::builder().histogram("h", "", &[1.0, 1.0]);
    }

    #[test]
    fn nan_goes_to_inf_bucket() {
        assert_eq!(bucket_index(&[1.0, 2.0], f64::NAN), 2);
        assert_eq!(bucket_index(&[1.0, 2.0], 1.0), 0);
        assert_eq!(bucket_index(&[1.0, 2.0], 1.5), 1);
        assert_eq!(bucket_index(&[], 1.5), 0);
    }
}
