//! What the server does to an object on its way into storage: system metadata, defaults,
//! schema checks, the status/main split and generation. Pure functions over JSON, so each
//! rule is tested here without HTTP.

use serde_json::{Map, Value, json};

use super::resource::{ResourceDef, View};
use super::status::{ApiError, Result};

/// `fieldValidation`: what to do with fields the schema does not know.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FieldValidation {
    Strict,
    /// The real server's default: drop them and say so in a `Warning` header.
    #[default]
    Warn,
    Ignore,
}

impl FieldValidation {
    pub fn parse(value: Option<&str>) -> Result<Self> {
        match value {
            None | Some("") | Some("Warn") => Ok(Self::Warn),
            Some("Strict") => Ok(Self::Strict),
            Some("Ignore") => Ok(Self::Ignore),
            Some(other) => Err(ApiError::BadRequest(format!(
                "fieldValidation must be one of Ignore, Warn, Strict, got {other:?}"
            ))),
        }
    }
}

/// The current time as Kubernetes writes `metav1.Time`.
pub fn now() -> String {
    jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

pub fn meta<'a>(object: &'a Value, field: &str) -> Option<&'a str> {
    object.get("metadata")?.get(field)?.as_str()
}

/// `metadata` as a map, created (or replaced, if it is not a map) when needed; None only
/// when `object` itself is not a JSON object.
pub fn meta_mut(object: &mut Value) -> Option<&mut Map<String, Value>> {
    let meta = object
        .as_object_mut()?
        .entry("metadata")
        .or_insert_with(|| json!({}));
    if !meta.is_object() {
        *meta = json!({});
    }
    meta.as_object_mut()
}

/// Checks `apiVersion`/`kind` (filling them in when absent) and that the body is an object.
pub fn check_type(def: &ResourceDef, object: &mut Value) -> Result<()> {
    let Some(map) = object.as_object_mut() else {
        return Err(ApiError::BadRequest(format!(
            "{} in version \"{}\" cannot be handled as a {}: the body is not a JSON object",
            def.kind, def.version, def.kind
        )));
    };
    let api_version = def.api_version();
    match map.get("apiVersion").and_then(Value::as_str) {
        None | Some("") => {
            map.insert("apiVersion".into(), json!(api_version));
        }
        Some(v) if v == api_version => {}
        Some(v) => {
            return Err(ApiError::BadRequest(format!(
                "the API version in the data ({v}) does not match the expected API version ({api_version})"
            )));
        }
    }
    match map.get("kind").and_then(Value::as_str) {
        None | Some("") => {
            map.insert("kind".into(), json!(def.kind));
        }
        Some(k) if k == def.kind => {}
        Some(k) => {
            return Err(ApiError::BadRequest(format!(
                "the kind in the data ({k}) does not match the expected kind ({})",
                def.kind
            )));
        }
    }
    if map
        .get("metadata")
        .is_some_and(|m| !m.is_object() && !m.is_null())
    {
        return Err(ApiError::BadRequest("metadata must be an object".into()));
    }
    Ok(())
}

/// Decodes through the typed schema: a type error is a 400, unknown fields are rejected,
/// or dropped with warnings, per `mode`. Returns the warnings.
pub fn check_schema(
    def: &ResourceDef,
    object: &mut Value,
    mode: FieldValidation,
) -> Result<Vec<String>> {
    let cannot_handle = |why: String| {
        ApiError::BadRequest(format!(
            "{} in version \"{}\" cannot be handled as a {}: {why}",
            def.kind, def.version, def.kind
        ))
    };
    let typed = (def.schema)(object).map_err(cannot_handle)?;
    let mut unknown = Vec::new();
    prune_unknown(object, &typed, "", &mut unknown);
    if mode == FieldValidation::Strict && !unknown.is_empty() {
        let list: Vec<String> = unknown
            .iter()
            .map(|f| format!("unknown field \"{f}\""))
            .collect();
        return Err(cannot_handle(format!(
            "strict decoding error: {}",
            list.join(", ")
        )));
    }
    Ok(match mode {
        FieldValidation::Ignore => Vec::new(),
        _ => unknown
            .iter()
            .map(|f| format!("unknown field \"{f}\""))
            .collect(),
    })
}

/// Removes from `input` what the typed round trip dropped; nulls go silently (they mean unset).
fn prune_unknown(input: &mut Value, typed: &Value, path: &str, unknown: &mut Vec<String>) {
    match (input, typed) {
        (Value::Object(map), Value::Object(typed_map)) => {
            map.retain(|key, value| {
                let field = if path.is_empty() {
                    key.clone()
                } else {
                    format!("{path}.{key}")
                };
                match typed_map.get(key) {
                    Some(typed_value) => {
                        prune_unknown(value, typed_value, &field, unknown);
                        true
                    }
                    None if value.is_null() => false,
                    None => {
                        unknown.push(field);
                        false
                    }
                }
            });
        }
        (Value::Array(items), Value::Array(typed_items)) => {
            for (i, (item, typed_item)) in items.iter_mut().zip(typed_items).enumerate() {
                prune_unknown(item, typed_item, &format!("{path}[{i}]"), unknown);
            }
        }
        _ => {}
    }
}

const SUBDOMAIN_MESSAGE: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";
const LABEL_MESSAGE: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')";
const DNS1035_MESSAGE: &str = "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')";

fn is_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

fn is_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(is_label)
}

/// The name rule the real server applies to this resource, as an error message if broken.
pub fn name_problem(def: &ResourceDef, name: &str) -> Option<&'static str> {
    match (def.group, def.resource) {
        ("", "namespaces") => (!is_label(name)).then_some(LABEL_MESSAGE),
        ("", "services") => (!is_label(name)
            || !name.starts_with(|c: char| c.is_ascii_lowercase()))
        .then_some(DNS1035_MESSAGE),
        _ => (!is_subdomain(name)).then_some(SUBDOMAIN_MESSAGE),
    }
}

fn generated_suffix() -> String {
    // The alphabet kube-apiserver uses, chosen so suffixes never spell words.
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    uuid::Uuid::new_v4()
        .as_bytes()
        .iter()
        .take(5)
        .map(|b| {
            ALPHABET
                .get(usize::from(*b) % ALPHABET.len())
                .copied()
                .map_or('x', char::from)
        })
        .collect()
}

/// System fields and defaults for a new object. `namespace` is the one from the URL.
/// `seq` is unique per create (it feeds allocations such as ClusterIPs).
pub fn prepare_create(
    def: &ResourceDef,
    namespace: Option<&str>,
    object: &mut Value,
    seq: u64,
) -> Result<()> {
    let generate_name = meta(object, "generateName").map(str::to_string);
    let mut name = meta(object, "name").unwrap_or_default().to_string();
    if name.is_empty() {
        match generate_name {
            Some(prefix) if !prefix.is_empty() => name = format!("{prefix}{}", generated_suffix()),
            _ => {
                return Err(ApiError::invalid(
                    def,
                    "",
                    "metadata.name",
                    "Required value: name or generateName is required",
                ));
            }
        }
    }
    if let Some(problem) = name_problem(def, &name) {
        return Err(ApiError::invalid(
            def,
            &name,
            "metadata.name",
            format!("Invalid value: \"{name}\": {problem}"),
        ));
    }
    if meta(object, "resourceVersion").is_some_and(|rv| !rv.is_empty()) {
        return Err(ApiError::BadRequest(
            "resourceVersion should not be set on objects to be created".into(),
        ));
    }
    let body_namespace = meta(object, "namespace").unwrap_or_default().to_string();
    let Some(meta) = meta_mut(object) else {
        return Err(ApiError::BadRequest("the body is not a JSON object".into()));
    };
    meta.insert("name".into(), json!(name));
    match namespace {
        Some(ns) if def.namespaced => {
            if !body_namespace.is_empty() && body_namespace != ns {
                return Err(ApiError::BadRequest(
                    "the namespace of the provided object does not match the namespace sent on the request".into(),
                ));
            }
            meta.insert("namespace".into(), json!(ns));
        }
        _ => {
            meta.remove("namespace");
        }
    }
    meta.insert("uid".into(), json!(uuid::Uuid::new_v4().to_string()));
    meta.insert("creationTimestamp".into(), json!(now()));
    for system in [
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "selfLink",
    ] {
        meta.remove(system);
    }
    if def.generation {
        meta.insert("generation".into(), json!(1));
    } else {
        meta.remove("generation");
    }
    if def.status_subresource
        && let Some(map) = object.as_object_mut()
    {
        map.remove("status");
    }
    (def.defaults)(object, seq);
    (def.normalize)(object);
    Ok(())
}

/// Which part of an object a write may change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    Main,
    Status,
}

/// Everything except what the server ignores when deciding "did anything change".
fn comparable(object: &Value) -> Value {
    let mut copy = object.clone();
    if let Some(meta) = copy.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.remove("resourceVersion");
        meta.remove("managedFields");
    }
    copy
}

fn spec_like(object: &Value) -> Value {
    let mut copy = object.clone();
    if let Some(map) = copy.as_object_mut() {
        map.remove("metadata");
        map.remove("status");
    }
    copy
}

/// Builds the object an update of `part` stores, or None if it changes nothing (the real
/// server then keeps the resourceVersion and sends no watch event).
pub fn prepare_update(
    def: &ResourceDef,
    old: &Value,
    mut new: Value,
    part: Part,
) -> Result<Option<Value>> {
    let name = meta(old, "name").unwrap_or_default().to_string();
    if let Some(rv) = meta(&new, "resourceVersion").filter(|rv| !rv.is_empty())
        && Some(rv) != meta(old, "resourceVersion")
    {
        return Err(ApiError::modified(def, &name));
    }
    if let (Some(want), Some(have)) = (
        meta(&new, "uid").filter(|u| !u.is_empty()),
        meta(old, "uid"),
    ) && want != have
    {
        return Err(ApiError::conflict(
            def,
            &name,
            &format!(
                "Precondition failed: UID in precondition: {want}, UID in object meta: {have}"
            ),
        ));
    }
    let mut next = match part {
        Part::Status => {
            let mut next = old.clone();
            match (next.as_object_mut(), new.get("status")) {
                (Some(map), Some(status)) => {
                    map.insert("status".into(), status.clone());
                }
                (Some(map), None) => {
                    map.remove("status");
                }
                _ => {}
            }
            next
        }
        Part::Main => {
            if def.status_subresource
                && let Some(map) = new.as_object_mut()
            {
                match old.get("status") {
                    Some(status) => map.insert("status".into(), status.clone()),
                    None => map.remove("status"),
                };
            }
            let old_meta = old.get("metadata").and_then(Value::as_object);
            let Some(meta) = meta_mut(&mut new) else {
                return Err(ApiError::BadRequest("the body is not a JSON object".into()));
            };
            const SYSTEM: [&str; 7] = [
                "name",
                "namespace",
                "uid",
                "creationTimestamp",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "generation",
            ];
            for system in SYSTEM {
                match old_meta.and_then(|m| m.get(system)) {
                    Some(value) => meta.insert(system.into(), value.clone()),
                    None => meta.remove(system),
                };
            }
            keep_allocations(def, old, &mut new);
            new
        }
    };
    if let Some(meta) = meta_mut(&mut next) {
        for kept in ["managedFields", "resourceVersion"] {
            match old.pointer(&format!("/metadata/{kept}")) {
                Some(value) => meta.insert(kept.into(), value.clone()),
                None => meta.remove(kept),
            };
        }
    }
    (def.normalize)(&mut next);
    if comparable(&next) == comparable(old) {
        return Ok(None);
    }
    if def.generation && part == Part::Main && spec_like(&next) != spec_like(old) {
        let generation = old
            .pointer("/metadata/generation")
            .and_then(Value::as_i64)
            .unwrap_or(0);
        if let Some(meta) = meta_mut(&mut next) {
            meta.insert("generation".into(), json!(generation + 1));
        }
    }
    Ok(Some(next))
}

/// Fields the server allocated at create time survive an update that omits them.
fn keep_allocations(def: &ResourceDef, old: &Value, new: &mut Value) {
    if (def.group, def.resource) != ("", "services") {
        return;
    }
    for field in ["clusterIP", "clusterIPs"] {
        let missing = new
            .pointer(&format!("/spec/{field}"))
            .is_none_or(|v| v.is_null() || v == "");
        if missing
            && let (Some(value), Some(spec)) = (
                old.pointer(&format!("/spec/{field}")),
                new.get_mut("spec").and_then(Value::as_object_mut),
            )
        {
            spec.insert(field.into(), value.clone());
        }
    }
}

/// Is this object waiting for finalizers (deletionTimestamp set, finalizers left)?
pub fn has_finalizers(object: &Value) -> bool {
    object
        .pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .is_some_and(|f| !f.is_empty())
}

pub fn is_deleting(object: &Value) -> bool {
    meta(object, "deletionTimestamp").is_some()
}

// ---- defaults --------------------------------------------------------------------------

fn set_default(object: &mut Value, pointer: &str, value: Value) {
    if object.pointer(pointer).is_none_or(Value::is_null) {
        let mut parts: Vec<&str> = pointer.split('/').skip(1).collect();
        let Some(last) = parts.pop() else { return };
        let mut cursor = object;
        for part in parts {
            if !cursor.get(part).is_some_and(Value::is_object) {
                cursor[part] = json!({});
            }
            let Some(next) = cursor.get_mut(part) else {
                return;
            };
            cursor = next;
        }
        if cursor.is_object() {
            cursor[last] = value;
        }
    }
}

pub fn namespace_defaults(object: &mut Value, _seq: u64) {
    let name = meta(object, "name").unwrap_or_default().to_string();
    if let Some(meta) = meta_mut(object) {
        let labels = meta.entry("labels").or_insert_with(|| json!({}));
        if let Some(labels) = labels.as_object_mut() {
            labels
                .entry("kubernetes.io/metadata.name")
                .or_insert(json!(name));
        }
    }
    set_default(object, "/spec/finalizers", json!(["kubernetes"]));
    set_default(object, "/status/phase", json!("Active"));
}

pub fn service_defaults(object: &mut Value, seq: u64) {
    set_default(object, "/spec/type", json!("ClusterIP"));
    let external_name =
        object.pointer("/spec/type").and_then(Value::as_str) == Some("ExternalName");
    if !external_name {
        let empty = object
            .pointer("/spec/clusterIP")
            .is_none_or(|v| v.is_null() || v == "");
        if empty && let Some(spec) = object.get_mut("spec").and_then(Value::as_object_mut) {
            let ip = format!("10.96.{}.{}", (seq >> 8) & 0xff, (seq & 0xff).max(1));
            spec.insert("clusterIP".into(), json!(ip));
        }
        let cluster_ip = object
            .pointer("/spec/clusterIP")
            .cloned()
            .unwrap_or(Value::Null);
        set_default(object, "/spec/clusterIPs", json!([cluster_ip]));
        set_default(object, "/spec/ipFamilies", json!(["IPv4"]));
        set_default(object, "/spec/ipFamilyPolicy", json!("SingleStack"));
        set_default(object, "/spec/internalTrafficPolicy", json!("Cluster"));
    }
    set_default(object, "/spec/sessionAffinity", json!("None"));
    if let Some(ports) = object
        .pointer_mut("/spec/ports")
        .and_then(Value::as_array_mut)
    {
        for port in ports.iter_mut().filter(|p| p.is_object()) {
            set_default(port, "/protocol", json!("TCP"));
            if let Some(number) = port.get("port").cloned() {
                set_default(port, "/targetPort", number);
            }
        }
    }
    set_default(object, "/status/loadBalancer", json!({}));
}

pub fn secret_defaults(object: &mut Value, _seq: u64) {
    set_default(object, "/type", json!("Opaque"));
}

/// `stringData` is write-only: its entries replace `data`'s, base64-encoded.
pub fn secret_string_data(object: &mut Value) {
    let Some(map) = object.as_object_mut() else {
        return;
    };
    let Some(Value::Object(strings)) = map.remove("stringData") else {
        return;
    };
    let data = map.entry("data").or_insert_with(|| json!({}));
    if !data.is_object() {
        *data = json!({});
    }
    let Some(data) = data.as_object_mut() else {
        return;
    };
    for (key, value) in strings {
        let text = value.as_str().unwrap_or_default().as_bytes().to_vec();
        if let Ok(encoded) = serde_json::to_value(k8s_openapi::ByteString(text)) {
            data.insert(key, encoded);
        }
    }
}

// ---- events: one storage, two representations ------------------------------------------

/// core/v1 Event field <-> events.k8s.io/v1 Event field, as in the real conversion.
const EVENT_RENAMES: &[(&str, &str)] = &[
    ("involvedObject", "regarding"),
    ("message", "note"),
    ("reportingComponent", "reportingController"),
    ("source", "deprecatedSource"),
    ("firstTimestamp", "deprecatedFirstTimestamp"),
    ("lastTimestamp", "deprecatedLastTimestamp"),
    ("count", "deprecatedCount"),
];

fn rename(
    mut object: Value,
    api_version: &str,
    pairs: impl Iterator<Item = (&'static str, &'static str)>,
) -> Value {
    if let Some(map) = object.as_object_mut() {
        for (from, to) in pairs {
            if let Some(value) = map.remove(from) {
                map.insert(to.into(), value);
            }
        }
        map.insert("apiVersion".into(), json!(api_version));
    }
    object
}

fn core_event_to_v1(object: Value) -> Value {
    rename(object, "events.k8s.io/v1", EVENT_RENAMES.iter().copied())
}

fn v1_event_to_core(object: Value) -> Value {
    let mut core = rename(object, "v1", EVENT_RENAMES.iter().map(|(a, b)| (*b, *a)));
    if core.get("involvedObject").is_none()
        && let Some(map) = core.as_object_mut()
    {
        map.insert("involvedObject".into(), json!({}));
    }
    core
}

pub const EVENTS_V1_VIEW: View = View {
    stored_group: "",
    stored_version: "v1",
    stored_resource: "events",
    from_storage: core_event_to_v1,
    to_storage: v1_event_to_core,
};

pub const CORE_EVENT_FIELDS: &[(&str, &str)] = &[
    ("involvedObject.kind", "involvedObject.kind"),
    ("involvedObject.namespace", "involvedObject.namespace"),
    ("involvedObject.name", "involvedObject.name"),
    ("involvedObject.uid", "involvedObject.uid"),
    ("involvedObject.apiVersion", "involvedObject.apiVersion"),
    (
        "involvedObject.resourceVersion",
        "involvedObject.resourceVersion",
    ),
    ("involvedObject.fieldPath", "involvedObject.fieldPath"),
    ("reason", "reason"),
    ("reportingComponent", "reportingComponent"),
    ("source", "source.component"),
    ("type", "type"),
];

pub const EVENTS_V1_FIELDS: &[(&str, &str)] = &[
    ("regarding.kind", "regarding.kind"),
    ("regarding.namespace", "regarding.namespace"),
    ("regarding.name", "regarding.name"),
    ("regarding.uid", "regarding.uid"),
    ("regarding.apiVersion", "regarding.apiVersion"),
    ("regarding.resourceVersion", "regarding.resourceVersion"),
    ("regarding.fieldPath", "regarding.fieldPath"),
    ("reason", "reason"),
    ("reportingController", "reportingController"),
    ("type", "type"),
];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apiserver::resource;

    fn def(group: &str, res: &str) -> &'static ResourceDef {
        resource(group, "v1", res).unwrap()
    }

    #[test]
    fn create_sets_system_fields_and_clears_status() {
        let ingresses = def("networking.k8s.io", "ingresses");
        let mut ing = json!({"metadata": {"name": "web"}, "spec": {}, "status": {"loadBalancer": {"ingress": [{"ip": "1.2.3.4"}]}}});
        check_type(ingresses, &mut ing).unwrap();
        prepare_create(ingresses, Some("prod"), &mut ing, 7).unwrap();
        assert_eq!(ing["apiVersion"], "networking.k8s.io/v1");
        assert_eq!(ing["kind"], "Ingress");
        assert_eq!(ing["metadata"]["namespace"], "prod");
        assert_eq!(ing["metadata"]["generation"], 1);
        assert_eq!(ing["metadata"]["uid"].as_str().unwrap().len(), 36);
        assert!(
            ing["metadata"]["creationTimestamp"]
                .as_str()
                .unwrap()
                .ends_with('Z')
        );
        assert!(ing.get("status").is_none());
    }

    #[test]
    fn create_rejects_what_the_real_server_rejects() {
        let services = def("", "services");
        let secrets = def("", "secrets");
        let cases = [
            (services, json!({"metadata": {}}), 422),
            (services, json!({"metadata": {"name": "1web"}}), 422),
            (secrets, json!({"metadata": {"name": "Web"}}), 422),
            (
                secrets,
                json!({"metadata": {"name": "web", "namespace": "other"}}),
                400,
            ),
            (
                secrets,
                json!({"metadata": {"name": "web", "resourceVersion": "5"}}),
                400,
            ),
        ];
        for (def, mut object, code) in cases {
            let err = prepare_create(def, Some("prod"), &mut object, 1).unwrap_err();
            assert_eq!(err.code(), code, "{object}: {err}");
        }
    }

    #[test]
    fn generate_name_gets_a_suffix() {
        let secrets = def("", "secrets");
        let mut object = json!({"metadata": {"generateName": "tls-"}});
        prepare_create(secrets, Some("prod"), &mut object, 1).unwrap();
        let name = meta(&object, "name").unwrap();
        assert!(name.starts_with("tls-") && name.len() == 9, "{name}");
    }

    #[test]
    fn type_checks() {
        let ingresses = def("networking.k8s.io", "ingresses");
        let cases = [
            (json!({"apiVersion": "v1", "kind": "Ingress"}), false),
            (
                json!({"apiVersion": "networking.k8s.io/v1", "kind": "Service"}),
                false,
            ),
            (json!([]), false),
            (json!({"metadata": "x"}), false),
            (
                json!({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress"}),
                true,
            ),
            (json!({}), true),
        ];
        for (mut object, ok) in cases {
            assert_eq!(check_type(ingresses, &mut object).is_ok(), ok, "{object}");
        }
    }

    #[test]
    fn schema_checks_follow_field_validation() {
        let ingresses = def("networking.k8s.io", "ingresses");
        let body = json!({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress", "metadata": {"name": "web", "labels": {"a": "b"}, "bogus": 1},
            "spec": {"ingressClassName": "x", "extra": true, "rules": [{"host": "a.example", "nope": null}]}});

        let mut strict = body.clone();
        let err = check_schema(ingresses, &mut strict, FieldValidation::Strict).unwrap_err();
        assert_eq!(err.code(), 400);
        assert!(
            err.to_string().contains("unknown field \"metadata.bogus\""),
            "{err}"
        );
        assert!(
            err.to_string().contains("unknown field \"spec.extra\""),
            "{err}"
        );

        let mut warn = body.clone();
        let warnings = check_schema(ingresses, &mut warn, FieldValidation::Warn).unwrap();
        assert_eq!(
            warnings,
            [
                "unknown field \"metadata.bogus\"",
                "unknown field \"spec.extra\""
            ]
        );
        assert!(warn["spec"].get("extra").is_none());
        assert!(warn["spec"]["rules"][0].get("nope").is_none());
        assert_eq!(warn["metadata"]["labels"]["a"], "b");

        let mut ignore = body;
        assert!(
            check_schema(ingresses, &mut ignore, FieldValidation::Ignore)
                .unwrap()
                .is_empty()
        );
        assert!(ignore["spec"].get("extra").is_none());

        let mut wrong_type = json!({"spec": {"ingressClassName": 5}});
        assert_eq!(
            check_schema(ingresses, &mut wrong_type, FieldValidation::Warn)
                .unwrap_err()
                .code(),
            400
        );
    }

    #[test]
    fn main_updates_keep_status_and_bump_generation_on_spec_changes() {
        let ingresses = def("networking.k8s.io", "ingresses");
        let old = json!({"metadata": {"name": "web", "uid": "u", "resourceVersion": "5", "generation": 3, "creationTimestamp": "t"},
            "spec": {"ingressClassName": "a"}, "status": {"loadBalancer": {}}});

        let relabel = json!({"metadata": {"name": "web", "labels": {"x": "y"}}, "spec": {"ingressClassName": "a"}, "status": {"changed": 1}});
        let next = prepare_update(ingresses, &old, relabel, Part::Main)
            .unwrap()
            .unwrap();
        assert_eq!(next["metadata"]["generation"], 3);
        assert_eq!(next["status"], json!({"loadBalancer": {}}));
        assert_eq!(next["metadata"]["uid"], "u");

        let respec = json!({"metadata": {"name": "web"}, "spec": {"ingressClassName": "b"}});
        let next = prepare_update(ingresses, &old, respec, Part::Main)
            .unwrap()
            .unwrap();
        assert_eq!(next["metadata"]["generation"], 4);

        let same = json!({"metadata": {"name": "web", "resourceVersion": "5"}, "spec": {"ingressClassName": "a"}});
        assert!(
            prepare_update(ingresses, &old, same, Part::Main)
                .unwrap()
                .is_none()
        );

        let stale = json!({"metadata": {"name": "web", "resourceVersion": "4"}, "spec": {}});
        assert_eq!(
            prepare_update(ingresses, &old, stale, Part::Main)
                .unwrap_err()
                .code(),
            409
        );
    }

    #[test]
    fn status_updates_change_only_status() {
        let ingresses = def("networking.k8s.io", "ingresses");
        let old = json!({"metadata": {"name": "web", "generation": 2, "labels": {"a": "b"}}, "spec": {"ingressClassName": "a"}});
        let new = json!({"metadata": {"name": "web", "labels": {}}, "spec": {"ingressClassName": "z"},
            "status": {"loadBalancer": {"ingress": [{"ip": "10.0.0.1"}]}}});
        let next = prepare_update(ingresses, &old, new, Part::Status)
            .unwrap()
            .unwrap();
        assert_eq!(next["spec"]["ingressClassName"], "a");
        assert_eq!(next["metadata"]["labels"]["a"], "b");
        assert_eq!(next["metadata"]["generation"], 2);
        assert_eq!(
            next["status"]["loadBalancer"]["ingress"][0]["ip"],
            "10.0.0.1"
        );
    }

    #[test]
    fn service_defaults_match_a_cluster() {
        let services = def("", "services");
        let mut svc = json!({"metadata": {"name": "web"}, "spec": {"ports": [{"port": 80}, {"port": 443, "targetPort": "https", "protocol": "TCP"}]}});
        prepare_create(services, Some("default"), &mut svc, 258).unwrap();
        assert_eq!(svc["spec"]["type"], "ClusterIP");
        assert_eq!(svc["spec"]["clusterIP"], "10.96.1.2");
        assert_eq!(svc["spec"]["clusterIPs"], json!(["10.96.1.2"]));
        assert_eq!(
            svc["spec"]["ports"][0],
            json!({"port": 80, "protocol": "TCP", "targetPort": 80})
        );
        assert_eq!(svc["spec"]["ports"][1]["targetPort"], "https");
        assert_eq!(svc["status"], json!({"loadBalancer": {}}));

        let update = json!({"metadata": {"name": "web"}, "spec": {"ports": [{"port": 81}]}});
        let next = prepare_update(services, &svc, update, Part::Main)
            .unwrap()
            .unwrap();
        assert_eq!(next["spec"]["clusterIP"], "10.96.1.2");
    }

    #[test]
    fn secret_string_data_lands_in_data() {
        let secrets = def("", "secrets");
        let mut secret = json!({"metadata": {"name": "s"}, "data": {"a": "eA==", "b": "eQ=="}, "stringData": {"b": "hello"}});
        prepare_create(secrets, Some("default"), &mut secret, 1).unwrap();
        assert_eq!(secret["data"], json!({"a": "eA==", "b": "aGVsbG8="}));
        assert!(secret.get("stringData").is_none());
        assert_eq!(secret["type"], "Opaque");
        let update =
            json!({"metadata": {"name": "s"}, "data": {"a": "eA=="}, "stringData": {"c": "z"}});
        let next = prepare_update(secrets, &secret, update, Part::Main)
            .unwrap()
            .unwrap();
        assert_eq!(next["data"], json!({"a": "eA==", "c": "eg=="}));
    }

    #[test]
    fn namespace_defaults_label_and_phase() {
        let namespaces = def("", "namespaces");
        let mut ns = json!({"metadata": {"name": "prod"}});
        prepare_create(namespaces, None, &mut ns, 1).unwrap();
        assert_eq!(
            ns["metadata"]["labels"]["kubernetes.io/metadata.name"],
            "prod"
        );
        assert_eq!(ns["status"]["phase"], "Active");
        assert!(ns["metadata"].get("namespace").is_none());
    }

    #[test]
    fn events_convert_both_ways() {
        let core = json!({"apiVersion": "v1", "kind": "Event", "metadata": {"name": "e"},
            "involvedObject": {"kind": "Ingress", "name": "web"}, "message": "hello", "reason": "Sync",
            "source": {"component": "ingress"}, "count": 2, "reportingComponent": "ingress"});
        let v1 = core_event_to_v1(core.clone());
        assert_eq!(v1["apiVersion"], "events.k8s.io/v1");
        assert_eq!(v1["regarding"]["name"], "web");
        assert_eq!(v1["note"], "hello");
        assert_eq!(v1["deprecatedCount"], 2);
        assert_eq!(v1["reportingController"], "ingress");
        assert_eq!(v1_event_to_core(v1), core);
    }
}
