//! The ring itself: set-up and feature probe, the table of operations in
//! flight, batched submission, and the reaper task that runs on monoio.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::future::{Future, poll_fn};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::pin::pin;
use std::ptr::NonNull;
use std::rc::Rc;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use io_uring::{IoUring, cqueue, opcode, squeue, types};

use super::bufs::{self, CQE_F_BUF_MORE, Group, GroupKind};
use super::stream::SockCore;
use crate::io::engine::RingSetup;
use crate::io::notify::Notify;
use crate::io::runtime::{Either, race};

/// `user_data` of cancellations (their completions are ignored).
const CANCEL_UD: u64 = u64::MAX;
/// `IORING_ENTER_GETEVENTS`.
const ENTER_GETEVENTS: u32 = 1;

/// Submission-queue entries of each worker's data ring.
pub const DATA_RING_ENTRIES: u32 = 256;

/// Frame-sized buffers a packet group keeps provided (256 KiB).
const PACKET_TARGET: usize = 16;
/// Buffers each stream group (TLS, plaintext) keeps provided: large ones
/// with incremental consumption (512 KiB), else frame-sized ones
/// (256 KiB).
const STREAM_TARGET_INC: usize = 8;
const STREAM_TARGET: usize = 16;

/// How long [`Ring::close`] waits for the kernel to finish cancelled
/// operations before it gives up on them (and leaks their buffers rather
/// than free memory the kernel might still write).
const CLOSE_TIMEOUT: Duration = Duration::from_secs(2);

/// What this kernel's io_uring offers konn's data ring, probed once per
/// process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Features {
    /// Provided-buffer rings with incremental consumption (Linux 6.12).
    pub incremental: bool,
    /// Where the completion ring's flags word lies in the ring's memory
    /// (`cq_off.flags`), if known.
    cq_flags_offset: Option<u32>,
}

/// Counters of one ring, for tests and diagnostics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RingStats {
    /// Operations submitted and not yet completed (multishot receives
    /// included).
    pub in_flight: usize,
    /// Sockets on this ring that are still open.
    pub sockets: usize,
    /// Buffers currently provided to the kernel (both groups).
    pub provided: usize,
    /// The same in the pool's budget units (a large buffer is
    /// `LARGE_BUF_UNITS`), comparable with `PoolStats::in_use`.
    pub provided_units: usize,
    /// `io_uring_enter` calls.
    pub enters: u64,
    /// Submission entries handed to the kernel.
    pub submitted: u64,
    /// Completions reaped.
    pub completions: u64,
}

/// Resources an operation keeps alive until its completion: the buffer the
/// kernel reads or writes, and the socket whose descriptor it names.
#[derive(Default)]
pub(super) struct Hold {
    pub(super) buf: Option<OwnedBuf>,
    /// The header, iovecs and buffers of a gathered send.
    pub(super) msg: Option<Box<MsgBuf>>,
    /// Only kept: the descriptor stays open while the kernel uses it.
    pub(super) _sock: Option<Rc<SockCore>>,
}

/// Buffers sent with one `sendmsg`, at most this many.
pub const MAX_IOV: usize = 16;

/// A `sendmsg` header with its iovecs and the buffers they point into;
/// boxed, so the kernel's pointers stay valid while the operation holds
/// it. Each socket keeps one for reuse.
pub(super) struct MsgBuf {
    hdr: libc::msghdr,
    iov: [libc::iovec; MAX_IOV],
    bufs: Vec<Bytes>,
}

impl MsgBuf {
    pub(super) fn new() -> Box<Self> {
        Box::new(Self {
            // SAFETY: msghdr is a plain C struct; all zeroes is a valid,
            // empty header.
            hdr: unsafe { std::mem::zeroed() },
            iov: [libc::iovec {
                iov_base: std::ptr::null_mut(),
                iov_len: 0,
            }; MAX_IOV],
            bufs: Vec::with_capacity(MAX_IOV),
        })
    }

    /// Takes `bufs` (at most [`MAX_IOV`]) and points the header at them;
    /// returns the header for the operation. Empty buffers are skipped.
    pub(super) fn load(&mut self, bufs: impl Iterator<Item = Bytes>) -> *const libc::msghdr {
        self.bufs.clear();
        self.bufs
            .extend(bufs.filter(|b| !b.is_empty()).take(MAX_IOV));
        for (iov, b) in self.iov.iter_mut().zip(&self.bufs) {
            iov.iov_base = b.as_ptr().cast_mut().cast();
            iov.iov_len = b.len();
        }
        self.hdr.msg_iov = self.iov.as_mut_ptr();
        self.hdr.msg_iovlen = self.bufs.len();
        &raw const self.hdr
    }

    /// Drops the buffers (after the send completed).
    pub(super) fn clear(&mut self) {
        self.bufs.clear();
    }
}

/// A buffer owned by an operation.
pub(super) enum OwnedBuf {
    Mut(BytesMut),
    Frozen(Bytes),
}

impl OwnedBuf {
    pub(super) fn as_slice(&self) -> &[u8] {
        match self {
            Self::Mut(b) => b,
            Self::Frozen(b) => b,
        }
    }
}

enum Slot {
    Free,
    /// Submitted; the future waits.
    Waiting(Option<Waker>, Hold),
    /// Completed; the future has not collected it yet.
    Done(i32, u32, Hold),
    /// The future was dropped first: free the slot (and its hold) at the
    /// completion.
    Orphan(Hold),
    /// A multishot receive feeding a socket's queue.
    Multi(Rc<SockCore>),
}

#[derive(Default)]
struct Ops {
    slots: Vec<Slot>,
    free: Vec<u32>,
    live: usize,
}

impl Ops {
    fn insert(&mut self, slot: Slot) -> u32 {
        self.live += 1;
        if let Some(i) = self.free.pop()
            && let Some(s) = self.slots.get_mut(i as usize)
        {
            *s = slot;
            return i;
        }
        self.slots.push(slot);
        u32::try_from(self.slots.len() - 1).unwrap_or(u32::MAX)
    }

    fn remove(&mut self, idx: u32) -> Slot {
        match self.slots.get_mut(idx as usize) {
            Some(s @ (Slot::Waiting(..) | Slot::Done(..) | Slot::Orphan(_) | Slot::Multi(_))) => {
                self.live -= 1;
                self.free.push(idx);
                std::mem::replace(s, Slot::Free)
            }
            _ => Slot::Free,
        }
    }
}

/// What the reaper does with one completion, decided while the table is
/// borrowed and carried out after.
enum Reaped {
    Nothing,
    Drop(Hold),
    Recv(Rc<SockCore>, i32, u32),
}

/// The completion ring's flags word (`cq_off.flags`), through a mapping
/// of the ring's shared memory of konn's own: the `io-uring` crate does
/// not expose it. konn sets `IORING_CQ_EVENTFD_DISABLED` there while it
/// submits, so that completions posted during its own `io_uring_enter`
/// (a send that completes at once) do not signal the eventfd and wake
/// the reaper again for nothing.
struct CqFlags {
    map: NonNull<libc::c_void>,
    len: usize,
    flags: NonNull<AtomicU32>,
}

/// `IORING_CQ_EVENTFD_DISABLED`.
const CQ_EVENTFD_DISABLED: u32 = 1;
/// `IORING_OFF_CQ_RING`.
const OFF_CQ_RING: libc::off_t = 0x800_0000;

impl CqFlags {
    fn map(ring_fd: RawFd, offset: u32) -> io::Result<Self> {
        let page = 4096;
        let len = (offset as usize + 4).div_ceil(page) * page;
        // SAFETY: maps the ring's own shared memory (the kernel allows
        // mapping it more than once); the result is checked.
        let map = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                ring_fd,
                OFF_CQ_RING,
            )
        };
        if map == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let map = NonNull::new(map).ok_or_else(|| io::Error::other("mmap returned null"))?;
        // SAFETY: `offset` + 4 lies within the `len` bytes just mapped;
        // the kernel aligns the flags word to 4 bytes.
        let flags = unsafe { map.cast::<u8>().add(offset as usize).cast::<AtomicU32>() };
        Ok(Self { map, len, flags })
    }

    fn set_eventfd(&self, enabled: bool) {
        // SAFETY: `flags` points into the live mapping (unmapped only in
        // `drop`); the kernel only reads this bit, and the ring's single
        // issuer (this thread) is the only writer.
        let flags = unsafe { self.flags.as_ref() };
        if enabled {
            flags.fetch_and(!CQ_EVENTFD_DISABLED, Ordering::Release);
        } else {
            flags.fetch_or(CQ_EVENTFD_DISABLED, Ordering::Release);
        }
    }
}

impl Drop for CqFlags {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `map`.
        unsafe { libc::munmap(self.map.as_ptr(), self.len) };
    }
}

pub(super) struct Inner {
    uring: RefCell<Option<IoUring>>,
    /// `None` where the flags offset could not be learnt (the eventfd then
    /// also fires for konn's own submissions).
    cq_flags: Option<CqFlags>,
    ring_fd: RawFd,
    ops: RefCell<Ops>,
    groups: RefCell<[Option<Group>; 3]>,
    features: Features,
    /// Completions must be fetched with `GETEVENTS` (`DEFER_TASKRUN`).
    defer: bool,
    /// Wakes the reaper: entries to submit.
    kick: Notify,
    kicked: Cell<bool>,
    closing: Cell<bool>,
    /// Completions copied out of the ring before they are handled.
    cqes: RefCell<Vec<(u64, i32, u32)>>,
    sockets: Cell<usize>,
    enters: Cell<u64>,
    submitted: Cell<u64>,
    completions: Cell<u64>,
}

/// The data ring of the current worker. Cheap to clone.
#[derive(Clone)]
pub struct Ring(pub(super) Rc<Inner>);

thread_local! {
    static CURRENT: RefCell<Option<Ring>> = const { RefCell::new(None) };
}

/// The data ring of the runtime running on this thread, if it has one
/// (io_uring engine, kernel support, not disabled).
pub fn current() -> Option<Ring> {
    CURRENT.with(|c| c.borrow().clone())
}

/// Whether the data ring is wanted: `KONN_IO_URING_DATA=monoio` keeps the
/// data path on monoio's own io_uring operations (for measurements).
pub fn wanted() -> bool {
    static WANTED: OnceLock<bool> = OnceLock::new();
    *WANTED.get_or_init(|| std::env::var("KONN_IO_URING_DATA").as_deref() != Ok("monoio"))
}

/// Probes (once per process) what the data ring needs: provided-buffer
/// rings and multishot receive, with a receive on a socket pair.
///
/// # Errors
///
/// Why the data ring cannot be used here (old kernel, io_uring blocked).
pub fn features() -> Result<Features, &'static io::Error> {
    static FEATURES: OnceLock<io::Result<Features>> = OnceLock::new();
    FEATURES.get_or_init(probe).as_ref().map(|f| *f)
}

/// `struct io_uring_params` (include/uapi/linux/io_uring.h).
#[repr(C)]
#[derive(Default)]
struct RawParams {
    sq_entries: u32,
    cq_entries: u32,
    flags: u32,
    sq_thread_cpu: u32,
    sq_thread_idle: u32,
    features: u32,
    wq_fd: u32,
    resv: [u32; 3],
    sq_off: [u32; 10],
    /// head, tail, ring_mask, ring_entries, overflow, cqes, flags, resv1,
    /// user_addr (2 words).
    cq_off: [u32; 10],
}

/// `cq_off.flags` of this kernel's rings (the layout of the shared ring
/// memory is the same for every ring of a kernel).
fn cq_flags_offset() -> io::Result<u32> {
    let mut p = RawParams::default();
    // SAFETY: io_uring_setup(2) with a zeroed, correctly sized params
    // struct it fills in; the descriptor is closed below.
    let fd = unsafe { libc::syscall(libc::SYS_io_uring_setup, 4u32, std::ptr::from_mut(&mut p)) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    let fd = i32::try_from(fd).map_err(io::Error::other)?;
    // SAFETY: `fd` was just returned by io_uring_setup and is ours.
    drop(unsafe { OwnedFd::from_raw_fd(fd) });
    match p.cq_off.get(6).copied() {
        Some(off) if off > 0 && off % 4 == 0 => Ok(off),
        _ => Err(io::Error::other("no cq flags offset")),
    }
}

fn probe() -> io::Result<Features> {
    let mut ring = IoUring::new(8)?;
    let fd = ring.as_raw_fd();
    let mut group = Group::register(fd, GroupKind::Plain, true, 1)?;
    let incremental = group.incremental();
    let (a, b) = std::os::unix::net::UnixStream::pair()?;
    let buf = BytesMut::with_capacity(if incremental {
        crate::io::pool::LARGE_BUF_CAPACITY
    } else {
        crate::io::pool::BUF_CAPACITY
    });
    group.provide(buf);
    io::Write::write_all(&mut &a, b"k")?;
    let recv = opcode::RecvMulti::new(types::Fd(b.as_raw_fd()), GroupKind::Plain.bgid())
        .build()
        .user_data(1);
    // SAFETY: the receive writes only into the group's provided buffer,
    // which `group` keeps alive until after the ring is dropped below.
    unsafe { ring.submission().push(&recv) }.map_err(io::Error::other)?;
    ring.submit_and_wait(1)?;
    let cqe = ring
        .completion()
        .next()
        .ok_or_else(|| io::Error::other("no completion"))?;
    let ok = cqe.result() == 1
        && cqueue::buffer_select(cqe.flags()).is_some()
        && cqueue::more(cqe.flags());
    drop(ring); // cancels the receive
    drop(group);
    if ok {
        Ok(Features {
            incremental,
            cq_flags_offset: cq_flags_offset().ok(),
        })
    } else if cqe.result() < 0 {
        Err(io::Error::from_raw_os_error(-cqe.result()))
    } else {
        Err(io::Error::other("multishot receive unsupported"))
    }
}

impl Ring {
    /// Sets up this thread's data ring, installs it as [`current`] and
    /// starts its reaper task on the running monoio runtime (which must be
    /// an io_uring one: the reaper waits for the ring's eventfd through
    /// it). `None` when the data ring is unwanted or unsupported here (the
    /// data path then stays on monoio's operations).
    pub fn start() -> Option<Self> {
        if !wanted() {
            return None;
        }
        let features = match features() {
            Ok(f) => f,
            Err(err) => {
                log_once_unsupported(err);
                return None;
            }
        };
        match Self::build(features) {
            Ok((ring, efd)) => {
                CURRENT.with(|c| *c.borrow_mut() = Some(ring.clone()));
                let inner = ring.0.clone();
                monoio::spawn(reaper(inner, efd));
                Some(ring)
            }
            Err(err) => {
                log_once_unsupported(&err);
                None
            }
        }
    }

    fn build(features: Features) -> io::Result<(Self, monoio::fs::File)> {
        let setup = data_setup();
        let mut builder = IoUring::builder();
        let defer = match setup {
            RingSetup::DeferTaskrun => {
                builder
                    .setup_single_issuer()
                    .setup_defer_taskrun()
                    .setup_taskrun_flag();
                true
            }
            RingSetup::CoopTaskrun => {
                builder.setup_coop_taskrun().setup_taskrun_flag();
                false
            }
            RingSetup::Plain => false,
        };
        builder.setup_cqsize(DATA_RING_ENTRIES * 4);
        // Only this thread submits: say so where the kernel knows the flag
        // (6.0), which spares it some locking.
        let mut single = builder.clone();
        single.setup_single_issuer();
        let uring = match single.build(DATA_RING_ENTRIES) {
            Ok(u) => u,
            Err(_) => builder.build(DATA_RING_ENTRIES)?,
        };
        // SAFETY: eventfd(2) with valid flags; the result is checked.
        let efd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if efd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `efd` is a fresh descriptor owned by nobody else.
        let efd = unsafe { OwnedFd::from_raw_fd(efd) };
        uring.submitter().register_eventfd(efd.as_raw_fd())?;
        let ring_fd = uring.as_raw_fd();
        let cq_flags = features
            .cq_flags_offset
            .and_then(|off| CqFlags::map(ring_fd, off).ok());
        let inner = Inner {
            uring: RefCell::new(Some(uring)),
            cq_flags,
            ring_fd,
            ops: RefCell::new(Ops::default()),
            groups: RefCell::new([None, None, None]),
            features,
            defer,
            kick: Notify::new(),
            kicked: Cell::new(false),
            closing: Cell::new(false),
            cqes: RefCell::new(Vec::with_capacity(DATA_RING_ENTRIES as usize)),
            sockets: Cell::new(0),
            enters: Cell::new(0),
            submitted: Cell::new(0),
            completions: Cell::new(0),
        };
        let file = monoio::fs::File::from_std(std::fs::File::from(efd))?;
        Ok((Self(Rc::new(inner)), file))
    }

    /// What the kernel offers.
    pub fn features(&self) -> Features {
        self.0.features
    }

    /// Current counters.
    pub fn stats(&self) -> RingStats {
        let groups = self.0.groups.borrow();
        RingStats {
            in_flight: self.0.ops.borrow().live,
            sockets: self.0.sockets.get(),
            provided: groups.iter().flatten().map(Group::provided).sum(),
            provided_units: groups.iter().flatten().map(Group::provided_units).sum(),
            enters: self.0.enters.get(),
            submitted: self.0.submitted.get(),
            completions: self.0.completions.get(),
        }
    }

    /// Cancels every operation, waits (at most [`CLOSE_TIMEOUT`]) for the
    /// kernel to finish them, gives the provided buffers back and closes
    /// the ring. Sockets still open afterwards keep their descriptors
    /// (monoio's streams) until they go.
    pub async fn close(self) {
        CURRENT.with(|c| {
            let mut c = c.borrow_mut();
            if c.as_ref().is_some_and(|r| Rc::ptr_eq(&r.0, &self.0)) {
                *c = None;
            }
        });
        let inner = &self.0;
        inner.closing.set(true);
        inner.push(
            opcode::AsyncCancel2::new(types::CancelBuilder::any())
                .build()
                .user_data(CANCEL_UD),
        );
        let deadline = monoio::time::Instant::now() + CLOSE_TIMEOUT;
        while inner.ops.borrow().live > 0 && monoio::time::Instant::now() < deadline {
            inner.kick();
            monoio::time::sleep(Duration::from_millis(1)).await;
        }
        // Submit what is still queued (cancellations of operations dropped
        // meanwhile) before the ring goes.
        inner.turn();
        inner.kick(); // the reaper sees `closing` with nothing left and ends
        let clean = inner.ops.borrow().live == 0;
        let uring = inner.uring.borrow_mut().take();
        let groups = std::mem::take(&mut *inner.groups.borrow_mut());
        if clean {
            for mut g in groups.into_iter().flatten() {
                bufs::unregister(inner.ring_fd, &mut g);
                drop(g);
            }
        } else {
            tracing::warn!(
                in_flight = inner.ops.borrow().live,
                "io_uring data ring closed with operations in flight; their buffers are leaked"
            );
            std::mem::forget(groups);
        }
        drop(uring);
    }
}

/// The task-running mode of the data ring: `KONN_IO_URING_DATA_SETUP`
/// (`defer`, `coop`, `plain`; for measurements) if set, else
/// `COOP_TASKRUN` where the kernel has it (5.19), else plain.
///
/// Not `DEFER_TASKRUN`, unlike monoio's ring: deferred completion work
/// runs only inside an `io_uring_enter` on *this* ring, so every arrival
/// of data cost the reaper a system call of its own; with cooperative task
/// running the kernel posts the completions whenever the worker enters the
/// kernel anyway (it parks in monoio's ring), without an interrupt
/// (docs/decisions/0007, step 3: 38–40 → 31–32 system calls per dial on
/// the server, 8 → 6 per message on both sides).
fn data_setup() -> RingSetup {
    static SETUP: OnceLock<RingSetup> = OnceLock::new();
    *SETUP.get_or_init(|| {
        let wanted = std::env::var("KONN_IO_URING_DATA_SETUP").ok();
        if let Some(m) = RingSetup::ALL
            .into_iter()
            .find(|m| wanted.as_deref() == Some(m.as_str()))
        {
            return m;
        }
        match RingSetup::chosen() {
            RingSetup::DeferTaskrun | RingSetup::CoopTaskrun => RingSetup::CoopTaskrun,
            RingSetup::Plain => RingSetup::Plain,
        }
    })
}

fn log_once_unsupported(err: &io::Error) {
    static LOGGED: OnceLock<()> = OnceLock::new();
    LOGGED.get_or_init(|| {
        tracing::info!(
            error = %err,
            "io_uring data ring unavailable (needs provided-buffer rings and multishot \
             receive, Linux 6.0); data sockets use monoio's io_uring operations"
        );
    });
}

impl Inner {
    pub(super) fn is_open(&self) -> bool {
        !self.closing.get() && self.uring.borrow().is_some()
    }

    pub(super) fn socket_opened(&self) {
        self.sockets.set(self.sockets.get() + 1);
    }

    pub(super) fn socket_closed(&self) {
        self.sockets.set(self.sockets.get().saturating_sub(1));
    }

    /// Schedules the reaper to submit what was queued, once per turn.
    fn kick(&self) {
        if !self.kicked.replace(true) {
            self.kick.notify();
        }
    }

    /// Queues one entry; submitted by the reaper later in this turn (or at
    /// once when the queue is full). Returns `false` on a closed ring.
    fn push(&self, sqe: squeue::Entry) -> bool {
        let mut u = self.uring.borrow_mut();
        let Some(ring) = u.as_mut() else {
            return false;
        };
        // SAFETY: every entry built in this module points only at memory
        // owned by its slot's `Hold` (or a provided-buffer group), which
        // lives until the entry's completion is reaped. A gathered send's
        // header, iovecs and the buffers they point into are in the
        // `Hold`'s boxed `MsgBuf`, whose heap address moving the box does
        // not change.
        let pushed = unsafe { ring.submission().push(&sqe) }.is_ok();
        if !pushed {
            // The queue is full: submit it, then push again.
            self.enter(ring, false);
            // SAFETY: as above.
            if unsafe { ring.submission().push(&sqe) }.is_err() {
                return false;
            }
        }
        drop(u);
        self.kick();
        true
    }

    /// `io_uring_enter`: submits what is queued and, with `events`, runs
    /// the completion work the kernel deferred (`DEFER_TASKRUN`) and moves
    /// overflowed completions back into the queue.
    fn enter(&self, ring: &mut IoUring, events: bool) {
        let to_submit = u32::try_from(ring.submission().len()).unwrap_or(u32::MAX);
        let flags = if events { ENTER_GETEVENTS } else { 0 };
        if to_submit == 0 && flags == 0 {
            return;
        }
        // What completes during this call is reaped right after it: no
        // eventfd signal for it (the reaper checks for work that arrived
        // meanwhile before it sleeps).
        if let Some(f) = &self.cq_flags {
            f.set_eventfd(false);
        }
        let _unmute = Unmute(self.cq_flags.as_ref());
        loop {
            // SAFETY: no argument struct; the entries being submitted were
            // pushed under the rules of `push`.
            let r = unsafe {
                ring.submitter()
                    .enter::<libc::sigset_t>(to_submit, 0, flags, None)
            };
            self.enters.set(self.enters.get() + 1);
            match r {
                Ok(n) => {
                    self.submitted.set(self.submitted.get() + n as u64);
                    return;
                }
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
                // EBUSY/EAGAIN: the completion queue overflowed; what was
                // not submitted goes with the next call, after a reap.
                Err(_) => return,
            }
        }
    }

    /// Whether the kernel has completions, or deferred completion work,
    /// the reaper has not seen yet.
    fn pending(&self) -> bool {
        let mut u = self.uring.borrow_mut();
        let Some(ring) = u.as_mut() else {
            return false;
        };
        let sq = ring.submission();
        let work = (self.defer && sq.taskrun()) || sq.cq_overflow();
        drop(sq);
        work || !ring.completion().is_empty()
    }

    /// Submits, reaps and handles completions; tops the buffer groups up.
    /// Returns how many completions it handled.
    fn turn(self: &Rc<Self>) -> usize {
        let mut cqes = std::mem::take(&mut *self.cqes.borrow_mut());
        {
            let mut u = self.uring.borrow_mut();
            let Some(ring) = u.as_mut() else {
                return 0;
            };
            // Without DEFER_TASKRUN the kernel posts completions by itself
            // (at this thread's next system call); with it, the TASKRUN
            // flag says whether there is work to run: no call just to
            // look.
            let sq = ring.submission();
            let events = (self.defer && sq.taskrun()) || sq.cq_overflow();
            drop(sq);
            self.enter(ring, events);
            cqes.extend(
                ring.completion()
                    .map(|c| (c.user_data(), c.result(), c.flags())),
            );
        }
        let n = cqes.len();
        self.completions.set(self.completions.get() + n as u64);
        for &(ud, res, flags) in &cqes {
            if ud == CANCEL_UD {
                continue;
            }
            let reaped = {
                let mut ops = self.ops.borrow_mut();
                let idx = u32::try_from(ud).unwrap_or(u32::MAX);
                match ops.slots.get_mut(idx as usize) {
                    Some(Slot::Waiting(waker, hold)) => {
                        let waker = waker.take();
                        let hold = std::mem::take(hold);
                        if let Some(s) = ops.slots.get_mut(idx as usize) {
                            *s = Slot::Done(res, flags, hold);
                        }
                        if let Some(w) = waker {
                            w.wake();
                        }
                        Reaped::Nothing
                    }
                    Some(Slot::Orphan(_)) => match ops.remove(idx) {
                        Slot::Orphan(hold) => Reaped::Drop(hold),
                        _ => Reaped::Nothing,
                    },
                    Some(Slot::Multi(sock)) => {
                        if cqueue::more(flags) {
                            Reaped::Recv(sock.clone(), res, flags)
                        } else {
                            match ops.remove(idx) {
                                Slot::Multi(sock) => Reaped::Recv(sock, res, flags),
                                _ => Reaped::Nothing,
                            }
                        }
                    }
                    _ => Reaped::Nothing,
                }
            };
            match reaped {
                Reaped::Nothing => {}
                Reaped::Drop(hold) => drop(hold),
                Reaped::Recv(sock, res, flags) => {
                    let chunk = match (res, cqueue::buffer_select(flags)) {
                        (len @ 1.., Some(bid)) => {
                            let kind = sock.group();
                            let mut groups = self.groups.borrow_mut();
                            groups
                                .get_mut(usize::from(kind.bgid()))
                                .and_then(Option::as_mut)
                                .and_then(|g| {
                                    g.take(
                                        bid,
                                        usize::try_from(len).unwrap_or(0),
                                        flags & CQE_F_BUF_MORE != 0,
                                    )
                                })
                        }
                        _ => None,
                    };
                    sock.on_recv(res, cqueue::more(flags), chunk);
                }
            }
        }
        cqes.clear();
        *self.cqes.borrow_mut() = cqes;
        if !self.closing.get() {
            for g in self.groups.borrow_mut().iter_mut().flatten() {
                g.refill();
            }
        }
        n
    }

    /// The group of `kind`, registered on first use.
    pub(super) fn with_group<R>(
        &self,
        kind: GroupKind,
        f: impl FnOnce(&mut Group) -> R,
    ) -> io::Result<R> {
        let mut groups = self.groups.borrow_mut();
        let slot = groups
            .get_mut(usize::from(kind.bgid()))
            .ok_or_else(|| io::Error::other("no such buffer group"))?;
        if slot.is_none() {
            if !self.is_open() {
                return Err(io::Error::from_raw_os_error(libc::ECANCELED));
            }
            let target = match kind {
                GroupKind::Packet => PACKET_TARGET,
                _ if self.features.incremental => STREAM_TARGET_INC,
                _ => STREAM_TARGET,
            };
            *slot = Some(Group::register(
                self.ring_fd,
                kind,
                self.features.incremental,
                target,
            )?);
        }
        match slot.as_mut() {
            Some(g) => Ok(f(g)),
            None => Err(io::Error::other("no such buffer group")),
        }
    }

    /// Arms a multishot receive of `sock` into its group. Returns the
    /// operation's index.
    pub(super) fn arm_recv(&self, sock: &Rc<SockCore>) -> Option<u32> {
        let idx = self.ops.borrow_mut().insert(Slot::Multi(sock.clone()));
        let sqe = opcode::RecvMulti::new(types::Fd(sock.fd()), sock.group().bgid())
            .build()
            .user_data(u64::from(idx));
        if self.push(sqe) {
            Some(idx)
        } else {
            drop(self.ops.borrow_mut().remove(idx));
            None
        }
    }

    /// Asks the kernel to end operation `idx` early.
    pub(super) fn cancel(&self, idx: u32) {
        self.push(
            opcode::AsyncCancel::new(u64::from(idx))
                .build()
                .user_data(CANCEL_UD),
        );
    }

    /// Submits a one-shot operation holding `hold` until it completes.
    pub(super) fn submit(self: &Rc<Self>, sqe: squeue::Entry, hold: Hold) -> OpFuture {
        if !self.is_open() {
            return OpFuture {
                ring: self.clone(),
                idx: None,
                early: Some(hold),
            };
        }
        let idx = self.ops.borrow_mut().insert(Slot::Waiting(None, hold));
        if self.push(sqe.user_data(u64::from(idx))) {
            OpFuture {
                ring: self.clone(),
                idx: Some(idx),
                early: None,
            }
        } else {
            let hold = match self.ops.borrow_mut().remove(idx) {
                Slot::Waiting(_, hold) => hold,
                _ => Hold::default(),
            };
            OpFuture {
                ring: self.clone(),
                idx: None,
                early: Some(hold),
            }
        }
    }
}

/// A one-shot operation in flight: resolves to the kernel's result, the
/// completion flags and what the operation held. Dropping it early cancels
/// the operation; its hold is kept until the kernel is done with it.
pub(super) struct OpFuture {
    ring: Rc<Inner>,
    idx: Option<u32>,
    /// The ring was closed before submission: resolves with `ECANCELED`.
    early: Option<Hold>,
}

impl Future for OpFuture {
    type Output = (i32, u32, Hold);

    fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if let Some(hold) = self.early.take() {
            return Poll::Ready((-libc::ECANCELED, 0, hold));
        }
        let Some(idx) = self.idx else {
            return Poll::Ready((-libc::ECANCELED, 0, Hold::default()));
        };
        let mut ops = self.ring.ops.borrow_mut();
        match ops.slots.get_mut(idx as usize) {
            Some(Slot::Waiting(waker, _)) => {
                match waker {
                    Some(w) if w.will_wake(cx.waker()) => {}
                    _ => *waker = Some(cx.waker().clone()),
                }
                Poll::Pending
            }
            Some(Slot::Done(..)) => {
                let Slot::Done(res, flags, hold) = ops.remove(idx) else {
                    return Poll::Ready((-libc::ECANCELED, 0, Hold::default()));
                };
                drop(ops);
                self.idx = None;
                Poll::Ready((res, flags, hold))
            }
            _ => Poll::Ready((-libc::ECANCELED, 0, Hold::default())),
        }
    }
}

impl Drop for OpFuture {
    fn drop(&mut self) {
        let Some(idx) = self.idx.take() else {
            return;
        };
        let done = {
            let mut ops = self.ring.ops.borrow_mut();
            match ops.slots.get_mut(idx as usize) {
                Some(slot @ Slot::Waiting(..)) => {
                    let Slot::Waiting(_, hold) = std::mem::replace(slot, Slot::Free) else {
                        return;
                    };
                    *slot = Slot::Orphan(hold);
                    None
                }
                Some(Slot::Done(..)) => Some(ops.remove(idx)),
                _ => None,
            }
        };
        match done {
            // Completed but never collected: release its hold now.
            Some(slot) => drop(slot),
            None => self.ring.cancel(idx),
        }
    }
}

/// Clears `IORING_CQ_EVENTFD_DISABLED` when dropped.
struct Unmute<'a>(Option<&'a CqFlags>);

impl Drop for Unmute<'_> {
    fn drop(&mut self) {
        if let Some(f) = self.0 {
            f.set_eventfd(true);
        }
    }
}

/// Reads the ring's eventfd through monoio (one read in monoio's ring at a
/// time).
async fn read_eventfd(efd: &monoio::fs::File, buf: Vec<u8>) -> Vec<u8> {
    let (_, buf) = efd.read_at(buf, 0).await;
    buf
}

/// The reaper: submits what the tasks queued during a turn in one
/// `io_uring_enter`, handles the completions, and sleeps until the kernel
/// signals the ring's eventfd or a task queues more.
async fn reaper(inner: Rc<Inner>, efd: monoio::fs::File) {
    let mut read = pin!(read_eventfd(&efd, vec![0; 8]));
    let mut rounds = 0u32;
    loop {
        inner.kicked.set(false);
        inner.turn();
        if inner.closing.get() && inner.ops.borrow().live == 0 {
            break;
        }
        if inner.uring.borrow().is_none() {
            break;
        }
        // Completions handled may have queued more (re-armed receives,
        // closes), and work may have arrived while the eventfd was muted:
        // deal with it in this turn too, a few rounds at most.
        if (inner.kicked.get() || inner.pending()) && rounds < 4 {
            rounds += 1;
            continue;
        }
        rounds = 0;
        inner.kicked.set(false);
        if let Either::Left(buf) = race(read.as_mut(), inner.kick.notified()).await {
            read.set(read_eventfd(&efd, buf));
        }
    }
}

/// Waits until `f` yields a value, polling it whenever the waker fires.
pub(super) async fn poll_until<T>(mut f: impl FnMut(&mut Context<'_>) -> Poll<T>) -> T {
    poll_fn(move |cx| f(cx)).await
}

/// A reusable FIFO of received chunks with its byte count.
#[derive(Default)]
pub(super) struct Chunks {
    q: VecDeque<BytesMut>,
    bytes: usize,
}

impl Chunks {
    pub(super) fn push(&mut self, c: BytesMut) {
        self.bytes += c.len();
        self.q.push_back(c);
    }

    pub(super) fn pop(&mut self) -> Option<BytesMut> {
        let c = self.q.pop_front()?;
        self.bytes -= c.len();
        Some(c)
    }

    pub(super) fn bytes(&self) -> usize {
        self.bytes
    }

    pub(super) fn clear(&mut self) {
        self.q.clear();
        self.bytes = 0;
    }
}
