//! What the registry knows of each declared family: its name, help and
//! type, and where its values live — a [`Fixed`] layout in the slabs, a
//! [`Dynamic`] locked table (label values known only at run time, capped
//! at [`DYNAMIC_SERIES_LIMIT`] series), or a `process_*` value read at
//! scrape time.

use super::MetricType;
use super::ids::Layout;
use super::process::ProcessMetric;

/// A declared family.
pub(super) struct Family {
    pub(super) name: &'static str,
    pub(super) help: &'static str,
    pub(super) ty: MetricType,
    pub(super) kind: FamilyKind,
}

pub(super) enum FamilyKind {
    Fixed(Fixed),
    Dynamic(Dynamic),
    Process(ProcessMetric),
}

/// Storage description of a fixed family.
pub(super) struct Fixed {
    pub(super) layout: Layout,
    /// Histogram upper bounds (empty for counters and gauges).
    pub(super) bounds: Box<[f64]>,
    /// The bounds pre-formatted for the `le` label.
    pub(super) le: Box<[String]>,
    /// Per series (in series order): the label pairs as written inside the
    /// braces, sorted by label name and escaped (empty without labels).
    pub(super) labels: Box<[String]>,
    /// Series indexes (relative to the family) in exposition order.
    pub(super) order: Box<[u32]>,
}

/// A dynamic family: a locked table of series.
pub(super) struct Dynamic {
    pub(super) labels: Box<[&'static str]>,
    /// Label positions in label-name order.
    pub(super) sorted: Box<[usize]>,
    pub(super) bounds: Box<[f64]>,
    pub(super) le: Box<[String]>,
    /// Most series kept (settable at run time: a flag may set it).
    pub(super) limit: std::sync::atomic::AtomicUsize,
    // Not on any data path: updated by lease bookkeeping a few times a
    // minute, read by scrapes.
    #[allow(clippy::disallowed_types)]
    pub(super) table: std::sync::Mutex<Vec<DynamicSeries>>,
}

pub(super) struct DynamicSeries {
    pub(super) values: Box<[Box<str>]>,
    /// Counter value, or histogram count per bucket (`+Inf` last).
    pub(super) counts: Box<[u64]>,
    pub(super) sum: f64,
}

impl Dynamic {
    #[allow(clippy::disallowed_types)]
    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, Vec<DynamicSeries>> {
        self.table
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Applies `update` to the series with `values`, creating it if there is
    /// room; when there is none, to the series with `overflow` (created
    /// beyond the limit if need be), if given.
    pub(super) fn update(
        &self,
        values: &[&str],
        overflow: Option<&[&str]>,
        update: impl FnOnce(&mut DynamicSeries),
    ) {
        if values.len() != self.labels.len() {
            return;
        }
        let mut table = self.lock();
        let find = |t: &[DynamicSeries], values: &[&str]| {
            t.iter()
                .position(|s| s.values.iter().map(|v| &**v).eq(values.iter().copied()))
        };
        let new = |values: &[&str]| DynamicSeries {
            values: values.iter().map(|&v| Box::from(v)).collect(),
            counts: vec![0; self.bounds.len() + 1].into_boxed_slice(),
            sum: 0.0,
        };
        let index = match find(&table, values) {
            Some(i) => i,
            None if table.len() < self.limit.load(std::sync::atomic::Ordering::Relaxed) => {
                table.push(new(values));
                table.len() - 1
            }
            None => match overflow.filter(|o| o.len() == self.labels.len()) {
                Some(o) => match find(&table, o) {
                    Some(i) => i,
                    None => {
                        table.push(new(o));
                        table.len() - 1
                    }
                },
                None => return,
            },
        };
        if let Some(series) = table.get_mut(index) {
            update(series);
        }
    }

    /// Removes every series whose label `label` (declared position) is
    /// `value`.
    pub(super) fn remove(&self, label: usize, value: &str) {
        self.lock()
            .retain(|s| s.values.get(label).is_none_or(|v| &**v != value));
    }
}
