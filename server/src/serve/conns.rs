//! One connection of a running proxy-server, from accept to its handler:
//! an agent's (SNI admission, TLS, the Connect stream), a frontend's (gRPC
//! or HTTP CONNECT, over a Unix socket or TCP+mTLS), and one that migrated
//! here from another core (a frontend following its agent, an agent
//! resuming a tunnel parked here).

use konn_core::io::driver::Detached;
use konn_core::io::future::then;

use super::*;

/// Remember a connection of `cluster` for a graceful shutdown and for the
/// cluster's removal; [`Cluster::untrack`] it when it ends.
fn register<H: Handler<Grpc> + 'static>(
    worker: &Worker,
    cluster: &Cluster,
    handle: &ConnHandle<Grpc, H>,
) -> u64 {
    let id = worker.next_id();
    let weak = handle.downgrade();
    cluster.track(
        worker,
        id,
        Box::new(move |how| {
            if let Some(h) = weak.upgrade() {
                match how {
                    Stop::Graceful => h.shutdown(),
                    Stop::Now => h.abort(),
                }
            }
        }),
    );
    id
}

/// Why an agent connection was refused before TLS (the `reason` label of
/// `konn_server_agent_sni_refusals_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SniRefusal {
    NoServerName,
    UnknownServerName,
    NotTls,
    Timeout,
}

impl SniRefusal {
    const fn label(self) -> &'static str {
        match self {
            Self::NoServerName => "no_server_name",
            Self::UnknownServerName => "unknown_server_name",
            Self::NotTls => "not_tls",
            Self::Timeout => "timeout",
        }
    }
}

/// With `--clusters-config`: read the ClientHello (within the TLS
/// handshake deadline), and pick the cluster its server name selects.
/// Returns the cluster and the bytes read, for the TLS layer to start
/// from.
async fn admit_by_sni(
    worker: &Worker,
    sock: &mut TcpStream,
) -> Result<(Rc<Cluster>, BytesMut), SniRefusal> {
    let peek = async {
        let mut hello = konn_core::io::tls::ClientHelloPeek::new();
        let mut seen = BytesMut::new();
        loop {
            let buf = Vec::with_capacity(4096);
            let (r, buf) = sock.read(buf).await;
            match r {
                Ok(n) if n > 0 => {}
                _ => return Err(SniRefusal::NotTls),
            }
            seen.extend_from_slice(&buf);
            match hello.feed(&buf) {
                Ok(Some(h)) => return Ok((h.server_name, seen)),
                Ok(None) => {}
                Err(_) => return Err(SniRefusal::NotTls),
            }
        }
    };
    let deadline = konn_core::io::tls::DEFAULT_HANDSHAKE_TIMEOUT;
    let (name, seen) = match race(
        monoio::time::timeout(deadline, peek),
        worker.stopping.wait(),
    )
    .await
    {
        Either::Left(Ok(r)) => r?,
        Either::Left(Err(_)) | Either::Right(()) => return Err(SniRefusal::Timeout),
    };
    let name = name.ok_or(SniRefusal::NoServerName)?;
    let cluster = worker.by_sni.borrow().get(&name).cloned();
    match cluster {
        Some(c) => Ok((c, seen)),
        None => {
            tracing::debug!(server_name = %name, "agent for no configured cluster");
            Err(SniRefusal::UnknownServerName)
        }
    }
}

/// Serve a connection accepted on the agent port: spawn its task. Without
/// `--clusters-config` the set-up is synchronous and the task is the
/// driver loop alone ([`run_agent`]); with it, the ClientHello is read
/// first, in a boxed future that is gone once the cluster is known, so the
/// task keeps no room for it while the tunnel lives.
pub(super) fn serve_agent(worker: &Rc<Worker>, sock: TcpStream) {
    if worker.settings.multi_cluster() {
        worker.spawn(admit_agent(worker.clone(), sock));
        return;
    }
    let Some(cluster) = worker.first_cluster() else {
        return;
    };
    if let Some(run) = start_agent(worker.clone(), cluster, sock, BytesMut::new()) {
        worker.spawn(run);
    }
}

/// `--clusters-config`: admit by SNI, then run the connection.
async fn admit_agent(worker: Rc<Worker>, mut sock: TcpStream) {
    let (cluster, input) = match Box::pin(admit_by_sni(&worker, &mut sock)).await {
        Ok(admitted) => admitted,
        Err(why) => {
            tracing::debug!(reason = why.label(), "agent connection refused before TLS");
            worker.all_metrics.sni_refusal(why.label());
            return;
        }
    };
    if let Some(run) = start_agent(worker, cluster, sock, input) {
        run.await;
    }
}

/// The TLS layer and the gRPC session of a new agent connection, and its
/// driver loop; `None` when TLS cannot be set up.
fn start_agent(
    worker: Rc<Worker>,
    cluster: Rc<Cluster>,
    sock: TcpStream,
    input: BytesMut,
) -> Option<impl Future<Output = ()> + 'static> {
    let tls = match cluster
        .settings
        .agents
        .tls
        .as_ref()
        .map(|t| t.layer())
        .transpose()
    {
        Ok(t) => t,
        Err(e) => {
            tracing::warn!(error = %e, "agent TLS setup failed");
            return None;
        }
    };
    let s = &worker.settings;
    let grpc = Grpc::new(
        Connection::new(worker.agent_h2.clone(), konn_core::io::clock::now()),
        s.max_message,
    );
    let input = (input, BytesMut::new());
    Some(run_agent(
        worker,
        cluster,
        sock,
        grpc,
        tls,
        input,
        Vec::new(),
    ))
}

/// Run an agent connection; `stashed` are the events of one that moved
/// here (it moves at most once: to the worker that parked the tunnel its
/// resume token names, see `crate::agents`).
///
/// As [`run_grpc_frontend`]: the set-up is synchronous and only the driver
/// loop is a future, so the tunnel's task keeps no room for `grpc`, `tls`
/// and `input` after they moved into the driver, and the outcome (a whole
/// detached connection when it moves) is handled by [`after_agent`]
/// outside the future.
fn run_agent(
    worker: Rc<Worker>,
    cluster: Rc<Cluster>,
    sock: TcpStream,
    grpc: Grpc,
    tls: Option<TlsLayer>,
    input: (BytesMut, BytesMut),
    stashed: Vec<konn_protocol::grpc::GrpcEvent>,
) -> impl Future<Output = ()> + 'static {
    let s = &worker.settings;
    let outbox = Rc::new(Outbox::new());
    let handler = AgentConn::new(worker.clone(), cluster.clone(), outbox.clone());
    let handle = ConnHandle::resume(grpc, tls, input, handler, s.driver);
    let plan = Rc::new(RefCell::new(None));
    let may_move = stashed.is_empty() && worker.workers > 1;
    let (weak, flag) = (handle.downgrade(), handle.detach_flag());
    let _ = handle.with(|_, h| h.set_driver(weak, flag, plan.clone(), may_move));
    install_poke(&outbox, &handle);
    let id = register(&worker, &cluster, &handle);
    if !stashed.is_empty() {
        let _ = handle.with(|g, h| {
            for ev in stashed {
                h.on_event(g, ev);
            }
        });
    }
    // A named future: an `async` block would keep a slot for the socket
    // beside the driver loop's own.
    then(handle.run_detachable(sock), move |outcome| {
        cluster.untrack(&worker, id);
        after_agent(worker, cluster, outcome, &plan)
    })
}

/// The connection a driver loop handed back to move it; `None` when the
/// loop ended (`what`: the kind of connection, for the log).
fn moving<IO>(
    outcome: Result<Option<Detached<IO, Grpc>>, Error>,
    what: &'static str,
) -> Option<Detached<IO, Grpc>> {
    outcome
        .inspect_err(|e| tracing::debug!(error = %e, kind = what, "connection ended"))
        .ok()
        .flatten()
}

/// What follows an agent connection's driver loop: nothing, a move to the
/// worker that parked its tunnel, or — when the socket cannot move —
/// serving it here after all (the returned future).
fn after_agent(
    worker: Rc<Worker>,
    cluster: Rc<Cluster>,
    outcome: Result<Option<Detached<TcpStream, Grpc>>, Error>,
    plan: &RefCell<Option<AgentPlan>>,
) -> Option<konn_core::io::future::Next> {
    let detached = moving(outcome, "agent")?;
    let plan = plan.borrow_mut().take()?;
    match detach_tcp(detached.io) {
        Ok(fd) => {
            let m = Migrant {
                cluster: cluster.id,
                fd: MovingFd::Tcp(fd),
                kind: MigrantKind::Agent {
                    session: Box::new(detached.session),
                    tls: detached.tls,
                    input: detached.input,
                    stashed: plan.stashed,
                },
            };
            if worker
                .out
                .send(plan.target, Msg::Adopt(Box::new(m)))
                .is_err()
            {
                tracing::debug!(
                    worker = plan.target,
                    "agent connection not handed to a stopped worker"
                );
            }
            None
        }
        Err((io, e)) => {
            // Served here: its token finds nothing to resume here.
            tracing::debug!(error = %e, "agent connection cannot move; serving it here");
            Some(Box::pin(run_agent(
                worker,
                cluster,
                io,
                detached.session,
                detached.tls,
                detached.input,
                plan.stashed,
            )))
        }
    }
}

/// The outbox of a connection flushes itself by poking its driver.
fn install_poke<H: Handler<Grpc> + 'static>(outbox: &Outbox, handle: &ConnHandle<Grpc, H>) {
    let weak = handle.downgrade();
    outbox.set_poke(Box::new(move || {
        if let Some(h) = weak.upgrade() {
            let _ = h.with(|_, _| ());
        }
    }));
}

/// A frontend socket of either kind.
pub(super) enum FrontSock {
    Tcp(TcpStream),
    Unix(UnixStream),
}

/// Set up a frontend connection and spawn its task. Synchronous, so the
/// task holds only the future that serves the connection (a set-up step
/// awaited inside the task would size it for its largest state for the
/// connection's whole life).
pub(super) fn serve_frontend(
    worker: &Rc<Worker>,
    cluster: Rc<Cluster>,
    sock: FrontSock,
    migrate: Rc<dyn Fn(usize, Migrant)>,
) {
    let s = &worker.settings;
    let fe = &cluster.settings.frontend;
    let tls = match (&sock, fe.tls.as_ref()) {
        (FrontSock::Tcp(_), Some(t)) => match t.layer() {
            Ok(l) => Some(l),
            Err(e) => {
                tracing::warn!(error = %e, "frontend TLS setup failed");
                return;
            }
        },
        _ => None,
    };
    match fe.mode {
        Mode::Grpc => {
            let grpc = Grpc::new(
                Connection::new(worker.frontend_h2.clone(), konn_core::io::clock::now()),
                s.max_message,
            );
            let (w, c) = (worker.clone(), cluster);
            match sock {
                FrontSock::Tcp(t) => {
                    worker.spawn(run_grpc_frontend(w, c, t, grpc, tls, None, migrate));
                }
                FrontSock::Unix(u) => {
                    worker.spawn(run_grpc_frontend(w, c, u, grpc, tls, None, migrate));
                }
            }
        }
        Mode::HttpConnect => {
            let wire = Wire::new(
                match sock {
                    FrontSock::Tcp(t) => Sock::Tcp(t),
                    FrontSock::Unix(u) => Sock::Unix(u),
                },
                tls.map(Box::new),
                BytesMut::new(),
            );
            worker.spawn(connect_frontend(worker.clone(), cluster, wire, migrate));
        }
    }
}

/// Sockets a frontend can move with.
trait Movable: Split + AsyncReadRent + AsyncWriteRent + ReadReady + Sized + 'static {
    /// Detach for a move; on failure the socket comes back, to be served
    /// where it is.
    fn detach(self) -> Result<MovingFd, (Self, Error)>;
    /// The peer, for the audit log and (with `identity`) the per-frontend
    /// limits; `tls` is the connection's TLS state so far (a moved
    /// connection's names its client already).
    fn who(&self, tls: Option<&TlsLayer>, identity: bool) -> Who;
}

impl Movable for TcpStream {
    fn detach(self) -> Result<MovingFd, (Self, Error)> {
        detach_tcp(self).map(MovingFd::Tcp)
    }
    fn who(&self, tls: Option<&TlsLayer>, identity: bool) -> Who {
        let addr = self.peer_addr().ok();
        match tls {
            Some(t) if !t.is_handshaking() => {
                Who::Known(crate::accounting::tcp_peer(addr, Some(t), identity))
            }
            _ => Who::Tcp(addr, identity),
        }
    }
}

impl Movable for UnixStream {
    fn detach(self) -> Result<MovingFd, (Self, Error)> {
        detach_unix(self).map(MovingFd::Unix)
    }
    fn who(&self, _tls: Option<&TlsLayer>, identity: bool) -> Who {
        Who::Known(crate::accounting::unix_peer(
            std::os::fd::AsRawFd::as_raw_fd(self),
            identity,
        ))
    }
}

/// Run a gRPC frontend connection; move it when its first dial says so.
/// `resumed` carries the state of a connection that moved here.
///
/// The set-up is synchronous and only the driver loop is async, so the
/// task's state does not keep room for `grpc` and `tls` after they moved
/// into the driver (an `async fn` keeps its arguments' slots alive: 2.4 KiB
/// per idle connection). For the same reason the driver's outcome (a whole
/// detached connection when it moves) is handled by [`after_frontend`]
/// outside the future.
fn run_grpc_frontend<IO: Movable>(
    worker: Rc<Worker>,
    cluster: Rc<Cluster>,
    io: IO,
    grpc: Grpc,
    tls: Option<TlsLayer>,
    resumed: Option<((BytesMut, BytesMut), Plan)>,
    migrate: Rc<dyn Fn(usize, Migrant)>,
) -> impl Future<Output = ()> {
    let s = &worker.settings;
    let outbox = Rc::new(Outbox::new());
    let plan = Rc::new(RefCell::new(None));
    let mut handler = FrontendConn::new(
        worker.clone(),
        cluster.clone(),
        outbox.clone(),
        plan.clone(),
    );
    if let Some(identity) = crate::accounting::peer_wanted(&worker, &cluster) {
        handler.set_peer(io.who(tls.as_ref(), identity));
    }
    let (handle, replay) = match resumed {
        Some((input, moved)) => {
            handler.adopt(&moved.streams);
            // A connection moves at most once.
            handler.no_more_moves();
            (
                ConnHandle::resume(grpc, tls, input, handler, s.driver),
                moved.stashed,
            )
        }
        None => (ConnHandle::new(grpc, tls, handler, s.driver), Vec::new()),
    };
    // The driver's own detach flag is the one the handler sets.
    let flag = handle.detach_flag();
    let weak = handle.downgrade();
    let _ = handle.with(|_, h| h.set_driver(flag, weak));
    install_poke(&outbox, &handle);
    let id = register(&worker, &cluster, &handle);
    if !replay.is_empty() {
        let _ = handle.with(|g, h| {
            for ev in replay {
                h.on_event(g, ev);
            }
        });
    }
    // As in `run_agent`: no slot for `io` beside the driver loop's.
    then(handle.run_detachable(io), move |outcome| {
        cluster.untrack(&worker, id);
        after_frontend(worker, cluster, outcome, &plan, migrate)
    })
}

/// What follows a gRPC frontend's driver loop: nothing, a move to another
/// core, or — when the socket cannot move — serving it here after all
/// (the returned future; its flows are relayed).
fn after_frontend<IO: Movable>(
    worker: Rc<Worker>,
    cluster: Rc<Cluster>,
    outcome: Result<Option<Detached<IO, Grpc>>, Error>,
    plan: &RefCell<Option<Plan>>,
    migrate: Rc<dyn Fn(usize, Migrant)>,
) -> Option<konn_core::io::future::Next> {
    let detached = moving(outcome, "frontend")?;
    let plan = plan.borrow_mut().take()?;
    let target = plan.target;
    match detached.io.detach() {
        Ok(fd) => {
            migrate(
                target,
                Migrant {
                    cluster: cluster.id,
                    fd,
                    kind: MigrantKind::Grpc {
                        session: Box::new(detached.session),
                        tls: detached.tls,
                        input: detached.input,
                        plan,
                    },
                },
            );
            None
        }
        Err((io, e)) => {
            tracing::debug!(error = %e, "frontend connection cannot move; serving it here");
            Some(Box::pin(run_grpc_frontend(
                worker,
                cluster,
                io,
                detached.session,
                detached.tls,
                Some((detached.input, plan)),
                migrate,
            )))
        }
    }
}

async fn connect_frontend(
    worker: Rc<Worker>,
    cluster: Rc<Cluster>,
    mut wire: Wire,
    migrate: Rc<dyn Fn(usize, Migrant)>,
) {
    if worker.stopped.get() {
        return;
    }
    let head = race(
        read_head(&mut wire, worker.settings.connect_header_timeout),
        worker.stopping.wait(),
    )
    .await;
    let target = match head {
        Either::Left(Head::Connect(t)) => t,
        Either::Left(Head::Done) | Either::Right(()) => return,
    };
    let core = {
        let router = cluster.router.borrow();
        router
            .directory()
            .pick(&target, worker.random(), worker.index)
            .map(|e| e.core)
    };
    match core {
        Some(to) if to != worker.index => {
            let (sock, tls, plain) = wire.into_parts();
            let fd = match sock {
                Sock::Tcp(t) => t.detach().map_err(|(t, e)| (Sock::Tcp(t), e)),
                Sock::Unix(u) => u.detach().map_err(|(u, e)| (Sock::Unix(u), e)),
            };
            match fd {
                Ok(fd) => migrate(
                    to,
                    Migrant {
                        cluster: cluster.id,
                        fd,
                        kind: MigrantKind::Connect { tls, plain, target },
                    },
                ),
                Err((sock, e)) => {
                    // Served here after all; its flow is relayed.
                    tracing::debug!(error = %e, "CONNECT connection cannot move; serving it here");
                    serve_connect(worker, cluster, Wire::new(sock, tls, plain), target).await;
                }
            }
        }
        _ => serve_connect(worker, cluster, wire, target).await,
    }
}

/// Continue a frontend that moved to this worker: spawn the task that
/// serves it. Synchronous, so that task holds neither the migrant nor the
/// box its session travelled in.
pub(super) fn adopt(worker: &Rc<Worker>, m: Migrant, migrate: Rc<dyn Fn(usize, Migrant)>) {
    // Its cluster was removed meanwhile: the connection closes (dropped).
    let Some(cluster) = worker.clusters.borrow().get(&m.cluster).cloned() else {
        return;
    };
    let w = worker.clone();
    match (m.fd, m.kind) {
        (
            fd,
            MigrantKind::Grpc {
                session,
                tls,
                input,
                plan,
            },
        ) => {
            let resumed = Some((input, plan));
            match fd {
                MovingFd::Tcp(f) => match f.attach() {
                    Ok(sock) => worker.spawn(run_grpc_frontend(
                        w, cluster, sock, *session, tls, resumed, migrate,
                    )),
                    Err(e) => tracing::warn!(error = %e, "could not adopt a frontend"),
                },
                MovingFd::Unix(f) => match f.attach() {
                    Ok(sock) => worker.spawn(run_grpc_frontend(
                        w, cluster, sock, *session, tls, resumed, migrate,
                    )),
                    Err(e) => tracing::warn!(error = %e, "could not adopt a frontend"),
                },
            }
        }
        (
            MovingFd::Tcp(f),
            MigrantKind::Agent {
                session,
                tls,
                input,
                stashed,
            },
        ) => match f.attach() {
            Ok(sock) => worker.spawn(run_agent(w, cluster, sock, *session, tls, input, stashed)),
            Err(e) => tracing::warn!(error = %e, "could not adopt an agent connection"),
        },
        (MovingFd::Unix(_), MigrantKind::Agent { .. }) => {
            tracing::warn!("an agent connection cannot be a Unix socket");
        }
        (fd, MigrantKind::Connect { tls, plain, target }) => {
            let sock = match fd {
                MovingFd::Tcp(f) => f.attach().map(Sock::Tcp),
                MovingFd::Unix(f) => f.attach().map(Sock::Unix),
            };
            match sock {
                Ok(sock) => {
                    let wire = Wire::new(sock, tls, plain);
                    worker.spawn(serve_connect(w, cluster, wire, target));
                }
                Err(e) => tracing::warn!(error = %e, "could not adopt a CONNECT connection"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use konn_core::io::pool::{BufPool, MemoryBudget, PoolConfig};
    use konn_core::io::runtime::{Engine, block_on};

    use super::*;
    use crate::metrics::ServerMetrics;
    use crate::settings::{FrontendListen, Mode, ServerSettings};
    use crate::worker::Shared;

    /// An agent tunnel's task is its driver loop alone: it keeps no room
    /// for the gRPC session and the TLS layer that moved into the driver.
    /// As an `async fn` taking them, `run_agent` kept both slots for the
    /// tunnel's life (with the accept task, 9 of S9's 23.6 KiB per tunnel).
    #[test]
    fn an_agent_task_keeps_no_room_for_what_moved_into_the_driver() {
        let settings = Arc::new(ServerSettings::for_tests(
            FrontendListen::Unix("/nonexistent".into()),
            Mode::Grpc,
        ));
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let peer =
            std::net::TcpStream::connect(listener.local_addr().expect("addr")).expect("connect");
        let (accepted, _) = listener.accept().expect("accept");
        let metrics = ServerMetrics::new(1);
        let budget = MemoryBudget::new(1 << 20);
        let worker = Rc::new(Worker::new(
            0,
            1,
            settings.clone(),
            BufPool::new(&budget, &PoolConfig::default()),
            Arc::new(Shared::default()),
            1,
            metrics.clone(),
            konn_core::io::xcore::Mesh::new(1, 16).sender(),
        ));
        let cluster = Cluster::new(
            1,
            0,
            Arc::new(settings.implicit_cluster()),
            metrics.core(0).expect("slab"),
            metrics,
            None,
        );
        worker.add_cluster(cluster.clone());
        let size = block_on(Engine::Epoll, async move {
            let sock = TcpStream::from_std(accepted).expect("monoio socket");
            let grpc = Grpc::new(
                Connection::new(worker.agent_h2.clone(), konn_core::io::clock::now()),
                settings.max_message,
            );
            let task = run_agent(
                worker,
                cluster,
                sock,
                grpc,
                None,
                (BytesMut::new(), BytesMut::new()),
                Vec::new(),
            );
            size_of_val(&task)
        })
        .expect("runtime");
        drop(peer);
        assert!(
            size < size_of::<Grpc>() && size < size_of::<TlsLayer>(),
            "the agent task is {size} bytes: it holds room for the session ({}) or TLS ({})",
            size_of::<Grpc>(),
            size_of::<TlsLayer>()
        );
    }
}
