//! `konn-bench`: scenarios run against real proxy-server / proxy-agent
//! binaries (konn's, and upstream's for comparison), measured from outside.
//!
//! Usage: [`USAGE`] (`konn-bench --help` prints it).
//!
//! - `compare`: the side-by-side run of docs/BENCHMARKS.md: S1–S8 for the
//!   direct baseline, upstream (`--upstream`, default
//!   `target/interop/upstream`) and konn under each io engine
//!   (`--konn`, default: the binaries next to this executable),
//!   interleaved by repetition; writes `results.json`, `results.md` and an
//!   SVG per scenario to `--out` (default `docs/benchmarks`). `--also`
//!   adds another konn build (e.g. the one before a change) with one
//!   engine, interleaved with the rest; server flags after a third `:`
//!   (comma-separated) run the same build with a feature on, e.g.
//!   `--also konn-audit=target/release:epoll:--audit-log-path=/tmp/a.log`. With
//!   `--quick` it runs only S1, S3 and S4 for konn's default engine
//!   against upstream, writes nothing unless `--out` is given, and exits
//!   with 1 when konn's S1 throughput is below `--min-s1` (1.0) ×
//!   upstream's, its S3 p99 above `--max-s3` (2.0) × upstream's, or its S4
//!   dial rate below `--min-s4` (1.0) × upstream's in two runs in a row
//!   (the second runs only when the first failed a check).
//! - `icount`: instruction counts of the packet path under callgrind
//!   (download, upload, dial churn; `konn_bench::harness::icount`).
//!   `--check FILE` exits with 1 when a figure grew beyond the baseline's
//!   tolerance; `--write FILE` records a new baseline (`--tolerance`, in
//!   percent, default 4); `--engine` counts another engine (epoll by
//!   default; the baseline is epoll's). `--kernel ENGINES` instead counts system calls,
//!   context switches and io_uring completions per MB and per dial of
//!   each engine, natively (`perf stat` software events). `--guarded`
//!   counts with every issue-17 guard on (as `guards`). `--flags` passes
//!   konn flags to both processes (e.g. `--resume-window=0`, to count a
//!   feature off against its default). `--profile DIR` runs each of
//!   `--runs` (default all) once with per-line detail and keeps the
//!   callgrind files in DIR for `callgrind_annotate` (instructions by
//!   function).
//! - `idle` (S5 of the benchmark plan): opens N tunnelled connections the
//!   way kube-apiserver does (one gRPC frontend connection per dial over the
//!   Unix socket), sends one message on each, keeps them open and reports the
//!   resident-memory growth per idle connection of the server and the agent.
//!   `--frontend` picks kube-apiserver's egress transport instead: gRPC or
//!   HTTP CONNECT, over the Unix socket or TCP with mTLS (`grpc-uds`, the
//!   default, `grpc-tls`, `connect-uds`, `connect-tls`).
//!   `--impl NAME=DIR` runs the scenario for the binaries in DIR (both named
//!   `proxy-server` and `proxy-agent`), with flags for both after a `:`
//!   (comma-separated: `--impl konn-noresume=DIR:--resume-window=0`); the
//!   default is konn's binaries next to this executable. `--hold SECS`
//!   keeps the connections open that much longer after the memory reading,
//!   and prints `holding` on stderr first: the moment to take a heap
//!   snapshot of the processes (docs/BENCHMARKS.md, "Where an idle
//!   connection's memory goes").
//! - `reverse` (S11): KEP-2025's node-to-control-plane direction against the
//!   direct baseline and the forward direction on one konn topology
//!   (`konn_bench::harness::reverse`); prints a markdown table. `--quick`
//!   shortens the windows and runs one repetition.
//! - `multi` (S10, docs/BENCHMARKS.md): N clusters on one konn server
//!   (`--clusters-config`) against N upstream servers, one per cluster, one
//!   agent per cluster: agents' set-up time, RSS and CPU at idle and under
//!   an S3-like open loop ([`konn_bench::harness::multi`]). `--quick`: 10
//!   clusters and short windows; otherwise 10 and 100. Upstream is skipped
//!   when its binaries are missing. The agents reach their cluster by name
//!   (SNI), so the command re-runs itself under `unshare -Urm` with an
//!   `/etc/hosts` of its own that resolves those names to 127.0.0.1.
//! - `agents` (S9, docs/BENCHMARKS.md): N agent tunnels (default 5000) from
//!   a load generator in this process that speaks the agent's side with
//!   mTLS, on konn's server and then upstream's: time to connect them all,
//!   TLS handshakes/s, resident memory per tunnel, and a reconnect storm
//!   after a server restart ([`konn_bench::harness::agents`]).
//! - `soak`: konn's server and agent under S1, S3 and S4 in turn for N
//!   minutes (default 30), the agent and the server SIGKILLed and restarted
//!   in turn every `--restart-every` seconds (default 180); both processes'
//!   memory, descriptors and threads sampled every second
//!   ([`konn_bench::harness::soak`]). Prints a summary, writes `soak.svg`
//!   and `soak.md` to `--out` when given, and exits with 1 when a workload
//!   run failed or memory or descriptors grew over the run.
//! - `guards` (issue 17): S1 and S4 with the audit log, every admission
//!   limit (never reached), the overload manager, per-destination metrics
//!   and the agent's allow-list all on (`konn-guarded`) against all off
//!   (`konn-off`): the same binaries in one run, interleaved by repetition
//!   (`--reps`, default 5; one engine, `--engine`, default epoll). Prints
//!   the load average and a markdown table of medians and paired ratios
//!   ([`konn_bench::harness::guards`]), writes it to `--out` when given,
//!   and exits with 1 when a throughput's median ratio is below
//!   1 − `--tolerance` (percent, default 5).
//! - `floor`: S1's and S2's topology and pinning with two blocking relay
//!   processes (this binary, `floor-relay`) in place of the proxies, in
//!   calls of each of `--chunks` KiB (default 64,256): the kernel's cost of
//!   the hops alone, against which a proxy's kernel share can be read
//!   ([`konn_bench::harness::floor`]). `--gb` per run (2), `--reps` (3).

// A measuring tool: it reads the clock.
#![allow(clippy::disallowed_methods)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use konn_bench::harness::compare::{self, Config, Margins};
use konn_bench::harness::report::UPSTREAM;
use konn_bench::harness::{Binaries, Mode, Topology, rss_kib};
use konn_bench::harness::{agents, multi, soak};
use konn_core::io::runtime::{Engine, IoEngine, block_on, resolve};
use konn_core::io::tls::{ClientTls, ClientTlsOptions, PemSource};
use konn_testkit::connect::{ConnectTunnel, http1_tls};
use konn_testkit::dest::Destination;
use konn_testkit::frontend::{GrpcFrontend, Tunnel};
use konn_testkit::{pki, procs};

const TIMEOUT: Duration = Duration::from_secs(30);

/// The synopsis `--help` prints; the module docs say what each command does.
const USAGE: &str = "\
konn-bench compare [--quick] [--reps N] [--upstream DIR] [--konn DIR]
                   [--engines io-uring[:OPTS],epoll] [--idle N] [--only S1,S3,…]
                   [--out DIR] [--min-s1 RATIO] [--max-s3 RATIO] [--min-s4 RATIO] [--no-pin]
                   [--also NAME=DIR:ENGINE[:FLAG,FLAG…]]...
konn-bench idle [--connections N] [--hold SECS] [--frontend grpc-uds|grpc-tls|connect-uds|connect-tls]
                [--impl NAME=DIR[:FLAG,FLAG…]]...
konn-bench reverse [--quick] [--reps N] [--konn DIR] [--no-pin]
konn-bench icount [--konn DIR] [--check FILE] [--write FILE] [--tolerance PCT]
                  [--profile DIR [--runs idle,dials,…]] [--engine ENGINE[:OPTS]]
                  [--kernel io-uring[:OPTS],epoll] [--guarded] [--flags FLAG,FLAG…]
konn-bench multi [--quick] [--clusters 10,100] [--upstream DIR] [--konn DIR]
konn-bench agents [--agents N] [--threads N] [--upstream DIR] [--konn DIR]
konn-bench soak [--minutes N] [--restart-every SECS] [--konn DIR] [--out DIR]
konn-bench guards [--reps N] [--konn DIR] [--engine E] [--only S1,S4]
                  [--tolerance PCT] [--out FILE] [--no-pin]
konn-bench floor [--chunks KIB,KIB…] [--gb N] [--reps N] [--no-pin] [--out FILE]
";

fn main() -> Result<()> {
    // The load generator copies as much as the proxies do; its children
    // (konn's binaries, also under valgrind) inherit the tunable.
    konn_core::memcpy::use_vector_copies();
    let mut it = std::env::args().skip(1);
    match it.next().as_deref() {
        Some("compare") => compare_main(it),
        Some("reverse") => reverse_main(it),
        Some("icount") => icount_main(it),
        Some("idle") | None => idle_main(it),
        Some("multi") => multi_main(it),
        Some("agents") => agents_main(it),
        Some("soak") => soak_main(it),
        Some("guards") => guards_main(it),
        Some("floor") => floor_main(it),
        Some("floor-relay") => {
            let args: Vec<String> = it.collect();
            Ok(konn_bench::harness::floor::relay_main(&args)?)
        }
        Some("-h" | "--help" | "help") => {
            print!("{USAGE}");
            Ok(())
        }
        Some(other) => {
            bail!(
                "unknown subcommand {other:?} (agents, compare, floor, guards, icount, idle, multi, reverse, soak; --help for their flags)"
            )
        }
    }
}

/// A scratch directory, removed when dropped (see the `Drop`).
struct WorkDir(PathBuf);

impl WorkDir {
    fn new(what: &str) -> Result<Self> {
        let dir = std::env::temp_dir().join(format!("konn-bench-{what}-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        Ok(Self(dir))
    }
}

impl Drop for WorkDir {
    /// Removed, unless `KONN_BENCH_KEEP` is set (to read what a run left:
    /// icount's callgrind files, the guarded run's audit log, logs).
    fn drop(&mut self) {
        if std::env::var_os("KONN_BENCH_KEEP").is_some() {
            eprintln!("kept {}", self.0.display());
            return;
        }
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// konn's binaries in `dir` with one worker; `engine` is an `--io-engine`
/// value, optionally followed by `:OPTS` for a comparison: `+`-separated
/// ring setups (`KONN_IO_URING_SETUP`: `defer`, `coop`, `plain`), `monoio`
/// (`KONN_IO_URING_DATA=monoio`: data sockets on monoio's ring instead of
/// konn's data ring) and `NAME=VALUE` environment variables, e.g.
/// `io-uring:coop+monoio`.
fn konn_bins(name: &str, dir: &Path, engine: Option<&str>) -> Binaries {
    let mut b = Binaries::in_dir(name, dir);
    let mut flags = vec!["--workers=1".to_owned()];
    if let Some(e) = engine {
        let (e, opts) = e.split_once(':').map_or((e, None), |(e, s)| (e, Some(s)));
        flags.push(format!("--io-engine={e}"));
        for opt in opts.into_iter().flat_map(|o| o.split('+')) {
            let (k, v) = match opt.split_once('=') {
                Some((k, v)) => (k, v),
                None if opt == "monoio" => ("KONN_IO_URING_DATA", opt),
                None => ("KONN_IO_URING_SETUP", opt),
            };
            b.env.push((k.into(), v.into()));
        }
    }
    b.server_flags = flags.clone();
    b.agent_flags = flags;
    b
}

fn floor_main(mut it: impl Iterator<Item = String>) -> Result<()> {
    use konn_bench::harness::floor::{self, Direction};
    let (mut chunks, mut gb, mut reps, mut no_pin, mut out) =
        (vec![64usize, 256], 2.0f64, 3, false, None);
    while let Some(a) = it.next() {
        let mut val = |what: &str| it.next().with_context(|| format!("{a} needs {what}"));
        match a.as_str() {
            "--chunks" => {
                chunks = val("a list of KiB")?
                    .split(',')
                    .map(str::parse)
                    .collect::<Result<_, _>>()?
            }
            "--gb" => gb = val("a number")?.parse()?,
            "--reps" => reps = val("a number")?.parse()?,
            "--no-pin" => no_pin = true,
            "--out" => out = Some(PathBuf::from(val("a file")?)),
            other => bail!("unknown argument {other:?}"),
        }
    }
    ensure!(gb > 0.0 && reps > 0, "--gb and --reps must be positive");
    let pin = std::thread::available_parallelism().map_or(1, usize::from) >= 2 && !no_pin;
    if pin {
        procs::pin_current_thread(&[0]).context("pinning the source and the sink")?;
    }
    let exe = std::env::current_exe()?;
    let bytes = (gb * 1e9) as u64;
    // Repetitions outermost, so drift of the host hits every cell alike.
    let mut rows: Vec<(Direction, usize, Vec<_>)> = [Direction::Download, Direction::Upload]
        .into_iter()
        .flat_map(|d| chunks.iter().map(move |&kib| (d, kib * 1024, Vec::new())))
        .collect();
    ensure!(rows.iter().all(|r| r.1 > 0), "a chunk of 0 KiB");
    for _ in 0..reps {
        for (dir, chunk, runs) in &mut rows {
            let r = floor::run(&exe, *dir, *chunk, bytes, pin.then_some(1))
                .with_context(|| format!("{} in calls of {} KiB", dir.scenario(), *chunk / 1024))?;
            eprintln!(
                "{} {} KiB: {:.0} MB/s, {:.3} CPU-s/GB",
                dir.scenario(),
                *chunk / 1024,
                r.mb_per_s,
                r.total()
            );
            runs.push(r);
        }
    }
    let doc = format!(
        "konn-bench floor: two blocking relays in place of the proxies ({}), {gb} GB per run, medians of {reps}\n\n{}",
        if pin {
            "relays on CPU 1, source and sink on CPU 0"
        } else {
            "unpinned"
        },
        floor::table(&rows)
    );
    print!("{doc}");
    if let Some(out) = out {
        std::fs::write(&out, &doc).with_context(|| format!("writing {}", out.display()))?;
    }
    Ok(())
}

fn guards_main(mut it: impl Iterator<Item = String>) -> Result<()> {
    use konn_bench::harness::guards;
    let (mut reps, mut konn, mut engine, mut no_pin) = (5, None, "epoll".to_owned(), false);
    let mut only = vec!["S1".to_owned(), "S4".to_owned()];
    let (mut tolerance, mut out) = (5.0, None);
    while let Some(a) = it.next() {
        let mut val = |what: &str| it.next().with_context(|| format!("{a} needs {what}"));
        match a.as_str() {
            "--reps" => reps = val("a number")?.parse()?,
            "--konn" => konn = Some(PathBuf::from(val("a directory")?)),
            "--engine" => engine = val("an engine")?,
            "--only" => only = val("a list")?.split(',').map(str::to_owned).collect(),
            "--tolerance" => tolerance = val("a percentage")?.parse()?,
            "--out" => out = Some(PathBuf::from(val("a file")?)),
            "--no-pin" => no_pin = true,
            other => bail!("unknown argument {other:?}"),
        }
    }
    let konn_dir = match konn {
        Some(d) => d,
        None => procs::bin_dir().context("konn's binaries not found; pass --konn DIR")?,
    };
    let work = WorkDir::new("guards")?;
    let plain = konn_bins(guards::PLAIN, &konn_dir, Some(&engine));
    let guarded = guards::guarded(&plain, &work.0);
    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    let pin = (cpus >= 2 && !no_pin).then(|| (0, vec![1]));
    let cfg = Config {
        quick: false,
        reps,
        impls: vec![plain, guarded],
        idle_conns: 0,
        only,
        pin: pin.clone(),
    };
    procs::raise_nofile(65_536);
    if let Some((lg, _)) = &pin {
        procs::pin_current_thread(&[*lg]).context("pinning the load generator")?;
    }
    let certs = pki::write(&work.0)?;
    let load_before = guards::load_average();
    let started = Instant::now();
    eprintln!(
        "konn-bench guards: {} with every guard on vs off, {reps} repetitions, {engine}, load average {load_before}",
        cfg.only.join(",")
    );
    let cells = block_on(Engine::Epoll, compare::run(&cfg, &work.0, &certs))??;
    let (table, ok) = guards::report(&cells, tolerance / 100.0);
    let doc = format!(
        "konn-bench guards at {} ({}), {reps} repetitions, {engine}, {:.0?}; load average {load_before} before, {} after;          throughput criterion: guarded/off ≥ {:.2}\n\n{table}",
        git_head(),
        cpu_model(),
        started.elapsed(),
        guards::load_average(),
        1.0 - tolerance / 100.0,
    );
    println!("{doc}");
    if let Some(path) = out {
        std::fs::write(&path, &doc).with_context(|| format!("writing {}", path.display()))?;
    }
    ensure!(ok, "a throughput of the guarded run is below the criterion");
    Ok(())
}

fn reverse_main(mut it: impl Iterator<Item = String>) -> Result<()> {
    let (mut quick, mut reps, mut konn, mut no_pin) = (false, None, None, false);
    while let Some(a) = it.next() {
        let mut val = |what: &str| it.next().with_context(|| format!("{a} needs {what}"));
        match a.as_str() {
            "--quick" => quick = true,
            "--no-pin" => no_pin = true,
            "--reps" => reps = Some(val("a number")?.parse()?),
            "--konn" => konn = Some(PathBuf::from(val("a directory")?)),
            other => bail!("unknown argument {other:?}"),
        }
    }
    let konn_dir = match konn {
        Some(d) => d,
        None => procs::bin_dir().context("konn's binaries not found; pass --konn DIR")?,
    };
    let bins = konn_bins("konn", &konn_dir, None);
    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    let pin = cpus >= 2 && !no_pin;
    procs::raise_nofile(65_536);
    if pin {
        procs::pin_current_thread(&[0]).context("pinning the load generator")?;
    }
    let work = WorkDir::new("reverse")?;
    let certs = pki::write(&work.0)?;
    let window = if quick {
        konn_bench::harness::scenarios::Window {
            warm: Duration::from_millis(300),
            secs: Duration::from_millis(1500),
        }
    } else {
        konn_bench::harness::scenarios::Window {
            warm: Duration::from_millis(500),
            secs: Duration::from_secs(3),
        }
    };
    let reps = reps.unwrap_or(if quick { 1 } else { 3 });
    eprintln!(
        "konn-bench reverse: {reps} repetition(s), {}",
        if pin {
            "load generator on CPU 0, proxies on CPU 1 (one worker each)"
        } else {
            "unpinned"
        }
    );
    let results = block_on(
        Engine::Epoll,
        konn_bench::harness::reverse::run(
            &bins,
            &work.0,
            &certs,
            reps,
            window,
            pin.then_some(&[1usize][..]),
        ),
    )??;
    println!("{}", results.markdown());
    Ok(())
}

fn compare_main(mut it: impl Iterator<Item = String>) -> Result<()> {
    let mut quick = false;
    let mut reps = None;
    let mut upstream = PathBuf::from("target/interop/upstream");
    let mut konn = None;
    let mut engines = vec!["io-uring".to_owned(), "epoll".to_owned()];
    let mut idle = 1000;
    let mut out = None;
    let mut only = Vec::new();
    let mut no_pin = false;
    let mut extra = Vec::new();
    let mut margins = Margins {
        min_s1: 1.0,
        max_s3: 2.0,
        min_s4: 1.0,
    };
    while let Some(a) = it.next() {
        let mut val = |what: &str| it.next().with_context(|| format!("{a} needs {what}"));
        match a.as_str() {
            "--quick" => quick = true,
            "--no-pin" => no_pin = true,
            "--reps" => reps = Some(val("a number")?.parse()?),
            "--upstream" => upstream = val("a directory")?.into(),
            "--konn" => konn = Some(PathBuf::from(val("a directory")?)),
            "--engines" => engines = val("a list")?.split(',').map(str::to_owned).collect(),
            "--idle" => idle = val("a number")?.parse()?,
            "--only" => only = val("a list")?.split(',').map(str::to_owned).collect(),
            "--out" => out = Some(PathBuf::from(val("a directory")?)),
            "--min-s1" => margins.min_s1 = val("a ratio")?.parse()?,
            "--max-s3" => margins.max_s3 = val("a ratio")?.parse()?,
            "--min-s4" => margins.min_s4 = val("a ratio")?.parse()?,
            "--also" => {
                let v = val("NAME=DIR:ENGINE[:FLAGS]")?;
                let (name, rest) = v.split_once('=').context("--also needs NAME=DIR:ENGINE")?;
                let mut parts = rest.splitn(3, ':');
                let (Some(dir), Some(engine)) = (parts.next(), parts.next()) else {
                    bail!("--also needs NAME=DIR:ENGINE");
                };
                let mut b = konn_bins(name, Path::new(dir), Some(engine));
                // Extra server flags, comma-separated (e.g. the audit log).
                if let Some(flags) = parts.next() {
                    b.server_flags.extend(
                        flags
                            .split(',')
                            .filter(|f| !f.is_empty())
                            .map(str::to_owned),
                    );
                }
                extra.push(b);
            }
            other => bail!("unknown argument {other:?}"),
        }
    }
    let konn_dir = match konn {
        Some(d) => d,
        None => procs::bin_dir().context("konn's binaries not found; pass --konn DIR")?,
    };
    for (what, dir) in [("upstream", &upstream), ("konn", &konn_dir)] {
        for b in ["proxy-server", "proxy-agent"] {
            ensure!(
                dir.join(b).is_file(),
                "{what} {b} missing in {} (upstream: scripts/test builds it into target/interop/upstream)",
                dir.display()
            );
        }
    }
    let mut up = Binaries::in_dir(UPSTREAM, &upstream);
    up.env = vec![("GOMAXPROCS".into(), "1".into())];
    let mut impls = vec![up];
    if quick {
        // The shipped default engine.
        impls.push(konn_bins("konn", &konn_dir, None));
    } else {
        for e in &engines {
            impls.push(konn_bins(&format!("konn-{e}"), &konn_dir, Some(e)));
        }
    }
    impls.extend(extra);
    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    let pin = (cpus >= 2 && !no_pin).then(|| (0, vec![1]));
    let cfg = Config {
        quick,
        reps: reps.unwrap_or(3),
        impls,
        idle_conns: idle,
        only,
        pin: pin.clone(),
    };
    procs::raise_nofile(65_536);
    if let Some((lg, _)) = &pin {
        procs::pin_current_thread(&[*lg]).context("pinning the load generator")?;
    }
    let work = WorkDir::new("compare")?;
    let certs = pki::write(&work.0)?;
    let head = git_head();
    let started = Instant::now();
    eprintln!(
        "konn-bench compare{}: {} repetitions, load generator on CPU 0, proxies on CPU 1 ({cpus} CPUs)",
        if quick { " --quick" } else { "" },
        cfg.reps
    );
    let mut cells = block_on(Engine::Epoll, compare::run(&cfg, &work.0, &certs))??;
    if quick {
        // A noisy moment of a shared host can push one run's medians past
        // a margin (S3's p99 once reached 1.91 of 2.0 in CI while the run
        // before and after gave ~0.5); a regression fails both runs.
        let (lines, ok) = compare::quick_verdict(&cells, "konn", margins);
        if !ok {
            for l in &lines {
                println!("{l}");
            }
            eprintln!("konn-bench compare --quick: a check failed; running the check once more");
            cells = block_on(Engine::Epoll, compare::run(&cfg, &work.0, &certs))??;
        }
    }
    let took = started.elapsed();
    eprintln!("done in {took:.0?}");
    let meta = serde_json::json!({
        "command": std::env::args().collect::<Vec<_>>().join(" "),
        "quick": quick,
        "repetitions": cfg.reps,
        "seconds": took.as_secs(),
        "konn_commit": head,
        "upstream": "apiserver-network-proxy v0.36.0 (interop/go.mod)",
        "kernel": std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim(),
        "cpu": cpu_model(),
        "cpus": cpus,
        "pinning": "load generator + destinations: CPU 0 (one thread, epoll); server and agent: CPU 1, one worker each (konn --workers=1, Go GOMAXPROCS=1)",
        "implementations": cfg.impls.iter().map(|b| serde_json::json!({
            "name": b.name,
            "server": b.server.display().to_string(),
            "server_flags": b.server_flags,
            "agent_flags": b.agent_flags,
            "env": b.env.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
    });
    let out = out.or_else(|| (!quick).then(|| PathBuf::from("docs/benchmarks")));
    if let Some(dir) = out {
        for p in compare::write_outputs(&dir, &cells, meta)? {
            eprintln!("wrote {}", p.display());
        }
    }
    println!("{}", konn_bench::harness::report::markdown(&cells));
    if quick {
        let (lines, ok) = compare::quick_verdict(&cells, "konn", margins);
        for l in &lines {
            println!("{l}");
        }
        if !ok {
            eprintln!("konn-bench compare --quick: regression against upstream (see above)");
            std::process::exit(1);
        }
    }
    Ok(())
}

fn icount_main(mut it: impl Iterator<Item = String>) -> Result<()> {
    use konn_bench::harness::icount::{self, Baseline};
    let mut konn = None;
    let mut check = None;
    let mut write = None;
    let mut tolerance = 4.0;
    let mut kernel = Vec::new();
    let mut guarded = false;
    let mut profile = None;
    let mut runs = icount::Run::ALL.to_vec();
    let mut flags: Vec<String> = Vec::new();
    let mut engine = "epoll".to_owned();
    while let Some(a) = it.next() {
        let mut val = |what: &str| it.next().with_context(|| format!("{a} needs {what}"));
        match a.as_str() {
            "--konn" => konn = Some(PathBuf::from(val("a directory")?)),
            "--guarded" => guarded = true,
            "--kernel" => {
                kernel = val("a list of engines")?
                    .split(',')
                    .map(str::to_owned)
                    .collect()
            }
            "--engine" => engine = val("an engine")?,
            "--check" => check = Some(PathBuf::from(val("a file")?)),
            "--write" => write = Some(PathBuf::from(val("a file")?)),
            "--tolerance" => tolerance = val("a percentage")?.parse()?,
            "--profile" => profile = Some(PathBuf::from(val("a directory")?)),
            "--runs" => {
                runs = val("a list of runs")?
                    .split(',')
                    .map(|r| {
                        icount::Run::ALL
                            .into_iter()
                            .find(|x| x.name() == r)
                            .with_context(|| {
                                format!(
                                    "unknown run {r:?} (idle, download, upload, dials, messages, messages-1k)"
                                )
                            })
                    })
                    .collect::<Result<_>>()?
            }
            "--flags" => {
                flags = val("a list of flags")?
                    .split(',')
                    .map(str::to_owned)
                    .collect()
            }
            other => bail!("unknown argument {other:?}"),
        }
    }
    let konn_dir = match konn {
        Some(d) => d,
        None => procs::bin_dir().context("konn's binaries not found; pass --konn DIR")?,
    };
    let work = WorkDir::new("icount")?;
    let certs = pki::write(&work.0)?;
    if !kernel.is_empty() {
        // System calls, context switches, io_uring completions per unit,
        // natively, for each engine (`--kernel io-uring,epoll`).
        for e in &kernel {
            let mut bins = konn_bins(&format!("konn-{e}"), &konn_dir, Some(e));
            bins.server_flags.extend(flags.iter().cloned());
            bins.agent_flags.extend(flags.iter().cloned());
            let figures = block_on(
                Engine::Epoll,
                icount::measure_kernel(&bins, &work.0, &certs),
            )??;
            for (k, v) in &figures {
                println!("{e:<16} {k:<44} {v:>12.3}");
            }
        }
        return Ok(());
    }
    ensure!(
        std::process::Command::new("valgrind")
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success()),
        "valgrind is not installed (apt-get install valgrind)"
    );
    ensure!(
        engine == "epoll" || (check.is_none() && write.is_none()),
        "the baseline is recorded and checked under epoll only"
    );
    let mut bins = konn_bins("konn", &konn_dir, Some(&engine));
    bins.server_flags.extend(flags.iter().cloned());
    bins.agent_flags.extend(flags.iter().cloned());
    if guarded {
        // Issue 17's audit log, limits and allow-list all on.
        bins = konn_bench::harness::guards::guarded(&bins, &work.0);
    }
    if let Some(out) = profile {
        // One run each, with per-line detail, the files kept for
        // `callgrind_annotate <run>-server.cg`.
        std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
        let totals = block_on(Engine::Epoll, icount::profile(&bins, &out, &certs, &runs))??;
        for (run, s, a) in totals {
            println!("{:<9} server {s:>14} Ir   agent {a:>14} Ir", run.name());
        }
        println!("callgrind files in {}", out.display());
        return Ok(());
    }
    let started = Instant::now();
    eprintln!(
        "konn-bench icount: {} ({engine}) under callgrind",
        konn_dir.display()
    );
    let figures = block_on(Engine::Epoll, icount::measure(&bins, &work.0, &certs))??;
    eprintln!("done in {:.0?}", started.elapsed());
    for (k, v) in &figures {
        println!("{k:<28} {v:>14.0}");
    }
    if let Some(path) = write {
        let note = format!(
            "konn-bench icount at {} (epoll, one worker, release build); kernel {}",
            git_head(),
            std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .unwrap_or_default()
                .trim()
        );
        Baseline {
            tolerance: tolerance / 100.0,
            figures: figures.clone(),
        }
        .write(&path, &note)?;
        eprintln!("wrote {}", path.display());
    }
    if let Some(path) = check {
        let base = Baseline::read(&path)?;
        let (lines, ok) = base.check(&figures);
        for l in &lines {
            println!("{l}");
        }
        if !ok {
            eprintln!(
                "konn-bench icount: instruction counts grew beyond {:.1} % of {} (see above)",
                base.tolerance * 100.0,
                path.display()
            );
            std::process::exit(1);
        }
    }
    Ok(())
}

fn agents_main(mut it: impl Iterator<Item = String>) -> Result<()> {
    let (mut agents, mut threads) = (5000usize, 2usize);
    let mut upstream = PathBuf::from("target/interop/upstream");
    let mut konn = None;
    while let Some(a) = it.next() {
        let mut val = |what: &str| it.next().with_context(|| format!("{a} needs {what}"));
        match a.as_str() {
            "--agents" => agents = val("a number")?.parse()?,
            "--threads" => threads = val("a number")?.parse()?,
            "--upstream" => upstream = val("a directory")?.into(),
            "--konn" => konn = Some(PathBuf::from(val("a directory")?)),
            other => bail!("unknown argument {other:?}"),
        }
    }
    ensure!(
        (1..=9000).contains(&agents),
        "--agents: 1 to 9000 (two sockets each within 20000 descriptors)"
    );
    ensure!((1..=16).contains(&threads), "--threads: 1 to 16");
    let konn_dir = match konn {
        Some(d) => d,
        None => procs::bin_dir().context("konn's binaries not found; pass --konn DIR")?,
    };
    let upstream = upstream
        .join("proxy-server")
        .is_file()
        .then(|| Binaries::in_dir(UPSTREAM, &upstream));
    if upstream.is_none() {
        eprintln!("upstream's proxy-server missing (scripts/test builds it): konn only");
    }
    let cfg = agents::Config {
        agents,
        threads,
        konn: Binaries::in_dir("konn", &konn_dir),
        upstream,
    };
    procs::raise_nofile(65_536);
    let work = WorkDir::new("agents")?;
    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    eprintln!(
        "konn-bench agents: {agents} agent tunnels (mTLS) from {threads} generator threads, {cpus} CPUs, \
         servers with their defaults"
    );
    let rows = agents::run(&cfg, &work.0, |r| {
        eprintln!(
            "  {}: connected in {:.2?}, {:.1} KiB per tunnel, storm {:.2?}",
            r.name,
            r.connect,
            r.kib_per_tunnel(),
            r.storm
        );
    })?;
    println!("{}", agents::markdown(&rows));
    Ok(())
}

fn soak_main(mut it: impl Iterator<Item = String>) -> Result<()> {
    let (mut minutes, mut restart_every) = (30.0f64, 180.0f64);
    let (mut konn, mut out) = (None, None);
    while let Some(a) = it.next() {
        let mut val = |what: &str| it.next().with_context(|| format!("{a} needs {what}"));
        match a.as_str() {
            "--minutes" => minutes = val("a number")?.parse()?,
            "--restart-every" => restart_every = val("seconds")?.parse()?,
            "--konn" => konn = Some(PathBuf::from(val("a directory")?)),
            "--out" => out = Some(PathBuf::from(val("a directory")?)),
            other => bail!("unknown argument {other:?}"),
        }
    }
    ensure!(
        minutes > 0.0 && minutes <= 24.0 * 60.0,
        "--minutes: above 0, at most a day"
    );
    ensure!(
        restart_every >= 10.0,
        "--restart-every: at least 10 seconds"
    );
    let konn_dir = match konn {
        Some(d) => d,
        None => procs::bin_dir().context("konn's binaries not found; pass --konn DIR")?,
    };
    let cfg = soak::Config {
        duration: Duration::from_secs_f64(minutes * 60.0),
        restart_every: Duration::from_secs_f64(restart_every),
        konn: konn_bins("konn", &konn_dir, None),
    };
    let work = WorkDir::new("soak")?;
    let certs = pki::write(&work.0.join("pki"))?;
    eprintln!(
        "konn-bench soak: {minutes} min of S1/S3/S4 in turn, agent and server restarted in turn every {restart_every} s"
    );
    let report = soak::run(&cfg, &work.0, &certs)?;
    let md = soak::markdown(&report);
    println!("{md}");
    if let Some(dir) = out {
        std::fs::create_dir_all(&dir)?;
        std::fs::write(dir.join("soak.svg"), soak::svg(&report))?;
        std::fs::write(dir.join("soak.md"), &md)?;
        eprintln!("wrote {}/soak.svg and soak.md", dir.display());
    }
    match soak::verdict(&report) {
        Ok(()) => {
            eprintln!("soak held: every workload run succeeded; memory and descriptors flat");
            Ok(())
        }
        Err(e) => {
            eprintln!("soak failed: {e}");
            std::process::exit(1);
        }
    }
}

/// Set in the re-run of `multi` inside its mount namespace.
const MULTI_NS_ENV: &str = "KONN_BENCH_MULTI_NS";

fn multi_main(it: impl Iterator<Item = String>) -> Result<()> {
    let args: Vec<String> = it.collect();
    let mut quick = false;
    let mut clusters = None;
    let mut upstream = PathBuf::from("target/interop/upstream");
    let mut konn = None;
    let mut a = args.iter();
    while let Some(arg) = a.next() {
        let mut val = |what: &str| a.next().with_context(|| format!("{arg} needs {what}"));
        match arg.as_str() {
            "--quick" => quick = true,
            "--clusters" => {
                let list = val("a list")?
                    .split(',')
                    .map(str::parse)
                    .collect::<Result<Vec<usize>, _>>()?;
                ensure!(
                    list.iter().all(|n| (1..=1000).contains(n)),
                    "--clusters: 1 to 1000 each"
                );
                clusters = Some(list);
            }
            "--upstream" => upstream = val("a directory")?.into(),
            "--konn" => konn = Some(PathBuf::from(val("a directory")?)),
            other => bail!("unknown argument {other:?}"),
        }
    }
    let clusters = clusters.unwrap_or_else(|| if quick { vec![10] } else { vec![10, 100] });
    if std::env::var_os(MULTI_NS_ENV).is_none() {
        return multi_in_namespace(&args, clusters.iter().copied().max().unwrap_or(0));
    }
    let konn_dir = match konn {
        Some(d) => d,
        None => procs::bin_dir().context("konn's binaries not found; pass --konn DIR")?,
    };
    let has = |dir: &Path| {
        ["proxy-server", "proxy-agent"]
            .iter()
            .all(|b| dir.join(b).is_file())
    };
    ensure!(
        has(&konn_dir),
        "konn's binaries missing in {}",
        konn_dir.display()
    );
    let upstream = if has(&upstream) {
        Some(Binaries::in_dir(UPSTREAM, &upstream))
    } else {
        eprintln!(
            "upstream binaries missing in {} (scripts/test builds them): konn only",
            upstream.display()
        );
        None
    };
    let (idle, warm, window) = if quick { (3, 1, 3) } else { (5, 1, 5) };
    let cfg = multi::Config {
        clusters,
        konn: Binaries::in_dir("konn", &konn_dir),
        upstream,
        idle: Duration::from_secs(idle),
        warm: Duration::from_secs(warm),
        window: Duration::from_secs(window),
        rate: 1000.0,
        size: 64,
    };
    procs::raise_nofile(65_536);
    let work = WorkDir::new("multi")?;
    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    eprintln!(
        "konn-bench multi{}: clusters {:?}, {cpus} CPUs, no pinning, defaults for workers/GOMAXPROCS; \
         load {} msg/s × {} B over one connection per cluster",
        if quick { " --quick" } else { "" },
        cfg.clusters,
        cfg.rate,
        cfg.size
    );
    let started = Instant::now();
    let rows = multi::run(&cfg, &work.0, |r| {
        eprintln!(
            "  {} clusters, {}: agents ready in {:.2?}",
            r.clusters, r.name, r.setup
        );
    })?;
    eprintln!("done in {:.0?}", started.elapsed());
    println!("{}", multi::markdown(&rows));
    Ok(())
}

/// Re-run `konn-bench multi <args>` under `unshare -Urm` with an
/// `/etc/hosts` that resolves the clusters' names.
fn multi_in_namespace(args: &[String], clusters: usize) -> Result<()> {
    let work = WorkDir::new("multi-hosts")?;
    let hosts = work.0.join("hosts");
    std::fs::write(&hosts, multi::hosts_file(clusters))?;
    let exe = std::env::current_exe()?;
    let status = std::process::Command::new("unshare")
        .args(["-Urm", "--fork", "--kill-child", "sh", "-c"])
        .arg("mount --bind \"$1\" /etc/hosts && shift && exec \"$@\"")
        .arg("sh")
        .arg(&hosts)
        .arg(&exe)
        .arg("multi")
        .args(args)
        .env(MULTI_NS_ENV, "1")
        .status()
        .context("running unshare (util-linux) for a private /etc/hosts")?;
    ensure!(status.success(), "konn-bench multi failed ({status})");
    Ok(())
}

/// The commit of the working directory, if it is a git checkout.
fn git_head() -> String {
    std::process::Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default()
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|v| v.trim_start_matches([' ', '\t', ':']).to_owned())
        .unwrap_or_default()
}

/// kube-apiserver's egress transport in `konn-bench idle`.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Frontend {
    GrpcUds,
    GrpcTls,
    ConnectUds,
    ConnectTls,
}

impl Frontend {
    fn parse(s: &str) -> Result<Self> {
        Ok(match s {
            "grpc-uds" => Self::GrpcUds,
            "grpc-tls" => Self::GrpcTls,
            "connect-uds" => Self::ConnectUds,
            "connect-tls" => Self::ConnectTls,
            other => {
                bail!("--frontend {other:?}: one of grpc-uds, grpc-tls, connect-uds, connect-tls")
            }
        })
    }

    fn describe(self) -> &'static str {
        match self {
            Self::GrpcUds => "gRPC frontend over UDS",
            Self::GrpcTls => "gRPC frontend over TCP with mTLS",
            Self::ConnectUds => "HTTP CONNECT frontend over UDS",
            Self::ConnectTls => "HTTP CONNECT frontend over TCP with mTLS",
        }
    }

    fn mode(self) -> Mode {
        match self {
            Self::GrpcUds | Self::GrpcTls => Mode::Grpc,
            Self::ConnectUds | Self::ConnectTls => Mode::HttpConnect,
        }
    }

    fn tls(self) -> bool {
        matches!(self, Self::GrpcTls | Self::ConnectTls)
    }
}

/// Where and how the idle client reaches the frontend.
#[derive(Clone)]
struct FrontendAddr {
    kind: Frontend,
    socket: PathBuf,
    /// TCP address and client TLS (kube-apiserver's certificate).
    tcp: Option<(String, ClientTls)>,
}

/// One open idle connection of any frontend transport.
enum IdleConn {
    Grpc(GrpcFrontend, Tunnel),
    Connect(ConnectTunnel),
}

impl FrontendAddr {
    /// Dial `dest`, echo one 16-byte message and keep the connection.
    async fn open(&self, dest: &str, msg: &[u8; 16]) -> Result<IdleConn> {
        let tcp = || self.tcp.as_ref().context("no TCP frontend");
        let grpc = |fe: GrpcFrontend| async move {
            let t = fe.dial(dest, TIMEOUT).await?;
            anyhow::Ok(IdleConn::Grpc(fe, t))
        };
        let mut conn = match self.kind {
            Frontend::GrpcUds => grpc(GrpcFrontend::connect_unix(&self.socket).await?).await?,
            Frontend::GrpcTls => {
                let (addr, tls) = tcp()?;
                grpc(GrpcFrontend::connect_tls(addr, tls).await?).await?
            }
            Frontend::ConnectUds => {
                IdleConn::Connect(ConnectTunnel::unix(&self.socket, dest, TIMEOUT).await?)
            }
            Frontend::ConnectTls => {
                let (addr, tls) = tcp()?;
                IdleConn::Connect(ConnectTunnel::tls(addr, tls, dest, TIMEOUT).await?)
            }
        };
        let back = match &mut conn {
            IdleConn::Grpc(_, t) => {
                t.write(msg).await?;
                t.read_exact(msg.len(), TIMEOUT).await?
            }
            IdleConn::Connect(t) => {
                t.write(msg).await?;
                t.read_exact(msg.len(), TIMEOUT).await?
            }
        };
        ensure!(back == msg, "echo mismatch");
        Ok(conn)
    }
}

impl IdleConn {
    async fn close(self) -> Result<()> {
        match self {
            Self::Grpc(fe, t) => {
                t.close(TIMEOUT).await?;
                fe.close().await;
            }
            Self::Connect(t) => t.close().await,
        }
        Ok(())
    }
}

fn idle_main(mut it: impl Iterator<Item = String>) -> Result<()> {
    let mut connections = 1000;
    let mut hold = Duration::ZERO;
    let mut frontend = Frontend::GrpcUds;
    let mut impls = Vec::new();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--frontend" => {
                frontend = Frontend::parse(&it.next().context("--frontend needs a transport")?)?;
            }
            "--connections" => {
                connections = it.next().context("--connections needs a number")?.parse()?;
            }
            "--hold" => {
                let secs: f64 = it.next().context("--hold needs seconds")?.parse()?;
                hold = Duration::try_from_secs_f64(secs).context("--hold: bad duration")?;
            }
            "--impl" => {
                let v = it.next().context("--impl needs NAME=DIR")?;
                let (name, dir) = v.split_once('=').context("--impl needs NAME=DIR")?;
                let (dir, flags) = dir.split_once(':').unwrap_or((dir, ""));
                let mut b = Binaries::in_dir(name, Path::new(dir));
                for f in flags.split(',').filter(|f| !f.is_empty()) {
                    b.server_flags.push(f.to_owned());
                    b.agent_flags.push(f.to_owned());
                }
                impls.push(b);
            }
            other => bail!("unknown argument {other:?}"),
        }
    }
    if impls.is_empty() {
        let dir = procs::bin_dir().context("konn's binaries not found")?;
        impls.push(Binaries::in_dir("konn", &dir));
    }
    let work = WorkDir::new("idle")?;
    let dir = &work.0;
    let certs = pki::write(dir)?;
    let echo = Destination::echo()?;
    let tcp = if frontend.tls() {
        let port = konn_testkit::ports::free_port();
        let flags = [
            "--uds-name=".to_owned(),
            "--server-bind-address=127.0.0.1".to_owned(),
            format!("--server-port={port}"),
            format!("--server-cert={}", certs.server_cert.display()),
            format!("--server-key={}", certs.server_key.display()),
            format!("--server-ca-cert={}", certs.ca_cert.display()),
        ];
        for b in &mut impls {
            b.server_flags.extend(flags.iter().cloned());
        }
        let mut o = ClientTlsOptions::new(PemSource::File(certs.ca_cert.clone()), "127.0.0.1");
        o.identity = Some((
            PemSource::File(certs.frontend_cert.clone()),
            PemSource::File(certs.frontend_key.clone()),
        ));
        let tls = o.build()?;
        let tls = if frontend == Frontend::ConnectTls {
            http1_tls(&tls)
        } else {
            tls
        };
        Some((format!("127.0.0.1:{port}"), tls))
    } else {
        None
    };
    println!(
        "S5 idle connections: {connections} tunnelled connections, {}",
        frontend.describe()
    );
    println!(
        "| impl | server KiB/conn | agent KiB/conn | server RSS base→open→closed (MiB) | agent RSS base→open→closed (MiB) |"
    );
    println!("|---|---:|---:|---|---|");
    for bins in &impls {
        let topo = Topology::start(bins, frontend.mode(), dir, &certs, None)
            .with_context(|| format!("starting {}", bins.name))?;
        let fe = FrontendAddr {
            kind: frontend,
            socket: topo.socket.clone(),
            tcp: tcp.clone(),
        };
        let r = idle(&topo, &fe, echo.addr().to_string(), connections, hold)?;
        if !topo.stop(Duration::from_secs(10)) {
            eprintln!("  {}: a process did not stop on SIGTERM", bins.name);
        }
        let per = |a: u64, b: u64| (b.saturating_sub(a)) as f64 / connections as f64;
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
    Ok(())
}

/// RSS in KiB of (server, agent) at: baseline, N connections open, closed.
struct IdleResult {
    server: [u64; 3],
    agent: [u64; 3],
}

fn idle(
    topo: &Topology,
    fe: &FrontendAddr,
    dest: String,
    n: usize,
    hold: Duration,
) -> Result<IdleResult> {
    let (sp, ap) = (topo.server.pid(), topo.agent.pid());
    let rss = || -> Result<(u64, u64)> {
        Ok((
            rss_kib(sp).context("server RSS")?,
            rss_kib(ap).context("agent RSS")?,
        ))
    };
    let engine = resolve(IoEngine::Auto).map_or(Engine::Epoll, |r| r.engine());
    let fe = fe.clone();
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let client = std::thread::spawn(move || {
        block_on(engine, async move {
            // Warm-up: the first dials pay for one-time allocations.
            for _ in 0..20 {
                fe.open(&dest, b"warm-up message!").await?.close().await?;
            }
            tx.send(()).ok();
            go_rx.recv().ok();
            let mut open = Vec::with_capacity(n);
            for _ in 0..n {
                open.push(fe.open(&dest, b"one idle message").await?);
            }
            tx.send(()).ok();
            go_rx.recv().ok();
            for c in open {
                c.close().await?;
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
    if !hold.is_zero() {
        eprintln!("  holding {n} idle connections for {hold:?}");
        std::thread::sleep(hold);
    }
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
