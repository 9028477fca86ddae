//! proxy-agent's lease counting (`--count-server-leases`): the
//! control-plane thread of `konn_core::kube` lists and watches the server
//! Leases matching `--lease-label-selector` in `--lease-namespace`
//! (`konn_core::kube::lease::start_counter`) and hands every new count of
//! valid leases to the sync loop on worker 0 as [`Msg::LeaseCount`]; the
//! sync loop feeds it to its `ServerSet` and, when the server count
//! changed, runs a round at once instead of after its pause (upstream
//! re-counts only on its next sync, #648).
//!
//! Metrics: upstream's `lease_lists_total`, `lease_list_latency_seconds`
//! and — with upstream's bug kept — watch calls counted in
//! `lease_lists_total` too.

use std::sync::Arc;
use std::time::Duration;

use konn_core::io::xcore::{MeshSender, SendError};
use konn_core::kube::lease::{CountConfig, CountDelivery, LeaseCountObserver, start_counter};
use konn_core::kube::{ControlPlane, KubeSettings};

use crate::metrics::AgentMetrics;
use crate::run::Msg;

/// What `--count-server-leases` asks for.
#[derive(Debug, Clone, PartialEq)]
pub struct LeaseSettings {
    /// The client (`--kubeconfig`, `--kube-api-content-type`).
    pub client: KubeSettings,
    /// Namespace and selector.
    pub count: CountConfig,
}

/// Start the client thread and the counter; counts go to worker 0.
///
/// # Errors
///
/// The client configuration cannot be loaded or used.
pub fn start(
    s: &LeaseSettings,
    mesh: MeshSender<Msg>,
    metrics: AgentMetrics,
) -> Result<ControlPlane, konn_core::Error> {
    let control = ControlPlane::start(&s.client, "konn-kube")?;
    tracing::info!(namespace = %s.count.namespace, selector = %s.count.selector, "counting server leases");
    let sink = Box::new(move |n: usize| match mesh.send(0, Msg::LeaseCount(n)) {
        Ok(()) => CountDelivery::Delivered,
        Err(SendError::Full(_)) => CountDelivery::Full,
        Err(_) => CountDelivery::Gone,
    });
    start_counter(&control, s.count.clone(), Arc::new(Observer(metrics)), sink);
    Ok(control)
}

struct Observer(AgentMetrics);

impl LeaseCountObserver for Observer {
    fn list(&self, code: u16, reason: &str, latency: Duration) {
        self.0.observe_lease_list(code, reason);
        self.0.observe_lease_list_latency(latency, code);
    }

    fn watch(&self, code: u16, reason: &str) {
        self.0.observe_lease_watch(code, reason);
    }
}
