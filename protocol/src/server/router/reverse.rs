//! The reverse direction (KEP-2025, docs/design/reverse.md): an agent asks
//! the server to dial a control-plane destination for a connection the
//! agent accepted on its node-local listener.
//!
//! Roles mirror the forward direction: the agent plays the frontend and the
//! server plays the agent. An agent that negotiated the extension sends
//! `REVERSE_DIAL_REQ{protocol, address, random}`; `address` is only a key
//! into the server's allow-list ([`ReverseConfig::allowed`]): nothing is
//! allowed when it is empty, a key must match the configured spelling
//! exactly, and the IO layer dials the destination *configured* for the
//! key ([`Action::ReverseDial`]), never the agent's string. Per agent, the
//! dials in flight plus the connections open are bounded, and new dials are
//! rate-limited (a token bucket on the caller's clock). Every refusal —
//! not allowed, over a limit, or a dial that failed — gets the same
//! generic answer ([`REVERSE_REFUSED`]), so the server cannot serve as a
//! port-scan oracle; the reason goes to metrics and logs
//! ([`Action::ReverseRefused`]).
//!
//! A dial that connects becomes a [`FrontendKind::Reverse`] frontend with a
//! negative, server-assigned connection id (agents assign positive ones to
//! the forward direction, so the two never collide on one tunnel), and from
//! then on it is served exactly like a CONNECT frontend: DATA both ways
//! under the same per-connection flow control, CLOSE_REQ from either side
//! answered with CLOSE_RSP.

use std::collections::{BTreeSet, HashMap};
use std::time::Instant;

use konn_frames::packet::{ByteStr, Packet};

use super::{Action, BackendId, Frontend, FrontendId, FrontendKind, Payload, Router, push_one};

/// The one answer to every refused or failed reverse dial.
pub const REVERSE_REFUSED: &str = "konn: reverse dial refused";

/// Reverse-direction settings.
#[derive(Clone, Debug)]
pub struct ReverseConfig {
    /// `--allowed-destination` keys, spelled exactly as configured, each
    /// with the index of its destination in the IO layer's list. Empty:
    /// every reverse dial is refused.
    pub allowed: HashMap<String, usize>,
    /// Dials in flight plus connections open, per agent tunnel.
    pub max_per_agent: usize,
    /// New dials per second, per agent tunnel (refill rate).
    pub dials_per_second: f64,
    /// Dials an idle agent may start at once (bucket size).
    pub burst: u32,
}

impl Default for ReverseConfig {
    fn default() -> Self {
        Self {
            allowed: HashMap::new(),
            max_per_agent: 256,
            dials_per_second: 100.0,
            burst: 100,
        }
    }
}

/// Why a reverse dial was refused (the `reason` label of konn's reverse
/// metrics; never sent to the agent).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReverseRefusal {
    /// The address is not an allow-list key.
    NotAllowed,
    /// A protocol other than `tcp`.
    Protocol,
    /// The agent's dials and connections are at their limit.
    Concurrency,
    /// The agent is over its dial rate.
    Rate,
    /// The agent reused the id of a dial still in flight.
    DuplicateId,
    /// The destination's name did not resolve.
    Resolve,
    /// The destination resolved to a denied address (loopback, link-local,
    /// metadata, unspecified, multicast) that is not listed explicitly.
    DeniedAddress,
    /// The dial timed out.
    Timeout,
    /// The dial failed (refused, unreachable, …).
    DialError,
    /// The connected peer is not the address dialled.
    PeerMismatch,
}

impl ReverseRefusal {
    /// The metric label value.
    pub const fn label(self) -> &'static str {
        match self {
            Self::NotAllowed => "not_allowed",
            Self::Protocol => "protocol",
            Self::Concurrency => "concurrency_limit",
            Self::Rate => "rate_limit",
            Self::DuplicateId => "duplicate_id",
            Self::Resolve => "resolve",
            Self::DeniedAddress => "denied_address",
            Self::Timeout => "timeout",
            Self::DialError => "dial_error",
            Self::PeerMismatch => "peer_mismatch",
        }
    }

    /// Every reason, for metrics set-up.
    pub const ALL: [Self; 10] = [
        Self::NotAllowed,
        Self::Protocol,
        Self::Concurrency,
        Self::Rate,
        Self::DuplicateId,
        Self::Resolve,
        Self::DeniedAddress,
        Self::Timeout,
        Self::DialError,
        Self::PeerMismatch,
    ];
}

/// One agent tunnel's reverse-direction state.
#[derive(Debug, Default)]
pub(super) struct ReverseState {
    /// The agent negotiated the extension.
    pub(super) on: bool,
    /// The last id handed out (ids count down from -1).
    last_id: i64,
    /// Dials in flight (the agent's randoms).
    pending: BTreeSet<i64>,
    /// Connections open.
    open: usize,
    /// Rate limiting: tokens left and when they were counted.
    tokens: f64,
    counted: Option<Instant>,
}

impl ReverseState {
    fn take_token(&mut self, now: Instant, cfg: &ReverseConfig) -> bool {
        let burst = f64::from(cfg.burst.max(1));
        let tokens = match self.counted {
            None => burst,
            Some(t) => {
                let secs = now.saturating_duration_since(t).as_secs_f64();
                (self.tokens + secs * cfg.dials_per_second).min(burst)
            }
        };
        self.counted = Some(now);
        if tokens >= 1.0 {
            self.tokens = tokens - 1.0;
            true
        } else {
            self.tokens = tokens;
            false
        }
    }

    fn next_id(&mut self) -> i64 {
        // -1, -2, …; never 0, never positive (wraps only after 2^63 dials).
        self.last_id = self.last_id.checked_sub(1).unwrap_or(-1);
        self.last_id
    }

    /// Dials in flight and connections open.
    pub(super) fn load(&self) -> (usize, usize) {
        (self.pending.len(), self.open)
    }
}

impl Router {
    /// The agent negotiated konn's reverse-direction extension
    /// (`konn-reverse`): its REVERSE_DIAL_REQs are served from now on.
    pub fn set_reverse(&mut self, id: BackendId, on: bool) {
        if let Some(b) = self.backends.get_mut(&id) {
            b.reverse.on = on;
        }
    }

    /// REVERSE_DIAL_REQ from backend `id` at `now`.
    pub(super) fn reverse_dial_req(
        &mut self,
        now: Instant,
        id: BackendId,
        protocol: &str,
        address: &str,
        random: i64,
    ) {
        let cfg = &self.cfg.reverse;
        let Some(b) = self.backends.get_mut(&id).filter(|b| b.remote.is_none()) else {
            return;
        };
        if !b.reverse.on {
            return; // not negotiated: ignored, as unknown packets are
        }
        let target = cfg.allowed.get(address).copied();
        let refusal = if protocol != "tcp" {
            Some(ReverseRefusal::Protocol)
        } else if target.is_none() {
            Some(ReverseRefusal::NotAllowed)
        } else if b.reverse.pending.contains(&random) {
            Some(ReverseRefusal::DuplicateId)
        } else if b.reverse.pending.len() + b.reverse.open >= cfg.max_per_agent {
            Some(ReverseRefusal::Concurrency)
        } else if !b.reverse.take_token(now, cfg) {
            Some(ReverseRefusal::Rate)
        } else {
            None
        };
        match (refusal, target) {
            (None, Some(target)) => {
                b.reverse.pending.insert(random);
                self.actions.push_back(Action::ReverseDial {
                    backend: id,
                    random,
                    target,
                });
            }
            (why, _) => {
                let why = why.unwrap_or(ReverseRefusal::NotAllowed);
                self.refuse_reverse(id, random, why);
            }
        }
    }

    /// The server's connection for reverse dial `random` of `backend`
    /// connected; the IO layer serves it as frontend `fid` (a socket like a
    /// CONNECT frontend's, already relaying). Returns its connection id, or
    /// `None` when the dial is no longer wanted (the tunnel went): the IO
    /// layer then closes the socket.
    pub fn reverse_dialed(
        &mut self,
        backend: BackendId,
        random: i64,
        fid: FrontendId,
    ) -> Option<i64> {
        let b = self.backends.get_mut(&backend)?;
        if !b.reverse.pending.remove(&random) {
            return None;
        }
        let connect_id = b.reverse.next_id();
        b.reverse.open += 1;
        b.established.insert(connect_id, fid);
        let mut f = Box::new(Frontend::new(FrontendKind::Reverse));
        f.backend = Some(backend);
        push_one(&mut f.established, (backend, connect_id));
        f.rx_backend = Some(backend);
        self.frontends.insert(fid, f);
        self.actions.push_back(Action::ReverseDialed);
        self.send_backend(
            backend,
            Payload::Packet(Packet::ReverseDialRsp {
                error: ByteStr::new(),
                connect_id,
                random,
            }),
        );
        Some(connect_id)
    }

    /// Reverse dial `random` of `backend` failed (`why`, for metrics): the
    /// agent gets the generic refusal.
    pub fn reverse_dial_failed(&mut self, backend: BackendId, random: i64, why: ReverseRefusal) {
        let Some(b) = self.backends.get_mut(&backend) else {
            return;
        };
        if b.reverse.pending.remove(&random) {
            self.refuse_reverse(backend, random, why);
        }
    }

    /// CLOSE_REQ from the agent for reverse connection `connect_id` (its
    /// local client went away): close our socket after what is queued for
    /// it, and answer CLOSE_RSP.
    pub(super) fn reverse_close_req(&mut self, id: BackendId, connect_id: i64) {
        let fid = self
            .backends
            .get_mut(&id)
            .and_then(|b| b.established.remove(&connect_id));
        let error = match fid {
            Some(fid) => {
                if let Some(f) = self.frontends.get_mut(&fid) {
                    f.established.clear();
                }
                self.close_frontend(fid);
                ByteStr::new()
            }
            None => ByteStr::from_static(crate::agent::tunnel::UNKNOWN_CONNECT_ID),
        };
        self.send_backend(id, Payload::Packet(Packet::CloseRsp { error, connect_id }));
    }

    /// A reverse frontend is being forgotten: its agent's count goes down.
    pub(super) fn reverse_forgotten(&mut self, f: &Frontend) {
        if f.kind != FrontendKind::Reverse {
            return;
        }
        if let Some(b) = f.rx_backend.and_then(|b| self.backends.get_mut(&b)) {
            b.reverse.open = b.reverse.open.saturating_sub(1);
        }
    }

    fn refuse_reverse(&mut self, id: BackendId, random: i64, why: ReverseRefusal) {
        self.actions.push_back(Action::ReverseRefused(why));
        self.send_backend(
            id,
            Payload::Packet(Packet::ReverseDialRsp {
                error: ByteStr::from_static(REVERSE_REFUSED),
                connect_id: 0,
                random,
            }),
        );
    }
}
