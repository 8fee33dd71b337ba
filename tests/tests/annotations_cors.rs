//! `enable-cors` through the real binary, over HTTP/1.1 and h2c with curl: the proxy answers
//! the preflight (204, no upstream), sets the CORS headers on forwarded responses, and leaves
//! requests from origins the list does not allow alone.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use ingress_tests::curl::{self, VERSIONS};
use ingress_tests::manifests::{annotated_ingress, service};
use ingress_tests::process::Ingress;
use ingress_tests::scratch::Scratch;
use ingress_tests::upstream::Backend;

#[test]
fn preflights_are_answered_and_responses_carry_the_cors_headers() {
    let web = Backend::start("web");
    let dir = Scratch::new("annotations-cors");
    let manifests = [
        service("t", "web", &[&web]),
        annotated_ingress(
            "t",
            "open",
            1,
            &[("enable-cors", "true")],
            &[("open.test", "/", "Prefix", "web")],
        ),
        annotated_ingress(
            "t",
            "listed",
            2,
            &[
                ("enable-cors", "true"),
                (
                    "cors-allow-origin",
                    "https://app.example, https://*.shop.example",
                ),
                ("cors-allow-methods", "GET, POST"),
                ("cors-allow-headers", "X-Token"),
                ("cors-expose-headers", "X-Total"),
                ("cors-allow-credentials", "false"),
                ("cors-max-age", "600"),
            ],
            &[("listed.test", "/", "Prefix", "web")],
        ),
    ]
    .concat();
    dir.write("all.yaml", &manifests);
    let ingress = Ingress::start(dir.path());
    let preflight = |origin: &'static str| -> Vec<&'static str> {
        vec![
            "-X",
            "OPTIONS",
            "-H",
            origin,
            "-H",
            "Access-Control-Request-Method: POST",
        ]
    };
    for version in VERSIONS {
        // The default policy: any origin, ingress-nginx's default lists.
        let reply = curl::get(
            &ingress,
            "open.test",
            "/api",
            version,
            &preflight("Origin: https://x.example"),
        );
        assert_eq!(reply.status, 204, "{version}: {reply:?}");
        assert_eq!(reply.body, "", "{version}");
        let want = [
            ("access-control-allow-origin", "*"),
            ("access-control-allow-credentials", "true"),
            (
                "access-control-allow-methods",
                "GET, PUT, POST, DELETE, PATCH, OPTIONS",
            ),
            (
                "access-control-allow-headers",
                "DNT,Keep-Alive,User-Agent,X-Requested-With,If-Modified-Since,Cache-Control,Content-Type,Range,Authorization",
            ),
            ("access-control-max-age", "1728000"),
        ];
        for (name, value) in want {
            assert_eq!(reply.header(name), Some(value), "{version} {name}");
        }
        let get = curl::get(
            &ingress,
            "open.test",
            "/api",
            version,
            &["-H", "Origin: https://x.example"],
        );
        assert_eq!(get.backend(), "web", "{version}");
        assert_eq!(
            get.header("access-control-allow-origin"),
            Some("*"),
            "{version}"
        );

        // A list: the allowed origin is echoed; others get nothing, and their OPTIONS reaches
        // the upstream like any request.
        for origin in [
            "Origin: https://app.example",
            "Origin: https://eu.shop.example",
        ] {
            let reply = curl::get(&ingress, "listed.test", "/", version, &preflight(origin));
            assert_eq!(reply.status, 204, "{version} {origin}");
            let want = [
                (
                    "access-control-allow-origin",
                    origin.trim_start_matches("Origin: "),
                ),
                ("access-control-allow-methods", "GET, POST"),
                ("access-control-allow-headers", "X-Token"),
                ("access-control-expose-headers", "X-Total"),
                ("access-control-max-age", "600"),
            ];
            for (name, value) in want {
                assert_eq!(reply.header(name), Some(value), "{version} {origin} {name}");
            }
            assert_eq!(
                reply.header("access-control-allow-credentials"),
                None,
                "{version}"
            );
        }
        let before = web.served();
        let denied = curl::get(
            &ingress,
            "listed.test",
            "/",
            version,
            &preflight("Origin: https://evil.example"),
        );
        assert_eq!(denied.backend(), "web", "{version}");
        assert_eq!(
            denied.header("access-control-allow-origin"),
            None,
            "{version}"
        );
        assert_eq!(web.served(), before + 1);
        let plain = curl::get(&ingress, "listed.test", "/", version, &[]);
        assert_eq!(
            plain.header("access-control-allow-origin"),
            None,
            "{version}"
        );
    }
}
