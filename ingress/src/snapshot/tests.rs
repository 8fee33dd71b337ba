//! Snapshot building, table-driven from YAML the way a user writes it.

use std::path::Path;

use super::backend::Target;
use super::*;
use crate::source::manifests;

fn settings() -> BuildSettings {
    testing::settings()
}

use testing::HOST_ADDRESS;

fn store_of(yaml: &str) -> Store {
    let parsed = manifests::parse_file(Path::new("test.yaml"), yaml);
    assert!(
        parsed.diagnostics.is_empty(),
        "test manifests must parse: {:?}",
        parsed.diagnostics
    );
    let mut store = Store::default();
    for object in parsed.objects {
        store.apply(object);
    }
    store
}

fn build(yaml: &str) -> Snapshot {
    Snapshot::build(&store_of(yaml), &settings(), 1)
}

fn build_with(yaml: &str, settings: &BuildSettings) -> Snapshot {
    Snapshot::build(&store_of(yaml), settings, 1)
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
        route
            .backend
            .endpoints()
            .iter()
            .map(|e| e.addr.to_string())
            .collect()
    };
    assert_eq!(
        addrs("shop.example.com", "/"),
        ["10.0.0.1:8080", "10.0.0.3:8080", "10.0.0.4:8080"]
    );
    assert_eq!(
        addrs("shop.example.com", "/api/exact"),
        ["10.0.0.1:9090", "10.0.0.3:9090"]
    );
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
        assert_eq!(
            d.subject.ingress(),
            Some(&ObjectKey::new("shop", "broken")),
            "{d}"
        );
    }
    // The older Ingress keeps /api; the broken one's good path is still served; the missing
    // Service still routes, to a backend with nothing behind it (503).
    assert_eq!(routed(&snap, "shop.example.com", "/api"), "shop/api:8080");
    assert_eq!(routed(&snap, "shop.example.com", "/ok"), "shop/web:80");
    let missing = snap
        .route(Some("shop.example.com"), "/missing")
        .expect("routed");
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
    let mut allowed = settings();
    allowed.backends.allow_external_name = true;
    let snap = build_with(yaml, &allowed);
    assert!(snap.diagnostics.is_empty(), "{:?}", snap.diagnostics);
    let route = snap.route(Some("ext.example.com"), "/").expect("routed");
    match &route.backend.target {
        Target::ExternalName(name) => {
            assert_eq!(
                (name.host.as_str(), name.port),
                ("backend.internal.example", 8443)
            );
            assert_eq!(name.addresses, allowed.backends.addresses);
        }
        other => panic!("expected ExternalName, got {other:?}"),
    }
    // Off by default: the route stays (503) and the Ingress says why.
    let snap = build(yaml);
    assert_eq!(kinds(&snap), [DiagnosticKind::ExternalNameDisabled]);
    assert_eq!(snap.diagnostics[0].severity, Severity::Error);
    let route = snap.route(Some("ext.example.com"), "/").expect("routed");
    assert!(matches!(route.backend.target, Target::Unavailable));
}

#[test]
fn external_names_that_are_local_are_refused_when_the_build_can_tell() {
    let cases: &[(&str, bool, Option<DiagnosticKind>)] = &[
        (
            "localhost",
            false,
            Some(DiagnosticKind::BackendAddressRefused),
        ),
        (
            "LocalHost.",
            false,
            Some(DiagnosticKind::BackendAddressRefused),
        ),
        (
            "api.localhost",
            false,
            Some(DiagnosticKind::BackendAddressRefused),
        ),
        (
            "127.0.0.1",
            false,
            Some(DiagnosticKind::BackendAddressRefused),
        ),
        (
            "169.254.169.254",
            false,
            Some(DiagnosticKind::BackendAddressRefused),
        ),
        (
            HOST_ADDRESS,
            false,
            Some(DiagnosticKind::BackendAddressRefused),
        ),
        ("localhost", true, None),
        ("10.1.2.3", false, None),
        // Judged when resolved, by the proxy.
        ("metadata.google.internal", false, None),
    ];
    for (name, allow_local, want) in cases {
        let yaml = format!(
            "apiVersion: v1\nkind: Service\nmetadata: {{name: ext, namespace: shop}}\nspec: {{type: ExternalName, externalName: \"{name}\"}}\n---\napiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {{name: ext, namespace: shop}}\nspec:\n  ingressClassName: ingress\n  rules:\n  - host: ext.example.com\n    http: {{paths: [{{path: /, pathType: Prefix, backend: {{service: {{name: ext, port: {{number: 80}}}}}}}}]}}\n"
        );
        let mut settings = settings();
        settings.backends.allow_external_name = true;
        settings.backends.addresses.allow_local = *allow_local;
        let snap = build_with(&yaml, &settings);
        let route = snap.route(Some("ext.example.com"), "/").expect("routed");
        match want {
            Some(kind) => {
                assert_eq!(kinds(&snap), [*kind], "{name}");
                assert!(
                    matches!(route.backend.target, Target::Unavailable),
                    "{name}"
                );
            }
            None => {
                assert!(
                    snap.diagnostics.is_empty(),
                    "{name}: {:?}",
                    snap.diagnostics
                );
                assert!(
                    matches!(route.backend.target, Target::ExternalName(_)),
                    "{name}"
                );
            }
        }
    }
}

#[test]
fn local_endpoint_addresses_are_left_out_with_a_diagnostic() {
    let slice = |name: &str, family: &str, addrs: &[&str]| {
        let list: Vec<String> = addrs
            .iter()
            .map(|a| format!("- addresses: [\"{a}\"]"))
            .collect();
        format!(
            "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: {name}, namespace: shop, labels: {{kubernetes.io/service-name: {svc}}}}}\naddressType: {family}\nports: [{{name: http, port: 8080}}]\nendpoints:\n{}\n",
            list.join("\n"),
            svc = name.split('-').next().unwrap_or(name),
        )
    };
    let mut yaml = String::new();
    for svc in ["mixed", "local"] {
        yaml += &format!(
            "---\napiVersion: v1\nkind: Service\nmetadata: {{name: {svc}, namespace: shop}}\nspec: {{ports: [{{name: http, port: 80}}]}}\n"
        );
    }
    yaml += &slice(
        "mixed-v4",
        "IPv4",
        &[
            "10.0.0.1",
            "127.0.0.1",
            "169.254.169.254",
            "0.0.0.0",
            HOST_ADDRESS,
        ],
    );
    yaml += &slice(
        "mixed-v6",
        "IPv6",
        &["2001:db8::1", "::ffff:127.0.0.1", "::1", "fe80::1"],
    );
    yaml += &slice("local-v4", "IPv4", &["127.0.0.1"]);
    yaml += r#"
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: nodes, namespace: shop}
spec:
  ingressClassName: ingress
  rules:
  - host: nodes.example.com
    http:
      paths:
      - {path: /, pathType: Prefix, backend: {service: {name: mixed, port: {number: 80}}}}
      - {path: /local, pathType: Prefix, backend: {service: {name: local, port: {number: 80}}}}
"#;
    let snap = build(&yaml);
    let addrs = |path: &str| -> Vec<String> {
        let route = snap.route(Some("nodes.example.com"), path).expect("routed");
        route
            .backend
            .endpoints()
            .iter()
            .map(|e| e.addr.to_string())
            .collect()
    };
    assert_eq!(addrs("/"), ["10.0.0.1:8080", "[2001:db8::1]:8080"]);
    assert!(addrs("/local").is_empty(), "only refused endpoints: 503");
    let refused: Vec<&Diagnostic> = snap
        .diagnostics
        .iter()
        .filter(|d| d.kind == DiagnosticKind::BackendAddressRefused)
        .collect();
    assert_eq!(refused.len(), 2, "{:?}", snap.diagnostics);
    let mixed = refused
        .iter()
        .find(|d| d.message.contains("shop/mixed"))
        .expect("a diagnostic for mixed");
    assert_eq!(mixed.severity, Severity::Error);
    assert_eq!(
        mixed.subject,
        Subject::object(Kind::Ingress, &ObjectKey::new("shop", "nodes"))
    );
    for (addr, why) in [
        ("127.0.0.1:8080", "loopback"),
        ("169.254.169.254:8080", "link-local"),
        ("0.0.0.0:8080", "unspecified"),
        ("10.9.9.9:8080", "of this node"),
        ("[::ffff:127.0.0.1]:8080", "loopback"),
        ("[::1]:8080", "loopback"),
        ("[fe80::1]:8080", "link-local"),
    ] {
        assert!(
            mixed.message.contains(&format!("{addr} (a")) && mixed.message.contains(why),
            "{addr} {why}: {}",
            mixed.message
        );
    }
    assert!(
        kinds(&snap).contains(&DiagnosticKind::NoReadyEndpoints),
        "{:?}",
        snap.diagnostics
    );
    // The manifests source's default keeps them.
    let mut local = settings();
    local.backends.addresses.allow_local = true;
    let snap = build_with(&yaml, &local);
    assert!(snap.diagnostics.is_empty(), "{:?}", snap.diagnostics);
    let route = snap
        .route(Some("nodes.example.com"), "/local")
        .expect("routed");
    assert_eq!(route.backend.endpoints().len(), 1);
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
    assert_eq!(
        format!("{:?}", a.diagnostics),
        format!("{:?}", b.diagnostics)
    );
    let hosts = |s: &Snapshot| {
        s.hosts
            .iter()
            .map(|(p, v)| {
                format!(
                    "{p} {:?}",
                    v.paths.rules().iter().map(|r| &r.path).collect::<Vec<_>>()
                )
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(hosts(&a), hosts(&b));
}

mod tls_table {
    use super::*;
    use crate::snapshot::certs::CertSource;
    use k8s_openapi::ByteString;
    use k8s_openapi::api::core::v1::Secret;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn pem(names: &[&str], expired: bool) -> (String, String) {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let mut params =
            rcgen::CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>())
                .unwrap();
        params.not_before = rcgen::date_time_ymd(2020, 1, 1);
        params.not_after = if expired {
            rcgen::date_time_ymd(2021, 1, 1)
        } else {
            rcgen::date_time_ymd(2099, 1, 1)
        };
        (params.self_signed(&key).unwrap().pem(), key.serialize_pem())
    }

    fn secret(store: &mut Store, name: &str, crt: &str, key: &str) {
        let data = [
            ("tls.crt".to_string(), ByteString(crt.as_bytes().to_vec())),
            ("tls.key".to_string(), ByteString(key.as_bytes().to_vec())),
        ]
        .into();
        store.apply(crate::store::Object::Secret(Arc::new(Secret {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("shop".into()),
                ..Default::default()
            },
            type_: Some("kubernetes.io/tls".into()),
            data: Some(data),
            ..Default::default()
        })));
    }

    fn served(snap: &Snapshot, sni: &str) -> String {
        match &snap.tls.resolve(Some(sni)).expect("a certificate").source {
            CertSource::Secret(key) => key.to_string(),
            CertSource::SelfSigned => "default".into(),
        }
    }

    /// An alias is served with its host's certificate; a www-redirect name with its target's
    /// only when that certificate names it.
    #[test]
    fn aliases_and_www_names_get_their_hosts_certificates() {
        let yaml = format!(
            "{SERVICES}{}",
            r#"
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: shop
  namespace: shop
  annotations:
    nginx.ingress.kubernetes.io/server-alias: "store.example.com"
    nginx.ingress.kubernetes.io/from-to-www-redirect: "true"
spec:
  ingressClassName: ingress
  tls:
  - {hosts: [shop.example.com], secretName: both}
  rules:
  - host: shop.example.com
    http: {paths: [{path: /, pathType: Prefix, backend: {service: {name: web, port: {number: 80}}}}]}
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: blog
  namespace: shop
  annotations:
    nginx.ingress.kubernetes.io/from-to-www-redirect: "true"
spec:
  ingressClassName: ingress
  tls:
  - {hosts: [blog.example.com], secretName: bare}
  rules:
  - host: blog.example.com
    http: {paths: [{path: /, pathType: Prefix, backend: {service: {name: web, port: {number: 80}}}}]}
"#
        );
        let mut store = store_of(&yaml);
        let (both_crt, both_key) = pem(&["shop.example.com", "www.shop.example.com"], false);
        secret(&mut store, "both", &both_crt, &both_key);
        let (bare_crt, bare_key) = pem(&["blog.example.com"], false);
        secret(&mut store, "bare", &bare_crt, &bare_key);
        let snap = Snapshot::build(&store, &settings(), 1);
        let cases = [
            ("shop.example.com", "shop/both"),
            ("store.example.com", "shop/both"),
            ("www.shop.example.com", "shop/both"),
            ("blog.example.com", "shop/bare"),
            ("store.blog.example.com", "default"),
            ("www.blog.example.com", "default"),
        ];
        for (sni, want) in cases {
            assert_eq!(served(&snap, sni), want, "{sni}");
        }
    }

    #[test]
    fn certificates_by_sni_with_broken_ones_isolated() {
        let yaml = format!(
            "{SERVICES}{}",
            r#"
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: tls, namespace: shop, creationTimestamp: "2024-01-01T00:00:00Z"}
spec:
  ingressClassName: ingress
  tls:
  - {hosts: [good.example.com], secretName: good}
  - {hosts: ["*.wild.example.com"], secretName: wild}
  - {hosts: [missing.example.com], secretName: nope}
  - {hosts: [mismatch.example.com], secretName: mismatch}
  - {hosts: [expired.example.com], secretName: expired}
  - {hosts: [wrongname.example.com], secretName: good}
  - {hosts: [nosecret.example.com]}
  rules:
  - host: good.example.com
    http: {paths: [{path: /, pathType: Prefix, backend: {service: {name: web, port: {number: 80}}}}]}
  - host: plain.example.com
    http: {paths: [{path: /, pathType: Prefix, backend: {service: {name: web, port: {number: 80}}}}]}
  - host: "*.wild.example.com"
    http: {paths: [{path: /, pathType: Prefix, backend: {service: {name: web, port: {number: 80}}}}]}
"#
        );
        let mut store = store_of(&yaml);
        let (good_crt, good_key) = pem(&["good.example.com"], false);
        secret(&mut store, "good", &good_crt, &good_key);
        let (wild_crt, wild_key) = pem(&["*.wild.example.com"], false);
        secret(&mut store, "wild", &wild_crt, &wild_key);
        let (_, other_key) = pem(&["x"], false);
        secret(&mut store, "mismatch", &good_crt, &other_key);
        let (old_crt, old_key) = pem(&["expired.example.com"], true);
        secret(&mut store, "expired", &old_crt, &old_key);
        let snap = Snapshot::build(&store, &settings(), 1);

        let mut got = kinds(&snap);
        got.sort();
        assert_eq!(
            got,
            vec![
                DiagnosticKind::SecretNotFound,
                DiagnosticKind::CertificateKeyMismatch,
                DiagnosticKind::CertificateExpired,
                DiagnosticKind::CertificateHostMismatch,
            ],
            "{:#?}",
            snap.diagnostics
        );
        let cases = [
            ("good.example.com", "shop/good"),
            ("a.wild.example.com", "shop/wild"),
            ("b.a.wild.example.com", "default"),
            ("missing.example.com", "default"),
            ("mismatch.example.com", "default"),
            ("expired.example.com", "default"),
            ("wrongname.example.com", "default"),
            ("unknown.example.com", "default"),
        ];
        for (sni, want) in cases {
            assert_eq!(served(&snap, sni), want, "{sni}");
        }
        assert_eq!(
            snap.tls.loaded.len(),
            2,
            "good and wild are the loaded certificates in use"
        );
        // Hosts listed under spec.tls redirect to HTTPS; others do not.
        assert!(snap.route(Some("good.example.com"), "/").unwrap().tls);
        assert!(snap.route(Some("a.wild.example.com"), "/").unwrap().tls);
        assert!(!snap.route(Some("plain.example.com"), "/").unwrap().tls);
    }

    #[test]
    fn default_certificate_from_a_secret() {
        let mut store = store_of(SERVICES);
        let (crt, key) = pem(&["fallback.example.com"], false);
        secret(&mut store, "fallback", &crt, &key);
        let mut s = settings();
        s.tls.default_certificate = Some(ObjectKey::new("shop", "fallback"));
        let snap = Snapshot::build(&store, &s, 1);
        assert!(snap.diagnostics.is_empty(), "{:?}", snap.diagnostics);
        assert_eq!(served(&snap, "anything.example.com"), "shop/fallback");
        s.tls.default_certificate = Some(ObjectKey::new("shop", "absent"));
        let snap = Snapshot::build(&store, &s, 1);
        assert_eq!(kinds(&snap), vec![DiagnosticKind::SecretNotFound]);
        assert_eq!(served(&snap, "anything.example.com"), "default");
    }

    #[test]
    fn sni_policy_lists_named_hosts_and_catch_all() {
        let snap = build(&format!("{SERVICES}{SHOP}"));
        let names: Vec<&str> = snap.sni.names.keys().map(String::as_str).collect();
        assert_eq!(names, ["*.shop.example.com", "shop.example.com"]);
        assert!(!snap.sni.catch_all);
        let with_any = build(&format!(
            "{SERVICES}{SHOP}{}",
            "---\napiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {name: any, namespace: shop}\nspec:\n  ingressClassName: ingress\n  rules:\n  - http: {paths: [{path: /, pathType: Prefix, backend: {service: {name: web, port: {number: 80}}}}]}\n"
        ));
        assert!(with_any.sni.catch_all);
    }
}

#[test]
fn ssl_passthrough_routes_by_sni() {
    let yaml = format!(
        "{SERVICES}{}",
        r#"
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: pass
  namespace: shop
  annotations: {nginx.ingress.kubernetes.io/ssl-passthrough: "true"}
spec:
  ingressClassName: ingress
  rules:
  - host: db.example.com
    http: {paths: [{path: /, pathType: Prefix, backend: {service: {name: api, port: {number: 8080}}}}]}
  - host: "*.mtls.example.com"
    http:
      paths:
      - {path: /, pathType: Prefix, backend: {service: {name: web, port: {number: 80}}}}
      - {path: /admin, pathType: Prefix, backend: {service: {name: api, port: {number: 8080}}}}
  - http: {paths: [{path: /, pathType: Prefix, backend: {service: {name: web, port: {number: 80}}}}]}
"#
    );
    let snap = build(&yaml);
    let mut got = kinds(&snap);
    got.sort();
    assert_eq!(
        got,
        vec![
            DiagnosticKind::InvalidAnnotation,
            DiagnosticKind::PassthroughPathsIgnored
        ],
        "{:#?}",
        snap.diagnostics
    );
    let target = |sni: &str| {
        snap.passthrough
            .lookup_named(sni)
            .map(|r| format!("{}:{}", r.backend.service, r.backend.port))
    };
    assert_eq!(target("db.example.com").as_deref(), Some("shop/api:8080"));
    assert_eq!(target("a.mtls.example.com").as_deref(), Some("shop/web:80"));
    assert_eq!(target("other.example.com"), None);
    assert_eq!(
        snap.sni.lookup("db.example.com"),
        Some(sni::Action::Passthrough)
    );
    assert_eq!(
        snap.sni.lookup("x.mtls.example.com"),
        Some(sni::Action::Passthrough)
    );
    // The host-less rule still serves plain HTTP, so the gate admits every name.
    assert!(snap.sni.catch_all);
}

/// An Ingress `name` for `host` with paths `/admin` (to web) and, unless `admin_only`, `/` (to
/// api), carrying `annotations`.
fn annotated(name: &str, host: &str, annotations: &[(&str, &str)], admin_only: bool) -> String {
    let annotations: Vec<String> = annotations
        .iter()
        .map(|(k, v)| format!("    {k}: \"{v}\""))
        .collect();
    let annotations = if annotations.is_empty() {
        String::new()
    } else {
        format!("  annotations:\n{}\n", annotations.join("\n"))
    };
    let root = if admin_only {
        ""
    } else {
        "\n      - {path: /, pathType: Prefix, backend: {service: {name: api, port: {number: 8080}}}}"
    };
    format!(
        "---\napiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata:\n  name: {name}\n  namespace: shop\n  creationTimestamp: \"2024-01-0{n}T00:00:00Z\"\n{annotations}spec:\n  ingressClassName: ingress\n  rules:\n  - host: {host}\n    http:\n      paths:\n      - {{path: /admin, pathType: Prefix, backend: {{service: {{name: web, port: {{number: 80}}}}}}}}{root}\n",
        n = if admin_only { 1 } else { 2 },
    )
}

#[test]
fn unsupported_annotations_table() {
    use annotations::UnsupportedAccess::{Ignore, Refuse};
    let n = |s: &str| format!("nginx.ingress.kubernetes.io/{s}");
    let invalid_warning = (Severity::Warning, DiagnosticKind::InvalidAnnotation);
    // (annotations, policy, served, diagnostics as (severity, kind))
    let warn = (Severity::Warning, DiagnosticKind::UnsupportedAnnotation);
    let error = (Severity::Error, DiagnosticKind::UnsupportedAnnotation);
    let invalid = (Severity::Error, DiagnosticKind::InvalidAnnotation);
    let cases: Vec<(
        Vec<(String, &str)>,
        UnsupportedAccess,
        bool,
        Vec<(Severity, DiagnosticKind)>,
    )> = vec![
        (vec![], Refuse, true, vec![]),
        (vec![(n("ssl-redirect"), "false")], Refuse, true, vec![]),
        (vec![(n("mirror-target"), "/m")], Refuse, true, vec![warn]),
        (vec![(n("stream-snippet"), "x")], Refuse, true, vec![warn]),
        // A snippet outside the header subset is not applied, and says why.
        (
            vec![(n("configuration-snippet"), "x")],
            Refuse,
            true,
            vec![(Severity::Warning, DiagnosticKind::InvalidAnnotation)],
        ),
        (vec![(n("not-a-real-one"), "x")], Refuse, true, vec![warn]),
        (
            vec![("example.com/auth-url".into(), "x")],
            Refuse,
            true,
            vec![],
        ),
        // Source ranges are honoured: served (to the clients inside them), no diagnostic.
        (
            vec![(n("whitelist-source-range"), "10.0.0.0/8")],
            Refuse,
            true,
            vec![],
        ),
        (
            vec![(n("allowlist-source-range"), "10.0.0.0/8")],
            Refuse,
            true,
            vec![],
        ),
        (
            vec![(n("denylist-source-range"), "1.2.3.4/32")],
            Refuse,
            true,
            vec![],
        ),
        // A range that does not parse refuses the Ingress, whatever the policy for
        // unsupported ones: it is supported, and applied as written or not at all.
        (
            vec![(n("allowlist-source-range"), "10.0.0.0/8, office")],
            Ignore,
            false,
            vec![invalid],
        ),
        (
            vec![(n("auth-snippet"), "x"), (n("enable-modsecurity"), "true")],
            Refuse,
            false,
            vec![error, error],
        ),
        (
            vec![(n("auth-snippet"), "http://auth/")],
            Refuse,
            false,
            vec![error],
        ),
        // Honoured with auth-tls-secret; alone it does nothing, as in ingress-nginx.
        (
            vec![(n("auth-tls-verify-client"), "on")],
            Refuse,
            true,
            vec![invalid_warning],
        ),
        (vec![(n("limit-rate"), "100")], Refuse, true, vec![]),
        (vec![(n("limit-rps"), "5")], Refuse, true, vec![]),
        (
            vec![(n("global-rate-limit"), "100")],
            Refuse,
            false,
            vec![error],
        ),
        (
            vec![(n("enable-modsecurity"), "true")],
            Refuse,
            false,
            vec![error],
        ),
        (vec![(n("auth-snippet"), "x")], Refuse, false, vec![error]),
        (
            vec![(n("auth-from-the-future"), "x")],
            Refuse,
            false,
            vec![error],
        ),
        (
            vec![("ingress.rs/auth-snippet".into(), "http://auth/")],
            Refuse,
            false,
            vec![error],
        ),
        (
            vec![(n("auth-snippet"), "http://auth/")],
            Ignore,
            true,
            vec![warn],
        ),
        (
            vec![
                (n("enable-modsecurity"), "true"),
                (n("mirror-target"), "/m"),
            ],
            Refuse,
            false,
            vec![error, warn],
        ),
    ];
    for (pairs, policy, served, want) in cases {
        let pairs: Vec<(&str, &str)> = pairs.iter().map(|(k, v)| (k.as_str(), *v)).collect();
        let yaml = format!(
            "{SERVICES}{}",
            annotated("guarded", "shop.example.com", &pairs, false)
        );
        let mut settings = settings();
        settings.unsupported_access = policy;
        let snap = build_with(&yaml, &settings);
        let mut got: Vec<(Severity, DiagnosticKind)> = snap
            .diagnostics
            .iter()
            .map(|d| (d.severity, d.kind))
            .collect();
        let mut want = want.clone();
        got.sort();
        want.sort();
        assert_eq!(got, want, "{pairs:?} {policy:?}: {:?}", snap.diagnostics);
        for path in ["/admin", "/admin/x", "/", "/other"] {
            let route = snap.route(Some("shop.example.com"), path).expect("routed");
            let refused = route.policy.access.refused.is_some();
            assert_eq!(refused, !served, "{pairs:?} {policy:?} {path}");
            if let Some(reason) = &route.policy.access.refused {
                for (key, _) in &pairs {
                    let access =
                        annotations::registry::lookup(key.rsplit('/').next().unwrap_or_default())
                            .is_none_or(|a| {
                                a.category == annotations::registry::Category::AccessControl
                            });
                    assert_eq!(reason.contains(key), access, "{key} in {reason}");
                }
            }
        }
        // The kernel gate keeps admitting the name: clients get a 503, not a reset.
        assert!(snap.sni.names.contains_key("shop.example.com"));
    }
}

#[test]
fn a_refused_ingress_keeps_its_paths_claimed_and_spares_its_neighbours() {
    // `guarded` (older) protects /admin on shop.example.com; `public` (newer) serves / there,
    // and all of other.example.com.
    let guarded = annotated(
        "guarded",
        "shop.example.com",
        &[("nginx.ingress.kubernetes.io/auth-snippet", "http://auth/")],
        true,
    );
    let public = r#"
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: public, namespace: shop, creationTimestamp: "2024-02-01T00:00:00Z"}
spec:
  ingressClassName: ingress
  defaultBackend: {service: {name: fallback, port: {number: 80}}}
  rules:
  - host: shop.example.com
    http:
      paths:
      - {path: /, pathType: Prefix, backend: {service: {name: api, port: {number: 8080}}}}
  - host: other.example.com
    http:
      paths:
      - {path: /, pathType: Prefix, backend: {service: {name: web, port: {number: 80}}}}
"#;
    let snap = build(&format!("{SERVICES}{guarded}{public}"));
    let target = |host: &str, path: &str| {
        let route = snap.route(Some(host), path).expect("routed");
        let refused = route.policy.access.refused.is_some();
        (route.ingress.name.clone(), refused)
    };
    assert_eq!(
        target("shop.example.com", "/admin"),
        ("guarded".into(), true)
    );
    assert_eq!(
        target("shop.example.com", "/admin/x/../y"),
        ("guarded".into(), true)
    );
    assert_eq!(target("shop.example.com", "/"), ("public".into(), false));
    assert_eq!(
        target("shop.example.com", "/shop"),
        ("public".into(), false)
    );
    assert_eq!(
        target("other.example.com", "/admin"),
        ("public".into(), false)
    );
    let errors: Vec<&Diagnostic> = snap
        .diagnostics
        .iter()
        .filter(|d| d.severity == Severity::Error)
        .collect();
    assert_eq!(errors.len(), 1, "{:?}", snap.diagnostics);
    assert_eq!(errors[0].kind, DiagnosticKind::UnsupportedAnnotation);
    assert_eq!(
        errors[0].subject,
        Subject::object(Kind::Ingress, &ObjectKey::new("shop", "guarded"))
    );
    assert!(
        errors[0].message.contains("auth-snippet") && errors[0].message.contains("503"),
        "{}",
        errors[0].message
    );
}

#[test]
fn a_refused_passthrough_ingress_is_refused_too() {
    let yaml = annotated(
        "tunnel",
        "tunnel.example.com",
        &[
            ("nginx.ingress.kubernetes.io/ssl-passthrough", "true"),
            ("nginx.ingress.kubernetes.io/auth-snippet", "http://auth/"),
        ],
        true,
    );
    let snap = build(&format!("{SERVICES}{yaml}"));
    let route = snap
        .passthrough
        .lookup_named("tunnel.example.com")
        .expect("passthrough route");
    assert!(route.policy.access.refused.is_some());
}

/// An Ingress `name` (created on day `day`) with `annotations` and `paths` as (type, path,
/// service) on `host`, services from [`SERVICES`] on port 80/8080.
fn ingress_with(
    name: &str,
    day: u8,
    host: &str,
    annotations: &[(&str, &str)],
    paths: &[(&str, &str, &str)],
) -> String {
    let mut out = format!(
        "---\napiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata:\n  name: {name}\n  namespace: shop\n  creationTimestamp: \"2024-01-{day:02}T00:00:00Z\"\n"
    );
    if !annotations.is_empty() {
        out.push_str("  annotations:\n");
        for (k, v) in annotations {
            out.push_str(&format!("    nginx.ingress.kubernetes.io/{k}: {v:?}\n"));
        }
    }
    out.push_str(&format!(
        "spec:\n  ingressClassName: ingress\n  rules:\n  - host: {host}\n    http:\n      paths:\n"
    ));
    for (ty, path, service) in paths {
        let port = if *service == "api" { 8080 } else { 80 };
        out.push_str(&format!(
            "      - {{path: {path:?}, pathType: {ty}, backend: {{service: {{name: {service}, port: {{number: {port}}}}}}}}}\n"
        ));
    }
    out
}

/// ingress-nginx's regex mode: `use-regex` or `rewrite-target` on one Ingress of a host makes
/// every path of that host, from every Ingress, a case-insensitive prefix regex; other hosts
/// keep this project's Kubernetes semantics.
#[test]
fn use_regex_and_rewrite_target_turn_the_whole_host_to_regex_paths() {
    let i = "ImplementationSpecific";
    let yaml = [
        SERVICES.to_string(),
        ingress_with(
            "plain",
            1,
            "shop.example.com",
            &[],
            &[("Prefix", "/static", "web"), ("Exact", "/exact", "web")],
        ),
        ingress_with(
            "regex",
            2,
            "shop.example.com",
            &[("use-regex", "true")],
            &[(i, "/api/v[0-9]+", "api")],
        ),
        ingress_with(
            "other",
            3,
            "other.example.com",
            &[],
            &[("Prefix", "/static", "web"), ("Exact", "/exact", "web")],
        ),
        ingress_with(
            "rewritten",
            4,
            "rw.example.com",
            &[
                ("rewrite-target", "/$2"),
                ("x-forwarded-prefix", "/something"),
            ],
            &[
                (i, "/something(/|$)(.*)", "api"),
                ("Prefix", "/same", "web"),
            ],
        ),
        ingress_with(
            "plain-rw",
            5,
            "rw.example.com",
            &[],
            &[("Prefix", "/docs", "web")],
        ),
    ]
    .concat();
    let snap = build(&yaml);
    assert!(snap.diagnostics.is_empty(), "{:?}", snap.diagnostics);
    let web = "shop/web:80";
    let api = "shop/api:8080";
    // (host, path, routed to, sent upstream when rewritten)
    let cases = [
        ("shop.example.com", "/static/x", web, None),
        ("shop.example.com", "/STATIC/x", web, None),
        ("shop.example.com", "/staticfoo", web, None),
        ("shop.example.com", "/exact/more", web, None),
        ("shop.example.com", "/EXACT", web, None),
        ("shop.example.com", "/API/V2/users", api, None),
        ("shop.example.com", "/x/api/v2", "404", None),
        ("other.example.com", "/static/x", web, None),
        ("other.example.com", "/STATIC/x", "404", None),
        ("other.example.com", "/staticfoo", "404", None),
        ("other.example.com", "/exact/more", "404", None),
        ("rw.example.com", "/something", api, Some("/")),
        (
            "rw.example.com",
            "/something/new/page",
            api,
            Some("/new/page"),
        ),
        ("rw.example.com", "/SOMETHING/New", api, Some("/New")),
        // The other Ingress's path on the host becomes a regex too, without a rewrite.
        ("rw.example.com", "/DOCS/x", web, None),
        ("rw.example.com", "/docsy", web, None),
        // `/same` rewritten to /$2 with no group 2: `/`.
        ("rw.example.com", "/same/x", web, Some("/")),
    ];
    for (host, path, want, rewritten) in cases {
        assert_eq!(routed(&snap, host, path), want, "{host}{path}");
        if let Some(route) = snap.route(Some(host), path) {
            let got = route
                .policy
                .rewrite
                .target
                .as_ref()
                .and_then(|r| r.apply(path));
            assert_eq!(got.as_deref(), rewritten, "{host}{path}");
        }
    }
    let prefix = snap
        .route(Some("rw.example.com"), "/something/x")
        .and_then(|r| r.policy.rewrite.target.clone())
        .and_then(|r| r.forwarded_prefix);
    assert_eq!(prefix.as_deref(), Some("/something"));
    for (host, regex) in [
        ("shop.example.com", true),
        ("other.example.com", false),
        ("rw.example.com", true),
    ] {
        assert_eq!(
            snap.host(Some(host)).map(|h| h.nginx_regex),
            Some(regex),
            "{host}"
        );
    }
}

#[test]
fn path_annotation_problems_are_diagnosed_and_not_applied() {
    let i = "ImplementationSpecific";
    // (annotations, paths, diagnostics, whether the host is in regex mode)
    type Case<'a> = (
        Vec<(&'a str, &'a str)>,
        Vec<(&'a str, &'a str, &'a str)>,
        Vec<DiagnosticKind>,
        bool,
    );
    let cases: Vec<Case> = vec![
        (
            vec![("rewrite-target", "/$uri")],
            vec![("Prefix", "/a", "web")],
            vec![DiagnosticKind::InvalidAnnotation],
            false,
        ),
        (
            vec![("use-regex", "yes")],
            vec![("Prefix", "/a", "web")],
            vec![DiagnosticKind::InvalidAnnotation],
            false,
        ),
        // A rewrite-target equal to the path is no rewrite, and no regex mode.
        (
            vec![("rewrite-target", "/a")],
            vec![("Prefix", "/a", "web")],
            vec![],
            false,
        ),
        // x-forwarded-prefix alone does nothing in ingress-nginx: said so.
        (
            vec![("x-forwarded-prefix", "/a")],
            vec![("Prefix", "/a", "web")],
            vec![DiagnosticKind::InvalidAnnotation],
            false,
        ),
        // A path the regex syntax refuses: not served in regex mode.
        (
            vec![("use-regex", "true")],
            vec![(i, "/ok", "web"), ("Prefix", "/a(", "web")],
            vec![DiagnosticKind::InvalidRegex],
            true,
        ),
    ];
    for (annotations, paths, want, regex) in cases {
        let yaml = format!(
            "{SERVICES}{}",
            ingress_with("x", 1, "x.example.com", &annotations, &paths)
        );
        let snap = build(&yaml);
        assert_eq!(
            kinds(&snap),
            want,
            "{annotations:?}: {:?}",
            snap.diagnostics
        );
        let vhost = snap.host(Some("x.example.com")).expect("host");
        assert_eq!(vhost.nginx_regex, regex, "{annotations:?}");
        for rule in vhost.paths.rules() {
            assert!(
                rule.target.policy.rewrite.target.is_none(),
                "{annotations:?}"
            );
        }
    }
}

#[test]
fn app_root_is_the_hosts_and_the_oldest_ingress_wins() {
    let yaml = [
        SERVICES.to_string(),
        ingress_with(
            "first",
            1,
            "app.example.com",
            &[("app-root", "/app1")],
            &[("Prefix", "/", "web")],
        ),
        ingress_with(
            "second",
            2,
            "app.example.com",
            &[("app-root", "/app2")],
            &[("Prefix", "/api", "api")],
        ),
        ingress_with(
            "bad",
            3,
            "bad.example.com",
            &[("app-root", "app")],
            &[("Prefix", "/", "web")],
        ),
    ]
    .concat();
    let snap = build(&yaml);
    let app_root = |host: &str| {
        snap.host(Some(host))
            .and_then(|h| h.policy.app_root.as_deref().map(str::to_string))
    };
    assert_eq!(app_root("app.example.com").as_deref(), Some("/app1"));
    assert_eq!(app_root("bad.example.com"), None);
    let got: Vec<(Severity, DiagnosticKind, String)> = snap
        .diagnostics
        .iter()
        .map(|d| (d.severity, d.kind, d.subject.to_string()))
        .collect();
    assert_eq!(
        got,
        [
            (
                Severity::Error,
                DiagnosticKind::InvalidAnnotation,
                "Ingress shop/bad".to_string()
            ),
            (
                Severity::Warning,
                DiagnosticKind::ConflictingRule,
                "Ingress shop/second".to_string()
            ),
        ],
        "{:?}",
        snap.diagnostics
    );
}

/// `server-alias` serves more names as the same host; `from-to-www-redirect` adds a host that
/// only redirects; neither takes a name an Ingress declares, and the oldest claim wins.
#[test]
fn server_aliases_and_www_redirect_hosts() {
    let yaml = [
        SERVICES.to_string(),
        ingress_with(
            "aliased",
            1,
            "shop.example.com",
            &[
                (
                    "server-alias",
                    "store.example.com, *.shops.example.com, other.example.com",
                ),
                ("from-to-www-redirect", "true"),
            ],
            &[("Prefix", "/", "web")],
        ),
        ingress_with(
            "other",
            2,
            "other.example.com",
            &[],
            &[("Prefix", "/", "api")],
        ),
        ingress_with(
            "late-alias",
            3,
            "late.example.com",
            &[("server-alias", "store.example.com")],
            &[("Prefix", "/", "api")],
        ),
        ingress_with(
            "www-first",
            4,
            "www.blog.example.com",
            &[("from-to-www-redirect", "true")],
            &[("Prefix", "/", "web")],
        ),
        ingress_with(
            "taken",
            5,
            "taken.example.com",
            &[("from-to-www-redirect", "true")],
            &[("Prefix", "/", "web")],
        ),
        ingress_with(
            "www-taken",
            6,
            "www.taken.example.com",
            &[],
            &[("Prefix", "/", "api")],
        ),
    ]
    .concat();
    let snap = build(&yaml);
    // (host, routed to, www redirect target)
    let cases = [
        ("shop.example.com", "shop/web:80", None),
        ("store.example.com", "shop/web:80", None),
        ("a.shops.example.com", "shop/web:80", None),
        // Declared by an Ingress: never an alias.
        ("other.example.com", "shop/api:8080", None),
        ("www.shop.example.com", "404", Some("shop.example.com")),
        ("blog.example.com", "404", Some("www.blog.example.com")),
        ("www.blog.example.com", "shop/web:80", None),
        ("www.taken.example.com", "shop/api:8080", None),
        ("late.example.com", "shop/api:8080", None),
    ];
    for (host, want, www) in cases {
        assert_eq!(routed(&snap, host, "/x"), want, "{host}");
        let got = snap
            .host(Some(host))
            .and_then(|h| h.policy.www_redirect.as_deref().map(str::to_string));
        assert_eq!(got.as_deref(), www, "{host}");
    }
    for name in [
        "store.example.com",
        "*.shops.example.com",
        "www.shop.example.com",
        "blog.example.com",
    ] {
        assert_eq!(snap.sni.names.get(name), Some(&sni::Action::Pass), "{name}");
    }
    let got: Vec<(DiagnosticKind, String)> = snap
        .diagnostics
        .iter()
        .map(|d| (d.kind, d.subject.to_string()))
        .collect();
    assert_eq!(
        got,
        [
            (
                DiagnosticKind::ConflictingRule,
                "Ingress shop/late-alias".to_string()
            ),
            (
                DiagnosticKind::ConflictingRule,
                "Ingress shop/taken".to_string()
            ),
        ],
        "{:?}",
        snap.diagnostics
    );
}

#[test]
fn redirect_annotations_become_the_routes_redirect_policy() {
    let yaml = [
        SERVICES.to_string(),
        ingress_with(
            "moved",
            1,
            "moved.example.com",
            &[
                ("permanent-redirect", "https://new.example.com/landing"),
                ("permanent-redirect-code", "308"),
                ("preserve-trailing-slash", "true"),
            ],
            &[("Prefix", "/", "web")],
        ),
    ]
    .concat();
    let snap = build(&yaml);
    assert!(snap.diagnostics.is_empty(), "{:?}", snap.diagnostics);
    let route = snap.route(Some("moved.example.com"), "/a").expect("route");
    let redirect = &route.policy.redirect;
    assert_eq!(
        redirect.to_url,
        Some(annotations::UrlRedirect {
            code: 308,
            url: Arc::from("https://new.example.com/landing")
        })
    );
    assert!(redirect.preserve_trailing_slash);
    assert!(!redirect.to_https);
}

/// ingress-nginx's canary rules: a canary Ingress is the alternative of the main route with the
/// same host, path and type, whichever Ingress is older; it serves nothing by itself; one
/// canary per path; its other annotations have no effect.
#[test]
fn canaries_attach_to_the_main_route_of_the_same_host_path_and_type() {
    let canary = [("canary", "true"), ("canary-by-header", "X-Canary")];
    let yaml = [
        SERVICES.to_string(),
        // Older than its main: still a canary.
        ingress_with(
            "early-canary",
            1,
            "shop.example.com",
            &[canary[0], canary[1], ("rewrite-target", "/x")],
            &[
                ("Prefix", "/", "api"),
                ("Prefix", "/only-canary", "api"),
                ("Exact", "/info", "api"),
            ],
        ),
        ingress_with(
            "main",
            2,
            "shop.example.com",
            &[("permanent-redirect", "http://elsewhere.example")],
            &[("Prefix", "/", "web"), ("Prefix", "/info", "web")],
        ),
        ingress_with(
            "second-canary",
            3,
            "shop.example.com",
            &canary,
            &[("Prefix", "/", "fallback")],
        ),
        ingress_with(
            "lonely-canary",
            4,
            "lonely.example.com",
            &canary,
            &[("Prefix", "/", "api")],
        ),
        ingress_with(
            "self-canary",
            5,
            "shop.example.com",
            &canary,
            &[("Prefix", "/info", "web")],
        ),
    ]
    .concat();
    let snap = build(&yaml);
    let canary_of = |host: &str, path: &str| {
        snap.route(Some(host), path).and_then(|r| {
            r.policy
                .canary
                .as_ref()
                .map(|c| (c.ingress.name.clone(), c.backend.service.name.clone()))
        })
    };
    assert_eq!(
        canary_of("shop.example.com", "/"),
        Some(("early-canary".into(), "api".into()))
    );
    // The canary's annotations are not the route's: the main's redirect stays, no rewrite.
    let route = snap.route(Some("shop.example.com"), "/").expect("route");
    assert_eq!(route.ingress.name, "main");
    assert!(route.policy.redirect.to_url.is_some());
    assert!(route.policy.rewrite.target.is_none());
    assert!(
        !snap
            .host(Some("shop.example.com"))
            .expect("host")
            .nginx_regex
    );
    // The Exact /info of the canary does not match the main's Prefix /info.
    assert_eq!(canary_of("shop.example.com", "/info"), None);
    // A canary path without a main serves nothing: it falls to the main's /.
    assert_eq!(
        routed(&snap, "shop.example.com", "/only-canary"),
        "shop/web:80"
    );
    assert_eq!(routed(&snap, "lonely.example.com", "/"), "404");
    assert!(snap.host(Some("lonely.example.com")).is_none());
    let mut got: Vec<(DiagnosticKind, String)> = snap
        .diagnostics
        .iter()
        .map(|d| (d.kind, d.subject.to_string()))
        .collect();
    got.sort();
    assert_eq!(
        got,
        [
            (
                DiagnosticKind::ConflictingRule,
                "Ingress shop/second-canary".to_string()
            ),
            (
                DiagnosticKind::ConflictingRule,
                "Ingress shop/self-canary".to_string()
            ),
            (
                DiagnosticKind::NoReadyEndpoints,
                "Ingress shop/second-canary".to_string()
            ),
            (
                DiagnosticKind::UnsupportedAnnotation,
                "Ingress shop/early-canary".to_string()
            ),
            (
                DiagnosticKind::CanaryUnmatched,
                "Ingress shop/early-canary".to_string()
            ),
            (
                DiagnosticKind::CanaryUnmatched,
                "Ingress shop/early-canary".to_string()
            ),
            (
                DiagnosticKind::CanaryUnmatched,
                "Ingress shop/lonely-canary".to_string()
            ),
        ],
        "{:?}",
        snap.diagnostics
    );
}

#[test]
fn source_ranges_reach_every_route_of_the_ingress_and_passthrough() {
    let plain = annotated(
        "ranged",
        "shop.example.com",
        &[(
            "nginx.ingress.kubernetes.io/allowlist-source-range",
            "10.0.0.0/8",
        )],
        false,
    );
    let tunnel = annotated(
        "tunnel",
        "tunnel.example.com",
        &[
            ("nginx.ingress.kubernetes.io/ssl-passthrough", "true"),
            (
                "nginx.ingress.kubernetes.io/denylist-source-range",
                "192.0.2.0/24",
            ),
        ],
        true,
    );
    let snap = build(&format!("{SERVICES}{plain}{tunnel}"));
    let inside: std::net::IpAddr = "10.1.2.3".parse().unwrap();
    let outside: std::net::IpAddr = "192.0.2.7".parse().unwrap();
    for path in ["/admin", "/"] {
        let sources = &snap
            .route(Some("shop.example.com"), path)
            .expect("routed")
            .policy
            .access
            .sources;
        assert!(sources.admits(inside) && !sources.admits(outside), "{path}");
    }
    let tunnel = &snap
        .passthrough
        .lookup_named("tunnel.example.com")
        .expect("passthrough route")
        .policy
        .access
        .sources;
    assert!(tunnel.admits(inside) && !tunnel.admits(outside));
    assert!(
        snap.diagnostics
            .iter()
            .all(|d| d.kind == DiagnosticKind::PassthroughPathsIgnored),
        "{:?}",
        snap.diagnostics
    );
}

#[test]
fn affinity_cookie_path_defaults_to_the_routes_path() {
    let yaml = [
        SERVICES.to_string(),
        ingress_with(
            "sticky",
            1,
            "sticky.example.com",
            &[("affinity", "cookie")],
            &[
                ("Prefix", "/app", "web"),
                ("ImplementationSpecific", "/re(.*)", "web"),
            ],
        ),
        ingress_with(
            "pathed",
            2,
            "pathed.example.com",
            &[("affinity", "cookie"), ("session-cookie-path", "/p")],
            &[("Prefix", "/app", "web")],
        ),
    ]
    .concat();
    let snap = build(&yaml);
    assert!(snap.diagnostics.is_empty(), "{:?}", snap.diagnostics);
    let path_of = |host: &str, path: &str| {
        snap.route(Some(host), path)
            .and_then(|r| r.policy.upstream.affinity.clone())
            .and_then(|a| a.path.clone())
    };
    assert_eq!(
        path_of("sticky.example.com", "/app/x").as_deref(),
        Some("/app")
    );
    assert_eq!(path_of("sticky.example.com", "/rex").as_deref(), Some("/"));
    assert_eq!(path_of("pathed.example.com", "/app").as_deref(), Some("/p"));
}

#[test]
fn snippets_become_header_actions_only_with_the_flag() {
    let n = |s: &str| format!("nginx.ingress.kubernetes.io/{s}");
    let snippet = "more_set_headers 'X-Frame-Options: DENY';\nproxy_set_header X-Tenant acme;";
    let pairs = [(n("configuration-snippet"), snippet)];
    let pairs: Vec<(&str, &str)> = pairs.iter().map(|(k, v)| (k.as_str(), *v)).collect();
    let yaml = format!(
        "{SERVICES}{}",
        annotated("snip", "shop.example.com", &pairs, false)
    );
    // (--allow-snippet-annotations, headers applied, diagnostic)
    for (allow, applied, diagnostic) in [(true, true, None), (false, false, Some("disabled"))] {
        let mut settings = settings();
        settings.global.allow_snippets = allow;
        let snap = build_with(&yaml, &settings);
        let route = snap.route(Some("shop.example.com"), "/").expect("routed");
        assert_eq!(route.policy.response.headers.is_some(), applied, "{allow}");
        assert_eq!(
            route.policy.upstream.request_headers.is_some(),
            applied,
            "{allow}"
        );
        let messages: Vec<&str> = snap
            .diagnostics
            .iter()
            .filter(|d| d.kind == DiagnosticKind::InvalidAnnotation)
            .map(|d| d.message.as_str())
            .collect();
        match diagnostic {
            None => assert!(messages.is_empty(), "{messages:?}"),
            Some(want) => assert!(
                messages.len() == 1 && messages[0].contains(want),
                "{messages:?}"
            ),
        }
    }
}

#[test]
fn default_backend_is_the_services_first_port_or_an_error() {
    let n = |s: &str| format!("nginx.ingress.kubernetes.io/{s}");
    // (default-backend, the fallback's service and port, an InvalidAnnotation)
    let cases = [
        ("web", Some("shop/web:80"), false),
        ("api", Some("shop/api:8080"), false),
        ("missing", None, true),
    ];
    for (name, want, invalid) in cases {
        let key = n("default-backend");
        let pairs = [(key.as_str(), name)];
        let yaml = format!(
            "{SERVICES}{}",
            annotated("fb", "shop.example.com", &pairs, false)
        );
        let snap = build(&yaml);
        let route = snap.route(Some("shop.example.com"), "/").expect("routed");
        let got = route
            .policy
            .upstream
            .fallback
            .as_ref()
            .map(|f| format!("{}:{}", f.0.service, f.0.port));
        assert_eq!(got.as_deref(), want, "{name}");
        let has_invalid = snap
            .diagnostics
            .iter()
            .any(|d| d.kind == DiagnosticKind::InvalidAnnotation && d.message.contains(&key));
        assert_eq!(has_invalid, invalid, "{name}: {:?}", snap.diagnostics);
    }
}

/// ingress-nginx's precedence: flags are the defaults, the ConfigMap overrides them, an
/// Ingress's annotations override the ConfigMap.
#[test]
fn configmap_overrides_flags_and_annotations_override_the_configmap() {
    let config = |data: &str| {
        format!(
            "---\napiVersion: v1\nkind: ConfigMap\nmetadata: {{name: config, namespace: ingress}}\ndata: {data}\n"
        )
    };
    let own = annotated(
        "own",
        "own.example.com",
        &[
            ("nginx.ingress.kubernetes.io/proxy-body-size", "2m"),
            (
                "nginx.ingress.kubernetes.io/allowlist-source-range",
                "192.0.2.0/24",
            ),
        ],
        false,
    );
    let plain = annotated("plain", "plain.example.com", &[], false);
    let mut settings = settings();
    settings.config_map = Some(ObjectKey::new("ingress", "config"));
    let body = |snap: &Snapshot, host: &str| {
        snap.route(Some(host), "/")
            .expect("routed")
            .policy
            .upstream
            .max_body
    };
    let admits = |snap: &Snapshot, host: &str, ip: &str| {
        snap.route(Some(host), "/")
            .expect("routed")
            .policy
            .access
            .sources
            .admits(ip.parse().unwrap())
    };
    // No ConfigMap yet: the flags' values, and a warning naming it.
    let snap = build_with(&format!("{SERVICES}{own}{plain}"), &settings);
    assert_eq!(body(&snap, "plain.example.com"), Some(1 << 20));
    assert_eq!(kinds(&snap), vec![DiagnosticKind::ConfigMapNotFound]);
    // The ConfigMap overrides the flags; the annotations override the ConfigMap.
    let cm = config(
        "{proxy-body-size: 8m, whitelist-source-range: 10.0.0.0/8, hsts: \"false\", use-forwarded-headers: \"true\", no-such-key: x}",
    );
    let snap = build_with(&format!("{SERVICES}{own}{plain}{cm}"), &settings);
    assert_eq!(body(&snap, "plain.example.com"), Some(8 << 20));
    assert_eq!(body(&snap, "own.example.com"), Some(2 << 20));
    assert!(admits(&snap, "plain.example.com", "10.1.1.1"));
    assert!(!admits(&snap, "plain.example.com", "192.0.2.1"));
    assert!(admits(&snap, "own.example.com", "192.0.2.1"));
    assert!(!admits(&snap, "own.example.com", "10.1.1.1"));
    assert!(!snap.global.hsts.enabled && snap.global.hsts_header.is_none());
    assert!(snap.global.forwarded.enabled);
    assert_eq!(kinds(&snap), vec![DiagnosticKind::UnsupportedConfigKey]);
    // Another ConfigMap of the same name elsewhere is not the one.
    let other = config("{proxy-body-size: 8m}").replace("namespace: ingress", "namespace: other");
    let snap = build_with(&format!("{SERVICES}{own}{plain}{other}"), &settings);
    assert_eq!(body(&snap, "plain.example.com"), Some(1 << 20));
    // An invalid global allow-list refuses the routes that would use it, not the others.
    let cm = config("{whitelist-source-range: \"10.0.0.0/8, not-an-address\"}");
    let snap = build_with(&format!("{SERVICES}{own}{plain}{cm}"), &settings);
    let refused = |host: &str| {
        snap.route(Some(host), "/")
            .expect("routed")
            .policy
            .access
            .refused
            .is_some()
    };
    assert!(refused("plain.example.com"));
    assert!(!refused("own.example.com"));
    // ssl-redirect from the ConfigMap is the default of Ingresses without the annotation.
    let tls_ingress = |name: &str, annotations: &str| {
        format!(
            "---\napiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata:\n  name: {name}\n  namespace: shop\n  annotations: {{{annotations}}}\nspec:\n  ingressClassName: ingress\n  tls: [{{hosts: [{name}.example.com]}}]\n  rules:\n  - host: {name}.example.com\n    http:\n      paths:\n      - {{path: /, pathType: Prefix, backend: {{service: {{name: api, port: {{number: 8080}}}}}}}}\n"
        )
    };
    let yaml = format!(
        "{SERVICES}{}{}{}",
        tls_ingress("a", ""),
        tls_ingress("b", "nginx.ingress.kubernetes.io/ssl-redirect: \"true\""),
        config("{ssl-redirect: \"false\"}")
    );
    let snap = build_with(&yaml, &settings);
    let to_https = |host: &str| {
        snap.route(Some(host), "/")
            .expect("routed")
            .policy
            .redirect
            .to_https
    };
    assert!(!to_https("a.example.com"));
    assert!(to_https("b.example.com"));
}

#[test]
fn auth_tls_protects_every_path_of_its_hosts() {
    let ca = {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.self_signed(&key).unwrap().pem()
    };
    let indent: String = ca.lines().map(|l| format!("    {l}\n")).collect();
    let secret = format!(
        "---\napiVersion: v1\nkind: Secret\nmetadata: {{name: ca, namespace: shop}}\ntype: Opaque\nstringData:\n  ca.crt: |\n{indent}"
    );
    let n = |s: &str| format!("nginx.ingress.kubernetes.io/{s}");
    // (annotations, protected, refused, diagnostics)
    let cases: Vec<(Vec<(String, &str)>, bool, bool, Vec<DiagnosticKind>)> = vec![
        (vec![(n("auth-tls-secret"), "shop/ca")], true, false, vec![]),
        (vec![(n("auth-tls-secret"), "ca")], true, false, vec![]),
        (
            vec![(n("auth-tls-secret"), "shop/missing")],
            false,
            true,
            vec![DiagnosticKind::SecretNotFound],
        ),
        (
            vec![(n("auth-tls-secret"), "other/ca")],
            false,
            true,
            vec![DiagnosticKind::InvalidAnnotation],
        ),
        (
            vec![
                (n("auth-tls-secret"), "ca"),
                (n("auth-tls-match-cn"), "alice"),
            ],
            false,
            true,
            vec![DiagnosticKind::InvalidAnnotation],
        ),
        (
            vec![(n("auth-tls-secret"), "ca"), (n("ssl-passthrough"), "true")],
            false,
            true,
            vec![DiagnosticKind::InvalidAnnotation],
        ),
    ];
    for (pairs, protected, refused, want) in cases {
        let pairs: Vec<(&str, &str)> = pairs.iter().map(|(k, v)| (k.as_str(), *v)).collect();
        let yaml = format!(
            "{SERVICES}{secret}{}",
            annotated("guarded", "shop.example.com", &pairs, false)
        );
        let snap = build(&yaml);
        let got: Vec<DiagnosticKind> = snap
            .diagnostics
            .iter()
            .filter(|d| d.severity == Severity::Error)
            .map(|d| d.kind)
            .collect();
        assert_eq!(got, want, "{pairs:?}: {:?}", snap.diagnostics);
        if refused {
            let route = snap.route(Some("shop.example.com"), "/").expect("routed");
            assert!(route.policy.access.refused.is_some(), "{pairs:?}");
            let host = snap.host(Some("shop.example.com")).expect("host");
            assert!(
                host.policy.client_auth_error.is_some(),
                "{pairs:?}: the host is refused as a whole"
            );
            continue;
        }
        let host = snap.host(Some("shop.example.com")).expect("host");
        assert_eq!(host.policy.client_auth.is_some(), protected, "{pairs:?}");
    }
}

#[test]
fn limits_on_ssl_passthrough_refuse_the_ingress() {
    let n = |s: &str| format!("nginx.ingress.kubernetes.io/{s}");
    for limit in ["limit-rps", "limit-connections", "limit-rate"] {
        let (key, passthrough) = (n(limit), n("ssl-passthrough"));
        let pairs = [(key.as_str(), "5"), (passthrough.as_str(), "true")];
        let snap = build(&format!(
            "{SERVICES}{}",
            annotated("guarded", "shop.example.com", &pairs, false)
        ));
        assert!(
            snap.diagnostics
                .iter()
                .any(|d| d.severity == Severity::Error
                    && d.kind == DiagnosticKind::InvalidAnnotation
                    && d.message.contains("ssl-passthrough")),
            "{limit}: {:?}",
            snap.diagnostics
        );
        let route = snap
            .passthrough
            .lookup("shop.example.com")
            .expect("the passthrough host stays claimed");
        assert!(route.policy.access.refused.is_some(), "{limit}");
    }
}

/// `custom-http-errors`: the Ingress's list with its `default-backend` (else the global
/// default backend), the ConfigMap's list with the global one; without any error backend, a
/// warning and nothing replaced.
#[test]
fn custom_http_errors_lists_and_error_backends() {
    let n = |s: &str| format!("nginx.ingress.kubernetes.io/{s}");
    let (errors, backend, disable) = (
        n("custom-http-errors"),
        n("default-backend"),
        n("disable-proxy-intercept-errors"),
    );
    let catchall = r#"
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: catchall, namespace: shop}
spec:
  ingressClassName: ingress
  defaultBackend: {service: {name: fallback, port: {number: 80}}}
"#;
    // (annotations, catch-all Ingress, --default-backend-service, want: the route's own list
    // and its backend ("" for the global one), the global backend, a warning)
    #[allow(clippy::type_complexity)]
    let cases: Vec<(
        Vec<(&str, &str)>,
        bool,
        Option<&str>,
        Option<(&[u16], &str, bool)>,
        Option<&str>,
        bool,
    )> = vec![
        (
            vec![(&errors, "404,503")],
            false,
            None,
            Some((&[404, 503], "", true)),
            None,
            true,
        ),
        (
            vec![(&errors, "404,503")],
            true,
            None,
            Some((&[404, 503], "", true)),
            Some("shop/fallback:80"),
            false,
        ),
        (
            vec![(&errors, "404"), (&backend, "api")],
            false,
            None,
            Some((&[404], "shop/api:8080", true)),
            None,
            false,
        ),
        (
            vec![(&errors, "404"), (&disable, "true")],
            false,
            Some("shop/web"),
            Some((&[404], "", false)),
            Some("shop/web:80"),
            false,
        ),
        (
            vec![(&errors, "404,200")],
            true,
            None,
            None,
            Some("shop/fallback:80"),
            false,
        ),
        (vec![], true, None, None, Some("shop/fallback:80"), false),
        (vec![], false, Some("shop/missing"), None, None, true),
    ];
    for (i, (pairs, with_catchall, flag, want_own, want_global, warned)) in
        cases.into_iter().enumerate()
    {
        let yaml = format!(
            "{SERVICES}{}{}",
            annotated("errs", "shop.example.com", &pairs, false),
            if with_catchall { catchall } else { "" }
        );
        let mut settings = settings();
        settings.global.default_backend_service = flag.map(|f| {
            let (ns, name) = f.split_once('/').expect("ns/name");
            ObjectKey::new(ns, name)
        });
        let snap = build_with(&yaml, &settings);
        let route = snap.route(Some("shop.example.com"), "/").expect("routed");
        let own = route.policy.response.errors.as_ref().map(|e| {
            (
                &*e.codes,
                e.backend
                    .as_ref()
                    .map(|b| format!("{}:{}", b.0.service, b.0.port))
                    .unwrap_or_default(),
                e.intercept,
            )
        });
        let own = own.as_ref().map(|(c, b, i)| (*c, b.as_str(), *i));
        assert_eq!(own, want_own, "case {i}");
        let global = snap
            .global
            .error_backend
            .as_ref()
            .map(|b| format!("{}:{}", b.0.service, b.0.port));
        assert_eq!(global.as_deref(), want_global, "case {i}");
        let has_warning = snap.diagnostics.iter().any(|d| {
            d.severity == Severity::Warning
                && (d.message.contains("no error backend")
                    || d.message.contains("--default-backend-service"))
        });
        assert_eq!(has_warning, warned, "case {i}: {:?}", snap.diagnostics);
        // An invalid list is an error and not applied.
        let invalid = snap.diagnostics.iter().any(|d| {
            d.severity == Severity::Error
                && d.kind == DiagnosticKind::InvalidAnnotation
                && d.message.contains(&errors)
        });
        assert_eq!(invalid, i == 4, "case {i}: {:?}", snap.diagnostics);
    }
}

/// The gate judges a name's sources only when every route of its host has the same judgeable,
/// non-empty source policy, and only where the kernel sees the real client.
#[test]
fn the_gate_judges_sources_per_host_only_when_the_kernel_can_decide() {
    let allow = ("whitelist-source-range", "10.0.0.0/8");
    let other = ("whitelist-source-range", "10.0.0.0/16");
    let deny = ("denylist-source-range", "10.9.0.0/16");
    let pass = ("ssl-passthrough", "true");
    let any = ("satisfy", "any");
    let url = ("auth-url", "http://auth.shop.svc.cluster.local/check");
    let root = [("Prefix", "/", "web")];
    let admin = [("Prefix", "/admin", "api")];
    let with = |trust: bool, proxy_protocol: bool, real_ip_cidr: bool| {
        let mut s = settings();
        s.global.proxy_protocol = proxy_protocol;
        let mut forwarded = (*s.global.forwarded).clone();
        forwarded.enabled = trust;
        if real_ip_cidr {
            forwarded.trusted = Some(Arc::from(vec!["192.0.2.0/24".parse().unwrap()]));
        }
        s.global.forwarded = Arc::new(forwarded);
        s
    };
    let plain = |trust: bool, proxy_protocol: bool| with(trust, proxy_protocol, false);
    let ingresses = [
        // One Ingress, one policy: judged.
        ingress_with("a", 1, "a.test", &[allow, deny], &root),
        // Two Ingresses on one host with the same policy: judged; with different ones: not.
        ingress_with("b1", 2, "b.test", &[allow], &root),
        ingress_with("b2", 3, "b.test", &[allow], &admin),
        ingress_with("c1", 4, "c.test", &[allow], &root),
        ingress_with("c2", 5, "c.test", &[other], &admin),
        // A path without ranges beside one with them: left to the 403.
        ingress_with("d1", 6, "d.test", &[allow], &root),
        ingress_with("d2", 7, "d.test", &[], &admin),
        // satisfy any with authentication: a client outside may log in.
        ingress_with("e", 8, "e.test", &[allow, any, url], &root),
        // No ranges at all.
        ingress_with("f", 9, "f.test", &[], &root),
        // Passthrough: its one route decides.
        ingress_with("g", 10, "g.test", &[allow, pass], &root),
        ingress_with("h", 11, "\"*.h.test\"", &[deny], &root),
    ]
    .concat();
    let yaml = format!("{SERVICES}{ingresses}");
    let judged: &[&str] = &["*.h.test", "a.test", "b.test", "g.test"];
    // (trusted forwarded headers, PROXY protocol, proxy-real-ip-cidr, names judged): behind
    // PROXY protocol the kernel reads the client from the header, but only when every
    // header is believed.
    let cases: [(bool, bool, bool, &[&str]); 6] = [
        (false, false, false, judged),
        (true, false, false, &[]),
        (false, true, false, judged),
        (false, true, true, &[]),
        (true, true, false, &[]),
        (true, true, true, &[]),
    ];
    let inside: std::net::IpAddr = "10.1.2.3".parse().unwrap();
    let outside: std::net::IpAddr = "11.1.2.3".parse().unwrap();
    let denied: std::net::IpAddr = "10.9.0.1".parse().unwrap();
    for (trust, proxy_protocol, real_ip_cidr, want) in cases {
        let snap = build_with(&yaml, &with(trust, proxy_protocol, real_ip_cidr));
        let got: Vec<&str> = snap.sni.sources.ids.keys().map(String::as_str).collect();
        assert_eq!(
            got, want,
            "trust={trust} proxy_protocol={proxy_protocol} real_ip_cidr={real_ip_cidr}"
        );
        for name in want {
            let id = snap.sni.sources.ids[*name];
            assert_ne!(id, 0);
            assert!(snap.sni.sources.policies.contains_key(&id));
        }
        assert_eq!(
            snap.sni.sources.policies.len(),
            if want.is_empty() { 0 } else { 3 },
            "a.test, b.test and g.test share nothing but b.test and g.test's allow-list"
        );
    }
    let snap = build_with(&yaml, &plain(false, false));
    let refuses = |name: &str, client| snap.sni.source_refuses(name, client);
    assert!(!refuses("a.test", inside));
    assert!(refuses("a.test", outside));
    assert!(refuses("a.test", denied));
    assert!(refuses("g.test", outside));
    assert!(refuses("x.h.test", denied) && !refuses("x.h.test", outside));
    // Not judged by the gate: the access phase answers.
    assert!(!refuses("c.test", outside) && !refuses("d.test", outside));
    assert!(!refuses("e.test", outside) && !refuses("unknown.test", outside));
    assert_eq!(
        snap.sni.sources.ids["b.test"],
        snap.sni.sources.ids["g.test"]
    );
    // Equal stores give equal maps.
    assert_eq!(build_with(&yaml, &plain(false, false)).sni, snap.sni);
}

#[test]
fn configmap_headers_reach_routes_or_refuse_the_ingress() {
    let cm = |ns: &str, name: &str, data: &str| {
        format!(
            "---\napiVersion: v1\nkind: ConfigMap\nmetadata: {{name: {name}, namespace: {ns}}}\ndata: {data}\n"
        )
    };
    let global = cm(
        "ingress",
        "config",
        "{add-headers: ingress/add, proxy-set-headers: set, global-allowed-response-headers: \"X-Custom, X-Mine, Bad Name\"}",
    );
    let add = cm(
        "ingress",
        "add",
        "{X-Global: g, X-Custom: global, X-Client: $remote_addr}",
    );
    let set = cm(
        "ingress",
        "set",
        "{X-Tenant: acme, X-Seen-Host: $host, Host: evil}",
    );
    let custom = cm("shop", "custom", "{X-Custom: mine, X-Mine: \"$literal\"}");
    let not_allowed = cm("shop", "other", "{X-Custom: mine, X-Secret: s}");
    let crlf = cm("shop", "crlf", "{X-Custom: \"a\\r\\nX-Injected: 1\"}");
    let auth = cm("shop", "auth", "{X-Auth-Extra: $http_x_user, X-Static: s}");
    let n = |s: &str| format!("nginx.ingress.kubernetes.io/{s}");
    let mut settings = settings();
    settings.config_map = Some(ObjectKey::new("ingress", "config"));
    // (custom-headers, auth-proxy-set-headers, Ok(response literals) | Err(refusal reason))
    type Case = (
        Option<&'static str>,
        Option<&'static str>,
        Result<&'static [(&'static str, &'static str)], &'static str>,
    );
    let cases: &[Case] = &[
        (None, None, Ok(&[("x-custom", "global"), ("x-global", "g")])),
        (
            Some("shop/custom"),
            None,
            Ok(&[
                ("x-global", "g"),
                ("x-custom", "mine"),
                ("x-mine", "$literal"),
            ]),
        ),
        (
            Some("custom"),
            None,
            Ok(&[
                ("x-global", "g"),
                ("x-custom", "mine"),
                ("x-mine", "$literal"),
            ]),
        ),
        (Some("shop/missing"), None, Err("does not exist")),
        (Some("shop/other"), None, Err("X-Secret")),
        (Some("shop/crlf"), None, Err("not a valid value")),
        (Some("ingress/add"), None, Err("another namespace")),
        (
            None,
            Some("shop/auth"),
            Ok(&[("x-custom", "global"), ("x-global", "g")]),
        ),
        (None, Some("shop/missing"), Err("does not exist")),
    ];
    for (custom_headers, auth_headers, want) in cases {
        let mut pairs = Vec::new();
        if let Some(v) = custom_headers {
            pairs.push((n("custom-headers"), *v));
        }
        if let Some(v) = auth_headers {
            pairs.push((n("auth-url"), "http://auth.shop.svc/check"));
            pairs.push((n("auth-proxy-set-headers"), *v));
        }
        let pairs: Vec<(&str, &str)> = pairs.iter().map(|(k, v)| (k.as_str(), *v)).collect();
        let yaml = format!(
            "{SERVICES}{global}{add}{set}{custom}{not_allowed}{crlf}{auth}{}",
            annotated("h", "shop.example.com", &pairs, false)
        );
        let snap = build_with(&yaml, &settings);
        let case = format!("{custom_headers:?} {auth_headers:?}");
        let route = snap.route(Some("shop.example.com"), "/").expect("routed");
        // The global ConfigMap's problems: Host is the proxy's, "Bad Name" is no name.
        let config_warnings: Vec<&str> = snap
            .diagnostics
            .iter()
            .filter(|d| d.kind == DiagnosticKind::InvalidConfigValue)
            .map(|d| d.message.as_str())
            .collect();
        assert_eq!(config_warnings.len(), 2, "{case}: {config_warnings:?}");
        assert!(
            config_warnings.iter().any(|m| m.contains("\"Host\"")),
            "{case}: {config_warnings:?}"
        );
        match want {
            Ok(response) => {
                assert_eq!(route.policy.access.refused, None, "{case}");
                let edits = route.policy.response.headers.as_deref().expect("headers");
                let got: Vec<(&str, &str)> = edits
                    .replace
                    .iter()
                    .map(|(n, v)| (n.as_str(), v.as_ref().unwrap().to_str().unwrap()))
                    .collect();
                let mut got_sorted = got.clone();
                got_sorted.sort();
                let mut want_sorted = response.to_vec();
                want_sorted.sort();
                assert_eq!(got_sorted, want_sorted, "{case}");
                let templates = route.policy.response.header_templates.as_deref().unwrap();
                assert_eq!(templates.len(), 1, "{case}");
                assert_eq!(templates[0].0, "x-client");
                let request = route.policy.upstream.request_headers.as_deref().unwrap();
                assert_eq!(request.set.len(), 1, "{case}: Host is refused");
                assert_eq!(request.set[0].0, "x-tenant");
                let templates = route.policy.upstream.request_templates.as_deref().unwrap();
                assert_eq!(templates[0].0, "x-seen-host", "{case}");
                let auth_set = route
                    .policy
                    .access
                    .auth
                    .external
                    .as_ref()
                    .map(|e| e.proxy_set_headers.len());
                assert_eq!(auth_set, auth_headers.map(|_| 2), "{case}");
            }
            Err(reason) => {
                let refused = route.policy.access.refused.as_deref();
                assert!(
                    refused.is_some_and(|r| r.contains(reason)),
                    "{case}: {refused:?}"
                );
                let errors: Vec<&Diagnostic> = snap
                    .diagnostics
                    .iter()
                    .filter(|d| d.severity == crate::diagnostics::Severity::Error)
                    .collect();
                assert_eq!(errors.len(), 1, "{case}: {errors:?}");
                assert!(errors[0].message.contains(reason), "{case}: {errors:?}");
                assert_eq!(
                    errors[0].subject,
                    Subject::object(Kind::Ingress, &ObjectKey::new("shop", "h"))
                );
            }
        }
    }
    // auth-proxy-set-headers without auth-url: nothing to send them to, a warning.
    let pairs = [(n("auth-proxy-set-headers"), "shop/auth")];
    let pairs: Vec<(&str, &str)> = pairs.iter().map(|(k, v)| (k.as_str(), *v)).collect();
    let snap = build(&format!(
        "{SERVICES}{}",
        annotated("alone", "shop.example.com", &pairs, false)
    ));
    let route = snap.route(Some("shop.example.com"), "/").expect("routed");
    assert_eq!(route.policy.access.refused, None);
    let warnings: Vec<&str> = snap
        .diagnostics
        .iter()
        .filter(|d| d.kind == DiagnosticKind::InvalidAnnotation)
        .map(|d| d.message.as_str())
        .collect();
    assert_eq!(
        warnings,
        ["nginx.ingress.kubernetes.io/auth-proxy-set-headers: has no effect without auth-url"]
    );
    // Without the referenced ConfigMaps: a warning on the global one each, and nothing set.
    let snap = build_with(&format!("{SERVICES}{global}"), &settings);
    let missing = snap
        .diagnostics
        .iter()
        .filter(|d| d.kind == DiagnosticKind::ConfigMapNotFound)
        .count();
    assert_eq!(missing, 2, "{:?}", snap.diagnostics);
}

/// The ConfigMaps a build reads, which the pipeline rebuilds for (and no other).
#[test]
fn referenced_config_maps_are_the_global_one_and_what_it_and_ingresses_name() {
    let n = |s: &str| format!("nginx.ingress.kubernetes.io/{s}");
    let pairs = [
        (n("custom-headers"), "custom"),
        (n("auth-url"), "http://auth/"),
        (n("auth-proxy-set-headers"), "shop/auth"),
    ];
    let pairs: Vec<(&str, &str)> = pairs.iter().map(|(k, v)| (k.as_str(), *v)).collect();
    let cross = [(n("custom-headers"), "other/custom")];
    let cross: Vec<(&str, &str)> = cross.iter().map(|(k, v)| (k.as_str(), *v)).collect();
    let global = "---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: config, namespace: ingress}\ndata: {add-headers: add, proxy-set-headers: shop/set}\n";
    let store = store_of(&format!(
        "{SERVICES}{global}{}{}",
        annotated("a", "a.example.com", &pairs, false),
        annotated("b", "b.example.com", &cross, false),
    ));
    let names = |config_map: Option<&ObjectKey>| -> Vec<String> {
        referenced_config_maps(&store, config_map)
            .iter()
            .map(ToString::to_string)
            .collect()
    };
    // Another namespace's ConfigMap is never read for an annotation, so it is not followed.
    assert_eq!(names(None), ["shop/auth", "shop/custom"]);
    assert_eq!(
        names(Some(&ObjectKey::new("ingress", "config"))),
        [
            "ingress/add",
            "ingress/config",
            "shop/auth",
            "shop/custom",
            "shop/set"
        ]
    );
}

/// ingress-nginx's global auth (`global-auth-url`): every route gets the ConfigMap's auth
/// service unless its Ingress has its own `auth-url` (which wins) or sets
/// `enable-global-auth: "false"`, or its path (as written) starts with a `no-auth-locations`
/// entry, which drops the Ingress's own external auth too, as the template does. Settings that
/// cannot be honoured refuse the routes that would get global auth, and only those.
#[test]
fn global_auth_reaches_every_route_but_the_ones_ingress_nginx_exempts() {
    let config = |data: &str| {
        format!(
            "---\napiVersion: v1\nkind: ConfigMap\nmetadata: {{name: config, namespace: ingress}}\ndata: {data}\n"
        )
    };
    const GLOBAL: &str = "http://global.example/check";
    const OWN: &str = "http://own.example/check";
    let ingresses = [
        ingress_with(
            "plain",
            1,
            "plain.example.com",
            &[],
            &[
                ("Prefix", "/", "web"),
                ("Prefix", "/bar", "web"),
                ("Exact", "/.well-known/acme-challenge/tok", "web"),
                ("Prefix", "/.well-known/acme-challenge-old", "web"),
            ],
        ),
        ingress_with(
            "own",
            2,
            "own.example.com",
            &[("auth-url", OWN)],
            &[
                ("Prefix", "/", "web"),
                ("Prefix", "/.well-known/acme-challenge", "web"),
            ],
        ),
        ingress_with(
            "off",
            3,
            "off.example.com",
            &[("enable-global-auth", "false")],
            &[("Prefix", "/", "web")],
        ),
        ingress_with(
            "typo",
            4,
            "typo.example.com",
            &[("enable-global-auth", "nope")],
            &[("Prefix", "/", "web")],
        ),
        ingress_with(
            "on",
            5,
            "on.example.com",
            &[("enable-global-auth", "true")],
            &[("Prefix", "/", "web")],
        ),
    ]
    .concat();
    let mut settings = settings();
    settings.config_map = Some(ObjectKey::new("ingress", "config"));
    let url = format!("global-auth-url: {GLOBAL:?}");
    // (ConfigMap data, [(host, request path, what the route gets)])
    let cases: Vec<(String, Vec<(&str, &str, &str)>)> = vec![
        (
            "{}".into(),
            vec![
                ("plain.example.com", "/", "none"),
                ("own.example.com", "/", "own"),
                ("off.example.com", "/", "none"),
            ],
        ),
        (
            format!("{{{url}}}"),
            vec![
                ("plain.example.com", "/", "global"),
                ("plain.example.com", "/bar/x", "global"),
                // The ACME default: the rule's path is under it, not the request's.
                (
                    "plain.example.com",
                    "/.well-known/acme-challenge/tok",
                    "none",
                ),
                (
                    "plain.example.com",
                    "/.well-known/acme-challenge-old/x",
                    "none",
                ),
                (
                    "plain.example.com",
                    "/.well-known/acme-challenge/other",
                    "global",
                ),
                ("own.example.com", "/", "own"),
                ("own.example.com", "/.well-known/acme-challenge/x", "none"),
                ("off.example.com", "/", "none"),
                ("typo.example.com", "/", "global"),
                ("on.example.com", "/", "global"),
            ],
        ),
        (
            format!("{{{url}, no-auth-locations: \"/bar, ,/.well-known/acme-challenge-old\"}}"),
            vec![
                ("plain.example.com", "/", "global"),
                ("plain.example.com", "/bar", "none"),
                (
                    "plain.example.com",
                    "/.well-known/acme-challenge/tok",
                    "global",
                ),
                (
                    "plain.example.com",
                    "/.well-known/acme-challenge-old",
                    "none",
                ),
                ("own.example.com", "/.well-known/acme-challenge/x", "own"),
            ],
        ),
        (
            format!("{{{url}, no-auth-locations: \"\"}}"),
            vec![(
                "plain.example.com",
                "/.well-known/acme-challenge/tok",
                "global",
            )],
        ),
        (
            "{global-auth-url: \"\", global-auth-method: nonsense}".into(),
            vec![("plain.example.com", "/", "none")],
        ),
        // Not honoured as written: refused, except where global auth would not apply.
        (
            "{global-auth-url: \"global.example/check\"}".into(),
            vec![
                ("plain.example.com", "/", "refused"),
                (
                    "plain.example.com",
                    "/.well-known/acme-challenge/tok",
                    "none",
                ),
                ("own.example.com", "/", "own"),
                ("off.example.com", "/", "none"),
            ],
        ),
        (
            format!("{{{url}, global-auth-method: get}}"),
            vec![("plain.example.com", "/", "refused")],
        ),
        (
            format!("{{{url}, global-auth-cache-duration: forever}}"),
            vec![("typo.example.com", "/", "refused")],
        ),
        (
            format!("{{{url}, global-auth-snippet: \"proxy_set_header A b;\"}}"),
            vec![
                ("plain.example.com", "/", "refused"),
                ("own.example.com", "/", "own"),
            ],
        ),
    ];
    for (data, routes) in cases {
        let snap = build_with(
            &format!("{SERVICES}{ingresses}{}", config(&data)),
            &settings,
        );
        for (host, path, want) in routes {
            let route = snap.route(Some(host), path).expect("routed");
            let access = &route.policy.access;
            let got = match (&access.refused, &access.auth.external) {
                (Some(_), _) => "refused",
                (None, None) => "none",
                (None, Some(e)) if e.url.as_str() == GLOBAL => "global",
                (None, Some(e)) if e.url.as_str() == OWN => "own",
                (None, Some(e)) => panic!("{data} {host}{path}: {}", e.url.as_str()),
            };
            assert_eq!(got, want, "{data} {host}{path}: {:?}", snap.diagnostics);
        }
        let typo = snap.diagnostics.iter().any(|d| {
            d.kind == DiagnosticKind::InvalidAnnotation && d.message.contains("enable-global-auth")
        });
        assert!(typo, "{data}: the typo is reported");
    }
    // The diagnostics on the ConfigMap: an error for what refuses, naming the key.
    let snap = build_with(
        &format!(
            "{SERVICES}{ingresses}{}",
            config(&format!("{{{url}, global-auth-method: get}}"))
        ),
        &settings,
    );
    let errors: Vec<_> = snap
        .diagnostics
        .iter()
        .filter(|d| d.severity == Severity::Error)
        .collect();
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(errors[0].kind, DiagnosticKind::InvalidConfigValue);
    assert!(
        errors[0].message.starts_with("global-auth-method: "),
        "{errors:?}"
    );
    // With --unsupported-access-annotations=ignore, a snippet is a warning and global auth
    // applies without it.
    settings.unsupported_access = UnsupportedAccess::Ignore;
    let snap = build_with(
        &format!(
            "{SERVICES}{ingresses}{}",
            config(&format!("{{{url}, global-auth-snippet: x}}"))
        ),
        &settings,
    );
    let route = snap.route(Some("plain.example.com"), "/").expect("routed");
    assert!(route.policy.access.refused.is_none());
    assert_eq!(
        route
            .policy
            .access
            .auth
            .external
            .as_ref()
            .map(|e| e.url.as_str()),
        Some(GLOBAL)
    );
}
