//! Per-connection accounting: what the audit log and the byte and duration
//! metrics need of each tunnelled connection (issue 17).
//!
//! Each frontend carries an [`Account`]: the destination and agent of its
//! dial, when it was dialled, the payload bytes each way (plain `u64`
//! additions per DATA packet: no allocation, no lock, no log), how it
//! ended and which side ended it. When a frontend that dialled leaves the
//! router for good, the router queues [`Action::ConnEnded`] with a
//! [`ConnSummary`]: plain data, formatted by the IO layer off the packet
//! path. A frontend that never dialled leaves nothing; a refused or failed
//! dial leaves one summary, as an established connection does.
//!
//! **Refusals.** A dial the server turns down carries a short machine
//! `reason` into its summary ([`ConnResult::Refused`]): `no_backend`,
//! `too_many_pending`, `dial_id_in_use`, or an admission limit's
//! ([`Refusal::as_str`](crate::server::limits::Refusal::as_str):
//! `limit_…`, `overload`, decided in `Router::dial`, also reported as
//! [`Action::DialRefused`]). A konn agent's allow-list refusal arrives as a
//! DIAL_RSP error and is summarised as refused too
//! (`destination_not_allowed`, closed by the agent).

use std::sync::Arc;

use super::*;

/// How a tunnelled connection (or a dial) ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConnResult {
    /// Established, then closed.
    Closed,
    /// The server refused the dial (no agent, limits, …).
    Refused,
    /// The dial failed: the agent answered with an error or DIAL_CLS, the
    /// dial timed out or its agent went away.
    Failed,
    /// The frontend cancelled the dial or went away before it completed.
    Cancelled,
}

impl ConnResult {
    /// The audit log's and the metrics' spelling.
    pub const fn label(self) -> &'static str {
        match self {
            Self::Closed => "closed",
            Self::Refused => "refused",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
        }
    }
}

/// Which side ended a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    /// The frontend (kube-apiserver): CLOSE_REQ, stream end, socket close.
    Frontend,
    /// The agent: CLOSE_RSP of its own, DIAL_CLS, a dial error, its tunnel
    /// going away.
    Agent,
    /// The server: refusal, dial timeout, a stuck frontend, a protocol
    /// violation.
    Server,
}

impl Side {
    /// The audit log's spelling.
    pub const fn label(self) -> &'static str {
        match self {
            Self::Frontend => "frontend",
            Self::Agent => "agent",
            Self::Server => "server",
        }
    }
}

/// One tunnelled connection (or refused or failed dial) at its end: see
/// the module docs.
#[derive(Clone, Debug, PartialEq)]
pub struct ConnSummary {
    /// The frontend.
    pub frontend: FrontendId,
    /// How it reached the server.
    pub kind: FrontendKind,
    /// Who the frontend is, as the IO layer described it
    /// ([`Router::set_frontend_peer`]).
    pub peer: Option<Arc<str>>,
    /// The dial's destination (`host:port`), as the frontend sent it.
    pub destination: Arc<str>,
    /// The agent the dial went to (`None`: refused before one was picked).
    pub agent_id: Option<Arc<str>>,
    /// Its tunnel.
    pub backend: Option<BackendId>,
    /// The agent's connectID (0: never established).
    pub connect_id: i64,
    /// When the dial arrived.
    pub started: Instant,
    /// How it ended.
    pub result: ConnResult,
    /// Why, in a word (`""` for an ordinary close).
    pub reason: &'static str,
    /// Which side ended it.
    pub closed_by: Side,
    /// Payload bytes frontend → agent.
    pub bytes_to_agent: u64,
    /// Payload bytes agent → frontend.
    pub bytes_from_agent: u64,
}

/// One open connection (a frontend that dialled) as `/debug/connections`
/// shows it: [`Router::connections`].
#[derive(Clone, Debug, PartialEq)]
pub struct ConnView {
    /// The frontend.
    pub frontend: FrontendId,
    /// How it reached the server.
    pub kind: FrontendKind,
    /// Its peer ([`Router::set_frontend_peer`]).
    pub peer: Option<Arc<str>>,
    /// The dial's destination.
    pub destination: Arc<str>,
    /// The agent the dial went to.
    pub agent_id: Option<Arc<str>>,
    /// The agent's connectID (0: dial pending).
    pub connect_id: i64,
    /// When the dial arrived.
    pub started: Instant,
    /// Payload bytes frontend → agent so far.
    pub bytes_to_agent: u64,
    /// Payload bytes agent → frontend so far.
    pub bytes_from_agent: u64,
    /// Bytes queued towards the frontend.
    pub queued: usize,
    /// Tunnel credit held back for it.
    pub withheld: usize,
    /// The server paused the agent's side (PAUSE sent: the frontend is
    /// behind).
    pub pause_sent: bool,
    /// The agent paused the frontend's side (PAUSE received).
    pub paused_by_agent: bool,
    /// Since when nothing drained from its non-empty queue.
    pub stalled_since: Option<Instant>,
    /// Whether it counts as stuck at the time asked (closed at the next
    /// timer).
    pub stuck: bool,
}

/// A frontend's accounting (see the module docs).
#[derive(Debug, Default)]
pub(super) struct Account {
    pub(super) peer: Option<Arc<str>>,
    pub(super) destination: Option<Arc<str>>,
    pub(super) agent_id: Option<Arc<str>>,
    pub(super) backend: Option<BackendId>,
    pub(super) connect_id: i64,
    pub(super) started: Option<Instant>,
    pub(super) ended: Option<(ConnResult, &'static str)>,
    pub(super) closed_by: Option<Side>,
    pub(super) up: u64,
    pub(super) down: u64,
}

impl Account {
    /// Record how it ended, unless that is already known (the first cause
    /// wins: a timeout that closes a connection is not overwritten by the
    /// close it causes).
    pub(super) fn end(&mut self, result: ConnResult, reason: &'static str, by: Side) {
        if self.ended.is_none() {
            self.ended = Some((result, reason));
        }
        self.closed_by.get_or_insert(by);
    }

    /// Which side closed it, unless known.
    pub(super) fn closed(&mut self, by: Side) {
        self.closed_by.get_or_insert(by);
    }
}

impl Router {
    /// Describe frontend `id`'s peer for its audit record (UDS credentials,
    /// a client certificate's subject, an address): any text the IO layer
    /// chooses, kept as is.
    pub fn set_frontend_peer(&mut self, id: FrontendId, peer: Arc<str>) {
        if let Some(f) = self.frontends.get_mut(&id) {
            f.account.peer = Some(peer);
        }
    }

    /// A frontend left the router for good: its summary, if it dialled.
    pub(super) fn account_ended(&mut self, fid: FrontendId, f: &mut Frontend) {
        self.summarize(fid, f.kind, &mut f.account);
    }

    /// Queue the summary of `a` (taking its contents), if it dialled.
    fn summarize(&mut self, fid: FrontendId, kind: FrontendKind, a: &mut Account) {
        let (Some(started), Some(destination)) = (a.started.take(), a.destination.take()) else {
            return;
        };
        let (result, reason) = a.ended.unwrap_or(if a.connect_id != 0 {
            (ConnResult::Closed, "")
        } else {
            (ConnResult::Cancelled, "frontend_close")
        });
        self.actions
            .push_back(Action::ConnEnded(Box::new(ConnSummary {
                frontend: fid,
                kind,
                peer: a.peer.clone(),
                destination,
                agent_id: a.agent_id.take(),
                backend: a.backend,
                connect_id: a.connect_id,
                started,
                result,
                reason,
                closed_by: a.closed_by.unwrap_or(Side::Frontend),
                bytes_to_agent: a.up,
                bytes_from_agent: a.down,
            })));
    }

    /// The open connections (frontends that dialled and are still known),
    /// as at `now`, for `/debug/connections`. Not for the packet path: it
    /// walks every frontend.
    pub fn connections(&self, now: Instant) -> impl Iterator<Item = ConnView> + '_ {
        let lim = self.cfg.flow;
        self.frontends.iter().filter_map(move |(&fid, f)| {
            if f.established.is_empty() && f.pending.is_empty() {
                return None;
            }
            let a = &f.account;
            Some(ConnView {
                frontend: fid,
                kind: f.kind,
                peer: a.peer.clone(),
                destination: a.destination.clone()?,
                agent_id: a.agent_id.clone(),
                connect_id: a.connect_id,
                started: a.started?,
                bytes_to_agent: a.up,
                bytes_from_agent: a.down,
                queued: f.rx.queued(),
                withheld: f.rx.withheld(),
                pause_sent: f.rx.paused(),
                paused_by_agent: f.paused,
                stalled_since: f.rx.stalled_since(),
                stuck: f.rx.is_stuck(&lim, now),
            })
        })
    }

    /// A dial of frontend `fid` at `now` for `address`. A frontend whose
    /// previous dial is over (refused, failed, or closed: nothing pending
    /// or established — not something konnectivity-client does) leaves
    /// that one's summary first: one summary per dial.
    pub(super) fn account_dial(&mut self, now: Instant, fid: FrontendId, address: &str) {
        let Some(f) = self.frontends.get_mut(&fid) else {
            return;
        };
        let kind = f.kind;
        let over = f.pending.is_empty() && f.established.is_empty();
        let mut previous = None;
        if f.account.started.is_some() && over {
            let peer = f.account.peer.clone();
            previous = Some(std::mem::take(&mut f.account));
            f.account.peer = peer;
        }
        f.account.dialled(now, address);
        if let Some(mut a) = previous {
            self.summarize(fid, kind, &mut a);
        }
    }

    /// The accounting of frontend `fid`, if known.
    pub(super) fn account(&mut self, fid: FrontendId) -> Option<&mut Account> {
        self.frontends.get_mut(&fid).map(|f| &mut f.account)
    }
}

impl Account {
    /// A dial for `address` arrived at `now` (a frontend's later dial
    /// replaces an earlier one's destination).
    pub(super) fn dialled(&mut self, now: Instant, address: &str) {
        if self.destination.as_deref() != Some(address) {
            self.destination = Some(Arc::from(address));
        }
        self.started.get_or_insert(now);
    }
}
