//! The dial audit log (`--audit-log-path`): one JSON line per tunnelled
//! connection at its end, and one per refused or failed dial
//! (docs/OPERATIONS.md, "Audit log", has the format).
//!
//! Off the packet path: a worker turns the router's
//! [`ConnSummary`](konn_protocol::server::router::ConnSummary) into a
//! [`Record`] (plain data, no formatting) and pushes it into its own
//! bounded, lock-free queue; one writer thread formats the records and
//! writes them to the file (or stdout) in batches: it is woken when a
//! queue is a quarter full, else every [`ROUND`], so a record costs no
//! wake-up or system call of its own. A full queue never waits: the
//! record is counted in `konn_audit_records_dropped_total` and dropped, so
//! a slow or blocked sink never stalls traffic. The file rotates by size
//! (`--audit-log-maxsize`) into `path.1` … `path.N`
//! (`--audit-log-maxbackup`), the oldest deleted.
//!
//! Never payloads or tokens: a record holds who, where, how it ended and
//! byte counts only.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_queue::ArrayQueue;
use crossbeam_utils::sync::{Parker, Unparker};
use konn_protocol::server::router::{ConnSummary, FrontendKind};

use crate::health::json_string;

/// Where the records go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sink {
    /// Standard output (`--audit-log-path=-`).
    Stdout,
    /// A file, created if missing, appended to.
    File(PathBuf),
}

/// `--audit-log-*`, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditConfig {
    /// Where.
    pub sink: Sink,
    /// Rotate when the file would grow past this many bytes (0: never).
    pub max_size: u64,
    /// Rotated files kept (`path.1` newest).
    pub max_backups: usize,
    /// Records each worker's queue holds.
    pub queue: usize,
}

/// One record on its way to the writer.
#[derive(Debug)]
pub struct Record {
    /// When it ended, since the Unix epoch.
    pub time: Duration,
    /// Its cluster (`""` without `--clusters-config`).
    pub cluster: Arc<str>,
    /// How long it lived (from its dial).
    pub duration: Duration,
    /// What the router knew of it.
    pub summary: Box<ConnSummary>,
}

/// The producer side, shared by every worker (and the writer thread).
pub struct AuditLog {
    queues: Box<[ArrayQueue<Record>]>,
    /// A push that leaves this many records in its queue wakes the writer;
    /// below, the writer finds them on its next round ([`ROUND`]): records
    /// are written in batches, not one wake-up and write per connection.
    wake_at: usize,
    dropped: AtomicU64,
    written: AtomicU64,
    stopping: AtomicBool,
    unparker: Unparker,
}

impl std::fmt::Debug for AuditLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuditLog")
            .field("dropped", &self.dropped.load(Ordering::Relaxed))
            .field("written", &self.written.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// The writer thread; [`AuditWriter::stop`] writes what is queued and ends
/// it.
#[derive(Debug)]
pub struct AuditWriter {
    log: Arc<AuditLog>,
    thread: Option<JoinHandle<()>>,
}

impl AuditLog {
    /// Start the writer thread for `workers` producers. The file is opened
    /// by the thread (a FIFO may block in `open`); a file that cannot be
    /// opened is reported there and its records counted as dropped.
    pub fn start(cfg: AuditConfig, workers: usize) -> io::Result<(Arc<Self>, AuditWriter)> {
        let parker = Parker::new();
        let log = Arc::new(Self {
            queues: (0..workers.max(1))
                .map(|_| ArrayQueue::new(cfg.queue.max(1)))
                .collect(),
            wake_at: (cfg.queue / 4).clamp(1, BATCH),
            dropped: AtomicU64::new(0),
            written: AtomicU64::new(0),
            stopping: AtomicBool::new(false),
            unparker: parker.unparker().clone(),
        });
        let l = log.clone();
        let thread = std::thread::Builder::new()
            .name("konn-audit".into())
            .spawn(move || write_loop(&l, &cfg, &parker))?;
        let writer = AuditWriter {
            log: log.clone(),
            thread: Some(thread),
        };
        Ok((log, writer))
    }

    /// Queue a record from `worker`; never waits. Returns false when it
    /// was dropped (queue full).
    pub fn push(&self, worker: usize, record: Record) -> bool {
        let Some(q) = self.queues.get(worker % self.queues.len()) else {
            return false;
        };
        let ok = q.push(record).is_ok();
        if ok {
            if q.len() >= self.wake_at {
                self.unparker.unpark();
            }
        } else {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
        ok
    }

    /// Records dropped so far (full queue, or a sink that failed).
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Records written so far.
    pub fn written(&self) -> u64 {
        self.written.load(Ordering::Relaxed)
    }
}

/// How long a stop waits for the writer to write what is queued: a sink
/// that blocks (a FIFO nobody reads, a hung network file system) must not
/// keep the process from exiting.
pub const STOP_WAIT: Duration = Duration::from_secs(5);

impl AuditWriter {
    /// Write what is queued, then end the thread. Call after the workers
    /// stopped, so every record they pushed is written. Waits at most
    /// [`STOP_WAIT`]; a writer still blocked then is left behind (the
    /// process is exiting) and what it holds is lost.
    pub fn stop(mut self) {
        self.stop_inner();
    }

    fn stop_inner(&mut self) {
        self.log.stopping.store(true, Ordering::SeqCst);
        self.log.unparker.unpark();
        let Some(t) = self.thread.take() else {
            return;
        };
        let step = Duration::from_millis(5);
        for _ in 0..STOP_WAIT.as_millis() / step.as_millis() {
            if t.is_finished() {
                let _ = t.join();
                return;
            }
            std::thread::sleep(step);
        }
        tracing::warn!(
            "audit log: the writer is blocked on its sink; records still queued are lost"
        );
    }
}

impl Drop for AuditWriter {
    fn drop(&mut self) {
        self.stop_inner();
    }
}

/// Most records formatted between two flushes.
const BATCH: usize = 1024;

/// How long the writer sleeps when nothing woke it: the most a record
/// waits in a queue that is not filling up.
pub const ROUND: Duration = Duration::from_millis(100);

fn write_loop(log: &AuditLog, cfg: &AuditConfig, parker: &Parker) {
    let mut out = Output::open(cfg);
    let mut line = String::with_capacity(512);
    let mut buf: Vec<u8> = Vec::with_capacity(64 * 1024);
    loop {
        // Checked before draining: records pushed before the stop are
        // written by this round.
        let stopping = log.stopping.load(Ordering::SeqCst);
        let mut n = 0u64;
        for q in log.queues.iter() {
            let mut taken = 0;
            while taken < BATCH
                && let Some(r) = q.pop()
            {
                line.clear();
                format_record(&r, &mut line);
                buf.extend_from_slice(line.as_bytes());
                taken += 1;
            }
            n += taken as u64;
        }
        if n > 0 {
            match out.write(&buf) {
                Ok(()) => log.written.fetch_add(n, Ordering::Relaxed),
                Err(()) => log.dropped.fetch_add(n, Ordering::Relaxed),
            };
            buf.clear();
            continue;
        }
        if stopping {
            return;
        }
        parker.park_timeout(ROUND);
    }
}

/// The sink: stdout or a size-rotated file.
struct Output<'a> {
    cfg: &'a AuditConfig,
    file: Option<File>,
    size: u64,
    /// A failure was logged; the next one is not until a write succeeds.
    failing: bool,
}

impl<'a> Output<'a> {
    fn open(cfg: &'a AuditConfig) -> Self {
        let mut o = Self {
            cfg,
            file: None,
            size: 0,
            failing: false,
        };
        if let Sink::File(path) = &cfg.sink {
            o.reopen(path);
        }
        o
    }

    fn reopen(&mut self, path: &Path) {
        match OpenOptions::new().create(true).append(true).open(path) {
            Ok(f) => {
                self.size = f.metadata().map_or(0, |m| m.len());
                self.file = Some(f);
            }
            Err(e) => self.fail(&e),
        }
    }

    fn fail(&mut self, e: &io::Error) {
        if !self.failing {
            tracing::warn!(error = %e, "audit log: cannot write; records are dropped until it works again");
        }
        self.failing = true;
    }

    fn write(&mut self, bytes: &[u8]) -> Result<(), ()> {
        let r = match &self.cfg.sink {
            Sink::Stdout => io::stdout().lock().write_all(bytes),
            Sink::File(path) => {
                let len = bytes.len() as u64;
                if self.cfg.max_size > 0 && self.size > 0 && self.size + len > self.cfg.max_size {
                    self.rotate(path);
                }
                if self.file.is_none() {
                    self.reopen(path);
                }
                match self.file.as_mut() {
                    Some(f) => f.write_all(bytes).inspect(|()| self.size += len),
                    None => Err(io::Error::other("not open")),
                }
            }
        };
        match r {
            Ok(()) => {
                self.failing = false;
                Ok(())
            }
            Err(e) => {
                self.fail(&e);
                // Opened again before the next write.
                self.file = None;
                Err(())
            }
        }
    }

    /// `path` → `path.1` → … → `path.N`; the oldest goes.
    fn rotate(&mut self, path: &Path) {
        self.file = None;
        let name = |i: usize| {
            let mut p = path.as_os_str().to_owned();
            p.push(format!(".{i}"));
            PathBuf::from(p)
        };
        let keep = self.cfg.max_backups;
        if keep == 0 {
            let _ = std::fs::remove_file(path);
        } else {
            let _ = std::fs::remove_file(name(keep));
            for i in (1..keep).rev() {
                let _ = std::fs::rename(name(i), name(i + 1));
            }
            let _ = std::fs::rename(path, name(1));
        }
        self.size = 0;
        self.reopen(path);
    }
}

/// The frontend kind's spelling in a record.
pub fn kind_label(kind: FrontendKind) -> &'static str {
    match kind {
        FrontendKind::Grpc => "grpc",
        FrontendKind::HttpConnect => "http-connect",
        FrontendKind::Reverse => "reverse",
    }
}

/// One record as a JSON line (docs/OPERATIONS.md, "Audit log").
pub fn format_record(r: &Record, out: &mut String) {
    use konn_core::log::{push_i64, push_rfc3339_utc, push_u64};
    let s = &r.summary;
    out.push_str("{\"time\":\"");
    push_rfc3339_utc(out, r.time);
    out.push_str("\",\"cluster\":");
    json_string(out, &r.cluster);
    out.push_str(",\"frontend\":\"");
    out.push_str(kind_label(s.kind));
    out.push_str("\",\"peer\":");
    match &s.peer {
        Some(p) => json_string(out, p),
        None => out.push_str("null"),
    }
    out.push_str(",\"agent_id\":");
    match &s.agent_id {
        Some(a) => json_string(out, a),
        None => out.push_str("null"),
    }
    out.push_str(",\"destination\":");
    json_string(out, &s.destination);
    // By hand, not with `write!`: the record is written for every
    // connection, and the `fmt` machinery was most of its cost.
    out.push_str(",\"connection_id\":");
    push_i64(out, s.connect_id);
    out.push_str(",\"result\":\"");
    out.push_str(s.result.label());
    out.push_str("\",\"reason\":");
    json_string(out, s.reason);
    out.push_str(",\"closed_by\":\"");
    out.push_str(s.closed_by.label());
    // Seconds with microseconds (truncated, as the timestamps).
    out.push_str("\",\"duration_seconds\":");
    push_u64(out, r.duration.as_secs(), 1);
    out.push('.');
    push_u64(out, u64::from(r.duration.subsec_micros()), 6);
    out.push_str(",\"bytes_to_agent\":");
    push_u64(out, s.bytes_to_agent, 1);
    out.push_str(",\"bytes_from_agent\":");
    push_u64(out, s.bytes_from_agent, 1);
    out.push_str("}\n");
}

#[cfg(test)]
mod tests {
    use konn_protocol::server::router::{ConnResult, Side};

    use super::*;

    fn record(dest: &str) -> Record {
        Record {
            time: Duration::new(1_795_000_000, 5_000),
            cluster: Arc::from("a\"b"),
            duration: Duration::from_millis(1500),
            summary: Box::new(ConnSummary {
                frontend: 1,
                kind: FrontendKind::HttpConnect,
                peer: Some(Arc::from("uid=0 gid=0 pid=7")),
                destination: Arc::from(dest),
                agent_id: None,
                backend: None,
                connect_id: 0,
                started: konn_core::io::clock::now(),
                result: ConnResult::Refused,
                reason: "no_backend",
                closed_by: Side::Server,
                bytes_to_agent: 3,
                bytes_from_agent: 4,
            }),
        }
    }

    #[test]
    fn a_record_is_one_escaped_json_line() {
        let mut s = String::new();
        format_record(&record("10.0.0.1:443\n\u{1}"), &mut s);
        assert_eq!(
            s,
            "{\"time\":\"2026-11-18T11:06:40.000005Z\",\"cluster\":\"a\\\"b\",\
             \"frontend\":\"http-connect\",\"peer\":\"uid=0 gid=0 pid=7\",\"agent_id\":null,\
             \"destination\":\"10.0.0.1:443\\n\\u0001\",\"connection_id\":0,\
             \"result\":\"refused\",\"reason\":\"no_backend\",\"closed_by\":\"server\",\
             \"duration_seconds\":1.500000,\"bytes_to_agent\":3,\"bytes_from_agent\":4}\n"
        );
        assert_eq!(s.matches('\n').count(), 1);
    }

    fn wait_for(what: impl Fn() -> bool) {
        // Bounded: 10 s of 5 ms naps.
        for _ in 0..2000 {
            if what() {
                return;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        panic!("timed out");
    }

    #[test]
    fn the_file_rotates_by_size_and_keeps_n_backups() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.log");
        let mut line = String::new();
        format_record(&record("d:1"), &mut line);
        let cfg = AuditConfig {
            sink: Sink::File(path.clone()),
            max_size: line.len() as u64 * 3,
            max_backups: 2,
            queue: 64,
        };
        let (log, writer) = AuditLog::start(cfg, 1).unwrap();
        for i in 1..=20 {
            assert!(log.push(0, record("d:1")));
            // One at a time, so each write is one record (an empty queue
            // is not enough: the writer may not have written the record it
            // took, and would take the next one into the same write).
            wait_for(|| log.written() == i);
        }
        writer.stop();
        assert_eq!(log.written(), 20);
        let lines = |p: &Path| std::fs::read_to_string(p).map_or(0, |s| s.lines().count());
        let name = |i: u32| dir.path().join(format!("audit.log.{i}"));
        assert_eq!(lines(&name(1)), 3);
        assert_eq!(lines(&name(2)), 3);
        assert!(!name(3).exists(), "only two backups");
        assert!(lines(&path) >= 1 && lines(&path) <= 3);
    }

    #[test]
    fn a_blocked_sink_does_not_hold_the_stop_forever() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("audit.fifo");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        assert!(made.unwrap().success());
        // A reader that never reads: the writer blocks once the pipe is full.
        let _reader = {
            use std::os::unix::fs::OpenOptionsExt;
            OpenOptions::new()
                .read(true)
                .custom_flags(libc_nonblock())
                .open(&fifo)
                .unwrap()
        };
        let cfg = AuditConfig {
            sink: Sink::File(fifo),
            max_size: 0,
            max_backups: 0,
            queue: 8,
        };
        let (log, writer) = AuditLog::start(cfg, 1).unwrap();
        // Until more than the pipe holds; pushes never wait.
        wait_for(|| {
            log.push(0, record("d:1"));
            log.dropped() > 0
        });
        writer.stop(); // returns after STOP_WAIT at most
    }

    /// `O_NONBLOCK` (Linux), without a libc dependency here.
    fn libc_nonblock() -> i32 {
        0o4000
    }

    #[test]
    fn a_full_queue_drops_and_counts_without_waiting() {
        let dir = tempfile::tempdir().unwrap();
        // A directory cannot be opened for appending: the writer fails and
        // the queue is still bounded.
        let cfg = AuditConfig {
            sink: Sink::File(dir.path().to_owned()),
            max_size: 0,
            max_backups: 0,
            queue: 4,
        };
        let (log, writer) = AuditLog::start(cfg, 2).unwrap();
        let pushed = (0..1000).filter(|_| log.push(1, record("d:1"))).count() as u64;
        writer.stop();
        assert_eq!(log.written(), 0);
        assert_eq!(log.dropped(), 1000, "refused pushes plus failed writes");
        assert!(pushed < 1000);
    }
}
