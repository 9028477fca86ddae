//! Shared helpers for the TLS integration tests: a test PKI generated with
//! rcgen at test time, temporary PEM files, option builders, and an
//! in-memory pair of `TlsLayer`s with a pump that moves bytes between them.

#![allow(dead_code, unreachable_pub)]

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::BytesMut;
use konn_core::Error;
use konn_core::io::tls::{
    ClientTls, ClientTlsOptions, PemSource, Plaintext, ServerTls, ServerTlsOptions, TlsLayer,
};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};

/// A certificate with its key, as PEM.
#[derive(Clone)]
pub struct Pem {
    pub cert: String,
    pub key: String,
}

impl Pem {
    pub fn cert_source(&self, name: &str) -> PemSource {
        PemSource::memory(format!("{name}.crt"), self.cert.clone())
    }
    pub fn key_source(&self, name: &str) -> PemSource {
        PemSource::memory(format!("{name}.key"), self.key.clone())
    }
}

/// A CA that can issue certificates.
pub struct Ca {
    pub pem: Pem,
    issuer: Issuer<'static, KeyPair>,
}

impl Ca {
    pub fn new(name: &str) -> Self {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let cert = params.self_signed(&key).unwrap();
        let pem = Pem {
            cert: cert.pem(),
            key: key.serialize_pem(),
        };
        Self {
            pem,
            issuer: Issuer::new(params, key),
        }
    }

    /// Issues a leaf certificate.
    pub fn issue(&self, spec: Leaf) -> Pem {
        let key = spec.key.unwrap_or_else(|| KeyPair::generate().unwrap());
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(DnType::CommonName, spec.cn);
        for dns in spec.dns {
            params
                .subject_alt_names
                .push(SanType::DnsName(dns.try_into().unwrap()));
        }
        for ip in spec.ips {
            params.subject_alt_names.push(SanType::IpAddress(ip));
        }
        params.extended_key_usages = spec.eku;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        if let Some((nb, na)) = spec.validity {
            params.not_before = rcgen::date_time_ymd(nb.0, nb.1, nb.2);
            params.not_after = rcgen::date_time_ymd(na.0, na.1, na.2);
        }
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        Pem {
            cert: cert.pem(),
            key: key.serialize_pem(),
        }
    }
}

/// A date as (year, month, day).
pub type Ymd = (i32, u8, u8);

/// What to put in a leaf certificate.
pub struct Leaf {
    pub cn: String,
    pub dns: Vec<String>,
    pub ips: Vec<IpAddr>,
    pub eku: Vec<ExtendedKeyUsagePurpose>,
    /// (not_before, not_after).
    pub validity: Option<(Ymd, Ymd)>,
    pub key: Option<KeyPair>,
}

impl Leaf {
    pub fn server() -> Self {
        Self {
            cn: "konn-server".into(),
            dns: vec!["localhost".into(), "proxy.konn.test".into()],
            ips: vec![IpAddr::V4(Ipv4Addr::LOCALHOST), "::1".parse().unwrap()],
            eku: vec![ExtendedKeyUsagePurpose::ServerAuth],
            validity: None,
            key: None,
        }
    }
    pub fn client(cn: &str) -> Self {
        Self {
            cn: cn.into(),
            dns: Vec::new(),
            ips: Vec::new(),
            eku: vec![ExtendedKeyUsagePurpose::ClientAuth],
            validity: None,
            key: None,
        }
    }
}

/// The usual cast: a cluster CA, a server certificate for 127.0.0.1 /
/// localhost, a good client, and a client from another CA.
pub struct Pki {
    pub ca: Ca,
    pub other_ca: Ca,
    pub server: Pem,
    pub client: Pem,
    pub foreign_client: Pem,
}

impl Pki {
    pub fn new() -> Self {
        let ca = Ca::new("konn test CA");
        let other_ca = Ca::new("some other CA");
        let server = ca.issue(Leaf::server());
        let client = ca.issue(Leaf::client("konn-agent"));
        let foreign_client = other_ca.issue(Leaf::client("intruder"));
        Self {
            ca,
            other_ca,
            server,
            client,
            foreign_client,
        }
    }

    /// Server options with mTLS against the cluster CA.
    pub fn server_options(&self) -> ServerTlsOptions {
        let mut o = ServerTlsOptions::new(
            self.server.cert_source("server"),
            self.server.key_source("server"),
        );
        o.client_ca = Some(self.ca.pem.cert_source("ca"));
        o
    }

    /// Client options for `host` with the good client certificate.
    pub fn client_options(&self, host: &str) -> ClientTlsOptions {
        let mut o = ClientTlsOptions::new(self.ca.pem.cert_source("ca"), host);
        o.identity = Some((
            self.client.cert_source("agent"),
            self.client.key_source("agent"),
        ));
        o
    }

    pub fn server_tls(&self) -> ServerTls {
        self.server_options().build().unwrap()
    }

    pub fn client_tls(&self) -> ClientTls {
        self.client_options("127.0.0.1").build().unwrap()
    }
}

/// A unique temporary directory, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new() -> Self {
        static N: AtomicUsize = AtomicUsize::new(0);
        let path = std::env::temp_dir().join(format!(
            "konn-tls-test-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&path).unwrap();
        Self(path)
    }

    pub fn write(&self, name: &str, data: impl AsRef<[u8]>) -> PathBuf {
        let p = self.0.join(name);
        std::fs::write(&p, data).unwrap();
        p
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Which end failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Client,
    Server,
}

/// Moves everything `from` wants to send into `to`, in one piece.
pub fn pump(from: &mut TlsLayer, to: &mut TlsLayer) -> Result<usize, Error> {
    let mut buf = BytesMut::new();
    from.take_tls(&mut buf);
    let mut off = 0;
    while off < buf.len() {
        let n = to.feed_tls(&buf[off..])?;
        assert!(n > 0, "feed made no progress during a pump");
        off += n;
    }
    Ok(buf.len())
}

/// How an in-memory handshake failed.
#[derive(Debug)]
pub struct Failure {
    /// The side that failed first.
    pub side: Side,
    /// Its error.
    pub error: Error,
    /// The other side's error after receiving the alert, if any.
    pub peer_error: Option<Error>,
}

/// Drives both handshakes to completion in memory. On failure reports the
/// side that failed first, after delivering its alert to the other side.
pub fn handshake(client: &mut TlsLayer, server: &mut TlsLayer) -> Result<(), Box<Failure>> {
    let fail = |side, error, peer_error| {
        Box::new(Failure {
            side,
            error,
            peer_error,
        })
    };
    for _ in 0..20 {
        if let Err(e) = pump(client, server) {
            let other = pump(server, client).err();
            return Err(fail(Side::Server, e, other));
        }
        if let Err(e) = pump(server, client) {
            let other = pump(client, server).err();
            return Err(fail(Side::Client, e, other));
        }
        if !client.is_handshaking()
            && !server.is_handshaking()
            && !client.wants_write()
            && !server.wants_write()
        {
            return Ok(());
        }
    }
    panic!("handshake did not converge in 20 rounds");
}

/// A fresh connected pair (handshake done).
pub fn connected(pki: &Pki) -> (TlsLayer, TlsLayer) {
    let mut c = pki.client_tls().layer().unwrap();
    let mut s = pki.server_tls().layer().unwrap();
    handshake(&mut c, &mut s).unwrap_or_else(|f| panic!("{:?}: {}", f.side, f.error));
    (c, s)
}

/// Reads all plaintext currently available.
pub fn drain(layer: &mut TlsLayer) -> Result<(BytesMut, Plaintext), Error> {
    let mut out = BytesMut::new();
    loop {
        match layer.read_plaintext(&mut out)? {
            Plaintext::Data(_) => continue,
            end => return Ok((out, end)),
        }
    }
}

/// Base64 (standard alphabet, padded), for building PEM by hand.
pub fn base64(data: &[u8]) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(T[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// PEM-encodes `der` under `label`.
pub fn to_pem(label: &str, der: &[u8]) -> String {
    let b64 = base64(der);
    let mut s = format!("-----BEGIN {label}-----\n");
    for line in b64.as_bytes().chunks(64) {
        s.push_str(std::str::from_utf8(line).unwrap());
        s.push('\n');
    }
    s.push_str(&format!("-----END {label}-----\n"));
    s
}

/// Reads one DER TLV at the start of `der`: (tag, content, rest).
fn der_tlv(der: &[u8]) -> (u8, &[u8], &[u8]) {
    let tag = der[0];
    let (len, hdr) = if der[1] < 0x80 {
        (der[1] as usize, 2)
    } else {
        let n = (der[1] & 0x7f) as usize;
        let mut len = 0usize;
        for &b in &der[2..2 + n] {
            len = (len << 8) | b as usize;
        }
        (len, 2 + n)
    };
    (tag, &der[hdr..hdr + len], &der[hdr + len..])
}

/// The inner key of a PKCS#8 PrivateKeyInfo: PKCS#1 RSAPrivateKey for RSA
/// keys, SEC1 ECPrivateKey for EC keys.
pub fn pkcs8_inner_key(pkcs8_der: &[u8]) -> Vec<u8> {
    let (_, info, _) = der_tlv(pkcs8_der); // SEQUENCE
    let (_, _version, rest) = der_tlv(info); // INTEGER
    let (_, _alg, rest) = der_tlv(rest); // AlgorithmIdentifier
    let (tag, key, _) = der_tlv(rest); // OCTET STRING
    assert_eq!(tag, 0x04);
    key.to_vec()
}
