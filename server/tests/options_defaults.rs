//! proxy-server's flags against upstream v0.36.0: names, pflag types,
//! defaults (as pflag renders them), hidden/deprecated flags, env defaults,
//! and `--help`.
//!
//! The upstream table was produced by upstream's own option code (v0.36.0
//! `NewProxyRunOptions().Flags()` plus klog v2.140 flags normalised and with
//! `-v=4`, as in its `main.go`), listing pflag's `Name`, `Value.Type()` and
//! `DefValue`.

use konn_core::app::Options as _;
use konn_core::cli::{Outcome, Section};
use konn_server::options::{self, ServerFlags, ServerOptions};

/// (name, pflag type, default as rendered, hidden) of every upstream flag.
const UPSTREAM: &[(&str, &str, &str, bool)] = &[
    ("add-dir-header", "bool", "false", false),
    ("admin-bind-address", "string", "127.0.0.1", false),
    ("admin-port", "int", "8095", false),
    ("agent-bind-address", "string", "", false),
    ("agent-namespace", "string", "", false),
    ("agent-port", "int", "8091", false),
    ("agent-service-account", "string", "", false),
    ("alsologtostderr", "bool", "false", false),
    ("alsologtostderrthreshold", "severity", "0", false),
    ("authentication-audience", "string", "", false),
    ("backend-dial-timeout", "duration", "0s", false),
    ("cipher-suites", "stringSlice", "[]", false),
    ("cluster-ca-cert", "string", "", false),
    ("cluster-cert", "string", "", false),
    ("cluster-key", "string", "", false),
    ("delete-existing-uds-file", "bool", "true", false),
    ("enable-contention-profiling", "bool", "false", false),
    ("enable-lease-controller", "bool", "false", false),
    ("enable-profiling", "bool", "false", false),
    ("frontend-keepalive-time", "duration", "1h0m0s", false),
    ("graceful-shutdown-timeout", "duration", "0s", false),
    ("health-bind-address", "string", "", false),
    ("health-port", "int", "8092", false),
    ("keepalive-time", "duration", "1h0m0s", false),
    (
        "kube-api-content-type",
        "string",
        "application/vnd.kubernetes.protobuf",
        false,
    ),
    ("kubeconfig", "string", "", false),
    ("kubeconfig-burst", "int", "0", false),
    ("kubeconfig-qps", "float32", "0", false),
    (
        "lease-label",
        "string",
        "k8s-app=konnectivity-server",
        false,
    ),
    ("lease-namespace", "string", "kube-system", false),
    ("legacy-stderr-threshold-behavior", "bool", "true", false),
    ("log-backtrace-at", "traceLocation", ":0", false),
    ("log-dir", "string", "", false),
    ("log-file", "string", "", false),
    ("log-file-max-size", "uint64", "1800", false),
    ("logtostderr", "bool", "true", false),
    ("mode", "string", "grpc", false),
    ("one-output", "bool", "false", false),
    ("proxy-strategies", "string", "default", false),
    ("server-bind-address", "string", "", false),
    ("server-ca-cert", "string", "", false),
    ("server-cert", "string", "", false),
    ("server-count", "int", "1", false),
    ("server-id", "string", "<uuid>", false),
    ("server-key", "string", "", false),
    ("server-port", "int", "8090", false),
    ("skip-headers", "bool", "false", false),
    ("skip-log-headers", "bool", "false", false),
    ("stderrthreshold", "severity", "2", false),
    ("tls-min-version", "string", "", false),
    ("uds-name", "string", "", false),
    ("v", "Level", "4", false),
    ("vmodule", "moduleSpec", "", false),
    ("warn-on-channel-limit", "bool", "true", true),
    ("xfr-channel-size", "int", "10", false),
];

/// konn's own flags and their defaults.
const KONN: &[(&str, &str, &str)] = &[
    ("allowed-destination", "stringSlice", "[]"),
    ("audit-log-maxbackup", "int", "5"),
    ("audit-log-maxsize", "int", "100"),
    ("audit-log-path", "string", ""),
    ("audit-log-queue-size", "int", "10000"),
    ("clusters-config", "string", ""),
    ("conn-queue-size", "size", "1Mi"),
    ("connect-header-timeout", "duration", "1m0s"),
    ("grpc-max-message-size", "size", "4Mi"),
    ("h2-conn-window", "size", "4Mi"),
    ("h2-max-concurrent-streams", "int", "1024"),
    ("h2-stream-window", "size", "1Mi"),
    ("idle-timeout", "duration", "5m0s"),
    ("io-engine", "string", "epoll"),
    ("max-agent-connections", "int", "0"),
    ("max-agent-dial-rate", "int", "0"),
    ("max-cluster-connections", "int", "0"),
    ("max-cluster-dial-rate", "int", "0"),
    ("max-destination-connections", "int", "0"),
    ("max-destination-dial-rate", "int", "0"),
    ("max-frontend-connections", "int", "0"),
    ("max-frontend-dial-rate", "int", "0"),
    ("memory-budget", "size", "512Mi"),
    ("metrics-per-destination-limit", "int", "0"),
    ("overload-memory-watermark", "float32", "0"),
    ("pin-cores", "bool", "false"),
    ("preface-timeout", "duration", "2m0s"),
    ("resume-window", "duration", "10s"),
    ("reverse-dial-rate", "int", "100"),
    ("reverse-dial-timeout", "duration", "10s"),
    ("reverse-max-per-agent", "int", "256"),
    ("stuck-timeout", "duration", "2m0s"),
    ("tls-reload-interval", "duration", "10s"),
    ("workers", "int", "0"),
    ("write-timeout", "duration", "1m0s"),
];

fn is_uuid(s: &str) -> bool {
    let parts: Vec<&str> = s.split('-').collect();
    parts.iter().map(|p| p.len()).eq([8, 4, 4, 4, 12])
        && s.chars().all(|c| c == '-' || c.is_ascii_hexdigit())
}

#[test]
fn every_upstream_flag_with_its_type_and_default() {
    let cmd = options::command_with_env(|_| None);
    let flags = cmd.flags();
    let got: Vec<_> = flags
        .flags()
        .into_iter()
        .filter(|f| f.section() == Section::Upstream && f.name() != "help")
        .map(|f| {
            let default = if f.name() == "server-id" {
                assert!(is_uuid(f.default_text()), "{}", f.default_text());
                "<uuid>"
            } else {
                f.default_text()
            };
            (f.name(), f.type_name(), default, f.is_hidden())
        })
        .collect();
    assert_eq!(got, UPSTREAM);
}

#[test]
fn konn_flags_are_separate() {
    let cmd = options::command_with_env(|_| None);
    let got: Vec<_> = cmd
        .flags()
        .flags()
        .into_iter()
        .filter(|f| f.section() == Section::Konn)
        .map(|f| (f.name(), f.type_name(), f.default_text()))
        .collect();
    assert_eq!(got, KONN);
}

#[test]
fn deprecated_flag_is_hidden_and_warns() {
    let mut cmd = options::command_with_env(|_| None);
    let flag = cmd.flags().lookup("warn-on-channel-limit").unwrap();
    assert!(flag.is_hidden());
    assert_eq!(
        flag.deprecation(),
        Some(
            "This behavior is now thread safe and always on. This flag will be removed in a future release."
        )
    );
    let Ok(Outcome::Run(parsed)) = cmd.parse(["--warn-on-channel-limit=false"]) else {
        panic!("must parse");
    };
    // The exact line upstream's pflag prints.
    assert_eq!(
        parsed.warnings,
        [
            "Flag --warn-on-channel-limit has been deprecated, This behavior is now thread safe and always on. This flag will be removed in a future release."
        ]
    );
}

#[test]
fn defaults_struct_matches_registration() {
    let env = |k: &str| (k == "PROXY_SERVER_ID").then(|| "fixed".to_owned());
    let cmd = options::command_with_env(env);
    assert_eq!(
        ServerFlags::from_flags(cmd.flags()),
        ServerFlags::defaults(&env)
    );
}

#[test]
fn server_id_from_env_unless_flag_given() {
    let env = |k: &str| (k == "PROXY_SERVER_ID").then(|| "from-env".to_owned());
    let mut cmd = options::command_with_env(env);
    assert_eq!(
        cmd.flags().lookup("server-id").unwrap().default_text(),
        "from-env"
    );
    cmd.parse(Vec::<String>::new()).unwrap();
    assert_eq!(cmd.flags().get_string("server-id"), "from-env");

    let mut cmd = options::command_with_env(env);
    cmd.parse(["--server-id=from-flag"]).unwrap();
    assert_eq!(cmd.flags().get_string("server-id"), "from-flag");

    // An empty variable is ignored, as upstream's `!= ""` check.
    let cmd = options::command_with_env(|_| Some(String::new()));
    assert!(is_uuid(&cmd.flags().get_string("server-id")));
    // Two processes get different IDs.
    let other = options::command_with_env(|_| None);
    assert_ne!(
        cmd.flags().get_string("server-id"),
        other.flags().get_string("server-id")
    );
}

#[test]
fn help_lists_every_visible_flag() {
    let mut cmd = options::command_with_env(|_| None);
    assert_eq!(cmd.parse(["--help"]).unwrap(), Outcome::Help);
    let help = cmd.help();
    let konn_at = help.find("\nkonn flags").expect("konn section");
    for &(name, _, _, hidden) in UPSTREAM {
        let needle = if name == "v" {
            "  -v, --v Level ".to_owned()
        } else {
            format!("      --{name}")
        };
        assert_eq!(help[..konn_at].contains(&needle), !hidden, "{name}");
    }
    for &(name, _, _) in KONN {
        assert!(
            help[konn_at..].contains(&format!("      --{name} ")),
            "{name}"
        );
        assert!(
            !help[..konn_at].contains(&format!("\n      --{name} ")),
            "{name}"
        );
    }
    assert!(help.contains("  -h, --help "));
    assert!(help.contains("(default \"k8s-app=konnectivity-server\")"));
    assert!(help.contains("--keepalive-time duration "));
    assert!(help.contains("(default 1h0m0s)"));
    assert!(help.contains("--cipher-suites strings "));
    assert!(help.contains("--kubeconfig-qps float32 "));
    assert!(help.contains("--log-file-max-size uint "));
}

#[test]
fn defaults_validate_once_the_tcp_frontend_has_its_ca() {
    let mut cmd = options::command_with_env(|_| None);
    cmd.parse(["--server-ca-cert=/"]).unwrap();
    let opts = ServerOptions::from_flags(cmd.flags()).expect("valid");
    assert!(opts.unsupported_features().is_empty());
    assert!(opts.warnings.is_empty());
}
