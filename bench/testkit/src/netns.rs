//! Network namespaces for tests that need a network of their own (a DNS
//! server on port 53, addresses on a loopback nobody else uses): created
//! with `ip netns`, entered by a thread with `setns(2)`, deleted on drop.
//!
//! Sockets a thread creates inside stay in the namespace after the thread
//! ends, and threads it spawns start inside too, so
//! [`Netns::run`] is how a test puts listeners, destinations and clients
//! there. Child processes start inside through `ip netns exec`
//! ([`Netns::exec_args`]), which also bind-mounts
//! `/etc/netns/<name>/resolv.conf` ([`Netns::set_resolv_conf`]) over
//! `/etc/resolv.conf` for them: the way to give a binary a resolver of the
//! test's own.

use std::io;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::process::Command;

/// A network namespace this process created; deleted (with its
/// `/etc/netns` directory) on drop.
#[derive(Debug)]
pub struct Netns {
    name: String,
}

/// Why namespaces cannot be used here, or `None` when they can (root and
/// the `ip` command of iproute2).
#[allow(unsafe_code)]
pub fn unavailable() -> Option<String> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not root".to_owned());
    }
    match Command::new("ip").arg("-V").output() {
        Ok(o) if o.status.success() => None,
        Ok(o) => Some(format!("`ip -V` failed: {}", o.status)),
        Err(e) => Some(format!("the ip command (iproute2) is missing: {e}")),
    }
}

fn ip(args: &[&str]) -> io::Result<()> {
    let out = Command::new("ip").args(args).output()?;
    if out.status.success() {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

impl Netns {
    /// Creates `<prefix>-<pid>-<n>` with its loopback up.
    pub fn create(prefix: &str) -> io::Result<Self> {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let name = format!("{prefix}-{}-{n}", std::process::id());
        ip(&["netns", "add", &name])?;
        let ns = Self { name };
        ns.ip(&["link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// The namespace's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// `ip -n <name> <args>`.
    pub fn ip(&self, args: &[&str]) -> io::Result<()> {
        let mut all = vec!["-n", self.name.as_str()];
        all.extend_from_slice(args);
        ip(&all)
    }

    /// Writes the `resolv.conf` that processes started with
    /// [`exec_args`](Self::exec_args) see.
    pub fn set_resolv_conf(&self, text: &str) -> io::Result<()> {
        let dir = self.etc_dir();
        std::fs::create_dir_all(&dir)?;
        std::fs::write(dir.join("resolv.conf"), text)
    }

    /// `program args` run inside: the arguments of `ip` (`netns exec
    /// <name> program args…`), which execs in place.
    pub fn exec_args(&self, program: &std::path::Path, args: &[String]) -> Vec<String> {
        let mut all = vec![
            "netns".to_owned(),
            "exec".to_owned(),
            self.name.clone(),
            program.display().to_string(),
        ];
        all.extend_from_slice(args);
        all
    }

    /// Runs `f` on a new thread inside the namespace and returns its
    /// result.
    #[allow(unsafe_code)]
    pub fn run<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> io::Result<T> {
        let path = PathBuf::from("/run/netns").join(&self.name);
        let file = std::fs::File::open(&path)?;
        std::thread::spawn(move || {
            // SAFETY: setns on a namespace file descriptor we own, for this
            // thread only (CLONE_NEWNET); the thread ends with `f`.
            let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
            if rc != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(f())
        })
        .join()
        .map_err(|_| io::Error::other("the thread inside the namespace panicked"))?
    }

    fn etc_dir(&self) -> PathBuf {
        PathBuf::from("/etc/netns").join(&self.name)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = ip(&["netns", "del", &self.name]);
        let _ = std::fs::remove_dir_all(self.etc_dir());
    }
}
