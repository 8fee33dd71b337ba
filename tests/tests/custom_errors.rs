//! `custom-http-errors` through the real binary, over HTTP/1.1 and h2c with curl: a listed
//! code, from the upstream or from the proxy itself (404 no route, 503 no endpoint), is
//! answered with the error backend's page (an echo backend that, like ingress-nginx's custom
//! error pages backend, answers with the `X-Code` it is sent), which is told the request with
//! ingress-nginx's `X-*` headers; other codes pass through untouched; a failing error backend
//! falls back to the proxy's own page; `disable-proxy-intercept-errors` passes the upstream's
//! own errors on; the ConfigMap's list applies where an Ingress has none (manifests mode).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use ingress_tests::curl::{self, Reply, VERSIONS};
use ingress_tests::manifests::{annotated_ingress, service, service_at};
use ingress_tests::process::Ingress;
use ingress_tests::raw::RawConn;
use ingress_tests::scratch::Scratch;
use ingress_tests::upstream::Backend;

/// A loopback address nothing listens on: an error backend that cannot answer.
fn dead_addr() -> std::net::SocketAddr {
    let listener = ingress_tests::ports::listen_loopback();
    listener.local_addr().expect("addr")
}

/// The error backend's view of the request for the page, when it answered.
fn page_request(reply: &Reply) -> Option<(String, std::collections::BTreeMap<String, String>)> {
    reply
        .echo()
        .filter(|e| e.backend == "errors")
        .map(|e| (format!("{} {}", e.method, e.uri), e.headers))
}

#[test]
fn listed_codes_are_answered_by_the_error_backend() {
    let web = Backend::start("web");
    let errors = Backend::start("errors");
    let dead = dead_addr();
    let dir = Scratch::new("custom-errors");
    let manifests = [
        service("t", "web", &[&web]),
        service("t", "errors", &[&errors]),
        service_at("t", "down", &[dead]),
        service_at("t", "none", &[]),
        annotated_ingress(
            "t",
            "pages",
            1,
            &[
                ("custom-http-errors", "404, 503"),
                ("default-backend", "errors"),
            ],
            &[("pages.test", "/", "Prefix", "web")],
        ),
        annotated_ingress(
            "t",
            "plain",
            2,
            &[],
            &[("plain.test", "/", "Prefix", "web")],
        ),
        // No default-backend annotation: the global default backend (the flag) serves the page.
        annotated_ingress(
            "t",
            "empty",
            3,
            &[("custom-http-errors", "503")],
            &[("empty.test", "/", "Prefix", "none")],
        ),
        annotated_ingress(
            "t",
            "broken",
            4,
            &[("custom-http-errors", "503"), ("default-backend", "down")],
            &[("broken.test", "/", "Prefix", "web")],
        ),
        annotated_ingress(
            "t",
            "quiet",
            5,
            &[
                ("custom-http-errors", "404,503"),
                ("disable-proxy-intercept-errors", "true"),
            ],
            &[
                ("quiet.test", "/up", "Prefix", "web"),
                ("quiet.test", "/down", "Prefix", "none"),
            ],
        ),
    ]
    .concat();
    dir.write("all.yaml", &manifests);
    let ingress = Ingress::builder()
        .manifests(dir.path())
        .args(["--default-backend-service", "t/errors"])
        .start();
    // (host, target, status, answered by: "errors" (the page), "web", or "" (the proxy))
    let cases = [
        ("pages.test", "/a/b?status=404", 404, "errors"),
        ("pages.test", "/a/b?status=503", 503, "errors"),
        ("pages.test", "/a/b?status=500", 500, "web"),
        ("pages.test", "/a/b?status=403", 403, "web"),
        ("pages.test", "/a/b", 200, "web"),
        ("plain.test", "/a?status=404", 404, "web"),
        ("empty.test", "/x", 503, "errors"),
        ("broken.test", "/a?status=503", 503, ""),
        ("quiet.test", "/up?status=404", 404, "web"),
        ("quiet.test", "/down", 503, "errors"),
        // No route, and no global list (no ConfigMap): the proxy's own 404.
        ("unknown.test", "/", 404, ""),
    ];
    for version in VERSIONS {
        for (host, target, status, by) in cases {
            let reply = curl::get(
                &ingress,
                host,
                target,
                version,
                &["-H", "Accept: text/html", "-H", "X-Request-ID: req-1"],
            );
            assert_eq!(reply.status, status, "{version} {host}{target}: {reply:?}");
            match by {
                "" => {
                    assert!(
                        reply.echo().is_none(),
                        "{version} {host}{target}: {reply:?}"
                    );
                    assert!(
                        reply.body.starts_with(&status.to_string()),
                        "{version} {host}{target}: the proxy's own page: {reply:?}"
                    );
                }
                name => assert_eq!(reply.backend(), name, "{version} {host}{target}"),
            }
        }
        // What the error backend is told, as ingress-nginx's @custom_ location sends it.
        let reply = curl::get(
            &ingress,
            "pages.test",
            "/a/b?status=404",
            version,
            &["-H", "Accept: text/html", "-H", "X-Request-ID: req-1"],
        );
        let (line, headers) = page_request(&reply).expect("the page");
        assert_eq!(line, "GET /", "{version}");
        let header = |name: &str| headers.get(name).map(String::as_str);
        for (name, want) in [
            ("x-code", "404"),
            ("x-format", "text/html"),
            ("x-original-uri", "/a/b?status=404"),
            ("x-namespace", "t"),
            ("x-ingress-name", "pages"),
            ("x-service-name", "web"),
            ("x-service-port", "80"),
            ("x-request-id", "req-1"),
            ("x-forwarded-for", "127.0.0.1"),
            ("host", "pages.test"),
        ] {
            assert_eq!(header(name), Some(want), "{version} {name}: {headers:?}");
        }
        assert_eq!(
            reply.header("content-type"),
            Some("application/json"),
            "{version}: the page's own Content-Type"
        );
        // The proxy's own 503 (no endpoint) says which route it was for.
        let reply = curl::get(&ingress, "empty.test", "/x", version, &[]);
        let (_, headers) = page_request(&reply).expect("the page");
        assert_eq!(headers.get("x-code").map(String::as_str), Some("503"));
        assert_eq!(
            headers.get("x-service-name").map(String::as_str),
            Some("none")
        );
        // HEAD asks the error backend with HEAD, and the client gets its status, no body.
        let before = errors.served();
        let reply = curl::get(
            &ingress,
            "pages.test",
            "/h?status=404",
            version,
            &["--head"],
        );
        assert_eq!(reply.status, 404, "{version} HEAD: {reply:?}");
        assert!(
            reply.echo().is_none(),
            "{version} HEAD has no body: {reply:?}"
        );
        // ...but says the length the error backend announced for it, as nginx passes it on.
        let length = reply.header("content-length").map(str::parse::<u64>);
        assert!(
            matches!(length, Some(Ok(n)) if n > 0),
            "{version} HEAD: {reply:?}"
        );
        assert_eq!(
            errors.served(),
            before + 1,
            "{version} HEAD reached the error backend"
        );
        // The connection the replaced response came on is not reused half-read: the next
        // request on the route is answered whole.
        let reply = curl::get(&ingress, "pages.test", "/after", version, &[]);
        assert_eq!(
            (reply.status, reply.backend()),
            (200, "web".to_string()),
            "{version}"
        );
    }
    // Pages come over kept connections: one after another, they need one between them, not a
    // new connection (and a TIME_WAIT socket on the proxy) each.
    let (connections, served) = (errors.connections(), errors.served());
    for n in 0..10 {
        let reply = curl::get(&ingress, "pages.test", "/k?status=404", "--http1.1", &[]);
        assert_eq!(reply.backend(), "errors", "page {n}: {reply:?}");
    }
    assert_eq!(errors.served(), served + 10);
    assert!(
        errors.connections() <= connections + 1,
        "10 pages took {} new connections",
        errors.connections() - connections
    );
}

const CONFIG: &str = "t/ingress-config";

#[test]
fn the_configmaps_list_applies_where_an_ingress_has_none() {
    let web = Backend::start("web");
    let errors = Backend::start("errors");
    let dir = Scratch::new("custom-errors-configmap");
    let manifests = [
        "---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: ingress-config, namespace: t}\ndata:\n  custom-http-errors: \"404,503\"\n".to_string(),
        service("t", "web", &[&web]),
        service("t", "errors", &[&errors]),
        annotated_ingress("t", "app", 1, &[], &[("app.test", "/", "Prefix", "web")]),
        // Its own list replaces the ConfigMap's (as ingress-nginx's location-level error_page).
        annotated_ingress(
            "t",
            "own",
            2,
            &[("custom-http-errors", "500")],
            &[("own.test", "/", "Prefix", "web")],
        ),
    ]
    .concat();
    dir.write("all.yaml", &manifests);
    let ingress = Ingress::builder()
        .manifests(dir.path())
        .args([
            "--configmap",
            CONFIG,
            "--default-backend-service",
            "t/errors",
        ])
        .start();
    let cases = [
        ("app.test", "/x?status=404", 404, "errors"),
        ("app.test", "/x?status=503", 503, "errors"),
        ("app.test", "/x?status=500", 500, "web"),
        ("own.test", "/x?status=404", 404, "web"),
        ("own.test", "/x?status=500", 500, "errors"),
        // No route: the global list's 404 comes from the error backend, told of no Ingress.
        ("unknown.test", "/nowhere", 404, "errors"),
    ];
    for version in VERSIONS {
        for (host, target, status, by) in cases {
            let reply = curl::get(&ingress, host, target, version, &[]);
            assert_eq!(reply.status, status, "{version} {host}{target}: {reply:?}");
            assert_eq!(reply.backend(), by, "{version} {host}{target}");
        }
        let reply = curl::get(&ingress, "unknown.test", "/nowhere", version, &[]);
        let (_, headers) = page_request(&reply).expect("the page");
        assert_eq!(headers.get("x-code").map(String::as_str), Some("404"));
        assert_eq!(headers.get("x-ingress-name").map(String::as_str), Some(""));
        // The client sent none: the proxy's own (the one the access log and an upstream get).
        assert_eq!(
            headers.get("x-request-id").map(String::len),
            Some(32),
            "{headers:?}"
        );
        assert_eq!(
            headers.get("x-original-uri").map(String::as_str),
            Some("/nowhere")
        );
    }
}

/// Without `--default-backend-service`, the Ingress with only a `spec.defaultBackend` (where
/// unmatched hosts go) is the global default backend.
#[test]
fn the_spec_default_backend_serves_pages_without_the_flag() {
    let web = Backend::start("web");
    let errors = Backend::start("errors");
    let dir = Scratch::new("custom-errors-spec-default");
    let catchall = "---\napiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {name: catchall, namespace: t}\nspec:\n  ingressClassName: ingress\n  defaultBackend: {service: {name: errors, port: {number: 80}}}\n";
    let manifests = [
        service("t", "web", &[&web]),
        service("t", "errors", &[&errors]),
        catchall.to_string(),
        annotated_ingress(
            "t",
            "app",
            1,
            &[("custom-http-errors", "404")],
            &[("app.test", "/", "Prefix", "web")],
        ),
    ]
    .concat();
    dir.write("all.yaml", &manifests);
    let ingress = Ingress::start(dir.path());
    for version in VERSIONS {
        let reply = curl::get(&ingress, "app.test", "/x?status=404", version, &[]);
        assert_eq!(
            (reply.status, reply.backend()),
            (404, "errors".to_string()),
            "{version}"
        );
        let reply = curl::get(&ingress, "app.test", "/x?status=503", version, &[]);
        assert_eq!(
            (reply.status, reply.backend()),
            (503, "web".to_string()),
            "{version}"
        );
    }
}

/// Exact bytes on one HTTP/1.1 connection: the replaced response leaves nothing of the
/// upstream's own behind, a POST's page is asked with GET, HEAD gets a head only, and the
/// connection carries the next request.
#[test]
fn one_connection_keeps_working_after_pages() {
    let web = Backend::start("web");
    let errors = Backend::start("errors");
    let dir = Scratch::new("custom-errors-raw");
    let manifests = [
        service("t", "web", &[&web]),
        service("t", "errors", &[&errors]),
        annotated_ingress(
            "t",
            "pages",
            1,
            &[
                ("custom-http-errors", "404,503"),
                ("default-backend", "errors"),
            ],
            &[("pages.test", "/", "Prefix", "web")],
        ),
    ]
    .concat();
    dir.write("all.yaml", &manifests);
    let ingress = Ingress::start(dir.path());
    let mut conn = RawConn::connect(ingress.http);
    let page = conn.exchange(b"GET /a?status=404 HTTP/1.1\r\nHost: pages.test\r\n\r\n");
    assert_eq!(page.status, 404);
    let echo = page.echo();
    assert_eq!(
        (
            echo.backend.as_str(),
            echo.method.as_str(),
            echo.uri.as_str()
        ),
        ("errors", "GET", "/")
    );
    let page = conn.exchange(
        b"POST /p?status=503 HTTP/1.1\r\nHost: pages.test\r\nContent-Length: 5\r\n\r\nhello",
    );
    assert_eq!(page.status, 503);
    let echo = page.echo();
    assert_eq!(
        (echo.backend.as_str(), echo.method.as_str(), echo.body_len),
        ("errors", "GET", 0)
    );
    assert_eq!(
        echo.headers.get("x-original-uri").map(String::as_str),
        Some("/p?status=503")
    );
    conn.send(b"HEAD /h?status=404 HTTP/1.1\r\nHost: pages.test\r\n\r\n");
    let head = conn.reply_to_head();
    assert_eq!(head.status, 404);
    assert!(head.body.is_empty(), "{head:?}");
    let ok = conn.exchange(b"GET /b HTTP/1.1\r\nHost: pages.test\r\n\r\n");
    assert_eq!((ok.status, ok.echo().backend.as_str()), (200, "web"));
    assert_eq!(ok.echo().uri, "/b");
}

/// A list with no error backend anywhere is a warning `ingress check` shows, and the migration
/// report does not call it applied; the upstream's answers then pass through.
#[test]
fn without_an_error_backend_the_list_is_reported_and_has_no_effect() {
    let web = Backend::start("web");
    let dir = Scratch::new("custom-errors-none");
    let manifests = [
        service("t", "web", &[&web]),
        annotated_ingress(
            "t",
            "app",
            1,
            &[("custom-http-errors", "404")],
            &[("app.test", "/", "Prefix", "web")],
        ),
    ]
    .concat();
    dir.write("all.yaml", &manifests);
    let check = std::process::Command::new(ingress_tests::process::binary())
        .args(["check", "--manifests"])
        .arg(dir.path())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&check.stdout);
    let warning = text
        .lines()
        .find(|l| l.starts_with("warning") && l.contains("no error backend"))
        .unwrap_or_else(|| panic!("no warning in\n{text}"));
    assert!(warning.contains("Ingress t/app"), "{warning}");
    assert!(
        !text.contains("applied  nginx.ingress.kubernetes.io/custom-http-errors"),
        "{text}"
    );
    let ingress = Ingress::start(dir.path());
    for version in VERSIONS {
        let reply = curl::get(&ingress, "app.test", "/x?status=404", version, &[]);
        assert_eq!(
            (reply.status, reply.backend()),
            (404, "web".to_string()),
            "{version}"
        );
    }
}

/// A HEAD request's page carries the error backend's `Content-Length` when it is one number;
/// a value that is not (letters, a sign, a list, an overflow), or none, is not passed on and
/// not made up (a 0 would lie about the GET's body): the head has no `Content-Length`, and the
/// connection carries the next request.
#[test]
fn a_head_page_never_passes_on_a_broken_length() {
    let web = Backend::start("web");
    let errors = ingress_tests::scripted::Scripted::start(|seen| {
        let wanted = seen
            .header("x-original-uri")
            .and_then(|uri| uri.split_once("len="))
            .map_or("17", |(_, len)| len)
            .replace("%20", " ");
        let length = if wanted == "none" {
            String::new()
        } else {
            format!("Content-Length: {wanted}\r\n")
        };
        ingress_tests::scripted::Answer::Bytes(
            format!("HTTP/1.1 404 Not Found\r\nContent-Type: text/html\r\n{length}\r\n")
                .into_bytes(),
        )
    });
    let dir = Scratch::new("custom-errors-head-length");
    let manifests = [
        service("t", "web", &[&web]),
        service_at("t", "errors", &[errors.addr]),
        annotated_ingress(
            "t",
            "pages",
            1,
            &[("custom-http-errors", "404"), ("default-backend", "errors")],
            &[("pages.test", "/", "Prefix", "web")],
        ),
    ]
    .concat();
    dir.write("all.yaml", &manifests);
    let ingress = Ingress::start(dir.path());
    let mut conn = RawConn::connect(ingress.http);
    conn.send(b"HEAD /h?status=404&len=17 HTTP/1.1\r\nHost: pages.test\r\n\r\n");
    let head = conn.reply_to_head();
    assert_eq!(
        (head.status, head.header("content-length")),
        (404, Some("17")),
        "{head:?}"
    );
    for broken in [
        "abc",
        "-1",
        "+17",
        "17,%2018",
        "99999999999999999999999",
        "0x11",
        "none",
    ] {
        let request =
            format!("HEAD /h?status=404&len={broken} HTTP/1.1\r\nHost: pages.test\r\n\r\n");
        conn.send(request.as_bytes());
        let head = conn.reply_to_head();
        assert_eq!(head.status, 404, "{broken}: {head:?}");
        assert_eq!(head.header("content-length"), None, "{broken}: {head:?}");
        assert!(head.body.is_empty(), "{broken}: {head:?}");
        let ok = conn.exchange(b"GET /b HTTP/1.1\r\nHost: pages.test\r\n\r\n");
        assert_eq!(
            (ok.status, ok.echo().backend.as_str()),
            (200, "web"),
            "after {broken}"
        );
    }
}
