//! Opening one tunnel to a proxy-server: dial, TLS, the HTTP/2 connection
//! and the `/AgentService/Connect` call with the agent's metadata.

use std::cell::Cell;
use std::rc::Rc;
use std::time::Duration;

use bytes::Bytes;
use konn_core::Error;
use konn_core::io::driver::{ConnHandle, DriverConfig};
use konn_core::io::notify::Notify;
use konn_core::io::pool::BufPool;
use konn_core::io::resolve::{dial_tcp, go_dial_error};
use konn_core::io::runtime::{Either, race};
use konn_core::io::tls::ClientTls;
use konn_protocol::grpc::Grpc;
use konn_protocol::h2::{self, Connection, Headers, Keepalive, Role};
use monoio::net::TcpStream;

use crate::conn::{TunnelEvent, TunnelHandler, TunnelObserver, TunnelSettings};

/// Everything needed to open tunnels to one server address.
#[derive(Clone)]
pub struct ConnectParams {
    /// `host:port` of the server's agent port (`--proxy-server-host`,
    /// `--proxy-server-port`).
    pub address: String,
    /// TLS towards the server; `None` only in tests.
    pub tls: Option<ClientTls>,
    /// `agentid`.
    pub agent_id: String,
    /// `agentidentifiers` (always sent, possibly empty, as upstream).
    pub agent_identifiers: String,
    /// `--service-account-token-path`, re-read on every connect.
    pub token_path: Option<std::path::PathBuf>,
    /// `--keepalive-time`.
    pub keepalive_time: Duration,
    /// Timeout of the TCP connect to the server.
    pub connect_timeout: Duration,
    /// Relay settings.
    pub settings: TunnelSettings,
    /// Driver settings.
    pub driver: DriverConfig,
}

/// The shortest keepalive interval: grpc-go raises a smaller
/// `ClientParameters.Time` (0 included) to 10 s, with a warning.
pub const MIN_KEEPALIVE_TIME: Duration = Duration::from_secs(10);

/// A tunnel's connection handle.
pub type TunnelHandle = ConnHandle<Grpc, TunnelHandler>;

impl ConnectParams {
    /// The request metadata of the Connect call. The token file is read
    /// now (upstream re-reads it on every connect) and never logged.
    pub fn metadata(&self) -> Result<Headers, Error> {
        let mut md = Headers::new();
        md.push(
            Bytes::from_static(b"agentid"),
            Bytes::from(self.agent_id.clone()),
        );
        md.push(
            Bytes::from_static(b"agentidentifiers"),
            Bytes::from(self.agent_identifiers.clone()),
        );
        if self.settings.flow_control {
            // konn's extension; a Go server ignores unknown metadata.
            md.push(
                Bytes::from_static(crate::conn::FLOW_CONTROL_KEY.as_bytes()),
                Bytes::from_static(b"1"),
            );
        }
        if !self.settings.resume_window.is_zero() {
            // konn's resumable tunnels; a Go server ignores it.
            md.push(
                Bytes::from_static(konn_protocol::resume::RESUME_METADATA.as_bytes()),
                Bytes::from_static(konn_protocol::resume::RESUME_VERSION.as_bytes()),
            );
        }
        if self.settings.reverse {
            // konn's reverse direction (KEP-2025), offered with --target.
            md.push(
                Bytes::from_static(crate::conn::REVERSE_KEY.as_bytes()),
                Bytes::from_static(b"1"),
            );
        }
        if let Some(path) = &self.token_path {
            let token = std::fs::read(path).map_err(Error::Io)?;
            let mut value = b"Bearer ".to_vec();
            value.extend_from_slice(&token);
            md.push_sensitive(Bytes::from_static(b"authorization"), Bytes::from(value));
        }
        Ok(md)
    }

    /// The HTTP/2 settings of a tunnel: grpc-go-compatible keepalive
    /// (PermitWithoutStream, 20 s ack timeout, and an interval of at least
    /// [`MIN_KEEPALIVE_TIME`], which grpc-go's `WithKeepaliveParams`
    /// enforces for upstream's agent, 0 included), large receive windows.
    pub fn h2_config(&self) -> h2::Config {
        let mut c = h2::Config::new(Role::Client);
        c.keepalive = Some(Keepalive {
            interval: self.keepalive_time.max(MIN_KEEPALIVE_TIME),
            timeout: Duration::from_secs(20),
            permit_without_stream: true,
        });
        c
    }
}

/// Dial the server and prepare a tunnel on it (not yet running: call
/// `handle.run(stream)`). Lifecycle events go to `report`.
pub async fn open_tunnel(
    params: &ConnectParams,
    pool: BufPool,
    report: Box<dyn FnMut(TunnelEvent)>,
) -> Result<(TunnelHandle, TcpStream), Error> {
    let handler = TunnelHandler::new(params.settings.clone(), pool, report);
    open_tunnel_with(
        params,
        params.h2_config(),
        konn_frames::grpc::DEFAULT_MAX_RECV_MESSAGE_SIZE,
        handler,
    )
    .await
}

/// [`open_tunnel`] with the caller's HTTP/2 settings (start from
/// [`ConnectParams::h2_config`]), largest received gRPC message, and
/// handler (e.g. one built with [`TunnelHandler::with_observer`]).
pub async fn open_tunnel_with(
    params: &ConnectParams,
    h2: h2::Config,
    max_message: u32,
    handler: TunnelHandler,
) -> Result<(TunnelHandle, TcpStream), Error> {
    let stream = dial_tcp(&params.address, params.connect_timeout)
        .await
        .map_err(|e| Error::Io(std::io::Error::other(go_dial_error(&params.address, &e))))?;
    let tls = match &params.tls {
        Some(t) => Some(t.layer()?),
        None => None,
    };
    let mut metadata = params.metadata()?;
    handler.offer_tokens(&mut metadata);
    let grpc = Grpc::new(
        Connection::new(h2, konn_core::io::clock::now()),
        max_message,
    );
    let handle = ConnHandle::new(grpc, tls, handler, params.driver);
    let authority = Bytes::from(params.address.clone());
    TunnelHandler::start(&handle, authority, &metadata)?;
    Ok((handle, stream))
}

/// How long [`run_tunnel`] waits for the endpoints of an ended tunnel to
/// let go of their sockets.
const ENDPOINTS_GONE_WAIT: Duration = Duration::from_secs(2);

/// Open a tunnel and run it to its end. Returns the error that ended it,
/// once its endpoints have closed their sockets too (bounded by
/// [`ENDPOINTS_GONE_WAIT`]), so nothing of the tunnel outlives the call.
pub async fn run_tunnel(
    params: Rc<ConnectParams>,
    pool: BufPool,
    report: Box<dyn FnMut(TunnelEvent)>,
) -> Result<(), Error> {
    let live = Rc::new(LiveEndpoints::default());
    let handler = TunnelHandler::with_observer(params.settings.clone(), pool, report, live.clone());
    let (handle, stream) = open_tunnel_with(
        &params,
        params.h2_config(),
        konn_frames::grpc::DEFAULT_MAX_RECV_MESSAGE_SIZE,
        handler,
    )
    .await?;
    let result = handle.run(stream).await;
    let deadline = monoio::time::Instant::now() + ENDPOINTS_GONE_WAIT;
    while live.open.get() > 0 {
        if let Either::Right(()) =
            race(live.gone.notified(), monoio::time::sleep_until(deadline)).await
        {
            tracing::warn!(
                open = live.open.get(),
                "endpoints still open after their tunnel ended"
            );
            break;
        }
    }
    result
}

/// Counts a tunnel's open endpoints for [`run_tunnel`].
#[derive(Default)]
struct LiveEndpoints {
    open: Cell<usize>,
    gone: Notify,
}

impl TunnelObserver for LiveEndpoints {
    fn endpoint_opened(&self) {
        self.open.set(self.open.get() + 1);
    }

    fn endpoint_closed(&self) {
        self.open.set(self.open.get().saturating_sub(1));
        self.gone.notify();
    }
}
