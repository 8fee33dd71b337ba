//! Which object: the kinds the controller reads and the namespace/name key of each object.
//! Everything that names an object (the store, diagnostics, Events, the report) shares these.

use std::fmt;

/// Where an object lives. Cluster-scoped kinds (IngressClass) have an empty namespace.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectKey {
    pub namespace: String,
    pub name: String,
}

impl ObjectKey {
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.namespace.is_empty() {
            f.write_str(&self.name)
        } else {
            write!(f, "{}/{}", self.namespace, self.name)
        }
    }
}

/// The kinds the controller reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    Ingress,
    IngressClass,
    Service,
    EndpointSlice,
    Secret,
    /// The global one (`--configmap`) and those of headers it and Ingresses name.
    ConfigMap,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Ingress => "Ingress",
            Kind::IngressClass => "IngressClass",
            Kind::Service => "Service",
            Kind::EndpointSlice => "EndpointSlice",
            Kind::Secret => "Secret",
            Kind::ConfigMap => "ConfigMap",
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
