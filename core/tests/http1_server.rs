//! The HTTP/1.1 server on real sockets (127.0.0.1:0) under every io engine:
//! routing, keep-alive and pipelining, HEAD, 404/405, HTTP/1.0, bodies,
//! oversized heads, the header and idle timeouts (slowloris), the
//! connection cap, garbage input, stopping, and descriptor leaks.

use std::{net::SocketAddr, rc::Rc, time::Duration};

use konn_core::{
    Error,
    http1::{Config, Response, Router, ServeStats, serve},
    io::{
        listen::{bind_tcp, tcp_into_monoio},
        runtime::{Engine, StopToken, Stopper, run_on_each_engine},
    },
};
use konn_testkit::fds::{assert_fds_back_to, open_fds, serial};
use monoio::{
    io::{AsyncReadRent, AsyncWriteRent, AsyncWriteRentExt},
    net::TcpStream,
    task::JoinHandle,
    time::Instant,
};

const WAIT: Duration = Duration::from_secs(20);

fn router() -> Router {
    Router::new()
        .route("/healthz", |_| Response::text(200, "ok"))
        .route("/echo", |req| {
            Response::text(
                200,
                format!(
                    "path={} query={:?} verbose={} host={}",
                    req.path(),
                    req.query(),
                    req.query_has("verbose"),
                    req.host()
                ),
            )
        })
        .route("/big", |_| Response::text(200, vec![b'x'; 200 * 1024]))
}

struct Server {
    addr: SocketAddr,
    stopper: Stopper,
    token: StopToken,
    task: JoinHandle<Result<ServeStats, Error>>,
}

fn start(config: Config) -> Server {
    let listener = bind_tcp("127.0.0.1:0".parse().unwrap(), 128, false).unwrap();
    let addr = listener.local_addr().unwrap();
    let listener = tcp_into_monoio(listener).unwrap();
    let stopper = Stopper::new();
    let token = stopper.token();
    let task = monoio::spawn({
        let token = token.clone();
        async move { serve(&listener, &token, Rc::new(router()), Rc::new(config)).await }
    });
    Server {
        addr,
        stopper,
        token,
        task,
    }
}

impl Server {
    async fn finish(self) -> ServeStats {
        self.stopper.stop();
        let stats = monoio::time::timeout(WAIT, self.task)
            .await
            .expect("serve ends after stop")
            .expect("no accept error");
        self.token.close().await;
        stats
    }
}

/// A test client that can read pipelined responses.
struct Client {
    stream: TcpStream,
    buf: Vec<u8>,
}

impl Client {
    async fn connect(addr: SocketAddr) -> Self {
        Self {
            stream: TcpStream::connect(addr).await.unwrap(),
            buf: Vec::new(),
        }
    }

    async fn send(&mut self, bytes: &[u8]) {
        let (res, _) = self.stream.write_all(bytes.to_vec()).await;
        res.unwrap();
    }

    /// Reads more bytes; false at end of stream (or a reset).
    async fn fill(&mut self) -> bool {
        let chunk = Vec::with_capacity(64 * 1024);
        let (res, chunk) = monoio::time::timeout(WAIT, self.stream.read(chunk))
            .await
            .expect("read within the test deadline");
        match res {
            Ok(0) | Err(_) => false,
            Ok(_) => {
                self.buf.extend_from_slice(&chunk);
                true
            }
        }
    }

    /// One response: the head (as text) and the body; the body length
    /// comes from `Content-Length` (none for answers to HEAD).
    async fn response(&mut self, head_request: bool) -> (String, Vec<u8>) {
        let head_len = loop {
            if let Some(i) = self.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            assert!(
                self.fill().await,
                "connection closed before a response head"
            );
        };
        let head = String::from_utf8(self.buf.drain(..head_len).collect()).unwrap();
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("Content-Length: "))
            .map_or(0, |v| v.parse().unwrap());
        let length = if head_request { 0 } else { length };
        while self.buf.len() < length {
            assert!(self.fill().await, "connection closed inside a body");
        }
        let body = self.buf.drain(..length).collect();
        (head, body)
    }

    /// Everything until the server closes.
    async fn rest(&mut self) -> Vec<u8> {
        while self.fill().await {}
        std::mem::take(&mut self.buf)
    }

    /// Whether the server closed (end of stream) within `within`.
    async fn closed_within(&mut self, within: Duration) -> bool {
        let chunk = Vec::with_capacity(1024);
        match monoio::time::timeout(within, self.stream.read(chunk)).await {
            Ok((Ok(0) | Err(_), _)) => true,
            Ok((Ok(_), chunk)) => panic!("unexpected bytes {:?}", String::from_utf8_lossy(&chunk)),
            Err(_) => false,
        }
    }
}

fn status(head: &str) -> &str {
    head.split(' ').nth(1).unwrap()
}

fn field<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(": "))
}

#[test]
fn routing_keep_alive_pipelining_and_head() {
    let _serial = serial();
    let baseline = open_fds();
    run_on_each_engine(|engine| async move {
        let server = start(Config::default());
        let mut c = Client::connect(server.addr).await;
        // Five pipelined requests in one write.
        c.send(
            b"GET /healthz HTTP/1.1\r\nHost: a\r\n\r\n\
              HEAD /healthz HTTP/1.1\r\nHost: a\r\n\r\n\
              GET /nope HTTP/1.1\r\nHost: a\r\n\r\n\
              POST /healthz HTTP/1.1\r\nHost: a\r\n\r\n\
              GET /ech%6f?a=1&verbose HTTP/1.1\r\nHost: h:9\r\n\r\n",
        )
        .await;
        let (head, body) = c.response(false).await;
        assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{engine}: {head}");
        assert_eq!(
            field(&head, "Content-Type"),
            Some("text/plain; charset=utf-8")
        );
        assert_eq!(field(&head, "Content-Length"), Some("2"));
        assert_eq!(field(&head, "Date").map(str::len), Some(29));
        assert_eq!(field(&head, "Connection"), None);
        assert_eq!(body, b"ok");
        let (head, body) = c.response(true).await;
        assert_eq!(status(&head), "200");
        assert_eq!(
            field(&head, "Content-Length"),
            Some("2"),
            "HEAD keeps the length"
        );
        assert!(body.is_empty());
        let (head, body) = c.response(false).await;
        assert_eq!(status(&head), "404");
        assert_eq!(field(&head, "X-Content-Type-Options"), Some("nosniff"));
        assert_eq!(body, b"404 page not found\n");
        let (head, _) = c.response(false).await;
        assert_eq!(status(&head), "405");
        assert_eq!(field(&head, "Allow"), Some("GET, HEAD"));
        let (_, body) = c.response(false).await;
        assert_eq!(
            String::from_utf8(body).unwrap(),
            "path=/echo query=Some(\"a=1&verbose\") verbose=true host=h:9"
        );
        // A large body on the same connection, then a polite close.
        c.send(b"GET /big HTTP/1.1\r\nHost: a\r\n\r\n").await;
        let (head, body) = c.response(false).await;
        assert_eq!(status(&head), "200");
        assert_eq!(body.len(), 200 * 1024);
        c.send(b"GET /healthz HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
            .await;
        let (head, body) = c.response(false).await;
        assert_eq!(field(&head, "Connection"), Some("close"));
        assert_eq!(body, b"ok");
        assert!(c.rest().await.is_empty(), "the server closes");
        let stats = server.finish().await;
        assert_eq!(stats.accept.accepted, 1);
    });
    assert_fds_back_to(baseline, "descriptors");
}

#[test]
fn http10_requests() {
    let _serial = serial();
    run_on_each_engine(|_engine| async move {
        let server = start(Config::default());
        // HTTP/1.0 closes by default; no Host needed.
        let mut c = Client::connect(server.addr).await;
        c.send(b"GET /healthz HTTP/1.0\r\n\r\n").await;
        let rest = c.rest().await;
        let text = String::from_utf8(rest).unwrap();
        assert!(text.starts_with("HTTP/1.0 200 OK\r\n"), "{text}");
        assert!(text.ends_with("\r\n\r\nok"));
        assert!(!text.contains("Connection:"));
        // Unless it asks to keep the connection.
        let mut c = Client::connect(server.addr).await;
        c.send(b"GET /echo HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
            .await;
        let (head, body) = c.response(false).await;
        assert_eq!(field(&head, "Connection"), Some("keep-alive"));
        assert!(body.ends_with(b"host="));
        c.send(b"GET /healthz HTTP/1.0\r\n\r\n").await;
        let (_, body) = c.response(false).await;
        assert_eq!(body, b"ok");
        assert!(c.rest().await.is_empty());
        server.finish().await;
    });
}

#[test]
fn refused_heads_get_go_answers() {
    let _serial = serial();
    run_on_each_engine(|_engine| async move {
        let server = start(Config {
            max_header_bytes: 1024,
            ..Config::default()
        });
        let cases: [(&[u8], &[u8]); 5] = [
            (
                b"GET /healthz HTTP/1.1\r\n\r\n",
                b"HTTP/1.1 400 Bad Request: missing required Host header\r\n\
Content-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n\
400 Bad Request: missing required Host header",
            ),
            (
                b"GET /healthz HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
                b"HTTP/1.1 400 Bad Request: too many Host headers\r\n\
Content-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n\
400 Bad Request: too many Host headers",
            ),
            (
                b"GARBAGE\r\n\r\n",
                b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\n\
Connection: close\r\n\r\n400 Bad Request",
            ),
            (
                // A TLS ClientHello start is refused without waiting for more.
                &[
                    0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03, 0x03,
                ],
                b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\n\
Connection: close\r\n\r\n400 Bad Request",
            ),
            (
                b"GET /healthz HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip\r\n\r\n",
                b"HTTP/1.1 501 Not Implemented\r\nContent-Type: text/plain; charset=utf-8\r\n\
Connection: close\r\n\r\nUnsupported transfer encoding",
            ),
        ];
        for (request, answer) in cases {
            let mut c = Client::connect(server.addr).await;
            c.send(request).await;
            assert_eq!(
                String::from_utf8_lossy(&c.rest().await),
                String::from_utf8_lossy(answer)
            );
        }
        // The head limit is max_header_bytes + 4096, as in Go.
        let limit = 1024 + 4096;
        let head_of = |len: usize| {
            let mut head = b"GET /healthz HTTP/1.1\r\nHost: a\r\nX: ".to_vec();
            let pad = len - head.len() - 4;
            head.extend(std::iter::repeat_n(b'a', pad));
            head.extend_from_slice(b"\r\n\r\n");
            assert_eq!(head.len(), len);
            head
        };
        let mut c = Client::connect(server.addr).await;
        c.send(&head_of(limit)).await;
        let (head, body) = c.response(false).await;
        assert_eq!((status(&head), &body[..]), ("200", &b"ok"[..]));
        let mut c = Client::connect(server.addr).await;
        c.send(&head_of(limit + 1)).await;
        assert_eq!(
            String::from_utf8_lossy(&c.rest().await),
            "HTTP/1.1 431 Request Header Fields Too Large\r\nContent-Type: text/plain; \
             charset=utf-8\r\nConnection: close\r\n\r\n431 Request Header Fields Too Large"
        );
        // An endless header line is cut off at the limit, not buffered.
        let mut c = Client::connect(server.addr).await;
        c.send(b"GET / HTTP/1.1\r\nX: ").await;
        let mut sent = 0;
        let mut refused = false;
        while sent < 64 * 1024 {
            let (res, _) = c.stream.write_all(vec![b'a'; 4096]).await;
            if res.is_err() {
                refused = true;
                break;
            }
            sent += 4096;
        }
        let rest = c.rest().await;
        assert!(
            refused || rest.starts_with(b"HTTP/1.1 431 "),
            "{:?}",
            String::from_utf8_lossy(&rest)
        );
        server.finish().await;
    });
}

#[test]
fn bodies_are_skipped_or_close_the_connection() {
    let _serial = serial();
    run_on_each_engine(|_engine| async move {
        let server = start(Config::default());
        let mut c = Client::connect(server.addr).await;
        // A small body, split over two writes, then a pipelined request.
        c.send(b"GET /healthz HTTP/1.1\r\nHost: a\r\nContent-Length: 10\r\n\r\nabc")
            .await;
        let (head, _) = c.response(false).await;
        assert_eq!(field(&head, "Connection"), None);
        monoio::time::sleep(Duration::from_millis(20)).await;
        c.send(b"defghijGET /echo HTTP/1.1\r\nHost: b\r\n\r\n")
            .await;
        let (_, body) = c.response(false).await;
        assert!(body.ends_with(b"host=b"), "{body:?}");
        // A large body is not read: the connection closes after the answer.
        c.send(b"GET /healthz HTTP/1.1\r\nHost: a\r\nContent-Length: 1000000\r\n\r\nxyz")
            .await;
        let (head, _) = c.response(false).await;
        assert_eq!(field(&head, "Connection"), Some("close"));
        assert!(c.rest().await.is_empty());
        // So does a chunked one.
        let mut c = Client::connect(server.addr).await;
        c.send(b"GET /healthz HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n")
            .await;
        let (head, body) = c.response(false).await;
        assert_eq!(field(&head, "Connection"), Some("close"));
        assert_eq!(body, b"ok");
        assert!(c.rest().await.is_empty());
        server.finish().await;
    });
}

#[test]
fn slow_and_idle_clients_are_cut_off() {
    let _serial = serial();
    run_on_each_engine(|engine| async move {
        let timeout = Duration::from_millis(300);
        let server = start(Config {
            read_header_timeout: timeout,
            idle_timeout: timeout,
            ..Config::default()
        });
        // Slowloris: one header byte every 50 ms never completes the head.
        let mut c = Client::connect(server.addr).await;
        let begin = Instant::now();
        c.send(b"GET /healthz HTTP/1.1\r\nHost: a\r\nX-Slow: ")
            .await;
        let mut closed_after = None;
        for _ in 0..100 {
            let (res, _) = c.stream.write_all(b"a".to_vec()).await;
            if res.is_err() || c.closed_within(Duration::from_millis(50)).await {
                closed_after = Some(begin.elapsed());
                break;
            }
        }
        let closed_after = closed_after.expect("slow client disconnected");
        assert!(
            closed_after >= timeout - Duration::from_millis(20)
                && closed_after < Duration::from_secs(3),
            "{engine}: closed after {closed_after:?}"
        );
        // A connection that sends nothing is closed after the same time.
        let mut c = Client::connect(server.addr).await;
        let begin = Instant::now();
        assert!(c.closed_within(Duration::from_secs(5)).await);
        assert!(begin.elapsed() >= timeout - Duration::from_millis(20));
        // An idle keep-alive connection is closed after the idle timeout.
        let mut c = Client::connect(server.addr).await;
        c.send(b"GET /healthz HTTP/1.1\r\nHost: a\r\n\r\n").await;
        c.response(false).await;
        let begin = Instant::now();
        assert!(c.closed_within(Duration::from_secs(5)).await);
        assert!(begin.elapsed() >= timeout - Duration::from_millis(20));
        // A request whose head trickles in within the timeout is served.
        let mut c = Client::connect(server.addr).await;
        for part in [
            &b"GET /hea"[..],
            b"lthz HTTP/1.1\r",
            b"\nHost: a\r\n",
            b"\r\n",
        ] {
            c.send(part).await;
            monoio::time::sleep(Duration::from_millis(30)).await;
        }
        let (_, body) = c.response(false).await;
        assert_eq!(body, b"ok");
        server.finish().await;
    });
}

#[test]
fn connection_cap_and_stop_with_open_connections() {
    let _serial = serial();
    let baseline = open_fds();
    run_on_each_engine(|_engine| async move {
        let server = start(Config {
            max_connections: 2,
            ..Config::default()
        });
        let mut held = Vec::new();
        for _ in 0..2 {
            let mut c = Client::connect(server.addr).await;
            c.send(b"GET /healthz HTTP/1.1\r\nHost: a\r\n\r\n").await;
            c.response(false).await;
            held.push(c);
        }
        let mut third = Client::connect(server.addr).await;
        assert!(
            third.closed_within(Duration::from_secs(5)).await,
            "over the cap: closed at once"
        );
        // Stopping ends the idle kept-alive connections too.
        let stats = server.finish().await;
        assert_eq!(stats.rejected, 1);
        assert_eq!(stats.accept.accepted, 3);
        for mut c in held {
            assert!(c.closed_within(Duration::from_secs(5)).await);
        }
    });
    assert_fds_back_to(baseline, "descriptors");
}

/// xorshift64*: deterministic garbage.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

fn garbage(rng: &mut Rng) -> Vec<u8> {
    let valid = b"GET /echo?verbose HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\nabc".to_vec();
    match rng.below(3) {
        0 => (0..rng.below(3000)).map(|_| rng.next() as u8).collect(),
        1 => {
            let mut v = valid;
            for _ in 0..1 + rng.below(8) {
                let i = rng.below(v.len());
                match rng.below(3) {
                    0 => v[i] = rng.next() as u8,
                    1 => {
                        v.remove(i);
                    }
                    _ => v.insert(i, b"\r\n: \0%/?"[rng.below(8)]),
                }
            }
            v
        }
        _ => {
            // Tokens that matter to the parser, in random order.
            let parts: [&[u8]; 12] = [
                b"GET ",
                b"HEAD ",
                b"/",
                b"HTTP/1.1",
                b"HTTP/1.0",
                b"\r\n",
                b"\n",
                b"Host:",
                b" ",
                b"Content-Length: 9",
                b"Transfer-Encoding: chunked",
                b"%zz",
            ];
            let mut v = Vec::new();
            for _ in 0..rng.below(40) {
                v.extend_from_slice(parts[rng.below(parts.len())]);
            }
            v
        }
    }
}

#[test]
fn garbage_never_breaks_the_server() {
    let _serial = serial();
    let baseline = open_fds();
    run_on_each_engine(|engine| async move {
        let server = start(Config {
            max_header_bytes: 2048,
            read_header_timeout: Duration::from_secs(2),
            ..Config::default()
        });
        let mut rng = Rng(0x6b6f_6e6e_0000_0001 ^ engine as u64);
        for round in 0..300 {
            let input = garbage(&mut rng);
            let mut c = Client::connect(server.addr).await;
            let (res, _) = c.stream.write_all(input.clone()).await;
            // The server may already have refused and closed.
            if res.is_ok() {
                let _ = c.stream.shutdown().await;
            }
            let rest = c.rest().await;
            assert!(
                rest.is_empty() || rest.starts_with(b"HTTP/1."),
                "{engine} round {round}: {:?} -> {:?}",
                String::from_utf8_lossy(&input),
                String::from_utf8_lossy(&rest)
            );
        }
        // Still serving.
        let mut c = Client::connect(server.addr).await;
        c.send(b"GET /healthz HTTP/1.1\r\nHost: a\r\n\r\n").await;
        assert_eq!(c.response(false).await.1, b"ok");
        drop(c);
        let stats = server.finish().await;
        assert_eq!(stats.accept.accepted, 301);
    });
    assert_fds_back_to(baseline, "descriptors");
}

#[test]
fn both_engines_were_covered() {
    let _serial = serial();
    let engines = run_on_each_engine(|_| async {});
    assert!(engines.contains(&Engine::Epoll));
}
