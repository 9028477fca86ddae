//! A Konnectivity frontend client in the shape of upstream's
//! `konnectivity-client`: one HTTP/2 connection to proxy-server's frontend
//! (Unix socket, or TCP with mTLS), one `/ProxyService/Proxy` call per
//! dial, `DIAL_REQ` → `DIAL_RSP`, then `DATA` both ways and `CLOSE_REQ` →
//! `CLOSE_RSP`. Used by the demo, process-level tests and benchmarks; it
//! runs on a monoio runtime.
//!
//! Flow control is end to end: a received message's HTTP/2 credit goes
//! back only when the caller takes its bytes with [`Tunnel::read`], and
//! [`Tunnel::write`] waits while more than [`SEND_QUEUE_LIMIT`] bytes are
//! queued on the call.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::path::Path;
use std::rc::Rc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use konn_core::io::driver::{ConnHandle, DriverConfig, Handler};
use konn_core::io::notify::Notify;
use konn_core::io::runtime::{Either, race};
use konn_core::io::tls::ClientTls;
use konn_frames::packet::{ByteStr, Packet};
use konn_protocol::grpc::{Grpc, GrpcEvent};
use konn_protocol::h2::{Config, Connection, Headers, Role};

use crate::Error;

/// Bytes a call may have queued for sending before [`Tunnel::write`] waits.
pub const SEND_QUEUE_LIMIT: usize = 256 * 1024;

/// Largest DATA payload per packet: the message plus its prefixes fits one
/// 16 KiB HTTP/2 frame, as konn's own sides send.
pub const MAX_DATA: usize = 16 * 1024 - 64;

/// The `:path` of upstream's proxy service.
const PROXY_PATH: &str = "/ProxyService/Proxy";

/// One call's receive side, shared between the handler and its [`Tunnel`].
#[derive(Default)]
struct CallState {
    inbox: RefCell<VecDeque<(Packet, usize)>>,
    finished: RefCell<Option<String>>,
    wake: Notify,
    writable: Notify,
}

#[derive(Default)]
struct FrontendHandler {
    calls: HashMap<u32, Rc<CallState>>,
    closed: Rc<Cell<bool>>,
}

impl Handler<Grpc> for FrontendHandler {
    fn on_event(&mut self, grpc: &mut Grpc, event: GrpcEvent) {
        match event {
            GrpcEvent::Message { id, msg, flow, .. } => match self.calls.get(&id) {
                Some(call) => match Packet::decode(&msg) {
                    Ok(p) => {
                        call.inbox.borrow_mut().push_back((p, flow));
                        call.wake.notify();
                    }
                    Err(e) => {
                        grpc.release(id, flow);
                        *call.finished.borrow_mut() = Some(format!("undecodable packet: {e}"));
                        call.wake.notify();
                        grpc.cancel(id);
                    }
                },
                None => grpc.release(id, flow),
            },
            GrpcEvent::Finished { id, message, .. } => {
                if let Some(call) = self.calls.remove(&id) {
                    *call.finished.borrow_mut() = Some(message);
                    call.wake.notify();
                    call.writable.notify();
                }
            }
            GrpcEvent::Writable { id } => {
                if let Some(call) = self.calls.get(&id) {
                    call.writable.notify();
                }
            }
            _ => {}
        }
    }

    fn on_close(&mut self, _grpc: &mut Grpc, error: Option<&konn_core::Error>) {
        self.closed.set(true);
        for (_, call) in self.calls.drain() {
            let mut f = call.finished.borrow_mut();
            if f.is_none() {
                *f = Some(error.map_or_else(|| "connection closed".into(), |e| e.to_string()));
            }
            call.wake.notify();
            call.writable.notify();
        }
    }
}

/// One HTTP/2 connection to a proxy-server frontend. End it with
/// [`GrpcFrontend::close`] before the runtime stops: a connection task
/// still pending when a monoio runtime is dropped is never freed, and
/// neither is its socket.
pub struct GrpcFrontend {
    h: ConnHandle<Grpc, FrontendHandler>,
    task: monoio::task::JoinHandle<Result<(), konn_core::Error>>,
    closed: Rc<Cell<bool>>,
    next_random: Cell<i64>,
}

/// A fresh dial id for a new connection. konnectivity-client draws each
/// one at random (`rand.Int63()`), and proxy-server keys pending dials by
/// it across all frontends, so two connections must not count from the
/// same start.
fn first_random() -> i64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::UNIX_EPOCH
        .elapsed()
        .map_or(0, |d| d.as_nanos() as u64);
    // splitmix64 of a per-process sequence, time and pid.
    let mut z = NEXT
        .fetch_add(1, Ordering::Relaxed)
        .wrapping_add(nanos)
        .wrapping_add(u64::from(std::process::id()) << 32)
        .wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    // Positive, non-zero, with room to count up (Int63 range).
    ((z >> 2) | 1) as i64
}

/// How long [`GrpcFrontend::close`] waits for a graceful end.
const CLOSE_WAIT: Duration = Duration::from_secs(2);

impl GrpcFrontend {
    fn start<IO>(io: IO, tls: Option<konn_core::io::tls::TlsLayer>) -> Self
    where
        IO: monoio::io::Splitable + 'static,
        IO::OwnedRead: monoio::io::AsyncReadRent + konn_core::io::sock::ReadReady + 'static,
        IO::OwnedWrite: monoio::io::AsyncWriteRent + 'static,
    {
        let handler = FrontendHandler::default();
        let closed = handler.closed.clone();
        let grpc = Grpc::new(
            Connection::new(Config::new(Role::Client), konn_core::io::clock::now()),
            konn_frames::grpc::DEFAULT_MAX_RECV_MESSAGE_SIZE,
        );
        let h = ConnHandle::new(grpc, tls, handler, DriverConfig::default());
        let run = h.clone();
        let task = monoio::spawn(async move { run.run(io).await });
        Self {
            h,
            task,
            closed,
            next_random: Cell::new(first_random()),
        }
    }

    /// Connect over a Unix socket (`--uds-name`).
    pub async fn connect_unix(path: &Path) -> Result<Self, Error> {
        let sock = monoio::net::UnixStream::connect(path)
            .await
            .map_err(konn_core::Error::Io)?;
        Ok(Self::start(sock, None))
    }

    /// Connect over TCP with TLS (`--server-port` with `--server-cert`).
    pub async fn connect_tls(addr: &str, tls: &ClientTls) -> Result<Self, Error> {
        let sock = monoio::net::TcpStream::connect(addr)
            .await
            .map_err(konn_core::Error::Io)?;
        Ok(Self::start(sock, Some(tls.layer()?)))
    }

    /// Open a Proxy call and dial `address` (`host:port`) through the
    /// tunnel, waiting up to `timeout` for the agent's answer.
    pub async fn dial(&self, address: &str, timeout: Duration) -> Result<Tunnel, Error> {
        if self.closed.get() {
            return Err(Error::Closed("connection closed".into()));
        }
        let call = Rc::new(CallState::default());
        let id = self
            .h
            .with(|g, handler| -> Result<u32, konn_core::Error> {
                let id = g.start_call(
                    "http",
                    Bytes::from_static(b"konnectivity"),
                    Bytes::from_static(PROXY_PATH.as_bytes()),
                    &Headers::new(),
                )?;
                handler.calls.insert(id, call.clone());
                Ok(id)
            })??;
        let random = self.next_random.get();
        self.next_random.set(random.wrapping_add(1));
        let tunnel = Tunnel {
            h: self.h.clone(),
            id,
            connect_id: 0,
            call,
            pending: RefCell::new(None),
            eof: Cell::new(false),
            close_error: RefCell::new(None),
        };
        tunnel.send(&Packet::DialReq {
            protocol: ByteStr::from_static("tcp"),
            address: ByteStr::from(address.to_owned()),
            random,
        })?;
        let deadline = monoio::time::Instant::now() + timeout;
        match tunnel.next_packet(deadline, "DIAL_RSP").await? {
            Packet::DialRsp {
                error, connect_id, ..
            } if error.is_empty() => Ok(Tunnel {
                connect_id,
                ..tunnel
            }),
            Packet::DialRsp { error, .. } => {
                // The call is over (konnectivity-client closes its tunnel).
                let _ = tunnel.h.with(|g, _| g.close_send(tunnel.id));
                Err(Error::DialFailed(error.to_string()))
            }
            other => Err(Error::Protocol(format!("expected DIAL_RSP, got {other:?}"))),
        }
    }

    /// Cut the connection at once, as a kube-apiserver that dies would:
    /// no CLOSE_REQ, no GOAWAY; waits until its task has ended.
    pub async fn abort(self) {
        self.h.abort();
        let _ = self.task.await;
    }

    /// Close the connection and wait until its task has ended (GOAWAY
    /// first; after [`CLOSE_WAIT`] the connection is cut).
    pub async fn close(self) {
        self.h.shutdown();
        let mut task = std::pin::pin!(self.task);
        if let Either::Right(()) = race(task.as_mut(), monoio::time::sleep(CLOSE_WAIT)).await {
            self.h.abort();
            let _ = task.await;
        }
    }
}

/// One dialled connection through the tunnel.
pub struct Tunnel {
    h: ConnHandle<Grpc, FrontendHandler>,
    id: u32,
    connect_id: i64,
    call: Rc<CallState>,
    pending: RefCell<Option<Bytes>>,
    eof: Cell<bool>,
    close_error: RefCell<Option<String>>,
}

impl Tunnel {
    /// The connection id the server assigned.
    pub fn connect_id(&self) -> i64 {
        self.connect_id
    }

    /// The error text of the `CLOSE_RSP` that ended the connection (empty
    /// for a clean close); `None` before [`Tunnel::read`] saw one.
    pub fn close_error(&self) -> Option<String> {
        self.close_error.borrow().clone()
    }

    fn send(&self, p: &Packet) -> Result<(), Error> {
        let mut b = BytesMut::new();
        p.encode_grpc(&mut b);
        Ok(self.h.with(|g, _| g.send_framed(self.id, b.freeze()))??)
    }

    fn closed_reason(&self) -> Option<String> {
        self.call.finished.borrow().clone()
    }

    async fn next_packet(
        &self,
        deadline: monoio::time::Instant,
        what: &'static str,
    ) -> Result<Packet, Error> {
        loop {
            if let Some((p, flow)) = self.call.inbox.borrow_mut().pop_front() {
                let _ = self.h.with(|g, _| g.release(self.id, flow));
                return Ok(p);
            }
            if let Some(reason) = self.closed_reason() {
                return Err(Error::Closed(reason));
            }
            if let Either::Right(()) = race(
                self.call.wake.notified(),
                monoio::time::sleep_until(deadline),
            )
            .await
            {
                return Err(Error::Timeout(what));
            }
        }
    }

    /// Send `data`, split into packets of at most [`MAX_DATA`] bytes;
    /// waits while the call's send queue is over [`SEND_QUEUE_LIMIT`].
    pub async fn write(&self, data: &[u8]) -> Result<(), Error> {
        for chunk in data.chunks(MAX_DATA) {
            loop {
                if let Some(reason) = self.closed_reason() {
                    return Err(Error::Closed(reason));
                }
                let queued = self.h.with(|g, _| {
                    let q = g.queued_bytes(self.id);
                    if q > SEND_QUEUE_LIMIT {
                        g.notify_when_drained(self.id, SEND_QUEUE_LIMIT / 2);
                    }
                    q
                })?;
                if queued <= SEND_QUEUE_LIMIT {
                    break;
                }
                self.call.writable.notified().await;
            }
            self.send(&Packet::Data {
                connect_id: self.connect_id,
                error: ByteStr::new(),
                data: Bytes::copy_from_slice(chunk),
            })?;
        }
        Ok(())
    }

    /// The next bytes from the destination; `Ok(None)` once the server
    /// closed the connection (`CLOSE_RSP`; the call is then ended, and
    /// [`Tunnel::close_error`] says why). Waits at most `timeout`.
    pub async fn read(&self, timeout: Duration) -> Result<Option<Bytes>, Error> {
        if let Some(b) = self.pending.borrow_mut().take() {
            return Ok(Some(b));
        }
        if self.eof.get() {
            return Ok(None);
        }
        let deadline = monoio::time::Instant::now() + timeout;
        loop {
            match self.next_packet(deadline, "data").await? {
                Packet::Data { data, error, .. } => {
                    if !error.is_empty() {
                        return Err(Error::Closed(error.to_string()));
                    }
                    if !data.is_empty() {
                        return Ok(Some(data));
                    }
                }
                Packet::CloseRsp { error, .. } => {
                    // The connection is over: end the call, as
                    // konnectivity-client ends its tunnel on CLOSE_RSP
                    // (the server keeps the stream until then).
                    self.eof.set(true);
                    *self.close_error.borrow_mut() = Some(error.to_string());
                    let _ = self.h.with(|g, _| g.close_send(self.id));
                    return Ok(None);
                }
                other => {
                    return Err(Error::Protocol(format!("unexpected packet {other:?}")));
                }
            }
        }
    }

    /// Read exactly `n` bytes (or fewer if the connection closes first).
    pub async fn read_exact(&self, n: usize, timeout: Duration) -> Result<Vec<u8>, Error> {
        let mut out = Vec::with_capacity(n);
        while out.len() < n {
            match self.read(timeout).await? {
                Some(mut b) => {
                    let take = (n - out.len()).min(b.len());
                    out.extend_from_slice(&b[..take]);
                    if take < b.len() {
                        *self.pending.borrow_mut() = Some(b.split_off(take));
                    }
                }
                None => break,
            }
        }
        Ok(out)
    }

    /// Read until the server closes the connection.
    pub async fn read_to_end(&self, timeout: Duration) -> Result<Vec<u8>, Error> {
        let mut out = Vec::new();
        while let Some(b) = self.read(timeout).await? {
            out.extend_from_slice(&b);
        }
        Ok(out)
    }

    /// Send `CLOSE_REQ` and wait for `CLOSE_RSP` (data still in flight is
    /// discarded), then end the call.
    pub async fn close(self, timeout: Duration) -> Result<(), Error> {
        if !self.eof.get() && self.closed_reason().is_none() {
            self.send(&Packet::CloseReq {
                connect_id: self.connect_id,
            })?;
            let deadline = monoio::time::Instant::now() + timeout;
            loop {
                match self.next_packet(deadline, "CLOSE_RSP").await {
                    Ok(Packet::CloseRsp { .. }) => break,
                    Ok(_) => continue,
                    Err(Error::Closed(_)) => break,
                    Err(e) => return Err(e),
                }
            }
        }
        let _ = self.h.with(|g, _| g.close_send(self.id));
        Ok(())
    }
}
