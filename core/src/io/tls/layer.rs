//! [`TlsLayer`]: a sans-IO TLS connection for the drivers.
//!
//! ```text
//!   socket ──ciphertext──► feed_tls ─► ┌──────────┐ ─► read_plaintext ──► HTTP/2
//!                          feed_eof    │ TlsLayer │
//!   socket ◄─ciphertext─── take_tls ◄─ └──────────┘ ◄─ write_plaintext ◄── HTTP/2
//! ```
//!
//! The driver owns the socket and the buffers; the layer only transforms
//! bytes. It never blocks, never reads the clock and never touches a socket.
//!
//! **Driver loop** (per readable/writable event):
//! 1. bytes read from the socket → [`TlsLayer::feed_tls`]; it returns how
//!    many it took. Fewer than given means back-pressure: the received
//!    plaintext is full, so drain [`TlsLayer::read_plaintext`] and feed the
//!    rest later (do not read more from the socket meanwhile).
//! 2. [`TlsLayer::read_plaintext`] until [`Plaintext::Empty`] (or
//!    [`Plaintext::Eof`]: the peer closed cleanly).
//! 3. [`TlsLayer::write_plaintext`] what the HTTP/2 layer wants to send; a
//!    short count means the outgoing buffer is at its limit: send first.
//! 4. [`TlsLayer::take_tls`] and write the result to the socket whenever
//!    [`TlsLayer::wants_write`] — also after an error, so the peer gets the
//!    alert that explains it.
//! 5. socket EOF → [`TlsLayer::feed_eof`].
//!
//! **Guarantees**
//! - `process_new_packets` runs after every chunk handed to rustls, so
//!   incoming data never piles up unprocessed (RUSTSEC-2020-0019), and a read
//!   is at most 4 KiB per step.
//! - Buffers are bounded: incoming plaintext by rustls (16 KiB, checked
//!   before each read), outgoing data by [`super::TlsLimits::buffer_limit`].
//! - End of stream: a `close_notify` is a clean EOF ([`Plaintext::Eof`]);
//!   transport EOF without it is [`Error::TlsTruncated`]; EOF during the
//!   handshake is [`Error::TlsHandshakeEof`]. rustls ignores `close_notify`
//!   during the handshake (it is unauthenticated there), so a peer that sends
//!   it mid-handshake just makes no progress and ends at EOF or at the
//!   driver's handshake timeout — never a loop (RUSTSEC-2024-0336).
//! - After an error every further `feed_tls` returns the same error; the
//!   layer never panics on peer input.

use std::io;
use std::sync::Arc;

use bytes::{BufMut, BytesMut};
use konn_protocol::h2::{MAX_VECTORED, Payloads};
use rustls::client::ClientConfig;
use rustls::server::ServerConfig;
use rustls::{ClientConnection, Connection, ServerConnection};
use rustls_pki_types::{CertificateDer, ServerName};

use crate::error::Error;

/// What [`TlsLayer::read_plaintext`] produced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plaintext {
    /// This many bytes (more than zero) were appended to the buffer.
    Data(usize),
    /// Nothing is buffered now: feed more ciphertext.
    Empty,
    /// The peer sent `close_notify` and all data before it was delivered:
    /// a clean end of stream.
    Eof,
}

/// One TLS connection, client or server side, without I/O.
pub struct TlsLayer {
    conn: Connection,
    /// The transport reported end-of-stream.
    eof: bool,
    /// We queued `close_notify`.
    closing: bool,
    /// The peer's `close_notify` arrived (rustls reads nothing after it).
    peer_closed: bool,
    /// The first fatal error, repeated to later calls.
    failed: Option<rustls::Error>,
    /// The writer's referenced payloads that rustls has not taken yet, or
    /// an empty list kept for its capacity ([`Self::take_payloads`]).
    payloads: Payloads,
}

impl std::fmt::Debug for TlsLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsLayer")
            .field("side", &if self.is_client() { "client" } else { "server" })
            .field("handshaking", &self.conn.is_handshaking())
            .field("eof", &self.eof)
            .field("closing", &self.closing)
            .field("failed", &self.failed)
            .finish()
    }
}

impl TlsLayer {
    /// A server-side layer; `buffer_limit` bounds the outgoing buffers
    /// (see [`super::TlsLimits::buffer_limit`]).
    pub fn server(config: Arc<ServerConfig>, buffer_limit: usize) -> Result<Self, Error> {
        let conn = ServerConnection::new(config).map_err(Error::Tls)?;
        Ok(Self::new(conn.into(), buffer_limit))
    }

    /// A client-side layer that will verify the server as `server_name`.
    pub fn client(
        config: Arc<ClientConfig>,
        server_name: ServerName<'static>,
        buffer_limit: usize,
    ) -> Result<Self, Error> {
        let conn = ClientConnection::new(config, server_name).map_err(Error::Tls)?;
        Ok(Self::new(conn.into(), buffer_limit))
    }

    fn new(mut conn: Connection, buffer_limit: usize) -> Self {
        conn.set_buffer_limit(Some(buffer_limit));
        Self {
            conn,
            eof: false,
            closing: false,
            peer_closed: false,
            failed: None,
            payloads: Payloads::new(),
        }
    }

    /// Hands ciphertext received from the peer to TLS and processes it.
    ///
    /// Returns how many bytes were taken. It is less than `ciphertext.len()`
    /// only when the received-plaintext buffer is full: drain it with
    /// [`Self::read_plaintext`], then feed the remainder. Bytes after the
    /// peer's `close_notify` are taken and discarded (TLS ignores them).
    ///
    /// Errors are fatal for the connection: send what [`Self::take_tls`]
    /// returns (the alert), then close the socket.
    pub fn feed_tls(&mut self, ciphertext: &[u8]) -> Result<usize, Error> {
        self.check_failed()?;
        let mut rest = ciphertext;
        while !rest.is_empty() && !self.peer_closed {
            match self.conn.read_tls(&mut rest) {
                // Only returned once close_notify was processed.
                Ok(0) => break,
                Ok(_) => self.process()?,
                // rustls signals back-pressure with `Other` when the
                // received plaintext is full: stop and let the driver drain.
                Err(e) if e.kind() == io::ErrorKind::Other && self.plaintext_pending() => break,
                // Otherwise rustls' message buffer is full (a handshake
                // message at its 64 KiB cap): retrying cannot help.
                Err(e) => return Err(Error::Io(e)),
            }
        }
        if self.peer_closed {
            // Whatever follows close_notify is ignored, so it counts as taken.
            return Ok(ciphertext.len());
        }
        Ok(ciphertext.len() - rest.len())
    }

    /// Tells TLS that the transport reached end-of-stream.
    ///
    /// During the handshake this is [`Error::TlsHandshakeEof`]. Afterwards it
    /// returns `Ok`, and [`Self::read_plaintext`] delivers what is buffered,
    /// then [`Plaintext::Eof`] if `close_notify` arrived, else
    /// [`Error::TlsTruncated`].
    pub fn feed_eof(&mut self) -> Result<(), Error> {
        self.eof = true;
        // An empty read is how rustls learns about EOF. rustls refuses it
        // while its received plaintext is full; `read_plaintext` covers that
        // case once the plaintext is drained, so the result can be ignored.
        let _ = self.conn.read_tls(&mut io::empty());
        if self.conn.is_handshaking() {
            return Err(self
                .failed
                .clone()
                .map_or(Error::TlsHandshakeEof, Error::Tls));
        }
        Ok(())
    }

    /// Appends all buffered plaintext to `dst` (bounded: rustls buffers at
    /// most about 16 KiB plus one read's worth of records).
    pub fn read_plaintext(&mut self, dst: &mut BytesMut) -> Result<Plaintext, Error> {
        self.read_plaintext_bounded(dst, usize::MAX)
    }

    /// [`Self::read_plaintext`], appending at most `max` bytes: the rest
    /// stays buffered in the layer for the next call (drivers pass the room
    /// left in a fixed-size buffer). `max == 0` appends nothing and returns
    /// `Data(0)`.
    pub fn read_plaintext_bounded(
        &mut self,
        dst: &mut BytesMut,
        max: usize,
    ) -> Result<Plaintext, Error> {
        use io::BufRead;
        if max == 0 {
            return Ok(Plaintext::Data(0));
        }
        let mut copied = 0;
        let mut reader = self.conn.reader();
        let outcome = loop {
            if copied == max {
                break Ok(Plaintext::Empty);
            }
            match reader.fill_buf() {
                Ok([]) => break Ok(Plaintext::Eof),
                Ok(chunk) => {
                    let n = chunk.len().min(max - copied);
                    dst.extend_from_slice(chunk.get(..n).unwrap_or_default());
                    reader.consume(n);
                    copied += n;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break Ok(Plaintext::Empty),
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                    break Err(Error::TlsTruncated);
                }
                Err(e) => break Err(Error::Io(e)),
            }
        };
        // Data first: what was authenticated before an error or EOF is
        // delivered, the error comes with the next call.
        if copied > 0 {
            return Ok(Plaintext::Data(copied));
        }
        if let Some(e) = &self.failed {
            return Err(Error::Tls(e.clone()));
        }
        if self.eof {
            if self.conn.is_handshaking() {
                return Err(Error::TlsHandshakeEof);
            }
            if outcome.as_ref().is_ok_and(|o| *o == Plaintext::Empty) {
                // rustls only records EOF when its plaintext buffer had
                // room at `feed_eof` time; the buffer is drained now, so an
                // EOF without close_notify is truncation either way.
                return Err(Error::TlsTruncated);
            }
        }
        outcome
    }

    /// Queues plaintext for the peer; returns how much was accepted, which
    /// is less than `src.len()` (possibly 0) when the outgoing buffer reached
    /// its limit. Before the handshake completes the data waits in rustls
    /// and is encrypted as soon as it can be.
    pub fn write_plaintext(&mut self, src: &[u8]) -> Result<usize, Error> {
        self.check_failed()?;
        if self.closing {
            return Err(Error::TlsWriteAfterClose);
        }
        io::Write::write(&mut self.conn.writer(), src).map_err(Error::Io)
    }

    /// [`Self::write_plaintext`] for a vectored transmit: `head` with each
    /// of `payloads` put in at its place (see [`Payloads`]), handed to
    /// rustls as slices, so it copies every payload once, into its record,
    /// and not first into `head`. Returns how much of the whole was
    /// accepted.
    pub fn write_plaintext_vectored(
        &mut self,
        head: &[u8],
        payloads: &Payloads,
    ) -> Result<usize, Error> {
        self.check_failed()?;
        if self.closing {
            return Err(Error::TlsWriteAfterClose);
        }
        if payloads.len() > MAX_VECTORED {
            return Err(Error::Usage("more payloads than a vectored transmit holds"));
        }
        let mut slices = [io::IoSlice::new(&[]); 2 * MAX_VECTORED + 1];
        let mut k = 0;
        let mut at = 0;
        for (to, payload) in payloads {
            let Some(gap) = head.get(at..*to) else {
                return Err(Error::Usage("payload positions out of order"));
            };
            for part in [gap, payload.as_ref()] {
                if !part.is_empty() {
                    slices[k] = io::IoSlice::new(part);
                    k += 1;
                }
            }
            at = *to;
        }
        if let Some(tail) = head.get(at..).filter(|t| !t.is_empty()) {
            slices[k] = io::IoSlice::new(tail);
            k += 1;
        }
        io::Write::write_vectored(&mut self.conn.writer(), &slices[..k]).map_err(Error::Io)
    }

    /// The payload list: what rustls has not taken yet of the last
    /// vectored transmit, or an empty list with the capacity the last one
    /// grew. Give it back with [`Self::put_payloads`].
    pub fn take_payloads(&mut self) -> Payloads {
        std::mem::take(&mut self.payloads)
    }

    /// Gives back the list [`Self::take_payloads`] handed out: with what
    /// rustls did not take yet (the next vectored write starts with it),
    /// or empty for its capacity.
    pub fn put_payloads(&mut self, payloads: Payloads) {
        self.payloads = payloads;
    }

    /// Appends all pending ciphertext (handshake messages, records, alerts)
    /// to `dst`; returns the number of bytes appended.
    pub fn take_tls(&mut self, dst: &mut BytesMut) -> usize {
        let mut total = 0;
        let mut out = dst.writer();
        while self.conn.wants_write() {
            match self.conn.write_tls(&mut out) {
                Ok(0) | Err(_) => break,
                Ok(n) => total += n,
            }
        }
        total
    }

    /// Queues a `close_notify` alert (take it with [`Self::take_tls`], then
    /// shut the socket's write side). Later writes fail with
    /// [`Error::TlsWriteAfterClose`]. Calling it twice sends one alert.
    pub fn send_close_notify(&mut self) {
        if !self.closing {
            self.closing = true;
            self.conn.send_close_notify();
        }
    }

    /// Queues a TLS 1.3 `KeyUpdate` that refreshes the keys of both
    /// directions (the peer answers with its own). Fails before the
    /// handshake completes or on TLS 1.2.
    pub fn refresh_traffic_keys(&mut self) -> Result<(), Error> {
        self.check_failed()?;
        self.conn.refresh_traffic_keys().map_err(Error::Tls)
    }

    /// Gives back rustls' receive buffer of an idle connection. rustls
    /// keeps the buffer it last read ciphertext into (up to a record plus
    /// one read, about 20 KiB) until the next read, and only then shrinks it
    /// to 4 KiB when nothing is pending; this runs that shrink now, with a
    /// read that finds nothing (`WouldBlock`, which rustls passes on without
    /// taking it for EOF). Drivers call it when a connection has been idle
    /// for a while, never per packet (the next read would grow the buffer
    /// again).
    pub fn release_idle(&mut self) {
        struct Nothing;
        impl io::Read for Nothing {
            fn read(&mut self, _: &mut [u8]) -> io::Result<usize> {
                Err(io::ErrorKind::WouldBlock.into())
            }
        }
        if self.failed.is_none() && !self.eof && !self.conn.is_handshaking() {
            let _ = self.conn.read_tls(&mut Nothing);
        }
        if self.payloads.is_empty() {
            self.payloads = Payloads::new();
        }
    }

    /// True until the handshake has completed.
    pub fn is_handshaking(&self) -> bool {
        self.conn.is_handshaking()
    }

    /// True when [`Self::take_tls`] has something to send.
    pub fn wants_write(&self) -> bool {
        self.conn.wants_write()
    }

    /// True when the layer can take more ciphertext now (it has no
    /// undelivered plaintext, and the peer has not closed). A driver may
    /// stop reading the socket while this is false.
    pub fn wants_read(&self) -> bool {
        self.failed.is_none() && !self.eof && self.conn.wants_read()
    }

    /// True once the peer's `close_notify` has been received.
    pub fn peer_closed(&self) -> bool {
        self.peer_closed
    }

    /// The peer's certificate chain (leaf first), once the handshake has got
    /// that far. For a server without client auth this is `None`.
    pub fn peer_certificates(&self) -> Option<&[CertificateDer<'static>]> {
        self.conn.peer_certificates()
    }

    /// The negotiated ALPN protocol, if any.
    pub fn alpn_protocol(&self) -> Option<&[u8]> {
        self.conn.alpn_protocol()
    }

    /// The negotiated TLS version, once known.
    pub fn protocol_version(&self) -> Option<rustls::ProtocolVersion> {
        self.conn.protocol_version()
    }

    /// The negotiated cipher suite, once known.
    pub fn cipher_suite(&self) -> Option<rustls::CipherSuite> {
        self.conn.negotiated_cipher_suite().map(|s| s.suite())
    }

    /// Whether the handshake resumed an earlier session (`None` while it
    /// runs). konn neither issues nor uses tickets (docs/design/tls.md,
    /// "Session resumption"), so against konn this is always `false`.
    pub fn resumed(&self) -> Option<bool> {
        self.conn
            .handshake_kind()
            .map(|k| k == rustls::HandshakeKind::Resumed)
    }

    /// Server side: the SNI name the client sent, if any.
    pub fn sni(&self) -> Option<&str> {
        match &self.conn {
            Connection::Server(s) => s.server_name(),
            Connection::Client(_) => None,
        }
    }

    /// True for a client-side layer.
    pub fn is_client(&self) -> bool {
        matches!(self.conn, Connection::Client(_))
    }

    fn check_failed(&self) -> Result<(), Error> {
        match &self.failed {
            Some(e) => Err(Error::Tls(e.clone())),
            None => Ok(()),
        }
    }

    /// True when received plaintext waits to be read (distinguishes
    /// rustls' back-pressure signal from a real failure).
    fn plaintext_pending(&mut self) -> bool {
        self.conn
            .process_new_packets()
            .is_ok_and(|state| state.plaintext_bytes_to_read() > 0)
    }

    fn process(&mut self) -> Result<(), Error> {
        match self.conn.process_new_packets() {
            Ok(state) => {
                self.peer_closed = state.peer_has_closed();
                Ok(())
            }
            Err(e) => {
                self.failed = Some(e.clone());
                Err(Error::Tls(e))
            }
        }
    }
}
