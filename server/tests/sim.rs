//! The in-memory harness: the proxy-server's [`Router`] and the
//! proxy-agent's [`Tunnel`] — both sans-IO state machines — driven against
//! each other with a simulated clock. No sockets, threads or real time: the
//! harness plays every IO layer (gRPC frontends, the tunnel's HTTP/2 stream
//! in each direction with its window, the agent's destinations) in 1 ms
//! ticks, so whole scenarios (a stuck timeout of seconds, a dial timeout)
//! run in milliseconds and always the same way.
//!
//! Invariants checked after every scenario: the router's and the tunnel's
//! tables are empty once everything is closed, every byte of credit came
//! back to both stream windows, and what came back through an echo is a
//! prefix of what was sent (nothing lost, duplicated or reordered).

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes, BytesMut};
use konn_frames::packet::{ByteStr, Packet};
use konn_protocol::agent::tunnel::{self, STUCK, Tunnel, TunnelConfig};
use konn_protocol::flow::FlowLimits;
use konn_protocol::server::backends::{Directory, Identifiers, Strategy as Pick};
use konn_protocol::server::router::{
    Action, BACKEND_DIAL_TIMEOUT, BACKEND_GONE, FrontendId, FrontendKind, Payload, Router,
    RouterConfig, RouterStats,
};
use proptest::prelude::*;

const BACKEND: u64 = 1;
const TICK: Duration = Duration::from_millis(1);
/// The tunnel stream's window in each direction.
const WINDOW: usize = 256 << 10;
/// The per-connection queue size (`--conn-queue-size`): low 8 KiB, high
/// 32 KiB, limit 256 KiB, cap 1 MiB.
const QUEUE: usize = 64 << 10;
const STUCK_TIMEOUT: Duration = Duration::from_secs(2);
const DIAL_TIMEOUT: Duration = Duration::from_secs(5);
const DIAL_LATENCY: Duration = Duration::from_millis(2);
/// DATA payloads, as konn's IO layers cut them (one 16 KiB frame).
const CHUNK: usize = 16 * 1024 - 64;
/// Bytes each party moves per tick (64 MB/s).
const RATE: usize = 64 << 10;
/// DATA packets the agent keeps queued on the tunnel before it stops
/// reading destinations (its send queue's low-water mark).
const AGENT_SEND_QUEUE: usize = 4;

/// The simulated clock's origin: the only reading of the real clock.
fn epoch() -> Instant {
    #[allow(clippy::disallowed_methods)]
    Instant::now()
}

fn framed(p: &Packet) -> Bytes {
    let mut b = BytesMut::new();
    p.encode_grpc(&mut b);
    b.freeze()
}

fn decode(p: Payload) -> (Packet, Bytes) {
    match p {
        Payload::Packet(p) => {
            let f = framed(&p);
            (p, f)
        }
        Payload::Forward(b) => (Packet::decode(&b.slice(5..)).expect("router output"), b),
    }
}

/// The byte at `offset` of frontend `fid`'s stream.
fn pattern(fid: FrontendId, offset: usize) -> u8 {
    let x = (offset as u64).wrapping_mul(31).wrapping_add(fid * 7);
    (x ^ (x >> 9)) as u8
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

/// What a dial to an address finds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum DestKind {
    /// Accepts and echoes every byte back.
    Echo,
    /// Never answers the dial.
    Hang,
    /// Refuses the connection.
    Refuse,
}

impl DestKind {
    fn address(self) -> &'static str {
        match self {
            Self::Echo => "10.0.0.1:7",
            Self::Hang => "10.0.0.2:7",
            Self::Refuse => "10.0.0.3:7",
        }
    }

    fn of(address: &str) -> Self {
        [Self::Echo, Self::Hang, Self::Refuse]
            .into_iter()
            .find(|k| k.address() == address)
            .expect("known address")
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
    closed: bool,
    aborted: bool,
}

/// A gRPC frontend (kube-apiserver's konnectivity-client) with one dial.
#[derive(Debug, Default)]
struct Fe {
    connect_id: Option<i64>,
    dial_error: Option<String>,
    dial_cls: bool,
    close_rsp: Option<String>,
    /// Bytes still to send, and sent so far.
    to_send: usize,
    sent: usize,
    /// Echoed bytes received, all checked against the pattern.
    received: usize,
    /// Packets the server queued on this frontend's stream, unread.
    stream: VecDeque<(Packet, Bytes)>,
    reading: bool,
    /// The agent paused this frontend (PAUSE → the server stops reading).
    paused: bool,
    gone: bool,
}

struct Sim {
    now: Instant,
    router: Router,
    tunnel: Tunnel,
    s2a: Link,
    a2s: Link,
    fes: HashMap<FrontendId, Fe>,
    next_fid: FrontendId,
    dests: HashMap<i64, Dest>,
    /// Dials in progress: (when they finish, connect id, kind).
    dialing: Vec<(Instant, i64, DestKind)>,
    cancelled_dials: usize,
}

impl Sim {
    /// Server and agent with one tunnel; `flow_control`: both sides
    /// negotiated konn's PAUSE/RESUME extension.
    fn new(flow_control: bool) -> Self {
        let flow = FlowLimits::from_queue_size(QUEUE, STUCK_TIMEOUT);
        let mut router = Router::new(
            RouterConfig {
                dial_timeout: DIAL_TIMEOUT,
                flow,
                ..RouterConfig::default()
            },
            Directory::new(vec![Pick::Default]),
        );
        router.backend_connected(BACKEND, "agent-1".into(), Identifiers::default(), 0);
        router.set_flow_control(BACKEND, flow_control);
        let mut tunnel = Tunnel::new(TunnelConfig {
            flow,
            ..TunnelConfig::default()
        });
        tunnel.set_flow_control(flow_control);
        Self {
            now: epoch(),
            router,
            tunnel,
            s2a: Link::new(),
            a2s: Link::new(),
            fes: HashMap::new(),
            next_fid: 1,
            dests: HashMap::new(),
            dialing: Vec::new(),
            cancelled_dials: 0,
        }
    }

    // ----- what the tests do ------------------------------------------------

    /// A new frontend dials `kind` and will send `n` bytes once connected.
    fn dial(&mut self, kind: DestKind, n: usize) -> FrontendId {
        let fid = self.next_fid;
        self.next_fid += 1;
        let random = 1000 + fid as i64;
        self.fes.insert(
            fid,
            Fe {
                to_send: n,
                reading: true,
                ..Fe::default()
            },
        );
        self.router.frontend_opened(fid, FrontendKind::Grpc);
        let p = Packet::DialReq {
            protocol: ByteStr::from_static("tcp"),
            address: ByteStr::from_static(kind.address()),
            random,
        };
        let f = framed(&p);
        self.router.frontend_packet(self.now, fid, p, f, fid);
        self.pump();
        fid
    }

    /// The frontend sends CLOSE_REQ for its connection.
    fn close(&mut self, fid: FrontendId) {
        let Some(connect_id) = self.fes[&fid].connect_id else {
            return;
        };
        let p = Packet::CloseReq { connect_id };
        let f = framed(&p);
        self.router.frontend_packet(self.now, fid, p, f, 0);
        self.pump();
    }

    /// The frontend's stream ends (kube-apiserver closed the connection).
    fn frontend_gone(&mut self, fid: FrontendId) {
        if let Some(fe) = self.fes.get_mut(&fid) {
            fe.gone = true;
            fe.stream.clear();
        }
        self.router.frontend_gone(fid);
        self.pump();
    }

    /// The destination of `fid`'s connection stops or resumes reading.
    fn dest_reading(&mut self, fid: FrontendId, reading: bool) {
        if let Some(d) = self.fes[&fid]
            .connect_id
            .and_then(|c| self.dests.get_mut(&c))
        {
            d.reading = reading;
        }
    }

    /// Frontend `fid` stops or resumes reading its stream.
    fn frontend_reading(&mut self, fid: FrontendId, reading: bool) {
        if let Some(fe) = self.fes.get_mut(&fid) {
            fe.reading = reading;
        }
    }

    /// The tunnel dies: the server and the agent each notice.
    fn tunnel_gone(&mut self) {
        self.router.backend_gone(BACKEND);
        self.tunnel.tunnel_gone();
        self.s2a.queue.clear();
        self.a2s.queue.clear();
        self.pump();
    }

    fn run_for(&mut self, d: Duration) {
        let end = self.now + d;
        while self.now < end {
            self.tick();
        }
    }

    /// Runs until `done` holds; panics after `limit` of simulated time.
    fn run_until(&mut self, limit: Duration, mut done: impl FnMut(&Self) -> bool) {
        let end = self.now + limit;
        while !done(self) {
            assert!(
                self.now < end,
                "not done after {limit:?}: {:?}",
                self.stats()
            );
            self.tick();
        }
    }

    fn echoed_all(&self, fid: FrontendId, n: usize) -> bool {
        self.fes[&fid].received == n
    }

    fn stats(&self) -> (RouterStats, usize, usize, usize) {
        (
            self.router.stats(),
            self.tunnel.endpoints(),
            self.s2a.window,
            self.a2s.window,
        )
    }

    /// `closing` send CLOSE_REQ, then every frontend goes away; then
    /// everything must be back to baseline ([`Sim::assert_clean`]).
    fn wind_down(&mut self, closing: &[FrontendId]) {
        for &f in closing {
            self.close(f);
        }
        self.run_for(Duration::from_millis(10));
        for f in 1..self.next_fid {
            self.frontend_gone(f);
        }
        self.run_for(Duration::from_millis(10));
        self.assert_clean();
    }

    /// Everything closed: empty tables, all credit back in both windows.
    fn assert_clean(&self) {
        let (stats, endpoints, s2a, a2s) = self.stats();
        assert_eq!(
            (stats.pending_dials, stats.established, stats.frontends),
            (0, 0, 0),
            "router tables: {stats:?}"
        );
        assert_eq!(endpoints, 0, "agent endpoints");
        assert!(self.dialing.is_empty(), "dials in progress");
        assert_eq!((s2a, a2s), (WINDOW, WINDOW), "credit lost or made up");
        assert!(
            self.dests.values().all(|d| d.closed),
            "a destination is open"
        );
    }

    // ----- the simulated IO layers ----------------------------------------

    fn tick(&mut self) {
        self.now += TICK;
        let now = self.now;
        if self.router.poll_timeout().is_some_and(|t| t <= now) {
            self.router.handle_timeout(now);
        }
        if self.tunnel.poll_timeout().is_some_and(|t| t <= now) {
            self.tunnel.handle_timeout(now);
        }
        self.pump();
        self.finish_dials();
        self.frontends_send();
        self.deliver();
        self.destinations();
        self.frontends_read();
        self.pump();
    }

    fn finish_dials(&mut self) {
        let now = self.now;
        let (due, later): (Vec<_>, Vec<_>) = self.dialing.drain(..).partition(|d| d.0 <= now);
        self.dialing = later;
        for (_, connect_id, kind) in due {
            match kind {
                DestKind::Echo => {
                    if self.tunnel.dial_succeeded(connect_id) {
                        self.dests.insert(
                            connect_id,
                            Dest {
                                reading: true,
                                ..Dest::default()
                            },
                        );
                    }
                }
                DestKind::Refuse => self.tunnel.dial_failed(
                    connect_id,
                    format!("dial tcp {}: connect: connection refused", kind.address()),
                    tunnel::DialFailure::Unknown,
                ),
                DestKind::Hang => unreachable!("hanging dials are never due"),
            }
            self.pump();
        }
    }

    /// Frontends send their pattern as DATA while not paused.
    fn frontends_send(&mut self) {
        let mut ids: Vec<FrontendId> = self.fes.keys().copied().collect();
        ids.sort_unstable();
        for fid in ids {
            let mut budget = RATE;
            loop {
                let fe = &self.fes[&fid];
                let (Some(connect_id), false, false) = (fe.connect_id, fe.paused, fe.gone) else {
                    break;
                };
                if fe.to_send == 0 || budget == 0 || fe.close_rsp.is_some() {
                    break;
                }
                let n = fe.to_send.min(CHUNK).min(budget);
                let data: Bytes = (fe.sent..fe.sent + n).map(|i| pattern(fid, i)).collect();
                let fe = self.fes.get_mut(&fid).expect("listed");
                fe.sent += n;
                fe.to_send -= n;
                budget -= n;
                let p = Packet::Data {
                    connect_id,
                    error: ByteStr::new(),
                    data,
                };
                let f = framed(&p);
                self.router.frontend_packet(self.now, fid, p, f, 0);
                self.pump();
            }
        }
    }

    /// Moves what each stream window allows across the tunnel.
    fn deliver(&mut self) {
        while let Some((p, f)) = self.s2a.queue.front()
            && f.len() <= self.s2a.window
        {
            let (p, f) = (p.clone(), f.clone());
            self.s2a.queue.pop_front();
            self.s2a.window -= f.len();
            self.tunnel.server_packet(self.now, p, f.len());
            self.pump();
        }
        while let Some((_, f)) = self.a2s.queue.front()
            && f.len() <= self.a2s.window
        {
            let (p, f) = self.a2s.queue.pop_front().expect("peeked");
            self.a2s.window -= f.len();
            let credit = f.len();
            let now_credit = self.router.backend_packet(self.now, BACKEND, p, f, credit);
            self.a2s.window += now_credit;
            self.pump();
        }
    }

    /// Destinations read and echo; the agent reads what they echo.
    fn destinations(&mut self) {
        let mut ids: Vec<i64> = self.dests.keys().copied().collect();
        ids.sort_unstable();
        for connect_id in ids {
            let d = self.dests.get_mut(&connect_id).expect("listed");
            if d.closed {
                continue;
            }
            let mut read = 0;
            while d.reading && read < RATE {
                let Some(mut b) = d.inbox.pop_front() else {
                    break;
                };
                let n = b.len().min(RATE - read);
                d.outbox.push_back(b.split_to(n));
                if !b.is_empty() {
                    d.inbox.push_front(b);
                }
                read += n;
            }
            if read > 0 {
                self.tunnel.endpoint_drained(connect_id, read, self.now);
                self.pump();
            }
            // The agent's endpoint reader: DATA straight to the tunnel.
            loop {
                let d = self.dests.get_mut(&connect_id).expect("listed");
                if d.read_paused || d.closed || self.a2s.queue.len() >= AGENT_SEND_QUEUE {
                    break;
                }
                let Some(mut b) = d.outbox.pop_front() else {
                    break;
                };
                let chunk = b.split_to(b.len().min(CHUNK));
                if !b.is_empty() {
                    d.outbox.push_front(b);
                }
                let p = Packet::Data {
                    connect_id,
                    error: ByteStr::new(),
                    data: chunk,
                };
                let f = framed(&p);
                self.a2s.queue.push_back((p, f));
            }
        }
    }

    /// Frontends read their streams; the server reports each queue's level.
    fn frontends_read(&mut self) {
        let mut ids: Vec<FrontendId> = self.fes.keys().copied().collect();
        ids.sort_unstable();
        for fid in ids {
            let fe = self.fes.get_mut(&fid).expect("listed");
            if !fe.reading || fe.gone {
                continue;
            }
            let mut budget = RATE;
            let mut read_any = false;
            while budget > 0 {
                let Some((p, f)) = fe.stream.pop_front() else {
                    break;
                };
                read_any = true;
                match p {
                    Packet::Data { mut data, .. } => {
                        budget = budget.saturating_sub(f.len());
                        while data.has_remaining() {
                            assert_eq!(
                                data.get_u8(),
                                pattern(fid, fe.received),
                                "frontend {fid}: echoed byte {} differs",
                                fe.received
                            );
                            fe.received += 1;
                        }
                    }
                    Packet::DialRsp {
                        error, connect_id, ..
                    } => {
                        if error.is_empty() {
                            fe.connect_id = Some(connect_id);
                        } else {
                            fe.dial_error = Some(error.to_string());
                        }
                    }
                    Packet::CloseRsp { error, .. } => fe.close_rsp = Some(error.to_string()),
                    Packet::DialCls { .. } => fe.dial_cls = true,
                    other => panic!("frontend {fid} got {other:?}"),
                }
            }
            if read_any {
                let level = fe
                    .stream
                    .iter()
                    .filter(|(p, _)| matches!(p, Packet::Data { .. }))
                    .map(|(_, f)| f.len())
                    .sum();
                self.router.frontend_level(self.now, fid, level);
                self.pump();
            }
        }
    }

    /// Performs every action both state machines produced.
    fn pump(&mut self) {
        loop {
            let mut any = false;
            while let Some(a) = self.router.poll_action() {
                any = true;
                self.router_action(a);
            }
            while let Some(a) = self.tunnel.poll_action() {
                any = true;
                self.tunnel_action(a);
            }
            if !any {
                return;
            }
        }
    }

    fn router_action(&mut self, a: Action) {
        match a {
            Action::ToBackend { backend, payload } => {
                assert_eq!(backend, BACKEND);
                self.s2a.queue.push_back(decode(payload));
            }
            Action::ToFrontend { frontend, payload } => {
                if let Some(fe) = self.fes.get_mut(&frontend)
                    && !fe.gone
                {
                    fe.stream.push_back(decode(payload));
                }
            }
            Action::ReleaseBackend { backend, credit } => {
                assert_eq!(backend, BACKEND);
                self.a2s.window += credit;
            }
            Action::PauseFrontend { frontend } => {
                if let Some(fe) = self.fes.get_mut(&frontend) {
                    fe.paused = true;
                }
            }
            Action::ResumeFrontend { frontend, .. } => {
                if let Some(fe) = self.fes.get_mut(&frontend) {
                    fe.paused = false;
                }
            }
            Action::CloseFrontend { frontend } | Action::AbortFrontend { frontend } => {
                panic!("gRPC frontend {frontend} closed as a CONNECT socket")
            }
            Action::ConnectEstablished { .. }
            | Action::ConnectData { .. }
            | Action::ConnectFailed { .. } => panic!("CONNECT action for a gRPC frontend: {a:?}"),
            Action::Relay { .. } => panic!("one core: nothing is relayed: {a:?}"),
            Action::ReverseDial { .. } | Action::ReverseRefused(_) | Action::ReverseDialed => {
                panic!("the reverse direction is not negotiated here: {a:?}")
            }
            Action::DialFailed(_) | Action::DialSucceeded(_) => {}
        }
    }

    fn tunnel_action(&mut self, a: tunnel::Action) {
        use tunnel::Action as T;
        match a {
            T::ToServer(p) => {
                let f = framed(&p);
                self.a2s.queue.push_back((p, f));
            }
            T::Dial {
                connect_id,
                address,
            } => {
                let kind = DestKind::of(&address);
                let at = match kind {
                    DestKind::Hang => self.now + Duration::from_secs(1 << 20),
                    _ => self.now + DIAL_LATENCY,
                };
                self.dialing.push((at, connect_id, kind));
            }
            T::CancelDial { connect_id } => {
                let before = self.dialing.len();
                self.dialing.retain(|d| d.1 != connect_id);
                assert_eq!(before, self.dialing.len() + 1, "cancelled an unknown dial");
                self.cancelled_dials += 1;
            }
            T::Write { connect_id, data } => {
                let d = self
                    .dests
                    .get_mut(&connect_id)
                    .expect("write to a known endpoint");
                assert!(!d.closed, "write after close");
                d.inbox.push_back(data);
            }
            T::Close { connect_id } => {
                if let Some(d) = self.dests.get_mut(&connect_id) {
                    d.closed = true;
                }
            }
            T::Abort { connect_id } => {
                if let Some(d) = self.dests.get_mut(&connect_id) {
                    d.closed = true;
                    d.aborted = true;
                    d.inbox.clear();
                }
            }
            T::Release(n) => self.s2a.window += n,
            T::PauseRead { connect_id } | T::ResumeRead { connect_id } => {
                let paused = matches!(a, T::PauseRead { .. });
                if let Some(d) = self.dests.get_mut(&connect_id) {
                    d.read_paused = paused;
                }
            }
            T::DialFailed(_) | T::DialSucceeded => {}
            T::ReverseEstablished { .. } | T::ReverseFailed { .. } => {
                panic!("the reverse direction is not negotiated here")
            }
        }
    }
}

/// Dial, echo `n` bytes, close: the common path, for `count` frontends.
fn echo_and_close(sim: &mut Sim, count: usize, n: usize) {
    let fids: Vec<FrontendId> = (0..count).map(|_| sim.dial(DestKind::Echo, n)).collect();
    sim.run_until(Duration::from_secs(10), |s| {
        fids.iter().all(|&f| s.echoed_all(f, n))
    });
    for &f in &fids {
        sim.close(f);
    }
    sim.run_until(Duration::from_secs(1), |s| {
        fids.iter().all(|f| s.fes[f].close_rsp.is_some())
    });
    for &f in &fids {
        assert_eq!(sim.fes[&f].close_rsp.as_deref(), Some(""));
        sim.frontend_gone(f);
    }
}

#[test]
fn echo_through_the_tunnel_then_everything_is_back_to_baseline() {
    for flow_control in [true, false] {
        let mut sim = Sim::new(flow_control);
        // Each flow is several windows long, so credit must come back.
        echo_and_close(&mut sim, 4, 2 << 20);
        sim.run_for(Duration::from_millis(10));
        sim.assert_clean();
    }
}

#[test]
fn a_stalled_destination_pauses_only_its_own_flow() {
    let mut sim = Sim::new(true);
    let stalled = sim.dial(DestKind::Echo, 8 << 20);
    sim.run_until(Duration::from_secs(1), |s| {
        s.fes[&stalled].connect_id.is_some()
    });
    sim.dest_reading(stalled, false);
    // The others finish well within the stuck timeout, at full speed.
    let others: Vec<FrontendId> = (0..3).map(|_| sim.dial(DestKind::Echo, 2 << 20)).collect();
    sim.run_until(Duration::from_millis(500), |s| {
        others.iter().all(|&f| s.echoed_all(f, 2 << 20))
    });
    let connect_id = sim.fes[&stalled].connect_id.expect("connected");
    let queued = sim.tunnel.queued(connect_id).expect("still open");
    assert!(sim.fes[&stalled].paused, "PAUSE reached the frontend");
    // High mark plus what was in flight when PAUSE went out.
    assert!(
        queued <= QUEUE / 2 + WINDOW,
        "the agent queued {queued} bytes for a destination that does not read"
    );
    assert!(sim.fes[&stalled].close_rsp.is_none());
    // Nothing drains: after the stuck timeout the agent closes it.
    sim.run_until(STUCK_TIMEOUT + Duration::from_secs(2), |s| {
        s.fes[&stalled].close_rsp.is_some()
    });
    assert_eq!(sim.fes[&stalled].close_rsp.as_deref(), Some(STUCK));
    assert!(sim.dests[&connect_id].aborted);
    sim.wind_down(&others);
}

#[test]
fn a_frontend_that_stops_reading_holds_back_only_its_own_flow_until_it_goes() {
    for flow_control in [true, false] {
        let mut sim = Sim::new(flow_control);
        let deaf = sim.dial(DestKind::Echo, 8 << 20);
        sim.run_until(Duration::from_secs(1), |s| {
            s.fes[&deaf].connect_id.is_some()
        });
        sim.frontend_reading(deaf, false);
        let others: Vec<FrontendId> = (0..3).map(|_| sim.dial(DestKind::Echo, 1 << 20)).collect();
        let done = |s: &Sim| others.iter().all(|&f| s.echoed_all(f, 1 << 20));
        if flow_control {
            // PAUSE stops the agent reading the deaf flow's echo; the
            // others are never held up.
            sim.run_until(STUCK_TIMEOUT / 2, done);
        } else {
            // The credit withheld for the deaf flow is the tunnel's whole
            // window back to the server: the others wait (upstream's
            // behaviour, bounded by the stuck timeout).
            sim.run_for(STUCK_TIMEOUT / 2);
            assert!(!done(&sim), "the others finished with the window withheld");
        }
        let queued = sim.router.frontend_queued(deaf).expect("known");
        assert!(
            queued <= 4 * QUEUE + WINDOW,
            "the server queued {queued} bytes for a frontend that does not read"
        );
        // The frontend goes away before its stuck timeout: its withheld
        // credit goes back at once and the others finish.
        sim.frontend_gone(deaf);
        sim.run_until(Duration::from_millis(500), done);
        sim.wind_down(&others);
    }
}

#[test]
fn without_the_extension_a_stalled_destination_holds_the_tunnel_until_its_stuck_close() {
    let mut sim = Sim::new(false);
    let stalled = sim.dial(DestKind::Echo, 8 << 20);
    sim.run_until(Duration::from_secs(1), |s| {
        s.fes[&stalled].connect_id.is_some()
    });
    sim.dest_reading(stalled, false);
    let others: Vec<FrontendId> = (0..3).map(|_| sim.dial(DestKind::Echo, 2 << 20)).collect();
    sim.run_for(STUCK_TIMEOUT / 2);
    // Upstream's behaviour, bounded: the withheld credit is the tunnel's
    // whole window, so the others wait.
    assert!(
        others.iter().any(|&f| !sim.echoed_all(f, 2 << 20)),
        "the others finished although the tunnel's window was withheld"
    );
    let connect_id = sim.fes[&stalled].connect_id.expect("connected");
    let queued = sim.tunnel.queued(connect_id).expect("still open");
    assert!(
        queued <= 4 * QUEUE + WINDOW,
        "queue {queued} beyond limit + one window"
    );
    // The stuck close returns the credit; the others then finish intact.
    sim.run_until(STUCK_TIMEOUT * 2, |s| {
        others.iter().all(|&f| s.echoed_all(f, 2 << 20))
    });
    assert_eq!(sim.fes[&stalled].close_rsp.as_deref(), Some(STUCK));
    sim.wind_down(&others);
}

#[test]
fn a_dial_that_hangs_times_out_at_the_server_and_is_cancelled_at_the_agent() {
    let mut sim = Sim::new(true);
    let fid = sim.dial(DestKind::Hang, 0);
    sim.run_for(DIAL_TIMEOUT - TICK * 2);
    assert!(sim.fes[&fid].dial_error.is_none(), "too early");
    assert_eq!(sim.dialing.len(), 1);
    sim.run_for(TICK * 10);
    assert_eq!(
        sim.fes[&fid].dial_error.as_deref(),
        Some(BACKEND_DIAL_TIMEOUT)
    );
    // DIAL_CLS reached the agent, which abandoned the dial.
    assert_eq!(sim.cancelled_dials, 1);
    sim.frontend_gone(fid);
    sim.run_for(Duration::from_millis(10));
    sim.assert_clean();
}

#[test]
fn a_refused_dial_answers_with_the_agents_error() {
    let mut sim = Sim::new(true);
    let fid = sim.dial(DestKind::Refuse, 0);
    sim.run_until(Duration::from_secs(1), |s| s.fes[&fid].dial_error.is_some());
    assert_eq!(
        sim.fes[&fid].dial_error.as_deref(),
        Some("dial tcp 10.0.0.3:7: connect: connection refused")
    );
    sim.frontend_gone(fid);
    sim.run_for(Duration::from_millis(10));
    sim.assert_clean();
}

#[test]
fn the_tunnel_dying_ends_every_dial_and_connection_at_once() {
    let mut sim = Sim::new(true);
    let open = sim.dial(DestKind::Echo, 0);
    let pending = sim.dial(DestKind::Hang, 0);
    sim.run_until(Duration::from_secs(1), |s| {
        s.fes[&open].connect_id.is_some()
    });
    sim.tunnel_gone();
    sim.run_for(TICK * 2);
    assert_eq!(sim.fes[&open].close_rsp.as_deref(), Some(""));
    assert_eq!(sim.fes[&pending].dial_error.as_deref(), Some(BACKEND_GONE));
    assert_eq!(sim.cancelled_dials, 1, "the agent abandons its dial");
    assert!(sim.dests.values().all(|d| d.closed));
    sim.frontend_gone(open);
    sim.frontend_gone(pending);
    let stats = sim.router.stats();
    assert_eq!(
        (stats.pending_dials, stats.established, stats.frontends),
        (0, 0, 0)
    );
    assert_eq!(sim.tunnel.endpoints(), 0);
}

/// What a random scenario does.
#[derive(Clone, Debug)]
enum Op {
    Dial(DestKind, usize),
    Stall(usize),
    Unstall(usize),
    Deaf(usize),
    Hear(usize),
    Close(usize),
    Gone(usize),
    Wait(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (
            prop_oneof![Just(DestKind::Echo), Just(DestKind::Hang), Just(DestKind::Refuse)],
            0usize..(600 << 10)
        )
            .prop_map(|(k, n)| Op::Dial(k, n)),
        1 => (0usize..8).prop_map(Op::Stall),
        1 => (0usize..8).prop_map(Op::Unstall),
        1 => (0usize..8).prop_map(Op::Deaf),
        1 => (0usize..8).prop_map(Op::Hear),
        2 => (0usize..8).prop_map(Op::Close),
        1 => (0usize..8).prop_map(Op::Gone),
        3 => (1u64..400).prop_map(Op::Wait),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Any mix of dials, stalls, closes and frontends going away, with or
    /// without the extension: echoes stay intact and in order, and once
    /// every frontend is gone (and the timeouts have passed) both tables
    /// are empty and every byte of credit is back.
    #[test]
    fn any_interleaving_ends_clean(flow_control: bool, ops in prop::collection::vec(op(), 1..24)) {
        let mut sim = Sim::new(flow_control);
        let mut fids = Vec::new();
        let pick = |fids: &[FrontendId], i: usize| fids.get(i % fids.len().max(1)).copied();
        for op in ops {
            match op {
                Op::Dial(k, n) => fids.push(sim.dial(k, n)),
                Op::Stall(i) => if let Some(f) = pick(&fids, i) { sim.dest_reading(f, false) },
                Op::Unstall(i) => if let Some(f) = pick(&fids, i) { sim.dest_reading(f, true) },
                Op::Deaf(i) => if let Some(f) = pick(&fids, i) { sim.frontend_reading(f, false) },
                Op::Hear(i) => if let Some(f) = pick(&fids, i) { sim.frontend_reading(f, true) },
                Op::Close(i) => if let Some(f) = pick(&fids, i) { sim.close(f) },
                Op::Gone(i) => if let Some(f) = pick(&fids, i) { sim.frontend_gone(f) },
                Op::Wait(ms) => sim.run_for(Duration::from_millis(ms)),
            }
        }
        // Wind down: every frontend goes away; pending dials time out at
        // the server, stalled destinations are closed as stuck.
        for &f in &fids {
            sim.frontend_gone(f);
        }
        sim.run_for(DIAL_TIMEOUT + STUCK_TIMEOUT + Duration::from_secs(1));
        // A hanging dial abandoned by its frontend is cancelled by DIAL_CLS.
        sim.assert_clean();
    }
}
