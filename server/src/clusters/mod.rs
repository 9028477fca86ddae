//! One proxy-server for many clusters (`--clusters-config`,
//! docs/MULTI-CLUSTER.md): each cluster has its own frontend listener, its
//! own agents (chosen by the SNI they send on the shared agent port, and
//! admitted only with that cluster's credentials), and on every worker its
//! own router and backend directory — so a frontend of one cluster can
//! reach only its own cluster's agents, by construction.
//!
//! - [`config`]: the file, checked, as [`config::ClusterSettings`].
//! - [`identity`]: client-certificate rules beyond a CA.
//! - [`reload`]: the running clusters, their listeners, and reloads.

pub mod config;
pub mod identity;
pub mod reload;
