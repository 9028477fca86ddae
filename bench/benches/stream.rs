//! One gRPC stream over loopback TCP, konn's engine on both ends: a client
//! sends messages on one bidi call as fast as flow control allows, a sink
//! server on another thread counts and releases them and, at the end of a
//! batch (an empty message), answers with the count. Reported as bytes/s
//! for 16 KiB messages and messages/s for 64 B messages, under each io
//! engine this kernel offers.
//!
//! Each criterion sample opens a fresh connection outside the timed region;
//! the timed region is "first message queued" to "server's count arrived".

use std::cell::Cell;
use std::rc::Rc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use konn_core::io::driver::{ConnHandle, DriverConfig, Handler};
use konn_core::io::notify::Notify;
use konn_core::io::runtime::{Engine, available_engines, block_on};
use konn_protocol::grpc::{Grpc, GrpcEvent};
use konn_protocol::h2::{Config, Connection, Headers, Role};

/// Counts messages; an empty message asks for the count.
#[derive(Default)]
struct Sink {
    count: u64,
}

impl Handler<Grpc> for Sink {
    fn on_event(&mut self, g: &mut Grpc, ev: GrpcEvent) {
        match ev {
            GrpcEvent::Call { id, .. } => {
                let _ = g.accept(id, &Headers::new());
            }
            GrpcEvent::Message { id, msg, flow, .. } => {
                g.release(id, flow);
                if msg.is_empty() {
                    let _ = g.send_message(id, &self.count.to_be_bytes());
                    self.count = 0;
                } else {
                    self.count += 1;
                }
            }
            GrpcEvent::HalfClose { id } => {
                let _ = g.finish(id, konn_frames::GrpcStatus::OK, "");
            }
            _ => {}
        }
    }
}

fn config(role: Role) -> Config {
    let mut c = Config::new(role);
    c.stream_window = 4 << 20;
    c.conn_window = 16 << 20;
    c
}

/// A sink server on its own thread; returns its address.
fn start_sink(engine: Engine) -> std::net::SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        block_on(engine, async move {
            let l = konn_core::io::listen::tcp_into_monoio(l).unwrap();
            loop {
                let Ok((s, _)) = l.accept().await else { return };
                let _ = s.set_nodelay(true);
                let grpc = Grpc::new(
                    Connection::new(config(Role::Server), konn_core::io::clock::now()),
                    4 << 20,
                );
                let h = ConnHandle::new(grpc, None, Sink::default(), DriverConfig::default());
                monoio::spawn(async move { h.run(s).await });
            }
        })
        .unwrap();
    });
    addr
}

#[derive(Default)]
struct Client {
    answer: Rc<Cell<Option<u64>>>,
    wake: Rc<Notify>,
}

impl Handler<Grpc> for Client {
    fn on_event(&mut self, g: &mut Grpc, ev: GrpcEvent) {
        match ev {
            GrpcEvent::Message { id, msg, flow, .. } => {
                g.release(id, flow);
                if let Ok(b) = <[u8; 8]>::try_from(&msg[..]) {
                    self.answer.set(Some(u64::from_be_bytes(b)));
                }
                self.wake.notify();
            }
            GrpcEvent::Writable { .. } | GrpcEvent::Finished { .. } => self.wake.notify(),
            _ => {}
        }
    }
}

/// Sends `n` messages of `size` bytes on one call; returns the time from
/// the first send until the server's count arrived.
fn run_batch(engine: Engine, addr: std::net::SocketAddr, size: usize, n: u64) -> Duration {
    block_on(engine, async move {
        let s = monoio::net::TcpStream::connect(addr).await.unwrap();
        s.set_nodelay(true).unwrap();
        let client = Client::default();
        let (answer, wake) = (client.answer.clone(), client.wake.clone());
        let grpc = Grpc::new(
            Connection::new(config(Role::Client), konn_core::io::clock::now()),
            4 << 20,
        );
        let h = ConnHandle::new(grpc, None, client, DriverConfig::default());
        let run = h.clone();
        let task = monoio::spawn(async move { run.run(s).await });
        let id = h
            .with(|g, _| {
                g.start_call(
                    "http",
                    Bytes::from_static(b"bench"),
                    Bytes::from_static(b"/ProxyService/Proxy"),
                    &Headers::new(),
                )
            })
            .unwrap()
            .unwrap();
        let mut framed = BytesMut::new();
        konn_frames::grpc::encode_prefix(size as u32, &mut framed);
        framed.extend_from_slice(&vec![0x5a; size]);
        let framed = framed.freeze();
        const QUEUE: usize = 1 << 20;
        #[allow(clippy::disallowed_methods)] // bench timing, not a data path
        let start = std::time::Instant::now();
        let mut sent = 0;
        while sent < n {
            let queued = h
                .with(|g, _| {
                    while g.queued_bytes(id) < QUEUE && sent < n {
                        g.send_framed(id, framed.clone()).unwrap();
                        sent += 1;
                    }
                    let q = g.queued_bytes(id);
                    if q >= QUEUE {
                        g.notify_when_drained(id, QUEUE / 2);
                    }
                    q
                })
                .unwrap();
            if queued >= QUEUE {
                wake.notified().await;
            }
        }
        h.with(|g, _| g.send_message(id, &[]).unwrap()).unwrap();
        while answer.get().is_none() {
            wake.notified().await;
        }
        let took = start.elapsed();
        assert_eq!(answer.get(), Some(n), "the sink counted a different number");
        let _ = h.with(|g, _| g.close_send(id));
        h.shutdown();
        let _ = task.await;
        took
    })
    .unwrap()
}

fn bench(c: &mut Criterion) {
    for engine in available_engines() {
        let addr = start_sink(engine);
        let mut g = c.benchmark_group(format!("grpc_stream/{engine}"));
        g.sample_size(10);
        g.measurement_time(Duration::from_secs(5));
        for (size, per_iter) in [(16 * 1024, 64u64), (64, 4096)] {
            if size >= 1024 {
                g.throughput(Throughput::Bytes(size as u64 * per_iter));
            } else {
                g.throughput(Throughput::Elements(per_iter));
            }
            g.bench_with_input(BenchmarkId::new("msg", size), &size, |b, &size| {
                b.iter_custom(|iters| run_batch(engine, addr, size, iters * per_iter));
            });
        }
        g.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
