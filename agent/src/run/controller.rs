//! The sync loop (worker 0): upstream's `sync()`/`connectOnce` over the
//! sans-IO [`ServerSet`], tunnel placement on the least-loaded worker, and
//! the workers' reports about each attempt.
//!
//! While a tunnel is parked for a resume (`konn-resume`,
//! `crate::resume`), the loop reconnects at once and again (even with a
//! full set, even while draining; failed attempts start at most every
//! [`PARKED_SPACING`]), each attempt on the worker that parked it (only
//! that worker can take its endpoints over) and bounded by
//! [`parked_attempt_timeout`], until the server resumes it or it ends. A
//! new tunnel to a server whose tunnel is parked on another worker is
//! closed as a duplicate, so the parked one can still resume.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use konn_core::io::notify::Notify;
use konn_core::io::runtime::{Either, StopToken, race};
use konn_core::io::xcore::MeshSender;
use konn_protocol::agent::sync::{Admission, Outcome, Rng, Round, ServerSet, TunnelId};

use crate::metrics::AgentMetrics;

/// While a tunnel is parked, failed attempts start at most this often: an
/// attempt that timed out is followed at once, one refused at once waits
/// the rest (upstream's first backoff step: a fleet whose tunnels all
/// parked does not hammer a restarting server harder than a fresh one).
const PARKED_SPACING: std::time::Duration = std::time::Duration::from_secs(1);

use super::{Inner, Msg, Report, Shared};

/// The attempt the sync loop is waiting for.
struct Pending {
    tunnel: TunnelId,
    result: Option<Result<Outcome, String>>,
}

/// The sync loop and the server set (worker 0 only).
pub(super) struct Controller {
    set: RefCell<ServerSet>,
    /// Tunnels (pending or live) per worker.
    load: RefCell<Vec<usize>>,
    cursor: Cell<usize>,
    /// The worker of every tunnel not yet ended.
    placed: RefCell<HashMap<TunnelId, usize>>,
    pending: RefCell<Option<Pending>>,
    resolved: Notify,
    /// Cuts the pause short (the server count changed).
    wake: Notify,
    next_id: Cell<TunnelId>,
    mesh: MeshSender<Msg>,
    shared: Arc<Shared>,
    metrics: AgentMetrics,
    /// Tunnels parked for a resume: `serverid` → their worker.
    parked: RefCell<HashMap<String, usize>>,
    /// `--resume-window`.
    resume_window: std::time::Duration,
}

/// How long one attempt may take while a tunnel is parked: a fifth of the
/// window, at least a second, at most the usual bound. An attempt through
/// a path that swallows packets is given up early and the next one tried,
/// so a resume follows soon after the path heals.
pub(super) fn parked_attempt_timeout(
    window: std::time::Duration,
    header_timeout: std::time::Duration,
) -> std::time::Duration {
    (window / 5)
        .max(std::time::Duration::from_secs(1))
        .min(header_timeout)
}

impl Controller {
    pub(super) fn new(inner: &Inner, mesh: MeshSender<Msg>, workers: usize) -> Self {
        Self {
            set: RefCell::new(ServerSet::new(
                inner.settings.sync,
                Rng::new(konn_core::io::clock::seed()),
            )),
            load: RefCell::new(vec![0; workers.max(1)]),
            cursor: Cell::new(0),
            placed: RefCell::new(HashMap::new()),
            pending: RefCell::new(None),
            resolved: Notify::new(),
            wake: Notify::new(),
            next_id: Cell::new(1),
            mesh,
            shared: inner.shared.clone(),
            metrics: inner.metrics.clone(),
            parked: RefCell::new(HashMap::new()),
            resume_window: inner.settings.connect.settings.resume_window,
        }
    }

    /// upstream's `sync()`: a round, a pause, until stopped.
    pub(super) async fn run(&self, stop: &StopToken) {
        loop {
            let started = konn_core::io::clock::now();
            let Some(outcome) = self.connect_once(stop).await else {
                return;
            };
            let mut pause = self.set.borrow_mut().pause(outcome);
            if !self.parked.borrow().is_empty() {
                // Resume before the window ends: no backoff.
                pause = if outcome == Outcome::Failed {
                    PARKED_SPACING.saturating_sub(
                        konn_core::io::clock::now().saturating_duration_since(started),
                    )
                } else {
                    std::time::Duration::ZERO
                };
            }
            let sleep = race(monoio::time::sleep(pause), self.wake.notified());
            if let Either::Right(()) = race(sleep, stop.stopped()).await {
                return;
            }
        }
    }

    /// One round (upstream's `connectOnce`); `None` when stopped.
    async fn connect_once(&self, stop: &StopToken) -> Option<Outcome> {
        if self.shared.draining.load(Ordering::Acquire) {
            self.set.borrow_mut().set_draining();
        }
        let mut round = self.set.borrow().round();
        if !self.parked.borrow().is_empty() {
            round = Round::Connect {
                server_count: self.set.borrow().server_count(),
            };
        }
        let server_count = match round {
            Round::Draining => {
                tracing::debug!("skipping connectOnce - agent is draining");
                return Some(Outcome::Ok);
            }
            Round::Full { server_count } => {
                self.publish_count(server_count);
                return Some(Outcome::Ok);
            }
            Round::Connect { server_count } => server_count,
        };
        self.publish_count(server_count);
        let tunnel = self.next_id.get();
        self.next_id.set(tunnel + 1);
        let worker = match self.parked_worker() {
            Some(w) => self.place_on(tunnel, w),
            None => self.place(tunnel),
        };
        self.shared.attempts.fetch_add(1, Ordering::Relaxed);
        *self.pending.borrow_mut() = Some(Pending {
            tunnel,
            result: None,
        });
        if self.mesh.send(worker, Msg::Open(tunnel)).is_err() {
            self.unplace(tunnel);
            *self.pending.borrow_mut() = None;
            tracing::warn!(worker, "could not hand a tunnel to its worker");
            return Some(Outcome::Failed);
        }
        let mut timeout = self.set.borrow().config().header_timeout;
        if !self.parked.borrow().is_empty() {
            timeout = parked_attempt_timeout(self.resume_window, timeout);
        }
        let deadline = monoio::time::Instant::now() + timeout;
        let result = loop {
            let done = self
                .pending
                .borrow_mut()
                .as_mut()
                .and_then(|p| p.result.take());
            if let Some(r) = done {
                break r;
            }
            let wait = race(
                self.resolved.notified(),
                monoio::time::sleep_until(deadline),
            );
            match race(wait, stop.stopped()).await {
                Either::Left(Either::Left(())) => {}
                Either::Left(Either::Right(())) => {
                    self.close_tunnel(tunnel);
                    break Err(format!(
                        "no answer from the proxy-server within {timeout:?} (dial, TLS and the Connect response headers)"
                    ));
                }
                Either::Right(()) => {
                    *self.pending.borrow_mut() = None;
                    return None;
                }
            }
        };
        *self.pending.borrow_mut() = None;
        Some(match result {
            Ok(outcome) => outcome,
            Err(error) => {
                self.shared.failures.fetch_add(1, Ordering::Relaxed);
                tracing::error!(%error, "cannot connect once");
                Outcome::Failed
            }
        })
    }

    /// The agent drains: no more connection rounds.
    pub(super) fn set_draining(&self) {
        self.set.borrow_mut().set_draining();
    }

    /// The lease counter's news: when the server count changed, publish it
    /// and run a round now.
    pub(super) fn on_lease_count(&self, leases: usize) {
        let changed = self.set.borrow_mut().set_lease_count(leases);
        if changed {
            let count = self.set.borrow().server_count();
            tracing::info!(
                leases,
                server_count = count,
                "server count changed (leases)"
            );
            self.publish_count(count);
            self.wake.notify();
        }
    }

    /// What a worker said about `tunnel`.
    pub(super) fn on_report(&self, tunnel: TunnelId, report: Report) {
        match report {
            Report::Connected {
                server_id,
                server_count,
                resumed,
            } => {
                if !self.is_pending(tunnel) {
                    // Answered after the sync loop gave up on it.
                    self.close_tunnel(tunnel);
                    return;
                }
                if resumed {
                    self.parked.borrow_mut().remove(&server_id);
                } else if self.parked.borrow().contains_key(&server_id) {
                    // Parked on another worker: that one must resume.
                    tracing::debug!(server_id = %server_id, "tunnel to a server whose tunnel is parked elsewhere; closing it");
                    self.shared.duplicates.fetch_add(1, Ordering::Relaxed);
                    self.close_tunnel(tunnel);
                    self.resolve(tunnel, Ok(Outcome::Duplicate));
                    return;
                }
                let admission = self
                    .set
                    .borrow_mut()
                    .admit(tunnel, &server_id, server_count);
                match admission {
                    Admission::New => {
                        tracing::info!(
                            server_id = %server_id,
                            new_server_count = server_count,
                            "successfully connected to new proxy server"
                        );
                        self.publish_set();
                        self.resolve(tunnel, Ok(Outcome::Ok));
                    }
                    Admission::Duplicate => {
                        tracing::debug!(server_id = %server_id, "duplicate server connection attempt");
                        self.shared.duplicates.fetch_add(1, Ordering::Relaxed);
                        self.close_tunnel(tunnel);
                        self.resolve(tunnel, Ok(Outcome::Duplicate));
                    }
                }
            }
            Report::Rejected(why) | Report::Failed(why) => self.resolve(tunnel, Err(why)),
            Report::Parked { server_id } => {
                let worker = self.placed.borrow().get(&tunnel).copied();
                if let Some(w) = worker {
                    self.parked.borrow_mut().insert(server_id, w);
                    // Reconnect now, not after the pause.
                    self.wake.notify();
                }
            }
            Report::ParkEnded { server_id } => {
                self.parked.borrow_mut().remove(&server_id);
            }
            Report::Ended => {
                self.resolve(
                    tunnel,
                    Err("the connection to the proxy-server closed before it answered".to_owned()),
                );
                self.unplace(tunnel);
                let removed = self.set.borrow_mut().remove(tunnel);
                if let Some(server_id) = removed {
                    tracing::info!(server_id = %server_id, "proxy-server connection closed");
                    self.publish_set();
                }
            }
        }
    }

    fn is_pending(&self, tunnel: TunnelId) -> bool {
        self.pending
            .borrow()
            .as_ref()
            .is_some_and(|p| p.tunnel == tunnel && p.result.is_none())
    }

    /// Settle the pending attempt if it is `tunnel` (first answer wins).
    fn resolve(&self, tunnel: TunnelId, result: Result<Outcome, String>) {
        if let Some(p) = self.pending.borrow_mut().as_mut()
            && p.tunnel == tunnel
            && p.result.is_none()
        {
            p.result = Some(result);
            self.resolved.notify();
        }
    }

    fn close_tunnel(&self, tunnel: TunnelId) {
        let worker = self.placed.borrow().get(&tunnel).copied();
        if let Some(w) = worker {
            let _ = self.mesh.send(w, Msg::Close(tunnel));
        }
    }

    /// The worker for a new tunnel: fewest tunnels, ties round-robin.
    fn place(&self, tunnel: TunnelId) -> usize {
        let mut load = self.load.borrow_mut();
        let n = load.len();
        let start = self.cursor.get() % n;
        let chosen = (0..n)
            .map(|i| (start + i) % n)
            .min_by_key(|&w| load[w])
            .unwrap_or(0);
        load[chosen] += 1;
        self.cursor.set(chosen + 1);
        self.placed.borrow_mut().insert(tunnel, chosen);
        chosen
    }

    /// The worker of a parked tunnel, in turn (`None`: none is parked).
    fn parked_worker(&self) -> Option<usize> {
        let parked = self.parked.borrow();
        let mut workers: Vec<usize> = parked.values().copied().collect();
        workers.sort_unstable();
        workers.dedup();
        let n = workers.len();
        (n > 0).then(|| {
            let i = self.cursor.get() % n;
            self.cursor.set(self.cursor.get().wrapping_add(1));
            workers[i]
        })
    }

    /// Place a tunnel on worker `w`.
    fn place_on(&self, tunnel: TunnelId, w: usize) -> usize {
        if let Some(l) = self.load.borrow_mut().get_mut(w) {
            *l += 1;
        }
        self.placed.borrow_mut().insert(tunnel, w);
        w
    }

    fn unplace(&self, tunnel: TunnelId) {
        if let Some(w) = self.placed.borrow_mut().remove(&tunnel)
            && let Some(l) = self.load.borrow_mut().get_mut(w)
        {
            *l = l.saturating_sub(1);
        }
    }

    fn publish_set(&self) {
        let n = self.set.borrow().len();
        self.shared.connected.store(n, Ordering::Release);
        self.metrics.set_open_server_connections(n);
    }

    fn publish_count(&self, count: usize) {
        self.shared
            .known_server_count
            .store(count, Ordering::Release);
        self.metrics.set_known_server_count(count);
    }
}
