//! Source ranges: `allowlist-source-range` (and its older name `whitelist-source-range`) and
//! `denylist-source-range`, with ingress-nginx's semantics.
//!
//! ingress-nginx writes a location's `deny` lines before its `allow` lines and ends with `deny
//! all` when there is an allow-list; nginx takes the first rule that matches. So a client in a
//! deny range is refused even inside an allow range, a client outside every allow range is
//! refused when there is an allow-list, and everyone else is admitted.

use std::net::IpAddr;
use std::sync::Arc;

use ipnet::IpNet;

/// Who may reach a route, by source address.
/// Ordered only so that the gate can number distinct policies deterministically.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct SourcePolicy {
    /// `None`: no allow-list (everyone not denied).
    pub allow: Option<Arc<[IpNet]>>,
    pub deny: Arc<[IpNet]>,
}

impl SourcePolicy {
    /// Whether `client` may reach the route. An IPv4 client seen as an IPv4-mapped IPv6
    /// address (a dual-stack listener) is judged as the IPv4 address it is.
    pub fn admits(&self, client: IpAddr) -> bool {
        let client = client.to_canonical();
        if self.deny.iter().any(|net| net.contains(&client)) {
            return false;
        }
        self.allow
            .as_ref()
            .is_none_or(|allow| allow.iter().any(|net| net.contains(&client)))
    }

    /// Whether there is anything to check.
    pub fn is_open(&self) -> bool {
        self.allow.is_none() && self.deny.is_empty()
    }
}

/// Parses one annotation value: addresses and CIDR ranges separated by commas, spaces allowed
/// around them, as ingress-nginx reads it. A range with host bits set (`10.0.0.1/8`) is the
/// network it names, as Go's `net.ParseCIDR` makes it. An empty value is no list at all, as in
/// ingress-nginx. Any entry that does not parse is an error for the whole value: an access
/// control is applied as written or not at all.
pub fn parse_ranges(value: &str) -> Result<Option<Arc<[IpNet]>>, String> {
    if value.trim().is_empty() {
        return Ok(None);
    }
    let mut nets = Vec::new();
    for entry in value.split(',') {
        let entry = entry.trim();
        let net = if entry.contains('/') {
            entry.parse::<IpNet>().map(|net| net.trunc()).ok()
        } else {
            entry.parse::<IpAddr>().ok().map(IpNet::from)
        };
        match net {
            Some(net) => nets.push(net),
            None => return Err(format!("{entry:?} is not an IP address or CIDR range")),
        }
    }
    Ok(Some(nets.into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(allow: Option<&str>, deny: &str) -> SourcePolicy {
        SourcePolicy {
            allow: allow.map(|a| parse_ranges(a).unwrap().unwrap()),
            deny: parse_ranges(deny).unwrap().unwrap_or_else(|| Arc::from([])),
        }
    }

    #[test]
    fn values_parse_as_ingress_nginx_reads_them() {
        let cases: [(&str, Result<Option<Vec<&str>>, ()>); 9] = [
            ("10.0.0.0/8", Ok(Some(vec!["10.0.0.0/8"]))),
            (
                " 10.0.0.0/8 , 192.168.1.7,2001:db8::/32 ",
                Ok(Some(vec!["10.0.0.0/8", "192.168.1.7/32", "2001:db8::/32"])),
            ),
            ("10.1.2.3/8", Ok(Some(vec!["10.0.0.0/8"]))),
            ("::1", Ok(Some(vec!["::1/128"]))),
            ("", Ok(None)),
            ("  ", Ok(None)),
            ("10.0.0.0/33", Err(())),
            ("10.0.0.0/8,,", Err(())),
            ("office", Err(())),
        ];
        for (value, want) in cases {
            let got = parse_ranges(value)
                .map(|nets| nets.map(|n| n.iter().map(ToString::to_string).collect::<Vec<_>>()))
                .map_err(|_| ());
            let want = want.map(|w| w.map(|v| v.iter().map(ToString::to_string).collect()));
            assert_eq!(got, want, "{value:?}");
        }
    }

    #[test]
    fn deny_comes_first_then_the_allow_list() {
        let cases = [
            // (allow, deny, client, admitted)
            (None, "", "203.0.113.9", true),
            (Some("10.0.0.0/8"), "", "10.1.2.3", true),
            (Some("10.0.0.0/8"), "", "11.1.2.3", false),
            (Some("10.0.0.0/8"), "10.1.0.0/16", "10.1.2.3", false),
            (Some("10.0.0.0/8"), "10.1.0.0/16", "10.2.0.1", true),
            // A deny range wider than an allow range inside it still wins: nginx stops at the
            // first matching rule, and deny rules come first.
            (Some("10.1.0.0/16"), "10.0.0.0/8", "10.1.2.3", false),
            (None, "192.0.2.0/24", "192.0.2.1", false),
            (None, "192.0.2.0/24", "192.0.3.1", true),
            // An IPv4 client on a dual-stack socket is judged as IPv4.
            (Some("10.0.0.0/8"), "", "::ffff:10.1.2.3", true),
            (None, "10.0.0.0/8", "::ffff:10.1.2.3", false),
            (Some("2001:db8::/32"), "", "2001:db8::1", true),
            (Some("2001:db8::/32"), "", "10.0.0.1", false),
        ];
        for (allow, deny, client, want) in cases {
            let client: IpAddr = client.parse().unwrap();
            assert_eq!(
                policy(allow, deny).admits(client),
                want,
                "allow {allow:?} deny {deny:?} client {client}"
            );
        }
        assert!(SourcePolicy::default().is_open());
        assert!(!policy(None, "10.0.0.0/8").is_open());
    }
}
