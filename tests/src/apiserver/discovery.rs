//! Discovery documents, generated from the resource table: `/version`, `/api`, `/apis`,
//! `/apis/<group>`, `/api/v1`, `/apis/<group>/<version>`, and the aggregated
//! `apidiscovery.k8s.io/v2` form kubectl asks for first.

use serde_json::{Value, json};

use super::RESOURCES;
use super::resource::ResourceDef;

/// The default reported minor version (of Kubernetes 1.x): within kubectl's supported skew
/// of the system kubectl (1.32) and of the k8s-openapi `latest` types.
pub const DEFAULT_MINOR: u16 = 33;

const VERBS: [&str; 8] = [
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];
const STATUS_VERBS: [&str; 3] = ["get", "patch", "update"];

/// The media type of aggregated discovery responses.
pub const AGGREGATED_V2: &str =
    "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";

pub fn version(minor: u16) -> Value {
    json!({
        "major": "1",
        "minor": minor.to_string(),
        "gitVersion": format!("v1.{minor}.0"),
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2025-01-01T00:00:00Z",
        "goVersion": "go1.24.0",
        "compiler": "gc",
        "platform": "linux/amd64",
    })
}

/// Groups in table order, the core group ("") excluded, each once.
fn named_groups() -> Vec<&'static str> {
    let mut groups: Vec<&'static str> = Vec::new();
    for def in RESOURCES.iter().filter(|d| !d.group.is_empty()) {
        if !groups.contains(&def.group) {
            groups.push(def.group);
        }
    }
    groups
}

fn versions_of(group: &str) -> Vec<&'static str> {
    let mut versions: Vec<&'static str> = Vec::new();
    for def in RESOURCES.iter().filter(|d| d.group == group) {
        if !versions.contains(&def.version) {
            versions.push(def.version);
        }
    }
    versions
}

pub fn core_versions(server_address: &str) -> Value {
    json!({
        "kind": "APIVersions",
        "versions": versions_of(""),
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}],
    })
}

fn api_group(group: &str) -> Value {
    let versions: Vec<Value> = versions_of(group)
        .iter()
        .map(|v| json!({"groupVersion": format!("{group}/{v}"), "version": v}))
        .collect();
    let preferred = versions.first().cloned().unwrap_or_else(|| json!({}));
    json!({"name": group, "versions": versions, "preferredVersion": preferred})
}

pub fn group(group: &str) -> Option<Value> {
    if group.is_empty() || !named_groups().contains(&group) {
        return None;
    }
    let mut doc = api_group(group);
    doc["kind"] = json!("APIGroup");
    doc["apiVersion"] = json!("v1");
    Some(doc)
}

pub fn groups() -> Value {
    let groups: Vec<Value> = named_groups().iter().map(|g| api_group(g)).collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

fn served(group: &str, version: &str) -> impl Iterator<Item = &'static ResourceDef> {
    RESOURCES
        .iter()
        .filter(move |d| d.group == group && d.version == version)
}

pub fn resources(group: &str, version: &str) -> Option<Value> {
    let mut list = Vec::new();
    for def in served(group, version) {
        let mut entry = json!({
            "name": def.resource,
            "singularName": def.singular(),
            "namespaced": def.namespaced,
            "kind": def.kind,
            "verbs": VERBS,
        });
        if !def.short_names.is_empty() {
            entry["shortNames"] = json!(def.short_names);
        }
        if !def.categories.is_empty() {
            entry["categories"] = json!(def.categories);
        }
        list.push(entry);
        if def.status_subresource {
            list.push(json!({
                "name": format!("{}/status", def.resource),
                "singularName": "",
                "namespaced": def.namespaced,
                "kind": def.kind,
                "verbs": STATUS_VERBS,
            }));
        }
    }
    if list.is_empty() {
        return None;
    }
    let group_version = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    Some(
        json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version, "resources": list}),
    )
}

fn discovery_resource(def: &ResourceDef) -> Value {
    let mut entry = json!({
        "resource": def.resource,
        "responseKind": {"group": def.group, "version": def.version, "kind": def.kind},
        "scope": if def.namespaced { "Namespaced" } else { "Cluster" },
        "singularResource": def.singular(),
        "verbs": VERBS,
    });
    if !def.short_names.is_empty() {
        entry["shortNames"] = json!(def.short_names);
    }
    if !def.categories.is_empty() {
        entry["categories"] = json!(def.categories);
    }
    if def.status_subresource {
        entry["subresources"] = json!([{
            "subresource": "status",
            "responseKind": {"group": def.group, "version": def.version, "kind": def.kind},
            "verbs": STATUS_VERBS,
        }]);
    }
    entry
}

fn discovery_group(group: &str) -> Value {
    let versions: Vec<Value> = versions_of(group)
        .iter()
        .map(|version| {
            let resources: Vec<Value> = served(group, version).map(discovery_resource).collect();
            json!({"version": version, "resources": resources, "freshness": "Current"})
        })
        .collect();
    json!({"metadata": {"name": group, "creationTimestamp": null}, "versions": versions})
}

/// Aggregated discovery for `/api` (`core == true`) or `/apis`.
pub fn aggregated(core: bool) -> Value {
    let items: Vec<Value> = if core {
        vec![discovery_group("")]
    } else {
        named_groups().iter().map(|g| discovery_group(g)).collect()
    };
    json!({"kind": "APIGroupDiscoveryList", "apiVersion": "apidiscovery.k8s.io/v2", "metadata": {}, "items": items})
}

/// Whether an Accept header asks for aggregated discovery v2 (clients list it first and
/// fall back to the plain documents if the response is not of that type).
pub fn wants_aggregated(accept: Option<&str>) -> bool {
    accept.is_some_and(|accept| {
        accept.split(',').any(|media| {
            let params: Vec<&str> = media.split(';').map(str::trim).collect();
            params.contains(&"g=apidiscovery.k8s.io")
                && params.contains(&"v=v2")
                && params.contains(&"as=APIGroupDiscoveryList")
        })
    })
}

/// `/openapi/v3`: where each group-version's document lives.
pub fn openapi_v3_index() -> Value {
    let mut paths = serde_json::Map::new();
    let mut seen = Vec::new();
    for def in RESOURCES {
        if seen.contains(&(def.group, def.version)) {
            continue;
        }
        seen.push((def.group, def.version));
        let path = gv_path(def.group, def.version);
        paths.insert(
            path.clone(),
            json!({"serverRelativeURL": format!("/openapi/v3/{path}")}),
        );
    }
    json!({"paths": paths})
}

fn gv_path(group: &str, version: &str) -> String {
    if group.is_empty() {
        format!("api/{version}")
    } else {
        format!("apis/{group}/{version}")
    }
}

/// A group-version's OpenAPI v3 document with operations but no schemas. kubectl reads it
/// only to learn that PATCH/POST/PUT accept `fieldValidation`, and then lets the server
/// validate (which the schema check in `objects.rs` does).
pub fn openapi_v3(group: &str, version: &str) -> Option<Value> {
    let mut paths = serde_json::Map::new();
    for def in served(group, version) {
        let gvk = json!({"group": def.group, "version": def.version, "kind": def.kind});
        let query = |name: &str| json!({"name": name, "in": "query", "schema": {"type": "string"}, "uniqueItems": true});
        let write_params = json!([
            query("dryRun"),
            query("fieldManager"),
            query("fieldValidation")
        ]);
        let mut patch_params = write_params.clone();
        if let Some(list) = patch_params.as_array_mut() {
            list.push(query("force"));
        }
        let operation = |verb: &str, params: &Value| {
            json!({
                "operationId": format!("{verb}{}", def.kind),
                "parameters": params,
                "responses": {"200": {"description": "OK"}},
                "x-kubernetes-action": verb,
                "x-kubernetes-group-version-kind": gvk,
            })
        };
        let base = format!("/{}", gv_path(def.group, def.version));
        let collection = if def.namespaced {
            format!("{base}/namespaces/{{namespace}}/{}", def.resource)
        } else {
            format!("{base}/{}", def.resource)
        };
        paths.insert(
            collection.clone(),
            json!({"get": operation("list", &json!([])), "post": operation("post", &write_params)}),
        );
        paths.insert(
            format!("{collection}/{{name}}"),
            json!({
                "get": operation("get", &json!([])),
                "put": operation("put", &write_params),
                "patch": operation("patch", &patch_params),
                "delete": operation("delete", &json!([query("dryRun")])),
            }),
        );
    }
    if paths.is_empty() {
        return None;
    }
    Some(json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1"},
        "paths": paths,
        "components": {"schemas": {}},
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_table_row_is_discoverable() {
        for def in RESOURCES {
            let doc = resources(def.group, def.version).unwrap();
            let entry = doc["resources"]
                .as_array()
                .unwrap()
                .iter()
                .find(|r| r["name"] == def.resource)
                .unwrap();
            assert_eq!(entry["kind"], def.kind);
            assert_eq!(entry["namespaced"], def.namespaced);
            let agg = aggregated(def.group.is_empty());
            let group = agg["items"]
                .as_array()
                .unwrap()
                .iter()
                .find(|g| g["metadata"]["name"] == def.group)
                .unwrap();
            assert!(
                group["versions"][0]["resources"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|r| r["resource"] == def.resource)
            );
        }
        assert!(resources("", "v2").is_none());
        assert!(group("").is_none());
        assert_eq!(
            group("networking.k8s.io").unwrap()["preferredVersion"]["version"],
            "v1"
        );
    }

    #[test]
    fn ingress_discovery_has_short_names_and_status() {
        let doc = resources("networking.k8s.io", "v1").unwrap();
        let names: Vec<&str> = doc["resources"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["ingresses", "ingresses/status", "ingressclasses"]);
        assert_eq!(doc["resources"][0]["shortNames"], json!(["ing"]));
    }

    #[test]
    fn openapi_v3_says_patch_takes_field_validation() {
        let index = openapi_v3_index();
        assert_eq!(
            index["paths"]["apis/networking.k8s.io/v1"]["serverRelativeURL"],
            "/openapi/v3/apis/networking.k8s.io/v1"
        );
        let doc = openapi_v3("networking.k8s.io", "v1").unwrap();
        let patch = &doc["paths"]["/apis/networking.k8s.io/v1/namespaces/{namespace}/ingresses/{name}"]
            ["patch"];
        assert_eq!(patch["x-kubernetes-group-version-kind"]["kind"], "Ingress");
        assert!(
            patch["parameters"]
                .as_array()
                .unwrap()
                .iter()
                .any(|p| p["name"] == "fieldValidation" && p["in"] == "query")
        );
        assert!(openapi_v3("nope", "v1").is_none());
    }

    #[test]
    fn aggregated_accept_headers() {
        let kubectl = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json";
        assert!(wants_aggregated(Some(kubectl)));
        assert!(!wants_aggregated(Some("application/json")));
        assert!(!wants_aggregated(Some(
            "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList"
        )));
        assert!(!wants_aggregated(None));
    }
}
