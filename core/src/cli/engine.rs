//! konn's own flags, shared by `proxy-server` and `proxy-agent`: the io
//! engine and workers, HTTP/2 and gRPC limits, per-connection queues, the
//! memory budget, the write/stuck/preface/idle timeouts and the resume
//! window.
//!
//! Upstream has none of these (grpc-go and the Go runtime decide them), so
//! they live in their own `--help` section ([`Section::Konn`]) and have
//! defaults that make a manifest written for upstream run well unchanged.
//! [`EngineFlags::register`] adds them to a [`FlagSet`];
//! [`EngineFlags::from_flags`] reads them back and checks their ranges.

use std::fmt;
use std::time::Duration;

use super::{ByteSizeValue, ChoiceValue, FlagSet, GoDuration, Section};
use crate::io::runtime::{IoEngine, RuntimeConfig};

/// `--io-engine` default: epoll, measured faster than io_uring on the
/// proxy data path (docs/decisions/0003-default-io-engine.md).
pub const DEFAULT_IO_ENGINE: IoEngine = IoEngine::Epoll;
/// `--memory-budget` default: 512 MiB (the buffer pools' default).
pub const DEFAULT_MEMORY_BUDGET: u64 = 512 << 20;
/// `--conn-queue-size` default: 1 MiB per connection and direction (the
/// flow-control marks derive from it: `proto::flow::FlowLimits`).
pub const DEFAULT_CONN_QUEUE_SIZE: u64 = 1 << 20;
/// `--h2-stream-window` default: 1 MiB.
pub const DEFAULT_H2_STREAM_WINDOW: u64 = 1 << 20;
/// `--h2-conn-window` default: 4 MiB.
pub const DEFAULT_H2_CONN_WINDOW: u64 = 4 << 20;
/// `--h2-max-concurrent-streams` default.
pub const DEFAULT_H2_MAX_CONCURRENT_STREAMS: u32 = 1024;
/// `--grpc-max-message-size` default: 4 MiB, grpc-go's receive limit, so
/// konn accepts exactly the messages a Go peer would.
pub const DEFAULT_GRPC_MAX_MESSAGE_SIZE: u64 = 4 << 20;
/// `--write-timeout` default.
pub const DEFAULT_WRITE_TIMEOUT: Duration = Duration::from_secs(60);
/// `--stuck-timeout` default.
pub const DEFAULT_STUCK_TIMEOUT: Duration = Duration::from_secs(120);
/// `--preface-timeout` default: grpc-go's `connectionTimeout` (120 s), the
/// bound upstream puts on a connection's TLS handshake plus HTTP/2 preface.
pub const DEFAULT_PREFACE_TIMEOUT: Duration = Duration::from_secs(120);
/// `--idle-timeout` default: upstream has none (grpc-go's
/// `MaxConnectionIdle` is infinite); 5 minutes frees the descriptor of a
/// connection nobody uses without disturbing clients, which reconnect on
/// GOAWAY.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(300);
/// `--resume-window` default: 10 s. A tunnel cut by a load balancer, a
/// NAT rebinding or a network blip of a few seconds is resumed: the agent
/// retries at once (each attempt bounded to a second while it has parked
/// tunnels), so a 3 s outage plus a TLS handshake and a token review fits
/// with room to spare; a `kubectl exec` stalls at most this long before it
/// fails as it would without resume (docs/design/resume.md).
pub const DEFAULT_RESUME_WINDOW: Duration = Duration::from_secs(10);
/// Longest `--resume-window` accepted: parked connections hold their
/// destination sockets and in-flight bytes for the whole window.
pub const MAX_RESUME_WINDOW: Duration = Duration::from_secs(600);
/// `--tls-reload-interval` default: how often certificate, key and CA
/// files are checked for changes (docs/decisions/0004-certificate-reload.md).
pub const DEFAULT_TLS_RELOAD_INTERVAL: Duration = Duration::from_secs(10);

/// Largest HTTP/2 window (RFC 9113 §6.9.1: 2^31 - 1).
const MAX_WINDOW: u64 = (1 << 31) - 1;
/// Smallest window konn accepts: the RFC's initial 65 535 (grpc-go also
/// ignores smaller values); anything less only slows transfers down.
const MIN_WINDOW: u64 = 65_535;
/// Smallest per-connection queue: one maximal DATA payload plus framing.
const MIN_CONN_QUEUE: u64 = 16 << 10;
/// Smallest memory budget accepted.
const MIN_MEMORY_BUDGET: u64 = 1 << 20;
/// Largest gRPC message accepted (the limit must fit in memory, not only in
/// the 32-bit length prefix).
const MAX_GRPC_MESSAGE: u64 = 1 << 30;

/// konn's engine flags after range checks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineFlags {
    /// `--io-engine`: io_uring, epoll, or io_uring with fallback.
    pub io_engine: IoEngine,
    /// `--workers`: worker threads; 0 in the flag means one per CPU the
    /// process may use (cgroup quota and affinity mask respected), resolved
    /// here.
    pub workers: usize,
    /// `--pin-cores`: pin worker `i` to the `i`-th allowed CPU.
    pub pin_cores: bool,
    /// `--memory-budget`: cap on pooled buffer memory, all workers together.
    pub memory_budget: usize,
    /// `--conn-queue-size`: the per-connection, per-direction queue size the
    /// flow-control marks derive from (`proto::flow::FlowLimits`), and the
    /// tunnel send queue's high-water mark.
    pub conn_queue_size: usize,
    /// `--h2-stream-window`: HTTP/2 per-stream receive window we advertise.
    pub h2_stream_window: u32,
    /// `--h2-conn-window`: HTTP/2 connection receive window.
    pub h2_conn_window: u32,
    /// `--h2-max-concurrent-streams`: streams a peer may open at once on one
    /// HTTP/2 connection we accept.
    pub h2_max_concurrent_streams: u32,
    /// `--grpc-max-message-size`: largest gRPC message we accept.
    pub grpc_max_message_size: u32,
    /// `--write-timeout`: a socket that accepts no byte for this long while
    /// data waits for it is closed. `None`: disabled (flag value 0).
    pub write_timeout: Option<Duration>,
    /// `--stuck-timeout`: a proxied connection whose queue towards its
    /// receiver stays non-empty, with nothing drained, for this long is
    /// closed.
    /// `None`: disabled (flag value 0).
    pub stuck_timeout: Option<Duration>,
    /// `--preface-timeout`: an accepted HTTP/2 connection (agent port, gRPC
    /// frontend) whose peer has not sent its preface and first SETTINGS
    /// this long after accept (TLS handshake included) is closed. `None`:
    /// disabled (flag value 0).
    pub preface_timeout: Option<Duration>,
    /// `--idle-timeout`: an HTTP/2 connection without streams for this long
    /// is closed with GOAWAY. `None`: disabled (flag value 0).
    pub idle_timeout: Option<Duration>,
    /// `--tls-reload-interval`: how often TLS files are checked for
    /// changes. `None`: never reloaded (flag value 0).
    pub tls_reload_interval: Option<Duration>,
    /// `--resume-window`: how long both sides keep a broken tunnel's
    /// connections parked for the agent to resume it (konn peers only,
    /// docs/design/resume.md). `None`: resume off (flag value 0).
    pub resume_window: Option<Duration>,
}

/// A konn flag value outside its range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineError {
    /// The flag, without dashes.
    pub flag: &'static str,
    /// The value given, as rendered.
    pub value: String,
    /// What is allowed.
    pub allowed: String,
}

impl fmt::Display for EngineError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "--{}={} is out of range: {}",
            self.flag, self.value, self.allowed
        )
    }
}

impl std::error::Error for EngineError {}

impl Default for EngineFlags {
    /// The flags' defaults (what [`EngineFlags::from_flags`] returns when
    /// none is given).
    fn default() -> Self {
        Self {
            io_engine: DEFAULT_IO_ENGINE,
            workers: RuntimeConfig::default().workers,
            pin_cores: false,
            memory_budget: to_usize(DEFAULT_MEMORY_BUDGET),
            conn_queue_size: to_usize(DEFAULT_CONN_QUEUE_SIZE),
            h2_stream_window: to_u32(DEFAULT_H2_STREAM_WINDOW),
            h2_conn_window: to_u32(DEFAULT_H2_CONN_WINDOW),
            h2_max_concurrent_streams: DEFAULT_H2_MAX_CONCURRENT_STREAMS,
            grpc_max_message_size: to_u32(DEFAULT_GRPC_MAX_MESSAGE_SIZE),
            write_timeout: Some(DEFAULT_WRITE_TIMEOUT),
            stuck_timeout: Some(DEFAULT_STUCK_TIMEOUT),
            preface_timeout: Some(DEFAULT_PREFACE_TIMEOUT),
            idle_timeout: Some(DEFAULT_IDLE_TIMEOUT),
            tls_reload_interval: Some(DEFAULT_TLS_RELOAD_INTERVAL),
            resume_window: Some(DEFAULT_RESUME_WINDOW),
        }
    }
}

impl EngineFlags {
    /// Adds the konn flags to `flags`, in the [`Section::Konn`] section.
    pub fn register(flags: &mut FlagSet) {
        let previous = flags.section;
        flags.set_section(Section::Konn);
        flags.add(
            "io-engine",
            "I/O engine: 'io-uring', 'epoll', or 'auto' (io_uring when the kernel allows it, else \
             epoll; the choice and the reason are logged at start).",
            ChoiceValue::new(DEFAULT_IO_ENGINE.as_str(), &IoEngine::VALUES),
        );
        flags.add_int(
            "workers",
            0,
            "Worker threads, each running its own event loop. 0 means one per CPU this process may \
             use (CPU quota and affinity respected).",
        );
        flags.add_bool(
            "pin-cores",
            false,
            "Pin each worker thread to its own CPU. Useful with dedicated cores; leave off for \
             pods with a CPU quota.",
        );
        flags.add(
            "memory-budget",
            "Cap on the memory of all I/O buffers together. When it is used up, konn stops reading \
             from sockets until buffers are freed, instead of growing. Bytes, or with a suffix: \
             Ki, Mi, Gi.",
            ByteSizeValue(DEFAULT_MEMORY_BUDGET),
        );
        flags.add(
            "conn-queue-size",
            "Queue size per proxied connection and direction. A connection whose queue grows past \
             half of it is paused at its source (between konn peers) or slowed through HTTP/2 flow \
             control (past four times it), never closed while it drains; other connections on the \
             same tunnel keep flowing.",
            ByteSizeValue(DEFAULT_CONN_QUEUE_SIZE),
        );
        flags.add(
            "h2-stream-window",
            "HTTP/2 receive window per stream, advertised to gRPC peers (65535 to 2Gi-1).",
            ByteSizeValue(DEFAULT_H2_STREAM_WINDOW),
        );
        flags.add(
            "h2-conn-window",
            "HTTP/2 receive window per connection, all streams together (65535 to 2Gi-1).",
            ByteSizeValue(DEFAULT_H2_CONN_WINDOW),
        );
        flags.add_int(
            "h2-max-concurrent-streams",
            i64::from(DEFAULT_H2_MAX_CONCURRENT_STREAMS),
            "Streams a peer may have open at once on one HTTP/2 connection konn accepts \
             (SETTINGS_MAX_CONCURRENT_STREAMS).",
        );
        flags.add(
            "grpc-max-message-size",
            "Largest gRPC message accepted. The default is grpc-go's, the limit upstream peers \
             apply; lowering it breaks peers that send larger DATA packets.",
            ByteSizeValue(DEFAULT_GRPC_MAX_MESSAGE_SIZE),
        );
        flags.add_duration(
            "write-timeout",
            GoDuration::from_std(DEFAULT_WRITE_TIMEOUT),
            "Close a socket (frontend, destination or tunnel) that accepts no bytes for this long \
             while data is waiting for it. 0 disables.",
        );
        flags.add_duration(
            "stuck-timeout",
            GoDuration::from_std(DEFAULT_STUCK_TIMEOUT),
            "Close a proxied connection whose queue towards its receiver is not empty and drains \
             nothing for this long (for example an HTTP/2 stream whose window never reopens). 0 \
             disables.",
        );
        flags.add_duration(
            "preface-timeout",
            GoDuration::from_std(DEFAULT_PREFACE_TIMEOUT),
            "Close an HTTP/2 connection (agent port, gRPC frontend, the agent's tunnels) whose peer \
             has not sent its connection preface and first SETTINGS this long after the \
             connection was accepted or dialled, TLS handshake included. 0 disables.",
        );
        flags.add_duration(
            "idle-timeout",
            GoDuration::from_std(DEFAULT_IDLE_TIMEOUT),
            "Close (GOAWAY) an HTTP/2 connection that has had no stream for this long. 0 disables.",
        );
        flags.add_duration(
            "tls-reload-interval",
            GoDuration::from_std(DEFAULT_TLS_RELOAD_INTERVAL),
            "How often certificate, key and CA files are checked for changes. A change is used for \
             new connections (established ones keep theirs); files that fail the start-up checks \
             are logged and the previous ones kept. 0 disables reloading.",
        );
        flags.add_duration(
            "resume-window",
            GoDuration::from_std(DEFAULT_RESUME_WINDOW),
            "When the connection under an agent tunnel breaks, keep its proxied connections open \
             this long for the agent to reconnect to the same proxy-server and resume them, \
             losing no byte (konn agent and konn server only; both must enable it). At most 10m. \
             0 disables: a broken tunnel closes its connections at once, as upstream.",
        );
        flags.set_section(previous);
    }

    /// Reads the flags added by [`register`](Self::register).
    ///
    /// # Errors
    ///
    /// The first value out of range.
    pub fn from_flags(flags: &FlagSet) -> Result<Self, EngineError> {
        let io_engine = flags
            .get_choice("io-engine")
            .parse::<IoEngine>()
            // The flag only holds IoEngine::VALUES.
            .unwrap_or(DEFAULT_IO_ENGINE);
        let workers = flags.get_int("workers");
        let workers = match usize::try_from(workers) {
            Ok(0) => RuntimeConfig::default().workers,
            Ok(n) if n <= RuntimeConfig::MAX_WORKERS => n,
            _ => {
                return Err(EngineError {
                    flag: "workers",
                    value: workers.to_string(),
                    allowed: format!(
                        "must be between 0 (one per CPU) and {}",
                        RuntimeConfig::MAX_WORKERS
                    ),
                });
            }
        };
        let memory_budget = sized(flags, "memory-budget", MIN_MEMORY_BUDGET, u64::MAX)?;
        let conn_queue_size = sized(flags, "conn-queue-size", MIN_CONN_QUEUE, memory_budget)?;
        let h2_stream_window = sized(flags, "h2-stream-window", MIN_WINDOW, MAX_WINDOW)?;
        let h2_conn_window = sized(flags, "h2-conn-window", MIN_WINDOW, MAX_WINDOW)?;
        let streams = flags.get_int("h2-max-concurrent-streams");
        let h2_max_concurrent_streams = u32::try_from(streams)
            .ok()
            .filter(|&n| n >= 1 && u64::from(n) <= MAX_WINDOW)
            .ok_or_else(|| EngineError {
                flag: "h2-max-concurrent-streams",
                value: streams.to_string(),
                allowed: format!("must be between 1 and {MAX_WINDOW}"),
            })?;
        let grpc_max = sized(
            flags,
            "grpc-max-message-size",
            MIN_CONN_QUEUE,
            MAX_GRPC_MESSAGE,
        )?;
        Ok(Self {
            io_engine,
            workers,
            pin_cores: flags.get_bool("pin-cores"),
            memory_budget: to_usize(memory_budget),
            conn_queue_size: to_usize(conn_queue_size),
            h2_stream_window: to_u32(h2_stream_window),
            h2_conn_window: to_u32(h2_conn_window),
            h2_max_concurrent_streams,
            grpc_max_message_size: to_u32(grpc_max),
            write_timeout: timeout(flags, "write-timeout")?,
            stuck_timeout: timeout(flags, "stuck-timeout")?,
            preface_timeout: timeout(flags, "preface-timeout")?,
            idle_timeout: timeout(flags, "idle-timeout")?,
            tls_reload_interval: timeout(flags, "tls-reload-interval")?,
            resume_window: resume_window(flags)?,
        })
    }
}

/// A size flag checked against `min..=max`.
fn sized(flags: &FlagSet, flag: &'static str, min: u64, max: u64) -> Result<u64, EngineError> {
    let v = flags.get_byte_size(flag);
    if (min..=max).contains(&v) {
        return Ok(v);
    }
    let allowed = if max == u64::MAX {
        format!("must be at least {}", ByteSizeValue::format(min))
    } else if flag == "conn-queue-size" {
        format!(
            "must be at least {} and at most --memory-budget ({})",
            ByteSizeValue::format(min),
            ByteSizeValue::format(max)
        )
    } else {
        format!(
            "must be between {} and {}",
            ByteSizeValue::format(min),
            ByteSizeValue::format(max)
        )
    };
    Err(EngineError {
        flag,
        value: ByteSizeValue::format(v),
        allowed,
    })
}

/// A timeout flag: 0 disables, negative is refused.
fn timeout(flags: &FlagSet, flag: &'static str) -> Result<Option<Duration>, EngineError> {
    let d = flags.get_duration(flag);
    match d.to_std() {
        Some(Duration::ZERO) => Ok(None),
        Some(d) => Ok(Some(d)),
        None => Err(EngineError {
            flag,
            value: d.to_string(),
            allowed: "must not be negative (0 disables)".to_owned(),
        }),
    }
}

/// `--resume-window`: 0 turns resume off, negative and more than
/// [`MAX_RESUME_WINDOW`] are refused.
fn resume_window(flags: &FlagSet) -> Result<Option<Duration>, EngineError> {
    let window = timeout(flags, "resume-window")?;
    match window {
        Some(w) if w > MAX_RESUME_WINDOW => Err(EngineError {
            flag: "resume-window",
            value: flags.get_duration("resume-window").to_string(),
            allowed: "must be at most 10m0s (0 disables resume)".to_owned(),
        }),
        w => Ok(w),
    }
}

fn to_usize(v: u64) -> usize {
    usize::try_from(v).unwrap_or(usize::MAX)
}

fn to_u32(v: u64) -> u32 {
    u32::try_from(v).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<EngineFlags, EngineError> {
        let mut fs = FlagSet::new("t");
        EngineFlags::register(&mut fs);
        fs.parse(args.iter().copied()).expect("parse");
        EngineFlags::from_flags(&fs)
    }

    #[test]
    fn defaults() {
        let e = parse(&[]).unwrap();
        assert_eq!(e.io_engine, IoEngine::Epoll);
        assert_eq!(e.workers, RuntimeConfig::default().workers);
        assert!(e.workers >= 1);
        assert!(!e.pin_cores);
        assert_eq!(e.memory_budget, 512 << 20);
        assert_eq!(e.conn_queue_size, 1 << 20);
        assert_eq!(e.h2_stream_window, 1 << 20);
        assert_eq!(e.h2_conn_window, 4 << 20);
        assert_eq!(e.h2_max_concurrent_streams, 1024);
        assert_eq!(e.grpc_max_message_size, 4 << 20);
        assert_eq!(e.write_timeout, Some(Duration::from_secs(60)));
        assert_eq!(e.stuck_timeout, Some(Duration::from_secs(120)));
        assert_eq!(e.preface_timeout, Some(Duration::from_secs(120)));
        assert_eq!(e.idle_timeout, Some(Duration::from_secs(300)));
        assert_eq!(e.tls_reload_interval, Some(Duration::from_secs(10)));
        assert_eq!(e.resume_window, Some(Duration::from_secs(10)));
        assert_eq!(e, EngineFlags::default());
    }

    #[test]
    fn values_are_read() {
        let e = parse(&[
            "--io-engine=epoll",
            "--workers=3",
            "--pin-cores",
            "--memory-budget=1Gi",
            "--conn-queue-size=256Ki",
            "--h2-stream-window=65535",
            "--h2-conn-window=2147483647",
            "--h2-max-concurrent-streams=100",
            "--grpc-max-message-size=16Mi",
            "--write-timeout=0",
            "--stuck-timeout=5m",
            "--preface-timeout=10s",
            "--idle-timeout=0",
            "--resume-window=0",
        ])
        .unwrap();
        assert_eq!(e.io_engine, IoEngine::Epoll);
        assert_eq!(e.workers, 3);
        assert!(e.pin_cores);
        assert_eq!(e.memory_budget, 1 << 30);
        assert_eq!(e.conn_queue_size, 256 << 10);
        assert_eq!(e.h2_stream_window, 65_535);
        assert_eq!(e.h2_conn_window, (1 << 31) - 1);
        assert_eq!(e.h2_max_concurrent_streams, 100);
        assert_eq!(e.grpc_max_message_size, 16 << 20);
        assert_eq!(e.write_timeout, None);
        assert_eq!(e.stuck_timeout, Some(Duration::from_secs(300)));
        assert_eq!(e.preface_timeout, Some(Duration::from_secs(10)));
        assert_eq!(e.idle_timeout, None);
        assert_eq!(e.resume_window, None);
        let e = parse(&["--resume-window=2m"]).unwrap();
        assert_eq!(e.resume_window, Some(Duration::from_secs(120)));
    }

    #[test]
    fn io_engine_rejects_unknown_while_parsing() {
        let mut fs = FlagSet::new("t");
        EngineFlags::register(&mut fs);
        let err = fs.parse(["--io-engine=uring"]).unwrap_err();
        assert_eq!(
            err.to_string(),
            r#"invalid argument "uring" for "--io-engine" flag: must be one of: auto, io-uring, epoll"#
        );
    }

    #[test]
    fn ranges() {
        let cases: &[(&str, &str)] = &[
            (
                "--workers=-1",
                "--workers=-1 is out of range: must be between 0 (one per CPU) and 1024",
            ),
            (
                "--workers=1025",
                "--workers=1025 is out of range: must be between 0 (one per CPU) and 1024",
            ),
            (
                "--memory-budget=1000",
                "--memory-budget=1000 is out of range: must be at least 1Mi",
            ),
            (
                "--conn-queue-size=1Ki",
                "--conn-queue-size=1Ki is out of range: must be at least 16Ki and at most \
                 --memory-budget (512Mi)",
            ),
            (
                "--conn-queue-size=1Gi",
                "--conn-queue-size=1Gi is out of range: must be at least 16Ki and at most \
                 --memory-budget (512Mi)",
            ),
            (
                "--h2-stream-window=65534",
                "--h2-stream-window=65534 is out of range: must be between 65535 and 2147483647",
            ),
            (
                "--h2-conn-window=2Gi",
                "--h2-conn-window=2Gi is out of range: must be between 65535 and 2147483647",
            ),
            (
                "--h2-max-concurrent-streams=0",
                "--h2-max-concurrent-streams=0 is out of range: must be between 1 and 2147483647",
            ),
            (
                "--grpc-max-message-size=2Gi",
                "--grpc-max-message-size=2Gi is out of range: must be between 16Ki and 1Gi",
            ),
            (
                "--write-timeout=-1s",
                "--write-timeout=-1s is out of range: must not be negative (0 disables)",
            ),
            (
                "--stuck-timeout=-1ms",
                "--stuck-timeout=-1ms is out of range: must not be negative (0 disables)",
            ),
            (
                "--resume-window=-1s",
                "--resume-window=-1s is out of range: must not be negative (0 disables)",
            ),
            (
                "--resume-window=11m",
                "--resume-window=11m0s is out of range: must be at most 10m0s (0 disables resume)",
            ),
        ];
        for &(arg, want) in cases {
            assert_eq!(parse(&[arg]).unwrap_err().to_string(), want, "{arg}");
        }
    }

    #[test]
    fn flags_are_in_the_konn_section() {
        let mut fs = FlagSet::new("t");
        EngineFlags::register(&mut fs);
        assert!(fs.flags().iter().all(|f| f.section() == Section::Konn));
        assert!(fs.usage(Section::Upstream).is_empty());
        let usage = fs.usage(Section::Konn);
        assert!(usage.contains("--io-engine string"), "{usage}");
        assert!(usage.contains("(default \"epoll\")"), "{usage}");
        assert!(usage.contains("--memory-budget size"), "{usage}");
        assert!(usage.contains("(default 512Mi)"), "{usage}");
        assert!(usage.contains("(default 2m0s)"), "{usage}");
    }
}
