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
pub mod cache;
pub mod certs;
pub mod class;
pub mod host;
pub mod path;
pub mod policy;
pub mod sni;
pub mod sources;
pub mod tls;

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::networking::v1::{Ingress, IngressBackend};

use crate::diagnostics::{Diagnostic, DiagnosticKind, Severity, Subject};
use crate::store::{Kind, ObjectKey, Store};
use annotations::UnsupportedAccess;
use annotations::registry::Category;
use backend::{Backend, BackendPolicy, PortRef, Resolver, Target};
pub use cache::BuildCache;
use cache::{Compiled, HostPart, PathPart};
use class::ClassSelector;
use host::{HostPattern, HostTable};
use path::{PathMatcher, PathRule};
use policy::{HostPolicy, Rewrite, RewritePolicy, RoutePolicy};

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
    /// `--proxy-body-size`: the request body limit of routes without `proxy-body-size`
    /// (`None`: no limit).
    pub max_body: Option<u64>,
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
    /// Shared between snapshots while no owned Ingress's metadata changes.
    pub ingresses: Arc<BTreeMap<ObjectKey, IngressMeta>>,
    /// SNI → certificate.
    pub tls: tls::TlsTable,
    /// The names the HTTPS port admits, for the kernel gate and userspace mode alike.
    pub sni: sni::SniPolicy,
    /// `ssl-passthrough` hosts: SNI → the backend that terminates TLS itself.
    pub passthrough: HostTable<Arc<Route>>,
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
    /// twice); passthrough routes are not HTTP routes and are not included.
    pub fn routes(&self) -> impl Iterator<Item = &Arc<Route>> {
        self.hosts
            .iter()
            .flat_map(|(_, vhost)| {
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

    /// Builds a snapshot from scratch. Pure: the same store and settings give the same routing.
    pub fn build(store: &Store, settings: &BuildSettings, generation: u64) -> Snapshot {
        Self::build_with(store, settings, generation, BuildCache::default()).0
    }

    /// Builds a snapshot reusing what `cache` kept from the previous build (of any store), and
    /// returns the cache for the next one. Still pure: the snapshot is the one [`Snapshot::build`]
    /// gives for the same store and settings; only the work differs, in proportion to what
    /// changed since the cache was made.
    pub fn build_with(
        store: &Store,
        settings: &BuildSettings,
        generation: u64,
        cache: BuildCache,
    ) -> (Snapshot, BuildCache) {
        cache.build(store, settings, generation)
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

/// Compiles one Ingress on its own, before it meets the others: everything here depends only on
/// the Ingress, the Services, slices and Secrets it names, and the settings.
struct Compiler<'s, 'c> {
    store: &'s Store,
    settings: &'s BuildSettings,
    resolver: &'c mut Resolver<'s>,
    certs: &'c mut tls::CertLoader,
    diagnostics: Vec<Diagnostic>,
    services: Vec<ObjectKey>,
}

impl Compiler<'_, '_> {
    fn compile(mut self, key: &ObjectKey, ingress: &Ingress) -> Compiled {
        let mut out = Compiled {
            meta: IngressMeta::of(ingress),
            ..Compiled::default()
        };
        let subject = Subject::object(Kind::Ingress, key);
        let (options, errors) = annotations::parse(ingress.metadata.annotations.as_ref());
        for message in errors {
            self.diagnostics.push(Diagnostic::error(
                DiagnosticKind::InvalidAnnotation,
                subject.clone(),
                message,
            ));
        }
        if let Some(rules) = options.canary.clone() {
            return self.compile_canary(key, ingress, &options, rules, out);
        }
        if options.x_forwarded_prefix.is_some() && options.rewrite_target.is_none() {
            self.diagnostics.push(Diagnostic::warning(
                DiagnosticKind::InvalidAnnotation,
                subject.clone(),
                "x-forwarded-prefix is only sent with a rewritten request (as in ingress-nginx); without rewrite-target it has no effect",
            ));
        }
        let mut refused = self.judge_unsupported(&subject, ingress);
        let sources = match annotations::source_ranges(ingress.metadata.annotations.as_ref()) {
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
        // A route's policy depends on the Ingress and on whether its host has TLS here.
        let policies = [false, true].map(|tls| {
            Arc::new(
                RoutePolicy::new(&options, tls, refused.as_ref(), self.settings.max_body)
                    .with_sources(&sources),
            )
        });
        let aliases = (!options.server_alias.is_empty()).then(|| {
            options
                .server_alias
                .iter()
                .filter_map(|a| host::parse_pattern(Some(a)).ok())
                .collect::<Vec<_>>()
        });
        let Some(spec) = &ingress.spec else {
            return self.finish(out);
        };
        let rules = spec.rules.as_deref().unwrap_or_default();
        out.tls = tls::compile_ingress(
            self.store,
            &self.settings.tls,
            self.certs,
            key,
            ingress,
            &mut self.diagnostics,
        );
        let default_route = spec
            .default_backend
            .as_ref()
            .and_then(|b| self.route(key, b, &policies[0], false, refused.is_some()));

        if options.ssl_passthrough {
            out.passthrough = self.passthrough(
                key,
                rules,
                default_route.as_ref(),
                &policies[0],
                refused.is_some(),
            );
        }

        if rules.is_empty() {
            out.default.clone_from(&default_route);
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
            let tls = out.tls.declared.contains(&pattern);
            let mut part = HostPart {
                pattern: pattern.clone(),
                default_route: default_route.clone(),
                paths: Vec::new(),
                use_regex: options.use_regex,
                www: options.from_to_www,
                aliases: aliases.clone(),
                app_root: options.app_root.clone(),
            };
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
                // The route's problems count only if the path is not claimed by an older
                // Ingress, which assembly decides: they stay with the path until then.
                let before = self.diagnostics.len();
                let mut policy = policies[usize::from(tls)].for_path(&path);
                let mut regex = false;
                match Rewrite::for_path(&options, &path) {
                    None => {}
                    Some(Ok(rewrite)) => {
                        regex = true;
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
                let route = self.route(key, &http_path.backend, &policy, tls, refused.is_some());
                part.paths.push(PathPart {
                    path,
                    kind,
                    route,
                    regex,
                    diagnostics: self.diagnostics.split_off(before),
                });
            }
            out.hosts.push(part);
        }
        self.finish(out)
    }

    /// A canary Ingress (`canary: "true"`): each of its paths becomes the canary of the main
    /// route with the same host, path and type (ingress-nginx's rule), which assembly finds; it
    /// serves nothing by itself, and its other annotations have no effect (the main Ingress's
    /// apply).
    fn compile_canary(
        mut self,
        key: &ObjectKey,
        ingress: &Ingress,
        options: &annotations::Options,
        rules: Arc<annotations::canary::Rules>,
        mut out: Compiled,
    ) -> Compiled {
        let subject = Subject::object(Kind::Ingress, key);
        out.canary = Some(cache::CanaryPart {
            rules,
            sticky: !options.affinity_canary_legacy,
        });
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
        let Some(spec) = &ingress.spec else {
            return self.finish(out);
        };
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
            let mut part = HostPart {
                pattern: pattern.clone(),
                default_route: None,
                paths: Vec::new(),
                use_regex: false,
                www: false,
                aliases: None,
                app_root: None,
            };
            let paths = rule
                .http
                .as_ref()
                .map(|h| h.paths.as_slice())
                .unwrap_or_default();
            for http_path in paths {
                let path = http_path.path.clone().unwrap_or_else(|| "/".into());
                let kind = match path::compile(&path, &http_path.path_type) {
                    Ok(kind) => kind,
                    Err(err) => {
                        self.diagnostics.push(Diagnostic::error(
                            DiagnosticKind::InvalidPath,
                            subject.clone(),
                            format!("host {pattern}: {err}; this canary path is not used"),
                        ));
                        continue;
                    }
                };
                // The backend's problems count only if a main route is found, which assembly
                // decides.
                let before = self.diagnostics.len();
                let route = self.route(key, &http_path.backend, &placeholder, false, false);
                part.paths.push(PathPart {
                    path,
                    kind,
                    route,
                    regex: false,
                    diagnostics: self.diagnostics.split_off(before),
                });
            }
            out.hosts.push(part);
        }
        self.finish(out)
    }

    fn finish(self, mut out: Compiled) -> Compiled {
        out.diagnostics = self.diagnostics;
        out.services = self.services;
        out.services.sort();
        out.services.dedup();
        out
    }

    /// `ssl-passthrough`: each rule's host is routed by SNI to the backend of its `/` path (or
    /// its only path, or the Ingress's default backend). The TLS stream is not terminated, so
    /// paths mean nothing; more than that one path is a warning.
    fn passthrough(
        &mut self,
        key: &ObjectKey,
        rules: &[k8s_openapi::api::networking::v1::IngressRule],
        default_route: Option<&Arc<Route>>,
        policy: &Arc<RoutePolicy>,
        refused: bool,
    ) -> Vec<(HostPattern, Arc<Route>)> {
        let mut out = Vec::new();
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
                Some(path) => self.route(key, &path.backend, policy, false, refused),
                None => default_route.cloned(),
            };
            let Some(route) = route else { continue };
            out.push((pattern, route));
        }
        out
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
            let diagnostic = match (u.category, self.settings.unsupported_access) {
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
            };
            return Some(self.make_route(ingress, Arc::new(backend), policy, tls));
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
        self.services.push(service_key.clone());
        let (backend, problems) = self.resolver.resolve(service_key, port);
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
        Some(self.make_route(ingress, backend, policy, tls))
    }

    fn make_route(
        &self,
        ingress: &ObjectKey,
        backend: Arc<Backend>,
        policy: &Arc<RoutePolicy>,
        tls: bool,
    ) -> Arc<Route> {
        let labels = RouteLabels {
            namespace: ingress.namespace.as_str().into(),
            ingress: ingress.name.as_str().into(),
            service: backend.service.name.as_str().into(),
        };
        Arc::new(Route {
            ingress: ingress.clone(),
            tls,
            backend,
            policy: policy.clone(),
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
            max_body: Some(1 << 20),
        }
    }
}
