//! The connection driver: runs one sans-IO [`Session`] — a [`Grpc`]
//! connection, or a bare HTTP/2 [`Connection`] — (optionally under a sans-IO
//! [`TlsLayer`]) on a monoio socket.
//!
//! ```text
//!            ┌──────────── reader task ────────────┐
//!  socket ──►│ read → TLS feed → plaintext → session.handle_input → events ──► Handler
//!            └───────────────────────────────────────┘        │
//!            ┌──────────── writer task ────────────┐          ▼ commands (send, release, …)
//!  socket ◄──│ write ◄ TLS encrypt ◄ session.poll_transmit ◄─────┘   via ConnHandle::with
//!            └───────────────────────────────────────┘
//!            deadline (the thread's timer, `io::timers`): session timers at
//!            poll_timeout, TLS handshake, write timeout, idle buffer release
//! ```
//!
//! Both tasks run on the connection's core and share one [`Conn`] through
//! `Rc`; they wake each other with [`Notify`]. The connection's deadlines
//! are one [`Deadline`] on the thread's timer, which calls back into the
//! connection when it passes: no timer task and no 640-byte monoio timer
//! per connection. The handler is called
//! synchronously for every event with `&mut` session, so it can answer at once;
//! other tasks (e.g. the agent's destination sockets) reach the connection
//! through a [`ConnHandle`].
//!
//! **Re-entrancy rule.** `ConnHandle::with` must not be called for a
//! connection from inside that same connection's handler (the state is
//! already borrowed); it reports [`Error::Usage`] instead of panicking.
//!
//! **Deadlines.** Every wait is bounded: the TLS handshake
//! ([`DriverConfig::handshake_timeout`]), the peer's HTTP/2 preface and
//! first SETTINGS ([`DriverConfig::preface_timeout`], counted from accept,
//! so it bounds a peer stalling anywhere before its first frame), a
//! connection without streams ([`DriverConfig::idle_timeout`]: GOAWAY),
//! each socket write ([`DriverConfig::write_timeout`]: a peer that stops
//! reading — a zero window or a full socket buffer — is disconnected),
//! keepalive PINGs, the wait for a read buffer while the memory budget is
//! used up (`PoolConfig::acquire_timeout`). The HTTP/2 machine keeps the
//! preface, idle and keepalive timers; the driver runs them. Reads of a
//! live connection wait for the peer indefinitely, which is the
//! keepalive's job to bound.
//!
//! **TLS alerts.** When TLS fails (a client certificate from an unknown CA,
//! none where one is required, …) the alert rustls queued is written
//! before the socket is shut, so the peer learns why.
//!
//! **Buffers.** Received bytes land in buffers of the worker's pool
//! ([`super::pool::current`]): the socket's bytes directly for plaintext
//! connections, the decrypted plaintext under TLS (the ciphertext only
//! passes through a working buffer). The session hands out DATA payloads
//! as slices of those buffers, so every received byte that waits in a
//! queue is counted against the global memory budget, and a connection
//! that cannot get a buffer stops reading — its peer is pushed back by TCP
//! — while the others go on. An idle connection holds no read buffer.
//! Under the io_uring engine the socket runs on the worker's data ring
//! ([`super::uring`]) when it has one: the kernel picks the pooled buffer
//! of every receive, and the reader joins or decrypts the chunks it gets.
//!
//! **Back-pressure.** The reader stops reading while the HTTP/2 machine has
//! too many control replies queued ([`Connection::wants_read`]) and resumes
//! when the writer has flushed them.
//!
//! **Fairness.** A connection yields to the worker's other tasks after
//! [`READS_PER_TURN`] reads, so one busy tunnel cannot keep a core from
//! its other connections (under epoll, reads of a ready socket complete
//! without yielding).
//!
//! **Timers.** Input and commands usually only move the keepalive deadline
//! later; the connection's [`Deadline`] is moved only when a deadline comes
//! sooner than the one it is armed for (a later one is found when it
//! expires).

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::time::Duration;

use bytes::{Buf, BytesMut};
use konn_protocol::h2::Payloads;
use monoio::buf::IoBufMut;
use monoio::io::{AsyncReadRent, AsyncWriteRent, AsyncWriteRentExt, Split, Splitable};

use super::notify::Notify;
use super::pool::{BUF_CAPACITY, BufPool, LARGE_BUF_CAPACITY, Size};
use super::runtime::{Either, race};
use super::sock::ReadReady;
use super::timers::{Deadline, Expire};
use super::tls::{Plaintext, TlsLayer};
use super::uring::{self, Received, RingRead, RingStream, RingWrite};
use crate::Error;

mod session;
pub use session::{Handler, Session};

/// How much TLS ciphertext to read per read call.
const READ_CHUNK: usize = 64 * 1024;

/// How much TLS ciphertext to read after a read that filled its room (a
/// bulk transfer: more is waiting); the same as the writer's batch
/// ([`DriverConfig::max_write_batch`]), so a peer's large writes are taken
/// in one call. On one thread a loopback hop in 256 KiB calls costs the
/// kernel about a fifth less per byte than in 64 KiB calls
/// (`bench/benches/loopback.rs`); across processes the plain relays of
/// `konn-bench floor` found the opposite, but konn itself with both at
/// 128 KiB spent 21 % more kernel time per GB on S1 (docs/BENCHMARKS.md,
/// "The kernel's floor of the bulk cells").
const BULK_READ_CHUNK: usize = 256 * 1024;

/// Reads one connection may do before it lets the worker's other tasks
/// run (fairness, docs/design/limits.md). Under epoll a read of a socket
/// with data waiting completes without yielding, so a tunnel whose peer
/// always has more to send would otherwise keep its core until its socket
/// ran dry; io_uring yields on every read anyway. 16 reads are at most
/// 1 MiB of TLS ciphertext or 16 pooled buffers of plaintext per turn.
pub const READS_PER_TURN: u32 = 16;

/// Room below which a pooled read buffer is replaced (see
/// `Conn::make_room`): reads never shrink below this.
const MIN_READ_ROOM: usize = 2048;

/// Initial size of the writer's buffers.
const WRITE_CHUNK: usize = 64 * 1024;

/// A writer idle this long gives its buffers back (the next output
/// allocates them again), so an idle connection costs only its protocol
/// state. Not at once: regrowing them for every burst costs ~10 % more
/// instructions per MB (measured with `konn-bench icount`).
const IDLE_RELEASE: Duration = Duration::from_secs(1);

/// Driver settings.
#[derive(Clone, Copy, Debug)]
pub struct DriverConfig {
    /// Close the connection when one socket write makes no complete progress
    /// for this long (slow-reader / zero-window defence).
    pub write_timeout: Duration,
    /// Close the connection when the TLS handshake takes longer.
    pub handshake_timeout: Duration,
    /// Bytes of HTTP/2 output gathered per socket write.
    pub max_write_batch: usize,
    /// Close a connection whose peer has not completed its HTTP/2 preface
    /// and first SETTINGS (after TLS, when there is TLS) this long after it
    /// was accepted or dialled. Applied to the session by
    /// [`ConnHandle::new`]; `None` leaves the session's own setting.
    pub preface_timeout: Option<Duration>,
    /// Gracefully close (GOAWAY) a connection that has had no stream for
    /// this long. Applied like `preface_timeout`.
    pub idle_timeout: Option<Duration>,
}

impl Default for DriverConfig {
    fn default() -> Self {
        Self {
            write_timeout: Duration::from_secs(30),
            handshake_timeout: Duration::from_secs(20),
            max_write_batch: 256 * 1024,
            preface_timeout: None,
            idle_timeout: None,
        }
    }
}

/// The state shared by a connection's tasks and its handles.
pub struct Conn<S, H> {
    session: RefCell<S>,
    /// Boxed: 1.2 KiB inline would cost every plaintext connection (the
    /// Unix-socket frontends) as much as a TLS one.
    tls: RefCell<Option<Box<TlsLayer>>>,
    handler: RefCell<H>,
    wake_writer: Notify,
    wake_reader: Notify,
    /// The next of the connection's deadlines on the thread's timer (see
    /// [`Conn::rearm`]). A later deadline needs no move: it is found when
    /// this one expires (see [`Conn::poke_timer`]).
    deadline: Deadline,
    /// The TLS handshake must be done by then (set when the connection
    /// starts running; `None` before).
    handshake_deadline: Cell<Option<monoio::time::Instant>>,
    /// When the socket write in progress times out (`None`: no write in
    /// progress, or no write timeout). [`Conn::expire`] enforces it.
    write_deadline: Cell<Option<monoio::time::Instant>>,
    /// Ends a write that passed its deadline.
    write_abort: Notify,
    /// When the writer's last write started; the connection's deadline
    /// releases the buffers of a writer idle since for [`IDLE_RELEASE`].
    write_idle_since: Cell<Option<monoio::time::Instant>>,
    /// Tells an idle writer to give its buffers back.
    release_writer: Notify,
    /// Where received bytes go (the worker's pool, see
    /// [`super::pool::current`]).
    pool: BufPool,
    /// `plain` filled up while rustls still held plaintext: drain it before
    /// waiting for the socket.
    tls_backlog: Cell<bool>,
    /// Stops a read in flight (see [`Conn::stop_reader`]).
    closing: Notify,
    /// Latched with `closing`: the reader must end even if it was not
    /// waiting when `closing` fired (a `Notify` holds one wake-up only).
    reader_stopped: Cell<bool>,
    closed: Cell<bool>,
    /// Boxed, as the cold fields below: only a failing connection has one.
    error: RefCell<Option<Box<Error>>>,
    cfg: Limits,
    /// Stop at the next quiescent point and hand the connection over
    /// (see [`ConnHandle::run_detachable`]).
    detach: Rc<Cell<bool>>,
    /// Input already read, for a resumed connection: (raw or ciphertext,
    /// plaintext).
    initial_input: RefCell<Option<Box<(BytesMut, BytesMut)>>>,
}

/// What a running connection needs of its [`DriverConfig`] (the preface
/// and idle deadlines live in the session): 40 bytes instead of 72 in
/// every connection.
#[derive(Clone, Copy, Debug)]
struct Limits {
    write_timeout: Duration,
    handshake_timeout: Duration,
    max_write_batch: usize,
}

/// A connection stopped by [`ConnHandle::run_detachable`] between two
/// reads, with nothing in flight: everything needed to continue it
/// elsewhere (e.g. on another core, after `io::xcore` migration).
pub struct Detached<IO, S> {
    /// The socket.
    pub io: IO,
    /// The protocol state.
    pub session: S,
    /// The TLS state, if any.
    pub tls: Option<TlsLayer>,
    /// Bytes read but not yet processed: raw (or ciphertext) and plaintext.
    pub input: (BytesMut, BytesMut),
}

/// A cheap, clonable reference to a running connection (same core only).
pub struct ConnHandle<S, H>(Rc<Conn<S, H>>);

impl<S, H> Clone for ConnHandle<S, H> {
    fn clone(&self) -> Self {
        Self(self.0.clone())
    }
}

/// A non-owning [`ConnHandle`]: what a connection's own handler keeps to
/// give to the tasks it spawns, without keeping the connection alive.
pub struct WeakConnHandle<S, H>(std::rc::Weak<Conn<S, H>>);

impl<S, H> Clone for WeakConnHandle<S, H> {
    fn clone(&self) -> Self {
        Self(self.0.clone())
    }
}

impl<S, H> Default for WeakConnHandle<S, H> {
    fn default() -> Self {
        Self(std::rc::Weak::new())
    }
}

impl<S, H> WeakConnHandle<S, H> {
    /// The connection, if it still exists.
    pub fn upgrade(&self) -> Option<ConnHandle<S, H>> {
        self.0.upgrade().map(ConnHandle)
    }
}

impl<S, H> ConnHandle<S, H> {
    /// A non-owning handle.
    pub fn downgrade(&self) -> WeakConnHandle<S, H> {
        WeakConnHandle(Rc::downgrade(&self.0))
    }
}

impl<S: Session + 'static, H: Handler<S> + 'static> ConnHandle<S, H> {
    /// A connection ready to [`ConnHandle::run`].
    pub fn new(mut session: S, tls: Option<TlsLayer>, handler: H, cfg: DriverConfig) -> Self {
        session
            .h2_mut()
            .set_deadlines(cfg.preface_timeout, cfg.idle_timeout);
        Self(Rc::new_cyclic(|me: &std::rc::Weak<Conn<S, H>>| Conn {
            deadline: Deadline::new(me.clone()),
            handshake_deadline: Cell::new(None),
            session: RefCell::new(session),
            tls: RefCell::new(tls.map(Box::new)),
            handler: RefCell::new(handler),
            wake_writer: Notify::new(),
            wake_reader: Notify::new(),
            write_deadline: Cell::new(None),
            write_abort: Notify::new(),
            write_idle_since: Cell::new(None),
            release_writer: Notify::new(),
            tls_backlog: Cell::new(false),
            pool: super::pool::current(),
            closing: Notify::new(),
            reader_stopped: Cell::new(false),
            closed: Cell::new(false),
            error: RefCell::new(None),
            cfg: Limits {
                write_timeout: cfg.write_timeout,
                handshake_timeout: cfg.handshake_timeout,
                max_write_batch: cfg.max_write_batch,
            },
            detach: Rc::new(Cell::new(false)),
            initial_input: RefCell::new(None),
        }))
    }

    /// A connection continuing a [`Detached`] one: `run` it on the socket
    /// (re-attached on this core).
    pub fn resume(
        session: S,
        tls: Option<TlsLayer>,
        input: (BytesMut, BytesMut),
        handler: H,
        cfg: DriverConfig,
    ) -> Self {
        let h = Self::new(session, tls, handler, cfg);
        *h.0.initial_input.borrow_mut() = Some(Box::new(input));
        h
    }

    /// The data ring's buffer group for this connection's socket.
    fn ring_group(&self) -> uring::GroupKind {
        if self.0.tls.borrow().is_some() {
            uring::GroupKind::Tls
        } else {
            uring::GroupKind::Plain
        }
    }

    /// The flag that asks [`ConnHandle::run_detachable`] to stop after the
    /// input being processed now. Set it from the connection's handler
    /// (while it handles an event), so no read is in flight.
    pub fn detach_flag(&self) -> Rc<Cell<bool>> {
        self.0.detach.clone()
    }

    /// Run `f` on the connection and its handler, then deliver the events it
    /// caused and schedule output. Fails when called from inside this
    /// connection's own handler.
    pub fn with<R>(&self, f: impl FnOnce(&mut S, &mut H) -> R) -> Result<R, Error> {
        let r = {
            let (Ok(mut session), Ok(mut handler)) = (
                self.0.session.try_borrow_mut(),
                self.0.handler.try_borrow_mut(),
            ) else {
                return Err(Error::Usage(
                    "ConnHandle::with called from inside the connection's handler",
                ));
            };
            f(&mut session, &mut handler)
        };
        self.0.dispatch();
        self.0.wake_writer.notify();
        self.0.poke_timer();
        Ok(r)
    }

    /// Run `f` on the connection's TLS state: `None` for a plaintext
    /// connection (or, never in practice, while the driver itself is using
    /// it). For what the handshake established, such as the peer's
    /// certificates: call it once application data has arrived. May be
    /// called from inside the connection's handler: events are dispatched
    /// with the TLS state free.
    pub fn with_tls<R>(&self, f: impl FnOnce(Option<&TlsLayer>) -> R) -> R {
        let tls = self.0.tls.try_borrow();
        f(tls.as_ref().ok().and_then(|t| t.as_deref()))
    }

    /// The connection has finished.
    pub fn is_closed(&self) -> bool {
        self.0.closed.get()
    }

    /// Start a graceful shutdown (GOAWAY; calls in progress finish).
    pub fn shutdown(&self) {
        let _ = self.with(|s, _| s.h2_mut().shutdown());
    }

    /// End the connection now: open calls fail with [`Error::Aborted`],
    /// output already produced is written (each write still bounded by the
    /// write timeout), then the socket is shut down and every task of the
    /// connection ends. Must not be called from inside its own handler.
    pub fn abort(&self) {
        if self.0.session.try_borrow_mut().is_ok() && self.0.handler.try_borrow_mut().is_ok() {
            self.0.finish(Some(Error::Aborted));
        }
    }

    /// Drive the connection on `io` until it is finished. Returns the error
    /// that ended it, if any.
    pub async fn run<IO>(self, io: IO) -> Result<(), Error>
    where
        IO: Splitable + 'static,
        IO::OwnedRead: AsyncReadRent + ReadReady + 'static,
        IO::OwnedWrite: AsyncWriteRent + 'static,
    {
        let (rd, wr) = match uring::adopt(io, self.ring_group()) {
            Ok(ring) => {
                let (rd, wr) = ring.into_split();
                (Rd::Ring(rd), Wr::Ring(wr))
            }
            Err(io) => {
                let (rd, wr) = io.into_split();
                (Rd::Mono(rd), Wr::Mono(wr))
            }
        };
        match self.run_halves(rd, wr).await {
            Ok(None) => Ok(()),
            Ok(Some(_)) => Err(Error::Usage(
                "detach requested on a connection run with run()",
            )),
            Err(e) => Err(e),
        }
    }

    /// Like [`ConnHandle::run`], but if the handler sets the
    /// [`detach flag`](ConnHandle::detach_flag), the connection stops once
    /// its pending output is written, with no read in flight, and is
    /// returned whole instead of being closed. The handler's `on_close` is
    /// not called then.
    pub async fn run_detachable<IO>(self, io: IO) -> Result<Option<Detached<IO, S>>, Error>
    where
        IO: Split + AsyncReadRent + AsyncWriteRent + ReadReady + 'static,
    {
        let (rd, wr) = match uring::adopt(io, self.ring_group()) {
            Ok(ring) => {
                let (rd, wr) = ring.into_split();
                (Rd::Ring(rd), Wr::Ring(wr))
            }
            Err(io) => {
                let (rd, wr) = io.into_split();
                (Rd::Mono(rd), Wr::Mono(wr))
            }
        };
        let Some(halted) = self.run_halves(rd, wr).await? else {
            return Ok(None);
        };
        if matches!(halted.rd, Rd::Ring(_)) {
            // Boxed: an await here would keep the session, the TLS state
            // and the halves in every connection's future (8.5 instead of
            // 0.7 KiB, copied whenever the task is spawned) for a detach
            // that is rare (a connection moving to another core).
            return Box::pin(detach_from_ring(halted)).await.map(Some);
        }
        let Halted {
            rd: Rd::Mono(rd),
            wr: Wr::Mono(wr),
            session,
            tls,
            input,
        } = halted
        else {
            return Err(Error::Usage("socket halves do not match"));
        };
        let io = rd
            .reunite(wr)
            .map_err(|_| Error::Usage("socket halves do not match"))?;
        Ok(Some(Detached {
            io,
            session,
            tls,
            input,
        }))
    }

    async fn run_halves<R, W>(self, rd: Rd<R>, wr: Wr<W>) -> Result<Option<Halted<R, W, S>>, Error>
    where
        R: AsyncReadRent + ReadReady + 'static,
        W: AsyncWriteRent + 'static,
    {
        let conn = self.0.clone();
        let writer = monoio::spawn(async move { conn.write_loop(wr).await });
        self.0
            .handshake_deadline
            .set(monoio::time::Instant::now().checked_add(self.0.cfg.handshake_timeout));
        self.0.rearm();
        // A future of its own, with the read's outcome passed straight in:
        // kept in this future across the writer's await points, the outcome
        // had slots beside the read loop (this future 680 → 536 bytes, in
        // every connection's task).
        self.after_read(writer, self.0.read_loop(rd).await).await
    }

    /// The rest of [`run_halves`](Self::run_halves) once the read loop
    /// ended: hand the connection over if it is detaching, else close it.
    async fn after_read<R, W>(
        &self,
        writer: monoio::task::JoinHandle<Result<Option<Wr<W>>, Error>>,
        (read_result, rd, input): ReadOutcome<R>,
    ) -> Result<Option<Halted<R, W, S>>, Error>
    where
        R: AsyncReadRent + ReadReady + 'static,
        W: AsyncWriteRent + 'static,
    {
        if read_result.is_ok() && self.0.detach.get() {
            // Stop the writer once it has flushed; no deadline meanwhile.
            self.0.wake_writer.notify();
            let write_result = writer.await;
            self.0.deadline.set(None);
            if let (Ok(Some(wr)), Some(rd)) = (write_result, rd) {
                let session =
                    std::mem::replace(&mut *self.0.session.borrow_mut(), S::placeholder());
                let tls = self.0.tls.borrow_mut().take().map(|t| *t);
                self.0.closed.set(true);
                return Ok(Some(Halted {
                    rd,
                    wr,
                    session,
                    tls,
                    input,
                }));
            }
            self.0
                .finish(Some(Error::Usage("detach failed: the writer ended")));
            return Err(self
                .0
                .error
                .borrow_mut()
                .take()
                .map_or(Error::ConnectionClosed, |e| *e));
        }
        self.0.finish(read_result.err());
        let write_result = writer.await;
        self.0.finish(write_result.err());
        self.0.deadline.set(None);
        let err = self.0.error.borrow_mut().take().map(|e| *e);
        {
            let mut session = self.0.session.borrow_mut();
            self.0
                .handler
                .borrow_mut()
                .on_close(&mut session, err.as_ref());
        }
        match err {
            Some(e) => Err(e),
            None => Ok(None),
        }
    }
}

/// How a read loop ended: its result, the read half (`None` once it
/// failed), and the input read but not yet handled (raw or ciphertext,
/// plaintext).
type ReadOutcome<R> = (Result<(), Error>, Option<Rd<R>>, (BytesMut, BytesMut));

/// The read half of a connection's socket: monoio's, or one on the
/// worker's io_uring data ring (`io::uring`, where the kernel picks the
/// buffers).
enum Rd<R> {
    Mono(R),
    Ring(RingRead),
}

/// Leaves in `plain` and `payloads` what rustls did not take (`used`
/// bytes accepted) of a vectored transmit — `plain` with `payloads` put in
/// at their places. rustls takes at most its outgoing buffer's limit (64
/// KiB by default) of a transmit of up to `max_write_batch`, so this runs
/// for most bulk transmits: nothing is copied, the consumed head of
/// `plain` and the consumed payloads are dropped and the rest renumbered.
fn keep_unsent(plain: &mut BytesMut, payloads: &mut Payloads, used: usize) {
    let mut left = used;
    // Bytes of `plain` consumed, and payloads consumed whole.
    let mut from = 0;
    let mut done = 0;
    for (to, p) in payloads.iter_mut() {
        let gap = to.saturating_sub(from).min(left);
        from += gap;
        left -= gap;
        if left == 0 {
            break;
        }
        let k = left.min(p.len());
        p.advance(k);
        left -= k;
        if !p.is_empty() {
            break;
        }
        done += 1;
    }
    from += left.min(plain.len().saturating_sub(from));
    payloads.drain(..done);
    plain.advance(from);
    for (to, _) in payloads.iter_mut() {
        *to = to.saturating_sub(from);
    }
}

/// The write half, as [`Rd`].
enum Wr<W> {
    Mono(W),
    Ring(RingWrite),
}

impl<W: AsyncWriteRent> Wr<W> {
    async fn write_all(&mut self, out: BytesMut) -> (std::io::Result<()>, BytesMut) {
        match self {
            Self::Mono(w) => {
                let (r, out) = w.write_all(out).await;
                (r.map(drop), out)
            }
            Self::Ring(w) => w.write_all(out).await,
        }
    }

    /// Ends the sending direction and lets go of the half. monoio's
    /// write half does it when dropped: a TCP half's drop makes the
    /// `shutdown(2)` call (a shutdown of ours before it would make the
    /// drop a second call, failing with `ENOTCONN`); a Unix half's drop
    /// does nothing, and the socket's close, once the reader has stopped
    /// right after ([`Conn::stop_reader`] follows the goodbye), is the
    /// peer's end of stream as a shutdown would be — one system call less
    /// per Unix frontend connection. Pinned by `drop_tests` and
    /// `driver_grpc::a_unix_peer_sees_the_end_when_the_driver_ends`.
    async fn close(self) {
        match self {
            Self::Mono(w) => drop(w),
            Self::Ring(mut w) => {
                let _ = w.shutdown().await;
            }
        }
    }
}

/// The end of [`ConnHandle::run_detachable`] for a socket on the data ring:
/// back to a monoio stream, with the bytes the ring received after the last
/// processed ones appended to the unprocessed input.
async fn detach_from_ring<IO, R, W, S>(h: Halted<R, W, S>) -> Result<Detached<IO, S>, Error>
where
    IO: 'static,
{
    let Halted {
        rd: Rd::Ring(rd),
        wr: Wr::Ring(wr),
        session,
        tls,
        mut input,
    } = h
    else {
        return Err(Error::Usage("socket halves do not match"));
    };
    let (io, late) = RingStream::reunite(rd, wr)?.into_io::<IO>().await?;
    if !late.is_empty() {
        input.0.extend_from_slice(&late);
    }
    Ok(Detached {
        io,
        session,
        tls,
        input,
    })
}

/// What `run_halves` hands back on a detach.
struct Halted<R, W, S> {
    rd: Rd<R>,
    wr: Wr<W>,
    session: S,
    tls: Option<TlsLayer>,
    input: (BytesMut, BytesMut),
}

impl<S: Session, H: Handler<S>> Conn<S, H> {
    /// Deliver pending events to the handler.
    fn dispatch(&self) {
        let (Ok(mut session), Ok(mut handler)) =
            (self.session.try_borrow_mut(), self.handler.try_borrow_mut())
        else {
            return; // already dispatching further up the stack
        };
        loop {
            while let Some(ev) = session.poll_event() {
                handler.on_event(&mut session, ev);
            }
            handler.after_dispatch(&mut session);
            // Flushing may have produced events (e.g. a send made a stream
            // writable); deliver them too.
            if !session.has_events() {
                break;
            }
        }
    }

    /// Moves the connection's deadline if the session's next deadline
    /// comes before it. Most input and commands only move the keepalive
    /// deadline later; those cost nothing here.
    fn poke_timer(&self) {
        if let Some(next) = self.session.borrow().h2().poll_timeout() {
            self.poke_timer_at(monoio::time::Instant::from_std(next));
        }
    }

    /// Moves the connection's deadline to `at` if that is sooner (once the
    /// connection runs: [`Conn::rearm`] at its start sees everything).
    fn poke_timer_at(&self, at: monoio::time::Instant) {
        if self.handshake_deadline.get().is_none() || self.closed.get() {
            return;
        }
        if self.deadline.get().is_none_or(|armed| at < armed) {
            self.deadline.set(Some(at));
        }
    }

    /// Arms the connection's deadline for the soonest of the session's
    /// timers, the write in progress, the idle writer's buffer release and
    /// the TLS handshake.
    fn rearm(&self) {
        if self.closed.get() || self.detach.get() {
            self.deadline.set(None);
            return;
        }
        let sooner = |a: Option<monoio::time::Instant>, b| match (a, b) {
            (Some(a), Some(b)) => Some(std::cmp::min(a, b)),
            (a, b) => a.or(b),
        };
        let h2_deadline = self
            .session
            .borrow()
            .h2()
            .poll_timeout()
            .map(monoio::time::Instant::from_std);
        let mut deadline = sooner(h2_deadline, self.write_deadline.get());
        deadline = sooner(
            deadline,
            self.write_idle_since.get().map(|t| t + IDLE_RELEASE),
        );
        if self.handshaking() {
            deadline = sooner(deadline, self.handshake_deadline.get());
        }
        self.deadline.set(deadline);
    }

    fn handshaking(&self) -> bool {
        self.tls
            .borrow()
            .as_ref()
            .is_some_and(|t| t.is_handshaking())
    }

    /// Mark the connection finished, remembering the first error.
    fn finish(&self, err: Option<Error>) {
        if let Some(e) = err {
            self.error.borrow_mut().get_or_insert_with(|| Box::new(e));
        }
        if !self.closed.replace(true) {
            self.session.borrow_mut().connection_lost();
            self.dispatch();
        }
        self.stop_reader();
        self.wake_writer.notify();
        self.deadline.set(None);
    }

    /// End the read loop, now or at its next check.
    fn stop_reader(&self) {
        self.reader_stopped.set(true);
        self.closing.notify();
    }

    /// Returns the outcome and, when stopping for a detach, the read half
    /// and the unprocessed input.
    async fn read_loop<R: AsyncReadRent + ReadReady>(&self, rd: Rd<R>) -> ReadOutcome<R> {
        let (mut buf, mut plain) = self
            .initial_input
            .borrow_mut()
            .take()
            .map(|i| *i)
            .unwrap_or_default();
        match rd {
            Rd::Mono(rd) => {
                let mut rd = Some(rd);
                let r = self.read_inner(&mut rd, &mut buf, &mut plain).await;
                (r, rd.map(Rd::Mono), (buf, plain))
            }
            Rd::Ring(rd) => {
                let mut rd = Some(rd);
                let r = self.read_ring(&mut rd, &mut buf, &mut plain).await;
                (r, rd.map(Rd::Ring), (buf, plain))
            }
        }
    }

    /// Wait until `reader` has data (or EOF) with no read in flight, asking
    /// the kernel (the last read did not fill its buffer: see `ReadReady`).
    /// Returns `false` when the reader must stop instead.
    async fn wait_readable<R: ReadReady>(&self, reader: &R) -> Result<bool, Error> {
        match race(reader.read_ready(false), self.closing.notified()).await {
            Either::Left(r) => r.map(|()| true).map_err(Error::Io),
            Either::Right(()) => Ok(false),
        }
    }

    /// Makes sure `b` has room for a read of at least [`MIN_READ_ROOM`]
    /// bytes (or whatever a pooled buffer has left after its unprocessed
    /// rest). A buffer with less room is replaced by one from the pool — a
    /// large one for a plaintext socket (one read per 64 KiB), a
    /// frame-sized one for TLS plaintext — the rest (at most one partial
    /// frame) copied over; the old one lives on
    /// in the slices the session handed out and returns to the pool with
    /// the last of them. Waits for a buffer while the memory budget is used
    /// up — the connection then stops reading, and TCP pushes back on its
    /// peer — at most [`PoolConfig::acquire_timeout`]
    /// (`Error::BufferWaitTimeout`). Returns `false` when the reader must
    /// stop instead.
    ///
    /// [`PoolConfig::acquire_timeout`]: super::pool::PoolConfig::acquire_timeout
    async fn make_room(
        &self,
        b: &mut BytesMut,
        large: bool,
        pinned: Option<&mut BytesMut>,
    ) -> Result<bool, Error> {
        if b.capacity() - b.len() >= MIN_READ_ROOM {
            return Ok(true);
        }
        let capacity = if large {
            LARGE_BUF_CAPACITY
        } else {
            BUF_CAPACITY
        };
        if b.len() >= capacity {
            // A frame larger than a pooled buffer (only when a larger
            // SETTINGS_MAX_FRAME_SIZE was configured): grow outside the pool.
            b.reserve(b.len());
            return Ok(true);
        }
        // Drop an empty buffer first, so the pool can lend it again.
        let rest = std::mem::take(b);
        let rest = (!rest.is_empty()).then_some(rest);
        let size = if large { Size::Large } else { Size::Frame };
        if let Ok(mut fresh) = self.pool.try_acquire_size(size) {
            if let Some(rest) = rest {
                fresh.extend_from_slice(&rest);
            }
            *b = fresh;
            return Ok(true);
        }
        // The budget is used up. Wait without pinning the buffer the rest
        // sits in (at most one frame, copied out): with every buffer pinned
        // by a waiting reader's rest, none could ever come back. The same
        // for `pinned`, unprocessed input in another pooled buffer (TLS
        // ciphertext received on the data ring).
        let rest = rest.map(|r| BytesMut::from(&r[..]));
        if let Some(p) = pinned
            && !p.is_empty()
        {
            *p = BytesMut::from(&p[..]);
        }
        match race(self.pool.wait_for(size), self.closing.notified()).await {
            Either::Left(fresh) => {
                let mut fresh = fresh?;
                if let Some(rest) = rest {
                    fresh.extend_from_slice(&rest);
                }
                *b = fresh;
                Ok(true)
            }
            Either::Right(()) => {
                *b = rest.unwrap_or_default();
                Ok(false)
            }
        }
    }

    /// Hands the session the input waiting in `plain` (TLS) or `buf`, if
    /// it wants to read, and acts on what it produced. On error GOAWAY is
    /// queued; the writer flushes it and ends.
    fn handle_buffered(
        &self,
        tls: bool,
        buf: &mut BytesMut,
        plain: &mut BytesMut,
    ) -> Result<(), Error> {
        if !self.session.borrow().h2().wants_read() {
            return Ok(());
        }
        let input = if tls { plain } else { buf };
        if input.is_empty() {
            return Ok(());
        }
        let r = self
            .session
            .borrow_mut()
            .handle_input(super::clock::now(), input);
        self.dispatch();
        self.wake_writer.notify();
        self.poke_timer();
        r
    }

    async fn read_inner<R: AsyncReadRent + ReadReady>(
        &self,
        rd: &mut Option<R>,
        buf: &mut BytesMut,
        plain: &mut BytesMut,
    ) -> Result<(), Error> {
        let tls = self.tls.borrow().is_some();
        let mut relaxed = false;
        let mut turn = 0u32;
        loop {
            // Process what is buffered first (reading may have paused).
            self.handle_buffered(tls, buf, plain)?;
            if self.closed.get() || self.reader_stopped.get() || self.detach.get() {
                return Ok(());
            }
            if !self.session.borrow().h2().wants_read() {
                race(self.wake_reader.notified(), self.closing.notified()).await;
                continue;
            }
            if tls && (!buf.is_empty() || self.tls_backlog.get()) {
                // Ciphertext rustls could not take yet (its plaintext was
                // full), or plaintext that did not fit `plain`.
                if !self.make_room(plain, false, None).await? {
                    return Ok(());
                }
                if self.feed_tls(buf, plain)? {
                    continue;
                }
            }
            let Some(reader) = rd.as_mut() else {
                return Ok(());
            };
            if buf.is_empty() {
                // Nothing unprocessed: hold no buffer while waiting, so an
                // idle connection costs only its protocol state. The
                // ciphertext buffer goes to the core's spares.
                if tls {
                    self.pool.put_scratch(std::mem::take(buf));
                } else {
                    *buf = BytesMut::new();
                }
                if plain.is_empty() {
                    *plain = BytesMut::new();
                }
                // After a full read more is most likely waiting: read at
                // once. That is what epoll's cached readiness would say
                // anyway, and under io_uring it saves a poll operation per
                // read. At worst the read waits with its buffer, so not
                // while the memory budget is short.
                let speculate = relaxed && !self.pool.under_pressure();
                if !speculate && !self.wait_readable(reader).await? {
                    return Ok(()); // stopping
                }
            }
            if tls {
                // Ciphertext only lives until rustls has copied it: a
                // working buffer, not a pooled one (the core's spare).
                let room = if relaxed { BULK_READ_CHUNK } else { READ_CHUNK };
                if buf.capacity() == 0 {
                    *buf = self.pool.take_scratch(room);
                } else {
                    buf.reserve(room);
                }
            } else if !self.make_room(buf, true, None).await? {
                return Ok(());
            }
            turn += 1;
            if turn > READS_PER_TURN {
                // Fairness: the worker's other connections get their turn.
                turn = 0;
                super::runtime::yield_now().await;
            }
            let len = buf.len();
            let want = buf.capacity() - len;
            let owned = std::mem::take(buf);
            let read = reader.read(owned.slice_mut(len..));
            let (res, slice) = match race(read, self.closing.notified()).await {
                Either::Left(r) => r,
                Either::Right(()) => {
                    // The read's buffer went with it; the connection is ending.
                    *rd = None;
                    return Ok(());
                }
            };
            *buf = slice.into_inner();
            let n = res.map_err(Error::Io)?;
            // A full read suggests more is waiting; a short one that the
            // socket is drained (see `ReadReady`).
            relaxed = n == want;
            if n == 0 {
                if let Some(t) = self.tls.borrow_mut().as_mut() {
                    t.feed_eof()?;
                }
                return Ok(());
            }
            if tls {
                if !self.make_room(plain, false, None).await? {
                    return Ok(());
                }
                self.feed_tls(buf, plain)?;
                // A TLS handshake or key update may need an answer.
                self.wake_writer.notify();
            }
        }
    }

    /// [`Conn::read_inner`] for a socket on the data ring: the kernel picks
    /// the buffer of every receive from the worker's pool (`io::uring`),
    /// so there is no readiness wait and no buffer of the connection's own
    /// while it waits. TLS ciphertext chunks go straight into rustls;
    /// plaintext chunks become the session's input, joined without a copy
    /// when the kernel put them next to each other (see [`Conn::append`]).
    async fn read_ring(
        &self,
        rd: &mut Option<RingRead>,
        buf: &mut BytesMut,
        plain: &mut BytesMut,
    ) -> Result<(), Error> {
        let tls = self.tls.borrow().is_some();
        let mut turn = 0u32;
        // Part of a plaintext chunk that did not fit `buf` yet.
        let mut carry: Option<BytesMut> = None;
        let result = loop {
            if let Err(e) = self.handle_buffered(tls, buf, plain) {
                break Err(e);
            }
            if self.closed.get() || self.reader_stopped.get() || self.detach.get() {
                break Ok(());
            }
            if !self.session.borrow().h2().wants_read() {
                race(self.wake_reader.notified(), self.closing.notified()).await;
                continue;
            }
            if tls && (!buf.is_empty() || self.tls_backlog.get()) {
                if !self.make_room(plain, false, Some(&mut *buf)).await? {
                    break Ok(());
                }
                if self.feed_tls(buf, plain)? {
                    continue;
                }
            }
            if let Some(c) = carry.take() {
                self.append(buf, c, &mut carry);
                continue;
            }
            let Some(reader) = rd.as_mut() else {
                break Ok(());
            };
            if buf.is_empty() {
                *buf = BytesMut::new();
                if plain.is_empty() {
                    *plain = BytesMut::new();
                }
            }
            turn += 1;
            if turn > READS_PER_TURN {
                turn = 0;
                super::runtime::yield_now().await;
            }
            let chunk = match race(reader.recv_chunk(), self.closing.notified()).await {
                // Nothing is lost: received chunks stay queued on the socket.
                Either::Right(()) => break Ok(()),
                Either::Left(r) => r?,
            };
            let chunk = match chunk {
                Received::Chunk(c) => c,
                Received::Eof => {
                    if let Some(t) = self.tls.borrow_mut().as_mut() {
                        t.feed_eof()?;
                    }
                    break Ok(());
                }
                Received::NoBuffer => {
                    // The budget is used up. Wait without pinning pooled
                    // buffers with the unprocessed rests (at most a frame
                    // each, copied out): with every buffer pinned by a
                    // waiting reader's rest, none could ever come back.
                    for rest in [&mut *buf, &mut *plain] {
                        if !rest.is_empty() {
                            *rest = BytesMut::from(&rest[..]);
                        }
                    }
                    match race(reader.wait_for_buffer(), self.closing.notified()).await {
                        Either::Left(r) => r?,
                        Either::Right(()) => break Ok(()),
                    }
                    continue;
                }
            };
            if tls {
                if buf.is_empty() {
                    *buf = chunk;
                } else {
                    // rustls refused part of the last chunk (rare): keep
                    // the order.
                    buf.extend_from_slice(&chunk);
                }
                if !self.make_room(plain, false, Some(&mut *buf)).await? {
                    break Ok(());
                }
                self.feed_tls(buf, plain)?;
                self.wake_writer.notify();
            } else {
                self.append(buf, chunk, &mut carry);
            }
        };
        if let Some(c) = carry {
            // Stopping (a detach) with part of a chunk not yet in `buf`.
            buf.extend_from_slice(&c);
        }
        result
    }

    /// Appends a received plaintext chunk to the unprocessed input `buf`.
    /// When the chunk continues `buf` in memory — consecutive receives of
    /// one socket into one provided buffer — the two are joined without a
    /// copy. Otherwise `buf`'s rest (at most one partial frame) moves into
    /// a fresh large pooled buffer and as much of the chunk as fits is
    /// copied after it; the remainder waits in `carry`. This never waits:
    /// while the budget is used up (the chunk itself pins a provided
    /// buffer) the two are joined outside the pool, a slow path bounded by
    /// one frame plus one chunk per connection.
    fn append(&self, buf: &mut BytesMut, mut chunk: BytesMut, carry: &mut Option<BytesMut>) {
        if buf.is_empty() {
            *buf = chunk;
            return;
        }
        if buf.capacity() == buf.len() && buf.as_ptr().wrapping_add(buf.len()) == chunk.as_ptr() {
            buf.unsplit(chunk);
            return;
        }
        let need = buf.len() + chunk.len();
        let mut fresh = match self.pool.try_acquire_quiet(Size::Large) {
            // A frame larger than a pooled buffer (only with a larger
            // SETTINGS_MAX_FRAME_SIZE) grows outside the pool.
            Some(b) if b.capacity() > buf.len() => b,
            _ => BytesMut::with_capacity(need),
        };
        fresh.extend_from_slice(buf);
        let room = fresh.capacity() - fresh.len();
        if chunk.len() <= room {
            fresh.extend_from_slice(&chunk);
        } else {
            fresh.extend_from_slice(&chunk[..room]);
            chunk.advance(room);
            *carry = Some(chunk);
        }
        *buf = fresh;
    }

    /// Move ciphertext from `buf` through rustls into `plain`, as far as
    /// `plain` has room (it never grows: it is a pooled buffer). Returns
    /// whether anything moved.
    fn feed_tls(&self, buf: &mut BytesMut, plain: &mut BytesMut) -> Result<bool, Error> {
        let mut tls = self.tls.borrow_mut();
        let Some(t) = tls.as_mut() else {
            return Ok(false);
        };
        let before = (buf.len(), plain.len());
        loop {
            // Drain what rustls holds first, then feed it more.
            let mut eof = false;
            loop {
                let room = plain.capacity() - plain.len();
                // A full `plain` may leave plaintext inside rustls.
                self.tls_backlog.set(room == 0);
                if room == 0 {
                    break;
                }
                match t.read_plaintext_bounded(plain, room)? {
                    Plaintext::Data(_) => {}
                    Plaintext::Empty => break,
                    Plaintext::Eof => {
                        eof = true;
                        break;
                    }
                }
            }
            if eof || buf.is_empty() || plain.capacity() == plain.len() {
                break;
            }
            let used = t.feed_tls(buf)?;
            buf.advance(used);
            if used == 0 {
                break;
            }
        }
        Ok((buf.len(), plain.len()) != before)
    }

    /// Returns the write half when stopping for a detach.
    async fn write_loop<W: AsyncWriteRent>(&self, mut wr: Wr<W>) -> Result<Option<Wr<W>>, Error> {
        let mut plain = BytesMut::new();
        let mut out = BytesMut::new();
        let mut last_write = None;
        let result = loop {
            if let Err(e) = self.produce(&mut plain, &mut out) {
                break Err(e);
            }
            if out.is_empty() {
                if self.detach.get() && plain.is_empty() && !self.closed.get() {
                    return Ok(Some(wr));
                }
                let done = self.session.borrow().h2().is_closed() || self.closed.get();
                if done {
                    break Ok(());
                }
                if plain.capacity() + out.capacity() == 0 {
                    self.wake_writer.notified().await;
                    continue;
                }
                // Idle with buffers: the connection's deadline says when
                // to give them back (no timer of the writer's own).
                if let Some(since) = last_write {
                    self.write_idle_since.set(Some(since));
                    self.poke_timer_at(since + IDLE_RELEASE);
                }
                let woken = race(self.wake_writer.notified(), self.release_writer.notified()).await;
                self.write_idle_since.set(None);
                if let Either::Right(()) = woken
                    && plain.is_empty()
                {
                    plain = BytesMut::new();
                    out = BytesMut::new();
                }
                continue;
            }
            // The connection's deadline ends a write that makes no
            // complete progress within the write timeout (no timer per
            // write).
            let started = monoio::time::Instant::now();
            last_write = Some(started);
            let deadline = started.checked_add(self.cfg.write_timeout);
            self.write_deadline.set(deadline);
            if let Some(at) = deadline {
                self.poke_timer_at(at);
            }
            let written = race(wr.write_all(out), self.write_abort.notified()).await;
            self.write_deadline.set(None);
            let Either::Left((res, o)) = written else {
                // The buffer went with the abandoned write.
                out = BytesMut::new();
                break Err(Error::WriteTimeout(self.cfg.write_timeout));
            };
            out = o;
            out.clear();
            if let Err(e) = res {
                break Err(Error::Io(e));
            }
            // Control replies were flushed: reading may resume.
            self.wake_reader.notify();
        };
        // Say goodbye properly where we can, then stop the reader. After a
        // TLS error rustls has queued the alert that tells the peer why
        // (`unknown_ca`, `certificate_required`, …): send that instead.
        if let Some(t) = self.tls.borrow_mut().as_mut() {
            if result.is_ok() {
                t.send_close_notify();
            }
            t.take_tls(&mut out);
        }
        let socket_failed = matches!(result, Err(Error::Io(_) | Error::WriteTimeout(_)));
        // One await point for the goodbye: a result kept across two gets a
        // slot of its own beside the loop's write (72 bytes in every
        // connection's writer task).
        self.goodbye(wr, out, !socket_failed).await;
        // `finish` (called by `run_halves` with this result) marks the
        // connection closed and lets the session fail its open calls; only
        // stop the reader here.
        self.stop_reader();
        result.map(|()| None)
    }

    /// The writer's step that does not wait: refill `plain` from the
    /// session when it is empty, then under TLS encrypt what rustls takes
    /// of it into `out`, or without TLS make it `out` (which is empty).
    /// Under TLS large DATA payloads are not copied into `plain`: rustls
    /// gets them as slices and copies them once, into its records. Not
    /// async, so the payload list lives in the TLS layer, not in every
    /// writer task's state.
    fn produce(&self, plain: &mut BytesMut, out: &mut BytesMut) -> Result<(), Error> {
        let mut payloads = self.tls.borrow_mut().as_mut().map(|t| t.take_payloads());
        if plain.is_empty() && payloads.as_ref().is_none_or(Vec::is_empty) {
            // A busy writer keeps its room; a fresh or released one
            // allocates only when there is output.
            if plain.capacity() > 0 {
                plain.reserve(WRITE_CHUNK);
            }
            let now = super::clock::now();
            let max = self.cfg.max_write_batch;
            match payloads.as_mut() {
                Some(list) => {
                    self.session
                        .borrow_mut()
                        .poll_transmit_vectored(now, plain, list, max);
                }
                None => {
                    self.session.borrow_mut().poll_transmit(now, plain, max);
                }
            }
            self.dispatch();
        }
        let mut tls = self.tls.borrow_mut();
        let Some(t) = tls.as_mut() else {
            std::mem::swap(plain, out);
            return Ok(());
        };
        let mut payloads = payloads.unwrap_or_default();
        // rustls takes at most its buffer limit (64 KiB) per call; encrypt
        // into `out` until the batch is done or `out` holds a whole batch,
        // so a bulk transfer leaves in one write of up to
        // `max_write_batch`, not one per 64 KiB.
        let written = loop {
            let step = if payloads.is_empty() {
                t.write_plaintext(plain).map(|used| plain.advance(used))
            } else {
                t.write_plaintext_vectored(plain, &payloads)
                    .map(|used| keep_unsent(plain, &mut payloads, used))
            };
            let before = out.len();
            t.take_tls(out);
            let done = plain.is_empty() && payloads.is_empty();
            if step.is_err() || done || out.len() == before || out.len() >= self.cfg.max_write_batch
            {
                break step;
            }
        };
        t.put_payloads(payloads);
        written
    }

    /// The writer's last steps: the remaining output if `send` (within the
    /// write timeout), then the socket's shutdown.
    async fn goodbye<W: AsyncWriteRent>(&self, mut wr: Wr<W>, out: BytesMut, send: bool) {
        if send && !out.is_empty() {
            // Boxed: a timer kept in the writer's state would cost every
            // connection 640 bytes for this one last write.
            let _ = Box::pin(monoio::time::timeout(
                self.cfg.write_timeout,
                wr.write_all(out),
            ))
            .await;
        }
        wr.close().await;
    }

    /// The connection's deadline passed: enforce what is due, run the
    /// session's timers and arm the next deadline.
    fn on_deadline(&self) {
        if self.closed.get() || self.detach.get() {
            return;
        }
        let now = monoio::time::Instant::now();
        if self
            .write_idle_since
            .get()
            .is_some_and(|t| now >= t + IDLE_RELEASE)
        {
            self.write_idle_since.set(None);
            self.release_writer.notify();
            if let Some(t) = self.tls.borrow_mut().as_mut() {
                t.release_idle();
            }
            self.session.borrow_mut().release_idle();
            self.handler.borrow_mut().release_idle();
        }
        if self.write_deadline.get().is_some_and(|d| now >= d) {
            self.finish(Some(Error::WriteTimeout(self.cfg.write_timeout)));
            self.write_abort.notify();
            return;
        }
        if self
            .handshake_deadline
            .get()
            .is_some_and(|d| now >= d && self.handshaking())
        {
            self.finish(Some(Error::TlsHandshakeTimeout(self.cfg.handshake_timeout)));
            return;
        }
        self.session
            .borrow_mut()
            .handle_timeout(super::clock::now());
        self.dispatch();
        if let Some(e) = self.session.borrow().h2().error() {
            self.error
                .borrow_mut()
                .get_or_insert_with(|| Box::new(e.into()));
        }
        self.wake_writer.notify();
        self.rearm();
    }
}

impl<S: Session, H: Handler<S>> Expire for Conn<S, H> {
    fn expire(&self) {
        self.on_deadline();
    }
}

#[cfg(test)]
mod vectored_tests {
    use bytes::{Bytes, BytesMut};
    use konn_protocol::h2::Payloads;

    use super::keep_unsent;

    fn joined(plain: &[u8], payloads: &Payloads) -> Vec<u8> {
        let (mut all, mut at) = (Vec::new(), 0);
        for (to, p) in payloads {
            all.extend_from_slice(&plain[at..*to]);
            all.extend_from_slice(p);
            at = *to;
        }
        all.extend_from_slice(&plain[at..]);
        all
    }

    /// Whatever rustls took, what is left is exactly the rest of the
    /// transmit, in order, with nothing copied into `plain` that was not
    /// there (payloads stay referenced).
    #[test]
    fn what_rustls_did_not_take_is_kept_in_order() {
        // (the buffer, the payloads and their places)
        type Layout<'a> = (&'a [u8], &'a [(usize, &'a [u8])]);
        let layouts: [Layout<'_>; 4] = [
            (b"hhhhtt", &[(2, b"PPPP"), (4, b"QQ")]),
            (b"hh", &[(2, b"PPPP")]),
            (b"", &[(0, b"PPPP"), (0, b"QQQ")]),
            (b"abc", &[(0, b"PP"), (1, b"Q"), (3, b"RRR")]),
        ];
        for (head, list) in layouts {
            let payloads: Payloads = list
                .iter()
                .map(|(at, p)| (*at, Bytes::copy_from_slice(p)))
                .collect();
            let whole = joined(head, &payloads);
            for used in 0..=whole.len() {
                let mut plain = BytesMut::from(head);
                let mut rest = payloads.clone();
                keep_unsent(&mut plain, &mut rest, used);
                assert_eq!(joined(&plain, &rest), whole[used..], "{head:?} used {used}");
                assert!(plain.len() <= head.len(), "nothing copied into plain");
                assert!(
                    rest.iter().all(|(_, p)| !p.is_empty()),
                    "no empty payload kept"
                );
            }
        }
    }
}

#[cfg(test)]
mod drop_tests {
    use std::time::Duration;

    use monoio::io::{AsyncReadRent, Splitable};
    use monoio::net::{TcpListener, TcpStream, UnixStream};

    use crate::io::runtime::{Either, race, run_on_each_engine};

    /// What `Wr::close` relies on in monoio: its TCP write half sends FIN
    /// when dropped, its Unix one does not (the read half still holds the
    /// socket; the close ends it). If monoio changes either, this fails
    /// and `Wr::close` would skip or double a shutdown.
    #[test]
    fn a_dropped_tcp_write_half_sends_fin_and_a_unix_one_does_not() {
        run_on_each_engine(|engine| async move {
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = listener.local_addr().unwrap();
            let ours = TcpStream::connect_addr(addr).await.unwrap();
            let (mut peer, _) = listener.accept().await.unwrap();
            let (_rd, wr) = ours.into_split();
            drop(wr);
            let eof = race(
                peer.read(Vec::with_capacity(8)),
                monoio::time::sleep(Duration::from_secs(20)),
            )
            .await;
            assert!(
                matches!(eof, Either::Left((Ok(0), _))),
                "{engine}: no EOF after the TCP write half was dropped"
            );
            let (ours, mut peer) = UnixStream::pair().unwrap();
            let (_rd, wr) = ours.into_split();
            drop(wr);
            // A bounded negative check: no EOF while the read half lives.
            let quiet = race(
                peer.read(Vec::with_capacity(8)),
                monoio::time::sleep(Duration::from_millis(50)),
            )
            .await;
            assert!(
                matches!(quiet, Either::Right(())),
                "{engine}: the Unix write half's drop shut the socket down"
            );
        });
    }
}
