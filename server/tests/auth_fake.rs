//! Agent token authentication against a fake kube-apiserver
//! (`konn_testkit::fakekube`): upstream's verdicts and texts for every case,
//! refused calls leave no backend, the cache and coalescing keep the
//! TokenReview count down, and a slow or stopped kube-apiserver refuses
//! new agents within the bound (fail closed). The same cases against the
//! real kube-apiserver are in `tests/kube_auth.rs`.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use konn_core::kube::KubeSettings;
use konn_core::kube::review::ReviewPolicy;
use konn_frames::GrpcStatus;
use konn_server::kube::Kubernetes;
use konn_server::serve;
use konn_server::settings::{FrontendListen, Mode, ServerSettings};
use konn_testkit::agentprobe::{ProbeResult, connect_call};
use konn_testkit::fakekube::{Answer, FakeKube};

const SA: &str = "system:serviceaccount:kube-system:konnectivity-agent";

fn fake(dir: &std::path::Path) -> FakeKube {
    let mut t = HashMap::new();
    t.insert("good".to_owned(), Answer::User(SA.to_owned()));
    t.insert("good-2".to_owned(), Answer::User(SA.to_owned()));
    t.insert(
        "wrong-ns".to_owned(),
        Answer::User("system:serviceaccount:default:konnectivity-agent".to_owned()),
    );
    t.insert(
        "wrong-sa".to_owned(),
        Answer::User("system:serviceaccount:kube-system:other".to_owned()),
    );
    t.insert("alice".to_owned(), Answer::User("alice".to_owned()));
    t.insert(
        "audience".to_owned(),
        Answer::Error("[invalid bearer token, token audiences [\"x\"] is invalid for the target audiences [\"system:konnectivity-server\"]]".to_owned()),
    );
    FakeKube::start(dir, t)
}

fn server(kubeconfig: &std::path::Path, timeout: Duration) -> serve::ServerHandle {
    let dir = tempfile::tempdir().unwrap();
    let mut s =
        ServerSettings::for_tests(FrontendListen::Unix(dir.path().join("f.sock")), Mode::Grpc);
    std::mem::forget(dir);
    let mut policy = ReviewPolicy::new(
        "system:konnectivity-server",
        "kube-system",
        "konnectivity-agent",
    );
    policy.timeout = timeout;
    s.kubernetes = Some(Kubernetes {
        client: KubeSettings::new(Some(kubeconfig.to_owned())),
        token_auth: Some(policy),
        lease: None,
    });
    serve::start(s).expect("server starts")
}

fn probe(addr: &str, auth: &[&str]) -> ProbeResult {
    let mut md: Vec<(&str, &[u8])> = vec![("agentid", b"agent-1"), ("agentidentifiers", b"")];
    for a in auth {
        md.push(("authorization", a.as_bytes()));
    }
    connect_call(addr, None, &md, Duration::from_secs(20))
}

fn refused(r: &ProbeResult) -> String {
    match r {
        ProbeResult::Refused { status, message } => {
            assert_eq!(*status, GrpcStatus::UNKNOWN, "{message}");
            message.clone()
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
}

fn metric(s: &serve::ServerHandle, line_start: &str) -> f64 {
    let text = s.metrics().registry().render_to_string();
    text.lines()
        .find(|l| l.starts_with(line_start))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

#[test]
fn verdicts_texts_counts_and_no_state_for_refused_agents() {
    let dir = tempfile::tempdir().unwrap();
    let kube = fake(dir.path());
    let s = server(kube.kubeconfig(), Duration::from_secs(5));
    let addr = s.agent_addr().to_string();
    let v = "Failed to validate authentication token, err:";
    let cases: [(&[&str], String); 8] = [
        (
            &[],
            "Authentication context was not found in metadata".to_owned(),
        ),
        (
            &["Bearer good", "Bearer good"],
            "too many (2) tokens are received".to_owned(),
        ),
        (
            &["good"],
            "received token does not have \"Bearer \" prefix".to_owned(),
        ),
        (
            &["Bearer audience"],
            format!(
                "{v}lookup failed: [invalid bearer token, token audiences [\"x\"] is invalid for the target audiences [\"system:konnectivity-server\"]]"
            ),
        ),
        (
            &["Bearer wrong-ns"],
            format!(
                "{v}lookup failed: incoming request from \"default\" namespace. Expected \"kube-system\""
            ),
        ),
        (
            &["Bearer wrong-sa"],
            format!(
                "{v}lookup failed: incoming request from \"other\" service account. Expected \"konnectivity-agent\""
            ),
        ),
        (
            &["Bearer alice"],
            format!("{v}lookup failed: unexpected username format"),
        ),
        (
            &["Bearer unknown"],
            format!("{v}lookup failed: invalid bearer token"),
        ),
    ];
    for (auth, want) in &cases {
        assert_eq!(&refused(&probe(&addr, auth)), want, "{auth:?}");
    }
    // Refused agents left nothing behind.
    assert_eq!(
        s.shared()
            .backends
            .load(std::sync::atomic::Ordering::SeqCst),
        0
    );
    assert_eq!(
        metric(
            &s,
            "konnectivity_network_proxy_server_grpc_connections{service_method=\"Connect\"}"
        ),
        0.0
    );
    assert_eq!(
        metric(
            &s,
            "konn_server_agent_auth_total{result=\"missing_token\",source=\"header\"}"
        ),
        1.0
    );
    assert_eq!(
        metric(
            &s,
            "konn_server_agent_auth_total{result=\"denied\",source=\"api\"}"
        ),
        5.0
    );
    // The right token gets in.
    assert!(
        matches!(probe(&addr, &["Bearer good"]), ProbeResult::Accepted { ref server_id } if server_id == "test-server")
    );
    assert_eq!(
        metric(
            &s,
            "konn_server_agent_auth_total{result=\"allowed\",source=\"api\"}"
        ),
        1.0
    );
    // Header refusals made no review; five denials and one success did.
    assert_eq!(kube.calls(), 6);
    // Again: the cache answers, for successes and refusals.
    for _ in 0..5 {
        assert!(matches!(
            probe(&addr, &["Bearer good"]),
            ProbeResult::Accepted { .. }
        ));
        refused(&probe(&addr, &["Bearer wrong-ns"]));
    }
    assert_eq!(kube.calls(), 6);
    assert_eq!(
        metric(
            &s,
            "konn_server_agent_auth_total{result=\"allowed\",source=\"cache\"}"
        ),
        5.0
    );
    assert_eq!(
        metric(&s, "konn_server_token_reviews_total{code=\"201\"}"),
        6.0
    );
    s.stop().unwrap();
}

#[test]
#[allow(clippy::disallowed_methods)] // the bound on refusing is the property under test (generous margin)
fn a_slow_or_stopped_kube_apiserver_refuses_within_the_bound() {
    let dir = tempfile::tempdir().unwrap();
    let mut kube = fake(dir.path());
    let bound = Duration::from_millis(800);
    let s = server(kube.kubeconfig(), bound);
    let addr = s.agent_addr().to_string();
    assert!(matches!(
        probe(&addr, &["Bearer good"]),
        ProbeResult::Accepted { .. }
    ));
    // Slow: refused at the deadline, not cached; a cached token still gets in.
    kube.set_delay(Duration::from_secs(3));
    let t = Instant::now();
    let msg = refused(&probe(&addr, &["Bearer good-2"]));
    assert!(msg.contains("context deadline exceeded"), "{msg}");
    assert!(
        t.elapsed() < bound + Duration::from_secs(2),
        "{:?}",
        t.elapsed()
    );
    assert!(matches!(
        probe(&addr, &["Bearer good"]),
        ProbeResult::Accepted { .. }
    ));
    // Stopped: refused at once.
    kube.stop();
    let t = Instant::now();
    let msg = refused(&probe(&addr, &["Bearer good-2"]));
    assert!(
        msg.starts_with(
            "Failed to validate authentication token, err:Failed to authenticate request. err:"
        ),
        "{msg}"
    );
    assert!(
        t.elapsed() < bound + Duration::from_secs(2),
        "{:?}",
        t.elapsed()
    );
    assert!(
        metric(&s, "konn_server_agent_auth_total{result=\"timeout\"")
            + metric(&s, "konn_server_agent_auth_total{result=\"unavailable\"")
            >= 2.0
    );
    s.stop().unwrap();
}
