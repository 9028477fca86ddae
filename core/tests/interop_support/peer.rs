//! konn's side of an interop exchange: a [`Handler`] for the gRPC driver
//! that plays either role. On every call it sends the deterministic packet
//! sequence of its direction (paced by the call's send queue, so memory
//! stays bounded however slowly the peer reads) while decoding and checking
//! every packet the peer sends. Results go to a shared [`Calls`] table the
//! test inspects.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;

use bytes::{Bytes, BytesMut};
use konn_core::io::driver::Handler;
use konn_core::io::notify::Notify;
use konn_frames::GrpcStatus;
use konn_frames::packet::Packet;
use konn_protocol::grpc::{Grpc, GrpcEvent};
use konn_protocol::h2::{Headers, Role};

use super::seq::{self, Direction, Method};

/// Stop queueing packets on a call above this many unsent bytes...
const HIGH_WATER: usize = 256 * 1024;
/// ...and resume when the queue has drained to this.
const LOW_WATER: usize = 64 * 1024;

/// Metadata both ends agree on (the Go peer gets the same values as flags).
#[derive(Clone, Debug)]
pub struct Meta {
    /// `agentid`, sent by the client on Connect.
    pub agent_id: &'static str,
    /// `agentidentifiers`, sent by the client on Connect.
    pub agent_identifiers: &'static str,
    /// `serverid`, sent by the server on Connect.
    pub server_id: &'static str,
    /// `servercount`, sent by the server on Connect.
    pub server_count: &'static str,
}

/// One call's progress and outcome.
#[derive(Debug)]
pub struct CallState {
    /// The call's method.
    pub method: Method,
    /// Packets handed to the connection.
    pub sent: u32,
    /// Packets received and verified.
    pub received: u32,
    /// Client: END_STREAM queued. Server: the client half-closed.
    pub half_closed: bool,
    /// Client: the response headers were seen and checked.
    pub headers_checked: bool,
    /// The final status (client: the server's; server: what we sent or why
    /// the call ended).
    pub status: Option<(GrpcStatus, String)>,
    /// The first thing that went wrong, if any.
    pub failure: Option<String>,
}

impl CallState {
    fn new(method: Method) -> Self {
        Self {
            method,
            sent: 0,
            received: 0,
            half_closed: false,
            headers_checked: false,
            status: None,
            failure: None,
        }
    }

    /// The call has ended, one way or another.
    pub fn is_done(&self) -> bool {
        self.status.is_some()
    }
}

/// Every call of a connection by stream id, plus a wake-up for the test.
#[derive(Default)]
pub struct Calls {
    /// By stream id.
    pub calls: RefCell<BTreeMap<u32, CallState>>,
    /// Notified on every event.
    pub wake: Notify,
}

impl Calls {
    /// Checks that exactly `methods` ran, each completed with OK after
    /// `count` packets each way and no failure; describes what did not.
    pub fn check_all_ok(&self, methods: &[Method], count: u32) -> Result<(), String> {
        let calls = self.calls.borrow();
        let mut seen: Vec<Method> = calls.values().map(|c| c.method).collect();
        seen.sort_by_key(|m| *m as u8);
        if seen != methods {
            return Err(format!("expected calls {methods:?}, got {calls:#?}"));
        }
        for (id, c) in calls.iter() {
            let ok = c.failure.is_none()
                && c.status.as_ref().map(|s| s.0) == Some(GrpcStatus::OK)
                && (c.sent, c.received) == (count, count)
                && c.half_closed;
            if !ok {
                return Err(format!(
                    "call {id} ({}) did not complete: {c:#?}",
                    c.method.path()
                ));
            }
        }
        Ok(())
    }

    /// Whether every call has ended and there are `n` of them.
    pub fn all_done(&self, n: usize) -> bool {
        let calls = self.calls.borrow();
        calls.len() == n && calls.values().all(CallState::is_done)
    }
}

/// The interop handler; see the module docs.
pub struct Exchange {
    role: Role,
    count: u32,
    meta: Meta,
    calls: Rc<Calls>,
    scratch: BytesMut,
    corrupt_at: Option<u32>,
}

impl Exchange {
    /// A handler for `role` exchanging `count` packets each way per call.
    pub fn new(role: Role, count: u32, meta: Meta, calls: Rc<Calls>) -> Self {
        Self {
            role,
            count,
            meta,
            calls,
            scratch: BytesMut::new(),
            corrupt_at: None,
        }
    }

    /// Test hook: send outgoing packet `i` of every call altered
    /// ([`seq::corrupt`]), so the peer must report a mismatch.
    pub fn corrupt_at(mut self, i: u32) -> Self {
        self.corrupt_at = Some(i);
        self
    }

    /// The shared call table (for the test to inspect).
    pub fn calls(&self) -> Rc<Calls> {
        self.calls.clone()
    }

    /// Client: start a call of `method` and begin sending.
    pub fn start(&mut self, grpc: &mut Grpc, authority: &str, method: Method) -> u32 {
        let mut md = Headers::new();
        if method == Method::Connect {
            md.push_static("agentid", self.meta.agent_id);
            md.push_static("agentidentifiers", self.meta.agent_identifiers);
        }
        let id = grpc
            .start_call(
                "http",
                Bytes::copy_from_slice(authority.as_bytes()),
                Bytes::from_static(method.path().as_bytes()),
                &md,
            )
            .expect("start_call");
        self.calls
            .calls
            .borrow_mut()
            .insert(id, CallState::new(method));
        self.pump(grpc, id);
        id
    }

    fn out_dir(&self) -> Direction {
        match self.role {
            Role::Client => Direction::ClientToServer,
            Role::Server => Direction::ServerToClient,
        }
    }

    fn in_dir(&self) -> Direction {
        match self.role {
            Role::Client => Direction::ServerToClient,
            Role::Server => Direction::ClientToServer,
        }
    }

    /// Queue packets until the call's send queue is above the high-water
    /// mark; ask for a `Writable` event to continue. A client half-closes
    /// after the last packet.
    fn pump(&mut self, grpc: &mut Grpc, id: u32) {
        let mut calls = self.calls.calls.borrow_mut();
        let Some(call) = calls.get_mut(&id) else {
            return;
        };
        if call.is_done() || call.failure.is_some() {
            return;
        }
        let tag = seq::tag(call.method, self.out_dir());
        while call.sent < self.count && grpc.queued_bytes(id) < HIGH_WATER {
            let mut p = seq::packet(tag, call.sent);
            if self.corrupt_at == Some(call.sent) {
                p = seq::corrupt(p);
            }
            self.scratch.reserve(p.encoded_len() + 5);
            p.encode_grpc(&mut self.scratch);
            if let Err(e) = grpc.send_framed(id, self.scratch.split().freeze()) {
                call.failure
                    .get_or_insert(format!("send packet {}: {e}", call.sent));
                return;
            }
            call.sent += 1;
        }
        if call.sent < self.count {
            grpc.notify_when_drained(id, LOW_WATER);
        } else if self.role == Role::Client && !call.half_closed {
            call.half_closed = true;
            if let Err(e) = grpc.close_send(id) {
                call.failure.get_or_insert(format!("close_send: {e}"));
            }
        }
    }

    /// Decode and check one received message.
    fn receive(&mut self, id: u32, msg: &Bytes) -> Result<(), String> {
        let mut calls = self.calls.calls.borrow_mut();
        let call = calls
            .get_mut(&id)
            .ok_or_else(|| format!("message on unknown call {id}"))?;
        if call.failure.is_some() {
            return Ok(()); // already reported; the call is being ended
        }
        let i = call.received;
        if i >= self.count {
            return Err(format!("packet {i} beyond the expected {}", self.count));
        }
        let got = Packet::decode(msg).map_err(|e| format!("packet {i}: decode failed: {e}"))?;
        let want = seq::packet(seq::tag(call.method, self.in_dir()), i);
        if got != want {
            return Err(format!(
                "packet {i} differs: got {}; want {}",
                seq::describe(&got),
                seq::describe(&want)
            ));
        }
        call.received += 1;
        Ok(())
    }

    /// Record a failure and end the call from our side.
    fn fail(&mut self, grpc: &mut Grpc, id: u32, why: String) {
        let mut calls = self.calls.calls.borrow_mut();
        let Some(call) = calls.get_mut(&id) else {
            return;
        };
        call.failure.get_or_insert(why.clone());
        if call.is_done() {
            return;
        }
        call.status = Some((GrpcStatus::ABORTED, why.clone()));
        match self.role {
            Role::Server => {
                let _ = grpc.finish(id, GrpcStatus::ABORTED, &why);
            }
            Role::Client => grpc.cancel(id),
        }
    }

    /// Server: end the call with OK once everything went both ways.
    fn maybe_finish(&mut self, grpc: &mut Grpc, id: u32) {
        let mut calls = self.calls.calls.borrow_mut();
        let Some(call) = calls.get_mut(&id) else {
            return;
        };
        let complete = call.sent == self.count && call.received == self.count && call.half_closed;
        if self.role == Role::Server && complete && !call.is_done() && call.failure.is_none() {
            call.status = Some((GrpcStatus::OK, String::new()));
            if let Err(e) = grpc.finish(id, GrpcStatus::OK, "") {
                call.failure = Some(format!("finish: {e}"));
            }
        }
    }

    /// Server: check a new call's path and metadata, accept it.
    fn on_call(&mut self, grpc: &mut Grpc, id: u32, path: &[u8], md: &Headers) {
        let Some(method) = Method::from_path(path) else {
            let _ = grpc.finish(id, GrpcStatus::UNIMPLEMENTED, "unknown method");
            let mut st = CallState::new(Method::Proxy);
            st.failure = Some(format!(
                "unexpected call to {}",
                String::from_utf8_lossy(path)
            ));
            st.status = Some((GrpcStatus::UNIMPLEMENTED, String::new()));
            self.calls.calls.borrow_mut().insert(id, st);
            return;
        };
        self.calls
            .calls
            .borrow_mut()
            .insert(id, CallState::new(method));
        let mut headers = Headers::new();
        if method == Method::Connect {
            if let Err(why) = self.check_agent_metadata(md) {
                self.fail(grpc, id, why);
                return;
            }
            headers.push_static("serverid", self.meta.server_id);
            headers.push_static("servercount", self.meta.server_count);
        }
        if let Err(e) = grpc.accept(id, &headers) {
            self.fail(grpc, id, format!("accept: {e}"));
            return;
        }
        self.pump(grpc, id);
    }

    /// Upstream's rules (exactly one `agentid`, at most one
    /// `agentidentifiers`) with the exact values expected.
    fn check_agent_metadata(&self, md: &Headers) -> Result<(), String> {
        exactly_one(md, "agentid", self.meta.agent_id)?;
        exactly_one(md, "agentidentifiers", self.meta.agent_identifiers)
    }

    /// Client: check the response headers of a call.
    fn on_response_headers(&mut self, id: u32, md: &Headers) -> Result<(), String> {
        let mut calls = self.calls.calls.borrow_mut();
        let call = calls
            .get_mut(&id)
            .ok_or_else(|| format!("headers on unknown call {id}"))?;
        call.headers_checked = true;
        if call.method == Method::Connect {
            exactly_one(md, "serverid", self.meta.server_id)?;
            exactly_one(md, "servercount", self.meta.server_count)
        } else if md.get(b"serverid").is_some() || md.get(b"servercount").is_some() {
            Err("Connect headers on a Proxy call".into())
        } else {
            Ok(())
        }
    }

    /// Client: the server ended the call.
    fn on_finished(&mut self, id: u32, status: GrpcStatus, message: String) {
        let mut calls = self.calls.calls.borrow_mut();
        let Some(call) = calls.get_mut(&id) else {
            return;
        };
        if call.is_done() {
            return;
        }
        let problem = if status != GrpcStatus::OK {
            Some(format!("call ended with {status:?}: {message}"))
        } else if self.role == Role::Server {
            // A server hears Finished only when the call ended abnormally
            // (client reset, connection lost) before we finished it.
            Some(format!("call ended early: {message}"))
        } else if call.received != self.count {
            Some(format!(
                "OK status after {} of {} packets",
                call.received, self.count
            ))
        } else if !call.headers_checked {
            Some("OK status without response headers".into())
        } else {
            None
        };
        if let Some(p) = problem {
            call.failure.get_or_insert(p);
        }
        call.status = Some((status, message));
    }
}

/// The header `name` occurs exactly once, with value `want`.
fn exactly_one(md: &Headers, name: &str, want: &str) -> Result<(), String> {
    let values: Vec<&Bytes> = md.get_all(name.as_bytes()).collect();
    match values.as_slice() {
        [v] if v.as_ref() == want.as_bytes() => Ok(()),
        _ => Err(format!("{name}: got {values:?}, want [{want:?}]")),
    }
}

impl Handler<Grpc> for Exchange {
    fn on_event(&mut self, grpc: &mut Grpc, event: GrpcEvent) {
        match event {
            GrpcEvent::Call {
                id, path, metadata, ..
            } => self.on_call(grpc, id, &path, &metadata),
            GrpcEvent::ResponseHeaders { id, metadata } => {
                if let Err(why) = self.on_response_headers(id, &metadata) {
                    self.fail(grpc, id, why);
                }
            }
            GrpcEvent::Message { id, msg, flow, .. } => {
                grpc.release(id, flow);
                match self.receive(id, &msg) {
                    Ok(()) => self.maybe_finish(grpc, id),
                    Err(why) => self.fail(grpc, id, why),
                }
            }
            GrpcEvent::HalfClose { id } => {
                let short = {
                    let mut calls = self.calls.calls.borrow_mut();
                    calls.get_mut(&id).and_then(|c| {
                        c.half_closed = true;
                        (c.received != self.count).then_some(c.received)
                    })
                };
                match short {
                    Some(n) => self.fail(
                        grpc,
                        id,
                        format!("client half-closed after {n} of {} packets", self.count),
                    ),
                    None => self.maybe_finish(grpc, id),
                }
            }
            GrpcEvent::Writable { id } => {
                self.pump(grpc, id);
                self.maybe_finish(grpc, id);
            }
            GrpcEvent::Finished {
                id,
                status,
                message,
                ..
            } => self.on_finished(id, status, message),
            GrpcEvent::GoAway { .. } => {}
        }
        self.calls.wake.notify();
    }
}
