//! Work crossing cores: the worker mesh and socket migration.
//!
//! konn serves each relayed flow (frontend connection ↔ agent tunnel) on one
//! core. A frontend accepted on core A whose agent tunnel lives on core B is
//! *moved* to B once, right after the dial picked the agent; from then on its
//! packets never cross cores. What still crosses cores is rare: control
//! messages (tunnel registration, drain, metrics scrapes) and the migrations
//! themselves. `docs/design/cross-core.md` explains the placement policy and
//! the cost model (a cross-core wake-up costs ≈ 30 µs on the reference
//! 2-vCPU VM, so everything here is built to pay it once per batch).
//!
//! # The mesh
//!
//! [`Mesh<T>`] gives every worker one bounded lock-free MPSC inbox
//! (`crossbeam_queue::ArrayQueue`). Any thread sends with
//! [`MeshSender::send`], which never blocks and never allocates: a full
//! inbox hands the message back ([`SendError::Full`]) so the caller decides
//! (retry later, serve locally, or refuse). Each worker drains its inbox in
//! batches with [`MeshReceiver::recv_batch`] or [`MeshReceiver::serve`].
//!
//! Wake-ups: a parked receiver stores its task waker in the inbox and raises
//! `parked`. A sender pushes, then (after a SeqCst fence) checks `parked`;
//! only the sender that flips it from `true` to `false` takes the waker and
//! wakes the receiver. So a burst of N messages costs one wake-up, and a
//! receiver that is running (not parked) costs senders one relaxed load.
//! The wake itself goes through monoio's `sync` feature: the waker is
//! queued to the owning thread and that thread's driver is unparked with an
//! eventfd write (io_uring) or mio's waker (epoll), which monoio skips when
//! the target thread is awake anyway.
//!
//! The receiver side runs the mirror sequence (store waker, raise `parked`,
//! fence, look at the queue again), so one of the two always sees the other
//! and no wake-up is lost.
//!
//! # Socket migration
//!
//! [`detach_tcp`] / [`detach_unix`] turn a monoio stream into a `Send`
//! [`DetachedTcp`] / [`DetachedUnix`] that travels through the mesh; on the
//! target worker [`DetachedTcp::attach`] rebuilds a monoio stream registered
//! with *that* worker's driver.
//!
//! What monoio guarantees, and why detaching duplicates the descriptor:
//! a monoio stream holds a `SharedFd`, an `Rc` whose clones are held by the
//! stream and by every submitted operation. Under io_uring, an operation
//! whose future was dropped before completion stays in the driver
//! (`Lifecycle::Ignored`, with an `ASYNC_CANCEL` queued) *holding its clone*
//! until its completion arrives; the descriptor is closed (by an io_uring
//! `close` op, or `close(2)` after the epoll deregistration) only when the
//! last clone goes. `IntoRawFd` on a monoio stream panics if another clone
//! exists, and konn's release profile aborts on panic, so it is not used.
//! Instead [`detach_tcp`] `dup`s the descriptor (`F_DUPFD_CLOEXEC`) and drops
//! the stream: the duplicate has never been given to any ring or epoll set,
//! so no operation of the old worker can reference it, while the original
//! number is closed by the old worker's driver once its last operation has
//! completed. Both numbers refer to the same socket, so socket options
//! (`TCP_NODELAY`, buffer sizes) carry over.
//!
//! The remaining contract is about *data*, not memory safety: detach only a
//! stream with no abandoned I/O. A read whose future was dropped may still
//! complete in the kernel and consume bytes the new owner will never see
//! (the same is true without migration). Drivers detach at a protocol
//! boundary, after their last read and write have completed.

use std::{
    fmt,
    future::Future,
    io,
    os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd},
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering, fence},
    },
    task::{Context, Poll, Waker},
};

use crossbeam_queue::ArrayQueue;
use crossbeam_utils::{CachePadded, atomic::AtomicCell};
use monoio::net::{TcpStream, UnixStream};

use super::runtime::{Either, StopToken, race, yield_now};
use crate::Error;

/// Per-worker bounded inboxes plus cross-thread wake-ups.
pub struct Mesh<T> {
    shared: Arc<MeshShared<T>>,
}

struct MeshShared<T> {
    inboxes: Box<[Inbox<T>]>,
}

struct Inbox<T> {
    queue: ArrayQueue<T>,
    /// The receiver stored its waker and is (about to be) parked.
    parked: CachePadded<AtomicBool>,
    waker: AtomicCell<Option<Waker>>,
    /// No receiver any more: sends fail with [`SendError::Closed`].
    closed: AtomicBool,
    /// The receiver handle was handed out.
    claimed: AtomicBool,
    wakeups: AtomicU64,
    rejected_full: AtomicU64,
}

impl<T> Inbox<T> {
    fn new(capacity: usize) -> Self {
        Self {
            queue: ArrayQueue::new(capacity),
            parked: CachePadded::new(AtomicBool::new(false)),
            waker: AtomicCell::new(None),
            closed: AtomicBool::new(false),
            claimed: AtomicBool::new(false),
            wakeups: AtomicU64::new(0),
            rejected_full: AtomicU64::new(0),
        }
    }

    /// Marks the inbox closed and drops what is queued. Meant to run on the
    /// receiver's thread: the waker it drops belongs to a task of that
    /// thread, and monoio releases a task on whichever thread drops its
    /// last reference.
    fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        self.parked.store(false, Ordering::Relaxed);
        drop(self.waker.take());
        while self.queue.pop().is_some() {}
    }
}

impl<T: Send> Mesh<T> {
    /// A mesh of `workers` inboxes holding up to `capacity` messages each.
    ///
    /// # Panics
    ///
    /// If `workers` or `capacity` is zero.
    pub fn new(workers: usize, capacity: usize) -> Self {
        assert!(workers > 0, "a mesh needs at least one worker");
        assert!(capacity > 0, "inbox capacity must be at least 1");
        let inboxes = (0..workers).map(|_| Inbox::new(capacity)).collect();
        Self {
            shared: Arc::new(MeshShared { inboxes }),
        }
    }

    /// Number of inboxes.
    pub fn workers(&self) -> usize {
        self.shared.inboxes.len()
    }

    /// A sender into every inbox.
    pub fn sender(&self) -> MeshSender<T> {
        MeshSender {
            shared: Arc::clone(&self.shared),
        }
    }

    /// The receiving end of `worker`'s inbox; `None` if out of range or
    /// already handed out (each inbox has exactly one receiver).
    pub fn receiver(&self, worker: usize) -> Option<MeshReceiver<T>> {
        let inbox = self.shared.inboxes.get(worker)?;
        if inbox.claimed.swap(true, Ordering::AcqRel) {
            return None;
        }
        Some(MeshReceiver {
            shared: Arc::clone(&self.shared),
            index: worker,
        })
    }
}

impl<T> fmt::Debug for Mesh<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Mesh")
            .field("workers", &self.shared.inboxes.len())
            .finish_non_exhaustive()
    }
}

/// Why a message could not be sent; holds the message so nothing is lost.
pub enum SendError<T> {
    /// The target inbox is full: the receiver is behind.
    Full(T),
    /// The target worker's receiver is gone (the worker stopped).
    Closed(T),
    /// There is no worker with that index.
    NoSuchWorker(T),
}

impl<T> SendError<T> {
    /// The message that was not sent.
    pub fn into_inner(self) -> T {
        match self {
            Self::Full(msg) | Self::Closed(msg) | Self::NoSuchWorker(msg) => msg,
        }
    }
}

impl<T> fmt::Debug for SendError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Full(_) => "Full(..)",
            Self::Closed(_) => "Closed(..)",
            Self::NoSuchWorker(_) => "NoSuchWorker(..)",
        })
    }
}

impl<T> fmt::Display for SendError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Full(_) => "worker inbox full",
            Self::Closed(_) => "worker inbox closed",
            Self::NoSuchWorker(_) => "no such worker",
        })
    }
}

impl<T> std::error::Error for SendError<T> {}

/// Counters of one inbox, for metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct InboxStats {
    /// Messages waiting now.
    pub queued: usize,
    /// Capacity of the inbox.
    pub capacity: usize,
    /// Cross-thread wake-ups senders issued (one per batch at most).
    pub wakeups: u64,
    /// Sends rejected because the inbox was full.
    pub rejected_full: u64,
}

/// Sends messages to any worker's inbox; cheap to clone, `Send + Sync`.
pub struct MeshSender<T> {
    shared: Arc<MeshShared<T>>,
}

impl<T> Clone for MeshSender<T> {
    fn clone(&self) -> Self {
        Self {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<T> fmt::Debug for MeshSender<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MeshSender")
            .field("workers", &self.shared.inboxes.len())
            .finish()
    }
}

impl<T: Send> MeshSender<T> {
    /// Number of workers.
    pub fn workers(&self) -> usize {
        self.shared.inboxes.len()
    }

    /// Queues `msg` for worker `to` and wakes its receiver if it is parked.
    /// Never blocks, never allocates.
    ///
    /// # Errors
    ///
    /// The message comes back in [`SendError::Full`], [`SendError::Closed`]
    /// or [`SendError::NoSuchWorker`].
    pub fn send(&self, to: usize, msg: T) -> Result<(), SendError<T>> {
        let Some(inbox) = self.shared.inboxes.get(to) else {
            return Err(SendError::NoSuchWorker(msg));
        };
        if inbox.closed.load(Ordering::Acquire) {
            return Err(SendError::Closed(msg));
        }
        if let Err(msg) = inbox.queue.push(msg) {
            inbox.rejected_full.fetch_add(1, Ordering::Relaxed);
            return Err(SendError::Full(msg));
        }
        // Pairs with the fence in `MeshReceiver::poll_batch`: either this
        // load sees `parked`, or the receiver's second look sees the message.
        fence(Ordering::SeqCst);
        if inbox.parked.load(Ordering::Relaxed)
            && inbox.parked.swap(false, Ordering::AcqRel)
            && let Some(waker) = inbox.waker.take()
        {
            inbox.wakeups.fetch_add(1, Ordering::Relaxed);
            waker.wake();
        }
        Ok(())
    }

    /// Counters of `worker`'s inbox.
    pub fn stats(&self, worker: usize) -> Option<InboxStats> {
        let inbox = self.shared.inboxes.get(worker)?;
        Some(InboxStats {
            queued: inbox.queue.len(),
            capacity: inbox.queue.capacity(),
            wakeups: inbox.wakeups.load(Ordering::Relaxed),
            rejected_full: inbox.rejected_full.load(Ordering::Relaxed),
        })
    }

    /// Closes `worker`'s inbox from the worker's own thread as it shuts down
    /// (see [`Workers`](super::runtime::Workers)).
    pub(crate) fn close_inbox(&self, worker: usize) {
        if let Some(inbox) = self.shared.inboxes.get(worker) {
            inbox.close();
        }
    }
}

/// The receiving end of one worker's inbox. `Send`, so it can be created
/// before the worker thread starts; poll it from one task at a time and drop
/// it on the thread that polled it. Dropping it closes the inbox.
pub struct MeshReceiver<T> {
    shared: Arc<MeshShared<T>>,
    index: usize,
}

impl<T> fmt::Debug for MeshReceiver<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MeshReceiver")
            .field("index", &self.index)
            .finish()
    }
}

impl<T: Send> MeshReceiver<T> {
    fn inbox(&self) -> &Inbox<T> {
        // `index` was checked when the receiver was created.
        &self.shared.inboxes[self.index]
    }

    /// The worker index this inbox belongs to.
    pub fn index(&self) -> usize {
        self.index
    }

    /// Takes one message if any is queued.
    pub fn try_recv(&self) -> Option<T> {
        self.inbox().queue.pop()
    }

    /// Waits until at least one message is queued, then moves up to `max`
    /// (at least 1) into `out` and returns how many. Returns 0 once the
    /// inbox is closed. Give `out` capacity `max` to stay allocation-free.
    pub fn recv_batch<'a>(&'a mut self, out: &'a mut Vec<T>, max: usize) -> RecvBatch<'a, T> {
        RecvBatch {
            receiver: self,
            out,
            max: max.max(1),
        }
    }

    fn drain(&self, out: &mut Vec<T>, max: usize) -> usize {
        let inbox = self.inbox();
        let mut n = 0;
        while n < max {
            match inbox.queue.pop() {
                Some(msg) => {
                    out.push(msg);
                    n += 1;
                }
                None => break,
            }
        }
        n
    }

    fn poll_batch(&self, cx: &mut Context<'_>, out: &mut Vec<T>, max: usize) -> Poll<usize> {
        let inbox = self.inbox();
        let n = self.drain(out, max);
        if n > 0 {
            return Poll::Ready(n);
        }
        if inbox.closed.load(Ordering::Acquire) {
            return Poll::Ready(0);
        }
        inbox.waker.store(Some(cx.waker().clone()));
        inbox.parked.store(true, Ordering::SeqCst);
        // Pairs with the fence in `MeshSender::send`.
        fence(Ordering::SeqCst);
        let n = self.drain(out, max);
        if n > 0 {
            // No wake-up needed any more; a sender that already claimed
            // `parked` causes at most one spurious wake.
            inbox.parked.store(false, Ordering::Relaxed);
            return Poll::Ready(n);
        }
        if inbox.closed.load(Ordering::Acquire) {
            inbox.parked.store(false, Ordering::Relaxed);
            drop(inbox.waker.take());
            return Poll::Ready(0);
        }
        Poll::Pending
    }

    /// Runs `handle` on every message until `stop` fires or the inbox
    /// closes, taking up to `max_batch` messages per wake-up and yielding to
    /// the worker's other tasks after each batch. Messages still queued at
    /// stop are dropped with the receiver.
    pub async fn serve(&mut self, stop: &StopToken, max_batch: usize, mut handle: impl FnMut(T)) {
        let max_batch = max_batch.max(1);
        let mut batch = Vec::with_capacity(max_batch);
        loop {
            match race(stop.stopped(), self.recv_batch(&mut batch, max_batch)).await {
                Either::Left(()) | Either::Right(0) => return,
                Either::Right(_) => {
                    for msg in batch.drain(..) {
                        handle(msg);
                    }
                    yield_now().await;
                }
            }
        }
    }
}

impl<T> Drop for MeshReceiver<T> {
    fn drop(&mut self) {
        if let Some(inbox) = self.shared.inboxes.get(self.index) {
            inbox.close();
        }
    }
}

/// Future returned by [`MeshReceiver::recv_batch`].
pub struct RecvBatch<'a, T> {
    receiver: &'a MeshReceiver<T>,
    out: &'a mut Vec<T>,
    max: usize,
}

impl<T> fmt::Debug for RecvBatch<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RecvBatch")
            .field("index", &self.receiver.index)
            .field("max", &self.max)
            .finish()
    }
}

impl<T: Send> Future for RecvBatch<'_, T> {
    type Output = usize;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<usize> {
        let this = self.get_mut();
        this.receiver.poll_batch(cx, this.out, this.max)
    }
}

// ----- socket migration ------------------------------------------------------

/// A TCP connection detached from its worker, ready to cross cores.
#[derive(Debug)]
pub struct DetachedTcp {
    fd: OwnedFd,
}

/// A Unix-socket connection detached from its worker, ready to cross cores.
#[derive(Debug)]
pub struct DetachedUnix {
    fd: OwnedFd,
}

/// `dup`s the descriptor of a stream the caller owns.
#[allow(unsafe_code)]
fn dup_stream_fd(stream: &impl AsRawFd) -> io::Result<OwnedFd> {
    // SAFETY: the caller holds the stream for the whole call, and a monoio
    // stream's descriptor stays open as long as the stream exists.
    let borrowed = unsafe { BorrowedFd::borrow_raw(stream.as_raw_fd()) };
    borrowed.try_clone_to_owned()
}

/// Detaches a TCP stream from the current worker (see the module docs for
/// the guarantees). On failure (e.g. `EMFILE` from `dup`) the stream is
/// handed back untouched, so the caller can keep serving it locally.
///
/// # Errors
///
/// [`Error::Migrate`] with the `dup` error, together with the stream.
// The stream travels back by value on the rare failure path; boxing it
// would only move the cost.
#[allow(clippy::result_large_err)]
pub fn detach_tcp(stream: TcpStream) -> Result<DetachedTcp, (TcpStream, Error)> {
    match dup_stream_fd(&stream) {
        Ok(fd) => {
            drop(stream);
            Ok(DetachedTcp { fd })
        }
        Err(err) => Err((stream, Error::Migrate(err))),
    }
}

/// Detaches a Unix stream from the current worker; as [`detach_tcp`].
///
/// # Errors
///
/// [`Error::Migrate`] with the `dup` error, together with the stream.
// The stream travels back by value on the rare failure path; boxing it
// would only move the cost.
#[allow(clippy::result_large_err)]
pub fn detach_unix(stream: UnixStream) -> Result<DetachedUnix, (UnixStream, Error)> {
    match dup_stream_fd(&stream) {
        Ok(fd) => {
            drop(stream);
            Ok(DetachedUnix { fd })
        }
        Err(err) => Err((stream, Error::Migrate(err))),
    }
}

/// Blocking mode the current monoio driver expects: monoio creates sockets
/// non-blocking under epoll and blocking under io_uring.
fn set_mode_for_current_driver(fd: &impl AsFd) -> io::Result<()> {
    let socket = socket2::SockRef::from(fd);
    socket.set_nonblocking(monoio::utils::is_legacy())
}

impl DetachedTcp {
    /// Registers the connection with the current worker's driver.
    ///
    /// # Errors
    ///
    /// [`Error::Migrate`] if the socket cannot be set up (it is closed).
    ///
    /// # Panics
    ///
    /// Outside a monoio runtime.
    pub fn attach(self) -> Result<TcpStream, Error> {
        set_mode_for_current_driver(&self.fd).map_err(Error::Migrate)?;
        TcpStream::from_std(std::net::TcpStream::from(self.fd)).map_err(Error::Migrate)
    }

    /// Wraps a connected TCP socket from elsewhere (e.g. `std`).
    pub fn from_owned_fd(fd: OwnedFd) -> Self {
        Self { fd }
    }

    /// The descriptor, e.g. to close the connection without attaching.
    pub fn into_owned_fd(self) -> OwnedFd {
        self.fd
    }
}

impl AsFd for DetachedTcp {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl DetachedUnix {
    /// Registers the connection with the current worker's driver.
    ///
    /// # Errors
    ///
    /// [`Error::Migrate`] if the socket cannot be set up (it is closed).
    ///
    /// # Panics
    ///
    /// Outside a monoio runtime.
    pub fn attach(self) -> Result<UnixStream, Error> {
        set_mode_for_current_driver(&self.fd).map_err(Error::Migrate)?;
        UnixStream::from_std(std::os::unix::net::UnixStream::from(self.fd)).map_err(Error::Migrate)
    }

    /// Wraps a connected Unix socket from elsewhere (e.g. `std`).
    pub fn from_owned_fd(fd: OwnedFd) -> Self {
        Self { fd }
    }

    /// The descriptor, e.g. to close the connection without attaching.
    pub fn into_owned_fd(self) -> OwnedFd {
        self.fd
    }
}

impl AsFd for DetachedUnix {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn send_and_try_recv_without_runtime() {
        let mesh = Mesh::<u32>::new(2, 4);
        let tx = mesh.sender();
        let rx = mesh.receiver(1).unwrap();
        assert!(mesh.receiver(1).is_none(), "one receiver per inbox");
        tx.send(1, 7).unwrap();
        tx.send(1, 8).unwrap();
        assert_eq!(rx.try_recv(), Some(7));
        assert_eq!(rx.try_recv(), Some(8));
        assert_eq!(rx.try_recv(), None);
    }

    #[test]
    fn full_inbox_returns_the_message() {
        let mesh = Mesh::<u32>::new(1, 2);
        let tx = mesh.sender();
        let _rx = mesh.receiver(0).unwrap();
        tx.send(0, 1).unwrap();
        tx.send(0, 2).unwrap();
        match tx.send(0, 3) {
            Err(SendError::Full(3)) => {}
            other => panic!("expected Full(3), got {other:?}"),
        }
        let stats = tx.stats(0).unwrap();
        assert_eq!(stats.queued, 2);
        assert_eq!(stats.capacity, 2);
        assert_eq!(stats.rejected_full, 1);
    }

    #[test]
    fn closed_and_missing_workers() {
        let mesh = Mesh::<u32>::new(1, 2);
        let tx = mesh.sender();
        assert!(matches!(tx.send(5, 1), Err(SendError::NoSuchWorker(1))));
        let rx = mesh.receiver(0).unwrap();
        tx.send(0, 1).unwrap();
        drop(rx);
        assert!(matches!(tx.send(0, 2), Err(SendError::Closed(2))));
        assert_eq!(
            tx.stats(0).unwrap().queued,
            0,
            "close drops queued messages"
        );
        assert_eq!(SendError::Full(9).into_inner(), 9);
        assert_eq!(SendError::Closed(1u8).to_string(), "worker inbox closed");
    }

    #[test]
    #[should_panic(expected = "capacity")]
    fn zero_capacity_is_rejected() {
        let _ = Mesh::<u8>::new(1, 0);
    }
}
