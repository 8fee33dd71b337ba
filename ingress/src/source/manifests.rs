//! The manifests source: a directory of YAML/JSON files, read whole on every change.
//!
//! Reading everything again is simpler than tracking which document of which file changed, and a
//! directory a person maintains is small. Every problem becomes a diagnostic on the file, and the
//! documents that did parse still reach the store.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::{Ingress, IngressClass};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::diagnostics::{Diagnostic, DiagnosticKind, Subject};
use crate::store::{Object, Store};

/// File endings the source reads; everything else in the directory is ignored.
const EXTENSIONS: &[&str] = &["yaml", "yml", "json"];

/// Reads every manifest under `dir` into a fresh store.
pub fn load_dir(dir: &Path) -> Store {
    let mut store = Store::default();
    let files = match manifest_files(dir) {
        Ok(files) => files,
        Err(err) => {
            store.source_diagnostics.push(Diagnostic::error(
                DiagnosticKind::ManifestUnreadable,
                file_subject(dir),
                format!("cannot list directory: {err}"),
            ));
            return store;
        }
    };
    for path in files {
        match std::fs::read_to_string(&path) {
            Ok(text) => {
                let parsed = parse_file(&path, &text);
                add_to_store(&mut store, &path, parsed);
            }
            Err(err) => store.source_diagnostics.push(Diagnostic::error(
                DiagnosticKind::ManifestUnreadable,
                file_subject(&path),
                format!("cannot read: {err}"),
            )),
        }
    }
    store
}

/// Whether a changed path can affect what `load_dir` reads.
pub fn is_manifest(path: &Path) -> bool {
    path.extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| EXTENSIONS.contains(&e))
        && !path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with('.'))
}

/// The manifest files under `dir`, recursively, in a stable order so that "first wins" is
/// reproducible. Hidden files and directories (editor swap files, `..data` symlink farms of
/// mounted ConfigMaps) are skipped.
fn manifest_files(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(current) = pending.pop() {
        for entry in std::fs::read_dir(&current)? {
            let path = entry?.path();
            let hidden = path
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with('.'));
            if hidden {
                continue;
            }
            if path.is_dir() {
                pending.push(path);
            } else if is_manifest(&path) {
                out.push(path);
            }
        }
    }
    out.sort();
    Ok(out)
}

/// What one file yielded: the objects that parsed and the problems with the rest.
#[derive(Debug, Default)]
pub struct ParsedFile {
    pub objects: Vec<Object>,
    pub diagnostics: Vec<Diagnostic>,
}

/// Parses one file's text. Pure: the path only names the file in diagnostics.
pub fn parse_file(path: &Path, text: &str) -> ParsedFile {
    let mut parsed = ParsedFile::default();
    let is_json = path.extension().is_some_and(|e| e == "json");
    let documents: Vec<Result<Value, String>> = if is_json {
        vec![serde_json::from_str::<Value>(text).map_err(|e| e.to_string())]
    } else {
        let mut documents = Vec::new();
        for doc in serde_yaml_ng::Deserializer::from_str(text) {
            let result = Value::deserialize(doc).map_err(|e| e.to_string());
            let failed = result.is_err();
            documents.push(result);
            // After a syntax error the YAML stream cannot be resynchronised; the iterator
            // would repeat the same error forever.
            if failed {
                break;
            }
        }
        documents
    };
    for (index, document) in documents.into_iter().enumerate() {
        let place = format!("document {}", index + 1);
        match document {
            Ok(Value::Null) => {}
            Ok(value) => parse_value(path, &place, value, &mut parsed),
            Err(err) => parsed.diagnostics.push(Diagnostic::error(
                DiagnosticKind::ManifestInvalid,
                file_subject(path),
                format!("{place}: {err}"),
            )),
        }
    }
    parsed
}

fn parse_value(path: &Path, place: &str, value: Value, parsed: &mut ParsedFile) {
    let field = |name: &str| {
        value
            .get(name)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned()
    };
    let (api_version, kind) = (field("apiVersion"), field("kind"));
    let invalid = |message: String| {
        Diagnostic::error(DiagnosticKind::ManifestInvalid, file_subject(path), message)
    };
    let result = match (api_version.as_str(), kind.as_str()) {
        ("v1", "List") => {
            let items = match value.get("items") {
                Some(Value::Array(items)) => items.clone(),
                _ => Vec::new(),
            };
            for (i, item) in items.into_iter().enumerate() {
                parse_value(path, &format!("{place} item {}", i + 1), item, parsed);
            }
            return;
        }
        ("networking.k8s.io/v1", "Ingress") => {
            typed::<Ingress>(value).map(|(o, w)| (Object::Ingress(Arc::new(o)), w))
        }
        ("networking.k8s.io/v1", "IngressClass") => {
            typed::<IngressClass>(value).map(|(o, w)| (Object::IngressClass(Arc::new(o)), w))
        }
        ("v1", "Service") => {
            typed::<Service>(value).map(|(o, w)| (Object::Service(Arc::new(o)), w))
        }
        ("discovery.k8s.io/v1", "EndpointSlice") => {
            typed::<EndpointSlice>(value).map(|(o, w)| (Object::EndpointSlice(Arc::new(o)), w))
        }
        ("v1", "ConfigMap") => {
            typed::<ConfigMap>(value).map(|(o, w)| (Object::ConfigMap(Arc::new(o)), w))
        }
        ("v1", "Secret") => {
            typed::<Secret>(value).map(|(o, w)| (Object::Secret(Arc::new(merge_string_data(o))), w))
        }
        (_, "Ingress" | "IngressClass") if api_version != "networking.k8s.io/v1" => {
            parsed.diagnostics.push(Diagnostic::error(
                DiagnosticKind::UnsupportedKind,
                file_subject(path),
                format!(
                    "{place}: {kind} {api_version} is not served; use networking.k8s.io/v1 \
                     (the older versions were removed in Kubernetes 1.22)"
                ),
            ));
            return;
        }
        ("", _) | (_, "") => Err("missing apiVersion or kind".to_string()),
        // Other kinds (Deployments next to their Ingress, say) are legitimately present and
        // not ours to read.
        _ => return,
    };
    match result {
        Ok((object, unknown)) => {
            if object.key().name.is_empty() {
                parsed
                    .diagnostics
                    .push(invalid(format!("{place}: {kind} has no metadata.name")));
                return;
            }
            for field in unknown {
                parsed.diagnostics.push(Diagnostic::warning(
                    DiagnosticKind::ManifestInvalid,
                    file_subject(path),
                    format!(
                        "{place}: {kind} {}: unknown field {field} is ignored",
                        object.key()
                    ),
                ));
            }
            parsed.objects.push(object);
        }
        Err(err) => parsed
            .diagnostics
            .push(invalid(format!("{place}: {kind}: {err}"))),
    }
}

/// Deserializes into a k8s-openapi type and reports the fields the type dropped, so a typo such
/// as `pathtype:` is a warning instead of a silent default.
fn typed<T>(value: Value) -> Result<(T, Vec<String>), String>
where
    T: DeserializeOwned + serde::Serialize,
{
    let object: T = serde_json::from_value(value.clone()).map_err(|e| e.to_string())?;
    let round_trip = serde_json::to_value(&object).map_err(|e| e.to_string())?;
    let mut unknown = Vec::new();
    unknown_fields(&value, &round_trip, String::new(), &mut unknown);
    Ok((object, unknown))
}

/// Walks `original` and names every non-null field that `typed` does not have.
pub fn unknown_fields(original: &Value, typed: &Value, at: String, out: &mut Vec<String>) {
    match (original, typed) {
        (Value::Object(orig), Value::Object(kept)) => {
            for (name, value) in orig {
                let here = if at.is_empty() {
                    name.clone()
                } else {
                    format!("{at}.{name}")
                };
                match kept.get(name) {
                    Some(kept_value) => unknown_fields(value, kept_value, here, out),
                    None if value.is_null() => {}
                    None => out.push(here),
                }
            }
        }
        (Value::Array(orig), Value::Array(kept)) => {
            for (i, (o, k)) in orig.iter().zip(kept).enumerate() {
                unknown_fields(o, k, format!("{at}[{i}]"), out);
            }
        }
        _ => {}
    }
}

/// The API server folds `stringData` into `data` on write; a manifests directory has no API
/// server, so the source does it.
fn merge_string_data(mut secret: Secret) -> Secret {
    if let Some(strings) = secret.string_data.take() {
        let data = secret.data.get_or_insert_with(Default::default);
        for (key, value) in strings {
            data.insert(key, ByteString(value.into_bytes()));
        }
    }
    secret
}

fn add_to_store(store: &mut Store, path: &Path, parsed: ParsedFile) {
    store.source_diagnostics.extend(parsed.diagnostics);
    for object in parsed.objects {
        let kind = object.kind();
        let key = object.key();
        if store.contains(kind, &key) {
            store.source_diagnostics.push(Diagnostic::error(
                DiagnosticKind::DuplicateObject,
                file_subject(path),
                format!("{kind} {key} is defined more than once; the first definition is used"),
            ));
            continue;
        }
        store.apply(object);
    }
}

fn file_subject(path: &Path) -> Subject {
    Subject::File {
        path: path.display().to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Kind, ObjectKey};

    const MULTI: &str = r#"
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: web, namespace: shop}
spec:
  rules:
  - host: shop.example.com
    http:
      paths:
      - {path: /, pathType: Prefix, backend: {service: {name: web, port: {number: 80}}}}
---
# an empty document between separators is fine
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: shop}
spec:
  ports: [{name: http, port: 80, targetPort: 8080}]
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
"#;

    #[test]
    fn multi_document_yaml() {
        let parsed = parse_file(Path::new("a.yaml"), MULTI);
        assert!(parsed.diagnostics.is_empty(), "{:?}", parsed.diagnostics);
        let kinds: Vec<_> = parsed.objects.iter().map(|o| (o.kind(), o.key())).collect();
        assert_eq!(
            kinds,
            vec![
                (Kind::Ingress, ObjectKey::new("shop", "web")),
                (Kind::Service, ObjectKey::new("shop", "web")),
            ]
        );
    }

    #[test]
    fn table_of_bad_documents() {
        let cases: &[(&str, &str, DiagnosticKind, &str)] = &[
            (
                "a.yaml",
                "kind: [unclosed",
                DiagnosticKind::ManifestInvalid,
                "document 1",
            ),
            (
                "a.yaml",
                "apiVersion: v1\nkind: Service\n",
                DiagnosticKind::ManifestInvalid,
                "no metadata.name",
            ),
            (
                "a.yaml",
                "metadata: {name: x}\n",
                DiagnosticKind::ManifestInvalid,
                "missing apiVersion",
            ),
            (
                "a.yaml",
                "apiVersion: networking.k8s.io/v1beta1\nkind: Ingress\nmetadata: {name: x}\n",
                DiagnosticKind::UnsupportedKind,
                "networking.k8s.io/v1",
            ),
            (
                "a.yaml",
                "apiVersion: v1\nkind: Service\nmetadata: {name: x}\nspec: {ports: [{port: nope}]}\n",
                DiagnosticKind::ManifestInvalid,
                "Service",
            ),
            (
                "a.json",
                "{\"apiVersion\": ",
                DiagnosticKind::ManifestInvalid,
                "document 1",
            ),
        ];
        for (file, text, kind, needle) in cases {
            let parsed = parse_file(Path::new(file), text);
            assert!(parsed.objects.is_empty(), "{text}");
            assert_eq!(
                parsed.diagnostics.len(),
                1,
                "{text}: {:?}",
                parsed.diagnostics
            );
            let d = &parsed.diagnostics[0];
            assert_eq!(d.kind, *kind, "{text}");
            assert!(d.message.contains(needle), "{text}: {}", d.message);
        }
    }

    #[test]
    fn unknown_fields_are_warnings_and_the_object_still_loads() {
        let text = r#"
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: typo}
spec:
  rules:
  - host: a.example.com
    http:
      paths:
      - {path: /, pathtype: Prefix, backend: {service: {name: web, port: {number: 80}}}}
"#;
        let parsed = parse_file(Path::new("t.yaml"), text);
        assert_eq!(parsed.objects.len(), 1);
        assert_eq!(parsed.diagnostics.len(), 1);
        assert!(
            parsed.diagnostics[0]
                .message
                .contains("spec.rules[0].http.paths[0].pathtype"),
            "{}",
            parsed.diagnostics[0].message
        );
    }

    #[test]
    fn json_list_and_string_data() {
        let text = r#"{"apiVersion":"v1","kind":"List","items":[
            {"apiVersion":"v1","kind":"Secret","metadata":{"name":"s"},"type":"kubernetes.io/tls",
             "stringData":{"tls.crt":"C","tls.key":"K"}}]}"#;
        let parsed = parse_file(Path::new("l.json"), text);
        assert!(parsed.diagnostics.is_empty(), "{:?}", parsed.diagnostics);
        let Some(Object::Secret(secret)) = parsed.objects.first() else {
            panic!("no secret")
        };
        let data = secret.data.as_ref().expect("data");
        assert_eq!(data.get("tls.crt").map(|b| b.0.as_slice()), Some(&b"C"[..]));
    }

    #[test]
    fn load_dir_reports_duplicates_and_keeps_going() {
        let dir = std::env::temp_dir().join(format!("ingress-manifests-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("nested")).unwrap();
        let svc = "apiVersion: v1\nkind: Service\nmetadata: {name: web}\n";
        std::fs::write(dir.join("a.yaml"), svc).unwrap();
        std::fs::write(dir.join("nested/b.yml"), svc).unwrap();
        std::fs::write(dir.join("c.json"), "not json").unwrap();
        std::fs::write(dir.join("notes.txt"), "ignored").unwrap();
        std::fs::write(dir.join(".swap.yaml"), "ignored: [").unwrap();
        let store = load_dir(&dir);
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(store.services.len(), 1);
        let kinds: Vec<_> = store.source_diagnostics.iter().map(|d| d.kind).collect();
        assert_eq!(
            kinds,
            vec![
                DiagnosticKind::ManifestInvalid,
                DiagnosticKind::DuplicateObject
            ]
        );
    }
}
