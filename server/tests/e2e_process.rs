//! Acceptance at the process level: the `proxy-server` binary takes
//! upstream's complete flag set the way a generated manifest writes it
//! (`--name=value` for every flag), starts, serves, and stops on SIGTERM.
//!
//! Two rendered defaults are refused by upstream itself, so a manifest
//! cannot carry them: `--log-backtrace-at=:0` (parse error) and
//! `--cipher-suites=[]` (pflag's rendering of an empty list, which parses
//! as the one suite `[]`; an empty list is `--cipher-suites=`). The first
//! test shows the binary refusing the verbatim rendering exactly as
//! upstream does; the second runs with those two written as upstream
//! accepts them and with the values a deployment sets (certificates,
//! ports, loopback bind addresses).

mod e2e_common;
mod upstream_flags;

use std::net::SocketAddr;
use std::time::Duration;

use e2e_common::*;
use konn_agent::settings::AgentSettings;
use konn_core::io::runtime::{available_engines, block_on};
use konn_testkit::dest::Destination;
use konn_testkit::frontend::GrpcFrontend;
use konn_testkit::ports::free_port;
use konn_testkit::procs::{Proc, http_get, wait_http_ok};
use upstream_flags::RENDERED_DEFAULTS;

fn binary() -> std::path::PathBuf {
    env!("CARGO_BIN_EXE_proxy-server").into()
}

/// Runs the binary to completion with `args`: (exit code, stdout+stderr).
fn run(args: &[String]) -> (Option<i32>, String) {
    let out = std::process::Command::new(binary())
        .args(args)
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.code(), text)
}

fn flag_name(arg: &str) -> &str {
    arg[2..].split_once('=').map_or(&arg[2..], |(n, _)| n)
}

/// Upstream's deprecated flag: accepted, hidden from `--help` (pflag's
/// `MarkDeprecated`).
const DEPRECATED: &str = "warn-on-channel-limit";

/// `--help` exits 0 and lists every upstream flag but the deprecated one.
#[test]
fn help_lists_every_upstream_flag() {
    let (code, text) = run(&["--help".to_owned()]);
    assert_eq!(code, Some(0), "{text}");
    let listed: Vec<&str> = text
        .lines()
        .filter_map(|l| {
            let l = l.trim_start();
            let l = l
                .strip_prefix("-h, ")
                .or_else(|| l.strip_prefix("-v, "))
                .unwrap_or(l);
            l.strip_prefix("--")?.split_whitespace().next()
        })
        .collect();
    let missing: Vec<&str> = RENDERED_DEFAULTS
        .iter()
        .map(|a| flag_name(a))
        .filter(|n| *n != DEPRECATED && !listed.contains(n))
        .collect();
    assert!(
        missing.is_empty(),
        "--help does not list {missing:?}:\n{text}"
    );
    assert!(!listed.contains(&DEPRECATED), "{text}");
}

/// The verbatim rendering stops at upstream's parse error, exit 1.
#[test]
fn verbatim_rendered_defaults_are_refused_like_upstream() {
    let args: Vec<String> = RENDERED_DEFAULTS.iter().map(|a| (*a).to_owned()).collect();
    let (code, text) = run(&args);
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.contains(r#"invalid argument ":0" for "--log-backtrace-at" flag: syntax error: expect file.go:234"#),
        "{text}"
    );
}

/// Every upstream flag, `--name=value`; `set` overrides some values.
fn full_flag_set(set: &[(&str, String)]) -> Vec<String> {
    let mut args: Vec<String> = RENDERED_DEFAULTS
        .iter()
        .map(|a| {
            let name = flag_name(a);
            match set.iter().find(|(n, _)| *n == name) {
                Some((_, v)) => format!("--{name}={v}"),
                None => (*a).to_owned(),
            }
        })
        .collect();
    // Every upstream flag is there, once.
    assert_eq!(args.len(), RENDERED_DEFAULTS.len());
    for (n, _) in set {
        assert!(
            args.iter().any(|a| flag_name(a) == *n),
            "{n} is not an upstream flag"
        );
    }
    args.sort();
    args
}

const DEPRECATION: &str = "Flag --warn-on-channel-limit has been deprecated";

/// The full flag set with certificates from a fresh PKI: the binary
/// starts (health port answers), takes a konn agent over mTLS on its
/// agent port (ready), proxies a gRPC frontend's connection over mTLS on
/// its server port, and exits 0 on SIGTERM. Under each io engine (konn's
/// `--io-engine`, the one flag added).
#[test]
fn full_upstream_flag_set_starts_serves_and_stops_on_sigterm() {
    let pki = Pki::new();
    let f = &pki.files;
    let echo = Destination::echo().unwrap();
    let echo = echo.addr().to_string();
    let logs = TempDir::new("process");
    for engine in available_engines() {
        let ports = [free_port(), free_port(), free_port(), free_port()];
        let [server_port, agent_port, health_port, admin_port] = ports;
        let path = |p: &std::path::Path| p.display().to_string();
        let mut args = full_flag_set(&[
            ("log-backtrace-at", String::new()),
            ("cipher-suites", String::new()),
            ("cluster-ca-cert", path(&f.ca_cert)),
            ("cluster-cert", path(&f.server_cert)),
            ("cluster-key", path(&f.server_key)),
            ("server-ca-cert", path(&f.ca_cert)),
            ("server-cert", path(&f.server_cert)),
            ("server-key", path(&f.server_key)),
            ("server-bind-address", "127.0.0.1".into()),
            ("agent-bind-address", "127.0.0.1".into()),
            ("health-bind-address", "127.0.0.1".into()),
            ("admin-bind-address", "127.0.0.1".into()),
            ("server-port", server_port.to_string()),
            ("agent-port", agent_port.to_string()),
            ("health-port", health_port.to_string()),
            ("admin-port", admin_port.to_string()),
        ]);
        args.push(format!("--io-engine={engine}"));
        let log = logs.path(&format!("proxy-server-{engine}.log"));
        let mut proc = Proc::spawn(&binary(), &args, &log).unwrap();
        let at = |port: u16| SocketAddr::from(([127, 0, 0, 1], port));
        assert!(
            wait_http_ok(at(health_port), "/healthz", T),
            "{engine}: /healthz never answered 200:\n{}",
            proc.log_tail(30)
        );
        // No agent yet: upstream's 500.
        let (status, body) = http_get(at(health_port), "/readyz").unwrap();
        assert_eq!(status, 500, "{body}");
        assert!(body.contains("no connection to any proxy agent"), "{body}");

        // A konn agent over mTLS, then a frontend over mTLS through it.
        let mut settings = AgentSettings::for_tests(at(agent_port).to_string(), "agent-process");
        settings.runtime.engine = engine_flag(engine);
        settings.runtime.workers = 1;
        settings.connect.tls = Some(pki.agent_client());
        let mut agent = Agent::start(settings);
        assert!(
            wait_http_ok(at(health_port), "/readyz", T),
            "{engine}: the server never became ready:\n{}",
            proc.log_tail(30)
        );
        let tls = pki.frontend_client();
        block_on(engine, async {
            let fe = GrpcFrontend::connect_tls(&at(server_port).to_string(), &tls)
                .await
                .unwrap();
            let t = fe.dial(&echo, T).await.unwrap();
            t.write(b"through the binary").await.unwrap();
            assert_eq!(t.read_exact(18, T).await.unwrap(), b"through the binary");
            t.close(T).await.unwrap();
            fe.close().await;
        })
        .unwrap();
        agent.stop();

        proc.terminate();
        let status = proc.wait_timeout(Duration::from_secs(10));
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        assert!(
            status.is_some_and(|s| s.success()),
            "{engine}: SIGTERM → {status:?}:\n{}",
            text
        );
        assert!(text.contains(DEPRECATION), "{text}");
    }
}
