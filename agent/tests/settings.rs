//! How the command line becomes the runtime's settings
//! (`AgentSettings::from_options`): server address and TLS, the relay and
//! driver limits, the sync policy, the health and admin listeners, the
//! engine; and the clear errors for settings that cannot work.

mod run_common;

use std::net::SocketAddr;
use std::time::Duration;

use konn_agent::Error;
use konn_agent::options::{self, AgentOptions};
use konn_agent::settings::{AgentSettings, DIAL_TIMEOUT, SERVER_CONNECT_TIMEOUT};
use konn_core::app::Options as _;
use konn_core::cli::Outcome;
use konn_core::io::runtime::IoEngine;
use konn_protocol::agent::sync::DEFAULT_HEADER_TIMEOUT;
use run_common::*;

fn options(args: &[String]) -> AgentOptions {
    let mut cmd = options::command_with_env(|_| None);
    let Ok(Outcome::Run(_)) = cmd.parse(args) else {
        panic!("{args:?} must parse");
    };
    AgentOptions::from_flags(cmd.flags()).expect("valid")
}

struct Files {
    _dir: TempDir,
    ca: String,
    cert: String,
    key: String,
}

fn files() -> Files {
    let dir = TempDir::new("settings");
    let pki = pki();
    let write = |name: &str, text: &str| {
        let p = dir.path(name);
        std::fs::write(&p, text).unwrap();
        p.display().to_string()
    };
    Files {
        ca: write("ca.crt", &pki.ca_cert),
        // Any certificate and key will do for building the client side.
        cert: write("agent.crt", &pki.server_cert),
        key: write("agent.key", &pki.server_key),
        _dir: dir,
    }
}

#[test]
fn defaults_map_like_upstream() {
    let f = files();
    let o = options(&[format!("--ca-cert={}", f.ca)]);
    let s = AgentSettings::from_options(&o).unwrap();
    let c = &s.connect;
    assert_eq!(c.address, "127.0.0.1:8091");
    assert!(c.tls.is_some());
    assert_eq!(c.agent_id, o.agent_id);
    assert_eq!(c.agent_identifiers, "");
    assert_eq!(c.token_path, None);
    assert_eq!(c.keepalive_time, Duration::from_secs(3600));
    assert_eq!(c.connect_timeout, SERVER_CONNECT_TIMEOUT);
    assert_eq!(c.settings.dial_timeout, DIAL_TIMEOUT);
    assert_eq!(DIAL_TIMEOUT, Duration::from_secs(5));
    assert_eq!(c.settings.endpoint_queue, 150, "--xfr-channel-size");
    assert!(!c.settings.warn_on_queue_limit);
    assert_eq!(c.settings.stuck_timeout(), Duration::from_secs(120));
    // --conn-queue-size (1 MiB): PAUSE above 512 KiB, RESUME at 128 KiB,
    // credit withheld above 4 MiB.
    let flow = c.settings.tunnel.flow;
    assert_eq!(
        (flow.low, flow.high, flow.limit),
        (128 << 10, 512 << 10, 4 << 20)
    );
    assert!(c.settings.flow_control, "the extension is offered");
    assert_eq!(
        (c.settings.tunnel_high_water, c.settings.tunnel_low_water),
        (1 << 20, 256 << 10),
        "endpoints stop being read at one --conn-queue-size queued on the tunnel"
    );
    assert_eq!(c.driver.write_timeout, Duration::from_secs(60));
    assert_eq!(s.sync.interval, Duration::from_secs(1));
    assert_eq!(s.sync.interval_cap, Duration::from_secs(10));
    assert!(!s.sync.sync_forever);
    assert_eq!(s.sync.header_timeout, DEFAULT_HEADER_TIMEOUT);
    assert_eq!(DEFAULT_HEADER_TIMEOUT, Duration::from_secs(30));
    // Go's ":8093": every interface, IPv6 first.
    let any: Vec<SocketAddr> = vec![
        "[::]:8093".parse().unwrap(),
        "0.0.0.0:8093".parse().unwrap(),
    ];
    assert_eq!(s.health, any);
    assert_eq!(s.admin, ["127.0.0.1:8094".parse::<SocketAddr>().unwrap()]);
    assert!(!s.enable_profiling);
    assert_eq!(s.http.read_header_timeout, Duration::from_secs(60));
    assert_eq!(s.http.max_header_bytes, 1 << 20);
    assert_eq!(s.h2_windows, (1 << 20, 4 << 20));
    assert_eq!(s.max_message, 4 << 20);
    assert!(s.runtime.workers >= 1);
    assert_eq!(s.runtime.engine, IoEngine::Epoll);
    let h2 = s.h2_config();
    assert_eq!(h2.keepalive.unwrap().interval, Duration::from_secs(3600));
    assert_eq!((h2.stream_window, h2.conn_window), (1 << 20, 4 << 20));
}

#[test]
fn every_flag_reaches_its_setting() {
    let f = files();
    let token = format!("{}.token", f.ca);
    std::fs::write(&token, "t").unwrap();
    let o = options(&[
        format!("--ca-cert={}", f.ca),
        format!("--agent-cert={}", f.cert),
        format!("--agent-key={}", f.key),
        "--proxy-server-host=::1".into(),
        "--proxy-server-port=8132".into(),
        "--alpn-proto=konnectivity,x".into(),
        "--agent-id=node-1".into(),
        "--agent-identifiers=host=node-1&ipv4=10.0.0.1".into(),
        format!("--service-account-token-path={token}"),
        "--keepalive-time=45s".into(),
        "--sync-interval=5s".into(),
        "--sync-interval-cap=30s".into(),
        "--sync-forever".into(),
        "--xfr-channel-size=7".into(),
        "--warn-on-channel-limit".into(),
        "--health-server-host=127.0.0.1".into(),
        "--health-server-port=8133".into(),
        "--admin-bind-address=::1".into(),
        "--admin-server-port=8134".into(),
        "--enable-profiling".into(),
        "--io-engine=epoll".into(),
        "--workers=3".into(),
        "--memory-budget=64Mi".into(),
        "--h2-stream-window=2Mi".into(),
        "--h2-conn-window=8Mi".into(),
        "--grpc-max-message-size=8Mi".into(),
        "--write-timeout=0".into(),
        "--stuck-timeout=10s".into(),
    ]);
    let s = AgentSettings::from_options(&o).unwrap();
    let c = &s.connect;
    assert_eq!(c.address, "[::1]:8132");
    let tls = c.tls.as_ref().unwrap();
    assert_eq!(
        tls.config.alpn_protocols,
        [b"konnectivity".to_vec(), b"x".to_vec(), b"h2".to_vec()]
    );
    assert!(tls.config.client_auth_cert_resolver.has_certs());
    assert_eq!(c.agent_id, "node-1");
    assert_eq!(c.agent_identifiers, "host=node-1&ipv4=10.0.0.1");
    assert_eq!(c.token_path.as_deref(), Some(std::path::Path::new(&token)));
    assert_eq!(c.keepalive_time, Duration::from_secs(45));
    assert_eq!(c.settings.endpoint_queue, 7);
    assert!(c.settings.warn_on_queue_limit);
    assert_eq!(c.settings.stuck_timeout(), Duration::from_secs(10));
    assert!(
        c.driver.write_timeout > Duration::from_secs(300 * 24 * 3600),
        "0 disables"
    );
    assert_eq!(s.sync.interval, Duration::from_secs(5));
    assert_eq!(s.sync.interval_cap, Duration::from_secs(30));
    assert!(s.sync.sync_forever);
    assert_eq!(s.health, ["127.0.0.1:8133".parse::<SocketAddr>().unwrap()]);
    assert_eq!(s.admin, ["[::1]:8134".parse::<SocketAddr>().unwrap()]);
    assert!(s.enable_profiling);
    assert_eq!(s.runtime.engine, IoEngine::Epoll);
    assert_eq!(s.runtime.workers, 3);
    assert_eq!(s.runtime.pool.budget_bytes, 64 << 20);
    assert_eq!(s.h2_windows, (2 << 20, 8 << 20));
    assert_eq!(s.max_message, 8 << 20);
    let h2 = s.h2_config();
    assert_eq!(h2.keepalive.unwrap().interval, Duration::from_secs(45));
    assert_eq!((h2.stream_window, h2.conn_window), (2 << 20, 8 << 20));
}

#[test]
fn keepalive_times_below_ten_seconds_are_raised_like_grpc_go() {
    // grpc-go's WithKeepaliveParams raises Time below 10 s, 0 included, to
    // 10 s; a zero interval must never mean a PING after every frame.
    let f = files();
    for (flag, want) in [("0s", 10), ("1s", 10), ("10s", 10), ("45s", 45)] {
        let o = options(&[
            format!("--ca-cert={}", f.ca),
            format!("--keepalive-time={flag}"),
        ]);
        let s = AgentSettings::from_options(&o).unwrap();
        let ka = s.h2_config().keepalive.expect("always on, as upstream");
        assert_eq!(ka.interval, Duration::from_secs(want), "{flag}");
        assert_eq!(ka.timeout, Duration::from_secs(20));
        assert!(ka.permit_without_stream);
    }
}

#[test]
fn a_host_name_is_resolved_for_the_listeners() {
    let f = files();
    let o = options(&[
        format!("--ca-cert={}", f.ca),
        "--health-server-host=localhost".into(),
    ]);
    let s = AgentSettings::from_options(&o).unwrap();
    assert!(!s.health.is_empty());
    assert!(
        s.health
            .iter()
            .all(|a| a.ip().is_loopback() && a.port() == 8093)
    );
    let o = options(&[
        format!("--ca-cert={}", f.ca),
        "--admin-bind-address=no-such-host.invalid".into(),
    ]);
    let err = AgentSettings::from_options(&o).unwrap_err();
    assert!(matches!(
        err,
        Error::Resolve {
            flag: "admin-bind-address",
            ..
        }
    ));
    assert!(
        err.to_string()
            .starts_with("--admin-bind-address=no-such-host.invalid: cannot resolve: "),
        "{err}"
    );
}

#[test]
fn settings_that_cannot_work_are_refused_in_one_line() {
    let o = options(&[]);
    let err = AgentSettings::from_options(&o).unwrap_err();
    assert!(matches!(err, Error::NoCaCert));
    assert_eq!(
        err.to_string(),
        "--ca-cert is required: the agent verifies the proxy-server's certificate with it \
         (upstream fails the same way: failed to read CA cert)"
    );

    let f = files();
    // A CA file that holds no certificate.
    let o = options(&[format!("--ca-cert={}", f.key)]);
    let err = AgentSettings::from_options(&o).unwrap_err();
    assert!(matches!(err, Error::Tls(_)), "{err:?}");
    let text = err.to_string();
    assert!(text.starts_with("TLS towards the proxy-server: "), "{text}");
    assert!(text.contains("agent.key"), "names the file: {text}");
    assert!(!text.contains('\n'), "{text}");
}
