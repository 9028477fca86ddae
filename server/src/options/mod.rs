//! proxy-server's command line: every flag of upstream proxy-server v0.36.0
//! (same names, types, defaults and validation), klog's flags, and konn's
//! own flags in a separate `--help` section.
//!
//! Flow, as in upstream's `main.go` and `Run`:
//! 1. [`command`] builds the [`Command`] (upstream flags, klog flags, konn
//!    flags); `--server-id` defaults to `$PROXY_SERVER_ID`, else a random
//!    UUID.
//! 2. The binary parses the arguments and sets up logging from the klog
//!    flags.
//! 3. [`ServerFlags::from_flags`] reads the raw values (upstream's
//!    `ProxyRunOptions`), [`ServerFlags::validate`] applies upstream's
//!    `Validate()` rules, in upstream's order, and returns the typed
//!    [`ServerOptions`] (ports as `u16`, durations as [`Duration`], enums for
//!    the mode and strategies). Error texts keep upstream's meaning but name
//!    the flags.
//! 4. [`ServerOptions::unsupported_features`] lists what konn cannot do yet
//!    (nothing at the moment); the binary refuses to start when it is not
//!    empty.
//!
//! The flag table lives in `register`, the rules in `validate`; this module
//! holds the raw and the typed options.
//!
//! Deliberate differences, all documented in `docs/FLAGS.md`:
//! - `--backend-dial-timeout=0` keeps upstream's default text but konn
//!   always bounds pending dials: 0 means [`DEFAULT_BACKEND_DIAL_TIMEOUT`].
//! - Negative `--keepalive-time`, `--frontend-keepalive-time` and
//!   `--server-count` are refused (upstream passes them to grpc-go and to
//!   agents unchecked).
//! - `--cipher-suites` names that Go accepts but rustls does not implement
//!   (the four ECDHE CBC suites) are refused with the reason.
//! - `--tls-min-version` below TLS 1.2 is accepted with a warning, as
//!   upstream, but konn then uses TLS 1.2 (rustls has no TLS 1.0/1.1).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use konn_core::app::Options;
use konn_core::cli::common::default_id;
pub use konn_core::cli::common::{Listener, Unsupported};
use konn_core::cli::engine::EngineFlags;
use konn_core::cli::{Command, FlagSet, GoDuration};
use konn_core::io::tls::TlsMinVersion;
use konn_core::log::LogConfig;
pub use observe::{ObserveFlags, ObserveOptions};

use crate::Error;

mod observe;
mod register;
mod validate;

/// The program name shown in `--help`.
pub const PROGRAM: &str = "proxy-server";

/// The description at the top of `--help`.
pub const ABOUT: &str = "konn proxy-server: a drop-in replacement for the Konnectivity proxy-server. \
It accepts kube-apiserver's egress connections (gRPC or HTTP CONNECT) and forwards them through \
the tunnels that proxy-agents open to it.";

/// Environment variable that supplies `--server-id`'s default.
pub const SERVER_ID_ENV: &str = "PROXY_SERVER_ID";

/// How long konn waits for an agent's DIAL_RSP when `--backend-dial-timeout`
/// is 0 (upstream: no limit). It must exceed the agent's own 5 s dial
/// timeout, so a slow but working dial still gets its answer through, and
/// stay short enough that kube-apiserver sees a failure instead of a hang.
pub const DEFAULT_BACKEND_DIAL_TIMEOUT: Duration = Duration::from_secs(30);

/// Upstream's `--mode` values.
const MODE_GRPC: &str = "grpc";
const MODE_HTTP_CONNECT: &str = "http-connect";

/// The deprecation text of the server's `--warn-on-channel-limit`.
const WARN_ON_CHANNEL_LIMIT_DEPRECATION: &str = "This behavior is now thread safe and always on. This flag will be removed in a future release.";

/// Builds proxy-server's command line, reading `PROXY_SERVER_ID` from the
/// process environment.
pub fn command() -> Command {
    command_with_env(|k| std::env::var(k).ok())
}

/// Builds proxy-server's command line with `env` as the environment.
pub fn command_with_env(env: impl Fn(&str) -> Option<String>) -> Command {
    let mut cmd = Command::new(PROGRAM, ABOUT);
    let flags = cmd.flags_mut();
    ServerFlags::defaults(&env).register(flags);
    LogConfig::register(flags);
    EngineFlags::register(flags);
    cmd
}

/// The raw flag values, one field per upstream flag (upstream's
/// `ProxyRunOptions`), Go-typed: ports are Go `int`s, durations may be
/// negative, until [`validate`](Self::validate) checks them.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerFlags {
    /// `--server-cert`.
    pub server_cert: String,
    /// `--server-key`.
    pub server_key: String,
    /// `--server-ca-cert`.
    pub server_ca_cert: String,
    /// `--cluster-cert`.
    pub cluster_cert: String,
    /// `--cluster-key`.
    pub cluster_key: String,
    /// `--cluster-ca-cert`.
    pub cluster_ca_cert: String,
    /// `--mode`.
    pub mode: String,
    /// `--uds-name`.
    pub uds_name: String,
    /// `--delete-existing-uds-file`.
    pub delete_existing_uds_file: bool,
    /// `--server-port`.
    pub server_port: i64,
    /// `--server-bind-address`.
    pub server_bind_address: String,
    /// `--agent-port`.
    pub agent_port: i64,
    /// `--agent-bind-address`.
    pub agent_bind_address: String,
    /// `--admin-port`.
    pub admin_port: i64,
    /// `--admin-bind-address`.
    pub admin_bind_address: String,
    /// `--health-port`.
    pub health_port: i64,
    /// `--health-bind-address`.
    pub health_bind_address: String,
    /// `--keepalive-time`.
    pub keepalive_time: GoDuration,
    /// `--frontend-keepalive-time`.
    pub frontend_keepalive_time: GoDuration,
    /// `--enable-profiling`.
    pub enable_profiling: bool,
    /// `--enable-contention-profiling`.
    pub enable_contention_profiling: bool,
    /// `--server-id`.
    pub server_id: String,
    /// `--server-count`.
    pub server_count: i64,
    /// `--agent-namespace`.
    pub agent_namespace: String,
    /// `--agent-service-account`.
    pub agent_service_account: String,
    /// `--authentication-audience`.
    pub authentication_audience: String,
    /// `--kubeconfig`.
    pub kubeconfig: String,
    /// `--kubeconfig-qps`.
    pub kubeconfig_qps: f32,
    /// `--kubeconfig-burst`.
    pub kubeconfig_burst: i64,
    /// `--kube-api-content-type`.
    pub kube_api_content_type: String,
    /// `--proxy-strategies`.
    pub proxy_strategies: String,
    /// `--cipher-suites`.
    pub cipher_suites: Vec<String>,
    /// `--tls-min-version`.
    pub tls_min_version: String,
    /// `--xfr-channel-size`.
    pub xfr_channel_size: i64,
    /// `--enable-lease-controller`.
    pub enable_lease_controller: bool,
    /// `--lease-namespace`.
    pub lease_namespace: String,
    /// `--lease-label`.
    pub lease_label: String,
    /// `--graceful-shutdown-timeout`.
    pub graceful_shutdown_timeout: GoDuration,
    /// `--backend-dial-timeout`.
    pub backend_dial_timeout: GoDuration,
    /// `--warn-on-channel-limit` (hidden, deprecated, no effect).
    pub warn_on_channel_limit: bool,
    /// `--allowed-destination` (konn: KEP-2025).
    pub allowed_destination: Vec<String>,
    /// `--reverse-max-per-agent` (konn: KEP-2025).
    pub reverse_max_per_agent: i64,
    /// `--reverse-dial-rate` (konn: KEP-2025).
    pub reverse_dial_rate: i64,
    /// `--reverse-dial-timeout` (konn: KEP-2025).
    pub reverse_dial_timeout: GoDuration,
    /// `--clusters-config` (konn: one server for many clusters).
    pub clusters_config: String,
    /// `--connect-header-timeout` (konn: HTTP CONNECT head deadline).
    pub connect_header_timeout: GoDuration,
    /// konn's dial admission limits (`--max-*-connections`,
    /// `--max-*-dial-rate`, `--overload-memory-watermark`).
    pub limits: LimitFlags,
    /// konn's audit log and connection metrics flags.
    pub observe: ObserveFlags,
}

/// konn's dial admission flags (docs/design/limits.md); 0 is off.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LimitFlags {
    /// `--max-agent-connections`.
    pub agent_connections: i64,
    /// `--max-agent-dial-rate`.
    pub agent_dial_rate: i64,
    /// `--max-destination-connections`.
    pub destination_connections: i64,
    /// `--max-destination-dial-rate`.
    pub destination_dial_rate: i64,
    /// `--max-frontend-connections`.
    pub frontend_connections: i64,
    /// `--max-frontend-dial-rate`.
    pub frontend_dial_rate: i64,
    /// `--max-cluster-connections`.
    pub cluster_connections: i64,
    /// `--max-cluster-dial-rate`.
    pub cluster_dial_rate: i64,
    /// `--overload-memory-watermark`, a fraction of `--memory-budget`.
    pub overload_memory_watermark: f32,
}

impl LimitFlags {
    /// Each flag's name with its value (the integer ones).
    pub(crate) fn ints(&self) -> [(&'static str, i64); 8] {
        [
            ("max-agent-connections", self.agent_connections),
            ("max-agent-dial-rate", self.agent_dial_rate),
            ("max-destination-connections", self.destination_connections),
            ("max-destination-dial-rate", self.destination_dial_rate),
            ("max-frontend-connections", self.frontend_connections),
            ("max-frontend-dial-rate", self.frontend_dial_rate),
            ("max-cluster-connections", self.cluster_connections),
            ("max-cluster-dial-rate", self.cluster_dial_rate),
        ]
    }
}

impl ServerFlags {
    /// Upstream's defaults (`NewProxyRunOptions`). `--server-id` comes from
    /// `env("PROXY_SERVER_ID")` when set and non-empty, else a random UUID.
    pub fn defaults(env: &dyn Fn(&str) -> Option<String>) -> Self {
        let server_id = default_id(env, SERVER_ID_ENV);
        Self {
            server_cert: String::new(),
            server_key: String::new(),
            server_ca_cert: String::new(),
            cluster_cert: String::new(),
            cluster_key: String::new(),
            cluster_ca_cert: String::new(),
            mode: MODE_GRPC.to_owned(),
            uds_name: String::new(),
            delete_existing_uds_file: true,
            server_port: 8090,
            server_bind_address: String::new(),
            agent_port: 8091,
            agent_bind_address: String::new(),
            admin_port: 8095,
            admin_bind_address: "127.0.0.1".to_owned(),
            health_port: 8092,
            health_bind_address: String::new(),
            keepalive_time: GoDuration::from_secs(3600),
            frontend_keepalive_time: GoDuration::from_secs(3600),
            enable_profiling: false,
            enable_contention_profiling: false,
            server_id,
            server_count: 1,
            agent_namespace: String::new(),
            agent_service_account: String::new(),
            authentication_audience: String::new(),
            kubeconfig: String::new(),
            kubeconfig_qps: 0.0,
            kubeconfig_burst: 0,
            kube_api_content_type: "application/vnd.kubernetes.protobuf".to_owned(),
            proxy_strategies: "default".to_owned(),
            cipher_suites: Vec::new(),
            tls_min_version: String::new(),
            xfr_channel_size: 10,
            enable_lease_controller: false,
            lease_namespace: "kube-system".to_owned(),
            lease_label: "k8s-app=konnectivity-server".to_owned(),
            graceful_shutdown_timeout: GoDuration::ZERO,
            backend_dial_timeout: GoDuration::ZERO,
            warn_on_channel_limit: true,
            allowed_destination: Vec::new(),
            reverse_max_per_agent: 256,
            reverse_dial_rate: 100,
            reverse_dial_timeout: GoDuration::from_secs(10),
            clusters_config: String::new(),
            connect_header_timeout: GoDuration::from_secs(60),
            limits: LimitFlags::default(),
            observe: ObserveFlags::default(),
        }
    }

    /// Reads the values registered by [`register`](Self::register).
    pub fn from_flags(f: &FlagSet) -> Self {
        Self {
            server_cert: f.get_string("server-cert"),
            server_key: f.get_string("server-key"),
            server_ca_cert: f.get_string("server-ca-cert"),
            cluster_cert: f.get_string("cluster-cert"),
            cluster_key: f.get_string("cluster-key"),
            cluster_ca_cert: f.get_string("cluster-ca-cert"),
            mode: f.get_string("mode"),
            uds_name: f.get_string("uds-name"),
            delete_existing_uds_file: f.get_bool("delete-existing-uds-file"),
            server_port: f.get_int("server-port"),
            server_bind_address: f.get_string("server-bind-address"),
            agent_port: f.get_int("agent-port"),
            agent_bind_address: f.get_string("agent-bind-address"),
            admin_port: f.get_int("admin-port"),
            admin_bind_address: f.get_string("admin-bind-address"),
            health_port: f.get_int("health-port"),
            health_bind_address: f.get_string("health-bind-address"),
            keepalive_time: f.get_duration("keepalive-time"),
            frontend_keepalive_time: f.get_duration("frontend-keepalive-time"),
            enable_profiling: f.get_bool("enable-profiling"),
            enable_contention_profiling: f.get_bool("enable-contention-profiling"),
            server_id: f.get_string("server-id"),
            server_count: f.get_int("server-count"),
            agent_namespace: f.get_string("agent-namespace"),
            agent_service_account: f.get_string("agent-service-account"),
            authentication_audience: f.get_string("authentication-audience"),
            kubeconfig: f.get_string("kubeconfig"),
            kubeconfig_qps: f.get_float32("kubeconfig-qps"),
            kubeconfig_burst: f.get_int("kubeconfig-burst"),
            kube_api_content_type: f.get_string("kube-api-content-type"),
            proxy_strategies: f.get_string("proxy-strategies"),
            cipher_suites: f.get_string_slice("cipher-suites"),
            tls_min_version: f.get_string("tls-min-version"),
            xfr_channel_size: f.get_int("xfr-channel-size"),
            enable_lease_controller: f.get_bool("enable-lease-controller"),
            lease_namespace: f.get_string("lease-namespace"),
            lease_label: f.get_string("lease-label"),
            graceful_shutdown_timeout: f.get_duration("graceful-shutdown-timeout"),
            backend_dial_timeout: f.get_duration("backend-dial-timeout"),
            warn_on_channel_limit: f.get_bool("warn-on-channel-limit"),
            allowed_destination: f.get_string_slice("allowed-destination"),
            reverse_max_per_agent: f.get_int("reverse-max-per-agent"),
            reverse_dial_rate: f.get_int("reverse-dial-rate"),
            reverse_dial_timeout: f.get_duration("reverse-dial-timeout"),
            clusters_config: f.get_string("clusters-config"),
            connect_header_timeout: f.get_duration("connect-header-timeout"),
            limits: LimitFlags {
                agent_connections: f.get_int("max-agent-connections"),
                agent_dial_rate: f.get_int("max-agent-dial-rate"),
                destination_connections: f.get_int("max-destination-connections"),
                destination_dial_rate: f.get_int("max-destination-dial-rate"),
                frontend_connections: f.get_int("max-frontend-connections"),
                frontend_dial_rate: f.get_int("max-frontend-dial-rate"),
                cluster_connections: f.get_int("max-cluster-connections"),
                cluster_dial_rate: f.get_int("max-cluster-dial-rate"),
                overload_memory_watermark: f.get_float32("overload-memory-watermark"),
            },
            observe: ObserveFlags::from_flags(f),
        }
    }

    /// Token authentication is on when any of its three flags is set.
    fn uses_token_auth(&self) -> bool {
        !self.agent_namespace.is_empty()
            || !self.agent_service_account.is_empty()
            || !self.authentication_audience.is_empty()
    }
}

/// The KEP-2025 options (`--allowed-destination`, `--reverse-*`),
/// validated.
#[derive(Debug, Clone, PartialEq)]
pub struct ReverseOptions {
    /// `--allowed-destination`, as given (each parses).
    pub allowed_destination: Vec<String>,
    /// `--reverse-max-per-agent` (≥ 1).
    pub max_per_agent: usize,
    /// `--reverse-dial-rate`, per second (≥ 1; also the burst).
    pub dial_rate: usize,
    /// `--reverse-dial-timeout` (> 0).
    pub dial_timeout: Duration,
}

impl ReverseOptions {
    /// The run-time settings and the router's part of them.
    ///
    /// # Errors
    ///
    /// [`Error::Reverse`] naming an `--allowed-destination` that does not
    /// parse.
    pub fn settings(
        &self,
    ) -> Result<
        (
            crate::settings::ReverseSettings,
            konn_protocol::server::router::ReverseConfig,
        ),
        Error,
    > {
        let mut router = konn_protocol::server::router::ReverseConfig {
            max_per_agent: self.max_per_agent,
            dials_per_second: self.dial_rate as f64,
            burst: u32::try_from(self.dial_rate).unwrap_or(u32::MAX),
            ..Default::default()
        };
        let settings = crate::settings::ReverseSettings::parse(
            &self.allowed_destination,
            self.dial_timeout,
            &mut router,
        )
        .map_err(Error::Reverse)?;
        Ok((settings, router))
    }
}

/// Frontend protocol (`--mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// konnectivity-client's gRPC `Proxy` streams.
    Grpc,
    /// HTTP/1.1 CONNECT.
    HttpConnect,
}

/// Where the frontend listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frontend {
    /// A Unix socket, no TLS (`--uds-name`).
    Uds {
        /// Socket path.
        path: PathBuf,
        /// `--delete-existing-uds-file`.
        delete_existing: bool,
    },
    /// TCP with mTLS (`--server-port`).
    Tcp {
        /// `--server-bind-address`; empty: all interfaces.
        bind_address: String,
        /// `--server-port`.
        port: u16,
        /// `--server-cert` (upstream fails at start without it).
        cert: Option<PathBuf>,
        /// `--server-key` (upstream fails at start without it).
        key: Option<PathBuf>,
        /// `--server-ca-cert`: kube-apiserver's client certificate CA.
        client_ca: PathBuf,
    },
}

/// The agent port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentListener {
    /// `--agent-bind-address`; empty: all interfaces.
    pub bind_address: String,
    /// `--agent-port`.
    pub port: u16,
    /// `--cluster-cert` (upstream fails at start without it).
    pub cert: Option<PathBuf>,
    /// `--cluster-key` (upstream fails at start without it).
    pub key: Option<PathBuf>,
    /// `--cluster-ca-cert`: agents must present a certificate from it.
    pub client_ca: Option<PathBuf>,
    /// `--keepalive-time`; zero means grpc-go's default (2 h).
    pub keepalive_time: Duration,
}

/// Agent token authentication (`--agent-namespace` & co.).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenAuth {
    /// `--agent-namespace`.
    pub namespace: String,
    /// `--agent-service-account`.
    pub service_account: String,
    /// `--authentication-audience`.
    pub audience: String,
}

/// The Kubernetes API client settings.
#[derive(Debug, Clone, PartialEq)]
pub struct KubeClient {
    /// `--kubeconfig`; `None`: in-cluster configuration.
    pub kubeconfig: Option<PathBuf>,
    /// `--kubeconfig-qps`; 0: client default.
    pub qps: f32,
    /// `--kubeconfig-burst`; 0: client default.
    pub burst: i64,
    /// `--kube-api-content-type`.
    pub content_type: String,
}

/// The lease controller (`--enable-lease-controller`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseController {
    /// `--lease-namespace`.
    pub namespace: String,
    /// `--lease-label`, parsed.
    pub labels: BTreeMap<String, String>,
}

/// One `--proxy-strategies` entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProxyStrategy {
    /// `default`: any agent.
    Default,
    /// `destHost`: an agent that registered the destination host.
    DestHost,
    /// `defaultRoute`: an agent that registered `default-route`.
    DefaultRoute,
}

impl ProxyStrategy {
    /// The flag spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Default => "default",
            Self::DestHost => "destHost",
            Self::DefaultRoute => "defaultRoute",
        }
    }
}

/// proxy-server's validated, typed options.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerOptions {
    /// `--mode`.
    pub mode: Mode,
    /// The frontend listener.
    pub frontend: Frontend,
    /// `--frontend-keepalive-time`; zero means grpc-go's default (2 h).
    pub frontend_keepalive_time: Duration,
    /// The agent port.
    pub agent_listener: AgentListener,
    /// `--tls-min-version`, for both TLS listeners.
    pub tls_min_version: TlsMinVersion,
    /// `--cipher-suites` (Go names, checked; map them with
    /// `konn_core::io::tls::suites::cipher_suites_from_go_names`).
    pub cipher_suites: Vec<String>,
    /// Agent token authentication, when enabled.
    pub token_auth: Option<TokenAuth>,
    /// Kubernetes API client settings.
    pub kube_client: KubeClient,
    /// `--proxy-strategies`, in order (at least one).
    pub proxy_strategies: Vec<ProxyStrategy>,
    /// `--server-id`.
    pub server_id: String,
    /// `--server-count`.
    pub server_count: usize,
    /// The lease controller, when enabled.
    pub lease_controller: Option<LeaseController>,
    /// The health server.
    pub health: Listener,
    /// The admin server.
    pub admin: Listener,
    /// `--enable-profiling` (konn has no pprof).
    pub enable_profiling: bool,
    /// `--enable-contention-profiling` (konn has no pprof).
    pub enable_contention_profiling: bool,
    /// `--xfr-channel-size` (> 0).
    pub xfr_channel_size: usize,
    /// `--graceful-shutdown-timeout`; `None`: stop immediately.
    pub graceful_shutdown_timeout: Option<Duration>,
    /// Bound on a pending dial (DIAL_REQ sent to DIAL_RSP received). Never
    /// unlimited: `--backend-dial-timeout=0` gives
    /// [`DEFAULT_BACKEND_DIAL_TIMEOUT`].
    pub backend_dial_timeout: Duration,
    /// KEP-2025: what agents may reach in the control plane.
    pub reverse: ReverseOptions,
    /// Dial admission limits and the overload watermark (in bytes).
    pub limits: konn_protocol::server::limits::LimitsConfig,
    /// `--clusters-config`: many clusters on this server.
    pub clusters_config: Option<PathBuf>,
    /// `--connect-header-timeout`; `None`: no deadline.
    pub connect_header_timeout: Option<Duration>,
    /// konn's engine flags.
    pub engine: EngineFlags,
    /// The audit log and connection metrics (konn).
    pub observe: ObserveOptions,
    /// Things accepted with a caveat; the binary logs each as a warning.
    pub warnings: Vec<String>,
}

/// How the start-up sequence (`konn_core::app`) reads and checks them;
/// `ServerOptions::from_flags` reads and validates every flag of a parsed
/// [`command`].
impl Options for ServerOptions {
    type Error = Error;

    fn validate(flags: &FlagSet, engine: EngineFlags) -> Result<Self, Error> {
        ServerFlags::from_flags(flags).validate(engine)
    }

    fn warnings(&self) -> &[String] {
        &self.warnings
    }

    // Token authentication and the lease controller are supported
    // (crate::kube); nothing is refused at the moment.
    fn unsupported_features(&self) -> Vec<Unsupported> {
        Vec::new()
    }
}
