//! Every annotation ingress-nginx documents, what it is about, and whether this controller
//! honours it: one table, so the snapshot's diagnostics and the migration report read the same
//! data.
//!
//! ```text
//!   nginx.ingress.kubernetes.io/NAME or ingress.rs/NAME
//!       └─> lookup(NAME) ─> Annotation { category, status }
//!             not in the table ─> category_of_unknown(NAME): access control by family, else Unknown
//!   unsupported + AccessControl ─> the Ingress is refused (503) unless told to ignore it
//!   unsupported + anything else ─> a warning; the Ingress is served without it
//! ```
//!
//! An access-control annotation that is not honoured would turn a protected path public, so it
//! fails closed; names this table does not know but which belong to an access-control family
//! (`auth-…`, `limit-…`, `…-source-range`, ModSecurity, global rate limits) fail closed too.

use std::fmt;

use serde::Serialize;

/// What an annotation is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Category {
    /// Which backend a request reaches: paths, rewrites, redirects, canaries, aliases.
    Routing,
    /// How the upstream is spoken to: protocol, timeouts, retries, buffering, balancing,
    /// affinity, mirroring.
    Upstream,
    /// TLS toward clients or upstreams.
    Tls,
    /// Who may reach the backend: source ranges, authentication, client certificates, rate
    /// limits, WAF. Unhonoured, the Ingress is not served.
    AccessControl,
    /// What the client gets back: headers, CORS, error pages, cookie and redirect rewriting.
    Response,
    /// Raw nginx configuration.
    Snippet,
    /// Logs and traces.
    Observability,
    /// Not in ingress-nginx's documentation.
    Unknown,
}

impl Category {
    pub fn as_str(self) -> &'static str {
        match self {
            Category::Routing => "routing",
            Category::Upstream => "upstream",
            Category::Tls => "tls",
            Category::AccessControl => "access-control",
            Category::Response => "response",
            Category::Snippet => "snippet",
            Category::Observability => "observability",
            Category::Unknown => "unknown",
        }
    }
}

impl fmt::Display for Category {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Whether this controller honours an annotation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Status {
    Supported,
    Unsupported,
    /// Accepted (its value is checked) but it changes nothing here, for the reason
    /// [`no_op_reason`] gives: what it tunes does not exist in this proxy.
    NoOp,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Supported => "supported",
            Status::Unsupported => "unsupported",
            Status::NoOp => "no-op",
        }
    }
}

/// Why a [`Status::NoOp`] annotation changes nothing.
pub fn no_op_reason(name: &str) -> Option<&'static str> {
    Some(match name {
        "proxy-buffering" => {
            "responses are always streamed to the client as they arrive, which is proxy-buffering: off (ingress-nginx's default); on is not honoured"
        }
        "proxy-buffer-size" => {
            "the proxy reads an upstream's response head into its own buffer, whatever its size up to the header limits, so there is no buffer size to tune"
        }
        "proxy-request-buffering" => {
            "request bodies are always streamed to the upstream, which is proxy-request-buffering: off; on (nginx reads the whole body first) is not honoured; proxy-body-size is enforced either way"
        }
        "client-body-buffer-size" => {
            "request bodies are streamed, never buffered in memory or spooled to disk, so there is no buffer size to tune"
        }
        "auth-keepalive-share-vars" => {
            "the auth service's answer is read by the proxy itself, not through nginx variables, so there is nothing to share: auth-response-headers reach the upstream either way"
        }
        _ => return None,
    })
}

/// One annotation, by its name after the prefix.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Annotation {
    pub name: &'static str,
    pub category: Category,
    pub status: Status,
}

const fn yes(name: &'static str, category: Category) -> Annotation {
    Annotation {
        name,
        category,
        status: Status::Supported,
    }
}

const fn noop(name: &'static str, category: Category) -> Annotation {
    Annotation {
        name,
        category,
        status: Status::NoOp,
    }
}

const fn no(name: &'static str, category: Category) -> Annotation {
    Annotation {
        name,
        category,
        status: Status::Unsupported,
    }
}

use Category::{AccessControl, Observability, Response, Routing, Snippet, Tls, Upstream};

/// Sorted by name (a test keeps it so): `lookup` is a binary search.
pub const ANNOTATIONS: &[Annotation] = &[
    yes("affinity", Upstream),
    yes("affinity-canary-behavior", Upstream),
    yes("affinity-mode", Upstream),
    yes("allowlist-source-range", AccessControl),
    yes("app-root", Routing),
    yes("auth-always-set-cookie", AccessControl),
    yes("auth-cache-duration", AccessControl),
    yes("auth-cache-key", AccessControl),
    yes("auth-keepalive", AccessControl),
    yes("auth-keepalive-requests", AccessControl),
    noop("auth-keepalive-share-vars", AccessControl),
    yes("auth-keepalive-timeout", AccessControl),
    yes("auth-method", AccessControl),
    yes("auth-proxy-set-headers", AccessControl),
    yes("auth-realm", AccessControl),
    yes("auth-request-redirect", AccessControl),
    yes("auth-response-headers", AccessControl),
    yes("auth-secret", AccessControl),
    yes("auth-secret-type", AccessControl),
    yes("auth-signin", AccessControl),
    yes("auth-signin-redirect-param", AccessControl),
    no("auth-snippet", AccessControl),
    yes("auth-tls-error-page", AccessControl),
    yes("auth-tls-match-cn", AccessControl),
    yes("auth-tls-pass-certificate-to-upstream", AccessControl),
    yes("auth-tls-secret", AccessControl),
    yes("auth-tls-verify-client", AccessControl),
    yes("auth-tls-verify-depth", AccessControl),
    yes("auth-type", AccessControl),
    yes("auth-url", AccessControl),
    yes("backend-protocol", Upstream),
    yes("canary", Routing),
    yes("canary-by-cookie", Routing),
    yes("canary-by-header", Routing),
    yes("canary-by-header-pattern", Routing),
    yes("canary-by-header-value", Routing),
    yes("canary-weight", Routing),
    yes("canary-weight-total", Routing),
    noop("client-body-buffer-size", Upstream),
    yes("configuration-snippet", Snippet),
    no("connection-proxy-header", Upstream),
    yes("cors-allow-credentials", Response),
    yes("cors-allow-headers", Response),
    yes("cors-allow-methods", Response),
    yes("cors-allow-origin", Response),
    yes("cors-expose-headers", Response),
    yes("cors-max-age", Response),
    yes("custom-headers", Response),
    yes("custom-http-errors", Response),
    yes("default-backend", Routing),
    yes("denylist-source-range", AccessControl),
    yes("disable-proxy-intercept-errors", Response),
    no("enable-access-log", Observability),
    yes("enable-cors", Response),
    yes("enable-global-auth", AccessControl),
    no("enable-modsecurity", AccessControl),
    no("enable-opentelemetry", Observability),
    no("enable-owasp-core-rules", AccessControl),
    no("enable-rewrite-log", Observability),
    no("fastcgi-index", Upstream),
    no("fastcgi-params-configmap", Upstream),
    yes("force-ssl-redirect", Routing),
    yes("from-to-www-redirect", Routing),
    no("global-rate-limit", AccessControl),
    no("global-rate-limit-ignored-cidrs", AccessControl),
    no("global-rate-limit-key", AccessControl),
    no("global-rate-limit-window", AccessControl),
    no("http2-push-preload", Response),
    yes("limit-allowlist", AccessControl),
    yes("limit-burst-multiplier", AccessControl),
    yes("limit-connections", AccessControl),
    yes("limit-rate", AccessControl),
    yes("limit-rate-after", AccessControl),
    yes("limit-rpm", AccessControl),
    yes("limit-rps", AccessControl),
    yes("limit-whitelist", AccessControl),
    yes("load-balance", Upstream),
    no("mirror-host", Upstream),
    no("mirror-request-body", Upstream),
    no("mirror-target", Upstream),
    no("modsecurity-snippet", AccessControl),
    no("modsecurity-transaction-id", AccessControl),
    no("opentelemetry-operation-name", Observability),
    no("opentelemetry-trust-incoming-span", Observability),
    yes("permanent-redirect", Routing),
    yes("permanent-redirect-code", Routing),
    yes("preserve-trailing-slash", Routing),
    yes("proxy-body-size", Upstream),
    noop("proxy-buffer-size", Upstream),
    noop("proxy-buffering", Upstream),
    no("proxy-buffers-number", Upstream),
    no("proxy-busy-buffers-size", Upstream),
    yes("proxy-connect-timeout", Upstream),
    yes("proxy-cookie-domain", Response),
    yes("proxy-cookie-path", Response),
    no("proxy-http-version", Upstream),
    no("proxy-max-temp-file-size", Upstream),
    yes("proxy-next-upstream", Upstream),
    yes("proxy-next-upstream-timeout", Upstream),
    yes("proxy-next-upstream-tries", Upstream),
    yes("proxy-read-timeout", Upstream),
    yes("proxy-redirect-from", Response),
    yes("proxy-redirect-to", Response),
    noop("proxy-request-buffering", Upstream),
    yes("proxy-send-timeout", Upstream),
    no("proxy-ssl-ciphers", Tls),
    yes("proxy-ssl-name", Tls),
    yes("proxy-ssl-protocols", Tls),
    yes("proxy-ssl-secret", Tls),
    yes("proxy-ssl-server-name", Tls),
    yes("proxy-ssl-verify", Tls),
    yes("proxy-ssl-verify-depth", Tls),
    no("relative-redirects", Routing),
    yes("rewrite-target", Routing),
    yes("satisfy", AccessControl),
    yes("server-alias", Routing),
    yes("server-snippet", Snippet),
    yes("service-upstream", Upstream),
    yes("session-cookie-change-on-failure", Upstream),
    yes("session-cookie-conditional-samesite-none", Upstream),
    yes("session-cookie-domain", Upstream),
    yes("session-cookie-expires", Upstream),
    yes("session-cookie-max-age", Upstream),
    yes("session-cookie-name", Upstream),
    yes("session-cookie-path", Upstream),
    yes("session-cookie-samesite", Upstream),
    yes("session-cookie-secure", Upstream),
    no("ssl-ciphers", Tls),
    yes("ssl-passthrough", Tls),
    no("ssl-prefer-server-ciphers", Tls),
    yes("ssl-redirect", Routing),
    no("stream-snippet", Snippet),
    yes("temporal-redirect", Routing),
    yes("temporal-redirect-code", Routing),
    yes("upstream-hash-by", Upstream),
    yes("upstream-hash-by-subset", Upstream),
    yes("upstream-hash-by-subset-size", Upstream),
    yes("upstream-vhost", Upstream),
    no("use-port-in-redirects", Routing),
    yes("use-regex", Routing),
    yes("whitelist-source-range", AccessControl),
    yes("x-forwarded-prefix", Routing),
];

/// This project's own annotations, honoured only under `ingress.rs/` (ingress-nginx has no
/// counterpart). Sorted by name.
pub const PROJECT_ANNOTATIONS: &[Annotation] = &[
    // The protocols `Upgrade` may switch to; `websocket` alone by default.
    yes("upgrades", Upstream),
];

/// Families whose members decide who gets in: a name from one of them that the table does not
/// know (a newer ingress-nginx, or a version this table predates) is still access control.
const ACCESS_CONTROL_PREFIXES: &[&str] = &[
    "auth-",
    "limit-",
    "global-rate-limit",
    "modsecurity",
    "enable-modsecurity",
    "enable-owasp",
];
const ACCESS_CONTROL_SUFFIXES: &[&str] = &["-source-range"];

/// The table's entry for `name` (the part after the prefix).
pub fn lookup(name: &str) -> Option<&'static Annotation> {
    ANNOTATIONS
        .binary_search_by(|a| a.name.cmp(name))
        .ok()
        .and_then(|i| ANNOTATIONS.get(i))
}

/// The entry for `name` under this project's own prefix: its own annotations, then the
/// ingress-nginx ones it shares.
pub fn lookup_own(name: &str) -> Option<&'static Annotation> {
    PROJECT_ANNOTATIONS
        .iter()
        .find(|a| a.name == name)
        .or_else(|| lookup(name))
}

/// The category of a name the table does not know.
pub fn category_of_unknown(name: &str) -> Category {
    let access = ACCESS_CONTROL_PREFIXES.iter().any(|p| name.starts_with(p))
        || ACCESS_CONTROL_SUFFIXES.iter().any(|s| name.ends_with(s));
    if access {
        Category::AccessControl
    } else {
        Category::Unknown
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sorted_and_unique_so_lookup_finds_every_entry() {
        for pair in ANNOTATIONS.windows(2) {
            assert!(
                pair[0].name < pair[1].name,
                "{} ≥ {}",
                pair[0].name,
                pair[1].name
            );
        }
        for a in ANNOTATIONS {
            assert_eq!(lookup(a.name), Some(a));
        }
        assert_eq!(lookup("no-such-annotation"), None);
        for a in PROJECT_ANNOTATIONS {
            assert_eq!(lookup_own(a.name), Some(a));
            assert_eq!(lookup(a.name), None, "{} is ours alone", a.name);
        }
    }

    #[test]
    fn the_access_control_annotations_are_classified_as_such() {
        let access = [
            "whitelist-source-range",
            "allowlist-source-range",
            "denylist-source-range",
            "auth-type",
            "auth-secret",
            "auth-secret-type",
            "auth-realm",
            "auth-url",
            "auth-signin",
            "auth-response-headers",
            "auth-tls-secret",
            "auth-tls-verify-client",
            "auth-tls-match-cn",
            "limit-rps",
            "limit-rpm",
            "limit-connections",
            "satisfy",
            "enable-modsecurity",
            "enable-owasp-core-rules",
            "modsecurity-snippet",
            "global-rate-limit",
            "global-rate-limit-window",
        ];
        for name in access {
            let entry = lookup(name).unwrap_or_else(|| panic!("{name} is in the table"));
            assert_eq!(entry.category, Category::AccessControl, "{name}");
            let supported = name.ends_with("-source-range")
                || name.starts_with("auth-tls-")
                || matches!(
                    name,
                    "auth-type"
                        | "auth-secret"
                        | "auth-secret-type"
                        | "auth-realm"
                        | "auth-url"
                        | "auth-signin"
                        | "auth-response-headers"
                        | "satisfy"
                        | "limit-rps"
                        | "limit-rpm"
                        | "limit-connections"
                        | "limit-rate"
                        | "limit-rate-after"
                );
            assert_eq!(entry.status == Status::Supported, supported, "{name}");
        }
        // Every auth-*, limit-* and ModSecurity entry of the table is access control.
        for a in ANNOTATIONS {
            if category_of_unknown(a.name) == Category::AccessControl {
                assert_eq!(a.category, Category::AccessControl, "{}", a.name);
            }
        }
    }

    #[test]
    fn unknown_names_fail_closed_by_family() {
        let cases = [
            ("auth-something-new", Category::AccessControl),
            ("limit-new-thing", Category::AccessControl),
            ("global-rate-limit-status-code", Category::AccessControl),
            ("modsecurity-new", Category::AccessControl),
            ("office-source-range", Category::AccessControl),
            ("some-future-knob", Category::Unknown),
            ("ssl-something", Category::Unknown),
        ];
        for (name, want) in cases {
            assert_eq!(category_of_unknown(name), want, "{name}");
        }
    }

    #[test]
    fn the_supported_ones_are_the_ones_the_parser_reads() {
        let supported: Vec<&str> = ANNOTATIONS
            .iter()
            .filter(|a| a.status == Status::Supported)
            .map(|a| a.name)
            .collect();
        assert_eq!(
            supported,
            [
                "affinity",
                "affinity-canary-behavior",
                "affinity-mode",
                "allowlist-source-range",
                "app-root",
                "auth-always-set-cookie",
                "auth-cache-duration",
                "auth-cache-key",
                "auth-keepalive",
                "auth-keepalive-requests",
                "auth-keepalive-timeout",
                "auth-method",
                "auth-proxy-set-headers",
                "auth-realm",
                "auth-request-redirect",
                "auth-response-headers",
                "auth-secret",
                "auth-secret-type",
                "auth-signin",
                "auth-signin-redirect-param",
                "auth-tls-error-page",
                "auth-tls-match-cn",
                "auth-tls-pass-certificate-to-upstream",
                "auth-tls-secret",
                "auth-tls-verify-client",
                "auth-tls-verify-depth",
                "auth-type",
                "auth-url",
                "backend-protocol",
                "canary",
                "canary-by-cookie",
                "canary-by-header",
                "canary-by-header-pattern",
                "canary-by-header-value",
                "canary-weight",
                "canary-weight-total",
                "configuration-snippet",
                "cors-allow-credentials",
                "cors-allow-headers",
                "cors-allow-methods",
                "cors-allow-origin",
                "cors-expose-headers",
                "cors-max-age",
                "custom-headers",
                "custom-http-errors",
                "default-backend",
                "denylist-source-range",
                "disable-proxy-intercept-errors",
                "enable-cors",
                "enable-global-auth",
                "force-ssl-redirect",
                "from-to-www-redirect",
                "limit-allowlist",
                "limit-burst-multiplier",
                "limit-connections",
                "limit-rate",
                "limit-rate-after",
                "limit-rpm",
                "limit-rps",
                "limit-whitelist",
                "load-balance",
                "permanent-redirect",
                "permanent-redirect-code",
                "preserve-trailing-slash",
                "proxy-body-size",
                "proxy-connect-timeout",
                "proxy-cookie-domain",
                "proxy-cookie-path",
                "proxy-next-upstream",
                "proxy-next-upstream-timeout",
                "proxy-next-upstream-tries",
                "proxy-read-timeout",
                "proxy-redirect-from",
                "proxy-redirect-to",
                "proxy-send-timeout",
                "proxy-ssl-name",
                "proxy-ssl-protocols",
                "proxy-ssl-secret",
                "proxy-ssl-server-name",
                "proxy-ssl-verify",
                "proxy-ssl-verify-depth",
                "rewrite-target",
                "satisfy",
                "server-alias",
                "server-snippet",
                "service-upstream",
                "session-cookie-change-on-failure",
                "session-cookie-conditional-samesite-none",
                "session-cookie-domain",
                "session-cookie-expires",
                "session-cookie-max-age",
                "session-cookie-name",
                "session-cookie-path",
                "session-cookie-samesite",
                "session-cookie-secure",
                "ssl-passthrough",
                "ssl-redirect",
                "temporal-redirect",
                "temporal-redirect-code",
                "upstream-hash-by",
                "upstream-hash-by-subset",
                "upstream-hash-by-subset-size",
                "upstream-vhost",
                "use-regex",
                "whitelist-source-range",
                "x-forwarded-prefix",
            ]
        );
        let documented = ANNOTATIONS.len();
        assert!(documented >= 140, "{documented} entries");
    }
}
