//! The in-memory harness (feature `sim`): proxy-server's
//! [`Router`] and proxy-agent's [`Tunnel`] — both sans-IO state machines —
//! driven against each other on a simulated clock. No sockets, threads or
//! real time: the harness plays every IO layer in 1 ms ticks — gRPC and
//! HTTP CONNECT frontends (with each gRPC frontend's HTTP/2 stream window),
//! the tunnel's HTTP/2 stream in each direction with its window, the
//! agent's destinations — so whole scenarios (a stuck timeout of seconds, a
//! dial timeout) run in milliseconds and always the same way.
//!
//! Used by `server/tests/sim.rs` (scenarios and proptest) and by the `sim`
//! fuzz target (`fuzz/fuzz_targets/sim.rs`), which drive it with [`Op`]s
//! through [`Sim::apply`]. The harness never panics: what breaks an
//! invariant is recorded, and [`Sim::check`] reports it. Checked after
//! every step ([`Sim::check`], `check.rs`):
//!
//! - the router's and the tunnel's own table invariants
//!   ([`Router::check_invariants`], [`Tunnel::check_invariants`]);
//! - credit: each direction of the tunnel stream has exactly its window
//!   of credit, spread over the window left to the sender and the credit
//!   the receiver withholds for flows over their limit; a gRPC frontend's
//!   credit is held by the router only while its flow is paused;
//! - the tables agree with the IO layers: every open endpoint has an open
//!   destination and vice versa, every dial in progress at the agent is one
//!   the harness is dialling, each endpoint's queue is what its destination
//!   has not read, each frontend's queue at the router is what the
//!   frontend has not read, and PAUSE state agrees on both sides;
//! - the data: what a frontend receives is the echo of what it sent, in
//!   order, on its own connection, nothing after its agent's CLOSE_RSP; no
//!   frontend gets a packet it cannot expect.
//!
//! With `konn-resume` ([`Sim::with_resume`], [`run_resumable`]) the
//! tunnel's connection can be cut with packets in flight lost
//! ([`Op::Cut`]): both sides park, and [`Op::Reconnect`] resumes on fresh
//! stream windows (the same backend id); the echo check then proves that
//! nothing was lost, duplicated or reordered across the cut.
//!
//! [`Sim::wind_down`] then closes everything and checks the return to
//! baseline ([`Sim::clean`]): empty tables, all credit back, every
//! destination closed, no dial in progress.

mod check;
mod io;

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use konn_frames::packet::{ByteStr, Packet};

use crate::agent::tunnel::{Tunnel, TunnelConfig};
use crate::flow::FlowLimits;
use crate::server::backends::{BackendId, Directory, Identifiers, Strategy};
use crate::server::router::{FrontendId, FrontendKind, Router, RouterConfig, RouterStats};

/// A tick of the simulated clock.
pub const TICK: Duration = Duration::from_millis(1);
/// The tunnel stream's window in each direction.
pub const WINDOW: usize = 256 << 10;
/// A gRPC frontend's stream window towards the server.
pub const FRONTEND_WINDOW: usize = 64 << 10;
/// The per-connection queue size (`--conn-queue-size`): low 8 KiB, high
/// 32 KiB, limit 256 KiB, cap 1 MiB.
pub const QUEUE: usize = 64 << 10;
/// `--stuck-timeout`.
pub const STUCK_TIMEOUT: Duration = Duration::from_secs(2);
/// The router's dial timeout.
pub const DIAL_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a dial to an answering destination takes.
pub const DIAL_LATENCY: Duration = Duration::from_millis(2);
/// DATA payloads, as konn's IO layers cut them (one 16 KiB frame).
pub const CHUNK: usize = 16 * 1024 - 64;
/// Bytes each party moves per tick (64 MB/s).
pub const RATE: usize = 64 << 10;
/// DATA packets the agent keeps queued on the tunnel before it stops
/// reading destinations (its send queue's low-water mark).
pub const AGENT_SEND_QUEUE: usize = 4;

/// What a dial to an address finds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DestKind {
    /// Accepts and echoes every byte back.
    Echo,
    /// Never answers the dial.
    Hang,
    /// Refuses the connection.
    Refuse,
}

impl DestKind {
    /// The address the frontend dials.
    pub fn address(self) -> &'static str {
        match self {
            Self::Echo => "10.0.0.1:7",
            Self::Hang => "10.0.0.2:7",
            Self::Refuse => "10.0.0.3:7",
        }
    }

    fn of(address: &str) -> Option<Self> {
        [Self::Echo, Self::Hang, Self::Refuse]
            .into_iter()
            .find(|k| k.address() == address)
    }
}

/// One step of a scenario. Frontends are named by their index among the
/// frontends created so far (modulo their number), so any index is valid.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// A new gRPC frontend dials and will send this many bytes.
    Dial(DestKind, usize),
    /// A new HTTP CONNECT frontend dials and will send this many bytes.
    Connect(DestKind, usize),
    /// The destination of a frontend's connection stops reading.
    Stall(usize),
    /// It reads again.
    Unstall(usize),
    /// A frontend stops reading.
    Deaf(usize),
    /// It reads again.
    Hear(usize),
    /// A gRPC frontend sends CLOSE_REQ.
    Close(usize),
    /// A gRPC frontend sends DIAL_CLS for its dial.
    DialCls(usize),
    /// A gRPC frontend sends DATA for a connection it does not have.
    StrayData(usize),
    /// A frontend goes away.
    Gone(usize),
    /// The destination of a frontend's connection closes (EOF).
    DestEof(usize),
    /// The agent sends PAUSE (`true`) or RESUME for a frontend's connection,
    /// out of turn.
    AgentSignal(usize, bool),
    /// The server sends PAUSE or RESUME for a frontend's connection, out of
    /// turn.
    ServerSignal(usize, bool),
    /// The agent sends DRAIN.
    Drain,
    /// The tunnel dies; the agent connects a new one.
    TunnelGone,
    /// The tunnel's connection breaks after this many packets in flight
    /// each way got through (the rest is lost). With resume
    /// ([`Sim::with_resume`]) both sides park until [`Op::Reconnect`] or
    /// the window's end; without it this is [`Op::TunnelGone`].
    Cut(usize),
    /// The agent reconnects to the same server and resumes a parked tunnel
    /// (nothing when none is parked).
    Reconnect,
    /// Time passes (ms).
    Wait(u64),
}

/// One direction of the tunnel's gRPC stream: a FIFO held back by the
/// HTTP/2 stream window.
#[derive(Debug)]
struct Link {
    window: usize,
    queue: VecDeque<(Packet, Bytes)>,
}

impl Link {
    fn new() -> Self {
        Self {
            window: WINDOW,
            queue: VecDeque::new(),
        }
    }
}

/// An agent-side destination connection.
#[derive(Debug, Default)]
struct Dest {
    /// Written by the agent, not read by the destination yet.
    inbox: VecDeque<Bytes>,
    /// Read and echoed, not read by the agent yet.
    outbox: VecDeque<Bytes>,
    /// The destination reads (false: it stopped reading).
    reading: bool,
    /// The server paused reading of this endpoint (PAUSE).
    read_paused: bool,
    /// The destination closed its side (EOF): the agent reports it once
    /// the echo is out.
    eof: bool,
    closed: bool,
    aborted: bool,
}

/// A frontend with one dial: a kube-apiserver konnectivity-client stream
/// (gRPC) or an HTTP CONNECT connection.
#[derive(Debug, Default)]
pub struct Frontend {
    /// HTTP CONNECT (else gRPC).
    pub connect: bool,
    /// The connection the dial established.
    pub connect_id: Option<i64>,
    /// The dial's error (gRPC DIAL_RSP error; CONNECT: the response).
    pub dial_error: Option<String>,
    /// DIAL_CLS came back.
    pub dial_cls: bool,
    /// CLOSE_RSP's error text (gRPC), or "" once a CONNECT socket closed.
    pub close_rsp: Option<String>,
    /// The agent's own CLOSE_RSP came (nothing of the connection follows).
    pub agent_closed: bool,
    /// Bytes still to send, and sent so far.
    pub to_send: usize,
    /// Bytes sent so far.
    pub sent: usize,
    /// Echoed bytes received, all checked against the pattern.
    pub received: usize,
    /// The frontend reads its stream / socket.
    pub reading: bool,
    /// The server stopped reading this frontend (PAUSE; CONNECT only —
    /// a gRPC frontend's credit is held instead).
    pub paused: bool,
    /// The frontend went away (or the server closed it).
    pub gone: bool,
    /// The router closed it as stuck (it stopped reading).
    pub stuck: bool,
    /// gRPC: the frontend's stream window towards the server.
    pub window: usize,
    /// gRPC: credit the server passed on but the router holds.
    pub held: usize,
    /// Summaries the router gave of it
    /// ([`Action::ConnEnded`](crate::server::router::Action::ConnEnded)): one once
    /// it is gone, never more.
    pub summaries: usize,
    /// Packets (framed; whether forwarded from the agent) or CONNECT
    /// payloads the server queued on this frontend, unread.
    stream: VecDeque<(Option<Packet>, Bytes, bool)>,
}

impl Frontend {
    /// Bytes queued towards the frontend as the router counts them
    /// (framed DATA messages, CONNECT payloads).
    fn level(&self) -> usize {
        self.stream
            .iter()
            .filter(|(p, ..)| p.is_none() || matches!(p, Some(Packet::Data { .. })))
            .map(|(_, f, _)| f.len())
            .sum()
    }
}

/// The router and one agent tunnel, the IO layers around them and the
/// simulated clock. See the module docs.
#[derive(Debug)]
pub struct Sim {
    now: Instant,
    router: Router,
    tunnel: Tunnel,
    flow_control: bool,
    /// The current tunnel's backend id (a new one after each reconnect).
    backend: BackendId,
    s2a: Link,
    a2s: Link,
    fes: HashMap<FrontendId, Frontend>,
    order: Vec<FrontendId>,
    next_fid: FrontendId,
    dests: HashMap<i64, Dest>,
    /// Dials in progress: (when they finish, connect id, kind).
    dialing: Vec<(Instant, i64, DestKind)>,
    cancelled_dials: usize,
    /// The first broken invariant.
    violation: Option<String>,
    /// `konn-resume` negotiated, with this window.
    resume: Option<Duration>,
    /// The tunnel is parked (broken, waiting for [`Op::Reconnect`]).
    parked: bool,
}

impl Sim {
    /// Server and agent with one tunnel, starting at `now`;
    /// `flow_control`: both sides negotiated konn's PAUSE/RESUME
    /// extension.
    pub fn new(now: Instant, flow_control: bool) -> Self {
        let router = Router::new(
            RouterConfig {
                dial_timeout: DIAL_TIMEOUT,
                flow: flow_limits(),
                ..RouterConfig::default()
            },
            Directory::new(vec![Strategy::Default]),
        );
        let mut sim = Self {
            now,
            router,
            tunnel: Tunnel::new(TunnelConfig::default()),
            flow_control,
            backend: 0,
            s2a: Link::new(),
            a2s: Link::new(),
            fes: HashMap::new(),
            order: Vec::new(),
            next_fid: 1,
            dests: HashMap::new(),
            dialing: Vec::new(),
            cancelled_dials: 0,
            violation: None,
            resume: None,
            parked: false,
        };
        sim.connect_tunnel();
        sim
    }

    /// As [`Sim::new`], with `konn-resume` negotiated on every tunnel and
    /// a resume window of `window`.
    pub fn with_resume(now: Instant, flow_control: bool, window: Duration) -> Self {
        let mut sim = Self::new(now, flow_control);
        sim.resume = Some(window);
        sim.negotiate_resume();
        sim
    }

    fn negotiate_resume(&mut self) {
        if self.resume.is_some() {
            let limits = crate::resume::ResumeLimits::from_queue_size(QUEUE);
            self.router.set_resume(self.backend, Some(limits));
            self.tunnel.set_resume(Some(limits));
        }
    }

    /// Whether the tunnel is parked.
    pub fn parked(&self) -> bool {
        self.parked
    }

    /// A fresh tunnel (and backend id) between the agent and the server.
    fn connect_tunnel(&mut self) {
        self.backend += 1;
        self.router.backend_connected(
            self.backend,
            format!("agent-{}", self.backend),
            Identifiers::default(),
            0,
        );
        self.router
            .set_flow_control(self.backend, self.flow_control);
        self.tunnel = Tunnel::new(TunnelConfig {
            flow: flow_limits(),
            ..TunnelConfig::default()
        });
        self.tunnel.set_flow_control(self.flow_control);
        self.s2a = Link::new();
        self.a2s = Link::new();
        // The old tunnel's destinations are all closed (checked).
        self.dests.clear();
        self.parked = false;
        self.negotiate_resume();
    }

    // ----- what scenarios do --------------------------------------------

    /// The simulated time.
    pub fn now(&self) -> Instant {
        self.now
    }

    /// The router.
    pub fn router(&self) -> &Router {
        &self.router
    }

    /// The agent's tunnel.
    pub fn tunnel(&self) -> &Tunnel {
        &self.tunnel
    }

    /// A frontend's state.
    pub fn frontend(&self, fid: FrontendId) -> Option<&Frontend> {
        self.fes.get(&fid)
    }

    /// Dials the agent has in progress.
    pub fn dials_in_progress(&self) -> usize {
        self.dialing.len()
    }

    /// Dials the agent abandoned (DIAL_CLS, tunnel gone).
    pub fn cancelled_dials(&self) -> usize {
        self.cancelled_dials
    }

    /// Whether the destination of connection `connect_id` was aborted
    /// (closed without flushing: stuck).
    pub fn dest_aborted(&self, connect_id: i64) -> bool {
        self.dests.get(&connect_id).is_some_and(|d| d.aborted)
    }

    /// Counters for failure messages: the router's, the tunnel's endpoints,
    /// the tunnel stream's windows each way.
    pub fn stats(&self) -> (RouterStats, usize, usize, usize) {
        (
            self.router.stats(),
            self.tunnel.endpoints(),
            self.s2a.window,
            self.a2s.window,
        )
    }

    /// Whether frontend `fid` received the echo of `n` bytes.
    pub fn echoed_all(&self, fid: FrontendId, n: usize) -> bool {
        self.fes.get(&fid).is_some_and(|f| f.received == n)
    }

    /// Performs one scenario step.
    pub fn apply(&mut self, op: &Op) {
        match *op {
            Op::Dial(kind, n) => {
                self.dial(kind, n);
            }
            Op::Connect(kind, n) => {
                self.connect(kind, n);
            }
            Op::Stall(i) => self.on_frontend(i, |s, f| s.dest_reading(f, false)),
            Op::Unstall(i) => self.on_frontend(i, |s, f| s.dest_reading(f, true)),
            Op::Deaf(i) => self.on_frontend(i, |s, f| s.frontend_reading(f, false)),
            Op::Hear(i) => self.on_frontend(i, |s, f| s.frontend_reading(f, true)),
            Op::Close(i) => self.on_frontend(i, Self::close),
            Op::DialCls(i) => self.on_frontend(i, Self::dial_cls),
            Op::StrayData(i) => self.on_frontend(i, Self::stray_data),
            Op::Gone(i) => self.on_frontend(i, Self::frontend_gone),
            Op::DestEof(i) => self.on_frontend(i, Self::dest_eof),
            Op::AgentSignal(i, pause) => self.on_frontend(i, |s, f| s.agent_signal(f, pause)),
            Op::ServerSignal(i, pause) => self.on_frontend(i, |s, f| s.server_signal(f, pause)),
            Op::Drain => {
                self.tunnel.drain();
                self.pump();
            }
            Op::TunnelGone => {
                self.tunnel_gone();
                self.connect_tunnel();
            }
            Op::Cut(k) => self.cut(k),
            Op::Reconnect => self.reconnect(),
            Op::Wait(ms) => self.run_for(Duration::from_millis(ms)),
        }
    }

    /// `f` on the frontend with index `i` (modulo their number), if any.
    fn on_frontend(&mut self, i: usize, f: impl FnOnce(&mut Self, FrontendId)) {
        if let Some(&fid) = self.order.get(i % self.order.len().max(1)) {
            f(self, fid);
        }
    }

    fn new_frontend(&mut self, connect: bool, n: usize) -> FrontendId {
        let fid = self.next_fid;
        self.next_fid += 1;
        self.order.push(fid);
        self.fes.insert(
            fid,
            Frontend {
                connect,
                to_send: n,
                reading: true,
                window: FRONTEND_WINDOW,
                ..Frontend::default()
            },
        );
        fid
    }

    /// A new gRPC frontend dials `kind` and will send `n` bytes once
    /// connected.
    pub fn dial(&mut self, kind: DestKind, n: usize) -> FrontendId {
        let fid = self.new_frontend(false, n);
        self.router.frontend_opened(fid, FrontendKind::Grpc);
        let p = Packet::DialReq {
            protocol: ByteStr::from_static("tcp"),
            address: ByteStr::from_static(kind.address()),
            random: dial_random(fid),
        };
        self.frontend_sends(fid, p, fid);
        fid
    }

    /// A new HTTP CONNECT frontend asks for `kind` and will send `n` bytes
    /// once connected.
    pub fn connect(&mut self, kind: DestKind, n: usize) -> FrontendId {
        let fid = self.new_frontend(true, n);
        self.router.frontend_opened(fid, FrontendKind::HttpConnect);
        self.router
            .connect_request(self.now, fid, kind.address(), dial_random(fid), fid);
        self.pump();
        fid
    }

    /// The gRPC frontend sends CLOSE_REQ for its connection.
    pub fn close(&mut self, fid: FrontendId) {
        let Some(f) = self.fes.get(&fid) else {
            return;
        };
        let Some(connect_id) = f.connect_id else {
            return;
        };
        if f.connect || f.gone {
            return;
        }
        self.frontend_sends(fid, Packet::CloseReq { connect_id }, 0);
    }

    /// The gRPC frontend cancels its dial (DIAL_CLS).
    pub fn dial_cls(&mut self, fid: FrontendId) {
        if self.fes.get(&fid).is_some_and(|f| !f.connect && !f.gone) {
            let random = dial_random(fid);
            self.frontend_sends(fid, Packet::DialCls { random }, 0);
        }
    }

    /// The gRPC frontend sends DATA for a connection that is not its own.
    pub fn stray_data(&mut self, fid: FrontendId) {
        if self.fes.get(&fid).is_some_and(|f| !f.connect && !f.gone) {
            let p = Packet::Data {
                connect_id: 1 << 40,
                error: ByteStr::new(),
                data: Bytes::from_static(b"stray"),
            };
            self.frontend_sends(fid, p, 0);
        }
    }

    /// The frontend goes away (kube-apiserver closed the stream or socket).
    pub fn frontend_gone(&mut self, fid: FrontendId) {
        if let Some(fe) = self.fes.get_mut(&fid) {
            fe.gone = true;
            fe.stream.clear();
        }
        self.router.frontend_gone(fid);
        self.pump();
    }

    /// The destination of `fid`'s connection stops or resumes reading.
    pub fn dest_reading(&mut self, fid: FrontendId, reading: bool) {
        if let Some(d) = self.dest_of(fid) {
            d.reading = reading;
        }
    }

    /// The destination of `fid`'s connection closes its side.
    pub fn dest_eof(&mut self, fid: FrontendId) {
        if let Some(d) = self.dest_of(fid) {
            d.eof = true;
        }
    }

    fn dest_of(&mut self, fid: FrontendId) -> Option<&mut Dest> {
        let c = self.fes.get(&fid).and_then(|f| f.connect_id)?;
        self.dests.get_mut(&c)
    }

    /// Frontend `fid` stops or resumes reading.
    pub fn frontend_reading(&mut self, fid: FrontendId, reading: bool) {
        if let Some(fe) = self.fes.get_mut(&fid) {
            fe.reading = reading;
        }
    }

    /// The agent sends PAUSE or RESUME for `fid`'s connection.
    fn agent_signal(&mut self, fid: FrontendId, pause: bool) {
        if let Some(connect_id) = self.fes.get(&fid).and_then(|f| f.connect_id) {
            let p = signal(connect_id, pause);
            let f = framed(&p);
            self.a2s.queue.push_back((p, f));
        }
    }

    /// The server sends PAUSE or RESUME for `fid`'s connection.
    fn server_signal(&mut self, fid: FrontendId, pause: bool) {
        if let Some(connect_id) = self.fes.get(&fid).and_then(|f| f.connect_id) {
            let p = signal(connect_id, pause);
            let f = framed(&p);
            self.s2a.queue.push_back((p, f));
        }
    }

    /// The tunnel dies: the server and the agent each notice.
    pub fn tunnel_gone(&mut self) {
        self.router.backend_gone(self.backend);
        self.tunnel.tunnel_gone();
        self.s2a.queue.clear();
        self.a2s.queue.clear();
        self.pump();
        if let Some(d) = self.dests.iter().find(|(_, d)| !d.closed) {
            self.violate(format!("tunnel gone, destination {} open", d.0));
        }
    }

    /// The tunnel's connection breaks: `k` packets in flight each way get
    /// through, the rest is lost. With resume both sides park; without,
    /// the tunnel is gone and a new one connects.
    pub fn cut(&mut self, k: usize) {
        if self.parked {
            return;
        }
        let Some(window) = self.resume else {
            self.tunnel_gone();
            self.connect_tunnel();
            return;
        };
        for _ in 0..k {
            if let Some((p, f)) = self.s2a.queue.pop_front() {
                self.tunnel.server_packet(self.now, p, f.len());
                self.pump();
            }
            if let Some((p, f)) = self.a2s.queue.pop_front() {
                let credit = f.len();
                let _ = self
                    .router
                    .backend_packet(self.now, self.backend, p, f, credit);
                self.pump();
            }
        }
        self.s2a = Link::new();
        self.a2s = Link::new();
        self.parked = true;
        let parked_server = self.router.backend_broken(self.now, self.backend, window);
        let parked_agent = self.tunnel.tunnel_broken(self.now, window);
        if !(parked_server && parked_agent) {
            // Not parked (DRAIN): as a lost tunnel.
            self.parked = false;
            if parked_server {
                self.router.backend_gone(self.backend);
            }
            if parked_agent {
                self.tunnel.tunnel_gone();
            }
            self.pump();
            self.connect_tunnel();
            return;
        }
        self.pump();
    }

    /// The agent reconnects and resumes the parked tunnel (same backend
    /// id, fresh stream windows). Past the window both sides have closed
    /// everything already; then a new tunnel connects instead.
    pub fn reconnect(&mut self) {
        if !self.parked {
            return;
        }
        self.parked = false;
        let alive = self.router.backend_parked(self.backend)
            && self
                .tunnel
                .resume_session()
                .is_some_and(|s| matches!(s.state(), crate::resume::SessionState::Parked { .. }));
        if !alive {
            self.router.backend_gone(self.backend);
            self.tunnel.tunnel_gone();
            self.pump();
            self.connect_tunnel();
            return;
        }
        self.router.backend_resumed(self.backend);
        self.tunnel.tunnel_resumed();
        self.pump();
    }

    /// Runs for `d` of simulated time.
    pub fn run_for(&mut self, d: Duration) {
        let end = self.now + d;
        while self.now < end {
            self.skip_idle(end);
            self.tick();
        }
    }

    /// While nothing can happen but a timer, jump to just before the next
    /// deadline (at most to `end`): the next tick is the one that matters.
    fn skip_idle(&mut self, end: Instant) {
        if let Some(next) = self.idle_until() {
            let to = next.min(end);
            if to > self.now + TICK {
                self.now = to - TICK;
            }
        }
    }

    /// When nothing moves but timers: the next deadline (router, tunnel,
    /// a dial finishing). `None` while anything can still move.
    fn idle_until(&self) -> Option<Instant> {
        let links = self.s2a.queue.is_empty() && self.a2s.queue.is_empty();
        // A destination that neither reads nor has anything the agent may
        // read (its echo is paused, or there is none and no EOF to report).
        let dests = self.dests.values().all(|d| {
            d.closed
                || ((d.inbox.is_empty() || !d.reading)
                    && (d.read_paused || (d.outbox.is_empty() && !d.eof)))
        });
        let fes = self.fes.values().all(|f| {
            let reads = f.reading && !f.stream.is_empty();
            let sends = f.connect_id.is_some()
                && f.to_send > 0
                && f.close_rsp.is_none()
                && if f.connect {
                    !f.paused
                } else {
                    f.window >= next_message_len(f)
                };
            f.gone || (!reads && !sends)
        });
        if !(links && dests && fes) {
            return None;
        }
        let dials = self.dialing.iter().map(|d| d.0);
        [self.router.poll_timeout(), self.tunnel.poll_timeout()]
            .into_iter()
            .flatten()
            .chain(dials)
            .min()
            .or(Some(self.now + Duration::from_secs(1 << 30)))
    }

    /// Runs until `done` holds; `Err` after `limit` of simulated time.
    /// (`done` is checked after every tick; stretches where nothing but a
    /// timer can change anything are skipped.)
    pub fn run_until(
        &mut self,
        limit: Duration,
        mut done: impl FnMut(&Self) -> bool,
    ) -> Result<(), String> {
        let end = self.now + limit;
        while !done(self) {
            if self.now >= end {
                return Err(format!("not done after {limit:?}: {:?}", self.stats()));
            }
            self.skip_idle(end);
            self.tick();
        }
        Ok(())
    }

    /// `closing` send CLOSE_REQ, then every frontend goes away, and time
    /// passes until every dial and stuck flow has timed out; then
    /// everything must be back to baseline ([`Sim::clean`]).
    pub fn wind_down(&mut self, closing: &[FrontendId]) -> Result<(), String> {
        for &f in closing {
            self.close(f);
        }
        self.run_for(Duration::from_millis(10));
        for f in self.order.clone() {
            self.frontend_gone(f);
        }
        self.run_for(Duration::from_millis(10));
        self.check()?;
        self.clean()
    }

    /// Everything closed: empty tables, all credit back in both windows,
    /// every destination closed, no dial in progress, and (with
    /// `konn-resume`) no connection's resume state left on either side.
    pub fn clean(&self) -> Result<(), String> {
        let (stats, endpoints, s2a, a2s) = self.stats();
        if (stats.pending_dials, stats.established, stats.frontends) != (0, 0, 0) {
            return Err(format!("router tables: {stats:?}"));
        }
        if endpoints != 0 {
            return Err(format!("{endpoints} agent endpoints"));
        }
        if !self.dialing.is_empty() {
            return Err(format!("{} dials in progress", self.dialing.len()));
        }
        if (s2a, a2s) != (WINDOW, WINDOW) {
            return Err(format!(
                "credit lost or made up: windows {s2a} and {a2s} of {WINDOW}"
            ));
        }
        if let Some((c, _)) = self.dests.iter().find(|(_, d)| !d.closed) {
            return Err(format!("destination {c} is open"));
        }
        // Every frontend dialled, so each left exactly one summary.
        if let Some((f, fe)) = self.fes.iter().find(|(_, fe)| fe.summaries != 1) {
            return Err(format!("frontend {f}: {} summaries", fe.summaries));
        }
        // konn-resume: every connection's state gone (closes acknowledged).
        let server = self
            .router
            .resume_session(self.backend)
            .map_or(0, |s| s.len());
        let agent = self.tunnel.resume_session().map_or(0, |s| s.len());
        if (server, agent) != (0, 0) {
            return Err(format!(
                "resume state of {server} connections at the server, {agent} at the agent"
            ));
        }
        Ok(())
    }

    /// Records the first broken invariant.
    fn violate(&mut self, what: String) {
        if self.violation.is_none() {
            self.violation = Some(what);
        }
    }
}

/// Runs a whole scenario: the steps, then the wind-down — every frontend
/// goes away and the timeouts pass — and the return to baseline. `Err`
/// names the first invariant broken.
pub fn run(now: Instant, flow_control: bool, ops: &[Op]) -> Result<(), String> {
    run_sim(Sim::new(now, flow_control), ops)
}

/// [`run`] with `konn-resume` negotiated and a resume window of `window`
/// ([`Op::Cut`] parks, [`Op::Reconnect`] resumes). A parked tunnel at the
/// end reconnects before the wind-down.
pub fn run_resumable(
    now: Instant,
    flow_control: bool,
    window: Duration,
    ops: &[Op],
) -> Result<(), String> {
    let ops: Vec<Op> = ops.iter().cloned().chain([Op::Reconnect]).collect();
    run_sim(Sim::with_resume(now, flow_control, window), &ops)
}

fn run_sim(mut sim: Sim, ops: &[Op]) -> Result<(), String> {
    for (i, op) in ops.iter().enumerate() {
        sim.apply(op);
        sim.check().map_err(|e| format!("step {i} ({op:?}): {e}"))?;
    }
    for f in sim.order.clone() {
        sim.frontend_gone(f);
    }
    // Pending dials time out at the server (DIAL_CLS reaches the agent),
    // stalled destinations are closed as stuck.
    sim.run_for(DIAL_TIMEOUT + STUCK_TIMEOUT + Duration::from_secs(1));
    sim.check().map_err(|e| format!("wind-down: {e}"))?;
    sim.clean().map_err(|e| format!("after the wind-down: {e}"))
}

/// Each flow's queue marks and stuck timeout, at the server and the agent.
fn flow_limits() -> FlowLimits {
    FlowLimits::from_queue_size(QUEUE, STUCK_TIMEOUT)
}

/// The framed length of the DATA message a gRPC frontend sends next.
fn next_message_len(f: &Frontend) -> usize {
    let n = f.to_send.min(CHUNK).min(RATE);
    let data = Packet::Data {
        connect_id: f.connect_id.unwrap_or(0),
        error: ByteStr::new(),
        data: Bytes::from_static(&[0; CHUNK]).slice(..n),
    };
    data.encoded_len() + 5
}

fn dial_random(fid: FrontendId) -> i64 {
    1000 + i64::try_from(fid).unwrap_or(i64::MAX - 1000)
}

fn signal(connect_id: i64, pause: bool) -> Packet {
    if pause {
        Packet::Pause { connect_id }
    } else {
        Packet::Resume { connect_id }
    }
}

/// A packet as its gRPC message (prefix included).
fn framed(p: &Packet) -> Bytes {
    let mut b = BytesMut::new();
    p.encode_grpc(&mut b);
    b.freeze()
}

/// The byte at `offset` of frontend `fid`'s stream.
fn pattern(fid: FrontendId, offset: usize) -> u8 {
    let x = (offset as u64).wrapping_mul(31).wrapping_add(fid * 7);
    (x ^ (x >> 9)) as u8
}
