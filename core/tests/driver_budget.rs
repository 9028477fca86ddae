//! The connection driver reads into the worker's buffer pool, so the global
//! memory budget bounds what a connection can make the process hold: a
//! reader that cannot get a buffer waits (its peer is pushed back by TCP),
//! is not closed while it waits, and resumes when buffers come back; the
//! wait ends at the pool's deadline with a clear error. Under both engines.

use std::cell::{Cell, RefCell};
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::mpsc;
use std::time::Duration;

use bytes::Bytes;
use konn_core::Error;
use konn_core::io::driver::{ConnHandle, DriverConfig, Handler};
use konn_core::io::notify::Notify;
use konn_core::io::pool::{self, BUF_CAPACITY, BufPool, MemoryBudget, PoolConfig};
use konn_core::io::runtime::{Either, Engine, block_on, race, run_on_each_engine};
use konn_frames::GrpcStatus;
use konn_protocol::grpc::{Grpc, GrpcEvent};
use konn_protocol::h2::{Config, Connection, Headers, Role};
use monoio::net::{TcpListener, TcpStream};

/// Payload of one message: fits one HTTP/2 frame with its gRPC prefix, so
/// the server receives it as a slice of its read buffer.
const MSG: usize = 16_000;
/// Frame-sized buffers in the server's budget: one large read buffer of a
/// plaintext connection (`LARGE_BUF_UNITS`).
const BUDGET: usize = 4;
/// Bytes the hoarding connection's client sends: far more than the budget,
/// well within the server's 1 MiB stream window (so only the budget can
/// stop the reader).
const HOARD_MSGS: usize = 48;

fn now() -> std::time::Instant {
    konn_core::io::clock::now()
}

/// What a server connection saw, shared with the test.
#[derive(Default)]
struct Seen {
    /// Messages received and not yet released (zero-copy slices of the
    /// driver's read buffers): while `hoard` is set, nothing is released.
    held: RefCell<Vec<(u32, Bytes, usize)>>,
    hoard: Cell<bool>,
    /// Every message received, in order: (first byte, length).
    got: RefCell<Vec<(u8, usize)>>,
    closed: Cell<bool>,
    error: RefCell<Option<String>>,
    wake: Notify,
}

impl Seen {
    fn held_bytes(&self) -> usize {
        self.held.borrow().iter().map(|(_, m, _)| m.len()).sum()
    }
}

/// A gRPC server that keeps (or releases at once) what it receives.
struct Server(Rc<Seen>);

impl Handler<Grpc> for Server {
    fn on_event(&mut self, grpc: &mut Grpc, event: GrpcEvent) {
        match event {
            GrpcEvent::Call { id, .. } => grpc.accept(id, &Headers::new()).unwrap(),
            GrpcEvent::Message { id, msg, flow, .. } => {
                self.0
                    .got
                    .borrow_mut()
                    .push((msg.first().copied().unwrap_or(0), msg.len()));
                if self.0.hoard.get() {
                    self.0.held.borrow_mut().push((id, msg, flow));
                } else {
                    grpc.release(id, flow);
                }
            }
            GrpcEvent::HalfClose { id } => grpc.finish(id, GrpcStatus::OK, "").unwrap(),
            _ => {}
        }
        self.0.wake.notify();
    }

    fn on_close(&mut self, _grpc: &mut Grpc, error: Option<&Error>) {
        self.0.closed.set(true);
        *self.0.error.borrow_mut() = error.map(ToString::to_string);
        self.0.wake.notify();
    }
}

/// Stops hoarding and gives every held message back.
fn release_all(seen: &Seen, handle: &ConnHandle<Grpc, Server>) {
    seen.hoard.set(false);
    let held = std::mem::take(&mut *seen.held.borrow_mut());
    handle
        .with(|g, _| {
            for (id, _msg, flow) in held {
                g.release(id, flow);
            }
        })
        .unwrap();
}

/// Polls `cond` (woken by the connection's notifications) until it holds;
/// panics with `what` after 20 s.
async fn until(seen: &Seen, what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = monoio::time::Instant::now() + Duration::from_secs(20);
    while !cond() {
        let tick = monoio::time::sleep(Duration::from_millis(5));
        if let Either::Right(()) = race(
            race(seen.wake.notified(), tick),
            monoio::time::sleep_until(deadline),
        )
        .await
        {
            panic!("timed out waiting: {what}");
        }
    }
}

/// A gRPC client on its own thread (own runtime, own pool): sends `msgs`
/// messages of `MSG` bytes (message `i` filled with byte `i`) on one call
/// and reports the call's final status.
fn client(engine: Engine, addr: SocketAddr, msgs: usize) -> mpsc::Receiver<Option<GrpcStatus>> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let status = block_on(engine, async move {
            #[derive(Default)]
            struct Client {
                status: Rc<Cell<Option<GrpcStatus>>>,
                wake: Rc<Notify>,
            }
            impl Handler<Grpc> for Client {
                fn on_event(&mut self, grpc: &mut Grpc, event: GrpcEvent) {
                    match event {
                        GrpcEvent::Message { id, flow, .. } => grpc.release(id, flow),
                        GrpcEvent::Finished { status, .. } => self.status.set(Some(status)),
                        _ => {}
                    }
                    self.wake.notify();
                }
                fn on_close(&mut self, _grpc: &mut Grpc, _error: Option<&Error>) {
                    self.wake.notify();
                }
            }
            let c = Client::default();
            let (status, wake) = (c.status.clone(), c.wake.clone());
            let grpc = Grpc::new(Connection::new(Config::new(Role::Client), now()), 4 << 20);
            let handle = ConnHandle::new(grpc, None, c, DriverConfig::default());
            let io = TcpStream::connect(addr).await.unwrap();
            let h = handle.clone();
            let task = monoio::spawn(async move { h.run(io).await });
            let id = handle
                .with(|g, _| {
                    g.start_call(
                        "http",
                        Bytes::from_static(b"localhost"),
                        Bytes::from_static(b"/Budget/Fill"),
                        &Headers::new(),
                    )
                })
                .unwrap()
                .unwrap();
            handle
                .with(|g, _| {
                    for i in 0..msgs {
                        g.send_message(id, &vec![i as u8; MSG]).unwrap();
                    }
                    g.close_send(id).unwrap();
                })
                .unwrap();
            let deadline = monoio::time::Instant::now() + Duration::from_secs(30);
            while status.get().is_none() && !handle.is_closed() {
                if let Either::Right(()) =
                    race(wake.notified(), monoio::time::sleep_until(deadline)).await
                {
                    break;
                }
            }
            handle.abort();
            let _ = task.await;
            status.get()
        });
        let _ = tx.send(status.unwrap_or(None));
    });
    rx
}

/// What another thread sends on `rx`, waited for without blocking this
/// thread's runtime (the server side runs on it); panics naming `what`
/// after 30 s.
async fn recv_from<T>(rx: &mpsc::Receiver<T>, what: &str) -> T {
    let deadline = monoio::time::Instant::now() + Duration::from_secs(30);
    loop {
        match rx.try_recv() {
            Ok(v) => return v,
            Err(mpsc::TryRecvError::Empty) if monoio::time::Instant::now() < deadline => {
                monoio::time::sleep(Duration::from_millis(5)).await;
            }
            Err(e) => panic!("no {what}: {e}"),
        }
    }
}

/// The status a client thread reported.
async fn status_of(rx: &mpsc::Receiver<Option<GrpcStatus>>) -> Option<GrpcStatus> {
    recv_from(rx, "status from the client").await
}

/// The server side's pool: `BUDGET` buffers, taken one at a time.
fn small_pool(acquire_timeout: Duration) -> (MemoryBudget, BufPool) {
    let budget = MemoryBudget::new(BUDGET * BUF_CAPACITY);
    let pool = BufPool::new(
        &budget,
        &PoolConfig {
            credit_chunk: 1,
            acquire_timeout,
            ..PoolConfig::default()
        },
    );
    (budget, pool)
}

fn server_conn(seen: &Rc<Seen>) -> ConnHandle<Grpc, Server> {
    let grpc = Grpc::new(Connection::new(Config::new(Role::Server), now()), 4 << 20);
    ConnHandle::new(grpc, None, Server(seen.clone()), DriverConfig::default())
}

fn assert_in_order(seen: &Seen, msgs: usize) {
    let got = seen.got.borrow();
    assert_eq!(got.len(), msgs);
    for (i, &(first, len)) in got.iter().enumerate() {
        assert_eq!((first, len), (i as u8, MSG), "message {i}");
    }
}

#[test]
fn a_reader_waits_for_the_budget_and_resumes() {
    run_on_each_engine(|engine| async move {
        let (budget, pool) = small_pool(Duration::from_secs(60));
        let _current = pool::install(pool.clone());
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();

        // A: keeps everything it receives.
        let a = Rc::new(Seen::default());
        a.hoard.set(true);
        let a_status = client(engine, addr, HOARD_MSGS);
        let (s, _) = listener.accept().await.unwrap();
        let a_conn = server_conn(&a);
        let a_task = monoio::spawn(a_conn.clone().run(s));
        until(&a, "A's reader to run out of budget", || {
            budget.stats().exhausted > 0
        })
        .await;
        // Everything A holds is in pooled buffers: bounded by the budget,
        // far below what its client sent and its window allowed.
        let held = a.held_bytes();
        assert!(held > 0, "{engine}: A received nothing");
        assert!(
            held <= BUDGET * BUF_CAPACITY,
            "{engine}: A holds {held} bytes beyond a {BUDGET}-buffer budget"
        );
        assert!(a.got.borrow().len() < HOARD_MSGS);

        // B arrives while the budget is used up: it waits as well.
        let b = Rc::new(Seen::default());
        let b_status = client(engine, addr, 8);
        let (s, _) = listener.accept().await.unwrap();
        let b_task = monoio::spawn(server_conn(&b).run(s));
        until(&b, "B to wait for a buffer", || {
            budget.stats().exhausted > 1
        })
        .await;
        assert!(
            !a.closed.get() && !b.closed.get(),
            "{engine}: nobody is closed for waiting"
        );
        assert!(a.held_bytes() <= BUDGET * BUF_CAPACITY);

        // A's queue drains: buffers come back, and both go on.
        release_all(&a, &a_conn);
        until(&b, "B's messages", || b.got.borrow().len() == 8).await;
        until(&a, "A's messages", || a.got.borrow().len() == HOARD_MSGS).await;
        assert_in_order(&a, HOARD_MSGS);
        assert_in_order(&b, 8);
        for (name, rx) in [("A", a_status), ("B", b_status)] {
            let status = status_of(&rx).await;
            assert_eq!(status, Some(GrpcStatus::OK), "{engine}: {name}'s call");
        }
        a_task.await.unwrap();
        b_task.await.unwrap();
        assert_eq!(*a.error.borrow(), None);
        assert_eq!(*b.error.borrow(), None);
        assert!(pool.stats().budget.reserved_buffers <= BUDGET);
    });
}

#[test]
fn a_reader_gives_up_at_the_pool_deadline() {
    run_on_each_engine(|engine| async move {
        let (budget, pool) = small_pool(Duration::from_millis(300));
        let _current = pool::install(pool.clone());
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let a = Rc::new(Seen::default());
        a.hoard.set(true);
        let status = client(engine, addr, HOARD_MSGS);
        let (s, _) = listener.accept().await.unwrap();
        let task = monoio::spawn(server_conn(&a).run(s));
        until(&a, "the reader to give up", || a.closed.get()).await;
        assert!(budget.stats().exhausted > 0);
        let error = a.error.borrow().clone().unwrap_or_default();
        assert!(
            error.contains("no I/O buffer within 300ms"),
            "{engine}: closed with {error:?}"
        );
        assert!(matches!(task.await, Err(Error::BufferWaitTimeout(_))));
        let status = status_of(&status).await;
        assert_ne!(
            status,
            Some(GrpcStatus::OK),
            "{engine}: the call cannot succeed"
        );
        // The connection's buffers went back with it.
        drop(std::mem::take(&mut *a.held.borrow_mut()));
        pool.reclaim();
        assert_eq!(pool.stats().in_use, 0);
    });
}

/// A reader with nothing unprocessed waits without a buffer: an idle
/// connection holds none of the budget (S5's per-connection memory).
#[test]
fn an_idle_reader_holds_no_buffer() {
    run_on_each_engine(|engine| async move {
        let (budget, pool) = small_pool(Duration::from_secs(60));
        let _current = pool::install(pool.clone());
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        // A raw HTTP/2 client on its own thread: preface and SETTINGS, then
        // it waits for the server's acknowledgement (proof that the server
        // read them) and stays connected, silent, until told to go.
        let (acked_tx, acked_rx) = mpsc::channel();
        let (done_tx, done_rx) = mpsc::channel::<()>();
        let peer = std::thread::spawn(move || {
            use std::io::{Read, Write};
            let mut s = std::net::TcpStream::connect(addr).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
            s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0")
                .unwrap();
            let mut header = [0u8; 9];
            loop {
                s.read_exact(&mut header).unwrap();
                let len = usize::from(header[0]) << 16
                    | usize::from(header[1]) << 8
                    | usize::from(header[2]);
                std::io::copy(&mut (&mut s).take(len as u64), &mut std::io::sink()).unwrap();
                if header[3] == 4 && header[4] & 1 == 1 {
                    break; // SETTINGS with ACK
                }
            }
            acked_tx.send(()).unwrap();
            let _ = done_rx.recv_timeout(Duration::from_secs(30));
        });
        let seen = Rc::new(Seen::default());
        let (s, _) = listener.accept().await.unwrap();
        let conn = server_conn(&seen);
        let task = monoio::spawn(conn.clone().run(s));
        recv_from(&acked_rx, "SETTINGS ACK from the server").await;
        until(&seen, "the idle reader to give its buffer back", || {
            pool.reclaim();
            // Under io_uring's data ring the worker's provided-buffer
            // rings hold buffers of the pool for all its sockets: every
            // buffer still in use must be one of those, none the
            // connection's own.
            let provided = konn_core::io::uring::current().map_or(0, |r| r.stats().provided_units);
            pool.stats().in_use == provided
        })
        .await;
        // What the overload watermark reads: nothing, on either engine
        // (the ring's empty provided buffers are spare room).
        assert_eq!(budget.in_use_bytes(), 0, "{engine}: published as in use");
        assert!(!seen.closed.get(), "{engine}: the connection stays open");
        done_tx.send(()).unwrap();
        conn.abort();
        let _ = task.await;
        peer.join().unwrap();
    });
}
