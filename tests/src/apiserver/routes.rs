//! URL parsing: which endpoint a path names, and the query parameters the server honours.

use super::objects::Part;
use super::resource::ResourceDef;
use super::status::{ApiError, Result};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    Version,
    Health,
    /// `/api`
    CoreVersions,
    /// `/apis`
    Groups,
    /// `/apis/<group>`
    Group(String),
    /// `/api/v1`, `/apis/<group>/<version>`
    Resources {
        group: String,
        version: String,
    },
    OpenApiV2,
    /// `/openapi/v3`
    OpenApiV3Index,
    /// `/openapi/v3/api/v1`, `/openapi/v3/apis/<group>/<version>`
    OpenApiV3 {
        group: String,
        version: String,
    },
    Object(ObjectPath),
}

/// A collection or an object (or its status) of one resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectPath {
    pub def: &'static ResourceDef,
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub part: Part,
    /// The deprecated `/watch/` path prefix form.
    pub watch_prefix: bool,
}

pub fn parse_path(path: &str) -> Result<Route> {
    let trimmed = path.strip_prefix('/').unwrap_or(path);
    let trimmed = trimmed.strip_suffix('/').unwrap_or(trimmed);
    let segments: Vec<&str> = if trimmed.is_empty() {
        Vec::new()
    } else {
        trimmed.split('/').collect()
    };
    if segments.iter().any(|s| s.is_empty()) {
        return Err(ApiError::UnknownPath);
    }
    match segments.as_slice() {
        ["version"] => Ok(Route::Version),
        ["healthz" | "livez" | "readyz", ..] => Ok(Route::Health),
        ["api"] => Ok(Route::CoreVersions),
        ["apis"] => Ok(Route::Groups),
        ["apis", group] => Ok(Route::Group(group.to_string())),
        ["api", version] => Ok(Route::Resources {
            group: String::new(),
            version: version.to_string(),
        }),
        ["apis", group, version] => Ok(Route::Resources {
            group: group.to_string(),
            version: version.to_string(),
        }),
        ["openapi", "v2"] => Ok(Route::OpenApiV2),
        ["openapi", "v3"] => Ok(Route::OpenApiV3Index),
        ["openapi", "v3", "api", version] => Ok(Route::OpenApiV3 {
            group: String::new(),
            version: version.to_string(),
        }),
        ["openapi", "v3", "apis", group, version] => Ok(Route::OpenApiV3 {
            group: group.to_string(),
            version: version.to_string(),
        }),
        ["api", version, rest @ ..] => object_path("", version, rest).map(Route::Object),
        ["apis", group, version, rest @ ..] => object_path(group, version, rest).map(Route::Object),
        _ => Err(ApiError::UnknownPath),
    }
}

fn object_path(group: &str, version: &str, rest: &[&str]) -> Result<ObjectPath> {
    let (watch_prefix, rest) = match rest {
        ["watch", rest @ ..] => (true, rest),
        _ => (false, rest),
    };
    let namespaced = |name: &str| super::resource(group, version, name).filter(|d| d.namespaced);
    let (def, namespace, tail) = match rest {
        ["namespaces", ns, resource, tail @ ..] if namespaced(resource).is_some() => {
            (namespaced(resource), Some(ns.to_string()), tail)
        }
        [resource, tail @ ..] => (super::resource(group, version, resource), None, tail),
        [] => (None, None, rest),
    };
    let def = def.ok_or(ApiError::UnknownPath)?;
    let (name, part) = match tail {
        [] => (None, Part::Main),
        [name] => (Some(name.to_string()), Part::Main),
        [name, "status"] if def.status_subresource => (Some(name.to_string()), Part::Status),
        _ => return Err(ApiError::UnknownPath),
    };
    // A namespaced resource's object always needs its namespace in the path.
    if def.namespaced && namespace.is_none() && name.is_some() {
        return Err(ApiError::UnknownPath);
    }
    Ok(ObjectPath {
        def,
        namespace,
        name,
        part,
        watch_prefix,
    })
}

/// The query parameters the server acts on; the rest are ignored, as unknown ones are by
/// kube-apiserver's decoder.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Query {
    pub watch: bool,
    pub resource_version: Option<String>,
    pub resource_version_match: Option<String>,
    pub label_selector: Option<String>,
    pub field_selector: Option<String>,
    pub timeout_seconds: Option<u64>,
    pub allow_watch_bookmarks: bool,
    pub send_initial_events: Option<bool>,
    pub field_manager: Option<String>,
    pub force: bool,
    pub dry_run: bool,
    pub field_validation: Option<String>,
    pub include_object: Option<String>,
}

fn parse_bool(key: &str, value: &str) -> Result<bool> {
    match value {
        "true" | "True" | "1" => Ok(true),
        "false" | "False" | "0" | "" => Ok(false),
        _ => Err(ApiError::BadRequest(format!(
            "invalid boolean value {value:?} for {key}"
        ))),
    }
}

pub fn parse_query(query: &str) -> Result<Query> {
    let mut q = Query::default();
    for (key, value) in form_urlencoded::parse(query.as_bytes()) {
        let value = value.into_owned();
        match key.as_ref() {
            "watch" => q.watch = parse_bool("watch", &value)?,
            "resourceVersion" => q.resource_version = Some(value),
            "resourceVersionMatch" => q.resource_version_match = Some(value),
            "labelSelector" => q.label_selector = Some(value),
            "fieldSelector" => q.field_selector = Some(value),
            "timeoutSeconds" => {
                q.timeout_seconds = Some(value.parse().map_err(|_| {
                    ApiError::BadRequest(format!("invalid value {value:?} for timeoutSeconds"))
                })?);
            }
            "allowWatchBookmarks" => {
                q.allow_watch_bookmarks = parse_bool("allowWatchBookmarks", &value)?
            }
            "sendInitialEvents" => {
                q.send_initial_events = Some(parse_bool("sendInitialEvents", &value)?)
            }
            "fieldManager" => q.field_manager = Some(value),
            "force" => q.force = parse_bool("force", &value)?,
            "dryRun" => {
                q.dry_run = match value.as_str() {
                    "All" => true,
                    "" => false,
                    other => {
                        return Err(ApiError::BadRequest(format!(
                            "dryRun: Unsupported value: {other:?}: supported values: \"All\""
                        )));
                    }
                }
            }
            "fieldValidation" => q.field_validation = Some(value),
            "includeObject" => q.include_object = Some(value),
            _ => {}
        }
    }
    Ok(q)
}

/// A resourceVersion query value: None for unset or "0" (both mean "any"), else the number.
pub fn parse_resource_version(value: Option<&str>) -> Result<Option<u64>> {
    match value {
        None | Some("") | Some("0") => Ok(None),
        Some(v) => v.parse::<u64>().map(Some).map_err(|_| {
            ApiError::BadRequest(format!(
                "resourceVersion: Invalid value: {v:?}: must be a non-negative integer"
            ))
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(path: &str) -> ObjectPath {
        match parse_path(path) {
            Ok(Route::Object(o)) => o,
            other => panic!("{path}: {other:?}"),
        }
    }

    #[test]
    fn object_paths() {
        // path, resource, namespace, name, part, /watch/ prefix
        type Case = (
            &'static str,
            &'static str,
            Option<&'static str>,
            Option<&'static str>,
            Part,
            bool,
        );
        #[rustfmt::skip]
        let cases: [Case; 9] = [
            ("/api/v1/services", "services", None, None, Part::Main, false),
            ("/api/v1/namespaces/prod/services", "services", Some("prod"), None, Part::Main, false),
            ("/api/v1/namespaces/prod/services/web", "services", Some("prod"), Some("web"), Part::Main, false),
            ("/api/v1/namespaces/prod/services/web/status", "services", Some("prod"), Some("web"), Part::Status, false),
            ("/api/v1/namespaces", "namespaces", None, None, Part::Main, false),
            ("/api/v1/namespaces/prod", "namespaces", None, Some("prod"), Part::Main, false),
            ("/api/v1/namespaces/prod/status", "namespaces", None, Some("prod"), Part::Status, false),
            ("/apis/networking.k8s.io/v1/watch/namespaces/a/ingresses", "ingresses", Some("a"), None, Part::Main, true),
            ("/apis/networking.k8s.io/v1/ingressclasses/nginx", "ingressclasses", None, Some("nginx"), Part::Main, false),
        ];
        for (path, resource, ns, name, part, watch) in cases {
            let o = object(path);
            assert_eq!(
                (
                    o.def.resource,
                    o.namespace.as_deref(),
                    o.name.as_deref(),
                    o.part,
                    o.watch_prefix
                ),
                (resource, ns, name, part, watch),
                "{path}"
            );
        }
    }

    #[test]
    fn unknown_paths_are_404s() {
        for path in [
            "/",
            "/api/v1/pods",
            "/api/v2/services",
            "/apis/networking.k8s.io/v1/namespaces/a/ingresses/web/scale",
            "/api/v1/namespaces/a/secrets/web/status",
            "/api/v1/services/web",
            "/api/v1/namespaces/a/services/web/status/extra",
            "/api//v1",
            "/apis/networking.k8s.io/v1/namespaces/a/ingresses/a/b/c",
        ] {
            let err = parse_path(path).unwrap_err();
            assert_eq!(err.code(), 404, "{path}");
        }
    }

    #[test]
    fn discovery_paths() {
        assert_eq!(parse_path("/api").unwrap(), Route::CoreVersions);
        assert_eq!(parse_path("/apis/").unwrap(), Route::Groups);
        assert_eq!(
            parse_path("/apis/events.k8s.io/v1").unwrap(),
            Route::Resources {
                group: "events.k8s.io".into(),
                version: "v1".into()
            }
        );
        assert_eq!(
            parse_path("/openapi/v3/apis/networking.k8s.io/v1").unwrap(),
            Route::OpenApiV3 {
                group: "networking.k8s.io".into(),
                version: "v1".into()
            }
        );
    }

    #[test]
    fn queries() {
        let q = parse_query(
            "watch=1&resourceVersion=12&allowWatchBookmarks=true&timeoutSeconds=290&fieldSelector=type%3Dkubernetes.io%2Ftls&labelSelector=app+in+(a,b)&dryRun=All&force=true&unknown=x",
        )
        .unwrap();
        assert!(q.watch && q.allow_watch_bookmarks && q.dry_run && q.force);
        assert_eq!(q.resource_version.as_deref(), Some("12"));
        assert_eq!(q.timeout_seconds, Some(290));
        assert_eq!(q.field_selector.as_deref(), Some("type=kubernetes.io/tls"));
        assert_eq!(q.label_selector.as_deref(), Some("app in (a,b)"));
        for bad in [
            "watch=maybe",
            "timeoutSeconds=-1",
            "dryRun=Some",
            "force=yes",
        ] {
            assert_eq!(parse_query(bad).unwrap_err().code(), 400, "{bad}");
        }
        assert_eq!(parse_resource_version(Some("0")).unwrap(), None);
        assert_eq!(parse_resource_version(Some("42")).unwrap(), Some(42));
        assert!(parse_resource_version(Some("x")).is_err());
    }
}
