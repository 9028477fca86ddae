//! Strict PEM loading: certificate chains, private keys and CA bundles.
//!
//! Everything here runs once at start-up, so it favours clear failures over
//! leniency ("fail closed"):
//! - a malformed PEM block anywhere in the file is an error, even if other
//!   blocks are fine (Go's `certutil` also refuses such bundles);
//! - a file with no certificate (or no key, for key files) is an error;
//! - every certificate must parse as X.509, and a CA bundle entry must be
//!   usable as a trust anchor;
//! - text outside PEM blocks and blocks of other kinds are ignored (a
//!   combined cert+key file works as either), as with Go's `pem.Decode`.
//!
//! Errors are [`Error::Pem`] carrying the file name and a [`PemProblem`].
//! Parsing uses `rustls-pki-types`' `PemObject`; key types accepted are
//! PKCS#8 (`PRIVATE KEY`), PKCS#1 (`RSA PRIVATE KEY`) and SEC1
//! (`EC PRIVATE KEY`), the same three Go's `tls.X509KeyPair` accepts.

use std::io::Read;
use std::path::PathBuf;
use std::sync::Arc;

use rustls::RootCertStore;
use rustls::crypto::CryptoProvider;
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use crate::error::{Error, PemProblem};

/// Largest PEM file accepted (a generous bound: a CA bundle of every public
/// root is about 250 KiB). Guards against a path pointing at a device or a
/// huge file.
pub const MAX_PEM_FILE_SIZE: u64 = 4 * 1024 * 1024;

/// Where PEM data comes from: a file (the usual case, from a flag) or memory
/// (tests, or a secret fetched by other means).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PemSource {
    /// A file path; it is read when the configuration is built.
    File(PathBuf),
    /// PEM text held in memory.
    Memory {
        /// A name for error messages, e.g. `"agent client certificate"`.
        name: String,
        /// The PEM text.
        pem: Vec<u8>,
    },
}

impl PemSource {
    /// A source reading `path`.
    pub fn file(path: impl Into<PathBuf>) -> Self {
        Self::File(path.into())
    }

    /// An in-memory source called `name` in errors.
    pub fn memory(name: impl Into<String>, pem: impl Into<Vec<u8>>) -> Self {
        Self::Memory {
            name: name.into(),
            pem: pem.into(),
        }
    }

    /// The file, for a file source.
    pub fn path(&self) -> Option<PathBuf> {
        match self {
            Self::File(p) => Some(p.clone()),
            Self::Memory { .. } => None,
        }
    }

    /// The name used in error messages: the path, or the in-memory name.
    pub fn name(&self) -> String {
        match self {
            Self::File(path) => path.display().to_string(),
            Self::Memory { name, .. } => name.clone(),
        }
    }

    fn error(&self, problem: PemProblem) -> Error {
        Error::Pem {
            file: self.name(),
            problem,
        }
    }

    /// Reads the bytes, bounded by [`MAX_PEM_FILE_SIZE`].
    fn bytes(&self) -> Result<std::borrow::Cow<'_, [u8]>, Error> {
        match self {
            Self::Memory { pem, .. } => Ok(std::borrow::Cow::Borrowed(pem)),
            Self::File(path) => {
                let file =
                    std::fs::File::open(path).map_err(|e| self.error(PemProblem::Read(e)))?;
                let mut data = Vec::new();
                // Read one byte past the limit to tell "exactly at" from "over".
                file.take(MAX_PEM_FILE_SIZE + 1)
                    .read_to_end(&mut data)
                    .map_err(|e| self.error(PemProblem::Read(e)))?;
                if data.len() as u64 > MAX_PEM_FILE_SIZE {
                    return Err(self.error(PemProblem::TooLarge {
                        limit: MAX_PEM_FILE_SIZE,
                    }));
                }
                Ok(std::borrow::Cow::Owned(data))
            }
        }
    }
}

/// Loads every `CERTIFICATE` block of `source`, in file order; each must
/// parse as an X.509 certificate. At least one is required.
pub fn load_certificates(source: &PemSource) -> Result<Vec<CertificateDer<'static>>, Error> {
    let data = source.bytes()?;
    let mut certs = Vec::new();
    for item in CertificateDer::pem_slice_iter(&data) {
        let cert = item.map_err(|e| source.error(PemProblem::Malformed(e.to_string())))?;
        certs.push(cert);
    }
    if certs.is_empty() {
        return Err(source.error(PemProblem::NoCertificates));
    }
    for (index, cert) in certs.iter().enumerate() {
        // The first certificate is the leaf of a chain, or just another CA in
        // a bundle; both parse as a trust anchor at least (subject + SPKI).
        webpki::anchor_from_trusted_cert(cert).map_err(|e| {
            source.error(PemProblem::InvalidCertificate {
                index,
                reason: e.to_string(),
            })
        })?;
    }
    Ok(certs)
}

/// Loads a certificate chain whose first certificate is an end-entity
/// (leaf) certificate: [`load_certificates`] plus a full parse of the leaf.
pub fn load_cert_chain(source: &PemSource) -> Result<Vec<CertificateDer<'static>>, Error> {
    let certs = load_certificates(source)?;
    if let Some(leaf) = certs.first() {
        webpki::EndEntityCert::try_from(leaf).map_err(|e| {
            source.error(PemProblem::InvalidCertificate {
                index: 0,
                reason: e.to_string(),
            })
        })?;
    }
    Ok(certs)
}

/// Loads the first private key of `source` (PKCS#8, PKCS#1 or SEC1). Blocks
/// of other kinds before it are skipped; a malformed block is an error.
pub fn load_private_key(source: &PemSource) -> Result<PrivateKeyDer<'static>, Error> {
    let data = source.bytes()?;
    match PrivateKeyDer::from_pem_slice(&data) {
        Ok(key) => Ok(key),
        Err(rustls_pki_types::pem::Error::NoItemsFound) => {
            Err(source.error(PemProblem::NoPrivateKey))
        }
        Err(e) => Err(source.error(PemProblem::Malformed(e.to_string()))),
    }
}

/// Loads a CA bundle into a root store. Every certificate must be usable as
/// a trust anchor; an empty bundle is an error (an empty store would reject
/// every peer, which is safe but certainly not what the operator meant).
pub fn load_ca_bundle(source: &PemSource) -> Result<RootCertStore, Error> {
    let certs = load_certificates(source)?;
    let mut roots = RootCertStore::empty();
    for (index, cert) in certs.into_iter().enumerate() {
        roots.add(cert).map_err(|e| {
            source.error(PemProblem::InvalidCertificate {
                index,
                reason: e.to_string(),
            })
        })?;
    }
    Ok(roots)
}

/// Loads a certificate chain and its private key, checks that the key can be
/// used by `provider` and that it matches the leaf certificate.
pub fn load_identity(
    cert_chain: &PemSource,
    private_key: &PemSource,
    provider: &CryptoProvider,
) -> Result<Arc<CertifiedKey>, Error> {
    let chain = load_cert_chain(cert_chain)?;
    let key = load_private_key(private_key)?;
    let signing_key = provider
        .key_provider
        .load_private_key(key)
        .map_err(|e| private_key.error(PemProblem::InvalidPrivateKey(e.to_string())))?;
    let certified = CertifiedKey::new(chain, signing_key);
    match certified.keys_match() {
        // `Unknown`: the provider cannot derive the public key, so nothing to
        // compare; rustls itself accepts that case.
        Ok(()) | Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::Unknown)) => {
            Ok(Arc::new(certified))
        }
        Err(rustls::Error::InconsistentKeys(_)) => Err(Error::KeyMismatch {
            cert: cert_chain.name(),
            key: private_key.name(),
        }),
        Err(e) => Err(cert_chain.error(PemProblem::InvalidCertificate {
            index: 0,
            reason: e.to_string(),
        })),
    }
}
