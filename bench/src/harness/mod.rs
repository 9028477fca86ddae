//! The side-by-side harness's building blocks: a topology of real binaries
//! (a proxy-server and a proxy-agent, konn's or upstream's, with the same
//! flags and certificates), per-process measurements from `/proc`, and the
//! load generator's pieces ([`dests`], [`load`], [`stats`], [`report`]);
//! [`multi`] is S10, many clusters on one server; [`guards`] the cost of
//! issue 17's audit log and limits; [`floor`] the kernel's cost of the
//! bulk cells' hops with no proxy work.

pub mod agents;
pub mod compare;
pub mod dests;
pub mod floor;
pub mod guards;
pub mod icount;
pub mod load;
pub mod multi;
pub mod report;
pub mod reverse;
pub mod scenarios;
pub mod soak;
pub mod stats;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use konn_testkit::Error;
use konn_testkit::pki::PkiFiles;
use konn_testkit::procs::{self, Proc};

/// One implementation under test: where its binaries are.
#[derive(Clone, Debug)]
pub struct Binaries {
    /// A short name for reports (`konn`, `upstream`).
    pub name: String,
    /// The proxy-server binary.
    pub server: PathBuf,
    /// The proxy-agent binary.
    pub agent: PathBuf,
    /// Flags of this implementation only, after the common ones (konn:
    /// `--workers`, `--io-engine`).
    pub server_flags: Vec<String>,
    /// See `server_flags`.
    pub agent_flags: Vec<String>,
    /// Environment of both processes (Go: `GOMAXPROCS`).
    pub env: Vec<(String, String)>,
}

impl Binaries {
    /// `name`'s binaries `proxy-server` and `proxy-agent` in `dir`, with no
    /// extra flags.
    pub fn in_dir(name: &str, dir: &Path) -> Self {
        Self {
            name: name.to_owned(),
            server: dir.join("proxy-server"),
            agent: dir.join("proxy-agent"),
            server_flags: Vec::new(),
            agent_flags: Vec::new(),
            env: Vec::new(),
        }
    }
}

/// The frontend mode of a topology's server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// `--mode=grpc` on a Unix socket.
    Grpc,
    /// `--mode=http-connect` on a Unix socket.
    HttpConnect,
}

/// A running proxy-server and proxy-agent, connected.
pub struct Topology {
    /// The server process.
    pub server: Proc,
    /// The agent process.
    pub agent: Proc,
    /// The frontend Unix socket.
    pub socket: PathBuf,
    /// The server's health port.
    pub server_health: SocketAddr,
    mode: Mode,
    bins: Binaries,
    server_args: Vec<String>,
    agent_args: Vec<String>,
    cpus: Option<Vec<usize>>,
    dir: PathBuf,
}

/// How long a restarted process may keep failing at start.
const RESPAWN_WAIT: Duration = Duration::from_secs(10);

/// How long a topology may take to come up.
const READY_WAIT: Duration = Duration::from_secs(30);

impl Topology {
    /// Start `bins`' server in `mode` and its agent, in `dir`, and wait
    /// until the server reports the agent connected (`/readyz`). Both
    /// processes run on `cpus` (all CPUs when `None`).
    pub fn start(
        bins: &Binaries,
        mode: Mode,
        dir: &Path,
        certs: &PkiFiles,
        cpus: Option<&[usize]>,
    ) -> Result<Self, Error> {
        let port = || konn_testkit::ports::free_port();
        let (agent_port, health, admin, agent_health, agent_admin) =
            (port(), port(), port(), port(), port());
        let socket = dir.join(format!("{}-{}.sock", bins.name, std::process::id()));
        let mut server_args = vec![
            format!(
                "--mode={}",
                if mode == Mode::Grpc {
                    "grpc"
                } else {
                    "http-connect"
                }
            ),
            format!("--uds-name={}", socket.display()),
            "--server-port=0".into(),
            "--delete-existing-uds-file=true".into(),
            format!("--cluster-cert={}", certs.server_cert.display()),
            format!("--cluster-key={}", certs.server_key.display()),
            format!("--cluster-ca-cert={}", certs.ca_cert.display()),
            "--agent-bind-address=127.0.0.1".into(),
            format!("--agent-port={agent_port}"),
            "--health-bind-address=127.0.0.1".into(),
            format!("--health-port={health}"),
            "--admin-bind-address=127.0.0.1".into(),
            format!("--admin-port={admin}"),
            "--server-count=1".into(),
        ];
        server_args.extend_from_slice(&bins.server_flags);
        let mut agent_args = vec![
            "--proxy-server-host=127.0.0.1".into(),
            format!("--proxy-server-port={agent_port}"),
            format!("--ca-cert={}", certs.ca_cert.display()),
            format!("--agent-cert={}", certs.agent_cert.display()),
            format!("--agent-key={}", certs.agent_key.display()),
            "--agent-id=bench-agent".into(),
            "--health-server-host=127.0.0.1".into(),
            format!("--health-server-port={agent_health}"),
            "--admin-bind-address=127.0.0.1".into(),
            format!("--admin-server-port={agent_admin}"),
        ];
        agent_args.extend_from_slice(&bins.agent_flags);
        let server = Self::spawn_one(bins, &bins.server, &server_args, dir, "server", cpus)?;
        let agent = Self::spawn_one(bins, &bins.agent, &agent_args, dir, "agent", cpus)?;
        let mut me = Self {
            server,
            agent,
            socket,
            server_health: SocketAddr::from(([127, 0, 0, 1], health)),
            mode,
            bins: bins.clone(),
            server_args,
            agent_args,
            cpus: cpus.map(<[usize]>::to_vec),
            dir: dir.to_owned(),
        };
        me.wait_ready()?;
        Ok(me)
    }

    fn spawn_one(
        bins: &Binaries,
        program: &Path,
        args: &[String],
        dir: &Path,
        what: &str,
        cpus: Option<&[usize]>,
    ) -> Result<Proc, Error> {
        let log = dir.join(format!("{}-{what}.log", bins.name));
        Proc::spawn_with(program, args, &log, &bins.env, cpus)
            .map_err(|e| Error::Write(log.clone(), e))
    }

    /// How the load generator reaches destinations through this topology.
    pub fn route(&self) -> load::Route {
        match self.mode {
            Mode::Grpc => load::Route::Grpc(self.socket.clone()),
            Mode::HttpConnect => load::Route::Connect(self.socket.clone()),
        }
    }

    /// The implementation's name.
    pub fn name(&self) -> &str {
        &self.bins.name
    }

    /// Kill the agent (SIGKILL, as a crash or an evicted pod) and start it
    /// again with the same flags; does not wait for it to connect.
    pub fn restart_agent(&mut self) -> Result<(), Error> {
        self.agent.kill();
        self.agent = self.spawn_again(false)?;
        Ok(())
    }

    /// Kill the server (SIGKILL) and start it again with the same flags;
    /// does not wait for the agent to reconnect.
    pub fn restart_server(&mut self) -> Result<(), Error> {
        self.server.kill();
        self.server = self.spawn_again(true)?;
        Ok(())
    }

    /// Start again whichever process has exited; returns how many were.
    /// After a restart this is needed: a killed process's ports can stay
    /// bound for a moment after it is reaped (the kernel tears an io_uring
    /// instance, and the sockets it holds, down asynchronously), and the
    /// new process then exits with "Address already in use".
    pub fn revive(&mut self) -> Result<u32, Error> {
        let mut n = 0;
        if !self.server.is_running() {
            self.server = self.spawn_again(true)?;
            n += 1;
        }
        if !self.agent.is_running() {
            self.agent = self.spawn_again(false)?;
            n += 1;
        }
        Ok(n)
    }

    fn spawn_again(&self, server: bool) -> Result<Proc, Error> {
        let (program, args, what) = if server {
            (&self.bins.server, &self.server_args, "server")
        } else {
            (&self.bins.agent, &self.agent_args, "agent")
        };
        Self::spawn_one(
            &self.bins,
            program,
            args,
            &self.dir,
            what,
            self.cpus.as_deref(),
        )
    }

    /// Kill both processes and start them again with the same flags;
    /// waits until the agent is connected.
    pub fn restart_both(&mut self) -> Result<(), Error> {
        self.agent.kill();
        self.restart_server()?;
        self.restart_agent()?;
        self.settle()
    }

    /// After a restart: start again whatever exited (see
    /// [`revive`](Self::revive)) until the agent is connected.
    pub fn settle(&mut self) -> Result<(), Error> {
        let step = Duration::from_millis(100);
        let mut waited = Duration::ZERO;
        while waited < RESPAWN_WAIT {
            std::thread::sleep(step);
            waited += step;
            if self.revive()? == 0 && self.is_ready() {
                return Ok(());
            }
        }
        self.wait_ready()
    }

    /// Stop both processes as an orchestrator would: SIGTERM to the agent
    /// twice (DRAIN, then exit) and to the server once; SIGKILL whatever is
    /// still running after `timeout`. Returns whether both exited by
    /// themselves.
    pub fn stop(mut self, timeout: Duration) -> bool {
        self.agent.terminate();
        std::thread::sleep(Duration::from_millis(100));
        self.agent.terminate();
        self.server.terminate();
        let agent = self.agent.wait_timeout(timeout).is_some();
        let server = self.server.wait_timeout(timeout).is_some();
        agent && server
    }

    /// Whether the server answers `/readyz` with 200 (an agent is connected).
    pub fn is_ready(&self) -> bool {
        matches!(procs::http_get(self.server_health, "/readyz"), Ok((200, _)))
    }

    fn wait_ready(&mut self) -> Result<(), Error> {
        let step = Duration::from_millis(20);
        let mut waited = Duration::ZERO;
        while waited < READY_WAIT {
            if !self.server.is_running() {
                return Err(Error::Closed(format!(
                    "proxy-server exited:\n{}",
                    self.server.log_tail(20)
                )));
            }
            if !self.agent.is_running() {
                return Err(Error::Closed(format!(
                    "proxy-agent exited:\n{}",
                    self.agent.log_tail(20)
                )));
            }
            if self.is_ready() {
                return Ok(());
            }
            std::thread::sleep(step);
            waited += step;
        }
        Err(Error::Timeout("the agent to connect to the server"))
    }
}

/// Resident memory of process `pid` in KiB (`VmRSS`).
pub fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|n| n.parse().ok())
}

/// CPU time of process `pid`: the sum of its threads' time on a CPU
/// from `/proc/<pid>/task/*/schedstat` (nanoseconds, unlike the 10 ms
/// ticks of `/proc/<pid>/stat`, which are too coarse for CPU µs per
/// message over a 2 s window). Threads that have exited no longer count,
/// so compare two readings only while the process keeps its threads
/// (konn's workers and Go's Ms do); falls back to the ticks of
/// `/proc/<pid>/stat` where schedstat is missing.
pub fn cpu_time(pid: u32) -> Option<Duration> {
    let mut ns = 0u64;
    let mut any = false;
    if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for t in tasks.flatten() {
            let Ok(text) = std::fs::read_to_string(t.path().join("schedstat")) else {
                continue;
            };
            if let Some(v) = text
                .split_whitespace()
                .next()
                .and_then(|v| v.parse::<u64>().ok())
            {
                ns += v;
                any = true;
            }
        }
    }
    if any {
        Some(Duration::from_nanos(ns))
    } else {
        cpu_ticks(pid)
    }
}

/// `(utime, stime)` of process `pid`, all threads, from `/proc/<pid>/stat`.
fn stat_times(pid: u32) -> Option<(Duration, Duration)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may contain spaces) start at ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    let mut fields = rest.split_whitespace().skip(11);
    let mut ticks = || -> Option<Duration> {
        let t: u64 = fields.next()?.parse().ok()?;
        Some(Duration::from_millis(t * 1000 / clock_ticks()))
    };
    Some((ticks()?, ticks()?))
}

/// CPU time (user + system) of process `pid`, all threads, in clock ticks
/// from `/proc/<pid>/stat`.
pub fn cpu_ticks(pid: u32) -> Option<Duration> {
    stat_times(pid).map(|(user, sys)| user + sys)
}

/// Kernel (system) CPU time of process `pid`, all threads, in clock ticks
/// (`stime` of `/proc/<pid>/stat`): the share of [`cpu_time`] spent in
/// system calls, the socket copies and the TCP stack. 10 ms ticks, so
/// read it over windows of seconds.
pub fn sys_ticks(pid: u32) -> Option<Duration> {
    stat_times(pid).map(|(_, sys)| sys)
}

/// Open file descriptors of process `pid`.
pub fn fd_count(pid: u32) -> Option<u64> {
    Some(std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count() as u64)
}

/// Threads of process `pid`.
pub fn thread_count(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|v| v.trim().parse().ok())
}

/// Context switches (voluntary + involuntary) of process `pid`'s main
/// thread group, summed over its threads.
pub fn ctx_switches(pid: u32) -> Option<u64> {
    let mut total = 0;
    for t in std::fs::read_dir(format!("/proc/{pid}/task")).ok()? {
        let Ok(t) = t else { continue };
        let Ok(status) = std::fs::read_to_string(t.path().join("status")) else {
            continue;
        };
        for l in status.lines() {
            if let Some(v) = l
                .strip_prefix("voluntary_ctxt_switches:")
                .or_else(|| l.strip_prefix("nonvoluntary_ctxt_switches:"))
            {
                total += v.trim().parse::<u64>().unwrap_or(0);
            }
        }
    }
    Some(total)
}

#[allow(unsafe_code)]
fn clock_ticks() -> u64 {
    // SAFETY: sysconf has no preconditions and only reads a constant.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    u64::try_from(t).ok().filter(|t| *t > 0).unwrap_or(100)
}

#[cfg(test)]
mod tests {
    #[test]
    fn this_process_has_rss_and_cpu_time() {
        let me = std::process::id();
        assert!(super::rss_kib(me).is_some_and(|k| k > 0));
        let mut x = 0u64;
        for i in 0..5_000_000u64 {
            x = x.wrapping_add(i * i);
        }
        std::hint::black_box(x);
        let (a, b) = (super::cpu_time(me), super::cpu_ticks(me));
        assert!(a.is_some_and(|t| t > std::time::Duration::ZERO), "{a:?}");
        assert!(b.is_some());
        assert!(super::fd_count(me).is_some_and(|n| n >= 3));
        assert!(super::thread_count(me).is_some_and(|n| n >= 1));
        assert!(super::ctx_switches(me).is_some());
        // System calls grow the kernel time, which never exceeds the total
        // (bounded: at most 200 000 calls, about a second).
        let sys0 = super::sys_ticks(me).unwrap();
        let mut calls = 0;
        while super::sys_ticks(me).unwrap() == sys0 && calls < 200_000 {
            let _ = std::fs::metadata("/");
            calls += 1;
        }
        let (sys, all) = (super::sys_ticks(me).unwrap(), super::cpu_ticks(me).unwrap());
        assert!(sys > sys0, "no kernel time after {calls} system calls");
        assert!(sys <= all, "kernel {sys:?} > total {all:?}");
    }
}
