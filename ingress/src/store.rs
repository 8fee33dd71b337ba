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

use std::collections::BTreeMap;
use std::sync::Arc;

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
    Replace(Store),
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
#[derive(Clone, Debug, Default)]
pub struct Store {
    pub ingresses: BTreeMap<ObjectKey, Arc<Ingress>>,
    pub ingress_classes: BTreeMap<ObjectKey, Arc<IngressClass>>,
    pub services: BTreeMap<ObjectKey, Arc<Service>>,
    pub endpoint_slices: BTreeMap<ObjectKey, Arc<EndpointSlice>>,
    pub secrets: BTreeMap<ObjectKey, Arc<Secret>>,
    /// Every one in the watched namespaces (or the manifests directory), and the `--configmap`
    /// one: the snapshot reads that one and those it references (`add-headers`, ...), and
    /// those Ingresses reference (`custom-headers`, `auth-proxy-set-headers`).
    pub config_maps: BTreeMap<ObjectKey, Arc<ConfigMap>>,
    /// Problems a source met before an object could reach the store (an unparseable file).
    pub source_diagnostics: Vec<Diagnostic>,
}

impl Store {
    /// Inserts or replaces an object. Returns the object it replaced, if any.
    pub fn apply(&mut self, object: Object) -> Option<Object> {
        let key = object.key();
        match object {
            Object::Ingress(o) => self.ingresses.insert(key, o).map(Object::Ingress),
            Object::IngressClass(o) => self
                .ingress_classes
                .insert(key, o)
                .map(Object::IngressClass),
            Object::Service(o) => self.services.insert(key, o).map(Object::Service),
            Object::EndpointSlice(o) => self
                .endpoint_slices
                .insert(key, o)
                .map(Object::EndpointSlice),
            Object::Secret(o) => self.secrets.insert(key, o).map(Object::Secret),
            Object::ConfigMap(o) => self.config_maps.insert(key, o).map(Object::ConfigMap),
        }
    }

    /// Applies one source event; returns whether it was the sync marker.
    pub fn apply_event(&mut self, event: SourceEvent) -> bool {
        match event {
            SourceEvent::Replace(new) => *self = new,
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
        match kind {
            Kind::Ingress => self.ingresses.remove(key).is_some(),
            Kind::IngressClass => self.ingress_classes.remove(key).is_some(),
            Kind::Service => self.services.remove(key).is_some(),
            Kind::EndpointSlice => self.endpoint_slices.remove(key).is_some(),
            Kind::Secret => self.secrets.remove(key).is_some(),
            Kind::ConfigMap => self.config_maps.remove(key).is_some(),
        }
    }

    /// Replaces every object of `kind` at once (a relist), keeping the other kinds.
    pub fn replace_kind(&mut self, kind: Kind, objects: Vec<Object>) {
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
