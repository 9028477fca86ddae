//! The `proxy-agent` binary as a process, started the way a manifest
//! generated for upstream starts it: every upstream flag written out as
//! pflag renders its default, with the CA, the server port and the health
//! and admin ports changed. Against an in-process konn server with TLS on
//! its agent port it must connect and become ready, send DRAIN and keep
//! serving on the first SIGTERM, and exit 0 on the second.

mod run_common;

use std::net::SocketAddr;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

use konn_core::io::runtime::available_engines;
use konn_core::memcpy::Keep;
use run_common::*;

const T: Duration = Duration::from_secs(30);

/// Every upstream proxy-agent flag with its default as pflag renders it
/// (the list of `options_upstream_args.rs`), minus `--log-backtrace-at=:0`,
/// which upstream itself refuses to parse.
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

fn kill_term(child: &Child) {
    let ok = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill -TERM failed");
}

fn wait_exit(child: &mut Child, limit: Duration) -> Option<ExitStatus> {
    let mut status = None;
    wait_until(limit, || {
        status = child.try_wait().unwrap();
        status.is_some()
    });
    status
}

/// Kills the child if the test fails half-way.
struct Reaper(Option<Child>);

impl Drop for Reaper {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take()
            && c.try_wait().ok().flatten().is_none()
        {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Where glibc's `memcpy` is slow the binary executed itself again with
/// the tunable that fixes it and said so in its log; elsewhere it runs with
/// the environment it was given (`konn_core::memcpy`).
fn check_memcpy_tunable(pid: u32, log: &str) {
    let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
    let tunables = environ
        .split(|b| *b == 0)
        .find_map(|kv| kv.strip_prefix(b"GLIBC_TUNABLES="))
        .map(|v| String::from_utf8_lossy(v).into_owned());
    match konn_core::memcpy::decide_here() {
        Ok(value) => {
            assert_eq!(tunables.as_deref(), Some(value.as_str()));
            let line = format!("memcpy: {}=", konn_core::memcpy::TUNABLE);
            assert!(log.contains(&line), "{log}");
        }
        Err(keep) => {
            assert_eq!(tunables, std::env::var("GLIBC_TUNABLES").ok());
            if matches!(keep, Keep::NotAffected | Keep::GlibcDecides) {
                assert!(!log.contains("memcpy:"), "{log}");
            }
        }
    }
}

#[test]
fn the_binary_runs_with_upstreams_rendered_flags_and_drains_then_exits() {
    let _serial = serial();
    // As a manifest gives it (the process picks its engine: auto), then
    // with konn's --io-engine=epoll added.
    run_the_binary(&[]);
    run_the_binary(&["--io-engine=epoll"]);
}

fn run_the_binary(extra: &[&str]) {
    let engine = available_engines()[0];
    let dir = TempDir::new("process");
    let pki = pki();
    let ca_path = dir.path("ca.crt");
    std::fs::write(&ca_path, &pki.ca_cert).unwrap();
    let server = ServerSpec {
        tls: Some(server_tls(&pki)),
        server_id: "process-server",
        ..ServerSpec::new(engine, &dir, "s")
    }
    .start();
    let (health_port, admin_port) = (free_port(), free_port());
    let args: Vec<String> = RENDERED_DEFAULTS
        .iter()
        .map(|a| match a.split_once('=').unwrap().0 {
            "--ca-cert" => format!("--ca-cert={}", ca_path.display()),
            "--proxy-server-port" => format!("--proxy-server-port={}", server.agent_addr().port()),
            "--health-server-port" => format!("--health-server-port={health_port}"),
            "--admin-server-port" => format!("--admin-server-port={admin_port}"),
            _ => (*a).to_owned(),
        })
        .chain(extra.iter().map(|a| (*a).to_owned()))
        .collect();
    let log_path = dir.path("agent.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_proxy-agent"))
        .args(&args)
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    let mut child = Reaper(Some(child));
    let logs = || std::fs::read_to_string(&log_path).unwrap_or_default();
    let health: SocketAddr = ([127, 0, 0, 1], health_port).into();
    let admin: SocketAddr = ([127, 0, 0, 1], admin_port).into();
    let ready =
        || std::net::TcpStream::connect(health).is_ok() && http_get(health, "/readyz").0 == 200;

    assert!(wait_until(T, ready), "not ready; log:\n{}", logs());
    assert!(wait_until(T, || server.backends() == 1), "log:\n{}", logs());
    assert_eq!(
        http_get(health, "/readyz?verbose"),
        (200, PASSED.to_owned())
    );
    assert_eq!(http_get(health, "/healthz"), (200, "ok".to_owned()));
    assert_eq!(http_get(admin, "/metrics").0, 301);
    check_memcpy_tunable(child.0.as_ref().unwrap().id(), &logs());
    let scrape = http_get(health, "/metrics").1;
    assert_eq!(
        metric(
            &scrape,
            "konnectivity_network_proxy_agent_open_server_connections"
        ),
        Some(1.0)
    );

    // First SIGTERM: DRAIN, and the agent keeps running and ready.
    let c = child.0.as_mut().unwrap();
    kill_term(c);
    let drain = "konnectivity_network_proxy_agent_stream_packets_total{packet_type=\"DRAIN\",segment=\"from_agent\"}";
    assert!(
        wait_until(T, || metric(&http_get(health, "/metrics").1, drain)
            == Some(1.0)),
        "no DRAIN; log:\n{}",
        logs()
    );
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        c.try_wait().unwrap().is_none(),
        "exited on the first signal; log:\n{}",
        logs()
    );
    assert_eq!(http_get(health, "/readyz"), (200, "ok".to_owned()));
    assert_eq!(server.backends(), 1);

    // Second SIGTERM: exit 0.
    kill_term(c);
    let status = wait_exit(c, T);
    assert!(
        status.is_some_and(|s| s.success()),
        "{status:?}; log:\n{}",
        logs()
    );
    assert!(wait_until(T, || server.backends() == 0));
    let text = logs();
    assert!(text.contains("received first signal"), "{text}");
    assert!(text.contains("received second signal"), "{text}");
    for arg in extra {
        let engine = arg.trim_start_matches("--io-engine=");
        assert!(text.contains(&format!("engine={engine}")), "{text}");
    }
}

#[test]
fn the_binary_refuses_to_start_without_a_ca() {
    let out = Command::new(env!("CARGO_BIN_EXE_proxy-agent"))
        .args([
            "--proxy-server-port=1",
            "--health-server-port=1",
            "--admin-server-port=1",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--ca-cert is required"), "{err}");
}
