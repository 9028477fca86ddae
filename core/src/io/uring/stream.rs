//! Sockets on the data ring: a multishot receive feeding a bounded queue of
//! pooled chunks, sends of owned buffers, shutdown, close.

use std::any::Any;
use std::cell::{Cell, RefCell};
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::rc::Rc;
use std::task::{Poll, Waker};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use io_uring::{opcode, types};

use super::bufs::GroupKind;
use super::ring::{Chunks, Hold, Inner, MsgBuf, OwnedBuf, Ring, current, poll_until};
use crate::Error;
use crate::io::pool;

/// Bytes a socket may have received and not yet handed to its reader
/// before its multishot receive is cancelled (TCP then pushes back on the
/// peer). Re-armed when the reader has taken everything.
pub const RECV_QUEUE_LIMIT: usize = 256 * 1024;

/// How long [`RingStream::into_io`] waits for a cancelled receive to end.
const DETACH_TIMEOUT: Duration = Duration::from_secs(1);

struct RecvState {
    /// The armed multishot receive.
    armed: Option<u32>,
    /// A cancellation of `armed` was requested (queue limit, detach).
    cancelling: bool,
    chunks: Chunks,
    /// EOF (0) or an error (negative errno), after the chunks.
    end: Option<i32>,
    waker: Option<Waker>,
}

/// A socket's state shared by its halves and its operations in flight
/// (which keep the descriptor open until they complete).
pub(super) struct SockCore {
    ring: Rc<Inner>,
    /// The descriptor of `held`, which the ring's operations name.
    fd: RawFd,
    group: GroupKind,
    /// The monoio stream the socket came from, kept (and its descriptor
    /// open) while the socket is on the ring; dropping it closes the
    /// descriptor through monoio. Taken by [`RingStream::into_io`].
    held: Option<Box<dyn Any>>,
    /// The `sendmsg` header of gathered sends, kept for reuse.
    msg: Cell<Option<Box<MsgBuf>>>,
    recv: RefCell<RecvState>,
}

impl SockCore {
    pub(super) fn fd(&self) -> RawFd {
        self.fd
    }

    pub(super) fn group(&self) -> GroupKind {
        self.group
    }

    /// One completion of this socket's multishot receive.
    pub(super) fn on_recv(&self, res: i32, more: bool, chunk: Option<BytesMut>) {
        let mut st = self.recv.borrow_mut();
        if !more {
            st.armed = None;
            st.cancelling = false;
        }
        match (res, chunk) {
            (1.., Some(c)) => {
                st.chunks.push(c);
                if st.chunks.bytes() >= RECV_QUEUE_LIMIT
                    && !st.cancelling
                    && let Some(idx) = st.armed
                {
                    st.cancelling = true;
                    self.ring.cancel(idx);
                }
            }
            (1.., None) => st.end = Some(-libc::EIO),
            (0, _) => st.end = Some(0),
            // Out of provided buffers, or cancelled by konn: the reader
            // re-arms (waiting for buffers if it must).
            (e, _) if e == -libc::ENOBUFS || e == -libc::ECANCELED => {}
            (e, _) => st.end = Some(e),
        }
        if let Some(w) = st.waker.take() {
            w.wake();
        }
    }

    /// Cancels the armed receive, if any.
    fn stop_recv(&self) {
        let mut st = self.recv.borrow_mut();
        if let Some(idx) = st.armed
            && !st.cancelling
        {
            st.cancelling = true;
            self.ring.cancel(idx);
        }
    }
}

impl Drop for SockCore {
    fn drop(&mut self) {
        self.ring.socket_closed();
        // monoio closes the descriptor (batched in its own ring).
        drop(self.held.take());
    }
}

/// What one poll of the receive queue found.
enum Recv {
    Chunk(BytesMut),
    End(i32),
    /// The group has no buffer to receive into.
    NeedBuffer,
}

/// A connected socket on the data ring. Split it for the driver, or use it
/// whole.
pub struct RingStream {
    sock: Rc<SockCore>,
}

/// The receiving half of a [`RingStream`].
pub struct RingRead {
    sock: Rc<SockCore>,
    /// Being reunited: keep the receive armed.
    reuniting: bool,
}

/// The sending half of a [`RingStream`].
pub struct RingWrite {
    sock: Rc<SockCore>,
}

/// Moves a monoio `TcpStream` or `UnixStream` onto this thread's data ring,
/// if it has one, receiving into the buffer group `group`; anything else
/// (or no ring) comes back unchanged.
///
/// The ring keeps the monoio stream, and with it the descriptor, for as
/// long as the socket is on the ring (its operations hold the socket, so
/// the descriptor is open until the last of them completes), and monoio
/// closes it when the socket goes. Taking the descriptor out of monoio's
/// stream instead could race with a monoio operation that ended early and
/// still names it; a `dup` of it cost a system call per socket (0007,
/// step 6).
///
/// # Errors
///
/// The stream, unchanged, when there is no ring.
pub fn adopt<IO: 'static>(io: IO, group: GroupKind) -> Result<RingStream, IO> {
    let Some(ring) = current().filter(|r| r.0.is_open()) else {
        return Err(io);
    };
    let Some(fd) = raw_fd_of(&io) else {
        return Err(io);
    };
    Ok(RingStream::new(&ring, Box::new(io), fd, group))
}

/// The descriptor of a monoio TCP or Unix stream.
fn raw_fd_of<IO: 'static>(io: &IO) -> Option<RawFd> {
    let any: &dyn Any = io;
    if let Some(s) = any.downcast_ref::<monoio::net::TcpStream>() {
        Some(s.as_raw_fd())
    } else {
        any.downcast_ref::<monoio::net::UnixStream>()
            .map(AsRawFd::as_raw_fd)
    }
}

impl RingStream {
    fn new(ring: &Ring, held: Box<dyn Any>, fd: RawFd, group: GroupKind) -> Self {
        ring.0.socket_opened();
        Self {
            sock: Rc::new(SockCore {
                ring: ring.0.clone(),
                fd,
                group,
                held: Some(held),
                msg: Cell::new(None),
                recv: RefCell::new(RecvState {
                    armed: None,
                    cancelling: false,
                    chunks: Chunks::default(),
                    end: None,
                    waker: None,
                }),
            }),
        }
    }

    /// The two halves (they share the socket; it closes when both and
    /// every operation in flight are gone).
    pub fn into_split(self) -> (RingRead, RingWrite) {
        (
            RingRead {
                sock: self.sock.clone(),
                reuniting: false,
            },
            RingWrite { sock: self.sock },
        )
    }

    /// Joins two halves of the same socket again.
    ///
    /// # Errors
    ///
    /// [`Error::Usage`] for halves of different sockets.
    pub fn reunite(rd: RingRead, wr: RingWrite) -> Result<Self, Error> {
        if !Rc::ptr_eq(&rd.sock, &wr.sock) {
            return Err(Error::Usage("ring socket halves do not match"));
        }
        let mut rd = rd;
        rd.reuniting = true;
        drop(rd);
        Ok(Self {
            sock: wr.sock.clone(),
        })
    }

    /// Stops receiving (waiting at most a second for the kernel), hands
    /// back everything received but not read, and turns the socket back
    /// into the monoio stream it came from (`IO` must be that type). Used
    /// to migrate a connection to another core.
    ///
    /// # Errors
    ///
    /// [`Error::Usage`] when `IO` is not the socket's type or an operation
    /// is still in flight.
    pub async fn into_io<IO: 'static>(self) -> Result<(IO, BytesMut), Error> {
        self.sock.stop_recv();
        // The receive's last completion (no "more" flag) disarms it and
        // wakes the waiter; the halves are gone, so the waker slot is ours.
        let stopped = std::future::poll_fn(|cx| {
            let mut st = self.sock.recv.borrow_mut();
            if st.armed.is_none() {
                Poll::Ready(())
            } else {
                st.waker = Some(cx.waker().clone());
                Poll::Pending
            }
        });
        if monoio::time::timeout(DETACH_TIMEOUT, stopped)
            .await
            .is_err()
        {
            return Err(Error::Usage("ring socket: receive did not stop"));
        }
        let mut rest = BytesMut::new();
        {
            let mut st = self.sock.recv.borrow_mut();
            while let Some(c) = st.chunks.pop() {
                rest.extend_from_slice(&c);
            }
        }
        let mut sock = Rc::try_unwrap(self.sock)
            .map_err(|_| Error::Usage("ring socket: an operation is still in flight"))?;
        // A stream of another type is dropped here: monoio closes it.
        sock.held
            .take()
            .and_then(|held| held.downcast::<IO>().ok())
            .map(|io| (*io, rest))
            .ok_or(Error::Usage(
                "ring socket: not the stream type it came from",
            ))
    }
}

/// What [`RingRead::recv_chunk`] found.
#[derive(Debug)]
pub enum Received {
    /// Received bytes in a pooled buffer.
    Chunk(BytesMut),
    /// The peer closed its sending direction.
    Eof,
    /// The worker's provided buffers are used up and the pool has none
    /// right now: see [`RingRead::wait_for_buffer`].
    NoBuffer,
}

impl RingRead {
    /// The next chunk of received bytes, in a pooled buffer (after
    /// [`PACKET_HEADROOM`](super::PACKET_HEADROOM) zeroed bytes for a
    /// packet socket); `None` at EOF. While the worker's provided buffers
    /// are used up it waits for the pool, at most the pool's
    /// `acquire_timeout`.
    ///
    /// # Errors
    ///
    /// The socket's error, or [`Error::BufferWaitTimeout`].
    pub async fn recv(&mut self) -> Result<Option<BytesMut>, Error> {
        loop {
            match self.recv_chunk().await? {
                Received::Chunk(c) => return Ok(Some(c)),
                Received::Eof => return Ok(None),
                Received::NoBuffer => self.wait_for_buffer().await?,
            }
        }
    }

    /// Like [`recv`](Self::recv), but returns [`Received::NoBuffer`]
    /// instead of waiting for the pool, so the caller can first let go of
    /// pooled memory it pins (a partial frame) — otherwise readers waiting
    /// for buffers could hold every buffer that would come back.
    ///
    /// # Errors
    ///
    /// The socket's error.
    pub async fn recv_chunk(&mut self) -> Result<Received, Error> {
        let sock = &self.sock;
        let got = poll_until(|cx| {
            let mut st = sock.recv.borrow_mut();
            if let Some(c) = st.chunks.pop() {
                return Poll::Ready(Recv::Chunk(c));
            }
            if let Some(end) = st.end {
                return Poll::Ready(Recv::End(end));
            }
            if st.armed.is_none() && !st.cancelling {
                match sock.ring.with_group(sock.group, |g| g.refill()) {
                    Ok(true) => match sock.ring.arm_recv(sock) {
                        Some(idx) => st.armed = Some(idx),
                        None => return Poll::Ready(Recv::End(-libc::ECANCELED)),
                    },
                    Ok(false) => return Poll::Ready(Recv::NeedBuffer),
                    Err(e) => {
                        return Poll::Ready(Recv::End(-e.raw_os_error().unwrap_or(libc::EIO)));
                    }
                }
            }
            match &st.waker {
                Some(w) if w.will_wake(cx.waker()) => {}
                _ => st.waker = Some(cx.waker().clone()),
            }
            Poll::Pending
        })
        .await;
        match got {
            Recv::Chunk(c) => Ok(Received::Chunk(c)),
            Recv::End(0) => Ok(Received::Eof),
            Recv::End(e) => Err(Error::Io(io::Error::from_raw_os_error(-e))),
            Recv::NeedBuffer => Ok(Received::NoBuffer),
        }
    }

    /// After [`Received::NoBuffer`]: waits until the socket's buffer group
    /// has a buffer again — one this reader gets from the pool and
    /// provides, or one another reader provided — at most the pool's
    /// `acquire_timeout`, re-checking with the pool's back-off. The wait is
    /// counted once as a refusal in the pool's statistics, as any
    /// reader's.
    ///
    /// # Errors
    ///
    /// [`Error::BufferWaitTimeout`].
    pub async fn wait_for_buffer(&mut self) -> Result<(), Error> {
        // Boxed: the timer would otherwise sit in every reader's state.
        Box::pin(wait_for_buffer(&self.sock)).await
    }

    /// Bytes received and waiting for [`recv`](Self::recv).
    pub fn queued(&self) -> usize {
        self.sock.recv.borrow().chunks.bytes()
    }
}

async fn wait_for_buffer(sock: &SockCore) -> Result<(), Error> {
    let group = sock.group;
    let ready = |sock: &SockCore| {
        sock.ring
            .with_group(group, |g| g.provided() > 0)
            .map_err(Error::Io)
    };
    let size = sock
        .ring
        .with_group(group, |g| g.wait_size())
        .map_err(Error::Io)?;
    let pool = pool::current();
    let limit = pool.acquire_timeout();
    let deadline = monoio::time::Instant::now() + limit;
    let mut delay = pool::ACQUIRE_RETRY;
    let mut attempt = pool.try_acquire_size(size).ok();
    loop {
        if let Some(buf) = attempt.take() {
            return sock
                .ring
                .with_group(group, |g| g.provide(buf))
                .map_err(Error::Io);
        }
        if ready(sock)? {
            return Ok(());
        }
        let left = deadline.saturating_duration_since(monoio::time::Instant::now());
        if left.is_zero() {
            return Err(Error::BufferWaitTimeout(limit));
        }
        monoio::time::sleep(delay.min(left)).await;
        delay = (delay * 2).min(pool::ACQUIRE_RETRY_MAX);
        attempt = pool.try_acquire_quiet(size);
    }
}

impl Drop for RingRead {
    fn drop(&mut self) {
        if self.reuniting {
            return;
        }
        self.sock.stop_recv();
        let mut st = self.sock.recv.borrow_mut();
        st.chunks.clear();
        st.waker = None;
    }
}

impl RingWrite {
    /// Sends all of `buf`; returns it (cleared of nothing) with the
    /// outcome.
    pub async fn write_all(&mut self, buf: BytesMut) -> (io::Result<()>, BytesMut) {
        let mut owned = OwnedBuf::Mut(buf);
        let mut off = 0;
        let res = loop {
            let len = owned.as_slice().len();
            if off >= len {
                break Ok(());
            }
            let (r, back) = self.send_at(owned, off).await;
            owned = back;
            match r {
                Ok(0) => break Err(io::Error::from(io::ErrorKind::WriteZero)),
                Ok(n) => off += n,
                Err(e) => break Err(e),
            }
        };
        match owned {
            OwnedBuf::Mut(b) => (res, b),
            OwnedBuf::Frozen(_) => (res, BytesMut::new()),
        }
    }

    /// Sends as much of `data` as the socket takes in one operation.
    ///
    /// # Errors
    ///
    /// The socket's error.
    pub async fn write(&mut self, data: Bytes) -> io::Result<usize> {
        self.send_at(OwnedBuf::Frozen(data), 0).await.0
    }

    async fn send_at(&mut self, buf: OwnedBuf, off: usize) -> (io::Result<usize>, OwnedBuf) {
        let slice = buf.as_slice();
        let rest = slice.get(off..).unwrap_or_default();
        let sqe = opcode::Send::new(
            types::Fd(self.sock.fd),
            rest.as_ptr(),
            u32::try_from(rest.len()).unwrap_or(u32::MAX),
        )
        .flags(libc::MSG_NOSIGNAL)
        .build();
        let hold = Hold {
            buf: Some(buf),
            msg: None,
            _sock: Some(self.sock.clone()),
        };
        let (res, _, hold) = self.sock.ring.submit(sqe, hold).await;
        let buf = hold.buf.unwrap_or(OwnedBuf::Mut(BytesMut::new()));
        let r = if res < 0 {
            Err(io::Error::from_raw_os_error(-res))
        } else {
            Ok(usize::try_from(res).unwrap_or(0))
        };
        (r, buf)
    }

    /// Sends as much of `bufs` (the first [`MAX_IOV`](super::ring::MAX_IOV)
    /// of them) as the socket takes in one `sendmsg`: one operation for
    /// several queued packets.
    ///
    /// # Errors
    ///
    /// The socket's error.
    pub async fn write_gather(&mut self, bufs: impl Iterator<Item = Bytes>) -> io::Result<usize> {
        let mut msg = self.sock.msg.take().unwrap_or_else(MsgBuf::new);
        let hdr = msg.load(bufs);
        let sqe = opcode::SendMsg::new(types::Fd(self.sock.fd), hdr)
            .flags(libc::MSG_NOSIGNAL as u32)
            .build();
        let hold = Hold {
            buf: None,
            msg: Some(msg),
            _sock: Some(self.sock.clone()),
        };
        let (res, _, hold) = self.sock.ring.submit(sqe, hold).await;
        if let Some(mut msg) = hold.msg {
            msg.clear();
            self.sock.msg.set(Some(msg));
        }
        if res < 0 {
            Err(io::Error::from_raw_os_error(-res))
        } else {
            Ok(usize::try_from(res).unwrap_or(0))
        }
    }

    /// Shuts the sending direction down (`shutdown(SHUT_WR)`).
    ///
    /// # Errors
    ///
    /// The socket's error.
    pub async fn shutdown(&mut self) -> io::Result<()> {
        let sqe = opcode::Shutdown::new(types::Fd(self.sock.fd), libc::SHUT_WR).build();
        let hold = Hold {
            buf: None,
            msg: None,
            _sock: Some(self.sock.clone()),
        };
        let (res, _, _) = self.sock.ring.submit(sqe, hold).await;
        if res < 0 {
            Err(io::Error::from_raw_os_error(-res))
        } else {
            Ok(())
        }
    }
}
