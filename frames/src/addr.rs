//! Strict `host:port` destinations for the reverse direction (KEP-2025):
//! the server's `--allowed-destination` entries and the agent's `--target`
//! destinations.
//!
//! An allow-list is only as good as its parser. The one here accepts
//! exactly one spelling of each destination and refuses everything a
//! lenient resolver would turn into something else (reference:
//! reliability-security.md §4.5):
//!
//! - **IPv4**: four decimal octets, each `0`–`255` without leading zeros
//!   (`127.1`, `0x7f.0.0.1`, `0177.0.0.1`, `2130706433` and
//!   `127.000.000.001` are refused, where glibc's `inet_aton` would accept
//!   them).
//! - **IPv6**: in brackets, as `std::net::Ipv6Addr` parses it (no zone ids);
//!   an IPv4-mapped address (`::ffff:a.b.c.d`) is canonicalised to its IPv4
//!   address ([`Destination::ip`]), so the deny checks see what the kernel
//!   would connect to.
//! - **Names**: RFC 1123 labels of letters, digits and `-` (1–63 bytes, not
//!   starting or ending with `-`), at most 253 bytes, lower-cased, no
//!   trailing dot, and a last label that starts with a letter — so no name
//!   can be read as a number by `getaddrinfo` (`0x7f000001`, `127.1`).
//! - **Port**: decimal `1`–`65535`, no sign, no leading zero.
//! - Nothing else: no whitespace, userinfo, scheme, percent-escapes,
//!   non-ASCII digits, or extra colons.
//!
//! Parsing is pure; resolving a name, and checking the addresses it
//! resolves to, is the server's job at dial time.

use core::fmt;
use core::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::Error;

/// The host of a [`Destination`].
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Host {
    /// An IP address (IPv4-mapped IPv6 already turned into IPv4).
    Ip(IpAddr),
    /// A DNS name, lower-case, without a trailing dot.
    Name(String),
}

/// A parsed `host:port`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Destination {
    /// The host.
    pub host: Host,
    /// The port (never 0).
    pub port: u16,
}

impl Destination {
    /// Parse `s` strictly (see the module docs).
    pub fn parse(s: &str) -> Result<Self, Error> {
        let bad = |what| Err(Error::BadDestination { what });
        if s.len() > 261 {
            return bad("longer than a name and a port can be");
        }
        let (host, port) = if let Some(rest) = s.strip_prefix('[') {
            let Some((v6, port)) = rest.split_once("]:") else {
                return bad("an IPv6 address must be in brackets and followed by :port");
            };
            let Ok(ip) = v6.parse::<Ipv6Addr>() else {
                return bad("not an IPv6 address");
            };
            (Host::Ip(ip.to_canonical()), port)
        } else {
            let Some((host, port)) = s.split_once(':') else {
                return bad("no :port");
            };
            (parse_host(host)?, port)
        };
        Ok(Self {
            host,
            port: parse_port(port)?,
        })
    }

    /// The IP address, for a destination that is one.
    pub fn ip(&self) -> Option<IpAddr> {
        match &self.host {
            Host::Ip(ip) => Some(*ip),
            Host::Name(_) => None,
        }
    }
}

impl fmt::Display for Destination {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.host {
            Host::Ip(IpAddr::V6(ip)) => write!(f, "[{ip}]:{}", self.port),
            Host::Ip(IpAddr::V4(ip)) => write!(f, "{ip}:{}", self.port),
            Host::Name(n) => write!(f, "{n}:{}", self.port),
        }
    }
}

fn parse_port(s: &str) -> Result<u16, Error> {
    let ok = !s.is_empty()
        && s.len() <= 5
        && s.bytes().all(|b| b.is_ascii_digit())
        && !s.starts_with('0');
    match s.parse::<u16>() {
        Ok(p) if ok && p > 0 => Ok(p),
        _ => Err(Error::BadDestination {
            what: "the port must be 1-65535 in decimal, without sign or leading zero",
        }),
    }
}

fn parse_host(s: &str) -> Result<Host, Error> {
    let bad = |what| Err(Error::BadDestination { what });
    if s.is_empty() {
        return bad("empty host");
    }
    if s.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        return match parse_ipv4(s) {
            Some(ip) => Ok(Host::Ip(IpAddr::V4(ip))),
            None => bad("not a dotted-quad IPv4 address (four decimal octets, no leading zeros)"),
        };
    }
    if s.len() > 253 {
        return bad("a name longer than 253 bytes");
    }
    let mut last = "";
    for label in s.split('.') {
        let ok = (1..=63).contains(&label.len())
            && label
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-')
            && !label.starts_with('-')
            && !label.ends_with('-');
        if !ok {
            return bad("not a DNS name (labels of letters, digits and '-', 1-63 bytes)");
        }
        last = label;
    }
    if !last.bytes().next().is_some_and(|b| b.is_ascii_alphabetic()) {
        return bad("a name's last label must start with a letter");
    }
    Ok(Host::Name(s.to_ascii_lowercase()))
}

/// A strict dotted-quad IPv4 address: four decimal octets `0`–`255`
/// without leading zeros (the rule of [`Destination::parse`]; also used for
/// the agent's `--allowed-destination-cidrs`).
pub fn parse_ipv4(s: &str) -> Option<Ipv4Addr> {
    let mut octets = [0u8; 4];
    let mut parts = s.split('.');
    for o in &mut octets {
        let p = parts.next()?;
        if p.is_empty() || p.len() > 3 || (p.len() > 1 && p.starts_with('0')) {
            return None;
        }
        *o = p.parse().ok()?;
    }
    parts.next().is_none().then(|| Ipv4Addr::from(octets))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(s: &str) -> Destination {
        Destination::parse(s).unwrap_or_else(|e| panic!("{s:?}: {e}"))
    }

    #[test]
    fn accepts_one_spelling_of_each_destination() {
        assert_eq!(ok("10.0.0.10:6443").to_string(), "10.0.0.10:6443");
        assert_eq!(
            ok("0.0.0.0:1").ip(),
            Some(IpAddr::V4(Ipv4Addr::UNSPECIFIED))
        );
        assert_eq!(ok("[fd00::1]:443").to_string(), "[fd00::1]:443");
        assert_eq!(
            ok("[::ffff:10.0.0.10]:6443").to_string(),
            "10.0.0.10:6443",
            "mapped IPv4 is canonicalised"
        );
        assert_eq!(
            ok("API.Example.com:6443").to_string(),
            "api.example.com:6443"
        );
        assert_eq!(ok("kube-apiserver:65535").port, 65535);
        assert_eq!(ok("localhost:6443").host, Host::Name("localhost".into()));
    }

    /// reliability-security.md §4.5's spellings that must not parse, or
    /// must not parse into what a lenient parser would make of them.
    #[test]
    fn refuses_the_bypass_spellings() {
        for s in [
            "127.1:6443",
            "127.0.1:6443",
            "2130706433:6443",
            "0x7f000001:6443",
            "0X7F.0.0.1:6443",
            "0177.0.0.1:6443",
            "017700000001:6443",
            "127.000.000.001:6443",
            "LOCALHOST.:6443",
            "0:6443",
            "[fe80::1%25eth0]:6443",
            "[fe80::1%eth0]:6443",
            "2852039166:80",
            "10.0.0.10:06443",
            "10.0.0.10:+6443",
            "10.0.0.10:6443.0",
            "10.0.0.10:71979",
            "10.0.0.10:0",
            "10.0.0.10:-1",
            "10.0.0.10",
            "10.0.0.10:6443:22",
            "::1:6443",
            "10.0.0.10:6443\n",
            "10.0.0.10:6443 ",
            " 10.0.0.10:6443",
            "10.0.0.10\0.evil:6443",
            "user@10.0.0.10:6443",
            "10.0.0.10@127.0.0.1:6443",
            "%31%30.0.0.10:6443",
            "１０.0.0.10:6443",
            "10.0.0.10.:6443",
            "tcp://10.0.0.10:6443",
            "",
            ":6443",
            "-a.example:1",
            "a..example:1",
            "256.0.0.1:1",
        ] {
            assert!(Destination::parse(s).is_err(), "{s:?} parsed");
        }
        let long = format!("{}.example:1", "a".repeat(64));
        assert!(Destination::parse(&long).is_err(), "a 64-byte label");
        let long = format!("{}example:1", "abcdefghi.".repeat(25));
        assert!(Destination::parse(&long).is_err(), "a 254-byte name");
    }

    /// Every accepted IP spelling is the one std prints back.
    #[test]
    fn ip_spellings_round_trip_through_std() {
        for s in [
            "1.2.3.4:5",
            "255.255.255.255:65535",
            "[::1]:80",
            "[2001:db8::]:1",
        ] {
            let d = ok(s);
            let std: core::net::SocketAddr = s.parse().unwrap();
            assert_eq!(d.ip(), Some(std.ip().to_canonical()));
            assert_eq!(d.port, std.port());
        }
    }
}
