//! Which upstream addresses a backend may not use.
//!
//! An Ingress in any namespace names its backends, so a backend address is hostile input: an
//! EndpointSlice (or an ExternalName that resolves) pointing at `127.0.0.1` would let anyone
//! who can create an Ingress read whatever listens on this node's loopback (the admin
//! `/routes`, the kubelet), a link-local cloud metadata service, or this node's own ports
//! (CVE-2021-25740 in ingress-nginx, CVE-2021-32783 in Contour).
//!
//! ```text
//!   EndpointSlice address ──> Snapshot::build ──┐
//!                                               ├─> AddressPolicy::check(ip) ─> Ok / Refusal
//!   ExternalName, resolved at connect (pool) ───┘
//! ```
//!
//! IPv4-mapped and IPv4-compatible IPv6 addresses (`::ffff:127.0.0.1`) are judged as the IPv4
//! address they carry, since that is where the kernel sends the connection.

use std::collections::BTreeSet;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

/// Why an address is refused as a backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Refusal {
    /// 127.0.0.0/8, ::1.
    Loopback,
    /// 169.254.0.0/16, fe80::/10 (cloud metadata services live here).
    LinkLocal,
    /// 0.0.0.0/8, ::: a connection to them reaches this host.
    Unspecified,
    /// An address of one of this host's interfaces.
    HostAddress,
}

impl Refusal {
    /// The metric label and log value.
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::Loopback => "loopback",
            Refusal::LinkLocal => "link_local",
            Refusal::Unspecified => "unspecified",
            Refusal::HostAddress => "host_address",
        }
    }

    pub const ALL: [Refusal; 4] = [
        Refusal::Loopback,
        Refusal::LinkLocal,
        Refusal::Unspecified,
        Refusal::HostAddress,
    ];
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Refusal::Loopback => "a loopback address",
            Refusal::LinkLocal => "a link-local address",
            Refusal::Unspecified => "an unspecified address",
            Refusal::HostAddress => "an address of this node",
        })
    }
}

/// The backend-address rules in force, from flags and the host's interfaces at startup.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AddressPolicy {
    /// `--allow-local-backends`: accept every address (the manifests source's default, whose
    /// demo and tests run their backends on loopback).
    pub allow_local: bool,
    /// This host's interface addresses, canonical (IPv4-mapped IPv6 as IPv4).
    pub host_addresses: Arc<BTreeSet<IpAddr>>,
}

impl AddressPolicy {
    /// A policy that refuses local addresses, with `host_addresses` as this node's own.
    pub fn refusing_local(host_addresses: impl IntoIterator<Item = IpAddr>) -> Self {
        Self {
            allow_local: false,
            host_addresses: Arc::new(host_addresses.into_iter().map(canonical).collect()),
        }
    }

    /// Whether `ip` may be connected to as a backend.
    pub fn check(&self, ip: IpAddr) -> Result<(), Refusal> {
        if self.allow_local {
            return Ok(());
        }
        match classify(ip, &self.host_addresses) {
            Some(refusal) => Err(refusal),
            None => Ok(()),
        }
    }
}

/// The class of `ip` that makes it unfit as a backend, or `None` for an ordinary address.
pub fn classify(ip: IpAddr, host_addresses: &BTreeSet<IpAddr>) -> Option<Refusal> {
    let ip = canonical(ip);
    let class = match ip {
        IpAddr::V4(v4) => classify_v4(v4),
        IpAddr::V6(v6) => classify_v6(v6),
    };
    class.or_else(|| host_addresses.contains(&ip).then_some(Refusal::HostAddress))
}

fn classify_v4(ip: Ipv4Addr) -> Option<Refusal> {
    if ip.is_loopback() {
        Some(Refusal::Loopback)
    } else if ip.is_link_local() {
        Some(Refusal::LinkLocal)
    } else if ip.octets()[0] == 0 {
        // 0.0.0.0/8, "this network": Linux connects 0.0.0.0 to this host.
        Some(Refusal::Unspecified)
    } else {
        None
    }
}

fn classify_v6(ip: Ipv6Addr) -> Option<Refusal> {
    if ip.is_loopback() {
        Some(Refusal::Loopback)
    } else if ip.is_unspecified() {
        Some(Refusal::Unspecified)
    } else if ip.is_unicast_link_local() {
        Some(Refusal::LinkLocal)
    } else {
        None
    }
}

/// IPv4-mapped (`::ffff:a.b.c.d`) and IPv4-compatible (`::a.b.c.d`) IPv6 addresses as the IPv4
/// address they carry; `::` and `::1` stay IPv6.
pub fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) if !v6.is_loopback() && !v6.is_unspecified() => match v6.to_ipv4() {
            Some(v4) => IpAddr::V4(v4),
            None => ip,
        },
        other => other,
    }
}

/// This host's interface addresses, read once at startup. Empty (with a warning from the
/// caller) if the interfaces cannot be listed.
pub fn host_addresses() -> std::io::Result<Vec<IpAddr>> {
    Ok(if_addrs::get_if_addrs()?
        .into_iter()
        .map(|interface| interface.ip())
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifier_table() {
        let host: BTreeSet<IpAddr> = ["10.0.0.5", "2001:db8::5"]
            .iter()
            .map(|s| s.parse().unwrap())
            .collect();
        let cases: &[(&str, Option<Refusal>)] = &[
            ("127.0.0.1", Some(Refusal::Loopback)),
            ("127.1.2.3", Some(Refusal::Loopback)),
            ("::1", Some(Refusal::Loopback)),
            ("::ffff:127.0.0.1", Some(Refusal::Loopback)),
            ("::ffff:7f00:2", Some(Refusal::Loopback)),
            ("::127.0.0.1", Some(Refusal::Loopback)),
            ("169.254.169.254", Some(Refusal::LinkLocal)),
            ("::ffff:169.254.169.254", Some(Refusal::LinkLocal)),
            ("fe80::1", Some(Refusal::LinkLocal)),
            ("febf::1", Some(Refusal::LinkLocal)),
            ("0.0.0.0", Some(Refusal::Unspecified)),
            ("0.1.2.3", Some(Refusal::Unspecified)),
            ("::", Some(Refusal::Unspecified)),
            ("::ffff:0.0.0.0", Some(Refusal::Unspecified)),
            ("10.0.0.5", Some(Refusal::HostAddress)),
            ("::ffff:10.0.0.5", Some(Refusal::HostAddress)),
            ("2001:db8::5", Some(Refusal::HostAddress)),
            ("10.0.0.6", None),
            ("192.168.1.1", None),
            ("1.1.1.1", None),
            ("2001:db8::6", None),
            ("fec0::1", None),
            ("::ffff:10.0.0.6", None),
            ("169.255.0.1", None),
            ("128.0.0.1", None),
        ];
        for (ip, want) in cases {
            let ip: IpAddr = ip.parse().unwrap();
            assert_eq!(classify(ip, &host), *want, "{ip}");
        }
    }

    #[test]
    fn allow_local_accepts_everything_and_host_addresses_are_canonical() {
        let refusing = AddressPolicy::refusing_local(["::ffff:10.0.0.5".parse().unwrap()]);
        assert_eq!(
            refusing.check("10.0.0.5".parse().unwrap()),
            Err(Refusal::HostAddress)
        );
        assert_eq!(
            refusing.check("127.0.0.1".parse().unwrap()),
            Err(Refusal::Loopback)
        );
        assert_eq!(refusing.check("10.0.0.9".parse().unwrap()), Ok(()));
        let allowing = AddressPolicy {
            allow_local: true,
            ..refusing
        };
        for ip in ["127.0.0.1", "::1", "169.254.169.254", "10.0.0.5", "0.0.0.0"] {
            assert_eq!(allowing.check(ip.parse().unwrap()), Ok(()), "{ip}");
        }
    }

    #[test]
    fn this_host_has_addresses() {
        let addrs = host_addresses().expect("getifaddrs");
        assert!(
            addrs.iter().any(|a| a.is_loopback()),
            "loopback listed: {addrs:?}"
        );
    }
}
