//! Update handles. [`CoreMetrics`] is one worker's claim on its slab;
//! its `Local*` handles write with relaxed load + store (single writer, no
//! read-modify-write). The `Shared*` handles of
//! [`Registry`](super::Registry) write the global area with `fetch_add`
//! from any thread, off the data path.

use std::cell::Cell;
use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use super::ids::{CounterId, GaugeId, HistogramId, Slot};
use super::registry::Registry;
use super::slab::{Slab, bucket_index};

/// One core's writing handle on the registry. Increments through it touch
/// only this core's cache lines. `Send` (hand it to the worker it is for) but
/// not `Sync`: share it between the tasks of one worker with `Rc`.
pub struct CoreMetrics {
    pub(super) registry: Registry,
    pub(super) slab: Arc<Slab>,
    pub(super) index: usize,
    pub(super) _not_sync: PhantomData<Cell<()>>,
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
    pub(super) slab: &'a Slab,
    pub(super) slot: Slot,
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
    pub(super) slab: &'a Slab,
    pub(super) slot: Slot,
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
    pub(super) slab: &'a Slab,
    pub(super) slot: Slot,
    pub(super) bounds: &'a [f64],
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

/// A counter series updated from any thread.
#[derive(Clone, Copy)]
pub struct SharedCounter<'a> {
    pub(super) slab: &'a Slab,
    pub(super) slot: Slot,
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
    pub(super) slab: &'a Slab,
    pub(super) slot: Slot,
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
    pub(super) slab: &'a Slab,
    pub(super) slot: Slot,
    pub(super) bounds: &'a [f64],
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
