//! The HTTP CONNECT frontend (`--mode=http-connect`), over a Unix socket or
//! TCP with mTLS, with upstream's exact responses:
//!
//! - anything but CONNECT → 405 `this proxy only supports CONNECT passthrough`;
//! - no agent → `HTTP/1.1 500 Internal Server Error … currently no tunnels available: No agent available`;
//! - agent dial error → Go's `http.Response.Write` of the error text with the
//!   status from `mapDialErrorToHTTPStatus` (502/503/504);
//! - success → exactly `HTTP/1.1 200 Connection Established\r\n\r\n`, written
//!   **before** any tunnel byte (upstream can race here; konn cannot: the
//!   response and the data share one ordered writer);
//! - bytes the client sent right after the request head are forwarded first.
//!
//! One task serves one connection. It waits for readability before reading
//! (an idle connection holds no buffer: with TLS, the ciphertext and
//! plaintext buffers are given back once taken whole), reads into a pooled
//! buffer right after room for the DATA packet header (plaintext: no
//! copy), and writes the agent's payloads in order.
//!
//! Flow control (docs/design/tunnel.md): the payloads waiting for the
//! client are this frontend's queue; after every write the router learns
//! its level (`Router::frontend_level`) and decides about the tunnel's
//! credit and PAUSE/RESUME; a client that takes nothing for the stuck
//! timeout is aborted by the router's timer. The socket is not read while
//! the tunnel is congested or the agent paused this connection (PAUSE).
//! A connection whose tunnel is on another worker (one that could not move
//! there) counts the bytes it sent until that worker answers that its
//! tunnel took them (`Msg::FrontendCredit` / `ReleaseFrontend`), and is not
//! read while that count is at the tunnel's high-water mark.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::rc::Rc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use konn_core::io::notify::Notify;
use konn_core::io::runtime::{Either, race};
use konn_core::io::sock;
use konn_core::io::tls::{Plaintext, TlsLayer};
use konn_core::metrics::common::ReverseDirection;
use konn_frames::connect::{self as http, Limits};
use konn_frames::packet::{self, MAX_DATA_PAYLOAD};
use monoio::buf::IoBufMut;
use monoio::io::{AsyncReadRent, AsyncWriteRent, AsyncWriteRentExt};
use monoio::net::{TcpStream, UnixStream};

use crate::cluster::Cluster;
use crate::worker::{FrontendRef, Stop, Worker, bump};
use konn_protocol::server::backends::BackendId;
use konn_protocol::server::router::{FrontendId, FrontendKind};

/// Room in front of a read for the gRPC prefix and the DATA packet header.
const HEADROOM: usize = 32;

/// Client bytes kept while the dial is pending; beyond this the client is
/// not read until the dial ends.
const EARLY_LIMIT: usize = 64 * 1024;

/// Room made for one socket read of a [`Wire`] (a TLS record and more).
const READ_ROOM: usize = 16 * 1024;

/// A CONNECT client's socket.
pub enum Sock {
    /// TCP (with TLS on top).
    Tcp(TcpStream),
    /// A Unix socket (plaintext).
    Unix(UnixStream),
}

impl Sock {
    /// `relaxed` as in [`konn_core::io::sock::ReadReady`].
    async fn readable(&self, relaxed: bool) -> std::io::Result<()> {
        match self {
            Self::Tcp(s) => s.readable(relaxed).await,
            Self::Unix(s) => s.readable(relaxed).await,
        }
    }

    async fn read(
        &mut self,
        buf: BytesMut,
        from: usize,
        to: usize,
    ) -> (std::io::Result<usize>, BytesMut) {
        let (r, slice) = match self {
            Self::Tcp(s) => s.read(buf.slice_mut(from..to)).await,
            Self::Unix(s) => s.read(buf.slice_mut(from..to)).await,
        };
        (r, slice.into_inner())
    }

    fn fd(&self) -> std::os::fd::RawFd {
        use std::os::fd::AsRawFd;
        match self {
            Self::Tcp(s) => s.as_raw_fd(),
            Self::Unix(s) => s.as_raw_fd(),
        }
    }

    /// Waits until the socket has data (or its end) or `wake` fires, then
    /// makes room for `max` bytes in `buf` (only now: a quiet client holds
    /// no buffer) and reads what is there, at most `max` bytes, without
    /// blocking (`sock::recv_now`). No read is in flight while the
    /// task waits, so `wake` coming first cancels nothing. `relaxed` as in
    /// [`konn_core::io::sock::ReadReady`] for the first wait; a stale
    /// readiness makes the next wait exact. `None`: woken, nothing read.
    async fn read_or_wake(
        &self,
        buf: &mut BytesMut,
        max: usize,
        mut relaxed: bool,
        wake: &Notify,
    ) -> Option<std::io::Result<usize>> {
        loop {
            match race(wake.notified(), self.readable(relaxed)).await {
                Either::Left(()) => return None,
                Either::Right(Err(e)) => return Some(Err(e)),
                Either::Right(Ok(())) => {}
            }
            buf.reserve(max);
            match sock::recv_now(self.fd(), buf, max) {
                Some(r) => return Some(r),
                None => relaxed = false,
            }
        }
    }

    async fn write_all(&mut self, data: Bytes) -> std::io::Result<()> {
        let (r, _) = match self {
            Self::Tcp(s) => s.write_all(data).await,
            Self::Unix(s) => s.write_all(data).await,
        };
        r.map(|_| ())
    }

    /// Ends the sending direction before the socket is dropped. Only TCP
    /// needs the call (a FIN ahead of any reset the close may send); a Unix
    /// socket's close, which follows at once, is the peer's end of stream
    /// just as well: one system call less per kube-apiserver dial.
    async fn shutdown(&mut self) {
        if let Self::Tcp(s) = self {
            let _ = s.shutdown().await;
        }
    }
}

/// The router's side of one CONNECT connection (or of one connection the
/// server dialled for the reverse direction).
pub struct ConnectFrontend {
    /// Agent payloads to write to the client, in order.
    queue: RefCell<VecDeque<Bytes>>,
    queued: Cell<usize>,
    /// The agent's connection, once the dial succeeded.
    established: Cell<Option<(BackendId, i64)>>,
    /// The dial failed: this response, then close.
    failure: RefCell<Option<Bytes>>,
    /// Close after writing what is queued.
    closed: Cell<bool>,
    wake: Notify,
    /// The agent paused this connection (PAUSE): do not read the socket.
    paused: Cell<bool>,
    /// Aborted: stop a write in progress.
    killed: Notify,
    /// Bytes sent through a tunnel of another worker that it has not
    /// acknowledged yet.
    unacked: Cell<usize>,
    /// The server's own connection of the reverse direction (its bytes are
    /// counted in konn's reverse metrics).
    reverse: Cell<bool>,
}

impl ConnectFrontend {
    pub(crate) fn new() -> Self {
        Self {
            queue: RefCell::new(VecDeque::new()),
            queued: Cell::new(0),
            established: Cell::new(None),
            failure: RefCell::new(None),
            closed: Cell::new(false),
            wake: Notify::new(),
            paused: Cell::new(false),
            killed: Notify::new(),
            unacked: Cell::new(0),
            reverse: Cell::new(false),
        }
    }

    /// Count this connection's bytes as the reverse direction's.
    pub(crate) fn set_reverse(&self) {
        self.reverse.set(true);
    }

    /// The tunnel's worker took `n` more of the bytes this connection sent.
    pub fn credit_back(&self, n: usize) {
        self.unacked.set(self.unacked.get().saturating_sub(n));
        self.wake.notify();
    }

    /// PAUSE (`true`) or RESUME (`false`) from the agent.
    pub fn set_paused(&self, paused: bool) {
        self.paused.set(paused);
        self.wake.notify();
    }

    /// The dial succeeded.
    pub fn established(&self, backend: BackendId, connect_id: i64) {
        self.established.set(Some((backend, connect_id)));
        self.wake.notify();
    }

    /// Agent payload for the client.
    pub fn push(&self, data: Bytes) {
        self.queued.set(self.queued.get() + data.len());
        self.queue.borrow_mut().push_back(data);
        self.wake.notify();
    }

    /// The dial failed with this response.
    pub fn fail(&self, response: Bytes) {
        *self.failure.borrow_mut() = Some(response);
        self.wake.notify();
    }

    /// The connection ends (agent closed, backend gone).
    pub fn close(&self) {
        self.closed.set(true);
        self.wake.notify();
    }

    /// The server is stopping, or the client stopped reading: drop what is
    /// queued and end now (a write in progress is abandoned).
    pub fn abort(&self) {
        self.queue.borrow_mut().clear();
        self.queued.set(0);
        self.close();
        self.killed.notify();
    }
}

/// A connection's socket with optional TLS, driven by one task.
pub struct Wire {
    sock: Sock,
    /// Boxed: the connection's task keeps the wire in more than one of its
    /// states, and a TLS layer is over a kilobyte.
    tls: Option<Box<TlsLayer>>,
    /// Ciphertext read but not yet taken by TLS.
    cipher: BytesMut,
    /// Plaintext decrypted but not yet consumed.
    plain: BytesMut,
    eof: bool,
    /// The last read filled the room it had: more is most likely waiting,
    /// so the next wait trusts the cached readiness.
    full: bool,
}

impl Wire {
    /// A wire over `sock`, with `tls` for TCP, and bytes already read.
    pub fn new(sock: Sock, tls: Option<Box<TlsLayer>>, plain: BytesMut) -> Self {
        Self {
            sock,
            tls,
            cipher: BytesMut::new(),
            plain,
            eof: false,
            full: false,
        }
    }

    /// Who is at the other end, for the audit log and (with `identity`)
    /// the per-frontend limits (`crate::accounting::{unix_peer,
    /// tcp_peer}`). Once the request head is read, mTLS has named the
    /// client.
    pub fn peer(&self, identity: bool) -> crate::accounting::FrontendPeer {
        match &self.sock {
            Sock::Tcp(t) => {
                crate::accounting::tcp_peer(t.peer_addr().ok(), self.tls.as_deref(), identity)
            }
            Sock::Unix(u) => {
                crate::accounting::unix_peer(std::os::fd::AsRawFd::as_raw_fd(u), identity)
            }
        }
    }

    /// Parts for a migration: socket, TLS state, unread plaintext.
    pub fn into_parts(self) -> (Sock, Option<Box<TlsLayer>>, BytesMut) {
        (self.sock, self.tls, self.plain)
    }

    /// Read more plaintext into `self.plain` (TLS: decrypt; answer handshake
    /// messages). Returns false at EOF.
    async fn fill(&mut self) -> Result<bool, konn_core::Error> {
        match self.fill_or_wake(None).await? {
            Some(more) => Ok(more),
            None => Ok(true),
        }
    }

    /// Like `fill`, but gives up (returning `None`) when `wake` fires first.
    async fn fill_or_wake(
        &mut self,
        wake: Option<&Notify>,
    ) -> Result<Option<bool>, konn_core::Error> {
        if self.eof {
            return Ok(Some(false));
        }
        let into_plain = self.tls.is_none();
        let mut buf = std::mem::take(if into_plain {
            &mut self.plain
        } else {
            &mut self.cipher
        });
        let (r, buf) = match wake {
            Some(w) => {
                let r = self
                    .sock
                    .read_or_wake(&mut buf, READ_ROOM, self.full, w)
                    .await;
                self.full = matches!(r, Some(Ok(n)) if n == READ_ROOM);
                (r, buf)
            }
            None => {
                let len = buf.len();
                buf.reserve(READ_ROOM);
                let cap = buf.capacity();
                let (r, b) = self.sock.read(buf, len, cap).await;
                (Some(r), b)
            }
        };
        *(if into_plain {
            &mut self.plain
        } else {
            &mut self.cipher
        }) = buf;
        let Some(r) = r else { return Ok(None) };
        let n = r.map_err(konn_core::Error::Io)?;
        if into_plain {
            self.eof = n == 0;
            return Ok(Some(n > 0));
        }
        let tls = self.tls.as_mut().expect("checked");
        if n == 0 {
            tls.feed_eof()?;
            self.eof = true;
        }
        loop {
            let used = tls.feed_tls(&self.cipher)?;
            let _ = self.cipher.split_to(used);
            loop {
                match tls.read_plaintext(&mut self.plain)? {
                    Plaintext::Data(_) => {}
                    Plaintext::Empty => break,
                    Plaintext::Eof => {
                        self.eof = true;
                        break;
                    }
                }
            }
            if used == 0 || self.cipher.is_empty() {
                break;
            }
        }
        if self.cipher.is_empty() {
            // Taken whole: give the allocation back, so that a quiet
            // connection holds none (the next read makes room again).
            self.cipher = BytesMut::new();
        }
        self.flush_tls().await?;
        Ok(Some(!self.eof || !self.plain.is_empty()))
    }

    /// Write TLS output (handshake, alerts) the layer has queued.
    async fn flush_tls(&mut self) -> Result<(), konn_core::Error> {
        let Some(tls) = self.tls.as_mut() else {
            return Ok(());
        };
        let mut out = BytesMut::new();
        tls.take_tls(&mut out);
        if !out.is_empty() {
            self.sock
                .write_all(out.freeze())
                .await
                .map_err(konn_core::Error::Io)?;
        }
        Ok(())
    }

    /// Write bytes to the client.
    async fn send(&mut self, data: Bytes) -> Result<(), konn_core::Error> {
        let Some(tls) = self.tls.as_mut() else {
            return self
                .sock
                .write_all(data)
                .await
                .map_err(konn_core::Error::Io);
        };
        let _ = tls;
        let mut rest = &data[..];
        while !rest.is_empty() {
            let n = self.tls.as_mut().expect("checked").write_plaintext(rest)?;
            rest = &rest[n..];
            self.flush_tls().await?;
            if n == 0 {
                return Err(konn_core::Error::TlsWriteAfterClose);
            }
        }
        Ok(())
    }

    pub(crate) async fn close(&mut self) {
        if let Some(tls) = self.tls.as_mut() {
            tls.send_close_notify();
            let _ = monoio::time::timeout(Duration::from_secs(1), self.flush_tls()).await;
        }
        self.sock.shutdown().await;
    }
}

/// Why the request phase ended.
pub enum Head {
    /// A CONNECT to this address; the wire holds any bytes after the head.
    Connect(String),
    /// Answered (405, 400, 431…) or the client left.
    Done,
}

/// Read and parse the request head (bounded by the header timeout).
pub async fn read_head(wire: &mut Wire, timeout: Duration) -> Head {
    let limits = Limits::default();
    let deadline = monoio::time::Instant::now() + timeout;
    loop {
        match http::parse_request(&wire.plain, &limits) {
            Ok(Some((req, used))) => {
                if req.method != "CONNECT" {
                    let body = "this proxy only supports CONNECT passthrough\n";
                    let resp = format!(
                        "HTTP/1.1 405 Method Not Allowed\r\nContent-Type: text/plain; charset=utf-8\r\nX-Content-Type-Options: nosniff\r\nContent-Length: {}\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = wire.send(Bytes::from(resp)).await;
                    return Head::Done;
                }
                let target = req.target.to_owned();
                let _ = wire.plain.split_to(used);
                return Head::Connect(target);
            }
            Ok(None) => {}
            Err(
                konn_frames::Error::ConnectHeadTooLarge { .. }
                | konn_frames::Error::ConnectTooManyHeaders { .. },
            ) => {
                let _ = wire
                    .send(Bytes::from_static(
                        b"HTTP/1.1 431 Request Header Fields Too Large\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n431 Request Header Fields Too Large",
                    ))
                    .await;
                return Head::Done;
            }
            Err(_) => {
                let _ = wire
                    .send(Bytes::from_static(
                        b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n400 Bad Request",
                    ))
                    .await;
                return Head::Done;
            }
        }
        match monoio::time::timeout_at(deadline, wire.fill()).await {
            Ok(Ok(true)) => {}
            _ => return Head::Done, // EOF, error or header timeout
        }
    }
}

/// Serve a CONNECT whose head was read on this core (or moved here):
/// dial, relay, close.
pub async fn serve_connect(
    worker: Rc<Worker>,
    cluster: Rc<Cluster>,
    mut wire: Wire,
    target: String,
) {
    let fid = worker.next_id();
    let cf = Rc::new(ConnectFrontend::new());
    let weak = Rc::downgrade(&cf);
    cluster.track(
        &worker,
        fid,
        Box::new(move |how| {
            // CONNECT has no GOAWAY: a graceful stop lets it finish.
            if let (Stop::Now, Some(cf)) = (how, weak.upgrade()) {
                cf.abort();
            }
        }),
    );
    cluster
        .router
        .borrow_mut()
        .frontend_opened(fid, FrontendKind::HttpConnect);
    if let Some(identity) = crate::accounting::peer_wanted(&worker, &cluster) {
        wire.peer(identity)
            .describe(&mut cluster.router.borrow_mut(), fid);
    }
    cluster
        .frontends
        .borrow_mut()
        .insert(fid, FrontendRef::Connect(cf.clone()));
    bump(&worker.shared.http_connections, true);
    cluster.metrics.http_connections().inc();
    tracing::debug!(frontend = fid, target = &*target, "CONNECT request");
    let random = worker.random();
    let dial = worker.dial_random();
    crate::overload::before_dial(&cluster);
    cluster.router.borrow_mut().connect_request(
        konn_core::io::clock::now(),
        fid,
        &target,
        dial,
        random,
    );
    cluster.apply(&worker);
    cluster.publish(&worker);
    relay(&worker, &cluster, fid, &cf, &mut wire).await;
    // Whatever happened, the router forgets this frontend (idempotent).
    cluster.frontends.borrow_mut().remove(&fid);
    cluster.router.borrow_mut().frontend_gone(fid);
    cluster.apply(&worker);
    cluster.publish(&worker);
    wire.close().await;
    cluster.untrack(&worker, fid);
    bump(&worker.shared.http_connections, false);
    cluster.metrics.http_connections().dec();
}

async fn relay(
    worker: &Worker,
    cluster: &Cluster,
    fid: FrontendId,
    cf: &ConnectFrontend,
    wire: &mut Wire,
) {
    // While the dial is pending (bounded by the router's dial deadline),
    // watch the client: a client that leaves ends the dial (as upstream,
    // whose handler returns when the client closes first), and bytes it
    // sends early are kept, up to EARLY_LIMIT, for after the 200.
    let (backend, connect_id) = loop {
        let failure = cf.failure.borrow_mut().take();
        if let Some(resp) = failure {
            let _ = wire.send(resp).await;
            return;
        }
        // Established before closed: a destination that answers and
        // closes at once (DIAL_RSP, DATA, CLOSE_RSP in one read) still
        // gets its 200 and every byte before the close.
        if let Some(e) = cf.established.get() {
            break e;
        }
        if cf.closed.get() {
            return;
        }
        if wire.plain.len() >= EARLY_LIMIT {
            cf.wake.notified().await;
            continue;
        }
        match wire.fill_or_wake(Some(&cf.wake)).await {
            Ok(None) => {}
            Ok(Some(_)) if !wire.eof => {}
            Ok(Some(_)) | Err(_) => return, // client gone: frontend_gone cancels the dial
        }
    };
    if wire
        .send(Bytes::from_static(http::ESTABLISHED))
        .await
        .is_err()
    {
        return;
    }
    relay_established(worker, cluster, fid, cf, wire, (backend, connect_id)).await;
}

/// Relay an established connection until either side ends it: agent
/// payloads to the socket in order, socket reads to the agent as DATA,
/// with the flow control of the module docs. Also serves the server's own
/// connections of the reverse direction (`crate::reverse`).
pub(crate) async fn relay_established(
    worker: &Worker,
    cluster: &Cluster,
    fid: FrontendId,
    cf: &ConnectFrontend,
    wire: &mut Wire,
    (backend, connect_id): (BackendId, i64),
) {
    // Client bytes that came with the request head go first.
    while !wire.plain.is_empty() {
        let n = wire.plain.len().min(MAX_DATA_PAYLOAD);
        let chunk = wire.plain.split_to(n);
        send_data(
            worker,
            cluster,
            cf,
            (fid, backend, connect_id),
            &chunk,
            None,
        );
    }
    // The buffer the head was read into: a quiet connection keeps none.
    wire.plain = BytesMut::new();
    // The last read filled its buffer (see `ReadReady` on `relaxed`).
    let mut full = false;
    loop {
        // Agent → client, in order, each write bounded.
        let next = cf.queue.borrow_mut().pop_front();
        if let Some(data) = next {
            let len = data.len();
            // Bounded by the router's stuck timer, which aborts.
            match race(wire.send(data), cf.killed.notified()).await {
                Either::Left(Ok(())) => {
                    if cf.reverse.get() {
                        cluster
                            .metrics
                            .reverse_bytes(ReverseDirection::ToControlPlane)
                            .add(len as u64);
                    }
                    cf.queued.set(cf.queued.get().saturating_sub(len));
                    let level = cf.queued.get();
                    cluster.router.borrow_mut().frontend_level(
                        konn_core::io::clock::now(),
                        fid,
                        level,
                    );
                    cluster.apply(worker);
                    continue;
                }
                Either::Left(Err(_)) | Either::Right(()) => return,
            }
        }
        if cf.closed.get() {
            return;
        }
        // Client → agent, paused while the tunnel is congested or the
        // agent paused this connection.
        if cf.paused.get() {
            cf.wake.notified().await;
            continue;
        }
        if cf.unacked.get() >= worker.settings.tunnel_high_water {
            cf.wake.notified().await;
            continue;
        }
        if cluster.congested(worker, backend) {
            let drained = cluster
                .backends
                .borrow()
                .get(&backend)
                .map(|b| b.drained.clone());
            let drained = async {
                if let Some(d) = drained {
                    d.wait().await;
                }
            };
            race(cf.wake.notified(), drained).await;
            continue;
        }
        if wire.tls.is_none() {
            // Plaintext: wait for data first (an idle connection holds no
            // buffer), then read what is there, without blocking, straight
            // into a pooled buffer after the headroom; agent data arriving
            // meanwhile is served first.
            if let Either::Left(()) = race(cf.wake.notified(), wire.sock.readable(full)).await {
                continue;
            }
            // The budget stayed used up for the pool's deadline: end as
            // on a read error.
            let Ok(mut buf) = worker.pool.acquire().await else {
                return;
            };
            buf.resize(HEADROOM, 0);
            match sock::recv_now(wire.sock.fd(), &mut buf, MAX_DATA_PAYLOAD) {
                None => {
                    // The readiness was stale: ask the kernel next time.
                    full = false;
                    continue;
                }
                Some(Ok(n)) if n > 0 => {
                    full = n == MAX_DATA_PAYLOAD;
                    send_data(
                        worker,
                        cluster,
                        cf,
                        (fid, backend, connect_id),
                        &[],
                        Some((buf, n)),
                    );
                }
                Some(_) => return, // client EOF or error: CLOSE_REQ via frontend_gone
            }
        } else {
            match wire.fill_or_wake(Some(&cf.wake)).await {
                Ok(None) => {}
                Ok(Some(more)) => {
                    while !wire.plain.is_empty() {
                        let n = wire.plain.len().min(MAX_DATA_PAYLOAD);
                        let chunk = wire.plain.split_to(n);
                        send_data(
                            worker,
                            cluster,
                            cf,
                            (fid, backend, connect_id),
                            &chunk,
                            None,
                        );
                    }
                    // Every chunk was copied: a quiet connection keeps no
                    // plaintext buffer either.
                    wire.plain = BytesMut::new();
                    if !more || wire.eof {
                        return;
                    }
                }
                Err(_) => return,
            }
        }
    }
}

/// Frame client bytes as a DATA packet and hand them to the router: either
/// a copy of `data`, or a pooled buffer holding `n` bytes after HEADROOM
/// (built in place, no copy). Bytes for a tunnel of another worker are
/// counted until it acknowledges them.
fn send_data(
    worker: &Worker,
    cluster: &Cluster,
    cf: &ConnectFrontend,
    (fid, backend, connect_id): (FrontendId, BackendId, i64),
    data: &[u8],
    pooled: Option<(BytesMut, usize)>,
) {
    let payload = pooled.as_ref().map_or(data.len(), |(_, n)| *n);
    let framed = match pooled {
        Some((mut buf, n)) => {
            let hl = packet::data_header_len(connect_id, n);
            let start = HEADROOM - hl;
            packet::encode_data_header(connect_id, n, &mut &mut buf[start..HEADROOM]);
            buf.freeze().slice(start..HEADROOM + n)
        }
        None => {
            let mut b = BytesMut::with_capacity(data.len() + HEADROOM);
            packet::encode_data_header(connect_id, data.len(), &mut b);
            b.extend_from_slice(data);
            b.freeze()
        }
    };
    let len = framed.len();
    if cf.reverse.get() {
        cluster
            .metrics
            .reverse_bytes(ReverseDirection::ToNode)
            .add(payload as u64);
    }
    if cluster
        .router
        .borrow_mut()
        .connect_data(fid, framed, payload)
    {
        worker.forwarding.set(packet::PacketType::Data);
        cluster.apply(worker);
        if cluster.credit_via_tunnel(worker, fid, backend, len) {
            cf.unacked.set(cf.unacked.get() + len);
        }
    }
}
