//! `konn-bench floor`: what S1's and S2's hops cost the kernel on this
//! host when the proxies do no work at all.
//!
//! The same topology and pinning as `compare`'s bulk cells, with the two
//! proxies replaced by the simplest relay there is: a process that reads
//! its inbound socket into one buffer and writes it to its outbound socket
//! with blocking calls, nothing else (no TLS, no framing, no event loop).
//! Download (S1): a source on CPU 0 → TCP → the "agent" relay → TCP → the
//! "server" relay → Unix socket → a sink on CPU 0; upload (S2) the other
//! way round. Both relays run on CPU 1, as `compare` pins the proxies, so
//! their CPU time per GB is the kernel's share of a proxy pair on this
//! host: socket copies, the loopback TCP stack, wake-ups and switches.
//! A proxy's kernel share can be read against it, and it plus the
//! cipher's cost estimates the best a TLS proxy could do here. Not a
//! strict bound: an event loop that batches its calls can come in under
//! two blocking copy loops (konn's upload does, docs/BENCHMARKS.md).
//!
//! Threads would share an address space and switch more cheaply than the
//! two proxy processes do, so each relay is a process of its own: this
//! binary again, `konn-bench floor-relay IN OUT CHUNK` ([`relay_main`]).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Duration;

use konn_testkit::procs;

use super::stats::median;
use super::{cpu_time, sys_ticks};

/// The source's write size: a whole socket buffer's worth per call, so
/// the source (on the other CPU) is never what limits the relays.
const SOURCE_WRITE: usize = 256 * 1024;

/// How long the relays get to connect to the source and the sink.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How often [`accept_within`] looks again: set-up only, not measured.
const ACCEPT_POLL: Duration = Duration::from_millis(2);

/// Which way the bytes flow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// S1: destination → agent → server → kube-apiserver.
    Download,
    /// S2: kube-apiserver → server → agent → destination.
    Upload,
}

impl Direction {
    /// The scenario's name in `compare`.
    pub fn scenario(self) -> &'static str {
        match self {
            Self::Download => "S1 download",
            Self::Upload => "S2 upload",
        }
    }
}

/// One run's figures.
#[derive(Clone, Debug)]
pub struct Row {
    /// Bytes through the chain per second, in MB/s.
    pub mb_per_s: f64,
    /// CPU seconds per GB of the agent-side relay: all, kernel only.
    pub agent: (f64, f64),
    /// The same for the server-side relay.
    pub server: (f64, f64),
}

impl Row {
    /// Both relays' CPU seconds per GB.
    pub fn total(&self) -> f64 {
        self.agent.0 + self.server.0
    }
}

/// Runs one transfer of `bytes` through the two relays, reading and
/// writing `chunk` bytes per call; relays on CPU `relay_cpu`, source and
/// sink on the calling thread's CPUs (pin it first, as `compare` does).
/// `exe` is this binary (`std::env::current_exe`).
pub fn run(
    exe: &Path,
    dir: Direction,
    chunk: usize,
    bytes: u64,
    relay_cpu: Option<usize>,
) -> std::io::Result<Row> {
    let tcp = TcpListener::bind("127.0.0.1:0")?;
    let tcp_addr = tcp.local_addr()?;
    let path = std::env::temp_dir().join(format!("konn-floor-{}.sock", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let unix = UnixListener::bind(&path)?;
    let unix_ep = format!("unix:{}", path.display());
    let tcp_ep = format!("tcp:{tcp_addr}");
    // The relay that listens starts first and says where; the other
    // connects to it.
    let (agent, server) = match dir {
        Direction::Download => {
            let server = Relay::start(exe, "listen", &unix_ep, chunk, relay_cpu)?;
            let to = format!("tcp:{}", server.addr);
            (Relay::start(exe, &tcp_ep, &to, chunk, relay_cpu)?, server)
        }
        Direction::Upload => {
            let agent = Relay::start(exe, "listen", &tcp_ep, chunk, relay_cpu)?;
            let to = format!("tcp:{}", agent.addr);
            (agent, Relay::start(exe, &unix_ep, &to, chunk, relay_cpu)?)
        }
    };
    tcp.set_nonblocking(true)?;
    unix.set_nonblocking(true)?;
    let mut relays = [agent, server];
    let tcp_end = accept_within(|| tcp.accept().map(|(s, _)| s), &mut relays)?;
    let unix_end = accept_within(|| unix.accept().map(|(s, _)| s), &mut relays)?;
    tcp_end.set_nonblocking(false)?;
    unix_end.set_nonblocking(false)?;
    let [agent, server] = relays;
    let (before_a, before_s) = (agent.cpu(), server.cpu());
    let (elapsed, got) = match dir {
        Direction::Download => transfer(tcp_end, unix_end, bytes)?,
        Direction::Upload => transfer(unix_end, tcp_end, bytes)?,
    };
    let _ = std::fs::remove_file(&path);
    if got != bytes {
        return Err(std::io::Error::other(format!(
            "the sink got {got} of {bytes} bytes"
        )));
    }
    let (after_a, after_s) = (agent.finish()?, server.finish()?);
    let gb = bytes as f64 / 1e9;
    let per_gb = |b: (Duration, Duration), a: (Duration, Duration)| {
        (
            (a.0.saturating_sub(b.0)).as_secs_f64() / gb,
            (a.1.saturating_sub(b.1)).as_secs_f64() / gb,
        )
    };
    Ok(Row {
        mb_per_s: bytes as f64 / 1e6 / elapsed.as_secs_f64(),
        agent: per_gb(before_a, after_a),
        server: per_gb(before_s, after_s),
    })
}

/// Accepts the connection of a relay, failing when a relay exits first
/// or none comes within [`CONNECT_TIMEOUT`] (the listener is
/// non-blocking).
// A measuring tool: it reads the clock for its deadline.
#[allow(clippy::disallowed_methods)]
fn accept_within<S>(
    mut accept: impl FnMut() -> std::io::Result<S>,
    relays: &mut [Relay],
) -> std::io::Result<S> {
    let deadline = std::time::Instant::now() + CONNECT_TIMEOUT;
    loop {
        match accept() {
            Ok(s) => return Ok(s),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
        for r in relays.iter_mut() {
            if let Some(status) = r.child.try_wait()? {
                return Err(std::io::Error::other(format!(
                    "a relay exited ({status}) before connecting"
                )));
            }
        }
        if std::time::Instant::now() > deadline {
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "no relay connected within 10 s",
            ));
        }
        std::thread::sleep(ACCEPT_POLL);
    }
}

/// Writes `bytes` into `src` from one thread and reads `dst` to its end on
/// this one: the time from the first byte read to the end, and the bytes.
fn transfer<S, D>(mut src: S, mut dst: D, bytes: u64) -> std::io::Result<(Duration, u64)>
where
    S: Write + Send + 'static,
    D: Read,
{
    let writer = std::thread::spawn(move || -> std::io::Result<()> {
        let buf = vec![0x5a; SOURCE_WRITE];
        let mut left = bytes;
        while left > 0 {
            let n = left.min(SOURCE_WRITE as u64) as usize;
            src.write_all(&buf[..n])?;
            left -= n as u64;
        }
        Ok(()) // dropping `src` ends the stream
    });
    let mut buf = vec![0; SOURCE_WRITE];
    let mut got = dst.read(&mut buf)? as u64;
    // A measuring tool: it reads the clock.
    #[allow(clippy::disallowed_methods)]
    let start = std::time::Instant::now();
    loop {
        let n = dst.read(&mut buf)?;
        if n == 0 {
            break;
        }
        got += n as u64;
    }
    let elapsed = start.elapsed();
    writer
        .join()
        .map_err(|_| std::io::Error::other("the source thread panicked"))??;
    Ok((elapsed, got))
}

/// A relay process and its pipes.
struct Relay {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    /// Where it listens, when it does.
    addr: String,
}

impl Relay {
    fn start(
        exe: &Path,
        from: &str,
        to: &str,
        chunk: usize,
        cpu: Option<usize>,
    ) -> std::io::Result<Self> {
        let mut cmd = Command::new(exe);
        cmd.args(["floor-relay", from, to, &chunk.to_string()]);
        if let Some(cpu) = cpu {
            cmd.arg(cpu.to_string());
        }
        let mut child = cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).spawn()?;
        let stdin = child.stdin.take();
        let stdout = child
            .stdout
            .take()
            .map(BufReader::new)
            .ok_or_else(|| std::io::Error::other("no pipe to the relay's stdout"))?;
        let mut relay = Self {
            child,
            stdin,
            stdout,
            addr: String::new(),
        };
        if from == "listen" {
            let line = relay.line()?;
            relay.addr = line
                .strip_prefix("listening ")
                .ok_or_else(|| std::io::Error::other(format!("relay said {line:?}")))?
                .to_owned();
        }
        Ok(relay)
    }

    fn line(&mut self) -> std::io::Result<String> {
        let mut line = String::new();
        self.stdout.read_line(&mut line)?;
        Ok(line.trim_end().to_owned())
    }

    /// `(all, kernel)` CPU time so far.
    fn cpu(&self) -> (Duration, Duration) {
        let pid = self.child.id();
        (
            cpu_time(pid).unwrap_or_default(),
            sys_ticks(pid).unwrap_or_default(),
        )
    }

    /// Waits for the relay to report the end of its stream, reads its CPU
    /// time while it still exists, and lets it exit.
    fn finish(mut self) -> std::io::Result<(Duration, Duration)> {
        let line = self.line()?;
        if line != "done" {
            return Err(std::io::Error::other(format!("relay said {line:?}")));
        }
        let cpu = self.cpu();
        drop(self.stdin.take());
        self.child.wait()?;
        Ok(cpu)
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One end of a relay: connected to an address, or accepted on a fresh
/// loopback listener.
enum End {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl End {
    fn open(spec: &str) -> std::io::Result<Self> {
        if spec == "listen" {
            let l = TcpListener::bind("127.0.0.1:0")?;
            let mut out = std::io::stdout();
            writeln!(out, "listening {}", l.local_addr()?)?;
            out.flush()?;
            let s = l.accept()?.0;
            s.set_nodelay(true)?;
            return Ok(Self::Tcp(s));
        }
        if let Some(addr) = spec.strip_prefix("tcp:") {
            let s = TcpStream::connect(addr)?;
            s.set_nodelay(true)?;
            return Ok(Self::Tcp(s));
        }
        if let Some(path) = spec.strip_prefix("unix:") {
            return Ok(Self::Unix(UnixStream::connect(path)?));
        }
        Err(std::io::Error::other(format!("bad relay end {spec:?}")))
    }
}

/// `konn-bench floor-relay IN OUT CHUNK [CPU]`: the relay process. `IN`
/// is `tcp:ADDR`, `unix:PATH` or `listen` (a loopback TCP listener whose
/// address is printed as `listening ADDR`, one connection accepted);
/// `OUT` one of the first two. Copies IN to OUT in calls of `CHUNK` bytes
/// until IN ends, prints `done` and exits when its stdin closes.
pub fn relay_main(args: &[String]) -> std::io::Result<()> {
    let [from, to, chunk, rest @ ..] = args else {
        return Err(std::io::Error::other(
            "usage: floor-relay IN OUT CHUNK [CPU]",
        ));
    };
    let number = |what: &str, v: &str| {
        v.parse::<usize>()
            .map_err(|e| std::io::Error::other(format!("{what} {v:?}: {e}")))
    };
    let chunk = number("CHUNK", chunk)?;
    if let Some(cpu) = rest.first() {
        procs::pin_current_thread(&[number("CPU", cpu)?])?;
    }
    // `IN` first: when it listens, the peer connects only after reading
    // where, and `OUT` is never the listening end.
    let open = |spec: &str| {
        End::open(spec).map_err(|e| std::io::Error::new(e.kind(), format!("{spec}: {e}")))
    };
    let (inbound, outbound) = (open(from)?, open(to)?);
    let mut buf = vec![0u8; chunk];
    match (inbound, outbound) {
        (End::Tcp(mut i), End::Tcp(mut o)) => copy(&mut i, &mut o, &mut buf)?,
        (End::Tcp(mut i), End::Unix(mut o)) => copy(&mut i, &mut o, &mut buf)?,
        (End::Unix(mut i), End::Tcp(mut o)) => copy(&mut i, &mut o, &mut buf)?,
        (End::Unix(mut i), End::Unix(mut o)) => copy(&mut i, &mut o, &mut buf)?,
    }
    let mut out = std::io::stdout();
    writeln!(out, "done")?;
    out.flush()?;
    // Stay until the parent has read this process's CPU time.
    std::io::stdin().read_to_end(&mut Vec::new())?;
    Ok(())
}

/// Copies `i` to `o` until `i` ends, then ends `o`'s stream.
fn copy<I: Read, O: Write + Shut>(i: &mut I, o: &mut O, buf: &mut [u8]) -> std::io::Result<()> {
    loop {
        let n = i.read(buf)?;
        if n == 0 {
            return o.shut();
        }
        o.write_all(&buf[..n])?;
    }
}

/// A stream's write-side shutdown.
trait Shut {
    fn shut(&self) -> std::io::Result<()>;
}

impl Shut for TcpStream {
    fn shut(&self) -> std::io::Result<()> {
        self.shutdown(Shutdown::Write)
    }
}

impl Shut for UnixStream {
    fn shut(&self) -> std::io::Result<()> {
        self.shutdown(Shutdown::Write)
    }
}

/// Renders rows as a markdown table: `(direction, chunk, runs)`.
pub fn table(rows: &[(Direction, usize, Vec<Row>)]) -> String {
    use std::fmt::Write as _;
    let mut t = String::from(
        "| cell | calls of | MB/s | agent CPU-s/GB (kernel) | server CPU-s/GB (kernel) | both CPU-s/GB | ceiling MB/s at one core |\n|---|---:|---:|---:|---:|---:|---:|\n",
    );
    for (dir, chunk, runs) in rows {
        let med = |f: &dyn Fn(&Row) -> f64| median(&runs.iter().map(f).collect::<Vec<_>>());
        let total = med(&Row::total);
        let _ = writeln!(
            t,
            "| {} | {} KiB | {:.0} | {:.3} ({:.3}) | {:.3} ({:.3}) | {:.3} | {:.0} |",
            dir.scenario(),
            chunk / 1024,
            med(&|r| r.mb_per_s),
            med(&|r| r.agent.0),
            med(&|r| r.agent.1),
            med(&|r| r.server.0),
            med(&|r| r.server.1),
            total,
            1000.0 / total,
        );
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(mb_per_s: f64, agent: f64, server: f64) -> Row {
        Row {
            mb_per_s,
            agent: (agent, agent / 2.0),
            server: (server, server / 2.0),
        }
    }

    #[test]
    fn the_table_shows_medians_and_the_ceiling_of_their_total() {
        let runs = vec![
            row(500.0, 0.5, 0.5),
            row(900.0, 0.2, 0.3),
            row(700.0, 0.4, 0.6),
        ];
        let t = table(&[(Direction::Download, 64 * 1024, runs)]);
        let line = t.lines().nth(2).expect("a row after the header");
        // Medians per column (MB/s 700, agent 0.4, server 0.5), the
        // median of the totals (1.0: 1.0, 0.5, 1.0) and 1000 / that.
        assert_eq!(
            line,
            "| S1 download | 64 KiB | 700 | 0.400 (0.200) | 0.500 (0.250) | 1.000 | 1000 |"
        );
    }

    #[test]
    fn a_relay_refuses_bad_arguments_before_doing_anything() {
        let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(relay_main(&args(&["listen", "tcp:127.0.0.1:1"])).is_err());
        let e = relay_main(&args(&["listen", "tcp:127.0.0.1:1", "lots"])).unwrap_err();
        assert!(e.to_string().starts_with("CHUNK \"lots\""), "{e}");
    }
}
