//! The annotations this controller reads. Each is accepted under its ingress-nginx name
//! (`nginx.ingress.kubernetes.io/…`) so existing manifests keep working, and under this
//! project's own prefix (`ingress.rs/…`), which wins when both are present.
//!
//! Every other annotation under either prefix is judged by the table in [`registry`]: see
//! [`unsupported`].

pub mod affinity;
pub mod auth;
pub mod auth_tls;
pub mod canary;
pub mod configmap_headers;
pub mod cors;
pub mod errors;
pub mod hash;
pub mod htdigest;
pub mod htpasswd;
pub mod rate_limit;
pub mod registry;
pub mod rewrite;
pub mod snippet;
pub mod upstream_rewrite;
pub mod variables;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use registry::{Category, Status};

use super::sources::{self, SourcePolicy};
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
    /// `use-regex`: the paths are regular expressions, and every path of each host this Ingress
    /// names becomes a case-insensitive prefix regex (ingress-nginx's location modifier `~*`).
    pub use_regex: bool,
    /// `rewrite-target`: the path the upstream is sent, made from the route's regex captures.
    /// Like `use-regex`, it turns its hosts' paths into regexes.
    pub rewrite_target: Option<Arc<rewrite::Template>>,
    /// `app-root`: where a request for `/` on the hosts this Ingress names is redirected (302).
    pub app_root: Option<Arc<str>>,
    /// `x-forwarded-prefix`: the `X-Forwarded-Prefix` sent upstream with a rewritten request.
    pub x_forwarded_prefix: Option<Arc<str>>,
    /// `preserve-trailing-slash`: the HTTPS redirect keeps a target's trailing `/`.
    pub preserve_trailing_slash: bool,
    /// `temporal-redirect` (with its code), else `permanent-redirect` (with its code): every
    /// request is answered with a redirect to this URL instead of reaching the upstream.
    pub redirect: Option<UrlRedirect>,
    /// `from-to-www-redirect`: `www.HOST` redirects to `HOST` (or `HOST` to `www.HOST` for a
    /// host that starts with `www.`).
    pub from_to_www: bool,
    /// `server-alias`: more names served exactly as each host of the Ingress.
    pub server_alias: Vec<String>,
    /// `canary: "true"` and its rules: this Ingress's paths are alternatives of a main
    /// Ingress's same host, path and type, and every other annotation is the main's.
    pub canary: Option<Arc<canary::Rules>>,
    /// `affinity: cookie` with its mode and cookie.
    pub affinity: Option<Arc<affinity::Affinity>>,
    /// `enable-cors` with its `cors-*` options.
    pub cors: Option<Arc<cors::Cors>>,
    /// `proxy-body-size`: the largest request body, in bytes; `Some(0)` is no limit; `None`
    /// is `--proxy-body-size`.
    pub proxy_body_size: Option<u64>,
    /// `upstream-hash-by`: requests are spread over the endpoints by this key.
    pub upstream_hash_by: Option<Arc<hash::HashKey>>,
    /// `affinity-canary-behavior: legacy` (on a canary Ingress): sessions do not keep a client
    /// on the canary or the main backend; `sticky` (the default) does.
    pub affinity_canary_legacy: bool,
    /// `server-snippet` and `configuration-snippet` read as header actions (set by the
    /// snapshot with [`snippets`], only under `--allow-snippet-annotations`).
    pub snippets: Option<Arc<snippet::HeaderActions>>,
    /// `add-headers`, `custom-headers` and `proxy-set-headers`: the headers of the
    /// ConfigMaps they name (set by the snapshot, which reads the ConfigMaps).
    pub config_headers: Option<Arc<configmap_headers::ConfigHeaders>>,
    /// `proxy-redirect-from`/`-to`, `proxy-cookie-domain`, `proxy-cookie-path`.
    pub upstream_rewrite: Option<Arc<upstream_rewrite::UpstreamRewrite>>,
    /// `default-backend`: a Service of the Ingress's namespace that answers when the route's
    /// backend has no endpoints.
    pub default_backend: Option<String>,
    /// `custom-http-errors`: the codes replaced by the error backend's page (`None`: the
    /// ConfigMap's list applies).
    pub custom_http_errors: Option<Arc<[u16]>>,
    /// `disable-proxy-intercept-errors`: the upstream's own error responses pass through; only
    /// the proxy's own (no endpoint, upstream failures) get the error page.
    pub disable_intercept: bool,
}

/// A redirect annotation: answer with `code` and `Location: url`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UrlRedirect {
    pub code: u16,
    pub url: Arc<str>,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            ssl_redirect: None,
            force_ssl_redirect: false,
            ssl_passthrough: false,
            read_timeout: None,
            upgrades: Arc::from(["websocket".to_string()]),
            use_regex: false,
            rewrite_target: None,
            app_root: None,
            x_forwarded_prefix: None,
            preserve_trailing_slash: false,
            redirect: None,
            from_to_www: false,
            server_alias: Vec::new(),
            canary: None,
            affinity: None,
            cors: None,
            proxy_body_size: None,
            upstream_hash_by: None,
            affinity_canary_legacy: false,
            backend_protocol: None,
            upstream_tls: UpstreamTls::default(),
            proxy_ssl_secret: None,
            connect_timeout: None,
            send_timeout: None,
            upstream_vhost: None,
            service_upstream: false,
            load_balance: None,
            next_upstream: NextUpstream::default(),
            snippets: None,
            config_headers: None,
            upstream_rewrite: None,
            default_backend: None,
            custom_http_errors: None,
            disable_intercept: false,
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
    options.use_regex = bool_of("use-regex").unwrap_or(false);
    options.preserve_trailing_slash = bool_of("preserve-trailing-slash").unwrap_or(false);
    options.from_to_www = bool_of("from-to-www-redirect").unwrap_or(false);
    options.disable_intercept = bool_of("disable-proxy-intercept-errors").unwrap_or(false);
    let canary = bool_of("canary").unwrap_or(false);
    let cors = bool_of("enable-cors").unwrap_or(false);
    options.read_timeout = seconds_of(annotations, "proxy-read-timeout", &mut errors);
    options.connect_timeout = seconds_of(annotations, "proxy-connect-timeout", &mut errors);
    options.send_timeout = seconds_of(annotations, "proxy-send-timeout", &mut errors);
    options.canary = canary::parse(annotations, canary, &mut errors).map(Arc::new);
    options.affinity = affinity::parse(annotations, &mut errors).map(Arc::new);
    options.cors = cors::parse(annotations, cors, &mut errors).map(Arc::new);
    if let Some((key, value)) = lookup(annotations, "affinity-canary-behavior") {
        match value.trim() {
            "sticky" => {}
            "legacy" => options.affinity_canary_legacy = true,
            other => errors.push(format!(
                "{key}: {other:?} is not \"sticky\" or \"legacy\"; sticky is used"
            )),
        }
    }
    if let Some((key, value)) = lookup(annotations, "upstream-hash-by") {
        match hash::HashKey::parse(value) {
            Ok(mut hash) => {
                hash.subset = hash_subset(annotations, &mut errors);
                options.upstream_hash_by = Some(Arc::new(hash));
            }
            Err(err) => errors.push(format!("{key}: {err}; requests are balanced as usual")),
        }
    } else if let Some((key, _)) = lookup(annotations, "upstream-hash-by-subset")
        .or_else(|| lookup(annotations, "upstream-hash-by-subset-size"))
    {
        errors.push(format!(
            "{key} has no effect without upstream-hash-by, as in ingress-nginx"
        ));
    }
    if let Some((key, value)) = lookup(annotations, "proxy-body-size") {
        match size(value) {
            Some(n) => options.proxy_body_size = Some(n),
            None => errors.push(format!(
                "{key}: {value:?} is not a size (a number with an optional k, m or g; 0 for no limit)"
            )),
        }
    }
    // Accepted as no-ops (registry::no_op_reason), but their values are still checked, so a
    // typo is reported as ingress-nginx would reject it.
    for name in ["proxy-buffering", "proxy-request-buffering"] {
        if let Some((key, value)) = lookup(annotations, name)
            && !matches!(value.trim(), "on" | "off")
        {
            errors.push(format!("{key}: {value:?} is not \"on\" or \"off\""));
        }
    }
    for name in ["proxy-buffer-size", "client-body-buffer-size"] {
        if let Some((key, value)) = lookup(annotations, name)
            && size(value).is_none()
        {
            errors.push(format!(
                "{key}: {value:?} is not a size (a number with an optional k, m or g)"
            ));
        }
    }
    if let Some((key, value)) = lookup(annotations, "default-backend") {
        let name = value.trim();
        let label = |s: &str| {
            (1..=63).contains(&s.len())
                && s.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !s.starts_with('-')
                && !s.ends_with('-')
        };
        if label(name) {
            options.default_backend = Some(name.to_string());
        } else {
            errors.push(format!(
                "{key}: {value:?} is not a Service name (of the Ingress's namespace); no fallback is used"
            ));
        }
    }
    if let Some((key, value)) = lookup(annotations, "custom-http-errors") {
        match errors::parse_annotation(value) {
            Ok(codes) => options.custom_http_errors = Some(codes),
            Err(why) => errors.push(format!(
                "{key}: {why}; error responses are passed on as they are"
            )),
        }
    }
    let rewrites = proxy_rewrites(annotations, &mut errors);
    options.upstream_rewrite = (!rewrites.is_empty()).then(|| Arc::new(rewrites));
    if let Some((key, value)) = lookup(annotations, "rewrite-target") {
        match rewrite::Template::parse(value) {
            Ok(template) => options.rewrite_target = Some(Arc::new(template)),
            Err(err) => errors.push(format!("{key}: {err}; requests are not rewritten")),
        }
    }
    for (name, slot) in [
        ("app-root", &mut options.app_root),
        ("x-forwarded-prefix", &mut options.x_forwarded_prefix),
    ] {
        if let Some((key, value)) = lookup(annotations, name) {
            match rewrite::literal_path(value) {
                Ok(path) => *slot = Some(Arc::from(path)),
                Err(err) => errors.push(format!("{key}: {err}")),
            }
        }
    }
    if let Some(value) = annotations.get(&format!("{PREFIX}upgrades")) {
        match upgrade_list(value) {
            Some(list) => options.upgrades = list,
            None => errors.push(format!(
                "{PREFIX}upgrades: {value:?} is not a comma-separated list of protocol names"
            )),
        }
    }
    options.redirect = url_redirect(annotations, "temporal-redirect", 302, 307, &mut errors)
        .or_else(|| url_redirect(annotations, "permanent-redirect", 301, 308, &mut errors));
    if let Some((key, value)) = lookup(annotations, "server-alias") {
        for alias in value.split(',').map(str::trim).filter(|a| !a.is_empty()) {
            match super::host::parse_pattern(Some(alias)) {
                Ok(super::host::HostPattern::Any) | Err(_) => errors.push(format!(
                    "{key}: {alias:?} is not a host name or a *.wildcard (regular expressions are not supported); it is not served"
                )),
                Ok(_) => options.server_alias.push(alias.to_string()),
            }
        }
    }
    parse_upstream(annotations, &mut options, &mut errors);
    (options, errors)
}

/// The header actions of an Ingress's `server-snippet` and `configuration-snippet`, and why
/// any of them is not applied. `allow` is `--allow-snippet-annotations`: without it no snippet
/// is read. A snippet with anything outside the allow-listed subset is not applied at all.
pub fn snippets(
    annotations: Option<&BTreeMap<String, String>>,
    allow: bool,
) -> (Option<snippet::HeaderActions>, Vec<String>) {
    let mut errors = Vec::new();
    let Some(annotations) = annotations else {
        return (None, errors);
    };
    let mut read = |name: &str, kind: snippet::Kind| {
        let (key, value) = lookup(annotations, name)?;
        if !allow {
            errors.push(format!(
                "{key}: not applied: snippet annotations are disabled (--allow-snippet-annotations, off by default as ingress-nginx's allow-snippet-annotations since v1.9)"
            ));
            return None;
        }
        match snippet::parse(value, kind) {
            Ok(actions) => Some(actions),
            Err(err) => {
                errors.push(format!(
                    "{key}: not applied (snippets are never executed; only literal add_header, more_set_headers, more_clear_headers and proxy_set_header are read): {err}"
                ));
                None
            }
        }
    };
    let server = read("server-snippet", snippet::Kind::Server);
    let location = read("configuration-snippet", snippet::Kind::Location);
    if server.is_none() && location.is_none() {
        return (None, errors);
    }
    let merged = snippet::merge(server, location);
    let empty = merged.request.is_empty() && merged.response.is_empty();
    ((!empty).then_some(merged), errors)
}

/// `proxy-redirect-from`/`-to` (`off` and `default` in `-from` turn it off, as ingress-nginx;
/// otherwise both are needed, without spaces), `proxy-cookie-domain` and `proxy-cookie-path`.
fn proxy_rewrites(
    annotations: &BTreeMap<String, String>,
    errors: &mut Vec<String>,
) -> upstream_rewrite::UpstreamRewrite {
    let mut rewrites = upstream_rewrite::UpstreamRewrite::default();
    let from = lookup(annotations, "proxy-redirect-from");
    let to = lookup(annotations, "proxy-redirect-to");
    match (from, to) {
        (None, None) => {}
        (Some((_, "off" | "default")), _) => {}
        (Some((_, f)), Some((_, t)))
            if upstream_rewrite::literal(f) && upstream_rewrite::literal(t) =>
        {
            rewrites.redirect = Some((f.to_string(), t.to_string()));
        }
        (Some((key, f)), Some((_, t))) => errors.push(format!(
            "{key}: {f:?} to {t:?}: both must be literal text without spaces or $variables; Location is not rewritten"
        )),
        (Some((key, _)), None) | (None, Some((key, _))) => errors.push(format!(
            "{key}: proxy-redirect-from and proxy-redirect-to must be used together; Location is not rewritten"
        )),
    }
    for (name, slot) in [
        ("proxy-cookie-domain", &mut rewrites.cookie_domain),
        ("proxy-cookie-path", &mut rewrites.cookie_path),
    ] {
        if let Some((key, value)) = lookup(annotations, name) {
            match upstream_rewrite::parse_pair(value) {
                Ok(pair) => *slot = pair,
                Err(err) => errors.push(format!("{key}: {err}; Set-Cookie is not rewritten")),
            }
        }
    }
    rewrites
}

/// `NAME` and `NAME-code` as ingress-nginx reads them: an http(s) URL of the characters it
/// allows, and a code in 300..=`max` (otherwise `default`, as ingress-nginx does). A code that
/// is not a number disables the redirect, as in ingress-nginx.
fn url_redirect(
    annotations: &BTreeMap<String, String>,
    name: &str,
    default: u16,
    max: u16,
    errors: &mut Vec<String>,
) -> Option<UrlRedirect> {
    let (key, url) = lookup(annotations, name)?;
    let allowed = |b: u8| b.is_ascii_alphanumeric() || b"-._~/:,?&=".contains(&b);
    let has_host = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"))
        .and_then(|rest| rest.split(['/', '?']).next())
        .is_some_and(|host| !host.is_empty());
    if !url.bytes().all(allowed) || !has_host {
        errors.push(format!(
            "{key}: {url:?} is not an http:// or https:// URL of letters, digits and -._~/:,?&=; no redirect is made"
        ));
        return None;
    }
    let code = match lookup(annotations, &format!("{name}-code")) {
        None => default,
        Some((code_key, value)) => match value.trim().parse::<u16>() {
            Ok(code) if (300..=max).contains(&code) => code,
            Ok(code) => {
                errors.push(format!(
                    "{code_key}: {code} is not in 300..={max}; {default} is used, as ingress-nginx does"
                ));
                default
            }
            Err(_) => {
                errors.push(format!(
                    "{code_key}: {value:?} is not a number; no redirect is made, as in ingress-nginx"
                ));
                return None;
            }
        },
    };
    Some(UrlRedirect {
        code,
        url: Arc::from(url),
    })
}

/// A size as nginx writes it (ingress-nginx's `SizeRegex`): digits and an optional `b`, `k`,
/// `m` or `g` (either case), in bytes.
pub fn size(value: &str) -> Option<u64> {
    let value = value.trim();
    let (digits, unit) = match value.as_bytes().last()? {
        b'0'..=b'9' => (value, 1),
        b'b' | b'B' => (&value[..value.len() - 1], 1),
        b'k' | b'K' => (&value[..value.len() - 1], 1 << 10),
        b'm' | b'M' => (&value[..value.len() - 1], 1 << 20),
        b'g' | b'G' => (&value[..value.len() - 1], 1 << 30),
        _ => return None,
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse::<u64>().ok()?.checked_mul(unit)
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
                Some(entry) if matches!(entry.status, Status::Supported | Status::NoOp) => None,
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

/// `upstream-hash-by-subset` and `-subset-size`: the subset size when subsets are on. As in
/// ingress-nginx, a size of 0 (or none) is 3; a size that is not a whole number is an error
/// and 3 is used.
fn hash_subset(annotations: &BTreeMap<String, String>, errors: &mut Vec<String>) -> Option<usize> {
    let (key, value) = lookup(annotations, "upstream-hash-by-subset")?;
    match value.trim() {
        "true" => {}
        "false" => return None,
        other => {
            errors.push(format!(
                "{key}: {other:?} is not \"true\" or \"false\"; one endpoint per key"
            ));
            return None;
        }
    }
    let size = match lookup(annotations, "upstream-hash-by-subset-size") {
        None => hash::DEFAULT_SUBSET_SIZE,
        Some((key, value)) => match value.trim().parse::<u32>() {
            Ok(0) => hash::DEFAULT_SUBSET_SIZE,
            Ok(n) => usize::try_from(n).unwrap_or(usize::MAX),
            Err(_) => {
                errors.push(format!(
                    "{key}: {value:?} is not a whole number; {} is used",
                    hash::DEFAULT_SUBSET_SIZE
                ));
                hash::DEFAULT_SUBSET_SIZE
            }
        },
    };
    Some(size)
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

/// The source ranges of an Ingress (`allowlist-source-range`, or its older name
/// `whitelist-source-range`, and `denylist-source-range`), or why they cannot be applied. An
/// access control that cannot be applied as written refuses the Ingress (503, as ingress-nginx
/// denies such a location), never serves it open.
///
/// `defaults` are the global ranges (`--whitelist-source-range`, `--denylist-source-range`):
/// each list an Ingress does not set is the global one, as in ingress-nginx.
pub fn source_ranges(
    annotations: Option<&BTreeMap<String, String>>,
    defaults: &SourcePolicy,
) -> Result<SourcePolicy, String> {
    let Some(annotations) = annotations else {
        return Ok(defaults.clone());
    };
    let ranges = |names: &[&str]| -> Result<Option<Arc<[ipnet::IpNet]>>, String> {
        let Some((key, value)) = names.iter().find_map(|name| lookup(annotations, name)) else {
            return Ok(None);
        };
        sources::parse_ranges(value).map_err(|err| format!("{key}: {err}"))
    };
    Ok(SourcePolicy {
        allow: ranges(&["allowlist-source-range", "whitelist-source-range"])?
            .or_else(|| defaults.allow.clone()),
        deny: ranges(&["denylist-source-range"])?.unwrap_or_else(|| defaults.deny.clone()),
    })
}

/// Whether an Ingress sets its own allow-list and deny-list (so the global ones do not apply).
pub fn sets_source_ranges(annotations: Option<&BTreeMap<String, String>>) -> (bool, bool) {
    let Some(annotations) = annotations else {
        return (false, false);
    };
    let set = |names: &[&str]| names.iter().any(|n| lookup(annotations, n).is_some());
    (
        set(&["allowlist-source-range", "whitelist-source-range"]),
        set(&["denylist-source-range"]),
    )
}

/// A boolean as ingress-nginx reads one (Go's `strconv.ParseBool`), in annotations and in the
/// ConfigMap.
pub fn parse_bool(value: &str) -> Option<bool> {
    match value.trim() {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Some(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Some(false),
        _ => None,
    }
}

pub(crate) fn lookup<'a>(
    annotations: &'a BTreeMap<String, String>,
    name: &str,
) -> Option<(&'a str, &'a str)> {
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

    /// `upstream-hash-by-subset` and `-size`: (annotations) -> the subset size, errors.
    #[test]
    fn hash_subsets() {
        let n = |s: &str| format!("nginx.ingress.kubernetes.io/{s}");
        let by = (n("upstream-hash-by"), "$request_uri");
        let on = (n("upstream-hash-by-subset"), "true");
        let size = |v: &'static str| (n("upstream-hash-by-subset-size"), v);
        let cases: Vec<(Vec<(String, &str)>, Option<Option<usize>>, usize)> = vec![
            (vec![by.clone()], Some(None), 0),
            (vec![by.clone(), on.clone()], Some(Some(3)), 0),
            (vec![by.clone(), on.clone(), size("5")], Some(Some(5)), 0),
            // ingress-nginx reads 0 as its default, 3.
            (vec![by.clone(), on.clone(), size("0")], Some(Some(3)), 0),
            (vec![by.clone(), on.clone(), size("-1")], Some(Some(3)), 1),
            (vec![by.clone(), on.clone(), size("two")], Some(Some(3)), 1),
            (
                vec![
                    by.clone(),
                    (n("upstream-hash-by-subset"), "false"),
                    size("5"),
                ],
                Some(None),
                0,
            ),
            (
                vec![by.clone(), (n("upstream-hash-by-subset"), "yes")],
                Some(None),
                1,
            ),
            (vec![on.clone()], None, 1),
            (vec![size("2")], None, 1),
        ];
        for (pairs, want, errors) in cases {
            let refs: Vec<(&str, &str)> = pairs.iter().map(|(k, v)| (k.as_str(), *v)).collect();
            let (options, errs) = parse_pairs(&refs);
            let got = options.upstream_hash_by.as_ref().map(|h| h.subset);
            assert_eq!(got, want, "{refs:?}");
            assert_eq!(errs.len(), errors, "{refs:?}: {errs:?}");
        }
    }

    #[test]
    fn sizes() {
        let cases = [
            ("0", Some(0)),
            ("1024", Some(1024)),
            ("10b", Some(10)),
            ("8k", Some(8 << 10)),
            ("1m", Some(1 << 20)),
            ("1M", Some(1 << 20)),
            ("2g", Some(2 << 30)),
            (" 5m ", Some(5 << 20)),
            ("", None),
            ("m", None),
            ("1.5m", None),
            ("-1", None),
            ("1t", None),
            ("99999999999999999999g", None),
        ];
        for (value, want) in cases {
            assert_eq!(size(value), want, "{value:?}");
        }
    }

    #[test]
    fn source_ranges_by_annotation() {
        let map = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (format!("{NGINX_PREFIX}{k}"), v.to_string()))
                .collect()
        };
        let render = |policy: &SourcePolicy| {
            let list = |nets: &[ipnet::IpNet]| {
                nets.iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(",")
            };
            (policy.allow.as_deref().map(list), list(&policy.deny))
        };
        let cases: Vec<(Vec<(&str, &str)>, Result<(Option<&str>, &str), &str>)> = vec![
            (vec![], Ok((None, ""))),
            (
                vec![("allowlist-source-range", "10.0.0.0/8")],
                Ok((Some("10.0.0.0/8"), "")),
            ),
            (
                vec![("whitelist-source-range", "10.0.0.0/8")],
                Ok((Some("10.0.0.0/8"), "")),
            ),
            // The newer name wins when both are there.
            (
                vec![
                    ("allowlist-source-range", "10.0.0.0/8"),
                    ("whitelist-source-range", "192.168.0.0/16"),
                ],
                Ok((Some("10.0.0.0/8"), "")),
            ),
            (
                vec![("denylist-source-range", "192.0.2.1, 198.51.100.0/24")],
                Ok((None, "192.0.2.1/32,198.51.100.0/24")),
            ),
            (
                vec![("allowlist-source-range", "10.0.0.0/8, office")],
                Err("allowlist-source-range"),
            ),
            (
                vec![("denylist-source-range", "300.1.1.1")],
                Err("denylist-source-range"),
            ),
        ];
        for (pairs, want) in cases {
            let got = source_ranges(Some(&map(&pairs)), &SourcePolicy::default());
            match (&got, want) {
                (Ok(policy), Ok((allow, deny))) => {
                    let (got_allow, got_deny) = render(policy);
                    assert_eq!(
                        (got_allow.as_deref(), got_deny.as_str()),
                        (allow, deny),
                        "{pairs:?}"
                    );
                }
                (Err(message), Err(key)) => assert!(message.contains(key), "{message}"),
                _ => panic!("{pairs:?}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn global_source_ranges_fill_what_an_ingress_leaves_unset() {
        let global = SourcePolicy {
            allow: sources::parse_ranges("10.0.0.0/8").unwrap(),
            deny: sources::parse_ranges("10.9.0.0/16").unwrap().unwrap(),
        };
        let with = |pairs: &[(&str, &str)]| {
            let map: BTreeMap<String, String> = pairs
                .iter()
                .map(|(k, v)| (format!("{NGINX_PREFIX}{k}"), v.to_string()))
                .collect();
            source_ranges(Some(&map), &global).unwrap()
        };
        let ip = |s: &str| s.parse::<std::net::IpAddr>().unwrap();
        // (annotations, client, admitted)
        let cases: [(&[(&str, &str)], &str, bool); 6] = [
            (&[], "10.1.2.3", true),
            (&[], "192.168.1.1", false),
            (&[], "10.9.1.1", false),
            // The Ingress's own allow-list replaces the global one; the global deny stays.
            (
                &[("allowlist-source-range", "192.168.0.0/16")],
                "192.168.1.1",
                true,
            ),
            (
                &[("allowlist-source-range", "0.0.0.0/0")],
                "10.9.1.1",
                false,
            ),
            // Its own deny-list replaces the global one.
            (
                &[("denylist-source-range", "203.0.113.0/24")],
                "10.9.1.1",
                true,
            ),
        ];
        for (pairs, client, want) in cases {
            assert_eq!(with(pairs).admits(ip(client)), want, "{pairs:?} {client}");
        }
        assert_eq!(source_ranges(None, &global).unwrap(), global);
    }

    #[test]
    fn unsupported_table() {
        let n = |s: &str| format!("{NGINX_PREFIX}{s}");
        let o = |s: &str| format!("{PREFIX}{s}");
        let cases: Vec<(String, Option<(Category, bool)>)> = vec![
            (n("ssl-redirect"), None),
            (o("proxy-read-timeout"), None),
            (n("rewrite-target"), None),
            (n("canary"), None),
            (n("mirror-target"), Some((Category::Upstream, true))),
            (n("whitelist-source-range"), None),
            (n("auth-snippet"), Some((Category::AccessControl, true))),
            (o("auth-snippet"), Some((Category::AccessControl, true))),
            (n("auth-tls-secret"), None),
            (n("limit-rps"), None),
            (n("limit-rate"), None),
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
                vec![
                    (n("use-regex"), "true"),
                    (n("rewrite-target"), "/$2"),
                    (n("app-root"), "/app"),
                    (n("x-forwarded-prefix"), "/shop"),
                ],
                Options {
                    use_regex: true,
                    rewrite_target: Some(Arc::new(rewrite::Template::parse("/$2").unwrap())),
                    app_root: Some(Arc::from("/app")),
                    x_forwarded_prefix: Some(Arc::from("/shop")),
                    ..Default::default()
                },
                0,
            ),
            (vec![(n("use-regex"), "True")], Options::default(), 1),
            (
                vec![
                    (n("permanent-redirect"), "https://example.com/x?a=b&c=d"),
                    (n("from-to-www-redirect"), "true"),
                    (n("preserve-trailing-slash"), "true"),
                    (n("server-alias"), "a.example.com, *.b.example.com,"),
                ],
                Options {
                    redirect: Some(UrlRedirect {
                        code: 301,
                        url: Arc::from("https://example.com/x?a=b&c=d"),
                    }),
                    from_to_www: true,
                    preserve_trailing_slash: true,
                    server_alias: vec!["a.example.com".into(), "*.b.example.com".into()],
                    ..Default::default()
                },
                0,
            ),
            (
                vec![
                    (n("permanent-redirect"), "http://example.com"),
                    (n("permanent-redirect-code"), "308"),
                ],
                Options {
                    redirect: Some(UrlRedirect {
                        code: 308,
                        url: Arc::from("http://example.com"),
                    }),
                    ..Default::default()
                },
                0,
            ),
            // Temporal wins over permanent; its codes stop at 307.
            (
                vec![
                    (n("permanent-redirect"), "http://p.example"),
                    (n("temporal-redirect"), "http://t.example/"),
                    (n("temporal-redirect-code"), "308"),
                ],
                Options {
                    redirect: Some(UrlRedirect {
                        code: 302,
                        url: Arc::from("http://t.example/"),
                    }),
                    ..Default::default()
                },
                1,
            ),
            (
                vec![
                    (n("temporal-redirect"), "http://t.example/"),
                    (n("temporal-redirect-code"), "303"),
                ],
                Options {
                    redirect: Some(UrlRedirect {
                        code: 303,
                        url: Arc::from("http://t.example/"),
                    }),
                    ..Default::default()
                },
                0,
            ),
            (
                vec![
                    (n("permanent-redirect"), "http://p.example"),
                    (n("permanent-redirect-code"), "moved"),
                ],
                Options::default(),
                1,
            ),
            (
                vec![(n("permanent-redirect"), "/relative")],
                Options::default(),
                1,
            ),
            (
                vec![(n("permanent-redirect"), "ftp://x.example")],
                Options::default(),
                1,
            ),
            (
                vec![(n("permanent-redirect"), "http://")],
                Options::default(),
                1,
            ),
            (
                vec![(n("permanent-redirect"), "http://x.example/$request_uri")],
                Options::default(),
                1,
            ),
            (
                vec![(n("permanent-redirect"), "http://x.example/a b")],
                Options::default(),
                1,
            ),
            (
                vec![(
                    n("server-alias"),
                    "ok.example.com,~^www\\d+\\.example\\.com$,Bad_Name",
                )],
                Options {
                    server_alias: vec!["ok.example.com".into()],
                    ..Default::default()
                },
                2,
            ),
            (vec![(n("rewrite-target"), "/$uri")], Options::default(), 1),
            (vec![(n("rewrite-target"), "")], Options::default(), 1),
            (vec![(n("app-root"), "app")], Options::default(), 1),
            (
                vec![(n("x-forwarded-prefix"), "/a\r\nX-Evil: 1")],
                Options::default(),
                1,
            ),
            (
                vec![
                    (n("proxy-redirect-from"), "http://internal/"),
                    (n("proxy-redirect-to"), "/"),
                    (n("proxy-cookie-domain"), "internal.local shop.example"),
                    (n("proxy-cookie-path"), "off"),
                ],
                Options {
                    upstream_rewrite: Some(Arc::new(upstream_rewrite::UpstreamRewrite {
                        redirect: Some(("http://internal/".into(), "/".into())),
                        cookie_domain: Some(("internal.local".into(), "shop.example".into())),
                        cookie_path: None,
                    })),
                    ..Default::default()
                },
                0,
            ),
            (
                vec![
                    (n("proxy-redirect-from"), "default"),
                    (n("proxy-redirect-to"), "/x"),
                ],
                Options::default(),
                0,
            ),
            (
                vec![(n("proxy-redirect-from"), "http://internal/")],
                Options::default(),
                1,
            ),
            (
                vec![
                    (n("proxy-redirect-from"), "http://internal/"),
                    (n("proxy-redirect-to"), "https://$host/"),
                ],
                Options::default(),
                1,
            ),
            (
                vec![(n("proxy-cookie-path"), "~^/app(.*) /$1")],
                Options::default(),
                1,
            ),
            // The buffering annotations are no-ops, but their values are checked.
            (
                vec![
                    (n("proxy-buffering"), "on"),
                    (n("proxy-request-buffering"), "off"),
                    (n("proxy-buffer-size"), "16k"),
                    (n("client-body-buffer-size"), "1M"),
                ],
                Options::default(),
                0,
            ),
            (
                vec![
                    (n("proxy-buffering"), "yes"),
                    (n("proxy-buffer-size"), "16kb"),
                ],
                Options::default(),
                2,
            ),
            (
                vec![(n("default-backend"), "errors")],
                Options {
                    default_backend: Some("errors".into()),
                    ..Default::default()
                },
                0,
            ),
            (
                vec![(n("default-backend"), "other/errors")],
                Options::default(),
                1,
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

    /// The upstream annotations (`backend-protocol`, `proxy-ssl-*`, timeouts, `upstream-vhost`,
    /// `service-upstream`, `load-balance`, `proxy-next-upstream*`); the rest are in `table`.
    #[test]
    fn upstream_table() {
        let n = |s: &str| format!("{NGINX_PREFIX}{s}");
        let o = |s: &str| format!("{PREFIX}{s}");
        let cases: Vec<(Vec<(String, &str)>, Options, usize)> = vec![
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
        ];
        for (pairs, want, errors) in cases {
            let pairs: Vec<(&str, &str)> = pairs.iter().map(|(k, v)| (k.as_str(), *v)).collect();
            let (got, errs) = parse_pairs(&pairs);
            assert_eq!(got, want, "{pairs:?}");
            assert_eq!(errs.len(), errors, "{pairs:?}: {errs:?}");
        }
    }
}
