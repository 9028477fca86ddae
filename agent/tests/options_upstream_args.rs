//! Feeds proxy-agent the complete upstream flag set written out the way
//! pflag renders each default (`--alpn-proto=[]`, `--sync-interval=1s`,
//! `--keepalive-time=1h0m0s`, ...), as a generated manifest would, and
//! checks that konn ends up exactly where upstream v0.36.0 does. Upstream's
//! results for the same argument lists (run through its own option code):
//!
//! - with `--log-backtrace-at=:0`: parse error
//!   `invalid argument ":0" for "--log-backtrace-at" flag: syntax error: expect file.go:234`;
//! - without it: parsed and valid, with `--alpn-proto` holding the single
//!   protocol `[]`.

use std::time::Duration;

use konn_agent::options::{self, AgentOptions, ServerCountSource};
use konn_core::app::Options as _;
use konn_core::cli::{Outcome, Section};

/// Every upstream proxy-agent flag with its default as pflag renders it.
const RENDERED_DEFAULTS: &[&str] = &[
    "--add-dir-header=false",
    "--admin-bind-address=127.0.0.1",
    "--admin-server-port=8094",
    "--agent-cert=",
    "--agent-id=f533f329-4129-4f2c-a75c-8e3dcec565c6",
    "--agent-identifiers=",
    "--agent-key=",
    "--alpn-proto=[]",
    "--alsologtostderr=false",
    "--alsologtostderrthreshold=0",
    "--ca-cert=",
    "--count-server-leases=false",
    "--enable-contention-profiling=false",
    "--enable-profiling=false",
    "--health-server-host=",
    "--health-server-port=8093",
    "--keepalive-time=1h0m0s",
    "--kube-api-content-type=application/vnd.kubernetes.protobuf",
    "--kubeconfig=",
    "--lease-label=k8s-app=konnectivity-server",
    "--lease-namespace=kube-system",
    "--legacy-stderr-threshold-behavior=true",
    "--log-backtrace-at=:0",
    "--log-dir=",
    "--log-file=",
    "--log-file-max-size=1800",
    "--logtostderr=true",
    "--one-output=false",
    "--probe-interval=1s",
    "--proxy-server-host=127.0.0.1",
    "--proxy-server-port=8091",
    "--server-count-source=default",
    "--service-account-token-path=",
    "--skip-headers=false",
    "--skip-log-headers=false",
    "--stderrthreshold=2",
    "--sync-forever=false",
    "--sync-interval=1s",
    "--sync-interval-cap=10s",
    "--v=4",
    "--vmodule=",
    "--warn-on-channel-limit=false",
    "--xfr-channel-size=150",
];

fn args_without(skip: &[&str]) -> Vec<String> {
    RENDERED_DEFAULTS
        .iter()
        .filter(|a| !skip.iter().any(|s| a.starts_with(s)))
        .map(|a| (*a).to_owned())
        .collect()
}

fn upstream_flags(cmd: &konn_core::cli::Command) -> Vec<&konn_core::cli::Flag> {
    cmd.flags()
        .flags()
        .into_iter()
        // master's new name; v0.36.0's rendering has the old one.
        .filter(|f| {
            f.section() == Section::Upstream
                && f.name() != "help"
                && f.name() != "lease-label-selector"
        })
        .collect()
}

#[test]
fn the_list_covers_every_upstream_flag_as_konn_renders_it() {
    let cmd = options::command_with_env(|_| None);
    let flags = upstream_flags(&cmd);
    assert_eq!(flags.len(), RENDERED_DEFAULTS.len());
    for (arg, flag) in RENDERED_DEFAULTS.iter().zip(flags) {
        let name = arg[2..].split_once('=').unwrap().0;
        assert_eq!(name, flag.name());
        if name != "agent-id" {
            assert_eq!(*arg, format!("--{}={}", flag.name(), flag.default_text()));
        }
    }
}

#[test]
fn rendered_backtrace_default_is_refused_like_upstream() {
    let mut cmd = options::command_with_env(|_| None);
    let err = cmd.parse(args_without(&[])).unwrap_err();
    assert_eq!(
        err.to_string(),
        r#"invalid argument ":0" for "--log-backtrace-at" flag: syntax error: expect file.go:234"#
    );
}

#[test]
fn full_rendered_set_parses_and_validates() {
    let mut cmd = options::command_with_env(|_| None);
    let Ok(Outcome::Run(parsed)) = cmd.parse(args_without(&["--log-backtrace-at="])) else {
        panic!("must parse");
    };
    assert!(parsed.args.is_empty());
    // v0.36.0's --lease-label is deprecated on upstream master (and here).
    assert_eq!(
        parsed.warnings,
        ["Flag --lease-label has been deprecated, Use --lease-label-selector instead"]
    );
    let o = AgentOptions::from_flags(cmd.flags()).expect("valid, as upstream");
    // pflag reads "[]" as a one-element CSV record.
    assert_eq!(o.alpn_protos, ["[]"]);
    assert_eq!(o.agent_id, "f533f329-4129-4f2c-a75c-8e3dcec565c6");
    assert_eq!(o.proxy_server_host, "127.0.0.1");
    assert_eq!(o.proxy_server_port, 8091);
    assert_eq!(o.sync_interval, Duration::from_secs(1));
    assert_eq!(o.sync_interval_cap, Duration::from_secs(10));
    assert_eq!(o.keepalive_time, Duration::from_secs(3600));
    assert_eq!(o.server_count_source, ServerCountSource::Default);
    assert_eq!(o.xfr_channel_size, 150);
    assert!(o.unsupported_features().is_empty());
    // The klog flags took their rendered values too.
    let log = konn_core::log::LogConfig::from_flags(cmd.flags());
    assert_eq!(log, konn_core::log::LogConfig::default());
}

#[test]
fn separate_value_form_is_equivalent() {
    let mut cmd = options::command_with_env(|_| None);
    let mut args = Vec::new();
    for arg in args_without(&["--log-backtrace-at=", "--alpn-proto="]) {
        let (name, value) = arg[2..].split_once('=').unwrap();
        if cmd.flags().lookup(name).unwrap().type_name() == "bool" {
            args.push(arg.clone());
        } else {
            args.push(format!("--{name}"));
            args.push(value.to_owned());
        }
    }
    let Ok(Outcome::Run(parsed)) = cmd.parse(args) else {
        panic!("must parse");
    };
    assert!(parsed.args.is_empty(), "{:?}", parsed.args);
    let o = AgentOptions::from_flags(cmd.flags()).expect("valid");
    assert!(o.alpn_protos.is_empty());
}

#[test]
fn bool_followed_by_a_value_is_a_positional_argument() {
    // `--sync-forever false` turns sync-forever ON in pflag; "false" is a
    // positional argument that cobra ignores. konn does the same and
    // reports the argument so the binary can warn about it.
    let mut cmd = options::command_with_env(|_| None);
    let Ok(Outcome::Run(parsed)) = cmd.parse(["--sync-forever", "false"]) else {
        panic!("must parse");
    };
    assert_eq!(parsed.args, ["false"]);
    assert!(AgentOptions::from_flags(cmd.flags()).unwrap().sync_forever);
}
