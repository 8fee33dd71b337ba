//! TLS to upstreams through the real binary: `backend-protocol: HTTPS` and `appProtocol: https`,
//! `proxy-ssl-verify` against the CA of `proxy-ssl-secret`, `proxy-ssl-name` and
//! `proxy-ssl-server-name`, a client certificate for mTLS to the backend, session resumption,
//! and the failures (plaintext to a TLS port, an expired certificate, a missing client
//! certificate): 502, a log line, a metric label, and the other routes untouched. Over HTTP/1.1
//! (the proxy's own path) and h2c (hyper's).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use ingress_tests::https_upstream::{HttpsBackend, HttpsOptions};
use ingress_tests::manifests::service_at;
use ingress_tests::pki::{Ca, KeyFormat, KeyKind, secret_yaml_with_ca};
use ingress_tests::process::Ingress;
use ingress_tests::scratch::Scratch;
use ingress_tests::upstream::{Backend, Echo};

/// An Ingress `name` sending `host`/ to Service `service` port 80, with `annotations`.
fn ingress(name: &str, host: &str, service: &str, annotations: &[(&str, &str)]) -> String {
    let annotations: String = annotations
        .iter()
        .map(|(k, v)| format!("    nginx.ingress.kubernetes.io/{k}: \"{v}\"\n"))
        .collect();
    let annotations = if annotations.is_empty() {
        String::new()
    } else {
        format!("  annotations:\n{annotations}")
    };
    format!(
        "---\napiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata:\n  name: {name}\n  namespace: t\n{annotations}spec:\n  ingressClassName: ingress\n  rules:\n  - host: {host}\n    http:\n      paths:\n      - {{path: /, pathType: Prefix, backend: {{service: {{name: {service}, port: {{number: 80}}}}}}}}\n"
    )
}

/// What curl got: the status and the body.
struct Reply {
    status: u16,
    body: String,
}

impl Reply {
    fn text(&self) -> &str {
        &self.body
    }

    fn backend(&self) -> String {
        serde_json::from_str::<Echo>(&self.body)
            .map(|e| e.backend)
            .unwrap_or_else(|_| format!("<{}>", self.status))
    }
}

/// Both client paths, from curl: HTTP/1.1 (the proxy's own) and h2c (hyper's).
async fn both(ingress: &Ingress, host: &str) -> [Reply; 2] {
    [
        curl(ingress, host, "--http1.1").await,
        curl(ingress, host, "--http2-prior-knowledge").await,
    ]
}

async fn curl(ingress: &Ingress, host: &str, version: &str) -> Reply {
    let out = tokio::process::Command::new("curl")
        .args(["-s", "--max-time", "10", "-w", "\n%{http_code}", version])
        .args(["-H", &format!("Host: {host}")])
        .arg(ingress.url("/"))
        .output()
        .await
        .expect("curl runs");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, status) = text.rsplit_once('\n').unwrap_or(("", &text));
    Reply {
        status: status.trim().parse().unwrap_or(0),
        body: body.to_string(),
    }
}

async fn wait_for_route(ingress: &Ingress, host: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !ingress.admin_get("/routes").1.contains(host) {
        assert!(Instant::now() < deadline, "{host} never routed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn https_upstreams_verified_named_and_failing_cleanly() {
    let ca = Ca::new("upstream CA");
    let good = ca.server("secure.t.svc", &["secure.t.svc", "backend.example"]);
    let expired = ca.leaf(
        "stale.t.svc",
        &["stale.t.svc"],
        KeyKind::EcdsaP256,
        KeyFormat::Pkcs8,
        true,
    );
    let secure = HttpsBackend::start("secure", &good, HttpsOptions::default());
    let stale = HttpsBackend::start("stale", &expired, HttpsOptions::default());
    let plain = Backend::start("plain");

    let dir = Scratch::new("upstream-tls");
    let mut yaml = String::new();
    yaml += &service_at("t", "secure", &[secure.addr]);
    yaml += &service_at("t", "stale", &[stale.addr]);
    yaml += &service_at("t", "plain", &[plain.addr]);
    // Only the CA: tls.crt/tls.key here are the CA's own leaf, presented as a client
    // certificate that these upstreams do not ask for.
    let client = ca.server("proxy", &["proxy"]);
    yaml += &secret_yaml_with_ca("t", "upstream-ca", &client.chain, &client.key, &ca.pem);
    // Verification off (the default): any certificate, no SNI.
    yaml += &ingress(
        "unverified",
        "unverified.example",
        "stale",
        &[("backend-protocol", "HTTPS")],
    );
    // Verified against the Service's DNS name, with SNI.
    let verify = [
        ("backend-protocol", "HTTPS"),
        ("proxy-ssl-verify", "on"),
        ("proxy-ssl-secret", "t/upstream-ca"),
        ("proxy-ssl-server-name", "on"),
    ];
    yaml += &ingress("verified", "verified.example", "secure", &verify);
    let mut named = verify.to_vec();
    named.push(("proxy-ssl-name", "backend.example"));
    yaml += &ingress("named", "named.example", "secure", &named);
    yaml += &ingress("expired", "expired.example", "stale", &verify);
    // The name does not match the certificate.
    let mut wrong = verify.to_vec();
    wrong.push(("proxy-ssl-name", "other.example"));
    yaml += &ingress("wrong-name", "wrong-name.example", "secure", &wrong);
    // Plaintext HTTP/1.1 to a TLS port, and TLS to a plaintext port.
    yaml += &ingress("plaintext", "plaintext.example", "secure", &[]);
    yaml += &ingress(
        "tls-to-plain",
        "tls-to-plain.example",
        "plain",
        &[("backend-protocol", "HTTPS")],
    );
    yaml += &ingress("ok", "ok.example", "plain", &[]);
    dir.write("tls.yaml", &yaml);
    let ingress = Ingress::builder().manifests(dir.path()).start();
    wait_for_route(&ingress, "ok.example").await;

    for reply in both(&ingress, "unverified.example").await {
        assert_eq!(
            reply.status,
            200,
            "{}
{}",
            reply.text(),
            ingress.logs()
        );
        assert_eq!(reply.backend(), "stale");
    }
    assert!(
        stale.handshakes().iter().all(|h| h.sni.is_none()),
        "no SNI unless asked for"
    );

    for reply in both(&ingress, "verified.example").await {
        assert_eq!(reply.status, 200, "{}", reply.text());
        assert_eq!(reply.backend(), "secure");
    }
    for reply in both(&ingress, "named.example").await {
        assert_eq!(reply.status, 200, "{}", reply.text());
    }
    let snis: Vec<Option<String>> = secure.handshakes().into_iter().map(|h| h.sni).collect();
    assert!(snis.contains(&Some("secure.t.svc".into())), "{snis:?}");
    assert!(snis.contains(&Some("backend.example".into())), "{snis:?}");
    let alpns: Vec<Option<Vec<u8>>> = secure.handshakes().into_iter().map(|h| h.alpn).collect();
    assert!(
        alpns.iter().all(|a| a.as_deref() == Some(b"http/1.1")),
        "{alpns:?}"
    );

    for host in ["expired.example", "wrong-name.example"] {
        for reply in both(&ingress, host).await {
            assert_eq!(reply.status, 502, "{host}: {}", reply.text());
        }
    }
    let certificate_errors = ingress
        .metric(
            "ingress_upstream_errors_total",
            &[("kind", "tls_certificate")],
        )
        .unwrap_or(0.0);
    assert!(
        certificate_errors >= 4.0,
        "{certificate_errors}\n{}",
        ingress.metrics()
    );
    assert!(
        ingress.wait_for_log("TLS to the upstream failed", Duration::from_secs(5)),
        "no log line:\n{}",
        ingress.logs()
    );
    let logs = ingress.logs();
    assert!(logs.contains("certificate"), "{logs}");

    for reply in both(&ingress, "plaintext.example").await {
        assert_eq!(reply.status, 502, "plaintext to TLS: {}", reply.text());
    }
    for reply in both(&ingress, "tls-to-plain.example").await {
        assert_eq!(reply.status, 502, "TLS to plaintext: {}", reply.text());
    }
    let handshake_errors = ingress
        .metric(
            "ingress_upstream_errors_total",
            &[("kind", "tls_handshake")],
        )
        .unwrap_or(0.0);
    assert!(
        handshake_errors >= 2.0,
        "{handshake_errors}\n{}",
        ingress.metrics()
    );

    // Other routes are untouched by all of this.
    for reply in both(&ingress, "ok.example").await {
        assert_eq!(reply.status, 200);
        assert_eq!(reply.backend(), "plain");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn mutual_tls_resumption_and_app_protocol() {
    let ca = Ca::new("upstream CA");
    let server = ca.server("mtls.t.svc", &["mtls.t.svc"]);
    let client_leaf = ca.leaf(
        "proxy",
        &["proxy"],
        KeyKind::Rsa2048,
        KeyFormat::Traditional,
        false,
    );
    let mtls = HttpsBackend::start(
        "mtls",
        &server,
        HttpsOptions {
            client_ca: Some(&ca),
            close_each: true,
            ..HttpsOptions::default()
        },
    );
    let app = HttpsBackend::start("app", &server, HttpsOptions::default());

    let dir = Scratch::new("upstream-mtls");
    let mut yaml = String::new();
    yaml += &service_at("t", "mtls", &[mtls.addr]);
    yaml += &service_at("t", "app", &[app.addr]).replace(
        "{name: http, port: 80}",
        "{name: http, port: 80, appProtocol: https}",
    );
    yaml += &secret_yaml_with_ca(
        "t",
        "proxy-client",
        &client_leaf.chain,
        &client_leaf.key,
        &ca.pem,
    );
    let mtls_annotations = [
        ("backend-protocol", "HTTPS"),
        ("proxy-ssl-secret", "proxy-client"),
        ("proxy-ssl-verify", "on"),
    ];
    yaml += &ingress("mtls", "mtls.example", "mtls", &mtls_annotations);
    yaml += &ingress(
        "no-cert",
        "no-cert.example",
        "mtls",
        &[("backend-protocol", "HTTPS")],
    );
    // appProtocol: https, and the annotation saying otherwise on another Ingress.
    yaml += &ingress("app", "app.example", "app", &[]);
    yaml += &ingress(
        "app-http",
        "app-http.example",
        "app",
        &[("backend-protocol", "HTTP")],
    );
    dir.write("mtls.yaml", &yaml);
    let ingress = Ingress::builder().manifests(dir.path()).start();
    wait_for_route(&ingress, "app-http.example").await;

    // The backend closes after every response, so each request is a new TLS connection: the
    // first is a full handshake, the later ones resume.
    for _ in 0..4 {
        let reply = curl(&ingress, "mtls.example", "--http1.1").await;
        assert_eq!(
            reply.status,
            200,
            "{}
{}",
            reply.text(),
            ingress.logs()
        );
        assert_eq!(reply.backend(), "mtls");
    }
    let handshakes = mtls.handshakes();
    assert!(handshakes.len() >= 4, "{handshakes:?}");
    assert!(handshakes.iter().all(|h| h.client_cert), "{handshakes:?}");
    let resumed = handshakes.iter().filter(|h| h.resumed).count();
    assert!(
        resumed >= handshakes.len() - 1,
        "only {resumed} resumed: {handshakes:?}"
    );

    for reply in both(&ingress, "no-cert.example").await {
        assert_eq!(reply.status, 502, "{}", reply.text());
    }
    assert!(mtls.failed() >= 1);

    for reply in both(&ingress, "app.example").await {
        assert_eq!(reply.status, 200, "{}", reply.text());
        assert_eq!(reply.backend(), "app");
    }
    for reply in both(&ingress, "app-http.example").await {
        assert_eq!(reply.status, 502, "the annotation wins: {}", reply.text());
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_annotations_are_diagnostics() {
    let dir = Scratch::new("upstream-tls-diag");
    let plain = Backend::start("plain");
    let mut yaml = service_at("t", "plain", &[plain.addr]);
    yaml += &ingress(
        "fcgi",
        "fcgi.example",
        "plain",
        &[("backend-protocol", "FCGI")],
    );
    yaml += &ingress(
        "missing",
        "missing.example",
        "plain",
        &[("proxy-ssl-secret", "nope")],
    );
    yaml += &ingress(
        "other-ns",
        "other-ns.example",
        "plain",
        &[("proxy-ssl-secret", "kube-system/ca")],
    );
    dir.write("diag.yaml", &yaml);
    let ingress = Ingress::builder().manifests(dir.path()).start();
    wait_for_route(&ingress, "other-ns.example").await;
    let routes = ingress.admin_get("/routes").1;
    for needle in [
        "FCGI (FastCGI) is not supported",
        "proxy-ssl-secret t/nope not found",
        "only Secrets in the Ingress's namespace",
    ] {
        assert!(routes.contains(needle), "{needle}:\n{routes}");
    }
    // The Ingress is still served, over HTTP as by default.
    let reply = curl(&ingress, "fcgi.example", "--http1.1").await;
    assert_eq!(reply.status, 200);
}

/// `AUTO_HTTP` follows the client's scheme, as ingress-nginx's `$scheme://`: a TLS upstream is
/// reached from HTTPS clients and refused (502, plaintext to a TLS port) from HTTP ones.
#[tokio::test(flavor = "multi_thread")]
async fn auto_http_follows_the_clients_scheme() {
    let ca = Ca::new("front CA");
    let front = ca.server("auto.example", &["auto.example"]);
    let back = ca.server("auto.t.svc", &["auto.t.svc"]);
    let secure = HttpsBackend::start("secure", &back, HttpsOptions::default());
    let dir = Scratch::new("auto-http");
    let mut yaml = service_at("t", "secure", &[secure.addr]);
    yaml += &ingress_tests::pki::secret_yaml("t", "front", &front.chain, &front.key);
    yaml += &ingress(
        "auto",
        "auto.example",
        "secure",
        &[("backend-protocol", "AUTO_HTTP"), ("ssl-redirect", "false")],
    )
    .replace(
        "  rules:",
        "  tls:\n  - hosts: [auto.example]\n    secretName: front\n  rules:",
    );
    dir.write("auto.yaml", &yaml);
    let ingress = Ingress::builder().manifests(dir.path()).start();
    wait_for_route(&ingress, "auto.example").await;
    let https = tokio::process::Command::new("curl")
        .args([
            "-sk",
            "--max-time",
            "10",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
        ])
        .args([
            "--resolve",
            &format!("auto.example:{}:127.0.0.1", ingress.https.port()),
        ])
        .arg(format!("https://auto.example:{}/", ingress.https.port()))
        .output()
        .await
        .expect("curl runs");
    assert_eq!(
        String::from_utf8_lossy(&https.stdout),
        "200",
        "{}",
        ingress.logs()
    );
    let http = curl(&ingress, "auto.example", "--http1.1").await;
    assert_eq!(http.status, 502, "{}", http.body);
    assert_eq!(secure.served(), 1);
}
