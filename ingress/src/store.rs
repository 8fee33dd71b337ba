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
    /// From a cluster only the `--configmap` one; from a manifests directory every one there
    /// (the snapshot reads the one `--configmap` names).
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
}
