//! Authentication annotations, read as ingress-nginx reads them, into the typed policy the
//! access phase runs (`proxy::phase::auth`).
//!
//! ```text
//!   auth-type: basic + auth-secret (+ auth-secret-type, auth-realm)
//!       └─> the Secret (the Ingress's namespace) ─> htpasswd::Credentials ─> BasicAuth
//!   auth-type: digest + auth-secret + auth-realm (+ auth-secret-type)
//!       └─> the Secret ─> htdigest::DigestUsers ─> DigestAuth
//!   auth-url (+ auth-method, auth-signin, auth-signin-redirect-param, auth-response-headers,
//!   auth-request-redirect, auth-cache-key, auth-cache-duration, auth-keepalive*,
//!   auth-always-set-cookie) ─> ExternalAuth, its URLs and keys as Templates of nginx variables
//!   satisfy: all | any        how the source ranges and authentication combine
//!   ConfigMap global-auth-NAME ─> the same parser as auth-NAME ─> GlobalAuth, attached by
//!       the builder to routes without their own auth-url or enable-global-auth: "false";
//!       no-auth-locations (rule path prefixes) drop the external auth of their routes
//! ```
//!
//! Everything that cannot be honoured as written is an error, and the builder refuses the
//! Ingress (503) on it: a protected path is never served open because its Secret is missing,
//! its hash format unknown or its annotation misspelt.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use super::htdigest::DigestUsers;
use super::htpasswd::Credentials;
use super::lookup;
pub use super::variables::{Template, Var};
use crate::diagnostics::DiagnosticKind;
use crate::snapshot::address::AddressPolicy;
use crate::store::{ObjectKey, Store};

/// `auth-type: basic`: who may in, and the realm the 401 names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BasicAuth {
    /// `auth-realm` (empty by default, as ingress-nginx writes `auth_basic ""`).
    pub realm: Arc<str>,
    pub credentials: Credentials,
    /// The Secret the credentials came from, for logs.
    pub secret: ObjectKey,
}

/// `auth-type: digest`: who may in (by HA1), and the realm the challenge names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DigestAuth {
    /// `auth-realm` (required: see [`password`]).
    pub realm: Arc<str>,
    pub users: DigestUsers,
    /// The Secret the users came from, for logs.
    pub secret: ObjectKey,
}

/// `auth-type` with its users: the one kind of password check a route can have.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PasswordAuth {
    Basic(BasicAuth),
    Digest(DigestAuth),
}

/// `satisfy`: with `any`, a client inside the route's allow-list needs no authentication, and
/// one outside it may still get in by authenticating; with `all` (the default) both must pass.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Satisfy {
    #[default]
    All,
    Any,
}

/// Why an authentication annotation cannot be honoured: the diagnostic's kind and message.
pub type Refusal = (DiagnosticKind, String);

/// `satisfy`.
pub fn satisfy(annotations: Option<&BTreeMap<String, String>>) -> Result<Satisfy, Refusal> {
    let Some((key, value)) = annotations.and_then(|a| lookup(a, "satisfy")) else {
        return Ok(Satisfy::All);
    };
    match value.trim() {
        "all" | "" => Ok(Satisfy::All),
        "any" => Ok(Satisfy::Any),
        other => Err((
            DiagnosticKind::InvalidAnnotation,
            format!("{key}: {other:?} is not \"all\" or \"any\""),
        )),
    }
}

/// Basic or digest auth for an Ingress `ingress` with `annotations`, its Secret read from
/// `store`. `Ok(None)` without `auth-type` (ingress-nginx then ignores `auth-secret` too).
pub fn password(
    annotations: Option<&BTreeMap<String, String>>,
    store: &Store,
    ingress: &ObjectKey,
) -> Result<Option<PasswordAuth>, Refusal> {
    let Some(annotations) = annotations else {
        return Ok(None);
    };
    let invalid = |message: String| (DiagnosticKind::InvalidAnnotation, message);
    let Some((type_key, auth_type)) = lookup(annotations, "auth-type") else {
        return Ok(None);
    };
    let digest = match auth_type.trim() {
        "basic" => false,
        "digest" => true,
        other => {
            return Err(invalid(format!(
                "{type_key}: {other:?} is not \"basic\" or \"digest\""
            )));
        }
    };
    let Some((secret_key, secret)) = lookup(annotations, "auth-secret") else {
        return Err(invalid(format!(
            "{type_key} is set without auth-secret: there is nobody to let in"
        )));
    };
    let secret = secret.trim();
    let (namespace, name) = secret
        .split_once('/')
        .unwrap_or((ingress.namespace.as_str(), secret));
    let valid = |s: &str| {
        !s.is_empty()
            && s.len() <= 253
            && s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-.".contains(&b))
    };
    if !valid(namespace) || !valid(name) {
        return Err(invalid(format!(
            "{secret_key}: {secret:?} is not \"name\" or \"namespace/name\""
        )));
    }
    // ingress-nginx refuses Secrets of other namespaces unless its
    // allow-cross-namespace-resources is on (off by default): one namespace's Ingress must not
    // read another's passwords.
    if namespace != ingress.namespace {
        return Err(invalid(format!(
            "{secret_key}: {secret:?}: only Secrets in the Ingress's namespace can be used"
        )));
    }
    let key = ObjectKey::new(namespace.to_string(), name.to_string());
    let secret_type = match lookup(annotations, "auth-secret-type") {
        None => SecretType::File,
        Some((_, v)) if v.trim() == "auth-file" => SecretType::File,
        Some((_, v)) if v.trim() == "auth-map" => SecretType::Map,
        Some((k, v)) => {
            return Err(invalid(format!(
                "{k}: {v:?} is not \"auth-file\" or \"auth-map\""
            )));
        }
    };
    let realm = lookup(annotations, "auth-realm").map_or("", |(_, v)| v);
    // nginx's digest module treats an empty realm as "off": ingress-nginx would serve the
    // path unprotected. Refused here, never open.
    if digest && realm.is_empty() {
        return Err(invalid(format!(
            "{type_key}: digest needs auth-realm, the realm of the Secret's htdigest lines (ingress-nginx's nginx would leave this path unprotected)"
        )));
    }
    if realm
        .bytes()
        .any(|b| b == b'"' || b == b'\\' || b.is_ascii_control())
    {
        return Err(invalid(
            "auth-realm: quotes, backslashes and control characters cannot be sent in WWW-Authenticate".into(),
        ));
    }
    let Some(object) = store.secret(&key) else {
        return Err((
            DiagnosticKind::SecretNotFound,
            format!("{secret_key}: Secret {key} not found"),
        ));
    };
    let secret_invalid = |why: String| {
        (
            DiagnosticKind::SecretInvalid,
            format!("{secret_key}: Secret {key}: {why}"),
        )
    };
    let data = object.data.as_ref();
    let file = || {
        data.and_then(|d| d.get("auth")).ok_or_else(|| {
            secret_invalid(format!(
                "no \"auth\" key (auth-secret-type auth-file wants an {} file there)",
                if digest { "htdigest" } else { "htpasswd" }
            ))
        })
    };
    let entries = || {
        data.into_iter()
            .flatten()
            .map(|(user, value)| (user.as_str(), value.0.as_slice()))
    };
    if digest {
        let users = match secret_type {
            SecretType::File => DigestUsers::from_htdigest(&file()?.0)
                .map_err(|e| secret_invalid(format!("auth: {e}")))?,
            SecretType::Map => DigestUsers::from_map(entries()).map_err(secret_invalid)?,
        };
        if !users.has_realm(realm) {
            return Err(secret_invalid(format!(
                "holds no user of realm {realm:?} (auth-realm): nobody could log in"
            )));
        }
        return Ok(Some(PasswordAuth::Digest(DigestAuth {
            realm: Arc::from(realm),
            users,
            secret: key,
        })));
    }
    let credentials = match secret_type {
        SecretType::File => Credentials::from_htpasswd(&file()?.0)
            .map_err(|e| secret_invalid(format!("auth: {e}")))?,
        SecretType::Map => Credentials::from_map(entries()).map_err(secret_invalid)?,
    };
    if credentials.is_empty() {
        return Err(secret_invalid("holds no user".into()));
    }
    Ok(Some(PasswordAuth::Basic(BasicAuth {
        realm: Arc::from(realm),
        credentials,
        secret: key,
    })))
}

/// `auth-url` and its companions: every request asks an auth service first, as nginx's
/// `auth_request` does in ingress-nginx's template.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExternalAuth {
    /// `auth-url`, expanded per request.
    pub url: Template,
    /// `auth-method`: the subrequest's method (GET when unset); setting it also sends
    /// `X-Original-URI` and `X-Scheme`, as ingress-nginx does.
    pub method: Option<String>,
    /// `auth-signin` with `auth-signin-redirect-param` appended as ingress-nginx's
    /// `buildAuthSignURL` does: where a 401 from the auth service redirects (302).
    pub signin: Option<Template>,
    /// `auth-response-headers` (lower-case): copied from a 2xx answer onto the upstream
    /// request, replacing (or, when the answer lacks one, removing) the client's.
    pub response_headers: Vec<String>,
    /// `auth-request-redirect`: `X-Auth-Request-Redirect` (default `$request_uri`).
    pub request_redirect: Option<Template>,
    /// `auth-cache-key`: answers are cached under this key (expanded), per `cache`.
    pub cache_key: Option<Template>,
    /// `auth-cache-duration`: which statuses are cached, for how long.
    pub cache: Vec<CacheRule>,
    /// `auth-keepalive`, `-requests`, `-timeout`.
    pub keepalive: Keepalive,
    /// `auth-always-set-cookie`: the auth service's `Set-Cookie` reaches the client whatever
    /// the response's status (otherwise only with 2xx/3xx ones, nginx's `add_header`).
    pub always_set_cookie: bool,
    /// The addresses the auth service may have (`--allow-local-backends`; this node's own
    /// addresses are allowed: `https://$host/oauth2/auth` comes back through the proxy).
    pub addresses: AddressPolicy,
    /// `auth-proxy-set-headers`: the headers of that ConfigMap, set on the subrequest after
    /// nginx's own (filled in by the snapshot, which reads the ConfigMap).
    pub proxy_set_headers: super::configmap_headers::Headers,
}

/// `auth-keepalive`: idle connections kept to the auth service, each reused for at most
/// `requests` requests and kept idle at most `timeout`. `connections: 0` is a new connection
/// per check.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Keepalive {
    pub connections: usize,
    pub requests: u32,
    pub timeout: Duration,
}

impl Default for Keepalive {
    // ingress-nginx's defaults: no keepalive; 1000 requests; 60 s.
    fn default() -> Self {
        Self {
            connections: 0,
            requests: 1000,
            timeout: Duration::from_secs(60),
        }
    }
}

/// One `auth-cache-duration` entry: these statuses (none: 200, 301 and 302, as nginx's
/// `proxy_cache_valid`) are cached this long.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CacheRule {
    pub statuses: Vec<u16>,
    pub ttl: Duration,
}

impl ExternalAuth {
    /// How long an answer with `status` is cached, if at all.
    pub fn cache_ttl(&self, status: u16) -> Option<Duration> {
        self.cache_key.as_ref()?;
        self.cache
            .iter()
            .find(|rule| {
                if rule.statuses.is_empty() {
                    matches!(status, 200 | 301 | 302)
                } else {
                    rule.statuses.contains(&status)
                }
            })
            .map(|rule| rule.ttl)
    }
}

/// `auth-url` and its companions for an Ingress with `annotations`; `Ok(None)` without
/// `auth-url`. `addresses` is the backends' address policy.
pub fn external(
    annotations: Option<&BTreeMap<String, String>>,
    addresses: &AddressPolicy,
) -> Result<Option<ExternalAuth>, Refusal> {
    let Some(annotations) = annotations else {
        return Ok(None);
    };
    external_from(&|name| lookup(annotations, name), addresses)
        .map_err(|message| (DiagnosticKind::InvalidAnnotation, message))
}

/// Whether an Ingress's `annotations` set `auth-url` (its own external auth, which replaces
/// the ConfigMap's `global-auth-url` on its routes, as ingress-nginx's template does).
pub fn sets_auth_url(annotations: Option<&BTreeMap<String, String>>) -> bool {
    annotations.is_some_and(|a| lookup(a, "auth-url").is_some())
}

/// `enable-global-auth` (default true). A value that is not a boolean leaves global auth on,
/// as ingress-nginx reads it, with the reason to report.
pub fn enable_global_auth(
    annotations: Option<&BTreeMap<String, String>>,
) -> (bool, Option<String>) {
    let Some((key, value)) = annotations.and_then(|a| lookup(a, "enable-global-auth")) else {
        return (true, None);
    };
    match super::parse_bool(value) {
        Some(enabled) => (enabled, None),
        None => (
            true,
            Some(format!(
                "{key}: {value:?} is not a boolean (true or false); global auth stays on"
            )),
        ),
    }
}

/// The ConfigMap's global external auth: `global-auth-url` and its companions, read by the
/// same parser as the annotations (each `auth-NAME` is `global-auth-NAME`; there is no
/// global keepalive, as in ingress-nginx). `Ok(None)` without `global-auth-url` (or with an
/// empty one); `Err` says which key is wrong. The addresses are the default policy: the
/// snapshot sets the backends' own when it attaches the result to routes.
pub fn global_external(data: &BTreeMap<String, String>) -> Result<Option<ExternalAuth>, String> {
    let get = |name: &str| -> Option<(&str, &str)> {
        let global = match name {
            "auth-url"
            | "auth-method"
            | "auth-signin"
            | "auth-signin-redirect-param"
            | "auth-response-headers"
            | "auth-request-redirect"
            | "auth-cache-key"
            | "auth-cache-duration"
            | "auth-always-set-cookie" => format!("global-{name}"),
            _ => return None,
        };
        data.get_key_value(&global)
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .filter(|(_, v)| !v.trim().is_empty())
    };
    external_from(&get, &AddressPolicy::default())
}

/// The ConfigMap's global external auth, as the snapshot attaches it to routes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GlobalAuth {
    /// `global-auth-url` and its companions. `None`: not set. `Err`: set, but a value cannot
    /// be honoured as written (or `global-auth-snippet` is set and refused), and why: the
    /// routes it would protect are refused (503), never served open.
    pub external: Option<Result<Arc<ExternalAuth>, Arc<str>>>,
    /// `no-auth-locations`: the Ingress paths under these prefixes get no external auth,
    /// global or their own (as in ingress-nginx's template).
    pub no_auth_locations: Arc<[String]>,
}

impl Default for GlobalAuth {
    /// ingress-nginx's defaults: no global auth; ACME HTTP-01 challenges are never behind
    /// external auth.
    fn default() -> Self {
        Self {
            external: None,
            no_auth_locations: Arc::from(["/.well-known/acme-challenge".to_string()]),
        }
    }
}

impl GlobalAuth {
    /// The same, its auth service held to `addresses` (the policy an `auth-url`'s is).
    pub fn with_addresses(&self, addresses: &AddressPolicy) -> GlobalAuth {
        let external = self.external.clone().map(|external| {
            external.map(|e| {
                Arc::new(ExternalAuth {
                    addresses: addresses.clone(),
                    ..(*e).clone()
                })
            })
        });
        GlobalAuth {
            external,
            no_auth_locations: self.no_auth_locations.clone(),
        }
    }
}

/// What [`global`] has to report: an error (something is refused) or a warning.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GlobalAuthProblem {
    pub error: bool,
    pub message: String,
}

/// The global auth a ConfigMap's `data` asks for, and what to report about it.
/// `refuse_unsupported`: `--unsupported-access-annotations=refuse`, which decides what an
/// unsupported `global-auth-snippet` does.
pub fn global(
    data: &BTreeMap<String, String>,
    refuse_unsupported: bool,
) -> (GlobalAuth, Vec<GlobalAuthProblem>) {
    let mut out = GlobalAuth::default();
    let mut problems = Vec::new();
    if let Some(value) = data.get("no-auth-locations") {
        out.no_auth_locations = no_auth_locations(value).into();
    }
    out.external = match global_external(data) {
        Ok(None) => None,
        Ok(Some(external)) => Some(Ok(Arc::new(external))),
        Err(why) => {
            problems.push(GlobalAuthProblem {
                error: true,
                message: format!("{why}; every route that would get global auth is refused (503) until it is fixed"),
            });
            Some(Err(Arc::from(format!(
                "invalid global auth in the ConfigMap: {why}"
            ))))
        }
    };
    let snippet = data
        .get("global-auth-snippet")
        .filter(|v| !v.trim().is_empty());
    if let (Some(_), Some(Ok(_))) = (snippet, &out.external) {
        if refuse_unsupported {
            problems.push(GlobalAuthProblem {
                error: true,
                message: "global-auth-snippet: snippets never run here, so global auth cannot be applied as written; every route that would get it answers 503 (--unsupported-access-annotations=ignore applies it without the snippet)".into(),
            });
            out.external = Some(Err(Arc::from(
                "the ConfigMap's global-auth-snippet is not supported",
            )));
        } else {
            problems.push(GlobalAuthProblem {
                error: false,
                message: "global-auth-snippet: snippets never run here; global auth applies WITHOUT it (--unsupported-access-annotations=ignore)".into(),
            });
        }
    }
    (out, problems)
}

/// `no-auth-locations`: comma-separated prefixes of the Ingress paths that get no external
/// auth (ingress-nginx's `isLocationInLocationList`: entries trimmed, empty ones skipped).
pub fn no_auth_locations(value: &str) -> Vec<String> {
    value
        .split(',')
        .map(str::trim)
        .filter(|entry| !entry.is_empty())
        .map(str::to_string)
        .collect()
}

/// Whether the Ingress path `path` (as written in the rule, not a request's path) is under
/// one of `locations`: a plain string prefix, as ingress-nginx compares them, so
/// `/.well-known/acme-challenge` covers `/.well-known/acme-challenge/TOKEN` (cert-manager's
/// solver) but not `/`, whatever a request to `/` asks for.
pub fn is_no_auth_location(path: &str, locations: &[String]) -> bool {
    locations
        .iter()
        .any(|prefix| path.starts_with(prefix.as_str()))
}

/// The parser behind [`external`] and [`global_external`]: `get(NAME)` gives the key as
/// written and the value of the setting `NAME` (`auth-url`, `auth-method`, ...).
fn external_from<'a>(
    get: &dyn Fn(&str) -> Option<(&'a str, &'a str)>,
    addresses: &AddressPolicy,
) -> Result<Option<ExternalAuth>, String> {
    let Some((url_key, url)) = get("auth-url") else {
        return Ok(None);
    };
    let url = url.trim();
    let template = Template::parse(url).map_err(|e| format!("{url_key}: {e}"))?;
    let after_scheme = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))
        .ok_or_else(|| format!("{url_key}: {url:?} is not an http:// or https:// URL"))?;
    let host = after_scheme.split(['/', '?']).next().unwrap_or_default();
    if host.is_empty() {
        return Err(format!("{url_key}: {url:?} has no host"));
    }
    let method = match get("auth-method") {
        None => None,
        Some((key, value)) => {
            let value = value.trim();
            let known = [
                "GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "CONNECT", "OPTIONS", "TRACE",
            ];
            if !known.contains(&value) {
                return Err(format!(
                    "{key}: {value:?} is not an HTTP method (GET, HEAD, POST, ...)"
                ));
            }
            Some(value.to_string())
        }
    };
    let (redirect_key, redirect_param) = get("auth-signin-redirect-param")
        .map(|(k, v)| (k, v.trim()))
        .filter(|(_, v)| !v.is_empty())
        .unwrap_or(("auth-signin-redirect-param", "rd"));
    if !redirect_param
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
    {
        return Err(format!(
            "{redirect_key}: {redirect_param:?} is not a query parameter name"
        ));
    }
    let signin = match get("auth-signin") {
        None => None,
        Some((key, value)) => {
            let value = value.trim();
            if !(value.starts_with("http://")
                || value.starts_with("https://")
                || value.starts_with('/'))
            {
                return Err(format!("{key}: {value:?} is not a URL"));
            }
            Some(
                Template::parse(&signin_url(value, redirect_param))
                    .map_err(|e| format!("{key}: {e}"))?,
            )
        }
    };
    let mut response_headers = Vec::new();
    if let Some((key, value)) = get("auth-response-headers") {
        for name in value.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            let valid = name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
            if !valid || http::HeaderName::from_bytes(name.as_bytes()).is_err() {
                return Err(format!("{key}: {name:?} is not a header name"));
            }
            let lower = name.to_ascii_lowercase();
            // The proxy writes these itself; an auth service cannot replace them.
            if matches!(
                lower.as_str(),
                "host"
                    | "content-length"
                    | "transfer-encoding"
                    | "connection"
                    | "upgrade"
                    | "te"
                    | "keep-alive"
                    | "proxy-connection"
                    | "trailer"
            ) {
                return Err(format!(
                    "{key}: {name} is set by the proxy and cannot come from the auth service"
                ));
            }
            response_headers.push(lower);
        }
    }
    let template_of = |name: &str| -> Result<Option<Template>, String> {
        get(name)
            .map(|(key, value)| Template::parse(value.trim()).map_err(|e| format!("{key}: {e}")))
            .transpose()
    };
    let request_redirect = template_of("auth-request-redirect")?;
    let cache_key = template_of("auth-cache-key")?.filter(|t| !t.as_str().is_empty());
    let cache = match get("auth-cache-duration") {
        None => vec![CacheRule {
            statuses: vec![200, 202, 401],
            ttl: Duration::from_secs(300),
        }],
        Some((key, value)) => cache_durations(value).map_err(|e| format!("{key}: {e}"))?,
    };
    let mut keepalive = Keepalive::default();
    let int_of = |name: &str| -> Result<Option<i64>, String> {
        get(name)
            .map(|(key, value)| {
                value
                    .trim()
                    .parse::<i64>()
                    .map_err(|_| format!("{key}: {value:?} is not a whole number"))
            })
            .transpose()
    };
    if let Some(n) = int_of("auth-keepalive")? {
        keepalive.connections = usize::try_from(n.clamp(0, 1024)).unwrap_or(0);
    }
    if let Some(n) = int_of("auth-keepalive-requests")? {
        match u32::try_from(n) {
            Ok(n) if n > 0 => keepalive.requests = n,
            // ingress-nginx turns keepalive off rather than refusing.
            _ => keepalive.connections = 0,
        }
    }
    if let Some(n) = int_of("auth-keepalive-timeout")? {
        match u64::try_from(n) {
            Ok(n) if n > 0 => keepalive.timeout = Duration::from_secs(n.min(86_400)),
            _ => keepalive.connections = 0,
        }
    }
    // An nginx upstream block cannot name a variable host: ingress-nginx drops keepalive then.
    if host.contains('$') {
        keepalive.connections = 0;
    }
    // Accepted as a no-op (registry::no_op_reason), its value still checked.
    if let Some((key, v)) = get("auth-keepalive-share-vars")
        && !matches!(v.trim(), "true" | "false")
    {
        return Err(format!("{key}: {v:?} is not \"true\" or \"false\""));
    }
    // Go's strconv.ParseBool, as ingress-nginx reads the annotation and the ConfigMap key.
    let always_set_cookie = match get("auth-always-set-cookie") {
        None => false,
        Some((key, v)) => super::parse_bool(v)
            .ok_or_else(|| format!("{key}: {v:?} is not a boolean (true or false)"))?,
    };
    Ok(Some(ExternalAuth {
        url: template,
        method,
        signin,
        response_headers,
        request_redirect,
        cache_key,
        cache,
        keepalive,
        always_set_cookie,
        addresses: addresses.clone(),
        proxy_set_headers: Vec::new(),
    }))
}

/// ingress-nginx's `buildAuthSignURL`: `?rd=$pass_access_scheme://$http_host$escaped_request_uri`
/// appended (or `&rd=…` after a query), unless the URL's query already has the parameter.
fn signin_url(url: &str, param: &str) -> String {
    let redirect = "$pass_access_scheme://$http_host$escaped_request_uri";
    match url.split_once('?') {
        None => format!("{url}?{param}={redirect}"),
        Some((_, "")) => format!("{url}{param}={redirect}"),
        Some((_, query)) => {
            let has = query
                .split('&')
                .any(|pair| pair.split('=').next() == Some(param));
            if has {
                url.to_string()
            } else {
                format!("{url}&{param}={redirect}")
            }
        }
    }
}

/// `auth-cache-duration`: comma-separated entries of optional status codes and a time
/// (`200 202 401 5m`, `5m`, `1h 30m`), nginx's `proxy_cache_valid`.
pub fn cache_durations(value: &str) -> Result<Vec<CacheRule>, String> {
    let mut rules = Vec::new();
    for entry in value.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let mut statuses = Vec::new();
        let mut ttl = Duration::ZERO;
        let mut seen_time = false;
        for word in entry.split_whitespace() {
            if word.len() == 3 && word.bytes().all(|b| b.is_ascii_digit()) {
                if seen_time {
                    return Err(format!("{entry:?}: a status code after the time"));
                }
                let code: u16 = word.parse().map_err(|_| format!("{word:?}"))?;
                statuses.push(code);
                continue;
            }
            let split = word.find(|c: char| !c.is_ascii_digit()).ok_or_else(|| {
                format!("{entry:?}: {word:?} has no unit (ms, s, m, h, d, w, M, y)")
            })?;
            let (digits, unit) = word.split_at(split);
            let n: u64 = digits
                .parse()
                .map_err(|_| format!("{entry:?}: {word:?} is not a time"))?;
            let unit_secs: f64 = match unit {
                "ms" => 0.001,
                "s" => 1.0,
                "m" => 60.0,
                "h" => 3600.0,
                "d" => 86_400.0,
                "w" => 604_800.0,
                "M" => 2_592_000.0,
                "y" => 31_536_000.0,
                _ => {
                    return Err(format!(
                        "{entry:?}: {word:?} has no unit (ms, s, m, h, d, w, M, y)"
                    ));
                }
            };
            #[expect(
                clippy::cast_precision_loss,
                reason = "times are far below 2^52 seconds"
            )]
            let secs = n as f64 * unit_secs;
            ttl += Duration::try_from_secs_f64(secs).map_err(|_| format!("{entry:?}: too long"))?;
            seen_time = true;
        }
        if !seen_time {
            return Err(format!("{entry:?} has no time"));
        }
        rules.push(CacheRule { statuses, ttl });
    }
    if rules.is_empty() {
        return Err("no duration".into());
    }
    Ok(rules)
}

enum SecretType {
    /// `auth-file`: an htpasswd file under the key `auth`.
    File,
    /// `auth-map`: each key a user, each value a hash.
    Map,
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;
    use k8s_openapi::api::core::v1::Secret;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn store_with(name: &str, data: &[(&str, &str)]) -> Store {
        let mut store = Store::default();
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                ..ObjectMeta::default()
            },
            data: Some(
                data.iter()
                    .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
                    .collect(),
            ),
            ..Secret::default()
        };
        store.apply(crate::store::Object::Secret(Arc::new(secret)));
        store
    }

    fn annotations(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (format!("nginx.ingress.kubernetes.io/{k}"), v.to_string()))
            .collect()
    }

    #[test]
    fn basic_auth_reads_its_secret_or_refuses() {
        let ingress = ObjectKey::new("ns", "ing");
        let file = store_with("users", &[("auth", "alice:{PLAIN}a\n")]);
        let map = store_with("users", &[("alice", "{PLAIN}a"), ("bob", "{PLAIN}b")]);
        let bad = store_with("users", &[("auth", "alice:des-crypt\n")]);
        let basic_with = |extra: &[(&str, &str)]| {
            let mut pairs = vec![("auth-type", "basic"), ("auth-secret", "users")];
            pairs.extend_from_slice(extra);
            annotations(&pairs)
        };
        // (annotations, store) -> Ok(users) or Err(kind)
        type Want = Result<Option<usize>, DiagnosticKind>;
        let cases: Vec<(BTreeMap<String, String>, &Store, Want)> = vec![
            (annotations(&[]), &file, Ok(None)),
            // ingress-nginx ignores auth-secret without auth-type.
            (annotations(&[("auth-secret", "users")]), &file, Ok(None)),
            (basic_with(&[]), &file, Ok(Some(1))),
            (
                basic_with(&[("auth-secret-type", "auth-file")]),
                &file,
                Ok(Some(1)),
            ),
            (
                basic_with(&[("auth-secret-type", "auth-map")]),
                &map,
                Ok(Some(2)),
            ),
            (
                annotations(&[("auth-type", "basic"), ("auth-secret", "ns/users")]),
                &file,
                Ok(Some(1)),
            ),
            (
                annotations(&[("auth-type", "basic"), ("auth-secret", "other/users")]),
                &file,
                Err(DiagnosticKind::InvalidAnnotation),
            ),
            // Digest without a realm: nginx would serve it open.
            (
                annotations(&[("auth-type", "digest"), ("auth-secret", "users")]),
                &file,
                Err(DiagnosticKind::InvalidAnnotation),
            ),
            // Digest with an htpasswd file: not htdigest lines.
            (
                annotations(&[
                    ("auth-type", "digest"),
                    ("auth-secret", "users"),
                    ("auth-realm", "r"),
                ]),
                &file,
                Err(DiagnosticKind::SecretInvalid),
            ),
            (
                annotations(&[("auth-type", "Basic")]),
                &file,
                Err(DiagnosticKind::InvalidAnnotation),
            ),
            (
                annotations(&[("auth-type", "basic")]),
                &file,
                Err(DiagnosticKind::InvalidAnnotation),
            ),
            (
                basic_with(&[("auth-secret-type", "auth-list")]),
                &file,
                Err(DiagnosticKind::InvalidAnnotation),
            ),
            (
                annotations(&[("auth-type", "basic"), ("auth-secret", "missing")]),
                &file,
                Err(DiagnosticKind::SecretNotFound),
            ),
            (basic_with(&[]), &map, Err(DiagnosticKind::SecretInvalid)),
            (basic_with(&[]), &bad, Err(DiagnosticKind::SecretInvalid)),
            (
                basic_with(&[("auth-realm", "say \"hi\"")]),
                &file,
                Err(DiagnosticKind::InvalidAnnotation),
            ),
        ];
        for (annotations, store, want) in cases {
            let got = password(Some(&annotations), store, &ingress)
                .map(|b| {
                    b.map(|b| match b {
                        PasswordAuth::Basic(basic) => basic.credentials.len(),
                        PasswordAuth::Digest(digest) => digest.users.len(),
                    })
                })
                .map_err(|(kind, _)| kind);
            assert_eq!(got, want, "{annotations:?}");
        }
        let Ok(Some(PasswordAuth::Basic(realm))) = password(
            Some(&basic_with(&[("auth-realm", "Staff only")])),
            &file,
            &ingress,
        ) else {
            panic!("basic auth with a realm");
        };
        assert_eq!(&*realm.realm, "Staff only");
    }

    #[test]
    fn digest_auth_reads_htdigest_lines_of_its_realm() {
        let ingress = ObjectKey::new("ns", "ing");
        let ha1 = "8b84b0b7b4b1b3f9b0bc1d5e4f0e5f9a";
        let file = store_with("users", &[("auth", &format!("alice:Staff:{ha1}\n"))]);
        let map = store_with("users", &[("alice", &format!("Staff:{ha1}"))]);
        let digest_with = |extra: &[(&str, &str)]| {
            let mut pairs = vec![("auth-type", "digest"), ("auth-secret", "users")];
            pairs.extend_from_slice(extra);
            annotations(&pairs)
        };
        type Want = Result<Option<usize>, DiagnosticKind>;
        let cases: Vec<(BTreeMap<String, String>, &Store, Want)> = vec![
            (digest_with(&[("auth-realm", "Staff")]), &file, Ok(Some(1))),
            (
                digest_with(&[("auth-realm", "Staff"), ("auth-secret-type", "auth-map")]),
                &map,
                Ok(Some(1)),
            ),
            (
                digest_with(&[]),
                &file,
                Err(DiagnosticKind::InvalidAnnotation),
            ),
            // No line of the annotation's realm: nobody could ever log in.
            (
                digest_with(&[("auth-realm", "Other")]),
                &file,
                Err(DiagnosticKind::SecretInvalid),
            ),
            (
                digest_with(&[("auth-realm", "Staff"), ("auth-secret-type", "auth-map")]),
                &file,
                Err(DiagnosticKind::SecretInvalid),
            ),
        ];
        for (annotations, store, want) in cases {
            let got = password(Some(&annotations), store, &ingress)
                .map(|p| {
                    p.map(|p| match p {
                        PasswordAuth::Digest(digest) => digest.users.len(),
                        PasswordAuth::Basic(_) => panic!("digest"),
                    })
                })
                .map_err(|(kind, _)| kind);
            assert_eq!(got, want, "{annotations:?}");
        }
    }

    #[test]
    fn satisfy_values() {
        let cases = [
            (None, Ok(Satisfy::All)),
            (Some("all"), Ok(Satisfy::All)),
            (Some("any"), Ok(Satisfy::Any)),
            (Some(" any "), Ok(Satisfy::Any)),
            (Some("some"), Err(DiagnosticKind::InvalidAnnotation)),
        ];
        for (value, want) in cases {
            let map = annotations(
                &value
                    .map(|v| ("satisfy", v))
                    .into_iter()
                    .collect::<Vec<_>>(),
            );
            assert_eq!(satisfy(Some(&map)).map_err(|(k, _)| k), want, "{value:?}");
        }
    }

    #[test]
    fn templates_expand_nginx_variables() {
        let value = |var: &Var| match var {
            Var::Host => "app.example".to_string(),
            Var::HttpHost => "app.example:8080".to_string(),
            Var::RequestUri => "/a b?x=1".to_string(),
            Var::EscapedRequestUri => "%2Fa%20b%3Fx%3D1".to_string(),
            Var::Scheme => "https".to_string(),
            Var::Header(name) => format!("<h:{name}>"),
            Var::Cookie(name) => format!("<c:{name}>"),
            Var::Arg(name) => format!("<a:{name}>"),
            other => format!("<{other:?}>"),
        };
        let cases = [
            (
                "https://$host/oauth2/auth",
                "https://app.example/oauth2/auth",
            ),
            (
                "http://auth.svc/check?u=${request_uri}x",
                "http://auth.svc/check?u=/a b?x=1x",
            ),
            (
                "https://$host/oauth2/start?rd=$escaped_request_uri",
                "https://app.example/oauth2/start?rd=%2Fa%20b%3Fx%3D1",
            ),
            ("$scheme://$http_host", "https://app.example:8080"),
            (
                "$http_X_Api_Key|$cookie__oauth2_proxy|$arg_t",
                "<h:x-api-key>|<c:_oauth2_proxy>|<a:t>",
            ),
            (
                "$remote_user$http_authorization",
                "<RemoteUser><h:authorization>",
            ),
            ("no variables", "no variables"),
        ];
        for (text, want) in cases {
            let template = Template::parse(text).unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!(template.expand(value), want, "{text}");
            assert_eq!(template.as_str(), text);
        }
        for bad in [
            "$",
            "a$",
            "${host",
            "${}",
            "$nonsense",
            "$http_",
            "x/$foo/y",
        ] {
            assert!(Template::parse(bad).is_err(), "{bad:?} parsed");
        }
        assert!(Template::parse("http://a/b").unwrap().is_literal());
        assert!(!Template::parse("http://$host/b").unwrap().is_literal());
    }

    #[test]
    fn signin_urls_get_the_redirect_parameter_as_ingress_nginx_builds_them() {
        let rd = "$pass_access_scheme://$http_host$escaped_request_uri";
        let cases = [
            ("https://a/start", "rd", format!("https://a/start?rd={rd}")),
            ("https://a/start?", "rd", format!("https://a/start?rd={rd}")),
            (
                "https://a/start?x=1",
                "rd",
                format!("https://a/start?x=1&rd={rd}"),
            ),
            (
                "https://$host/oauth2/start?rd=$escaped_request_uri",
                "rd",
                "https://$host/oauth2/start?rd=$escaped_request_uri".to_string(),
            ),
            (
                "https://a/login",
                "next",
                format!("https://a/login?next={rd}"),
            ),
        ];
        for (url, param, want) in cases {
            assert_eq!(signin_url(url, param), want, "{url} {param}");
        }
    }

    #[test]
    fn cache_durations_read_as_proxy_cache_valid() {
        let rule = |statuses: &[u16], secs: u64| CacheRule {
            statuses: statuses.to_vec(),
            ttl: Duration::from_secs(secs),
        };
        let cases = [
            ("200 202 401 5m", Ok(vec![rule(&[200, 202, 401], 300)])),
            ("5m", Ok(vec![rule(&[], 300)])),
            ("1h 30m", Ok(vec![rule(&[], 5400)])),
            (
                "200 1d, 401 10s",
                Ok(vec![rule(&[200], 86_400), rule(&[401], 10)]),
            ),
            ("200 30s ", Ok(vec![rule(&[200], 30)])),
            ("200", Err(())),
            ("5", Err(())),
            ("5x", Err(())),
            ("5m 200", Err(())),
            ("", Err(())),
        ];
        for (value, want) in cases {
            assert_eq!(cache_durations(value).map_err(|_| ()), want, "{value:?}");
        }
        let auth = ExternalAuth {
            cache_key: Some(Template::parse("$http_authorization").unwrap()),
            cache: vec![rule(&[200, 401], 60), rule(&[], 5)],
            ..external_of(&[("auth-url", "http://a/")]).expect("parses")
        };
        assert_eq!(auth.cache_ttl(200), Some(Duration::from_secs(60)));
        assert_eq!(auth.cache_ttl(401), Some(Duration::from_secs(60)));
        assert_eq!(auth.cache_ttl(302), Some(Duration::from_secs(5)));
        assert_eq!(auth.cache_ttl(403), None);
        let uncached = ExternalAuth {
            cache_key: None,
            ..auth
        };
        assert_eq!(uncached.cache_ttl(200), None, "no auth-cache-key, no cache");
    }

    fn external_of(pairs: &[(&str, &str)]) -> Result<ExternalAuth, DiagnosticKind> {
        external(Some(&annotations(pairs)), &AddressPolicy::default())
            .map_err(|(kind, _)| kind)
            .map(|e| e.expect("auth-url is set"))
    }

    /// The ConfigMap's keys go through the annotations' parser: the same values mean the same
    /// policy, with no keepalive (ingress-nginx has no global one).
    #[test]
    fn global_auth_keys_read_as_their_annotations() {
        let data = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let all = [
            ("auth-url", "http://auth.svc/check?h=$host"),
            ("auth-method", "POST"),
            ("auth-signin", "https://login.example/start"),
            ("auth-signin-redirect-param", "next"),
            ("auth-response-headers", "X-User, X-Email"),
            ("auth-request-redirect", "https://$host/back"),
            ("auth-cache-key", "$http_authorization"),
            ("auth-cache-duration", "200 1m"),
            ("auth-always-set-cookie", "True"),
        ];
        let global: Vec<(String, &str)> = all
            .iter()
            .map(|(k, v)| (format!("global-{k}"), *v))
            .collect();
        let global: Vec<(&str, &str)> = global.iter().map(|(k, v)| (k.as_str(), *v)).collect();
        let (got, problems) = super::global(&data(&global), true);
        assert!(problems.is_empty(), "{problems:?}");
        let want = external_of(&all).expect("the annotations parse");
        assert_eq!(got.external, Some(Ok(Arc::new(want))));
        assert_eq!(&*got.no_auth_locations, ["/.well-known/acme-challenge"]);
        // No keepalive key is read from the ConfigMap.
        let (got, _) = super::global(
            &data(&[
                ("global-auth-url", "http://auth.svc/"),
                ("global-auth-keepalive", "5"),
            ]),
            true,
        );
        let Some(Ok(external)) = got.external else {
            panic!("parses")
        };
        assert_eq!(external.keepalive, Keepalive::default());
        // (data, external: None / Some(ok?), no-auth-locations, problems: (errors, warnings))
        type Case<'a> = (
            &'a [(&'a str, &'a str)],
            Option<bool>,
            &'a [&'a str],
            (usize, usize),
        );
        let acme: &[&str] = &["/.well-known/acme-challenge"];
        let cases: &[Case] = &[
            (&[], None, acme, (0, 0)),
            (&[("global-auth-url", " ")], None, acme, (0, 0)),
            (&[("global-auth-method", "get")], None, acme, (0, 0)),
            (
                &[("no-auth-locations", " /a , ,/b")],
                None,
                &["/a", "/b"],
                (0, 0),
            ),
            (&[("no-auth-locations", "")], None, &[], (0, 0)),
            (
                &[("global-auth-url", "auth.svc")],
                Some(false),
                acme,
                (1, 0),
            ),
            (
                &[
                    ("global-auth-url", "http://a/"),
                    ("global-auth-always-set-cookie", "yes"),
                ],
                Some(false),
                acme,
                (1, 0),
            ),
            (
                &[
                    ("global-auth-url", "http://a/"),
                    ("global-auth-response-headers", "Host"),
                ],
                Some(false),
                acme,
                (1, 0),
            ),
            (
                &[
                    ("global-auth-url", "http://a/"),
                    ("global-auth-snippet", "x"),
                ],
                Some(false),
                acme,
                (1, 0),
            ),
            (&[("global-auth-snippet", "x")], None, acme, (0, 0)),
        ];
        for (pairs, ok, locations, (errors, warnings)) in cases {
            let (got, problems) = super::global(&data(pairs), true);
            assert_eq!(got.external.as_ref().map(Result::is_ok), *ok, "{pairs:?}");
            assert_eq!(&*got.no_auth_locations, *locations, "{pairs:?}");
            let count = |error: bool| problems.iter().filter(|p| p.error == error).count();
            assert_eq!(
                (count(true), count(false)),
                (*errors, *warnings),
                "{pairs:?}"
            );
        }
        // The message names the key as the ConfigMap spells it.
        let (_, problems) = super::global(
            &data(&[
                ("global-auth-url", "http://a/"),
                ("global-auth-signin-redirect-param", "r d"),
            ]),
            true,
        );
        assert!(
            problems[0]
                .message
                .starts_with("global-auth-signin-redirect-param: ")
        );
        // Ignored, the snippet is a warning and global auth applies without it.
        let (got, problems) = super::global(
            &data(&[
                ("global-auth-url", "http://a/"),
                ("global-auth-snippet", "x"),
            ]),
            false,
        );
        assert!(matches!(got.external, Some(Ok(_))));
        assert_eq!(problems.len(), 1);
        assert!(!problems[0].error);
        // Prefixes of the rule's path, as written.
        let locations = no_auth_locations("/.well-known/acme-challenge");
        for (path, want) in [
            ("/.well-known/acme-challenge", true),
            ("/.well-known/acme-challenge/TOKEN", true),
            ("/.well-known/acme-challenge-x", true),
            ("/.well-known", false),
            ("/", false),
            ("/x/.well-known/acme-challenge", false),
        ] {
            assert_eq!(is_no_auth_location(path, &locations), want, "{path}");
        }
    }

    #[test]
    fn external_auth_annotations_are_validated_as_ingress_nginx_does() {
        let oauth2 = external_of(&[
            ("auth-url", "https://$host/oauth2/auth"),
            (
                "auth-signin",
                "https://$host/oauth2/start?rd=$escaped_request_uri",
            ),
            (
                "auth-response-headers",
                "X-Auth-Request-User, X-Auth-Request-Email,Authorization",
            ),
        ])
        .expect("oauth2-proxy's documented annotations parse");
        assert_eq!(
            oauth2.response_headers,
            [
                "x-auth-request-user",
                "x-auth-request-email",
                "authorization"
            ]
        );
        assert_eq!(oauth2.keepalive.connections, 0);
        assert!(oauth2.cache_key.is_none());
        let tuned = external_of(&[
            ("auth-url", "http://auth.ns.svc:8080/check"),
            ("auth-method", "POST"),
            ("auth-keepalive", "10"),
            ("auth-keepalive-requests", "50"),
            ("auth-keepalive-timeout", "5"),
            ("auth-cache-key", "$http_authorization"),
            ("auth-cache-duration", "200 1m"),
            ("auth-always-set-cookie", "true"),
            ("auth-signin", "https://login.example/"),
            ("auth-signin-redirect-param", "next"),
        ])
        .expect("parses");
        assert_eq!(tuned.method.as_deref(), Some("POST"));
        assert_eq!(
            tuned.keepalive,
            Keepalive {
                connections: 10,
                requests: 50,
                timeout: Duration::from_secs(5)
            }
        );
        assert!(tuned.always_set_cookie);
        assert_eq!(
            tuned.signin.as_ref().map(Template::as_str),
            Some(
                "https://login.example/?next=$pass_access_scheme://$http_host$escaped_request_uri"
            )
        );
        // A variable host turns keepalive off, as in ingress-nginx.
        let variable = external_of(&[("auth-url", "http://$host/a"), ("auth-keepalive", "5")])
            .expect("parses");
        assert_eq!(variable.keepalive.connections, 0);
        let invalid = DiagnosticKind::InvalidAnnotation;
        let bad: &[&[(&str, &str)]] = &[
            &[("auth-url", "auth.svc/check")],
            &[("auth-url", "ftp://auth/")],
            &[("auth-url", "http:///x")],
            &[("auth-url", "http://$nonsense/")],
            &[("auth-url", "http://a/"), ("auth-method", "get")],
            &[
                ("auth-url", "http://a/"),
                ("auth-response-headers", "X-Ok, Bad Header"),
            ],
            &[("auth-url", "http://a/"), ("auth-response-headers", "Host")],
            &[
                ("auth-url", "http://a/"),
                ("auth-cache-duration", "forever"),
            ],
            &[("auth-url", "http://a/"), ("auth-keepalive", "many")],
            &[("auth-url", "http://a/"), ("auth-always-set-cookie", "yes")],
            &[
                ("auth-url", "http://a/"),
                ("auth-keepalive-share-vars", "on"),
            ],
            &[("auth-url", "http://a/"), ("auth-signin", "login")],
            &[
                ("auth-url", "http://a/"),
                ("auth-signin-redirect-param", "r d"),
            ],
        ];
        for pairs in bad {
            assert_eq!(external_of(pairs).err(), Some(invalid), "{pairs:?}");
        }
        assert_eq!(
            external(
                Some(&annotations(&[("auth-signin", "https://x/")])),
                &AddressPolicy::default()
            ),
            Ok(None),
            "auth-signin alone is nothing"
        );
    }
}
