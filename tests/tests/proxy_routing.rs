//! Ingress v1 routing through the real binary: hosts, paths, precedence, default backends,
//! class selection, and backend resolution, driven by a hyper client and by curl.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use ingress_tests::client::{self, get};
use ingress_tests::curl;
use ingress_tests::manifests::{ingress, one_route, service};
use ingress_tests::process::Ingress;
use ingress_tests::scratch::Scratch;
use ingress_tests::upstream::Backend;

#[tokio::test(flavor = "multi_thread")]
async fn hosts_paths_and_precedence() {
    let (a, b, c, d, e) = (
        Backend::start("a"),
        Backend::start("b"),
        Backend::start("c"),
        Backend::start("d"),
        Backend::start("e"),
    );
    let dir = Scratch::new("routing");
    let mut yaml = String::new();
    for (name, backend) in [("a", &a), ("b", &b), ("c", &c), ("d", &d), ("e", &e)] {
        yaml += &service("t", name, &[backend]);
    }
    yaml += &ingress(
        "t",
        "routes",
        &[
            ("foo.example.com", "/", "Prefix", "a"),
            ("foo.example.com", "/api", "Prefix", "b"),
            ("foo.example.com", "/api/exact", "Exact", "c"),
            (
                "foo.example.com",
                "/api/v[0-9]+/items",
                "ImplementationSpecific",
                "d",
            ),
            ("*.wild.example.com", "/", "Prefix", "c"),
            ("", "/", "Prefix", "e"),
        ],
    );
    dir.write("all.yaml", &yaml);
    let ingress = Ingress::start(dir.path());
    let http = client::http1();
    let cases = [
        ("foo.example.com", "/", "a"),
        ("foo.example.com", "/index.html", "a"),
        ("FOO.example.com:80", "/", "a"),
        ("foo.example.com", "/api", "b"),
        ("foo.example.com", "/api/", "b"),
        ("foo.example.com", "/apis", "a"),
        ("foo.example.com", "/api/exact", "c"),
        ("foo.example.com", "/api/exact/", "b"),
        ("foo.example.com", "/api/v2/items/7", "d"),
        ("foo.example.com", "/api/vx/items", "b"),
        ("foo.example.com", "/public/../api", "b"),
        ("x.wild.example.com", "/", "c"),
        ("y.x.wild.example.com", "/", "e"),
        ("wild.example.com", "/", "e"),
        ("unknown.example.com", "/anything", "e"),
    ];
    for (host, path, want) in cases {
        let reply = get(&http, &ingress.url(path), host).await;
        assert_eq!(reply.backend(), want, "{host}{path}: {}", reply.text());
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn default_backend_and_404() {
    let (fallback, hosted, web) = (
        Backend::start("fallback"),
        Backend::start("hosted"),
        Backend::start("web"),
    );
    let dir = Scratch::new("defaults");
    let mut yaml = service("t", "fallback", &[&fallback])
        + &service("t", "hosted", &[&hosted])
        + &service("t", "web", &[&web]);
    yaml += r#"
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: hosted, namespace: t}
spec:
  ingressClassName: ingress
  defaultBackend: {service: {name: hosted, port: {number: 80}}}
  rules:
  - host: hosted.example.com
    http:
      paths:
      - {path: /web, pathType: Prefix, backend: {service: {name: web, port: {number: 80}}}}
"#;
    dir.write("a.yaml", &yaml);
    let ingress = Ingress::start(dir.path());
    let http = client::http1();
    assert_eq!(
        get(&http, &ingress.url("/web/x"), "hosted.example.com")
            .await
            .backend(),
        "web"
    );
    assert_eq!(
        get(&http, &ingress.url("/other"), "hosted.example.com")
            .await
            .backend(),
        "hosted"
    );
    let not_found = get(&http, &ingress.url("/"), "nobody.example.com").await;
    assert_eq!(not_found.status, 404);
    assert!(
        not_found.body.len() < 64,
        "short 404 body: {}",
        not_found.text()
    );
    assert_eq!(
        not_found.headers.get("server").map(|v| v.as_bytes()),
        Some(&b"ingress"[..])
    );

    // An Ingress with only a defaultBackend catches every other host.
    dir.write(
        "catchall.yaml",
        "apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {name: catchall, namespace: t}\nspec:\n  ingressClassName: ingress\n  defaultBackend: {service: {name: fallback, port: {number: 80}}}\n",
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let reply = get(&http, &ingress.url("/"), "nobody.example.com").await;
        if reply.status == 200 {
            assert_eq!(reply.backend(), "fallback");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "catch-all never applied"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn ingress_class_selection() {
    let web = Backend::start("web");
    let dir = Scratch::new("classes");
    let mut yaml = service("t", "web", &[&web]);
    yaml += r#"
---
apiVersion: networking.k8s.io/v1
kind: IngressClass
metadata:
  name: fast
  annotations: {ingressclass.kubernetes.io/is-default-class: "true"}
spec: {controller: ingress.rs/controller}
---
apiVersion: networking.k8s.io/v1
kind: IngressClass
metadata: {name: nginx}
spec: {controller: k8s.io/ingress-nginx}
"#;
    let one = |name: &str, class_field: &str, annotation: &str| {
        format!(
            "---\napiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata:\n  name: {name}\n  namespace: t\n{annotation}spec:\n{class_field}  rules:\n  - host: {name}.example.com\n    http:\n      paths:\n      - {{path: /, pathType: Prefix, backend: {{service: {{name: web, port: {{number: 80}}}}}}}}\n"
        )
    };
    yaml += &one("by-class-object", "  ingressClassName: fast\n", "");
    yaml += &one("by-flag-name", "  ingressClassName: ingress\n", "");
    yaml += &one("by-default", "", "");
    yaml += &one(
        "by-legacy",
        "",
        "  annotations: {kubernetes.io/ingress.class: ingress}\n",
    );
    yaml += &one("other-class", "  ingressClassName: nginx\n", "");
    yaml += &one(
        "other-legacy",
        "",
        "  annotations: {kubernetes.io/ingress.class: nginx}\n",
    );
    dir.write("a.yaml", &yaml);
    let ingress = Ingress::start(dir.path());
    let http = client::http1();
    for (host, want) in [
        ("by-class-object", 200),
        ("by-flag-name", 200),
        ("by-default", 200),
        ("by-legacy", 200),
        ("other-class", 404),
        ("other-legacy", 404),
    ] {
        let reply = get(&http, &ingress.url("/"), &format!("{host}.example.com")).await;
        assert_eq!(reply.status, want, "{host}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn service_ports_by_name_and_number_use_endpoint_slices() {
    let (one, two) = (Backend::start("one"), Backend::start("two"));
    let dir = Scratch::new("ports");
    // The Service's ClusterIP (a TEST-NET address) must never be used: the proxy goes to the
    // endpoints. Port `metrics` maps by name to a different container port.
    let yaml = format!(
        r#"
apiVersion: v1
kind: Service
metadata: {{name: app, namespace: t}}
spec:
  clusterIP: 192.0.2.10
  ports: [{{name: http, port: 80}}, {{name: metrics, port: 9100}}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{name: app-1, namespace: t, labels: {{kubernetes.io/service-name: app}}}}
addressType: IPv4
ports: [{{name: http, port: {p1}}}, {{name: metrics, port: {p2}}}]
endpoints: [{{addresses: ["127.0.0.1"]}}]
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {{name: app, namespace: t}}
spec:
  ingressClassName: ingress
  rules:
  - host: app.example.com
    http:
      paths:
      - {{path: /, pathType: Prefix, backend: {{service: {{name: app, port: {{name: http}}}}}}}}
      - {{path: /metrics, pathType: Prefix, backend: {{service: {{name: app, port: {{number: 9100}}}}}}}}
"#,
        p1 = one.addr.port(),
        p2 = two.addr.port()
    );
    dir.write("a.yaml", &yaml);
    let ingress = Ingress::start(dir.path());
    let http = client::http1();
    assert_eq!(
        get(&http, &ingress.url("/"), "app.example.com")
            .await
            .backend(),
        "one"
    );
    assert_eq!(
        get(&http, &ingress.url("/metrics"), "app.example.com")
            .await
            .backend(),
        "two"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn load_spreads_across_endpoints() {
    let backends: Vec<Backend> = (0..3).map(|i| Backend::start(&format!("b{i}"))).collect();
    let dir = Scratch::new("spread");
    let refs: Vec<&Backend> = backends.iter().collect();
    dir.write(
        "a.yaml",
        &(service("t", "web", &refs)
            + &ingress("t", "web", &[("spread.example.com", "/", "Prefix", "web")])),
    );
    let ingress = Ingress::start(dir.path());
    let http = client::http1();
    for _ in 0..300 {
        assert_eq!(
            get(&http, &ingress.url("/"), "spread.example.com")
                .await
                .status,
            200
        );
    }
    for b in &backends {
        assert!(
            b.served() >= 50,
            "{} served only {} of 300",
            b.name,
            b.served()
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn external_name_resolves_through_dns() {
    let web = Backend::start("external");
    let dir = Scratch::new("extname");
    let yaml = format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: ext, namespace: t}}\nspec: {{type: ExternalName, externalName: localhost}}\n{}",
        ingress("t", "ext", &[("ext.example.com", "/", "Prefix", "ext")])
            .replace("number: 80", &format!("number: {}", web.addr.port()))
    );
    dir.write("a.yaml", &yaml);
    // ExternalName is opt-in; local backends are the manifests source's default.
    let ingress = Ingress::builder()
        .manifests(dir.path())
        .arg("--allow-external-name-services")
        .start();
    let reply = get(&client::http1(), &ingress.url("/"), "ext.example.com").await;
    assert_eq!(reply.backend(), "external", "{}", reply.text());
}

#[test]
fn curl_sees_routes_and_status_codes() {
    let web = Backend::start("curl-web");
    let dir = Scratch::new("curl");
    dir.write("a.yaml", &one_route("t", "web", "curl.example.com", &web));
    let ingress = Ingress::start(dir.path());
    let status_and_version = |host: &str, extra: &[&str]| -> String {
        let (host, url) = (format!("Host: {host}"), ingress.url("/"));
        let mut args = vec!["-H", host.as_str()];
        args.extend(extra);
        args.push(&url);
        curl::write_out("%{http_code} %{http_version}", &args)
    };
    assert_eq!(status_and_version("curl.example.com", &[]), "200 1.1");
    assert_eq!(
        status_and_version("curl.example.com", &["--http2-prior-knowledge"]),
        "200 2"
    );
    assert_eq!(status_and_version("nope.example.com", &[]), "404 1.1");
}
