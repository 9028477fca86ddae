//! Where values live: one [`Slab`] of cache-line-aligned cells and
//! touched flags per core plus a global one, and [`Inner`], the shared
//! state behind a [`Registry`](super::Registry) that sums them at scrape
//! time.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering::Relaxed};

use super::builder::ScrapeIds;
use super::family::{Dynamic, Family, FamilyKind};

/// Cells per cache-line-aligned block of a slab.
const LINE_CELLS: usize = 16;

/// Touched flags per aligned block.
const FLAG_LINE: usize = 128;

#[repr(align(128))]
struct Line([AtomicU64; LINE_CELLS]);

#[repr(align(128))]
struct FlagLine([AtomicU8; FLAG_LINE]);

/// Cells and touched flags of one core (or of the global area). The
/// alignment keeps two cores' cells off each other's cache lines.
pub(super) struct Slab {
    lines: Box<[Line]>,
    flags: Box<[FlagLine]>,
    pub(super) claimed: AtomicBool,
}

impl Slab {
    pub(super) fn new(cells: usize, series: usize) -> Self {
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
    pub(super) fn cell(&self, cell: u32) -> Option<&AtomicU64> {
        let cell = cell as usize;
        self.lines.get(cell / LINE_CELLS)?.0.get(cell % LINE_CELLS)
    }

    #[inline]
    pub(super) fn flag(&self, series: u32) -> Option<&AtomicU8> {
        let series = series as usize;
        self.flags
            .get(series / FLAG_LINE)?
            .0
            .get(series % FLAG_LINE)
    }

    pub(super) fn load(&self, cell: u32) -> u64 {
        self.cell(cell).map_or(0, |c| c.load(Relaxed))
    }

    pub(super) fn touched(&self, series: u32) -> bool {
        self.flag(series).is_some_and(|f| f.load(Relaxed) != 0)
    }

    /// Single-writer add: only the owning core writes this cell.
    #[inline]
    pub(super) fn local_add(&self, cell: u32, n: u64) {
        if let Some(c) = self.cell(cell) {
            c.store(c.load(Relaxed).wrapping_add(n), Relaxed);
        }
    }

    #[inline]
    pub(super) fn local_touch(&self, series: u32) {
        if let Some(f) = self.flag(series) {
            f.store(1, Relaxed);
        }
    }
}

pub(super) struct Inner {
    pub(super) global: Slab,
    pub(super) slabs: Box<[Arc<Slab>]>,
    pub(super) families: Vec<Family>,
    /// Family indexes sorted by name.
    pub(super) order: Box<[usize]>,
    pub(super) scrape: Option<ScrapeIds>,
}

impl Inner {
    pub(super) fn bounds(&self, family: u16) -> &[f64] {
        match self.families.get(usize::from(family)).map(|f| &f.kind) {
            Some(FamilyKind::Fixed(f)) => &f.bounds,
            _ => &[],
        }
    }

    pub(super) fn dynamic(&self, family: u16) -> Option<&Dynamic> {
        match self.families.get(usize::from(family)).map(|f| &f.kind) {
            Some(FamilyKind::Dynamic(d)) => Some(d),
            _ => None,
        }
    }

    /// Every storage area: the global one, then the slabs.
    pub(super) fn areas(&self) -> impl Iterator<Item = &Slab> {
        std::iter::once(&self.global).chain(self.slabs.iter().map(|s| &**s))
    }

    pub(super) fn sum_u64(&self, cell: u32) -> u64 {
        self.areas()
            .fold(0u64, |acc, s| acc.wrapping_add(s.load(cell)))
    }

    pub(super) fn sum_f64(&self, cell: u32) -> f64 {
        self.areas()
            .fold(0.0, |acc, s| acc + f64::from_bits(s.load(cell)))
    }

    pub(super) fn touched(&self, series: u32) -> bool {
        self.areas().any(|s| s.touched(series))
    }
}

/// Index of the bucket `v` falls into (`bounds.len()` for `+Inf`, also for
/// NaN, as in Go).
#[inline]
pub(super) fn bucket_index(bounds: &[f64], v: f64) -> usize {
    bounds.iter().position(|&b| v <= b).unwrap_or(bounds.len())
}
