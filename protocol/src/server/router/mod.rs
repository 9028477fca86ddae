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
//!
//! **Flows across cores** (docs/design/cross-core.md). A flow lives on its
//! frontend's core. When a dial picks an agent whose tunnel is on another
//! core (a frontend that could not move there: several streams on one
//! HTTP/2 connection, a connection that already moved, a failed
//! migration), this router keeps a *proxy* of that backend (its
//! established and pending tables, as for a local one) and addresses it
//! through the mesh: [`Action::Relay`] with [`Relay::ToBackend`] /
//! [`Relay::Release`]. The tunnel's own core records which core each
//! relayed dial and connection belongs to ([`Router::relayed_packet`]) and
//! sends the agent's packets for them back ([`Relay::FromBackend`], with
//! the tunnel credit they came with); the frontend's core feeds them to
//! [`Router::backend_packet`] like its own agents' packets, so flow control,
//! deadlines and cleanup are the same code. A proxy lives until the backend
//! goes ([`Router::backend_gone`], on the tunnel core's announcement): credit
//! its flows withheld may still have to go back after they closed.

use crate::maps::IdMap;
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use crate::flow::{FlowLimits, FlowRx, Signal, Step};
use bytes::Bytes;
use konn_frames::packet::{ByteStr, Packet, PacketType};

use crate::server::backends::{BackendId, Directory, Entry, Identifiers, dest_host};
use crate::server::limits::{Limits, Permit, Refusal};
use std::sync::Arc;

/// Identity of one frontend: unique per server process.
pub type FrontendId = u64;

/// The error text of a dial with no backend (upstream `ErrNotFound`).
pub const NO_AGENT: &str = "No agent available";
/// The error text of a dial that timed out at the server (upstream
/// `errBackendDialTimeout`).
pub const BACKEND_DIAL_TIMEOUT: &str = "timed out waiting for backend dial";
/// The error text of a dial whose agent disconnected before answering.
pub const BACKEND_GONE: &str = "backend connection closed before the dial completed";
/// The error of a dial whose id is already used by a pending dial.
pub const DIAL_ID_IN_USE: &str = "dial request id (random) already in use by a pending dial";
/// The error of a dial over the pending-dial limits.
pub const TOO_MANY_PENDING: &str = "too many pending dials";
/// The CLOSE_RSP error a gRPC frontend gets when it stopped reading.
pub const FRONTEND_STUCK: &str = "konn: frontend stopped reading; connection closed";

/// How a frontend reached us.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrontendKind {
    /// A `/ProxyService/Proxy` gRPC stream.
    Grpc,
    /// An HTTP CONNECT connection.
    HttpConnect,
    /// The server's own connection to a control-plane destination for an
    /// agent's reverse dial (KEP-2025, [`Router::reverse_dialed`]): a socket
    /// served like a CONNECT frontend, established from the start, whose
    /// connection id is negative and server-assigned.
    Reverse,
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
    /// Send something to another core (through the mesh; see the module
    /// docs, "Flows across cores").
    Relay {
        /// The core.
        core: usize,
        /// What to send.
        relay: Relay,
    },
    /// Dial `target` (an index into the configured `--allowed-destination`
    /// list) for reverse dial `random` of `backend` (KEP-2025), with a
    /// timeout; report with [`Router::reverse_dialed`] or
    /// [`Router::reverse_dial_failed`].
    ReverseDial {
        /// The agent tunnel asking.
        backend: BackendId,
        /// The agent's dial id.
        random: i64,
        /// The allow-list entry to dial.
        target: usize,
    },
    /// A reverse dial was refused or failed (metrics and log; the agent
    /// got the generic answer).
    ReverseRefused(ReverseRefusal),
    /// A reverse dial connected (metrics).
    ReverseDialed,
    /// A dial failed (metrics).
    DialFailed(DialFailure),
    /// A dial was refused by a limit or the overload manager before it
    /// reached an agent (metrics, audit). The frontend already got its
    /// answer (DIAL_RSP error / CONNECT 503).
    DialRefused {
        /// The frontend refused.
        frontend: FrontendId,
        /// Why.
        reason: Refusal,
        /// The agent the dial would have gone to.
        backend: BackendId,
        /// The dial's address, as the frontend sent it.
        address: Box<str>,
    },
    /// A dial succeeded (metrics: `dial_duration_seconds`; the log's one
    /// line per established dial, whatever the frontend).
    DialSucceeded {
        /// The frontend that dialled.
        frontend: FrontendId,
        /// The agent that dialled for it.
        backend: BackendId,
        /// The agent's id of the new connection.
        connect_id: i64,
        /// From DIAL_REQ to DIAL_RSP.
        elapsed: Duration,
    },
    /// A frontend that dialled left the router: its connection's (or
    /// refused dial's) summary, for the audit log and the byte and
    /// duration metrics (`account`).
    ConnEnded(Box<ConnSummary>),
}

/// What one core's router sends another's (see [`Action::Relay`]).
#[derive(Clone, Debug, PartialEq)]
pub enum Relay {
    /// Frontend core → tunnel core: a packet for the agent; feed it to
    /// [`Router::relayed_packet`] there.
    ToBackend {
        /// The backend (a tunnel of the receiving core).
        backend: BackendId,
        /// The packet.
        payload: Payload,
    },
    /// Frontend core → tunnel core: tunnel credit that may go back to the
    /// agent now.
    Release {
        /// The backend.
        backend: BackendId,
        /// Bytes of credit.
        credit: usize,
    },
    /// Tunnel core → frontend core: an agent's packet for a relayed flow;
    /// feed it to [`Router::backend_packet`] there, with `credit`.
    FromBackend {
        /// The backend it came from.
        backend: BackendId,
        /// The packet.
        payload: Payload,
        /// The tunnel credit it came with (returned with
        /// [`Relay::Release`] when the frontend's core decides).
        credit: usize,
    },
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
    /// The reverse direction (KEP-2025): allow-list and per-agent limits.
    pub reverse: ReverseConfig,
    /// Dial admission limits and the overload flag, shared by the
    /// cluster's routers on every core (`None`: all off).
    pub limits: Option<Arc<Limits>>,
}

impl Default for RouterConfig {
    fn default() -> Self {
        Self {
            core: 0,
            dial_timeout: Duration::from_secs(30),
            max_pending_per_frontend: 16,
            max_pending_per_backend: 4096,
            flow: FlowLimits::default(),
            reverse: ReverseConfig::default(),
            limits: None,
        }
    }
}

/// A dial in flight.
#[derive(Debug)]
struct Pending {
    frontend: FrontendId,
    /// Its hold on the admission limits (moves to the frontend when the
    /// dial succeeds).
    permit: Permit,
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
    /// The client's identity for the per-frontend limits
    /// ([`Router::set_frontend_identity`]; `None`: the empty identity).
    identity: Option<Arc<str>>,
    /// Admission permits of its established connections (released when
    /// they are all closed or the frontend goes).
    permits: Vec<Permit>,
    /// Its connection's accounting (audit, byte metrics).
    account: Account,
}

/// Pushes onto one of a frontend's lists, which almost always hold one
/// item (one dial per kube-apiserver connection): the first push reserves
/// room for exactly one, not the four a `Vec` starts with (a `Permit` list
/// of four is 288 bytes per frontend).
pub(super) fn push_one<T>(v: &mut Vec<T>, item: T) {
    if v.capacity() == 0 {
        v.reserve_exact(1);
    }
    v.push(item);
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
            identity: None,
            permits: Vec::new(),
            account: Account::default(),
        }
    }
}

#[derive(Debug, Default)]
struct Backend {
    /// Established connections of this core's frontends: connectID →
    /// frontend.
    established: IdMap<i64, FrontendId>,
    /// Pending dials of this core's frontends sent to this backend.
    pending: BTreeSet<i64>,
    /// The agent negotiated konn's flow-control extension.
    flow_control: bool,
    /// `Some(core)`: a proxy of a tunnel on that core (module docs).
    remote: Option<usize>,
    /// A local tunnel's dials from other cores' frontends: random → core.
    relay_pending: IdMap<i64, usize>,
    /// A local tunnel's connections of other cores' frontends: connectID
    /// → core (until CLOSE_RSP or the tunnel ends).
    relay_established: IdMap<i64, usize>,
    /// The reverse direction on this tunnel (KEP-2025).
    reverse: ReverseState,
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
    /// Proxies of other cores' backends (flows of this core's frontends
    /// through tunnels of other cores).
    pub remote_backends: usize,
    /// Dials and connections of other cores' frontends through this core's
    /// tunnels.
    pub relayed: usize,
    /// Reverse dials (KEP-2025) in flight.
    pub reverse_pending: usize,
    /// Reverse connections open (not in `established`, which counts the
    /// forward direction, as upstream's gauge does).
    pub reverse_open: usize,
}

/// The per-core router. See the module docs.
#[derive(Debug)]
pub struct Router {
    cfg: RouterConfig,
    directory: Directory,
    backends: IdMap<BackendId, Backend>,
    /// Boxed: a frontend is 320 bytes, and a table sized for thousands of
    /// them keeps up to twice as many slots as entries.
    frontends: IdMap<FrontendId, Box<Frontend>>,
    pending: IdMap<i64, Pending>,
    actions: std::collections::VecDeque<Action>,
    /// `konn-resume` sessions of local backends (`resume.rs`).
    resume: resume::ResumeState,
}

impl Router {
    /// A router with the backend `directory` (strategies inside).
    pub fn new(cfg: RouterConfig, directory: Directory) -> Self {
        Self {
            cfg,
            directory,
            backends: IdMap::default(),
            frontends: IdMap::default(),
            pending: IdMap::default(),
            actions: std::collections::VecDeque::new(),
            resume: resume::ResumeState::default(),
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
        let local = self.backends.values().filter(|b| b.remote.is_none());
        let (reverse_pending, reverse_open) = local
            .clone()
            .map(|b| b.reverse.load())
            .fold((0, 0), |(p, o), (bp, bo)| (p + bp, o + bo));
        let all: usize = self.backends.values().map(|b| b.established.len()).sum();
        RouterStats {
            pending_dials: self.pending.len(),
            established: all.saturating_sub(reverse_open),
            frontends: self.frontends.len(),
            backends: local.clone().count(),
            remote_backends: self.backends.len() - local.clone().count(),
            relayed: local
                .map(|b| b.relay_pending.len() + b.relay_established.len())
                .sum(),
            reverse_pending,
            reverse_open,
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
            .filter(|(_, b)| b.remote.is_none())
            .map(|(id, b)| {
                (
                    *id,
                    b.established.len() + b.relay_established.len(),
                    b.pending.len() + b.relay_pending.len(),
                )
            })
    }

    /// Connections open and dials pending on one backend (for
    /// `/debug/backends`).
    pub fn backend_load(&self, id: BackendId) -> (usize, usize) {
        self.backends
            .get(&id)
            .map_or((0, 0), |b| (b.established.len(), b.pending.len()))
    }

    // ----- helpers ----------------------------------------------------------

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
        self.send_backend(backend, Payload::Packet(Packet::CloseReq { connect_id }));
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
            self.reverse_forgotten(&f);
            self.release_rx(&mut f);
            self.account_ended(fid, &mut f);
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
                    self.send_backend(p.backend, Payload::Packet(Packet::DialCls { random }));
                }
            }
        }
    }
}

/// The packet type of a payload, for the per-type metrics.
pub fn payload_type(p: &Payload) -> Option<PacketType> {
    match p {
        Payload::Packet(p) => Some(p.ty()),
        Payload::Forward(_) => None,
    }
}

mod account;
mod backend;
mod flow;
mod frontend;
mod relay;
mod responses;
mod resume;
mod reverse;

use account::Account;
pub use account::{ConnResult, ConnSummary, ConnView, Side};
use relay::relay_target;
use responses::{DialFail, no_tunnel_response, raw_response, refused_response};
pub use responses::{dial_error_response, dial_error_status};
pub use resume::RESUME_VIOLATION;
use reverse::ReverseState;
pub use reverse::{REVERSE_REFUSED, ReverseConfig, ReverseRefusal};

mod invariants;
#[cfg(test)]
mod tests;
