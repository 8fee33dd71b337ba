//! The cluster manifests in deploy/: every document parses strictly into its k8s-openapi type,
//! `kubectl kustomize` renders the default install and each overlay, and the pieces agree with
//! the binary's defaults.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Service, ServiceAccount};
use k8s_openapi::api::networking::v1::IngressClass;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
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
    deployment: Option<Deployment>,
    service: Option<Service>,
    budget: Option<PodDisruptionBudget>,
    cluster_roles: Vec<ClusterRole>,
    roles: Vec<Role>,
    class: Option<IngressClass>,
    kinds: Vec<String>,
}

fn parse_all(docs: &[(Value, String)]) -> Parsed {
    let mut parsed = Parsed {
        daemonset: None,
        deployment: None,
        service: None,
        budget: None,
        cluster_roles: vec![],
        roles: vec![],
        class: None,
        kinds: vec![],
    };
    for (doc, origin) in docs {
        let kind = doc["kind"].as_str().unwrap_or_default().to_string();
        match kind.as_str() {
            "Namespace" => drop(strict::<Namespace>(doc, origin)),
            "ConfigMap" => drop(strict::<ConfigMap>(doc, origin)),
            "ServiceAccount" => drop(strict::<ServiceAccount>(doc, origin)),
            "ClusterRole" => parsed.cluster_roles.push(strict(doc, origin)),
            "ClusterRoleBinding" => drop(strict::<ClusterRoleBinding>(doc, origin)),
            "Role" => parsed.roles.push(strict(doc, origin)),
            "RoleBinding" => drop(strict::<RoleBinding>(doc, origin)),
            "IngressClass" => parsed.class = Some(strict(doc, origin)),
            "DaemonSet" => parsed.daemonset = Some(strict(doc, origin)),
            "Deployment" => parsed.deployment = Some(strict(doc, origin)),
            "Service" => parsed.service = Some(strict(doc, origin)),
            "PodDisruptionBudget" => parsed.budget = Some(strict(doc, origin)),
            other => panic!("{origin}: unexpected kind {other:?}"),
        }
        parsed.kinds.push(kind);
    }
    parsed
}

/// The documents of the base and of every overlay, as written (not rendered).
fn source_documents() -> Vec<(Value, String)> {
    let mut dirs = vec![deploy_dir().join("base")];
    for entry in std::fs::read_dir(deploy_dir().join("overlays")).unwrap() {
        dirs.push(entry.unwrap().path());
    }
    let mut out = Vec::new();
    for dir in dirs {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path
                .strip_prefix(deploy_dir())
                .unwrap()
                .display()
                .to_string();
            if path.extension().is_some_and(|e| e == "yaml")
                && !name.ends_with("kustomization.yaml")
            {
                for doc in documents(&std::fs::read_to_string(&path).unwrap()) {
                    out.push((doc, name.clone()));
                }
            }
        }
    }
    out
}

/// `kubectl kustomize DIR`, parsed.
fn render(dir: &Path) -> (Vec<(Value, String)>, Parsed) {
    let out = Command::new("kubectl")
        .args(["kustomize"])
        .arg(dir)
        .output()
        .expect("kubectl runs");
    assert!(
        out.status.success(),
        "kubectl kustomize {}: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let docs: Vec<(Value, String)> = documents(&text)
        .into_iter()
        .map(|d| (d, format!("rendered {}", dir.display())))
        .collect();
    let parsed = parse_all(&docs);
    (docs, parsed)
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
    // The default install is the hostNetwork overlay, exactly.
    let (default_docs, parsed) = render(&deploy_dir());
    let (overlay_docs, _) = render(&deploy_dir().join("overlays/hostnetwork"));
    let values = |docs: &[(Value, String)]| docs.iter().map(|(d, _)| d.clone()).collect::<Vec<_>>();
    assert_eq!(values(&default_docs), values(&overlay_docs));
    let ds = parsed.daemonset.expect("a DaemonSet");
    assert!(parsed.deployment.is_none() && parsed.service.is_none());
    assert_eq!(ds.metadata.namespace.as_deref(), Some("ingress"));
    let image = ds.spec.template.spec.unwrap().containers[0]
        .image
        .clone()
        .unwrap();
    assert_eq!(image, "ingress:0.1.0");
}

/// The LoadBalancer shape: a Deployment, one pod per node, behind a Service that keeps client
/// addresses (`externalTrafficPolicy: Local`), with a PodDisruptionBudget, publishing the
/// Service's address into Ingress status, in the same least-privilege container as the
/// DaemonSet.
#[test]
fn the_loadbalancer_overlay_is_a_deployment_behind_a_local_service() {
    let (_, parsed) = render(&deploy_dir().join("overlays/loadbalancer"));
    assert!(parsed.daemonset.is_none());
    let deployment = parsed.deployment.expect("a Deployment");
    let service = parsed.service.expect("a Service");
    let budget = parsed.budget.expect("a PodDisruptionBudget");
    let spec = deployment.spec;
    assert!(spec.replicas.unwrap() >= 2);
    let labels = spec.template.metadata.clone().unwrap().labels.unwrap();
    let selects = |selector: &std::collections::BTreeMap<String, String>| {
        selector.iter().all(|(k, v)| labels.get(k) == Some(v))
    };
    let service_spec = service.spec.unwrap();
    assert_eq!(service_spec.type_.as_deref(), Some("LoadBalancer"));
    assert_eq!(
        service_spec.external_traffic_policy.as_deref(),
        Some("Local")
    );
    assert!(selects(service_spec.selector.as_ref().unwrap()));
    let budget_spec = budget.spec.unwrap();
    assert!(selects(
        budget_spec.selector.unwrap().match_labels.as_ref().unwrap()
    ));
    assert!(budget_spec.max_unavailable.is_some() || budget_spec.min_available.is_some());

    let pod = spec.template.spec.unwrap();
    assert_ne!(
        pod.host_network,
        Some(true),
        "the pod's own network namespace"
    );
    let anti = pod
        .clone()
        .affinity
        .unwrap()
        .pod_anti_affinity
        .unwrap()
        .required_during_scheduling_ignored_during_execution
        .unwrap();
    assert_eq!(anti[0].topology_key, "kubernetes.io/hostname");
    assert!(selects(
        anti[0]
            .label_selector
            .as_ref()
            .unwrap()
            .match_labels
            .as_ref()
            .unwrap()
    ));
    let container = &pod.containers[0];
    let env = container.env.clone().unwrap();
    let value = |name: &str| {
        env.iter()
            .find(|e| e.name == name)
            .and_then(|e| e.value.clone())
    };
    let service_name = service.metadata.name.unwrap();
    assert_eq!(
        value("INGRESS_PUBLISH_SERVICE"),
        Some(format!("$(POD_NAMESPACE)/{service_name}"))
    );
    // $(POD_NAMESPACE) is expanded only from a variable defined before it.
    let position = |name: &str| env.iter().position(|e| e.name == name).unwrap();
    assert!(position("POD_NAMESPACE") < position("INGRESS_PUBLISH_SERVICE"));
    // Every Service port reaches a named container port.
    let ports = container.ports.clone().unwrap();
    for port in service_spec.ports.unwrap() {
        let target = port.target_port.unwrap();
        assert!(
            ports.iter().any(|p| match &target {
                k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String(name) =>
                    p.name.as_deref() == Some(name.as_str()),
                k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(n) =>
                    p.container_port == *n,
            }),
            "{target:?}"
        );
    }
    // The same container as the DaemonSet's, but for the network and the status address.
    let (_, hostnetwork) = render(&deploy_dir().join("overlays/hostnetwork"));
    let ds_pod = hostnetwork.daemonset.unwrap().spec.template.spec.unwrap();
    let ds_container = &ds_pod.containers[0];
    assert_eq!(container.security_context, ds_container.security_context);
    assert_eq!(container.image, ds_container.image);
    assert_eq!(container.readiness_probe, ds_container.readiness_probe);
    assert_eq!(container.resources, ds_container.resources);
    let pins = |pod: &k8s_openapi::api::core::v1::PodSpec| {
        pod.volumes.clone().unwrap()[0]
            .host_path
            .clone()
            .unwrap()
            .path
    };
    assert_ne!(pins(&pod), pins(&ds_pod), "the two shapes never share pins");
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
    // ConfigMaps: the global one and those of headers Ingresses name (custom-headers, ...),
    // which can be any, so read cluster-wide as ingress-nginx; never written.
    for verb in ["get", "list", "watch"] {
        assert!(allows(&rules, "", "configmaps", verb), "{verb} configmaps");
    }
    for verb in ["create", "update", "patch", "delete"] {
        assert!(!allows(&rules, "", "configmaps", verb), "{verb} configmaps");
        assert!(
            !allows(&lease_rules, "", "configmaps", verb),
            "{verb} configmaps"
        );
    }
    // The global one by name in the controller's namespace too, for --watch-namespace installs
    // (where the ClusterRole grants no ConfigMap).
    assert!(allows(&lease_rules, "", "configmaps", "watch"));
    for rule in lease_rules
        .iter()
        .filter(|r| r.resources.iter().flatten().any(|x| x == "configmaps"))
    {
        assert_eq!(
            rule.resource_names.as_deref(),
            Some(&["ingress-config".to_string()][..]),
            "{rule:?}"
        );
    }
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
    assert!(container.resources.as_ref().unwrap().requests.is_some());
}

#[test]
fn daemonset_is_least_privilege() {
    use clap::Parser;
    let defaults = ingress::cli::Cli::try_parse_from(["ingress"]).unwrap();
    let parsed = parse_all(&source_documents());
    let pod = parsed
        .daemonset
        .expect("a DaemonSet")
        .spec
        .template
        .spec
        .unwrap();
    let container = &pod.containers[0];
    // hostNetwork: a hostPort adds nothing but another way to expose the port.
    for port in container.ports.clone().unwrap() {
        assert_eq!(port.host_port, None, "{port:?}");
    }
    // The runtime's default seccomp profile (it allows bpf and perf_event_open to a container
    // granted CAP_BPF and CAP_PERFMON under containerd 1.7+ and Docker).
    let seccomp = pod
        .security_context
        .as_ref()
        .and_then(|s| s.seccomp_profile.as_ref())
        .expect("a pod seccomp profile");
    assert_eq!(seccomp.type_, "RuntimeDefault");
    let security = container.security_context.clone().unwrap();
    assert_eq!(security.run_as_non_root, Some(true));
    let uid = security.run_as_user.expect("runAsUser");
    let gid = security.run_as_group.expect("runAsGroup");
    assert_ne!(uid, 0);
    assert_eq!(security.allow_privilege_escalation, Some(false));
    assert_eq!(security.read_only_root_filesystem, Some(true));
    let caps = security.capabilities.unwrap();
    assert_eq!(caps.drop.unwrap(), ["ALL"]);
    let mut added = caps.add.unwrap();
    added.sort();
    assert_eq!(added, ["BPF", "NET_ADMIN", "NET_BIND_SERVICE", "PERFMON"]);

    // Only the gate's pin directory of the host's bpffs, at the binary's default path on the
    // host, mounted where the container's env points the binary; never all of /sys/fs/bpf,
    // and never inside /sys, where a runtime cannot create a mount point.
    let volumes = pod.volumes.clone().unwrap();
    for volume in &volumes {
        if let Some(host) = &volume.host_path {
            assert!(
                !Path::new(&defaults.run.kernel.bpf_pin_dir).starts_with(&host.path)
                    || Path::new(&host.path) == defaults.run.kernel.bpf_pin_dir,
                "{} mounts more than the pin directory",
                host.path
            );
        }
    }
    let pins = volumes
        .iter()
        .find(|v| {
            v.host_path
                .as_ref()
                .is_some_and(|h| Path::new(&h.path) == defaults.run.kernel.bpf_pin_dir)
        })
        .expect("the pin directory is mounted");
    assert_eq!(
        pins.host_path.as_ref().unwrap().type_.as_deref(),
        Some("DirectoryOrCreate")
    );
    let mount = container
        .volume_mounts
        .clone()
        .unwrap()
        .into_iter()
        .find(|m| m.name == pins.name)
        .expect("the container mounts the pin directory");
    assert!(
        !mount.mount_path.starts_with("/sys"),
        "{}",
        mount.mount_path
    );
    let env_pin_dir = container
        .env
        .clone()
        .unwrap_or_default()
        .into_iter()
        .find(|e| e.name == "INGRESS_BPF_PIN_DIR")
        .and_then(|e| e.value)
        .expect("INGRESS_BPF_PIN_DIR");
    assert_eq!(env_pin_dir, mount.mount_path);

    // The kubelet creates the directory as root: an init container with only CHOWN hands it
    // (and any maps pinned there by a root-run version) to the controller's user.
    let init = pod
        .init_containers
        .clone()
        .unwrap_or_default()
        .into_iter()
        .find(|c| {
            c.volume_mounts
                .iter()
                .flatten()
                .any(|m| m.name == pins.name && m.mount_path == env_pin_dir)
        })
        .expect("an init container that owns the pin directory");
    assert_eq!(
        init.command.clone().unwrap(),
        ["chown", "-R", &format!("{uid}:{gid}"), &env_pin_dir]
    );
    let init_security = init.security_context.unwrap();
    let init_caps = init_security.capabilities.unwrap();
    assert_eq!(init_caps.drop.unwrap(), ["ALL"]);
    assert_eq!(init_caps.add.unwrap(), ["CHOWN"]);
    assert_eq!(init_security.allow_privilege_escalation, Some(false));
}

/// `../` enough times to climb from `from` to `/`, then `to`: kustomize takes only relative
/// paths to other kustomizations.
fn relative(from: &Path, to: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for _ in from.components().skip(1) {
        out.push("..");
    }
    out.join(to.strip_prefix("/").unwrap())
}

#[test]
fn the_namespaced_component_grants_only_the_watched_namespace() {
    for overlay in ["", "overlays/loadbalancer"] {
        namespaced_component_on(overlay);
    }
}

fn namespaced_component_on(overlay: &str) {
    let scratch = ingress_tests::scratch::Scratch::new("kustomize-ns");
    let base = relative(scratch.path(), &deploy_dir());
    scratch.write(
        "kustomization.yaml",
        &format!(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - {}\ncomponents:\n  - {}\n",
            base.join(overlay).display(),
            base.join("components/namespaced").display()
        ),
    );
    let (docs, parsed) = render(scratch.path());
    let pod = match (&parsed.daemonset, &parsed.deployment) {
        (Some(ds), None) => ds.spec.template.spec.clone(),
        (None, Some(d)) => d.spec.template.spec.clone(),
        other => panic!("{overlay}: one workload, got {other:?}"),
    }
    .unwrap();
    let watched = pod.containers[0]
        .env
        .clone()
        .unwrap_or_default()
        .into_iter()
        .find(|e| e.name == "INGRESS_WATCH_NAMESPACE")
        .and_then(|e| e.value)
        .expect("INGRESS_WATCH_NAMESPACE is set");
    let resources_of = |rules: &[k8s_openapi::api::rbac::v1::PolicyRule]| -> Vec<String> {
        let mut out: Vec<String> = rules
            .iter()
            .flat_map(|r| r.resources.clone().unwrap_or_default())
            .collect();
        out.sort();
        out
    };
    let cluster: Vec<_> = parsed
        .cluster_roles
        .iter()
        .flat_map(|r| r.rules.clone().unwrap_or_default())
        .collect();
    assert_eq!(resources_of(&cluster), ["ingressclasses", "nodes"]);
    let role = parsed
        .roles
        .iter()
        .find(|r| r.metadata.namespace.as_deref() == Some(watched.as_str()))
        .expect("a Role in the watched namespace");
    let rules = role.rules.clone().unwrap_or_default();
    assert_eq!(
        resources_of(&rules),
        [
            "configmaps",
            "endpointslices",
            "events",
            "ingresses",
            "ingresses/status",
            "secrets",
            "services"
        ]
    );
    for rule in &rules {
        assert!(!rule.verbs.iter().any(|v| v.contains('*')), "{rule:?}");
    }
    let binding = docs
        .iter()
        .filter(|(d, _)| {
            d["kind"] == "RoleBinding" && d["metadata"]["namespace"] == watched.as_str()
        })
        .map(|(d, _)| strict::<RoleBinding>(d, "rendered"))
        .next()
        .expect("a RoleBinding in the watched namespace");
    assert_eq!(binding.role_ref.name, role.metadata.name.clone().unwrap());
    let subject = &binding.subjects.unwrap()[0];
    assert_eq!(
        (
            subject.kind.as_str(),
            subject.name.as_str(),
            subject.namespace.as_deref()
        ),
        ("ServiceAccount", "ingress", Some("ingress"))
    );
    if parsed.deployment.is_some() {
        // --publish-service still reads its own Service, and only that one.
        let own = parsed
            .roles
            .iter()
            .flat_map(|r| r.rules.clone().unwrap_or_default())
            .find(|rule| {
                rule.resources
                    .as_ref()
                    .is_some_and(|r| r.iter().any(|r| r == "services"))
                    && rule.resource_names.is_some()
            })
            .expect("a grant on the published Service");
        assert_eq!(own.resource_names.unwrap(), ["ingress"]);
    }
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
