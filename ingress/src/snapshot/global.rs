//! The global settings: ingress-nginx's ConfigMap (`--configmap NAMESPACE/NAME`) over the
//! flags, resolved once per snapshot so that a ConfigMap change applies live.
//!
//! ```text
//!   flags ──────────> GlobalSettings (the defaults)
//!                            │ resolve(ConfigMap data)      pure: each key applied, or a
//!                            v                              diagnostic on the ConfigMap saying
//!   Snapshot::global ──> builder (body size, ssl-redirect,  why not (unsupported, startup
//!                        source ranges, snippets, global    only, invalid: the default stays)
//!                        auth)
//!                   ──> proxy (HSTS, timeouts, forwarded
//!                        headers, underscores, Server)
//!   annotations override the result route by route, as in ingress-nginx
//! ```

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderName, HeaderValue};
use ipnet::IpNet;

use super::annotations::auth::GlobalAuth;
use super::sources::{self, SourcePolicy};
use crate::diagnostics::{Diagnostic, DiagnosticKind, Subject};
use crate::object::{Kind, ObjectKey};

/// Everything the ConfigMap can change, with the flags' values as defaults.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GlobalSettings {
    /// `proxy-body-size` (`None`: no limit).
    pub max_body: Option<u64>,
    /// `ssl-redirect`: routes of hosts with TLS redirect plain HTTP unless their Ingress says.
    pub ssl_redirect: bool,
    pub hsts: Hsts,
    /// `hsts` as the header value, made once per snapshot by [`GlobalSettings::finish`].
    pub hsts_header: Option<HeaderValue>,
    /// `proxy-connect-timeout`, `proxy-read-timeout`, `proxy-send-timeout`.
    pub timeouts: Timeouts,
    /// `enable-underscores-in-headers`.
    pub underscores: bool,
    /// `use-forwarded-headers`, `forwarded-for-header`, `compute-full-forwarded-for`,
    /// `proxy-real-ip-cidr`.
    pub forwarded: Arc<ForwardedPolicy>,
    /// `allow-snippet-annotations`.
    pub allow_snippets: bool,
    /// `whitelist-source-range`, `denylist-source-range`.
    pub sources: SourcePolicy,
    /// A global source range that did not parse: routes that would use it are refused (503)
    /// rather than served without it.
    pub sources_invalid: Option<InvalidRanges>,
    /// `server-tokens`: the `Server` header names the version too.
    pub server_tokens: bool,
    /// `upstream-keepalive-connections`, `upstream-keepalive-timeout`.
    pub keepalive: UpstreamKeepalive,
    /// `use-proxy-protocol`: every new connection to the HTTP and HTTPS listeners starts with
    /// a PROXY protocol header (the flag, unless the ConfigMap says otherwise). The listeners
    /// read it at each accept and the kernel gate from the snapshot's `SniPolicy`.
    pub proxy_protocol: bool,
    /// A global access control the ConfigMap asks for and this controller cannot apply
    /// (`global-auth-url`, `block-cidrs`, ...), with `--unsupported-access-annotations=refuse`:
    /// every route is refused (503) rather than served without it.
    pub access_refused: Option<Arc<str>>,
    /// `custom-http-errors`: the codes replaced by the global default backend's page on every
    /// route whose Ingress has no list of its own (sorted; empty: none).
    pub custom_http_errors: Arc<[u16]>,
    /// `disable-proxy-intercept-errors`: with the global list, the upstreams' own error
    /// responses pass through; only the proxy's own are replaced.
    pub disable_intercept: bool,
    /// `--default-backend-service` (NAMESPACE/NAME): the global default backend, which
    /// answers the `custom-http-errors` codes.
    pub default_backend_service: Option<ObjectKey>,
    /// The global default backend as the snapshot resolved it: `--default-backend-service` on
    /// its first port, else the backend of the Ingress with only a `spec.defaultBackend`.
    /// Set by `Snapshot::build`, never by the ConfigMap.
    pub error_backend: Option<super::policy::Fallback>,
    /// `limit-req-status-code`: the answer to a request over `limit-rps`/`limit-rpm`.
    pub limit_req_status: u16,
    /// `limit-conn-status-code`: the answer to a request over `limit-connections`.
    pub limit_conn_status: u16,
    /// `global-auth-*` and `no-auth-locations`: the external auth of every route whose
    /// Ingress has no `auth-url` and does not set `enable-global-auth: "false"`.
    pub auth: GlobalAuth,
    /// `add-headers`, `proxy-set-headers`, `global-allowed-response-headers`.
    pub headers: HeaderMaps,
    /// `add-headers` with literal values, for the proxy's own answers (404, 503, redirects):
    /// set by `Snapshot::build`, which reads that ConfigMap, never by `resolve`.
    pub own_response_headers: Option<Arc<super::annotations::snippet::ResponseEdits>>,
    /// `add-headers` with nginx variables, for the same answers: expanded per request.
    pub own_response_templates: Option<super::policy::HeaderTemplates>,
}

/// The ConfigMap keys about headers listed in other ConfigMaps, which `Snapshot::build`
/// reads (`snapshot::annotations::configmap_headers`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HeaderMaps {
    /// `add-headers`: the ConfigMap of headers set on every response (as written).
    pub add_headers: Option<String>,
    /// `proxy-set-headers`: the ConfigMap of headers set on every upstream request.
    pub proxy_set_headers: Option<String>,
    /// `global-allowed-response-headers`: the names a `custom-headers` ConfigMap may set.
    pub allowed_response_headers: Arc<[String]>,
}

impl Default for GlobalSettings {
    /// The flags' defaults.
    fn default() -> Self {
        Self {
            max_body: Some(1 << 20),
            ssl_redirect: true,
            hsts: Hsts {
                enabled: true,
                max_age: 31_536_000,
                include_subdomains: false,
                preload: false,
            },
            hsts_header: None,
            timeouts: Timeouts {
                connect: Duration::from_secs(5),
                read: Duration::from_secs(60),
                send: Duration::from_secs(60),
            },
            underscores: false,
            forwarded: Arc::default(),
            allow_snippets: false,
            sources: SourcePolicy::default(),
            sources_invalid: None,
            server_tokens: false,
            keepalive: UpstreamKeepalive::default(),
            proxy_protocol: false,
            access_refused: None,
            custom_http_errors: Arc::from([]),
            disable_intercept: false,
            default_backend_service: None,
            error_backend: None,
            limit_req_status: 503,
            limit_conn_status: 503,
            headers: HeaderMaps::default(),
            own_response_headers: None,
            own_response_templates: None,
            auth: GlobalAuth::default(),
        }
    }
}

impl GlobalSettings {
    /// Makes the values derived from the others.
    pub fn finish(mut self) -> Self {
        self.hsts_header = self.hsts.value();
        self
    }
}

/// Which global list did not parse, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InvalidRanges {
    pub allow: bool,
    pub deny: bool,
    pub message: Arc<str>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hsts {
    pub enabled: bool,
    pub max_age: u64,
    pub include_subdomains: bool,
    pub preload: bool,
}

impl Hsts {
    /// The `Strict-Transport-Security` value, when it is on.
    pub fn value(&self) -> Option<HeaderValue> {
        if !self.enabled {
            return None;
        }
        let mut value = format!("max-age={}", self.max_age);
        if self.include_subdomains {
            value.push_str("; includeSubDomains");
        }
        if self.preload {
            value.push_str("; preload");
        }
        HeaderValue::from_str(&value).ok()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timeouts {
    pub connect: Duration,
    pub read: Duration,
    pub send: Duration,
}

/// Idle upstream connections kept for reuse.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UpstreamKeepalive {
    /// `upstream-keepalive-timeout`: an idle connection older than this is closed rather than
    /// reused. 55 s here (ingress-nginx: 60 s): below the 60 s most servers use, so an
    /// upstream rarely closes a connection just as it is reused.
    pub idle_timeout: Duration,
    /// `upstream-keepalive-connections`: idle connections kept per endpoint (ingress-nginx:
    /// 320 per upstream and nginx worker); `0` keeps none.
    pub max_idle: usize,
}

impl Default for UpstreamKeepalive {
    fn default() -> Self {
        Self {
            idle_timeout: Duration::from_secs(55),
            max_idle: 256,
        }
    }
}

/// Which forwarded headers are believed, and what the upstream is told.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ForwardedPolicy {
    /// `use-forwarded-headers`: take the client address from `header` and the scheme, host
    /// and port from `X-Forwarded-Proto`, `-Host`, `-Port`, when the peer is trusted.
    pub enabled: bool,
    /// `forwarded-for-header`, lower-case.
    pub header: HeaderName,
    /// `compute-full-forwarded-for`: the upstream's `X-Forwarded-For` is the incoming list
    /// with the peer appended, rather than the client address alone.
    pub compute_full: bool,
    /// `proxy-real-ip-cidr`: the hops that are believed. `None` (the default here): the
    /// connecting peer only, so exactly one hop (the rightmost address, the one it appended)
    /// is believed. ingress-nginx's default `0.0.0.0/0` would believe every hop, which lets
    /// any client behind the balancer name any address.
    pub trusted: Option<Arc<[IpNet]>>,
}

impl Default for ForwardedPolicy {
    fn default() -> Self {
        Self {
            enabled: false,
            header: HeaderName::from_static("x-forwarded-for"),
            compute_full: false,
            trusted: None,
        }
    }
}

/// The longest chain of addresses walked; hops further left are not believed (nginx walks any
/// number, but a real chain is a handful of hops and the head is bounded anyway).
pub const MAX_HOPS: usize = 64;

impl ForwardedPolicy {
    /// Whether anything per request is needed beyond the connection's own values.
    pub fn is_active(&self) -> bool {
        self.enabled || self.compute_full
    }

    /// Whether the hop at `addr` is trusted to say who connected to it. With no list, only
    /// the peer (`is_peer`) is.
    pub fn trusts(&self, addr: IpAddr, is_peer: bool) -> bool {
        let addr = addr.to_canonical();
        match &self.trusted {
            Some(nets) => nets.iter().any(|net| net.contains(&addr)),
            None => is_peer,
        }
    }

    /// The client address behind `peer`, from the values of the forwarded-for header in the
    /// order they came: nginx's `real_ip_recursive on`, walked from the right. The peer must
    /// be trusted; then each address from the right is taken, and the walk goes on past it
    /// only while it is trusted too. An entry that is not an address (`unknown`, garbage)
    /// stops the walk at the hop before it, as nginx does; so does the [`MAX_HOPS`]th.
    pub fn client<'v>(
        &self,
        peer: IpAddr,
        values: impl DoubleEndedIterator<Item = &'v [u8]>,
    ) -> IpAddr {
        if !self.enabled || !self.trusts(peer, true) {
            return peer;
        }
        let mut client = peer;
        let mut hops = 0;
        for value in values.rev() {
            for entry in value.rsplit(|&b| b == b',') {
                let entry = entry.trim_ascii();
                if entry.is_empty() {
                    continue;
                }
                hops += 1;
                let Some(addr) = parse_hop(entry).filter(|_| hops <= MAX_HOPS) else {
                    return client;
                };
                client = addr;
                if !self.trusts(addr, false) {
                    return client;
                }
            }
        }
        client
    }
}

/// One entry of a forwarded-for list: an address, optionally with a port (`192.0.2.1:443`,
/// `[2001:db8::1]:443`, `[2001:db8::1]`), as nginx's `ngx_parse_addr_port` reads it.
pub fn parse_hop(entry: &[u8]) -> Option<IpAddr> {
    let text = std::str::from_utf8(entry).ok()?;
    if let Ok(addr) = text.parse::<IpAddr>() {
        return Some(addr);
    }
    if let Some(rest) = text.strip_prefix('[') {
        let (addr, tail) = rest.split_once(']')?;
        let port_ok = tail.is_empty()
            || tail
                .strip_prefix(':')
                .is_some_and(|p| p.parse::<u16>().is_ok());
        return port_ok.then(|| addr.parse::<std::net::Ipv6Addr>().ok().map(IpAddr::V6))?;
    }
    let (addr, port) = text.rsplit_once(':')?;
    port.parse::<u16>().ok()?;
    addr.parse::<std::net::Ipv4Addr>().ok().map(IpAddr::V4)
}

/// What happens to a ConfigMap key here.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyStatus {
    /// Applied, live.
    Applied,
    /// Read at startup from a flag only; the ConfigMap's value is compared and a difference
    /// reported.
    StartupOnly(&'static str),
    /// Accepted and ignored: what it tunes does not exist here (why).
    Noop(&'static str),
    /// Not supported (why).
    Unsupported(&'static str),
}

/// ingress-nginx's ConfigMap keys this controller knows of, with what happens to each. Keys
/// not listed are reported as unknown.
pub fn key_status(key: &str) -> Option<KeyStatus> {
    use KeyStatus::*;
    const NGINX_TUNING: &str = "tunes nginx itself; there is no nginx here";
    const TLS: &str = "TLS versions and cipher suites are rustls's safe defaults (TLS 1.2 and 1.3, AEAD suites with forward secrecy only) and are not configurable";
    const LOGGING: &str = "the access log's fields are fixed: this project's, as text or JSON, or with --access-log-format upstream ingress-nginx's default log-format-upstream line (see docs/metrics.md)";
    const POOL: &str = "an idle upstream connection is reused however many requests it served and however old it is, until upstream-keepalive-timeout of idleness";
    Some(match key {
        "limit-req-status-code"
        | "limit-conn-status-code"
        | "proxy-body-size"
        | "ssl-redirect"
        | "hsts"
        | "hsts-max-age"
        | "hsts-include-subdomains"
        | "hsts-preload"
        | "proxy-connect-timeout"
        | "proxy-read-timeout"
        | "proxy-send-timeout"
        | "enable-underscores-in-headers"
        | "upstream-keepalive-connections"
        | "upstream-keepalive-timeout"
        | "use-forwarded-headers"
        | "forwarded-for-header"
        | "compute-full-forwarded-for"
        | "proxy-real-ip-cidr"
        | "server-tokens"
        | "custom-http-errors"
        | "disable-proxy-intercept-errors"
        | "allow-snippet-annotations"
        | "whitelist-source-range"
        | "denylist-source-range"
        | "add-headers"
        | "proxy-set-headers"
        | "global-allowed-response-headers"
        | "global-auth-url"
        | "global-auth-method"
        | "global-auth-signin"
        | "global-auth-signin-redirect-param"
        | "global-auth-response-headers"
        | "global-auth-request-redirect"
        | "global-auth-cache-key"
        | "global-auth-cache-duration"
        | "global-auth-always-set-cookie"
        | "no-auth-locations"
        | "use-proxy-protocol" => Applied,
        "proxy-protocol-header-timeout" => StartupOnly("use --proxy-protocol-header-timeout"),
        "keep-alive" => StartupOnly("use --client-keepalive-timeout"),
        "client-header-timeout" => StartupOnly("use --header-read-timeout"),
        "client-body-timeout" => StartupOnly("use --client-body-timeout"),
        "max-worker-connections" => StartupOnly("use --max-connections"),
        "worker-shutdown-timeout" => StartupOnly("use --drain-timeout"),
        "enable-serial-reloads" | "use-http2" => {
            Noop("nothing is reloaded and HTTP/2 is always offered; nothing to tune")
        }
        "generate-request-id" => Noop("X-Request-ID is always sent, as ingress-nginx's default"),
        "proxy-add-original-uri-header" => Unsupported(
            "X-Original-URI is always sent (ingress-nginx's default is not to); it cannot be turned off",
        ),
        "enable-real-ip" | "forwarded-for-proxy-protocol-header" => {
            Unsupported("use use-forwarded-headers, forwarded-for-header and proxy-real-ip-cidr")
        }
        "force-ssl-redirect"
        | "proxy-next-upstream"
        | "proxy-next-upstream-timeout"
        | "proxy-next-upstream-tries"
        | "proxy-redirect-from"
        | "proxy-cookie-path"
        | "proxy-cookie-domain"
        | "proxy-buffering"
        | "proxy-request-buffering"
        | "upstream-hash-by"
        | "load-balance"
        | "limit-rate"
        | "limit-rate-after" => Unsupported(
            "not as a global default yet; the annotation of the same name applies per Ingress",
        ),
        "log-format-upstream"
        | "log-format-escape-json"
        | "log-format-escape-none"
        | "log-format-stream"
        | "access-log-params"
        | "access-log-path"
        | "http-access-log-path"
        | "stream-access-log-path"
        | "error-log-path"
        | "skip-access-log-urls"
        | "enable-access-log-for-default-backend"
        | "disable-access-log" => Unsupported(LOGGING),
        "ssl-protocols" | "ssl-ciphers" | "ssl-ecdh-curve" | "ssl-dh-param" => Unsupported(TLS),
        "upstream-keepalive-requests" | "upstream-keepalive-time" => Unsupported(POOL),
        "worker-processes"
        | "worker-cpu-affinity"
        | "worker-rlimit-nofile"
        | "max-worker-open-files"
        | "enable-multi-accept"
        | "map-hash-bucket-size"
        | "server-name-hash-max-size"
        | "server-name-hash-bucket-size"
        | "proxy-headers-hash-max-size"
        | "proxy-headers-hash-bucket-size"
        | "variables-hash-bucket-size"
        | "variables-hash-max-size"
        | "reuse-port"
        | "enable-aio-write"
        | "error-log-level"
        | "proxy-buffers-number"
        | "proxy-buffer-size"
        | "proxy-busy-buffers-size"
        | "ssl-buffer-size"
        | "lua-shared-dicts"
        | "client-header-buffer-size"
        | "client-body-buffer-size"
        | "debug-connections"
        | "grpc-buffer-size-kb"
        | "worker-processes-auto"
        | "bind-address"
        | "nginx-status-ipv4-whitelist"
        | "nginx-status-ipv6-whitelist" => Noop(NGINX_TUNING),
        "main-snippet"
        | "http-snippet"
        | "server-snippet"
        | "stream-snippet"
        | "location-snippet"
        | "modsecurity-snippet"
        | "global-auth-snippet" => Unsupported(
            "snippets are nginx configuration; nothing is ever executed here (a snippet annotation's header actions can be read with allow-snippet-annotations)",
        ),
        _ if key.starts_with("global-auth-")
            || key.starts_with("limit-")
            || key.starts_with("block-")
            || key == "no-auth-locations" =>
        {
            Unsupported("global access controls other than source ranges are not implemented")
        }
        _ if key.starts_with("opentelemetry")
            || key.starts_with("otel")
            || key.starts_with("otlp")
            || key.starts_with("jaeger")
            || key.starts_with("zipkin")
            || key.starts_with("datadog")
            || key.starts_with("enable-opentelemetry")
            || key.starts_with("enable-opentracing")
            || key.starts_with("opentracing") =>
        {
            Unsupported(
                "tracing is set up at startup by flags: --otlp-endpoint (OTLP over HTTP), --otel-service-name, --otel-sampler-ratio, --otel-sampler-parent-based",
            )
        }
        _ => {
            return KNOWN_OTHER
                .contains(&key)
                .then_some(Unsupported("not implemented"));
        }
    })
}

/// ingress-nginx keys not implemented here, for which "not implemented" is the whole answer.
const KNOWN_OTHER: &[&str] = &[
    "allow-backend-server-header",
    "allow-cross-namespace-resources",
    "annotations-risk-level",
    "annotation-value-word-blocklist",
    "hide-headers",
    "enable-modsecurity",
    "enable-owasp-modsecurity-crs",
    "disable-ipv6",
    "disable-ipv6-dns",
    "enable-ocsp",
    "ignore-invalid-headers",
    "retry-non-idempotent",
    "http2-max-field-size",
    "http2-max-header-size",
    "http2-max-requests",
    "http2-max-concurrent-streams",
    "keep-alive-requests",
    "large-client-header-buffers",
    "ssl-session-cache",
    "ssl-session-cache-size",
    "ssl-session-tickets",
    "ssl-session-ticket-key",
    "ssl-session-timeout",
    "use-gzip",
    "use-geoip",
    "use-geoip2",
    "enable-brotli",
    "brotli-level",
    "brotli-min-length",
    "brotli-types",
    "use-http2",
    "gzip-disable",
    "gzip-level",
    "gzip-min-length",
    "gzip-types",
    "use-geoip-db",
    "enable-real-ip",
    "proxy-cookie-path",
    "proxy-cookie-domain",
    "proxy-next-upstream",
    "proxy-next-upstream-timeout",
    "proxy-next-upstream-tries",
    "proxy-redirect-from",
    "proxy-request-buffering",
    "force-ssl-redirect",
    "http-redirect-code",
    "proxy-buffering",
    "enable-syslog",
    "syslog-host",
    "syslog-port",
    "no-tls-redirect-locations",
    "proxy-ssl-location-only",
    "default-type",
    "service-upstream",
    "ssl-reject-handshake",
    "strict-validate-path-type",
    "relative-redirects",
    "upstream-hash-by",
    "upstream-hash-by-subset",
    "upstream-hash-by-subset-size",
    "load-balance",
    "proxy-stream-timeout",
    "proxy-stream-next-upstream",
    "proxy-stream-next-upstream-timeout",
    "proxy-stream-next-upstream-tries",
    "proxy-stream-responses",
    "bind-address-ipv4",
    "bind-address-ipv6",
    "use-forwarded-headers-for-proxy-protocol",
    "server-name-hash",
    "enable-vts-status",
    "vts-status-zone-size",
    "vts-default-filter-key",
    "enable-influxdb",
    "enable-endpoint-slices",
    "nginx-status-whitelist",
    "plugins",
    "ssl-early-data",
    "proxy-http-version",
    "gzip-min-length",
    "default-ssl-certificate",
    "enable-underscores-in-header",
    "enable-ssl-chain-completion",
    "limit-conn-zone-variable",
    "geoip2-autoreload-in-minutes",
];

/// The global access controls of ingress-nginx's ConfigMap that are not applied here: like an
/// access-control annotation, one that is set refuses what it would protect (here: every
/// route) unless `--unsupported-access-annotations=ignore`.
const ACCESS_KEYS: &[&str] = &["block-cidrs", "block-user-agents", "block-referers"];

/// The settings a ConfigMap (its `data`) makes of `defaults`, with a diagnostic on the
/// ConfigMap for every key not applied as written. `None`: `--configmap` names one that does
/// not exist (a warning; the defaults apply). `refuse_access`: an unsupported global access
/// control refuses every route (`--unsupported-access-annotations=refuse`).
pub fn resolve(
    defaults: &GlobalSettings,
    key: &ObjectKey,
    data: Option<&BTreeMap<String, String>>,
    refuse_access: bool,
    diagnostics: &mut Vec<Diagnostic>,
) -> GlobalSettings {
    let subject = || Subject::object(Kind::ConfigMap, key);
    let Some(data) = data else {
        diagnostics.push(Diagnostic::warning(
            DiagnosticKind::ConfigMapNotFound,
            subject(),
            "the ConfigMap --configmap names does not exist (or has no data); the flags' values apply",
        ));
        return defaults.clone();
    };
    let mut out = defaults.clone();
    let mut forwarded = (*defaults.forwarded).clone();
    let mut problems = Vec::new();
    let mut invalid = |key: &str, value: &str, why: &str| {
        problems.push(Diagnostic::warning(
            DiagnosticKind::InvalidConfigValue,
            subject(),
            format!("{key}: {value:?} {why}; the default stays"),
        ));
    };
    let mut ranges_invalid: Option<InvalidRanges> = None;
    let mut unapplied = Vec::new();
    // custom-http-errors items left out (the others apply), reported after the loop.
    let mut left_out = Vec::new();
    for (name, value) in data {
        let status = key_status(name);
        if status != Some(KeyStatus::Applied) {
            unapplied.push((name, value, status));
            continue;
        }
        let flag = |v: &str| parse_bool(v);
        let v = value.as_str();
        match name.as_str() {
            "proxy-body-size" => match super::annotations::size(v) {
                Some(0) => out.max_body = None,
                Some(n) => out.max_body = Some(n),
                None => invalid(name, v, "is not a size (digits and an optional k, m or g)"),
            },
            "ssl-redirect" => set_bool(&mut out.ssl_redirect, flag(v), name, v, &mut invalid),
            "hsts" => set_bool(&mut out.hsts.enabled, flag(v), name, v, &mut invalid),
            "hsts-include-subdomains" => set_bool(
                &mut out.hsts.include_subdomains,
                flag(v),
                name,
                v,
                &mut invalid,
            ),
            "hsts-preload" => set_bool(&mut out.hsts.preload, flag(v), name, v, &mut invalid),
            "hsts-max-age" => match v.trim().parse::<u64>() {
                Ok(n) => out.hsts.max_age = n,
                Err(_) => invalid(name, v, "is not a whole number of seconds"),
            },
            "proxy-connect-timeout" | "proxy-read-timeout" | "proxy-send-timeout" => {
                match seconds(v) {
                    Some(d) => match name.as_str() {
                        "proxy-connect-timeout" => out.timeouts.connect = d,
                        "proxy-read-timeout" => out.timeouts.read = d,
                        _ => out.timeouts.send = d,
                    },
                    None => invalid(name, v, "is not a whole number of seconds in 1..=86400"),
                }
            }
            "enable-underscores-in-headers" => {
                set_bool(&mut out.underscores, flag(v), name, v, &mut invalid);
            }
            "server-tokens" => set_bool(&mut out.server_tokens, flag(v), name, v, &mut invalid),
            "use-proxy-protocol" => {
                set_bool(&mut out.proxy_protocol, flag(v), name, v, &mut invalid);
            }
            "limit-req-status-code" | "limit-conn-status-code" => {
                // As nginx's limit_req_status/limit_conn_status: a status from 400 to 599.
                match v.trim().parse::<u16>() {
                    Ok(code @ 400..=599) if name == "limit-req-status-code" => {
                        out.limit_req_status = code;
                    }
                    Ok(code @ 400..=599) => out.limit_conn_status = code,
                    _ => invalid(name, v, "is not a status code from 400 to 599"),
                }
            }
            "disable-proxy-intercept-errors" => {
                set_bool(&mut out.disable_intercept, flag(v), name, v, &mut invalid);
            }
            "custom-http-errors" => {
                let (codes, problems) = super::annotations::errors::parse_global(v);
                left_out.extend(problems.into_iter().map(|why| format!("{name}: {why}")));
                out.custom_http_errors = codes;
            }
            "upstream-keepalive-timeout" => match seconds(v) {
                Some(d) => out.keepalive.idle_timeout = d,
                None => invalid(name, v, "is not a whole number of seconds in 1..=86400"),
            },
            "upstream-keepalive-connections" => match v.trim().parse::<usize>() {
                Ok(n) if n <= 100_000 => out.keepalive.max_idle = n,
                _ => invalid(name, v, "is not a number of connections in 0..=100000"),
            },
            "allow-snippet-annotations" => {
                set_bool(&mut out.allow_snippets, flag(v), name, v, &mut invalid);
            }
            "use-forwarded-headers" => {
                set_bool(&mut forwarded.enabled, flag(v), name, v, &mut invalid);
            }
            "compute-full-forwarded-for" => {
                set_bool(&mut forwarded.compute_full, flag(v), name, v, &mut invalid);
            }
            "forwarded-for-header" => match forwarded_for_header(v) {
                Ok(header) => forwarded.header = header,
                Err(why) => invalid(name, v, &why),
            },
            "proxy-real-ip-cidr" => match sources::parse_ranges(v) {
                Ok(nets) => forwarded.trusted = nets,
                Err(why) => invalid(name, v, &format!("does not parse: {why}")),
            },
            "add-headers" | "proxy-set-headers" => {
                let reference = Some(v.trim().to_string()).filter(|v| !v.is_empty());
                if name == "add-headers" {
                    out.headers.add_headers = reference;
                } else {
                    out.headers.proxy_set_headers = reference;
                }
            }
            "global-allowed-response-headers" => {
                // As ingress-nginx: each name that is not one is left out with a warning.
                let mut allowed = Vec::new();
                for header in v.split(',').map(str::trim).filter(|h| !h.is_empty()) {
                    if header
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
                    {
                        allowed.push(header.to_string());
                    } else {
                        left_out.push(format!("{name}: {header:?} is not a header name"));
                    }
                }
                out.headers.allowed_response_headers = Arc::from(allowed);
            }
            "whitelist-source-range" | "denylist-source-range" => {
                let allow = name == "whitelist-source-range";
                match sources::parse_ranges(v) {
                    Ok(nets) if allow => out.sources.allow = nets,
                    Ok(nets) => out.sources.deny = nets.unwrap_or_else(|| Arc::from([])),
                    Err(why) => {
                        // An access control is applied as written or not at all: the routes
                        // that would use this list are refused, never opened.
                        diagnostics.push(Diagnostic::error(
                            DiagnosticKind::InvalidConfigValue,
                            subject(),
                            format!("{name}: {why}; every route whose Ingress sets no list of its own is refused (503) until it is fixed"),
                        ));
                        let entry = ranges_invalid.get_or_insert_with(|| InvalidRanges {
                            allow: false,
                            deny: false,
                            message: Arc::from(format!("invalid {name} in the ConfigMap")),
                        });
                        if allow {
                            entry.allow = true;
                        } else {
                            entry.deny = true;
                        }
                    }
                }
            }
            _ => {}
        }
    }
    for message in left_out {
        problems.push(Diagnostic::warning(
            DiagnosticKind::InvalidConfigValue,
            subject(),
            message,
        ));
    }
    diagnostics.append(&mut problems);
    // Read as a whole (the url decides what its companions mean), by the annotations' parser.
    let (auth, auth_problems) = super::annotations::auth::global(data, refuse_access);
    for problem in auth_problems {
        let make: fn(DiagnosticKind, Subject, String) -> Diagnostic = if problem.error {
            Diagnostic::error
        } else {
            Diagnostic::warning
        };
        let kind = if problem.message.starts_with("global-auth-snippet") {
            DiagnosticKind::UnsupportedConfigKey
        } else {
            DiagnosticKind::InvalidConfigValue
        };
        diagnostics.push(make(kind, subject(), problem.message));
    }
    let snippet_judged = auth.external.is_some();
    out.auth = auth;
    for (name, value, status) in unapplied {
        if name == "global-auth-snippet" && snippet_judged {
            continue;
        }
        if ACCESS_KEYS.contains(&name.as_str()) && !value.trim().is_empty() {
            let diagnostic = if refuse_access {
                out.access_refused.get_or_insert_with(|| {
                    Arc::from(format!("the ConfigMap's {name} is not supported"))
                });
                Diagnostic::error(
                    DiagnosticKind::UnsupportedConfigKey,
                    subject(),
                    format!(
                        "{name}: a global access control this controller does not apply; every route answers 503 rather than being served without it (--unsupported-access-annotations=ignore serves them anyway)"
                    ),
                )
            } else {
                Diagnostic::warning(
                    DiagnosticKind::UnsupportedConfigKey,
                    subject(),
                    format!(
                        "{name}: a global access control this controller does not apply; routes are served WITHOUT it (--unsupported-access-annotations=ignore)"
                    ),
                )
            };
            diagnostics.push(diagnostic);
            continue;
        }
        let message = match status {
            Some(KeyStatus::StartupOnly(how)) => {
                format!("{name}: read at startup only, not from the ConfigMap ({how}); ignored")
            }
            Some(KeyStatus::Noop(why)) => format!("{name}: accepted, no effect ({why})"),
            Some(KeyStatus::Unsupported(why)) => format!("{name}: ignored, not supported ({why})"),
            Some(KeyStatus::Applied) => continue,
            None => {
                format!("{name}: ignored, not an ingress-nginx ConfigMap key this controller knows")
            }
        };
        diagnostics.push(Diagnostic::warning(
            DiagnosticKind::UnsupportedConfigKey,
            subject(),
            message,
        ));
    }
    out.forwarded = Arc::new(forwarded);
    out.sources_invalid = ranges_invalid;
    out
}

fn set_bool(
    slot: &mut bool,
    parsed: Option<bool>,
    name: &str,
    value: &str,
    invalid: &mut impl FnMut(&str, &str, &str),
) {
    match parsed {
        Some(b) => *slot = b,
        None => invalid(name, value, "is not a boolean (true or false)"),
    }
}

/// A boolean as ingress-nginx reads one (Go's `strconv.ParseBool`); the annotations' too.
pub use super::annotations::parse_bool;

/// Whole seconds, 1 to a day, as ingress-nginx's ConfigMap timeouts are written.
fn seconds(value: &str) -> Option<Duration> {
    match value.trim().parse::<u64>() {
        Ok(s) if (1..=86_400).contains(&s) => Some(Duration::from_secs(s)),
        _ => None,
    }
}

/// A header name for `forwarded-for-header`: a valid name, and not one that means something
/// else to the proxy (Host, framing, hop-by-hop).
pub fn forwarded_for_header(value: &str) -> Result<HeaderName, String> {
    let name = HeaderName::from_bytes(value.trim().as_bytes())
        .map_err(|_| "is not a header name".to_string())?;
    use ingress_wire::header::Kind as H;
    match ingress_wire::header::kind(name.as_str()) {
        H::Other | H::Forwarding | H::Spoofable => Ok(name),
        _ => Err("names a header the proxy reads for something else".to_string()),
    }
}

#[cfg(test)]
mod tests;
