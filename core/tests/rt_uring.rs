//! konn's io_uring data ring (`io::uring`): multishot receive into provided
//! buffers lent by the pool, sends, shutdown, the per-socket queue limit,
//! waiting for buffers under a used-up budget (with its deadline), handing
//! a socket back to monoio, and the leak check: every operation completed,
//! every descriptor closed, every buffer back in the pool after the ring
//! closes. Only under the io_uring engine, where the kernel has the ring's
//! features (the tests say so and pass otherwise).

use std::time::Duration;

use bytes::BytesMut;
use konn_core::Error;
use konn_core::io::pool::{
    self, BUF_CAPACITY, BufPool, LARGE_BUF_CAPACITY, MemoryBudget, PoolConfig,
};
use konn_core::io::runtime::{Either, Engine, available_engines, block_on, race};
use konn_core::io::uring::{self, GroupKind, PACKET_HEADROOM, RECV_QUEUE_LIMIT, RingStream};
use konn_frames::packet::MAX_DATA_PAYLOAD;
use konn_testkit::fds::{assert_fds_back_to, open_fds, serial};
use monoio::io::{AsyncReadRent, AsyncWriteRentExt};
use monoio::net::{TcpListener, TcpStream};

/// Whether the ring runs here; prints why not otherwise.
fn ring_available() -> bool {
    if !available_engines().contains(&Engine::IoUring) {
        eprintln!("note: io_uring unavailable; nothing to test");
        return false;
    }
    if !uring::wanted() {
        eprintln!("note: KONN_IO_URING_DATA=monoio; nothing to test");
        return false;
    }
    match uring::features() {
        Ok(_) => true,
        Err(e) => {
            eprintln!("note: data ring unsupported here ({e}); nothing to test");
            false
        }
    }
}

/// Polls `cond` every millisecond on the runtime (the ring needs this
/// thread to make progress) until it holds or `limit` passes.
async fn eventually(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = monoio::time::Instant::now() + limit;
    while monoio::time::Instant::now() < deadline {
        if cond() {
            return true;
        }
        monoio::time::sleep(Duration::from_millis(1)).await;
    }
    cond()
}

const WAIT: Duration = Duration::from_secs(10);

/// A connected pair: a monoio client and the accepted server side.
async fn pair() -> (TcpStream, TcpStream) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let (client, accepted) = monoio::join!(TcpStream::connect(addr), listener.accept());
    (client.unwrap(), accepted.unwrap().0)
}

/// `sock` moved onto this thread's data ring.
fn on_ring(sock: TcpStream, group: GroupKind) -> RingStream {
    uring::adopt(sock, group)
        .map_err(drop)
        .expect("the socket moves onto the ring")
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

async fn read_exact(s: &mut TcpStream, n: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        let buf = Vec::with_capacity(64 * 1024);
        let (r, buf) = s.read(buf).await;
        assert!(r.unwrap() > 0, "EOF after {} of {n} bytes", out.len());
        out.extend_from_slice(&buf);
    }
    out
}

#[test]
fn echo_through_the_ring_and_nothing_left_behind() {
    if !ring_available() {
        return;
    }
    let _serial = serial();
    let baseline = open_fds();
    block_on(Engine::IoUring, async {
        let ring = uring::current().expect("the io_uring runtime sets up a data ring");
        let (mut client, server) = pair().await;
        let (mut rd, mut wr) = on_ring(server, GroupKind::Plain).into_split();
        assert_eq!(ring.stats().sockets, 1);

        // 1 MiB each way, in writes of varying size; the echo sends back
        // each received chunk as it comes.
        let data = pattern(1 << 20, 7);
        let sent = data.clone();
        let writer = monoio::spawn(async move {
            let mut off = 0;
            let mut step = 1000;
            while off < sent.len() {
                let end = (off + step).min(sent.len());
                let (r, _) = client.write_all(sent[off..end].to_vec()).await;
                r.unwrap();
                off = end;
                step = step * 3 % 70_000 + 1;
            }
            let back = read_exact(&mut client, sent.len()).await;
            (client, back)
        });
        let mut echoed = 0;
        while echoed < data.len() {
            let chunk = rd.recv().await.unwrap().expect("data, not EOF");
            assert!(!chunk.is_empty());
            echoed += chunk.len();
            let (r, _) = wr.write_all(chunk).await;
            r.unwrap();
        }
        let (client, back) = writer.await;
        assert_eq!(back, data, "bytes and order preserved");
        assert!(ring.stats().completions > 0);

        // EOF from the peer ends the stream; shutdown reaches the peer.
        drop(client);
        assert!(rd.recv().await.unwrap().is_none(), "EOF");
        wr.shutdown().await.unwrap();
        drop((rd, wr));
        assert!(
            eventually(WAIT, || {
                let s = ring.stats();
                s.sockets == 0 && s.in_flight == 0
            })
            .await,
            "every operation completed and the socket closed: {:?}",
            ring.stats()
        );

        // Closing the ring gives every provided buffer back to the pool.
        ring.clone().close().await;
        assert_eq!(ring.stats().provided, 0);
        let pool = pool::current();
        pool.reclaim();
        assert_eq!(pool.stats().in_use, 0, "{:?}", pool.stats());
    })
    .unwrap();
    assert_fds_back_to(baseline, "after the ring closed");
}

#[test]
fn many_sockets_close_and_leak_nothing() {
    if !ring_available() {
        return;
    }
    let _serial = serial();
    let baseline = open_fds();
    block_on(Engine::IoUring, async {
        let ring = uring::current().unwrap();
        for round in 0..3u8 {
            let mut peers = Vec::new();
            let mut reads = Vec::new();
            for i in 0..40u8 {
                let (mut client, server) = pair().await;
                let group = if i % 2 == 0 {
                    GroupKind::Packet
                } else {
                    GroupKind::Tls
                };
                let (rd, wr) = on_ring(server, group).into_split();
                let msg = pattern(100 + usize::from(i), round);
                let (r, _) = client.write_all(msg).await;
                r.unwrap();
                peers.push(client);
                reads.push((rd, wr));
            }
            // Every socket received its message; half of them are dropped
            // with their receive still armed, half after EOF.
            for (i, (rd, _)) in reads.iter_mut().enumerate() {
                let c = rd.recv().await.unwrap().unwrap();
                let skip = if i % 2 == 0 { PACKET_HEADROOM } else { 0 };
                assert_eq!(c.len() - skip, 100 + i, "socket {i}");
            }
            peers.truncate(20);
            drop(reads);
            drop(peers);
            assert!(
                eventually(WAIT, || {
                    let s = ring.stats();
                    s.sockets == 0 && s.in_flight == 0
                })
                .await,
                "round {round}: {:?}",
                ring.stats()
            );
        }
    })
    .unwrap();
    assert_fds_back_to(baseline, "after 120 ring sockets");
}

#[test]
fn packet_sockets_leave_room_for_the_header() {
    if !ring_available() {
        return;
    }
    let _serial = serial();
    block_on(Engine::IoUring, async {
        let (mut client, server) = pair().await;
        let (mut rd, _wr) = on_ring(server, GroupKind::Packet).into_split();
        // More than one packet: each receive is at most one DATA payload,
        // after zeroed headroom, in a frame-sized pooled buffer.
        let data = pattern(3 * MAX_DATA_PAYLOAD + 5, 1);
        let (r, _) = client.write_all(data.clone()).await;
        r.unwrap();
        let mut got = Vec::new();
        while got.len() < data.len() {
            let c = rd.recv().await.unwrap().unwrap();
            assert!(c.len() > PACKET_HEADROOM && c.len() <= PACKET_HEADROOM + MAX_DATA_PAYLOAD);
            assert!(c[..PACKET_HEADROOM].iter().all(|&b| b == 0));
            assert_eq!(c.capacity(), BUF_CAPACITY);
            got.extend_from_slice(&c[PACKET_HEADROOM..]);
        }
        assert_eq!(got, data);
    })
    .unwrap();
}

#[test]
fn a_reader_that_stops_pushes_back_on_its_peer() {
    if !ring_available() {
        return;
    }
    let _serial = serial();
    block_on(Engine::IoUring, async {
        let ring = uring::current().unwrap();
        let (mut client, server) = pair().await;
        let (mut rd, _wr) = on_ring(server, GroupKind::Plain).into_split();
        // Arm the receive, then stop reading while the peer sends far more
        // than the queue limit.
        let first = pattern(10, 0);
        let (r, _) = client.write_all(first.clone()).await;
        r.unwrap();
        assert_eq!(&rd.recv().await.unwrap().unwrap()[..], &first[..]);
        let total = 8 * RECV_QUEUE_LIMIT;
        let data = pattern(total, 3);
        let sent = data.clone();
        let writer = monoio::spawn(async move {
            let (r, _) = client.write_all(sent).await;
            r.unwrap();
            client
        });
        assert!(
            eventually(WAIT, || rd.queued() >= RECV_QUEUE_LIMIT
                && ring.stats().in_flight == 0)
            .await,
            "the receive was cancelled at the limit: queued {}, {:?}",
            rd.queued(),
            ring.stats()
        );
        // Bounded: the limit plus what the kernel received in the same
        // batch (at most every buffer provided at the time: 512 KiB).
        let queued = rd.queued();
        monoio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(rd.queued(), queued, "nothing more arrives while paused");
        assert!(
            queued <= RECV_QUEUE_LIMIT + 8 * LARGE_BUF_CAPACITY,
            "queued {queued}"
        );
        // Reading on re-arms the receive and gets everything, in order.
        let mut got = Vec::new();
        while got.len() < total {
            got.extend_from_slice(&rd.recv().await.unwrap().unwrap());
        }
        assert_eq!(got, data);
        drop(writer.await);
    })
    .unwrap();
}

#[test]
fn a_used_up_budget_makes_the_reader_wait_with_a_deadline() {
    if !ring_available() {
        return;
    }
    let _serial = serial();
    block_on(Engine::IoUring, async {
        // A pool whose budget holds fewer frame-sized buffers than one
        // provided stream buffer needs (a large one under incremental
        // consumption, else a frame-sized one) and a wait of 100 ms.
        let ring = uring::current().unwrap();
        let units = if ring.features().incremental { 3 } else { 0 };
        let config = PoolConfig {
            budget_bytes: (units + 1) * BUF_CAPACITY - 1,
            acquire_timeout: Duration::from_millis(100),
            ..PoolConfig::default()
        };
        let starved = BufPool::new(&MemoryBudget::new(config.budget_bytes), &config);
        let _guard = pool::install(starved);
        let (mut client, server) = pair().await;
        let (mut rd, _wr) = on_ring(server, GroupKind::Plain).into_split();
        let (r, _) = client.write_all(vec![1u8; 100]).await;
        r.unwrap();
        let started = monoio::time::Instant::now();
        let err = rd.recv().await.unwrap_err();
        assert!(matches!(err, Error::BufferWaitTimeout(_)), "{err}");
        assert!(started.elapsed() >= Duration::from_millis(100));
    })
    .unwrap();
}

#[test]
fn a_socket_goes_back_to_monoio_with_what_it_received() {
    if !ring_available() {
        return;
    }
    let _serial = serial();
    let baseline = open_fds();
    block_on(Engine::IoUring, async {
        let (mut client, server) = pair().await;
        let (mut rd, wr) = on_ring(server, GroupKind::Plain).into_split();
        let (r, _) = client.write_all(b"first".to_vec()).await;
        r.unwrap();
        assert_eq!(&rd.recv().await.unwrap().unwrap()[..], b"first");
        // Sent after the last receive the reader took: handed back as
        // "late" bytes, or still in the socket.
        let (r, _) = client.write_all(b"second".to_vec()).await;
        r.unwrap();
        monoio::time::sleep(Duration::from_millis(10)).await;
        let (mut back, late): (TcpStream, BytesMut) = RingStream::reunite(rd, wr)
            .unwrap()
            .into_io()
            .await
            .unwrap();
        let mut got = late.to_vec();
        let (r, _) = client.write_all(b"third".to_vec()).await;
        r.unwrap();
        while got.len() < b"secondthird".len() {
            let (n, buf) = back.read(Vec::with_capacity(64)).await;
            assert!(n.unwrap() > 0);
            got.extend_from_slice(&buf);
        }
        assert_eq!(&got[..], b"secondthird");
        // The wrong type is refused.
        let (_c2, s2) = pair().await;
        let stream = on_ring(s2, GroupKind::Plain);
        let wrong = stream.into_io::<monoio::net::UnixStream>().await;
        assert!(matches!(wrong, Err(Error::Usage(_))));
    })
    .unwrap();
    // The refused socket was closed, the handed-back one with its stream.
    assert_fds_back_to(baseline, "after handing sockets back");
}

#[test]
fn epoll_has_no_data_ring() {
    let _serial = serial();
    block_on(Engine::Epoll, async {
        assert!(uring::current().is_none());
        let (_client, server) = pair().await;
        assert!(
            uring::adopt(server, GroupKind::Plain).is_err(),
            "stays on monoio"
        );
    })
    .unwrap();
}

#[test]
fn a_dropped_receive_keeps_its_chunks() {
    if !ring_available() {
        return;
    }
    let _serial = serial();
    block_on(Engine::IoUring, async {
        let (mut client, server) = pair().await;
        let (mut rd, _wr) = on_ring(server, GroupKind::Plain).into_split();
        // A receive abandoned while waiting loses nothing.
        match race(rd.recv(), monoio::time::sleep(Duration::from_millis(5))).await {
            Either::Left(r) => panic!("nothing was sent: {:?}", r.map(|c| c.map(|c| c.len()))),
            Either::Right(()) => {}
        }
        let (r, _) = client.write_all(b"kept".to_vec()).await;
        r.unwrap();
        assert_eq!(&rd.recv().await.unwrap().unwrap()[..], b"kept");
    })
    .unwrap();
}

/// epoll (packet sockets on monoio), and io_uring where the data ring runs.
fn packet_engines() -> Vec<Engine> {
    let mut engines = vec![Engine::Epoll];
    if ring_available() {
        engines.push(Engine::IoUring);
    }
    engines
}

/// A destination's writer sends the packets queued behind the current one
/// in one gathered send, at most `MAX_IOV` of them (empty ones skipped):
/// on the data ring with a ring operation, on monoio (epoll) with a
/// non-blocking `sendmsg`.
#[test]
fn queued_packets_go_in_one_gathered_send() {
    use bytes::Bytes;
    use konn_core::io::sock::{self, PacketWrite};
    use std::cell::RefCell;
    use std::collections::VecDeque;

    let _serial = serial();
    for engine in packet_engines() {
        block_on(engine, async move {
            let (mut client, server) = pair().await;
            let (_rd, mut wr) = sock::packet_split(server);
            let ring = matches!(wr, PacketWrite::Ring(_));
            assert_eq!(ring, engine == Engine::IoUring, "{engine:?}");
            let packets: Vec<Bytes> = (0..uring::MAX_IOV as u8 + 4)
                .map(|i| Bytes::from(pattern(100 + usize::from(i), i)))
                .collect();
            let first = packets[0].clone();
            let mut queued: VecDeque<Bytes> = packets[1..].iter().cloned().collect();
            queued.push_front(Bytes::new());
            let queue = RefCell::new(queued);
            let n = wr.write_queued(&first, &queue).await.unwrap();
            // The empty packet takes no slot.
            let want: Vec<u8> = packets[..uring::MAX_IOV].concat();
            assert_eq!(n, want.len(), "{engine:?}");
            assert_eq!(read_exact(&mut client, n).await, want);
            // The queue itself is the caller's to advance.
            assert_eq!(queue.borrow().len(), packets.len());
        })
        .unwrap();
    }
}

/// A destination's reader off the data ring (epoll) takes up to
/// `READ_GATHER` packets with one `recvmsg` after a read that filled its
/// buffer, and hands them out one by one, in order, each after its zeroed
/// headroom; on the ring every receive is one packet anyway. Both deliver
/// the bytes unchanged.
#[test]
fn packet_reads_gather_and_keep_their_order() {
    use konn_core::io::sock::{self, PacketRead, READ_GATHER};

    let _serial = serial();
    for engine in packet_engines() {
        block_on(engine, async move {
            let pool = pool::current();
            let (mut client, server) = pair().await;
            let (mut rd, _wr) = sock::packet_split(server);
            // One more packet than a read gathers, the last one short.
            let data = pattern(READ_GATHER * MAX_DATA_PAYLOAD + 5, 3);
            let (r, _) = client.write_all(data.clone()).await;
            r.unwrap();
            let mut got = Vec::new();
            let mut reads = 0;
            while got.len() < data.len() {
                let c = rd.read(&pool).await.unwrap().expect("not at EOF yet");
                assert!(c.len() > PACKET_HEADROOM, "{engine:?}: an empty packet");
                assert!(c.len() <= PACKET_HEADROOM + MAX_DATA_PAYLOAD, "{engine:?}");
                assert!(c[..PACKET_HEADROOM].iter().all(|&b| b == 0), "{engine:?}");
                got.extend_from_slice(&c[PACKET_HEADROOM..]);
                reads += 1;
                if let PacketRead::Mono { more, .. } = &rd {
                    // The first read, after a wait, takes one buffer; it
                    // filled it, so the second gathers: loopback delivered
                    // everything before the reads.
                    let extra = more.iter().filter(|m| m.is_some()).count();
                    let want = if reads == 2 { READ_GATHER - 1 } else { 0 };
                    assert!(
                        reads > 2 || extra == want,
                        "{engine:?}: read {reads} left {extra}"
                    );
                }
            }
            assert_eq!(got, data, "{engine:?}");
            drop(client);
            assert!(rd.read(&pool).await.unwrap().is_none(), "{engine:?}: EOF");
        })
        .unwrap();
    }
}
