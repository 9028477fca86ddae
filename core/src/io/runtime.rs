//! The thread-per-core runtime: worker threads, their per-core resources,
//! CPU pinning.
//!
//! The io engine (`--io-engine`, the io_uring probe, the runtime of each
//! engine and the test helpers that run a body under every engine) lives in
//! [`super::engine`], the stop signal in [`super::stop`], and the small
//! future combinators in [`super::future`]; this module re-exports them so
//! `io::runtime` stays the one place to import the runtime from.
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
//! and its per-core [`BufPool`] (also installed as the thread's
//! [`current`](super::pool::current) pool, which the connection driver reads
//! into). A worker also runs a small maintenance task that lets its buffer
//! pool reclaim and trim memory ([`PoolConfig::maintenance_interval`]).
//!
//! # Stopping
//!
//! [`Stopper::stop`] (from any thread) fires every worker's [`StopToken`];
//! worker futures are expected to return then, and [`Workers::join`] waits
//! for that. Nothing is cancelled forcibly: protocol drivers decide how to
//! drain.

use std::{
    fmt,
    future::{Future, poll_fn},
    io,
    panic::AssertUnwindSafe,
    pin::pin,
    sync::{Arc, mpsc},
    task::Poll,
    thread,
    time::Duration,
};

use super::{
    pool::{BufPool, MemoryBudget, PoolConfig},
    xcore::{Mesh, MeshReceiver, MeshSender},
};
use crate::Error;

#[cfg(test)]
use super::engine::FAIL_URING_BUILDS;
pub use super::engine::{
    BLOCKING_THREADS, DEFAULT_URING_ENTRIES, Engine, IoEngine, PROBE_ENTRIES, ResolvedEngine,
    RingSetup, available_engines, block_on, current_engine, io_uring_hint, probe_io_uring,
    probe_io_uring_entries, resolve, resolve_with_probe, run_on_each_engine,
};
use super::engine::{EngineRuntime, settle_io};
pub use super::future::{Either, Guarded, Join, Race, join, race, with_guard, yield_now};
pub use super::stop::{StopToken, Stopped, Stopper};

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
        let _fields = crate::log::ThreadFields::set(format!("index={}", self.index));
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
            let _current = super::pool::install(buffers.clone());
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

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use super::*;

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
}
