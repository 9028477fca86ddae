//! The server's side of the reverse direction (KEP-2025,
//! docs/design/reverse.md): dialling the control-plane destination an
//! agent's REVERSE_DIAL_REQ was allowed, then serving that connection like
//! a CONNECT frontend's socket.
//!
//! The router has matched the agent's key against the allow-list and
//! applied the per-agent limits; here the *configured* destination is
//! dialled ([`ReverseSettings`]), with these checks:
//!
//! - a name is resolved by this server, once; if any address it resolves to
//!   is in the deny set (loopback, link-local — which covers cloud metadata
//!   endpoints —, unspecified, multicast, broadcast, and IPv4 addresses
//!   embedded in IPv6 forms of those) the dial is refused, since a name that
//!   answers with such an address is a rebinding attempt or a mistake; an
//!   IP entry is dialled as configured (listing `127.0.0.1:6443` explicitly
//!   is how an operator allows a loopback kube-apiserver);
//! - the connected socket's peer must be the address dialled;
//! - resolving and connecting share one deadline.
//!
//! Every failure reaches the agent as the same generic refusal; the reason
//! is logged at `-v=2` and counted (`konn_reverse_refusals_total`).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::rc::Rc;

use bytes::BytesMut;
use konn_core::io::resolve;
use konn_frames::addr::Host;
use konn_protocol::server::backends::BackendId;
use konn_protocol::server::router::ReverseRefusal;
use monoio::net::TcpStream;

use crate::cluster::Cluster;
use crate::connect::{ConnectFrontend, Sock, Wire, relay_established};
use crate::settings::AllowedDestination;
use crate::worker::{FrontendRef, Stop, Worker};

/// Dial destination `target` for reverse dial `random` of `backend`, then
/// serve the connection until either side ends it. Runs as a task of the
/// backend's worker; `target` indexes the backend's cluster's allow-list.
pub async fn dial_and_serve(
    worker: Rc<Worker>,
    cluster: Rc<Cluster>,
    backend: BackendId,
    random: i64,
    target: usize,
) {
    let reverse = &cluster.settings.reverse;
    let Some(dest) = reverse.destinations.get(target).cloned() else {
        fail(
            &worker,
            &cluster,
            backend,
            random,
            ReverseRefusal::NotAllowed,
            "no such entry",
        );
        return;
    };
    let timeout = reverse.dial_timeout;
    let sock = match monoio::time::timeout(timeout, connect(&dest)).await {
        Ok(Ok(sock)) => sock,
        Ok(Err(why)) => {
            fail(&worker, &cluster, backend, random, why, &dest.key);
            return;
        }
        Err(_) => {
            let why = ReverseRefusal::Timeout;
            fail(&worker, &cluster, backend, random, why, &dest.key);
            return;
        }
    };
    serve(worker, cluster, backend, random, sock).await;
}

/// Resolve (names only), check, connect, and check the peer.
async fn connect(dest: &AllowedDestination) -> Result<TcpStream, ReverseRefusal> {
    let port = dest.dest.port;
    let addrs: Vec<SocketAddr> = match &dest.dest.host {
        Host::Ip(ip) => vec![SocketAddr::new(*ip, port)],
        Host::Name(_) => {
            let addrs = resolve::resolve(&dest.dest.to_string())
                .await
                .map_err(|_| ReverseRefusal::Resolve)?;
            if addrs.iter().any(|a| denied(a.ip())) {
                return Err(ReverseRefusal::DeniedAddress);
            }
            addrs
        }
    };
    let mut why = ReverseRefusal::DialError;
    for addr in addrs {
        match TcpStream::connect_addr(addr).await {
            Ok(s) => {
                let peer = s.peer_addr().ok().map(|p| p.ip().to_canonical());
                if peer != Some(addr.ip().to_canonical()) {
                    why = ReverseRefusal::PeerMismatch;
                    continue;
                }
                let _ = s.set_nodelay(true);
                return Ok(s);
            }
            Err(_) => why = ReverseRefusal::DialError,
        }
    }
    Err(why)
}

/// Whether a name must not resolve to `ip` (see the module docs).
pub fn denied(ip: IpAddr) -> bool {
    match ip.to_canonical() {
        IpAddr::V4(v4) => denied_v4(v4),
        IpAddr::V6(v6) => {
            v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                || (v6.segments()[0] & 0xffc0) == 0xfe80 // link-local
                || v6 == Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254) // AWS metadata
                || embedded_v4(v6).is_some_and(denied_v4)
        }
    }
}

fn denied_v4(v4: Ipv4Addr) -> bool {
    v4.is_loopback()
        || v4.is_link_local()
        || v4.is_unspecified()
        || v4.is_multicast()
        || v4.is_broadcast()
}

/// The IPv4 address inside an IPv4-compatible (`::a.b.c.d`), NAT64
/// (`64:ff9b::/96`) or 6to4 (`2002::/16`) address.
fn embedded_v4(v6: Ipv6Addr) -> Option<Ipv4Addr> {
    let s = v6.segments();
    let o = v6.octets();
    if s[..6] == [0, 0, 0, 0, 0, 0] || s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        return Some(Ipv4Addr::new(o[12], o[13], o[14], o[15]));
    }
    if s[0] == 0x2002 {
        return Some(Ipv4Addr::new(o[2], o[3], o[4], o[5]));
    }
    None
}

fn fail(
    worker: &Worker,
    cluster: &Cluster,
    backend: BackendId,
    random: i64,
    why: ReverseRefusal,
    what: &str,
) {
    tracing::debug!(backend, destination = %what, reason = why.label(), "reverse dial failed");
    cluster
        .router
        .borrow_mut()
        .reverse_dial_failed(backend, random, why);
    cluster.apply(worker);
    cluster.publish(worker);
}

/// Serve the dialled connection as a frontend of this worker.
async fn serve(
    worker: Rc<Worker>,
    cluster: Rc<Cluster>,
    backend: BackendId,
    random: i64,
    sock: TcpStream,
) {
    let fid = worker.next_id();
    let Some(connect_id) = cluster
        .router
        .borrow_mut()
        .reverse_dialed(backend, random, fid)
    else {
        // The tunnel went while we dialled.
        return;
    };
    let cf = Rc::new(ConnectFrontend::new());
    let weak = Rc::downgrade(&cf);
    cluster.track(
        &worker,
        fid,
        Box::new(move |how| {
            if let (Stop::Now, Some(cf)) = (how, weak.upgrade()) {
                cf.abort();
            }
        }),
    );
    cluster
        .frontends
        .borrow_mut()
        .insert(fid, FrontendRef::Connect(cf.clone()));
    cluster.metrics.reverse_connections().inc();
    cf.set_reverse();
    cf.established(backend, connect_id);
    cluster.apply(&worker);
    cluster.publish(&worker);
    tracing::debug!(
        frontend = fid,
        backend,
        connect_id,
        "reverse connection established"
    );
    let mut wire = Wire::new(Sock::Tcp(sock), None, BytesMut::new());
    relay_established(
        &worker,
        &cluster,
        fid,
        &cf,
        &mut wire,
        (backend, connect_id),
    )
    .await;
    cluster.frontends.borrow_mut().remove(&fid);
    cluster.router.borrow_mut().frontend_gone(fid);
    cluster.apply(&worker);
    cluster.publish(&worker);
    wire.close().await;
    cluster.untrack(&worker, fid);
    cluster.metrics.reverse_connections().dec();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_deny_set() {
        for ip in [
            "127.0.0.1",
            "127.255.0.1",
            "0.0.0.0",
            "169.254.169.254",
            "224.0.0.1",
            "255.255.255.255",
            "::1",
            "::",
            "fe80::1",
            "ff02::1",
            "fd00:ec2::254",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "::127.0.0.1",
            "64:ff9b::7f00:1",
            "2002:7f00:1::",
        ] {
            assert!(denied(ip.parse().unwrap()), "{ip} allowed");
        }
        for ip in [
            "10.0.0.10",
            "192.168.1.1",
            "8.8.8.8",
            "fd00::1",
            "2001:db8::1",
            "::ffff:10.0.0.10",
        ] {
            assert!(!denied(ip.parse().unwrap()), "{ip} denied");
        }
    }
}
