//! The invariants [`Sim::check`] verifies after every step (listed in the
//! module docs of `sim`).

use super::{Sim, WINDOW};

impl Sim {
    /// Checks every invariant now; `Err` names the first one broken
    /// (including one the IO layers recorded since the start).
    pub fn check(&self) -> Result<(), String> {
        if let Some(v) = &self.violation {
            return Err(v.clone());
        }
        self.router
            .check_invariants()
            .map_err(|e| format!("router: {e}"))?;
        self.tunnel
            .check_invariants()
            .map_err(|e| format!("tunnel: {e}"))?;
        self.check_credit()?;
        self.check_endpoints()?;
        self.check_frontends()
    }

    /// Each direction of the tunnel stream has exactly its window of
    /// credit between steps: left to the sender, or withheld by the
    /// receiver (everything else was returned as it was delivered).
    fn check_credit(&self) -> Result<(), String> {
        let (window, withheld) = (self.s2a.window, self.tunnel.withheld());
        if window + withheld != WINDOW {
            return Err(format!(
                "server → agent credit: window {window} + withheld {withheld} ≠ {WINDOW}"
            ));
        }
        let (window, withheld) = (self.a2s.window, self.router.withheld(self.backend));
        if window + withheld != WINDOW {
            return Err(format!(
                "agent → server credit: window {window} + withheld {withheld} ≠ {WINDOW}"
            ));
        }
        Ok(())
    }

    /// The agent's endpoints are the open destinations, its dials the ones
    /// in progress, and each endpoint's queue what its destination has not
    /// read.
    fn check_endpoints(&self) -> Result<(), String> {
        let open = self.dests.values().filter(|d| !d.closed).count();
        if self.tunnel.open_endpoints() != open {
            return Err(format!(
                "{} open endpoints, {open} open destinations",
                self.tunnel.open_endpoints()
            ));
        }
        let dialling = self.tunnel.endpoints() - self.tunnel.open_endpoints();
        if dialling != self.dialing.len() {
            return Err(format!(
                "{dialling} endpoints dialling, {} dials in progress",
                self.dialing.len()
            ));
        }
        for (&c, d) in &self.dests {
            if d.closed {
                if self.tunnel.is_open(c) {
                    return Err(format!("endpoint {c} open, its destination closed"));
                }
                continue;
            }
            let unread: usize = d.inbox.iter().map(|b| b.len()).sum();
            if self.tunnel.queued(c) != Some(unread) {
                return Err(format!(
                    "endpoint {c}: tunnel counts {:?} queued, destination has {unread} unread",
                    self.tunnel.queued(c)
                ));
            }
        }
        Ok(())
    }

    /// The router's view of each frontend matches the frontend's.
    fn check_frontends(&self) -> Result<(), String> {
        for &fid in &self.order {
            let Some(fe) = self.fes.get(&fid) else {
                continue;
            };
            let known = self.router.frontend_queued(fid);
            if fe.gone {
                if known.is_some() {
                    return Err(format!("frontend {fid} gone, the router keeps it"));
                }
                continue;
            }
            let Some(queued) = known else {
                continue;
            };
            if queued != fe.level() && !fe.stuck {
                return Err(format!(
                    "frontend {fid}: router counts {queued} queued, the frontend has {} unread",
                    fe.level()
                ));
            }
            let paused = self.router.frontend_paused(fid);
            if fe.connect && paused != fe.paused {
                return Err(format!(
                    "frontend {fid}: router paused {paused}, IO layer paused {}",
                    fe.paused
                ));
            }
            if fe.held > 0 && !paused {
                return Err(format!(
                    "frontend {fid}: {} credit held while not paused",
                    fe.held
                ));
            }
        }
        Ok(())
    }
}
