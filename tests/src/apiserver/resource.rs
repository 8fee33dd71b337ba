//! What the server knows about one resource: the row type of the table in `mod.rs`.
//!
//! Every behaviour that differs between resources (scope, status subresource, generation,
//! field selectors, printed columns, schema, defaults, storage sharing) is a field here, so
//! serving a new resource is one more row and no new code path.

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::table::Column;

/// One served resource, e.g. `networking.k8s.io/v1 ingresses`.
#[derive(Clone, Copy)]
pub struct ResourceDef {
    /// API group; empty for the core group.
    pub group: &'static str,
    pub version: &'static str,
    /// Plural lower-case name used in URLs.
    pub resource: &'static str,
    pub kind: &'static str,
    pub namespaced: bool,
    pub short_names: &'static [&'static str],
    /// Whether `<resource>/status` exists; if so main-resource writes never change `.status`.
    pub status_subresource: bool,
    /// Whether `metadata.generation` is kept and bumped when anything outside metadata/status changes.
    pub generation: bool,
    /// Field selector labels besides `metadata.name`/`metadata.namespace`: (label, JSON path).
    pub field_labels: &'static [(&'static str, &'static str)],
    /// Server-side printing columns (Name and Age are always added around these).
    pub columns: &'static [Column],
    /// Decodes into the typed k8s-openapi struct and back: rejects wrong types, finds unknown fields.
    pub schema: fn(&Value) -> Result<Value, String>,
    /// Fills in server-side defaults on create; `seq` is unique per create (for allocations).
    pub defaults: fn(&mut Value, u64),
    /// Rewrites write-only input into its stored form on every write (Secret `stringData`).
    pub normalize: fn(&mut Value),
    /// Discovery categories, e.g. `all` for `kubectl get all`.
    pub categories: &'static [&'static str],
    /// When set, objects live in another resource's storage and are converted on the way in and out.
    pub view: Option<View>,
}

/// A resource that is another representation of a stored one (events.k8s.io Events are core Events).
#[derive(Clone, Copy)]
pub struct View {
    pub stored_group: &'static str,
    pub stored_version: &'static str,
    pub stored_resource: &'static str,
    /// Stored representation to this resource's representation.
    pub from_storage: fn(Value) -> Value,
    /// This resource's representation to the stored one.
    pub to_storage: fn(Value) -> Value,
}

impl std::fmt::Debug for ResourceDef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.group_version_resource())
    }
}

/// Two rows are the same resource when they serve the same URL.
impl PartialEq for ResourceDef {
    fn eq(&self, other: &Self) -> bool {
        (self.group, self.version, self.resource) == (other.group, other.version, other.resource)
    }
}

impl Eq for ResourceDef {}

fn no_defaults(_: &mut Value, _: u64) {}

fn no_normalize(_: &mut Value) {}

fn untyped(value: &Value) -> Result<Value, String> {
    Ok(value.clone())
}

fn typed_round_trip<T: DeserializeOwned + Serialize>(value: &Value) -> Result<Value, String> {
    let typed: T = serde_json::from_value(value.clone()).map_err(|e| e.to_string())?;
    serde_json::to_value(typed).map_err(|e| e.to_string())
}

impl ResourceDef {
    /// A namespaced resource with no status subresource, no generation and no schema.
    pub const fn new(
        group: &'static str,
        version: &'static str,
        resource: &'static str,
        kind: &'static str,
    ) -> Self {
        Self {
            group,
            version,
            resource,
            kind,
            namespaced: true,
            short_names: &[],
            status_subresource: false,
            generation: false,
            field_labels: &[],
            columns: &[],
            schema: untyped,
            defaults: no_defaults,
            normalize: no_normalize,
            categories: &[],
            view: None,
        }
    }

    pub const fn cluster_scoped(mut self) -> Self {
        self.namespaced = false;
        self
    }

    pub const fn short(mut self, names: &'static [&'static str]) -> Self {
        self.short_names = names;
        self
    }

    pub const fn status(mut self) -> Self {
        self.status_subresource = true;
        self
    }

    pub const fn generation(mut self) -> Self {
        self.generation = true;
        self
    }

    pub const fn fields(mut self, labels: &'static [(&'static str, &'static str)]) -> Self {
        self.field_labels = labels;
        self
    }

    pub const fn columns(mut self, columns: &'static [Column]) -> Self {
        self.columns = columns;
        self
    }

    pub const fn typed<T: DeserializeOwned + Serialize>(mut self) -> Self {
        self.schema = typed_round_trip::<T>;
        self
    }

    pub const fn defaults(mut self, defaults: fn(&mut Value, u64)) -> Self {
        self.defaults = defaults;
        self
    }

    pub const fn normalize(mut self, normalize: fn(&mut Value)) -> Self {
        self.normalize = normalize;
        self
    }

    pub const fn categories(mut self, categories: &'static [&'static str]) -> Self {
        self.categories = categories;
        self
    }

    pub const fn view(mut self, view: View) -> Self {
        self.view = Some(view);
        self
    }

    /// `v1` or `networking.k8s.io/v1`: the `apiVersion` of objects of this resource.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// `services` or `ingresses.networking.k8s.io`, as the real server names resources in messages.
    pub fn qualified_resource(&self) -> String {
        if self.group.is_empty() {
            self.resource.to_string()
        } else {
            format!("{}.{}", self.resource, self.group)
        }
    }

    /// `Ingress.networking.k8s.io`, as the real server names kinds in validation messages.
    pub fn qualified_kind(&self) -> String {
        if self.group.is_empty() {
            self.kind.to_string()
        } else {
            format!("{}.{}", self.kind, self.group)
        }
    }

    pub fn singular(&self) -> String {
        self.kind.to_ascii_lowercase()
    }

    pub fn group_version_resource(&self) -> String {
        format!("{}/{}", self.api_version(), self.resource)
    }

    /// The (group, version, resource) whose storage holds this resource's objects.
    pub fn storage(&self) -> (&'static str, &'static str, &'static str) {
        match &self.view {
            Some(view) => (view.stored_group, view.stored_version, view.stored_resource),
            None => (self.group, self.version, self.resource),
        }
    }

    /// The stored representation converted to this resource's representation.
    pub fn present(&self, stored: Value) -> Value {
        match &self.view {
            Some(view) => (view.from_storage)(stored),
            None => stored,
        }
    }

    /// This resource's representation converted to the stored one.
    pub fn store_form(&self, presented: Value) -> Value {
        match &self.view {
            Some(view) => (view.to_storage)(presented),
            None => presented,
        }
    }

    /// The JSON path a field selector label refers to, or None if the real server would reject it.
    pub fn field_path(&self, label: &str) -> Option<&'static str> {
        match label {
            "metadata.name" => Some("metadata.name"),
            "metadata.namespace" if self.namespaced => Some("metadata.namespace"),
            _ => self
                .field_labels
                .iter()
                .find(|(l, _)| *l == label)
                .map(|(_, path)| *path),
        }
    }
}
