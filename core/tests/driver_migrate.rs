//! A live gRPC connection moved between threads: the server handler stops
//! its connection at the first message (`run_detachable`), the socket and
//! the sans-IO state cross to another thread's runtime
//! (`io::xcore::detach_tcp` / `attach`), and the connection continues there
//! with the stashed message replayed — the client notices nothing. Plain
//! TCP and mTLS, under both io engines.

mod tls_support;

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::time::Duration;

use bytes::Bytes;
use konn_core::io::driver::{ConnHandle, DriverConfig, Handler};
use konn_core::io::notify::Notify;
use konn_core::io::runtime::{Either, Engine, available_engines, block_on, race};
use konn_core::io::tls::TlsLayer;
use konn_core::io::xcore::detach_tcp;
use konn_frames::GrpcStatus;
use konn_protocol::grpc::{Grpc, GrpcEvent};
use konn_protocol::h2::{Config, Connection, Headers, Role};
use monoio::net::{TcpListener, TcpStream};
use tls_support::Pki;

const MESSAGES: u32 = 2000;

fn now() -> std::time::Instant {
    konn_core::io::clock::now()
}

/// First life of the server connection: accept the call, then stop at the
/// first message and keep it for the next life.
struct Before {
    detach: Option<Rc<Cell<bool>>>,
    stashed: Rc<RefCell<Vec<GrpcEvent>>>,
}

impl Handler<Grpc> for Before {
    fn on_event(&mut self, grpc: &mut Grpc, event: GrpcEvent) {
        match event {
            GrpcEvent::Call { id, .. } => grpc.accept(id, &Headers::new()).unwrap(),
            other => {
                self.stashed.borrow_mut().push(other);
                if let Some(flag) = &self.detach {
                    flag.set(true);
                }
            }
        }
    }
}

/// Second life: echo.
struct After;

impl Handler<Grpc> for After {
    fn on_event(&mut self, grpc: &mut Grpc, event: GrpcEvent) {
        match event {
            GrpcEvent::Message { id, msg, flow, .. } => {
                grpc.send_message(id, &msg).unwrap();
                grpc.release(id, flow);
            }
            GrpcEvent::HalfClose { id } => grpc.finish(id, GrpcStatus::OK, "").unwrap(),
            _ => {}
        }
    }
}

#[derive(Default)]
struct Client {
    got: Rc<Cell<u32>>,
    status: Rc<Cell<Option<GrpcStatus>>>,
    wake: Rc<Notify>,
}

impl Handler<Grpc> for Client {
    fn on_event(&mut self, grpc: &mut Grpc, event: GrpcEvent) {
        match event {
            GrpcEvent::Message { id, msg, flow, .. } => {
                assert_eq!(
                    u32::from_be_bytes(msg[..4].try_into().unwrap()),
                    self.got.get(),
                    "in order"
                );
                self.got.set(self.got.get() + 1);
                grpc.release(id, flow);
            }
            GrpcEvent::Finished { status, .. } => self.status.set(Some(status)),
            _ => {}
        }
        self.wake.notify();
    }
}

fn migrate_and_echo(engine: Engine, pki: Option<&Pki>) {
    let server_tls = pki.map(Pki::server_tls);
    let client_tls = pki.map(Pki::client_tls);
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();

    // The first server thread: accept, run until the first message, detach.
    let (tx, rx) = std::sync::mpsc::channel();
    let first = std::thread::spawn(move || {
        block_on(engine, async move {
            let listener = TcpListener::from_std(listener).unwrap();
            let (sock, _) = listener.accept().await.unwrap();
            let stashed = Rc::new(RefCell::new(Vec::new()));
            let before = Before {
                detach: None,
                stashed: stashed.clone(),
            };
            let grpc = Grpc::new(Connection::new(Config::new(Role::Server), now()), 4 << 20);
            let tls: Option<TlsLayer> = server_tls.map(|t| t.layer().unwrap());
            let handle = ConnHandle::new(grpc, tls, before, DriverConfig::default());
            let flag = handle.detach_flag();
            handle.with(|_, h| h.detach = Some(flag)).unwrap();
            let detached = handle
                .run_detachable(sock)
                .await
                .unwrap()
                .expect("detached");
            let fd = detach_tcp(detached.io).map_err(|(_, e)| e).unwrap();
            let events = std::mem::take(&mut *stashed.borrow_mut());
            tx.send((fd, detached.session, detached.tls, detached.input, events))
                .unwrap();
        })
        .unwrap();
    });

    // The second server thread: attach and continue.
    let second = std::thread::spawn(move || {
        block_on(engine, async move {
            let (fd, session, tls, input, events) = rx.recv().unwrap();
            let sock = fd.attach().unwrap();
            let handle = ConnHandle::resume(session, tls, input, After, DriverConfig::default());
            handle
                .with(|g, h| {
                    for e in events {
                        h.on_event(g, e);
                    }
                })
                .unwrap();
            handle.run(sock).await.unwrap();
        })
        .unwrap();
    });

    // The client, on this thread.
    block_on(engine, async move {
        let client = Client::default();
        let (got, status, wake) = (
            client.got.clone(),
            client.status.clone(),
            client.wake.clone(),
        );
        let grpc = Grpc::new(Connection::new(Config::new(Role::Client), now()), 4 << 20);
        let tls = client_tls.map(|t| t.layer().unwrap());
        let handle = ConnHandle::new(grpc, tls, client, DriverConfig::default());
        let h = handle.clone();
        let sock = TcpStream::connect(addr).await.unwrap();
        let task = monoio::spawn(async move { h.run(sock).await });
        let id = handle
            .with(|g, _| {
                g.start_call(
                    "https",
                    Bytes::from_static(b"localhost"),
                    Bytes::from_static(b"/E/E"),
                    &Headers::new(),
                )
            })
            .unwrap()
            .unwrap();
        for i in 0..MESSAGES {
            handle
                .with(|g, _| g.send_message(id, &i.to_be_bytes()).unwrap())
                .unwrap();
            if i % 100 == 0 {
                monoio::time::sleep(Duration::from_millis(1)).await;
            }
        }
        handle.with(|g, _| g.close_send(id).unwrap()).unwrap();
        let deadline = monoio::time::Instant::now() + Duration::from_secs(20);
        while status.get().is_none() {
            if let Either::Right(()) =
                race(wake.notified(), monoio::time::sleep_until(deadline)).await
            {
                panic!("no status; {} echoes", got.get());
            }
        }
        assert_eq!(status.get(), Some(GrpcStatus::OK));
        assert_eq!(got.get(), MESSAGES);
        handle.shutdown();
        let _ = task.await;
    })
    .unwrap();
    first.join().unwrap();
    second.join().unwrap();
}

#[test]
fn migrated_connection_continues_plain() {
    for engine in available_engines() {
        migrate_and_echo(engine, None);
    }
}

#[test]
fn migrated_connection_continues_under_tls() {
    let pki = Pki::new();
    for engine in available_engines() {
        migrate_and_echo(engine, Some(&pki));
    }
}
