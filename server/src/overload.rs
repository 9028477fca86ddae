//! The overload manager (docs/design/limits.md): before a dial is admitted,
//! the memory the buffer pools have lent out (`MemoryBudget::in_use_bytes`,
//! published by every worker's pool maintenance pass) is compared with
//! `--overload-memory-watermark`; above it the cluster's
//! [`Limits`] refuse new dials (gRPC: a DIAL_RSP error, CONNECT: 503) until
//! use falls below 90% of the watermark. Established connections are never
//! touched: their data keeps flowing and drains the memory.
//!
//! One relaxed atomic load per dial, none per packet; the measure lags by
//! at most one maintenance interval (100 ms by default).

use std::cell::OnceCell;

use konn_core::io::pool::MemoryBudget;
use konn_protocol::server::limits::Limits;

use crate::cluster::Cluster;

thread_local! {
    /// The worker's budget (the same for every worker), read once.
    static BUDGET: OnceCell<MemoryBudget> = const { OnceCell::new() };
}

/// Update the overload flag of `limits` (of cluster `cluster`) from the
/// current memory use; whether new dials are refused now. A no-op without a
/// watermark.
pub fn observe(limits: &Limits, cluster: &str) -> bool {
    let watermark = limits.overload_high();
    if watermark == 0 {
        return false;
    }
    let used = BUDGET.with(|b| {
        b.get_or_init(|| konn_core::io::pool::current().budget())
            .in_use_bytes()
    });
    let was = limits.overloaded();
    let now = limits.observe_memory(used);
    if now != was {
        if now {
            tracing::warn!(
                used,
                watermark,
                cluster,
                "memory above --overload-memory-watermark: refusing new dials"
            );
        } else {
            tracing::info!(
                used,
                cluster,
                "memory below the overload low mark: admitting dials"
            );
        }
    }
    now
}

/// Before a frontend of `cluster` dials: refresh the overload flag.
pub fn before_dial(cluster: &Cluster) {
    if let Some(l) = &cluster.settings.router.limits {
        observe(l, cluster.name());
    }
}
