//! Every rule of upstream proxy-agent's `Validate()` (accepted and
//! rejected), konn's additional checks, the typed result and the features
//! konn refuses at start.

use std::path::PathBuf;
use std::time::Duration;

use konn_agent::Error;
use konn_agent::options::{self, AgentOptions, ServerCountSource, parse_agent_identifiers};
use konn_core::app::Options as _;
use konn_core::cli::common::FlagError;
use konn_testkit::files::{TempFile, missing_path};

fn validate(args: &[&str]) -> Result<AgentOptions, Error> {
    let mut cmd = options::command_with_env(|_| None);
    cmd.parse(args.iter().copied())
        .unwrap_or_else(|e| panic!("{args:?}: {e}"));
    AgentOptions::from_flags(cmd.flags())
}

fn err(r: Result<AgentOptions, Error>) -> Error {
    r.expect_err("must be rejected")
}

#[test]
fn files_must_exist() {
    let missing = missing_path();
    for flag in [
        "agent-key",
        "agent-cert",
        "ca-cert",
        "service-account-token-path",
        "kubeconfig",
    ] {
        let arg = format!("--{flag}={missing}");
        match err(validate(&[&arg])) {
            Error::Flag(FlagError::FileMissing { flag: f, path, .. }) => {
                assert_eq!(f, flag);
                assert_eq!(path, missing);
            }
            other => panic!("{flag}: {other}"),
        }
    }
    let f = TempFile::new("token");
    let arg = format!("--service-account-token-path={}", f.path());
    let o = validate(&[&arg]).unwrap();
    assert_eq!(o.service_account_token_path, Some(f.0.clone()));
    let arg = format!("--ca-cert={}", f.path());
    assert_eq!(validate(&[&arg]).unwrap().ca_cert, Some(f.0.clone()));
}

#[test]
fn cert_and_key_come_in_pairs() {
    let f = TempFile::new("f");
    for (set, missing) in [("agent-key", "agent-cert"), ("agent-cert", "agent-key")] {
        let arg = format!("--{set}={}", f.path());
        match err(validate(&[&arg])) {
            Error::Flag(FlagError::IncompletePair {
                set: s, missing: m, ..
            }) => assert_eq!((s, m), (set, missing)),
            other => panic!("{set}: {other}"),
        }
    }
    let cert = format!("--agent-cert={}", f.path());
    let key = format!("--agent-key={}", f.path());
    let o = validate(&[&cert, &key]).unwrap();
    let cc = o.client_cert.unwrap();
    assert_eq!(cc.cert, PathBuf::from(f.path()));
    assert_eq!(cc.key, PathBuf::from(f.path()));
    assert!(validate(&[]).unwrap().client_cert.is_none());
}

#[test]
fn ports_must_be_positive() {
    for flag in [
        "proxy-server-port",
        "health-server-port",
        "admin-server-port",
    ] {
        for bad in ["0", "-1"] {
            let arg = format!("--{flag}={bad}");
            let e = err(validate(&[&arg]));
            assert!(
                matches!(e, Error::PortNotPositive { flag: f, .. } if f == flag),
                "{e}"
            );
        }
        // Upstream has no reserved-port rule for the agent.
        let arg = format!("--{flag}=1");
        validate(&[&arg]).unwrap_or_else(|e| panic!("{flag}=1: {e}"));
        // konn refuses what is not a port at all.
        let arg = format!("--{flag}=65536");
        let e = err(validate(&[&arg]));
        assert!(
            matches!(e, Error::PortTooLarge { flag: f, port: 65536 } if f == flag),
            "{e}"
        );
        let arg = format!("--{flag}=65535");
        validate(&[&arg]).unwrap();
    }
    assert_eq!(
        err(validate(&["--proxy-server-port=0"])).to_string(),
        "--proxy-server-port must be greater than 0, not 0"
    );
    let o = validate(&[
        "--proxy-server-port=8132",
        "--health-server-port=8133",
        "--admin-server-port=8134",
    ])
    .unwrap();
    assert_eq!(
        (o.proxy_server_port, o.health.port, o.admin.port),
        (8132, 8133, 8134)
    );
}

#[test]
fn channel_size_and_profiling() {
    for bad in ["0", "-5"] {
        let arg = format!("--xfr-channel-size={bad}");
        assert!(matches!(
            err(validate(&[&arg])),
            Error::Flag(FlagError::ChannelSize(_))
        ));
    }
    assert_eq!(validate(&[]).unwrap().xfr_channel_size, 150);
    assert!(matches!(
        err(validate(&["--enable-contention-profiling"])),
        Error::Flag(FlagError::ContentionWithoutProfiling)
    ));
    let o = validate(&["--enable-contention-profiling", "--enable-profiling"]).unwrap();
    assert_eq!(o.warnings.len(), 1);
}

#[test]
fn sync_interval_not_above_cap() {
    let e = err(validate(&["--sync-interval=5s", "--sync-interval-cap=1s"]));
    assert!(matches!(e, Error::SyncIntervalAboveCap { .. }), "{e}");
    assert_eq!(
        e.to_string(),
        "--sync-interval (5s) must not be greater than --sync-interval-cap (1s)"
    );
    let o = validate(&[
        "--sync-interval=5s",
        "--sync-interval-cap=5s",
        "--probe-interval=5s",
    ])
    .unwrap();
    assert_eq!(o.sync_interval, Duration::from_secs(5));
    assert_eq!(o.sync_interval_cap, Duration::from_secs(5));
    assert_eq!(o.probe_interval, Duration::from_secs(5));
    let o = validate(&[]).unwrap();
    assert_eq!(o.sync_interval, Duration::from_secs(1));
    assert_eq!(o.sync_interval_cap, Duration::from_secs(10));
    assert_eq!(o.probe_interval, Duration::from_secs(1));
}

#[test]
fn konn_duration_checks() {
    for (args, flag) in [
        (&["--sync-interval=0s"][..], "sync-interval"),
        (&["--sync-interval=-1s"], "sync-interval"),
        (&["--probe-interval=0"], "probe-interval"),
    ] {
        let e = err(validate(args));
        assert!(
            matches!(e, Error::Flag(FlagError::NotPositive { flag: f, .. }) if f == flag),
            "{args:?}: {e}"
        );
    }
    let e = err(validate(&[
        "--sync-interval=-2s",
        "--sync-interval-cap=-1s",
    ]));
    assert!(
        matches!(
            e,
            Error::Flag(FlagError::NotPositive {
                flag: "sync-interval",
                ..
            })
        ),
        "{e}"
    );
    let e = err(validate(&["--keepalive-time=-1s"]));
    assert!(
        matches!(
            e,
            Error::Flag(FlagError::NegativeDuration {
                flag: "keepalive-time",
                ..
            })
        ),
        "{e}"
    );
    let e = err(validate(&["--drain-timeout=-1s"]));
    assert!(
        matches!(
            e,
            Error::Flag(FlagError::NegativeDuration {
                flag: "drain-timeout",
                ..
            })
        ),
        "{e}"
    );
    // konn's --drain-timeout: 0 waits for a second signal, as upstream.
    assert_eq!(validate(&[]).unwrap().drain_timeout, None);
    assert_eq!(
        validate(&["--drain-timeout=50s"]).unwrap().drain_timeout,
        Some(Duration::from_secs(50))
    );
    // Zero keepalive means "no pings" (grpc-go), accepted.
    assert_eq!(
        validate(&["--keepalive-time=0"]).unwrap().keepalive_time,
        Duration::ZERO
    );
    // Below the server's 30 s enforcement: accepted, with a warning.
    let o = validate(&["--keepalive-time=10s"]).unwrap();
    assert_eq!(o.warnings.len(), 1, "{:?}", o.warnings);
    assert!(
        validate(&["--keepalive-time=30s"])
            .unwrap()
            .warnings
            .is_empty()
    );
}

#[test]
fn agent_identifiers() {
    let ok = "host=localhost&host=node1.mydomain.com&cidr=127.0.0.1/16&ipv4=1.2.3.4&ipv4=5.6.7.8&ipv6=:::::&default-route=true";
    let arg = format!("--agent-identifiers={ok}");
    let o = validate(&[&arg]).unwrap();
    assert_eq!(o.agent_identifiers, ok);
    assert_eq!(parse_agent_identifiers(ok).unwrap().len(), 7);
    // Empty settings are skipped; escapes and '+' are decoded.
    assert_eq!(
        parse_agent_identifiers("host=a+b&&ipv4=%31.2.3.4&default-route").unwrap(),
        [
            ("host".to_owned(), "a b".to_owned()),
            ("ipv4".to_owned(), "1.2.3.4".to_owned()),
            ("default-route".to_owned(), String::new())
        ]
    );
    assert!(parse_agent_identifiers("").unwrap().is_empty());
    assert!(
        parse_agent_identifiers("%68ost=x").is_ok(),
        "keys are unescaped too"
    );

    let cases: &[(&str, &str)] = &[
        ("uid=1", "unknown identifier type \"uid\""),
        ("HOST=x", "unknown identifier type \"HOST\""),
        ("=x", "unknown identifier type \"\""),
        ("host=a;ipv4=1", "invalid semicolon separator in query"),
        ("%zz=1", "invalid URL escape \"%zz\""),
        ("host=%z", "invalid URL escape \"%z\""),
        ("host=%", "invalid URL escape \"%\""),
        // Go: a semicolon error wins over an earlier escape error.
        ("%zz=1&a;b", "invalid semicolon separator in query"),
        // The first escape error is kept.
        ("host=%zz&ipv4=%yy", "invalid URL escape \"%zz\""),
    ];
    for &(input, want) in cases {
        let arg = format!("--agent-identifiers={input}");
        let e = err(validate(&[&arg]));
        assert!(matches!(e, Error::AgentIdentifiers(_)), "{input}: {e}");
        let text = e.to_string();
        assert!(
            text.starts_with("--agent-identifiers is invalid: "),
            "{text}"
        );
        assert!(text.contains(want), "{input}: {text}");
    }
    let many = vec!["host=a"; 10_001].join("&");
    let e = parse_agent_identifiers(&many).unwrap_err();
    assert!(e.to_string().contains("exceeded limit"), "{e}");
    let max = vec!["host=a"; 10_000].join("&");
    assert!(parse_agent_identifiers(&max).is_ok());
}

#[test]
fn lease_counting() {
    validate(&["--lease-label=garbage"]).expect("not checked without --count-server-leases");
    for bad in ["", "a", "a=b=c", "a=b,"] {
        let arg = format!("--lease-label={bad}");
        let e = err(validate(&["--count-server-leases", &arg]));
        assert!(
            matches!(
                e,
                Error::Flag(FlagError::InvalidLabels {
                    flag: "lease-label",
                    ..
                })
            ),
            "{bad:?}: {e}"
        );
    }
    let o = validate(&["--count-server-leases", "--lease-namespace=konn"]).unwrap();
    let lc = o.lease_counting.as_ref().unwrap();
    assert_eq!(lc.namespace, "konn");
    assert_eq!(
        lc.selector.get("k8s-app").map(String::as_str),
        Some("konnectivity-server")
    );
    assert!(o.unsupported_features().is_empty(), "lease counting runs");
    // Upstream master's name, and the alias when only it is given.
    let o = validate(&["--count-server-leases", "--lease-label-selector=app=a"]).unwrap();
    let lc = o.lease_counting.as_ref().unwrap();
    assert_eq!(lc.selector.get("app").map(String::as_str), Some("a"));
    let o = validate(&["--count-server-leases", "--lease-label=app=b"]).unwrap();
    let lc = o.lease_counting.as_ref().unwrap();
    assert_eq!(lc.selector.get("app").map(String::as_str), Some("b"));
}

#[test]
fn server_count_source() {
    assert_eq!(
        validate(&[]).unwrap().server_count_source,
        ServerCountSource::Default
    );
    assert_eq!(
        validate(&["--server-count-source="])
            .unwrap()
            .server_count_source,
        ServerCountSource::Default
    );
    assert_eq!(
        validate(&["--server-count-source=max"])
            .unwrap()
            .server_count_source,
        ServerCountSource::Max
    );
    for bad in ["MAX", "min", "leases"] {
        let arg = format!("--server-count-source={bad}");
        let e = err(validate(&[&arg]));
        assert!(matches!(&e, Error::ServerCountSource(v) if v == bad), "{e}");
    }
}

#[test]
fn connection_settings_are_kept() {
    let o = validate(&[
        "--proxy-server-host=konnectivity.example.com",
        "--alpn-proto=konnectivity",
        "--alpn-proto=x,y",
        "--sync-forever",
        "--warn-on-channel-limit",
        "--health-server-host=0.0.0.0",
        "--admin-bind-address=::1",
        "--kube-api-content-type=application/json",
    ])
    .unwrap();
    assert_eq!(o.proxy_server_host, "konnectivity.example.com");
    assert_eq!(o.alpn_protos, ["konnectivity", "x", "y"]);
    assert!(o.sync_forever && o.warn_on_channel_limit);
    assert_eq!(o.health.bind_address, "0.0.0.0");
    assert_eq!(o.admin.bind_address, "::1");
    assert_eq!(o.kube_api_content_type, "application/json");
    assert_eq!(o.keepalive_time, Duration::from_secs(3600));
}

#[test]
fn kind_example_configuration() {
    // The flags of upstream's examples/kind agent manifest.
    let ca = TempFile::new("ca");
    let token = TempFile::new("token");
    let ca_arg = format!("--ca-cert={}", ca.path());
    let token_arg = format!("--service-account-token-path={}", token.path());
    let o = validate(&[
        "--logtostderr=true",
        &ca_arg,
        "--proxy-server-host=konnectivity-server.kube-system.svc.cluster.local",
        "--proxy-server-port=8091",
        "--sync-interval=5s",
        "--sync-interval-cap=30s",
        "--probe-interval=5s",
        &token_arg,
        "--agent-identifiers=ipv4=10.0.0.5",
        "--v=2",
    ])
    .expect("valid");
    assert_eq!(o.sync_interval_cap, Duration::from_secs(30));
    assert!(o.unsupported_features().is_empty());
}

#[test]
fn engine_flags_are_validated_too() {
    let e = err(validate(&["--h2-stream-window=1"]));
    assert!(matches!(e, Error::Flag(FlagError::Engine(_))), "{e}");
}

#[test]
fn allowed_destination_cidrs() {
    let o = validate(&[]).unwrap();
    assert!(o.allowed_destinations.allows_all());
    let o = validate(&[
        "--allowed-destination-cidrs=10.0.0.0/8:443,192.168.1.7",
        "--allowed-destination-cidrs=[fd00::/8]:8000-8999",
    ])
    .unwrap();
    let ok = |a: &str| o.allowed_destinations.permits(a.parse().unwrap());
    assert!(ok("10.9.9.9:443") && ok("192.168.1.7:22") && ok("[fd00::5]:8080"));
    assert!(!ok("10.9.9.9:80") && !ok("192.168.1.8:22") && !ok("[fd00::5]:443"));
    for bad in ["10.0.0.1/8", "127.1", "10.0.0.0/8:0", "[fe80::1%eth0]"] {
        let arg = format!("--allowed-destination-cidrs={bad}");
        let e = err(validate(&[&arg]));
        assert!(matches!(e, Error::AllowedDestinations(_)), "{bad}: {e}");
        assert!(e.to_string().contains(&arg), "{bad}: {e}");
    }
}
