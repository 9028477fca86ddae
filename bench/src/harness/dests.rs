//! Destinations for the harness on the load generator's own monoio
//! runtime (one thread, pinned with the load generator): an echo, a bulk
//! source, a bulk sink and a sink that never reads. Tasks instead of a
//! thread per connection, so dial churn at thousands of connections per
//! second and tens of thousands of idle connections cost the destination
//! little. Nothing here hashes or checks payloads (the acceptance suites
//! do): the destination must not be the bottleneck.
//!
//! Protocols (all integers big-endian):
//! - echo: every byte back until the client closes;
//! - source: reads an 8-byte length `n`, writes `n` incompressible bytes,
//!   closes;
//! - sink: reads an 8-byte length `n`, reads and discards `n` bytes,
//!   answers with the 8-byte count, then reads until the client closes;
//! - stall: accepts and never reads; the connections are held until
//!   [`Dests::release_stalled`].

use std::cell::RefCell;
use std::future::Future;
use std::net::{Ipv4Addr, SocketAddr};
use std::rc::Rc;

use bytes::Bytes;
use monoio::io::{AsyncReadRent, AsyncReadRentExt, AsyncWriteRent, AsyncWriteRentExt};
use monoio::net::{TcpListener, TcpStream};

/// Number of echo listeners (127.0.0.1 … 127.0.0.N): dial churn spreads
/// its destination connections over them, so TIME_WAIT entries do not
/// run out of 4-tuples.
pub const ECHO_ADDRS: u8 = 8;

/// Size of the incompressible block the source repeats.
const BLOCK: usize = 1 << 20;

/// Socket read size of the sink and echo.
const READ: usize = 256 * 1024;

/// The running destinations (spawned on the current monoio runtime; they
/// live as long as it does).
pub struct Dests {
    /// Echo listeners, one per loopback address.
    pub echo: Vec<SocketAddr>,
    /// The bulk source.
    pub source: SocketAddr,
    /// The bulk sink.
    pub sink: SocketAddr,
    /// The sink that never reads.
    pub stall: SocketAddr,
    stalled: Rc<RefCell<Vec<TcpStream>>>,
    /// Incompressible bytes (also what bulk uploads send).
    pub block: Bytes,
}

fn listen(ip: Ipv4Addr) -> std::io::Result<TcpListener> {
    let l = TcpListener::bind(SocketAddr::from((ip, 0)))?;
    Ok(l)
}

/// `BLOCK` bytes from xorshift64*: incompressible, and cheap to make once.
pub fn random_block(seed: u64) -> Bytes {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut v = Vec::with_capacity(BLOCK);
    while v.len() < BLOCK {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        v.extend_from_slice(&x.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes());
    }
    v.truncate(BLOCK);
    Bytes::from(v)
}

fn accept_loop<F, Fut>(l: TcpListener, serve: F)
where
    F: Fn(TcpStream) -> Fut + 'static,
    Fut: Future<Output = ()> + 'static,
{
    monoio::spawn(async move {
        loop {
            match l.accept().await {
                Ok((s, _)) => {
                    let _ = s.set_nodelay(true);
                    monoio::spawn(serve(s));
                }
                // EMFILE and friends: back off instead of spinning.
                Err(_) => monoio::time::sleep(std::time::Duration::from_millis(5)).await,
            }
        }
    });
}

async fn echo(mut s: TcpStream) {
    let mut buf = Vec::with_capacity(READ);
    loop {
        let (r, b) = s.read(buf).await;
        match r {
            Ok(n) if n > 0 => {}
            _ => return,
        }
        let (r, mut b) = s.write_all(b).await;
        if r.is_err() {
            return;
        }
        b.clear();
        buf = b;
    }
}

async fn read_len(s: &mut TcpStream) -> Option<u64> {
    let (r, b) = s.read_exact(vec![0u8; 8]).await;
    r.ok()?;
    Some(u64::from_be_bytes(b.try_into().ok()?))
}

async fn source(mut s: TcpStream, block: Bytes) {
    let Some(mut left) = read_len(&mut s).await else {
        return;
    };
    while left > 0 {
        let n = usize::try_from(left).unwrap_or(usize::MAX).min(block.len());
        let (r, _) = s.write_all(block.slice(..n)).await;
        if r.is_err() {
            return;
        }
        left -= n as u64;
    }
    let _ = s.shutdown().await;
}

async fn sink(mut s: TcpStream) {
    let Some(mut left) = read_len(&mut s).await else {
        return;
    };
    let total = left;
    let mut buf = Vec::with_capacity(READ);
    while left > 0 {
        let (r, mut b) = s.read(buf).await;
        match r {
            Ok(n) if n > 0 => left = left.saturating_sub(n as u64),
            _ => return,
        }
        b.clear();
        buf = b;
    }
    let (r, _) = s.write_all(total.to_be_bytes().to_vec()).await;
    if r.is_err() {
        return;
    }
    loop {
        let (r, mut b) = s.read(buf).await;
        match r {
            Ok(n) if n > 0 => {}
            _ => return,
        }
        b.clear();
        buf = b;
    }
}

impl Dests {
    /// Start every destination on the current runtime.
    pub fn start() -> std::io::Result<Self> {
        let block = random_block(0x6b6f_6e6e);
        let mut echo_addrs = Vec::new();
        for i in 1..=ECHO_ADDRS {
            let l = listen(Ipv4Addr::new(127, 0, 0, i))?;
            echo_addrs.push(l.local_addr()?);
            accept_loop(l, echo);
        }
        let l = listen(Ipv4Addr::LOCALHOST)?;
        let source_addr = l.local_addr()?;
        let b = block.clone();
        accept_loop(l, move |s| source(s, b.clone()));
        let l = listen(Ipv4Addr::LOCALHOST)?;
        let sink_addr = l.local_addr()?;
        accept_loop(l, sink);
        let l = listen(Ipv4Addr::LOCALHOST)?;
        let stall_addr = l.local_addr()?;
        let stalled: Rc<RefCell<Vec<TcpStream>>> = Rc::default();
        let held = stalled.clone();
        accept_loop(l, move |s| {
            held.borrow_mut().push(s);
            async {}
        });
        Ok(Self {
            echo: echo_addrs,
            source: source_addr,
            sink: sink_addr,
            stall: stall_addr,
            stalled,
            block,
        })
    }

    /// The echo address for the `i`-th connection (spread over all).
    pub fn echo_for(&self, i: usize) -> SocketAddr {
        self.echo[i % self.echo.len()]
    }

    /// Close every connection the stall sink holds.
    pub fn release_stalled(&self) {
        self.stalled.borrow_mut().clear();
    }

    /// Connections the stall sink holds now.
    pub fn stalled(&self) -> usize {
        self.stalled.borrow().len()
    }
}

// `AsyncWriteRent::shutdown` is used through the Ext import above.
#[allow(unused_imports)]
use AsyncWriteRent as _;
