//! `affinity: cookie` and its `affinity-mode` and `session-cookie-*` options, as ingress-nginx's
//! `balancer/sticky*.lua` use them.
//!
//! ```text
//!   cookie NAME = "<key>|<backend key>"
//!     balanced:   key is random; the endpoint is the key's by rendezvous hashing over the
//!                 current endpoints, so scaling moves only some sessions
//!     persistent: key names one endpoint (a hash of its address); gone → a new one is picked
//!   no cookie, or a persistent key that names no endpoint → pick, and Set-Cookie
//!   a retry (proxy-next-upstream) of a request whose cookie named its endpoint:
//!     change-on-failure false (default) → the same endpoint again, the cookie unchanged
//!     change-on-failure true            → an endpoint not tried yet, and a new Set-Cookie
//! ```

use std::collections::BTreeMap;

use super::lookup;

/// ingress-nginx's default cookie name.
pub const DEFAULT_COOKIE: &str = "INGRESSCOOKIE";

/// What an Ingress's affinity annotations ask for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Affinity {
    pub mode: Mode,
    pub name: String,
    /// `session-cookie-path`; `None` is the route's path (the location's, in ingress-nginx).
    pub path: Option<String>,
    pub domain: Option<String>,
    /// `session-cookie-max-age`, seconds.
    pub max_age: Option<u64>,
    /// `session-cookie-expires`, seconds from now.
    pub expires: Option<u64>,
    pub samesite: Option<&'static str>,
    /// `session-cookie-conditional-samesite-none`: leave `SameSite=None` out for the browsers
    /// that mishandle it.
    pub conditional_samesite_none: bool,
    /// `session-cookie-secure`; `None` is "when the request came over HTTPS".
    pub secure: Option<bool>,
    /// `session-cookie-change-on-failure`: a retry after a failed attempt leaves the session's
    /// endpoint for a new one (and the cookie follows); by default it stays.
    pub change_on_failure: bool,
}

impl Affinity {
    /// An affinity in `mode` with ingress-nginx's defaults: the cookie `INGRESSCOOKIE` and no
    /// attribute set.
    pub fn new(mode: Mode) -> Self {
        Self {
            mode,
            name: DEFAULT_COOKIE.to_string(),
            path: None,
            domain: None,
            max_age: None,
            expires: None,
            samesite: None,
            conditional_samesite_none: false,
            secure: None,
            change_on_failure: false,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Balanced,
    Persistent,
}

/// The affinity of an Ingress, `None` without `affinity: cookie`. Problems are pushed to
/// `errors`; a bad option keeps its default.
pub(super) fn parse(
    annotations: &BTreeMap<String, String>,
    errors: &mut Vec<String>,
) -> Option<Affinity> {
    let options = [
        "affinity-mode",
        "session-cookie-name",
        "session-cookie-path",
        "session-cookie-domain",
        "session-cookie-max-age",
        "session-cookie-expires",
        "session-cookie-samesite",
        "session-cookie-conditional-samesite-none",
        "session-cookie-secure",
        "session-cookie-change-on-failure",
    ];
    let Some((key, value)) = lookup(annotations, "affinity") else {
        if let Some((key, _)) = options.iter().find_map(|n| lookup(annotations, n)) {
            errors.push(format!(
                "{key} has no effect without affinity: \"cookie\", as in ingress-nginx"
            ));
        }
        return None;
    };
    if value.trim() != "cookie" {
        errors.push(format!(
            "{key}: {value:?} is not \"cookie\", the only affinity type; no affinity"
        ));
        return None;
    }
    let mut affinity = Affinity::new(Mode::Balanced);
    let mut check = |name: &str, ok: &dyn Fn(&str) -> bool, what: &str| -> Option<String> {
        let (key, value) = lookup(annotations, name)?;
        let value = value.trim();
        if ok(value) {
            Some(value.to_string())
        } else {
            errors.push(format!(
                "{key}: {value:?} is not {what}; the default is used"
            ));
            None
        }
    };
    let token = |s: &str| {
        !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
    };
    let path = |s: &str| {
        s.starts_with('/')
            && s.bytes()
                .all(|b| b.is_ascii_graphic() && b != b';' && b != b',')
    };
    let domain = |s: &str| {
        !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-')
    };
    let seconds = |s: &str| s.parse::<u64>().is_ok();
    if let Some(mode) = check(
        "affinity-mode",
        &|s| s == "balanced" || s == "persistent",
        "\"balanced\" or \"persistent\"",
    ) {
        affinity.mode = if mode == "persistent" {
            Mode::Persistent
        } else {
            Mode::Balanced
        };
    }
    if let Some(name) = check("session-cookie-name", &token, "a cookie name") {
        affinity.name = name;
    }
    affinity.path = check("session-cookie-path", &path, "a path");
    affinity.domain = check("session-cookie-domain", &domain, "a domain");
    affinity.max_age = check("session-cookie-max-age", &seconds, "a number of seconds")
        .and_then(|s| s.parse().ok());
    affinity.expires = check("session-cookie-expires", &seconds, "a number of seconds")
        .and_then(|s| s.parse().ok());
    affinity.samesite = check(
        "session-cookie-samesite",
        &|s| matches!(s, "None" | "Lax" | "Strict"),
        "None, Lax or Strict",
    )
    .and_then(|s| ["None", "Lax", "Strict"].into_iter().find(|v| *v == s));
    affinity.secure = check(
        "session-cookie-secure",
        &|s| s == "true" || s == "false",
        "\"true\" or \"false\"",
    )
    .map(|s| s == "true");
    affinity.conditional_samesite_none = check(
        "session-cookie-conditional-samesite-none",
        &|s| s == "true" || s == "false",
        "\"true\" or \"false\"",
    )
    .is_some_and(|s| s == "true");
    affinity.change_on_failure = check(
        "session-cookie-change-on-failure",
        &|s| s == "true" || s == "false",
        "\"true\" or \"false\"",
    )
    .is_some_and(|s| s == "true");
    Some(affinity)
}

/// A stable 64-bit FNV-1a hash, the same in every process and release: cookie keys outlive
/// the process that made them. Each part is followed by a 0xff separator, so `["a", "b"]` and
/// `["ab"]` differ.
pub fn stable_hash(parts: &[&[u8]]) -> u64 {
    parts
        .iter()
        .fold(StableHasher::new(), |h, part| h.part(part))
        .finish()
}

/// [`stable_hash`] fed piece by piece: a part may be written through `Display` (an address,
/// a port) without building its text first, and a hasher holding a request's key is copied
/// for each endpoint it is hashed with.
#[derive(Clone, Copy, Debug)]
pub struct StableHasher(u64);

const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

impl StableHasher {
    pub fn new() -> Self {
        Self(0xcbf2_9ce4_8422_2325)
    }

    /// One part given as bytes.
    pub fn part(mut self, bytes: &[u8]) -> Self {
        self.feed(bytes);
        self.end_part()
    }

    /// One part given as what `value` displays (its `to_string()`), without allocating.
    pub fn display_part(mut self, value: &dyn std::fmt::Display) -> Self {
        use std::fmt::Write as _;
        // Writing into the hash cannot fail.
        let _ = write!(self, "{value}");
        self.end_part()
    }

    /// One part given as pieces fed in order: the same hash as `display_part` of a value whose
    /// `Display` writes exactly these pieces, without the formatting machinery.
    pub fn pieces_part(mut self, pieces: &[&[u8]]) -> Self {
        for piece in pieces {
            self.feed(piece);
        }
        self.end_part()
    }

    pub fn finish(self) -> u64 {
        self.0
    }

    fn feed(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= u64::from(b);
            self.0 = self.0.wrapping_mul(FNV_PRIME);
        }
    }

    fn end_part(mut self) -> Self {
        self.0 ^= 0xff;
        self.0 = self.0.wrapping_mul(FNV_PRIME);
        self
    }
}

impl Default for StableHasher {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Write for StableHasher {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.feed(s.as_bytes());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_pairs(pairs: &[(&str, &str)]) -> (Option<Affinity>, usize) {
        let map: BTreeMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (format!("nginx.ingress.kubernetes.io/{k}"), v.to_string()))
            .collect();
        let mut errors = Vec::new();
        (parse(&map, &mut errors), errors.len())
    }

    #[test]
    fn table() {
        let default = Affinity::new(Mode::Balanced);
        let cases: Vec<(Vec<(&str, &str)>, Option<Affinity>, usize)> = vec![
            (vec![], None, 0),
            (vec![("affinity", "cookie")], Some(default.clone()), 0),
            (vec![("affinity", "ip")], None, 1),
            (
                vec![
                    ("affinity", "cookie"),
                    ("session-cookie-samesite", "None"),
                    ("session-cookie-conditional-samesite-none", "true"),
                ],
                Some(Affinity {
                    samesite: Some("None"),
                    conditional_samesite_none: true,
                    ..default.clone()
                }),
                0,
            ),
            (
                vec![
                    ("affinity", "cookie"),
                    ("session-cookie-conditional-samesite-none", "yes"),
                ],
                Some(default.clone()),
                1,
            ),
            (vec![("session-cookie-name", "x")], None, 1),
            (
                vec![
                    ("affinity", "cookie"),
                    ("affinity-mode", "persistent"),
                    ("session-cookie-name", "route"),
                    ("session-cookie-path", "/app"),
                    ("session-cookie-domain", "example.com"),
                    ("session-cookie-max-age", "3600"),
                    ("session-cookie-expires", "7200"),
                    ("session-cookie-samesite", "Lax"),
                    ("session-cookie-secure", "true"),
                ],
                Some(Affinity {
                    mode: Mode::Persistent,
                    name: "route".into(),
                    path: Some("/app".into()),
                    domain: Some("example.com".into()),
                    max_age: Some(3600),
                    expires: Some(7200),
                    samesite: Some("Lax"),
                    conditional_samesite_none: false,
                    secure: Some(true),
                    change_on_failure: false,
                }),
                0,
            ),
            (
                vec![
                    ("affinity", "cookie"),
                    ("session-cookie-change-on-failure", "true"),
                ],
                Some(Affinity {
                    change_on_failure: true,
                    ..default.clone()
                }),
                0,
            ),
            (
                vec![
                    ("affinity", "cookie"),
                    ("session-cookie-change-on-failure", "yes"),
                ],
                Some(default.clone()),
                1,
            ),
            (vec![("session-cookie-change-on-failure", "true")], None, 1),
            (
                vec![
                    ("affinity", "cookie"),
                    ("affinity-mode", "sticky"),
                    ("session-cookie-name", "a;b"),
                    ("session-cookie-path", "/a; Domain=evil"),
                    ("session-cookie-max-age", "1h"),
                    ("session-cookie-samesite", "lax"),
                ],
                Some(default),
                5,
            ),
        ];
        for (pairs, want, errors) in cases {
            let (got, errs) = parse_pairs(&pairs);
            assert_eq!(got, want, "{pairs:?}");
            assert_eq!(errs, errors, "{pairs:?}");
        }
    }

    #[test]
    fn the_hash_is_stable() {
        // Pinned: a change would move every persistent session.
        assert_eq!(
            stable_hash(&[b"10.0.0.1:8080"]),
            stable_hash(&[b"10.0.0.1:8080"])
        );
        assert_ne!(stable_hash(&[b"a", b"b"]), stable_hash(&[b"ab"]));
        assert_eq!(stable_hash(&[]), 0xcbf2_9ce4_8422_2325);
        // Fed through Display, a part hashes as its text: cookies made before stay valid.
        let addr: std::net::SocketAddr = "[2001:db8::1]:8443".parse().unwrap();
        assert_eq!(
            StableHasher::new()
                .part(b"key")
                .display_part(&addr)
                .display_part(&8443u16)
                .finish(),
            stable_hash(&[b"key", addr.to_string().as_bytes(), b"8443"])
        );
    }
}
