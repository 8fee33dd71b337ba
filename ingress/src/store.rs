//! Every object the sources have seen, typed and keyed by namespace/name.
//!
//! ```text
//!   manifests dir ──┐
//!                   ├──> Store ──> Snapshot::build (pure) ──> consumers
//!   kube watches ───┘
//! ```
//!
//! The store knows nothing about routing. Sources only `apply` and `delete`; the snapshot
//! builder only reads.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use k8s_openapi::Metadata;
use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::{Ingress, IngressClass};

use crate::diagnostics::Diagnostic;
pub use crate::object::{Kind, ObjectKey};

/// One typed object, as a source hands it over.
#[derive(Clone, Debug)]
pub enum Object {
    Ingress(Arc<Ingress>),
    IngressClass(Arc<IngressClass>),
    Service(Arc<Service>),
    EndpointSlice(Arc<EndpointSlice>),
    Secret(Arc<Secret>),
    ConfigMap(Arc<ConfigMap>),
}

impl Object {
    pub fn kind(&self) -> Kind {
        match self {
            Object::Ingress(_) => Kind::Ingress,
            Object::IngressClass(_) => Kind::IngressClass,
            Object::Service(_) => Kind::Service,
            Object::EndpointSlice(_) => Kind::EndpointSlice,
            Object::Secret(_) => Kind::Secret,
            Object::ConfigMap(_) => Kind::ConfigMap,
        }
    }

    pub fn key(&self) -> ObjectKey {
        match self {
            Object::Ingress(o) => key_of(o.as_ref(), true),
            Object::IngressClass(o) => key_of(o.as_ref(), false),
            Object::Service(o) => key_of(o.as_ref(), true),
            Object::EndpointSlice(o) => key_of(o.as_ref(), true),
            Object::Secret(o) => key_of(o.as_ref(), true),
            Object::ConfigMap(o) => key_of(o.as_ref(), true),
        }
    }
}

/// Namespaced objects without a namespace land in "default", as `kubectl apply` would put them.
fn key_of<T>(obj: &T, namespaced: bool) -> ObjectKey
where
    T: Metadata<Ty = k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta>,
{
    let meta = obj.metadata();
    let namespace = if namespaced {
        meta.namespace
            .clone()
            .filter(|ns| !ns.is_empty())
            .unwrap_or_else(|| "default".into())
    } else {
        String::new()
    };
    ObjectKey {
        namespace,
        name: meta.name.clone().unwrap_or_default(),
    }
}

/// What a source tells the pipeline.
#[derive(Debug)]
pub enum SourceEvent {
    /// The whole store, as a manifests directory reads.
    Replace(Box<Store>),
    /// Every object of one kind, after a (re)list: replaces that kind wholesale.
    ReplaceKind(Kind, Vec<Object>),
    /// Every object of one kind in one namespace (`name`: that one object), after the
    /// (re)list of a watch narrower than the kind: the kind's other objects stay.
    ReplaceIn {
        kind: Kind,
        namespace: String,
        name: Option<String>,
        objects: Vec<Object>,
    },
    Apply(Object),
    Delete(Kind, ObjectKey),
    /// Every cache has its initial list; snapshots may be built from now on.
    Synced,
}

/// The controller's view of the world. Cheap to clone: objects are shared.
/// Every object, by kind and key. Sources change it only through [`Store::apply`],
/// [`Store::delete`] and the replace methods, which keep the change log and the slice index.
#[derive(Clone, Debug, Default)]
pub struct Store {
    pub ingresses: BTreeMap<ObjectKey, Arc<Ingress>>,
    pub ingress_classes: BTreeMap<ObjectKey, Arc<IngressClass>>,
    pub services: BTreeMap<ObjectKey, Arc<Service>>,
    pub endpoint_slices: BTreeMap<ObjectKey, Arc<EndpointSlice>>,
    pub secrets: BTreeMap<ObjectKey, Arc<Secret>>,
    pub config_maps: BTreeMap<ObjectKey, Arc<ConfigMap>>,
    pub source_diagnostics: Vec<Diagnostic>,
    /// Service → the keys of its EndpointSlices (by the `kubernetes.io/service-name` label),
    /// sorted; a Vec, as most Services have one or two.
    slices_by_service: HashMap<ObjectKey, Vec<ObjectKey>>,
    /// What changed since the last [`Store::take_changes`].
    changes: Changes,
    /// The objects read since [`Store::record_reads`], while recording.
    reads: Reads,
}

/// The EndpointSlice label naming the Service a slice belongs to.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// What changed in a store since the changes were last taken: the input of an incremental
/// build. A slice's change is its Service's (old and new owner both), since what routes read of
/// a slice, they read through its Service.
#[derive(Clone, Debug, Default)]
pub struct Changes {
    /// Everything may have changed (a whole-store or whole-kind replacement).
    pub all: bool,
    pub objects: BTreeSet<(Kind, ObjectKey)>,
}

impl Changes {
    /// Changes that force a build from nothing.
    pub fn everything() -> Self {
        Self {
            all: true,
            objects: BTreeSet::new(),
        }
    }

    pub fn is_empty(&self) -> bool {
        !self.all && self.objects.is_empty()
    }
}

/// A log of the objects one part of a build read, so that a later build knows what that part
/// depends on. Recording is off unless asked for; a clone starts empty and off.
#[derive(Debug, Default)]
struct Reads(Mutex<Option<BTreeSet<(Kind, ObjectKey)>>>);

impl Clone for Reads {
    fn clone(&self) -> Self {
        Self::default()
    }
}

impl Reads {
    fn note(&self, kind: Kind, key: &ObjectKey) {
        // Poisoning cannot leave the set half-written in a way that matters: it only grows.
        let mut reads = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(reads) = reads.as_mut() {
            reads.insert((kind, key.clone()));
        }
    }
}

impl Store {
    /// Inserts or replaces an object. Returns the object it replaced, if any.
    pub fn apply(&mut self, mut object: Object) -> Option<Object> {
        compact(&mut object);
        let key = object.key();
        self.changes.objects.insert((object.kind(), key.clone()));
        match object {
            Object::Ingress(o) => self.ingresses.insert(key, o).map(Object::Ingress),
            Object::IngressClass(o) => self
                .ingress_classes
                .insert(key, o)
                .map(Object::IngressClass),
            Object::Service(o) => self.services.insert(key, o).map(Object::Service),
            Object::EndpointSlice(o) => {
                let old = self.endpoint_slices.insert(key.clone(), o.clone());
                if let Some(old) = &old {
                    self.index_slice(&key, old, false);
                }
                self.index_slice(&key, &o, true);
                old.map(Object::EndpointSlice)
            }
            Object::Secret(o) => self.secrets.insert(key, o).map(Object::Secret),
            Object::ConfigMap(o) => self.config_maps.insert(key, o).map(Object::ConfigMap),
        }
    }

    /// Adds or removes `slice` in its Service's entry of the slice index, and notes the
    /// Service as changed.
    fn index_slice(&mut self, key: &ObjectKey, slice: &EndpointSlice, add: bool) {
        let Some(service) = service_of(key, slice) else {
            return;
        };
        self.changes
            .objects
            .insert((Kind::Service, service.clone()));
        if add {
            let slices = self.slices_by_service.entry(service).or_default();
            if let Err(at) = slices.binary_search(key) {
                slices.insert(at, key.clone());
            }
        } else if let Some(slices) = self.slices_by_service.get_mut(&service) {
            slices.retain(|slice| slice != key);
            if slices.is_empty() {
                self.slices_by_service.remove(&service);
            }
        }
    }

    pub fn apply_event(&mut self, event: SourceEvent) -> bool {
        match event {
            SourceEvent::Replace(new) => self.replace(*new),
            SourceEvent::ReplaceKind(kind, objects) => self.replace_kind(kind, objects),
            SourceEvent::ReplaceIn {
                kind,
                namespace,
                name,
                objects,
            } => self.replace_in(kind, &namespace, name.as_deref(), objects),
            SourceEvent::Apply(object) => {
                self.apply(object);
            }
            SourceEvent::Delete(kind, key) => {
                self.delete(kind, &key);
            }
            SourceEvent::Synced => return true,
        }
        false
    }

    pub fn delete(&mut self, kind: Kind, key: &ObjectKey) -> bool {
        self.changes.objects.insert((kind, key.clone()));
        match kind {
            Kind::Ingress => self.ingresses.remove(key).is_some(),
            Kind::IngressClass => self.ingress_classes.remove(key).is_some(),
            Kind::Service => self.services.remove(key).is_some(),
            Kind::EndpointSlice => match self.endpoint_slices.remove(key) {
                Some(old) => {
                    self.index_slice(key, &old, false);
                    true
                }
                None => false,
            },
            Kind::Secret => self.secrets.remove(key).is_some(),
            Kind::ConfigMap => self.config_maps.remove(key).is_some(),
        }
    }

    /// Becomes `new` (a manifests directory read again), logging as changed only the objects
    /// that differ: an edit to one file costs a build of what it changed, not of everything.
    pub fn replace(&mut self, new: Store) {
        let mut changes = std::mem::take(&mut self.changes);
        changes.all |= new.changes.all;
        differing(&self.ingresses, &new.ingresses, Kind::Ingress, &mut changes);
        differing(
            &self.ingress_classes,
            &new.ingress_classes,
            Kind::IngressClass,
            &mut changes,
        );
        differing(&self.services, &new.services, Kind::Service, &mut changes);
        differing(&self.secrets, &new.secrets, Kind::Secret, &mut changes);
        differing(
            &self.config_maps,
            &new.config_maps,
            Kind::ConfigMap,
            &mut changes,
        );
        let mut slices = Changes::default();
        differing(
            &self.endpoint_slices,
            &new.endpoint_slices,
            Kind::EndpointSlice,
            &mut slices,
        );
        for (_, key) in &slices.objects {
            // A slice's change is its Service's, before and after.
            let owners = [self.endpoint_slices.get(key), new.endpoint_slices.get(key)];
            for slice in owners.into_iter().flatten() {
                if let Some(service) = service_of(key, slice) {
                    changes.objects.insert((Kind::Service, service));
                }
            }
        }
        changes.objects.append(&mut slices.objects);
        let reads = std::mem::take(&mut self.reads);
        *self = new;
        self.reads = reads;
        self.changes = changes;
    }

    pub fn replace_kind(&mut self, kind: Kind, objects: Vec<Object>) {
        self.changes.all = true;
        if kind == Kind::EndpointSlice {
            self.slices_by_service.clear();
        }
        match kind {
            Kind::Ingress => self.ingresses.clear(),
            Kind::IngressClass => self.ingress_classes.clear(),
            Kind::Service => self.services.clear(),
            Kind::EndpointSlice => self.endpoint_slices.clear(),
            Kind::Secret => self.secrets.clear(),
            Kind::ConfigMap => self.config_maps.clear(),
        }
        for object in objects.into_iter().filter(|o| o.kind() == kind) {
            self.apply(object);
        }
    }

    /// Replaces the objects of `kind` in `namespace` (only the one called `name`, if given),
    /// keeping every other object.
    pub fn replace_in(
        &mut self,
        kind: Kind,
        namespace: &str,
        name: Option<&str>,
        objects: Vec<Object>,
    ) {
        let inside =
            |key: &ObjectKey| key.namespace == namespace && name.is_none_or(|n| key.name == n);
        let stale: Vec<ObjectKey> = self.keys(kind).into_iter().filter(|k| inside(k)).collect();
        for key in stale {
            self.delete(kind, &key);
        }
        for object in objects
            .into_iter()
            .filter(|o| o.kind() == kind && inside(&o.key()))
        {
            self.apply(object);
        }
    }

    fn keys(&self, kind: Kind) -> Vec<ObjectKey> {
        fn of<V>(map: &BTreeMap<ObjectKey, V>) -> Vec<ObjectKey> {
            map.keys().cloned().collect()
        }
        match kind {
            Kind::Ingress => of(&self.ingresses),
            Kind::IngressClass => of(&self.ingress_classes),
            Kind::Service => of(&self.services),
            Kind::EndpointSlice => of(&self.endpoint_slices),
            Kind::Secret => of(&self.secrets),
            Kind::ConfigMap => of(&self.config_maps),
        }
    }

    pub fn contains(&self, kind: Kind, key: &ObjectKey) -> bool {
        match kind {
            Kind::Ingress => self.ingresses.contains_key(key),
            Kind::IngressClass => self.ingress_classes.contains_key(key),
            Kind::Service => self.services.contains_key(key),
            Kind::EndpointSlice => self.endpoint_slices.contains_key(key),
            Kind::Secret => self.secrets.contains_key(key),
            Kind::ConfigMap => self.config_maps.contains_key(key),
        }
    }

    /// What changed since the last call (or since the store was made), emptied.
    pub fn take_changes(&mut self) -> Changes {
        std::mem::take(&mut self.changes)
    }

    /// Starts noting every object read through the accessors below.
    pub fn record_reads(&self) {
        *self.reads.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(BTreeSet::new());
    }

    /// What was read since [`Store::record_reads`]; recording stops.
    pub fn take_reads(&self) -> BTreeSet<(Kind, ObjectKey)> {
        self.reads
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .unwrap_or_default()
    }

    /// Notes an object as read, for a reader that kept what it read earlier.
    pub fn note_read(&self, kind: Kind, key: &ObjectKey) {
        self.reads.note(kind, key);
    }

    /// A Service, noted as read (with its EndpointSlices: a build reads those through it).
    pub fn service(&self, key: &ObjectKey) -> Option<&Arc<Service>> {
        self.reads.note(Kind::Service, key);
        self.services.get(key)
    }

    /// The EndpointSlices of a Service, noted as a read of the Service.
    pub fn slices_of(&self, service: &ObjectKey) -> impl Iterator<Item = &Arc<EndpointSlice>> {
        self.reads.note(Kind::Service, service);
        self.slices_by_service
            .get(service)
            .into_iter()
            .flatten()
            .filter_map(|key| self.endpoint_slices.get(key))
    }

    /// A Secret, noted as read.
    pub fn secret(&self, key: &ObjectKey) -> Option<&Arc<Secret>> {
        self.reads.note(Kind::Secret, key);
        self.secrets.get(key)
    }

    /// A ConfigMap, noted as read.
    pub fn config_map(&self, key: &ObjectKey) -> Option<&Arc<ConfigMap>> {
        self.reads.note(Kind::ConfigMap, key);
        self.config_maps.get(key)
    }

    pub fn len(&self) -> usize {
        self.ingresses.len()
            + self.ingress_classes.len()
            + self.services.len()
            + self.endpoint_slices.len()
            + self.secrets.len()
            + self.config_maps.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Logs the keys whose object is not in both maps, or differs between them.
fn differing<T: PartialEq>(
    old: &BTreeMap<ObjectKey, Arc<T>>,
    new: &BTreeMap<ObjectKey, Arc<T>>,
    kind: Kind,
    changes: &mut Changes,
) {
    let removed = old.keys().filter(|key| !new.contains_key(*key));
    let changed = new
        .iter()
        .filter(|(key, object)| {
            old.get(*key)
                .is_none_or(|was| !Arc::ptr_eq(was, object) && was != *object)
        })
        .map(|(key, _)| key);
    for key in removed.chain(changed) {
        changes.objects.insert((kind, key.clone()));
    }
}

/// Gives back the spare room deserializing leaves in an object's lists: a list grows to four
/// entries at its first element, and most hold one or two (an EndpointSlice's endpoints, an
/// Ingress's paths). At 20,000 EndpointSlices and 10,000 Ingresses that is about 20 MiB. Only
/// an object no one else holds yet is changed.
fn compact(object: &mut Object) {
    match object {
        Object::EndpointSlice(slice) => {
            let Some(slice) = Arc::get_mut(slice) else {
                return;
            };
            if let Some(endpoints) = slice.endpoints.as_mut() {
                for endpoint in endpoints.iter_mut() {
                    endpoint.addresses.shrink_to_fit();
                }
                endpoints.shrink_to_fit();
            }
            if let Some(ports) = slice.ports.as_mut() {
                ports.shrink_to_fit();
            }
        }
        Object::Ingress(ingress) => {
            let Some(spec) = Arc::get_mut(ingress).and_then(|i| i.spec.as_mut()) else {
                return;
            };
            if let Some(rules) = spec.rules.as_mut() {
                for rule in rules.iter_mut() {
                    if let Some(http) = rule.http.as_mut() {
                        http.paths.shrink_to_fit();
                    }
                }
                rules.shrink_to_fit();
            }
            if let Some(tls) = spec.tls.as_mut() {
                tls.shrink_to_fit();
            }
        }
        Object::Service(service) => {
            let ports = Arc::get_mut(service)
                .and_then(|s| s.spec.as_mut())
                .and_then(|spec| spec.ports.as_mut());
            if let Some(ports) = ports {
                ports.shrink_to_fit();
            }
        }
        _ => {}
    }
}

/// The Service an EndpointSlice belongs to, by its label, in the slice's namespace.
pub fn service_of(key: &ObjectKey, slice: &EndpointSlice) -> Option<ObjectKey> {
    let name = slice.metadata.labels.as_ref()?.get(SERVICE_NAME_LABEL)?;
    Some(ObjectKey::new(key.namespace.clone(), name.clone()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn service(ns: Option<&str>, name: &str) -> Object {
        Object::Service(Arc::new(Service {
            metadata: ObjectMeta {
                namespace: ns.map(Into::into),
                name: Some(name.into()),
                ..Default::default()
            },
            ..Default::default()
        }))
    }

    #[test]
    fn apply_replace_delete() {
        let mut store = Store::default();
        assert!(store.apply(service(Some("a"), "web")).is_none());
        assert!(
            store.apply(service(Some("a"), "web")).is_some(),
            "same key replaces"
        );
        assert!(
            store.apply(service(None, "web")).is_none(),
            "no namespace is default"
        );
        assert!(store.contains(Kind::Service, &ObjectKey::new("default", "web")));
        assert_eq!(store.len(), 2);
        assert!(store.delete(Kind::Service, &ObjectKey::new("a", "web")));
        assert!(!store.delete(Kind::Service, &ObjectKey::new("a", "web")));
        assert_eq!(store.len(), 1);
    }

    #[test]
    fn replace_in_keeps_what_is_outside() {
        let mut store = Store::default();
        for (ns, name) in [("a", "x"), ("a", "y"), ("b", "x")] {
            store.apply(service(Some(ns), name));
        }
        store.replace_in(Kind::Service, "a", None, vec![service(Some("a"), "z")]);
        let keys: Vec<String> = store.services.keys().map(|k| k.to_string()).collect();
        assert_eq!(keys, ["a/z", "b/x"]);
        store.replace_in(Kind::Service, "b", Some("x"), vec![]);
        store.replace_in(
            Kind::Service,
            "a",
            Some("q"),
            vec![service(Some("a"), "q"), service(Some("a"), "other")],
        );
        let keys: Vec<String> = store.services.keys().map(|k| k.to_string()).collect();
        assert_eq!(keys, ["a/q", "a/z"], "only the named object is replaced");
    }
}
