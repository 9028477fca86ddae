//! konn-core's error type.
//!
//! One enum, [`Error`], for everything the engine reports: configuration
//! problems found at start-up (they name the file or flag value and say what is
//! wrong, because an operator reads them) and failures of a running connection
//! (a driver logs them and closes that connection only).
//!
//! The enum is `#[non_exhaustive]` and grouped in sections, one per part of the
//! engine; each section is owned by that part. `Display` is hand-written so the
//! messages stay stable and readable. A few modules keep a detail type their
//! own API returns — `cli::ParseError` (pflag's exact messages),
//! `cli::engine::EngineError`, `log::LogError` — and each converts into a
//! variant here, so `?` carries them into [`Error`]. `io::resolve::DialError`
//! and `http1::RequestError` are classifications (Go's dial error text, the
//! HTTP status to answer), not failures of the engine.

use std::fmt;
use std::io;
use std::path::PathBuf;
use std::time::Duration;

use crate::io::runtime::{Engine, io_uring_hint};

/// Everything konn-core can fail with.
#[non_exhaustive]
#[derive(Debug)]
pub enum Error {
    // ---- TLS configuration (io::tls): start-up errors ----
    /// A PEM file (certificate chain, private key or CA bundle) is unusable.
    Pem {
        /// The file path, or the name given to in-memory PEM.
        file: String,
        /// What is wrong with it.
        problem: PemProblem,
    },
    /// The private key does not belong to the first certificate of the chain.
    KeyMismatch {
        /// The certificate chain file.
        cert: String,
        /// The private key file.
        key: String,
    },
    /// A `--cipher-suites` entry is not a cipher suite name Go knows.
    UnknownCipherSuite(String),
    /// A `--cipher-suites` entry is a Go cipher suite that rustls does not
    /// implement (CBC mode, RSA key exchange, 3DES, RC4).
    UnsupportedCipherSuite {
        /// The Go name as given.
        name: String,
        /// Why rustls does not implement it.
        reason: &'static str,
    },
    /// `--tls-min-version` is not one of `VersionTLS10`..`VersionTLS13`.
    UnknownTlsVersion(String),
    /// The TLS server name (the agent's `--proxy-server-host`) is neither a
    /// DNS name nor an IP address.
    InvalidServerName(String),
    /// An ALPN protocol id is empty or longer than 255 bytes.
    InvalidAlpnProtocol(Vec<u8>),
    /// rustls refused the assembled TLS configuration (the text says why).
    TlsConfig(String),

    // ---- TLS sessions (io::tls): per-connection errors ----
    /// The TLS peer failed: a protocol error, a failed certificate
    /// verification, a missing client certificate, no common ALPN protocol, or
    /// a fatal alert it sent us. See [`Error::is_peer_authentication_failure`].
    Tls(rustls::Error),
    /// The transport reached end-of-stream before the TLS handshake completed
    /// (a `close_notify` alert during the handshake is ignored by rustls, so a
    /// peer that sends one and then closes ends up here too).
    TlsHandshakeEof,
    /// The transport reached end-of-stream after the handshake without a
    /// `close_notify` alert: the data may have been truncated by an attacker
    /// or a crash, so it must not be taken as a clean end of stream.
    TlsTruncated,
    /// Plaintext was written after `close_notify` was queued.
    TlsWriteAfterClose,
    /// The TLS handshake did not complete within the configured time.
    TlsHandshakeTimeout(Duration),
    /// A socket operation failed (the async TLS helpers).
    Io(io::Error),

    // ---- runtime (io::runtime): start-up errors ----
    /// An `--io-engine` value that is not `auto`, `io-uring` or `epoll`; holds
    /// the rejected value.
    InvalidIoEngine(String),
    /// io_uring was requested explicitly (`--io-engine=io-uring`) but the
    /// kernel refused `io_uring_setup` or `io_uring_enter`.
    IoUringUnavailable(io::Error),
    /// A [`RuntimeConfig`](crate::io::runtime::RuntimeConfig) value is out of
    /// range; the text names the field.
    InvalidConfig(&'static str),
    /// Building the monoio runtime of a worker failed.
    RuntimeBuild {
        /// Index of the worker.
        worker: usize,
        /// Engine the runtime was built for.
        engine: Engine,
        /// Cause reported by monoio or the kernel.
        source: io::Error,
    },
    /// The OS refused to start a worker thread.
    SpawnWorker {
        /// Index of the worker.
        worker: usize,
        /// Cause reported by the OS.
        source: io::Error,
    },
    /// A worker thread panicked (seen when joining the workers).
    WorkerPanicked {
        /// Index of the worker.
        worker: usize,
    },

    // ---- buffers (io::pool) ----
    /// The global buffer memory budget is used up: the caller must stop
    /// reading until buffers are released.
    BufferBudgetExhausted,
    /// No buffer became available within this time while the budget stayed
    /// used up: the connection waiting for one is closed.
    BufferWaitTimeout(Duration),

    // ---- cross-core hand-off (io::xcore) ----
    /// Detaching a socket from one worker or attaching it to another failed.
    Migrate(io::Error),

    // ---- listeners (io::listen) ----
    /// Creating, binding or listening on a socket failed.
    Bind {
        /// The address or path that was being bound.
        addr: String,
        /// Cause reported by the OS.
        source: io::Error,
    },
    /// A Unix socket was to be created at a path that exists and is not a
    /// socket; konn never deletes such a file.
    NotASocket(PathBuf),
    /// `accept` failed with an error that retrying cannot fix (for example
    /// `EBADF` or `EINVAL`), so the accept loop ended.
    Accept(io::Error),

    // ---- connections (konn-protocol, io::driver): per-connection errors ----
    /// The HTTP/2 or gRPC state machine failed (the peer broke a rule, sent
    /// GOAWAY with an error, missed a keepalive, or a call cannot be
    /// honoured now).
    Protocol(konn_protocol::Error),
    /// The peer closed the connection.
    ConnectionClosed,
    /// This side closed the connection at once (a process stopping).
    Aborted,
    /// The application used a driver API wrongly (a bug).
    Usage(&'static str),
    /// A socket write made no progress for this long: the peer stopped
    /// reading (zero window or full socket buffer).
    WriteTimeout(Duration),

    // ---- command line and logging (cli, log): start-up errors ----
    /// The command line does not parse (pflag's wording).
    Flags(crate::cli::ParseError),
    /// One of konn's engine flags is out of range.
    EngineFlag(crate::cli::engine::EngineError),
    /// Logging cannot be set up (e.g. `--log-file` cannot be opened).
    Log(crate::log::LogError),

    // ---- the Kubernetes API client (kube): start-up errors ----
    /// The Kubernetes client cannot be set up (kubeconfig, in-cluster
    /// configuration, its thread).
    #[cfg(feature = "kube")]
    Kube(crate::kube::KubeError),
}

impl From<konn_protocol::Error> for Error {
    fn from(e: konn_protocol::Error) -> Self {
        match e {
            // One variant for a lost transport, whichever layer saw it.
            konn_protocol::Error::ConnectionClosed => Self::ConnectionClosed,
            e => Self::Protocol(e),
        }
    }
}

impl From<crate::cli::ParseError> for Error {
    fn from(e: crate::cli::ParseError) -> Self {
        Self::Flags(e)
    }
}

impl From<crate::cli::engine::EngineError> for Error {
    fn from(e: crate::cli::engine::EngineError) -> Self {
        Self::EngineFlag(e)
    }
}

#[cfg(feature = "kube")]
impl From<crate::kube::KubeError> for Error {
    fn from(e: crate::kube::KubeError) -> Self {
        Self::Kube(e)
    }
}

impl From<crate::log::LogError> for Error {
    fn from(e: crate::log::LogError) -> Self {
        Self::Log(e)
    }
}

/// What is wrong with a PEM file (see [`Error::Pem`]).
#[non_exhaustive]
#[derive(Debug)]
pub enum PemProblem {
    /// The file could not be read.
    Read(io::Error),
    /// The file is larger than the limit for PEM files (a guard against being
    /// pointed at a device or a huge file by mistake).
    TooLarge {
        /// The limit in bytes.
        limit: u64,
    },
    /// A PEM block is malformed (bad BEGIN/END lines or base64).
    Malformed(String),
    /// The file holds no `CERTIFICATE` block.
    NoCertificates,
    /// The file holds no `PRIVATE KEY`, `RSA PRIVATE KEY` or `EC PRIVATE KEY`
    /// block.
    NoPrivateKey,
    /// A certificate block is not an acceptable X.509 certificate.
    InvalidCertificate {
        /// Position of the certificate in the file, counting from 0.
        index: usize,
        /// Why it was rejected.
        reason: String,
    },
    /// The private key is corrupt or of a type the crypto provider cannot use.
    InvalidPrivateKey(String),
}

impl Error {
    /// True when the TLS handshake failed because a certificate was missing,
    /// untrusted, expired or otherwise rejected — by us, or by the peer (a
    /// certificate alert it sent). Drivers count these separately from other
    /// connection failures ("authentication failures" in the metrics).
    pub fn is_peer_authentication_failure(&self) -> bool {
        use rustls::AlertDescription as A;
        match self {
            Self::Tls(rustls::Error::InvalidCertificate(_))
            | Self::Tls(rustls::Error::NoCertificatesPresented) => true,
            Self::Tls(rustls::Error::AlertReceived(alert)) => matches!(
                alert,
                A::BadCertificate
                    | A::UnsupportedCertificate
                    | A::CertificateRevoked
                    | A::CertificateExpired
                    | A::CertificateUnknown
                    | A::UnknownCA
                    | A::CertificateRequired
                    | A::AccessDenied
            ),
            _ => false,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Pem { file, problem } => write!(f, "{file}: {problem}"),
            Self::KeyMismatch { cert, key } => write!(
                f,
                "private key {key} does not match the certificate in {cert}"
            ),
            Self::UnknownCipherSuite(name) => {
                write!(
                    f,
                    "unknown cipher suite {name:?} (expected a Go tls cipher suite name)"
                )
            }
            Self::UnsupportedCipherSuite { name, reason } => write!(
                f,
                "cipher suite {name} is not supported by konn's TLS library (rustls): {reason}"
            ),
            Self::UnknownTlsVersion(v) => write!(
                f,
                "unknown TLS version {v:?} (expected VersionTLS10, VersionTLS11, VersionTLS12 or VersionTLS13)"
            ),
            Self::InvalidServerName(name) => {
                write!(
                    f,
                    "invalid TLS server name {name:?}: not a DNS name or IP address"
                )
            }
            Self::InvalidAlpnProtocol(p) => write!(
                f,
                "invalid ALPN protocol {:?}: must be 1 to 255 bytes",
                String::from_utf8_lossy(p)
            ),
            Self::TlsConfig(why) => write!(f, "invalid TLS configuration: {why}"),
            Self::Tls(e) => write!(f, "TLS: {e}"),
            Self::TlsHandshakeEof => f.write_str("TLS: connection closed during the handshake"),
            Self::TlsTruncated => {
                f.write_str("TLS: connection closed without close_notify (possible truncation)")
            }
            Self::TlsWriteAfterClose => f.write_str("TLS: write after close_notify"),
            Self::TlsHandshakeTimeout(d) => {
                write!(f, "TLS: handshake not completed within {d:?}")
            }
            Self::Io(e) => write!(f, "I/O: {e}"),
            Self::InvalidIoEngine(value) => write!(
                f,
                "invalid io engine {value:?}: expected one of \"auto\", \"io-uring\", \"epoll\""
            ),
            Self::IoUringUnavailable(cause) => write!(
                f,
                "io_uring was requested (--io-engine=io-uring) but is unavailable: {cause} ({}); \
                 run with --io-engine=auto to fall back to epoll, or --io-engine=epoll",
                io_uring_hint(cause)
            ),
            Self::InvalidConfig(what) => write!(f, "invalid runtime configuration: {what}"),
            Self::RuntimeBuild {
                worker,
                engine,
                source,
            } => write!(
                f,
                "worker {worker}: building the {engine} runtime failed: {source}"
            ),
            Self::SpawnWorker { worker, source } => {
                write!(f, "worker {worker}: starting the thread failed: {source}")
            }
            Self::WorkerPanicked { worker } => write!(f, "worker {worker} panicked"),
            Self::BufferBudgetExhausted => f.write_str("buffer memory budget exhausted"),
            Self::BufferWaitTimeout(d) => write!(
                f,
                "no I/O buffer within {d:?}: the buffer memory budget (--memory-budget) stayed used up"
            ),
            Self::Migrate(cause) => {
                write!(f, "moving a socket between workers failed: {cause}")
            }
            Self::Bind { addr, source } => write!(f, "cannot listen on {addr}: {source}"),
            Self::NotASocket(path) => write!(
                f,
                "{} exists and is not a Unix socket; refusing to replace it",
                path.display()
            ),
            Self::Accept(cause) => write!(f, "accept failed permanently: {cause}"),
            Self::Protocol(e) => e.fmt(f),
            Self::ConnectionClosed => f.write_str("connection closed by the peer"),
            Self::Aborted => f.write_str("connection closed locally (stopping)"),
            Self::Usage(what) => write!(f, "driver API misuse: {what}"),
            Self::WriteTimeout(d) => write!(f, "peer did not read for {d:?}: write timed out"),
            Self::Flags(e) => e.fmt(f),
            Self::EngineFlag(e) => e.fmt(f),
            Self::Log(e) => e.fmt(f),
            #[cfg(feature = "kube")]
            Self::Kube(e) => e.fmt(f),
        }
    }
}

impl fmt::Display for PemProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Read(e) => write!(f, "cannot read: {e}"),
            Self::TooLarge { limit } => {
                write!(f, "larger than the {limit}-byte limit for PEM files")
            }
            Self::Malformed(why) => write!(f, "malformed PEM: {why}"),
            Self::NoCertificates => f.write_str("no CERTIFICATE block found"),
            Self::NoPrivateKey => f.write_str(
                "no private key found (expected PRIVATE KEY, RSA PRIVATE KEY or EC PRIVATE KEY)",
            ),
            Self::InvalidCertificate { index, reason } => {
                write!(f, "certificate #{index} is invalid: {reason}")
            }
            Self::InvalidPrivateKey(why) => write!(f, "unusable private key: {why}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Pem {
                problem: PemProblem::Read(e),
                ..
            }
            | Self::Io(e)
            | Self::IoUringUnavailable(e)
            | Self::Migrate(e)
            | Self::Accept(e)
            | Self::RuntimeBuild { source: e, .. }
            | Self::SpawnWorker { source: e, .. }
            | Self::Bind { source: e, .. } => Some(e),
            Self::Tls(e) => Some(e),
            Self::Protocol(e) => Some(e),
            Self::Flags(e) => Some(e),
            Self::EngineFlag(e) => Some(e),
            Self::Log(e) => Some(e),
            #[cfg(feature = "kube")]
            Self::Kube(e) => Some(e),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_names_the_file_and_the_problem() {
        let e = Error::Pem {
            file: "/etc/konn/ca.crt".into(),
            problem: PemProblem::NoCertificates,
        };
        assert_eq!(
            e.to_string(),
            "/etc/konn/ca.crt: no CERTIFICATE block found"
        );
        let e = Error::Pem {
            file: "k.pem".into(),
            problem: PemProblem::InvalidCertificate {
                index: 2,
                reason: "bad DER".into(),
            },
        };
        assert_eq!(e.to_string(), "k.pem: certificate #2 is invalid: bad DER");
        let e = Error::KeyMismatch {
            cert: "c.pem".into(),
            key: "k.pem".into(),
        };
        assert_eq!(
            e.to_string(),
            "private key k.pem does not match the certificate in c.pem"
        );
    }

    #[test]
    fn display_of_flag_errors_names_the_value() {
        assert!(
            Error::UnknownCipherSuite("TLS_FOO".into())
                .to_string()
                .contains("\"TLS_FOO\"")
        );
        let e = Error::UnsupportedCipherSuite {
            name: "TLS_RSA_WITH_AES_128_CBC_SHA".into(),
            reason: "CBC mode",
        };
        assert_eq!(
            e.to_string(),
            "cipher suite TLS_RSA_WITH_AES_128_CBC_SHA is not supported by konn's TLS library (rustls): CBC mode"
        );
        assert!(
            Error::UnknownTlsVersion("TLS1.2".into())
                .to_string()
                .starts_with("unknown TLS version \"TLS1.2\"")
        );
        assert_eq!(
            Error::InvalidAlpnProtocol(Vec::new()).to_string(),
            "invalid ALPN protocol \"\": must be 1 to 255 bytes"
        );
    }

    #[test]
    fn source_chains_to_io_and_rustls() {
        use std::error::Error as _;
        let e = Error::Io(io::Error::from(io::ErrorKind::ConnectionReset));
        assert!(e.source().is_some());
        let e = Error::Tls(rustls::Error::NoCertificatesPresented);
        assert!(e.source().is_some());
        assert!(Error::TlsTruncated.source().is_none());
    }

    #[test]
    fn invalid_engine_names_value_and_choices() {
        let text = Error::InvalidIoEngine("uring".into()).to_string();
        assert_eq!(
            text,
            "invalid io engine \"uring\": expected one of \"auto\", \"io-uring\", \"epoll\""
        );
    }

    #[test]
    fn io_uring_unavailable_is_actionable() {
        use std::error::Error as _;
        let err = Error::IoUringUnavailable(io::Error::from_raw_os_error(libc::EPERM));
        let text = err.to_string();
        assert!(text.contains("seccomp"), "{text}");
        assert!(text.contains("--io-engine=epoll"), "{text}");
        assert_eq!(
            err.source()
                .and_then(|s| s.downcast_ref::<io::Error>())
                .and_then(io::Error::raw_os_error),
            Some(libc::EPERM)
        );
    }

    #[test]
    fn runtime_build_names_worker_and_engine() {
        use std::error::Error as _;
        let err = Error::RuntimeBuild {
            worker: 3,
            engine: Engine::IoUring,
            source: io::Error::from_raw_os_error(libc::ENOMEM),
        };
        let text = err.to_string();
        assert!(
            text.starts_with("worker 3: building the io-uring runtime failed"),
            "{text}"
        );
        assert!(err.source().is_some());
    }

    #[test]
    fn not_a_socket_names_path() {
        use std::error::Error as _;
        let err = Error::NotASocket(PathBuf::from("/run/konn.sock"));
        assert_eq!(
            err.to_string(),
            "/run/konn.sock exists and is not a Unix socket; refusing to replace it"
        );
        assert!(err.source().is_none());
    }

    #[test]
    fn runtime_and_buffer_variants_without_a_cause() {
        use std::error::Error as _;
        for err in [
            Error::BufferBudgetExhausted,
            Error::WorkerPanicked { worker: 1 },
            Error::InvalidConfig("workers must be at least 1"),
        ] {
            assert!(err.source().is_none(), "{err}");
            assert!(!err.to_string().is_empty());
        }
        let err = Error::Bind {
            addr: "127.0.0.1:80".into(),
            source: io::Error::from_raw_os_error(libc::EACCES),
        };
        assert!(
            err.to_string()
                .starts_with("cannot listen on 127.0.0.1:80: ")
        );
        assert!(err.source().is_some());
    }

    #[test]
    fn authentication_failures_are_classified() {
        use rustls::{AlertDescription, CertificateError};
        assert!(
            Error::Tls(rustls::Error::InvalidCertificate(
                CertificateError::UnknownIssuer
            ))
            .is_peer_authentication_failure()
        );
        assert!(
            Error::Tls(rustls::Error::NoCertificatesPresented).is_peer_authentication_failure()
        );
        assert!(
            Error::Tls(rustls::Error::AlertReceived(
                AlertDescription::CertificateRequired
            ))
            .is_peer_authentication_failure()
        );
        assert!(
            !Error::Tls(rustls::Error::AlertReceived(
                AlertDescription::HandshakeFailure
            ))
            .is_peer_authentication_failure()
        );
        assert!(!Error::TlsTruncated.is_peer_authentication_failure());
    }
}
