//! The ConfigMaps of headers, resolved against the store for one snapshot:
//!
//! ```text
//!   global ConfigMap  add-headers ──────────┐ every route's response  (missing, bad entry:
//!                     proxy-set-headers ────┤ every route's request    warning, left out)
//!                     global-allowed-... ─┐ │
//!   Ingress           custom-headers ─────┴─┴─> ConfigHeaders of its routes (missing, bad or
//!                                                not allowed: the Ingress answers 503)
//!                     auth-proxy-set-headers ─> ExternalAuth (missing or bad: 503)
//! ```
//!
//! A missing ConfigMap is never fatal to the build: it is a diagnostic on the object that
//! names it, and that object's share fails as ingress-nginx's does (a global key is left
//! out, an Ingress's location is denied).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use super::annotations::configmap_headers::{self, ConfigHeaders, Headers, HeadersError, Use};
use super::annotations::snippet::ResponseEdits;
use super::annotations::{self, auth::Refusal};
use super::global::HeaderMaps;
use super::policy::HeaderTemplates;
use crate::diagnostics::{Diagnostic, DiagnosticKind, Subject};
use crate::object::Kind;
use crate::store::{ObjectKey, Store};

/// Every ConfigMap a build reads: the global one (`config_map`), those its `add-headers` and
/// `proxy-set-headers` name, and those any Ingress's `custom-headers` and
/// `auth-proxy-set-headers` name (whatever its class: a superset is harmless).
pub fn referenced(store: &Store, config_map: Option<&ObjectKey>) -> BTreeSet<ObjectKey> {
    let mut keys = BTreeSet::new();
    if let Some(global) = config_map {
        keys.insert(global.clone());
        let data = store
            .config_maps
            .get(global)
            .and_then(|cm| cm.data.as_ref());
        for (name, setting) in [
            ("add-headers", Use::AddHeaders),
            ("proxy-set-headers", Use::ProxySetHeaders),
        ] {
            if let Some(value) = data.and_then(|d| d.get(name))
                && let Ok(key) =
                    configmap_headers::reference(setting, value, &global.namespace, false)
            {
                keys.insert(key);
            }
        }
    }
    for (key, ingress) in &store.ingresses {
        let Some(annotations) = ingress.metadata.annotations.as_ref() else {
            continue;
        };
        for (name, setting) in [
            ("custom-headers", Use::CustomHeaders),
            ("auth-proxy-set-headers", Use::AuthProxySetHeaders),
        ] {
            if let Some((_, value)) = annotations::lookup(annotations, name)
                && let Ok(key) = configmap_headers::reference(setting, value, &key.namespace, true)
            {
                keys.insert(key);
            }
        }
    }
    keys
}

/// The headers of `add-headers` and `proxy-set-headers` for every route. `config_map`: the
/// global ConfigMap, which the diagnostics are about (and whose namespace a bare NAME is in).
pub(super) fn global(
    store: &Store,
    maps: &HeaderMaps,
    config_map: Option<&ObjectKey>,
    diagnostics: &mut Vec<Diagnostic>,
) -> ConfigHeaders {
    let Some(config_map) = config_map else {
        return ConfigHeaders::default();
    };
    let subject = || Subject::object(Kind::ConfigMap, config_map);
    let mut read = |setting: Use, value: Option<&String>| -> Headers {
        let Some(value) = value else {
            return Vec::new();
        };
        let result = configmap_headers::reference(setting, value, &config_map.namespace, false)
            .and_then(|key| configmap_headers::read(store, setting, &key, &[]));
        match result {
            Ok((headers, skipped)) => {
                for error in skipped {
                    diagnostics.push(Diagnostic::warning(
                        DiagnosticKind::InvalidConfigValue,
                        subject(),
                        format!("{error}; this header is left out"),
                    ));
                }
                headers
            }
            Err(error) => {
                let kind = match error {
                    HeadersError::NotFound { .. } => DiagnosticKind::ConfigMapNotFound,
                    _ => DiagnosticKind::InvalidConfigValue,
                };
                diagnostics.push(Diagnostic::warning(
                    kind,
                    subject(),
                    format!("{error}; no header of it is set (as ingress-nginx)"),
                ));
                Vec::new()
            }
        }
    };
    ConfigHeaders {
        response: read(Use::AddHeaders, maps.add_headers.as_ref()),
        request: read(Use::ProxySetHeaders, maps.proxy_set_headers.as_ref()),
    }
}

/// `add-headers` for the proxy's own answers: the literal values, and the values with nginx
/// variables, which the proxy expands for each request it answers itself.
pub(super) fn own_responses(
    global: &ConfigHeaders,
) -> (Option<Arc<ResponseEdits>>, Option<HeaderTemplates>) {
    let (literal, templated) = configmap_headers::split(&global.response);
    let replace: Vec<_> = literal.into_iter().filter(|(_, v)| v.is_some()).collect();
    let literal = (!replace.is_empty()).then(|| {
        Arc::new(ResponseEdits {
            replace,
            add: Vec::new(),
        })
    });
    let templated = (!templated.is_empty()).then(|| templated.into());
    (literal, templated)
}

/// The headers of an Ingress's routes: the global ones with its `custom-headers` over them.
/// `Err`: the ConfigMap `custom-headers` names is missing, or has an entry that is invalid or
/// not in `allowed`, and the Ingress is to be refused (ingress-nginx denies its locations).
pub(super) fn ingress(
    store: &Store,
    key: &ObjectKey,
    annotations: Option<&BTreeMap<String, String>>,
    global: &ConfigHeaders,
    allowed: &[String],
) -> Result<Option<Arc<ConfigHeaders>>, Refusal> {
    let custom = match annotations.and_then(|a| annotations::lookup(a, "custom-headers")) {
        None => Vec::new(),
        Some((written, value)) => {
            read_strict(store, Use::CustomHeaders, key, written, value, allowed)?
        }
    };
    if global.response.is_empty() && global.request.is_empty() && custom.is_empty() {
        return Ok(None);
    }
    Ok(Some(Arc::new(ConfigHeaders {
        response: configmap_headers::overlay(&global.response, &custom),
        request: global.request.clone(),
    })))
}

/// `auth-proxy-set-headers` of an Ingress (none without the annotation).
pub(super) fn auth(
    store: &Store,
    key: &ObjectKey,
    annotations: Option<&BTreeMap<String, String>>,
) -> Result<Headers, Refusal> {
    match annotations.and_then(|a| annotations::lookup(a, "auth-proxy-set-headers")) {
        None => Ok(Vec::new()),
        Some((written, value)) => {
            read_strict(store, Use::AuthProxySetHeaders, key, written, value, &[])
        }
    }
}

/// An Ingress's ConfigMap of headers, in its own namespace, every entry valid. `written`:
/// the annotation's key as written, which the message names (the migration report finds the
/// annotation by it).
fn read_strict(
    store: &Store,
    setting: Use,
    ingress: &ObjectKey,
    written: &str,
    value: &str,
    allowed: &[String],
) -> Result<Headers, Refusal> {
    configmap_headers::reference(setting, value, &ingress.namespace, true)
        .and_then(|key| configmap_headers::read(store, setting, &key, allowed))
        .map(|(headers, _)| headers)
        .map_err(|error| {
            let kind = match error {
                HeadersError::NotFound { .. } => DiagnosticKind::ConfigMapNotFound,
                _ => DiagnosticKind::InvalidAnnotation,
            };
            let message = error.to_string();
            let message = match message.strip_prefix(setting.as_str()) {
                Some(rest) => format!("{written}{rest}"),
                None => message,
            };
            (kind, message)
        })
}

#[cfg(test)]
mod tests {
    use http::{HeaderName, HeaderValue};

    use super::*;
    use crate::snapshot::annotations::configmap_headers::HeaderSetting;
    use crate::snapshot::annotations::variables::Template;

    #[test]
    fn own_answers_get_literal_values_and_templates_apart() {
        let name = |n: &'static str| HeaderName::from_static(n);
        let template = |t: &str| Template::parse(t).unwrap_or_else(|e| panic!("{t}: {e}"));
        let global = ConfigHeaders {
            response: vec![
                (
                    name("x-literal"),
                    HeaderSetting::Literal(HeaderValue::from_static("v")),
                ),
                (name("x-cleared"), HeaderSetting::Clear),
                (
                    name("x-id"),
                    HeaderSetting::Template(template("$request_id")),
                ),
            ],
            request: Vec::new(),
        };
        let (literal, templates) = own_responses(&global);
        let literal = literal.expect("a literal value");
        assert_eq!(
            literal.replace,
            [(name("x-literal"), Some(HeaderValue::from_static("v")))]
        );
        let templates = templates.expect("a template");
        assert_eq!(templates.len(), 1);
        assert_eq!(templates[0].0, name("x-id"));

        let (literal, templates) = own_responses(&ConfigHeaders::default());
        assert!(literal.is_none() && templates.is_none());
    }
}
