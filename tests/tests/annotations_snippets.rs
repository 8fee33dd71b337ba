//! `configuration-snippet` and `server-snippet` through the real binary, over HTTP/1.1 and h2c
//! with curl: with `--allow-snippet-annotations`, the header directives of a snippet act on
//! the upstream's response and on the request sent upstream; a snippet with anything else is
//! not applied at all; without the flag no snippet is read. And the upstream rewrites
//! (`proxy-redirect-*`, `proxy-cookie-*`), which act on the same response headers.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use ingress_tests::curl::{self, VERSIONS};
use ingress_tests::manifests::{annotated_ingress, service};
use ingress_tests::process::Ingress;
use ingress_tests::scratch::Scratch;
use ingress_tests::upstream::Backend;

const HEADERS: &str = r#"more_set_headers "X-Frame-Options: DENY";
more_clear_headers X-Powered-By Server;
add_header X-Cache-Policy "no-store" ;
add_header X-Always 'yes' always;
proxy_set_header X-Tenant acme;
proxy_set_header X-Drop "";
"#;

fn manifests(web: &Backend) -> String {
    [
        service("t", "web", &[web]),
        annotated_ingress(
            "t",
            "headers",
            1,
            &[
                ("configuration-snippet", HEADERS),
                ("server-snippet", "add_header X-Server-Level s;"),
            ],
            &[("headers.test", "/", "Prefix", "web")],
        ),
        annotated_ingress(
            "t",
            "server",
            2,
            &[("server-snippet", "# only the server's\nadd_header X-Server-Level s;")],
            &[("server.test", "/", "Prefix", "web")],
        ),
        annotated_ingress(
            "t",
            "mixed",
            3,
            &[(
                "configuration-snippet",
                "more_set_headers \"X-Frame-Options: DENY\";\nproxy_set_header X-Real-IP $remote_addr;",
            )],
            &[("mixed.test", "/", "Prefix", "web")],
        ),
    ]
    .concat()
}

#[test]
fn snippet_headers_act_on_the_response_and_the_upstream_request() {
    let web = Backend::start("web");
    let dir = Scratch::new("annotations-snippets");
    dir.write("all.yaml", &manifests(&web));
    let ingress = Ingress::builder()
        .manifests(dir.path())
        .arg("--allow-snippet-annotations")
        .start();
    for version in VERSIONS {
        let path = "/x?header=x-powered-by:php";
        let reply = curl::get(
            &ingress,
            "headers.test",
            path,
            version,
            &["-H", "X-Drop: secret", "-H", "X-Tenant: spoofed"],
        );
        assert_eq!(reply.status, 200, "{version}");
        assert_eq!(reply.header("x-frame-options"), Some("DENY"), "{version}");
        assert_eq!(reply.header("x-powered-by"), None, "{version}");
        assert_eq!(reply.header("server"), None, "{version}");
        assert_eq!(
            reply.header("x-cache-policy"),
            Some("no-store"),
            "{version}"
        );
        assert_eq!(reply.header("x-always"), Some("yes"), "{version}");
        // The location has add_header, so the server's is not inherited (nginx's rule).
        assert_eq!(reply.header("x-server-level"), None, "{version}");
        let echo = reply.echo().expect("echo");
        assert_eq!(
            echo.headers.get("x-tenant").map(String::as_str),
            Some("acme")
        );
        assert_eq!(echo.headers.get("x-drop"), None, "{version}");

        // add_header without `always` is not on a 404 from the upstream; the others are.
        let reply = curl::get(&ingress, "headers.test", "/x?status=404", version, &[]);
        assert_eq!(reply.status, 404, "{version}");
        assert_eq!(reply.header("x-cache-policy"), None, "{version}");
        assert_eq!(reply.header("x-always"), Some("yes"), "{version}");
        assert_eq!(reply.header("x-frame-options"), Some("DENY"), "{version}");

        let reply = curl::get(&ingress, "server.test", "/", version, &[]);
        assert_eq!(reply.header("x-server-level"), Some("s"), "{version}");
        assert_eq!(reply.header("server"), Some("ingress"), "{version}");

        // One directive outside the subset: nothing of the snippet is applied.
        let reply = curl::get(&ingress, "mixed.test", "/", version, &[]);
        assert_eq!(reply.status, 200, "{version}");
        assert_eq!(reply.header("x-frame-options"), None, "{version}");
    }
    let logs = ingress.logs();
    assert!(
        logs.contains("line 2: proxy_set_header: $variables are not read"),
        "the rejected snippet is diagnosed: {logs}"
    );
}

#[test]
fn without_the_flag_no_snippet_is_read() {
    let web = Backend::start("web");
    let dir = Scratch::new("annotations-snippets-off");
    dir.write("all.yaml", &manifests(&web));
    let ingress = Ingress::start(dir.path());
    for version in VERSIONS {
        let reply = curl::get(
            &ingress,
            "headers.test",
            "/x?header=x-powered-by:php",
            version,
            &[],
        );
        assert_eq!(reply.status, 200, "{version}");
        assert_eq!(reply.header("x-frame-options"), None, "{version}");
        assert_eq!(reply.header("x-powered-by"), Some("php"), "{version}");
        assert_eq!(reply.header("server"), Some("ingress"), "{version}");
        let echo = reply.echo().expect("echo");
        assert_eq!(echo.headers.get("x-tenant"), None, "{version}");
    }
    assert!(
        ingress.logs().contains("snippet annotations are disabled"),
        "the disabled snippets are diagnosed"
    );
}

/// `proxy-redirect-from`/`-to`, `proxy-cookie-domain`, `proxy-cookie-path`: the upstream's
/// `Location` and `Set-Cookie` rewritten, over HTTP/1.1 and h2c.
#[test]
fn location_and_cookies_from_the_upstream_are_rewritten() {
    let web = Backend::start("web");
    let dir = Scratch::new("annotations-upstream-rewrite");
    let manifests = [
        service("t", "web", &[&web]),
        annotated_ingress(
            "t",
            "rewrites",
            1,
            &[
                ("proxy-redirect-from", "http://internal:8080/"),
                ("proxy-redirect-to", "https://shop.test/store/"),
                ("proxy-cookie-domain", "internal.local shop.test"),
                ("proxy-cookie-path", "/app /store"),
            ],
            &[("shop.test", "/", "Prefix", "web")],
        ),
        annotated_ingress(
            "t",
            "plain",
            2,
            &[],
            &[("plain.test", "/", "Prefix", "web")],
        ),
    ]
    .concat();
    dir.write("all.yaml", &manifests);
    let ingress = Ingress::start(dir.path());
    let location = "/r?status=302&header=location:http://internal:8080/cart?x=1";
    let cookie = "/c?header=set-cookie:s=internal.local;Domain=.internal.local;Path=/app/cart";
    for version in VERSIONS {
        let reply = curl::get(&ingress, "shop.test", location, version, &[]);
        assert_eq!(reply.status, 302, "{version}");
        assert_eq!(
            reply.header("location"),
            Some("https://shop.test/store/cart?x=1"),
            "{version}"
        );
        let reply = curl::get(&ingress, "shop.test", cookie, version, &[]);
        assert_eq!(
            reply.header("set-cookie"),
            Some("s=internal.local;Domain=.shop.test;Path=/store/cart"),
            "{version}: the cookie's value is left alone"
        );
        let reply = curl::get(&ingress, "plain.test", location, version, &[]);
        assert_eq!(
            reply.header("location"),
            Some("http://internal:8080/cart?x=1"),
            "{version}"
        );
    }
}
