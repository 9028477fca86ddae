//! proxy-server's health and admin endpoints.
//!
//! | port (flag, default) | path | answer |
//! |---|---|---|
//! | health (`--health-port` 8092) | `/healthz` | 200 `ok` |
//! | health | `/readyz`, `/ready` (deprecated) | 200 `ok`, or 500 with the readiness message (upstream: `no connection to any proxy agent`) |
//! | health | `/metrics` | the scrape |
//! | admin (`--admin-port` 8095) | `/metrics` | the same scrape (upstream keeps it there "for backward compatibility") |
//! | admin | `/debug/backends` | konn only: the connected agents as JSON ([`BackendsSource`]) |
//! | admin, `--enable-profiling` | `/debug/pprof` | 301 to `/debug/pprof/`, as upstream |
//! | admin, `--enable-profiling` | `/debug/pprof/…` | 501: konn has no Go profiler (see below) |
//!
//! Bodies are `text/plain; charset=utf-8` like Go's sniffed ones. Every
//! other path is Go's `404 page not found`.
//!
//! **Profiling.** Upstream serves Go's `net/http/pprof` under
//! `--enable-profiling`. Those profiles (goroutines, Go heap, Go CPU
//! profile format) describe a Go runtime konn does not have, so konn
//! answers the same paths with 501 and a message pointing at OS-level
//! profilers (`perf`, `bpftrace`, ...), which work on the Rust binary as
//! is. Without the flag the paths are 404, as upstream.
//!
//! **`/debug/backends`** (not upstream). The answer is one JSON object, with
//! agents sorted by id and identifiers in the order the agent sent them:
//!
//! ```json
//! {"agents":[{"id":"node-1","identifiers":{"host":["node-1"],"ipv4":["10.0.0.1"],
//! "ipv6":[],"cidr":[],"defaultRoute":false},"draining":false,"worker":0,
//! "connections":{"open":3,"pending":1}}]}
//! ```
//!
//! With admission limits on (docs/design/limits.md) each agent also has
//! `"limits":{"connections":2,"refused":5}`: the connections and dials
//! counted against its `--max-agent-connections` (all workers together)
//! and its dials refused by any limit; and the document (each cluster's,
//! with `--clusters-config`) has the limits in force ([`LimitsInfo`]):
//! `"limits":{"agent":{"connections":10,"dial_rate":0},"destination":…,
//! "frontend":…,"cluster":…,"overload_watermark_bytes":0,"overloaded":false}`
//! (0: off; rates in dials per second).
//!
//! `open` counts established end-to-end connections through that agent,
//! `pending` dials sent to it and not answered yet; `draining` is true once
//! the agent sent DRAIN; `worker` is the server worker (core) that holds
//! the agent's tunnel.
//!
//! **With `--clusters-config`** ([`health_router_clusters`],
//! [`admin_router_clusters`]; docs/MULTI-CLUSTER.md):
//! - `/readyz` (and `/ready`) is 200 while the server serves, whatever any
//!   cluster's agents do: one tenant without agents must not take the
//!   shared server out of its load balancer. `/readyz/<cluster>` is that
//!   cluster's readiness, upstream's rule (200 `ok` with an agent, else 500
//!   `no connection to any proxy agent`); an unknown cluster is 404.
//!   `/readyz?verbose` keeps `/readyz`'s status and lists every cluster in
//!   kube-apiserver's style, sorted by name:
//!   `[+]cluster a ok`, `[-]cluster b failed: no connection to any proxy
//!   agent`, then `readyz check passed` (or `failed`).
//! - `/metrics`: every cluster's families carry a `cluster` label; the
//!   process-wide ones (`process_*`, leases, token reviews) do not.
//! - `/debug/backends` groups the agents by cluster, clusters sorted by
//!   name: `{"clusters":[{"name":"a","agents":[...],"limits":{...}}]}`.

use std::rc::Rc;

pub use konn_core::http1::{PROFILING_UNAVAILABLE, profiling_routes};
use konn_core::{
    http1::{Request, Response, Router, metrics_response},
    metrics::Registry,
};

/// Upstream's readiness failure text.
pub const NOT_READY: &str = "no connection to any proxy agent";

/// The server's readiness, as upstream's `ReadinessManager`: `Ok` when
/// ready, else the message `/readyz` answers with (upstream:
/// [`NOT_READY`] while the first backend manager has no agent).
pub trait Readiness {
    /// Whether the server is ready.
    fn ready(&self) -> Result<(), String>;
}

impl<F: Fn() -> Result<(), String>> Readiness for F {
    fn ready(&self) -> Result<(), String> {
        self()
    }
}

/// One connected agent as `/debug/backends` shows it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BackendInfo {
    /// The `agentid` the agent sent.
    pub agent_id: String,
    /// The parsed `agentidentifiers` metadata.
    pub identifiers: BackendIdentifiers,
    /// Whether the agent sent DRAIN.
    pub draining: bool,
    /// Established end-to-end connections through this agent.
    pub connections_open: u64,
    /// Dials sent to this agent and not answered yet.
    pub connections_pending: u64,
    /// The worker holding the agent's tunnel.
    pub worker: usize,
    /// With admission limits on (`--max-*`, `--overload-memory-watermark`):
    /// the connections counted against the agent's limit and the dials of
    /// it refused by a limit (docs/design/limits.md).
    pub limits: Option<(u64, u64)>,
}

/// The identifiers an agent advertises (`agentidentifiers`: `host`,
/// `ipv4`, `ipv6`, `cidr`, `default-route`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BackendIdentifiers {
    /// `host=` values.
    pub host: Vec<String>,
    /// `ipv4=` values.
    pub ipv4: Vec<String>,
    /// `ipv6=` values.
    pub ipv6: Vec<String>,
    /// `cidr=` values.
    pub cidr: Vec<String>,
    /// `default-route=true`.
    pub default_route: bool,
}

/// A cluster's admission limits as `/debug/backends` shows them (when any
/// is on): the settings now and whether the overload manager refuses.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LimitsInfo {
    /// The limits (`--max-*`, the watermark in bytes).
    pub config: konn_protocol::server::limits::LimitsConfig,
    /// New dials are refused for memory now.
    pub overloaded: bool,
}

impl LimitsInfo {
    /// What `limits` show, if any limit is on.
    pub fn of(limits: Option<&konn_protocol::server::limits::Limits>) -> Option<Self> {
        limits.filter(|l| l.enabled()).map(|l| Self {
            config: l.config(),
            overloaded: l.overloaded(),
        })
    }
}

/// Where `/debug/backends` gets its data; the server implements it.
pub trait BackendsSource {
    /// The connected agents, in any order.
    fn backends(&self) -> Vec<BackendInfo>;
    /// The cluster's admission limits, when any is on.
    fn limits(&self) -> Option<LimitsInfo> {
        None
    }
}

impl<F: Fn() -> Vec<BackendInfo>> BackendsSource for F {
    fn backends(&self) -> Vec<BackendInfo> {
        self()
    }
}

/// One cluster's agents (`/debug/backends` with `--clusters-config`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ClusterBackends {
    /// The cluster.
    pub name: String,
    /// Its connected agents.
    pub agents: Vec<BackendInfo>,
    /// Its admission limits, when any is on.
    pub limits: Option<LimitsInfo>,
}

/// What the endpoints of a server with `--clusters-config` report.
pub trait ClustersView {
    /// The server's readiness (not its clusters').
    fn ready(&self) -> Result<(), String>;
    /// Every cluster's readiness, in any order.
    fn clusters_ready(&self) -> Vec<(String, Result<(), String>)>;
    /// One scrape (see `ServerMetrics::scrape`).
    fn scrape(&self) -> Vec<u8>;
    /// The agents, by cluster.
    fn backends(&self) -> Vec<ClusterBackends>;
}

/// `/healthz`: always `ok` while the process serves HTTP.
pub fn healthz(_request: &Request<'_>) -> Response {
    Response::text(200, "ok")
}

/// `/readyz` and `/ready`: 200 `ok`, or 500 with the readiness message.
pub fn readyz(readiness: &dyn Readiness) -> Response {
    match readiness.ready() {
        Ok(()) => Response::text(200, "ok"),
        Err(message) => Response::text(500, message),
    }
}

/// The health port's routes.
pub fn health_router(readiness: impl Readiness + 'static, metrics: Registry) -> Router {
    let readiness: Rc<dyn Readiness> = Rc::new(readiness);
    let ready = readiness.clone();
    Router::new()
        .route("/healthz", healthz)
        .route("/readyz", move |_| readyz(&*readiness))
        // Deprecated upstream, kept for compatibility.
        .route("/ready", move |_| readyz(&*ready))
        .route("/metrics", move |req| metrics_response(&metrics, req))
}

/// The health port's routes with `--clusters-config` (module docs).
pub fn health_router_clusters(view: Rc<dyn ClustersView>) -> Router {
    let (ready, ready2, cluster, metrics) = (view.clone(), view.clone(), view.clone(), view);
    Router::new()
        .route("/healthz", healthz)
        .route("/readyz", move |req| {
            if req.query_has("verbose") {
                readyz_verbose(ready.ready(), ready.clusters_ready())
            } else {
                readyz(&|| ready.ready())
            }
        })
        .route("/ready", move |_| readyz(&|| ready2.ready()))
        .route("/readyz/", move |req| {
            let name = req.path().strip_prefix("/readyz/").unwrap_or_default();
            let all = cluster.clusters_ready();
            match all.into_iter().find(|(n, _)| n == name) {
                Some((_, r)) => readyz(&move || r.clone()),
                None => Response::not_found(),
            }
        })
        .route("/metrics", move |req| {
            scrape_response(metrics.scrape(), req)
        })
}

/// `/readyz?verbose` with `--clusters-config`: the server's status, and a
/// line per cluster (module docs).
fn readyz_verbose(
    server: Result<(), String>,
    mut clusters: Vec<(String, Result<(), String>)>,
) -> Response {
    clusters.sort_by(|a, b| a.0.cmp(&b.0));
    let mut body = String::new();
    for (name, ready) in clusters {
        match ready {
            Ok(()) => body.push_str(&format!("[+]cluster {name} ok\n")),
            Err(why) => body.push_str(&format!("[-]cluster {name} failed: {why}\n")),
        }
    }
    match server {
        Ok(()) => {
            body.push_str("readyz check passed");
            Response::text(200, body)
        }
        Err(why) => {
            body.push_str(&format!("readyz check failed: {why}"));
            Response::text(500, body)
        }
    }
}

/// The admin port's routes with `--clusters-config` (module docs).
pub fn admin_router_clusters(view: Rc<dyn ClustersView>, enable_profiling: bool) -> Router {
    let metrics = view.clone();
    let router = Router::new()
        .route("/metrics", move |req| {
            scrape_response(metrics.scrape(), req)
        })
        .route("/debug/backends", move |_| {
            Response::new(200)
                .with_header("Content-Type", "application/json")
                .with_body(clusters_json(view.backends()))
        });
    if enable_profiling {
        profiling_routes(router)
    } else {
        router
    }
}

/// A `/metrics` answer with a body already rendered.
fn scrape_response(body: Vec<u8>, request: &Request<'_>) -> Response {
    let content_type = konn_core::metrics::text::negotiate_content_type(request.header("accept"));
    Response::new(200)
        .with_header("Content-Type", content_type)
        .with_body(body)
}

/// The `/debug/backends` document with `--clusters-config`.
pub fn clusters_json(mut clusters: Vec<ClusterBackends>) -> Vec<u8> {
    clusters.sort_by(|a, b| a.name.cmp(&b.name));
    let mut out = String::from("{\"clusters\":[");
    for (i, c) in clusters.into_iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str("{\"name\":");
        json_string(&mut out, &c.name);
        out.push_str(",\"agents\":");
        agents_json(&mut out, c.agents);
        limits_json(&mut out, c.limits);
        out.push('}');
    }
    out.push_str("]}\n");
    out.into_bytes()
}

/// The admin port's routes.
pub fn admin_router(
    metrics: Registry,
    backends: impl BackendsSource + 'static,
    enable_profiling: bool,
) -> Router {
    let router = Router::new()
        .route("/metrics", move |req| metrics_response(&metrics, req))
        .route("/debug/backends", move |_| {
            Response::new(200)
                .with_header("Content-Type", "application/json")
                .with_body(backends_json(backends.backends(), backends.limits()))
        });
    if enable_profiling {
        profiling_routes(router)
    } else {
        router
    }
}

/// The `/debug/backends` document (see the module docs), newline-terminated.
pub fn backends_json(agents: Vec<BackendInfo>, limits: Option<LimitsInfo>) -> Vec<u8> {
    let mut out = String::from("{\"agents\":");
    agents_json(&mut out, agents);
    limits_json(&mut out, limits);
    out.push_str("}\n");
    out.into_bytes()
}

/// `,"limits":{…}` when some limit is on (module docs).
fn limits_json(out: &mut String, limits: Option<LimitsInfo>) {
    use std::fmt::Write as _;
    let Some(l) = limits else { return };
    let c = &l.config;
    out.push_str(",\"limits\":{");
    for (name, limit) in [
        ("agent", &c.agent),
        ("destination", &c.dest),
        ("frontend", &c.frontend),
        ("cluster", &c.cluster),
    ] {
        let _ = write!(
            out,
            "\"{name}\":{{\"connections\":{},\"dial_rate\":{}}},",
            limit.max_conns, limit.rate
        );
    }
    let _ = write!(
        out,
        "\"overload_watermark_bytes\":{},\"overloaded\":{}}}",
        c.overload_high, l.overloaded
    );
}

/// A JSON array of agents, sorted by id.
fn agents_json(out: &mut String, mut agents: Vec<BackendInfo>) {
    agents.sort_by(|a, b| a.agent_id.cmp(&b.agent_id));
    out.push('[');
    for (i, agent) in agents.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str("{\"id\":");
        json_string(out, &agent.agent_id);
        out.push_str(",\"identifiers\":{");
        let ids = &agent.identifiers;
        for (key, values) in [
            ("host", &ids.host),
            ("ipv4", &ids.ipv4),
            ("ipv6", &ids.ipv6),
            ("cidr", &ids.cidr),
        ] {
            out.push('"');
            out.push_str(key);
            out.push_str("\":[");
            for (j, value) in values.iter().enumerate() {
                if j > 0 {
                    out.push(',');
                }
                json_string(out, value);
            }
            out.push_str("],");
        }
        out.push_str("\"defaultRoute\":");
        out.push_str(if ids.default_route { "true" } else { "false" });
        out.push_str("},\"draining\":");
        out.push_str(if agent.draining { "true" } else { "false" });
        out.push_str(&format!(
            ",\"worker\":{},\"connections\":{{\"open\":{},\"pending\":{}}}",
            agent.worker, agent.connections_open, agent.connections_pending
        ));
        if let Some((counted, refused)) = agent.limits {
            out.push_str(&format!(
                ",\"limits\":{{\"connections\":{counted},\"refused\":{refused}}}"
            ));
        }
        out.push('}');
    }
    out.push(']');
}

/// Appends a string as JSON (shared with the agent's debug endpoint).
pub(crate) use konn_core::http1::response::json_string;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_escapes_and_sorts() {
        let agents = vec![
            BackendInfo {
                agent_id: "b\"\\\n\u{1}".into(),
                ..BackendInfo::default()
            },
            BackendInfo {
                agent_id: "a".into(),
                identifiers: BackendIdentifiers {
                    host: vec!["h1".into(), "h2".into()],
                    default_route: true,
                    ..BackendIdentifiers::default()
                },
                draining: true,
                connections_open: 3,
                connections_pending: 1,
                worker: 1,
                limits: Some((2, 5)),
            },
        ];
        assert_eq!(
            String::from_utf8(backends_json(agents, None)).unwrap(),
            "{\"agents\":[{\"id\":\"a\",\"identifiers\":{\"host\":[\"h1\",\"h2\"],\"ipv4\":[],\
             \"ipv6\":[],\"cidr\":[],\"defaultRoute\":true},\"draining\":true,\"worker\":1,\
             \"connections\":{\"open\":3,\"pending\":1},\
             \"limits\":{\"connections\":2,\"refused\":5}},\
             {\"id\":\"b\\\"\\\\\\n\\u0001\",\"identifiers\":{\"host\":[],\"ipv4\":[],\"ipv6\":[],\
             \"cidr\":[],\"defaultRoute\":false},\"draining\":false,\"worker\":0,\
             \"connections\":{\"open\":0,\"pending\":0}}]}\n"
        );
        assert_eq!(backends_json(Vec::new(), None), b"{\"agents\":[]}\n");
        let limits = LimitsInfo {
            config: konn_protocol::server::limits::LimitsConfig {
                agent: konn_protocol::server::limits::Limit::new(10, 0),
                cluster: konn_protocol::server::limits::Limit {
                    max_conns: 0,
                    rate: 0.5,
                    burst: 1,
                },
                overload_high: 1000,
                ..Default::default()
            },
            overloaded: true,
        };
        assert_eq!(
            String::from_utf8(backends_json(Vec::new(), Some(limits))).unwrap(),
            "{\"agents\":[],\"limits\":{\"agent\":{\"connections\":10,\"dial_rate\":0},\
             \"destination\":{\"connections\":0,\"dial_rate\":0},\
             \"frontend\":{\"connections\":0,\"dial_rate\":0},\
             \"cluster\":{\"connections\":0,\"dial_rate\":0.5},\
             \"overload_watermark_bytes\":1000,\"overloaded\":true}}\n"
        );
        let verbose = readyz_verbose(
            Ok(()),
            vec![("b".into(), Err(NOT_READY.into())), ("a".into(), Ok(()))],
        );
        assert_eq!(verbose.status, 200);
        assert_eq!(
            verbose.body,
            b"[+]cluster a ok\n[-]cluster b failed: no connection to any proxy agent\n\
              readyz check passed"
        );
        let stopping = readyz_verbose(Err(NOT_READY.into()), Vec::new());
        assert_eq!(stopping.status, 500);
        assert_eq!(
            clusters_json(vec![
                ClusterBackends {
                    name: "b".into(),
                    agents: Vec::new(),
                    limits: None,
                },
                ClusterBackends {
                    name: "a".into(),
                    agents: vec![BackendInfo {
                        agent_id: "x".into(),
                        ..BackendInfo::default()
                    }],
                    limits: None,
                },
            ]),
            b"{\"clusters\":[{\"name\":\"a\",\"agents\":[{\"id\":\"x\",\"identifiers\":{\"host\":[],\
              \"ipv4\":[],\"ipv6\":[],\"cidr\":[],\"defaultRoute\":false},\"draining\":false,\
              \"worker\":0,\"connections\":{\"open\":0,\"pending\":0}}]},{\"name\":\"b\",\"agents\":[]}]}\n"
        );
    }
}
