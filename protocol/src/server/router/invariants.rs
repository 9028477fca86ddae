//! Invariants of [`Router`], checked by the in-memory harness
//! (`crate::sim`) after every step — and so by `server/tests/sim.rs` and
//! the `sim` fuzz target. A child module of `router` so it can read the
//! tables without widening them; cheap, never panics. The tables must
//! agree with each other:
//!
//! - a pending dial is listed by its frontend and by its backend, both of
//!   which exist, and each of them lists only pending dials that name it;
//! - an established connection is in its backend's table (connectID →
//!   frontend) and in its frontend's list, and nowhere else;
//! - each frontend's flow state is consistent (see
//!   [`FlowRx::check`](crate::flow::FlowRx::check)); frontend credit is
//!   held only while the frontend is paused, and a paused frontend has a
//!   connection.
//!
//! [`Router::withheld`] is the backend credit the router holds back, for
//! the harness's credit ledger.

use super::{BackendId, Router};

impl Router {
    /// Checks the tables against each other (see above); `Err` names the
    /// first inconsistency. For the harness, fuzz targets and tests.
    #[doc(hidden)]
    pub fn check_invariants(&self) -> Result<(), String> {
        for (random, p) in &self.pending {
            let f = self
                .frontends
                .get(&p.frontend)
                .ok_or_else(|| format!("dial {random}: frontend {} unknown", p.frontend))?;
            if f.pending.iter().filter(|&&r| r == *random).count() != 1 {
                return Err(format!("dial {random}: not listed once by its frontend"));
            }
            let b = self
                .backends
                .get(&p.backend)
                .ok_or_else(|| format!("dial {random}: backend {} unknown", p.backend))?;
            if !b.pending.contains(random) {
                return Err(format!("dial {random}: not listed by its backend"));
            }
        }
        for (bid, b) in &self.backends {
            if let Some(r) = b
                .pending
                .iter()
                .find(|r| self.pending.get(r).is_none_or(|p| p.backend != *bid))
            {
                return Err(format!("backend {bid} lists dial {r}, not pending there"));
            }
            for (c, fid) in &b.established {
                let listed = self
                    .frontends
                    .get(fid)
                    .is_some_and(|f| f.established.contains(&(*bid, *c)));
                if !listed {
                    return Err(format!(
                        "connection {c} of backend {bid}: frontend {fid} does not list it"
                    ));
                }
            }
        }
        for (fid, f) in &self.frontends {
            if let Some(r) = f
                .pending
                .iter()
                .find(|r| self.pending.get(r).is_none_or(|p| p.frontend != *fid))
            {
                return Err(format!("frontend {fid} lists dial {r}, not pending for it"));
            }
            for (bid, c) in &f.established {
                let there = self
                    .backends
                    .get(bid)
                    .is_some_and(|b| b.established.get(c) == Some(fid));
                if !there {
                    return Err(format!(
                        "frontend {fid} lists connection {c} of backend {bid}, the backend does not"
                    ));
                }
            }
            f.rx.check().map_err(|e| format!("frontend {fid}: {e}"))?;
            if f.held > 0 && !f.paused {
                return Err(format!("frontend {fid} holds {} credit unpaused", f.held));
            }
            if f.paused && f.established.is_empty() {
                return Err(format!("frontend {fid} paused without a connection"));
            }
        }
        Ok(())
    }

    /// Tunnel credit of `backend` the router holds back for frontends
    /// over their limit. For the harness's credit ledger.
    #[doc(hidden)]
    pub fn withheld(&self, backend: BackendId) -> usize {
        self.frontends
            .values()
            .filter(|f| f.rx_backend == Some(backend))
            .map(|f| f.rx.withheld())
            .sum()
    }
}
