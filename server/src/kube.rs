//! proxy-server's Kubernetes side: what `--agent-namespace` & co. and
//! `--enable-lease-controller` start, on the control-plane thread of
//! `konn_core::kube` (upstream's `NeedsKubernetesClient = tokenAuth ||
//! enableLeaseController`).
//!
//! - [`Kubernetes`]: the settings (client, review policy, lease), from the
//!   options.
//! - [`KubeServices`]: the running client thread, the [`TokenReviewer`]
//!   the workers hold Connect calls on (`crate::auth`), and the
//!   [`LeaseController`]; stopping deletes this server's lease first.
//! - The observers that count upstream's lease metrics and konn's
//!   `konn_server_token_reviews_total{code}` into [`ServerMetrics`].

use std::sync::Arc;
use std::time::Duration;

use konn_core::kube::lease::{LeaseConfig, LeaseController, LeaseGcObserver};
use konn_core::kube::review::{ReviewObserver, ReviewPolicy, TokenReviewer};
use konn_core::kube::{ControlPlane, KubeSettings};

use crate::metrics::ServerMetrics;

/// How long a stopping server waits to delete its lease.
pub const LEASE_DELETE_TIMEOUT: Duration = Duration::from_secs(5);

/// What the server asks of kube-apiserver.
#[derive(Debug, Clone, PartialEq)]
pub struct Kubernetes {
    /// The client (`--kubeconfig`, `--kubeconfig-qps`, …).
    pub client: KubeSettings,
    /// Agent token authentication, when enabled.
    pub token_auth: Option<ReviewPolicy>,
    /// The lease controller, when enabled.
    pub lease: Option<LeaseConfig>,
}

impl Kubernetes {
    /// From the validated options; `None` when neither token
    /// authentication nor the lease controller is on.
    pub fn from_options(o: &crate::options::ServerOptions) -> Option<Self> {
        if o.token_auth.is_none() && o.lease_controller.is_none() {
            return None;
        }
        let k = &o.kube_client;
        Some(Self {
            client: KubeSettings {
                kubeconfig: k.kubeconfig.clone(),
                qps: k.qps,
                burst: k.burst,
                content_type: k.content_type.clone(),
            },
            token_auth: o.token_auth.as_ref().map(|t| {
                ReviewPolicy::new(
                    t.audience.clone(),
                    t.namespace.clone(),
                    t.service_account.clone(),
                )
            }),
            lease: o.lease_controller.as_ref().map(|l| {
                LeaseConfig::new(l.namespace.clone(), o.server_id.clone(), l.labels.clone())
            }),
        })
    }
}

/// The running Kubernetes side of a server.
pub struct KubeServices {
    control: ControlPlane,
    reviewer: Option<(TokenReviewer, Duration)>,
    lease: Option<LeaseController>,
}

impl std::fmt::Debug for KubeServices {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeServices")
            .field("token_auth", &self.reviewer.is_some())
            .field("lease", &self.lease)
            .finish_non_exhaustive()
    }
}

impl KubeServices {
    /// Start the client thread, the reviewer and the lease controller.
    ///
    /// # Errors
    ///
    /// The client configuration cannot be loaded or used.
    pub fn start(k: &Kubernetes, metrics: &ServerMetrics) -> Result<Self, konn_core::Error> {
        let control = ControlPlane::start(&k.client, "konn-kube")?;
        let observer = Arc::new(Observer(metrics.clone()));
        let reviewer = k.token_auth.as_ref().map(|p| {
            tracing::info!(
                audience = %p.audience,
                namespace = %p.namespace,
                service_account = %p.service_account,
                "agent token authentication on"
            );
            (
                TokenReviewer::start(&control, p.clone(), observer.clone()),
                p.timeout,
            )
        });
        let lease = k
            .lease
            .as_ref()
            .map(|l| LeaseController::start(&control, l.clone(), observer.clone()));
        Ok(Self {
            control,
            reviewer,
            lease,
        })
    }

    /// The reviewer and its deadline, when token authentication is on.
    pub fn reviewer(&self) -> Option<(TokenReviewer, Duration)> {
        self.reviewer.clone()
    }

    /// Delete this server's lease (bounded) and stop the client thread.
    pub fn stop(mut self) {
        if let Some(l) = self.lease.take() {
            l.stop(&self.control, LEASE_DELETE_TIMEOUT);
        }
        self.control.stop();
    }
}

/// Counts the control-plane thread's calls into the server's metrics.
pub(crate) struct Observer(pub(crate) ServerMetrics);

impl ReviewObserver for Observer {
    fn api_call(&self, code: Option<u16>) {
        self.0.token_review_call(code);
    }
}

impl LeaseGcObserver for Observer {
    fn list(&self, code: u16, reason: &str, latency: Duration) {
        self.0.observe_lease_list(code, reason);
        self.0.observe_lease_list_latency(code, latency);
    }

    fn delete(&self, code: u16, reason: &str, latency: Duration) {
        self.0.observe_lease_delete(code, reason);
        self.0.observe_lease_delete_latency(code, latency);
    }

    fn culled(&self) {
        self.0.culled_leases_inc();
    }
}
