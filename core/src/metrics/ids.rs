//! Identifiers of families and series: a fixed family's [`Layout`] (where
//! its series and cells start, mixed-radix numbering of its label values)
//! and the typed handles the binaries keep (`CounterVec` → `CounterId`, …).
//! An id is only an index; updates go through a
//! [`CoreMetrics`](super::CoreMetrics) or the [`Registry`](super::Registry).

use super::MAX_FIXED_LABELS;

/// Position of one series: its index and its first cell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Slot {
    pub(super) series: u32,
    pub(super) cell: u32,
}

/// A family's layout: where its series and cells start, and the number of
/// values of each label (mixed-radix series numbering, first label most
/// significant).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Layout {
    pub(super) family: u16,
    pub(super) first_series: u32,
    pub(super) first_cell: u32,
    pub(super) cells_per_series: u32,
    pub(super) dims: [u16; MAX_FIXED_LABELS],
    pub(super) rank: u8,
}

impl Layout {
    /// The slot for label value indexes `idx` (one per label, in declared
    /// order), or `None` if their number or any value is out of range.
    #[inline]
    pub(super) fn slot(&self, idx: &[usize]) -> Option<Slot> {
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

    pub(super) fn series_count(&self) -> usize {
        self.dims
            .iter()
            .take(usize::from(self.rank))
            .map(|&d| usize::from(d))
            .product()
    }
}

/// The slot of an out-of-range series: no slab has such a cell or flag.
pub(super) const VOID: Slot = Slot {
    series: u32::MAX,
    cell: u32::MAX,
};

macro_rules! family_id {
    ($(#[$doc:meta])* $vec:ident, $(#[$idoc:meta])* $id:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub struct $vec(pub(super) Layout);

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
            pub(super) family: u16,
            pub(super) slot: Slot,
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
    pub(super) family: u16,
}

/// A histogram family whose label values are only known at run time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DynamicHistogramVec {
    pub(super) family: u16,
}
