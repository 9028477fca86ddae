//! Invariants of [`Grpc`], checked by the stateful fuzz target
//! (`fuzz/fuzz_targets/grpc_conn.rs`) after every step, on top of the
//! HTTP/2 connection's own (`h2/invariants.rs`):
//!
//! - the credit a call holds for the partial message its deframer is
//!   assembling is at most half our initial stream window (the rest was
//!   returned at once, so a message larger than the window cannot
//!   deadlock);
//! - while the connection is up, every call has its HTTP/2 stream (a call
//!   outliving its stream would never finish).
//!
//! [`Grpc::unreleased_credit`] lets the caller check the credit ledger:
//! what the connection says is unreleased, less what the calls hold, is
//! exactly the `flow` of the messages handed out and not yet released.

use super::Grpc;

impl Grpc {
    /// Checks the invariants above and the connection's; `Err` names the
    /// first one broken. Call with no event pending (after draining
    /// [`Grpc::poll_event`]). For fuzz targets and tests.
    #[doc(hidden)]
    pub fn check_invariants(&self) -> Result<(), String> {
        self.conn.check_invariants()?;
        let hold_max = (self.conn.local_settings().initial_window_size / 2) as usize;
        let mut ids: Vec<u32> = self.calls.keys().copied().collect();
        ids.sort_unstable();
        for id in ids {
            let Some(call) = self.calls.get(&id) else {
                continue;
            };
            if call.held > hold_max {
                return Err(format!("call {id} holds {} > {hold_max}", call.held));
            }
            if self.conn.error().is_none() && !self.conn.has_stream(id) {
                return Err(format!("call {id} has no stream"));
            }
        }
        Ok(())
    }

    /// Credit of received messages handed out ([`super::GrpcEvent::Message`]'s
    /// `flow`) and not yet given back with [`Grpc::release`]. For fuzz
    /// targets and tests.
    #[doc(hidden)]
    pub fn unreleased_credit(&self) -> i64 {
        let held: usize = self.calls.values().map(|c| c.held).sum();
        self.conn.unreleased_credit() - i64::try_from(held).unwrap_or(i64::MAX)
    }
}
