//! One konn agent tunnel against a scripted server (konn's gRPC server role)
//! over real sockets, under both io engines: dials, echo through an
//! endpoint, errors with Go's texts, DIAL_CLS, close semantics, and no
//! descriptor left behind.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use konn_agent::client::{ConnectParams, open_tunnel};
use konn_agent::conn::{TunnelEvent, TunnelSettings};
use konn_core::io::driver::{ConnHandle, DriverConfig, Handler};
use konn_core::io::notify::Notify;
use konn_core::io::pool::{BufPool, MemoryBudget, PoolConfig};
use konn_core::io::runtime::{Either, race, run_on_each_engine};
use konn_frames::GrpcStatus;
use konn_frames::packet::{ByteStr, Packet};
use konn_protocol::grpc::{Grpc, GrpcEvent};
use konn_protocol::h2::{Config, Connection, Headers, Role};
use konn_testkit::fds::{assert_fds_back_to, open_fds};
use monoio::io::{AsyncReadRent, AsyncWriteRentExt};
use monoio::net::TcpListener;

#[allow(clippy::disallowed_types)] // test-only serialisation of fd counting
static FD_LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The scripted server: records packets, lets the test send.
#[derive(Default)]
struct Server {
    stream: Option<u32>,
    agent_id: Option<Bytes>,
    got: Rc<RefCell<Vec<Packet>>>,
    wake: Rc<Notify>,
}

impl Handler<Grpc> for Server {
    fn on_event(&mut self, grpc: &mut Grpc, event: GrpcEvent) {
        match event {
            GrpcEvent::Call {
                id, path, metadata, ..
            } => {
                assert_eq!(path, "/AgentService/Connect");
                self.agent_id = metadata.get(b"agentid").cloned();
                assert!(metadata.get(b"agentidentifiers").is_some(), "always sent");
                let mut md = Headers::new();
                md.push_static("serverid", "server-a");
                md.push_static("servercount", "1");
                grpc.accept(id, &md).unwrap();
                self.stream = Some(id);
            }
            GrpcEvent::Message { id, msg, flow, .. } => {
                self.got.borrow_mut().push(Packet::decode(&msg).unwrap());
                grpc.release(id, flow);
            }
            _ => {}
        }
        self.wake.notify();
    }
}

type ServerHandle = ConnHandle<Grpc, Server>;

fn send(server: &ServerHandle, p: &Packet) {
    let mut b = BytesMut::new();
    p.encode_grpc(&mut b);
    server
        .with(|g, s| g.send_framed(s.stream.unwrap(), b.freeze()).unwrap())
        .unwrap();
}

/// Wait until the server has received a packet matching `f`; return it.
async fn expect(
    server: &ServerHandle,
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
        let _ = server;
        if let Either::Right(()) = race(wake.notified(), monoio::time::sleep_until(deadline)).await
        {
            panic!("expected packet not received; got {:?}", got.borrow());
        }
    }
}

fn dial_req(address: String, random: i64) -> Packet {
    Packet::DialReq {
        protocol: ByteStr::from_static("tcp"),
        address: ByteStr::from(address),
        random,
    }
}

async fn echo_server(listener: TcpListener, stop: Rc<Notify>) {
    loop {
        let accepted = match race(listener.accept(), stop.notified()).await {
            Either::Left(r) => r,
            Either::Right(()) => return,
        };
        let Ok((mut s, _)) = accepted else { return };
        monoio::spawn(async move {
            loop {
                let (r, buf) = s.read(Vec::with_capacity(32 * 1024)).await;
                match r {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {
                        let (w, _) = s.write_all(buf).await;
                        if w.is_err() {
                            return;
                        }
                    }
                }
            }
        });
    }
}

#[test]
fn tunnel_relays_and_answers_like_upstream() {
    let _serial = FD_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let before = open_fds();
    run_on_each_engine(|_engine| async {
        let budget = MemoryBudget::new(64 << 20);
        let pool = BufPool::new(&budget, &PoolConfig::default());
        // Destination: an echo server.
        let echo = TcpListener::bind("127.0.0.1:0").unwrap();
        let echo_addr = echo.local_addr().unwrap().to_string();
        let stop_echo = Rc::new(Notify::new());
        let echo_task = monoio::spawn(echo_server(echo, stop_echo.clone()));
        // A closed port.
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let closed_addr = closed.local_addr().unwrap().to_string();
        drop(closed);

        // The scripted server.
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let server_state = Server::default();
        let (got, wake) = (server_state.got.clone(), server_state.wake.clone());
        let grpc = Grpc::new(
            Connection::new(Config::new(Role::Server), konn_core::io::clock::now()),
            4 << 20,
        );
        let server = ConnHandle::new(grpc, None, server_state, DriverConfig::default());
        let s2 = server.clone();
        let server_task = monoio::spawn(async move {
            let (sock, _) = listener.accept().await.unwrap();
            s2.run(sock).await
        });

        // The agent tunnel.
        let events = Rc::new(RefCell::new(Vec::new()));
        let ev = events.clone();
        let params = ConnectParams {
            address,
            tls: None,
            agent_id: "agent-1".into(),
            agent_identifiers: String::new(),
            token_path: None,
            keepalive_time: Duration::from_secs(3600),
            connect_timeout: Duration::from_secs(5),
            settings: TunnelSettings::default(),
            driver: DriverConfig::default(),
        };
        let (tunnel, sock) = open_tunnel(&params, pool, Box::new(move |e| ev.borrow_mut().push(e)))
            .await
            .unwrap();
        let t2 = tunnel.clone();
        let tunnel_task = monoio::spawn(async move { t2.run(sock).await });

        // Wait for the call.
        while server.with(|_, s| s.stream.is_none()).unwrap() {
            wake.notified().await;
        }
        assert_eq!(
            server.with(|_, s| s.agent_id.clone()).unwrap().as_deref(),
            Some(&b"agent-1"[..])
        );

        // A dial that works, then an echo of 1 MiB in pieces.
        send(&server, &dial_req(echo_addr.clone(), 42));
        let rsp = expect(&server, &got, &wake, |p| {
            matches!(p, Packet::DialRsp { random: 42, .. })
        })
        .await;
        let Packet::DialRsp {
            error, connect_id, ..
        } = rsp
        else {
            unreachable!()
        };
        assert_eq!((error.as_str(), connect_id), ("", 1));
        assert!(events.borrow().contains(&TunnelEvent::Connected {
            server_id: "server-a".into(),
            server_count: 1,
            reverse: false,
            resume: false,
            resumed: false,
        }));
        let payload: Vec<u8> = (0..1_000_000u32).map(|i| (i % 253) as u8).collect();
        for chunk in payload.chunks(10_000) {
            send(
                &server,
                &Packet::Data {
                    connect_id: 1,
                    error: ByteStr::new(),
                    data: Bytes::copy_from_slice(chunk),
                },
            );
        }
        let mut echoed = Vec::new();
        while echoed.len() < payload.len() {
            let p = expect(&server, &got, &wake, |p| {
                matches!(p, Packet::Data { connect_id: 1, .. })
            })
            .await;
            let Packet::Data { data, .. } = p else {
                unreachable!()
            };
            assert!(data.len() <= konn_frames::packet::MAX_DATA_PAYLOAD);
            echoed.extend_from_slice(&data);
        }
        assert_eq!(echoed, payload);

        // CLOSE_REQ → CLOSE_RSP.
        send(&server, &Packet::CloseReq { connect_id: 1 });
        let p = expect(&server, &got, &wake, |p| {
            matches!(p, Packet::CloseRsp { connect_id: 1, .. })
        })
        .await;
        assert!(matches!(p, Packet::CloseRsp { error, .. } if error.is_empty()));

        // Errors, with upstream's texts.
        send(&server, &dial_req(closed_addr.clone(), 43));
        let p = expect(&server, &got, &wake, |p| {
            matches!(p, Packet::DialRsp { random: 43, .. })
        })
        .await;
        assert!(
            matches!(&p, Packet::DialRsp { error, connect_id: 0, .. } if error.as_str() == format!("dial tcp {closed_addr}: connect: connection refused")),
            "{p:?}"
        );
        send(
            &server,
            &Packet::Data {
                connect_id: 77,
                error: ByteStr::new(),
                data: Bytes::from_static(b"?"),
            },
        );
        let p = expect(&server, &got, &wake, |p| {
            matches!(p, Packet::CloseRsp { connect_id: 77, .. })
        })
        .await;
        assert!(
            matches!(p, Packet::CloseRsp { error, .. } if error.as_str() == "unrecognized connectID")
        );
        send(&server, &Packet::CloseReq { connect_id: 78 });
        let p = expect(&server, &got, &wake, |p| {
            matches!(p, Packet::CloseRsp { connect_id: 78, .. })
        })
        .await;
        assert!(
            matches!(p, Packet::CloseRsp { error, .. } if error.as_str() == "Unknown connectID")
        );

        // The destination closes: CLOSE_RSP after its data.
        send(&server, &dial_req(echo_addr.clone(), 44));
        let rsp = expect(&server, &got, &wake, |p| {
            matches!(p, Packet::DialRsp { random: 44, .. })
        })
        .await;
        let Packet::DialRsp { connect_id, .. } = rsp else {
            unreachable!()
        };
        assert!(connect_id > 1, "connectIDs are never reused");

        // The server goes away: the tunnel ends and cleans up.
        server
            .with(|g, _| g.conn_mut().abort(konn_frames::Reason::NO_ERROR, "bye"))
            .unwrap();
        let _ = server_task.await;
        let deadline = monoio::time::Instant::now() + Duration::from_secs(5);
        while !tunnel.is_closed() {
            assert!(
                monoio::time::Instant::now() < deadline,
                "tunnel did not end"
            );
            monoio::time::sleep(Duration::from_millis(10)).await;
        }
        let _ = tunnel_task.await;
        assert_eq!(events.borrow().last(), Some(&TunnelEvent::Closed));
        assert_eq!(tunnel.with(|_, h| h.counters().open_endpoints).unwrap(), 0);
        stop_echo.notify();
        echo_task.await;
        let _ = GrpcStatus::OK;
    });
    // io_uring closes a cancelled operation's socket late: waits for it.
    assert_fds_back_to(before, "descriptors");
}
