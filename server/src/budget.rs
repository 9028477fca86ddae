//! `--memory-budget` for data queued towards gRPC frontends.
//!
//! Each flow's queue is bounded by its flow-control marks, but a frontend
//! can open many streams and grant none of them window
//! (SETTINGS_INITIAL_WINDOW_SIZE 0): a thousand streams each holding a
//! flow's worth of queued data is far more than any budget. The pooled
//! buffers are capped by the budget; this module makes the queued data
//! count against the same cap.
//!
//! Each worker keeps one [`QueueCharge`] (in a thread-local: state is per
//! core) covering the bytes queued on every gRPC frontend stream of that
//! core. A frontend connection reports its total after every dispatch
//! ([`account`]; no atomic operation unless the total crosses a 512 KiB
//! chunk). When the charge cannot be covered, the budget *bites*:
//!
//! - the connection being dispatched resets its streams with the largest
//!   queues (largest first, only those above the core's mean per stream,
//!   so a busy but healthy stream is not the victim) until the shortfall
//!   is freed: RST_STREAM `CANCEL` drops the queue at once, and the agent
//!   gets CLOSE_REQ;
//! - the other frontend connections of the core are poked once so they do
//!   the same at their next dispatch (a stalled connection receives
//!   nothing and would not be dispatched otherwise);
//! - one warning is logged per episode (until the charge fits again) and
//!   `konn_memory_budget_resets_total{queue="frontend"}` counts every
//!   reset stream.
//!
//! Meanwhile the pools are under pressure (their acquisitions wait), so
//! reads that need buffers wait too. The budget can be exceeded by what
//! arrives between two dispatches of one connection, which the tunnel's
//! HTTP/2 window bounds.

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use konn_core::io::pool::{BufPool, QueueCharge};

use crate::worker::{FrontendRef, Worker};

/// Streams with less queued than this are never reset for the budget.
const MIN_VICTIM: usize = 64 * 1024;

struct CoreBudget {
    charge: QueueCharge,
    /// Bytes queued on this core's gRPC frontend streams.
    queued: usize,
    /// The budget is biting (logged once per episode).
    biting: bool,
}

thread_local! {
    static CORE: RefCell<Option<CoreBudget>> = const { RefCell::new(None) };
    /// Poking the other connections is under way (no nested pokes).
    static POKING: Cell<bool> = const { Cell::new(false) };
}

/// How many bytes a connection must shed now, and the size of stream
/// worth shedding.
#[derive(Clone, Copy, Debug)]
pub struct Shed {
    /// Bytes over the budget.
    pub short: usize,
    /// Only streams with at least this much queued are reset.
    pub min_level: usize,
}

/// A frontend connection's queued total changed from `old` to `new`
/// bytes. `streams` is the number of frontend streams on this core.
/// Returns what to shed when the budget bites.
pub fn account(pool: &BufPool, old: usize, new: usize, streams: usize) -> Option<Shed> {
    if old == new {
        return None;
    }
    CORE.with(|c| {
        let mut c = c.borrow_mut();
        let core = c.get_or_insert_with(|| CoreBudget {
            charge: QueueCharge::new(&pool.budget()),
            queued: 0,
            biting: false,
        });
        core.queued = (core.queued + new).saturating_sub(old);
        let limit = pool.budget().stats().limit_bytes;
        if core.charge.set(core.queued) {
            if core.biting && core.queued <= limit / 4 * 3 {
                core.biting = false;
                tracing::info!(
                    queued_bytes = core.queued,
                    "memory budget: queued data fits again"
                );
            }
            return None;
        }
        if !core.biting {
            core.biting = true;
            tracing::warn!(
                queued_bytes = core.queued,
                budget_bytes = limit,
                "memory budget exhausted by data queued for gRPC frontends; resetting the streams with the largest queues"
            );
        }
        // Shed down to 7/8 of the budget: room for the pools' buffers, and
        // the next packet does not bite again at once.
        Some(Shed {
            short: core.queued.saturating_sub(limit / 8 * 7).max(MIN_VICTIM),
            min_level: (core.queued / streams.max(1)).max(MIN_VICTIM),
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
