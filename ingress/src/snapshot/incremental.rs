//! Builds that cost what changed: the last build's work, kept for the next.
//!
//! ```text
//!   store.take_changes() ─> changed Ingresses, and the Ingresses that read a changed Service
//!     │                     (its slices count as it), Secret or ConfigMap
//!     ▼
//!   closure: their hosts, old and new, and every Ingress with a rule or TLS entry for one of
//!     │      those hosts, until nothing is added (what crosses Ingresses stays within a host)
//!     ▼
//!   the same Builder over just those Ingresses, oldest first ─> their hosts, TLS names,
//!     │      passthrough names, diagnostics, and what each read
//!     ▼
//!   the last tables with those hosts' entries replaced ─> Snapshot
//! ```
//!
//! What an Ingress read is recorded by the store as it is compiled (`Store::record_reads`),
//! not listed by hand, so a new annotation that reads a Secret is tracked without a change
//! here. A build starts from nothing instead when its result could reach beyond the closure's
//! hosts, or its inputs are not per Ingress:
//! - the first build, a whole-store or whole-kind replacement (a relist), other settings;
//! - an IngressClass, or an object the global configuration read (the `--configmap`
//!   ConfigMap and the ConfigMaps it names, `--default-backend-service`,
//!   `--default-certificate`);
//! - an Ingress with only a default backend (the snapshot's fallback, which every host's
//!   kernel source policy depends on);
//! - a host that `server-alias` or `from-to-www-redirect` claims or names, or an Ingress in the
//!   closure that asks for either (the extra names depend on every host's);
//! - a certificate's validity boundary between the last build's time and this one's;
//! - a closure of more than a quarter of the Ingresses (replaying them costs about as much).
//!
//! `Snapshot::build` is a build from nothing with an empty cache, and a property test holds
//! incremental builds to it.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use k8s_openapi::api::networking::v1::Ingress;

use super::backend::Resolved;
use super::certs::Certificate;
use super::global::GlobalSettings;
use super::host::{self, HostPattern, HostTable};
use super::sources::SourcePolicy;
use super::{
    BuildSettings, Builder, ExtraName, HostPolicy, IngressMeta, PathMatcher, Prepared, Route,
    Snapshot, VirtualHost, annotations, extra_certificates, extra_names, finish_host, gate_sources,
    headers, host_gate_sources, kernel_sees_client, owned_ingresses, prepare, sni, sni_name, tls,
};
use crate::diagnostics::Diagnostic;
use crate::store::{Changes, Kind, ObjectKey, Store};

/// What the last build made, and of what: owned by whoever builds (the publish pipeline), never
/// by a snapshot.
#[derive(Default)]
pub struct BuildCache {
    last: Option<Box<Last>>,
    /// How the last build went, for the log line and the metric.
    last_kind: BuildKind,
}

/// How a build went.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BuildKind {
    /// From nothing.
    #[default]
    Full,
    /// From the last build, redoing this many Ingresses.
    Incremental { ingresses: usize },
}

struct Last {
    settings: BuildSettings,
    prepared: Prepared,
    /// The global settings as published (with the error backend and own response headers).
    global: Arc<GlobalSettings>,
    /// The objects the global configuration was read from.
    global_reads: BTreeSet<(Kind, ObjectKey)>,
    global_diagnostics: Vec<Diagnostic>,
    resolved: Resolved,
    /// When a certificate judged so far becomes valid or expires.
    validity_bounds: BTreeSet<i64>,
    /// Our Ingresses, each as compiled.
    ingresses: HashMap<ObjectKey, Compiled>,
    /// Host → the Ingresses that name it; Vecs, not sets: most hold one (a set's first node
    /// alone is half a KiB, and at 10,000 hosts that shows in RSS).
    host_users: HashMap<HostPattern, Vec<ObjectKey>>,
    read_by: HashMap<(Kind, ObjectKey), Vec<ObjectKey>>,
    host_diagnostics: HashMap<HostPattern, Vec<Diagnostic>>,
    /// Hosts whose change could change the names `server-alias` and `from-to-www-redirect`
    /// add: the claiming hosts and every name they ask for.
    extra_sensitive: HashSet<HostPattern>,
    default_backend: Option<Arc<Route>>,
    hosts: HostTable<Arc<VirtualHost>>,
    tls_hosts: HostTable<Arc<Certificate>>,
    tls_default: Arc<Certificate>,
    passthrough: HostTable<Arc<Route>>,
    sni_names: BTreeMap<String, sni::Action>,
    gate_sources: BTreeMap<String, SourcePolicy>,
    ingress_meta: BTreeMap<ObjectKey, IngressMeta>,
    config_map: Option<(ObjectKey, Option<String>)>,
}

/// One of our Ingresses, as the last build that compiled it left it.
struct Compiled {
    /// The hosts of its rules and TLS entries.
    hosts: Vec<HostPattern>,
    /// What it read: Services (for their slices too), Secrets, ConfigMaps.
    reads: Vec<(Kind, ObjectKey)>,
    diagnostics: Vec<Diagnostic>,
    /// It has only a default backend: a candidate for the snapshot's.
    default: bool,
}

/// What one compiled Ingress gave, before it is indexed.
type Added = Vec<(ObjectKey, Compiled)>;

impl BuildCache {
    /// The snapshot of `store`, the same as [`Snapshot::build`] gives, redoing only what
    /// `changes` (everything since the last call) can have changed.
    pub fn build(
        &mut self,
        store: &Store,
        settings: &BuildSettings,
        generation: u64,
        changes: &Changes,
    ) -> Snapshot {
        if let Some(snapshot) = self.incremental(store, settings, generation, changes) {
            return snapshot;
        }
        self.last_kind = BuildKind::Full;
        self.full(store, settings, generation)
    }

    /// How the last build went.
    pub fn last_kind(&self) -> BuildKind {
        self.last_kind
    }

    fn full(&mut self, store: &Store, settings: &BuildSettings, generation: u64) -> Snapshot {
        self.last = None;
        store.record_reads();
        let prepared = prepare(store, settings);
        let mut global_reads = store.take_reads();
        let mut global_diagnostics = prepared.diagnostics.clone();
        let mut builder = Builder::new(store, settings, &prepared, Resolved::new());
        let owned = owned_ingresses(store, &settings.class);
        let added = add_ingresses(&mut builder, store, &owned);
        let mut ingresses: HashMap<ObjectKey, Compiled> = added.into_iter().collect();

        store.record_reads();
        let mut global = prepared.global.clone();
        global.error_backend = builder.error_backend(&global, settings.config_map.as_ref());
        if global.error_backend.is_none() {
            for (key, written) in std::mem::take(&mut builder.errors_without_backend) {
                if let Some(compiled) = ingresses.get_mut(&key) {
                    compiled
                        .diagnostics
                        .push(Builder::no_error_backend(&key, &written));
                }
            }
        }
        (global.own_response_headers, global.own_response_templates) =
            headers::own_responses(&builder.config_headers);
        let tls_default = builder.tls.default_certificate(&mut builder.diagnostics);
        global_reads.extend(store.take_reads());
        global_diagnostics.append(&mut builder.diagnostics);
        let validity_bounds = builder.tls.validity_bounds().collect();

        let Builder {
            tls: tls_builder,
            hosts: host_builders,
            passthrough: passthrough_routes,
            default_backend,
            resolver,
            ..
        } = builder;
        let extra = extra_names(&host_builders, &mut global_diagnostics);
        let mut extra_sensitive: HashSet<HostPattern> = extra.keys().cloned().collect();
        for (pattern, host) in &host_builders {
            if let Some((_, _, aliases)) = &host.aliases {
                extra_sensitive.insert(pattern.clone());
                extra_sensitive.extend(aliases.iter().cloned());
            }
            if host.www.is_some() {
                extra_sensitive.insert(pattern.clone());
                if let HostPattern::Exact(to) = pattern {
                    extra_sensitive.insert(HostPattern::Exact(super::www_partner(to)));
                }
            }
        }
        let mut tls_hosts = HostTable::default();
        for (pattern, cert) in tls_builder.into_hosts() {
            tls_hosts.insert(pattern, cert);
        }
        extra_certificates(&mut tls_hosts, &extra);

        let mut host_diagnostics = HashMap::new();
        let mut built: BTreeMap<HostPattern, Arc<VirtualHost>> = BTreeMap::new();
        for (pattern, host) in host_builders {
            let mut diagnostics = Vec::new();
            let vhost = finish_host(&pattern, host, &mut diagnostics);
            if !diagnostics.is_empty() {
                host_diagnostics.insert(pattern.clone(), diagnostics);
            }
            built.insert(pattern, vhost);
        }
        for (name, extra) in extra {
            let vhost = match extra {
                ExtraName::Alias(of) => built.get(&of).cloned(),
                ExtraName::WwwRedirect(to) => Some(Arc::new(VirtualHost {
                    pattern: name.clone(),
                    paths: PathMatcher::default(),
                    default_backend: None,
                    policy: HostPolicy {
                        www_redirect: Some(to.into()),
                        ..HostPolicy::default()
                    },
                    nginx_regex: false,
                })),
            };
            if let Some(vhost) = vhost {
                built.insert(name, vhost);
            }
        }

        let mut last = Last {
            settings: settings.clone(),
            prepared,
            global: Arc::new(global),
            global_reads,
            global_diagnostics,
            resolved: resolver.into_resolved(),
            validity_bounds,
            ingresses: HashMap::new(),
            host_users: HashMap::new(),
            read_by: HashMap::new(),
            host_diagnostics,
            extra_sensitive,
            default_backend,
            hosts: HostTable::default(),
            tls_hosts,
            tls_default,
            passthrough: HostTable::default(),
            sni_names: BTreeMap::new(),
            gate_sources: BTreeMap::new(),
            ingress_meta: owned
                .iter()
                .map(|(key, ingress)| ((*key).clone(), IngressMeta::of(ingress)))
                .collect(),
            config_map: config_map_of(store, settings),
        };
        last.put_hosts(built, passthrough_routes);
        for (key, compiled) in ingresses.drain() {
            last.index(key, compiled);
        }
        let snapshot = last.snapshot(store, settings, generation);
        self.last = Some(Box::new(last));
        snapshot
    }

    /// The build from the last one, or `None` when it must start from nothing.
    fn incremental(
        &mut self,
        store: &Store,
        settings: &BuildSettings,
        generation: u64,
        changes: &Changes,
    ) -> Option<Snapshot> {
        let last = self.last.as_mut()?;
        if changes.all || !same_settings(&last.settings, settings) {
            return None;
        }
        let (from, to) = (last.settings.tls.now, settings.tls.now);
        if last
            .validity_bounds
            .range(from.min(to)..=from.max(to))
            .next()
            .is_some()
        {
            return None;
        }
        let mut seeds = Vec::new();
        for (kind, key) in &changes.objects {
            if last.global_reads.contains(&(*kind, key.clone())) {
                return None;
            }
            match kind {
                Kind::IngressClass => return None,
                Kind::Ingress => seeds.push(key.clone()),
                // What routes read of a slice they read through its Service, which the store
                // lists as changed with it.
                Kind::EndpointSlice => {}
                Kind::Service | Kind::Secret | Kind::ConfigMap => {
                    if let Some(readers) = last.read_by.get(&(*kind, key.clone())) {
                        seeds.extend(readers.iter().cloned());
                    }
                }
            }
        }
        let (closure, dirty) = last.closure(store, settings, seeds)?;

        let mut owned: Vec<(&ObjectKey, &Ingress)> = closure
            .iter()
            .filter_map(|key| store.ingresses.get_key_value(key))
            .filter(|(_, ingress)| settings.class.owns(ingress, &store.ingress_classes))
            .map(|(key, ingress)| (key, ingress.as_ref()))
            .collect();
        owned.sort_by_key(|(key, ing)| {
            (ing.metadata.creation_timestamp.as_ref().map(|t| t.0), *key)
        });
        let mut resolved = std::mem::take(&mut last.resolved);
        let changed_services: HashSet<&ObjectKey> = changes
            .objects
            .iter()
            .filter(|(kind, _)| *kind == Kind::Service)
            .map(|(_, key)| key)
            .collect();
        if !changed_services.is_empty() {
            resolved.retain(|(service, ..), _| !changed_services.contains(service));
        }
        let mut builder = Builder::new(store, settings, &last.prepared, resolved);
        builder.default_backend = last.default_backend.clone();
        let added = add_ingresses(&mut builder, store, &owned);
        if builder
            .hosts
            .values()
            .any(|host| host.aliases.is_some() || host.www.is_some())
        {
            return None;
        }
        let mut added: HashMap<ObjectKey, Compiled> = added.into_iter().collect();
        if last.global.error_backend.is_none() {
            for (key, written) in std::mem::take(&mut builder.errors_without_backend) {
                if let Some(compiled) = added.get_mut(&key) {
                    compiled
                        .diagnostics
                        .push(Builder::no_error_backend(&key, &written));
                }
            }
        }
        last.validity_bounds.extend(builder.tls.validity_bounds());
        let Builder {
            tls: tls_builder,
            hosts: host_builders,
            passthrough: passthrough_routes,
            resolver,
            ..
        } = builder;
        last.resolved = resolver.into_resolved();

        for pattern in &dirty {
            last.hosts.remove(pattern);
            last.tls_hosts.remove(pattern);
            last.passthrough.remove(pattern);
            last.host_diagnostics.remove(pattern);
            if let Some(name) = sni_name(pattern) {
                last.sni_names.remove(&name);
                last.gate_sources.remove(&name);
            }
        }
        for (pattern, cert) in tls_builder.into_hosts() {
            last.tls_hosts.insert(pattern, cert);
        }
        let mut built = BTreeMap::new();
        for (pattern, host) in host_builders {
            let mut diagnostics = Vec::new();
            let vhost = finish_host(&pattern, host, &mut diagnostics);
            if !diagnostics.is_empty() {
                last.host_diagnostics.insert(pattern.clone(), diagnostics);
            }
            built.insert(pattern, vhost);
        }
        last.put_hosts(built, passthrough_routes);

        for key in &closure {
            last.unindex(key);
            match store.ingresses.get(key) {
                Some(ingress) if added.contains_key(key) => {
                    last.ingress_meta
                        .insert(key.clone(), IngressMeta::of(ingress));
                }
                _ => {
                    last.ingress_meta.remove(key);
                }
            }
        }
        for (key, compiled) in added {
            last.index(key, compiled);
        }
        last.settings.tls.now = settings.tls.now;
        self.last_kind = BuildKind::Incremental {
            ingresses: closure.len(),
        };
        Some(last.snapshot(store, settings, generation))
    }
}

impl Last {
    /// The Ingresses to compile again for `seeds`, and the hosts whose entries they replace;
    /// `None` when the build must start from nothing.
    fn closure(
        &self,
        store: &Store,
        settings: &BuildSettings,
        seeds: Vec<ObjectKey>,
    ) -> Option<(BTreeSet<ObjectKey>, BTreeSet<HostPattern>)> {
        let limit = (self.ingresses.len() / 4).max(64);
        let mut closure = BTreeSet::new();
        let mut dirty = BTreeSet::new();
        let mut queue = seeds;
        while let Some(key) = queue.pop() {
            if closure.contains(&key) {
                continue;
            }
            if closure.len() >= limit {
                return None;
            }
            let old = self.ingresses.get(&key);
            let new = store
                .ingresses
                .get(&key)
                .filter(|ingress| settings.class.owns(ingress, &store.ingress_classes));
            if old.is_some_and(|c| c.default) || new.is_some_and(|i| only_default(i)) {
                return None;
            }
            let new_hosts = new.map(|i| touched_hosts(i)).unwrap_or_default();
            for pattern in old
                .map(|c| c.hosts.as_slice())
                .unwrap_or_default()
                .iter()
                .chain(&new_hosts)
            {
                if dirty.contains(pattern) {
                    continue;
                }
                if self.extra_sensitive.contains(pattern) {
                    return None;
                }
                dirty.insert(pattern.clone());
                if let Some(users) = self.host_users.get(pattern) {
                    queue.extend(users.iter().cloned());
                }
            }
            closure.insert(key);
        }
        Some((closure, dirty))
    }

    /// Puts built hosts and passthrough routes into the tables, with their SNI names and kernel
    /// source policies (a passthrough name replaces an HTTP host's of the same name at the gate).
    fn put_hosts(
        &mut self,
        built: BTreeMap<HostPattern, Arc<VirtualHost>>,
        passthrough: BTreeMap<HostPattern, Arc<Route>>,
    ) {
        let judge = kernel_sees_client(&self.global);
        for (pattern, vhost) in built {
            if let Some(name) = sni_name(&pattern) {
                let policy = host_gate_sources(&vhost, self.default_backend.as_ref());
                match policy.filter(|_| judge) {
                    Some(policy) => {
                        self.gate_sources.insert(name.clone(), policy);
                    }
                    None => {
                        self.gate_sources.remove(&name);
                    }
                }
                self.sni_names.insert(name, sni::Action::Pass);
            }
            self.hosts.insert(pattern, vhost);
        }
        for (pattern, route) in passthrough {
            if let Some(name) = sni_name(&pattern) {
                match gate_sources::uniform(std::iter::once(&route.policy.access)) {
                    Some(policy) if judge => {
                        self.gate_sources.insert(name.clone(), policy);
                    }
                    _ => {
                        self.gate_sources.remove(&name);
                    }
                }
                self.sni_names.insert(name, sni::Action::Passthrough);
            }
            self.passthrough.insert(pattern, route);
        }
    }

    fn index(&mut self, key: ObjectKey, compiled: Compiled) {
        for pattern in &compiled.hosts {
            self.host_users
                .entry(pattern.clone())
                .or_default()
                .push(key.clone());
        }
        for read in &compiled.reads {
            self.read_by
                .entry(read.clone())
                .or_default()
                .push(key.clone());
        }
        self.ingresses.insert(key, compiled);
    }

    fn unindex(&mut self, key: &ObjectKey) {
        let Some(compiled) = self.ingresses.remove(key) else {
            return;
        };
        for pattern in &compiled.hosts {
            if let Some(users) = self.host_users.get_mut(pattern) {
                users.retain(|user| user != key);
                if users.is_empty() {
                    self.host_users.remove(pattern);
                }
            }
        }
        for read in &compiled.reads {
            if let Some(readers) = self.read_by.get_mut(read) {
                readers.retain(|reader| reader != key);
                if readers.is_empty() {
                    self.read_by.remove(read);
                }
            }
        }
    }

    fn snapshot(&self, store: &Store, settings: &BuildSettings, generation: u64) -> Snapshot {
        let mut diagnostics = store.source_diagnostics.clone();
        diagnostics.extend(self.global_diagnostics.iter().cloned());
        for compiled in self.ingresses.values() {
            diagnostics.extend(compiled.diagnostics.iter().cloned());
        }
        for host in self.host_diagnostics.values() {
            diagnostics.extend(host.iter().cloned());
        }
        diagnostics.sort();
        diagnostics.dedup();
        Snapshot {
            generation,
            hosts: self.hosts.clone(),
            default_backend: self.default_backend.clone(),
            diagnostics,
            ingresses: self.ingress_meta.clone(),
            tls: tls::TlsTable {
                loaded: tls::loaded(&self.tls_hosts, &self.tls_default),
                hosts: self.tls_hosts.clone(),
                default: Some(self.tls_default.clone()),
            },
            sni: sni::SniPolicy {
                names: self.sni_names.clone(),
                catch_all: self.default_backend.is_some() || self.hosts.any().is_some(),
                unnamed: settings.unnamed,
                sources: gate_sources::GateSources::assign(self.gate_sources.clone()),
                proxy_protocol: self.global.proxy_protocol,
            },
            passthrough: self.passthrough.clone(),
            global: self.global.clone(),
            config_map: self.config_map.clone(),
        }
    }
}

/// Adds Ingresses (ours, oldest first) to `builder`, canaries after every main Ingress (a
/// canary is attached to the main route with its host, path and type, whichever is older),
/// recording what each read and reported.
fn add_ingresses(
    builder: &mut Builder<'_>,
    store: &Store,
    owned: &[(&ObjectKey, &Ingress)],
) -> Added {
    let mut added = Vec::with_capacity(owned.len());
    let mut canaries = Vec::new();
    for (rank, (key, ingress)) in owned.iter().enumerate() {
        builder.rank = rank;
        if annotations::parse(ingress.metadata.annotations.as_ref())
            .0
            .canary
            .is_some()
        {
            canaries.push((*key, *ingress));
            continue;
        }
        added.push(compile(builder, store, key, ingress, |b| {
            b.add_ingress(key, ingress)
        }));
    }
    for (key, ingress) in canaries {
        added.push(compile(builder, store, key, ingress, |b| {
            b.add_canary(key, ingress)
        }));
    }
    added
}

fn compile<'s>(
    builder: &mut Builder<'s>,
    store: &Store,
    key: &ObjectKey,
    ingress: &Ingress,
    add: impl FnOnce(&mut Builder<'s>),
) -> (ObjectKey, Compiled) {
    store.record_reads();
    let earlier = std::mem::take(&mut builder.diagnostics);
    add(builder);
    let diagnostics = std::mem::replace(&mut builder.diagnostics, earlier);
    let compiled = Compiled {
        hosts: touched_hosts(ingress),
        reads: store.take_reads().into_iter().collect(),
        diagnostics,
        default: only_default(ingress),
    };
    (key.clone(), compiled)
}

/// The hosts an Ingress's rules and TLS entries name (those that parse).
fn touched_hosts(ingress: &Ingress) -> Vec<HostPattern> {
    let Some(spec) = &ingress.spec else {
        return Vec::new();
    };
    let rules = spec.rules.iter().flatten().map(|rule| rule.host.as_deref());
    // A TLS entry without hosts names the rules' hosts, which are in already.
    let tls = spec
        .tls
        .iter()
        .flatten()
        .flat_map(|entry| entry.hosts.iter().flatten().map(|h| Some(h.as_str())));
    let mut hosts: Vec<HostPattern> = rules
        .chain(tls)
        .filter_map(|name| host::parse_pattern(name).ok())
        .collect();
    hosts.sort();
    hosts.dedup();
    hosts
}

/// Whether an Ingress has no rules and a default backend: the snapshot's fallback candidate.
fn only_default(ingress: &Ingress) -> bool {
    ingress.spec.as_ref().is_some_and(|spec| {
        spec.rules.as_deref().unwrap_or_default().is_empty() && spec.default_backend.is_some()
    })
}

/// The `--configmap` ConfigMap, when it exists, with its uid.
fn config_map_of(store: &Store, settings: &BuildSettings) -> Option<(ObjectKey, Option<String>)> {
    settings.config_map.as_ref().and_then(|key| {
        let cm = store.config_maps.get(key)?;
        Some((key.clone(), cm.metadata.uid.clone()))
    })
}

/// Everything but the build time; `self_signed` by identity.
fn same_settings(a: &BuildSettings, b: &BuildSettings) -> bool {
    a.class == b.class
        && a.tls.default_certificate == b.tls.default_certificate
        && Arc::ptr_eq(&a.tls.self_signed, &b.tls.self_signed)
        && a.backends == b.backends
        && a.unsupported_access == b.unsupported_access
        && a.unnamed == b.unnamed
        && a.global == b.global
        && a.config_map == b.config_map
}

#[cfg(test)]
mod tests;
