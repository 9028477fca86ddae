//! In-memory tests of the HTTP/2 connection: a client and a server
//! [`Connection`] wired back to back with a simulated clock ([`Pair`]), and a
//! raw-frame peer ([`Raw`]) that writes hand-made frames at one connection
//! to prove each protocol rule and defence.

use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use konn_frames::Reason;
use konn_frames::h2::{self as wire, Frame, SettingId};
use konn_frames::hpack;

use super::*;
use crate::Error;

fn t0() -> Instant {
    crate::test_epoch()
}

/// Two connections wired back to back.
struct Pair {
    client: Connection,
    server: Connection,
    now: Instant,
    /// Bytes in flight client → server and server → client.
    c2s: BytesMut,
    s2c: BytesMut,
    client_events: Vec<Event>,
    server_events: Vec<Event>,
}

impl Pair {
    fn new(client: Config, server: Config) -> Self {
        Self {
            client: Connection::new(client, t0()),
            server: Connection::new(server, t0()),
            now: t0(),
            c2s: BytesMut::new(),
            s2c: BytesMut::new(),
            client_events: Vec::new(),
            server_events: Vec::new(),
        }
    }

    fn default_pair() -> Self {
        Self::new(Config::new(Role::Client), Config::new(Role::Server))
    }

    /// Move bytes both ways until neither side has anything to say.
    fn drive(&mut self) {
        for _ in 0..10_000 {
            let a = self.client.poll_transmit(self.now, &mut self.c2s, 1 << 20);
            let b = self.server.poll_transmit(self.now, &mut self.s2c, 1 << 20);
            let _ = self.server.handle_input(self.now, &mut self.c2s);
            let _ = self.client.handle_input(self.now, &mut self.s2c);
            while let Some(e) = self.client.poll_event() {
                self.client_events.push(e);
            }
            while let Some(e) = self.server.poll_event() {
                self.server_events.push(e);
            }
            if a == 0 && b == 0 && self.c2s.is_empty() && self.s2c.is_empty() {
                return;
            }
        }
        panic!("drive did not settle");
    }

    fn advance(&mut self, d: Duration) {
        self.now += d;
        self.client.handle_timeout(self.now);
        self.server.handle_timeout(self.now);
    }

    /// Take all data received by the server on `id`, releasing its capacity.
    fn server_take_data(&mut self, id: u32) -> Vec<u8> {
        let mut out = Vec::new();
        for e in std::mem::take(&mut self.server_events) {
            match e {
                Event::Data { id: i, data, .. } if i == id => {
                    self.server.release_capacity(id, data.len());
                    out.extend_from_slice(&data);
                }
                other => self.server_events.push(other),
            }
        }
        out
    }
}

fn grpc_request() -> Headers {
    let mut h = Headers::request(
        "POST",
        "https",
        Bytes::from_static(b"127.0.0.1:8091"),
        Bytes::from_static(b"/AgentService/Connect"),
    );
    h.push_static("content-type", "application/grpc");
    h.push_static("te", "trailers");
    h.push_sensitive(
        Bytes::from_static(b"authorization"),
        Bytes::from_static(b"Bearer t"),
    );
    h
}

fn headers_event(events: &[Event]) -> Option<(u32, &Headers, bool)> {
    events.iter().find_map(|e| match e {
        Event::Headers {
            id,
            headers,
            end_stream,
        } => Some((*id, headers, *end_stream)),
        _ => None,
    })
}

#[test]
fn request_response_with_trailers() {
    let mut p = Pair::default_pair();
    let id = p.client.open_stream(grpc_request(), false).unwrap();
    assert_eq!(id, 1);
    p.client
        .send_data(id, Bytes::from_static(b"hello"), false)
        .unwrap();
    p.drive();
    let (sid, h, end) = headers_event(&p.server_events).expect("request headers");
    assert_eq!((sid, end), (1, false));
    assert_eq!(h.get(b":path").unwrap(), "/AgentService/Connect");
    assert_eq!(h.get(b"authorization").unwrap(), "Bearer t");
    assert_eq!(p.server_take_data(1), b"hello");

    let mut resp = Headers::response(200);
    resp.push_static("content-type", "application/grpc");
    p.server.send_headers(1, resp, false).unwrap();
    p.server
        .send_data(1, Bytes::from_static(b"world"), false)
        .unwrap();
    let mut trailers = Headers::new();
    trailers.push_static("grpc-status", "0");
    p.server.send_trailers(1, trailers).unwrap();
    p.drive();
    let (cid, h, _) = headers_event(&p.client_events).expect("response headers");
    assert_eq!((cid, h.status()), (1, Some(200)));
    assert!(
        p.client_events
            .iter()
            .any(|e| matches!(e, Event::Data { data, .. } if data == "world"))
    );
    assert!(p.client_events.iter().any(
        |e| matches!(e, Event::Trailers { headers, .. } if headers.get(b"grpc-status").unwrap() == "0")
    ));
    // The client ends its side; the stream is gone on both sides once the
    // server's application releases it.
    p.client.send_data(1, Bytes::new(), true).unwrap();
    p.drive();
    assert_eq!(p.client.stats().streams, 0);
    assert_eq!(
        p.server.stats().streams,
        1,
        "held by the server application"
    );
    p.server.release_stream(1);
    assert_eq!(p.server.stats().streams, 0);
}

#[test]
fn bulk_transfer_respects_windows() {
    let mut cfg = Config::new(Role::Server);
    cfg.stream_window = 65_535;
    cfg.conn_window = 65_535;
    let mut p = Pair::new(Config::new(Role::Client), cfg);
    let id = p.client.open_stream(grpc_request(), false).unwrap();
    let payload: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
    for chunk in payload.chunks(16_000) {
        p.client
            .send_data(id, Bytes::copy_from_slice(chunk), false)
            .unwrap();
    }
    // Without releases, the server receives exactly one window.
    p.drive();
    let got = p.server_take_data(id);
    assert_eq!(got.len(), 65_535, "the peer cannot exceed the window");
    let mut all = got;
    for _ in 0..1000 {
        p.drive();
        let more = p.server_take_data(id);
        if more.is_empty() {
            break;
        }
        all.extend(more);
    }
    assert_eq!(all, payload);
    assert_eq!(p.client.queued_bytes(id), 0);
}

/// A vectored transmit is the flat one with the large payloads left out of
/// the buffer: put back at their places, the bytes are the same.
#[test]
fn vectored_transmit_reassembles_to_the_flat_bytes() {
    let sizes = [100usize, 4096, 16_000, 20_000, 3000, 70_000];
    let run = |vectored: bool| -> (Vec<u8>, usize) {
        let mut c = Connection::new(Config::new(Role::Client), t0());
        let id = c.open_stream(grpc_request(), false).unwrap();
        for (i, n) in sizes.iter().enumerate() {
            c.send_data(id, Bytes::from(vec![i as u8; *n]), false)
                .unwrap();
        }
        let (mut wire, mut referenced) = (Vec::new(), 0);
        for _ in 0..100 {
            let mut out = BytesMut::new();
            let mut payloads = Payloads::new();
            let n = if vectored {
                c.poll_transmit_vectored(t0(), &mut out, &mut payloads, 20_000)
            } else {
                c.poll_transmit(t0(), &mut out, 20_000)
            };
            if n == 0 {
                break;
            }
            let before = wire.len();
            let mut at = 0;
            for (to, p) in &payloads {
                assert!(p.len() >= VECTORED_MIN, "{} bytes referenced", p.len());
                wire.extend_from_slice(&out[at..*to]);
                wire.extend_from_slice(p);
                at = *to;
                referenced += p.len();
            }
            wire.extend_from_slice(&out[at..]);
            assert_eq!(n, wire.len() - before, "the count includes the payloads");
        }
        (wire, referenced)
    };
    let ((flat, none), (vectored, referenced)) = (run(false), run(true));
    assert_eq!(none, 0);
    assert!(referenced >= 4096 + 16_000, "{referenced} bytes referenced");
    assert!(flat.len() > 65_535, "a whole window was written");
    assert_eq!(flat, vectored);
}

#[test]
fn writable_event_after_drain() {
    let mut p = Pair::default_pair();
    let id = p.client.open_stream(grpc_request(), false).unwrap();
    p.client
        .send_data(id, Bytes::from(vec![7u8; 100_000]), false)
        .unwrap();
    p.client.notify_when_drained(id, 0);
    p.drive();
    assert!(
        p.client_events
            .iter()
            .any(|e| matches!(e, Event::Writable { id: 1 }))
    );
}

#[test]
fn reset_by_peer_and_late_frames_ignored() {
    let mut p = Pair::default_pair();
    let id = p.client.open_stream(grpc_request(), false).unwrap();
    p.drive();
    p.client.reset_stream(id, Reason::CANCEL);
    p.drive();
    assert!(p.server_events.iter().any(|e| matches!(
        e,
        Event::Reset {
            id: 1,
            reason: Reason::CANCEL,
            remote: true
        }
    )));
    // A response the server had in flight is ignored by the client.
    let _ = p.server.send_headers(1, Headers::response(200), false);
    p.drive();
    assert!(p.client.error().is_none());
}

#[test]
fn graceful_shutdown_lets_streams_finish() {
    let mut p = Pair::default_pair();
    let id = p.client.open_stream(grpc_request(), false).unwrap();
    p.drive();
    p.server.shutdown();
    p.drive();
    assert!(
        p.client_events
            .iter()
            .any(|e| matches!(e, Event::GoAway { .. }))
    );
    assert!(!p.client.can_open_stream());
    assert!(matches!(
        p.client.open_stream(grpc_request(), true),
        Err(Error::GoingAway)
    ));
    // The existing stream still works.
    p.client
        .send_data(id, Bytes::from_static(b"x"), true)
        .unwrap();
    p.drive();
    assert_eq!(p.server_take_data(1), b"x");
    p.server
        .send_headers(1, Headers::response(200), true)
        .unwrap();
    p.server.release_stream(1);
    p.drive();
    assert!(p.server.is_closed());
    assert!(p.client.is_closed());
}

#[test]
fn keepalive_pings_and_times_out() {
    let mut c = Config::new(Role::Client);
    c.keepalive = Some(Keepalive {
        interval: Duration::from_secs(10),
        timeout: Duration::from_secs(5),
        permit_without_stream: true,
    });
    let mut p = Pair::new(c, Config::new(Role::Server));
    p.drive();
    assert_eq!(
        p.client.poll_timeout(),
        Some(t0() + Duration::from_secs(10))
    );
    p.advance(Duration::from_secs(10));
    p.drive(); // the server answers the PING
    assert!(p.client.error().is_none());
    assert_eq!(p.server.stats().pings_received, 1);
    // Now the server goes silent.
    p.advance(Duration::from_secs(10));
    let mut sink = BytesMut::new();
    p.client.poll_transmit(p.now, &mut sink, 1 << 20);
    p.advance(Duration::from_secs(5));
    assert!(matches!(p.client.error(), Some(Error::KeepaliveTimeout)));
    assert!(p.client.is_closed());
}

#[test]
fn bdp_grows_receive_window() {
    let mut s = Config::grpc_go_like(Role::Server);
    s.bdp_limit = Some(1 << 20);
    let mut p = Pair::new(Config::new(Role::Client), s);
    let id = p.client.open_stream(grpc_request(), false).unwrap();
    for _ in 0..64 {
        p.client
            .send_data(id, Bytes::from(vec![1u8; 16_384]), false)
            .unwrap();
    }
    for _ in 0..200 {
        p.now += Duration::from_millis(1);
        p.drive();
        p.server_take_data(id);
    }
    assert_eq!(p.client.queued_bytes(id), 0);
    assert!(
        p.server.local.initial_window_size > 65_535,
        "BDP estimation grew the window to {}",
        p.server.local.initial_window_size
    );
}

#[test]
fn stream_ids_exhausted() {
    let mut p = Pair::default_pair();
    p.client.next_local_id = (1 << 31) - 1;
    p.client.open_stream(grpc_request(), true).unwrap();
    assert!(matches!(
        p.client.open_stream(grpc_request(), true),
        Err(Error::StreamIdsExhausted)
    ));
}

#[test]
fn respects_peer_max_concurrent_streams() {
    let mut s = Config::new(Role::Server);
    s.max_concurrent_streams = 2;
    let mut p = Pair::new(Config::new(Role::Client), s);
    p.drive();
    p.client.open_stream(grpc_request(), false).unwrap();
    p.client.open_stream(grpc_request(), false).unwrap();
    assert!(matches!(
        p.client.open_stream(grpc_request(), false),
        Err(Error::TooManyStreams)
    ));
}

// ----- raw-frame peer ------------------------------------------------------

/// A hand-driven peer of a server-role connection.
struct Raw {
    conn: Connection,
    now: Instant,
    input: BytesMut,
    out: BytesMut,
    enc: hpack::Encoder,
}

impl Raw {
    /// A server with `cfg`, after the client preface and an empty SETTINGS.
    fn server(cfg: Config) -> Self {
        let mut r = Self {
            conn: Connection::new(cfg, t0()),
            now: t0(),
            input: BytesMut::new(),
            out: BytesMut::new(),
            enc: hpack::Encoder::new(),
        };
        r.input.extend_from_slice(wire::PREFACE);
        wire::encode_settings(&[], &mut r.input);
        r.feed().unwrap();
        r
    }

    fn feed(&mut self) -> Result<(), Error> {
        let res = self.conn.handle_input(self.now, &mut self.input);
        self.conn.poll_transmit(self.now, &mut self.out, usize::MAX);
        res
    }

    fn frame(&mut self, f: Frame<'_>) -> Result<(), Error> {
        f.encode(&mut self.input);
        self.feed()
    }

    fn block(&mut self, fields: &[(&str, &str)]) -> Vec<u8> {
        let mut b = BytesMut::new();
        self.enc.encode(
            fields
                .iter()
                .map(|(n, v)| hpack::Field::new(n.as_bytes(), v.as_bytes())),
            &mut b,
        );
        b.to_vec()
    }

    fn open(&mut self, id: u32, end_stream: bool) -> Result<(), Error> {
        let block = self.block(&[
            (":method", "POST"),
            (":scheme", "http"),
            (":path", "/"),
            (":authority", "a"),
        ]);
        self.frame(Frame::Headers {
            stream_id: id,
            end_stream,
            end_headers: true,
            priority: None,
            pad_len: None,
            fragment: &block,
        })
    }

    /// Frames the server wrote since the last call.
    fn written(&mut self) -> Vec<(u8, u32, Vec<u8>)> {
        let mut out = Vec::new();
        let mut buf = std::mem::take(&mut self.out);
        while let Ok(Some((f, n))) = wire::decode(&buf, 1 << 24) {
            let payload = match f {
                Frame::RstStream { reason, .. } => reason.0.to_be_bytes().to_vec(),
                Frame::GoAway {
                    reason, debug_data, ..
                } => {
                    let mut v = reason.0.to_be_bytes().to_vec();
                    v.extend_from_slice(debug_data);
                    v
                }
                _ => Vec::new(),
            };
            out.push((f.frame_type().0, f.stream_id(), payload));
            let _ = buf.split_to(n);
        }
        out
    }

    fn goaway(&mut self) -> Option<(Reason, String)> {
        self.written()
            .into_iter()
            .find(|(t, ..)| *t == 7)
            .map(|(_, _, p)| {
                (
                    Reason(u32::from_be_bytes(p[..4].try_into().unwrap())),
                    String::from_utf8_lossy(&p[4..]).into_owned(),
                )
            })
    }

    fn resets(&mut self) -> Vec<(u32, Reason)> {
        self.written()
            .into_iter()
            .filter(|(t, ..)| *t == 3)
            .map(|(_, id, p)| (id, Reason(u32::from_be_bytes(p[..4].try_into().unwrap()))))
            .collect()
    }
}

fn server_cfg() -> Config {
    Config::new(Role::Server)
}

#[test]
fn invalid_preface_is_rejected() {
    let mut c = Connection::new(server_cfg(), t0());
    let mut input = BytesMut::from(&b"GET / HTTP/1.1\r\n\r\n"[..]);
    assert!(matches!(
        c.handle_input(t0(), &mut input),
        Err(Error::Frame(konn_frames::Error::InvalidPreface))
    ));
}

#[test]
fn first_frame_must_be_settings() {
    let mut c = Connection::new(server_cfg(), t0());
    let mut input = BytesMut::from(&wire::PREFACE[..]);
    wire::encode_ping(false, [0; 8], &mut input);
    assert!(matches!(
        c.handle_input(t0(), &mut input),
        Err(Error::H2Local {
            reason: Reason::PROTOCOL_ERROR,
            ..
        })
    ));
}

#[test]
fn data_on_idle_stream_is_a_connection_error() {
    let mut r = Raw::server(server_cfg());
    let e = r.frame(Frame::Data {
        stream_id: 1,
        end_stream: false,
        data: b"x",
        pad_len: None,
    });
    assert!(matches!(
        e,
        Err(Error::H2Local {
            reason: Reason::PROTOCOL_ERROR,
            ..
        })
    ));
    assert_eq!(r.goaway().unwrap().0, Reason::PROTOCOL_ERROR);
}

#[test]
fn data_after_end_stream_is_stream_closed() {
    let mut r = Raw::server(server_cfg());
    r.open(1, true).unwrap();
    r.frame(Frame::Data {
        stream_id: 1,
        end_stream: false,
        data: b"x",
        pad_len: None,
    })
    .unwrap();
    assert_eq!(r.resets(), vec![(1, Reason::STREAM_CLOSED)]);
}

/// Raw server with stream 1 requested (END_STREAM) and answered
/// (END_STREAM): closed in both directions by END_STREAM.
fn ended_stream() -> Raw {
    let mut r = Raw::server(server_cfg());
    r.open(1, true).unwrap();
    assert!(matches!(
        r.conn.poll_event(),
        Some(Event::Headers { id: 1, .. })
    ));
    r.conn
        .send_headers(1, Headers::response(200), true)
        .unwrap();
    r.conn.release_stream(1);
    r.feed().unwrap();
    r.written();
    assert_eq!(
        r.conn.stats().streams,
        0,
        "stream 1 is closed and forgotten"
    );
    r
}

#[test]
fn headers_after_end_stream_is_a_connection_error() {
    // RFC 9113 §5.1 "closed": frames after END_STREAM in both directions
    // are a connection error STREAM_CLOSED (h2spec http2/5.1/12).
    let mut r = ended_stream();
    let e = r.open(1, true);
    assert!(
        matches!(
            e,
            Err(Error::H2Local {
                reason: Reason::STREAM_CLOSED,
                ..
            })
        ),
        "{e:?}"
    );
    assert_eq!(r.goaway().unwrap().0, Reason::STREAM_CLOSED);
}

#[test]
fn data_after_end_stream_both_ways_is_a_connection_error() {
    let mut r = ended_stream();
    let e = r.frame(Frame::Data {
        stream_id: 1,
        end_stream: true,
        data: b"test",
        pad_len: None,
    });
    assert!(e.is_err(), "{e:?}");
    assert_eq!(r.goaway().unwrap().0, Reason::STREAM_CLOSED);
}

#[test]
fn data_after_peer_reset_is_a_stream_error() {
    // After the peer's RST_STREAM the peer may have had nothing in flight
    // either, but RFC 9113 §5.1 makes this a stream error only.
    let mut r = Raw::server(server_cfg());
    r.open(1, false).unwrap();
    r.frame(Frame::RstStream {
        stream_id: 1,
        reason: Reason::CANCEL,
    })
    .unwrap();
    while let Some(ev) = r.conn.poll_event() {
        if let Event::Reset { id, .. } = ev {
            r.conn.release_stream(id);
        }
    }
    r.feed().unwrap();
    r.written();
    r.frame(Frame::Data {
        stream_id: 1,
        end_stream: false,
        data: b"x",
        pad_len: None,
    })
    .unwrap();
    assert_eq!(r.resets(), vec![(1, Reason::STREAM_CLOSED)]);
}

#[test]
fn lower_stream_id_is_a_protocol_error() {
    let mut r = Raw::server(server_cfg());
    r.open(5, false).unwrap();
    assert!(r.open(3, false).is_err());
    assert_eq!(r.goaway().unwrap().0, Reason::PROTOCOL_ERROR);
}

#[test]
fn even_stream_from_client_is_rejected() {
    let mut r = Raw::server(server_cfg());
    assert!(r.open(2, false).is_err());
}

#[test]
fn malformed_request_resets_the_stream_only() {
    let mut r = Raw::server(server_cfg());
    let block = r.block(&[(":method", "GET"), (":path", "/")]); // no :scheme
    r.frame(Frame::Headers {
        stream_id: 1,
        end_stream: true,
        end_headers: true,
        priority: None,
        pad_len: None,
        fragment: &block,
    })
    .unwrap();
    assert_eq!(r.resets(), vec![(1, Reason::PROTOCOL_ERROR)]);
    r.open(3, true).unwrap();
    assert!(r.conn.error().is_none());
}

#[test]
fn self_dependent_headers_keep_hpack_in_sync() {
    let mut r = Raw::server(server_cfg());
    // This block inserts entries into the dynamic table...
    let block = r.block(&[
        (":method", "POST"),
        (":scheme", "http"),
        (":path", "/x"),
        ("a", "b"),
    ]);
    let mut input = BytesMut::new();
    Frame::Headers {
        stream_id: 1,
        end_stream: false,
        end_headers: true,
        priority: Some(wire::Priority {
            dependency: 1,
            exclusive: false,
            weight: 15,
        }),
        pad_len: None,
        fragment: &block,
    }
    .encode(&mut input);
    r.input.extend_from_slice(&input);
    r.feed().unwrap();
    assert_eq!(r.resets(), vec![(1, Reason::PROTOCOL_ERROR)]);
    // ...which the next block references: decoding must still work.
    r.open(3, false).unwrap();
    let mut events = Vec::new();
    while let Some(e) = r.conn.poll_event() {
        events.push(e);
    }
    assert!(headers_event(&events).is_some_and(|(id, ..)| id == 3));
}

#[test]
fn continuation_flood_gets_enhance_your_calm() {
    let mut r = Raw::server(server_cfg());
    r.frame(Frame::Headers {
        stream_id: 1,
        end_stream: false,
        end_headers: false,
        priority: None,
        pad_len: None,
        fragment: b"\x82",
    })
    .unwrap();
    let mut last = Ok(());
    for _ in 0..100 {
        last = r.frame(Frame::Continuation {
            stream_id: 1,
            end_headers: false,
            fragment: b"\x84",
        });
        if last.is_err() {
            break;
        }
    }
    assert!(last.is_err());
    assert_eq!(r.goaway().unwrap().0, Reason::ENHANCE_YOUR_CALM);
}

#[test]
fn frame_between_headers_and_continuation_is_rejected() {
    let mut r = Raw::server(server_cfg());
    r.frame(Frame::Headers {
        stream_id: 1,
        end_stream: false,
        end_headers: false,
        priority: None,
        pad_len: None,
        fragment: b"\x82",
    })
    .unwrap();
    assert!(
        r.frame(Frame::Ping {
            ack: false,
            payload: [0; 8]
        })
        .is_err()
    );
    assert_eq!(r.goaway().unwrap().0, Reason::PROTOCOL_ERROR);
}

#[test]
fn empty_data_flood_gets_enhance_your_calm() {
    let mut r = Raw::server(server_cfg());
    r.open(1, false).unwrap();
    let mut failed = false;
    for _ in 0..200 {
        if r.frame(Frame::Data {
            stream_id: 1,
            end_stream: false,
            data: b"",
            pad_len: None,
        })
        .is_err()
        {
            failed = true;
            break;
        }
    }
    assert!(failed);
    assert_eq!(r.goaway().unwrap().0, Reason::ENHANCE_YOUR_CALM);
}

#[test]
fn ping_flood_stops_reading() {
    let mut r = Raw::server(server_cfg());
    for _ in 0..1000 {
        Frame::Ping {
            ack: false,
            payload: [1; 8],
        }
        .encode(&mut r.input);
    }
    r.conn.handle_input(r.now, &mut r.input).unwrap();
    assert!(!r.conn.wants_read(), "reading pauses while replies pile up");
    assert!(
        !r.input.is_empty(),
        "unprocessed frames stay in the input buffer"
    );
    let mut out = BytesMut::new();
    r.conn.poll_transmit(r.now, &mut out, usize::MAX);
    assert!(r.conn.wants_read());
    assert_eq!(out.len(), 100 * 17, "exactly the queued PING ACKs");
}

#[test]
fn settings_flood_stops_reading() {
    let mut r = Raw::server(server_cfg());
    for _ in 0..1000 {
        wire::encode_settings(&[(SettingId::MAX_FRAME_SIZE, 16_384)], &mut r.input);
    }
    r.conn.handle_input(r.now, &mut r.input).unwrap();
    assert!(!r.conn.wants_read());
}

#[test]
fn too_many_pings_gets_goaway() {
    let mut cfg = server_cfg();
    cfg.ping_policy = Some(PingPolicy::UPSTREAM_AGENT_PORT);
    let mut r = Raw::server(cfg);
    // Pings 31 s apart are fine (a Go agent with --keepalive-time=31s).
    for _ in 0..5 {
        r.now += Duration::from_secs(31);
        r.frame(Frame::Ping {
            ack: false,
            payload: [2; 8],
        })
        .unwrap();
    }
    // Three pings in quick succession: strikes 1, 2, 3 > 2.
    r.frame(Frame::Ping {
        ack: false,
        payload: [2; 8],
    })
    .unwrap();
    r.frame(Frame::Ping {
        ack: false,
        payload: [2; 8],
    })
    .unwrap();
    assert!(
        r.frame(Frame::Ping {
            ack: false,
            payload: [2; 8]
        })
        .is_err()
    );
    assert_eq!(
        r.goaway().unwrap(),
        (Reason::ENHANCE_YOUR_CALM, "too_many_pings".into())
    );
}

#[test]
fn pings_after_our_data_are_not_strikes() {
    let mut cfg = server_cfg();
    cfg.ping_policy = Some(PingPolicy::UPSTREAM_AGENT_PORT);
    let mut r = Raw::server(cfg);
    r.open(1, false).unwrap();
    r.conn
        .send_headers(1, Headers::response(200), false)
        .unwrap();
    for _ in 0..20 {
        // grpc-go's BDP pings follow our DATA: each resets the strikes.
        r.conn
            .send_data(1, Bytes::from_static(b"d"), false)
            .unwrap();
        r.feed().unwrap();
        r.frame(Frame::Ping {
            ack: false,
            payload: [3; 8],
        })
        .unwrap();
    }
    assert!(r.conn.error().is_none());
}

#[test]
fn rapid_reset_is_bounded() {
    let mut cfg = server_cfg();
    cfg.max_concurrent_streams = 10;
    let mut r = Raw::server(cfg);
    let mut id = 1;
    let mut result = Ok(());
    for _ in 0..10_000 {
        result = r.open(id, false).and_then(|_| {
            r.frame(Frame::RstStream {
                stream_id: id,
                reason: Reason::CANCEL,
            })
        });
        if result.is_err() {
            break;
        }
        id += 2;
    }
    // The application never released the streams: the slots stay taken,
    // later streams are refused, and the refusals exhaust the budget of
    // stream errors (1024 at once).
    assert!(result.is_err(), "rapid reset must end the connection");
    assert!(id < 2 * 1100, "ended after {} streams", id / 2);
    assert!(r.conn.stats().streams <= 10);
    assert_eq!(r.goaway().unwrap().0, Reason::ENHANCE_YOUR_CALM);
}

#[test]
fn rapid_reset_with_prompt_handlers_is_bounded() {
    let mut r = Raw::server(server_cfg());
    let mut id = 1;
    let mut result = Ok(());
    for _ in 0..10_000 {
        result = r.open(id, false).and_then(|_| {
            r.frame(Frame::RstStream {
                stream_id: id,
                reason: Reason::CANCEL,
            })
        });
        while r.conn.poll_event().is_some() {}
        r.conn.release_stream(id);
        if result.is_err() {
            break;
        }
        id += 2;
    }
    // Each reset of a stream we worked on costs a token: 200 at once.
    assert!(result.is_err());
    assert!(
        (200..=210).contains(&(id / 2)),
        "ended after {} streams",
        id / 2
    );
    assert_eq!(r.conn.stats().streams, 0);
    assert_eq!(r.goaway().unwrap().0, Reason::ENHANCE_YOUR_CALM);
}

#[test]
fn made_you_reset_is_bounded() {
    let mut r = Raw::server(server_cfg());
    let mut id = 1;
    let mut result = Ok(());
    for _ in 0..10_000 {
        result = r.open(id, false).and_then(|_| {
            r.frame(Frame::WindowUpdate {
                stream_id: id,
                increment: 0,
            })
        });
        let _ = r.conn.poll_event();
        // The application finishes its handler at once.
        r.conn.release_stream(id);
        if result.is_err() {
            break;
        }
        id += 2;
    }
    assert!(result.is_err(), "provoked resets must end the connection");
    assert_eq!(r.goaway().unwrap().0, Reason::ENHANCE_YOUR_CALM);
}

#[test]
fn window_update_overflow() {
    let mut r = Raw::server(server_cfg());
    r.open(1, false).unwrap();
    r.frame(Frame::WindowUpdate {
        stream_id: 1,
        increment: (1 << 31) - 1,
    })
    .unwrap();
    assert_eq!(r.resets(), vec![(1, Reason::FLOW_CONTROL_ERROR)]);
    let e = r.frame(Frame::WindowUpdate {
        stream_id: 0,
        increment: (1 << 31) - 1,
    });
    assert!(matches!(
        e,
        Err(Error::H2Local {
            reason: Reason::FLOW_CONTROL_ERROR,
            ..
        })
    ));
}

#[test]
fn flow_control_violation_by_peer() {
    let mut cfg = server_cfg();
    cfg.stream_window = 100;
    let mut r = Raw::server(cfg);
    r.open(1, false).unwrap();
    r.frame(Frame::Data {
        stream_id: 1,
        end_stream: false,
        data: &[0; 101],
        pad_len: None,
    })
    .unwrap();
    assert_eq!(r.resets(), vec![(1, Reason::FLOW_CONTROL_ERROR)]);
}

#[test]
fn refused_beyond_max_concurrent_streams() {
    let mut cfg = server_cfg();
    cfg.max_concurrent_streams = 1;
    let mut r = Raw::server(cfg);
    r.open(1, false).unwrap();
    r.open(3, false).unwrap();
    assert_eq!(r.resets(), vec![(3, Reason::REFUSED_STREAM)]);
}

#[test]
fn settings_window_change_adjusts_streams() {
    let mut r = Raw::server(server_cfg());
    r.open(1, false).unwrap();
    r.conn
        .send_headers(1, Headers::response(200), false)
        .unwrap();
    r.conn
        .send_data(1, Bytes::from(vec![0u8; 100_000]), false)
        .unwrap();
    r.feed().unwrap();
    let sent: usize = r.written().iter().filter(|(t, ..)| *t == 0).count();
    assert!(sent > 0);
    assert_eq!(r.conn.queued_bytes(1), 100_000 - 65_535, "default window");
    // Raising the initial window lets more out.
    wire::encode_settings(&[(SettingId::INITIAL_WINDOW_SIZE, 80_000)], &mut r.input);
    Frame::WindowUpdate {
        stream_id: 0,
        increment: 100_000,
    }
    .encode(&mut r.input);
    r.feed().unwrap();
    assert_eq!(r.conn.queued_bytes(1), 100_000 - 80_000);
    // A change that pushes a window past 2^31-1 is a connection error.
    let e = r.frame(Frame::Settings {
        ack: false,
        params: wire::SettingsParams::new(&{
            let mut v = Vec::new();
            v.extend_from_slice(&4u16.to_be_bytes());
            v.extend_from_slice(&((1u32 << 31) - 1).to_be_bytes());
            v
        })
        .unwrap(),
    });
    assert!(e.is_ok(), "stream window 0 + (2^31-1 - 80000) stays legal");
    // The remaining 20 000 bytes went out: the window is 2^31-1 - 100 000.
    assert_eq!(r.conn.queued_bytes(1), 0);
    r.frame(Frame::WindowUpdate {
        stream_id: 1,
        increment: 100_001,
    })
    .unwrap();
    assert_eq!(r.resets(), vec![(1, Reason::FLOW_CONTROL_ERROR)]);
}

#[test]
fn push_promise_is_rejected() {
    let mut r = Raw::server(server_cfg());
    r.open(1, false).unwrap();
    let e = r.frame(Frame::PushPromise {
        stream_id: 1,
        end_headers: true,
        promised_id: 2,
        pad_len: None,
        fragment: b"",
    });
    assert!(e.is_err());
    assert_eq!(r.goaway().unwrap().0, Reason::PROTOCOL_ERROR);
}

#[test]
fn header_list_too_large_resets_stream() {
    let mut cfg = server_cfg();
    cfg.max_header_list_size = 200;
    let mut r = Raw::server(cfg);
    let big = "v".repeat(300);
    let block = r.block(&[
        (":method", "POST"),
        (":scheme", "http"),
        (":path", "/"),
        ("x", &big),
    ]);
    r.frame(Frame::Headers {
        stream_id: 1,
        end_stream: true,
        end_headers: true,
        priority: None,
        pad_len: None,
        fragment: &block,
    })
    .unwrap();
    assert_eq!(r.resets(), vec![(1, Reason::PROTOCOL_ERROR)]);
    r.open(3, true).unwrap();
    assert!(r.conn.error().is_none());
}

#[test]
fn content_length_mismatch_resets() {
    let mut r = Raw::server(server_cfg());
    let block = r.block(&[
        (":method", "POST"),
        (":scheme", "http"),
        (":path", "/"),
        ("content-length", "3"),
    ]);
    r.frame(Frame::Headers {
        stream_id: 1,
        end_stream: false,
        end_headers: true,
        priority: None,
        pad_len: None,
        fragment: &block,
    })
    .unwrap();
    r.frame(Frame::Data {
        stream_id: 1,
        end_stream: true,
        data: b"ab",
        pad_len: None,
    })
    .unwrap();
    assert_eq!(r.resets(), vec![(1, Reason::PROTOCOL_ERROR)]);
}

#[test]
fn padding_credit_is_returned() {
    let mut cfg = server_cfg();
    cfg.stream_window = 1000;
    cfg.conn_window = 1000;
    let mut r = Raw::server(cfg);
    r.open(1, false).unwrap();
    for _ in 0..20 {
        // 1 pad-length byte + 199 padding bytes + 0 data: only padding.
        r.frame(Frame::Data {
            stream_id: 1,
            end_stream: false,
            data: b"x",
            pad_len: Some(198),
        })
        .unwrap();
        while let Some(Event::Data { data, .. }) = r.conn.poll_event() {
            r.conn.release_capacity(1, data.len());
        }
    }
    assert!(
        r.conn.error().is_none(),
        "padding must not exhaust the windows"
    );
}

// ----- found by the stateful fuzz target (fuzz/fuzz_targets/h2_conn.rs) ----

/// After a connection error only its GOAWAY is written: credit the
/// application returns and streams it resets afterwards put nothing on the
/// wire, and one flush closes the connection (before the fix, a
/// WINDOW_UPDATE followed the GOAWAY and kept `is_closed` false).
#[test]
fn nothing_follows_the_goaway_of_a_failed_connection() {
    let mut r = Raw::server(server_cfg());
    r.open(1, false).unwrap();
    let block = r.block(&[("x", "y")]);
    let _ = r.written();
    // The client sends DATA, the server fails the connection.
    r.frame(Frame::Data {
        stream_id: 1,
        end_stream: false,
        data: &[7; 1000],
        pad_len: None,
    })
    .unwrap();
    let _ = r.frame(Frame::PushPromise {
        stream_id: 1,
        end_headers: true,
        promised_id: 2,
        pad_len: None,
        fragment: &block,
    });
    assert!(r.conn.error().is_some());
    r.conn.release_capacity(1, 1_000_000);
    r.conn.reset_stream(1, Reason::CANCEL);
    r.conn.release_stream(1);
    r.conn.poll_transmit(r.now, &mut r.out, usize::MAX);
    let written: Vec<u8> = r.written().into_iter().map(|(t, ..)| t).collect();
    assert_eq!(written, [7], "only the GOAWAY");
    assert!(r.conn.is_closed());
    assert_eq!(r.conn.check_invariants(), Ok(()));
}

// ----- connection deadlines and ENHANCE_YOUR_CALM texts ---------------------

fn deadline_cfg() -> Config {
    let mut c = server_cfg();
    c.preface_timeout = Some(Duration::from_secs(10));
    c.idle_timeout = Some(Duration::from_secs(30));
    c
}

#[test]
fn preface_deadline_fails_a_silent_peer() {
    let mut c = Connection::new(deadline_cfg(), t0());
    let mut out = BytesMut::new();
    c.poll_transmit(t0(), &mut out, usize::MAX);
    assert!(out.is_empty(), "a server waits for the client's preface");
    // Half a preface is no progress.
    let mut input = BytesMut::from(&wire::PREFACE[..10]);
    c.handle_input(t0() + Duration::from_secs(5), &mut input)
        .unwrap();
    assert_eq!(c.poll_timeout(), Some(t0() + Duration::from_secs(10)));
    c.handle_timeout(t0() + Duration::from_secs(9));
    assert!(c.error().is_none(), "not before the deadline");
    c.handle_timeout(t0() + Duration::from_secs(10));
    assert!(matches!(
        c.error(),
        Some(Error::H2Local {
            reason: Reason::PROTOCOL_ERROR,
            ..
        })
    ));
    out.clear();
    c.poll_transmit(t0(), &mut out, usize::MAX);
    // Its own preface (SETTINGS, then the window's growth) still comes
    // first (RFC 9113 §3.4), then the GOAWAY.
    let (f, n) = wire::decode(&out, 1 << 24).unwrap().unwrap();
    assert!(matches!(f, Frame::Settings { ack: false, .. }), "{f:?}");
    let (f, m) = wire::decode(&out[n..], 1 << 24).unwrap().unwrap();
    assert!(
        matches!(f, Frame::WindowUpdate { stream_id: 0, .. }),
        "{f:?}"
    );
    let (f, _) = wire::decode(&out[n + m..], 1 << 24).unwrap().unwrap();
    let Frame::GoAway { debug_data, .. } = f else {
        panic!("{f:?}")
    };
    assert!(String::from_utf8_lossy(debug_data).contains("preface timeout"));
    assert!(c.is_closed());
}

#[test]
fn preface_deadline_ends_with_the_first_settings() {
    let mut r = Raw::server(deadline_cfg());
    // Only the idle deadline is left.
    assert_eq!(r.conn.poll_timeout(), Some(t0() + Duration::from_secs(30)));
    r.conn.handle_timeout(t0() + Duration::from_secs(11));
    assert!(r.conn.error().is_none());
}

#[test]
fn idle_connection_is_shut_down_and_closes_without_a_ping_ack() {
    let mut r = Raw::server(deadline_cfg());
    r.written();
    r.now = t0() + Duration::from_secs(30);
    r.conn.handle_timeout(r.now);
    r.feed().unwrap();
    let (reason, debug) = r.goaway().expect("GOAWAY");
    assert_eq!(reason, Reason::NO_ERROR);
    assert!(debug.ends_with("max_idle"), "{debug:?}");
    assert!(!r.conn.is_closed(), "phase one waits for the PING ACK");
    // The peer never answers the PING: the final GOAWAY goes out anyway.
    assert_eq!(r.conn.poll_timeout(), Some(r.now + Duration::from_secs(5)));
    r.now += Duration::from_secs(5);
    r.conn.handle_timeout(r.now);
    r.feed().unwrap();
    assert!(r.goaway().is_some(), "final GOAWAY");
    assert!(r.conn.is_closed());
}

#[test]
fn idle_deadline_counts_from_the_last_stream() {
    let mut r = Raw::server(deadline_cfg());
    r.now = t0() + Duration::from_secs(20);
    r.open(1, true).unwrap();
    assert_eq!(r.conn.poll_timeout(), None, "a stream is open");
    r.now = t0() + Duration::from_secs(100);
    r.conn.handle_timeout(r.now);
    r.feed().unwrap();
    assert!(r.goaway().is_none(), "busy connections are never idle");
    r.conn
        .send_headers(1, Headers::response(200), true)
        .unwrap();
    r.conn.release_stream(1);
    r.feed().unwrap();
    assert_eq!(r.conn.poll_timeout(), Some(r.now + Duration::from_secs(30)));
}

#[test]
fn hpack_work_limit_goaway_names_the_limit() {
    let mut r = Raw::server(server_cfg());
    // Nine dynamic table size updates: one more than the decoder allows.
    let block = [0x20u8; 9];
    let _ = r.frame(Frame::Headers {
        stream_id: 1,
        end_stream: true,
        end_headers: true,
        priority: None,
        pad_len: None,
        fragment: &block,
    });
    let (reason, debug) = r.goaway().expect("GOAWAY");
    assert_eq!(reason, Reason::ENHANCE_YOUR_CALM);
    assert!(debug.contains("HPACK decoding work limit"), "{debug:?}");
}

#[test]
fn connections_share_their_configuration_until_one_differs() {
    use std::sync::Arc;
    let mut cfg = Config::new(Role::Server);
    cfg.idle_timeout = Some(Duration::from_secs(300));
    let shared = Arc::new(cfg);
    let mut a = Connection::new(shared.clone(), t0());
    // The same deadlines as the shared configuration: nothing is copied.
    a.set_deadlines(None, Some(Duration::from_secs(300)));
    assert_eq!(Arc::strong_count(&shared), 2);
    // A different one: this connection gets its own copy, the others keep
    // the shared one.
    let mut b = Connection::new(shared.clone(), t0());
    b.set_deadlines(Some(Duration::from_secs(10)), None);
    assert_eq!(Arc::strong_count(&shared), 2);
    drop(a);
    assert_eq!(Arc::strong_count(&shared), 1);
}
