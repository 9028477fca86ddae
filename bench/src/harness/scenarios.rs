//! The workloads of the benchmark plan's scenarios, run by the load
//! generator on its own monoio runtime against a [`Target`] (a route to
//! the destinations, and the pids of the server and agent to charge CPU
//! time to). Every workload is bounded in time: a warm-up that is not
//! measured, then a measured window; every operation waits at most until
//! shortly after the window ends, so a stalled proxy costs a bounded
//! wait and shows up as timeouts, never as a hung run.
//!
//! Each function returns one [`Sample`]: the metric names are the
//! columns of the report (`MB/s`, `p99 µs`, `CPU s/GB`, …).

use std::cell::Cell;
use std::future::Future;
use std::rc::Rc;
use std::time::Duration;

use monoio::time::{Instant, sleep, sleep_until};

use super::dests::Dests;
use super::load::{Conn, Route};
use super::report::Sample;
use super::stats::{Lat, open_loop_start};
use super::{cpu_time, rss_kib, sys_ticks};
use konn_core::io::runtime::{Either, race};
use konn_testkit::Error;

/// How long a dial may take before it counts as failed.
pub const DIAL_TIMEOUT: Duration = Duration::from_secs(5);

/// Extra time after a measured window that in-flight operations get
/// before they count as timed out.
const GRACE: Duration = Duration::from_secs(2);

/// Write size of bulk uploads (and of the stalled connection).
const CHUNK: usize = 64 * 1024;

/// Where the load goes.
pub struct Target<'a> {
    /// How connections reach the destinations.
    pub route: Route,
    /// `(server, agent)` process ids; `None` for the direct baseline.
    pub pids: Option<(u32, u32)>,
    /// The destinations.
    pub dests: &'a Dests,
}

/// Warm-up and measured window of a timed workload.
#[derive(Clone, Copy, Debug)]
pub struct Window {
    /// Run but not measured (connections ramp up, windows grow).
    pub warm: Duration,
    /// Measured.
    pub secs: Duration,
}

/// CPU time of the server and the agent at one instant, and the kernel
/// time of both together (`None` where `/proc/<pid>/stat` is unreadable).
#[derive(Clone, Copy, Debug)]
struct CpuAt {
    server: Duration,
    agent: Duration,
    kernel: Option<Duration>,
}

fn cpu_at(pids: Option<(u32, u32)>) -> Option<CpuAt> {
    let (s, a) = pids?;
    Some(CpuAt {
        server: cpu_time(s)?,
        agent: cpu_time(a)?,
        kernel: sys_ticks(s).zip(sys_ticks(a)).map(|(s, a)| s + a),
    })
}

/// `kernel <what>`: the server's and the agent's kernel CPU seconds
/// between `before` and `after`, divided by `per` — what their CPU per
/// unit would still be with no user-space work at all.
fn add_kernel_cpu(
    s: &mut Sample,
    before: Option<CpuAt>,
    after: Option<CpuAt>,
    per: f64,
    what: &str,
) {
    let (Some(b), Some(a)) = (before.and_then(|c| c.kernel), after.and_then(|c| c.kernel)) else {
        return;
    };
    if per > 0.0 {
        s.insert(
            format!("kernel {what}"),
            a.saturating_sub(b).as_secs_f64() / per,
        );
    }
}

/// Add `server <what>`, `agent <what>` and `CPU <what>` (their sum): CPU
/// seconds between `before` and `after`, times `scale`, divided by `per`.
fn add_cpu(
    s: &mut Sample,
    before: Option<CpuAt>,
    after: Option<CpuAt>,
    per: f64,
    scale: f64,
    what: &str,
) {
    let (Some(b), Some(a)) = (before, after) else {
        return;
    };
    if per <= 0.0 {
        return;
    }
    let server = a.server.saturating_sub(b.server).as_secs_f64() * scale / per;
    let agent = a.agent.saturating_sub(b.agent).as_secs_f64() * scale / per;
    s.insert(format!("server {what}"), server);
    s.insert(format!("agent {what}"), agent);
    s.insert(format!("CPU {what}"), server + agent);
}

/// A flag the workload's tasks watch to stop.
#[derive(Clone, Default)]
struct Stop(Rc<Cell<bool>>);

impl Stop {
    fn set(&self) {
        self.0.set(true);
    }

    fn is_set(&self) -> bool {
        self.0.get()
    }

    async fn wait(&self) {
        while !self.0.get() {
            sleep(Duration::from_millis(5)).await;
        }
    }

    /// `f`, unless the flag is set first (then `None`, and `f` is dropped).
    async fn or<F: Future>(&self, f: F) -> Option<F::Output> {
        match race(f, self.wait()).await {
            Either::Left(v) => Some(v),
            Either::Right(()) => None,
        }
    }
}

/// Direction of a bulk transfer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// Destination → load generator (S1).
    Download,
    /// Load generator → destination (S2).
    Upload,
}

/// S1/S2: `streams` bulk transfers at once, as fast as they go; MB/s
/// (10^6 bytes) over the window and CPU seconds per GB (10^9 bytes).
pub async fn bulk(
    t: &Target<'_>,
    dir: Direction,
    streams: usize,
    w: Window,
) -> Result<Sample, Error> {
    let dest = match dir {
        Direction::Download => t.dests.source,
        Direction::Upload => t.dests.sink,
    };
    let mut conns = Vec::with_capacity(streams);
    for _ in 0..streams {
        conns.push(Conn::open(&t.route, dest, DIAL_TIMEOUT).await?);
    }
    // Start the transfers only once all are dialled: a download nobody
    // reads yet would stall upstream's shared tunnel (no per-connection
    // flow control) and with it the remaining dials.
    let endless = (u64::MAX >> 1).to_be_bytes();
    for c in &mut conns {
        // Endless, in practice: the window ends the transfer.
        c.write(bytes::Bytes::copy_from_slice(&endless)).await?;
    }
    let bytes = Rc::new(Cell::new(0u64));
    let stop = Stop::default();
    let mut tasks = Vec::with_capacity(streams);
    for mut c in conns {
        let (bytes, stop, block) = (bytes.clone(), stop.clone(), t.dests.block.clone());
        tasks.push(monoio::spawn(async move {
            let mut off = 0;
            let r = loop {
                if stop.is_set() {
                    break Ok(());
                }
                let step = match dir {
                    Direction::Download => stop
                        .or(c.read_some(w.secs + w.warm + GRACE))
                        .await
                        .map(|r| r.map(|n| n as u64)),
                    Direction::Upload => {
                        let chunk = block.slice(off..off + CHUNK);
                        off = (off + CHUNK) % block.len();
                        stop.or(c.write(chunk))
                            .await
                            .map(|r| r.map(|()| CHUNK as u64))
                    }
                };
                match step {
                    None => break Ok(()),
                    Some(Ok(0)) => break Err(Error::Closed("bulk stream ended early".into())),
                    Some(Ok(n)) => bytes.set(bytes.get() + n),
                    Some(Err(e)) => break Err(e),
                }
            };
            // Close as a client would (CLOSE_REQ through a tunnel), not
            // by cutting the frontend connection: upstream's tunnel can
            // wedge when frontends vanish mid-transfer, and that is not
            // what this scenario measures.
            if monoio::time::timeout(GRACE, c.close(GRACE)).await.is_err() {
                return Err(Error::Timeout("closing a bulk stream"));
            }
            r
        }));
    }
    sleep(w.warm).await;
    let (b0, c0, t0) = (bytes.get(), cpu_at(t.pids), Instant::now());
    sleep(w.secs).await;
    let (b1, c1, t1) = (bytes.get(), cpu_at(t.pids), Instant::now());
    stop.set();
    let mut first_err = None;
    for task in tasks {
        if let Err(e) = task.await {
            first_err.get_or_insert(e);
        }
    }
    let moved = (b1 - b0) as f64;
    if moved == 0.0 {
        return Err(first_err.unwrap_or(Error::Timeout("bulk data")));
    }
    let mut s = Sample::new();
    s.insert("MB/s".into(), moved / 1e6 / (t1 - t0).as_secs_f64());
    add_cpu(&mut s, c0, c1, moved / 1e9, 1.0, "CPU s/GB");
    rename_cpu(&mut s, "CPU s/GB");
    add_kernel_cpu(&mut s, c0, c1, moved / 1e9, "CPU s/GB");
    Ok(s)
}

/// `add_cpu` names the sum `CPU <what>`; for a `what` that already
/// starts with `CPU`, drop the doubled word.
fn rename_cpu(s: &mut Sample, what: &str) {
    for side in ["server", "agent", "CPU"] {
        if let Some(v) = s.remove(&format!("{side} {what}")) {
            let short = what.trim_start_matches("CPU ");
            let name = if side == "CPU" {
                format!("CPU {short}")
            } else {
                format!("{side} CPU {short}")
            };
            s.insert(name, v);
        }
    }
}

/// Outcome of one ping-pong connection.
struct PingResult {
    lat: Lat,
    timeouts: u64,
}

/// S3 (and the probe traffic of S6): `conns` echo connections sending
/// `size`-byte messages and waiting for each answer. `rate` (messages per
/// second over all connections) runs an open loop with the
/// coordinated-omission correction; `None` runs a closed loop as fast as
/// answers come. Latency percentiles, achieved msg/s, timeouts and CPU µs
/// per message.
pub async fn ping(
    t: &Target<'_>,
    conns: usize,
    size: usize,
    rate: Option<f64>,
    w: Window,
) -> Result<Sample, Error> {
    let open = open_echoes(t, conns).await?;
    ping_on(t, open, size, rate, w).await
}

async fn open_echoes(t: &Target<'_>, conns: usize) -> Result<Vec<Conn>, Error> {
    let mut open = Vec::with_capacity(conns);
    for i in 0..conns {
        open.push(Conn::open(&t.route, t.dests.echo_for(i), DIAL_TIMEOUT).await?);
    }
    Ok(open)
}

/// [`ping`] on connections already open.
async fn ping_on(
    t: &Target<'_>,
    open: Vec<Conn>,
    size: usize,
    rate: Option<f64>,
    w: Window,
) -> Result<Sample, Error> {
    let conns = open.len();
    let origin = Instant::now();
    let measure_from = origin + w.warm;
    let end = measure_from + w.secs;
    let msg = bytes::Bytes::from(vec![0x5a; size]);
    let count = Rc::new(Cell::new(0u64));
    let mut tasks = Vec::with_capacity(conns);
    for (i, mut c) in open.into_iter().enumerate() {
        let (msg, count) = (msg.clone(), count.clone());
        // Each connection's share of the schedule, staggered.
        let interval = rate.map(|r| Duration::from_secs_f64(conns as f64 / r));
        let offset = interval.map_or(Duration::ZERO, |iv| iv * i as u32 / conns as u32);
        tasks.push(monoio::spawn(async move {
            let mut lat = Lat::new();
            let mut timeouts = 0u64;
            let mut prev_done = origin;
            let mut k = 0u32;
            let r = loop {
                let intended = interval.map_or_else(Instant::now, |iv| origin + offset + iv * k);
                if intended >= end {
                    break Ok(());
                }
                k += 1;
                if intended > Instant::now() {
                    sleep_until(intended).await;
                }
                let sent = Instant::now();
                let left = (end + GRACE).saturating_duration_since(sent);
                let answer = async {
                    c.write(msg.clone()).await?;
                    c.read_n(size, left).await
                };
                match monoio::time::timeout(left, answer).await {
                    Ok(Ok(())) => {}
                    Ok(Err(Error::Timeout(_))) | Err(_) => {
                        // Stalled past the end: every measured slot from
                        // here on waited at least until the deadline.
                        if let Some(iv) = interval {
                            let mut slot = intended;
                            while slot < end {
                                if slot >= measure_from {
                                    lat.record(end + GRACE - slot);
                                    timeouts += 1;
                                }
                                slot += iv;
                            }
                        } else {
                            timeouts += 1;
                        }
                        break Ok(());
                    }
                    Ok(Err(e)) => break Err(e),
                }
                let done = Instant::now();
                if intended >= measure_from && done <= end + GRACE {
                    let ns =
                        |i: Instant| u64::try_from((i - origin).as_nanos()).unwrap_or(u64::MAX);
                    let start = open_loop_start(ns(intended), ns(sent), ns(prev_done));
                    lat.record_ns(ns(done).saturating_sub(start));
                    if done <= end {
                        count.set(count.get() + 1);
                    }
                }
                prev_done = done;
            };
            c.abort().await;
            r.map(|()| PingResult { lat, timeouts })
        }));
    }
    sleep_until(measure_from).await;
    let c0 = cpu_at(t.pids);
    sleep_until(end).await;
    let c1 = cpu_at(t.pids);
    let n = count.get();
    let mut lat = Lat::new();
    let mut timeouts = 0;
    let mut first_err = None;
    for task in tasks {
        match task.await {
            Ok(r) => {
                lat.merge(&r.lat);
                timeouts += r.timeouts;
            }
            Err(e) => {
                first_err.get_or_insert(e);
            }
        }
    }
    if lat.count() == 0 {
        return Err(first_err.unwrap_or(Error::Timeout("echo answers")));
    }
    let mut s = Sample::new();
    for (name, v) in lat.summary() {
        s.insert(name.into(), v);
    }
    s.insert("msg/s".into(), n as f64 / w.secs.as_secs_f64());
    s.insert("timeouts".into(), timeouts as f64);
    add_cpu(&mut s, c0, c1, n as f64, 1e6, "CPU µs/msg");
    rename_cpu(&mut s, "CPU µs/msg");
    Ok(s)
}

/// S6: [`ping`] in an open loop while one more connection through the
/// same agent carries a bulk upload to a destination that never reads.
/// The probe connections are dialled first (a stalled tunnel would also
/// stall their dials), then the stalled connection is opened and filled
/// for `fill`; it is cut (and the destination's end closed) afterwards.
pub async fn ping_with_stall(
    t: &Target<'_>,
    conns: usize,
    size: usize,
    rate: f64,
    fill: Duration,
    w: Window,
) -> Result<Sample, Error> {
    let probes = open_echoes(t, conns).await?;
    let mut stalled = Conn::open(&t.route, t.dests.stall, DIAL_TIMEOUT).await?;
    let stop = Stop::default();
    let (s2, block) = (stop.clone(), t.dests.block.clone());
    let writer = monoio::spawn(async move {
        let mut off = 0;
        let mut written = 0u64;
        while !s2.is_set() {
            let chunk = block.slice(off..off + CHUNK);
            off = (off + CHUNK) % block.len();
            match s2.or(stalled.write(chunk)).await {
                Some(Ok(())) => written += CHUNK as u64,
                Some(Err(_)) | None => break,
            }
        }
        stalled.abort().await;
        written
    });
    sleep(fill).await;
    let r = ping_on(t, probes, size, Some(rate), w).await;
    stop.set();
    let written = writer.await;
    t.dests.release_stalled();
    let mut s = r?;
    s.insert("stalled MB written".into(), written as f64 / 1e6);
    Ok(s)
}

/// S4: `workers` loops, each dialling an echo destination, sending 1 KiB,
/// reading it back and closing, as fast as they can. Dials per second,
/// dial latency (dial request to established), failed dials and CPU µs
/// per dial.
pub async fn dial_churn(t: &Target<'_>, workers: usize, w: Window) -> Result<Sample, Error> {
    let origin = Instant::now();
    let measure_from = origin + w.warm;
    let end = measure_from + w.secs;
    let msg = bytes::Bytes::from(vec![0x42; 1024]);
    let mut tasks = Vec::with_capacity(workers);
    for i in 0..workers {
        let (route, msg) = (t.route.clone(), msg.clone());
        let dests: Vec<_> = (0..super::dests::ECHO_ADDRS as usize)
            .map(|k| t.dests.echo_for(i + k))
            .collect();
        tasks.push(monoio::spawn(async move {
            let mut lat = Lat::new();
            let (mut ok, mut failed) = (0u64, 0u64);
            let mut k = 0;
            while Instant::now() < end {
                k += 1;
                let dest = dests[k % dests.len()];
                let started = Instant::now();
                let one = async {
                    let mut c = Conn::open(&route, dest, DIAL_TIMEOUT).await?;
                    let dialled = Instant::now();
                    c.write(msg.clone()).await?;
                    let r = c.read_n(msg.len(), DIAL_TIMEOUT).await;
                    c.close(DIAL_TIMEOUT).await;
                    r.map(|()| dialled)
                };
                let r = monoio::time::timeout(DIAL_TIMEOUT * 2, one).await;
                let measured = started >= measure_from && Instant::now() <= end + GRACE;
                match r {
                    Ok(Ok(dialled)) => {
                        if measured {
                            lat.record(dialled - started);
                            ok += 1;
                        }
                    }
                    _ => {
                        if measured {
                            failed += 1;
                        }
                        // Do not spin on a refusing proxy.
                        sleep(Duration::from_millis(10)).await;
                    }
                }
            }
            (lat, ok, failed)
        }));
    }
    sleep_until(measure_from).await;
    let c0 = cpu_at(t.pids);
    sleep_until(end).await;
    let c1 = cpu_at(t.pids);
    let mut lat = Lat::new();
    let (mut ok, mut failed) = (0, 0);
    for task in tasks {
        let (l, o, f) = task.await;
        lat.merge(&l);
        ok += o;
        failed += f;
    }
    let mut s = Sample::new();
    s.insert("dials/s".into(), ok as f64 / w.secs.as_secs_f64());
    s.insert("failed dials".into(), failed as f64);
    s.insert("dial p50 µs".into(), lat.quantile_us(0.5));
    s.insert("dial p99 µs".into(), lat.quantile_us(0.99));
    add_cpu(&mut s, c0, c1, ok as f64, 1e6, "CPU µs/dial");
    rename_cpu(&mut s, "CPU µs/dial");
    add_kernel_cpu(&mut s, c0, c1, ok as f64 / 1e6, "CPU µs/dial");
    Ok(s)
}

/// S5: open `n` tunnelled connections (one message echoed on each), let
/// the processes settle, and report the resident-memory growth per idle
/// connection of the server and the agent in KiB.
pub async fn idle(t: &Target<'_>, n: usize, settle: Duration) -> Result<Sample, Error> {
    let Some((sp, ap)) = t.pids else {
        return Err(Error::Closed("idle connections need a proxy".into()));
    };
    let rss = || -> Result<(u64, u64), Error> {
        Ok((
            rss_kib(sp).ok_or(Error::Closed("server process gone".into()))?,
            rss_kib(ap).ok_or(Error::Closed("agent process gone".into()))?,
        ))
    };
    let msg = bytes::Bytes::from_static(b"one idle message");
    sleep(settle).await;
    let base = rss()?;
    let mut open = Vec::with_capacity(n);
    let mut result = Ok(());
    for i in 0..n {
        let one = async {
            let mut c = Conn::open(&t.route, t.dests.echo_for(i), DIAL_TIMEOUT).await?;
            c.write(msg.clone()).await?;
            c.read_n(msg.len(), DIAL_TIMEOUT).await?;
            Ok::<_, Error>(c)
        };
        match one.await {
            Ok(c) => open.push(c),
            Err(e) => {
                result = Err(e);
                break;
            }
        }
    }
    sleep(settle).await;
    let loaded = rss();
    for c in open {
        c.abort().await;
    }
    result?;
    let loaded = loaded?;
    let per = |a: u64, b: u64| b.saturating_sub(a) as f64 / n as f64;
    let mut s = Sample::new();
    s.insert("server KiB/conn".into(), per(base.0, loaded.0));
    s.insert("agent KiB/conn".into(), per(base.1, loaded.1));
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_is_split_per_side_and_summed() {
        let at = |s, a| {
            Some(CpuAt {
                server: Duration::from_millis(s),
                agent: Duration::from_millis(a),
                kernel: Some(Duration::from_millis(s / 2)),
            })
        };
        let mut s = Sample::new();
        // 1.5 s server + 0.5 s agent for 2 GB: 0.75 + 0.25 s/GB.
        add_cpu(&mut s, at(500, 0), at(2000, 500), 2.0, 1.0, "CPU s/GB");
        rename_cpu(&mut s, "CPU s/GB");
        assert_eq!(s["server CPU s/GB"], 0.75);
        assert_eq!(s["agent CPU s/GB"], 0.25);
        assert_eq!(s["CPU s/GB"], 1.0);
        // Kernel time of both: 0.75 s for 2 GB.
        add_kernel_cpu(&mut s, at(500, 0), at(2000, 500), 2.0, "CPU s/GB");
        assert_eq!(s["kernel CPU s/GB"], 0.375);
        // Nothing measured (direct), or nothing moved: no CPU metrics.
        let mut s = Sample::new();
        add_cpu(&mut s, None, at(1, 1), 1.0, 1.0, "x");
        add_cpu(&mut s, at(0, 0), at(1, 1), 0.0, 1.0, "x");
        add_kernel_cpu(&mut s, None, at(1, 1), 1.0, "x");
        assert!(s.is_empty());
    }
}
