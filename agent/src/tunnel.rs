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
//! the number of endpoints, and closes an endpoint whose destination stops
//! reading ("stuck") instead of stalling the tunnel.
//!
//! The IO layer performs the [`Action`]s: dialling with a timeout, writing
//! payloads to endpoints, reading endpoints into DATA packets (it encodes
//! those itself on the hot path), closing sockets.

use std::collections::HashMap;

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
    /// Write a payload to an endpoint (queued per endpoint).
    Write {
        /// The endpoint.
        connect_id: i64,
        /// The bytes (a slice of the received message).
        data: Bytes,
    },
    /// Close an endpoint: stop reading it, flush what is queued for it
    /// (bounded by the write timeout), then close the socket.
    Close {
        /// The endpoint.
        connect_id: i64,
    },
    /// A dial failed (metrics).
    DialFailed(DialFailure),
    /// A dial succeeded (metrics: the IO layer measured its duration).
    DialSucceeded,
}

#[derive(Debug, PartialEq, Eq)]
enum Endpoint {
    Dialing { random: i64 },
    Open,
}

/// Tunnel settings.
#[derive(Clone, Copy, Debug)]
pub struct TunnelConfig {
    /// Endpoints (open or dialling) one tunnel may have.
    pub max_endpoints: usize,
}

impl Default for TunnelConfig {
    fn default() -> Self {
        Self {
            max_endpoints: 16 * 1024,
        }
    }
}

/// One tunnel's state. See the module docs.
#[derive(Debug)]
pub struct Tunnel {
    cfg: TunnelConfig,
    next_connect_id: i64,
    endpoints: HashMap<i64, Endpoint>,
    actions: std::collections::VecDeque<Action>,
    draining: bool,
}

impl Tunnel {
    /// A fresh tunnel; connectIDs start at 1.
    pub fn new(cfg: TunnelConfig) -> Self {
        Self {
            cfg,
            next_connect_id: 1,
            endpoints: HashMap::new(),
            actions: std::collections::VecDeque::new(),
            draining: false,
        }
    }

    /// The next action.
    pub fn poll_action(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    /// Endpoints open.
    pub fn open_endpoints(&self) -> usize {
        self.endpoints
            .values()
            .filter(|e| **e == Endpoint::Open)
            .count()
    }

    /// Endpoints open or dialling.
    pub fn endpoints(&self) -> usize {
        self.endpoints.len()
    }

    /// Whether `connect_id` is an open endpoint.
    pub fn is_open(&self, connect_id: i64) -> bool {
        self.endpoints.get(&connect_id) == Some(&Endpoint::Open)
    }

    /// A packet from the server.
    pub fn server_packet(&mut self, packet: Packet) {
        match packet {
            Packet::DialReq {
                protocol,
                address,
                random,
            } => self.dial_req(&protocol, address, random),
            Packet::Data {
                connect_id, data, ..
            } => match self.endpoints.get(&connect_id) {
                Some(Endpoint::Open) => self.actions.push_back(Action::Write { connect_id, data }),
                _ => self.close_rsp(connect_id, UNRECOGNIZED_CONNECT_ID),
            },
            Packet::CloseReq { connect_id } => match self.endpoints.get(&connect_id) {
                Some(Endpoint::Open) => {
                    self.endpoints.remove(&connect_id);
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
            // Not for an agent; upstream ignores them.
            Packet::DialRsp { .. }
            | Packet::CloseRsp { .. }
            | Packet::Drain
            | Packet::Pause { .. }
            | Packet::Resume { .. } => {}
        }
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
        self.endpoints.insert(connect_id, Endpoint::Open);
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
        let Some(Endpoint::Dialing { random }) = self.endpoints.remove(&connect_id) else {
            return;
        };
        self.actions.push_back(Action::DialFailed(why));
        self.actions.push_back(Action::ToServer(Packet::DialRsp {
            error: ByteStr::from(error),
            connect_id: 0,
            random,
        }));
    }

    /// The destination closed (EOF or error) and everything read from it
    /// has been sent: tell the server (upstream sends CLOSE_RSP).
    pub fn endpoint_closed(&mut self, connect_id: i64) {
        if self.endpoints.remove(&connect_id).is_some() {
            self.actions.push_back(Action::Close { connect_id });
            self.close_rsp(connect_id, "");
        }
    }

    /// The destination stopped reading for too long: close it with an error.
    pub fn endpoint_stuck(&mut self, connect_id: i64) {
        if self.endpoints.remove(&connect_id).is_some() {
            self.actions.push_back(Action::Close { connect_id });
            self.close_rsp(connect_id, STUCK);
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
        let mut ids: Vec<(i64, bool)> = self
            .endpoints
            .drain()
            .map(|(c, e)| (c, e == Endpoint::Open))
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

#[cfg(test)]
mod tests {
    use super::*;

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
        t.server_packet(dial_req("tcp", 42));
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
        t.server_packet(Packet::Data {
            connect_id: 1,
            error: ByteStr::new(),
            data: Bytes::from_static(b"x"),
        });
        assert_eq!(
            actions(&mut t),
            vec![Action::Write {
                connect_id: 1,
                data: Bytes::from_static(b"x")
            }]
        );
        t.server_packet(Packet::CloseReq { connect_id: 1 });
        assert_eq!(
            actions(&mut t),
            vec![Action::Close { connect_id: 1 }, close_rsp(1, "")]
        );
        assert_eq!(t.endpoints(), 0);
    }

    #[test]
    fn connect_ids_are_unique_and_nonzero_even_after_failures() {
        let mut t = Tunnel::new(TunnelConfig::default());
        t.server_packet(dial_req("tcp", 1));
        t.dial_failed(
            1,
            "dial tcp 10.0.0.5:1: connect: connection refused".into(),
            DialFailure::Unknown,
        );
        t.server_packet(dial_req("tcp", 2));
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
            t.server_packet(Packet::DialReq {
                protocol: ByteStr::from(p.to_owned()),
                address: ByteStr::from_static("/var/run/docker.sock"),
                random: 9,
            });
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
        t.server_packet(Packet::Data {
            connect_id: 5,
            error: ByteStr::new(),
            data: Bytes::new(),
        });
        t.server_packet(Packet::CloseReq { connect_id: 6 });
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
        t.server_packet(dial_req("tcp", 42));
        actions(&mut t);
        t.server_packet(Packet::DialCls { random: 42 });
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
            t.server_packet(dial_req("tcp", r));
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
            vec![Action::Close { connect_id: 2 }, close_rsp(2, STUCK)]
        );
        t.endpoint_closed(2);
        assert!(actions(&mut t).is_empty(), "closing twice is harmless");
    }

    #[test]
    fn tunnel_gone_closes_everything() {
        let mut t = Tunnel::new(TunnelConfig::default());
        t.server_packet(dial_req("tcp", 1));
        t.server_packet(dial_req("tcp", 2));
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
        let mut t = Tunnel::new(TunnelConfig { max_endpoints: 1 });
        t.server_packet(dial_req("tcp", 1));
        t.server_packet(dial_req("tcp", 2));
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
}
