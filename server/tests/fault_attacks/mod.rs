//! Rows 15–19 of the fault matrix: malformed HTTP/2, malformed gRPC and
//! Konnectivity packets, oversized input, failed authentication and a
//! spoofed agent identity, each thrown at the real listeners of both
//! implementations (the gRPC frontend on a Unix socket, the HTTP-CONNECT
//! frontend, the mTLS agent port) by raw clients that write exactly the
//! bytes a case needs (konn-testkit's `h2raw`).
//!
//! Every row then checks what every row of the matrix checks: the server
//! still runs and a new dial echoes byte-exact, its tables are empty and its
//! descriptors are back to baseline. Each case's expected answer is the one
//! RFC 9113, gRPC or the Konnectivity protocol prescribes; a row's failure
//! names the first case that answered otherwise and what it answered.

use std::sync::mpsc::RecvTimeoutError;

use bytes::{Bytes, BytesMut};
use konn_core::io::runtime::{Engine, block_on};
use konn_core::io::tls::{ClientTls, ClientTlsOptions, PemSource, TlsStream};
use konn_frames::Reason;
use konn_frames::grpc::Deframer;
use konn_frames::h2::{FrameType, PREFACE, flags};
use konn_frames::packet::Packet;
use konn_testkit::h2raw::{self, RawClient, RawFrame};

use super::*;

/// Bound on every answer to an attack (the server answers at once).
const ANSWER: Duration = Duration::from_secs(3);

/// What a connection did after an attack.
struct Seen {
    frames: Vec<RawFrame>,
    closed: bool,
}

impl Seen {
    fn goaway(&self) -> Option<(Reason, String)> {
        self.frames
            .iter()
            .find_map(RawFrame::goaway)
            .map(|g| (g.reason, g.debug))
    }

    fn rst(&self, sid: u32) -> Option<Reason> {
        self.frames
            .iter()
            .filter(|f| f.head.stream_id == sid)
            .find_map(RawFrame::rst)
    }

    /// `grpc-status` (and message) of the trailers on `sid`.
    fn status(&self, sid: u32) -> Option<String> {
        self.frames
            .iter()
            .filter(|f| f.head.stream_id == sid)
            .find_map(|f| {
                let code = f.field("grpc-status")?;
                Some(format!(
                    "{code} {}",
                    f.field("grpc-message").unwrap_or_default()
                ))
            })
    }

    /// The Konnectivity packets that arrived on `sid`.
    fn packets(&self, sid: u32) -> Vec<Packet> {
        let mut d = Deframer::new(4 << 20);
        let mut out = Vec::new();
        for f in self
            .frames
            .iter()
            .filter(|f| f.head.stream_id == sid && f.ty() == FrameType::DATA)
        {
            let mut chunk = f.payload.clone();
            while let Ok(Some(m)) = d.next(&mut chunk) {
                if let Ok(p) = Packet::decode(&m) {
                    out.push(p);
                }
            }
        }
        out
    }

    fn describe(&self) -> String {
        let kinds: Vec<String> = self
            .frames
            .iter()
            .map(|f| match (f.goaway(), f.rst(), f.field("grpc-status")) {
                (Some(g), _, _) => format!("GOAWAY {:?} {:?}", g.reason, g.debug),
                (_, Some(r), _) => format!("RST_STREAM({}) {r:?}", f.head.stream_id),
                (_, _, Some(s)) => format!("trailers({}) grpc-status {s}", f.head.stream_id),
                _ => format!("{:?}({})", f.ty(), f.head.stream_id),
            })
            .filter(|k| !k.starts_with("SETTINGS") && !k.starts_with("WINDOW_UPDATE"))
            .collect();
        format!(
            "[{}]{}",
            kinds.join(", "),
            if self.closed { ", closed" } else { ", open" }
        )
    }
}

/// Frames until the connection closes, `stop` says enough, or `limit`.
fn watch(c: &mut RawClient, limit: Duration, stop: impl Fn(&RawFrame) -> bool) -> Seen {
    let deadline = Instant::now() + limit;
    let mut frames = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Seen {
                frames,
                closed: false,
            };
        }
        match c.recv(left) {
            Ok(f) => {
                let done = stop(&f);
                frames.push(f);
                if done {
                    return Seen {
                        frames,
                        closed: false,
                    };
                }
            }
            Err(RecvTimeoutError::Disconnected) => {
                return Seen {
                    frames,
                    closed: true,
                };
            }
            Err(RecvTimeoutError::Timeout) => {}
        }
    }
}

/// The connection error `reason`: GOAWAY with it, then the close.
fn expect_conn_error(case: &str, mut c: RawClient, reason: Reason) -> Result<(), String> {
    let seen = watch(&mut c, ANSWER, |_| false);
    check(
        seen.closed && seen.goaway().is_some_and(|(r, _)| r == reason),
        || {
            format!(
                "{case}: expected GOAWAY {reason:?} and a close, got {}",
                seen.describe()
            )
        },
    )
}

/// The stream error `reason` on `sid`, the connection still answering PING.
fn expect_stream_error(
    case: &str,
    mut c: RawClient,
    sid: u32,
    reason: Reason,
) -> Result<(), String> {
    let seen = watch(&mut c, ANSWER, |f| {
        f.rst().is_some() || f.goaway().is_some()
    });
    check(seen.rst(sid) == Some(reason), || {
        format!(
            "{case}: expected RST_STREAM({sid}) {reason:?}, got {}",
            seen.describe()
        )
    })?;
    expect_ping(case, &mut c)
}

/// The connection answers a PING.
fn expect_ping(case: &str, c: &mut RawClient) -> Result<(), String> {
    c.write(&h2raw::ping(*b"stillup!"))
        .map_err(|e| format!("{case}: PING after the attack: {e}"))?;
    let seen = watch(c, ANSWER, |f| {
        f.ty() == FrameType::PING && f.head.flags & flags::ACK != 0
    });
    check(
        seen.frames
            .iter()
            .any(|f| f.ty() == FrameType::PING && f.head.flags & flags::ACK != 0),
        || format!("{case}: no PING ACK after the attack: {}", seen.describe()),
    )
}

/// A gRPC frontend connection after its handshake.
fn client(uds: &Path) -> Result<RawClient, String> {
    let mut c = RawClient::try_connect_unix(uds).map_err(|e| format!("connect: {e}"))?;
    c.try_handshake(&[])?;
    Ok(c)
}

/// HEADERS opening a `/ProxyService/Proxy` call on `sid`.
fn open_proxy(c: &mut RawClient, sid: u32) -> Result<(), String> {
    let block = c.request_block(
        "POST",
        "/ProxyService/Proxy",
        &[("content-type", "application/grpc"), ("te", "trailers")],
    );
    c.write(&h2raw::headers(sid, &block, false))
        .map_err(|e| format!("open stream {sid}: {e}"))
}

/// `p` as one gRPC message.
fn message(p: &Packet) -> Vec<u8> {
    let mut b = BytesMut::new();
    p.encode_grpc(&mut b);
    b.to_vec()
}

/// A gRPC message with a raw body and compressed flag.
fn raw_message(compressed: bool, body: &[u8]) -> Vec<u8> {
    let mut b = vec![u8::from(compressed)];
    b.extend_from_slice(&u32::try_from(body.len()).unwrap().to_be_bytes());
    b.extend_from_slice(body);
    b
}

/// Dials `dest` over a raw gRPC frontend connection, echoes 1000 bytes and
/// closes the connection with CLOSE_REQ: the server still serves.
fn raw_dial_echo(uds: &Path, dest: SocketAddr) -> Result<(), String> {
    let mut c = client(uds)?;
    open_proxy(&mut c, 1)?;
    let dial = Packet::DialReq {
        protocol: "tcp".into(),
        address: dest.to_string().into(),
        random: 4242,
    };
    c.write(&h2raw::data(1, &message(&dial), false))
        .map_err(|e| e.to_string())?;
    let mut d = Deframer::new(4 << 20);
    let mut connect_id = None;
    let payload: Vec<u8> = (0..1000u32).map(|i| (i % 251) as u8).collect();
    let mut echoed = Vec::new();
    let deadline = Instant::now() + T;
    while echoed.len() < payload.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        let f = c
            .recv(left)
            .map_err(|e| format!("raw dial: {e:?} after {} echoed bytes", echoed.len()))?;
        if f.head.stream_id != 1 || f.ty() != FrameType::DATA {
            if let Some(s) = f.field("grpc-status") {
                return Err(format!("raw dial: the call ended with grpc-status {s}"));
            }
            continue;
        }
        let mut chunk = f.payload.clone();
        while let Some(m) = d.next(&mut chunk).map_err(|e| e.to_string())? {
            match Packet::decode(&m).map_err(|e| e.to_string())? {
                Packet::DialRsp {
                    error,
                    connect_id: id,
                    ..
                } => {
                    if !error.as_str().is_empty() {
                        return Err(format!("raw dial refused: {}", error.as_str()));
                    }
                    connect_id = Some(id);
                    let data = Packet::Data {
                        connect_id: id,
                        error: "".into(),
                        data: Bytes::from(payload.clone()),
                    };
                    c.write(&h2raw::data(1, &message(&data), false))
                        .map_err(|e| e.to_string())?;
                }
                Packet::Data { data, .. } => echoed.extend_from_slice(&data),
                other => return Err(format!("raw dial: unexpected {other:?}")),
            }
        }
    }
    check(echoed == payload, || {
        "raw dial: the echo differs".to_owned()
    })?;
    let close = Packet::CloseReq {
        connect_id: connect_id.unwrap_or_default(),
    };
    c.write(&h2raw::data(1, &message(&close), false))
        .map_err(|e| e.to_string())?;
    let seen = watch(&mut c, ANSWER, |f| {
        f.head.stream_id == 1 && f.ty() == FrameType::DATA
    });
    check(
        seen.packets(1)
            .iter()
            .any(|p| matches!(p, Packet::CloseRsp { .. })),
        || format!("raw dial: no CLOSE_RSP: {}", seen.describe()),
    )
}

/// What every row ends with: the server serves a new dial, its tables are
/// empty and its descriptors back to `fds`.
fn still_serving(server: &Server, uds: &Path, dest: SocketAddr, fds: usize) -> Result<(), String> {
    raw_dial_echo(uds, dest)?;
    check(wait_until(T, || server.tables_empty()), || {
        "server tables not back to empty".to_owned()
    })?;
    server_fds_back(server, fds)
}

/// A gRPC-mode server with one agent, ready, and an echo destination.
fn grpc_setup(
    imp: Imp,
    dir: &TempDir,
    pki: &PkiFiles,
) -> Result<(Server, Agent, Echo, usize), String> {
    let echo = Echo::start();
    let server = Server::start(imp, dir, pki, 0, &["--mode=grpc"]);
    let agent = Agent::start(imp, dir, pki, "agent-a", server.agent_port);
    check(wait_until(T, || server.ready() >= 1.0), || {
        "the agent did not connect".to_owned()
    })?;
    raw_dial_echo(&server.uds, echo.addr)?;
    let fds = fds_of(server.proc.pid());
    Ok((server, agent, echo, fds))
}

#[test]
fn row15_malformed_http2() {
    run_row(
        "15",
        "Malformed HTTP/2",
        "On the gRPC frontend, one connection per case: a wrong preface, and HEADERS before SETTINGS, close the connection (with GOAWAY PROTOCOL_ERROR if any); an even stream ID, a stream ID going down, DATA on an idle stream, PUSH_PROMISE from the client and a zero connection WINDOW_UPDATE get GOAWAY PROTOCOL_ERROR and a close; a connection WINDOW_UPDATE past 2^31-1 gets GOAWAY FLOW_CONTROL_ERROR; a stream WINDOW_UPDATE past 2^31-1 gets RST_STREAM FLOW_CONTROL_ERROR while the connection still answers PING. Then a new dial echoes byte-exact, tables are empty and descriptors back to baseline",
        |imp, dir, pki| {
            let (server, _agent, echo, fds) = grpc_setup(imp, dir, pki)?;
            let uds = server.uds.clone();
            let start = Instant::now();

            // The preface cases: closed, and a GOAWAY if any says PROTOCOL_ERROR.
            for (case, bytes) in [
                (
                    "wrong preface",
                    b"PRI * HTTP/2.0\r\n\r\nXY\r\n\r\n".to_vec(),
                ),
                ("HEADERS before SETTINGS", {
                    let mut b = PREFACE.to_vec();
                    b.extend_from_slice(&h2raw::headers(1, &[0x82], true));
                    b
                }),
            ] {
                let mut c =
                    RawClient::try_connect_unix(&uds).map_err(|e| format!("{case}: {e}"))?;
                let _ = c.write(&bytes);
                let seen = watch(&mut c, ANSWER, |_| false);
                check(
                    seen.closed
                        && seen
                            .goaway()
                            .is_none_or(|(r, _)| r == Reason::PROTOCOL_ERROR),
                    || format!("{case}: expected a close, got {}", seen.describe()),
                )?;
            }

            let mut c = client(&uds)?;
            open_proxy(&mut c, 2)?;
            expect_conn_error("even stream ID", c, Reason::PROTOCOL_ERROR)?;

            let mut c = client(&uds)?;
            open_proxy(&mut c, 5)?;
            open_proxy(&mut c, 3)?;
            expect_conn_error("stream ID going down", c, Reason::PROTOCOL_ERROR)?;

            let mut c = client(&uds)?;
            c.write(&h2raw::data(7, b"hello", false))
                .map_err(|e| e.to_string())?;
            expect_conn_error("DATA on an idle stream", c, Reason::PROTOCOL_ERROR)?;

            let mut c = client(&uds)?;
            let mut pp = 2u32.to_be_bytes().to_vec();
            pp.push(0x82);
            c.write(&h2raw::frame(
                FrameType::PUSH_PROMISE,
                flags::END_HEADERS,
                1,
                &pp,
            ))
            .map_err(|e| e.to_string())?;
            expect_conn_error("PUSH_PROMISE from the client", c, Reason::PROTOCOL_ERROR)?;

            let mut c = client(&uds)?;
            c.write(&h2raw::window_update(0, 0))
                .map_err(|e| e.to_string())?;
            expect_conn_error("zero WINDOW_UPDATE", c, Reason::PROTOCOL_ERROR)?;

            let mut c = client(&uds)?;
            c.write(&h2raw::window_update(0, 0x7fff_ffff))
                .map_err(|e| e.to_string())?;
            expect_conn_error("connection window overflow", c, Reason::FLOW_CONTROL_ERROR)?;

            let mut c = client(&uds)?;
            open_proxy(&mut c, 1)?;
            c.write(&h2raw::window_update(1, 0x7fff_ffff))
                .map_err(|e| e.to_string())?;
            expect_stream_error("stream window overflow", c, 1, Reason::FLOW_CONTROL_ERROR)?;

            let detection = start.elapsed();
            still_serving(&server, &uds, echo.addr, fds)?;
            Ok(Measured {
                detection: Some(detection),
                note: "time: all nine cases answered, one after another".to_owned(),
                ..Measured::default()
            })
        },
    );
}

/// A Konnectivity `Packet` without its payload: `type` only.
fn bare_packet(ty: u8) -> Vec<u8> {
    raw_message(false, &[0x08, ty])
}

#[test]
fn row16_malformed_grpc_and_konnectivity() {
    run_row(
        "16",
        "Malformed gRPC / Konnectivity",
        "On /ProxyService/Proxy calls of the gRPC frontend: a compressed message (no compression negotiated) ends the call with grpc-status INTERNAL (13) or UNIMPLEMENTED (12), a message cut short by END_STREAM with INTERNAL; a Packet of an unknown type, a DIAL_REQ and a DATA without their payload, DATA and CLOSE_REQ for a connection that does not exist and a connectID of 0 or below never crash the server nor create state: every call either answers CLOSE_RSP or ends with a non-OK grpc-status, and the connection stays usable. Then a new dial echoes byte-exact, tables are empty and descriptors back to baseline",
        |imp, dir, pki| {
            let (mut server, _agent, echo, fds) = grpc_setup(imp, dir, pki)?;
            let uds = server.uds.clone();

            for (case, body, codes) in [
                (
                    "compressed without grpc-encoding",
                    raw_message(true, &[0x08, 0x00]),
                    &["12 ", "13 "][..],
                ),
                (
                    "message cut by END_STREAM",
                    {
                        let mut m = message(&Packet::DialReq {
                            protocol: "tcp".into(),
                            address: echo.addr.to_string().into(),
                            random: 1,
                        });
                        m.truncate(m.len() - 3);
                        m
                    },
                    &["13 "][..],
                ),
            ] {
                let mut c = client(&uds).map_err(|e| gone(&mut server, case, e))?;
                open_proxy(&mut c, 1)?;
                c.write(&h2raw::data(1, &body, true))
                    .map_err(|e| e.to_string())?;
                let seen = watch(&mut c, ANSWER, |f| {
                    f.field("grpc-status").is_some() || f.rst().is_some() || f.goaway().is_some()
                });
                check(
                    seen.status(1)
                        .is_some_and(|s| codes.iter().any(|c| s.starts_with(c))),
                    || {
                        format!(
                            "{case}: expected grpc-status {codes:?}, got {}",
                            seen.describe()
                        )
                    },
                )?;
                expect_ping(case, &mut c)?;
            }

            let close_data = |id: i64| Packet::Data {
                connect_id: id,
                error: "".into(),
                data: Bytes::from_static(b"x"),
            };
            for (case, body) in [
                ("unknown packet type", bare_packet(77)),
                ("DIAL_REQ without payload", bare_packet(0)),
                ("DATA without payload", bare_packet(4)),
                (
                    "DATA for an unknown connection",
                    message(&close_data(987_654)),
                ),
                ("DATA with connectID 0", message(&close_data(0))),
                ("DATA with a negative connectID", message(&close_data(-3))),
                (
                    "CLOSE_REQ for an unknown connection",
                    message(&Packet::CloseReq {
                        connect_id: 987_654,
                    }),
                ),
            ] {
                let mut c = client(&uds).map_err(|e| gone(&mut server, case, e))?;
                open_proxy(&mut c, 1)?;
                c.write(&h2raw::data(1, &body, false))
                    .map_err(|e| e.to_string())?;
                let seen = watch(&mut c, ANSWER, |f| {
                    f.field("grpc-status").is_some() || f.rst().is_some() || f.goaway().is_some()
                });
                let closed_rsp = seen
                    .packets(1)
                    .iter()
                    .any(|p| matches!(p, Packet::CloseRsp { .. }));
                let bad_status = seen.status(1).is_some_and(|s| !s.starts_with("0 "));
                if seen.closed || !(closed_rsp || bad_status || seen.status(1).is_none()) {
                    let e = format!("got {}", seen.describe());
                    return Err(gone(&mut server, case, e));
                }
                expect_ping(case, &mut c)?;
            }
            still_serving(&server, &uds, echo.addr, fds)?;
            Ok(Measured::default())
        },
    );
}

/// `e` (a failed connect or handshake in `case`), with the server's exit
/// and the end of its log when it is gone.
fn gone(server: &mut Server, case: &str, e: String) -> String {
    if server.proc.is_running() {
        format!("{case}: {e}")
    } else {
        let tail = server.proc.log_tail(40);
        let why = tail
            .lines()
            .find(|l| l.contains("panic"))
            .unwrap_or("the process exited");
        format!("{case}: {e}; the server is gone: {why}")
    }
}

/// A CONNECT head that is `pad` bytes over a minimal one.
fn padded_connect(dest: SocketAddr, pad: usize) -> Vec<u8> {
    format!(
        "CONNECT {dest} HTTP/1.1\r\nHost: {dest}\r\nX-Pad: {}\r\n\r\n",
        "a".repeat(pad)
    )
    .into_bytes()
}

/// The status line a CONNECT client reads from `s` (or how it ended).
fn status_line(s: &mut UnixStream, limit: Duration) -> String {
    let _ = s.set_read_timeout(Some(limit));
    let mut head = Vec::new();
    let mut buf = [0u8; 256];
    while !head.windows(2).any(|w| w == b"\r\n") && head.len() < 4096 {
        match s.read(&mut buf) {
            Ok(0) => return "EOF".to_owned(),
            Ok(n) => head.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return format!("{:?}", e.kind()),
        }
    }
    let line = String::from_utf8_lossy(&head).into_owned();
    line.lines().next().unwrap_or_default().to_owned()
}

#[test]
fn row17_oversized_input() {
    run_row(
        "17",
        "Oversized input",
        "gRPC frontend: a frame header announcing 16 MiB gets GOAWAY FRAME_SIZE_ERROR on the 9-byte header alone; a 17 MiB header list (above grpc-go's 16 MiB default and konn's advertised limit) is refused with RST_STREAM, GOAWAY or a non-OK status before it is read whole; a 16 MiB gRPC message prefix ends the call with RESOURCE_EXHAUSTED (8) before the body. HTTP-CONNECT frontend: a 2 MiB request head (above Go's 1 MiB) gets 431; a head trickled at 5 B/s is closed at the header deadline (konn: --connect-header-timeout=2s, bound 2 s + 1 s; upstream's is a fixed 60 s, waited for 5 s here). Then a new dial echoes byte-exact, tables are empty and descriptors back to baseline",
        |imp, dir, pki| {
            let (mut server, _agent, echo, fds) = grpc_setup(imp, dir, pki)?;
            let uds = server.uds.clone();

            let mut c = client(&uds).map_err(|e| gone(&mut server, "16 MiB frame", e))?;
            open_proxy(&mut c, 1)?;
            let mut head = h2raw::frame(FrameType::DATA, 0, 1, &[]);
            head[..3].copy_from_slice(&[0xff, 0xff, 0xff]);
            head.extend_from_slice(&[0u8; 16]);
            c.write(&head).map_err(|e| e.to_string())?;
            expect_conn_error("16 MiB frame", c, Reason::FRAME_SIZE_ERROR)?;

            let mut c = client(&uds).map_err(|e| gone(&mut server, "17 MiB header list", e))?;
            let big = "v".repeat(17 << 20);
            let block = c.request_block(
                "POST",
                "/ProxyService/Proxy",
                &[
                    ("content-type", "application/grpc"),
                    ("te", "trailers"),
                    ("x-big", &big),
                ],
            );
            drop(big);
            let mut frames = Vec::new();
            for (i, part) in block.chunks(16_384).enumerate() {
                let last = (i + 1) * 16_384 >= block.len();
                let (ty, fl) = if i == 0 {
                    (FrameType::HEADERS, 0)
                } else {
                    (FrameType::CONTINUATION, 0)
                };
                let fl = if last { fl | flags::END_HEADERS } else { fl };
                frames.extend_from_slice(&h2raw::frame(ty, fl, 1, part));
            }
            let sent = c
                .write_until_stalled(&frames, Duration::from_secs(2))
                .unwrap_or(0);
            let seen = watch(&mut c, ANSWER, |f| {
                f.rst().is_some() || f.goaway().is_some() || f.field("grpc-status").is_some()
            });
            let refused = seen.goaway().is_some()
                || seen.rst(1).is_some()
                || seen.status(1).is_some_and(|s| !s.starts_with("0 "));
            check(refused && sent < frames.len(), || {
                format!(
                    "17 MiB header list: {} of {} bytes taken, then {}",
                    sent,
                    frames.len(),
                    seen.describe()
                )
            })?;
            drop(c);

            let mut c = client(&uds).map_err(|e| gone(&mut server, "16 MiB message", e))?;
            open_proxy(&mut c, 1)?;
            let mut m = vec![0u8, 0x01, 0x00, 0x00, 0x00];
            m.extend_from_slice(&[0u8; 64]);
            c.write(&h2raw::data(1, &m, false))
                .map_err(|e| e.to_string())?;
            let seen = watch(&mut c, ANSWER, |f| {
                f.field("grpc-status").is_some() || f.rst().is_some() || f.goaway().is_some()
            });
            check(seen.status(1).is_some_and(|s| s.starts_with("8 ")), || {
                format!(
                    "16 MiB message: expected grpc-status 8, got {}",
                    seen.describe()
                )
            })?;
            expect_ping("16 MiB message", &mut c)?;
            drop(c);
            still_serving(&server, &uds, echo.addr, fds)?;

            // The HTTP-CONNECT frontend, on a second server.
            let extra: &[&str] = match imp {
                Imp::Konn => &["--connect-header-timeout=2s"],
                Imp::Upstream => &[],
            };
            let connect = Server::start(imp, dir, pki, 0, extra);
            let mut s = UnixStream::connect(&connect.uds).map_err(|e| e.to_string())?;
            let head = padded_connect(echo.addr, 2 << 20);
            let mut w = s.try_clone().map_err(|e| e.to_string())?;
            let writer = std::thread::spawn(move || {
                let _ = w.set_write_timeout(Some(T));
                let _ = w.write_all(&head);
            });
            let line = status_line(&mut s, ANSWER);
            drop(s);
            let _ = writer.join();
            check(line.starts_with("HTTP/1.1 431"), || {
                format!("2 MiB CONNECT head: expected 431, got {line:?}")
            })?;

            let mut s = UnixStream::connect(&connect.uds).map_err(|e| e.to_string())?;
            let opened = Instant::now();
            let bound = match imp {
                Imp::Konn => Duration::from_secs(3),
                Imp::Upstream => Duration::from_secs(5),
            };
            let trickle = format!("CONNECT {} HTTP/1.1\r\nHost: x\r\n", echo.addr).into_bytes();
            let mut w = s.try_clone().map_err(|e| e.to_string())?;
            let writer = std::thread::spawn(move || {
                for b in trickle.iter().cycle().take(100) {
                    if w.write_all(&[*b]).is_err() {
                        return;
                    }
                    // The attack's pace (5 B/s), not synchronisation.
                    std::thread::sleep(Duration::from_millis(200));
                }
            });
            let line = status_line(&mut s, bound);
            let closed_after = opened.elapsed();
            let _ = s.shutdown(std::net::Shutdown::Both);
            let _ = writer.join();
            check(
                (line == "EOF" || line.starts_with("HTTP/1.1 408")) && closed_after <= bound,
                || {
                    format!(
                        "trickled CONNECT head: {line:?} after {closed_after:?} (bound {bound:?})"
                    )
                },
            )?;
            Ok(Measured {
                detection: Some(closed_after),
                note: "time: the trickled CONNECT head closed".to_owned(),
                ..Measured::default()
            })
        },
    );
}

/// A TLS client of the agent port: trusts `ca`, presents `identity`.
fn tls_client(ca: &Path, identity: Option<(PemSource, PemSource)>) -> Result<ClientTls, String> {
    let mut o = ClientTlsOptions::new(PemSource::File(ca.to_owned()), "127.0.0.1");
    o.identity = identity;
    o.build().map_err(|e| e.to_string())
}

/// The TLS error a handshake plus the HTTP/2 preface with `client` to
/// `addr` ends in (TLS 1.3: the server judges the client's certificate
/// after the client's side of the handshake completes, so the alert comes
/// with the first read).
fn tls_refusal(addr: SocketAddr, client: &ClientTls) -> String {
    let client = client.clone();
    block_on(Engine::Epoll, async move {
        let Ok(sock) = monoio::net::TcpStream::connect(addr).await else {
            return "connect failed".to_owned();
        };
        let mut tls = match TlsStream::connect(sock, &client).await {
            Ok(t) => t,
            Err(e) => return format!("{e:?}"),
        };
        let _ = tls.write_all(PREFACE).await;
        let mut buf = BytesMut::new();
        match monoio::time::timeout(ANSWER, tls.read(&mut buf)).await {
            Ok(Err(e)) => format!("{e:?}"),
            other => format!("no TLS error: {other:?}"),
        }
    })
    .unwrap_or_else(|e| format!("runtime: {e}"))
}

#[test]
fn row18_authentication_failures() {
    run_row(
        "18",
        "Authentication failures",
        "mTLS on the agent port, 10 attempts each: no client certificate gets the certificate_required alert, one from another CA unknown_ca, an expired one certificate_expired, one whose key usage is serverAuth only unsupported_certificate or bad_certificate; none registers a tunnel; the server's descriptors return to baseline and its agent still serves a dial byte-exact. (Token authentication's failures run against a real kube-apiserver in server/tests/kube_auth.rs.)",
        |imp, dir, _| {
            let pki_dir = dir.path("pki");
            let (pem, rejects) =
                konn_testkit::pki::generate_with_rejects().map_err(|e| e.to_string())?;
            let pki = konn_testkit::pki::write_pem(&pki_dir, &pem).map_err(|e| e.to_string())?;
            let stranger = konn_testkit::pki::write_pem(
                &dir.path("stranger"),
                &konn_testkit::pki::generate_named("some other CA").map_err(|e| e.to_string())?,
            )
            .map_err(|e| e.to_string())?;
            let put = |name: &str, body: &str| {
                let p = dir.path(name);
                std::fs::write(&p, body).map(|()| PemSource::File(p))
            };
            let pair = |c: &str, k: &str, (cert, key): &(String, String)| {
                Ok::<_, std::io::Error>((put(c, cert)?, put(k, key)?))
            };
            let cases = [
                ("no certificate", None, &["CertificateRequired"][..]),
                (
                    "another CA",
                    Some((
                        PemSource::File(stranger.agent_cert.clone()),
                        PemSource::File(stranger.agent_key.clone()),
                    )),
                    &["UnknownCA"][..],
                ),
                (
                    "expired",
                    Some(pair("x.crt", "x.key", &rejects.expired).map_err(|e| e.to_string())?),
                    &["CertificateExpired"][..],
                ),
                (
                    "serverAuth only",
                    Some(
                        pair("s.crt", "s.key", &rejects.server_auth_only)
                            .map_err(|e| e.to_string())?,
                    ),
                    &["UnsupportedCertificate", "BadCertificate"][..],
                ),
            ];
            let echo = Echo::start();
            let server = Server::start(imp, dir, &pki, 0, &[]);
            let _agent = Agent::start(imp, dir, &pki, "agent-a", server.agent_port);
            check(wait_until(T, || server.ready() >= 1.0), || {
                "the agent did not connect".to_owned()
            })?;
            fresh_echo(&server, echo.addr, 5)?;
            let fds = fds_of(server.proc.pid());
            let addr = at(server.agent_port);
            let start = Instant::now();
            for (case, identity, alerts) in cases {
                let client = tls_client(&pki.ca_cert, identity)?;
                for _ in 0..10 {
                    let err = tls_refusal(addr, &client);
                    check(
                        alerts
                            .iter()
                            .any(|a| err.contains(&format!("AlertReceived({a})"))),
                        || format!("{case}: expected the alert {alerts:?}, got {err}"),
                    )?;
                }
            }
            let detection = start.elapsed() / 40;
            check(server.ready() == 1.0, || {
                format!("{} tunnels registered, expected 1", server.ready())
            })?;
            server_fds_back(&server, fds)?;
            fresh_echo(&server, echo.addr, 6)?;
            Ok(Measured {
                detection: Some(detection),
                note: "time: one refused attempt, on average".to_owned(),
                ..Measured::default()
            })
        },
    );
}

#[test]
fn row19_identity_spoofing() {
    run_row(
        "19",
        "Identity spoofing",
        "Compatibility policy (both implementations; docs/AUTH.md): agent B, holding a valid certificate, claims agent A's --agent-id and is accepted as a second tunnel of that ID. During 4 transfers, SIGKILL B: every transfer delivers only correct bytes (B's are cut, A's complete), and, once they ended, within 3 s every new dial goes through A and echoes byte-exact (10 of 10); tables back to empty",
        |imp, dir, pki| {
            let echo = Echo::start();
            let server = Server::start(imp, dir, pki, 0, &[]);
            let _a = Agent::start(imp, dir, pki, "agent-a", server.agent_port);
            check(wait_until(T, || server.ready() >= 1.0), || {
                "agent A did not connect".to_owned()
            })?;
            let mut b = Agent::start(imp, dir, pki, "agent-a", server.agent_port);
            check(wait_http_ok(b.health, "/readyz", T), || {
                "agent B (A's ID) was not admitted".to_owned()
            })?;
            let flows = start_flows(&server, echo.addr, 4, 200)?;
            b.proc.kill();
            let killed = Instant::now();
            let ends: Vec<FlowEnd> = flows.into_iter().map(Flow::join).collect();
            check(ends.iter().all(|e| e.intact && e.end != End::Hung), || {
                format!(
                    "a transfer delivered wrong bytes or hung: {:?}",
                    ends.iter().map(|e| (e.end, e.intact)).collect::<Vec<_>>()
                )
            })?;
            measure(Duration::from_secs(3), "every dial through A", || {
                (0..10).all(|i| fresh_echo(&server, echo.addr, 50 + i).is_ok())
            })?;
            let recovery = killed.elapsed();
            check(wait_until(T, || server.tables_empty()), || {
                "server tables not back to empty".to_owned()
            })?;
            let complete = ends.iter().filter(|e| e.end == End::Complete).count();
            Ok(Measured {
                recovery: Some(recovery),
                note: format!("{complete} of 4 transfers were on A and completed"),
                ..Measured::default()
            })
        },
    );
}

/// A rustls client connection of `tls` (the agent's identity).
fn rustls_client(tls: &ClientTls) -> Result<rustls::ClientConnection, String> {
    rustls::ClientConnection::new(tls.config.clone(), tls.server_name.clone())
        .map_err(|e| e.to_string())
}

/// Drives `conn` over `s` until its handshake is done.
fn finish_handshake(conn: &mut rustls::ClientConnection, s: &mut TcpStream) -> Result<(), String> {
    s.set_read_timeout(Some(ANSWER))
        .map_err(|e| e.to_string())?;
    while conn.is_handshaking() {
        conn.complete_io(s).map_err(|e| format!("handshake: {e}"))?;
    }
    Ok(())
}

/// After the handshake: the HTTP/2 preface goes out and the server's first
/// frame (its SETTINGS) comes back.
fn h2_answers(conn: &mut rustls::ClientConnection, s: &mut TcpStream) -> Result<(), String> {
    use std::io::Write as _;
    let mut out = PREFACE.to_vec();
    out.extend_from_slice(&h2raw::settings(&[]));
    conn.writer().write_all(&out).map_err(|e| e.to_string())?;
    let deadline = Instant::now() + ANSWER;
    let mut got = Vec::new();
    while got.len() < 9 {
        check(Instant::now() < deadline, || {
            "no HTTP/2 frame from the server".to_owned()
        })?;
        while conn.wants_write() {
            conn.write_tls(s).map_err(|e| e.to_string())?;
        }
        match conn.read_tls(s) {
            Ok(0) => return Err("EOF before the server's SETTINGS".to_owned()),
            Ok(_) => {
                conn.process_new_packets().map_err(|e| e.to_string())?;
                let mut buf = [0u8; 4096];
                while let Ok(n) = conn.reader().read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    got.extend_from_slice(&buf[..n]);
                }
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {}
            Err(e) => return Err(e.to_string()),
        }
    }
    check(got[3] == FrameType::SETTINGS.0, || {
        format!("the server's first frame is type {}", got[3])
    })
}

/// The ClientHello of a fresh connection, re-framed as one TLS record per
/// handshake byte, each in its own write; the handshake then completes and
/// the agent port speaks HTTP/2.
fn one_byte_records(addr: SocketAddr, tls: &ClientTls) -> Result<(), String> {
    let mut conn = rustls_client(tls)?;
    let mut hello = Vec::new();
    conn.write_tls(&mut hello).map_err(|e| e.to_string())?;
    let mut s = TcpStream::connect(addr).map_err(|e| e.to_string())?;
    s.set_nodelay(true).map_err(|e| e.to_string())?;
    let mut rest = &hello[..];
    while rest.len() >= 5 {
        let len = usize::from(u16::from_be_bytes([rest[3], rest[4]]));
        let (record, tail) = rest.split_at((5 + len).min(rest.len()));
        for b in &record[5..] {
            s.write_all(&[record[0], record[1], record[2], 0, 1, *b])
                .map_err(|e| format!("1-byte record: {e}"))?;
        }
        rest = tail;
    }
    finish_handshake(&mut conn, &mut s)?;
    h2_answers(&mut conn, &mut s)
}

/// After a complete handshake, `n` KeyUpdate messages (each requesting one
/// back) as fast as they go; how the server ended it: "closed" (EOF, reset
/// or alert) within the bound, or "open" (still answering HTTP/2).
fn key_update_flood(addr: SocketAddr, tls: &ClientTls, n: usize) -> Result<&'static str, String> {
    let mut conn = rustls_client(tls)?;
    let mut s = TcpStream::connect(addr).map_err(|e| e.to_string())?;
    finish_handshake(&mut conn, &mut s)?;
    for _ in 0..n {
        if conn.refresh_traffic_keys().is_err() {
            break;
        }
        let mut wire = Vec::new();
        while conn.wants_write() {
            if conn.write_tls(&mut wire).is_err() {
                break;
            }
        }
        if s.write_all(&wire).is_err() {
            return Ok("closed");
        }
    }
    let deadline = Instant::now() + Duration::from_secs(2);
    s.set_read_timeout(Some(Duration::from_millis(100)))
        .map_err(|e| e.to_string())?;
    while Instant::now() < deadline {
        match conn.read_tls(&mut s) {
            Ok(0) => return Ok("closed"),
            Ok(_) => {
                if conn.process_new_packets().is_err() {
                    return Ok("closed");
                }
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                // Quiet: the server took them all; it must still speak HTTP/2.
                return h2_answers(&mut conn, &mut s).map(|()| "open");
            }
            Err(_) => return Ok("closed"),
        }
    }
    Err("the server neither closed nor went quiet within 2 s".to_owned())
}

#[test]
fn row22b_tls_record_edge_cases() {
    run_row(
        "22b",
        "TLS: ClientHello in 1-byte records, KeyUpdate flood",
        "On the agent port (mTLS, the agent's certificate): 5 connections send their ClientHello as one TLS record per byte, one write each: every handshake completes and the server answers the HTTP/2 preface with SETTINGS. 5 connections send 1000 KeyUpdate requests each right after the handshake: each is closed within 2 s or stays usable (answers HTTP/2); never a hang. Then the server is healthy, its agent serves a dial byte-exact and its descriptors return to baseline",
        |imp, dir, pki| {
            let echo = Echo::start();
            let server = Server::start(imp, dir, pki, 0, &[]);
            let _agent = Agent::start(imp, dir, pki, "agent", server.agent_port);
            check(wait_until(T, || server.ready() == 1.0), || {
                "agent not ready".into()
            })?;
            let baseline = fds_of(server.proc.pid());
            let tls = tls_client(
                &pki.ca_cert,
                Some((
                    PemSource::File(pki.agent_cert.clone()),
                    PemSource::File(pki.agent_key.clone()),
                )),
            )?;
            let addr = at(server.agent_port);
            let start = Instant::now();
            for i in 0..5 {
                one_byte_records(addr, &tls).map_err(|e| format!("1-byte records #{i}: {e}"))?;
            }
            let handshakes = start.elapsed() / 5;
            let mut outcomes = Vec::new();
            for i in 0..5 {
                outcomes.push(
                    key_update_flood(addr, &tls, 1000)
                        .map_err(|e| format!("KeyUpdate flood #{i}: {e}"))?,
                );
            }
            check(wait_http_ok(server.admin, "/metrics", T), || {
                "the server stopped answering".into()
            })?;
            echo_within(&server, echo.addr, T)?;
            server_fds_back(&server, baseline)?;
            Ok(Measured {
                detection: Some(handshakes),
                bytes_lost: Some(0),
                note: format!(
                    "time: one handshake in 1-byte records; KeyUpdate floods: {}",
                    outcomes.join(", ")
                ),
                ..Measured::default()
            })
        },
    );
}
