//! The README's demo: a proxy-server, a proxy-agent and two destinations on
//! this machine, real traffic through the tunnel, readable output.
//!
//! 1. writes a throw-away PKI (agents authenticate with mTLS);
//! 2. starts an HTTP and an echo destination ("the node network");
//! 3. starts `proxy-server --mode=grpc` on a Unix socket, as kube-apiserver
//!    next to it would use, and `proxy-agent` dialling it;
//! 4. as kube-apiserver's konnectivity-client: an HTTP GET through the
//!    tunnel, 20 parallel connections, and a 64 MiB echo checked by SHA-256;
//! 5. restarts the server with `--mode=http-connect` (the agent reconnects
//!    by itself) and sends kube-apiserver's HTTP CONNECT request;
//! 6. shows a few metrics and shuts both down with SIGTERM.
//!
//! Exit code 0 only if every step worked. Logs of both binaries stay in
//! the work directory, which is printed (and removed unless `--keep`).

// A demo program: it times its own steps with the wall clock.
#![allow(clippy::disallowed_methods)]

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use konn_core::io::runtime::{Engine, IoEngine, block_on, join, resolve};
use konn_testkit::blocking::ReadRetry;
use konn_testkit::dest::Destination;
use konn_testkit::frontend::GrpcFrontend;
use konn_testkit::procs::{self, Proc};
use konn_testkit::{pki, sha256_hex};

const STEPS: usize = 6;
const BULK: usize = 64 << 20;
const PARALLEL: usize = 20;
const TIMEOUT: Duration = Duration::from_secs(20);

fn step(n: usize, text: &str) {
    println!("\n[{n}/{STEPS}] {text}");
}

struct Ports {
    agent: u16,
    health: u16,
    admin: u16,
    agent_health: u16,
    agent_admin: u16,
}

struct Demo {
    dir: PathBuf,
    certs: pki::PkiFiles,
    ports: Ports,
    socket: PathBuf,
}

impl Demo {
    fn server(&self, mode: &str) -> Result<Proc> {
        let c = &self.certs;
        let args = vec![
            format!("--mode={mode}"),
            format!("--uds-name={}", self.socket.display()),
            "--server-port=0".into(),
            "--delete-existing-uds-file=true".into(),
            format!("--cluster-cert={}", c.server_cert.display()),
            format!("--cluster-key={}", c.server_key.display()),
            format!("--cluster-ca-cert={}", c.ca_cert.display()),
            "--agent-bind-address=127.0.0.1".into(),
            format!("--agent-port={}", self.ports.agent),
            "--health-bind-address=127.0.0.1".into(),
            format!("--health-port={}", self.ports.health),
            "--admin-bind-address=127.0.0.1".into(),
            format!("--admin-port={}", self.ports.admin),
            "--server-count=1".into(),
            "--graceful-shutdown-timeout=5s".into(),
            "-v=2".into(),
        ];
        let log = self.dir.join(format!("proxy-server-{mode}.log"));
        Ok(Proc::spawn(&procs::binary("proxy-server")?, &args, &log)?)
    }

    fn agent(&self) -> Result<Proc> {
        let c = &self.certs;
        let args = vec![
            "--proxy-server-host=127.0.0.1".into(),
            format!("--proxy-server-port={}", self.ports.agent),
            format!("--ca-cert={}", c.ca_cert.display()),
            format!("--agent-cert={}", c.agent_cert.display()),
            format!("--agent-key={}", c.agent_key.display()),
            "--agent-id=demo-agent".into(),
            "--health-server-host=127.0.0.1".into(),
            format!("--health-server-port={}", self.ports.agent_health),
            "--admin-bind-address=127.0.0.1".into(),
            format!("--admin-server-port={}", self.ports.agent_admin),
            "--sync-interval=200ms".into(),
            "-v=2".into(),
        ];
        let log = self.dir.join("proxy-agent.log");
        Ok(Proc::spawn(&procs::binary("proxy-agent")?, &args, &log)?)
    }

    fn addr(port: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], port))
    }

    /// Wait until the server reports a connected agent (`/readyz` 200).
    fn wait_ready(&self, server: &mut Proc, agent: &mut Proc) -> Result<Duration> {
        let start = Instant::now();
        while start.elapsed() < TIMEOUT {
            if !server.is_running() {
                bail!("proxy-server exited:\n{}", server.log_tail(20));
            }
            if !agent.is_running() {
                bail!("proxy-agent exited:\n{}", agent.log_tail(20));
            }
            if matches!(
                procs::http_get(Self::addr(self.ports.health), "/readyz"),
                Ok((200, _))
            ) {
                return Ok(start.elapsed());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        bail!(
            "the agent did not connect within {TIMEOUT:?}\n--- server ---\n{}\n--- agent ---\n{}",
            server.log_tail(15),
            agent.log_tail(15)
        )
    }
}

fn grpc_traffic(socket: &Path, http: SocketAddr, echo: SocketAddr) -> Result<()> {
    let engine = resolve(IoEngine::Auto)
        .map(|r| r.engine())
        .unwrap_or(Engine::Epoll);
    println!("      (client runtime: {engine})");
    block_on(engine, async move {
        let fe = GrpcFrontend::connect_unix(socket).await?;

        // One HTTP request, as `kubectl logs` would make to a kubelet.
        let t = fe.dial(&http.to_string(), TIMEOUT).await?;
        println!(
            "      DIAL_REQ {http} → DIAL_RSP connectID={}",
            t.connect_id()
        );
        t.write(format!("GET /containerLogs/demo HTTP/1.1\r\nHost: {http}\r\n\r\n").as_bytes())
            .await?;
        let mut resp = Vec::new();
        while !resp.ends_with(b"\n") || !resp.windows(4).any(|w| w == b"\r\n\r\n") {
            match t.read(TIMEOUT).await? {
                Some(b) => resp.extend_from_slice(&b),
                None => break,
            }
        }
        let text = String::from_utf8_lossy(&resp);
        let status = text.lines().next().unwrap_or_default();
        let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b).trim();
        ensure!(status.contains("200"), "unexpected answer: {text}");
        println!("      GET /containerLogs/demo → {status}: \"{body}\"");
        t.close(TIMEOUT).await?;

        // Parallel connections over the same HTTP/2 connection.
        let start = Instant::now();
        let mut tunnels = Vec::new();
        for _ in 0..PARALLEL {
            tunnels.push(fe.dial(&echo.to_string(), TIMEOUT).await?);
        }
        let block: Vec<u8> = (0..1 << 20).map(|i: u32| (i % 251) as u8).collect();
        let mut tasks = Vec::new();
        for t in tunnels {
            let block = block.clone();
            tasks.push(monoio::spawn(async move {
                let (w, r) = (t.write(&block), t.read_exact(block.len(), TIMEOUT));
                let (w, r) = join(w, r).await;
                w?;
                let got = r?;
                t.close(TIMEOUT).await?;
                anyhow::Ok(got == block)
            }));
        }
        let mut ok = 0;
        for task in tasks {
            if task.await? {
                ok += 1;
            }
        }
        ensure!(
            ok == PARALLEL,
            "{ok}/{PARALLEL} connections echoed correctly"
        );
        println!(
            "      {PARALLEL} parallel connections × 1 MiB echoed intact in {:.0?}",
            start.elapsed()
        );

        // A bulk transfer both ways, checked end to end.
        let data: Vec<u8> = (0..BULK as u64)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        let sent_hash = sha256_hex(&data);
        let t = fe.dial(&echo.to_string(), TIMEOUT).await?;
        let start = Instant::now();
        let (w, r) = join(t.write(&data), t.read_exact(BULK, TIMEOUT)).await;
        w?;
        let back = r?;
        let secs = start.elapsed().as_secs_f64();
        let got_hash = sha256_hex(&back);
        if got_hash != sent_hash {
            let at = data.iter().zip(&back).position(|(a, b)| a != b);
            bail!(
                "SHA-256 mismatch after the echo: got {} of {} bytes, first difference at {at:?}",
                back.len(),
                data.len()
            );
        }
        println!(
            "      {} MiB sent and echoed back: SHA-256 {}… matches; {:.0} MiB/s each way",
            BULK >> 20,
            &sent_hash[..16],
            (BULK >> 20) as f64 / secs
        );
        t.close(TIMEOUT).await?;
        fe.close().await;
        anyhow::Ok(())
    })?
}

fn connect_traffic(socket: &Path, http: SocketAddr) -> Result<()> {
    let mut s = UnixStream::connect(socket).context("connecting to the CONNECT socket")?;
    s.set_read_timeout(Some(TIMEOUT))?;
    // kube-apiserver's HTTP CONNECT request.
    write!(s, "CONNECT {http} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = s.read_retry(&mut chunk)?;
        ensure!(n > 0, "closed before the CONNECT answer");
        buf.extend_from_slice(&chunk[..n]);
    }
    let head = String::from_utf8_lossy(&buf).into_owned();
    let status = head.lines().next().unwrap_or_default();
    ensure!(status.contains(" 200 "), "CONNECT refused: {head}");
    println!("      CONNECT {http} → {status}");
    write!(
        s,
        "GET /api/v1/pods HTTP/1.1\r\nHost: {http}\r\nConnection: close\r\n\r\n"
    )?;
    let mut resp = Vec::new();
    s.read_to_end(&mut resp)?;
    let text = String::from_utf8_lossy(&resp);
    let status = text.lines().next().unwrap_or_default();
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b).trim();
    ensure!(status.contains("200"), "unexpected answer: {text}");
    println!("      GET /api/v1/pods through the tunnel → {status}: \"{body}\"");
    Ok(())
}

fn show_metrics(port: u16, names: &[&str]) {
    let Ok((200, text)) = procs::http_get(Demo::addr(port), "/metrics") else {
        println!("      (metrics unavailable)");
        return;
    };
    for line in text.lines() {
        if !line.starts_with('#') && names.iter().any(|n| line.starts_with(n)) {
            println!("      {line}");
        }
    }
}

fn stop(name: &str, p: &mut Proc) -> Result<()> {
    p.terminate();
    let status = p
        .wait_timeout(Duration::from_secs(10))
        .with_context(|| format!("{name} did not exit within 10 s of SIGTERM"))?;
    println!("      {name}: SIGTERM → exited ({status})");
    Ok(())
}

fn main() -> Result<()> {
    let keep = std::env::args().any(|a| a == "--keep");
    let dir = std::env::temp_dir().join(format!("konn-demo-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    println!("konn demo: proxy-server + proxy-agent + destinations on this machine");
    println!("  work dir (certificates, socket, logs): {}", dir.display());
    let result = run(&dir);
    match &result {
        Ok(()) => println!("\ndemo finished: every step worked"),
        Err(e) => println!("\ndemo FAILED: {e:#}\n  logs are in {}", dir.display()),
    }
    if result.is_ok() && !keep {
        let _ = std::fs::remove_dir_all(&dir);
    }
    result
}

fn run(dir: &Path) -> Result<()> {
    step(1, "certificates");
    let certs = pki::write(dir)?;
    println!("      CA, server (localhost/127.0.0.1), agent client, frontend client → *.crt/*.key");

    step(2, "destinations (the \"node network\")");
    let http = Destination::http()?;
    let echo = Destination::echo()?;
    println!(
        "      HTTP server on {}, echo server on {}",
        http.addr(),
        echo.addr()
    );

    let demo = Demo {
        dir: dir.to_owned(),
        certs,
        ports: Ports {
            agent: konn_testkit::ports::free_port(),
            health: konn_testkit::ports::free_port(),
            admin: konn_testkit::ports::free_port(),
            agent_health: konn_testkit::ports::free_port(),
            agent_admin: konn_testkit::ports::free_port(),
        },
        socket: dir.join("konnectivity-server.socket"),
    };

    step(
        3,
        "proxy-server (--mode=grpc on a Unix socket) and proxy-agent (mTLS)",
    );
    let mut server = demo.server("grpc")?;
    let mut agent = demo.agent()?;
    let took = demo.wait_ready(&mut server, &mut agent)?;
    println!(
        "      proxy-server pid {}: frontend unix:{}, agent port 127.0.0.1:{}",
        server.pid(),
        demo.socket.display(),
        demo.ports.agent
    );
    println!(
        "      proxy-agent pid {}: tunnel up, server /readyz = 200 after {took:.0?}",
        agent.pid()
    );

    step(
        4,
        "traffic as kube-apiserver's konnectivity-client sends it (gRPC)",
    );
    grpc_traffic(&demo.socket, http.addr(), echo.addr())?;
    show_metrics(
        demo.ports.admin,
        &[
            "konnectivity_network_proxy_server_ready_backend_connections",
            "konnectivity_network_proxy_server_grpc_connections",
            "konnectivity_network_proxy_server_dial_duration_seconds_count",
        ],
    );

    step(
        5,
        "restart the server with --mode=http-connect; the agent reconnects",
    );
    stop("proxy-server", &mut server)?;
    let mut server = demo.server("http-connect")?;
    let took = demo.wait_ready(&mut server, &mut agent)?;
    println!(
        "      proxy-server pid {}: agent back after {took:.0?}",
        server.pid()
    );
    connect_traffic(&demo.socket, http.addr())?;
    show_metrics(
        demo.ports.agent_health,
        &[
            "konnectivity_network_proxy_agent_open_server_connections",
            "konnectivity_network_proxy_agent_dial_duration_seconds_count",
        ],
    );

    step(6, "shutdown");
    // As upstream: the agent's first signal only drains (DRAIN to every
    // server, no new dials), the second stops it.
    agent.terminate();
    std::thread::sleep(Duration::from_millis(300));
    ensure!(
        agent.is_running(),
        "proxy-agent exited on its first SIGTERM"
    );
    println!("      proxy-agent: SIGTERM → draining (tells the servers, keeps open connections)");
    stop("proxy-agent", &mut agent)?;
    stop("proxy-server", &mut server)?;
    println!(
        "      destinations served {} HTTP and {} echo connections",
        http.connections(),
        echo.connections()
    );
    Ok(())
}
