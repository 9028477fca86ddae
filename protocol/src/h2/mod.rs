//! Sans-IO HTTP/2 connection (RFC 9113), client and server roles.
//!
//! [`Connection`] owns everything about one HTTP/2 connection except the
//! socket and the clock: the preface and SETTINGS exchange, HPACK contexts,
//! stream states, flow control in both directions, PINGs (keepalive, BDP,
//! grpc-go's ping enforcement), GOAWAY and graceful drain, and the abuse
//! limits of [`Limits`]. A driver feeds it bytes and time and writes out what
//! it produces:
//!
//! ```text
//!            handle_input(now, &mut BytesMut) ──► poll_event() ──► application
//!  socket ──►                                                        │
//!            ◄── poll_transmit(now, &mut BytesMut)  ◄── open_stream / send_* / release_*
//!            handle_timeout(now) at poll_timeout()
//! ```
//!
//! **Call order** (like quinn-proto): after any input, command or timeout,
//! drain [`Connection::poll_event`], then call [`Connection::poll_transmit`]
//! until it writes nothing, then re-arm the timer with
//! [`Connection::poll_timeout`]. Stop reading the socket while
//! [`Connection::wants_read`] is false (the peer is flooding us with frames
//! that need replies); close it once [`Connection::is_closed`].
//!
//! DATA payloads are handed out as `Bytes` slices of the input buffer (no
//! copy). Receive credit returns to the peer only through
//! [`Connection::release_capacity`], so the receive windows bound how much
//! the peer can make us buffer.

mod conn;
mod flow;
mod headers;
mod limits;
mod stream;

#[cfg(test)]
mod tests;

use std::time::Duration;

use bytes::Bytes;
use konn_frames::Reason;

pub use conn::{Connection, MAX_VECTORED, Payloads, Stats, VECTORED_MIN};
pub use headers::{Field, Headers, Malformed};
pub use limits::Limits;

/// Which end of the connection we are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// We sent the preface and open streams (the agent).
    Client,
    /// We accept streams (proxy-server's listeners).
    Server,
}

/// Keepalive PINGs we send (grpc-go `keepalive.ClientParameters` /
/// `ServerParameters.Time`/`Timeout`).
#[derive(Clone, Copy, Debug)]
pub struct Keepalive {
    /// PING after this long without receiving anything.
    pub interval: Duration,
    /// Close the connection when the PING is not acknowledged within this.
    pub timeout: Duration,
    /// Also PING when no stream is open.
    pub permit_without_stream: bool,
}

/// Server-side enforcement of the peer's PING rate (grpc-go
/// `keepalive.EnforcementPolicy`): more than `max_strikes` violations end the
/// connection with GOAWAY `ENHANCE_YOUR_CALM` and debug data `too_many_pings`.
#[derive(Clone, Copy, Debug)]
pub struct PingPolicy {
    /// Minimum time between the peer's PINGs (upstream agent port: 30 s).
    pub min_time: Duration,
    /// PINGs without an open stream are allowed (upstream agent port: true).
    pub permit_without_stream: bool,
    /// Violations tolerated (grpc-go: 2).
    pub max_strikes: u32,
}

impl PingPolicy {
    /// The policy of upstream proxy-server's agent port: MinTime 30 s,
    /// PermitWithoutStream true.
    pub const UPSTREAM_AGENT_PORT: Self = Self {
        min_time: Duration::from_secs(30),
        permit_without_stream: true,
        max_strikes: 2,
    };
    /// grpc-go's default policy (upstream frontend port): 5 min, no pings
    /// without streams.
    pub const GRPC_DEFAULT: Self = Self {
        min_time: Duration::from_secs(300),
        permit_without_stream: false,
        max_strikes: 2,
    };
}

/// Configuration of one connection. Windows are in bytes.
#[derive(Clone, Debug)]
pub struct Config {
    /// Client or server.
    pub role: Role,
    /// SETTINGS_MAX_CONCURRENT_STREAMS we advertise (streams the peer may open).
    pub max_concurrent_streams: u32,
    /// SETTINGS_INITIAL_WINDOW_SIZE we advertise: per-stream receive window.
    pub stream_window: u32,
    /// Connection receive window we open right after the preface.
    pub conn_window: u32,
    /// Grow receive windows by BDP estimation up to this size (`None`: the
    /// windows stay as configured).
    pub bdp_limit: Option<u32>,
    /// SETTINGS_MAX_FRAME_SIZE we advertise.
    pub max_frame_size: u32,
    /// SETTINGS_MAX_HEADER_LIST_SIZE we advertise and enforce.
    pub max_header_list_size: u32,
    /// SETTINGS_HEADER_TABLE_SIZE we advertise (our HPACK decoder's table).
    pub header_table_size: u32,
    /// Largest HPACK table we use for encoding, whatever the peer allows.
    pub max_encoder_table_size: u32,
    /// Keepalive PINGs we send.
    pub keepalive: Option<Keepalive>,
    /// Enforcement of the peer's PINGs (server role).
    pub ping_policy: Option<PingPolicy>,
    /// Abuse limits.
    pub limits: Limits,
    /// Fail the connection when the peer's preface and first SETTINGS have
    /// not arrived this long after the connection was created (for a server
    /// that includes the TLS handshake: it is created at accept). grpc-go
    /// allows 120 s (`connectionTimeout`). `None`: no deadline.
    pub preface_timeout: Option<Duration>,
    /// Start a graceful shutdown (GOAWAY `max_idle`) once the connection has
    /// had no stream for this long (grpc-go's `MaxConnectionIdle`). `None`:
    /// never.
    pub idle_timeout: Option<Duration>,
}

impl Config {
    /// konn's defaults for a role: 1 MiB stream and 4 MiB connection windows
    /// (fast towards any sender; the windows bound what one peer can make us
    /// buffer), 16 KiB frames (what grpc-go accepts), no BDP growth.
    pub fn new(role: Role) -> Self {
        Self {
            role,
            max_concurrent_streams: 1024,
            stream_window: 1 << 20,
            conn_window: 4 << 20,
            bdp_limit: None,
            max_frame_size: 16_384,
            max_header_list_size: 64 * 1024,
            header_table_size: 4096,
            max_encoder_table_size: 4096,
            keepalive: None,
            ping_policy: None,
            limits: Limits::default(),
            preface_timeout: None,
            idle_timeout: None,
        }
    }

    /// `self` with [`Config::preface_timeout`] and [`Config::idle_timeout`]
    /// replaced where a value is given (a listener's driver settings).
    pub fn with_deadlines(mut self, preface: Option<Duration>, idle: Option<Duration>) -> Self {
        self.preface_timeout = preface.or(self.preface_timeout);
        self.idle_timeout = idle.or(self.idle_timeout);
        self
    }

    /// grpc-go's receive behaviour: 64 KiB initial windows grown by BDP
    /// estimation up to 16 MiB.
    pub fn grpc_go_like(role: Role) -> Self {
        Self {
            stream_window: 65_535,
            conn_window: 65_535,
            bdp_limit: Some(16 << 20),
            ..Self::new(role)
        }
    }
}

/// Something that happened on the connection, for the application.
#[derive(Debug)]
pub enum Event {
    /// A stream's initial headers: a new request (server) or the response
    /// head (client). Already validated (RFC 9113 §8).
    Headers {
        /// Stream id.
        id: u32,
        /// The header list.
        headers: Headers,
        /// The peer ended its side with these headers.
        end_stream: bool,
    },
    /// Trailers; the peer's side of the stream is finished.
    Trailers {
        /// Stream id.
        id: u32,
        /// The trailer fields.
        headers: Headers,
    },
    /// Data from the peer. Call [`Connection::release_capacity`] with its
    /// length once it has been passed on.
    Data {
        /// Stream id.
        id: u32,
        /// The payload (a slice of the input buffer).
        data: Bytes,
        /// The peer ended its side.
        end_stream: bool,
    },
    /// The stream was reset, by the peer (`remote`) or by us because of a
    /// stream error the peer caused.
    Reset {
        /// Stream id.
        id: u32,
        /// The RST_STREAM error code.
        reason: Reason,
        /// Sent by the peer.
        remote: bool,
    },
    /// The stream's send queue fell to the level asked for with
    /// [`Connection::notify_when_drained`].
    Writable {
        /// Stream id.
        id: u32,
    },
    /// The peer sent GOAWAY: no new streams; streams above `last_stream_id`
    /// were not processed (they also get `Reset` events).
    GoAway {
        /// Last stream the peer processed.
        last_stream_id: u32,
        /// Error code.
        reason: Reason,
        /// Debug data (e.g. `too_many_pings`).
        debug: Bytes,
    },
}
