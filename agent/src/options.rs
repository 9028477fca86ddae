//! proxy-agent's command line: every flag of upstream proxy-agent v0.36.0
//! (same names, types, defaults and validation), klog's flags, and konn's
//! own flags in a separate `--help` section.
//!
//! Flow, as in upstream's `main.go` and `Run`:
//! 1. [`command`] builds the [`Command`]; `--agent-id` defaults to
//!    `$PROXY_AGENT_ID`, else a random UUID.
//! 2. The binary parses the arguments and sets up logging from the klog
//!    flags.
//! 3. [`AgentFlags::from_flags`] reads the raw values (upstream's
//!    `GrpcProxyAgentOptions`); [`AgentFlags::validate`] applies upstream's
//!    `Validate()` rules in upstream's order and returns the typed
//!    [`AgentOptions`].
//! 4. [`AgentOptions::unsupported_features`] lists what konn cannot do yet
//!    (nothing at the moment); the binary
//!    refuses to start when it is not empty.
//!
//! Deliberate differences, all documented in `docs/FLAGS.md`:
//! - Ports above 65535 are refused (upstream accepts any positive `int` and
//!   fails later, or keeps running without that listener).
//! - `--sync-interval` and `--probe-interval` must be greater than 0 and
//!   `--sync-interval-cap` and `--keepalive-time` must not be negative
//!   (upstream would spin or hand grpc-go a negative time).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use konn_core::app::Options;
pub use konn_core::cli::common::{Listener, Unsupported};
use konn_core::cli::common::{
    channel_size, check_exists, check_pair, check_profiling, default_id, non_empty_path,
    non_negative, parse_labels, positive, register_profiling,
};
use konn_core::cli::engine::EngineFlags;
use konn_core::cli::{Command, FlagSet, GoDuration};
use konn_core::log::LogConfig;
use konn_frames::url;

use crate::Error;

/// The program name shown in `--help`.
pub const PROGRAM: &str = "proxy-agent";

/// The description at the top of `--help`.
pub const ABOUT: &str = "konn proxy-agent: a drop-in replacement for the Konnectivity proxy-agent. \
It connects to the proxy-servers and dials the destinations they ask for on this side of the network.";

/// Environment variable that supplies `--agent-id`'s default.
pub const AGENT_ID_ENV: &str = "PROXY_AGENT_ID";

/// Identifier types the agent may announce (`--agent-identifiers` keys).
pub const IDENTIFIER_TYPES: [&str; 5] = ["ipv4", "ipv6", "host", "cidr", "default-route"];

/// Builds proxy-agent's command line, reading `PROXY_AGENT_ID` from the
/// process environment.
pub fn command() -> Command {
    command_with_env(|k| std::env::var(k).ok())
}

/// Builds proxy-agent's command line with `env` as the environment.
pub fn command_with_env(env: impl Fn(&str) -> Option<String>) -> Command {
    let mut cmd = Command::new(PROGRAM, ABOUT);
    let flags = cmd.flags_mut();
    AgentFlags::defaults(&env).register(flags);
    LogConfig::register(flags);
    EngineFlags::register(flags);
    cmd
}

/// The raw flag values, one field per upstream flag (upstream's
/// `GrpcProxyAgentOptions`), Go-typed until
/// [`validate`](Self::validate) checks them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentFlags {
    /// `--agent-cert`.
    pub agent_cert: String,
    /// `--agent-key`.
    pub agent_key: String,
    /// `--ca-cert`.
    pub ca_cert: String,
    /// `--proxy-server-host`.
    pub proxy_server_host: String,
    /// `--proxy-server-port`.
    pub proxy_server_port: i64,
    /// `--alpn-proto`.
    pub alpn_protos: Vec<String>,
    /// `--health-server-host`.
    pub health_server_host: String,
    /// `--health-server-port`.
    pub health_server_port: i64,
    /// `--admin-server-port`.
    pub admin_server_port: i64,
    /// `--admin-bind-address`.
    pub admin_bind_address: String,
    /// `--enable-profiling`.
    pub enable_profiling: bool,
    /// `--enable-contention-profiling`.
    pub enable_contention_profiling: bool,
    /// `--agent-id`.
    pub agent_id: String,
    /// `--agent-identifiers`.
    pub agent_identifiers: String,
    /// `--sync-interval`.
    pub sync_interval: GoDuration,
    /// `--probe-interval`.
    pub probe_interval: GoDuration,
    /// `--sync-interval-cap`.
    pub sync_interval_cap: GoDuration,
    /// `--keepalive-time`.
    pub keepalive_time: GoDuration,
    /// `--service-account-token-path`.
    pub service_account_token_path: String,
    /// `--warn-on-channel-limit`.
    pub warn_on_channel_limit: bool,
    /// `--sync-forever`.
    pub sync_forever: bool,
    /// `--xfr-channel-size`.
    pub xfr_channel_size: i64,
    /// `--count-server-leases`.
    pub count_server_leases: bool,
    /// `--lease-namespace`.
    pub lease_namespace: String,
    /// `--lease-label`.
    pub lease_label: String,
    /// `--server-count-source`.
    pub server_count_source: String,
    /// `--kubeconfig`.
    pub kubeconfig: String,
    /// `--kube-api-content-type`.
    pub kube_api_content_type: String,
    /// `--target` (konn: KEP-2025 node-to-control-plane listeners).
    pub target: Vec<String>,
    /// `--bind-address` (konn: KEP-2025).
    pub bind_address: String,
    /// `--allowed-destination-cidrs` (konn).
    pub allowed_destination_cidrs: Vec<String>,
    /// `--drain-timeout` (konn): after the first signal, exit once no
    /// connection is open or this long has passed. Zero: wait for a second
    /// signal, as upstream.
    pub drain_timeout: GoDuration,
}

impl AgentFlags {
    /// Upstream's defaults (`NewGrpcProxyAgentOptions`). `--agent-id` comes
    /// from `env("PROXY_AGENT_ID")` when set and non-empty, else a random
    /// UUID.
    pub fn defaults(env: &dyn Fn(&str) -> Option<String>) -> Self {
        let agent_id = default_id(env, AGENT_ID_ENV);
        Self {
            agent_cert: String::new(),
            agent_key: String::new(),
            ca_cert: String::new(),
            proxy_server_host: "127.0.0.1".to_owned(),
            proxy_server_port: 8091,
            alpn_protos: Vec::new(),
            health_server_host: String::new(),
            health_server_port: 8093,
            admin_server_port: 8094,
            admin_bind_address: "127.0.0.1".to_owned(),
            enable_profiling: false,
            enable_contention_profiling: false,
            agent_id,
            agent_identifiers: String::new(),
            sync_interval: GoDuration::from_secs(1),
            probe_interval: GoDuration::from_secs(1),
            sync_interval_cap: GoDuration::from_secs(10),
            keepalive_time: GoDuration::from_secs(3600),
            service_account_token_path: String::new(),
            warn_on_channel_limit: false,
            sync_forever: false,
            xfr_channel_size: 150,
            count_server_leases: false,
            lease_namespace: "kube-system".to_owned(),
            lease_label: "k8s-app=konnectivity-server".to_owned(),
            server_count_source: "default".to_owned(),
            kubeconfig: String::new(),
            kube_api_content_type: "application/vnd.kubernetes.protobuf".to_owned(),
            target: Vec::new(),
            bind_address: String::new(),
            allowed_destination_cidrs: Vec::new(),
            drain_timeout: GoDuration::from_std(Duration::ZERO),
        }
    }

    /// Registers upstream's flags with `self`'s values as defaults.
    pub fn register(&self, f: &mut FlagSet) {
        f.add_string(
            "agent-cert",
            &self.agent_cert,
            "Client certificate (PEM) the agent presents to proxy-servers (mTLS). Needs \
             --agent-key.",
        );
        f.add_string(
            "agent-key",
            &self.agent_key,
            "Private key (PEM) of --agent-cert.",
        );
        f.add_string(
            "ca-cert",
            &self.ca_cert,
            "CA bundle (PEM) that proxy-servers' certificates must chain to.",
        );
        f.add_string(
            "proxy-server-host",
            &self.proxy_server_host,
            "Host name or address of the proxy-server (or its load balancer); also the TLS server \
             name when --agent-cert is set.",
        );
        f.add_int(
            "proxy-server-port",
            self.proxy_server_port,
            "Agent port of the proxy-server.",
        );
        let alpn: Vec<&str> = self.alpn_protos.iter().map(String::as_str).collect();
        f.add_string_slice(
            "alpn-proto",
            &alpn,
            "Comma-separated ALPN protocols offered before h2 when connecting, to tell proxy \
             traffic apart from apiserver traffic on a shared address.",
        );
        f.add_string(
            "health-server-host",
            &self.health_server_host,
            "Address the health server binds to (no port). Empty: all interfaces.",
        );
        f.add_int(
            "health-server-port",
            self.health_server_port,
            "Port of the health server (/healthz, /readyz, /metrics).",
        );
        f.add_int(
            "admin-server-port",
            self.admin_server_port,
            "Port of the admin server (/metrics redirects to the health port).",
        );
        f.add_string(
            "admin-bind-address",
            &self.admin_bind_address,
            "Address the admin server binds to.",
        );
        register_profiling(f, self.enable_profiling, self.enable_contention_profiling);
        f.add_string(
            "agent-id",
            &self.agent_id,
            "This agent's ID, sent to proxy-servers. Defaults to $PROXY_AGENT_ID, else a random \
             UUID; the flag wins over the variable.",
        );
        f.add_duration(
            "sync-interval",
            self.sync_interval,
            "How often the agent checks that it holds a tunnel to every proxy-server (first and \
             steady interval).",
        );
        f.add_duration(
            "probe-interval",
            self.probe_interval,
            "How often the agent checks that its tunnels are still ready.",
        );
        f.add_duration(
            "sync-interval-cap",
            self.sync_interval_cap,
            "Longest interval --sync-interval backs off to while proxy-servers cannot be reached.",
        );
        f.add_duration(
            "keepalive-time",
            self.keepalive_time,
            "Idle time after which the agent pings a tunnel's connection. Below 30s upstream \
             servers answer with GOAWAY too_many_pings.",
        );
        f.add_string(
            "service-account-token-path",
            &self.service_account_token_path,
            "File with a ServiceAccount token sent to proxy-servers as a bearer token (read again \
             on every connect).",
        );
        f.add_string(
            "agent-identifiers",
            &self.agent_identifiers,
            "URL-encoded identifiers proxy-servers use to pick this agent, e.g. \
             host=node1&ipv4=10.0.0.5&cidr=10.0.0.0/24&default-route=true. Keys: ipv4, ipv6, host, \
             cidr, default-route.",
        );
        f.add_bool(
            "warn-on-channel-limit",
            self.warn_on_channel_limit,
            "Log a warning when a connection's transfer queue is full.",
        );
        f.add_bool(
            "sync-forever",
            self.sync_forever,
            "Keep syncing after reaching the server count, to notice new proxy-servers.",
        );
        f.add_int(
            "xfr-channel-size",
            self.xfr_channel_size,
            "Upstream: capacity of the per-connection packet channels, in packets; must be > 0. \
             konn bounds queues by --conn-queue-size and uses this only for its check.",
        );
        f.add_bool(
            "count-server-leases",
            self.count_server_leases,
            "Learn the number of proxy-servers from their Leases (needs the Kubernetes API).",
        );
        f.add_string(
            "lease-namespace",
            &self.lease_namespace,
            "Namespace of the proxy-server Leases.",
        );
        f.add_string(
            "lease-label-selector",
            &self.lease_label,
            "Label selector of the proxy-server Leases to count, k=v[,k=v...].",
        );
        // v0.36.0's name; upstream master keeps it as a hidden alias.
        f.add_string("lease-label", &self.lease_label, "")
            .deprecate("Use --lease-label-selector instead");
        f.add_string(
            "server-count-source",
            &self.server_count_source,
            "How the server count is decided: 'default' (leases when counted, else what servers \
             report) or 'max' (the larger of the two).",
        );
        f.add_string(
            "kubeconfig",
            &self.kubeconfig,
            "kubeconfig for the Kubernetes API client (lease counting). Empty: in-cluster \
             configuration.",
        );
        f.add_string(
            "kube-api-content-type",
            &self.kube_api_content_type,
            "Content type of requests to the Kubernetes API.",
        );
        // konn's own (KEP-2025), in konn's --help section.
        let previous = f.section();
        f.set_section(konn_core::cli::Section::Konn);
        let target: Vec<&str> = self.target.iter().map(String::as_str).collect();
        f.add_string_slice(
            "target",
            &target,
            "konn: node-to-control-plane forwarding (KEP-2025): local_port:dst_host:dst_port. The \
             agent listens on --bind-address:local_port and asks a proxy-server to dial \
             dst_host:dst_port, which must be one of the server's --allowed-destination entries, \
             spelled the same. Repeatable.",
        );
        f.add_string(
            "bind-address",
            &self.bind_address,
            "konn: node-local address the --target listeners bind to (added to lo with host scope \
             when missing and the agent has CAP_NET_ADMIN; removed on exit).",
        );
        let cidrs: Vec<&str> = self
            .allowed_destination_cidrs
            .iter()
            .map(String::as_str)
            .collect();
        f.add_string_slice(
            "allowed-destination-cidrs",
            &cidrs,
            "konn: destinations the control plane may dial through this agent: networks with an \
             optional port or port range (10.0.0.0/8, 10.1.2.3, 10.0.0.0/8:443, \
             10.0.0.0/8:8000-8999, [fd00::/8]:443). A name is resolved once and only its \
             addresses inside the list are connected to; a dial with none is refused (DIAL_RSP \
             error). Repeatable. Empty: every destination, as upstream.",
        );
        f.add_duration(
            "drain-timeout",
            self.drain_timeout,
            "konn: after the first SIGTERM/SIGINT (DRAIN sent, no new connections), keep serving the \
             open connections until they have all ended or this long has passed, then exit. Set it a \
             little below the pod's terminationGracePeriodSeconds so a scale-down does not cut \
             kubectl exec sessions. 0: wait for a second signal, as upstream.",
        );
        f.set_section(previous);
    }

    /// Reads the values registered by [`register`](Self::register).
    pub fn from_flags(f: &FlagSet) -> Self {
        Self {
            agent_cert: f.get_string("agent-cert"),
            agent_key: f.get_string("agent-key"),
            ca_cert: f.get_string("ca-cert"),
            proxy_server_host: f.get_string("proxy-server-host"),
            proxy_server_port: f.get_int("proxy-server-port"),
            alpn_protos: f.get_string_slice("alpn-proto"),
            health_server_host: f.get_string("health-server-host"),
            health_server_port: f.get_int("health-server-port"),
            admin_server_port: f.get_int("admin-server-port"),
            admin_bind_address: f.get_string("admin-bind-address"),
            enable_profiling: f.get_bool("enable-profiling"),
            enable_contention_profiling: f.get_bool("enable-contention-profiling"),
            agent_id: f.get_string("agent-id"),
            agent_identifiers: f.get_string("agent-identifiers"),
            sync_interval: f.get_duration("sync-interval"),
            probe_interval: f.get_duration("probe-interval"),
            sync_interval_cap: f.get_duration("sync-interval-cap"),
            keepalive_time: f.get_duration("keepalive-time"),
            service_account_token_path: f.get_string("service-account-token-path"),
            warn_on_channel_limit: f.get_bool("warn-on-channel-limit"),
            sync_forever: f.get_bool("sync-forever"),
            xfr_channel_size: f.get_int("xfr-channel-size"),
            count_server_leases: f.get_bool("count-server-leases"),
            lease_namespace: f.get_string("lease-namespace"),
            // The alias counts only when the new name was not given.
            lease_label: if f.changed("lease-label") && !f.changed("lease-label-selector") {
                f.get_string("lease-label")
            } else {
                f.get_string("lease-label-selector")
            },
            server_count_source: f.get_string("server-count-source"),
            kubeconfig: f.get_string("kubeconfig"),
            kube_api_content_type: f.get_string("kube-api-content-type"),
            target: f.get_string_slice("target"),
            bind_address: f.get_string("bind-address"),
            allowed_destination_cidrs: f.get_string_slice("allowed-destination-cidrs"),
            drain_timeout: f.get_duration("drain-timeout"),
        }
    }

    /// Upstream's `Validate()`, in its order, then konn's own checks; on
    /// success the typed options.
    ///
    /// # Errors
    ///
    /// The first rule broken.
    pub fn validate(&self, engine: EngineFlags) -> Result<AgentOptions, Error> {
        check_pair(
            ("agent-key", &self.agent_key),
            ("agent-cert", &self.agent_cert),
        )?;
        check_pair(
            ("agent-cert", &self.agent_cert),
            ("agent-key", &self.agent_key),
        )?;
        check_exists("ca-cert", &self.ca_cert)?;
        for (flag, port) in [
            ("proxy-server-port", self.proxy_server_port),
            ("health-server-port", self.health_server_port),
            ("admin-server-port", self.admin_server_port),
        ] {
            if port <= 0 {
                return Err(Error::PortNotPositive { flag, port });
            }
        }
        let xfr_channel_size = channel_size(self.xfr_channel_size)?;
        check_profiling(self.enable_profiling, self.enable_contention_profiling)?;
        if self.sync_interval > self.sync_interval_cap {
            return Err(Error::SyncIntervalAboveCap {
                interval: self.sync_interval,
                cap: self.sync_interval_cap,
            });
        }
        check_exists(
            "service-account-token-path",
            &self.service_account_token_path,
        )?;
        parse_agent_identifiers(&self.agent_identifiers)?;
        check_exists("kubeconfig", &self.kubeconfig)?;
        let lease_selector = if self.count_server_leases {
            Some(parse_labels("lease-label", &self.lease_label)?)
        } else {
            None
        };
        let reverse = crate::reverse::ReverseSettings::parse(&self.target, &self.bind_address)
            .map_err(Error::Reverse)?;
        let allowed_destinations = crate::allow::AllowList::parse(&self.allowed_destination_cidrs)
            .map_err(Error::AllowedDestinations)?;
        let server_count_source = match self.server_count_source.as_str() {
            "" | "default" => ServerCountSource::Default,
            "max" => ServerCountSource::Max,
            other => return Err(Error::ServerCountSource(other.to_owned())),
        };

        // konn's own checks.
        let proxy_server_port = port_u16("proxy-server-port", self.proxy_server_port)?;
        let health_port = port_u16("health-server-port", self.health_server_port)?;
        let admin_port = port_u16("admin-server-port", self.admin_server_port)?;
        let sync_interval = positive("sync-interval", self.sync_interval)?;
        let probe_interval = positive("probe-interval", self.probe_interval)?;
        let sync_interval_cap = non_negative("sync-interval-cap", self.sync_interval_cap)?;
        let keepalive_time = non_negative("keepalive-time", self.keepalive_time)?;
        let drain_timeout = non_negative("drain-timeout", self.drain_timeout)?;

        let mut warnings = Vec::new();
        if self.enable_profiling {
            warnings.push(
                "--enable-profiling: konn has no Go pprof endpoints; the admin port serves the /metrics redirect only"
                    .to_owned(),
            );
        }
        if !keepalive_time.is_zero() && keepalive_time < Duration::from_secs(30) {
            warnings.push(format!(
                "--keepalive-time={} is below the 30s upstream proxy-servers allow; they will close the tunnel (GOAWAY too_many_pings)",
                self.keepalive_time
            ));
        }

        let client_cert = (!self.agent_cert.is_empty()).then(|| ClientCert {
            cert: PathBuf::from(&self.agent_cert),
            key: PathBuf::from(&self.agent_key),
        });
        Ok(AgentOptions {
            proxy_server_host: self.proxy_server_host.clone(),
            proxy_server_port,
            alpn_protos: self.alpn_protos.clone(),
            keepalive_time,
            ca_cert: non_empty_path(&self.ca_cert),
            client_cert,
            service_account_token_path: non_empty_path(&self.service_account_token_path),
            agent_id: self.agent_id.clone(),
            agent_identifiers: self.agent_identifiers.clone(),
            sync_interval,
            sync_interval_cap,
            probe_interval,
            sync_forever: self.sync_forever,
            server_count_source,
            lease_counting: lease_selector.map(|selector| LeaseCounting {
                namespace: self.lease_namespace.clone(),
                selector,
            }),
            kubeconfig: non_empty_path(&self.kubeconfig),
            kube_api_content_type: self.kube_api_content_type.clone(),
            health: Listener {
                bind_address: self.health_server_host.clone(),
                port: health_port,
            },
            admin: Listener {
                bind_address: self.admin_bind_address.clone(),
                port: admin_port,
            },
            enable_profiling: self.enable_profiling,
            enable_contention_profiling: self.enable_contention_profiling,
            xfr_channel_size,
            warn_on_channel_limit: self.warn_on_channel_limit,
            reverse,
            allowed_destinations,
            drain_timeout: (!drain_timeout.is_zero()).then_some(drain_timeout),
            engine,
            warnings,
        })
    }
}

/// How the agent decides how many proxy-servers to connect to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerCountSource {
    /// Leases when `--count-server-leases`, else the count servers report.
    Default,
    /// The larger of the two.
    Max,
}

/// `--agent-cert` and `--agent-key`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientCert {
    /// Certificate chain (PEM).
    pub cert: PathBuf,
    /// Private key (PEM).
    pub key: PathBuf,
}

/// Lease counting (`--count-server-leases`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseCounting {
    /// `--lease-namespace`.
    pub namespace: String,
    /// `--lease-label`, parsed.
    pub selector: BTreeMap<String, String>,
}

/// proxy-agent's validated, typed options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentOptions {
    /// `--proxy-server-host`.
    pub proxy_server_host: String,
    /// `--proxy-server-port`.
    pub proxy_server_port: u16,
    /// `--alpn-proto`, offered before `h2`. Exactly pflag's list: a
    /// manifest that passes the rendered default `--alpn-proto=[]` gets the
    /// one protocol `[]`, as upstream does.
    pub alpn_protos: Vec<String>,
    /// `--keepalive-time`; zero: no keepalive pings (grpc-go's default).
    pub keepalive_time: Duration,
    /// `--ca-cert` (upstream cannot connect without it).
    pub ca_cert: Option<PathBuf>,
    /// `--agent-cert` and `--agent-key` (both or neither).
    pub client_cert: Option<ClientCert>,
    /// `--service-account-token-path` (the file exists; read on every
    /// connect, never logged).
    pub service_account_token_path: Option<PathBuf>,
    /// `--agent-id`.
    pub agent_id: String,
    /// `--agent-identifiers`, URL-encoded as given (keys checked); sent to
    /// servers verbatim.
    pub agent_identifiers: String,
    /// `--sync-interval` (> 0, ≤ the cap).
    pub sync_interval: Duration,
    /// `--sync-interval-cap`.
    pub sync_interval_cap: Duration,
    /// `--probe-interval` (> 0).
    pub probe_interval: Duration,
    /// `--sync-forever`.
    pub sync_forever: bool,
    /// `--server-count-source`.
    pub server_count_source: ServerCountSource,
    /// Lease counting, when enabled.
    pub lease_counting: Option<LeaseCounting>,
    /// `--kubeconfig`; `None`: in-cluster configuration.
    pub kubeconfig: Option<PathBuf>,
    /// `--kube-api-content-type`.
    pub kube_api_content_type: String,
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
    /// `--warn-on-channel-limit`.
    pub warn_on_channel_limit: bool,
    /// `--target` and `--bind-address` (KEP-2025).
    pub reverse: crate::reverse::ReverseSettings,
    /// `--allowed-destination-cidrs`.
    pub allowed_destinations: crate::allow::AllowList,
    /// `--drain-timeout`: `None` waits for a second signal (upstream).
    pub drain_timeout: Option<Duration>,
    /// konn's engine flags.
    pub engine: EngineFlags,
    /// Things accepted with a caveat; the binary logs each as a warning.
    pub warnings: Vec<String>,
}

/// How the start-up sequence (`konn_core::app`) reads and checks them;
/// `AgentOptions::from_flags` reads and validates every flag of a parsed
/// [`command`].
impl Options for AgentOptions {
    type Error = Error;

    fn validate(flags: &FlagSet, engine: EngineFlags) -> Result<Self, Error> {
        AgentFlags::from_flags(flags).validate(engine)
    }

    fn warnings(&self) -> &[String] {
        &self.warnings
    }

    fn unsupported_features(&self) -> Vec<Unsupported> {
        // Lease counting is supported (crate::leases); nothing is refused
        // at the moment.
        Vec::new()
    }
}

/// Go's `net/url.ParseQuery` (`konn_frames::url::parse_query`: settings in
/// input order, `%XX` and `+` decoded, Go's rules for which error is
/// reported), then every key must be an identifier type the agent knows.
/// Decoded bytes that are not UTF-8 are replaced (only keys are compared,
/// and valid keys are ASCII).
///
/// # Errors
///
/// [`Error::AgentIdentifiers`] with Go's wording of the problem.
pub fn parse_agent_identifiers(query: &str) -> Result<Vec<(String, String)>, Error> {
    let settings = url::parse_query(query).map_err(|e| Error::AgentIdentifiers(e.to_string()))?;
    let pairs: Vec<(String, String)> = settings
        .iter()
        .map(|(k, v)| {
            (
                String::from_utf8_lossy(k).into_owned(),
                String::from_utf8_lossy(v).into_owned(),
            )
        })
        .collect();
    if let Some((key, _)) = pairs
        .iter()
        .find(|(k, _)| !IDENTIFIER_TYPES.contains(&k.as_str()))
    {
        return Err(Error::AgentIdentifiers(format!(
            "unknown identifier type {key:?} (known: {})",
            IDENTIFIER_TYPES.join(", ")
        )));
    }
    Ok(pairs)
}

fn port_u16(flag: &'static str, port: i64) -> Result<u16, Error> {
    u16::try_from(port).map_err(|_| Error::PortTooLarge { flag, port })
}
