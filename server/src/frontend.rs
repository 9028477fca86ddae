//! The gRPC frontend: `/ProxyService/Proxy` streams from kube-apiserver's
//! konnectivity-client become router frontends.
//!
//! Flow control: the agent's data for a stream waits in that stream's send
//! queue, which the router accounts as the frontend's queue
//! (`Router::frontend_level` after every dispatch); the frontend's own
//! messages return their credit through `Worker::credit`, held while the
//! agent paused the frontend or its tunnel is congested.
//!
//! Placement: a connection stays on the core that accepted it while its
//! dials go to tunnels of that core. When the first DIAL_REQ of a
//! single-stream connection (what kube-apiserver's single-use tunnels are)
//! picks an agent on another core, the connection *moves* there: the
//! handler stashes the event, asks the driver to stop between two reads,
//! and `serve` ships socket and state to that core, where the stashed
//! event is replayed (docs/design/cross-core.md).

use std::cell::{Cell, RefCell};
use std::collections::hash_map::RandomState;
use std::rc::Rc;
use std::time::Instant;

use std::net::SocketAddr;

use konn_core::io::driver::{Handler, WeakConnHandle};
use konn_frames::GrpcStatus;
use konn_frames::packet::{Packet, PacketType};
use konn_protocol::grpc::{Grpc, GrpcEvent};
use konn_protocol::h2::Headers;
use konn_protocol::maps::SmallMap;

use crate::accounting::FrontendPeer;
use crate::agents::{reframe, unknown_method};
use crate::cluster::Cluster;
use crate::metrics::{Segment, ServiceMethod};
use crate::worker::{FrontendRef, Outbox, Worker, bump};
use konn_protocol::server::router::{FrontendId, FrontendKind};

/// A connection leaving for another core.
#[derive(Default)]
pub struct Plan {
    /// The core it goes to.
    pub target: usize,
    /// Its streams (call ids already accepted).
    pub streams: Vec<u32>,
    /// Events to replay there, in order.
    pub stashed: Vec<GrpcEvent>,
}

/// One `Proxy` stream of a frontend connection.
struct Stream {
    /// Its router frontend.
    fid: FrontendId,
    /// Bytes queued at the last dispatch.
    level: usize,
    /// When its queue last drained (shrank or was empty): the budget
    /// resets the streams that have not drained for the longest first.
    drained: Instant,
}

/// The handler of one frontend connection.
pub struct FrontendConn {
    worker: Rc<Worker>,
    /// The cluster whose listener accepted the connection.
    cluster: Rc<Cluster>,
    outbox: Rc<Outbox>,
    /// Its streams (a kube-apiserver dial has one).
    streams: SmallMap<u32, Stream, RandomState>,
    detach: Rc<Cell<bool>>,
    plan: Rc<RefCell<Option<Plan>>>,
    /// A connection that already moved once does not move again.
    may_move: bool,
    /// Bytes queued on this connection's streams, as last accounted to the
    /// core's memory budget (`crate::budget`).
    queued: usize,
    /// Who the peer is, for the audit log and the per-frontend limits
    /// (`crate::accounting`).
    who: Who,
    /// The connection itself (its TLS state names an mTLS client).
    handle: WeakConnHandle<Grpc, Self>,
}

/// Who a frontend connection's peer is.
#[derive(Debug)]
pub enum Who {
    /// Known since the accept (a Unix socket's credentials), or resolved.
    Known(FrontendPeer),
    /// A TCP peer at this address, with `identity` wanted: its client
    /// certificate is read from the connection's TLS state when its first
    /// stream opens (the handshake is over by then).
    Tcp(Option<SocketAddr>, bool),
}

impl FrontendConn {
    /// A handler for a new connection; `plan` receives the move plan when
    /// the connection must migrate.
    pub fn new(
        worker: Rc<Worker>,
        cluster: Rc<Cluster>,
        outbox: Rc<Outbox>,
        plan: Rc<RefCell<Option<Plan>>>,
    ) -> Self {
        Self {
            worker,
            cluster,
            outbox,
            streams: SmallMap::new(),
            detach: Rc::new(Cell::new(false)),
            plan,
            may_move: true,
            queued: 0,
            who: Who::Known(FrontendPeer::default()),
            handle: WeakConnHandle::default(),
        }
    }

    /// Who the peer is (see `crate::accounting`).
    pub fn set_peer(&mut self, who: Who) {
        self.who = who;
    }

    /// The driver's detach flag (`ConnHandle::detach_flag`) and the
    /// connection's handle.
    pub fn set_driver(&mut self, flag: Rc<Cell<bool>>, handle: WeakConnHandle<Grpc, Self>) {
        self.detach = flag;
        self.handle = handle;
    }

    /// The peer, resolved once (a TCP peer's certificate, see [`Who`]).
    fn peer(&mut self) -> FrontendPeer {
        let (addr, identity) = match &self.who {
            Who::Known(p) => return p.clone(),
            Who::Tcp(addr, identity) => (*addr, *identity),
        };
        let peer = match self.handle.upgrade() {
            Some(h) => h.with_tls(|tls| crate::accounting::tcp_peer(addr, tls, identity)),
            None => crate::accounting::tcp_peer(addr, None, identity),
        };
        self.who = Who::Known(peer.clone());
        peer
    }

    /// Never move this connection (it already moved once).
    pub fn no_more_moves(&mut self) {
        self.may_move = false;
    }

    /// Take over the streams of a connection that moved here.
    pub fn adopt(&mut self, streams: &[u32]) {
        for &id in streams {
            self.open(id);
        }
    }

    fn open(&mut self, id: u32) {
        let fid = self.worker.next_id();
        let peer = self.peer();
        let mut router = self.cluster.router.borrow_mut();
        router.frontend_opened(fid, FrontendKind::Grpc);
        peer.describe(&mut router, fid);
        drop(router);
        self.cluster.frontends.borrow_mut().insert(
            fid,
            FrontendRef::Grpc {
                outbox: self.outbox.clone(),
                stream: id,
            },
        );
        self.streams.insert(
            id,
            Stream {
                fid,
                level: 0,
                drained: konn_core::io::clock::now(),
            },
        );
        bump(&self.worker.shared.proxy_streams, true);
        self.cluster
            .metrics
            .grpc_connections(ServiceMethod::Proxy)
            .inc();
    }

    fn gone(&mut self, id: u32) {
        let Some(Stream { fid, .. }) = self.streams.remove(&id) else {
            return;
        };
        let (w, c) = (&*self.worker, &*self.cluster);
        c.frontends.borrow_mut().remove(&fid);
        c.router.borrow_mut().frontend_gone(fid);
        c.apply(w);
        c.publish(w);
        bump(&w.shared.proxy_streams, false);
        c.metrics.grpc_connections(ServiceMethod::Proxy).dec();
    }

    /// Send what the router queued for this connection's streams. A packet
    /// whose stream (or the connection) is already gone is counted as
    /// upstream counts a failed `Send`:
    /// `stream_errors_total{segment="to_client"}`, with `Canceled` for a
    /// stream the client ended and `Unavailable` for a closed connection.
    fn flush(&self, grpc: &mut Grpc) {
        let metrics = &self.cluster.metrics;
        self.outbox.flush_with(grpc, |ty, e| {
            let code = match e {
                konn_protocol::Error::StreamClosed(_) => GrpcStatus::CANCELLED,
                _ => GrpcStatus::UNAVAILABLE,
            };
            metrics.stream_errors(Segment::ToClient, code, ty).inc();
        });
    }

    /// Report this connection's queued bytes to the core's memory budget;
    /// when it bites, close the core's parked tunnels first, then reset
    /// this connection's largest streams and let the other connections of
    /// the core do the same (`crate::budget`).
    fn account(&mut self, grpc: &mut Grpc, total: usize) {
        let old = std::mem::replace(&mut self.queued, total);
        // Only a change pokes the others: a poked connection whose total
        // did not move sheds what it can but does not poke back (no
        // ping-pong while the budget bites).
        let may_poke = old != total;
        // The budget is the core's: count the streams of every cluster.
        let worker = &self.worker;
        let Some(mut shed) =
            crate::budget::account(&worker.pool, old, total, || worker.frontend_count())
        else {
            return;
        };
        // Parked tunnels' replay bytes go first (`crate::resume::shed`).
        let parked = crate::resume::shed(worker, shed.short);
        if parked >= shed.short {
            return;
        }
        shed.short -= parked;
        let connections = crate::budget::connections(worker);
        if !crate::budget::holds_share(&shed, total, connections.len()) {
            // Another connection holds more than this one: it sheds.
            if may_poke {
                crate::budget::poke_others(&connections, &self.outbox);
            }
            return;
        }
        // Stalest first (drained nothing for the longest), then largest.
        let mut victims: Vec<(Instant, std::cmp::Reverse<usize>, u32)> = self
            .streams
            .iter()
            .filter_map(|(&id, s)| {
                let level = grpc.queued_bytes(id);
                (level >= shed.min_level).then_some((s.drained, std::cmp::Reverse(level), id))
            })
            .collect();
        victims.sort_unstable();
        let mut freed = 0;
        let mut resets = 0;
        for (_, std::cmp::Reverse(level), id) in victims {
            if freed >= shed.short {
                break;
            }
            grpc.cancel(id);
            self.gone(id);
            freed += level;
            resets += 1;
        }
        if resets > 0 {
            self.worker.all_metrics.budget_resets("frontend", resets);
            self.flush(grpc);
            let old = std::mem::replace(&mut self.queued, total.saturating_sub(freed));
            let _ = crate::budget::account(&self.worker.pool, old, self.queued, || 1);
        }
        if freed < shed.short && may_poke {
            crate::budget::poke_others(&connections, &self.outbox);
        }
    }

    /// Decide whether this DIAL_REQ moves the connection; if so, record the
    /// plan and ask the driver to stop.
    fn should_move(&mut self, fid: FrontendId, address: &str, random: u64) -> bool {
        if !self.may_move
            || self.streams.len() != 1
            || self.cluster.router.borrow().frontend_dialled(fid)
        {
            return false;
        }
        let target = {
            let router = self.cluster.router.borrow();
            router
                .directory()
                .pick(address, random, self.worker.index)
                .map(|e| e.core)
        };
        match target {
            Some(t) if t != self.worker.index => {
                *self.plan.borrow_mut() = Some(Plan {
                    target: t,
                    streams: self.streams.keys().copied().collect(),
                    stashed: Vec::new(),
                });
                self.detach.set(true);
                true
            }
            _ => false,
        }
    }
}

impl Handler<Grpc> for FrontendConn {
    fn on_event(&mut self, grpc: &mut Grpc, event: GrpcEvent) {
        if let Some(plan) = self.plan.borrow_mut().as_mut() {
            plan.stashed.push(event);
            return;
        }
        match event {
            GrpcEvent::Call { id, path, .. } => {
                if path != "/ProxyService/Proxy" {
                    let _ = grpc.finish(
                        id,
                        GrpcStatus::UNIMPLEMENTED,
                        &unknown_method(&path, "ProxyService"),
                    );
                    return;
                }
                if grpc.accept(id, &Headers::new()).is_ok() {
                    self.open(id);
                }
            }
            GrpcEvent::Message {
                id,
                msg,
                framed,
                flow,
            } => {
                let Some(fid) = self.streams.get(&id).map(|s| s.fid) else {
                    grpc.release(id, flow);
                    return;
                };
                let packet = match Packet::decode(&msg) {
                    Ok(p) => p,
                    Err(e) => {
                        tracing::debug!(error = %e, "ignoring an undecodable packet from a frontend");
                        grpc.release(id, flow);
                        return;
                    }
                };
                if let Packet::DialReq { address, .. } = &packet {
                    tracing::debug!(
                        frontend = fid,
                        address = address.as_str(),
                        "DIAL_REQ from a gRPC frontend"
                    );
                }
                let random = self.worker.random();
                if let Packet::DialReq { address, .. } = &packet
                    && self.should_move(fid, address, random)
                {
                    // Forget it here (nothing pending yet); the new core
                    // registers it again and replays this message.
                    self.streams.remove(&id);
                    self.cluster.frontends.borrow_mut().remove(&fid);
                    self.cluster.router.borrow_mut().frontend_gone(fid);
                    bump(&self.worker.shared.proxy_streams, false);
                    self.cluster
                        .metrics
                        .grpc_connections(ServiceMethod::Proxy)
                        .dec();
                    if let Some(plan) = self.plan.borrow_mut().as_mut() {
                        plan.stashed.push(GrpcEvent::Message {
                            id,
                            msg,
                            framed,
                            flow,
                        });
                    }
                    return;
                }
                let ty = packet.ty();
                let (w, c) = (&*self.worker, &*self.cluster);
                c.metrics.stream_packets(Segment::FromClient, ty).inc();
                w.forwarding.set(ty);
                let framed = framed.unwrap_or_else(|| reframe(&msg));
                if ty == PacketType::DialReq {
                    crate::overload::before_dial(c);
                }
                c.router.borrow_mut().frontend_packet(
                    konn_core::io::clock::now(),
                    fid,
                    packet,
                    framed,
                    random,
                );
                c.apply(w);
                if ty != PacketType::Data {
                    c.publish(w);
                }
                c.credit(w, fid, &self.outbox, id, flow, grpc);
            }
            GrpcEvent::HalfClose { id } => {
                // The client is done (upstream: Recv returns EOF, the
                // handler returns nil): clean up and end with OK.
                self.gone(id);
                let _ = grpc.finish(id, GrpcStatus::OK, "");
            }
            GrpcEvent::Finished { id, status, .. } => {
                if status != GrpcStatus::OK && self.streams.contains_key(&id) {
                    self.cluster
                        .metrics
                        .stream_errors(Segment::FromClient, upstream_recv_code(status), None)
                        .inc();
                }
                self.gone(id);
            }
            GrpcEvent::Writable { .. }
            | GrpcEvent::ResponseHeaders { .. }
            | GrpcEvent::GoAway { .. } => {}
        }
    }

    fn after_dispatch(&mut self, grpc: &mut Grpc) {
        self.flush(grpc);
        // Each stream's send queue is its frontend's flow-control queue:
        // tell the router where it stands (a drop is progress).
        let now = konn_core::io::clock::now();
        let mut changed = false;
        let mut total = 0;
        {
            let mut router = self.cluster.router.borrow_mut();
            for (&id, s) in &mut self.streams {
                let level = grpc.queued_bytes(id);
                total += level;
                if level == 0 || level < s.level {
                    s.drained = now;
                }
                s.level = level;
                if router.frontend_queued(s.fid).is_some_and(|q| q != level) {
                    router.frontend_level(now, s.fid, level);
                    changed = true;
                }
            }
        }
        if changed {
            self.cluster.apply(&self.worker);
            self.flush(grpc);
        }
        self.account(grpc, total);
    }

    fn on_close(&mut self, _grpc: &mut Grpc, error: Option<&konn_core::Error>) {
        if let Some(e) = error {
            tracing::debug!(error = %e, "frontend connection ended");
        }
        let ids: Vec<u32> = self.streams.keys().copied().collect();
        for id in ids {
            self.gone(id);
        }
        self.outbox.close();
    }

    fn release_idle(&mut self) {
        self.streams.shrink();
        self.outbox.release_idle();
    }
}

impl Drop for FrontendConn {
    /// Closed or moved to another core: its queues no longer count here.
    fn drop(&mut self) {
        let _ = crate::budget::account(&self.worker.pool, self.queued, 0, || 1);
    }
}

/// The code grpc-go's server-side `Recv` reports for a call that ended
/// with `status` (upstream counts it in `stream_errors_total`): a lost
/// connection is `Canceled` there (the stream's context is cancelled), not
/// konn's `Unavailable`.
pub fn upstream_recv_code(status: GrpcStatus) -> GrpcStatus {
    if status == GrpcStatus::UNAVAILABLE {
        GrpcStatus::CANCELLED
    } else {
        status
    }
}
