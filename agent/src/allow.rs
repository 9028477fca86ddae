//! `--allowed-destination-cidrs`: what the control plane may dial into the
//! node network through this agent (docs/design/limits.md).
//!
//! Each entry is a network with an optional port or port range:
//! `10.0.0.0/8`, `10.1.2.3` (one address), `10.0.0.0/8:443`,
//! `10.0.0.0/8:8000-8999`, `[fd00::/8]:443`, `fd00::/8`. Addresses are
//! spelled strictly (the reverse direction's rules, `konn_frames::addr`:
//! dotted-quad IPv4 without leading zeros, IPv6 as `std` parses it, no
//! zone ids) and an entry with host bits set is refused, so no entry means
//! something other than it seems. An IPv4-mapped IPv6 network
//! (`::ffff:10.0.0.0/104`) is the IPv4 network it maps, and so is a
//! destination: every address is canonicalised (`to_canonical`) before it
//! is matched.
//!
//! An empty list allows everything (upstream has no such check). Otherwise
//! a DIAL_REQ's address is resolved **once**; only the resolved addresses
//! inside the list are connected to (never a second lookup, so a name
//! cannot resolve to an allowed address for the check and another for the
//! connect); when none is inside, the dial is refused with upstream's
//! DIAL_RSP error shape (`dial tcp <address>: …`).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::ops::RangeInclusive;
use std::time::Duration;

use konn_core::io::resolve::{DialError, connect_any, go_dial_error, resolve};
use monoio::net::TcpStream;

/// One allowed network and port range.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Allowed {
    /// The network address (host bits zero, canonical family).
    pub net: IpAddr,
    /// Prefix length.
    pub prefix: u8,
    /// Ports (all by default).
    pub ports: RangeInclusive<u16>,
}

impl Allowed {
    /// Parse one entry (see the module docs).
    pub fn parse(s: &str) -> Result<Self, String> {
        let bad = |why: &str| Err(format!("--allowed-destination-cidrs={s}: {why}"));
        let (net, ports) = if let Some(rest) = s.strip_prefix('[') {
            let Some((net, after)) = rest.split_once(']') else {
                return bad("missing ']'");
            };
            match after {
                "" => (net, None),
                _ => match after.strip_prefix(':') {
                    Some(p) => (net, Some(p)),
                    None => return bad("expected :port or :low-high after ']'"),
                },
            }
        } else if s.matches(':').count() > 1 {
            (s, None) // a bare IPv6 network, no port
        } else {
            match s.split_once(':') {
                Some((net, p)) => (net, Some(p)),
                None => (s, None),
            }
        };
        let (ip, prefix) = match net.split_once('/') {
            Some((ip, len)) => (ip, Some(len)),
            None => (net, None),
        };
        let ip = if let Some(v4) = konn_frames::addr::parse_ipv4(ip) {
            IpAddr::V4(v4)
        } else if ip.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
            return bad("not a dotted-quad IPv4 address (four decimal octets, no leading zeros)");
        } else if let Ok(v6) = ip.parse::<Ipv6Addr>() {
            IpAddr::V6(v6)
        } else {
            return bad("not an IP address or network");
        };
        let max = if ip.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            Some(p) => match decimal(p) {
                Some(n) if n <= u32::from(max) => n as u8,
                _ => return bad(&format!("the prefix length must be 0-{max}")),
            },
        };
        // An IPv4-mapped network is the IPv4 network it maps.
        let (ip, prefix) = match ip {
            IpAddr::V6(v6) if prefix >= 96 && v6.to_ipv4_mapped().is_some() => {
                (ip.to_canonical(), prefix - 96)
            }
            _ => (ip, prefix),
        };
        if mask(ip, prefix) != ip {
            return bad(&format!(
                "host bits are set; the network is {}/{prefix}",
                mask(ip, prefix)
            ));
        }
        let ports = match ports {
            None => 1..=u16::MAX,
            Some(p) => {
                let (lo, hi) = p.split_once('-').unwrap_or((p, p));
                match (port(lo), port(hi)) {
                    (Some(lo), Some(hi)) if lo <= hi => lo..=hi,
                    _ => {
                        return bad(
                            "ports must be a decimal port or low-high range within 1-65535, \
                             without sign or leading zero",
                        );
                    }
                }
            }
        };
        Ok(Self {
            net: ip,
            prefix,
            ports,
        })
    }

    /// Whether `addr` (canonicalised) is inside.
    pub fn contains(&self, addr: SocketAddr) -> bool {
        let ip = addr.ip().to_canonical();
        ip.is_ipv4() == self.net.is_ipv4()
            && mask(ip, self.prefix) == self.net
            && self.ports.contains(&addr.port())
    }
}

fn decimal(s: &str) -> Option<u32> {
    let ok = !s.is_empty()
        && s.len() <= 5
        && s.bytes().all(|b| b.is_ascii_digit())
        && (s == "0" || !s.starts_with('0'));
    ok.then(|| s.parse().ok()).flatten()
}

fn port(s: &str) -> Option<u16> {
    decimal(s)
        .and_then(|n| u16::try_from(n).ok())
        .filter(|&p| p > 0)
}

fn mask(ip: IpAddr, prefix: u8) -> IpAddr {
    match ip {
        IpAddr::V4(v4) => {
            let bits = u32::from(v4);
            let m = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
            IpAddr::V4(Ipv4Addr::from(bits & m))
        }
        IpAddr::V6(v6) => {
            let bits = u128::from(v6);
            let m = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
            IpAddr::V6(Ipv6Addr::from(bits & m))
        }
    }
}

/// The parsed `--allowed-destination-cidrs` (empty: everything allowed).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AllowList {
    entries: Vec<Allowed>,
}

impl AllowList {
    /// Parse every entry.
    ///
    /// # Errors
    ///
    /// The first bad entry, named with the flag.
    pub fn parse(entries: &[String]) -> Result<Self, String> {
        let entries = entries
            .iter()
            .map(|e| Allowed::parse(e))
            .collect::<Result<_, _>>()?;
        Ok(Self { entries })
    }

    /// Whether every destination is allowed (no list).
    pub fn allows_all(&self) -> bool {
        self.entries.is_empty()
    }

    /// Whether `addr` may be dialled.
    pub fn permits(&self, addr: SocketAddr) -> bool {
        self.allows_all() || self.entries.iter().any(|e| e.contains(addr))
    }
}

/// Why a dial did not connect.
#[derive(Debug)]
pub enum DialOutcome {
    /// No resolved address is allowed.
    NotAllowed,
    /// The dial itself failed.
    Failed(DialError),
}

impl DialOutcome {
    /// The DIAL_RSP error text (upstream's shape: `dial tcp <address>: …`).
    pub fn error_text(&self, address: &str) -> String {
        match self {
            Self::NotAllowed => format!(
                "dial tcp {address}: {}",
                konn_protocol::server::limits::NOT_ALLOWED
            ),
            Self::Failed(e) => go_dial_error(address, e),
        }
    }
}

/// Dial `address` within `timeout`: resolve once, connect only to the
/// resolved addresses `allow` permits.
pub async fn dial(
    address: &str,
    timeout: Duration,
    allow: &AllowList,
) -> Result<TcpStream, DialOutcome> {
    let attempt = async {
        let addrs = resolve(address).await.map_err(DialOutcome::Failed)?;
        let allowed: Vec<SocketAddr> = addrs.into_iter().filter(|a| allow.permits(*a)).collect();
        if allowed.is_empty() {
            return Err(DialOutcome::NotAllowed);
        }
        connect_any(allowed).await.map_err(DialOutcome::Failed)
    };
    match monoio::time::timeout(timeout, attempt).await {
        Ok(r) => r,
        Err(_) => Err(DialOutcome::Failed(DialError::Timeout)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(entries: &[&str]) -> AllowList {
        AllowList::parse(&entries.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>()).unwrap()
    }

    fn sa(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn parses_networks_ports_and_ranges() {
        let a = Allowed::parse("10.0.0.0/8:8000-8999").unwrap();
        assert_eq!(a.net, IpAddr::V4(Ipv4Addr::new(10, 0, 0, 0)));
        assert_eq!((a.prefix, a.ports), (8, 8000..=8999));
        let one = Allowed::parse("10.1.2.3").unwrap();
        assert_eq!((one.prefix, one.ports), (32, 1..=65535));
        let v6 = Allowed::parse("[fd00::/8]:443").unwrap();
        assert_eq!((v6.prefix, v6.ports), (8, 443..=443));
        assert_eq!(Allowed::parse("fd00::/8").unwrap().ports, 1..=65535);
        assert_eq!(
            Allowed::parse("0.0.0.0/0").unwrap().net,
            IpAddr::V4(Ipv4Addr::UNSPECIFIED)
        );
    }

    #[test]
    fn ipv4_mapped_networks_and_destinations_are_canonical() {
        let mapped = Allowed::parse("[::ffff:10.0.0.0/104]:443").unwrap();
        assert_eq!(mapped, Allowed::parse("10.0.0.0/8:443").unwrap());
        let l = list(&["10.0.0.0/8:443"]);
        assert!(l.permits(sa("10.2.3.4:443")));
        assert!(l.permits(sa("[::ffff:10.2.3.4]:443")));
        assert!(!l.permits(sa("[::ffff:127.0.0.1]:443")));
        assert!(!l.permits(sa("10.2.3.4:444")));
        assert!(!l.permits(sa("11.0.0.1:443")));
        // An IPv6 list never matches IPv4 and the other way round.
        let v6 = list(&["::/0"]);
        assert!(!v6.permits(sa("127.0.0.1:80")));
        assert!(v6.permits(sa("[::1]:80")));
    }

    #[test]
    fn refuses_ambiguous_spellings() {
        for bad in [
            "127.1",
            "0x7f.0.0.1",
            "0177.0.0.1/8",
            "010.0.0.0/8",
            "10.0.0.1/8",
            "10.0.0.0/33",
            "10.0.0.0/08",
            "10.0.0.0/8:0",
            "10.0.0.0/8:65536",
            "10.0.0.0/8:+80",
            "10.0.0.0/8:080",
            "10.0.0.0/8:90-80",
            "10.0.0.0/8:80-",
            "[fe80::1%eth0]:80",
            "[fd00::/8",
            "[fd00::/8]443",
            "fd00::1/129",
            "localhost",
            " 10.0.0.0/8",
            "",
        ] {
            let e = Allowed::parse(bad).expect_err(bad);
            assert!(e.starts_with("--allowed-destination-cidrs="), "{e}");
        }
        let host_bits = Allowed::parse("10.0.0.1/8").unwrap_err();
        assert!(host_bits.contains("10.0.0.0/8"), "{host_bits}");
    }

    #[test]
    fn empty_allows_everything() {
        let l = AllowList::default();
        assert!(l.allows_all());
        assert!(l.permits(sa("169.254.169.254:80")));
    }

    #[test]
    fn refusal_text_has_upstreams_shape_and_maps_to_502() {
        let t = DialOutcome::NotAllowed.error_text("10.0.0.1:22");
        assert!(t.starts_with("dial tcp 10.0.0.1:22: "), "{t}");
        assert_eq!(
            konn_protocol::server::router::dial_error_status(&t),
            502,
            "{t}"
        );
    }
}
