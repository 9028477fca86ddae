//! Listeners and the accept loop: SO_REUSEPORT per worker, Unix sockets,
//! stopping, fatal errors, and surviving EMFILE (in a child process with a
//! lowered descriptor limit).

use std::{
    cell::{Cell, RefCell},
    io::{BufRead, BufReader},
    os::unix::fs::{FileTypeExt, PermissionsExt},
    process::{Command, Stdio},
    sync::mpsc,
    time::Duration,
};

use konn_core::{
    Error,
    io::{
        listen::{
            AcceptErrorClass, AcceptHandler, TcpListeners, UnixListenOptions, accept_loop,
            bind_tcp, bind_unix, dial_tcp, tcp_into_monoio, unix_into_monoio,
        },
        runtime::{
            Engine, IoEngine, RuntimeConfig, Stopper, Workers, available_engines, block_on,
            run_on_each_engine, yield_now,
        },
        xcore::Mesh,
    },
};
use konn_testkit::fds::{assert_fds_back_to, open_fds, serial};
use monoio::net::TcpStream;

const WAIT: Duration = Duration::from_secs(20);

#[test]
fn reuseport_listeners_serve_one_port_on_every_worker() {
    let _serial = serial();
    const CLIENTS: usize = 32;
    for engine in available_engines() {
        let baseline = open_fds();
        {
            let listeners = std::sync::Arc::new(
                TcpListeners::bind("127.0.0.1:0".parse().unwrap(), 2, 128).unwrap(),
            );
            assert_eq!(listeners.len(), 2);
            let addr = listeners.local_addr();
            assert_ne!(addr.port(), 0);
            let (tx, rx) = mpsc::channel();
            let workers = Workers::<()>::start(
                RuntimeConfig {
                    workers: 2,
                    engine: match engine {
                        Engine::IoUring => IoEngine::IoUring,
                        Engine::Epoll => IoEngine::Epoll,
                    },
                    ..RuntimeConfig::default()
                },
                move |ctx| {
                    let (tx, listeners) = (tx.clone(), listeners.clone());
                    async move {
                        let index = ctx.index();
                        let listener = tcp_into_monoio(listeners.take(index).unwrap()).unwrap();
                        assert!(listeners.take(index).is_none(), "taken once");
                        let accepted = tx.clone();
                        let stats = accept_loop(&listener, ctx.stop_token(), |s: TcpStream| {
                            assert!(s.nodelay().unwrap(), "TCP_NODELAY on accepted sockets");
                            accepted.send(Some(index)).unwrap();
                        })
                        .await
                        .unwrap();
                        tx.send(None).unwrap();
                        assert_eq!(stats.resource_errors, 0);
                    }
                },
            )
            .unwrap();
            let mut per_worker = [0usize; 2];
            for _ in 0..CLIENTS {
                let client = std::net::TcpStream::connect(addr).unwrap();
                let worker = rx.recv_timeout(WAIT).unwrap().unwrap();
                per_worker[worker] += 1;
                drop(client);
            }
            assert_eq!(per_worker.iter().sum::<usize>(), CLIENTS);
            eprintln!("{engine}: connections per worker {per_worker:?}");
            workers.stop();
            for _ in 0..2 {
                assert_eq!(rx.recv_timeout(WAIT).unwrap(), None, "accept loops end");
            }
            workers.join().unwrap();
        }
        assert_fds_back_to(baseline, &format!("{engine}: descriptors"));
    }
}

#[test]
fn unix_socket_mode_and_replacement_rules() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("konn.sock");
    let listener = bind_unix(&path, &UnixListenOptions::default()).unwrap();
    let meta = std::fs::symlink_metadata(&path).unwrap();
    assert!(meta.file_type().is_socket());
    assert_eq!(meta.permissions().mode() & 0o7777, 0o770);

    // Exists and no permission to replace it: the kernel says EADDRINUSE.
    match bind_unix(&path, &UnixListenOptions::default()) {
        Err(Error::Bind { source, .. }) => {
            assert_eq!(source.raw_os_error(), Some(libc::EADDRINUSE));
        }
        other => panic!("expected EADDRINUSE, got {other:?}"),
    }
    drop(listener);

    // A stale socket file is replaced when asked, with the requested mode.
    let replace = UnixListenOptions {
        remove_existing: true,
        mode: 0o700,
        ..UnixListenOptions::default()
    };
    let listener = bind_unix(&path, &replace).unwrap();
    let meta = std::fs::symlink_metadata(&path).unwrap();
    assert_eq!(meta.permissions().mode() & 0o7777, 0o700);
    drop(listener);

    // Anything that is not a socket is left alone.
    let file = dir.path().join("precious");
    std::fs::write(&file, b"keep me").unwrap();
    match bind_unix(&file, &replace) {
        Err(Error::NotASocket(p)) => assert_eq!(p, file),
        other => panic!("expected NotASocket, got {other:?}"),
    }
    assert_eq!(std::fs::read(&file).unwrap(), b"keep me");
}

#[test]
fn unix_accept_loop_on_each_engine() {
    let _serial = serial();
    let baseline = open_fds();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("uds.sock");
    run_on_each_engine(|_engine| {
        let path = path.clone();
        async move {
            let options = UnixListenOptions {
                remove_existing: true,
                ..UnixListenOptions::default()
            };
            let listener = unix_into_monoio(bind_unix(&path, &options).unwrap()).unwrap();
            let stopper = Stopper::new();
            let token = stopper.token();
            // A one-inbox mesh doubles as a local notification channel.
            let notify = Mesh::<()>::new(1, 16);
            let mut accepted = notify.receiver(0).unwrap();
            let server = {
                let (token, tx) = (token.clone(), notify.sender());
                monoio::spawn(async move {
                    accept_loop(&listener, &token, |_s| tx.send(0, ()).unwrap()).await
                })
            };
            let mut clients = Vec::new();
            for _ in 0..3 {
                clients.push(monoio::net::UnixStream::connect(&path).await.unwrap());
            }
            let mut seen = Vec::with_capacity(3);
            while seen.len() < 3 {
                let got = monoio::time::timeout(WAIT, accepted.recv_batch(&mut seen, 3))
                    .await
                    .expect("accepts arrive");
                assert!(got > 0);
            }
            stopper.stop();
            let stats = monoio::time::timeout(WAIT, server).await.unwrap().unwrap();
            assert_eq!(stats.accepted, 3);
            drop(clients);
            token.close().await;
        }
    });
    drop(dir);
    assert_fds_back_to(baseline, "descriptors");
}

#[test]
fn accept_loop_stops_when_asked() {
    let _serial = serial();
    let baseline = open_fds();
    run_on_each_engine(|_engine| async {
        let listener =
            tcp_into_monoio(bind_tcp("127.0.0.1:0".parse().unwrap(), 16, false).unwrap()).unwrap();
        let stopper = Stopper::new();
        let token = stopper.token();
        let server = {
            let token = token.clone();
            monoio::spawn(async move { accept_loop(&listener, &token, |_s: TcpStream| {}).await })
        };
        // Let the loop block in accept, then stop it from another thread.
        for _ in 0..3 {
            yield_now().await;
        }
        let remote = stopper.clone();
        std::thread::spawn(move || remote.stop()).join().unwrap();
        let stats = monoio::time::timeout(WAIT, server)
            .await
            .expect("accept loop ends")
            .unwrap();
        assert_eq!(stats.accepted, 0);
        token.close().await;
    });
    assert_fds_back_to(baseline, "descriptors");
}

#[test]
fn accept_on_a_socket_that_is_not_listening_is_fatal() {
    let _serial = serial();
    run_on_each_engine(|_engine| async {
        let socket =
            socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        socket
            .bind(
                &"127.0.0.1:0"
                    .parse::<std::net::SocketAddr>()
                    .unwrap()
                    .into(),
            )
            .unwrap();
        let listener = tcp_into_monoio(socket.into()).unwrap();
        let stopper = Stopper::new();
        let token = stopper.token();
        let result =
            monoio::time::timeout(WAIT, accept_loop(&listener, &token, |_s: TcpStream| {}))
                .await
                .expect("a fatal error ends the loop");
        match result {
            Err(Error::Accept(err)) => assert_eq!(err.raw_os_error(), Some(libc::EINVAL)),
            other => panic!("expected Accept(EINVAL), got {other:?}"),
        }
        token.close().await;
    });
}

#[test]
fn dialled_connections_have_nodelay() {
    let _serial = serial();
    run_on_each_engine(|_engine| async {
        let listener = monoio::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let stream = dial_tcp(addr).await.unwrap();
        assert!(stream.nodelay().unwrap());
        let _peer = listener.accept().await.unwrap();
    });
}

// ----- EMFILE, in a child process --------------------------------------------

const CHILD_ENV: &str = "KONN_RT_EMFILE_CHILD";

#[test]
fn accept_loop_survives_emfile() {
    let _serial = serial();
    let exe = std::env::current_exe().unwrap();
    let mut child = Command::new(exe)
        .args([
            "--exact",
            "emfile_child",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, "1")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = BufReader::new(child.stdout.take().unwrap());
    let mut clients = Vec::new();
    let mut done = Vec::new();
    for line in stdout.lines() {
        let line = line.unwrap();
        // libtest may print "test emfile_child ... " in front of the first
        // line of output.
        let start = line
            .find("READY ")
            .or_else(|| line.find("DONE "))
            .unwrap_or(0);
        let words: Vec<&str> = line[start..].split_whitespace().collect();
        match words.as_slice() {
            ["READY", engine, port, count] => {
                let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
                for _ in 0..count.parse::<usize>().unwrap() {
                    clients.push(std::net::TcpStream::connect_timeout(&addr, WAIT).unwrap());
                }
                eprintln!("{engine}: connected {count} clients");
            }
            ["DONE", engine, accepted, wanted, emfile] => {
                assert_eq!(accepted, wanted, "{engine}: every client accepted");
                let emfile: u64 = emfile.parse().unwrap();
                assert!(emfile > 0, "{engine}: the limit was never hit");
                done.push((*engine).to_owned());
                clients.clear();
            }
            _ => {}
        }
    }
    let status = child.wait().unwrap();
    assert!(status.success(), "child failed: {status}");
    let expected: Vec<String> = available_engines().iter().map(Engine::to_string).collect();
    assert_eq!(done, expected);
}

/// Runs only inside the child started by `accept_loop_survives_emfile`.
#[test]
#[ignore = "child process of accept_loop_survives_emfile"]
fn emfile_child() {
    if std::env::var_os(CHILD_ENV).is_none() {
        return;
    }
    for engine in available_engines() {
        block_on(engine, emfile_scenario(engine)).unwrap();
    }
}

/// Holds accepted connections until `accept` fails with EMFILE, then lets
/// them go; the loop must carry on until every client is accepted.
struct Hoarder {
    held: RefCell<Vec<TcpStream>>,
    accepted: Cell<usize>,
    wanted: usize,
    emfile: Cell<u64>,
    stopper: Stopper,
}

impl AcceptHandler<TcpStream> for &Hoarder {
    fn on_accept(&mut self, stream: TcpStream) {
        self.held.borrow_mut().push(stream);
        self.accepted.set(self.accepted.get() + 1);
        if self.accepted.get() == self.wanted {
            self.stopper.stop();
        }
    }

    fn on_error(&mut self, error: &std::io::Error, class: AcceptErrorClass) {
        assert_eq!(class, AcceptErrorClass::Resource);
        if error.raw_os_error() == Some(libc::EMFILE) {
            self.emfile.set(self.emfile.get() + 1);
            self.held.borrow_mut().clear();
        }
    }
}

#[allow(unsafe_code)]
fn nofile_limit() -> libc::rlimit {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `limit` is a valid, writable rlimit for the duration of the call.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) };
    assert_eq!(rc, 0);
    limit
}

#[allow(unsafe_code)]
fn set_nofile_limit(limit: libc::rlimit) {
    // SAFETY: `limit` is a valid rlimit for the duration of the call. This
    // runs in a child process whose only job is this scenario.
    let rc = unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) };
    assert_eq!(rc, 0);
}

/// A descriptor limit leaving exactly `spare` free numbers below it
/// (descriptors are allocated lowest-first, so holes count).
fn limit_with_spare(spare: usize) -> u64 {
    let open: std::collections::BTreeSet<u64> = std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u64>().ok())
        .collect();
    let mut free = 0;
    (0u64..)
        .find(|n| {
            if !open.contains(n) {
                free += 1;
            }
            free == spare
        })
        .unwrap()
        + 1
}

async fn emfile_scenario(engine: Engine) {
    let listener =
        tcp_into_monoio(bind_tcp("127.0.0.1:0".parse().unwrap(), 128, false).unwrap()).unwrap();
    let port = listener.local_addr().unwrap().port();
    let stopper = Stopper::new();
    let token = stopper.token();

    let original = nofile_limit();
    // Two free slots, plus possibly the one the directory listing used.
    set_nofile_limit(libc::rlimit {
        rlim_cur: limit_with_spare(2),
        rlim_max: original.rlim_max,
    });
    let wanted = 7;
    let hoarder = Hoarder {
        held: RefCell::new(Vec::new()),
        accepted: Cell::new(0),
        wanted,
        emfile: Cell::new(0),
        stopper: stopper.clone(),
    };
    println!("READY {engine} {port} {wanted}");
    let stats = monoio::time::timeout(
        Duration::from_secs(30),
        accept_loop(&listener, &token, &hoarder),
    )
    .await
    .expect("accept loop finished")
    .expect("accept loop survived");
    hoarder.held.borrow_mut().clear();
    set_nofile_limit(original);
    assert_eq!(stats.resource_errors, hoarder.emfile.get());
    println!(
        "DONE {engine} {} {wanted} {}",
        hoarder.accepted.get(),
        hoarder.emfile.get()
    );
    token.close().await;
}
