//! Shared helpers of the agent runtime tests: in-process konn servers, an
//! echo destination, HTTP and CONNECT clients on plain std sockets; and,
//! from konn-testkit, the TCP load balancer, PKI, ports, waiting with
//! deadlines and descriptor counts.

#![allow(dead_code, unreachable_pub, unused_imports)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use konn_agent::settings::AgentSettings;
use konn_core::io::runtime::Engine;
use konn_server::serve::{ServerHandle, start};
use konn_server::settings::{FrontendListen, Mode, ServerSettings};
pub use konn_testkit::engine_flag;
pub use konn_testkit::fds::{assert_fds_back_to, fd_targets, open_fds, serial};
pub use konn_testkit::files::TempDir;
pub use konn_testkit::ports::free_port;
pub use konn_testkit::wait::wait_until;

/// A proxy-server with an HTTP-CONNECT frontend on a Unix socket in `dir`.
pub struct TestServer {
    pub handle: Option<ServerHandle>,
    pub socket: PathBuf,
}

pub struct ServerSpec<'a> {
    pub engine: Engine,
    pub dir: &'a TempDir,
    pub name: &'a str,
    pub server_id: &'a str,
    pub server_count: usize,
    pub agent_addr: Option<SocketAddr>,
    pub workers: usize,
    pub tls: Option<konn_core::io::tls::ServerTls>,
}

impl<'a> ServerSpec<'a> {
    pub fn new(engine: Engine, dir: &'a TempDir, name: &'a str) -> Self {
        Self {
            engine,
            dir,
            name,
            server_id: name,
            server_count: 1,
            agent_addr: None,
            workers: 1,
            tls: None,
        }
    }

    pub fn start(self) -> TestServer {
        let socket = self.dir.path(&format!("{}.sock", self.name));
        let mut s =
            ServerSettings::for_tests(FrontendListen::Unix(socket.clone()), Mode::HttpConnect);
        s.server_id = self.server_id.to_owned();
        s.server_count = self.server_count;
        if let Some(a) = self.agent_addr {
            s.agent_addr = a;
        }
        s.agent_tls = self.tls;
        s.runtime.workers = self.workers;
        s.runtime.engine = engine_flag(self.engine);
        let server = TestServer {
            handle: Some(start(s).unwrap()),
            socket,
        };
        server.wait_serving();
        server
    }
}

impl TestServer {
    /// Returns once the frontend answers a request (405 to a GET), so the
    /// workers have set up their listeners and descriptor counts taken
    /// afterwards are stable.
    fn wait_serving(&self) {
        let mut s = UnixStream::connect(&self.socket).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let mut answer = [0u8; 12];
        s.read_exact(&mut answer).unwrap();
        assert_eq!(&answer, b"HTTP/1.1 405");
    }

    pub fn h(&self) -> &ServerHandle {
        self.handle.as_ref().unwrap()
    }

    pub fn agent_addr(&self) -> SocketAddr {
        self.h().agent_addr()
    }

    /// Agent tunnels the server holds now.
    pub fn backends(&self) -> usize {
        self.h().shared().backends.load(Ordering::Acquire)
    }

    pub fn stop(&mut self) {
        if let Some(h) = self.handle.take() {
            h.stop().unwrap();
        }
    }

    /// CONNECT to `dest` through the server; `Ok(stream)` after a 200, or
    /// `Err(full answer)`.
    pub fn connect(&self, dest: &str) -> Result<UnixStream, String> {
        connect_through(&self.socket, dest)
    }
}

pub fn connect_through(socket: &Path, dest: &str) -> Result<UnixStream, String> {
    let mut s = UnixStream::connect(socket).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(format!("CONNECT {dest} HTTP/1.1\r\nHost: {dest}\r\n\r\n").as_bytes())
        .unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match s.read(&mut byte) {
            Ok(1) => head.push(byte[0]),
            // Blocking reads here do see EINTR while io_uring workers run
            // (with no signal delivered); std's `read` does not retry it.
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            _ => break,
        }
    }
    let text = String::from_utf8_lossy(&head).into_owned();
    if text.starts_with("HTTP/1.1 200 ") {
        return Ok(s);
    }
    let mut rest = String::new();
    let _ = s.read_to_string(&mut rest);
    Err(text + &rest)
}

/// Echo `msg` through an established CONNECT stream.
pub fn echo_once(s: &mut UnixStream, msg: &[u8]) {
    s.write_all(msg).unwrap();
    let mut got = vec![0u8; msg.len()];
    s.read_exact(&mut got).unwrap();
    assert_eq!(got, msg);
}

/// A TCP echo server on its own threads, until `stop` is set (checked on
/// every accept; a last connection wakes it).
pub struct Echo {
    pub addr: String,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Echo {
    pub fn start() -> Self {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            for s in l.incoming() {
                if flag.load(Ordering::Acquire) {
                    return;
                }
                let Ok(mut s) = s else { return };
                std::thread::spawn(move || {
                    let mut r = s.try_clone().unwrap();
                    let _ = std::io::copy(&mut r, &mut s);
                });
            }
        });
        Self {
            addr,
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Echo {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        let _ = TcpStream::connect(&self.addr);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The load balancer between agents and servers (see `konn_testkit::relay`).
pub use konn_testkit::relay::LoadBalancer;

/// One HTTP/1.0 GET: (status, body).
pub fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1:1\r\n\r\n").as_bytes())
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let status = out.get(9..12).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = out
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

/// The value of the metric line starting with `series ` in a scrape.
pub fn metric(scrape: &str, series: &str) -> Option<f64> {
    scrape.lines().find_map(|l| {
        l.strip_prefix(series)
            .and_then(|rest| rest.strip_prefix(' '))
            .and_then(|v| v.parse().ok())
    })
}

/// Agent settings for tests on `engine`, one worker unless changed.
pub fn agent_settings(engine: Engine, address: impl Into<String>, id: &str) -> AgentSettings {
    let mut s = AgentSettings::for_tests(address, id);
    s.runtime.engine = engine_flag(engine);
    s
}

pub const FAILED: &str = "[+]ping ok\n[-]server-connected failed: no servers connected\n";
pub const PASSED: &str = "[+]ping ok\n[+]server-connected ok\ncheck passed\n";

/// A CA and certificates signed by it, as PEM (konn-testkit's PKI).
pub use konn_testkit::pki::Pem as Pki;

/// A fresh [`Pki`].
pub fn pki() -> Pki {
    konn_testkit::pki::generate().unwrap()
}

/// The server side of [`Pki`].
pub fn server_tls(pki: &Pki) -> konn_core::io::tls::ServerTls {
    konn_core::io::tls::ServerTlsOptions::new(
        konn_core::io::tls::PemSource::memory("server.crt", pki.server_cert.clone()),
        konn_core::io::tls::PemSource::memory("server.key", pki.server_key.clone()),
    )
    .build()
    .unwrap()
}
