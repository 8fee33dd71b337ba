//! Authentication annotations, read as ingress-nginx reads them, into the typed policy the
//! access phase runs (`proxy::phase::auth`).
//!
//! ```text
//!   auth-type: basic + auth-secret (+ auth-secret-type, auth-realm)
//!       └─> the Secret (the Ingress's namespace) ─> htpasswd::Credentials ─> BasicAuth
//!   satisfy: all | any        how the source ranges and authentication combine
//! ```
//!
//! Everything that cannot be honoured as written is an error, and the builder refuses the
//! Ingress (503) on it: a protected path is never served open because its Secret is missing,
//! its hash format unknown or its annotation misspelt.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::htpasswd::Credentials;
use super::lookup;
use crate::diagnostics::DiagnosticKind;
use crate::store::{ObjectKey, Store};

/// `auth-type: basic`: who may in, and the realm the 401 names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BasicAuth {
    /// `auth-realm` (empty by default, as ingress-nginx writes `auth_basic ""`).
    pub realm: Arc<str>,
    pub credentials: Credentials,
    /// The Secret the credentials came from, for logs.
    pub secret: ObjectKey,
}

/// `satisfy`: with `any`, a client inside the route's allow-list needs no authentication, and
/// one outside it may still get in by authenticating; with `all` (the default) both must pass.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Satisfy {
    #[default]
    All,
    Any,
}

/// Why an authentication annotation cannot be honoured: the diagnostic's kind and message.
pub type Refusal = (DiagnosticKind, String);

/// `satisfy`.
pub fn satisfy(annotations: Option<&BTreeMap<String, String>>) -> Result<Satisfy, Refusal> {
    let Some((key, value)) = annotations.and_then(|a| lookup(a, "satisfy")) else {
        return Ok(Satisfy::All);
    };
    match value.trim() {
        "all" | "" => Ok(Satisfy::All),
        "any" => Ok(Satisfy::Any),
        other => Err((
            DiagnosticKind::InvalidAnnotation,
            format!("{key}: {other:?} is not \"all\" or \"any\""),
        )),
    }
}

/// Basic auth for an Ingress `ingress` with `annotations`, its Secret read from `store`.
/// `Ok(None)` without `auth-type` (ingress-nginx then ignores `auth-secret` too).
pub fn basic(
    annotations: Option<&BTreeMap<String, String>>,
    store: &Store,
    ingress: &ObjectKey,
) -> Result<Option<BasicAuth>, Refusal> {
    let Some(annotations) = annotations else {
        return Ok(None);
    };
    let invalid = |message: String| (DiagnosticKind::InvalidAnnotation, message);
    let Some((type_key, auth_type)) = lookup(annotations, "auth-type") else {
        return Ok(None);
    };
    match auth_type.trim() {
        "basic" => {}
        "digest" => {
            return Err(invalid(format!(
                "{type_key}: digest authentication is not supported (basic is)"
            )));
        }
        other => {
            return Err(invalid(format!(
                "{type_key}: {other:?} is not \"basic\" or \"digest\""
            )));
        }
    }
    let Some((secret_key, secret)) = lookup(annotations, "auth-secret") else {
        return Err(invalid(format!(
            "{type_key} is set without auth-secret: there is nobody to let in"
        )));
    };
    let secret = secret.trim();
    let (namespace, name) = secret
        .split_once('/')
        .unwrap_or((ingress.namespace.as_str(), secret));
    let valid = |s: &str| {
        !s.is_empty()
            && s.len() <= 253
            && s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-.".contains(&b))
    };
    if !valid(namespace) || !valid(name) {
        return Err(invalid(format!(
            "{secret_key}: {secret:?} is not \"name\" or \"namespace/name\""
        )));
    }
    // ingress-nginx refuses Secrets of other namespaces unless its
    // allow-cross-namespace-resources is on (off by default): one namespace's Ingress must not
    // read another's passwords.
    if namespace != ingress.namespace {
        return Err(invalid(format!(
            "{secret_key}: {secret:?}: only Secrets in the Ingress's namespace can be used"
        )));
    }
    let key = ObjectKey::new(namespace.to_string(), name.to_string());
    let secret_type = match lookup(annotations, "auth-secret-type") {
        None => SecretType::File,
        Some((_, v)) if v.trim() == "auth-file" => SecretType::File,
        Some((_, v)) if v.trim() == "auth-map" => SecretType::Map,
        Some((k, v)) => {
            return Err(invalid(format!(
                "{k}: {v:?} is not \"auth-file\" or \"auth-map\""
            )));
        }
    };
    let realm = lookup(annotations, "auth-realm").map_or("", |(_, v)| v);
    if realm
        .bytes()
        .any(|b| b == b'"' || b == b'\\' || b.is_ascii_control())
    {
        return Err(invalid(
            "auth-realm: quotes, backslashes and control characters cannot be sent in WWW-Authenticate".into(),
        ));
    }
    let Some(object) = store.secrets.get(&key) else {
        return Err((
            DiagnosticKind::SecretNotFound,
            format!("{secret_key}: Secret {key} not found"),
        ));
    };
    let secret_invalid = |why: String| {
        (
            DiagnosticKind::SecretInvalid,
            format!("{secret_key}: Secret {key}: {why}"),
        )
    };
    let data = object.data.as_ref();
    let credentials = match secret_type {
        SecretType::File => {
            let Some(file) = data.and_then(|d| d.get("auth")) else {
                return Err(secret_invalid(
                    "no \"auth\" key (auth-secret-type auth-file wants an htpasswd file there)"
                        .into(),
                ));
            };
            Credentials::from_htpasswd(&file.0).map_err(|e| secret_invalid(format!("auth: {e}")))?
        }
        SecretType::Map => Credentials::from_map(
            data.into_iter()
                .flatten()
                .map(|(user, hash)| (user.as_str(), hash.0.as_slice())),
        )
        .map_err(secret_invalid)?,
    };
    if credentials.is_empty() {
        return Err(secret_invalid("holds no user".into()));
    }
    Ok(Some(BasicAuth {
        realm: Arc::from(realm),
        credentials,
        secret: key,
    }))
}

enum SecretType {
    /// `auth-file`: an htpasswd file under the key `auth`.
    File,
    /// `auth-map`: each key a user, each value a hash.
    Map,
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;
    use k8s_openapi::api::core::v1::Secret;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn store_with(name: &str, data: &[(&str, &str)]) -> Store {
        let mut store = Store::default();
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                ..ObjectMeta::default()
            },
            data: Some(
                data.iter()
                    .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
                    .collect(),
            ),
            ..Secret::default()
        };
        store.apply(crate::store::Object::Secret(Arc::new(secret)));
        store
    }

    fn annotations(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (format!("nginx.ingress.kubernetes.io/{k}"), v.to_string()))
            .collect()
    }

    #[test]
    fn basic_auth_reads_its_secret_or_refuses() {
        let ingress = ObjectKey::new("ns", "ing");
        let file = store_with("users", &[("auth", "alice:{PLAIN}a\n")]);
        let map = store_with("users", &[("alice", "{PLAIN}a"), ("bob", "{PLAIN}b")]);
        let bad = store_with("users", &[("auth", "alice:des-crypt\n")]);
        let basic_with = |extra: &[(&str, &str)]| {
            let mut pairs = vec![("auth-type", "basic"), ("auth-secret", "users")];
            pairs.extend_from_slice(extra);
            annotations(&pairs)
        };
        // (annotations, store) -> Ok(users) or Err(kind)
        type Want = Result<Option<usize>, DiagnosticKind>;
        let cases: Vec<(BTreeMap<String, String>, &Store, Want)> = vec![
            (annotations(&[]), &file, Ok(None)),
            // ingress-nginx ignores auth-secret without auth-type.
            (annotations(&[("auth-secret", "users")]), &file, Ok(None)),
            (basic_with(&[]), &file, Ok(Some(1))),
            (
                basic_with(&[("auth-secret-type", "auth-file")]),
                &file,
                Ok(Some(1)),
            ),
            (
                basic_with(&[("auth-secret-type", "auth-map")]),
                &map,
                Ok(Some(2)),
            ),
            (
                annotations(&[("auth-type", "basic"), ("auth-secret", "ns/users")]),
                &file,
                Ok(Some(1)),
            ),
            (
                annotations(&[("auth-type", "basic"), ("auth-secret", "other/users")]),
                &file,
                Err(DiagnosticKind::InvalidAnnotation),
            ),
            (
                annotations(&[("auth-type", "digest"), ("auth-secret", "users")]),
                &file,
                Err(DiagnosticKind::InvalidAnnotation),
            ),
            (
                annotations(&[("auth-type", "Basic")]),
                &file,
                Err(DiagnosticKind::InvalidAnnotation),
            ),
            (
                annotations(&[("auth-type", "basic")]),
                &file,
                Err(DiagnosticKind::InvalidAnnotation),
            ),
            (
                basic_with(&[("auth-secret-type", "auth-list")]),
                &file,
                Err(DiagnosticKind::InvalidAnnotation),
            ),
            (
                annotations(&[("auth-type", "basic"), ("auth-secret", "missing")]),
                &file,
                Err(DiagnosticKind::SecretNotFound),
            ),
            (basic_with(&[]), &map, Err(DiagnosticKind::SecretInvalid)),
            (basic_with(&[]), &bad, Err(DiagnosticKind::SecretInvalid)),
            (
                basic_with(&[("auth-realm", "say \"hi\"")]),
                &file,
                Err(DiagnosticKind::InvalidAnnotation),
            ),
        ];
        for (annotations, store, want) in cases {
            let got = basic(Some(&annotations), store, &ingress)
                .map(|b| b.map(|b| b.credentials.len()))
                .map_err(|(kind, _)| kind);
            assert_eq!(got, want, "{annotations:?}");
        }
        let realm = basic(
            Some(&basic_with(&[("auth-realm", "Staff only")])),
            &file,
            &ingress,
        )
        .expect("parses")
        .expect("basic auth");
        assert_eq!(&*realm.realm, "Staff only");
    }

    #[test]
    fn satisfy_values() {
        let cases = [
            (None, Ok(Satisfy::All)),
            (Some("all"), Ok(Satisfy::All)),
            (Some("any"), Ok(Satisfy::Any)),
            (Some(" any "), Ok(Satisfy::Any)),
            (Some("some"), Err(DiagnosticKind::InvalidAnnotation)),
        ];
        for (value, want) in cases {
            let map = annotations(
                &value
                    .map(|v| ("satisfy", v))
                    .into_iter()
                    .collect::<Vec<_>>(),
            );
            assert_eq!(satisfy(Some(&map)).map_err(|(k, _)| k), want, "{value:?}");
        }
    }
}
