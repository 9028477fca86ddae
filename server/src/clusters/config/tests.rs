use super::*;
use konn_testkit::files::TempDir;
use konn_testkit::pki::{PkiFiles, Spec, write_for};

struct Fixture {
    dir: TempDir,
    a: PkiFiles,
    b: PkiFiles,
}

impl Fixture {
    fn new() -> Self {
        let dir = TempDir::new("clusters-config");
        let spec = |names, ou| Spec {
            server_names: names,
            client_ou: Some(ou),
        };
        let a = write_for(&dir.path("a"), spec(&["a.konn.test"], "a")).unwrap();
        let b = write_for(&dir.path("b"), spec(&["b.konn.test"], "b")).unwrap();
        Self { dir, a, b }
    }

    fn cluster(&self, name: &str, p: &PkiFiles, extra: &str) -> String {
        format!(
            "- name: {name}\n  frontend:\n    uds: {uds}\n  agents:\n    serverNames: [{name}.konn.test]\n    cert: {cert}\n    key: {key}\n    clientCA: {ca}\n{extra}",
            uds = self.dir.path(&format!("{name}.sock")).display(),
            cert = p.server_cert.display(),
            key = p.server_key.display(),
            ca = p.ca_cert.display(),
        )
    }

    fn parse(&self, text: &str) -> Result<Vec<ClusterSettings>, ConfigError> {
        parse(
            Path::new("clusters.yaml"),
            text,
            &ClusterDefaults::default(),
        )
    }
}

#[test]
fn a_valid_file_gives_every_cluster_its_settings() {
    let fx = Fixture::new();
    let text = format!(
        "clusters:\n{}{}",
        fx.cluster(
            "a",
            &fx.a,
            "  proxyStrategies: [destHost, default]\n  backendDialTimeout: 5s\n  allowedDestinations: [\"10.0.0.10:6443\"]\n"
        ),
        fx.cluster("b", &fx.b, "")
    );
    let got = fx.parse(&text).unwrap();
    assert_eq!(got.len(), 2);
    let a = &got[0];
    assert_eq!(a.name, "a");
    assert_eq!(a.strategies, vec![Strategy::DestHost, Strategy::Default]);
    assert_eq!(a.router.dial_timeout, Duration::from_secs(5));
    assert_eq!(a.reverse.destinations.len(), 1);
    assert_eq!(a.agents.server_names, vec!["a.konn.test".to_owned()]);
    assert!(matches!(a.frontend.listen, FrontendListen::Unix(_)));
    let b = &got[1];
    assert_eq!(b.strategies, vec![Strategy::Default]);
    assert!(b.reverse.destinations.is_empty());
    // The same text gives the same fingerprints; a change changes only its
    // cluster's, and moving a cluster in the file changes nothing.
    let again = fx.parse(&text).unwrap();
    assert_eq!(again[0].fingerprint, a.fingerprint);
    let swapped = format!(
        "clusters:\n{}{}",
        fx.cluster("b", &fx.b, ""),
        fx.cluster(
            "a",
            &fx.a,
            "  proxyStrategies: [destHost, default]\n  backendDialTimeout: 5s\n  allowedDestinations: [\"10.0.0.10:6443\"]\n"
        )
    );
    let swapped = fx.parse(&swapped).unwrap();
    assert_eq!(swapped[1].fingerprint, a.fingerprint);
    assert_eq!(swapped[0].fingerprint, b.fingerprint);
    let changed = format!(
        "clusters:\n{}{}",
        fx.cluster("a", &fx.a, ""),
        fx.cluster("b", &fx.b, "")
    );
    let changed = fx.parse(&changed).unwrap();
    assert_ne!(changed[0].fingerprint, a.fingerprint);
    assert_eq!(changed[1].fingerprint, b.fingerprint);
}

/// (text, line, field, message fragment)
fn expect_error(fx: &Fixture, text: &str, line: u64, field: &str, fragment: &str) {
    let e = fx.parse(text).unwrap_err();
    assert_eq!((e.line, e.field.as_str()), (line, field), "{e}");
    assert!(e.message.contains(fragment), "{e}");
    let shown = e.to_string();
    assert!(
        shown.starts_with(&format!("clusters.yaml:{line}:")) && shown.contains(field),
        "{shown}"
    );
}

#[test]
fn errors_name_the_file_line_and_field() {
    let fx = Fixture::new();
    let a = fx.cluster("a", &fx.a, "");
    // Types and unknown fields (serde-saphyr's errors, with the field path
    // from the text).
    expect_error(
        &fx,
        &format!(
            "clusters:\n{}{}",
            a,
            fx.cluster("b", &fx.b, "  maxPendingDialsPerAgent: lots\n")
        ),
        18,
        "clusters[1].maxPendingDialsPerAgent",
        "invalid",
    );
    expect_error(
        &fx,
        &format!("clusters:\n{a}  frontnd: {{}}\n"),
        10,
        "clusters[0].frontnd",
        "unknown field",
    );
    expect_error(&fx, "clusters: []\n", 1, "clusters", "no cluster");
    // Rules across fields and clusters.
    expect_error(
        &fx,
        &format!(
            "clusters:\n{a}{}",
            fx.cluster("a", &fx.b, "")
                .replace("a.konn.test", "c.konn.test")
        ),
        10,
        "clusters[1].name",
        "also the name",
    );
    let dup_sni = fx
        .cluster("b", &fx.b, "")
        .replace("[b.konn.test]", "[A.konn.test.]");
    expect_error(
        &fx,
        &format!("clusters:\n{a}{dup_sni}"),
        14,
        "clusters[1].agents.serverNames[0]",
        "already selects cluster \"a\"",
    );
    let same_ca = fx.cluster("b", &fx.a, "");
    expect_error(
        &fx,
        &format!("clusters:\n{a}{same_ca}"),
        17,
        "clusters[1].agents.clientCA",
        "same CA",
    );
    let narrowed = |n: &str, ou: &str| {
        fx.cluster(n, &fx.a, "").replace(
            "    clientCA:",
            &format!("    allowedClients: [{{organizationalUnit: {ou}}}]\n    clientCA:"),
        )
    };
    fx.parse(&format!(
        "clusters:\n{}{}",
        narrowed("a", "a"),
        narrowed("b", "b")
    ))
    .expect("the same CA twice, narrowed on both sides");
    let no_auth = a.replace(&format!("    clientCA: {}\n", fx.a.ca_cert.display()), "");
    expect_error(
        &fx,
        &format!("clusters:\n{no_auth}"),
        6,
        "clusters[0].agents",
        "must authenticate",
    );
    let missing = a.replace(&fx.a.ca_cert.display().to_string(), "/nonexistent/ca.crt");
    expect_error(
        &fx,
        &format!("clusters:\n{missing}"),
        9,
        "clusters[0].agents.clientCA",
        "/nonexistent/ca.crt",
    );
    let ip_sni = a.replace("[a.konn.test]", "[\"10.1.2.3\"]");
    expect_error(
        &fx,
        &format!("clusters:\n{ip_sni}"),
        6,
        "clusters[0].agents.serverNames[0]",
        "not a DNS name",
    );
    let bad_name = a.replace("name: a", "name: Cluster_A");
    expect_error(
        &fx,
        &format!("clusters:\n{bad_name}"),
        2,
        "clusters[0].name",
        "Cluster_A",
    );
    let tcp_no_tls = a.replace(
        &format!("uds: {}", fx.dir.path("a.sock").display()),
        "port: 9443",
    );
    expect_error(
        &fx,
        &format!("clusters:\n{tcp_no_tls}"),
        4,
        "clusters[0].frontend",
        "cert, key and clientCA",
    );
    let both = a.replace(
        "    clientCA:",
        "    token: {audience: x, namespace: y, serviceAccount: z}\n    clientCA:",
    );
    expect_error(
        &fx,
        &format!("clusters:\n{both}"),
        9,
        "clusters[0].agents.token",
        "exclude",
    );
    let bad_dest = fx.cluster("a", &fx.a, "  allowedDestinations: [\"nope\"]\n");
    expect_error(
        &fx,
        &format!("clusters:\n{bad_dest}"),
        10,
        "clusters[0].allowedDestinations",
        "nope",
    );
    let same_sock = fx.cluster("b", &fx.b, "").replace("b.sock", "a.sock");
    expect_error(
        &fx,
        &format!("clusters:\n{a}{same_sock}"),
        12,
        "clusters[1].frontend",
        "also cluster \"a\"",
    );
}

#[test]
fn yaml_paths_follow_keys_and_list_items() {
    let text = "clusters:\n- name: a\n  frontend:\n    uds: x\n- name: b\n  agents:\n    serverNames:\n    - one\n    - two\n";
    assert_eq!(yaml_path(text, 4, 10), "clusters[0].frontend.uds");
    assert_eq!(yaml_path(text, 5, 9), "clusters[1].name");
    assert_eq!(yaml_path(text, 9, 7), "clusters[1].agents.serverNames[1]");
    assert_eq!(yaml_path(text, 1, 1), "clusters");
    assert_eq!(yaml_path(text, 99, 1), "");
}

#[test]
fn limits_default_to_the_flags_and_are_set_per_cluster() {
    let fx = Fixture::new();
    let flags = LimitsConfig {
        agent: Limit::new(7, 0),
        dest: Limit::new(0, 3),
        ..LimitsConfig::default()
    };
    let defaults = ClusterDefaults {
        router: RouterConfig {
            limits: Some(Arc::new(Limits::new(flags, konn_core::io::clock::now()))),
            ..RouterConfig::default()
        },
        memory_budget: 1000,
        ..ClusterDefaults::default()
    };
    let limited = "  limits:\n    maxAgentConnections: 0\n    maxAgentDialRate: 5\n    maxDestinationConnections: 9\n    maxFrontendConnections: 2\n    maxFrontendDialRate: 4\n    maxClusterConnections: 100\n    maxClusterDialRate: 50\n    overloadMemoryWatermark: 0.5\n";
    let text = format!(
        "clusters:\n{}{}",
        fx.cluster("a", &fx.a, limited),
        fx.cluster("b", &fx.b, "")
    );
    let got = parse(Path::new("clusters.yaml"), &text, &defaults).unwrap();
    let cfg = |i: usize| got[i].router.limits.as_ref().unwrap().config();
    assert_eq!(
        cfg(0),
        LimitsConfig {
            agent: Limit::new(0, 5),
            dest: Limit::new(9, 3),
            frontend: Limit::new(2, 4),
            cluster: Limit::new(100, 50),
            overload_high: 500,
            overload_low: 450,
        }
    );
    assert_eq!(cfg(1), flags, "b: the flags");
    // Each cluster counts apart.
    assert!(!Arc::ptr_eq(
        got[1].router.limits.as_ref().unwrap(),
        defaults.router.limits.as_ref().unwrap()
    ));
    // Without any limit, a cluster still has its (all off) limits, so a
    // reload can switch them on in place.
    let plain = fx
        .parse(&format!("clusters:\n{}", fx.cluster("b", &fx.b, "")))
        .unwrap();
    let l = plain[0].router.limits.as_ref().unwrap();
    assert!(!l.enabled());
    // Limits are not part of the fingerprint: a reload retunes them.
    let retuned = text.replace("maxAgentDialRate: 5", "maxAgentDialRate: 6");
    let again = parse(Path::new("clusters.yaml"), &retuned, &defaults).unwrap();
    assert_eq!(again[0].fingerprint, got[0].fingerprint);
    assert_eq!(
        again[0].router.limits.as_ref().unwrap().config().agent,
        Limit::new(0, 6)
    );
}

#[test]
fn limit_errors_name_the_field() {
    let fx = Fixture::new();
    let with = |limits: &str| {
        format!(
            "clusters:\n{}",
            fx.cluster("a", &fx.a, &format!("  limits:\n{limits}"))
        )
    };
    expect_error(
        &fx,
        &with("    maxAgentConnections: -1\n"),
        11,
        "clusters[0].limits.maxAgentConnections",
        "-1: must be between 0 (no limit) and 4294967295",
    );
    expect_error(
        &fx,
        &with("    maxClusterDialRate: 5000000000\n"),
        11,
        "clusters[0].limits.maxClusterDialRate",
        "5000000000: must be between 0 (no limit) and 4294967295",
    );
    expect_error(
        &fx,
        &with("    maxAgentConnections: 1\n    overloadMemoryWatermark: 1.5\n"),
        12,
        "clusters[0].limits.overloadMemoryWatermark",
        "must be a fraction of --memory-budget from 0 (off) to 1",
    );
    expect_error(
        &fx,
        &with("    overloadMemoryWatermark: .nan\n"),
        11,
        "clusters[0].limits.overloadMemoryWatermark",
        "must be a fraction",
    );
    expect_error(
        &fx,
        &with("    maxAgentConnection: 1\n"),
        11,
        "clusters[0].limits.maxAgentConnection",
        "unknown field",
    );
    expect_error(
        &fx,
        &with("    maxFrontendDialRate: fast\n"),
        11,
        "clusters[0].limits.maxFrontendDialRate",
        "invalid",
    );
}
