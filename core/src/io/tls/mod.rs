//! TLS for both ends of the tunnel (rustls 0.23), as a sans-IO layer.
//!
//! Where it sits: a connection driver owns the socket and runs the HTTP/2
//! state machine; between the two it calls a [`TlsLayer`] — ciphertext in
//! with [`TlsLayer::feed_tls`], plaintext out with
//! [`TlsLayer::read_plaintext`], and the reverse with
//! [`TlsLayer::write_plaintext`] / [`TlsLayer::take_tls`]. The layer owns no
//! socket and no clock; its buffers are bounded; the handshake deadline is a
//! value ([`TlsLimits::handshake_timeout`]) the driver enforces.
//!
//! Parts:
//! - [`config`]: [`ServerTlsOptions`] / [`ClientTlsOptions`] (the upstream
//!   flags) → [`ServerTls`] / [`ClientTls`] (shared rustls configs + limits).
//! - [`pem`]: strict PEM loading of chains, keys and CA bundles.
//! - [`suites`]: Go names for `--tls-min-version` and `--cipher-suites`.
//! - [`layer`]: [`TlsLayer`] itself.
//! - [`reload`]: the replaceable configuration slot and the thread that
//!   reloads certificates, keys and CAs when their files change.
//! - [`stream`]: [`TlsStream`], a small async adapter over monoio streams
//!   with a handshake timeout, for tests and simple connections.
//! - [`sni`]: [`ClientHelloPeek`] (the SNI of a connection before its
//!   configuration is chosen) and [`ClientIdentityCheck`] (rules on client
//!   certificates beyond the CA), for listeners shared by several tenants.
//! - [`verified`]: the peer chains that verified, remembered per
//!   configuration so that a chain seen again costs no signature checks.
//!
//! The design, the verification rules and the flag mapping are written up in
//! `docs/design/tls.md`.

pub mod config;
pub mod layer;
pub mod pem;
pub mod reload;
pub mod sni;
pub mod stream;
pub mod suites;
pub mod verified;

pub use config::{
    ALPN_H2, ClientTls, ClientTlsOptions, DEFAULT_BUFFER_LIMIT, DEFAULT_HANDSHAKE_TIMEOUT,
    MIN_BUFFER_LIMIT, ServerTls, ServerTlsOptions, TlsLimits,
};
pub use layer::{Plaintext, TlsLayer};
pub use pem::PemSource;
pub use reload::Watcher;
pub use rustls_pki_types::CertificateDer;
pub use sni::{ClientHelloPeek, ClientIdentityCheck, PeekedHello};
pub use stream::{TlsStream, handshake};
pub use suites::{TlsMinVersion, TlsWarning};
