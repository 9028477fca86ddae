//! The connection driver on real sockets: a gRPC bidi echo between konn's
//! server and client roles over TCP (plaintext and mTLS) and a Unix socket,
//! under both io engines, with a leak check on file descriptors.

mod tls_support;

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::time::Duration;

use bytes::Bytes;
use konn_core::io::driver::{ConnHandle, DriverConfig, Handler};
use konn_core::io::notify::Notify;
use konn_core::io::runtime::{Either, race};
use konn_core::io::tls::TlsLayer;
use konn_frames::GrpcStatus;
use konn_protocol::grpc::{Grpc, GrpcEvent};
use konn_protocol::h2::{Config, Connection, Headers, Role};
use konn_testkit::fds::{assert_fds_back_to, open_fds, serial};
use monoio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tls_support::{Pki, TempDir};

const MESSAGES: u32 = 10_000;

fn on_engines(f: impl Fn() -> std::pin::Pin<Box<dyn Future<Output = ()>>>) {
    monoio::RuntimeBuilder::<monoio::IoUringDriver>::new()
        .enable_timer()
        .build()
        .expect("io_uring runtime")
        .block_on(f());
    monoio::RuntimeBuilder::<monoio::LegacyDriver>::new()
        .enable_timer()
        .build()
        .expect("epoll runtime")
        .block_on(f());
}

fn now() -> std::time::Instant {
    konn_core::io::clock::now()
}

/// Echoes every message back; finishes the call OK on half-close.
struct EchoServer;

impl Handler<Grpc> for EchoServer {
    fn on_event(&mut self, grpc: &mut Grpc, event: GrpcEvent) {
        match event {
            GrpcEvent::Call { id, path, .. } => {
                if path == "/Echo/Echo" {
                    let mut md = Headers::new();
                    md.push_static("serverid", "test");
                    grpc.accept(id, &md).unwrap();
                } else {
                    grpc.finish(id, GrpcStatus::UNIMPLEMENTED, "no such method")
                        .unwrap();
                }
            }
            GrpcEvent::Message { id, msg, flow, .. } => {
                grpc.send_message(id, &msg).unwrap();
                grpc.release(id, flow);
            }
            GrpcEvent::HalfClose { id } => grpc.finish(id, GrpcStatus::OK, "").unwrap(),
            _ => {}
        }
    }
}

/// Collects what comes back and wakes the test.
#[derive(Default)]
struct Client {
    got: Rc<RefCell<Vec<Bytes>>>,
    status: Rc<Cell<Option<GrpcStatus>>>,
    serverid: Rc<RefCell<Option<Bytes>>>,
    wake: Rc<Notify>,
}

impl Handler<Grpc> for Client {
    fn on_event(&mut self, grpc: &mut Grpc, event: GrpcEvent) {
        match event {
            GrpcEvent::ResponseHeaders { metadata, .. } => {
                *self.serverid.borrow_mut() = metadata.get(b"serverid").cloned();
            }
            GrpcEvent::Message { id, msg, flow, .. } => {
                grpc.release(id, flow);
                self.got.borrow_mut().push(msg);
            }
            GrpcEvent::Finished { status, .. } => self.status.set(Some(status)),
            _ => {}
        }
        self.wake.notify();
    }
}

fn server_conn(tls: Option<TlsLayer>) -> ConnHandle<Grpc, EchoServer> {
    let grpc = Grpc::new(Connection::new(Config::new(Role::Server), now()), 4 << 20);
    ConnHandle::new(grpc, tls, EchoServer, DriverConfig::default())
}

/// Runs a client over `io`: MESSAGES messages of varied sizes, checks the
/// echo, the metadata and the final status.
async fn run_client<S>(io: S, tls: Option<TlsLayer>)
where
    S: monoio::io::Splitable + 'static,
    S::OwnedRead: monoio::io::AsyncReadRent + konn_core::io::sock::ReadReady + 'static,
    S::OwnedWrite: monoio::io::AsyncWriteRent + 'static,
{
    let client = Client::default();
    let (got, status, serverid, wake) = (
        client.got.clone(),
        client.status.clone(),
        client.serverid.clone(),
        client.wake.clone(),
    );
    let grpc = Grpc::new(Connection::new(Config::new(Role::Client), now()), 4 << 20);
    let handle = ConnHandle::new(grpc, tls, client, DriverConfig::default());
    let h = handle.clone();
    let task = monoio::spawn(async move { h.run(io).await });
    let id = handle
        .with(|g, _| {
            g.start_call(
                "http",
                Bytes::from_static(b"localhost"),
                Bytes::from_static(b"/Echo/Echo"),
                &Headers::new(),
            )
        })
        .unwrap()
        .unwrap();
    let sent: Vec<Vec<u8>> = (0..MESSAGES)
        .map(|i| vec![(i % 256) as u8; (i as usize * 37) % 3000])
        .collect();
    let mut sent_so_far = 0;
    for chunk in sent.chunks(500) {
        handle
            .with(|g, _| {
                for m in chunk {
                    g.send_message(id, m).unwrap();
                }
            })
            .unwrap();
        sent_so_far += chunk.len();
        // Let the echo catch up so queues stay bounded.
        while got.borrow().len() + 2000 < sent_so_far {
            wake.notified().await;
        }
    }
    handle.with(|g, _| g.close_send(id).unwrap()).unwrap();
    let deadline = monoio::time::Instant::now() + Duration::from_secs(20);
    while status.get().is_none() {
        if let Either::Right(()) = race(wake.notified(), monoio::time::sleep_until(deadline)).await
        {
            panic!("no final status; got {} messages", got.borrow().len());
        }
    }
    assert_eq!(status.get(), Some(GrpcStatus::OK));
    assert_eq!(serverid.borrow().as_deref(), Some(&b"test"[..]));
    {
        let got = got.borrow();
        assert_eq!(got.len(), sent.len());
        for (a, b) in got.iter().zip(&sent) {
            assert_eq!(&a[..], &b[..]);
        }
    }
    handle.shutdown();
    let _ = task.await;
}

#[test]
fn grpc_echo_over_tcp_plaintext() {
    let _serial = serial();
    let before = open_fds();
    on_engines(|| {
        Box::pin(async {
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = listener.local_addr().unwrap();
            let server = monoio::spawn(async move {
                let (s, _) = listener.accept().await.unwrap();
                s.set_nodelay(true).unwrap();
                server_conn(None).run(s).await
            });
            let io = TcpStream::connect(addr).await.unwrap();
            run_client(io, None).await;
            server.await.unwrap();
        })
    });
    assert_fds_back_to(before, "descriptors");
}

#[test]
fn grpc_echo_over_unix_socket() {
    let _serial = serial();
    let before = open_fds();
    let dir = TempDir::new();
    let path = dir.path().join("grpc.sock");
    on_engines(|| {
        let path = path.clone();
        Box::pin(async move {
            let _ = std::fs::remove_file(&path);
            let std_listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
            let listener = UnixListener::from_std(std_listener).unwrap();
            let server = monoio::spawn(async move {
                let (s, _) = listener.accept().await.unwrap();
                server_conn(None).run(s).await
            });
            let io = UnixStream::connect(&path).await.unwrap();
            run_client(io, None).await;
            server.await.unwrap();
        })
    });
    assert_fds_back_to(before, "descriptors");
}

#[test]
fn grpc_echo_over_mtls() {
    let _serial = serial();
    let before = open_fds();
    let pki = Pki::new();
    on_engines(|| {
        let server_tls = pki.server_tls();
        let client_tls = pki.client_tls();
        Box::pin(async move {
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = listener.local_addr().unwrap();
            let server = monoio::spawn(async move {
                let (s, _) = listener.accept().await.unwrap();
                server_conn(Some(server_tls.layer().unwrap())).run(s).await
            });
            let io = TcpStream::connect(addr).await.unwrap();
            run_client(io, Some(client_tls.layer().unwrap())).await;
            server.await.unwrap();
        })
    });
    assert_fds_back_to(before, "descriptors");
}

#[test]
fn unknown_method_is_unimplemented() {
    let _serial = serial();
    on_engines(|| {
        Box::pin(async {
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = listener.local_addr().unwrap();
            let server = monoio::spawn(async move {
                let (s, _) = listener.accept().await.unwrap();
                server_conn(None).run(s).await
            });
            let client = Client::default();
            let (status, wake) = (client.status.clone(), client.wake.clone());
            let grpc = Grpc::new(Connection::new(Config::new(Role::Client), now()), 4 << 20);
            let handle = ConnHandle::new(grpc, None, client, DriverConfig::default());
            let h = handle.clone();
            let io = TcpStream::connect(addr).await.unwrap();
            let task = monoio::spawn(async move { h.run(io).await });
            handle
                .with(|g, _| {
                    g.start_call(
                        "http",
                        Bytes::from_static(b"h"),
                        Bytes::from_static(b"/No/Such"),
                        &Headers::new(),
                    )
                })
                .unwrap()
                .unwrap();
            while status.get().is_none() {
                wake.notified().await;
            }
            assert_eq!(status.get(), Some(GrpcStatus::UNIMPLEMENTED));
            handle.shutdown();
            task.await.unwrap();
            server.await.unwrap();
        })
    });
}

#[test]
fn peer_vanishing_ends_calls_unavailable() {
    let _serial = serial();
    on_engines(|| {
        Box::pin(async {
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = listener.local_addr().unwrap();
            // A "server" that reads a little and then drops the connection.
            let server = monoio::spawn(async move {
                use monoio::io::AsyncReadRent;
                let (mut s, _) = listener.accept().await.unwrap();
                let (r, _) = s.read(vec![0u8; 64]).await;
                r.unwrap();
            });
            let client = Client::default();
            let (status, wake) = (client.status.clone(), client.wake.clone());
            let grpc = Grpc::new(Connection::new(Config::new(Role::Client), now()), 4 << 20);
            let handle = ConnHandle::new(grpc, None, client, DriverConfig::default());
            let h = handle.clone();
            let io = TcpStream::connect(addr).await.unwrap();
            let task = monoio::spawn(async move { h.run(io).await });
            handle
                .with(|g, _| {
                    g.start_call(
                        "http",
                        Bytes::from_static(b"h"),
                        Bytes::from_static(b"/Echo/Echo"),
                        &Headers::new(),
                    )
                })
                .unwrap()
                .unwrap();
            server.await;
            let deadline = monoio::time::Instant::now() + Duration::from_secs(5);
            while status.get().is_none() {
                if let Either::Right(()) =
                    race(wake.notified(), monoio::time::sleep_until(deadline)).await
                {
                    panic!("call not ended after the peer left");
                }
            }
            assert_eq!(status.get(), Some(GrpcStatus::UNAVAILABLE));
            let _ = task.await;
            assert!(handle.is_closed());
        })
    });
}

/// A Unix socket's write half is not shut down when the driver ends (its
/// drop does nothing, `Wr::close`): the peer, which has not closed its own
/// side, must still see the end of stream — the socket's close, once the
/// driver's reader has stopped.
#[test]
fn a_unix_peer_sees_the_end_when_the_driver_ends() {
    let _serial = serial();
    let before = open_fds();
    // epoll only: under io_uring the cancelled read's socket is closed
    // asynchronously, after this test's descriptor check (the driver's
    // close path is the same on both engines).
    monoio::RuntimeBuilder::<monoio::LegacyDriver>::new()
        .enable_timer()
        .build()
        .expect("epoll runtime")
        .block_on(async {
            use monoio::io::{AsyncReadRent, AsyncWriteRentExt};
            let (ours, mut peer) = UnixStream::pair().unwrap();
            let server = server_conn(None);
            let handle = server.clone();
            let task = monoio::spawn(async move { server.run(ours).await });
            let mut hello = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
            hello.extend_from_slice(&[0, 0, 0, 4, 0, 0, 0, 0, 0]);
            let (r, _) = peer.write_all(hello).await;
            r.unwrap();
            // The server's SETTINGS: it has read ours (a close with unread
            // input would be a reset, shut down first or not).
            let (r, _) = peer.read(vec![0u8; 4096]).await;
            assert!(r.unwrap() > 0);
            handle.abort();
            let deadline = monoio::time::Instant::now() + Duration::from_secs(5);
            let mut got = 0;
            loop {
                let read = race(
                    peer.read(vec![0u8; 4096]),
                    monoio::time::sleep_until(deadline),
                )
                .await;
                let Either::Left((r, _)) = read else {
                    panic!("no end of stream after {got} bytes");
                };
                match r.unwrap() {
                    0 => break,
                    n => got += n,
                }
            }
            let _ = task.await;
            assert!(handle.is_closed());
        });
    assert_fds_back_to(before, "descriptors");
}
