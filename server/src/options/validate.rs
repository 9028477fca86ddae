//! [`ServerFlags::validate`]: upstream's `Validate()` rules in upstream's
//! order, then konn's own checks, producing the typed [`ServerOptions`].

use std::path::PathBuf;

use konn_core::cli::common::{
    Listener, channel_size, check_exists, check_pair, check_profiling, count, non_empty_path,
    non_negative, parse_labels,
};
use konn_core::cli::engine::EngineFlags;
use konn_core::io::tls::TlsMinVersion;
use konn_core::io::tls::config::default_provider;
use konn_core::io::tls::suites::cipher_suites_from_go_names;
use konn_protocol::server::limits::{Limit, LimitsConfig};

use super::{
    AgentListener, DEFAULT_BACKEND_DIAL_TIMEOUT, Frontend, KubeClient, LeaseController, MODE_GRPC,
    MODE_HTTP_CONNECT, Mode, ProxyStrategy, ReverseOptions, ServerFlags, ServerOptions, TokenAuth,
};
use crate::Error;

/// Highest port upstream accepts; above it is the ephemeral range.
const MAX_PORT: i64 = 49_151;
/// Ports below this are refused (privileged range).
const MIN_PORT: i64 = 1024;

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

impl ServerFlags {
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
        let connect_header_timeout =
            non_negative("connect-header-timeout", self.connect_header_timeout)?;

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
            limits: self.limits(engine.memory_budget)?,
            clusters_config: non_empty_path(&self.clusters_config),
            connect_header_timeout: (!connect_header_timeout.is_zero())
                .then_some(connect_header_timeout),
            engine,
            observe: self.observe.validate()?,
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

impl ServerFlags {
    /// konn's admission flags, checked (none negative, the watermark a
    /// fraction), as the router's limits; `memory_budget` turns the
    /// watermark into bytes.
    fn limits(&self, memory_budget: usize) -> Result<LimitsConfig, Error> {
        let mut v = [0u32; 8];
        for (slot, (flag, value)) in v.iter_mut().zip(self.limits.ints()) {
            *slot = u32::try_from(value).map_err(|_| {
                Error::Limits(format!(
                    "--{flag}={value}: must be between 0 (no limit) and {}",
                    u32::MAX
                ))
            })?;
        }
        let w = self.limits.overload_memory_watermark;
        if !(0.0..=1.0).contains(&w) {
            return Err(Error::Limits(format!(
                "--overload-memory-watermark={w}: must be a fraction of --memory-budget from 0 \
                 (off) to 1"
            )));
        }
        let limit = Limit::new;
        let [ac, ar, dc, dr, fc, fr, cc, cr] = v;
        let mut cfg = LimitsConfig {
            agent: limit(ac, ar),
            dest: limit(dc, dr),
            frontend: limit(fc, fr),
            cluster: limit(cc, cr),
            ..LimitsConfig::default()
        };
        cfg.set_watermark(memory_budget, f64::from(w));
        Ok(cfg)
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
