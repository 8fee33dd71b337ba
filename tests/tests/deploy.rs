//! The cluster manifests in deploy/: every document parses strictly into its k8s-openapi type,
//! `kubectl kustomize deploy` renders, and the pieces agree with the binary's defaults.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::api::networking::v1::IngressClass;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use serde::Deserialize;
use serde_json::Value;

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace")
        .join("deploy")
}

fn documents(text: &str) -> Vec<Value> {
    serde_yaml_ng::Deserializer::from_str(text)
        .map(|doc| Value::deserialize(doc).expect("valid YAML"))
        .filter(|v| !v.is_null())
        .collect()
}

/// Deserializes into `T` and fails on any field `T` does not have.
fn strict<T: serde::de::DeserializeOwned + serde::Serialize>(doc: &Value, origin: &str) -> T {
    let typed: T = serde_json::from_value(doc.clone()).unwrap_or_else(|e| panic!("{origin}: {e}"));
    let mut unknown = Vec::new();
    ingress::source::manifests::unknown_fields(
        doc,
        &serde_json::to_value(&typed).unwrap(),
        String::new(),
        &mut unknown,
    );
    assert!(unknown.is_empty(), "{origin}: unknown fields {unknown:?}");
    typed
}

struct Parsed {
    daemonset: Option<DaemonSet>,
    cluster_roles: Vec<ClusterRole>,
    roles: Vec<Role>,
    class: Option<IngressClass>,
    kinds: Vec<String>,
}

fn parse_all(docs: &[(Value, String)]) -> Parsed {
    let mut parsed = Parsed {
        daemonset: None,
        cluster_roles: vec![],
        roles: vec![],
        class: None,
        kinds: vec![],
    };
    for (doc, origin) in docs {
        let kind = doc["kind"].as_str().unwrap_or_default().to_string();
        match kind.as_str() {
            "Namespace" => drop(strict::<Namespace>(doc, origin)),
            "ServiceAccount" => drop(strict::<ServiceAccount>(doc, origin)),
            "ClusterRole" => parsed.cluster_roles.push(strict(doc, origin)),
            "ClusterRoleBinding" => drop(strict::<ClusterRoleBinding>(doc, origin)),
            "Role" => parsed.roles.push(strict(doc, origin)),
            "RoleBinding" => drop(strict::<RoleBinding>(doc, origin)),
            "IngressClass" => parsed.class = Some(strict(doc, origin)),
            "DaemonSet" => parsed.daemonset = Some(strict(doc, origin)),
            other => panic!("{origin}: unexpected kind {other:?}"),
        }
        parsed.kinds.push(kind);
    }
    parsed
}

fn source_documents() -> Vec<(Value, String)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(deploy_dir()).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        if path.extension().is_some_and(|e| e == "yaml") && name != "kustomization.yaml" {
            for doc in documents(&std::fs::read_to_string(&path).unwrap()) {
                out.push((doc, name.clone()));
            }
        }
    }
    out
}

#[test]
fn every_manifest_parses_strictly() {
    let parsed = parse_all(&source_documents());
    for kind in [
        "Namespace",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "IngressClass",
        "DaemonSet",
    ] {
        assert!(
            parsed.kinds.iter().any(|k| k == kind),
            "deploy/ has a {kind}"
        );
    }
}

#[test]
fn kustomize_renders_and_the_result_parses() {
    let out = Command::new("kubectl")
        .args(["kustomize"])
        .arg(deploy_dir())
        .output()
        .expect("kubectl runs");
    assert!(
        out.status.success(),
        "kubectl kustomize: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let docs: Vec<(Value, String)> = documents(&text)
        .into_iter()
        .map(|d| (d, "rendered".to_string()))
        .collect();
    let parsed = parse_all(&docs);
    let ds = parsed.daemonset.expect("a DaemonSet");
    assert_eq!(ds.metadata.namespace.as_deref(), Some("ingress"));
    let image = ds.spec.template.spec.unwrap().containers[0]
        .image
        .clone()
        .unwrap();
    assert_eq!(image, "ingress:0.1.0");
}

#[test]
fn rbac_is_least_privilege() {
    let parsed = parse_all(&source_documents());
    let rules: Vec<_> = parsed
        .cluster_roles
        .iter()
        .chain([])
        .flat_map(|r| r.rules.clone().unwrap_or_default())
        .collect();
    let lease_rules: Vec<_> = parsed
        .roles
        .iter()
        .flat_map(|r| r.rules.clone().unwrap_or_default())
        .collect();
    for rule in rules.iter().chain(&lease_rules) {
        for list in [
            &rule.verbs,
            rule.resources.as_ref().unwrap(),
            rule.api_groups.as_ref().unwrap(),
        ] {
            assert!(
                !list.iter().any(|v| v.contains('*')),
                "no wildcards: {rule:?}"
            );
        }
        for verb in &rule.verbs {
            assert!(
                ![
                    "delete",
                    "deletecollection",
                    "escalate",
                    "bind",
                    "impersonate"
                ]
                .contains(&verb.as_str()),
                "{rule:?}"
            );
        }
    }
    let allows = |rules: &[k8s_openapi::api::rbac::v1::PolicyRule],
                  group: &str,
                  resource: &str,
                  verb: &str| {
        rules.iter().any(|r| {
            r.api_groups.iter().flatten().any(|g| g == group)
                && r.resources.iter().flatten().any(|x| x == resource)
                && r.verbs.iter().any(|v| v == verb)
        })
    };
    for (group, resource) in [
        ("networking.k8s.io", "ingresses"),
        ("networking.k8s.io", "ingressclasses"),
        ("", "services"),
        ("discovery.k8s.io", "endpointslices"),
        ("", "secrets"),
    ] {
        for verb in ["list", "watch"] {
            assert!(allows(&rules, group, resource, verb), "{verb} {resource}");
        }
    }
    assert!(allows(
        &rules,
        "networking.k8s.io",
        "ingresses/status",
        "update"
    ));
    assert!(
        !allows(&rules, "networking.k8s.io", "ingresses", "update"),
        "only the status subresource is written"
    );
    assert!(
        allows(&rules, "events.k8s.io", "events", "create")
            && allows(&rules, "events.k8s.io", "events", "patch")
    );
    assert!(allows(
        &lease_rules,
        "coordination.k8s.io",
        "leases",
        "update"
    ));
    assert!(
        !allows(&rules, "coordination.k8s.io", "leases", "update"),
        "Leases are granted in the controller's namespace only"
    );
}

#[test]
fn daemonset_fits_the_controller() {
    let parsed = parse_all(&source_documents());
    let ds = parsed.daemonset.expect("a DaemonSet");
    let spec = ds.spec;
    assert_eq!(
        spec.update_strategy.unwrap().type_.as_deref(),
        Some("RollingUpdate")
    );
    let pod = spec.template.spec.unwrap();
    assert_eq!(pod.host_network, Some(true));
    assert_eq!(pod.dns_policy.as_deref(), Some("ClusterFirstWithHostNet"));
    let container = &pod.containers[0];
    let env = container.env.clone().unwrap_or_default();
    let node_name = env
        .iter()
        .find(|e| e.name == "NODE_NAME")
        .expect("NODE_NAME");
    assert_eq!(
        node_name
            .value_from
            .as_ref()
            .unwrap()
            .field_ref
            .as_ref()
            .unwrap()
            .field_path,
        "spec.nodeName"
    );
    let drain = env
        .iter()
        .find(|e| e.name == "INGRESS_DRAIN_TIMEOUT")
        .and_then(|e| e.value.clone())
        .unwrap();
    let drain = humantime_secs(&drain);
    assert!(
        pod.termination_grace_period_seconds.unwrap() > drain,
        "grace period covers the drain"
    );
    let security = container.security_context.clone().unwrap();
    assert_eq!(security.privileged, Some(false));
    let caps = security.capabilities.unwrap().add.unwrap();
    for cap in ["BPF", "NET_ADMIN", "PERFMON", "NET_BIND_SERVICE"] {
        assert!(caps.iter().any(|c| c == cap), "{cap}");
    }
    let admin_port = 10254;
    let probe_port = |p: &k8s_openapi::api::core::v1::Probe| p.http_get.clone().unwrap().port;
    let ports = container.ports.clone().unwrap();
    let admin = ports
        .iter()
        .find(|p| p.container_port == admin_port)
        .expect("admin port");
    for probe in [
        container.readiness_probe.as_ref().unwrap(),
        container.liveness_probe.as_ref().unwrap(),
    ] {
        assert_eq!(
            probe_port(probe),
            k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String(
                admin.name.clone().unwrap()
            )
        );
    }
    let mounts = container.volume_mounts.clone().unwrap();
    assert!(
        mounts.iter().any(|m| m.mount_path == "/sys/fs/bpf"),
        "bpffs is mounted"
    );
    assert!(container.resources.as_ref().unwrap().requests.is_some());
}

fn humantime_secs(s: &str) -> i64 {
    s.trim_end_matches('s').parse().expect("seconds")
}

#[test]
fn ingress_class_matches_the_binary_default() {
    use clap::Parser;
    let defaults = ingress::cli::Cli::try_parse_from(["ingress"]).unwrap();
    let parsed = parse_all(&source_documents());
    let class = parsed.class.expect("an IngressClass");
    assert_eq!(
        class.spec.unwrap().controller.unwrap(),
        defaults.run.source.controller_class
    );
    assert_eq!(
        class.metadata.name.unwrap(),
        defaults.run.source.ingress_class
    );
}

#[test]
fn bundled_examples_check_clean() {
    let out = Command::new(ingress_tests::process::binary())
        .args(["check", "--manifests"])
        .arg(deploy_dir().join("examples"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}
