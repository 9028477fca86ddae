//! proxy-agent's flags against upstream v0.36.0: names, pflag types,
//! defaults (as pflag renders them), env defaults, and `--help`.
//!
//! The upstream table was produced by upstream's own option code (v0.36.0
//! `NewGrpcProxyAgentOptions().Flags()` plus klog v2.140 flags normalised
//! and with `-v=4`, as in its `main.go`), listing pflag's `Name`,
//! `Value.Type()` and `DefValue`. In v0.36.0 `--lease-label` and
//! `--warn-on-channel-limit` are ordinary, visible agent flags (the
//! `--lease-label-selector` rename is on upstream's master only).

use konn_agent::options::{self, AgentFlags, AgentOptions};
use konn_core::app::Options as _;
use konn_core::cli::{Outcome, Section};

/// (name, pflag type, default as rendered) of every upstream flag.
const UPSTREAM: &[(&str, &str, &str)] = &[
    ("add-dir-header", "bool", "false"),
    ("admin-bind-address", "string", "127.0.0.1"),
    ("admin-server-port", "int", "8094"),
    ("agent-cert", "string", ""),
    ("agent-id", "string", "<uuid>"),
    ("agent-identifiers", "string", ""),
    ("agent-key", "string", ""),
    ("alpn-proto", "stringSlice", "[]"),
    ("alsologtostderr", "bool", "false"),
    ("alsologtostderrthreshold", "severity", "0"),
    ("ca-cert", "string", ""),
    ("count-server-leases", "bool", "false"),
    ("enable-contention-profiling", "bool", "false"),
    ("enable-profiling", "bool", "false"),
    ("health-server-host", "string", ""),
    ("health-server-port", "int", "8093"),
    ("keepalive-time", "duration", "1h0m0s"),
    (
        "kube-api-content-type",
        "string",
        "application/vnd.kubernetes.protobuf",
    ),
    ("kubeconfig", "string", ""),
    ("lease-label", "string", "k8s-app=konnectivity-server"),
    ("lease-namespace", "string", "kube-system"),
    ("legacy-stderr-threshold-behavior", "bool", "true"),
    ("log-backtrace-at", "traceLocation", ":0"),
    ("log-dir", "string", ""),
    ("log-file", "string", ""),
    ("log-file-max-size", "uint64", "1800"),
    ("logtostderr", "bool", "true"),
    ("one-output", "bool", "false"),
    ("probe-interval", "duration", "1s"),
    ("proxy-server-host", "string", "127.0.0.1"),
    ("proxy-server-port", "int", "8091"),
    ("server-count-source", "string", "default"),
    ("service-account-token-path", "string", ""),
    ("skip-headers", "bool", "false"),
    ("skip-log-headers", "bool", "false"),
    ("stderrthreshold", "severity", "2"),
    ("sync-forever", "bool", "false"),
    ("sync-interval", "duration", "1s"),
    ("sync-interval-cap", "duration", "10s"),
    ("v", "Level", "4"),
    ("vmodule", "moduleSpec", ""),
    ("warn-on-channel-limit", "bool", "false"),
    ("xfr-channel-size", "int", "150"),
];

/// konn's own flags and their defaults.
const KONN: &[(&str, &str, &str)] = &[
    ("allowed-destination-cidrs", "stringSlice", "[]"),
    ("bind-address", "string", ""),
    ("conn-queue-size", "size", "1Mi"),
    ("drain-timeout", "duration", "0s"),
    ("grpc-max-message-size", "size", "4Mi"),
    ("h2-conn-window", "size", "4Mi"),
    ("h2-max-concurrent-streams", "int", "1024"),
    ("h2-stream-window", "size", "1Mi"),
    ("idle-timeout", "duration", "5m0s"),
    ("io-engine", "string", "epoll"),
    ("memory-budget", "size", "512Mi"),
    ("pin-cores", "bool", "false"),
    ("preface-timeout", "duration", "2m0s"),
    ("resume-window", "duration", "10s"),
    ("stuck-timeout", "duration", "2m0s"),
    ("target", "stringSlice", "[]"),
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
    let got: Vec<_> = cmd
        .flags()
        .flags()
        .into_iter()
        .filter(|f| {
            f.section() == Section::Upstream
                && f.name() != "help"
                && f.name() != "lease-label-selector"
        })
        .map(|f| {
            // v0.36.0's --lease-label is a hidden, deprecated alias of
            // master's --lease-label-selector.
            assert_eq!(f.is_hidden(), f.name() == "lease-label", "{}", f.name());
            let default = if f.name() == "agent-id" {
                assert!(is_uuid(f.default_text()), "{}", f.default_text());
                "<uuid>"
            } else {
                f.default_text()
            };
            (f.name(), f.type_name(), default)
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
fn defaults_struct_matches_registration() {
    let env = |k: &str| (k == "PROXY_AGENT_ID").then(|| "fixed".to_owned());
    let cmd = options::command_with_env(env);
    assert_eq!(
        AgentFlags::from_flags(cmd.flags()),
        AgentFlags::defaults(&env)
    );
}

#[test]
fn agent_id_from_env_unless_flag_given() {
    let env = |k: &str| (k == "PROXY_AGENT_ID").then(|| "node-1".to_owned());
    let mut cmd = options::command_with_env(env);
    cmd.parse(Vec::<String>::new()).unwrap();
    assert_eq!(cmd.flags().get_string("agent-id"), "node-1");
    let mut cmd = options::command_with_env(env);
    cmd.parse(["--agent-id", "flag-wins"]).unwrap();
    assert_eq!(cmd.flags().get_string("agent-id"), "flag-wins");
    let cmd = options::command_with_env(|_| Some(String::new()));
    assert!(is_uuid(&cmd.flags().get_string("agent-id")));
}

#[test]
fn help_lists_every_flag() {
    let mut cmd = options::command_with_env(|_| None);
    assert_eq!(cmd.parse(["-h"]).unwrap(), Outcome::Help);
    let help = cmd.help();
    assert!(help.contains("Usage:\n  proxy-agent [flags]\n"));
    let konn_at = help.find("\nkonn flags").expect("konn section");
    assert!(help[..konn_at].contains("\n      --lease-label-selector string "));
    for &(name, _, _) in UPSTREAM {
        if name == "lease-label" {
            assert!(!help.contains("--lease-label "), "hidden");
            continue;
        }
        let needle = if name == "v" {
            "\n  -v, --v Level ".to_owned()
        } else {
            format!("\n      --{name} ")
        };
        assert!(help[..konn_at].contains(&needle), "{name}");
    }
    for &(name, _, _) in KONN {
        assert!(
            help[konn_at..].contains(&format!("\n      --{name} ")),
            "{name}"
        );
        assert!(
            !help[..konn_at].contains(&format!("\n      --{name} ")),
            "{name}"
        );
    }
    assert!(help.contains("--alpn-proto strings "));
    assert!(help.contains("--sync-interval-cap duration "));
    assert!(help.contains("(default 10s)"));
    assert!(help.contains("(default \"127.0.0.1\")"));
    assert!(help.contains("(default 150)"));
}

#[test]
fn defaults_validate() {
    let mut cmd = options::command_with_env(|_| None);
    cmd.parse(Vec::<String>::new()).unwrap();
    let o = AgentOptions::from_flags(cmd.flags()).expect("upstream's defaults validate");
    assert!(o.unsupported_features().is_empty());
    assert!(o.warnings.is_empty());
}
