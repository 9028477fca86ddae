//! konn's own io_uring for the data-path sockets (agent tunnels,
//! frontends, destinations), next to monoio's.
//!
//! monoio 0.2.4 drives its io_uring with one operation per read or write
//! and exposes none of provided-buffer rings, multishot receive, registered
//! files or zero-copy send. Under the io_uring engine every worker
//! therefore sets up a second ring, owned by konn ([`Ring`]), for the
//! sockets that carry data; timers, listeners, connects and the cross-core
//! mesh stay on monoio. The decision and its measurements:
//! `docs/decisions/0007-io-uring-data-ring.md`.
//!
//! - **Who is on it.** Every connection `io::driver` runs (tunnels,
//!   frontends) and the agent's destination sockets
//!   (`io::sock::packet_split`), moved onto the ring by [`adopt`].
//! - **Multishot receive into provided buffers.** A socket on the ring
//!   ([`RingStream`]) arms one multishot receive; the
//!   kernel picks the buffer for every receive from a provided-buffer ring
//!   whose buffers are lent by the worker's
//!   [`BufPool`](super::pool::BufPool), so the global memory budget counts
//!   them and an idle connection holds none. Received chunks wait in a
//!   per-socket queue bounded by [`RECV_QUEUE_LIMIT`] (beyond it the
//!   receive is cancelled, and TCP pushes back on the peer). When the pool
//!   cannot refill the ring, a reader waits for a buffer with the pool's
//!   deadline.
//! - **Batched submission.** Operations are queued in the ring and handed
//!   to the kernel once per event-loop turn, by the reaper task.
//! - **Gathered sends.** [`RingWrite::write_gather`] sends up to
//!   [`MAX_IOV`] buffers in one `sendmsg` (the agent's destination writer:
//!   every packet queued behind the current one).
//! - **The reaper** is a monoio task: it submits, reaps completions, wakes
//!   the tasks waiting for them and refills the buffer rings, and sleeps on
//!   a read of the ring's eventfd in monoio's ring (the kernel signals it
//!   when completions arrive) or on a task queueing work. The ring runs its
//!   completion work cooperatively (`COOP_TASKRUN`; `SINGLE_ISSUER` where
//!   the kernel has it): the kernel posts completions when the worker
//!   enters the kernel anyway, so the reaper needs no system call to fetch
//!   them (monoio's own ring keeps `DEFER_TASKRUN`), and it mutes the
//!   eventfd while it submits, so its own completions do not wake the
//!   worker again.
//!
//! **Buffer ownership.** Every buffer the kernel may write into (a
//! provided buffer) or read from (a send) is owned by the ring until the
//! completion that ends the operation is reaped; a future dropped early
//! only cancels its operation. Closing the ring ([`Ring::close`], at the
//! end of the runtime) cancels everything and waits for the kernel; if it
//! does not answer in time, the buffers are leaked rather than freed.
//!
//! **Fallback.** No ring on the epoll engine, where the kernel lacks the
//! features ([`features`]: probed once with a real multishot receive),
//! where io_uring is denied, or with `KONN_IO_URING_DATA=monoio`; sockets
//! then stay on monoio's operations and nothing else changes.
//!
//! All of konn's `unsafe` for io_uring lives in this module.
#![allow(unsafe_code)]

mod bufs;
mod ring;
mod stream;

pub use bufs::{GroupKind, PACKET_HEADROOM};
pub use ring::{DATA_RING_ENTRIES, Features, MAX_IOV, Ring, RingStats, current, features, wanted};
pub use stream::{RECV_QUEUE_LIMIT, Received, RingRead, RingStream, RingWrite, adopt};
