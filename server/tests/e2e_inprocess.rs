//! proxy-server and a konn agent tunnel in one process, over real sockets:
//! a frontend dials an echo server through the tunnel (gRPC frontend over a
//! Unix socket, and HTTP CONNECT), data flows both ways, errors map like
//! upstream, and everything is cleaned up.

use std::cell::RefCell;
use std::path::PathBuf;
use std::rc::Rc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use konn_agent::client::{ConnectParams, run_tunnel};
use konn_agent::conn::TunnelSettings;
use konn_core::io::driver::{ConnHandle, DriverConfig, Handler};
use konn_core::io::notify::Notify;
use konn_core::io::pool::{BufPool, MemoryBudget, PoolConfig};
use konn_core::io::runtime::{Either, Engine, IoEngine, available_engines, block_on, race};
use konn_frames::packet::{ByteStr, Packet};
use konn_protocol::grpc::{Grpc, GrpcEvent};
use konn_protocol::h2::{Config, Connection, Headers, Role};
use konn_server::serve::{ServerHandle, start};
use konn_server::settings::{FrontendListen, Mode, ServerSettings};
use monoio::io::{AsyncReadRent, AsyncWriteRentExt};
use monoio::net::UnixStream;

struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> Self {
        let n = std::time::SystemTime::UNIX_EPOCH
            .elapsed()
            .unwrap_or_default()
            .as_nanos();
        let p = std::env::temp_dir().join(format!("konn-e2e-{tag}-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&p).unwrap();
        Self(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn engine_flag(e: Engine) -> IoEngine {
    match e {
        Engine::IoUring => IoEngine::IoUring,
        Engine::Epoll => IoEngine::Epoll,
    }
}

/// A TCP echo server on its own thread (stops with the test process).
fn echo_server() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { return };
            std::thread::spawn(move || {
                let mut r = s.try_clone().unwrap();
                let _ = std::io::copy(&mut r, &mut s);
            });
        }
    });
    addr
}

/// Start a server (2 workers) and one agent tunnel (its own thread).
fn setup(engine: Engine, mode: Mode, dir: &TempDir) -> ServerHandle {
    let mut settings =
        ServerSettings::for_tests(FrontendListen::Unix(dir.0.join("konn.sock")), mode);
    settings.runtime.workers = 2;
    settings.runtime.engine = engine_flag(engine);
    let server = start(settings).unwrap();
    let address = server.agent_addr().to_string();
    std::thread::spawn(move || {
        let _ = block_on(engine, async move {
            let budget = MemoryBudget::new(64 << 20);
            let pool = BufPool::new(&budget, &PoolConfig::default());
            let params = ConnectParams {
                address,
                tls: None,
                agent_id: "agent-e2e".into(),
                agent_identifiers: "host=localhost".into(),
                token_path: None,
                keepalive_time: Duration::from_secs(3600),
                connect_timeout: Duration::from_secs(5),
                settings: TunnelSettings::default(),
                driver: DriverConfig::default(),
            };
            let _ = run_tunnel(Rc::new(params), pool, Box::new(|_| {})).await;
        });
    });
    // Wait until the agent registered.
    for _ in 0..500 {
        if server
            .shared()
            .backends
            .load(std::sync::atomic::Ordering::Relaxed)
            > 0
        {
            return server;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("agent did not connect");
}

/// A konnectivity-client-like frontend: one Proxy stream.
#[derive(Default)]
struct Frontend {
    got: Rc<RefCell<Vec<Packet>>>,
    wake: Rc<Notify>,
}

impl Handler<Grpc> for Frontend {
    fn on_event(&mut self, grpc: &mut Grpc, event: GrpcEvent) {
        if let GrpcEvent::Message { id, msg, flow, .. } = event {
            self.got.borrow_mut().push(Packet::decode(&msg).unwrap());
            grpc.release(id, flow);
        }
        self.wake.notify();
    }
}

fn send(h: &ConnHandle<Grpc, Frontend>, id: u32, p: &Packet) {
    let mut b = BytesMut::new();
    p.encode_grpc(&mut b);
    h.with(|g, _| g.send_framed(id, b.freeze()).unwrap())
        .unwrap();
}

async fn expect(
    got: &Rc<RefCell<Vec<Packet>>>,
    wake: &Notify,
    f: impl Fn(&Packet) -> bool,
) -> Packet {
    let deadline = monoio::time::Instant::now() + Duration::from_secs(10);
    loop {
        {
            let mut g = got.borrow_mut();
            if let Some(i) = g.iter().position(&f) {
                return g.remove(i);
            }
        }
        if let Either::Right(()) = race(wake.notified(), monoio::time::sleep_until(deadline)).await
        {
            panic!("expected packet not received; got {:?}", got.borrow());
        }
    }
}

async fn grpc_roundtrip(socket: PathBuf, dest: String, random: i64) {
    let fe = Frontend::default();
    let (got, wake) = (fe.got.clone(), fe.wake.clone());
    let grpc = Grpc::new(
        Connection::new(Config::new(Role::Client), konn_core::io::clock::now()),
        4 << 20,
    );
    let h = ConnHandle::new(grpc, None, fe, DriverConfig::default());
    let h2 = h.clone();
    let sock = UnixStream::connect(&socket).await.unwrap();
    let task = monoio::spawn(async move { h2.run(sock).await });
    let id = h
        .with(|g, _| {
            g.start_call(
                "http",
                Bytes::from_static(b"localhost"),
                Bytes::from_static(b"/ProxyService/Proxy"),
                &Headers::new(),
            )
        })
        .unwrap()
        .unwrap();
    send(
        &h,
        id,
        &Packet::DialReq {
            protocol: ByteStr::from_static("tcp"),
            address: ByteStr::from(dest),
            random,
        },
    );
    let rsp = expect(&got, &wake, |p| matches!(p, Packet::DialRsp { .. })).await;
    let Packet::DialRsp {
        error,
        connect_id,
        random: r,
    } = rsp
    else {
        unreachable!()
    };
    assert_eq!((error.as_str(), r), ("", random));
    assert_ne!(connect_id, 0);
    let payload: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 256) as u8).collect();
    for chunk in payload.chunks(32 * 1024) {
        send(
            &h,
            id,
            &Packet::Data {
                connect_id,
                error: ByteStr::new(),
                data: Bytes::copy_from_slice(chunk),
            },
        );
    }
    let mut echoed = Vec::new();
    while echoed.len() < payload.len() {
        let p = expect(&got, &wake, |p| matches!(p, Packet::Data { .. })).await;
        let Packet::Data { data, .. } = p else {
            unreachable!()
        };
        echoed.extend_from_slice(&data);
    }
    assert_eq!(echoed, payload);
    send(&h, id, &Packet::CloseReq { connect_id });
    expect(&got, &wake, |p| matches!(p, Packet::CloseRsp { .. })).await;
    h.with(|g, _| g.close_send(id).unwrap()).unwrap();
    h.shutdown();
    let _ = task.await;
}

#[test]
fn grpc_frontend_through_a_tunnel() {
    let dest = echo_server();
    for engine in available_engines() {
        let dir = TempDir::new("grpc");
        let server = setup(engine, Mode::Grpc, &dir);
        let socket = server.frontend_path().unwrap().to_path_buf();
        let dest = dest.clone();
        block_on(engine, async move {
            // Several frontends: some land on the agent's core, some move.
            for i in 0..6 {
                grpc_roundtrip(socket.clone(), dest.clone(), 1000 + i).await;
            }
        })
        .unwrap();
        server.stop().unwrap();
    }
}

#[test]
fn http_connect_through_a_tunnel() {
    let dest = echo_server();
    for engine in available_engines() {
        let dir = TempDir::new("connect");
        let server = setup(engine, Mode::HttpConnect, &dir);
        let socket = server.frontend_path().unwrap().to_path_buf();
        let dest = dest.clone();
        block_on(engine, async move {
            for _ in 0..6 {
                let mut s = UnixStream::connect(&socket).await.unwrap();
                // kube-apiserver's exact request, with early tunnel bytes.
                let req = format!("CONNECT {dest} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\nhello");
                let (r, _) = s.write_all(req.into_bytes()).await;
                r.unwrap();
                let mut got = Vec::new();
                let want = b"HTTP/1.1 200 Connection Established\r\n\r\nhello";
                while got.len() < want.len() {
                    let (r, buf) = s.read(Vec::with_capacity(4096)).await;
                    assert!(
                        r.unwrap() > 0,
                        "closed early: {:?}",
                        String::from_utf8_lossy(&got)
                    );
                    got.extend_from_slice(&buf);
                }
                assert_eq!(
                    &got[..],
                    &want[..],
                    "200 first, then the echoed early bytes"
                );
                let (r, _) = s.write_all(b"world".to_vec()).await;
                r.unwrap();
                let (r, buf) = s.read(Vec::with_capacity(4096)).await;
                assert_eq!(r.unwrap(), 5);
                assert_eq!(&buf[..], b"world");
            }
            // A refused dial: upstream's status line and body.
            let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let closed_addr = closed.local_addr().unwrap().to_string();
            drop(closed);
            let mut s = UnixStream::connect(&socket).await.unwrap();
            let (r, _) = s
                .write_all(
                    format!("CONNECT {closed_addr} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                        .into_bytes(),
                )
                .await;
            r.unwrap();
            let mut got = Vec::new();
            loop {
                let (r, buf) = s.read(Vec::with_capacity(4096)).await;
                if r.unwrap_or(0) == 0 {
                    break;
                }
                got.extend_from_slice(&buf);
            }
            let text = String::from_utf8_lossy(&got);
            assert!(text.starts_with("HTTP/1.1 502 Bad Gateway\r\n"), "{text}");
            assert!(text.ends_with("connect: connection refused"), "{text}");
            // Not CONNECT: 405.
            let mut s = UnixStream::connect(&socket).await.unwrap();
            let (r, _) = s
                .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec())
                .await;
            r.unwrap();
            let (r, buf) = s.read(Vec::with_capacity(4096)).await;
            r.unwrap();
            assert!(
                String::from_utf8_lossy(&buf).starts_with("HTTP/1.1 405 Method Not Allowed\r\n")
            );
        })
        .unwrap();
        server.stop().unwrap();
    }
}
