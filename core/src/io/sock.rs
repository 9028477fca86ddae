//! Small socket helpers the drivers share, and the packet sockets
//! ([`packet_split`]): a destination socket read one DATA packet at a time,
//! on the worker's io_uring data ring (`io::uring`) when it has one.
//!
//! **System calls per byte.** Off the data ring a packet socket reads up to
//! [`READ_GATHER`] packets with one `recvmsg` and writes the packets queued
//! for it with one `sendmsg`: on loopback TCP about 8 µs of every send and
//! receive pair is fixed, so a hop done in 16 KiB calls costs the kernel
//! 2.5× what 64 KiB calls cost (`bench/benches/loopback.rs`;
//! docs/BENCHMARKS.md, "Bytes per system call").

use std::future::Future;
use std::io;

use bytes::{Bytes, BytesMut};
use konn_frames::packet::MAX_DATA_PAYLOAD;
use monoio::io::{AsyncWriteRent, OwnedReadHalf, Splitable};
use monoio::net::tcp::{TcpOwnedReadHalf, TcpOwnedWriteHalf};
use monoio::net::{TcpStream, UnixStream};

use super::pool::BufPool;
use super::runtime::{Either, race};
pub use super::uring::PACKET_HEADROOM;
use super::uring::{self, RingRead, RingWrite};
use crate::Error;

/// The receiving half of a socket whose bytes travel as DATA packets (the
/// agent's destinations): every read is one packet's payload, in a pooled
/// buffer with room for the packet's header in front.
pub enum PacketRead {
    /// On monoio's readiness and non-blocking `recvmsg`.
    Mono {
        /// The socket's read half.
        rd: TcpOwnedReadHalf,
        /// The last read filled its buffers (more is probably waiting).
        full: bool,
        /// Packets the last read received after the one it returned, in
        /// order (`None` once handed out).
        more: [Option<BytesMut>; READ_GATHER - 1],
    },
    /// On the data ring (kernel-picked buffers).
    Ring(RingRead),
}

/// The sending half of a packet socket.
pub enum PacketWrite {
    /// On monoio's operations.
    Mono(TcpOwnedWriteHalf),
    /// On the data ring.
    Ring(RingWrite),
}

/// Splits `stream` into packet halves, on the worker's data ring when it
/// has one.
pub fn packet_split(stream: TcpStream) -> (PacketRead, PacketWrite) {
    match uring::adopt(stream, uring::GroupKind::Packet) {
        Ok(ring) => {
            let (rd, wr) = ring.into_split();
            (PacketRead::Ring(rd), PacketWrite::Ring(wr))
        }
        Err(stream) => {
            let (rd, wr) = stream.into_split();
            let read = PacketRead::Mono {
                rd,
                full: false,
                more: Default::default(),
            };
            (read, PacketWrite::Mono(wr))
        }
    }
}

impl PacketRead {
    /// The next payload: a pooled buffer of [`PACKET_HEADROOM`] zeroed
    /// bytes followed by 1 to [`MAX_DATA_PAYLOAD`] received bytes; `None`
    /// at EOF. An idle socket holds no buffer while it waits (monoio: a
    /// readiness wait first, skipped after a read that filled its buffers;
    /// the ring: the kernel picks the buffer when data arrives). While the
    /// memory budget is used up it waits for a buffer, at most the pool's
    /// `acquire_timeout`.
    ///
    /// Off the ring, after a read that filled its buffers, one `recvmsg`
    /// fills up to [`READ_GATHER`] buffers (the first one waited for, the
    /// others only if the pool has them at once and is not short); the
    /// packets after the first are returned by the next calls without a
    /// system call. After a short read (small messages) a read takes one
    /// buffer, as taking and returning the others would cost more than
    /// the call they might save.
    ///
    /// # Errors
    ///
    /// The socket's error, or [`Error::BufferWaitTimeout`].
    pub async fn read(&mut self, pool: &BufPool) -> Result<Option<BytesMut>, Error> {
        let (rd, full, more) = match self {
            Self::Ring(rd) => return rd.recv().await,
            Self::Mono { rd, full, more } => (rd, full, more),
        };
        if let Some(next) = more.iter_mut().find_map(Option::take) {
            return Ok(Some(next));
        }
        loop {
            let gather = *full;
            if !gather {
                readable(rd, false).await.map_err(Error::Io)?;
            }
            let mut bufs: [BytesMut; READ_GATHER] = Default::default();
            bufs[0] = pool.acquire().await?;
            let mut k = 1;
            if gather && !pool.under_pressure() {
                while k < READ_GATHER {
                    let Some(b) = pool.try_acquire_quiet(super::pool::Size::Frame) else {
                        break;
                    };
                    bufs[k] = b;
                    k += 1;
                }
            }
            for b in &mut bufs[..k] {
                b.resize(PACKET_HEADROOM, 0);
            }
            let got = match recv_gather_now(read_half_fd(rd), &mut bufs[..k], MAX_DATA_PAYLOAD) {
                // Stale readiness: wait exactly (the buffers go back).
                None => {
                    *full = false;
                    continue;
                }
                Some(got) => got.map_err(Error::Io)?,
            };
            if got == 0 {
                return Ok(None);
            }
            *full = got == k * MAX_DATA_PAYLOAD;
            let mut filled = bufs
                .into_iter()
                .take(k)
                .filter(|b| b.len() > PACKET_HEADROOM);
            let first = filled.next();
            for (slot, b) in more.iter_mut().zip(filled) {
                *slot = Some(b);
            }
            return Ok(first);
        }
    }
}

/// Buffers one read of a packet socket fills at most, off the data ring
/// (about 64 KiB: see the module docs).
pub const READ_GATHER: usize = 4;

/// The descriptor of a split TCP stream's read half.
#[allow(unsafe_code)]
fn read_half_fd(rd: &TcpOwnedReadHalf) -> std::os::fd::RawFd {
    use std::os::fd::AsRawFd;
    // SAFETY: as in `readable`: a shared reference to the stream the
    // split keeps, used only to read its descriptor number; no `&mut` to
    // it exists meanwhile (this half's operations take `&mut self`).
    let stream = unsafe { &*rd.0.get() };
    stream.as_raw_fd()
}

/// The descriptor of a split TCP stream's write half.
#[allow(unsafe_code)]
fn write_half_fd(wr: &TcpOwnedWriteHalf) -> std::os::fd::RawFd {
    use std::os::fd::AsRawFd;
    // SAFETY: as in `read_half_fd`.
    let stream = unsafe { &*wr.0.get() };
    stream.as_raw_fd()
}

impl PacketWrite {
    /// Writes as much of `data` as the socket takes in one operation.
    ///
    /// # Errors
    ///
    /// The socket's error.
    pub async fn write(&mut self, data: Bytes) -> io::Result<usize> {
        match self {
            Self::Mono(wr) => wr.write(data).await.0,
            Self::Ring(wr) => wr.write(data).await,
        }
    }

    /// Writes `first` and as many of the packets queued after it as one
    /// gathered send takes (a ring operation, or off the ring a
    /// non-blocking `sendmsg` — monoio's write of `first` alone only when
    /// the socket is full); returns the bytes the socket took (counted
    /// from the start of `first`).
    ///
    /// # Errors
    ///
    /// The socket's error.
    pub async fn write_queued(
        &mut self,
        first: &Bytes,
        queue: &std::cell::RefCell<std::collections::VecDeque<Bytes>>,
    ) -> io::Result<usize> {
        match self {
            Self::Mono(wr) => {
                // One non-blocking `sendmsg` of everything queued; only a
                // full socket makes monoio's write wait for room.
                let sent = {
                    let q = queue.borrow();
                    let parts = std::iter::once(first).chain(q.iter()).map(Bytes::as_ref);
                    send_gather_now(write_half_fd(wr), parts)
                };
                match sent {
                    Some(r) => r,
                    None => wr.write(first.clone()).await.0,
                }
            }
            Self::Ring(wr) => {
                let bufs = {
                    let q = queue.borrow();
                    let mut bufs: [Option<Bytes>; uring::MAX_IOV] = Default::default();
                    bufs[0] = Some(first.clone());
                    let queued = q.iter().filter(|b| !b.is_empty());
                    for (slot, b) in bufs.iter_mut().skip(1).zip(queued) {
                        *slot = Some(b.clone());
                    }
                    bufs
                };
                wr.write_gather(bufs.into_iter().flatten()).await
            }
        }
    }

    /// Shuts the sending direction down (the peer reads EOF) and lets go
    /// of the half.
    ///
    /// monoio's TCP write half does that itself when dropped
    /// (`shutdown(2)` with `SHUT_WR`; see the driver's `Wr::close`), so
    /// it is only dropped: shutting it down first would make its drop a
    /// second call, which fails with `ENOTCONN` once the peer has closed
    /// too. A ring half has no such drop: it is shut down with a ring
    /// operation.
    ///
    /// # Errors
    ///
    /// The socket's error (ring halves only).
    pub async fn close(self) -> io::Result<()> {
        match self {
            Self::Mono(wr) => {
                drop(wr);
                Ok(())
            }
            Self::Ring(mut wr) => wr.shutdown().await,
        }
    }
}

/// Sockets (and read halves) that can wait for data without a read in
/// flight, so an idle connection need not hold a buffer.
///
/// `relaxed`: under epoll, trust monoio's cached readiness. It stays set
/// until a read would block, so after a read that drained the socket it is
/// a false positive: the next read would then park *with its buffer* until
/// data comes, and an idle connection would keep its read buffer. Callers
/// pass `relaxed = false` after a read that did not fill its buffer (the
/// socket is probably drained): monoio then asks the kernel (`poll`, one
/// syscall — in place of the read that would have found nothing), once:
/// see [`exact_then_trusting`]. io_uring ignores the flag (its poll is
/// always exact).
pub trait ReadReady {
    /// Resolves when data (or EOF, or an error) is ready to read.
    fn read_ready(&self, relaxed: bool) -> impl Future<Output = io::Result<()>>;
}

impl ReadReady for TcpStream {
    fn read_ready(&self, relaxed: bool) -> impl Future<Output = io::Result<()>> {
        exact_then_trusting(relaxed, || self.readable(false), || self.readable(true))
    }
}

impl ReadReady for UnixStream {
    fn read_ready(&self, relaxed: bool) -> impl Future<Output = io::Result<()>> {
        exact_then_trusting(relaxed, || self.readable(false), || self.readable(true))
    }
}

/// An exact readiness wait that asks the kernel at most once.
///
/// monoio's exact wait (`readable(false)`) polls the socket with `poll(2)`
/// both before it parks (when its cached readiness is set) and again after
/// epoll woke it, so every wait for the next message cost two syscalls
/// (about five waits per S4 dial on the server). Only the first is needed:
/// it either finds data, or clears the stale cached readiness, after which
/// the next epoll event is fresh and can be trusted. So under epoll the
/// exact wait is polled once, then dropped (monoio's epoll driver keeps no
/// state for it) for a trusting wait (`relaxed`), which asks nothing when
/// woken. Under io_uring (a poll operation each) both are exact anyway.
async fn exact_then_trusting<E, T>(
    relaxed: bool,
    exact: impl FnOnce() -> E,
    trusting: impl FnOnce() -> T,
) -> io::Result<()>
where
    E: Future<Output = io::Result<()>>,
    T: Future<Output = io::Result<()>>,
{
    if relaxed {
        return trusting().await;
    }
    if !monoio::utils::is_legacy() {
        return exact().await;
    }
    // Both futures are polled within this one poll of ours: no epoll event
    // is handled between the exact check and the trusting wait.
    if let Either::Left(r) = race(exact(), std::future::ready(())).await {
        return r;
    }
    trusting().await
}

impl<T: ReadReady> ReadReady for OwnedReadHalf<T> {
    #[allow(unsafe_code)]
    fn read_ready(&self, relaxed: bool) -> impl Future<Output = io::Result<()>> {
        // SAFETY: as in `readable` below: the split keeps the stream in an
        // `Rc<UnsafeCell<_>>` and hands out `&mut` only inside the halves'
        // own read and write calls; a readiness wait only polls the shared
        // fd, and this half issues no read while the future lives (the
        // driver awaits it before reading).
        let stream = unsafe { &*self.0.get() };
        stream.read_ready(relaxed)
    }
}

/// Wait until the read half of a split TCP stream has data (or EOF), without
/// committing a buffer: an idle connection then holds no read buffer.
/// `relaxed` as in [`ReadReady`].
#[allow(unsafe_code)]
pub async fn readable(rd: &TcpOwnedReadHalf, relaxed: bool) -> io::Result<()> {
    // SAFETY: monoio's split keeps the stream in an `Rc<UnsafeCell<_>>` shared
    // by the two halves and hands out `&mut` only inside their own read and
    // write calls. `readable` takes `&TcpStream` and only submits a readiness
    // poll on the shared fd — the same kind of concurrent access to the fd
    // that the split already allows between a read and a write. No `&mut` to
    // the stream exists while this shared reference lives, because this
    // half's reads are not issued until the returned future completes.
    let stream = unsafe { &*rd.0.get() };
    stream.readable(relaxed).await
}

/// The credentials of a Unix-socket peer (`SO_PEERCRED`): (uid, gid, pid),
/// as they were when it connected. `None` if the socket has none (not a
/// Unix socket, or an error).
#[allow(unsafe_code)]
pub fn peer_credentials(fd: std::os::fd::RawFd) -> Option<(u32, u32, i32)> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = libc::socklen_t::try_from(size_of::<libc::ucred>()).ok()?;
    // SAFETY: `cred` and `len` are live locals of the sizes passed; the
    // kernel writes at most `len` bytes to `cred` and keeps no pointer.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&raw mut cred).cast(),
            &raw mut len,
        )
    };
    (rc == 0 && cred.pid != 0).then_some((cred.uid, cred.gid, cred.pid))
}

/// Reads what socket `fd` has now into `buf`'s spare room, at most `max`
/// bytes, without blocking (`recvmsg` with `MSG_DONTWAIT`, on either engine):
/// `Some(Ok(0))` at end of stream, `None` when nothing is there (the
/// readiness that led here was stale: wait again with an exact wait).
///
/// A task that waits for "readable, or something else" and then reads
/// this way never has a read in flight while it waits, so nothing needs
/// cancelling when the something else comes first (monoio's cancelable
/// reads register each read in a hashed set).
pub fn recv_now(
    fd: std::os::fd::RawFd,
    buf: &mut BytesMut,
    max: usize,
) -> Option<io::Result<usize>> {
    recv_gather_now(fd, std::slice::from_mut(buf), max)
}

/// [`recv_now`] into several buffers with one `recvmsg`: fills the spare
/// room of `bufs` (the first [`READ_GATHER`]) in turn, at most `max` bytes
/// each, and returns the total (`Some(Ok(0))` at end of stream, `None`
/// when nothing is there).
#[allow(unsafe_code)]
pub fn recv_gather_now(
    fd: std::os::fd::RawFd,
    bufs: &mut [BytesMut],
    max: usize,
) -> Option<io::Result<usize>> {
    let mut iov = [libc::iovec {
        iov_base: std::ptr::null_mut(),
        iov_len: 0,
    }; READ_GATHER];
    let mut k = 0;
    for (v, b) in iov.iter_mut().zip(bufs.iter_mut()) {
        let spare = b.spare_capacity_mut();
        let len = spare.len().min(max);
        if len == 0 {
            break;
        }
        *v = libc::iovec {
            iov_base: spare.as_mut_ptr().cast(),
            iov_len: len,
        };
        k += 1;
    }
    if k == 0 {
        // A zero-length read would look like the end of the stream.
        return Some(Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "recv_now: no room in the buffer",
        )));
    }
    // SAFETY: an all-zero `msghdr` is valid (no name, no control data).
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov.as_mut_ptr();
    msg.msg_iovlen = k;
    // SAFETY: each of the first `k` iovecs points at the spare room of a
    // distinct buffer of `bufs`, exclusively borrowed here, with its length
    // within that room; the kernel writes only there and keeps no pointer
    // after the call.
    let n = match non_blocking(|| unsafe { libc::recvmsg(fd, &raw mut msg, libc::MSG_DONTWAIT) }) {
        Some(Ok(n)) => n,
        other => return other,
    };
    let mut left = n;
    for (v, b) in iov.iter().zip(bufs.iter_mut()).take(k) {
        let got = left.min(v.iov_len);
        // SAFETY: the kernel filled the iovecs in order, so the first
        // `got` bytes of this buffer's spare room are initialised.
        unsafe { b.set_len(b.len() + got) };
        left -= got;
    }
    Some(Ok(n))
}

/// Sends as much of `parts` (the first [`super::uring::MAX_IOV`]
/// non-empty ones) as socket `fd` takes now, with one non-blocking
/// `sendmsg`; returns the bytes sent, counted from the start of the first
/// part (0 when every part is empty), or `None` when the socket has no
/// room at all (wait for it).
#[allow(unsafe_code)]
pub fn send_gather_now<'a>(
    fd: std::os::fd::RawFd,
    parts: impl Iterator<Item = &'a [u8]>,
) -> Option<io::Result<usize>> {
    let mut iov = [libc::iovec {
        iov_base: std::ptr::null_mut(),
        iov_len: 0,
    }; uring::MAX_IOV];
    let mut k = 0;
    for part in parts.filter(|p| !p.is_empty()).take(uring::MAX_IOV) {
        iov[k] = libc::iovec {
            iov_base: part.as_ptr().cast_mut().cast(),
            iov_len: part.len(),
        };
        k += 1;
    }
    if k == 0 {
        return Some(Ok(0));
    }
    // SAFETY: an all-zero `msghdr` is valid (no name, no control data).
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov.as_mut_ptr();
    msg.msg_iovlen = k;
    // SAFETY: the first `k` iovecs point into the slices of `parts`,
    // borrowed for this call; the kernel only reads them and keeps no
    // pointer after the call.
    non_blocking(|| unsafe {
        libc::sendmsg(fd, &raw const msg, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL)
    })
}

/// Runs a non-blocking socket call until it is not interrupted: its byte
/// count, `None` for `EWOULDBLOCK`, or the error.
fn non_blocking(mut call: impl FnMut() -> isize) -> Option<io::Result<usize>> {
    loop {
        if let Ok(n) = usize::try_from(call()) {
            return Some(Ok(n));
        }
        let e = io::Error::last_os_error();
        match e.kind() {
            io::ErrorKind::Interrupted => {}
            io::ErrorKind::WouldBlock => return None,
            _ => return Some(Err(e)),
        }
    }
}

#[cfg(test)]
mod recv_tests {
    use std::io::Write as _;
    use std::os::fd::AsRawFd;

    use bytes::BytesMut;

    #[test]
    fn reads_what_is_there_and_never_blocks() {
        let (a, mut b) = std::os::unix::net::UnixStream::pair().unwrap();
        let mut buf = BytesMut::with_capacity(8);
        buf.extend_from_slice(b"ab");
        assert!(
            super::recv_now(a.as_raw_fd(), &mut buf, 64).is_none(),
            "nothing yet"
        );
        b.write_all(b"cdefghijkl").unwrap();
        // At most `max`, after what the buffer held.
        assert_eq!(
            super::recv_now(a.as_raw_fd(), &mut buf, 3)
                .unwrap()
                .unwrap(),
            3
        );
        assert_eq!(&buf[..], b"abcde");
        // At most the spare room.
        buf.reserve(4);
        let room = buf.capacity() - buf.len();
        let n = super::recv_now(a.as_raw_fd(), &mut buf, 64)
            .unwrap()
            .unwrap();
        assert_eq!(n, room.min(7));
        assert_eq!(&buf[..5 + n], &b"abcdefghijkl"[..5 + n]);
        drop(b);
        buf.reserve(8);
        while super::recv_now(a.as_raw_fd(), &mut buf, 64)
            .unwrap()
            .unwrap()
            > 0
        {
            buf.reserve(8);
        }
        assert_eq!(&buf[..], b"abcdefghijkl", "then end of stream");
        let mut full = BytesMut::new();
        assert!(
            super::recv_now(a.as_raw_fd(), &mut full, 64)
                .unwrap()
                .is_err(),
            "no room is not EOF"
        );
    }
}

#[cfg(test)]
mod gather_tests {
    use std::io::{Read as _, Write as _};
    use std::os::fd::AsRawFd;

    use bytes::BytesMut;

    #[test]
    fn one_call_fills_the_buffers_in_turn_and_sends_the_parts_in_order() {
        let (a, mut b) = std::os::unix::net::UnixStream::pair().unwrap();
        let mut bufs = [
            BytesMut::with_capacity(8),
            BytesMut::with_capacity(8),
            BytesMut::with_capacity(8),
        ];
        bufs[0].extend_from_slice(b"h");
        assert!(super::recv_gather_now(a.as_raw_fd(), &mut bufs, 3).is_none());
        b.write_all(b"abcdefg").unwrap();
        let n = super::recv_gather_now(a.as_raw_fd(), &mut bufs, 3)
            .unwrap()
            .unwrap();
        assert_eq!(n, 7);
        // At most `max` each, after what a buffer held.
        assert_eq!(
            [&bufs[0][..], &bufs[1][..], &bufs[2][..]],
            [&b"habc"[..], b"def", b"g"]
        );

        let parts: [&[u8]; 4] = [b"12", b"", b"345", b"6"];
        let sent = super::send_gather_now(a.as_raw_fd(), parts.into_iter())
            .unwrap()
            .unwrap();
        assert_eq!(sent, 6);
        let mut got = [0u8; 6];
        b.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"123456");

        // A full socket takes nothing: `None`, not an error.
        let chunk = vec![7u8; 64 * 1024];
        let mut rounds = 0;
        while let Some(r) = super::send_gather_now(a.as_raw_fd(), [&chunk[..]].into_iter()) {
            assert!(r.unwrap() > 0);
            rounds += 1;
            assert!(rounds < 10_000, "the socket never filled");
        }
        drop(b);
        let mut empty = [BytesMut::new()];
        assert!(
            super::recv_gather_now(a.as_raw_fd(), &mut empty, 3)
                .unwrap()
                .is_err(),
            "no room is not EOF"
        );
    }

    #[test]
    fn the_end_of_the_stream_reads_as_zero() {
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        drop(b);
        let mut bufs = [BytesMut::with_capacity(8)];
        let n = super::recv_gather_now(a.as_raw_fd(), &mut bufs, 8).unwrap();
        assert_eq!(n.unwrap(), 0);
    }
}

#[cfg(test)]
mod peer_tests {
    use std::os::fd::AsRawFd;

    #[test]
    fn a_unix_peer_has_our_credentials_and_a_tcp_one_none() {
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        let (uid, _gid, pid) = super::peer_credentials(a.as_raw_fd()).unwrap();
        assert_eq!(pid, i32::try_from(std::process::id()).unwrap());
        let meta = std::fs::metadata("/proc/self").unwrap();
        assert_eq!(uid, std::os::unix::fs::MetadataExt::uid(&meta));
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        assert_eq!(super::peer_credentials(c.as_raw_fd()), None);
    }
}

#[cfg(test)]
mod ready_tests {
    use std::time::Duration;

    use monoio::io::{AsyncReadRent, AsyncWriteRentExt};
    use monoio::net::{TcpListener, TcpStream};

    use super::ReadReady;
    use crate::io::runtime::{Either, join, race, run_on_each_engine};

    const WAIT: Duration = Duration::from_secs(20);

    /// After a read that did not fill its buffer, monoio's cached readiness
    /// is stale: the exact wait must not resolve on it, and must resolve on
    /// the next data (the trusting half of `exact_then_trusting`), twice.
    #[test]
    fn an_exact_wait_skips_stale_readiness_and_wakes_for_new_data() {
        run_on_each_engine(|engine| async move {
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = listener.local_addr().unwrap();
            let mut peer = TcpStream::connect_addr(addr).await.unwrap();
            let (mut conn, _) = listener.accept().await.unwrap();
            for round in 0..2 {
                let (res, _) = peer.write_all(b"hello".to_vec()).await;
                res.unwrap();
                conn.read_ready(false).await.unwrap();
                let (res, buf) = conn.read(Vec::with_capacity(4096)).await;
                assert_eq!(res.unwrap(), 5, "{engine} round {round}");
                assert_eq!(buf, b"hello");
                // Nothing more is coming: the wait must not resolve (a
                // bounded negative check; it cannot pass by luck).
                let quiet = race(
                    conn.read_ready(false),
                    monoio::time::sleep(Duration::from_millis(50)),
                )
                .await;
                assert!(
                    matches!(quiet, Either::Right(())),
                    "{engine} round {round}: resolved on stale readiness"
                );
            }
            // Data that arrives while the wait is parked wakes it.
            let waiter = race(conn.read_ready(false), monoio::time::sleep(WAIT));
            let writer = async {
                let (res, _) = peer.write_all(b"x".to_vec()).await;
                res.unwrap();
            };
            let (woken, ()) = join(waiter, writer).await;
            assert!(matches!(woken, Either::Left(Ok(()))), "{engine}: not woken");
        });
    }
}
