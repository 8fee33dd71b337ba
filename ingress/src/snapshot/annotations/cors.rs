//! `enable-cors` and the `cors-*` options, as ingress-nginx's `CORS` template applies them.
//!
//! ```text
//!   cors-allow-origin "*" (default): every request is CORS, Allow-Origin "*"
//!   a list: a request whose Origin matches one entry (case-insensitive, `*` = one DNS label)
//!           is CORS, Allow-Origin = its Origin; others get no CORS headers
//!   CORS + OPTIONS ─> 204 from the proxy with the headers (the preflight)
//!   CORS + any other method ─> the upstream's response, with the headers set over its own
//! ```

use std::collections::BTreeMap;

use http::{HeaderName, HeaderValue, header};
use regex::Regex;

use super::lookup;

pub const DEFAULT_METHODS: &str = "GET, PUT, POST, DELETE, PATCH, OPTIONS";
pub const DEFAULT_HEADERS: &str = "DNT,Keep-Alive,User-Agent,X-Requested-With,If-Modified-Since,Cache-Control,Content-Type,Range,Authorization";
pub const DEFAULT_MAX_AGE: u64 = 1_728_000;

/// What `enable-cors: "true"` and its options ask for.
#[derive(Clone, Debug)]
pub struct Cors {
    pub origins: Origins,
    pub credentials: bool,
    pub methods: String,
    pub headers: String,
    pub expose: Option<String>,
    pub max_age: u64,
    /// The headers every CORS answer of the route carries besides its origin (credentials,
    /// methods, headers, expose, max-age), made once here so a request only clones them.
    pub fixed: Vec<(HeaderName, HeaderValue)>,
}

/// `cors-allow-origin`.
#[derive(Clone, Debug)]
pub enum Origins {
    /// `*` (the default).
    Any,
    /// A list: the regex of its entries, and the entries themselves when none has a `*`, so
    /// the common case (a few exact origins) is a comparison per request, not a regex search.
    Matching {
        regex: Regex,
        exact: Option<Box<[Box<[u8]>]>>,
    },
    /// A list none of whose entries is a valid origin: nothing is allowed.
    Nothing,
}

impl Origins {
    fn as_str(&self) -> &str {
        match self {
            Origins::Any => "*",
            Origins::Matching { regex, .. } => regex.as_str(),
            Origins::Nothing => "",
        }
    }
}

impl PartialEq for Cors {
    fn eq(&self, other: &Self) -> bool {
        self.origins.as_str() == other.origins.as_str()
            && self.credentials == other.credentials
            && self.methods == other.methods
            && self.headers == other.headers
            && self.expose == other.expose
            && self.max_age == other.max_age
    }
}

impl Eq for Cors {}

impl Cors {
    /// The `Access-Control-Allow-Origin` for a request with `origin`, or `None` when the
    /// request is not allowed (it then gets no CORS headers, and OPTIONS goes upstream).
    pub fn allow_origin<'a>(&self, origin: Option<&'a [u8]>) -> Option<&'a [u8]> {
        match &self.origins {
            Origins::Any => Some(b"*"),
            // The entries are ASCII: on an ASCII Origin, ASCII case-insensitive equality is
            // the regex's answer (only a non-ASCII Origin could match by Unicode case folding).
            Origins::Matching {
                exact: Some(exact), ..
            } if origin.is_some_and(|o| o.is_ascii()) => {
                origin.filter(|o| exact.iter().any(|e| e.eq_ignore_ascii_case(o)))
            }
            Origins::Matching { regex, .. } => {
                origin.filter(|o| std::str::from_utf8(o).is_ok_and(|o| regex.is_match(o)))
            }
            Origins::Nothing => None,
        }
    }
}

/// The CORS policy of an Ingress, `None` without `enable-cors: "true"`. A bad option keeps its
/// default and is an error in `errors` (ingress-nginx falls back silently).
pub(super) fn parse(
    annotations: &BTreeMap<String, String>,
    enabled: bool,
    errors: &mut Vec<String>,
) -> Option<Cors> {
    if !enabled {
        return None;
    }
    let mut cors = Cors {
        origins: Origins::Any,
        credentials: true,
        methods: DEFAULT_METHODS.into(),
        headers: DEFAULT_HEADERS.into(),
        expose: None,
        max_age: DEFAULT_MAX_AGE,
        fixed: Vec::new(),
    };
    if let Some((key, value)) = lookup(annotations, "cors-allow-origin") {
        let mut patterns = Vec::new();
        let mut exact: Vec<Box<[u8]>> = Vec::new();
        let mut any = false;
        for origin in value.split(',').map(str::trim).filter(|o| !o.is_empty()) {
            if origin == "*" {
                any = true;
                break;
            }
            match origin_pattern(origin) {
                Some(p) => {
                    patterns.push(p);
                    exact.push(Box::from(origin.as_bytes()));
                }
                None => errors.push(format!(
                    "{key}: {origin:?} is not an origin (scheme://host[:port], the host may start with *.); it is left out"
                )),
            }
        }
        if !any {
            cors.origins = match Regex::new(&format!("(?i)^(?:{})$", patterns.join("|"))) {
                Ok(regex) if !patterns.is_empty() => Origins::Matching {
                    regex,
                    exact: (!exact.iter().any(|e| e.contains(&b'*')))
                        .then(|| exact.into_boxed_slice()),
                },
                _ => Origins::Nothing,
            };
        }
    }
    let matches =
        |value: &str, ok: &dyn Fn(u8) -> bool| !value.trim().is_empty() && value.bytes().all(ok);
    let list = |b: u8| b.is_ascii_alphanumeric() || b"-_, ".contains(&b);
    if let Some((key, value)) = lookup(annotations, "cors-allow-headers") {
        if matches(value, &list) {
            cors.headers = value.to_string();
        } else {
            errors.push(format!(
                "{key}: {value:?} is not a list of header names; the default is used"
            ));
        }
    }
    if let Some((key, value)) = lookup(annotations, "cors-allow-methods") {
        if matches(value, &|b| b.is_ascii_alphabetic() || b", ".contains(&b)) {
            cors.methods = value.to_string();
        } else {
            errors.push(format!(
                "{key}: {value:?} is not a list of methods; the default is used"
            ));
        }
    }
    if let Some((key, value)) = lookup(annotations, "cors-expose-headers") {
        if matches(value, &|b| list(b) || b == b'*') {
            cors.expose = Some(value.to_string());
        } else {
            errors.push(format!(
                "{key}: {value:?} is not a list of header names; none are exposed"
            ));
        }
    }
    if let Some((key, value)) = lookup(annotations, "cors-allow-credentials") {
        match value.trim() {
            "true" => cors.credentials = true,
            "false" => cors.credentials = false,
            _ => errors.push(format!(
                "{key}: {value:?} is not \"true\" or \"false\"; true is used"
            )),
        }
    }
    if let Some((key, value)) = lookup(annotations, "cors-max-age") {
        match value.trim().parse::<u64>() {
            Ok(n) => cors.max_age = n,
            Err(_) => errors.push(format!(
                "{key}: {value:?} is not a number of seconds; {DEFAULT_MAX_AGE} is used"
            )),
        }
    }
    cors.fixed = fixed_headers(&cors);
    Some(cors)
}

/// The CORS headers that do not depend on the request, in the order ingress-nginx's template
/// sets them. Every value passed the checks above, so none is left out for its bytes.
fn fixed_headers(cors: &Cors) -> Vec<(HeaderName, HeaderValue)> {
    let value = |s: &str| HeaderValue::from_str(s).ok();
    let mut set = Vec::new();
    if cors.credentials {
        set.push((
            header::ACCESS_CONTROL_ALLOW_CREDENTIALS,
            HeaderValue::from_static("true"),
        ));
    }
    set.extend(value(&cors.methods).map(|v| (header::ACCESS_CONTROL_ALLOW_METHODS, v)));
    set.extend(value(&cors.headers).map(|v| (header::ACCESS_CONTROL_ALLOW_HEADERS, v)));
    if let Some(expose) = cors.expose.as_deref().and_then(value) {
        set.push((header::ACCESS_CONTROL_EXPOSE_HEADERS, expose));
    }
    set.push((
        header::ACCESS_CONTROL_MAX_AGE,
        HeaderValue::from(cors.max_age),
    ));
    set
}

/// One allowed origin as a regex (ingress-nginx's `buildOriginRegex`: the text quoted, its `*`
/// one DNS label), or `None` when it is not `scheme://host[:port]` (or `null`).
fn origin_pattern(origin: &str) -> Option<String> {
    if origin == "null" {
        return Some("null".into());
    }
    let (scheme, rest) = origin.split_once("://")?;
    let host = match rest.rsplit_once(':') {
        Some((h, p)) if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) => h,
        _ => rest,
    };
    let bare = host.strip_prefix("*.").unwrap_or(host);
    let valid = !scheme.is_empty()
        && scheme.bytes().all(|b| b.is_ascii_lowercase())
        && !bare.is_empty()
        && bare
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.');
    if !valid {
        return None;
    }
    Some(regex::escape(origin).replacen(r"\*", "[A-Za-z0-9-]+", 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_pairs(pairs: &[(&str, &str)]) -> (Option<Cors>, usize) {
        let map: BTreeMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (format!("nginx.ingress.kubernetes.io/{k}"), v.to_string()))
            .collect();
        let enabled = map
            .get("nginx.ingress.kubernetes.io/enable-cors")
            .is_some_and(|v| v == "true");
        let mut errors = Vec::new();
        (parse(&map, enabled, &mut errors), errors.len())
    }

    #[test]
    fn origins() {
        let on = ("enable-cors", "true");
        // (allow-origin, request Origin, Allow-Origin answered)
        let cases: &[(Option<&str>, Option<&str>, Option<&str>)] = &[
            (None, None, Some("*")),
            (None, Some("https://a.example"), Some("*")),
            (Some("*"), Some("https://a.example"), Some("*")),
            (Some("https://a.example, *"), None, Some("*")),
            (
                Some("https://a.example"),
                Some("https://a.example"),
                Some("https://a.example"),
            ),
            (
                Some("https://a.example"),
                Some("HTTPS://A.EXAMPLE"),
                Some("HTTPS://A.EXAMPLE"),
            ),
            (Some("https://a.example"), Some("http://a.example"), None),
            (
                Some("https://a.example"),
                Some("https://a.example.evil"),
                None,
            ),
            (Some("https://a.example"), Some("xhttps://a.example"), None),
            (Some("https://a.example"), None, None),
            (
                Some("https://*.example.com"),
                Some("https://shop.example.com"),
                Some("https://shop.example.com"),
            ),
            (
                Some("https://*.example.com"),
                Some("https://a.b.example.com"),
                None,
            ),
            (
                Some("https://*.example.com"),
                Some("https://example.com"),
                None,
            ),
            (
                Some("http://a.example:8080, https://b.example"),
                Some("http://a.example:8080"),
                Some("http://a.example:8080"),
            ),
            (
                Some("http://a.example:8080, https://b.example"),
                Some("https://b.example"),
                Some("https://b.example"),
            ),
            (
                Some("http://a.example:8080, https://b.example"),
                Some("http://a.example"),
                None,
            ),
            // A non-ASCII Origin is the regex's to judge: Unicode case folding (KELVIN SIGN).
            (
                Some("https://kiosk.example"),
                Some("https://\u{212a}iosk.example"),
                Some("https://\u{212a}iosk.example"),
            ),
            (
                Some("https://kiosk.example"),
                Some("https://kiosk.example."),
                None,
            ),
        ];
        for (allow, origin, want) in cases {
            let mut pairs = vec![on];
            if let Some(allow) = allow {
                pairs.push(("cors-allow-origin", allow));
            }
            let (cors, errors) = parse_pairs(&pairs);
            assert_eq!(errors, 0, "{allow:?}");
            let cors = cors.expect("enabled");
            let got = cors.allow_origin(origin.map(str::as_bytes));
            assert_eq!(got, want.map(str::as_bytes), "{allow:?} {origin:?}");
            // An exact list answers as its regex does.
            if let Origins::Matching { regex, .. } = &cors.origins {
                let by_regex = origin.filter(|o| regex.is_match(o)).map(str::as_bytes);
                assert_eq!(got, by_regex, "{allow:?} {origin:?}");
            }
        }
    }

    #[test]
    fn options_and_their_problems() {
        let (none, _) = parse_pairs(&[("cors-allow-origin", "*")]);
        assert!(none.is_none(), "not enabled");
        let (cors, errors) = parse_pairs(&[("enable-cors", "true")]);
        let cors = cors.expect("enabled");
        assert_eq!(errors, 0);
        assert!(cors.credentials);
        assert_eq!(
            (
                cors.methods.as_str(),
                cors.headers.as_str(),
                cors.expose,
                cors.max_age
            ),
            (DEFAULT_METHODS, DEFAULT_HEADERS, None, DEFAULT_MAX_AGE)
        );
        let (cors, errors) = parse_pairs(&[
            ("enable-cors", "true"),
            ("cors-allow-methods", "GET, POST"),
            ("cors-allow-headers", "X-Custom, Content-Type"),
            ("cors-expose-headers", "X-Total, *"),
            ("cors-allow-credentials", "false"),
            ("cors-max-age", "60"),
        ]);
        assert_eq!(errors, 0);
        let cors = cors.expect("enabled");
        assert_eq!(
            (
                cors.methods.as_str(),
                cors.headers.as_str(),
                cors.expose.as_deref(),
                cors.max_age,
                cors.credentials
            ),
            (
                "GET, POST",
                "X-Custom, Content-Type",
                Some("X-Total, *"),
                60,
                false
            )
        );
        let (cors, errors) = parse_pairs(&[
            ("enable-cors", "true"),
            (
                "cors-allow-origin",
                "https://ok.example, not an origin, ftp//x",
            ),
            ("cors-allow-methods", "GET;rm"),
            ("cors-allow-headers", "X\r\nEvil: 1"),
            ("cors-expose-headers", "a:b"),
            ("cors-allow-credentials", "yes"),
            ("cors-max-age", "-1"),
        ]);
        assert_eq!(errors, 7);
        let cors = cors.expect("enabled");
        assert_eq!(cors.methods, DEFAULT_METHODS);
        assert_eq!(
            cors.allow_origin(Some(b"https://ok.example")),
            Some(&b"https://ok.example"[..])
        );
        let (cors, errors) = parse_pairs(&[("enable-cors", "true"), ("cors-allow-origin", "bad")]);
        assert_eq!(errors, 1);
        assert_eq!(
            cors.expect("enabled")
                .allow_origin(Some(b"https://x.example")),
            None,
            "fails closed"
        );
    }
}
