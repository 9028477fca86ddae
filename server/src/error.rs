//! The crate's error type: why proxy-server refuses to start.

use std::fmt;

use konn_core::cli::common::FlagError;

/// Everything proxy-server refuses before it serves: a flag value upstream
/// (or konn) rejects, a certificate that does not load, a listen address
/// that does not resolve.
#[derive(Debug)]
pub enum Error {
    /// A rule both binaries share: files, cert/key pairs, labels,
    /// profiling, `--xfr-channel-size`, durations, counts, konn's engine
    /// flags.
    Flag(FlagError),
    /// `--mode` is neither `grpc` nor `http-connect`.
    InvalidMode(String),
    /// `--uds-name` with a non-zero `--server-port`.
    UdsPortNotZero(i64),
    /// `--uds-name` with one of the frontend TLS flags.
    TlsWithUds(&'static str),
    /// TCP frontend without `--server-ca-cert`.
    TcpFrontendNeedsCa,
    /// A port above 49151.
    EphemeralPort {
        /// The flag.
        flag: &'static str,
        /// The value.
        port: i64,
    },
    /// A port below 1024.
    ReservedPort {
        /// The flag.
        flag: &'static str,
        /// The value.
        port: i64,
    },
    /// Token authentication together with `--cluster-ca-cert`.
    TokenAuthWithClusterCa,
    /// A KEP-2025 flag (`--allowed-destination`, `--reverse-*`) is invalid;
    /// the text names the flag and the problem.
    Reverse(String),
    /// A dial admission flag (`--max-*`, `--overload-memory-watermark`) is
    /// invalid; the text names the flag and the problem.
    Limits(String),
    /// Token authentication with one of its three flags empty.
    TokenAuthIncomplete(&'static str),
    /// `--proxy-strategies` names no strategy.
    EmptyProxyStrategies,
    /// `--proxy-strategies` names an unknown strategy.
    UnknownProxyStrategy(String),
    /// `--tls-min-version` is not a Go TLS version name.
    UnknownTlsVersion(String),
    /// A `--cipher-suites` entry is refused.
    CipherSuite {
        /// The name given.
        name: String,
        /// Why.
        reason: String,
    },
    /// A TLS listener lacks its certificate or key.
    MissingCertificate(&'static str),
    /// A TLS listener's certificate, key or CA does not load.
    Tls {
        /// Which listener (and its flags).
        what: &'static str,
        /// Why.
        source: konn_core::Error,
    },
    /// A flag that `--clusters-config` replaces with per-cluster settings.
    ClustersConfigConflict(&'static str),
    /// The `--clusters-config` file is refused (file, line, field, why).
    ClustersConfig(crate::clusters::config::ConfigError),
    /// A `--*-bind-address` names a host that does not resolve.
    Resolve {
        /// The flag.
        flag: &'static str,
        /// Its value.
        host: String,
    },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Flag(e) => e.fmt(f),
            Self::InvalidMode(mode) => {
                write!(f, "--mode must be 'grpc' or 'http-connect', not {mode:?}")
            }
            Self::UdsPortNotZero(port) => write!(
                f,
                "--server-port must be 0 when the frontend listens on a Unix socket (--uds-name), not {port}"
            ),
            Self::TlsWithUds(flag) => write!(
                f,
                "--{flag} must not be set when the frontend listens on a Unix socket (--uds-name): it has no TLS"
            ),
            Self::TcpFrontendNeedsCa => f.write_str(
                "--server-ca-cert must be set when the frontend listens on TCP (--uds-name is empty)",
            ),
            Self::EphemeralPort { flag, port } => write!(
                f,
                "--{flag}={port} is in the ephemeral port range (above 49151); choose a lower port"
            ),
            Self::ReservedPort { flag, port } => write!(
                f,
                "--{flag}={port} is a reserved port (below 1024); choose a port from 1024 to 49151"
            ),
            Self::Reverse(problem) | Self::Limits(problem) => f.write_str(problem),
            Self::TokenAuthWithClusterCa => f.write_str(
                "--cluster-ca-cert cannot be combined with agent token authentication \
                 (--agent-namespace, --agent-service-account, --authentication-audience)",
            ),
            Self::TokenAuthIncomplete(flag) => write!(
                f,
                "--{flag} must be set for agent token authentication, which is enabled by setting any of \
                 --agent-namespace, --agent-service-account, --authentication-audience"
            ),
            Self::EmptyProxyStrategies => f.write_str("--proxy-strategies must name at least one strategy"),
            Self::UnknownProxyStrategy(s) => write!(
                f,
                "--proxy-strategies: unknown proxy strategy {s:?} (known: default, destHost, defaultRoute)"
            ),
            Self::UnknownTlsVersion(v) => write!(
                f,
                "--tls-min-version: unsupported TLS version {v:?}; use VersionTLS10, VersionTLS11, VersionTLS12 or VersionTLS13"
            ),
            Self::CipherSuite { name, reason } => {
                write!(f, "--cipher-suites: cipher suite {name:?} is not supported: {reason}")
            }
            Self::MissingCertificate(what) => {
                write!(f, "{what}: a certificate and a key are required")
            }
            Self::Tls { what, source } => write!(f, "{what}: {source}"),
            Self::Resolve { flag, host } => write!(f, "--{flag}: cannot resolve {host:?}"),
            Self::ClustersConfigConflict(flag) => write!(
                f,
                "--{flag} cannot be combined with --clusters-config: give it per cluster in the file \
                 (docs/MULTI-CLUSTER.md)"
            ),
            Self::ClustersConfig(e) => write!(f, "--clusters-config: {e}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Flag(e) => e.source(),
            // Tls and ClustersConfig name their cause in their own message:
            // giving it as the source too printed it twice in main's
            // `{err:#}`.
            _ => None,
        }
    }
}

impl From<FlagError> for Error {
    fn from(e: FlagError) -> Self {
        Self::Flag(e)
    }
}
