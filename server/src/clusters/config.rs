//! The `--clusters-config` file: YAML read with serde-saphyr
//! (docs/decisions/0005-clusters-config-yaml.md), checked whole, turned into
//! one [`ClusterSettings`] per cluster. Every error names the file, the line
//! and column, and the field (`clusters[1].agents.clientCA`).
//!
//! ```yaml
//! clusters:
//! - name: shoot-a                      # [a-z0-9.-], unique; the metric label
//!   frontend:                          # this cluster's kube-apiserver
//!     uds: /run/konn/shoot-a.sock      # or: port + cert + key + clientCA
//!     mode: grpc                       # default: --mode
//!   agents:
//!     serverNames: [shoot-a.konn.example]   # SNI names, unique
//!     cert: /etc/konn/shoot-a/tls.crt  # default: --cluster-cert/--cluster-key
//!     key: /etc/konn/shoot-a/tls.key
//!     clientCA: /etc/konn/shoot-a/agent-ca.crt   # or token: {...}
//!     allowedClients: [{organizationalUnit: shoot-a}]
//!   proxyStrategies: [destHost, default]  # default: --proxy-strategies
//!   backendDialTimeout: 30s               # default: --backend-dial-timeout
//!   allowedDestinations: ["10.0.0.10:6443"]  # KEP-2025; default: none
//!   limits:                               # default: the --max-* flags
//!     maxAgentConnections: 200            # 0: no limit
//!     maxFrontendDialRate: 50
//!     overloadMemoryWatermark: 0.8        # of --memory-budget; 0: off
//! ```
//!
//! Rules beyond the types: names and SNI names unique; a frontend is a Unix
//! socket or a TCP port with mTLS, unique across clusters; every cluster
//! authenticates its agents (a client CA or a token review — not both, as
//! upstream), and two clusters that trust the same client CA must both
//! narrow it with `allowedClients`, or an agent of one could join the
//! other. Files are read (and certificates checked) now, so a reload that
//! names a missing file is refused whole.
//!
//! `limits` (docs/design/limits.md) are the one part a reload changes in
//! place: they are left out of a cluster's fingerprint, and the reload
//! retunes the running cluster's shared `Limits` instead of restarting
//! it (`reload.rs`).

use std::collections::HashMap;
use std::fmt;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use konn_core::cli::GoDuration;
use konn_core::io::tls::{PemSource, ServerTls, ServerTlsOptions};
use konn_core::kube::review::ReviewPolicy;
use konn_protocol::server::backends::Strategy;
use konn_protocol::server::limits::{Limit, Limits, LimitsConfig};
use konn_protocol::server::router::RouterConfig;
use serde::Deserialize;

use super::identity::{SubjectRule, SubjectRules};
use crate::settings::{FrontendListen, Mode, ReverseSettings};

/// The largest file accepted.
pub const MAX_FILE_BYTES: usize = 4 << 20;

/// Clusters in one file at most.
pub const MAX_CLUSTERS: usize = 4096;

/// Why the file was refused: where, which field, what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// The file.
    pub file: PathBuf,
    /// 1-based line (0: the file as a whole).
    pub line: u64,
    /// 1-based column (0: unknown).
    pub column: u64,
    /// The field, as a path (`clusters[0].frontend.port`); empty for the
    /// file as a whole.
    pub field: String,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file.display())?;
        if self.line > 0 {
            write!(f, ":{}:{}", self.line, self.column)?;
        }
        if !self.field.is_empty() {
            write!(f, ": {}", self.field)?;
        }
        write!(f, ": {}", self.message)
    }
}

impl std::error::Error for ConfigError {}

/// What the flags give every cluster that does not say otherwise.
#[derive(Debug, Clone)]
pub struct ClusterDefaults {
    /// `--proxy-strategies`.
    pub strategies: Vec<Strategy>,
    /// Dial timeout, pending-dial limits, flow marks, reverse limits.
    pub router: RouterConfig,
    /// `--reverse-dial-timeout`.
    pub reverse_dial_timeout: Duration,
    /// `--mode`.
    pub mode: Mode,
    /// `--delete-existing-uds-file`.
    pub delete_existing_uds: bool,
    /// `--cluster-cert`, `--cluster-key`.
    pub agent_identity: Option<(PathBuf, PathBuf)>,
    /// `--tls-min-version` (Go name).
    pub tls_min_version: String,
    /// `--cipher-suites`.
    pub cipher_suites: Vec<String>,
    /// The Kubernetes client of token reviews (`--kubeconfig` & co.; a
    /// cluster's `token.kubeconfig` replaces the file).
    pub kube: konn_core::kube::KubeSettings,
    /// `--memory-budget` (a cluster's `overloadMemoryWatermark` is a
    /// fraction of it).
    pub memory_budget: usize,
}

impl Default for ClusterDefaults {
    fn default() -> Self {
        Self {
            strategies: vec![Strategy::Default],
            router: RouterConfig::default(),
            reverse_dial_timeout: Duration::from_secs(10),
            mode: Mode::Grpc,
            delete_existing_uds: true,
            agent_identity: None,
            tls_min_version: String::new(),
            cipher_suites: Vec::new(),
            kube: konn_core::kube::KubeSettings::new(None),
            memory_budget: 512 << 20,
        }
    }
}

/// One cluster, ready to serve.
#[derive(Clone)]
pub struct ClusterSettings {
    /// Its name (the `cluster` metric label).
    pub name: String,
    /// `proxyStrategies`.
    pub strategies: Vec<Strategy>,
    /// Its router's settings (the reverse allow-list keys included; its
    /// admission `limits` are always there, possibly all off, so a reload
    /// can retune them in place).
    pub router: RouterConfig,
    /// Its reverse destinations (KEP-2025).
    pub reverse: ReverseSettings,
    /// Its kube-apiserver's listener.
    pub frontend: FrontendSpec,
    /// Who may join as its agents.
    pub agents: AgentSpec,
    /// What it was built from, `limits` aside: equal fingerprints, nothing
    /// to restart on a reload.
    pub fingerprint: u64,
}

impl fmt::Debug for ClusterSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClusterSettings")
            .field("name", &self.name)
            .field("server_names", &self.agents.server_names)
            .field("frontend", &self.frontend.listen)
            .finish_non_exhaustive()
    }
}

/// A cluster's frontend listener.
#[derive(Clone)]
pub struct FrontendSpec {
    /// gRPC or HTTP CONNECT.
    pub mode: Mode,
    /// Where.
    pub listen: FrontendListen,
    /// Remove an existing socket file first (Unix sockets).
    pub delete_existing_uds: bool,
    /// mTLS (TCP).
    pub tls: Option<ServerTls>,
}

/// A cluster's agent admission.
#[derive(Clone)]
pub struct AgentSpec {
    /// SNI names that select this cluster (lower case).
    pub server_names: Vec<String>,
    /// Serving certificate and client verification (`None` only for the
    /// one cluster of a test server without TLS).
    pub tls: Option<ServerTls>,
    /// Token review instead of client certificates.
    pub token: Option<TokenSpec>,
}

/// A cluster's agent token review.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenSpec {
    /// Audience, namespace, service account.
    pub policy: ReviewPolicy,
    /// The cluster's kube-apiserver (`None`: `--kubeconfig`).
    pub kubeconfig: Option<PathBuf>,
}

// ----- the file's shape ------------------------------------------------------

/// A value and where it was written (equality ignores the place, so a
/// cluster that only moved in the file is unchanged).
#[derive(Debug, Clone)]
struct At<T> {
    value: T,
    line: u64,
    column: u64,
}

impl<T: PartialEq> PartialEq for At<T> {
    fn eq(&self, other: &Self) -> bool {
        self.value == other.value
    }
}

impl<T: Hash> Hash for At<T> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.value.hash(state);
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for At<T> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = serde_saphyr::Spanned::<T>::deserialize(d)?;
        Ok(Self {
            value: s.value,
            line: s.referenced.line(),
            column: s.referenced.column(),
        })
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawFile {
    clusters: At<Vec<RawCluster>>,
}

#[derive(Debug, Clone, PartialEq, Hash, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawCluster {
    name: At<String>,
    frontend: At<RawFrontend>,
    agents: At<RawAgents>,
    proxy_strategies: Option<At<Vec<String>>>,
    backend_dial_timeout: Option<At<String>>,
    max_pending_dials_per_frontend: Option<At<u32>>,
    max_pending_dials_per_agent: Option<At<u32>>,
    allowed_destinations: Option<Vec<At<String>>>,
    reverse_max_per_agent: Option<At<u32>>,
    reverse_dial_rate: Option<At<u32>>,
    reverse_dial_timeout: Option<At<String>>,
    limits: Option<At<RawLimits>>,
}

/// A cluster's admission limits: the `--max-*` flags and
/// `--overload-memory-watermark`, by the same names.
#[derive(Debug, Clone, PartialEq, Hash, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawLimits {
    max_agent_connections: Option<At<i64>>,
    max_agent_dial_rate: Option<At<i64>>,
    max_destination_connections: Option<At<i64>>,
    max_destination_dial_rate: Option<At<i64>>,
    max_frontend_connections: Option<At<i64>>,
    max_frontend_dial_rate: Option<At<i64>>,
    max_cluster_connections: Option<At<i64>>,
    max_cluster_dial_rate: Option<At<i64>>,
    overload_memory_watermark: Option<At<Fraction>>,
}

/// A number read as `f64`, compared and hashed by its bits.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(transparent)]
struct Fraction(f64);

impl PartialEq for Fraction {
    fn eq(&self, other: &Self) -> bool {
        self.0.to_bits() == other.0.to_bits()
    }
}

impl Hash for Fraction {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.0.to_bits().hash(state);
    }
}

#[derive(Debug, Clone, PartialEq, Hash, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawFrontend {
    mode: Option<At<String>>,
    uds: Option<At<String>>,
    delete_existing_uds: Option<bool>,
    port: Option<At<u16>>,
    bind_address: Option<At<String>>,
    cert: Option<At<String>>,
    key: Option<At<String>>,
    #[serde(rename = "clientCA")]
    client_ca: Option<At<String>>,
    allowed_clients: Option<Vec<At<RawSubject>>>,
}

#[derive(Debug, Clone, PartialEq, Hash, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawAgents {
    server_names: At<Vec<At<String>>>,
    cert: Option<At<String>>,
    key: Option<At<String>>,
    #[serde(rename = "clientCA")]
    client_ca: Option<At<String>>,
    allowed_clients: Option<Vec<At<RawSubject>>>,
    token: Option<At<RawToken>>,
}

#[derive(Debug, Clone, PartialEq, Hash, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawSubject {
    common_name: Option<String>,
    organizational_unit: Option<String>,
    dns_name: Option<String>,
    uri: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Hash, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawToken {
    audience: At<String>,
    namespace: At<String>,
    service_account: At<String>,
    kubeconfig: Option<At<String>>,
}

// ----- loading ----------------------------------------------------------------

/// Read, parse and check `path`; every cluster's files are read now.
///
/// # Errors
///
/// The first problem found, with its place and field.
pub fn load(path: &Path, defaults: &ClusterDefaults) -> Result<Vec<ClusterSettings>, ConfigError> {
    let whole = |message: String| ConfigError {
        file: path.to_owned(),
        line: 0,
        column: 0,
        field: String::new(),
        message,
    };
    let bytes = read_capped(path).map_err(whole)?;
    let text = std::str::from_utf8(&bytes).map_err(|e| whole(format!("not UTF-8: {e}")))?;
    parse(path, text, defaults)
}

/// [`load`] on text already read (`path` names it in errors; relative file
/// names in it are taken relative to the working directory).
///
/// # Errors
///
/// As [`load`].
pub fn parse(
    path: &Path,
    text: &str,
    defaults: &ClusterDefaults,
) -> Result<Vec<ClusterSettings>, ConfigError> {
    let raw: RawFile = serde_saphyr::from_str(text).map_err(|e| {
        let (line, column) = e.location().map_or((0, 0), |l| (l.line(), l.column()));
        ConfigError {
            file: path.to_owned(),
            line,
            column,
            field: yaml_path(text, line, column),
            message: plain_message(&e),
        }
    })?;
    Checker {
        file: path,
        defaults,
    }
    .check(raw)
}

fn read_capped(path: &Path) -> Result<Vec<u8>, String> {
    use std::io::Read;
    let f = std::fs::File::open(path).map_err(|e| format!("cannot open: {e}"))?;
    let mut bytes = Vec::new();
    f.take(MAX_FILE_BYTES as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read: {e}"))?;
    if bytes.len() > MAX_FILE_BYTES {
        return Err(format!("larger than {MAX_FILE_BYTES} bytes"));
    }
    Ok(bytes)
}

/// serde-saphyr's message without its rendered snippet (the place is
/// reported separately).
fn plain_message(e: &serde_saphyr::Error) -> String {
    let full = e.to_string();
    let first = full.lines().next().unwrap_or_default();
    // "error: line 4 column 11: invalid u16" → "invalid u16"
    let first = first.strip_prefix("error: ").unwrap_or(first);
    match first.split_once(": ") {
        Some((place, rest)) if place.starts_with("line ") => rest.to_owned(),
        _ => first.to_owned(),
    }
}

struct Checker<'a> {
    file: &'a Path,
    defaults: &'a ClusterDefaults,
}

type Checked<T> = Result<T, ConfigError>;

impl Checker<'_> {
    fn err<T>(&self, at: (u64, u64), field: &str, message: impl Into<String>) -> Checked<T> {
        Err(ConfigError {
            file: self.file.to_owned(),
            line: at.0,
            column: at.1,
            field: field.to_owned(),
            message: message.into(),
        })
    }

    fn check(&self, raw: RawFile) -> Checked<Vec<ClusterSettings>> {
        let all = raw.clusters;
        if all.value.is_empty() {
            return self.err(pos(&all), "clusters", "lists no cluster");
        }
        if all.value.len() > MAX_CLUSTERS {
            return self.err(pos(&all), "clusters", format!("more than {MAX_CLUSTERS}"));
        }
        let mut names = HashMap::new();
        let mut snis = HashMap::new();
        let mut listens: HashMap<String, String> = HashMap::new();
        let mut cas: Vec<(Vec<u8>, bool, String)> = Vec::new();
        let mut out = Vec::with_capacity(all.value.len());
        for (i, c) in all.value.iter().enumerate() {
            let f = format!("clusters[{i}]");
            let built = self.cluster(&f, c)?;
            if let Some(prev) = names.insert(built.name.clone(), i) {
                return self.err(
                    pos(&c.name),
                    &format!("{f}.name"),
                    format!("{:?} is also the name of clusters[{prev}]", built.name),
                );
            }
            for (j, n) in built.agents.server_names.iter().enumerate() {
                if let Some(prev) = snis.insert(n.clone(), built.name.clone()) {
                    let at = c.agents.value.server_names.value.get(j).map_or((0, 0), pos);
                    return self.err(
                        at,
                        &format!("{f}.agents.serverNames[{j}]"),
                        format!("{n:?} already selects cluster {prev:?}"),
                    );
                }
            }
            let listen = match &built.frontend.listen {
                FrontendListen::Unix(p) => format!("unix socket {}", p.display()),
                FrontendListen::Tcp(a) => format!("TCP port {}", a.port()),
            };
            if let Some(prev) = listens.insert(listen.clone(), built.name.clone()) {
                return self.err(
                    pos(&c.frontend),
                    &format!("{f}.frontend"),
                    format!("{listen} is also cluster {prev:?}'s frontend"),
                );
            }
            if let Some(ca) = &c.agents.value.client_ca {
                let bytes = std::fs::read(&ca.value).unwrap_or_default();
                let narrowed = c.agents.value.allowed_clients.is_some();
                if let Some((_, other_narrowed, other)) = cas.iter().find(|(b, _, _)| *b == bytes)
                    && !(narrowed && *other_narrowed)
                {
                    return self.err(
                        pos(ca),
                        &format!("{f}.agents.clientCA"),
                        format!(
                            "cluster {other:?} trusts the same CA: both need agents.allowedClients, \
                             or an agent of one could join the other"
                        ),
                    );
                }
                cas.push((bytes, narrowed, built.name.clone()));
            }
            out.push(built);
        }
        Ok(out)
    }

    fn cluster(&self, f: &str, c: &RawCluster) -> Checked<ClusterSettings> {
        let d = self.defaults;
        let name = c.name.value.clone();
        if !valid_name(&name) {
            return self.err(
                pos(&c.name),
                &format!("{f}.name"),
                format!(
                    "{name:?}: 1 to 253 characters of a-z, 0-9, '-' and '.', starting and ending \
                     with a letter or digit"
                ),
            );
        }
        let strategies = match &c.proxy_strategies {
            None => d.strategies.clone(),
            Some(list) => {
                if list.value.is_empty() {
                    return self.err(
                        pos(list),
                        &format!("{f}.proxyStrategies"),
                        "names no strategy",
                    );
                }
                let mut out = Vec::new();
                for s in &list.value {
                    match Strategy::parse(s) {
                        Some(s) => out.push(s),
                        None => {
                            return self.err(
                                pos(list),
                                &format!("{f}.proxyStrategies"),
                                format!("unknown strategy {s:?} (default, destHost, defaultRoute)"),
                            );
                        }
                    }
                }
                out
            }
        };
        let mut router = d.router.clone();
        // Each cluster counts its own dials.
        let limits = self.limits(f, c.limits.as_ref())?;
        router.limits = Some(Arc::new(Limits::new(limits, konn_core::io::clock::now())));
        if let Some(t) = &c.backend_dial_timeout {
            router.dial_timeout = self.duration(t, &format!("{f}.backendDialTimeout"))?;
        }
        if let Some(n) = &c.max_pending_dials_per_frontend {
            router.max_pending_per_frontend =
                self.positive(n, &format!("{f}.maxPendingDialsPerFrontend"))?;
        }
        if let Some(n) = &c.max_pending_dials_per_agent {
            router.max_pending_per_backend =
                self.positive(n, &format!("{f}.maxPendingDialsPerAgent"))?;
        }
        if let Some(n) = &c.reverse_max_per_agent {
            router.reverse.max_per_agent = self.positive(n, &format!("{f}.reverseMaxPerAgent"))?;
        }
        if let Some(n) = &c.reverse_dial_rate {
            let rate = self.positive(n, &format!("{f}.reverseDialRate"))?;
            router.reverse.dials_per_second = rate as f64;
            router.reverse.burst = u32::try_from(rate).unwrap_or(u32::MAX);
        }
        let reverse_timeout = match &c.reverse_dial_timeout {
            Some(t) => self.duration(t, &format!("{f}.reverseDialTimeout"))?,
            None => d.reverse_dial_timeout,
        };
        let entries: Vec<String> = c
            .allowed_destinations
            .iter()
            .flatten()
            .map(|e| e.value.clone())
            .collect();
        let reverse = ReverseSettings::parse(&entries, reverse_timeout, &mut router.reverse)
            .map_err(|m| {
                let at = c
                    .allowed_destinations
                    .as_ref()
                    .and_then(|v| v.first())
                    .map_or(pos(&c.name), pos);
                ConfigError {
                    file: self.file.to_owned(),
                    line: at.0,
                    column: at.1,
                    field: format!("{f}.allowedDestinations"),
                    message: m.replace("--allowed-destination=", ""),
                }
            })?;
        let mut files = DefaultHasher::new();
        let frontend = self.frontend(&format!("{f}.frontend"), &c.frontend, &mut files)?;
        let agents = self.agents(&format!("{f}.agents"), &c.agents, &mut files)?;
        // Limits are retuned in place on a reload, not restarted.
        RawCluster {
            limits: None,
            ..c.clone()
        }
        .hash(&mut files);
        Ok(ClusterSettings {
            name,
            strategies,
            router,
            reverse,
            frontend,
            agents,
            fingerprint: files.finish(),
        })
    }

    /// The cluster's admission limits: the flags', with what `limits`
    /// sets instead.
    fn limits(&self, f: &str, raw: Option<&At<RawLimits>>) -> Checked<LimitsConfig> {
        let d = self.defaults;
        let mut cfg = d
            .router
            .limits
            .as_ref()
            .map(|l| l.config())
            .unwrap_or_default();
        let Some(raw) = raw else { return Ok(cfg) };
        let l = &raw.value;
        let classes = [
            (
                &mut cfg.agent,
                ("maxAgentConnections", &l.max_agent_connections),
                ("maxAgentDialRate", &l.max_agent_dial_rate),
            ),
            (
                &mut cfg.dest,
                ("maxDestinationConnections", &l.max_destination_connections),
                ("maxDestinationDialRate", &l.max_destination_dial_rate),
            ),
            (
                &mut cfg.frontend,
                ("maxFrontendConnections", &l.max_frontend_connections),
                ("maxFrontendDialRate", &l.max_frontend_dial_rate),
            ),
            (
                &mut cfg.cluster,
                ("maxClusterConnections", &l.max_cluster_connections),
                ("maxClusterDialRate", &l.max_cluster_dial_rate),
            ),
        ];
        // What the flags accept: 0 (off) to u32::MAX.
        let count = |(name, n): (&str, &Option<At<i64>>)| -> Checked<Option<u32>> {
            let Some(n) = n else { return Ok(None) };
            match u32::try_from(n.value) {
                Ok(v) => Ok(Some(v)),
                Err(_) => self.err(
                    pos(n),
                    &format!("{f}.limits.{name}"),
                    format!("{}: must be between 0 (no limit) and {}", n.value, u32::MAX),
                ),
            }
        };
        for (limit, conns, rate) in classes {
            if let Some(n) = count(conns)? {
                limit.max_conns = n;
            }
            if let Some(r) = count(rate)? {
                *limit = Limit::new(limit.max_conns, r);
            }
        }
        if let Some(w) = &l.overload_memory_watermark {
            let fraction = w.value.0;
            if !(0.0..=1.0).contains(&fraction) {
                return self.err(
                    pos(w),
                    &format!("{f}.limits.overloadMemoryWatermark"),
                    format!("{fraction}: must be a fraction of --memory-budget from 0 (off) to 1"),
                );
            }
            cfg.set_watermark(d.memory_budget, fraction);
        }
        Ok(cfg)
    }

    fn frontend(
        &self,
        f: &str,
        at: &At<RawFrontend>,
        files: &mut DefaultHasher,
    ) -> Checked<FrontendSpec> {
        let fe = &at.value;
        let mode = match &fe.mode {
            None => self.defaults.mode,
            Some(m) => match m.value.as_str() {
                "grpc" => Mode::Grpc,
                "http-connect" => Mode::HttpConnect,
                other => {
                    return self.err(
                        pos(m),
                        &format!("{f}.mode"),
                        format!("{other:?}: grpc or http-connect"),
                    );
                }
            },
        };
        match (&fe.uds, &fe.port) {
            (Some(uds), None) => {
                for (field, set) in [
                    ("cert", fe.cert.is_some()),
                    ("key", fe.key.is_some()),
                    ("clientCA", fe.client_ca.is_some()),
                    ("allowedClients", fe.allowed_clients.is_some()),
                    ("bindAddress", fe.bind_address.is_some()),
                ] {
                    if set {
                        return self.err(
                            pos(uds),
                            &format!("{f}.{field}"),
                            "a Unix-socket frontend has no TLS and no address",
                        );
                    }
                }
                if uds.value.is_empty() {
                    return self.err(pos(uds), &format!("{f}.uds"), "empty path");
                }
                Ok(FrontendSpec {
                    mode,
                    listen: FrontendListen::Unix(PathBuf::from(&uds.value)),
                    delete_existing_uds: fe
                        .delete_existing_uds
                        .unwrap_or(self.defaults.delete_existing_uds),
                    tls: None,
                })
            }
            (None, Some(port)) => {
                let bind = fe.bind_address.as_ref().map_or("", |b| b.value.as_str());
                let listen = crate::settings::listen_addr(bind, port.value, "bindAddress")
                    .or_else(|e| self.err(pos(port), &format!("{f}.bindAddress"), e.to_string()))?;
                let (Some(cert), Some(key), Some(ca)) = (&fe.cert, &fe.key, &fe.client_ca) else {
                    return self.err(
                        pos(port),
                        f,
                        "a TCP frontend needs cert, key and clientCA (mTLS, as --server-port)",
                    );
                };
                let rules = self.rules(&format!("{f}.allowedClients"), &fe.allowed_clients)?;
                let tls = self.tls(f, cert, key, Some(ca), rules, files)?;
                Ok(FrontendSpec {
                    mode,
                    listen: FrontendListen::Tcp(listen),
                    delete_existing_uds: false,
                    tls: Some(tls),
                })
            }
            _ => self.err(
                pos(at),
                f,
                "give either uds (a Unix socket) or port (TCP with mTLS)",
            ),
        }
    }

    fn agents(&self, f: &str, at: &At<RawAgents>, files: &mut DefaultHasher) -> Checked<AgentSpec> {
        let a = &at.value;
        if a.server_names.value.is_empty() {
            return self.err(
                pos(&a.server_names),
                &format!("{f}.serverNames"),
                "names no server name (the SNI agents send)",
            );
        }
        let mut server_names = Vec::new();
        for (i, n) in a.server_names.value.iter().enumerate() {
            let name = n.value.trim_end_matches('.').to_ascii_lowercase();
            let dns = name.parse::<std::net::IpAddr>().is_err()
                && !name.starts_with('[')
                && konn_core::io::tls::config::parse_server_name(&name).is_ok();
            if !dns {
                return self.err(
                    pos(n),
                    &format!("{f}.serverNames[{i}]"),
                    format!(
                        "{:?} is not a DNS name (agents send no SNI for an IP address)",
                        n.value
                    ),
                );
            }
            server_names.push(name);
        }
        let token = match (&a.client_ca, &a.token) {
            (Some(_), Some(t)) => {
                return self.err(
                    pos(t),
                    &format!("{f}.token"),
                    "token review and clientCA exclude each other (as upstream's flags)",
                );
            }
            (None, None) => {
                return self.err(
                    pos(at),
                    f,
                    "agents must authenticate: give clientCA (mTLS) or token (TokenReview)",
                );
            }
            (None, Some(t)) => {
                if a.allowed_clients.is_some() {
                    return self.err(
                        pos(t),
                        &format!("{f}.allowedClients"),
                        "allowedClients narrows clientCA; with token review there is none",
                    );
                }
                let t = &t.value;
                for (field, v) in [
                    ("audience", &t.audience),
                    ("namespace", &t.namespace),
                    ("serviceAccount", &t.service_account),
                ] {
                    if v.value.is_empty() {
                        return self.err(pos(v), &format!("{f}.token.{field}"), "empty");
                    }
                }
                let kubeconfig = match &t.kubeconfig {
                    Some(k) => {
                        self.file_exists(k, &format!("{f}.token.kubeconfig"))?;
                        Some(PathBuf::from(&k.value))
                    }
                    None => None,
                };
                Some(TokenSpec {
                    policy: ReviewPolicy::new(
                        t.audience.value.clone(),
                        t.namespace.value.clone(),
                        t.service_account.value.clone(),
                    ),
                    kubeconfig,
                })
            }
            (Some(_), None) => None,
        };
        let rules = self.rules(&format!("{f}.allowedClients"), &a.allowed_clients)?;
        let tls = match (&a.cert, &a.key, &self.defaults.agent_identity) {
            (Some(cert), Some(key), _) => {
                self.tls(f, cert, key, a.client_ca.as_ref(), rules, files)?
            }
            (None, None, Some((cert, key))) => {
                let here = |p: &Path| At {
                    value: p.display().to_string(),
                    line: at.line,
                    column: at.column,
                };
                self.tls(
                    f,
                    &here(cert),
                    &here(key),
                    a.client_ca.as_ref(),
                    rules,
                    files,
                )?
            }
            (None, None, None) => {
                return self.err(
                    pos(at),
                    &format!("{f}.cert"),
                    "no serving certificate: give cert and key, or --cluster-cert and --cluster-key",
                );
            }
            _ => {
                return self.err(pos(at), f, "cert and key come together");
            }
        };
        Ok(AgentSpec {
            server_names,
            tls: Some(tls),
            token,
        })
    }

    fn rules(&self, f: &str, list: &Option<Vec<At<RawSubject>>>) -> Checked<Option<SubjectRules>> {
        let Some(list) = list else { return Ok(None) };
        if list.is_empty() {
            return self.err((0, 0), f, "empty: leave it out to accept the whole CA");
        }
        let mut rules = Vec::new();
        for (i, r) in list.iter().enumerate() {
            let s = &r.value;
            let set: Vec<SubjectRule> = [
                s.common_name.clone().map(SubjectRule::CommonName),
                s.organizational_unit
                    .clone()
                    .map(SubjectRule::OrganizationalUnit),
                s.dns_name.clone().map(SubjectRule::DnsName),
                s.uri.clone().map(SubjectRule::Uri),
            ]
            .into_iter()
            .flatten()
            .collect();
            match <[SubjectRule; 1]>::try_from(set) {
                Ok([rule]) => rules.push(rule),
                Err(_) => {
                    return self.err(
                        pos(r),
                        &format!("{f}[{i}]"),
                        "exactly one of commonName, organizationalUnit, dnsName, uri",
                    );
                }
            }
        }
        Ok(Some(SubjectRules(rules)))
    }

    fn tls(
        &self,
        f: &str,
        cert: &At<String>,
        key: &At<String>,
        ca: Option<&At<String>>,
        rules: Option<SubjectRules>,
        files: &mut DefaultHasher,
    ) -> Checked<ServerTls> {
        for (field, p) in [("cert", Some(cert)), ("key", Some(key)), ("clientCA", ca)] {
            if let Some(p) = p {
                let bytes = self.file_exists(p, &format!("{f}.{field}"))?;
                bytes.hash(files);
            }
        }
        let mut o = ServerTlsOptions::new(
            PemSource::File(PathBuf::from(&cert.value)),
            PemSource::File(PathBuf::from(&key.value)),
        );
        o.client_ca = ca.map(|c| PemSource::File(PathBuf::from(&c.value)));
        o.min_version = self.defaults.tls_min_version.clone();
        o.cipher_suites = self.defaults.cipher_suites.clone();
        o.client_check = rules.map(|r| Arc::new(r) as _);
        o.build()
            .or_else(|e| self.err(pos(cert), f, format!("TLS: {e}")))
    }

    fn file_exists(&self, p: &At<String>, field: &str) -> Checked<Vec<u8>> {
        if p.value.is_empty() {
            return self.err(pos(p), field, "empty path");
        }
        std::fs::read(&p.value).or_else(|e| self.err(pos(p), field, format!("{}: {e}", p.value)))
    }

    fn duration(&self, t: &At<String>, field: &str) -> Checked<Duration> {
        match GoDuration::parse(&t.value).map(GoDuration::to_std) {
            Ok(Some(d)) if !d.is_zero() => Ok(d),
            Ok(_) => self.err(pos(t), field, format!("{:?}: must be positive", t.value)),
            Err(e) => self.err(pos(t), field, e),
        }
    }

    fn positive(&self, n: &At<u32>, field: &str) -> Checked<usize> {
        match n.value {
            0 => self.err(pos(n), field, "must be at least 1"),
            v => Ok(v as usize),
        }
    }
}

fn pos<T>(at: &At<T>) -> (u64, u64) {
    (at.line, at.column)
}

/// A cluster name: a DNS-1123 subdomain (what Kubernetes names are made
/// of), so it fits a metric label and a file name.
pub fn valid_name(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b.len() <= 253
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-' || *c == b'.')
        && b.first().is_some_and(u8::is_ascii_alphanumeric)
        && b.last().is_some_and(u8::is_ascii_alphanumeric)
}

/// The field at `line`:`column` of block-style YAML, as a path
/// (`clusters[1].frontend.port`), from the keys and list items above it.
/// Best effort: empty when the place is unknown.
pub fn yaml_path(text: &str, line: u64, column: u64) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let Some(target) = usize::try_from(line)
        .ok()
        .and_then(|l| l.checked_sub(1))
        .filter(|&l| l < lines.len())
    else {
        return String::new();
    };
    let indent_of = |s: &str| s.len() - s.trim_start_matches(' ').len();
    let key_of = |s: &str| {
        let t = s.trim_start_matches(' ');
        t.split_once(':')
            .map(|(k, _)| k.trim().trim_matches(|c| c == '"' || c == '\'').to_owned())
            .filter(|k| !k.is_empty() && !k.contains(['{', '[', ',', ' ']))
    };
    // The index of the list item whose dash is at `indent` on line `at`.
    let item_index = |at: usize, indent: usize| {
        let mut n = 0;
        for l in lines[..at].iter().rev() {
            let t = l.trim_start_matches(' ');
            if t.is_empty() || t.starts_with('#') {
                continue;
            }
            let i = indent_of(l);
            if i < indent || (i == indent && !t.starts_with('-')) {
                break;
            }
            if i == indent {
                n += 1;
            }
        }
        n
    };
    let mut parts: Vec<String> = Vec::new();
    // The target line up to the column: its key, and any list dashes.
    let line_text = lines[target];
    let col = usize::try_from(column.saturating_sub(1)).unwrap_or(0);
    let upto: String = line_text.chars().take(col).collect();
    let mut rest = upto.as_str();
    let mut dashes = Vec::new();
    loop {
        let ind = indent_of(rest);
        let t = &rest[ind..];
        match t.strip_prefix('-') {
            Some(after) if after.is_empty() || after.starts_with(' ') => {
                dashes.push(upto.len() - t.len());
                rest = after;
            }
            _ => break,
        }
    }
    let mut cur = upto.len() - rest.trim_start_matches(' ').len();
    // An error at a key (an unknown field) names that key; one at a value
    // the key before it.
    let here: String = line_text.chars().skip(col).collect();
    let at_key = (rest.trim().is_empty() && !here.starts_with(' '))
        .then(|| key_of(&here))
        .flatten();
    if let Some(k) = at_key.or_else(|| key_of(rest)) {
        parts.push(k);
    }
    // Inside an item of a list whose dashes are at this indent: its parent
    // key may stand at the same indent; sibling items are skipped.
    let mut list_at = None;
    for &d in dashes.iter().rev() {
        parts.push(format!("[{}]", item_index(target, d)));
        cur = d;
        list_at = Some(d);
    }
    for i in (0..target).rev() {
        let l = lines[i];
        let t = l.trim_start_matches(' ');
        if t.is_empty() || t.starts_with('#') {
            continue;
        }
        let ind = indent_of(l);
        let dash = t == "-" || t.starts_with("- ");
        let parent_key_beside_list = list_at == Some(ind) && !dash;
        if ind >= cur && !parent_key_beside_list {
            continue;
        }
        if dash {
            parts.push(format!("[{}]", item_index(i, ind)));
            list_at = Some(ind);
        } else if let Some(k) = key_of(l) {
            parts.push(k);
            list_at = None;
        }
        cur = ind;
        if cur == 0 && list_at.is_none() {
            break;
        }
    }
    parts.reverse();
    let mut out = String::new();
    for p in parts {
        if !out.is_empty() && !p.starts_with('[') {
            out.push('.');
        }
        out.push_str(&p);
    }
    out
}

#[cfg(test)]
mod tests;
