//! Where lines go: stderr and/or log files, with klog's rules.
//!
//! - `--logtostderr` (default true): everything to stderr; with
//!   `--legacy-stderr-threshold-behavior=false` only lines at or above
//!   `--stderrthreshold`. Files are not written.
//! - Otherwise lines go to files, and to stderr when at or above
//!   `--stderrthreshold` (or, with `--alsologtostderr`, at or above
//!   `--alsologtostderrthreshold`).
//!   - `--log-file=PATH`: one file, appended to; when it would exceed
//!     `--log-file-max-size` MB (0 = no limit) it is truncated and
//!     restarted, as klog does.
//!   - else one file per severity in `--log-dir` (falling back to the
//!     system temporary directory, as klog), named
//!     `<program>.<host>.<user>.log.<SEVERITY>.<yyyymmdd-hhmmss>.<pid>`
//!     with a `<program>.<SEVERITY>` symlink; the INFO file gets every
//!     line, WARNING warnings and errors, ERROR errors, unless
//!     `--one-output`. A file is rotated to a new name at 1800 MB (klog's
//!     fixed size for this mode).
//!   - Unless `--skip-log-headers`, a new file starts with a short header.
//!
//! Each line is written with one `write` call (files are opened with
//! `O_APPEND`), so lines from different threads never interleave.
//!
//! Lines for stderr below WARNING are gathered and written together at
//! most [`FLUSH_DELAY`] later (or at once when [`BATCH_BYTES`] are
//! waiting): at the default `-v=4` each dial logs a few lines, and one
//! `write` each cost about a tenth of the server's syscalls in S4 (and the
//! time to append to a log file on the worker thread). Warnings and errors
//! are written at once, after whatever was gathered before them, so the
//! order of lines is kept; [`flush`] writes what is waiting (the binaries
//! call it before they exit, and the panic hook before it aborts). A
//! SIGKILL can lose the last [`FLUSH_DELAY`] of INFO lines. Files are still
//! written line by line.
//!
//! Deliberate difference: klog exits the process when a log write fails
//! (for example a full disk); konn drops the line and reports the first
//! failure of each file on stderr, because a proxy that stops forwarding
//! over a logging problem hurts more than lost log lines.

use std::fs::{File, OpenOptions};
use std::io::{self, Write as _};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::flags::Severity;
use super::format::Stamp;

// A log file's state (size, handle, name) changes on rotation and is shared
// by every thread that logs; logging is never on the data path, so one
// short-lived lock per written line is fine here.
#[allow(clippy::disallowed_types)]
type Lock<T> = std::sync::Mutex<T>;

/// How long a line for stderr below WARNING may wait to be written.
pub(crate) const FLUSH_DELAY: Duration = Duration::from_millis(10);

/// Gathered stderr bytes that are written at once, without waiting.
pub(crate) const BATCH_BYTES: usize = 32 * 1024;

/// Lines for stderr waiting to be written, shared by every logger of the
/// process (stderr is one stream).
struct StderrBatch {
    pending: Lock<Vec<u8>>,
    /// Tells the flusher thread that `pending` is no longer empty.
    wake: std::sync::Condvar,
    /// Whether the flusher thread runs (set when it was first needed).
    flusher: std::sync::OnceLock<bool>,
}

static STDERR: StderrBatch = StderrBatch {
    pending: Lock::new(Vec::new()),
    wake: std::sync::Condvar::new(),
    flusher: std::sync::OnceLock::new(),
};

impl StderrBatch {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<u8>> {
        self.pending
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Writes `pending` out and empties it (under the lock, so lines keep
    /// their order).
    fn write_out(pending: &mut Vec<u8>) {
        if !pending.is_empty() {
            let _ = io::stderr().write_all(pending);
            pending.clear();
        }
    }

    /// Queues `line`; written within [`FLUSH_DELAY`].
    fn gather(&'static self, line: &[u8]) {
        let mut pending = self.lock();
        let was_empty = pending.is_empty();
        pending.extend_from_slice(line);
        if pending.len() >= BATCH_BYTES {
            Self::write_out(&mut pending);
        } else if was_empty {
            drop(pending);
            if self.start_flusher() {
                self.wake.notify_one();
            } else {
                self.flush();
            }
        }
    }

    /// Writes what is waiting and `line` after it, in one `write`.
    fn write_now(&self, line: &[u8]) {
        let mut pending = self.lock();
        pending.extend_from_slice(line);
        Self::write_out(&mut pending);
    }

    fn flush(&self) {
        Self::write_out(&mut self.lock());
    }

    /// The thread that writes gathered lines [`FLUSH_DELAY`] after the
    /// first of them (started with the first gathered line). If it cannot
    /// be started, lines are written at once instead: returns whether it
    /// runs.
    fn start_flusher(&'static self) -> bool {
        *self.flusher.get_or_init(|| {
            std::thread::Builder::new()
                .name("log-flush".into())
                .spawn(move || {
                    // It starts with the first log line, possibly before
                    // the binary blocks a signal it waits for (SIGHUP).
                    let _ = crate::io::signals::block_all_signals();
                    loop {
                        let mut pending = self.lock();
                        while pending.is_empty() {
                            pending = self
                                .wake
                                .wait(pending)
                                .unwrap_or_else(std::sync::PoisonError::into_inner);
                        }
                        drop(pending);
                        std::thread::sleep(FLUSH_DELAY);
                        self.flush();
                    }
                })
                .is_ok()
        })
    }

    /// The flusher thread could not be started: lines are written at once.
    fn without_flusher(&self) -> bool {
        self.flusher.get() == Some(&false)
    }
}

/// Writes the stderr lines still waiting (see the module docs).
pub(crate) fn flush() {
    STDERR.flush();
}

/// klog's `MaxSize` for `--log-dir` files: 1800 MiB.
const DIR_MODE_MAX_BYTES: u64 = 1800 * 1024 * 1024;

/// What the output needs to know about the process, for file names and
/// headers.
#[derive(Debug, Clone)]
pub(crate) struct Identity {
    pub(crate) program: String,
    pub(crate) host: String,
    pub(crate) user: String,
    pub(crate) pid: u32,
}

/// Routing settings (the klog flags that decide where lines go).
#[derive(Debug, Clone)]
pub(crate) struct Routing {
    pub(crate) to_stderr: bool,
    pub(crate) also_to_stderr: bool,
    pub(crate) legacy_stderr_threshold: bool,
    pub(crate) stderr_threshold: Severity,
    pub(crate) also_to_stderr_threshold: Severity,
    pub(crate) one_output: bool,
    pub(crate) skip_log_headers: bool,
}

/// One open log file.
#[derive(Debug)]
struct OpenFile {
    file: File,
    #[cfg_attr(not(test), allow(dead_code))]
    path: PathBuf,
    size: u64,
}

/// A log file slot: opened lazily (per-severity files) or at start.
#[derive(Debug)]
struct Slot {
    severity: Severity,
    state: Lock<Option<OpenFile>>,
    failed: AtomicBool,
}

/// The file side of the output.
#[derive(Debug)]
enum Files {
    /// `--logtostderr`: no files.
    None,
    /// `--log-file`.
    Single {
        slot: Slot,
        path: PathBuf,
        max_bytes: u64,
    },
    /// `--log-dir` (or the temporary directory): INFO, WARNING, ERROR,
    /// FATAL.
    PerSeverity {
        dirs: Vec<PathBuf>,
        slots: [Slot; 4],
    },
}

/// Writes finished lines to stderr and files.
#[derive(Debug)]
pub(crate) struct Output {
    routing: Routing,
    identity: Identity,
    files: Files,
}

impl Slot {
    fn new(severity: Severity) -> Self {
        Self {
            severity,
            state: Lock::new(None),
            failed: AtomicBool::new(false),
        }
    }
}

impl Output {
    /// Sets up the outputs. In file mode the first file is created now, so
    /// an unusable `--log-file` or `--log-dir` is reported at start-up.
    pub(crate) fn new(
        routing: Routing,
        identity: Identity,
        log_file: &str,
        log_dir: &str,
        log_file_max_mb: u64,
    ) -> io::Result<Self> {
        let files = if routing.to_stderr {
            Files::None
        } else if !log_file.is_empty() {
            Files::Single {
                slot: Slot::new(Severity::INFO),
                path: PathBuf::from(log_file),
                max_bytes: if log_file_max_mb == 0 {
                    u64::MAX
                } else {
                    log_file_max_mb.saturating_mul(1024 * 1024)
                },
            }
        } else {
            let mut dirs = Vec::new();
            if !log_dir.is_empty() {
                dirs.push(PathBuf::from(log_dir));
            }
            dirs.push(std::env::temp_dir());
            Files::PerSeverity {
                dirs,
                slots: [
                    Slot::new(Severity::INFO),
                    Slot::new(Severity::WARNING),
                    Slot::new(Severity::ERROR),
                    Slot::new(Severity::FATAL),
                ],
            }
        };
        let out = Self {
            routing,
            identity,
            files,
        };
        out.open_first_file()?;
        Ok(out)
    }

    fn open_first_file(&self) -> io::Result<()> {
        match &self.files {
            Files::None => Ok(()),
            Files::Single { slot, .. } => self.ensure_open(slot).map(|_| ()),
            Files::PerSeverity { slots, .. } => self.ensure_open(&slots[0]).map(|_| ()),
        }
    }

    /// The path of the file lines of `severity` go to first.
    #[cfg(test)]
    pub(crate) fn file_path(&self, severity: Severity) -> Option<PathBuf> {
        let slot = match &self.files {
            Files::None => return None,
            Files::Single { slot, .. } => slot,
            Files::PerSeverity { slots, .. } => &slots[severity_index(severity)],
        };
        let state = slot
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        state.as_ref().map(|f| f.path.clone())
    }

    /// Writes one finished line (ending in `\n`).
    pub(crate) fn write(&self, severity: Severity, line: &[u8]) {
        let r = &self.routing;
        let to_stderr = if r.to_stderr {
            r.legacy_stderr_threshold || severity >= r.stderr_threshold
        } else if r.also_to_stderr {
            severity >= r.also_to_stderr_threshold
        } else {
            severity >= r.stderr_threshold
        };
        if to_stderr {
            if severity >= Severity::WARNING || STDERR.without_flusher() {
                STDERR.write_now(line);
            } else {
                STDERR.gather(line);
            }
        }
        match &self.files {
            Files::None => {}
            Files::Single { slot, .. } => self.write_slot(slot, line),
            Files::PerSeverity { slots, .. } => {
                let top = severity_index(severity);
                if r.one_output {
                    self.write_slot(&slots[top], line);
                } else {
                    for slot in slots[..=top].iter().rev() {
                        self.write_slot(slot, line);
                    }
                }
            }
        }
    }

    fn write_slot(&self, slot: &Slot, line: &[u8]) {
        if let Err(err) = self.try_write_slot(slot, line)
            && !slot.failed.swap(true, Ordering::Relaxed)
        {
            STDERR.write_now(
                format!(
                    "log: cannot write {} log: {err} (further errors for this file are not reported)\n",
                    slot.severity.name()
                )
                .as_bytes(),
            );
        }
    }

    fn try_write_slot(&self, slot: &Slot, line: &[u8]) -> io::Result<()> {
        let mut state = self.ensure_open(slot)?;
        let max = match &self.files {
            Files::Single { max_bytes, .. } => *max_bytes,
            _ => DIR_MODE_MAX_BYTES,
        };
        let len = line.len() as u64;
        let needs_rotation = state
            .as_ref()
            .is_some_and(|f| f.size.saturating_add(len) >= max);
        if needs_rotation {
            *state = Some(self.rotate(slot, state.take())?);
        }
        let Some(open) = state.as_mut() else {
            return Ok(());
        };
        open.file.write_all(line)?;
        open.size += len;
        Ok(())
    }

    /// Locks the slot, opening its file (and, in per-severity mode, every
    /// lower severity's file, as klog does) if needed.
    fn ensure_open<'a>(
        &self,
        slot: &'a Slot,
    ) -> io::Result<std::sync::MutexGuard<'a, Option<OpenFile>>> {
        let mut state = slot
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if state.is_none() {
            *state = Some(self.open(slot.severity, true)?);
        }
        Ok(state)
    }

    fn rotate(&self, slot: &Slot, old: Option<OpenFile>) -> io::Result<OpenFile> {
        drop(old);
        self.open(slot.severity, false)
    }

    /// Opens the file for `severity`: appending at start-up, truncating on
    /// rotation (klog's `openOrCreate`).
    fn open(&self, severity: Severity, startup: bool) -> io::Result<OpenFile> {
        let stamp = Stamp::now();
        match &self.files {
            Files::None => Err(io::Error::other("no log files configured")),
            Files::Single { path, .. } => self.open_path(path, startup, &stamp),
            Files::PerSeverity { dirs, .. } => {
                let name = self.file_name(severity, &stamp);
                let mut last_err = io::Error::other("no log directory");
                for dir in dirs {
                    let path = dir.join(&name);
                    match self.open_path(&path, startup, &stamp) {
                        Ok(f) => {
                            let link =
                                dir.join(format!("{}.{}", self.identity.program, severity.name()));
                            let _ = std::fs::remove_file(&link);
                            let _ = std::os::unix::fs::symlink(&name, &link);
                            return Ok(f);
                        }
                        Err(e) => last_err = e,
                    }
                }
                Err(last_err)
            }
        }
    }

    fn open_path(&self, path: &Path, startup: bool, stamp: &Stamp) -> io::Result<OpenFile> {
        let mut opts = OpenOptions::new();
        opts.create(true).append(true);
        let file = opts.open(path)?;
        if !startup {
            file.set_len(0)?;
        }
        let mut size = file.metadata()?.len();
        if !self.routing.skip_log_headers {
            let header = self.header(stamp);
            (&file).write_all(header.as_bytes())?;
            size += header.len() as u64;
        }
        Ok(OpenFile {
            file,
            path: path.to_owned(),
            size,
        })
    }

    /// `<program>.<host>.<user>.log.<SEVERITY>.<yyyymmdd-hhmmss>.<pid>`
    fn file_name(&self, severity: Severity, s: &Stamp) -> String {
        let id = &self.identity;
        format!(
            "{}.{}.{}.log.{}.{:04}{:02}{:02}-{:02}{:02}{:02}.{}",
            id.program,
            id.host,
            id.user,
            severity.name(),
            s.year,
            s.month,
            s.day,
            s.hour,
            s.minute,
            s.second,
            id.pid
        )
    }

    fn header(&self, s: &Stamp) -> String {
        format!(
            "Log file created at: {:04}/{:02}/{:02} {:02}:{:02}:{:02}\n\
             Running on machine: {}\n\
             Binary: {} (konn {})\n\
             Log line format: [IWEF]mmdd hh:mm:ss.uuuuuu threadid file:line] msg\n",
            s.year,
            s.month,
            s.day,
            s.hour,
            s.minute,
            s.second,
            self.identity.host,
            self.identity.program,
            env!("CARGO_PKG_VERSION"),
        )
    }
}

fn severity_index(s: Severity) -> usize {
    usize::try_from(s.0.clamp(0, 3)).unwrap_or(0)
}

/// The short host name (up to the first dot), as klog uses in file names.
pub(crate) fn short_hostname() -> String {
    let full = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let full = full.trim();
    let short = full.split('.').next().unwrap_or(full);
    if short.is_empty() {
        "unknownhost".to_owned()
    } else {
        short.to_owned()
    }
}

/// The user name for file names: `$USER`, else the `/etc/passwd` entry of
/// the process's uid, else `unknownuser` (klog's fallback).
pub(crate) fn user_name() -> String {
    if let Ok(u) = std::env::var("USER")
        && !u.is_empty()
    {
        return u.replace('\\', "_");
    }
    let uid = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|rest| rest.split_whitespace().next().map(str::to_owned))
        });
    if let (Some(uid), Ok(passwd)) = (uid, std::fs::read_to_string("/etc/passwd")) {
        for line in passwd.lines() {
            let mut parts = line.split(':');
            if let (Some(name), Some(_), Some(id)) = (parts.next(), parts.next(), parts.next())
                && id == uid
            {
                return name.to_owned();
            }
        }
    }
    "unknownuser".to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn routing() -> Routing {
        Routing {
            to_stderr: false,
            also_to_stderr: false,
            legacy_stderr_threshold: true,
            stderr_threshold: Severity(9),
            also_to_stderr_threshold: Severity::INFO,
            one_output: false,
            skip_log_headers: false,
        }
    }

    fn identity() -> Identity {
        Identity {
            program: "proxy-test".to_owned(),
            host: "host".to_owned(),
            user: "user".to_owned(),
            pid: 42,
        }
    }

    fn temp_dir(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("konn-log-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn single_file_appends_and_truncates_at_max() {
        let dir = temp_dir("single");
        let path = dir.join("x.log");
        std::fs::write(&path, "old line\n").unwrap();
        let mut r = routing();
        r.skip_log_headers = true;
        let out = Output::new(r, identity(), path.to_str().unwrap(), "", 1).unwrap();
        out.write(Severity::INFO, b"first\n");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "old line\nfirst\n");
        // Fill up to the 1 MB limit: the next line restarts the file.
        let big = vec![b'x'; 1024 * 1024 - 20];
        out.write(Severity::INFO, &big);
        out.write(Severity::INFO, b"after\n");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "after\n");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn single_file_header() {
        let dir = temp_dir("header");
        let path = dir.join("x.log");
        let out = Output::new(routing(), identity(), path.to_str().unwrap(), "", 0).unwrap();
        out.write(Severity::WARNING, b"W line\n");
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.starts_with("Log file created at: "), "{text}");
        assert!(text.contains("Running on machine: host\n"));
        assert!(text.ends_with("W line\n"));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn per_severity_files_like_klog() {
        let dir = temp_dir("dir");
        let mut r = routing();
        r.skip_log_headers = true;
        let out = Output::new(r, identity(), "", dir.to_str().unwrap(), 0).unwrap();
        out.write(Severity::INFO, b"i\n");
        out.write(Severity::WARNING, b"w\n");
        out.write(Severity::ERROR, b"e\n");
        let read = |sev: Severity| std::fs::read_to_string(out.file_path(sev).unwrap()).unwrap();
        assert_eq!(read(Severity::INFO), "i\nw\ne\n");
        assert_eq!(read(Severity::WARNING), "w\ne\n");
        assert_eq!(read(Severity::ERROR), "e\n");
        let name = out.file_path(Severity::INFO).unwrap();
        let name = name.file_name().unwrap().to_str().unwrap().to_owned();
        assert!(name.starts_with("proxy-test.host.user.log.INFO."), "{name}");
        assert!(name.ends_with(".42"), "{name}");
        let link = std::fs::read_link(dir.join("proxy-test.INFO")).unwrap();
        assert_eq!(link.to_str().unwrap(), name);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn one_output_writes_only_the_native_file() {
        let dir = temp_dir("one");
        let mut r = routing();
        r.skip_log_headers = true;
        r.one_output = true;
        let out = Output::new(r, identity(), "", dir.to_str().unwrap(), 0).unwrap();
        out.write(Severity::ERROR, b"e\n");
        let read = |sev: Severity| std::fs::read_to_string(out.file_path(sev).unwrap()).unwrap();
        assert_eq!(read(Severity::INFO), "");
        assert_eq!(read(Severity::ERROR), "e\n");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn unusable_log_file_fails_at_start() {
        let err = Output::new(routing(), identity(), "/nonexistent-dir/x.log", "", 0).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
    }

    #[test]
    fn bad_log_dir_falls_back_to_temp_dir() {
        let mut r = routing();
        r.skip_log_headers = true;
        let out = Output::new(r, identity(), "", "/nonexistent-dir", 0).unwrap();
        let path = out.file_path(Severity::INFO).unwrap();
        assert!(path.starts_with(std::env::temp_dir()));
        let _ = std::fs::remove_file(&path);
        let _ = std::fs::remove_file(std::env::temp_dir().join("proxy-test.INFO"));
    }

    #[test]
    fn stderr_mode_has_no_files() {
        let mut r = routing();
        r.to_stderr = true;
        let out = Output::new(r, identity(), "/nonexistent/x.log", "", 0).unwrap();
        assert!(out.file_path(Severity::INFO).is_none());
    }

    #[test]
    fn identity_helpers() {
        assert!(!short_hostname().contains('.'));
        assert!(!user_name().is_empty());
    }
}
