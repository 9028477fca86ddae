//! gRPC streaming calls on top of [`h2::Connection`](super::h2::Connection),
//! sans-IO, for both roles.
//!
//! [`Grpc`] wraps one HTTP/2 connection and turns its events into call
//! events: a server sees [`GrpcEvent::Call`] (path and request metadata),
//! then [`GrpcEvent::Message`]s and [`GrpcEvent::HalfClose`]; a client sees
//! [`GrpcEvent::ResponseHeaders`], messages and finally
//! [`GrpcEvent::Finished`] with the call's status. Every failure path ends a
//! call with a status: a reset stream, a bad response, an oversized or
//! truncated message, a dead connection.
//!
//! Wire details (gRPC "PROTOCOL-HTTP2"): requests are `POST` with
//! `content-type: application/grpc` and `te: trailers`; responses are
//! `:status 200` headers, length-prefixed messages, then trailers with
//! `grpc-status` and `grpc-message` (percent-encoded). An error before any
//! response is a "trailers-only" response: one HEADERS frame with
//! END_STREAM carrying `:status` and `grpc-status`.
//!
//! **Flow control.** A message handed out zero-copy still occupies the
//! peer's window: its [`GrpcEvent::Message::flow`] bytes go back to the peer
//! only when the application calls [`Grpc::release`], so a slow consumer
//! slows its sender. A message split over frames (grpc-go sends 32 KiB
//! messages as several 16 KiB frames) owes the credit of every frame it
//! took: the deframer holds the credit of the bytes it copied and adds it
//! to the message's `flow`. Only what exceeds half of our initial stream
//! window is released at once, so a message larger than the window can
//! never deadlock the stream.
//!
//! **Sending.** [`Grpc::send_framed`] takes a message that already carries
//! its 5-byte prefix (e.g. from `Packet::encode_grpc` into a pooled buffer),
//! so the hot path never copies or allocates per message.

use std::collections::VecDeque;
use std::collections::hash_map::RandomState;
use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes, BytesMut};
use konn_frames::grpc::{self as wire, Deframer};
use konn_frames::{GrpcStatus, Reason};

use super::h2::{Connection, Event, Headers, Role};
use crate::Error;
use crate::maps::SmallMap;

/// What happened on a call.
#[derive(Debug)]
pub enum GrpcEvent {
    /// Server: a client started a call. Answer with [`Grpc::accept`] or
    /// [`Grpc::finish`] (e.g. `UNIMPLEMENTED` for an unknown path).
    Call {
        /// Stream id of the call.
        id: u32,
        /// `:path`, e.g. `/AgentService/Connect`.
        path: Bytes,
        /// All request headers (metadata keys are lower case).
        metadata: Headers,
        /// The client's `grpc-timeout`, if any.
        timeout: Option<Duration>,
    },
    /// Client: the response headers (metadata) arrived.
    ResponseHeaders {
        /// Stream id.
        id: u32,
        /// Response headers, e.g. `serverid`, `servercount`.
        metadata: Headers,
    },
    /// One complete message.
    Message {
        /// Stream id.
        id: u32,
        /// The message (without its 5-byte prefix).
        msg: Bytes,
        /// The message *with* its prefix, when it arrived in one piece (a
        /// slice of the receive buffer, for forwarding without a copy);
        /// `None` when it was reassembled from several frames.
        framed: Option<Bytes>,
        /// Flow-control credit to return with [`Grpc::release`] once the
        /// message has been passed on.
        flow: usize,
    },
    /// Server: the client will send no more messages.
    HalfClose {
        /// Stream id.
        id: u32,
    },
    /// The call is over (client: the server's status; server: the client
    /// went away, or the call failed locally). No more events follow for it.
    Finished {
        /// Stream id.
        id: u32,
        /// Final status.
        status: GrpcStatus,
        /// Status message (`grpc-message`, decoded).
        message: String,
        /// Response trailers (client), if the server sent any.
        trailers: Option<Headers>,
    },
    /// The call's send queue drained (see [`Grpc::notify_when_drained`]).
    Writable {
        /// Stream id.
        id: u32,
    },
    /// The peer sent GOAWAY: start no new calls on this connection.
    GoAway {
        /// The peer's error code (`NO_ERROR` for a graceful shutdown).
        reason: Reason,
        /// Debug data, e.g. `too_many_pings`.
        debug: Bytes,
    },
}

/// Per-call state.
#[derive(Debug)]
struct Call {
    deframer: Deframer,
    /// Server: response headers sent. Client: response headers received.
    headers_done: bool,
    /// Our side of the call is finished (trailers / END_STREAM queued).
    local_done: bool,
    /// Credit of the bytes the deframer copied for the message it is
    /// assembling; the message's `flow` carries it.
    held: usize,
}

/// gRPC calls over one HTTP/2 connection. See the module docs.
#[derive(Debug)]
pub struct Grpc {
    conn: Connection,
    /// An agent tunnel or a kube-apiserver dial holds one call.
    calls: SmallMap<u32, Call, RandomState>,
    events: VecDeque<GrpcEvent>,
    max_message: u32,
    /// Scratch for trailers-only status and grpc-message encoding.
    scratch: BytesMut,
}

impl Grpc {
    /// Wrap `conn`; received messages may be up to `max_message` bytes
    /// (grpc-go's default is 4 MiB, [`wire::DEFAULT_MAX_RECV_MESSAGE_SIZE`]).
    pub fn new(conn: Connection, max_message: u32) -> Self {
        Self {
            conn,
            calls: SmallMap::new(),
            events: VecDeque::new(),
            max_message,
            scratch: BytesMut::new(),
        }
    }

    /// The underlying HTTP/2 connection (for its driver-facing methods).
    pub fn conn(&self) -> &Connection {
        &self.conn
    }

    /// Mutable access to the HTTP/2 connection.
    pub fn conn_mut(&mut self) -> &mut Connection {
        &mut self.conn
    }

    /// Calls in progress.
    pub fn calls(&self) -> usize {
        self.calls.len()
    }

    // ----- driver side ------------------------------------------------------

    /// Feed received bytes (see [`Connection::handle_input`]).
    pub fn handle_input(&mut self, now: Instant, input: &mut BytesMut) -> Result<(), Error> {
        let r = self.conn.handle_input(now, input);
        self.pump();
        if r.is_err() {
            self.fail_all();
        }
        r
    }

    /// Write pending frames (see [`Connection::poll_transmit`]).
    pub fn poll_transmit(&mut self, now: Instant, out: &mut BytesMut, max: usize) -> usize {
        let n = self.conn.poll_transmit(now, out, max);
        self.pump();
        n
    }

    /// Write pending frames, large DATA payloads by reference (see
    /// [`Connection::poll_transmit_vectored`]).
    pub fn poll_transmit_vectored(
        &mut self,
        now: Instant,
        out: &mut BytesMut,
        payloads: &mut crate::h2::Payloads,
        max: usize,
    ) -> usize {
        let n = self.conn.poll_transmit_vectored(now, out, payloads, max);
        self.pump();
        n
    }

    /// Run timers (see [`Connection::handle_timeout`]).
    pub fn handle_timeout(&mut self, now: Instant) {
        self.conn.handle_timeout(now);
        self.pump();
        if self.conn.error().is_some() {
            self.fail_all();
        }
    }

    /// The connection is gone (socket closed or failed): every open call
    /// finishes with `UNAVAILABLE`.
    pub fn connection_lost(&mut self) {
        self.fail_all();
        self.conn.connection_lost();
        self.pump();
    }

    /// Gives back memory held for bursts (see
    /// [`Connection::release_idle`]): the HTTP/2 connection's, the event
    /// queue's, the call table's, the scratch buffer's.
    pub fn release_idle(&mut self) {
        self.conn.release_idle();
        if self.events.is_empty() {
            self.events = VecDeque::new();
        }
        self.calls.shrink();
        if self.scratch.is_empty() {
            self.scratch = BytesMut::new();
        }
    }

    /// Call events are waiting (including HTTP/2 events not yet translated).
    pub fn has_events(&self) -> bool {
        !self.events.is_empty() || self.conn.has_events()
    }

    /// The next call event.
    pub fn poll_event(&mut self) -> Option<GrpcEvent> {
        if self.events.is_empty() {
            self.pump();
        }
        self.events.pop_front()
    }

    // ----- both roles -------------------------------------------------------

    /// Send one message that already carries its 5-byte gRPC prefix.
    pub fn send_framed(&mut self, id: u32, framed: Bytes) -> Result<(), Error> {
        debug_assert!(framed.len() >= wire::PREFIX_LEN);
        self.conn.send_data(id, framed, false)
    }

    /// Send one message, adding the prefix (copies `msg`; for control-rate
    /// messages — the data path uses [`Grpc::send_framed`]).
    pub fn send_message(&mut self, id: u32, msg: &[u8]) -> Result<(), Error> {
        let mut b = BytesMut::with_capacity(msg.len() + wire::PREFIX_LEN);
        wire::encode_prefix(u32::try_from(msg.len()).unwrap_or(u32::MAX), &mut b);
        b.put_slice(msg);
        self.send_framed(id, b.freeze())
    }

    /// Return `flow` bytes of credit for a message that was passed on.
    pub fn release(&mut self, id: u32, flow: usize) {
        if flow > 0 {
            self.conn.release_capacity(id, flow);
        }
    }

    /// Bytes queued on the call and not yet written.
    pub fn queued_bytes(&self, id: u32) -> usize {
        self.conn.queued_bytes(id)
    }

    /// Emit [`GrpcEvent::Writable`] once the queue falls to `low` bytes.
    pub fn notify_when_drained(&mut self, id: u32, low: usize) {
        self.conn.notify_when_drained(id, low);
    }

    /// Abandon a call: reset its stream with CANCEL. No event follows.
    pub fn cancel(&mut self, id: u32) {
        if self.remove_call(id).is_some() {
            self.conn.reset_stream(id, Reason::CANCEL);
            if self.conn.role() == Role::Server {
                self.conn.release_stream(id);
            }
        }
    }

    // ----- client -----------------------------------------------------------

    /// Start a call to `path` on `authority` with extra request `metadata`
    /// (lower-case keys; credentials marked sensitive). Returns the id.
    pub fn start_call(
        &mut self,
        scheme: &'static str,
        authority: Bytes,
        path: Bytes,
        metadata: &Headers,
    ) -> Result<u32, Error> {
        let mut h = Headers::request("POST", scheme, authority, path);
        h.push_static("content-type", "application/grpc");
        h.push_static("te", "trailers");
        for f in metadata.fields() {
            if f.sensitive {
                h.push_sensitive(f.name.clone(), f.value.clone());
            } else {
                h.push(f.name.clone(), f.value.clone());
            }
        }
        let id = self.conn.open_stream(h, false)?;
        self.calls.insert(id, self.new_call());
        Ok(id)
    }

    /// Client: no more messages will be sent (END_STREAM).
    pub fn close_send(&mut self, id: u32) -> Result<(), Error> {
        let call = self.calls.get_mut(&id).ok_or(Error::StreamClosed(id))?;
        if call.local_done {
            return Ok(());
        }
        call.local_done = true;
        self.conn.send_data(id, Bytes::new(), true)
    }

    // ----- server -----------------------------------------------------------

    /// Server: send the response headers (`:status 200`,
    /// `content-type: application/grpc` plus `metadata`).
    pub fn accept(&mut self, id: u32, metadata: &Headers) -> Result<(), Error> {
        let call = self.calls.get_mut(&id).ok_or(Error::StreamClosed(id))?;
        if call.headers_done {
            return Ok(());
        }
        call.headers_done = true;
        let mut h = Headers::response(200);
        h.push_static("content-type", "application/grpc");
        for f in metadata.fields() {
            h.push(f.name.clone(), f.value.clone());
        }
        self.conn.send_headers(id, h, false)
    }

    /// Server: end the call with `status` and `message` (trailers, or a
    /// trailers-only response if no headers were sent). The stream is
    /// released; no event follows.
    pub fn finish(&mut self, id: u32, status: GrpcStatus, message: &str) -> Result<(), Error> {
        let Some(mut call) = self.remove_call(id) else {
            return Err(Error::StreamClosed(id));
        };
        if !call.local_done {
            call.local_done = true;
            let trailers = self.status_fields(status, message, !call.headers_done);
            let r = if call.headers_done {
                self.conn.send_trailers(id, trailers)
            } else {
                self.conn.send_headers(id, trailers, true)
            };
            if let Err(e) = r {
                self.conn.release_stream(id);
                return Err(e);
            }
        }
        self.conn.release_stream(id);
        Ok(())
    }

    fn status_fields(&mut self, status: GrpcStatus, message: &str, trailers_only: bool) -> Headers {
        let mut h = if trailers_only {
            let mut h = Headers::response(200);
            h.push_static("content-type", "application/grpc");
            h
        } else {
            Headers::new()
        };
        self.scratch.clear();
        wire::encode_status(status, &mut self.scratch);
        h.push(
            Bytes::from_static(b"grpc-status"),
            self.scratch.split().freeze(),
        );
        if !message.is_empty() {
            wire::encode_status_message(message.as_bytes(), &mut self.scratch);
            h.push(
                Bytes::from_static(b"grpc-message"),
                self.scratch.split().freeze(),
            );
        }
        h
    }

    // ----- event translation -------------------------------------------------

    fn new_call(&self) -> Call {
        Call {
            deframer: Deframer::new(self.max_message),
            held: 0,
            headers_done: false,
            local_done: false,
        }
    }

    /// Translate every pending HTTP/2 event.
    fn pump(&mut self) {
        while let Some(ev) = self.conn.poll_event() {
            match ev {
                Event::Headers {
                    id,
                    headers,
                    end_stream,
                } => match self.conn.role() {
                    Role::Server => self.on_request(id, headers, end_stream),
                    Role::Client => self.on_response(id, headers, end_stream),
                },
                Event::Data {
                    id,
                    data,
                    end_stream,
                } => self.on_data(id, data, end_stream),
                Event::Trailers { id, headers } => self.on_trailers(id, headers),
                Event::Reset { id, reason, .. } => {
                    if self.remove_call(id).is_some() {
                        if self.conn.role() == Role::Server {
                            self.conn.release_stream(id);
                        }
                        self.events.push_back(GrpcEvent::Finished {
                            id,
                            status: status_from_reset(reason),
                            message: format!("stream reset: {reason}"),
                            trailers: None,
                        });
                    }
                }
                Event::Writable { id } => self.events.push_back(GrpcEvent::Writable { id }),
                Event::GoAway { reason, debug, .. } => {
                    self.events.push_back(GrpcEvent::GoAway { reason, debug })
                }
            }
        }
    }

    fn on_request(&mut self, id: u32, headers: Headers, end_stream: bool) {
        let method_ok = headers.get(b":method").is_some_and(|m| m == "POST");
        let ct_ok = headers
            .get(b"content-type")
            .is_some_and(|v| v.starts_with(b"application/grpc"));
        if !method_ok || !ct_ok {
            // Not a gRPC request: plain HTTP status (gRPC spec: 415 for a
            // wrong content type), then forget the stream.
            let status = if method_ok { 415 } else { 405 };
            let _ = self.conn.send_headers(id, Headers::response(status), true);
            self.conn.release_stream(id);
            return;
        }
        let timeout = match headers.get(b"grpc-timeout").map(|v| wire::parse_timeout(v)) {
            None => None,
            Some(Ok(t)) => Some(t),
            Some(Err(_)) => {
                self.calls.insert(id, self.new_call());
                let _ = self.finish(id, GrpcStatus::INTERNAL, "malformed grpc-timeout");
                return;
            }
        };
        let path = headers.get(b":path").cloned().unwrap_or_default();
        self.calls.insert(id, self.new_call());
        self.events.push_back(GrpcEvent::Call {
            id,
            path,
            metadata: headers,
            timeout,
        });
        if end_stream {
            self.events.push_back(GrpcEvent::HalfClose { id });
        }
    }

    fn on_response(&mut self, id: u32, headers: Headers, end_stream: bool) {
        let Some(call) = self.calls.get_mut(&id) else {
            return;
        };
        let http = headers.status().unwrap_or(0);
        if end_stream {
            // Trailers-only response (or a non-gRPC error response).
            self.finish_client(id, headers, http);
            return;
        }
        if http != 200 {
            self.fail_call(
                id,
                status_from_http(http),
                format!("unexpected HTTP status {http}"),
            );
            return;
        }
        if !headers
            .get(b"content-type")
            .is_some_and(|v| v.starts_with(b"application/grpc"))
        {
            self.fail_call(
                id,
                GrpcStatus::INTERNAL,
                "response is not application/grpc".into(),
            );
            return;
        }
        call.headers_done = true;
        self.events.push_back(GrpcEvent::ResponseHeaders {
            id,
            metadata: headers,
        });
    }

    fn on_data(&mut self, id: u32, mut data: Bytes, end_stream: bool) {
        let hold_max = (self.conn.local_settings().initial_window_size / 2) as usize;
        let Some(call) = self.calls.get_mut(&id) else {
            // Call already finished locally: give the credit back.
            self.conn.release_capacity(id, data.len());
            return;
        };
        let whole = data.clone();
        loop {
            let before = data.len();
            match call.deframer.next(&mut data) {
                Ok(Some(msg)) => {
                    let consumed = before - data.len();
                    let framed = prefixed_slice(&whole, &msg);
                    // The message owes what it took from this frame and
                    // what its earlier frames left with the deframer.
                    let flow = consumed + std::mem::take(&mut call.held);
                    self.events.push_back(GrpcEvent::Message {
                        id,
                        msg,
                        framed,
                        flow,
                    });
                }
                Ok(None) => {
                    // The rest was buffered (copied) by the deframer: its
                    // credit waits for the message, up to `hold_max`.
                    let consumed = before - data.len();
                    let keep = consumed.min(hold_max.saturating_sub(call.held));
                    call.held += keep;
                    if consumed > keep {
                        self.conn.release_capacity(id, consumed - keep);
                    }
                    break;
                }
                Err(e) => {
                    // Nothing of this frame from the bad message on reaches
                    // the application: its credit goes back now.
                    self.conn.release_capacity(id, before);
                    let status = e.grpc_status();
                    self.fail_call(id, status, e.to_string());
                    return;
                }
            }
            if data.is_empty() {
                break;
            }
        }
        if end_stream {
            self.on_remote_end(id);
        }
    }

    /// Forget a call, returning the credit its partial message held.
    fn remove_call(&mut self, id: u32) -> Option<Call> {
        let call = self.calls.remove(&id)?;
        if call.held > 0 {
            self.conn.release_capacity(id, call.held);
        }
        Some(call)
    }

    fn on_trailers(&mut self, id: u32, headers: Headers) {
        if !self.calls.contains_key(&id) {
            return;
        }
        match self.conn.role() {
            Role::Client => self.finish_client(id, headers, 200),
            Role::Server => self.on_remote_end(id),
        }
    }

    /// The peer ended its side (END_STREAM).
    fn on_remote_end(&mut self, id: u32) {
        let Some(call) = self.calls.get(&id) else {
            return;
        };
        if let Err(e) = call.deframer.finish() {
            self.fail_call(id, e.grpc_status(), e.to_string());
            return;
        }
        match self.conn.role() {
            Role::Server => self.events.push_back(GrpcEvent::HalfClose { id }),
            // A response ending without trailers.
            Role::Client => self.fail_call(
                id,
                GrpcStatus::INTERNAL,
                "server closed the stream without trailers".into(),
            ),
        }
    }

    fn finish_client(&mut self, id: u32, trailers: Headers, http: u16) {
        let Some(call) = self.remove_call(id) else {
            return;
        };
        let (status, message) = match trailers.get(b"grpc-status").map(|v| wire::parse_status(v)) {
            Some(Ok(status)) => {
                let message = trailers
                    .get(b"grpc-message")
                    .map(|m| String::from_utf8_lossy(&wire::decode_status_message(m)).into_owned())
                    .unwrap_or_default();
                (status, message)
            }
            Some(Err(_)) => (GrpcStatus::INTERNAL, "malformed grpc-status".to_owned()),
            None if http != 200 => (
                status_from_http(http),
                format!("unexpected HTTP status {http}"),
            ),
            None => (GrpcStatus::INTERNAL, "missing grpc-status".to_owned()),
        };
        let status = match call.deframer.finish() {
            Err(e) if status == GrpcStatus::OK => {
                self.push_finished(id, e.grpc_status(), e.to_string(), Some(trailers));
                return;
            }
            _ => status,
        };
        self.push_finished(id, status, message, Some(trailers));
    }

    /// End a call because of a local failure: reset the stream and report.
    fn fail_call(&mut self, id: u32, status: GrpcStatus, message: String) {
        if self.remove_call(id).is_none() {
            return;
        }
        match self.conn.role() {
            Role::Client => self.conn.reset_stream(id, Reason::CANCEL),
            Role::Server => {
                // Tell the client why, then forget the stream.
                let trailers = self.status_fields(status, &message, false);
                if self.conn.send_trailers(id, trailers).is_err() {
                    self.conn.reset_stream(id, Reason::CANCEL);
                }
                self.conn.release_stream(id);
            }
        }
        self.push_finished(id, status, message, None);
    }

    fn push_finished(
        &mut self,
        id: u32,
        status: GrpcStatus,
        message: String,
        trailers: Option<Headers>,
    ) {
        self.events.push_back(GrpcEvent::Finished {
            id,
            status,
            message,
            trailers,
        });
    }

    /// The connection failed: every call finishes with UNAVAILABLE.
    fn fail_all(&mut self) {
        let reason = self
            .conn
            .error()
            .map(|e| e.to_string())
            .unwrap_or_else(|| "connection closed".to_owned());
        let mut ids: Vec<u32> = self.calls.keys().copied().collect();
        ids.sort_unstable();
        for id in ids {
            self.remove_call(id);
            self.push_finished(id, GrpcStatus::UNAVAILABLE, reason.clone(), None);
        }
    }
}

/// If `msg` is a slice of `chunk` preceded there by its 5-byte prefix, that
/// prefix and the message as one slice.
fn prefixed_slice(chunk: &Bytes, msg: &Bytes) -> Option<Bytes> {
    let base = chunk.as_ptr() as usize;
    let start = (msg.as_ptr() as usize).checked_sub(base)?;
    let end = start.checked_add(msg.len())?;
    if start < wire::PREFIX_LEN || end > chunk.len() {
        return None;
    }
    Some(chunk.slice(start - wire::PREFIX_LEN..end))
}

/// gRPC status for an HTTP status without `grpc-status` (gRPC spec,
/// "HTTP to gRPC Status Code Mapping").
fn status_from_http(http: u16) -> GrpcStatus {
    match http {
        400 => GrpcStatus::INTERNAL,
        401 => GrpcStatus::UNAUTHENTICATED,
        403 => GrpcStatus::PERMISSION_DENIED,
        404 => GrpcStatus::UNIMPLEMENTED,
        429 | 502..=504 => GrpcStatus::UNAVAILABLE,
        _ => GrpcStatus::UNKNOWN,
    }
}

/// gRPC status for a stream reset (as grpc-go maps RST_STREAM codes).
fn status_from_reset(reason: Reason) -> GrpcStatus {
    match reason {
        Reason::REFUSED_STREAM => GrpcStatus::UNAVAILABLE,
        Reason::CANCEL => GrpcStatus::CANCELLED,
        Reason::ENHANCE_YOUR_CALM => GrpcStatus::RESOURCE_EXHAUSTED,
        Reason::INADEQUATE_SECURITY => GrpcStatus::PERMISSION_DENIED,
        _ => GrpcStatus::INTERNAL,
    }
}

mod invariants;
#[cfg(test)]
mod tests;
