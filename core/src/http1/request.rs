//! A parsed HTTP/1.x request head as handlers see it.
//!
//! The head itself is parsed by `konn_frames::connect::parse_request` (the
//! parser the HTTP-CONNECT frontend uses; it accepts every method). This
//! module adds what a small origin server needs on top: the request target
//! split into path and query the way Go's `net/url` does for `r.URL`, the
//! percent-decoded path the router matches (Go's `ServeMux` matches
//! `r.URL.Path`, so `/met%72ics` reaches `/metrics`), `r.Host`, and the
//! query-key test the agent's `?verbose` needs.

use std::borrow::Cow;

use konn_frames::connect::{self, Limits};
use konn_frames::url;

/// Why a request head was refused; each maps to the answer Go's server
/// gives (see [`RequestError::status`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestError {
    /// The head exceeds the header limit: 431.
    TooLarge,
    /// Malformed request line, header line or request target: 400.
    Malformed,
    /// An HTTP/1.1 request without `Host`: 400 with Go's message.
    MissingHost,
    /// More than one `Host` field: 400 with Go's message.
    TooManyHosts,
    /// Unparsable or conflicting `Content-Length`: 400.
    BadContentLength,
    /// A `Transfer-Encoding` other than `chunked`: 501.
    UnsupportedTransferEncoding,
}

impl RequestError {
    /// The status code of the answer.
    pub const fn status(self) -> u16 {
        match self {
            Self::TooLarge => 431,
            Self::UnsupportedTransferEncoding => 501,
            _ => 400,
        }
    }

    /// The detail Go appends to `400 Bad Request`, if any.
    pub const fn detail(self) -> Option<&'static str> {
        match self {
            Self::MissingHost => Some("missing required Host header"),
            Self::TooManyHosts => Some("too many Host headers"),
            _ => None,
        }
    }
}

/// A request head: the parsed bytes plus the split request target.
#[derive(Debug, Clone)]
pub struct Request<'a> {
    head: connect::Request<'a>,
    path: Cow<'a, str>,
    raw_path: &'a str,
    query: Option<&'a str>,
    scheme: Option<&'a str>,
    userinfo: Option<&'a str>,
    host: &'a str,
}

impl<'a> Request<'a> {
    /// Parses a complete head at the start of `buf` with a head limit of
    /// `max_head_len` bytes. `Ok(None)` means more bytes are needed;
    /// otherwise the request and the length of its head.
    ///
    /// # Errors
    ///
    /// [`RequestError`] for a head the server must refuse.
    pub fn parse(
        buf: &'a [u8],
        max_head_len: usize,
    ) -> Result<Option<(Self, usize)>, RequestError> {
        let limits = Limits {
            max_head_len: u32::try_from(max_head_len).unwrap_or(u32::MAX),
            // Go counts bytes, not fields; the byte limit bounds the count.
            max_headers: u32::MAX,
        };
        let (head, consumed) = match connect::parse_request(buf, &limits) {
            Ok(Some(parsed)) => parsed,
            Ok(None) => return Ok(None),
            Err(konn_frames::Error::ConnectHeadTooLarge { .. }) => {
                return Err(RequestError::TooLarge);
            }
            Err(_) => return Err(RequestError::Malformed),
        };
        Self::from_head(head).map(|request| Some((request, consumed)))
    }

    fn from_head(head: connect::Request<'a>) -> Result<Self, RequestError> {
        let target = head.target;
        let (scheme, authority, rest) = split_absolute(target)?;
        let (raw_path, query) = match rest.split_once('?') {
            Some((path, query)) => (path, Some(query)),
            None => (rest, None),
        };
        let path = if target == "*" {
            Cow::Borrowed("*")
        } else if raw_path.is_empty() {
            Cow::Borrowed("/")
        } else {
            match url::path_unescape(raw_path).map_err(|_| RequestError::Malformed)? {
                Cow::Borrowed(_) => Cow::Borrowed(raw_path),
                // Invalid UTF-8 is replaced; it can never match a route.
                Cow::Owned(bytes) => Cow::Owned(String::from_utf8_lossy(&bytes).into_owned()),
            }
        };
        let mut hosts = head
            .headers()
            .filter(|h| h.name.eq_ignore_ascii_case("host"))
            .map(|h| h.value);
        let host_header = hosts.next();
        if hosts.next().is_some() {
            return Err(RequestError::TooManyHosts);
        }
        if host_header.is_none() && head.version_minor >= 1 {
            return Err(RequestError::MissingHost);
        }
        // Go keeps user information apart from the host.
        let (userinfo, authority) = match authority.map(|a| a.rsplit_once('@')) {
            Some(Some((user, host))) => (Some(user), Some(host)),
            _ => (None, authority),
        };
        // Go sets r.Host from an absolute-form target, else from `Host`.
        let host = match authority {
            Some(a) if !a.is_empty() => a,
            _ => host_header
                .and_then(|h| std::str::from_utf8(h).ok())
                .unwrap_or(""),
        };
        Ok(Self {
            head,
            path,
            raw_path,
            query,
            scheme,
            userinfo,
            host,
        })
    }

    /// The method token.
    pub fn method(&self) -> &'a str {
        self.head.method
    }

    /// The request target as sent.
    pub fn target(&self) -> &'a str {
        self.head.target
    }

    /// The percent-decoded path (what routes match); `*` for `OPTIONS *`,
    /// `/` for an absolute-form target without path.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The path as sent, still percent-encoded (Go's `EscapedPath`).
    pub fn raw_path(&self) -> &'a str {
        self.raw_path
    }

    /// The raw query after `?` (`Some("")` for a target ending in `?`), or
    /// `None` when the target has no `?`.
    pub fn query(&self) -> Option<&'a str> {
        self.query
    }

    /// The scheme of an absolute-form target (`http` in
    /// `GET http://host/path`).
    pub fn scheme(&self) -> Option<&'a str> {
        self.scheme
    }

    /// The user information of an absolute-form target
    /// (`user:pass` in `GET http://user:pass@host/`).
    pub fn userinfo(&self) -> Option<&'a str> {
        self.userinfo
    }

    /// The host the request is for, as Go's `r.Host`: the authority of an
    /// absolute-form target, else the `Host` field, else empty.
    pub fn host(&self) -> &'a str {
        self.host
    }

    /// 0 for HTTP/1.0, 1 for HTTP/1.1.
    pub fn version_minor(&self) -> u8 {
        self.head.version_minor
    }

    /// The value of the first field named `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&'a [u8]> {
        self.head.header(name)
    }

    /// Every header field in order of arrival.
    pub fn headers(&self) -> impl Iterator<Item = (&'a str, &'a [u8])> + 'a {
        self.head.headers().map(|h| (h.name, h.value))
    }

    /// Whether the query has a parameter named `key`, as
    /// `r.URL.Query()` finds it in Go (`konn_frames::url::query_has`):
    /// `?verbose`, `?verbose=0` and `?a&verbose=` all have `verbose`.
    pub fn query_has(&self, key: &str) -> bool {
        self.query.is_some_and(|query| url::query_has(query, key))
    }
}

/// Splits an absolute-form target (`scheme://authority/path?query`) into
/// its parts; an origin-form (`/path?query`) or asterisk target has neither
/// scheme nor authority.
fn split_absolute(target: &str) -> Result<(Option<&str>, Option<&str>, &str), RequestError> {
    if target.starts_with('/') || target == "*" {
        return Ok((None, None, target));
    }
    let (scheme, rest) = target.split_once("://").ok_or(RequestError::Malformed)?;
    let scheme_ok = scheme
        .bytes()
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic())
        && scheme
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'-' | b'.'));
    if !scheme_ok {
        return Err(RequestError::Malformed);
    }
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, rest) = rest.split_at(end);
    Ok((Some(scheme), Some(authority), rest))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(raw: &[u8]) -> Result<Request<'_>, RequestError> {
        Request::parse(raw, 1 << 20).map(|r| r.expect("complete").0)
    }

    #[test]
    fn origin_form_with_query() {
        let req = parse(b"GET /met%72ics?verbose&x=1 HTTP/1.1\r\nHost: h:1\r\n\r\n").unwrap();
        assert_eq!(req.method(), "GET");
        assert_eq!(req.path(), "/metrics");
        assert_eq!(req.raw_path(), "/met%72ics");
        assert_eq!(req.query(), Some("verbose&x=1"));
        assert_eq!(req.host(), "h:1");
        assert!(req.query_has("verbose"));
        assert!(req.query_has("x"));
        assert!(!req.query_has("y"));
    }

    #[test]
    fn absolute_form_and_asterisk() {
        let req = parse(b"GET http://a.b:9/healthz HTTP/1.1\r\nHost: other\r\n\r\n").unwrap();
        assert_eq!(
            (req.scheme(), req.host(), req.path()),
            (Some("http"), "a.b:9", "/healthz")
        );
        let req = parse(b"GET http://a.b HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        assert_eq!(req.path(), "/");
        let req = parse(b"GET http://u:p@a.b/x HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        assert_eq!((req.userinfo(), req.host()), (Some("u:p"), "a.b"));
        let req = parse(b"OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        assert_eq!(req.path(), "*");
        assert_eq!(
            parse(b"GET foo HTTP/1.1\r\nHost: x\r\n\r\n").unwrap_err(),
            RequestError::Malformed
        );
        assert_eq!(
            parse(b"GET 1http://x/ HTTP/1.1\r\nHost: x\r\n\r\n").unwrap_err(),
            RequestError::Malformed
        );
    }

    #[test]
    fn host_rules() {
        assert_eq!(
            parse(b"GET / HTTP/1.1\r\n\r\n").unwrap_err(),
            RequestError::MissingHost
        );
        assert_eq!(
            parse(b"GET / HTTP/1.1\r\nHost: a\r\nhost: b\r\n\r\n").unwrap_err(),
            RequestError::TooManyHosts
        );
        let req = parse(b"GET / HTTP/1.0\r\n\r\n").unwrap();
        assert_eq!(req.host(), "");
    }

    #[test]
    fn bad_escapes() {
        assert_eq!(
            parse(b"GET /a%zz HTTP/1.1\r\nHost: x\r\n\r\n").unwrap_err(),
            RequestError::Malformed
        );
        assert_eq!(
            parse(b"GET /a%2 HTTP/1.1\r\nHost: x\r\n\r\n").unwrap_err(),
            RequestError::Malformed
        );
        // The query is not validated, as in Go (RawQuery is kept raw).
        let req = parse(b"GET /a?q=%zz HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        assert_eq!(req.query(), Some("q=%zz"));
        assert!(!req.query_has("q"), "Go drops a pair with a bad escape");
    }

    #[test]
    fn query_keys_like_go() {
        let has = |q: &str, k: &str| {
            let raw = format!("GET /r?{q} HTTP/1.1\r\nHost: x\r\n\r\n");
            let req = parse(raw.as_bytes()).unwrap();
            req.query_has(k)
        };
        assert!(has("verbose", "verbose"));
        assert!(has("verbose=false", "verbose"));
        assert!(has("a=1&verbose=", "verbose"));
        assert!(has("verb%6Fse", "verbose"));
        assert!(has("a+b=1", "a b"));
        assert!(!has("verbose;x", "verbose"), "semicolons are refused");
        assert!(!has("", "verbose"));
        assert!(!has("verbosity", "verbose"));
    }

    #[test]
    fn incomplete_and_too_large() {
        assert!(matches!(
            Request::parse(b"GET / HTTP/1.1\r\nHo", 100),
            Ok(None)
        ));
        // A TLS ClientHello sent to the plain-text port.
        assert_eq!(
            Request::parse(&[0x16, 0x03, 0x01, 0x00, 0xa5], 50).unwrap_err(),
            RequestError::Malformed
        );
        assert_eq!(
            Request::parse(&[b'a'; 100], 50).unwrap_err(),
            RequestError::TooLarge
        );
        let mut long = b"GET / HTTP/1.1\r\nX: ".to_vec();
        long.extend(std::iter::repeat_n(b'a', 200));
        assert_eq!(
            Request::parse(&long, 100).unwrap_err(),
            RequestError::TooLarge
        );
    }
}
