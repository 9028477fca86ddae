//! Listings the workers publish for an admin endpoint that shows state
//! living on every worker (`/debug/connections` of both binaries).
//!
//! A worker's connections are `Rc`/`Cell` state of that worker, so the
//! worker serving the admin request cannot read another's. Instead each
//! worker publishes a listing (plain data, `Send`) into its slot of a
//! [`Board`] while someone is looking: for [`WATCH`] after a request, at
//! most every [`REFRESH`]. The request's worker reads its own state live
//! and the others' latest listings; a listing older than [`FRESH`] is left
//! out and counted as missing, so the answer can say it is incomplete (the
//! first request after a quiet minute: ask again after a second) instead
//! of showing connections that may be long gone.
//!
//! Nothing here runs per packet: publishing walks a worker's connections
//! once per [`REFRESH`] while watched, and not at all otherwise.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use crossbeam_queue::ArrayQueue;

/// How often a worker publishes at most while someone looks.
pub const REFRESH: Duration = Duration::from_millis(500);

/// How long after a request the workers keep publishing.
pub const WATCH: Duration = Duration::from_secs(60);

/// A listing older than this is left out of an answer.
pub const FRESH: Duration = Duration::from_secs(3);

/// One slot per worker (see the module docs).
#[derive(Debug)]
pub struct Board<T> {
    slots: Box<[Slot<T>]>,
    /// When the endpoint was last asked (ms since `epoch`; 0: never).
    asked: AtomicU64,
    epoch: Instant,
}

#[derive(Debug)]
struct Slot<T> {
    latest: ArrayQueue<Arc<Vec<T>>>,
    /// When it was last published (ms since the board's epoch; 0: never).
    at: AtomicU64,
}

/// What [`Board::collect`] found.
#[derive(Debug)]
pub struct Listings<T> {
    /// The other workers' fresh listings.
    pub lists: Vec<Arc<Vec<T>>>,
    /// Workers (besides the asking one) without a fresh listing.
    pub missing: usize,
}

impl<T> Board<T> {
    /// A board for `workers` workers; `epoch` is any fixed instant not
    /// after the first `now` given.
    pub fn new(workers: usize, epoch: Instant) -> Self {
        Self {
            slots: (0..workers.max(1))
                .map(|_| Slot {
                    latest: ArrayQueue::new(1),
                    at: AtomicU64::new(0),
                })
                .collect(),
            asked: AtomicU64::new(0),
            epoch,
        }
    }

    /// Slots (workers).
    pub fn workers(&self) -> usize {
        self.slots.len()
    }

    fn ms(&self, t: Instant) -> u64 {
        // At least 1: 0 means "never".
        u64::try_from(t.saturating_duration_since(self.epoch).as_millis())
            .unwrap_or(u64::MAX)
            .max(1)
    }

    /// Whether someone asked in the last [`WATCH`] before `now`.
    pub fn watched(&self, now: Instant) -> bool {
        let asked = self.asked.load(Relaxed);
        asked != 0 && self.ms(now).saturating_sub(asked) < WATCH.as_millis() as u64
    }

    /// Whether worker `index` should publish at `now`: watched, and its
    /// listing is older than [`REFRESH`].
    pub fn wanted(&self, index: usize, now: Instant) -> bool {
        self.watched(now)
            && self.slots.get(index).is_some_and(|s| {
                let at = s.at.load(Relaxed);
                at == 0 || self.ms(now).saturating_sub(at) >= REFRESH.as_millis() as u64
            })
    }

    /// Worker `index` publishes its listing, taken at `now`.
    pub fn publish(&self, index: usize, list: Vec<T>, now: Instant) {
        if let Some(slot) = self.slots.get(index) {
            slot.latest.force_push(Arc::new(list));
            slot.at.store(self.ms(now), Relaxed);
        }
    }

    /// The fresh listings of every worker but `asking` (which reads its
    /// own state live), and mark that someone asked at `now`.
    pub fn collect(&self, asking: usize, now: Instant) -> Listings<T> {
        self.asked.store(self.ms(now), Relaxed);
        let mut out = Listings {
            lists: Vec::new(),
            missing: 0,
        };
        for (i, s) in self.slots.iter().enumerate() {
            if i == asking {
                continue;
            }
            let age = self.ms(now).saturating_sub(s.at.load(Relaxed));
            let latest = s.latest.pop();
            match latest {
                Some(l) => {
                    // Put it back for the next reader unless the worker
                    // published a newer one meanwhile.
                    let _ = s.latest.push(l.clone());
                    if age <= FRESH.as_millis() as u64 {
                        out.lists.push(l);
                    } else {
                        out.missing += 1;
                    }
                }
                None => out.missing += 1,
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workers_publish_while_watched_and_stale_listings_are_missing() {
        let t0 = crate::io::clock::now();
        let b: Board<u32> = Board::new(3, t0);
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        assert!(!b.watched(at(10)) && !b.wanted(1, at(10)));
        let first = b.collect(0, at(10));
        assert_eq!((first.lists.len(), first.missing), (0, 2));
        assert!(b.wanted(1, at(20)) && b.wanted(2, at(20)));
        b.publish(1, vec![7], at(20));
        assert!(!b.wanted(1, at(100)), "published less than REFRESH ago");
        assert!(b.wanted(1, at(20 + REFRESH.as_millis() as u64)));
        let second = b.collect(0, at(30));
        assert_eq!(second.missing, 1, "worker 2 has not published");
        assert_eq!(*second.lists[0], vec![7]);
        // Read twice: the listing stays.
        assert_eq!(b.collect(0, at(40)).lists.len(), 1);
        // Nobody asks for a minute: publishing stops, the listing ages out.
        let later = at(40 + WATCH.as_millis() as u64);
        assert!(!b.wanted(1, later));
        let stale = b.collect(2, later);
        assert_eq!((stale.lists.len(), stale.missing), (0, 2));
    }
}
