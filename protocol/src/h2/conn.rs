//! The HTTP/2 connection state machine. See the module docs of `proto::h2`
//! for the call protocol; this file is organised as: construction and
//! accessors, application commands, input (frame handlers), output, timers,
//! and error helpers.

use std::collections::VecDeque;
use std::time::Instant;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use konn_frames::Reason;
use konn_frames::h2::{self as wire, Frame, SettingId, Settings};
use konn_frames::hpack;

use super::flow::{BDP_PING, Bdp, DEFAULT_WINDOW, RecvWindow, SendWindow};
use super::headers::Headers;
use super::limits::TokenBucket;
use super::stream::{Closed, ClosedRing, SendItem, State, Stream, StreamMap};
use super::{Config, Event, Role};
use crate::Error;

// `Connection::check_invariants`, in its own file to keep this one about
// the protocol.
#[path = "invariants.rs"]
mod invariants;

/// PING payload of keepalive probes.
const KEEPALIVE_PING: [u8; 8] = *b"konn-ka\0";
/// PING payload that ends phase one of a graceful GOAWAY.
const GOAWAY_PING: [u8; 8] = *b"konn-ga\0";
/// Highest stream id (RFC 9113 §5.1.1).
const MAX_STREAM_ID: u32 = (1 << 31) - 1;

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
    cfg: Config,
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
    block: Option<PartialBlock>,
    control: VecDeque<Control>,
    /// Streams with something to send.
    ready: VecDeque<u32>,
    events: VecDeque<Event>,
    pings: Pings,
    bdp: Option<Bdp>,
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
}

impl Connection {
    // ----- construction and accessors -------------------------------------

    /// A new connection in `cfg.role`, created at `now`. A client writes the
    /// preface with its first `poll_transmit`.
    pub fn new(cfg: Config, now: Instant) -> Self {
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
        let bdp = cfg.bdp_limit.map(Bdp::new);
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
            encoder: hpack::Encoder::new(),
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
            cfg,
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
        if self.drain != Drain::None || self.error.is_some() {
            return;
        }
        match self.cfg.role {
            Role::Server => {
                self.push_control(Control::GoAway {
                    last: MAX_STREAM_ID,
                    reason: Reason::NO_ERROR,
                    debug: Bytes::new(),
                });
                self.push_control(Control::Ping {
                    ack: false,
                    payload: GOAWAY_PING,
                });
                self.drain = Drain::AwaitingPing;
            }
            Role::Client => {
                self.push_control(Control::GoAway {
                    last: self.last_remote_id,
                    reason: Reason::NO_ERROR,
                    debug: Bytes::new(),
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

    // ----- input ----------------------------------------------------------

    /// Process the complete frames at the start of `input`, consuming them.
    /// A partial frame stays in `input` for the next call. Returns the
    /// connection error once the connection has failed (GOAWAY is queued:
    /// keep transmitting until [`Connection::is_closed`]).
    pub fn handle_input(&mut self, now: Instant, input: &mut BytesMut) -> Result<(), Error> {
        if let Some(e) = self.error {
            return Err(e.to_error());
        }
        if !self.preface_received {
            match wire::decode_preface(input) {
                Ok(None) => return Ok(()),
                Ok(Some(n)) => {
                    input.advance(n);
                    self.preface_received = true;
                }
                Err(e) => {
                    self.fail(Fail::Frame(e), Bytes::new());
                    return Err(Error::Frame(e));
                }
            }
        }
        while self.wants_read() {
            let (frame, n) = match wire::decode(input, self.local.max_frame_size) {
                Ok(None) => break,
                Ok(Some(f)) => f,
                Err(e) => {
                    self.on_frame_error(now, e, input);
                    if self.error.is_some() {
                        break;
                    }
                    continue;
                }
            };
            self.stats.frames_received += 1;
            self.pings.last_recv = now;
            if !self.settings_received && !matches!(frame, Frame::Settings { ack: false, .. }) {
                // RFC 9113 §3.4: the peer's preface ends with SETTINGS.
                self.protocol_error(Reason::PROTOCOL_ERROR, "first frame is not SETTINGS");
                break;
            }
            if let Some(b) = &self.block
                && !matches!(frame, Frame::Continuation { stream_id, .. } if stream_id == b.id)
            {
                self.protocol_error(
                    Reason::PROTOCOL_ERROR,
                    "frame interleaved with a header block",
                );
                break;
            }
            if let Frame::Data {
                stream_id,
                end_stream,
                data,
                pad_len,
            } = frame
            {
                // Zero copy: the payload becomes a slice of the input buffer.
                let offset = data.as_ptr() as usize - input.as_ptr() as usize;
                let len = data.len();
                let flow = frame.flow_controlled_len();
                let _ = pad_len;
                let chunk = input.split_to(n).freeze();
                self.on_data(
                    now,
                    stream_id,
                    end_stream,
                    chunk.slice(offset..offset + len),
                    flow,
                );
            } else {
                self.on_frame(now, frame);
                input.advance(n);
            }
            if self.error.is_some() {
                break;
            }
        }
        match self.error {
            Some(e) => Err(e.to_error()),
            None => Ok(()),
        }
    }

    /// A frame-level error from the decoder. Stream errors reset that stream
    /// and skip the frame; connection errors fail the connection.
    fn on_frame_error(&mut self, now: Instant, e: konn_frames::Error, input: &mut BytesMut) {
        let head = input
            .first_chunk::<{ wire::HEAD_LEN }>()
            .map(wire::Head::parse);
        let (Some((reason, konn_frames::Scope::Stream(id))), Some(head)) = (e.h2(), head) else {
            self.fail(Fail::Frame(e), Bytes::new());
            return;
        };
        let n = head.frame_len();
        let Some(payload) = input.get(wire::HEAD_LEN..n) else {
            self.fail(Fail::Frame(e), Bytes::new());
            return;
        };
        self.stats.frames_received += 1;
        if head.ty == wire::FrameType::HEADERS
            && matches!(e, konn_frames::Error::SelfDependency { .. })
        {
            // The header block must still be decoded to keep HPACK in sync.
            let payload = payload.to_vec();
            match Frame::load_allowing_self_dependency(head, &payload) {
                Ok(Frame::Headers {
                    stream_id,
                    end_stream,
                    end_headers,
                    fragment,
                    ..
                }) => self.on_headers(
                    now,
                    stream_id,
                    end_stream,
                    end_headers,
                    fragment,
                    Some(reason),
                ),
                _ => {
                    self.fail(Fail::Frame(e), Bytes::new());
                    return;
                }
            }
        } else {
            self.stream_error(now, id, reason);
        }
        input.advance(n);
    }

    fn on_frame(&mut self, now: Instant, frame: Frame<'_>) {
        match frame {
            Frame::Data { .. } => unreachable_data(),
            Frame::Headers {
                stream_id,
                end_stream,
                end_headers,
                fragment,
                ..
            } => self.on_headers(now, stream_id, end_stream, end_headers, fragment, None),
            Frame::Continuation {
                stream_id,
                end_headers,
                fragment,
            } => self.on_continuation(now, stream_id, end_headers, fragment),
            Frame::Priority { .. } => {} // deprecated (RFC 9113 §5.3.2); validated by the decoder
            Frame::RstStream { stream_id, reason } => self.on_rst(now, stream_id, reason),
            Frame::Settings { ack, params } => {
                if ack {
                    return;
                }
                for (id, value) in params.iter() {
                    if let Err(e) = self.apply_setting(id, value) {
                        self.fail(Fail::Frame(e), Bytes::new());
                        return;
                    }
                }
                self.settings_received = true;
                self.push_control(Control::SettingsAck);
            }
            Frame::PushPromise { .. } => {
                // We always advertise ENABLE_PUSH=0, and a client may never push.
                self.protocol_error(Reason::PROTOCOL_ERROR, "PUSH_PROMISE received");
            }
            Frame::Ping { ack, payload } => self.on_ping(now, ack, payload),
            Frame::GoAway {
                last_stream_id,
                reason,
                debug_data,
            } => self.on_goaway(last_stream_id, reason, debug_data),
            Frame::WindowUpdate {
                stream_id,
                increment,
            } => self.on_window_update(now, stream_id, increment),
            // Unknown frame types are ignored (RFC 9113 §5.5), but they
            // count as empty-frame noise when they carry nothing.
            Frame::Unknown { payload, .. } => {
                if payload.is_empty() {
                    self.count_empty();
                }
            }
        }
    }

    fn apply_setting(&mut self, id: SettingId, value: u32) -> Result<(), konn_frames::Error> {
        if id == SettingId::ENABLE_PUSH && value == 1 && self.cfg.role == Role::Client {
            // A server must not send ENABLE_PUSH=1 (RFC 9113 §6.5.2).
            return Err(konn_frames::Error::InvalidSetting { id: id.0, value });
        }
        let old_window = self.remote.initial_window_size;
        self.remote.apply(id, value)?;
        match id {
            SettingId::INITIAL_WINDOW_SIZE => {
                let delta = i64::from(self.remote.initial_window_size) - i64::from(old_window);
                let mut overflow = false;
                let mut opened = Vec::new();
                for (&sid, s) in &mut self.streams {
                    overflow |= s.send.adjust(delta).is_err();
                    if delta > 0 && !s.queue.is_empty() {
                        opened.push(sid);
                    }
                }
                if overflow {
                    // RFC 9113 §6.9.2: a window above 2^31-1 is a connection error.
                    return Err(konn_frames::Error::InvalidSetting { id: id.0, value });
                }
                for sid in opened {
                    self.mark_ready(sid);
                }
            }
            SettingId::HEADER_TABLE_SIZE => {
                self.encoder
                    .set_max_table_size(value.min(self.cfg.max_encoder_table_size));
            }
            _ => {}
        }
        Ok(())
    }

    fn on_ping(&mut self, now: Instant, ack: bool, payload: [u8; 8]) {
        if ack {
            match payload {
                BDP_PING => self.on_bdp_ack(now),
                KEEPALIVE_PING => self.pings.ka_deadline = None,
                GOAWAY_PING if self.drain == Drain::AwaitingPing => {
                    self.push_control(Control::GoAway {
                        last: self.last_remote_id,
                        reason: Reason::NO_ERROR,
                        debug: Bytes::new(),
                    });
                    self.goaway_sent = Some(self.last_remote_id);
                    self.drain = Drain::Final;
                }
                _ => {}
            }
            return;
        }
        self.stats.pings_received += 1;
        self.push_control(Control::Ping { ack: true, payload });
        let Some(policy) = self.cfg.ping_policy else {
            return;
        };
        let last = self.pings.last_peer_ping.replace(now);
        if std::mem::take(&mut self.pings.reset_strikes) {
            self.pings.strikes = 0;
            return;
        }
        let min_time = if self.remote_active == 0 && !policy.permit_without_stream {
            // grpc-go: without streams a ping is only fine after 2 hours.
            std::time::Duration::from_secs(2 * 3600)
        } else {
            policy.min_time
        };
        if last.is_some_and(|l| now.saturating_duration_since(l) < min_time) {
            self.pings.strikes += 1;
        }
        if self.pings.strikes > policy.max_strikes {
            self.fail(
                Fail::Local {
                    reason: Reason::ENHANCE_YOUR_CALM,
                    what: "too_many_pings",
                },
                Bytes::from_static(b"too_many_pings"),
            );
        }
    }

    fn on_bdp_ack(&mut self, now: Instant) {
        let window = self.local.initial_window_size;
        let Some(grown) = self.bdp.as_mut().and_then(|b| b.on_ack(now, window)) else {
            return;
        };
        let delta = grown - window;
        self.local.initial_window_size = grown;
        self.push_control(Control::InitialWindow(grown));
        for s in self.streams.values_mut() {
            s.recv.grow_to(grown);
        }
        let ids: Vec<u32> = self.streams.keys().copied().collect();
        for id in ids {
            if let Some(inc) = self.streams.get_mut(&id).and_then(|s| s.recv.take_growth()) {
                self.push_control(Control::WindowUpdate { id, inc });
            }
        }
        self.conn_recv
            .grow_to(self.conn_recv.target().saturating_add(delta));
        if let Some(inc) = self.conn_recv.take_growth() {
            self.push_control(Control::WindowUpdate { id: 0, inc });
        }
    }

    fn on_goaway(&mut self, last_stream_id: u32, reason: Reason, debug: &[u8]) {
        self.goaway_recv = Some(last_stream_id);
        let refused: Vec<u32> = self
            .streams
            .iter()
            .filter(|(id, s)| !s.remote_initiated && **id > last_stream_id)
            .map(|(id, _)| *id)
            .collect();
        for id in refused {
            self.close_stream(id, Closed::Other);
            self.events.push_back(Event::Reset {
                id,
                reason: Reason::REFUSED_STREAM,
                remote: true,
            });
        }
        self.events.push_back(Event::GoAway {
            last_stream_id,
            reason,
            debug: Bytes::copy_from_slice(debug),
        });
        if reason != Reason::NO_ERROR {
            // The peer is closing the connection because of an error.
            self.fail(Fail::Remote(reason), Bytes::new());
        } else if self.drain == Drain::None {
            self.drain = Drain::Final;
        }
    }

    fn on_window_update(&mut self, now: Instant, id: u32, inc: u32) {
        if id == 0 {
            if self.conn_send.increase(inc).is_err() {
                self.protocol_error(Reason::FLOW_CONTROL_ERROR, "connection window above 2^31-1");
                return;
            }
            let waiting: Vec<u32> = self
                .streams
                .iter()
                .filter(|(_, s)| !s.queue.is_empty() && !s.in_ready)
                .map(|(id, _)| *id)
                .collect();
            for id in waiting {
                self.mark_ready(id);
            }
            return;
        }
        if self.is_idle(id) {
            self.protocol_error(Reason::PROTOCOL_ERROR, "WINDOW_UPDATE on an idle stream");
            return;
        }
        let Some(s) = self.streams.get_mut(&id) else {
            return;
        };
        if s.state == State::Closed {
            return;
        }
        if s.send.increase(inc).is_err() {
            self.stream_error(now, id, Reason::FLOW_CONTROL_ERROR);
            return;
        }
        if !s.queue.is_empty() {
            self.mark_ready(id);
        }
    }

    fn on_rst(&mut self, now: Instant, id: u32, reason: Reason) {
        if self.is_idle(id) {
            self.protocol_error(Reason::PROTOCOL_ERROR, "RST_STREAM on an idle stream");
            return;
        }
        let Some(s) = self.streams.get(&id) else {
            return;
        };
        if s.state == State::Closed {
            return;
        }
        self.stats.remote_resets += 1;
        if s.remote_initiated && !self.remote_resets.take(now) {
            self.protocol_error(Reason::ENHANCE_YOUR_CALM, "too many stream resets");
            return;
        }
        self.close_stream(id, Closed::Other);
        self.events.push_back(Event::Reset {
            id,
            reason,
            remote: true,
        });
    }

    fn on_headers(
        &mut self,
        now: Instant,
        id: u32,
        end_stream: bool,
        end_headers: bool,
        fragment: &[u8],
        reset: Option<Reason>,
    ) {
        if fragment.is_empty() && !end_headers && !end_stream {
            self.count_empty();
        }
        if end_headers {
            self.on_block(now, id, end_stream, fragment, reset);
            return;
        }
        if fragment.len() > self.cfg.limits.max_header_block {
            self.protocol_error(Reason::ENHANCE_YOUR_CALM, "header block too large");
            return;
        }
        let mut buf = BytesMut::with_capacity(fragment.len() * 2);
        buf.extend_from_slice(fragment);
        self.block = Some(PartialBlock {
            id,
            end_stream,
            reset,
            buf,
            continuations: 0,
        });
    }

    fn on_continuation(&mut self, now: Instant, id: u32, end_headers: bool, fragment: &[u8]) {
        if fragment.is_empty() && !end_headers {
            self.count_empty();
        }
        let limits = &self.cfg.limits;
        let Some(block) = self.block.as_mut().filter(|b| b.id == id) else {
            self.protocol_error(
                Reason::PROTOCOL_ERROR,
                "CONTINUATION without a header block",
            );
            return;
        };
        block.continuations += 1;
        if block.continuations > limits.max_continuation_frames
            || block.buf.len() + fragment.len() > limits.max_header_block
        {
            self.protocol_error(Reason::ENHANCE_YOUR_CALM, "CONTINUATION flood");
            return;
        }
        block.buf.extend_from_slice(fragment);
        if end_headers && let Some(b) = self.block.take() {
            self.on_block(now, b.id, b.end_stream, &b.buf, b.reset);
        }
    }

    /// A complete header block on stream `id`.
    fn on_block(
        &mut self,
        now: Instant,
        id: u32,
        end_stream: bool,
        block: &[u8],
        reset: Option<Reason>,
    ) {
        // Decode first, whatever happens to the stream: HPACK state is
        // connection-wide and must stay in sync with the peer.
        let mut builder = Headers::builder();
        let decoded = self
            .decoder
            .decode(block, &mut |f: hpack::HeaderField<'_>| {
                builder.add(f.name, f.value, f.never_indexed)
            });
        let headers = match decoded {
            Ok(()) => builder.finish(),
            Err(konn_frames::Error::HeaderListTooLarge { .. }) => {
                self.stream_error_on_block(now, id, Reason::PROTOCOL_ERROR);
                return;
            }
            Err(e) => {
                self.fail(Fail::Frame(e), Bytes::new());
                return;
            }
        };
        if let Some(reason) = reset {
            self.stream_error_on_block(now, id, reason);
            return;
        }
        match self.cfg.role {
            Role::Server => self.on_request_block(now, id, end_stream, headers),
            Role::Client => self.on_response_block(now, id, end_stream, headers),
        }
    }

    /// A header block that must reset its stream: opens it first if it is a
    /// new stream so the reset refers to a known id.
    fn stream_error_on_block(&mut self, now: Instant, id: u32, reason: Reason) {
        if self.cfg.role == Role::Server && id % 2 == 1 && id > self.last_remote_id {
            self.last_remote_id = id;
        }
        self.stream_error(now, id, reason);
    }

    fn on_request_block(&mut self, now: Instant, id: u32, end_stream: bool, headers: Headers) {
        if id.is_multiple_of(2) {
            self.protocol_error(Reason::PROTOCOL_ERROR, "client opened an even stream id");
            return;
        }
        if id > self.last_remote_id {
            // A new stream.
            self.last_remote_id = id;
            if self.goaway_sent.is_some_and(|last| id > last) {
                return; // refused by our GOAWAY; ignored (RFC 9113 §6.8)
            }
            if self.remote_active >= self.cfg.max_concurrent_streams as usize {
                self.stream_error(now, id, Reason::REFUSED_STREAM);
                return;
            }
            let Ok(content_length) = headers.check_request() else {
                self.stream_error(now, id, Reason::PROTOCOL_ERROR);
                return;
            };
            let mut s = Stream::new(
                true,
                RecvWindow::new(
                    self.local.initial_window_size,
                    self.local.initial_window_size,
                ),
                SendWindow::new(self.remote.initial_window_size),
            );
            s.headers_received = true;
            s.content_length = content_length;
            if end_stream {
                if content_length.is_some_and(|cl| cl != 0) {
                    self.stream_error(now, id, Reason::PROTOCOL_ERROR);
                    return;
                }
                s.close_remote();
            }
            self.streams.insert(id, s);
            self.remote_active += 1;
            self.events.push_back(Event::Headers {
                id,
                headers,
                end_stream,
            });
            return;
        }
        self.on_later_block(now, id, end_stream, headers);
    }

    fn on_response_block(&mut self, now: Instant, id: u32, end_stream: bool, headers: Headers) {
        if id.is_multiple_of(2) {
            self.protocol_error(Reason::PROTOCOL_ERROR, "server opened a stream");
            return;
        }
        if id >= self.next_local_id {
            self.protocol_error(Reason::PROTOCOL_ERROR, "HEADERS on an idle stream");
            return;
        }
        let Some(s) = self.streams.get_mut(&id) else {
            self.on_closed_stream_frame(now, id, true);
            return;
        };
        if !s.headers_received {
            let Ok(content_length) = headers.check_response() else {
                self.stream_error(now, id, Reason::PROTOCOL_ERROR);
                return;
            };
            if headers.status().is_some_and(|st| (100..200).contains(&st)) {
                // Informational response: the final one follows.
                if end_stream {
                    self.stream_error(now, id, Reason::PROTOCOL_ERROR);
                }
                return;
            }
            s.headers_received = true;
            s.content_length = content_length;
            if end_stream {
                s.close_remote();
            }
            self.events.push_back(Event::Headers {
                id,
                headers,
                end_stream,
            });
            self.settle(id, false, Closed::Ended);
            return;
        }
        self.on_later_block(now, id, end_stream, headers);
    }

    /// A header block on a stream that already had its headers: trailers.
    fn on_later_block(&mut self, now: Instant, id: u32, end_stream: bool, headers: Headers) {
        let Some(s) = self.streams.get_mut(&id) else {
            self.on_closed_stream_frame(now, id, true);
            return;
        };
        if !s.recv_open() {
            self.stream_error(now, id, Reason::STREAM_CLOSED);
            return;
        }
        // RFC 9113 §8.1: a second header block must end the stream and may
        // not carry pseudo-headers.
        if !end_stream || headers.check_trailers().is_err() {
            self.stream_error(now, id, Reason::PROTOCOL_ERROR);
            return;
        }
        if s.content_length.is_some_and(|cl| cl != s.data_received) {
            self.stream_error(now, id, Reason::PROTOCOL_ERROR);
            return;
        }
        s.close_remote();
        self.events.push_back(Event::Trailers { id, headers });
        self.settle(id, false, Closed::Ended);
    }

    fn on_data(&mut self, now: Instant, id: u32, end_stream: bool, data: Bytes, flow: u32) {
        if self.conn_recv.consume(flow).is_err() {
            self.protocol_error(Reason::FLOW_CONTROL_ERROR, "connection window exceeded");
            return;
        }
        if data.is_empty() && !end_stream {
            self.count_empty();
            if self.error.is_some() {
                return;
            }
        } else {
            self.empty_frames = 0;
        }
        if self.is_idle(id) {
            self.protocol_error(Reason::PROTOCOL_ERROR, "DATA on an idle stream");
            return;
        }
        let padding = flow - u32::try_from(data.len()).unwrap_or(flow);
        let Some(s) = self.streams.get_mut(&id) else {
            // Closed: keep the connection window honest, then STREAM_CLOSED
            // unless this is a late frame after our own RST_STREAM.
            self.release_conn(flow);
            self.on_closed_stream_frame(now, id, false);
            return;
        };
        if !s.recv_open() || !s.headers_received {
            let closed = !s.recv_open();
            self.release_conn(flow);
            let reason = if closed {
                Reason::STREAM_CLOSED
            } else {
                Reason::PROTOCOL_ERROR
            };
            self.stream_error(now, id, reason);
            return;
        }
        if s.recv.consume(flow).is_err() {
            self.release_conn(flow);
            self.stream_error(now, id, Reason::FLOW_CONTROL_ERROR);
            return;
        }
        s.data_received += data.len() as u64;
        if s.content_length
            .is_some_and(|cl| s.data_received > cl || (end_stream && s.data_received != cl))
        {
            self.release_conn(flow);
            self.stream_error(now, id, Reason::PROTOCOL_ERROR);
            return;
        }
        if end_stream {
            s.close_remote();
        }
        if padding > 0 {
            // The application never sees padding: return its credit now.
            self.release_capacity(id, padding as usize);
        }
        if let Some(bdp) = &mut self.bdp
            && bdp.on_data(now, flow as usize)
        {
            self.push_control(Control::Ping {
                ack: false,
                payload: BDP_PING,
            });
        }
        self.events.push_back(Event::Data {
            id,
            data,
            end_stream,
        });
        if end_stream {
            self.settle(id, false, Closed::Ended);
        }
    }

    /// A HEADERS or DATA frame on a stream that is no longer in the table.
    fn on_closed_stream_frame(&mut self, now: Instant, id: u32, headers: bool) {
        match self.closed.get(id) {
            Some(Closed::ResetByUs) => {} // in flight when we reset it: ignore
            Some(Closed::Other) => self.stream_error(now, id, Reason::STREAM_CLOSED),
            // Both sides sent END_STREAM: the peer cannot have had this in
            // flight, so it is a connection error (RFC 9113 §5.1 "closed").
            Some(Closed::Ended) => {
                self.protocol_error(Reason::STREAM_CLOSED, "frame after END_STREAM")
            }
            // Below the highest id but not remembered. New HEADERS there
            // reuse an id (RFC 9113 §5.1.1: PROTOCOL_ERROR); anything else
            // is on an implicitly closed stream (§5.1: STREAM_CLOSED).
            None if headers => self.protocol_error(
                Reason::PROTOCOL_ERROR,
                "stream id not greater than the last",
            ),
            None => self.protocol_error(Reason::STREAM_CLOSED, "frame on a closed stream"),
        }
    }

    fn release_conn(&mut self, n: u32) {
        if let Some(inc) = self.conn_recv.release(n) {
            self.push_control(Control::WindowUpdate { id: 0, inc });
        }
    }

    /// A stream id that was never opened (RFC 9113 §5.1 "idle").
    fn is_idle(&self, id: u32) -> bool {
        let remote_parity = match self.cfg.role {
            Role::Server => 1,
            Role::Client => 0,
        };
        if id % 2 == remote_parity {
            id > self.last_remote_id
        } else {
            id >= self.next_local_id
        }
    }

    fn count_empty(&mut self) {
        self.empty_frames += 1;
        if self.empty_frames > self.cfg.limits.max_empty_frames {
            self.protocol_error(Reason::ENHANCE_YOUR_CALM, "too many empty frames");
        }
    }

    // ----- output ---------------------------------------------------------

    /// Write pending frames into `out` until it holds at least `max` bytes
    /// or nothing is left. Returns the number of bytes written.
    pub fn poll_transmit(&mut self, now: Instant, out: &mut BytesMut, max: usize) -> usize {
        let start = out.len();
        if !self.preface_sent {
            self.write_preface(out);
        }
        while let Some(c) = self.control.pop_front() {
            self.write_control(c, out);
            if out.len() - start >= max {
                return out.len() - start;
            }
        }
        if self.error.is_some() {
            return out.len() - start;
        }
        let mut rounds = self.ready.len();
        while rounds > 0 && out.len() - start < max {
            rounds -= 1;
            let Some(id) = self.ready.pop_front() else {
                break;
            };
            let progressed = self.write_stream(now, id, out);
            let Some(s) = self.streams.get_mut(&id) else {
                continue;
            };
            if s.queue.is_empty() {
                s.in_ready = false;
            } else if progressed {
                self.ready.push_back(id);
                rounds += 1;
            } else {
                // Blocked by the stream window: WINDOW_UPDATE re-queues it.
                s.in_ready = false;
            }
            if self.conn_send.available() == 0 && self.ready.iter().all(|i| self.next_is_data(*i)) {
                break;
            }
        }
        out.len() - start
    }

    fn write_preface(&mut self, out: &mut BytesMut) {
        self.preface_sent = true;
        if self.cfg.role == Role::Client {
            out.put_slice(wire::PREFACE);
        }
        self.local.encode_changes(&Settings::default(), out);
        if let Some(inc) = self.conn_recv.take_growth() {
            wire::encode_window_update(0, inc, out);
        }
    }

    fn write_control(&mut self, c: Control, out: &mut BytesMut) {
        match c {
            Control::SettingsAck => wire::encode_settings_ack(out),
            Control::InitialWindow(w) => {
                wire::encode_settings(&[(SettingId::INITIAL_WINDOW_SIZE, w)], out)
            }
            Control::Ping { ack, payload } => {
                wire::encode_ping(ack, payload, out);
            }
            Control::Rst { id, reason } => wire::encode_rst_stream(id, reason, out),
            Control::WindowUpdate { id, inc } => wire::encode_window_update(id, inc, out),
            Control::GoAway {
                last,
                reason,
                debug,
            } => wire::encode_goaway(last, reason, &debug, out),
        }
    }

    fn next_is_data(&self, id: u32) -> bool {
        self.streams
            .get(&id)
            .and_then(|s| s.queue.front())
            .is_some_and(|i| matches!(i, SendItem::Data { data, .. } if !data.is_empty()))
    }

    /// Write at most one frame (or header block) of stream `id`. Returns
    /// whether anything was written.
    fn write_stream(&mut self, _now: Instant, id: u32, out: &mut BytesMut) -> bool {
        let max_frame = self.remote.max_frame_size as usize;
        let conn_avail = self.conn_send.available();
        let Some(s) = self.streams.get_mut(&id) else {
            return false;
        };
        let Some(item) = s.queue.front_mut() else {
            return false;
        };
        let ended;
        match item {
            SendItem::Headers {
                headers,
                end_stream,
            } => {
                let end = *end_stream;
                self.scratch.clear();
                encode_block(&mut self.encoder, headers, &mut self.scratch);
                wire::encode_headers(id, &self.scratch, end, max_frame as u32, out);
                s.queue.pop_front();
                ended = end;
                self.pings.reset_strikes = true;
            }
            SendItem::Trailers(headers) => {
                self.scratch.clear();
                encode_block(&mut self.encoder, headers, &mut self.scratch);
                wire::encode_headers(id, &self.scratch, true, max_frame as u32, out);
                s.queue.pop_front();
                ended = true;
                self.pings.reset_strikes = true;
            }
            SendItem::Data { data, end_stream } => {
                if data.is_empty() {
                    wire::encode_data_head(id, 0, *end_stream, out);
                    ended = *end_stream;
                    s.queue.pop_front();
                } else {
                    let n = data
                        .len()
                        .min(max_frame)
                        .min(s.send.available())
                        .min(conn_avail);
                    if n == 0 {
                        return false;
                    }
                    let last = n == data.len();
                    let end = last && *end_stream;
                    wire::encode_data_head(id, n as u32, end, out);
                    out.put_slice(data.get(..n).unwrap_or_default());
                    data.advance(n);
                    s.send.spend(n);
                    s.queued -= n;
                    self.conn_send.spend(n);
                    if last {
                        s.queue.pop_front();
                    }
                    ended = end;
                    self.pings.reset_strikes = true;
                }
            }
        }
        if let Some(low) = s.drain_notify
            && s.queued <= low
        {
            s.drain_notify = None;
            self.events.push_back(Event::Writable { id });
        }
        if ended {
            s.close_local();
            if s.state == State::HalfClosedLocal && s.remote_initiated && !s.app_held {
                // Released by the application: the peer's side is not
                // needed any more.
                self.push_control(Control::Rst {
                    id,
                    reason: Reason::NO_ERROR,
                });
                self.close_stream(id, Closed::ResetByUs);
            } else {
                self.settle(id, false, Closed::Ended);
            }
        }
        true
    }

    // ----- timers ---------------------------------------------------------

    /// When [`Connection::handle_timeout`] must be called next.
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.error.is_some() {
            return None;
        }
        if let Some(d) = self.pings.ka_deadline {
            return Some(d);
        }
        let ka = self.cfg.keepalive?;
        if self.streams.is_empty() && !ka.permit_without_stream {
            return None;
        }
        Some(self.pings.last_recv + ka.interval)
    }

    /// Run timers due at `now`: keepalive PINGs and their deadline.
    pub fn handle_timeout(&mut self, now: Instant) {
        if self.error.is_some() {
            return;
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

fn encode_block(encoder: &mut hpack::Encoder, headers: &Headers, dst: &mut BytesMut) {
    encoder.encode(
        headers.fields().iter().map(|f| hpack::Field {
            name: &f.name,
            value: &f.value,
            sensitive: f.sensitive,
        }),
        dst,
    );
}

#[cold]
fn unreachable_data() {
    debug_assert!(false, "DATA frames are handled by on_data");
}
