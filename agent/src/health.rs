//! proxy-agent's health and admin endpoints.
//!
//! | port (flag, default) | path | answer |
//! |---|---|---|
//! | health (`--health-server-port` 8093) | `/healthz` | 200 `ok` |
//! | health | `/readyz`, `/ready` | the checks `ping` and `server-connected` (below) |
//! | health | `/metrics` | the scrape |
//! | admin (`--admin-server-port` 8094) | `/metrics` | 301 to the health port's `/metrics` (below) |
//! | admin | `/debug/connections` | konn only: the open tunnelled connections as JSON (`crate::debug`; added by `run::worker`) |
//! | admin, `--enable-profiling` | `/debug/pprof`, `/debug/pprof/…` | 301 to `/debug/pprof/`, then 501 (see `konn_core::http1::profiling_routes`) |
//!
//! **Readiness** runs upstream's two checks in order: `ping` (always
//! passes) and `server-connected` (the agent holds at least one connected
//! server tunnel). When both pass the answer is 200 `ok`, or with a
//! `verbose` query parameter (any value, as Go's `r.URL.Query()` sees it)
//! one line per check and `check passed`:
//!
//! ```text
//! [+]ping ok
//! [+]server-connected ok
//! check passed
//! ```
//!
//! When a check fails the answer is always the verbose list, with status
//! 503 and no `check passed` line:
//!
//! ```text
//! [+]ping ok
//! [-]server-connected failed: no servers connected
//! ```
//!
//! **The admin `/metrics` redirect** is built as upstream builds it: the
//! host of the request (`Host`, or an absolute-form target's authority)
//! with its port replaced by the health port (`net.SplitHostPort`, falling
//! back to the whole host when it has no port, then `net.JoinHostPort`),
//! the request's path as sent and its query. Without a scheme in the
//! request the `Location` is scheme-relative: a request to
//! `localhost:8094/metrics?x` is sent to `//localhost:8093/metrics?x`.

use std::rc::Rc;

pub use konn_core::http1::{PROFILING_UNAVAILABLE, profiling_routes};
use konn_core::{
    http1::{Request, Response, Router, metrics_response},
    metrics::Registry,
};

/// The `server-connected` failure text.
pub const NO_SERVERS: &str = "no servers connected";

/// The agent's readiness (upstream's `ReadinessManager`): true when at
/// least one server tunnel is connected.
pub trait Readiness {
    /// Whether the agent is connected to a server.
    fn ready(&self) -> bool;
}

impl<F: Fn() -> bool> Readiness for F {
    fn ready(&self) -> bool {
        self()
    }
}

/// `/healthz`: always `ok` while the process serves HTTP.
pub fn healthz(_request: &Request<'_>) -> Response {
    Response::text(200, "ok")
}

/// `/readyz` and `/ready` (see the module docs).
pub fn readyz(readiness: &dyn Readiness, request: &Request<'_>) -> Response {
    let checks: [(&str, Result<(), &str>); 2] = [
        ("ping", Ok(())),
        (
            "server-connected",
            if readiness.ready() {
                Ok(())
            } else {
                Err(NO_SERVERS)
            },
        ),
    ];
    let mut report = String::new();
    let mut failed = false;
    for (name, result) in checks {
        match result {
            Ok(()) => report.push_str(&format!("[+]{name} ok\n")),
            Err(err) => {
                failed = true;
                report.push_str(&format!("[-]{name} failed: {err}\n"));
            }
        }
    }
    if failed {
        return Response::text(503, report);
    }
    if !request.query_has("verbose") {
        return Response::text(200, "ok");
    }
    report.push_str("check passed\n");
    Response::text(200, report)
}

/// The health port's routes.
pub fn health_router(readiness: impl Readiness + 'static, metrics: Registry) -> Router {
    let readiness: Rc<dyn Readiness> = Rc::new(readiness);
    let ready = readiness.clone();
    Router::new()
        .route("/healthz", healthz)
        .route("/readyz", move |req| readyz(&*readiness, req))
        // Deprecated upstream, kept for compatibility.
        .route("/ready", move |req| readyz(&*ready, req))
        .route("/metrics", move |req| metrics_response(&metrics, req))
}

/// The admin port's routes: `/metrics` redirects to `health_port`.
pub fn admin_router(health_port: u16, enable_profiling: bool) -> Router {
    let router = Router::new().route("/metrics", move |req| metrics_redirect(req, health_port));
    if enable_profiling {
        profiling_routes(router)
    } else {
        router
    }
}

/// The admin port's `/metrics` answer: 301 to the same path and query on
/// `health_port` of the host the request named.
pub fn metrics_redirect(request: &Request<'_>, health_port: u16) -> Response {
    let full = request.host();
    let host = split_host_port(full).unwrap_or(full);
    let mut location = String::new();
    if let Some(scheme) = request.scheme() {
        location.push_str(scheme);
        location.push(':');
    }
    location.push_str("//");
    if let Some(user) = request.userinfo() {
        location.push_str(user);
        location.push('@');
    }
    location.push_str(&join_host_port(host, health_port));
    location.push_str(request.raw_path());
    if let Some(query) = request.query() {
        location.push('?');
        location.push_str(query);
    }
    Response::redirect(request.method(), &location, 301)
}

/// The host part of `host:port` by Go's `net.SplitHostPort` rules, or
/// `None` where Go returns an error (no port, too many colons, misplaced
/// brackets).
pub fn split_host_port(hostport: &str) -> Option<&str> {
    let colon = hostport.rfind(':')?;
    let (host, inner_from, inner_to) = if hostport.starts_with('[') {
        let end = hostport.find(']')?;
        if end + 1 != colon {
            return None;
        }
        (hostport.get(1..end)?, 1, end + 1)
    } else {
        let host = hostport.get(..colon)?;
        if host.contains(':') {
            return None;
        }
        (host, 0, 0)
    };
    if hostport.get(inner_from..)?.contains('[') || hostport.get(inner_to..)?.contains(']') {
        return None;
    }
    Some(host)
}

/// Go's `net.JoinHostPort`: brackets around a host containing `:`.
pub fn join_host_port(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_and_join_like_go() {
        assert_eq!(split_host_port("localhost:8094"), Some("localhost"));
        assert_eq!(split_host_port("[::1]:8094"), Some("::1"));
        assert_eq!(split_host_port("h:"), Some("h"));
        assert_eq!(split_host_port("example.com"), None);
        assert_eq!(split_host_port("::1"), None);
        assert_eq!(split_host_port("[::1]"), None);
        assert_eq!(split_host_port("[::1]x:1"), None);
        assert_eq!(split_host_port("a]:1"), None);
        assert_eq!(split_host_port("[a]:[1"), None);
        assert_eq!(split_host_port(""), None);
        assert_eq!(join_host_port("::1", 8093), "[::1]:8093");
        assert_eq!(join_host_port("", 8093), ":8093");
        assert_eq!(join_host_port("h", 1), "h:1");
    }
}
