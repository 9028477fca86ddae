//! Interop with grpc-go: konn's gRPC server and client, on the connection
//! driver, against a real grpc-go peer (`interop/cmd/grpcpeer`, built from
//! the upstream Konnectivity stubs) — over mTLS TCP and over a Unix socket,
//! under both io engines.
//!
//! Each case runs `/AgentService/Connect` and `/ProxyService/Proxy`
//! concurrently on one connection; on each call both sides send
//! [`COUNT`] packets of a deterministic sequence while receiving and
//! checking the other side's [`COUNT`] packets (every type, payloads from 0
//! bytes to just under 4 MiB, extreme ids), then the server ends the call
//! with OK. grpc-go runs with its defaults (64 KiB windows + BDP, 4 MiB
//! messages), so konn's flow control meets grpc-go's. Connect also carries
//! upstream's metadata: `agentid`/`agentidentifiers` one way,
//! `serverid`/`servercount` the other, checked by both ends.
//!
//! The Go program is built once per test run (`go build`, needs Go on
//! `PATH` or in `/usr/local/go/bin`); each case is bounded in time, kills
//! the Go child if it overruns, and checks that the test process leaked no
//! file descriptor. Negative cases (a corrupted packet either way, a wrong
//! `agentid`) show that each end really checks. `interop/README.md`
//! describes the peer and the packet recipe.
//!
//! The last section holds the regression test of a driver bug these runs
//! exposed (calls left open when the writer failed first).

mod interop_support;
mod tls_support;

use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::Duration;

use interop_support::go::{GoPeer, grpcpeer};
use interop_support::peer::{Calls, Exchange, Meta};
use interop_support::seq::{self, Method};
use konn_core::io::driver::{ConnHandle, DriverConfig};
use konn_core::io::listen::{
    UnixListenOptions, bind_tcp, bind_unix, dial_tcp, tcp_into_monoio, unix_into_monoio,
};
use konn_core::io::runtime::{Either, Engine, available_engines, block_on, race};
use konn_core::io::tls::{ClientTlsOptions, PemSource, ServerTlsOptions, TlsLayer};
use konn_frames::GrpcStatus;
use konn_protocol::grpc::Grpc;
use konn_protocol::h2::{Config, Connection, Role};
use konn_testkit::fds::{fd_targets, serial};
use monoio::net::UnixStream;
use tls_support::{Pki, TempDir};

/// Packets each way on each call.
const COUNT: u32 = 10_000;
/// Bound on one exchange (both calls of one connection).
const EXCHANGE_LIMIT: Duration = Duration::from_secs(120);
/// Bound on connection set-up steps and on the Go peer's exit afterwards.
const STEP_LIMIT: Duration = Duration::from_secs(30);
/// Every case runs both methods on one connection.
const METHODS: [Method; 2] = [Method::Connect, Method::Proxy];
/// Received messages may be as large as grpc-go's default limit.
const MAX_MESSAGE: u32 = 4 << 20;

const META: Meta = Meta {
    agent_id: "konn-interop-agent",
    agent_identifiers: "host=node1.konn.test&ipv4=10.0.0.5&default-route=true",
    server_id: "konn-interop-server",
    server_count: "3",
};

#[derive(Clone, Copy, Debug)]
enum Transport {
    /// TCP on 127.0.0.1 with mutual TLS.
    Mtls,
    /// A Unix socket, plaintext.
    Unix,
}

/// What a case does wrong on purpose, to show that the harness notices.
#[derive(Clone, Copy, Debug)]
enum Fault {
    /// Nothing: every packet and header must match.
    None,
    /// The Go peer alters its outgoing packet `i` on every call.
    GoCorrupts(u32),
    /// konn alters its outgoing packet `i` on every call.
    KonnCorrupts(u32),
    /// The client sends an `agentid` the server does not expect.
    WrongAgentId,
}

/// The `agentid` a client sends under [`Fault::WrongAgentId`].
const INTRUDER: &str = "intruder";

/// Test certificates written to files (both konn and Go read the files).
struct Certs {
    dir: TempDir,
    ca: PathBuf,
    server_cert: PathBuf,
    server_key: PathBuf,
    client_cert: PathBuf,
    client_key: PathBuf,
}

impl Certs {
    fn new() -> Self {
        let pki = Pki::new();
        let dir = TempDir::new();
        Self {
            ca: dir.write("ca.crt", &pki.ca.pem.cert),
            server_cert: dir.write("server.crt", &pki.server.cert),
            server_key: dir.write("server.key", &pki.server.key),
            client_cert: dir.write("client.crt", &pki.client.cert),
            client_key: dir.write("client.key", &pki.client.key),
            dir,
        }
    }

    fn server_tls(&self) -> TlsLayer {
        let mut o = ServerTlsOptions::new(
            PemSource::file(&self.server_cert),
            PemSource::file(&self.server_key),
        );
        o.client_ca = Some(PemSource::file(&self.ca));
        o.build().unwrap().layer().unwrap()
    }

    fn client_tls(&self) -> TlsLayer {
        let mut o = ClientTlsOptions::new(PemSource::file(&self.ca), "127.0.0.1");
        o.identity = Some((
            PemSource::file(&self.client_cert),
            PemSource::file(&self.client_key),
        ));
        o.build().unwrap().layer().unwrap()
    }
}

fn now() -> std::time::Instant {
    konn_core::io::clock::now()
}

/// Runs `case` on a fresh runtime for every available engine (io_uring is
/// mandatory when `KONN_REQUIRE_IO_URING` is set), checking after each run
/// that no file descriptor leaked.
fn on_each_engine<F, Fut>(name: &str, mut case: F)
where
    F: FnMut(Engine) -> Fut,
    Fut: Future<Output = ()>,
{
    let _serial = serial();
    // Build before counting: the build's pipes are not the case's.
    grpcpeer();
    let engines = available_engines();
    if !engines.contains(&Engine::IoUring) {
        assert!(
            std::env::var_os("KONN_REQUIRE_IO_URING").is_none(),
            "KONN_REQUIRE_IO_URING is set but io_uring is unavailable"
        );
        eprintln!("note: io_uring unavailable here; running {name} on epoll only");
    }
    for engine in engines {
        let before = fd_targets();
        let started = now();
        block_on(engine, case(engine)).unwrap();
        eprintln!("{name} [{engine}]: {:.2?}", now() - started);
        // Fewer is fine: leftovers of an earlier failed case may go away.
        let after = fd_targets();
        assert!(
            after.len() <= before.len(),
            "{name} [{engine}]: descriptors leaked: before {before:#?}, after {after:#?}"
        );
    }
}

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| (*s).to_owned()).collect()
}

/// Flags both peer modes share.
fn common_args() -> Vec<String> {
    args(&[
        "-count",
        &COUNT.to_string(),
        "-timeout",
        &format!("{}s", EXCHANGE_LIMIT.as_secs() + STEP_LIMIT.as_secs()),
        "-agent-id",
        META.agent_id,
        "-agent-identifiers",
        META.agent_identifiers,
        "-server-id",
        META.server_id,
        "-server-count",
        META.server_count,
    ])
}

fn path_arg(p: &Path) -> String {
    p.to_str().expect("UTF-8 temp path").to_owned()
}

/// `fut`, or a panic with the peer's output if the peer exits first or
/// `limit` passes.
async fn or_peer_gone<T>(
    what: &str,
    peer: &mut GoPeer,
    limit: Duration,
    fut: impl Future<Output = T>,
) -> T {
    let fut = race(fut, monoio::time::sleep(limit));
    match race(fut, peer.exited()).await {
        Either::Left(Either::Left(v)) => v,
        Either::Left(Either::Right(())) => {
            panic!("{what}: no progress in {limit:?}\n{}", peer.output())
        }
        Either::Right(status) => {
            panic!(
                "{what}: grpcpeer exited early ({status})\n{}",
                peer.output()
            )
        }
    }
}

// ----- konn server <- Go client ----------------------------------------------

/// Serves the one connection the Go client makes, then checks both ends.
async fn konn_server_go_client(engine: Engine, certs: &Certs, transport: Transport, fault: Fault) {
    let name = format!("go-client-{engine}-{transport:?}-{fault:?}");
    let mut a = args(&["client", "-method", "both"]);
    a.extend(common_args());
    match fault {
        Fault::GoCorrupts(i) => a.extend(args(&["-corrupt-at", &i.to_string()])),
        // The last occurrence of a flag wins.
        Fault::WrongAgentId => a.extend(args(&["-agent-id", INTRUDER])),
        Fault::None | Fault::KonnCorrupts(_) => {}
    }
    let mut handler = Exchange::new(Role::Server, COUNT, META, Rc::default());
    if let Fault::KonnCorrupts(i) = fault {
        handler = handler.corrupt_at(i);
    }
    let calls = handler.calls();
    let clean = matches!(fault, Fault::None);
    let mut peer;
    match transport {
        Transport::Mtls => {
            let std_listener = bind_tcp(([127, 0, 0, 1], 0).into(), 16, false).unwrap();
            let addr = std_listener.local_addr().unwrap().to_string();
            let listener = tcp_into_monoio(std_listener).unwrap();
            a.extend(args(&["-tcp", &addr, "-server-name", "localhost"]));
            a.extend(args(&["-ca", &path_arg(&certs.ca)]));
            a.extend(args(&["-cert", &path_arg(&certs.client_cert)]));
            a.extend(args(&["-key", &path_arg(&certs.client_key)]));
            peer = GoPeer::spawn(certs.dir.path(), &name, &a);
            let accepted = or_peer_gone("accept", &mut peer, STEP_LIMIT, listener.accept());
            let (sock, _) = accepted.await.unwrap();
            sock.set_nodelay(true).unwrap();
            serve(sock, Some(certs.server_tls()), handler, clean, &mut peer).await;
        }
        Transport::Unix => {
            let path = certs.dir.path().join(format!("{name}.sock"));
            let std_listener = bind_unix(&path, &UnixListenOptions::default()).unwrap();
            let listener = unix_into_monoio(std_listener).unwrap();
            a.extend(args(&["-unix", &path_arg(&path)]));
            peer = GoPeer::spawn(certs.dir.path(), &name, &a);
            let accepted = or_peer_gone("accept", &mut peer, STEP_LIMIT, listener.accept());
            let (sock, _) = accepted.await.unwrap();
            serve(sock, None, handler, clean, &mut peer).await;
            drop(listener);
            std::fs::remove_file(&path).unwrap();
        }
    }
    check_outcome(Role::Server, fault, &calls, &mut peer).await;
}

/// Runs konn's server side of one connection until the client leaves.
/// A connection error fails the test only when `clean` (with a fault the
/// Go peer may hang up mid-write).
async fn serve<IO>(io: IO, tls: Option<TlsLayer>, handler: Exchange, clean: bool, peer: &mut GoPeer)
where
    IO: monoio::io::Splitable + 'static,
    IO::OwnedRead: monoio::io::AsyncReadRent + konn_core::io::sock::ReadReady + 'static,
    IO::OwnedWrite: monoio::io::AsyncWriteRent + 'static,
{
    let calls = handler.calls();
    let grpc = Grpc::new(
        Connection::new(Config::new(Role::Server), now()),
        MAX_MESSAGE,
    );
    let handle = ConnHandle::new(grpc, tls, handler, DriverConfig::default());
    let run = race(handle.run(io), monoio::time::sleep(EXCHANGE_LIMIT));
    match run.await {
        Either::Left(Ok(())) => {}
        Either::Left(Err(e)) if !clean || hung_up_after_calls(&e, &calls) => {}
        Either::Left(Err(e)) => panic!(
            "konn server connection failed: {e}\ncalls: {:#?}\n{}",
            calls.calls.borrow(),
            peer.output()
        ),
        Either::Right(()) => panic!(
            "konn server: exchange not over after {EXCHANGE_LIMIT:?}\ncalls: {:#?}\n{}",
            calls.calls.borrow(),
            peer.output()
        ),
    }
}

/// grpc-go closes its socket as soon as its calls are over; konn may still
/// be writing control frames (WINDOW_UPDATE, a PING ack), or grpc-go may
/// not have read them, so the kernel answers with EPIPE or a reset. Once
/// every call has ended that is a normal end of a connection, not a
/// failure.
fn hung_up_after_calls(e: &konn_core::Error, calls: &Calls) -> bool {
    let hang_up = matches!(e, konn_core::Error::Io(io) if matches!(
        io.kind(),
        std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset
    ));
    hang_up && calls.all_done(METHODS.len())
}

/// After the exchange: the Go peer's exit status and konn's call table are
/// what `fault` implies for konn in `role`.
async fn check_outcome(role: Role, fault: Fault, calls: &Calls, peer: &mut GoPeer) {
    let side = match role {
        Role::Server => "konn server",
        Role::Client => "konn client",
    };
    let needle = match fault {
        Fault::None => {
            let stdout = peer.expect_success(STEP_LIMIT).await;
            if let Err(e) = calls.check_all_ok(&METHODS, COUNT) {
                panic!("{side}: {e}\n{}", peer.output());
            }
            eprintln!("  {}", stdout.trim());
            return;
        }
        Fault::GoCorrupts(i) | Fault::KonnCorrupts(i) => format!("packet {i} differs"),
        Fault::WrongAgentId => "agentid".to_owned(),
    };
    // The side that detects the problem knows why. A detecting server puts
    // the reason in the call's status, so the client hears it too (konn's
    // grpc-message <-> grpc-go's status); a detecting client just cancels.
    let konn_detects = matches!(fault, Fault::GoCorrupts(_))
        || (matches!(fault, Fault::WrongAgentId) && role == Role::Server);
    let go_knows = !konn_detects || role == Role::Server;
    let konn_knows = konn_detects || role == Role::Client;
    let stderr = peer.expect_failure(STEP_LIMIT).await;
    if go_knows {
        assert!(
            stderr.contains(&needle),
            "{side}: grpcpeer did not report {needle:?}\n{}",
            peer.output()
        );
    }
    let calls = calls.calls.borrow();
    assert_eq!(calls.len(), METHODS.len(), "{side}: calls: {calls:#?}");
    for c in calls.values() {
        // Only Connect carries agent metadata.
        let affected = !matches!(fault, Fault::WrongAgentId) || c.method == Method::Connect;
        let status = c.status.as_ref().map(|s| s.0);
        if !affected {
            assert!(
                c.failure.is_none(),
                "{side}: {:?} call failed: {c:#?}",
                c.method
            );
            assert_eq!(status, Some(GrpcStatus::OK), "{side}: {c:#?}");
            continue;
        }
        // (`status` may be None on konn's server when grpc-go hung up
        // first: see `driver_finishes_calls_when_the_writer_fails_first`.)
        assert_ne!(status, Some(GrpcStatus::OK), "{side}: {c:#?}");
        if konn_knows {
            let reported = format!(
                "{} {}",
                c.failure.as_deref().unwrap_or_default(),
                c.status.as_ref().map_or("", |s| s.1.as_str())
            );
            assert!(
                reported.contains(&needle),
                "{side}: {:?} call should report {needle:?}: {c:#?}",
                c.method
            );
        }
    }
    eprintln!(
        "  detected as expected: {}",
        stderr.lines().next().unwrap_or_default()
    );
}

// ----- Go server <- konn client ----------------------------------------------

/// Starts the Go server, connects konn's client, runs both calls.
async fn go_server_konn_client(engine: Engine, certs: &Certs, transport: Transport, fault: Fault) {
    let name = format!("go-server-{engine}-{transport:?}-{fault:?}");
    let ready = certs.dir.path().join(format!("{name}.ready"));
    let mut a = args(&["server", "-streams", "2", "-ready-file", &path_arg(&ready)]);
    a.extend(common_args());
    if let Fault::GoCorrupts(i) = fault {
        a.extend(args(&["-corrupt-at", &i.to_string()]));
    }
    let sock_path = certs.dir.path().join(format!("{name}.sock"));
    match transport {
        Transport::Mtls => {
            a.extend(args(&["-tcp", "127.0.0.1:0", "-ca", &path_arg(&certs.ca)]));
            a.extend(args(&["-cert", &path_arg(&certs.server_cert)]));
            a.extend(args(&["-key", &path_arg(&certs.server_key)]));
        }
        Transport::Unix => a.extend(args(&["-unix", &path_arg(&sock_path)])),
    }
    let meta = match fault {
        Fault::WrongAgentId => Meta {
            agent_id: INTRUDER,
            ..META
        },
        _ => META,
    };
    let mut handler = Exchange::new(Role::Client, COUNT, meta, Rc::default());
    if let Fault::KonnCorrupts(i) = fault {
        handler = handler.corrupt_at(i);
    }
    let calls = handler.calls();
    let clean = matches!(fault, Fault::None);
    let mut peer = GoPeer::spawn(certs.dir.path(), &name, &a);
    let listening = or_peer_gone("listen", &mut peer, STEP_LIMIT, ready_file(&ready)).await;
    match transport {
        Transport::Mtls => {
            let addr = listening
                .lines()
                .find_map(|l| l.strip_prefix("tcp="))
                .expect("tcp= line in the ready file")
                .to_owned();
            let io = dial_tcp(addr.parse().unwrap()).await.unwrap();
            call(
                io,
                Some(certs.client_tls()),
                &addr,
                handler,
                clean,
                &mut peer,
            )
            .await;
        }
        Transport::Unix => {
            let io = UnixStream::connect(&sock_path).await.unwrap();
            call(io, None, "localhost", handler, clean, &mut peer).await;
        }
    }
    check_outcome(Role::Client, fault, &calls, &mut peer).await;
}

/// Polls for the Go server's ready file (written atomically).
async fn ready_file(path: &Path) -> String {
    loop {
        if let Ok(s) = std::fs::read_to_string(path) {
            return s;
        }
        monoio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Runs konn's client on `io`: both calls, until both have ended.
/// A connection error fails the test only when `clean`.
async fn call<IO>(
    io: IO,
    tls: Option<TlsLayer>,
    authority: &str,
    handler: Exchange,
    clean: bool,
    peer: &mut GoPeer,
) where
    IO: monoio::io::Splitable + 'static,
    IO::OwnedRead: monoio::io::AsyncReadRent + konn_core::io::sock::ReadReady + 'static,
    IO::OwnedWrite: monoio::io::AsyncWriteRent + 'static,
{
    let calls = handler.calls();
    let grpc = Grpc::new(
        Connection::new(Config::new(Role::Client), now()),
        MAX_MESSAGE,
    );
    let handle = ConnHandle::new(grpc, tls, handler, DriverConfig::default());
    let task = monoio::spawn(handle.clone().run(io));
    handle
        .with(|g, h| {
            for m in METHODS {
                h.start(g, authority, m);
            }
        })
        .unwrap();
    let deadline = monoio::time::Instant::now() + EXCHANGE_LIMIT;
    while !calls.all_done(METHODS.len()) {
        let wait = race(calls.wake.notified(), monoio::time::sleep_until(deadline));
        if let Either::Right(()) = wait.await {
            panic!(
                "konn client: calls not over after {EXCHANGE_LIMIT:?}: {:#?}\n{}",
                calls.calls.borrow(),
                peer.output()
            );
        }
    }
    handle.shutdown();
    match race(task, monoio::time::sleep(STEP_LIMIT)).await {
        Either::Left(Ok(())) => {}
        Either::Left(Err(e)) if !clean || hung_up_after_calls(&e, &calls) => {}
        Either::Left(Err(e)) => panic!(
            "konn client connection failed: {e}\ncalls: {:#?}\n{}",
            calls.calls.borrow(),
            peer.output()
        ),
        Either::Right(()) => panic!(
            "konn client: connection still open {STEP_LIMIT:?} after shutdown\n{}",
            peer.output()
        ),
    }
}

// ----- the cases ---------------------------------------------------------------

/// The Rust and Go sequence generators agree (pinned on both sides).
#[test]
fn sequences_match_the_go_generator() {
    assert_eq!(
        seq::fingerprint(3000),
        seq::FINGERPRINT,
        "the Rust recipe diverged from interop/internal/seq"
    );
}

#[test]
fn go_client_to_konn_server_over_mtls() {
    let certs = Certs::new();
    on_each_engine("go client -> konn server, mTLS", |engine| {
        konn_server_go_client(engine, &certs, Transport::Mtls, Fault::None)
    });
}

#[test]
fn go_client_to_konn_server_over_unix_socket() {
    let certs = Certs::new();
    on_each_engine("go client -> konn server, unix", |engine| {
        konn_server_go_client(engine, &certs, Transport::Unix, Fault::None)
    });
}

#[test]
fn konn_client_to_go_server_over_mtls() {
    let certs = Certs::new();
    on_each_engine("konn client -> go server, mTLS", |engine| {
        go_server_konn_client(engine, &certs, Transport::Mtls, Fault::None)
    });
}

#[test]
fn konn_client_to_go_server_over_unix_socket() {
    let certs = Certs::new();
    on_each_engine("konn client -> go server, unix", |engine| {
        go_server_konn_client(engine, &certs, Transport::Unix, Fault::None)
    });
}

// ----- the harness notices what it should ------------------------------------------

/// A DATA packet from grpc-go with one flipped byte fails both calls on
/// konn's server, and grpc-go hears why.
#[test]
fn konn_server_detects_a_corrupt_packet_from_go() {
    let certs = Certs::new();
    on_each_engine("go client corrupts, konn server detects", |engine| {
        konn_server_go_client(engine, &certs, Transport::Mtls, Fault::GoCorrupts(2000))
    });
}

/// A packet from konn's server that is not the expected one fails the
/// grpc-go client.
#[test]
fn go_client_detects_a_corrupt_packet_from_konn() {
    let certs = Certs::new();
    on_each_engine("konn server corrupts, go client detects", |engine| {
        konn_server_go_client(engine, &certs, Transport::Unix, Fault::KonnCorrupts(1001))
    });
}

/// The same in the other pairing: konn's client and grpc-go's server.
#[test]
fn corrupt_packets_are_detected_between_konn_client_and_go_server() {
    let certs = Certs::new();
    on_each_engine("konn client corrupts, go server detects", |engine| {
        go_server_konn_client(engine, &certs, Transport::Unix, Fault::KonnCorrupts(1001))
    });
    on_each_engine("go server corrupts, konn client detects", |engine| {
        go_server_konn_client(engine, &certs, Transport::Mtls, Fault::GoCorrupts(2000))
    });
}

/// A wrong `agentid` on Connect is refused by either server; Proxy, which
/// carries no metadata, still completes.
#[test]
fn wrong_agent_id_is_refused_by_both_servers() {
    let certs = Certs::new();
    on_each_engine("go client with a wrong agentid", |engine| {
        konn_server_go_client(engine, &certs, Transport::Unix, Fault::WrongAgentId)
    });
    on_each_engine("konn client with a wrong agentid", |engine| {
        go_server_konn_client(engine, &certs, Transport::Unix, Fault::WrongAgentId)
    });
}

// ----- konn-core bugs this suite ran into ------------------------------------------

/// Records whether a call got its `Finished` event.
#[derive(Default)]
struct FinishedProbe(Rc<std::cell::Cell<Option<GrpcStatus>>>);

impl konn_core::io::driver::Handler<Grpc> for FinishedProbe {
    fn on_event(&mut self, _grpc: &mut Grpc, event: konn_protocol::grpc::GrpcEvent) {
        if let konn_protocol::grpc::GrpcEvent::Finished { status, .. } = event {
            self.0.set(Some(status));
        }
    }
}

/// When the socket *write* fails before the read side ends (here: a write
/// timeout against a peer that stopped reading; in the interop runs: EPIPE
/// when grpc-go hangs up mid-transfer), every open call must still end with
/// a `Finished` event, as `Handler::on_close` promises.
///
/// (It used to fail: `Conn::write_loop` marked the connection closed on its
/// way out, so the later `Conn::finish` skipped `Session::connection_lost`
/// and the call stayed open forever.)
#[test]
fn driver_finishes_calls_when_the_writer_fails_first() {
    use std::io::Write;
    let _serial = serial();
    konn_core::io::runtime::run_on_each_engine(|engine| async move {
        let (ours, mut theirs) = std::os::unix::net::UnixStream::pair().unwrap();
        ours.set_nonblocking(engine == Engine::Epoll).unwrap();
        // The "server" opens every window wide (SETTINGS initial window
        // 2^31-1, WINDOW_UPDATE on the connection), then never reads.
        let mut frames = vec![0, 0, 6, 4, 0, 0, 0, 0, 0, 0, 4, 0x7f, 0xff, 0xff, 0xff];
        frames.extend([0, 0, 4, 8, 0, 0, 0, 0, 0, 0x7f, 0xff, 0x00, 0x00]);
        theirs.write_all(&frames).unwrap();
        let finished = FinishedProbe::default();
        let status = finished.0.clone();
        let cfg = DriverConfig {
            write_timeout: Duration::from_millis(300),
            ..DriverConfig::default()
        };
        let grpc = Grpc::new(
            Connection::new(Config::new(Role::Client), now()),
            MAX_MESSAGE,
        );
        let handle = ConnHandle::new(grpc, None, finished, cfg);
        let task = monoio::spawn(handle.clone().run(UnixStream::from_std(ours).unwrap()));
        let chunk = vec![7u8; 64 * 1024];
        handle
            .with(|g, _| {
                let authority = bytes::Bytes::from_static(b"localhost");
                let path = bytes::Bytes::from_static(b"/ProxyService/Proxy");
                let id = g.start_call("http", authority, path, &Default::default())?;
                // 16 MiB: far more than the socket buffers hold.
                for _ in 0..256 {
                    g.send_message(id, &chunk)?;
                }
                Ok::<_, konn_core::Error>(())
            })
            .unwrap()
            .unwrap();
        let ended = race(task, monoio::time::sleep(Duration::from_secs(10))).await;
        let Either::Left(result) = ended else {
            panic!("the write timeout did not end the connection");
        };
        assert!(result.is_err(), "the connection should fail: {result:?}");
        let open = handle.with(|g, _| g.calls()).unwrap();
        drop(theirs);
        assert_eq!(open, 0, "a call is still open after the connection ended");
        assert_eq!(status.get(), Some(GrpcStatus::UNAVAILABLE));
    });
}
