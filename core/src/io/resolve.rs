//! Turning a dial address (`host:port`) into socket addresses, and dialling
//! TCP with one deadline over all of them, reporting failures the way Go's
//! `net.Dial` words them.
//!
//! IP literals never touch DNS. Names go through the system resolver
//! (`getaddrinfo`) on the runtime's blocking pool, so a slow DNS server never
//! stalls a worker. Address syntax follows Go's `net.SplitHostPort`: IPv6
//! literals in brackets, a port is required.

use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::time::Duration;

use monoio::net::TcpStream;

/// Why a dial failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DialError {
    /// The address is not `host:port`; the text is Go's reason, e.g.
    /// `missing port in address`.
    BadAddress(&'static str),
    /// The port is not a number in 0–65535.
    BadPort,
    /// The name did not resolve.
    NoSuchHost(String),
    /// The deadline passed.
    Timeout,
    /// `connect(2)` failed with this errno for this address.
    Connect {
        /// The address that was tried last.
        addr: SocketAddr,
        /// The errno.
        errno: i32,
    },
}

/// Split `host:port` like Go's `net.SplitHostPort`.
pub fn split_host_port(address: &str) -> Result<(&str, &str), DialError> {
    if let Some(rest) = address.strip_prefix('[') {
        let end = rest
            .find(']')
            .ok_or(DialError::BadAddress("missing ']' in address"))?;
        let host = &rest[..end];
        let after = &rest[end + 1..];
        let port = after.strip_prefix(':').ok_or(if after.is_empty() {
            DialError::BadAddress("missing port in address")
        } else {
            DialError::BadAddress("unexpected ']' in address")
        })?;
        return Ok((host, port));
    }
    let (host, port) = address
        .rsplit_once(':')
        .ok_or(DialError::BadAddress("missing port in address"))?;
    if host.contains(':') {
        return Err(DialError::BadAddress("too many colons in address"));
    }
    Ok((host, port))
}

/// Resolve `address` to the socket addresses to try, in order.
pub async fn resolve(address: &str) -> Result<Vec<SocketAddr>, DialError> {
    let (host, port) = split_host_port(address)?;
    let port: u16 = port.parse().map_err(|_| DialError::BadPort)?;
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(vec![SocketAddr::new(ip, port)]);
    }
    // Go treats an empty host as the local system.
    let name = if host.is_empty() {
        "localhost".to_owned()
    } else {
        host.to_owned()
    };
    let lookup = name.clone();
    let res = monoio::spawn_blocking(move || {
        (lookup.as_str(), port)
            .to_socket_addrs()
            .map(Iterator::collect::<Vec<_>>)
    })
    .await
    .map_err(|_| DialError::NoSuchHost(name.clone()))?;
    match res {
        Ok(addrs) if !addrs.is_empty() => Ok(addrs),
        _ => Err(DialError::NoSuchHost(name)),
    }
}

/// Dial `address` over TCP within `timeout` (resolution included), trying
/// each resolved address in turn. `TCP_NODELAY` is set on success.
pub async fn dial_tcp(address: &str, timeout: Duration) -> Result<TcpStream, DialError> {
    let attempt = async { connect_any(resolve(address).await?).await };
    match monoio::time::timeout(timeout, attempt).await {
        Ok(r) => r,
        Err(_) => Err(DialError::Timeout),
    }
}

/// Connect to each of `addrs` in turn until one answers (no deadline of
/// its own: the caller's bounds the whole attempt). `TCP_NODELAY` is set
/// on success; with no address at all the error is [`DialError::Timeout`].
pub async fn connect_any(addrs: Vec<SocketAddr>) -> Result<TcpStream, DialError> {
    let mut last = DialError::Timeout;
    for addr in addrs {
        match TcpStream::connect_addr(addr).await {
            Ok(s) => {
                let _ = s.set_nodelay(true);
                return Ok(s);
            }
            Err(e) => {
                last = DialError::Connect {
                    addr,
                    errno: e.raw_os_error().unwrap_or(0),
                };
            }
        }
    }
    Err(last)
}

/// Go's wording of a failed `net.Dial("tcp", address)`, whose substrings
/// ("connection refused", "i/o timeout", "no such host") proxy-server maps to
/// HTTP statuses.
pub fn go_dial_error(address: &str, err: &DialError) -> String {
    match err {
        DialError::BadAddress(why) => format!("dial tcp: address {address}: {why}"),
        DialError::BadPort => {
            let port = split_host_port(address).map_or("", |(_, p)| p);
            format!("dial tcp: lookup tcp/{port}: unknown port")
        }
        DialError::NoSuchHost(host) => format!("dial tcp: lookup {host}: no such host"),
        DialError::Timeout => format!("dial tcp {address}: i/o timeout"),
        DialError::Connect { addr, errno } => {
            format!("dial tcp {addr}: connect: {}", errno_text(*errno))
        }
    }
}

/// Go's lower-case text for an errno (`syscall.Errno.Error()`).
pub fn errno_text(errno: i32) -> String {
    match errno {
        libc::ECONNREFUSED => "connection refused".into(),
        libc::ENETUNREACH => "network is unreachable".into(),
        libc::EHOSTUNREACH => "no route to host".into(),
        libc::ETIMEDOUT => "connection timed out".into(),
        libc::ECONNRESET => "connection reset by peer".into(),
        libc::EMFILE => "too many open files".into(),
        libc::ENFILE => "too many open files in system".into(),
        libc::EADDRNOTAVAIL => "cannot assign requested address".into(),
        libc::ENETDOWN => "network is down".into(),
        libc::EACCES => "permission denied".into(),
        _ => {
            let s = std::io::Error::from_raw_os_error(errno).to_string();
            let s = s.split(" (os error").next().unwrap_or(&s);
            let mut c = s.chars();
            c.next()
                .map(|f| f.to_lowercase().chain(c).collect())
                .unwrap_or_default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::runtime::{Engine, block_on};

    #[test]
    fn split_like_go() {
        assert_eq!(split_host_port("10.0.0.5:10250"), Ok(("10.0.0.5", "10250")));
        assert_eq!(split_host_port("[::1]:443"), Ok(("::1", "443")));
        assert_eq!(split_host_port(":80"), Ok(("", "80")));
        assert_eq!(
            split_host_port("host"),
            Err(DialError::BadAddress("missing port in address"))
        );
        assert_eq!(
            split_host_port("::1:80"),
            Err(DialError::BadAddress("too many colons in address"))
        );
        assert_eq!(
            split_host_port("[::1]"),
            Err(DialError::BadAddress("missing port in address"))
        );
    }

    #[test]
    fn go_texts() {
        let refused = DialError::Connect {
            addr: "127.0.0.1:1".parse().unwrap(),
            errno: libc::ECONNREFUSED,
        };
        assert_eq!(
            go_dial_error("127.0.0.1:1", &refused),
            "dial tcp 127.0.0.1:1: connect: connection refused"
        );
        assert_eq!(
            go_dial_error("10.0.0.1:80", &DialError::Timeout),
            "dial tcp 10.0.0.1:80: i/o timeout"
        );
        assert_eq!(
            go_dial_error(
                "nowhere.invalid:1",
                &DialError::NoSuchHost("nowhere.invalid".into())
            ),
            "dial tcp: lookup nowhere.invalid: no such host"
        );
        assert_eq!(
            go_dial_error("host", &DialError::BadAddress("missing port in address")),
            "dial tcp: address host: missing port in address"
        );
        assert_eq!(errno_text(libc::EPERM), "operation not permitted");
    }

    #[test]
    fn dial_outcomes_on_loopback() {
        block_on(Engine::Epoll, async {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = l.local_addr().unwrap().to_string();
            assert!(dial_tcp(&addr, Duration::from_secs(5)).await.is_ok());
            drop(l);
            let e = dial_tcp(&addr, Duration::from_secs(5)).await.unwrap_err();
            assert!(
                go_dial_error(&addr, &e).ends_with("connect: connection refused"),
                "{e:?}"
            );
            let e = dial_tcp("nowhere.invalid:80", Duration::from_secs(10))
                .await
                .unwrap_err();
            assert_eq!(e, DialError::NoSuchHost("nowhere.invalid".into()));
            let e = dial_tcp("localhost:99999", Duration::from_secs(5))
                .await
                .unwrap_err();
            assert_eq!(e, DialError::BadPort);
        })
        .unwrap();
    }
}
