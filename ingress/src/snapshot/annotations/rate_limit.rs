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
//! unchanged.
//!
//! ```text
//!   limit-rate K             limit_rate Kk: each response is sent at K KiB/s ...
//!   limit-rate-after K       limit_rate_after Kk: ... after its first K KiB
//! ```

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

/// `limit-rate` / `limit-rate-after`: how fast each response is sent, as nginx's `limit_rate`
/// (per request, not per client).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Bandwidth {
    /// Bytes per second; never 0.
    pub rate: u64,
    /// Bytes sent before the rate applies.
    pub after: u64,
}

impl Bandwidth {
    /// How long to pause after `sent` bytes of a response `elapsed` into it, as nginx
    /// schedules `limit_rate`: by the response's start, with one second's worth of allowance
    /// (`limit = rate * (now - start + 1) - (sent - after)`).
    pub fn delay(&self, sent: u64, elapsed: std::time::Duration) -> Option<std::time::Duration> {
        let over = sent.checked_sub(self.after)?;
        let due = std::time::Duration::from_secs_f64(over as f64 / self.rate as f64);
        let allowed = elapsed.saturating_add(std::time::Duration::from_secs(1));
        due.checked_sub(allowed).filter(|d| !d.is_zero())
    }
}

/// `limit-rate` and `limit-rate-after` (whole KiB, as ingress-nginx writes them with `k`), or
/// `None` without a rate.
pub fn bandwidth(
    annotations: Option<&BTreeMap<String, String>>,
) -> Result<Option<Bandwidth>, String> {
    let Some(annotations) = annotations else {
        return Ok(None);
    };
    let kib = |name: &str| -> Result<u64, String> {
        match lookup(annotations, name) {
            None => Ok(0),
            Some((key, value)) => value
                .trim()
                .parse::<u64>()
                .map(|k| k.saturating_mul(1024))
                .map_err(|_| format!("{key}: {value:?} is not a whole number of KiB")),
        }
    };
    let rate = kib("limit-rate")?;
    let after = kib("limit-rate-after")?;
    Ok((rate > 0).then_some(Bandwidth { rate, after }))
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
    fn bandwidth_as_nginx_schedules_it() {
        let map = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (format!("{NGINX_PREFIX}{k}"), v.to_string()))
                .collect()
        };
        assert_eq!(bandwidth(Some(&map(&[]))), Ok(None));
        assert_eq!(
            bandwidth(Some(&map(&[("limit-rate-after", "10")]))),
            Ok(None)
        );
        assert_eq!(bandwidth(Some(&map(&[("limit-rate", "0")]))), Ok(None));
        assert!(bandwidth(Some(&map(&[("limit-rate", "fast")]))).is_err());
        let bw = bandwidth(Some(&map(&[
            ("limit-rate", "10"),
            ("limit-rate-after", "20"),
        ])))
        .unwrap()
        .unwrap();
        assert_eq!(
            bw,
            Bandwidth {
                rate: 10_240,
                after: 20_480
            }
        );
        let ms = std::time::Duration::from_millis;
        // (bytes sent, time since the response began, pause)
        let cases = [
            (20_480, ms(0), None),
            // 1 s of allowance past `after`.
            (20_480 + 10_240, ms(0), None),
            (20_480 + 20_480, ms(0), Some(ms(1000))),
            (20_480 + 20_480, ms(400), Some(ms(600))),
            (20_480 + 20_480, ms(1000), None),
            (20_480 + 102_400, ms(2000), Some(ms(7000))),
        ];
        for (sent, elapsed, want) in cases {
            assert_eq!(bw.delay(sent, elapsed), want, "{sent} after {elapsed:?}");
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
