//! ingress-nginx's path annotations through the real binary, over HTTP/1.1 and h2c with curl:
//! `use-regex` (the whole host's paths become case-insensitive prefix regexes), `rewrite-target`
//! with capture groups and the query kept, `x-forwarded-prefix`, and `app-root` (302 for `/`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use ingress_tests::curl::{self, VERSIONS};
use ingress_tests::manifests::{annotated_ingress, ingress, service};
use ingress_tests::process::Ingress;
use ingress_tests::scratch::Scratch;
use ingress_tests::upstream::Backend;

#[test]
fn regex_paths_rewrites_and_app_root_as_ingress_nginx_does_them() {
    let (web, api, docs) = (
        Backend::start("web"),
        Backend::start("api"),
        Backend::start("docs"),
    );
    let dir = Scratch::new("annotations-paths");
    let i = "ImplementationSpecific";
    let manifests = [
        service("t", "web", &[&web]),
        service("t", "api", &[&api]),
        service("t", "docs", &[&docs]),
        // shop: an unannotated Ingress, then one with use-regex on the same host.
        ingress(
            "t",
            "shop-plain",
            &[("shop.test", "/static", "Prefix", "web")],
        ),
        annotated_ingress(
            "t",
            "shop-regex",
            2,
            &[("use-regex", "true")],
            &[("shop.test", "/api/v[0-9]+", i, "api")],
        ),
        // plain: the same Prefix path, no annotation anywhere on the host.
        ingress("t", "plain", &[("plain.test", "/static", "Prefix", "web")]),
        // rw: the rewrite example of ingress-nginx's documentation.
        annotated_ingress(
            "t",
            "rewrite",
            3,
            &[
                ("rewrite-target", "/$2"),
                ("x-forwarded-prefix", "/something"),
                ("app-root", "/app1"),
            ],
            &[("rw.test", "/something(/|$)(.*)", i, "api")],
        ),
        annotated_ingress(
            "t",
            "rw-docs",
            4,
            &[],
            &[("rw.test", "/docs", "Prefix", "docs")],
        ),
    ]
    .concat();
    dir.write("all.yaml", &manifests);
    let ingress = Ingress::start(dir.path());

    // (host, path, backend, the target the backend was sent, X-Forwarded-Prefix)
    let cases: &[(&str, &str, &str, Option<&str>, Option<&str>)] = &[
        ("shop.test", "/static/a", "web", Some("/static/a"), None),
        ("shop.test", "/STATIC/a", "web", Some("/STATIC/a"), None),
        ("shop.test", "/staticky", "web", Some("/staticky"), None),
        ("shop.test", "/API/V3/x", "api", Some("/API/V3/x"), None),
        ("shop.test", "/x/api/v3", "<404>", None, None),
        ("plain.test", "/static/a", "web", Some("/static/a"), None),
        ("plain.test", "/STATIC/a", "<404>", None, None),
        ("plain.test", "/staticky", "<404>", None, None),
        (
            "rw.test",
            "/something",
            "api",
            Some("/"),
            Some("/something"),
        ),
        (
            "rw.test",
            "/something/",
            "api",
            Some("/"),
            Some("/something"),
        ),
        (
            "rw.test",
            "/something/new?q=1&r=2",
            "api",
            Some("/new?q=1&r=2"),
            Some("/something"),
        ),
        (
            "rw.test",
            "/SomeThing/A/b",
            "api",
            Some("/A/b"),
            Some("/something"),
        ),
        ("rw.test", "/DOCS/x", "docs", Some("/DOCS/x"), None),
        ("rw.test", "/app1", "<404>", None, None),
    ];
    for version in VERSIONS {
        for (host, path, backend, uri, prefix) in cases {
            let reply = curl::get(&ingress, host, path, version, &[]);
            assert_eq!(reply.backend(), *backend, "{version} {host}{path}");
            let echo = reply.echo();
            assert_eq!(
                echo.as_ref().map(|e| e.uri.as_str()),
                *uri,
                "{version} {host}{path}"
            );
            let sent_prefix = echo
                .as_ref()
                .and_then(|e| e.headers.get("x-forwarded-prefix").cloned());
            assert_eq!(sent_prefix.as_deref(), *prefix, "{version} {host}{path}");
        }
        // A client's own X-Forwarded-Prefix never reaches a backend.
        let reply = curl::get(
            &ingress,
            "shop.test",
            "/static/a",
            version,
            &["-H", "X-Forwarded-Prefix: /spoofed"],
        );
        let echo = reply.echo().expect("echo");
        assert_eq!(echo.headers.get("x-forwarded-prefix"), None, "{version}");

        // app-root: `/` (query dropped) is redirected with 302 to the same scheme and Host.
        for path in ["/", "/?x=1"] {
            let reply = curl::get(&ingress, "rw.test", path, version, &[]);
            assert_eq!(reply.status, 302, "{version} {path}");
            assert_eq!(
                reply.header("location"),
                Some("http://rw.test/app1"),
                "{version}"
            );
        }
        let reply = curl::get(&ingress, "rw.test:8080", "/", version, &[]);
        assert_eq!(
            reply.header("location"),
            Some("http://rw.test:8080/app1"),
            "{version}: the Host is kept as sent, port included"
        );
    }
    assert_eq!(docs.served(), VERSIONS.len());
}
