//! `--drain-timeout` with the real `proxy-agent` binary against an
//! in-process konn server (mTLS agent port, HTTP-CONNECT frontend):
//! after the first SIGTERM the agent sends DRAIN, keeps relaying the
//! connection it has byte-exact, and exits 0 once that connection ends;
//! with a connection that never ends it exits at the deadline.

mod run_common;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

use konn_core::io::runtime::available_engines;
use konn_testkit::{Pattern, Sha256};
use run_common::*;

const T: Duration = Duration::from_secs(30);

/// A running agent binary; killed if the test fails half-way.
struct Agent {
    child: Child,
    log: std::path::PathBuf,
    health: std::net::SocketAddr,
}

impl Agent {
    fn start(dir: &TempDir, server: &TestServer, pki: &Pki, drain_timeout: &str) -> Self {
        let ca = dir.path("ca.crt");
        std::fs::write(&ca, &pki.ca_cert).unwrap();
        let (health, admin) = (free_port(), free_port());
        let log = dir.path("agent.log");
        let file = std::fs::File::create(&log).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_proxy-agent"))
            .args([
                format!("--ca-cert={}", ca.display()),
                "--proxy-server-host=127.0.0.1".to_owned(),
                format!("--proxy-server-port={}", server.agent_addr().port()),
                format!("--health-server-port={health}"),
                format!("--admin-server-port={admin}"),
                format!("--drain-timeout={drain_timeout}"),
                "--workers=1".to_owned(),
            ])
            .stdin(Stdio::null())
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .spawn()
            .unwrap();
        let agent = Self {
            child,
            log,
            health: ([127, 0, 0, 1], health).into(),
        };
        assert!(
            wait_until(T, || server.backends() == 1),
            "agent did not connect; log:\n{}",
            agent.log()
        );
        agent
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn term(&self) {
        let ok = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill -TERM failed");
    }

    fn drains_sent(&self) -> f64 {
        let series = "konnectivity_network_proxy_agent_stream_packets_total{packet_type=\"DRAIN\",segment=\"from_agent\"}";
        std::net::TcpStream::connect(self.health)
            .ok()
            .and_then(|_| metric(&http_get(self.health, "/metrics").1, series))
            .unwrap_or(0.0)
    }

    fn wait_exit(&mut self, limit: Duration) -> Option<ExitStatus> {
        let mut status = None;
        wait_until(limit, || {
            status = self.child.try_wait().unwrap();
            status.is_some()
        });
        status
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Sends `len` bytes of a [`Pattern`] through `s` (an echo path) from a
/// second thread and reads them back; the SHA-256 of what was sent and
/// of what came back.
fn echo_bulk(s: &UnixStream, len: usize) -> (String, String) {
    let mut w = s.try_clone().unwrap();
    let writer = std::thread::spawn(move || {
        let mut p = Pattern::new(7);
        let mut h = Sha256::new();
        let mut buf = vec![0u8; 64 * 1024];
        let mut left = len;
        while left > 0 {
            let n = left.min(buf.len());
            p.fill(&mut buf[..n]);
            h.update(&buf[..n]);
            w.write_all(&buf[..n]).unwrap();
            left -= n;
        }
        h.finish_hex()
    });
    let mut r = s.try_clone().unwrap();
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 64 * 1024];
    let mut got = 0;
    while got < len {
        let n = match r.read(&mut buf[..(len - got).min(64 * 1024)]) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => panic!("read after {got} bytes: {e}"),
        };
        h.update(&buf[..n]);
        got += n;
    }
    (writer.join().unwrap(), h.finish_hex())
}

#[test]
fn an_open_connection_keeps_working_after_sigterm_and_the_agent_exits_when_it_ends() {
    let _serial = serial();
    let engine = available_engines()[0];
    let echo = Echo::start();
    let dir = TempDir::new("drain-timeout");
    let pki = pki();
    let server = ServerSpec {
        tls: Some(server_tls(&pki)),
        ..ServerSpec::new(engine, &dir, "s")
    }
    .start();
    let mut agent = Agent::start(&dir, &server, &pki, "60s");
    let mut conn = server
        .connect(&echo.addr)
        .expect("CONNECT through the agent");
    echo_once(&mut conn, b"before");

    agent.term();
    assert!(
        wait_until(T, || agent.drains_sent() >= 1.0),
        "no DRAIN; log:\n{}",
        agent.log()
    );
    // The connection opened before DRAIN still carries every byte.
    let (sent, echoed) = echo_bulk(&conn, 4 << 20);
    assert_eq!(sent, echoed, "bytes lost or changed after DRAIN");
    assert!(
        agent.child.try_wait().unwrap().is_none(),
        "exited with a connection open; log:\n{}",
        agent.log()
    );

    // Its end lets the agent go, long before the 60 s deadline.
    drop(conn);
    let status = agent.wait_exit(Duration::from_secs(10));
    assert!(
        status.is_some_and(|s| s.success()),
        "{status:?}; log:\n{}",
        agent.log()
    );
    assert!(wait_until(T, || server.backends() == 0));
    assert!(agent.log().contains("drained: no connection open"));
}

#[test]
fn with_a_connection_that_never_ends_the_agent_exits_at_the_deadline() {
    let _serial = serial();
    let engine = available_engines()[0];
    let echo = Echo::start();
    let dir = TempDir::new("drain-deadline");
    let pki = pki();
    let server = ServerSpec {
        tls: Some(server_tls(&pki)),
        ..ServerSpec::new(engine, &dir, "s")
    }
    .start();
    let mut agent = Agent::start(&dir, &server, &pki, "2s");
    let mut conn = server
        .connect(&echo.addr)
        .expect("CONNECT through the agent");
    echo_once(&mut conn, b"held open");

    #[allow(clippy::disallowed_methods)] // a test measuring the deadline
    let started = std::time::Instant::now();
    agent.term();
    let status = agent.wait_exit(T);
    let took = started.elapsed();
    assert!(
        status.is_some_and(|s| s.success()),
        "{status:?}; log:\n{}",
        agent.log()
    );
    assert!(
        took >= Duration::from_secs(2) && took < Duration::from_secs(8),
        "exited after {took:?}, not at the 2 s deadline"
    );
    assert!(agent.log().contains("--drain-timeout passed"));
    // The held connection is then closed, not left hanging.
    conn.set_read_timeout(Some(T)).unwrap();
    let mut buf = [0u8; 16];
    let ended = loop {
        match conn.read(&mut buf) {
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            other => break other,
        }
    };
    assert!(
        matches!(ended, Ok(0)) || ended.is_err_and(|e| e.kind() != std::io::ErrorKind::WouldBlock),
        "the connection stayed open after the agent exited"
    );
}
