//! Hardening of proxy-server's real listeners against stalling and
//! misbehaving peers (issue 16, item 6), under every io engine:
//!
//! - a connection that stalls before its HTTP/2 preface and first SETTINGS
//!   (silent, half a preface, or — on the TLS ports — mid-handshake or just
//!   after it) is closed at `--preface-timeout`, on the Unix-socket
//!   frontend, the TCP frontend and the agent port;
//! - a connection with no stream gets GOAWAY `max_idle` at
//!   `--idle-timeout` and closes; one with a stream open does not;
//! - a client certificate from an unknown CA, or none, is refused with the
//!   TLS alert that says so (`unknown_ca`, `certificate_required`);
//! - an ENHANCE_YOUR_CALM GOAWAY names the limit it enforces.
//!
//! Each scenario ends with the process's descriptors back where they were
//! before the server started.

mod e2e_common;

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use e2e_common::*;
use konn_core::io::runtime::{Engine, available_engines, block_on};
use konn_core::io::tls::{ClientTls, ClientTlsOptions, PemSource, TlsStream};
use konn_frames::Reason;
use konn_frames::h2::{FrameType, PREFACE as H2_PREFACE, flags};
use konn_server::settings::Mode;
use konn_testkit::h2raw::{self, RawClient};

/// The deadlines the servers under test run with.
const PREFACE_T: Duration = Duration::from_millis(400);
const IDLE: Duration = Duration::from_millis(600);
/// How late a deadline may be observed (loaded CI machines).
const SLACK: Duration = Duration::from_secs(5);

fn now() -> Instant {
    konn_core::io::clock::now()
}

fn start(engine: Engine, transport: Transport, dir: &TempDir, pki: &Pki) -> TestServer {
    let mut spec = ServerSpec::new(engine, Mode::Grpc, transport, dir);
    spec.pki = Some(pki);
    spec.workers = 1;
    spec.tweak = Some(Box::new(|s| {
        s.driver.preface_timeout = Some(PREFACE_T);
        s.driver.idle_timeout = Some(IDLE);
    }));
    spec.start()
}

/// Runs `scenario` on a fresh server for every engine and transport, and
/// checks that every descriptor is given back.
fn each_server(transports: &[Transport], scenario: impl Fn(Engine, &TestServer, &Pki)) {
    let _serial = serial();
    for engine in available_engines() {
        for &transport in transports {
            let dir = TempDir::new("hardening");
            let pki = Pki::new();
            let before = Baseline::take();
            let mut server = start(engine, transport, &dir, &pki);
            scenario(engine, &server, &pki);
            server.stop();
            assert_released(before, &format!("{engine} {transport:?}"));
        }
    }
}

/// Reads until the peer closes (EOF or reset); returns when that happened.
fn closed_at(mut sock: impl std::io::Read, limit: Duration) -> Instant {
    let deadline = now() + limit;
    let mut buf = [0u8; 4096];
    loop {
        assert!(now() < deadline, "still open after {limit:?}");
        match sock.read(&mut buf) {
            Ok(0) => return now(),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return now(),
            Ok(_) => {}
        }
    }
}

fn tcp(addr: SocketAddr) -> std::net::TcpStream {
    let s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(PREFACE_T + SLACK)).unwrap();
    s
}

fn unix(path: &Path) -> std::os::unix::net::UnixStream {
    let s = std::os::unix::net::UnixStream::connect(path).unwrap();
    s.set_read_timeout(Some(PREFACE_T + SLACK)).unwrap();
    s
}

/// A plaintext connection that sends `prefix` and stalls is closed at the
/// preface deadline, not before. The time counts from before `connect`:
/// the server's deadline starts at its accept, which cannot be earlier.
fn assert_plain_stall_closed<S: std::io::Read + std::io::Write>(
    what: &str,
    connect: impl FnOnce() -> S,
    prefix: &[u8],
) {
    let opened = now();
    let mut sock = connect();
    sock.write_all(prefix).unwrap();
    let took = closed_at(sock, PREFACE_T + SLACK) - opened;
    assert!(
        took >= PREFACE_T,
        "{what}: closed after {took:?}, before the deadline"
    );
}

#[test]
fn plaintext_listeners_close_connections_stalled_before_the_preface() {
    each_server(&[Transport::Unix], |engine, server, _| {
        let path = server.frontend().unix.unwrap();
        for (what, prefix) in [
            ("silent", &b""[..]),
            ("half a preface", &H2_PREFACE[..12]),
            ("preface without SETTINGS", H2_PREFACE),
        ] {
            assert_plain_stall_closed(
                &format!("{engine} frontend: {what}"),
                || unix(&path),
                prefix,
            );
            // The agent port of the test server is plaintext too.
            assert_plain_stall_closed(
                &format!("{engine} agent port: {what}"),
                || tcp(server.agent_addr()),
                prefix,
            );
        }
    });
}

/// Connects with TLS (`client`) to `addr`, then stalls; the server closes
/// the connection at the preface deadline. Returns the TLS error or EOF
/// the client saw.
fn tls_stall(addr: SocketAddr, client: &ClientTls) -> Duration {
    let client = client.clone();
    block_on(Engine::Epoll, async move {
        let opened = now();
        let sock = monoio::net::TcpStream::connect(addr).await.unwrap();
        let mut tls = TlsStream::connect(sock, &client).await.unwrap();
        let mut buf = BytesMut::new();
        let read = monoio::time::timeout(PREFACE_T + SLACK, async {
            loop {
                match tls.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => buf.clear(),
                }
            }
        })
        .await;
        assert!(read.is_ok(), "still open after {:?}", PREFACE_T + SLACK);
        now() - opened
    })
    .unwrap()
}

#[test]
fn tls_listeners_close_connections_stalled_in_or_after_the_handshake() {
    each_server(&[Transport::Tls], |engine, server, pki| {
        let frontend: SocketAddr = server.frontend().tcp.unwrap().parse().unwrap();
        for (name, addr, client) in [
            ("agent port", server.agent_addr(), pki.agent_client()),
            ("frontend", frontend, pki.frontend_client()),
        ] {
            // No ClientHello at all.
            assert_plain_stall_closed(&format!("{engine} {name}: silent"), || tcp(addr), b"");
            // Half a TLS record header: stalled inside the handshake.
            assert_plain_stall_closed(
                &format!("{engine} {name}: mid-handshake"),
                || tcp(addr),
                &[0x16, 0x03, 0x01],
            );
            // Handshake done, then no HTTP/2 preface.
            let took = tls_stall(addr, &client);
            assert!(took >= PREFACE_T, "{engine} {name}: closed after {took:?}");
        }
    });
}

/// Completes the HTTP/2 handshake on `c`, then waits for the idle GOAWAY
/// (answering the PING of the graceful shutdown) and the close.
fn assert_idle_closed(what: &str, mut c: RawClient) {
    let opened = now();
    c.handshake(&[]);
    let g = c.expect_goaway(IDLE + SLACK);
    let took = now() - opened;
    assert_eq!(g.reason, Reason::NO_ERROR, "{what}");
    assert_eq!(g.debug, "max_idle", "{what}");
    assert!(took >= IDLE, "{what}: GOAWAY after {took:?}");
    // Phase two of the shutdown follows the PING ACK.
    let ping = std::iter::from_fn(|| c.next_frame(SLACK))
        .find(|f| f.ty() == FrameType::PING)
        .unwrap_or_else(|| panic!("{what}: no PING after the first GOAWAY"));
    c.write(&h2raw::frame(FrameType::PING, flags::ACK, 0, &ping.payload))
        .unwrap();
    let frames = c.expect_closed(SLACK);
    assert!(
        frames.iter().any(|f| f.goaway().is_some()),
        "{what}: no final GOAWAY: {frames:?}"
    );
}

#[test]
fn idle_connections_get_goaway_and_close() {
    each_server(&[Transport::Unix], |engine, server, _| {
        let path = server.frontend().unix.unwrap();
        assert_idle_closed(
            &format!("{engine} frontend"),
            RawClient::connect_unix(&path),
        );
        assert_idle_closed(
            &format!("{engine} agent port"),
            RawClient::connect(server.agent_addr()),
        );
    });
}

#[test]
fn a_connection_with_an_open_stream_is_not_idle() {
    each_server(&[Transport::Unix], |engine, server, _| {
        let path = server.frontend().unix.unwrap();
        let mut c = RawClient::connect_unix(&path);
        c.handshake(&[]);
        let block = c.request_block(
            "POST",
            "/ProxyService/Proxy",
            &[("content-type", "application/grpc"), ("te", "trailers")],
        );
        c.write(&h2raw::headers(1, &block, false)).unwrap();
        // Three idle periods with the stream open: no GOAWAY.
        let until = now() + IDLE * 3;
        while let Some(left) = until.checked_duration_since(now()) {
            if let Some(f) = c.next_frame(left) {
                assert!(f.goaway().is_none(), "{engine}: {f:?}");
            }
        }
        // Ending the stream starts the idle clock.
        c.write(&h2raw::rst(1, Reason::CANCEL)).unwrap();
        let g = c.expect_goaway(IDLE + SLACK);
        assert_eq!(g.debug, "max_idle", "{engine}");
    });
}

/// A client certificate from another CA, or none, on both TLS ports: the
/// client reads the alert that names the problem.
#[test]
fn bad_client_certificates_get_the_tls_alert_that_names_them() {
    each_server(&[Transport::Tls], |engine, server, pki| {
        let stranger_dir = TempDir::new("stranger-pki");
        let stranger = konn_testkit::pki::write_pem(
            &stranger_dir.0,
            &konn_testkit::pki::generate_named("some other CA").unwrap(),
        )
        .unwrap();
        let trust = || PemSource::File(pki.files.ca_cert.clone());
        let mut wrong_ca = ClientTlsOptions::new(trust(), "127.0.0.1");
        wrong_ca.identity = Some((
            PemSource::File(stranger.agent_cert.clone()),
            PemSource::File(stranger.agent_key.clone()),
        ));
        let wrong_ca = wrong_ca.build().unwrap();
        let no_cert = ClientTlsOptions::new(trust(), "127.0.0.1").build().unwrap();
        let frontend: SocketAddr = server.frontend().tcp.unwrap().parse().unwrap();
        for addr in [server.agent_addr(), frontend] {
            for (client, alert) in [(&wrong_ca, "UnknownCA"), (&no_cert, "CertificateRequired")] {
                let client = client.clone();
                let err = block_on(Engine::Epoll, async move {
                    let sock = monoio::net::TcpStream::connect(addr).await.unwrap();
                    // TLS 1.3: the client's handshake completes before the
                    // server judges its certificate; the alert comes with
                    // the first read.
                    let mut tls = match TlsStream::connect(sock, &client).await {
                        Ok(t) => t,
                        Err(e) => return format!("{e:?}"),
                    };
                    let _ = tls.write_all(H2_PREFACE).await;
                    let mut buf = BytesMut::new();
                    match monoio::time::timeout(SLACK, tls.read(&mut buf)).await {
                        Ok(Err(e)) => format!("{e:?}"),
                        other => format!("no TLS error: {other:?}"),
                    }
                })
                .unwrap();
                assert!(
                    err.contains(&format!("AlertReceived({alert})")),
                    "{engine} {addr}: expected the {alert} alert, got {err}"
                );
            }
        }
    });
}

#[test]
fn enhance_your_calm_goaways_name_the_limit() {
    each_server(&[Transport::Unix], |engine, server, _| {
        let path = server.frontend().unix.unwrap();
        let mut c = RawClient::connect_unix(&path);
        c.handshake(&[]);
        // Nine HPACK dynamic table size updates in one block: over the
        // decoder's work limit.
        c.write(&h2raw::headers(1, &[0x20; 9], true)).unwrap();
        let g = c.expect_goaway(SLACK);
        assert_eq!(g.reason, Reason::ENHANCE_YOUR_CALM, "{engine}");
        assert_eq!(g.debug, "HPACK decoding work limit", "{engine}");
        c.expect_closed(SLACK);
    });
}
