//! Provided-buffer rings (`IORING_REGISTER_PBUF_RING`, Linux 5.19) whose
//! buffers are lent by the worker's [`BufPool`](crate::io::pool::BufPool).
//!
//! A group is a ring of `(addr, len, bid)` entries shared with the kernel:
//! konn appends buffers at the tail, the kernel takes them from the head
//! when a multishot receive of that group has data, and names the buffer it
//! used (its `bid`) in the completion. konn keeps the pooled `BytesMut`
//! behind every `bid` it provided in [`Group::slots`], so the memory the
//! kernel writes into is always a pooled buffer counted by the global
//! budget, and stays alive for as long as the kernel may write into it.
//!
//! Three kinds of groups:
//!
//! - [`GroupKind::Tls`] (TLS ciphertext) and [`GroupKind::Plain`]
//!   (plaintext HTTP/2): byte streams. With incremental consumption
//!   (`IOU_PBUF_RING_INC`, Linux 6.12) the kernel fills one large buffer
//!   after the other, each receive continuing where the last one stopped,
//!   so small messages of many sockets share buffers and consecutive
//!   receives of one socket are adjacent in memory (the driver then joins
//!   plaintext without copying). Without it, frame-sized buffers, one per
//!   receive. Two groups, so that a tunnel's receives (which rustls copies
//!   anyway) do not land between a frontend's and break their adjacency.
//! - [`GroupKind::Packet`] (destination and CONNECT sockets): one receive
//!   per frame-sized buffer, written after [`PACKET_HEADROOM`] bytes, so
//!   the reader can put the DATA packet's header in front of the payload in
//!   place.

use std::alloc::Layout;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU16, Ordering};

use bytes::BytesMut;
use io_uring::types::BufRingEntry;
use konn_frames::packet::MAX_DATA_PAYLOAD;

use crate::io::pool::{self, BUF_CAPACITY, LARGE_BUF_CAPACITY, LARGE_BUF_UNITS, Size};

/// Bytes kept free in front of every packet-group receive for the DATA
/// packet's framing (gRPC prefix and protobuf header, at most 24 bytes).
pub const PACKET_HEADROOM: usize = 32;
const _: () = assert!(PACKET_HEADROOM + MAX_DATA_PAYLOAD <= BUF_CAPACITY);

/// `IOU_PBUF_RING_INC` (include/uapi/linux/io_uring.h, Linux 6.12).
const IOU_PBUF_RING_INC: u16 = 2;
/// `IORING_CQE_F_BUF_MORE`: the buffer of this completion will receive
/// more (incremental consumption).
pub(super) const CQE_F_BUF_MORE: u32 = 1 << 4;
/// `IORING_REGISTER_PBUF_RING`.
const REGISTER_PBUF_RING: libc::c_uint = 22;
/// `IORING_UNREGISTER_PBUF_RING`.
const UNREGISTER_PBUF_RING: libc::c_uint = 23;

/// Ring entries per group (a power of two); more than are ever provided at
/// once.
const RING_ENTRIES: u16 = 64;

/// The two groups of a ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupKind {
    /// TLS ciphertext.
    Tls,
    /// Plaintext HTTP/2.
    Plain,
    /// One receive per DATA packet, after [`PACKET_HEADROOM`].
    Packet,
}

impl GroupKind {
    pub(super) const fn bgid(self) -> u16 {
        match self {
            Self::Tls => 0,
            Self::Plain => 1,
            Self::Packet => 2,
        }
    }
}

/// `struct io_uring_buf_reg`.
#[repr(C)]
struct BufReg {
    ring_addr: u64,
    ring_entries: u32,
    bgid: u16,
    flags: u16,
    resv: [u64; 3],
}

/// Registers (`ring_addr != 0`) or unregisters a buffer ring.
fn pbuf_ring(ring_fd: i32, opcode: libc::c_uint, reg: &BufReg) -> std::io::Result<()> {
    // SAFETY: `reg` is a live `io_uring_buf_reg` for the duration of the
    // call; for registration the caller guarantees that `ring_addr` points
    // at a page-aligned array of `ring_entries` entries that outlives the
    // registration (see `Group`).
    let rc = unsafe {
        libc::syscall(
            libc::SYS_io_uring_register,
            ring_fd,
            opcode,
            std::ptr::from_ref(reg),
            1,
        )
    };
    if rc < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// One registered provided-buffer ring.
pub(super) struct Group {
    kind: GroupKind,
    /// Incremental consumption (stream groups on 6.12+).
    inc: bool,
    /// The entry array shared with the kernel (page-aligned).
    entries: NonNull<BufRingEntry>,
    layout: Layout,
    /// Next tail to publish (the kernel's head chases it).
    tail: u16,
    /// The pooled buffer behind each `bid` while the kernel may write into
    /// it. With incremental consumption, the part not yet consumed.
    slots: Vec<Option<BytesMut>>,
    /// `bid`s not currently provided.
    free: Vec<u16>,
    /// How many buffers to keep provided.
    target: usize,
    /// Whether the group is registered with the kernel.
    registered: bool,
}

impl Group {
    /// Allocates the entry array and registers it with `ring_fd`.
    pub(super) fn register(
        ring_fd: i32,
        kind: GroupKind,
        want_inc: bool,
        target: usize,
    ) -> std::io::Result<Self> {
        let layout =
            Layout::from_size_align(usize::from(RING_ENTRIES) * size_of::<BufRingEntry>(), 4096)
                .map_err(std::io::Error::other)?;
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { std::alloc::alloc_zeroed(layout) };
        let entries = NonNull::new(raw.cast::<BufRingEntry>())
            .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::OutOfMemory))?;
        let mut group = Self {
            kind,
            inc: false,
            entries,
            layout,
            tail: 0,
            slots: (0..RING_ENTRIES).map(|_| None).collect(),
            free: (0..RING_ENTRIES).rev().collect(),
            target: target.min(usize::from(RING_ENTRIES)),
            registered: false,
        };
        let mut reg = BufReg {
            ring_addr: raw as u64,
            ring_entries: u32::from(RING_ENTRIES),
            bgid: kind.bgid(),
            flags: 0,
            resv: [0; 3],
        };
        if want_inc && kind != GroupKind::Packet {
            reg.flags = IOU_PBUF_RING_INC;
            if pbuf_ring(ring_fd, REGISTER_PBUF_RING, &reg).is_ok() {
                group.inc = true;
                group.registered = true;
                return Ok(group);
            }
            reg.flags = 0;
        }
        pbuf_ring(ring_fd, REGISTER_PBUF_RING, &reg)?;
        group.registered = true;
        Ok(group)
    }

    pub(super) fn incremental(&self) -> bool {
        self.inc
    }

    /// Size class of this group's buffers.
    fn size(&self) -> Size {
        if self.inc { Size::Large } else { Size::Frame }
    }

    /// The size class a reader waits for when the group ran dry.
    pub(super) fn wait_size(&self) -> Size {
        self.size()
    }

    /// Buffers the kernel can currently pick from.
    pub(super) fn provided(&self) -> usize {
        usize::from(RING_ENTRIES) - self.free.len()
    }

    /// [`provided`](Self::provided) in the pool's budget units.
    pub(super) fn provided_units(&self) -> usize {
        match self.size() {
            Size::Frame => self.provided(),
            Size::Large => self.provided() * LARGE_BUF_UNITS,
        }
    }

    /// Tops the group up to its target from the current pool without
    /// waiting. Returns whether any buffer is provided afterwards.
    pub(super) fn refill(&mut self) -> bool {
        if self.provided() < self.target {
            let pool = pool::current();
            while self.provided() < self.target {
                match pool.try_acquire_quiet(self.size()) {
                    Some(buf) => self.provide(buf),
                    None => break,
                }
            }
        }
        self.provided() > 0
    }

    /// Hands one pooled buffer to the kernel.
    pub(super) fn provide(&mut self, mut buf: BytesMut) {
        let Some(bid) = self.free.pop() else {
            return; // every entry is in use: the buffer goes back to the pool
        };
        buf.clear();
        let (offset, len) = match self.kind {
            GroupKind::Tls | GroupKind::Plain => (0, buf.capacity()),
            GroupKind::Packet => {
                // Zeroed headroom: the reader hands the whole buffer on.
                buf.resize(PACKET_HEADROOM, 0);
                (PACKET_HEADROOM, MAX_DATA_PAYLOAD)
            }
        };
        debug_assert!(offset + len <= buf.capacity());
        debug_assert!(buf.capacity() == BUF_CAPACITY || buf.capacity() == LARGE_BUF_CAPACITY);
        let addr = buf.as_mut_ptr().wrapping_add(offset);
        let mask = RING_ENTRIES - 1;
        let index = usize::from(self.tail & mask);
        // SAFETY: `index` < RING_ENTRIES, the length of the array
        // `entries` points at; the kernel only reads entries between its
        // head and the published tail, and this one lies beyond the tail
        // until the store below.
        let entry = unsafe { &mut *self.entries.as_ptr().add(index) };
        entry.set_addr(addr as u64);
        entry.set_len(u32::try_from(len).unwrap_or(u32::MAX));
        entry.set_bid(bid);
        self.tail = self.tail.wrapping_add(1);
        // SAFETY: `tail` points into the first entry of the live array
        // (the kernel's shared tail field); the release store publishes the
        // entry written above before the kernel can see the new tail.
        unsafe {
            let tail = BufRingEntry::tail(self.entries.as_ptr()).cast_mut();
            AtomicU16::from_ptr(tail).store(self.tail, Ordering::Release);
        }
        if let Some(slot) = self.slots.get_mut(usize::from(bid)) {
            *slot = Some(buf);
        }
    }

    /// The bytes a completion says the kernel put into buffer `bid`:
    /// `len` bytes (after the headroom for a packet group). `more`: the
    /// completion had [`CQE_F_BUF_MORE`] (incremental consumption: the
    /// rest of the buffer stays provided).
    pub(super) fn take(&mut self, bid: u16, len: usize, more: bool) -> Option<BytesMut> {
        let slot = self.slots.get_mut(usize::from(bid))?;
        let buf = slot.as_mut()?;
        let start = buf.len();
        if start + len > buf.capacity() {
            return None; // not what was provided: ignore rather than trust
        }
        // SAFETY: the kernel wrote `len` bytes at the address provided for
        // this bid, which is the buffer's current end (`start`: 0, or the
        // zeroed headroom of a packet buffer); they are within capacity
        // (checked above) and initialised by the kernel's copy.
        unsafe { buf.set_len(start + len) };
        if self.inc && more {
            // The kernel continues after these bytes (see `provide`: the
            // entry's address and length advance in place).
            let chunk = buf.split_to(start + len);
            return Some(chunk);
        }
        let chunk = slot.take();
        self.free.push(bid);
        chunk
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        // Only reached once the ring has no operation in flight (see
        // `Inner::close`) or the ring fd is already gone: the kernel
        // writes into none of these buffers any more.
        // SAFETY: `entries` was allocated in `register` with `layout`.
        unsafe { std::alloc::dealloc(self.entries.as_ptr().cast(), self.layout) };
    }
}

/// Unregisters `group` from the ring `ring_fd` (best effort: closing the
/// ring unregisters it anyway).
pub(super) fn unregister(ring_fd: i32, group: &mut Group) {
    if group.registered {
        let reg = BufReg {
            ring_addr: 0,
            ring_entries: 0,
            bgid: group.kind.bgid(),
            flags: 0,
            resv: [0; 3],
        };
        let _ = pbuf_ring(ring_fd, UNREGISTER_PBUF_RING, &reg);
        group.registered = false;
    }
}
