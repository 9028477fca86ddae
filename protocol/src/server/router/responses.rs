//! Upstream's HTTP CONNECT error responses (tunnel.go) and its mapping of an
//! agent's dial error text to an HTTP status.

use bytes::Bytes;

use super::NO_AGENT;

/// How a CONNECT dial failed (which upstream response to write).
#[derive(Clone, Copy, Debug)]
pub(super) enum DialFail {
    Timeout,
    BackendGone,
    Error,
}

/// Upstream's response when no backend exists (tunnel.go).
pub(super) fn no_tunnel_response() -> Bytes {
    Bytes::from(format!(
        "HTTP/1.1 500 Internal Server Error\r\nContent-Type: text/plain\r\n\r\ncurrently no tunnels available: {NO_AGENT}"
    ))
}

/// A raw `text/plain; charset=utf-8` error response as tunnel.go writes it.
pub(super) fn raw_response(code: u16, body: &str) -> Bytes {
    Bytes::from(format!(
        "HTTP/1.1 {code} {}\r\nContent-Type: text/plain; charset=utf-8\r\n\r\n{body}",
        status_text(code)
    ))
}

/// The response to a CONNECT refused by a limit or the overload manager:
/// 503, the status upstream uses when the server itself is short of
/// resources (`too many open files`).
pub(super) fn refused_response(reason: crate::server::limits::Refusal) -> Bytes {
    raw_response(503, &reason.message())
}

/// The response for a DIAL_RSP error, as upstream writes it with Go's
/// `http.Response.Write` (unknown body length → `Connection: close`).
pub fn dial_error_response(error: &str) -> Bytes {
    let code = dial_error_status(error);
    Bytes::from(format!(
        "HTTP/1.1 {code} {}\r\nConnection: close\r\nContent-Type: text/plain; charset=utf-8\r\n\r\n{error}",
        status_text(code)
    ))
}

/// Upstream's `mapDialErrorToHTTPStatus`: the HTTP status for an agent's
/// dial error text.
pub fn dial_error_status(error: &str) -> u16 {
    let e = error.to_lowercase();
    let has = |s: &str| e.contains(s);
    if has("i/o timeout") || has("deadline exceeded") || has("timeout") {
        504
    } else if has("too many open files") {
        503
    } else {
        // Connection, DNS and TLS errors and anything else.
        502
    }
}

fn status_text(code: u16) -> &'static str {
    match code {
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "Error",
    }
}
