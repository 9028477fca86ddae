//! The crate's error type: why proxy-agent refuses to start.

use std::fmt;
use std::io;

use konn_core::cli::GoDuration;
use konn_core::cli::common::FlagError;

/// Everything proxy-agent refuses before it runs: a flag value upstream (or
/// konn) rejects, TLS material that does not load, a listen host that does
/// not resolve.
#[derive(Debug)]
pub enum Error {
    /// A rule both binaries share: files, cert/key pairs, labels,
    /// profiling, `--xfr-channel-size`, durations, konn's engine flags.
    Flag(FlagError),
    /// A port ≤ 0.
    PortNotPositive {
        /// The flag.
        flag: &'static str,
        /// The value.
        port: i64,
    },
    /// A port above 65535 (konn's check).
    PortTooLarge {
        /// The flag.
        flag: &'static str,
        /// The value.
        port: i64,
    },
    /// `--sync-interval` above `--sync-interval-cap`.
    SyncIntervalAboveCap {
        /// `--sync-interval`.
        interval: GoDuration,
        /// `--sync-interval-cap`.
        cap: GoDuration,
    },
    /// `--agent-identifiers` does not parse or has an unknown key.
    AgentIdentifiers(String),
    /// `--server-count-source` is not '', 'default' or 'max'.
    ServerCountSource(String),
    /// `--ca-cert` is empty.
    NoCaCert,
    /// The TLS files are unreadable or invalid.
    Tls(konn_core::Error),
    /// `--target` / `--bind-address` are invalid (the text names the flag).
    Reverse(String),
    /// `--allowed-destination-cidrs` has a bad entry; the text names it.
    AllowedDestinations(String),
    /// A listen host does not resolve.
    Resolve {
        /// The flag.
        flag: &'static str,
        /// Its value.
        host: String,
        /// The resolver's error.
        source: io::Error,
    },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Flag(e) => e.fmt(f),
            Self::PortNotPositive { flag, port } => {
                write!(f, "--{flag} must be greater than 0, not {port}")
            }
            Self::PortTooLarge { flag, port } => {
                write!(f, "--{flag}={port} is not a port number (at most 65535)")
            }
            Self::SyncIntervalAboveCap { interval, cap } => write!(
                f,
                "--sync-interval ({interval}) must not be greater than --sync-interval-cap ({cap})"
            ),
            Self::AgentIdentifiers(problem) => {
                write!(f, "--agent-identifiers is invalid: {problem}")
            }
            Self::ServerCountSource(v) => write!(
                f,
                "--server-count-source must be 'default' or 'max' (or empty), not {v:?}"
            ),
            Self::NoCaCert => f.write_str(
                "--ca-cert is required: the agent verifies the proxy-server's certificate with it \
                 (upstream fails the same way: failed to read CA cert)",
            ),
            Self::Tls(e) => write!(f, "TLS towards the proxy-server: {e}"),
            Self::Reverse(problem) | Self::AllowedDestinations(problem) => f.write_str(problem),
            Self::Resolve { flag, host, source } => {
                write!(f, "--{flag}={host}: cannot resolve: {source}")
            }
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Flag(e) => e.source(),
            Self::Resolve { source, .. } => Some(source),
            Self::Tls(e) => Some(e),
            _ => None,
        }
    }
}

impl From<FlagError> for Error {
    fn from(e: FlagError) -> Self {
        Self::Flag(e)
    }
}
