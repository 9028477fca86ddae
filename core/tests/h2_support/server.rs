//! A small HTTP/2 server on konn's engine for conformance and attack tests,
//! shared by the integration tests (`mod h2_support`) and by
//! `examples/h2_test_server.rs` (included with `#[path]`).
//!
//! It runs on a thread of its own with one monoio runtime of the chosen io
//! engine, accepts TCP connections on 127.0.0.1 and drives each with
//! [`ConnHandle::run`]. Two applications sit on top:
//!
//! - [`HttpApp`], a bare-HTTP/2 handler: every request (any method) gets
//!   `200` with a non-empty body once the request has ended; request bodies
//!   are consumed and their flow-control credit released. In
//!   [`Work::Delayed`] mode each request instead starts "backend work" that
//!   answers after a fixed delay and ignores resets, the worst case for
//!   Rapid Reset / MadeYouReset.
//! - [`GrpcApp`], a gRPC echo handler.
//!
//! [`Counters`] is shared with the test thread: live connections, live
//! handlers (requests whose work has not ended) and their peak, and a report
//! per closed connection. Leak checks wait for the live counts to reach zero.

#![allow(dead_code, unreachable_pub)]

use std::cell::RefCell;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use bytes::Bytes;
use konn_core::io::driver::{ConnHandle, DriverConfig, Handler};
use konn_core::io::runtime::{Either, Engine, block_on, race};
use konn_core::io::tls::ServerTls;
use konn_frames::GrpcStatus;
use konn_protocol::grpc::{Grpc, GrpcEvent};
use konn_protocol::h2::{Config, Connection, Event, Headers, Role, Stats};

/// The body every bare-HTTP/2 response carries by default.
pub const DEFAULT_BODY: &[u8] = b"konn h2 test server\n";

/// How a bare-HTTP/2 request is served.
#[derive(Clone, Copy, Debug)]
pub enum Work {
    /// Answer as soon as the request has ended; a reset ends the work.
    Immediate,
    /// Start work that answers after this delay whatever happens to the
    /// stream (a backend that does not notice cancellation).
    Delayed(Duration),
}

/// Which application runs on each connection.
#[derive(Clone, Debug)]
pub enum App {
    /// Bare HTTP/2 ([`HttpApp`]).
    Http {
        /// Response body (sent unless the method is HEAD).
        body: Bytes,
        /// Serving mode.
        work: Work,
    },
    /// gRPC echo ([`GrpcApp`]) accepting messages up to `max_message` bytes.
    Grpc {
        /// Largest message accepted.
        max_message: u32,
    },
}

/// Everything the server needs to know.
#[derive(Clone)]
pub struct ServerOpts {
    /// The application.
    pub app: App,
    /// HTTP/2 settings and limits (the role is forced to server).
    pub h2: Config,
    /// Driver settings (timeouts).
    pub driver: DriverConfig,
    /// Serve TLS with this configuration.
    pub tls: Option<ServerTls>,
    /// Listen here (port 0 picks a free port).
    pub addr: SocketAddr,
    /// Fix SO_RCVBUF and SO_SNDBUF of accepted sockets to about this many
    /// bytes (set on the listener, inherited; turns off the kernel's
    /// autotuning) so flood tests can bound what sits in socket buffers.
    pub socket_buffers: Option<usize>,
}

impl ServerOpts {
    /// A bare-HTTP/2 server with konn's default settings, answering at once.
    pub fn http() -> Self {
        Self {
            app: App::Http {
                body: Bytes::from_static(DEFAULT_BODY),
                work: Work::Immediate,
            },
            h2: Config::new(Role::Server),
            driver: DriverConfig::default(),
            tls: None,
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            socket_buffers: None,
        }
    }

    /// A gRPC echo server with konn's default settings.
    pub fn grpc(max_message: u32) -> Self {
        Self {
            app: App::Grpc { max_message },
            ..Self::http()
        }
    }
}

/// What a connection reported when it closed.
#[derive(Clone, Debug)]
pub struct CloseReport {
    /// The error that ended the connection, as text.
    pub error: Option<String>,
    /// The HTTP/2 connection's counters at the end.
    pub stats: Stats,
}

/// Counters shared between the server thread and the test.
#[derive(Debug, Default)]
pub struct Counters {
    /// Connections accepted and not yet closed.
    pub conns_live: AtomicUsize,
    /// Connections accepted.
    pub conns_total: AtomicUsize,
    /// Requests (calls) whose handler work has not ended.
    pub handlers_live: AtomicUsize,
    /// Highest value `handlers_live` reached.
    pub handlers_peak: AtomicUsize,
    /// Requests (calls) handed to the application.
    pub requests: AtomicU64,
    /// Request body bytes (gRPC: message bytes) delivered to the application.
    pub body_bytes: AtomicU64,
}

impl Counters {
    fn handler_started(&self) {
        self.requests.fetch_add(1, Ordering::SeqCst);
        let now = self.handlers_live.fetch_add(1, Ordering::SeqCst) + 1;
        self.handlers_peak.fetch_max(now, Ordering::SeqCst);
    }

    fn handler_ended(&self) {
        self.handlers_live.fetch_sub(1, Ordering::SeqCst);
    }

    /// Live connections and handlers, for leak checks.
    pub fn live(&self) -> (usize, usize) {
        (
            self.conns_live.load(Ordering::SeqCst),
            self.handlers_live.load(Ordering::SeqCst),
        )
    }
}

/// A running test server. Dropping it stops the server and joins its thread.
pub struct TestServer {
    addr: SocketAddr,
    /// Shared counters.
    pub counters: Arc<Counters>,
    closes: mpsc::Receiver<CloseReport>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl TestServer {
    /// Start a server on its own thread under `engine`.
    ///
    /// # Panics
    /// If the runtime cannot be built or the address cannot be bound.
    pub fn start(engine: Engine, opts: ServerOpts) -> Self {
        let counters = Arc::new(Counters::default());
        let stop = Arc::new(AtomicBool::new(false));
        let (close_tx, closes) = mpsc::channel();
        let (addr_tx, addr_rx) = mpsc::channel();
        let thread = {
            let counters = counters.clone();
            let stop = stop.clone();
            std::thread::Builder::new()
                .name(format!("h2-test-server-{engine}"))
                .spawn(move || {
                    block_on(engine, serve(opts, counters, close_tx, stop, addr_tx))
                        .expect("server runtime");
                })
                .expect("server thread")
        };
        let addr = addr_rx
            .recv_timeout(Duration::from_secs(10))
            .expect("server did not start");
        Self {
            addr,
            counters,
            closes,
            stop,
            thread: Some(thread),
        }
    }

    /// The listening address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The next connection that closed, waiting up to `timeout`.
    pub fn next_close(&self, timeout: Duration) -> Option<CloseReport> {
        self.closes.recv_timeout(timeout).ok()
    }

    /// Wait until no connection and no handler is live.
    ///
    /// # Panics
    /// If that takes longer than `timeout`.
    pub fn wait_idle(&self, timeout: Duration) {
        let deadline = konn_core::io::clock::now() + timeout;
        loop {
            let live = self.counters.live();
            if live == (0, 0) {
                return;
            }
            assert!(
                konn_core::io::clock::now() < deadline,
                "server not idle after {timeout:?}: (connections, handlers) = {live:?}"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Stop accepting, let live connections end (up to 5 s), join the thread.
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let r = t.join();
            if r.is_err() && !std::thread::panicking() {
                panic!("server thread panicked");
            }
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.shutdown();
    }
}

async fn serve(
    opts: ServerOpts,
    counters: Arc<Counters>,
    closes: mpsc::Sender<CloseReport>,
    stop: Arc<AtomicBool>,
    addr_tx: mpsc::Sender<SocketAddr>,
) {
    let listener = listen(&opts);
    let _ = addr_tx.send(listener.local_addr().expect("local addr"));
    while !stop.load(Ordering::SeqCst) {
        let tick = monoio::time::sleep(Duration::from_millis(10));
        let (stream, _) = match race(listener.accept(), tick).await {
            Either::Left(Ok(s)) => s,
            Either::Left(Err(e)) => {
                eprintln!("accept: {e}");
                monoio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
            Either::Right(()) => continue,
        };
        let _ = stream.set_nodelay(true);
        counters.conns_live.fetch_add(1, Ordering::SeqCst);
        counters.conns_total.fetch_add(1, Ordering::SeqCst);
        let tls = opts
            .tls
            .as_ref()
            .map(|t| t.layer().expect("TLS layer for a connection"));
        let mut h2 = opts.h2.clone();
        h2.role = Role::Server;
        let conn = Connection::new(h2, konn_core::io::clock::now());
        let base = Base {
            counters: counters.clone(),
            closes: closes.clone(),
        };
        match &opts.app {
            App::Http { body, work } => {
                let me = Rc::new(RefCell::new(None));
                let app = HttpApp {
                    base,
                    body: body.clone(),
                    work: *work,
                    live: HashMap::new(),
                    me: me.clone(),
                };
                let handle = ConnHandle::new(conn, tls, app, opts.driver);
                if matches!(work, Work::Delayed(_)) {
                    *me.borrow_mut() = Some(handle.clone());
                }
                monoio::spawn(async move {
                    let _ = handle.run(stream).await;
                });
            }
            App::Grpc { max_message } => {
                let app = GrpcApp {
                    base,
                    live: HashMap::new(),
                };
                let handle = ConnHandle::new(Grpc::new(conn, *max_message), tls, app, opts.driver);
                monoio::spawn(async move {
                    let _ = handle.run(stream).await;
                });
            }
        }
    }
    drop(listener);
    // Give connections still running a bounded time to end on their own.
    for _ in 0..500 {
        if counters.live() == (0, 0) {
            break;
        }
        monoio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn listen(opts: &ServerOpts) -> monoio::net::TcpListener {
    let Some(size) = opts.socket_buffers else {
        return monoio::net::TcpListener::bind(opts.addr).expect("bind");
    };
    let sock =
        socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).expect("socket");
    sock.set_reuse_address(true).expect("SO_REUSEADDR");
    sock.set_recv_buffer_size(size).expect("SO_RCVBUF");
    sock.set_send_buffer_size(size).expect("SO_SNDBUF");
    sock.bind(&opts.addr.into()).expect("bind");
    sock.listen(128).expect("listen");
    konn_core::io::listen::tcp_into_monoio(sock.into()).expect("monoio listener")
}

/// What both applications share: the counters and the close reports.
struct Base {
    counters: Arc<Counters>,
    closes: mpsc::Sender<CloseReport>,
}

impl Base {
    fn closed(&self, stats: Stats, error: Option<&konn_core::Error>) {
        let _ = self.closes.send(CloseReport {
            error: error.map(ToString::to_string),
            stats,
        });
        self.counters.conns_live.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The bare-HTTP/2 application. See the module docs.
pub struct HttpApp {
    base: Base,
    body: Bytes,
    work: Work,
    /// Requests being served: id → the method is HEAD.
    live: HashMap<u32, bool>,
    /// This connection's handle, for delayed work (set after creation,
    /// cleared on close to break the reference cycle).
    me: Rc<RefCell<Option<ConnHandle<Connection, Self>>>>,
}

impl HttpApp {
    /// Answer request `id` and end its handler.
    fn respond(&mut self, conn: &mut Connection, id: u32) {
        let Some(head) = self.live.remove(&id) else {
            return;
        };
        respond(conn, id, head, &self.body);
        self.base.counters.handler_ended();
    }

    fn start_delayed(&mut self, id: u32, delay: Duration) {
        let Some(handle) = self.me.borrow().clone() else {
            return;
        };
        let body = self.body.clone();
        let counters = self.base.counters.clone();
        monoio::spawn(async move {
            monoio::time::sleep(delay).await;
            let _ = handle.with(|conn, _| respond(conn, id, false, &body));
            counters.handler_ended();
        });
    }
}

/// Send `200` (with `body` unless `head`) on `id` and hand the stream back.
/// Failures (the stream was reset meanwhile) are expected and ignored.
fn respond(conn: &mut Connection, id: u32, head: bool, body: &Bytes) {
    let mut h = Headers::response(200);
    h.push_static("content-type", "text/plain");
    if conn.send_headers(id, h, head).is_ok() && !head {
        let _ = conn.send_data(id, body.clone(), true);
    }
    conn.release_stream(id);
}

impl Handler<Connection> for HttpApp {
    fn on_event(&mut self, conn: &mut Connection, event: Event) {
        match event {
            Event::Headers {
                id,
                headers,
                end_stream,
            } => {
                self.base.counters.handler_started();
                if let Work::Delayed(d) = self.work {
                    self.start_delayed(id, d);
                    return;
                }
                let head = headers.get(b":method").is_some_and(|m| m == "HEAD");
                self.live.insert(id, head);
                if end_stream {
                    self.respond(conn, id);
                }
            }
            Event::Data {
                id,
                data,
                end_stream,
            } => {
                self.base
                    .counters
                    .body_bytes
                    .fetch_add(data.len() as u64, Ordering::SeqCst);
                conn.release_capacity(id, data.len());
                if end_stream {
                    self.respond(conn, id);
                }
            }
            Event::Trailers { id, .. } => self.respond(conn, id),
            Event::Reset { id, .. } => {
                if self.live.remove(&id).is_some() {
                    conn.release_stream(id);
                    self.base.counters.handler_ended();
                }
            }
            Event::Writable { .. } | Event::GoAway { .. } => {}
        }
    }

    fn on_close(&mut self, conn: &mut Connection, error: Option<&konn_core::Error>) {
        for _ in self.live.drain() {
            self.base.counters.handler_ended();
        }
        self.me.borrow_mut().take();
        self.base.closed(conn.stats(), error);
    }
}

/// The gRPC echo application: accepts every call, echoes each message,
/// finishes `OK` when the client half-closes.
pub struct GrpcApp {
    base: Base,
    /// Calls in progress.
    live: HashMap<u32, ()>,
}

impl GrpcApp {
    fn end(&mut self, id: u32) {
        if self.live.remove(&id).is_some() {
            self.base.counters.handler_ended();
        }
    }
}

impl Handler<Grpc> for GrpcApp {
    fn on_event(&mut self, grpc: &mut Grpc, event: GrpcEvent) {
        match event {
            GrpcEvent::Call { id, .. } => {
                self.base.counters.handler_started();
                self.live.insert(id, ());
                let _ = grpc.accept(id, &Headers::new());
            }
            GrpcEvent::Message { id, msg, flow, .. } => {
                self.base
                    .counters
                    .body_bytes
                    .fetch_add(msg.len() as u64, Ordering::SeqCst);
                let _ = grpc.send_message(id, &msg);
                grpc.release(id, flow);
            }
            GrpcEvent::HalfClose { id } => {
                let _ = grpc.finish(id, GrpcStatus::OK, "");
                self.end(id);
            }
            GrpcEvent::Finished { id, .. } => self.end(id),
            _ => {}
        }
    }

    fn on_close(&mut self, grpc: &mut Grpc, error: Option<&konn_core::Error>) {
        for _ in self.live.drain() {
            self.base.counters.handler_ended();
        }
        self.base.closed(grpc.conn().stats(), error);
    }
}
