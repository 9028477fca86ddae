//! The scripted peer: writes the script's frames with konn-frames'
//! encoders and its own HPACK context.

use bytes::{BufMut, BytesMut};
use konn_frames::Reason;
use konn_frames::h2::{self as wire, Frame, FrameType, Head, Priority, SettingId};
use konn_frames::hpack;
use konn_protocol::h2::Role;

use super::script::{HeaderSet, PeerFrame, PingData, Sid};

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
    pub(super) fn new(our_role: Role) -> Self {
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

    pub(super) fn frame(&mut self, f: &PeerFrame, known: &[u32]) {
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
