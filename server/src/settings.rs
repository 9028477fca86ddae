//! The server's run-time settings, independent of how they were given
//! (flags map onto them in `options`; tests build them directly).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use konn_core::io::driver::DriverConfig;
use konn_core::io::runtime::RuntimeConfig;
use konn_core::io::tls::ServerTls;
use konn_protocol::h2::{self, Keepalive, PingPolicy, Role};

use konn_protocol::flow::FlowLimits;
use konn_protocol::server::backends::Strategy;
use konn_protocol::server::router::RouterConfig;

/// The frontend protocol (`--mode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// `/ProxyService/Proxy` gRPC streams.
    Grpc,
    /// HTTP/1.1 CONNECT.
    HttpConnect,
}

/// Where frontends connect.
#[derive(Clone, Debug)]
pub enum FrontendListen {
    /// A Unix socket (`--uds-name`), plaintext.
    Unix(PathBuf),
    /// TCP with mTLS (`--server-port`).
    Tcp(SocketAddr),
}

/// Everything the server needs to run.
#[derive(Clone)]
pub struct ServerSettings {
    /// `serverid` sent to agents.
    pub server_id: String,
    /// `servercount` sent to agents.
    pub server_count: usize,
    /// `--proxy-strategies`.
    pub strategies: Vec<Strategy>,
    /// Frontend protocol.
    pub mode: Mode,
    /// Frontend listener.
    pub frontend: FrontendListen,
    /// Remove an existing socket file before listening.
    pub delete_existing_uds: bool,
    /// Frontend TLS (TCP mode).
    pub frontend_tls: Option<ServerTls>,
    /// Agent listener address.
    pub agent_addr: SocketAddr,
    /// Agent TLS (always in production; `None` only in tests).
    pub agent_tls: Option<ServerTls>,
    /// `--keepalive-time` (agent port).
    pub keepalive_time: Duration,
    /// `--frontend-keepalive-time`.
    pub frontend_keepalive_time: Duration,
    /// Router limits, the dial deadline, each frontend's flow-control marks
    /// and the stuck timeout (`router.flow`).
    pub router: RouterConfig,
    /// A tunnel counts as congested above this many queued bytes (its
    /// frontends stop being read)…
    pub tunnel_high_water: usize,
    /// …and drained again at this many.
    pub tunnel_low_water: usize,
    /// Answer an agent's `konn-flow-control` offer (PAUSE/RESUME on its
    /// tunnel). Off: every agent gets upstream's protocol only.
    pub flow_control: bool,
    /// `--resume-window`: answer an agent's `konn-resume` offer (count,
    /// acknowledge and keep for replay each flow's bytes) and, when its
    /// tunnel breaks, keep its connections parked this long for the agent
    /// to resume them (docs/design/resume.md). Zero: resume off, every
    /// agent gets upstream's protocol.
    pub resume_window: Duration,
    /// Time allowed to send the CONNECT request head (upstream: 60 s).
    pub connect_header_timeout: Duration,
    /// Largest gRPC message accepted.
    pub max_message: u32,
    /// HTTP/2 receive windows: per stream, per connection.
    pub windows: (u32, u32),
    /// Driver settings (write and handshake timeouts).
    pub driver: DriverConfig,
    /// Threads and io engine.
    pub runtime: RuntimeConfig,
    /// `--graceful-shutdown-timeout`.
    pub graceful_shutdown_timeout: Duration,
    /// Health port (`/healthz`, `/readyz`, `/ready`, `/metrics`).
    pub health_addr: Option<SocketAddr>,
    /// Admin port (`/metrics`, `/debug/backends`).
    pub admin_addr: Option<SocketAddr>,
    /// `--enable-profiling` (konn answers 501 under `/debug/pprof/`).
    pub enable_profiling: bool,
    /// The reverse direction (KEP-2025): `--allowed-destination` entries
    /// (their keys are in `router.reverse.allowed`) and the dial timeout.
    pub reverse: ReverseSettings,
    /// Token authentication and the lease controller (`crate::kube`).
    pub kubernetes: Option<crate::kube::Kubernetes>,
    /// `--clusters-config`: many clusters, each with its own frontend,
    /// agents and router settings; `None`: one cluster from the flags
    /// above (upstream's behaviour).
    pub clusters: Option<ClustersSource>,
    /// The audit log and connection metrics (konn, issue 17).
    pub observe: crate::options::ObserveOptions,
}

/// The `--clusters-config` file and what it held at start.
#[derive(Clone, Debug)]
pub struct ClustersSource {
    /// The file (re-read on SIGHUP and when it changes).
    pub path: PathBuf,
    /// What the flags give clusters that do not say otherwise.
    pub defaults: crate::clusters::config::ClusterDefaults,
    /// The clusters at start.
    pub initial: Vec<crate::clusters::config::ClusterSettings>,
}

/// The reverse direction's IO settings (the router holds its allow-list
/// keys and per-agent limits, `RouterConfig::reverse`).
#[derive(Clone, Debug, Default)]
pub struct ReverseSettings {
    /// Destinations, indexed by the router's `ReverseDial::target`.
    pub destinations: Vec<AllowedDestination>,
    /// Bound on resolving and connecting one destination.
    pub dial_timeout: Duration,
}

/// One `--allowed-destination`.
#[derive(Clone, Debug)]
pub struct AllowedDestination {
    /// The entry as given: the key agents must send, spelled exactly so.
    pub key: String,
    /// What to dial.
    pub dest: konn_frames::addr::Destination,
}

impl ReverseSettings {
    /// Parse `--allowed-destination` entries; the router's allow-list keys
    /// go into `router`.
    pub fn parse(
        entries: &[String],
        dial_timeout: Duration,
        router: &mut konn_protocol::server::router::ReverseConfig,
    ) -> Result<Self, String> {
        let mut destinations = Vec::new();
        router.allowed.clear();
        for e in entries {
            let dest = konn_frames::addr::Destination::parse(e)
                .map_err(|err| format!("--allowed-destination={e:?}: {err}"))?;
            if let Some(ip) = dest.ip()
                && (ip.is_unspecified() || ip.is_multicast())
            {
                return Err(format!(
                    "--allowed-destination={e:?}: an unspecified or multicast address is never a destination"
                ));
            }
            if router.allowed.contains_key(e) {
                continue;
            }
            router.allowed.insert(e.clone(), destinations.len());
            destinations.push(AllowedDestination {
                key: e.clone(),
                dest,
            });
        }
        Ok(Self {
            destinations,
            dial_timeout,
        })
    }
}

impl ServerSettings {
    /// Settings for tests: plaintext agent port on 127.0.0.1:0, the given
    /// frontend, defaults elsewhere.
    pub fn for_tests(frontend: FrontendListen, mode: Mode) -> Self {
        Self {
            server_id: "test-server".into(),
            server_count: 1,
            strategies: vec![Strategy::Default],
            mode,
            frontend,
            delete_existing_uds: true,
            frontend_tls: None,
            agent_addr: "127.0.0.1:0".parse().expect("literal"),
            agent_tls: None,
            keepalive_time: Duration::from_secs(3600),
            frontend_keepalive_time: Duration::from_secs(3600),
            router: RouterConfig::default(),
            tunnel_high_water: 1 << 20,
            tunnel_low_water: 256 << 10,
            flow_control: true,
            resume_window: Duration::ZERO,
            connect_header_timeout: Duration::from_secs(60),
            max_message: konn_frames::grpc::DEFAULT_MAX_RECV_MESSAGE_SIZE,
            windows: (4 << 20, 16 << 20),
            driver: DriverConfig::default(),
            runtime: RuntimeConfig::default(),
            graceful_shutdown_timeout: Duration::ZERO,
            health_addr: None,
            admin_addr: None,
            enable_profiling: false,
            reverse: ReverseSettings {
                destinations: Vec::new(),
                dial_timeout: Duration::from_secs(10),
            },
            kubernetes: None,
            clusters: None,
            observe: Default::default(),
        }
    }

    /// The one cluster of a server without `--clusters-config`: upstream's
    /// server, from the flags (no name, no SNI selection).
    pub fn implicit_cluster(&self) -> crate::clusters::config::ClusterSettings {
        use crate::clusters::config::{AgentSpec, ClusterSettings, FrontendSpec};
        ClusterSettings {
            name: String::new(),
            strategies: self.strategies.clone(),
            router: self.router.clone(),
            reverse: self.reverse.clone(),
            frontend: FrontendSpec {
                mode: self.mode,
                listen: self.frontend.clone(),
                delete_existing_uds: self.delete_existing_uds,
                tls: self.frontend_tls.clone(),
            },
            agents: AgentSpec {
                server_names: Vec::new(),
                tls: self.agent_tls.clone(),
                token: None,
            },
            fingerprint: 0,
        }
    }

    /// Whether this server serves several clusters (`--clusters-config`).
    pub fn multi_cluster(&self) -> bool {
        self.clusters.is_some()
    }

    /// HTTP/2 settings of the agent port: upstream's keepalive enforcement
    /// (MinTime 30 s, pings without streams allowed), server keepalive.
    pub fn agent_h2(&self) -> h2::Config {
        let mut c = h2::Config::new(Role::Server);
        c.stream_window = self.windows.0;
        c.conn_window = self.windows.1;
        c.ping_policy = Some(PingPolicy::UPSTREAM_AGENT_PORT);
        c.keepalive = Some(Keepalive {
            interval: self.keepalive_time,
            timeout: Duration::from_secs(20),
            permit_without_stream: true,
        });
        self.with_driver_deadlines(c)
    }

    /// HTTP/2 settings of the gRPC frontend port: grpc-go's default ping
    /// enforcement, frontend keepalive.
    pub fn frontend_h2(&self) -> h2::Config {
        let mut c = h2::Config::new(Role::Server);
        c.stream_window = self.windows.0;
        c.conn_window = self.windows.1;
        c.ping_policy = Some(PingPolicy::GRPC_DEFAULT);
        c.keepalive = Some(Keepalive {
            interval: self.frontend_keepalive_time,
            timeout: Duration::from_secs(20),
            permit_without_stream: true,
        });
        self.with_driver_deadlines(c)
    }

    /// `c` with the driver's preface and idle deadlines: what the driver
    /// applies to each connection, applied once to the shared configuration
    /// (so `Connection::set_deadlines` finds nothing to change and no
    /// connection copies it).
    fn with_driver_deadlines(&self, c: h2::Config) -> h2::Config {
        c.with_deadlines(self.driver.preface_timeout, self.driver.idle_timeout)
    }
}

/// A listen address from upstream's `--*-bind-address` + port: empty means
/// all interfaces (dual-stack, as Go's `net.Listen(":port")`).
pub fn listen_addr(bind: &str, port: u16, flag: &'static str) -> Result<SocketAddr, crate::Error> {
    let host = bind.trim();
    if host.is_empty() {
        return Ok(SocketAddr::new(
            std::net::IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED),
            port,
        ));
    }
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if let Ok(ip) = host.parse::<std::net::IpAddr>() {
        return Ok(SocketAddr::new(ip, port));
    }
    // A name: resolve once at start-up, as Go's Listen does.
    use std::net::ToSocketAddrs;
    (host, port)
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .ok_or_else(|| crate::Error::Resolve {
            flag,
            host: host.to_owned(),
        })
}

impl ServerSettings {
    /// Settings from validated command-line options: reads and checks every
    /// certificate and key now, so a bad file fails the start with a line
    /// that names it.
    pub fn from_options(o: &crate::options::ServerOptions) -> Result<Self, crate::Error> {
        use konn_core::io::tls::{PemSource, ServerTlsOptions};

        use crate::options::{Frontend, Mode as OptMode, ProxyStrategy};

        let (reverse, reverse_router) = o.reverse.settings()?;

        let tls = |cert: &Option<PathBuf>,
                   key: &Option<PathBuf>,
                   ca: Option<&PathBuf>,
                   what: &'static str| {
            let (Some(cert), Some(key)) = (cert, key) else {
                return Err(crate::Error::MissingCertificate(what));
            };
            let mut t =
                ServerTlsOptions::new(PemSource::File(cert.clone()), PemSource::File(key.clone()));
            t.client_ca = ca.map(|c| PemSource::File(c.clone()));
            t.min_version = o.tls_min_version.go_name().to_owned();
            t.cipher_suites = o.cipher_suites.clone();
            t.build()
                .map_err(|source| crate::Error::Tls { what, source })
        };
        let a = &o.agent_listener;
        let multi = o.clusters_config.is_some();
        // With --clusters-config every cluster has its own agent TLS and
        // frontend; the flags' ones are not served.
        let agent_tls = if multi {
            None
        } else {
            Some(tls(
                &a.cert,
                &a.key,
                a.client_ca.as_ref(),
                "agent port (--cluster-cert, --cluster-key)",
            )?)
        };
        let (frontend, frontend_tls, delete_existing_uds) = match &o.frontend {
            Frontend::Uds {
                path,
                delete_existing,
            } => (FrontendListen::Unix(path.clone()), None, *delete_existing),
            Frontend::Tcp {
                bind_address,
                port,
                cert,
                key,
                client_ca,
            } => (
                FrontendListen::Tcp(listen_addr(bind_address, *port, "server-bind-address")?),
                if multi {
                    None
                } else {
                    Some(tls(
                        cert,
                        key,
                        Some(client_ca),
                        "frontend (--server-cert, --server-key)",
                    )?)
                },
                false,
            ),
        };
        let e = &o.engine;
        let mut runtime = RuntimeConfig {
            engine: e.io_engine,
            workers: e.workers.max(1),
            pin_cores: e.pin_cores,
            ..RuntimeConfig::default()
        };
        runtime.pool.budget_bytes = e.memory_budget;
        let mut driver = DriverConfig::default();
        if let Some(w) = e.write_timeout {
            driver.write_timeout = w;
        }
        driver.preface_timeout = e.preface_timeout;
        driver.idle_timeout = e.idle_timeout;
        let mut settings = Self {
            server_id: o.server_id.clone(),
            server_count: o.server_count,
            strategies: o
                .proxy_strategies
                .iter()
                .map(|s| match s {
                    ProxyStrategy::Default => Strategy::Default,
                    ProxyStrategy::DestHost => Strategy::DestHost,
                    ProxyStrategy::DefaultRoute => Strategy::DefaultRoute,
                })
                .collect(),
            mode: match o.mode {
                OptMode::Grpc => Mode::Grpc,
                OptMode::HttpConnect => Mode::HttpConnect,
            },
            frontend,
            delete_existing_uds,
            frontend_tls,
            agent_addr: listen_addr(&a.bind_address, a.port, "agent-bind-address")?,
            agent_tls,
            keepalive_time: nonzero_or(a.keepalive_time, Duration::from_secs(2 * 3600)),
            frontend_keepalive_time: nonzero_or(
                o.frontend_keepalive_time,
                Duration::from_secs(2 * 3600),
            ),
            router: RouterConfig {
                core: 0,
                dial_timeout: o.backend_dial_timeout,
                reverse: reverse_router,
                limits: o.limits.enabled().then(|| {
                    std::sync::Arc::new(konn_protocol::server::limits::Limits::new(
                        o.limits,
                        konn_core::io::clock::now(),
                    ))
                }),
                flow: FlowLimits::from_queue_size(
                    e.conn_queue_size,
                    e.stuck_timeout.unwrap_or(NEVER),
                ),
                ..RouterConfig::default()
            },
            // A konn agent's PAUSE must find at most this much of a flow
            // still queued here (docs/design/tunnel.md, "Flow control").
            tunnel_high_water: e.conn_queue_size.max(64 * 1024),
            tunnel_low_water: e.conn_queue_size.max(64 * 1024) / 4,
            flow_control: true,
            connect_header_timeout: o.connect_header_timeout.unwrap_or(NEVER),
            max_message: e.grpc_max_message_size,
            windows: (e.h2_stream_window, e.h2_conn_window),
            resume_window: e.resume_window.unwrap_or(Duration::ZERO),
            driver,
            runtime,
            graceful_shutdown_timeout: o.graceful_shutdown_timeout.unwrap_or(Duration::ZERO),
            health_addr: Some(listen_addr(
                &o.health.bind_address,
                o.health.port,
                "health-bind-address",
            )?),
            admin_addr: Some(listen_addr(
                &o.admin.bind_address,
                o.admin.port,
                "admin-bind-address",
            )?),
            enable_profiling: o.enable_profiling,
            reverse,
            kubernetes: crate::kube::Kubernetes::from_options(o),
            clusters: None,
            observe: o.observe.clone(),
        };
        if let Some(path) = &o.clusters_config {
            let defaults = crate::clusters::config::ClusterDefaults {
                strategies: settings.strategies.clone(),
                router: settings.router.clone(),
                reverse_dial_timeout: settings.reverse.dial_timeout,
                mode: settings.mode,
                // --uds-name is per cluster then; its deletion defaults on.
                delete_existing_uds: true,
                agent_identity: a.cert.clone().zip(a.key.clone()),
                tls_min_version: o.tls_min_version.go_name().to_owned(),
                cipher_suites: o.cipher_suites.clone(),
                kube: konn_core::kube::KubeSettings {
                    kubeconfig: o.kube_client.kubeconfig.clone(),
                    qps: o.kube_client.qps,
                    burst: o.kube_client.burst,
                    content_type: o.kube_client.content_type.clone(),
                },
                memory_budget: e.memory_budget,
            };
            let initial = crate::clusters::config::load(path, &defaults)
                .map_err(crate::Error::ClustersConfig)?;
            settings.clusters = Some(ClustersSource {
                path: path.clone(),
                defaults,
                initial,
            });
        }
        Ok(settings)
    }
}

/// A disabled timeout (`--stuck-timeout=0`): a year.
const NEVER: Duration = Duration::from_secs(365 * 24 * 3600);

fn nonzero_or(d: Duration, default: Duration) -> Duration {
    if d.is_zero() { default } else { d }
}
