//! Certificate chains that verified, remembered per verifier.
//!
//! Every full handshake verifies the peer's chain: on the server each
//! agent's (and each mTLS frontend's) client certificate, on the agent the
//! server's. With ECDSA P-256 that is one signature check per certificate
//! the chain adds, on top of the handshake's own `CertificateVerify`, and
//! the same chain comes back again and again: agents of a DaemonSet share
//! one certificate, and every reconnect presents the chain that verified
//! before.
//!
//! [`Verified::check`] stands in front of rustls' WebPKI verifiers: in the
//! server's client-certificate verifier (`sni::CheckedClientVerifier`,
//! which also runs the identity check) and in [`CachedServerVerifier`] on
//! the agent. A chain that verified is remembered with the window in
//! which every certificate it presented is valid; the same chain, byte for
//! byte (and, for a server chain, for the same server name and OCSP
//! response), presented while `now` is inside that window is accepted
//! without checking its signatures again. Anything else — other bytes, a
//! time outside the window, a chain that failed — goes to the wrapped
//! verifier. Why that is as strict as verifying again: the verifier has no
//! other input (no CRLs, fixed roots), webpki's only time-dependent checks
//! are the validity periods of the certificates it chains through, and
//! those are all among the certificates whose windows were intersected
//! (webpki does not check a trust anchor's period). The handshake
//! signature (`CertificateVerify`, over this handshake's transcript) is
//! always checked.
//!
//! The chains are remembered per thread (a worker's state is its own, no
//! lock), so each worker verifies a chain once. Each verifier is built
//! with its configuration and has an id of its own, so a reload (new CA,
//! certificate or key) finds nothing remembered. At most [`CAPACITY`]
//! chains are kept per thread; a new one beyond that replaces an arbitrary
//! one.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::{DigitallySignedStruct, DistinguishedName, SignatureScheme};
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};

/// Chains remembered per thread, of all verifiers (a chain is a few KiB
/// at most).
pub const CAPACITY: usize = 256;

/// When every certificate of a remembered chain is valid (seconds since
/// the Unix epoch, both ends included, as webpki checks them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Window {
    not_before: u64,
    not_after: u64,
}

impl Window {
    /// The intersection of the validity periods of `certs`; `None` when
    /// one does not parse or starts before 1970.
    fn of<'a>(certs: impl IntoIterator<Item = &'a [u8]>) -> Option<Self> {
        let mut window = Self {
            not_before: 0,
            not_after: u64::MAX,
        };
        for der in certs {
            let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
            let validity = cert.validity();
            let not_before = u64::try_from(validity.not_before.timestamp()).ok()?;
            let not_after = u64::try_from(validity.not_after.timestamp()).ok()?;
            window.not_before = window.not_before.max(not_before);
            window.not_after = window.not_after.min(not_after);
        }
        Some(window)
    }

    fn contains(&self, now: UnixTime) -> bool {
        (self.not_before..=self.not_after).contains(&now.as_secs())
    }
}

thread_local! {
    /// The chains this thread remembers, of every verifier: keys start
    /// with the verifier's id. Per thread, as all state of a worker is
    /// (no lock): each worker verifies a chain once.
    static CHAINS: RefCell<HashMap<Box<[u8]>, Window>> = RefCell::new(HashMap::new());
}

/// Ids of [`Verified`]; never reused, so a replaced verifier's chains are
/// never found again (they go as others replace them).
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// The remembered chains of one verifier.
#[derive(Debug)]
pub(super) struct Verified {
    id: u64,
    /// Chains handed to the wrapped verifier (tests check the misses).
    #[cfg(test)]
    full_checks: std::sync::atomic::AtomicUsize,
}

impl Default for Verified {
    fn default() -> Self {
        Self {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            #[cfg(test)]
            full_checks: std::sync::atomic::AtomicUsize::new(0),
        }
    }
}

impl Verified {
    /// `assertion()` when this chain (with `server_name` and `ocsp`) is
    /// remembered and `now` is inside its window; else the outcome of
    /// `full`, the wrapped verifier, and the chain is remembered when that
    /// accepted it.
    pub(super) fn check<T>(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        (server_name, ocsp): (&[u8], &[u8]),
        now: UnixTime,
        full: impl FnOnce() -> Result<T, rustls::Error>,
        assertion: impl FnOnce() -> T,
    ) -> Result<T, rustls::Error> {
        let key = self.key(end_entity, intermediates, server_name, ocsp);
        if Self::hit(&key, now) {
            return Ok(assertion());
        }
        #[cfg(test)]
        self.full_checks.fetch_add(1, Ordering::Relaxed);
        let verified = full()?;
        Self::remember(key, chain(end_entity, intermediates));
        Ok(verified)
    }

    /// The cache key: the verifier's id, then the number of
    /// intermediates, then every part length-prefixed, so that no two
    /// inputs give the same bytes.
    fn key(
        &self,
        end_entity: &[u8],
        intermediates: &[CertificateDer<'_>],
        server_name: &[u8],
        ocsp: &[u8],
    ) -> Vec<u8> {
        let parts = std::iter::once(end_entity)
            .chain(intermediates.iter().map(|c| c.as_ref()))
            .chain([server_name, ocsp]);
        let len = parts.clone().map(|p| 4 + p.len()).sum::<usize>();
        let mut key = Vec::with_capacity(12 + len);
        key.extend_from_slice(&self.id.to_be_bytes());
        let count = u32::try_from(intermediates.len()).unwrap_or(u32::MAX);
        key.extend_from_slice(&count.to_be_bytes());
        for part in parts {
            let n = u32::try_from(part.len()).unwrap_or(u32::MAX);
            key.extend_from_slice(&n.to_be_bytes());
            key.extend_from_slice(part);
        }
        key
    }

    fn hit(key: &[u8], now: UnixTime) -> bool {
        CHAINS.with_borrow(|chains| chains.get(key).is_some_and(|w| w.contains(now)))
    }

    fn remember<'a>(key: Vec<u8>, certs: impl IntoIterator<Item = &'a [u8]>) {
        let Some(window) = Window::of(certs) else {
            return;
        };
        CHAINS.with_borrow_mut(|chains| {
            if chains.len() >= CAPACITY && !chains.contains_key(key.as_slice()) {
                // HashMap's order is random per process: an arbitrary one.
                if let Some(old) = chains.keys().next().cloned() {
                    chains.remove(&old);
                }
            }
            chains.insert(key.into_boxed_slice(), window);
        });
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        let id = self.id.to_be_bytes();
        CHAINS.with_borrow(|chains| chains.keys().filter(|k| k.starts_with(&id)).count())
    }
}

fn chain<'a>(
    end_entity: &'a CertificateDer<'_>,
    intermediates: &'a [CertificateDer<'_>],
) -> impl Iterator<Item = &'a [u8]> {
    std::iter::once(end_entity.as_ref()).chain(intermediates.iter().map(|c| c.as_ref()))
}

/// A server-certificate verifier that remembers the chains that verified
/// (see the module docs).
#[derive(Debug)]
pub(super) struct CachedServerVerifier {
    inner: Arc<dyn ServerCertVerifier>,
    verified: Verified,
}

impl CachedServerVerifier {
    pub(super) fn wrap(inner: Arc<dyn ServerCertVerifier>) -> Arc<dyn ServerCertVerifier> {
        Arc::new(Self {
            inner,
            verified: Verified::default(),
        })
    }
}

impl ServerCertVerifier for CachedServerVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let name = server_name.to_str();
        self.verified.check(
            end_entity,
            intermediates,
            (name.as_bytes(), ocsp_response),
            now,
            || {
                self.inner.verify_server_cert(
                    end_entity,
                    intermediates,
                    server_name,
                    ocsp_response,
                    now,
                )
            },
            ServerCertVerified::assertion,
        )
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

    fn requires_raw_public_keys(&self) -> bool {
        self.inner.requires_raw_public_keys()
    }

    fn root_hint_subjects(&self) -> Option<&[DistinguishedName]> {
        self.inner.root_hint_subjects()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::tls::config::default_provider;
    use crate::io::tls::sni::CheckedClientVerifier;
    use rustls::RootCertStore;
    use rustls::client::WebPkiServerVerifier;
    use rustls::server::WebPkiClientVerifier;
    use rustls::server::danger::ClientCertVerifier;
    use rustls_pki_types::pem::PemObject;

    fn der(pem: &str) -> CertificateDer<'static> {
        CertificateDer::from_pem_slice(pem.as_bytes()).unwrap()
    }

    fn at(year: u64) -> UnixTime {
        UnixTime::since_unix_epoch(std::time::Duration::from_secs((year - 1970) * 31_557_600))
    }

    fn roots(pem: &konn_testkit::pki::Pem) -> Arc<RootCertStore> {
        let mut roots = RootCertStore::empty();
        roots.add(der(&pem.ca_cert)).unwrap();
        Arc::new(roots)
    }

    /// The server's client-certificate verifier for `pem`'s CA (no
    /// identity check).
    fn client_verifier(pem: &konn_testkit::pki::Pem) -> CheckedClientVerifier {
        let webpki = WebPkiClientVerifier::builder_with_provider(roots(pem), default_provider())
            .build()
            .unwrap();
        CheckedClientVerifier::new(webpki, None)
    }

    #[test]
    fn a_chain_that_verified_is_not_checked_again_inside_its_window() {
        let (pem, rejects) = konn_testkit::pki::generate_with_rejects().unwrap();
        let verifier = client_verifier(&pem);
        let agent = der(&pem.agent_cert);
        let frontend = der(&pem.frontend_cert);
        let calls = || verifier.verified.full_checks.load(Ordering::Relaxed);

        for _ in 0..3 {
            verifier.verify_client_cert(&agent, &[], at(2026)).unwrap();
        }
        assert_eq!(calls(), 1, "the same chain again is remembered");
        verifier
            .verify_client_cert(&frontend, &[], at(2026))
            .unwrap();
        assert_eq!(calls(), 2, "other bytes are verified");
        // The same chain with an intermediate added is another chain.
        let _ = verifier.verify_client_cert(&agent, std::slice::from_ref(&frontend), at(2026));
        assert_eq!(calls(), 3);

        // Expired: valid 2019-01-01 .. 2020-01-01. It verifies inside its
        // period, and the remembered chain does not hide its expiry.
        let expired = der(&rejects.expired.0);
        verifier
            .verify_client_cert(&expired, &[], at(2019))
            .unwrap();
        verifier
            .verify_client_cert(&expired, &[], at(2019))
            .unwrap();
        assert_eq!(calls(), 4);
        let err = verifier
            .verify_client_cert(&expired, &[], at(2026))
            .unwrap_err();
        assert!(
            matches!(
                err,
                rustls::Error::InvalidCertificate(
                    rustls::CertificateError::ExpiredContext { .. }
                        | rustls::CertificateError::Expired
                )
            ),
            "{err:?}"
        );
        assert_eq!(calls(), 5);
        // Nor a time before it.
        assert!(
            verifier
                .verify_client_cert(&expired, &[], at(2018))
                .is_err()
        );
        assert_eq!(calls(), 6);
    }

    /// Refuses every certificate.
    #[derive(Debug)]
    struct RefuseAll;

    impl crate::io::tls::ClientIdentityCheck for RefuseAll {
        fn check(&self, _: &CertificateDer<'_>) -> Result<(), String> {
            Err("not this one".into())
        }
    }

    #[test]
    fn the_identity_check_runs_on_a_remembered_chain_too() {
        let pem = konn_testkit::pki::generate().unwrap();
        let webpki = WebPkiClientVerifier::builder_with_provider(roots(&pem), default_provider())
            .build()
            .unwrap();
        let verifier = CheckedClientVerifier::new(webpki, Some(Arc::new(RefuseAll)));
        let agent = der(&pem.agent_cert);
        for _ in 0..2 {
            let err = verifier
                .verify_client_cert(&agent, &[], at(2026))
                .unwrap_err();
            assert!(err.to_string().contains("not this one"), "{err}");
        }
        assert_eq!(
            verifier.verified.full_checks.load(Ordering::Relaxed),
            1,
            "the chain itself was remembered"
        );
    }

    #[test]
    fn a_chain_that_failed_is_checked_every_time() {
        let pem = konn_testkit::pki::generate().unwrap();
        let other = konn_testkit::pki::generate_named("another CA").unwrap();
        let verifier = client_verifier(&pem);
        let stranger = der(&other.agent_cert);
        for _ in 0..2 {
            assert!(
                verifier
                    .verify_client_cert(&stranger, &[], at(2026))
                    .is_err()
            );
        }
        assert_eq!(verifier.verified.full_checks.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn a_server_chain_is_remembered_per_server_name() {
        let pem = konn_testkit::pki::generate().unwrap();
        let webpki = WebPkiServerVerifier::builder_with_provider(roots(&pem), default_provider())
            .build()
            .unwrap();
        let verifier = CachedServerVerifier::wrap(webpki);
        let server = der(&pem.server_cert);
        let localhost = ServerName::try_from("localhost").unwrap();
        let wrong = ServerName::try_from("elsewhere.test").unwrap();
        for _ in 0..2 {
            verifier
                .verify_server_cert(&server, &[], &localhost, &[], at(2026))
                .unwrap();
        }
        // The chain verified for `localhost` is not accepted for another
        // name, however often `localhost` verified.
        let err = verifier
            .verify_server_cert(&server, &[], &wrong, &[], at(2026))
            .unwrap_err();
        assert!(
            matches!(
                err,
                rustls::Error::InvalidCertificate(
                    rustls::CertificateError::NotValidForNameContext { .. }
                        | rustls::CertificateError::NotValidForName
                )
            ),
            "{err:?}"
        );
    }

    #[test]
    fn no_more_than_capacity_chains_are_kept() {
        let pem = konn_testkit::pki::generate().unwrap();
        let (first, second) = (Verified::default(), Verified::default());
        let cert = der(&pem.agent_cert);
        for i in 0..CAPACITY / 2 {
            let key = first.key(&cert, &[], format!("{i}").as_bytes(), &[]);
            Verified::remember(key, chain(&cert, &[]));
        }
        for i in 0..CAPACITY {
            let key = second.key(&cert, &[], format!("{i}").as_bytes(), &[]);
            Verified::remember(key, chain(&cert, &[]));
        }
        assert_eq!(first.len() + second.len(), CAPACITY, "one bound for all");
        assert!(second.len() >= CAPACITY / 2);
        // Input that does not parse as a certificate is never remembered.
        let junk = CertificateDer::from(vec![0x30, 0x03, 0x02, 0x01, 0x00]);
        let third = Verified::default();
        Verified::remember(third.key(&junk, &[], &[], &[]), chain(&junk, &[]));
        assert_eq!(third.len(), 0);
    }

    #[test]
    fn keys_tell_the_parts_and_the_verifiers_apart() {
        let (v, w) = (Verified::default(), Verified::default());
        let a = CertificateDer::from(vec![1, 2]);
        let b = CertificateDer::from(vec![3]);
        assert_ne!(
            v.key(&a, std::slice::from_ref(&b), &[], &[]),
            v.key(&a, &[], &[3], &[])
        );
        assert_ne!(v.key(&a, &[], b"x", &[]), v.key(&a, &[], &[], b"x"));
        assert_ne!(v.key(&a, &[], &[], &[]), w.key(&a, &[], &[], &[]));
    }
}
