//! Headers listed in a ConfigMap (one entry a header: name → value), as four ingress-nginx
//! settings name them:
//!
//! ```text
//!   setting                          where            names          values
//!   custom-headers (annotation)      response         [A-Za-z0-9_-]  literal ($ is a $), nginx's
//!                                    of the routes    and in global- character set; anything
//!                                                     allowed-...    wrong refuses the Ingress
//!   auth-proxy-set-headers (ann.)    auth subrequest  [A-Za-z0-9_-]  nginx variables; anything
//!                                                                    wrong refuses the Ingress
//!   add-headers (ConfigMap key)      every response   HTTP token     nginx variables; a bad
//!   proxy-set-headers (ConfigMap)    every upstream   HTTP token     entry is left out (warning)
//!                                    request
//! ```
//!
//! A name the proxy owns (framing, hop-by-hop, forwarding, `Host`) is refused as for snippets.
//! A value is read into a [`HeaderSetting`] once, here: a literal is a ready `HeaderValue`
//! (no CR, LF or other control character can reach the wire), a value with variables a
//! [`Template`] the proxy expands per request with the variables of `auth-url`.

use std::collections::BTreeMap;

use http::{HeaderName, HeaderValue};

use super::snippet;
use super::variables::Template;
use crate::store::{ObjectKey, Store};

/// Which setting a ConfigMap of headers is read for: they differ in what they accept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Use {
    /// `custom-headers`: response headers of an Ingress's routes.
    CustomHeaders,
    /// `auth-proxy-set-headers`: request headers of the `auth-url` subrequest.
    AuthProxySetHeaders,
    /// The ConfigMap key `add-headers`: response headers of every route.
    AddHeaders,
    /// The ConfigMap key `proxy-set-headers`: request headers to every upstream.
    ProxySetHeaders,
}

impl Use {
    pub fn as_str(self) -> &'static str {
        match self {
            Use::CustomHeaders => "custom-headers",
            Use::AuthProxySetHeaders => "auth-proxy-set-headers",
            Use::AddHeaders => "add-headers",
            Use::ProxySetHeaders => "proxy-set-headers",
        }
    }

    fn response(self) -> bool {
        matches!(self, Use::CustomHeaders | Use::AddHeaders)
    }
}

/// One header's value: ready, removed, or made per request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HeaderSetting {
    /// Set to this value, replacing any other of the name.
    Literal(HeaderValue),
    /// Removed (nginx's empty value).
    Clear,
    /// Expanded per request; a result that is not a valid header value (a variable's bytes)
    /// leaves the header out.
    Template(Template),
}

/// The headers of one ConfigMap, in name order (a ConfigMap's keys are sorted and unique).
pub type Headers = Vec<(HeaderName, HeaderSetting)>;

/// The headers of the ConfigMaps that name them for an Ingress's routes, global and the
/// Ingress's own already overlaid (the Ingress's win): set by the snapshot builder.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ConfigHeaders {
    /// `add-headers`, then `custom-headers`.
    pub response: Headers,
    /// `proxy-set-headers`.
    pub request: Headers,
}

/// What is wrong with a ConfigMap of headers, or the reference to it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HeadersError {
    #[error("{setting}: {value:?} is not a ConfigMap reference (NAMESPACE/NAME or NAME)")]
    Reference {
        setting: &'static str,
        value: String,
    },
    #[error(
        "{setting}: ConfigMap {key} is in another namespace than the Ingress ({namespace}); as ingress-nginx without allow-cross-namespace-resources, it is not read"
    )]
    CrossNamespace {
        setting: &'static str,
        key: ObjectKey,
        namespace: String,
    },
    #[error("{setting}: ConfigMap {key} does not exist (or cannot be read)")]
    NotFound {
        setting: &'static str,
        key: ObjectKey,
    },
    #[error("{setting}: ConfigMap {key}: header {name:?}: {reason}")]
    Entry {
        setting: &'static str,
        key: ObjectKey,
        name: String,
        reason: String,
    },
}

/// Reads the value of a ConfigMap reference: `NAMESPACE/NAME`, or `NAME` in `namespace` (the
/// Ingress's). `same_namespace`: the ConfigMap must be in `namespace` (ingress-nginx's
/// default for annotations, `allow-cross-namespace-resources: false`).
pub fn reference(
    setting: Use,
    value: &str,
    namespace: &str,
    same_namespace: bool,
) -> Result<ObjectKey, HeadersError> {
    let value = value.trim();
    let bad = || HeadersError::Reference {
        setting: setting.as_str(),
        value: value.to_string(),
    };
    let valid = |s: &str| {
        !s.is_empty()
            && s.len() <= 253
            && s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
    };
    let key = match value.split_once('/') {
        Some((ns, name)) if valid(ns) && valid(name) => ObjectKey::new(ns, name),
        None if valid(value) => ObjectKey::new(namespace, value),
        _ => return Err(bad()),
    };
    if same_namespace && key.namespace != namespace {
        return Err(HeadersError::CrossNamespace {
            setting: setting.as_str(),
            key,
            namespace: namespace.to_string(),
        });
    }
    Ok(key)
}

/// The headers of ConfigMap `key` for `setting`. `allowed`: `global-allowed-response-headers`
/// (only read for `custom-headers`, where a name not in it is refused, compared exactly as
/// ingress-nginx does). Returns the headers read and the entries left out; for
/// `custom-headers` and `auth-proxy-set-headers` any entry left out is an `Err` instead
/// (ingress-nginx denies the location).
pub fn read(
    store: &Store,
    setting: Use,
    key: &ObjectKey,
    allowed: &[String],
) -> Result<(Headers, Vec<HeadersError>), HeadersError> {
    let Some(config_map) = store.config_map(key) else {
        return Err(HeadersError::NotFound {
            setting: setting.as_str(),
            key: key.clone(),
        });
    };
    let empty = BTreeMap::new();
    let data = config_map.data.as_ref().unwrap_or(&empty);
    let strict = matches!(setting, Use::CustomHeaders | Use::AuthProxySetHeaders);
    let mut headers = Vec::new();
    let mut skipped = Vec::new();
    for (name, value) in data {
        match entry(setting, name, value, allowed) {
            Ok(header) => headers.push(header),
            Err(reason) => {
                let error = HeadersError::Entry {
                    setting: setting.as_str(),
                    key: key.clone(),
                    name: name.clone(),
                    reason,
                };
                if strict {
                    return Err(error);
                }
                skipped.push(error);
            }
        }
    }
    Ok((headers, skipped))
}

/// One entry of the ConfigMap, or why it is not read.
fn entry(
    setting: Use,
    name: &str,
    value: &str,
    allowed: &[String],
) -> Result<(HeaderName, HeaderSetting), String> {
    let strict_name = matches!(setting, Use::CustomHeaders | Use::AuthProxySetHeaders);
    if strict_name
        && (name.is_empty()
            || !name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'))
    {
        return Err("not a header name (letters, digits, '-' and '_' only)".into());
    }
    let header = if setting.response() {
        snippet::response_name(name)
    } else {
        snippet::request_name(name)
    }
    .map_err(|reason| reason.to_string())?;
    if setting == Use::CustomHeaders && !allowed.iter().any(|a| a == name) {
        return Err(format!(
            "not allowed: global-allowed-response-headers lists {}",
            if allowed.is_empty() {
                "none".to_string()
            } else {
                allowed.join(", ")
            }
        ));
    }
    let setting_value = match setting {
        // ingress-nginx's value pattern for custom-headers, which it writes with every `$`
        // escaped: a literal.
        Use::CustomHeaders => {
            if value.is_empty() || !value.bytes().all(custom_value_byte) {
                return Err(format!(
                    "{value:?} is not a valid value (printable ASCII, no control characters, not empty)"
                ));
            }
            HeaderSetting::Literal(literal(value)?)
        }
        _ if value.is_empty() => HeaderSetting::Clear,
        _ => {
            let template = Template::parse(value)?;
            if template.is_literal() {
                HeaderSetting::Literal(literal(value)?)
            } else {
                // The literal parts must be valid too: only a variable's bytes can vary.
                literal(&value.replace('$', ""))?;
                HeaderSetting::Template(template)
            }
        }
    };
    Ok((header, setting_value))
}

fn literal(value: &str) -> Result<HeaderValue, String> {
    HeaderValue::from_str(value)
        .map_err(|_| format!("{value:?} is not a valid header value (control characters)"))
}

/// ingress-nginx's `valueRegexp` for custom-headers: `[a-zA-Z\d_ :;.,\\/"'?!(){}\[\]@<>=\-+*#$&`|~^%]`.
fn custom_value_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b" _:;.,\\/\"'?!(){}[]@<>=-+*#$&`|~^%".contains(&b)
}

/// `base` with `over` applied on top: a name in both takes `over`'s setting (the more
/// specific one), in `over`'s place.
pub fn overlay(
    base: &[(HeaderName, HeaderSetting)],
    over: &[(HeaderName, HeaderSetting)],
) -> Headers {
    base.iter()
        .filter(|(n, _)| !over.iter().any(|(o, _)| o == n))
        .chain(over)
        .cloned()
        .collect()
}

/// Splits headers into those known now (`None`: cleared) and those made per request.
pub fn split(
    headers: &[(HeaderName, HeaderSetting)],
) -> (
    Vec<(HeaderName, Option<HeaderValue>)>,
    Vec<(HeaderName, Template)>,
) {
    let mut literal = Vec::new();
    let mut templated = Vec::new();
    for (name, setting) in headers {
        match setting {
            HeaderSetting::Literal(v) => literal.push((name.clone(), Some(v.clone()))),
            HeaderSetting::Clear => literal.push((name.clone(), None)),
            HeaderSetting::Template(t) => templated.push((name.clone(), t.clone())),
        }
    }
    (literal, templated)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use std::sync::Arc;

    fn store(data: &[(&str, &str)]) -> Store {
        let mut store = Store::default();
        store.apply(crate::store::Object::ConfigMap(Arc::new(ConfigMap {
            metadata: ObjectMeta {
                namespace: Some("shop".into()),
                name: Some("headers".into()),
                ..Default::default()
            },
            data: Some(
                data.iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            ..Default::default()
        })));
        store
    }

    #[test]
    fn references() {
        let cases: &[(&str, bool, Result<&str, &str>)] = &[
            ("shop/headers", true, Ok("shop/headers")),
            ("headers", true, Ok("shop/headers")),
            (" shop/headers ", true, Ok("shop/headers")),
            ("other/headers", true, Err("another namespace")),
            ("other/headers", false, Ok("other/headers")),
            ("a/b/c", false, Err("not a ConfigMap reference")),
            ("", false, Err("not a ConfigMap reference")),
            ("Shop/headers", false, Err("not a ConfigMap reference")),
            ("shop/", false, Err("not a ConfigMap reference")),
        ];
        for (value, same, want) in cases {
            let got = reference(Use::CustomHeaders, value, "shop", *same)
                .map(|k| k.to_string())
                .map_err(|e| e.to_string());
            match (want, &got) {
                (Ok(want), Ok(got)) => assert_eq!(got, want, "{value:?}"),
                (Err(want), Err(got)) => assert!(got.contains(want), "{value:?}: {got}"),
                _ => panic!("{value:?}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn missing_config_map() {
        let key = ObjectKey::new("shop", "nope");
        for setting in [
            Use::CustomHeaders,
            Use::AuthProxySetHeaders,
            Use::AddHeaders,
            Use::ProxySetHeaders,
        ] {
            let err = read(&store(&[]), setting, &key, &[]).unwrap_err();
            assert!(
                matches!(err, HeadersError::NotFound { .. }),
                "{setting:?}: {err}"
            );
        }
    }

    /// (setting, entry, allowed, Ok(what is read) or Err(part of the reason)).
    #[test]
    fn entries() {
        let allowed = ["X-Custom".to_string(), "Content-Type".to_string()];
        let lit = |v: &'static str| Ok(HeaderSetting::Literal(HeaderValue::from_static(v)));
        type Case = (
            Use,
            &'static str,
            &'static str,
            Result<HeaderSetting, &'static str>,
        );
        let cases: Vec<Case> = vec![
            (Use::CustomHeaders, "X-Custom", "42", lit("42")),
            // custom-headers values are literal: ingress-nginx escapes `$`.
            (
                Use::CustomHeaders,
                "X-Custom",
                "$remote_addr",
                lit("$remote_addr"),
            ),
            (
                Use::CustomHeaders,
                "Content-Type",
                "application/json",
                lit("application/json"),
            ),
            (Use::CustomHeaders, "X-Other", "1", Err("not allowed")),
            (Use::CustomHeaders, "x-custom", "1", Err("not allowed")),
            (Use::CustomHeaders, "X-Custom", "", Err("not a valid value")),
            (
                Use::CustomHeaders,
                "X-Custom",
                "a\r\nX-Injected: 1",
                Err("not a valid value"),
            ),
            (
                Use::CustomHeaders,
                "X-Custom",
                "caf\u{e9}",
                Err("not a valid value"),
            ),
            (
                Use::CustomHeaders,
                "X Custom",
                "1",
                Err("not a header name"),
            ),
            (
                Use::CustomHeaders,
                "X-Custom:",
                "1",
                Err("not a header name"),
            ),
            (Use::AddHeaders, "X-Frame-Options", "DENY", lit("DENY")),
            (
                Use::AddHeaders,
                "X-Frame-Options",
                "",
                Ok(HeaderSetting::Clear),
            ),
            (
                Use::AddHeaders,
                "X-Client",
                "$remote_addr",
                Ok(HeaderSetting::Template(
                    Template::parse("$remote_addr").unwrap(),
                )),
            ),
            (
                Use::AddHeaders,
                "X-Client",
                "$request_time",
                Err("not a variable"),
            ),
            (
                Use::AddHeaders,
                "X-Request-Echo",
                "$request_id",
                Ok(HeaderSetting::Template(
                    Template::parse("$request_id").unwrap(),
                )),
            ),
            (Use::AddHeaders, "X-Bad", "a\nb", Err("control characters")),
            (
                Use::AddHeaders,
                "X-Bad",
                "$host\nb",
                Err("control characters"),
            ),
            (
                Use::AddHeaders,
                "Content-Length",
                "1",
                Err("set by the proxy"),
            ),
            (Use::AddHeaders, "Bad Name", "1", Err("not a valid header")),
            (Use::ProxySetHeaders, "X-Tenant", "acme", lit("acme")),
            (
                Use::ProxySetHeaders,
                "X-Tenant",
                "",
                Ok(HeaderSetting::Clear),
            ),
            (
                Use::ProxySetHeaders,
                "X-Scheme-Seen",
                "${scheme}://$host",
                Ok(HeaderSetting::Template(
                    Template::parse("${scheme}://$host").unwrap(),
                )),
            ),
            (
                Use::ProxySetHeaders,
                "Host",
                "example",
                Err("set by the proxy"),
            ),
            (
                Use::ProxySetHeaders,
                "X-Forwarded-For",
                "1.2.3.4",
                Err("set by the proxy"),
            ),
            (
                Use::AuthProxySetHeaders,
                "X-Auth-Extra",
                "$http_x_user",
                Ok(HeaderSetting::Template(
                    Template::parse("$http_x_user").unwrap(),
                )),
            ),
            (
                Use::AuthProxySetHeaders,
                "X-Auth.Extra",
                "1",
                Err("not a header name"),
            ),
        ];
        for (setting, name, value, want) in cases {
            let got = entry(setting, name, value, &allowed).map(|(_, s)| s);
            match (&want, &got) {
                (Ok(want), Ok(got)) => assert_eq!(got, want, "{setting:?} {name:?}: {value:?}"),
                (Err(want), Err(got)) => {
                    assert!(got.contains(want), "{setting:?} {name:?}: {value:?}: {got}")
                }
                _ => panic!("{setting:?} {name:?}: {value:?}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn strict_settings_refuse_what_others_leave_out() {
        let store = store(&[("X-Good", "1"), ("X-Bad", "a\u{7f}")]);
        let key = ObjectKey::new("shop", "headers");
        let allowed = ["X-Good".to_string(), "X-Bad".to_string()];
        for setting in [Use::CustomHeaders, Use::AuthProxySetHeaders] {
            assert!(
                read(&store, setting, &key, &allowed).is_err(),
                "{setting:?}"
            );
        }
        for setting in [Use::AddHeaders, Use::ProxySetHeaders] {
            let (headers, skipped) = read(&store, setting, &key, &[]).unwrap();
            assert_eq!(headers.len(), 1, "{setting:?}");
            assert_eq!(headers[0].0, "x-good");
            assert_eq!(skipped.len(), 1, "{setting:?}");
        }
    }

    #[test]
    fn overlay_prefers_the_specific() {
        let h = |n: &'static str, v: &'static str| {
            (
                HeaderName::from_static(n),
                HeaderSetting::Literal(HeaderValue::from_static(v)),
            )
        };
        let merged = overlay(
            &[h("x-a", "global"), h("x-b", "global")],
            &[h("x-b", "ingress")],
        );
        assert_eq!(merged, vec![h("x-a", "global"), h("x-b", "ingress")]);
    }
}
