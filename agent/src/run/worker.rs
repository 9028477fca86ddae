//! A worker of the running agent: its tunnel attempts (dial, TLS, Connect),
//! DRAIN and stop for the tunnels it holds, the health and admin HTTP
//! servers on worker 0, and the per-core metrics observer.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use konn_core::http1::{self, Router};
use konn_core::io::listen::{accept_loop, tcp_into_monoio};
use konn_core::io::notify::Notify;
use konn_core::io::pool::BufPool;
use konn_core::io::runtime::{Either, StopToken, WorkerCtx, race};
use konn_core::io::xcore::{MeshSender, detach_tcp};
use konn_core::metrics::common::{ResumeResult, ReverseDirection, ReverseResult};
use konn_frames::GrpcStatus;
use konn_frames::packet::PacketType;
use konn_protocol::agent::sync::{Rng, TunnelId};
use konn_protocol::agent::tunnel::DialFailure;
use konn_protocol::h2;

use crate::client::{TunnelHandle, open_tunnel_with};
use crate::conn::{TunnelEvent, TunnelHandler, TunnelObserver};
use crate::debug::EndpointInfo;
use crate::health::{admin_router, health_router};
use crate::metrics::{AgentCoreMetrics, DialFailureReason, Direction, ReverseRefusal, Segment};
use crate::resume::ParkingLot;

use super::controller::Controller;
use super::{Inner, Msg, Report};

/// One tunnel attempt on a worker.
enum Slot {
    /// Dialling; notify to give up.
    Dialing(Rc<Notify>),
    /// Open (handshaking or connected).
    Running(TunnelHandle),
}

/// One worker's state.
struct Worker {
    inner: Arc<Inner>,
    h2: h2::Config,
    pool: BufPool,
    mesh: MeshSender<Msg>,
    observer: Rc<CoreObserver>,
    slots: RefCell<HashMap<TunnelId, Slot>>,
    draining: Cell<bool>,
    /// Attempt tasks still running.
    live: Cell<usize>,
    /// This worker's index.
    index: usize,
    /// Random numbers for reverse connections (which tunnel, dial ids).
    rng: RefCell<Rng>,
    /// Wakes the `/debug/connections` publisher ([`Msg::Watch`]).
    watch: Notify,
    /// Tunnels of this worker parked for a resume (`konn-resume`).
    parking: Rc<ParkingLot>,
}

pub(super) async fn worker_main(mut ctx: WorkerCtx<Msg>, inner: Arc<Inner>) {
    let index = ctx.index();
    let stop = ctx.stop_token().clone();
    let worker = Rc::new(Worker {
        h2: inner.settings.h2_config(),
        pool: ctx.pool().clone(),
        mesh: ctx.mesh().clone(),
        observer: Rc::new(CoreObserver::new(
            inner.metrics.core(index),
            &inner.settings.connect.agent_id,
        )),
        slots: RefCell::new(HashMap::new()),
        draining: Cell::new(false),
        live: Cell::new(0),
        index,
        rng: RefCell::new(Rng::new(konn_core::io::clock::seed())),
        parking: Rc::new(ParkingLot::new()),
        inner: inner.clone(),
        watch: Notify::new(),
    });
    let mut tasks = Vec::new();
    if let Some(listeners) = &inner.reverse {
        for (target, l) in listeners.per_target.iter().enumerate() {
            let Some(l) = l.take(index).and_then(|l| tcp_into_monoio(l).ok()) else {
                continue;
            };
            let (w, stop) = (worker.clone(), stop.clone());
            tasks.push(Some(monoio::spawn(async move {
                let _ = accept_loop(&l, &stop, |sock| w.reverse_accept(sock, target, true)).await;
            })));
        }
    }
    let controller =
        (index == 0).then(|| Rc::new(Controller::new(&inner, ctx.mesh().clone(), ctx.workers())));
    if let Some(ctl) = &controller {
        tasks.push(spawn_http(&worker, &stop, true));
        tasks.push(spawn_http(&worker, &stop, false));
        let (ctl, stop) = (ctl.clone(), stop.clone());
        tasks.push(Some(monoio::spawn(async move { ctl.run(&stop).await })));
    }
    {
        let (w, stop) = (worker.clone(), stop.clone());
        tasks.push(Some(monoio::spawn(async move {
            w.publish_connections(&stop).await
        })));
    }
    if let Some(mut inbox) = ctx.take_inbox() {
        let w = worker.clone();
        inbox
            .serve(&stop, 64, move |msg| match msg {
                Msg::Open(tunnel) => w.open(tunnel),
                Msg::Close(tunnel) => w.close(tunnel),
                Msg::Drain => {
                    w.drain();
                    if let Some(ctl) = &controller {
                        ctl.set_draining();
                    }
                }
                Msg::Report(tunnel, report) => {
                    if let Some(ctl) = &controller {
                        ctl.on_report(tunnel, report);
                    }
                }
                Msg::Reverse(fd, target) => match fd.attach() {
                    Ok(sock) => w.reverse_accept(sock, target, false),
                    Err(e) => {
                        tracing::debug!(error = %e, "could not take over a reverse connection")
                    }
                },
                Msg::LeaseCount(n) => {
                    if let Some(ctl) = &controller {
                        ctl.on_lease_count(n);
                    }
                }
                Msg::Watch => w.watch.notify(),
            })
            .await;
    } else {
        stop.stopped().await;
    }
    worker.close_all();
    worker.wait_idle(inner.settings.stop_timeout).await;
    for task in tasks.into_iter().flatten() {
        task.await;
    }
}

/// Serve the health (`true`) or admin port on this worker until stopped.
fn spawn_http(
    worker: &Rc<Worker>,
    stop: &StopToken,
    health: bool,
) -> Option<monoio::task::JoinHandle<()>> {
    let inner = &worker.inner;
    let listener = if health { &inner.health } else { &inner.admin };
    let listener = listener.as_ref()?.try_clone().ok()?;
    let router: Router = if health {
        let shared = inner.shared.clone();
        health_router(
            move || shared.connected.load(Ordering::Acquire) > 0,
            inner.metrics.registry().clone(),
        )
    } else {
        let w = worker.clone();
        admin_router(inner.health_port, inner.settings.enable_profiling).route(
            "/debug/connections",
            move |req| {
                http1::Response::new(200)
                    .with_header("Content-Type", "application/json")
                    .with_body(w.connections_json(req.query()))
            },
        )
    };
    let config = Rc::new(inner.settings.http.clone());
    let stop = stop.clone();
    Some(monoio::spawn(async move {
        let listener = match tcp_into_monoio(listener) {
            Ok(l) => l,
            Err(e) => {
                tracing::error!(error = %e, "health/admin server could not listen");
                return;
            }
        };
        if let Err(e) = http1::serve(&listener, &stop, Rc::new(router), config).await {
            tracing::error!(error = %e, "health/admin server stopped");
        }
    }))
}

impl Worker {
    /// Start tunnel attempt `tunnel` on this worker.
    fn open(self: &Rc<Self>, tunnel: TunnelId) {
        let cancel = Rc::new(Notify::new());
        self.slots
            .borrow_mut()
            .insert(tunnel, Slot::Dialing(cancel.clone()));
        self.live.set(self.live.get() + 1);
        monoio::spawn(self.clone().attempt(tunnel, cancel));
    }

    /// Close tunnel `tunnel` if it is still here. A tunnel still dialling
    /// loses its slot, so it is dropped even if its dial completes in the
    /// same instant.
    fn close(&self, tunnel: TunnelId) {
        let mut slots = self.slots.borrow_mut();
        let handle = match slots.get(&tunnel) {
            Some(Slot::Dialing(cancel)) => {
                cancel.notify();
                slots.remove(&tunnel);
                None
            }
            Some(Slot::Running(h)) => Some(h.clone()),
            None => None,
        };
        drop(slots);
        if let Some(h) = handle {
            let _ = h.with(|g, t| t.close(g));
        }
    }

    /// Send DRAIN on every tunnel here, and on those opened later.
    fn drain(&self) {
        self.draining.set(true);
        let running = self.running();
        tracing::info!(
            tunnels = running.len(),
            "sending DRAIN to the proxy-servers"
        );
        for h in running {
            let _ = h.with(|g, t| t.drain(g));
        }
    }

    /// Close everything (stop), parked tunnels included.
    fn close_all(&self) {
        let ids: Vec<TunnelId> = self.slots.borrow().keys().copied().collect();
        for id in ids {
            self.close(id);
        }
        self.parking.close_all();
    }

    fn running(&self) -> Vec<TunnelHandle> {
        self.slots
            .borrow()
            .values()
            .filter_map(|s| match s {
                Slot::Running(h) => Some(h.clone()),
                Slot::Dialing(_) => None,
            })
            .collect()
    }

    /// This worker's open endpoints and dials at `now`.
    fn snapshot(&self, now: std::time::Instant) -> Vec<EndpointInfo> {
        let mut out = Vec::new();
        for h in self.running() {
            let _ = h.with(|_, t| t.connections(self.index, now, &mut out));
        }
        out
    }

    /// `/debug/connections` (on the admin port's worker): the others are
    /// asked to publish (see `crate::debug`).
    fn connections_json(&self, query: Option<&str>) -> Vec<u8> {
        let now = konn_core::io::clock::now();
        for to in (0..self.inner.conns.workers()).filter(|&i| i != self.index) {
            let _ = self.mesh.send(to, Msg::Watch);
        }
        crate::debug::connections_json(
            self.snapshot(now),
            &self.inner.conns,
            self.index,
            query,
            now,
        )
    }

    /// Publish this worker's listing every `REFRESH` while someone looks
    /// (woken by [`Msg::Watch`]); idle otherwise. Ends when stopped.
    async fn publish_connections(&self, stop: &StopToken) {
        let board = &self.inner.conns;
        loop {
            if let Either::Right(()) = race(self.watch.notified(), stop.stopped()).await {
                return;
            }
            loop {
                let now = konn_core::io::clock::now();
                if !board.watched(now) {
                    break;
                }
                if board.wanted(self.index, now) {
                    board.publish(self.index, self.snapshot(now), now);
                }
                let tick = monoio::time::sleep(http1::board::REFRESH);
                if let Either::Right(()) = race(tick, stop.stopped()).await {
                    return;
                }
            }
        }
    }

    /// Wait until no attempt and no endpoint is left, at most `limit`.
    async fn wait_idle(&self, limit: Duration) {
        let deadline = monoio::time::Instant::now() + limit;
        while self.live.get() > 0 || self.observer.endpoints.get() > 0 {
            let sleep = monoio::time::sleep_until(deadline);
            if let Either::Right(()) = race(self.observer.idle.notified(), sleep).await {
                tracing::warn!(
                    tunnels = self.live.get(),
                    endpoints = self.observer.endpoints.get(),
                    "stopping with tunnels or endpoints still closing"
                );
                return;
            }
        }
    }

    /// A connection accepted on `--target` listener `target`: a random
    /// tunnel of this worker that offers the reverse direction asks for it;
    /// with none here, it moves (`may_move`) to a worker that has one; with
    /// none anywhere it is closed and counted.
    fn reverse_accept(&self, sock: monoio::net::TcpStream, target: usize, may_move: bool) {
        // Small requests (kubelet's, a watch's) must not wait for Nagle.
        let _ = sock.set_nodelay(true);
        let Some(dest) = self.inner.settings.reverse.targets.get(target) else {
            return;
        };
        let tunnels: Vec<TunnelHandle> = self
            .running()
            .into_iter()
            .filter(|h| h.with(|_, t| t.reverse_ready()).unwrap_or(false))
            .collect();
        let (pick, random) = {
            let mut rng = self.rng.borrow_mut();
            (rng.next_u64(), (rng.next_u64() >> 1) as i64)
        };
        if tunnels.is_empty() {
            let others = &self.inner.shared.reverse_tunnels;
            let to = (0..others.len())
                .map(|i| (self.index + 1 + i) % others.len())
                .find(|w| *w != self.index && others[*w].load(Ordering::Acquire) > 0);
            if let (true, Some(to)) = (may_move, to) {
                match detach_tcp(sock) {
                    Ok(fd) => {
                        if self.mesh.send(to, Msg::Reverse(fd, target)).is_ok() {
                            return;
                        }
                        tracing::debug!(worker = to, "reverse connection not handed over");
                    }
                    Err((_, e)) => tracing::debug!(error = %e, "reverse connection cannot move"),
                }
            }
            self.refuse_reverse(&dest.destination);
            return;
        }
        let h = &tunnels[(pick % tunnels.len() as u64) as usize];
        let asked = h.with(|g, t| t.reverse_accept(g, sock, &dest.destination, random));
        if !matches!(asked, Ok(Ok(()))) {
            self.refuse_reverse(&dest.destination);
        }
    }

    fn refuse_reverse(&self, destination: &str) {
        tracing::debug!(%destination, "node-to-control-plane connection closed: no tunnel offers it");
        if let Some(m) = &self.observer.metrics {
            m.reverse_dials(ReverseResult::Refused).inc();
            m.reverse_refusals(ReverseRefusal::NoTunnel).inc();
        }
    }

    fn report(mesh: &MeshSender<Msg>, tunnel: TunnelId, report: Report) {
        if mesh.send(0, Msg::Report(tunnel, report)).is_err() {
            tracing::debug!(tunnel, "could not report to the sync loop (stopping?)");
        }
    }

    /// Open, run and end one tunnel; always ends with [`Report::Ended`].
    async fn attempt(self: Rc<Self>, tunnel: TunnelId, cancel: Rc<Notify>) {
        let mesh = self.mesh.clone();
        // Whether this tunnel counts in `reverse_tunnels` (until it ends).
        let reverse = Rc::new(Cell::new(false));
        let (flag, shared, index) = (reverse.clone(), self.inner.shared.clone(), self.index);
        let wants_reverse = !self.inner.settings.reverse.targets.is_empty();
        let report = Box::new(move |event: TunnelEvent| {
            if let TunnelEvent::Connected { reverse: true, .. } = &event
                && !flag.replace(true)
                && let Some(n) = shared.reverse_tunnels.get(index)
            {
                n.fetch_add(1, Ordering::AcqRel);
            }
            if let TunnelEvent::Connected {
                reverse: false,
                server_id,
                ..
            } = &event
                && wants_reverse
            {
                tracing::warn!(
                    server_id = %server_id,
                    "this proxy-server does not offer konn's node-to-control-plane direction (KEP-2025, \
                     no konn-reverse answer): --target connections never use this tunnel"
                );
            }
            let report = match event {
                TunnelEvent::Connected {
                    server_id,
                    server_count,
                    resumed,
                    ..
                } => Report::Connected {
                    server_id,
                    server_count,
                    resumed,
                },
                TunnelEvent::Rejected(why) => Report::Rejected(why),
                TunnelEvent::Parked { server_id } => Report::Parked { server_id },
                TunnelEvent::ParkEnded { server_id } => Report::ParkEnded { server_id },
                // The attempt reports its own end below.
                TunnelEvent::Closed => return,
            };
            Self::report(&mesh, tunnel, report);
        });
        let params = &self.inner.settings.connect;
        let mut handler = TunnelHandler::with_observer(
            params.settings.clone(),
            self.pool.clone(),
            report,
            self.observer.clone(),
        );
        if !params.settings.resume_window.is_zero() {
            handler.set_parking(self.parking.clone());
        }
        let open = open_tunnel_with(
            params,
            self.h2.clone(),
            self.inner.settings.max_message,
            handler,
        );
        match race(open, cancel.notified()).await {
            // Closed while dialling: the connection is dropped unused.
            Either::Left(Ok(_)) if !self.slots.borrow().contains_key(&tunnel) => {}
            Either::Left(Ok((handle, stream))) => {
                if self.draining.get() {
                    let _ = handle.with(|g, t| t.drain(g));
                }
                self.slots
                    .borrow_mut()
                    .insert(tunnel, Slot::Running(handle.clone()));
                if let Err(e) = handle.run(stream).await {
                    tracing::debug!(tunnel, error = %e, "tunnel connection ended");
                }
            }
            Either::Left(Err(e)) => Self::report(&self.mesh, tunnel, Report::Failed(e.to_string())),
            Either::Right(()) => {}
        }
        self.slots.borrow_mut().remove(&tunnel);
        if reverse.get()
            && let Some(n) = self.inner.shared.reverse_tunnels.get(self.index)
        {
            n.fetch_sub(1, Ordering::AcqRel);
        }
        Self::report(&self.mesh, tunnel, Report::Ended);
        self.live.set(self.live.get() - 1);
        self.observer.idle.notify();
    }
}

/// Per-core metrics of every tunnel on a worker, and its endpoint count.
pub(super) struct CoreObserver {
    metrics: Option<AgentCoreMetrics>,
    /// This agent's id (`agent_id` of the connection families).
    agent_id: Box<str>,
    endpoints: Cell<usize>,
    /// Woken when an endpoint or an attempt ends (stop waits on it).
    idle: Notify,
}

impl CoreObserver {
    fn new(metrics: Option<AgentCoreMetrics>, agent_id: &str) -> Self {
        if metrics.is_none() {
            tracing::warn!("no metrics slab for this worker; its traffic is not counted");
        }
        Self {
            agent_id: agent_id.into(),
            metrics,
            endpoints: Cell::new(0),
            idle: Notify::new(),
        }
    }
}

impl TunnelObserver for CoreObserver {
    fn received(&self, ty: PacketType) {
        if let Some(m) = &self.metrics {
            m.stream_packets(Segment::ToAgent, ty).inc();
        }
    }

    fn sent(&self, ty: PacketType) {
        if let Some(m) = &self.metrics {
            m.stream_packets(Segment::FromAgent, ty).inc();
        }
    }

    fn stream_error(&self, status: GrpcStatus) {
        if let Some(m) = &self.metrics {
            m.stream_errors(Segment::ToAgent, status, None).inc();
            m.server_connection_failures(Direction::FromServer).inc();
        }
    }

    fn dial_succeeded(&self, elapsed: Duration) {
        if let Some(m) = &self.metrics {
            m.dial_duration().observe_duration(elapsed);
        }
    }

    fn dial_failed(&self, why: DialFailure) {
        if let Some(m) = &self.metrics {
            let reason = match why {
                DialFailure::Timeout => DialFailureReason::Timeout,
                DialFailure::Unknown => DialFailureReason::Unknown,
            };
            m.endpoint_dial_failures(reason).inc();
        }
    }

    fn dial_refused(&self, reason: konn_protocol::server::limits::Refusal, _address: &str) {
        if let Some(m) = &self.metrics {
            m.dial_refusals(reason).inc();
        }
    }

    fn endpoint_opened(&self) {
        self.endpoints.set(self.endpoints.get() + 1);
        if let Some(m) = &self.metrics {
            m.open_endpoint_connections().inc();
        }
    }

    fn endpoint_ended(&self, to_destination: u64, from_destination: u64, open: Duration) {
        if let Some(m) = &self.metrics {
            m.conn_ended(&konn_core::metrics::common::ConnEnd {
                agent_id: &self.agent_id,
                result: "closed",
                reason: "",
                to_destination,
                from_destination,
                duration: open,
                destination: "",
            });
        }
    }

    fn tunnel_parked(&self, connections: usize) {
        if let Some(m) = &self.metrics {
            m.parked_tunnels().inc();
            m.parked_connections().add(connections as f64);
        }
    }

    fn park_ended(&self, result: ResumeResult, connections: usize) {
        if let Some(m) = &self.metrics {
            m.parked_tunnels().dec();
            m.parked_connections().add(-(connections as f64));
            m.resumes(result).inc();
        }
    }

    fn endpoint_closed(&self) {
        self.endpoints.set(self.endpoints.get().saturating_sub(1));
        if let Some(m) = &self.metrics {
            m.open_endpoint_connections().dec();
        }
        self.idle.notify();
    }

    fn reverse_dialed(&self, ok: bool) {
        if let Some(m) = &self.metrics {
            if ok {
                m.reverse_dials(ReverseResult::Ok).inc();
            } else {
                m.reverse_dials(ReverseResult::Refused).inc();
                m.reverse_refusals(ReverseRefusal::Refused).inc();
            }
        }
    }

    fn reverse_connection(&self, open: bool) {
        // Counted with the endpoints for a clean stop.
        if open {
            self.endpoints.set(self.endpoints.get() + 1);
        } else {
            self.endpoints.set(self.endpoints.get().saturating_sub(1));
            self.idle.notify();
        }
        if let Some(m) = &self.metrics {
            if open {
                m.reverse_connections().inc();
            } else {
                m.reverse_connections().dec();
            }
        }
    }

    fn reverse_bytes(&self, to_control_plane: bool, n: usize) {
        if let Some(m) = &self.metrics {
            let direction = if to_control_plane {
                ReverseDirection::ToControlPlane
            } else {
                ReverseDirection::ToNode
            };
            m.reverse_bytes(direction).add(n as u64);
        }
    }
}
