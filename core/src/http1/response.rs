//! Responses: what handlers return and how the server writes them.
//!
//! A handler returns a [`Response`]: status, header fields, complete body.
//! The server adds `Date`, `Content-Length` and, when it will close or keep
//! an HTTP/1.0 connection, `Connection`, in that order after the handler's
//! fields (Go's `net/http` writes the same three fields). A HEAD answer has
//! the headers of the GET answer and no body.
//!
//! Errors found before a handler runs (a malformed or oversized head) are
//! answered with the exact bytes Go's server writes for them:
//! `HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\n`
//! `Connection: close\r\n\r\n400 Bad Request`, the body ending at the close.

use std::time::{SystemTime, UNIX_EPOCH};

/// `Content-Type` of Go's plain-text answers (what `http.DetectContentType`
/// picks for `ok`).
pub const TEXT_PLAIN: &str = "text/plain; charset=utf-8";

/// A complete response from a handler.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    /// The status code.
    pub status: u16,
    /// Header fields, written in this order. The server adds `Date`,
    /// `Content-Length` and `Connection` itself.
    pub headers: Vec<(&'static str, String)>,
    /// The body (not sent for HEAD).
    pub body: Vec<u8>,
}

impl Response {
    /// A response with no fields and an empty body.
    pub fn new(status: u16) -> Self {
        Self {
            status,
            headers: Vec::new(),
            body: Vec::new(),
        }
    }

    /// A `text/plain; charset=utf-8` response.
    pub fn text(status: u16, body: impl Into<Vec<u8>>) -> Self {
        Self::new(status)
            .with_header("Content-Type", TEXT_PLAIN)
            .with_body(body)
    }

    /// Adds a header field.
    #[must_use]
    pub fn with_header(mut self, name: &'static str, value: impl Into<String>) -> Self {
        self.headers.push((name, value.into()));
        self
    }

    /// Replaces the body.
    #[must_use]
    pub fn with_body(mut self, body: impl Into<Vec<u8>>) -> Self {
        self.body = body.into();
        self
    }

    /// The value of the first field named `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// Go's `http.NotFound`: `404 page not found\n` with `nosniff`.
    pub fn not_found() -> Self {
        Self::text(404, "404 page not found\n").with_header("X-Content-Type-Options", "nosniff")
    }

    /// A redirect as Go's `http.Redirect` writes it for a GET or HEAD
    /// request: `Location` (non-ASCII bytes %-escaped), `Content-Type:
    /// text/html; charset=utf-8`, and for GET the body
    /// `<a href="{location, HTML-escaped}">{reason}</a>.\n\n`. `location`
    /// must already be absolute or scheme-relative (Go would resolve a
    /// relative one against the request path; konn's callers never pass
    /// one).
    pub fn redirect(method: &str, location: &str, status: u16) -> Self {
        let mut response = Self::new(status)
            .with_header("Content-Type", "text/html; charset=utf-8")
            .with_header("Location", hex_escape_non_ascii(location));
        if method == "GET" {
            response.body = format!(
                "<a href=\"{}\">{}</a>.\n\n",
                html_escape(location),
                reason_phrase(status)
            )
            .into_bytes();
        }
        response
    }

    /// 405 for a method other than GET and HEAD on a known path.
    pub fn method_not_allowed() -> Self {
        Self::text(405, "Method Not Allowed\n")
            .with_header("X-Content-Type-Options", "nosniff")
            .with_header("Allow", "GET, HEAD")
    }
}

/// The reason phrase Go's `http.StatusText` gives for `status` (the codes
/// konn answers with), or `"status code"` for others, as Go's server writes
/// unknown codes.
pub fn reason_phrase(status: u16) -> &'static str {
    match status {
        200 => "OK",
        204 => "No Content",
        301 => "Moved Permanently",
        302 => "Found",
        304 => "Not Modified",
        307 => "Temporary Redirect",
        400 => "Bad Request",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        413 => "Request Entity Too Large",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        503 => "Service Unavailable",
        505 => "HTTP Version Not Supported",
        _ => "status code",
    }
}

/// Appends `s` to `out` as a JSON string (RFC 8259 escaping), for the
/// admin endpoints' hand-written JSON.
pub fn json_string(out: &mut String, s: &str) {
    use std::fmt::Write as _;
    out.push('"');
    // Runs without anything to escape are copied whole (the audit log
    // writes several strings per record); every byte that needs escaping
    // is ASCII, so the cuts fall on character boundaries.
    let mut from = 0;
    for (i, b) in s.bytes().enumerate() {
        let escaped = match b {
            b'"' => "\\\"",
            b'\\' => "\\\\",
            b'\n' => "\\n",
            b'\r' => "\\r",
            b'\t' => "\\t",
            0..=0x1f => "",
            _ => continue,
        };
        out.push_str(s.get(from..i).unwrap_or_default());
        if escaped.is_empty() {
            let _ = write!(out, "\\u{b:04x}");
        } else {
            out.push_str(escaped);
        }
        from = i + 1;
    }
    out.push_str(s.get(from..).unwrap_or_default());
    out.push('"');
}

/// Go's `htmlEscape`: `&`, `<`, `>`, `"` and `'` as entities.
pub fn html_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&#34;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// Go's `hexEscapeNonASCII`: bytes from 0x80 up as `%XX`.
pub fn hex_escape_non_ascii(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii() {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// What the server says about the connection after this response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ConnectionField {
    /// No `Connection` field (HTTP/1.1 keep-alive, HTTP/1.0 close).
    None,
    /// `Connection: close`.
    Close,
    /// `Connection: keep-alive` (an HTTP/1.0 client that asked for it).
    KeepAlive,
}

/// Writes the status line, fields and (unless `head_only`) the body.
pub(crate) fn encode(
    out: &mut Vec<u8>,
    response: &Response,
    version_minor: u8,
    head_only: bool,
    connection: ConnectionField,
    date: &str,
) {
    out.extend_from_slice(if version_minor == 0 {
        b"HTTP/1.0 "
    } else {
        b"HTTP/1.1 "
    });
    out.extend_from_slice(response.status.to_string().as_bytes());
    out.push(b' ');
    out.extend_from_slice(reason_phrase(response.status).as_bytes());
    out.extend_from_slice(b"\r\n");
    for (name, value) in &response.headers {
        if is_framing_field(name) {
            continue;
        }
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b": ");
        // A field value never carries CR, LF or NUL: a handler that copies
        // request bytes into a field (a redirect `Location`) cannot split
        // the response.
        out.extend(value.bytes().map(|b| {
            if matches!(b, b'\r' | b'\n' | 0) {
                b' '
            } else {
                b
            }
        }));
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"Date: ");
    out.extend_from_slice(date.as_bytes());
    out.extend_from_slice(b"\r\n");
    let bodiless = matches!(response.status, 100..=199 | 204 | 304);
    if !bodiless {
        out.extend_from_slice(b"Content-Length: ");
        out.extend_from_slice(response.body.len().to_string().as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    match connection {
        ConnectionField::None => {}
        ConnectionField::Close => out.extend_from_slice(b"Connection: close\r\n"),
        ConnectionField::KeepAlive => out.extend_from_slice(b"Connection: keep-alive\r\n"),
    }
    out.extend_from_slice(b"\r\n");
    if !head_only && !bodiless {
        out.extend_from_slice(&response.body);
    }
}

/// Fields the server owns; a handler's copy is dropped.
fn is_framing_field(name: &str) -> bool {
    ["Content-Length", "Transfer-Encoding", "Connection", "Date"]
        .iter()
        .any(|f| f.eq_ignore_ascii_case(name))
}

/// The raw answer Go's server writes when it refuses a request head (400,
/// 431, 501), closing the connection afterwards.
pub(crate) fn early_error(status: u16, detail: Option<&str>) -> Vec<u8> {
    let mut text = format!("{status} {}", reason_phrase(status));
    if let Some(detail) = detail {
        text.push_str(": ");
        text.push_str(detail);
    }
    if status == 501 {
        // Go does not echo the transfer coding (XSS precaution).
        return format!(
            "HTTP/1.1 {text}\r\nContent-Type: {TEXT_PLAIN}\r\nConnection: close\r\n\r\n\
             Unsupported transfer encoding"
        )
        .into_bytes();
    }
    format!("HTTP/1.1 {text}\r\nContent-Type: {TEXT_PLAIN}\r\nConnection: close\r\n\r\n{text}")
        .into_bytes()
}

/// The current time as an HTTP date.
pub fn http_date_now() -> String {
    // The `Date` field needs the wall clock; this is the HTTP driver, the
    // one place that reads it for this purpose.
    #[allow(clippy::disallowed_methods)]
    let now = SystemTime::now();
    http_date(now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs()))
}

/// Formats seconds since the Unix epoch as an IMF-fixdate (RFC 9110
/// §5.6.7), e.g. `Sun, 06 Nov 1994 08:49:37 GMT`.
pub fn http_date(unix_secs: u64) -> String {
    const DAYS: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let days = unix_secs / 86_400;
    let secs = unix_secs % 86_400;
    let (year, month, day) = civil_from_days(days);
    format!(
        "{}, {day:02} {} {year:04} {:02}:{:02}:{:02} GMT",
        DAYS.get((days % 7) as usize).copied().unwrap_or("Thu"),
        MONTHS
            .get(month.saturating_sub(1) as usize)
            .copied()
            .unwrap_or("Jan"),
        secs / 3600,
        secs % 3600 / 60,
        secs % 60,
    )
}

/// Year, month (1–12) and day (1–31) of a day count since 1970-01-01, in
/// the proleptic Gregorian calendar (Howard Hinnant's `civil_from_days`,
/// restricted to non-negative day counts).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_strings_escape_quotes_backslashes_and_controls_only() {
        let cases = [
            ("", r#""""#),
            ("plain 10.0.0.1:443", r#""plain 10.0.0.1:443""#),
            ("a\"b\\c", r#""a\"b\\c""#),
            ("\n\r\t\u{1}\u{1f} ", r#""\n\r\t\u0001\u001f ""#),
            ("héllo \u{1F600}\"", "\"héllo \u{1F600}\\\"\""),
        ];
        for (raw, want) in cases {
            let mut out = String::from("x");
            json_string(&mut out, raw);
            assert_eq!(out, format!("x{want}"), "{raw:?}");
        }
    }

    #[test]
    fn dates() {
        assert_eq!(http_date(0), "Thu, 01 Jan 1970 00:00:00 GMT");
        assert_eq!(http_date(784_111_777), "Sun, 06 Nov 1994 08:49:37 GMT");
        assert_eq!(http_date(1_795_307_623), "Sun, 22 Nov 2026 00:33:43 GMT");
        assert_eq!(http_date(951_782_400), "Tue, 29 Feb 2000 00:00:00 GMT");
        assert_eq!(http_date(4_102_444_799), "Thu, 31 Dec 2099 23:59:59 GMT");
        assert_eq!(http_date_now().len(), 29);
    }

    #[test]
    fn encoding() {
        let mut out = Vec::new();
        let resp = Response::text(200, "ok")
            .with_header("Content-Length", "99")
            .with_header("X-Evil", "a\r\nSet-Cookie: x");
        encode(
            &mut out,
            &resp,
            1,
            false,
            ConnectionField::None,
            "Thu, 01 Jan 1970 00:00:00 GMT",
        );
        assert_eq!(
            out,
            b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; charset=utf-8\r\n\
X-Evil: a  Set-Cookie: x\r\nDate: Thu, 01 Jan 1970 00:00:00 GMT\r\nContent-Length: 2\r\n\r\nok"
        );
        out.clear();
        encode(&mut out, &resp, 0, true, ConnectionField::KeepAlive, "D");
        assert_eq!(
            out,
            b"HTTP/1.0 200 OK\r\nContent-Type: text/plain; charset=utf-8\r\n\
X-Evil: a  Set-Cookie: x\r\nDate: D\r\nContent-Length: 2\r\nConnection: keep-alive\r\n\r\n"
        );
    }

    #[test]
    fn redirects_like_go() {
        let get = Response::redirect("GET", "//h:8093/metrics?a=b&c", 301);
        assert_eq!(get.header("location"), Some("//h:8093/metrics?a=b&c"));
        assert_eq!(get.header("content-type"), Some("text/html; charset=utf-8"));
        assert_eq!(
            get.body,
            b"<a href=\"//h:8093/metrics?a=b&amp;c\">Moved Permanently</a>.\n\n"
        );
        let head = Response::redirect("HEAD", "/debug/pprof/", 301);
        assert!(head.body.is_empty());
        assert_eq!(
            head.header("content-type"),
            Some("text/html; charset=utf-8")
        );
        assert_eq!(html_escape("<a>\"'&"), "&lt;a&gt;&#34;&#39;&amp;");
        assert_eq!(hex_escape_non_ascii("//h\u{e9}:1/"), "//h%C3%A9:1/");
    }

    #[test]
    fn go_error_answers() {
        assert_eq!(
            early_error(400, None),
            b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\n\
Connection: close\r\n\r\n400 Bad Request"
        );
        assert_eq!(
            early_error(400, Some("missing required Host header")),
            b"HTTP/1.1 400 Bad Request: missing required Host header\r\nContent-Type: \
text/plain; charset=utf-8\r\nConnection: close\r\n\r\n400 Bad Request: missing required Host header"
        );
        assert_eq!(
            early_error(431, None),
            b"HTTP/1.1 431 Request Header Fields Too Large\r\nContent-Type: text/plain; \
charset=utf-8\r\nConnection: close\r\n\r\n431 Request Header Fields Too Large"
        );
        assert!(early_error(501, None).ends_with(b"\r\n\r\nUnsupported transfer encoding"));
    }
}
