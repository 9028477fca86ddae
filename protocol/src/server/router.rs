//! The proxy-server's protocol state machine, one per core (sans-IO).
//!
//! The router knows every frontend (a `/ProxyService/Proxy` stream or an
//! HTTP CONNECT connection) and every backend (an agent's
//! `/AgentService/Connect` stream) of its core, the dials in flight and the
//! established connections, and applies upstream's packet semantics
//! (reference §2) to them. It never touches a socket or the clock: the IO
//! layer feeds it packets, lifecycle events and `now`, and performs the
//! [`Action`]s it produces.
//!
//! What konn adds to upstream's semantics:
//! - a pending dial always ends: on DIAL_RSP, on its deadline (default on),
//!   when its frontend goes away, **and when its backend goes away**
//!   (upstream `TODO(#126)`);
//! - DIAL_CLS from a frontend is forwarded to the agent, which konn's agent
//!   honours (upstream drops it at the server);
//! - a frontend may only send DATA and CLOSE_REQ for connections it
//!   established (upstream forwards any connectID to the agent);
//! - limits on pending dials per frontend and per backend;
//! - per-connection flow control (docs/design/tunnel.md, "Flow control"):
//!   each frontend's queue towards it (a gRPC frontend's stream send queue,
//!   a CONNECT socket's write queue) is accounted with a
//!   [`FlowRx`](crate::flow::FlowRx). The agent tunnel's credit
//!   for DATA to a frontend goes back at once below the flow's limit and is
//!   withheld above it until the frontend drains ([`Action::ReleaseBackend`]);
//!   with an agent that negotiated konn's extension the router sends PAUSE
//!   and RESUME at the high/low marks instead. PAUSE/RESUME from such an
//!   agent stop and restart reading of the frontend: a gRPC frontend's
//!   credit is held ([`Router::frontend_credit`]), a CONNECT socket is not
//!   read. A frontend that drains nothing for the stuck timeout is closed
//!   ([`Router::handle_timeout`]) and its withheld credit returned.
//!
//! Packets that are forwarded unchanged travel as their received gRPC
//! message bytes ([`Payload::Forward`]); the router only decodes them to
//! route. Packets it makes up are [`Payload::Packet`]s for the IO layer to
//! encode.

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

use crate::flow::{FlowLimits, FlowRx, Signal, Step};
use bytes::Bytes;
use konn_frames::packet::{ByteStr, Packet, PacketType};

use crate::server::backends::{BackendId, Directory, Entry, Identifiers};

/// Identity of one frontend: unique per server process.
pub type FrontendId = u64;

/// The error text of a dial with no backend (upstream `ErrNotFound`).
pub const NO_AGENT: &str = "No agent available";
/// The error text of a dial that timed out at the server (upstream
/// `errBackendDialTimeout`).
pub const BACKEND_DIAL_TIMEOUT: &str = "timed out waiting for backend dial";
/// The error text of a dial whose agent disconnected before answering.
pub const BACKEND_GONE: &str = "backend connection closed before the dial completed";
/// The CLOSE_RSP error a gRPC frontend gets when it stopped reading.
pub const FRONTEND_STUCK: &str = "konn: frontend stopped reading; connection closed";

/// How a frontend reached us.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrontendKind {
    /// A `/ProxyService/Proxy` gRPC stream.
    Grpc,
    /// An HTTP CONNECT connection.
    HttpConnect,
}

/// A packet leaving the router.
#[derive(Clone, Debug, PartialEq)]
pub enum Payload {
    /// A received packet, forwarded as its original gRPC message bytes
    /// (5-byte prefix included).
    Forward(Bytes),
    /// A packet made up by the router.
    Packet(Packet),
}

/// Why a dial failed (the `reason` label of `dial_failure_count`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DialFailure {
    /// No backend for the address.
    NoAgent,
    /// The agent answered DIAL_RSP with an error.
    ErrorResponse,
    /// A DIAL_RSP for a dial we do not know.
    UnrecognizedResponse,
    /// The DIAL_RSP could not be delivered to the frontend.
    SendResponse,
    /// The backend went away or sent DIAL_CLS.
    BackendClose,
    /// The dial did not complete in time.
    BackendDialTimeout,
    /// The frontend cancelled or went away.
    FrontendClose,
}

impl DialFailure {
    /// The metric label value.
    pub const fn label(self) -> &'static str {
        match self {
            Self::NoAgent => "no_agent",
            Self::ErrorResponse => "error_response",
            Self::UnrecognizedResponse => "unrecognized_response",
            Self::SendResponse => "send_rsp",
            Self::BackendClose => "backend_close",
            Self::BackendDialTimeout => "backend_dial_timeout",
            Self::FrontendClose => "frontend_close",
        }
    }
}

/// Something the IO layer must do.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// Send a packet to a backend (agent).
    ToBackend {
        /// The backend.
        backend: BackendId,
        /// The packet.
        payload: Payload,
    },
    /// Send a packet to a gRPC frontend.
    ToFrontend {
        /// The frontend.
        frontend: FrontendId,
        /// The packet.
        payload: Payload,
    },
    /// CONNECT frontend: the dial succeeded; write
    /// `HTTP/1.1 200 Connection Established` and start relaying. Agent DATA
    /// for it follows as [`Action::ConnectData`].
    ConnectEstablished {
        /// The frontend.
        frontend: FrontendId,
        /// Its backend.
        backend: BackendId,
        /// The agent's connectID.
        connect_id: i64,
    },
    /// CONNECT frontend: write this payload to the socket.
    ConnectData {
        /// The frontend.
        frontend: FrontendId,
        /// Payload bytes (a slice of the received message).
        data: Bytes,
    },
    /// CONNECT frontend: the dial failed; write this raw HTTP response and
    /// close the socket.
    ConnectFailed {
        /// The frontend.
        frontend: FrontendId,
        /// The complete response bytes, upstream's exact text.
        response: Bytes,
    },
    /// Close a frontend: for gRPC end the stream (status OK), for CONNECT
    /// close the socket. The router has already forgotten it.
    CloseFrontend {
        /// The frontend.
        frontend: FrontendId,
    },
    /// CONNECT frontend that stopped reading: drop what is queued for it
    /// and close the socket now. The router has already forgotten it.
    AbortFrontend {
        /// The frontend.
        frontend: FrontendId,
    },
    /// Return this much HTTP/2 credit on a backend's tunnel stream (credit
    /// the router held back for a frontend that was behind).
    ReleaseBackend {
        /// The backend.
        backend: BackendId,
        /// Bytes of credit.
        credit: usize,
    },
    /// The agent paused this frontend's flow (PAUSE): stop reading it (a
    /// CONNECT socket; a gRPC frontend's credit is held by
    /// [`Router::frontend_credit`]).
    PauseFrontend {
        /// The frontend.
        frontend: FrontendId,
    },
    /// The agent resumed this frontend's flow (RESUME): read it again and
    /// return the gRPC credit held meanwhile.
    ResumeFrontend {
        /// The frontend.
        frontend: FrontendId,
        /// Held frontend credit to return (0 for CONNECT).
        credit: usize,
    },
    /// A dial failed (metrics).
    DialFailed(DialFailure),
    /// A dial succeeded after this long (metrics: `dial_duration_seconds`).
    DialSucceeded(Duration),
}

/// Router settings.
#[derive(Clone, Debug)]
pub struct RouterConfig {
    /// This router's core (backend selection prefers its tunnels).
    pub core: usize,
    /// Bound on a pending dial (konn: always on).
    pub dial_timeout: Duration,
    /// Pending dials one frontend may have.
    pub max_pending_per_frontend: usize,
    /// Pending dials one backend may have.
    pub max_pending_per_backend: usize,
    /// Each frontend's queue marks and the stuck timeout.
    pub flow: FlowLimits,
}

impl Default for RouterConfig {
    fn default() -> Self {
        Self {
            core: 0,
            dial_timeout: Duration::from_secs(30),
            max_pending_per_frontend: 16,
            max_pending_per_backend: 4096,
            flow: FlowLimits::default(),
        }
    }
}

/// A dial in flight.
#[derive(Debug)]
struct Pending {
    frontend: FrontendId,
    backend: BackendId,
    started: Instant,
    deadline: Instant,
}

#[derive(Debug)]
struct Frontend {
    kind: FrontendKind,
    /// The backend of its latest DIAL_REQ (upstream's `backend` variable).
    backend: Option<BackendId>,
    /// Dials in flight (randoms).
    pending: Vec<i64>,
    /// Established connections (backend, connectID).
    established: Vec<(BackendId, i64)>,
    /// The first DATA's connectID (one connection per stream, as upstream).
    first_conn_id: i64,
    /// Upstream stops serving a frontend after some packets (no agent,
    /// CLOSE_REQ, mismatched ids): later packets are ignored.
    done: bool,
    /// Backend → frontend: the frontend's queue.
    rx: FlowRx,
    /// The backend whose tunnel credit `rx` holds back: that of the first
    /// connection established (DATA of any other connection of the same
    /// frontend — not something konnectivity-client does — returns its
    /// credit at once).
    rx_backend: Option<BackendId>,
    /// Frontend → backend: the agent paused this frontend (PAUSE).
    paused: bool,
    /// Frontend credit held while paused.
    held: usize,
}

impl Frontend {
    fn new(kind: FrontendKind) -> Self {
        Self {
            kind,
            backend: None,
            pending: Vec::new(),
            established: Vec::new(),
            first_conn_id: 0,
            done: false,
            rx: FlowRx::new(),
            rx_backend: None,
            paused: false,
            held: 0,
        }
    }
}

#[derive(Debug, Default)]
struct Backend {
    /// Established connections: connectID → frontend.
    established: HashMap<i64, FrontendId>,
    /// Pending dials sent to this backend.
    pending: BTreeSet<i64>,
    /// The agent negotiated konn's flow-control extension.
    flow_control: bool,
}

/// Counters the metrics layer reads (per core).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RouterStats {
    /// Dials in flight.
    pub pending_dials: usize,
    /// Established end-to-end connections.
    pub established: usize,
    /// Frontends known.
    pub frontends: usize,
    /// Local backends.
    pub backends: usize,
}

/// The per-core router. See the module docs.
#[derive(Debug)]
pub struct Router {
    cfg: RouterConfig,
    directory: Directory,
    backends: HashMap<BackendId, Backend>,
    frontends: HashMap<FrontendId, Frontend>,
    pending: HashMap<i64, Pending>,
    actions: std::collections::VecDeque<Action>,
}

impl Router {
    /// A router with the backend `directory` (strategies inside).
    pub fn new(cfg: RouterConfig, directory: Directory) -> Self {
        Self {
            cfg,
            directory,
            backends: HashMap::new(),
            frontends: HashMap::new(),
            pending: HashMap::new(),
            actions: std::collections::VecDeque::new(),
        }
    }

    /// The backend directory (this core's replica).
    pub fn directory(&self) -> &Directory {
        &self.directory
    }

    /// Mutable access to the directory, for entries of other cores.
    pub fn directory_mut(&mut self) -> &mut Directory {
        &mut self.directory
    }

    /// The next action to perform.
    pub fn poll_action(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    /// Counters for metrics and leak checks.
    pub fn stats(&self) -> RouterStats {
        RouterStats {
            pending_dials: self.pending.len(),
            established: self.backends.values().map(|b| b.established.len()).sum(),
            frontends: self.frontends.len(),
            backends: self.backends.len(),
        }
    }

    /// The backend a frontend's latest dial went to.
    pub fn frontend_backend(&self, id: FrontendId) -> Option<BackendId> {
        self.frontends.get(&id).and_then(|f| f.backend)
    }

    /// Whether a frontend has dialled (or been refused) already.
    pub fn frontend_dialled(&self, id: FrontendId) -> bool {
        self.frontends
            .get(&id)
            .is_some_and(|f| f.backend.is_some() || f.done)
    }

    /// Every local backend with its (open connections, pending dials), for
    /// the IO layer to publish (`/debug/backends`).
    pub fn backend_loads(&self) -> impl Iterator<Item = (BackendId, usize, usize)> + '_ {
        self.backends
            .iter()
            .map(|(id, b)| (*id, b.established.len(), b.pending.len()))
    }

    /// Connections open and dials pending on one backend (for
    /// `/debug/backends`).
    pub fn backend_load(&self, id: BackendId) -> (usize, usize) {
        self.backends
            .get(&id)
            .map_or((0, 0), |b| (b.established.len(), b.pending.len()))
    }

    // ----- backends ---------------------------------------------------------

    /// An agent tunnel opened on this core (metadata already validated).
    pub fn backend_connected(
        &mut self,
        id: BackendId,
        agent_id: String,
        identifiers: Identifiers,
        core: usize,
    ) {
        self.backends.insert(id, Backend::default());
        self.directory.add(Entry {
            id,
            agent_id,
            identifiers,
            core,
            draining: false,
        });
    }

    /// The agent negotiated konn's flow-control extension
    /// (`konn-flow-control`): PAUSE and RESUME may be sent to it and are
    /// honoured from it.
    pub fn set_flow_control(&mut self, id: BackendId, on: bool) {
        if let Some(b) = self.backends.get_mut(&id) {
            b.flow_control = on;
        }
    }

    /// The agent tunnel is gone: its connections close and its pending
    /// dials fail now.
    pub fn backend_gone(&mut self, id: BackendId) {
        self.directory.remove(id);
        let Some(b) = self.backends.remove(&id) else {
            return;
        };
        let mut established: Vec<(i64, FrontendId)> = b.established.into_iter().collect();
        established.sort_unstable();
        for (connect_id, fid) in established {
            let Some(f) = self.frontends.get_mut(&fid) else {
                continue;
            };
            f.established
                .retain(|&(bid, c)| !(bid == id && c == connect_id));
            // Nobody will RESUME it now.
            let held = std::mem::take(&mut f.held);
            f.paused = false;
            match f.kind {
                FrontendKind::Grpc => {
                    if held > 0 {
                        self.actions.push_back(Action::ResumeFrontend {
                            frontend: fid,
                            credit: held,
                        });
                    }
                    self.actions.push_back(Action::ToFrontend {
                        frontend: fid,
                        payload: Payload::Packet(Packet::CloseRsp {
                            error: ByteStr::new(),
                            connect_id,
                        }),
                    });
                }
                FrontendKind::HttpConnect => self.close_frontend(fid),
            }
        }
        for random in b.pending {
            let Some(p) = self.pending.remove(&random) else {
                continue;
            };
            self.actions
                .push_back(Action::DialFailed(DialFailure::BackendClose));
            self.fail_dial(p.frontend, random, BACKEND_GONE, DialFail::BackendGone);
        }
    }

    /// A packet from an agent. `framed` is its received gRPC message, which
    /// came with `credit` bytes of the tunnel stream's HTTP/2 credit.
    /// Returns the credit to return now; the rest follows as
    /// [`Action::ReleaseBackend`].
    #[must_use]
    pub fn backend_packet(
        &mut self,
        now: Instant,
        id: BackendId,
        packet: Packet,
        framed: Bytes,
        credit: usize,
    ) -> usize {
        let Some(b) = self.backends.get(&id) else {
            return credit;
        };
        let flow_control = b.flow_control;
        match packet {
            Packet::DialRsp {
                error,
                connect_id,
                random,
            } => self.on_dial_rsp(now, id, random, connect_id, &error, framed),
            Packet::DialCls { random } => {
                let Some(p) = self.take_pending(random, |p| p.backend == id) else {
                    return credit;
                };
                self.unlink_pending(&p, random);
                self.actions
                    .push_back(Action::DialFailed(DialFailure::BackendClose));
                match self.frontends.get(&p.frontend).map(|f| f.kind) {
                    Some(FrontendKind::Grpc) => self.actions.push_back(Action::ToFrontend {
                        frontend: p.frontend,
                        payload: Payload::Forward(framed),
                    }),
                    Some(FrontendKind::HttpConnect) => self.close_frontend(p.frontend),
                    None => {}
                }
            }
            Packet::Data {
                connect_id, data, ..
            } => {
                if connect_id == 0 {
                    return credit;
                }
                let Some(fid) = self.established(id, connect_id) else {
                    self.close_req(id, connect_id);
                    return credit;
                };
                let may_pause = flow_control;
                let lim = self.cfg.flow;
                let Some(f) = self.frontends.get_mut(&fid) else {
                    self.close_req(id, connect_id);
                    return credit;
                };
                // Flow-controlled credit only from the frontend's own backend.
                let (held_credit, now_credit) = if f.rx_backend == Some(id) {
                    (credit, 0)
                } else {
                    (0, credit)
                };
                let (len, action) = match f.kind {
                    FrontendKind::Grpc => (
                        framed.len(),
                        Action::ToFrontend {
                            frontend: fid,
                            payload: Payload::Forward(framed),
                        },
                    ),
                    FrontendKind::HttpConnect => (
                        data.len(),
                        Action::ConnectData {
                            frontend: fid,
                            data,
                        },
                    ),
                };
                let step = f.rx.push(len, held_credit, &lim, may_pause, now);
                self.actions.push_back(action);
                return now_credit + self.flow_step(fid, step, true);
            }
            Packet::Pause { connect_id } if flow_control => {
                if let Some(fid) = self.established(id, connect_id)
                    && let Some(f) = self.frontends.get_mut(&fid)
                    && !f.paused
                {
                    f.paused = true;
                    self.actions
                        .push_back(Action::PauseFrontend { frontend: fid });
                }
            }
            Packet::Resume { connect_id } if flow_control => {
                if let Some(fid) = self.established(id, connect_id)
                    && let Some(f) = self.frontends.get_mut(&fid)
                    && f.paused
                {
                    f.paused = false;
                    let credit = std::mem::take(&mut f.held);
                    self.actions.push_back(Action::ResumeFrontend {
                        frontend: fid,
                        credit,
                    });
                }
            }
            Packet::CloseRsp { connect_id, .. } => {
                let Some(fid) = self
                    .backends
                    .get_mut(&id)
                    .and_then(|b| b.established.remove(&connect_id))
                else {
                    return credit; // already closed
                };
                let Some(f) = self.frontends.get_mut(&fid) else {
                    return credit;
                };
                f.established
                    .retain(|&(b, c)| !(b == id && c == connect_id));
                f.paused = false;
                let held = std::mem::take(&mut f.held);
                if held > 0 {
                    // Whatever the frontend still sends is answered, not
                    // forwarded: its credit need not wait.
                    self.actions.push_back(Action::ResumeFrontend {
                        frontend: fid,
                        credit: held,
                    });
                }
                match f.kind {
                    FrontendKind::Grpc => self.actions.push_back(Action::ToFrontend {
                        frontend: fid,
                        payload: Payload::Forward(framed),
                    }),
                    FrontendKind::HttpConnect => self.close_frontend(fid),
                }
            }
            Packet::Drain => self.directory.set_draining(id),
            // An agent never sends these, and PAUSE/RESUME need the
            // extension; upstream ignores unexpected packets too.
            Packet::DialReq { .. }
            | Packet::CloseReq { .. }
            | Packet::Pause { .. }
            | Packet::Resume { .. } => {}
        }
        credit
    }

    /// Perform a flow-control step for frontend `fid`'s queue: withheld
    /// credit that may go back, PAUSE/RESUME to its agent. Returns the
    /// credit to release now if `direct` (the caller releases it), else
    /// queues it as [`Action::ReleaseBackend`].
    fn flow_step(&mut self, fid: FrontendId, step: Step, direct: bool) -> usize {
        let Some(f) = self.frontends.get(&fid) else {
            return step.release;
        };
        let backend = f.rx_backend;
        if let Some(signal) = step.signal {
            let conns: Vec<(BackendId, i64)> = f
                .established
                .iter()
                .copied()
                .filter(|(b, _)| self.backends.get(b).is_some_and(|b| b.flow_control))
                .collect();
            for (b, connect_id) in conns {
                let packet = match signal {
                    Signal::Pause => Packet::Pause { connect_id },
                    Signal::Resume => Packet::Resume { connect_id },
                };
                self.actions.push_back(Action::ToBackend {
                    backend: b,
                    payload: Payload::Packet(packet),
                });
            }
        }
        if direct || step.release == 0 {
            return step.release;
        }
        if let Some(backend) = backend {
            self.actions.push_back(Action::ReleaseBackend {
                backend,
                credit: step.release,
            });
        }
        0
    }

    /// Frontend `fid`'s queue measured by the IO layer at `now`: `level`
    /// bytes (a gRPC frontend's stream send queue; a CONNECT socket's write
    /// queue). A lower level than before is progress: withheld credit may
    /// go back and a RESUME may be due.
    pub fn frontend_level(&mut self, now: Instant, fid: FrontendId, level: usize) {
        let lim = self.cfg.flow;
        let Some(f) = self.frontends.get_mut(&fid) else {
            return;
        };
        // Nothing to account: no connection established (yet, or any
        // more) and nothing of one still queued.
        if level == f.rx.queued()
            || (f.established.is_empty() && f.rx.queued() == 0 && f.rx.withheld() == 0)
        {
            return;
        }
        let may_pause = f
            .rx_backend
            .and_then(|b| self.backends.get(&b))
            .is_some_and(|b| b.flow_control);
        let step = f.rx.set_level(level, &lim, may_pause, now);
        let _ = self.flow_step(fid, step, false);
    }

    /// Credit of a message frontend `fid` sent that the IO layer passed on:
    /// returns what to return now; while the agent paused the frontend it
    /// is held until RESUME ([`Action::ResumeFrontend`]).
    #[must_use]
    pub fn frontend_credit(&mut self, fid: FrontendId, credit: usize) -> usize {
        match self.frontends.get_mut(&fid) {
            Some(f) if f.paused => {
                f.held += credit;
                0
            }
            _ => credit,
        }
    }

    /// Whether the agent paused frontend `fid` (PAUSE).
    pub fn frontend_paused(&self, fid: FrontendId) -> bool {
        self.frontends.get(&fid).is_some_and(|f| f.paused)
    }

    /// Bytes queued towards frontend `fid`, as the router counts them.
    pub fn frontend_queued(&self, fid: FrontendId) -> Option<usize> {
        self.frontends.get(&fid).map(|f| f.rx.queued())
    }

    /// A frontend is forgotten: the tunnel credit its queue held back goes
    /// back to its agent.
    fn release_rx(&mut self, f: &mut Frontend) {
        let withheld = f.rx.close();
        if withheld > 0
            && let Some(backend) = f.rx_backend
            && self.backends.contains_key(&backend)
        {
            self.actions.push_back(Action::ReleaseBackend {
                backend,
                credit: withheld,
            });
        }
    }

    fn on_dial_rsp(
        &mut self,
        now: Instant,
        id: BackendId,
        random: i64,
        connect_id: i64,
        error: &str,
        framed: Bytes,
    ) {
        // Only the backend the dial went to may answer it.
        let Some(p) = self.take_pending(random, |p| p.backend == id) else {
            self.actions
                .push_back(Action::DialFailed(DialFailure::UnrecognizedResponse));
            if connect_id != 0 {
                self.close_req(id, connect_id);
            }
            return;
        };
        self.unlink_pending(&p, random);
        let fid = p.frontend;
        let Some(kind) = self.frontends.get(&fid).map(|f| f.kind) else {
            if connect_id != 0 {
                self.close_req(id, connect_id);
            }
            return;
        };
        if !error.is_empty() {
            self.actions
                .push_back(Action::DialFailed(DialFailure::ErrorResponse));
            match kind {
                FrontendKind::Grpc => self.actions.push_back(Action::ToFrontend {
                    frontend: fid,
                    payload: Payload::Forward(framed),
                }),
                FrontendKind::HttpConnect => {
                    self.actions.push_back(Action::ConnectFailed {
                        frontend: fid,
                        response: dial_error_response(error),
                    });
                    self.forget_frontend(fid);
                }
            }
            return;
        }
        if connect_id == 0 {
            // A success without an id cannot carry data.
            self.actions
                .push_back(Action::DialFailed(DialFailure::ErrorResponse));
            self.fail_dial(
                fid,
                random,
                "dial response without a connection id",
                DialFail::Error,
            );
            return;
        }
        let Some(b) = self.backends.get_mut(&id) else {
            return;
        };
        b.established.insert(connect_id, fid);
        if let Some(f) = self.frontends.get_mut(&fid) {
            f.established.push((id, connect_id));
            f.rx_backend.get_or_insert(id);
        }
        self.actions.push_back(Action::DialSucceeded(
            now.saturating_duration_since(p.started),
        ));
        match kind {
            FrontendKind::Grpc => self.actions.push_back(Action::ToFrontend {
                frontend: fid,
                payload: Payload::Forward(framed),
            }),
            FrontendKind::HttpConnect => self.actions.push_back(Action::ConnectEstablished {
                frontend: fid,
                backend: id,
                connect_id,
            }),
        }
    }

    // ----- frontends --------------------------------------------------------

    /// A frontend appeared.
    pub fn frontend_opened(&mut self, id: FrontendId, kind: FrontendKind) {
        self.frontends.insert(id, Frontend::new(kind));
    }

    /// A packet from a gRPC frontend. `framed` is its received gRPC message;
    /// `random` seeds backend selection.
    pub fn frontend_packet(
        &mut self,
        now: Instant,
        id: FrontendId,
        packet: Packet,
        framed: Bytes,
        random: u64,
    ) {
        let Some(f) = self.frontends.get(&id) else {
            return;
        };
        if f.done {
            return;
        }
        match packet {
            Packet::DialReq {
                address,
                random: dial,
                ..
            } => self.dial(now, id, &address, dial, random, Some(framed)),
            Packet::Data { connect_id, .. } => {
                let Some(backend) = f.backend else {
                    self.send_close_rsp(id, connect_id, "backend not initialized");
                    self.mark_done(id);
                    return;
                };
                if connect_id == 0 {
                    return;
                }
                let Some(f) = self.frontends.get_mut(&id) else {
                    return;
                };
                if f.first_conn_id == 0 {
                    f.first_conn_id = connect_id;
                } else if f.first_conn_id != connect_id {
                    let first = f.first_conn_id;
                    for c in [connect_id, first] {
                        self.close_req(backend, c);
                    }
                    for c in [connect_id, first] {
                        self.send_close_rsp(id, c, "mismatched connection IDs");
                    }
                    self.mark_done(id);
                    return;
                }
                // konn: only connections this frontend established.
                match f.established.iter().find(|(_, c)| *c == connect_id) {
                    Some(&(b, _)) => self.actions.push_back(Action::ToBackend {
                        backend: b,
                        payload: Payload::Forward(framed),
                    }),
                    None => self.send_close_rsp(id, connect_id, "unrecognized connectID"),
                }
            }
            Packet::CloseReq { connect_id } => {
                let Some(backend) = f.backend else {
                    self.send_close_rsp(id, connect_id, "backend uninitialized");
                    return;
                };
                let target = f
                    .established
                    .iter()
                    .find(|(_, c)| *c == connect_id)
                    .map_or(backend, |&(b, _)| b);
                self.actions.push_back(Action::ToBackend {
                    backend: target,
                    payload: Payload::Forward(framed),
                });
                // Upstream stops serving the stream after CLOSE_REQ; the
                // agent's CLOSE_RSP still reaches it.
                self.mark_done(id);
            }
            Packet::DialCls { random } => {
                let Some(p) = self.take_pending(random, |p| p.frontend == id) else {
                    return;
                };
                self.unlink_pending(&p, random);
                self.actions
                    .push_back(Action::DialFailed(DialFailure::FrontendClose));
                // konn: tell the agent, which stops dialling.
                self.actions.push_back(Action::ToBackend {
                    backend: p.backend,
                    payload: Payload::Forward(framed),
                });
            }
            // Not for a server; upstream ignores them.
            Packet::DialRsp { .. }
            | Packet::CloseRsp { .. }
            | Packet::Drain
            | Packet::Pause { .. }
            | Packet::Resume { .. } => {}
        }
    }

    /// An HTTP CONNECT frontend asks for `address`; `dial_random` is the dial
    /// id the server chose, `random` seeds backend selection.
    pub fn connect_request(
        &mut self,
        now: Instant,
        id: FrontendId,
        address: &str,
        dial_random: i64,
        random: u64,
    ) {
        self.dial(now, id, address, dial_random, random, None);
    }

    /// A CONNECT frontend sent payload bytes (already framed as a DATA
    /// packet by the IO layer) for its connection.
    pub fn connect_data(&mut self, id: FrontendId, framed: Bytes) -> bool {
        let Some(&(backend, _)) = self.frontends.get(&id).and_then(|f| f.established.first())
        else {
            return false;
        };
        self.actions.push_back(Action::ToBackend {
            backend,
            payload: Payload::Forward(framed),
        });
        true
    }

    /// A frontend went away (stream ended, socket closed, or the IO layer
    /// gave up on it): its dials are cancelled and its connections closed
    /// at the agent.
    pub fn frontend_gone(&mut self, id: FrontendId) {
        let Some(mut f) = self.frontends.remove(&id) else {
            return;
        };
        self.release_rx(&mut f);
        for random in f.pending {
            let Some(p) = self.pending.remove(&random) else {
                continue;
            };
            if let Some(b) = self.backends.get_mut(&p.backend) {
                b.pending.remove(&random);
            }
            self.actions
                .push_back(Action::DialFailed(DialFailure::FrontendClose));
            self.actions.push_back(Action::ToBackend {
                backend: p.backend,
                payload: Payload::Packet(Packet::DialCls { random }),
            });
        }
        for (backend, connect_id) in f.established {
            if let Some(b) = self.backends.get_mut(&backend) {
                b.established.remove(&connect_id);
            }
            self.close_req(backend, connect_id);
        }
    }

    /// An established connection could not be served (its frontend stopped
    /// reading for too long): close it on both sides, with `reason`, and
    /// return the tunnel credit its queue held back. A CONNECT socket is
    /// closed without writing what is queued for it.
    pub fn frontend_stuck(&mut self, id: FrontendId, reason: &str) {
        let Some(f) = self.frontends.get(&id) else {
            return;
        };
        let conns = f.established.clone();
        let kind = f.kind;
        for (backend, connect_id) in conns {
            if let Some(b) = self.backends.get_mut(&backend) {
                b.established.remove(&connect_id);
            }
            self.close_req(backend, connect_id);
            if kind == FrontendKind::Grpc {
                self.send_close_rsp(id, connect_id, reason);
            }
        }
        if let Some(mut f) = self.frontends.remove(&id) {
            self.release_rx(&mut f);
            f.established.clear();
            f.done = true;
            f.paused = false;
            if f.held > 0 {
                self.actions.push_back(Action::ResumeFrontend {
                    frontend: id,
                    credit: std::mem::take(&mut f.held),
                });
            }
            if kind == FrontendKind::Grpc {
                // Still there for the stream's end; nothing flows any more.
                f.rx_backend = None;
                self.frontends.insert(id, f);
            }
        }
        if kind == FrontendKind::HttpConnect {
            self.forget_frontend(id);
            self.actions
                .push_back(Action::AbortFrontend { frontend: id });
        }
    }

    // ----- timers -----------------------------------------------------------

    /// The earliest deadline: a pending dial's, or the moment a frontend
    /// that drains nothing becomes stuck.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let lim = &self.cfg.flow;
        let dials = self.pending.values().map(|p| p.deadline);
        let flows = self.frontends.values().filter_map(|f| f.rx.deadline(lim));
        dials.chain(flows).min()
    }

    /// Expire pending dials due at `now`, and close frontends that are
    /// stuck at `now` (nothing drained from their queue for the stuck
    /// timeout).
    pub fn handle_timeout(&mut self, now: Instant) {
        let mut due: Vec<i64> = self
            .pending
            .iter()
            .filter(|(_, p)| p.deadline <= now)
            .map(|(r, _)| *r)
            .collect();
        due.sort_unstable();
        for random in due {
            let Some(p) = self.pending.remove(&random) else {
                continue;
            };
            self.unlink_pending(&p, random);
            self.actions
                .push_back(Action::DialFailed(DialFailure::BackendDialTimeout));
            // Tell the agent to stop dialling (konn's agent honours it).
            self.actions.push_back(Action::ToBackend {
                backend: p.backend,
                payload: Payload::Packet(Packet::DialCls { random }),
            });
            self.fail_dial(p.frontend, random, BACKEND_DIAL_TIMEOUT, DialFail::Timeout);
        }
        let lim = self.cfg.flow;
        let mut stuck: Vec<FrontendId> = self
            .frontends
            .iter()
            .filter(|(_, f)| f.rx.is_stuck(&lim, now))
            .map(|(id, _)| *id)
            .collect();
        stuck.sort_unstable();
        for fid in stuck {
            self.frontend_stuck(fid, FRONTEND_STUCK);
        }
    }

    // ----- helpers ----------------------------------------------------------

    fn dial(
        &mut self,
        now: Instant,
        id: FrontendId,
        address: &str,
        dial: i64,
        random: u64,
        framed: Option<Bytes>,
    ) {
        let Some(kind) = self.frontends.get(&id).map(|f| f.kind) else {
            return;
        };
        let Some(entry) = self.directory.pick(address, random, self.cfg.core) else {
            self.actions
                .push_back(Action::DialFailed(DialFailure::NoAgent));
            match kind {
                FrontendKind::Grpc => {
                    self.send_dial_error(id, dial, NO_AGENT);
                    self.mark_done(id);
                }
                FrontendKind::HttpConnect => {
                    self.actions.push_back(Action::ConnectFailed {
                        frontend: id,
                        response: no_tunnel_response(),
                    });
                    self.forget_frontend(id);
                }
            }
            return;
        };
        let backend = entry.id;
        let over = self
            .frontends
            .get(&id)
            .is_some_and(|f| f.pending.len() >= self.cfg.max_pending_per_frontend)
            || self
                .backends
                .get(&backend)
                .is_some_and(|b| b.pending.len() >= self.cfg.max_pending_per_backend);
        let reused = self.pending.contains_key(&dial);
        if over || reused || !self.backends.contains_key(&backend) {
            // Too many dials in flight, a reused dial id, or a backend of
            // another core (the IO layer migrates before dialling, so this
            // only happens in a race with its removal).
            let why = if reused {
                "dial request id (random) already in use by a pending dial"
            } else if over {
                "too many pending dials"
            } else {
                NO_AGENT
            };
            self.actions
                .push_back(Action::DialFailed(DialFailure::NoAgent));
            self.fail_dial(id, dial, why, DialFail::Error);
            return;
        }
        let (Some(f), Some(b)) = (self.frontends.get_mut(&id), self.backends.get_mut(&backend))
        else {
            return;
        };
        f.backend = Some(backend);
        f.pending.push(dial);
        b.pending.insert(dial);
        self.pending.insert(
            dial,
            Pending {
                frontend: id,
                backend,
                started: now,
                deadline: now + self.cfg.dial_timeout,
            },
        );
        let payload = match framed {
            Some(b) => Payload::Forward(b),
            None => Payload::Packet(Packet::DialReq {
                protocol: ByteStr::from_static("tcp"),
                address: ByteStr::from(address.to_owned()),
                random: dial,
            }),
        };
        self.actions
            .push_back(Action::ToBackend { backend, payload });
    }

    /// End a dial with an error towards its frontend.
    fn fail_dial(&mut self, fid: FrontendId, random: i64, error: &str, why: DialFail) {
        let Some(f) = self.frontends.get_mut(&fid) else {
            return;
        };
        f.pending.retain(|r| *r != random);
        match f.kind {
            FrontendKind::Grpc => self.send_dial_error(fid, random, error),
            FrontendKind::HttpConnect => {
                let response = match why {
                    DialFail::Timeout => {
                        raw_response(504, &format!("Backend dial timeout: {error}\r\n"))
                    }
                    DialFail::BackendGone => {
                        raw_response(502, &format!("Backend context error: {error}\r\n"))
                    }
                    DialFail::Error => dial_error_response(error),
                };
                self.actions.push_back(Action::ConnectFailed {
                    frontend: fid,
                    response,
                });
                self.forget_frontend(fid);
            }
        }
    }

    /// Remove the pending dial `random` if `owned` says it belongs to the
    /// caller (the backend that answers it, the frontend that cancels it).
    fn take_pending(&mut self, random: i64, owned: impl Fn(&Pending) -> bool) -> Option<Pending> {
        if self.pending.get(&random).is_some_and(owned) {
            self.pending.remove(&random)
        } else {
            None
        }
    }

    /// The frontend of connection `connect_id` on backend `id`.
    fn established(&self, id: BackendId, connect_id: i64) -> Option<FrontendId> {
        self.backends
            .get(&id)
            .and_then(|b| b.established.get(&connect_id))
            .copied()
    }

    fn unlink_pending(&mut self, p: &Pending, random: i64) {
        if let Some(b) = self.backends.get_mut(&p.backend) {
            b.pending.remove(&random);
        }
        if let Some(f) = self.frontends.get_mut(&p.frontend) {
            f.pending.retain(|r| *r != random);
        }
    }

    fn send_dial_error(&mut self, fid: FrontendId, random: i64, error: &str) {
        self.actions.push_back(Action::ToFrontend {
            frontend: fid,
            payload: Payload::Packet(Packet::DialRsp {
                error: ByteStr::from(error.to_owned()),
                connect_id: 0,
                random,
            }),
        });
    }

    fn send_close_rsp(&mut self, fid: FrontendId, connect_id: i64, error: &str) {
        self.actions.push_back(Action::ToFrontend {
            frontend: fid,
            payload: Payload::Packet(Packet::CloseRsp {
                error: ByteStr::from(error.to_owned()),
                connect_id,
            }),
        });
    }

    fn close_req(&mut self, backend: BackendId, connect_id: i64) {
        self.actions.push_back(Action::ToBackend {
            backend,
            payload: Payload::Packet(Packet::CloseReq { connect_id }),
        });
    }

    fn mark_done(&mut self, fid: FrontendId) {
        if let Some(f) = self.frontends.get_mut(&fid) {
            f.done = true;
        }
    }

    /// A CONNECT frontend is finished: forget it and close its socket.
    fn close_frontend(&mut self, fid: FrontendId) {
        self.forget_frontend(fid);
        self.actions
            .push_back(Action::CloseFrontend { frontend: fid });
    }

    /// Forget a frontend whose dials and connections are already settled.
    fn forget_frontend(&mut self, fid: FrontendId) {
        if let Some(mut f) = self.frontends.remove(&fid) {
            self.release_rx(&mut f);
            for (backend, connect_id) in f.established {
                if let Some(b) = self.backends.get_mut(&backend) {
                    b.established.remove(&connect_id);
                }
                self.close_req(backend, connect_id);
            }
            for random in f.pending {
                if let Some(p) = self.pending.remove(&random) {
                    if let Some(b) = self.backends.get_mut(&p.backend) {
                        b.pending.remove(&random);
                    }
                    self.actions.push_back(Action::ToBackend {
                        backend: p.backend,
                        payload: Payload::Packet(Packet::DialCls { random }),
                    });
                }
            }
        }
    }
}

/// How a CONNECT dial failed (which upstream response to write).
#[derive(Clone, Copy, Debug)]
enum DialFail {
    Timeout,
    BackendGone,
    Error,
}

/// Upstream's response when no backend exists (tunnel.go).
fn no_tunnel_response() -> Bytes {
    Bytes::from(format!(
        "HTTP/1.1 500 Internal Server Error\r\nContent-Type: text/plain\r\n\r\ncurrently no tunnels available: {NO_AGENT}"
    ))
}

/// A raw `text/plain; charset=utf-8` error response as tunnel.go writes it.
fn raw_response(code: u16, body: &str) -> Bytes {
    Bytes::from(format!(
        "HTTP/1.1 {code} {}\r\nContent-Type: text/plain; charset=utf-8\r\n\r\n{body}",
        status_text(code)
    ))
}

/// The response for a DIAL_RSP error, as upstream writes it with Go's
/// `http.Response.Write` (unknown body length → `Connection: close`).
pub fn dial_error_response(error: &str) -> Bytes {
    let code = dial_error_status(error);
    Bytes::from(format!(
        "HTTP/1.1 {code} {}\r\nConnection: close\r\nContent-Type: text/plain; charset=utf-8\r\n\r\n{error}",
        status_text(code)
    ))
}

/// Upstream's `mapDialErrorToHTTPStatus`: the HTTP status for an agent's
/// dial error text.
pub fn dial_error_status(error: &str) -> u16 {
    let e = error.to_lowercase();
    let has = |s: &str| e.contains(s);
    if has("i/o timeout") || has("deadline exceeded") || has("timeout") {
        504
    } else if has("too many open files") {
        503
    } else {
        // Connection, DNS and TLS errors and anything else.
        502
    }
}

fn status_text(code: u16) -> &'static str {
    match code {
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "Error",
    }
}

/// The packet type of a payload, for the per-type metrics.
pub fn payload_type(p: &Payload) -> Option<PacketType> {
    match p {
        Payload::Packet(p) => Some(p.ty()),
        Payload::Forward(_) => None,
    }
}

mod invariants;
#[cfg(test)]
mod tests;
