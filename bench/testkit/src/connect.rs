//! An HTTP CONNECT frontend client in the shape of kube-apiserver's egress
//! dialer (`proxyProtocol: HTTPConnect`): one connection per dial, over a
//! Unix socket or TCP with mTLS, the request exactly as kube-apiserver
//! writes it (`CONNECT host:port HTTP/1.1`, `Host: 127.0.0.1`), then the
//! raw byte stream. Runs on a monoio runtime.
//!
//! The futures here are not cancel-safe: after a [`Error::Timeout`]
//! drop the tunnel.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crate::Error;

use bytes::{Bytes, BytesMut};
use konn_core::io::tls::{ClientTls, TlsStream};
use monoio::io::{AsyncReadRent, AsyncWriteRent, AsyncWriteRentExt};
use monoio::net::{TcpStream, UnixStream};

/// Size of one socket read.
const READ_SIZE: usize = 64 * 1024;

/// Largest response head accepted (kube-apiserver: 1 MiB).
const MAX_HEAD: usize = 1 << 20;

enum Stream {
    Unix(UnixStream),
    Tls(Box<TlsStream<TcpStream>>),
}

/// One CONNECT tunnel after its `200 Connection Established`.
pub struct ConnectTunnel {
    stream: Stream,
    /// Bytes that arrived with the response head.
    pending: Option<Bytes>,
    eof: bool,
    /// The response head, once read.
    head: String,
}

/// The client TLS settings kube-apiserver uses for a CONNECT proxy: those
/// of `tls` without ALPN (an HTTP/1.1 dial offers none).
pub fn http1_tls(tls: &ClientTls) -> ClientTls {
    let mut config = (*tls.current()).clone();
    config.alpn_protocols.clear();
    ClientTls::new(Arc::new(config), tls.server_name.clone(), tls.limits)
}

fn io_err(e: impl std::fmt::Display) -> Error {
    Error::Socket(e.to_string())
}

/// A CONNECT request sent, its answer not read yet: bytes written now
/// reach the proxy while it is still dialling.
pub struct Requested(ConnectTunnel);

impl Requested {
    /// Send more bytes behind the request.
    pub async fn write(&mut self, data: &[u8]) -> Result<(), Error> {
        self.0.write(data).await
    }

    /// Read the answer: the tunnel after a 200, or the refusal.
    pub async fn answer(self, timeout: Duration) -> Result<ConnectTunnel, Error> {
        self.0.answer(timeout).await
    }
}

impl ConnectTunnel {
    /// CONNECT to `target` (`host:port`) through the proxy's Unix socket.
    pub async fn unix(path: &Path, target: &str, timeout: Duration) -> Result<Self, Error> {
        Self::request_unix(path, target)
            .await?
            .answer(timeout)
            .await
    }

    /// CONNECT to `target` through the proxy's TCP port with TLS (`tls`
    /// as given; see [`http1_tls`]).
    pub async fn tls(
        addr: &str,
        tls: &ClientTls,
        target: &str,
        timeout: Duration,
    ) -> Result<Self, Error> {
        Self::request_tls(addr, tls, target)
            .await?
            .answer(timeout)
            .await
    }

    /// Send the CONNECT request over the Unix socket; answer later.
    pub async fn request_unix(path: &Path, target: &str) -> Result<Requested, Error> {
        let sock = UnixStream::connect(path).await.map_err(io_err)?;
        Self::request(Stream::Unix(sock), target).await
    }

    /// Send the CONNECT request over TCP with TLS; answer later.
    pub async fn request_tls(
        addr: &str,
        tls: &ClientTls,
        target: &str,
    ) -> Result<Requested, Error> {
        let sock = TcpStream::connect(addr).await.map_err(io_err)?;
        let _ = sock.set_nodelay(true);
        let stream = TlsStream::connect(sock, tls).await.map_err(io_err)?;
        Self::request(Stream::Tls(Box::new(stream)), target).await
    }

    async fn request(stream: Stream, target: &str) -> Result<Requested, Error> {
        let mut t = Self {
            stream,
            pending: None,
            eof: false,
            head: String::new(),
        };
        let req = format!("CONNECT {target} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
        t.write(req.as_bytes()).await?;
        Ok(Requested(t))
    }

    async fn answer(mut self, timeout: Duration) -> Result<Self, Error> {
        let deadline = monoio::time::Instant::now() + timeout;
        let mut head = Vec::new();
        let end = loop {
            if let Some(i) = head.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            if head.len() > MAX_HEAD {
                return Err(Error::Closed("response head too large".into()));
            }
            match monoio::time::timeout_at(deadline, self.read_raw()).await {
                Err(_) => return Err(Error::Timeout("the CONNECT response")),
                Ok(Err(e)) => return Err(e),
                Ok(Ok(None)) => {
                    return Err(Error::Closed(String::from_utf8_lossy(&head).into_owned()));
                }
                Ok(Ok(Some(b))) => head.extend_from_slice(&b),
            }
        };
        let status = head
            .get(9..12)
            .and_then(|s| std::str::from_utf8(s).ok())
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        if status == 200 {
            if end < head.len() {
                self.pending = Some(Bytes::copy_from_slice(&head[end..]));
            }
            self.head = String::from_utf8_lossy(&head[..end]).into_owned();
            return Ok(self);
        }
        // The rest of the answer, up to the close.
        loop {
            match monoio::time::timeout_at(deadline, self.read_raw()).await {
                Ok(Ok(Some(b))) if head.len() <= MAX_HEAD => head.extend_from_slice(&b),
                _ => break,
            }
        }
        Err(Error::Refused {
            status,
            response: String::from_utf8_lossy(&head).into_owned(),
        })
    }

    async fn read_raw(&mut self) -> Result<Option<Bytes>, Error> {
        if self.eof {
            return Ok(None);
        }
        let mut buf = BytesMut::with_capacity(READ_SIZE);
        let n = match &mut self.stream {
            Stream::Unix(s) => {
                let (r, b) = s.read(buf).await;
                buf = b;
                r.map_err(io_err)?
            }
            Stream::Tls(s) => s.read(&mut buf).await.map_err(io_err)?,
        };
        if n == 0 {
            self.eof = true;
            return Ok(None);
        }
        Ok(Some(buf.freeze()))
    }

    /// The proxy's response head (status line and headers, with the
    /// blank line).
    pub fn response_head(&self) -> &str {
        &self.head
    }

    /// Send `data` to the destination.
    pub async fn write(&mut self, data: &[u8]) -> Result<(), Error> {
        match &mut self.stream {
            Stream::Unix(s) => {
                let (r, _) = s.write_all(data.to_vec()).await;
                r.map(|_| ()).map_err(io_err)
            }
            Stream::Tls(s) => s.write_all(data).await.map_err(io_err),
        }
    }

    /// The next bytes from the destination; `Ok(None)` once the proxy
    /// closed the connection. Waits at most `timeout`.
    pub async fn read(&mut self, timeout: Duration) -> Result<Option<Bytes>, Error> {
        if let Some(b) = self.pending.take() {
            return Ok(Some(b));
        }
        monoio::time::timeout(timeout, self.read_raw())
            .await
            .map_err(|_| Error::Timeout("data"))?
    }

    /// Read exactly `n` bytes (or fewer if the connection closes first).
    pub async fn read_exact(&mut self, n: usize, timeout: Duration) -> Result<Vec<u8>, Error> {
        let mut out = Vec::with_capacity(n);
        while out.len() < n {
            match self.read(timeout).await? {
                Some(mut b) => {
                    let take = (n - out.len()).min(b.len());
                    out.extend_from_slice(&b[..take]);
                    if take < b.len() {
                        self.pending = Some(b.split_off(take));
                    }
                }
                None => break,
            }
        }
        Ok(out)
    }

    /// Close the connection (TLS: `close_notify` first).
    pub async fn close(mut self) {
        match &mut self.stream {
            Stream::Unix(s) => {
                let _ = s.shutdown().await;
            }
            Stream::Tls(s) => {
                let _ = s.close().await;
            }
        }
    }
}
