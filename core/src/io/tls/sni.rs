//! Choosing a server configuration by SNI, and extra checks on a client
//! certificate: what a listener shared by several tenants needs (the
//! proxy-server's `--clusters-config`, docs/MULTI-CLUSTER.md).
//!
//! - [`ClientHelloPeek`]: fed the first bytes a client sends, it reports the
//!   ClientHello's server name (SNI) without answering anything. The caller
//!   keeps the bytes, picks the configuration the name selects, and hands
//!   the same bytes to a fresh [`super::TlsLayer`] of that configuration
//!   (a driver's `resume` input), so the handshake itself runs unchanged.
//!   Sans-IO: no socket, no clock; the caller bounds the time.
//! - [`ClientIdentityCheck`]: a rule on the client's end-entity
//!   certificate (its SANs, subject), run by the listener's verifier after
//!   the chain verified against the client CA
//!   ([`super::ServerTlsOptions::client_check`]). A certificate it refuses
//!   fails the handshake like an unknown CA does.

use std::fmt;
use std::sync::Arc;

use rustls::client::danger::HandshakeSignatureValid;
use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::server::Acceptor;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{DigitallySignedStruct, DistinguishedName, SignatureScheme};

use super::verified::Verified;
use crate::error::Error;

/// Most bytes [`ClientHelloPeek::feed`] takes before giving up: a
/// ClientHello is one handshake message (rustls refuses more than 64 KiB)
/// in records of at most 16 KiB plus overhead.
pub const MAX_CLIENT_HELLO: usize = 64 * 1024 + 5 * 1024;

/// Reads a ClientHello from the first ciphertext bytes (see the module
/// docs).
pub struct ClientHelloPeek {
    acceptor: Acceptor,
    fed: usize,
}

impl fmt::Debug for ClientHelloPeek {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientHelloPeek")
            .field("fed", &self.fed)
            .finish()
    }
}

impl Default for ClientHelloPeek {
    fn default() -> Self {
        Self::new()
    }
}

/// What a complete ClientHello said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeekedHello {
    /// The SNI host name, lower-cased, without a trailing dot; `None` when
    /// the client sent none (it dialled an IP address, or sends no SNI).
    pub server_name: Option<String>,
}

impl ClientHelloPeek {
    /// A peek waiting for its first bytes.
    pub fn new() -> Self {
        Self {
            acceptor: Acceptor::default(),
            fed: 0,
        }
    }

    /// Feed the next ciphertext bytes (every byte the client sent so far,
    /// in order, each once). `Ok(None)`: the ClientHello is not complete
    /// yet.
    ///
    /// # Errors
    ///
    /// The bytes are not a TLS ClientHello, or more than
    /// [`MAX_CLIENT_HELLO`] bytes came without one.
    pub fn feed(&mut self, mut ciphertext: &[u8]) -> Result<Option<PeekedHello>, Error> {
        self.fed = self.fed.saturating_add(ciphertext.len());
        if self.fed > MAX_CLIENT_HELLO {
            return Err(Error::TlsConfig(format!(
                "no ClientHello in the first {MAX_CLIENT_HELLO} bytes"
            )));
        }
        while !ciphertext.is_empty() {
            // rustls takes at most one buffer's worth per call.
            if self.acceptor.read_tls(&mut ciphertext).map_err(Error::Io)? == 0 {
                break;
            }
            match self.acceptor.accept() {
                Ok(Some(accepted)) => {
                    let server_name = accepted
                        .client_hello()
                        .server_name()
                        .map(|n| n.trim_end_matches('.').to_ascii_lowercase());
                    return Ok(Some(PeekedHello { server_name }));
                }
                Ok(None) => {}
                Err((e, _alert)) => return Err(Error::Tls(e)),
            }
        }
        Ok(None)
    }
}

/// A rule on a client's end-entity certificate, checked after its chain
/// verified (see the module docs).
pub trait ClientIdentityCheck: fmt::Debug + Send + Sync {
    /// `Ok` when the certificate may connect; else why not (logged by the
    /// TLS layer's error, never sent to the peer).
    fn check(&self, end_entity: &CertificateDer<'_>) -> Result<(), String>;
}

/// The client CA's verifier behind the memory of chains that verified
/// ([`super::verified`]), followed by a [`ClientIdentityCheck`] if there
/// is one (on every handshake, remembered chain or not).
#[derive(Debug)]
pub(super) struct CheckedClientVerifier {
    pub(super) inner: Arc<dyn ClientCertVerifier>,
    pub(super) check: Option<Arc<dyn ClientIdentityCheck>>,
    pub(super) verified: Verified,
}

impl CheckedClientVerifier {
    pub(super) fn new(
        inner: Arc<dyn ClientCertVerifier>,
        check: Option<Arc<dyn ClientIdentityCheck>>,
    ) -> Self {
        Self {
            inner,
            check,
            verified: Verified::default(),
        }
    }
}

impl ClientCertVerifier for CheckedClientVerifier {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let verified = self.verified.check(
            end_entity,
            intermediates,
            (&[], &[]),
            now,
            || {
                self.inner
                    .verify_client_cert(end_entity, intermediates, now)
            },
            ClientCertVerified::assertion,
        )?;
        if let Some(check) = &self.check {
            check.check(end_entity).map_err(|why| {
                rustls::Error::InvalidCertificate(rustls::CertificateError::Other(
                    rustls::OtherError(Arc::new(IdentityRefused(why))),
                ))
            })?;
        }
        Ok(verified)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }

    fn offer_client_auth(&self) -> bool {
        self.inner.offer_client_auth()
    }

    fn client_auth_mandatory(&self) -> bool {
        self.inner.client_auth_mandatory()
    }
}

/// Why a [`ClientIdentityCheck`] refused a certificate.
#[derive(Debug)]
struct IdentityRefused(String);

impl fmt::Display for IdentityRefused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "client certificate not allowed here: {}", self.0)
    }
}

impl std::error::Error for IdentityRefused {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::tls::{ClientTlsOptions, PemSource};
    use bytes::BytesMut;

    fn hello(server_name: &str) -> Vec<u8> {
        let pem = rcgen::generate_simple_self_signed(vec!["x.test".to_owned()]).unwrap();
        let ca = PemSource::memory("ca", pem.cert.pem());
        let client = ClientTlsOptions::new(ca, server_name).build().unwrap();
        let mut layer = client.layer().unwrap();
        let mut out = BytesMut::new();
        layer.take_tls(&mut out);
        out.to_vec()
    }

    #[test]
    fn reads_the_server_name_from_any_split() {
        let bytes = hello("Cluster-A.Example");
        for split in [1, 7, bytes.len() / 2, bytes.len()] {
            let mut peek = ClientHelloPeek::new();
            let mut got = None;
            for chunk in bytes.chunks(split) {
                assert!(got.is_none(), "hello complete before its last byte");
                got = peek.feed(chunk).unwrap();
            }
            assert_eq!(
                got,
                Some(PeekedHello {
                    server_name: Some("cluster-a.example".to_owned())
                }),
                "split {split}"
            );
        }
    }

    #[test]
    fn no_sni_for_an_ip_address() {
        let bytes = hello("127.0.0.1");
        let got = ClientHelloPeek::new().feed(&bytes).unwrap();
        assert_eq!(got, Some(PeekedHello { server_name: None }));
    }

    #[test]
    fn refuses_what_is_not_tls_and_endless_input() {
        assert!(
            ClientHelloPeek::new()
                .feed(b"GET / HTTP/1.1\r\n\r\n")
                .is_err()
        );
        let mut peek = ClientHelloPeek::new();
        // A record header announcing a handshake record, then nothing useful.
        let mut partial = vec![0x16, 0x03, 0x01, 0x40, 0x00];
        partial.resize(4096, 0);
        let mut result = Ok(None);
        for _ in 0..(MAX_CLIENT_HELLO / 4096 + 2) {
            result = peek.feed(&partial);
            if result.is_err() {
                break;
            }
        }
        assert!(result.is_err(), "endless input is refused");
    }
}
