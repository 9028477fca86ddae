//! Acceptance: 256 MiB each way through one proxied connection, in both
//! frontend modes, under each io engine, checked with SHA-256 end to end.
//! The destinations are as fast as the proxy lets them be (a hashing sink
//! for the upload, a pattern source for the download), so the transfer
//! exercises the flow control of the whole path: frontend → server →
//! agent tunnel → endpoint and back.
//!
//! gRPC runs over the Unix socket, CONNECT over TCP with mTLS (the other
//! combinations are covered by `e2e_proxy`). Each transfer leaves one
//! audit record with the bytes the test sent and read.

mod e2e_common;

use e2e_common::*;
use konn_core::io::runtime::{available_engines, block_on};
use konn_server::settings::Mode;
use konn_testkit::dest::Destination;
use konn_testkit::{Pattern, Sha256};

/// Bytes each way.
const SIZE: u64 = 256 << 20;

/// One write: 256 KiB of the pattern.
const CHUNK: usize = 256 * 1024;

/// The digest of the first `n` bytes of the pattern of `seed`.
fn expected(seed: u64, n: u64) -> String {
    let mut p = Pattern::new(seed);
    let mut h = Sha256::new();
    let mut buf = vec![0u8; CHUNK];
    let mut left = n;
    while left > 0 {
        let k = (left as usize).min(CHUNK);
        p.fill(&mut buf[..k]);
        h.update(&buf[..k]);
        left -= k as u64;
    }
    h.finish_hex()
}

fn upload_head() -> Vec<u8> {
    SIZE.to_be_bytes().to_vec()
}

fn download_head(seed: u64) -> Vec<u8> {
    let mut v = SIZE.to_be_bytes().to_vec();
    v.extend_from_slice(&seed.to_be_bytes());
    v
}

fn run(mode: Mode, transport: Transport) {
    let _serial = serial();
    let sink = Destination::sink().unwrap();
    let source = Destination::source().unwrap();
    let (sink, source) = (sink.addr().to_string(), source.addr().to_string());
    let pki = Pki::new();
    let want_up = expected(11, SIZE);
    let want_down = expected(12, SIZE);
    for engine in available_engines() {
        let what = format!("{mode:?} over {transport:?} on {engine}");
        let before = Baseline::take();
        let dir = TempDir::new("bulk");
        let audit = dir.path("audit.log");
        let mut server = ServerSpec {
            pki: Some(&pki),
            tweak: Some(audit_to(audit.clone())),
            ..ServerSpec::new(engine, mode, transport, &dir)
        }
        .start();
        let mut agent = server.agent("agent-bulk", "", None);
        wait_backends(&server, 1);
        let idle = Baseline::take();
        let frontend = server.frontend();
        konn_testkit::dest::take_transfers();
        let (up, down) = block_on(engine, async {
            let mut pattern = Pattern::new(11);
            let mut buf = vec![0u8; CHUNK];
            let mut hash = Sha256::new();
            let mut left = SIZE;
            match mode {
                Mode::Grpc => {
                    let fe = frontend.grpc().await.unwrap();
                    // Upload: the sink answers with the digest it computed.
                    let t = fe.dial(&sink, T).await.unwrap();
                    t.write(&upload_head()).await.unwrap();
                    while left > 0 {
                        let k = (left as usize).min(CHUNK);
                        pattern.fill(&mut buf[..k]);
                        within("upload write", t.write(&buf[..k])).await.unwrap();
                        left -= k as u64;
                    }
                    let up = t.read_exact(64, T).await.unwrap();
                    t.close(T).await.unwrap();
                    // Download: read until the source closes.
                    let t = fe.dial(&source, T).await.unwrap();
                    t.write(&download_head(12)).await.unwrap();
                    let mut got = 0u64;
                    while let Some(b) = t.read(T).await.unwrap() {
                        hash.update(&b);
                        got += b.len() as u64;
                    }
                    fe.close().await;
                    (up, (got, hash.finish_hex()))
                }
                Mode::HttpConnect => {
                    let mut t = frontend.connect(&sink).await.unwrap();
                    t.write(&upload_head()).await.unwrap();
                    while left > 0 {
                        let k = (left as usize).min(CHUNK);
                        pattern.fill(&mut buf[..k]);
                        within("upload write", t.write(&buf[..k])).await.unwrap();
                        left -= k as u64;
                    }
                    let up = t.read_exact(64, T).await.unwrap();
                    t.close().await;
                    let mut t = frontend.connect(&source).await.unwrap();
                    t.write(&download_head(12)).await.unwrap();
                    let mut got = 0u64;
                    while let Some(b) = t.read(T).await.unwrap() {
                        hash.update(&b);
                        got += b.len() as u64;
                    }
                    (up, (got, hash.finish_hex()))
                }
            }
        })
        .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&up),
            want_up,
            "{what}: upload digest"
        );
        assert_eq!(down, (SIZE, want_down.clone()), "{what}: download");
        assert_idle(&server, &[&agent], idle, &what);
        // One record per transfer, with what the test sent and read.
        assert_audited_bytes(&server, &audit, &what);
        let text = std::fs::read_to_string(&audit).unwrap();
        let mut bytes: Vec<(u64, u64)> = text
            .lines()
            .map(|l| {
                let v: serde_json::Value = serde_json::from_str(l).unwrap();
                assert_eq!(v["result"], "closed", "{what}: {l}");
                let b = |k: &str| v[k].as_u64().unwrap();
                (b("bytes_to_agent"), b("bytes_from_agent"))
            })
            .collect();
        bytes.sort_unstable();
        assert_eq!(bytes, [(16, SIZE), (8 + SIZE, 64)], "{what}");
        agent.stop();
        server.stop();
        drop(dir);
        assert_released(before, &format!("{what}, stopped"));
    }
}

#[test]
fn grpc_256_mib_each_way() {
    run(Mode::Grpc, Transport::Unix);
}

#[test]
fn http_connect_256_mib_each_way() {
    run(Mode::HttpConnect, Transport::Tls);
}
