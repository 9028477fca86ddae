//! In-memory tests of gRPC calls: a client [`Grpc`] and a server [`Grpc`]
//! back to back.

use std::time::Instant;

use bytes::{Bytes, BytesMut};
use konn_frames::GrpcStatus;

use super::*;
use crate::h2::{Config, Connection, Event, Headers, Role};

struct Pair {
    client: Grpc,
    server: Grpc,
    now: Instant,
    c2s: BytesMut,
    s2c: BytesMut,
    client_events: Vec<GrpcEvent>,
    server_events: Vec<GrpcEvent>,
}

impl Pair {
    fn with(client: Config, server: Config, max_message: u32) -> Self {
        let now = crate::test_epoch();
        Self {
            client: Grpc::new(Connection::new(client, now), max_message),
            server: Grpc::new(Connection::new(server, now), max_message),
            now,
            c2s: BytesMut::new(),
            s2c: BytesMut::new(),
            client_events: Vec::new(),
            server_events: Vec::new(),
        }
    }

    fn new() -> Self {
        Self::with(
            Config::new(Role::Client),
            Config::new(Role::Server),
            4 << 20,
        )
    }

    /// Move bytes until quiet. Messages are released as soon as they are
    /// seen (an application that keeps up).
    fn drive(&mut self) {
        for _ in 0..100_000 {
            let a = self.client.poll_transmit(self.now, &mut self.c2s, 1 << 20);
            let b = self.server.poll_transmit(self.now, &mut self.s2c, 1 << 20);
            let _ = self.server.handle_input(self.now, &mut self.c2s);
            let _ = self.client.handle_input(self.now, &mut self.s2c);
            let mut quiet = a == 0 && b == 0 && self.c2s.is_empty() && self.s2c.is_empty();
            while let Some(e) = self.client.poll_event() {
                if let GrpcEvent::Message { id, flow, .. } = &e {
                    self.client.release(*id, *flow);
                }
                self.client_events.push(e);
                quiet = false;
            }
            while let Some(e) = self.server.poll_event() {
                if let GrpcEvent::Message { id, flow, .. } = &e {
                    self.server.release(*id, *flow);
                }
                self.server_events.push(e);
                quiet = false;
            }
            if quiet {
                return;
            }
        }
        panic!("drive did not settle");
    }

    fn start(&mut self, path: &'static str) -> u32 {
        let mut md = Headers::new();
        md.push_static("agentid", "agent-1");
        self.client
            .start_call(
                "https",
                Bytes::from_static(b"127.0.0.1:8091"),
                Bytes::from_static(path.as_bytes()),
                &md,
            )
            .unwrap()
    }
}

fn messages(events: &[GrpcEvent]) -> Vec<Bytes> {
    events
        .iter()
        .filter_map(|e| match e {
            GrpcEvent::Message { msg, .. } => Some(msg.clone()),
            _ => None,
        })
        .collect()
}

fn finished(events: &[GrpcEvent]) -> Option<(GrpcStatus, &str)> {
    events.iter().find_map(|e| match e {
        GrpcEvent::Finished {
            status, message, ..
        } => Some((*status, message.as_str())),
        _ => None,
    })
}

#[test]
fn bidi_call_with_metadata_messages_and_status() {
    let mut p = Pair::new();
    let id = p.start("/AgentService/Connect");
    p.drive();
    let Some(GrpcEvent::Call {
        id: sid,
        path,
        metadata,
        timeout,
    }) = p.server_events.first()
    else {
        panic!("no call: {:?}", p.server_events);
    };
    assert_eq!(
        (*sid, &path[..], *timeout),
        (id, &b"/AgentService/Connect"[..], None)
    );
    assert_eq!(metadata.get(b"agentid").unwrap(), "agent-1");
    assert_eq!(metadata.get(b"te").unwrap(), "trailers");

    let mut md = Headers::new();
    md.push_static("serverid", "s1");
    md.push_static("servercount", "1");
    p.server.accept(id, &md).unwrap();
    for i in 0..1000u32 {
        p.client.send_message(id, &i.to_be_bytes()).unwrap();
        p.server
            .send_message(id, &(i + 1_000_000).to_be_bytes())
            .unwrap();
    }
    p.drive();
    let Some(GrpcEvent::ResponseHeaders { metadata, .. }) = p.client_events.first() else {
        panic!("no response headers");
    };
    assert_eq!(metadata.get(b"serverid").unwrap(), "s1");
    let got: Vec<u32> = messages(&p.server_events)
        .iter()
        .map(|m| u32::from_be_bytes(m[..].try_into().unwrap()))
        .collect();
    assert_eq!(got, (0..1000).collect::<Vec<_>>());
    assert_eq!(messages(&p.client_events).len(), 1000);

    p.client.close_send(id).unwrap();
    p.drive();
    assert!(
        p.server_events
            .iter()
            .any(|e| matches!(e, GrpcEvent::HalfClose { .. }))
    );
    p.server.finish(id, GrpcStatus::OK, "").unwrap();
    p.drive();
    assert_eq!(finished(&p.client_events), Some((GrpcStatus::OK, "")));
    assert_eq!(p.client.calls(), 0);
    assert_eq!(p.server.calls(), 0);
    assert_eq!(p.server.conn().stats().streams, 0, "no stream left behind");
    assert_eq!(p.client.conn().stats().streams, 0);
}

#[test]
fn unknown_method_gets_trailers_only_unimplemented() {
    let mut p = Pair::new();
    let id = p.start("/Nope/Nothing");
    p.drive();
    p.server
        .finish(
            id,
            GrpcStatus::UNIMPLEMENTED,
            "unknown service Nope: 100% sure",
        )
        .unwrap();
    p.drive();
    assert_eq!(
        finished(&p.client_events),
        Some((GrpcStatus::UNIMPLEMENTED, "unknown service Nope: 100% sure"))
    );
    assert!(
        !p.client_events
            .iter()
            .any(|e| matches!(e, GrpcEvent::ResponseHeaders { .. }))
    );
}

#[test]
fn oversized_message_is_resource_exhausted() {
    let mut p = Pair::with(Config::new(Role::Client), Config::new(Role::Server), 1024);
    let id = p.start("/ProxyService/Proxy");
    p.drive();
    p.server.accept(id, &Headers::new()).unwrap();
    p.client.send_message(id, &[0u8; 2000]).unwrap();
    p.drive();
    assert_eq!(
        finished(&p.server_events).map(|f| f.0),
        Some(GrpcStatus::RESOURCE_EXHAUSTED)
    );
    assert_eq!(
        finished(&p.client_events).map(|f| f.0),
        Some(GrpcStatus::RESOURCE_EXHAUSTED)
    );
    assert_eq!(p.server.conn().stats().streams, 0);
}

#[test]
fn message_larger_than_window_does_not_deadlock() {
    let mut s = Config::new(Role::Server);
    s.stream_window = 65_535;
    s.conn_window = 65_535;
    let mut p = Pair::with(Config::new(Role::Client), s, 4 << 20);
    let id = p.start("/ProxyService/Proxy");
    p.drive();
    p.server.accept(id, &Headers::new()).unwrap();
    let big: Vec<u8> = (0..1_000_000u32).map(|i| i as u8).collect();
    p.client.send_message(id, &big).unwrap();
    p.drive();
    let got = messages(&p.server_events);
    assert_eq!(got.len(), 1);
    assert_eq!(&got[0][..], &big[..]);
}

#[test]
fn unreleased_messages_hold_back_the_sender() {
    let mut s = Config::new(Role::Server);
    s.stream_window = 65_535;
    s.conn_window = 1 << 20;
    let now = crate::test_epoch();
    let mut client = Grpc::new(Connection::new(Config::new(Role::Client), now), 4 << 20);
    let mut server = Grpc::new(Connection::new(s, now), 4 << 20);
    let id = client
        .start_call(
            "https",
            Bytes::from_static(b"a"),
            Bytes::from_static(b"/P/P"),
            &Headers::new(),
        )
        .unwrap();
    for _ in 0..100 {
        client.send_message(id, &[1u8; 1000]).unwrap();
    }
    let (mut c2s, mut s2c) = (BytesMut::new(), BytesMut::new());
    let mut delivered = 0;
    for _ in 0..100 {
        client.poll_transmit(now, &mut c2s, 1 << 20);
        server.poll_transmit(now, &mut s2c, 1 << 20);
        server.handle_input(now, &mut c2s).unwrap();
        client.handle_input(now, &mut s2c).unwrap();
        while let Some(e) = server.poll_event() {
            if let GrpcEvent::Message { .. } = e {
                delivered += 1; // never released
            }
        }
        while client.poll_event().is_some() {}
    }
    // 65 535 / 1005 bytes per framed message.
    assert_eq!(
        delivered, 65,
        "a consumer that does not release stops its sender"
    );
    assert!(client.queued_bytes(id) > 30_000);
}

/// grpc-go sends 32 KiB messages as several 16 KiB DATA frames: each
/// message must owe the credit of all its frames, or a consumer that does
/// not release cannot hold back its sender (the bug this guards: only the
/// last frame's bytes were owed).
#[test]
fn messages_split_over_frames_owe_all_their_credit() {
    let mut s = Config::new(Role::Server);
    s.stream_window = 1 << 20;
    s.conn_window = 4 << 20;
    let now = crate::test_epoch();
    let mut client = Grpc::new(Connection::new(Config::new(Role::Client), now), 4 << 20);
    let mut server = Grpc::new(Connection::new(s, now), 4 << 20);
    let id = client
        .start_call(
            "https",
            Bytes::from_static(b"a"),
            Bytes::from_static(b"/P/P"),
            &Headers::new(),
        )
        .unwrap();
    const MSG: usize = 32 << 10;
    for _ in 0..100 {
        client.send_message(id, &[7u8; MSG]).unwrap();
    }
    let (mut c2s, mut s2c) = (BytesMut::new(), BytesMut::new());
    let mut flows = Vec::new();
    for _ in 0..200 {
        client.poll_transmit(now, &mut c2s, 1 << 20);
        server.poll_transmit(now, &mut s2c, 1 << 20);
        server.handle_input(now, &mut c2s).unwrap();
        client.handle_input(now, &mut s2c).unwrap();
        while let Some(e) = server.poll_event() {
            if let GrpcEvent::Message { flow, .. } = e {
                flows.push(flow); // never released
            }
        }
        while client.poll_event().is_some() {}
    }
    assert!(
        flows.iter().all(|&f| f == MSG + 5),
        "each message owes its prefix and payload: {flows:?}"
    );
    // The 1 MiB stream window holds 31 whole messages of 32 KiB + 5; the
    // 32nd is cut short by the window.
    assert_eq!(flows.len(), 31, "an unreleased consumer stops its sender");
    // Releasing them lets the rest through.
    server.release(id, flows.iter().sum());
    for _ in 0..200 {
        client.poll_transmit(now, &mut c2s, 1 << 20);
        server.poll_transmit(now, &mut s2c, 1 << 20);
        server.handle_input(now, &mut c2s).unwrap();
        client.handle_input(now, &mut s2c).unwrap();
        while let Some(e) = server.poll_event() {
            if let GrpcEvent::Message { flow, .. } = e {
                server.release(id, flow);
                flows.push(flow);
            }
        }
        while client.poll_event().is_some() {}
    }
    assert_eq!(flows.len(), 100);
}

#[test]
fn client_reset_finishes_server_call_cancelled() {
    let mut p = Pair::new();
    let id = p.start("/ProxyService/Proxy");
    p.drive();
    p.client.cancel(id);
    p.drive();
    assert_eq!(
        finished(&p.server_events).map(|f| f.0),
        Some(GrpcStatus::CANCELLED)
    );
    assert_eq!(p.server.conn().stats().streams, 0);
}

#[test]
fn connection_loss_finishes_every_call_unavailable() {
    let mut p = Pair::new();
    let a = p.start("/A/A");
    let b = p.start("/B/B");
    p.drive();
    p.client.connection_lost();
    let ids: Vec<u32> = p
        .client
        .events
        .iter()
        .filter_map(|e| match e {
            GrpcEvent::Finished {
                id,
                status: GrpcStatus::UNAVAILABLE,
                ..
            } => Some(*id),
            _ => None,
        })
        .collect();
    assert_eq!(ids, vec![a, b]);
}

#[test]
fn non_grpc_request_gets_http_415() {
    let now = crate::test_epoch();
    let mut client = Connection::new(Config::new(Role::Client), now);
    let mut server = Grpc::new(Connection::new(Config::new(Role::Server), now), 1024);
    let mut h = Headers::request(
        "POST",
        "http",
        Bytes::from_static(b"a"),
        Bytes::from_static(b"/"),
    );
    h.push_static("content-type", "text/plain");
    let id = client.open_stream(h, true).unwrap();
    let (mut c2s, mut s2c) = (BytesMut::new(), BytesMut::new());
    for _ in 0..4 {
        client.poll_transmit(now, &mut c2s, 1 << 20);
        server.poll_transmit(now, &mut s2c, 1 << 20);
        server.handle_input(now, &mut c2s).unwrap();
        client.handle_input(now, &mut s2c).unwrap();
    }
    assert!(server.poll_event().is_none(), "not a call");
    let mut status = None;
    while let Some(e) = client.poll_event() {
        if let Event::Headers { id: i, headers, .. } = e {
            assert_eq!(i, id);
            status = headers.status();
        }
    }
    assert_eq!(status, Some(415));
    assert_eq!(server.conn().stats().streams, 0);
}

#[test]
fn http_error_without_grpc_status_is_mapped() {
    assert_eq!(status_from_http(404), GrpcStatus::UNIMPLEMENTED);
    assert_eq!(status_from_http(503), GrpcStatus::UNAVAILABLE);
    assert_eq!(status_from_http(401), GrpcStatus::UNAUTHENTICATED);
    assert_eq!(status_from_http(500), GrpcStatus::UNKNOWN);
    assert_eq!(
        status_from_reset(Reason::REFUSED_STREAM),
        GrpcStatus::UNAVAILABLE
    );
}

#[test]
fn framed_is_the_received_prefix_and_message() {
    let mut s = Config::new(Role::Server);
    s.max_frame_size = 16_384;
    let mut p = Pair::with(Config::new(Role::Client), s, 4 << 20);
    let id = p.start("/P/P");
    p.drive();
    p.client.send_message(id, b"small").unwrap();
    p.client.send_message(id, &vec![7u8; 40_000]).unwrap(); // spans frames
    p.drive();
    let framed: Vec<(Bytes, Option<Bytes>)> = p
        .server_events
        .iter()
        .filter_map(|e| match e {
            GrpcEvent::Message { msg, framed, .. } => Some((msg.clone(), framed.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(framed.len(), 2);
    let (msg, f) = &framed[0];
    let f = f.as_ref().expect("one frame: zero-copy framed bytes");
    assert_eq!(&f[..5], &[0, 0, 0, 0, 5]);
    assert_eq!(&f[5..], &msg[..]);
    assert!(
        framed[1].1.is_none(),
        "reassembled messages have no framed slice"
    );
}

// ----- found by the stateful fuzz target (fuzz/fuzz_targets/grpc_conn.rs) --

/// A message the deframer rejects (here: larger than the limit, announced
/// by its prefix) fails the call, and the credit of the frame it came in —
/// from the bad prefix on — goes back to the peer. Before the fix those
/// bytes were neither handed out nor released: every such call leaked
/// connection-level credit.
#[test]
fn a_rejected_message_returns_the_credit_of_its_frame() {
    let mut p = Pair::with(Config::new(Role::Client), Config::new(Role::Server), 1024);
    let id = p.start("/AgentService/Connect");
    p.drive();
    // One frame: a good message, then a prefix announcing 1 MiB.
    let mut framed = BytesMut::new();
    wire::encode_prefix(100, &mut framed);
    framed.put_slice(&[1; 100]);
    wire::encode_prefix(1 << 20, &mut framed);
    framed.put_slice(&[2; 30]);
    p.client.send_framed(id, framed.freeze()).unwrap();
    p.drive();
    assert_eq!(
        finished(&p.server_events).map(|f| f.0),
        Some(GrpcStatus::RESOURCE_EXHAUSTED)
    );
    assert_eq!(messages(&p.server_events).len(), 1, "the good message");
    // `drive` released the good message's credit: nothing is owed.
    assert_eq!(p.server.unreleased_credit(), 0);
    assert_eq!(p.server.check_invariants(), Ok(()));
}
