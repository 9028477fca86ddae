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

use crossbeam_queue::ArrayQueue;
use konn_core::io::tls::TlsLayer;
use konn_core::metrics::common::ConnEnd;
use konn_protocol::server::router::{ConnSummary, ConnView};

use crate::audit::{Record, kind_label};
use crate::cluster::Cluster;
use crate::health::json_string;
use crate::worker::Worker;

/// A connection (or dial) ended: count it, log it at `-v=4`, audit it.
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
        ?duration,
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

/// A Unix-socket frontend's peer: `uid=… gid=… pid=…` (`SO_PEERCRED`).
pub fn unix_peer(fd: RawFd) -> Option<Arc<str>> {
    konn_core::io::sock::peer_credentials(fd)
        .map(|(uid, gid, pid)| Arc::from(format!("uid={uid} gid={gid} pid={pid}")))
}

/// A TCP frontend's peer: `addr=ip:port`, with ` cn=…` (the client
/// certificate's subject common name) once mTLS established it.
pub fn tcp_peer(addr: Option<SocketAddr>, tls: Option<&TlsLayer>) -> Option<Arc<str>> {
    let addr = addr?;
    let cn = tls
        .and_then(TlsLayer::peer_certificates)
        .and_then(|certs| certs.first())
        .and_then(|der| subject_cn(der));
    Some(Arc::from(match cn {
        Some(cn) => format!("addr={addr} cn={cn}"),
        None => format!("addr={addr}"),
    }))
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

/// The listings the workers publish, one slot per worker: the admin
/// endpoint answers from them, so no router is read from another thread.
/// A worker refreshes its slot on its timer tick while someone looked in
/// the last [`WATCH`].
#[derive(Debug)]
pub struct ConnBoard {
    slots: Box<[Slot]>,
    /// When `/debug/connections` was last asked (ms since `epoch`).
    asked: std::sync::atomic::AtomicU64,
    epoch: Instant,
}

#[derive(Debug)]
struct Slot {
    latest: ArrayQueue<Arc<Vec<ConnInfo>>>,
    /// When it was last published (ms since the board's epoch).
    at: std::sync::atomic::AtomicU64,
}

/// How often a worker publishes at most while someone looks.
pub const REFRESH: Duration = Duration::from_millis(500);

/// How long after a request the workers keep publishing.
pub const WATCH: Duration = Duration::from_secs(60);

impl ConnBoard {
    /// A board for `workers` workers; `epoch` is any fixed instant.
    pub fn new(workers: usize, epoch: Instant) -> Self {
        Self {
            slots: (0..workers.max(1))
                .map(|_| Slot {
                    latest: ArrayQueue::new(1),
                    at: std::sync::atomic::AtomicU64::new(0),
                })
                .collect(),
            asked: std::sync::atomic::AtomicU64::new(0),
            epoch,
        }
    }

    fn ms(&self, t: Instant) -> u64 {
        u64::try_from(t.saturating_duration_since(self.epoch).as_millis()).unwrap_or(u64::MAX)
    }

    /// Whether worker `index` should publish at `now`: someone asked in
    /// the last [`WATCH`] and its listing is older than [`REFRESH`].
    pub fn wanted(&self, index: usize, now: Instant) -> bool {
        use std::sync::atomic::Ordering::Relaxed;
        let (now, asked) = (self.ms(now), self.asked.load(Relaxed));
        let watched = asked != 0 && now.saturating_sub(asked) < WATCH.as_millis() as u64;
        watched
            && self.slots.get(index).is_some_and(|s| {
                now.saturating_sub(s.at.load(Relaxed)) >= REFRESH.as_millis() as u64
            })
    }

    /// Worker `index` publishes its listing at `now`.
    pub fn publish(&self, index: usize, list: Vec<ConnInfo>, now: Instant) {
        if let Some(slot) = self.slots.get(index) {
            slot.latest.force_push(Arc::new(list));
            slot.at
                .store(self.ms(now).max(1), std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// Every worker's latest listing (and mark that someone asked at
    /// `now`).
    pub fn collect(&self, now: Instant) -> Vec<Arc<Vec<ConnInfo>>> {
        self.asked
            .store(self.ms(now).max(1), std::sync::atomic::Ordering::Relaxed);
        self.slots
            .iter()
            .filter_map(|s| {
                let latest = s.latest.pop()?;
                // Put it back for the next reader unless the worker
                // published a newer one meanwhile.
                let _ = s.latest.push(latest.clone());
                Some(latest)
            })
            .collect()
    }
}

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
    let mut all: Vec<ConnInfo> = Vec::new();
    // This worker's own connections are read now; the others' from their
    // latest listing (at most one timer tick old while someone looks).
    let mine = snapshot(w, now);
    if let Some(board) = &w.shared.conns {
        for list in board.collect(now) {
            all.extend(list.iter().filter(|c| c.worker != w.index).cloned());
        }
    }
    all.extend(mine);
    all.retain(|c| {
        cluster.as_deref().is_none_or(|n| &*c.cluster == n)
            && agent
                .as_deref()
                .is_none_or(|a| c.view.agent_id.as_deref() == Some(a))
    });
    all.sort_by_key(|c| (c.view.started, c.view.frontend));
    render(&all, now)
}

fn render(all: &[ConnInfo], now: Instant) -> Vec<u8> {
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
    out.push_str("]}\n");
    out.into_bytes()
}
