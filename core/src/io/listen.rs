//! Listening sockets and the accept loop.
//!
//! # TCP: one listener per worker
//!
//! [`TcpListeners::bind`] creates one `SO_REUSEPORT` listener per worker on
//! the same address, all at start-up on the calling thread, so address
//! errors surface before anything runs. The first socket binds the
//! requested address (port 0 picks a port); the others bind the address it
//! got. The kernel spreads incoming connections over the sockets by a hash
//! of the 4-tuple, so each worker accepts its own share without sharing a
//! queue. Linux only groups sockets of the same effective user id, so
//! another user cannot join the group and steal connections. Known
//! trade-off: connections already queued on a socket that is closed are
//! reset, so workers keep their listener for the life of the process.
//! Each worker takes its socket with [`TcpListeners::take`] and converts
//! it on its own runtime with [`tcp_into_monoio`].
//!
//! # Unix sockets: one listener
//!
//! [`bind_unix`] creates the socket file with mode `0770` by default, the
//! permissions upstream Konnectivity gets by binding under umask `0007`.
//! konn does not change the process umask (it is process-wide and would
//! race with other threads); it binds, sets the mode on the new file, and
//! only then calls `listen`, so nobody can connect before the mode is
//! final. With [`UnixListenOptions::remove_existing`] a leftover file at
//! the path is deleted first, but only if it is a socket
//! ([`Error::NotASocket`] otherwise). One worker accepts on it.
//!
//! # The accept loop
//!
//! [`accept_loop`] accepts until its [`StopToken`] fires and never dies on
//! errors that a later `accept` can survive (the lesson of RUSTSEC-2024-0376,
//! where an accept error ended a server's loop):
//! - resource exhaustion (`EMFILE`, `ENFILE`, `ENOBUFS`, `ENOMEM`): logged,
//!   then an exponential back-off from 5 ms to 1 s, reset by the next
//!   success, so a process out of descriptors does not spin;
//! - errors about one pending connection (`ECONNABORTED`, `EPERM` from a
//!   firewall, `EPROTO` and the network errors Linux reports early): counted
//!   and retried at once, since the next queued connection is unaffected;
//! - errors that mean the listener itself is broken (`EBADF`, `EINVAL`,
//!   `ENOTSOCK`, `EFAULT`): the loop returns [`Error::Accept`].
//!
//! Stopping cancels the pending accept. Under io_uring that goes through
//! monoio's `Canceller` and then waits for the operation to finish, so a
//! connection accepted in the race with the cancellation is closed rather
//! than leaked; under epoll a pending accept has taken nothing yet and is
//! simply dropped.
//!
//! Accepted and dialled TCP sockets get `TCP_NODELAY`: konn writes whole
//! frames and batches itself, so Nagle's algorithm only adds latency.
//!
//! # Restarts
//!
//! [`bind_tcp`] retries `EADDRINUSE` for up to [`BIND_RETRY_FOR`]: under
//! io_uring a killed process's listeners stay bound until the kernel has
//! torn its ring down (asynchronously, after the process is reaped), so a
//! restart right after a `SIGKILL` would fail its first start.

use std::{
    fs::Permissions,
    future::Future,
    io,
    net::SocketAddr,
    os::unix::fs::{FileTypeExt, PermissionsExt},
    path::{Path, PathBuf},
    pin::pin,
    time::Duration,
};

use crossbeam_utils::atomic::AtomicCell;
use monoio::{
    io::{CancelHandle, Canceller},
    net::{TcpListener, TcpStream, UnixListener, UnixStream},
};
use socket2::{Domain, Protocol, SockAddr, Socket, Type};

use super::runtime::{Either, StopToken, race};
use crate::Error;

/// Default listen backlog (the kernel caps it at `net.core.somaxconn`).
pub const DEFAULT_BACKLOG: i32 = 1024;

/// First delay after a resource error in [`accept_loop`].
pub const ACCEPT_BACKOFF_MIN: Duration = Duration::from_millis(5);

/// Longest delay between accept attempts while resources are exhausted.
pub const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);

fn bind_error(addr: impl ToString, source: io::Error) -> Error {
    Error::Bind {
        addr: addr.to_string(),
        source,
    }
}

/// How long [`bind_tcp`] keeps retrying an address that is in use.
pub const BIND_RETRY_FOR: Duration = Duration::from_secs(2);

/// Interval between two of those attempts.
const BIND_RETRY_EVERY: Duration = Duration::from_millis(20);

/// A listening TCP socket with `SO_REUSEADDR`, and `SO_REUSEPORT` if asked.
///
/// `EADDRINUSE` is retried for up to [`BIND_RETRY_FOR`] before it is
/// reported: a process killed while io_uring operations were pending on its
/// listeners (an accept is always pending) leaves those sockets listening
/// until the kernel has torn its ring down, which it does asynchronously
/// after the process is gone. A restart right after a `SIGKILL` (a pod's
/// container restart) would otherwise fail once on its own old port.
/// A port held by a live process still fails, 2 s later.
///
/// # Errors
///
/// [`Error::Bind`] naming the address.
pub fn bind_tcp(
    addr: SocketAddr,
    backlog: i32,
    reuse_port: bool,
) -> Result<std::net::TcpListener, Error> {
    let attempts = BIND_RETRY_FOR.as_millis() / BIND_RETRY_EVERY.as_millis();
    let mut attempt = 0;
    loop {
        match bind_tcp_once(addr, backlog, reuse_port) {
            Err(Error::Bind { source, .. })
                if source.raw_os_error() == Some(libc::EADDRINUSE) && attempt < attempts =>
            {
                if attempt == 0 {
                    tracing::info!(
                        %addr,
                        retry_for = ?BIND_RETRY_FOR,
                        "address in use (a previous process's sockets may still be closing); retrying"
                    );
                }
                attempt += 1;
                std::thread::sleep(BIND_RETRY_EVERY);
            }
            other => return other,
        }
    }
}

fn bind_tcp_once(
    addr: SocketAddr,
    backlog: i32,
    reuse_port: bool,
) -> Result<std::net::TcpListener, Error> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))
        .map_err(|e| bind_error(addr, e))?;
    socket
        .set_reuse_address(true)
        .map_err(|e| bind_error(addr, e))?;
    if reuse_port {
        socket
            .set_reuse_port(true)
            .map_err(|e| bind_error(addr, e))?;
    }
    socket
        .bind(&SockAddr::from(addr))
        .map_err(|e| bind_error(addr, e))?;
    socket.listen(backlog).map_err(|e| bind_error(addr, e))?;
    Ok(socket.into())
}

/// One `SO_REUSEPORT` listener per worker on one address.
pub struct TcpListeners {
    addr: SocketAddr,
    slots: Box<[AtomicCell<Option<std::net::TcpListener>>]>,
}

impl TcpListeners {
    /// Binds `count` listeners to `addr` (see the module docs).
    ///
    /// # Errors
    ///
    /// [`Error::Bind`]; [`Error::InvalidConfig`] if `count` is zero.
    pub fn bind(addr: SocketAddr, count: usize, backlog: i32) -> Result<Self, Error> {
        if count == 0 {
            return Err(Error::InvalidConfig("at least one TCP listener is needed"));
        }
        let first = bind_tcp(addr, backlog, true)?;
        let bound = first.local_addr().map_err(|e| bind_error(addr, e))?;
        let mut slots = Vec::with_capacity(count);
        slots.push(AtomicCell::new(Some(first)));
        for _ in 1..count {
            slots.push(AtomicCell::new(Some(bind_tcp(bound, backlog, true)?)));
        }
        Ok(Self {
            addr: bound,
            slots: slots.into_boxed_slice(),
        })
    }

    /// The address every listener is bound to (with the chosen port).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Number of listeners.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Always `false`: [`bind`](Self::bind) creates at least one.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Takes listener `worker` (each can be taken once, from any thread).
    pub fn take(&self, worker: usize) -> Option<std::net::TcpListener> {
        self.slots.get(worker)?.take()
    }
}

impl std::fmt::Debug for TcpListeners {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpListeners")
            .field("addr", &self.addr)
            .field("count", &self.slots.len())
            .finish()
    }
}

/// Blocking mode the current monoio driver expects (non-blocking under
/// epoll, blocking under io_uring, as monoio creates its own sockets).
fn set_mode_for_current_driver(socket: &impl std::os::fd::AsFd) -> io::Result<()> {
    socket2::SockRef::from(socket).set_nonblocking(monoio::utils::is_legacy())
}

/// Registers a listening TCP socket with the current worker's driver.
///
/// # Errors
///
/// [`Error::Bind`] if the driver refuses it.
///
/// # Panics
///
/// Outside a monoio runtime.
pub fn tcp_into_monoio(listener: std::net::TcpListener) -> Result<TcpListener, Error> {
    let addr = listener
        .local_addr()
        .map_or_else(|_| "tcp listener".to_owned(), |a| a.to_string());
    set_mode_for_current_driver(&listener).map_err(|e| bind_error(&addr, e))?;
    TcpListener::from_std(listener).map_err(|e| bind_error(addr, e))
}

/// How [`bind_unix`] creates its socket.
#[derive(Debug, Clone)]
pub struct UnixListenOptions {
    /// Delete an existing socket file at the path first (never a file of
    /// another type). Upstream's `--delete-existing-uds-file`.
    pub remove_existing: bool,
    /// Permission bits of the socket file (default `0o770`).
    pub mode: u32,
    /// Listen backlog.
    pub backlog: i32,
}

impl Default for UnixListenOptions {
    fn default() -> Self {
        Self {
            remove_existing: false,
            mode: 0o770,
            backlog: DEFAULT_BACKLOG,
        }
    }
}

/// Deletes `path` if it is a socket; refuses other file types.
fn remove_stale_socket(path: &Path) -> Result<(), Error> {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => {
            std::fs::remove_file(path).map_err(|e| bind_error(path.display(), e))
        }
        Ok(_) => Err(Error::NotASocket(path.to_path_buf())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(bind_error(path.display(), e)),
    }
}

/// A listening Unix stream socket at `path` (see the module docs for the
/// permission handling).
///
/// # Errors
///
/// [`Error::NotASocket`] if `remove_existing` is set and the path holds
/// something else; [`Error::Bind`] otherwise (e.g. `EADDRINUSE` when the
/// file exists and `remove_existing` is not set).
pub fn bind_unix(
    path: &Path,
    options: &UnixListenOptions,
) -> Result<std::os::unix::net::UnixListener, Error> {
    if options.remove_existing {
        remove_stale_socket(path)?;
    }
    let name = || path.display();
    let socket =
        Socket::new(Domain::UNIX, Type::STREAM, None).map_err(|e| bind_error(name(), e))?;
    let addr = SockAddr::unix(path).map_err(|e| bind_error(name(), e))?;
    socket.bind(&addr).map_err(|e| bind_error(name(), e))?;
    // Not listening yet, so no client can connect while the mode is wrong.
    if let Err(e) = std::fs::set_permissions(path, Permissions::from_mode(options.mode)) {
        let _ = std::fs::remove_file(path);
        return Err(bind_error(name(), e));
    }
    if let Err(e) = socket.listen(options.backlog) {
        let _ = std::fs::remove_file(path);
        return Err(bind_error(name(), e));
    }
    Ok(socket.into())
}

/// Registers a listening Unix socket with the current worker's driver.
///
/// # Errors
///
/// [`Error::Bind`] if the driver refuses it.
///
/// # Panics
///
/// Outside a monoio runtime.
pub fn unix_into_monoio(listener: std::os::unix::net::UnixListener) -> Result<UnixListener, Error> {
    let name = listener
        .local_addr()
        .ok()
        .and_then(|a| a.as_pathname().map(PathBuf::from))
        .map_or_else(|| "unix listener".to_owned(), |p| p.display().to_string());
    set_mode_for_current_driver(&listener).map_err(|e| bind_error(&name, e))?;
    UnixListener::from_std(listener).map_err(|e| bind_error(name, e))
}

/// Connects to `addr` and sets `TCP_NODELAY`.
///
/// # Errors
///
/// The connect or setsockopt error.
pub async fn dial_tcp(addr: SocketAddr) -> io::Result<TcpStream> {
    let stream = TcpStream::connect_addr(addr).await?;
    stream.set_nodelay(true)?;
    Ok(stream)
}

/// A listener [`accept_loop`] can drive.
pub trait Acceptor {
    /// The accepted connection type.
    type Stream;

    /// Accepts one connection; cancellable through `handle`.
    fn accept_cancelable(
        &self,
        handle: CancelHandle,
    ) -> impl Future<Output = io::Result<Self::Stream>>;

    /// Accepts one connection (not registered for cancellation).
    fn accept_plain(&self) -> impl Future<Output = io::Result<Self::Stream>>;
}

impl Acceptor for TcpListener {
    type Stream = TcpStream;

    async fn accept_cancelable(&self, handle: CancelHandle) -> io::Result<TcpStream> {
        let (stream, peer) = self.cancelable_accept(handle).await?;
        Ok(no_delay(stream, peer))
    }

    async fn accept_plain(&self) -> io::Result<TcpStream> {
        let (stream, peer) = self.accept().await?;
        Ok(no_delay(stream, peer))
    }
}

/// `TCP_NODELAY` on an accepted connection.
fn no_delay(stream: TcpStream, peer: SocketAddr) -> TcpStream {
    if let Err(err) = stream.set_nodelay(true) {
        // Typically a connection already reset by the peer; its first
        // read will say so. Not worth failing the accept.
        tracing::debug!(%peer, error = %err, "cannot set TCP_NODELAY");
    }
    stream
}

impl Acceptor for UnixListener {
    type Stream = UnixStream;

    async fn accept_cancelable(&self, handle: CancelHandle) -> io::Result<UnixStream> {
        Ok(self.cancelable_accept(handle).await?.0)
    }

    async fn accept_plain(&self) -> io::Result<UnixStream> {
        Ok(self.accept().await?.0)
    }
}

/// How [`accept_loop`] treats an accept error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AcceptErrorClass {
    /// Out of descriptors, buffers or memory: back off, then retry.
    Resource,
    /// About one pending connection only: retry at once.
    Connection,
    /// The listener is unusable: stop with an error.
    Fatal,
}

/// Classifies an `accept` error (see the module docs).
pub fn classify_accept_error(err: &io::Error) -> AcceptErrorClass {
    match err.raw_os_error() {
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM) => {
            AcceptErrorClass::Resource
        }
        Some(
            libc::ECONNABORTED
            | libc::EPERM
            | libc::EPROTO
            | libc::EINTR
            | libc::EAGAIN
            | libc::ECONNRESET
            | libc::ETIMEDOUT
            | libc::ENETDOWN
            | libc::ENETUNREACH
            | libc::EHOSTDOWN
            | libc::EHOSTUNREACH
            | libc::ENONET
            | libc::ENOPROTOOPT
            | libc::EOPNOTSUPP,
        ) => AcceptErrorClass::Connection,
        Some(libc::EBADF | libc::EINVAL | libc::ENOTSOCK | libc::EFAULT) => AcceptErrorClass::Fatal,
        // Unknown causes: retrying slowly is safer than taking the listener
        // down.
        _ => AcceptErrorClass::Resource,
    }
}

/// Receives what [`accept_loop`] accepts. Any `FnMut(S)` is a handler.
pub trait AcceptHandler<S> {
    /// A new connection.
    fn on_accept(&mut self, stream: S);

    /// An accept error the loop survives (after counting and logging it).
    fn on_error(&mut self, error: &io::Error, class: AcceptErrorClass) {
        let _ = (error, class);
    }
}

impl<S, F: FnMut(S)> AcceptHandler<S> for F {
    fn on_accept(&mut self, stream: S) {
        self(stream);
    }
}

/// What [`accept_loop`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AcceptStats {
    /// Connections handed to the handler.
    pub accepted: u64,
    /// Errors about single connections (retried at once).
    pub connection_errors: u64,
    /// Resource errors (each followed by a back-off).
    pub resource_errors: u64,
}

/// Exponential back-off for resource errors.
#[derive(Debug)]
struct Backoff {
    next: Duration,
}

impl Backoff {
    fn new() -> Self {
        Self {
            next: ACCEPT_BACKOFF_MIN,
        }
    }

    fn reset(&mut self) {
        self.next = ACCEPT_BACKOFF_MIN;
    }

    fn step(&mut self) -> Duration {
        let delay = self.next;
        self.next = (self.next * 2).min(ACCEPT_BACKOFF_MAX);
        delay
    }
}

/// Accepts connections from `listener` and hands them to `handler` until
/// `stop` fires (see the module docs for the error policy).
///
/// # Errors
///
/// [`Error::Accept`] when the listener is unusable.
pub async fn accept_loop<L, H>(
    listener: &L,
    stop: &StopToken,
    mut handler: H,
) -> Result<AcceptStats, Error>
where
    L: Acceptor,
    H: AcceptHandler<L::Stream>,
{
    let mut stats = AcceptStats::default();
    let mut backoff = Backoff::new();
    let canceller = Canceller::new();
    // Under epoll an accept takes a connection only in the poll that
    // returns it, so one dropped while pending has taken nothing: it races
    // the stop plainly, without monoio's registration for cancellation (a
    // hashed set's insert and remove per accept).
    let legacy = monoio::utils::is_legacy();
    loop {
        if stop.is_stopped() {
            return Ok(stats);
        }
        let result = if legacy {
            match race(listener.accept_plain(), stop.stopped()).await {
                Either::Left(result) => result,
                Either::Right(()) => return Ok(stats),
            }
        } else {
            let mut accept = pin!(listener.accept_cancelable(canceller.handle()));
            match race(accept.as_mut(), stop.stopped()).await {
                Either::Left(result) => result,
                Either::Right(()) => {
                    let _fresh = canceller.cancel();
                    // The accept may have completed in the race; dropping
                    // the result closes such a connection instead of
                    // leaking it.
                    drop(accept.await);
                    return Ok(stats);
                }
            }
        };
        let err = match result {
            Ok(stream) => {
                stats.accepted += 1;
                backoff.reset();
                handler.on_accept(stream);
                continue;
            }
            Err(err) => err,
        };
        let class = classify_accept_error(&err);
        match class {
            AcceptErrorClass::Connection => {
                stats.connection_errors += 1;
                tracing::debug!(error = %err, "accept failed for one connection; continuing");
                handler.on_error(&err, class);
            }
            AcceptErrorClass::Resource => {
                stats.resource_errors += 1;
                let delay = backoff.step();
                tracing::warn!(
                    error = %err,
                    retry_in_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
                    "accept: out of resources; backing off"
                );
                handler.on_error(&err, class);
                if let Either::Right(()) = race(monoio::time::sleep(delay), stop.stopped()).await {
                    return Ok(stats);
                }
            }
            AcceptErrorClass::Fatal => {
                tracing::error!(error = %err, "accept: listener unusable; stopping");
                return Err(Error::Accept(err));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classification() {
        let class = |errno| classify_accept_error(&io::Error::from_raw_os_error(errno));
        for errno in [libc::EMFILE, libc::ENFILE, libc::ENOBUFS, libc::ENOMEM] {
            assert_eq!(class(errno), AcceptErrorClass::Resource, "{errno}");
        }
        for errno in [libc::ECONNABORTED, libc::EPERM, libc::EPROTO, libc::EINTR] {
            assert_eq!(class(errno), AcceptErrorClass::Connection, "{errno}");
        }
        for errno in [libc::EBADF, libc::EINVAL, libc::ENOTSOCK] {
            assert_eq!(class(errno), AcceptErrorClass::Fatal, "{errno}");
        }
        assert_eq!(class(libc::EIO), AcceptErrorClass::Resource);
        assert_eq!(
            classify_accept_error(&io::Error::other("no errno")),
            AcceptErrorClass::Resource
        );
    }

    #[test]
    fn backoff_doubles_up_to_the_cap_and_resets() {
        let mut backoff = Backoff::new();
        let delays: Vec<_> = (0..10).map(|_| backoff.step()).collect();
        assert_eq!(delays[0], Duration::from_millis(5));
        assert_eq!(delays[1], Duration::from_millis(10));
        assert_eq!(delays[7], Duration::from_millis(640));
        assert_eq!(delays[8], ACCEPT_BACKOFF_MAX);
        assert_eq!(delays[9], ACCEPT_BACKOFF_MAX);
        backoff.reset();
        assert_eq!(backoff.step(), ACCEPT_BACKOFF_MIN);
    }

    /// A listener whose accept is pending in an io_uring ring stays bound
    /// after its descriptor is closed, until the ring is gone (as after a
    /// `SIGKILL`, where the kernel tears the ring down asynchronously).
    /// `bind_tcp` waits for it; a single attempt fails.
    #[test]
    #[allow(unsafe_code)]
    fn bind_waits_for_a_listener_held_by_a_ring() {
        use std::os::fd::AsRawFd;
        if crate::io::runtime::probe_io_uring().is_err() {
            return; // no io_uring here: nothing can hold the socket
        }
        let held = bind_tcp("127.0.0.1:0".parse().unwrap(), 16, false).unwrap();
        let addr = held.local_addr().unwrap();
        let mut ring = io_uring::IoUring::new(4).unwrap();
        let accept = io_uring::opcode::Accept::new(
            io_uring::types::Fd(held.as_raw_fd()),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        )
        .build();
        // SAFETY: the entry points at no memory (no peer address wanted),
        // and the ring is fresh, so it has room.
        unsafe { ring.submission().push(&accept) }.unwrap();
        ring.submit().unwrap();
        drop(held); // the pending accept keeps the socket listening
        let once = bind_tcp_once(addr, 16, false);
        assert!(
            matches!(&once, Err(Error::Bind { source, .. }) if source.raw_os_error() == Some(libc::EADDRINUSE)),
            "{once:?}"
        );
        let release = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            drop(ring);
        });
        let rebound = bind_tcp(addr, 16, false);
        release.join().unwrap();
        assert_eq!(rebound.unwrap().local_addr().unwrap(), addr);
    }

    #[test]
    fn remove_stale_refuses_regular_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("not-a-socket");
        std::fs::write(&path, b"data").unwrap();
        assert!(matches!(remove_stale_socket(&path), Err(Error::NotASocket(p)) if p == path));
        assert!(path.exists(), "the file must survive");
        assert!(remove_stale_socket(&dir.path().join("missing")).is_ok());
    }
}
