//! The agent's run-time settings, independent of how they were given:
//! [`AgentSettings::from_options`] maps the validated flags (reading the
//! TLS files and resolving the listen hosts now, so a bad one stops the
//! start with one clear line); tests build them with
//! [`AgentSettings::for_tests`]. The server's counterpart is
//! `konn_server::settings`.

use std::fmt;
use std::net::{SocketAddr, ToSocketAddrs};
use std::time::Duration;

use konn_core::http1;
use konn_core::io::driver::DriverConfig;
use konn_core::io::runtime::RuntimeConfig;
use konn_core::io::tls::{ClientTlsOptions, PemSource};
use konn_protocol::agent::sync::{CountSource, SyncConfig};
use konn_protocol::agent::tunnel::TunnelConfig;
use konn_protocol::flow::FlowLimits;
use konn_protocol::h2;

use crate::client::ConnectParams;
use crate::conn::TunnelSettings;
use crate::health::join_host_port;
use crate::options::AgentOptions;

/// Timeout of one destination dial (upstream's `dialTimeout`).
pub const DIAL_TIMEOUT: Duration = Duration::from_secs(5);

/// Timeout of the TCP connect to the server: grpc-go's minimum connect
/// timeout, which bounds upstream's dial of a silent address.
pub const SERVER_CONNECT_TIMEOUT: Duration = Duration::from_secs(20);

/// How long [`AgentHandle::stop`](crate::run::AgentHandle::stop) lets
/// tunnels and endpoints close.
pub const DEFAULT_STOP_TIMEOUT: Duration = Duration::from_secs(5);

/// Stands for "no timeout" where a timer needs a value (a year).
const NEVER: Duration = Duration::from_secs(365 * 24 * 3600);

/// Everything the running agent needs, independent of how it was given
/// ([`AgentSettings::from_options`] maps the flags; tests build it).
#[derive(Clone)]
pub struct AgentSettings {
    /// The server address, TLS, identity, token, keepalive and relay
    /// settings of every tunnel.
    pub connect: ConnectParams,
    /// HTTP/2 receive windows of a tunnel: per stream, per connection.
    pub h2_windows: (u32, u32),
    /// Largest gRPC message accepted from a server.
    pub max_message: u32,
    /// The sync policy.
    pub sync: SyncConfig,
    /// Where the health server may listen, tried in order (empty: no
    /// health server).
    pub health: Vec<SocketAddr>,
    /// Where the admin server may listen, tried in order (empty: none).
    pub admin: Vec<SocketAddr>,
    /// `--enable-profiling`: the admin port answers the pprof paths (501).
    pub enable_profiling: bool,
    /// Limits of the HTTP servers (upstream's 60 s header timeout, 1 MiB
    /// headers).
    pub http: http1::Config,
    /// Threads and io engine.
    pub runtime: RuntimeConfig,
    /// How long stopping waits for tunnels and endpoints to close.
    pub stop_timeout: Duration,
    /// The reverse direction (KEP-2025): `--target` listeners.
    pub reverse: crate::reverse::ReverseSettings,
    /// `--count-server-leases`, when on.
    pub lease_counting: Option<crate::leases::LeaseSettings>,
}

impl fmt::Debug for AgentSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AgentSettings")
            .field("address", &self.connect.address)
            .field("agent_id", &self.connect.agent_id)
            .field("tls", &self.connect.tls.is_some())
            .field("sync", &self.sync)
            .field("health", &self.health)
            .field("admin", &self.admin)
            .field("workers", &self.runtime.workers)
            .finish_non_exhaustive()
    }
}

impl AgentSettings {
    /// Settings for tests: plaintext tunnels to `address`, agent id
    /// `agent_id`, no health or admin port, two workers, 100 ms sync
    /// interval capped at 500 ms.
    pub fn for_tests(address: impl Into<String>, agent_id: impl Into<String>) -> Self {
        Self {
            connect: ConnectParams {
                address: address.into(),
                tls: None,
                agent_id: agent_id.into(),
                agent_identifiers: String::new(),
                token_path: None,
                keepalive_time: Duration::from_secs(3600),
                connect_timeout: SERVER_CONNECT_TIMEOUT,
                settings: TunnelSettings::default(),
                driver: DriverConfig::default(),
            },
            h2_windows: (1 << 20, 4 << 20),
            max_message: konn_frames::grpc::DEFAULT_MAX_RECV_MESSAGE_SIZE,
            sync: SyncConfig {
                interval: Duration::from_millis(100),
                interval_cap: Duration::from_millis(500),
                sync_forever: false,
                header_timeout: Duration::from_secs(10),
                ..SyncConfig::default()
            },
            health: Vec::new(),
            admin: Vec::new(),
            enable_profiling: false,
            http: http1::Config::default(),
            runtime: RuntimeConfig {
                workers: 2,
                thread_name: "konn-agent".to_owned(),
                ..RuntimeConfig::default()
            },
            stop_timeout: DEFAULT_STOP_TIMEOUT,
            reverse: crate::reverse::ReverseSettings::default(),
            lease_counting: None,
        }
    }

    /// The settings the flags ask for. Reads the TLS files now, so a bad
    /// certificate stops the agent at start-up with one clear line.
    ///
    /// # Errors
    ///
    /// No `--ca-cert`, unreadable or invalid TLS files, a health or admin
    /// host that does not resolve.
    pub fn from_options(o: &AgentOptions) -> Result<Self, crate::Error> {
        let ca = o.ca_cert.as_ref().ok_or(crate::Error::NoCaCert)?;
        let mut tls = ClientTlsOptions::new(PemSource::file(ca), o.proxy_server_host.clone());
        if let Some(pair) = &o.client_cert {
            tls.identity = Some((PemSource::file(&pair.cert), PemSource::file(&pair.key)));
        }
        tls.extra_alpn = o
            .alpn_protos
            .iter()
            .map(|p| p.as_bytes().to_vec())
            .collect();
        let tls = tls.build().map_err(crate::Error::Tls)?;
        let e = &o.engine;
        let settings = TunnelSettings {
            dial_timeout: DIAL_TIMEOUT,
            endpoint_queue: o.xfr_channel_size,
            // What a server's PAUSE may still find queued here for one
            // flow (docs/design/tunnel.md, "Choosing the marks").
            tunnel_high_water: e.conn_queue_size,
            tunnel_low_water: e.conn_queue_size / 4,
            tunnel: TunnelConfig {
                flow: FlowLimits::from_queue_size(
                    e.conn_queue_size,
                    e.stuck_timeout.unwrap_or(NEVER),
                ),
                ..TunnelConfig::default()
            },
            warn_on_queue_limit: o.warn_on_channel_limit,
            reverse: o.reverse.enabled(),
            allowed: std::sync::Arc::new(o.allowed_destinations.clone()),
            resume_window: e.resume_window.unwrap_or(Duration::ZERO),
            ..TunnelSettings::default()
        };
        let driver = DriverConfig {
            write_timeout: e.write_timeout.unwrap_or(NEVER),
            preface_timeout: e.preface_timeout,
            idle_timeout: e.idle_timeout,
            ..DriverConfig::default()
        };
        let mut runtime = RuntimeConfig {
            workers: e.workers.max(1),
            pin_cores: e.pin_cores,
            engine: e.io_engine,
            thread_name: "konn-agent".to_owned(),
            ..RuntimeConfig::default()
        };
        runtime.pool.budget_bytes = e.memory_budget;
        Ok(Self {
            connect: ConnectParams {
                address: join_host_port(&o.proxy_server_host, o.proxy_server_port),
                tls: Some(tls),
                agent_id: o.agent_id.clone(),
                agent_identifiers: o.agent_identifiers.clone(),
                token_path: o.service_account_token_path.clone(),
                keepalive_time: o.keepalive_time,
                connect_timeout: SERVER_CONNECT_TIMEOUT,
                settings,
                driver,
            },
            h2_windows: (e.h2_stream_window, e.h2_conn_window),
            max_message: e.grpc_max_message_size,
            sync: SyncConfig {
                interval: o.sync_interval,
                interval_cap: o.sync_interval_cap,
                sync_forever: o.sync_forever,
                header_timeout: konn_protocol::agent::sync::DEFAULT_HEADER_TIMEOUT,
                count_source: match (&o.lease_counting, o.server_count_source) {
                    (None, _) => CountSource::Responses,
                    (Some(_), crate::options::ServerCountSource::Default) => CountSource::Leases,
                    (Some(_), crate::options::ServerCountSource::Max) => CountSource::Max,
                },
            },
            health: listen_addrs("health-server-host", &o.health.bind_address, o.health.port)?,
            admin: listen_addrs("admin-bind-address", &o.admin.bind_address, o.admin.port)?,
            enable_profiling: o.enable_profiling,
            http: http1::Config::default(),
            runtime,
            stop_timeout: DEFAULT_STOP_TIMEOUT,
            reverse: o.reverse.clone(),
            lease_counting: o
                .lease_counting
                .as_ref()
                .map(|l| crate::leases::LeaseSettings {
                    client: konn_core::kube::KubeSettings {
                        kubeconfig: o.kubeconfig.clone(),
                        qps: 0.0,
                        burst: 0,
                        content_type: o.kube_api_content_type.clone(),
                    },
                    count: konn_core::kube::lease::CountConfig {
                        namespace: l.namespace.clone(),
                        selector: konn_core::kube::lease::format_labels(&l.selector),
                    },
                }),
        })
    }

    /// A tunnel's HTTP/2 settings: keepalive from
    /// [`ConnectParams::h2_config`], the configured windows.
    pub fn h2_config(&self) -> h2::Config {
        let mut c = self.connect.h2_config();
        c.stream_window = self.h2_windows.0;
        c.conn_window = self.h2_windows.1;
        c
    }
}

/// Addresses for a listener on `host` (Go's `net.JoinHostPort(host,
/// port)`): an empty host means every interface, IPv6 and IPv4 (`[::]`,
/// else `0.0.0.0` where IPv6 is off); a name is resolved now.
fn listen_addrs(
    flag: &'static str,
    host: &str,
    port: u16,
) -> Result<Vec<SocketAddr>, crate::Error> {
    if host.is_empty() {
        return Ok(vec![
            SocketAddr::from(([0u16; 8], port)),
            SocketAddr::from(([0u8; 4], port)),
        ]);
    }
    let bare = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    let addrs: Vec<SocketAddr> = (bare, port)
        .to_socket_addrs()
        .map_err(|source| crate::Error::Resolve {
            flag,
            host: host.to_owned(),
            source,
        })?
        .collect();
    Ok(addrs)
}
