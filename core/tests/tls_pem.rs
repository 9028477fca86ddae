//! PEM loading and configuration-builder errors: every failure names the
//! file and the problem; anything doubtful fails closed.

mod tls_support;

use konn_core::Error;
use konn_core::error::PemProblem;
use konn_core::io::tls::pem::{
    MAX_PEM_FILE_SIZE, load_ca_bundle, load_cert_chain, load_certificates, load_private_key,
};
use konn_core::io::tls::{ClientTlsOptions, PemSource, ServerTlsOptions};
use rcgen::{KeyPair, PKCS_ECDSA_P384_SHA384, PKCS_ED25519, PKCS_RSA_SHA256, RsaKeySize};
use tls_support::{Leaf, Pki, TempDir, base64, connected, handshake, pkcs8_inner_key, to_pem};

fn problem(r: Result<impl std::fmt::Debug, Error>) -> (String, PemProblem) {
    match r {
        Err(Error::Pem { file, problem }) => (file, problem),
        other => panic!("expected Error::Pem, got {other:?}"),
    }
}

#[test]
fn empty_and_garbage_files_have_no_certificates_or_keys() {
    let dir = TempDir::new();
    for (name, content) in [
        ("empty.pem", &b""[..]),
        ("garbage.pem", &b"this is not PEM at all\n\x00\xff\x10"[..]),
        (
            "other-kind.pem",
            &b"-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n"[..],
        ),
    ] {
        let path = dir.write(name, content);
        let src = PemSource::file(&path);
        let (file, p) = problem(load_ca_bundle(&src));
        assert_eq!(file, path.display().to_string());
        assert!(matches!(p, PemProblem::NoCertificates), "{name}: {p:?}");
        let (_, p) = problem(load_private_key(&src));
        assert!(matches!(p, PemProblem::NoPrivateKey), "{name}: {p:?}");
        // The message names the file.
        let msg = load_certificates(&src).unwrap_err().to_string();
        assert!(msg.starts_with(&path.display().to_string()), "{msg}");
        assert!(msg.contains("no CERTIFICATE block"), "{msg}");
    }
}

#[test]
fn a_bundle_with_one_malformed_block_is_rejected_whole() {
    let pki = Pki::new();
    let good = &pki.ca.pem.cert;
    let cases = [
        // Invalid base64 inside a block.
        format!("{good}-----BEGIN CERTIFICATE-----\n!!!not base64!!!\n-----END CERTIFICATE-----\n"),
        // A block that never ends.
        format!("{good}-----BEGIN CERTIFICATE-----\nMIIB\n"),
        // A broken BEGIN line.
        format!("{good}-----BEGIN CERTIFICATE----\nMIIB\n-----END CERTIFICATE-----\n"),
    ];
    for (i, bundle) in cases.iter().enumerate() {
        let src = PemSource::memory("bundle.pem", bundle.clone());
        let (file, p) = problem(load_ca_bundle(&src));
        assert_eq!(file, "bundle.pem");
        assert!(matches!(p, PemProblem::Malformed(_)), "case {i}: {p:?}");
    }
}

#[test]
fn a_block_that_is_not_a_certificate_is_rejected_with_its_index() {
    let pki = Pki::new();
    let junk = to_pem("CERTIFICATE", b"\x30\x03\x02\x01\x00 definitely not X.509");
    let bundle = format!("{}{}{junk}", pki.ca.pem.cert, pki.other_ca.pem.cert);
    let src = PemSource::memory("bundle.pem", bundle);
    let (_, p) = problem(load_ca_bundle(&src));
    assert!(
        matches!(p, PemProblem::InvalidCertificate { index: 2, .. }),
        "{p:?}"
    );
    let (_, p) = problem(load_cert_chain(&PemSource::memory("chain.pem", junk)));
    assert!(
        matches!(p, PemProblem::InvalidCertificate { index: 0, .. }),
        "{p:?}"
    );
}

#[test]
fn bundles_with_several_cas_trust_each_of_them() {
    let pki = Pki::new();
    let both = format!(
        "junk before\r\n{}\nin between\n{}",
        pki.ca.pem.cert, pki.other_ca.pem.cert
    );
    let roots = load_ca_bundle(&PemSource::memory("both.pem", both.clone())).unwrap();
    assert_eq!(roots.len(), 2);
    // A client of the other CA now gets in.
    let mut so = pki.server_options();
    so.client_ca = Some(PemSource::memory("both.pem", both));
    let mut co = pki.client_options("127.0.0.1");
    co.identity = Some((
        pki.foreign_client.cert_source("intruder"),
        pki.foreign_client.key_source("intruder"),
    ));
    let mut c = co.build().unwrap().layer().unwrap();
    let mut s = so.build().unwrap().layer().unwrap();
    handshake(&mut c, &mut s).unwrap();
}

#[test]
fn crlf_line_endings_are_accepted() {
    let pki = Pki::new();
    let crlf = pki.ca.pem.cert.replace('\n', "\r\n");
    assert_eq!(
        load_certificates(&PemSource::memory("crlf.pem", crlf))
            .unwrap()
            .len(),
        1
    );
}

/// Builds a server with `key_pem` for a leaf whose key is `key`, and checks
/// a full mTLS handshake against it.
fn serve_with(pki: &Pki, key: KeyPair, key_pem: String) {
    let mut leaf = Leaf::server();
    leaf.key = Some(key);
    let pem = pki.ca.issue(leaf);
    let mut so = pki.server_options();
    so.cert_chain = PemSource::memory("server.crt", pem.cert);
    so.private_key = PemSource::memory("server.key", key_pem);
    let mut s = so.build().unwrap().layer().unwrap();
    let mut c = pki.client_tls().layer().unwrap();
    handshake(&mut c, &mut s).unwrap();
}

#[test]
fn key_types_pkcs8_pkcs1_sec1_rsa_ec_ed25519() {
    let pki = Pki::new();
    // PKCS#8, EC P-256 (rcgen's default) is what the other tests use.
    let _ = connected(&pki);
    // PKCS#8 EC P-384 and Ed25519.
    for alg in [&PKCS_ECDSA_P384_SHA384, &PKCS_ED25519] {
        let key = KeyPair::generate_for(alg).unwrap();
        let pem = key.serialize_pem();
        assert!(pem.starts_with("-----BEGIN PRIVATE KEY-----"));
        serve_with(&pki, key, pem);
    }
    // RSA: PKCS#8 and PKCS#1 ("RSA PRIVATE KEY").
    let rsa = KeyPair::generate_rsa_for(&PKCS_RSA_SHA256, RsaKeySize::_2048).unwrap();
    let pkcs1 = to_pem("RSA PRIVATE KEY", &pkcs8_inner_key(rsa.serialized_der()));
    let pkcs8 = rsa.serialize_pem();
    serve_with(&pki, KeyPair::from_pem(&pkcs8).unwrap(), pkcs8);
    serve_with(&pki, rsa, pkcs1);
    // SEC1 ("EC PRIVATE KEY").
    let ec = KeyPair::generate().unwrap();
    let sec1 = to_pem("EC PRIVATE KEY", &pkcs8_inner_key(ec.serialized_der()));
    assert!(load_private_key(&PemSource::memory("k", sec1.clone())).is_ok());
    serve_with(&pki, ec, sec1);
}

#[test]
fn combined_cert_and_key_file_serves_as_both() {
    let pki = Pki::new();
    let dir = TempDir::new();
    let combined = dir.write(
        "server.pem",
        format!("{}{}", pki.server.key, pki.server.cert),
    );
    let mut so = pki.server_options();
    so.cert_chain = PemSource::file(&combined);
    so.private_key = PemSource::file(&combined);
    so.build().unwrap();
}

#[test]
fn key_file_without_a_key_and_corrupt_keys() {
    let pki = Pki::new();
    let mut so = pki.server_options();
    so.private_key = PemSource::memory("server.key", pki.server.cert.clone());
    let (file, p) = problem(so.build());
    assert_eq!(file, "server.key");
    assert!(matches!(p, PemProblem::NoPrivateKey));
    // A well-formed PEM block whose content is not a key.
    so.private_key = PemSource::memory(
        "server.key",
        format!(
            "-----BEGIN PRIVATE KEY-----\n{}\n-----END PRIVATE KEY-----\n",
            base64(b"nope")
        ),
    );
    let (file, p) = problem(so.build());
    assert_eq!(file, "server.key");
    assert!(matches!(p, PemProblem::InvalidPrivateKey(_)), "{p:?}");
}

#[test]
fn key_not_matching_the_certificate_names_both_files() {
    let pki = Pki::new();
    let mut so = pki.server_options();
    so.private_key = pki.client.key_source("agent");
    match so.build() {
        Err(Error::KeyMismatch { cert, key }) => {
            assert_eq!(cert, "server.crt");
            assert_eq!(key, "agent.key");
        }
        other => panic!("{other:?}"),
    }
    // Same for the agent's client identity.
    let mut co = pki.client_options("127.0.0.1");
    co.identity = Some((
        pki.client.cert_source("agent"),
        pki.server.key_source("server"),
    ));
    assert!(matches!(co.build(), Err(Error::KeyMismatch { .. })));
}

#[test]
fn missing_and_oversized_files_are_named() {
    let dir = TempDir::new();
    let missing = dir.path().join("nope.crt");
    let (file, p) = problem(load_certificates(&PemSource::file(&missing)));
    assert_eq!(file, missing.display().to_string());
    assert!(matches!(&p, PemProblem::Read(e) if e.kind() == std::io::ErrorKind::NotFound));
    let big = dir.write("big.pem", vec![b'A'; MAX_PEM_FILE_SIZE as usize + 1]);
    let (_, p) = problem(load_certificates(&PemSource::file(&big)));
    assert!(matches!(p, PemProblem::TooLarge { limit } if limit == MAX_PEM_FILE_SIZE));
    // Exactly at the limit is read (and then found to hold nothing).
    let edge = dir.write("edge.pem", vec![b'A'; MAX_PEM_FILE_SIZE as usize]);
    let (_, p) = problem(load_certificates(&PemSource::file(&edge)));
    assert!(matches!(p, PemProblem::NoCertificates));
    // A directory is not a file.
    let (_, p) = problem(load_certificates(&PemSource::file(dir.path())));
    assert!(matches!(p, PemProblem::Read(_)));
}

#[test]
fn server_and_client_builders_report_bad_inputs() {
    let pki = Pki::new();
    // Empty client CA on the server: fail closed at start-up.
    let mut so = pki.server_options();
    so.client_ca = Some(PemSource::memory("cluster-ca.crt", ""));
    let (file, p) = problem(so.build());
    assert_eq!(file, "cluster-ca.crt");
    assert!(matches!(p, PemProblem::NoCertificates));
    // Unknown and unsupported cipher suites.
    let mut so = pki.server_options();
    so.cipher_suites = vec![
        "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256".into(),
        "TLS_BOGUS".into(),
    ];
    assert!(matches!(so.build(), Err(Error::UnknownCipherSuite(n)) if n == "TLS_BOGUS"));
    so.cipher_suites = vec!["TLS_RSA_WITH_AES_128_CBC_SHA".into()];
    assert!(matches!(
        so.build(),
        Err(Error::UnsupportedCipherSuite { .. })
    ));
    // Bad version.
    let mut so = pki.server_options();
    so.min_version = "TLS13".into();
    assert!(matches!(so.build(), Err(Error::UnknownTlsVersion(v)) if v == "TLS13"));
    // Bad ALPN.
    let mut so = pki.server_options();
    so.extra_alpn = vec![Vec::new()];
    assert!(matches!(so.build(), Err(Error::InvalidAlpnProtocol(_))));
    // Client: CA mandatory and checked, server name checked.
    let co = ClientTlsOptions::new(PemSource::memory("ca.crt", "garbage"), "127.0.0.1");
    let (file, p) = problem(co.build());
    assert_eq!(file, "ca.crt");
    assert!(matches!(p, PemProblem::NoCertificates));
    let co = ClientTlsOptions::new(pki.ca.pem.cert_source("ca"), "not a host name");
    assert!(matches!(co.build(), Err(Error::InvalidServerName(_))));
    // A chain file given as the server's key and vice versa.
    let so = ServerTlsOptions::new(
        pki.server.key_source("server"),
        pki.server.key_source("server"),
    );
    let (file, p) = problem(so.build());
    assert_eq!(file, "server.key");
    assert!(matches!(p, PemProblem::NoCertificates));
}
