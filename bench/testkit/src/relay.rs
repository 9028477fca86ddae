//! A round-robin TCP load balancer for tests: each accepted connection is
//! relayed byte for byte to the next backend in turn, on plain threads.
//! [`LoadBalancer::cut`] breaks every relayed connection at once, which is
//! what the other side sees when a process dies (or a network path breaks):
//! tests put one in front of a server's agent port to kill an agent's
//! tunnel, or to restart a server behind a stable address.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// Relayed connections by pair id (both sockets of a pair), so `cut` can
/// reach them; a pair removes itself once both directions ended, so a
/// balancer holds no descriptor of a finished connection.
#[allow(clippy::disallowed_types)] // test tooling: bookkeeping across plain threads
type Conns = Arc<std::sync::Mutex<Vec<(usize, TcpStream)>>>;

#[allow(clippy::disallowed_types)]
type Backends = Arc<std::sync::Mutex<Vec<SocketAddr>>>;

/// A listening load balancer; dropping it stops accepting and cuts every
/// relayed connection.
pub struct LoadBalancer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    accepted: Arc<AtomicUsize>,
    conns: Conns,
    backends: Backends,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl LoadBalancer {
    /// Listen on 127.0.0.1 (any port) and relay to `backends` round-robin.
    ///
    /// # Errors
    ///
    /// The listener cannot be bound or its thread started.
    pub fn start(backends: Vec<SocketAddr>) -> std::io::Result<Self> {
        Self::start_with(backends, None)
    }

    /// Like [`start`](Self::start), but each connection goes to a backend
    /// drawn at random (a generator seeded with `seed`), as a Kubernetes
    /// Service's iptables rules pick one: strict round-robin can pair
    /// clients that connect in lockstep with fixed subsets of backends.
    ///
    /// # Errors
    ///
    /// As [`start`](Self::start).
    pub fn start_random(backends: Vec<SocketAddr>, seed: u64) -> std::io::Result<Self> {
        Self::start_with(backends, Some(seed))
    }

    fn start_with(backends: Vec<SocketAddr>, seed: Option<u64>) -> std::io::Result<Self> {
        let l = TcpListener::bind("127.0.0.1:0")?;
        let addr = l.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let accepted = Arc::new(AtomicUsize::new(0));
        let conns = Conns::default();
        let backends: Backends = Arc::new(backends.into());
        let (flag, count, list, targets) = (
            stop.clone(),
            accepted.clone(),
            conns.clone(),
            backends.clone(),
        );
        let thread = std::thread::Builder::new()
            .name("lb-accept".into())
            .spawn(move || {
                for (next, client) in l.incoming().enumerate() {
                    if flag.load(Ordering::Acquire) {
                        return;
                    }
                    let Ok(client) = client else { return };
                    let backend = {
                        let t = targets
                            .lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner);
                        if t.is_empty() {
                            continue; // the client sees the connection close
                        }
                        let draw = seed.map_or(next, |seed| splitmix(seed ^ next as u64) as usize);
                        t[draw % t.len()]
                    };
                    count.fetch_add(1, Ordering::Relaxed);
                    let Ok(upstream) = TcpStream::connect(backend) else {
                        continue;
                    };
                    let _ = client.set_nodelay(true);
                    let _ = upstream.set_nodelay(true);
                    if let Ok(mut l) = list.lock() {
                        l.extend(client.try_clone().ok().map(|s| (next, s)));
                        l.extend(upstream.try_clone().ok().map(|s| (next, s)));
                    }
                    relay(client, upstream, next, &list);
                }
            })?;
        Ok(Self {
            addr,
            stop,
            accepted,
            conns,
            backends,
            thread: Some(thread),
        })
    }

    /// Its address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Connections accepted and relayed so far.
    pub fn accepted(&self) -> usize {
        self.accepted.load(Ordering::Relaxed)
    }

    /// Send new connections to `backends` from now on (empty: close them).
    pub fn set_backends(&self, backends: Vec<SocketAddr>) {
        *self
            .backends
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = backends;
    }

    /// Cut every relayed connection (both sides see the socket shut down),
    /// as the death of the process on either side would.
    pub fn cut(&self) {
        if let Ok(mut l) = self.conns.lock() {
            for (_, s) in l.drain(..) {
                let _ = s.shutdown(std::net::Shutdown::Both);
            }
        }
    }
}

/// splitmix64's output function: a well-mixed number from `x` (also the
/// jitter of `konn-bench agents`).
pub fn splitmix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Copy both ways until either side closes, then close both and forget
/// pair `id`.
fn relay(a: TcpStream, b: TcpStream, id: usize, list: &Conns) {
    let (Ok(a2), Ok(b2)) = (a.try_clone(), b.try_clone()) else {
        return;
    };
    let ended = Arc::new(AtomicUsize::new(0));
    for (mut from, mut to) in [(a2, b2), (b, a)] {
        let (ended, list) = (ended.clone(), list.clone());
        let _ = std::thread::Builder::new()
            .name("lb-relay".into())
            .spawn(move || {
                let _ = std::io::copy(&mut from, &mut to);
                let _ = to.shutdown(std::net::Shutdown::Both);
                let _ = from.shutdown(std::net::Shutdown::Both);
                if ended.fetch_add(1, Ordering::AcqRel) == 1
                    && let Ok(mut l) = list.lock()
                {
                    l.retain(|(pair, _)| *pair != id);
                }
            });
    }
}

impl Drop for LoadBalancer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        let _ = TcpStream::connect(self.addr);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.cut();
    }
}
