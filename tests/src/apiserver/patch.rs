//! PATCH bodies: JSON patch, JSON merge patch, strategic merge patch (simplified) and the
//! server-side apply configuration.

use serde_json::Value;

use super::status::{ApiError, Result};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchType {
    Json,
    Merge,
    Strategic,
    Apply,
}

const ACCEPTED: &str = "application/json-patch+json, application/merge-patch+json, application/strategic-merge-patch+json, application/apply-patch+yaml";

impl PatchType {
    pub fn from_content_type(content_type: Option<&str>) -> Result<Self> {
        let media = content_type
            .unwrap_or_default()
            .split(';')
            .next()
            .unwrap_or_default()
            .trim();
        match media {
            "application/json-patch+json" => Ok(Self::Json),
            "application/merge-patch+json" => Ok(Self::Merge),
            "application/strategic-merge-patch+json" => Ok(Self::Strategic),
            "application/apply-patch+yaml" | "application/apply-patch+json" => Ok(Self::Apply),
            _ => Err(ApiError::UnsupportedMediaType(ACCEPTED)),
        }
    }
}

/// Parses a body as JSON; apply configurations may also be YAML.
pub fn parse_body(body: &[u8], yaml_allowed: bool) -> Result<Value> {
    match serde_json::from_slice(body) {
        Ok(value) => Ok(value),
        Err(json_err) if yaml_allowed => serde_yaml_ng::from_slice(body).map_err(|yaml_err| {
            ApiError::BadRequest(format!(
                "error decoding YAML: {yaml_err} (as JSON: {json_err})"
            ))
        }),
        Err(err) => Err(ApiError::BadRequest(format!("error decoding patch: {err}"))),
    }
}

/// Applies a JSON, merge or strategic merge patch to `target`.
pub fn patch(kind: PatchType, target: &mut Value, body: &[u8]) -> Result<()> {
    match kind {
        PatchType::Json => {
            let ops: json_patch::Patch = serde_json::from_slice(body)
                .map_err(|e| ApiError::BadRequest(format!("error decoding JSON patch: {e}")))?;
            json_patch::patch(target, &ops).map_err(|e| {
                ApiError::BadRequest(format!(
                    "the server rejected our request due to an error in our request: {e}"
                ))
            })
        }
        PatchType::Merge => {
            let patch = parse_body(body, false)?;
            require_object(&patch)?;
            json_patch::merge(target, &patch);
            Ok(())
        }
        PatchType::Strategic => {
            let patch = parse_body(body, false)?;
            require_object(&patch)?;
            strategic_merge(target, &patch);
            Ok(())
        }
        PatchType::Apply => Err(ApiError::Internal("apply is not a plain patch".into())),
    }
}

fn require_object(patch: &Value) -> Result<()> {
    if patch.is_object() {
        Ok(())
    } else {
        Err(ApiError::BadRequest(
            "a merge patch must be a JSON object".into(),
        ))
    }
}

/// Merge patch that understands the `$patch: replace|delete` directives and ignores the
/// other `$`-directives (`$setElementOrder`, `$retainKeys`, ...). Lists are replaced whole,
/// where the real strategic merge would merge those with a patchMergeKey by key.
pub fn strategic_merge(target: &mut Value, patch: &Value) {
    let Value::Object(patch_map) = patch else {
        *target = strip_directives(patch);
        return;
    };
    match patch_map.get("$patch").and_then(Value::as_str) {
        Some("replace") => {
            *target = strip_directives(patch);
            return;
        }
        Some("delete") => {
            *target = Value::Null;
            return;
        }
        _ => {}
    }
    if !target.is_object() {
        *target = Value::Object(Default::default());
    }
    let Value::Object(target_map) = target else {
        return;
    };
    for (key, value) in patch_map {
        if key.starts_with('$') {
            continue;
        }
        if value.is_null() {
            target_map.remove(key);
            continue;
        }
        let entry = target_map.entry(key.clone()).or_insert(Value::Null);
        strategic_merge(entry, value);
        if entry.is_null() {
            target_map.remove(key);
        }
    }
}

fn strip_directives(value: &Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.iter()
                .filter(|(k, _)| !k.starts_with('$'))
                .map(|(k, v)| (k.clone(), strip_directives(v)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(strip_directives).collect()),
        other => other.clone(),
    }
}

/// Deep-merges an applied configuration: maps merge, everything else (lists included) is
/// replaced, and a null removes the field.
pub fn merge_applied(target: &mut Value, applied: &Value) {
    match (target, applied) {
        (Value::Object(target_map), Value::Object(applied_map)) => {
            for (key, value) in applied_map {
                if value.is_null() {
                    target_map.remove(key);
                } else if let Some(existing) = target_map.get_mut(key) {
                    merge_applied(existing, value);
                } else {
                    target_map.insert(key.clone(), value.clone());
                }
            }
        }
        (target, applied) => *target = applied.clone(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn content_types() {
        let cases = [
            (Some("application/merge-patch+json"), Some(PatchType::Merge)),
            (
                Some("application/strategic-merge-patch+json; charset=utf-8"),
                Some(PatchType::Strategic),
            ),
            (Some("application/json-patch+json"), Some(PatchType::Json)),
            (Some("application/apply-patch+yaml"), Some(PatchType::Apply)),
            (Some("application/json"), None),
            (None, None),
        ];
        for (content_type, want) in cases {
            assert_eq!(
                PatchType::from_content_type(content_type).ok(),
                want,
                "{content_type:?}"
            );
        }
        assert_eq!(
            PatchType::from_content_type(Some("text/plain"))
                .unwrap_err()
                .code(),
            415
        );
    }

    #[test]
    fn patches() {
        let base = json!({"metadata": {"labels": {"a": "1", "b": "2"}}, "spec": {"rules": [{"host": "x"}], "tls": []}});
        let cases: [(PatchType, &str, Value); 6] = [
            (
                PatchType::Merge,
                r#"{"metadata":{"labels":{"a":null,"c":"3"}}}"#,
                json!({"metadata": {"labels": {"b": "2", "c": "3"}}, "spec": {"rules": [{"host": "x"}], "tls": []}}),
            ),
            (
                PatchType::Strategic,
                r#"{"metadata":{"labels":{"a":"9"}},"spec":{"rules":[{"host":"y"}],"$setElementOrder/rules":[{"host":"y"}]}}"#,
                json!({"metadata": {"labels": {"a": "9", "b": "2"}}, "spec": {"rules": [{"host": "y"}], "tls": []}}),
            ),
            (
                PatchType::Strategic,
                r#"{"metadata":{"labels":{"$patch":"replace","z":"1"}}}"#,
                json!({"metadata": {"labels": {"z": "1"}}, "spec": {"rules": [{"host": "x"}], "tls": []}}),
            ),
            (
                PatchType::Strategic,
                r#"{"spec":{"$patch":"delete"}}"#,
                json!({"metadata": {"labels": {"a": "1", "b": "2"}}}),
            ),
            (
                PatchType::Json,
                r#"[{"op":"replace","path":"/spec/rules/0/host","value":"z"},{"op":"remove","path":"/spec/tls"}]"#,
                json!({"metadata": {"labels": {"a": "1", "b": "2"}}, "spec": {"rules": [{"host": "z"}]}}),
            ),
            (
                PatchType::Json,
                r#"[{"op":"add","path":"/metadata/labels/d","value":"4"}]"#,
                json!({"metadata": {"labels": {"a": "1", "b": "2", "d": "4"}}, "spec": {"rules": [{"host": "x"}], "tls": []}}),
            ),
        ];
        for (kind, body, want) in cases {
            let mut target = base.clone();
            patch(kind, &mut target, body.as_bytes()).unwrap_or_else(|e| panic!("{body}: {e}"));
            assert_eq!(target, want, "{kind:?} {body}");
        }
    }

    #[test]
    fn bad_patches_are_4xx() {
        let base = json!({"spec": {}});
        let cases = [
            (PatchType::Merge, "not json"),
            (PatchType::Merge, "[1]"),
            (PatchType::Strategic, "\"x\""),
            (PatchType::Json, r#"{"op":"add"}"#),
            (
                PatchType::Json,
                r#"[{"op":"test","path":"/spec","value":1}]"#,
            ),
            (PatchType::Json, r#"[{"op":"remove","path":"/nope"}]"#),
        ];
        for (kind, body) in cases {
            let mut target = base.clone();
            let err = patch(kind, &mut target, body.as_bytes()).unwrap_err();
            assert_eq!(err.code(), 400, "{body}");
        }
    }

    #[test]
    fn apply_bodies_may_be_yaml() {
        let yaml = "apiVersion: v1\nkind: Secret\nmetadata:\n  name: tls\n";
        assert_eq!(
            parse_body(yaml.as_bytes(), true).unwrap()["metadata"]["name"],
            "tls"
        );
        assert!(parse_body(yaml.as_bytes(), false).is_err());
        assert!(parse_body(b"a: [", true).is_err());
    }

    #[test]
    fn applied_config_merges_maps_and_replaces_lists() {
        let mut live = json!({"metadata": {"labels": {"a": "1"}}, "spec": {"rules": [{"host": "x"}, {"host": "y"}], "keep": true}});
        merge_applied(
            &mut live,
            &json!({"metadata": {"labels": {"b": "2"}}, "spec": {"rules": [{"host": "z"}], "keep": null}}),
        );
        assert_eq!(
            live,
            json!({"metadata": {"labels": {"a": "1", "b": "2"}}, "spec": {"rules": [{"host": "z"}]}})
        );
    }
}
