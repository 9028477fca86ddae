//! The shared half of the stateful HTTP/2 fuzz targets (`h2_conn`,
//! `grpc_conn`): a scripted peer that writes frame *sequences* at one
//! `konn_protocol::h2::Connection` (valid-ish frames built with
//! konn-frames' encoders and HPACK encoder, mixed with raw bytes), a
//! checker that decodes everything the connection writes back, and the
//! driver loop that interleaves peer frames, partial deliveries, timer
//! steps, `poll_transmit` calls of any size and the application's calls
//! (supplied by each target through [`App`]).
//!
//! After every step the driver checks:
//! - the state machine's own invariants (`check_invariants`: windows in
//!   range, queue accounting, the stream table within its limits, no lost
//!   wake-up, nothing but a GOAWAY after an error);
//! - the receive-credit ledger: the credit the connection says is
//!   unreleased equals what the application was handed and did not
//!   release (nothing lost, nothing made up);
//! - what was written: whole, decodable frames no larger than the peer's
//!   SETTINGS_MAX_FRAME_SIZE; header blocks the peer's HPACK decoder
//!   accepts (the compression contexts stay in step); DATA bytes exactly
//!   the bytes the application queued on that stream, in order, never
//!   more; after a connection error at most the one GOAWAY that reports it
//!   (with its code), then nothing at all;
//! - the target's own checks ([`App::check`]).
//!
//! At the end the connection is aborted if it has not failed, and after one
//! flush it must be closed (`is_closed`) with no timer armed.

#![allow(dead_code)] // each target uses part of it

use std::collections::HashMap;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use arbitrary::Arbitrary;
use bytes::{BufMut, Bytes, BytesMut};
use konn_frames::Reason;
use konn_frames::h2::{self as wire, Frame, FrameType, Head, Priority, SettingId};
use konn_frames::hpack;
use konn_protocol::Error;
use konn_protocol::h2::{Config, Connection, Keepalive, Limits, PingPolicy, Role};

/// The one reading of the real clock; every instant is `epoch() + d`.
pub fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

// ----- the input -------------------------------------------------------------

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
    fn id(self) -> SettingId {
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

// ----- the peer --------------------------------------------------------------

/// The scripted peer's state.
pub struct Peer {
    /// Bytes written, not yet delivered.
    pub out: BytesMut,
    enc: hpack::Encoder,
    next_id: u32,
    our_role: Role,
    /// Streams the peer sent a header block on.
    headers_sent: std::collections::HashSet<u32>,
}

impl Peer {
    fn new(our_role: Role) -> Self {
        Self {
            out: BytesMut::new(),
            enc: hpack::Encoder::new(),
            // A client peer opens odd streams; a server peer has none of
            // its own (konn never accepts pushes), so "next" is even.
            next_id: match our_role {
                Role::Server => 1,
                Role::Client => 2,
            },
            our_role,
            headers_sent: std::collections::HashSet::new(),
        }
    }

    fn sid(&mut self, s: Sid, known: &[u32]) -> u32 {
        match s {
            Sid::Known(i) if !known.is_empty() => known[usize::from(i) % known.len()],
            Sid::Known(_) | Sid::Next => {
                let id = self.next_id;
                self.next_id = self.next_id.saturating_add(2);
                id
            }
            Sid::Zero => 0,
            Sid::Raw(v) => v & 0x7fff_ffff,
        }
    }

    fn block(&mut self, set: &HeaderSet) -> Vec<u8> {
        const NAMES: [&[u8]; 10] = [
            b":path",
            b":method",
            b":status",
            b"content-type",
            b"content-length",
            b"te",
            b"grpc-status",
            b"grpc-message",
            b"x-konn",
            b"Upper",
        ];
        let req = |extra: &[(&[u8], &[u8])]| {
            let mut v: Vec<(Vec<u8>, Vec<u8>)> = vec![
                (b":method".to_vec(), b"POST".to_vec()),
                (b":scheme".to_vec(), b"http".to_vec()),
                (b":path".to_vec(), b"/AgentService/Connect".to_vec()),
                (b":authority".to_vec(), b"konn".to_vec()),
            ];
            v.extend(extra.iter().map(|(n, x)| (n.to_vec(), x.to_vec())));
            v
        };
        let grpc: &[(&[u8], &[u8])] =
            &[(b"content-type", b"application/grpc"), (b"te", b"trailers")];
        let fields: Vec<(Vec<u8>, Vec<u8>)> = match set {
            HeaderSet::GrpcRequest => req(grpc),
            HeaderSet::GrpcRequestWithTimeout(ok) => {
                let mut v = req(grpc);
                let t: &[u8] = if *ok { b"10S" } else { b"x" };
                v.push((b"grpc-timeout".to_vec(), t.to_vec()));
                v
            }
            HeaderSet::GetRequest => {
                let mut v = req(grpc);
                v[0].1 = b"GET".to_vec();
                v
            }
            HeaderSet::RequestWrongContentType => req(&[(b"content-type", b"text/plain")]),
            HeaderSet::RequestContentLength(n) => {
                let mut v = req(grpc);
                v.push((b"content-length".to_vec(), n.to_string().into_bytes()));
                v
            }
            HeaderSet::MalformedRequest(k) => {
                let mut v = req(grpc);
                match k % 4 {
                    0 => {
                        v.remove(2);
                    }
                    1 => v.push((b"connection".to_vec(), b"keep-alive".to_vec())),
                    2 => v.push((b"te".to_vec(), b"gzip".to_vec())),
                    _ => v.insert(4, (b":path".to_vec(), b"/again".to_vec())),
                }
                v
            }
            HeaderSet::GrpcResponse => vec![
                (b":status".to_vec(), b"200".to_vec()),
                (b"content-type".to_vec(), b"application/grpc".to_vec()),
            ],
            HeaderSet::PlainResponse(s) => {
                vec![(
                    b":status".to_vec(),
                    (100 + s % 500).to_string().into_bytes(),
                )]
            }
            HeaderSet::Informational => vec![(b":status".to_vec(), b"100".to_vec())],
            HeaderSet::GrpcTrailers(s, msg) => {
                let mut v = vec![(b"grpc-status".to_vec(), (s % 20).to_string().into_bytes())];
                if *msg {
                    v.push((b"grpc-message".to_vec(), b"bad%20thing%ZZ".to_vec()));
                }
                v
            }
            HeaderSet::TrailersWithPseudo => vec![
                (b":status".to_vec(), b"200".to_vec()),
                (b"grpc-status".to_vec(), b"0".to_vec()),
            ],
            HeaderSet::Many(n) => {
                let mut v = req(grpc);
                for i in 0..usize::from(*n % 2048) {
                    v.push((b"x-many".to_vec(), vec![b'a' + (i % 26) as u8; 40]));
                }
                v
            }
            HeaderSet::Custom(fields) => fields
                .iter()
                .map(|(n, v)| (NAMES[usize::from(*n) % NAMES.len()].to_vec(), v.clone()))
                .collect(),
        };
        let mut dst = BytesMut::new();
        self.enc.encode(
            fields.iter().map(|(n, v)| hpack::Field {
                name: n,
                value: v,
                sensitive: false,
            }),
            &mut dst,
        );
        dst.to_vec()
    }

    fn frame(&mut self, f: &PeerFrame, known: &[u32]) {
        let out = &mut self.out;
        match f {
            PeerFrame::Settings(params) => {
                let p: Vec<(SettingId, u32)> =
                    params.iter().map(|(i, v)| (i.id(), v.get())).collect();
                wire::encode_settings(&p, out);
            }
            PeerFrame::SettingsAck => wire::encode_settings_ack(out),
            PeerFrame::Ping { ack, data } => {
                let payload = match data {
                    PingData::Keepalive => *b"konn-ka\0",
                    PingData::Bdp => *b"konn-bdp",
                    PingData::GoAway => *b"konn-ga\0",
                    PingData::Raw(b) => *b,
                };
                wire::encode_ping(*ack, payload, out);
            }
            PeerFrame::WindowUpdate { sid, inc } => {
                let stream_id = self.sid(*sid, known);
                Frame::WindowUpdate {
                    stream_id,
                    increment: inc.get(),
                }
                .encode(&mut self.out);
            }
            PeerFrame::Rst { sid, code } => {
                let stream_id = self.sid(*sid, known);
                Frame::RstStream {
                    stream_id,
                    reason: Reason(u32::from(*code % 16)),
                }
                .encode(&mut self.out);
            }
            PeerFrame::GoAway { last, code, debug } => {
                let last_stream_id = self.sid(*last, known);
                let debug = vec![b'd'; usize::from(*debug)];
                Frame::GoAway {
                    last_stream_id,
                    reason: Reason(u32::from(*code % 16)),
                    debug_data: &debug,
                }
                .encode(&mut self.out);
            }
            PeerFrame::Headers {
                sid,
                set,
                end_stream,
                cuts,
                unfinished,
                pad,
                priority,
            } => {
                let stream_id = self.sid(*sid, known);
                let natural = match self.our_role {
                    Role::Server => HeaderSet::GrpcRequest,
                    Role::Client if self.headers_sent.contains(&stream_id) => {
                        HeaderSet::GrpcTrailers(0, false)
                    }
                    Role::Client => HeaderSet::GrpcResponse,
                };
                self.headers_sent.insert(stream_id);
                let block = self.block(set.as_ref().unwrap_or(&natural));
                let priority = priority.map(|(dep, weight, exclusive)| Priority {
                    dependency: self.sid(dep, known),
                    weight,
                    exclusive,
                });
                let mut rest: &[u8] = &block;
                let mut first = true;
                let mut cuts = cuts.iter();
                loop {
                    let n = cuts
                        .next()
                        .map_or(rest.len(), |&c| usize::from(c).min(rest.len()));
                    let (chunk, tail) = rest.split_at(n);
                    let end_headers = tail.is_empty() && !*unfinished;
                    if first {
                        Frame::Headers {
                            stream_id,
                            end_stream: *end_stream,
                            end_headers,
                            priority,
                            pad_len: *pad,
                            fragment: chunk,
                        }
                        .encode(&mut self.out);
                        first = false;
                    } else {
                        Frame::Continuation {
                            stream_id,
                            end_headers,
                            fragment: chunk,
                        }
                        .encode(&mut self.out);
                    }
                    rest = tail;
                    if rest.is_empty() {
                        break;
                    }
                }
            }
            PeerFrame::Continuation {
                sid,
                end_headers,
                fragment,
            } => {
                let stream_id = self.sid(*sid, known);
                Frame::Continuation {
                    stream_id,
                    end_headers: *end_headers,
                    fragment,
                }
                .encode(&mut self.out);
            }
            PeerFrame::Data {
                sid,
                len,
                end_stream,
                pad,
            } => {
                let stream_id = self.sid(*sid, known);
                let data = vec![0x5a; usize::from(*len)];
                Frame::Data {
                    stream_id,
                    end_stream: *end_stream,
                    data: &data,
                    pad_len: *pad,
                }
                .encode(&mut self.out);
            }
            PeerFrame::Grpc {
                sid,
                msgs,
                cut,
                end_stream,
            } => {
                let stream_id = self.sid(*sid, known);
                let mut body = Vec::new();
                for &(len, flag) in msgs {
                    body.push(flag % 3);
                    body.extend_from_slice(&u32::from(len).to_be_bytes());
                    body.extend(std::iter::repeat_n(0x6b, usize::from(len)));
                }
                let cut = if *cut == 0 {
                    body.len().max(1)
                } else {
                    usize::from(*cut)
                };
                let chunks: Vec<&[u8]> = if body.is_empty() {
                    vec![&[]]
                } else {
                    body.chunks(cut).collect()
                };
                let last = chunks.len() - 1;
                for (i, data) in chunks.into_iter().enumerate() {
                    Frame::Data {
                        stream_id,
                        end_stream: *end_stream && i == last,
                        data,
                        pad_len: None,
                    }
                    .encode(&mut self.out);
                }
            }
            PeerFrame::GrpcPrefix { sid, len, have } => {
                let stream_id = self.sid(*sid, known);
                let mut data = vec![0];
                data.extend_from_slice(&len.to_be_bytes());
                data.extend(std::iter::repeat_n(1, usize::from(*have)));
                Frame::Data {
                    stream_id,
                    end_stream: false,
                    data: &data,
                    pad_len: None,
                }
                .encode(&mut self.out);
            }
            PeerFrame::Priority {
                sid,
                dep,
                weight,
                exclusive,
            } => {
                let stream_id = self.sid(*sid, known);
                let dependency = self.sid(*dep, known);
                Frame::Priority {
                    stream_id,
                    priority: Priority {
                        dependency,
                        weight: *weight,
                        exclusive: *exclusive,
                    },
                }
                .encode(&mut self.out);
            }
            PeerFrame::PushPromise { sid, promised } => {
                let stream_id = self.sid(*sid, known);
                let promised_id = self.sid(*promised, known);
                let block = self.block(&HeaderSet::GrpcRequest);
                Frame::PushPromise {
                    stream_id,
                    end_headers: true,
                    promised_id,
                    pad_len: None,
                    fragment: &block,
                }
                .encode(&mut self.out);
            }
            PeerFrame::Unknown {
                ty,
                flags,
                sid,
                len,
            } => {
                let stream_id = self.sid(*sid, known);
                let payload = vec![0x33; usize::from(*len)];
                Frame::Unknown {
                    head: Head {
                        len: u32::from(*len),
                        ty: FrameType(10 + ty % 240),
                        flags: *flags,
                        stream_id,
                    },
                    payload: &payload,
                }
                .encode(&mut self.out);
            }
            PeerFrame::Preface => self.out.put_slice(wire::PREFACE),
        }
    }
}

// ----- what the connection writes ----------------------------------------

/// Decodes and checks everything the connection writes.
struct Output {
    /// Client role: the preface is still to come.
    preface_due: bool,
    transmits: u32,
    hpack: hpack::Decoder,
    hpack_max: u32,
    /// A header block is open on this stream (CONTINUATION must follow).
    open_block: Option<u32>,
    /// The GOAWAY that reports our connection error has been written.
    final_goaway: bool,
    /// The header block being collected.
    pending: Vec<u8>,
}

impl Output {
    fn new(role: Role) -> Self {
        let limits = hpack::DecoderLimits {
            max_header_list_size: u32::MAX,
            max_string_len: u32::MAX,
            max_fields: u32::MAX,
            max_size_updates: 8,
        };
        Self {
            preface_due: role == Role::Client,
            transmits: 0,
            hpack: hpack::Decoder::with_limits(4096, limits),
            hpack_max: 4096,
            open_block: None,
            final_goaway: false,
            pending: Vec::new(),
        }
    }

    /// Checks one `poll_transmit`'s output; `failed` is the connection's
    /// error before the call. Returns the DATA written per stream.
    fn check(
        &mut self,
        conn: &Connection,
        failed: Option<Error>,
        mut out: &[u8],
        data: &mut Vec<(u32, Bytes)>,
    ) -> Result<(), String> {
        self.transmits += 1;
        if self.preface_due {
            if !out.starts_with(wire::PREFACE) {
                return Err("client output does not start with the preface".into());
            }
            out = &out[wire::PREFACE.len()..];
            self.preface_due = false;
        }
        let limit = conn.remote_settings().max_frame_size;
        let table = conn.remote_settings().header_table_size;
        if table > self.hpack_max {
            self.hpack_max = table;
            self.hpack.set_max_table_size(table);
        }
        let mut first = self.transmits == 1;
        while !out.is_empty() {
            let (frame, n) = match wire::decode(out, wire::MAX_FRAME_LEN) {
                Ok(Some(f)) => f,
                Ok(None) => return Err(format!("partial frame written: {out:?}")),
                Err(e) => return Err(format!("undecodable frame written: {e} in {out:?}")),
            };
            let head = frame.head();
            if head.len > limit {
                return Err(format!(
                    "wrote a {}-byte frame, peer allows {limit}",
                    head.len
                ));
            }
            if let Some(id) = self.open_block
                && !matches!(frame, Frame::Continuation { stream_id, .. } if stream_id == id)
            {
                return Err(format!("{frame:?} inside a header block of stream {id}"));
            }
            if let Some(e) = &failed {
                let initial = first
                    && matches!(
                        frame,
                        Frame::Settings { ack: false, .. }
                            | Frame::WindowUpdate { stream_id: 0, .. }
                    );
                if !initial {
                    let want = match e {
                        Error::H2Local { reason, .. } => Some(*reason),
                        Error::Frame(f) => Some(f.h2().map_or(Reason::PROTOCOL_ERROR, |(r, _)| r)),
                        _ => None,
                    };
                    match frame {
                        Frame::GoAway { reason, .. }
                            if !self.final_goaway && Some(reason) == want =>
                        {
                            self.final_goaway = true;
                        }
                        _ => {
                            return Err(format!(
                                "after connection error {e:?} (GOAWAY written: {}) wrote {frame:?}",
                                self.final_goaway
                            ));
                        }
                    }
                }
            }
            first = first && matches!(frame, Frame::Settings { .. } | Frame::WindowUpdate { .. });
            match frame {
                Frame::Headers {
                    stream_id,
                    end_headers,
                    fragment,
                    ..
                } => {
                    self.block(stream_id, end_headers, fragment)?;
                }
                Frame::Continuation {
                    stream_id,
                    end_headers,
                    fragment,
                } => {
                    if self.open_block != Some(stream_id) {
                        return Err(format!("stray CONTINUATION on {stream_id}"));
                    }
                    self.block(stream_id, end_headers, fragment)?;
                }
                Frame::Data {
                    stream_id,
                    data: d,
                    pad_len,
                    ..
                } => {
                    if pad_len.is_some() {
                        return Err("konn pads DATA".into());
                    }
                    data.push((stream_id, Bytes::copy_from_slice(d)));
                }
                Frame::PushPromise { .. } => return Err("konn pushed".into()),
                _ => {}
            }
            out = &out[n..];
        }
        Ok(())
    }

    fn block(&mut self, id: u32, end: bool, fragment: &[u8]) -> Result<(), String> {
        // Each of konn's header blocks is written in one go; decode the
        // pieces as they come (the decoder needs whole blocks: collect).
        self.pending.extend_from_slice(fragment);
        if !end {
            self.open_block = Some(id);
            return Ok(());
        }
        self.open_block = None;
        let block = std::mem::take(&mut self.pending);
        self.hpack
            .decode(&block, &mut |_f: hpack::HeaderField<'_>| {})
            .map_err(|e| format!("our header block on {id} does not decode: {e}"))
    }
}

// ----- the application -------------------------------------------------------

/// What each target adds: the object under test and the application's
/// calls on it.
pub trait App: Sized {
    /// The application calls the script may make.
    type Op: for<'a> Arbitrary<'a> + std::fmt::Debug;

    fn new(cfg: Config, now: Instant) -> Self;
    fn conn(&self) -> &Connection;
    fn handle_input(&mut self, now: Instant, input: &mut BytesMut) -> Result<(), Error>;
    fn poll_transmit(&mut self, now: Instant, out: &mut BytesMut, max: usize) -> usize;
    fn handle_timeout(&mut self, now: Instant);
    /// Abort the connection (end of the script).
    fn abort(&mut self);
    /// Take every pending event, recording ids in `ids` and credit in the
    /// ledger.
    fn events(&mut self, st: &mut AppState) -> Result<(), String>;
    /// Perform one application call.
    fn op(&mut self, op: &Self::Op, st: &mut AppState, now: Instant);
    /// The target's invariants (including the ledger).
    fn check(&self, st: &AppState) -> Result<(), String>;
}

/// What the application knows, shared by the targets.
#[derive(Default)]
pub struct AppState {
    /// Stream ids seen, in order.
    pub ids: Vec<u32>,
    /// Credit handed out per stream and not released.
    pub owed: HashMap<u32, usize>,
    /// Bytes queued per stream and not yet seen on the wire.
    pub queued: HashMap<u32, BytesMut>,
    /// Streams whose queue the connection dropped (reset, refused).
    pub dropped: std::collections::HashSet<u32>,
    seed: u8,
}

impl AppState {
    pub fn learn(&mut self, id: u32) {
        if !self.ids.contains(&id) {
            self.ids.push(id);
        }
    }

    pub fn id(&self, s: Sid) -> u32 {
        match s {
            Sid::Known(i) if !self.ids.is_empty() => self.ids[usize::from(i) % self.ids.len()],
            Sid::Known(_) | Sid::Next | Sid::Zero => 0,
            Sid::Raw(v) => v,
        }
    }

    pub fn owe(&mut self, id: u32, n: usize) {
        *self.owed.entry(id).or_default() += n;
    }

    /// Take `frac`/255 of what is owed on `id` (all of it for 255).
    pub fn take_owed(&mut self, id: u32, frac: u8) -> usize {
        let owed = self.owed.entry(id).or_default();
        let n = *owed * usize::from(frac) / 255;
        *owed -= n;
        n
    }

    pub fn total_owed(&self) -> i64 {
        self.owed.values().map(|&n| n as i64).sum()
    }

    /// `len` distinct-looking bytes.
    pub fn bytes(&mut self, len: usize) -> Bytes {
        self.seed = self.seed.wrapping_add(1);
        let seed = self.seed;
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect()
    }

    /// `len` distinct-looking bytes to queue on `id`, recorded.
    pub fn payload(&mut self, id: u32, len: usize) -> Bytes {
        let b = self.bytes(len);
        self.expect(id, &b);
        b
    }

    /// `bytes` will go out as DATA on `id`.
    pub fn expect(&mut self, id: u32, bytes: &[u8]) {
        self.queued.entry(id).or_default().extend_from_slice(bytes);
    }

    /// The connection dropped `id`'s queue.
    pub fn drop_queue(&mut self, id: u32) {
        self.queued.remove(&id);
        self.dropped.insert(id);
    }

    fn wrote(&mut self, id: u32, data: &[u8]) -> Result<(), String> {
        let q = self.queued.entry(id).or_default();
        if !q.starts_with(data) {
            return Err(format!(
                "stream {id}: wrote {} bytes that are not the next {} queued",
                data.len(),
                q.len()
            ));
        }
        let _ = q.split_to(data.len());
        Ok(())
    }
}

// ----- the driver ------------------------------------------------------------

/// Runs one script; `Err` is an invariant broken (the target panics with it).
pub fn run<A: App>(input: &Input<A::Op>) -> Result<(), String> {
    let role = if input.client {
        Role::Client
    } else {
        Role::Server
    };
    let mut now = epoch();
    let mut app = A::new(input.cfg.config(role), now);
    let mut peer = Peer::new(role);
    let mut output = Output::new(role);
    let mut st = AppState::default();
    let mut inbuf = BytesMut::new();
    if input.preface {
        if role == Role::Server {
            peer.out.put_slice(wire::PREFACE);
        }
        wire::encode_settings(&[], &mut peer.out);
    }
    for (step, op) in input.ops.iter().enumerate() {
        match op {
            Op::Frame(f) => {
                peer.frame(f, &st.ids);
                feed(&mut app, &mut peer, &mut inbuf, now, 0)?;
            }
            Op::Split(f, n) => {
                peer.frame(f, &st.ids);
                feed(&mut app, &mut peer, &mut inbuf, now, *n)?;
            }
            Op::Raw(b) => peer.out.put_slice(b),
            Op::Feed(n) => feed(&mut app, &mut peer, &mut inbuf, now, *n)?,
            Op::Transmit(max) => transmit(&mut app, &mut output, &mut st, now, *max)?,
            Op::Advance(ms) => {
                now += Duration::from_millis(u64::from(*ms));
                if app.conn().poll_timeout().is_some_and(|t| t <= now) {
                    app.handle_timeout(now);
                }
            }
            Op::Timeout => app.handle_timeout(now),
            Op::App(a) => app.op(a, &mut st, now),
        }
        app.events(&mut st)
            .map_err(|e| format!("step {step}: {e}"))?;
        app.check(&st)
            .map_err(|e| format!("step {step} ({op:?}): {e}"))?;
    }
    // The end: whatever state it is in, an aborted connection flushes its
    // GOAWAY and is closed.
    if app.conn().error().is_none() {
        app.abort();
        app.events(&mut st)?;
    }
    transmit(&mut app, &mut output, &mut st, now, 0)?;
    app.check(&st)?;
    if !app.conn().is_closed() {
        return Err("failed connection not closed after a flush".into());
    }
    if app.conn().poll_timeout().is_some() {
        return Err("failed connection still has a timer".into());
    }
    Ok(())
}

/// Delivers up to `n` of the peer's pending bytes (0: all) and has the
/// connection handle them.
fn feed<A: App>(
    app: &mut A,
    peer: &mut Peer,
    inbuf: &mut BytesMut,
    now: Instant,
    n: u16,
) -> Result<(), String> {
    let n = match usize::from(n) {
        0 => peer.out.len(),
        n => n.min(peer.out.len()),
    };
    inbuf.put_slice(&peer.out.split_to(n));
    let before = app.conn().error();
    let r = app.handle_input(now, inbuf);
    if before.is_some() && r.is_ok() {
        return Err("handle_input succeeded after a connection error".into());
    }
    if r.is_err() != app.conn().error().is_some() {
        return Err(format!(
            "handle_input returned {r:?}, error() is {:?}",
            app.conn().error()
        ));
    }
    Ok(())
}

fn transmit<A: App>(
    app: &mut A,
    output: &mut Output,
    st: &mut AppState,
    now: Instant,
    max: u16,
) -> Result<(), String> {
    let max = if max == 0 {
        usize::MAX
    } else {
        usize::from(max)
    };
    let failed = app.conn().error();
    let mut out = BytesMut::new();
    let n = app.poll_transmit(now, &mut out, max);
    if n != out.len() {
        return Err(format!("poll_transmit said {n}, wrote {}", out.len()));
    }
    let mut data = Vec::new();
    output.check(app.conn(), failed, &out, &mut data)?;
    for (id, d) in data {
        st.wrote(id, &d)?;
    }
    Ok(())
}
