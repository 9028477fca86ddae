//! The side-by-side harness's building blocks: a topology of real binaries
//! (a proxy-server and a proxy-agent, konn's or upstream's, with the same
//! flags and certificates) and per-process measurements from `/proc`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::Error;
use crate::pki::PkiFiles;
use crate::procs::{self, Proc};

/// One implementation under test: where its binaries are.
#[derive(Clone, Debug)]
pub struct Binaries {
    /// A short name for reports (`konn`, `upstream`).
    pub name: String,
    /// The proxy-server binary.
    pub server: PathBuf,
    /// The proxy-agent binary.
    pub agent: PathBuf,
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
}

/// How long a topology may take to come up.
const READY_WAIT: Duration = Duration::from_secs(30);

impl Topology {
    /// Start `bins`' server in `mode` and its agent, in `dir`, and wait
    /// until the server reports the agent connected (`/readyz`).
    pub fn start(
        bins: &Binaries,
        mode: Mode,
        dir: &Path,
        certs: &PkiFiles,
        extra_server: &[String],
        extra_agent: &[String],
    ) -> Result<Self, Error> {
        let port = || procs::free_port();
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
        server_args.extend_from_slice(extra_server);
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
        agent_args.extend_from_slice(extra_agent);
        let io = |e: std::io::Error| Error::Write(dir.to_owned(), e);
        let server = Proc::spawn(
            &bins.server,
            &server_args,
            &dir.join(format!("{}-server.log", bins.name)),
        )
        .map_err(io)?;
        let agent = Proc::spawn(
            &bins.agent,
            &agent_args,
            &dir.join(format!("{}-agent.log", bins.name)),
        )
        .map_err(io)?;
        let mut me = Self {
            server,
            agent,
            socket,
            server_health: SocketAddr::from(([127, 0, 0, 1], health)),
        };
        me.wait_ready()?;
        Ok(me)
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
            if matches!(procs::http_get(self.server_health, "/readyz"), Ok((200, _))) {
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

/// CPU time (user + system) of process `pid`, all threads.
pub fn cpu_time(pid: u32) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may contain spaces) start at ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(Duration::from_millis(
        (utime + stime) * 1000 / clock_ticks(),
    ))
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
        assert!(super::cpu_time(me).is_some());
    }
}
