//! A small async adapter: [`TlsLayer`] over a monoio stream.
//!
//! The real drivers run TLS inside their own event loop; this adapter is for
//! the simple cases (tests, tools, one-shot connections) and proves the layer
//! on real sockets. It works with anything monoio can read and write with
//! owned buffers (`TcpStream`, `UnixStream`).
//!
//! [`handshake`] runs the handshake under a deadline (`monoio::time`, so the
//! runtime must be built with `enable_timer()`); the deadline covers the
//! whole exchange, so a peer that trickles bytes or goes silent — or sends
//! `close_notify` mid-handshake and keeps the socket open — is cut off.
//!
//! The futures here are not cancel-safe: if one is dropped half-way (for
//! instance by an outer timeout), drop the stream too.

use std::time::Duration;

use bytes::BytesMut;
use monoio::io::{AsyncReadRent, AsyncWriteRent, AsyncWriteRentExt};

use super::config::{ClientTls, ServerTls};
use super::layer::{Plaintext, TlsLayer};
use crate::error::Error;

/// Socket read size: one maximal TLS record (16 KiB payload + header and
/// AEAD overhead) fits.
const READ_SIZE: usize = 16 * 1024 + 512;

/// A TLS connection over a monoio stream, after the handshake.
#[derive(Debug)]
pub struct TlsStream<S> {
    io: S,
    tls: TlsLayer,
    /// Ciphertext read from the socket; `rbuf[rpos..]` is not yet fed
    /// (back-pressure from the layer).
    rbuf: Vec<u8>,
    rpos: usize,
    /// Ciphertext on its way to the socket.
    wbuf: BytesMut,
}

/// Runs the TLS handshake of `tls` over `io`, failing with
/// [`Error::TlsHandshakeTimeout`] if it has not completed within `timeout`.
///
/// On a failure the alert rustls produced is sent before returning, so the
/// peer learns why. Note that with TLS 1.3 a *client* finishes its handshake
/// before the server has checked the client certificate: a rejected client
/// certificate surfaces as an error on the client's first read.
pub async fn handshake<S>(io: S, tls: TlsLayer, timeout: Duration) -> Result<TlsStream<S>, Error>
where
    S: AsyncReadRent + AsyncWriteRent,
{
    let mut stream = TlsStream {
        io,
        tls,
        rbuf: Vec::with_capacity(READ_SIZE),
        rpos: 0,
        wbuf: BytesMut::with_capacity(READ_SIZE),
    };
    match monoio::time::timeout(timeout, stream.drive_handshake()).await {
        Ok(Ok(())) => Ok(stream),
        Ok(Err(e)) => Err(e),
        Err(_elapsed) => Err(Error::TlsHandshakeTimeout(timeout)),
    }
}

impl<S> TlsStream<S>
where
    S: AsyncReadRent + AsyncWriteRent,
{
    /// Accepts a TLS connection on `io` with `config` and its handshake timeout.
    pub async fn accept(io: S, config: &ServerTls) -> Result<Self, Error> {
        handshake(io, config.layer()?, config.limits.handshake_timeout).await
    }

    /// Opens a TLS connection over `io` with `config` and its handshake timeout.
    pub async fn connect(io: S, config: &ClientTls) -> Result<Self, Error> {
        handshake(io, config.layer()?, config.limits.handshake_timeout).await
    }

    /// Reads plaintext into `dst`; `Ok(0)` is a clean end of stream (the
    /// peer sent `close_notify`). EOF without it is [`Error::TlsTruncated`].
    pub async fn read(&mut self, dst: &mut BytesMut) -> Result<usize, Error> {
        loop {
            match self.tls.read_plaintext(dst)? {
                Plaintext::Data(n) => return Ok(n),
                Plaintext::Eof => return Ok(0),
                Plaintext::Empty => {}
            }
            // Post-handshake messages (key updates, tickets) may want out.
            self.flush_tls().await?;
            self.read_and_feed().await?;
        }
    }

    /// Encrypts and sends all of `data`.
    pub async fn write_all(&mut self, mut data: &[u8]) -> Result<(), Error> {
        while !data.is_empty() {
            let n = self.tls.write_plaintext(data)?;
            data = data.get(n..).unwrap_or_default();
            if n == 0 && !self.tls.wants_write() {
                // Nothing accepted and nothing to send: cannot progress.
                return Err(Error::Io(std::io::ErrorKind::WriteZero.into()));
            }
            self.flush_tls().await?;
        }
        Ok(())
    }

    /// Sends `close_notify` and shuts down the write side of the socket.
    pub async fn close(&mut self) -> Result<(), Error> {
        self.tls.send_close_notify();
        self.flush_tls().await?;
        self.io.shutdown().await.map_err(Error::Io)
    }

    /// The TLS state (peer certificates, ALPN, version...).
    pub fn tls(&self) -> &TlsLayer {
        &self.tls
    }

    /// The underlying stream.
    pub fn get_ref(&self) -> &S {
        &self.io
    }

    /// Splits into the stream and the TLS layer. Ciphertext read but not yet
    /// fed to the layer (only under back-pressure) is returned as well.
    pub fn into_parts(self) -> (S, TlsLayer, Vec<u8>) {
        let unread = self.rbuf.get(self.rpos..).unwrap_or_default().to_vec();
        (self.io, self.tls, unread)
    }

    async fn drive_handshake(&mut self) -> Result<(), Error> {
        loop {
            self.flush_tls().await?;
            if !self.tls.is_handshaking() {
                return Ok(());
            }
            if let Err(e) = self.read_and_feed().await {
                // Best effort: tell the peer why (the alert), then report.
                let _ = self.flush_tls().await;
                return Err(e);
            }
        }
    }

    /// Feeds leftover ciphertext, or reads once from the socket and feeds
    /// that. Socket EOF goes to [`TlsLayer::feed_eof`].
    async fn read_and_feed(&mut self) -> Result<(), Error> {
        if self.rpos >= self.rbuf.len() {
            let mut buf = std::mem::take(&mut self.rbuf);
            buf.clear();
            // A cancelled read may have left an empty Vec behind.
            buf.reserve(READ_SIZE);
            let (res, buf) = self.io.read(buf).await;
            self.rbuf = buf;
            self.rpos = 0;
            if res.map_err(Error::Io)? == 0 {
                return self.tls.feed_eof();
            }
        }
        let pending = self.rbuf.get(self.rpos..).unwrap_or_default();
        self.rpos += self.tls.feed_tls(pending)?;
        Ok(())
    }

    /// Sends everything the layer has queued.
    async fn flush_tls(&mut self) -> Result<(), Error> {
        while self.tls.wants_write() {
            self.tls.take_tls(&mut self.wbuf);
            let buf = std::mem::take(&mut self.wbuf);
            let (res, mut buf) = self.io.write_all(buf).await;
            buf.clear();
            self.wbuf = buf;
            res.map_err(Error::Io)?;
        }
        Ok(())
    }
}
