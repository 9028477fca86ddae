//! Every rule of upstream proxy-server's `Validate()` (accepted and
//! rejected), konn's additional checks, the typed result and the features
//! konn refuses at start.

use std::path::PathBuf;
use std::time::Duration;

use konn_core::app::Options as _;
use konn_core::cli::common::FlagError;
use konn_core::io::tls::TlsMinVersion;
use konn_server::Error;
use konn_server::options::{
    self, DEFAULT_BACKEND_DIAL_TIMEOUT, Frontend, Mode, ProxyStrategy, ServerOptions,
};
use konn_testkit::files::{TempFile, missing_path};

fn validate(args: &[&str]) -> Result<ServerOptions, Error> {
    let mut cmd = options::command_with_env(|_| None);
    cmd.parse(args.iter().copied())
        .unwrap_or_else(|e| panic!("{args:?}: {e}"));
    ServerOptions::from_flags(cmd.flags())
}

/// A valid TCP-frontend configuration plus `extra`.
fn tcp(ca: &TempFile, extra: &[&str]) -> Result<ServerOptions, Error> {
    let ca_flag = format!("--server-ca-cert={}", ca.path());
    let mut args = vec![ca_flag.as_str()];
    args.extend_from_slice(extra);
    validate(&args)
}

fn err(r: Result<ServerOptions, Error>) -> Error {
    r.expect_err("must be rejected")
}

#[test]
fn cert_files_must_exist() {
    let ca = TempFile::new("ca");
    let missing = missing_path();
    for flag in [
        "server-key",
        "server-cert",
        "cluster-key",
        "cluster-cert",
        "cluster-ca-cert",
        "kubeconfig",
    ] {
        let arg = format!("--{flag}={missing}");
        match err(tcp(&ca, &[&arg])) {
            Error::Flag(FlagError::FileMissing {
                flag: f,
                path,
                source,
            }) => {
                assert_eq!(f, flag);
                assert_eq!(path, missing);
                assert_eq!(source.kind(), std::io::ErrorKind::NotFound);
            }
            other => panic!("{flag}: {other}"),
        }
    }
    let arg = format!("--server-ca-cert={missing}");
    let e = err(validate(&[&arg]));
    assert!(
        matches!(
            e,
            Error::Flag(FlagError::FileMissing {
                flag: "server-ca-cert",
                ..
            })
        ),
        "{e}"
    );
    assert!(e.to_string().starts_with(&format!(
        "--server-ca-cert={missing}: cannot use the file: "
    )));
}

#[test]
fn cert_and_key_come_in_pairs() {
    let ca = TempFile::new("ca");
    let f = TempFile::new("f");
    let cases = [
        ("server-key", "server-cert"),
        ("server-cert", "server-key"),
        ("cluster-key", "cluster-cert"),
        ("cluster-cert", "cluster-key"),
    ];
    for (set, missing) in cases {
        let arg = format!("--{set}={}", f.path());
        match err(tcp(&ca, &[&arg])) {
            Error::Flag(FlagError::IncompletePair {
                set: s,
                missing: m,
                value,
            }) => {
                assert_eq!((s, m), (set, missing));
                assert_eq!(value, f.path());
            }
            other => panic!("{set}: {other}"),
        }
    }
    let e = err(tcp(&ca, &[&format!("--server-key={}", f.path())]));
    assert_eq!(
        e.to_string(),
        format!(
            "--server-cert must be set when --server-key is set (--server-key={:?})",
            f.path()
        )
    );
    let both = [
        format!("--server-cert={}", f.path()),
        format!("--server-key={}", f.path()),
        format!("--cluster-cert={}", f.path()),
        format!("--cluster-key={}", f.path()),
    ];
    let both: Vec<&str> = both.iter().map(String::as_str).collect();
    let opts = tcp(&ca, &both).expect("pairs complete");
    assert_eq!(opts.agent_listener.cert, Some(PathBuf::from(f.path())));
    assert_eq!(opts.agent_listener.key, Some(PathBuf::from(f.path())));
    let Frontend::Tcp {
        cert,
        key,
        client_ca,
        port,
        ..
    } = &opts.frontend
    else {
        panic!("tcp frontend");
    };
    assert_eq!(cert.as_deref(), Some(f.0.as_path()));
    assert_eq!(key.as_deref(), Some(f.0.as_path()));
    assert_eq!(client_ca, &ca.0);
    assert_eq!(*port, 8090);
}

#[test]
fn mode() {
    let ca = TempFile::new("ca");
    assert_eq!(tcp(&ca, &[]).unwrap().mode, Mode::Grpc);
    assert_eq!(
        tcp(&ca, &["--mode=http-connect"]).unwrap().mode,
        Mode::HttpConnect
    );
    for bad in ["", "GRPC", "http"] {
        let arg = format!("--mode={bad}");
        let e = err(tcp(&ca, &[&arg]));
        assert!(matches!(&e, Error::InvalidMode(m) if m == bad), "{e}");
    }
    assert_eq!(
        err(tcp(&ca, &["--mode=x"])).to_string(),
        "--mode must be 'grpc' or 'http-connect', not \"x\""
    );
}

#[test]
fn uds_frontend_rules() {
    let opts = validate(&["--uds-name=/run/konn.sock", "--server-port=0"]).expect("uds");
    assert_eq!(
        opts.frontend,
        Frontend::Uds {
            path: PathBuf::from("/run/konn.sock"),
            delete_existing: true
        }
    );
    let opts = validate(&[
        "--uds-name=/run/konn.sock",
        "--server-port=0",
        "--delete-existing-uds-file=false",
    ])
    .unwrap();
    assert!(matches!(
        opts.frontend,
        Frontend::Uds {
            delete_existing: false,
            ..
        }
    ));

    // The default port 8090 is not 0.
    let e = err(validate(&["--uds-name=/run/konn.sock"]));
    assert!(matches!(e, Error::UdsPortNotZero(8090)), "{e}");

    let f = TempFile::new("f");
    for flag in ["server-key", "server-cert", "server-ca-cert"] {
        let mut args = vec![
            "--uds-name=/run/konn.sock".to_owned(),
            "--server-port=0".to_owned(),
            format!("--{flag}={}", f.path()),
        ];
        if flag == "server-key" {
            args.push(format!("--server-cert={}", f.path()));
        }
        if flag == "server-cert" {
            args.push(format!("--server-key={}", f.path()));
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let e = err(validate(&args));
        // Upstream checks key, then cert, then CA.
        let first = if flag == "server-ca-cert" {
            "server-ca-cert"
        } else {
            "server-key"
        };
        assert!(
            matches!(e, Error::TlsWithUds(f) if f == first),
            "{flag}: {e}"
        );
    }
}

#[test]
fn tcp_frontend_needs_ca() {
    let e = err(validate(&[]));
    assert!(matches!(e, Error::TcpFrontendNeedsCa), "{e}");
    assert_eq!(
        e.to_string(),
        "--server-ca-cert must be set when the frontend listens on TCP (--uds-name is empty)"
    );
}

#[test]
fn ephemeral_ports_rejected() {
    let ca = TempFile::new("ca");
    for flag in ["server-port", "agent-port", "admin-port", "health-port"] {
        let arg = format!("--{flag}=49152");
        let e = err(tcp(&ca, &[&arg]));
        assert!(
            matches!(e, Error::EphemeralPort { flag: f, port: 49152 } if f == flag),
            "{flag}: {e}"
        );
        let arg = format!("--{flag}=49151");
        tcp(&ca, &[&arg]).unwrap_or_else(|e| panic!("{flag}=49151: {e}"));
    }
    assert_eq!(
        err(tcp(&ca, &["--agent-port=60000"])).to_string(),
        "--agent-port=60000 is in the ephemeral port range (above 49151); choose a lower port"
    );
}

#[test]
fn reserved_ports_rejected() {
    let ca = TempFile::new("ca");
    for flag in ["server-port", "agent-port", "admin-port", "health-port"] {
        for bad in ["1023", "0", "-1"] {
            let arg = format!("--{flag}={bad}");
            let e = err(tcp(&ca, &[&arg]));
            assert!(
                matches!(e, Error::ReservedPort { flag: f, .. } if f == flag),
                "{flag}={bad}: {e}"
            );
        }
        let arg = format!("--{flag}=1024");
        tcp(&ca, &[&arg]).unwrap_or_else(|e| panic!("{flag}=1024: {e}"));
    }
    // Ephemeral is checked for all ports before reserved (upstream order).
    let e = err(tcp(&ca, &["--health-port=80", "--agent-port=50000"]));
    assert!(
        matches!(
            e,
            Error::EphemeralPort {
                flag: "agent-port",
                ..
            }
        ),
        "{e}"
    );
    // With a Unix socket frontend, server-port 0 is fine.
    validate(&["--uds-name=/x.sock", "--server-port=0"]).unwrap();
}

#[test]
fn ports_become_u16() {
    let ca = TempFile::new("ca");
    let o = tcp(
        &ca,
        &[
            "--agent-port=2000",
            "--admin-port=0x7d1",
            "--health-port=2002",
            "--server-port=2003",
        ],
    )
    .unwrap();
    assert_eq!(o.agent_listener.port, 2000);
    assert_eq!(o.admin.port, 2001);
    assert_eq!(o.health.port, 2002);
    assert!(matches!(o.frontend, Frontend::Tcp { port: 2003, .. }));
    assert_eq!(o.admin.bind_address, "127.0.0.1");
    assert_eq!(o.health.bind_address, "");
}

#[test]
fn contention_profiling_requires_profiling() {
    let ca = TempFile::new("ca");
    let e = err(tcp(&ca, &["--enable-contention-profiling"]));
    assert!(
        matches!(e, Error::Flag(FlagError::ContentionWithoutProfiling)),
        "{e}"
    );
    let o = tcp(
        &ca,
        &["--enable-contention-profiling", "--enable-profiling"],
    )
    .unwrap();
    assert!(o.enable_profiling && o.enable_contention_profiling);
    assert_eq!(o.warnings.len(), 1, "konn has no pprof: {:?}", o.warnings);
}

#[test]
fn token_auth_rules() {
    let ca = TempFile::new("ca");
    let trio = [
        "--agent-namespace=kube-system",
        "--agent-service-account=konnectivity-agent",
        "--authentication-audience=system:konnectivity-server",
    ];
    for missing in 0..3 {
        let args: Vec<&str> = trio
            .iter()
            .enumerate()
            .filter(|&(i, _)| i != missing)
            .map(|(_, a)| *a)
            .collect();
        let e = err(tcp(&ca, &args));
        let flag = [
            "agent-namespace",
            "agent-service-account",
            "authentication-audience",
        ][missing];
        assert!(
            matches!(e, Error::TokenAuthIncomplete(f) if f == flag),
            "{e}"
        );
    }
    let cluster_ca = format!("--cluster-ca-cert={}", ca.path());
    let e = err(tcp(&ca, &[trio[0], &cluster_ca]));
    assert!(matches!(e, Error::TokenAuthWithClusterCa), "{e}");

    let o = tcp(&ca, &trio).expect("complete token auth validates");
    let auth = o.token_auth.as_ref().unwrap();
    assert_eq!(auth.namespace, "kube-system");
    assert_eq!(auth.service_account, "konnectivity-agent");
    assert_eq!(auth.audience, "system:konnectivity-server");
    assert!(o.unsupported_features().is_empty(), "token auth runs");

    // Without token auth, --cluster-ca-cert is fine (agent mTLS).
    let o = tcp(&ca, &[&cluster_ca]).unwrap();
    assert_eq!(o.agent_listener.client_ca.as_deref(), Some(ca.0.as_path()));
    assert!(o.token_auth.is_none());
}

#[test]
fn proxy_strategies() {
    let ca = TempFile::new("ca");
    assert_eq!(
        tcp(&ca, &[]).unwrap().proxy_strategies,
        [ProxyStrategy::Default]
    );
    let o = tcp(
        &ca,
        &["--proxy-strategies=destHost,,defaultRoute,default,default"],
    )
    .unwrap();
    assert_eq!(
        o.proxy_strategies,
        [
            ProxyStrategy::DestHost,
            ProxyStrategy::DefaultRoute,
            ProxyStrategy::Default,
            ProxyStrategy::Default
        ]
    );
    for empty in ["", ",", ",,"] {
        let arg = format!("--proxy-strategies={empty}");
        assert!(
            matches!(err(tcp(&ca, &[&arg])), Error::EmptyProxyStrategies),
            "{empty:?}"
        );
    }
    for bad in ["desthost", "default, destHost", "destCIDR"] {
        let arg = format!("--proxy-strategies={bad}");
        assert!(
            matches!(err(tcp(&ca, &[&arg])), Error::UnknownProxyStrategy(_)),
            "{bad:?}"
        );
    }
}

#[test]
fn channel_size_must_be_positive() {
    let ca = TempFile::new("ca");
    for bad in ["0", "-1"] {
        let arg = format!("--xfr-channel-size={bad}");
        assert!(
            matches!(
                err(tcp(&ca, &[&arg])),
                Error::Flag(FlagError::ChannelSize(_))
            ),
            "{bad}"
        );
    }
    assert_eq!(
        tcp(&ca, &["--xfr-channel-size=1"])
            .unwrap()
            .xfr_channel_size,
        1
    );
    assert_eq!(tcp(&ca, &[]).unwrap().xfr_channel_size, 10);
}

#[test]
fn tls_min_version() {
    let ca = TempFile::new("ca");
    assert_eq!(tcp(&ca, &[]).unwrap().tls_min_version, TlsMinVersion::Tls12);
    assert_eq!(
        tcp(&ca, &["--tls-min-version=VersionTLS12"])
            .unwrap()
            .tls_min_version,
        TlsMinVersion::Tls12
    );
    assert_eq!(
        tcp(&ca, &["--tls-min-version=VersionTLS13"])
            .unwrap()
            .tls_min_version,
        TlsMinVersion::Tls13
    );
    for old in ["VersionTLS10", "VersionTLS11"] {
        let arg = format!("--tls-min-version={old}");
        let o = tcp(&ca, &[&arg]).expect("accepted with a warning, as upstream");
        assert_eq!(o.tls_min_version, TlsMinVersion::Tls12);
        assert_eq!(o.warnings.len(), 1);
        assert!(o.warnings[0].contains("below TLS 1.2"), "{:?}", o.warnings);
    }
    for bad in ["tls12", " VersionTLS12", "VersionTLS14", "1.2"] {
        let arg = format!("--tls-min-version={bad}");
        let e = err(tcp(&ca, &[&arg]));
        assert!(
            matches!(&e, Error::UnknownTlsVersion(v) if v == bad),
            "{bad:?}: {e}"
        );
    }
}

#[test]
fn cipher_suites() {
    let ca = TempFile::new("ca");
    let o = tcp(
        &ca,
        &["--cipher-suites=TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256"],
    )
    .unwrap();
    assert_eq!(
        o.cipher_suites,
        [
            "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
            "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256"
        ]
    );
    // TLS 1.3 names are accepted (and have no effect upstream).
    tcp(&ca, &["--cipher-suites=TLS_AES_128_GCM_SHA256"]).unwrap();
    // Upstream refuses Go's insecure suites, unknown names and aliases.
    for bad in [
        "TLS_RSA_WITH_RC4_128_SHA",
        "TLS_RSA_WITH_AES_128_GCM_SHA256",
        "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305",
        "nope",
        "[]",
        " TLS_AES_128_GCM_SHA256",
    ] {
        let arg = format!("--cipher-suites={bad}");
        let e = err(tcp(&ca, &[&arg]));
        assert!(
            matches!(&e, Error::CipherSuite { name, .. } if name == bad.trim_start() || name == bad),
            "{bad}: {e}"
        );
    }
    // Go accepts the ECDHE CBC suites; konn's TLS library has no CBC mode.
    let e = err(tcp(
        &ca,
        &["--cipher-suites=TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA"],
    ));
    assert!(e.to_string().contains("CBC"), "{e}");
}

#[test]
fn lease_labels_checked_only_with_the_controller() {
    let ca = TempFile::new("ca");
    tcp(&ca, &["--lease-label=garbage"]).expect("not checked when the controller is off");
    for bad in ["", "a", "a=b=c", "a=b,"] {
        let arg = format!("--lease-label={bad}");
        let e = err(tcp(&ca, &["--enable-lease-controller", &arg]));
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
    let o = tcp(
        &ca,
        &["--enable-lease-controller", "--lease-label= a = b ,c=d"],
    )
    .unwrap();
    let lease = o.lease_controller.as_ref().unwrap();
    assert_eq!(lease.namespace, "kube-system");
    assert_eq!(
        lease
            .labels
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect::<Vec<_>>(),
        [("a", "b"), ("c", "d")]
    );
    assert!(
        o.unsupported_features().is_empty(),
        "the lease controller runs"
    );
}

#[test]
fn durations() {
    let ca = TempFile::new("ca");
    let o = tcp(&ca, &[]).unwrap();
    assert_eq!(o.graceful_shutdown_timeout, None);
    assert_eq!(o.backend_dial_timeout, DEFAULT_BACKEND_DIAL_TIMEOUT);
    assert_eq!(o.agent_listener.keepalive_time, Duration::from_secs(3600));
    assert_eq!(o.frontend_keepalive_time, Duration::from_secs(3600));

    let o = tcp(
        &ca,
        &[
            "--graceful-shutdown-timeout=30s",
            "--backend-dial-timeout=5s",
            "--keepalive-time=60s",
            "--frontend-keepalive-time=1m",
        ],
    )
    .unwrap();
    assert_eq!(o.graceful_shutdown_timeout, Some(Duration::from_secs(30)));
    assert_eq!(o.backend_dial_timeout, Duration::from_secs(5));
    assert_eq!(o.agent_listener.keepalive_time, Duration::from_secs(60));
    assert_eq!(o.frontend_keepalive_time, Duration::from_secs(60));

    for flag in [
        "graceful-shutdown-timeout",
        "backend-dial-timeout",
        "keepalive-time",
        "frontend-keepalive-time",
        "connect-header-timeout",
    ] {
        let arg = format!("--{flag}=-1s");
        let e = err(tcp(&ca, &[&arg]));
        assert!(
            matches!(e, Error::Flag(FlagError::NegativeDuration { flag: f, .. }) if f == flag),
            "{flag}: {e}"
        );
        assert_eq!(
            e.to_string(),
            format!("--{flag} must not be negative, not -1s")
        );
    }
}

#[test]
fn backend_dial_timeout_is_always_bounded() {
    // konn's deliberate difference: 0 (upstream: no limit) is a bound.
    assert_eq!(DEFAULT_BACKEND_DIAL_TIMEOUT, Duration::from_secs(30));
    assert!(
        DEFAULT_BACKEND_DIAL_TIMEOUT > Duration::from_secs(5),
        "beyond the agent's dial timeout"
    );
    let ca = TempFile::new("ca");
    let o = tcp(&ca, &["--backend-dial-timeout=0"]).unwrap();
    assert_eq!(o.backend_dial_timeout, DEFAULT_BACKEND_DIAL_TIMEOUT);
    let o = tcp(&ca, &["--backend-dial-timeout=1ns"]).unwrap();
    assert_eq!(o.backend_dial_timeout, Duration::from_nanos(1));
}

#[test]
fn connect_header_timeout_zero_disables_it() {
    let ca = TempFile::new("ca");
    assert_eq!(
        tcp(&ca, &[]).unwrap().connect_header_timeout,
        Some(Duration::from_secs(60))
    );
    assert_eq!(
        tcp(&ca, &["--connect-header-timeout=0"])
            .unwrap()
            .connect_header_timeout,
        None
    );
}

#[test]
fn reverse_flags() {
    let ca = TempFile::new("ca");
    let o = tcp(&ca, &[]).unwrap();
    assert!(o.reverse.allowed_destination.is_empty());
    assert_eq!((o.reverse.max_per_agent, o.reverse.dial_rate), (256, 100));
    let o = tcp(
        &ca,
        &[
            "--allowed-destination=10.0.0.10:6443",
            "--allowed-destination=kubernetes.default.svc:443,[fd00::1]:6443",
            "--reverse-max-per-agent=3",
            "--reverse-dial-rate=7",
            "--reverse-dial-timeout=2s",
        ],
    )
    .unwrap();
    let (settings, router) = o.reverse.settings().unwrap();
    assert_eq!(settings.destinations.len(), 3);
    assert_eq!(settings.dial_timeout, Duration::from_secs(2));
    assert_eq!(router.allowed.get("kubernetes.default.svc:443"), Some(&1));
    assert_eq!((router.max_per_agent, router.burst), (3, 7));
    let long_name = format!("--allowed-destination={}example:443", "a.".repeat(124));
    let long_label = format!("--allowed-destination={}.example:443", "a".repeat(64));
    // Each bad entry is named with its problem; nothing starts.
    for (bad, says) in [
        ("--allowed-destination=10.0.0.10", "10.0.0.10"),
        ("--allowed-destination=0.0.0.0:6443", "unspecified"),
        ("--allowed-destination=10.0.0.10:0", "10.0.0.10:0"),
        ("--allowed-destination=kube..local:443", "kube..local:443"),
        (&long_name, "longer than 253 bytes"),
        (&long_label, "1-63 bytes"),
        ("--reverse-max-per-agent=0", "--reverse-max-per-agent=0"),
        ("--reverse-dial-rate=-1", "--reverse-dial-rate=-1"),
        ("--reverse-dial-timeout=0s", "--reverse-dial-timeout"),
    ] {
        let e = err(tcp(&ca, &[bad]));
        assert!(matches!(e, Error::Reverse(_)), "{bad}: {e}");
        assert!(e.to_string().contains(says), "{bad}: {e}");
    }
}

#[test]
fn server_identity_and_count() {
    let ca = TempFile::new("ca");
    let o = tcp(&ca, &["--server-id=s1", "--server-count=3"]).unwrap();
    assert_eq!(o.server_id, "s1");
    assert_eq!(o.server_count, 3);
    assert_eq!(tcp(&ca, &["--server-count=0"]).unwrap().server_count, 0);
    let e = err(tcp(&ca, &["--server-count=-1"]));
    assert!(
        matches!(
            e,
            Error::Flag(FlagError::NegativeCount {
                flag: "server-count",
                value: -1
            })
        ),
        "{e}"
    );
}

#[test]
fn kube_client_settings_are_kept() {
    let ca = TempFile::new("ca");
    let kc = TempFile::new("kubeconfig");
    let arg = format!("--kubeconfig={}", kc.path());
    let o = tcp(
        &ca,
        &[
            &arg,
            "--kubeconfig-qps=75",
            "--kubeconfig-burst=150",
            "--kube-api-content-type=application/json",
        ],
    )
    .unwrap();
    assert_eq!(o.kube_client.kubeconfig.as_deref(), Some(kc.0.as_path()));
    assert!((o.kube_client.qps - 75.0).abs() < f32::EPSILON);
    assert_eq!(o.kube_client.burst, 150);
    assert_eq!(o.kube_client.content_type, "application/json");
    assert!(
        o.unsupported_features().is_empty(),
        "a kubeconfig alone needs no client"
    );
}

#[test]
fn engine_flags_are_validated_too() {
    let ca = TempFile::new("ca");
    let e = err(tcp(&ca, &["--workers=-1"]));
    assert!(matches!(e, Error::Flag(FlagError::Engine(_))), "{e}");
    let o = tcp(
        &ca,
        &["--io-engine=epoll", "--workers=2", "--memory-budget=64Mi"],
    )
    .unwrap();
    assert_eq!(o.engine.workers, 2);
    assert_eq!(o.engine.memory_budget, 64 << 20);
    // Resume: 10 s by default, 0 turns it off, a bound above.
    let window = |args: &[&str]| tcp(&ca, args).map(|o| o.engine.resume_window);
    assert_eq!(window(&[]).unwrap(), Some(Duration::from_secs(10)));
    assert_eq!(window(&["--resume-window=0"]).unwrap(), None);
    let e = err(tcp(&ca, &["--resume-window=1h"]));
    assert_eq!(
        e.to_string(),
        "--resume-window=1h0m0s is out of range: must be at most 10m0s (0 disables resume)"
    );
}

#[test]
fn gce_style_configuration() {
    // The flags upstream's GCE scripts pass (cluster/gce/gci/configure-helper.sh).
    let f = TempFile::new("f");
    let cert = format!("--cluster-cert={}", f.path());
    let key = format!("--cluster-key={}", f.path());
    let o = validate(&[
        "--logtostderr=true",
        "--log-file-max-size=0",
        "--uds-name=/etc/srv/kubernetes/konnectivity-server/konnectivity-server.socket",
        "--delete-existing-uds-file",
        "--server-port=0",
        "--agent-port=8132",
        "--health-port=8133",
        "--admin-port=8134",
        "--kubeconfig-qps=75",
        "--kubeconfig-burst=150",
        "--keepalive-time=60s",
        "--frontend-keepalive-time=60s",
        "--mode=grpc",
        "--proxy-strategies=default",
        &cert,
        &key,
    ])
    .expect("valid");
    assert_eq!(o.agent_listener.port, 8132);
    assert!(matches!(o.frontend, Frontend::Uds { .. }));
}

#[test]
fn admission_limits_are_off_by_default_and_checked() {
    let ca = TempFile::new("ca");
    let o = tcp(&ca, &[]).unwrap();
    assert!(!o.limits.enabled(), "{:?}", o.limits);
    let o = tcp(
        &ca,
        &[
            "--max-agent-connections=3",
            "--max-agent-dial-rate=4",
            "--max-destination-connections=5",
            "--max-destination-dial-rate=6",
            "--max-frontend-connections=7",
            "--max-frontend-dial-rate=8",
            "--max-cluster-connections=9",
            "--max-cluster-dial-rate=10",
            "--memory-budget=100Mi",
            "--overload-memory-watermark=0.5",
        ],
    )
    .unwrap();
    let l = o.limits;
    assert_eq!(
        (l.agent.max_conns, l.agent.rate, l.agent.burst),
        (3, 4.0, 4)
    );
    assert_eq!((l.dest.max_conns, l.dest.rate), (5, 6.0));
    assert_eq!((l.frontend.max_conns, l.frontend.rate), (7, 8.0));
    assert_eq!((l.cluster.max_conns, l.cluster.rate), (9, 10.0));
    assert_eq!(l.overload_high, 50 << 20);
    assert_eq!(l.overload_low, (50 << 20) / 10 * 9);
    for (bad, says) in [
        ("--max-agent-connections=-1", "--max-agent-connections=-1"),
        (
            "--max-destination-dial-rate=-5",
            "--max-destination-dial-rate=-5",
        ),
        (
            "--max-cluster-connections=5000000000",
            "--max-cluster-connections",
        ),
        (
            "--overload-memory-watermark=1.5",
            "--overload-memory-watermark=1.5",
        ),
        (
            "--overload-memory-watermark=-0.1",
            "--overload-memory-watermark",
        ),
    ] {
        let e = err(tcp(&ca, &[bad]));
        assert!(matches!(e, Error::Limits(_)), "{bad}: {e}");
        assert!(e.to_string().contains(says), "{bad}: {e}");
    }
}
