//! In-memory handshakes between two `TlsLayer`s: who gets in, who does not,
//! and what is negotiated (ALPN, SNI, versions, suites).

mod tls_support;

use konn_core::Error;
use konn_core::io::tls::{ClientTlsOptions, TlsMinVersion};
use rcgen::ExtendedKeyUsagePurpose;
use rustls::{AlertDescription, CertificateError, CipherSuite, ProtocolVersion};
use tls_support::{Leaf, Pki, Side, connected, handshake};

#[test]
fn mtls_handshake_succeeds_and_exposes_the_session() {
    let pki = Pki::new();
    let (client, server) = connected(&pki);
    assert_eq!(client.alpn_protocol(), Some(&b"h2"[..]));
    assert_eq!(server.alpn_protocol(), Some(&b"h2"[..]));
    assert_eq!(server.protocol_version(), Some(ProtocolVersion::TLSv1_3));
    assert!(client.is_client() && !server.is_client());
    // The server sees the agent's certificate, the client the server's.
    let agent_cert = server.peer_certificates().expect("client certificate");
    assert_eq!(agent_cert.len(), 1);
    let expected = rustls_pki_types_der(&pki.client.cert);
    assert_eq!(agent_cert[0].as_ref(), expected.as_slice());
    assert!(client.peer_certificates().is_some());
    // 127.0.0.1 is an IP: no SNI is sent.
    assert_eq!(server.sni(), None);
    assert_eq!(client.sni(), None);
}

fn rustls_pki_types_der(pem: &str) -> Vec<u8> {
    use rustls_pki_types::CertificateDer;
    use rustls_pki_types::pem::PemObject;
    CertificateDer::from_pem_slice(pem.as_bytes())
        .unwrap()
        .to_vec()
}

#[test]
fn dns_server_name_is_sent_as_sni_and_verified() {
    let pki = Pki::new();
    let mut c = pki
        .client_options("proxy.konn.test")
        .build()
        .unwrap()
        .layer()
        .unwrap();
    let mut s = pki.server_tls().layer().unwrap();
    handshake(&mut c, &mut s).unwrap();
    assert_eq!(s.sni(), Some("proxy.konn.test"));
}

#[test]
fn ipv6_server_name_is_verified_against_ip_san() {
    let pki = Pki::new();
    let mut c = pki
        .client_options("[::1]")
        .build()
        .unwrap()
        .layer()
        .unwrap();
    let mut s = pki.server_tls().layer().unwrap();
    handshake(&mut c, &mut s).unwrap();
    assert_eq!(s.sni(), None);
}

#[test]
fn server_certificate_for_another_name_is_rejected_by_the_client() {
    let pki = Pki::new();
    for host in ["other.konn.test", "10.0.0.1"] {
        let mut c = pki.client_options(host).build().unwrap().layer().unwrap();
        let mut s = pki.server_tls().layer().unwrap();
        let f = *handshake(&mut c, &mut s).unwrap_err();
        let (side, err, server_err) = (f.side, f.error, f.peer_error);
        assert_eq!(side, Side::Client, "{host}");
        assert!(
            matches!(
                &err,
                Error::Tls(rustls::Error::InvalidCertificate(
                    CertificateError::NotValidForName
                        | CertificateError::NotValidForNameContext { .. }
                ))
            ),
            "{host}: {err:?}"
        );
        assert!(err.is_peer_authentication_failure());
        // The server is told why and fails too.
        assert!(matches!(
            server_err,
            Some(Error::Tls(rustls::Error::AlertReceived(
                AlertDescription::BadCertificate
            )))
        ));
    }
}

#[test]
fn server_signed_by_unknown_ca_is_rejected_by_the_client() {
    let pki = Pki::new();
    let mut o = pki.client_options("127.0.0.1");
    o.ca = pki.other_ca.pem.cert_source("other-ca");
    let mut c = o.build().unwrap().layer().unwrap();
    let mut s = pki.server_tls().layer().unwrap();
    let f = *handshake(&mut c, &mut s).unwrap_err();
    let (side, err) = (f.side, f.error);
    assert_eq!(side, Side::Client);
    assert!(matches!(
        err,
        Error::Tls(rustls::Error::InvalidCertificate(
            CertificateError::UnknownIssuer
        ))
    ));
}

/// Runs a handshake that the server must reject; returns (server error,
/// client error after the alert).
fn rejected_by_server(pki: &Pki, client: ClientTlsOptions) -> (Error, Error) {
    let mut c = client.build().unwrap().layer().unwrap();
    let mut s = pki.server_tls().layer().unwrap();
    let f = *handshake(&mut c, &mut s).unwrap_err();
    let (side, err, client_err) = (f.side, f.error, f.peer_error);
    assert_eq!(
        side,
        Side::Server,
        "the server must be the one refusing: {err:?}"
    );
    assert!(s.peer_certificates().is_none() || s.is_handshaking());
    // Nothing is accepted from the rejected client afterwards.
    assert!(s.feed_tls(b"\x17\x03\x03\x00\x01x").is_err());
    (err, client_err.expect("the client receives the alert"))
}

#[test]
fn client_without_certificate_is_rejected() {
    let pki = Pki::new();
    let mut o = pki.client_options("127.0.0.1");
    o.identity = None;
    let (server_err, client_err) = rejected_by_server(&pki, o);
    assert!(matches!(
        server_err,
        Error::Tls(rustls::Error::NoCertificatesPresented)
    ));
    assert!(server_err.is_peer_authentication_failure());
    assert!(matches!(
        client_err,
        Error::Tls(rustls::Error::AlertReceived(
            AlertDescription::CertificateRequired
        ))
    ));
    assert!(client_err.is_peer_authentication_failure());
}

#[test]
fn client_from_wrong_ca_is_rejected() {
    let pki = Pki::new();
    let mut o = pki.client_options("127.0.0.1");
    o.identity = Some((
        pki.foreign_client.cert_source("intruder"),
        pki.foreign_client.key_source("intruder"),
    ));
    let (server_err, client_err) = rejected_by_server(&pki, o);
    assert!(matches!(
        server_err,
        Error::Tls(rustls::Error::InvalidCertificate(
            CertificateError::UnknownIssuer
        ))
    ));
    assert!(matches!(
        client_err,
        Error::Tls(rustls::Error::AlertReceived(AlertDescription::UnknownCA))
    ));
}

#[test]
fn expired_client_certificate_is_rejected() {
    let pki = Pki::new();
    let mut leaf = Leaf::client("expired-agent");
    leaf.validity = Some(((2019, 1, 1), (2020, 1, 1)));
    let expired = pki.ca.issue(leaf);
    let mut o = pki.client_options("127.0.0.1");
    o.identity = Some((
        expired.cert_source("expired"),
        expired.key_source("expired"),
    ));
    let (server_err, client_err) = rejected_by_server(&pki, o);
    assert!(
        matches!(
            server_err,
            Error::Tls(rustls::Error::InvalidCertificate(
                CertificateError::Expired | CertificateError::ExpiredContext { .. }
            ))
        ),
        "{server_err:?}"
    );
    assert!(matches!(
        client_err,
        Error::Tls(rustls::Error::AlertReceived(
            AlertDescription::CertificateExpired
        ))
    ));
}

#[test]
fn not_yet_valid_client_certificate_is_rejected() {
    let pki = Pki::new();
    let mut leaf = Leaf::client("future-agent");
    leaf.validity = Some(((2999, 1, 1), (3000, 1, 1)));
    let future = pki.ca.issue(leaf);
    let mut o = pki.client_options("127.0.0.1");
    o.identity = Some((future.cert_source("future"), future.key_source("future")));
    let (server_err, _) = rejected_by_server(&pki, o);
    assert!(
        matches!(
            server_err,
            Error::Tls(rustls::Error::InvalidCertificate(
                CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. }
            ))
        ),
        "{server_err:?}"
    );
}

#[test]
fn client_certificate_without_client_auth_eku_is_rejected() {
    // A server certificate (EKU serverAuth only) presented as a client cert.
    let pki = Pki::new();
    let mut o = pki.client_options("127.0.0.1");
    o.identity = Some((
        pki.server.cert_source("server"),
        pki.server.key_source("server"),
    ));
    let (server_err, _) = rejected_by_server(&pki, o);
    assert!(
        server_err.is_peer_authentication_failure(),
        "{server_err:?}"
    );
    let mut leaf = Leaf::client("code-signer");
    leaf.eku = vec![ExtendedKeyUsagePurpose::CodeSigning];
    let wrong_eku = pki.ca.issue(leaf);
    let mut o = pki.client_options("127.0.0.1");
    o.identity = Some((wrong_eku.cert_source("eku"), wrong_eku.key_source("eku")));
    let (server_err, _) = rejected_by_server(&pki, o);
    assert!(
        server_err.is_peer_authentication_failure(),
        "{server_err:?}"
    );
}

#[test]
fn server_without_client_ca_asks_for_no_certificate() {
    let pki = Pki::new();
    let mut so = pki.server_options();
    so.client_ca = None;
    let mut s = so.build().unwrap().layer().unwrap();
    // A client with a certificate configured does not send it unasked.
    let mut c = pki.client_tls().layer().unwrap();
    handshake(&mut c, &mut s).unwrap();
    assert!(s.peer_certificates().is_none());
    // And a client without one gets in.
    let mut co = pki.client_options("localhost");
    co.identity = None;
    let mut c = co.build().unwrap().layer().unwrap();
    let mut s = so.build().unwrap().layer().unwrap();
    handshake(&mut c, &mut s).unwrap();
}

#[test]
fn extra_alpn_protocols_come_before_h2_on_the_client() {
    let pki = Pki::new();
    let mut co = pki.client_options("127.0.0.1");
    co.extra_alpn = vec![b"konnectivity-extra".to_vec()];
    let client = co.build().unwrap();
    assert_eq!(
        client.config.alpn_protocols,
        vec![b"konnectivity-extra".to_vec(), b"h2".to_vec()]
    );
    // A server offering only h2 (upstream) selects h2.
    let mut c = client.layer().unwrap();
    let mut s = pki.server_tls().layer().unwrap();
    handshake(&mut c, &mut s).unwrap();
    assert_eq!(c.alpn_protocol(), Some(&b"h2"[..]));

    // A server that also speaks the extra protocol: server preference (h2
    // first) still wins.
    let mut so = pki.server_options();
    so.extra_alpn = vec![b"konnectivity-extra".to_vec()];
    let server = so.build().unwrap();
    assert_eq!(
        server.config.alpn_protocols,
        vec![b"h2".to_vec(), b"konnectivity-extra".to_vec()]
    );
    let mut c = client.layer().unwrap();
    let mut s = server.layer().unwrap();
    handshake(&mut c, &mut s).unwrap();
    assert_eq!(s.alpn_protocol(), Some(&b"h2"[..]));

    // A client offering only the extra protocol gets it from that server.
    let mut cfg = (*client.config).clone();
    cfg.alpn_protocols = vec![b"konnectivity-extra".to_vec()];
    let mut c = konn_core::io::tls::TlsLayer::client(
        std::sync::Arc::new(cfg),
        client.server_name.clone(),
        client.limits.buffer_limit,
    )
    .unwrap();
    let mut s = server.layer().unwrap();
    handshake(&mut c, &mut s).unwrap();
    assert_eq!(s.alpn_protocol(), Some(&b"konnectivity-extra"[..]));
}

#[test]
fn no_common_alpn_protocol_fails_the_handshake() {
    let pki = Pki::new();
    let client = pki.client_tls();
    let mut cfg = (*client.config).clone();
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    let mut c = konn_core::io::tls::TlsLayer::client(
        std::sync::Arc::new(cfg),
        client.server_name.clone(),
        client.limits.buffer_limit,
    )
    .unwrap();
    let mut s = pki.server_tls().layer().unwrap();
    let f = *handshake(&mut c, &mut s).unwrap_err();
    let (side, err) = (f.side, f.error);
    assert_eq!(side, Side::Server);
    assert!(
        matches!(err, Error::Tls(rustls::Error::NoApplicationProtocol)),
        "{err:?}"
    );
}

#[test]
fn min_version_tls13_and_cipher_suite_restrictions_are_negotiated() {
    let pki = Pki::new();
    // TLS 1.3 only.
    let mut so = pki.server_options();
    so.min_version = "VersionTLS13".into();
    let mut c = pki.client_tls().layer().unwrap();
    let mut s = so.build().unwrap().layer().unwrap();
    handshake(&mut c, &mut s).unwrap();
    assert_eq!(c.protocol_version(), Some(ProtocolVersion::TLSv1_3));

    // A TLS 1.2-only client cannot reach a TLS 1.3-only server.
    let client = pki.client_tls();
    let mut cfg12 = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_protocol_versions(TlsMinVersion::Tls12.versions()[1..].as_ref())
    .unwrap()
    .with_root_certificates(root_store(&pki))
    .with_no_client_auth();
    cfg12.alpn_protocols = vec![b"h2".to_vec()];
    let cfg12 = std::sync::Arc::new(cfg12);
    let mut c =
        konn_core::io::tls::TlsLayer::client(cfg12.clone(), client.server_name.clone(), 65536)
            .unwrap();
    let mut s = so.build().unwrap().layer().unwrap();
    assert!(handshake(&mut c, &mut s).is_err());

    // TLS 1.2 with a restricted suite list negotiates the named suite.
    let mut so = pki.server_options();
    so.client_ca = None;
    so.cipher_suites = vec!["TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256".into()];
    let mut c =
        konn_core::io::tls::TlsLayer::client(cfg12, client.server_name.clone(), 65536).unwrap();
    let mut s = so.build().unwrap().layer().unwrap();
    handshake(&mut c, &mut s).unwrap();
    assert_eq!(s.protocol_version(), Some(ProtocolVersion::TLSv1_2));
    assert_eq!(
        s.cipher_suite(),
        Some(CipherSuite::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256)
    );

    // A TLS 1.3 suite restriction is honoured too.
    let mut so = pki.server_options();
    so.cipher_suites = vec!["TLS_CHACHA20_POLY1305_SHA256".into()];
    let mut c = pki.client_tls().layer().unwrap();
    let mut s = so.build().unwrap().layer().unwrap();
    handshake(&mut c, &mut s).unwrap();
    assert_eq!(
        c.cipher_suite(),
        Some(CipherSuite::TLS13_CHACHA20_POLY1305_SHA256)
    );
}

#[test]
fn the_server_picks_aes_128_gcm_as_go_does_whatever_the_client_prefers() {
    let pki = Pki::new();
    let mut so = pki.server_options();
    so.client_ca = None;
    // rustls' own order offers AES-256-GCM first.
    let offered = rustls::crypto::aws_lc_rs::default_provider();
    assert_eq!(
        offered.cipher_suites[0].suite(),
        CipherSuite::TLS13_AES_256_GCM_SHA384
    );
    let mut cfg = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(offered))
        .with_protocol_versions(TlsMinVersion::Tls12.versions())
        .unwrap()
        .with_root_certificates(root_store(&pki))
        .with_no_client_auth();
    cfg.alpn_protocols = vec![b"h2".to_vec()];
    let server_name = pki.client_tls().server_name.clone();
    let mut c =
        konn_core::io::tls::TlsLayer::client(std::sync::Arc::new(cfg), server_name, 65536).unwrap();
    let mut s = so.build().unwrap().layer().unwrap();
    handshake(&mut c, &mut s).unwrap();
    assert_eq!(
        s.cipher_suite(),
        Some(CipherSuite::TLS13_AES_128_GCM_SHA256)
    );
    // konn's client offers Go's order itself.
    let mut c = pki.client_tls().layer().unwrap();
    let mut s = pki.server_options().build().unwrap().layer().unwrap();
    handshake(&mut c, &mut s).unwrap();
    assert_eq!(
        c.cipher_suite(),
        Some(CipherSuite::TLS13_AES_128_GCM_SHA256)
    );
}

fn root_store(pki: &Pki) -> rustls::RootCertStore {
    konn_core::io::tls::pem::load_ca_bundle(&pki.ca.pem.cert_source("ca")).unwrap()
}

#[test]
fn old_min_versions_warn_and_still_serve_tls12() {
    let pki = Pki::new();
    let mut so = pki.server_options();
    so.min_version = "VersionTLS10".into();
    let built = so.build().unwrap();
    assert_eq!(built.warnings.len(), 1);
    assert!(built.warnings[0].to_string().contains("VersionTLS10"));
    let mut so = pki.server_options();
    so.min_version = "VersionTLS1.0".into();
    assert!(matches!(so.build(), Err(Error::UnknownTlsVersion(_))));
}

/// A second connection with the same configurations is a full handshake on
/// both sides: konn's server issues no tickets to a client that would use
/// them, and konn's client keeps none from a server that issues them.
#[test]
fn no_session_is_resumed_in_either_direction() {
    let pki = Pki::new();
    let rustls_defaults = |cfg: &std::sync::Arc<rustls::ClientConfig>| {
        let mut cfg = (**cfg).clone();
        cfg.resumption = rustls::client::Resumption::default();
        std::sync::Arc::new(cfg)
    };
    let twice = |c: &dyn Fn() -> konn_core::io::tls::TlsLayer,
                 s: &dyn Fn() -> konn_core::io::tls::TlsLayer| {
        (0..2)
            .map(|_| {
                let (mut c, mut s) = (c(), s());
                handshake(&mut c, &mut s).unwrap();
                (c.resumed(), s.resumed())
            })
            .collect::<Vec<_>>()
    };
    let full = vec![(Some(false), Some(false)); 2];

    // konn's server against a client that resumes (rustls' defaults).
    let (client, server) = (pki.client_tls(), pki.server_tls());
    let resuming = rustls_defaults(&client.config);
    let c = || {
        konn_core::io::tls::TlsLayer::client(resuming.clone(), client.server_name.clone(), 65536)
            .unwrap()
    };
    assert_eq!(twice(&c, &|| server.layer().unwrap()), full);

    // konn's client against a server that issues tickets (rustls' defaults).
    let mut ticketing = (*server.config).clone();
    ticketing.send_tls13_tickets = 2;
    ticketing.session_storage = rustls::server::ServerSessionMemoryCache::new(16);
    let ticketing = std::sync::Arc::new(ticketing);
    let s = || konn_core::io::tls::TlsLayer::server(ticketing.clone(), 65536).unwrap();
    assert_eq!(twice(&|| client.layer().unwrap(), &s), full);

    // The check can fail: both defaults together do resume.
    assert_eq!(
        twice(&c, &s),
        vec![(Some(false), Some(false)), (Some(true), Some(true))]
    );
}
