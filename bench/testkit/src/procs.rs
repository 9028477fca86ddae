//! Running the real `proxy-server` / `proxy-agent` binaries as child
//! processes: locate them, capture their logs in a file, wait for their
//! health endpoints, signal them, and never leave one behind (a [`Proc`]
//! is killed when dropped).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

/// The directory holding konn's binaries: `$KONN_BIN_DIR`, else the
/// directory of the running executable (or its parent, for test binaries
/// under `target/*/deps`).
pub fn bin_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("KONN_BIN_DIR") {
        return Some(PathBuf::from(d));
    }
    let exe = std::env::current_exe().ok()?;
    let dir = exe.parent()?;
    [dir, dir.parent()?]
        .into_iter()
        .find(|d| d.join("proxy-server").is_file())
        .map(Path::to_path_buf)
}

/// The path of binary `name` (`proxy-server`, `proxy-agent`).
pub fn binary(name: &str) -> std::io::Result<PathBuf> {
    bin_dir()
        .map(|d| d.join(name))
        .filter(|p| p.is_file())
        .ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::NotFound,
                format!("{name} not found next to this executable; build it first (cargo build --bins) or set KONN_BIN_DIR"),
            )
        })
}

/// Upstream's binary `name` (v0.36, built by scripts/test from
/// interop/go.mod): in `$UPSTREAM_BIN_DIR`, else
/// `<target>/interop/upstream/`; `None` when it is not there.
pub fn upstream_binary(name: &str) -> Option<PathBuf> {
    let dir = std::env::var_os("UPSTREAM_BIN_DIR")
        .map(PathBuf::from)
        .or_else(|| {
            let target = std::env::var_os("CARGO_TARGET_DIR")
                .map(PathBuf::from)
                .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target"));
            Some(target.join("interop/upstream"))
        })?;
    let p = dir.join(name);
    p.is_file().then_some(p)
}

/// A running child process; killed (SIGKILL) and reaped when dropped.
pub struct Proc {
    name: String,
    child: Option<Child>,
    log: PathBuf,
}

impl Proc {
    /// Start `program` with `args`, stdout and stderr appended to `log`.
    pub fn spawn(program: &Path, args: &[String], log: &Path) -> std::io::Result<Self> {
        Self::spawn_inner(program, args, log, &[], None, false)
    }

    /// [`Proc::spawn`] with extra environment variables, and restricted to
    /// the CPUs in `cpus` (before it runs: every thread it starts inherits
    /// the mask). The child is also killed when the thread that started it
    /// ends (`PR_SET_PDEATHSIG`), so an interrupted benchmark run (Ctrl-C,
    /// a timeout's SIGTERM) leaves no server or agent behind.
    pub fn spawn_with(
        program: &Path,
        args: &[String],
        log: &Path,
        env: &[(String, String)],
        cpus: Option<&[usize]>,
    ) -> std::io::Result<Self> {
        Self::spawn_inner(program, args, log, env, cpus, true)
    }

    fn spawn_inner(
        program: &Path,
        args: &[String],
        log: &Path,
        env: &[(String, String)],
        cpus: Option<&[usize]>,
        die_with_parent: bool,
    ) -> std::io::Result<Self> {
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)?;
        let mut cmd = Command::new(program);
        cmd.args(args)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out);
        if let Some(cpus) = cpus {
            let set = cpu_set(cpus);
            pin_child(&mut cmd, set);
        }
        if die_with_parent {
            kill_with_parent(&mut cmd);
        }
        default_sighup(&mut cmd);
        let child = cmd.spawn()?;
        Ok(Self {
            name: program
                .file_name()
                .map_or_else(String::new, |n| n.to_string_lossy().into_owned()),
            child: Some(child),
            log: log.to_owned(),
        })
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// The log file.
    pub fn log(&self) -> &Path {
        &self.log
    }

    /// The last `lines` lines of the log (for error messages).
    pub fn log_tail(&self, lines: usize) -> String {
        file_tail(&self.log, lines)
    }

    /// Send SIGTERM.
    pub fn terminate(&self) {
        self.signal(libc::SIGTERM);
    }

    /// Send `sig`.
    #[allow(unsafe_code)]
    pub fn signal(&self, sig: libc::c_int) {
        if let Some(c) = &self.child
            && let Ok(pid) = libc::pid_t::try_from(c.id())
        {
            // SAFETY: kill(2) with a pid we spawned and have not reaped
            // (the Child is still held), so it names our child.
            unsafe {
                libc::kill(pid, sig);
            }
        }
    }

    /// Wait up to `timeout` for the process to exit.
    pub fn wait_timeout(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let child = self.child.as_mut()?;
        let step = Duration::from_millis(10);
        let mut waited = Duration::ZERO;
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                self.child = None;
                return Some(status);
            }
            if waited >= timeout {
                return None;
            }
            std::thread::sleep(step);
            waited += step;
        }
    }

    /// Whether it is still running.
    pub fn is_running(&mut self) -> bool {
        match self.child.as_mut().map(Child::try_wait) {
            Some(Ok(None)) => true,
            Some(_) => {
                self.child = None;
                false
            }
            None => false,
        }
    }

    /// SIGKILL now and reap.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl std::fmt::Debug for Proc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (pid {})", self.name, self.pid())
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A CPU mask holding `cpus`.
#[allow(unsafe_code)]
pub fn cpu_set(cpus: &[usize]) -> libc::cpu_set_t {
    // SAFETY: cpu_set_t is a plain bit array; all-zero is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &c in cpus {
        // SAFETY: CPU_SET only writes bit `c` of the set (bounds-checked by
        // the libc crate's implementation).
        unsafe { libc::CPU_SET(c, &mut set) };
    }
    set
}

/// Restrict the calling thread (and the threads it starts later) to `cpus`.
#[allow(unsafe_code)]
pub fn pin_current_thread(cpus: &[usize]) -> std::io::Result<()> {
    let set = cpu_set(cpus);
    // SAFETY: pid 0 is the calling thread; `set` is a valid mask of the
    // size passed.
    let r = unsafe { libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[allow(unsafe_code)]
fn pin_child(cmd: &mut Command, set: libc::cpu_set_t) {
    use std::os::unix::process::CommandExt;
    // SAFETY: the closure runs in the forked child before exec and only
    // calls sched_setaffinity, which is async-signal-safe, on a mask
    // copied into the closure (no allocation, no lock).
    unsafe {
        cmd.pre_exec(move || {
            if libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// An ignored SIGHUP survives exec (a test run under `nohup`): the
/// binaries under test start with its default action, as in a pod.
#[allow(unsafe_code)]
fn default_sighup(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: the closure runs in the forked child before exec and only
    // calls signal(2), which is async-signal-safe (no allocation, no lock).
    unsafe {
        cmd.pre_exec(|| {
            if libc::signal(libc::SIGHUP, libc::SIG_DFL) == libc::SIG_ERR {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

#[allow(unsafe_code)]
fn kill_with_parent(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: the closure runs in the forked child before exec and only
    // calls prctl(2), which is async-signal-safe (no allocation, no lock).
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Raise this process's open-file limit to `want` (or as far as allowed);
/// returns the soft limit in force afterwards. Children inherit it.
#[allow(unsafe_code)]
pub fn raise_nofile(want: u64) -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit with a valid resource and a pointer to
    // an initialised rlimit.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return 0;
        }
        let raised = libc::rlimit {
            rlim_cur: want,
            rlim_max: want.max(lim.rlim_max),
        };
        if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
            return want;
        }
        let soft = libc::rlimit {
            rlim_cur: lim.rlim_max,
            rlim_max: lim.rlim_max,
        };
        if libc::setrlimit(libc::RLIMIT_NOFILE, &soft) == 0 {
            return lim.rlim_max;
        }
    }
    lim.rlim_cur
}

/// A plain HTTP/1.1 GET; returns (status, body).
pub fn http_get(addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw);
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map_or_else(String::new, |(_, b)| b.to_owned());
    Ok((status, body))
}

/// The last `lines` lines of the file at `path` (empty when unreadable).
pub fn file_tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Poll `GET path` on `addr` until it answers 200 or `timeout` passes.
pub fn wait_http_ok(addr: SocketAddr, path: &str, timeout: Duration) -> bool {
    let step = Duration::from_millis(50);
    let mut waited = Duration::ZERO;
    while waited < timeout {
        if matches!(http_get(addr, path), Ok((200, _))) {
            return true;
        }
        std::thread::sleep(step);
        waited += step;
    }
    false
}
