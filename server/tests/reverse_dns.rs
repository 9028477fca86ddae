//! The DNS cases of reliability-security.md §4.5's KEP-2025 bypass corpus,
//! against the real proxy-server and proxy-agent binaries in a network
//! namespace whose resolver is a test DNS server (`konn_testkit::dns`):
//! a name that rebinds from the allowed address to 127.0.0.1, a name with
//! mixed A records, a CNAME to `localhost`, names answering with metadata
//! or IPv6 loopback addresses. Each is an `--allowed-destination` by name;
//! the server must refuse every dial whose resolution includes a denied
//! address, and serve the name that resolves to an allowed one.
//!
//! Needs root and iproute2 (network namespaces); skips otherwise, unless
//! `KONN_NETNS_REQUIRED` is set (scripts/test sets it), which fails.

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream, UdpSocket};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use konn_testkit::blocking::ReadRetry;
use konn_testkit::dest::Destination;
use konn_testkit::dns::{DnsServer, Record, TYPE_A, TYPE_AAAA};
use konn_testkit::netns::{self, Netns};
use konn_testkit::ports::free_port;
use konn_testkit::procs::{Proc, binary, http_get};
use konn_testkit::wait::wait_until;

/// The destination's address inside the namespace (on its loopback).
const DEST_IP: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 10);

/// What each name resolves to; `rebound` flips `rebind.konn.test` from
/// the destination to 127.0.0.1 (an attacker changing the record between
/// two lookups; TTL 0).
fn answer(rebound: Arc<AtomicBool>) -> Box<konn_testkit::dns::Answer> {
    Box::new(move |name, qtype| {
        let a = |ips: &[Ipv4Addr]| ips.iter().map(|ip| Record::A(*ip)).collect::<Vec<_>>();
        let records = match (name, qtype) {
            ("allowed.konn.test", TYPE_A) => a(&[DEST_IP]),
            ("rebind.konn.test", TYPE_A) if rebound.load(Ordering::SeqCst) => {
                a(&[Ipv4Addr::LOCALHOST])
            }
            ("rebind.konn.test", TYPE_A) => a(&[DEST_IP]),
            ("mixed.konn.test", TYPE_A) => a(&[DEST_IP, Ipv4Addr::LOCALHOST]),
            ("cname.konn.test", TYPE_A) => vec![
                Record::Cname("localhost".into()),
                Record::A(Ipv4Addr::LOCALHOST),
            ],
            ("metadata.konn.test", TYPE_A) => a(&[Ipv4Addr::new(169, 254, 169, 254)]),
            ("loop6.konn.test", TYPE_AAAA) => vec![Record::Aaaa(Ipv6Addr::LOCALHOST)],
            ("mapped6.konn.test", TYPE_AAAA) => {
                vec![Record::Aaaa(Ipv4Addr::LOCALHOST.to_ipv6_mapped())]
            }
            (
                "allowed.konn.test" | "rebind.konn.test" | "mixed.konn.test" | "cname.konn.test"
                | "metadata.konn.test" | "loop6.konn.test" | "mapped6.konn.test",
                _,
            ) => Vec::new(),
            _ => return None,
        };
        Some(records)
    })
}

/// The names, in `--target` order (local port = base + index).
const NAMES: [&str; 7] = [
    "allowed", "rebind", "mixed", "cname", "metadata", "loop6", "mapped6",
];

/// Inside `ns`: connect to 127.0.0.1:`port`, send a line, and say whether
/// it came back (the server dialled) or the connection closed without a
/// byte (refused).
fn echoes(ns: &Netns, port: u16) -> bool {
    ns.run(move || {
        let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
            return false;
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
        let mut b = [0u8; 5];
        s.write_all(b"ping\n").is_ok() && s.read_exact(&mut b).is_ok() && b == *b"ping\n"
    })
    .expect("thread in the namespace")
}

/// Inside `ns`: a connection to 127.0.0.1:`port` ends without a byte.
fn refused(ns: &Netns, port: u16) -> Result<(), String> {
    ns.run(move || {
        let mut s = TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())?;
        s.set_read_timeout(Some(Duration::from_secs(20)))
            .map_err(|e| e.to_string())?;
        let _ = s.write_all(b"ping\n");
        let mut b = [0u8; 1];
        match s.read_retry(&mut b) {
            Ok(0) => Ok(()),
            Ok(_) => Err("got a byte back".into()),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => Ok(()),
            Err(e) => Err(format!("not closed: {e}")),
        }
    })
    .expect("thread in the namespace")
}

fn metric(ns: &Netns, health: SocketAddr, series: &str) -> f64 {
    let series = series.to_owned();
    ns.run(move || {
        let (_, body) = http_get(health, "/metrics").ok()?;
        body.lines()
            .find_map(|l| l.strip_prefix(series.as_str())?.trim().parse().ok())
    })
    .expect("thread in the namespace")
    .unwrap_or(0.0)
}

fn start(ns: &Netns, name: &str, args: Vec<String>, dir: &Path) -> Proc {
    let bin = binary(name).expect("the konn binaries are built (cargo test builds them)");
    Proc::spawn(
        Path::new("ip"),
        &ns.exec_args(&bin, &args),
        &dir.join(format!("{name}.log")),
    )
    .expect("starts")
}

#[test]
fn names_resolving_to_denied_addresses_are_refused() {
    if let Some(why) = netns::unavailable() {
        assert!(
            std::env::var_os("KONN_NETNS_REQUIRED").is_none(),
            "KONN_NETNS_REQUIRED is set but network namespaces are unavailable: {why}"
        );
        eprintln!("skipped: network namespaces unavailable: {why}");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let ns = Netns::create("konn-rdns").unwrap();
    ns.ip(&["addr", "add", &format!("{DEST_IP}/32"), "dev", "lo"])
        .unwrap();
    ns.set_resolv_conf("nameserver 127.0.0.1\noptions timeout:1 attempts:2\n")
        .unwrap();
    let rebound = Arc::new(AtomicBool::new(false));
    let r = rebound.clone();
    let dns = ns
        .run(move || DnsServer::start(UdpSocket::bind("127.0.0.1:53")?, answer(r)))
        .unwrap()
        .expect("DNS server on 127.0.0.1:53 in the namespace");
    let echo = ns
        .run(|| Destination::echo_on(IpAddr::V4(DEST_IP)))
        .unwrap()
        .unwrap();
    let port = echo.addr().port();
    let pki = konn_testkit::pki::write(&dir.join("pki")).unwrap();

    // Ports in a namespace of our own: all free.
    let (agent_port, health_port, admin_port) = (free_port(), free_port(), free_port());
    let (agent_health, agent_admin, local_base) = (free_port(), free_port(), 20_000u16);
    let mut server_args: Vec<String> = vec![
        "--mode=grpc".into(),
        format!("--uds-name={}", dir.join("s.sock").display()),
        "--server-port=0".into(),
        "--agent-bind-address=127.0.0.1".into(),
        format!("--agent-port={agent_port}"),
        "--health-bind-address=127.0.0.1".into(),
        format!("--health-port={health_port}"),
        "--admin-bind-address=127.0.0.1".into(),
        format!("--admin-port={admin_port}"),
        format!("--cluster-cert={}", pki.server_cert.display()),
        format!("--cluster-key={}", pki.server_key.display()),
        "--reverse-dial-timeout=5s".into(),
        "--v=4".into(),
    ];
    let mut agent_args: Vec<String> = vec![
        "--proxy-server-host=127.0.0.1".into(),
        format!("--proxy-server-port={agent_port}"),
        format!("--ca-cert={}", pki.ca_cert.display()),
        format!("--agent-cert={}", pki.agent_cert.display()),
        format!("--agent-key={}", pki.agent_key.display()),
        "--agent-id=dns".into(),
        "--health-server-host=127.0.0.1".into(),
        format!("--health-server-port={agent_health}"),
        "--admin-bind-address=127.0.0.1".into(),
        format!("--admin-server-port={agent_admin}"),
        "--bind-address=127.0.0.1".into(),
    ];
    for (i, name) in NAMES.iter().enumerate() {
        let dest = format!("{name}.konn.test:{port}");
        server_args.push(format!("--allowed-destination={dest}"));
        agent_args.push(format!("--target={}:{dest}", local_base + i as u16));
    }
    let server = start(&ns, "proxy-server", server_args, dir);
    let agent = start(&ns, "proxy-agent", agent_args, dir);
    let local = |name: &str| local_base + NAMES.iter().position(|n| *n == name).unwrap() as u16;

    // The allowed name works (and tells when the tunnel is up).
    assert!(
        wait_until(Duration::from_secs(30), || echoes(&ns, local("allowed"))),
        "allowed.konn.test never got through\nserver:\n{}\nagent:\n{}",
        server.log_tail(20),
        agent.log_tail(20)
    );
    // Rebinding: allowed while the name points at the destination, refused
    // once it points at loopback.
    assert!(
        echoes(&ns, local("rebind")),
        "rebind.konn.test before rebinding"
    );
    rebound.store(true, Ordering::SeqCst);
    refused(&ns, local("rebind")).expect("rebind.konn.test after rebinding to 127.0.0.1");
    for name in ["mixed", "cname", "metadata", "loop6", "mapped6"] {
        if let Err(e) = refused(&ns, local(name)) {
            panic!("{name}.konn.test: {e}\nserver:\n{}", server.log_tail(30));
        }
    }
    let health: SocketAddr = format!("127.0.0.1:{health_port}").parse().unwrap();
    let denied = metric(
        &ns,
        health,
        "konn_reverse_refusals_total{reason=\"denied_address\"}",
    );
    assert_eq!(
        denied,
        6.0,
        "every refusal is for a denied address (rebind, mixed, cname, metadata, loop6, mapped6)\n{}",
        server.log_tail(30)
    );
    let ok = metric(&ns, health, "konn_reverse_dials_total{result=\"ok\"}");
    assert!(ok >= 2.0, "the allowed and the not-yet-rebound name: {ok}");
    assert!(dns.queries() > 0);
    // Only the allowed dials reached the destination: every refusal
    // happened before connecting.
    assert_eq!(echo.connections(), ok as u64);
}
