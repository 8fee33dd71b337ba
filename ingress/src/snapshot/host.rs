//! Host names: validating the ones Ingresses declare, and finding the one a request names.
//!
//! Lookup order is exact name, then a wildcard one label up (`*.foo.com` matches `bar.foo.com`,
//! not `foo.com` and not `a.bar.foo.com`), then rules without a host. A request whose host
//! matches a tier is answered by that tier alone, as ingress-nginx's server blocks do.

use std::collections::HashMap;
use std::fmt;

/// A host as an Ingress rule declares it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum HostPattern {
    Exact(String),
    /// `*.foo.com`, stored as `foo.com`.
    Wildcard(String),
    /// A rule without `host`: every name.
    Any,
}

impl fmt::Display for HostPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HostPattern::Exact(h) => f.write_str(h),
            HostPattern::Wildcard(h) => write!(f, "*.{h}"),
            HostPattern::Any => f.write_str("*"),
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum HostError {
    #[error(
        "host {0:?} is not a valid DNS name (lowercase RFC 1123 labels, at most 253 characters)"
    )]
    Invalid(String),
    #[error("host {0:?}: a wildcard may only be the whole first label, as in *.example.com")]
    BadWildcard(String),
    #[error("host {0:?}: IP addresses are not allowed as Ingress hosts")]
    IpAddress(String),
}

/// Validates a declared host the way the API server does.
pub fn parse_pattern(host: Option<&str>) -> Result<HostPattern, HostError> {
    let Some(host) = host.filter(|h| !h.is_empty()) else {
        return Ok(HostPattern::Any);
    };
    if host.parse::<std::net::IpAddr>().is_ok() {
        return Err(HostError::IpAddress(host.into()));
    }
    if let Some(rest) = host.strip_prefix("*.") {
        if rest.contains('*') || !is_dns_name(rest) {
            return Err(HostError::BadWildcard(host.into()));
        }
        return Ok(HostPattern::Wildcard(rest.into()));
    }
    if host.contains('*') {
        return Err(HostError::BadWildcard(host.into()));
    }
    if !is_dns_name(host) {
        return Err(HostError::Invalid(host.into()));
    }
    Ok(HostPattern::Exact(host.into()))
}

fn is_dns_name(name: &str) -> bool {
    name.len() <= 253
        && name.split('.').all(|label| {
            let b = label.as_bytes();
            !b.is_empty()
                && b.len() <= 63
                && b.iter()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
                && b[0] != b'-'
                && b[b.len() - 1] != b'-'
        })
}

/// Hosts to values, with the lookup order described at the top of this module.
#[derive(Clone, Debug)]
pub struct HostTable<T> {
    exact: HashMap<Box<str>, T, Hasher>,
    wildcard: HashMap<Box<str>, T, Hasher>,
    any: Option<T>,
}

/// Host lookups happen on every request; keys come from configuration, and a request can only
/// probe them, so a fast seeded hash is enough.
type Hasher = foldhash::fast::RandomState;

impl<T> Default for HostTable<T> {
    fn default() -> Self {
        Self {
            exact: HashMap::default(),
            wildcard: HashMap::default(),
            any: None,
        }
    }
}

impl<T> HostTable<T> {
    pub fn insert(&mut self, pattern: HostPattern, value: T) {
        match pattern {
            HostPattern::Exact(h) => {
                self.exact.insert(h.into_boxed_str(), value);
            }
            HostPattern::Wildcard(h) => {
                self.wildcard.insert(h.into_boxed_str(), value);
            }
            HostPattern::Any => self.any = Some(value),
        }
    }

    /// The entry for a request host (already normalised by `ingress_wire::authority::parse`).
    pub fn lookup(&self, host: &str) -> Option<&T> {
        self.lookup_named(host).or(self.any.as_ref())
    }

    /// Like `lookup`, but without the host-less rules: what an Ingress names explicitly.
    pub fn lookup_named(&self, host: &str) -> Option<&T> {
        if let Some(v) = self.exact.get(host) {
            return Some(v);
        }
        match host.split_once('.') {
            Some((first, parent)) if !first.is_empty() => self.wildcard.get(parent),
            _ => None,
        }
    }

    pub fn any(&self) -> Option<&T> {
        self.any.as_ref()
    }

    /// Removes the entry of exactly this pattern.
    pub fn remove(&mut self, pattern: &HostPattern) -> Option<T> {
        match pattern {
            HostPattern::Exact(h) => self.exact.remove(h.as_str()),
            HostPattern::Wildcard(h) => self.wildcard.remove(h.as_str()),
            HostPattern::Any => self.any.take(),
        }
    }

    /// Every value, in no particular order (cheaper than `iter`, which sorts).
    pub fn values(&self) -> impl Iterator<Item = &T> {
        self.exact
            .values()
            .chain(self.wildcard.values())
            .chain(self.any.iter())
    }

    pub fn len(&self) -> usize {
        self.exact.len() + self.wildcard.len() + usize::from(self.any.is_some())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every entry with its pattern, exact names first, each group sorted.
    pub fn iter(&self) -> impl Iterator<Item = (HostPattern, &T)> {
        let mut exact: Vec<_> = self.exact.iter().collect();
        exact.sort_by(|a, b| a.0.cmp(b.0));
        let mut wildcard: Vec<_> = self.wildcard.iter().collect();
        wildcard.sort_by(|a, b| a.0.cmp(b.0));
        exact
            .into_iter()
            .map(|(h, v)| (HostPattern::Exact(h.to_string()), v))
            .chain(
                wildcard
                    .into_iter()
                    .map(|(h, v)| (HostPattern::Wildcard(h.to_string()), v)),
            )
            .chain(self.any.iter().map(|v| (HostPattern::Any, v)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns() {
        let ok = [
            (None, HostPattern::Any),
            (Some(""), HostPattern::Any),
            (
                Some("foo.bar.com"),
                HostPattern::Exact("foo.bar.com".into()),
            ),
            (Some("*.foo.com"), HostPattern::Wildcard("foo.com".into())),
            (Some("a-b.c1"), HostPattern::Exact("a-b.c1".into())),
        ];
        for (input, want) in ok {
            assert_eq!(parse_pattern(input), Ok(want), "{input:?}");
        }
        let bad = [
            "Foo.com",
            "foo..com",
            "-a.com",
            "a-.com",
            "foo.*.com",
            "*foo.com",
            "*",
            "*.",
            "10.0.0.1",
            "a_b.com",
            "foo.com:80",
        ];
        for input in bad {
            assert!(parse_pattern(Some(input)).is_err(), "{input}");
        }
        assert!(parse_pattern(Some(&"a.".repeat(127))).is_err());
    }

    #[test]
    fn lookup_tiers() {
        let mut t = HostTable::default();
        t.insert(HostPattern::Exact("foo.bar.com".into()), "exact");
        t.insert(HostPattern::Wildcard("bar.com".into()), "wild");
        let cases = [
            ("foo.bar.com", Some("exact")),
            ("baz.bar.com", Some("wild")),
            ("bar.com", None),
            ("a.baz.bar.com", None),
            (".bar.com", None),
            ("other.com", None),
        ];
        for (host, want) in cases {
            assert_eq!(t.lookup(host).copied(), want, "{host}");
        }
        t.insert(HostPattern::Any, "any");
        assert_eq!(t.lookup("other.com"), Some(&"any"));
        assert_eq!(t.lookup_named("other.com"), None);
        assert_eq!(t.lookup("baz.bar.com"), Some(&"wild"));
        let order: Vec<_> = t.iter().map(|(p, _)| p.to_string()).collect();
        assert_eq!(order, ["foo.bar.com", "*.bar.com", "*"]);
    }
}
