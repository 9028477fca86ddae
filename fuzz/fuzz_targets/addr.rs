//! Fuzzes `addr::Destination::parse` (the KEP-2025 allow-list parser)
//! against independent references:
//!
//! - **IP literals**: `std::net::SocketAddr`'s parser. Whatever konn takes
//!   as an IP destination, std parses to the same address (IPv4-mapped
//!   IPv6 canonicalised) and port; whatever std parses whose text is its
//!   own canonical rendering (no zone, port not 0) konn takes too.
//! - **Names**: a name konn accepts is no IP literal for std, nor a number
//!   for a lenient `inet_aton` (what glibc's `getaddrinfo` would turn into
//!   an address: 1–4 parts, hex, octal or decimal): no spelling of a
//!   loopback or metadata address can pass as a name.
//! - **Canonical form**: rendering a destination and parsing that gives it
//!   back; the port is 1–65535 and written exactly as in the input.
#![no_main]

use std::net::{IpAddr, SocketAddr};

use konn_frames::addr::{Destination, Host};
use libfuzzer_sys::fuzz_target;

/// glibc's `inet_aton` rules, leniently: 1 to 4 parts, each decimal,
/// `0x` hex or leading-`0` octal; the last part fills the remaining bytes.
fn inet_aton(s: &str) -> Option<u32> {
    let parts: Vec<&str> = s.split('.').collect();
    if parts.is_empty() || parts.len() > 4 {
        return None;
    }
    let mut vals = Vec::with_capacity(4);
    for p in &parts {
        let v = if let Some(h) = p.strip_prefix("0x").or_else(|| p.strip_prefix("0X")) {
            if h.is_empty() {
                0
            } else {
                u64::from_str_radix(h, 16).ok()?
            }
        } else if p.len() > 1 && p.starts_with('0') {
            u64::from_str_radix(&p[1..], 8).ok()?
        } else {
            p.parse::<u64>().ok()?
        };
        vals.push(v);
    }
    let (last, head) = vals.split_last()?;
    if head.iter().any(|&v| v > 255) {
        return None;
    }
    let rest_bits = 8 * (4 - head.len() as u32);
    if rest_bits < 64 && *last >= 1u64 << rest_bits {
        return None;
    }
    let mut n: u64 = 0;
    for v in head {
        n = (n << 8) | v;
    }
    Some(((n << rest_bits) | last) as u32)
}

fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_canonical(),
        v4 => v4,
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    let konn = Destination::parse(s);
    let std_addr = s.parse::<SocketAddr>().ok();
    if let Ok(d) = &konn {
        // Canonical form round trip; the port as written.
        assert_eq!(Destination::parse(&d.to_string()).as_ref(), Ok(d), "{s:?}");
        assert!(d.port > 0);
        assert!(s.ends_with(&format!(":{}", d.port)), "{s:?}: port {}", d.port);
        match &d.host {
            Host::Ip(ip) => {
                let a = std_addr.unwrap_or_else(|| panic!("{s:?}: konn takes an IP std refuses"));
                assert_eq!(canonical(a.ip()), *ip, "{s:?}");
                assert_eq!(a.port(), d.port, "{s:?}");
                if let SocketAddr::V6(v6) = a {
                    assert_eq!(v6.scope_id(), 0, "{s:?}: a zone id got through");
                }
            }
            Host::Name(n) => {
                assert!(std_addr.is_none(), "{s:?}: an IP literal taken as a name");
                let host = &s[..s.len() - format!(":{}", d.port).len()];
                assert_eq!(n, &host.to_ascii_lowercase());
                assert!(
                    inet_aton(host).is_none(),
                    "{s:?}: a name that getaddrinfo reads as an address"
                );
                assert!(n.len() <= 253 && !n.ends_with('.'));
            }
        }
    }
    // What std parses, in its own canonical spelling, konn takes.
    if let Some(a) = std_addr
        && a.port() != 0
        && a.to_string() == s
        && !s.contains('%')
    {
        let d = konn.unwrap_or_else(|e| panic!("{s:?}: std's canonical form refused: {e}"));
        assert_eq!(d.ip(), Some(canonical(a.ip())));
    }
});
