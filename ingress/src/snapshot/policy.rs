//! A route's policy: what each proxy phase does for the requests on it, typed, built once per
//! snapshot from the Ingress, its annotations and the controller's settings. The proxy reads
//! these fields and nothing else about the Ingress.
//!
//! ```text
//!   phase (proxy::phase)   reads
//!   tls                    HostPolicy       auth-tls-*: the client certificate the handshake
//!                                           asks for, and what each request needs of it
//!   access                 AccessPolicy     refused (an access control that cannot be honoured),
//!                                           source ranges (allow- and deny-lists), basic and
//!                                           external auth, satisfy, rate limits (limit-rps,
//!                                           -rpm, -connections)
//!   redirect               HostPolicy       app-root, from-to-www-redirect (per host: before any
//!                                           route is chosen)
//!                          RedirectPolicy   permanent-/temporal-redirect, then ssl-redirect,
//!                                           force-ssl-redirect (the host's TLS),
//!                                           preserve-trailing-slash
//!   rewrite                RewritePolicy    rewrite-target (with the route's path), x-forwarded-prefix
//!   cors                   ResponsePolicy   enable-cors: the preflight answered, the headers set
//!   response               ResponsePolicy   snippet header actions on the upstream's response,
//!                                           proxy-redirect-*, proxy-cookie-* rewrites,
//!                                           limit-rate(-after): the response's pace,
//!                                           custom-http-errors (+ default-backend,
//!                                           disable-proxy-intercept-errors)
//!   upstream               UpstreamPolicy   backend-protocol (or the Service port's appProtocol),
//!                                           proxy-ssl-*, timeouts, upstream-vhost, load-balance,
//!                                           proxy-next-upstream, the upgrades allowed, affinity,
//!                                           a snippet's proxy_set_header, default-backend
//!                          CanaryPolicy     a canary Ingress's backend and rules (header,
//!                                           cookie, weight)
//! ```

use std::sync::Arc;
use std::time::Duration;

use regex_automata::{Anchored, Input, meta};

use super::annotations::affinity::Affinity;
use super::annotations::auth::{BasicAuth, DigestAuth, ExternalAuth, Satisfy};
use super::annotations::canary::Rules;
use super::annotations::configmap_headers;
pub use super::annotations::configmap_headers::ConfigHeaders;
use super::annotations::cors::Cors;
use super::annotations::hash::HashKey;
use super::annotations::rate_limit::{Bandwidth, RateLimit};
use super::annotations::rewrite::Template;
use super::annotations::snippet::{RequestEdits, ResponseEdits};
use super::annotations::upstream_rewrite::UpstreamRewrite;
use super::annotations::variables::Template as VarTemplate;
use super::annotations::{Options, UrlRedirect};
use super::backend::Backend;
use super::client_auth::ClientAuth;
use super::prefix_shape::PrefixShape;
use super::sources::SourcePolicy;
pub use super::upstream::{
    BackendProtocol, Balance, ClientIdentity, NextUpstream, ProtocolSource, TlsVersions,
    UpstreamTls, Wire,
};
use crate::store::ObjectKey;

/// Everything per route, by phase.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RoutePolicy {
    pub access: AccessPolicy,
    pub redirect: RedirectPolicy,
    pub rewrite: RewritePolicy,
    pub upstream: UpstreamPolicy,
    /// The canary of this route, when a canary Ingress names the same host, path and type.
    pub canary: Option<Arc<CanaryPolicy>>,
    pub response: ResponsePolicy,
}

/// Headers whose values are made per request from nginx variables.
pub type HeaderTemplates = Arc<[(http::HeaderName, VarTemplate)]>;

/// A route's response header edits: the ConfigMaps' (`add-headers`, `custom-headers`), then a
/// snippet's, which win for a name (a snippet is the most specific), split into those known
/// now and those made per request.
fn response_headers(options: &Options) -> (Option<Arc<ResponseEdits>>, Option<HeaderTemplates>) {
    let snippet = options.snippets.as_ref().map(|s| &s.response);
    let config = options
        .config_headers
        .as_ref()
        .map(|c| c.response.as_slice())
        .unwrap_or_default();
    let (literal, templates) = configmap_headers::split(config);
    let mut edits = ResponseEdits {
        replace: literal,
        add: Vec::new(),
    };
    let mut templates = templates;
    if let Some(snippet) = snippet {
        edits.replace.retain(|(n, _)| !snippet.replaces(n.as_str()));
        templates.retain(|(n, _)| !snippet.replaces(n.as_str()));
        edits.replace.extend(snippet.replace.iter().cloned());
        edits.add = snippet.add.clone();
    }
    (
        (!edits.is_empty()).then(|| Arc::new(edits)),
        (!templates.is_empty()).then(|| Arc::from(templates)),
    )
}

/// A route's request header edits: `proxy-set-headers`, then a snippet's `proxy_set_header`.
fn request_headers(options: &Options) -> (Option<Arc<RequestEdits>>, Option<HeaderTemplates>) {
    let snippet = options.snippets.as_ref().map(|s| &s.request);
    let config = options
        .config_headers
        .as_ref()
        .map(|c| c.request.as_slice())
        .unwrap_or_default();
    let (literal, mut templates) = configmap_headers::split(config);
    let mut edits = RequestEdits { set: literal };
    if let Some(snippet) = snippet {
        edits.set.retain(|(n, _)| !snippet.replaces(n.as_str()));
        templates.retain(|(n, _)| !snippet.replaces(n.as_str()));
        edits.set.extend(snippet.set.iter().cloned());
    }
    (
        (!edits.is_empty()).then(|| Arc::new(edits)),
        (!templates.is_empty()).then(|| Arc::from(templates)),
    )
}

/// What the proxy adds to the client's response.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ResponsePolicy {
    /// `enable-cors`: OPTIONS from an allowed origin is answered 204 by the proxy; other
    /// requests from one get the CORS headers set on the upstream's response.
    pub cors: Option<Arc<Cors>>,
    /// The ConfigMap key `add-headers`, then `custom-headers`, then a snippet's `add_header`,
    /// `more_set_headers` and `more_clear_headers` (the later wins for a name), on the
    /// upstream's responses: the ones known now.
    pub headers: Option<Arc<ResponseEdits>>,
    /// The same with nginx variables (`add-headers`), expanded per request.
    pub header_templates: Option<HeaderTemplates>,
    /// `proxy-redirect-*` and `proxy-cookie-*`: the upstream's `Location`, `Refresh` and
    /// `Set-Cookie` rewritten.
    pub rewrite: Option<Arc<UpstreamRewrite>>,
    /// `limit-rate`, `limit-rate-after`: how fast each response is sent.
    pub bandwidth: Option<Bandwidth>,
    /// `custom-http-errors` of the Ingress; `None`: the global list (ConfigMap) applies.
    pub errors: Option<Arc<ErrorPages>>,
}

/// Which responses are replaced by a page of the error backend, and which backend.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ErrorPages {
    /// Sorted, deduplicated.
    pub codes: Arc<[u16]>,
    /// The Ingress's `default-backend` Service; `None`: the global default backend.
    pub backend: Option<Fallback>,
    /// The upstream's own responses with these codes are replaced too (not when
    /// `disable-proxy-intercept-errors`); the proxy's own always are.
    pub intercept: bool,
}

impl ErrorPages {
    /// Whether `code` is one of the listed codes.
    pub fn lists(&self, code: u16) -> bool {
        self.codes.binary_search(&code).is_ok()
    }
}

/// A canary Ingress's alternative to a route's backend. Everything else about a request on
/// the route (redirects, rewrites, timeouts) is the main Ingress's, as in ingress-nginx.
#[derive(Debug)]
pub struct CanaryPolicy {
    pub rules: Arc<Rules>,
    pub backend: Arc<Backend>,
    /// The canary Ingress.
    pub ingress: ObjectKey,
    /// `affinity-canary-behavior` of the canary Ingress is `sticky` (the default): with
    /// affinity on the route, a session stays on the backend it began on.
    pub sticky: bool,
}

impl PartialEq for CanaryPolicy {
    fn eq(&self, other: &Self) -> bool {
        self.rules == other.rules
            && Arc::ptr_eq(&self.backend, &other.backend)
            && self.ingress == other.ingress
            && self.sticky == other.sticky
    }
}

impl Eq for CanaryPolicy {}

/// What a host does before any of its routes is chosen: ingress-nginx writes these into the
/// `server` block, so they apply to every request for the host, whichever Ingress set them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HostPolicy {
    /// `app-root`: a request whose path is exactly `/` is redirected (302) here, on the same
    /// scheme and `Host`, query dropped, as ingress-nginx's `return 302 $scheme://$http_host…`.
    pub app_root: Option<Arc<str>>,
    /// `from-to-www-redirect`: this host exists only to redirect (308) to that one, as
    /// `<scheme>://<to>:<port><target, one trailing slash removed>`.
    pub www_redirect: Option<Arc<str>>,
    /// `auth-tls-*`: the client certificate its TLS connections are asked for, and what a
    /// request needs of it (nginx's `ssl_verify_client` is per `server` too).
    pub client_auth: Option<Arc<ClientAuth>>,
    /// Why an Ingress's `auth-tls-*` for this host cannot be applied: without `client_auth`
    /// from another Ingress, every request for the host is refused (503), as nginx answers a
    /// `server` whose client-certificate setup failed.
    pub client_auth_error: Option<Arc<str>>,
}

/// How the target sent upstream differs from the one the client sent.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RewritePolicy {
    /// `rewrite-target`: the whole path is replaced, the query kept.
    pub target: Option<Rewrite>,
}

/// `rewrite-target` on one path: when `regex` (the Ingress path, case-insensitive, unanchored,
/// as nginx's `rewrite "(?i)PATH" TARGET`) matches the request path, the upstream is sent
/// `template` expanded with its groups, and `X-Forwarded-Prefix` if the Ingress asks.
///
/// The regex is regex-automata's `meta::Regex` (the engine behind `regex::Regex`) because a
/// rewrite runs on every request of its route, and that API lets it run anchored first and
/// fill capture slots on the stack: see [`Rewrite::apply`].
#[derive(Clone, Debug)]
pub struct Rewrite {
    pub regex: meta::Regex,
    /// The pattern `regex` was built from.
    pub pattern: Arc<str>,
    pub template: Arc<Template>,
    pub forwarded_prefix: Option<Arc<str>>,
    /// The pattern's shape when it is one matched without the engine (nearly every rewrite:
    /// ingress-nginx's recipe `/PREFIX(/|$)(.*)`).
    pub shape: Option<PrefixShape>,
}

impl PartialEq for Rewrite {
    fn eq(&self, other: &Self) -> bool {
        self.pattern == other.pattern
            && self.template == other.template
            && self.forwarded_prefix == other.forwarded_prefix
    }
}

impl Eq for Rewrite {}

/// Capture slots [`Rewrite::apply`] fills: the whole match and `$1`..`$9`, the groups a
/// template can name (two slots each).
const REWRITE_SLOTS: usize = 2 * 10;

impl Rewrite {
    /// The rewrite of requests routed by `path` for an Ingress with `options`: `None` without
    /// `rewrite-target`, or when it equals the path (ingress-nginx then does not rewrite).
    pub fn for_path(
        options: &Options,
        path: &str,
    ) -> Option<Result<Rewrite, Box<meta::BuildError>>> {
        let template = options.rewrite_target.as_ref()?;
        if template.as_str() == path {
            return None;
        }
        let pattern = format!("(?i){path}");
        Some(
            meta::Regex::builder()
                .configure(meta::Config::new().nfa_size_limit(Some(super::path::REGEX_SIZE_LIMIT)))
                .build(&pattern)
                .map_err(Box::new)
                .map(|regex| Rewrite {
                    regex,
                    pattern: pattern.into(),
                    template: template.clone(),
                    forwarded_prefix: options.x_forwarded_prefix.clone(),
                    shape: PrefixShape::of(path, true),
                }),
        )
    }

    /// The path sent upstream for `path`, or `None` when the regex does not match it (nginx's
    /// `rewrite` then leaves it alone).
    ///
    /// A routed request's path matched the route's `^PATH`, so the unanchored search's leftmost
    /// match nearly always starts at 0, and a match that starts at 0 is the same match whether
    /// the search was anchored or not (leftmost-first picks among matches at one start the same
    /// way). So the anchored search goes first: it needs no reverse scan to find where the
    /// match starts, and it is the only search most requests make. Only when nothing matches
    /// at 0 does the unanchored search run.
    ///
    /// Before either, a pattern with a [`PrefixShape`] answers the anchored search without
    /// the engine, wherever the shape can.
    pub fn apply(&self, path: &str) -> Option<String> {
        if let Some(Some(groups)) = self.shape.as_ref().and_then(|s| s.captures(path)) {
            return Some(self.template.expand(|n| {
                let (start, end) = groups.get(n).copied().flatten()?;
                path.get(start..end)
            }));
        }
        let mut slots = [None; REWRITE_SLOTS];
        let slots = &mut slots[..self.regex.group_info().slot_len().min(REWRITE_SLOTS)];
        let anchored = Input::new(path).anchored(Anchored::Yes);
        if self.regex.search_slots(&anchored, slots).is_none() {
            self.regex.search_slots(&Input::new(path), slots)?;
        }
        let slots = &*slots;
        Some(self.template.expand(|n| {
            let start = slots.get(2 * n).copied().flatten()?;
            let end = slots.get(2 * n + 1).copied().flatten()?;
            path.get(start.get()..end.get())
        }))
    }
}

/// Who may reach the backend.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AccessPolicy {
    /// Nobody, and why: the Ingress asks for an access control this controller cannot honour
    /// (`--unsupported-access-annotations=refuse`), so every request is answered 503 rather
    /// than served unprotected.
    pub refused: Option<Arc<str>>,
    /// `allowlist-source-range` / `denylist-source-range`: who may, by source address (403).
    pub sources: SourcePolicy,
    /// `limit-rps`, `limit-rpm`, `limit-connections`: how much each client address may ask
    /// (the buckets themselves are the proxy's, beside the snapshot).
    pub rate_limit: Option<Arc<RateLimit>>,
    /// Who must authenticate, and how.
    pub auth: AuthPolicy,
}

/// Authentication on a route, and how it combines with the source ranges.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AuthPolicy {
    /// `auth-type: basic` with its Secret's users.
    pub basic: Option<Arc<BasicAuth>>,
    /// `auth-type: digest` with its Secret's users.
    pub digest: Option<Arc<DigestAuth>>,
    /// `auth-url` and its companions.
    pub external: Option<Arc<ExternalAuth>>,
    /// `satisfy`.
    pub satisfy: Satisfy,
}

impl AuthPolicy {
    /// Whether a request must authenticate at all.
    pub fn is_on(&self) -> bool {
        self.basic.is_some() || self.digest.is_some() || self.external.is_some()
    }
}

/// Redirects made before the upstream is asked.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RedirectPolicy {
    /// `temporal-redirect` or `permanent-redirect`: every request gets this redirect, HTTP or
    /// HTTPS (nginx's `return CODE URL`, which runs before the HTTPS redirect).
    pub to_url: Option<UrlRedirect>,
    /// Plain HTTP is redirected to HTTPS: `force-ssl-redirect`, or `ssl-redirect` (default on)
    /// when the Ingress lists the host under `spec.tls`.
    pub to_https: bool,
    /// `preserve-trailing-slash`: the HTTPS redirect keeps a trailing `/` of the target
    /// (ingress-nginx removes one by default, so `/` goes to `https://host`).
    pub preserve_trailing_slash: bool,
}

/// How the upstream is spoken to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UpstreamPolicy {
    /// The protocol toward the upstream, and where that choice came from.
    pub protocol: BackendProtocol,
    pub protocol_source: ProtocolSource,
    /// How TLS to the upstream is made, for the protocols that use TLS (`proxy-ssl-*`).
    pub tls: Arc<UpstreamTls>,
    /// `proxy-read-timeout`: how long the upstream has to send its response head, and may
    /// pause while sending the body; `None` is `--upstream-response-timeout`.
    pub read_timeout: Option<Duration>,
    /// `proxy-connect-timeout`: for a new connection (TCP and TLS); `None` is
    /// `--upstream-connect-timeout`.
    pub connect_timeout: Option<Duration>,
    /// `proxy-send-timeout`: how long a write of the request to the upstream may block; `None`
    /// is `--upstream-send-timeout`.
    pub send_timeout: Option<Duration>,
    /// `upstream-vhost`: the `Host` (`:authority`) sent upstream instead of the client's.
    pub vhost: Option<Arc<str>>,
    /// `load-balance`.
    pub balance: Balance,
    /// `proxy-next-upstream`, `-tries`, `-timeout`.
    pub next_upstream: NextUpstream,
    /// `service-upstream`: the backend is the Service's ClusterIP and port, not its endpoints
    /// (read when the route's backend is resolved).
    pub service_upstream: bool,
    /// The protocols a client may switch to with `Upgrade` (lower-case).
    pub upgrades: Arc<[String]>,
    /// `affinity: cookie`, its cookie's path resolved (the route's path by default).
    pub affinity: Option<Arc<Affinity>>,
    /// `proxy-body-size` (or `--proxy-body-size`): the largest request body, in bytes; a larger
    /// one is answered 413. `None`: no limit.
    pub max_body: Option<u64>,
    /// `upstream-hash-by`: the endpoint is the key's, by rendezvous hashing (`affinity` wins
    /// when both are set, as in ingress-nginx).
    pub hash_by: Option<Arc<HashKey>>,
    /// A snippet's `proxy_set_header`s: the request headers sent upstream instead of the
    /// client's.
    pub request_headers: Option<Arc<RequestEdits>>,
    /// The same with nginx variables (`proxy-set-headers`), expanded per request.
    pub request_templates: Option<HeaderTemplates>,
    /// `default-backend`: where a request goes when the chosen backend has no endpoint.
    pub fallback: Option<Fallback>,
}

/// A `default-backend` Service's backend (compared by identity: one per snapshot).
#[derive(Clone, Debug)]
pub struct Fallback(pub Arc<Backend>);

impl PartialEq for Fallback {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for Fallback {}

impl Default for UpstreamPolicy {
    fn default() -> Self {
        Self {
            protocol: BackendProtocol::Http,
            protocol_source: ProtocolSource::Default,
            tls: Arc::new(UpstreamTls::default()),
            read_timeout: None,
            connect_timeout: None,
            send_timeout: None,
            vhost: None,
            balance: Balance::TwoChoices,
            next_upstream: NextUpstream::default(),
            service_upstream: false,
            upgrades: Arc::from(["websocket".to_string()]),
            affinity: None,
            max_body: None,
            hash_by: None,
            request_headers: None,
            request_templates: None,
            fallback: None,
        }
    }
}

impl RoutePolicy {
    /// This policy for a route of `path`: the affinity cookie's path defaults to the route's
    /// (ingress-nginx's location path; `/` when the path is not a plain path, such as a regex).
    pub fn for_path(self: &Arc<Self>, path: &str) -> Arc<RoutePolicy> {
        match &self.upstream.affinity {
            Some(affinity) if affinity.path.is_none() => {
                let plain = path
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-._~/".contains(&b));
                let mut policy = (**self).clone();
                policy.upstream.affinity = Some(Arc::new(Affinity {
                    path: Some(if plain {
                        path.to_string()
                    } else {
                        "/".to_string()
                    }),
                    ..(**affinity).clone()
                }));
                Arc::new(policy)
            }
            _ => self.clone(),
        }
    }

    /// The policy of a route of an Ingress with `options`, for a host it lists under
    /// `spec.tls` or not, refused or not; `max_body` is `--proxy-body-size` (`None`: no limit).
    pub fn new(
        options: &Options,
        tls: bool,
        refused: Option<&Arc<str>>,
        max_body: Option<u64>,
    ) -> RoutePolicy {
        let (response_edits, response_templates) = response_headers(options);
        let (request_edits, request_templates) = request_headers(options);
        RoutePolicy {
            access: AccessPolicy {
                refused: refused.cloned(),
                sources: SourcePolicy::default(),
                auth: AuthPolicy::default(),
                rate_limit: None,
            },
            redirect: RedirectPolicy {
                to_url: options.redirect.clone(),
                to_https: options.force_ssl_redirect
                    || (tls && options.ssl_redirect.unwrap_or(true)),
                preserve_trailing_slash: options.preserve_trailing_slash,
            },
            rewrite: RewritePolicy::default(),
            canary: None,
            response: ResponsePolicy {
                cors: options.cors.clone(),
                headers: response_edits,
                header_templates: response_templates,
                rewrite: options.upstream_rewrite.clone(),
                bandwidth: None,
                errors: options.custom_http_errors.as_ref().map(|codes| {
                    Arc::new(ErrorPages {
                        codes: codes.clone(),
                        backend: None,
                        intercept: !options.disable_intercept,
                    })
                }),
            },
            upstream: UpstreamPolicy {
                protocol: options.backend_protocol.unwrap_or_default(),
                protocol_source: if options.backend_protocol.is_some() {
                    ProtocolSource::Annotation
                } else {
                    ProtocolSource::Default
                },
                tls: Arc::new(options.upstream_tls.clone()),
                read_timeout: options.read_timeout,
                connect_timeout: options.connect_timeout,
                send_timeout: options.send_timeout,
                vhost: options.upstream_vhost.as_deref().map(Arc::from),
                balance: options.load_balance.unwrap_or_default(),
                next_upstream: options.next_upstream,
                service_upstream: options.service_upstream,
                upgrades: options.upgrades.clone(),
                affinity: options.affinity.clone(),
                max_body: match options.proxy_body_size {
                    Some(0) => None,
                    Some(n) => Some(n),
                    None => max_body,
                },
                hash_by: options.upstream_hash_by.clone(),
                request_headers: request_edits,
                request_templates,
                fallback: None,
            },
        }
    }

    /// This policy for a route whose Service port says `app_protocol`, and whose Service is
    /// reachable by `service_dns` (the name verified when `proxy-ssl-name` is not set). `None`
    /// when nothing changes, so routes keep sharing one policy.
    pub fn for_backend(
        &self,
        app_protocol: Option<BackendProtocol>,
        service_dns: &str,
    ) -> Option<RoutePolicy> {
        let protocol = match (self.upstream.protocol_source, app_protocol) {
            (ProtocolSource::Default, Some(p)) => Some(p),
            _ => None,
        };
        let name = (self.upstream.tls.name.is_none()).then(|| service_dns.to_string());
        if protocol.is_none() && name.is_none() {
            return None;
        }
        let mut policy = self.clone();
        if let Some(p) = protocol {
            policy.upstream.protocol = p;
            policy.upstream.protocol_source = ProtocolSource::AppProtocol;
        }
        if let Some(name) = name {
            let mut tls = (*policy.upstream.tls).clone();
            tls.name = Some(name);
            policy.upstream.tls = Arc::new(tls);
        }
        Some(policy)
    }
}

impl RoutePolicy {
    /// The same policy with the `default-backend` fallback, which is also the error backend
    /// of the Ingress's `custom-http-errors` (when it has the annotation).
    pub fn with_fallback(mut self, fallback: Option<&Arc<Backend>>) -> RoutePolicy {
        self.upstream.fallback = fallback.cloned().map(Fallback);
        if let Some(errors) = &mut self.response.errors {
            Arc::make_mut(errors).backend = self.upstream.fallback.clone();
        }
        self
    }

    /// The same policy with the Ingress's rate limits.
    pub fn with_rate_limit(mut self, limit: Option<&Arc<RateLimit>>) -> RoutePolicy {
        self.access.rate_limit = limit.cloned();
        self
    }

    /// The same policy with the Ingress's response bandwidth.
    pub fn with_bandwidth(mut self, bandwidth: Option<Bandwidth>) -> RoutePolicy {
        self.response.bandwidth = bandwidth;
        self
    }

    /// The same policy with the Ingress's source ranges.
    pub fn with_sources(mut self, sources: &SourcePolicy) -> RoutePolicy {
        self.access.sources = sources.clone();
        self
    }

    /// The same policy with the Ingress's authentication.
    pub fn with_auth(mut self, auth: &AuthPolicy) -> RoutePolicy {
        self.access.auth = auth.clone();
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn https_redirects_follow_the_annotations_and_the_hosts_tls() {
        let options = |ssl: Option<bool>, force: bool| Options {
            ssl_redirect: ssl,
            force_ssl_redirect: force,
            ..Options::default()
        };
        let cases = [
            // (ssl-redirect, force-ssl-redirect, host has TLS) -> redirect
            (None, false, false, false),
            (None, false, true, true),
            (Some(false), false, true, false),
            (Some(true), false, false, false),
            (Some(false), true, false, true),
            (None, true, true, true),
        ];
        for (ssl, force, tls, want) in cases {
            let policy = RoutePolicy::new(&options(ssl, force), tls, None, None);
            assert_eq!(policy.redirect.to_https, want, "{ssl:?} {force} {tls}");
        }
    }

    #[test]
    fn rewrite_target_expands_the_paths_groups_case_insensitively() {
        let options = |target: &str| Options {
            rewrite_target: Some(Arc::new(Template::parse(target).unwrap())),
            x_forwarded_prefix: Some(Arc::from("/p")),
            ..Options::default()
        };
        // (Ingress path, rewrite-target, request path, sent upstream)
        let cases = [
            ("/something(/|$)(.*)", "/$2", "/something", Some("/")),
            ("/something(/|$)(.*)", "/$2", "/something/", Some("/")),
            ("/something(/|$)(.*)", "/$2", "/something/new", Some("/new")),
            ("/something(/|$)(.*)", "/$2", "/SomeThing/New", Some("/New")),
            (
                "/api/(v[0-9]+)/(.*)",
                "/$2/$1",
                "/api/v2/users",
                Some("/users/v2"),
            ),
            ("/old", "/new", "/old/page", Some("/new")),
            // Unanchored, like nginx's `rewrite`: a match later in the path counts too.
            ("/x", "/y", "/a/x", Some("/y")),
            ("/old", "/new", "/other", None),
        ];
        for (path, target, request, want) in cases {
            let rewrite = Rewrite::for_path(&options(target), path)
                .expect("a rewrite")
                .expect("a valid regex");
            assert_eq!(
                rewrite.apply(request).as_deref(),
                want,
                "{path} {target} {request}"
            );
            assert_eq!(rewrite.forwarded_prefix.as_deref(), Some("/p"));
        }
        // The target equal to the path, or no target: no rewrite.
        assert!(Rewrite::for_path(&options("/same"), "/same").is_none());
        assert!(Rewrite::for_path(&Options::default(), "/a").is_none());
        assert!(matches!(
            Rewrite::for_path(&options("/x"), "/a("),
            Some(Err(_))
        ));
    }

    /// `apply` runs anchored first; what it sends must be what nginx's unanchored `rewrite`
    /// (here `regex::Regex::captures`, the unanchored reference) makes of every path, including
    /// the paths whose leftmost match does not start at 0 and top-level alternations.
    #[test]
    fn anchored_first_rewrites_equal_the_unanchored_search() {
        let patterns = [
            "/something(/|$)(.*)",
            "/api/(v[0-9]+)/(.*)",
            "/b|/a(.*)",
            "(/x)?/y(.*)",
            "/a(.*)|/(.*)",
            "/(a+)(a*)",
            "/x",
            "(.*)",
            "/é(.*)",
        ];
        let paths = [
            "/",
            "/something",
            "/something/new",
            "/SOMETHING/new",
            "/api/v12/users",
            "/z/api/v1/u",
            "/b",
            "/a/q",
            "/q/a/b",
            "/x/y/z",
            "/y",
            "/zz/y/q",
            "/aaaa",
            "/a/x",
            "/É/deux",
        ];
        let template = "/$1_$2_$9";
        let options = Options {
            rewrite_target: Some(Arc::new(Template::parse(template).unwrap())),
            ..Options::default()
        };
        for pattern in patterns {
            let rewrite = Rewrite::for_path(&options, pattern)
                .expect("a rewrite")
                .expect("a valid regex");
            let reference = regex::Regex::new(&format!("(?i){pattern}")).unwrap();
            for path in paths {
                let want = reference.captures(path).map(|c| {
                    let group = |n: usize| c.get(n).map_or("", |m| m.as_str());
                    format!("/{}_{}_{}", group(1), group(2), group(9))
                });
                assert_eq!(rewrite.apply(path), want, "{pattern} on {path}");
            }
        }
    }

    #[test]
    fn the_annotation_wins_over_app_protocol() {
        let annotated = Options {
            backend_protocol: Some(BackendProtocol::Https),
            ..Options::default()
        };
        let cases = [
            // (options, appProtocol) -> (protocol, source)
            (
                Options::default(),
                None,
                BackendProtocol::Http,
                ProtocolSource::Default,
            ),
            (
                Options::default(),
                Some(BackendProtocol::H2c),
                BackendProtocol::H2c,
                ProtocolSource::AppProtocol,
            ),
            (
                annotated.clone(),
                Some(BackendProtocol::H2c),
                BackendProtocol::Https,
                ProtocolSource::Annotation,
            ),
            (
                annotated,
                None,
                BackendProtocol::Https,
                ProtocolSource::Annotation,
            ),
        ];
        for (options, app, protocol, source) in cases {
            let base = RoutePolicy::new(&options, false, None, None);
            let policy = base.for_backend(app, "svc.ns.svc").unwrap_or(base);
            assert_eq!(policy.upstream.protocol, protocol, "{options:?} {app:?}");
            assert_eq!(
                policy.upstream.protocol_source, source,
                "{options:?} {app:?}"
            );
            assert_eq!(policy.upstream.tls.name.as_deref(), Some("svc.ns.svc"));
        }
        // proxy-ssl-name is kept.
        let named = Options {
            upstream_tls: UpstreamTls {
                name: Some("backend.example".into()),
                ..UpstreamTls::default()
            },
            ..Options::default()
        };
        let base = RoutePolicy::new(&named, false, None, None);
        assert_eq!(base.for_backend(None, "svc.ns.svc"), None);
    }

    #[test]
    fn a_refused_ingress_keeps_its_reason() {
        let reason: Arc<str> = Arc::from("auth-url is not supported");
        let policy = RoutePolicy::new(&Options::default(), false, Some(&reason), None);
        assert_eq!(
            policy.access.refused.as_deref(),
            Some("auth-url is not supported")
        );
        assert_eq!(
            RoutePolicy::new(&Options::default(), false, None, None)
                .access
                .refused,
            None
        );
    }
}
