//! Where the Kubernetes client's configuration comes from: upstream's
//! `clientcmd.BuildConfigFromFlags("", --kubeconfig)` followed by its
//! `--kubeconfig-qps`, `--kubeconfig-burst` and `--kube-api-content-type`.
//!
//! - `--kubeconfig` set: that file only (no `$KUBECONFIG` merging, as
//!   client-go's explicit path), its `current-context`; server, CA
//!   (`certificate-authority[-data]`, `insecure-skip-tls-verify`,
//!   `tls-server-name`) and credentials (client certificate and key, `token`,
//!   `tokenFile`, `exec` plugins) as kube-rs reads them, which follows
//!   client-go for these fields.
//! - `--kubeconfig` empty: the in-cluster configuration —
//!   `https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT`, the
//!   service account's `ca.crt` and `token` under
//!   `/var/run/secrets/kubernetes.io/serviceaccount/`; the token file is
//!   re-read (about every minute) as projected tokens rotate. Unlike
//!   client-go, kube-rs also needs the `namespace` file there, which every
//!   mounted service account volume has. Outside a cluster the start fails
//!   with client-go's "no configuration has been provided".
//! - QPS and burst: 0 means client-go's defaults (5 and 10); a negative QPS
//!   turns rate limiting off, as in client-go ([`super::limiter`]).
//! - Content type: kube-rs speaks JSON only. The flag is accepted (its
//!   default is protobuf); konn sends and accepts JSON, which every
//!   kube-apiserver serves for these APIs. The difference is the encoding
//!   on the wire, a few hundred bytes per call.
//!
//! konn turns off kube-rs's own retries: every call has one deadline and
//! the callers decide what a failure means (a refused agent, a lease
//! renewed at the next interval).

use std::path::PathBuf;
use std::time::Duration;

use kube::config::{KubeConfigOptions, Kubeconfig};

use super::KubeError;

/// kube-apiserver's content type konn uses.
pub const JSON: &str = "application/json";

/// Bound on establishing a connection to kube-apiserver.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The client settings (from the flags).
#[derive(Debug, Clone, PartialEq)]
pub struct KubeSettings {
    /// `--kubeconfig`; `None`: in-cluster configuration.
    pub kubeconfig: Option<PathBuf>,
    /// `--kubeconfig-qps`; 0: 5 (client-go's default); negative: no limit.
    pub qps: f32,
    /// `--kubeconfig-burst`; 0: 10 (client-go's default).
    pub burst: i64,
    /// `--kube-api-content-type` (informational: konn speaks JSON).
    pub content_type: String,
}

impl KubeSettings {
    /// Settings for `kubeconfig` with client-go's defaults.
    pub fn new(kubeconfig: Option<PathBuf>) -> Self {
        Self {
            kubeconfig,
            qps: 0.0,
            burst: 0,
            content_type: "application/vnd.kubernetes.protobuf".to_owned(),
        }
    }

    /// Read the configuration now (a bad file fails the start with a clear
    /// line); the client is built on the control-plane thread.
    pub(crate) fn source(&self) -> Result<Source, KubeError> {
        if self.content_type != JSON {
            tracing::debug!(
                requested = %self.content_type,
                "kube-api-content-type: konn's client speaks {JSON}"
            );
        }
        match &self.kubeconfig {
            Some(path) => {
                let kc = Kubeconfig::read_from(path).map_err(|e| KubeError::Kubeconfig {
                    path: path.clone(),
                    reason: e.to_string(),
                })?;
                if kc.current_context.as_deref().unwrap_or("").is_empty() {
                    return Err(KubeError::Kubeconfig {
                        path: path.clone(),
                        reason: "no current-context is set".to_owned(),
                    });
                }
                Ok(Source::File(path.clone(), Box::new(kc)))
            }
            None => kube::Config::incluster_env()
                .map(|c| Source::InCluster(Box::new(c)))
                .map_err(|e| KubeError::NoConfiguration(e.to_string())),
        }
    }
}

/// A configuration read at start, turned into a client on the
/// control-plane thread (kube-rs needs a runtime for that).
pub(crate) enum Source {
    File(PathBuf, Box<Kubeconfig>),
    InCluster(Box<kube::Config>),
}

impl Source {
    pub(crate) async fn client(self) -> Result<kube::Client, KubeError> {
        let mut config = match self {
            Self::File(path, kc) => {
                kube::Config::from_custom_kubeconfig(*kc, &KubeConfigOptions::default())
                    .await
                    .map_err(|e| KubeError::Kubeconfig {
                        path,
                        reason: e.to_string(),
                    })?
            }
            Self::InCluster(c) => *c,
        };
        config.default_retry = false;
        config.connect_timeout = Some(CONNECT_TIMEOUT);
        kube::Client::try_from(config).map_err(|e| KubeError::Client(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_or_invalid_kubeconfig_names_the_file() {
        let s = KubeSettings::new(Some(PathBuf::from("/nonexistent/kubeconfig")));
        let e = s.source().err().map(|e| e.to_string()).unwrap_or_default();
        assert!(e.contains("/nonexistent/kubeconfig"), "{e}");
        let dir = std::env::temp_dir().join(format!("konn-kc-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("kc");
        std::fs::write(&f, "apiVersion: v1\nkind: Config\nclusters: []\n").unwrap();
        let e = KubeSettings::new(Some(f))
            .source()
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains("current-context"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
