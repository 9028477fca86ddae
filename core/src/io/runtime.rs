//! The thread-per-core runtime: io engine choice, worker threads, stop signal.
//!
//! # Engine choice
//!
//! The flag value [`IoEngine`] (`auto`, `io-uring`, `epoll`) is turned into
//! the [`Engine`] actually used by [`resolve`]. Resolution *really* sets up a
//! ring ([`probe_io_uring`]: `io_uring_setup` plus one `NOP` through
//! `io_uring_enter`), because the ways io_uring is unavailable only show up
//! as errno values at run time: `EPERM` from a seccomp profile (Docker's and
//! containerd's defaults block it) or from `kernel.io_uring_disabled`,
//! `ENOSYS` on old kernels, `ENOMEM` when `RLIMIT_MEMLOCK` is too small for
//! the ring on kernels before 5.12. `auto` falls back to epoll and keeps the
//! reason for the start-up log line; an explicit `io-uring` fails with an
//! [`Error::IoUringUnavailable`] that says what to change.
//!
//! # Workers
//!
//! [`Workers::start`] starts one OS thread per worker. Each builds its own
//! monoio runtime (timers enabled) for the resolved engine, optionally pins
//! itself to one allowed CPU, and then runs the caller's
//! `Fn(WorkerCtx<T>) -> impl Future` to completion. Start-up is two-phase:
//! every worker first builds its runtime and reports back, and only when all
//! succeeded are they told to run. If building an io_uring runtime fails on
//! any worker under `auto` (a ring can pass the probe and still fail later,
//! e.g. on memlock with many rings), *all* workers rebuild on epoll, so a
//! process never mixes engines (migrated sockets rely on one engine: monoio
//! keeps sockets blocking under io_uring and non-blocking under epoll).
//!
//! Each worker gets a [`WorkerCtx`]: its index, the engine, a sender into the
//! cross-core [`Mesh`] and its own inbox, a [`StopToken`],
//! and its per-core [`BufPool`]. A worker also runs a small maintenance task
//! that lets its buffer pool reclaim and trim memory
//! ([`PoolConfig::maintenance_interval`]).
//!
//! # Stopping
//!
//! [`Stopper::stop`] (from any thread) sets a flag and wakes one watcher task
//! per worker, which wakes every local [`StopToken::stopped`] future. Worker
//! futures are expected to return once their token fires; [`Workers::join`]
//! waits for that. Nothing is cancelled forcibly: protocol drivers decide how
//! to drain.
//!
//! # Tests
//!
//! [`block_on`] runs a future on a fresh runtime of a given engine, and
//! [`run_on_each_engine`] runs a test body under every engine this machine
//! supports, so every real-socket test covers io_uring and epoll. They are
//! plain public functions so other crates' tests can use them.

use std::{
    cell::{Cell, RefCell},
    fmt,
    future::{Future, poll_fn},
    io,
    panic::AssertUnwindSafe,
    pin::{Pin, pin},
    rc::{Rc, Weak},
    str::FromStr,
    sync::{
        Arc, OnceLock,
        atomic::{AtomicBool, Ordering, fence},
        mpsc,
    },
    task::{Context, Poll, Waker},
    thread,
    time::Duration,
};

use crossbeam_queue::SegQueue;
use crossbeam_utils::atomic::AtomicCell;
use monoio::{IoUringDriver, LegacyDriver, RuntimeBuilder, time::TimeDriver};

use super::{
    pool::{BufPool, MemoryBudget, PoolConfig},
    xcore::{Mesh, MeshReceiver, MeshSender},
};
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
    requested: IoEngine,
    engine: Engine,
    fallback: Option<io::Error>,
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

/// Settings of [`Workers::start`].
#[derive(Debug, Clone)]
pub struct RuntimeConfig {
    /// Number of worker threads (default: the CPUs this process may use).
    pub workers: usize,
    /// Pin worker `i` to the `i`-th CPU of the process's affinity mask
    /// (modulo its size). Off by default: pods with CPU quotas but no
    /// dedicated cores are better served by the scheduler.
    pub pin_cores: bool,
    /// Requested io engine.
    pub engine: IoEngine,
    /// io_uring submission-queue entries per worker (monoio raises values
    /// below 256 to 256); also the epoll event batch size.
    pub uring_entries: u32,
    /// Capacity of each worker's cross-core inbox (messages).
    pub inbox_capacity: usize,
    /// Buffer pools and the global memory budget.
    pub pool: PoolConfig,
    /// Thread name prefix; worker `i` is named `{thread_name}-{i}`.
    pub thread_name: String,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        Self {
            workers: thread::available_parallelism().map_or(1, |n| n.get()),
            pin_cores: false,
            engine: IoEngine::Auto,
            uring_entries: DEFAULT_URING_ENTRIES,
            inbox_capacity: 4096,
            pool: PoolConfig::default(),
            thread_name: "konn-worker".to_owned(),
        }
    }
}

impl RuntimeConfig {
    /// Largest accepted [`workers`](Self::workers) value.
    pub const MAX_WORKERS: usize = 1024;

    fn validate(&self) -> Result<(), Error> {
        if self.workers == 0 {
            return Err(Error::InvalidConfig("workers must be at least 1"));
        }
        if self.workers > Self::MAX_WORKERS {
            return Err(Error::InvalidConfig("workers must be at most 1024"));
        }
        if self.inbox_capacity == 0 {
            return Err(Error::InvalidConfig("inbox_capacity must be at least 1"));
        }
        if self.uring_entries == 0 || self.uring_entries > 32_768 {
            return Err(Error::InvalidConfig(
                "uring_entries must be between 1 and 32768",
            ));
        }
        self.pool.validate()
    }
}

/// What a worker's future receives: who it is and its handles to the rest of
/// the process.
pub struct WorkerCtx<T> {
    index: usize,
    workers: usize,
    engine: Engine,
    mesh: MeshSender<T>,
    inbox: Option<MeshReceiver<T>>,
    stop: StopToken,
    pool: BufPool,
}

impl<T: Send> WorkerCtx<T> {
    /// This worker's index, `0..workers()`.
    pub fn index(&self) -> usize {
        self.index
    }

    /// Number of workers in the process.
    pub fn workers(&self) -> usize {
        self.workers
    }

    /// The engine this worker's runtime runs on.
    pub fn engine(&self) -> Engine {
        self.engine
    }

    /// Sender into every worker's inbox (including this one's).
    pub fn mesh(&self) -> &MeshSender<T> {
        &self.mesh
    }

    /// This worker's inbox; `None` after the first call. An inbox that is
    /// never taken closes when the context is dropped, and sends to it then
    /// fail with [`SendError::Closed`](super::xcore::SendError::Closed).
    pub fn take_inbox(&mut self) -> Option<MeshReceiver<T>> {
        self.inbox.take()
    }

    /// Fires when the process is asked to stop.
    pub fn stop_token(&self) -> &StopToken {
        &self.stop
    }

    /// This worker's buffer pool.
    pub fn pool(&self) -> &BufPool {
        &self.pool
    }
}

impl<T> fmt::Debug for WorkerCtx<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WorkerCtx")
            .field("index", &self.index)
            .field("workers", &self.workers)
            .field("engine", &self.engine)
            .finish_non_exhaustive()
    }
}

/// The running workers. Dropping this handle asks the workers to stop but
/// does not wait; call [`join`](Self::join) to wait.
pub struct Workers<T: Send + 'static> {
    threads: Vec<(usize, thread::JoinHandle<()>)>,
    engine: ResolvedEngine,
    stopper: Stopper,
    mesh: MeshSender<T>,
    budget: MemoryBudget,
}

/// Start-up decision sent to each worker thread once all reported.
enum Decision {
    Run,
    Rebuild(Engine),
    Abort,
}

type BuildReport = (usize, io::Result<()>);

/// How long start-up waits for a worker to report its runtime build.
const BUILD_REPORT_TIMEOUT: Duration = Duration::from_secs(60);

impl<T: Send + 'static> Workers<T> {
    /// Resolves the engine, starts `config.workers` threads with one runtime
    /// each and runs `f` on every one of them.
    ///
    /// Returns once every runtime is built, so configuration and engine
    /// errors surface here rather than in a log line.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`], [`Error::IoUringUnavailable`] (explicit
    /// `io-uring` only), [`Error::SpawnWorker`], [`Error::RuntimeBuild`]
    /// (under `auto` only when the epoll fallback fails too), or
    /// [`Error::WorkerPanicked`] if a worker died before reporting.
    pub fn start<F, Fut>(config: RuntimeConfig, f: F) -> Result<Self, Error>
    where
        F: Fn(WorkerCtx<T>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + 'static,
    {
        config.validate()?;
        let entries = config.uring_entries;
        let mut resolved = resolve_with_probe(config.engine, || probe_io_uring_entries(entries))?;
        let workers = config.workers;
        let mesh = Mesh::<T>::new(workers, config.inbox_capacity);
        let stopper = Stopper::new();
        let budget = MemoryBudget::new(config.pool.budget_bytes);
        let cpus = if config.pin_cores {
            match allowed_cpus() {
                Ok(cpus) if !cpus.is_empty() => Some(cpus),
                Ok(_) => None,
                Err(err) => {
                    tracing::warn!(error = %err, "cannot read CPU affinity; workers not pinned");
                    None
                }
            }
        } else {
            None
        };

        let f = Arc::new(f);
        let (report_tx, report_rx) = mpsc::channel::<BuildReport>();
        let mut deciders = Vec::with_capacity(workers);
        let mut threads = Vec::with_capacity(workers);
        for index in 0..workers {
            let (decide_tx, decide_rx) = mpsc::channel();
            let boot = WorkerBoot {
                index,
                workers,
                cpu: cpus.as_ref().map(|c| c[index % c.len()]),
                engine: resolved.engine,
                entries,
                report: report_tx.clone(),
                decide: decide_rx,
                inbox: mesh.receiver(index),
                mesh: mesh.sender(),
                stopper: stopper.clone(),
                budget: budget.clone(),
                pool: config.pool.clone(),
                f: Arc::clone(&f),
            };
            let spawned = thread::Builder::new()
                .name(format!("{}-{index}", config.thread_name))
                .spawn(move || boot.run());
            match spawned {
                Ok(handle) => {
                    threads.push((index, handle));
                    deciders.push(decide_tx);
                }
                Err(source) => {
                    abort_workers(&deciders, threads);
                    return Err(Error::SpawnWorker {
                        worker: index,
                        source,
                    });
                }
            }
        }
        drop(report_tx);

        if let Err(failure) = collect_reports(&report_rx, workers) {
            let fallback_allowed =
                resolved.engine == Engine::IoUring && resolved.requested == IoEngine::Auto;
            let BuildFailure::Build(worker, source) = failure else {
                abort_workers(&deciders, threads);
                return Err(failure.into_error(resolved.engine));
            };
            if !fallback_allowed {
                abort_workers(&deciders, threads);
                return Err(Error::RuntimeBuild {
                    worker,
                    engine: resolved.engine,
                    source,
                });
            }
            tracing::warn!(
                worker,
                error = %source,
                "building the io_uring runtime failed; rebuilding every worker on epoll"
            );
            for decider in &deciders {
                let _ = decider.send(Decision::Rebuild(Engine::Epoll));
            }
            if let Err(failure) = collect_reports(&report_rx, workers) {
                abort_workers(&deciders, threads);
                return Err(failure.into_error(Engine::Epoll));
            }
            resolved.engine = Engine::Epoll;
            resolved.fallback = Some(source);
        }
        for decider in &deciders {
            let _ = decider.send(Decision::Run);
        }
        resolved.log(workers);
        tracing::info!(
            engine = %resolved.engine,
            workers,
            pinned = cpus.is_some(),
            "runtime started"
        );
        Ok(Self {
            threads,
            engine: resolved,
            stopper,
            mesh: mesh.sender(),
            budget,
        })
    }

    /// The engine in use and why.
    pub fn engine(&self) -> &ResolvedEngine {
        &self.engine
    }

    /// Number of workers.
    pub fn len(&self) -> usize {
        self.threads.len()
    }

    /// Always `false`: there is at least one worker.
    pub fn is_empty(&self) -> bool {
        self.threads.is_empty()
    }

    /// Sender into the workers' inboxes, for threads outside the runtime.
    pub fn mesh(&self) -> &MeshSender<T> {
        &self.mesh
    }

    /// The global buffer budget shared by the workers' pools.
    pub fn budget(&self) -> &MemoryBudget {
        &self.budget
    }

    /// A handle that can ask the workers to stop from any thread (e.g. a
    /// signal handler thread).
    pub fn stopper(&self) -> Stopper {
        self.stopper.clone()
    }

    /// Asks every worker to stop (fires their [`StopToken`]s).
    pub fn stop(&self) {
        self.stopper.stop();
    }

    /// Waits for every worker future to return.
    ///
    /// # Errors
    ///
    /// [`Error::WorkerPanicked`] naming the first worker that panicked (all
    /// threads are joined regardless).
    pub fn join(mut self) -> Result<(), Error> {
        let mut first_panic = None;
        for (index, handle) in self.threads.drain(..) {
            if handle.join().is_err() && first_panic.is_none() {
                first_panic = Some(index);
            }
        }
        match first_panic {
            Some(worker) => Err(Error::WorkerPanicked { worker }),
            None => Ok(()),
        }
    }
}

impl<T: Send + 'static> Drop for Workers<T> {
    fn drop(&mut self) {
        if !self.threads.is_empty() {
            self.stopper.stop();
        }
    }
}

impl<T: Send + 'static> fmt::Debug for Workers<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Workers")
            .field("workers", &self.threads.len())
            .field("engine", &self.engine)
            .finish_non_exhaustive()
    }
}

enum BuildFailure {
    Build(usize, io::Error),
    Silent(usize),
}

impl BuildFailure {
    fn into_error(self, engine: Engine) -> Error {
        match self {
            Self::Build(worker, source) => Error::RuntimeBuild {
                worker,
                engine,
                source,
            },
            Self::Silent(worker) => Error::WorkerPanicked { worker },
        }
    }
}

/// Receives one build report per worker; returns the first failure.
fn collect_reports(rx: &mpsc::Receiver<BuildReport>, workers: usize) -> Result<(), BuildFailure> {
    let mut seen = vec![false; workers];
    let mut failure = None;
    for _ in 0..workers {
        match rx.recv_timeout(BUILD_REPORT_TIMEOUT) {
            Ok((index, result)) => {
                if let Some(slot) = seen.get_mut(index) {
                    *slot = true;
                }
                if let (Err(err), None) = (result, &failure) {
                    failure = Some(BuildFailure::Build(index, err));
                }
            }
            Err(_) => {
                let silent = seen.iter().position(|s| !s).unwrap_or(0);
                return Err(BuildFailure::Silent(silent));
            }
        }
    }
    failure.map_or(Ok(()), Err)
}

fn abort_workers(
    deciders: &[mpsc::Sender<Decision>],
    threads: Vec<(usize, thread::JoinHandle<()>)>,
) {
    for decider in deciders {
        let _ = decider.send(Decision::Abort);
    }
    for (_, handle) in threads {
        let _ = handle.join();
    }
}

/// Everything a worker thread needs, moved into it at spawn.
struct WorkerBoot<T, F> {
    index: usize,
    workers: usize,
    cpu: Option<usize>,
    engine: Engine,
    entries: u32,
    report: mpsc::Sender<BuildReport>,
    decide: mpsc::Receiver<Decision>,
    inbox: Option<MeshReceiver<T>>,
    mesh: MeshSender<T>,
    stopper: Stopper,
    budget: MemoryBudget,
    pool: PoolConfig,
    f: Arc<F>,
}

impl<T, F, Fut> WorkerBoot<T, F>
where
    T: Send + 'static,
    F: Fn(WorkerCtx<T>) -> Fut,
    Fut: Future<Output = ()> + 'static,
{
    fn run(self) {
        let span = tracing::info_span!("worker", index = self.index);
        let _entered = span.enter();
        if let Some(cpu) = self.cpu {
            match pin_current_thread(cpu) {
                Ok(()) => tracing::debug!(cpu, "pinned"),
                Err(err) => tracing::warn!(cpu, error = %err, "cannot pin worker"),
            }
        }
        let mut engine = self.engine;
        let mut runtime = self.build_and_report(engine);
        loop {
            match self.decide.recv() {
                Ok(Decision::Run) => break,
                Ok(Decision::Rebuild(next)) => {
                    drop(runtime.take());
                    engine = next;
                    runtime = self.build_and_report(engine);
                }
                Ok(Decision::Abort) | Err(_) => return,
            }
        }
        let Some(mut runtime) = runtime else {
            return;
        };
        let Self {
            index,
            workers,
            inbox,
            mesh,
            stopper,
            budget,
            pool,
            f,
            ..
        } = self;
        runtime.block_on(async move {
            let stop = stopper.token();
            let buffers = BufPool::new(&budget, &pool);
            let maintenance = monoio::spawn(maintain_pool(
                buffers.clone(),
                stop.clone(),
                pool.maintenance_interval,
            ));
            let ctx = WorkerCtx {
                index,
                workers,
                engine,
                mesh: mesh.clone(),
                inbox,
                stop: stop.clone(),
                pool: buffers,
            };
            // A panic in the worker future is caught here only to run the
            // clean-up below first; it is re-raised afterwards (release
            // builds abort on panic anyway).
            let mut future = pin!(f(ctx));
            let outcome = poll_fn(|cx| {
                match std::panic::catch_unwind(AssertUnwindSafe(|| future.as_mut().poll(cx))) {
                    Ok(Poll::Ready(())) => Poll::Ready(Ok(())),
                    Ok(Poll::Pending) => Poll::Pending,
                    Err(panic) => Poll::Ready(Err(panic)),
                }
            })
            .await;
            // monoio leaks tasks still pending when a runtime ends, and a
            // leaked task whose waker another thread can reach would be
            // released on that thread. Retire every such waker here, on
            // this thread, while the runtime still runs.
            mesh.close_inbox(index);
            stop.close().await;
            maintenance.await;
            settle_io().await;
            if let Err(panic) = outcome {
                std::panic::resume_unwind(panic);
            }
        });
    }

    fn build_and_report(&self, engine: Engine) -> Option<EngineRuntime> {
        match EngineRuntime::build(engine, self.entries) {
            Ok(runtime) => {
                let _ = self.report.send((self.index, Ok(())));
                Some(runtime)
            }
            Err(err) => {
                let _ = self.report.send((self.index, Err(err)));
                None
            }
        }
    }
}

/// Periodically lets the pool notice returned buffers and give memory back,
/// and about once a second lets the allocator return what it freed
/// ([`crate::alloc::collect`]).
async fn maintain_pool(pool: BufPool, stop: StopToken, interval: Duration) {
    let mut since_collect = Duration::ZERO;
    loop {
        match race(monoio::time::sleep(interval), stop.stopped()).await {
            Either::Left(()) => {
                pool.reclaim();
                since_collect += interval;
                if since_collect >= Duration::from_secs(1) {
                    since_collect = Duration::ZERO;
                    crate::alloc::collect();
                }
            }
            Either::Right(()) => return,
        }
    }
}

/// A monoio runtime of either engine, timers enabled.
enum EngineRuntime {
    IoUring(monoio::Runtime<TimeDriver<IoUringDriver>>),
    Epoll(monoio::Runtime<TimeDriver<LegacyDriver>>),
}

/// Test hook: the next this-many io_uring runtime builds fail with ENOMEM.
#[cfg(test)]
static FAIL_URING_BUILDS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Threads shared by every worker for the few blocking calls konn makes
/// (name resolution through `getaddrinfo`); `monoio::spawn_blocking` runs
/// on them.
pub const BLOCKING_THREADS: usize = 2;

fn blocking_pool() -> monoio::blocking::DefaultThreadPool {
    static POOL: OnceLock<monoio::blocking::DefaultThreadPool> = OnceLock::new();
    POOL.get_or_init(|| monoio::blocking::DefaultThreadPool::new(BLOCKING_THREADS))
        .clone()
}

impl EngineRuntime {
    fn build(engine: Engine, entries: u32) -> io::Result<Self> {
        #[cfg(test)]
        if engine == Engine::IoUring
            && FAIL_URING_BUILDS
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
                .is_ok()
        {
            return Err(io::Error::from_raw_os_error(libc::ENOMEM));
        }
        Ok(match engine {
            Engine::IoUring => Self::IoUring(
                RuntimeBuilder::<IoUringDriver>::new()
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

    fn block_on<F: Future>(&mut self, future: F) -> F::Output {
        let _current = CurrentEngineGuard::set(self.engine());
        match self {
            Self::IoUring(rt) => rt.block_on(future),
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

// ----- stop signal -----------------------------------------------------------

/// Asks workers to stop; cheap to clone, usable from any thread.
#[derive(Clone, Default)]
pub struct Stopper {
    shared: Arc<StopShared>,
}

#[derive(Default)]
struct StopShared {
    stopped: AtomicBool,
    /// One waker slot per thread that created a [`StopToken`]; each slot
    /// holds the waker of that thread's watcher task.
    watchers: SegQueue<Arc<AtomicCell<Option<Waker>>>>,
}

impl Stopper {
    /// A stopper that has not fired.
    pub fn new() -> Self {
        Self::default()
    }

    /// Fires every token made from this stopper (idempotent).
    pub fn stop(&self) {
        self.shared.stopped.store(true, Ordering::SeqCst);
        // Pairs with the fence in the watcher: either the watcher sees the
        // flag, or this loop sees its waker.
        fence(Ordering::SeqCst);
        while let Some(slot) = self.shared.watchers.pop() {
            if let Some(waker) = slot.take() {
                waker.wake();
            }
        }
    }

    /// Whether [`stop`](Self::stop) was called.
    pub fn is_stopped(&self) -> bool {
        self.shared.stopped.load(Ordering::Acquire)
    }

    /// A token for the current thread. Spawns one watcher task on the current
    /// monoio runtime, so call it once per thread (inside the runtime) and
    /// clone the token. Before that runtime ends, await
    /// [`StopToken::close`] (the [`Workers`] do) so no waker of this thread
    /// stays reachable from other threads.
    ///
    /// # Panics
    ///
    /// Outside a monoio runtime (monoio cannot spawn there).
    pub fn token(&self) -> StopToken {
        let local = Rc::new(LocalStop::default());
        self.shared.watchers.push(Arc::clone(&local.slot));
        let watcher = monoio::spawn(watch_stop(Arc::clone(&self.shared), Rc::downgrade(&local)));
        *local.watcher.borrow_mut() = Some(watcher);
        StopToken {
            shared: Arc::clone(&self.shared),
            local,
        }
    }
}

impl fmt::Debug for Stopper {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Stopper")
            .field("stopped", &self.is_stopped())
            .finish()
    }
}

/// Waits for the shared flag on behalf of every local waiter, so one
/// cross-thread wake-up per thread suffices. Holds only a weak reference so
/// that dropping the last token clears the cross-thread slot.
async fn watch_stop(shared: Arc<StopShared>, local: Weak<LocalStop>) {
    let fired = poll_fn(|cx| {
        let Some(local) = local.upgrade() else {
            return Poll::Ready(None);
        };
        if local.closed.get() {
            return Poll::Ready(None);
        }
        if shared.stopped.load(Ordering::Acquire) {
            return Poll::Ready(Some(local));
        }
        local.slot.store(Some(cx.waker().clone()));
        // Pairs with the fence in `Stopper::stop`.
        fence(Ordering::SeqCst);
        if shared.stopped.load(Ordering::Acquire) {
            Poll::Ready(Some(local))
        } else {
            Poll::Pending
        }
    })
    .await;
    if let Some(local) = fired {
        local.fire();
    }
}

/// Per-thread fan-out of the stop signal to local tasks.
#[derive(Default)]
struct LocalStop {
    fired: Cell<bool>,
    closed: Cell<bool>,
    /// Cross-thread slot holding the watcher task's waker; also queued in
    /// [`StopShared::watchers`].
    slot: Arc<AtomicCell<Option<Waker>>>,
    watcher: RefCell<Option<monoio::task::JoinHandle<()>>>,
    /// Slab of waiting tasks; a [`Stopped`] future owns one entry.
    waiters: RefCell<Vec<Option<Waker>>>,
    free: RefCell<Vec<usize>>,
}

impl LocalStop {
    fn fire(&self) {
        self.fired.set(true);
        let wakers: Vec<Waker> = self
            .waiters
            .borrow_mut()
            .iter_mut()
            .filter_map(Option::take)
            .collect();
        for waker in wakers {
            waker.wake();
        }
    }
}

impl Drop for LocalStop {
    fn drop(&mut self) {
        // Runs on the owning thread (Rc): dropping the watcher's waker here
        // means no other thread can end up releasing this thread's task.
        drop(self.slot.take());
    }
}

/// Fires when its [`Stopper`] stops. Clones share the thread's watcher.
/// Not `Send`: make one per thread with [`Stopper::token`].
#[derive(Clone)]
pub struct StopToken {
    shared: Arc<StopShared>,
    local: Rc<LocalStop>,
}

impl StopToken {
    /// Whether the stop was requested (or this thread's tokens were closed).
    pub fn is_stopped(&self) -> bool {
        self.local.fired.get() || self.shared.stopped.load(Ordering::Acquire)
    }

    /// Resolves once the stop was requested (immediately if it already was).
    pub fn stopped(&self) -> Stopped<'_> {
        Stopped {
            token: self,
            slot: None,
        }
    }

    /// Retires this thread's watcher: fires every local waiter and waits for
    /// the watcher task to end, leaving no waker of this thread where a
    /// later [`Stopper::stop`] from another thread could reach it. Await it
    /// before the runtime that created the token ends: monoio does not drop
    /// tasks that are still pending when a runtime is dropped.
    pub async fn close(&self) {
        let local = &self.local;
        local.closed.set(true);
        if let Some(waker) = local.slot.take() {
            // Same thread: this schedules the watcher locally.
            waker.wake();
        }
        local.fire();
        let watcher = local.watcher.borrow_mut().take();
        if let Some(watcher) = watcher {
            watcher.await;
        }
    }
}

impl fmt::Debug for StopToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StopToken")
            .field("stopped", &self.is_stopped())
            .finish()
    }
}

/// Future returned by [`StopToken::stopped`].
#[derive(Debug)]
pub struct Stopped<'a> {
    token: &'a StopToken,
    slot: Option<usize>,
}

impl Future for Stopped<'_> {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.token.is_stopped() {
            return Poll::Ready(());
        }
        let local = &self.token.local;
        let mut waiters = local.waiters.borrow_mut();
        let waker = Some(cx.waker().clone());
        if let Some(entry) = self.slot.and_then(|slot| waiters.get_mut(slot)) {
            *entry = waker;
            return Poll::Pending;
        }
        let reused = local.free.borrow_mut().pop();
        let slot = match reused {
            Some(slot) => {
                if let Some(entry) = waiters.get_mut(slot) {
                    *entry = waker;
                }
                slot
            }
            None => {
                waiters.push(waker);
                waiters.len() - 1
            }
        };
        drop(waiters);
        self.slot = Some(slot);
        Poll::Pending
    }
}

impl Drop for Stopped<'_> {
    fn drop(&mut self) {
        if let Some(slot) = self.slot {
            let local = &self.token.local;
            if let Some(entry) = local.waiters.borrow_mut().get_mut(slot) {
                *entry = None;
            }
            local.free.borrow_mut().push(slot);
        }
    }
}

// ----- small future helpers --------------------------------------------------

/// Result of [`race`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Either<A, B> {
    /// The first future finished first.
    Left(A),
    /// The second future finished first.
    Right(B),
}

/// Polls `a` then `b` until one finishes; the other is dropped (pass
/// `Pin<&mut F>` to keep it). Biased towards `a`.
///
/// A named future rather than an `async fn`: an `async fn` keeps its
/// arguments twice in its state (as captured and as pinned locals), and the
/// doubling compounds with nesting — a driver's readiness wait, a race of a
/// read, a notification and a timer, was 3 KiB per idle connection.
pub fn race<A: Future, B: Future>(a: A, b: B) -> Race<A, B> {
    Race { a, b }
}

/// The future of [`race`].
#[derive(Debug)]
#[must_use = "futures do nothing unless polled"]
pub struct Race<A, B> {
    a: A,
    b: B,
}

impl<A: Future, B: Future> Future for Race<A, B> {
    type Output = Either<A::Output, B::Output>;

    #[allow(unsafe_code)]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // SAFETY: structural pinning of both fields: they are never moved
        // out of a pinned `Race` (nothing hands out `&mut A` or `&mut B`,
        // there is no `Drop` impl), and `Race` is `Unpin` only when both
        // are.
        let this = unsafe { self.get_unchecked_mut() };
        // SAFETY: as above; `this.a` stays where it is until dropped.
        if let Poll::Ready(out) = unsafe { Pin::new_unchecked(&mut this.a) }.poll(cx) {
            return Poll::Ready(Either::Left(out));
        }
        // SAFETY: as above.
        if let Poll::Ready(out) = unsafe { Pin::new_unchecked(&mut this.b) }.poll(cx) {
            return Poll::Ready(Either::Right(out));
        }
        Poll::Pending
    }
}

/// Polls `a` and `b` until both finished; returns both outputs. A named
/// future for the reason given at [`race`].
pub fn join<A: Future, B: Future>(a: A, b: B) -> Join<A, B> {
    Join {
        a,
        b,
        ra: None,
        rb: None,
    }
}

/// The future of [`join`].
#[derive(Debug)]
#[must_use = "futures do nothing unless polled"]
pub struct Join<A: Future, B: Future> {
    a: A,
    b: B,
    ra: Option<A::Output>,
    rb: Option<B::Output>,
}

impl<A: Future, B: Future> Future for Join<A, B> {
    type Output = (A::Output, B::Output);

    #[allow(unsafe_code)]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // SAFETY: structural pinning of `a` and `b` only (see `Race`): they
        // are never moved out; the outputs `ra`/`rb` are not pinned and are
        // moved freely. No `Drop` impl.
        let this = unsafe { self.get_unchecked_mut() };
        if this.ra.is_none()
            // SAFETY: as above.
            && let Poll::Ready(out) = unsafe { Pin::new_unchecked(&mut this.a) }.poll(cx)
        {
            this.ra = Some(out);
        }
        if this.rb.is_none()
            // SAFETY: as above.
            && let Poll::Ready(out) = unsafe { Pin::new_unchecked(&mut this.b) }.poll(cx)
        {
            this.rb = Some(out);
        }
        match (this.ra.take(), this.rb.take()) {
            (Some(x), Some(y)) => Poll::Ready((x, y)),
            (x, y) => {
                this.ra = x;
                this.rb = y;
                Poll::Pending
            }
        }
    }
}

/// Lets the other tasks of this worker run once: wakes itself and returns
/// `Pending` a single time (monoio queues a woken task at the back).
pub async fn yield_now() {
    let mut yielded = false;
    poll_fn(|cx| {
        if yielded {
            Poll::Ready(())
        } else {
            yielded = true;
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    })
    .await;
}

// ----- CPU pinning -----------------------------------------------------------

/// CPUs the calling thread may run on (its affinity mask).
///
/// # Errors
///
/// `sched_getaffinity` failed.
#[allow(unsafe_code)]
pub fn allowed_cpus() -> io::Result<Vec<usize>> {
    // SAFETY: cpu_set_t is a plain bit mask; all zeroes is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: pid 0 means the calling thread; size and pointer describe
    // `set`, which outlives the call.
    let rc = unsafe { libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &mut set) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    let max = usize::try_from(libc::CPU_SETSIZE).unwrap_or(0);
    // SAFETY: every index is below CPU_SETSIZE, the size of the mask.
    Ok((0..max)
        .filter(|&cpu| unsafe { libc::CPU_ISSET(cpu, &set) })
        .collect())
}

/// Pins the calling thread to one CPU.
///
/// # Errors
///
/// `EINVAL` if `cpu` is not allowed for this process (cpuset, taskset) or
/// out of range.
#[allow(unsafe_code)]
pub fn pin_current_thread(cpu: usize) -> io::Result<()> {
    let max = usize::try_from(libc::CPU_SETSIZE).unwrap_or(0);
    if cpu >= max {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    // SAFETY: cpu_set_t is a plain bit mask; all zeroes is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `cpu` was checked to be below CPU_SETSIZE above.
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: pid 0 means the calling thread; size and pointer describe
    // `set`, which outlives the call.
    let rc = unsafe { libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
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
    fn config_validation() {
        let mut config = RuntimeConfig {
            workers: 0,
            ..RuntimeConfig::default()
        };
        assert!(matches!(config.validate(), Err(Error::InvalidConfig(_))));
        config.workers = 2;
        config.inbox_capacity = 0;
        assert!(matches!(config.validate(), Err(Error::InvalidConfig(_))));
        config.inbox_capacity = 1;
        assert!(config.validate().is_ok());
        assert!(RuntimeConfig::default().workers >= 1);
    }

    #[test]
    fn race_is_biased_to_the_left() {
        let out = block_on(Engine::Epoll, race(async { 1 }, async { 2 })).unwrap();
        assert_eq!(out, Either::Left(1));
        let out = block_on(
            Engine::Epoll,
            race(std::future::pending::<()>(), async { 2 }),
        )
        .unwrap();
        assert_eq!(out, Either::Right(2));
    }

    #[test]
    fn join_waits_for_both_and_keeps_their_outputs() {
        let out = block_on(Engine::Epoll, async {
            join(
                async {
                    monoio::time::sleep(Duration::from_millis(5)).await;
                    "slow"
                },
                async { 7 },
            )
            .await
        })
        .unwrap();
        assert_eq!(out, ("slow", 7));
    }

    /// One test drives the build-failure hook, so runs never overlap.
    #[test]
    fn io_uring_build_failure_falls_back_under_auto_only() {
        if !available_engines().contains(&Engine::IoUring) {
            return; // the probe already falls back; nothing to inject
        }
        let start = |engine| {
            let (tx, rx) = mpsc::channel();
            let result = Workers::<()>::start(
                RuntimeConfig {
                    workers: 2,
                    engine,
                    ..RuntimeConfig::default()
                },
                move |_ctx| {
                    let tx = tx.clone();
                    async move {
                        tx.send(current_engine()).unwrap();
                    }
                },
            );
            (result, rx)
        };

        FAIL_URING_BUILDS.store(1, Ordering::Release);
        let (workers, rx) = start(IoEngine::Auto);
        let workers = workers.unwrap();
        assert_eq!(workers.engine().engine(), Engine::Epoll);
        assert_eq!(
            workers
                .engine()
                .fallback_reason()
                .and_then(io::Error::raw_os_error),
            Some(libc::ENOMEM)
        );
        for _ in 0..2 {
            let seen = rx.recv_timeout(Duration::from_secs(20)).unwrap();
            assert_eq!(seen, Some(Engine::Epoll), "every worker rebuilt on epoll");
        }
        workers.join().unwrap();

        FAIL_URING_BUILDS.store(1, Ordering::Release);
        let (result, _rx) = start(IoEngine::IoUring);
        match result {
            Err(Error::RuntimeBuild { engine, source, .. }) => {
                assert_eq!(engine, Engine::IoUring);
                assert_eq!(source.raw_os_error(), Some(libc::ENOMEM));
            }
            other => panic!("expected RuntimeBuild, got {other:?}"),
        }
        assert_eq!(FAIL_URING_BUILDS.load(Ordering::Acquire), 0);
    }

    #[test]
    fn current_engine_is_set_inside_block_on() {
        assert_eq!(current_engine(), None);
        let seen = block_on(Engine::Epoll, async { current_engine() }).unwrap();
        assert_eq!(seen, Some(Engine::Epoll));
        assert_eq!(current_engine(), None);
    }
}
