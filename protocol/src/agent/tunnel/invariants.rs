//! Invariants of [`Tunnel`], checked by the in-memory harness
//! (`crate::sim`) after every step. A child module of `tunnel` so it can
//! read the endpoint table; cheap, never panics:
//!
//! - connectIDs are positive and below the next one to assign;
//! - the table stays within `max_endpoints`;
//! - each open endpoint's flow state is consistent
//!   ([`FlowRx::check`](crate::flow::FlowRx::check)).
//!
//! [`Tunnel::withheld`] is the tunnel credit the agent holds back, for the
//! harness's credit ledger.

use super::{Endpoint, Tunnel};

impl Tunnel {
    /// Checks the endpoint table (see above); `Err` names the first
    /// inconsistency. For the harness, fuzz targets and tests.
    #[doc(hidden)]
    pub fn check_invariants(&self) -> Result<(), String> {
        if self.endpoints.len() > self.cfg.max_endpoints {
            return Err(format!("{} endpoints", self.endpoints.len()));
        }
        for (c, e) in &self.endpoints {
            if *c <= 0 || *c >= self.next_connect_id {
                return Err(format!(
                    "endpoint {c} (next connectID {})",
                    self.next_connect_id
                ));
            }
            if let Endpoint::Open(f) = e {
                f.rx.check().map_err(|e| format!("endpoint {c}: {e}"))?;
            }
        }
        Ok(())
    }

    /// Tunnel credit held back for endpoints over their limit. For the
    /// harness's credit ledger.
    #[doc(hidden)]
    pub fn withheld(&self) -> usize {
        self.endpoints
            .values()
            .map(|e| match e {
                Endpoint::Open(f) => f.rx.withheld(),
                Endpoint::Dialing { .. } => 0,
            })
            .sum()
    }
}
