//! A throw-away PKI for demos and tests: one CA, a serving certificate for
//! `localhost`/`127.0.0.1`/`::1`, and client certificates for the agent and
//! for a frontend (kube-apiserver's side), as PEM in memory ([`generate`])
//! or written as files with the names the demo and the tests pass to the
//! binaries ([`write`]).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};

use crate::Error;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};

/// Where [`write`] put the files.
#[derive(Clone, Debug)]
pub struct PkiFiles {
    /// The CA certificate (`--cluster-ca-cert`, `--server-ca-cert`, `--ca-cert`).
    pub ca_cert: PathBuf,
    /// Serving certificate and key of both server ports.
    pub server_cert: PathBuf,
    /// See `server_cert`.
    pub server_key: PathBuf,
    /// The agent's client certificate (`--agent-cert`).
    pub agent_cert: PathBuf,
    /// See `agent_cert`.
    pub agent_key: PathBuf,
    /// A frontend client certificate (kube-apiserver's egress client).
    pub frontend_cert: PathBuf,
    /// See `frontend_cert`.
    pub frontend_key: PathBuf,
}

/// What a generated PKI is for: the serving certificate's extra DNS names
/// (SNI names of a cluster) and the client certificates' OU.
#[derive(Clone, Copy, Debug, Default)]
pub struct Spec<'a> {
    /// DNS names the serving certificate carries besides `localhost`.
    pub server_names: &'a [&'a str],
    /// The client certificates' organizational unit, when set.
    pub client_ou: Option<&'a str>,
}

fn leaf(
    issuer: &Issuer<'_, KeyPair>,
    cn: &str,
    server: bool,
    spec: Spec<'_>,
) -> Result<(String, String), rcgen::Error> {
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.distinguished_name.push(DnType::CommonName, cn);
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    if server {
        params.subject_alt_names = vec![
            SanType::DnsName("localhost".try_into()?),
            SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)),
            SanType::IpAddress(IpAddr::V6(Ipv6Addr::LOCALHOST)),
        ];
        for name in spec.server_names {
            params
                .subject_alt_names
                .push(SanType::DnsName((*name).try_into()?));
        }
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    } else {
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        if let Some(ou) = spec.client_ou {
            params
                .distinguished_name
                .push(DnType::OrganizationalUnitName, ou);
        }
    }
    let cert = params.signed_by(&key, issuer)?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// A fresh PKI in memory, as PEM.
#[derive(Clone, Debug)]
pub struct Pem {
    /// The CA certificate.
    pub ca_cert: String,
    /// Serving certificate for `localhost`, `127.0.0.1` and `::1`.
    pub server_cert: String,
    /// See `server_cert`.
    pub server_key: String,
    /// The agent's client certificate.
    pub agent_cert: String,
    /// See `agent_cert`.
    pub agent_key: String,
    /// A frontend client certificate (kube-apiserver's egress client).
    pub frontend_cert: String,
    /// See `frontend_cert`.
    pub frontend_key: String,
}

/// The common name of [`generate`]'s CA.
pub const DEFAULT_CA_NAME: &str = "konn demo CA";

/// Generate a fresh PKI: one CA and the certificates it signs.
pub fn generate() -> Result<Pem, Error> {
    generate_for(Spec::default())
}

/// [`generate`] with a CA called `ca_name`: a second PKI with another name
/// is a CA peers do not know (`unknown_ca`), and one with the same name is
/// what a certificate rotation produces.
pub fn generate_named(ca_name: &str) -> Result<Pem, Error> {
    generate_with(ca_name, Spec::default())
}

/// [`generate`] for a `spec` (a cluster of a multi-cluster server).
pub fn generate_for(spec: Spec<'_>) -> Result<Pem, Error> {
    generate_with(DEFAULT_CA_NAME, spec)
}

fn generate_with(ca_name: &str, spec: Spec<'_>) -> Result<Pem, Error> {
    Ok(generate_issuer(ca_name, spec)?.0)
}

/// A PKI and its CA as an issuer of more certificates.
fn generate_issuer(
    ca_name: &str,
    spec: Spec<'_>,
) -> Result<(Pem, Issuer<'static, KeyPair>), Error> {
    let ca_key = KeyPair::generate()?;
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.distinguished_name.push(DnType::CommonName, ca_name);
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca_cert = ca.self_signed(&ca_key)?.pem();
    let issuer = Issuer::new(ca, ca_key);
    let (server_cert, server_key) = leaf(&issuer, "konnectivity-server", true, spec)?;
    let (agent_cert, agent_key) = leaf(&issuer, "konnectivity-agent", false, spec)?;
    let (frontend_cert, frontend_key) = leaf(&issuer, "kube-apiserver", false, spec)?;
    let pem = Pem {
        ca_cert,
        server_cert,
        server_key,
        agent_cert,
        agent_key,
        frontend_cert,
        frontend_key,
    };
    Ok((pem, issuer))
}

/// Client certificates (PEM certificate and key) that the CA of the PKI
/// they come with signed, but that a server must refuse.
#[derive(Clone, Debug)]
pub struct Rejects {
    /// Valid from 2019-01-01 to 2020-01-01.
    pub expired: (String, String),
    /// Extended key usage serverAuth only: not a client certificate.
    pub server_auth_only: (String, String),
}

/// [`generate`] plus [`Rejects`] signed by the same CA.
pub fn generate_with_rejects() -> Result<(Pem, Rejects), Error> {
    let (pem, issuer) = generate_issuer(DEFAULT_CA_NAME, Spec::default())?;
    let client = |eku: ExtendedKeyUsagePurpose, expired: bool| -> Result<(String, String), Error> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params
            .distinguished_name
            .push(DnType::CommonName, "konnectivity-agent");
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![eku];
        if expired {
            params.not_before = rcgen::date_time_ymd(2019, 1, 1);
            params.not_after = rcgen::date_time_ymd(2020, 1, 1);
        }
        let cert = params.signed_by(&key, &issuer)?;
        Ok((cert.pem(), key.serialize_pem()))
    };
    let rejects = Rejects {
        expired: client(ExtendedKeyUsagePurpose::ClientAuth, true)?,
        server_auth_only: client(ExtendedKeyUsagePurpose::ServerAuth, false)?,
    };
    Ok((pem, rejects))
}

/// Generate a fresh PKI and write it into `dir` (created if missing).
pub fn write(dir: &Path) -> Result<PkiFiles, Error> {
    write_for(dir, Spec::default())
}

/// [`write`] for a `spec`.
pub fn write_for(dir: &Path, spec: Spec<'_>) -> Result<PkiFiles, Error> {
    write_pem(dir, &generate_for(spec)?)
}

/// Write `pem` into `dir` (created if missing) under [`write`]'s names.
pub fn write_pem(dir: &Path, pem: &Pem) -> Result<PkiFiles, Error> {
    std::fs::create_dir_all(dir).map_err(|e| Error::Write(dir.to_owned(), e))?;
    let put = |name: &str, body: &str| -> Result<PathBuf, Error> {
        let p = dir.join(name);
        std::fs::write(&p, body).map_err(|e| Error::Write(p.clone(), e))?;
        Ok(p)
    };
    Ok(PkiFiles {
        ca_cert: put("ca.crt", &pem.ca_cert)?,
        server_cert: put("server.crt", &pem.server_cert)?,
        server_key: put("server.key", &pem.server_key)?,
        agent_cert: put("agent.crt", &pem.agent_cert)?,
        agent_key: put("agent.key", &pem.agent_key)?,
        frontend_cert: put("frontend.crt", &pem.frontend_cert)?,
        frontend_key: put("frontend.key", &pem.frontend_key)?,
    })
}

#[cfg(test)]
mod tests {
    use konn_core::io::tls::{ClientTlsOptions, PemSource, ServerTlsOptions};

    #[test]
    fn the_written_files_load_as_server_and_client_tls() {
        let dir = tempfile::tempdir().unwrap();
        let f = super::write(dir.path()).unwrap();
        let mut s = ServerTlsOptions::new(
            PemSource::File(f.server_cert.clone()),
            PemSource::File(f.server_key.clone()),
        );
        s.client_ca = Some(PemSource::File(f.ca_cert.clone()));
        s.build().unwrap();
        let mut c = ClientTlsOptions::new(PemSource::File(f.ca_cert.clone()), "127.0.0.1");
        c.identity = Some((PemSource::File(f.agent_cert), PemSource::File(f.agent_key)));
        c.build().unwrap();
    }
}
