//! `--memory-budget` for data queued towards gRPC frontends.
//!
//! Each flow's queue is bounded by its flow-control marks, but a frontend
//! can open many streams and grant none of them window
//! (SETTINGS_INITIAL_WINDOW_SIZE 0): a thousand streams each holding a
//! flow's worth of queued data is far more than any budget. That data
//! already lives in pooled buffers (the frontend streams queue slices of
//! the tunnel's read buffers, docs/design/buffers.md), so the budget caps
//! it; but left alone, the budget would be used up by the hostile frontend
//! and the *tunnel's* reader would wait for buffers until it gives the
//! whole tunnel up — every flow of that agent would pay for one frontend.
//! This module sheds the offender's queues first.
//!
//! Each worker keeps the total queued on every gRPC frontend stream of
//! that core (in a thread-local: state is per core). A frontend connection
//! reports its total after every dispatch ([`account`]: plain arithmetic
//! and one relaxed atomic load, never per packet). The budget *bites* when
//! that total passes half the budget, or a quarter while the pools find
//! the budget used up (`MemoryBudget::under_pressure`):
//!
//! - the connection being dispatched, if it holds at least its share of
//!   the core's queued bytes (the total divided by the core's gRPC
//!   frontend connections: a client that reads is not made to pay for one
//!   that does not), resets its streams with the largest queues (only
//!   those above the core's mean per stream, so a busy but healthy stream
//!   is not the victim) until the total is back under 3/8 of the budget
//!   (or 3/4 of itself, whichever is less): RST_STREAM `CANCEL` drops the
//!   queue at once, and the agent gets CLOSE_REQ;
//! - if that did not free enough, the other frontend connections of the
//!   core are poked once so they do the same at their next dispatch (a
//!   stalled connection receives nothing and would not be dispatched
//!   otherwise; while the budget bites, a dispatch is asked even when its
//!   connection's total did not change);
//! - one warning is logged per episode (until the total is under a
//!   quarter of the budget again) and
//!   `konn_memory_budget_resets_total{queue="frontend"}` counts every
//!   reset stream.
//!
//! The queues can grow past the mark by what arrives between two
//! dispatches of one connection, which the tunnel's HTTP/2 window bounds.
//!
//! Parked tunnels (`konn-resume`, `crate::resume`) count too: the bytes a
//! parked tunnel holds for replay are added to the core's total when it
//! parks and taken off when it resumes or closes. When the budget bites,
//! parked tunnels are closed first, those holding the most first
//! (`konn_memory_budget_resets_total{queue="parked"}` counts them): they
//! carry nothing now and would close at the window's end anyway; streams
//! are reset only if that was not enough.

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use konn_core::io::pool::BufPool;

use crate::worker::{FrontendRef, Worker};

/// Streams with less queued than this are never reset for the budget.
const MIN_VICTIM: usize = 64 * 1024;

#[derive(Default)]
struct CoreBudget {
    /// Bytes queued on this core's gRPC frontend streams.
    queued: usize,
    /// The budget is biting (logged once per episode).
    biting: bool,
    /// `--memory-budget` in bytes, read from the pool once (it never
    /// changes).
    limit: Option<usize>,
}

thread_local! {
    static CORE: RefCell<CoreBudget> = RefCell::new(CoreBudget::default());
    /// Poking the other connections is under way (no nested pokes).
    static POKING: Cell<bool> = const { Cell::new(false) };
}

/// How many bytes a connection must shed now, and the size of stream
/// worth shedding.
#[derive(Clone, Copy, Debug)]
pub struct Shed {
    /// Bytes over the mark.
    pub short: usize,
    /// Only streams with at least this much queued are reset.
    pub min_level: usize,
    /// Bytes queued on the core's gRPC frontend streams: a connection
    /// holding less than its share of them leaves the shedding to the
    /// others ([`holds_share`]).
    pub core_queued: usize,
}

/// Whether a connection with `total` bytes queued holds at least its
/// share of `shed.core_queued` among `connections` gRPC frontend
/// connections (so sheds itself rather than leaving it to the others).
pub fn holds_share(shed: &Shed, total: usize, connections: usize) -> bool {
    total.saturating_mul(connections.max(1)) >= shed.core_queued
}

/// A frontend connection's queued total changed from `old` to `new`
/// bytes. `streams` counts the frontend streams on this core; it is asked
/// only when the budget bites. Returns what to shed then.
pub fn account(
    pool: &BufPool,
    old: usize,
    new: usize,
    streams: impl FnOnce() -> usize,
) -> Option<Shed> {
    CORE.with(|c| {
        let mut core = c.borrow_mut();
        if old == new && !core.biting {
            return None;
        }
        core.queued = (core.queued + new).saturating_sub(old);
        let queued = core.queued;
        let limit = *core
            .limit
            .get_or_insert_with(|| pool.budget().stats().limit_bytes);
        let mark = if pool.under_pressure() {
            limit / 4
        } else {
            limit / 2
        };
        if queued <= mark {
            if core.biting && queued <= limit / 4 {
                core.biting = false;
                tracing::info!(
                    queued_bytes = queued,
                    "memory budget: queued data fits again"
                );
            }
            return None;
        }
        if !core.biting {
            core.biting = true;
            tracing::warn!(
                queued_bytes = queued,
                budget_bytes = limit,
                "memory budget exhausted by data queued for gRPC frontends; resetting the streams with the largest queues"
            );
        }
        // Shed well below the mark: the next packet does not bite again
        // at once, and the tunnels' readers get buffers back.
        let target = (limit / 8 * 3).min(queued / 4 * 3);
        Some(Shed {
            short: queued.saturating_sub(target).max(MIN_VICTIM),
            min_level: (queued / streams().max(1)).max(MIN_VICTIM),
            core_queued: queued,
        })
    })
}

/// The outboxes of `worker`'s gRPC frontend connections, one per
/// connection (only asked while the budget bites).
pub fn connections(worker: &Worker) -> Vec<Rc<crate::worker::Outbox>> {
    let mut outboxes: Vec<Rc<crate::worker::Outbox>> = Vec::new();
    for cluster in worker.clusters.borrow().values() {
        for f in cluster.frontends.borrow().values() {
            if let FrontendRef::Grpc { outbox, .. } = f
                && !outboxes.iter().any(|o| Rc::ptr_eq(o, outbox))
            {
                outboxes.push(outbox.clone());
            }
        }
    }
    outboxes
}

/// Ask every gRPC frontend connection in `outboxes` but the caller's
/// (`mine`) to dispatch (and so to shed) once.
pub fn poke_others(outboxes: &[Rc<crate::worker::Outbox>], mine: &Rc<crate::worker::Outbox>) {
    if POKING.with(|p| p.replace(true)) {
        return;
    }
    for o in outboxes.iter().filter(|o| !Rc::ptr_eq(o, mine)) {
        o.poke();
    }
    POKING.with(|p| p.set(false));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shed(core_queued: usize) -> Shed {
        Shed {
            short: MIN_VICTIM,
            min_level: MIN_VICTIM,
            core_queued,
        }
    }

    #[test]
    fn a_reading_client_leaves_the_shedding_to_the_hoarder() {
        // Two connections: one holds 40 MiB, the other 128 KiB.
        let s = shed((40 << 20) + (128 << 10));
        assert!(!holds_share(&s, 128 << 10, 2));
        assert!(holds_share(&s, 40 << 20, 2));
    }

    #[test]
    fn equal_shares_all_shed_and_a_lone_connection_always_does() {
        let s = shed(3 << 20);
        assert!(holds_share(&s, 1 << 20, 3));
        assert!(holds_share(&s, 3 << 20, 1));
        // No connection counted (it is being dropped): still its own share.
        assert!(holds_share(&s, 3 << 20, 0));
    }
}
