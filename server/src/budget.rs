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
//! - the connection being dispatched resets its streams with the largest
//!   queues (only those above the core's mean per stream, so a busy but
//!   healthy stream is not the victim) until the total is back under
//!   3/8 of the budget (or 3/4 of itself, whichever is less): RST_STREAM
//!   `CANCEL` drops the queue at once, and the agent gets CLOSE_REQ;
//! - the other frontend connections of the core are poked once so they do
//!   the same at their next dispatch (a stalled connection receives
//!   nothing and would not be dispatched otherwise);
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
    if old == new {
        return None;
    }
    CORE.with(|c| {
        let mut core = c.borrow_mut();
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
        })
    })
}

/// Ask every other gRPC frontend connection of `worker` to dispatch (and
/// so to shed) once. `mine` is the caller's outbox.
pub fn poke_others(worker: &Worker, mine: &Rc<crate::worker::Outbox>) {
    if POKING.with(|p| p.replace(true)) {
        return;
    }
    let mut outboxes: Vec<Rc<crate::worker::Outbox>> = Vec::new();
    for cluster in worker.clusters.borrow().values() {
        for f in cluster.frontends.borrow().values() {
            if let FrontendRef::Grpc { outbox, .. } = f
                && !Rc::ptr_eq(outbox, mine)
                && !outboxes.iter().any(|o| Rc::ptr_eq(o, outbox))
            {
                outboxes.push(outbox.clone());
            }
        }
    }
    for o in outboxes {
        o.poke();
    }
    POKING.with(|p| p.set(false));
}
