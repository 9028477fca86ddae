//! A fake kube-apiserver that answers TokenReviews only, over plain HTTP on
//! 127.0.0.1, for tests that must run without the real control plane
//! (`target/kube/`): tokens map to a username (authenticated) or to a
//! review error; every review is counted; answers can be delayed; the
//! server can be stopped (connections then fail, like a kube-apiserver
//! that went away). `kubeconfig()` points a client at it.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::thread;
use std::time::Duration;

/// How a token is answered.
#[derive(Debug, Clone)]
pub enum Answer {
    /// Authenticated as this user.
    User(String),
    /// Not authenticated, with this `status.error`.
    Error(String),
}

struct Shared {
    tokens: HashMap<String, Answer>,
    calls: AtomicUsize,
    delay_ms: AtomicU64,
    stopped: AtomicBool,
}

/// The running fake (see the module docs). Dropping it stops it.
pub struct FakeKube {
    addr: SocketAddr,
    shared: Arc<Shared>,
    kubeconfig: PathBuf,
    accept: Option<thread::JoinHandle<()>>,
}

impl FakeKube {
    /// Start on 127.0.0.1 with these tokens (unknown tokens are not
    /// authenticated); the kubeconfig is written into `dir`.
    ///
    /// # Panics
    ///
    /// If it cannot listen or write the kubeconfig (a test set-up error).
    pub fn start(dir: &Path, tokens: HashMap<String, Answer>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the fake kube-apiserver");
        let addr = listener.local_addr().expect("local addr");
        let shared = Arc::new(Shared {
            tokens,
            calls: AtomicUsize::new(0),
            delay_ms: AtomicU64::new(0),
            stopped: AtomicBool::new(false),
        });
        let kubeconfig = dir.join(format!("fake-kubeconfig-{}", addr.port()));
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: http://{addr}\n\
                 users:\n- name: konn\n  user:\n    token: fake\ncontexts:\n- name: fake\n  context:\n    cluster: fake\n    user: konn\n\
                 current-context: fake\n"
            ),
        )
        .expect("write the kubeconfig");
        let s = shared.clone();
        let accept = thread::spawn(move || {
            for conn in listener.incoming() {
                if s.stopped.load(Ordering::SeqCst) {
                    return;
                }
                if let Ok(c) = conn {
                    let s = s.clone();
                    thread::spawn(move || serve(c, &s));
                }
            }
        });
        Self {
            addr,
            shared,
            kubeconfig,
            accept: Some(accept),
        }
    }

    /// A kubeconfig for this server.
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// TokenReviews answered so far.
    pub fn calls(&self) -> usize {
        self.shared.calls.load(Ordering::SeqCst)
    }

    /// Delay every answer from now on.
    pub fn set_delay(&self, d: Duration) {
        self.shared.delay_ms.store(
            u64::try_from(d.as_millis()).unwrap_or(u64::MAX),
            Ordering::SeqCst,
        );
    }

    /// Stop: the port is closed and open connections end after their
    /// current request.
    pub fn stop(&mut self) {
        self.shared.stopped.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
    }
}

impl Drop for FakeKube {
    fn drop(&mut self) {
        self.stop();
    }
}

fn serve(conn: TcpStream, s: &Shared) {
    let _ = conn.set_read_timeout(Some(Duration::from_millis(100)));
    let Ok(mut w) = conn.try_clone() else { return };
    let mut r = BufReader::new(conn);
    // Bounded: a test connection serves at most this many requests.
    for _ in 0..100_000 {
        let mut line = String::new();
        loop {
            if s.stopped.load(Ordering::SeqCst) {
                return;
            }
            match r.read_line(&mut line) {
                Ok(0) => return,
                Ok(_) => break,
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                Err(_) => return,
            }
        }
        let mut len = 0usize;
        loop {
            let mut h = String::new();
            if r.read_line(&mut h).unwrap_or(0) == 0 {
                return;
            }
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':')
                && k.eq_ignore_ascii_case("content-length")
            {
                len = v.trim().parse().unwrap_or(0);
            }
        }
        let mut body = vec![0u8; len.min(1 << 20)];
        if r.read_exact(&mut body).is_err() {
            return;
        }
        let (status, answer) = if line
            .starts_with("POST /apis/authentication.k8s.io/v1/tokenreviews")
        {
            s.calls.fetch_add(1, Ordering::SeqCst);
            let delay = s.delay_ms.load(Ordering::SeqCst);
            if delay > 0 {
                thread::sleep(Duration::from_millis(delay));
            }
            if s.stopped.load(Ordering::SeqCst) {
                return;
            }
            ("201 Created", review(s, &body))
        } else {
            (
                "404 Not Found",
                serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404}),
            )
        };
        let body = answer.to_string();
        let resp = format!(
            "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        if w.write_all(resp.as_bytes()).is_err() {
            return;
        }
    }
}

fn review(s: &Shared, body: &[u8]) -> serde_json::Value {
    let req: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
    let token = req["spec"]["token"].as_str().unwrap_or_default();
    let status = match s.tokens.get(token) {
        Some(Answer::User(u)) => {
            serde_json::json!({"authenticated": true, "user": {"username": u}})
        }
        Some(Answer::Error(e)) => serde_json::json!({"authenticated": false, "error": e}),
        None => serde_json::json!({"authenticated": false, "error": "invalid bearer token"}),
    };
    serde_json::json!({
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenReview",
        "spec": req["spec"],
        "status": status,
    })
}
