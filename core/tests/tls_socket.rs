//! `TlsLayer` on real sockets through the async helper (`TlsStream`):
//! monoio TCP on 127.0.0.1:0 and a Unix socket, echo exchanges, handshake
//! timeouts, and hostile peers (silent, close_notify mid-handshake, 1-byte
//! TCP segments). Everything stays on loopback and is bounded in time.

mod tls_support;

use std::time::Duration;

use bytes::BytesMut;
use konn_core::Error;
use konn_core::io::tls::{ServerTls, TlsStream, handshake};
use monoio::io::{AsyncReadRent, AsyncWriteRent, AsyncWriteRentExt};
use monoio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tls_support::{Pki, TempDir};

fn run<F: Future>(f: F) -> F::Output {
    monoio::RuntimeBuilder::<monoio::FusionDriver>::new()
        .enable_timer()
        .build()
        .expect("monoio runtime")
        .block_on(f)
}

/// Same, on the epoll (legacy) driver that monoio falls back to when
/// io_uring is unavailable.
fn run_epoll<F: Future>(f: F) -> F::Output {
    monoio::RuntimeBuilder::<monoio::LegacyDriver>::new()
        .enable_timer()
        .build()
        .expect("monoio legacy runtime")
        .block_on(f)
}

/// Serves one TLS connection: echoes until a clean EOF, then closes.
/// Returns the number of bytes echoed.
async fn echo_server<S>(io: S, tls: ServerTls) -> Result<usize, Error>
where
    S: AsyncReadRent + AsyncWriteRent,
{
    let mut conn = TlsStream::accept(io, &tls).await?;
    assert_eq!(conn.tls().alpn_protocol(), Some(&b"h2"[..]));
    assert!(
        conn.tls().peer_certificates().is_some(),
        "mTLS: agent certificate"
    );
    let mut total = 0;
    let mut buf = BytesMut::new();
    loop {
        buf.clear();
        let n = conn.read(&mut buf).await?;
        if n == 0 {
            conn.close().await?;
            return Ok(total);
        }
        total += n;
        conn.write_all(&buf).await?;
    }
}

/// Sends `data`, reads it back, closes; checks the server's close too.
async fn echo_client<S>(io: S, pki: &Pki, data: &[u8])
where
    S: AsyncReadRent + AsyncWriteRent,
{
    let mut conn = TlsStream::connect(io, &pki.client_tls()).await.unwrap();
    assert_eq!(conn.tls().alpn_protocol(), Some(&b"h2"[..]));
    // Write a piece, read its echo back, repeat: the echo server only
    // writes what it read, so this can never deadlock on full buffers.
    let mut got = BytesMut::new();
    let mut sent = 0;
    for piece in data.chunks(8 * 1024) {
        conn.write_all(piece).await.unwrap();
        sent += piece.len();
        while got.len() < sent {
            assert!(conn.read(&mut got).await.unwrap() > 0, "early EOF");
        }
    }
    assert_eq!(&got[..], data);
    conn.close().await.unwrap();
    let mut rest = BytesMut::new();
    assert_eq!(
        conn.read(&mut rest).await.unwrap(),
        0,
        "clean close from the server"
    );
}

fn payload(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i % 253) as u8).collect()
}

#[test]
fn echo_over_tcp_loopback() {
    let pki = Pki::new();
    run(async {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let tls = pki.server_tls();
        let server = monoio::spawn(async move {
            let (sock, _) = listener.accept().await.unwrap();
            echo_server(sock, tls).await
        });
        let data = payload(300 * 1024 + 5);
        let sock = TcpStream::connect(addr).await.unwrap();
        echo_client(sock, &pki, &data).await;
        assert_eq!(server.await.unwrap(), data.len());
    });
}

#[test]
fn echo_over_tcp_with_the_epoll_driver() {
    let pki = Pki::new();
    run_epoll(async {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let tls = pki.server_tls();
        let server = monoio::spawn(async move {
            let (sock, _) = listener.accept().await.unwrap();
            echo_server(sock, tls).await
        });
        let data = payload(100 * 1024);
        let sock = TcpStream::connect(addr).await.unwrap();
        echo_client(sock, &pki, &data).await;
        assert_eq!(server.await.unwrap(), data.len());
        // The timeout path works on this driver too.
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let _silent = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (sock, _) = listener.accept().await.unwrap();
        let r = TlsStream::accept(sock, &short_timeout(&pki)).await;
        assert!(matches!(r, Err(Error::TlsHandshakeTimeout(_))), "{r:?}");
    });
}

#[test]
fn echo_over_unix_socket() {
    let pki = Pki::new();
    let dir = TempDir::new();
    let path = dir.path().join("tls.sock");
    run(async {
        // monoio's default listener options set SO_REUSEPORT, which Linux
        // refuses on Unix sockets (EOPNOTSUPP): turn it off.
        let opts = monoio::net::ListenerOpts::new().reuse_port(false);
        let listener = UnixListener::bind_with_config(&path, &opts).unwrap();
        let tls = pki.server_tls();
        let server = monoio::spawn(async move {
            let (sock, _) = listener.accept().await.unwrap();
            echo_server(sock, tls).await
        });
        let data = payload(64 * 1024);
        let sock = UnixStream::connect(&path).await.unwrap();
        echo_client(sock, &pki, &data).await;
        assert_eq!(server.await.unwrap(), data.len());
    });
}

/// Wall-clock time of `f`, for asserting that timeouts fire promptly.
async fn timed<T>(f: impl Future<Output = T>) -> (T, Duration) {
    // Tests may read the clock: only the sans-IO layers must not.
    #[allow(clippy::disallowed_methods)]
    let start = std::time::Instant::now();
    let out = f.await;
    (out, start.elapsed())
}

fn short_timeout(pki: &Pki) -> ServerTls {
    let mut o = pki.server_options();
    o.limits.handshake_timeout = Duration::from_millis(300);
    o.build().unwrap()
}

#[test]
fn silent_client_hits_the_handshake_timeout() {
    let pki = Pki::new();
    run(async {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let _silent = TcpStream::connect(addr).await.unwrap();
        let (sock, _) = listener.accept().await.unwrap();
        let (r, took) = timed(TlsStream::accept(sock, &short_timeout(&pki))).await;
        assert!(matches!(r, Err(Error::TlsHandshakeTimeout(d)) if d == Duration::from_millis(300)));
        assert!(
            took >= Duration::from_millis(250) && took < Duration::from_secs(5),
            "{took:?}"
        );
    });
}

/// Connects a raw socket to a fresh TLS server (300 ms handshake timeout),
/// sends `bytes`, keeps the socket open, and returns the server's outcome
/// and how long it took.
async fn raw_peer_sends(pki: &Pki, bytes: Vec<u8>) -> (Result<(), Error>, Duration) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let mut raw = TcpStream::connect(addr).await.unwrap();
    let (sock, _) = listener.accept().await.unwrap();
    let (r, _) = raw.write_all(bytes).await;
    r.unwrap();
    let (r, took) = timed(TlsStream::accept(sock, &short_timeout(pki))).await;
    drop(raw);
    (r.map(|_| ()), took)
}

const CLOSE_NOTIFY: [u8; 7] = [0x15, 0x03, 0x03, 0x00, 0x02, 0x01, 0x00];

#[test]
fn close_notify_before_the_hello_on_an_open_socket_ends_at_the_deadline() {
    // RUSTSEC-2024-0336 on a real socket: rustls ignores an unauthenticated
    // close_notify before the version is known; the peer keeps the socket
    // open. The server must not spin: it waits, and the deadline ends it.
    let pki = Pki::new();
    run(async {
        let (r, took) = raw_peer_sends(&pki, CLOSE_NOTIFY.to_vec()).await;
        assert!(matches!(r, Err(Error::TlsHandshakeTimeout(_))), "{r:?}");
        assert!(
            took >= Duration::from_millis(250) && took < Duration::from_secs(5),
            "{took:?}"
        );
    });
}

#[test]
fn close_notify_after_the_hello_on_an_open_socket_fails_at_once() {
    // Once TLS 1.3 is negotiated, a close_notify during the handshake is
    // fatal: the server fails immediately instead of waiting.
    let pki = Pki::new();
    run(async {
        let mut c = pki.client_tls().layer().unwrap();
        let mut wire = BytesMut::new();
        c.take_tls(&mut wire);
        wire.extend_from_slice(&CLOSE_NOTIFY);
        let (r, took) = raw_peer_sends(&pki, wire.to_vec()).await;
        assert!(
            matches!(
                r,
                Err(Error::Tls(rustls::Error::AlertReceived(
                    rustls::AlertDescription::CloseNotify
                )))
            ),
            "{r:?}"
        );
        assert!(took < Duration::from_millis(250), "{took:?}");
    });
}

#[test]
fn close_notify_then_eof_mid_handshake_fails_fast() {
    let pki = Pki::new();
    run(async {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let mut raw = TcpStream::connect(addr).await.unwrap();
        let (sock, _) = listener.accept().await.unwrap();
        let (r, _) = raw.write_all(CLOSE_NOTIFY.to_vec()).await;
        r.unwrap();
        raw.shutdown().await.unwrap();
        let mut slow = pki.server_options();
        slow.limits.handshake_timeout = Duration::from_secs(30);
        let (r, took) = timed(TlsStream::accept(sock, &slow.build().unwrap())).await;
        assert!(matches!(r, Err(Error::TlsHandshakeEof)), "{r:?}");
        assert!(took < Duration::from_secs(5), "{took:?}");
    });
}

#[test]
fn client_hello_in_one_byte_records_and_one_byte_segments() {
    // RUSTSEC-2024-0399 on a socket: 1-byte TLS records, each byte written
    // in its own TCP segment (TCP_NODELAY).
    let pki = Pki::new();
    run(async {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let tls = pki.server_tls();
        let server = monoio::spawn(async move {
            let (sock, _) = listener.accept().await.unwrap();
            echo_server(sock, tls).await
        });
        let mut raw = TcpStream::connect(addr).await.unwrap();
        raw.set_nodelay(true).unwrap();
        let client = pki.client_tls();
        let mut c = client.layer().unwrap();
        let mut hello = BytesMut::new();
        c.take_tls(&mut hello);
        let len = usize::from(u16::from_be_bytes([hello[3], hello[4]]));
        assert_eq!(hello.len(), 5 + len, "the hello is one record");
        for &b in &hello[5..] {
            let (r, _) = raw.write_all(vec![0x16, 0x03, 0x01, 0x00, 0x01, b]).await;
            r.unwrap();
        }
        // The rest of the handshake and an echo through the helper.
        let mut conn = handshake(raw, c, Duration::from_secs(10)).await.unwrap();
        conn.write_all(b"fragmented hello worked").await.unwrap();
        let mut got = BytesMut::new();
        while got.len() < 23 {
            assert!(conn.read(&mut got).await.unwrap() > 0);
        }
        assert_eq!(&got[..], b"fragmented hello worked");
        conn.close().await.unwrap();
        assert_eq!(server.await.unwrap(), 23);
    });
}

#[test]
fn rejected_client_certificate_over_a_socket() {
    let pki = Pki::new();
    run(async {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let tls = pki.server_tls();
        let server = monoio::spawn(async move {
            let (sock, _) = listener.accept().await.unwrap();
            TlsStream::accept(sock, &tls).await.map(|_| ())
        });
        let mut co = pki.client_options("localhost");
        co.identity = Some((
            pki.foreign_client.cert_source("intruder"),
            pki.foreign_client.key_source("intruder"),
        ));
        let sock = TcpStream::connect(addr).await.unwrap();
        // TLS 1.3: the client completes its side before the server checks
        // the certificate; the rejection arrives as an alert on first read.
        let outcome = match TlsStream::connect(sock, &co.build().unwrap()).await {
            Err(e) => e,
            Ok(mut conn) => conn.read(&mut BytesMut::new()).await.unwrap_err(),
        };
        assert!(
            matches!(
                outcome,
                Error::Tls(rustls::Error::AlertReceived(
                    rustls::AlertDescription::UnknownCA
                ))
            ),
            "{outcome:?}"
        );
        let server_err = server.await.unwrap_err();
        assert!(
            server_err.is_peer_authentication_failure(),
            "{server_err:?}"
        );
    });
}

#[test]
fn peer_vanishing_after_the_handshake_is_truncation() {
    let pki = Pki::new();
    run(async {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let tls = pki.server_tls();
        let server = monoio::spawn(async move {
            let (sock, _) = listener.accept().await.unwrap();
            let mut conn = TlsStream::accept(sock, &tls).await.unwrap();
            let mut buf = BytesMut::new();
            let first = conn.read(&mut buf).await;
            let second = conn.read(&mut buf).await;
            (first, second)
        });
        let sock = TcpStream::connect(addr).await.unwrap();
        let mut conn = TlsStream::connect(sock, &pki.client_tls()).await.unwrap();
        conn.write_all(b"half").await.unwrap();
        // Shut the socket (FIN) without close_notify. (Dropping it instead
        // could send RST, because the server's session tickets are unread.)
        let (mut sock, _tls, _) = conn.into_parts();
        sock.shutdown().await.unwrap();
        let (first, second) = server.await;
        drop(sock);
        assert_eq!(first.unwrap(), 4);
        assert!(matches!(second, Err(Error::TlsTruncated)), "{second:?}");
    });
}
