//! `metadata.managedFields`: who owns which field, so server-side apply can remove fields a
//! manager stopped applying and refuse to silently overwrite another manager's values.
//!
//! Field sets use the real `FieldsV1` encoding (`{"f:spec":{"f:rules":{}}}`) but every list
//! is atomic: a list is owned and replaced whole (the real server tracks list items by key).

use std::collections::BTreeSet;

use serde_json::{Map, Value, json};

use super::objects::{self, Part};
use super::patch::merge_applied;
use super::resource::ResourceDef;
use super::status::{ApiError, Cause, Result};

type Path = Vec<String>;
type FieldSet = BTreeSet<Path>;

/// Metadata the server owns; never part of anyone's field set.
const SYSTEM_METADATA: [&str; 11] = [
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "managedFields",
    "selfLink",
    "generateName",
];

/// The writer of a request: `fieldManager`, or what kube-apiserver derives from the User-Agent.
#[derive(Debug, Clone)]
pub struct Manager {
    pub name: String,
    pub api_version: String,
    pub part: Part,
}

impl Manager {
    pub fn new(
        def: &ResourceDef,
        field_manager: Option<&str>,
        user_agent: Option<&str>,
        part: Part,
    ) -> Self {
        let name = match field_manager.filter(|m| !m.is_empty()) {
            Some(m) => m.to_string(),
            None => user_agent
                .and_then(|ua| ua.split('/').next())
                .filter(|ua| !ua.is_empty())
                .unwrap_or("unknown")
                .to_string(),
        };
        Self {
            name,
            api_version: def.api_version(),
            part,
        }
    }

    fn subresource(&self) -> Option<&'static str> {
        match self.part {
            Part::Main => None,
            Part::Status => Some("status"),
        }
    }

    fn is(&self, entry: &Value, operation: &str) -> bool {
        entry.get("manager").and_then(Value::as_str) == Some(self.name.as_str())
            && entry.get("operation").and_then(Value::as_str) == Some(operation)
            && entry.get("subresource").and_then(Value::as_str) == self.subresource()
    }
}

/// The leaves of `object` that a write of `part` can own.
fn leaves_of(def: &ResourceDef, object: &Value, part: Part) -> FieldSet {
    let mut set = FieldSet::new();
    let Some(map) = object.as_object() else {
        return set;
    };
    for (key, value) in map {
        let wanted = match part {
            Part::Status => key == "status",
            Part::Main => {
                !(matches!(key.as_str(), "apiVersion" | "kind")
                    || (key == "status" && def.status_subresource))
            }
        };
        if !wanted {
            continue;
        }
        if key == "metadata" {
            if let Some(meta) = value.as_object() {
                for (mkey, mvalue) in meta
                    .iter()
                    .filter(|(k, _)| !SYSTEM_METADATA.contains(&k.as_str()))
                {
                    collect(mvalue, vec!["metadata".into(), mkey.clone()], &mut set);
                }
            }
        } else {
            collect(value, vec![key.clone()], &mut set);
        }
    }
    set
}

fn collect(value: &Value, path: Path, set: &mut FieldSet) {
    match value {
        Value::Object(map) if !map.is_empty() => {
            for (key, child) in map {
                let mut child_path = path.clone();
                child_path.push(key.clone());
                collect(child, child_path, set);
            }
        }
        _ => {
            set.insert(path);
        }
    }
}

fn to_fields_v1(set: &FieldSet) -> Value {
    let mut root = Map::new();
    for path in set {
        let mut node = &mut root;
        for segment in path {
            let entry = node
                .entry(format!("f:{segment}"))
                .or_insert_with(|| json!({}));
            if !entry.is_object() {
                *entry = json!({});
            }
            let Value::Object(next) = entry else { break };
            node = next;
        }
    }
    Value::Object(root)
}

fn from_fields_v1(value: &Value) -> FieldSet {
    fn walk(value: &Value, path: &Path, set: &mut FieldSet) {
        let Some(map) = value.as_object().filter(|m| !m.is_empty()) else {
            if !path.is_empty() {
                set.insert(path.clone());
            }
            return;
        };
        for (key, child) in map {
            match key.strip_prefix("f:") {
                Some(field) => {
                    let mut child_path = path.clone();
                    child_path.push(field.to_string());
                    walk(child, &child_path, set);
                }
                // ".", "k:{..}", "v:..", "i:..": list items or the node itself; lists are atomic here.
                None if !path.is_empty() => {
                    set.insert(path.clone());
                }
                None => {}
            }
        }
    }
    let mut set = FieldSet::new();
    walk(value, &Vec::new(), &mut set);
    set
}

fn value_at<'a>(object: &'a Value, path: &[String]) -> Option<&'a Value> {
    path.iter().try_fold(object, |v, key| v.get(key))
}

/// Removes the field at `path`, then any map left empty by that on the way up (below the
/// top level), as the real server drops a map whose last owned key went away.
fn remove_at(object: &mut Value, path: &[String]) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let Some(parent) = parents
        .iter()
        .try_fold(&mut *object, |v, key| v.get_mut(key))
    else {
        return;
    };
    let Some(map) = parent.as_object_mut() else {
        return;
    };
    map.remove(last);
    if map.is_empty() && parents.len() > 1 {
        remove_at(object, parents);
    }
}

/// Whether two paths name overlapping fields (equal, or one inside the other).
fn overlaps(a: &[String], b: &[String]) -> bool {
    a.starts_with(b) || b.starts_with(a)
}

fn entries(object: &Value) -> Vec<Value> {
    object
        .pointer("/metadata/managedFields")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default()
}

fn entry_set(entry: &Value) -> FieldSet {
    entry
        .get("fieldsV1")
        .map(from_fields_v1)
        .unwrap_or_default()
}

fn entry_manager(entry: &Value) -> &str {
    entry
        .get("manager")
        .and_then(Value::as_str)
        .unwrap_or_default()
}

fn make_entry(manager: &Manager, operation: &str, set: &FieldSet) -> Value {
    let mut entry = json!({
        "manager": manager.name,
        "operation": operation,
        "apiVersion": manager.api_version,
        "time": objects::now(),
        "fieldsType": "FieldsV1",
        "fieldsV1": to_fields_v1(set),
    });
    if let Some(sub) = manager.subresource() {
        entry["subresource"] = json!(sub);
    }
    entry
}

fn set_entries(object: &mut Value, entries: Vec<Value>) {
    if let Some(meta) = objects::meta_mut(object) {
        if entries.is_empty() {
            meta.remove("managedFields");
        } else {
            meta.insert("managedFields".into(), Value::Array(entries));
        }
    }
}

/// Rewrites each entry's set with `edit`, dropping entries left owning nothing.
fn edit_entries(entries: Vec<Value>, mut edit: impl FnMut(&Value, &mut FieldSet)) -> Vec<Value> {
    entries
        .into_iter()
        .filter_map(|mut entry| {
            let mut set = entry_set(&entry);
            edit(&entry, &mut set);
            if set.is_empty() {
                return None;
            }
            entry["fieldsV1"] = to_fields_v1(&set);
            Some(entry)
        })
        .collect()
}

/// A create by `manager` (operation `Update`, or `Apply` for an apply that creates).
pub fn record_create(def: &ResourceDef, object: &mut Value, manager: &Manager, operation: &str) {
    let set = leaves_of(def, object, manager.part);
    let entries = if set.is_empty() {
        Vec::new()
    } else {
        vec![make_entry(manager, operation, &set)]
    };
    set_entries(object, entries);
}

/// An update/patch by `manager`: it takes over every field it changed; removed fields leave
/// every set. `new` must already carry `old`'s managedFields.
pub fn record_update(def: &ResourceDef, old: &Value, new: &mut Value, manager: &Manager) {
    let old_set = leaves_of(def, old, manager.part);
    let new_set = leaves_of(def, new, manager.part);
    let changed: FieldSet = new_set
        .iter()
        .filter(|p| value_at(old, p) != value_at(new, p))
        .cloned()
        .collect();
    let removed: FieldSet = old_set.difference(&new_set).cloned().collect();
    if changed.is_empty() && removed.is_empty() {
        return;
    }
    let mut entries = edit_entries(entries(new), |entry, set| {
        if manager.is(entry, "Update") {
            return;
        }
        set.retain(|p| !changed.iter().chain(&removed).any(|c| overlaps(p, c)));
    });
    let mut mine = entries
        .iter()
        .position(|e| manager.is(e, "Update"))
        .map(|i| entries.remove(i))
        .map(|e| entry_set(&e))
        .unwrap_or_default();
    mine.retain(|p| !removed.iter().any(|r| overlaps(p, r)));
    mine.extend(changed);
    if !mine.is_empty() {
        entries.push(make_entry(manager, "Update", &mine));
    }
    set_entries(new, entries);
}

/// Server-side apply of `applied` onto `live` by `manager`. Returns the merged object (with
/// managedFields) or a Conflict listing fields other managers own with different values.
pub fn apply(
    def: &ResourceDef,
    live: &Value,
    applied: &Value,
    manager: &Manager,
    force: bool,
) -> Result<Value> {
    let applied_set = leaves_of(def, applied, manager.part);
    let all = entries(live);
    let previous = all
        .iter()
        .find(|e| manager.is(e, "Apply"))
        .map(entry_set)
        .unwrap_or_default();

    let mut conflicts: Vec<(String, String)> = Vec::new();
    for entry in all.iter().filter(|e| !manager.is(e, "Apply")) {
        for owned in entry_set(entry) {
            let clash = applied_set
                .iter()
                .find(|p| overlaps(p, &owned) && value_at(live, p) != value_at(applied, p));
            if let Some(path) = clash {
                conflicts.push((
                    entry_manager(entry).to_string(),
                    format!(".{}", path.join(".")),
                ));
            }
        }
    }
    conflicts.sort();
    conflicts.dedup();
    if !conflicts.is_empty() && !force {
        let causes: Vec<Cause> = conflicts
            .iter()
            .map(|(owner, field)| Cause {
                reason: "FieldManagerConflict",
                message: format!("conflict with \"{owner}\" using {}", manager.api_version),
                field: field.clone(),
            })
            .collect();
        let listed: Vec<String> = causes
            .iter()
            .map(|c| format!("{}: {}", c.message, c.field))
            .collect();
        let noun = if causes.len() == 1 {
            "conflict"
        } else {
            "conflicts"
        };
        return Err(ApiError::ApplyConflict {
            message: format!(
                "Apply failed with {} {noun}: {}",
                causes.len(),
                listed.join("\n")
            ),
            causes,
        });
    }

    let mut merged = live.clone();
    let others: Vec<FieldSet> = all
        .iter()
        .filter(|e| !manager.is(e, "Apply"))
        .map(entry_set)
        .collect();
    for dropped in previous.difference(&applied_set) {
        let shared = others
            .iter()
            .any(|set| set.iter().any(|p| overlaps(p, dropped)));
        if !shared {
            remove_at(&mut merged, dropped);
        }
    }
    merge_applied(&mut merged, &restrict(def, applied, manager.part));

    let mut entries = edit_entries(all, |entry, set| {
        if force && !manager.is(entry, "Apply") {
            set.retain(|owned| {
                !applied_set
                    .iter()
                    .any(|p| overlaps(p, owned) && value_at(live, p) != value_at(applied, p))
            });
        }
    });
    entries.retain(|e| !manager.is(e, "Apply"));
    if !applied_set.is_empty() {
        entries.push(make_entry(manager, "Apply", &applied_set));
    }
    set_entries(&mut merged, entries);
    Ok(merged)
}

/// The part of an applied configuration a write of `part` may change.
fn restrict(def: &ResourceDef, applied: &Value, part: Part) -> Value {
    let mut copy = applied.clone();
    if let Some(map) = copy.as_object_mut() {
        map.retain(|key, _| match part {
            Part::Status => key == "status",
            Part::Main => key != "status" || !def.status_subresource,
        });
        if let Some(meta) = map.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.retain(|key, _| !SYSTEM_METADATA.contains(&key.as_str()));
        }
    }
    copy
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ingresses() -> &'static ResourceDef {
        crate::apiserver::resource("networking.k8s.io", "v1", "ingresses").unwrap()
    }

    fn manager(name: &str, part: Part) -> Manager {
        Manager::new(ingresses(), Some(name), None, part)
    }

    fn owners(object: &Value) -> Vec<(String, String, Vec<String>)> {
        entries(object)
            .iter()
            .map(|e| {
                let fields = entry_set(e).into_iter().map(|p| p.join(".")).collect();
                (
                    entry_manager(e).to_string(),
                    e["operation"].as_str().unwrap().to_string(),
                    fields,
                )
            })
            .collect()
    }

    #[test]
    fn fields_v1_round_trips() {
        let set: FieldSet = [
            vec!["spec".to_string(), "rules".to_string()],
            vec!["metadata".into(), "labels".into(), "a".into()],
        ]
        .into_iter()
        .collect();
        let encoded = to_fields_v1(&set);
        assert_eq!(
            encoded,
            json!({"f:metadata": {"f:labels": {"f:a": {}}}, "f:spec": {"f:rules": {}}})
        );
        assert_eq!(from_fields_v1(&encoded), set);
        // Real servers key list items; here a keyed item makes its list an atomic leaf.
        let real = json!({"f:spec": {"f:rules": {".": {}, "k:{\"host\":\"a\"}": {"f:host": {}}}}});
        assert_eq!(
            from_fields_v1(&real),
            [vec!["spec".to_string(), "rules".to_string()]]
                .into_iter()
                .collect()
        );
    }

    #[test]
    fn managers_derive_from_the_user_agent() {
        let m = Manager::new(
            ingresses(),
            None,
            Some("kubectl/v1.32.4 (linux/amd64) kubernetes/abc"),
            Part::Main,
        );
        assert_eq!(m.name, "kubectl");
        assert_eq!(
            Manager::new(ingresses(), Some(""), None, Part::Main).name,
            "unknown"
        );
    }

    #[test]
    fn create_owns_everything_but_system_fields_and_status() {
        let mut obj = json!({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
            "metadata": {"name": "web", "uid": "u", "labels": {"a": "1"}}, "spec": {"ingressClassName": "x"}, "status": {"x": 1}});
        record_create(
            ingresses(),
            &mut obj,
            &manager("kubectl-create", Part::Main),
            "Update",
        );
        assert_eq!(
            owners(&obj),
            [(
                "kubectl-create".to_string(),
                "Update".to_string(),
                vec![
                    "metadata.labels.a".to_string(),
                    "spec.ingressClassName".to_string()
                ]
            )]
        );
    }

    #[test]
    fn reapply_removes_fields_no_longer_applied() {
        let def = ingresses();
        let first = json!({"metadata": {"name": "web", "labels": {"a": "1", "b": "2"}}, "spec": {"ingressClassName": "x"}});
        let mut live = first.clone();
        record_create(def, &mut live, &manager("ci", Part::Main), "Apply");

        let second = json!({"metadata": {"name": "web", "labels": {"a": "1"}}, "spec": {"ingressClassName": "y"}});
        let merged = apply(def, &live, &second, &manager("ci", Part::Main), false).unwrap();
        assert_eq!(merged["metadata"]["labels"], json!({"a": "1"}));
        let third = json!({"metadata": {"name": "web"}, "spec": {"ingressClassName": "y"}});
        let merged = apply(def, &merged, &third, &manager("ci", Part::Main), false).unwrap();
        assert!(merged["metadata"].get("labels").is_none(), "{merged}");
        assert_eq!(merged["spec"]["ingressClassName"], "y");
        assert_eq!(owners(&merged).len(), 1);
    }

    #[test]
    fn apply_conflicts_with_other_owners_unless_forced() {
        let def = ingresses();
        let mut live = json!({"metadata": {"name": "web"}, "spec": {"ingressClassName": "x", "rules": [{"host": "a"}]}});
        record_create(
            def,
            &mut live,
            &manager("kubectl-create", Part::Main),
            "Update",
        );

        // Same value: shared ownership, no conflict.
        let same = json!({"metadata": {"name": "web"}, "spec": {"ingressClassName": "x"}});
        assert!(apply(def, &live, &same, &manager("ci", Part::Main), false).is_ok());

        let different = json!({"metadata": {"name": "web"}, "spec": {"ingressClassName": "y"}});
        let err = apply(def, &live, &different, &manager("ci", Part::Main), false).unwrap_err();
        assert_eq!(err.code(), 409);
        assert_eq!(
            err.to_string(),
            "Apply failed with 1 conflict: conflict with \"kubectl-create\" using networking.k8s.io/v1: .spec.ingressClassName"
        );

        let forced = apply(def, &live, &different, &manager("ci", Part::Main), true).unwrap();
        assert_eq!(forced["spec"]["ingressClassName"], "y");
        let owners = owners(&forced);
        assert!(
            owners.contains(&(
                "kubectl-create".into(),
                "Update".into(),
                vec!["spec.rules".into()]
            )),
            "{owners:?}"
        );
        assert!(
            owners.contains(&(
                "ci".into(),
                "Apply".into(),
                vec!["spec.ingressClassName".into()]
            )),
            "{owners:?}"
        );
    }

    #[test]
    fn updates_take_over_changed_fields() {
        let def = ingresses();
        let mut live =
            json!({"metadata": {"name": "web"}, "spec": {"ingressClassName": "x", "rules": []}});
        record_create(def, &mut live, &manager("ci", Part::Main), "Apply");
        let mut updated = live.clone();
        updated["spec"]["ingressClassName"] = json!("y");
        record_update(
            def,
            &live,
            &mut updated,
            &manager("kubectl-edit", Part::Main),
        );
        let owners = owners(&updated);
        assert!(
            owners.contains(&("ci".into(), "Apply".into(), vec!["spec.rules".into()])),
            "{owners:?}"
        );
        assert!(
            owners.contains(&(
                "kubectl-edit".into(),
                "Update".into(),
                vec!["spec.ingressClassName".into()]
            )),
            "{owners:?}"
        );
    }

    #[test]
    fn status_apply_touches_only_status() {
        let def = ingresses();
        let live = json!({"metadata": {"name": "web"}, "spec": {"ingressClassName": "x"}});
        let applied = json!({"metadata": {"name": "web"}, "spec": {"ingressClassName": "evil"},
            "status": {"loadBalancer": {"ingress": [{"ip": "10.0.0.1"}]}}});
        let merged = apply(
            def,
            &live,
            &applied,
            &manager("controller", Part::Status),
            false,
        )
        .unwrap();
        assert_eq!(merged["spec"]["ingressClassName"], "x");
        assert_eq!(
            merged["status"]["loadBalancer"]["ingress"][0]["ip"],
            "10.0.0.1"
        );
        assert_eq!(entries(&merged)[0]["subresource"], "status");
    }
}
