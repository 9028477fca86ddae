//! Opening one tunnel to a proxy-server: dial, TLS, the HTTP/2 connection
//! and the `/AgentService/Connect` call with the agent's metadata.

use std::rc::Rc;
use std::time::Duration;

use bytes::Bytes;
use konn_core::Error;
use konn_core::io::driver::{ConnHandle, DriverConfig};
use konn_core::io::pool::BufPool;
use konn_core::io::resolve::{dial_tcp, go_dial_error};
use konn_core::io::tls::ClientTls;
use konn_core::proto::grpc::Grpc;
use konn_core::proto::h2::{self, Connection, Headers, Keepalive, Role};
use monoio::net::TcpStream;

use crate::conn::{TunnelEvent, TunnelHandler, TunnelSettings};

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
    let metadata = params.metadata()?;
    let grpc = Grpc::new(
        Connection::new(h2, konn_core::io::clock::now()),
        max_message,
    );
    let handle = ConnHandle::new(grpc, tls, handler, params.driver);
    let authority = Bytes::from(params.address.clone());
    TunnelHandler::start(&handle, authority, &metadata)?;
    Ok((handle, stream))
}

/// Open a tunnel and run it to its end. Returns the error that ended it.
pub async fn run_tunnel(
    params: Rc<ConnectParams>,
    pool: BufPool,
    report: Box<dyn FnMut(TunnelEvent)>,
) -> Result<(), Error> {
    let (handle, stream) = open_tunnel(&params, pool, report).await?;
    handle.run(stream).await
}
