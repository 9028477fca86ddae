//! Destinations for demos and tests, on plain threads: a TCP echo server
//! and a tiny HTTP/1.1 server. Each stops accepting when dropped.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

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
        handle: impl Fn(TcpStream) + Send + Sync + Clone + 'static,
    ) -> std::io::Result<Self> {
        let l = TcpListener::bind("127.0.0.1:0")?;
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
                    let _ = std::thread::Builder::new()
                        .name("dest-conn".into())
                        .spawn(move || handle(s));
                }
            })?;
        Ok(Self { addr, stop, served })
    }

    /// Echoes every byte back until the client closes.
    pub fn echo() -> std::io::Result<Self> {
        Self::start("dest-echo", |mut s| {
            let Ok(mut r) = s.try_clone() else { return };
            let _ = std::io::copy(&mut r, &mut s);
            let _ = s.shutdown(std::net::Shutdown::Write);
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
                    match s.read(&mut chunk) {
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
