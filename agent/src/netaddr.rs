//! Node-local listener addresses for the reverse direction (KEP-2025,
//! docs/design/reverse.md): `--bind-address` is added to the loopback
//! interface with host scope when the node does not have it, and removed
//! again when the agent exits.
//!
//! The KEP suggests a dummy interface; konn uses `lo` with `scope host`
//! instead, which every kernel has (the `dummy` driver is a module many
//! minimal nodes and CI machines lack) and which gives the same property:
//! the address is reachable from the node itself (kubelet, host-network
//! pods) and routed nowhere else. Adding an address needs `CAP_NET_ADMIN`;
//! without it the operator adds the address beforehand (see
//! docs/NODE-TO-CONTROL-PLANE.md).
//!
//! The rtnetlink messages are built by hand (a `RTM_NEWADDR` /
//! `RTM_DELADDR` request with an `ifaddrmsg` and `IFA_LOCAL` +
//! `IFA_ADDRESS`), sent on a `NETLINK_ROUTE` socket, and the kernel's
//! acknowledgement is read back: a failure names its errno.

use std::io;
use std::net::IpAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// An address this process added to `lo`; removed when dropped.
#[derive(Debug)]
pub struct AddedAddress {
    ip: IpAddr,
}

impl AddedAddress {
    /// The address.
    pub fn ip(&self) -> IpAddr {
        self.ip
    }
}

impl Drop for AddedAddress {
    fn drop(&mut self) {
        if let Err(e) = change(libc::RTM_DELADDR, self.ip) {
            tracing::warn!(address = %self.ip, error = %e, "could not remove the node-local address");
        } else {
            tracing::info!(address = %self.ip, "removed the node-local address from lo");
        }
    }
}

/// Whether `ip` is configured on one of this host's interfaces
/// (`getifaddrs(3)`; a trial `bind` would not do: a fresh network namespace
/// lets a socket bind to addresses it does not have).
#[allow(unsafe_code)] // getifaddrs(3) / freeifaddrs(3)
pub fn is_local(ip: IpAddr) -> bool {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: `head` is a valid out-pointer; on success the list is freed
    // below with freeifaddrs and not used after.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return false;
    }
    let mut found = false;
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned, which
        // stays valid until freeifaddrs.
        let ifa = unsafe { &*cur };
        if !ifa.ifa_addr.is_null() {
            // SAFETY: a non-null ifa_addr points to a sockaddr whose family
            // says which sockaddr_* it is, at least that large.
            let addr = unsafe {
                match i32::from((*ifa.ifa_addr).sa_family) {
                    libc::AF_INET => {
                        let sin = &*ifa.ifa_addr.cast::<libc::sockaddr_in>();
                        Some(IpAddr::from(
                            u32::from_be(sin.sin_addr.s_addr).to_be_bytes(),
                        ))
                    }
                    libc::AF_INET6 => {
                        let sin6 = &*ifa.ifa_addr.cast::<libc::sockaddr_in6>();
                        Some(IpAddr::from(sin6.sin6_addr.s6_addr))
                    }
                    _ => None,
                }
            };
            if addr == Some(ip) {
                found = true;
                break;
            }
        }
        cur = ifa.ifa_next;
    }
    // SAFETY: `head` came from a successful getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(head) };
    found
}

/// Make `ip` an address of this host: nothing when it is one already
/// (`Ok(None)`), else add it to `lo` with host scope (`Ok(Some(..))`, which
/// removes it again when dropped).
pub fn ensure_local(ip: IpAddr) -> io::Result<Option<AddedAddress>> {
    if is_local(ip) {
        return Ok(None);
    }
    change(libc::RTM_NEWADDR, ip)?;
    tracing::info!(address = %ip, "added the node-local address to lo (scope host)");
    Ok(Some(AddedAddress { ip }))
}

/// Send one address request for `ip` on `lo` and wait for the kernel's
/// acknowledgement.
#[allow(unsafe_code)] // socket(2), send(2), recv(2) on a netlink socket
fn change(kind: u16, ip: IpAddr) -> io::Result<()> {
    let lo = loopback_index()?;
    let msg = address_message(kind, ip, lo);
    // SAFETY: socket(2) with constant arguments; the result is checked and
    // owned by `OwnedFd` below.
    let fd = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            libc::NETLINK_ROUTE,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a descriptor we just created and own exclusively.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: `msg` is a valid, initialised buffer of `msg.len()` bytes for
    // the duration of the call; the kernel address (pid 0) is implied by an
    // unconnected netlink socket's default destination.
    let sent = unsafe { libc::send(sock.as_raw_fd(), msg.as_ptr().cast(), msg.len(), 0) };
    if sent < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut buf = [0u8; 1024];
    // SAFETY: `buf` is a writable buffer of `buf.len()` bytes for the
    // duration of the call.
    let n = unsafe { libc::recv(sock.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    parse_ack(buf.get(..n.unsigned_abs()).unwrap_or_default())
}

#[allow(unsafe_code)] // if_nametoindex(3)
fn loopback_index() -> io::Result<u32> {
    // SAFETY: the argument is a NUL-terminated C string literal.
    let idx = unsafe { libc::if_nametoindex(c"lo".as_ptr()) };
    if idx == 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(idx)
    }
}

const NLMSG_HDRLEN: usize = 16;
const NLMSG_ERROR: u16 = 2;

/// An `RTM_NEWADDR`/`RTM_DELADDR` request: `nlmsghdr`, `ifaddrmsg`, then
/// `IFA_LOCAL` and `IFA_ADDRESS` attributes (each 4-byte aligned).
fn address_message(kind: u16, ip: IpAddr, ifindex: u32) -> Vec<u8> {
    let (family, prefix, bytes): (u8, u8, Vec<u8>) = match ip {
        IpAddr::V4(v4) => (libc::AF_INET as u8, 32, v4.octets().to_vec()),
        IpAddr::V6(v6) => (libc::AF_INET6 as u8, 128, v6.octets().to_vec()),
    };
    let attr_len = 4 + bytes.len(); // rtattr header + address, already aligned
    let len = NLMSG_HDRLEN + 8 + 2 * attr_len;
    let mut flags = libc::NLM_F_REQUEST as u16 | libc::NLM_F_ACK as u16;
    if kind == libc::RTM_NEWADDR {
        flags |= libc::NLM_F_CREATE as u16 | libc::NLM_F_EXCL as u16;
    }
    let mut m = Vec::with_capacity(len);
    m.extend_from_slice(&(len as u32).to_ne_bytes());
    m.extend_from_slice(&kind.to_ne_bytes());
    m.extend_from_slice(&flags.to_ne_bytes());
    m.extend_from_slice(&1u32.to_ne_bytes()); // sequence number
    m.extend_from_slice(&0u32.to_ne_bytes()); // port id: the kernel assigns
    m.extend_from_slice(&[family, prefix, 0, libc::RT_SCOPE_HOST]);
    m.extend_from_slice(&ifindex.to_ne_bytes());
    for ty in [libc::IFA_LOCAL, libc::IFA_ADDRESS] {
        m.extend_from_slice(&(attr_len as u16).to_ne_bytes());
        m.extend_from_slice(&ty.to_ne_bytes());
        m.extend_from_slice(&bytes);
    }
    m
}

/// The kernel's answer to an `NLM_F_ACK` request: an `NLMSG_ERROR` whose
/// error is 0 on success, else a negative errno.
fn parse_ack(reply: &[u8]) -> io::Result<()> {
    let u16_at = |i: usize| {
        reply
            .get(i..i + 2)
            .map(|b| u16::from_ne_bytes([b[0], b[1]]))
    };
    let i32_at = |i: usize| {
        reply
            .get(i..i + 4)
            .map(|b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
    };
    match (u16_at(4), i32_at(NLMSG_HDRLEN)) {
        (Some(NLMSG_ERROR), Some(0)) => Ok(()),
        (Some(NLMSG_ERROR), Some(e)) => Err(io::Error::from_raw_os_error(-e)),
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "unexpected rtnetlink reply",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_request_is_laid_out_as_rtnetlink_expects() {
        let m = address_message(libc::RTM_NEWADDR, "10.1.2.3".parse().unwrap(), 1);
        assert_eq!(m.len(), 16 + 8 + 2 * 8);
        assert_eq!(u32::from_ne_bytes(m[0..4].try_into().unwrap()), 40);
        assert_eq!(u16::from_ne_bytes(m[4..6].try_into().unwrap()), 20);
        assert_eq!(&m[16..20], &[libc::AF_INET as u8, 32, 0, 254]);
        assert_eq!(&m[28..32], &[10, 1, 2, 3]);
        let m = address_message(libc::RTM_DELADDR, "fd00::1".parse().unwrap(), 1);
        assert_eq!(m.len(), 16 + 8 + 2 * 20);
    }

    #[test]
    fn acknowledgements() {
        let mut ok = vec![0u8; 36];
        ok[4..6].copy_from_slice(&NLMSG_ERROR.to_ne_bytes());
        assert!(parse_ack(&ok).is_ok());
        let mut eperm = ok.clone();
        eperm[16..20].copy_from_slice(&(-libc::EPERM).to_ne_bytes());
        assert_eq!(
            parse_ack(&eperm).unwrap_err().raw_os_error(),
            Some(libc::EPERM)
        );
        assert!(parse_ack(&[1, 2]).is_err());
    }

    /// Adds and removes a real address in a network namespace of this test
    /// thread's own (so nothing on the machine is touched) when the test
    /// may create one (root); skipped, loudly, otherwise.
    #[test]
    #[allow(unsafe_code)] // unshare(2)
    fn adds_and_removes_an_address_when_privileged() {
        // SAFETY: unshare(2) with a constant flag; it moves only the
        // calling thread, this test's own, which ends with the test.
        if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
            let err = io::Error::last_os_error();
            // scripts/test sets it where namespaces must work (root).
            assert!(
                std::env::var_os("KONN_NETNS_REQUIRED").is_none(),
                "cannot create a network namespace: {err}"
            );
            eprintln!("skipped: cannot create a network namespace ({err})");
            return;
        }
        let ip: IpAddr = "10.253.0.7".parse().unwrap();
        assert!(!is_local(ip));
        let added = ensure_local(ip).expect("add").expect("was missing");
        assert_eq!(added.ip(), ip);
        assert!(is_local(ip));
        assert!(ensure_local(ip).unwrap().is_none(), "present now");
        drop(added);
        assert!(!is_local(ip));
        let v6: IpAddr = "fd00:253::7".parse().unwrap();
        let added = ensure_local(v6).expect("add v6").expect("was missing");
        assert!(is_local(v6));
        drop(added);
        assert!(!is_local(v6));
    }
}
