//! What the proxy does with a header, by its name, in either direction; and the small helpers
//! for comma-separated header values.
//!
//! ```text
//!   class          request                                  response
//!   hop-by-hop     dropped (Connection and what it lists,   dropped
//!                  Keep-Alive, TE, Trailer, Proxy-*, …)
//!   framing        written by the proxy (Content-Length,    written by the proxy
//!                  Transfer-Encoding)
//!   forwarding     the proxy's value only (Host,            passed on
//!                  X-Forwarded-*, X-Real-IP, X-Scheme,
//!                  X-Original-URI, X-Original-Forwarded-For)
//!   spoofable      dropped (Forwarded, X-Forwarded-Prefix,  passed on
//!                  Proxy, the ssl-client-* headers the
//!                  proxy sets for auth-tls hosts)
//!   `_` in a name  dropped unless allowed                   passed on
//! ```

/// How the proxy treats a header by its name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Host,
    ContentLength,
    TransferEncoding,
    Expect,
    Upgrade,
    Connection,
    /// Hop-by-hop headers other than the ones above (RFC 9110 section 7.6.1, and the
    /// non-standard ones proxies have historically honoured).
    HopByHop,
    /// Set by the proxy for this hop; whatever the client sent is replaced.
    Forwarding,
    /// Claims a backend may trust that the proxy does not set: dropped from requests.
    Spoofable,
    RequestId,
    Server,
    Date,
    Hsts,
    Other,
}

/// By length first: this runs for every header line in both directions.
pub fn kind(name: &str) -> Kind {
    classify(name, |known| name.eq_ignore_ascii_case(known))
}

/// The kind a name has to a backend that reads `_` as `-` (CGI, WSGI, Rack, PHP and the
/// frameworks on them turn both into `HTTP_X_FORWARDED_FOR`): `X_Forwarded_For` is
/// [`Kind::Forwarding`] here.
pub fn kind_as_dashes(name: &str) -> Kind {
    classify(name, |known| same_name(name, known))
}

/// Whether two header names are one to such a backend: equal but for ASCII case, and for `_`
/// against `-`.
pub fn same_name(a: &str, b: &str) -> bool {
    let dash = |c: u8| {
        if c == b'_' {
            b'-'
        } else {
            c.to_ascii_lowercase()
        }
    };
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .all(|(x, y)| x == y || dash(x) == dash(y))
}

fn classify(name: &str, is: impl Fn(&str) -> bool) -> Kind {
    match name.len() {
        2 if is("te") => Kind::HopByHop,
        4 if is("host") => Kind::Host,
        4 if is("date") => Kind::Date,
        5 if is("proxy") => Kind::Spoofable,
        6 if is("expect") => Kind::Expect,
        6 if is("server") => Kind::Server,
        7 if is("upgrade") => Kind::Upgrade,
        7 if is("trailer") => Kind::HopByHop,
        8 if is("x-scheme") => Kind::Forwarding,
        9 if is("x-real-ip") => Kind::Forwarding,
        9 if is("forwarded") => Kind::Spoofable,
        10 if is("connection") => Kind::Connection,
        10 if is("keep-alive") => Kind::HopByHop,
        12 if is("x-request-id") => Kind::RequestId,
        14 if is("content-length") => Kind::ContentLength,
        14 if is("x-original-uri") => Kind::Forwarding,
        15 if is("x-forwarded-for") => Kind::Forwarding,
        15 if is("ssl-client-cert") => Kind::Spoofable,
        16 if is("proxy-connection") => Kind::HopByHop,
        16 if is("x-forwarded-port") || is("x-forwarded-host") => Kind::Forwarding,
        17 if is("transfer-encoding") => Kind::TransferEncoding,
        17 if is("x-forwarded-proto") => Kind::Forwarding,
        17 if is("ssl-client-verify") => Kind::Spoofable,
        18 if is("proxy-authenticate") => Kind::HopByHop,
        18 if is("x-forwarded-scheme") => Kind::Forwarding,
        18 if is("x-forwarded-prefix") => Kind::Spoofable,
        19 if is("proxy-authorization") => Kind::HopByHop,
        20 if is("ssl-client-issuer-dn") => Kind::Spoofable,
        21 if is("ssl-client-subject-dn") => Kind::Spoofable,
        24 if is("x-original-forwarded-for") => Kind::Forwarding,
        25 if is("strict-transport-security") => Kind::Hsts,
        _ => Kind::Other,
    }
}

/// Whether a client's request header is passed on as it is. `underscores`: names with `_`
/// too (nginx's `underscores_in_headers`, off by default there: `X_Forwarded_For` is
/// `X-Forwarded-For` to many frameworks). Even then, a name that is one the proxy sets or
/// drops once `_` reads as `-` (`X_Real_IP`, `ssl_client_verify`) is dropped: nginx passes
/// those, and a backend that merges the spellings would believe the client's value.
pub fn passes(name: &str, kind: Kind, underscores: bool) -> bool {
    let passable = |kind| matches!(kind, Kind::Other | Kind::Server | Kind::Date | Kind::Hsts);
    passable(kind) && (!name.contains('_') || (underscores && passable(kind_as_dashes(name))))
}

/// The comma-separated tokens of a header value, trimmed.
pub fn tokens(value: &[u8]) -> impl Iterator<Item = &[u8]> {
    value
        .split(|&b| b == b',')
        .map(<[u8]>::trim_ascii)
        .filter(|t| !t.is_empty())
}

/// Whether any of a message's `Connection` values names `name` as hop-by-hop.
pub fn connection_lists<'v>(mut values: impl Iterator<Item = &'v [u8]>, name: &str) -> bool {
    values.any(|v| tokens(v).any(|t| t.eq_ignore_ascii_case(name.as_bytes())))
}

/// An `X-Request-ID` a client sent that is worth keeping: 1 to 200 visible ASCII characters.
pub fn usable_request_id(value: &[u8]) -> bool {
    (1..=200).contains(&value.len()) && value.iter().all(|b| (0x21..0x7f).contains(b))
}

/// A client's `X-Forwarded-For` element worth keeping in `X-Original-Forwarded-For`: trimmed,
/// not empty, and printable.
pub fn chain_value(value: &[u8]) -> Option<&[u8]> {
    let value = value.trim_ascii();
    let printable = value
        .iter()
        .all(|&b| b == b'\t' || (b' '..0x7f).contains(&b));
    (!value.is_empty() && printable).then_some(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_are_case_insensitive() {
        for (name, want) in [
            ("Host", Kind::Host),
            ("X-Forwarded-For", Kind::Forwarding),
            ("X-ORIGINAL-URI", Kind::Forwarding),
            ("Forwarded", Kind::Spoofable),
            ("X-Forwarded-Prefix", Kind::Spoofable),
            ("x-forwarded-fox", Kind::Other),
            ("TRANSFER-ENCODING", Kind::TransferEncoding),
            ("Proxy", Kind::Spoofable),
            ("Proxy-Connection", Kind::HopByHop),
        ] {
            assert_eq!(kind(name), want, "{name}");
        }
    }

    #[test]
    fn what_passes() {
        assert!(passes("accept", Kind::Other, false));
        assert!(!passes("x_a", Kind::Other, false));
        assert!(passes("x_a", Kind::Other, true));
        assert!(!passes("forwarded", Kind::Spoofable, true));
        assert!(!passes("x-real-ip", Kind::Forwarding, true));
        // With underscores allowed, what reads as a header the proxy owns still does not pass.
        for name in [
            "X_Real_IP",
            "x_forwarded_for",
            "X-Forwarded_Proto",
            "SSL_CLIENT_VERIFY",
            "ssl_client_subject_dn",
            "x_forwarded_prefix",
            "x_request_id",
            "content_length",
            "transfer_encoding",
            "proxy_connection",
        ] {
            assert_ne!(kind_as_dashes(name), Kind::Other, "{name}");
            assert!(!passes(name, kind(name), true), "{name}");
            assert!(!passes(name, kind(name), false), "{name}");
        }
        assert!(passes("x_custom_thing", kind("x_custom_thing"), true));
        assert!(same_name("X_Auth_Request_User", "x-auth-request-user"));
        assert!(same_name("x-a", "X_A"));
        assert!(!same_name("x-a", "x-b"));
        assert!(!same_name("x-a", "x-ab"));
        assert!(usable_request_id(b"abc-123"));
        assert!(!usable_request_id(b"a b"));
        assert!(!usable_request_id(b""));
        assert!(!usable_request_id(&[b'a'; 201]));
        assert_eq!(chain_value(b" 10.0.0.1 "), Some(&b"10.0.0.1"[..]));
        assert_eq!(chain_value(b"  "), None);
    }
}
