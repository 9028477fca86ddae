//! Certificate and CA hot reload, end to end with both binaries (issue 16,
//! item 3): the files are rotated the way a Kubernetes secret volume
//! does it (a new directory, then one atomic rename of the `..data`
//! symlink) while a bulk download runs through the tunnel.
//!
//! - the download completes byte-exact (no tunnel or connection dropped);
//! - new handshakes on the agent port use the new certificate (a client
//!   that trusts only the new CA connects);
//! - a broken certificate file keeps the old material: one warning in the
//!   log, `konn_tls_reloads_total{result="error"}` counts it, handshakes
//!   still succeed;
//! - once the server trusts only the new CA, the agent's next connection
//!   (after its tunnel is cut) is accepted: it presents its new
//!   certificate.

mod fault_common;

use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::BytesMut;
use fault_common::{ServerProc, T, metric};
use konn_core::io::runtime::{Engine, block_on};
use konn_core::io::tls::{ClientTlsOptions, PemSource, TlsStream};
use konn_testkit::dest::Destination;
use konn_testkit::files::TempDir;
use konn_testkit::frontend::GrpcFrontend;
use konn_testkit::pki::{self, Pem, PkiFiles};
use konn_testkit::ports::free_port;
use konn_testkit::procs::{Proc, http_get};
use konn_testkit::relay::LoadBalancer;
use konn_testkit::wait::wait_until;
use konn_testkit::{Pattern, Sha256};

/// Size of the download that runs during the rotation.
const BULK: u64 = 256 << 20;

/// A Kubernetes-style secret volume: `dir/<name>` → `..data/<name>`,
/// `..data` → a versioned directory, swapped with one rename.
struct Volume {
    dir: PathBuf,
    version: usize,
}

impl Volume {
    fn new(dir: PathBuf, files: &[(&str, &str)]) -> Self {
        std::fs::create_dir_all(&dir).unwrap();
        let mut v = Self { dir, version: 0 };
        v.publish(files);
        for (name, _) in files {
            symlink(Path::new("..data").join(name), v.dir.join(name)).unwrap();
        }
        v
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// Writes a new version and switches to it atomically.
    fn publish(&mut self, files: &[(&str, &str)]) {
        self.version += 1;
        let version = format!("..v{}", self.version);
        std::fs::create_dir_all(self.dir.join(&version)).unwrap();
        for (name, body) in files {
            std::fs::write(self.dir.join(&version).join(name), body).unwrap();
        }
        let tmp = self.dir.join("..data_tmp");
        let _ = std::fs::remove_file(&tmp);
        symlink(&version, &tmp).unwrap();
        std::fs::rename(&tmp, self.dir.join("..data")).unwrap();
    }
}

fn server_files(ca: &str, leaf: &Pem) -> Vec<(&'static str, String)> {
    vec![
        ("ca.crt", ca.to_owned()),
        ("server.crt", leaf.server_cert.clone()),
        ("server.key", leaf.server_key.clone()),
    ]
}

fn agent_files(ca: &str, leaf: &Pem) -> Vec<(&'static str, String)> {
    vec![
        ("ca.crt", ca.to_owned()),
        ("agent.crt", leaf.agent_cert.clone()),
        ("agent.key", leaf.agent_key.clone()),
    ]
}

fn refs<'a>(files: &'a [(&'static str, String)]) -> Vec<(&'static str, &'a str)> {
    files.iter().map(|(n, b)| (*n, b.as_str())).collect()
}

/// A TLS handshake with the agent port that trusts only `ca` and presents
/// `leaf`'s agent certificate; the server must accept it (the probe sends
/// the HTTP/2 preface and reads the server's first bytes).
fn probe(addr: std::net::SocketAddr, dir: &TempDir, ca: &str, leaf: &Pem) -> Result<(), String> {
    let probe_dir = dir.path(&format!("probe-{}", free_port()));
    std::fs::create_dir_all(&probe_dir).unwrap();
    let put = |n: &str, b: &str| {
        let p = probe_dir.join(n);
        std::fs::write(&p, b).unwrap();
        PemSource::File(p)
    };
    let mut o = ClientTlsOptions::new(put("ca.crt", ca), "127.0.0.1");
    o.identity = Some((
        put("agent.crt", &leaf.agent_cert),
        put("agent.key", &leaf.agent_key),
    ));
    let tls = o.build().map_err(|e| e.to_string())?;
    block_on(Engine::Epoll, async move {
        let sock = monoio::net::TcpStream::connect(addr)
            .await
            .map_err(|e| e.to_string())?;
        let mut s = TlsStream::connect(sock, &tls)
            .await
            .map_err(|e| format!("{e:?}"))?;
        s.write_all(konn_frames::h2::PREFACE)
            .await
            .map_err(|e| format!("{e:?}"))?;
        let mut buf = BytesMut::new();
        match monoio::time::timeout(Duration::from_secs(5), s.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .map_err(|e| e.to_string())?
}

#[test]
fn certificates_rotate_under_a_running_transfer() {
    let Ok(agent_bin) = konn_testkit::procs::binary("proxy-agent") else {
        panic!("proxy-agent not built: run cargo build --bins (scripts/test does)");
    };
    let dir = TempDir::new("reload");
    let old = pki::generate_named("konn CA 1").unwrap();
    let new = pki::generate_named("konn CA 2").unwrap();
    let both = format!("{}{}", old.ca_cert, new.ca_cert);
    let mut server_vol = Volume::new(dir.path("server"), &refs(&server_files(&old.ca_cert, &old)));
    let mut agent_vol = Volume::new(dir.path("agent"), &refs(&agent_files(&old.ca_cert, &old)));
    let files = PkiFiles {
        ca_cert: server_vol.path("ca.crt"),
        server_cert: server_vol.path("server.crt"),
        server_key: server_vol.path("server.key"),
        agent_cert: agent_vol.path("agent.crt"),
        agent_key: agent_vol.path("agent.key"),
        frontend_cert: PathBuf::new(),
        frontend_key: PathBuf::new(),
    };
    let server = ServerProc::start(
        Engine::Epoll,
        &dir,
        &files,
        &["--tls-reload-interval=100ms".to_owned()],
    );
    let lb = LoadBalancer::start(vec![server.agent]).unwrap();
    let (agent_health, agent_admin) = (free_port(), free_port());
    let p = |p: PathBuf| p.display().to_string();
    let agent = Proc::spawn(
        &agent_bin,
        &[
            "--proxy-server-host=127.0.0.1".to_owned(),
            format!("--proxy-server-port={}", lb.addr().port()),
            format!("--ca-cert={}", p(agent_vol.path("ca.crt"))),
            format!("--agent-cert={}", p(agent_vol.path("agent.crt"))),
            format!("--agent-key={}", p(agent_vol.path("agent.key"))),
            "--agent-id=rotating".to_owned(),
            "--health-server-host=127.0.0.1".to_owned(),
            format!("--health-server-port={agent_health}"),
            "--admin-bind-address=127.0.0.1".to_owned(),
            format!("--admin-server-port={agent_admin}"),
            "--workers=1".to_owned(),
            "--tls-reload-interval=100ms".to_owned(),
        ],
        &dir.path("proxy-agent.log"),
    )
    .unwrap();
    let ready = "konnectivity_network_proxy_server_ready_backend_connections";
    let connected = || server.metric(ready).is_some_and(|v| v >= 1.0);
    assert!(
        wait_until(T, connected),
        "agent never connected:\n{}",
        agent.log_tail(20)
    );
    let agent_metric = |series: &str| {
        let at = std::net::SocketAddr::from(([127, 0, 0, 1], agent_health));
        http_get(at, "/metrics")
            .ok()
            .and_then(|(_, body)| metric(&body, series))
    };

    // The download, on its own thread. It takes its first MiB, then waits
    // (its flow-controlled tunnel open) until the rotation is done.
    let source = Destination::source().unwrap();
    let uds = server.uds.clone();
    let target = source.addr().to_string();
    let started = Arc::new(AtomicBool::new(false));
    let rotated = Arc::new(AtomicBool::new(false));
    let (started2, rotated2) = (started.clone(), rotated.clone());
    let download = std::thread::spawn(move || {
        block_on(Engine::Epoll, async move {
            let fe = GrpcFrontend::connect_unix(&uds).await.unwrap();
            let t = fe.dial(&target, T).await.unwrap();
            let mut head = BULK.to_be_bytes().to_vec();
            head.extend_from_slice(&42u64.to_be_bytes());
            t.write(&head).await.unwrap();
            let mut hash = Sha256::new();
            let mut got = 0u64;
            while got < BULK {
                let chunk = t.read(T).await.unwrap().expect("the download ended early");
                hash.update(&chunk);
                got += chunk.len() as u64;
                if got >= 1 << 20 && !started2.swap(true, Ordering::AcqRel) {
                    let deadline = konn_core::io::clock::now() + T;
                    while !rotated2.load(Ordering::Acquire) {
                        assert!(konn_core::io::clock::now() < deadline, "no rotation");
                        monoio::time::sleep(Duration::from_millis(5)).await;
                    }
                }
            }
            fe.abort().await;
            hash.finish_hex()
        })
        .unwrap()
    });

    assert!(
        wait_until(T, || started.load(Ordering::Acquire)),
        "the download did not start"
    );
    // Rotate both sides to the new CA while it runs: CA bundles first
    // (trust both), then the new leaf certificates.
    server_vol.publish(&refs(&server_files(&both, &new)));
    agent_vol.publish(&refs(&agent_files(&both, &new)));
    let reloads_ok = r#"konn_tls_reloads_total{listener="agent",result="ok"}"#;
    assert!(
        wait_until(T, || server.metric(reloads_ok).is_some_and(|v| v >= 1.0)),
        "the server did not reload:\n{}",
        server.proc.log_tail(20)
    );
    assert!(
        wait_until(T, || agent_metric(
            r#"konn_tls_reloads_total{listener="tunnel",result="ok"}"#
        )
        .is_some_and(|v| v >= 1.0)),
        "the agent did not reload:\n{}",
        agent.log_tail(20)
    );
    // New handshakes: a client that trusts only the new CA gets in.
    probe(server.agent, &dir, &new.ca_cert, &new).expect("a handshake with the new material");

    // A broken certificate keeps the old material, logged once and counted.
    let broken = vec![
        ("ca.crt", both.clone()),
        (
            "server.crt",
            "-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n".to_owned(),
        ),
        ("server.key", new.server_key.clone()),
    ];
    server_vol.publish(&refs(&broken));
    let reload_errors = r#"konn_tls_reloads_total{listener="agent",result="error"}"#;
    assert!(
        wait_until(T, || server.metric(reload_errors).is_some_and(|v| v >= 1.0)),
        "the broken file was not refused:\n{}",
        server.proc.log_tail(20)
    );
    let log = server.log();
    assert_eq!(
        log.matches("keeping the previous certificates").count(),
        1,
        "one warning per refused change:\n{log}"
    );
    probe(server.agent, &dir, &new.ca_cert, &new).expect("handshakes still use the good material");

    // The transfer never noticed.
    rotated.store(true, Ordering::Release);
    let want = {
        let mut h = Sha256::new();
        let mut p = Pattern::new(42);
        let mut buf = vec![0u8; 1 << 20];
        for _ in 0..(BULK >> 20) {
            p.fill(&mut buf);
            h.update(&buf);
        }
        h.finish_hex()
    };
    assert_eq!(
        download.join().unwrap(),
        want,
        "the download is not byte-exact"
    );

    // Only the new CA from now on; the agent's next connection must
    // present its new certificate to be accepted.
    server_vol.publish(&refs(&server_files(&new.ca_cert, &new)));
    assert!(
        wait_until(T, || server.metric(reloads_ok).is_some_and(|v| v >= 2.0)),
        "the server did not reload again:\n{}",
        server.proc.log_tail(20)
    );
    lb.cut();
    let accepted = wait_until(T, || lb.accepted() >= 2 && connected());
    assert!(
        accepted,
        "the agent did not reconnect with its new certificate:\n{}\n{}",
        agent.log_tail(20),
        server.proc.log_tail(20)
    );
    probe(server.agent, &dir, &old.ca_cert, &old).expect_err("the old CA is no longer trusted");
}
