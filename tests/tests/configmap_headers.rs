//! The ConfigMaps of headers through the real binary in manifests mode, over HTTP/1.1 and h2c
//! with curl: the global ConfigMap's `add-headers` (every response) and `proxy-set-headers`
//! (every upstream request, with nginx variables; the proxy's own answers get add-headers'
//! literal values too), an Ingress's `custom-headers` (gated by
//! `global-allowed-response-headers`) and `auth-proxy-set-headers` (the auth service's
//! request); a missing or refused ConfigMap keeps its Ingress from being served (503); an
//! edited ConfigMap applies live.

// A plain #[test] with no runtime: blocking sleeps between polls are what it should do.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::disallowed_methods)]

use ingress_tests::auth_service::AuthService;
use ingress_tests::curl::{self, VERSIONS};
use ingress_tests::manifests::{annotated_ingress, config_map, service};
use ingress_tests::poll::eventually;
use ingress_tests::process::Ingress;
use ingress_tests::scratch::Scratch;
use ingress_tests::upstream::Backend;

struct Site {
    ingress: Ingress,
    auth: AuthService,
    dir: Scratch,
    _web: Backend,
}

fn custom(x_custom: &str) -> String {
    config_map(
        "t",
        "custom",
        &[("X-Custom", x_custom), ("X-Frame-Options", "DENY")],
    )
}

fn start() -> Site {
    let web = Backend::start("web");
    let auth = AuthService::start();
    let dir = Scratch::new("configmap-headers");
    let site = |name: &str, day: u8, host: &str, annotations: &[(&str, &str)]| {
        annotated_ingress("t", name, day, annotations, &[(host, "/", "Prefix", "web")])
    };
    let ok = auth.url("/ok");
    let manifests = [
        service("t", "web", &[&web]),
        config_map(
            "t",
            "ingress-config",
            &[
                ("add-headers", "t/add"),
                ("proxy-set-headers", "set"),
                (
                    "global-allowed-response-headers",
                    "X-Custom, X-Frame-Options",
                ),
            ],
        ),
        config_map(
            "t",
            "add",
            &[
                ("X-Global", "g"),
                ("X-Custom", "global"),
                ("X-Seen-Scheme", "$scheme"),
                ("X-Request-Echo", "$request_id"),
            ],
        ),
        config_map(
            "t",
            "set",
            &[("X-Tenant", "acme"), ("X-Client", "$remote_addr")],
        ),
        config_map("t", "extra", &[("X-Custom", "1"), ("X-Secret", "s")]),
        config_map(
            "t",
            "auth-headers",
            &[("X-Auth-Extra", "$http_x_user"), ("X-Static", "s")],
        ),
        site("plain", 1, "plain.test", &[]),
        site(
            "custom",
            2,
            "custom.test",
            &[("custom-headers", "t/custom")],
        ),
        site(
            "missing",
            3,
            "missing.test",
            &[("custom-headers", "t/nope")],
        ),
        site("denied", 4, "denied.test", &[("custom-headers", "t/extra")]),
        site(
            "authed",
            5,
            "authed.test",
            &[
                ("auth-url", &ok),
                ("auth-proxy-set-headers", "t/auth-headers"),
            ],
        ),
        site(
            "unauthed",
            6,
            "unauthed.test",
            &[("auth-url", &ok), ("auth-proxy-set-headers", "t/nope")],
        ),
    ]
    .concat();
    dir.write("site.yaml", &manifests);
    dir.write("custom.yaml", &custom("mine"));
    let ingress = Ingress::builder()
        .manifests(dir.path())
        .args(["--configmap", "t/ingress-config"])
        .start();
    Site {
        ingress,
        auth,
        dir,
        _web: web,
    }
}

#[test]
fn headers_of_configmaps_reach_responses_upstreams_and_the_auth_service() {
    let site = start();
    let ingress = &site.ingress;
    for version in VERSIONS {
        // add-headers on every response, proxy-set-headers on every upstream request.
        let reply = curl::get(
            ingress,
            "plain.test",
            "/",
            version,
            &["-H", "X-Tenant: spoofed"],
        );
        assert_eq!(reply.status, 200, "{version}");
        assert_eq!(reply.header("x-global"), Some("g"), "{version}");
        assert_eq!(reply.header("x-custom"), Some("global"), "{version}");
        assert_eq!(reply.header("x-seen-scheme"), Some("http"), "{version}");
        let echo = reply.echo().expect("echo");
        let upstream = |name: &str| echo.headers.get(name).map(String::as_str);
        assert_eq!(upstream("x-tenant"), Some("acme"), "{version}");
        assert_eq!(upstream("x-client"), Some("127.0.0.1"), "{version}");
        // $request_id: the id the upstream was sent, made by the proxy or the client's.
        let made = upstream("x-request-id").expect("an id upstream");
        assert_eq!(made.len(), 32, "{version}");
        assert_eq!(reply.header("x-request-echo"), Some(made), "{version}");
        let reply = curl::get(
            ingress,
            "plain.test",
            "/",
            version,
            &["-H", "X-Request-ID: client-chosen-id-1"],
        );
        assert_eq!(
            reply.header("x-request-echo"),
            Some("client-chosen-id-1"),
            "{version}"
        );

        // custom-headers over add-headers, and over the upstream's own header.
        let reply = curl::get(
            ingress,
            "custom.test",
            "/x?header=x-frame-options:SAMEORIGIN",
            version,
            &[],
        );
        assert_eq!(reply.status, 200, "{version}");
        assert_eq!(reply.header("x-custom"), Some("mine"), "{version}");
        assert_eq!(reply.header("x-frame-options"), Some("DENY"), "{version}");
        assert_eq!(reply.header("x-global"), Some("g"), "{version}");
        // On an upstream's error status too (more_set_headers sets them on any status).
        let reply = curl::get(ingress, "custom.test", "/x?status=404", version, &[]);
        assert_eq!(reply.status, 404, "{version}");
        assert_eq!(reply.header("x-custom"), Some("mine"), "{version}");

        // A missing ConfigMap, or a header global-allowed-response-headers does not list:
        // the Ingress is not served, as ingress-nginx denies its location.
        // The proxy's own answers carry add-headers (nginx's http-level more_set_headers
        // reaches them), variables expanded for the request, never the refused Ingress's.
        for host in ["missing.test", "denied.test"] {
            let reply = curl::get(ingress, host, "/", version, &[]);
            assert_eq!(reply.status, 503, "{version} {host}");
            assert_eq!(reply.header("x-custom"), Some("global"), "{version} {host}");
            assert_eq!(reply.header("x-global"), Some("g"), "{version} {host}");
            assert_eq!(
                reply.header("x-seen-scheme"),
                Some("http"),
                "{version} {host}"
            );
        }
        let reply = curl::get(
            ingress,
            "nowhere.test",
            "/",
            version,
            &["-H", "X-Request-ID: own-answer-id-7"],
        );
        assert_eq!(reply.status, 404, "{version}");
        assert_eq!(reply.header("x-global"), Some("g"), "{version}");
        assert_eq!(reply.header("server"), Some("ingress"), "{version}");
        assert_eq!(
            reply.header("x-request-echo"),
            Some("own-answer-id-7"),
            "{version}"
        );
        let made = curl::get(ingress, "nowhere.test", "/", version, &[]);
        let made = made.header("x-request-echo").unwrap_or_default();
        assert_eq!(made.len(), 32, "{version}: a new id, {made:?}");

        // auth-proxy-set-headers: on the auth service's request, variables expanded.
        let before = site.auth.requests();
        let reply = curl::get(ingress, "authed.test", "/", version, &["-H", "X-User: bob"]);
        assert_eq!(reply.status, 200, "{version}");
        assert_eq!(site.auth.requests(), before + 1, "{version}");
        let seen = site.auth.seen().pop().expect("a subrequest");
        assert_eq!(seen.header("x-auth-extra"), Some("bob"), "{version}");
        assert_eq!(seen.header("x-static"), Some("s"), "{version}");
        let upstream_id = reply
            .echo()
            .expect("echo")
            .headers
            .get("x-request-id")
            .cloned();
        assert_eq!(
            seen.header("x-request-id").map(str::to_string),
            upstream_id,
            "{version}: the auth service and the upstream see one id"
        );

        // Its ConfigMap missing: fail closed, and the auth service is never asked.
        let before = site.auth.requests();
        let reply = curl::get(ingress, "unauthed.test", "/", version, &[]);
        assert_eq!(reply.status, 503, "{version}");
        assert_eq!(site.auth.requests(), before, "{version}");
    }
    let logs = ingress.logs();
    for needle in [
        "custom-headers: ConfigMap t/nope does not exist",
        "header \"X-Secret\": not allowed",
        "auth-proxy-set-headers: ConfigMap t/nope does not exist",
    ] {
        assert!(logs.contains(needle), "{needle:?} is diagnosed: {logs}");
    }
}

#[test]
fn an_edited_configmap_applies_live() {
    let site = start();
    let ingress = &site.ingress;
    let probe = |version: &str| {
        let reply = curl::get(ingress, "custom.test", "/", version, &[]);
        (reply.status, reply.header("x-custom").map(str::to_string))
    };
    for version in VERSIONS {
        assert_eq!(probe(version), (200, Some("mine".into())), "{version}");
    }
    site.dir.replace("custom.yaml", &custom("changed"));
    eventually("the edited value", (200, Some("changed".into())), || {
        probe("--http1.1")
    });
    assert_eq!(
        probe("--http2-prior-knowledge"),
        (200, Some("changed".into()))
    );
    // The ConfigMap gone: refused, then served again once it is back.
    site.dir.replace("custom.yaml", "");
    // (The 503 is the proxy's own: it carries add-headers' X-Custom, not the Ingress's.)
    eventually(
        "the ConfigMap removed",
        (503, Some("global".into())),
        || probe("--http1.1"),
    );
    site.dir.replace("custom.yaml", &custom("back"));
    eventually("the ConfigMap back", (200, Some("back".into())), || {
        probe("--http2-prior-knowledge")
    });
}
