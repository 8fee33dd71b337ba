//! The snapshot: everything the proxy, the kernel map sync and the reporter need, built by one
//! pure function from the store and published atomically.
//!
//! ```text
//!   Store ──> build() ──> Snapshot { hosts: HostTable<VirtualHost>, default_backend, diagnostics }
//!              │            VirtualHost { paths: PathMatcher<Route>, default_backend }
//!              │            Route { ingress, backend: Backend { endpoints }, options }
//!              └─ class selection, annotations, host/path validation, backend resolution
//! ```
//!
//! An Ingress with an access-control annotation that cannot be honoured keeps its paths, each
//! on a route whose access policy refuses every request (503), so a protected path never falls
//! through to another rule.

pub mod address;
pub mod annotations;
pub mod backend;
pub mod certs;
pub mod class;
pub mod client_auth;
pub mod gate_sources;
pub mod global;
mod headers;
pub use headers::referenced as referenced_config_maps;
pub mod host;
mod incremental;
pub mod path;
pub mod policy;
pub mod prefix_shape;
pub mod sni;
pub mod sources;
pub mod tls;
pub mod upstream;
pub use incremental::{BuildCache, BuildKind};

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use k8s_openapi::api::networking::v1::{Ingress, IngressBackend};

use crate::diagnostics::{Diagnostic, DiagnosticKind, Severity, Subject};
use crate::store::{Changes, Kind, ObjectKey, Store};
use annotations::UnsupportedAccess;
use annotations::auth::GlobalAuth;
use annotations::registry::Category;
use backend::{Backend, BackendPolicy, PortRef, Resolver, Target};
use class::ClassSelector;
use host::{HostPattern, HostTable};
use path::{PathMatcher, PathRule};
use policy::{AuthPolicy, CanaryPolicy, HostPolicy, Rewrite, RewritePolicy, RoutePolicy};

/// What the builder needs beyond the store. Everything here comes from flags.
#[derive(Clone, Debug)]
pub struct BuildSettings {
    pub class: ClassSelector,
    pub tls: tls::TlsSettings,
    /// ExternalName opt-in and the endpoint addresses refused.
    pub backends: BackendPolicy,
    /// `--unsupported-access-annotations`.
    pub unsupported_access: UnsupportedAccess,
    /// `--no-sni`, `--malformed-tls`, `--not-tls`: the gate's answer when there is no name.
    pub unnamed: sni::UnnamedPolicy,
    /// The flags' global settings: the defaults a `--configmap` ConfigMap overrides.
    pub global: global::GlobalSettings,
    /// `--configmap`: the ConfigMap whose keys override `global` (ingress-nginx's).
    pub config_map: Option<ObjectKey>,
}

/// One immutable routing state.
#[derive(Debug, Default)]
pub struct Snapshot {
    pub generation: u64,
    pub hosts: HostTable<Arc<VirtualHost>>,
    /// The `defaultBackend` of an Ingress without rules: where unmatched hosts go.
    pub default_backend: Option<Arc<Route>>,
    /// Sorted and deduplicated.
    pub diagnostics: Vec<Diagnostic>,
    /// The Ingresses this controller owns, with what the reporter needs of each.
    pub ingresses: BTreeMap<ObjectKey, IngressMeta>,
    /// SNI → certificate.
    pub tls: tls::TlsTable,
    /// The names the HTTPS port admits, for the kernel gate and userspace mode alike.
    pub sni: sni::SniPolicy,
    /// `ssl-passthrough` hosts: SNI → the backend that terminates TLS itself.
    pub passthrough: HostTable<Arc<Route>>,
    /// The flags with the ConfigMap's keys applied: what the proxy reads per request.
    pub global: Arc<global::GlobalSettings>,
    /// The `--configmap` ConfigMap, when it exists, with its uid (for Events on it).
    pub config_map: Option<(ObjectKey, Option<String>)>,
}

/// What status and Event writing need of an owned Ingress.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IngressMeta {
    pub uid: Option<String>,
    /// `status.loadBalancer.ingress` as it is now: IPs and hostnames.
    pub addresses: Vec<String>,
}

impl IngressMeta {
    fn of(ingress: &Ingress) -> Self {
        let addresses = ingress
            .status
            .as_ref()
            .and_then(|s| s.load_balancer.as_ref())
            .and_then(|lb| lb.ingress.as_ref())
            .map(|entries| {
                entries
                    .iter()
                    .filter_map(|e| e.ip.clone().or_else(|| e.hostname.clone()))
                    .collect()
            })
            .unwrap_or_default();
        Self {
            uid: ingress.metadata.uid.clone(),
            addresses,
        }
    }
}

/// Everything served under one host pattern.
#[derive(Debug)]
pub struct VirtualHost {
    pub pattern: HostPattern,
    pub paths: PathMatcher<Arc<Route>>,
    /// The `defaultBackend` of the oldest Ingress with rules for this host: where its unmatched
    /// paths go.
    pub default_backend: Option<Arc<Route>>,
    /// What applies to every request for this host before a route is chosen.
    pub policy: HostPolicy,
    /// Whether its paths are matched in ingress-nginx's regex mode (`use-regex` or
    /// `rewrite-target` on one of its Ingresses).
    pub nginx_regex: bool,
}

/// A backend as one Ingress uses it.
#[derive(Debug)]
pub struct Route {
    pub ingress: ObjectKey,
    /// Whether the Ingress lists this route's host under `spec.tls`.
    pub tls: bool,
    pub backend: Arc<Backend>,
    /// What each proxy phase does for requests on this route.
    pub policy: Arc<RoutePolicy>,
    pub labels: RouteLabels,
}

/// Metric labels, allocated once per snapshot rather than once per request.
#[derive(Clone, Debug)]
pub struct RouteLabels {
    pub namespace: Arc<str>,
    pub ingress: Arc<str>,
    pub service: Arc<str>,
    /// The Ingress path the route serves, as written (ingress-nginx's `path` label).
    pub path: Arc<str>,
}

impl Snapshot {
    /// The host a request names, as routing picks it (exact, wildcard, then the host-less rules).
    pub fn host(&self, host: Option<&str>) -> Option<&Arc<VirtualHost>> {
        match host {
            Some(h) => self.hosts.lookup(h),
            None => self.hosts.any(),
        }
    }

    /// The route for a request, or `None` for a 404.
    pub fn route(&self, host: Option<&str>, path: &str) -> Option<&Arc<Route>> {
        if let Some(vhost) = self.host(host) {
            if let Some(rule) = vhost.paths.find(path) {
                return Some(&rule.target);
            }
            if let Some(default) = &vhost.default_backend {
                return Some(default);
            }
        }
        self.default_backend.as_ref()
    }

    /// Every HTTP route, once per place it is reachable from (a route shared by two hosts
    /// twice), in no particular order (sorting the hosts would cost more than most callers'
    /// work at 10,000 hosts); passthrough routes are not HTTP routes and are not included.
    pub fn routes(&self) -> impl Iterator<Item = &Arc<Route>> {
        self.hosts
            .values()
            .flat_map(|vhost| {
                vhost
                    .paths
                    .rules()
                    .iter()
                    .map(|rule| &rule.target)
                    .chain(vhost.default_backend.as_ref())
            })
            .chain(self.default_backend.as_ref())
    }

    pub fn has_errors(&self) -> bool {
        self.diagnostics
            .iter()
            .any(|d| d.severity == Severity::Error)
    }

    /// Diagnostic counts by kind and severity, for the `ingress_config_errors` gauge.
    pub fn diagnostic_counts_by_severity(&self) -> BTreeMap<(DiagnosticKind, Severity), usize> {
        let mut counts = BTreeMap::new();
        for d in &self.diagnostics {
            *counts.entry((d.kind, d.severity)).or_default() += 1;
        }
        counts
    }

    /// Builds a snapshot from nothing. Pure: the same store and settings give the same
    /// routing. [`BuildCache::build`] gives the same snapshot reusing an earlier build's work.
    pub fn build(store: &Store, settings: &BuildSettings, generation: u64) -> Snapshot {
        BuildCache::default().build(store, settings, generation, &Changes::everything())
    }
}

/// What every Ingress's compilation reads of the global configuration (the flags and the
/// `--configmap` ConfigMap with the ConfigMaps it names): worked out in a full build and kept
/// for the incremental builds until the next.
#[derive(Clone)]
struct Prepared {
    global: global::GlobalSettings,
    config_headers: policy::ConfigHeaders,
    /// The addresses an auth service (`auth-url`) may have: the backends' policy, but this
    /// node's own addresses allowed, since `https://$host/oauth2/auth` comes back through the
    /// proxy itself.
    auth_addresses: address::AddressPolicy,
    diagnostics: Vec<Diagnostic>,
}

fn prepare(store: &Store, settings: &BuildSettings) -> Prepared {
    let mut diagnostics = Vec::new();
    let mut global = match &settings.config_map {
        Some(key) => {
            let empty = BTreeMap::new();
            let data = store
                .config_map(key)
                .map(|cm| cm.data.as_ref().unwrap_or(&empty));
            let refuse = settings.unsupported_access == UnsupportedAccess::Refuse;
            global::resolve(&settings.global, key, data, refuse, &mut diagnostics)
        }
        None => settings.global.clone(),
    }
    .finish();
    let config_headers = headers::global(
        store,
        &global.headers,
        settings.config_map.as_ref(),
        &mut diagnostics,
    );
    let auth_addresses = address::AddressPolicy {
        host_addresses: Arc::default(),
        ..settings.backends.addresses.clone()
    };
    global.auth = global.auth.with_addresses(&auth_addresses);
    Prepared {
        global,
        config_headers,
        auth_addresses,
        diagnostics,
    }
}

/// A host's virtual host, from what its Ingresses gave it: in ingress-nginx's regex mode when
/// one of them asks for it.
fn finish_host(
    pattern: &HostPattern,
    host: HostBuilder,
    diagnostics: &mut Vec<Diagnostic>,
) -> Arc<VirtualHost> {
    let paths = if host.nginx_regex {
        PathMatcher::nginx_regex(nginx_regex_rules(pattern, host.rules, diagnostics))
    } else {
        PathMatcher::new(host.rules)
    };
    Arc::new(VirtualHost {
        pattern: pattern.clone(),
        paths,
        default_backend: host.default_backend,
        policy: host.policy,
        nginx_regex: host.nginx_regex,
    })
}

/// The name the SNI policy lists a pattern under; `None` for the host-less rules.
fn sni_name(pattern: &HostPattern) -> Option<String> {
    match pattern {
        HostPattern::Exact(name) => Some(name.clone()),
        HostPattern::Wildcard(parent) => Some(format!("*.{parent}")),
        HostPattern::Any => None,
    }
}

/// The source policy the kernel can judge a host's clients by before accept: the one every
/// route a request for it can reach agrees on (its paths, then its own fallback or, without
/// one, the snapshot's).
fn host_gate_sources(
    vhost: &VirtualHost,
    default_backend: Option<&Arc<Route>>,
) -> Option<sources::SourcePolicy> {
    let fallback = vhost.default_backend.as_ref().or(default_backend);
    let routes = vhost.paths.rules().iter().map(|rule| &rule.target);
    gate_sources::uniform(routes.chain(fallback).map(|route| &route.policy.access))
}

/// Whether the kernel sees the real client, so can judge sources: the peer, or behind PROXY
/// protocol the client the header names when every header is believed (with
/// proxy-real-ip-cidr set, believing depends on the peer, which the kernel leaves to the access
/// phase after accept).
fn kernel_sees_client(global: &global::GlobalSettings) -> bool {
    !global.forwarded.enabled && (!global.proxy_protocol || global.forwarded.trusted.is_none())
}

/// A name served for another host's sake.
enum ExtraName {
    /// `server-alias`: the same virtual host as this one.
    Alias(HostPattern),
    /// `from-to-www-redirect`: a host that only redirects to this name.
    WwwRedirect(String),
}

/// The other name of `from-to-www-redirect`'s host: `www.` added, or taken off.
pub(crate) fn www_partner(name: &str) -> String {
    match name.strip_prefix("www.") {
        Some(bare) => bare.to_string(),
        None => format!("www.{name}"),
    }
}

/// The names `server-alias` and `from-to-www-redirect` add, as ingress-nginx adds them: never
/// a name an Ingress rule declares; of two claims on one name, the older Ingress's wins.
fn extra_names(
    hosts: &BTreeMap<HostPattern, HostBuilder>,
    diagnostics: &mut Vec<Diagnostic>,
) -> BTreeMap<HostPattern, ExtraName> {
    let mut extra = BTreeMap::new();
    let subject = |key: &ObjectKey| Subject::object(Kind::Ingress, key);
    let mut claims: Vec<(usize, &HostPattern, &HostBuilder)> = hosts
        .iter()
        .flat_map(|(pattern, host)| {
            let alias = host.aliases.as_ref().map(|(rank, ..)| *rank);
            let www = host.www.as_ref().map(|(rank, _)| *rank);
            [alias, www]
                .into_iter()
                .flatten()
                .min()
                .map(|rank| (rank, pattern, host))
        })
        .collect();
    claims.sort_by_key(|(rank, pattern, _)| (*rank, *pattern));
    for (_, pattern, host) in claims {
        if let Some((_, key, aliases)) = &host.aliases {
            for alias in aliases {
                if alias == pattern || hosts.contains_key(alias) {
                    continue;
                }
                match extra.get(alias) {
                    None => {
                        extra.insert(alias.clone(), ExtraName::Alias(pattern.clone()));
                    }
                    Some(_) => diagnostics.push(Diagnostic::warning(
                        DiagnosticKind::ConflictingRule,
                        subject(key),
                        format!("server-alias {alias} of host {pattern} is already an alias of another host; it is not added"),
                    )),
                }
            }
        }
        let Some((_, key)) = &host.www else { continue };
        let HostPattern::Exact(to) = pattern else {
            diagnostics.push(Diagnostic::warning(
                DiagnosticKind::InvalidAnnotation,
                subject(key),
                format!("from-to-www-redirect applies to plain host names, not to {pattern}; no redirect is made for it"),
            ));
            continue;
        };
        let from = www_partner(to);
        let from_pattern = HostPattern::Exact(from.clone());
        if hosts.contains_key(&from_pattern) || extra.contains_key(&from_pattern) {
            diagnostics.push(Diagnostic::warning(
                DiagnosticKind::ConflictingRule,
                subject(key),
                format!("from-to-www-redirect: {from} is already served, so it does not redirect to {to}"),
            ));
            continue;
        }
        extra.insert(from_pattern, ExtraName::WwwRedirect(to.clone()));
    }
    extra
}

/// The certificates of the extra names, where no Ingress gives them one: an alias is served
/// with its host's (ingress-nginx lists it in the host's server block), a www-redirect name
/// with its target's when that covers it (ingress-nginx's rule), else the default.
fn extra_certificates(
    tls: &mut HostTable<Arc<certs::Certificate>>,
    extra: &BTreeMap<HostPattern, ExtraName>,
) {
    let certificate_of = |tls: &HostTable<Arc<certs::Certificate>>, pattern: &HostPattern| {
        tls.iter()
            .find(|(p, _)| p == pattern)
            .map(|(_, cert)| cert.clone())
    };
    for (name, extra) in extra {
        if certificate_of(tls, name).is_some() {
            continue;
        }
        let cert = match extra {
            ExtraName::Alias(of) => certificate_of(tls, of),
            ExtraName::WwwRedirect(to) => certificate_of(tls, &HostPattern::Exact(to.clone()))
                .filter(|cert| cert.covers(name)),
        };
        if let Some(cert) = cert {
            tls.insert(name.clone(), cert);
        }
    }
}

/// A host's rules recompiled for ingress-nginx's regex mode; a path that is not a valid regex
/// there is diagnosed and not served.
fn nginx_regex_rules(
    pattern: &HostPattern,
    rules: Vec<PathRule<Arc<Route>>>,
    diagnostics: &mut Vec<Diagnostic>,
) -> Vec<PathRule<Arc<Route>>> {
    rules
        .into_iter()
        .filter_map(|rule| match path::compile_nginx_regex(&rule.path) {
            Ok(kind) => Some(PathRule { kind, ..rule }),
            Err(err) => {
                diagnostics.push(Diagnostic::error(
                    DiagnosticKind::InvalidRegex,
                    Subject::object(Kind::Ingress, &rule.target.ingress),
                    format!("host {pattern} uses regex paths (use-regex or rewrite-target on one of its Ingresses): {err}; this path is not served"),
                ));
                None
            }
        })
        .collect()
}

/// A route's policy at the Ingress path `path`: under `no_auth_locations` (a string prefix of
/// the path as written, ingress-nginx's `isLocationInLocationList`) the external auth is
/// dropped, global or the Ingress's own, as ingress-nginx's template drops its
/// `auth_request` (basic auth stays); elsewhere a global auth that cannot be honoured
/// (`global_refused`) refuses the route (the `bool`).
fn path_auth(
    policy: &Arc<RoutePolicy>,
    path: &str,
    no_auth_locations: &[String],
    global_refused: Option<&Arc<str>>,
) -> (Arc<RoutePolicy>, bool) {
    if annotations::auth::is_no_auth_location(path, no_auth_locations) {
        if policy.access.auth.external.is_none() {
            return (policy.clone(), false);
        }
        let mut open = (**policy).clone();
        open.access.auth.external = None;
        return (Arc::new(open), false);
    }
    match global_refused {
        Some(reason) if policy.access.refused.is_none() => {
            let mut refused = (**policy).clone();
            refused.access.refused = Some(reason.clone());
            (Arc::new(refused), true)
        }
        Some(_) => (policy.clone(), true),
        None => (policy.clone(), false),
    }
}

/// Our Ingresses, oldest first: on a conflict the older definition wins, as in ingress-nginx.
fn owned_ingresses<'s>(
    store: &'s Store,
    class: &ClassSelector,
) -> Vec<(&'s ObjectKey, &'s Ingress)> {
    let mut owned: Vec<(&ObjectKey, &Ingress)> = store
        .ingresses
        .iter()
        .filter(|(_, ing)| class.owns(ing, &store.ingress_classes))
        .map(|(k, ing)| (k, ing.as_ref()))
        .collect();
    owned.sort_by_key(|(key, ing)| (ing.metadata.creation_timestamp.as_ref().map(|t| t.0), *key));
    owned
}

struct Builder<'s> {
    /// `add-headers` and `proxy-set-headers`: the headers of every route.
    config_headers: policy::ConfigHeaders,
    /// `global-allowed-response-headers`: what `custom-headers` may set.
    allowed_response_headers: Arc<[String]>,
    /// `--proxy-body-size`.
    max_body: Option<u64>,
    /// `--allow-snippet-annotations`.
    allow_snippets: bool,
    /// The global source ranges.
    default_sources: sources::SourcePolicy,
    /// The global source ranges that did not parse: routes that would use them are refused.
    sources_invalid: Option<global::InvalidRanges>,
    /// An unsupported global access control: every Ingress is refused.
    access_refused: Option<Arc<str>>,
    /// The ConfigMap's `ssl-redirect`: for Ingresses without the annotation.
    ssl_redirect: bool,
    /// See [`Prepared::auth_addresses`].
    auth_addresses: address::AddressPolicy,
    /// The ConfigMap's global external auth (its auth service held to `auth_addresses`, as an
    /// `auth-url`'s) and `no-auth-locations`.
    global_auth: GlobalAuth,
    /// The age rank of the Ingress being added (0 is the oldest).
    rank: usize,
    store: &'s Store,
    diagnostics: Vec<Diagnostic>,
    resolver: Resolver<'s>,
    unsupported_access: UnsupportedAccess,
    tls: tls::TlsBuilder<'s>,
    hosts: BTreeMap<HostPattern, HostBuilder>,
    /// Passthrough host → its route and the Ingress that claimed it first.
    passthrough: BTreeMap<HostPattern, Arc<Route>>,
    default_backend: Option<Arc<Route>>,
    /// Ingresses with `custom-http-errors` and no `default-backend` of their own: they need
    /// the global default backend.
    errors_without_backend: Vec<(ObjectKey, String)>,
}

#[derive(Default)]
struct HostBuilder {
    rules: Vec<PathRule<Arc<Route>>>,
    /// (path, type) to the Ingress that defined it first.
    seen: HashMap<(String, &'static str), ObjectKey>,
    default_backend: Option<Arc<Route>>,
    policy: HostPolicy,
    /// `use-regex`, or a `rewrite-target` that differs from its path, on one of its Ingresses.
    nginx_regex: bool,
    /// `server-alias` of the oldest Ingress that sets one for this host, with that Ingress's
    /// age rank (0 is the oldest).
    aliases: Option<(usize, ObjectKey, Vec<HostPattern>)>,
    /// The oldest Ingress that asks for `from-to-www-redirect` on this host, with its rank.
    www: Option<(usize, ObjectKey)>,
}

/// Without an error backend, what `custom-http-errors` that needs one says.
const NO_ERROR_BACKEND: &str = "there is no error backend (no default-backend annotation, no --default-backend-service, no Ingress with only a spec.defaultBackend); the error responses are passed on as they are";

impl<'s> Builder<'s> {
    /// A builder with the global configuration `prepared`, resolving backends from `resolved`
    /// (what an earlier build resolved that is still valid) onwards.
    fn new(
        store: &'s Store,
        settings: &'s BuildSettings,
        prepared: &Prepared,
        resolved: backend::Resolved,
    ) -> Self {
        let global = &prepared.global;
        Builder {
            config_headers: prepared.config_headers.clone(),
            allowed_response_headers: global.headers.allowed_response_headers.clone(),
            max_body: global.max_body,
            allow_snippets: global.allow_snippets,
            default_sources: global.sources.clone(),
            sources_invalid: global.sources_invalid.clone(),
            access_refused: global.access_refused.clone(),
            ssl_redirect: global.ssl_redirect,
            auth_addresses: prepared.auth_addresses.clone(),
            global_auth: global.auth.clone(),
            rank: 0,
            store,
            diagnostics: Vec::new(),
            resolver: Resolver::with(store, &settings.backends, resolved),
            unsupported_access: settings.unsupported_access,
            tls: tls::TlsBuilder::new(store, &settings.tls),
            hosts: BTreeMap::new(),
            passthrough: BTreeMap::new(),
            default_backend: None,
            errors_without_backend: Vec::new(),
        }
    }

    /// The warning for an Ingress whose `custom-http-errors` (`written`) needs the error
    /// backend there is not.
    fn no_error_backend(key: &ObjectKey, written: &str) -> Diagnostic {
        Diagnostic::warning(
            DiagnosticKind::InvalidAnnotation,
            Subject::object(Kind::Ingress, key),
            format!("{written}: {NO_ERROR_BACKEND}"),
        )
    }

    fn add_ingress(&mut self, key: &ObjectKey, ingress: &Ingress) {
        let subject = Subject::object(Kind::Ingress, key);
        let (mut options, errors) = annotations::parse(ingress.metadata.annotations.as_ref());
        for message in errors {
            self.diagnostics.push(Diagnostic::error(
                DiagnosticKind::InvalidAnnotation,
                subject.clone(),
                message,
            ));
        }
        if let Some(name) = options.proxy_ssl_secret.take() {
            match upstream::secret_tls(self.store, key, &name, &mut options.upstream_tls) {
                Ok(()) => {}
                Err((kind, message)) => {
                    self.diagnostics
                        .push(Diagnostic::error(kind, subject.clone(), message));
                }
            }
        }
        let (snippets, errors) =
            annotations::snippets(ingress.metadata.annotations.as_ref(), self.allow_snippets);
        options.snippets = snippets.map(Arc::new);
        for message in errors {
            self.diagnostics.push(Diagnostic::warning(
                DiagnosticKind::InvalidAnnotation,
                subject.clone(),
                message,
            ));
        }
        let mut refused = None;
        match headers::ingress(
            self.store,
            key,
            ingress.metadata.annotations.as_ref(),
            &self.config_headers,
            &self.allowed_response_headers,
        ) {
            Ok(headers) => options.config_headers = headers,
            Err((kind, message)) => {
                self.diagnostics.push(Diagnostic::error(
                    kind,
                    subject.clone(),
                    format!("{message}; this Ingress is not served (503), as ingress-nginx denies its locations"),
                ));
                refused = Some(Arc::from(message));
            }
        }
        if options.x_forwarded_prefix.is_some() && options.rewrite_target.is_none() {
            self.diagnostics.push(Diagnostic::warning(
                DiagnosticKind::InvalidAnnotation,
                subject.clone(),
                "x-forwarded-prefix is only sent with a rewritten request (as in ingress-nginx); without rewrite-target it has no effect",
            ));
        }
        if options.ssl_redirect.is_none() {
            options.ssl_redirect = Some(self.ssl_redirect);
        }
        if let Some(reason) = self.judge_unsupported(&subject, ingress) {
            refused = Some(reason);
        }
        if let Some(reason) = &self.access_refused {
            refused.get_or_insert_with(|| reason.clone());
        }
        if let Some(invalid) = &self.sources_invalid {
            let (own_allow, own_deny) =
                annotations::sets_source_ranges(ingress.metadata.annotations.as_ref());
            if (invalid.allow && !own_allow) || (invalid.deny && !own_deny) {
                refused.get_or_insert_with(|| invalid.message.clone());
            }
        }
        let sources = match annotations::source_ranges(
            ingress.metadata.annotations.as_ref(),
            &self.default_sources,
        ) {
            Ok(sources) => sources,
            Err(message) => {
                self.diagnostics.push(Diagnostic::error(
                    DiagnosticKind::InvalidAnnotation,
                    subject.clone(),
                    format!("{message}; this Ingress is not served (503) rather than served without its source ranges"),
                ));
                refused
                    .get_or_insert_with(|| Arc::from(format!("invalid source range: {message}")));
                sources::SourcePolicy::default()
            }
        };
        let mut auth = self.auth(&subject, key, ingress, &mut refused);
        let global_refused = self.global_auth_of(&subject, ingress, &mut auth);
        let (client_auth, client_auth_error) =
            match self.client_auth(&subject, key, ingress, &options) {
                Ok(auth) => (auth, None),
                Err(reason) => {
                    refused.get_or_insert_with(|| reason.clone());
                    (None, Some(reason))
                }
            };
        let zone = format!(
            "{key}/{}",
            ingress.metadata.uid.as_deref().unwrap_or_default()
        );
        let rate_limit = match annotations::rate_limit::parse(
            ingress.metadata.annotations.as_ref(),
            &zone,
        ) {
            Ok(limit) => limit.map(Arc::new),
            Err(message) => {
                self.diagnostics.push(Diagnostic::error(
                        DiagnosticKind::InvalidAnnotation,
                        subject.clone(),
                        format!("{message}; this Ingress is not served (503) rather than served without its rate limits"),
                    ));
                refused.get_or_insert_with(|| Arc::from(format!("invalid rate limit: {message}")));
                None
            }
        };
        let bandwidth = match annotations::rate_limit::bandwidth(
            ingress.metadata.annotations.as_ref(),
        ) {
            Ok(bandwidth) => bandwidth,
            Err(message) => {
                self.diagnostics.push(Diagnostic::error(
                    DiagnosticKind::InvalidAnnotation,
                    subject.clone(),
                    format!("{message}; this Ingress is not served (503) rather than served without its limit"),
                ));
                refused.get_or_insert_with(|| Arc::from(format!("invalid limit-rate: {message}")));
                None
            }
        };
        // A passthrough connection is never an HTTP request here: no limit could be counted.
        if options.ssl_passthrough && (rate_limit.is_some() || bandwidth.is_some()) {
            let message = "limit-* cannot apply to ssl-passthrough: its connections are not HTTP requests here";
            self.diagnostics.push(Diagnostic::error(
                DiagnosticKind::InvalidAnnotation,
                subject.clone(),
                format!(
                    "{message}; this Ingress is not served rather than served without its limits"
                ),
            ));
            refused.get_or_insert_with(|| Arc::from(message));
        }
        let fallback = options
            .default_backend
            .as_ref()
            .and_then(|name| self.fallback(&subject, key, name));
        if options.custom_http_errors.is_some() && fallback.is_none() {
            // Named as written, so the migration report finds it (this project's prefix wins).
            let own = format!("{}custom-http-errors", annotations::PREFIX);
            let written = ingress
                .metadata
                .annotations
                .as_ref()
                .is_some_and(|a| a.contains_key(&own));
            let name = if written {
                own
            } else {
                format!("{}custom-http-errors", annotations::NGINX_PREFIX)
            };
            self.errors_without_backend.push((key.clone(), name));
        }
        // A route's policy depends on the Ingress and on whether its host has TLS here.
        let policies = [false, true].map(|tls| {
            Arc::new(
                RoutePolicy::new(&options, tls, refused.as_ref(), self.max_body)
                    .with_sources(&sources)
                    .with_auth(&auth)
                    .with_rate_limit(rate_limit.as_ref())
                    .with_bandwidth(bandwidth)
                    .with_fallback(fallback.as_ref()),
            )
        });
        let Some(spec) = &ingress.spec else { return };
        let rules = spec.rules.as_deref().unwrap_or_default();
        let tls_hosts = self.tls.add_ingress(key, ingress, &mut self.diagnostics);
        let default_route = spec.default_backend.as_ref().and_then(|b| {
            let (policy, path_refused) = path_auth(
                &policies[0],
                "/",
                &self.global_auth.no_auth_locations,
                global_refused.as_ref(),
            );
            self.route(
                key,
                b,
                "/",
                &policy,
                false,
                refused.is_some() || path_refused,
            )
        });

        if options.ssl_passthrough {
            self.add_passthrough(
                key,
                rules,
                default_route.as_ref(),
                &policies[0],
                refused.is_some(),
            );
        }

        if rules.is_empty() {
            match (&default_route, &self.default_backend) {
                (Some(route), None) => self.default_backend = Some(route.clone()),
                (Some(_), Some(existing)) => self.diagnostics.push(Diagnostic::error(
                    DiagnosticKind::ConflictingRule,
                    subject.clone(),
                    format!(
                        "the default backend is already set by Ingress {}; this one is ignored",
                        existing.ingress
                    ),
                )),
                (None, _) => {}
            }
        }

        for rule in rules {
            let pattern = match host::parse_pattern(rule.host.as_deref()) {
                Ok(p) => p,
                Err(err) => {
                    self.diagnostics.push(Diagnostic::error(
                        DiagnosticKind::InvalidHost,
                        subject.clone(),
                        err.to_string(),
                    ));
                    continue;
                }
            };
            let tls = tls_hosts.contains(&pattern);
            let host = self.hosts.entry(pattern.clone()).or_default();
            if host.default_backend.is_none() {
                host.default_backend = default_route.clone();
            }
            host.nginx_regex |= options.use_regex;
            if options.from_to_www && host.www.is_none() {
                host.www = Some((self.rank, key.clone()));
            }
            if !options.server_alias.is_empty() && host.aliases.is_none() {
                let aliases = options
                    .server_alias
                    .iter()
                    .filter_map(|a| host::parse_pattern(Some(a)).ok())
                    .collect();
                host.aliases = Some((self.rank, key.clone(), aliases));
            }
            if let Some(app_root) = &options.app_root {
                match &host.policy.app_root {
                    None => host.policy.app_root = Some(app_root.clone()),
                    Some(existing) if existing != app_root => {
                        self.diagnostics.push(Diagnostic::warning(
                            DiagnosticKind::ConflictingRule,
                            subject.clone(),
                            format!("host {pattern} already has app-root {existing} from an older Ingress; this one's {app_root} is ignored"),
                        ));
                    }
                    Some(_) => {}
                }
            }
            if let Some(reason) = &client_auth_error
                && host.policy.client_auth_error.is_none()
            {
                host.policy.client_auth_error = Some(reason.clone());
            }
            if let Some(auth) = &client_auth {
                match &host.policy.client_auth {
                    None => host.policy.client_auth = Some(auth.clone()),
                    Some(existing) if existing != auth => {
                        self.diagnostics.push(Diagnostic::warning(
                            DiagnosticKind::ConflictingRule,
                            subject.clone(),
                            format!("host {pattern} already has auth-tls (secret {}) from an older Ingress; it applies to this Ingress's paths too (as nginx's server-wide ssl_verify_client), and this one's is ignored", existing.secret),
                        ));
                    }
                    Some(_) => {}
                }
            }
            let paths = rule
                .http
                .as_ref()
                .map(|h| h.paths.as_slice())
                .unwrap_or_default();
            for http_path in paths {
                // ingress-nginx reads a missing path as "/"; the API server requires one for
                // Exact and Prefix, so only hand-written manifests lack it.
                let path = http_path.path.clone().unwrap_or_else(|| "/".into());
                let kind = match path::compile(&path, &http_path.path_type) {
                    Ok(kind) => kind,
                    Err(err) => {
                        let diag_kind = match err {
                            path::PathError::Regex { .. } => DiagnosticKind::InvalidRegex,
                            _ => DiagnosticKind::InvalidPath,
                        };
                        self.diagnostics.push(Diagnostic::error(
                            diag_kind,
                            subject.clone(),
                            format!("host {pattern}: {err}; this path is not served"),
                        ));
                        continue;
                    }
                };
                let seen_key = (path.clone(), kind.as_str());
                let host = self.hosts.entry(pattern.clone()).or_default();
                if let Some(first) = host.seen.get(&seen_key) {
                    if first != key {
                        let message = format!(
                            "host {pattern} path {path} ({}) is already defined by Ingress {first}; this rule is ignored",
                            kind.as_str()
                        );
                        self.diagnostics.push(Diagnostic::error(
                            DiagnosticKind::ConflictingRule,
                            subject.clone(),
                            message,
                        ));
                    }
                    continue;
                }
                host.seen.insert(seen_key, key.clone());
                let (policy, path_refused) = path_auth(
                    &policies[usize::from(tls)],
                    &path,
                    &self.global_auth.no_auth_locations,
                    global_refused.as_ref(),
                );
                let mut policy = policy.for_path(&path);
                match Rewrite::for_path(&options, &path) {
                    None => {}
                    Some(Ok(rewrite)) => {
                        host.nginx_regex = true;
                        policy = Arc::new(RoutePolicy {
                            rewrite: RewritePolicy {
                                target: Some(rewrite),
                            },
                            ..(*policy).clone()
                        });
                    }
                    Some(Err(err)) => self.diagnostics.push(Diagnostic::error(
                        DiagnosticKind::InvalidAnnotation,
                        subject.clone(),
                        format!("host {pattern} path {path}: rewrite-target needs the path as a regex, and it is not one ({err}); requests on it are not rewritten"),
                    )),
                }
                let Some(route) = self.route(
                    key,
                    &http_path.backend,
                    &path,
                    &policy,
                    tls,
                    refused.is_some() || path_refused,
                ) else {
                    continue;
                };
                if let Some(host) = self.hosts.get_mut(&pattern) {
                    host.rules.push(PathRule {
                        path,
                        kind,
                        target: route,
                    });
                }
            }
        }
    }

    /// A canary Ingress (`canary: "true"`): each of its paths becomes the canary of the main
    /// route with the same host, path and type (ingress-nginx's rule); it serves nothing by
    /// itself, and its other annotations have no effect (the main Ingress's apply).
    fn add_canary(&mut self, key: &ObjectKey, ingress: &Ingress) {
        let subject = Subject::object(Kind::Ingress, key);
        let (options, errors) = annotations::parse(ingress.metadata.annotations.as_ref());
        for message in errors {
            self.diagnostics.push(Diagnostic::error(
                DiagnosticKind::InvalidAnnotation,
                subject.clone(),
                message,
            ));
        }
        let Some(rules) = options.canary else { return };
        for name in ingress.metadata.annotations.iter().flat_map(|a| a.keys()) {
            let Some(short) = name
                .strip_prefix(annotations::NGINX_PREFIX)
                .or_else(|| name.strip_prefix(annotations::PREFIX))
            else {
                continue;
            };
            if !short.starts_with("canary") && short != "affinity-canary-behavior" {
                self.diagnostics.push(Diagnostic::warning(
                    DiagnosticKind::UnsupportedAnnotation,
                    subject.clone(),
                    format!("{name} has no effect on a canary Ingress: canary traffic gets the main Ingress's annotations, including its affinity, as in ingress-nginx (whose exceptions, load-balance, upstream-hash-by and session affinity of the canary itself, are not supported here)"),
                ));
            }
        }
        let Some(spec) = &ingress.spec else { return };
        if spec.default_backend.is_some() {
            self.diagnostics.push(Diagnostic::warning(
                DiagnosticKind::CanaryUnmatched,
                subject.clone(),
                "the defaultBackend of a canary Ingress is not supported as a canary; it is not used",
            ));
        }
        let placeholder = Arc::new(RoutePolicy::default());
        for rule in spec.rules.as_deref().unwrap_or_default() {
            let pattern = match host::parse_pattern(rule.host.as_deref()) {
                Ok(p) => p,
                Err(err) => {
                    self.diagnostics.push(Diagnostic::error(
                        DiagnosticKind::InvalidHost,
                        subject.clone(),
                        err.to_string(),
                    ));
                    continue;
                }
            };
            let paths = rule
                .http
                .as_ref()
                .map(|h| h.paths.as_slice())
                .unwrap_or_default();
            for http_path in paths {
                let path = http_path.path.clone().unwrap_or_else(|| "/".into());
                let ty = http_path.path_type.as_str();
                let kind = match path::compile(&path, ty) {
                    Ok(kind) => kind.as_str(),
                    Err(err) => {
                        self.diagnostics.push(Diagnostic::error(
                            DiagnosticKind::InvalidPath,
                            subject.clone(),
                            format!("host {pattern}: {err}; this canary path is not used"),
                        ));
                        continue;
                    }
                };
                let main = self
                    .hosts
                    .get(&pattern)
                    .and_then(|h| h.seen.get(&(path.clone(), kind)))
                    .cloned();
                let Some(main) = main else {
                    self.diagnostics.push(Diagnostic::warning(
                        DiagnosticKind::CanaryUnmatched,
                        subject.clone(),
                        format!("no main Ingress serves host {pattern} path {path} ({ty}); this canary path is not used"),
                    ));
                    continue;
                };
                let Some(canary) =
                    self.route(key, &http_path.backend, &path, &placeholder, false, false)
                else {
                    continue;
                };
                let Some(host) = self.hosts.get_mut(&pattern) else {
                    continue;
                };
                let Some(rule) = host.rules.iter_mut().find(|r| {
                    r.path == path && r.kind.as_str() == kind && r.target.ingress == main
                }) else {
                    continue;
                };
                let old = &rule.target;
                let problem = if let Some(existing) = &old.policy.canary {
                    Some(format!(
                        "host {pattern} path {path} already has the canary Ingress {}; ingress-nginx uses one canary per path, so this one is not used",
                        existing.ingress
                    ))
                } else if old.backend.service == canary.backend.service
                    && old.backend.port == canary.backend.port
                {
                    Some(format!(
                        "host {pattern} path {path}: the canary's backend is the main Ingress's own; it is not used"
                    ))
                } else {
                    None
                };
                if let Some(message) = problem {
                    self.diagnostics.push(Diagnostic::warning(
                        DiagnosticKind::ConflictingRule,
                        subject.clone(),
                        message,
                    ));
                    continue;
                }
                let policy = RoutePolicy {
                    canary: Some(Arc::new(CanaryPolicy {
                        rules: rules.clone(),
                        backend: canary.backend.clone(),
                        ingress: key.clone(),
                        sticky: !options.affinity_canary_legacy,
                    })),
                    ..(*old.policy).clone()
                };
                rule.target = Arc::new(Route {
                    ingress: old.ingress.clone(),
                    tls: old.tls,
                    backend: old.backend.clone(),
                    policy: Arc::new(policy),
                    labels: old.labels.clone(),
                });
            }
        }
    }

    /// `ssl-passthrough`: each rule's host is routed by SNI to the backend of its `/` path (or
    /// its only path, or the Ingress's default backend). The TLS stream is not terminated, so
    /// paths mean nothing; more than that one path is a warning.
    fn add_passthrough(
        &mut self,
        key: &ObjectKey,
        rules: &[k8s_openapi::api::networking::v1::IngressRule],
        default_route: Option<&Arc<Route>>,
        policy: &Arc<RoutePolicy>,
        refused: bool,
    ) {
        let subject = Subject::object(Kind::Ingress, key);
        for rule in rules {
            let pattern = match host::parse_pattern(rule.host.as_deref()) {
                Ok(HostPattern::Any) => {
                    self.diagnostics.push(Diagnostic::error(
                        DiagnosticKind::InvalidAnnotation,
                        subject.clone(),
                        "ssl-passthrough routes by TLS server name, so every rule needs a host; the rule without one is not passed through",
                    ));
                    continue;
                }
                Ok(p) => p,
                // Reported once by the HTTP rule processing.
                Err(_) => continue,
            };
            let paths = rule
                .http
                .as_ref()
                .map(|h| h.paths.as_slice())
                .unwrap_or_default();
            let chosen = paths
                .iter()
                .find(|p| p.path.as_deref().unwrap_or("/") == "/")
                .or(paths.first());
            if paths.len() > 1 || chosen.is_some_and(|p| p.path.as_deref().unwrap_or("/") != "/") {
                self.diagnostics.push(Diagnostic::warning(
                    DiagnosticKind::PassthroughPathsIgnored,
                    subject.clone(),
                    format!("host {pattern} is ssl-passthrough: TLS is not terminated, so paths cannot be matched; every connection goes to the backend of {}", chosen.and_then(|p| p.path.clone()).unwrap_or_else(|| "/".into())),
                ));
            }
            let route = match chosen {
                Some(path) => self.route(
                    key,
                    &path.backend,
                    path.path.as_deref().unwrap_or("/"),
                    policy,
                    false,
                    refused,
                ),
                None => default_route.cloned(),
            };
            let Some(route) = route else { continue };
            match self.passthrough.get(&pattern) {
                Some(existing) if existing.ingress != *key => self.diagnostics.push(Diagnostic::error(
                    DiagnosticKind::ConflictingRule,
                    subject.clone(),
                    format!("host {pattern} is already passed through by Ingress {}; this one is ignored for it", existing.ingress),
                )),
                Some(_) => {}
                None => {
                    self.passthrough.insert(pattern, route);
                }
            }
        }
    }

    /// The global default backend, the error backend of `custom-http-errors` on routes
    /// without a `default-backend` of their own: `--default-backend-service` on its first port
    /// (ingress-nginx's), else the backend of the Ingress with only a `spec.defaultBackend`
    /// (this project's unmatched-host backend, the closest thing to ingress-nginx's default
    /// server). Without one, each list that needs it is a warning and has no effect.
    fn error_backend(
        &mut self,
        global: &global::GlobalSettings,
        config_map: Option<&ObjectKey>,
    ) -> Option<policy::Fallback> {
        let backend = match &global.default_backend_service {
            Some(service) => match self.resolver.first_port(service) {
                Some(port) => {
                    let (backend, problems) = self.resolver.resolve(service.clone(), port, false);
                    for problem in problems {
                        self.diagnostics.push(Diagnostic::warning(
                            problem.kind,
                            Subject::object(Kind::Service, service),
                            format!("--default-backend-service: {}", problem.message),
                        ));
                    }
                    Some(backend)
                }
                None => {
                    self.diagnostics.push(Diagnostic::warning(
                        DiagnosticKind::ServiceNotFound,
                        Subject::object(Kind::Service, service),
                        format!("--default-backend-service: service {service} does not exist or has no port; custom-http-errors has no effect where it needs the global default backend"),
                    ));
                    None
                }
            },
            None => self.default_backend.as_ref().map(|r| r.backend.clone()),
        };
        if backend.is_none() {
            let why = NO_ERROR_BACKEND;
            if let Some(key) = config_map.filter(|_| !global.custom_http_errors.is_empty()) {
                self.diagnostics.push(Diagnostic::warning(
                    DiagnosticKind::InvalidConfigValue,
                    Subject::object(Kind::ConfigMap, key),
                    format!("custom-http-errors: {why}"),
                ));
            }
        }
        backend.map(policy::Fallback)
    }

    /// The backend of a `default-backend` annotation: the Service `name` of the Ingress's
    /// namespace, on its first port (as ingress-nginx). A Service that is missing or has no
    /// port is an `InvalidAnnotation` error and no fallback is used.
    fn fallback(
        &mut self,
        subject: &Subject,
        ingress: &ObjectKey,
        name: &str,
    ) -> Option<Arc<backend::Backend>> {
        let service = ObjectKey::new(ingress.namespace.clone(), name.to_string());
        let Some(port) = self.resolver.first_port(&service) else {
            self.diagnostics.push(Diagnostic::error(
                DiagnosticKind::InvalidAnnotation,
                subject.clone(),
                format!("{}default-backend: service {service} does not exist or has no port; no fallback is used", annotations::NGINX_PREFIX),
            ));
            return None;
        };
        let (backend, problems) = self.resolver.resolve(service, port, false);
        for problem in problems {
            self.diagnostics.push(Diagnostic::warning(
                problem.kind,
                subject.clone(),
                format!("default-backend: {}", problem.message),
            ));
        }
        Some(backend)
    }

    /// The authentication an Ingress asks for. One that cannot be honoured as written (a
    /// missing Secret, an unreadable hash, a bad value) is an error and refuses the Ingress
    /// (503): never served open.
    fn auth(
        &mut self,
        subject: &Subject,
        key: &ObjectKey,
        ingress: &Ingress,
        refused: &mut Option<Arc<str>>,
    ) -> AuthPolicy {
        let annotations = ingress.metadata.annotations.as_ref();
        let policy = annotations::auth::satisfy(annotations).and_then(|satisfy| {
            let mut external = annotations::auth::external(annotations, &self.auth_addresses)?;
            if let Some(external) = &mut external {
                external.proxy_set_headers = headers::auth(self.store, key, annotations)?;
            }
            let (basic, digest) = match annotations::auth::password(annotations, self.store, key)? {
                None => (None, None),
                Some(annotations::auth::PasswordAuth::Basic(b)) => (Some(Arc::new(b)), None),
                Some(annotations::auth::PasswordAuth::Digest(d)) => (None, Some(Arc::new(d))),
            };
            Ok(AuthPolicy {
                basic,
                digest,
                external: external.map(Arc::new),
                satisfy,
            })
        });
        match policy {
            Ok(policy) => {
                // As in ingress-nginx, whose auth-url parser reads it: alone it does nothing.
                if policy.external.is_none()
                    && let Some((written, _)) =
                        annotations.and_then(|a| annotations::lookup(a, "auth-proxy-set-headers"))
                {
                    self.diagnostics.push(Diagnostic::warning(
                        DiagnosticKind::InvalidAnnotation,
                        subject.clone(),
                        format!("{written}: has no effect without auth-url"),
                    ));
                }
                policy
            }
            Err((kind, message)) => {
                self.diagnostics.push(Diagnostic::error(
                    kind,
                    subject.clone(),
                    format!("{message}; this Ingress is not served (503) rather than served without its authentication"),
                ));
                refused.get_or_insert_with(|| Arc::from(format!("authentication: {message}")));
                AuthPolicy::default()
            }
        }
    }

    /// The ConfigMap's global external auth for an Ingress, as ingress-nginx's template
    /// applies it: on every route unless the Ingress has its own `auth-url` (which wins) or
    /// sets `enable-global-auth: "false"`. Set into `auth` when it applies; `Some(reason)`
    /// when it applies but cannot be honoured (its routes are refused, path by path, so the
    /// `no-auth-locations` ones stay up).
    fn global_auth_of(
        &mut self,
        subject: &Subject,
        ingress: &Ingress,
        auth: &mut AuthPolicy,
    ) -> Option<Arc<str>> {
        let annotations = ingress.metadata.annotations.as_ref();
        let (enabled, problem) = annotations::auth::enable_global_auth(annotations);
        if let Some(message) = problem {
            self.diagnostics.push(Diagnostic::warning(
                DiagnosticKind::InvalidAnnotation,
                subject.clone(),
                message,
            ));
        }
        if !enabled || annotations::auth::sets_auth_url(annotations) {
            return None;
        }
        match self.global_auth.external.as_ref()? {
            Ok(external) => {
                auth.external = Some(external.clone());
                None
            }
            Err(reason) => Some(reason.clone()),
        }
    }

    /// The `auth-tls-*` rules of an Ingress, with its CA Secret parsed. Anything that keeps
    /// them from being applied as written is `Err` with the reason: the Ingress is refused
    /// (503), and so are its hosts unless another Ingress protects them (nginx's `server` is
    /// protected as a whole), never served without the client certificate asked for.
    fn client_auth(
        &mut self,
        subject: &Subject,
        key: &ObjectKey,
        ingress: &Ingress,
        options: &annotations::Options,
    ) -> Result<Option<Arc<client_auth::ClientAuth>>, Arc<str>> {
        let parsed = annotations::auth_tls::parse(ingress.metadata.annotations.as_ref());
        for message in parsed.warnings {
            self.diagnostics.push(Diagnostic::warning(
                DiagnosticKind::InvalidAnnotation,
                subject.clone(),
                message,
            ));
        }
        let refuse = |this: &mut Self, kind: DiagnosticKind, message: String| {
            this.diagnostics.push(Diagnostic::error(
                kind,
                subject.clone(),
                format!("{message}; this Ingress and its hosts are not served (503) rather than served without the client certificate it asks for"),
            ));
            Err(Arc::from(format!("auth-tls: {message}")))
        };
        if !parsed.errors.is_empty() {
            return refuse(
                self,
                DiagnosticKind::InvalidAnnotation,
                parsed.errors.join("; "),
            );
        }
        let Some(auth) = parsed.auth else {
            return Ok(None);
        };
        if options.ssl_passthrough {
            return refuse(
                self,
                DiagnosticKind::InvalidAnnotation,
                "auth-tls-secret cannot apply to ssl-passthrough: TLS is not terminated here"
                    .into(),
            );
        }
        let has_rules = ingress
            .spec
            .as_ref()
            .and_then(|s| s.rules.as_ref())
            .is_some_and(|r| !r.is_empty());
        if !has_rules {
            return refuse(
                self,
                DiagnosticKind::InvalidAnnotation,
                "auth-tls-secret applies to the hosts of an Ingress's rules, and this one has none"
                    .into(),
            );
        }
        let namespace = auth
            .secret
            .0
            .clone()
            .unwrap_or_else(|| key.namespace.clone());
        if namespace != key.namespace {
            return refuse(
                self,
                DiagnosticKind::InvalidAnnotation,
                format!(
                    "auth-tls-secret: secret {namespace}/{} is in another namespace, which is not allowed (as ingress-nginx's default)",
                    auth.secret.1
                ),
            );
        }
        let secret_key = ObjectKey::new(namespace, auth.secret.1.clone());
        let Some(secret) = self.store.secret(&secret_key) else {
            return refuse(
                self,
                DiagnosticKind::SecretNotFound,
                format!("auth-tls-secret: secret {secret_key} not found"),
            );
        };
        match client_auth::ClientAuth::from_secret(&secret_key, secret, &auth) {
            Ok(parsed) => Ok(Some(Arc::new(parsed))),
            Err(err) => refuse(
                self,
                DiagnosticKind::SecretInvalid,
                format!("auth-tls-secret: secret {secret_key}: {err}"),
            ),
        }
    }

    /// Diagnoses the annotations `ingress` carries that are not honoured. Returns why it must not
    /// be served, if one of them is access control and the policy is to refuse.
    fn judge_unsupported(&mut self, subject: &Subject, ingress: &Ingress) -> Option<Arc<str>> {
        let mut refusing = Vec::new();
        for u in annotations::unsupported(ingress.metadata.annotations.as_ref()) {
            let what = if u.known {
                format!("{} ({})", u.key, u.category)
            } else {
                format!(
                    "{} (not an ingress-nginx annotation; {})",
                    u.key, u.category
                )
            };
            let diagnostic = match (u.category, self.unsupported_access) {
                (Category::AccessControl, UnsupportedAccess::Refuse) => {
                    let message = format!(
                        "{what} is not supported, so this Ingress is not served: every path it declares answers 503 rather than being served without the access control it asks for (--unsupported-access-annotations=ignore serves it anyway)"
                    );
                    refusing.push(u.key);
                    Diagnostic::error(
                        DiagnosticKind::UnsupportedAnnotation,
                        subject.clone(),
                        message,
                    )
                }
                (Category::AccessControl, UnsupportedAccess::Ignore) => Diagnostic::warning(
                    DiagnosticKind::UnsupportedAnnotation,
                    subject.clone(),
                    format!(
                        "{what} is not supported; this Ingress is served WITHOUT that access control (--unsupported-access-annotations=ignore)"
                    ),
                ),
                _ => Diagnostic::warning(
                    DiagnosticKind::UnsupportedAnnotation,
                    subject.clone(),
                    format!("{what} is not supported and has no effect"),
                ),
            };
            self.diagnostics.push(diagnostic);
        }
        (!refusing.is_empty()).then(|| {
            format!(
                "unsupported access-control annotation: {}",
                refusing.join(", ")
            )
            .into()
        })
    }

    /// A route to `backend` for `ingress`, recording any problem on the Ingress. `None` only if
    /// the backend reference itself is unusable; a missing Service still routes (to a 503). A
    /// refused Ingress gets a route whatever its backend (its policy refuses every request), so
    /// its paths stay claimed; its backend is not resolved.
    fn route(
        &mut self,
        ingress: &ObjectKey,
        backend: &IngressBackend,
        path: &str,
        policy: &Arc<RoutePolicy>,
        tls: bool,
        refused: bool,
    ) -> Option<Arc<Route>> {
        if refused {
            let service = backend.service.as_ref();
            let backend = Backend {
                service: ObjectKey::new(
                    ingress.namespace.clone(),
                    service.map(|s| s.name.clone()).unwrap_or_default(),
                ),
                port: match service.and_then(|s| s.port.as_ref()) {
                    Some(p) if p.name.as_deref().is_some_and(|n| !n.is_empty()) => {
                        PortRef::Name(p.name.clone().unwrap_or_default())
                    }
                    Some(p) => PortRef::Number(p.number.unwrap_or_default()),
                    None => PortRef::Number(0),
                },
                target: Target::Unavailable,
                next: std::sync::atomic::AtomicUsize::new(0),
                app_protocol: None,
            };
            return Some(self.make_route(ingress, Arc::new(backend), path, policy, tls));
        }
        let subject = Subject::object(Kind::Ingress, ingress);
        let Some(service) = &backend.service else {
            self.diagnostics.push(Diagnostic::error(
                DiagnosticKind::UnsupportedBackend,
                subject,
                "resource backends are not supported; use a Service backend",
            ));
            return None;
        };
        let port = match service.port.as_ref() {
            Some(p) if p.name.as_deref().is_some_and(|n| !n.is_empty()) => {
                PortRef::Name(p.name.clone().unwrap_or_default())
            }
            Some(p) if p.number.is_some() => PortRef::Number(p.number.unwrap_or_default()),
            _ => {
                self.diagnostics.push(Diagnostic::error(
                    DiagnosticKind::ServicePortNotFound,
                    subject,
                    format!("backend service {} names no port", service.name),
                ));
                return None;
            }
        };
        let service_key = ObjectKey::new(ingress.namespace.clone(), service.name.clone());
        let cluster_ip = policy.upstream.service_upstream;
        let (backend, problems) = self.resolver.resolve(service_key, port, cluster_ip);
        for problem in problems {
            let severity = match problem.kind {
                DiagnosticKind::NoReadyEndpoints => Severity::Warning,
                _ => Severity::Error,
            };
            self.diagnostics.push(Diagnostic {
                severity,
                kind: problem.kind,
                subject: subject.clone(),
                message: problem.message.clone(),
            });
        }
        Some(self.make_route(ingress, backend, path, policy, tls))
    }

    fn make_route(
        &self,
        ingress: &ObjectKey,
        backend: Arc<Backend>,
        path: &str,
        policy: &Arc<RoutePolicy>,
        tls: bool,
    ) -> Arc<Route> {
        // The Service port's appProtocol, and the Service's name for TLS verification.
        let service_dns = format!("{}.{}.svc", backend.service.name, backend.service.namespace);
        let policy = match policy.for_backend(backend.app_protocol, &service_dns) {
            Some(changed) => Arc::new(changed),
            None => policy.clone(),
        };
        let labels = RouteLabels {
            namespace: ingress.namespace.as_str().into(),
            ingress: ingress.name.as_str().into(),
            service: backend.service.name.as_str().into(),
            path: path.into(),
        };
        Arc::new(Route {
            ingress: ingress.clone(),
            tls,
            backend,
            policy,
            labels,
        })
    }
}

#[cfg(test)]
mod tests;

/// Build settings for tests here and in the modules that publish snapshots.
#[cfg(test)]
pub(crate) mod testing {
    use super::address::AddressPolicy;
    use super::*;

    /// This node's address, as the settings below give it.
    pub const HOST_ADDRESS: &str = "10.9.9.9";

    pub fn settings() -> BuildSettings {
        static SELF_SIGNED: std::sync::LazyLock<Arc<crate::snapshot::certs::Certificate>> =
            std::sync::LazyLock::new(|| {
                Arc::new(crate::snapshot::certs::self_signed().expect("self-signed"))
            });
        BuildSettings {
            class: ClassSelector {
                ingress_class: "ingress".into(),
                controller_class: "ingress.rs/controller".into(),
            },
            tls: tls::TlsSettings {
                default_certificate: None,
                self_signed: SELF_SIGNED.clone(),
                now: 1_900_000_000,
            },
            // As when watching Kubernetes: no ExternalName, no local backends, and 10.9.9.9 is
            // this node's address.
            backends: BackendPolicy {
                allow_external_name: false,
                addresses: AddressPolicy::refusing_local([HOST_ADDRESS.parse().unwrap()]),
            },
            unsupported_access: UnsupportedAccess::Refuse,
            unnamed: sni::UnnamedPolicy::default(),
            global: global::GlobalSettings {
                allow_snippets: true,
                ..global::GlobalSettings::default()
            },
            config_map: None,
        }
    }
}
