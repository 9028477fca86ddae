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
//!
//! # Layout of this module
//!
//! `ids` (family and series identifiers), `family` (what is known of a
//! declared family), `builder` ([`RegistryBuilder`]), `slab` (per-core and
//! global storage), `registry` ([`Registry`] and the exposition), `handle`
//! ([`CoreMetrics`] and the update handles).

mod builder;
pub mod common;
mod family;
mod handle;
mod ids;
mod process;
mod registry;
mod slab;
pub mod text;

pub use builder::RegistryBuilder;
pub use handle::{
    CoreMetrics, LocalCounter, LocalGauge, LocalHistogram, SharedCounter, SharedGauge,
    SharedHistogram,
};
pub use ids::{
    CounterId, CounterVec, DynamicCounterVec, DynamicHistogramVec, GaugeId, GaugeVec, HistogramId,
    HistogramVec,
};
pub use registry::Registry;

/// Most series a dynamic family keeps; updates for new label values beyond
/// it are dropped (a guard against unbounded label values such as error
/// reasons).
pub const DYNAMIC_SERIES_LIMIT: usize = 256;

/// Most labels a family with fixed label values may have.
pub const MAX_FIXED_LABELS: usize = 4;

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

#[cfg(test)]
mod tests;
