//! Tunnelled connections seen from the outside (issue 17): what becomes of
//! the router's [`ConnSummary`]s (the byte, duration and outcome metrics,
//! a `-v` ≥ 2 log line, the audit record), who a frontend's peer is, and the
//! `/debug/connections` listing.
//!
//! Everything here runs once per connection (or per admin request), never
//! per packet: the per-packet part is two `u64` additions in the router.

use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use konn_core::http1::board::Board;
use konn_core::io::tls::TlsLayer;
use konn_core::log::GoDuration;
use konn_core::metrics::common::ConnEnd;
use konn_protocol::server::router::{ConnSummary, ConnView, FrontendId, Router};

use crate::audit::{Record, kind_label};
use crate::cluster::Cluster;
use crate::health::json_string;
use crate::worker::Worker;

/// A connection (or dial) ended: count it, log it at `-v` ≥ 2, audit it.
pub fn conn_ended(w: &Worker, c: &Cluster, s: Box<ConnSummary>) {
    let duration = konn_core::io::clock::now().saturating_duration_since(s.started);
    let observe = &w.settings.observe;
    c.all_metrics.conn_ended(
        &ConnEnd {
            agent_id: s.agent_id.as_deref().unwrap_or(""),
            result: s.result.label(),
            reason: s.reason,
            to_destination: s.bytes_to_agent,
            from_destination: s.bytes_from_agent,
            duration,
            destination: &s.destination,
        },
        observe.per_destination_limit,
    );
    tracing::debug!(
        frontend = s.frontend,
        cluster = c.name(),
        agent_id = s.agent_id.as_deref().unwrap_or(""),
        destination = &*s.destination,
        result = s.result.label(),
        reason = s.reason,
        closed_by = s.closed_by.label(),
        bytes_to_agent = s.bytes_to_agent,
        bytes_from_agent = s.bytes_from_agent,
        duration = %GoDuration(duration),
        "tunnelled connection ended"
    );
    if let Some(log) = &w.shared.audit {
        let record = Record {
            time: wall_clock(),
            cluster: Arc::from(c.name()),
            duration,
            summary: s,
        };
        if !log.push(w.index, record) {
            w.all_metrics.audit_dropped().inc();
        }
    }
}

/// Time since the Unix epoch, for audit records.
#[allow(clippy::disallowed_methods)] // a wall-clock stamp per record, not a data-path clock
fn wall_clock() -> Duration {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
}

/// An agent tunnel of cluster `c` is gone: when no other tunnel of the same
/// agent remains in the directory, its per-agent series go (the label set
/// stays bounded by the agents present).
pub fn agent_gone(c: &Cluster, agent_id: &str) {
    let still = c
        .router
        .borrow()
        .directory()
        .entries()
        .any(|e| e.agent_id == agent_id);
    if !still {
        c.all_metrics.forget_agent(agent_id);
    }
}

/// Who a frontend is: its description for the audit log and
/// `/debug/connections`, and its identity for the per-frontend limits
/// (`--max-frontend-connections`, `--max-frontend-dial-rate`;
/// docs/design/limits.md, "Frontend identity").
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FrontendPeer {
    /// `uid=… gid=… pid=…`, or `addr=ip:port` (with ` cn=…`); `None`:
    /// unknown.
    pub peer: Option<Arc<str>>,
    /// `uid=…` of a Unix-socket peer, `cn=…` of a client certificate, else
    /// `ip=…` of a TCP peer; `None` when not asked for (no per-frontend
    /// limit) or unknown.
    pub identity: Option<Arc<str>>,
}

impl FrontendPeer {
    /// Tell `router` about frontend `fid`.
    pub fn describe(&self, router: &mut Router, fid: FrontendId) {
        if let Some(p) = &self.peer {
            router.set_frontend_peer(fid, p.clone());
        }
        if let Some(i) = &self.identity {
            router.set_frontend_identity(fid, i.clone());
        }
    }
}

/// Whether `cluster`'s frontends need an identity: it has admission limits
/// (with `--clusters-config` every cluster has, possibly all off: a reload
/// may switch its per-frontend limit on while connections are open).
pub fn wants_identity(cluster: &Cluster) -> bool {
    cluster.settings.router.limits.is_some()
}

/// What a new frontend connection must learn about its peer: `None` when
/// nothing would read it (no audit log, no per-frontend limits: a dial
/// then makes no `SO_PEERCRED` or `getpeername` call and formats nothing),
/// else whether an identity is wanted besides the description.
pub fn peer_wanted(w: &Worker, cluster: &Cluster) -> Option<bool> {
    let identity = wants_identity(cluster);
    (identity || w.shared.audit.is_some()).then_some(identity)
}

/// A Unix-socket frontend (`SO_PEERCRED`): described as `uid=… gid=…
/// pid=…`, identified (with `identity`) by its user id — the processes of
/// one user are one client.
pub fn unix_peer(fd: RawFd, identity: bool) -> FrontendPeer {
    match konn_core::io::sock::peer_credentials(fd) {
        Some((uid, gid, pid)) => FrontendPeer {
            peer: Some(Arc::from(format!("uid={uid} gid={gid} pid={pid}"))),
            identity: identity.then(|| Arc::from(format!("uid={uid}"))),
        },
        None => FrontendPeer::default(),
    }
}

/// A TCP frontend: described as `addr=ip:port`, with ` cn=…` (the client
/// certificate's subject common name) once mTLS established it;
/// identified (with `identity`) by `cn=…`, or by `ip=…` without a
/// certificate name.
pub fn tcp_peer(addr: Option<SocketAddr>, tls: Option<&TlsLayer>, identity: bool) -> FrontendPeer {
    let Some(addr) = addr else {
        return FrontendPeer::default();
    };
    let cn = tls
        .and_then(TlsLayer::peer_certificates)
        .and_then(|certs| certs.first())
        .and_then(|der| subject_cn(der));
    let (peer, id) = match cn {
        Some(cn) => (format!("addr={addr} cn={cn}"), format!("cn={cn}")),
        None => (format!("addr={addr}"), format!("ip={}", addr.ip())),
    };
    FrontendPeer {
        peer: Some(Arc::from(peer)),
        identity: identity.then(|| Arc::from(id)),
    }
}

/// The subject common name of a DER certificate (the audit log's `cn=`,
/// a resumable tunnel's identity).
pub(crate) fn subject_cn(der: &[u8]) -> Option<String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let cn = cert
        .subject()
        .iter_common_name()
        .next()?
        .as_str()
        .ok()?
        .to_owned();
    Some(cn)
}

// ----- /debug/connections ---------------------------------------------------

/// One open connection as `/debug/connections` lists it.
#[derive(Debug, Clone)]
pub struct ConnInfo {
    /// Its cluster.
    pub cluster: Arc<str>,
    /// The worker serving its frontend.
    pub worker: usize,
    /// What the router knows.
    pub view: ConnView,
    /// When the snapshot was taken (ages are computed against it).
    pub at: Instant,
}

/// The listings the workers publish for `/debug/connections`
/// (`konn_core::http1::board`).
pub type ConnBoard = Board<ConnInfo>;

/// This worker's open connections, every cluster, at `now`.
pub fn snapshot(w: &Worker, now: Instant) -> Vec<ConnInfo> {
    let clusters: Vec<_> = w.clusters.borrow().values().cloned().collect();
    let mut out = Vec::new();
    for c in clusters {
        let name: Arc<str> = Arc::from(c.name());
        out.extend(c.router.borrow().connections(now).map(|view| ConnInfo {
            cluster: name.clone(),
            worker: w.index,
            view,
            at: now,
        }));
    }
    out
}

/// Worker tick: publish this worker's listing if someone is looking.
pub fn tick(w: &Worker, now: Instant) {
    if let Some(board) = &w.shared.conns
        && board.wanted(w.index, now)
    {
        board.publish(w.index, snapshot(w, now), now);
    }
}

/// `/debug/connections`: `?cluster=` and `?agent=` filter; JSON, sorted by
/// age (oldest first).
pub fn connections_json(w: &Worker, query: Option<&str>) -> Vec<u8> {
    let now = konn_core::io::clock::now();
    let mut cluster = None;
    let mut agent = None;
    if let Some(q) = query
        && let Ok(pairs) = konn_frames::url::parse_query(q)
    {
        for (k, v) in pairs {
            let v = String::from_utf8_lossy(&v).into_owned();
            match &*k {
                b"cluster" => cluster = Some(v),
                b"agent" => agent = Some(v),
                _ => {}
            }
        }
    }
    // This worker's own connections are read now; the others' from their
    // latest listing (at most a timer tick old while someone looks).
    let mut all = snapshot(w, now);
    let mut missing = 0;
    if let Some(board) = &w.shared.conns {
        let others = board.collect(w.index, now);
        missing = others.missing;
        for list in others.lists {
            all.extend(list.iter().cloned());
        }
    }
    all.retain(|c| {
        cluster.as_deref().is_none_or(|n| &*c.cluster == n)
            && agent
                .as_deref()
                .is_none_or(|a| c.view.agent_id.as_deref() == Some(a))
    });
    all.sort_by_key(|c| (c.view.started, c.view.frontend));
    render(&all, now, missing == 0)
}

/// The JSON of `all` at `now`; `complete`: every worker's connections are
/// in it.
fn render(all: &[ConnInfo], now: Instant, complete: bool) -> Vec<u8> {
    use std::fmt::Write as _;
    let mut out = String::from("{\"connections\":[");
    for (i, c) in all.iter().enumerate() {
        let v = &c.view;
        if i > 0 {
            out.push(',');
        }
        out.push_str("{\"cluster\":");
        json_string(&mut out, &c.cluster);
        let _ = write!(
            out,
            ",\"worker\":{},\"frontend\":\"{}\",\"peer\":",
            c.worker,
            kind_label(v.kind)
        );
        match &v.peer {
            Some(p) => json_string(&mut out, p),
            None => out.push_str("null"),
        }
        out.push_str(",\"agent_id\":");
        match &v.agent_id {
            Some(a) => json_string(&mut out, a),
            None => out.push_str("null"),
        }
        out.push_str(",\"destination\":");
        json_string(&mut out, &v.destination);
        let age = c.at.saturating_duration_since(v.started) + now.saturating_duration_since(c.at);
        let stalled = v
            .stalled_since
            .map(|s| c.at.saturating_duration_since(s).as_secs_f64());
        let state = if v.stuck {
            "stuck"
        } else if v.pause_sent || v.paused_by_agent {
            "paused"
        } else if v.connect_id == 0 {
            "dialing"
        } else {
            "flowing"
        };
        let _ = write!(
            out,
            ",\"connection_id\":{},\"state\":\"{state}\",\"age_seconds\":{:.3},\
             \"bytes_to_agent\":{},\"bytes_from_agent\":{},\"flow\":{{\"queued\":{},\
             \"withheld\":{},\"pause_sent\":{},\"paused_by_agent\":{},\"stalled_seconds\":",
            v.connect_id,
            age.as_secs_f64(),
            v.bytes_to_agent,
            v.bytes_from_agent,
            v.queued,
            v.withheld,
            v.pause_sent,
            v.paused_by_agent,
        );
        match stalled {
            Some(s) => {
                let _ = write!(out, "{s:.3}");
            }
            None => out.push_str("null"),
        }
        out.push_str("}}");
    }
    let _ = writeln!(out, "],\"complete\":{complete}}}");
    out.into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_unix_socket_peer_is_identified_by_its_uid() {
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        let fd = std::os::fd::AsRawFd::as_raw_fd(&a);
        // /proc/self belongs to the process's (effective) user.
        let uid = std::os::unix::fs::MetadataExt::uid(&std::fs::metadata("/proc/self").unwrap());
        let p = unix_peer(fd, true);
        assert_eq!(p.identity.as_deref(), Some(&*format!("uid={uid}")));
        let peer = p.peer.unwrap();
        assert!(peer.starts_with(&format!("uid={uid} gid=")), "{peer}");
        assert!(peer.contains(&format!(" pid={}", std::process::id())));
        // No limit asks for it: no identity.
        assert_eq!(unix_peer(fd, false).identity, None);
    }

    #[test]
    fn a_tcp_peer_without_a_certificate_is_its_address() {
        let addr: SocketAddr = "10.1.2.3:40000".parse().unwrap();
        let p = tcp_peer(Some(addr), None, true);
        assert_eq!(p.peer.as_deref(), Some("addr=10.1.2.3:40000"));
        assert_eq!(p.identity.as_deref(), Some("ip=10.1.2.3"));
        assert_eq!(tcp_peer(None, None, true), FrontendPeer::default());
    }

    #[test]
    fn the_subject_cn_is_read_from_a_certificate() {
        let pem = konn_testkit::pki::generate().unwrap();
        let (_, der) = x509_parser::pem::parse_x509_pem(pem.frontend_cert.as_bytes()).unwrap();
        assert_eq!(subject_cn(&der.contents).as_deref(), Some("kube-apiserver"));
    }
}
