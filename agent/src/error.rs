//! The crate's error type: why proxy-agent refuses to start.

use std::fmt;
use std::io;

use konn_core::cli::GoDuration;
use konn_core::cli::engine::EngineError;

/// Everything proxy-agent refuses before it runs: a flag value upstream (or
/// konn) rejects, TLS material that does not load, a listen host that does
/// not resolve.
#[derive(Debug)]
pub enum Error {
    /// A file flag names a path that does not exist.
    FileMissing {
        /// The flag.
        flag: &'static str,
        /// The path given.
        path: String,
        /// The OS error.
        source: io::Error,
    },
    /// One of `--agent-cert`/`--agent-key` is set, the other is not.
    IncompletePair {
        /// The flag that is set.
        set: &'static str,
        /// Its value.
        value: String,
        /// The flag that is missing.
        missing: &'static str,
    },
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
    /// `--xfr-channel-size` ≤ 0.
    ChannelSize(i64),
    /// `--enable-contention-profiling` without `--enable-profiling`.
    ContentionWithoutProfiling,
    /// `--sync-interval` above `--sync-interval-cap`.
    SyncIntervalAboveCap {
        /// `--sync-interval`.
        interval: GoDuration,
        /// `--sync-interval-cap`.
        cap: GoDuration,
    },
    /// `--agent-identifiers` does not parse or has an unknown key.
    AgentIdentifiers(String),
    /// `--lease-label` does not parse.
    InvalidLabels {
        /// The flag.
        flag: &'static str,
        /// What is wrong.
        problem: String,
    },
    /// `--server-count-source` is not '', 'default' or 'max'.
    ServerCountSource(String),
    /// A duration that must be positive is not (konn's check).
    NotPositive {
        /// The flag.
        flag: &'static str,
        /// The value.
        value: GoDuration,
    },
    /// A duration that must not be negative is (konn's check).
    NegativeDuration {
        /// The flag.
        flag: &'static str,
        /// The value.
        value: GoDuration,
    },
    /// A konn flag is out of range.
    Engine(EngineError),
    /// `--ca-cert` is empty.
    NoCaCert,
    /// The TLS files are unreadable or invalid.
    Tls(konn_core::Error),
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
            Self::FileMissing { flag, path, source } => {
                write!(f, "--{flag}={path}: cannot use the file: {source}")
            }
            Self::IncompletePair {
                set,
                value,
                missing,
            } => {
                write!(
                    f,
                    "--{missing} must be set when --{set} is set (--{set}={value:?})"
                )
            }
            Self::PortNotPositive { flag, port } => {
                write!(f, "--{flag} must be greater than 0, not {port}")
            }
            Self::PortTooLarge { flag, port } => {
                write!(f, "--{flag}={port} is not a port number (at most 65535)")
            }
            Self::ChannelSize(n) => write!(f, "--xfr-channel-size must be greater than 0, not {n}"),
            Self::ContentionWithoutProfiling => {
                f.write_str("--enable-contention-profiling requires --enable-profiling")
            }
            Self::SyncIntervalAboveCap { interval, cap } => write!(
                f,
                "--sync-interval ({interval}) must not be greater than --sync-interval-cap ({cap})"
            ),
            Self::AgentIdentifiers(problem) => {
                write!(f, "--agent-identifiers is invalid: {problem}")
            }
            Self::InvalidLabels { flag, problem } => write!(f, "--{flag}: {problem}"),
            Self::ServerCountSource(v) => write!(
                f,
                "--server-count-source must be 'default' or 'max' (or empty), not {v:?}"
            ),
            Self::NotPositive { flag, value } => {
                write!(f, "--{flag} must be greater than 0, not {value}")
            }
            Self::NegativeDuration { flag, value } => {
                write!(f, "--{flag} must not be negative, not {value}")
            }
            Self::Engine(e) => e.fmt(f),
            Self::NoCaCert => f.write_str(
                "--ca-cert is required: the agent verifies the proxy-server's certificate with it \
                 (upstream fails the same way: failed to read CA cert)",
            ),
            Self::Tls(e) => write!(f, "TLS towards the proxy-server: {e}"),
            Self::Resolve { flag, host, source } => {
                write!(f, "--{flag}={host}: cannot resolve: {source}")
            }
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::FileMissing { source, .. } | Self::Resolve { source, .. } => Some(source),
            Self::Engine(e) => Some(e),
            Self::Tls(e) => Some(e),
            _ => None,
        }
    }
}
