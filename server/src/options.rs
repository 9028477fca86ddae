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
pub use konn_core::cli::common::{Listener, Unsupported};
use konn_core::cli::common::{
    channel_size, check_exists, check_pair, check_profiling, count, default_id, non_empty_path,
    non_negative, parse_labels, register_profiling,
};
use konn_core::cli::engine::EngineFlags;
use konn_core::cli::{Command, FlagSet, GoDuration};
use konn_core::io::tls::TlsMinVersion;
use konn_core::io::tls::config::default_provider;
use konn_core::io::tls::suites::cipher_suites_from_go_names;
use konn_core::log::LogConfig;

use crate::Error;

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

/// Highest port upstream accepts; above it is the ephemeral range.
const MAX_PORT: i64 = 49_151;
/// Ports below this are refused (privileged range).
const MIN_PORT: i64 = 1024;

/// Upstream's `--mode` values.
const MODE_GRPC: &str = "grpc";
const MODE_HTTP_CONNECT: &str = "http-connect";

/// Go's `tls.CipherSuites()` names (Go 1.26, the toolchain upstream
/// v0.36.0 builds with): the only `--cipher-suites` values upstream
/// accepts. Go's insecure suites and the legacy ChaCha20 aliases are
/// refused.
const GO_SECURE_CIPHER_SUITES: [&str; 13] = [
    "TLS_AES_128_GCM_SHA256",
    "TLS_AES_256_GCM_SHA384",
    "TLS_CHACHA20_POLY1305_SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
];

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
        }
    }

    /// Registers upstream's flags with `self`'s values as defaults.
    pub fn register(&self, f: &mut FlagSet) {
        f.add_string(
            "server-cert",
            &self.server_cert,
            "Certificate (PEM) the TCP frontend serves to kube-apiserver. Needs --server-key.",
        );
        f.add_string(
            "server-key",
            &self.server_key,
            "Private key (PEM) of --server-cert.",
        );
        f.add_string(
            "server-ca-cert",
            &self.server_ca_cert,
            "CA bundle (PEM) that kube-apiserver's client certificates must chain to. Required \
             when the frontend listens on TCP; not allowed with --uds-name.",
        );
        f.add_string(
            "cluster-cert",
            &self.cluster_cert,
            "Certificate (PEM) the agent port serves to proxy-agents.",
        );
        f.add_string(
            "cluster-key",
            &self.cluster_key,
            "Private key (PEM) of --cluster-cert.",
        );
        f.add_string(
            "cluster-ca-cert",
            &self.cluster_ca_cert,
            "CA bundle (PEM) that agents' client certificates must chain to (agent mTLS). Without \
             it and without token authentication, any TLS client can register as an agent.",
        );
        f.add_string(
            "mode",
            &self.mode,
            "Frontend protocol: 'grpc' (konnectivity-client) or 'http-connect' (HTTP CONNECT).",
        );
        f.add_string(
            "uds-name",
            &self.uds_name,
            "Unix socket path for the frontend. Empty: the frontend listens on TCP \
             (--server-port).",
        );
        f.add_bool(
            "delete-existing-uds-file",
            self.delete_existing_uds_file,
            "Remove a leftover socket file at --uds-name before listening.",
        );
        f.add_int(
            "server-port",
            self.server_port,
            "TCP port of the frontend (kube-apiserver side). Must be 0 with --uds-name.",
        );
        f.add_string(
            "server-bind-address",
            &self.server_bind_address,
            "Address the TCP frontend binds to. Empty: all interfaces.",
        );
        f.add_int(
            "agent-port",
            self.agent_port,
            "Port proxy-agents connect to (gRPC over TLS).",
        );
        f.add_string(
            "agent-bind-address",
            &self.agent_bind_address,
            "Address the agent port binds to. Empty: all interfaces.",
        );
        f.add_int(
            "admin-port",
            self.admin_port,
            "Port of the admin server (/metrics; profiling endpoints upstream).",
        );
        f.add_string(
            "admin-bind-address",
            &self.admin_bind_address,
            "Address the admin server binds to.",
        );
        f.add_int(
            "health-port",
            self.health_port,
            "Port of the health server (/healthz, /readyz, /metrics).",
        );
        f.add_string(
            "health-bind-address",
            &self.health_bind_address,
            "Address the health server binds to. Empty: all interfaces.",
        );
        f.add_duration(
            "keepalive-time",
            self.keepalive_time,
            "Idle time after which the agent port pings an agent's connection.",
        );
        f.add_duration(
            "frontend-keepalive-time",
            self.frontend_keepalive_time,
            "Idle time after which the gRPC frontend pings kube-apiserver's connection.",
        );
        register_profiling(f, self.enable_profiling, self.enable_contention_profiling);
        f.add_string(
            "server-id",
            &self.server_id,
            "This server's ID, sent to agents. Defaults to $PROXY_SERVER_ID, else a random UUID; \
             the flag wins over the variable.",
        );
        f.add_int(
            "server-count",
            self.server_count,
            "Number of proxy-server instances agents should connect to (1 unless the servers run \
             HA).",
        );
        f.add_string(
            "agent-namespace",
            &self.agent_namespace,
            "Agent token authentication: the agents' ServiceAccount namespace (with \
             --agent-service-account, --authentication-audience, --kubeconfig).",
        );
        f.add_string(
            "agent-service-account",
            &self.agent_service_account,
            "Agent token authentication: the agents' ServiceAccount name (with --agent-namespace, \
             --authentication-audience, --kubeconfig).",
        );
        f.add_string(
            "kubeconfig",
            &self.kubeconfig,
            "kubeconfig for the Kubernetes API client (token reviews, leases). Empty: in-cluster \
             configuration.",
        );
        f.add_float32(
            "kubeconfig-qps",
            self.kubeconfig_qps,
            "Queries per second allowed to the Kubernetes API client. 0: client default.",
        );
        f.add_int(
            "kubeconfig-burst",
            self.kubeconfig_burst,
            "Burst allowed to the Kubernetes API client. 0: client default.",
        );
        f.add_string(
            "kube-api-content-type",
            &self.kube_api_content_type,
            "Content type of requests to the Kubernetes API.",
        );
        f.add_string(
            "authentication-audience",
            &self.authentication_audience,
            "Agent token authentication: the audience the agents' tokens must carry (with \
             --agent-namespace, --agent-service-account, --kubeconfig).",
        );
        f.add_string(
            "proxy-strategies",
            &self.proxy_strategies,
            "Ordered, comma-separated strategies for choosing an agent: default (any), destHost \
             (an agent that registered the destination host), defaultRoute (an agent that \
             registered default-route). The first that finds an agent wins.",
        );
        let cipher_suites: Vec<&str> = self.cipher_suites.iter().map(String::as_str).collect();
        f.add_string_slice(
            "cipher-suites",
            &cipher_suites,
            "Comma-separated TLS 1.2 cipher suites (Go names). Empty: the defaults. No effect on \
             TLS 1.3.",
        );
        f.add_string(
            "tls-min-version",
            &self.tls_min_version,
            "Lowest TLS version accepted: VersionTLS10, VersionTLS11, VersionTLS12 or \
             VersionTLS13. Empty: VersionTLS12.",
        );
        f.add_int(
            "xfr-channel-size",
            self.xfr_channel_size,
            "Upstream: capacity of the per-stream packet channels, in packets; must be > 0. konn \
             bounds queues by --conn-queue-size and uses this only for its check.",
        );
        f.add_bool(
            "enable-lease-controller",
            self.enable_lease_controller,
            "Publish this server's Lease and remove expired ones, so agents can count servers \
             (needs the Kubernetes API).",
        );
        f.add_string(
            "lease-namespace",
            &self.lease_namespace,
            "Namespace of the server Leases.",
        );
        f.add_string(
            "lease-label",
            &self.lease_label,
            "Labels put on the server Leases, k=v[,k=v...].",
        );
        f.add_duration(
            "graceful-shutdown-timeout",
            self.graceful_shutdown_timeout,
            "On SIGTERM, let open connections finish for up to this long before stopping. 0: stop \
             at once.",
        );
        f.add_duration(
            "backend-dial-timeout",
            self.backend_dial_timeout,
            "Limit on sending a DIAL_REQ to an agent and receiving its DIAL_RSP. 0: konn's default \
             bound of 30s (upstream: no limit).",
        );
        f.add_bool(
            "warn-on-channel-limit",
            self.warn_on_channel_limit,
            "No effect.",
        )
        .deprecate(WARN_ON_CHANNEL_LIMIT_DEPRECATION);
        // konn's own (KEP-2025), in konn's --help section.
        let previous = f.section();
        f.set_section(konn_core::cli::Section::Konn);
        let allowed: Vec<&str> = self
            .allowed_destination
            .iter()
            .map(String::as_str)
            .collect();
        f.add_string_slice(
            "allowed-destination",
            &allowed,
            "konn: a control-plane destination host:port that agents may reach from the node network \
             (KEP-2025, proxy-agent --target). Agents must spell it exactly so; the server dials what \
             is configured here, never the agent's text. Repeatable. Empty: every reverse dial is \
             refused.",
        );
        f.add_int(
            "reverse-max-per-agent",
            self.reverse_max_per_agent,
            "konn: reverse dials in flight plus reverse connections open, per agent tunnel.",
        );
        f.add_int(
            "reverse-dial-rate",
            self.reverse_dial_rate,
            "konn: new reverse dials per second per agent tunnel (also the burst an idle agent may \
             start at once).",
        );
        f.add_duration(
            "reverse-dial-timeout",
            self.reverse_dial_timeout,
            "konn: bound on resolving and connecting one --allowed-destination.",
        );
        f.add_string(
            "clusters-config",
            &self.clusters_config,
            "konn: a YAML file of clusters served by this one server (docs/MULTI-CLUSTER.md): each \
             with its own frontend, its agents chosen by the SNI they send on the agent port and \
             admitted only with that cluster's credentials, its own strategies, limits and allowed \
             destinations. Re-read on SIGHUP and when it changes. Empty: one cluster, from the flags.",
        );
        f.set_section(previous);
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
        }
    }

    /// Token authentication is on when any of its three flags is set.
    fn uses_token_auth(&self) -> bool {
        !self.agent_namespace.is_empty()
            || !self.agent_service_account.is_empty()
            || !self.authentication_audience.is_empty()
    }

    /// Upstream's `Validate()`, in its order, then konn's own checks; on
    /// success the typed options.
    ///
    /// # Errors
    ///
    /// The first rule broken.
    pub fn validate(&self, engine: EngineFlags) -> Result<ServerOptions, Error> {
        // Certificate files: key and cert come in pairs; files must exist.
        check_pair(
            ("server-key", &self.server_key),
            ("server-cert", &self.server_cert),
        )?;
        check_pair(
            ("server-cert", &self.server_cert),
            ("server-key", &self.server_key),
        )?;
        check_exists("server-ca-cert", &self.server_ca_cert)?;
        check_pair(
            ("cluster-key", &self.cluster_key),
            ("cluster-cert", &self.cluster_cert),
        )?;
        check_pair(
            ("cluster-cert", &self.cluster_cert),
            ("cluster-key", &self.cluster_key),
        )?;
        check_exists("cluster-ca-cert", &self.cluster_ca_cert)?;

        let mode = match self.mode.as_str() {
            MODE_GRPC => Mode::Grpc,
            MODE_HTTP_CONNECT => Mode::HttpConnect,
            other => return Err(Error::InvalidMode(other.to_owned())),
        };
        let uds = !self.uds_name.is_empty();
        if uds {
            if self.server_port != 0 {
                return Err(Error::UdsPortNotZero(self.server_port));
            }
            for (flag, value) in [
                ("server-key", &self.server_key),
                ("server-cert", &self.server_cert),
                ("server-ca-cert", &self.server_ca_cert),
            ] {
                if !value.is_empty() {
                    return Err(Error::TlsWithUds(flag));
                }
            }
        } else if self.server_ca_cert.is_empty() && self.clusters_config.is_empty() {
            return Err(Error::TcpFrontendNeedsCa);
        }
        if !self.clusters_config.is_empty() {
            self.check_clusters_config()?;
        }

        let ports = [
            ("server-port", self.server_port),
            ("agent-port", self.agent_port),
            ("admin-port", self.admin_port),
            ("health-port", self.health_port),
        ];
        for (flag, port) in ports {
            if port > MAX_PORT {
                return Err(Error::EphemeralPort { flag, port });
            }
        }
        for (flag, port) in ports {
            // A UDS frontend has no port (it is 0, checked above).
            if port < MIN_PORT && !(flag == "server-port" && uds) {
                return Err(Error::ReservedPort { flag, port });
            }
        }

        check_profiling(self.enable_profiling, self.enable_contention_profiling)?;

        let token_auth = self.uses_token_auth();
        if token_auth {
            if !self.cluster_ca_cert.is_empty() {
                return Err(Error::TokenAuthWithClusterCa);
            }
            for (flag, value) in [
                ("agent-namespace", &self.agent_namespace),
                ("agent-service-account", &self.agent_service_account),
                ("authentication-audience", &self.authentication_audience),
            ] {
                if value.is_empty() {
                    return Err(Error::TokenAuthIncomplete(flag));
                }
            }
        }
        check_exists("kubeconfig", &self.kubeconfig)?;

        let proxy_strategies = parse_proxy_strategies(&self.proxy_strategies)?;

        let xfr_channel_size = channel_size(self.xfr_channel_size)?;

        let mut warnings = Vec::new();
        let tls_min_version = match self.tls_min_version.as_str() {
            "" | "VersionTLS10" | "VersionTLS11" | "VersionTLS12" | "VersionTLS13" => {
                let (version, warning) = TlsMinVersion::from_go_name(&self.tls_min_version)
                    .map_err(|_| Error::UnknownTlsVersion(self.tls_min_version.clone()))?;
                if let Some(w) = warning {
                    warnings.push(format!(
                        "--tls-min-version={} is below TLS 1.2 and insecure (RFC 8996); {w}",
                        self.tls_min_version
                    ));
                }
                version
            }
            other => return Err(Error::UnknownTlsVersion(other.to_owned())),
        };
        check_cipher_suites(&self.cipher_suites)?;

        let lease_labels = if self.enable_lease_controller {
            Some(parse_labels("lease-label", &self.lease_label)?)
        } else {
            None
        };

        let graceful_shutdown_timeout =
            non_negative("graceful-shutdown-timeout", self.graceful_shutdown_timeout)?;
        let backend_dial_timeout = non_negative("backend-dial-timeout", self.backend_dial_timeout)?;

        // konn's own checks (upstream passes these values on unchecked).
        let keepalive_time = non_negative("keepalive-time", self.keepalive_time)?;
        let frontend_keepalive_time =
            non_negative("frontend-keepalive-time", self.frontend_keepalive_time)?;
        let server_count = count("server-count", self.server_count)?;

        if self.enable_profiling {
            warnings.push(
                "--enable-profiling: konn has no Go pprof endpoints; the admin port serves /metrics only".to_owned(),
            );
        }

        let frontend = if uds {
            Frontend::Uds {
                path: PathBuf::from(&self.uds_name),
                delete_existing: self.delete_existing_uds_file,
            }
        } else {
            Frontend::Tcp {
                bind_address: self.server_bind_address.clone(),
                port: port_u16(self.server_port),
                cert: non_empty_path(&self.server_cert),
                key: non_empty_path(&self.server_key),
                client_ca: PathBuf::from(&self.server_ca_cert),
            }
        };
        Ok(ServerOptions {
            mode,
            frontend,
            frontend_keepalive_time,
            agent_listener: AgentListener {
                bind_address: self.agent_bind_address.clone(),
                port: port_u16(self.agent_port),
                cert: non_empty_path(&self.cluster_cert),
                key: non_empty_path(&self.cluster_key),
                client_ca: non_empty_path(&self.cluster_ca_cert),
                keepalive_time,
            },
            tls_min_version,
            cipher_suites: self.cipher_suites.clone(),
            token_auth: token_auth.then(|| TokenAuth {
                namespace: self.agent_namespace.clone(),
                service_account: self.agent_service_account.clone(),
                audience: self.authentication_audience.clone(),
            }),
            kube_client: KubeClient {
                kubeconfig: non_empty_path(&self.kubeconfig),
                qps: self.kubeconfig_qps,
                burst: self.kubeconfig_burst,
                content_type: self.kube_api_content_type.clone(),
            },
            proxy_strategies,
            server_id: self.server_id.clone(),
            server_count,
            lease_controller: lease_labels.map(|labels| LeaseController {
                namespace: self.lease_namespace.clone(),
                labels,
            }),
            health: Listener {
                bind_address: self.health_bind_address.clone(),
                port: port_u16(self.health_port),
            },
            admin: Listener {
                bind_address: self.admin_bind_address.clone(),
                port: port_u16(self.admin_port),
            },
            enable_profiling: self.enable_profiling,
            enable_contention_profiling: self.enable_contention_profiling,
            xfr_channel_size,
            graceful_shutdown_timeout: (!graceful_shutdown_timeout.is_zero())
                .then_some(graceful_shutdown_timeout),
            backend_dial_timeout: if backend_dial_timeout.is_zero() {
                DEFAULT_BACKEND_DIAL_TIMEOUT
            } else {
                backend_dial_timeout
            },
            reverse: self.reverse()?,
            clusters_config: non_empty_path(&self.clusters_config),
            engine,
            warnings,
        })
    }

    /// With `--clusters-config`, the flags that become per-cluster settings
    /// must not be given (the server-wide ones stay: ports, TLS version and
    /// suites, keepalives, --cluster-cert/--cluster-key as the default
    /// serving certificate, strategies and limits as defaults).
    fn check_clusters_config(&self) -> Result<(), Error> {
        check_exists("clusters-config", &self.clusters_config)?;
        for (flag, set) in [
            ("uds-name", !self.uds_name.is_empty()),
            ("server-cert", !self.server_cert.is_empty()),
            ("server-key", !self.server_key.is_empty()),
            ("server-ca-cert", !self.server_ca_cert.is_empty()),
            ("cluster-ca-cert", !self.cluster_ca_cert.is_empty()),
            ("agent-namespace", !self.agent_namespace.is_empty()),
            (
                "agent-service-account",
                !self.agent_service_account.is_empty(),
            ),
            (
                "authentication-audience",
                !self.authentication_audience.is_empty(),
            ),
            ("enable-lease-controller", self.enable_lease_controller),
            ("allowed-destination", !self.allowed_destination.is_empty()),
        ] {
            if set {
                return Err(Error::ClustersConfigConflict(flag));
            }
        }
        Ok(())
    }

    /// The KEP-2025 flags, checked: every `--allowed-destination` parses
    /// (`ReverseSettings::parse`), limits are positive.
    fn reverse(&self) -> Result<ReverseOptions, Error> {
        let positive = |flag: &str, v: i64| {
            usize::try_from(v)
                .ok()
                .filter(|&n| n > 0)
                .ok_or_else(|| Error::Reverse(format!("--{flag}={v}: must be at least 1")))
        };
        let max_per_agent = positive("reverse-max-per-agent", self.reverse_max_per_agent)?;
        let dial_rate = positive("reverse-dial-rate", self.reverse_dial_rate)?;
        let dial_timeout = self
            .reverse_dial_timeout
            .to_std()
            .filter(|d| !d.is_zero())
            .ok_or_else(|| {
                Error::Reverse(format!(
                    "--reverse-dial-timeout={}: must be positive",
                    self.reverse_dial_timeout
                ))
            })?;
        let opts = ReverseOptions {
            allowed_destination: self.allowed_destination.clone(),
            max_per_agent,
            dial_rate,
            dial_timeout,
        };
        opts.settings()?;
        Ok(opts)
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
    /// `--clusters-config`: many clusters on this server.
    pub clusters_config: Option<PathBuf>,
    /// konn's engine flags.
    pub engine: EngineFlags,
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

/// Upstream's `ParseProxyStrategies`: comma-separated, empty entries skipped,
/// at least one.
fn parse_proxy_strategies(s: &str) -> Result<Vec<ProxyStrategy>, Error> {
    let mut out = Vec::new();
    for name in s.split(',').filter(|n| !n.is_empty()) {
        out.push(match name {
            "default" => ProxyStrategy::Default,
            "destHost" => ProxyStrategy::DestHost,
            "defaultRoute" => ProxyStrategy::DefaultRoute,
            other => return Err(Error::UnknownProxyStrategy(other.to_owned())),
        });
    }
    if out.is_empty() {
        return Err(Error::EmptyProxyStrategies);
    }
    Ok(out)
}

/// Upstream accepts the names of Go's secure suites; konn also refuses the
/// ones rustls does not implement.
fn check_cipher_suites(names: &[String]) -> Result<(), Error> {
    for name in names {
        if !GO_SECURE_CIPHER_SUITES.contains(&name.as_str()) {
            return Err(Error::CipherSuite {
                name: name.clone(),
                reason: "no such Go cipher suite, or Go considers it insecure".to_owned(),
            });
        }
    }
    let provider = default_provider();
    for name in names {
        cipher_suites_from_go_names(std::slice::from_ref(name), &provider).map_err(|e| {
            Error::CipherSuite {
                name: name.clone(),
                reason: format!("konn's TLS library does not implement it ({e})"),
            }
        })?;
    }
    Ok(())
}

/// A port already checked to be within 1024..=49151 (or 0 for UDS).
fn port_u16(port: i64) -> u16 {
    u16::try_from(port).unwrap_or(0)
}
