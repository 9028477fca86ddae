//! Cross-core mesh and socket migration between workers, under every
//! engine, with descriptor-leak checks.

use std::{
    io::{Read, Write},
    sync::mpsc,
    time::Duration,
};

use konn_core::io::{
    listen::{TcpListeners, UnixListenOptions, bind_unix, tcp_into_monoio, unix_into_monoio},
    runtime::{Engine, IoEngine, RuntimeConfig, Workers, available_engines, yield_now},
    xcore::{DetachedTcp, DetachedUnix, SendError, detach_tcp, detach_unix},
};
use konn_testkit::blocking::ReadRetry;
use konn_testkit::fds::{assert_fds_back_to, open_fds, serial};
use monoio::io::{AsyncReadRent, AsyncWriteRentExt};

const WAIT: Duration = Duration::from_secs(20);

fn config(workers: usize, engine: Engine) -> RuntimeConfig {
    RuntimeConfig {
        workers,
        engine: match engine {
            Engine::IoUring => IoEngine::IoUring,
            Engine::Epoll => IoEngine::Epoll,
        },
        inbox_capacity: 64,
        ..RuntimeConfig::default()
    }
}

const MESSAGES: u64 = 20_000;
const REPLY: u64 = u64::MAX;

#[derive(Debug)]
enum Report {
    Received { sum: u64, count: u64 },
    Replied,
}

#[test]
fn messages_cross_workers_in_batches() {
    let _serial = serial();
    for engine in available_engines() {
        let (tx, rx) = mpsc::channel();
        let workers = Workers::<u64>::start(config(2, engine), move |mut ctx| {
            let tx = tx.clone();
            async move {
                let mut inbox = ctx.take_inbox().unwrap();
                let mut batch = Vec::with_capacity(32);
                if ctx.index() == 0 {
                    // Wait for the go message from the test thread.
                    assert_eq!(inbox.recv_batch(&mut batch, 1).await, 1);
                    let mut full = 0u64;
                    for value in 1..=MESSAGES {
                        let mut msg = value;
                        loop {
                            match ctx.mesh().send(1, msg) {
                                Ok(()) => break,
                                Err(SendError::Full(back)) => {
                                    msg = back;
                                    full += 1;
                                    assert!(full < 100_000_000, "receiver stuck");
                                    yield_now().await;
                                }
                                Err(other) => panic!("send failed: {other}"),
                            }
                        }
                    }
                    batch.clear();
                    assert_eq!(inbox.recv_batch(&mut batch, 1).await, 1);
                    assert_eq!(batch[0], REPLY);
                    tx.send(Report::Replied).unwrap();
                } else {
                    let (mut sum, mut count) = (0u64, 0u64);
                    while count < MESSAGES {
                        batch.clear();
                        let n = inbox.recv_batch(&mut batch, 32).await;
                        assert!(n > 0 && n <= 32);
                        count += n as u64;
                        sum += batch.iter().sum::<u64>();
                    }
                    ctx.mesh().send(0, REPLY).unwrap();
                    tx.send(Report::Received { sum, count }).unwrap();
                }
                ctx.stop_token().stopped().await;
            }
        })
        .unwrap();
        workers.mesh().send(0, 0).unwrap();
        let mut received = None;
        let mut replied = false;
        for _ in 0..2 {
            match rx.recv_timeout(WAIT).expect("workers report") {
                Report::Received { sum, count } => received = Some((sum, count)),
                Report::Replied => replied = true,
            }
        }
        assert!(replied);
        assert_eq!(received, Some((MESSAGES * (MESSAGES + 1) / 2, MESSAGES)));
        let stats = workers.mesh().stats(1).unwrap();
        assert!(
            stats.wakeups < MESSAGES,
            "{engine}: one wake-up per batch, got {stats:?}"
        );
        workers.stop();
        workers.join().unwrap();
        // After the workers are gone their inboxes refuse messages.
        let sender = workers_mesh_after_join(engine);
        assert!(matches!(sender, Err(SendError::Closed(7))));
    }
}

/// Starts and joins a worker set, then sends into it.
fn workers_mesh_after_join(engine: Engine) -> Result<(), SendError<u64>> {
    let workers = Workers::<u64>::start(config(1, engine), |_ctx| async {}).unwrap();
    let mesh = workers.mesh().clone();
    workers.join().unwrap();
    mesh.send(0, 7)
}

enum Moved {
    Tcp(DetachedTcp),
    Unix(DetachedUnix),
}

/// Echoes until EOF or an error.
async fn echo<S: AsyncReadRent + monoio::io::AsyncWriteRent>(mut stream: S) {
    let mut buf = Vec::with_capacity(1024);
    loop {
        let (res, filled) = stream.read(buf).await;
        if !matches!(res, Ok(n) if n > 0) {
            return;
        }
        let (res, mut written) = stream.write_all(filled).await;
        if res.is_err() {
            return;
        }
        written.clear();
        buf = written;
    }
}

fn roundtrip(stream: &mut (impl Read + Write), text: &[u8]) {
    stream.write_all(text).unwrap();
    let mut back = vec![0u8; text.len()];
    stream.read_exact(&mut back).unwrap();
    assert_eq!(back, text);
}

#[test]
fn connections_migrate_to_another_worker() {
    let _serial = serial();
    for engine in available_engines() {
        let baseline = open_fds();
        let dir = tempfile::tempdir().unwrap();
        let uds = dir.path().join("front.sock");
        {
            let tcp = std::sync::Arc::new(
                TcpListeners::bind("127.0.0.1:0".parse().unwrap(), 1, 16).unwrap(),
            );
            let addr = tcp.local_addr();
            let unix = std::sync::Arc::new(crossbeam_utils::atomic::AtomicCell::new(Some(
                bind_unix(&uds, &UnixListenOptions::default()).unwrap(),
            )));
            let (tx, rx) = mpsc::channel();
            let workers = Workers::<Moved>::start(config(2, engine), move |mut ctx| {
                let (tx, tcp, unix) = (tx.clone(), tcp.clone(), unix.clone());
                async move {
                    let mut inbox = ctx.take_inbox().unwrap();
                    if ctx.index() == 0 {
                        let listener = tcp_into_monoio(tcp.take(0).unwrap()).unwrap();
                        let (stream, _) = listener.accept().await.unwrap();
                        let moved = detach_tcp(stream).map_err(|(_, e)| e).unwrap();
                        ctx.mesh().send(1, Moved::Tcp(moved)).ok().unwrap();
                        let listener = unix_into_monoio(unix.take().unwrap()).unwrap();
                        let (stream, _) = listener.accept().await.unwrap();
                        let moved = detach_unix(stream).map_err(|(_, e)| e).unwrap();
                        ctx.mesh().send(1, Moved::Unix(moved)).ok().unwrap();
                        ctx.stop_token().stopped().await;
                    } else {
                        let index = ctx.index();
                        inbox
                            .serve(ctx.stop_token(), 8, |moved| {
                                let tx = tx.clone();
                                match moved {
                                    Moved::Tcp(fd) => {
                                        let stream = fd.attach().unwrap();
                                        assert!(stream.nodelay().is_ok());
                                        monoio::spawn(async move {
                                            tx.send(("tcp", index)).unwrap();
                                            echo(stream).await;
                                        });
                                    }
                                    Moved::Unix(fd) => {
                                        let stream = fd.attach().unwrap();
                                        monoio::spawn(async move {
                                            tx.send(("unix", index)).unwrap();
                                            echo(stream).await;
                                        });
                                    }
                                }
                            })
                            .await;
                    }
                }
            })
            .unwrap();

            let mut client = std::net::TcpStream::connect(addr).unwrap();
            client.set_read_timeout(Some(WAIT)).unwrap();
            roundtrip(&mut client, b"hello over tcp");
            assert_eq!(rx.recv_timeout(WAIT).unwrap(), ("tcp", 1));
            roundtrip(&mut client, b"and again");

            let mut uclient = std::os::unix::net::UnixStream::connect(&uds).unwrap();
            uclient.set_read_timeout(Some(WAIT)).unwrap();
            roundtrip(&mut uclient, b"hello over unix");
            assert_eq!(rx.recv_timeout(WAIT).unwrap(), ("unix", 1));

            // EOF ends the echo tasks, which close their side.
            client.shutdown(std::net::Shutdown::Write).unwrap();
            assert_eq!(client.read_retry(&mut [0u8; 8]).unwrap(), 0);
            uclient.shutdown(std::net::Shutdown::Write).unwrap();
            assert_eq!(uclient.read_retry(&mut [0u8; 8]).unwrap(), 0);
            drop((client, uclient));

            workers.stop();
            workers.join().unwrap();
        }
        drop(dir);
        assert_fds_back_to(baseline, &format!("{engine}: descriptors"));
    }
}

#[test]
fn detached_sockets_dropped_in_flight_close() {
    let _serial = serial();
    for engine in available_engines() {
        let baseline = open_fds();
        let (tx, rx) = mpsc::channel();
        let tcp =
            std::sync::Arc::new(TcpListeners::bind("127.0.0.1:0".parse().unwrap(), 1, 16).unwrap());
        let addr = tcp.local_addr();
        // Worker 1 never reads its inbox: messages (with their sockets)
        // are dropped when the inbox closes at shutdown.
        let workers = Workers::<DetachedTcp>::start(config(2, engine), move |ctx| {
            let (tx, tcp) = (tx.clone(), tcp.clone());
            async move {
                if ctx.index() == 0 {
                    let listener = tcp_into_monoio(tcp.take(0).unwrap()).unwrap();
                    let (stream, _) = listener.accept().await.unwrap();
                    let moved = detach_tcp(stream).map_err(|(_, e)| e).unwrap();
                    ctx.mesh().send(1, moved).ok().unwrap();
                    tx.send(()).unwrap();
                }
                ctx.stop_token().stopped().await;
            }
        })
        .unwrap();
        let mut client = std::net::TcpStream::connect(addr).unwrap();
        client.set_read_timeout(Some(WAIT)).unwrap();
        rx.recv_timeout(WAIT).unwrap();
        workers.stop();
        workers.join().unwrap();
        assert_eq!(
            client.read_retry(&mut [0u8; 4]).unwrap(),
            0,
            "server side closed"
        );
        drop(client);
        assert_fds_back_to(baseline, &format!("{engine}: descriptors"));
    }
}

/// Not a test: measures the mesh on pinned workers and prints the figures
/// (`cargo test --release -p konn-core --test rt_xcore -- --ignored --nocapture`).
#[test]
#[ignore = "measurement, prints figures"]
#[allow(clippy::disallowed_methods)] // wall-clock measurement is the point here
fn measure_cross_core_latency_and_throughput() {
    const ROUND_TRIPS: u64 = 20_000;
    const BURST: u64 = 1_000_000;
    const IDLE_SAMPLES: usize = 500;
    const BURST_TAG: u64 = 1 << 63;
    const IDLE_TAG: u64 = 1 << 62;
    let _serial = serial();
    for engine in available_engines() {
        let (tx, rx) = mpsc::channel();
        let (idle_tx, idle_rx) = mpsc::channel();
        let base = std::time::Instant::now();
        let workers = Workers::<u64>::start(
            RuntimeConfig {
                pin_cores: true,
                inbox_capacity: 4096,
                ..config(2, engine)
            },
            move |mut ctx| {
                let (tx, idle_tx) = (tx.clone(), idle_tx.clone());
                async move {
                    let mut inbox = ctx.take_inbox().unwrap();
                    let mut batch = Vec::with_capacity(256);
                    if ctx.index() == 0 {
                        let start = std::time::Instant::now();
                        for i in 0..ROUND_TRIPS {
                            ctx.mesh().send(1, i).unwrap();
                            batch.clear();
                            inbox.recv_batch(&mut batch, 1).await;
                        }
                        let rtt = start.elapsed() / u32::try_from(ROUND_TRIPS).unwrap();
                        let start = std::time::Instant::now();
                        for i in 0..BURST {
                            let mut msg = i | BURST_TAG;
                            while let Err(SendError::Full(back)) = ctx.mesh().send(1, msg) {
                                msg = back;
                                yield_now().await;
                            }
                        }
                        batch.clear();
                        inbox.recv_batch(&mut batch, 1).await;
                        let burst = start.elapsed();
                        tx.send((rtt, burst)).unwrap();
                        // One message per millisecond: the receiver is
                        // parked (idle) every time one arrives.
                        for _ in 0..IDLE_SAMPLES {
                            monoio::time::sleep(Duration::from_millis(1)).await;
                            let sent = u64::try_from(base.elapsed().as_nanos()).unwrap();
                            ctx.mesh().send(1, sent | IDLE_TAG).unwrap();
                        }
                    } else {
                        let mut burst_seen = 0;
                        let mut idle = Vec::with_capacity(IDLE_SAMPLES);
                        let mesh = ctx.mesh().clone();
                        inbox
                            .serve(ctx.stop_token(), 256, |v| {
                                if v & BURST_TAG != 0 {
                                    burst_seen += 1;
                                    if burst_seen == BURST {
                                        mesh.send(0, 0).unwrap();
                                    }
                                } else if v & IDLE_TAG != 0 {
                                    let now = u64::try_from(base.elapsed().as_nanos()).unwrap();
                                    idle.push(Duration::from_nanos(now - (v & !IDLE_TAG)));
                                    if idle.len() == IDLE_SAMPLES {
                                        idle.sort();
                                        idle_tx
                                            .send((
                                                idle[IDLE_SAMPLES / 2],
                                                idle[IDLE_SAMPLES * 99 / 100],
                                            ))
                                            .unwrap();
                                    }
                                } else {
                                    mesh.send(0, v).unwrap();
                                }
                            })
                            .await;
                        return;
                    }
                    ctx.stop_token().stopped().await;
                }
            },
        )
        .unwrap();
        let (rtt, burst) = rx.recv_timeout(Duration::from_secs(120)).unwrap();
        let (idle_p50, idle_p99) = idle_rx.recv_timeout(Duration::from_secs(120)).unwrap();
        let to_1 = workers.mesh().stats(1).unwrap();
        eprintln!(
            "{engine}: busy ping-pong round trip {rtt:?}; burst of {BURST}: {burst:?} \
             = {:.1} M msg/s; one-way to a parked worker p50 {idle_p50:?} p99 {idle_p99:?}; \
             wake-ups into worker 1: {} for {} messages",
            BURST as f64 / burst.as_secs_f64() / 1e6,
            to_1.wakeups,
            ROUND_TRIPS + BURST + IDLE_SAMPLES as u64,
        );
        workers.stop();
        workers.join().unwrap();
    }
}
