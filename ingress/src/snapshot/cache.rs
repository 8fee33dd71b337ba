//! Builds that cost what changed: what one build compiled, kept for the next.
//!
//! ```text
//!   Store ──diff against the objects the cache last saw──> changed Services, slices, Secrets
//!     │                                                      │ (a slice counts as its Service)
//!     ▼                                                      ▼
//!   each Ingress: unchanged object, and nothing it named changed? ── yes ──> its Fragment, as is
//!     │ no                                                  (routes, policies, regexes, backends)
//!     ▼
//!   compile it again (Compiler) ──> the host patterns, TLS names, passthrough and default
//!                                    backend it touched (before and after) are dirty
//!     ▼
//!   each dirty host: its Ingresses, oldest first, replayed (first path wins), then its canary
//!   Ingresses attached to the main routes, then its regex mode ──> Arc<VirtualHost>
//!   host table, SNI names, TLS table, diagnostics: the previous ones with the dirty entries redone
//!   server-alias and from-to-www-redirect names: worked out again from the hosts that claim any
//! ```
//!
//! What crosses Ingresses stays within a host, except the extra names: a canary Ingress is a
//! user of its rules' hosts like any other, so changing it or its main Ingress replays the host;
//! a host's regex mode (`use-regex` or `rewrite-target` on one of its Ingresses) is decided in
//! that replay; `app-root` too. The names `server-alias` and `from-to-www-redirect` add depend on
//! which names every other host declares, so they are recomputed on every build, from the
//! (few) hosts that ask for any: correct first, and cheap.
//!
//! An object is unchanged when the store holds the same `Arc` (sources replace the `Arc` on
//! every change) or, failing that, an equal object (a relist, or a manifests directory reread).
//! A certificate whose validity judgement differs at the new build time recompiles the
//! Ingresses that judged it. A change of settings (other than the time) or of any IngressClass
//! starts from an empty cache. The cache is owned by whoever builds (the publish pipeline), not
//! by the snapshot; `Snapshot::build` is `build_with` an empty cache, and a property test holds
//! the two to the same result.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use k8s_openapi::api::networking::v1::Ingress;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::annotations::canary;
use super::backend::{Resolver, ResolverState, service_of};
use super::certs::Certificate;
use super::host::{HostPattern, HostTable};
use super::path::{PathKind, PathMatcher, PathRule};
use super::policy::{CanaryPolicy, HostPolicy, RoutePolicy};
use super::{
    BuildSettings, Compiler, IngressMeta, Route, Snapshot, VirtualHost, nginx_regex_rules, sni, tls,
};
use crate::diagnostics::{Diagnostic, DiagnosticKind, Subject};
use crate::store::{Kind, ObjectKey, Store};

/// What the previous build compiled, and the objects it compiled it from.
#[derive(Default)]
pub struct BuildCache {
    /// The settings of the last build, with `tls.now` in `now`.
    settings: Option<BuildSettings>,
    now: i64,
    seen: Seen,
    resolver: ResolverState,
    certs: tls::CertLoader,
    fragments: BTreeMap<ObjectKey, Fragment>,
    /// Host pattern → the Ingresses with rules for it, oldest first, and what they make of it.
    hosts: HashMap<HostPattern, Assembled<Arc<VirtualHost>>>,
    host_table: HostTable<Arc<VirtualHost>>,
    /// Host pattern → the Ingresses that ask for a certificate for it, and the winner.
    tls: BTreeMap<HostPattern, Assembled<Arc<Certificate>>>,
    tls_table: HostTable<Arc<Certificate>>,
    /// Ingresses with passthrough hosts, and the table they make.
    passthrough_users: BTreeSet<Order>,
    passthrough: BTreeMap<HostPattern, Arc<Route>>,
    passthrough_table: HostTable<Arc<Route>>,
    passthrough_diagnostics: Vec<Diagnostic>,
    /// Ingresses without rules that have a default backend; the oldest one's is the default.
    default_users: BTreeSet<Order>,
    default_backend: Option<Arc<Route>>,
    default_diagnostics: Vec<Diagnostic>,
    sni_names: BTreeMap<String, sni::Action>,
    ingresses: Arc<BTreeMap<ObjectKey, IngressMeta>>,
    /// Host pattern → its `server-alias` and `from-to-www-redirect` claims, for the hosts that
    /// have any. The names they add depend on every host, so they are worked out again on
    /// every build (from these few hosts), not kept per host.
    extra_claims: BTreeMap<HostPattern, ExtraClaims>,
    /// The names the previous build added for them, and those of them given a certificate.
    extra_names: Vec<HostPattern>,
    extra_certs: Vec<HostPattern>,
    extra_diagnostics: Vec<Diagnostic>,
}

/// What a host's Ingresses ask of names beyond it.
#[derive(Clone, Default)]
struct ExtraClaims {
    /// `server-alias` of the oldest Ingress with one on this host.
    aliases: Option<(Order, Vec<HostPattern>)>,
    /// The oldest Ingress with `from-to-www-redirect` on this host.
    www: Option<Order>,
}

/// A name served for another host's sake.
enum ExtraName {
    /// `server-alias`: the same virtual host as this one.
    Alias(HostPattern),
    /// `from-to-www-redirect`: a host that only redirects to this name.
    WwwRedirect(String),
}

/// The objects the cache's fragments were compiled from (Ingresses are kept in the fragments).
#[derive(Default)]
struct Seen {
    classes: BTreeMap<ObjectKey, Arc<k8s_openapi::api::networking::v1::IngressClass>>,
    services: BTreeMap<ObjectKey, Arc<k8s_openapi::api::core::v1::Service>>,
    slices: BTreeMap<ObjectKey, Arc<k8s_openapi::api::discovery::v1::EndpointSlice>>,
    secrets: BTreeMap<ObjectKey, Arc<k8s_openapi::api::core::v1::Secret>>,
}

/// Where an Ingress stands among the others: the older wins a conflict, as in ingress-nginx.
type Order = (Option<Time>, ObjectKey);

/// One part of the snapshot that several Ingresses contribute to, with what they made of it.
struct Assembled<T> {
    users: BTreeSet<Order>,
    value: Option<T>,
    diagnostics: Vec<Diagnostic>,
}

impl<T> Default for Assembled<T> {
    fn default() -> Self {
        Self {
            users: BTreeSet::new(),
            value: None,
            diagnostics: Vec::new(),
        }
    }
}

/// One Ingress, compiled on its own.
struct Fragment {
    ingress: Arc<Ingress>,
    order: Order,
    /// `None` when the Ingress is not ours.
    compiled: Option<Compiled>,
}

/// What an Ingress of ours compiles to before it meets the others.
#[derive(Debug, Default)]
pub(super) struct Compiled {
    pub meta: IngressMeta,
    /// The Services it names (their slices count as them).
    pub services: Vec<ObjectKey>,
    pub tls: tls::IngressTls,
    /// Its problems that do not depend on other Ingresses.
    pub diagnostics: Vec<Diagnostic>,
    pub hosts: Vec<HostPart>,
    pub passthrough: Vec<(HostPattern, Arc<Route>)>,
    /// Its default backend, when it has no rules: a candidate for the snapshot's.
    pub default: Option<Arc<Route>>,
    /// Set for a canary Ingress: its paths are canaries of main routes, not routes.
    pub canary: Option<CanaryPart>,
}

/// What a canary Ingress gives the main routes it attaches to.
#[derive(Debug)]
pub(super) struct CanaryPart {
    pub rules: Arc<canary::Rules>,
    pub sticky: bool,
}

/// One rule of an Ingress.
#[derive(Debug)]
pub(super) struct HostPart {
    pub pattern: HostPattern,
    pub default_route: Option<Arc<Route>>,
    pub paths: Vec<PathPart>,
    /// `use-regex`: every path of the host in ingress-nginx's regex mode.
    pub use_regex: bool,
    /// `from-to-www-redirect`.
    pub www: bool,
    /// `server-alias`, when set.
    pub aliases: Option<Vec<HostPattern>>,
    /// `app-root`.
    pub app_root: Option<Arc<str>>,
}

/// One path of a rule; `route` is `None` when its backend reference is unusable (it still
/// claims the path). Its diagnostics count only if the path is not an older Ingress's.
#[derive(Debug)]
pub(super) struct PathPart {
    pub path: String,
    pub kind: PathKind,
    pub route: Option<Arc<Route>>,
    /// A `rewrite-target` applies to it: once it is served, its host is in regex mode.
    pub regex: bool,
    pub diagnostics: Vec<Diagnostic>,
}

/// What changed between the objects the cache saw and the store, per kind.
struct Changed<T> {
    key: ObjectKey,
    old: Option<Arc<T>>,
    new: Option<Arc<T>>,
}

/// Walks `seen` and `now` (both ordered by key) together and brings `seen` up to date; returns
/// the objects that differ. The same `Arc`, or an equal object, is no change.
fn diff<T: PartialEq>(
    seen: &mut BTreeMap<ObjectKey, Arc<T>>,
    now: &BTreeMap<ObjectKey, Arc<T>>,
) -> Vec<Changed<T>> {
    let mut changes = Vec::new();
    let mut refreshed = Vec::new();
    {
        let mut old = seen.iter().peekable();
        let mut new = now.iter().peekable();
        loop {
            match (old.peek(), new.peek()) {
                (None, None) => break,
                (Some((ok, ov)), Some((nk, nv))) if ok == nk => {
                    if !Arc::ptr_eq(ov, nv) {
                        if ov == nv {
                            refreshed.push(((*nk).clone(), (*nv).clone()));
                        } else {
                            changes.push(Changed {
                                key: (*nk).clone(),
                                old: Some((*ov).clone()),
                                new: Some((*nv).clone()),
                            });
                        }
                    }
                    old.next();
                    new.next();
                }
                (Some((ok, ov)), Some((nk, _))) if ok < nk => {
                    changes.push(Changed {
                        key: (*ok).clone(),
                        old: Some((*ov).clone()),
                        new: None,
                    });
                    old.next();
                }
                (Some((ok, ov)), None) => {
                    changes.push(Changed {
                        key: (*ok).clone(),
                        old: Some((*ov).clone()),
                        new: None,
                    });
                    old.next();
                }
                (_, Some((nk, nv))) => {
                    changes.push(Changed {
                        key: (*nk).clone(),
                        old: None,
                        new: Some((*nv).clone()),
                    });
                    new.next();
                }
            }
        }
    }
    for (key, value) in refreshed {
        seen.insert(key, value);
    }
    for change in &changes {
        match &change.new {
            Some(value) => seen.insert(change.key.clone(), value.clone()),
            None => seen.remove(&change.key),
        };
    }
    changes
}

fn order_of(key: &ObjectKey, ingress: &Ingress) -> Order {
    (ingress.metadata.creation_timestamp.clone(), key.clone())
}

/// Everything but the build time; `self_signed` by identity.
fn same_settings(a: &BuildSettings, b: &BuildSettings) -> bool {
    a.class.ingress_class == b.class.ingress_class
        && a.class.controller_class == b.class.controller_class
        && a.tls.default_certificate == b.tls.default_certificate
        && Arc::ptr_eq(&a.tls.self_signed, &b.tls.self_signed)
        && a.backends == b.backends
        && a.unsupported_access == b.unsupported_access
        && a.unnamed == b.unnamed
        && a.max_body == b.max_body
}

/// The name the SNI policy lists a pattern under; `None` for the host-less rules.
fn sni_name(pattern: &HostPattern) -> Option<String> {
    match pattern {
        HostPattern::Exact(name) => Some(name.clone()),
        HostPattern::Wildcard(parent) => Some(format!("*.{parent}")),
        HostPattern::Any => None,
    }
}

/// What a round of recompiling touched, to be reassembled.
#[derive(Default)]
struct Dirty {
    hosts: HashSet<HostPattern>,
    tls: HashSet<HostPattern>,
    passthrough: bool,
    default: bool,
}

impl BuildCache {
    pub(super) fn build(
        mut self,
        store: &Store,
        settings: &BuildSettings,
        generation: u64,
    ) -> (Snapshot, BuildCache) {
        // Settings or IngressClasses (which decide which Ingresses are ours) changed: start over.
        let classes_changed = !diff(&mut self.seen.classes, &store.ingress_classes).is_empty();
        let settings_changed = self
            .settings
            .as_ref()
            .is_none_or(|old| !same_settings(old, settings));
        if classes_changed || settings_changed {
            self = BuildCache::default();
            diff(&mut self.seen.classes, &store.ingress_classes);
        }
        let now_changed = self.settings.is_some() && self.now != settings.tls.now;
        let old_now = self.now;

        // Services, slices and Secrets that changed; a slice counts as its Service (before and
        // after the change).
        let mut services: HashSet<ObjectKey> = diff(&mut self.seen.services, &store.services)
            .into_iter()
            .map(|c| c.key)
            .collect();
        for c in diff(&mut self.seen.slices, &store.endpoint_slices) {
            for slice in [&c.old, &c.new].into_iter().flatten() {
                services.extend(service_of(&c.key, slice));
            }
            self.resolver
                .slice_changed(&c.key, c.old.as_deref(), c.new.as_deref());
        }
        self.resolver.forget(&services);
        let secrets: HashSet<ObjectKey> = diff(&mut self.seen.secrets, &store.secrets)
            .into_iter()
            .map(|c| c.key)
            .collect();
        for secret in &secrets {
            self.certs.forget(secret);
        }

        // Which Ingresses to compile again (or for the first time) and which are gone.
        let stale = |fragment: &Fragment| {
            let Some(compiled) = &fragment.compiled else {
                return false;
            };
            compiled.services.iter().any(|s| services.contains(s))
                || compiled.tls.secrets.iter().any(|s| secrets.contains(s))
                || (now_changed
                    && compiled.tls.judged.iter().any(|c| {
                        c.validity_problem(old_now) != c.validity_problem(settings.tls.now)
                    }))
        };
        let check_deps = !services.is_empty() || !secrets.is_empty() || now_changed;
        let mut recompile: Vec<(ObjectKey, Arc<Ingress>)> = Vec::new();
        let mut removed: Vec<ObjectKey> = Vec::new();
        {
            let mut old = self.fragments.iter_mut().peekable();
            let mut new = store.ingresses.iter().peekable();
            loop {
                match (old.peek_mut(), new.peek()) {
                    (None, None) => break,
                    (Some((ok, fragment)), Some((nk, ingress))) if *ok == *nk => {
                        let same = Arc::ptr_eq(&fragment.ingress, ingress) || {
                            let equal = *fragment.ingress == ***ingress;
                            if equal {
                                fragment.ingress = (*ingress).clone();
                            }
                            equal
                        };
                        if !same || (check_deps && stale(fragment)) {
                            recompile.push(((*nk).clone(), (*ingress).clone()));
                        }
                        old.next();
                        new.next();
                    }
                    (Some((ok, _)), Some((nk, _))) if *ok < *nk => {
                        removed.push((*ok).clone());
                        old.next();
                    }
                    (Some((ok, _)), None) => {
                        removed.push((*ok).clone());
                        old.next();
                    }
                    (_, Some((nk, ingress))) => {
                        recompile.push(((*nk).clone(), (*ingress).clone()));
                        new.next();
                    }
                }
            }
        }

        let mut dirty = Dirty::default();
        let mut resolver = Resolver::resume(
            store,
            &settings.backends,
            std::mem::take(&mut self.resolver),
        );
        for key in removed {
            if let Some(old) = self.fragments.remove(&key) {
                self.unindex(&old, &mut dirty);
            }
            if self.ingresses.contains_key(&key) {
                Arc::make_mut(&mut self.ingresses).remove(&key);
            }
        }
        for (key, ingress) in recompile {
            let order = order_of(&key, &ingress);
            let compiled = settings
                .class
                .owns(&ingress, &store.ingress_classes)
                .then(|| {
                    Compiler {
                        store,
                        settings,
                        resolver: &mut resolver,
                        certs: &mut self.certs,
                        diagnostics: Vec::new(),
                        services: Vec::new(),
                    }
                    .compile(&key, &ingress)
                });
            let fragment = Fragment {
                ingress,
                order,
                compiled,
            };
            if let Some(old) = self.fragments.remove(&key) {
                self.unindex(&old, &mut dirty);
            }
            self.index(&fragment, &mut dirty);
            // Shared with the snapshots already published: copied only when it changes.
            let meta = fragment.compiled.as_ref().map(|c| &c.meta);
            if self.ingresses.get(&key) != meta {
                let ingresses = Arc::make_mut(&mut self.ingresses);
                match meta {
                    Some(meta) => ingresses.insert(key.clone(), meta.clone()),
                    None => ingresses.remove(&key),
                };
            }
            self.fragments.insert(key, fragment);
        }
        self.resolver = resolver.into_state();

        // The extra names of the previous build come out before any host is reassembled (one
        // may now be a host of its own) and go back in, worked out again, after.
        for name in std::mem::take(&mut self.extra_names) {
            self.host_table.remove(&name);
            self.set_sni(&name);
        }
        for name in std::mem::take(&mut self.extra_certs) {
            self.tls_table.remove(&name);
        }
        for pattern in dirty.hosts {
            self.assemble_host(pattern);
        }
        if dirty.passthrough {
            self.assemble_passthrough();
        }
        if dirty.default {
            self.assemble_default();
        }
        for pattern in dirty.tls {
            self.assemble_tls(pattern);
        }
        self.assemble_extra_names();

        let mut diagnostics = store.source_diagnostics.clone();
        let default_cert =
            tls::default_certificate(store, &settings.tls, &mut self.certs, &mut diagnostics);
        let loaded = tls::loaded(
            self.tls.values().filter_map(|a| a.value.as_ref()),
            &default_cert,
        );
        for fragment in self.fragments.values() {
            if let Some(compiled) = &fragment.compiled {
                diagnostics.extend(compiled.diagnostics.iter().cloned());
            }
        }
        for assembled in self.hosts.values() {
            diagnostics.extend(assembled.diagnostics.iter().cloned());
        }
        for assembled in self.tls.values() {
            diagnostics.extend(assembled.diagnostics.iter().cloned());
        }
        diagnostics.extend(self.passthrough_diagnostics.iter().cloned());
        diagnostics.extend(self.default_diagnostics.iter().cloned());
        diagnostics.extend(self.extra_diagnostics.iter().cloned());
        diagnostics.sort();
        diagnostics.dedup();

        let sni = sni::SniPolicy {
            names: self.sni_names.clone(),
            catch_all: self.default_backend.is_some() || self.host_table.any().is_some(),
            unnamed: settings.unnamed,
        };
        let snapshot = Snapshot {
            generation,
            hosts: self.host_table.clone(),
            default_backend: self.default_backend.clone(),
            diagnostics,
            ingresses: self.ingresses.clone(),
            tls: tls::TlsTable {
                hosts: self.tls_table.clone(),
                default: Some(default_cert),
                loaded,
            },
            sni,
            passthrough: self.passthrough_table.clone(),
        };
        self.settings = Some(settings.clone());
        self.now = settings.tls.now;
        (snapshot, self)
    }

    /// Takes a fragment out of the indexes, marking what it touched.
    fn unindex(&mut self, fragment: &Fragment, dirty: &mut Dirty) {
        let Some(compiled) = &fragment.compiled else {
            return;
        };
        for part in &compiled.hosts {
            if let Some(assembled) = self.hosts.get_mut(&part.pattern) {
                assembled.users.remove(&fragment.order);
            }
            dirty.hosts.insert(part.pattern.clone());
        }
        for claim in &compiled.tls.claims {
            if let Some(assembled) = self.tls.get_mut(&claim.pattern) {
                assembled.users.remove(&fragment.order);
            }
            dirty.tls.insert(claim.pattern.clone());
        }
        if self.passthrough_users.remove(&fragment.order) {
            dirty.passthrough = true;
        }
        if self.default_users.remove(&fragment.order) {
            dirty.default = true;
        }
    }

    /// Adds a fragment to the indexes, marking what it touches.
    fn index(&mut self, fragment: &Fragment, dirty: &mut Dirty) {
        let Some(compiled) = &fragment.compiled else {
            return;
        };
        for part in &compiled.hosts {
            self.hosts
                .entry(part.pattern.clone())
                .or_default()
                .users
                .insert(fragment.order.clone());
            dirty.hosts.insert(part.pattern.clone());
        }
        for claim in &compiled.tls.claims {
            self.tls
                .entry(claim.pattern.clone())
                .or_default()
                .users
                .insert(fragment.order.clone());
            dirty.tls.insert(claim.pattern.clone());
        }
        if !compiled.passthrough.is_empty() {
            self.passthrough_users.insert(fragment.order.clone());
            dirty.passthrough = true;
        }
        if compiled.default.is_some() {
            self.default_users.insert(fragment.order.clone());
            dirty.default = true;
        }
    }

    fn compiled(&self, order: &Order) -> Option<&Compiled> {
        self.fragments.get(&order.1)?.compiled.as_ref()
    }

    /// Whether a pattern is served by rules of its own (a main Ingress has a rule for it).
    fn is_host(&self, pattern: &HostPattern) -> bool {
        self.hosts.get(pattern).is_some_and(|a| a.value.is_some())
    }

    /// Replays the rules of every Ingress with this host, oldest first: the first to define a
    /// path (and type) serves it, a later one is a conflict on that Ingress. Then the canary
    /// Ingresses with this host, oldest first, each attached to the main route with its path
    /// and type; then, if any of the host's Ingresses asks for it, ingress-nginx's regex mode
    /// for every path of the host. Every Ingress of the host is replayed whatever changed, so
    /// a canary and its main, and a regex mode that flips, are always redone together.
    fn assemble_host(&mut self, pattern: HostPattern) {
        let Some(mut assembled) = self.hosts.remove(&pattern) else {
            return;
        };
        assembled.diagnostics.clear();
        let mut rules: Vec<PathRule<Arc<Route>>> = Vec::new();
        let mut default_backend = None;
        let mut policy = HostPolicy::default();
        let mut nginx_regex = false;
        let mut claims = ExtraClaims::default();
        let mut served = false;
        let mut seen: HashMap<(&str, &'static str), &ObjectKey> = HashMap::new();
        for order in &assembled.users {
            let Some(compiled) = self.compiled(order) else {
                continue;
            };
            if compiled.canary.is_some() {
                continue;
            }
            let key = &order.1;
            let subject = || Subject::object(Kind::Ingress, key);
            for part in compiled.hosts.iter().filter(|p| p.pattern == pattern) {
                served = true;
                if default_backend.is_none() {
                    default_backend.clone_from(&part.default_route);
                }
                nginx_regex |= part.use_regex;
                if part.www && claims.www.is_none() {
                    claims.www = Some(order.clone());
                }
                if let Some(aliases) = &part.aliases
                    && claims.aliases.is_none()
                {
                    claims.aliases = Some((order.clone(), aliases.clone()));
                }
                if let Some(app_root) = &part.app_root {
                    match &policy.app_root {
                        None => policy.app_root = Some(app_root.clone()),
                        Some(existing) if existing != app_root => {
                            assembled.diagnostics.push(Diagnostic::warning(
                                DiagnosticKind::ConflictingRule,
                                subject(),
                                format!("host {pattern} already has app-root {existing} from an older Ingress; this one's {app_root} is ignored"),
                            ));
                        }
                        Some(_) => {}
                    }
                }
                for path in &part.paths {
                    let seen_key = (path.path.as_str(), path.kind.as_str());
                    if let Some(first) = seen.get(&seen_key) {
                        if *first != key {
                            assembled.diagnostics.push(Diagnostic::error(
                                DiagnosticKind::ConflictingRule,
                                subject(),
                                format!(
                                    "host {pattern} path {} ({}) is already defined by Ingress {first}; this rule is ignored",
                                    path.path,
                                    path.kind.as_str()
                                ),
                            ));
                        }
                        continue;
                    }
                    seen.insert(seen_key, key);
                    nginx_regex |= path.regex;
                    assembled
                        .diagnostics
                        .extend(path.diagnostics.iter().cloned());
                    if let Some(route) = &path.route {
                        rules.push(PathRule {
                            path: path.path.clone(),
                            kind: path.kind.clone(),
                            target: route.clone(),
                        });
                    }
                }
            }
        }
        for order in &assembled.users {
            let Some(compiled) = self.compiled(order) else {
                continue;
            };
            let Some(canary) = &compiled.canary else {
                continue;
            };
            let key = &order.1;
            let subject = || Subject::object(Kind::Ingress, key);
            for part in compiled.hosts.iter().filter(|p| p.pattern == pattern) {
                for path in &part.paths {
                    let ty = path.kind.as_str();
                    let Some(main) = seen.get(&(path.path.as_str(), ty)) else {
                        assembled.diagnostics.push(Diagnostic::warning(
                            DiagnosticKind::CanaryUnmatched,
                            subject(),
                            format!("no main Ingress serves host {pattern} path {} ({ty}); this canary path is not used", path.path),
                        ));
                        continue;
                    };
                    assembled
                        .diagnostics
                        .extend(path.diagnostics.iter().cloned());
                    let Some(route) = &path.route else {
                        continue;
                    };
                    let Some(rule) = rules.iter_mut().find(|r| {
                        r.path == path.path && r.kind.as_str() == ty && r.target.ingress == **main
                    }) else {
                        continue;
                    };
                    let old = &rule.target;
                    let problem = if let Some(existing) = &old.policy.canary {
                        Some(format!(
                            "host {pattern} path {} already has the canary Ingress {}; ingress-nginx uses one canary per path, so this one is not used",
                            path.path, existing.ingress
                        ))
                    } else if old.backend.service == route.backend.service
                        && old.backend.port == route.backend.port
                    {
                        Some(format!(
                            "host {pattern} path {}: the canary's backend is the main Ingress's own; it is not used",
                            path.path
                        ))
                    } else {
                        None
                    };
                    if let Some(message) = problem {
                        assembled.diagnostics.push(Diagnostic::warning(
                            DiagnosticKind::ConflictingRule,
                            subject(),
                            message,
                        ));
                        continue;
                    }
                    let policy = RoutePolicy {
                        canary: Some(Arc::new(CanaryPolicy {
                            rules: canary.rules.clone(),
                            backend: route.backend.clone(),
                            ingress: key.clone(),
                            sticky: canary.sticky,
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
        if claims.aliases.is_some() || claims.www.is_some() {
            self.extra_claims.insert(pattern.clone(), claims);
        } else {
            self.extra_claims.remove(&pattern);
        }
        if assembled.users.is_empty() {
            self.host_table.remove(&pattern);
            self.set_sni(&pattern);
            return;
        }
        if !served {
            // Only canaries name it: not a host.
            assembled.value = None;
            self.host_table.remove(&pattern);
            self.hosts.insert(pattern.clone(), assembled);
            self.set_sni(&pattern);
            return;
        }
        let paths = if nginx_regex {
            PathMatcher::nginx_regex(nginx_regex_rules(
                &pattern,
                rules,
                &mut assembled.diagnostics,
            ))
        } else {
            PathMatcher::new(rules)
        };
        let vhost = Arc::new(VirtualHost {
            pattern: pattern.clone(),
            paths,
            default_backend,
            policy,
            nginx_regex,
        });
        assembled.value = Some(vhost.clone());
        self.host_table.insert(pattern.clone(), vhost);
        self.hosts.insert(pattern.clone(), assembled);
        self.set_sni(&pattern);
    }

    /// The names `server-alias` and `from-to-www-redirect` add, as ingress-nginx adds them:
    /// never a name an Ingress rule declares; of two claims on one name, the older Ingress's
    /// wins. Worked out over every host with a claim, on every build: a claim on one host
    /// depends on all the others. Their certificates, where no Ingress gives them one: an alias
    /// is served with its host's (ingress-nginx lists it in the host's server block), a
    /// www-redirect name with its target's when that covers it, else the default.
    fn assemble_extra_names(&mut self) {
        let mut diagnostics = Vec::new();
        let mut extra: BTreeMap<HostPattern, ExtraName> = BTreeMap::new();
        let subject = |key: &ObjectKey| Subject::object(Kind::Ingress, key);
        let mut claims: Vec<(&Order, &HostPattern, &ExtraClaims)> = self
            .extra_claims
            .iter()
            .filter_map(|(pattern, claims)| {
                let alias = claims.aliases.as_ref().map(|(order, _)| order);
                [alias, claims.www.as_ref()]
                    .into_iter()
                    .flatten()
                    .min()
                    .map(|order| (order, pattern, claims))
            })
            .collect();
        claims.sort_by(|a, b| (a.0, a.1).cmp(&(b.0, b.1)));
        for (_, pattern, claim) in claims {
            if let Some((order, aliases)) = &claim.aliases {
                for alias in aliases {
                    if alias == pattern || self.is_host(alias) {
                        continue;
                    }
                    match extra.get(alias) {
                        None => {
                            extra.insert(alias.clone(), ExtraName::Alias(pattern.clone()));
                        }
                        Some(_) => diagnostics.push(Diagnostic::warning(
                            DiagnosticKind::ConflictingRule,
                            subject(&order.1),
                            format!("server-alias {alias} of host {pattern} is already an alias of another host; it is not added"),
                        )),
                    }
                }
            }
            let Some((_, key)) = &claim.www else { continue };
            let HostPattern::Exact(to) = pattern else {
                diagnostics.push(Diagnostic::warning(
                    DiagnosticKind::InvalidAnnotation,
                    subject(key),
                    format!("from-to-www-redirect applies to plain host names, not to {pattern}; no redirect is made for it"),
                ));
                continue;
            };
            let from = match to.strip_prefix("www.") {
                Some(bare) => bare.to_string(),
                None => format!("www.{to}"),
            };
            let from_pattern = HostPattern::Exact(from.clone());
            if self.is_host(&from_pattern) || extra.contains_key(&from_pattern) {
                diagnostics.push(Diagnostic::warning(
                    DiagnosticKind::ConflictingRule,
                    subject(key),
                    format!("from-to-www-redirect: {from} is already served, so it does not redirect to {to}"),
                ));
                continue;
            }
            extra.insert(from_pattern, ExtraName::WwwRedirect(to.clone()));
        }
        let certificate_of = |this: &Self, pattern: &HostPattern| {
            this.tls.get(pattern).and_then(|a| a.value.clone())
        };
        for (name, extra) in extra {
            let vhost = match &extra {
                ExtraName::Alias(of) => self.hosts.get(of).and_then(|a| a.value.clone()),
                ExtraName::WwwRedirect(to) => Some(Arc::new(VirtualHost {
                    pattern: name.clone(),
                    paths: PathMatcher::default(),
                    default_backend: None,
                    policy: HostPolicy {
                        www_redirect: Some(to.as_str().into()),
                        ..HostPolicy::default()
                    },
                    nginx_regex: false,
                })),
            };
            let Some(vhost) = vhost else { continue };
            self.host_table.insert(name.clone(), vhost);
            if let Some(sni_name) = sni_name(&name)
                && !self.passthrough.contains_key(&name)
            {
                self.sni_names.insert(sni_name, sni::Action::Pass);
            }
            if certificate_of(self, &name).is_none() {
                let cert = match &extra {
                    ExtraName::Alias(of) => certificate_of(self, of),
                    ExtraName::WwwRedirect(to) => {
                        certificate_of(self, &HostPattern::Exact(to.clone()))
                            .filter(|cert| cert.covers(&name))
                    }
                };
                if let Some(cert) = cert {
                    self.tls_table.insert(name.clone(), cert);
                    self.extra_certs.push(name.clone());
                }
            }
            self.extra_names.push(name);
        }
        self.extra_diagnostics = diagnostics;
    }

    /// The SNI policy's entry for a pattern: passthrough, else served, else absent.
    fn set_sni(&mut self, pattern: &HostPattern) {
        let Some(name) = sni_name(pattern) else {
            return;
        };
        if self.passthrough.contains_key(pattern) {
            self.sni_names.insert(name, sni::Action::Passthrough);
        } else if self.is_host(pattern) {
            self.sni_names.insert(name, sni::Action::Pass);
        } else {
            self.sni_names.remove(&name);
        }
    }

    /// Passthrough hosts are few; they are reassembled whole when one of their Ingresses changed.
    fn assemble_passthrough(&mut self) {
        let mut passthrough: BTreeMap<HostPattern, Arc<Route>> = BTreeMap::new();
        let mut diagnostics = Vec::new();
        for order in &self.passthrough_users {
            let Some(compiled) = self.compiled(order) else {
                continue;
            };
            for (pattern, route) in &compiled.passthrough {
                match passthrough.get(pattern) {
                    Some(existing) if existing.ingress != order.1 => {
                        diagnostics.push(Diagnostic::error(
                            DiagnosticKind::ConflictingRule,
                            Subject::object(Kind::Ingress, &order.1),
                            format!(
                                "host {pattern} is already passed through by Ingress {}; this one is ignored for it",
                                existing.ingress
                            ),
                        ));
                    }
                    Some(_) => {}
                    None => {
                        passthrough.insert(pattern.clone(), route.clone());
                    }
                }
            }
        }
        let old = std::mem::replace(&mut self.passthrough, passthrough);
        let mut table = HostTable::default();
        for (pattern, route) in &self.passthrough {
            table.insert(pattern.clone(), route.clone());
        }
        self.passthrough_table = table;
        self.passthrough_diagnostics = diagnostics;
        let patterns: BTreeSet<HostPattern> = old
            .into_keys()
            .chain(self.passthrough.keys().cloned())
            .collect();
        for pattern in &patterns {
            self.set_sni(pattern);
        }
    }

    fn assemble_default(&mut self) {
        self.default_backend = None;
        self.default_diagnostics.clear();
        let users: Vec<Order> = self.default_users.iter().cloned().collect();
        for order in users {
            let Some(route) = self.compiled(&order).and_then(|c| c.default.clone()) else {
                continue;
            };
            match &self.default_backend {
                None => self.default_backend = Some(route),
                Some(existing) => self.default_diagnostics.push(Diagnostic::error(
                    DiagnosticKind::ConflictingRule,
                    Subject::object(Kind::Ingress, &order.1),
                    format!(
                        "the default backend is already set by Ingress {}; this one is ignored",
                        existing.ingress
                    ),
                )),
            }
        }
    }

    fn assemble_tls(&mut self, pattern: HostPattern) {
        let Some(mut assembled) = self.tls.remove(&pattern) else {
            return;
        };
        assembled.diagnostics.clear();
        let claims = assembled.users.iter().flat_map(|order| {
            self.compiled(order)
                .into_iter()
                .flat_map(|c| c.tls.claims.iter())
                .filter(|c| c.pattern == pattern)
                .map(move |claim| (&order.1, claim))
        });
        let winner = tls::settle(claims, &mut assembled.diagnostics);
        match &winner {
            Some(cert) => self.tls_table.insert(pattern.clone(), cert.clone()),
            None => {
                self.tls_table.remove(&pattern);
            }
        }
        assembled.value = winner;
        if !assembled.users.is_empty() {
            self.tls.insert(pattern, assembled);
        }
    }
}

#[cfg(test)]
mod tests {
    //! The incremental build against the build from scratch, over random change sequences.

    use std::sync::LazyLock;

    use k8s_openapi::api::core::v1::{Secret, Service};
    use k8s_openapi::api::discovery::v1::EndpointSlice;
    use k8s_openapi::api::networking::v1::IngressClass;
    use proptest::prelude::*;
    use serde_json::{Value, json};

    use super::*;
    use crate::snapshot::backend::Target;
    use crate::snapshot::testing;
    use crate::store::Object;

    /// Everything routing-relevant in a snapshot, as text; `Arc` identities left out.
    fn describe(s: &Snapshot) -> String {
        fn route(r: &Route) -> String {
            let target = match &r.backend.target {
                Target::Endpoints(e) => format!(
                    "{:?}",
                    e.iter().map(|e| e.addr.to_string()).collect::<Vec<_>>()
                ),
                Target::ExternalName(n) => format!("dns {n}"),
                Target::Unavailable => "unavailable".into(),
            };
            format!(
                "{} tls={} {}:{} -> {target} {:?} {:?}",
                r.ingress, r.tls, r.backend.service, r.backend.port, r.policy, r.labels
            )
        }
        fn cert(c: &Certificate) -> String {
            format!("{:?} {:?}", c.source, c.dns_names)
        }
        let mut out = String::new();
        for (pattern, vhost) in s.hosts.iter() {
            out += &format!(
                "host {pattern} ({}) regex={} {:?}\n",
                vhost.pattern, vhost.nginx_regex, vhost.policy
            );
            for rule in vhost.paths.rules() {
                out += &format!(
                    "  {} {} {}\n",
                    rule.path,
                    rule.kind.as_str(),
                    route(&rule.target)
                );
            }
            if let Some(d) = &vhost.default_backend {
                out += &format!("  default {}\n", route(d));
            }
        }
        if let Some(d) = &s.default_backend {
            out += &format!("default {}\n", route(d));
        }
        for (pattern, r) in s.passthrough.iter() {
            out += &format!("passthrough {pattern} {}\n", route(r));
        }
        for (pattern, c) in s.tls.hosts.iter() {
            out += &format!("tls {pattern} {}\n", cert(c));
        }
        out += &format!("tls default {:?}\n", s.tls.default.as_deref().map(cert));
        for c in &s.tls.loaded {
            out += &format!("loaded {}\n", cert(c));
        }
        out += &format!("{:?}\n{:?}\n", s.sni, s.ingresses);
        for d in &s.diagnostics {
            out += &format!("{d:?}\n");
        }
        out
    }

    /// Certificates made once: for a.test and *.w.test; for b.test, valid only until 2030.
    static PEMS: LazyLock<[(String, String); 2]> = LazyLock::new(|| {
        let pem = |names: &[&str], until: i32| {
            let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
            let mut params = rcgen::CertificateParams::new(
                names.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
            )
            .unwrap();
            params.not_before = rcgen::date_time_ymd(2020, 1, 1);
            params.not_after = rcgen::date_time_ymd(until, 1, 1);
            (params.self_signed(&key).unwrap().pem(), key.serialize_pem())
        };
        [pem(&["a.test", "*.w.test"], 2099), pem(&["b.test"], 2030)]
    });

    const HOSTS: [Option<&str>; 6] = [
        Some("a.test"),
        Some("b.test"),
        Some("x.w.test"),
        Some("*.w.test"),
        None,
        Some("www.a.test"),
    ];

    #[derive(Clone, Debug)]
    enum Op {
        Ingress {
            i: u8,
            created: u8,
            class: bool,
            rules: Vec<(u8, Vec<(u8, bool, u8, u8)>)>,
            default: Option<u8>,
            tls: Option<(u8, u8)>,
            /// Indexes into [`annotation`], merged.
            annotations: Vec<u8>,
        },
        DeleteIngress(u8),
        Service {
            j: u8,
            port: u8,
            external: bool,
        },
        DeleteService(u8),
        Slice {
            k: u8,
            service: u8,
            port: u8,
            endpoints: Vec<(u8, bool)>,
        },
        DeleteSlice(u8),
        Secret {
            s: u8,
            which: u8,
        },
        DeleteSecret(u8),
        /// The same objects in new `Arc`s, as a relist gives them.
        Relist,
        Class(bool),
        Now(bool),
    }

    fn op() -> impl Strategy<Value = Op> {
        // Mostly a.test and /, so that Ingresses meet: conflicts, and canaries that find their
        // main route.
        let path = (
            prop_oneof![2 => Just(0u8), 1 => 0u8..3],
            prop::bool::weighted(0.25),
            0u8..4,
            0u8..3,
        );
        let rule = (
            prop_oneof![2 => Just(0u8), 3 => 0u8..6],
            prop::collection::vec(path, 0..3),
        );
        prop_oneof![
            6 => (
                0u8..5,
                0u8..3,
                prop::bool::weighted(0.9),
                prop::collection::vec(rule, 0..3),
                prop::option::of(0u8..4),
                prop::option::of((0u8..3, 0u8..6)),
                // Canaries often, or few would find their main route.
                prop::collection::vec(
                    prop_oneof![2 => 5u8..7, 3 => 0u8..ANNOTATIONS],
                    0..3
                ),
            )
                .prop_map(|(i, created, class, rules, default, tls, annotations)| Op::Ingress {
                    i,
                    created,
                    class,
                    rules,
                    default,
                    tls,
                    annotations,
                }),
            1 => (0u8..5).prop_map(Op::DeleteIngress),
            3 => (0u8..3, 0u8..3, prop::bool::weighted(0.15))
                .prop_map(|(j, port, external)| Op::Service { j, port, external }),
            1 => (0u8..3).prop_map(Op::DeleteService),
            4 => (0u8..4, 0u8..4, 0u8..2, prop::collection::vec((0u8..4, any::<bool>()), 0..3))
                .prop_map(|(k, service, port, endpoints)| Op::Slice {
                    k,
                    service,
                    port,
                    endpoints,
                }),
            1 => (0u8..4).prop_map(Op::DeleteSlice),
            1 => (0u8..2, 0u8..3).prop_map(|(s, which)| Op::Secret { s, which }),
            1 => (0u8..2).prop_map(Op::DeleteSecret),
            1 => Just(Op::Relist),
            1 => any::<bool>().prop_map(Op::Class),
            1 => any::<bool>().prop_map(Op::Now),
        ]
    }

    const ANNOTATIONS: u8 = 14;

    /// The annotations an Ingress of the property test may carry, among them every one whose
    /// effect crosses Ingresses: canary, use-regex and rewrite-target (a host's regex mode),
    /// server-alias and from-to-www-redirect (names beyond the host), app-root (per host).
    fn annotation(which: u8) -> Value {
        let n = |k: &str| format!("nginx.ingress.kubernetes.io/{k}");
        match which {
            1 => json!({n("ssl-passthrough"): "true"}),
            2 => json!({n("whitelist-source-range"): "10.0.0.0/8"}),
            3 => json!({n("ssl-redirect"): "false", n("use-regex"): "true"}),
            4 => json!({n("force-ssl-redirect"): "maybe"}),
            5 => json!({n("canary"): "true", n("canary-weight"): "30"}),
            6 => {
                json!({n("canary"): "true", n("canary-by-header"): "x-canary", n("proxy-body-size"): "1k"})
            }
            7 => json!({n("use-regex"): "true"}),
            8 => json!({n("rewrite-target"): "/$1"}),
            9 => json!({n("server-alias"): "b.test, alias.test, *.w.test"}),
            10 => json!({n("server-alias"): "alias.test, www.a.test"}),
            11 => json!({n("from-to-www-redirect"): "true"}),
            12 => json!({n("app-root"): "/app"}),
            13 => json!({n("whitelist-source-range"): "not a range"}),
            _ => json!({}),
        }
    }

    fn from<T: serde::de::DeserializeOwned>(value: Value) -> Arc<T> {
        Arc::new(serde_json::from_value(value).expect("a valid object"))
    }

    fn meta(name: String) -> Value {
        json!({"name": name, "namespace": "t"})
    }

    fn backend(service: u8, port: u8) -> Value {
        let port = match port {
            0 => json!({"number": 80}),
            1 => json!({"name": "http"}),
            2 => json!({"number": 81}),
            _ => json!({}),
        };
        json!({"service": {"name": format!("svc-{service}"), "port": port}})
    }

    fn apply(store: &mut Store, settings: &mut BuildSettings, op: Op) {
        match op {
            Op::Ingress {
                i,
                created,
                class,
                rules,
                default,
                tls,
                annotations: chosen,
            } => {
                let rules: Vec<Value> = rules
                    .into_iter()
                    .map(|(host, paths)| {
                        let paths: Vec<Value> = paths
                            .into_iter()
                            .map(|(path, exact, service, port)| {
                                let text = ["/", "/x", "/(bad"][usize::from(path)];
                                let kind = if path == 2 {
                                    "ImplementationSpecific"
                                } else if exact {
                                    "Exact"
                                } else {
                                    "Prefix"
                                };
                                json!({
                                    "path": text,
                                    "pathType": kind,
                                    "backend": backend(service, port),
                                })
                            })
                            .collect();
                        let mut rule = json!({"http": {"paths": paths}});
                        if let Some(host) = HOSTS[usize::from(host)] {
                            rule["host"] = json!(host);
                        }
                        rule
                    })
                    .collect();
                let mut annotations = json!({});
                for which in chosen {
                    if let (Some(all), Value::Object(more)) =
                        (annotations.as_object_mut(), annotation(which))
                    {
                        all.extend(more);
                    }
                }
                let mut spec = json!({"rules": rules});
                if class {
                    spec["ingressClassName"] = json!("ingress");
                }
                if let Some(service) = default {
                    spec["defaultBackend"] = backend(service, 0);
                }
                if let Some((secret, host)) = tls {
                    let mut entry = json!({"secretName": format!("sec-{secret}")});
                    if let Some(host) = HOSTS[usize::from(host)] {
                        entry["hosts"] = json!([host]);
                    }
                    spec["tls"] = json!([entry]);
                }
                let mut metadata = meta(format!("ing-{i}"));
                metadata["annotations"] = annotations;
                metadata["creationTimestamp"] =
                    json!(format!("2024-01-0{}T00:00:00Z", created + 1));
                store.apply(Object::Ingress(from::<Ingress>(
                    json!({"metadata": metadata, "spec": spec}),
                )));
            }
            Op::DeleteIngress(i) => {
                store.delete(Kind::Ingress, &ObjectKey::new("t", format!("ing-{i}")));
            }
            Op::Service { j, port, external } => {
                let mut spec = json!({"ports": [{"name": "http", "port": 80 + i32::from(port)}]});
                if external {
                    spec["type"] = json!("ExternalName");
                    spec["externalName"] = json!("backend.example");
                }
                store.apply(Object::Service(from::<Service>(
                    json!({"metadata": meta(format!("svc-{j}")), "spec": spec}),
                )));
            }
            Op::DeleteService(j) => {
                store.delete(Kind::Service, &ObjectKey::new("t", format!("svc-{j}")));
            }
            Op::Slice {
                k,
                service,
                port,
                endpoints,
            } => {
                let mut metadata = meta(format!("slice-{k}"));
                if service < 3 {
                    metadata["labels"] =
                        json!({"kubernetes.io/service-name": format!("svc-{service}")});
                }
                let endpoints: Vec<Value> = endpoints
                    .into_iter()
                    .map(|(e, ready)| {
                        // 10.9.9.9 is this node's address: refused.
                        let address =
                            ["10.0.0.1", "10.0.0.2", "10.9.9.9", "fd00::1"][usize::from(e)];
                        json!({"addresses": [address], "conditions": {"ready": ready}})
                    })
                    .collect();
                let name = if port == 0 { "http" } else { "other" };
                store.apply(Object::EndpointSlice(from::<EndpointSlice>(json!({
                    "metadata": metadata,
                    "addressType": "IPv4",
                    "ports": [{"name": name, "port": 8080}],
                    "endpoints": endpoints,
                }))));
            }
            Op::DeleteSlice(k) => {
                store.delete(
                    Kind::EndpointSlice,
                    &ObjectKey::new("t", format!("slice-{k}")),
                );
            }
            Op::Secret { s, which } => {
                let (crt, key) = match which {
                    0 | 1 => PEMS[usize::from(which)].clone(),
                    _ => ("garbage".to_string(), "garbage".to_string()),
                };
                let data = json!({
                    "tls.crt": k8s_openapi::ByteString(crt.into_bytes()),
                    "tls.key": k8s_openapi::ByteString(key.into_bytes()),
                });
                store.apply(Object::Secret(from::<Secret>(json!({
                    "metadata": meta(format!("sec-{s}")),
                    "type": "kubernetes.io/tls",
                    "data": data,
                }))));
            }
            Op::DeleteSecret(s) => {
                store.delete(Kind::Secret, &ObjectKey::new("t", format!("sec-{s}")));
            }
            Op::Relist => {
                for v in store.ingresses.values_mut() {
                    *v = Arc::new((**v).clone());
                }
                for v in store.services.values_mut() {
                    *v = Arc::new((**v).clone());
                }
                for v in store.endpoint_slices.values_mut() {
                    *v = Arc::new((**v).clone());
                }
                for v in store.secrets.values_mut() {
                    *v = Arc::new((**v).clone());
                }
            }
            Op::Class(present) => {
                let key = ObjectKey::new("", "ingress");
                if present {
                    store.apply(Object::IngressClass(from::<IngressClass>(json!({
                        "metadata": {"name": "ingress", "annotations": {"ingressclass.kubernetes.io/is-default-class": "true"}},
                        "spec": {"controller": "ingress.rs/controller"},
                    }))));
                } else {
                    store.delete(Kind::IngressClass, &key);
                }
            }
            // Past b.test's certificate's expiry, and back.
            Op::Now(late) => settings.tls.now = if late { 1_900_000_000 } else { 1_700_000_000 },
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

        #[test]
        fn incremental_builds_equal_builds_from_scratch(
            batches in prop::collection::vec(prop::collection::vec(op(), 1..4), 1..25)
        ) {
            let mut store = Store::default();
            let mut settings = testing::settings();
            let mut cache = BuildCache::default();
            for (generation, batch) in batches.into_iter().enumerate() {
                for op in batch {
                    apply(&mut store, &mut settings, op);
                }
                let (incremental, next) =
                    Snapshot::build_with(&store, &settings, generation as u64, cache);
                cache = next;
                let scratch = Snapshot::build(&store, &settings, generation as u64);
                prop_assert_eq!(describe(&incremental), describe(&scratch));
            }
        }
    }

    /// A change to one Ingress compiles that Ingress alone: the others' routes stay the same
    /// `Arc`s, and so does an untouched host.
    #[test]
    fn unchanged_ingresses_are_not_compiled_again() {
        let mut store = Store::default();
        let mut settings = testing::settings();
        for op in [
            Op::Service {
                j: 0,
                port: 0,
                external: false,
            },
            Op::Slice {
                k: 0,
                service: 0,
                port: 0,
                endpoints: vec![(0, true)],
            },
        ] {
            apply(&mut store, &mut settings, op);
        }
        for (i, host) in [(0, 0), (1, 1)] {
            apply(
                &mut store,
                &mut settings,
                Op::Ingress {
                    i,
                    created: 0,
                    class: true,
                    rules: vec![(host, vec![(0, false, 0, 0)])],
                    default: None,
                    tls: None,
                    annotations: Vec::new(),
                },
            );
        }
        let (first, cache) = Snapshot::build_with(&store, &settings, 1, BuildCache::default());
        apply(
            &mut store,
            &mut settings,
            Op::Ingress {
                i: 1,
                created: 0,
                class: true,
                rules: vec![(1, vec![(1, false, 0, 0)])],
                default: None,
                tls: None,
                annotations: Vec::new(),
            },
        );
        let (second, cache) = Snapshot::build_with(&store, &settings, 2, cache);
        let a = |s: &Snapshot| s.hosts.lookup("a.test").cloned().expect("a.test");
        let b = |s: &Snapshot| s.hosts.lookup("b.test").cloned().expect("b.test");
        assert!(Arc::ptr_eq(&a(&first), &a(&second)), "a.test untouched");
        assert!(!Arc::ptr_eq(&b(&first), &b(&second)), "b.test rebuilt");
        assert!(Arc::ptr_eq(&first.ingresses, &second.ingresses));
        // A slice change recompiles the Ingresses of its Service: both here.
        apply(
            &mut store,
            &mut settings,
            Op::Slice {
                k: 0,
                service: 0,
                port: 0,
                endpoints: vec![(1, true)],
            },
        );
        let (third, _) = Snapshot::build_with(&store, &settings, 3, cache);
        assert!(!Arc::ptr_eq(&a(&second), &a(&third)));
        assert_eq!(
            third
                .route(Some("a.test"), "/")
                .unwrap()
                .backend
                .endpoints()[0]
                .addr
                .to_string(),
            "10.0.0.2:8080"
        );
    }

    /// A canary is a user of its main route's host: adding, changing or removing it rebuilds
    /// that host (and only it), and the main route gets or loses its canary.
    #[test]
    fn a_canary_change_rebuilds_its_main_host_alone() {
        let mut store = Store::default();
        let mut settings = testing::settings();
        let ingress = |i, service, host, annotations| Op::Ingress {
            i,
            created: i,
            class: true,
            rules: vec![(host, vec![(0, false, service, 0)])],
            default: None,
            tls: None,
            annotations,
        };
        for op in [ingress(0, 0, 0, vec![]), ingress(1, 0, 1, vec![])] {
            apply(&mut store, &mut settings, op);
        }
        let canary = |s: &Snapshot| {
            s.route(Some("a.test"), "/")
                .and_then(|r| r.policy.canary.as_ref())
                .map(|c| c.ingress.name.clone())
        };
        let host = |s: &Snapshot, name: &str| s.hosts.lookup(name).cloned().expect("host");
        let (first, cache) = Snapshot::build_with(&store, &settings, 1, BuildCache::default());
        assert_eq!(canary(&first), None);
        apply(&mut store, &mut settings, ingress(2, 1, 0, vec![5]));
        let (second, cache) = Snapshot::build_with(&store, &settings, 2, cache);
        assert_eq!(canary(&second).as_deref(), Some("ing-2"));
        assert!(!Arc::ptr_eq(
            &host(&first, "a.test"),
            &host(&second, "a.test")
        ));
        assert!(Arc::ptr_eq(
            &host(&first, "b.test"),
            &host(&second, "b.test")
        ));
        store.delete(Kind::Ingress, &ObjectKey::new("t", "ing-2"));
        let (third, _) = Snapshot::build_with(&store, &settings, 3, cache);
        assert_eq!(canary(&third), None);
        assert!(Arc::ptr_eq(
            &host(&first, "b.test"),
            &host(&third, "b.test")
        ));
    }
}
