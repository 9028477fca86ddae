//! One agent tunnel on a socket: the gRPC `/AgentService/Connect` call, the
//! [`Tunnel`] state machine behind it, and the endpoints (dialled
//! destination connections) it relays.
//!
//! ```text
//!   server ══ TLS/HTTP2/gRPC stream ══► TunnelHandler ──► Tunnel (sans-IO)
//!                                            │  Write(connectID, bytes)
//!                                            ▼
//!                 endpoint writer task ──► destination socket
//!                 endpoint reader task ◄── destination socket
//!                        │ DATA packet built in place in a pooled buffer
//!                        └──────────────► send_framed on the tunnel stream
//! ```
//!
//! Per-connection flow control (docs/design/tunnel.md, "Flow control"):
//! - tunnel → endpoint: the [`Tunnel`] accounts each endpoint's queue and
//!   says when the tunnel's HTTP/2 credit goes back (at once below the
//!   flow's limit, as it drains above it), when to send PAUSE/RESUME (konn
//!   servers that negotiated `konn-flow-control`), and when an endpoint that
//!   drains nothing is stuck. The writer reports what the destination took;
//!   reports are batched (added up in the endpoint, handed over before the
//!   endpoint's next DATA, or by the tunnel's one stuck watch task) unless
//!   the tunnel waits for them;
//! - endpoint → tunnel: an endpoint is read only while the tunnel stream's
//!   send queue is below its high-water mark (readers pause and resume
//!   together when it drains) and while the server has not paused that
//!   endpoint with PAUSE (it resumes alone on RESUME).
//!
//! An idle endpoint holds no buffer: its reader waits for readability
//! first and takes a pooled buffer only when there is data.
//!
//! **Observation.** A [`TunnelObserver`] (given to
//! [`TunnelHandler::with_observer`]) is told about every packet sent and
//! received, every dial's outcome and every endpoint's lifetime; the agent
//! runtime turns these into upstream's metrics with per-core counters. It
//! is called synchronously on the tunnel's worker, so it must be cheap.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use konn_core::io::driver::{ConnHandle, Handler, WeakConnHandle};
use konn_core::io::notify::{Broadcast, Notify};
use konn_core::io::pool::BufPool;
use konn_core::io::resolve::{DialError, dial_tcp};
use konn_protocol::server::limits::Refusal;

use crate::allow::DialOutcome;
use crate::debug::EndpointInfo;
use konn_core::io::runtime::{Either, race};
use konn_core::io::sock::{self, PacketRead, PacketWrite};
use konn_core::log::GoDuration;
use konn_frames::GrpcStatus;
use konn_frames::packet::{self, Packet, PacketType};
use konn_protocol::grpc::{Grpc, GrpcEvent};
use konn_protocol::h2::Headers;
use konn_protocol::maps::IdMap;
use std::time::Instant;

use konn_core::metrics::common::ResumeResult;
use konn_protocol::agent::tunnel::{Action, DialFailure, Tunnel, TunnelConfig};
use konn_protocol::resume::ResumeToken;

use crate::resume::ParkingLot;

/// Room in front of a read for the gRPC prefix and the DATA packet header.
const HEADROOM: usize = sock::PACKET_HEADROOM;

/// The request metadata key (and response header) of konn's flow-control
/// extension; its value is `1`. A Go peer ignores it.
pub const FLOW_CONTROL_KEY: &str = "konn-flow-control";

/// The request metadata key (and response header) of konn's reverse
/// direction (KEP-2025, docs/design/reverse.md); its value is `1`.
pub const REVERSE_KEY: &str = "konn-reverse";

/// Tunnel settings.
#[derive(Clone, Debug)]
pub struct TunnelSettings {
    /// Timeout of one destination dial (upstream: 5 s).
    pub dial_timeout: Duration,
    /// `--xfr-channel-size`: the payload count at which
    /// `--warn-on-channel-limit` logs. Queues are bounded in bytes
    /// (`tunnel.flow`), never closed for being long.
    pub endpoint_queue: usize,
    /// Endpoints stop being read while the tunnel stream has this many
    /// bytes queued…
    pub tunnel_high_water: usize,
    /// …and resume when it is down to this many.
    pub tunnel_low_water: usize,
    /// The state machine's limits, the per-endpoint flow-control marks and
    /// the stuck timeout (`--conn-queue-size`, `--stuck-timeout`).
    pub tunnel: TunnelConfig,
    /// `--warn-on-channel-limit`: log (at debug level, upstream's V(2))
    /// when an endpoint's queue reaches `endpoint_queue` payloads.
    pub warn_on_queue_limit: bool,
    /// `--resume-window` (docs/design/resume.md): when not zero, offer
    /// `konn-resume: v1`; with a server that answers it each flow's bytes
    /// are counted, acknowledged and kept for replay, and a tunnel whose
    /// connection breaks keeps its endpoints parked this long for a resume
    /// (when its handler has a [`ParkingLot`](crate::resume::ParkingLot)).
    pub resume_window: Duration,
    /// Offer konn's flow-control extension on the Connect call (metadata
    /// `konn-flow-control: 1`); it is used only if the server answers with
    /// the same response header.
    pub flow_control: bool,
    /// Offer the reverse direction (`konn-reverse: 1`): set when the agent
    /// has `--target`s.
    pub reverse: bool,
    /// `--allowed-destination-cidrs` (empty: every destination).
    pub allowed: Arc<crate::allow::AllowList>,
}

impl TunnelSettings {
    /// The stuck timeout (`--stuck-timeout`).
    pub fn stuck_timeout(&self) -> Duration {
        self.tunnel.flow.stuck_timeout
    }
}

impl Default for TunnelSettings {
    fn default() -> Self {
        Self {
            dial_timeout: Duration::from_secs(5),
            endpoint_queue: 150,
            tunnel_high_water: 1 << 20,
            tunnel_low_water: 256 << 10,
            tunnel: TunnelConfig::default(),
            resume_window: Duration::ZERO,
            warn_on_queue_limit: false,
            flow_control: true,
            reverse: false,
            allowed: Arc::default(),
        }
    }
}

/// What a tunnel reports to the agent's connection manager.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TunnelEvent {
    /// The server accepted the tunnel: its id and `servercount`.
    Connected {
        /// `serverid` response header.
        server_id: String,
        /// `servercount` response header.
        server_count: usize,
        /// The server agreed to the reverse direction (`konn-reverse`).
        reverse: bool,
        /// The server agreed to `konn-resume`.
        resume: bool,
        /// The server resumed a tunnel parked on this worker
        /// (`konn-resumed`).
        resumed: bool,
    },
    /// The call failed before response headers (e.g. authentication), or
    /// the headers were malformed.
    Rejected(String),
    /// The tunnel's connection broke and its endpoints are parked for a
    /// resume (`konn-resume`); [`TunnelEvent::Closed`] follows.
    Parked {
        /// The server it was connected to.
        server_id: String,
    },
    /// A parked tunnel's endpoints closed without a resume (window over,
    /// resume refused, agent stopping); reported after
    /// [`TunnelEvent::Closed`].
    ParkEnded {
        /// The server it was connected to.
        server_id: String,
    },
    /// The tunnel ended.
    Closed,
}

/// Counters of one tunnel (for metrics and leak checks).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TunnelCounters {
    /// Endpoints open now.
    pub open_endpoints: usize,
    /// Dial failures: timeout, other.
    pub dial_failures: [u64; 2],
    /// Dials that succeeded.
    pub dials: u64,
}

/// What happens on a tunnel, for metrics (see the module docs). Every
/// method has an empty default.
pub trait TunnelObserver {
    /// A packet arrived from the server and decoded.
    fn received(&self, _ty: PacketType) {}
    /// A packet was queued for the server.
    fn sent(&self, _ty: PacketType) {}
    /// The Connect call ended with a non-OK status after the server had
    /// accepted it (upstream counts such receive errors).
    fn stream_error(&self, _status: GrpcStatus) {}
    /// A destination dial connected after `elapsed`.
    fn dial_succeeded(&self, _elapsed: Duration) {}
    /// A destination dial failed (or was refused before dialling).
    fn dial_failed(&self, _why: DialFailure) {}
    /// A dial to `address` was refused by the agent itself
    /// (`--allowed-destination-cidrs`); `dial_failed` follows.
    fn dial_refused(&self, _reason: Refusal, _address: &str) {}
    /// An endpoint connection was established.
    fn endpoint_opened(&self) {}
    /// An endpoint connection's socket was released (both directions
    /// done); every [`endpoint_opened`](Self::endpoint_opened) is matched
    /// by exactly one of these.
    fn endpoint_closed(&self) {}
    /// A reverse dial was answered: `true` connected, `false` refused (or
    /// the tunnel ended first).
    fn reverse_dialed(&self, _ok: bool) {}
    /// A reverse connection opened (`true`) or its socket was released.
    fn reverse_connection(&self, _open: bool) {}
    /// A reverse connection carried `n` bytes towards the control plane
    /// (`true`) or towards the node.
    fn reverse_bytes(&self, _to_control_plane: bool, _n: usize) {}
    /// A broken tunnel parked its `connections` endpoints for a resume.
    fn tunnel_parked(&self, _connections: usize) {}
    /// A parked tunnel's parking ended (`connections`: as many as it
    /// parked).
    fn park_ended(&self, _result: ResumeResult, _connections: usize) {}
    /// An endpoint connection ended (just before
    /// [`endpoint_closed`](Self::endpoint_closed)): payload bytes written
    /// to and read from the destination, and how long it was open.
    fn endpoint_ended(&self, _to_destination: u64, _from_destination: u64, _open: Duration) {}
}

/// The observer of a tunnel nobody watches.
struct Unobserved;

impl TunnelObserver for Unobserved {}

/// Tells the observer when an endpoint's last task lets go of it (a
/// reverse connection, negative id, is counted as such, not as one of
/// upstream's endpoints).
struct EndpointGuard(Rc<dyn TunnelObserver>, bool);

impl EndpointGuard {
    fn new(observer: Rc<dyn TunnelObserver>, reverse: bool) -> Self {
        if reverse {
            observer.reverse_connection(true);
        } else {
            observer.endpoint_opened();
        }
        Self(observer, reverse)
    }
}

impl Drop for EndpointGuard {
    fn drop(&mut self) {
        if self.1 {
            self.0.reverse_connection(false);
        } else {
            self.0.endpoint_closed();
        }
    }
}

/// Per-tunnel state the tasks share without owning the connection. A
/// resumed tunnel's tasks keep theirs: it moves to the new connection.
struct Ctx {
    /// The connection the tunnel runs on now.
    me: RefCell<WeakConnHandle<Grpc, TunnelHandler>>,
    stream: Cell<u32>,
    /// The tunnel stream's send queue drained below the low-water mark.
    writable: Broadcast,
    pool: BufPool,
    settings: TunnelSettings,
    observer: Rc<dyn TunnelObserver>,
    /// The tunnel ended: the stuck watch stops.
    closed: Cell<bool>,
    wake_watch: Notify,
    /// The server's `serverid`, once it answered (`/debug/connections`).
    server_id: RefCell<Option<Arc<str>>>,
    /// When the watch wakes next (an ACK timer due sooner wakes it).
    armed: Cell<Option<Instant>>,
}

impl Ctx {
    /// The tunnel's connection, while it (or its parked state) exists.
    fn handle(&self) -> Option<Handle> {
        self.me.borrow().upgrade()
    }
}

/// One endpoint (dialled destination connection).
struct Endpoint {
    connect_id: i64,
    queue: RefCell<VecDeque<Bytes>>,
    wake_writer: Notify,
    /// Stop reading; the writer flushes what is queued, then closes.
    closing: Cell<bool>,
    stop_reader: Notify,
    /// Drop everything now (stuck).
    abort: Notify,
    aborted: Cell<bool>,
    /// The server paused reading of this endpoint (PAUSE).
    read_paused: Cell<bool>,
    /// Wakes a paused reader (RESUME).
    resume: Notify,
    /// Bytes written to the destination and not yet reported to the
    /// tunnel, and when the last of them went.
    drained: Cell<usize>,
    drained_at: Cell<Option<Instant>>,
    /// The tunnel waits for drain reports: report every write at once.
    urgent: Cell<bool>,
    /// Payload bytes written to / read from the destination (accounting:
    /// plain additions, reported once when the endpoint ends).
    to_destination: Cell<u64>,
    from_destination: Cell<u64>,
    opened: Instant,
    /// The dial's address (`None`: a reverse connection).
    destination: Option<Arc<str>>,
    /// Reports the endpoint closed when the last task drops it.
    _open: EndpointGuard,
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        if self.connect_id > 0 {
            let open = konn_core::io::clock::now().saturating_duration_since(self.opened);
            self._open.0.endpoint_ended(
                self.to_destination.get(),
                self.from_destination.get(),
                open,
            );
        }
    }
}

impl Endpoint {
    fn close(&self) {
        self.closing.set(true);
        self.stop_reader.notify();
        self.wake_writer.notify();
    }

    fn abort(&self) {
        self.aborted.set(true);
        self.queue.borrow_mut().clear();
        self.close();
        self.abort.notify();
    }

    fn new(
        connect_id: i64,
        destination: Option<Arc<str>>,
        observer: Rc<dyn TunnelObserver>,
    ) -> Self {
        Self {
            connect_id,
            queue: RefCell::new(VecDeque::new()),
            wake_writer: Notify::new(),
            closing: Cell::new(false),
            stop_reader: Notify::new(),
            abort: Notify::new(),
            aborted: Cell::new(false),
            read_paused: Cell::new(false),
            resume: Notify::new(),
            drained: Cell::new(0),
            drained_at: Cell::new(None),
            urgent: Cell::new(false),
            to_destination: Cell::new(0),
            from_destination: Cell::new(0),
            opened: konn_core::io::clock::now(),
            destination,
            _open: EndpointGuard::new(observer, connect_id < 0),
        }
    }
}

/// The tunnel's connection handler.
pub struct TunnelHandler {
    tunnel: Tunnel,
    ctx: Rc<Ctx>,
    endpoints: IdMap<i64, Rc<Endpoint>>,
    dials: IdMap<i64, Dialing>,
    /// Accepted connections waiting for their reverse dial's answer.
    reverse_waiting: IdMap<i64, monoio::net::TcpStream>,
    report: Box<dyn FnMut(TunnelEvent)>,
    connected: bool,
    counters: TunnelCounters,
    /// The stuck watch runs (from the first endpoint on).
    watching: bool,
    /// `konn-resume`: where this worker's broken tunnels wait.
    parking: Option<Rc<ParkingLot>>,
    /// The server's `serverid`, and this tunnel's resume token.
    server_id: String,
    token: Option<ResumeToken>,
    /// The connection was lost (not ended by either side): park on close.
    lost: bool,
    /// Never park: closed from this side, or the server sent GOAWAY.
    no_park: bool,
    /// Parked now, with this many endpoints.
    parked: Option<usize>,
}

/// A parked tunnel's state, handed to the connection that resumes it.
struct Handover {
    tunnel: Tunnel,
    ctx: Rc<Ctx>,
    endpoints: IdMap<i64, Rc<Endpoint>>,
    counters: TunnelCounters,
    watching: bool,
    connections: usize,
}

type Handle = ConnHandle<Grpc, TunnelHandler>;

/// A destination dial in flight.
struct Dialing {
    /// Notified by DIAL_CLS.
    cancel: Rc<Notify>,
    address: Arc<str>,
    started: Instant,
}

impl TunnelHandler {
    /// A handler reporting lifecycle events to `report`.
    pub fn new(
        settings: TunnelSettings,
        pool: BufPool,
        report: Box<dyn FnMut(TunnelEvent)>,
    ) -> Self {
        Self::with_observer(settings, pool, report, Rc::new(Unobserved))
    }

    /// A handler reporting lifecycle events to `report` and its traffic to
    /// `observer`.
    pub fn with_observer(
        settings: TunnelSettings,
        pool: BufPool,
        report: Box<dyn FnMut(TunnelEvent)>,
        observer: Rc<dyn TunnelObserver>,
    ) -> Self {
        Self {
            tunnel: Tunnel::new(settings.tunnel),
            ctx: Rc::new(Ctx {
                me: RefCell::new(WeakConnHandle::default()),
                stream: Cell::new(0),
                writable: Broadcast::new(),
                pool,
                settings,
                observer,
                closed: Cell::new(false),
                wake_watch: Notify::new(),
                server_id: RefCell::new(None),
                armed: Cell::new(None),
            }),
            endpoints: IdMap::default(),
            dials: IdMap::default(),
            reverse_waiting: IdMap::default(),
            report,
            connected: false,
            counters: TunnelCounters::default(),
            watching: false,
            parking: None,
            server_id: String::new(),
            token: None,
            lost: false,
            no_park: false,
            parked: None,
        }
    }

    /// Park this tunnel in `lot` when its connection breaks, and resume
    /// the tunnels parked there (`konn-resume`, docs/design/resume.md;
    /// needs a non-zero `resume_window`).
    pub fn set_parking(&mut self, lot: Rc<ParkingLot>) {
        self.parking = Some(lot);
    }

    /// Adds the resume tokens of the tunnels parked in this handler's lot
    /// to the Connect call's `metadata` (one `konn-resume-token` value
    /// each, addressed to its server).
    pub fn offer_tokens(&self, metadata: &mut Headers) {
        if let Some(lot) = &self.parking {
            for value in lot.presented() {
                metadata.push_sensitive(
                    Bytes::from_static(konn_protocol::resume::RESUME_TOKEN_METADATA.as_bytes()),
                    Bytes::from(value),
                );
            }
        }
    }

    /// Open the `/AgentService/Connect` call on `handle`'s connection with
    /// the agent's request `metadata` (agentid, agentidentifiers,
    /// authorization).
    pub fn start(
        handle: &Handle,
        authority: Bytes,
        metadata: &Headers,
    ) -> Result<(), konn_core::Error> {
        let weak = handle.downgrade();
        handle.with(|g, h| {
            let id = g.start_call(
                "https",
                authority,
                Bytes::from_static(b"/AgentService/Connect"),
                metadata,
            )?;
            h.ctx.stream.set(id);
            *h.ctx.me.borrow_mut() = weak;
            Ok(())
        })?
    }

    /// Counters.
    pub fn counters(&self) -> TunnelCounters {
        TunnelCounters {
            open_endpoints: self.endpoints.len(),
            ..self.counters
        }
    }

    /// This tunnel's open endpoints and dials in flight at `now`, for
    /// `/debug/connections` (worker `worker`). Not for the packet path.
    pub fn connections(&self, worker: usize, now: Instant, out: &mut Vec<EndpointInfo>) {
        let server = self.ctx.server_id.borrow().clone();
        let open = self.endpoints.values().filter_map(|ep| {
            Some(EndpointInfo {
                worker,
                server: server.clone(),
                connection_id: ep.connect_id,
                destination: ep.destination.clone()?,
                started: ep.opened,
                bytes_to_destination: ep.to_destination.get(),
                bytes_from_destination: ep.from_destination.get(),
                flow: self.tunnel.endpoint_flow(ep.connect_id, now),
                at: now,
            })
        });
        let dialing = self.dials.iter().map(|(&id, d)| EndpointInfo {
            worker,
            server: server.clone(),
            connection_id: id,
            destination: d.address.clone(),
            started: d.started,
            bytes_to_destination: 0,
            bytes_from_destination: 0,
            flow: None,
            at: now,
        });
        out.extend(open.chain(dialing));
    }

    /// Whether this tunnel carries reverse dials (the server agreed).
    pub fn reverse_ready(&self) -> bool {
        self.tunnel.reverse()
    }

    /// A connection accepted on a `--target` listener: ask the server to
    /// dial `destination` for it (identified by `random`). Returns the
    /// stream back when this tunnel cannot ask (extension not agreed, id in
    /// use, endpoint limit).
    pub fn reverse_accept(
        &mut self,
        grpc: &mut Grpc,
        stream: monoio::net::TcpStream,
        destination: &str,
        random: i64,
    ) -> Result<(), monoio::net::TcpStream> {
        if !self.tunnel.reverse_open(random, destination) {
            return Err(stream);
        }
        self.reverse_waiting.insert(random, stream);
        self.apply(grpc);
        Ok(())
    }

    /// Send DRAIN to the server (first shutdown signal).
    pub fn drain(&mut self, grpc: &mut Grpc) {
        self.tunnel.drain();
        self.apply(grpc);
    }

    /// Close the tunnel from this side: cancel the Connect call and shut
    /// the connection down (a duplicate server, a server that does not
    /// answer in time, the agent stopping). Endpoints are closed when the
    /// connection ends ([`TunnelEvent::Closed`] follows).
    pub fn close(&mut self, grpc: &mut Grpc) {
        self.no_park = true;
        grpc.cancel(self.ctx.stream.get());
        grpc.conn_mut().shutdown();
    }

    /// Perform the state machine's actions.
    fn apply(&mut self, grpc: &mut Grpc) {
        while let Some(action) = self.tunnel.poll_action() {
            match action {
                Action::ToServer(p) => {
                    match p {
                        Packet::Pause { connect_id } => tracing::debug!(
                            connection_id = connect_id,
                            "endpoint queue above its high-water mark; sending PAUSE"
                        ),
                        Packet::Resume { connect_id } => tracing::debug!(
                            connection_id = connect_id,
                            "endpoint queue drained; sending RESUME"
                        ),
                        _ => {}
                    }
                    self.ctx.observer.sent(p.ty());
                    let mut b = BytesMut::with_capacity(p.encoded_len() + 5);
                    p.encode_grpc(&mut b);
                    let _ = grpc.send_framed(self.ctx.stream.get(), b.freeze());
                }
                Action::Release(n) => grpc.release(self.ctx.stream.get(), n),
                Action::Write { connect_id, data } => {
                    let Some(ep) = self.endpoints.get(&connect_id) else {
                        continue;
                    };
                    let mut q = ep.queue.borrow_mut();
                    q.push_back(data);
                    let at_limit = q.len() == self.ctx.settings.endpoint_queue;
                    drop(q);
                    if at_limit && self.ctx.settings.warn_on_queue_limit {
                        tracing::debug!(
                            connection_id = connect_id,
                            "data queue of an endpoint is full"
                        );
                    }
                    ep.wake_writer.notify();
                }
                Action::Close { connect_id } => {
                    if let Some(ep) = self.endpoints.remove(&connect_id) {
                        tracing::debug!(connection_id = connect_id, "closing endpoint connection");
                        ep.close();
                    }
                }
                Action::Abort { connect_id } => {
                    if let Some(ep) = self.endpoints.remove(&connect_id) {
                        tracing::info!(
                            connection_id = connect_id,
                            "destination stopped reading; closing its connection"
                        );
                        ep.abort();
                    }
                }
                Action::PauseRead { connect_id } => {
                    if let Some(ep) = self.endpoints.get(&connect_id) {
                        tracing::debug!(connection_id = connect_id, "PAUSE: endpoint not read");
                        ep.read_paused.set(true);
                    }
                }
                Action::ResumeRead { connect_id } => {
                    if let Some(ep) = self.endpoints.get(&connect_id) {
                        tracing::debug!(connection_id = connect_id, "RESUME: endpoint read again");
                        ep.read_paused.set(false);
                        ep.resume.notify();
                    }
                }
                Action::Dial {
                    connect_id,
                    address,
                } => {
                    tracing::debug!(
                        connection_id = connect_id,
                        address = address.as_str(),
                        "dialing"
                    );
                    let cancel = Rc::new(Notify::new());
                    let address: Arc<str> = Arc::from(&*address);
                    let dialing = Dialing {
                        cancel: cancel.clone(),
                        address: address.clone(),
                        started: konn_core::io::clock::now(),
                    };
                    self.dials.insert(connect_id, dialing);
                    monoio::spawn(dial(self.ctx.clone(), connect_id, address, cancel));
                }
                Action::CancelDial { connect_id } => {
                    if let Some(d) = self.dials.remove(&connect_id) {
                        tracing::debug!(connection_id = connect_id, "dial cancelled (DIAL_CLS)");
                        d.cancel.notify();
                    }
                }
                Action::DialFailed(why) => {
                    self.ctx.observer.dial_failed(why);
                    self.counters.dial_failures[usize::from(why == DialFailure::Unknown)] += 1;
                }
                Action::DialSucceeded => self.counters.dials += 1,
                Action::ReverseEstablished { random, connect_id } => {
                    let Some(stream) = self.reverse_waiting.remove(&random) else {
                        continue;
                    };
                    tracing::debug!(connection_id = connect_id, "reverse connection established");
                    self.ctx.observer.reverse_dialed(true);
                    self.start_endpoint(connect_id, stream, None);
                }
                Action::ReverseFailed { random } => {
                    if self.reverse_waiting.remove(&random).is_some() {
                        tracing::debug!("reverse dial refused by the server");
                        self.ctx.observer.reverse_dialed(false);
                    }
                }
            }
        }
    }

    /// Relay `stream` as endpoint `connect_id` (a dialled destination, or
    /// an accepted reverse connection: no `destination`).
    fn start_endpoint(
        &mut self,
        connect_id: i64,
        stream: monoio::net::TcpStream,
        destination: Option<Arc<str>>,
    ) {
        let ep = Rc::new(Endpoint::new(
            connect_id,
            destination,
            self.ctx.observer.clone(),
        ));
        self.endpoints.insert(connect_id, ep.clone());
        let (rd, wr) = sock::packet_split(stream);
        monoio::spawn(read_endpoint(self.ctx.clone(), ep.clone(), rd));
        monoio::spawn(write_endpoint(self.ctx.clone(), ep, wr));
        if !std::mem::replace(&mut self.watching, true) {
            monoio::spawn(watch_stuck(self.ctx.clone()));
        }
    }

    /// Hand what the writer of `ep` drained to the tunnel, and tell the
    /// writer whether the tunnel waits for its next reports.
    fn report_drained(&mut self, ep: &Endpoint) {
        let n = ep.drained.replace(0);
        if n > 0
            && let Some(at) = ep.drained_at.get()
        {
            self.tunnel.endpoint_drained(ep.connect_id, n, at);
        }
        ep.urgent.set(self.tunnel.waits_for_drain(ep.connect_id));
    }

    /// Close stuck endpoints (a writer saw no progress for the stuck
    /// timeout).
    fn check_stuck(&mut self, grpc: &mut Grpc) {
        let eps: Vec<Rc<Endpoint>> = self.endpoints.values().cloned().collect();
        for ep in eps {
            self.report_drained(&ep);
        }
        self.tunnel.handle_timeout(konn_core::io::clock::now());
        self.apply(grpc);
        self.check_parked(grpc);
    }

    /// ACKs due by time (the watch's turn between two stuck checks).
    fn resume_timers(&mut self, grpc: &mut Grpc) {
        self.tunnel
            .handle_resume_timeout(konn_core::io::clock::now());
        self.apply(grpc);
        self.check_parked(grpc);
    }

    /// A parked tunnel whose window ended is closed.
    fn check_parked(&mut self, grpc: &mut Grpc) {
        if self.parked.is_some() && !self.tunnel.resume_parked() {
            self.unpark(grpc, ResumeResult::Expired);
        }
    }

    /// Whether a lost connection may park this tunnel.
    fn may_park(&self) -> bool {
        self.parking.is_some()
            && !self.no_park
            && self.token.is_some()
            && !self.ctx.settings.resume_window.is_zero()
            && self.tunnel.resume_session().is_some()
            && !self.endpoints.is_empty()
    }

    /// The connection is gone: park the tunnel (endpoints kept, readers
    /// paused, dials cancelled) in the lot. Returns whether it parked.
    fn park(&mut self, grpc: &mut Grpc) -> bool {
        let (Some(lot), Some(token), Some(handle)) =
            (self.parking.clone(), self.token, self.ctx.handle())
        else {
            return false;
        };
        let window = self.ctx.settings.resume_window;
        if !self
            .tunnel
            .tunnel_broken(konn_core::io::clock::now(), window)
        {
            return false;
        }
        self.apply(grpc);
        let n = self.endpoints.len();
        self.parked = Some(n);
        tracing::info!(
            server_id = %self.server_id,
            connections = n,
            ?window,
            "tunnel to the proxy-server broken; its connections wait for a resume"
        );
        self.ctx.observer.tunnel_parked(n);
        (self.report)(TunnelEvent::Parked {
            server_id: self.server_id.clone(),
        });
        let replaced = lot.park(self.server_id.clone(), handle, token);
        if let Some(old) = replaced {
            let _ = old.with(|g, t| t.unpark(g, ResumeResult::Evicted));
        }
        // The watch wakes when the window ends.
        self.poke_watch(konn_core::io::clock::now() + window);
        true
    }

    /// The tunnel's timer task must wake by `at` (a resume timer): wakes
    /// it if it sleeps longer.
    fn poke_watch(&self, at: Instant) {
        if self.ctx.armed.get().is_none_or(|armed| armed > at) {
            self.ctx.armed.set(Some(at));
            self.ctx.wake_watch.notify();
        }
    }

    /// A parked tunnel's parking ends without a resume (`result`): its
    /// endpoints close as on a lost tunnel.
    pub(crate) fn unpark(&mut self, grpc: &mut Grpc, result: ResumeResult) {
        let Some(n) = self.parked.take() else {
            return;
        };
        tracing::info!(
            server_id = %self.server_id,
            connections = self.endpoints.len(),
            ?result,
            "parked tunnel closed without a resume"
        );
        self.shut_everything(grpc);
        self.dials.clear();
        self.ctx.closed.set(true);
        self.ctx.wake_watch.notify();
        self.ctx.observer.park_ended(result, n);
        if let Some(lot) = &self.parking {
            // Ours if still there (the window ended): let go of it.
            drop(lot.take_if(&self.server_id, self.token));
        }
        (self.report)(TunnelEvent::ParkEnded {
            server_id: self.server_id.clone(),
        });
    }

    /// Hands this parked tunnel over to the connection that resumes it.
    fn hand_over(&mut self) -> Option<Handover> {
        let connections = self.parked.take()?;
        Some(Handover {
            tunnel: std::mem::replace(&mut self.tunnel, Tunnel::new(self.ctx.settings.tunnel)),
            ctx: self.ctx.clone(),
            endpoints: std::mem::take(&mut self.endpoints),
            counters: self.counters,
            watching: std::mem::replace(&mut self.watching, false),
            connections,
        })
    }

    /// The server resumed the tunnel parked for it: take it over (its
    /// tasks move to this connection), announce and replay.
    fn adopt(&mut self, grpc: &mut Grpc, h: Handover) {
        *h.ctx.me.borrow_mut() = self.ctx.me.borrow().clone();
        h.ctx.stream.set(self.ctx.stream.get());
        let (flow_control, reverse) = (self.tunnel.flow_control(), self.tunnel.reverse());
        self.ctx = h.ctx;
        self.tunnel = h.tunnel;
        self.endpoints = h.endpoints;
        self.counters = h.counters;
        self.watching = h.watching;
        self.tunnel.set_flow_control(flow_control);
        self.tunnel.set_reverse(reverse);
        tracing::info!(
            server_id = %self.server_id,
            connections = self.endpoints.len(),
            "tunnel resumed"
        );
        self.tunnel.tunnel_resumed();
        self.apply(grpc);
        self.ctx
            .observer
            .park_ended(ResumeResult::Resumed, h.connections);
        // Readers waiting for the dead stream's queue look again.
        self.ctx.writable.notify_all();
    }

    /// The response headers of a tunnel that negotiated resume: a tunnel
    /// parked for this server is resumed (`resumed`) or, when the server
    /// has nothing to resume (it restarted, or the window ended there),
    /// closed now. Returns whether a parked tunnel was resumed.
    fn resume_parked(&mut self, grpc: &mut Grpc, resumed: bool) -> bool {
        let parked = self
            .parking
            .as_ref()
            .and_then(|lot| lot.take(&self.server_id));
        let handover = match parked {
            Some(handle) if resumed => handle.with(|_, old| old.hand_over()).ok().flatten(),
            Some(handle) => {
                tracing::info!(
                    server_id = %self.server_id,
                    "the proxy-server has nothing to resume (restarted?); closing the parked connections"
                );
                let _ = handle.with(|g, old| old.unpark(g, ResumeResult::Refused));
                None
            }
            None => None,
        };
        match handover {
            Some(h) => {
                self.adopt(grpc, h);
                true
            }
            // Resumed by a server for a tunnel this agent no longer has:
            // an empty announcement lets it close what it kept.
            None if resumed => {
                self.tunnel.tunnel_resumed();
                self.apply(grpc);
                false
            }
            None => false,
        }
    }

    /// Close every endpoint and abandon every dial (the tunnel is gone).
    fn shut_everything(&mut self, grpc: &mut Grpc) {
        self.tunnel.tunnel_gone();
        while let Some(a) = self.tunnel.poll_action() {
            match a {
                Action::Close { connect_id } | Action::Abort { connect_id } => {
                    if let Some(ep) = self.endpoints.remove(&connect_id) {
                        ep.close();
                    }
                }
                Action::CancelDial { connect_id } => {
                    if let Some(d) = self.dials.remove(&connect_id) {
                        d.cancel.notify();
                    }
                }
                Action::Release(n) => grpc.release(self.ctx.stream.get(), n),
                Action::ReverseFailed { random }
                    if self.reverse_waiting.remove(&random).is_some() =>
                {
                    self.ctx.observer.reverse_dialed(false);
                }
                _ => {}
            }
        }
        self.reverse_waiting.clear();
        for (_, ep) in self.endpoints.drain() {
            ep.close();
        }
        // Paused readers re-check and see `closing`.
        self.ctx.writable.notify_all();
    }
}

impl Handler<Grpc> for TunnelHandler {
    fn on_event(&mut self, grpc: &mut Grpc, event: GrpcEvent) {
        match event {
            GrpcEvent::ResponseHeaders { metadata, .. } => {
                let ids: Vec<_> = metadata.get_all(b"serverid").collect();
                let counts: Vec<_> = metadata.get_all(b"servercount").collect();
                let parsed = match (ids.as_slice(), counts.as_slice()) {
                    ([id], [count]) => std::str::from_utf8(count)
                        .ok()
                        .and_then(|c| c.parse::<usize>().ok())
                        .map(|c| (String::from_utf8_lossy(id).into_owned(), c)),
                    _ => None,
                };
                match parsed {
                    Some((server_id, server_count)) => {
                        self.connected = true;
                        *self.ctx.server_id.borrow_mut() = Some(Arc::from(server_id.as_str()));
                        let agreed = self.ctx.settings.flow_control
                            && metadata
                                .get(FLOW_CONTROL_KEY.as_bytes())
                                .is_some_and(|v| v == "1");
                        self.tunnel.set_flow_control(agreed);
                        let reverse = self.ctx.settings.reverse
                            && metadata
                                .get(REVERSE_KEY.as_bytes())
                                .is_some_and(|v| v == "1");
                        self.tunnel.set_reverse(reverse);
                        let resume = !self.ctx.settings.resume_window.is_zero()
                            && metadata
                                .get(konn_protocol::resume::RESUME_METADATA.as_bytes())
                                .is_some_and(|v| v == konn_protocol::resume::RESUME_VERSION);
                        let q = self.ctx.settings.tunnel.flow.high.saturating_mul(2);
                        self.tunnel.set_resume(
                            resume.then(|| konn_protocol::resume::ResumeLimits::from_queue_size(q)),
                        );
                        self.server_id.clone_from(&server_id);
                        self.token = resume
                            .then(|| {
                                metadata
                                    .get(konn_protocol::resume::RESUME_TOKEN_METADATA.as_bytes())
                                    .and_then(|v| ResumeToken::parse(v))
                            })
                            .flatten();
                        let resumed = resume
                            && metadata
                                .get(konn_protocol::resume::RESUMED_METADATA.as_bytes())
                                .is_some_and(|v| v == "1");
                        if self.ctx.settings.reverse && !reverse {
                            tracing::info!(
                                server_id = %server_id,
                                "this proxy-server does not offer node-to-control-plane connections (konn-reverse); --target connections will not use its tunnel"
                            );
                        }
                        tracing::debug!(
                            flow_control = agreed,
                            reverse,
                            resume,
                            "tunnel accepted by the server"
                        );
                        let resumed = resume && self.resume_parked(grpc, resumed);
                        (self.report)(TunnelEvent::Connected {
                            server_id,
                            server_count,
                            reverse,
                            resume,
                            resumed,
                        });
                    }
                    None => {
                        let why = format!(
                            "expected one server ID and one server count in the response headers, got {} and {}",
                            ids.len(),
                            counts.len()
                        );
                        (self.report)(TunnelEvent::Rejected(why));
                        grpc.cancel(self.ctx.stream.get());
                        grpc.conn_mut().shutdown();
                    }
                }
            }
            GrpcEvent::Message { id, msg, flow, .. } => match Packet::decode(&msg) {
                Ok(p) => {
                    self.ctx.observer.received(p.ty());
                    // The endpoint's batched drain reports go first, so the
                    // tunnel judges its queue as it is now.
                    let ep = match &p {
                        Packet::Data { connect_id, .. } => self.endpoints.get(connect_id).cloned(),
                        _ => None,
                    };
                    if let Some(ep) = &ep {
                        self.report_drained(ep);
                    }
                    // The tunnel says when the credit goes back
                    // (Action::Release).
                    let now = konn_core::io::clock::now();
                    self.tunnel.server_packet(now, p, flow);
                    self.apply(grpc);
                    // An ACK owed by time: the watch must wake for it.
                    if self.watching
                        && let Some(s) = self.tunnel.resume_session()
                        && s.ack_timer_pending()
                    {
                        self.poke_watch(now + s.limits().ack_delay);
                    }
                    if let Some(ep) = ep {
                        ep.urgent.set(self.tunnel.waits_for_drain(ep.connect_id));
                    }
                }
                Err(e) => {
                    tracing::debug!(error = %e, "ignoring an undecodable packet from the server");
                    grpc.release(id, flow);
                }
            },
            GrpcEvent::Writable { .. } => self.ctx.writable.notify_all(),
            GrpcEvent::Finished {
                status, message, ..
            } => {
                if !self.connected {
                    (self.report)(TunnelEvent::Rejected(format!("{status}: {message}")));
                } else if status != GrpcStatus::OK {
                    self.ctx.observer.stream_error(status);
                    tracing::info!(%status, %message, "tunnel closed by the server");
                }
                // Lost with its connection, not ended by the server: the
                // tunnel may park when the connection closes.
                if self.connected && grpc.conn().error().is_some() && self.may_park() {
                    self.lost = true;
                    return;
                }
                self.shut_everything(grpc);
                grpc.conn_mut().shutdown();
            }
            GrpcEvent::GoAway { .. } => {
                // The server is going away (shutting down): nothing of
                // this tunnel will be resumable there.
                self.no_park = true;
            }
            GrpcEvent::Call { .. } | GrpcEvent::HalfClose { .. } => {}
        }
    }

    fn on_close(&mut self, grpc: &mut Grpc, error: Option<&konn_core::Error>) {
        if let Some(e) = error {
            tracing::info!(error = %e, "tunnel connection ended");
        }
        if self.lost && self.park(grpc) {
            (self.report)(TunnelEvent::Closed);
            return;
        }
        self.shut_everything(grpc);
        self.dials.clear();
        self.ctx.closed.set(true);
        self.ctx.wake_watch.notify();
        (self.report)(TunnelEvent::Closed);
    }
}

/// Dial a destination and, on success, start relaying it.
async fn dial(ctx: Rc<Ctx>, connect_id: i64, address: Arc<str>, cancel: Rc<Notify>) {
    let started = konn_core::io::clock::now();
    let allowed = &ctx.settings.allowed;
    let attempt = async {
        if allowed.allows_all() {
            dial_tcp(&address, ctx.settings.dial_timeout)
                .await
                .map_err(DialOutcome::Failed)
        } else {
            crate::allow::dial(&address, ctx.settings.dial_timeout, allowed).await
        }
    };
    let result = race(attempt, cancel.notified()).await;
    let Some(handle) = ctx.handle() else { return };
    let result = match result {
        Either::Left(r) => r,
        Either::Right(()) => return, // DIAL_CLS
    };
    let _ = handle.with(|g, h| {
        h.dials.remove(&connect_id);
        match result {
            Ok(stream) => {
                if !h.tunnel.dial_succeeded(connect_id) {
                    return; // cancelled meanwhile; the socket drops
                }
                let elapsed = konn_core::io::clock::now().saturating_duration_since(started);
                tracing::debug!(connection_id = connect_id, address = &*address, elapsed = %GoDuration(elapsed), "dial succeeded");
                ctx.observer.dial_succeeded(elapsed);
                // DIAL_RSP is queued before any DATA the reader produces.
                h.apply(g);
                h.start_endpoint(connect_id, stream, Some(address));
            }
            Err(e) => {
                let error = e.error_text(&address);
                tracing::debug!(connection_id = connect_id, address = &*address, %error, "dial failed");
                let why = match e {
                    DialOutcome::Failed(DialError::Timeout) => DialFailure::Timeout,
                    DialOutcome::NotAllowed => {
                        ctx.observer
                            .dial_refused(Refusal::DestinationNotAllowed, &address);
                        DialFailure::Unknown
                    }
                    DialOutcome::Failed(_) => DialFailure::Unknown,
                };
                h.tunnel.dial_failed(connect_id, error, why);
                h.apply(g);
            }
        }
    });
}

/// The tunnel's one timer: every tick it hands the writers' drain reports
/// to the tunnel, which closes the endpoints that drained nothing for the
/// stuck timeout; between ticks it wakes for the tunnel's resume timers
/// (ACKs due by time, a parked tunnel's window), which the handler pokes
/// it for when one comes sooner than it sleeps. One timer per tunnel
/// instead of one per write keeps the timer wheel off the data path and
/// an idle endpoint's writer small. Ends with the tunnel.
async fn watch_stuck(ctx: Rc<Ctx>) {
    let tick = stuck_tick(ctx.settings.stuck_timeout());
    let mut next_tick = konn_core::io::clock::now() + tick;
    // The resume timers' next deadline, as last seen (the handler lowers
    // `armed` when one comes sooner, then wakes this task).
    let mut resume_at: Option<Instant> = None;
    while !ctx.closed.get() {
        let wake_at = resume_at.map_or(next_tick, |r| r.min(next_tick));
        ctx.armed.set(Some(wake_at));
        let wait = wake_at.saturating_duration_since(konn_core::io::clock::now());
        if let Either::Right(()) = race(monoio::time::sleep(wait), ctx.wake_watch.notified()).await
        {
            resume_at = ctx.armed.get();
            continue;
        }
        let Some(h) = ctx.handle() else { return };
        let now = konn_core::io::clock::now();
        let stuck = now >= next_tick;
        if stuck {
            next_tick = now + tick;
        }
        resume_at = h
            .with(|g, t| {
                if stuck {
                    t.check_stuck(g);
                } else {
                    t.resume_timers(g);
                }
                t.tunnel.resume_poll_timeout()
            })
            .ok()
            .flatten();
    }
}

/// How often the stuck watch looks: a quarter of the stuck timeout, at
/// least every second and at most every 10 ms. An endpoint is closed
/// within one tick after its stuck timeout.
fn stuck_tick(stuck_timeout: Duration) -> Duration {
    (stuck_timeout / 4).clamp(Duration::from_millis(10), Duration::from_secs(1))
}

/// Destination → tunnel.
async fn read_endpoint(ctx: Rc<Ctx>, ep: Rc<Endpoint>, mut rd: PacketRead) {
    loop {
        if ep.closing.get() {
            return;
        }
        // Paused by the server (PAUSE) until RESUME.
        if ep.read_paused.get() {
            race(ep.resume.notified(), ep.stop_reader.notified()).await;
            continue;
        }
        let Some(handle) = ctx.handle() else { return };
        // The stream of the connection the tunnel runs on now.
        let stream = ctx.stream.get();
        // Pause while the tunnel is backed up.
        let backed_up = handle
            .with(|g, _| {
                let high = g.queued_bytes(stream) >= ctx.settings.tunnel_high_water;
                if high {
                    g.notify_when_drained(stream, ctx.settings.tunnel_low_water);
                }
                high
            })
            .unwrap_or(true);
        drop(handle);
        if backed_up {
            race(ctx.writable.wait(), ep.stop_reader.notified()).await;
            continue;
        }
        // Idle endpoints hold no buffer (see `PacketRead::read`). The
        // memory budget staying used up for the pool's whole deadline ends
        // the connection like a read error.
        let got = match race(rd.read(&ctx.pool), ep.stop_reader.notified()).await {
            Either::Left(got) => got,
            Either::Right(()) => return,
        };
        let (n, mut buf) = match got {
            Ok(Some(buf)) => (buf.len() - HEADROOM, buf),
            // EOF, a read error or no buffer: everything read so far is
            // already queued on the tunnel, so CLOSE_RSP follows it.
            _ => {
                if let Some(h) = ctx.handle() {
                    let _ = h.with(|g, t| {
                        t.tunnel.endpoint_closed(ep.connect_id);
                        t.apply(g);
                    });
                }
                return;
            }
        };
        ep.from_destination
            .set(ep.from_destination.get() + n as u64);
        let hl = packet::data_header_len(ep.connect_id, n);
        let start = HEADROOM - hl;
        packet::encode_data_header(ep.connect_id, n, &mut &mut buf[start..HEADROOM]);
        let framed = buf.freeze().slice(start..HEADROOM + n);
        if ep.connect_id < 0 {
            ctx.observer.reverse_bytes(true, n);
        }
        let Some(handle) = ctx.handle() else { return };
        // konn-resume keeps the payload (a refcount, no copy) for replay.
        let sent = handle.with(|g, t| {
            let sent = t
                .tunnel
                .data_sent(
                    konn_core::io::clock::now(),
                    ep.connect_id,
                    &framed.slice(hl..),
                )
                .then(|| g.send_framed(t.ctx.stream.get(), framed));
            // An ACK the connection owed rides with the DATA.
            t.apply(g);
            sent
        });
        if let Ok(Some(Ok(()))) = sent {
            ctx.observer.sent(PacketType::Data);
        }
    }
}

/// Tunnel → destination. Every write's progress goes to the tunnel (see
/// the module docs); an endpoint that makes no progress is aborted by the
/// tunnel's stuck watch ([`watch_stuck`]), which ends this task.
async fn write_endpoint(ctx: Rc<Ctx>, ep: Rc<Endpoint>, mut wr: PacketWrite) {
    'queue: loop {
        let next = ep.queue.borrow_mut().pop_front();
        let Some(mut data) = next else {
            if ep.closing.get() {
                break;
            }
            ep.wake_writer.notified().await;
            continue;
        };
        while !data.is_empty() {
            // A destination that stops reading blocks this write; the
            // tunnel's stuck watch aborts the endpoint, which ends it.
            // The packets queued behind `data` go with it in one gathered
            // send.
            let written = match race(wr.write_queued(&data, &ep.queue), ep.abort.notified()).await {
                Either::Left(r) => r,
                Either::Right(()) => break 'queue,
            };
            match written {
                Ok(n) if n > 0 => {
                    let mut left = n - n.min(data.len());
                    data.advance(n.min(data.len()));
                    while left > 0 {
                        let Some(mut next) = ep.queue.borrow_mut().pop_front() else {
                            break;
                        };
                        let k = left.min(next.len());
                        next.advance(k);
                        left -= k;
                        data = next;
                    }
                    if ep.connect_id < 0 {
                        ep._open.0.reverse_bytes(false, n);
                    }
                    ep.to_destination.set(ep.to_destination.get() + n as u64);
                    ep.drained.set(ep.drained.get() + n);
                    ep.drained_at.set(Some(konn_core::io::clock::now()));
                    if ep.urgent.get()
                        && let Some(h) = ctx.handle()
                    {
                        let _ = h.with(|g, t| {
                            t.report_drained(&ep);
                            t.apply(g);
                        });
                    }
                }
                _ => {
                    // The destination is gone: tell the server.
                    if let Some(h) = ctx.handle() {
                        let _ = h.with(|g, t| {
                            t.tunnel.endpoint_closed(ep.connect_id);
                            t.apply(g);
                        });
                    }
                    ep.abort();
                    break 'queue;
                }
            }
        }
    }
    if !ep.aborted.get() {
        // Boxed: a timer in the task's state would size it for its whole
        // life; this runs once, at the end.
        let _ = Box::pin(monoio::time::timeout(Duration::from_secs(1), wr.close())).await;
    }
}
