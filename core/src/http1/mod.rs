//! A small HTTP/1.1 server on monoio for the health, readiness, metrics and
//! debug endpoints.
//!
//! Upstream serves these with Go's `net/http` (`ReadHeaderTimeout: 60s`,
//! `MaxHeaderBytes: 1 << 20`). They carry a few requests a minute, so this
//! server favours being small, bounded and impossible to wedge over speed:
//!
//! - **Routing**: a [`Router`] maps paths to plain handlers
//!   (`Fn(&Request) -> Response`); answers are complete bodies with
//!   `Content-Length`. GET and HEAD only (see [`router`]). State of other
//!   workers reaches a handler through a [`board::Board`].
//! - **Head limits**: the head may be [`Config::max_header_bytes`] plus
//!   4096 bytes long, like Go's server (which lets `MaxHeaderBytes` plus a
//!   4096-byte read-buffer allowance through); beyond that the answer is Go's
//!   431. Malformed heads get Go's 400 (with Go's detail for a missing or
//!   repeated `Host`), an unknown `Transfer-Encoding` Go's 501; all three
//!   close the connection.
//! - **Timeouts**: the head must be complete within
//!   [`Config::read_header_timeout`] of its first byte (for the first
//!   request: of the accept), or the connection is closed without an answer,
//!   as Go does. Unlike Go (whose `IdleTimeout` is unset upstream, so idle
//!   keep-alive connections live forever), a kept-alive connection waits at
//!   most [`Config::idle_timeout`] for its next request, and every response
//!   write at most [`Config::write_timeout`].
//! - **Keep-alive** per HTTP/1.1 (HTTP/1.0 only with `Connection:
//!   keep-alive`); pipelined requests are answered in order.
//! - **Bodies** are never read by handlers. A `Content-Length` body up to
//!   [`Config::max_discard_body`] is skipped so the connection can be
//!   reused; a larger or chunked one closes the connection after the answer.
//! - **Bounded memory**: the read buffer grows only as head bytes arrive, up
//!   to the head limit, and shrinks back between requests;
//!   [`Config::max_connections`] caps the connections of one [`serve`] call
//!   (more are closed at once).
//! - **Never panics on input**: parsing returns errors for every malformed
//!   byte sequence (the head parser is konn-frames' fuzzed one), and the
//!   accept loop is [`accept_loop`], which survives `EMFILE` and friends.
//! - **Closing after an error answer** shuts down the write side and then
//!   reads (and drops) what the client still sends for up to half a second,
//!   so the client's kernel does not reset the connection before it has read
//!   the answer (Go's `closeWriteAndWait`).

pub mod board;
mod request;
pub mod response;
pub mod router;

use std::{cell::Cell, rc::Rc, time::Duration};

use monoio::{
    buf::IoBufMut,
    io::{AsyncReadRent, AsyncWriteRent, AsyncWriteRentExt},
    time::Instant,
};

use self::response::ConnectionField;
pub use self::{
    request::{Request, RequestError},
    response::Response,
    router::{Handler, PROFILING_UNAVAILABLE, Router, profiling_routes},
};
use crate::{
    Error,
    io::{
        listen::{AcceptStats, Acceptor, accept_loop},
        notify::Notify,
        runtime::{Either, StopToken, race},
    },
    metrics::{Registry, text},
};

/// Go's `http.DefaultMaxHeaderBytes` and upstream's `MaxHeaderBytes`.
pub const DEFAULT_MAX_HEADER_BYTES: usize = 1 << 20;

/// What Go's server accepts beyond `MaxHeaderBytes` (its read-buffer
/// allowance).
pub const HEADER_SLACK: usize = 4096;

/// Upstream's `ReadHeaderTimeout`.
pub const DEFAULT_READ_HEADER_TIMEOUT: Duration = Duration::from_secs(60);

/// Initial read buffer of a connection; heads of probes and scrapers fit.
const INITIAL_BUFFER: usize = 4096;

/// A buffer larger than this is given back between requests.
const KEEP_BUFFER: usize = 64 * 1024;

/// How long a closing connection keeps reading after an error answer.
const LINGER: Duration = Duration::from_millis(500);

/// Server limits and timeouts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Largest request head accepted, plus [`HEADER_SLACK`]. Default 1 MiB
    /// (upstream's `MaxHeaderBytes`). The read buffer of a connection never
    /// grows beyond this plus 4 KiB.
    pub max_header_bytes: usize,
    /// Time from the first byte of a request (from the accept, for the first
    /// request) until its head must be complete. Default 60 s (upstream's
    /// `ReadHeaderTimeout`); a slow client is disconnected without answer.
    pub read_header_timeout: Duration,
    /// How long a kept-alive connection may wait for its next request.
    /// Default 120 s (Go has no limit here).
    pub idle_timeout: Duration,
    /// Longest time one response may take to be written. Default 60 s.
    pub write_timeout: Duration,
    /// Most connections served at once by one [`serve`] call; more are
    /// closed on accept. Default 256.
    pub max_connections: usize,
    /// Largest `Content-Length` body that is read and dropped to keep the
    /// connection; a larger one closes it. Default 64 KiB.
    pub max_discard_body: usize,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            max_header_bytes: DEFAULT_MAX_HEADER_BYTES,
            read_header_timeout: DEFAULT_READ_HEADER_TIMEOUT,
            idle_timeout: Duration::from_secs(120),
            write_timeout: Duration::from_secs(60),
            max_connections: 256,
            max_discard_body: 64 * 1024,
        }
    }
}

impl Config {
    /// The head limit actually enforced.
    pub fn head_limit(&self) -> usize {
        self.max_header_bytes.saturating_add(HEADER_SLACK)
    }
}

/// The `/metrics` answer: a scrape of `registry` as upstream's
/// `promhttp.Handler()` gives it (text format, content type negotiated from
/// `Accept`, scrape counted in the `promhttp_*` families). Never
/// compressed: konn ignores `Accept-Encoding: gzip`, which HTTP allows.
pub fn metrics_response(registry: &Registry, request: &Request<'_>) -> Response {
    let content_type = text::negotiate_content_type(request.header("accept"));
    Response::new(200)
        .with_header("Content-Type", content_type)
        .with_body(registry.scrape())
}

/// What a [`serve`] call did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ServeStats {
    /// The accept loop's counts.
    pub accept: AcceptStats,
    /// Connections closed on accept because [`Config::max_connections`] were
    /// open.
    pub rejected: u64,
}

/// Accepts connections on `listener` and serves them with `router` until
/// `stop` fires, then waits for the open connections to end (they end at
/// the stop too, or after at most one write timeout).
///
/// # Errors
///
/// [`Error::Accept`] when the listener is unusable.
pub async fn serve<L>(
    listener: &L,
    stop: &StopToken,
    router: Rc<Router>,
    config: Rc<Config>,
) -> Result<ServeStats, Error>
where
    L: Acceptor,
    L::Stream: AsyncReadRent + AsyncWriteRent + 'static,
{
    let open = Rc::new(OpenConnections::default());
    let rejected = Rc::new(Cell::new(0u64));
    let result = accept_loop(listener, stop, |stream: L::Stream| {
        if open.count.get() >= config.max_connections {
            rejected.set(rejected.get() + 1);
            tracing::debug!("http: connection limit reached; closing a new connection");
            drop(stream);
            return;
        }
        open.count.set(open.count.get() + 1);
        let (open, router, config, stop) =
            (open.clone(), router.clone(), config.clone(), stop.clone());
        drop(monoio::spawn(async move {
            serve_connection(stream, &router, &config, &stop).await;
            open.count.set(open.count.get() - 1);
            if open.count.get() == 0 {
                open.none.notify();
            }
        }));
    })
    .await;
    while open.count.get() > 0 {
        open.none.notified().await;
    }
    result.map(|accept| ServeStats {
        accept,
        rejected: rejected.get(),
    })
}

#[derive(Default)]
struct OpenConnections {
    count: Cell<usize>,
    none: Notify,
}

/// How a connection ended (for tests and logs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// The client closed the connection between requests.
    ClientClosed,
    /// A response was sent with `Connection: close` (or HTTP/1.0).
    Closed,
    /// The head was refused with an error answer.
    Refused(u16),
    /// The head was not complete in time, or the connection idled too long.
    Timeout,
    /// The server is stopping.
    Stopped,
    /// A socket read or write failed.
    Io,
}

/// Serves the requests of one connection until it closes.
pub async fn serve_connection<S>(
    mut stream: S,
    router: &Router,
    config: &Config,
    stop: &StopToken,
) -> Ended
where
    S: AsyncReadRent + AsyncWriteRent,
{
    let limit = config.head_limit();
    let mut buf: Vec<u8> = Vec::with_capacity(INITIAL_BUFFER);
    let mut first = true;
    loop {
        // Wait for the first byte of the next request.
        if buf.is_empty() && !first {
            let idle = Instant::now() + config.idle_timeout;
            match read_more(&mut stream, &mut buf, limit, idle, stop).await {
                Read::Data => {}
                Read::Eof => return Ended::ClientClosed,
                Read::Timeout => return Ended::Timeout,
                Read::Stopped => return Ended::Stopped,
                Read::Error => return Ended::Io,
            }
        }
        first = false;
        let deadline = Instant::now() + config.read_header_timeout;
        // Read until the head is complete; parse only once the blank line is
        // there (re-parsing on every read would be quadratic for a client
        // that trickles bytes), except once at the start to turn away bytes
        // that cannot be HTTP without waiting for the timeout.
        let mut scanned = 0;
        let mut checked_start = false;
        let head_len = loop {
            if let Some(end) = head_end(&buf, scanned) {
                break end;
            }
            scanned = buf.len().saturating_sub(2);
            if !checked_start && !buf.is_empty() {
                checked_start = true;
                if let Err(err) = Request::parse(&buf, limit)
                    && err != RequestError::TooLarge
                {
                    return refuse(&mut stream, config, stop, err).await;
                }
            }
            if buf.len() >= limit {
                return refuse(&mut stream, config, stop, RequestError::TooLarge).await;
            }
            match read_more(&mut stream, &mut buf, limit, deadline, stop).await {
                Read::Data => {}
                Read::Eof => {
                    return if buf.is_empty() {
                        Ended::ClientClosed
                    } else {
                        Ended::Io
                    };
                }
                Read::Timeout => return Ended::Timeout,
                Read::Stopped => return Ended::Stopped,
                Read::Error => return Ended::Io,
            }
        };
        let head = buf.get(..head_len).unwrap_or_default();
        let exchange = match Request::parse(head, limit) {
            Ok(Some((request, _))) => answer(router, &request, config),
            Ok(None) => Err(RequestError::Malformed),
            Err(err) => Err(err),
        };
        let (bytes, body, close) = match exchange {
            Ok(exchange) => exchange,
            Err(err) => return refuse(&mut stream, config, stop, err).await,
        };
        if write(&mut stream, bytes, config).await.is_err() {
            return Ended::Io;
        }
        if close {
            linger(&mut stream, stop).await;
            return Ended::Closed;
        }
        // Drop the head and skip the body; keep any pipelined bytes.
        let mut skip = head_len;
        if let Body::Discard(n) = body {
            skip = skip.saturating_add(n);
        }
        while buf.len() < skip {
            let have = buf.len();
            buf.clear();
            skip -= have;
            let deadline = Instant::now() + config.read_header_timeout;
            match read_more(&mut stream, &mut buf, limit, deadline, stop).await {
                Read::Data => {}
                Read::Eof => return Ended::ClientClosed,
                Read::Timeout => return Ended::Timeout,
                Read::Stopped => return Ended::Stopped,
                Read::Error => return Ended::Io,
            }
        }
        buf.drain(..skip);
        if buf.capacity() > KEEP_BUFFER && buf.len() <= INITIAL_BUFFER {
            buf.shrink_to(INITIAL_BUFFER);
        }
    }
}

/// What follows the head on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Body {
    None,
    /// A `Content-Length` body of this many bytes.
    Discard(usize),
    /// A chunked body: not read; the connection closes after the answer.
    Unframed,
}

/// Runs the handler and encodes its response; also returns the body
/// framing and whether the connection closes afterwards.
fn answer(
    router: &Router,
    request: &Request<'_>,
    config: &Config,
) -> Result<(Vec<u8>, Body, bool), RequestError> {
    let body = body_framing(request)?;
    let response = router.handle(request);
    let connection = request.header("connection");
    let http10 = request.version_minor() == 0;
    let unskippable = match body {
        Body::None => false,
        Body::Discard(n) => n > config.max_discard_body,
        Body::Unframed => true,
    };
    let close = unskippable
        || if http10 {
            !header_has_token(connection, "keep-alive")
        } else {
            header_has_token(connection, "close")
        };
    let field = match (close, http10) {
        (true, false) => ConnectionField::Close,
        (false, true) => ConnectionField::KeepAlive,
        _ => ConnectionField::None,
    };
    let mut bytes = Vec::with_capacity(256 + response.body.len());
    response::encode(
        &mut bytes,
        &response,
        request.version_minor(),
        request.method() == "HEAD",
        field,
        &response::http_date_now(),
    );
    Ok((bytes, body, close))
}

/// The body framing of a request (RFC 9112 §6.3).
fn body_framing(request: &Request<'_>) -> Result<Body, RequestError> {
    if let Some(te) = request.header("transfer-encoding") {
        return if te.eq_ignore_ascii_case(b"chunked") {
            Ok(Body::Unframed)
        } else {
            Err(RequestError::UnsupportedTransferEncoding)
        };
    }
    let mut length: Option<usize> = None;
    for (name, value) in request.headers() {
        if !name.eq_ignore_ascii_case("content-length") {
            continue;
        }
        let parsed = std::str::from_utf8(value)
            .ok()
            .filter(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|v| v.parse::<usize>().ok())
            .ok_or(RequestError::BadContentLength)?;
        if length.is_some_and(|l| l != parsed) {
            return Err(RequestError::BadContentLength);
        }
        length = Some(parsed);
    }
    Ok(match length {
        None | Some(0) => Body::None,
        Some(n) => Body::Discard(n),
    })
}

/// Whether a comma-separated field value lists `token` (case-insensitive).
fn header_has_token(value: Option<&[u8]>, token: &str) -> bool {
    value.is_some_and(|v| {
        v.split(|&b| b == b',')
            .any(|t| t.trim_ascii().eq_ignore_ascii_case(token.as_bytes()))
    })
}

/// Where the head ends: just after the first empty line (CRLF CRLF or a
/// bare LF LF, which Go also accepts), searching from `from`.
fn head_end(buf: &[u8], from: usize) -> Option<usize> {
    let start = from.min(buf.len());
    let tail = buf.get(start..)?;
    tail.iter()
        .enumerate()
        .filter(|&(_, &b)| b == b'\n')
        .find_map(|(i, _)| {
            let at = start + i;
            let rest = buf.get(at + 1..)?;
            match rest {
                [b'\n', ..] => Some(at + 2),
                [b'\r', b'\n', ..] => Some(at + 3),
                _ => None,
            }
        })
}

/// Writes Go's error answer for a refused head and closes.
async fn refuse<S>(stream: &mut S, config: &Config, stop: &StopToken, err: RequestError) -> Ended
where
    S: AsyncReadRent + AsyncWriteRent,
{
    tracing::debug!(?err, "http: refusing request");
    let bytes = response::early_error(err.status(), err.detail());
    if write(stream, bytes, config).await.is_ok() {
        linger(stream, stop).await;
    }
    Ended::Refused(err.status())
}

enum Read {
    Data,
    Eof,
    Timeout,
    Stopped,
    Error,
}

/// Reads more bytes into `buf`, growing it as needed but never past
/// `limit` plus the initial size.
async fn read_more<S: AsyncReadRent>(
    stream: &mut S,
    buf: &mut Vec<u8>,
    limit: usize,
    deadline: Instant,
    stop: &StopToken,
) -> Read {
    let cap_limit = limit.saturating_add(INITIAL_BUFFER);
    if buf.capacity() - buf.len() < INITIAL_BUFFER / 4 {
        let want = (buf.capacity() * 2).clamp(INITIAL_BUFFER, cap_limit.max(INITIAL_BUFFER));
        buf.reserve_exact(want.saturating_sub(buf.len()));
    }
    let owned = std::mem::take(buf);
    let len = owned.len();
    let read = stream.read(owned.slice_mut(len..));
    let timed = monoio::time::timeout_at(deadline, read);
    match race(timed, stop.stopped()).await {
        Either::Left(Ok((result, slice))) => {
            *buf = slice.into_inner();
            match result {
                Ok(0) => Read::Eof,
                Ok(_) => Read::Data,
                Err(err) => {
                    tracing::debug!(error = %err, "http: read failed");
                    Read::Error
                }
            }
        }
        // The buffer went with the cancelled read; the connection ends.
        Either::Left(Err(_)) => Read::Timeout,
        Either::Right(()) => Read::Stopped,
    }
}

async fn write<S: AsyncWriteRent>(
    stream: &mut S,
    bytes: Vec<u8>,
    config: &Config,
) -> Result<(), ()> {
    match monoio::time::timeout(config.write_timeout, stream.write_all(bytes)).await {
        Ok((Ok(_), _)) => Ok(()),
        Ok((Err(err), _)) => {
            tracing::debug!(error = %err, "http: write failed");
            Err(())
        }
        Err(_) => {
            tracing::debug!("http: write timed out");
            Err(())
        }
    }
}

/// Half-closes and drains the connection briefly before it is dropped.
async fn linger<S>(stream: &mut S, stop: &StopToken)
where
    S: AsyncReadRent + AsyncWriteRent,
{
    let _ = stream.shutdown().await;
    let deadline = Instant::now() + LINGER;
    let mut scratch = Vec::with_capacity(INITIAL_BUFFER);
    // At most this much is drained; a client still sending more is cut off.
    let mut budget: usize = 1 << 20;
    while budget > 0 {
        scratch.clear();
        let read = monoio::time::timeout_at(deadline, stream.read(scratch));
        match race(read, stop.stopped()).await {
            Either::Left(Ok((Ok(n), back))) if n > 0 => {
                budget = budget.saturating_sub(n);
                scratch = back;
            }
            _ => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_end_of_a_head() {
        assert_eq!(
            head_end(b"GET / HTTP/1.1\r\nHost: a\r\n\r\nrest", 0),
            Some(27)
        );
        assert_eq!(head_end(b"GET / HTTP/1.0\n\nrest", 0), Some(16));
        assert_eq!(head_end(b"GET / HTTP/1.1\r\nHost: a\r\n", 0), None);
        assert_eq!(head_end(b"GET / HTTP/1.1\r\nHost: a\r\n\r", 0), None);
        // Resuming a search just before the end of the earlier bytes.
        let buf = b"GET / HTTP/1.1\r\nHost: a\r\n\r\n";
        assert_eq!(head_end(buf, buf.len() - 4), Some(buf.len()));
        assert_eq!(head_end(buf, 100), None);
    }

    #[test]
    fn connection_tokens() {
        assert!(header_has_token(Some(b"Keep-Alive, close"), "close"));
        assert!(header_has_token(Some(b" keep-alive "), "keep-alive"));
        assert!(!header_has_token(Some(b"closed"), "close"));
        assert!(!header_has_token(None, "close"));
    }

    fn framing(raw: &[u8]) -> Result<Body, RequestError> {
        body_framing(&Request::parse(raw, 4096).unwrap().unwrap().0)
    }

    #[test]
    fn body_framing_rules() {
        assert_eq!(
            framing(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n"),
            Ok(Body::None)
        );
        assert_eq!(
            framing(b"GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n"),
            Ok(Body::None)
        );
        assert_eq!(
            framing(b"GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\ncontent-length: 5\r\n\r\n"),
            Ok(Body::Discard(5))
        );
        assert_eq!(
            framing(b"GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n"),
            Err(RequestError::BadContentLength)
        );
        assert_eq!(
            framing(b"GET / HTTP/1.1\r\nHost: a\r\nContent-Length: -1\r\n\r\n"),
            Err(RequestError::BadContentLength)
        );
        assert_eq!(
            framing(
                b"GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 99999999999999999999999\r\n\r\n"
            ),
            Err(RequestError::BadContentLength)
        );
        assert_eq!(
            framing(b"GET / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"),
            Ok(Body::Unframed)
        );
        assert_eq!(
            framing(b"GET / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip\r\n\r\n"),
            Err(RequestError::UnsupportedTransferEncoding)
        );
    }
}
