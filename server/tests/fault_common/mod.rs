//! The real `proxy-server` binary as a child process for the fault and
//! hardening suites (`budget.rs`, `reload.rs`): started with a test PKI on
//! loopback ports and a Unix-socket gRPC frontend, plus the extra flags a
//! scenario needs; its metrics, memory and log can be read while it runs.

#![allow(dead_code, unreachable_pub)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use konn_core::io::runtime::Engine;
use konn_testkit::files::TempDir;
use konn_testkit::pki::PkiFiles;
use konn_testkit::ports::free_port;
use konn_testkit::procs::{Proc, http_get, wait_http_ok};

/// Generous bound on start-up and on every wait of these suites.
pub const T: Duration = Duration::from_secs(20);

/// A running proxy-server process.
pub struct ServerProc {
    pub proc: Proc,
    pub uds: PathBuf,
    pub agent: SocketAddr,
    pub health: SocketAddr,
    pub admin: SocketAddr,
}

fn at(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

impl ServerProc {
    /// Starts the binary with `pki` on the agent port (mTLS), a Unix-socket
    /// gRPC frontend in `dir`, one worker, `engine`, and `extra` flags; waits
    /// until `/healthz` answers.
    ///
    /// # Panics
    /// If it does not start.
    pub fn start(engine: Engine, dir: &TempDir, pki: &PkiFiles, extra: &[String]) -> Self {
        let (agent, health, admin) = (free_port(), free_port(), free_port());
        let uds = dir.path("konn.sock");
        let p = |p: &Path| p.display().to_string();
        let mut args = vec![
            "--mode=grpc".to_owned(),
            format!("--uds-name={}", p(&uds)),
            "--delete-existing-uds-file=true".to_owned(),
            "--server-port=0".to_owned(),
            format!("--cluster-cert={}", p(&pki.server_cert)),
            format!("--cluster-key={}", p(&pki.server_key)),
            format!("--cluster-ca-cert={}", p(&pki.ca_cert)),
            "--agent-bind-address=127.0.0.1".to_owned(),
            format!("--agent-port={agent}"),
            "--health-bind-address=127.0.0.1".to_owned(),
            format!("--health-port={health}"),
            "--admin-bind-address=127.0.0.1".to_owned(),
            format!("--admin-port={admin}"),
            "--server-count=1".to_owned(),
            "--workers=1".to_owned(),
            format!("--io-engine={engine}"),
        ];
        args.extend_from_slice(extra);
        let bin = konn_testkit::procs::binary("proxy-server").expect("proxy-server binary");
        let log = dir.path("proxy-server.log");
        let proc = Proc::spawn(&bin, &args, &log).expect("spawn proxy-server");
        let s = Self {
            proc,
            uds,
            agent: at(agent),
            health: at(health),
            admin: at(admin),
        };
        assert!(
            wait_http_ok(s.health, "/healthz", T),
            "proxy-server did not start:\n{}",
            s.proc.log_tail(30)
        );
        s
    }

    /// The admin port's `/metrics`.
    pub fn metrics(&self) -> String {
        http_get(self.admin, "/metrics")
            .map(|(_, b)| b)
            .unwrap_or_default()
    }

    /// The value of series `series` (name with labels, as printed), if any.
    pub fn metric(&self, series: &str) -> Option<f64> {
        metric(&self.metrics(), series)
    }

    /// `VmRSS` and `VmHWM` (peak) of the process, in bytes.
    pub fn rss(&self) -> (u64, u64) {
        rss_of(self.proc.pid())
    }

    /// The whole log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.proc.log()).unwrap_or_default()
    }
}

/// The value of the metric line starting with `series ` in a scrape.
pub fn metric(scrape: &str, series: &str) -> Option<f64> {
    scrape.lines().find_map(|l| {
        l.strip_prefix(series)
            .and_then(|rest| rest.strip_prefix(' '))
            .and_then(|v| v.parse().ok())
    })
}

/// `VmRSS` and `VmHWM` of process `pid`, in bytes (0 when unreadable).
pub fn rss_of(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kib = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
            .unwrap_or(0)
            * 1024
    };
    (kib("VmRSS:"), kib("VmHWM:"))
}
