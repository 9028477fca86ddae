//! The agent's side of the reverse direction (KEP-2025,
//! docs/design/reverse.md): node-local listeners for `--target`s whose
//! connections travel to the control plane through a tunnel.
//!
//! `--target=local_port:dst_host:dst_port` (repeatable) with
//! `--bind-address=ip`: the agent listens on `bind-address:local_port`, one
//! `SO_REUSEPORT` listener per worker, after making the address local
//! (`crate::netaddr`) if needed. Each accepted connection goes to a random
//! tunnel that negotiated `konn-reverse` — one of the accepting worker's if
//! it has any, else the socket moves to a worker that has one — which asks
//! the server to dial `dst_host:dst_port` (a key of the server's
//! `--allowed-destination` list, sent as configured). Without such a
//! tunnel the connection is closed at once and counted
//! (`konn_reverse_refusals_total{reason="no_tunnel"}`).

use std::net::{IpAddr, SocketAddr};

use konn_core::Error;
use konn_core::io::listen::TcpListeners;
use konn_frames::addr::Destination;

use crate::netaddr::{AddedAddress, ensure_local};

/// One `--target`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// The port to listen on (at `--bind-address`).
    pub local_port: u16,
    /// The destination as configured: the key the server's allow-list must
    /// hold, spelled exactly so.
    pub destination: String,
}

impl Target {
    /// Parse `local_port:dst_host:dst_port` (the destination in the strict
    /// form of `konn_frames::addr`).
    pub fn parse(s: &str) -> Result<Self, String> {
        let (port, destination) = s
            .split_once(':')
            .ok_or_else(|| format!("--target={s:?}: want local_port:dst_host:dst_port"))?;
        let local_port = port
            .parse::<u16>()
            .ok()
            .filter(|p| *p > 0 && !port.starts_with(['0', '+']))
            .ok_or_else(|| format!("--target={s:?}: the local port must be 1-65535"))?;
        Destination::parse(destination).map_err(|e| format!("--target={s:?}: {e}"))?;
        Ok(Self {
            local_port,
            destination: destination.to_owned(),
        })
    }
}

/// The reverse direction's settings.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReverseSettings {
    /// `--bind-address`: where the listeners bind.
    pub bind_address: Option<IpAddr>,
    /// `--target`s; none: the reverse direction is off (and not offered to
    /// servers).
    pub targets: Vec<Target>,
    /// Add `bind_address` to `lo` when the node does not have it.
    pub manage_address: bool,
}

impl ReverseSettings {
    /// From the flags' values (validated here, with messages naming the
    /// flag).
    pub fn parse(targets: &[String], bind_address: &str) -> Result<Self, String> {
        let targets = targets
            .iter()
            .map(|t| Target::parse(t))
            .collect::<Result<Vec<_>, _>>()?;
        let bind_address = if bind_address.is_empty() {
            None
        } else {
            Some(
                bind_address
                    .parse::<IpAddr>()
                    .map_err(|_| format!("--bind-address={bind_address:?}: not an IP address"))?,
            )
        };
        if let Some(ip) = bind_address
            && (ip.is_unspecified() || ip.is_multicast())
        {
            return Err(format!(
                "--bind-address={ip}: the --target listeners must be node-local; an unspecified or multicast address would open them to the node network"
            ));
        }
        if !targets.is_empty() && bind_address.is_none() {
            return Err(
                "--target needs --bind-address: the node-local address to listen on (the address kube-apiserver advertises)"
                    .to_owned(),
            );
        }
        let mut ports: Vec<u16> = targets.iter().map(|t| t.local_port).collect();
        ports.sort_unstable();
        if ports.windows(2).any(|w| w[0] == w[1]) {
            return Err("two --target entries use the same local port".to_owned());
        }
        Ok(Self {
            bind_address,
            targets,
            manage_address: true,
        })
    }

    /// Whether any `--target` is configured.
    pub fn enabled(&self) -> bool {
        !self.targets.is_empty()
    }
}

/// The listeners, bound at start, and the address added for them (removed
/// when this is dropped, after the workers stopped).
pub(crate) struct Listeners {
    /// Per target (same order): one listener per worker.
    pub(crate) per_target: Vec<TcpListeners>,
    _added: Option<AddedAddress>,
}

impl Listeners {
    /// Make the bind address local if needed and bind every target's
    /// listeners (`workers` each).
    pub(crate) fn bind(settings: &ReverseSettings, workers: usize) -> Result<Option<Self>, Error> {
        let Some(ip) = settings.bind_address.filter(|_| settings.enabled()) else {
            return Ok(None);
        };
        let added = if settings.manage_address {
            ensure_local(ip).map_err(|e| Error::Bind {
                addr: ip.to_string(),
                source: std::io::Error::new(
                    e.kind(),
                    format!(
                        "--bind-address {ip} is not an address of this node and adding it to lo failed ({e}); add it beforehand or give the agent CAP_NET_ADMIN"
                    ),
                ),
            })?
        } else {
            None
        };
        let mut per_target = Vec::new();
        for t in &settings.targets {
            per_target.push(TcpListeners::bind(
                SocketAddr::new(ip, t.local_port),
                workers,
                1024,
            )?);
            tracing::info!(
                listen = %SocketAddr::new(ip, t.local_port),
                destination = %t.destination,
                "node-to-control-plane listener"
            );
        }
        Ok(Some(Self {
            per_target,
            _added: added,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_parse_strictly() {
        assert_eq!(
            Target::parse("6443:10.0.0.10:6443").unwrap(),
            Target {
                local_port: 6443,
                destination: "10.0.0.10:6443".into()
            }
        );
        assert_eq!(
            Target::parse("443:[fd00::1]:6443").unwrap().destination,
            "[fd00::1]:6443"
        );
        for bad in [
            "6443",
            "6443:10.0.0.10",
            "0:10.0.0.10:6443",
            "06443:10.0.0.10:6443",
            "70000:10.0.0.10:6443",
            "6443:127.1:6443",
            "6443:10.0.0.10:6443 ",
        ] {
            assert!(Target::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn settings_need_a_bind_address_and_distinct_ports() {
        let t = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        assert!(!ReverseSettings::parse(&[], "").unwrap().enabled());
        assert!(ReverseSettings::parse(&t(&["6443:10.0.0.10:6443"]), "").is_err());
        assert!(ReverseSettings::parse(&t(&["6443:10.0.0.10:6443"]), "nope").is_err());
        assert!(
            ReverseSettings::parse(
                &t(&["6443:10.0.0.10:6443", "6443:10.0.0.11:6443"]),
                "169.254.1.1"
            )
            .is_err()
        );
        for open in ["0.0.0.0", "::", "224.0.0.1"] {
            let e = ReverseSettings::parse(&t(&["6443:10.0.0.10:6443"]), open).unwrap_err();
            assert!(e.contains("node-local"), "{open}: {e}");
        }
        let s = ReverseSettings::parse(&t(&["6443:10.0.0.10:6443"]), "169.254.1.1").unwrap();
        assert!(s.enabled());
        assert_eq!(s.bind_address, Some("169.254.1.1".parse().unwrap()));
    }
}
