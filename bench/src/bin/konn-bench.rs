//! `konn-bench`: scenarios run against real proxy-server / proxy-agent
//! binaries (konn's, or upstream's for comparison), measured from outside.
//!
//! ```text
//! konn-bench idle [--connections N] [--impl NAME=DIR]...
//! ```
//!
//! - `idle` (S5 of the benchmark plan): opens N tunnelled connections the
//!   way kube-apiserver does (one gRPC frontend connection per dial over the
//!   Unix socket), sends one message on each, keeps them open and reports the
//!   resident-memory growth per idle connection of the server and the agent.
//!
//! `--impl NAME=DIR` runs the scenario for the binaries in DIR (both named
//! `proxy-server` and `proxy-agent`); the default is konn's binaries next to
//! this executable.

// A measuring tool: it reads the clock.
#![allow(clippy::disallowed_methods)]

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use konn_bench::dest::Destination;
use konn_bench::frontend::GrpcFrontend;
use konn_bench::harness::{Binaries, Mode, Topology, rss_kib};
use konn_bench::{pki, procs};
use konn_core::io::runtime::{Engine, IoEngine, block_on, resolve};

const TIMEOUT: Duration = Duration::from_secs(30);

struct Args {
    scenario: String,
    connections: usize,
    impls: Vec<Binaries>,
}

fn parse_args() -> Result<Args> {
    let mut it = std::env::args().skip(1);
    let scenario = it.next().unwrap_or_else(|| "idle".into());
    let mut connections = 1000;
    let mut impls = Vec::new();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--connections" => {
                connections = it.next().context("--connections needs a number")?.parse()?;
            }
            "--impl" => {
                let v = it.next().context("--impl needs NAME=DIR")?;
                let (name, dir) = v.split_once('=').context("--impl needs NAME=DIR")?;
                let dir = PathBuf::from(dir);
                impls.push(Binaries {
                    name: name.to_owned(),
                    server: dir.join("proxy-server"),
                    agent: dir.join("proxy-agent"),
                });
            }
            other => bail!("unknown argument {other:?}"),
        }
    }
    if impls.is_empty() {
        impls.push(Binaries {
            name: "konn".into(),
            server: procs::binary("proxy-server")?,
            agent: procs::binary("proxy-agent")?,
        });
    }
    Ok(Args {
        scenario,
        connections,
        impls,
    })
}

fn main() -> Result<()> {
    let args = parse_args()?;
    ensure!(
        args.scenario == "idle",
        "unknown scenario {:?}",
        args.scenario
    );
    let dir = std::env::temp_dir().join(format!("konn-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let certs = pki::write(&dir)?;
    let echo = Destination::echo()?;
    println!(
        "S5 idle connections: {} tunnelled connections, gRPC frontend over UDS",
        args.connections
    );
    println!(
        "| impl | server KiB/conn | agent KiB/conn | server RSS base→open→closed (MiB) | agent RSS base→open→closed (MiB) |"
    );
    println!("|---|---:|---:|---|---|");
    for bins in &args.impls {
        let topo = Topology::start(bins, Mode::Grpc, &dir, &certs, &[], &[])
            .with_context(|| format!("starting {}", bins.name))?;
        let r = idle(&topo, echo.addr().to_string(), args.connections)?;
        if !topo.stop(Duration::from_secs(10)) {
            eprintln!("  {}: a process did not stop on SIGTERM", bins.name);
        }
        let per = |a: u64, b: u64| (b.saturating_sub(a)) as f64 / args.connections as f64;
        println!(
            "| {} | {:.1} | {:.1} | {:.1} → {:.1} → {:.1} | {:.1} → {:.1} → {:.1} |",
            bins.name,
            per(r.server[0], r.server[1]),
            per(r.agent[0], r.agent[1]),
            r.server[0] as f64 / 1024.0,
            r.server[1] as f64 / 1024.0,
            r.server[2] as f64 / 1024.0,
            r.agent[0] as f64 / 1024.0,
            r.agent[1] as f64 / 1024.0,
            r.agent[2] as f64 / 1024.0,
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// RSS in KiB of (server, agent) at: baseline, N connections open, closed.
struct IdleResult {
    server: [u64; 3],
    agent: [u64; 3],
}

fn idle(topo: &Topology, dest: String, n: usize) -> Result<IdleResult> {
    let (sp, ap) = (topo.server.pid(), topo.agent.pid());
    let rss = || -> Result<(u64, u64)> {
        Ok((
            rss_kib(sp).context("server RSS")?,
            rss_kib(ap).context("agent RSS")?,
        ))
    };
    let engine = resolve(IoEngine::Auto).map_or(Engine::Epoll, |r| r.engine());
    let socket = topo.socket.clone();
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let client = std::thread::spawn(move || {
        block_on(engine, async move {
            // Warm-up: the first dials pay for one-time allocations.
            for _ in 0..20 {
                let fe = GrpcFrontend::connect_unix(&socket).await?;
                let t = fe.dial(&dest, TIMEOUT).await?;
                t.write(b"warm-up message!").await?;
                t.read_exact(16, TIMEOUT).await?;
                t.close(TIMEOUT).await?;
                fe.close().await;
            }
            tx.send(()).ok();
            go_rx.recv().ok();
            let mut open = Vec::with_capacity(n);
            for _ in 0..n {
                let fe = GrpcFrontend::connect_unix(&socket).await?;
                let t = fe.dial(&dest, TIMEOUT).await?;
                t.write(b"one idle message").await?;
                let back = t.read_exact(16, TIMEOUT).await?;
                anyhow::ensure!(back == b"one idle message", "echo mismatch");
                open.push((fe, t));
            }
            tx.send(()).ok();
            go_rx.recv().ok();
            for (fe, t) in open {
                t.close(TIMEOUT).await?;
                fe.close().await;
            }
            done_tx.send(()).ok();
            anyhow::Ok(())
        })
    });
    let wait = |rx: &std::sync::mpsc::Receiver<()>, what: &str| -> Result<()> {
        rx.recv_timeout(Duration::from_secs(600))
            .with_context(|| format!("client: {what}"))
    };
    wait(&rx, "warm-up")?;
    settle();
    let base = rss()?;
    go_tx.send(()).ok();
    let start = Instant::now();
    wait(&rx, "opening connections")?;
    let opened = start.elapsed();
    settle();
    let open = rss()?;
    go_tx.send(()).ok();
    wait(&done_rx, "closing connections")?;
    settle();
    let closed = rss()?;
    client
        .join()
        .map_err(|_| anyhow::anyhow!("client thread panicked"))???;
    eprintln!("  opened {n} connections in {opened:.1?}");
    Ok(IdleResult {
        server: [base.0, open.0, closed.0],
        agent: [base.1, open.1, closed.1],
    })
}

/// Let freed memory and pending work settle before reading RSS: longer
/// than konn's idle-buffer release (1 s).
fn settle() {
    std::thread::sleep(Duration::from_millis(2500));
}
