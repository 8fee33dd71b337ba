//! The host a request names: one authority, validated, and the only one forwarded.
//!
//! ```text
//!   HTTP/1.1: absolute-form target's authority, else the one Host header
//!             (no Host, two Host headers, or an invalid one: 400, RFC 9112 section 3.2)
//!   HTTP/2:   :authority, else host; both present and different: 400 (RFC 9113 section 8.3.1)
//!      │
//!   parse: host[:port], host = DNS-style name | IPv4 | [IPv6]; no userinfo, no escapes
//!      │
//! ```

use std::borrow::Cow;
use std::net::Ipv6Addr;

/// A validated authority.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Authority<'a> {
    /// As the client sent it; this is what the upstream is sent as `Host`.
    pub raw: &'a str,
    /// What routing looks up: lower-case, without the port or one trailing dot. An IPv6
    /// literal keeps its brackets.
    pub host: Cow<'a, str>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AuthorityError {
    #[error("no Host header")]
    Missing,
    #[error("more than one Host header")]
    Duplicate,
    #[error("the Host header differs from the request's authority")]
    Conflict,
    #[error("invalid host")]
    Invalid,
}

/// Longest host accepted, in bytes (a DNS name is at most 253).
const MAX_HOST: usize = 255;

/// Parses `host[:port]`.
pub fn parse(raw: &str) -> Result<Authority<'_>, AuthorityError> {
    let (host, port) = if raw.starts_with('[') {
        let end = raw.find(']').ok_or(AuthorityError::Invalid)?;
        let literal = &raw[1..end];
        if literal.parse::<Ipv6Addr>().is_err() {
            return Err(AuthorityError::Invalid);
        }
        let rest = &raw[end + 1..];
        let port = match rest.strip_prefix(':') {
            Some(port) => Some(port),
            None if rest.is_empty() => None,
            None => return Err(AuthorityError::Invalid),
        };
        (&raw[..=end], port)
    } else {
        match raw.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (raw, None),
        }
    };
    if let Some(port) = port {
        let digits = (1..=5).contains(&port.len()) && port.bytes().all(|b| b.is_ascii_digit());
        if !digits || port.parse::<u16>().is_err() {
            return Err(AuthorityError::Invalid);
        }
    }
    let host = if host.starts_with('[') {
        Cow::Borrowed(host)
    } else {
        name(host)?
    };
    Ok(Authority { raw, host })
}

/// A host name or IPv4 address: letters, digits, `-`, `_` and dots between labels (nginx accepts
/// `_` too). Lower-cased, one trailing dot dropped.
fn name(host: &str) -> Result<Cow<'_, str>, AuthorityError> {
    let host = host.strip_suffix('.').unwrap_or(host);
    let valid = !host.is_empty()
        && host.len() <= MAX_HOST
        && host.split('.').all(|label| {
            !label.is_empty()
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        });
    if !valid {
        return Err(AuthorityError::Invalid);
    }
    Ok(if host.bytes().any(|b| b.is_ascii_uppercase()) {
        Cow::Owned(host.to_ascii_lowercase())
    } else {
        Cow::Borrowed(host)
    })
}

/// The authority of an HTTP/2 request, from `:authority` and any `host` headers.
pub fn of_h2<'a>(
    pseudo: Option<&'a str>,
    mut hosts: impl Iterator<Item = &'a [u8]>,
) -> Result<Authority<'a>, AuthorityError> {
    let host = hosts.next();
    if hosts.next().is_some() {
        return Err(AuthorityError::Duplicate);
    }
    let host = match host {
        Some(bytes) => Some(
            std::str::from_utf8(bytes)
                .map_err(|_| AuthorityError::Invalid)
                .and_then(parse)?,
        ),
        None => None,
    };
    match (pseudo.map(parse).transpose()?, host) {
        (Some(a), Some(h)) if !same(&a, &h) => Err(AuthorityError::Conflict),
        (Some(a), _) => Ok(a),
        (None, Some(h)) => Ok(h),
        (None, None) => Err(AuthorityError::Missing),
    }
}

/// Same host and port, ignoring case and a trailing dot.
fn same(a: &Authority<'_>, b: &Authority<'_>) -> bool {
    a.host == b.host && port_of(a.raw) == port_of(b.raw)
}

fn port_of(raw: &str) -> Option<&str> {
    let after = raw.rfind(']').map_or(raw, |i| &raw[i + 1..]);
    after.rsplit_once(':').map(|(_, p)| p)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn show(raw: &str) -> String {
        match parse(raw) {
            Ok(a) => a.host.into_owned(),
            Err(e) => format!("error: {e:?}"),
        }
    }

    #[test]
    fn authorities() {
        let cases: &[(&str, &str)] = &[
            ("a.example", "a.example"),
            ("A.Example:8080", "a.example"),
            ("a.example.", "a.example"),
            ("a_b.example", "a_b.example"),
            ("10.0.0.1:80", "10.0.0.1"),
            ("[::1]", "[::1]"),
            ("[::1]:443", "[::1]"),
            ("a:80@evil", "error: Invalid"),
            ("user@a", "error: Invalid"),
            ("a b", "error: Invalid"),
            ("", "error: Invalid"),
            (":80", "error: Invalid"),
            ("a:", "error: Invalid"),
            ("a:0x50", "error: Invalid"),
            ("a:123456", "error: Invalid"),
            ("a:99999", "error: Invalid"),
            ("a..b", "error: Invalid"),
            (".a", "error: Invalid"),
            ("a.example..", "error: Invalid"),
            ("a%2eexample", "error: Invalid"),
            ("a/b", "error: Invalid"),
            ("[::1", "error: Invalid"),
            ("[::1]x", "error: Invalid"),
            ("[zz]", "error: Invalid"),
            ("[fe80::1%eth0]", "error: Invalid"),
            ("a:80:80", "error: Invalid"),
        ];
        for (raw, want) in cases {
            assert_eq!(show(raw), *want, "{raw:?}");
        }
        let long = "a".repeat(256);
        assert_eq!(show(&long), "error: Invalid");
    }

    #[test]
    fn h2_authority_and_host() {
        let of = |pseudo: Option<&str>, hosts: &[&str]| {
            of_h2(pseudo, hosts.iter().map(|h| h.as_bytes()))
                .map(|a| a.raw.to_string())
                .map_err(|e| format!("{e:?}"))
        };
        assert_eq!(of(Some("a"), &[]), Ok("a".into()));
        assert_eq!(of(None, &["b:8443"]), Ok("b:8443".into()));
        assert_eq!(of(Some("a"), &["A."]), Ok("a".into()));
        assert_eq!(of(Some("a"), &["b"]), Err("Conflict".into()));
        assert_eq!(of(Some("a:1"), &["a:2"]), Err("Conflict".into()));
        assert_eq!(of(Some("a"), &["a", "a"]), Err("Duplicate".into()));
        assert_eq!(of(None, &[]), Err("Missing".into()));
        assert_eq!(of(Some("a@b"), &[]), Err("Invalid".into()));
    }
}
