//! The HTTP/2 connection state machine. See the module docs of
//! [`crate::h2`] for the call protocol. This file holds the connection's
//! state, construction and accessors, application commands, timers and
//! the helpers every part uses; the rest is split by direction:
//! `input` (frame dispatch and the connection-level frames), `streams`
//! (HEADERS, CONTINUATION and DATA from the peer) and `output`
//! (`poll_transmit`: preface, control frames, stream frames).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use konn_frames::Reason;
use konn_frames::h2::{self as wire, Settings};
use konn_frames::hpack;

use super::flow::{Bdp, DEFAULT_WINDOW, RecvWindow, SendWindow};
use super::headers::Headers;
use super::limits::TokenBucket;
use super::stream::{Closed, ClosedRing, SendItem, State, Stream, StreamMap};
use super::{Config, Event, Role};
use crate::Error;

mod input;
// `Connection::check_invariants` (for the fuzz targets and the sim).
mod invariants;
mod output;
pub use output::{MAX_VECTORED, Payloads, VECTORED_MIN};
mod streams;

/// PING payload of keepalive probes.
const KEEPALIVE_PING: [u8; 8] = *b"konn-ka\0";
/// PING payload that ends phase one of a graceful GOAWAY.
const GOAWAY_PING: [u8; 8] = *b"konn-ga\0";
/// Highest stream id (RFC 9113 §5.1.1).
const MAX_STREAM_ID: u32 = (1 << 31) - 1;
/// How long a graceful shutdown waits for the PING that ends its first
/// phase before sending the final GOAWAY anyway (grpc-go: 5 s), so a peer
/// that never answers cannot keep a draining connection open.
const DRAIN_PING_TIMEOUT: Duration = Duration::from_secs(5);
/// GOAWAY debug data of an idle close (grpc-go's text for `MaxConnectionIdle`).
const IDLE_DEBUG: &[u8] = b"max_idle";
/// GOAWAY debug data when the preface deadline passes.
const PREFACE_TIMEOUT_DEBUG: &str = "no HTTP/2 preface and SETTINGS before the preface timeout";

/// Counters for metrics and leak checks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Streams in the table (open, or closed but still held by the app).
    pub streams: usize,
    /// Streams we reset because of the peer's frames.
    pub local_resets: u64,
    /// Streams the peer reset.
    pub remote_resets: u64,
    /// PINGs received.
    pub pings_received: u64,
    /// Frames received.
    pub frames_received: u64,
}

/// Why the connection failed (kept `Copy` so every later call can report it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fail {
    /// We found a connection error and sent GOAWAY.
    Local { reason: Reason, what: &'static str },
    /// Undecodable bytes from the peer; GOAWAY sent.
    Frame(konn_frames::Error),
    /// The peer sent GOAWAY with an error code.
    Remote(Reason),
    /// A keepalive PING went unanswered.
    Keepalive,
    /// The socket closed under us.
    Lost,
}

impl Fail {
    fn to_error(self) -> Error {
        match self {
            Self::Local { reason, what } => Error::H2Local { reason, what },
            Self::Frame(e) => Error::Frame(e),
            Self::Remote(reason) => Error::H2Remote { reason },
            Self::Keepalive => Error::KeepaliveTimeout,
            Self::Lost => Error::ConnectionClosed,
        }
    }

    /// The GOAWAY code we send for it, if we send one.
    fn goaway_reason(self) -> Option<Reason> {
        match self {
            Self::Local { reason, .. } => Some(reason),
            Self::Frame(e) => Some(e.h2().map_or(Reason::PROTOCOL_ERROR, |(r, _)| r)),
            Self::Remote(_) | Self::Keepalive | Self::Lost => None,
        }
    }
}

/// A control frame waiting to be written.
#[derive(Debug)]
enum Control {
    SettingsAck,
    /// A SETTINGS frame changing our INITIAL_WINDOW_SIZE (BDP growth).
    InitialWindow(u32),
    Ping {
        ack: bool,
        payload: [u8; 8],
    },
    Rst {
        id: u32,
        reason: Reason,
    },
    WindowUpdate {
        id: u32,
        inc: u32,
    },
    GoAway {
        last: u32,
        reason: Reason,
        debug: Bytes,
    },
}

/// A header block being assembled from HEADERS + CONTINUATION frames.
#[derive(Debug)]
struct PartialBlock {
    id: u32,
    end_stream: bool,
    /// The stream must be reset after decoding (self-dependency).
    reset: Option<Reason>,
    buf: BytesMut,
    continuations: u32,
}

/// Graceful shutdown progress (grpc-go's two-phase GOAWAY).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Drain {
    None,
    /// GOAWAY(2^31-1) and a PING sent; waiting for the ACK.
    AwaitingPing,
    /// Final GOAWAY sent; closing once streams finish.
    Final,
}

/// Keepalive and ping-enforcement state.
#[derive(Debug)]
struct Pings {
    last_recv: Instant,
    /// Deadline of an outstanding keepalive PING.
    ka_deadline: Option<Instant>,
    strikes: u32,
    last_peer_ping: Option<Instant>,
    /// We sent HEADERS/DATA since the last peer PING (grpc-go resets strikes).
    reset_strikes: bool,
}

/// One HTTP/2 connection. See the module docs for how to drive it.
#[derive(Debug)]
pub struct Connection {
    /// Shared by the connections of one listener: 184 bytes each would be
    /// a tenth of an idle tunnelled connection (docs/BENCHMARKS.md, S5).
    cfg: Arc<Config>,
    /// What we advertise.
    pub(super) local: Settings,
    /// What the peer advertised.
    remote: Settings,
    preface_received: bool,
    settings_received: bool,
    preface_sent: bool,
    decoder: hpack::Decoder,
    encoder: hpack::Encoder,
    streams: StreamMap,
    closed: ClosedRing,
    /// Next id for a stream we open.
    pub(super) next_local_id: u32,
    /// Highest peer-initiated id seen.
    last_remote_id: u32,
    /// Peer-initiated streams counting against our MAX_CONCURRENT_STREAMS.
    remote_active: usize,
    /// Streams we opened that are not closed.
    local_active: usize,
    conn_recv: RecvWindow,
    conn_send: SendWindow,
    /// Boxed: rare (a header block split over CONTINUATION frames).
    block: Option<Box<PartialBlock>>,
    control: VecDeque<Control>,
    /// Streams with something to send.
    ready: VecDeque<u32>,
    events: VecDeque<Event>,
    pings: Pings,
    /// Boxed: only with `Config::bdp_limit` (off in konn's binaries).
    bdp: Option<Box<Bdp>>,
    empty_frames: u32,
    remote_resets: TokenBucket,
    local_resets: TokenBucket,
    drain: Drain,
    /// Last stream id in the GOAWAY we sent.
    goaway_sent: Option<u32>,
    /// Last stream id in the GOAWAY we received.
    goaway_recv: Option<u32>,
    /// The connection failed; GOAWAY queued or peer gone.
    error: Option<Fail>,
    scratch: BytesMut,
    stats: Stats,
    /// When the connection was created (the preface deadline counts from it).
    created: Instant,
    /// The latest `now` any call brought (stream-table changes made by
    /// commands, which take no time, are stamped with it).
    last_now: Instant,
    /// Since when the stream table has been empty (`None` while a stream
    /// exists): the idle deadline counts from it.
    idle_since: Option<Instant>,
    /// Graceful shutdown: when to stop waiting for the PING ACK.
    drain_deadline: Option<Instant>,
}

impl Connection {
    // ----- construction and accessors -------------------------------------

    /// A new connection in `cfg.role`, created at `now`. A client writes the
    /// preface with its first `poll_transmit`. Pass an `Arc` to share one
    /// configuration between many connections.
    pub fn new(cfg: impl Into<Arc<Config>>, now: Instant) -> Self {
        let cfg: Arc<Config> = cfg.into();
        let local = Settings {
            header_table_size: cfg.header_table_size,
            enable_push: false,
            max_concurrent_streams: Some(cfg.max_concurrent_streams),
            initial_window_size: cfg.stream_window.min(wire::MAX_WINDOW_SIZE),
            max_frame_size: cfg.max_frame_size,
            max_header_list_size: Some(cfg.max_header_list_size),
            enable_connect_protocol: false,
        };
        let decoder = hpack::Decoder::with_limits(
            cfg.header_table_size,
            hpack::DecoderLimits {
                max_header_list_size: cfg.max_header_list_size,
                ..hpack::DecoderLimits::default()
            },
        );
        let next_local_id = match cfg.role {
            Role::Client => 1,
            Role::Server => 2,
        };
        let bdp = cfg.bdp_limit.map(|l| Box::new(Bdp::new(l)));
        let mut encoder = hpack::Encoder::new();
        // Most connections send one header block each way (a dial's
        // response, an agent's Connect): no dynamic table for those.
        encoder.set_index_repeated_only(true);
        Self {
            conn_recv: RecvWindow::new(DEFAULT_WINDOW, cfg.conn_window),
            conn_send: SendWindow::new(DEFAULT_WINDOW),
            closed: ClosedRing::new(cfg.limits.closed_streams_remembered),
            remote_resets: TokenBucket::new(cfg.limits.remote_resets),
            local_resets: TokenBucket::new(cfg.limits.local_resets),
            local,
            remote: Settings::default(),
            preface_received: cfg.role == Role::Client,
            settings_received: false,
            preface_sent: false,
            decoder,
            encoder,
            streams: StreamMap::default(),
            next_local_id,
            last_remote_id: 0,
            remote_active: 0,
            local_active: 0,
            block: None,
            control: VecDeque::new(),
            ready: VecDeque::new(),
            events: VecDeque::new(),
            pings: Pings {
                last_recv: now,
                ka_deadline: None,
                strikes: 0,
                last_peer_ping: None,
                reset_strikes: false,
            },
            bdp,
            empty_frames: 0,
            drain: Drain::None,
            goaway_sent: None,
            goaway_recv: None,
            error: None,
            scratch: BytesMut::new(),
            stats: Stats::default(),
            created: now,
            last_now: now,
            idle_since: Some(now),
            drain_deadline: None,
            cfg,
        }
    }

    /// Override [`Config::preface_timeout`] and [`Config::idle_timeout`]
    /// where a value is given (the driver applies its listener settings).
    /// The shared configuration is copied only when a value differs.
    pub fn set_deadlines(&mut self, preface: Option<Duration>, idle: Option<Duration>) {
        let wanted = (
            preface.or(self.cfg.preface_timeout),
            idle.or(self.cfg.idle_timeout),
        );
        if wanted != (self.cfg.preface_timeout, self.cfg.idle_timeout) {
            let cfg = Arc::make_mut(&mut self.cfg);
            (cfg.preface_timeout, cfg.idle_timeout) = wanted;
        }
    }

    /// Our role.
    pub fn role(&self) -> Role {
        self.cfg.role
    }

    /// The peer's settings as received so far.
    pub fn remote_settings(&self) -> &Settings {
        &self.remote
    }

    /// Our settings as advertised so far (the initial window may have grown
    /// by BDP estimation).
    pub fn local_settings(&self) -> &Settings {
        &self.local
    }

    /// Counters.
    pub fn stats(&self) -> Stats {
        Stats {
            streams: self.streams.len(),
            ..self.stats
        }
    }

    /// The error that ended the connection, if any.
    pub fn error(&self) -> Option<Error> {
        self.error.map(Fail::to_error)
    }

    /// False while so many control replies are queued that reading more
    /// input would only grow the queue (SETTINGS/PING floods). Call
    /// `poll_transmit` and write, then read again.
    pub fn wants_read(&self) -> bool {
        self.error.is_none() && self.control.len() < self.cfg.limits.max_pending_control
    }

    /// Nothing more will be sent or received: close the socket once the
    /// output produced so far has been written.
    pub fn is_closed(&self) -> bool {
        if self.error.is_some() {
            return self.control.is_empty();
        }
        self.drain == Drain::Final && self.streams.is_empty() && self.control.is_empty()
    }

    /// A new stream may be opened now (client role).
    pub fn can_open_stream(&self) -> bool {
        self.cfg.role == Role::Client
            && self.error.is_none()
            && self.goaway_recv.is_none()
            && self.drain == Drain::None
            && self.next_local_id <= MAX_STREAM_ID
            && self
                .remote
                .max_concurrent_streams
                .is_none_or(|m| (self.local_active as u64) < u64::from(m))
    }

    /// Bytes of data queued on a stream and not yet written.
    pub fn queued_bytes(&self, id: u32) -> usize {
        self.streams.get(&id).map_or(0, |s| s.queued)
    }

    // ----- application commands -------------------------------------------

    /// Open a stream with `headers` (client role). Returns its id.
    pub fn open_stream(&mut self, headers: Headers, end_stream: bool) -> Result<u32, Error> {
        if let Some(e) = self.error {
            return Err(e.to_error());
        }
        if self.cfg.role != Role::Client {
            return Err(Error::Usage("only a client opens streams"));
        }
        if self.next_local_id > MAX_STREAM_ID {
            return Err(Error::StreamIdsExhausted);
        }
        if self.goaway_recv.is_some() || self.drain != Drain::None {
            return Err(Error::GoingAway);
        }
        if !self.can_open_stream() {
            return Err(Error::TooManyStreams);
        }
        let id = self.next_local_id;
        self.next_local_id += 2;
        let mut s = Stream::new(
            false,
            RecvWindow::new(
                self.local.initial_window_size,
                self.local.initial_window_size,
            ),
            SendWindow::new(self.remote.initial_window_size),
        );
        s.enqueue(SendItem::Headers {
            headers,
            end_stream,
        });
        self.streams.insert(id, s);
        self.idle_since = None;
        self.local_active += 1;
        self.mark_ready(id);
        Ok(id)
    }

    /// Send the initial headers (response) on a stream the peer opened.
    pub fn send_headers(
        &mut self,
        id: u32,
        headers: Headers,
        end_stream: bool,
    ) -> Result<(), Error> {
        let s = self.sendable(id)?;
        s.enqueue(SendItem::Headers {
            headers,
            end_stream,
        });
        self.mark_ready(id);
        Ok(())
    }

    /// Queue `data` on a stream. It goes out as windows allow; watch
    /// [`Connection::queued_bytes`] to apply back-pressure.
    pub fn send_data(&mut self, id: u32, data: Bytes, end_stream: bool) -> Result<(), Error> {
        let s = self.sendable(id)?;
        s.enqueue(SendItem::Data { data, end_stream });
        self.mark_ready(id);
        Ok(())
    }

    /// Queue trailers; ends our side of the stream.
    pub fn send_trailers(&mut self, id: u32, trailers: Headers) -> Result<(), Error> {
        let s = self.sendable(id)?;
        s.enqueue(SendItem::Trailers(trailers));
        self.mark_ready(id);
        Ok(())
    }

    /// Reset a stream (the application gives up on it). Queued sends are
    /// dropped. Unknown or closed ids are ignored.
    pub fn reset_stream(&mut self, id: u32, reason: Reason) {
        if self
            .streams
            .get(&id)
            .is_some_and(|s| s.state != State::Closed)
        {
            self.push_control(Control::Rst { id, reason });
            self.close_stream(id, Closed::ResetByUs);
        }
    }

    /// The application passed on `n` received data bytes of stream `id`:
    /// return that much credit to the peer (batched into WINDOW_UPDATEs).
    pub fn release_capacity(&mut self, id: u32, n: usize) {
        let n = u32::try_from(n).unwrap_or(u32::MAX);
        if let Some(inc) = self.conn_recv.release(n) {
            self.push_control(Control::WindowUpdate { id: 0, inc });
        }
        if let Some(s) = self.streams.get_mut(&id)
            && s.recv_open()
            && let Some(inc) = s.recv.release(n)
        {
            self.push_control(Control::WindowUpdate { id, inc });
        }
    }

    /// The application is done with a stream the peer opened: it stops
    /// counting against MAX_CONCURRENT_STREAMS once it is also closed on the
    /// wire. If our side has nothing more queued but the stream is still
    /// open, the peer is told to stop with RST_STREAM (`NO_ERROR` when we
    /// already ended our side, as grpc-go does after trailers; `CANCEL`
    /// otherwise).
    pub fn release_stream(&mut self, id: u32) {
        let Some(s) = self.streams.get_mut(&id) else {
            return;
        };
        if !s.app_held {
            return;
        }
        s.app_held = false;
        if s.state != State::Closed && s.queue.is_empty() {
            let reason = if s.state == State::HalfClosedLocal {
                Reason::NO_ERROR
            } else {
                Reason::CANCEL
            };
            self.push_control(Control::Rst { id, reason });
            self.close_stream(id, Closed::ResetByUs);
        } else {
            let was_closed = s.state == State::Closed;
            self.settle(id, was_closed, Closed::Other);
        }
    }

    /// Emit [`Event::Writable`] once the stream's queued data falls to `low`
    /// bytes or less.
    pub fn notify_when_drained(&mut self, id: u32, low: usize) {
        if let Some(s) = self.streams.get_mut(&id) {
            if s.queued <= low {
                self.events.push_back(Event::Writable { id });
            } else {
                s.drain_notify = Some(low);
            }
        }
    }

    /// Start a graceful shutdown: the peer may not open new streams; the
    /// connection closes once existing streams finish. A server first sends
    /// GOAWAY(2^31−1) and a PING, then the final GOAWAY once the PING is
    /// acknowledged, so streams in flight are not refused (grpc-go's drain).
    pub fn shutdown(&mut self) {
        self.shutdown_with(Bytes::new());
    }

    fn shutdown_with(&mut self, debug: Bytes) {
        if self.drain != Drain::None || self.error.is_some() {
            return;
        }
        match self.cfg.role {
            Role::Server => {
                self.push_control(Control::GoAway {
                    last: MAX_STREAM_ID,
                    reason: Reason::NO_ERROR,
                    debug,
                });
                self.push_control(Control::Ping {
                    ack: false,
                    payload: GOAWAY_PING,
                });
                self.drain = Drain::AwaitingPing;
                self.drain_deadline = Some(self.last_now + DRAIN_PING_TIMEOUT);
            }
            Role::Client => {
                self.push_control(Control::GoAway {
                    last: self.last_remote_id,
                    reason: Reason::NO_ERROR,
                    debug,
                });
                self.goaway_sent = Some(self.last_remote_id);
                self.drain = Drain::Final;
            }
        }
    }

    /// Close the connection now with GOAWAY(`reason`, `debug`).
    pub fn abort(&mut self, reason: Reason, debug: &'static str) {
        self.fail(
            Fail::Local {
                reason,
                what: debug,
            },
            Bytes::from_static(debug.as_bytes()),
        );
    }

    /// The socket closed (EOF or error): every open stream is reset with
    /// `CANCEL` (reported as remote) and the connection is finished.
    pub fn connection_lost(&mut self) {
        if self.error.is_some() {
            return;
        }
        let mut open: Vec<u32> = self
            .streams
            .iter()
            .filter(|(_, s)| s.state != State::Closed)
            .map(|(id, _)| *id)
            .collect();
        open.sort_unstable();
        for id in open {
            self.close_stream(id, Closed::Other);
            self.events.push_back(Event::Reset {
                id,
                reason: Reason::CANCEL,
                remote: true,
            });
        }
        self.fail(Fail::Lost, Bytes::new());
    }

    /// Gives back memory the connection holds for bursts it is not in: the
    /// capacity of empty queues (control frames, ready streams, events,
    /// each stream's send queue), scratch buffers, a stream table that
    /// grew. For a connection idle for a while (the driver calls it when
    /// it releases its own idle buffers); whatever is needed again is
    /// allocated again.
    pub fn release_idle(&mut self) {
        fn empty<T>(q: &mut VecDeque<T>) {
            if q.is_empty() {
                *q = VecDeque::new();
            }
        }
        empty(&mut self.control);
        empty(&mut self.ready);
        empty(&mut self.events);
        for s in self.streams.values_mut() {
            empty(&mut s.queue);
        }
        self.streams.shrink();
        if self.scratch.is_empty() {
            self.scratch = BytesMut::new();
        }
        self.decoder.release_scratch();
    }

    /// Events are waiting for [`Connection::poll_event`].
    pub fn has_events(&self) -> bool {
        !self.events.is_empty()
    }

    /// The next event, if any.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    fn sendable(&mut self, id: u32) -> Result<&mut Stream, Error> {
        if let Some(e) = self.error {
            return Err(e.to_error());
        }
        match self.streams.get_mut(&id) {
            Some(s) if s.send_open() => Ok(s),
            Some(_) => Err(Error::StreamClosed(id)),
            None => Err(Error::StreamClosed(id)),
        }
    }

    // ----- timers ---------------------------------------------------------

    /// When [`Connection::handle_timeout`] must be called next.
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.error.is_some() {
            return None;
        }
        let preface = self
            .cfg
            .preface_timeout
            .filter(|_| !self.settings_received)
            .map(|t| self.created + t);
        let idle = match (self.cfg.idle_timeout, self.idle_since) {
            (Some(t), Some(since)) if self.drain == Drain::None => Some(since + t),
            _ => None,
        };
        let drain = self
            .drain_deadline
            .filter(|_| self.drain == Drain::AwaitingPing);
        [preface, idle, drain, self.keepalive_deadline()]
            .into_iter()
            .flatten()
            .min()
    }

    fn keepalive_deadline(&self) -> Option<Instant> {
        if let Some(d) = self.pings.ka_deadline {
            return Some(d);
        }
        let ka = self.cfg.keepalive?;
        if self.streams.is_empty() && !ka.permit_without_stream {
            return None;
        }
        Some(self.pings.last_recv + ka.interval)
    }

    /// Run timers due at `now`: the preface deadline, the idle deadline,
    /// the bound on a graceful shutdown's PING, keepalive PINGs and their
    /// deadline.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.saw(now);
        if self.error.is_some() {
            return;
        }
        if let Some(t) = self.cfg.preface_timeout
            && !self.settings_received
            && now >= self.created + t
        {
            self.protocol_error(Reason::PROTOCOL_ERROR, PREFACE_TIMEOUT_DEBUG);
            return;
        }
        if let (Some(t), Some(since)) = (self.cfg.idle_timeout, self.idle_since)
            && now >= since + t
        {
            self.shutdown_with(Bytes::from_static(IDLE_DEBUG));
        }
        if self.drain == Drain::AwaitingPing && self.drain_deadline.is_some_and(|d| now >= d) {
            self.final_goaway();
        }
        if let Some(d) = self.pings.ka_deadline {
            if now >= d {
                self.fail(Fail::Keepalive, Bytes::new());
            }
            return;
        }
        let Some(ka) = self.cfg.keepalive else { return };
        if (self.streams.is_empty() && !ka.permit_without_stream)
            || now < self.pings.last_recv + ka.interval
        {
            return;
        }
        self.push_control(Control::Ping {
            ack: false,
            payload: KEEPALIVE_PING,
        });
        self.pings.ka_deadline = Some(now + ka.timeout);
    }

    /// Phase two of a server's graceful shutdown: the final GOAWAY naming
    /// the last stream that will be served.
    pub(super) fn final_goaway(&mut self) {
        self.push_control(Control::GoAway {
            last: self.last_remote_id,
            reason: Reason::NO_ERROR,
            debug: Bytes::new(),
        });
        self.goaway_sent = Some(self.last_remote_id);
        self.drain = Drain::Final;
        self.drain_deadline = None;
    }

    /// Remember the latest time a caller brought.
    pub(super) fn saw(&mut self, now: Instant) {
        if now > self.last_now {
            self.last_now = now;
        }
    }

    // ----- helpers --------------------------------------------------------

    /// Queue a control frame. After a connection error only the GOAWAY
    /// that reports it goes out (queued by [`Connection::fail`]): whatever
    /// the application still does (return credit, reset streams) is not
    /// written.
    fn push_control(&mut self, c: Control) {
        if self.error.is_none() {
            self.control.push_back(c);
        }
    }

    fn mark_ready(&mut self, id: u32) {
        if let Some(s) = self.streams.get_mut(&id)
            && !s.in_ready
        {
            s.in_ready = true;
            self.ready.push_back(id);
        }
    }

    /// Close a stream on the wire now (reset): queued sends are dropped.
    fn close_stream(&mut self, id: u32, how: Closed) {
        let Some(s) = self.streams.get_mut(&id) else {
            return;
        };
        let was_closed = s.state == State::Closed;
        s.state = State::Closed;
        s.queue.clear();
        s.queued = 0;
        self.settle(id, was_closed, how);
    }

    /// Account for a state change of stream `id` (call after changing it):
    /// the open-stream counters, the memory of closed ids, and forgetting
    /// streams that are closed and no longer held by the application.
    fn settle(&mut self, id: u32, was_closed: bool, how: Closed) {
        let Some(s) = self.streams.get(&id) else {
            return;
        };
        if !was_closed && s.state == State::Closed {
            if !s.remote_initiated {
                self.local_active -= 1;
            }
            self.closed.push(id, how);
        }
        if s.is_finished() {
            if s.remote_initiated {
                self.remote_active -= 1;
            }
            self.streams.remove(&id);
            if self.streams.is_empty() {
                self.idle_since = Some(self.last_now);
            }
        }
    }

    /// Send RST_STREAM for a stream error the peer caused and close the
    /// stream. Too many of these end the connection (MadeYouReset).
    fn stream_error(&mut self, now: Instant, id: u32, reason: Reason) {
        self.stats.local_resets += 1;
        if !self.local_resets.take(now) {
            self.protocol_error(Reason::ENHANCE_YOUR_CALM, "too many stream errors");
            return;
        }
        self.push_control(Control::Rst { id, reason });
        match self.streams.get(&id).map(|s| s.state) {
            Some(State::Closed) => {}
            Some(_) => {
                self.close_stream(id, Closed::ResetByUs);
                self.events.push_back(Event::Reset {
                    id,
                    reason,
                    remote: false,
                });
            }
            None => self.closed.push(id, Closed::ResetByUs),
        }
    }

    fn protocol_error(&mut self, reason: Reason, what: &'static str) {
        self.fail(
            Fail::Local { reason, what },
            Bytes::from_static(what.as_bytes()),
        );
    }

    /// Fail the connection: queue GOAWAY (when we owe one) and stop
    /// processing input. The first failure wins.
    fn fail(&mut self, fail: Fail, debug: Bytes) {
        if self.error.is_some() {
            return;
        }
        // Every ENHANCE_YOUR_CALM names the limit it enforces.
        let debug = match fail {
            Fail::Frame(konn_frames::Error::HpackWorkLimit) if debug.is_empty() => {
                Bytes::from_static(b"HPACK decoding work limit")
            }
            _ => debug,
        };
        self.control.clear();
        if let Some(reason) = fail.goaway_reason() {
            self.control.push_back(Control::GoAway {
                last: self.last_remote_id,
                reason,
                debug,
            });
        }
        self.error = Some(fail);
    }
}
