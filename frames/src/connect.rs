//! HTTP/1.1 CONNECT: the request-head parser and response writers for
//! proxy-server's HTTP-CONNECT frontend.
//!
//! kube-apiserver (egress selector, `proxyProtocol: HTTPConnect`) sends
//! exactly `CONNECT 10.0.0.5:10250 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n` and
//! may put the first tunnel bytes (a TLS ClientHello) in the same write;
//! curl sends a few more headers. Upstream (Go `net/http`) dials the
//! authority-form request target and ignores `Host`, and answers any other
//! method with 405 — so this parser accepts every method and leaves the
//! decision to the server.
//!
//! ## Design
//! - **Incremental, zero-copy, allocation-free.** [`parse_request`] is
//!   called on the bytes read so far and returns `Ok(None)` until the blank
//!   line has arrived. The [`Request`] borrows the input: method, target and
//!   header fields are slices of it; header fields are re-split on demand by
//!   [`Request::headers`] from the already validated block, so there is no
//!   fixed capacity and no caller-provided array.
//! - **Exact consumption.** The returned length ends right after the blank
//!   line; whatever follows is tunnel data and is not looked at.
//! - **Bounded.** [`Limits`] caps the head size and the field count; the
//!   size limit is enforced as soon as the buffer reaches it without a
//!   complete head, and a line that can never become valid (e.g. a TLS
//!   record sent to the plain-text port) is rejected before its end
//!   arrives.
//! - **Strict where it costs nothing, Go-compatible where it matters.**
//!   Lines end in CRLF; a bare LF is also accepted as a line end because Go's
//!   `net/textproto` accepts it (RFC 9112 §2.2 allows this) and a client
//!   that works with upstream must work with konn. A bare CR anywhere else,
//!   obs-fold (a line starting with SP/HTAB), whitespace before a field
//!   colon, control characters in values, leading empty lines and versions
//!   other than HTTP/1.0 and HTTP/1.1 are rejected.

use bytes::BufMut;

use crate::Error;

/// Limits for one request head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Maximum length of the head in bytes, request line and blank line
    /// included. Default 16 KiB: kube-apiserver's request is under 60 bytes
    /// and curl's under 200, so 16 KiB leaves room for large
    /// `Proxy-Authorization` tokens, while Go's 1 MiB
    /// (`DefaultMaxHeaderBytes`) would let every half-open connection pin a
    /// megabyte of buffer. The read buffer for the head never needs to be
    /// larger than this.
    pub max_head_len: u32,
    /// Maximum number of header fields. Default 64: ten times what curl
    /// sends, and small enough that re-scanning them is trivial.
    pub max_headers: u32,
}

impl Limits {
    /// The default limits: 16 KiB head, 64 header fields.
    pub const DEFAULT: Self = Self {
        max_head_len: 16 * 1024,
        max_headers: 64,
    };
}

impl Default for Limits {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// A parsed request head, borrowing the input buffer.
#[derive(Clone, Copy, Debug)]
pub struct Request<'a> {
    /// The method token (any method; case-sensitive, compare with
    /// `"CONNECT"`).
    pub method: &'a str,
    /// The request target as sent (for CONNECT, the authority form
    /// `host:port`; see [`parse_authority`]). Visible ASCII only.
    pub target: &'a str,
    /// The minor HTTP version: 0 for HTTP/1.0, 1 for HTTP/1.1.
    pub version_minor: u8,
    /// The validated header lines, terminators included, blank line excluded.
    header_block: &'a [u8],
    /// Number of header lines in `header_block`.
    header_count: usize,
}

/// One header field, borrowing the input buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header<'a> {
    /// The field name as sent (a token; compare case-insensitively).
    pub name: &'a str,
    /// The field value without surrounding spaces and tabs. Bytes, because
    /// HTTP allows obs-text (0x80–0xFF) in values.
    pub value: &'a [u8],
}

impl<'a> Request<'a> {
    /// The header fields in order of arrival.
    pub fn headers(&self) -> Headers<'a> {
        Headers {
            rest: self.header_block,
        }
    }

    /// The number of header fields.
    pub fn header_count(&self) -> usize {
        self.header_count
    }

    /// The value of the first field named `name` (ASCII case-insensitive).
    pub fn header(&self, name: &str) -> Option<&'a [u8]> {
        self.headers()
            .find(|h| h.name.eq_ignore_ascii_case(name))
            .map(|h| h.value)
    }
}

/// Iterator over the header fields of a [`Request`].
#[derive(Clone, Debug)]
pub struct Headers<'a> {
    rest: &'a [u8],
}

impl<'a> Iterator for Headers<'a> {
    type Item = Header<'a>;

    fn next(&mut self) -> Option<Header<'a>> {
        // The block was validated by `parse_request`; the `?`s only guard
        // against panics and never fire.
        let (line, next) = next_line(self.rest, 0)?;
        self.rest = self.rest.get(next..)?;
        split_field(line)
    }
}

/// Parses an HTTP/1.x request head at the start of `buf`.
///
/// Returns `Ok(None)` while the head is incomplete and within the limits,
/// and `Ok(Some((request, consumed)))` once the blank line has arrived:
/// `buf[consumed..]` is the first tunnel data, untouched.
///
/// # Errors
/// - [`ConnectHeadTooLarge`](Error::ConnectHeadTooLarge): `buf` holds
///   `max_head_len` bytes or more without a complete head.
/// - [`ConnectTooManyHeaders`](Error::ConnectTooManyHeaders): more than
///   `max_headers` fields.
/// - [`ConnectBadRequestLine`](Error::ConnectBadRequestLine): the first line
///   is not `token SP target SP HTTP/…` (also for an empty first line).
/// - [`ConnectBadVersion`](Error::ConnectBadVersion): a version other than
///   `HTTP/1.0` or `HTTP/1.1`.
/// - [`ConnectBadHeader`](Error::ConnectBadHeader): obs-fold, a line
///   without colon, an invalid name, or a control character in a value.
///
/// Errors in a line are reported as soon as that line is complete, or
/// earlier when its bytes so far can never form a valid line.
pub fn parse_request<'a>(
    buf: &'a [u8],
    limits: &Limits,
) -> Result<Option<(Request<'a>, usize)>, Error> {
    let max = usize::try_from(limits.max_head_len).unwrap_or(usize::MAX);
    // Only the first `max` bytes can belong to an acceptable head.
    let window = buf.get(..max).unwrap_or(buf);
    let incomplete = |partial: &[u8], check: fn(&[u8]) -> bool, err: Error| {
        if !check(partial) {
            Err(err)
        } else if buf.len() >= max {
            Err(Error::ConnectHeadTooLarge {
                max: limits.max_head_len,
            })
        } else {
            Ok(None)
        }
    };

    let Some((line, mut pos)) = next_line(window, 0) else {
        return incomplete(window, request_line_prefix_ok, Error::ConnectBadRequestLine);
    };
    let (method, target, version_minor) = parse_request_line(line)?;
    let block_start = pos;
    let mut header_count: usize = 0;
    loop {
        let rest = window.get(pos..).unwrap_or_default();
        let Some((line, next)) = next_line(window, pos) else {
            return incomplete(rest, field_line_prefix_ok, Error::ConnectBadHeader);
        };
        if line.is_empty() {
            let header_block = window.get(block_start..pos).unwrap_or_default();
            let request = Request {
                method,
                target,
                version_minor,
                header_block,
                header_count,
            };
            return Ok(Some((request, next)));
        }
        header_count += 1;
        if header_count > usize::try_from(limits.max_headers).unwrap_or(usize::MAX) {
            return Err(Error::ConnectTooManyHeaders {
                max: limits.max_headers,
            });
        }
        check_field_line(line)?;
        pos = next;
    }
}

/// The line starting at `pos`, without its LF or CRLF, and the position
/// after its terminator; `None` if no LF follows `pos`.
fn next_line(buf: &[u8], pos: usize) -> Option<(&[u8], usize)> {
    let rest = buf.get(pos..)?;
    let lf = rest.iter().position(|&b| b == b'\n')?;
    let line = rest.get(..lf)?;
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    Some((line, pos + lf + 1))
}

/// `tchar` of RFC 9110 §5.6.2.
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

fn is_token(s: &[u8]) -> bool {
    !s.is_empty() && s.iter().all(|&b| is_tchar(b))
}

/// A byte allowed in a request target: visible ASCII.
fn is_target_char(b: u8) -> bool {
    (0x21..=0x7e).contains(&b)
}

/// A byte allowed in a field value: HTAB, SP, VCHAR, obs-text.
fn is_value_char(b: u8) -> bool {
    b == b'\t' || (0x20..=0x7e).contains(&b) || b >= 0x80
}

/// Splits `METHOD SP target SP HTTP/1.x` (single spaces, as Go's parser).
fn parse_request_line(line: &[u8]) -> Result<(&str, &str, u8), Error> {
    let mut parts = line.splitn(3, |&b| b == b' ');
    let (Some(method), Some(target), Some(version)) = (parts.next(), parts.next(), parts.next())
    else {
        return Err(Error::ConnectBadRequestLine);
    };
    if !is_token(method)
        || target.is_empty()
        || !target.iter().all(|&b| is_target_char(b))
        || !version.iter().all(|&b| is_target_char(b))
    {
        return Err(Error::ConnectBadRequestLine);
    }
    let version_minor = match version {
        b"HTTP/1.1" => 1,
        b"HTTP/1.0" => 0,
        v if v.starts_with(b"HTTP/") => return Err(Error::ConnectBadVersion),
        _ => return Err(Error::ConnectBadRequestLine),
    };
    // Both are ASCII after the checks above.
    let method = core::str::from_utf8(method).map_err(|_| Error::ConnectBadRequestLine)?;
    let target = core::str::from_utf8(target).map_err(|_| Error::ConnectBadRequestLine)?;
    Ok((method, target, version_minor))
}

/// Validates a complete, non-empty header line.
fn check_field_line(line: &[u8]) -> Result<(), Error> {
    // A leading SP/HTAB is obs-fold (or whitespace before the first field
    // name); RFC 9112 §5.2 lets us reject it, and tunnels never need it.
    let name_end = line
        .iter()
        .position(|&b| b == b':')
        .ok_or(Error::ConnectBadHeader)?;
    let (name, value) = line.split_at(name_end);
    if !is_token(name) || !value.iter().skip(1).all(|&b| is_value_char(b)) {
        return Err(Error::ConnectBadHeader);
    }
    Ok(())
}

/// Splits a validated header line into name and trimmed value.
fn split_field(line: &[u8]) -> Option<Header<'_>> {
    let colon = line.iter().position(|&b| b == b':')?;
    let name = core::str::from_utf8(line.get(..colon)?).ok()?;
    let value = line.get(colon + 1..)?;
    let value = trim_ows(value);
    Some(Header { name, value })
}

/// Removes leading and trailing SP and HTAB.
fn trim_ows(mut v: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = v {
        v = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = v {
        v = rest;
    }
    v
}

/// Whether an incomplete first line can still become a valid request line.
fn request_line_prefix_ok(partial: &[u8]) -> bool {
    let partial = partial.strip_suffix(b"\r").unwrap_or(partial);
    // Every byte of a request line is visible ASCII or SP; a leading SP
    // (empty method) can never become valid.
    partial.first() != Some(&b' ') && partial.iter().all(|&b| b == b' ' || is_target_char(b))
}

/// Whether an incomplete header line can still become a valid one.
fn field_line_prefix_ok(partial: &[u8]) -> bool {
    let partial = partial.strip_suffix(b"\r").unwrap_or(partial);
    match partial.iter().position(|&b| b == b':') {
        None => partial.iter().all(|&b| is_tchar(b)),
        Some(colon) => {
            colon > 0
                && partial.iter().take(colon).all(|&b| is_tchar(b))
                && partial.iter().skip(colon + 1).all(|&b| is_value_char(b))
        }
    }
}

/// Parses an authority-form target, `host:port` or `[ipv6]:port`.
///
/// Returns the host (IPv6 literals without their brackets) and the port.
/// The host is a registered name or IPv4 address made of RFC 3986
/// `unreserved` and `sub-delims` characters (percent-encoding, user info and
/// non-ASCII are not accepted), or an IPv6 address without zone. The port is
/// 1 to 5 decimal digits with a value from 1 to 65535.
///
/// Note that upstream sends the target string itself, unchanged, as the
/// DIAL_REQ address; this function is for validation and logging.
///
/// # Errors
/// [`ConnectBadTarget`](Error::ConnectBadTarget).
pub fn parse_authority(target: &str) -> Result<(&str, u16), Error> {
    let (host, port) = if let Some(rest) = target.strip_prefix('[') {
        let (host, after) = rest.split_once(']').ok_or(Error::ConnectBadTarget)?;
        let port = after.strip_prefix(':').ok_or(Error::ConnectBadTarget)?;
        host.parse::<core::net::Ipv6Addr>()
            .map_err(|_| Error::ConnectBadTarget)?;
        (host, port)
    } else {
        let (host, port) = target.rsplit_once(':').ok_or(Error::ConnectBadTarget)?;
        if host.is_empty() || !host.bytes().all(is_reg_name_char) {
            return Err(Error::ConnectBadTarget);
        }
        (host, port)
    };
    Ok((host, parse_port(port)?))
}

/// RFC 3986 `unreserved` / `sub-delims`.
fn is_reg_name_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=".contains(&b)
}

fn parse_port(port: &str) -> Result<u16, Error> {
    if port.is_empty() || port.len() > 5 || !port.bytes().all(|b| b.is_ascii_digit()) {
        return Err(Error::ConnectBadTarget);
    }
    match port.parse::<u16>() {
        Ok(p) if p != 0 => Ok(p),
        _ => Err(Error::ConnectBadTarget),
    }
}

/// The response to a successful CONNECT, byte for byte what upstream sends.
/// Tunnel bytes follow it directly.
pub const ESTABLISHED: &[u8] = b"HTTP/1.1 200 Connection Established\r\n\r\n";

/// Writes an HTTP/1.1 response: status line, `headers`, a `Content-Length`
/// for `body` when `status` is 300 or more, the blank line and `body`.
///
/// No `Content-Length` is written for 1xx and 2xx: a 2xx answer to CONNECT
/// switches the connection to tunnel mode and must not carry one (RFC 9110
/// §9.3.6). Do not pass `Content-Length` in `headers`. `status` should be a
/// three-digit code. Control characters (CR, LF, …) in `reason` and in
/// header names and values are written as spaces, so text derived from a
/// peer (e.g. an agent's dial error in a header) can never split the
/// response.
pub fn write_response(
    status: u16,
    reason: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    dst: &mut impl BufMut,
) {
    dst.put_slice(b"HTTP/1.1 ");
    put_status(status, dst);
    dst.put_u8(b' ');
    put_sanitized(reason, dst);
    dst.put_slice(b"\r\n");
    for (name, value) in headers {
        put_sanitized(name, dst);
        dst.put_slice(b": ");
        put_sanitized(value, dst);
        dst.put_slice(b"\r\n");
    }
    if status >= 300 {
        dst.put_slice(b"Content-Length: ");
        put_decimal(body.len(), dst);
        dst.put_slice(b"\r\n");
    }
    dst.put_slice(b"\r\n");
    dst.put_slice(body);
}

/// Writes a status code as three digits (zero-padded if a caller passes a
/// code below 100, rather than producing a malformed line).
fn put_status(status: u16, dst: &mut impl BufMut) {
    if status < 100 {
        dst.put_u8(b'0');
    }
    if status < 10 {
        dst.put_u8(b'0');
    }
    put_decimal(usize::from(status), dst);
}

/// Writes `n` in decimal.
fn put_decimal(mut n: usize, dst: &mut impl BufMut) {
    let mut digits = [0u8; 20];
    let mut start = digits.len();
    loop {
        start -= 1;
        if let Some(d) = digits.get_mut(start) {
            // `n % 10` is below 10, so the cast cannot truncate.
            *d = b'0' + (n % 10) as u8;
        }
        n /= 10;
        if n == 0 || start == 0 {
            break;
        }
    }
    dst.put_slice(digits.get(start..).unwrap_or_default());
}

/// Writes `text` with every control character replaced by a space.
fn put_sanitized(text: &str, dst: &mut impl BufMut) {
    let mut rest = text.as_bytes();
    while !rest.is_empty() {
        let run = rest
            .iter()
            .position(|b| b.is_ascii_control() && *b != b'\t');
        let (plain, tail) = rest.split_at(run.unwrap_or(rest.len()));
        dst.put_slice(plain);
        let Some((_, tail)) = tail.split_first() else {
            break;
        };
        dst.put_u8(b' ');
        rest = tail;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const KUBE: &[u8] = b"CONNECT 10.0.0.5:10250 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
    const CURL: &[u8] = b"CONNECT example.com:443 HTTP/1.1\r\n\
        Host: example.com:443\r\n\
        User-Agent: curl/8.5.0\r\n\
        Proxy-Connection: Keep-Alive\r\n\r\n";

    fn parse(buf: &[u8]) -> Result<Option<(Request<'_>, usize)>, Error> {
        parse_request(buf, &Limits::DEFAULT)
    }

    fn headers<'a>(r: &Request<'a>) -> Vec<(&'a str, &'a [u8])> {
        r.headers().map(|h| (h.name, h.value)).collect()
    }

    #[test]
    fn kube_apiserver_request() {
        let (r, n) = parse(KUBE).unwrap().unwrap();
        assert_eq!(n, KUBE.len());
        assert_eq!(
            (r.method, r.target, r.version_minor),
            ("CONNECT", "10.0.0.5:10250", 1)
        );
        assert_eq!(headers(&r), [("Host", &b"127.0.0.1"[..])]);
        assert_eq!(r.header_count(), 1);
        assert_eq!(r.header("host"), Some(&b"127.0.0.1"[..]));
        assert_eq!(parse_authority(r.target), Ok(("10.0.0.5", 10250)));
    }

    #[test]
    fn curl_request() {
        let (r, n) = parse(CURL).unwrap().unwrap();
        assert_eq!(n, CURL.len());
        assert_eq!(
            (r.method, r.target, r.version_minor),
            ("CONNECT", "example.com:443", 1)
        );
        assert_eq!(
            headers(&r),
            [
                ("Host", &b"example.com:443"[..]),
                ("User-Agent", b"curl/8.5.0"),
                ("Proxy-Connection", b"Keep-Alive"),
            ]
        );
        assert_eq!(r.header("USER-AGENT"), Some(&b"curl/8.5.0"[..]));
        assert_eq!(r.header("Proxy-Authorization"), None);
    }

    #[test]
    fn every_strict_prefix_is_incomplete() {
        for req in [KUBE, CURL, b"GET / HTTP/1.0\n\n"] {
            for end in 0..req.len() {
                assert_eq!(
                    parse(&req[..end]).unwrap().map(|(_, n)| n),
                    None,
                    "prefix {end}"
                );
            }
        }
    }

    #[test]
    fn trailing_tunnel_bytes_are_not_consumed() {
        let mut buf = KUBE.to_vec();
        buf.extend_from_slice(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n");
        let (r, n) = parse(&buf).unwrap().unwrap();
        assert_eq!(n, KUBE.len());
        assert_eq!(&buf[n..n + 3], b"\x16\x03\x01");
        assert_eq!(r.header_count(), 1);
    }

    #[test]
    fn bare_lf_is_accepted_like_go() {
        let req = b"CONNECT [::1]:80 HTTP/1.0\nHost: x\r\nA:  b \t\n\nrest";
        let (r, n) = parse(req).unwrap().unwrap();
        assert_eq!(n, req.len() - 4);
        assert_eq!((r.target, r.version_minor), ("[::1]:80", 0));
        assert_eq!(headers(&r), [("Host", &b"x"[..]), ("A", b"b")]);
    }

    #[test]
    fn other_methods_are_parsed_for_the_server_to_refuse() {
        let (r, _) = parse(b"GET /healthz HTTP/1.1\r\nHost: a\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!((r.method, r.target), ("GET", "/healthz"));
        let (r, _) = parse(b"connect a:1 HTTP/1.1\r\n\r\n").unwrap().unwrap();
        assert_eq!(
            r.method, "connect",
            "methods are case-sensitive; the server decides"
        );
    }

    #[test]
    fn header_edge_cases() {
        let (r, _) = parse(b"CONNECT a:1 HTTP/1.1\r\nX-Empty:\r\nX-Sp:   \r\nX:\xe9t\xe9\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!(
            headers(&r),
            [("X-Empty", &b""[..]), ("X-Sp", b""), ("X", b"\xe9t\xe9")]
        );
        let (r, _) = parse(b"CONNECT a:1 HTTP/1.1\r\nX: a:b c\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!(r.header("x"), Some(&b"a:b c"[..]));
    }

    #[test]
    fn bad_request_lines() {
        let cases: [&[u8]; 12] = [
            b"\r\nCONNECT a:1 HTTP/1.1\r\n\r\n",
            b"CONNECT  a:1 HTTP/1.1\r\n\r\n",
            b"CONNECT a:1  HTTP/1.1\r\n\r\n",
            b"CONNECT a:1\r\n\r\n",
            b"CONNECT\r\n\r\n",
            b" CONNECT a:1 HTTP/1.1\r\n\r\n",
            b"CON(NECT a:1 HTTP/1.1\r\n\r\n",
            b"CONNECT a\x01:1 HTTP/1.1\r\n\r\n",
            b"CONNECT a:1 HTTP/1.1 x\r\n\r\n",
            b"CONNECT a:1 http/1.1\r\n\r\n",
            b"CONNECT a:1 HTTP/1.1\r\r\n\r\n",
            b"CONNECT a:\xc3\xa9 HTTP/1.1\r\n\r\n",
        ];
        for c in cases {
            let r = parse(c).map(|o| o.map(|(_, n)| n));
            assert_eq!(r, Err(Error::ConnectBadRequestLine), "{}", c.escape_ascii());
        }
    }

    #[test]
    fn bad_versions() {
        for v in [
            "HTTP/2.0", "HTTP/1.2", "HTTP/0.9", "HTTP/1", "HTTP/", "HTTP/11",
        ] {
            let req = format!("CONNECT a:1 {v}\r\n\r\n");
            let r = parse(req.as_bytes()).map(|o| o.map(|(_, n)| n));
            assert_eq!(r, Err(Error::ConnectBadVersion), "{v}");
        }
    }

    #[test]
    fn bad_headers() {
        let cases: [&[u8]; 9] = [
            b"Host 127.0.0.1",
            b" Host: x",
            b"\tHost: x",
            b"Host : x",
            b": x",
            b"Ho st: x",
            b"Host: a\rb",
            b"Host: a\x00b",
            b"Host: a\x7f",
        ];
        for c in cases {
            let mut req = b"CONNECT a:1 HTTP/1.1\r\n".to_vec();
            req.extend_from_slice(c);
            req.extend_from_slice(b"\r\n\r\n");
            let r = parse(&req).map(|o| o.map(|(_, n)| n));
            assert_eq!(r, Err(Error::ConnectBadHeader), "{}", c.escape_ascii());
        }
        // obs-fold: a continuation line after a valid field.
        let req = b"CONNECT a:1 HTTP/1.1\r\nX: a\r\n b\r\n\r\n";
        assert_eq!(
            parse(req).map(|o| o.is_some()),
            Err(Error::ConnectBadHeader)
        );
    }

    #[test]
    fn garbage_is_rejected_before_the_line_ends() {
        // A TLS ClientHello sent to the plain-text port.
        let r = parse(b"\x16\x03\x01\x02\x00").map(|o| o.is_some());
        assert_eq!(r, Err(Error::ConnectBadRequestLine));
        let r = parse(b"CONNECT a:1 HTTP/1.1\r\nHost: \x01").map(|o| o.is_some());
        assert_eq!(r, Err(Error::ConnectBadHeader));
        let r = parse(b"CONNECT a:1 HTTP/1.1\r\nHo st").map(|o| o.is_some());
        assert_eq!(r, Err(Error::ConnectBadHeader));
        let r = parse(b"CONNECT a:1 HTTP/1.1\r\n ").map(|o| o.is_some());
        assert_eq!(r, Err(Error::ConnectBadHeader));
    }

    #[test]
    fn head_length_limit() {
        let len = u32::try_from(KUBE.len()).unwrap();
        let exact = Limits {
            max_head_len: len,
            max_headers: 64,
        };
        assert_eq!(parse_request(KUBE, &exact).unwrap().unwrap().1, KUBE.len());
        // Tunnel bytes beyond the limit do not count against the head.
        let mut buf = KUBE.to_vec();
        buf.extend_from_slice(&[0; 100]);
        assert_eq!(parse_request(&buf, &exact).unwrap().unwrap().1, KUBE.len());

        let short = Limits {
            max_head_len: len - 1,
            max_headers: 64,
        };
        let err = Err(Error::ConnectHeadTooLarge { max: len - 1 });
        assert_eq!(parse_request(KUBE, &short).map(|o| o.is_some()), err);
        // Reported as soon as the buffer reaches the limit, not later.
        assert_eq!(
            parse_request(&KUBE[..KUBE.len() - 1], &short).map(|o| o.is_some()),
            err
        );
        assert_eq!(
            parse_request(&KUBE[..KUBE.len() - 2], &short).map(|o| o.is_some()),
            Ok(false)
        );

        // A never-ending header line hits the default limit.
        let mut endless = b"CONNECT a:1 HTTP/1.1\r\nX: ".to_vec();
        endless.resize(16 * 1024, b'a');
        assert_eq!(
            parse(&endless).map(|o| o.is_some()),
            Err(Error::ConnectHeadTooLarge { max: 16 * 1024 })
        );
        endless.pop();
        assert_eq!(parse(&endless).map(|o| o.is_some()), Ok(false));
    }

    #[test]
    fn header_count_limit() {
        let limits = Limits {
            max_head_len: 1024,
            max_headers: 2,
        };
        let two = b"CONNECT a:1 HTTP/1.1\r\nA: 1\r\nB: 2\r\n\r\n";
        assert_eq!(
            parse_request(two, &limits)
                .unwrap()
                .unwrap()
                .0
                .header_count(),
            2
        );
        let three = b"CONNECT a:1 HTTP/1.1\r\nA: 1\r\nB: 2\r\nC: 3\r\n";
        assert_eq!(
            parse_request(three, &limits).map(|o| o.is_some()),
            Err(Error::ConnectTooManyHeaders { max: 2 })
        );
        let none = Limits {
            max_head_len: 1024,
            max_headers: 0,
        };
        assert!(
            parse_request(b"CONNECT a:1 HTTP/1.1\r\n\r\n", &none)
                .unwrap()
                .is_some()
        );
        assert_eq!(
            parse_request(KUBE, &none).map(|o| o.is_some()),
            Err(Error::ConnectTooManyHeaders { max: 0 })
        );
    }

    #[test]
    fn authorities() {
        assert_eq!(parse_authority("10.0.0.5:10250"), Ok(("10.0.0.5", 10250)));
        assert_eq!(parse_authority("kubelet.local:1"), Ok(("kubelet.local", 1)));
        assert_eq!(parse_authority("[::1]:65535"), Ok(("::1", 65535)));
        assert_eq!(parse_authority("[fd00::5:10]:443"), Ok(("fd00::5:10", 443)));
        assert_eq!(
            parse_authority("[::ffff:10.0.0.1]:80"),
            Ok(("::ffff:10.0.0.1", 80))
        );
        assert_eq!(parse_authority("a:00080"), Ok(("a", 80)));
        let bad = [
            "",
            "host",
            "host:",
            ":80",
            "host:0",
            "host:65536",
            "host:123456",
            "host:+80",
            "host:8a",
            "::1:80",
            "[::1]",
            "[::1]80",
            "[::1]:",
            "[]:80",
            "[zz::1]:80",
            "[fe80::1%25eth0]:80",
            "user@host:80",
            "ho st:80",
            "[::1:80",
            "host:80/",
            "ho%73t:80",
            "[::1]:-1",
        ];
        for t in bad {
            assert_eq!(parse_authority(t), Err(Error::ConnectBadTarget), "{t:?}");
        }
    }

    #[test]
    fn established_is_exact() {
        assert_eq!(ESTABLISHED, b"HTTP/1.1 200 Connection Established\r\n\r\n");
    }

    #[test]
    fn responses() {
        let mut v = Vec::new();
        write_response(
            405,
            "Method Not Allowed",
            &[("Content-Type", "text/plain; charset=utf-8")],
            b"this proxy only supports CONNECT passthrough\n",
            &mut v,
        );
        assert_eq!(
            v,
            b"HTTP/1.1 405 Method Not Allowed\r\nContent-Type: text/plain; charset=utf-8\r\n\
              Content-Length: 45\r\n\r\nthis proxy only supports CONNECT passthrough\n"
        );
        let mut v = Vec::new();
        write_response(200, "Connection Established", &[], b"", &mut v);
        assert_eq!(v, ESTABLISHED);
        let mut v = Vec::new();
        write_response(
            502,
            "Bad\r\nGateway",
            &[("X-Err", "a\r\nSet-Cookie: b")],
            b"",
            &mut v,
        );
        assert_eq!(
            v,
            b"HTTP/1.1 502 Bad  Gateway\r\nX-Err: a  Set-Cookie: b\r\nContent-Length: 0\r\n\r\n"
        );
        let mut v = Vec::new();
        write_response(7, "x", &[], b"", &mut v);
        assert!(v.starts_with(b"HTTP/1.1 007 x\r\n"));
    }

    /// Serializes parts as a client would (CRLF or LF line ends).
    fn serialize(
        method: &str,
        target: &str,
        minor: u8,
        headers: &[(String, Vec<u8>)],
        lf_only: bool,
    ) -> Vec<u8> {
        let eol: &[u8] = if lf_only { b"\n" } else { b"\r\n" };
        let mut v = format!("{method} {target} HTTP/1.{minor}").into_bytes();
        v.extend_from_slice(eol);
        for (n, val) in headers {
            v.extend_from_slice(n.as_bytes());
            v.extend_from_slice(b": ");
            v.extend_from_slice(val);
            v.extend_from_slice(eol);
        }
        v.extend_from_slice(eol);
        v
    }

    fn value() -> impl Strategy<Value = Vec<u8>> {
        let byte = prop_oneof![Just(b'\t'), 0x20u8..=0x7e, 0x80u8..=0xff];
        prop::collection::vec(byte, 0..20).prop_map(|v| trim_ows(&v).to_vec())
    }

    proptest! {
        #[test]
        fn serialized_parts_parse_back(
            method in "[A-Za-z0-9!#$%&'*+.^_`|~-]{1,12}",
            target in "[!-~]{1,40}",
            minor in 0u8..=1,
            hdrs in prop::collection::vec(("[A-Za-z0-9!#$%&'*+.^_`|~-]{1,16}", value()), 0..10),
            lf_only in any::<bool>(),
            tail in prop::collection::vec(any::<u8>(), 0..8),
        ) {
            let head = serialize(&method, &target, minor, &hdrs, lf_only);
            let mut buf = head.clone();
            buf.extend_from_slice(&tail);
            let (r, n) = parse(&buf).unwrap().unwrap();
            prop_assert_eq!(n, head.len());
            prop_assert_eq!((r.method, r.target, r.version_minor), (&*method, &*target, minor));
            let got: Vec<(String, Vec<u8>)> =
                r.headers().map(|h| (h.name.to_owned(), h.value.to_vec())).collect();
            prop_assert_eq!(got, hdrs);
            for end in 0..head.len() {
                prop_assert_eq!(parse(&head[..end]).unwrap().map(|(_, n)| n), None);
            }
        }

        #[test]
        fn parser_never_panics(buf in prop::collection::vec(any::<u8>(), 0..200)) {
            if let Ok(Some((r, n))) = parse(&buf) {
                prop_assert!(n <= buf.len());
                prop_assert_eq!(r.headers().count(), r.header_count());
            }
        }

        #[test]
        fn authority_round_trip(host in "[a-z0-9.-]{1,30}", port in 1u16..) {
            let t = format!("{host}:{port}");
            prop_assert_eq!(parse_authority(&t), Ok((&*host, port)));
            let v6 = core::net::Ipv6Addr::from(u128::from(port) << 64 | 1);
            let t = format!("[{v6}]:{port}");
            let (h, p) = parse_authority(&t).unwrap();
            prop_assert_eq!((h.parse::<core::net::Ipv6Addr>().unwrap(), p), (v6, port));
        }
    }
}
