//! The proxy-agent's protocol state machine for one tunnel (one
//! `/AgentService/Connect` stream to one proxy-server), sans-IO.
//!
//! It assigns connectIDs, tracks dials and endpoints (the dialled
//! destination connections) and applies upstream's agent semantics
//! (reference §2.4): DIAL_REQ → dial → DIAL_RSP (error text or connectID),
//! DATA to the endpoint, CLOSE_REQ → close and CLOSE_RSP, remote EOF →
//! CLOSE_RSP after the queued data went out, unknown ids answered with
//! CLOSE_RSP errors. konn additionally honours DIAL_CLS (the dial is
//! cancelled and its socket never used), accepts only `tcp` dials, bounds
//! the number of endpoints, and flow-controls each endpoint:
//!
//! - every message's tunnel credit comes back as an [`Action::Release`];
//!   for DATA to an endpoint whose queue is over its limit it is held back
//!   until the queue drains ([`Tunnel::endpoint_drained`]), which bounds the
//!   queue without closing a slow-but-healthy connection;
//! - with konn's flow-control extension negotiated
//!   ([`Tunnel::set_flow_control`]), an endpoint whose queue goes above its
//!   high-water mark sends PAUSE to the server and RESUME once it is back
//!   at the low-water mark; PAUSE/RESUME from the server stop and restart
//!   reading of that endpoint's destination ([`Action::PauseRead`]);
//! - an endpoint whose queue drains nothing for the stuck timeout is closed
//!   with [`STUCK`] ([`Tunnel::handle_timeout`]) and its credit returned.
//!
//! With konn's `konn-resume` extension negotiated ([`Tunnel::set_resume`],
//! the `resume` submodule, docs/design/resume.md) the tunnel counts each
//! connection's bytes both ways, acknowledges them, keeps what it sent
//! until acknowledged ([`Tunnel::data_sent`]), parks its endpoints when
//! the tunnel breaks ([`Tunnel::tunnel_broken`]) and replays on a resumed
//! one ([`Tunnel::tunnel_resumed`]).
//!
//! The reverse direction (KEP-2025, docs/design/reverse.md), with konn's
//! `konn-reverse` extension negotiated ([`Tunnel::set_reverse`]): a
//! connection the agent accepted on a node-local listener asks the server
//! to dial with REVERSE_DIAL_REQ ([`Tunnel::reverse_open`]); the answer
//! carries a negative, server-assigned connection id, and from then on the
//! connection is an endpoint like any other (DATA both ways, the same flow
//! control), except that the agent plays the frontend: when its local
//! client goes away it sends CLOSE_REQ, not CLOSE_RSP.
//!
//! The per-endpoint accounting is [`crate::flow::FlowRx`]
//! (docs/design/tunnel.md, "Flow control"). The IO layer performs the
//! [`Action`]s: dialling with a timeout, writing payloads to endpoints,
//! reading endpoints into DATA packets (it encodes those itself on the hot
//! path), closing sockets, returning credit.

use crate::maps::IdMap;
use std::time::Instant;

use crate::flow::{FlowLimits, FlowRx, Signal, Step};
use bytes::Bytes;
use konn_frames::packet::{ByteStr, Packet};

/// Upstream's answer to DATA for an unknown connectID.
pub const UNRECOGNIZED_CONNECT_ID: &str = "unrecognized connectID";
/// Upstream's answer to CLOSE_REQ for an unknown connectID.
pub const UNKNOWN_CONNECT_ID: &str = "Unknown connectID";
/// The CLOSE_RSP error of an endpoint closed because its destination
/// stopped reading.
pub const STUCK: &str = "konn: destination stopped reading; connection closed";

/// Why a dial failed (the `reason` label of `endpoint_dial_failure_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DialFailure {
    /// The dial timed out.
    Timeout,
    /// Anything else.
    Unknown,
}

impl DialFailure {
    /// The metric label value.
    pub const fn label(self) -> &'static str {
        match self {
            Self::Timeout => "timeout",
            Self::Unknown => "unknown",
        }
    }
}

/// Something the IO layer must do.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// Send a packet to the server.
    ToServer(Packet),
    /// Dial `address` over TCP for `connect_id`; report with
    /// [`Tunnel::dial_succeeded`] or [`Tunnel::dial_failed`].
    Dial {
        /// The id the endpoint will have.
        connect_id: i64,
        /// `host:port`.
        address: ByteStr,
    },
    /// Abandon the dial of `connect_id` (DIAL_CLS): close the socket if it
    /// connects anyway.
    CancelDial {
        /// The endpoint.
        connect_id: i64,
    },
    /// Write a payload to an endpoint (queued per endpoint); report what
    /// the destination took with [`Tunnel::endpoint_drained`].
    Write {
        /// The endpoint.
        connect_id: i64,
        /// The bytes (a slice of the received message).
        data: Bytes,
    },
    /// Close an endpoint: stop reading it, flush what is queued for it
    /// (bounded by the write timeout), then close the socket. An endpoint
    /// closed as stuck has its queue dropped instead.
    Close {
        /// The endpoint.
        connect_id: i64,
    },
    /// Close an endpoint whose destination stopped reading: drop what is
    /// queued for it and close the socket now.
    Abort {
        /// The endpoint.
        connect_id: i64,
    },
    /// Return this much of the tunnel stream's HTTP/2 credit to the server.
    Release(usize),
    /// Stop reading the endpoint's destination (PAUSE from the server).
    PauseRead {
        /// The endpoint.
        connect_id: i64,
    },
    /// Read the endpoint's destination again (RESUME from the server).
    ResumeRead {
        /// The endpoint.
        connect_id: i64,
    },
    /// A dial failed (metrics).
    DialFailed(DialFailure),
    /// A dial succeeded (metrics: the IO layer measured its duration).
    DialSucceeded,
    /// The server dialled reverse dial `random`: the accepted connection is
    /// endpoint `connect_id` (negative) from now on.
    ReverseEstablished {
        /// The agent's dial id.
        random: i64,
        /// The endpoint's id.
        connect_id: i64,
    },
    /// Reverse dial `random` was refused or failed, or the tunnel went:
    /// close the accepted connection.
    ReverseFailed {
        /// The agent's dial id.
        random: i64,
    },
}

/// An open endpoint's flow-control state.
#[derive(Debug, Default, PartialEq, Eq)]
struct Flow {
    /// Server → destination: the endpoint's queue.
    rx: FlowRx,
    /// Destination → server: reading paused by the server's PAUSE.
    read_paused: bool,
}

/// An open endpoint's flow-control state as [`Tunnel::endpoint_flow`]
/// reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EndpointFlow {
    /// Bytes from the server queued towards the destination (as reported
    /// drained so far).
    pub queued: usize,
    /// Tunnel credit held back for it.
    pub withheld: usize,
    /// The agent sent PAUSE: the destination is behind.
    pub pause_sent: bool,
    /// The server sent PAUSE: the destination is not read (its frontend is
    /// behind).
    pub read_paused: bool,
    /// Since when its non-empty queue has not drained.
    pub stalled_since: Option<Instant>,
    /// It counts as stuck (closed at the next check).
    pub stuck: bool,
}

#[derive(Debug, PartialEq, Eq)]
enum Endpoint {
    Dialing { random: i64 },
    Open(Flow),
}

/// Tunnel settings.
#[derive(Clone, Copy, Debug)]
pub struct TunnelConfig {
    /// Endpoints (open or dialling) one tunnel may have.
    pub max_endpoints: usize,
    /// Each endpoint's queue marks and stuck timeout.
    pub flow: FlowLimits,
}

impl Default for TunnelConfig {
    fn default() -> Self {
        Self {
            max_endpoints: 16 * 1024,
            flow: FlowLimits::default(),
        }
    }
}

/// One tunnel's state. See the module docs.
#[derive(Debug)]
pub struct Tunnel {
    cfg: TunnelConfig,
    next_connect_id: i64,
    endpoints: IdMap<i64, Endpoint>,
    actions: std::collections::VecDeque<Action>,
    draining: bool,
    /// Both sides negotiated PAUSE/RESUME.
    flow_control: bool,
    /// Both sides negotiated the reverse direction.
    reverse: bool,
    /// Reverse dials waiting for the server's answer (the agent's ids).
    reverse_pending: std::collections::BTreeSet<i64>,
    /// `konn-resume`, when negotiated (`resume.rs`).
    resume: Option<crate::resume::ResumeSession>,
}

impl Tunnel {
    /// A fresh tunnel; connectIDs start at 1.
    pub fn new(cfg: TunnelConfig) -> Self {
        Self {
            cfg,
            next_connect_id: 1,
            endpoints: IdMap::default(),
            actions: std::collections::VecDeque::new(),
            draining: false,
            flow_control: false,
            reverse: false,
            reverse_pending: std::collections::BTreeSet::new(),
            resume: None,
        }
    }

    /// The server answered the agent's `konn-reverse` offer: reverse dials
    /// may be asked for from now on.
    pub fn set_reverse(&mut self, on: bool) {
        self.reverse = on;
    }

    /// Whether the reverse direction was negotiated.
    pub fn reverse(&self) -> bool {
        self.reverse
    }

    /// Ask the server to dial `address` (an allow-list key) for a
    /// connection the agent accepted; `random` identifies it until the
    /// answer ([`Action::ReverseEstablished`] or [`Action::ReverseFailed`]).
    /// Returns false — and asks nothing — when the extension was not
    /// negotiated, the id is in use, or the tunnel is at its endpoint
    /// limit: the IO layer closes the connection.
    pub fn reverse_open(&mut self, random: i64, address: &str) -> bool {
        if !self.reverse
            || self.reverse_pending.contains(&random)
            || self.endpoints.len() + self.reverse_pending.len() >= self.cfg.max_endpoints
        {
            return false;
        }
        self.reverse_pending.insert(random);
        self.actions
            .push_back(Action::ToServer(Packet::ReverseDialReq {
                protocol: ByteStr::from_static("tcp"),
                address: ByteStr::from(address.to_owned()),
                random,
            }));
        true
    }

    /// Reverse dials waiting for an answer.
    pub fn reverse_pending(&self) -> usize {
        self.reverse_pending.len()
    }

    /// The server answered the agent's `konn-flow-control` offer: PAUSE
    /// and RESUME may be sent and are honoured from now on.
    pub fn set_flow_control(&mut self, on: bool) {
        self.flow_control = on;
    }

    /// Whether PAUSE/RESUME were negotiated.
    pub fn flow_control(&self) -> bool {
        self.flow_control
    }

    /// The next action.
    pub fn poll_action(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    /// Endpoints open.
    pub fn open_endpoints(&self) -> usize {
        self.endpoints
            .values()
            .filter(|e| matches!(e, Endpoint::Open(_)))
            .count()
    }

    /// Endpoints open or dialling.
    pub fn endpoints(&self) -> usize {
        self.endpoints.len()
    }

    /// Whether `connect_id` is an open endpoint.
    pub fn is_open(&self, connect_id: i64) -> bool {
        matches!(self.endpoints.get(&connect_id), Some(Endpoint::Open(_)))
    }

    /// Bytes queued for an open endpoint, as counted here.
    pub fn queued(&self, connect_id: i64) -> Option<usize> {
        self.flow(connect_id).map(|f| f.rx.queued())
    }

    /// Whether the endpoint waits for drain reports (a RESUME to send or
    /// credit to return): the IO layer must then report every write at
    /// once; otherwise it may batch them until the next DATA for it.
    pub fn waits_for_drain(&self, connect_id: i64) -> bool {
        self.flow(connect_id)
            .is_some_and(|f| f.rx.waits_for_drain())
    }

    /// One endpoint's flow-control state at `now` (for the agent's
    /// `/debug/connections`); `None` while it is dialling or unknown. Not
    /// for the packet path.
    pub fn endpoint_flow(&self, connect_id: i64, now: Instant) -> Option<EndpointFlow> {
        let f = self.flow(connect_id)?;
        Some(EndpointFlow {
            queued: f.rx.queued(),
            withheld: f.rx.withheld(),
            pause_sent: f.rx.paused(),
            read_paused: f.read_paused,
            stalled_since: f.rx.stalled_since(),
            stuck: f.rx.is_stuck(&self.cfg.flow, now),
        })
    }

    fn flow(&self, connect_id: i64) -> Option<&Flow> {
        match self.endpoints.get(&connect_id) {
            Some(Endpoint::Open(f)) => Some(f),
            _ => None,
        }
    }

    /// A packet from the server that arrived at `now` carrying `credit`
    /// bytes of the tunnel stream's HTTP/2 credit.
    pub fn server_packet(&mut self, now: Instant, packet: Packet, credit: usize) {
        match packet {
            Packet::DialReq {
                protocol,
                address,
                random,
            } => self.dial_req(&protocol, address, random),
            Packet::Data {
                connect_id, data, ..
            } => {
                let Some(data) = self.resume_received(now, connect_id, data) else {
                    self.release(credit); // a duplicate, or a violation
                    return;
                };
                let may_pause = self.flow_control;
                let lim = self.cfg.flow;
                if let Some(Endpoint::Open(f)) = self.endpoints.get_mut(&connect_id) {
                    let step = f.rx.push(data.len(), credit, &lim, may_pause, now);
                    if f.rx.is_stuck(&lim, now) {
                        // Over the memory cap, or nothing drained for the
                        // stuck timeout: this payload is not queued.
                        self.release(step.release);
                        self.endpoint_stuck(connect_id);
                        return;
                    }
                    self.actions.push_back(Action::Write { connect_id, data });
                    self.step(connect_id, step);
                    return;
                }
                self.close_rsp(connect_id, UNRECOGNIZED_CONNECT_ID);
            }
            // A replayed duplicate of a close already handled.
            Packet::CloseReq { connect_id } if !self.resume_close_received(now, connect_id) => {}
            Packet::CloseReq { connect_id } => match self.endpoints.get(&connect_id) {
                Some(Endpoint::Open(_)) => {
                    self.remove_open(connect_id);
                    self.actions.push_back(Action::Close { connect_id });
                    self.close_rsp(connect_id, "");
                }
                _ => self.close_rsp(connect_id, UNKNOWN_CONNECT_ID),
            },
            Packet::DialCls { random } => {
                // konn honours DIAL_CLS: the server gave up on this dial.
                let found = self
                    .endpoints
                    .iter()
                    .find(|(_, e)| **e == Endpoint::Dialing { random })
                    .map(|(c, _)| *c);
                if let Some(connect_id) = found {
                    self.endpoints.remove(&connect_id);
                    self.actions.push_back(Action::CancelDial { connect_id });
                }
            }
            // konn's extension, only from a server that negotiated it; a
            // flow closed meanwhile is ignored.
            Packet::Pause { connect_id } if self.flow_control => {
                if let Some(Endpoint::Open(f)) = self.endpoints.get_mut(&connect_id)
                    && !f.read_paused
                {
                    f.read_paused = true;
                    self.actions.push_back(Action::PauseRead { connect_id });
                }
            }
            Packet::Resume { connect_id } if self.flow_control => {
                if let Some(Endpoint::Open(f)) = self.endpoints.get_mut(&connect_id)
                    && f.read_paused
                {
                    f.read_paused = false;
                    self.actions.push_back(Action::ResumeRead { connect_id });
                }
            }
            Packet::ReverseDialRsp {
                error,
                connect_id,
                random,
            } if self.reverse => self.reverse_dial_rsp(random, connect_id, error.is_empty()),
            // Not for an agent, or not negotiated: ignored, as upstream
            // ignores packets it does not expect (CLOSE_RSP answers a
            // reverse connection's CLOSE_REQ, already forgotten here).
            Packet::DialRsp { .. }
            | Packet::CloseRsp { .. }
            | Packet::Drain
            | Packet::Pause { .. }
            | Packet::Resume { .. }
            | Packet::ReverseDialReq { .. }
            | Packet::ReverseDialRsp { .. } => {}
            p @ (Packet::Ack { .. } | Packet::Resumed) => self.resume_packet(p),
        }
        // Everything but DATA to an open endpoint is done with.
        self.release(credit);
    }

    /// `n` bytes queued for `connect_id` were written to its destination
    /// at `at` (the IO layer may add up several writes).
    pub fn endpoint_drained(&mut self, connect_id: i64, n: usize, at: Instant) {
        let lim = self.cfg.flow;
        if let Some(Endpoint::Open(f)) = self.endpoints.get_mut(&connect_id) {
            let step = f.rx.drain(n, &lim, at);
            self.step(connect_id, step);
        }
    }

    /// The earliest moment an endpoint may become stuck.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let lim = &self.cfg.flow;
        self.endpoints
            .values()
            .filter_map(|e| match e {
                Endpoint::Open(f) => f.rx.deadline(lim),
                Endpoint::Dialing { .. } => None,
            })
            .chain(self.resume_timeout())
            .min()
    }

    /// Close every endpoint that is stuck at `now` (nothing drained from a
    /// non-empty queue for the stuck timeout).
    pub fn handle_timeout(&mut self, now: Instant) {
        self.resume_handle_timeout(now);
        let lim = self.cfg.flow;
        let mut stuck: Vec<i64> = self
            .endpoints
            .iter()
            .filter(|(_, e)| matches!(e, Endpoint::Open(f) if f.rx.is_stuck(&lim, now)))
            .map(|(c, _)| *c)
            .collect();
        stuck.sort_unstable();
        for connect_id in stuck {
            self.endpoint_stuck(connect_id);
        }
    }

    fn step(&mut self, connect_id: i64, step: Step) {
        self.release(step.release);
        match step.signal {
            Some(Signal::Pause) => self
                .actions
                .push_back(Action::ToServer(Packet::Pause { connect_id })),
            Some(Signal::Resume) => self
                .actions
                .push_back(Action::ToServer(Packet::Resume { connect_id })),
            None => {}
        }
    }

    fn release(&mut self, credit: usize) {
        if credit > 0 {
            self.actions.push_back(Action::Release(credit));
        }
    }

    /// Forget an open endpoint and return the credit it held back.
    fn remove_open(&mut self, connect_id: i64) -> bool {
        if !self.is_open(connect_id) {
            return false;
        }
        if let Some(Endpoint::Open(mut f)) = self.endpoints.remove(&connect_id) {
            let withheld = f.rx.close();
            self.release(withheld);
        }
        true
    }

    fn dial_req(&mut self, protocol: &str, address: ByteStr, random: i64) {
        // A failed dial still uses up an id, as upstream's does.
        let connect_id = self.next_connect_id;
        self.next_connect_id += 1;
        let refuse = if protocol != "tcp" {
            Some(format!(
                "dial {protocol} {address}: konn: only tcp dials are allowed"
            ))
        } else if self.endpoints.len() >= self.cfg.max_endpoints {
            Some(format!(
                "dial tcp {address}: konn: too many connections on this tunnel"
            ))
        } else {
            None
        };
        if let Some(error) = refuse {
            self.actions
                .push_back(Action::DialFailed(DialFailure::Unknown));
            self.actions.push_back(Action::ToServer(Packet::DialRsp {
                error: ByteStr::from(error),
                connect_id: 0,
                random,
            }));
            return;
        }
        self.endpoints
            .insert(connect_id, Endpoint::Dialing { random });
        self.actions.push_back(Action::Dial {
            connect_id,
            address,
        });
    }

    /// The dial of `connect_id` connected. Returns false when the dial was
    /// cancelled meanwhile (the IO layer then closes the socket).
    pub fn dial_succeeded(&mut self, connect_id: i64) -> bool {
        let Some(Endpoint::Dialing { random }) = self.endpoints.get(&connect_id) else {
            return false;
        };
        let random = *random;
        self.endpoints
            .insert(connect_id, Endpoint::Open(Flow::default()));
        self.resume_open(connect_id);
        self.actions.push_back(Action::DialSucceeded);
        self.actions.push_back(Action::ToServer(Packet::DialRsp {
            error: ByteStr::new(),
            connect_id,
            random,
        }));
        true
    }

    /// The dial of `connect_id` failed with Go-compatible error text (e.g.
    /// `dial tcp 10.0.0.5:1: connect: connection refused`).
    pub fn dial_failed(&mut self, connect_id: i64, error: String, why: DialFailure) {
        let Some(&Endpoint::Dialing { random }) = self.endpoints.get(&connect_id) else {
            return;
        };
        self.endpoints.remove(&connect_id);
        self.actions.push_back(Action::DialFailed(why));
        self.actions.push_back(Action::ToServer(Packet::DialRsp {
            error: ByteStr::from(error),
            connect_id: 0,
            random,
        }));
    }

    /// The destination closed (EOF or error) and everything read from it
    /// has been sent: tell the server (upstream sends CLOSE_RSP; a reverse
    /// connection's local client ending sends CLOSE_REQ).
    pub fn endpoint_closed(&mut self, connect_id: i64) {
        if self.remove_open(connect_id) {
            self.actions.push_back(Action::Close { connect_id });
            self.closed(connect_id, "");
        }
    }

    /// The destination stopped reading for too long: close it with an
    /// error and return the credit its queue held back.
    pub fn endpoint_stuck(&mut self, connect_id: i64) {
        if self.remove_open(connect_id) {
            self.actions.push_back(Action::Abort { connect_id });
            self.closed(connect_id, STUCK);
        }
    }

    /// Tell the server this side closed `connect_id`.
    fn closed(&mut self, connect_id: i64, error: &str) {
        if connect_id < 0 {
            if self.resume_close_sent(connect_id) {
                self.actions
                    .push_back(Action::ToServer(Packet::CloseReq { connect_id }));
            }
        } else {
            self.close_rsp(connect_id, error);
        }
    }

    fn reverse_dial_rsp(&mut self, random: i64, connect_id: i64, ok: bool) {
        if !self.reverse_pending.remove(&random) {
            return; // not ours, or answered already
        }
        if ok && connect_id < 0 && !self.endpoints.contains_key(&connect_id) {
            self.endpoints
                .insert(connect_id, Endpoint::Open(Flow::default()));
            self.resume_open(connect_id);
            self.actions
                .push_back(Action::ReverseEstablished { random, connect_id });
        } else {
            if ok {
                // A malformed success: the server gets its connection back.
                self.actions
                    .push_back(Action::ToServer(Packet::CloseReq { connect_id }));
            }
            self.actions.push_back(Action::ReverseFailed { random });
        }
    }

    /// Announce DRAIN to the server (once).
    pub fn drain(&mut self) {
        if !std::mem::replace(&mut self.draining, true) {
            self.actions.push_back(Action::ToServer(Packet::Drain));
        }
    }

    /// The tunnel is gone: every endpoint closes, every dial is abandoned.
    pub fn tunnel_gone(&mut self) {
        if let Some(s) = self.resume.as_mut() {
            s.abandon();
        }
        for random in std::mem::take(&mut self.reverse_pending) {
            self.actions.push_back(Action::ReverseFailed { random });
        }
        let mut ids: Vec<(i64, bool)> = self
            .endpoints
            .drain()
            .map(|(c, e)| (c, matches!(e, Endpoint::Open(_))))
            .collect();
        ids.sort_unstable();
        for (connect_id, open) in ids {
            self.actions.push_back(if open {
                Action::Close { connect_id }
            } else {
                Action::CancelDial { connect_id }
            });
        }
    }

    fn close_rsp(&mut self, connect_id: i64, error: &str) {
        if !self.resume_close_sent(connect_id) {
            return; // parked: the replay sends it
        }
        self.actions.push_back(Action::ToServer(Packet::CloseRsp {
            error: if error.is_empty() {
                ByteStr::new()
            } else {
                ByteStr::from(error.to_owned())
            },
            connect_id,
        }));
    }
}

mod invariants;
mod resume;

pub use resume::RESUME_VIOLATION;

#[cfg(test)]
mod tests {
    use super::*;

    fn t0() -> Instant {
        crate::test_epoch()
    }

    fn actions(t: &mut Tunnel) -> Vec<Action> {
        std::iter::from_fn(|| t.poll_action()).collect()
    }

    fn dial_req(protocol: &'static str, random: i64) -> Packet {
        Packet::DialReq {
            protocol: ByteStr::from_static(protocol),
            address: ByteStr::from_static("10.0.0.5:10250"),
            random,
        }
    }

    fn close_rsp(connect_id: i64, error: &'static str) -> Action {
        Action::ToServer(Packet::CloseRsp {
            error: ByteStr::from_static(error),
            connect_id,
        })
    }

    #[test]
    fn dial_data_close() {
        let mut t = Tunnel::new(TunnelConfig::default());
        t.server_packet(t0(), dial_req("tcp", 42), 0);
        assert_eq!(
            actions(&mut t),
            vec![Action::Dial {
                connect_id: 1,
                address: ByteStr::from_static("10.0.0.5:10250")
            }]
        );
        assert!(t.dial_succeeded(1));
        assert_eq!(
            actions(&mut t),
            vec![
                Action::DialSucceeded,
                Action::ToServer(Packet::DialRsp {
                    error: ByteStr::new(),
                    connect_id: 1,
                    random: 42
                })
            ]
        );
        t.server_packet(
            t0(),
            Packet::Data {
                connect_id: 1,
                error: ByteStr::new(),
                data: Bytes::from_static(b"x"),
            },
            0,
        );
        assert_eq!(
            actions(&mut t),
            vec![Action::Write {
                connect_id: 1,
                data: Bytes::from_static(b"x")
            }]
        );
        t.server_packet(t0(), Packet::CloseReq { connect_id: 1 }, 0);
        assert_eq!(
            actions(&mut t),
            vec![Action::Close { connect_id: 1 }, close_rsp(1, "")]
        );
        assert_eq!(t.endpoints(), 0);
    }

    #[test]
    fn connect_ids_are_unique_and_nonzero_even_after_failures() {
        let mut t = Tunnel::new(TunnelConfig::default());
        t.server_packet(t0(), dial_req("tcp", 1), 0);
        t.dial_failed(
            1,
            "dial tcp 10.0.0.5:1: connect: connection refused".into(),
            DialFailure::Unknown,
        );
        t.server_packet(t0(), dial_req("tcp", 2), 0);
        let acts = actions(&mut t);
        assert!(acts.contains(&Action::ToServer(Packet::DialRsp {
            error: ByteStr::from_static("dial tcp 10.0.0.5:1: connect: connection refused"),
            connect_id: 0,
            random: 1
        })));
        assert!(acts.contains(&Action::Dial {
            connect_id: 2,
            address: ByteStr::from_static("10.0.0.5:10250")
        }));
    }

    #[test]
    fn only_tcp_is_dialled() {
        let mut t = Tunnel::new(TunnelConfig::default());
        for p in ["udp", "unix", "", "TCP"] {
            t.server_packet(
                t0(),
                Packet::DialReq {
                    protocol: ByteStr::from(p.to_owned()),
                    address: ByteStr::from_static("/var/run/docker.sock"),
                    random: 9,
                },
                0,
            );
            let acts = actions(&mut t);
            assert!(
                !acts.iter().any(|a| matches!(a, Action::Dial { .. })),
                "{p:?} must not dial"
            );
            assert!(acts.iter().any(
                |a| matches!(a, Action::ToServer(Packet::DialRsp { error, connect_id: 0, random: 9 }) if error.contains("only tcp"))
            ));
        }
    }

    #[test]
    fn unknown_ids_are_answered_like_upstream() {
        let mut t = Tunnel::new(TunnelConfig::default());
        t.server_packet(
            t0(),
            Packet::Data {
                connect_id: 5,
                error: ByteStr::new(),
                data: Bytes::new(),
            },
            0,
        );
        t.server_packet(t0(), Packet::CloseReq { connect_id: 6 }, 0);
        assert_eq!(
            actions(&mut t),
            vec![
                close_rsp(5, "unrecognized connectID"),
                close_rsp(6, "Unknown connectID")
            ]
        );
    }

    #[test]
    fn dial_cls_cancels_a_pending_dial() {
        let mut t = Tunnel::new(TunnelConfig::default());
        t.server_packet(t0(), dial_req("tcp", 42), 0);
        actions(&mut t);
        t.server_packet(t0(), Packet::DialCls { random: 42 }, 0);
        assert_eq!(actions(&mut t), vec![Action::CancelDial { connect_id: 1 }]);
        assert!(!t.dial_succeeded(1), "a late connect is dropped");
        assert!(
            actions(&mut t).is_empty(),
            "no DIAL_RSP for a cancelled dial"
        );
        assert_eq!(t.endpoints(), 0);
    }

    #[test]
    fn remote_eof_and_stuck_send_close_rsp() {
        let mut t = Tunnel::new(TunnelConfig::default());
        for r in [1, 2] {
            t.server_packet(t0(), dial_req("tcp", r), 0);
        }
        t.dial_succeeded(1);
        t.dial_succeeded(2);
        actions(&mut t);
        t.endpoint_closed(1);
        assert_eq!(
            actions(&mut t),
            vec![Action::Close { connect_id: 1 }, close_rsp(1, "")]
        );
        t.endpoint_stuck(2);
        assert_eq!(
            actions(&mut t),
            vec![Action::Abort { connect_id: 2 }, close_rsp(2, STUCK)]
        );
        t.endpoint_closed(2);
        assert!(actions(&mut t).is_empty(), "closing twice is harmless");
    }

    #[test]
    fn tunnel_gone_closes_everything() {
        let mut t = Tunnel::new(TunnelConfig::default());
        t.server_packet(t0(), dial_req("tcp", 1), 0);
        t.server_packet(t0(), dial_req("tcp", 2), 0);
        t.dial_succeeded(1);
        actions(&mut t);
        t.tunnel_gone();
        assert_eq!(
            actions(&mut t),
            vec![
                Action::Close { connect_id: 1 },
                Action::CancelDial { connect_id: 2 }
            ]
        );
        assert_eq!(t.endpoints(), 0);
    }

    #[test]
    fn endpoint_limit() {
        let mut t = Tunnel::new(TunnelConfig {
            max_endpoints: 1,
            ..TunnelConfig::default()
        });
        t.server_packet(t0(), dial_req("tcp", 1), 0);
        t.server_packet(t0(), dial_req("tcp", 2), 0);
        let acts = actions(&mut t);
        assert_eq!(
            acts.iter()
                .filter(|a| matches!(a, Action::Dial { .. }))
                .count(),
            1
        );
    }

    #[test]
    fn drain_is_sent_once() {
        let mut t = Tunnel::new(TunnelConfig::default());
        t.drain();
        t.drain();
        assert_eq!(actions(&mut t), vec![Action::ToServer(Packet::Drain)]);
    }

    // ----- flow control -----

    use std::time::Duration;

    /// Small marks so a few packets cross them: low 100, high 400, limit
    /// 1000, cap 5000, stuck after 10 s.
    fn flow_tunnel(negotiated: bool) -> Tunnel {
        let mut t = Tunnel::new(TunnelConfig {
            flow: FlowLimits {
                low: 100,
                high: 400,
                limit: 1000,
                cap: 5000,
                stuck_timeout: Duration::from_secs(10),
            },
            ..TunnelConfig::default()
        });
        t.set_flow_control(negotiated);
        t.server_packet(t0(), dial_req("tcp", 1), 0);
        assert!(t.dial_succeeded(1));
        actions(&mut t);
        t
    }

    fn at(secs: u64) -> Instant {
        t0() + Duration::from_secs(secs)
    }

    /// DATA of `len` bytes for endpoint 1 with `len + 10` bytes of credit.
    fn data_in(t: &mut Tunnel, now: Instant, len: usize) -> Vec<Action> {
        t.server_packet(
            now,
            Packet::Data {
                connect_id: 1,
                error: ByteStr::new(),
                data: Bytes::from(vec![7u8; len]),
            },
            len + 10,
        );
        actions(t)
    }

    fn released(acts: &[Action]) -> usize {
        acts.iter()
            .map(|a| match a {
                Action::Release(n) => *n,
                _ => 0,
            })
            .sum()
    }

    fn sent(acts: &[Action]) -> Vec<Packet> {
        acts.iter()
            .filter_map(|a| match a {
                Action::ToServer(p) => Some(p.clone()),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn pause_at_high_water_resume_at_low_water_once_each() {
        let mut t = flow_tunnel(true);
        let acts = data_in(&mut t, at(0), 400);
        assert!(sent(&acts).is_empty(), "at the mark, not above it");
        assert_eq!(released(&acts), 410, "credit goes back below the limit");
        let acts = data_in(&mut t, at(0), 1);
        assert_eq!(sent(&acts), vec![Packet::Pause { connect_id: 1 }]);
        assert_eq!(released(&acts), 11);
        assert!(t.waits_for_drain(1));
        for _ in 0..3 {
            let acts = data_in(&mut t, at(1), 100);
            assert!(sent(&acts).is_empty(), "one PAUSE outstanding at most");
            assert_eq!(released(&acts), 110, "in-flight data still under the limit");
        }
        assert_eq!(t.queued(1), Some(701));
        t.endpoint_drained(1, 600, at(2));
        assert!(actions(&mut t).is_empty(), "101 left: above the low mark");
        t.endpoint_drained(1, 1, at(2));
        assert_eq!(
            actions(&mut t),
            vec![Action::ToServer(Packet::Resume { connect_id: 1 })]
        );
        t.endpoint_drained(1, 100, at(2));
        assert!(actions(&mut t).is_empty(), "one RESUME");
        assert!(!t.waits_for_drain(1));
        // And again: hysteresis, not a latch.
        let acts = data_in(&mut t, at(3), 500);
        assert_eq!(sent(&acts), vec![Packet::Pause { connect_id: 1 }]);
    }

    #[test]
    fn without_negotiation_no_pause_but_credit_withheld_and_released_on_drain() {
        let mut t = flow_tunnel(false);
        let acts = data_in(&mut t, at(0), 1000);
        assert_eq!(released(&acts), 1010);
        let mut held = 0;
        for _ in 0..4 {
            let acts = data_in(&mut t, at(0), 100);
            assert!(
                sent(&acts).is_empty(),
                "never PAUSE to an un-negotiated peer"
            );
            assert_eq!(released(&acts), 0, "over the limit: withheld");
            assert!(
                acts.iter().any(|a| matches!(a, Action::Write { .. })),
                "not dropped"
            );
            held += 110;
        }
        assert!(t.waits_for_drain(1));
        t.endpoint_drained(1, 400, at(1));
        assert!(
            actions(&mut t).is_empty(),
            "back at the limit, not under it"
        );
        t.endpoint_drained(1, 300, at(1));
        assert_eq!(actions(&mut t), vec![Action::Release(300)]);
        t.endpoint_drained(1, 700, at(1));
        assert_eq!(actions(&mut t), vec![Action::Release(held - 300)]);
        assert!(!t.waits_for_drain(1));
        assert!(t.is_open(1), "a slow flow is never closed for being slow");
    }

    #[test]
    fn stuck_endpoint_is_closed_and_its_credit_returned() {
        let mut t = flow_tunnel(false);
        data_in(&mut t, at(0), 1000);
        let withheld: usize = (0..3)
            .map(|_| released(&data_in(&mut t, at(1), 100)) + 110)
            .sum();
        assert_eq!(t.poll_timeout(), Some(at(10)));
        t.handle_timeout(at(9));
        assert!(actions(&mut t).is_empty());
        // Progress at 9 s restarts the clock.
        t.endpoint_drained(1, 10, at(9));
        actions(&mut t);
        assert_eq!(t.poll_timeout(), Some(at(19)));
        t.handle_timeout(at(18));
        assert!(actions(&mut t).is_empty(), "slow is not stuck");
        t.handle_timeout(at(19));
        assert_eq!(
            actions(&mut t),
            vec![
                Action::Release(withheld),
                Action::Abort { connect_id: 1 },
                close_rsp(1, STUCK)
            ]
        );
        assert!(!t.is_open(1));
        assert_eq!(t.poll_timeout(), None);
        // Data still in flight for it is answered, its credit returned.
        let acts = data_in(&mut t, at(20), 5);
        assert_eq!(
            acts,
            vec![close_rsp(1, UNRECOGNIZED_CONNECT_ID), Action::Release(15)]
        );
    }

    #[test]
    fn a_paused_flow_that_never_drains_is_stuck_too() {
        let mut t = flow_tunnel(true);
        let acts = data_in(&mut t, at(0), 500);
        assert_eq!(sent(&acts), vec![Packet::Pause { connect_id: 1 }]);
        t.handle_timeout(at(10));
        let acts = actions(&mut t);
        assert!(acts.contains(&Action::Abort { connect_id: 1 }));
        assert!(acts.contains(&close_rsp(1, STUCK)));
        assert!(!sent(&acts).contains(&Packet::Resume { connect_id: 1 }));
    }

    #[test]
    fn over_the_cap_is_closed_at_once() {
        let mut t = flow_tunnel(false);
        assert_eq!(released(&data_in(&mut t, at(0), 5000)), 0, "over the limit");
        let acts = data_in(&mut t, at(0), 1);
        assert!(!acts.iter().any(|a| matches!(a, Action::Write { .. })));
        assert!(acts.contains(&Action::Abort { connect_id: 1 }));
        assert_eq!(released(&acts), 5010 + 11, "all withheld credit comes back");
    }

    #[test]
    fn endpoint_flow_shows_queue_pause_and_stuck() {
        let mut t = flow_tunnel(true);
        let fresh = t.endpoint_flow(1, at(0)).unwrap();
        assert_eq!(
            (fresh.queued, fresh.pause_sent, fresh.stuck),
            (0, false, false)
        );
        data_in(&mut t, at(0), 500);
        t.server_packet(at(0), Packet::Pause { connect_id: 1 }, 0);
        actions(&mut t);
        let f = t.endpoint_flow(1, at(1)).unwrap();
        assert_eq!(f.queued, 500);
        assert!(f.pause_sent && f.read_paused && !f.stuck);
        assert_eq!(f.stalled_since, Some(at(0)));
        assert!(t.endpoint_flow(1, at(10)).unwrap().stuck);
        assert_eq!(t.endpoint_flow(9, at(0)), None);
        // A dial in flight has no flow yet.
        t.server_packet(at(0), dial_req("tcp", 77), 0);
        assert_eq!(t.endpoint_flow(2, at(0)), None);
    }

    #[test]
    fn pause_and_resume_from_the_server_stop_and_restart_reading() {
        let mut t = flow_tunnel(true);
        let p = |t: &mut Tunnel, p: Packet| {
            t.server_packet(at(0), p, 7);
            actions(t)
        };
        assert_eq!(
            p(&mut t, Packet::Pause { connect_id: 1 }),
            vec![Action::PauseRead { connect_id: 1 }, Action::Release(7)]
        );
        assert_eq!(
            p(&mut t, Packet::Pause { connect_id: 1 }),
            vec![Action::Release(7)]
        );
        assert_eq!(
            p(&mut t, Packet::Resume { connect_id: 1 }),
            vec![Action::ResumeRead { connect_id: 1 }, Action::Release(7)]
        );
        assert_eq!(
            p(&mut t, Packet::Resume { connect_id: 1 }),
            vec![Action::Release(7)]
        );
        // A flow that closed meanwhile: ignored.
        assert_eq!(
            p(&mut t, Packet::Pause { connect_id: 9 }),
            vec![Action::Release(7)]
        );
        // Not negotiated: an unexpected packet, ignored like upstream's.
        t.set_flow_control(false);
        assert_eq!(
            p(&mut t, Packet::Pause { connect_id: 1 }),
            vec![Action::Release(7)]
        );
    }

    #[test]
    fn every_message_returns_its_credit() {
        let mut t = flow_tunnel(true);
        for p in [
            dial_req("udp", 5),
            Packet::CloseRsp {
                error: ByteStr::new(),
                connect_id: 1,
            },
            Packet::Drain,
            Packet::DialCls { random: 77 },
            Packet::CloseReq { connect_id: 42 },
        ] {
            t.server_packet(at(0), p, 33);
            assert_eq!(released(&actions(&mut t)), 33);
        }
        t.server_packet(at(0), Packet::CloseReq { connect_id: 1 }, 33);
        assert_eq!(released(&actions(&mut t)), 33);
    }

    fn reverse_tunnel() -> Tunnel {
        let mut t = Tunnel::new(TunnelConfig {
            max_endpoints: 3,
            ..TunnelConfig::default()
        });
        t.set_reverse(true);
        t
    }

    fn reverse_rsp(random: i64, connect_id: i64, error: &'static str) -> Packet {
        Packet::ReverseDialRsp {
            error: ByteStr::from_static(error),
            connect_id,
            random,
        }
    }

    #[test]
    fn a_reverse_connection_is_an_endpoint_whose_agent_side_closes_with_close_req() {
        let mut t = reverse_tunnel();
        assert!(t.reverse_open(9, "10.0.0.10:6443"));
        assert_eq!(
            actions(&mut t),
            vec![Action::ToServer(Packet::ReverseDialReq {
                protocol: ByteStr::from_static("tcp"),
                address: ByteStr::from_static("10.0.0.10:6443"),
                random: 9,
            })]
        );
        assert_eq!(t.reverse_pending(), 1);
        t.server_packet(at(0), reverse_rsp(9, -1, ""), 20);
        assert_eq!(
            actions(&mut t),
            vec![
                Action::ReverseEstablished {
                    random: 9,
                    connect_id: -1
                },
                Action::Release(20)
            ]
        );
        assert!(t.is_open(-1));
        // Data from the control plane goes to the local client.
        let hi = Packet::Data {
            connect_id: -1,
            error: ByteStr::new(),
            data: Bytes::from_static(b"hi"),
        };
        t.server_packet(at(0), hi, 12);
        assert!(matches!(
            &actions(&mut t)[..],
            [Action::Write { connect_id: -1, .. }, Action::Release(12)]
        ));
        t.endpoint_drained(-1, 2, at(0));
        actions(&mut t);
        // The local client leaves: CLOSE_REQ, not CLOSE_RSP.
        t.endpoint_closed(-1);
        assert_eq!(
            actions(&mut t),
            vec![
                Action::Close { connect_id: -1 },
                Action::ToServer(Packet::CloseReq { connect_id: -1 })
            ]
        );
        // The server's answer is ignored.
        t.server_packet(
            at(0),
            Packet::CloseRsp {
                error: ByteStr::new(),
                connect_id: -1,
            },
            5,
        );
        assert_eq!(actions(&mut t), vec![Action::Release(5)]);
        assert_eq!((t.endpoints(), t.reverse_pending()), (0, 0));
    }

    #[test]
    fn the_server_closing_a_reverse_connection_is_answered() {
        let mut t = reverse_tunnel();
        t.reverse_open(9, "a:1");
        t.server_packet(at(0), reverse_rsp(9, -4, ""), 0);
        actions(&mut t);
        t.server_packet(at(0), Packet::CloseReq { connect_id: -4 }, 0);
        assert_eq!(
            actions(&mut t),
            vec![
                Action::Close { connect_id: -4 },
                Action::ToServer(Packet::CloseRsp {
                    error: ByteStr::new(),
                    connect_id: -4
                })
            ]
        );
        assert_eq!(t.endpoints(), 0);
    }

    #[test]
    fn reverse_refusals_and_limits() {
        // Not negotiated: nothing is asked.
        let mut t = Tunnel::new(TunnelConfig::default());
        assert!(!t.reverse_open(1, "a:1"));
        assert!(actions(&mut t).is_empty());
        let mut t = reverse_tunnel();
        // Refused: the accepted connection closes.
        t.reverse_open(1, "a:1");
        actions(&mut t);
        t.server_packet(at(0), reverse_rsp(1, 0, "konn: reverse dial refused"), 0);
        assert_eq!(actions(&mut t), vec![Action::ReverseFailed { random: 1 }]);
        // A success with a non-negative id is refused too, and given back.
        t.reverse_open(2, "a:1");
        actions(&mut t);
        t.server_packet(at(0), reverse_rsp(2, 5, ""), 0);
        assert_eq!(
            actions(&mut t),
            vec![
                Action::ToServer(Packet::CloseReq { connect_id: 5 }),
                Action::ReverseFailed { random: 2 }
            ]
        );
        // An answer nobody asked for is ignored.
        t.server_packet(at(0), reverse_rsp(99, -9, ""), 0);
        assert!(actions(&mut t).is_empty());
        // A reused id, and the endpoint limit (3).
        assert!(t.reverse_open(3, "a:1"));
        assert!(!t.reverse_open(3, "a:1"));
        assert!(t.reverse_open(4, "a:1"));
        assert!(t.reverse_open(5, "a:1"));
        assert!(!t.reverse_open(6, "a:1"));
        // The tunnel goes: every waiting connection closes.
        actions(&mut t);
        t.tunnel_gone();
        assert_eq!(
            actions(&mut t),
            vec![
                Action::ReverseFailed { random: 3 },
                Action::ReverseFailed { random: 4 },
                Action::ReverseFailed { random: 5 }
            ]
        );
    }
}
