//! TLS configuration builders: Go flags in, rustls configurations out.
//!
//! Two option structs mirror the upstream flag groups:
//! - [`ServerTlsOptions`]: a TLS listener. The agent port uses
//!   `--cluster-cert/--cluster-key/--cluster-ca-cert`, the TCP frontend
//!   `--server-cert/--server-key/--server-ca-cert`; both take
//!   `--tls-min-version` and `--cipher-suites`.
//! - [`ClientTlsOptions`]: the agent's dialer, from `--ca-cert`,
//!   `--agent-cert/--agent-key`, `--alpn-proto` and `--proxy-server-host`.
//!
//! `build()` reads the files, checks everything it can (see [`super::pem`])
//! and returns [`ServerTls`] / [`ClientTls`]: the shared rustls configuration
//! plus the per-connection limits, ready to stamp out [`TlsLayer`]s. Building
//! is pure apart from reading the files; nothing is logged: warnings come
//! back as values.
//!
//! The crypto provider is rustls' aws-lc-rs provider unless the options name
//! another (docs/decisions/0001-tls-crypto-provider.md). The process-wide
//! default provider is never consulted or installed, so two configurations
//! in one process cannot interfere.

use std::sync::Arc;
use std::time::Duration;

use rustls::client::{ClientConfig, WebPkiServerVerifier};
use rustls::crypto::CryptoProvider;
use rustls::server::{ServerConfig, WebPkiClientVerifier};
use rustls::sign::SingleCertAndKey;
use rustls_pki_types::ServerName;

use super::layer::TlsLayer;
use super::pem::{PemSource, load_ca_bundle, load_identity};
use super::reload::{Live, Watcher};
use super::suites::{TlsMinVersion, TlsWarning, cipher_suites_from_go_names};
use crate::error::Error;

/// The ALPN id of HTTP/2 over TLS, which gRPC requires.
pub const ALPN_H2: &[u8] = b"h2";

/// Default [`TlsLimits::handshake_timeout`]. grpc-go allows 120 s; a TLS
/// handshake needs two round trips, so 20 s is generous on any real network
/// and bounds how long a silent or trickling peer can hold a socket.
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(20);

/// Default [`TlsLimits::buffer_limit`]: rustls' own default (64 KiB).
pub const DEFAULT_BUFFER_LIMIT: usize = 64 * 1024;

/// Smallest accepted [`TlsLimits::buffer_limit`]: one full TLS record
/// (16 KiB of plaintext plus overhead) must fit, or writes could stall.
pub const MIN_BUFFER_LIMIT: usize = 16 * 1024 + 256;

/// Per-connection limits, enforced by [`TlsLayer`] (buffers) and by the
/// driver (the handshake timeout: the layer has no clock).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TlsLimits {
    /// Time allowed from the first byte to a completed handshake.
    pub handshake_timeout: Duration,
    /// Bound on outgoing buffered data, in bytes: plaintext written before
    /// the handshake completes, and encrypted records not yet taken with
    /// [`TlsLayer::take_tls`]. Once reached, [`TlsLayer::write_plaintext`]
    /// accepts nothing more. (Incoming plaintext is bounded separately by
    /// rustls to 16 KiB plus at most one read's worth of records.)
    pub buffer_limit: usize,
}

impl Default for TlsLimits {
    fn default() -> Self {
        Self {
            handshake_timeout: DEFAULT_HANDSHAKE_TIMEOUT,
            buffer_limit: DEFAULT_BUFFER_LIMIT,
        }
    }
}

impl TlsLimits {
    fn validate(&self) -> Result<(), Error> {
        if self.buffer_limit < MIN_BUFFER_LIMIT {
            return Err(Error::TlsConfig(format!(
                "buffer limit {} is below the minimum of {MIN_BUFFER_LIMIT} bytes",
                self.buffer_limit
            )));
        }
        if self.handshake_timeout.is_zero() {
            return Err(Error::TlsConfig(
                "handshake timeout must not be zero".to_owned(),
            ));
        }
        Ok(())
    }
}

/// A TLS listener's settings, as given on the command line.
#[non_exhaustive]
#[derive(Debug, Clone)]
pub struct ServerTlsOptions {
    /// Serving certificate chain, leaf first (`--cluster-cert`, `--server-cert`).
    pub cert_chain: PemSource,
    /// Its private key (`--cluster-key`, `--server-key`).
    pub private_key: PemSource,
    /// CA bundle for client certificates (`--cluster-ca-cert`,
    /// `--server-ca-cert`). When set, every client must present a
    /// certificate that chains to it (Go's `RequireAndVerifyClientCert`);
    /// when unset, no client certificate is requested.
    pub client_ca: Option<PemSource>,
    /// `--tls-min-version` as given (`""` = TLS 1.2).
    pub min_version: String,
    /// `--cipher-suites` as given (Go names; empty = rustls defaults).
    pub cipher_suites: Vec<String>,
    /// ALPN protocols offered after `h2` (server preference order: `h2` wins
    /// when the client offers it). Upstream offers only `h2`.
    pub extra_alpn: Vec<Vec<u8>>,
    /// Per-connection limits.
    pub limits: TlsLimits,
    /// Crypto provider; `None` = rustls' aws-lc-rs provider.
    pub provider: Option<Arc<CryptoProvider>>,
    /// A further rule on client certificates that chained to `client_ca`
    /// (unused without one): see [`super::sni::ClientIdentityCheck`].
    pub client_check: Option<Arc<dyn super::sni::ClientIdentityCheck>>,
}

impl ServerTlsOptions {
    /// Options with upstream defaults: no client CA, TLS 1.2+, default
    /// suites, ALPN `h2`.
    pub fn new(cert_chain: PemSource, private_key: PemSource) -> Self {
        Self {
            cert_chain,
            private_key,
            client_ca: None,
            min_version: String::new(),
            cipher_suites: Vec::new(),
            extra_alpn: Vec::new(),
            limits: TlsLimits::default(),
            provider: None,
            client_check: None,
        }
    }

    /// Reads the files and builds the rustls server configuration.
    pub fn build(&self) -> Result<ServerTls, Error> {
        self.limits.validate()?;
        let (min_version, warning) = TlsMinVersion::from_go_name(&self.min_version)?;
        let base = self.provider.clone().unwrap_or_else(default_provider);
        let provider = Arc::new(CryptoProvider {
            cipher_suites: cipher_suites_from_go_names(&self.cipher_suites, &base)?,
            ..(*base).clone()
        });
        let identity = load_identity(&self.cert_chain, &self.private_key, &provider)?;
        let builder = ServerConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(min_version.versions())
            .map_err(config_error)?;
        let builder = match &self.client_ca {
            Some(ca) => {
                let roots = load_ca_bundle(ca)?;
                let verifier =
                    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                        .build()
                        .map_err(|e| Error::TlsConfig(format!("client CA {}: {e}", ca.name())))?;
                builder.with_client_cert_verifier(Arc::new(super::sni::CheckedClientVerifier::new(
                    verifier,
                    self.client_check.clone(),
                )))
            }
            None => builder.with_no_client_auth(),
        };
        let mut config = builder.with_cert_resolver(Arc::new(SingleCertAndKey::from(identity)));
        config.alpn_protocols = alpn_list(&[ALPN_H2.to_vec()], &self.extra_alpn)?;
        // As Go's server (since 1.17): its own preference, not the client's.
        config.ignore_client_order = true;
        // No session resumption (docs/design/tls.md, "Session resumption"):
        // Go peers never resume, so tickets and the session cache were
        // work and memory on every handshake for nothing.
        config.send_tls13_tickets = 0;
        config.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
        let config = Arc::new(config);
        Ok(ServerTls {
            live: Arc::new(Live::new(config.clone())),
            source: Arc::new(self.clone()),
            config,
            limits: self.limits,
            warnings: warning.into_iter().collect(),
        })
    }

    /// The files this configuration is read from.
    fn files(&self) -> Vec<std::path::PathBuf> {
        [
            Some(&self.cert_chain),
            Some(&self.private_key),
            self.client_ca.as_ref(),
        ]
        .into_iter()
        .flatten()
        .filter_map(|p| p.path())
        .collect()
    }
}

/// A built TLS server configuration: shared by all connections of a
/// listener (cheap to clone; clones share reloads).
#[derive(Debug, Clone)]
pub struct ServerTls {
    /// The rustls configuration as built; after a reload new connections
    /// use [`ServerTls::current`].
    pub config: Arc<ServerConfig>,
    /// The configuration new connections use (see [`super::reload`]).
    live: Arc<Live<ServerConfig>>,
    /// What it was built from, to build it again.
    source: Arc<ServerTlsOptions>,
    /// Per-connection limits.
    pub limits: TlsLimits,
    /// Flag values that were accepted but changed; log them at start-up.
    pub warnings: Vec<TlsWarning>,
}

impl ServerTls {
    /// A new server-side [`TlsLayer`] for one accepted connection, with the
    /// current (possibly reloaded) configuration.
    pub fn layer(&self) -> Result<TlsLayer, Error> {
        TlsLayer::server(self.current(), self.limits.buffer_limit)
    }

    /// The configuration new connections use now.
    pub fn current(&self) -> Arc<ServerConfig> {
        self.live.current()
    }

    /// Reload the certificate, key and CA files when they change (checked
    /// every `interval`), for this value and all its clones, until the
    /// returned [`Watcher`] is dropped. `what` names the listener in the
    /// log; `on_reload(ok)` is told every outcome.
    ///
    /// # Errors
    ///
    /// The watcher thread could not be started.
    pub fn watch(
        &self,
        what: &'static str,
        interval: Duration,
        on_reload: impl Fn(bool) + Send + 'static,
    ) -> std::io::Result<Watcher> {
        let source = self.source.clone();
        Watcher::spawn(
            what,
            source.files(),
            interval,
            self.live.clone(),
            move || source.build().map(|t| t.config),
            on_reload,
        )
    }
}

/// The agent's TLS dialer settings, as given on the command line.
#[non_exhaustive]
#[derive(Debug, Clone)]
pub struct ClientTlsOptions {
    /// CA bundle that verifies the server (`--ca-cert`, mandatory).
    pub ca: PemSource,
    /// Client certificate chain and key (`--agent-cert`, `--agent-key`), for
    /// mTLS. Upstream sends one only when both flags are set.
    pub identity: Option<(PemSource, PemSource)>,
    /// The name the server certificate must match and the SNI sent
    /// (`--proxy-server-host`): a DNS name, or an IP address (then no SNI is
    /// sent and the certificate must carry that IP as a SAN, like Go).
    pub server_name: String,
    /// `--alpn-proto`: protocols offered before `h2`, in order.
    pub extra_alpn: Vec<Vec<u8>>,
    /// Per-connection limits.
    pub limits: TlsLimits,
    /// Crypto provider; `None` = rustls' aws-lc-rs provider.
    pub provider: Option<Arc<CryptoProvider>>,
}

impl ClientTlsOptions {
    /// Options with upstream defaults: no client certificate, ALPN `h2`.
    pub fn new(ca: PemSource, server_name: impl Into<String>) -> Self {
        Self {
            ca,
            identity: None,
            server_name: server_name.into(),
            extra_alpn: Vec::new(),
            limits: TlsLimits::default(),
            provider: None,
        }
    }

    /// Reads the files and builds the rustls client configuration.
    pub fn build(&self) -> Result<ClientTls, Error> {
        self.limits.validate()?;
        let server_name = parse_server_name(&self.server_name)?;
        let provider = self.provider.clone().unwrap_or_else(default_provider);
        let roots = load_ca_bundle(&self.ca)?;
        let verifier =
            WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
                .build()
                .map_err(|e| Error::TlsConfig(format!("CA {}: {e}", self.ca.name())))?;
        let builder = ClientConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(TlsMinVersion::Tls12.versions())
            .map_err(config_error)?
            .dangerous()
            .with_custom_certificate_verifier(super::verified::CachedServerVerifier::wrap(
                verifier,
            ));
        let mut config = match &self.identity {
            Some((cert, key)) => {
                let identity = load_identity(cert, key, &provider)?;
                builder.with_client_cert_resolver(Arc::new(SingleCertAndKey::from(identity)))
            }
            None => builder.with_no_client_auth(),
        };
        // Upstream: NextProtos = --alpn-proto, then grpc-go appends "h2".
        config.alpn_protocols = alpn_list(&self.extra_alpn, &[ALPN_H2.to_vec()])?;
        // As Go's agent (no `ClientSessionCache`): every connection is a
        // full handshake, and a server's tickets are not kept.
        config.resumption = rustls::client::Resumption::disabled();
        Ok(ClientTls::new(Arc::new(config), server_name, self.limits)
            .with_source(Arc::new(self.clone())))
    }

    /// The files this configuration is read from.
    fn files(&self) -> Vec<std::path::PathBuf> {
        let identity = self.identity.iter().flat_map(|(c, k)| [c, k]);
        std::iter::once(&self.ca)
            .chain(identity)
            .filter_map(|p| p.path())
            .collect()
    }
}

/// A built TLS client configuration (cheap to clone; clones share
/// reloads).
#[derive(Debug, Clone)]
pub struct ClientTls {
    /// The rustls configuration as built; after a reload new connections
    /// use [`ClientTls::current`].
    pub config: Arc<ClientConfig>,
    /// The server name verified (and sent as SNI when it is a DNS name).
    pub server_name: ServerName<'static>,
    /// Per-connection limits.
    pub limits: TlsLimits,
    /// The configuration new connections use (see [`super::reload`]).
    live: Arc<Live<ClientConfig>>,
    /// What it was built from, to build it again (`None`: made from a
    /// rustls configuration directly, never reloaded).
    source: Option<Arc<ClientTlsOptions>>,
}

impl ClientTls {
    /// A client configuration from a rustls one (not reloadable).
    pub fn new(
        config: Arc<ClientConfig>,
        server_name: ServerName<'static>,
        limits: TlsLimits,
    ) -> Self {
        Self {
            live: Arc::new(Live::new(config.clone())),
            config,
            server_name,
            limits,
            source: None,
        }
    }

    fn with_source(mut self, source: Arc<ClientTlsOptions>) -> Self {
        self.source = Some(source);
        self
    }

    /// A new client-side [`TlsLayer`] for one outgoing connection, with the
    /// current (possibly reloaded) configuration.
    pub fn layer(&self) -> Result<TlsLayer, Error> {
        TlsLayer::client(
            self.current(),
            self.server_name.clone(),
            self.limits.buffer_limit,
        )
    }

    /// The configuration new connections use now.
    pub fn current(&self) -> Arc<ClientConfig> {
        self.live.current()
    }

    /// Reload the CA, certificate and key files when they change, as
    /// [`ServerTls::watch`] does. `None` for a configuration not built
    /// from options.
    ///
    /// # Errors
    ///
    /// The watcher thread could not be started.
    pub fn watch(
        &self,
        what: &'static str,
        interval: Duration,
        on_reload: impl Fn(bool) + Send + 'static,
    ) -> std::io::Result<Option<Watcher>> {
        let Some(source) = self.source.clone() else {
            return Ok(None);
        };
        Watcher::spawn(
            what,
            source.files(),
            interval,
            self.live.clone(),
            move || source.build().map(|t| t.config),
            on_reload,
        )
        .map(Some)
    }
}

/// rustls' aws-lc-rs provider (the project's choice, see the decision
/// record), its suites in Go's order: AES-128-GCM first, as upstream's
/// servers and agents choose on AES hardware (rustls lists AES-256-GCM
/// first, which costs a fifth more per byte and a SHA-384 key schedule).
pub fn default_provider() -> Arc<CryptoProvider> {
    Arc::new(super::suites::in_go_order(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
}

/// Parses `--proxy-server-host` into a server name. An IPv6 address may be
/// given with or without brackets.
pub fn parse_server_name(host: &str) -> Result<ServerName<'static>, Error> {
    let trimmed = host.trim();
    let bare = trimmed
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(trimmed);
    ServerName::try_from(bare.to_owned()).map_err(|_| Error::InvalidServerName(host.to_owned()))
}

/// `first` then `then`, each id checked (RFC 7301: 1..=255 bytes), duplicates
/// dropped (the first occurrence keeps its place).
fn alpn_list(first: &[Vec<u8>], then: &[Vec<u8>]) -> Result<Vec<Vec<u8>>, Error> {
    let mut out: Vec<Vec<u8>> = Vec::with_capacity(first.len() + then.len());
    for proto in first.iter().chain(then) {
        if proto.is_empty() || proto.len() > 255 {
            return Err(Error::InvalidAlpnProtocol(proto.clone()));
        }
        if !out.contains(proto) {
            out.push(proto.clone());
        }
    }
    Ok(out)
}

fn config_error(e: rustls::Error) -> Error {
    Error::TlsConfig(e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alpn_lists_keep_order_and_drop_duplicates() {
        let h2 = || vec![ALPN_H2.to_vec()];
        assert_eq!(alpn_list(&[], &h2()).unwrap(), h2());
        assert_eq!(
            alpn_list(&[b"x-apiserver".to_vec(), b"http/1.1".to_vec()], &h2()).unwrap(),
            vec![
                b"x-apiserver".to_vec(),
                b"http/1.1".to_vec(),
                b"h2".to_vec()
            ]
        );
        assert_eq!(alpn_list(&[b"h2".to_vec()], &h2()).unwrap(), h2());
        assert!(matches!(
            alpn_list(&[Vec::new()], &h2()),
            Err(Error::InvalidAlpnProtocol(p)) if p.is_empty()
        ));
        assert!(matches!(
            alpn_list(&[vec![b'a'; 256]], &h2()),
            Err(Error::InvalidAlpnProtocol(p)) if p.len() == 256
        ));
        assert!(alpn_list(&[vec![b'a'; 255]], &h2()).is_ok());
    }

    #[test]
    fn server_names_accept_dns_and_ip() {
        assert!(matches!(
            parse_server_name("proxy.example").unwrap(),
            ServerName::DnsName(_)
        ));
        assert!(matches!(
            parse_server_name("127.0.0.1").unwrap(),
            ServerName::IpAddress(_)
        ));
        assert!(matches!(
            parse_server_name("::1").unwrap(),
            ServerName::IpAddress(_)
        ));
        assert!(matches!(
            parse_server_name("[::1]").unwrap(),
            ServerName::IpAddress(_)
        ));
        for bad in ["", "a b", "exa mple.com", "[::1", "host:8091"] {
            assert!(
                matches!(parse_server_name(bad), Err(Error::InvalidServerName(n)) if n == bad),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn limits_are_validated() {
        let ok = TlsLimits::default();
        assert!(ok.validate().is_ok());
        let small = TlsLimits {
            buffer_limit: MIN_BUFFER_LIMIT - 1,
            ..ok
        };
        assert!(matches!(small.validate(), Err(Error::TlsConfig(_))));
        let zero = TlsLimits {
            handshake_timeout: Duration::ZERO,
            ..ok
        };
        assert!(matches!(zero.validate(), Err(Error::TlsConfig(_))));
    }
}
