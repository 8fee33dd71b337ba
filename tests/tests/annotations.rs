//! Access-control annotations through the real binary. One this controller does not honour
//! keeps its Ingress from being served (503 on every path it declares, which stay claimed),
//! `ingress check` names the reason, and another Ingress on the same host is unaffected. Source
//! ranges are honoured: 403 outside them, on both HTTP paths and for passthrough.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use ingress_tests::manifests::service;
use ingress_tests::process::{Ingress, check};
use ingress_tests::scratch::Scratch;
use ingress_tests::upstream::{Backend, Echo};

/// `guarded` (older) asks for an auth snippet (never supported) on /admin of shop.example.com; `public` (newer)
/// serves / there; `styled` carries only an unsupported cosmetic annotation.
const INGRESSES: &str = r#"
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: guarded
  namespace: t
  creationTimestamp: "2024-01-01T00:00:00Z"
  annotations:
    nginx.ingress.kubernetes.io/auth-snippet: "https://auth.example.com/check"
spec:
  ingressClassName: ingress
  rules:
  - host: shop.example.com
    http:
      paths:
      - {path: /admin, pathType: Prefix, backend: {service: {name: admin, port: {number: 80}}}}
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: public, namespace: t, creationTimestamp: "2024-02-01T00:00:00Z"}
spec:
  ingressClassName: ingress
  rules:
  - host: shop.example.com
    http:
      paths:
      - {path: /, pathType: Prefix, backend: {service: {name: web, port: {number: 80}}}}
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: styled
  namespace: t
  annotations:
    nginx.ingress.kubernetes.io/enable-access-log: "false"
spec:
  ingressClassName: ingress
  rules:
  - host: styled.example.com
    http:
      paths:
      - {path: /, pathType: Prefix, backend: {service: {name: web, port: {number: 80}}}}
"#;

/// GET `host``path` through the proxy with curl over `version`: the answering backend's name,
/// or `<status>` when no backend answered.
async fn curl_backend(ingress: &Ingress, host: &str, path: &str, version: &str) -> String {
    let out = tokio::process::Command::new("curl")
        .args(["-s", "--max-time", "10", "-w", "\n%{http_code}", version])
        .args(["-H", &format!("Host: {host}")])
        .arg(ingress.url(path))
        .output()
        .await
        .expect("curl runs");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, status) = text.rsplit_once('\n').unwrap_or(("", &text));
    serde_json::from_str::<Echo>(body)
        .map(|e| e.backend)
        .unwrap_or_else(|_| format!("<{}>", status.trim()))
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unsupported_access_control_answers_503_and_spares_the_other_ingress() {
    let (admin, web) = (Backend::start("admin"), Backend::start("web"));
    let dir = Scratch::new("annotations");
    dir.write(
        "a.yaml",
        &(service("t", "admin", &[&admin]) + &service("t", "web", &[&web]) + INGRESSES),
    );
    // (host, path, answer when refused, answer when ignored)
    let cases = [
        ("shop.example.com", "/admin", "<503>", "admin"),
        ("shop.example.com", "/admin/users", "<503>", "admin"),
        ("shop.example.com", "/", "web", "web"),
        ("shop.example.com", "/shop", "web", "web"),
        ("styled.example.com", "/", "web", "web"),
    ];
    for (policy, column) in [("refuse", 0), ("ignore", 1)] {
        let ingress = Ingress::builder()
            .manifests(dir.path())
            .args(["--unsupported-access-annotations", policy])
            .start();
        for (host, path, refused, ignored) in cases {
            let want = [refused, ignored][column];
            // HTTP/1.1 takes the fast path, h2c hyper's.
            for version in ["--http1.1", "--http2-prior-knowledge"] {
                let got = curl_backend(&ingress, host, path, version).await;
                assert_eq!(got, want, "{policy} {version} {host}{path}");
            }
        }
        if policy == "refuse" {
            assert_eq!(admin.served(), 0, "nothing reached the guarded backend");
        }
        let (severity, count) = match policy {
            "refuse" => ("error", 1.0),
            _ => ("warning", 2.0),
        };
        assert_eq!(
            ingress.metric(
                "ingress_config_errors",
                &[("kind", "UnsupportedAnnotation"), ("severity", severity)]
            ),
            Some(count),
            "{policy}"
        );
    }

    // `ingress check` names the Ingress, the annotation and why, and fails.
    let out = check(dir.path(), &[]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    let error = text
        .lines()
        .find(|l| l.starts_with("error") && l.contains("UnsupportedAnnotation"))
        .unwrap_or_else(|| panic!("no error line in\n{text}"));
    for part in [
        "Ingress t/guarded",
        "nginx.ingress.kubernetes.io/auth-snippet",
        "access-control",
        "503",
    ] {
        assert!(error.contains(part), "{part:?} missing from {error}");
    }
    let warning = text
        .lines()
        .find(|l| l.starts_with("warning") && l.contains("enable-access-log"))
        .unwrap_or_else(|| panic!("no warning line in\n{text}"));
    assert!(warning.contains("Ingress t/styled"), "{warning}");
    let row = text
        .lines()
        .find(|l| l.starts_with("shop.example.com") && l.contains("/admin"))
        .unwrap_or_else(|| panic!("no /admin row in\n{text}"));
    assert!(row.contains("refused (503)"), "{row}");

    // The migration report says the same per annotation, for people and for scripts.
    assert!(
        text.contains("refused  nginx.ingress.kubernetes.io/auth-snippet [access-control]"),
        "{text}"
    );
    let out = check(dir.path(), &["--output", "json"]);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let migration = &json["migration"];
    assert_eq!(migration["summary"]["ingresses"], 3, "{migration}");
    assert_eq!(migration["summary"]["ingresses_refused"], 1, "{migration}");
    let guarded = migration["ingresses"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["ingress"] == "t/guarded")
        .expect("t/guarded");
    assert_eq!(guarded["served"], false);
    assert_eq!(guarded["annotations"][0]["outcome"], "refused");
    assert_eq!(guarded["annotations"][0]["category"], "access-control");
}

/// Source ranges as ingress-nginx applies them, judged on the client's address (127.0.0.1
/// here): outside an allow-list or inside a deny-list is 403 and nothing reaches the backend;
/// a value that does not parse refuses the Ingress (503) rather than opening it; an Ingress
/// without ranges on the same host is unaffected.
#[tokio::test(flavor = "multi_thread")]
async fn source_ranges_answer_403_outside_them() {
    let (inside, outside, web) = (
        Backend::start("inside"),
        Backend::start("outside"),
        Backend::start("web"),
    );
    let ingress_with = |name: &str, path: &str, annotations: &str| {
        format!(
            "---\napiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata:\n  name: {name}\n  namespace: t\n  annotations: {{{annotations}}}\nspec:\n  ingressClassName: ingress\n  rules:\n  - host: shop.example.com\n    http: {{paths: [{{path: {path}, pathType: Prefix, backend: {{service: {{name: {name}, port: {{number: 80}}}}}}}}]}}\n"
        )
    };
    let dir = Scratch::new("source-ranges");
    dir.write(
        "a.yaml",
        &(service("t", "inside", &[&inside])
            + &service("t", "outside", &[&outside])
            + &service("t", "web", &[&web])
            + &service("t", "broken", &[&web])
            + &service("t", "denied", &[&web])
            + &ingress_with(
                "inside",
                "/inside",
                "nginx.ingress.kubernetes.io/allowlist-source-range: \"10.0.0.0/8, 127.0.0.0/8\"",
            )
            + &ingress_with(
                "outside",
                "/outside",
                "nginx.ingress.kubernetes.io/whitelist-source-range: \"10.0.0.0/8,192.168.0.0/16\"",
            )
            + &ingress_with(
                "denied",
                "/denied",
                "nginx.ingress.kubernetes.io/allowlist-source-range: \"127.0.0.0/8\", nginx.ingress.kubernetes.io/denylist-source-range: \"127.0.0.1\"",
            )
            + &ingress_with(
                "broken",
                "/broken",
                "nginx.ingress.kubernetes.io/allowlist-source-range: \"127.0.0.0/8, office\"",
            )
            + &ingress_with("web", "/", "")),
    );
    let ingress = Ingress::builder().manifests(dir.path()).start();
    let cases = [
        ("/inside", "inside"),
        ("/outside", "<403>"),
        ("/denied", "<403>"),
        ("/broken", "<503>"),
        ("/", "web"),
    ];
    for (path, want) in cases {
        for version in ["--http1.1", "--http2-prior-knowledge"] {
            let got = curl_backend(&ingress, "shop.example.com", path, version).await;
            assert_eq!(got, want, "{version} {path}");
        }
    }
    assert_eq!(
        outside.served(),
        0,
        "nothing reached a backend outside its range"
    );
    assert_eq!(
        ingress.metric(
            "ingress_config_errors",
            &[("kind", "InvalidAnnotation"), ("severity", "error")]
        ),
        Some(1.0)
    );
    let out = check(dir.path(), &[]);
    let text = String::from_utf8_lossy(&out.stdout);
    let error = text
        .lines()
        .find(|l| l.starts_with("error") && l.contains("InvalidAnnotation"))
        .unwrap_or_else(|| panic!("no error line in\n{text}"));
    for part in [
        "Ingress t/broken",
        "allowlist-source-range",
        "\"office\"",
        "503",
    ] {
        assert!(error.contains(part), "{part:?} missing from {error}");
    }
    drop(ingress);

    // The global ranges (ingress-nginx's ConfigMap keys, as flags) hold where an Ingress sets
    // none of its own: the unannotated `/` is now refused, `/inside` keeps its own allow-list.
    let global = Ingress::builder()
        .manifests(dir.path())
        .args(["--whitelist-source-range", "10.0.0.0/8"])
        .start();
    for (path, want) in [("/", "<403>"), ("/inside", "inside")] {
        for version in ["--http1.1", "--http2-prior-knowledge"] {
            let got = curl_backend(&global, "shop.example.com", path, version).await;
            assert_eq!(got, want, "global allow-list: {version} {path}");
        }
    }
    drop(global);
    let denied = Ingress::builder()
        .manifests(dir.path())
        .args(["--denylist-source-range", "127.0.0.1"])
        .start();
    assert_eq!(
        curl_backend(&denied, "shop.example.com", "/", "--http1.1").await,
        "<403>"
    );
    // A value that does not parse stops the process at startup, naming the flag.
    let out = check(
        dir.path(),
        &["--whitelist-source-range", "10.0.0.0/8,office"],
    );
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--whitelist-source-range"), "{stderr}");
}
