//! One load-generator connection, whichever way it reaches the
//! destination: directly over TCP (the no-proxy baseline), through a
//! gRPC tunnel (one HTTP/2 connection per dial over the server's Unix
//! socket, as kube-apiserver's `CreateSingleUseGrpcTunnelWithContext`),
//! through HTTP CONNECT over the Unix socket, or the other way round
//! through a konn agent's KEP-2025 `--target` listeners (S11). Payloads are
//! counted, not kept.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::rc::Rc;
use std::time::Duration;

use bytes::Bytes;
use monoio::io::{AsyncReadRent, AsyncWriteRent, AsyncWriteRentExt};
use monoio::net::TcpStream;

use konn_testkit::Error;
use konn_testkit::connect::ConnectTunnel;
use konn_testkit::frontend::{GrpcFrontend, Tunnel};

/// How the load generator reaches destinations.
#[derive(Clone, Debug)]
pub enum Route {
    /// Straight to the destination (baseline).
    Direct,
    /// gRPC frontend on this Unix socket.
    Grpc(PathBuf),
    /// HTTP CONNECT frontend on this Unix socket.
    Connect(PathBuf),
    /// The reverse direction (KEP-2025): plain TCP to the agent's
    /// `--target` listener for each destination (destination → listener).
    Reverse(Rc<HashMap<SocketAddr, SocketAddr>>),
}

/// Socket read size of direct connections.
const READ: usize = 256 * 1024;

/// An open connection to a destination.
pub enum Conn {
    /// Direct TCP; the read buffer is kept between reads.
    Direct(TcpStream, Option<Vec<u8>>),
    /// A tunnel on its own frontend connection.
    Grpc(GrpcFrontend, Tunnel),
    /// An HTTP CONNECT tunnel.
    Connect(ConnectTunnel),
}

fn io(e: std::io::Error) -> Error {
    Error::Socket(e.to_string())
}

impl Conn {
    /// Open a connection to `dest` along `route`, waiting at most
    /// `timeout` for the dial.
    pub async fn open(route: &Route, dest: SocketAddr, timeout: Duration) -> Result<Self, Error> {
        match route {
            Route::Direct | Route::Reverse(_) => {
                let to = match route {
                    Route::Reverse(listeners) => *listeners
                        .get(&dest)
                        .ok_or_else(|| Error::Closed(format!("no --target listener for {dest}")))?,
                    _ => dest,
                };
                let s = monoio::time::timeout(timeout, TcpStream::connect(to))
                    .await
                    .map_err(|_| Error::Timeout("connect"))?
                    .map_err(io)?;
                let _ = s.set_nodelay(true);
                Ok(Self::Direct(s, Some(Vec::with_capacity(READ))))
            }
            Route::Grpc(sock) => {
                let fe = GrpcFrontend::connect_unix(sock).await?;
                match fe.dial(&dest.to_string(), timeout).await {
                    Ok(t) => Ok(Self::Grpc(fe, t)),
                    Err(e) => {
                        fe.abort().await;
                        Err(e)
                    }
                }
            }
            Route::Connect(sock) => Ok(Self::Connect(
                ConnectTunnel::unix(sock, &dest.to_string(), timeout).await?,
            )),
        }
    }

    /// Send `data`.
    pub async fn write(&mut self, data: Bytes) -> Result<(), Error> {
        match self {
            Self::Direct(s, _) => {
                let (r, _) = s.write_all(data).await;
                r.map(|_| ()).map_err(io)
            }
            Self::Grpc(_, t) => t.write(&data).await,
            Self::Connect(t) => t.write(&data).await,
        }
    }

    /// Receive whatever arrives next, waiting at most `timeout`; returns
    /// its length, 0 at the end of the stream.
    pub async fn read_some(&mut self, timeout: Duration) -> Result<usize, Error> {
        match self {
            Self::Direct(s, buf) => {
                let mut b = buf.take().unwrap_or_else(|| Vec::with_capacity(READ));
                b.clear();
                let (r, b) = monoio::time::timeout(timeout, s.read(b))
                    .await
                    .map_err(|_| Error::Timeout("data"))?;
                *buf = Some(b);
                r.map_err(io)
            }
            Self::Grpc(_, t) => Ok(t.read(timeout).await?.map_or(0, |b| b.len())),
            Self::Connect(t) => Ok(t.read(timeout).await?.map_or(0, |b| b.len())),
        }
    }

    /// Receive exactly `n` bytes (the answer of a ping-pong); an early end
    /// of stream is an error.
    pub async fn read_n(&mut self, n: usize, timeout: Duration) -> Result<(), Error> {
        let mut got = 0;
        while got < n {
            match self.read_some(timeout).await? {
                0 => return Err(Error::Closed(format!("end of stream after {got} of {n} B"))),
                k => got += k,
            }
        }
        Ok(())
    }

    /// Close the connection as its client would: tunnels send CLOSE_REQ
    /// and wait for CLOSE_RSP, then the frontend connection is closed.
    pub async fn close(self, timeout: Duration) {
        match self {
            Self::Direct(mut s, _) => {
                let _ = s.shutdown().await;
            }
            Self::Grpc(fe, t) => {
                let _ = t.close(timeout).await;
                fe.close().await;
            }
            Self::Connect(t) => t.close().await,
        }
    }

    /// Cut the connection at once (no CLOSE_REQ).
    pub async fn abort(self) {
        match self {
            Self::Direct(s, _) => drop(s),
            Self::Grpc(fe, t) => {
                drop(t);
                fe.abort().await;
            }
            Self::Connect(t) => drop(t),
        }
    }
}
