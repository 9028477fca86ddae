//! Per-core pools of fixed-size I/O buffers under a global memory budget.
//!
//! # Size
//!
//! One buffer holds one maximal HTTP/2 frame as it appears on the wire:
//! the 9-byte frame header plus 16 384 bytes of payload (the default and
//! minimum `SETTINGS_MAX_FRAME_SIZE`, which konn never raises for sending).
//! [`konn_frames::packet::MAX_DATA_PAYLOAD`] (16 360 bytes) is chosen so
//! that the gRPC message prefix (5 bytes), the Konnectivity `Packet`
//! protobuf header (at most 19 bytes) and the payload together fill at most
//! those 16 384 bytes (checked at compile time below). So one buffer carries one Konnectivity DATA
//! packet with all of its framing: 9 + 16 384 = 16 393 bytes, rounded up to
//! a multiple of 64 (a cache line) = [`BUF_CAPACITY`] = 16 448 bytes.
//!
//! # Ownership
//!
//! A buffer is a plain [`BytesMut`] with capacity [`BUF_CAPACITY`], so
//! monoio's owned-buffer reads (`IoBufMut`), `bytes::BufMut` encoders and
//! [`BytesMut::freeze`] (to a [`bytes::Bytes`], no copy, no allocation) all
//! work unchanged. The pool keeps a second, empty handle (an *anchor*) on
//! the same allocation. While anything else (the `BytesMut`, the `Bytes`
//! made from it, slices of those) is alive, the allocation's reference count
//! is above one; when the last of them is dropped, on any thread, only the
//! anchor is left and [`BytesMut::try_reclaim`] on it succeeds without
//! copying or allocating. Memory therefore always returns to the pool of the
//! core that first allocated it, which is also where konn's flows live (see
//! `docs/design/cross-core.md`).
//!
//! Returned buffers are noticed lazily: an acquire first takes an idle
//! buffer, then checks the most recently lent buffers and a small rotating
//! window of the oldest ones, and only then allocates. The worker's
//! maintenance task calls [`BufPool::reclaim`] periodically for a full pass.
//! `bytes::Bytes::from_owner` would return memory eagerly on drop, but it
//! allocates a header for every conversion; the anchor scheme allocates
//! nothing once warm, needs no `unsafe`, and never touches another core's
//! data structures.
//!
//! # Budget
//!
//! [`MemoryBudget`] caps the bytes all pools may hold (idle plus lent),
//! counted in whole buffers. Pools do not touch the shared counter per
//! buffer: each takes *credit* in chunks of [`PoolConfig::credit_chunk`]
//! buffers with one atomic operation and spends it locally; trimming gives
//! surplus credit back. When the budget is used up,
//! [`BufPool::try_acquire`] fails with [`Error::BufferBudgetExhausted`] (the
//! caller stops reading from that socket) and raises a shared *pressure*
//! flag that makes every pool shrink its idle list and return spare credit
//! at its next maintenance pass. [`BufPool::acquire`] instead waits,
//! re-checking with a back-off from [`ACQUIRE_RETRY`] to
//! [`ACQUIRE_RETRY_MAX`], and gives up with [`Error::BufferWaitTimeout`]
//! after [`PoolConfig::acquire_timeout`]: every wait for a buffer has a
//! deadline.
//!
//! # The current pool
//!
//! Each worker installs its pool as the thread's [`current`] pool; the
//! connection driver (`io::driver`) reads into buffers from it, so the
//! budget bounds every received byte that waits in a queue. A thread that
//! never installed one gets a pool of its own with the default settings on
//! first use (tests on a bare runtime).
//!
//! `docs/design/buffers.md` has the full story.
//!
//! # Queued data
//!
//! Received bytes waiting in a flow's queue are slices of the pooled read
//! buffers, so they count against the budget without any extra
//! bookkeeping. Whoever queues them decides whom to shed when the budget
//! runs short (proxy-server: `server::budget`, using
//! [`BufPool::under_pressure`]).

use std::{
    cell::RefCell,
    collections::VecDeque,
    fmt,
    rc::Rc,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering},
    },
    time::Duration,
};

use bytes::BytesMut;
use crossbeam_utils::CachePadded;
use konn_frames::packet::{MAX_DATA_PAYLOAD, data_header_len};

use crate::Error;

/// HTTP/2 frame header length (RFC 9113 §4.1).
pub const H2_FRAME_HEADER_LEN: usize = 9;

/// Largest HTTP/2 frame payload konn sends: the default (and minimum)
/// `SETTINGS_MAX_FRAME_SIZE` (RFC 9113 §6.5.2).
pub const H2_MAX_FRAME_PAYLOAD: usize = 16_384;

/// Bytes one maximal frame occupies on the wire: 16 393.
pub const MAX_FRAME_WIRE_LEN: usize = H2_FRAME_HEADER_LEN + H2_MAX_FRAME_PAYLOAD;

/// Buffer sizes are rounded up to this (one cache line).
pub const BUF_ALIGN: usize = 64;

/// Capacity of every pooled buffer: [`MAX_FRAME_WIRE_LEN`] rounded up to
/// [`BUF_ALIGN`], i.e. 16 448 bytes.
pub const BUF_CAPACITY: usize = MAX_FRAME_WIRE_LEN.div_ceil(BUF_ALIGN) * BUF_ALIGN;

const _: () = assert!(BUF_CAPACITY == 16_448);

/// Spare TLS ciphertext buffers a core keeps ([`BufPool::put_scratch`]).
pub const SCRATCH_KEEP: usize = 2;

/// Frame-sized buffers in one large buffer (see [`LARGE_BUF_CAPACITY`]).
pub const LARGE_BUF_UNITS: usize = 4;

/// Capacity of a large pooled buffer: [`LARGE_BUF_UNITS`] ×
/// [`BUF_CAPACITY`] = 65 792 bytes. Plaintext HTTP/2 connections read
/// into these, so that a busy socket needs one read system call per
/// 64 KiB rather than one per frame; the budget counts one as
/// [`LARGE_BUF_UNITS`] buffers.
pub const LARGE_BUF_CAPACITY: usize = LARGE_BUF_UNITS * BUF_CAPACITY;
const _: () = assert!(BUF_CAPACITY >= MAX_FRAME_WIRE_LEN);
// One maximal DATA packet (gRPC prefix, protobuf header with the longest
// connectID, payload) fills at most one frame payload.
const _: () =
    assert!(data_header_len(i64::MIN, MAX_DATA_PAYLOAD) + MAX_DATA_PAYLOAD <= H2_MAX_FRAME_PAYLOAD);

/// First re-check of an exhausted budget by [`BufPool::acquire`]; the
/// interval doubles up to [`ACQUIRE_RETRY_MAX`].
pub const ACQUIRE_RETRY: Duration = Duration::from_millis(1);

/// Longest interval between two re-checks of an exhausted budget.
pub const ACQUIRE_RETRY_MAX: Duration = Duration::from_millis(32);

/// Default of [`PoolConfig::acquire_timeout`]: the default of
/// `--write-timeout`, the other "no progress" deadline of a connection.
pub const DEFAULT_ACQUIRE_TIMEOUT: Duration = Duration::from_secs(60);

/// Buffers checked at the most-recently-lent end on a miss (LIFO reuse keeps
/// hot memory in cache).
const RECENT_WINDOW: usize = 2;

/// Pool and budget settings.
#[derive(Debug, Clone)]
pub struct PoolConfig {
    /// Global cap on pooled buffer memory, all cores together (rounded down
    /// to whole buffers). Default 512 MiB (≈ 32 600 buffers).
    pub budget_bytes: usize,
    /// Idle buffers a core keeps for reuse before freeing memory. Default
    /// 256 (4 MiB per core).
    pub max_idle_per_core: usize,
    /// Buffers of credit a core takes from (or returns to) the global
    /// budget at once. Default 32.
    pub credit_chunk: usize,
    /// Oldest lent buffers checked for return on each miss. Default 8.
    pub scan_window: usize,
    /// Period of each worker's full reclaim pass. Default 100 ms.
    pub maintenance_interval: Duration,
    /// Longest wait of [`BufPool::acquire`] for a buffer while the budget
    /// is used up. Default [`DEFAULT_ACQUIRE_TIMEOUT`].
    pub acquire_timeout: Duration,
}

impl Default for PoolConfig {
    fn default() -> Self {
        Self {
            budget_bytes: 512 << 20,
            max_idle_per_core: 256,
            credit_chunk: 32,
            scan_window: 8,
            maintenance_interval: Duration::from_millis(100),
            acquire_timeout: DEFAULT_ACQUIRE_TIMEOUT,
        }
    }
}

impl PoolConfig {
    pub(crate) fn validate(&self) -> Result<(), Error> {
        if self.budget_bytes < BUF_CAPACITY {
            return Err(Error::InvalidConfig(
                "pool.budget_bytes must hold at least one buffer (16448 bytes)",
            ));
        }
        if self.credit_chunk == 0 {
            return Err(Error::InvalidConfig("pool.credit_chunk must be at least 1"));
        }
        if self.maintenance_interval.is_zero() {
            return Err(Error::InvalidConfig(
                "pool.maintenance_interval must be positive",
            ));
        }
        if self.acquire_timeout.is_zero() {
            return Err(Error::InvalidConfig(
                "pool.acquire_timeout must be positive",
            ));
        }
        Ok(())
    }
}

/// The global cap shared by every core's pool; cheap to clone.
#[derive(Clone)]
pub struct MemoryBudget {
    shared: Arc<BudgetShared>,
}

struct BudgetShared {
    limit: usize,
    /// Buffers not yet reserved by any pool.
    available: CachePadded<AtomicUsize>,
    /// Some pool found the budget empty; pools shed idle memory.
    pressure: CachePadded<AtomicBool>,
    exhausted: AtomicU64,
    /// Buffers lent out by all pools, as each last published it at its
    /// maintenance pass (the overload manager's measure).
    in_use: CachePadded<AtomicUsize>,
}

/// Budget counters, for metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BudgetStats {
    /// Cap in buffers.
    pub limit_buffers: usize,
    /// Buffers reserved by pools (idle, lent, or as unspent credit).
    pub reserved_buffers: usize,
    /// Cap in bytes (`limit_buffers * BUF_CAPACITY`).
    pub limit_bytes: usize,
    /// Reserved bytes.
    pub reserved_bytes: usize,
    /// Acquisitions refused because the budget was used up.
    pub exhausted: u64,
    /// Whether pools are currently asked to shed memory.
    pub under_pressure: bool,
}

impl MemoryBudget {
    /// A budget of `bytes`, rounded down to whole buffers.
    pub fn new(bytes: usize) -> Self {
        let limit = bytes / BUF_CAPACITY;
        Self {
            shared: Arc::new(BudgetShared {
                limit,
                available: CachePadded::new(AtomicUsize::new(limit)),
                pressure: CachePadded::new(AtomicBool::new(false)),
                exhausted: AtomicU64::new(0),
                in_use: CachePadded::new(AtomicUsize::new(0)),
            }),
        }
    }

    /// The cap in buffers.
    pub fn limit_buffers(&self) -> usize {
        self.shared.limit
    }

    /// Current counters.
    pub fn stats(&self) -> BudgetStats {
        let available = self.shared.available.load(Ordering::Relaxed);
        let reserved = self.shared.limit.saturating_sub(available);
        BudgetStats {
            limit_buffers: self.shared.limit,
            reserved_buffers: reserved,
            limit_bytes: self.shared.limit * BUF_CAPACITY,
            reserved_bytes: reserved * BUF_CAPACITY,
            exhausted: self.shared.exhausted.load(Ordering::Relaxed),
            under_pressure: self.under_pressure(),
        }
    }

    fn under_pressure(&self) -> bool {
        self.shared.pressure.load(Ordering::Relaxed)
    }

    /// Bytes of buffers lent out (in use, not idle or unspent credit) by
    /// all pools, as of each pool's latest maintenance pass
    /// ([`PoolConfig::maintenance_interval`]): one relaxed load. Buffers an
    /// io_uring data ring holds provided to the kernel count only once
    /// they are taken out of the ring (a large buffer the kernel is still
    /// filling counts as spare).
    pub fn in_use_bytes(&self) -> usize {
        self.shared.in_use.load(Ordering::Relaxed) * BUF_CAPACITY
    }

    /// A pool's lent count went from `old` to `new` buffers.
    fn publish_in_use(&self, old: usize, new: usize) {
        if new > old {
            self.shared.in_use.fetch_add(new - old, Ordering::Relaxed);
        } else if old > new {
            self.shared.in_use.fetch_sub(old - new, Ordering::Relaxed);
        }
    }

    /// Reserves up to `want` buffers; returns how many were granted.
    fn take(&self, want: usize) -> usize {
        match self
            .shared
            .available
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |available| {
                (available > 0).then(|| available - available.min(want))
            }) {
            Ok(before) => before.min(want),
            Err(_) => 0,
        }
    }

    /// Returns `n` reserved buffers.
    fn give(&self, n: usize) {
        if n > 0 {
            self.shared.available.fetch_add(n, Ordering::AcqRel);
        }
    }
}

impl fmt::Debug for MemoryBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryBudget")
            .field("stats", &self.stats())
            .finish()
    }
}

/// Counters of one core's pool, for metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Capacity of each buffer ([`BUF_CAPACITY`]).
    pub buffer_size: usize,
    /// Buffers this pool owns: idle plus lent.
    pub allocated: usize,
    /// Buffers ready for reuse.
    pub idle: usize,
    /// Buffers handed out and not yet seen back (returns are noticed
    /// lazily; call [`BufPool::reclaim`] first for an exact figure).
    pub in_use: usize,
    /// Budget credit this pool holds but has not spent.
    pub credit: usize,
    /// Acquisitions served without allocating.
    pub hits: u64,
    /// Acquisitions that allocated a new buffer.
    pub misses: u64,
    /// Acquisitions refused because the budget was used up.
    pub exhausted: u64,
    /// Budget-wide counters.
    pub budget: BudgetStats,
}

/// One core's buffer pool. Cheap to clone (`Rc`); not `Send`: every worker
/// has its own (see [`WorkerCtx::pool`](super::runtime::WorkerCtx::pool)).
#[derive(Clone)]
pub struct BufPool {
    inner: Rc<RefCell<LocalPool>>,
}

struct LocalPool {
    budget: MemoryBudget,
    acquire_timeout: Duration,
    /// Idle frame-sized buffers kept (large ones count as several).
    max_idle: usize,
    credit_chunk: usize,
    scan_window: usize,
    /// Frame-sized and large buffers.
    classes: [Class; 2],
    /// Budget credit in frame-sized buffers.
    credit: usize,
    hits: u64,
    misses: u64,
    exhausted: u64,
    /// Lent buffers as last published to the budget.
    published_in_use: usize,
    /// Spare TLS ciphertext buffers ([`BufPool::take_scratch`]).
    scratch: Vec<BytesMut>,
    /// A spare was taken since the last maintenance pass (unused spares
    /// are freed there).
    scratch_taken: bool,
}

/// The buffers of one size.
struct Class {
    capacity: usize,
    /// Frame-sized buffers this size counts as.
    units: usize,
    /// Reclaimed anchors with capacity `capacity`, ready to lend.
    idle: Vec<BytesMut>,
    /// Anchors (capacity 0) of lent buffers, oldest first.
    lent: VecDeque<BytesMut>,
}

impl Class {
    fn new(capacity: usize, units: usize, idle: usize) -> Self {
        Self {
            capacity,
            units,
            idle: Vec::with_capacity(idle),
            lent: VecDeque::new(),
        }
    }

    /// Frame-sized buffers held (idle and lent).
    fn held(&self) -> usize {
        (self.idle.len() + self.lent.len()) * self.units
    }

    /// Hands out the anchor's memory, keeping an empty handle to notice its
    /// return. The first call on a fresh buffer allocates the shared
    /// reference count (part of the miss); later calls allocate nothing.
    fn lend(&mut self, mut anchor: BytesMut) -> BytesMut {
        let buf = anchor.split_off(0);
        self.lent.push_back(anchor);
        buf
    }

    /// Checks the most recently lent buffers, then a rotating window of the
    /// oldest, for one whose users are all gone.
    fn find_returned(&mut self, scan_window: usize) -> Option<BytesMut> {
        let recent = RECENT_WINDOW.min(self.lent.len());
        for back in 0..recent {
            let index = self.lent.len() - 1 - back;
            if self.lent.get_mut(index)?.try_reclaim(self.capacity) {
                return self.lent.remove(index);
            }
        }
        let window = scan_window.min(self.lent.len());
        for _ in 0..window {
            let mut anchor = self.lent.pop_front()?;
            if anchor.try_reclaim(self.capacity) {
                return Some(anchor);
            }
            self.lent.push_back(anchor);
        }
        None
    }

    /// Moves every returned buffer from `lent` to `idle`.
    fn reclaim_all(&mut self) -> usize {
        let mut found = 0;
        for _ in 0..self.lent.len() {
            let Some(mut anchor) = self.lent.pop_front() else {
                break;
            };
            if anchor.try_reclaim(self.capacity) {
                self.idle.push(anchor);
                found += 1;
            } else {
                self.lent.push_back(anchor);
            }
        }
        found
    }
}

/// The two sizes of pooled buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Size {
    /// [`BUF_CAPACITY`]: one maximal frame.
    Frame = 0,
    /// [`LARGE_BUF_CAPACITY`]: [`LARGE_BUF_UNITS`] frames.
    Large = 1,
}

impl BufPool {
    /// An empty pool drawing on `budget`.
    pub fn new(budget: &MemoryBudget, config: &PoolConfig) -> Self {
        Self {
            inner: Rc::new(RefCell::new(LocalPool {
                budget: budget.clone(),
                acquire_timeout: config.acquire_timeout,
                max_idle: config.max_idle_per_core,
                credit_chunk: config.credit_chunk.max(LARGE_BUF_UNITS),
                scan_window: config.scan_window,
                classes: [
                    Class::new(BUF_CAPACITY, 1, config.max_idle_per_core),
                    Class::new(
                        LARGE_BUF_CAPACITY,
                        LARGE_BUF_UNITS,
                        config.max_idle_per_core / LARGE_BUF_UNITS,
                    ),
                ],
                credit: 0,
                hits: 0,
                misses: 0,
                exhausted: 0,
                published_in_use: 0,
                scratch: Vec::new(),
                scratch_taken: false,
            })),
        }
    }

    /// An empty buffer of capacity [`BUF_CAPACITY`].
    ///
    /// # Errors
    ///
    /// [`Error::BufferBudgetExhausted`] when no buffer is idle or returned
    /// and the global budget is used up: stop reading until buffers come
    /// back.
    pub fn try_acquire(&self) -> Result<BytesMut, Error> {
        self.inner
            .borrow_mut()
            .acquire(Size::Frame, true)
            .ok_or(Error::BufferBudgetExhausted)
    }

    /// The global budget this pool draws on.
    pub fn budget(&self) -> MemoryBudget {
        self.inner.borrow().budget.clone()
    }

    /// Like [`try_acquire`](Self::try_acquire) but waits while the budget
    /// is used up, at most [`PoolConfig::acquire_timeout`]. Needs a runtime
    /// with timers.
    ///
    /// # Errors
    ///
    /// [`Error::BufferWaitTimeout`] when no buffer came back in time.
    pub async fn acquire(&self) -> Result<BytesMut, Error> {
        let limit = self.inner.borrow().acquire_timeout;
        self.acquire_within(limit).await
    }

    /// [`acquire`](Self::acquire) with its own deadline. Returns are only
    /// visible as reference counts dropping, so nothing can wake a waiter:
    /// it re-checks with a back-off from [`ACQUIRE_RETRY`] to
    /// [`ACQUIRE_RETRY_MAX`]. One refusal is counted per wait, not per
    /// re-check.
    ///
    /// # Errors
    ///
    /// [`Error::BufferWaitTimeout`] after `limit`.
    pub async fn acquire_within(&self, limit: Duration) -> Result<BytesMut, Error> {
        self.acquire_size(Size::Frame, limit).await
    }

    /// [`acquire`](Self::acquire) for an empty buffer of capacity
    /// [`LARGE_BUF_CAPACITY`] (counted as [`LARGE_BUF_UNITS`] buffers).
    ///
    /// # Errors
    ///
    /// [`Error::BufferWaitTimeout`] when none came back in time.
    pub async fn acquire_large(&self) -> Result<BytesMut, Error> {
        let limit = self.inner.borrow().acquire_timeout;
        self.acquire_size(Size::Large, limit).await
    }

    /// [`try_acquire`](Self::try_acquire) for either size.
    ///
    /// # Errors
    ///
    /// [`Error::BufferBudgetExhausted`].
    pub fn try_acquire_size(&self, size: Size) -> Result<BytesMut, Error> {
        self.inner
            .borrow_mut()
            .acquire(size, true)
            .ok_or(Error::BufferBudgetExhausted)
    }

    /// [`try_acquire_size`](Self::try_acquire_size) without counting a
    /// refusal in `exhausted` (the io_uring data ring tops its provided
    /// buffers up after every batch of completions; a reader that then
    /// has to wait is counted by [`wait_for`](Self::wait_for)'s caller).
    pub fn try_acquire_quiet(&self, size: Size) -> Option<BytesMut> {
        self.inner.borrow_mut().acquire(size, false)
    }

    /// After a refused [`try_acquire_size`](Self::try_acquire_size): waits
    /// for a buffer of `size` as [`acquire`](Self::acquire) does, without
    /// counting the refusal twice.
    ///
    /// # Errors
    ///
    /// [`Error::BufferWaitTimeout`] when none came back in time.
    pub async fn wait_for(&self, size: Size) -> Result<BytesMut, Error> {
        let limit = self.inner.borrow().acquire_timeout;
        Box::pin(self.wait_for_buffer(size, limit)).await
    }

    async fn acquire_size(&self, size: Size, limit: Duration) -> Result<BytesMut, Error> {
        if let Some(buf) = self.inner.borrow_mut().acquire(size, true) {
            return Ok(buf);
        }
        // Boxed: the wait's timer (640 bytes) would otherwise sit in the
        // state of every task that can acquire, i.e. every reader.
        Box::pin(self.wait_for_buffer(size, limit)).await
    }

    async fn wait_for_buffer(&self, size: Size, limit: Duration) -> Result<BytesMut, Error> {
        let deadline = monoio::time::Instant::now() + limit;
        let mut delay = ACQUIRE_RETRY;
        loop {
            let left = deadline.saturating_duration_since(monoio::time::Instant::now());
            if left.is_zero() {
                return Err(Error::BufferWaitTimeout(limit));
            }
            monoio::time::sleep(delay.min(left)).await;
            if let Some(buf) = self.inner.borrow_mut().acquire(size, false) {
                return Ok(buf);
            }
            delay = (delay * 2).min(ACQUIRE_RETRY_MAX);
        }
    }

    /// A working buffer for TLS ciphertext with room for `room` bytes: a
    /// spare one if the core has it, else a fresh allocation. Ciphertext
    /// lives only until rustls copies it, so these are not pooled buffers
    /// and sit outside the budget; a reader gives its buffer back with
    /// [`put_scratch`](Self::put_scratch) before it waits, so an idle
    /// connection holds none, and the next read does not allocate.
    pub fn take_scratch(&self, room: usize) -> BytesMut {
        let mut b = {
            let mut pool = self.inner.borrow_mut();
            pool.scratch_taken = true;
            pool.scratch.pop().unwrap_or_default()
        };
        // An empty spare moves its start back instead of allocating.
        b.reserve(room);
        b
    }

    /// Keeps an emptied scratch buffer for the next
    /// [`take_scratch`](Self::take_scratch): at most [`SCRATCH_KEEP`] per
    /// core, none while the budget is under pressure; others are freed, and
    /// so are spares no reader took during a maintenance interval (an idle
    /// core holds none).
    pub fn put_scratch(&self, b: BytesMut) {
        if !b.is_empty() || b.capacity() == 0 {
            return;
        }
        let mut pool = self.inner.borrow_mut();
        if pool.scratch.len() < SCRATCH_KEEP && !pool.budget.under_pressure() {
            pool.scratch.push(b);
        }
    }

    /// How long [`acquire`](Self::acquire) waits at most
    /// ([`PoolConfig::acquire_timeout`]).
    pub fn acquire_timeout(&self) -> Duration {
        self.inner.borrow().acquire_timeout
    }

    /// Full pass: moves every returned buffer to the idle list, frees idle
    /// buffers beyond the limit (fewer under budget pressure) and gives
    /// surplus credit back to the budget. Returns how many buffers came
    /// back. Workers run it every
    /// [`maintenance_interval`](PoolConfig::maintenance_interval).
    pub fn reclaim(&self) -> usize {
        // Buffers this core's data ring has provided to the kernel and
        // that no receive has filled yet are spare room, not memory in
        // use: they are left out of what the budget publishes (the
        // overload watermark reads it). Read before the pool is borrowed:
        // the ring borrows the pool when it refills.
        let spare = super::uring::current().map_or(0, |r| r.stats().provided_units);
        self.inner.borrow_mut().reclaim(spare)
    }

    /// Whether some pool found the budget used up since memory was last
    /// granted: readers should then not hold buffers on speculation.
    pub fn under_pressure(&self) -> bool {
        self.inner.borrow().budget.under_pressure()
    }

    /// Current counters.
    pub fn stats(&self) -> PoolStats {
        let pool = self.inner.borrow();
        let units = |f: fn(&Class) -> usize| pool.classes.iter().map(|c| f(c) * c.units).sum();
        PoolStats {
            buffer_size: BUF_CAPACITY,
            allocated: units(|c| c.idle.len() + c.lent.len()),
            idle: units(|c| c.idle.len()),
            in_use: units(|c| c.lent.len()),
            credit: pool.credit,
            hits: pool.hits,
            misses: pool.misses,
            exhausted: pool.exhausted,
            budget: pool.budget.stats(),
        }
    }
}

thread_local! {
    static CURRENT: RefCell<Option<BufPool>> = const { RefCell::new(None) };
}

/// The pool of the worker running on this thread (see the module docs).
/// A thread without one gets its own pool with [`PoolConfig::default`] and
/// a budget of its own on first use.
pub fn current() -> BufPool {
    CURRENT.with(|c| {
        c.borrow_mut()
            .get_or_insert_with(|| {
                let config = PoolConfig::default();
                BufPool::new(&MemoryBudget::new(config.budget_bytes), &config)
            })
            .clone()
    })
}

/// Makes `pool` this thread's [`current`] pool until the guard is dropped
/// (which restores the previous one).
pub fn install(pool: BufPool) -> CurrentPoolGuard {
    CurrentPoolGuard(CURRENT.with(|c| c.replace(Some(pool))))
}

/// Restores the previously [`current`] pool when dropped.
#[must_use = "the pool is only current while the guard lives"]
pub struct CurrentPoolGuard(Option<BufPool>);

impl Drop for CurrentPoolGuard {
    fn drop(&mut self) {
        let previous = self.0.take();
        CURRENT.with(|c| *c.borrow_mut() = previous);
    }
}

impl fmt::Debug for CurrentPoolGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CurrentPoolGuard").finish_non_exhaustive()
    }
}

impl fmt::Debug for BufPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BufPool")
            .field("stats", &self.stats())
            .finish()
    }
}

impl LocalPool {
    /// One buffer of `size`, or `None` when the budget is used up; `count`
    /// says whether a refusal is counted.
    fn acquire(&mut self, size: Size, count: bool) -> Option<BytesMut> {
        let k = size as usize;
        let scan = self.scan_window;
        let class = self.classes.get_mut(k)?;
        if let Some(anchor) = class.idle.pop().or_else(|| class.find_returned(scan)) {
            self.hits += 1;
            return Some(class.lend(anchor));
        }
        let units = class.units;
        if self.credit < units {
            self.refill();
        }
        if self.credit < units {
            // Last resort before refusing: a full pass, and the idle
            // buffers of the other size turned back into credit.
            self.reclaim_all();
            let class = self.classes.get_mut(k)?;
            if let Some(anchor) = class.idle.pop() {
                self.hits += 1;
                return Some(class.lend(anchor));
            }
            for other in &mut self.classes {
                while self.credit < units && other.idle.pop().is_some() {
                    self.credit += other.units;
                }
            }
        }
        if self.credit < units {
            if count {
                self.exhausted += 1;
                self.budget.shared.exhausted.fetch_add(1, Ordering::Relaxed);
            }
            self.budget.shared.pressure.store(true, Ordering::Relaxed);
            return None;
        }
        self.credit -= units;
        self.misses += 1;
        let class = self.classes.get_mut(k)?;
        let fresh = BytesMut::with_capacity(class.capacity);
        Some(class.lend(fresh))
    }

    /// Moves every returned buffer to its idle list.
    fn reclaim_all(&mut self) -> usize {
        self.classes.iter_mut().map(Class::reclaim_all).sum()
    }

    /// `spare`: units lent to the kernel as empty receive buffers (see
    /// [`BufPool::reclaim`]), not published as in use.
    fn reclaim(&mut self, spare: usize) -> usize {
        let found = self.reclaim_all();
        self.trim();
        let lent: usize = self.classes.iter().map(|c| c.lent.len() * c.units).sum();
        let in_use = lent.saturating_sub(spare);
        self.budget.publish_in_use(self.published_in_use, in_use);
        self.published_in_use = in_use;
        found
    }

    /// Frees idle buffers beyond the limit and returns surplus credit,
    /// shedding harder while some pool is starved.
    fn trim(&mut self) {
        let pressure = self.budget.under_pressure();
        if pressure || !self.scratch_taken {
            self.scratch.clear();
        }
        self.scratch_taken = false;
        let keep_idle = if pressure {
            self.max_idle / 4
        } else {
            self.max_idle
        };
        for class in &mut self.classes {
            while class.idle.len() * class.units > keep_idle {
                drop(class.idle.pop());
                self.credit += class.units;
            }
        }
        if pressure {
            self.budget.give(self.credit);
            self.credit = 0;
        } else if self.credit > 2 * self.credit_chunk {
            self.budget.give(self.credit - self.credit_chunk);
            self.credit = self.credit_chunk;
        }
    }

    fn refill(&mut self) {
        let granted = self.budget.take(self.credit_chunk);
        if granted > 0 {
            self.credit += granted;
            // Memory is available again: stop asking pools to shed.
            if self.budget.under_pressure() {
                self.budget.shared.pressure.store(false, Ordering::Relaxed);
            }
        }
    }
}

impl Drop for LocalPool {
    fn drop(&mut self) {
        // Buffers still lent elsewhere live on until their last user drops
        // them; the budget is released now (briefly over-committed) so a
        // stopped core does not shrink it for good.
        let held = self.credit + self.classes.iter().map(Class::held).sum::<usize>();
        self.budget.give(held);
        self.budget.publish_in_use(self.published_in_use, 0);
    }
}

#[cfg(test)]
mod tests {
    use bytes::{Buf, BufMut};

    use super::*;

    #[test]
    fn in_use_is_published_at_reclaim_and_withdrawn_on_drop() {
        let budget = MemoryBudget::new(64 * BUF_CAPACITY);
        let pool = BufPool::new(&budget, &PoolConfig::default());
        let a = pool.try_acquire().unwrap();
        let b = pool.try_acquire().unwrap();
        assert_eq!(budget.in_use_bytes(), 0, "published only at reclaim");
        pool.reclaim();
        assert_eq!(budget.in_use_bytes(), 2 * BUF_CAPACITY);
        drop(a);
        pool.reclaim();
        assert_eq!(budget.in_use_bytes(), BUF_CAPACITY);
        drop(pool);
        assert_eq!(budget.in_use_bytes(), 0);
        drop(b);
    }

    #[test]
    fn spent_scratch_buffers_are_reused_up_to_the_keep_limit() {
        let (_budget, pool) = pool(8);
        let mut a = pool.take_scratch(1000);
        assert!(a.capacity() >= 1000);
        a.put_slice(&[1; 600]);
        // Consumed the way the TLS reader consumes ciphertext.
        a.advance(600);
        let at = a.as_ptr();
        pool.put_scratch(a);
        assert_eq!(pool.inner.borrow().scratch.len(), 1);
        let b = pool.take_scratch(1000);
        assert_eq!(
            b.as_ptr(),
            at.wrapping_sub(600),
            "the same allocation, from its start"
        );
        assert!(b.is_empty() && b.capacity() >= 1000);
        // Unconsumed bytes are never handed to another reader.
        let mut c = pool.take_scratch(10);
        c.put_slice(b"left");
        pool.put_scratch(c);
        assert_eq!(pool.take_scratch(10).len(), 0);
        // At most SCRATCH_KEEP spares per core.
        for _ in 0..SCRATCH_KEEP + 2 {
            pool.put_scratch(BytesMut::with_capacity(64));
        }
        assert_eq!(pool.inner.borrow().scratch.len(), SCRATCH_KEEP);
        // Spares survive a maintenance pass after a take, not a second one
        // without.
        pool.reclaim();
        assert_eq!(pool.inner.borrow().scratch.len(), SCRATCH_KEEP);
        pool.reclaim();
        assert!(
            pool.inner.borrow().scratch.is_empty(),
            "an idle core keeps none"
        );
        drop(b);
    }

    fn pool(budget_buffers: usize) -> (MemoryBudget, BufPool) {
        let budget = MemoryBudget::new(budget_buffers * BUF_CAPACITY);
        let config = PoolConfig {
            credit_chunk: 4,
            max_idle_per_core: 4,
            ..PoolConfig::default()
        };
        let pool = BufPool::new(&budget, &config);
        (budget, pool)
    }

    #[test]
    fn capacity_arithmetic() {
        const {
            assert!(MAX_FRAME_WIRE_LEN == 16_393);
            assert!(BUF_CAPACITY.is_multiple_of(BUF_ALIGN));
            assert!(BUF_CAPACITY - MAX_FRAME_WIRE_LEN < BUF_ALIGN);
        }
    }

    #[test]
    fn buffers_have_full_capacity_and_come_back() {
        let (_budget, pool) = pool(8);
        let mut buf = pool.try_acquire().unwrap();
        assert_eq!(buf.capacity(), BUF_CAPACITY);
        assert!(buf.is_empty());
        buf.put_slice(b"hello");
        let frozen = buf.freeze();
        let slice = frozen.slice(1..3);
        drop(frozen);
        assert_eq!(&slice[..], b"el");
        assert_eq!(pool.reclaim(), 0, "a slice still holds the buffer");
        drop(slice);
        assert_eq!(pool.reclaim(), 1);
        let stats = pool.stats();
        assert_eq!((stats.idle, stats.in_use, stats.misses), (1, 0, 1));
        let again = pool.try_acquire().unwrap();
        assert_eq!(again.capacity(), BUF_CAPACITY);
        assert!(again.is_empty(), "reused buffers start empty");
        assert_eq!(pool.stats().hits, 1);
    }

    #[test]
    fn returned_buffer_is_found_without_a_reclaim_pass() {
        let (_budget, pool) = pool(8);
        for _ in 0..100 {
            let mut buf = pool.try_acquire().unwrap();
            buf.put_u8(1);
            drop(buf.freeze());
        }
        let stats = pool.stats();
        assert_eq!(stats.misses, 1);
        assert_eq!(stats.hits, 99);
        assert_eq!(stats.allocated, 1);
    }

    #[test]
    fn budget_exhaustion_and_recovery() {
        let (budget, pool) = pool(3);
        let held: Vec<_> = (0..3).map(|_| pool.try_acquire().unwrap()).collect();
        assert!(matches!(
            pool.try_acquire(),
            Err(Error::BufferBudgetExhausted)
        ));
        let stats = budget.stats();
        assert_eq!(stats.reserved_buffers, 3);
        assert_eq!(stats.exhausted, 1);
        assert!(stats.under_pressure);
        drop(held);
        assert!(
            pool.try_acquire().is_ok(),
            "full pass finds returned buffers"
        );
    }

    #[test]
    fn credit_is_taken_in_chunks_and_trimmed() {
        let (budget, pool) = pool(100);
        let bufs: Vec<_> = (0..14).map(|_| pool.try_acquire().unwrap()).collect();
        // 14 buffers from chunks of 4: 16 reserved, 2 unspent.
        assert_eq!(budget.stats().reserved_buffers, 16);
        assert_eq!(pool.stats().credit, 2);
        drop(bufs);
        assert_eq!(pool.reclaim(), 14);
        // Idle capped at 4: 10 freed into credit (12). That is above two
        // chunks, so all but one chunk goes back: 4 idle + 4 credit.
        let stats = pool.stats();
        assert_eq!(stats.idle, 4);
        assert_eq!(stats.credit, 4);
        assert_eq!(budget.stats().reserved_buffers, 8);
    }

    #[test]
    fn pressure_makes_pools_shed() {
        let budget = MemoryBudget::new(8 * BUF_CAPACITY);
        let config = PoolConfig {
            credit_chunk: 4,
            max_idle_per_core: 8,
            ..PoolConfig::default()
        };
        let rich = BufPool::new(&budget, &config);
        let poor = BufPool::new(&budget, &config);
        let bufs: Vec<_> = (0..8).map(|_| rich.try_acquire().unwrap()).collect();
        drop(bufs);
        assert!(poor.try_acquire().is_err());
        assert!(budget.stats().under_pressure);
        rich.reclaim();
        assert_eq!(rich.stats().idle, 2, "sheds to a quarter of max_idle");
        assert!(poor.try_acquire().is_ok());
        assert!(
            !budget.stats().under_pressure,
            "cleared once credit flows again"
        );
    }

    #[test]
    fn large_buffers_count_as_several_and_share_the_budget() {
        let (budget, pool) = pool(8);
        let large = block_on_large(&pool);
        assert_eq!(large.capacity(), LARGE_BUF_CAPACITY);
        assert_eq!(pool.stats().in_use, LARGE_BUF_UNITS);
        let small: Vec<_> = (0..4).map(|_| pool.try_acquire().unwrap()).collect();
        assert!(pool.try_acquire().is_err(), "8 units: one large + four");
        assert_eq!(budget.stats().reserved_buffers, 8);
        drop(small);
        assert_eq!(pool.reclaim(), 4);
        // Idle frame buffers turn back into credit for a large one.
        let again = block_on_large(&pool);
        assert_eq!(again.capacity(), LARGE_BUF_CAPACITY);
        assert_eq!(budget.stats().reserved_buffers, 8);
        drop((large, again));
        assert_eq!(pool.reclaim(), 2);
        assert_eq!(pool.stats().in_use, 0);
    }

    fn block_on_large(pool: &BufPool) -> BytesMut {
        crate::io::runtime::block_on(crate::io::runtime::Engine::Epoll, pool.acquire_large())
            .unwrap()
            .unwrap()
    }

    #[test]
    fn dropping_a_pool_releases_its_budget() {
        let (budget, pool) = pool(10);
        let buf = pool.try_acquire().unwrap();
        assert_eq!(budget.stats().reserved_buffers, 4);
        drop(pool);
        assert_eq!(budget.stats().reserved_buffers, 0);
        drop(buf);
    }

    #[test]
    fn config_validation() {
        let config = PoolConfig {
            budget_bytes: 100,
            ..PoolConfig::default()
        };
        assert!(matches!(config.validate(), Err(Error::InvalidConfig(_))));
        assert!(PoolConfig::default().validate().is_ok());
    }
}
