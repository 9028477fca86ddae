//! The server's run-time settings, independent of how they were given
//! (flags map onto them in `options`; tests build them directly).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use konn_core::io::driver::DriverConfig;
use konn_core::io::runtime::RuntimeConfig;
use konn_core::io::tls::ServerTls;
use konn_core::proto::h2::{self, Keepalive, PingPolicy, Role};

use crate::backends::Strategy;
use crate::router::RouterConfig;

/// The frontend protocol (`--mode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// `/ProxyService/Proxy` gRPC streams.
    Grpc,
    /// HTTP/1.1 CONNECT.
    HttpConnect,
}

/// Where frontends connect.
#[derive(Clone, Debug)]
pub enum FrontendListen {
    /// A Unix socket (`--uds-name`), plaintext.
    Unix(PathBuf),
    /// TCP with mTLS (`--server-port`).
    Tcp(SocketAddr),
}

/// Everything the server needs to run.
#[derive(Clone)]
pub struct ServerSettings {
    /// `serverid` sent to agents.
    pub server_id: String,
    /// `servercount` sent to agents.
    pub server_count: usize,
    /// `--proxy-strategies`.
    pub strategies: Vec<Strategy>,
    /// Frontend protocol.
    pub mode: Mode,
    /// Frontend listener.
    pub frontend: FrontendListen,
    /// Remove an existing socket file before listening.
    pub delete_existing_uds: bool,
    /// Frontend TLS (TCP mode).
    pub frontend_tls: Option<ServerTls>,
    /// Agent listener address.
    pub agent_addr: SocketAddr,
    /// Agent TLS (always in production; `None` only in tests).
    pub agent_tls: Option<ServerTls>,
    /// `--keepalive-time` (agent port).
    pub keepalive_time: Duration,
    /// `--frontend-keepalive-time`.
    pub frontend_keepalive_time: Duration,
    /// Router limits and the dial deadline.
    pub router: RouterConfig,
    /// A tunnel counts as congested above this many queued bytes…
    pub tunnel_high_water: usize,
    /// …and drained again at this many.
    pub tunnel_low_water: usize,
    /// A frontend with more bytes queued than this stops being served.
    pub frontend_queue_limit: usize,
    /// A CONNECT client that accepts nothing for this long is closed.
    pub stuck_timeout: Duration,
    /// Time allowed to send the CONNECT request head (upstream: 60 s).
    pub connect_header_timeout: Duration,
    /// Largest gRPC message accepted.
    pub max_message: u32,
    /// HTTP/2 receive windows: per stream, per connection.
    pub windows: (u32, u32),
    /// Driver settings (write and handshake timeouts).
    pub driver: DriverConfig,
    /// Threads and io engine.
    pub runtime: RuntimeConfig,
    /// `--graceful-shutdown-timeout`.
    pub graceful_shutdown_timeout: Duration,
}

impl ServerSettings {
    /// Settings for tests: plaintext agent port on 127.0.0.1:0, the given
    /// frontend, defaults elsewhere.
    pub fn for_tests(frontend: FrontendListen, mode: Mode) -> Self {
        Self {
            server_id: "test-server".into(),
            server_count: 1,
            strategies: vec![Strategy::Default],
            mode,
            frontend,
            delete_existing_uds: true,
            frontend_tls: None,
            agent_addr: "127.0.0.1:0".parse().expect("literal"),
            agent_tls: None,
            keepalive_time: Duration::from_secs(3600),
            frontend_keepalive_time: Duration::from_secs(3600),
            router: RouterConfig::default(),
            tunnel_high_water: 4 << 20,
            tunnel_low_water: 1 << 20,
            frontend_queue_limit: 16 << 20,
            stuck_timeout: Duration::from_secs(30),
            connect_header_timeout: Duration::from_secs(60),
            max_message: konn_frames::grpc::DEFAULT_MAX_RECV_MESSAGE_SIZE,
            windows: (4 << 20, 16 << 20),
            driver: DriverConfig::default(),
            runtime: RuntimeConfig::default(),
            graceful_shutdown_timeout: Duration::ZERO,
        }
    }

    /// HTTP/2 settings of the agent port: upstream's keepalive enforcement
    /// (MinTime 30 s, pings without streams allowed), server keepalive.
    pub fn agent_h2(&self) -> h2::Config {
        let mut c = h2::Config::new(Role::Server);
        c.stream_window = self.windows.0;
        c.conn_window = self.windows.1;
        c.ping_policy = Some(PingPolicy::UPSTREAM_AGENT_PORT);
        c.keepalive = Some(Keepalive {
            interval: self.keepalive_time,
            timeout: Duration::from_secs(20),
            permit_without_stream: true,
        });
        c
    }

    /// HTTP/2 settings of the gRPC frontend port: grpc-go's default ping
    /// enforcement, frontend keepalive.
    pub fn frontend_h2(&self) -> h2::Config {
        let mut c = h2::Config::new(Role::Server);
        c.stream_window = self.windows.0;
        c.conn_window = self.windows.1;
        c.ping_policy = Some(PingPolicy::GRPC_DEFAULT);
        c.keepalive = Some(Keepalive {
            interval: self.frontend_keepalive_time,
            timeout: Duration::from_secs(20),
            permit_without_stream: true,
        });
        c
    }
}
