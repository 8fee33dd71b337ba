//! The test API server against real clients: the system kubectl, kube-rs 5 (Api, watcher,
//! reflector, event Recorder) and raw HTTP for wire-format details and hostile input.

// Setup helpers panic with context: a failed step is a failed test, with its backtrace.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Output;
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::rt::TokioExecutor;
use ingress_tests::apiserver::{RestartOptions, ServerOptions, TestApiServer};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Event as CoreEvent, Secret, Service};
use k8s_openapi::api::networking::v1::Ingress;
use kube::api::{
    Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::runtime::events::{Event as RecorderEvent, EventType, Recorder, Reporter};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Resource, ResourceExt};
use serde_json::{Value, json};

const TIMEOUT: Duration = Duration::from_secs(20);

async fn start() -> TestApiServer {
    TestApiServer::start_with(ServerOptions {
        bookmark_interval: Duration::from_millis(200),
        ..ServerOptions::default()
    })
    .await
    .expect("test API server starts")
}

/// Polls `check` until it holds, panicking with `what` after [`TIMEOUT`].
async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    while !check() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn ingress(namespace: &str, name: &str, host: &str) -> Ingress {
    serde_json::from_value(json!({
        "apiVersion": "networking.k8s.io/v1",
        "kind": "Ingress",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app": name}},
        "spec": {
            "ingressClassName": "ours",
            "rules": [{"host": host, "http": {"paths": [{"path": "/", "pathType": "Prefix",
                "backend": {"service": {"name": "web", "port": {"number": 80}}}}]}}],
        },
    }))
    .expect("valid ingress")
}

fn secret(name: &str, type_: &str, labels: Value) -> Secret {
    serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "labels": labels},
        "type": type_,
        "data": {"tls.crt": "Y2VydA==", "tls.key": "a2V5"},
    }))
    .expect("valid secret")
}

fn api_status(err: &kube::Error) -> (u16, String) {
    match err {
        kube::Error::Api(status) => (status.code, status.reason.clone()),
        other => panic!("expected an API error, got {other:?}"),
    }
}

// ---- kubectl --------------------------------------------------------------------------------

/// The system kubectl, pointed at a server through a kubeconfig file, with its own
/// discovery cache so runs never share state.
struct Kubectl {
    dir: tempfile::TempDir,
}

impl Kubectl {
    fn new(server: &TestApiServer) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        server
            .write_kubeconfig(&dir.path().join("kubeconfig"))
            .expect("kubeconfig written");
        Self { dir }
    }

    fn file(&self, name: &str, contents: &str) -> PathBuf {
        let path = self.dir.path().join(name);
        std::fs::write(&path, contents).expect("manifest written");
        path
    }

    async fn run(&self, args: &[&str]) -> Output {
        let kubeconfig = self.dir.path().join("kubeconfig");
        let cache = self.dir.path().join("cache");
        let mut command = tokio::process::Command::new("kubectl");
        command
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .arg("--cache-dir")
            .arg(&cache)
            .args(args)
            .kill_on_drop(true);
        tokio::time::timeout(Duration::from_secs(60), command.output())
            .await
            .unwrap_or_else(|_| panic!("kubectl {args:?} timed out"))
            .expect("kubectl runs")
    }

    /// Runs kubectl, asserts success, returns stdout.
    async fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args).await;
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "kubectl {args:?} failed: {stderr}\n{stdout}"
        );
        stdout
    }

    /// Runs kubectl, asserts failure, returns stderr.
    async fn fails(&self, args: &[&str]) -> String {
        let out = self.run(args).await;
        assert!(
            !out.status.success(),
            "kubectl {args:?} unexpectedly succeeded: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        String::from_utf8_lossy(&out.stderr).into_owned()
    }
}

const WEB_MANIFEST: &str = r#"
apiVersion: v1
kind: Service
metadata:
  name: web
  namespace: prod
spec:
  selector:
    app: web
  ports:
  - port: 80
    targetPort: 8080
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: web
  namespace: prod
  labels:
    app: web
spec:
  ingressClassName: ours
  rules:
  - host: web.example.com
    http:
      paths:
      - path: /
        pathType: Prefix
        backend:
          service:
            name: web
            port:
              number: 80
"#;

const APPLIED_MANIFEST: &str = r#"
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: applied
  namespace: prod
  annotations:
    team: edge
spec:
  ingressClassName: ours
  rules:
  - host: applied.example.com
    http:
      paths:
      - path: /
        pathType: Prefix
        backend:
          service:
            name: web
            port:
              number: 80
"#;

/// Lines of a `kubectl get` table, split into cells.
fn rows(table: &str) -> Vec<Vec<String>> {
    table
        .lines()
        .map(|l| l.split_whitespace().map(str::to_string).collect())
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn kubectl_creates_gets_and_applies() {
    let server = start().await;
    let kubectl = Kubectl::new(&server);

    let version = kubectl.ok(&["version"]).await;
    assert!(version.contains("Server Version: v1.33.0"), "{version}");

    let manifest = kubectl.file("web.yaml", WEB_MANIFEST);
    let created = kubectl
        .ok(&["create", "-f", manifest.to_str().unwrap()])
        .await;
    assert!(created.contains("service/web created"), "{created}");
    assert!(
        created.contains("ingress.networking.k8s.io/web created"),
        "{created}"
    );
    // kubectl asked for strict server-side validation, having read /openapi/v3.
    let posts = server.requests().matching(|r| r.method == "POST");
    assert!(
        posts
            .iter()
            .all(|r| r.param("fieldValidation").as_deref() == Some("Strict")),
        "{posts:?}"
    );
    assert!(
        posts
            .iter()
            .all(|r| r.param("fieldManager").as_deref() == Some("kubectl-create")),
        "{posts:?}"
    );

    let again = kubectl
        .fails(&["create", "-f", manifest.to_str().unwrap()])
        .await;
    assert!(again.contains("services \"web\" already exists"), "{again}");

    let table = kubectl.ok(&["get", "ingress", "-A"]).await;
    let table = rows(&table);
    assert_eq!(
        table[0],
        [
            "NAMESPACE",
            "NAME",
            "CLASS",
            "HOSTS",
            "ADDRESS",
            "PORTS",
            "AGE"
        ]
    );
    // ADDRESS is empty until the status says otherwise.
    assert_eq!(
        table[1][..5],
        ["prod", "web", "ours", "web.example.com", "80"]
    );
    // kubectl read aggregated discovery from /api and /apis, not the per-group documents.
    let aggregated = server.requests().matching(|r| {
        r.path == "/apis"
            && r.accept
                .as_deref()
                .is_some_and(|a| a.contains("as=APIGroupDiscoveryList"))
    });
    assert!(!aggregated.is_empty());
    assert!(
        server
            .requests()
            .matching(|r| r.path == "/api/v1" || r.path == "/apis/networking.k8s.io/v1")
            .is_empty()
    );
    let services = kubectl.ok(&["get", "svc", "-n", "prod"]).await;
    assert!(
        rows(&services)[1].starts_with(&["web".into(), "ClusterIP".into()]),
        "{services}"
    );

    let yaml = kubectl
        .ok(&["get", "ingress", "web", "-n", "prod", "-o", "yaml"])
        .await;
    let object: Value = serde_yaml_ng::from_str(&yaml).expect("kubectl printed YAML");
    assert_eq!(object["spec"]["rules"][0]["host"], "web.example.com");
    assert_eq!(object["metadata"]["generation"], 1);
    assert_eq!(object["metadata"]["uid"].as_str().map(str::len), Some(36));
    assert!(
        object["metadata"].get("managedFields").is_none(),
        "kubectl hides managedFields"
    );

    // Server-side apply: create, then update (host changed, annotation dropped).
    let applied = kubectl.file("applied.yaml", APPLIED_MANIFEST);
    let out = kubectl
        .ok(&["apply", "--server-side", "-f", applied.to_str().unwrap()])
        .await;
    assert!(
        out.contains("ingress.networking.k8s.io/applied serverside-applied"),
        "{out}"
    );
    let second = APPLIED_MANIFEST
        .replace("applied.example.com", "v2.example.com")
        .replace("  annotations:\n    team: edge\n", "");
    let applied2 = kubectl.file("applied2.yaml", &second);
    kubectl
        .ok(&["apply", "--server-side", "-f", applied2.to_str().unwrap()])
        .await;
    let yaml = kubectl
        .ok(&[
            "get",
            "ingress",
            "applied",
            "-n",
            "prod",
            "-o",
            "yaml",
            "--show-managed-fields",
        ])
        .await;
    let object: Value = serde_yaml_ng::from_str(&yaml).expect("kubectl printed YAML");
    assert_eq!(object["spec"]["rules"][0]["host"], "v2.example.com");
    assert!(
        object["metadata"].get("annotations").is_none(),
        "dropped field stays: {yaml}"
    );
    assert_eq!(object["metadata"]["generation"], 2);
    assert_eq!(object["metadata"]["managedFields"][0]["manager"], "kubectl");
    assert_eq!(object["metadata"]["managedFields"][0]["operation"], "Apply");

    // Another manager changing an owned field conflicts, unless it forces.
    let conflict = kubectl
        .fails(&[
            "apply",
            "--server-side",
            "--field-manager=other",
            "-f",
            applied.to_str().unwrap(),
        ])
        .await;
    assert!(conflict.contains("conflict with \"kubectl\""), "{conflict}");
    kubectl
        .ok(&[
            "apply",
            "--server-side",
            "--field-manager=other",
            "--force-conflicts",
            "-f",
            applied.to_str().unwrap(),
        ])
        .await;
    let host = kubectl
        .ok(&[
            "get",
            "ingress",
            "applied",
            "-n",
            "prod",
            "-o",
            "jsonpath={.spec.rules[0].host}",
        ])
        .await;
    assert_eq!(host, "applied.example.com");

    let strict = kubectl.file(
        "bogus.yaml",
        &WEB_MANIFEST
            .replace(
                "  ingressClassName: ours",
                "  ingressClassName: ours\n  bogus: true",
            )
            .replace("name: web\n  namespace", "name: bogus\n  namespace"),
    );
    let rejected = kubectl
        .fails(&["create", "-f", strict.to_str().unwrap()])
        .await;
    assert!(
        rejected.contains("unknown field \"spec.bogus\""),
        "{rejected}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn kubectl_patches_describes_and_deletes() {
    let server = start().await;
    let kubectl = Kubectl::new(&server);
    let client = server.client().unwrap();
    let manifest = kubectl.file("web.yaml", WEB_MANIFEST);
    kubectl
        .ok(&["create", "-f", manifest.to_str().unwrap()])
        .await;

    // Default (strategic), merge and JSON patches, and the status subresource.
    kubectl
        .ok(&[
            "patch",
            "ingress",
            "web",
            "-n",
            "prod",
            "-p",
            r#"{"metadata":{"labels":{"tier":"front"}}}"#,
        ])
        .await;
    kubectl
        .ok(&[
            "patch",
            "ingress",
            "web",
            "-n",
            "prod",
            "--type",
            "merge",
            "-p",
            r#"{"spec":{"ingressClassName":"other"}}"#,
        ])
        .await;
    kubectl
        .ok(&[
            "patch",
            "ingress",
            "web",
            "-n",
            "prod",
            "--type",
            "json",
            "-p",
            r#"[{"op":"replace","path":"/spec/rules/0/host","value":"j.example.com"}]"#,
        ])
        .await;
    kubectl
        .ok(&[
            "patch",
            "ingress",
            "web",
            "-n",
            "prod",
            "--subresource",
            "status",
            "--type",
            "merge",
            "-p",
            r#"{"status":{"loadBalancer":{"ingress":[{"ip":"10.1.2.3"}]}}}"#,
        ])
        .await;
    let table = kubectl
        .ok(&["get", "ingress", "web", "-n", "prod", "--show-labels"])
        .await;
    let row = &rows(&table)[1];
    assert_eq!(
        row[..5],
        ["web", "other", "j.example.com", "10.1.2.3", "80"],
        "{table}"
    );
    assert_eq!(
        row.last().map(String::as_str),
        Some("app=web,tier=front"),
        "{table}"
    );
    let strategic = server.requests().matching(|r| r.method == "PATCH");
    assert_eq!(
        strategic[0].content_type.as_deref(),
        Some("application/strategic-merge-patch+json")
    );
    let missing = kubectl
        .fails(&["patch", "ingress", "nope", "-n", "prod", "-p", "{}"])
        .await;
    assert!(
        missing.contains(r#"ingresses.networking.k8s.io "nope" not found"#),
        "{missing}"
    );

    // Events about the Ingress, written through both Event APIs (the controller's Recorder
    // writes events.k8s.io/v1), show up in describe, which reads core/v1.
    let ingresses: Api<Ingress> = Api::namespaced(client.clone(), "prod");
    let ing = ingresses.get("web").await.unwrap();
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "ingress-controller".into(),
            instance: Some("ingress-0".into()),
        },
    );
    recorder
        .publish(
            &RecorderEvent {
                type_: EventType::Normal,
                reason: "Synced".into(),
                note: Some("routes published for j.example.com".into()),
                action: "Sync".into(),
                secondary: None,
            },
            &ing.object_ref(&()),
        )
        .await
        .unwrap();
    let core_events: Api<CoreEvent> = Api::namespaced(client.clone(), "prod");
    let warning: CoreEvent = serde_json::from_value(json!({
        "metadata": {"name": "web.warn"},
        "involvedObject": {"apiVersion": "networking.k8s.io/v1", "kind": "Ingress", "name": "web", "namespace": "prod", "uid": ing.uid()},
        "reason": "BadBackend", "type": "Warning", "message": "service web has no endpoints", "count": 3,
        "source": {"component": "ingress-controller"},
        "firstTimestamp": "2026-01-01T00:00:00Z", "lastTimestamp": "2026-01-01T00:01:00Z",
    }))
    .unwrap();
    core_events
        .create(&PostParams::default(), &warning)
        .await
        .unwrap();
    let unrelated: CoreEvent = serde_json::from_value(json!({
        "metadata": {"name": "other.1"},
        "involvedObject": {"kind": "Ingress", "name": "other", "namespace": "prod"},
        "reason": "Unrelated", "type": "Normal", "message": "not about web",
    }))
    .unwrap();
    core_events
        .create(&PostParams::default(), &unrelated)
        .await
        .unwrap();

    let described = kubectl
        .ok(&["describe", "ingress", "web", "-n", "prod"])
        .await;
    assert!(described.contains("Ingress Class:    other"), "{described}");
    assert!(described.contains("j.example.com"), "{described}");
    let events = described.split("Events:").nth(1).unwrap_or_default();
    assert!(
        events.contains("Synced") && events.contains("routes published for j.example.com"),
        "{described}"
    );
    assert!(
        events.contains("BadBackend") && events.contains("(x3 over"),
        "{described}"
    );
    assert!(!events.contains("Unrelated"), "{described}");
    let event_lists = server
        .requests()
        .matching(|r| r.path == "/api/v1/namespaces/prod/events");
    let selector = event_lists
        .last()
        .and_then(|r| r.param("fieldSelector"))
        .unwrap_or_default();
    assert!(
        selector.contains(&format!("involvedObject.uid={}", ing.uid().unwrap())),
        "{selector}"
    );

    let events_table = kubectl.ok(&["get", "events", "-n", "prod"]).await;
    assert!(events_table.starts_with("LAST SEEN"), "{events_table}");

    let lease = kubectl.file("lease.yaml", "apiVersion: coordination.k8s.io/v1\nkind: Lease\nmetadata:\n  name: ingress-leader\n  namespace: kube-system\nspec:\n  holderIdentity: ingress-0\n  leaseDurationSeconds: 15\n");
    kubectl.ok(&["create", "-f", lease.to_str().unwrap()]).await;
    let leases = kubectl.ok(&["get", "lease", "-A"]).await;
    assert_eq!(
        rows(&leases)[1][..3],
        ["kube-system", "ingress-leader", "ingress-0"],
        "{leases}"
    );

    let deleted = kubectl
        .ok(&["delete", "ingress", "web", "-n", "prod"])
        .await;
    assert!(
        deleted.contains(r#"ingress.networking.k8s.io "web" deleted"#),
        "{deleted}"
    );
    let gone = kubectl
        .fails(&["get", "ingress", "web", "-n", "prod"])
        .await;
    assert!(
        gone.contains(
            r#"Error from server (NotFound): ingresses.networking.k8s.io "web" not found"#
        ),
        "{gone}"
    );
    kubectl.ok(&["delete", "namespace", "prod"]).await;
    assert!(
        server
            .store()
            .get(ingresses_def(), Some("prod"), "web")
            .is_none()
    );
    let services: Api<Service> = Api::namespaced(client, "prod");
    assert!(
        services.get_opt("web").await.unwrap().is_none(),
        "namespace contents go with it"
    );
}

fn ingresses_def() -> &'static ingress_tests::apiserver::ResourceDef {
    ingress_tests::apiserver::resource("networking.k8s.io", "v1", "ingresses").unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn kubectl_sees_failures_and_outages() {
    let server = start().await;
    let kubectl = Kubectl::new(&server);
    kubectl.ok(&["get", "ingress", "-A"]).await;

    server.faults().fail_matching("/ingresses", 1);
    let failed = kubectl.fails(&["get", "ingress", "-A"]).await;
    assert!(failed.contains("injected failure (500)"), "{failed}");
    kubectl.ok(&["get", "ingress", "-A"]).await;

    server.stop().await;
    let down = kubectl.fails(&["get", "ingress", "-A"]).await;
    assert!(down.contains("was refused"), "{down}");
    server.resume().await.unwrap();
    kubectl.ok(&["get", "ingress", "-A"]).await;
}

/// The system kubectl may dispatch to a client matching the server's version (the Google
/// Cloud SDK package does); each supported one gets the everyday commands.
#[tokio::test(flavor = "multi_thread")]
async fn kubectl_works_across_reported_versions() {
    for minor in 28..=33 {
        let server = TestApiServer::start_with(ServerOptions {
            minor_version: minor,
            ..ServerOptions::default()
        })
        .await
        .unwrap();
        let kubectl = Kubectl::new(&server);
        let manifest = kubectl.file("web.yaml", WEB_MANIFEST);
        let applied = kubectl.file("applied.yaml", APPLIED_MANIFEST);
        // Before 1.29 kubectl validates with OpenAPI v2 (protobuf only), which is not served.
        let validate = if minor < 29 {
            "--validate=false"
        } else {
            "--validate=strict"
        };
        let context = format!("server version 1.{minor}");
        let created = kubectl
            .ok(&["create", validate, "-f", manifest.to_str().unwrap()])
            .await;
        assert!(
            created.contains("ingress.networking.k8s.io/web created"),
            "{context}: {created}"
        );
        kubectl
            .ok(&[
                "apply",
                "--server-side",
                validate,
                "-f",
                applied.to_str().unwrap(),
            ])
            .await;
        let table = kubectl.ok(&["get", "ingress", "-A"]).await;
        let names: Vec<String> = rows(&table).iter().skip(1).map(|r| r[1].clone()).collect();
        assert_eq!(names, ["applied", "web"], "{context}: {table}");
        let described = kubectl
            .ok(&["describe", "ingress", "web", "-n", "prod"])
            .await;
        assert!(
            described.contains("web.example.com"),
            "{context}: {described}"
        );
        kubectl
            .ok(&[
                "patch",
                "ingress",
                "web",
                "-n",
                "prod",
                "-p",
                r#"{"metadata":{"labels":{"x":"y"}}}"#,
            ])
            .await;
        kubectl
            .ok(&["delete", "ingress", "web", "-n", "prod"])
            .await;
        assert!(
            server
                .store()
                .get(ingresses_def(), Some("prod"), "web")
                .is_none(),
            "{context}"
        );
        if minor < 29 {
            // Older clients only know aggregated discovery v2beta1, which is not served:
            // they must have fallen back to the per-group documents.
            assert!(
                !server
                    .requests()
                    .matching(|r| r.path == "/apis/networking.k8s.io/v1")
                    .is_empty(),
                "{context}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn kubectl_watch_prints_changes() {
    use tokio::io::{AsyncBufReadExt, BufReader};

    let server = start().await;
    let kubectl = Kubectl::new(&server);
    let client = server.client().unwrap();
    let ingresses: Api<Ingress> = Api::namespaced(client, "prod");
    ingresses
        .create(&PostParams::default(), &ingress("prod", "web", "a.example"))
        .await
        .unwrap();

    let mut child = tokio::process::Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(kubectl.dir.path().join("kubeconfig"))
        .arg("--cache-dir")
        .arg(kubectl.dir.path().join("cache"))
        .args(["get", "ingress", "-n", "prod", "-w"])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("kubectl starts");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let mut next_line = async || {
        tokio::time::timeout(TIMEOUT, lines.next_line())
            .await
            .expect("kubectl printed in time")
            .expect("kubectl output")
            .expect("kubectl still running")
    };
    assert!(next_line().await.starts_with("NAME"));
    assert!(next_line().await.starts_with("web "));
    ingresses
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"ingressClassName": "theirs"}})),
        )
        .await
        .unwrap();
    let changed = rows(&next_line().await).concat();
    assert_eq!(changed[..3], ["web", "theirs", "a.example"], "{changed:?}");
    child.kill().await.expect("kubectl stops");
}

// ---- kube-rs ----------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn kube_rs_reads_and_writes() {
    let server = start().await;
    // Through a kubeconfig file, the way a deployed controller would be configured.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kubeconfig");
    server.write_kubeconfig(&path).unwrap();
    let kubeconfig = kube::config::Kubeconfig::read_from(&path).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .unwrap();
    let client = kube::Client::try_from(config).unwrap();

    let ingresses: Api<Ingress> = Api::namespaced(client.clone(), "prod");
    assert!(
        ingresses
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
    let created = ingresses
        .create(&PostParams::default(), &ingress("prod", "web", "a.example"))
        .await
        .unwrap();
    assert_eq!(created.metadata.generation, Some(1));
    let rv1: u64 = created.resource_version().unwrap().parse().unwrap();

    let err = ingresses
        .create(&PostParams::default(), &ingress("prod", "web", "a.example"))
        .await
        .unwrap_err();
    assert_eq!(api_status(&err), (409, "AlreadyExists".into()));

    let merged = ingresses
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"tier": "front"}}})),
        )
        .await
        .unwrap();
    assert_eq!(
        merged.labels().get("tier").map(String::as_str),
        Some("front")
    );
    assert_eq!(
        merged.metadata.generation,
        Some(1),
        "metadata changes keep the generation"
    );
    assert!(merged.resource_version().unwrap().parse::<u64>().unwrap() > rv1);

    // Server-side apply: creates when absent, merges when present, removes what is no longer applied.
    let mut applied = ingress("prod", "applied", "b.example");
    applied.metadata.annotations = Some(BTreeMap::from([("team".to_string(), "edge".to_string())]));
    let ssa = PatchParams::apply("ingress-test");
    let first = ingresses
        .patch("applied", &ssa, &Patch::Apply(&applied))
        .await
        .unwrap();
    assert_eq!(
        first.annotations().get("team").map(String::as_str),
        Some("edge")
    );
    applied.metadata.annotations = None;
    applied.spec.as_mut().unwrap().ingress_class_name = Some("theirs".into());
    let second = ingresses
        .patch("applied", &ssa, &Patch::Apply(&applied))
        .await
        .unwrap();
    assert!(
        second.annotations().is_empty(),
        "{:?}",
        second.metadata.annotations
    );
    assert_eq!(
        second.spec.unwrap().ingress_class_name.as_deref(),
        Some("theirs")
    );
    assert_eq!(second.metadata.generation, Some(2));

    // Status writes change only the status; main writes never change it.
    let status = json!({"status": {"loadBalancer": {"ingress": [{"ip": "10.0.0.7"}]}}, "spec": {"ingressClassName": "ignored"}});
    let after = ingresses
        .patch_status("web", &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
    assert_eq!(
        after.spec.as_ref().unwrap().ingress_class_name.as_deref(),
        Some("ours")
    );
    let lb = after
        .status
        .as_ref()
        .unwrap()
        .load_balancer
        .as_ref()
        .unwrap();
    assert_eq!(
        lb.ingress.as_ref().unwrap()[0].ip.as_deref(),
        Some("10.0.0.7")
    );
    let mut replaced = after.clone();
    replaced.status = None;
    replaced.spec.as_mut().unwrap().ingress_class_name = Some("new".into());
    let replaced = ingresses
        .replace("web", &PostParams::default(), &replaced)
        .await
        .unwrap();
    assert!(
        replaced.status.is_some(),
        "PUT on the main resource kept the status"
    );
    assert_eq!(replaced.metadata.generation, Some(2));
    let status_apply = json!({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress", "metadata": {"name": "web"},
        "status": {"loadBalancer": {"ingress": [{"hostname": "lb.example"}]}}});
    let applied_status = ingresses
        .patch_status(
            "web",
            &PatchParams::apply("ingress-status").force(),
            &Patch::Apply(&status_apply),
        )
        .await
        .unwrap();
    assert_eq!(
        applied_status
            .status
            .unwrap()
            .load_balancer
            .unwrap()
            .ingress
            .unwrap()[0]
            .hostname
            .as_deref(),
        Some("lb.example")
    );

    // Optimistic concurrency: a stale resourceVersion is a 409 Conflict.
    let err = ingresses
        .replace("web", &PostParams::default(), &after)
        .await
        .unwrap_err();
    assert_eq!(api_status(&err), (409, "Conflict".into()));

    // Field selectors, as the controller watches TLS Secrets.
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "prod");
    secrets
        .create(
            &PostParams::default(),
            &secret("tls", "kubernetes.io/tls", json!({})),
        )
        .await
        .unwrap();
    secrets
        .create(
            &PostParams::default(),
            &secret("opaque", "Opaque", json!({})),
        )
        .await
        .unwrap();
    let tls = secrets
        .list(&ListParams::default().fields("type=kubernetes.io/tls"))
        .await
        .unwrap();
    assert_eq!(
        tls.items.iter().map(|s| s.name_any()).collect::<Vec<_>>(),
        ["tls"]
    );
    let all: Api<Secret> = Api::all(client.clone());
    let not_tls = all
        .list(&ListParams::default().fields("type!=kubernetes.io/tls,metadata.namespace=prod"))
        .await
        .unwrap();
    assert_eq!(
        not_tls
            .items
            .iter()
            .map(|s| s.name_any())
            .collect::<Vec<_>>(),
        ["opaque"]
    );
    let err = secrets
        .list(&ListParams::default().fields("data.x=1"))
        .await
        .unwrap_err();
    assert_eq!(api_status(&err), (400, "BadRequest".into()));
    let listed = server
        .requests()
        .matching(|r| r.param("fieldSelector").as_deref() == Some("type=kubernetes.io/tls"));
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].path, "/api/v1/namespaces/prod/secrets");

    let deleted = ingresses
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    assert!(deleted.is_right(), "immediate delete answers with a Status");
    let err = ingresses.get("web").await.unwrap_err();
    assert_eq!(api_status(&err), (404, "NotFound".into()));
    assert_eq!(
        ingresses
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len(),
        1
    );

    // Collections delete by selector.
    for name in ["x1", "x2"] {
        let mut doomed = ingress("prod", name, "x.example");
        doomed.metadata.labels = Some(BTreeMap::from([("batch".to_string(), "x".to_string())]));
        ingresses
            .create(&PostParams::default(), &doomed)
            .await
            .unwrap();
    }
    let removed = ingresses
        .delete_collection(
            &DeleteParams::default(),
            &ListParams::default().labels("batch=x"),
        )
        .await
        .unwrap();
    let removed = removed.left().expect("a list of what was deleted");
    assert_eq!(removed.items.len(), 2);
    assert_eq!(
        ingresses
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len(),
        1
    );

    // Legacy (non-aggregated) discovery, as kube-rs reads it.
    let discovery = kube::Discovery::new(client.clone()).run().await.unwrap();
    let gvk = kube::api::GroupVersionKind::gvk("networking.k8s.io", "v1", "Ingress");
    let (resource, caps) = discovery
        .resolve_gvk(&gvk)
        .expect("Ingress is discoverable");
    assert_eq!(resource.plural, "ingresses");
    assert_eq!(caps.scope, kube::discovery::Scope::Namespaced);
    assert!(
        caps.subresources
            .iter()
            .any(|(r, _)| r.plural == "ingresses/status" || r.plural == "status"),
        "{caps:?}"
    );

    // Finalizers hold a deletion until they are removed.
    let mut held = ingress("prod", "held", "c.example");
    held.metadata.finalizers = Some(vec!["example.com/hold".into()]);
    ingresses
        .create(&PostParams::default(), &held)
        .await
        .unwrap();
    let pending = ingresses
        .delete("held", &DeleteParams::default())
        .await
        .unwrap();
    let pending = pending.left().expect("a held object is returned");
    assert!(pending.metadata.deletion_timestamp.is_some());
    ingresses
        .patch(
            "held",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .unwrap();
    assert!(ingresses.get_opt("held").await.unwrap().is_none());
}

/// A reflector over `api`, driven in the background; the task ends with the test.
fn reflect<K>(api: Api<K>, config: watcher::Config) -> reflector::Store<K>
where
    K: Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone + Send + Sync,
{
    let (reader, writer) = reflector::store();
    let stream = watcher(api, config)
        .default_backoff()
        .reflect(writer)
        .applied_objects();
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while stream.next().await.is_some() {}
    });
    reader
}

fn names<K>(store: &reflector::Store<K>) -> Vec<String>
where
    K: Resource + Clone,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    let mut names: Vec<String> = store.state().iter().map(|o| o.name_any()).collect();
    names.sort();
    names
}

#[tokio::test(flavor = "multi_thread")]
async fn reflector_follows_creates_updates_deletes_and_selectors() {
    let server = start().await;
    let client = server.client().unwrap();
    let ingresses: Api<Ingress> = Api::namespaced(client.clone(), "prod");
    ingresses
        .create(
            &PostParams::default(),
            &ingress("prod", "before", "a.example"),
        )
        .await
        .unwrap();

    let store = reflect(
        Api::<Ingress>::all(client.clone()),
        watcher::Config::default(),
    );
    tokio::time::timeout(TIMEOUT, store.wait_until_ready())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(names(&store), ["before"]);

    ingresses
        .create(&PostParams::default(), &ingress("prod", "web", "b.example"))
        .await
        .unwrap();
    eventually("reflector sees the create", || {
        names(&store) == ["before", "web"]
    })
    .await;
    ingresses
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"ingressClassName": "x"}})),
        )
        .await
        .unwrap();
    eventually("reflector sees the update", || {
        store.state().iter().any(|i| {
            i.spec
                .as_ref()
                .and_then(|s| s.ingress_class_name.as_deref())
                == Some("x")
        })
    })
    .await;
    ingresses
        .delete("before", &DeleteParams::default())
        .await
        .unwrap();
    eventually("reflector sees the delete", || names(&store) == ["web"]).await;

    // Selectors apply to watches: a relabelled Secret leaves the selection as a DELETED event.
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "prod");
    let tls_store = reflect(
        Api::<Secret>::all(client.clone()),
        watcher::Config::default()
            .fields("type=kubernetes.io/tls")
            .labels("serve=yes"),
    );
    tokio::time::timeout(TIMEOUT, tls_store.wait_until_ready())
        .await
        .unwrap()
        .unwrap();
    secrets
        .create(
            &PostParams::default(),
            &secret("a", "kubernetes.io/tls", json!({"serve": "yes"})),
        )
        .await
        .unwrap();
    secrets
        .create(
            &PostParams::default(),
            &secret("b", "Opaque", json!({"serve": "yes"})),
        )
        .await
        .unwrap();
    secrets
        .create(
            &PostParams::default(),
            &secret("c", "kubernetes.io/tls", json!({"serve": "no"})),
        )
        .await
        .unwrap();
    eventually("only the selected secret", || names(&tls_store) == ["a"]).await;
    secrets
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"serve": "no"}}})),
        )
        .await
        .unwrap();
    secrets
        .patch(
            "c",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"serve": "yes"}}})),
        )
        .await
        .unwrap();
    eventually("relabelled secrets move in and out", || {
        names(&tls_store) == ["c"]
    })
    .await;
    let watches = server
        .requests()
        .matching(|r| r.is_watch() && r.path == "/api/v1/secrets");
    assert!(
        watches
            .iter()
            .all(|r| r.param("fieldSelector").as_deref() == Some("type=kubernetes.io/tls")),
        "{watches:?}"
    );
    assert!(
        watches
            .iter()
            .all(|r| r.param("allowWatchBookmarks").as_deref() == Some("true")),
        "{watches:?}"
    );
}

fn list_count(server: &TestApiServer) -> usize {
    server
        .requests()
        .matching(|r| {
            r.method == "GET" && r.path == "/apis/networking.k8s.io/v1/ingresses" && !r.is_watch()
        })
        .len()
}

#[tokio::test(flavor = "multi_thread")]
async fn reflector_survives_dropped_watches_expiry_and_restarts() {
    let server = start().await;
    let client = server.client().unwrap();
    let ingresses: Api<Ingress> = Api::namespaced(client.clone(), "prod");
    let store = reflect(
        Api::<Ingress>::all(client.clone()),
        watcher::Config::default(),
    );
    tokio::time::timeout(TIMEOUT, store.wait_until_ready())
        .await
        .unwrap()
        .unwrap();
    let watches = || server.requests().matching(|r| r.is_watch()).len();

    // Dropped connections: the watcher re-watches from its last resourceVersion, no relist.
    let lists = list_count(&server);
    let before = watches();
    server.faults().drop_watches();
    eventually("a new watch after the drop", || watches() > before).await;
    ingresses
        .create(&PostParams::default(), &ingress("prod", "one", "1.example"))
        .await
        .unwrap();
    eventually("seen after a dropped watch", || names(&store) == ["one"]).await;
    assert_eq!(
        list_count(&server),
        lists,
        "resuming a watch needs no relist"
    );

    // 410 Expired: the watcher relists.
    server.faults().expire_next_watches(1);
    server.faults().drop_watches();
    eventually("a relist after 410", || list_count(&server) > lists).await;
    ingresses
        .create(&PostParams::default(), &ingress("prod", "two", "2.example"))
        .await
        .unwrap();
    eventually("seen after 410", || names(&store) == ["one", "two"]).await;

    // Restart with state and history: old resourceVersions are 410, the watcher relists.
    let lists = list_count(&server);
    server
        .restart(RestartOptions {
            reset_history: true,
            downtime: Duration::from_millis(300),
            ..Default::default()
        })
        .await
        .unwrap();
    eventually("a relist after restart", || list_count(&server) > lists).await;
    ingresses
        .create(
            &PostParams::default(),
            &ingress("prod", "three", "3.example"),
        )
        .await
        .unwrap();
    eventually("seen after restart", || {
        names(&store) == ["one", "three", "two"]
    })
    .await;

    // Restart from nothing: the relist empties the reflector.
    server
        .restart(RestartOptions {
            wipe_state: true,
            ..Default::default()
        })
        .await
        .unwrap();
    eventually("wiped state reaches the reflector", || {
        names(&store).is_empty()
    })
    .await;
    ingresses
        .create(
            &PostParams::default(),
            &ingress("prod", "four", "4.example"),
        )
        .await
        .unwrap();
    eventually("seen after a wipe", || names(&store) == ["four"]).await;

    // Down for a while: the reflector keeps its last state and catches up afterwards.
    server.stop().await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(names(&store), ["four"]);
    server.resume().await.unwrap();
    ingresses
        .create(
            &PostParams::default(),
            &ingress("prod", "five", "5.example"),
        )
        .await
        .unwrap();
    eventually("seen after an outage", || names(&store) == ["five", "four"]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn kube_rs_sees_injected_failures() {
    let server = start().await;
    let client = server.client().unwrap();
    let leases: Api<Lease> = Api::namespaced(client, "kube-node-lease");
    server.faults().fail_next(1);
    let err = leases.list(&ListParams::default()).await.unwrap_err();
    assert_eq!(api_status(&err), (500, "InternalError".into()));
    assert!(
        leases
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
    let lease: Lease = serde_json::from_value(
        json!({"metadata": {"name": "l"}, "spec": {"holderIdentity": "me"}}),
    )
    .unwrap();
    // A failed write reads the body first, so the kept-alive connection stays usable.
    server
        .faults()
        .fail(ingress_tests::apiserver::FailRule::matching("/leases", 1).with_method("POST"));
    let err = leases
        .create(&PostParams::default(), &lease)
        .await
        .unwrap_err();
    assert_eq!(api_status(&err), (500, "InternalError".into()));
    server.requests().clear();
    server.faults().fail(
        ingress_tests::apiserver::FailRule::matching("/leases", 2)
            .with_status(503)
            .with_method("POST"),
    );
    // kube-rs retries 503s itself: the caller never sees them, the request log does.
    leases.create(&PostParams::default(), &lease).await.unwrap();
    let posts: Vec<u16> = server
        .requests()
        .matching(|r| r.method == "POST")
        .iter()
        .map(|r| r.status)
        .collect();
    assert_eq!(posts, [503, 503, 201]);
    assert_eq!(server.faults().pending_failures(), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn kube_rs_watch_gets_bookmarks_and_initial_events() {
    let server = start().await;
    let client = server.client().unwrap();
    let ingresses: Api<Ingress> = Api::namespaced(client.clone(), "prod");
    ingresses
        .create(&PostParams::default(), &ingress("prod", "web", "a.example"))
        .await
        .unwrap();
    let rv = server.store().resource_version().to_string();

    let stream = ingresses
        .watch(&WatchParams::default().timeout(2), &rv)
        .await
        .unwrap();
    let events: Vec<_> = tokio::time::timeout(Duration::from_secs(5), stream.collect::<Vec<_>>())
        .await
        .expect("watch ends at timeoutSeconds");
    let bookmarks: Vec<String> = events
        .iter()
        .filter_map(|e| match e {
            Ok(WatchEvent::Bookmark(b)) => Some(b.metadata.resource_version.clone()),
            _ => None,
        })
        .collect();
    assert!(bookmarks.len() >= 3, "{events:?}");
    assert!(bookmarks.iter().all(|b| *b == rv), "{bookmarks:?}");

    // Streaming lists: the current state, then the initial-events-end bookmark.
    let store = reflect(
        Api::<Ingress>::all(client),
        watcher::Config::default().streaming_lists(),
    );
    tokio::time::timeout(TIMEOUT, store.wait_until_ready())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(names(&store), ["web"]);
    let streamed = server
        .requests()
        .matching(|r| r.param("sendInitialEvents").as_deref() == Some("true"));
    assert!(!streamed.is_empty());
}

// ---- raw HTTP: wire format and hostile input ---------------------------------------------------

struct Raw {
    base: String,
    client: HttpClient<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>,
}

impl Raw {
    fn new(server: &TestApiServer) -> Self {
        Self {
            base: server.url(),
            client: HttpClient::builder(TokioExecutor::new()).build_http(),
        }
    }

    async fn send(
        &self,
        method: &str,
        path: &str,
        content_type: Option<&str>,
        body: impl Into<Bytes>,
    ) -> (u16, String) {
        let mut req = http::Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base));
        if let Some(ct) = content_type {
            req = req.header("content-type", ct);
        }
        let req = req.body(Full::new(body.into())).unwrap();
        let response = tokio::time::timeout(TIMEOUT, self.client.request(req))
            .await
            .unwrap()
            .unwrap();
        let status = response.status().as_u16();
        let body = tokio::time::timeout(TIMEOUT, response.into_body().collect())
            .await
            .unwrap()
            .unwrap()
            .to_bytes();
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    /// Only the status: for responses that stream without end.
    async fn status_of(&self, path: &str) -> u16 {
        let req = http::Request::builder()
            .uri(format!("{}{path}", self.base))
            .body(Full::new(Bytes::new()))
            .unwrap();
        let response = tokio::time::timeout(TIMEOUT, self.client.request(req))
            .await
            .unwrap()
            .unwrap();
        response.status().as_u16()
    }

    async fn get(&self, path: &str) -> (u16, String) {
        self.send("GET", path, None, Bytes::new()).await
    }

    async fn json(&self, path: &str) -> (u16, Value) {
        let (status, body) = self.get(path).await;
        (
            status,
            serde_json::from_str(&body).unwrap_or_else(|e| panic!("{path}: {e}: {body}")),
        )
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn wire_format_matches_kube_apiserver() {
    let server = TestApiServer::start_with(ServerOptions {
        history_limit: 3,
        ..ServerOptions::default()
    })
    .await
    .unwrap();
    let raw = Raw::new(&server);

    let (status, body) = raw
        .json("/apis/networking.k8s.io/v1/namespaces/prod/ingresses/missing")
        .await;
    assert_eq!(status, 404);
    assert_eq!(
        body,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": "ingresses.networking.k8s.io \"missing\" not found", "reason": "NotFound",
            "details": {"name": "missing", "group": "networking.k8s.io", "kind": "ingresses"}, "code": 404})
    );

    let (_, list) = raw.json("/api/v1/namespaces").await;
    assert_eq!(list["kind"], "NamespaceList");
    let first_rv: u64 = list["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();

    for i in 0..5 {
        let body = json!({"metadata": {"name": format!("s{i}")}, "type": "Opaque"}).to_string();
        let (status, _) = raw
            .send(
                "POST",
                "/api/v1/namespaces/default/secrets",
                Some("application/json"),
                body,
            )
            .await;
        assert_eq!(status, 201);
    }
    // History holds three changes; a watch from before them is told 410 in-band.
    let (status, body) = raw
        .get(&format!(
            "/api/v1/secrets?watch=1&resourceVersion={first_rv}"
        ))
        .await;
    assert_eq!(status, 200);
    let event: Value = serde_json::from_str(body.trim()).unwrap();
    assert_eq!(event["type"], "ERROR");
    assert_eq!(event["object"]["kind"], "Status");
    assert_eq!(event["object"]["code"], 410);
    assert_eq!(event["object"]["reason"], "Expired");
    // A list is always served from the present.
    let (status, _) = raw
        .json(&format!("/api/v1/secrets?resourceVersion={first_rv}"))
        .await;
    assert_eq!(status, 200);
    let (status, body) = raw
        .json(&format!(
            "/api/v1/secrets?resourceVersion={first_rv}&resourceVersionMatch=Exact"
        ))
        .await;
    assert_eq!((status, body["reason"].as_str()), (410, Some("Expired")));
    let (status, body) = raw.json("/api/v1/secrets?resourceVersion=999999").await;
    assert_eq!((status, body["reason"].as_str()), (504, Some("Timeout")));

    // A watch from the current version with a timeout: nothing but its end.
    let now = server.store().resource_version();
    let (status, body) = raw
        .get(&format!(
            "/api/v1/secrets?watch=true&resourceVersion={now}&timeoutSeconds=1"
        ))
        .await;
    assert_eq!((status, body.as_str()), (200, ""));

    // Initial events end with the marked bookmark.
    let (_, body) = raw.get("/api/v1/namespaces/default/secrets?watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true&timeoutSeconds=1").await;
    let events: Vec<Value> = body
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(
        events.iter().filter(|e| e["type"] == "ADDED").count(),
        5,
        "{body}"
    );
    let end = events
        .iter()
        .find(|e| e["type"] == "BOOKMARK")
        .expect("a bookmark");
    assert_eq!(
        end["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"],
        "true"
    );
    assert_eq!(
        end["object"]["metadata"]["resourceVersion"],
        now.to_string()
    );

    // Discovery, plain and aggregated.
    let (_, core) = raw.json("/api/v1").await;
    let ingress_entry = raw.json("/apis/networking.k8s.io/v1").await.1["resources"][0].clone();
    assert_eq!(ingress_entry["shortNames"], json!(["ing"]));
    assert!(
        core["resources"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["name"] == "services" && r["shortNames"] == json!(["svc"]))
    );
    let (_, version) = raw.json("/version").await;
    assert_eq!(version["gitVersion"], "v1.33.0");
}

#[tokio::test(flavor = "multi_thread")]
async fn hostile_input_gets_4xx_and_the_server_stays_up() {
    let server = start().await;
    let raw = Raw::new(&server);
    let json_ct = Some("application/json");
    let secret = json!({"metadata": {"name": "s"}}).to_string();
    raw.send(
        "POST",
        "/api/v1/namespaces/default/secrets",
        json_ct,
        secret.clone(),
    )
    .await;
    let deep = format!("{}1{}", "[".repeat(10_000), "]".repeat(10_000));
    let cases: Vec<(&str, &str, Option<&str>, String, u16)> = vec![
        (
            "POST",
            "/api/v1/namespaces/default/secrets",
            json_ct,
            "{not json".into(),
            400,
        ),
        (
            "POST",
            "/api/v1/namespaces/default/secrets",
            json_ct,
            "[1,2]".into(),
            400,
        ),
        (
            "POST",
            "/api/v1/namespaces/default/secrets",
            json_ct,
            "null".into(),
            400,
        ),
        (
            "POST",
            "/api/v1/namespaces/default/secrets",
            json_ct,
            deep,
            400,
        ),
        (
            "POST",
            "/api/v1/namespaces/default/secrets",
            json_ct,
            json!({"metadata": {"name": "x"}, "data": {"k": "not base64!"}}).to_string(),
            400,
        ),
        (
            "POST",
            "/api/v1/namespaces/default/secrets",
            json_ct,
            json!({"metadata": {"name": "UPPER"}}).to_string(),
            422,
        ),
        (
            "POST",
            "/api/v1/namespaces/default/secrets",
            json_ct,
            json!({"kind": "Service", "metadata": {"name": "x"}}).to_string(),
            400,
        ),
        (
            "POST",
            "/api/v1/namespaces/default/secrets",
            json_ct,
            json!({"metadata": {"name": "x", "namespace": "other"}}).to_string(),
            400,
        ),
        (
            "POST",
            "/api/v1/namespaces/default/secrets",
            json_ct,
            "x".repeat(4 * 1024 * 1024),
            413,
        ),
        (
            "POST",
            "/api/v1/namespaces/default/secrets/s",
            json_ct,
            secret.clone(),
            405,
        ),
        (
            "PUT",
            "/api/v1/namespaces/default/secrets/other",
            json_ct,
            secret.clone(),
            400,
        ),
        (
            "PUT",
            "/api/v1/namespaces/default/secrets/missing",
            json_ct,
            json!({"metadata": {"name": "missing"}}).to_string(),
            404,
        ),
        (
            "PATCH",
            "/api/v1/namespaces/default/secrets/s",
            Some("text/plain"),
            "{}".into(),
            415,
        ),
        (
            "PATCH",
            "/api/v1/namespaces/default/secrets/s",
            Some("application/json-patch+json"),
            "{}".into(),
            400,
        ),
        (
            "PATCH",
            "/api/v1/namespaces/default/secrets/s",
            Some("application/merge-patch+json"),
            json!({"metadata": {"resourceVersion": "1"}}).to_string(),
            409,
        ),
        (
            "PATCH",
            "/api/v1/namespaces/default/secrets/s",
            Some("application/merge-patch+json"),
            json!({"kind": "Pod"}).to_string(),
            400,
        ),
        (
            "PATCH",
            "/api/v1/namespaces/default/secrets/s",
            Some("application/apply-patch+yaml"),
            "kind: Secret\n".into(),
            400,
        ),
        (
            "PATCH",
            "/api/v1/namespaces/default/secrets/s?fieldManager=m",
            Some("application/apply-patch+yaml"),
            "apiVersion: v1\nkind: Secret\nmetadata: [\n".into(),
            400,
        ),
        (
            "DELETE",
            "/api/v1/namespaces/default/secrets/s",
            json_ct,
            json!({"preconditions": {"uid": "nope"}}).to_string(),
            409,
        ),
        (
            "DELETE",
            "/api/v1/namespaces/default/secrets/s",
            json_ct,
            "{".into(),
            400,
        ),
        (
            "GET",
            "/api/v1/secrets?labelSelector=a+in+(b",
            None,
            String::new(),
            400,
        ),
        (
            "GET",
            "/api/v1/secrets?fieldSelector=spec.x%3D1",
            None,
            String::new(),
            400,
        ),
        (
            "GET",
            "/api/v1/secrets?watch=1&resourceVersion=abc",
            None,
            String::new(),
            400,
        ),
        (
            "GET",
            "/api/v1/secrets?timeoutSeconds=-5&watch=1",
            None,
            String::new(),
            400,
        ),
        (
            "GET",
            "/api/v1/secrets?fieldValidation=Maybe",
            None,
            String::new(),
            200,
        ),
        (
            "POST",
            "/api/v1/namespaces/default/secrets?fieldValidation=Maybe",
            json_ct,
            secret.clone(),
            400,
        ),
        ("GET", "/api/v1/pods", None, String::new(), 404),
        (
            "GET",
            "/api/v1/namespaces/default/secrets/s/status",
            None,
            String::new(),
            404,
        ),
        ("GET", "/apis/nope.example/v1", None, String::new(), 404),
        ("GET", "/%ff%00/../../etc/passwd", None, String::new(), 404),
        ("DELETE", "/version", None, String::new(), 405),
    ];
    for (method, path, content_type, body, want) in cases {
        let (status, text) = raw.send(method, path, content_type, body).await;
        assert_eq!(status, want, "{method} {path}: {text}");
        if status >= 400 && !path.starts_with("/%") {
            let parsed: Value = serde_json::from_str(&text)
                .unwrap_or_else(|e| panic!("{method} {path}: {e}: {text}"));
            assert_eq!(parsed["kind"], "Status", "{method} {path}: {text}");
            assert_eq!(parsed["code"], want, "{method} {path}: {text}");
        }
    }
    // An unrepresentable timeout means no timeout, not a crash.
    let endless = raw
        .status_of("/api/v1/secrets?watch=1&timeoutSeconds=18446744073709551615")
        .await;
    assert_eq!(endless, 200);
    let (status, _) = raw.get("/version").await;
    assert_eq!(status, 200, "server still answers");
    let (_, secret) = raw.json("/api/v1/namespaces/default/secrets/s").await;
    assert_eq!(
        secret["type"], "Opaque",
        "defaults applied, hostile writes did not land"
    );
}
