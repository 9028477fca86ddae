//! A blocking raw-frame HTTP/2 client for attack tests: it writes whatever
//! frames a test builds (with `konn_frames::h2` encoders and HPACK from
//! `konn_frames::hpack`, or by hand when the frame must be invalid) and
//! reads what the server answers on a background thread that splits the
//! byte stream into frames and decodes every header block (so the HPACK
//! context stays in sync however many frames the test skips).
//!
//! A "silent" client never reads its socket at all, for the tests in which
//! the server must cope with a peer that stops reading.
//!
//! It connects over TCP or a Unix socket (proxy-server's gRPC frontend);
//! the attack suites of konn-core (`core/tests/h2_defences.rs`) and of the
//! server's listeners (`server/tests/hardening.rs`) share it.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::thread::JoinHandle;
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use konn_frames::Reason;
use konn_frames::h2::{self as wire, FrameType, Head, SettingId, flags};
use konn_frames::hpack;

use crate::blocking::ReadRetry;

/// One frame the server sent.
#[derive(Clone, Debug)]
pub struct RawFrame {
    /// Its header.
    pub head: Head,
    /// Its payload as received.
    pub payload: Bytes,
    /// For a HEADERS frame ending a header block: the decoded fields.
    pub fields: Option<Vec<(String, String)>>,
}

/// A GOAWAY the server sent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GoAway {
    /// Last stream id the server processed.
    pub last_stream_id: u32,
    /// Error code.
    pub reason: Reason,
    /// Debug data, as text.
    pub debug: String,
}

impl RawFrame {
    /// The frame's type.
    pub fn ty(&self) -> FrameType {
        self.head.ty
    }

    /// The GOAWAY it carries, if it is one.
    pub fn goaway(&self) -> Option<GoAway> {
        if self.head.ty != FrameType::GOAWAY || self.payload.len() < 8 {
            return None;
        }
        let p = &self.payload;
        Some(GoAway {
            last_stream_id: u32::from_be_bytes([p[0], p[1], p[2], p[3]]) & 0x7fff_ffff,
            reason: Reason(u32::from_be_bytes([p[4], p[5], p[6], p[7]])),
            debug: String::from_utf8_lossy(&p[8..]).into_owned(),
        })
    }

    /// The RST_STREAM error code, if it is one.
    pub fn rst(&self) -> Option<Reason> {
        (self.head.ty == FrameType::RST_STREAM && self.payload.len() == 4).then(|| {
            let p = &self.payload;
            Reason(u32::from_be_bytes([p[0], p[1], p[2], p[3]]))
        })
    }

    /// A decoded header field by name.
    pub fn field(&self, name: &str) -> Option<&str> {
        self.fields
            .as_ref()?
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// The client's socket: TCP or Unix.
#[derive(Debug)]
pub enum RawSock {
    /// TCP.
    Tcp(TcpStream),
    /// A Unix stream socket.
    Unix(UnixStream),
}

impl RawSock {
    fn try_clone(&self) -> io::Result<Self> {
        match self {
            Self::Tcp(s) => s.try_clone().map(Self::Tcp),
            Self::Unix(s) => s.try_clone().map(Self::Unix),
        }
    }

    fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        match self {
            Self::Tcp(s) => s.shutdown(how),
            Self::Unix(s) => s.shutdown(how),
        }
    }

    fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Self::Tcp(s) => s.set_read_timeout(t),
            Self::Unix(s) => s.set_read_timeout(t),
        }
    }

    fn set_write_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Self::Tcp(s) => s.set_write_timeout(t),
            Self::Unix(s) => s.set_write_timeout(t),
        }
    }
}

impl Read for RawSock {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Self::Tcp(s) => s.read(buf),
            Self::Unix(s) => s.read(buf),
        }
    }
}

impl Write for RawSock {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Self::Tcp(s) => s.write(buf),
            Self::Unix(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// A raw-frame client connection.
pub struct RawClient {
    sock: RawSock,
    frames: Option<Receiver<RawFrame>>,
    reader: Option<JoinHandle<()>>,
    /// The HPACK encoder of this connection (tests that hand-craft blocks
    /// go through it so the server's table and ours stay in step).
    pub encoder: hpack::Encoder,
    /// Bytes written so far.
    pub written: u64,
}

impl RawClient {
    /// Connect and start reading frames in the background.
    ///
    /// # Panics
    /// If the connection fails.
    pub fn connect(addr: SocketAddr) -> Self {
        let sock = TcpStream::connect(addr).expect("connect");
        sock.set_nodelay(true).expect("nodelay");
        Self::reading(RawSock::Tcp(sock))
    }

    /// Connect to a Unix socket and start reading frames in the background.
    ///
    /// # Panics
    /// If the connection fails.
    pub fn connect_unix(path: &Path) -> Self {
        Self::try_connect_unix(path).expect("connect")
    }

    /// [`connect_unix`](Self::connect_unix), reporting failure instead.
    ///
    /// # Errors
    /// The connect failed.
    pub fn try_connect_unix(path: &Path) -> io::Result<Self> {
        Ok(Self::reading(RawSock::Unix(UnixStream::connect(path)?)))
    }

    /// Connect to a Unix socket and never read.
    ///
    /// # Panics
    /// If the connection fails.
    pub fn connect_unix_silent(path: &Path) -> Self {
        Self {
            sock: RawSock::Unix(UnixStream::connect(path).expect("connect")),
            frames: None,
            reader: None,
            encoder: hpack::Encoder::new(),
            written: 0,
        }
    }

    fn reading(sock: RawSock) -> Self {
        let rd = sock.try_clone().expect("clone socket");
        let (tx, rx) = mpsc::channel();
        let reader = std::thread::Builder::new()
            .name("h2-raw-reader".into())
            .spawn(move || read_frames(rd, &tx))
            .expect("reader thread");
        Self {
            sock,
            frames: Some(rx),
            reader: Some(reader),
            encoder: hpack::Encoder::new(),
            written: 0,
        }
    }

    /// Connect with receive and send buffers of about `bufs` bytes (fixed,
    /// so the kernel cannot grow them) and never read.
    ///
    /// # Panics
    /// If the connection fails.
    pub fn connect_silent(addr: SocketAddr, bufs: usize) -> Self {
        let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
            .expect("socket");
        // Before connect, so the window scale matches the small buffer.
        sock.set_recv_buffer_size(bufs).expect("SO_RCVBUF");
        sock.set_send_buffer_size(bufs).expect("SO_SNDBUF");
        sock.connect(&addr.into()).expect("connect");
        sock.set_nodelay(true).expect("nodelay");
        Self {
            sock: RawSock::Tcp(sock.into()),
            frames: None,
            reader: None,
            encoder: hpack::Encoder::new(),
            written: 0,
        }
    }

    /// Write `bytes` (blocking, unless a write timeout is set).
    pub fn write(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.sock.write_all(bytes)?;
        self.written += bytes.len() as u64;
        Ok(())
    }

    /// Write as much of `bytes` as goes before a write blocks for
    /// `stall`; returns the bytes written. `Ok` with fewer bytes than asked
    /// means the peer stopped taking data.
    pub fn write_until_stalled(&mut self, bytes: &[u8], stall: Duration) -> io::Result<usize> {
        self.sock.set_write_timeout(Some(stall))?;
        let mut done = 0;
        let r = loop {
            if done == bytes.len() {
                break Ok(done);
            }
            match self.sock.write(&bytes[done..]) {
                Ok(0) => break Ok(done),
                Ok(n) => done += n,
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    break Ok(done);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => break Err(e),
            }
        };
        self.written += done as u64;
        self.sock.set_write_timeout(None)?;
        r
    }

    /// Preface and a SETTINGS frame with `settings`; when reading, waits for
    /// the server's SETTINGS and acknowledges it.
    ///
    /// # Panics
    /// If the server does not send SETTINGS within 5 s.
    pub fn handshake(&mut self, settings: &[(SettingId, u32)]) {
        if let Err(e) = self.try_handshake(settings) {
            panic!("{e}");
        }
    }

    /// [`handshake`](Self::handshake), reporting failure instead.
    ///
    /// # Errors
    /// The write failed, or the server's first frame was not SETTINGS or did
    /// not come within 5 s.
    pub fn try_handshake(&mut self, settings: &[(SettingId, u32)]) -> Result<(), String> {
        let mut b = BytesMut::new();
        b.extend_from_slice(wire::PREFACE);
        wire::encode_settings(settings, &mut b);
        self.write(&b).map_err(|e| format!("write preface: {e}"))?;
        if self.frames.is_some() {
            let f = self
                .recv(Duration::from_secs(5))
                .map_err(|e| format!("server SETTINGS: {e:?}"))?;
            if f.ty() != FrameType::SETTINGS {
                return Err(format!("first server frame: {:?}", f.ty()));
            }
            let mut ack = BytesMut::new();
            wire::encode_settings_ack(&mut ack);
            self.write(&ack)
                .map_err(|e| format!("write SETTINGS ACK: {e}"))?;
        }
        Ok(())
    }

    /// HPACK-encode a request head (`:method`, `:scheme` http, `:authority`,
    /// `:path`) plus `extra` fields.
    pub fn request_block(&mut self, method: &str, path: &str, extra: &[(&str, &str)]) -> Vec<u8> {
        let mut fields = vec![
            (":method", method),
            (":scheme", "http"),
            (":authority", "127.0.0.1"),
            (":path", path),
        ];
        fields.extend_from_slice(extra);
        let mut out = Vec::new();
        self.encoder.encode(
            fields
                .iter()
                .map(|(n, v)| hpack::Field::new(n.as_bytes(), v.as_bytes())),
            &mut out,
        );
        out
    }

    /// The next frame from the server, waiting up to `timeout`; `None` on
    /// timeout or once the connection is closed.
    pub fn next_frame(&mut self, timeout: Duration) -> Option<RawFrame> {
        self.frames.as_ref()?.recv_timeout(timeout).ok()
    }

    /// The next frame from the server, waiting up to `timeout`:
    /// [`RecvTimeoutError::Disconnected`] once the connection is closed
    /// (and every frame before that was taken), `Timeout` if nothing came.
    ///
    /// # Errors
    /// As above; a silent client is always `Disconnected`.
    pub fn recv(&mut self, timeout: Duration) -> Result<RawFrame, RecvTimeoutError> {
        match &self.frames {
            Some(rx) => rx.recv_timeout(timeout),
            None => Err(RecvTimeoutError::Disconnected),
        }
    }

    /// A frame that already arrived, without waiting.
    pub fn try_frame(&mut self) -> Option<RawFrame> {
        self.frames.as_ref()?.try_recv().ok()
    }

    /// Frames until GOAWAY (returned with the frames before it), the
    /// connection closing (`None`), or `timeout`.
    ///
    /// # Panics
    /// On timeout.
    pub fn until_goaway(&mut self, timeout: Duration) -> (Option<GoAway>, Vec<RawFrame>) {
        let deadline = konn_core::io::clock::now() + timeout;
        let rx = self.frames.as_ref().expect("a reading client");
        let mut seen = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(konn_core::io::clock::now());
            match rx.recv_timeout(left) {
                Ok(f) => match f.goaway() {
                    Some(g) => return (Some(g), seen),
                    None => seen.push(f),
                },
                Err(RecvTimeoutError::Disconnected) => return (None, seen),
                Err(RecvTimeoutError::Timeout) => {
                    panic!(
                        "no GOAWAY and no close within {timeout:?}; {} frames seen",
                        seen.len()
                    )
                }
            }
        }
    }

    /// Wait for GOAWAY and return it.
    ///
    /// # Panics
    /// If the connection closes or `timeout` passes without one.
    pub fn expect_goaway(&mut self, timeout: Duration) -> GoAway {
        match self.until_goaway(timeout) {
            (Some(g), _) => g,
            (None, seen) => panic!(
                "connection closed without GOAWAY after {} frames",
                seen.len()
            ),
        }
    }

    /// Wait until the server closes the connection (EOF or reset); returns
    /// the frames that arrived meanwhile.
    ///
    /// # Panics
    /// If it is still open after `timeout`.
    pub fn expect_closed(&mut self, timeout: Duration) -> Vec<RawFrame> {
        if self.frames.is_none() {
            return self.expect_closed_silent(timeout);
        }
        let deadline = konn_core::io::clock::now() + timeout;
        let rx = self.frames.as_ref().expect("checked");
        let mut seen = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(konn_core::io::clock::now());
            match rx.recv_timeout(left) {
                Ok(f) => seen.push(f),
                Err(RecvTimeoutError::Disconnected) => return seen,
                Err(RecvTimeoutError::Timeout) => panic!("connection still open after {timeout:?}"),
            }
        }
    }

    /// For a silent client: read (and discard) until EOF or a reset.
    fn expect_closed_silent(&mut self, timeout: Duration) -> Vec<RawFrame> {
        let deadline = konn_core::io::clock::now() + timeout;
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let left = deadline.saturating_duration_since(konn_core::io::clock::now());
            assert!(!left.is_zero(), "connection still open after {timeout:?}");
            self.sock
                .set_read_timeout(Some(left))
                .expect("read timeout");
            match self.sock.read(&mut buf) {
                Ok(0) => return Vec::new(),
                Ok(_) => {}
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return Vec::new(),
            }
        }
    }
}

impl Drop for RawClient {
    fn drop(&mut self) {
        // Wakes the reader thread, which then drops its copy of the socket.
        let _ = self.sock.shutdown(Shutdown::Both);
        if let Some(t) = self.reader.take() {
            let _ = t.join();
        }
    }
}

/// The reader thread: frames in, header blocks decoded, until EOF or error.
fn read_frames(mut sock: RawSock, tx: &mpsc::Sender<RawFrame>) {
    let mut decoder = hpack::Decoder::new(hpack::DEFAULT_TABLE_SIZE);
    let mut buf = BytesMut::with_capacity(64 * 1024);
    let mut block: Option<(Head, BytesMut)> = None;
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        let n = match sock.read_retry(&mut chunk) {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        buf.extend_from_slice(&chunk[..n]);
        while let Some(head) = buf.first_chunk::<{ wire::HEAD_LEN }>().map(Head::parse) {
            if buf.len() < head.frame_len() {
                break;
            }
            buf.advance(wire::HEAD_LEN);
            let payload = buf.split_to(head.len as usize).freeze();
            let mut frame = RawFrame {
                head,
                payload,
                fields: None,
            };
            match head.ty {
                FrameType::HEADERS => {
                    let fragment = headers_fragment(head, &frame.payload);
                    if head.has(flags::END_HEADERS) {
                        frame.fields = Some(decode_block(&mut decoder, fragment));
                    } else {
                        block = Some((head, BytesMut::from(fragment)));
                    }
                }
                FrameType::CONTINUATION => {
                    if let Some((_, b)) = &mut block {
                        b.extend_from_slice(&frame.payload);
                    }
                    if head.has(flags::END_HEADERS)
                        && let Some((first, b)) = block.take()
                    {
                        // Reported as the HEADERS frame that started it.
                        frame = RawFrame {
                            head: first,
                            payload: b.clone().freeze(),
                            fields: Some(decode_block(&mut decoder, &b)),
                        };
                    }
                }
                _ => {}
            }
            if tx.send(frame).is_err() {
                return;
            }
        }
    }
}

/// The header block fragment of a HEADERS payload (padding and priority
/// fields removed).
fn headers_fragment(head: Head, p: &[u8]) -> &[u8] {
    let mut p = p;
    let mut pad = 0;
    if head.has(flags::PADDED) && !p.is_empty() {
        pad = p[0] as usize;
        p = &p[1..];
    }
    if head.has(flags::PRIORITY) && p.len() >= 5 {
        p = &p[5..];
    }
    &p[..p.len().saturating_sub(pad)]
}

fn decode_block(decoder: &mut hpack::Decoder, block: &[u8]) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let r = decoder.decode(block, &mut |f: hpack::HeaderField<'_>| {
        out.push((
            String::from_utf8_lossy(f.name).into_owned(),
            String::from_utf8_lossy(f.value).into_owned(),
        ));
    });
    if let Err(e) = r {
        out.push(("x-hpack-error".into(), e.to_string()));
    }
    out
}

// ----- frame builders ---------------------------------------------------------

/// Any frame from its parts (also invalid ones).
pub fn frame(ty: FrameType, flags: u8, stream_id: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = Head {
        len: u32::try_from(payload.len()).expect("payload fits 24 bits"),
        ty,
        flags,
        stream_id,
    }
    .to_bytes()
    .to_vec();
    out.extend_from_slice(payload);
    out
}

/// HEADERS with a complete block (END_HEADERS), optionally END_STREAM.
pub fn headers(stream_id: u32, block: &[u8], end_stream: bool) -> Vec<u8> {
    let mut out = Vec::new();
    wire::encode_headers(stream_id, block, end_stream, 16_384, &mut out);
    out
}

/// DATA.
pub fn data(stream_id: u32, payload: &[u8], end_stream: bool) -> Vec<u8> {
    let mut out = Vec::new();
    wire::encode_data(stream_id, payload, end_stream, &mut out);
    out
}

/// RST_STREAM.
pub fn rst(stream_id: u32, reason: Reason) -> Vec<u8> {
    let mut out = Vec::new();
    wire::encode_rst_stream(stream_id, reason, &mut out);
    out
}

/// WINDOW_UPDATE with any increment (0 is invalid, on purpose).
pub fn window_update(stream_id: u32, increment: u32) -> Vec<u8> {
    frame(
        FrameType::WINDOW_UPDATE,
        0,
        stream_id,
        &increment.to_be_bytes(),
    )
}

/// PING.
pub fn ping(payload: [u8; 8]) -> Vec<u8> {
    let mut out = Vec::new();
    wire::encode_ping(false, payload, &mut out);
    out
}

/// SETTINGS.
pub fn settings(params: &[(SettingId, u32)]) -> Vec<u8> {
    let mut out = Vec::new();
    wire::encode_settings(params, &mut out);
    out
}
