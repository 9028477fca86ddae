//! In-memory tests of the router: upstream's packet semantics (reference
//! §2) and konn's additions, with a simulated clock.

use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use konn_frames::packet::{ByteStr, Packet};

use super::*;
use crate::flow::FlowLimits;
use crate::server::backends::{Directory, Identifiers, Strategy};
use crate::server::router::{REVERSE_REFUSED, ReverseConfig, ReverseRefusal};

fn t0() -> Instant {
    crate::test_epoch()
}

fn framed(p: &Packet) -> Bytes {
    let mut b = BytesMut::new();
    p.encode_grpc(&mut b);
    b.freeze()
}

fn router() -> Router {
    Router::new(
        RouterConfig::default(),
        Directory::new(vec![Strategy::Default]),
    )
}

fn with_agent(r: &mut Router, id: BackendId) {
    r.backend_connected(id, format!("agent-{id}"), Identifiers::default(), 0);
}

fn actions(r: &mut Router) -> Vec<Action> {
    std::iter::from_fn(|| r.poll_action()).collect()
}

fn dial_req(random: i64) -> Packet {
    Packet::DialReq {
        protocol: ByteStr::from_static("tcp"),
        address: ByteStr::from_static("10.0.0.5:10250"),
        random,
    }
}

fn dial_rsp(random: i64, connect_id: i64, error: &'static str) -> Packet {
    Packet::DialRsp {
        error: ByteStr::from_static(error),
        connect_id,
        random,
    }
}

fn data(connect_id: i64, d: &'static [u8]) -> Packet {
    Packet::Data {
        connect_id,
        error: ByteStr::new(),
        data: Bytes::from_static(d),
    }
}

/// Send a packet from a frontend.
fn from_frontend(r: &mut Router, now: Instant, fid: FrontendId, p: Packet) {
    let f = framed(&p);
    r.frontend_packet(now, fid, p, f, 0);
}

/// Send a packet from a backend.
fn from_backend(r: &mut Router, now: Instant, bid: BackendId, p: Packet) {
    let f = framed(&p);
    let credit = r.backend_packet(now, bid, p, f, 0);
    assert_eq!(credit, 0);
}

fn to_frontend_packets(acts: &[Action]) -> Vec<(FrontendId, Packet)> {
    acts.iter()
        .filter_map(|a| match a {
            Action::ToFrontend { frontend, payload } => Some((*frontend, decode(payload))),
            _ => None,
        })
        .collect()
}

fn to_backend_packets(acts: &[Action]) -> Vec<(BackendId, Packet)> {
    acts.iter()
        .filter_map(|a| match a {
            Action::ToBackend { backend, payload } => Some((*backend, decode(payload))),
            _ => None,
        })
        .collect()
}

fn decode(p: &Payload) -> Packet {
    match p {
        Payload::Packet(p) => p.clone(),
        Payload::Forward(b) => Packet::decode(&b.slice(5..)).unwrap(),
    }
}

/// A gRPC frontend with an established connection 7 on backend 1.
fn established() -> Router {
    let mut r = router();
    with_agent(&mut r, 1);
    r.frontend_opened(10, FrontendKind::Grpc);
    from_frontend(&mut r, t0(), 10, dial_req(42));
    from_backend(&mut r, t0(), 1, dial_rsp(42, 7, ""));
    actions(&mut r);
    r
}

#[test]
fn happy_path_forwards_bytes_unchanged() {
    let mut r = router();
    with_agent(&mut r, 1);
    r.frontend_opened(10, FrontendKind::Grpc);
    let req = dial_req(42);
    let req_bytes = framed(&req);
    r.frontend_packet(t0(), 10, req, req_bytes.clone(), 0);
    let acts = actions(&mut r);
    assert_eq!(
        acts,
        vec![Action::ToBackend {
            backend: 1,
            payload: Payload::Forward(req_bytes)
        }],
        "DIAL_REQ forwarded as received"
    );
    assert_eq!(r.stats().pending_dials, 1);
    from_backend(
        &mut r,
        t0() + Duration::from_millis(3),
        1,
        dial_rsp(42, 7, ""),
    );
    let acts = actions(&mut r);
    assert!(acts.contains(&Action::DialSucceeded {
        frontend: 10,
        backend: 1,
        connect_id: 7,
        elapsed: Duration::from_millis(3)
    }));
    assert_eq!(to_frontend_packets(&acts), vec![(10, dial_rsp(42, 7, ""))]);
    assert_eq!(r.stats().established, 1);
    assert_eq!(r.stats().pending_dials, 0);

    from_frontend(&mut r, t0(), 10, data(7, b"GET /"));
    assert_eq!(
        to_backend_packets(&actions(&mut r)),
        vec![(1, data(7, b"GET /"))]
    );
    from_backend(&mut r, t0(), 1, data(7, b"200 OK"));
    assert_eq!(
        to_frontend_packets(&actions(&mut r)),
        vec![(10, data(7, b"200 OK"))]
    );

    from_frontend(&mut r, t0(), 10, Packet::CloseReq { connect_id: 7 });
    assert_eq!(
        to_backend_packets(&actions(&mut r)),
        vec![(1, Packet::CloseReq { connect_id: 7 })]
    );
    from_backend(
        &mut r,
        t0(),
        1,
        Packet::CloseRsp {
            error: ByteStr::new(),
            connect_id: 7,
        },
    );
    let acts = actions(&mut r);
    assert_eq!(to_frontend_packets(&acts).len(), 1);
    assert_eq!(r.stats().established, 0);
    r.frontend_gone(10);
    let acts = actions(&mut r);
    assert!(
        matches!(&acts[..], [Action::ConnEnded(_)]),
        "nothing left to clean up but the summary"
    );
    assert_eq!(
        r.stats(),
        RouterStats {
            backends: 1,
            ..RouterStats::default()
        }
    );
}

#[test]
fn no_agent_answers_dial_rsp_error_and_stops_serving() {
    let mut r = router();
    r.frontend_opened(10, FrontendKind::Grpc);
    from_frontend(&mut r, t0(), 10, dial_req(5));
    let acts = actions(&mut r);
    assert!(acts.contains(&Action::DialFailed(DialFailure::NoAgent)));
    assert_eq!(
        to_frontend_packets(&acts),
        vec![(10, dial_rsp(5, 0, "No agent available"))]
    );
    // Later packets are ignored, as upstream stops serving the stream.
    with_agent(&mut r, 1);
    from_frontend(&mut r, t0(), 10, dial_req(6));
    assert!(actions(&mut r).is_empty());
}

#[test]
fn dial_error_is_forwarded() {
    let mut r = router();
    with_agent(&mut r, 1);
    r.frontend_opened(10, FrontendKind::Grpc);
    from_frontend(&mut r, t0(), 10, dial_req(5));
    actions(&mut r);
    from_backend(
        &mut r,
        t0(),
        1,
        dial_rsp(5, 0, "dial tcp 10.0.0.5:1: connect: connection refused"),
    );
    let acts = actions(&mut r);
    assert!(acts.contains(&Action::DialFailed(DialFailure::ErrorResponse)));
    assert_eq!(
        to_frontend_packets(&acts),
        vec![(
            10,
            dial_rsp(5, 0, "dial tcp 10.0.0.5:1: connect: connection refused")
        )]
    );
    assert_eq!(r.stats().pending_dials, 0);
}

#[test]
fn unknown_dial_rsp_gets_close_req() {
    let mut r = router();
    with_agent(&mut r, 1);
    from_backend(&mut r, t0(), 1, dial_rsp(99, 3, ""));
    let acts = actions(&mut r);
    assert!(acts.contains(&Action::DialFailed(DialFailure::UnrecognizedResponse)));
    assert_eq!(
        to_backend_packets(&acts),
        vec![(1, Packet::CloseReq { connect_id: 3 })]
    );
    // Without a connectID there is nothing to close.
    from_backend(&mut r, t0(), 1, dial_rsp(98, 0, "x"));
    assert!(to_backend_packets(&actions(&mut r)).is_empty());
}

#[test]
fn dial_rsp_from_another_backend_is_not_accepted() {
    let mut r = router();
    with_agent(&mut r, 1);
    with_agent(&mut r, 2);
    r.frontend_opened(10, FrontendKind::Grpc);
    from_frontend(&mut r, t0(), 10, dial_req(5));
    let target = to_backend_packets(&actions(&mut r))[0].0;
    let other = if target == 1 { 2 } else { 1 };
    from_backend(&mut r, t0(), other, dial_rsp(5, 3, ""));
    assert_eq!(
        to_backend_packets(&actions(&mut r)),
        vec![(other, Packet::CloseReq { connect_id: 3 })]
    );
    assert_eq!(
        r.stats().pending_dials,
        1,
        "still waiting for the right agent"
    );
}

#[test]
fn data_for_unknown_connection_from_agent_gets_close_req() {
    let mut r = established();
    from_backend(&mut r, t0(), 1, data(8, b"x"));
    assert_eq!(
        to_backend_packets(&actions(&mut r)),
        vec![(1, Packet::CloseReq { connect_id: 8 })]
    );
    from_backend(&mut r, t0(), 1, data(0, b"x"));
    assert!(actions(&mut r).is_empty(), "connectID 0 is dropped");
}

#[test]
fn data_before_dial_closes_with_backend_not_initialized() {
    let mut r = router();
    r.frontend_opened(10, FrontendKind::Grpc);
    from_frontend(&mut r, t0(), 10, data(7, b"x"));
    let acts = actions(&mut r);
    assert_eq!(
        to_frontend_packets(&acts),
        vec![(
            10,
            Packet::CloseRsp {
                error: ByteStr::from_static("backend not initialized"),
                connect_id: 7
            }
        )]
    );
}

#[test]
fn close_req_before_dial_gets_backend_uninitialized() {
    let mut r = router();
    r.frontend_opened(10, FrontendKind::Grpc);
    from_frontend(&mut r, t0(), 10, Packet::CloseReq { connect_id: 4 });
    assert_eq!(
        to_frontend_packets(&actions(&mut r)),
        vec![(
            10,
            Packet::CloseRsp {
                error: ByteStr::from_static("backend uninitialized"),
                connect_id: 4
            }
        )]
    );
}

#[test]
fn mismatched_connection_ids_close_both() {
    let mut r = established();
    // Connection 9 is not this frontend's; the first DATA latches 7.
    from_frontend(&mut r, t0(), 10, data(7, b"a"));
    actions(&mut r);
    from_frontend(&mut r, t0(), 10, data(9, b"b"));
    let acts = actions(&mut r);
    assert_eq!(
        to_backend_packets(&acts),
        vec![
            (1, Packet::CloseReq { connect_id: 9 }),
            (1, Packet::CloseReq { connect_id: 7 })
        ]
    );
    assert_eq!(to_frontend_packets(&acts).len(), 2);
    from_frontend(&mut r, t0(), 10, data(7, b"c"));
    assert!(actions(&mut r).is_empty(), "the stream is no longer served");
}

#[test]
fn frontend_cannot_write_into_another_frontends_connection() {
    let mut r = established();
    r.frontend_opened(11, FrontendKind::Grpc);
    from_frontend(&mut r, t0(), 11, dial_req(43));
    actions(&mut r);
    // Frontend 11 tries DATA on frontend 10's connection 7.
    from_frontend(&mut r, t0(), 11, data(7, b"evil"));
    let acts = actions(&mut r);
    assert!(
        to_backend_packets(&acts).is_empty(),
        "not forwarded to the agent"
    );
    assert_eq!(to_frontend_packets(&acts)[0].0, 11);
}

#[test]
fn frontend_dial_cls_cancels_and_is_forwarded() {
    let mut r = router();
    with_agent(&mut r, 1);
    r.frontend_opened(10, FrontendKind::Grpc);
    from_frontend(&mut r, t0(), 10, dial_req(5));
    actions(&mut r);
    from_frontend(&mut r, t0(), 10, Packet::DialCls { random: 5 });
    let acts = actions(&mut r);
    assert!(acts.contains(&Action::DialFailed(DialFailure::FrontendClose)));
    assert_eq!(
        to_backend_packets(&acts),
        vec![(1, Packet::DialCls { random: 5 })]
    );
    assert_eq!(r.stats().pending_dials, 0);
    // The agent's late DIAL_RSP is unrecognised and closed.
    from_backend(&mut r, t0(), 1, dial_rsp(5, 3, ""));
    assert_eq!(
        to_backend_packets(&actions(&mut r)),
        vec![(1, Packet::CloseReq { connect_id: 3 })]
    );
}

#[test]
fn frontend_gone_cancels_dials_and_closes_connections() {
    let mut r = established();
    from_frontend(&mut r, t0(), 10, dial_req(50));
    actions(&mut r);
    r.frontend_gone(10);
    let acts = actions(&mut r);
    assert_eq!(
        to_backend_packets(&acts),
        vec![
            (1, Packet::DialCls { random: 50 }),
            (1, Packet::CloseReq { connect_id: 7 })
        ]
    );
    assert_eq!(r.stats().frontends, 0);
    assert_eq!(r.stats().established, 0);
    assert_eq!(r.stats().pending_dials, 0);
}

#[test]
fn backend_gone_closes_established_and_fails_pending_at_once() {
    let mut r = established();
    r.frontend_opened(11, FrontendKind::Grpc);
    from_frontend(&mut r, t0(), 11, dial_req(43));
    actions(&mut r);
    r.backend_gone(1);
    let acts = actions(&mut r);
    let pkts = to_frontend_packets(&acts);
    assert!(pkts.contains(&(
        10,
        Packet::CloseRsp {
            error: ByteStr::new(),
            connect_id: 7
        }
    )));
    assert!(
        pkts.contains(&(11, dial_rsp(43, 0, BACKEND_GONE))),
        "pending dial fails now (#126)"
    );
    assert!(acts.contains(&Action::DialFailed(DialFailure::BackendClose)));
    assert_eq!(r.stats().pending_dials, 0);
    assert_eq!(r.stats().established, 0);
    assert_eq!(r.stats().backends, 0);
}

#[test]
fn dial_timeout_fails_the_dial_and_tells_the_agent() {
    let mut r = router();
    with_agent(&mut r, 1);
    r.frontend_opened(10, FrontendKind::Grpc);
    from_frontend(&mut r, t0(), 10, dial_req(5));
    actions(&mut r);
    let deadline = r.poll_timeout().unwrap();
    assert_eq!(deadline, t0() + Duration::from_secs(30));
    r.handle_timeout(deadline - Duration::from_millis(1));
    assert!(actions(&mut r).is_empty());
    r.handle_timeout(deadline);
    let acts = actions(&mut r);
    assert!(acts.contains(&Action::DialFailed(DialFailure::BackendDialTimeout)));
    assert_eq!(
        to_backend_packets(&acts),
        vec![(1, Packet::DialCls { random: 5 })]
    );
    assert_eq!(
        to_frontend_packets(&acts),
        vec![(10, dial_rsp(5, 0, BACKEND_DIAL_TIMEOUT))]
    );
    assert_eq!(r.poll_timeout(), None);
}

#[test]
fn drain_makes_backend_non_preferred() {
    let mut r = router();
    with_agent(&mut r, 1);
    with_agent(&mut r, 2);
    from_backend(&mut r, t0(), 1, Packet::Drain);
    for i in 0..20 {
        r.frontend_opened(100 + i, FrontendKind::Grpc);
        let p = dial_req(i as i64 + 1);
        let f = framed(&p);
        r.frontend_packet(t0(), 100 + i, p, f, i);
        assert_eq!(to_backend_packets(&actions(&mut r))[0].0, 2);
    }
}

#[test]
fn pending_dial_limit_per_frontend() {
    let mut r = Router::new(
        RouterConfig {
            max_pending_per_frontend: 2,
            ..RouterConfig::default()
        },
        Directory::new(vec![Strategy::Default]),
    );
    with_agent(&mut r, 1);
    r.frontend_opened(10, FrontendKind::Grpc);
    for random in 1..=3 {
        from_frontend(&mut r, t0(), 10, dial_req(random));
    }
    let acts = actions(&mut r);
    assert_eq!(to_backend_packets(&acts).len(), 2);
    assert_eq!(
        to_frontend_packets(&acts),
        vec![(10, dial_rsp(3, 0, "too many pending dials"))]
    );
}

#[test]
fn a_dial_id_in_use_is_refused_with_its_own_reason() {
    let mut r = Router::new(
        RouterConfig::default(),
        Directory::new(vec![Strategy::Default]),
    );
    with_agent(&mut r, 1);
    r.frontend_opened(10, FrontendKind::Grpc);
    r.frontend_opened(11, FrontendKind::Grpc);
    from_frontend(&mut r, t0(), 10, dial_req(7));
    from_frontend(&mut r, t0(), 11, dial_req(7));
    let acts = actions(&mut r);
    assert_eq!(
        to_backend_packets(&acts).len(),
        1,
        "only the first dial goes out"
    );
    assert_eq!(
        to_frontend_packets(&acts),
        vec![(
            11,
            dial_rsp(
                7,
                0,
                "dial request id (random) already in use by a pending dial"
            )
        )]
    );
}

#[test]
fn stuck_frontend_is_closed_on_both_sides() {
    let mut r = established();
    r.frontend_stuck(10, "konn: frontend not reading");
    let acts = actions(&mut r);
    assert_eq!(
        to_backend_packets(&acts),
        vec![(1, Packet::CloseReq { connect_id: 7 })]
    );
    assert_eq!(
        to_frontend_packets(&acts),
        vec![(
            10,
            Packet::CloseRsp {
                error: ByteStr::from_static("konn: frontend not reading"),
                connect_id: 7
            }
        )]
    );
    assert_eq!(r.stats().established, 0);
}

// ----- HTTP CONNECT ---------------------------------------------------------

#[test]
fn connect_happy_path() {
    let mut r = router();
    with_agent(&mut r, 1);
    r.frontend_opened(20, FrontendKind::HttpConnect);
    r.connect_request(t0(), 20, "10.0.0.5:10250", 77, 0);
    assert_eq!(
        to_backend_packets(&actions(&mut r)),
        vec![(
            1,
            Packet::DialReq {
                protocol: ByteStr::from_static("tcp"),
                address: ByteStr::from_static("10.0.0.5:10250"),
                random: 77
            }
        )]
    );
    from_backend(&mut r, t0(), 1, dial_rsp(77, 9, ""));
    let acts = actions(&mut r);
    assert!(acts.contains(&Action::ConnectEstablished {
        frontend: 20,
        backend: 1,
        connect_id: 9
    }));
    from_backend(&mut r, t0(), 1, data(9, b"hello"));
    assert_eq!(
        actions(&mut r),
        vec![Action::ConnectData {
            frontend: 20,
            data: Bytes::from_static(b"hello")
        }]
    );
    assert!(r.connect_data(20, framed(&data(9, b"req")), 3));
    assert_eq!(
        to_backend_packets(&actions(&mut r)),
        vec![(1, data(9, b"req"))]
    );
    // The agent closes: the socket closes.
    from_backend(
        &mut r,
        t0(),
        1,
        Packet::CloseRsp {
            error: ByteStr::new(),
            connect_id: 9,
        },
    );
    let acts = actions(&mut r);
    assert!(matches!(
        &acts[..],
        [Action::ConnEnded(_), Action::CloseFrontend { frontend: 20 }]
    ));
    assert_eq!(r.stats().frontends, 0);
}

#[test]
fn connect_client_eof_sends_close_req() {
    let mut r = router();
    with_agent(&mut r, 1);
    r.frontend_opened(20, FrontendKind::HttpConnect);
    r.connect_request(t0(), 20, "a:1", 77, 0);
    from_backend(&mut r, t0(), 1, dial_rsp(77, 9, ""));
    actions(&mut r);
    r.frontend_gone(20);
    assert_eq!(
        to_backend_packets(&actions(&mut r)),
        vec![(1, Packet::CloseReq { connect_id: 9 })]
    );
}

#[test]
fn connect_error_responses_are_upstreams() {
    let text = |acts: &[Action]| -> String {
        acts.iter()
            .find_map(|a| match a {
                Action::ConnectFailed { response, .. } => {
                    Some(String::from_utf8(response.to_vec()).unwrap())
                }
                _ => None,
            })
            .unwrap()
    };
    // No agent.
    let mut r = router();
    r.frontend_opened(20, FrontendKind::HttpConnect);
    r.connect_request(t0(), 20, "a:1", 1, 0);
    assert_eq!(
        text(&actions(&mut r)),
        "HTTP/1.1 500 Internal Server Error\r\nContent-Type: text/plain\r\n\r\ncurrently no tunnels available: No agent available"
    );
    // Agent dial errors map to statuses.
    with_agent(&mut r, 1);
    for (err, code) in [
        (
            "dial tcp 10.0.0.5:1: connect: connection refused",
            "502 Bad Gateway",
        ),
        (
            "dial tcp: lookup nowhere.invalid: no such host",
            "502 Bad Gateway",
        ),
        ("dial tcp 10.0.0.5:1: i/o timeout", "504 Gateway Timeout"),
        (
            "dial tcp: socket: too many open files",
            "503 Service Unavailable",
        ),
    ] {
        r.frontend_opened(21, FrontendKind::HttpConnect);
        r.connect_request(t0(), 21, "a:1", 2, 0);
        actions(&mut r);
        let f = framed(&dial_rsp(2, 0, "x"));
        let _ = r.backend_packet(
            t0(),
            1,
            Packet::DialRsp {
                error: ByteStr::from(err.to_owned()),
                connect_id: 0,
                random: 2,
            },
            f,
            0,
        );
        assert_eq!(
            text(&actions(&mut r)),
            format!(
                "HTTP/1.1 {code}\r\nConnection: close\r\nContent-Type: text/plain; charset=utf-8\r\n\r\n{err}"
            )
        );
    }
    // Timeout and agent loss.
    r.frontend_opened(22, FrontendKind::HttpConnect);
    r.connect_request(t0(), 22, "a:1", 3, 0);
    actions(&mut r);
    r.handle_timeout(t0() + Duration::from_secs(31));
    assert_eq!(
        text(&actions(&mut r)),
        "HTTP/1.1 504 Gateway Timeout\r\nContent-Type: text/plain; charset=utf-8\r\n\r\nBackend dial timeout: timed out waiting for backend dial\r\n"
    );
    r.frontend_opened(23, FrontendKind::HttpConnect);
    r.connect_request(t0(), 23, "a:1", 4, 0);
    actions(&mut r);
    r.backend_gone(1);
    assert!(text(&actions(&mut r)).starts_with("HTTP/1.1 502 Bad Gateway\r\nContent-Type: text/plain; charset=utf-8\r\n\r\nBackend context error: "));
    assert_eq!(r.stats(), RouterStats::default(), "nothing left behind");
}

#[test]
fn dial_error_status_mapping() {
    assert_eq!(dial_error_status("context deadline exceeded"), 504);
    assert_eq!(dial_error_status("Connection Refused"), 502);
    assert_eq!(dial_error_status("tls: bad certificate"), 502);
    assert_eq!(dial_error_status("something else"), 502);
}

// ----- flow control ---------------------------------------------------------

/// Small marks so a few packets cross them: low 100, high 400, limit 1000,
/// cap 5000, stuck after 10 s. Backend 1 (`negotiated`: konn's extension),
/// frontend `fid` of `kind` with connection 7 established.
fn flow_router(negotiated: bool, kind: FrontendKind, fid: FrontendId) -> Router {
    let mut r = Router::new(
        RouterConfig {
            flow: FlowLimits {
                low: 100,
                high: 400,
                limit: 1000,
                cap: 5000,
                stuck_timeout: Duration::from_secs(10),
            },
            ..RouterConfig::default()
        },
        Directory::new(vec![Strategy::Default]),
    );
    with_agent(&mut r, 1);
    r.set_flow_control(1, negotiated);
    r.frontend_opened(fid, kind);
    match kind {
        FrontendKind::Grpc => from_frontend(&mut r, t0(), fid, dial_req(42)),
        FrontendKind::HttpConnect | FrontendKind::Reverse => {
            r.connect_request(t0(), fid, "a:1", 42, 0)
        }
    }
    from_backend(&mut r, t0(), 1, dial_rsp(42, 7, ""));
    actions(&mut r);
    r
}

fn at(secs: u64) -> Instant {
    t0() + Duration::from_secs(secs)
}

/// DATA for connection 7 from backend 1 with `len` payload bytes and
/// `len + 10` bytes of credit; returns (credit released now, actions).
fn agent_data(r: &mut Router, now: Instant, len: usize) -> (usize, Vec<Action>) {
    let p = Packet::Data {
        connect_id: 7,
        error: ByteStr::new(),
        data: Bytes::from(vec![1u8; len]),
    };
    let f = framed(&p);
    let now_credit = r.backend_packet(now, 1, p, f, len + 10);
    (now_credit, actions(r))
}

fn released_later(acts: &[Action]) -> usize {
    acts.iter()
        .map(|a| match a {
            Action::ReleaseBackend { backend: 1, credit } => *credit,
            _ => 0,
        })
        .sum()
}

fn pauses(acts: &[Action]) -> Vec<Packet> {
    to_backend_packets(acts)
        .into_iter()
        .filter(|(_, p)| p.ty().is_extension())
        .map(|(b, p)| {
            assert_eq!(b, 1);
            p
        })
        .collect()
}

#[test]
fn grpc_frontend_pause_at_high_water_resume_at_low_water_once_each() {
    let mut r = flow_router(true, FrontendKind::Grpc, 10);
    let mut paused = Vec::new();
    for _ in 0..3 {
        // 200 payload bytes are 215 framed bytes in the stream queue.
        let (credit, acts) = agent_data(&mut r, at(0), 200);
        assert_eq!(credit, 210, "under the limit: credit goes back at once");
        assert_eq!(to_frontend_packets(&acts).len(), 1, "forwarded");
        paused.extend(pauses(&acts));
    }
    assert_eq!(paused, vec![Packet::Pause { connect_id: 7 }], "one PAUSE");
    assert_eq!(r.frontend_queued(10), Some(645));
    // The IO layer measures the stream's send queue as it drains.
    r.frontend_level(at(1), 10, 300);
    assert!(actions(&mut r).is_empty(), "above the low mark");
    r.frontend_level(at(1), 10, 100);
    assert_eq!(
        pauses(&actions(&mut r)),
        vec![Packet::Resume { connect_id: 7 }]
    );
    r.frontend_level(at(1), 10, 0);
    assert!(actions(&mut r).is_empty(), "one RESUME");
}

#[test]
fn without_negotiation_no_pause_but_credit_withheld_and_released_on_drain() {
    let mut r = flow_router(false, FrontendKind::Grpc, 10);
    let (mut now_credit, mut withheld) = (0, 0);
    for _ in 0..8 {
        let (credit, acts) = agent_data(&mut r, at(0), 200);
        assert!(pauses(&acts).is_empty(), "a Go agent never sees PAUSE");
        assert_eq!(to_frontend_packets(&acts).len(), 1, "never dropped");
        now_credit += credit;
        withheld += 210 - credit;
    }
    assert_eq!(r.frontend_queued(10), Some(8 * 215));
    assert_eq!(now_credit, 4 * 210, "four fit under the limit of 1000");
    assert_eq!(withheld, 4 * 210);
    r.frontend_level(at(1), 10, 1000);
    assert_eq!(
        released_later(&actions(&mut r)),
        0,
        "at the limit, not under"
    );
    r.frontend_level(at(1), 10, 900);
    assert_eq!(released_later(&actions(&mut r)), 100);
    r.frontend_level(at(1), 10, 0);
    assert_eq!(released_later(&actions(&mut r)), withheld - 100);
    assert_eq!(r.stats().established, 1, "slow is not closed");
}

#[test]
fn stuck_grpc_frontend_is_closed_and_its_credit_released() {
    let mut r = flow_router(false, FrontendKind::Grpc, 10);
    let withheld: usize = (0..6).map(|_| 210 - agent_data(&mut r, at(0), 200).0).sum();
    assert_eq!(withheld, 2 * 210);
    assert_eq!(r.poll_timeout(), Some(at(10)));
    r.handle_timeout(at(9));
    assert!(actions(&mut r).is_empty());
    r.frontend_level(at(9), 10, 1200);
    actions(&mut r);
    assert_eq!(
        r.poll_timeout(),
        Some(at(19)),
        "progress restarts the clock"
    );
    r.handle_timeout(at(18));
    assert!(actions(&mut r).is_empty(), "slow is not stuck");
    r.handle_timeout(at(19));
    let acts = actions(&mut r);
    assert_eq!(
        to_backend_packets(&acts),
        vec![(1, Packet::CloseReq { connect_id: 7 })]
    );
    assert_eq!(
        to_frontend_packets(&acts),
        vec![(
            10,
            Packet::CloseRsp {
                error: ByteStr::from_static(FRONTEND_STUCK),
                connect_id: 7
            }
        )]
    );
    assert_eq!(released_later(&acts), withheld);
    assert_eq!(r.stats().established, 0);
    assert_eq!(r.poll_timeout(), None);
    // Its stream still holds what was queued: no second close.
    r.frontend_level(at(20), 10, 1300);
    assert_eq!(r.poll_timeout(), None);
    // Data still in flight: answered with CLOSE_REQ, credit back at once.
    let (credit, acts) = agent_data(&mut r, at(20), 5);
    assert_eq!(credit, 15);
    assert_eq!(
        to_backend_packets(&acts),
        vec![(1, Packet::CloseReq { connect_id: 7 })]
    );
}

#[test]
fn connect_frontend_pauses_and_a_stuck_one_is_aborted() {
    let mut r = flow_router(true, FrontendKind::HttpConnect, 20);
    let (credit, acts) = agent_data(&mut r, at(0), 500);
    assert_eq!(credit, 510);
    assert!(
        acts.iter()
            .any(|a| matches!(a, Action::ConnectData { frontend: 20, .. }))
    );
    assert_eq!(pauses(&acts), vec![Packet::Pause { connect_id: 7 }]);
    // The relay wrote some of it.
    r.frontend_level(at(5), 20, 50);
    assert_eq!(
        pauses(&actions(&mut r)),
        vec![Packet::Resume { connect_id: 7 }]
    );
    r.handle_timeout(at(14));
    assert!(actions(&mut r).is_empty());
    r.handle_timeout(at(15));
    let acts = actions(&mut r);
    assert!(acts.contains(&Action::AbortFrontend { frontend: 20 }));
    assert_eq!(
        to_backend_packets(&acts),
        vec![(1, Packet::CloseReq { connect_id: 7 })]
    );
    assert_eq!(
        r.stats(),
        RouterStats {
            backends: 1,
            ..RouterStats::default()
        }
    );
}

#[test]
fn pause_from_the_agent_holds_frontend_credit_until_resume() {
    let mut r = flow_router(true, FrontendKind::Grpc, 10);
    assert_eq!(r.frontend_credit(10, 100), 100);
    from_backend(&mut r, at(0), 1, Packet::Pause { connect_id: 7 });
    assert_eq!(
        actions(&mut r),
        vec![Action::PauseFrontend { frontend: 10 }]
    );
    assert!(r.frontend_paused(10));
    from_backend(&mut r, at(0), 1, Packet::Pause { connect_id: 7 });
    assert!(actions(&mut r).is_empty(), "already paused");
    assert_eq!(r.frontend_credit(10, 100), 0);
    assert_eq!(r.frontend_credit(10, 50), 0);
    // Its data still goes to the agent (PAUSE is about reading).
    from_frontend(&mut r, at(0), 10, data(7, b"x"));
    assert_eq!(to_backend_packets(&actions(&mut r)).len(), 1);
    from_backend(&mut r, at(1), 1, Packet::Resume { connect_id: 7 });
    assert_eq!(
        actions(&mut r),
        vec![Action::ResumeFrontend {
            frontend: 10,
            credit: 150
        }]
    );
    assert_eq!(r.frontend_credit(10, 100), 100);
    from_backend(&mut r, at(1), 1, Packet::Resume { connect_id: 7 });
    assert!(actions(&mut r).is_empty(), "not paused");
    // A flow that closed meanwhile: ignored.
    from_backend(&mut r, at(1), 1, Packet::Pause { connect_id: 99 });
    assert!(actions(&mut r).is_empty());
    // Paused when the agent goes away: the held credit comes back.
    from_backend(&mut r, at(2), 1, Packet::Pause { connect_id: 7 });
    actions(&mut r);
    assert_eq!(r.frontend_credit(10, 70), 0);
    r.backend_gone(1);
    let acts = actions(&mut r);
    assert!(acts.contains(&Action::ResumeFrontend {
        frontend: 10,
        credit: 70
    }));
    assert!(!r.frontend_paused(10));
    // And an agent's CLOSE_RSP for a paused flow does the same.
    let mut r = flow_router(true, FrontendKind::Grpc, 10);
    from_backend(&mut r, at(0), 1, Packet::Pause { connect_id: 7 });
    actions(&mut r);
    assert_eq!(r.frontend_credit(10, 30), 0);
    from_backend(
        &mut r,
        at(0),
        1,
        Packet::CloseRsp {
            error: ByteStr::new(),
            connect_id: 7,
        },
    );
    assert!(actions(&mut r).contains(&Action::ResumeFrontend {
        frontend: 10,
        credit: 30
    }));
}

#[test]
fn extension_packets_from_an_unnegotiated_agent_are_ignored() {
    let mut r = flow_router(false, FrontendKind::Grpc, 10);
    for p in [
        Packet::Pause { connect_id: 7 },
        Packet::Resume { connect_id: 7 },
    ] {
        let f = framed(&p);
        assert_eq!(r.backend_packet(at(0), 1, p, f, 33), 33, "credit back");
        assert!(actions(&mut r).is_empty());
    }
    assert!(!r.frontend_paused(10));
    assert_eq!(r.frontend_credit(10, 100), 100);
}

#[test]
fn every_other_agent_packet_returns_its_credit() {
    let mut r = flow_router(true, FrontendKind::Grpc, 10);
    for p in [
        Packet::Drain,
        dial_rsp(999, 0, "late"),
        Packet::CloseRsp {
            error: ByteStr::new(),
            connect_id: 55,
        },
        data(55, b"unknown connection"),
        Packet::DialCls { random: 1234 },
    ] {
        let f = framed(&p);
        assert_eq!(r.backend_packet(at(0), 1, p, f, 21), 21);
    }
}

// ----- flows across cores ---------------------------------------------------

/// Two cores' routers and the mesh between them: backend 7 is a tunnel of
/// core 1, frontend 1 lives on core 0. `pump` delivers every relay and
/// keeps each core's other actions, in order.
struct TwoCores {
    r: [Router; 2],
    out: [Vec<Action>; 2],
}

impl TwoCores {
    fn new() -> Self {
        let core = |c| {
            Router::new(
                RouterConfig {
                    core: c,
                    ..RouterConfig::default()
                },
                Directory::new(vec![Strategy::Default]),
            )
        };
        let mut r = [core(0), core(1)];
        r[1].backend_connected(7, "agent-7".into(), Identifiers::default(), 1);
        let entry = r[1].directory().get(7).unwrap().clone();
        r[0].directory_mut().add(entry);
        r[0].frontend_opened(1, FrontendKind::Grpc);
        Self {
            r,
            out: [Vec::new(), Vec::new()],
        }
    }

    fn pump(&mut self, now: Instant) {
        loop {
            let mut relays = Vec::new();
            for i in 0..2 {
                while let Some(a) = self.r[i].poll_action() {
                    match a {
                        Action::Relay { core, relay } => relays.push((i, core, relay)),
                        other => self.out[i].push(other),
                    }
                }
            }
            if relays.is_empty() {
                return;
            }
            for (from, to, relay) in relays {
                match relay {
                    Relay::ToBackend { backend, payload } => {
                        let p = decode(&payload);
                        self.r[to].relayed_packet(from, backend, p, framed(&decode(&payload)));
                    }
                    Relay::Release { backend, credit } => {
                        self.out[to].push(Action::ReleaseBackend { backend, credit })
                    }
                    Relay::FromBackend {
                        backend,
                        payload,
                        credit,
                    } => {
                        let p = decode(&payload);
                        let f = framed(&p);
                        let back = self.r[to].backend_packet(now, backend, p, f, credit);
                        assert_eq!(back, 0, "a relayed backend's credit goes back as a relay");
                    }
                }
            }
        }
    }

    /// An agent packet arriving on core 1's tunnel with `credit`.
    fn agent(&mut self, now: Instant, p: Packet, credit: usize) -> usize {
        let f = framed(&p);
        let back = self.r[1].backend_packet(now, 7, p, f, credit);
        self.pump(now);
        back
    }

    fn take(&mut self, core: usize) -> Vec<Action> {
        std::mem::take(&mut self.out[core])
    }
}

fn released(acts: &[Action]) -> usize {
    acts.iter()
        .map(|a| match a {
            Action::ReleaseBackend { credit, .. } => *credit,
            _ => 0,
        })
        .sum()
}

#[test]
fn a_flow_through_another_cores_tunnel_is_relayed_both_ways() {
    let mut m = TwoCores::new();
    let now = t0();
    from_frontend(&mut m.r[0], now, 1, dial_req(5));
    m.pump(now);
    assert_eq!(to_backend_packets(&m.take(1)), vec![(7, dial_req(5))]);
    assert_eq!(
        m.r[0].stats().pending_dials,
        1,
        "the dial is the frontend core's"
    );
    assert_eq!(m.r[1].stats().relayed, 1);

    // The answer reaches the frontend; its credit goes back to the tunnel.
    assert_eq!(m.agent(now, dial_rsp(5, 3, ""), 40), 0);
    assert_eq!(
        to_frontend_packets(&m.take(0)),
        vec![(1, dial_rsp(5, 3, ""))]
    );
    assert_eq!(released(&m.take(1)), 40);

    // Data both ways.
    from_frontend(&mut m.r[0], now, 1, data(3, b"up"));
    m.pump(now);
    assert_eq!(to_backend_packets(&m.take(1)), vec![(7, data(3, b"up"))]);
    m.agent(now, data(3, b"down"), 30);
    assert_eq!(to_frontend_packets(&m.take(0)), vec![(1, data(3, b"down"))]);
    assert_eq!(released(&m.take(1)), 30, "below the flow's limit: at once");

    // The agent closes; every table is back to its baseline.
    m.agent(
        now,
        Packet::CloseRsp {
            error: ByteStr::new(),
            connect_id: 3,
        },
        0,
    );
    assert_eq!(
        to_frontend_packets(&m.take(0)),
        vec![(
            1,
            Packet::CloseRsp {
                error: ByteStr::new(),
                connect_id: 3
            }
        )]
    );
    m.r[0].frontend_gone(1);
    m.pump(now);
    assert_eq!(m.r[0].stats().established, 0);
    assert_eq!(m.r[0].stats().pending_dials, 0);
    assert_eq!(m.r[1].stats().relayed, 0);
    assert_eq!(
        m.r[0].stats().remote_backends,
        1,
        "the proxy lives with the tunnel"
    );
    m.r[1].backend_gone(7);
    m.r[0].backend_gone(7); // the tunnel core's announcement
    m.pump(now);
    assert_eq!(m.r[0].stats().remote_backends, 0);
}

#[test]
fn a_relayed_flow_withholds_tunnel_credit_until_its_frontend_drains() {
    let mut m = TwoCores::new();
    let now = t0();
    from_frontend(&mut m.r[0], now, 1, dial_req(5));
    m.pump(now);
    m.agent(now, dial_rsp(5, 3, ""), 0);
    m.take(0);
    m.take(1);
    let limit = FlowLimits::default().limit;
    let big = Packet::Data {
        connect_id: 3,
        error: ByteStr::new(),
        data: Bytes::from(vec![0u8; limit + 1]),
    };
    let len = framed(&big).len();
    m.agent(now, big, len);
    assert_eq!(released(&m.take(1)), 0, "over the limit: withheld");
    m.r[0].frontend_level(now, 1, 0);
    m.pump(now);
    assert_eq!(
        released(&m.take(1)),
        len,
        "drained: back to the tunnel's core"
    );
}

#[test]
fn a_relayed_dial_ends_when_the_tunnel_goes() {
    let mut m = TwoCores::new();
    let now = t0();
    from_frontend(&mut m.r[0], now, 1, dial_req(5));
    m.pump(now);
    m.take(1);
    m.r[1].backend_gone(7);
    m.r[0].backend_gone(7);
    m.pump(now);
    let got = to_frontend_packets(&m.take(0));
    assert!(
        matches!(&got[..], [(1, Packet::DialRsp { error, random: 5, .. })] if &**error == BACKEND_GONE),
        "{got:?}"
    );
    assert_eq!(m.r[0].stats().pending_dials, 0);
    // A packet still in flight to the gone tunnel is dropped.
    from_frontend(&mut m.r[0], now, 1, dial_req(6));
    m.r[1].relayed_packet(0, 7, dial_req(6), framed(&dial_req(6)));
    m.pump(now);
    assert!(to_backend_packets(&m.take(1)).is_empty());
}

#[test]
fn the_tunnel_core_refuses_a_relayed_dial_id_it_already_uses() {
    let mut m = TwoCores::new();
    let now = t0();
    // A frontend of core 1 itself has dial 5 pending on the tunnel.
    m.r[1].frontend_opened(2, FrontendKind::Grpc);
    from_frontend(&mut m.r[1], now, 2, dial_req(5));
    m.pump(now);
    m.take(1);
    from_frontend(&mut m.r[0], now, 1, dial_req(5));
    m.pump(now);
    assert!(to_backend_packets(&m.take(1)).is_empty(), "not forwarded");
    let got = to_frontend_packets(&m.take(0));
    assert!(
        matches!(&got[..], [(1, Packet::DialRsp { error, random: 5, connect_id: 0 })] if &**error == DIAL_ID_IN_USE),
        "{got:?}"
    );
    assert_eq!(m.r[1].stats().relayed, 0);
}

#[test]
fn a_core_cannot_send_into_another_cores_relayed_connection() {
    let mut m = TwoCores::new();
    let now = t0();
    from_frontend(&mut m.r[0], now, 1, dial_req(5));
    m.pump(now);
    m.agent(now, dial_rsp(5, 3, ""), 0);
    m.take(1);
    // Core 2 (or a confused core 0 frontend) names connection 3.
    m.r[1].relayed_packet(2, 7, data(3, b"x"), framed(&data(3, b"x")));
    m.r[1].relayed_packet(
        2,
        7,
        Packet::CloseReq { connect_id: 3 },
        framed(&Packet::CloseReq { connect_id: 3 }),
    );
    m.pump(now);
    assert!(to_backend_packets(&m.take(1)).is_empty());
    // The owner still can.
    from_frontend(&mut m.r[0], now, 1, data(3, b"y"));
    m.pump(now);
    assert_eq!(to_backend_packets(&m.take(1)), vec![(7, data(3, b"y"))]);
}

// ----- the reverse direction (KEP-2025) ----------------------------------------

fn reverse_router(allowed: &[&str]) -> Router {
    let mut r = Router::new(
        RouterConfig {
            reverse: ReverseConfig {
                allowed: allowed
                    .iter()
                    .enumerate()
                    .map(|(i, a)| ((*a).to_owned(), i))
                    .collect(),
                max_per_agent: 2,
                dials_per_second: 1.0,
                burst: 3,
            },
            ..RouterConfig::default()
        },
        Directory::new(vec![Strategy::Default]),
    );
    with_agent(&mut r, 1);
    r.set_reverse(1, true);
    r
}

fn reverse_req(address: &str, random: i64) -> Packet {
    Packet::ReverseDialReq {
        protocol: ByteStr::from_static("tcp"),
        address: ByteStr::from(address.to_owned()),
        random,
    }
}

fn refusals(acts: &[Action]) -> Vec<ReverseRefusal> {
    acts.iter()
        .filter_map(|a| match a {
            Action::ReverseRefused(why) => Some(*why),
            _ => None,
        })
        .collect()
}

fn refused_rsp(random: i64) -> Packet {
    Packet::ReverseDialRsp {
        error: ByteStr::from_static(REVERSE_REFUSED),
        connect_id: 0,
        random,
    }
}

#[test]
fn reverse_dial_allowed_connects_and_carries_data_both_ways() {
    let mut r = reverse_router(&["10.0.0.10:6443"]);
    from_backend(&mut r, t0(), 1, reverse_req("10.0.0.10:6443", 7));
    let acts = actions(&mut r);
    assert_eq!(
        acts,
        vec![Action::ReverseDial {
            backend: 1,
            random: 7,
            target: 0
        }]
    );
    assert_eq!(r.stats().reverse_pending, 1);
    let id = r.reverse_dialed(1, 7, 500).expect("wanted");
    assert!(id < 0, "server-assigned ids are negative: {id}");
    let acts = actions(&mut r);
    assert_eq!(
        to_backend_packets(&acts),
        vec![(
            1,
            Packet::ReverseDialRsp {
                error: ByteStr::new(),
                connect_id: id,
                random: 7
            }
        )]
    );
    assert_eq!((r.stats().reverse_open, r.stats().established), (1, 0));
    // Agent → destination: served like a CONNECT frontend's socket.
    from_backend(&mut r, t0(), 1, data(id, b"GET /"));
    assert!(matches!(
        &actions(&mut r)[..],
        [Action::ConnectData { frontend: 500, data }] if &data[..] == b"GET /"
    ));
    // Destination → agent.
    assert!(r.connect_data(500, framed(&data(id, b"200")), 3));
    assert_eq!(
        to_backend_packets(&actions(&mut r)),
        vec![(1, data(id, b"200"))]
    );
    // The agent's client leaves: the socket closes, CLOSE_RSP answers.
    from_backend(&mut r, t0(), 1, Packet::CloseReq { connect_id: id });
    let acts = actions(&mut r);
    assert!(acts.contains(&Action::CloseFrontend { frontend: 500 }));
    assert_eq!(
        to_backend_packets(&acts),
        vec![(
            1,
            Packet::CloseRsp {
                error: ByteStr::new(),
                connect_id: id
            }
        )]
    );
    assert_eq!(
        r.stats(),
        RouterStats {
            backends: 1,
            ..RouterStats::default()
        }
    );
}

#[test]
fn reverse_destination_closing_first_sends_close_req() {
    let mut r = reverse_router(&["10.0.0.10:6443"]);
    from_backend(&mut r, t0(), 1, reverse_req("10.0.0.10:6443", 7));
    actions(&mut r);
    let id = r.reverse_dialed(1, 7, 500).unwrap();
    actions(&mut r);
    r.frontend_gone(500);
    assert_eq!(
        to_backend_packets(&actions(&mut r)),
        vec![(1, Packet::CloseReq { connect_id: id })]
    );
    assert_eq!(
        r.stats(),
        RouterStats {
            backends: 1,
            ..RouterStats::default()
        }
    );
}

#[test]
fn reverse_refusals_are_generic_and_counted_by_reason() {
    let mut r = reverse_router(&["10.0.0.10:6443"]);
    let cases = [
        (
            reverse_req("10.0.0.10:6443 ", 1),
            ReverseRefusal::NotAllowed,
        ),
        (reverse_req("127.0.0.1:6443", 2), ReverseRefusal::NotAllowed),
        (
            Packet::ReverseDialReq {
                protocol: ByteStr::from_static("udp"),
                address: ByteStr::from_static("10.0.0.10:6443"),
                random: 3,
            },
            ReverseRefusal::Protocol,
        ),
    ];
    for (p, why) in cases {
        let random = match &p {
            Packet::ReverseDialReq { random, .. } => *random,
            _ => unreachable!(),
        };
        from_backend(&mut r, t0(), 1, p);
        let acts = actions(&mut r);
        assert_eq!(refusals(&acts), vec![why]);
        assert_eq!(to_backend_packets(&acts), vec![(1, refused_rsp(random))]);
    }
    // Two in flight is the limit; a third is refused.
    from_backend(&mut r, t0(), 1, reverse_req("10.0.0.10:6443", 10));
    from_backend(&mut r, t0(), 1, reverse_req("10.0.0.10:6443", 10));
    assert_eq!(
        refusals(&actions(&mut r)),
        vec![ReverseRefusal::DuplicateId]
    );
    from_backend(&mut r, t0(), 1, reverse_req("10.0.0.10:6443", 11));
    from_backend(&mut r, t0(), 1, reverse_req("10.0.0.10:6443", 12));
    assert_eq!(
        refusals(&actions(&mut r)),
        vec![ReverseRefusal::Concurrency]
    );
    // A failed dial answers with the same text.
    r.reverse_dial_failed(1, 10, ReverseRefusal::Timeout);
    let acts = actions(&mut r);
    assert_eq!(refusals(&acts), vec![ReverseRefusal::Timeout]);
    assert_eq!(to_backend_packets(&acts), vec![(1, refused_rsp(10))]);
    // The third token of the bucket (3) at t0; then it is empty.
    from_backend(&mut r, t0(), 1, reverse_req("10.0.0.10:6443", 13));
    assert!(refusals(&actions(&mut r)).is_empty());
    r.reverse_dial_failed(1, 11, ReverseRefusal::DialError);
    r.reverse_dial_failed(1, 13, ReverseRefusal::DialError);
    actions(&mut r);
    from_backend(&mut r, t0(), 1, reverse_req("10.0.0.10:6443", 14));
    assert_eq!(refusals(&actions(&mut r)), vec![ReverseRefusal::Rate]);
    // One token a second.
    from_backend(&mut r, at(1), 1, reverse_req("10.0.0.10:6443", 15));
    assert!(refusals(&actions(&mut r)).is_empty(), "a second later");
}

#[test]
fn reverse_needs_negotiation_and_an_allow_list() {
    // Not negotiated: ignored.
    let mut r = reverse_router(&["10.0.0.10:6443"]);
    r.set_reverse(1, false);
    from_backend(&mut r, t0(), 1, reverse_req("10.0.0.10:6443", 7));
    assert!(actions(&mut r).is_empty());
    // No allow-list: everything refused.
    let mut r = reverse_router(&[]);
    from_backend(&mut r, t0(), 1, reverse_req("10.0.0.10:6443", 7));
    assert_eq!(refusals(&actions(&mut r)), vec![ReverseRefusal::NotAllowed]);
}

#[test]
fn reverse_connections_end_with_their_tunnel_and_late_dials_are_dropped() {
    let mut r = reverse_router(&["10.0.0.10:6443"]);
    from_backend(&mut r, t0(), 1, reverse_req("10.0.0.10:6443", 7));
    from_backend(&mut r, t0(), 1, reverse_req("10.0.0.10:6443", 8));
    actions(&mut r);
    r.reverse_dialed(1, 7, 500).unwrap();
    actions(&mut r);
    r.backend_gone(1);
    assert!(actions(&mut r).contains(&Action::CloseFrontend { frontend: 500 }));
    assert_eq!(r.reverse_dialed(1, 8, 501), None, "the tunnel went");
    assert_eq!(r.stats(), RouterStats::default());
}

fn limited(cfg: crate::server::limits::LimitsConfig) -> (Router, Arc<Limits>) {
    let limits = Arc::new(Limits::new(cfg, t0()));
    let r = Router::new(
        RouterConfig {
            limits: Some(limits.clone()),
            ..RouterConfig::default()
        },
        Directory::new(vec![Strategy::Default]),
    );
    (r, limits)
}

#[test]
fn agent_connection_limit_refuses_grpc_with_a_dial_rsp_and_releases_on_close() {
    let mut cfg = crate::server::limits::LimitsConfig::default();
    cfg.agent.max_conns = 1;
    let (mut r, limits) = limited(cfg);
    with_agent(&mut r, 1);
    r.frontend_opened(10, FrontendKind::Grpc);
    from_frontend(&mut r, t0(), 10, dial_req(42));
    from_backend(&mut r, t0(), 1, dial_rsp(42, 7, ""));
    actions(&mut r);
    assert_eq!(limits.agent_load("agent-1"), (1, 0));
    // A second frontend's dial is refused at admission: never reaches the
    // agent, answered with a DIAL_RSP error.
    r.frontend_opened(11, FrontendKind::Grpc);
    from_frontend(&mut r, t0(), 11, dial_req(43));
    let acts = actions(&mut r);
    assert!(to_backend_packets(&acts).is_empty());
    assert!(acts.iter().any(|a| matches!(
        a,
        Action::DialRefused {
            frontend: 11,
            reason: Refusal::AgentConns,
            backend: 1,
            ..
        }
    )));
    assert_eq!(
        to_frontend_packets(&acts),
        vec![(
            11,
            Packet::DialRsp {
                error: ByteStr::from("konn: dial refused: limit_agent_conns".to_owned()),
                connect_id: 0,
                random: 43
            }
        )]
    );
    assert_eq!(limits.agent_load("agent-1"), (1, 1));
    // CLOSE_RSP of the first connection frees the slot.
    from_frontend(&mut r, t0(), 10, Packet::CloseReq { connect_id: 7 });
    let close_rsp = Packet::CloseRsp {
        connect_id: 7,
        error: ByteStr::new(),
    };
    from_backend(&mut r, t0(), 1, close_rsp);
    actions(&mut r);
    assert_eq!(limits.agent_load("agent-1").0, 0);
    r.frontend_opened(12, FrontendKind::Grpc);
    from_frontend(&mut r, t0(), 12, dial_req(44));
    assert_eq!(to_backend_packets(&actions(&mut r)).len(), 1);
    // A failed or cancelled pending dial releases too.
    r.frontend_gone(12);
    assert_eq!(limits.agent_load("agent-1").0, 0);
    r.check_invariants().unwrap();
}

#[test]
fn destination_rate_refuses_connect_with_503_and_lets_other_hosts_through() {
    let mut cfg = crate::server::limits::LimitsConfig::default();
    cfg.dest.rate = 1.0;
    cfg.dest.burst = 1;
    let (mut r, _) = limited(cfg);
    with_agent(&mut r, 1);
    r.frontend_opened(10, FrontendKind::HttpConnect);
    r.connect_request(t0(), 10, "10.0.0.5:10250", 1, 0);
    assert_eq!(to_backend_packets(&actions(&mut r)).len(), 1);
    r.frontend_opened(11, FrontendKind::HttpConnect);
    r.connect_request(t0(), 11, "10.0.0.5:22", 2, 0);
    let acts = actions(&mut r);
    let refused = acts.iter().find_map(|a| match a {
        Action::ConnectFailed {
            frontend: 11,
            response,
        } => Some(response.clone()),
        _ => None,
    });
    let refused = String::from_utf8(refused.unwrap().to_vec()).unwrap();
    assert!(
        refused.starts_with("HTTP/1.1 503 Service Unavailable\r\n"),
        "{refused}"
    );
    assert!(refused.ends_with("konn: dial refused: limit_dest_rate"));
    assert!(to_backend_packets(&acts).is_empty());
    r.frontend_opened(12, FrontendKind::HttpConnect);
    r.connect_request(t0(), 12, "10.0.0.6:22", 3, 0);
    assert_eq!(to_backend_packets(&actions(&mut r)).len(), 1);
    r.check_invariants().unwrap();
}

#[test]
fn frontend_identity_limit_and_overload() {
    let cfg = crate::server::limits::LimitsConfig {
        frontend: crate::server::limits::Limit {
            max_conns: 1,
            ..Default::default()
        },
        overload_high: 100,
        overload_low: 50,
        ..Default::default()
    };
    let (mut r, limits) = limited(cfg);
    with_agent(&mut r, 1);
    for (fid, who) in [
        (10, "apiserver-a"),
        (11, "apiserver-a"),
        (12, "apiserver-b"),
    ] {
        r.frontend_opened(fid, FrontendKind::Grpc);
        r.set_frontend_identity(fid, who.into());
    }
    from_frontend(&mut r, t0(), 10, dial_req(1));
    from_frontend(&mut r, t0(), 11, dial_req(2));
    from_frontend(&mut r, t0(), 12, dial_req(3));
    let acts = actions(&mut r);
    assert_eq!(to_backend_packets(&acts).len(), 2);
    assert!(acts.iter().any(|a| matches!(
        a,
        Action::DialRefused {
            frontend: 11,
            reason: Refusal::FrontendConns,
            backend: 1,
            ..
        }
    )));
    // Overloaded: a new dial is refused; the pending one still completes.
    assert!(limits.observe_memory(101));
    r.frontend_opened(13, FrontendKind::Grpc);
    from_frontend(&mut r, t0(), 13, dial_req(4));
    from_backend(&mut r, t0(), 1, dial_rsp(1, 7, ""));
    let acts = actions(&mut r);
    assert!(acts.iter().any(|a| matches!(
        a,
        Action::DialRefused {
            frontend: 13,
            reason: Refusal::Overload,
            backend: 1,
            ..
        }
    )));
    assert!(to_frontend_packets(&acts).contains(&(10, dial_rsp(1, 7, ""))));
    assert!(!limits.observe_memory(10));
    r.frontend_opened(14, FrontendKind::Grpc);
    from_frontend(&mut r, t0(), 14, dial_req(5));
    assert_eq!(to_backend_packets(&actions(&mut r)).len(), 1);
    r.check_invariants().unwrap();
}

// ----- accounting (audit records, byte metrics) -------------------------------

fn summaries(acts: &[Action]) -> Vec<ConnSummary> {
    acts.iter()
        .filter_map(|a| match a {
            Action::ConnEnded(s) => Some((**s).clone()),
            _ => None,
        })
        .collect()
}

#[test]
fn an_established_grpc_connection_leaves_one_summary_with_its_bytes() {
    let mut r = established();
    r.set_frontend_peer(10, "uid=0".into());
    from_frontend(&mut r, t0(), 10, data(7, b"hello"));
    from_backend(&mut r, t0(), 1, data(7, b"abc"));
    from_backend(&mut r, t0(), 1, data(7, b"de"));
    let open: Vec<ConnView> = r.connections(t0()).collect();
    assert_eq!(open.len(), 1);
    assert_eq!((open[0].bytes_to_agent, open[0].bytes_from_agent), (5, 5));
    assert_eq!(open[0].agent_id.as_deref(), Some("agent-1"));
    from_frontend(&mut r, t0(), 10, Packet::CloseReq { connect_id: 7 });
    from_backend(
        &mut r,
        t0(),
        1,
        Packet::CloseRsp {
            error: ByteStr::new(),
            connect_id: 7,
        },
    );
    assert!(
        summaries(&actions(&mut r)).is_empty(),
        "not before it leaves"
    );
    r.frontend_gone(10);
    let s = summaries(&actions(&mut r));
    assert_eq!(s.len(), 1);
    let s = &s[0];
    assert_eq!(
        (s.result, s.reason, s.closed_by),
        (ConnResult::Closed, "", Side::Frontend)
    );
    assert_eq!((s.bytes_to_agent, s.bytes_from_agent), (5, 5));
    assert_eq!(&*s.destination, "10.0.0.5:10250");
    assert_eq!(s.peer.as_deref(), Some("uid=0"));
    assert_eq!((s.connect_id, s.backend), (7, Some(1)));
    r.frontend_gone(10);
    assert!(summaries(&actions(&mut r)).is_empty(), "exactly one");
}

#[test]
fn an_agent_close_is_the_agents() {
    let mut r = established();
    from_backend(
        &mut r,
        t0(),
        1,
        Packet::CloseRsp {
            error: ByteStr::new(),
            connect_id: 7,
        },
    );
    r.frontend_gone(10);
    let s = summaries(&actions(&mut r));
    assert_eq!(s[0].closed_by, Side::Agent);
}

#[test]
fn refusals_and_failures_leave_one_summary_with_a_reason() {
    // No agent.
    let mut r = router();
    r.frontend_opened(10, FrontendKind::Grpc);
    from_frontend(&mut r, t0(), 10, dial_req(1));
    r.frontend_gone(10);
    let s = summaries(&actions(&mut r));
    assert_eq!(s.len(), 1);
    assert_eq!(
        (
            s[0].result,
            s[0].reason,
            s[0].closed_by,
            s[0].agent_id.clone()
        ),
        (ConnResult::Refused, "no_backend", Side::Server, None)
    );
    // The agent's dial error.
    with_agent(&mut r, 1);
    r.frontend_opened(11, FrontendKind::HttpConnect);
    r.connect_request(t0(), 11, "10.0.0.5:1", 2, 0);
    from_backend(&mut r, t0(), 1, dial_rsp(2, 0, "connection refused"));
    let s = summaries(&actions(&mut r));
    assert_eq!(
        (s[0].result, s[0].reason, s[0].closed_by),
        (ConnResult::Failed, "dial_failed", Side::Agent)
    );
    // The agent's allow-list refusal.
    r.frontend_opened(15, FrontendKind::Grpc);
    from_frontend(&mut r, t0(), 15, dial_req(5));
    let not_allowed = Packet::DialRsp {
        error: ByteStr::from(format!(
            "dial tcp 10.0.0.5:10250: {}",
            crate::server::limits::NOT_ALLOWED
        )),
        connect_id: 0,
        random: 5,
    };
    from_backend(&mut r, t0(), 1, not_allowed);
    r.frontend_gone(15);
    let s = summaries(&actions(&mut r));
    assert_eq!(
        (s[0].result, s[0].reason, s[0].closed_by),
        (ConnResult::Refused, "destination_not_allowed", Side::Agent)
    );
    // A timeout.
    r.frontend_opened(12, FrontendKind::HttpConnect);
    r.connect_request(t0(), 12, "10.0.0.5:1", 3, 0);
    r.handle_timeout(t0() + Duration::from_secs(60));
    let s = summaries(&actions(&mut r));
    assert_eq!(
        (s[0].result, s[0].reason, s[0].closed_by),
        (ConnResult::Failed, "dial_timeout", Side::Server)
    );
    // Cancelled by the frontend going away.
    r.frontend_opened(13, FrontendKind::Grpc);
    from_frontend(&mut r, t0(), 13, dial_req(4));
    r.frontend_gone(13);
    let s = summaries(&actions(&mut r));
    assert_eq!(
        (s[0].result, s[0].reason, s[0].closed_by),
        (ConnResult::Cancelled, "frontend_close", Side::Frontend)
    );
    // A refusal by the admission limits (here the overload manager): 503
    // for CONNECT, one summary with the limit's reason.
    let (mut l, limits) = limited(crate::server::limits::LimitsConfig {
        overload_high: 10,
        overload_low: 5,
        ..Default::default()
    });
    with_agent(&mut l, 1);
    assert!(limits.observe_memory(11));
    l.frontend_opened(14, FrontendKind::HttpConnect);
    l.connect_request(t0(), 14, "10.0.0.9:443", 5, 0);
    let acts = actions(&mut l);
    assert!(
        acts.iter()
            .any(|a| matches!(a, Action::ConnectFailed { frontend: 14, .. }))
    );
    let s = summaries(&acts);
    assert_eq!(
        (s[0].result, s[0].reason, s[0].closed_by, &*s[0].destination),
        (
            ConnResult::Refused,
            "overload",
            Side::Server,
            "10.0.0.9:443"
        )
    );
    // A frontend that never dialled leaves nothing.
    r.frontend_opened(15, FrontendKind::Grpc);
    r.frontend_gone(15);
    assert!(summaries(&actions(&mut r)).is_empty());
}

#[test]
fn connect_bytes_backend_gone_and_stuck_are_accounted() {
    let mut r = router();
    with_agent(&mut r, 1);
    r.frontend_opened(10, FrontendKind::HttpConnect);
    r.connect_request(t0(), 10, "10.0.0.5:80", 1, 0);
    from_backend(&mut r, t0(), 1, dial_rsp(1, 7, ""));
    let p = data(7, b"0123456789");
    assert!(r.connect_data(10, framed(&p), 10));
    from_backend(&mut r, t0(), 1, data(7, b"xyz"));
    actions(&mut r);
    r.backend_gone(1);
    let s = summaries(&actions(&mut r));
    assert_eq!(s.len(), 1);
    assert_eq!(
        (s[0].bytes_to_agent, s[0].bytes_from_agent, s[0].reason),
        (10, 3, "backend_gone")
    );
    assert_eq!(s[0].closed_by, Side::Agent);
    // A stuck CONNECT frontend.
    with_agent(&mut r, 2);
    r.frontend_opened(11, FrontendKind::HttpConnect);
    r.connect_request(t0(), 11, "10.0.0.5:80", 2, 0);
    from_backend(&mut r, t0(), 2, dial_rsp(2, 8, ""));
    actions(&mut r);
    r.frontend_stuck(11, FRONTEND_STUCK);
    let s = summaries(&actions(&mut r));
    assert_eq!(s.len(), 1);
    assert_eq!(
        (s[0].result, s[0].reason, s[0].closed_by),
        (ConnResult::Closed, "frontend_stuck", Side::Server)
    );
    assert_eq!(r.connections(t0()).count(), 0);
}

#[test]
fn a_second_dial_on_one_stream_leaves_its_own_summary() {
    let mut r = router();
    with_agent(&mut r, 1);
    r.frontend_opened(10, FrontendKind::Grpc);
    from_frontend(&mut r, t0(), 10, dial_req(1));
    from_backend(&mut r, t0(), 1, dial_rsp(1, 0, "connection refused"));
    assert!(summaries(&actions(&mut r)).is_empty());
    from_frontend(&mut r, t0(), 10, dial_req(2));
    let s = summaries(&actions(&mut r));
    assert_eq!(s.len(), 1, "the first dial's");
    assert_eq!(
        (s[0].result, s[0].reason),
        (ConnResult::Failed, "dial_failed")
    );
    from_backend(&mut r, t0(), 1, dial_rsp(2, 7, ""));
    r.frontend_gone(10);
    let s = summaries(&actions(&mut r));
    assert_eq!(s.len(), 1);
    assert_eq!((s[0].result, s[0].connect_id), (ConnResult::Closed, 7));
}
