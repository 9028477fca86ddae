//! The Kubernetes API client: TokenReview for agent authentication, the
//! proxy-server's Lease controller and the proxy-agent's Lease counter.
//!
//! ```text
//!  monoio workers (packet path)             control-plane thread (tokio, current-thread)
//!  ───────────────────────────              ─────────────────────────────────────────────
//!  AgentConn: Connect call ── try_send ──►  TokenReviewer: cache, coalescing,
//!     holds the call (bounded)              in-flight bound ─► Limiter (qps/burst) ─► kube-apiserver
//!  worker inbox ◄── verdict (mesh) ───────  reply, retried while the inbox is full
//!                                            LeaseController (server) / LeaseCounter (agent)
//! ```
//!
//! Everything that talks to kube-apiserver runs on one dedicated thread,
//! [`ControlPlane`], with a small tokio current-thread runtime and a
//! kube-rs [`kube::Client`] (rustls with aws-lc-rs, JSON). The monoio workers
//! never wait for it: they hand requests over through bounded channels that
//! never block ([`review::TokenReviewer::submit`]) and get the answers back
//! as messages in their mesh inboxes. Every call has a deadline, and every
//! call goes through one shared rate limiter ([`limiter::Limiter`],
//! client-go's `--kubeconfig-qps`/`--kubeconfig-burst` token bucket), as
//! client-go shares one limiter between all clients of a clientset.
//!
//! - [`KubeSettings`] / [`config`]: where the client configuration comes
//!   from, as upstream's `clientcmd.BuildConfigFromFlags("", kubeconfig)`:
//!   the kubeconfig file when given (its current context), else the
//!   in-cluster configuration (service account token and CA, token re-read).
//! - [`review`]: TokenReview with upstream's checks, a cache keyed by the
//!   token's SHA-256, coalescing, a concurrency bound and a fail-closed
//!   deadline.
//! - [`lease`]: Lease validity (upstream's `IsLeaseValid`), the server's
//!   lease controller (create, renew, garbage-collect, delete on stop) and
//!   the agent's watching lease counter.
//!
//! Tokens are never logged; at `-v=5` the reviewer logs a token's hash.

pub mod config;
pub mod lease;
pub mod limiter;
pub mod review;

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, SystemTime};

pub use config::KubeSettings;
pub use limiter::Limiter;

/// How long [`ControlPlane::start`] waits for the client to be built.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// How long [`ControlPlane::stop`] lets tasks still running finish.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(1);

/// Why the Kubernetes client could not be set up.
#[derive(Debug)]
#[non_exhaustive]
pub enum KubeError {
    /// `--kubeconfig` cannot be used (unreadable, invalid, no usable
    /// context); the text says why.
    Kubeconfig {
        /// The file.
        path: std::path::PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// No `--kubeconfig` and no in-cluster configuration (client-go's
    /// wording, with the in-cluster reason).
    NoConfiguration(String),
    /// kube-rs refused the configuration (e.g. an unusable CA).
    Client(String),
    /// The control-plane thread could not start or did not report in time.
    Thread(String),
}

impl fmt::Display for KubeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Kubeconfig { path, reason } => write!(
                f,
                "failed to load kubernetes client config: --kubeconfig {}: {reason}",
                path.display()
            ),
            Self::NoConfiguration(why) => write!(
                f,
                "failed to load kubernetes client config: invalid configuration: no configuration has been provided \
                 (no --kubeconfig, and not in a cluster: {why})"
            ),
            Self::Client(why) => write!(f, "failed to create kubernetes client: {why}"),
            Self::Thread(why) => write!(f, "kubernetes client thread: {why}"),
        }
    }
}

impl std::error::Error for KubeError {}

/// The wall clock, for Lease times and token expiry (both are wall-clock
/// times written by other machines). The only place this module reads it.
#[allow(clippy::disallowed_methods)] // wall-clock times of Kubernetes objects; not a protocol path
pub fn wall_now() -> SystemTime {
    SystemTime::now()
}

/// The dedicated thread that talks to kube-apiserver (see the module
/// docs). Dropping it stops the thread (tasks still running are dropped).
pub struct ControlPlane {
    handle: tokio::runtime::Handle,
    client: kube::Client,
    limiter: Arc<Limiter>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<thread::JoinHandle<()>>,
}

impl fmt::Debug for ControlPlane {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ControlPlane")
            .field("limiter", &self.limiter)
            .finish_non_exhaustive()
    }
}

impl ControlPlane {
    /// Load the configuration, start the thread named `name` and build the
    /// client on it. Errors name the flag or the in-cluster reason.
    ///
    /// # Errors
    ///
    /// The configuration cannot be loaded or used, or the thread cannot
    /// start.
    pub fn start(settings: &KubeSettings, name: &str) -> Result<Self, KubeError> {
        let source = settings.source()?;
        let limiter = Arc::new(Limiter::new(settings.qps, settings.burst));
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let thread = thread::Builder::new()
            .name(name.to_owned())
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_io()
                    .enable_time()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = tx.send(Err(KubeError::Thread(e.to_string())));
                        return;
                    }
                };
                let built = rt.block_on(source.client());
                let ok = built.is_ok();
                let _ = tx.send(built.map(|c| (c, rt.handle().clone())));
                if ok {
                    // Runs the spawned tasks until stopped.
                    let _ = rt.block_on(stop_rx);
                }
                rt.shutdown_timeout(SHUTDOWN_GRACE);
            })
            .map_err(|e| KubeError::Thread(e.to_string()))?;
        let (client, handle) = match rx.recv_timeout(START_TIMEOUT) {
            Ok(Ok(v)) => v,
            Ok(Err(e)) => {
                let _ = thread.join();
                return Err(e);
            }
            Err(_) => {
                return Err(KubeError::Thread(format!(
                    "the client was not ready within {START_TIMEOUT:?}"
                )));
            }
        };
        tracing::info!(
            qps = settings.qps,
            burst = settings.burst,
            "kubernetes client ready"
        );
        Ok(Self {
            handle,
            client,
            limiter,
            stop: Some(stop_tx),
            thread: Some(thread),
        })
    }

    /// The client (cheap to clone; use it on this thread's tasks only).
    pub fn client(&self) -> kube::Client {
        self.client.clone()
    }

    /// The rate limiter every call shares.
    pub fn limiter(&self) -> Arc<Limiter> {
        self.limiter.clone()
    }

    /// Run `task` on the control-plane thread.
    pub fn spawn<F>(&self, task: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        drop(self.handle.spawn(task));
    }

    /// Stop the thread and wait for it (tasks still running are dropped
    /// after a short grace period).
    pub fn stop(mut self) {
        self.stop_inner();
    }

    fn stop_inner(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take()
            && t.join().is_err()
        {
            tracing::error!("the kubernetes client thread panicked");
        }
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        self.stop_inner();
    }
}

/// How one API call failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallError {
    /// kube-apiserver answered with an error status.
    Api {
        /// HTTP status code.
        code: u16,
        /// The status reason (`NotFound`, `Conflict`, …).
        reason: String,
        /// The status message.
        message: String,
    },
    /// No answer: connection refused, TLS, a broken response.
    Transport(String),
    /// The rate limiter would have made the call wait past its deadline.
    Throttled,
    /// No answer before the deadline.
    Timeout(Duration),
}

impl CallError {
    /// The HTTP status code, when kube-apiserver answered.
    pub fn code(&self) -> Option<u16> {
        match self {
            Self::Api { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// kube-apiserver answered 404.
    pub fn is_not_found(&self) -> bool {
        self.code() == Some(404)
    }

    /// kube-apiserver answered 409.
    pub fn is_conflict(&self) -> bool {
        self.code() == Some(409)
    }
}

impl fmt::Display for CallError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Api {
                code,
                reason,
                message,
            } => {
                if message.is_empty() {
                    write!(f, "{reason} ({code})")
                } else {
                    write!(f, "{message} ({code} {reason})")
                }
            }
            Self::Transport(e) => f.write_str(e),
            Self::Throttled => f.write_str(
                "client rate limiter Wait returned an error: rate: Wait(n=1) would exceed context deadline",
            ),
            Self::Timeout(d) => write!(f, "context deadline exceeded (no answer within {d:?})"),
        }
    }
}

impl From<kube::Error> for CallError {
    fn from(e: kube::Error) -> Self {
        match e {
            kube::Error::Api(s) => Self::Api {
                code: s.code,
                reason: s.reason.clone(),
                message: s.message.clone(),
            },
            other => Self::Transport(other.to_string()),
        }
    }
}

/// Run one API call: wait for the rate limiter, then the call, all by
/// `deadline`.
pub async fn call<T, F>(
    limiter: &Limiter,
    deadline: tokio::time::Instant,
    fut: F,
) -> Result<T, CallError>
where
    F: Future<Output = Result<T, kube::Error>>,
{
    let limit = deadline.saturating_duration_since(tokio::time::Instant::now());
    limiter
        .acquire(deadline)
        .await
        .map_err(|_| CallError::Throttled)?;
    match tokio::time::timeout_at(deadline, fut).await {
        Ok(r) => r.map_err(CallError::from),
        Err(_) => Err(CallError::Timeout(limit)),
    }
}
