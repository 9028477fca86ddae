//! Routing by path, with Go `ServeMux` matching rules.
//!
//! A pattern without a trailing slash matches that path exactly; a pattern
//! ending in `/` also matches every path below it, the longest such pattern
//! winning (Go's rule, used upstream for `/debug/pprof/`). Unknown paths get
//! Go's `404 page not found`. Handlers answer GET and HEAD (HEAD drops the
//! body); any other method on a known path gets 405 with `Allow: GET, HEAD`.
//! That last point is stricter than upstream, whose handlers answer every
//! method: konn's endpoints are read-only, and no probe or scraper uses
//! another method.

use std::fmt;

use super::{Request, Response};

/// A request handler: a plain function or closure from the request head to
/// a complete response.
pub type Handler = Box<dyn Fn(&Request<'_>) -> Response>;

/// A set of routes. Built once, then shared by the connections of one
/// worker (`Rc`); handlers need not be `Send`.
#[derive(Default)]
pub struct Router {
    exact: Vec<(String, Handler)>,
    subtree: Vec<(String, Handler)>,
}

impl fmt::Debug for Router {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Router")
            .field(
                "exact",
                &self.exact.iter().map(|(p, _)| p).collect::<Vec<_>>(),
            )
            .field(
                "subtree",
                &self.subtree.iter().map(|(p, _)| p).collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl Router {
    /// A router without routes (everything is 404).
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a route. A later route for the same pattern replaces the
    /// earlier one.
    #[must_use]
    pub fn route(
        mut self,
        pattern: &str,
        handler: impl Fn(&Request<'_>) -> Response + 'static,
    ) -> Self {
        let list = if pattern.ends_with('/') {
            &mut self.subtree
        } else {
            &mut self.exact
        };
        list.retain(|(p, _)| p != pattern);
        list.push((pattern.to_owned(), Box::new(handler)));
        self
    }

    /// Whether some route matches `path`.
    pub fn matches(&self, path: &str) -> bool {
        self.find(path).is_some()
    }

    /// Answers one request.
    pub fn handle(&self, request: &Request<'_>) -> Response {
        let Some(handler) = self.find(request.path()) else {
            return Response::not_found();
        };
        match request.method() {
            "GET" | "HEAD" => handler(request),
            _ => Response::method_not_allowed(),
        }
    }

    fn find(&self, path: &str) -> Option<&Handler> {
        if let Some((_, h)) = self.exact.iter().find(|(p, _)| p == path) {
            return Some(h);
        }
        self.subtree
            .iter()
            .filter(|(p, _)| path.starts_with(p.as_str()))
            .max_by_key(|(p, _)| p.len())
            .map(|(_, h)| h)
    }
}

/// The body of the 501 answer on the profiling paths.
pub const PROFILING_UNAVAILABLE: &str = "konn does not embed Go's pprof profiler; \
profile the process with an OS-level profiler such as perf instead\n";

/// The routes upstream adds under `--enable-profiling` (Go's
/// `net/http/pprof`), as konn answers them: `/debug/pprof` redirects to
/// `/debug/pprof/` with 301 like upstream, and everything under
/// `/debug/pprof/` is 501 with [`PROFILING_UNAVAILABLE`]. Go's profiles
/// describe the Go runtime (goroutines, Go heap); konn has none, and
/// OS-level profilers work on it unchanged.
#[must_use]
pub fn profiling_routes(router: Router) -> Router {
    router
        .route("/debug/pprof", |req| {
            Response::redirect(req.method(), "/debug/pprof/", 301)
        })
        .route("/debug/pprof/", |_| {
            Response::text(501, PROFILING_UNAVAILABLE)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(raw: &[u8]) -> Request<'_> {
        Request::parse(raw, 4096).unwrap().unwrap().0
    }

    #[test]
    fn exact_subtree_and_methods() {
        let router = Router::new()
            .route("/a", |_| Response::text(200, "a"))
            .route("/d/", |_| Response::text(200, "d"))
            .route("/d/x/", |_| Response::text(200, "dx"))
            .route("/a", |_| Response::text(200, "a2"));
        let get = |raw: &[u8]| router.handle(&request(raw));
        assert_eq!(get(b"GET /a HTTP/1.1\r\nHost: h\r\n\r\n").body, b"a2");
        assert_eq!(get(b"HEAD /a HTTP/1.1\r\nHost: h\r\n\r\n").status, 200);
        assert_eq!(get(b"GET /a/ HTTP/1.1\r\nHost: h\r\n\r\n").status, 404);
        assert_eq!(get(b"GET /d/ HTTP/1.1\r\nHost: h\r\n\r\n").body, b"d");
        assert_eq!(get(b"GET /d/heap HTTP/1.1\r\nHost: h\r\n\r\n").body, b"d");
        assert_eq!(get(b"GET /d/x/y HTTP/1.1\r\nHost: h\r\n\r\n").body, b"dx");
        assert_eq!(get(b"GET /d HTTP/1.1\r\nHost: h\r\n\r\n").status, 404);
        let not_found = get(b"GET /zz HTTP/1.1\r\nHost: h\r\n\r\n");
        assert_eq!(not_found, Response::not_found());
        assert_eq!(not_found.body, b"404 page not found\n");
        let post = get(b"POST /a HTTP/1.1\r\nHost: h\r\n\r\n");
        assert_eq!(post.status, 405);
        assert_eq!(post.header("allow"), Some("GET, HEAD"));
        assert_eq!(get(b"POST /zz HTTP/1.1\r\nHost: h\r\n\r\n").status, 404);
    }

    #[test]
    fn profiling_placeholders() {
        let router = profiling_routes(Router::new());
        let get = |raw: &[u8]| router.handle(&request(raw));
        let moved = get(b"GET /debug/pprof HTTP/1.1\r\nHost: h\r\n\r\n");
        assert_eq!(moved.status, 301);
        assert_eq!(moved.header("Location"), Some("/debug/pprof/"));
        assert_eq!(
            moved.body,
            b"<a href=\"/debug/pprof/\">Moved Permanently</a>.\n\n"
        );
        for path in ["/debug/pprof/", "/debug/pprof/profile", "/debug/pprof/heap"] {
            let raw = format!("GET {path} HTTP/1.1\r\nHost: h\r\n\r\n");
            let answer = get(raw.as_bytes());
            assert_eq!(answer.status, 501, "{path}");
            assert_eq!(answer.body, PROFILING_UNAVAILABLE.as_bytes());
        }
    }
}
