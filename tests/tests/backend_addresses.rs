//! Backends that point back at this node, through the real binary in manifests mode with the
//! Kubernetes source's rule (`--allow-local-backends=false`): an ExternalName Service or an
//! EndpointSlice aimed at loopback must not let a request read the admin `/routes` through the
//! data plane (CVE-2021-25740 in ingress-nginx, CVE-2021-32783 in Contour).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use ingress_tests::client::{self, get};
use ingress_tests::manifests::{ingress as ingress_yaml, service_at};
use ingress_tests::process::{Ingress, check};
use ingress_tests::scratch::Scratch;

/// An ExternalName Service `name` for `external` on `port`, and an Ingress sending
/// `host`/ to it.
fn external_name(name: &str, external: &str, port: u16, host: &str) -> String {
    format!(
        "---\napiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: t}}\nspec: {{type: ExternalName, externalName: \"{external}\"}}\n{}",
        ingress_yaml("t", name, &[(host, "/", "Prefix", name)])
            .replace("number: 80", &format!("number: {port}"))
    )
}

/// What a GET of `/routes` on `host` through the proxy returns (status, and whether the body
/// is the admin routing table), over HTTP/1.1 (the fast path) and h2c (hyper's), from curl.
async fn through_the_proxy(ingress: &Ingress, host: &str) -> Vec<(u16, bool)> {
    let mut out = Vec::new();
    for version in ["--http1.1", "--http2-prior-knowledge"] {
        let result = tokio::process::Command::new("curl")
            .args(["-s", "--max-time", "10", "-w", "\n%{http_code}", version])
            .args(["-H", &format!("Host: {host}")])
            .arg(ingress.url("/routes"))
            .output()
            .await
            .expect("curl runs");
        let text = String::from_utf8_lossy(&result.stdout).into_owned();
        let (body, status) = text.rsplit_once('\n').unwrap_or(("", &text));
        out.push((status.trim().parse().unwrap_or(0), body.contains("ROUTES")));
    }
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn an_external_name_pointing_at_this_node_cannot_read_the_admin_routes() {
    let dir = Scratch::new("ssrf-external");
    let start = |extra: &[&str]| {
        Ingress::builder()
            .manifests(dir.path())
            .arg("--allow-external-name-services")
            .args(extra.iter().copied())
            .start()
    };
    // The admin port is not known until the process starts: start once to learn it, then
    // write manifests aimed at it (the directory is watched).
    let ingress = start(&["--allow-local-backends=false"]);
    let admin = ingress.admin.port();
    // `localhost` is refused when the snapshot is built; `127.1` and `2130706433` are not IP
    // literals to a parser but the system resolver turns both into 127.0.0.1, so they are
    // refused when resolved, on both HTTP paths.
    let mut yaml = external_name("named", "localhost", admin, "named.example.com");
    yaml += &external_name("short", "127.1", admin, "short.example.com");
    yaml += &external_name("decimal", "2130706433", admin, "decimal.example.com");
    dir.write("ssrf.yaml", &yaml);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !ingress
        .admin_get("/routes")
        .1
        .contains("decimal.example.com")
    {
        assert!(
            std::time::Instant::now() < deadline,
            "manifests never loaded"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(
        through_the_proxy(&ingress, "named.example.com").await,
        [(503, false), (503, false)]
    );
    for host in ["short.example.com", "decimal.example.com"] {
        assert_eq!(
            through_the_proxy(&ingress, host).await,
            [(502, false), (502, false)],
            "{host}"
        );
    }
    let refused = ingress
        .metric(
            "ingress_upstream_address_refused_total",
            &[("reason", "loopback")],
        )
        .unwrap_or_default();
    assert!(refused >= 4.0, "refusals counted: {refused}");
    let logs = ingress.logs();
    assert!(
        logs.contains("ExternalName resolved to an address refused as a backend"),
        "{logs}"
    );
    let routes = ingress.admin_get("/routes").1;
    assert!(
        routes.contains("BackendAddressRefused") && routes.contains("named"),
        "{routes}"
    );
    drop(ingress);

    // The control: with local backends allowed (the manifests default), the same manifests
    // do reach the admin port, so the refusal above is what stopped them.
    let open = start(&[]);
    let yaml = external_name("short", "127.1", open.admin.port(), "short.example.com");
    dir.write("ssrf.yaml", &yaml);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let got = through_the_proxy(&open, "short.example.com").await;
        if got == [(200, true), (200, true)] {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{got:?}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn external_name_services_are_off_unless_allowed() {
    let dir = Scratch::new("extname-off");
    dir.write(
        "a.yaml",
        &external_name("ext", "backend.example.com", 80, "ext.example.com"),
    );
    let ingress = Ingress::start(dir.path());
    let reply = get(&client::http1(), &ingress.url("/"), "ext.example.com").await;
    assert_eq!(reply.status, 503);
    assert!(
        ingress
            .admin_get("/routes")
            .1
            .contains("ExternalNameDisabled"),
        "diagnosed"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_endpoint_slice_at_loopback_is_refused_with_a_diagnostic() {
    let dir = Scratch::new("ssrf-slice");
    let ingress = Ingress::builder()
        .manifests(dir.path())
        .arg("--allow-local-backends=false")
        .start();
    let admin = ingress.admin;
    let yaml = service_at("t", "admin", &[admin])
        + &ingress_yaml(
            "t",
            "admin",
            &[("slice.example.com", "/", "Prefix", "admin")],
        );
    dir.write("a.yaml", &yaml);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !ingress.admin_get("/routes").1.contains("slice.example.com") {
        assert!(
            std::time::Instant::now() < deadline,
            "manifests never loaded"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(
        through_the_proxy(&ingress, "slice.example.com").await,
        [(503, false), (503, false)]
    );
    assert_eq!(
        ingress.metric(
            "ingress_config_errors",
            &[("kind", "BackendAddressRefused"), ("severity", "error")]
        ),
        Some(1.0)
    );
    // `ingress check` says the same, and fails.
    let out = check(dir.path(), &["--allow-local-backends=false"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    let line = text
        .lines()
        .find(|l| l.contains("BackendAddressRefused"))
        .unwrap_or_else(|| panic!("no diagnostic in\n{text}"));
    assert!(
        line.contains("Ingress t/admin") && line.contains(&admin.to_string()),
        "{line}"
    );
    // Without the flag, `check` applies the manifests default: served, no diagnostic.
    let out = check(dir.path(), &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}
