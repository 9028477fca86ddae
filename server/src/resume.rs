//! `konn-resume` on the server (docs/design/resume.md): the IO side of
//! the router's resume hooks.
//!
//! - **Tokens.** Each tunnel that negotiated resume gets a fresh
//!   [`ResumeToken`] in its response headers: two bytes naming the worker
//!   that accepted it, fourteen drawn from the operating system's random
//!   source (`/dev/urandom`; konn-protocol draws nothing). The worker's
//!   bytes let a reconnect accepted by another worker move to the one that
//!   parked the tunnel ([`token_core`]); the 112 random bits are what
//!   cannot be guessed, and a token alone resumes nothing (the agent ID
//!   and authenticated identity must match too).
//! - **Parking.** When a tunnel breaks (its connection lost, not ended by
//!   the agent, not during shutdown) the router parks its backend
//!   (`Router::backend_broken`) and the backend goes into its cluster's
//!   [`Parked`] table on this core with the token, the agent ID, the
//!   identity and the deadline `now + --resume-window`. Other workers are
//!   told the backend is gone (their relayed flows through it were closed
//!   by the router); the backend's [`BackendRef`](crate::worker::BackendRef)
//!   stays, with the credit it holds back, for the resumed stream.
//! - **Resuming.** A Connect call presenting a token of this server, from
//!   the same agent and identity, before the deadline, claims the backend
//!   ([`Parked::claim`]): the new stream is bound to the parked backend's
//!   id and the router announces and replays (`Router::backend_resumed`).
//! - **Ending.** A parked backend whose window passed, that was evicted
//!   from a full table, or whose cluster goes, ends as a lost tunnel did
//!   before resume ([`end`]).

use std::collections::HashMap;
use std::io::Read as _;
use std::time::Instant;

use konn_core::metrics::common::ResumeResult;
use konn_protocol::resume::{ClaimError, ParkTable, ResumeToken};
use konn_protocol::server::backends::BackendId;

use crate::cluster::Cluster;
use crate::worker::Worker;

/// Most tunnels parked per cluster and worker; beyond, the one parked the
/// longest is closed (a server whose every agent lost its tunnel at once
/// parks them all: 8192 per core is more agents than a core serves).
pub const MAX_PARKED: usize = 8192;

/// What a tunnel that negotiated resume needs to be parked.
#[derive(Debug, Clone)]
pub struct Resumable {
    /// Its token (sent in the response headers).
    pub token: ResumeToken,
    /// The agent's ID.
    pub agent_id: String,
    /// Its authenticated identity ([`identity`]).
    pub identity: String,
}

/// A fresh token for a tunnel accepted on worker `core`; `None` when the
/// random source cannot be read (the tunnel then does without resume).
pub fn new_token(core: usize) -> Option<ResumeToken> {
    let core = u16::try_from(core).ok()?;
    let mut b = [0u8; 16];
    let (head, random) = b.split_at_mut(2);
    head.copy_from_slice(&core.to_be_bytes());
    random_bytes(random)?;
    Some(ResumeToken::from_random(b))
}

/// The worker that issued `token` (see the module docs).
pub fn token_core(token: &ResumeToken) -> usize {
    let [a, b, ..] = *token.as_bytes();
    usize::from(u16::from_be_bytes([a, b]))
}

/// Fills `out` from the kernel's random source (opened per draw: one
/// draw per accepted tunnel, and no descriptor stays open).
fn random_bytes(out: &mut [u8]) -> Option<()> {
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(out))
        .ok()
}

/// An agent's authenticated identity, as a parked tunnel is bound to it:
/// its client certificate's subject common name (mTLS) and the user its
/// token was reviewed as (token authentication), whichever it has.
pub fn identity(cert_cn: Option<&str>, user: Option<&str>) -> String {
    let mut s = String::new();
    if let Some(cn) = cert_cn {
        s.push_str("cn=");
        s.push_str(cn);
    }
    if let Some(u) = user {
        if !s.is_empty() {
            s.push(' ');
        }
        s.push_str("user=");
        s.push_str(u);
    }
    s
}

/// One parked backend, besides its table entry.
#[derive(Debug)]
pub struct ParkedInfo {
    /// The agent's ID.
    pub agent_id: String,
    /// Connections parked with it (for the gauge).
    pub connections: usize,
    /// Bytes it held for replay when it parked, counted in the core's
    /// frontend-queue budget (`crate::budget`) while it stays parked.
    pub held: usize,
}

/// The parked backends of one cluster on one worker.
#[derive(Debug)]
pub struct Parked {
    table: ParkTable<BackendId>,
    info: HashMap<BackendId, ParkedInfo>,
}

impl Default for Parked {
    fn default() -> Self {
        Self {
            table: ParkTable::new(MAX_PARKED),
            info: HashMap::new(),
        }
    }
}

impl Parked {
    /// Backends parked.
    pub fn len(&self) -> usize {
        self.info.len()
    }

    /// Whether none is parked.
    pub fn is_empty(&self) -> bool {
        self.info.is_empty()
    }

    /// The earliest deadline.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.table.poll_timeout()
    }

    /// Parked backends whose window ended at `now`.
    fn expire(&mut self, now: Instant) -> Vec<(BackendId, ParkedInfo)> {
        let gone = self.table.expire(now);
        gone.into_iter()
            .filter_map(|b| self.info.remove(&b).map(|i| (b, i)))
            .collect()
    }
}

/// The tunnel of backend `bid` broke at `now` (its connection was lost):
/// park it when it negotiated resume, the window is not zero, the server
/// is not stopping and the router agrees (not draining). Returns whether
/// it was parked; if not, the caller ends it as before.
pub fn park(w: &Worker, c: &Cluster, bid: BackendId, r: &Resumable, now: Instant) -> bool {
    let window = w.settings.resume_window;
    if window.is_zero()
        || w.stopped.get()
        || w.shared
            .shutting_down
            .load(std::sync::atomic::Ordering::Relaxed)
    {
        return false;
    }
    if !c.router.borrow_mut().backend_broken(now, bid, window) {
        return false;
    }
    let (connections, held) = c.router.borrow().resume_session(bid).map_or((0, 0), |s| {
        (
            s.len(),
            usize::try_from(s.held_bytes()).unwrap_or(usize::MAX),
        )
    });
    tracing::info!(
        backend = bid,
        agent_id = %r.agent_id,
        connections,
        window = ?window,
        cluster = c.name(),
        "agent tunnel broken; its connections wait for the agent to resume it"
    );
    // Pending dials fail, relayed flows close, frontends pause.
    c.apply(w);
    let deadline = now.checked_add(window).unwrap_or(now);
    let evicted = {
        let mut p = c.parked.borrow_mut();
        let evicted = p
            .table
            .park(r.token, &r.agent_id, &r.identity, deadline, bid);
        p.info.insert(
            bid,
            ParkedInfo {
                agent_id: r.agent_id.clone(),
                connections,
                held,
            },
        );
        evicted.and_then(|e| p.info.remove(&e).map(|i| (e, i)))
    };
    c.metrics.parked_tunnels().inc();
    c.metrics.parked_connections().add(connections as f64);
    if let Some((e, info)) = evicted {
        tracing::warn!(
            backend = e,
            agent_id = %info.agent_id,
            "too many parked tunnels; closing the oldest"
        );
        end(w, c, e, &info, ResumeResult::Evicted);
    }
    // Its replay bytes count in the budget: a reclaim closes parked
    // tunnels first.
    if let Some(s) = crate::budget::account(&w.pool, 0, held, || w.frontend_count()) {
        shed(w, s.short);
    }
    // The router timer must see the new deadline.
    w.poke_timer(deadline);
    true
}

/// A Connect call of `agent_id` with `identity` presented `token`: the
/// parked backend it resumes, if any.
pub fn claim(
    w: &Worker,
    c: &Cluster,
    token: &ResumeToken,
    agent_id: &str,
    identity: &str,
    now: Instant,
) -> Option<BackendId> {
    let claimed = c
        .parked
        .borrow_mut()
        .table
        .claim(token, agent_id, identity, now);
    match claimed {
        Ok(bid) => {
            let info = c.parked.borrow_mut().info.remove(&bid);
            c.metrics.parked_tunnels().dec();
            if let Some(i) = info {
                c.metrics.parked_connections().add(-(i.connections as f64));
                let _ = crate::budget::account(&w.pool, i.held, 0, || 1);
            }
            c.metrics.resumes(ResumeResult::Resumed).inc();
            Some(bid)
        }
        Err(ClaimError::WrongIdentity) => {
            // The token's tunnel stays parked for its owner. The token is
            // never logged.
            tracing::warn!(
                agent_id,
                "resume token presented by another agent or identity; refused"
            );
            None
        }
        Err(ClaimError::Unknown) => {
            tracing::debug!(agent_id, "nothing parked for the token presented");
            None
        }
    }
}

/// Ends parked backend `bid` as a lost tunnel ended before resume: its
/// connections close (CLOSE_RSP to gRPC frontends, CONNECT sockets
/// closed), held credit goes back, its refs go.
pub fn end(w: &Worker, c: &Cluster, bid: BackendId, info: &ParkedInfo, result: ResumeResult) {
    tracing::info!(
        backend = bid,
        agent_id = %info.agent_id,
        connections = info.connections,
        result = ?result,
        cluster = c.name(),
        "parked agent tunnel closed"
    );
    c.metrics.parked_tunnels().dec();
    c.metrics
        .parked_connections()
        .add(-(info.connections as f64));
    c.metrics.resumes(result).inc();
    let _ = crate::budget::account(&w.pool, info.held, 0, || 1);
    c.router.borrow_mut().backend_gone(bid);
    c.backend_drained(w, bid);
    c.backends.borrow_mut().remove(&bid);
    c.loads.borrow_mut().remove(&bid);
    c.apply(w);
    c.publish(w);
    crate::accounting::agent_gone(c, &info.agent_id);
}

/// The core's memory budget bites (`crate::budget`): close parked
/// tunnels of every cluster on this worker, those holding the most bytes
/// first, until `short` bytes are freed or none is left. Returns the
/// bytes freed. Parked connections go first: they carry nothing now, and
/// would close at the window's end anyway.
pub fn shed(w: &Worker, short: usize) -> usize {
    let clusters: Vec<std::rc::Rc<Cluster>> = w.clusters.borrow().values().cloned().collect();
    let mut victims: Vec<(usize, BackendId, usize)> = Vec::new();
    for (i, c) in clusters.iter().enumerate() {
        for (bid, info) in &c.parked.borrow().info {
            victims.push((info.held, *bid, i));
        }
    }
    victims.sort_unstable_by(|a, b| b.cmp(a));
    let mut freed = 0;
    let mut closed = 0u64;
    for (held, bid, i) in victims {
        if freed >= short {
            break;
        }
        let Some(c) = clusters.get(i) else { continue };
        let info = {
            let mut p = c.parked.borrow_mut();
            p.table.remove(&bid);
            p.info.remove(&bid)
        };
        if let Some(info) = info {
            tracing::warn!(
                backend = bid,
                agent_id = %info.agent_id,
                held_bytes = held,
                "memory budget: closing a parked tunnel"
            );
            end(w, c, bid, &info, ResumeResult::Evicted);
            freed += held;
            closed += 1;
        }
    }
    if closed > 0 {
        w.all_metrics.budget_resets("parked", closed);
    }
    freed
}

/// Ends the parked backends of `c` whose window passed at `now` (the
/// router timer's turn).
pub fn expire(w: &Worker, c: &Cluster, now: Instant) {
    if c.parked.borrow().is_empty() {
        return;
    }
    let gone = c.parked.borrow_mut().expire(now);
    for (bid, info) in gone {
        end(w, c, bid, &info, ResumeResult::Expired);
    }
}

/// The resume limits of a tunnel from the server's per-flow queue bound.
pub fn limits(w: &Worker) -> konn_protocol::resume::ResumeLimits {
    let q = w.settings.router.flow.high.saturating_mul(2);
    konn_protocol::resume::ResumeLimits::from_queue_size(q)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_name_their_core_and_differ() {
        let a = new_token(3).unwrap();
        let b = new_token(3).unwrap();
        assert_eq!(token_core(&a), 3);
        assert_ne!(a, b, "random bytes");
        assert_eq!(token_core(&new_token(700).unwrap()), 700);
    }

    #[test]
    fn identities() {
        assert_eq!(identity(None, None), "");
        assert_eq!(identity(Some("agent"), None), "cn=agent");
        assert_eq!(
            identity(
                Some("agent"),
                Some("system:serviceaccount:kube-system:konnectivity-agent")
            ),
            "cn=agent user=system:serviceaccount:kube-system:konnectivity-agent"
        );
    }
}
