//! `konn-resume` on the agent (docs/design/resume.md): where a worker's
//! broken tunnels wait for the reconnect that resumes them.
//!
//! A tunnel that negotiated resume and loses its connection (not closed by
//! the agent, no GOAWAY from the server, not draining) *parks*
//! (`TunnelHandler`, `crate::conn`): its endpoints stay open with their
//! readers paused, dials are cancelled, and its connection's state — the
//! handler with the `Tunnel` and the endpoints — is kept here, under the
//! server's `serverid`, with the tunnel's token. The endpoint tasks keep
//! reaching it through their shared context, so a destination that closes
//! meanwhile is recorded for the replay.
//!
//! Every tunnel attempt of the worker presents the tokens parked here
//! ([`ParkingLot::presented`]). When a server answers with
//! `konn-resumed: 1`, the new connection's handler takes the parked state
//! over ([`ParkingLot::take`]); the endpoint tasks move with it, and both
//! sides announce and replay. When a server with a parked tunnel answers
//! without it (it restarted, or its window ended), the parked endpoints
//! close at once. A parked tunnel whose window ends closes its endpoints
//! by itself (its timer task) and leaves the lot.
//!
//! The sync loop (`crate::run`) is told about parked tunnels: while any
//! is parked it reconnects at once, on the worker that parked it.

use std::cell::RefCell;
use std::collections::HashMap;

use konn_core::metrics::common::ResumeResult;
use konn_protocol::resume::ResumeToken;

use crate::client::TunnelHandle;

/// One parked tunnel.
struct Parked {
    /// Its connection (finished), which holds the handler and its state.
    handle: TunnelHandle,
    token: ResumeToken,
}

/// The tunnels parked on one worker, by `serverid` (see the module docs).
#[derive(Default)]
pub struct ParkingLot {
    tunnels: RefCell<HashMap<String, Parked>>,
}

impl ParkingLot {
    /// An empty lot.
    pub fn new() -> Self {
        Self::default()
    }

    /// Tunnels parked.
    pub fn len(&self) -> usize {
        self.tunnels.borrow().len()
    }

    /// Whether none is parked.
    pub fn is_empty(&self) -> bool {
        self.tunnels.borrow().is_empty()
    }

    /// The `konn-resume-token` values of every parked tunnel, each
    /// addressed to its server.
    pub fn presented(&self) -> Vec<String> {
        self.tunnels
            .borrow()
            .iter()
            .map(|(server_id, p)| p.token.presented(server_id))
            .collect()
    }

    /// Parks the tunnel running on `handle` for `server_id`; returns one
    /// parked there before for the same server, if any (the caller closes
    /// it).
    pub(crate) fn park(
        &self,
        server_id: String,
        handle: TunnelHandle,
        token: ResumeToken,
    ) -> Option<TunnelHandle> {
        self.tunnels
            .borrow_mut()
            .insert(server_id, Parked { handle, token })
            .map(|p| p.handle)
    }

    /// Takes the tunnel parked for `server_id` (to resume it, or to close
    /// it).
    pub(crate) fn take(&self, server_id: &str) -> Option<TunnelHandle> {
        self.tunnels
            .borrow_mut()
            .remove(server_id)
            .map(|p| p.handle)
    }

    /// Takes the tunnel parked for `server_id` if it is the one with
    /// `token` (each tunnel's token is its own).
    pub(crate) fn take_if(
        &self,
        server_id: &str,
        token: Option<ResumeToken>,
    ) -> Option<TunnelHandle> {
        let mut tunnels = self.tunnels.borrow_mut();
        let same = tunnels
            .get(server_id)
            .is_some_and(|p| Some(p.token) == token);
        if same {
            tunnels.remove(server_id).map(|p| p.handle)
        } else {
            None
        }
    }

    /// Closes every parked tunnel's endpoints (the agent stops).
    pub fn close_all(&self) {
        let all: Vec<TunnelHandle> = self
            .tunnels
            .borrow_mut()
            .drain()
            .map(|(_, p)| p.handle)
            .collect();
        for handle in all {
            let _ = handle.with(|g, t| t.unpark(g, ResumeResult::Evicted));
        }
    }
}
