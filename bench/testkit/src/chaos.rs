//! A userspace chaos proxy: a TCP relay between a client and one target
//! whose faults a test switches at run time, per direction ([`Dir::Up`]:
//! client → target, [`Dir::Down`]: target → client). The test bed has no
//! `netem`, so latency, loss and partitions come from here.
//!
//! Faults that last ([`Faults`], set with [`ChaosProxy::set`], applying to
//! open and new connections alike):
//! - `delay` + `jitter`: each chunk is released after delay plus a
//!   pseudo-random share of jitter (order kept);
//! - `rate`: a bandwidth cap in bytes per second;
//! - `stall`: stop reading the source and forwarding (its kernel buffers
//!   and then its window fill up: a frozen or zero-window peer; both ways,
//!   a partition that loses nothing for good, as TCP retransmits);
//! - `blackhole`: read and silently drop everything (FIN held back); the
//!   sockets stay open and no RST is sent: what is sent meanwhile is lost.
//!
//! One-shot actions on the connections open now: [`ChaosProxy::reset`]
//! (RST both sides), [`ChaosProxy::half_close`] (FIN towards the receiver
//! of one direction, which then stops), [`ChaosProxy::corrupt`] (flip one
//! byte a little further down each connection's stream).
//!
//! Each connection runs on one thread with non-blocking sockets and
//! `poll(2)`; at most [`MAX_QUEUED`] bytes wait per direction, so a
//! stalled receiver stops the reading of its source. Everything stops by
//! itself after the lifetime given to [`ChaosProxy::start_with_lifetime`]
//! (default [`LIFETIME`]) or when the proxy is dropped; every open
//! connection is then closed.

use std::collections::VecDeque;
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Default bound on a proxy's life: it closes everything after this.
pub const LIFETIME: Duration = Duration::from_secs(600);

/// Bytes read but not yet written, per direction and connection.
pub const MAX_QUEUED: usize = 256 * 1024;

/// Longest a connection thread waits before it looks at its faults again.
const TICK: Duration = Duration::from_millis(5);

/// A direction of the relayed connections.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dir {
    /// Client → target.
    Up,
    /// Target → client.
    Down,
}

impl Dir {
    fn index(self) -> usize {
        match self {
            Self::Up => 0,
            Self::Down => 1,
        }
    }
}

/// Lasting faults of one direction; `Faults::default()` forwards as is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Faults {
    /// Added to every chunk's delivery time.
    pub delay: Duration,
    /// Up to this much more, pseudo-random per chunk.
    pub jitter: Duration,
    /// Bandwidth cap, bytes per second.
    pub rate: Option<u64>,
    /// Stop reading the source and forwarding.
    pub stall: bool,
    /// Read and drop everything, keep the sockets open.
    pub blackhole: bool,
}

/// The byte [`ChaosProxy::corrupt`] passes over: the second byte of a TLS
/// record's `legacy_record_version` (always 0x03 0x03). RFC 8446 §5.1 has
/// it ignored, and rustls leaves it out of the AEAD's associated data, so
/// flipping it would corrupt nothing a TLS 1.3 peer must notice.
const UNCHECKED_TLS_BYTE: u8 = 0x03;

/// No corruption requested ([`Ctl::corrupt`]).
const NO_CORRUPTION: u64 = u64::MAX;

#[allow(clippy::disallowed_types)] // test tooling: faults shared with plain threads
type Shared<T> = Arc<std::sync::Mutex<T>>;

#[allow(clippy::disallowed_types)]
fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// One-shot requests to one connection.
struct Ctl {
    reset: AtomicBool,
    half: [AtomicBool; 2],
    /// Per direction: corrupt a byte this many bytes past what has been
    /// read ([`NO_CORRUPTION`]: none asked, or taken by the connection).
    corrupt: [AtomicU64; 2],
}

impl Default for Ctl {
    fn default() -> Self {
        Self {
            reset: AtomicBool::new(false),
            half: Default::default(),
            corrupt: [AtomicU64::new(NO_CORRUPTION), AtomicU64::new(NO_CORRUPTION)],
        }
    }
}

struct State {
    faults: Shared<[Faults; 2]>,
    conns: Shared<Vec<Arc<Ctl>>>,
    stop: AtomicBool,
    deadline: Instant,
    open: AtomicUsize,
    accepted: AtomicUsize,
    forwarded: [AtomicU64; 2],
    dropped: [AtomicU64; 2],
}

impl State {
    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Acquire) || now() >= self.deadline
    }
}

#[allow(clippy::disallowed_methods)] // test tooling on plain threads
fn now() -> Instant {
    Instant::now()
}

/// A listening chaos proxy; dropping it closes everything.
pub struct ChaosProxy {
    addr: SocketAddr,
    state: Arc<State>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ChaosProxy {
    /// Listen on 127.0.0.1 (any port) and relay each connection to `target`.
    ///
    /// # Errors
    /// The listener cannot be bound or its thread started.
    pub fn start(target: SocketAddr) -> std::io::Result<Self> {
        Self::start_with_lifetime(target, LIFETIME)
    }

    /// [`ChaosProxy::start`], closing everything after `lifetime`.
    ///
    /// # Errors
    /// The listener cannot be bound or its thread started.
    pub fn start_with_lifetime(target: SocketAddr, lifetime: Duration) -> std::io::Result<Self> {
        let l = TcpListener::bind("127.0.0.1:0")?;
        l.set_nonblocking(true)?;
        let addr = l.local_addr()?;
        let state = Arc::new(State {
            faults: Shared::default(),
            conns: Shared::default(),
            stop: AtomicBool::new(false),
            deadline: now() + lifetime,
            open: AtomicUsize::new(0),
            accepted: AtomicUsize::new(0),
            forwarded: Default::default(),
            dropped: Default::default(),
        });
        let st = state.clone();
        let thread = std::thread::Builder::new()
            .name("chaos-accept".into())
            .spawn(move || accept_loop(&l, target, &st))?;
        Ok(Self {
            addr,
            state,
            thread: Some(thread),
        })
    }

    /// Its address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Set the faults of direction `dir` (open and new connections).
    pub fn set(&self, dir: Dir, faults: Faults) {
        lock(&self.state.faults)[dir.index()] = faults;
    }

    /// Set the same faults on both directions.
    pub fn set_both(&self, faults: Faults) {
        *lock(&self.state.faults) = [faults; 2];
    }

    /// Forward as is again, both directions (what was dropped stays lost).
    pub fn heal(&self) {
        self.set_both(Faults::default());
    }

    /// Reset every open connection: both peers get an RST.
    pub fn reset(&self) {
        for c in lock(&self.state.conns).iter() {
            c.reset.store(true, Ordering::Release);
        }
    }

    /// On every open connection, send FIN to the receiver of `dir` (after
    /// what is queued) and forward nothing more that way; the other
    /// direction keeps working.
    pub fn half_close(&self, dir: Dir) {
        for c in lock(&self.state.conns).iter() {
            c.half[dir.index()].store(true, Ordering::Release);
        }
    }

    /// On every open connection, flip (XOR 0xff) one byte of direction
    /// `dir`: the first one at least `ahead` bytes past what the
    /// connection has read so far that is not [`UNCHECKED_TLS_BYTE`] (so a
    /// TLS peer always notices). Returns once every connection has taken
    /// the request, with how many did; connections opened later are left
    /// alone.
    pub fn corrupt(&self, dir: Dir, ahead: u64) -> usize {
        let conns: Vec<Arc<Ctl>> = lock(&self.state.conns).clone();
        for c in &conns {
            c.corrupt[dir.index()].store(ahead.min(NO_CORRUPTION - 1), Ordering::Release);
        }
        // Each connection thread looks at its requests at least every
        // TICK; one that ended is no longer listed.
        crate::wait::wait_until(crate::wait::WAIT, || {
            let listed = lock(&self.state.conns);
            !conns.iter().any(|c| {
                c.corrupt[dir.index()].load(Ordering::Acquire) != NO_CORRUPTION
                    && listed.iter().any(|l| Arc::ptr_eq(l, c))
            })
        });
        conns
            .iter()
            .filter(|c| c.corrupt[dir.index()].load(Ordering::Acquire) == NO_CORRUPTION)
            .count()
    }

    /// Connections relayed now.
    pub fn open(&self) -> usize {
        self.state.open.load(Ordering::Acquire)
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> usize {
        self.state.accepted.load(Ordering::Acquire)
    }

    /// Bytes delivered in direction `dir` so far.
    pub fn forwarded(&self, dir: Dir) -> u64 {
        self.state.forwarded[dir.index()].load(Ordering::Acquire)
    }

    /// Bytes a blackhole dropped in direction `dir` so far.
    pub fn dropped(&self, dir: Dir) -> u64 {
        self.state.dropped[dir.index()].load(Ordering::Acquire)
    }
}

impl Drop for ChaosProxy {
    fn drop(&mut self) {
        self.state.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn accept_loop(l: &TcpListener, target: SocketAddr, st: &Arc<State>) {
    let mut workers = Vec::new();
    while !st.stopped() {
        match l.accept() {
            Ok((client, _)) => {
                st.accepted.fetch_add(1, Ordering::AcqRel);
                let Ok(upstream) = TcpStream::connect_timeout(&target, Duration::from_secs(5))
                else {
                    continue; // the client sees its connection close
                };
                let ctl = Arc::new(Ctl::default());
                lock(&st.conns).push(ctl.clone());
                st.open.fetch_add(1, Ordering::AcqRel);
                let st2 = st.clone();
                let seed = st.accepted.load(Ordering::Acquire) as u64;
                let spawned =
                    std::thread::Builder::new()
                        .name("chaos-conn".into())
                        .spawn(move || {
                            pump(client, upstream, &ctl, &st2, seed);
                            lock(&st2.conns).retain(|c| !Arc::ptr_eq(c, &ctl));
                            st2.open.fetch_sub(1, Ordering::AcqRel);
                        });
                match spawned {
                    Ok(h) => workers.push(h),
                    Err(_) => {
                        st.open.fetch_sub(1, Ordering::AcqRel);
                    }
                }
                workers.retain(|h| !h.is_finished());
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                poll_fds(
                    &mut [pollfd(l.as_raw_fd(), libc::POLLIN)],
                    Duration::from_millis(20),
                );
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            // EMFILE and the like: wait, then try again.
            Err(_) => poll_fds(&mut [], Duration::from_millis(20)),
        }
    }
    for h in workers {
        let _ = h.join();
    }
}

/// One direction of a connection.
struct Way {
    /// Chunks waiting for their release time.
    queue: VecDeque<(Instant, Vec<u8>)>,
    queued: usize,
    /// Stream offset of the next byte read.
    offset: u64,
    /// Corrupt the first checked byte at or past this offset.
    corrupt: Option<u64>,
    /// Release time of the last queued chunk (order and rate).
    last: Instant,
    /// The source sent FIN (or the way was half-closed): stop reading.
    eof: bool,
    /// FIN sent to the receiver.
    shut: bool,
}

impl Way {
    fn new() -> Self {
        Self {
            queue: VecDeque::new(),
            queued: 0,
            offset: 0,
            corrupt: None,
            last: now(),
            eof: false,
            shut: false,
        }
    }
}

fn pollfd(fd: i32, events: libc::c_short) -> libc::pollfd {
    libc::pollfd {
        fd,
        events,
        revents: 0,
    }
}

#[allow(unsafe_code)]
fn poll_fds(fds: &mut [libc::pollfd], timeout: Duration) {
    let ms = i32::try_from(timeout.as_millis())
        .unwrap_or(i32::MAX)
        .max(1);
    // SAFETY: `fds` is a valid, exclusively borrowed slice of pollfd for
    // the duration of the call; with an empty slice poll only sleeps.
    unsafe {
        libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms);
    }
}

/// Relays one connection until both directions ended, a reset, an error
/// or the proxy stops.
fn pump(client: TcpStream, upstream: TcpStream, ctl: &Ctl, st: &State, seed: u64) {
    let socks = [client, upstream];
    for s in &socks {
        let _ = s.set_nonblocking(true);
        let _ = s.set_nodelay(true);
    }
    let mut ways = [Way::new(), Way::new()];
    let mut rng = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        if st.stopped() {
            return;
        }
        if ctl.reset.load(Ordering::Acquire) {
            for s in &socks {
                // SO_LINGER 0: the close below sends RST, not FIN.
                let _ = socket2::SockRef::from(s).set_linger(Some(Duration::ZERO));
            }
            return;
        }
        let faults = *lock(&st.faults);
        let t = now();
        let mut failed = false;
        for d in 0..2 {
            let (from, to) = (&socks[d], &socks[1 - d]);
            let f = faults[d];
            let way = &mut ways[d];
            let ahead = ctl.corrupt[d].swap(NO_CORRUPTION, Ordering::AcqRel);
            if ahead != NO_CORRUPTION {
                way.corrupt = Some(way.offset + ahead);
            }
            if ctl.half[d].load(Ordering::Acquire) && !way.eof {
                way.eof = true;
                way.queue.clear();
                way.queued = 0;
            }
            // Read while there is room and no stall.
            while !way.eof && !f.stall && way.queued < MAX_QUEUED {
                match (&*from).read(&mut buf) {
                    Ok(0) => way.eof = true,
                    Ok(n) => {
                        let chunk = &mut buf[..n];
                        if let Some(at) = way.corrupt
                            && at < way.offset + n as u64
                        {
                            let from = at.saturating_sub(way.offset) as usize;
                            way.corrupt =
                                match chunk[from..].iter().position(|&b| b != UNCHECKED_TLS_BYTE) {
                                    Some(i) => {
                                        chunk[from + i] ^= 0xff;
                                        None
                                    }
                                    None => Some(way.offset + n as u64),
                                };
                        }
                        way.offset += n as u64;
                        if f.blackhole {
                            st.dropped[d].fetch_add(n as u64, Ordering::AcqRel);
                            continue;
                        }
                        rng ^= rng << 13;
                        rng ^= rng >> 7;
                        rng ^= rng << 17;
                        let jitter = if f.jitter.is_zero() {
                            Duration::ZERO
                        } else {
                            Duration::from_nanos(rng % f.jitter.as_nanos().max(1) as u64)
                        };
                        let mut at = (t + f.delay + jitter).max(way.last);
                        if let Some(rate) = f.rate.filter(|r| *r > 0) {
                            at = at.max(way.last) + Duration::from_secs_f64(n as f64 / rate as f64);
                        }
                        way.last = at;
                        way.queued += n;
                        way.queue.push_back((at, chunk.to_vec()));
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == ErrorKind::Interrupted => {}
                    Err(_) => {
                        failed = true;
                        break;
                    }
                }
            }
            // Write what is due (nothing under a stall or blackhole).
            while let Some((at, chunk)) = way.queue.front_mut() {
                if *at > t || f.blackhole || f.stall {
                    break;
                }
                match (&*to).write(chunk) {
                    Ok(n) => {
                        st.forwarded[d].fetch_add(n as u64, Ordering::AcqRel);
                        way.queued -= n;
                        if n == chunk.len() {
                            way.queue.pop_front();
                        } else {
                            chunk.drain(..n);
                        }
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == ErrorKind::Interrupted => {}
                    Err(_) => {
                        failed = true;
                        break;
                    }
                }
            }
            // A FIN is held back by a stall or blackhole like any byte.
            if way.eof && way.queue.is_empty() && !way.shut && !f.stall && !f.blackhole {
                way.shut = true;
                let _ = to.shutdown(Shutdown::Write);
            }
        }
        if failed || (ways[0].shut && ways[1].shut) {
            return;
        }
        // Sleep until a socket is ready or the next release time.
        let mut wait = TICK;
        let mut fds = Vec::with_capacity(2);
        for (d, way) in ways.iter().enumerate() {
            let f = faults[d];
            let mut ev = 0;
            if !way.eof && !f.stall && way.queued < MAX_QUEUED {
                ev |= libc::POLLIN;
            }
            if let Some((at, _)) = way.queue.front().filter(|_| !f.stall && !f.blackhole) {
                if *at <= t {
                    fds.push(pollfd(socks[1 - d].as_raw_fd(), libc::POLLOUT));
                } else {
                    wait = wait.min(*at - t);
                }
            }
            if ev != 0 {
                fds.push(pollfd(socks[d].as_raw_fd(), ev));
            }
        }
        poll_fds(&mut fds, wait);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::blocking::ReadRetry;
    use crate::wait::wait_until;

    const T: Duration = Duration::from_secs(10);

    /// A target that echoes, and the proxy in front of it.
    fn echo_behind_proxy() -> (crate::dest::Destination, ChaosProxy) {
        let dest = crate::dest::Destination::echo().unwrap();
        let proxy = ChaosProxy::start(dest.addr()).unwrap();
        (dest, proxy)
    }

    fn connect(p: &ChaosProxy) -> TcpStream {
        let s = TcpStream::connect(p.addr()).unwrap();
        s.set_read_timeout(Some(T)).unwrap();
        s
    }

    fn roundtrip(s: &mut TcpStream, msg: &[u8]) -> Vec<u8> {
        s.write_all(msg).unwrap();
        let mut got = vec![0u8; msg.len()];
        s.read_exact(&mut got).unwrap();
        got
    }

    /// True when nothing arrives on `s` within `within`.
    fn silent(s: &mut TcpStream, within: Duration) -> bool {
        s.set_read_timeout(Some(within)).unwrap();
        let mut b = [0u8; 1];
        let quiet = matches!(s.read_retry(&mut b), Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut));
        s.set_read_timeout(Some(T)).unwrap();
        quiet
    }

    #[test]
    fn relays_bytes_exactly_and_forgets_closed_connections() {
        let (_d, p) = echo_behind_proxy();
        let mut s = connect(&p);
        let data: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let mut r = s.try_clone().unwrap();
        let sent = data.clone();
        let w = std::thread::spawn(move || r.write_all(&sent).unwrap());
        let mut got = vec![0u8; data.len()];
        s.read_exact(&mut got).unwrap();
        w.join().unwrap();
        assert_eq!(crate::sha256_hex(&got), crate::sha256_hex(&data));
        assert_eq!(p.forwarded(Dir::Up), data.len() as u64);
        drop(s);
        assert!(wait_until(T, || p.open() == 0), "open: {}", p.open());
    }

    #[test]
    fn delay_and_rate_slow_delivery_down() {
        let (_d, p) = echo_behind_proxy();
        let mut s = connect(&p);
        p.set(
            Dir::Up,
            Faults {
                delay: Duration::from_millis(100),
                jitter: Duration::from_millis(20),
                ..Faults::default()
            },
        );
        let start = now();
        assert_eq!(roundtrip(&mut s, b"ping"), b"ping");
        assert!(start.elapsed() >= Duration::from_millis(100));
        p.set(
            Dir::Down,
            Faults {
                rate: Some(1_000_000),
                ..Faults::default()
            },
        );
        p.set(Dir::Up, Faults::default());
        let start = now();
        let msg = vec![5u8; 200_000];
        let mut w = s.try_clone().unwrap();
        let sent = msg.clone();
        let writer = std::thread::spawn(move || w.write_all(&sent).unwrap());
        let mut got = vec![0u8; msg.len()];
        s.read_exact(&mut got).unwrap();
        writer.join().unwrap();
        assert_eq!(got, msg);
        // 200 kB at 1 MB/s: at least 150 ms (the first chunk goes at once).
        assert!(start.elapsed() >= Duration::from_millis(150));
    }

    #[test]
    fn stall_holds_bytes_back_until_healed() {
        let (_d, p) = echo_behind_proxy();
        let mut s = connect(&p);
        assert_eq!(roundtrip(&mut s, b"a"), b"a");
        p.set(
            Dir::Up,
            Faults {
                stall: true,
                ..Faults::default()
            },
        );
        s.write_all(b"held").unwrap();
        assert!(silent(&mut s, Duration::from_millis(200)));
        p.heal();
        let mut got = [0u8; 4];
        s.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"held");
    }

    #[test]
    fn blackhole_drops_silently_and_keeps_the_socket_open() {
        let (_d, p) = echo_behind_proxy();
        let mut s = connect(&p);
        assert_eq!(roundtrip(&mut s, b"a"), b"a");
        p.set(
            Dir::Up,
            Faults {
                blackhole: true,
                ..Faults::default()
            },
        );
        s.write_all(b"lost").unwrap();
        assert!(wait_until(T, || p.dropped(Dir::Up) == 4));
        assert!(silent(&mut s, Duration::from_millis(100)));
        assert_eq!(p.open(), 1);
        p.heal();
        assert_eq!(roundtrip(&mut s, b"after"), b"after");
    }

    #[test]
    fn reset_sends_rst_to_both_sides() {
        let (_d, p) = echo_behind_proxy();
        let mut s = connect(&p);
        assert_eq!(roundtrip(&mut s, b"a"), b"a");
        p.reset();
        let mut b = [0u8; 1];
        let err = s.read_retry(&mut b).expect_err("an RST, not EOF or data");
        assert_eq!(err.kind(), ErrorKind::ConnectionReset);
        assert!(wait_until(T, || p.open() == 0));
    }

    #[test]
    fn corrupt_flips_one_checked_byte_ahead_on_open_connections_only() {
        let (_d, p) = echo_behind_proxy();
        let mut s = connect(&p);
        assert_eq!(roundtrip(&mut s, b"hello"), b"hello");
        assert_eq!(p.corrupt(Dir::Down, 3), 1);
        // Down offset 5 + 3 = 8 holds 0x03 (passed over); 9 is flipped.
        let got = roundtrip(&mut s, b"ab\x03\x03cdef");
        assert_eq!(got, [b'a', b'b', 3, 3, b'c' ^ 0xff, b'd', b'e', b'f']);
        // One byte only, on that connection only.
        assert_eq!(roundtrip(&mut s, b"ghijkl"), b"ghijkl");
        let mut later = connect(&p);
        assert_eq!(roundtrip(&mut later, b"abcdefghijkl"), b"abcdefghijkl");
    }

    #[test]
    fn half_close_ends_one_direction_only() {
        // A target that reports what it received once the client's side ends.
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let target = l.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            let (mut c, _) = l.accept().unwrap();
            c.set_read_timeout(Some(T)).unwrap();
            c.write_all(b"hello").unwrap();
            let mut got = Vec::new();
            c.read_to_end(&mut got).unwrap();
            got
        });
        let p = ChaosProxy::start(target).unwrap();
        let mut s = connect(&p);
        let mut hello = [0u8; 5];
        s.read_exact(&mut hello).unwrap();
        p.half_close(Dir::Down);
        let mut rest = Vec::new();
        s.read_to_end(&mut rest).unwrap();
        assert!(rest.is_empty(), "EOF towards the client");
        s.write_all(b"still up").unwrap();
        s.shutdown(Shutdown::Write).unwrap();
        assert_eq!(server.join().unwrap(), b"still up");
    }

    #[test]
    fn stops_by_itself_after_its_lifetime() {
        let dest = crate::dest::Destination::echo().unwrap();
        let p = ChaosProxy::start_with_lifetime(dest.addr(), Duration::from_millis(300)).unwrap();
        let mut s = connect(&p);
        assert_eq!(roundtrip(&mut s, b"a"), b"a");
        let mut b = [0u8; 1];
        // The connection is closed at the end of the lifetime.
        assert!(matches!(s.read_retry(&mut b), Ok(0) | Err(_)));
        assert!(wait_until(T, || p.open() == 0));
        assert!(wait_until(T, || TcpStream::connect(p.addr()).is_err()));
    }
}
