//! The annotations this controller reads. Each is accepted under its ingress-nginx name
//! (`nginx.ingress.kubernetes.io/…`) so existing manifests keep working, and under this
//! project's own prefix (`ingress.rs/…`), which wins when both are present.
//!
//! Every other annotation under either prefix is judged by the table in [`registry`]: see
//! [`unsupported`].

pub mod registry;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use registry::{Category, Status};

use super::upstream::{BackendProtocol, Balance, NextUpstream, TlsVersions, UpstreamTls};

pub const PREFIX: &str = "ingress.rs/";
pub const NGINX_PREFIX: &str = "nginx.ingress.kubernetes.io/";

/// Per-Ingress options, parsed once per snapshot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Options {
    /// `ssl-redirect`: `None` means "redirect when the host has TLS".
    pub ssl_redirect: Option<bool>,
    /// `force-ssl-redirect`: redirect to HTTPS even without TLS configured.
    pub force_ssl_redirect: bool,
    /// `ssl-passthrough`: the hosts are routed by SNI and TLS is left to the backend.
    pub ssl_passthrough: bool,
    /// `proxy-read-timeout`, in seconds: how long to wait for the upstream's response headers.
    pub read_timeout: Option<Duration>,
    /// `ingress.rs/upgrades`: the protocols a client may switch to with `Upgrade` (lower-case);
    /// `websocket` unless the annotation lists others. Only this project's prefix: ingress-nginx
    /// passes every `Upgrade` on.
    pub upgrades: Arc<[String]>,
    /// `backend-protocol`; `None` lets the Service port's `appProtocol` decide.
    pub backend_protocol: Option<BackendProtocol>,
    /// `proxy-ssl-verify`, `-verify-depth`, `-server-name`, `-name`, `-protocols`; the
    /// certificates of `proxy-ssl-secret` are filled in by the build, which reads the Secret.
    pub upstream_tls: UpstreamTls,
    /// `proxy-ssl-secret`: the Secret's name, in the Ingress's namespace.
    pub proxy_ssl_secret: Option<String>,
    /// `proxy-connect-timeout`, `proxy-send-timeout`, in seconds.
    pub connect_timeout: Option<Duration>,
    pub send_timeout: Option<Duration>,
    /// `upstream-vhost`.
    pub upstream_vhost: Option<String>,
    /// `service-upstream`: the Service's ClusterIP instead of its endpoints.
    pub service_upstream: bool,
    /// `load-balance`.
    pub load_balance: Option<Balance>,
    /// `proxy-next-upstream`, `-tries`, `-timeout`.
    pub next_upstream: NextUpstream,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            ssl_redirect: None,
            force_ssl_redirect: false,
            ssl_passthrough: false,
            read_timeout: None,
            upgrades: Arc::from(["websocket".to_string()]),
            backend_protocol: None,
            upstream_tls: UpstreamTls::default(),
            proxy_ssl_secret: None,
            connect_timeout: None,
            send_timeout: None,
            upstream_vhost: None,
            service_upstream: false,
            load_balance: None,
            next_upstream: NextUpstream::default(),
        }
    }
}

/// Parses the annotations this controller knows. Unknown keys are ignored, because other tools
/// annotate Ingresses too. Each value that does not parse is an error message and the option
/// keeps its default.
pub fn parse(annotations: Option<&BTreeMap<String, String>>) -> (Options, Vec<String>) {
    let mut options = Options::default();
    let mut errors = Vec::new();
    let Some(annotations) = annotations else {
        return (options, errors);
    };
    let mut bool_of = |name: &str| -> Option<bool> {
        let (key, value) = lookup(annotations, name)?;
        match value.trim() {
            "true" => Some(true),
            "false" => Some(false),
            other => {
                errors.push(format!("{key}: {other:?} is not \"true\" or \"false\""));
                None
            }
        }
    };
    options.ssl_redirect = bool_of("ssl-redirect");
    options.force_ssl_redirect = bool_of("force-ssl-redirect").unwrap_or(false);
    options.ssl_passthrough = bool_of("ssl-passthrough").unwrap_or(false);
    options.service_upstream = bool_of("service-upstream").unwrap_or(false);
    options.read_timeout = seconds_of(annotations, "proxy-read-timeout", &mut errors);
    options.connect_timeout = seconds_of(annotations, "proxy-connect-timeout", &mut errors);
    options.send_timeout = seconds_of(annotations, "proxy-send-timeout", &mut errors);
    if let Some(value) = annotations.get(&format!("{PREFIX}upgrades")) {
        match upgrade_list(value) {
            Some(list) => options.upgrades = list,
            None => errors.push(format!(
                "{PREFIX}upgrades: {value:?} is not a comma-separated list of protocol names"
            )),
        }
    }
    parse_upstream(annotations, &mut options, &mut errors);
    (options, errors)
}

/// `backend-protocol` and `proxy-ssl-*`, with ingress-nginx's value syntax.
fn parse_upstream(
    annotations: &BTreeMap<String, String>,
    options: &mut Options,
    errors: &mut Vec<String>,
) {
    let mut fail = |key: &str, why: String| errors.push(format!("{key}: {why}"));
    if let Some((key, value)) = lookup(annotations, "upstream-vhost") {
        // A host, optionally with a port: what a Host header may carry, nothing more.
        let value = value.trim();
        let ok = !value.is_empty()
            && value.len() <= 255
            && value
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-.:[]_".contains(&b));
        if ok {
            options.upstream_vhost = Some(value.to_string());
        } else {
            fail(
                key,
                format!("{value:?} is not a host name with an optional port"),
            );
        }
    }
    if let Some((key, value)) = lookup(annotations, "proxy-next-upstream") {
        let mut next = options.next_upstream;
        match NextUpstream::parse_conditions(value, &mut next) {
            Ok(()) => options.next_upstream = next,
            Err(why) => fail(key, why),
        }
    }
    if let Some((key, value)) = lookup(annotations, "proxy-next-upstream-tries") {
        match value.trim().parse::<u32>() {
            Ok(n) if n <= 100 => options.next_upstream.tries = n,
            _ => fail(key, format!("{value:?} is not a whole number in 0..=100")),
        }
    }
    if let Some((key, value)) = lookup(annotations, "proxy-next-upstream-timeout") {
        match value.trim().parse::<u64>() {
            Ok(0) => options.next_upstream.within = None,
            Ok(s) if s <= 86_400 => {
                options.next_upstream.within = Some(Duration::from_secs(s));
            }
            _ => fail(
                key,
                format!("{value:?} is not a whole number of seconds in 0..=86400"),
            ),
        }
    }
    if let Some((key, value)) = lookup(annotations, "load-balance") {
        match Balance::from_annotation(value) {
            Ok(b) => options.load_balance = Some(b),
            Err(why) => fail(key, why),
        }
    }
    if let Some((key, value)) = lookup(annotations, "backend-protocol") {
        match BackendProtocol::from_annotation(value) {
            Ok(p) => options.backend_protocol = Some(p),
            Err(why) => fail(key, why),
        }
    }
    let tls = &mut options.upstream_tls;
    for (name, field) in [
        ("proxy-ssl-verify", &mut tls.verify),
        ("proxy-ssl-server-name", &mut tls.send_sni),
    ] {
        if let Some((key, value)) = lookup(annotations, name) {
            match value.trim() {
                "on" => *field = true,
                "off" => *field = false,
                other => fail(key, format!("{other:?} is not \"on\" or \"off\"")),
            }
        }
    }
    if let Some((key, value)) = lookup(annotations, "proxy-ssl-verify-depth") {
        match value.trim().parse::<u8>() {
            Ok(depth) if (1..=100).contains(&depth) => tls.verify_depth = depth,
            _ => fail(key, format!("{value:?} is not a whole number in 1..=100")),
        }
    }
    if let Some((key, value)) = lookup(annotations, "proxy-ssl-name") {
        let name = value.trim().trim_end_matches('.').to_ascii_lowercase();
        match rustls_pki_types::ServerName::try_from(name.as_str()) {
            Ok(_) if !name.is_empty() => tls.name = Some(name),
            _ => fail(key, format!("{value:?} is not a DNS name or IP address")),
        }
    }
    if let Some((key, value)) = lookup(annotations, "proxy-ssl-protocols") {
        match TlsVersions::parse(value) {
            Ok(versions) => tls.versions = versions,
            Err(why) => fail(key, why),
        }
    }
    if let Some((key, value)) = lookup(annotations, "proxy-ssl-secret") {
        // ingress-nginx writes "namespace/name"; only the Ingress's own namespace is allowed
        // (checked by the build, which knows it), and a bare name means that namespace.
        let value = value.trim();
        let valid = |s: &str| {
            !s.is_empty()
                && s.len() <= 253
                && s.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-.".contains(&b))
        };
        let ok = match value.split_once('/') {
            Some((ns, name)) => valid(ns) && valid(name),
            None => valid(value),
        };
        if ok {
            options.proxy_ssl_secret = Some(value.to_string());
        } else {
            fail(
                key,
                format!("{value:?} is not \"namespace/name\" or \"name\""),
            );
        }
    }
}

/// What an Ingress with an access-control annotation this controller cannot honour gets.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum UnsupportedAccess {
    /// Not served: every path it declares answers 503, so nothing it protects is public.
    #[default]
    Refuse,
    /// Served without that protection, with a warning.
    Ignore,
}

/// An annotation under one of the two prefixes that this controller does not honour.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unsupported {
    /// The full key, as written on the object.
    pub key: String,
    pub category: Category,
    /// Whether ingress-nginx documents it (otherwise it is a typo, or newer than the table).
    pub known: bool,
}

/// The annotations under `nginx.ingress.kubernetes.io/` or `ingress.rs/` that are not honoured,
/// in key order. Other prefixes belong to other tools and are left alone.
pub fn unsupported(annotations: Option<&BTreeMap<String, String>>) -> Vec<Unsupported> {
    let Some(annotations) = annotations else {
        return Vec::new();
    };
    annotations
        .keys()
        .filter_map(|key| {
            let (name, entry) = match key.strip_prefix(PREFIX) {
                Some(name) => (name, registry::lookup_own(name)),
                None => {
                    let name = key.strip_prefix(NGINX_PREFIX)?;
                    (name, registry::lookup(name))
                }
            };
            match entry {
                Some(entry) if entry.status == Status::Supported => None,
                Some(entry) => Some(Unsupported {
                    key: key.clone(),
                    category: entry.category,
                    known: true,
                }),
                None => Some(Unsupported {
                    key: key.clone(),
                    category: registry::category_of_unknown(name),
                    known: false,
                }),
            }
        })
        .collect()
}

/// Protocol names as `Upgrade` carries them (RFC 9110 tokens), without versions; empty is a
/// valid list that allows none.
fn upgrade_list(value: &str) -> Option<Arc<[String]>> {
    let token = |s: &str| {
        !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
    };
    value
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| token(s).then(|| s.to_ascii_lowercase()))
        .collect::<Option<Vec<String>>>()
        .map(Arc::from)
}

fn seconds_of(
    annotations: &BTreeMap<String, String>,
    name: &str,
    errors: &mut Vec<String>,
) -> Option<Duration> {
    let (key, value) = lookup(annotations, name)?;
    match value.trim().parse::<u64>() {
        Ok(s) if (1..=86_400).contains(&s) => Some(Duration::from_secs(s)),
        _ => {
            errors.push(format!(
                "{key}: {value:?} is not a whole number of seconds in 1..=86400"
            ));
            None
        }
    }
}

fn lookup<'a>(annotations: &'a BTreeMap<String, String>, name: &str) -> Option<(&'a str, &'a str)> {
    [PREFIX, NGINX_PREFIX].iter().find_map(|prefix| {
        annotations
            .get_key_value(&format!("{prefix}{name}"))
            .map(|(k, v)| (k.as_str(), v.as_str()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_pairs(pairs: &[(&str, &str)]) -> (Options, Vec<String>) {
        let map: BTreeMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        parse(Some(&map))
    }

    #[test]
    fn unsupported_table() {
        let n = |s: &str| format!("{NGINX_PREFIX}{s}");
        let o = |s: &str| format!("{PREFIX}{s}");
        let cases: Vec<(String, Option<(Category, bool)>)> = vec![
            (n("ssl-redirect"), None),
            (o("proxy-read-timeout"), None),
            (n("rewrite-target"), Some((Category::Routing, true))),
            (
                n("whitelist-source-range"),
                Some((Category::AccessControl, true)),
            ),
            (o("auth-url"), Some((Category::AccessControl, true))),
            (n("auth-tls-secret"), Some((Category::AccessControl, true))),
            (n("limit-rps"), Some((Category::AccessControl, true))),
            (n("auth-brand-new"), Some((Category::AccessControl, false))),
            (n("no-such-thing"), Some((Category::Unknown, false))),
            (o("typo-redirect"), Some((Category::Unknown, false))),
            (o("upgrades"), None),
            (n("upgrades"), Some((Category::Unknown, false))),
            ("example.com/auth-url".to_string(), None),
            ("kubernetes.io/ingress.class".to_string(), None),
        ];
        for (key, want) in cases {
            let map = BTreeMap::from([(key.clone(), "x".to_string())]);
            let got: Vec<(Category, bool)> = unsupported(Some(&map))
                .into_iter()
                .map(|u| {
                    assert_eq!(u.key, key);
                    (u.category, u.known)
                })
                .collect();
            assert_eq!(got, want.into_iter().collect::<Vec<_>>(), "{key}");
        }
        assert!(unsupported(None).is_empty());
    }

    #[test]
    fn table() {
        let n = |s: &str| format!("{NGINX_PREFIX}{s}");
        let o = |s: &str| format!("{PREFIX}{s}");
        let cases: Vec<(Vec<(String, &str)>, Options, usize)> = vec![
            (vec![], Options::default(), 0),
            (
                vec![(n("ssl-redirect"), "false")],
                Options {
                    ssl_redirect: Some(false),
                    ..Default::default()
                },
                0,
            ),
            (
                vec![(n("ssl-redirect"), "false"), (o("ssl-redirect"), "true")],
                Options {
                    ssl_redirect: Some(true),
                    ..Default::default()
                },
                0,
            ),
            (
                vec![(n("force-ssl-redirect"), "true")],
                Options {
                    force_ssl_redirect: true,
                    ..Default::default()
                },
                0,
            ),
            (
                vec![(o("ssl-passthrough"), "true")],
                Options {
                    ssl_passthrough: true,
                    ..Default::default()
                },
                0,
            ),
            (vec![(n("ssl-passthrough"), "yes")], Options::default(), 1),
            (
                vec![(n("proxy-read-timeout"), "120")],
                Options {
                    read_timeout: Some(Duration::from_secs(120)),
                    ..Default::default()
                },
                0,
            ),
            (vec![(n("proxy-read-timeout"), "5s")], Options::default(), 1),
            (vec![(o("proxy-read-timeout"), "0")], Options::default(), 1),
            (
                vec![(o("upgrades"), "WebSocket, h2c")],
                Options {
                    upgrades: Arc::from(["websocket".to_string(), "h2c".to_string()]),
                    ..Default::default()
                },
                0,
            ),
            (
                vec![(o("upgrades"), "")],
                Options {
                    upgrades: Arc::from(Vec::<String>::new()),
                    ..Default::default()
                },
                0,
            ),
            (vec![(o("upgrades"), "web socket")], Options::default(), 1),
            (
                vec![(n("backend-protocol"), "GRPCS")],
                Options {
                    backend_protocol: Some(BackendProtocol::Grpcs),
                    ..Default::default()
                },
                0,
            ),
            (vec![(n("backend-protocol"), "FCGI")], Options::default(), 1),
            (vec![(n("backend-protocol"), "SPDY")], Options::default(), 1),
            (
                vec![
                    (n("proxy-ssl-verify"), "on"),
                    (n("proxy-ssl-server-name"), "on"),
                    (n("proxy-ssl-verify-depth"), "3"),
                    (n("proxy-ssl-name"), "Backend.Example."),
                    (n("proxy-ssl-protocols"), "TLSv1.3"),
                    (n("proxy-ssl-secret"), "default/backend-ca"),
                ],
                Options {
                    upstream_tls: UpstreamTls {
                        verify: true,
                        send_sni: true,
                        verify_depth: 3,
                        name: Some("backend.example".into()),
                        versions: TlsVersions {
                            tls12: false,
                            tls13: true,
                        },
                        ..UpstreamTls::default()
                    },
                    proxy_ssl_secret: Some("default/backend-ca".into()),
                    ..Default::default()
                },
                0,
            ),
            (vec![(n("proxy-ssl-verify"), "true")], Options::default(), 1),
            (
                vec![(n("proxy-ssl-server-name"), "yes")],
                Options::default(),
                1,
            ),
            (
                vec![(n("proxy-ssl-verify-depth"), "0")],
                Options::default(),
                1,
            ),
            (
                vec![(n("proxy-ssl-name"), "not a name")],
                Options::default(),
                1,
            ),
            (
                vec![(n("proxy-ssl-protocols"), "TLSv1 TLSv1.2")],
                Options::default(),
                1,
            ),
            (
                vec![(n("proxy-ssl-secret"), "a/b/c")],
                Options::default(),
                1,
            ),
            (
                vec![
                    (n("proxy-connect-timeout"), "3"),
                    (n("proxy-send-timeout"), "30"),
                    (n("upstream-vhost"), "internal.example:8080"),
                    (n("service-upstream"), "true"),
                    (n("load-balance"), "ewma"),
                ],
                Options {
                    connect_timeout: Some(Duration::from_secs(3)),
                    send_timeout: Some(Duration::from_secs(30)),
                    upstream_vhost: Some("internal.example:8080".into()),
                    service_upstream: true,
                    load_balance: Some(Balance::Ewma),
                    ..Default::default()
                },
                0,
            ),
            (
                vec![(n("proxy-connect-timeout"), "5s")],
                Options::default(),
                1,
            ),
            (vec![(n("upstream-vhost"), "a b")], Options::default(), 1),
            (
                vec![(n("upstream-vhost"), "a\r\nx: y")],
                Options::default(),
                1,
            ),
            (vec![(n("service-upstream"), "on")], Options::default(), 1),
            (
                vec![(n("load-balance"), "least_conn")],
                Options::default(),
                1,
            ),
            (
                vec![
                    (n("proxy-next-upstream"), "error non_idempotent"),
                    (n("proxy-next-upstream-tries"), "5"),
                    (n("proxy-next-upstream-timeout"), "10"),
                ],
                Options {
                    next_upstream: NextUpstream {
                        error: true,
                        timeout: false,
                        non_idempotent: true,
                        tries: 5,
                        within: Some(Duration::from_secs(10)),
                    },
                    ..Default::default()
                },
                0,
            ),
            (
                vec![(n("proxy-next-upstream"), "http_502")],
                Options::default(),
                1,
            ),
            (
                vec![(n("proxy-next-upstream-tries"), "-1")],
                Options::default(),
                1,
            ),
            (
                vec![(o("proxy-ssl-secret"), "ca-only")],
                Options {
                    proxy_ssl_secret: Some("ca-only".into()),
                    ..Default::default()
                },
                0,
            ),
            // Not an ingress-nginx annotation: its prefix does nothing here.
            (vec![(n("upgrades"), "h2c")], Options::default(), 0),
            (
                vec![("example.com/other".to_string(), "x")],
                Options::default(),
                0,
            ),
        ];
        for (pairs, want, errors) in cases {
            let pairs: Vec<(&str, &str)> = pairs.iter().map(|(k, v)| (k.as_str(), *v)).collect();
            let (got, errs) = parse_pairs(&pairs);
            assert_eq!(got, want, "{pairs:?}");
            assert_eq!(errs.len(), errors, "{pairs:?}: {errs:?}");
        }
    }
}
