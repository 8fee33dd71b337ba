//! The `limit-*` annotations, read as ingress-nginx reads them into `limit_req_zone`,
//! `limit_req` and `limit_conn`:
//!
//! ```text
//!   limit-rps N              limit_req zone=<ingress>_rps rate=Nr/s burst=N*multiplier nodelay
//!   limit-rpm N              limit_req zone=<ingress>_rpm rate=Nr/m burst=N*multiplier nodelay
//!   limit-connections N      limit_conn <ingress>_conn N
//!   limit-burst-multiplier   5 (default)
//!   limit-allowlist          CIDRs exempt from all three (older name: limit-whitelist)
//! ```
//!
//! Keyed by the client address; one zone per Ingress (every path of the Ingress shares it).
//! Only the policy is built here: the buckets are runtime state beside the snapshot
//! (`proxy::rate_limit`), keyed by this policy so they outlive snapshot swaps that leave it
//! unchanged. `limit-rate` and `limit-rate-after` (response bandwidth) are not read: the registry
//! refuses them.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

use super::lookup;
use crate::snapshot::sources;

pub const DEFAULT_BURST_MULTIPLIER: u32 = 5;

/// One Ingress's rate limits.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RateLimit {
    /// The zone: `namespace/name/uid` of the Ingress, as ingress-nginx names it, so a
    /// re-created Ingress starts with fresh buckets.
    pub zone: Arc<str>,
    /// Requests per second, and the burst on top (nginx's `burst`).
    pub rps: Option<Rate>,
    /// Requests per minute, and the burst on top.
    pub rpm: Option<Rate>,
    /// Concurrent requests per client address.
    pub connections: Option<u32>,
    /// Clients never limited.
    pub allow: Arc<[ipnet::IpNet]>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Rate {
    /// Requests per period (a second or a minute); never 0.
    pub limit: u32,
    /// nginx's `burst`: how many requests past the rate are served at once (`nodelay`).
    pub burst: u32,
}

impl RateLimit {
    /// Whether `client` is in `limit-allowlist`.
    pub fn exempts(&self, client: IpAddr) -> bool {
        let client = client.to_canonical();
        self.allow.iter().any(|net| net.contains(&client))
    }
}

/// The rate limits of an Ingress with `annotations` (`zone` names it), `None` when it sets none,
/// or why they cannot be applied as written.
pub fn parse(
    annotations: Option<&BTreeMap<String, String>>,
    zone: &str,
) -> Result<Option<RateLimit>, String> {
    let Some(annotations) = annotations else {
        return Ok(None);
    };
    let count = |name: &str| -> Result<u32, String> {
        match lookup(annotations, name) {
            None => Ok(0),
            Some((key, value)) => value
                .trim()
                .parse::<u32>()
                .map_err(|_| format!("{key}: {value:?} is not a whole number")),
        }
    };
    let rps = count("limit-rps")?;
    let rpm = count("limit-rpm")?;
    let connections = count("limit-connections")?;
    // As ingress-nginx: a multiplier that does not parse is the default.
    let multiplier = match lookup(annotations, "limit-burst-multiplier") {
        None => DEFAULT_BURST_MULTIPLIER,
        Some((_, value)) => value
            .trim()
            .parse::<u32>()
            .unwrap_or(DEFAULT_BURST_MULTIPLIER),
    };
    let allow = match ["limit-allowlist", "limit-whitelist"]
        .iter()
        .find_map(|name| lookup(annotations, name))
    {
        None => Arc::from([]),
        Some((key, value)) => sources::parse_ranges(value)
            .map_err(|err| format!("{key}: {err}"))?
            .unwrap_or_else(|| Arc::from([])),
    };
    if rps == 0 && rpm == 0 && connections == 0 {
        return Ok(None);
    }
    let rate = |limit: u32| {
        (limit > 0).then(|| Rate {
            limit,
            burst: limit.saturating_mul(multiplier),
        })
    };
    Ok(Some(RateLimit {
        zone: Arc::from(zone),
        rps: rate(rps),
        rpm: rate(rpm),
        connections: (connections > 0).then_some(connections),
        allow,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::annotations::NGINX_PREFIX;

    fn parse_pairs(pairs: &[(&str, &str)]) -> Result<Option<RateLimit>, String> {
        let map: BTreeMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (format!("{NGINX_PREFIX}{k}"), v.to_string()))
            .collect();
        parse(Some(&map), "ns/ing/uid")
    }

    #[test]
    fn table() {
        let rate = |limit, burst| Some(Rate { limit, burst });
        // (annotations, rps, rpm, connections, allow-list length) or an error
        type Want = Result<(Option<Rate>, Option<Rate>, Option<u32>, usize), ()>;
        let cases: Vec<(&[(&str, &str)], Want)> = vec![
            (&[], Ok((None, None, None, 0))),
            (&[("limit-rps", "0")], Ok((None, None, None, 0))),
            (&[("limit-rps", "5")], Ok((rate(5, 25), None, None, 0))),
            (
                &[("limit-rps", "5"), ("limit-burst-multiplier", "2")],
                Ok((rate(5, 10), None, None, 0)),
            ),
            (
                &[("limit-rps", "5"), ("limit-burst-multiplier", "x")],
                Ok((rate(5, 25), None, None, 0)),
            ),
            (
                &[("limit-rpm", "60"), ("limit-connections", "2")],
                Ok((None, rate(60, 300), Some(2), 0)),
            ),
            (
                &[
                    ("limit-rps", "1"),
                    ("limit-whitelist", "10.0.0.0/8, 192.0.2.1"),
                ],
                Ok((rate(1, 5), None, None, 2)),
            ),
            (
                &[
                    ("limit-rps", "1"),
                    ("limit-whitelist", "10.0.0.0/8"),
                    ("limit-allowlist", "::1"),
                ],
                Ok((rate(1, 5), None, None, 1)),
            ),
            (&[("limit-rps", "-1")], Err(())),
            (&[("limit-rps", "five")], Err(())),
            (&[("limit-connections", "1.5")], Err(())),
            (
                &[("limit-rps", "1"), ("limit-whitelist", "10.0.0.0/33")],
                Err(()),
            ),
        ];
        for (pairs, want) in cases {
            let got = parse_pairs(pairs)
                .map(|l| match l {
                    None => (None, None, None, 0),
                    Some(l) => (l.rps, l.rpm, l.connections, l.allow.len()),
                })
                .map_err(|_| ());
            assert_eq!(got, want, "{pairs:?}");
        }
    }

    #[test]
    fn allowlist_exempts_by_canonical_address() {
        let limit = parse_pairs(&[("limit-rps", "1"), ("limit-whitelist", "10.0.0.0/8")])
            .unwrap()
            .unwrap();
        assert!(limit.exempts("10.1.2.3".parse().unwrap()));
        assert!(limit.exempts("::ffff:10.1.2.3".parse().unwrap()));
        assert!(!limit.exempts("11.1.2.3".parse().unwrap()));
        assert_eq!(limit.zone.as_ref(), "ns/ing/uid");
    }
}
