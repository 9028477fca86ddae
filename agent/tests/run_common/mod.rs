//! Shared helpers of the agent runtime tests: in-process konn servers, an
//! echo destination, konn-bench's TCP load balancer, HTTP and CONNECT
//! clients on plain std sockets, waiting with deadlines, descriptor counts.

#![allow(dead_code, unreachable_pub)]

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use konn_agent::settings::AgentSettings;
pub use konn_bench::fds::{fd_targets, open_fds};
use konn_core::io::runtime::{Engine, IoEngine};
use konn_server::serve::{ServerHandle, start};
use konn_server::settings::{FrontendListen, Mode, ServerSettings};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};

/// Serialises the tests of one binary: descriptor counts are per process.
#[allow(clippy::disallowed_types)] // test-only serialisation
pub static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Holds [`SERIAL`] (a failed test must not poison the others).
#[allow(clippy::disallowed_types)]
pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Waits until the process has at most `limit` descriptors open (sockets
/// of other threads close asynchronously), or panics after 10 s.
pub fn assert_fds_back_to(limit: usize, what: &str) {
    let ok = wait_until(Duration::from_secs(10), || open_fds() <= limit);
    assert!(
        ok,
        "{what}: {} descriptors open, expected at most {limit}: {:?}",
        open_fds(),
        fd_targets()
    );
}

pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> Self {
        let n = std::time::SystemTime::UNIX_EPOCH
            .elapsed()
            .unwrap_or_default()
            .as_nanos();
        let p = std::env::temp_dir().join(format!("konn-agent-{tag}-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&p).unwrap();
        Self(p)
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub fn engine_flag(e: Engine) -> IoEngine {
    match e {
        Engine::IoUring => IoEngine::IoUring,
        Engine::Epoll => IoEngine::Epoll,
    }
}

/// Polls `cond` every 10 ms until it holds (true) or `limit` passes (false).
pub fn wait_until(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = konn_core::io::clock::now() + limit;
    loop {
        if cond() {
            return true;
        }
        if konn_core::io::clock::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A port nothing listens on (bound, then released).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

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

/// The load balancer between agents and servers (see `konn_bench::relay`).
#[allow(unused_imports)] // not every test binary balances
pub use konn_bench::relay::LoadBalancer;

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

/// A CA and a server certificate for 127.0.0.1, as PEM.
pub struct Pki {
    pub ca: String,
    pub server_cert: String,
    pub server_key: String,
}

pub fn pki() -> Pki {
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.distinguished_name
        .push(DnType::CommonName, "konn test CA");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_pem = ca.self_signed(&ca_key).unwrap().pem();
    let issuer = Issuer::new(ca, ca_key);
    let key = KeyPair::generate().unwrap();
    let mut leaf = CertificateParams::new(Vec::<String>::new()).unwrap();
    leaf.distinguished_name
        .push(DnType::CommonName, "konn-server");
    leaf.subject_alt_names = vec![SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST))];
    leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    leaf.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    Pki {
        ca: ca_pem,
        server_cert: leaf.signed_by(&key, &issuer).unwrap().pem(),
        server_key: key.serialize_pem(),
    }
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
