//! Destinations for demos and tests, on plain threads: a TCP echo server,
//! a tiny HTTP/1.1 server, a hashing sink and a pattern source for bulk
//! transfers, and an address whose connects never complete. Each stops
//! accepting when dropped.
//!
//! Every connection a [`Destination`] served counts the bytes it read and
//! wrote; when it ends, the pair goes to a process-wide ledger
//! ([`take_transfers`]): what really crossed the destination's socket, for
//! tests that compare it with what konn accounted (the audit log).

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use crate::blocking::ReadRetry;
use crate::{Pattern, Sha256};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// What one destination connection moved, counted at its socket.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Transfer {
    /// Bytes read from the client.
    pub received: u64,
    /// Bytes written to the client.
    pub sent: u64,
}

#[allow(clippy::disallowed_types)] // test tooling: one ledger across the destinations' threads
static LEDGER: std::sync::Mutex<Vec<Transfer>> = std::sync::Mutex::new(Vec::new());

/// Transfers kept at most between two [`take_transfers`] (16 MiB): a
/// demo that never takes them does not grow without bound.
pub const LEDGER_CAP: usize = 1 << 20;

/// The transfers of every destination connection that ended since the last
/// call (all destinations of the process; tests of one binary run one at a
/// time, see `fds::serial`), at most [`LEDGER_CAP`].
pub fn take_transfers() -> Vec<Transfer> {
    LEDGER
        .lock()
        .map(|mut l| std::mem::take(&mut *l))
        .unwrap_or_default()
}

/// One connection's counters; the pair goes to the ledger when its last
/// handle drops.
#[derive(Default)]
struct Counts {
    received: AtomicU64,
    sent: AtomicU64,
}

impl Drop for Counts {
    fn drop(&mut self) {
        let t = Transfer {
            received: self.received.load(Ordering::Relaxed),
            sent: self.sent.load(Ordering::Relaxed),
        };
        if let Ok(mut l) = LEDGER.lock()
            && l.len() < LEDGER_CAP
        {
            l.push(t);
        }
    }
}

/// A destination's end of a connection: a `TcpStream` that counts.
struct Conn {
    s: TcpStream,
    counts: Arc<Counts>,
}

impl Conn {
    fn try_clone(&self) -> std::io::Result<Self> {
        Ok(Self {
            s: self.s.try_clone()?,
            counts: self.counts.clone(),
        })
    }

    fn shutdown(&self, how: std::net::Shutdown) -> std::io::Result<()> {
        self.s.shutdown(how)
    }
}

impl Read for Conn {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.s.read(buf)?;
        self.counts.received.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }
}

impl Write for Conn {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.s.write(buf)?;
        self.counts.sent.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.s.flush()
    }
}

/// A listening destination; dropping it stops the accept loop.
pub struct Destination {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    served: Arc<AtomicU64>,
}

impl Destination {
    /// Its `host:port`.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> u64 {
        self.served.load(Ordering::Relaxed)
    }

    fn start(
        name: &str,
        handle: impl Fn(Conn) + Send + Sync + Clone + 'static,
    ) -> std::io::Result<Self> {
        Self::start_on(name, IpAddr::V4(Ipv4Addr::LOCALHOST), handle)
    }

    fn start_on(
        name: &str,
        ip: IpAddr,
        handle: impl Fn(Conn) + Send + Sync + Clone + 'static,
    ) -> std::io::Result<Self> {
        let l = TcpListener::bind(SocketAddr::new(ip, 0))?;
        let addr = l.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let served = Arc::new(AtomicU64::new(0));
        let (stop2, served2) = (stop.clone(), served.clone());
        std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                for s in l.incoming() {
                    if stop2.load(Ordering::Relaxed) {
                        return;
                    }
                    let Ok(s) = s else { continue };
                    served2.fetch_add(1, Ordering::Relaxed);
                    let handle = handle.clone();
                    let conn = Conn {
                        s,
                        counts: Arc::default(),
                    };
                    let _ = std::thread::Builder::new()
                        .name("dest-conn".into())
                        .spawn(move || handle(conn));
                }
            })?;
        Ok(Self { addr, stop, served })
    }

    /// Echoes every byte back until the client closes.
    pub fn echo() -> std::io::Result<Self> {
        Self::echo_on(IpAddr::V4(Ipv4Addr::LOCALHOST))
    }

    /// [`Destination::echo`] listening on `ip` (any loopback address,
    /// e.g. 127.0.0.2, to tell destinations apart by host).
    pub fn echo_on(ip: IpAddr) -> std::io::Result<Self> {
        Self::start_on("dest-echo", ip, |mut s| {
            let Ok(mut r) = s.try_clone() else { return };
            let _ = std::io::copy(&mut r, &mut s);
            let _ = s.shutdown(std::net::Shutdown::Write);
        })
    }

    /// A sink for uploads: reads an 8-byte big-endian length `n`, then
    /// `n` bytes, hashing them as they come (no echo, so the sender is the
    /// only limit), answers with the 64-character hex SHA-256 of those
    /// bytes, and then reads until the client closes.
    pub fn sink() -> std::io::Result<Self> {
        Self::start("dest-sink", |mut s| {
            let mut len = [0u8; 8];
            if s.read_exact(&mut len).is_err() {
                return;
            }
            let mut left = u64::from_be_bytes(len);
            let mut hash = Sha256::new();
            let mut buf = vec![0u8; 256 * 1024];
            while left > 0 {
                let want = usize::try_from(left).unwrap_or(usize::MAX).min(buf.len());
                match s.read_retry(&mut buf[..want]) {
                    Ok(0) | Err(_) => return,
                    Ok(n) => {
                        hash.update(&buf[..n]);
                        left -= n as u64;
                    }
                }
            }
            if s.write_all(hash.finish_hex().as_bytes()).is_err() {
                return;
            }
            while matches!(s.read_retry(&mut buf), Ok(n) if n > 0) {}
        })
    }

    /// A source for downloads: reads an 8-byte big-endian length `n` and
    /// an 8-byte big-endian seed, writes the first `n` bytes of
    /// [`Pattern::new(seed)`](Pattern) as fast as the connection takes
    /// them, then closes.
    pub fn source() -> std::io::Result<Self> {
        Self::start("dest-source", |mut s| {
            let mut head = [0u8; 16];
            if s.read_exact(&mut head).is_err() {
                return;
            }
            let (n, seed) = head.split_at(8);
            let mut left = u64::from_be_bytes(n.try_into().unwrap_or_default());
            let mut pattern = Pattern::new(u64::from_be_bytes(seed.try_into().unwrap_or_default()));
            let mut buf = vec![0u8; 256 * 1024];
            while left > 0 {
                let n = usize::try_from(left).unwrap_or(usize::MAX).min(buf.len());
                pattern.fill(&mut buf[..n]);
                if s.write_all(&buf[..n]).is_err() {
                    return;
                }
                left -= n as u64;
            }
            let _ = s.shutdown(std::net::Shutdown::Both);
        })
    }

    /// Writes [`Pattern::new(0)`](Pattern) from the moment it accepts,
    /// without reading, until the connection breaks: a destination that
    /// sends more than anyone reads (memory-budget and stalled-reader
    /// scenarios).
    pub fn flood() -> std::io::Result<Self> {
        Self::start("dest-flood", |mut s| {
            let mut pattern = Pattern::new(0);
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                pattern.fill(&mut buf);
                if s.write_all(&buf).is_err() {
                    return;
                }
            }
        })
    }

    /// Answers each HTTP/1.1 request with `200 OK` and a short text body
    /// naming the request path and the body size asked for with
    /// `?bytes=N` (N bytes of `x` follow the text); closes after a request
    /// with `Connection: close`.
    pub fn http() -> std::io::Result<Self> {
        Self::start("dest-http", |mut s| {
            let mut buf = Vec::new();
            let mut chunk = [0u8; 4096];
            loop {
                let Some(end) = find(&buf, b"\r\n\r\n") else {
                    match s.read_retry(&mut chunk) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                    continue;
                };
                let head = String::from_utf8_lossy(&buf[..end]).into_owned();
                buf.drain(..end + 4);
                let path = head.split_whitespace().nth(1).unwrap_or("/").to_owned();
                let extra: usize = path
                    .split_once("bytes=")
                    .and_then(|(_, n)| n.parse().ok())
                    .unwrap_or(0)
                    .min(1 << 30);
                let text = format!("hello from the node network: you asked for {path}\n");
                let header = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\r\n",
                    text.len() + extra
                );
                if s.write_all(header.as_bytes()).is_err() || s.write_all(text.as_bytes()).is_err()
                {
                    return;
                }
                let block = [b'x'; 16 * 1024];
                let mut left = extra;
                while left > 0 {
                    let n = left.min(block.len());
                    if s.write_all(&block[..n]).is_err() {
                        return;
                    }
                    left -= n;
                }
                if head.to_ascii_lowercase().contains("\r\nconnection: close") {
                    let _ = s.shutdown(std::net::Shutdown::Both);
                    return;
                }
            }
        })
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

impl Drop for Destination {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Wake the accept loop so it sees the flag.
        let _ = TcpStream::connect(self.addr);
    }
}

/// An address whose TCP connects never complete: a listener with a
/// backlog of zero whose accept queue is already full and that never
/// accepts, so the kernel drops every further SYN and a dialler waits
/// until its own timeout. Dropping it closes the listener.
pub struct Unresponsive {
    addr: SocketAddr,
    listener: Option<socket2::Socket>,
    queued: Vec<TcpStream>,
    echo: Option<(Arc<AtomicBool>, std::thread::JoinHandle<()>)>,
}

impl Unresponsive {
    /// Listen on 127.0.0.1 (any port) and fill the accept queue.
    ///
    /// # Errors
    ///
    /// The socket cannot be set up, or the queue never fills.
    pub fn start() -> std::io::Result<Self> {
        Self::start_on(IpAddr::V4(Ipv4Addr::LOCALHOST))
    }

    /// [`Unresponsive::start`] on `ip` (a loopback address).
    ///
    /// # Errors
    ///
    /// As [`Unresponsive::start`].
    pub fn start_on(ip: IpAddr) -> std::io::Result<Self> {
        use socket2::{Domain, Protocol, Socket, Type};
        let l = Socket::new(
            Domain::for_address(SocketAddr::new(ip, 0)),
            Type::STREAM,
            Some(Protocol::TCP),
        )?;
        l.bind(&SocketAddr::new(ip, 0).into())?;
        l.listen(0)?;
        let addr = l
            .local_addr()?
            .as_socket()
            .ok_or_else(|| std::io::Error::other("not an inet socket"))?;
        // Connect until one attempt hangs: from then on SYNs are dropped.
        let mut queued = Vec::new();
        for _ in 0..16 {
            match TcpStream::connect_timeout(&addr, Duration::from_millis(200)) {
                Ok(s) => queued.push(s),
                Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {
                    return Ok(Self {
                        addr,
                        listener: Some(l),
                        queued,
                        echo: None,
                    });
                }
                Err(e) => return Err(e),
            }
        }
        Err(std::io::Error::other(
            "the accept queue of a zero-backlog listener did not fill",
        ))
    }

    /// Its `host:port`.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// From now on accept and echo, like [`Destination::echo`]: a connect
    /// that is waiting completes when its SYN is next retransmitted
    /// (about 1 s after its first one), so a dial can be held pending for
    /// a while and then succeed.
    ///
    /// The connections that filled the queue are closed (no descriptor
    /// is added).
    ///
    /// # Errors
    ///
    /// The accepting thread cannot be started.
    pub fn start_echo(&mut self) -> std::io::Result<()> {
        let Some(l) = self.listener.take() else {
            return Ok(());
        };
        let l: TcpListener = l.into();
        self.queued.clear();
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("dest-late-echo".into())
            .spawn(move || {
                for s in l.incoming() {
                    if flag.load(Ordering::Relaxed) {
                        return;
                    }
                    let Ok(mut s) = s else { continue };
                    let _ = std::thread::Builder::new()
                        .name("dest-conn".into())
                        .spawn(move || {
                            let Ok(mut r) = s.try_clone() else { return };
                            let _ = std::io::copy(&mut r, &mut s);
                            let _ = s.shutdown(std::net::Shutdown::Write);
                        });
                }
            })?;
        self.echo = Some((stop, thread));
        Ok(())
    }
}

impl Drop for Unresponsive {
    fn drop(&mut self) {
        if let Some((stop, thread)) = self.echo.take() {
            stop.store(true, Ordering::Relaxed);
            // Wake the accept loop so it sees the flag.
            let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
            let _ = thread.join();
        }
    }
}
