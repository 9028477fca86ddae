//! The io engines: the `--io-engine` flag, the io_uring probe and the
//! resolution of `auto`, the monoio runtime of each engine, and the test
//! helpers that run a body under every engine.
//!
//! Resolution *really* sets up a ring ([`probe_io_uring`]:
//! `io_uring_setup` plus one `NOP` through `io_uring_enter`), because the
//! ways io_uring is unavailable only show up as errno values at run time:
//! `EPERM` from a seccomp profile (Docker's and containerd's defaults block
//! it) or from `kernel.io_uring_disabled`, `ENOSYS` on old kernels, `ENOMEM`
//! when `RLIMIT_MEMLOCK` is too small for the ring on kernels before 5.12.
//! `auto` falls back to epoll and keeps the reason for the start-up log
//! line; an explicit `io-uring` fails with an [`Error::IoUringUnavailable`]
//! that says what to change.
//!
//! [`block_on`] runs a future on a fresh runtime of a given engine, and
//! [`run_on_each_engine`] runs a test body under every engine this machine
//! supports, so every real-socket test covers io_uring and epoll. They are
//! plain public functions so other crates' tests can use them.

use std::{cell::Cell, fmt, future::Future, io, str::FromStr, sync::OnceLock, time::Duration};

use monoio::{IoUringDriver, LegacyDriver, RuntimeBuilder, time::TimeDriver};

use crate::Error;

/// The `--io-engine` flag: which io engine the operator asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum IoEngine {
    /// io_uring when the kernel allows it, epoll otherwise.
    #[default]
    Auto,
    /// io_uring or fail at start-up.
    IoUring,
    /// epoll (monoio's "legacy" driver) even when io_uring works.
    Epoll,
}

impl IoEngine {
    /// The flag values, in the order they are documented.
    pub const VALUES: [&'static str; 3] = ["auto", "io-uring", "epoll"];

    /// The flag value for this choice.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::IoUring => "io-uring",
            Self::Epoll => "epoll",
        }
    }
}

impl fmt::Display for IoEngine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for IoEngine {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(Self::Auto),
            "io-uring" => Ok(Self::IoUring),
            "epoll" => Ok(Self::Epoll),
            other => Err(Error::InvalidIoEngine(other.to_owned())),
        }
    }
}

/// The io engine a runtime actually runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Engine {
    /// monoio's `IoUringDriver`.
    IoUring,
    /// monoio's `LegacyDriver` (epoll via mio).
    Epoll,
}

impl Engine {
    /// Every engine, io_uring first.
    pub const ALL: [Self; 2] = [Self::IoUring, Self::Epoll];

    /// Name as used in flags and logs (`io-uring`, `epoll`).
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::IoUring => "io-uring",
            Self::Epoll => "epoll",
        }
    }
}

impl fmt::Display for Engine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Ring size used by [`probe_io_uring`] (tiny: the probe only checks that the
/// syscalls are allowed).
pub const PROBE_ENTRIES: u32 = 4;

/// Default submission-queue size of each worker's ring (monoio's default).
pub const DEFAULT_URING_ENTRIES: u32 = 1024;

/// Checks that io_uring works here: sets up a small ring (`io_uring_setup`)
/// and round-trips one `NOP` through it (`io_uring_enter`).
///
/// # Errors
///
/// The kernel's error, e.g. `EPERM` (seccomp, `kernel.io_uring_disabled`),
/// `ENOSYS` (no io_uring), `ENOMEM` (memlock). [`io_uring_hint`] explains
/// each.
pub fn probe_io_uring() -> io::Result<()> {
    probe_io_uring_entries(PROBE_ENTRIES)
}

/// [`probe_io_uring`] with a ring of `entries` entries, to also check that a
/// ring of the configured size fits the memlock limit.
///
/// # Errors
///
/// As [`probe_io_uring`].
#[allow(unsafe_code)]
pub fn probe_io_uring_entries(entries: u32) -> io::Result<()> {
    const PROBE_USER_DATA: u64 = 0x6b6f_6e6e; // "konn"
    let mut ring = io_uring::IoUring::new(entries)?;
    let nop = io_uring::opcode::Nop::new()
        .build()
        .user_data(PROBE_USER_DATA);
    // SAFETY: a NOP entry points at no memory, so nothing has to outlive its
    // submission; the ring is fresh, so the queue has room.
    unsafe { ring.submission().push(&nop) }
        .map_err(|_| io::Error::other("io_uring probe: submission queue full"))?;
    ring.submit_and_wait(1)?;
    let cqe = ring
        .completion()
        .next()
        .ok_or_else(|| io::Error::other("io_uring probe: no completion for NOP"))?;
    if cqe.user_data() != PROBE_USER_DATA {
        return Err(io::Error::other("io_uring probe: unexpected completion"));
    }
    if cqe.result() < 0 {
        return Err(io::Error::from_raw_os_error(-cqe.result()));
    }
    Ok(())
}

/// One line saying why io_uring is unavailable and what to do about it, for
/// an error returned by [`probe_io_uring`].
pub fn io_uring_hint(err: &io::Error) -> &'static str {
    match err.raw_os_error() {
        Some(libc::EPERM | libc::EACCES) => {
            "blocked by a seccomp profile (Docker's and containerd's defaults deny \
             io_uring_setup) or by sysctl kernel.io_uring_disabled"
        }
        Some(libc::ENOSYS) => "this kernel has no io_uring (it needs Linux 5.6 or later)",
        Some(libc::ENOMEM) => {
            "not enough locked memory for the ring: raise RLIMIT_MEMLOCK (ulimit -l) \
             or lower the ring size"
        }
        Some(libc::EINVAL) => "the kernel rejected the ring parameters (kernel too old?)",
        _ => "io_uring could not be set up",
    }
}

/// The outcome of [`resolve`]: the engine to run and, for `auto`, why
/// io_uring was not chosen.
#[derive(Debug)]
pub struct ResolvedEngine {
    pub(super) requested: IoEngine,
    pub(super) engine: Engine,
    pub(super) fallback: Option<io::Error>,
}

impl ResolvedEngine {
    /// What the operator asked for.
    pub fn requested(&self) -> IoEngine {
        self.requested
    }

    /// The engine in use.
    pub fn engine(&self) -> Engine {
        self.engine
    }

    /// Why `auto` fell back to epoll, if it did.
    pub fn fallback_reason(&self) -> Option<&io::Error> {
        self.fallback.as_ref()
    }

    /// Logs the choice once at start-up (`info`, or `warn` for a fallback).
    pub fn log(&self, workers: usize) {
        match &self.fallback {
            None if self.engine == Engine::IoUring => tracing::info!(
                engine = %self.engine,
                requested = %self.requested,
                ring_setup = RingSetup::chosen().as_str(),
                workers,
                "io engine selected"
            ),
            None => tracing::info!(
                engine = %self.engine,
                requested = %self.requested,
                workers,
                "io engine selected"
            ),
            Some(reason) => tracing::warn!(
                engine = %self.engine,
                requested = %self.requested,
                workers,
                reason = %reason,
                hint = io_uring_hint(reason),
                "io_uring unavailable, falling back to epoll"
            ),
        }
    }
}

/// Turns the requested engine into the one to use, probing io_uring with a
/// ring of [`DEFAULT_URING_ENTRIES`].
///
/// # Errors
///
/// [`Error::IoUringUnavailable`] when `io-uring` was requested and the probe
/// fails.
pub fn resolve(requested: IoEngine) -> Result<ResolvedEngine, Error> {
    resolve_with_probe(requested, || probe_io_uring_entries(DEFAULT_URING_ENTRIES))
}

/// [`resolve`] with the probe supplied by the caller (tests inject failures;
/// [`Workers::start`] probes with the configured ring size).
///
/// # Errors
///
/// As [`resolve`].
pub fn resolve_with_probe(
    requested: IoEngine,
    probe: impl FnOnce() -> io::Result<()>,
) -> Result<ResolvedEngine, Error> {
    let (engine, fallback) = match requested {
        IoEngine::Epoll => (Engine::Epoll, None),
        IoEngine::IoUring => match probe() {
            Ok(()) => (Engine::IoUring, None),
            Err(cause) => return Err(Error::IoUringUnavailable(cause)),
        },
        IoEngine::Auto => match probe() {
            Ok(()) => (Engine::IoUring, None),
            Err(cause) => (Engine::Epoll, Some(cause)),
        },
    };
    Ok(ResolvedEngine {
        requested,
        engine,
        fallback,
    })
}

/// A monoio runtime of either engine, timers enabled.
pub(super) enum EngineRuntime {
    IoUring(monoio::Runtime<TimeDriver<IoUringDriver>>),
    Epoll(monoio::Runtime<TimeDriver<LegacyDriver>>),
}

/// Test hook: the next this-many io_uring runtime builds fail with ENOMEM.
#[cfg(test)]
pub(super) static FAIL_URING_BUILDS: std::sync::atomic::AtomicUsize =
    std::sync::atomic::AtomicUsize::new(0);

/// Threads shared by every worker for the few blocking calls konn makes
/// (name resolution through `getaddrinfo`); `monoio::spawn_blocking` runs
/// on them.
pub const BLOCKING_THREADS: usize = 2;

fn blocking_pool() -> monoio::blocking::DefaultThreadPool {
    static POOL: OnceLock<monoio::blocking::DefaultThreadPool> = OnceLock::new();
    POOL.get_or_init(|| monoio::blocking::DefaultThreadPool::new(BLOCKING_THREADS))
        .clone()
}

/// How each worker's io_uring is set up: the task-running modes of the
/// kernel, newest first. konn's rings are used by their worker thread only,
/// so the strictest mode the kernel has is safe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RingSetup {
    /// `IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN` (Linux
    /// 6.1): completion work runs only when the worker enters the kernel to
    /// wait, in one batch, instead of interrupting it whenever a socket
    /// becomes ready.
    DeferTaskrun,
    /// `IORING_SETUP_COOP_TASKRUN | IORING_SETUP_TASKRUN_FLAG` (Linux 5.19):
    /// no inter-processor interrupt for completion work; the worker runs it
    /// at its next system call.
    CoopTaskrun,
    /// No flags (what monoio sets up by default).
    Plain,
}

impl RingSetup {
    /// Every mode, preferred first.
    pub const ALL: [Self; 3] = [Self::DeferTaskrun, Self::CoopTaskrun, Self::Plain];

    /// Name for logs and `KONN_IO_URING_SETUP`: `defer`, `coop`, `plain`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::DeferTaskrun => "defer",
            Self::CoopTaskrun => "coop",
            Self::Plain => "plain",
        }
    }

    fn builder(self) -> io_uring::Builder {
        let mut b = io_uring::IoUring::builder();
        match self {
            Self::DeferTaskrun => {
                b.setup_single_issuer().setup_defer_taskrun();
            }
            Self::CoopTaskrun => {
                b.setup_coop_taskrun().setup_taskrun_flag();
            }
            Self::Plain => {}
        }
        b
    }

    /// The mode the workers use: the first of [`RingSetup::ALL`] this
    /// kernel accepts (probed once per process with a small ring), or the
    /// one named by the environment variable `KONN_IO_URING_SETUP`
    /// (`defer`, `coop`, `plain`; for measurements) if the kernel accepts
    /// it.
    pub fn chosen() -> Self {
        static CHOSEN: OnceLock<RingSetup> = OnceLock::new();
        *CHOSEN.get_or_init(|| {
            let accepted = |mode: Self| mode.builder().build(PROBE_ENTRIES).is_ok();
            let wanted = std::env::var("KONN_IO_URING_SETUP").ok();
            if let Some(mode) = Self::ALL
                .into_iter()
                .find(|m| wanted.as_deref() == Some(m.as_str()))
                && accepted(mode)
            {
                return mode;
            }
            Self::ALL
                .into_iter()
                .find(|&m| accepted(m))
                .unwrap_or(Self::Plain)
        })
    }
}

impl EngineRuntime {
    pub(super) fn build(engine: Engine, entries: u32) -> io::Result<Self> {
        #[cfg(test)]
        if engine == Engine::IoUring
            && FAIL_URING_BUILDS
                .fetch_update(
                    std::sync::atomic::Ordering::AcqRel,
                    std::sync::atomic::Ordering::Acquire,
                    |n| n.checked_sub(1),
                )
                .is_ok()
        {
            return Err(io::Error::from_raw_os_error(libc::ENOMEM));
        }
        Ok(match engine {
            Engine::IoUring => Self::IoUring(
                RuntimeBuilder::<IoUringDriver>::new()
                    .uring_builder(RingSetup::chosen().builder())
                    .with_entries(entries)
                    .enable_timer()
                    .attach_thread_pool(Box::new(blocking_pool()))
                    .build()?,
            ),
            Engine::Epoll => Self::Epoll(
                RuntimeBuilder::<LegacyDriver>::new()
                    .with_entries(entries)
                    .enable_timer()
                    .attach_thread_pool(Box::new(blocking_pool()))
                    .build()?,
            ),
        })
    }

    fn engine(&self) -> Engine {
        match self {
            Self::IoUring(_) => Engine::IoUring,
            Self::Epoll(_) => Engine::Epoll,
        }
    }

    pub(super) fn block_on<F: Future>(&mut self, future: F) -> F::Output {
        let _current = CurrentEngineGuard::set(self.engine());
        match self {
            // The data ring (`io::uring`) lives as long as this `block_on`:
            // it is set up on the runtime's thread before the future runs
            // and closed after it, while the runtime can still reap.
            Self::IoUring(rt) => rt.block_on(async move {
                let ring = super::uring::Ring::start();
                let out = future.await;
                if let Some(ring) = ring {
                    ring.close().await;
                    settle_io().await;
                }
                out
            }),
            Self::Epoll(rt) => rt.block_on(future),
        }
    }
}

thread_local! {
    static CURRENT_ENGINE: Cell<Option<Engine>> = const { Cell::new(None) };
}

/// Restores the previous thread-local engine when a `block_on` ends.
struct CurrentEngineGuard(Option<Engine>);

impl CurrentEngineGuard {
    fn set(engine: Engine) -> Self {
        Self(CURRENT_ENGINE.with(|c| c.replace(Some(engine))))
    }
}

impl Drop for CurrentEngineGuard {
    fn drop(&mut self) {
        CURRENT_ENGINE.with(|c| c.set(self.0));
    }
}

/// The engine of the runtime running on this thread, if any was started
/// through this module.
pub fn current_engine() -> Option<Engine> {
    CURRENT_ENGINE.with(Cell::get)
}

// ----- test helpers ----------------------------------------------------------

/// Runs `future` to completion on a fresh single-thread runtime of `engine`
/// (timers enabled) on the current thread.
///
/// # Errors
///
/// [`Error::RuntimeBuild`] if the runtime cannot be built (e.g. io_uring is
/// unavailable).
pub fn block_on<F: Future>(engine: Engine, future: F) -> Result<F::Output, Error> {
    let mut runtime = EngineRuntime::build(engine, DEFAULT_URING_ENTRIES).map_err(|source| {
        Error::RuntimeBuild {
            worker: 0,
            engine,
            source,
        }
    })?;
    Ok(runtime.block_on(async move {
        let out = future.await;
        settle_io().await;
        out
    }))
}

/// Lets the io driver finish operations that were cancelled: an in-flight
/// operation dropped by its task (a read or accept raced against a stop)
/// keeps its descriptor until the kernel's answer to the cancellation
/// arrives. If the runtime ended first, that descriptor — and, under
/// io_uring, the ring it waits on — would never be released. Parking the
/// thread on the driver a couple of times collects those answers (they
/// come at once: cancelling a pending accept or read does not wait). Call
/// it as the last step of a runtime's main future, after its tasks ended.
pub async fn settle_io() {
    for _ in 0..2 {
        monoio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Engines usable on this machine: epoll always, io_uring if
/// [`probe_io_uring`] succeeds (probed once per process).
pub fn available_engines() -> Vec<Engine> {
    static URING: OnceLock<bool> = OnceLock::new();
    let uring = *URING.get_or_init(|| probe_io_uring().is_ok());
    if uring {
        vec![Engine::IoUring, Engine::Epoll]
    } else {
        vec![Engine::Epoll]
    }
}

/// Runs `body(engine)` on a fresh runtime for every engine in
/// [`available_engines`] and returns the engines it ran on.
///
/// When io_uring is unavailable the io_uring run is skipped with a note on
/// stderr, unless the environment variable `KONN_REQUIRE_IO_URING` is set,
/// in which case this panics (CI machines that must cover io_uring set it).
///
/// # Panics
///
/// If a runtime cannot be built, or io_uring is required but missing; and
/// whenever `body`'s future panics.
pub fn run_on_each_engine<F, Fut>(mut body: F) -> Vec<Engine>
where
    F: FnMut(Engine) -> Fut,
    Fut: Future<Output = ()>,
{
    let engines = available_engines();
    if !engines.contains(&Engine::IoUring) {
        assert!(
            std::env::var_os("KONN_REQUIRE_IO_URING").is_none(),
            "KONN_REQUIRE_IO_URING is set but io_uring is unavailable: {}",
            probe_io_uring()
                .err()
                .map_or_else(String::new, |e| e.to_string())
        );
        eprintln!("note: io_uring unavailable here; running the epoll variant only");
    }
    for &engine in &engines {
        if let Err(err) = block_on(engine, body(engine)) {
            panic!("{err}");
        }
    }
    engines
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_flag_round_trips() {
        for value in IoEngine::VALUES {
            let engine: IoEngine = value.parse().expect(value);
            assert_eq!(engine.to_string(), value);
        }
        assert_eq!(IoEngine::default(), IoEngine::Auto);
    }

    #[test]
    fn bad_engine_flag_is_named() {
        let err = "io_uring".parse::<IoEngine>().unwrap_err();
        assert!(matches!(&err, Error::InvalidIoEngine(v) if v == "io_uring"));
        assert!(err.to_string().contains("\"io_uring\""));
        assert!("".parse::<IoEngine>().is_err());
        assert!("EPOLL".parse::<IoEngine>().is_err());
    }

    fn eperm() -> io::Result<()> {
        Err(io::Error::from_raw_os_error(libc::EPERM))
    }

    #[test]
    fn auto_falls_back_and_keeps_reason() {
        let resolved = resolve_with_probe(IoEngine::Auto, eperm).unwrap();
        assert_eq!(resolved.engine(), Engine::Epoll);
        assert_eq!(resolved.requested(), IoEngine::Auto);
        assert_eq!(
            resolved.fallback_reason().and_then(io::Error::raw_os_error),
            Some(libc::EPERM)
        );
    }

    #[test]
    fn auto_prefers_io_uring() {
        let resolved = resolve_with_probe(IoEngine::Auto, || Ok(())).unwrap();
        assert_eq!(resolved.engine(), Engine::IoUring);
        assert!(resolved.fallback_reason().is_none());
    }

    #[test]
    fn explicit_io_uring_fails_loudly() {
        let err = resolve_with_probe(IoEngine::IoUring, || {
            Err(io::Error::from_raw_os_error(libc::ENOSYS))
        })
        .unwrap_err();
        assert!(
            matches!(&err, Error::IoUringUnavailable(e) if e.raw_os_error() == Some(libc::ENOSYS))
        );
        assert!(err.to_string().contains("5.6"), "{err}");
    }

    #[test]
    fn epoll_never_probes() {
        let resolved = resolve_with_probe(IoEngine::Epoll, || panic!("probed")).unwrap();
        assert_eq!(resolved.engine(), Engine::Epoll);
    }

    #[test]
    fn hints_cover_the_documented_errnos() {
        let hint = |errno| io_uring_hint(&io::Error::from_raw_os_error(errno));
        assert!(hint(libc::EPERM).contains("seccomp"));
        assert!(hint(libc::ENOMEM).contains("RLIMIT_MEMLOCK"));
        assert!(hint(libc::ENOSYS).contains("kernel"));
        assert_eq!(hint(libc::EIO), "io_uring could not be set up");
    }

    #[test]
    fn current_engine_is_set_inside_block_on() {
        assert_eq!(current_engine(), None);
        let seen = block_on(Engine::Epoll, async { current_engine() }).unwrap();
        assert_eq!(seen, Some(Engine::Epoll));
        assert_eq!(current_engine(), None);
    }
}
