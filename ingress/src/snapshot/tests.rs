//! Snapshot building, table-driven from YAML the way a user writes it.

use std::path::Path;

use super::backend::Target;
use super::*;
use crate::source::manifests;

fn settings() -> BuildSettings {
    BuildSettings {
        class: ClassSelector { ingress_class: "ingress".into(), controller_class: "ingress.rs/controller".into() },
    }
}

fn store_of(yaml: &str) -> Store {
    let parsed = manifests::parse_file(Path::new("test.yaml"), yaml);
    assert!(parsed.diagnostics.is_empty(), "test manifests must parse: {:?}", parsed.diagnostics);
    let mut store = Store::default();
    for object in parsed.objects {
        store.apply(object);
    }
    store
}

fn build(yaml: &str) -> Snapshot {
    Snapshot::build(&store_of(yaml), &settings(), 1)
}

/// `host path` → "namespace/service:port" or "404".
fn routed(snapshot: &Snapshot, host: &str, path: &str) -> String {
    let host = (!host.is_empty()).then_some(host);
    match snapshot.route(host, path) {
        Some(route) => format!("{}:{}", route.backend.service, route.backend.port),
        None => "404".into(),
    }
}

fn kinds(snapshot: &Snapshot) -> Vec<DiagnosticKind> {
    snapshot.diagnostics.iter().map(|d| d.kind).collect()
}

const SERVICES: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: web, namespace: shop}
spec: {ports: [{name: http, port: 80}, {name: admin, port: 9000}]}
---
apiVersion: v1
kind: Service
metadata: {name: api, namespace: shop}
spec: {ports: [{port: 8080}]}
---
apiVersion: v1
kind: Service
metadata: {name: fallback, namespace: shop}
spec: {ports: [{port: 80}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-a, namespace: shop, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080}, {name: admin, port: 9090}]
endpoints:
- addresses: [10.0.0.1]
  conditions: {ready: true}
- addresses: [10.0.0.2]
  conditions: {ready: false}
- addresses: [10.0.0.3]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-b, namespace: shop, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints:
- addresses: [10.0.0.3]
- addresses: [10.0.0.4]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: api-x, namespace: shop, labels: {kubernetes.io/service-name: api}}
addressType: IPv4
ports: [{port: 3000}]
endpoints:
- addresses: [10.0.1.1]
"#;

const SHOP: &str = r#"
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: shop, namespace: shop, creationTimestamp: "2024-01-01T00:00:00Z"}
spec:
  ingressClassName: ingress
  rules:
  - host: shop.example.com
    http:
      paths:
      - {path: /, pathType: Prefix, backend: {service: {name: web, port: {name: http}}}}
      - {path: /api, pathType: Prefix, backend: {service: {name: api, port: {number: 8080}}}}
      - {path: /api/exact, pathType: Exact, backend: {service: {name: web, port: {number: 9000}}}}
  - host: "*.shop.example.com"
    http:
      paths:
      - {path: /, pathType: Prefix, backend: {service: {name: api, port: {number: 8080}}}}
"#;

#[test]
fn routes_hosts_and_paths() {
    let snap = build(&format!("{SERVICES}{SHOP}"));
    assert!(snap.diagnostics.is_empty(), "{:?}", snap.diagnostics);
    let cases = [
        ("shop.example.com", "/", "shop/web:http"),
        ("shop.example.com", "/cart", "shop/web:http"),
        ("shop.example.com", "/api", "shop/api:8080"),
        ("shop.example.com", "/api/", "shop/api:8080"),
        ("shop.example.com", "/apis", "shop/web:http"),
        ("shop.example.com", "/api/exact", "shop/web:9000"),
        ("shop.example.com", "/api/exact/", "shop/api:8080"),
        ("eu.shop.example.com", "/x", "shop/api:8080"),
        ("a.eu.shop.example.com", "/x", "404"),
        ("other.example.com", "/", "404"),
        ("", "/", "404"),
    ];
    for (host, path, want) in cases {
        assert_eq!(routed(&snap, host, path), want, "{host}{path}");
    }
}

#[test]
fn endpoints_are_ready_deduplicated_and_matched_by_port_name() {
    let snap = build(&format!("{SERVICES}{SHOP}"));
    let addrs = |host: &str, path: &str| -> Vec<String> {
        let route = snap.route(Some(host), path).expect("routed");
        route.backend.endpoints().iter().map(|e| e.addr.to_string()).collect()
    };
    assert_eq!(addrs("shop.example.com", "/"), ["10.0.0.1:8080", "10.0.0.3:8080", "10.0.0.4:8080"]);
    assert_eq!(addrs("shop.example.com", "/api/exact"), ["10.0.0.1:9090", "10.0.0.3:9090"]);
    assert_eq!(addrs("shop.example.com", "/api"), ["10.0.1.1:3000"]);
}

#[test]
fn broken_references_are_isolated_diagnostics() {
    let broken = r#"
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: broken, namespace: shop, creationTimestamp: "2024-02-01T00:00:00Z"}
spec:
  ingressClassName: ingress
  rules:
  - host: shop.example.com
    http:
      paths:
      - {path: /missing, pathType: Prefix, backend: {service: {name: nope, port: {number: 80}}}}
      - {path: /badport, pathType: Prefix, backend: {service: {name: web, port: {name: grpc}}}}
      - {path: "/re(", pathType: ImplementationSpecific, backend: {service: {name: web, port: {number: 80}}}}
      - {path: relative, pathType: Prefix, backend: {service: {name: web, port: {number: 80}}}}
      - {path: /api, pathType: Prefix, backend: {service: {name: web, port: {number: 80}}}}
      - {path: /ok, pathType: Exact, backend: {service: {name: web, port: {number: 80}}}}
  - host: Bad_Host
    http:
      paths:
      - {path: /, pathType: Prefix, backend: {service: {name: web, port: {number: 80}}}}
"#;
    let snap = build(&format!("{SERVICES}{SHOP}{broken}"));
    let mut got = kinds(&snap);
    got.sort();
    assert_eq!(
        got,
        vec![
            DiagnosticKind::InvalidHost,
            DiagnosticKind::InvalidPath,
            DiagnosticKind::InvalidRegex,
            DiagnosticKind::ConflictingRule,
            DiagnosticKind::ServiceNotFound,
            DiagnosticKind::ServicePortNotFound,
        ]
    );
    for d in &snap.diagnostics {
        assert_eq!(d.subject.ingress(), Some(&ObjectKey::new("shop", "broken")), "{d}");
    }
    // The older Ingress keeps /api; the broken one's good path is still served; the missing
    // Service still routes, to a backend with nothing behind it (503).
    assert_eq!(routed(&snap, "shop.example.com", "/api"), "shop/api:8080");
    assert_eq!(routed(&snap, "shop.example.com", "/ok"), "shop/web:80");
    let missing = snap.route(Some("shop.example.com"), "/missing").expect("routed");
    assert!(matches!(missing.backend.target, Target::Unavailable));
    assert_eq!(routed(&snap, "shop.example.com", "/cart"), "shop/web:http");
}

#[test]
fn default_backends() {
    let yaml = r#"
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: catchall, namespace: shop}
spec:
  ingressClassName: ingress
  defaultBackend: {service: {name: fallback, port: {number: 80}}}
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: hosted, namespace: shop}
spec:
  ingressClassName: ingress
  defaultBackend: {service: {name: api, port: {number: 8080}}}
  rules:
  - host: hosted.example.com
    http:
      paths:
      - {path: /web, pathType: Prefix, backend: {service: {name: web, port: {number: 80}}}}
"#;
    let snap = build(&format!("{SERVICES}{yaml}"));
    assert!(!snap.has_errors(), "{:?}", snap.diagnostics);
    let cases = [
        ("hosted.example.com", "/web", "shop/web:80"),
        ("hosted.example.com", "/other", "shop/api:8080"),
        ("unknown.example.com", "/", "shop/fallback:80"),
        ("", "/", "shop/fallback:80"),
    ];
    for (host, path, want) in cases {
        assert_eq!(routed(&snap, host, path), want, "{host}{path}");
    }
}

#[test]
fn host_less_rules_serve_every_other_host() {
    let yaml = r#"
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: any, namespace: shop}
spec:
  ingressClassName: ingress
  rules:
  - http:
      paths:
      - {path: /, pathType: Prefix, backend: {service: {name: fallback, port: {number: 80}}}}
"#;
    let snap = build(&format!("{SERVICES}{SHOP}{yaml}"));
    let cases = [
        ("whatever.example.com", "/x", "shop/fallback:80"),
        ("", "/x", "shop/fallback:80"),
        // A named host is answered by its own rules only.
        ("shop.example.com", "/x", "shop/web:http"),
    ];
    for (host, path, want) in cases {
        assert_eq!(routed(&snap, host, path), want, "{host}{path}");
    }
}

#[test]
fn other_classes_are_ignored_without_diagnostics() {
    let yaml = r#"
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: theirs, namespace: shop}
spec:
  ingressClassName: nginx
  rules:
  - host: theirs.example.com
    http:
      paths:
      - {path: /, pathType: Prefix, backend: {service: {name: nope, port: {number: 80}}}}
"#;
    let snap = build(&format!("{SERVICES}{yaml}"));
    assert!(snap.diagnostics.is_empty());
    assert!(snap.ingresses.is_empty());
    assert_eq!(routed(&snap, "theirs.example.com", "/"), "404");
}

#[test]
fn external_name_services_resolve_by_dns() {
    let yaml = r#"
---
apiVersion: v1
kind: Service
metadata: {name: ext, namespace: shop}
spec: {type: ExternalName, externalName: backend.internal.example}
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: ext, namespace: shop}
spec:
  ingressClassName: ingress
  rules:
  - host: ext.example.com
    http:
      paths:
      - {path: /, pathType: Prefix, backend: {service: {name: ext, port: {number: 8443}}}}
"#;
    let snap = build(yaml);
    assert!(snap.diagnostics.is_empty(), "{:?}", snap.diagnostics);
    let route = snap.route(Some("ext.example.com"), "/").expect("routed");
    match &route.backend.target {
        Target::ExternalName { host, port } => assert_eq!((host.as_str(), *port), ("backend.internal.example", 8443)),
        other => panic!("expected ExternalName, got {other:?}"),
    }
}

#[test]
fn no_ready_endpoints_is_a_warning() {
    let yaml = r#"
---
apiVersion: v1
kind: Service
metadata: {name: idle, namespace: shop}
spec: {ports: [{port: 80}]}
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: idle, namespace: shop}
spec:
  ingressClassName: ingress
  rules:
  - host: idle.example.com
    http:
      paths:
      - {path: /, pathType: Prefix, backend: {service: {name: idle, port: {number: 80}}}}
"#;
    let snap = build(yaml);
    assert_eq!(kinds(&snap), vec![DiagnosticKind::NoReadyEndpoints]);
    assert!(!snap.has_errors());
}

#[test]
fn build_is_deterministic() {
    let store = store_of(&format!("{SERVICES}{SHOP}"));
    let a = Snapshot::build(&store, &settings(), 1);
    let b = Snapshot::build(&store, &settings(), 1);
    assert_eq!(format!("{:?}", a.diagnostics), format!("{:?}", b.diagnostics));
    let hosts = |s: &Snapshot| s.hosts.iter().map(|(p, v)| format!("{p} {:?}", v.paths.rules().iter().map(|r| &r.path).collect::<Vec<_>>())).collect::<Vec<_>>();
    assert_eq!(hosts(&a), hosts(&b));
}
