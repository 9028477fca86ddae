//! HTTP/2 attack defences, proved against the real listener: a raw-frame
//! client (`h2_support::raw`) attacks konn's test server
//! (`h2_support::server`: bare HTTP/2 or gRPC on the connection driver)
//! over TCP, under every io engine. The attacks are those of
//! reliability-security.md §1.3; each test says what it proves.
//!
//! After every attack the server must be idle again (no live connection,
//! no live handler) and the process's descriptors back to their count
//! before the server started; these tests count descriptors and so run one
//! at a time. Every wait is bounded.

mod h2_support;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::Bytes;
use h2_support::engines;
use h2_support::raw::{self, RawClient, RawFrame};
use h2_support::server::{App, ServerOpts, TestServer, Work};
use konn_core::io::runtime::Engine;
use konn_frames::h2::{FrameType, MAX_WINDOW_SIZE, PREFACE, SettingId, flags};
use konn_frames::{Reason, hpack};
use konn_protocol::h2::{Keepalive, PingPolicy};
use konn_testkit::fds::{assert_fds_back_to, open_fds, serial};

/// MAX_CONCURRENT_STREAMS of the servers under attack.
const MCS: u32 = 100;
/// Upper bound on one engine's run of any test.
const RUN_BOUND: Duration = Duration::from_secs(30);
/// How long the raw client waits for an answer.
const ANSWER: Duration = Duration::from_secs(5);
/// Socket buffer size for the tests in which the client stops reading.
const SMALL_BUFS: usize = 16 * 1024;

fn now() -> Instant {
    konn_core::io::clock::now()
}

/// Runs `attack` against a fresh server from `opts` under every engine.
/// Afterwards the server must become idle, and once it is stopped the
/// descriptors must be back to where they were.
fn under_every_engine(opts: impl Fn() -> ServerOpts, attack: impl Fn(Engine, &TestServer)) {
    let _serial = serial();
    for engine in engines() {
        let before = open_fds();
        let started = now();
        let server = TestServer::start(engine, opts());
        attack(engine, &server);
        server.wait_idle(Duration::from_secs(5));
        server.stop();
        assert_fds_back_to(before, &format!("{engine}: after the server stopped"));
        let took = now() - started;
        assert!(took < RUN_BOUND, "{engine}: took {took:?}");
    }
}

/// Bare HTTP/2 whose handlers hold each request for `delay` and ignore
/// resets (a backend that does not notice cancellation).
fn slow_backend(delay: Duration) -> ServerOpts {
    let mut o = ServerOpts::http();
    o.app = App::Http {
        body: Bytes::from_static(b"done\n"),
        work: Work::Delayed(delay),
    };
    o.h2.max_concurrent_streams = MCS;
    o
}

fn http() -> ServerOpts {
    let mut o = ServerOpts::http();
    o.h2.max_concurrent_streams = MCS;
    o
}

fn grpc() -> ServerOpts {
    let mut o = ServerOpts::grpc(1 << 20);
    o.h2.max_concurrent_streams = MCS;
    o
}

fn peak(server: &TestServer) -> usize {
    server.counters.handlers_peak.load(Ordering::SeqCst)
}

fn requests(server: &TestServer) -> u64 {
    server.counters.requests.load(Ordering::SeqCst)
}

fn body_bytes(server: &TestServer) -> u64 {
    server.counters.body_bytes.load(Ordering::SeqCst)
}

/// Writes `pairs(id)` for stream ids 1, 3, 5, … up to `count` streams in
/// batches, until the server sends GOAWAY or the connection fails. Returns
/// the GOAWAY and how long the flood ran.
fn flood_streams(
    c: &mut RawClient,
    count: u32,
    mut pairs: impl FnMut(&mut RawClient, u32) -> Vec<u8>,
) -> (raw::GoAway, Duration) {
    let started = now();
    const BATCH: u32 = 250;
    'flood: for batch in 0..count / BATCH {
        let mut buf = Vec::new();
        for i in 0..BATCH {
            let id = 2 * (batch * BATCH + i) + 1;
            buf.extend(pairs(c, id));
        }
        if c.write(&buf).is_err() {
            break; // the server closed the connection
        }
        if let Some(g) = goaway_so_far(c) {
            return (g, now() - started);
        }
        if c.written > 64 << 20 {
            break 'flood;
        }
    }
    let g = c.expect_goaway(ANSWER);
    (g, now() - started)
}

/// A GOAWAY among the frames that arrived so far (the others are dropped).
fn goaway_so_far(c: &mut RawClient) -> Option<raw::GoAway> {
    std::iter::from_fn(|| c.try_frame()).find_map(|f| f.goaway())
}

fn get_block(c: &mut RawClient) -> Vec<u8> {
    c.request_block("GET", "/", &[])
}

// ----- Rapid Reset (CVE-2023-44487) ------------------------------------------

/// 10^5 HEADERS+RST_STREAM pairs against handlers that keep working after
/// the reset: a reset stream keeps its concurrency slot until its handler
/// ends, so handler concurrency never exceeds MAX_CONCURRENT_STREAMS; each
/// pair costs a token of the remote-reset bucket (accepted stream) or the
/// local-reset bucket (refused stream), so GOAWAY ENHANCE_YOUR_CALM comes
/// after at most the two bursts plus their refill.
#[test]
fn rapid_reset_with_slow_backend() {
    under_every_engine(
        || slow_backend(Duration::from_millis(50)),
        |engine, srv| {
            let mut c = RawClient::connect(srv.addr());
            c.handshake(&[]);
            let (g, took) = flood_streams(&mut c, 100_000, |c, id| {
                let block = get_block(c);
                let mut b = raw::headers(id, &block, true);
                b.extend(raw::rst(id, Reason::CANCEL));
                b
            });
            assert_eq!(g.reason, Reason::ENHANCE_YOUR_CALM, "{engine}: {g:?}");
            let pairs = g.last_stream_id.div_ceil(2);
            // Buckets: remote (200, 50/s), local (1024, 100/s).
            let bound = 200 + 1024 + (150.0 * took.as_secs_f64()) as u32 + 1;
            assert!(
                pairs <= bound,
                "{engine}: {pairs} pairs processed before GOAWAY (bound {bound}, {took:?})"
            );
            assert!(
                peak(srv) <= MCS as usize,
                "{engine}: {} concurrent handlers with MAX_CONCURRENT_STREAMS {MCS}",
                peak(srv)
            );
            assert!(
                requests(srv) >= u64::from(MCS),
                "{engine}: the attack reached the handlers ({} requests)",
                requests(srv)
            );
            c.expect_closed(ANSWER);
            let report = srv.next_close(ANSWER).expect("close report");
            assert!(report.stats.remote_resets > 0, "{engine}: {report:?}");
            eprintln!(
                "{engine}: rapid reset: GOAWAY after {pairs} pairs in {took:?}, \
                 peak handlers {}, requests {}",
                peak(srv),
                requests(srv)
            );
        },
    );
}

/// The same flood against the gRPC handler, which ends a call as soon as
/// it learns of the reset. Within one read the handler has not yet been
/// told, so streams beyond MAX_CONCURRENT_STREAMS are refused (local
/// resets); the two buckets together bound the pairs processed.
#[test]
fn rapid_reset_against_grpc() {
    under_every_engine(grpc, |engine, srv| {
        let mut c = RawClient::connect(srv.addr());
        c.handshake(&[]);
        let (g, took) = flood_streams(&mut c, 100_000, |c, id| {
            let block = grpc_call_block(c, "/Echo/Echo");
            let mut b = raw::headers(id, &block, false);
            b.extend(raw::rst(id, Reason::CANCEL));
            b
        });
        assert_eq!(g.reason, Reason::ENHANCE_YOUR_CALM, "{engine}: {g:?}");
        let pairs = g.last_stream_id.div_ceil(2);
        let bound = 200 + 1024 + (150.0 * took.as_secs_f64()) as u32 + 1;
        c.expect_closed(ANSWER);
        let report = srv.next_close(ANSWER).expect("close report");
        assert!(
            pairs <= bound,
            "{engine}: {pairs} pairs before GOAWAY (bound {bound}, {took:?}) {g:?} {report:?}"
        );
        assert!(peak(srv) <= MCS as usize, "{engine}: peak {}", peak(srv));
        eprintln!("{engine}: rapid reset (gRPC): GOAWAY after {pairs} pairs in {took:?}");
    });
}

fn grpc_call_block(c: &mut RawClient, path: &str) -> Vec<u8> {
    c.request_block(
        "POST",
        path,
        &[("content-type", "application/grpc"), ("te", "trailers")],
    )
}

// ----- MadeYouReset (CVE-2025-8671) ------------------------------------------

/// A valid request followed by WINDOW_UPDATE(0) on its stream, in a loop:
/// each makes the server reset the stream (a stream error), which costs a
/// token of the local-reset bucket; GOAWAY ENHANCE_YOUR_CALM follows after
/// the burst plus refill, and the handlers (which keep working after the
/// reset) never exceed MAX_CONCURRENT_STREAMS.
#[test]
fn made_you_reset() {
    under_every_engine(
        || slow_backend(Duration::from_millis(50)),
        |engine, srv| {
            let mut c = RawClient::connect(srv.addr());
            c.handshake(&[]);
            let (g, took) = flood_streams(&mut c, 100_000, |c, id| {
                let block = c.request_block("POST", "/", &[]);
                let mut b = raw::headers(id, &block, false);
                b.extend(raw::window_update(id, 0));
                b
            });
            assert_eq!(g.reason, Reason::ENHANCE_YOUR_CALM, "{engine}: {g:?}");
            let pairs = g.last_stream_id.div_ceil(2);
            let bound = 1024 + (100.0 * took.as_secs_f64()) as u32 + 1;
            assert!(
                pairs <= bound,
                "{engine}: {pairs} pairs before GOAWAY (bound {bound}, {took:?})"
            );
            assert!(peak(srv) <= MCS as usize, "{engine}: peak {}", peak(srv));
            assert!(
                requests(srv) >= u64::from(MCS),
                "{engine}: requests {}",
                requests(srv)
            );
            c.expect_closed(ANSWER);
            let report = srv.next_close(ANSWER).expect("close report");
            assert!(report.stats.local_resets >= 1024, "{engine}: {report:?}");
            eprintln!("{engine}: MadeYouReset: GOAWAY after {pairs} pairs in {took:?}");
        },
    );
}

// ----- CONTINUATION flood (CVE-2023-45288 and friends) -----------------------

/// HEADERS without END_HEADERS, then up to 10^5 one-byte CONTINUATIONs:
/// GOAWAY ENHANCE_YOUR_CALM after the 17th (limit 16), before any header
/// is decoded or any handler runs.
#[test]
fn continuation_flood() {
    under_every_engine(http, |engine, srv| {
        let mut c = RawClient::connect(srv.addr());
        c.handshake(&[]);
        let block = get_block(&mut c);
        let mut first = raw::frame(FrameType::HEADERS, flags::END_STREAM, 1, &block[..1]);
        let one = raw::frame(FrameType::CONTINUATION, 0, 1, &[0xff]);
        for _ in 0..999 {
            first.extend_from_slice(&one);
        }
        let _ = c.write(&first);
        let batch: Vec<u8> = one.repeat(1000);
        let mut goaway = None;
        for _ in 0..99 {
            goaway = goaway_so_far(&mut c);
            if goaway.is_some() || c.write(&batch).is_err() {
                break;
            }
        }
        let g = goaway.unwrap_or_else(|| c.expect_goaway(ANSWER));
        assert_eq!(g.reason, Reason::ENHANCE_YOUR_CALM, "{engine}: {g:?}");
        c.expect_closed(ANSWER);
        let report = srv.next_close(ANSWER).expect("close report");
        // SETTINGS, its ACK, HEADERS, 17 CONTINUATIONs.
        assert!(
            report.stats.frames_received <= 20,
            "{engine}: {} frames processed",
            report.stats.frames_received
        );
        assert_eq!(requests(srv), 0, "{engine}: no handler ran");
    });
}

// ----- HPACK bomb (CVE-2016-6581 and friends) --------------------------------

/// A request block that inserts one 4000-byte field into the dynamic table
/// and then references it `refs` times (one byte each).
fn bomb_block(c: &mut RawClient, refs: usize) -> Vec<u8> {
    let mut block = get_block(c);
    let value = vec![b'b'; 4000];
    c.encoder.encode_field(
        hpack::Field::new(b"x-bomb", &value),
        hpack::Repr::IncrementalIndexing,
        false,
        &mut block,
    );
    // Index 62: the newest dynamic entry.
    block.extend(std::iter::repeat_n(0x80 | 62, refs));
    block
}

/// Peak resident memory since the last [`reset_peak_rss`], in KiB.
fn peak_rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Resets the peak-RSS mark (`/proc/self/clear_refs` 5); false if the
/// kernel does not allow it here.
fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// One 4 KiB entry referenced 3·10^4 times in one block (121 MB decoded):
/// the decoder stops at its work limit (1024 fields) with GOAWAY
/// ENHANCE_YOUR_CALM, after the header-list limit (64 KiB) already stopped
/// it emitting fields: the process's peak memory does not grow by the
/// decoded size.
#[test]
fn hpack_bomb_is_refused_before_allocation() {
    under_every_engine(http, |engine, srv| {
        let mut c = RawClient::connect(srv.addr());
        c.handshake(&[]);
        let block = bomb_block(&mut c, 30_000);
        let measured = reset_peak_rss();
        let base = peak_rss_kib();
        c.write(&raw::headers(1, &block, true)).expect("write bomb");
        let g = c.expect_goaway(ANSWER);
        assert_eq!(g.reason, Reason::ENHANCE_YOUR_CALM, "{engine}: {g:?}");
        if let (true, Some(base), Some(peak)) = (measured, base, peak_rss_kib()) {
            let grown = peak.saturating_sub(base);
            assert!(
                grown < 32 * 1024,
                "{engine}: peak RSS grew by {grown} KiB (the bomb decodes to ~118 000 KiB)"
            );
        } else {
            eprintln!("note: peak RSS cannot be reset here; memory not measured");
        }
        assert_eq!(requests(srv), 0, "{engine}: no handler ran");
        c.expect_closed(ANSWER);
    });
}

/// A smaller bomb (1000 references, 4 MB decoded, within the field limit)
/// passes SETTINGS_MAX_HEADER_LIST_SIZE: only its stream is reset, no
/// handler runs, and the connection stays usable: the next request, which
/// refers to the dynamic table the bomb changed, is answered (HPACK state
/// stayed in step).
#[test]
fn hpack_bomb_within_field_limit_resets_only_its_stream() {
    under_every_engine(http, |engine, srv| {
        let mut c = RawClient::connect(srv.addr());
        c.handshake(&[]);
        let block = bomb_block(&mut c, 1000);
        c.write(&raw::headers(1, &block, true)).expect("write bomb");
        let f = next_on_stream(&mut c, 1);
        assert_eq!(f.rst(), Some(Reason::PROTOCOL_ERROR), "{engine}: {f:?}");
        assert_eq!(requests(srv), 0, "{engine}: no handler ran");
        // Indexed reference to the bomb entry, now index 62 on both sides.
        let mut block = get_block(&mut c);
        block.push(0x80 | 62);
        c.write(&raw::headers(3, &block, true)).expect("write");
        assert_response_ok(&mut c, 3, engine);
    });
}

/// The next frame on stream `id`, skipping others.
fn next_on_stream(c: &mut RawClient, id: u32) -> RawFrame {
    let deadline = now() + ANSWER;
    loop {
        let left = deadline.saturating_duration_since(now());
        let f = c
            .next_frame(left)
            .unwrap_or_else(|| panic!("nothing on stream {id}"));
        assert!(f.goaway().is_none(), "GOAWAY while waiting: {f:?}");
        if f.head.stream_id == id {
            return f;
        }
    }
}

/// Expects `:status 200` and a non-empty body ending the stream.
fn assert_response_ok(c: &mut RawClient, id: u32, engine: Engine) {
    let h = next_on_stream(c, id);
    assert_eq!(h.ty(), FrameType::HEADERS, "{engine}: {h:?}");
    assert_eq!(h.field(":status"), Some("200"), "{engine}: {h:?}");
    let mut body = Vec::new();
    loop {
        let f = next_on_stream(c, id);
        assert_eq!(f.ty(), FrameType::DATA, "{engine}: {f:?}");
        body.extend_from_slice(&f.payload);
        if f.head.has(flags::END_STREAM) {
            break;
        }
    }
    assert!(!body.is_empty(), "{engine}: empty body");
}

// ----- SETTINGS and PING floods (CVE-2019-9515, CVE-2019-9512) ---------------

/// Floods `frame` at the server while never reading: the server must stop
/// reading (the client's writes stall after a bounded number of bytes,
/// although it offers 64 MiB), and once its own writes make no progress
/// for the write timeout it closes the connection.
fn flood_without_reading(engine: Engine, srv: &TestServer, frame: &[u8], write_timeout: Duration) {
    let mut c = RawClient::connect_silent(srv.addr(), SMALL_BUFS);
    let mut hello = PREFACE.to_vec();
    hello.extend(raw::settings(&[]));
    hello.extend(raw::frame(FrameType::SETTINGS, flags::ACK, 0, &[]));
    c.write(&hello).expect("preface");
    let chunk = frame.repeat(64 * 1024 / frame.len());
    let offered: u64 = 64 << 20;
    let mut stalled_at = None;
    while c.written < offered {
        let n = c
            .write_until_stalled(&chunk, Duration::from_millis(150))
            .unwrap_or_else(|e| panic!("{engine}: write failed before stalling: {e}"));
        if n < chunk.len() {
            stalled_at = Some(now());
            break;
        }
    }
    let stalled_at = stalled_at.unwrap_or_else(|| {
        panic!("{engine}: the server read all {offered} bytes of the flood without ever stopping")
    });
    let written = c.written;
    assert!(
        written < 2 << 20,
        "{engine}: {written} bytes accepted before the server stopped reading"
    );
    let report = srv
        .next_close(write_timeout + ANSWER)
        .expect("server closed the connection");
    let closed_after = now() - stalled_at;
    assert!(
        report
            .error
            .as_deref()
            .is_some_and(|e| e.contains("write timed out")),
        "{engine}: {report:?}"
    );
    assert!(
        closed_after <= write_timeout + Duration::from_secs(2),
        "{engine}: closed {closed_after:?} after the stall"
    );
    let frames = report.stats.frames_received;
    assert!(
        frames <= written / frame.len() as u64 + 3,
        "{engine}: {frames} frames"
    );
    c.expect_closed(ANSWER);
    eprintln!(
        "{engine}: flood of {}-byte frames stalled after {written} bytes, {frames} frames \
         processed; closed {closed_after:?} later",
        frame.len()
    );
}

fn flood_opts(write_timeout: Duration) -> ServerOpts {
    let mut o = http();
    o.driver.write_timeout = write_timeout;
    o.socket_buffers = Some(SMALL_BUFS);
    o
}

/// SETTINGS flood from a client that never reads: the server keeps at most
/// `max_pending_control` ACKs queued, then stops reading; its memory is
/// bounded by the socket buffers; the write timeout ends the connection.
#[test]
fn settings_flood_without_reading() {
    let wt = Duration::from_secs(1);
    under_every_engine(
        || flood_opts(wt),
        |engine, srv| {
            let frame = raw::settings(&[(SettingId::MAX_CONCURRENT_STREAMS, 10)]);
            flood_without_reading(engine, srv, &frame, wt);
        },
    );
}

/// PING flood from a client that never reads: as for SETTINGS.
#[test]
fn ping_flood_without_reading() {
    let wt = Duration::from_secs(1);
    under_every_engine(
        || flood_opts(wt),
        |engine, srv| flood_without_reading(engine, srv, &raw::ping(*b"flooding"), wt),
    );
}

/// A 1 ms PING loop against a gRPC server with upstream's agent-port
/// policy (30 s minimum, 2 strikes) gets GOAWAY ENHANCE_YOUR_CALM
/// `too_many_pings` at the fourth PING.
#[test]
fn ping_loop_gets_too_many_pings() {
    under_every_engine(
        || {
            let mut o = grpc();
            o.h2.ping_policy = Some(PingPolicy::UPSTREAM_AGENT_PORT);
            o
        },
        |engine, srv| {
            let mut c = RawClient::connect(srv.addr());
            c.handshake(&[]);
            let mut goaway = None;
            for i in 0u64..1000 {
                if c.write(&raw::ping(i.to_be_bytes())).is_err() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(1));
                goaway = goaway_so_far(&mut c);
                if goaway.is_some() {
                    break;
                }
            }
            let g = goaway.unwrap_or_else(|| c.expect_goaway(ANSWER));
            assert_eq!(g.reason, Reason::ENHANCE_YOUR_CALM, "{engine}: {g:?}");
            assert_eq!(g.debug, "too_many_pings", "{engine}");
            c.expect_closed(ANSWER);
            let report = srv.next_close(ANSWER).expect("close report");
            assert_eq!(report.stats.pings_received, 4, "{engine}: {report:?}");
        },
    );
}

// ----- empty frames (CVE-2019-9518) ------------------------------------------

/// Up to 10^6 empty DATA frames on an open request: GOAWAY
/// ENHANCE_YOUR_CALM after 100 (h2's limit), none reach the handler.
#[test]
fn empty_data_flood() {
    under_every_engine(http, |engine, srv| {
        let mut c = RawClient::connect(srv.addr());
        c.handshake(&[]);
        let block = c.request_block("POST", "/", &[]);
        c.write(&raw::headers(1, &block, false)).expect("request");
        let batch = raw::data(1, &[], false).repeat(10_000);
        let mut goaway = None;
        for _ in 0..100 {
            goaway = goaway_so_far(&mut c);
            if goaway.is_some() || c.write(&batch).is_err() {
                break;
            }
        }
        let g = goaway.unwrap_or_else(|| c.expect_goaway(ANSWER));
        assert_eq!(g.reason, Reason::ENHANCE_YOUR_CALM, "{engine}: {g:?}");
        c.expect_closed(ANSWER);
        let report = srv.next_close(ANSWER).expect("close report");
        // SETTINGS, ACK, HEADERS, 101 empty DATA.
        assert!(
            report.stats.frames_received <= 104,
            "{engine}: {} frames",
            report.stats.frames_received
        );
        assert_eq!(body_bytes(srv), 0);
    });
}

// ----- slow reader and zero window (CVE-2019-9517, CVE-2016-1546) ------------

/// A client opens wide flow-control windows, asks for 16 MiB responses on
/// 20 streams, and never reads its socket: the server's writes stall and
/// the driver's write timeout closes the connection.
#[test]
fn slow_reader_is_closed_after_write_timeout() {
    let wt = Duration::from_millis(500);
    under_every_engine(
        || {
            let mut o = flood_opts(wt);
            o.app = App::Http {
                body: Bytes::from(vec![b'x'; 16 << 20]),
                work: Work::Immediate,
            };
            o
        },
        |engine, srv| {
            let mut c = RawClient::connect_silent(srv.addr(), SMALL_BUFS);
            let mut b = PREFACE.to_vec();
            b.extend(raw::settings(&[(
                SettingId::INITIAL_WINDOW_SIZE,
                MAX_WINDOW_SIZE,
            )]));
            b.extend(raw::window_update(0, MAX_WINDOW_SIZE - 65_535));
            for id in (1..40).step_by(2) {
                let block = get_block(&mut c);
                b.extend(raw::headers(id, &block, true));
            }
            let asked = now();
            c.write(&b).expect("requests");
            let report = srv.next_close(wt + ANSWER).expect("server closed");
            let took = now() - asked;
            assert!(
                report
                    .error
                    .as_deref()
                    .is_some_and(|e| e.contains("write timed out")),
                "{engine}: {report:?}"
            );
            assert!(
                took <= wt + Duration::from_secs(2),
                "{engine}: closed after {took:?}"
            );
            assert_eq!(requests(srv), 20, "{engine}");
            c.expect_closed(ANSWER);
        },
    );
}

/// A client sets SETTINGS_INITIAL_WINDOW_SIZE to 0 and asks for 1 MiB
/// responses: the server sends the response heads but not one DATA byte
/// (flow control holds), and since the client answers nothing, keepalive
/// ends the connection. A zero *stream* window is back-pressure, not a
/// stalled socket: the write timeout does not apply (docs/design/h2.md).
#[test]
fn zero_window_peer_gets_no_data_and_is_ended_by_keepalive() {
    let ka = Keepalive {
        interval: Duration::from_millis(300),
        timeout: Duration::from_millis(300),
        permit_without_stream: true,
    };
    under_every_engine(
        || {
            let mut o = http();
            o.app = App::Http {
                body: Bytes::from(vec![b'x'; 1 << 20]),
                work: Work::Immediate,
            };
            o.h2.keepalive = Some(ka);
            o
        },
        |engine, srv| {
            let mut c = RawClient::connect(srv.addr());
            c.handshake(&[(SettingId::INITIAL_WINDOW_SIZE, 0)]);
            let mut b = Vec::new();
            for id in (1..40).step_by(2) {
                let block = get_block(&mut c);
                b.extend(raw::headers(id, &block, true));
            }
            let asked = now();
            c.write(&b).expect("requests");
            let seen = c.expect_closed(Duration::from_secs(5));
            let took = now() - asked;
            let heads = seen.iter().filter(|f| f.ty() == FrameType::HEADERS).count();
            let data: usize = seen
                .iter()
                .filter(|f| f.ty() == FrameType::DATA)
                .map(|f| f.payload.len())
                .sum();
            assert_eq!(heads, 20, "{engine}: response heads");
            assert_eq!(data, 0, "{engine}: DATA sent into a zero window");
            assert!(
                seen.iter().any(|f| f.ty() == FrameType::PING),
                "{engine}: keepalive PING"
            );
            assert!(
                took <= ka.interval + ka.timeout + Duration::from_secs(2),
                "{engine}: closed after {took:?}"
            );
            let report = srv.next_close(ANSWER).expect("close report");
            assert!(
                report
                    .error
                    .as_deref()
                    .is_some_and(|e| e.contains("keepalive")),
                "{engine}: {report:?}"
            );
        },
    );
}

// ----- frame and message sizes -------------------------------------------------

/// A DATA frame header announcing 16 MiB − 1 bytes is refused from its
/// 9 bytes alone: GOAWAY FRAME_SIZE_ERROR arrives although no payload byte
/// was sent, and a later trickle finds the connection closed.
#[test]
fn oversized_frame_header_is_rejected_from_the_header() {
    under_every_engine(http, |engine, srv| {
        let mut c = RawClient::connect(srv.addr());
        c.handshake(&[]);
        let block = c.request_block("POST", "/", &[]);
        c.write(&raw::headers(1, &block, false)).expect("request");
        // Length 0xFFFFFF, DATA, no flags, stream 1.
        c.write(&[0xff, 0xff, 0xff, 0x0, 0x0, 0, 0, 0, 1])
            .expect("frame header");
        let g = c.expect_goaway(ANSWER);
        assert_eq!(g.reason, Reason::FRAME_SIZE_ERROR, "{engine}: {g:?}");
        for _ in 0..20 {
            if c.write(b"x").is_err() {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        c.expect_closed(ANSWER);
        assert_eq!(body_bytes(srv), 0);
    });
}

/// A gRPC message whose 5-byte prefix announces 64 MiB (limit 1 MiB) ends
/// the call with RESOURCE_EXHAUSTED from the prefix alone (only 16 bytes of
/// it are ever sent); the connection stays usable for the next call.
#[test]
fn oversized_grpc_message_is_resource_exhausted() {
    under_every_engine(grpc, |engine, srv| {
        let mut c = RawClient::connect(srv.addr());
        c.handshake(&[]);
        let block = grpc_call_block(&mut c, "/Echo/Echo");
        let mut b = raw::headers(1, &block, false);
        let mut msg = vec![0u8];
        msg.extend_from_slice(&(64u32 << 20).to_be_bytes());
        msg.extend_from_slice(&[7; 16]);
        b.extend(raw::data(1, &msg, false));
        c.write(&b).expect("call");
        let status = grpc_status(&mut c, 1, engine);
        assert_eq!(status, "8", "{engine}: RESOURCE_EXHAUSTED");
        assert_eq!(body_bytes(srv), 0, "{engine}: nothing delivered");
        // The next call on the same connection is echoed.
        let block = grpc_call_block(&mut c, "/Echo/Echo");
        let mut b = raw::headers(3, &block, false);
        b.extend(raw::data(3, &[0, 0, 0, 0, 2, b'h', b'i'], true));
        c.write(&b).expect("call");
        assert_eq!(grpc_status(&mut c, 3, engine), "0", "{engine}: OK");
        assert_eq!(body_bytes(srv), 2, "{engine}: the echoed message");
    });
}

/// Reads stream `id` until the frame carrying `grpc-status`; returns it.
fn grpc_status(c: &mut RawClient, id: u32, engine: Engine) -> String {
    loop {
        let f = next_on_stream(c, id);
        assert!(f.rst().is_none(), "{engine}: reset before a status: {f:?}");
        if let Some(s) = f.field("grpc-status") {
            return s.to_owned();
        }
    }
}

/// A request whose decoded header list (9 fields of 1000 bytes) exceeds
/// SETTINGS_MAX_HEADER_LIST_SIZE (8 KiB here) is reset with PROTOCOL_ERROR
/// without reaching a handler; the connection, and its HPACK state (the
/// next request refers to a table entry the refused one added), stay good.
#[test]
fn header_list_limit() {
    under_every_engine(
        || {
            let mut o = http();
            o.h2.max_header_list_size = 8 * 1024;
            o
        },
        |engine, srv| {
            let mut c = RawClient::connect(srv.addr());
            c.handshake(&[]);
            let big = "v".repeat(1000);
            let names: Vec<String> = (0..9).map(|i| format!("x-field-{i}")).collect();
            let extra: Vec<(&str, &str)> =
                names.iter().map(|n| (n.as_str(), big.as_str())).collect();
            let block = c.request_block("GET", "/", &extra);
            c.write(&raw::headers(1, &block, true)).expect("request");
            let f = next_on_stream(&mut c, 1);
            assert_eq!(f.rst(), Some(Reason::PROTOCOL_ERROR), "{engine}: {f:?}");
            assert_eq!(requests(srv), 0, "{engine}: no handler ran");
            let block = c.request_block("GET", "/", &extra[8..]);
            c.write(&raw::headers(3, &block, true)).expect("request");
            assert_response_ok(&mut c, 3, engine);
            assert_eq!(requests(srv), 1, "{engine}");
        },
    );
}

// ----- PRIORITY and the peer's header-list limit -------------------------------

/// 10^5 PRIORITY frames reshuffling a dependency tree (CVE-2019-9513):
/// konn keeps no priority tree (RFC 9113 deprecates it), so they cost a
/// frame decode each, create no state, and the next request is answered.
#[test]
fn priority_flood_is_ignored() {
    under_every_engine(http, |engine, srv| {
        let mut c = RawClient::connect(srv.addr());
        c.handshake(&[]);
        let started = now();
        for batch in 0..100u32 {
            let mut b = Vec::new();
            for i in 0..1000u32 {
                let id = 2 * (batch * 1000 + i) + 3;
                // Depend on the previous stream, exclusively, weight 255.
                let dep = (id - 2) | 0x8000_0000;
                let mut p = dep.to_be_bytes().to_vec();
                p.push(255);
                b.extend(raw::frame(FrameType::PRIORITY, 0, id, &p));
            }
            c.write(&b).expect("PRIORITY batch");
        }
        let id = 2 * 100_000 + 3;
        let block = get_block(&mut c);
        c.write(&raw::headers(id, &block, true)).expect("request");
        assert_response_ok(&mut c, id, engine);
        let took = now() - started;
        assert!(took < Duration::from_secs(10), "{engine}: took {took:?}");
        drop(c);
        let report = srv.next_close(ANSWER).expect("close report");
        assert!(
            report.stats.frames_received >= 100_000,
            "{engine}: {report:?}"
        );
        assert_eq!(report.stats.streams, 0, "{engine}: no stream state kept");
    });
}

/// A client advertising SETTINGS_MAX_HEADER_LIST_SIZE = 1 (Netty
/// CVE-2026-50560): konn treats the peer's limit as advisory and answers
/// normally instead of resetting every response.
#[test]
fn tiny_peer_header_list_size_is_advisory() {
    under_every_engine(http, |engine, srv| {
        let mut c = RawClient::connect(srv.addr());
        c.handshake(&[(SettingId::MAX_HEADER_LIST_SIZE, 1)]);
        for id in [1, 3, 5] {
            let block = get_block(&mut c);
            c.write(&raw::headers(id, &block, true)).expect("request");
            assert_response_ok(&mut c, id, engine);
        }
        assert_eq!(requests(srv), 3, "{engine}");
    });
}
