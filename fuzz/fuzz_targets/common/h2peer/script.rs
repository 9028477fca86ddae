//! The script a fuzz input decodes into: the connection's configuration
//! and the steps (peer frames, deliveries, transmits, time, application
//! calls).

use std::time::Duration;

use arbitrary::Arbitrary;
use konn_frames::h2::SettingId;
use konn_protocol::h2::{Config, Keepalive, Limits, PingPolicy, Role};

/// One fuzz case: which connection, then a script.
#[derive(Arbitrary, Debug)]
pub struct Input<A> {
    pub client: bool,
    pub cfg: CfgSel,
    /// The peer starts correctly (client preface and/or SETTINGS).
    pub preface: bool,
    pub ops: Vec<Op<A>>,
}

/// Configuration knobs, small enough that every limit can be reached.
#[derive(Arbitrary, Debug)]
pub struct CfgSel {
    pub grpc_go_like: bool,
    pub tiny_limits: bool,
    pub stream_window: Option<u16>,
    pub conn_window: Option<u16>,
    pub max_streams: Option<u8>,
    pub max_header_list: Option<u16>,
    /// Keepalive interval and timeout in units of 100 ms, and
    /// `permit_without_stream`.
    pub keepalive: Option<(u8, u8, bool)>,
    pub ping_policy: Option<(u8, bool)>,
    pub encoder_table: Option<u16>,
}

impl CfgSel {
    pub fn config(&self, role: Role) -> Config {
        let mut c = if self.grpc_go_like {
            Config::grpc_go_like(role)
        } else {
            Config::new(role)
        };
        if self.tiny_limits {
            c.limits = Limits {
                max_pending_control: 4,
                max_empty_frames: 3,
                remote_resets: (3, 1),
                local_resets: (3, 1),
                max_continuation_frames: 2,
                max_header_block: 256,
                closed_streams_remembered: 4,
            };
        }
        if let Some(w) = self.stream_window {
            c.stream_window = u32::from(w);
        }
        if let Some(w) = self.conn_window {
            c.conn_window = u32::from(w);
        }
        if let Some(m) = self.max_streams {
            c.max_concurrent_streams = u32::from(m % 8);
        }
        if let Some(m) = self.max_header_list {
            c.max_header_list_size = u32::from(m);
        }
        if let Some((i, t, p)) = self.keepalive {
            c.keepalive = Some(Keepalive {
                interval: Duration::from_millis(100 * u64::from(i.max(1))),
                timeout: Duration::from_millis(100 * u64::from(t.max(1))),
                permit_without_stream: p,
            });
        }
        if let Some((s, p)) = self.ping_policy {
            c.ping_policy = Some(PingPolicy {
                min_time: Duration::from_millis(100 * u64::from(s)),
                permit_without_stream: p,
                max_strikes: 2,
            });
        }
        if let Some(t) = self.encoder_table {
            c.max_encoder_table_size = u32::from(t);
        }
        c
    }
}

/// One step of the script.
#[derive(Arbitrary, Debug)]
pub enum Op<A> {
    /// The peer writes a frame, and everything it wrote is delivered.
    Frame(PeerFrame),
    /// The peer writes a frame; only this many of its pending bytes are
    /// delivered (the rest waits for the next delivery).
    Split(PeerFrame, u16),
    /// The peer writes raw bytes.
    Raw(Vec<u8>),
    /// Deliver up to this many of the peer's bytes (0: all) and handle them.
    Feed(u16),
    /// `poll_transmit` with this `max` (0: unbounded).
    Transmit(u16),
    /// Time passes (ms); due timers run.
    Advance(u16),
    /// `handle_timeout` now, due or not.
    Timeout,
    /// An application call.
    App(A),
}

/// A stream id as the script names it.
#[derive(Arbitrary, Debug, Clone, Copy)]
pub enum Sid {
    /// One of the ids seen so far (opened by either side).
    Known(u8),
    /// The peer's next new stream id.
    Next,
    Zero,
    Raw(u32),
}

/// A 32-bit value, biased towards the edges that matter.
#[derive(Arbitrary, Debug, Clone, Copy)]
pub enum Val {
    Small(u16),
    Edge(u8),
    Raw(u32),
}

impl Val {
    pub fn get(self) -> u32 {
        const EDGES: [u32; 10] = [
            0,
            1,
            16_383,
            16_384,
            65_535,
            65_536,
            (1 << 24) - 1,
            (1 << 31) - 1,
            1 << 31,
            u32::MAX,
        ];
        match self {
            Self::Small(v) => u32::from(v),
            Self::Edge(i) => EDGES[usize::from(i) % EDGES.len()],
            Self::Raw(v) => v,
        }
    }
}

#[derive(Arbitrary, Debug, Clone, Copy)]
pub enum SetId {
    HeaderTableSize,
    EnablePush,
    MaxConcurrentStreams,
    InitialWindowSize,
    MaxFrameSize,
    MaxHeaderListSize,
    Other(u16),
}

impl SetId {
    pub(super) fn id(self) -> SettingId {
        match self {
            Self::HeaderTableSize => SettingId::HEADER_TABLE_SIZE,
            Self::EnablePush => SettingId::ENABLE_PUSH,
            Self::MaxConcurrentStreams => SettingId::MAX_CONCURRENT_STREAMS,
            Self::InitialWindowSize => SettingId::INITIAL_WINDOW_SIZE,
            Self::MaxFrameSize => SettingId::MAX_FRAME_SIZE,
            Self::MaxHeaderListSize => SettingId::MAX_HEADER_LIST_SIZE,
            Self::Other(v) => SettingId(v),
        }
    }
}

/// PING payloads: konn's own (keepalive, BDP, graceful GOAWAY) or any.
#[derive(Arbitrary, Debug, Clone, Copy)]
pub enum PingData {
    Keepalive,
    Bdp,
    GoAway,
    Raw([u8; 8]),
}

/// A header list the peer may send.
#[derive(Arbitrary, Debug, Clone)]
pub enum HeaderSet {
    GrpcRequest,
    GrpcRequestWithTimeout(bool),
    GetRequest,
    RequestWrongContentType,
    RequestContentLength(u8),
    MalformedRequest(u8),
    GrpcResponse,
    PlainResponse(u16),
    Informational,
    GrpcTrailers(u8, bool),
    TrailersWithPseudo,
    /// Many copies of a field (header list and HPACK table limits).
    Many(u16),
    /// Fields named from a short list with any values.
    Custom(Vec<(u8, Vec<u8>)>),
}

/// Frames the peer can write.
#[derive(Arbitrary, Debug)]
pub enum PeerFrame {
    Settings(Vec<(SetId, Val)>),
    SettingsAck,
    Ping {
        ack: bool,
        data: PingData,
    },
    WindowUpdate {
        sid: Sid,
        inc: Val,
    },
    Rst {
        sid: Sid,
        code: u8,
    },
    GoAway {
        last: Sid,
        code: u8,
        debug: u8,
    },
    /// A header block as HEADERS plus CONTINUATIONs cut at `cuts` bytes;
    /// `unfinished` leaves the last frame without END_HEADERS. No `set`:
    /// what the stream expects next (a gRPC request; a gRPC response, then
    /// its trailers).
    Headers {
        sid: Sid,
        set: Option<HeaderSet>,
        end_stream: bool,
        cuts: Vec<u8>,
        unfinished: bool,
        pad: Option<u8>,
        priority: Option<(Sid, u8, bool)>,
    },
    /// A lone CONTINUATION carrying raw bytes.
    Continuation {
        sid: Sid,
        end_headers: bool,
        fragment: Vec<u8>,
    },
    /// DATA with `len` bytes of payload.
    Data {
        sid: Sid,
        len: u16,
        end_stream: bool,
        pad: Option<u8>,
    },
    /// gRPC messages (`(length, compressed flag)`) cut into DATA frames
    /// of `cut` bytes (0: one frame).
    Grpc {
        sid: Sid,
        msgs: Vec<(u16, u8)>,
        cut: u16,
        end_stream: bool,
    },
    /// A gRPC prefix announcing `len` bytes, and only `have` of them.
    GrpcPrefix {
        sid: Sid,
        len: u32,
        have: u8,
    },
    Priority {
        sid: Sid,
        dep: Sid,
        weight: u8,
        exclusive: bool,
    },
    PushPromise {
        sid: Sid,
        promised: Sid,
    },
    Unknown {
        ty: u8,
        flags: u8,
        sid: Sid,
        len: u8,
    },
    /// The client preface again.
    Preface,
}
