//! `affinity: cookie` through the real binary, over HTTP/1.1 and h2c with curl: the first
//! response sets ingress-nginx's cookie, and a client that sends it back stays on one endpoint
//! of a three-endpoint Service, in both modes.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;

use ingress_tests::curl::{self, VERSIONS};
use ingress_tests::manifests::{annotated_ingress, service};
use ingress_tests::process::Ingress;
use ingress_tests::scratch::Scratch;
use ingress_tests::upstream::Backend;

#[test]
fn a_session_cookie_keeps_a_client_on_one_endpoint() {
    let backends = [
        Backend::start("a"),
        Backend::start("b"),
        Backend::start("c"),
    ];
    let dir = Scratch::new("annotations-affinity");
    let manifests = [
        service("t", "web", &backends.iter().collect::<Vec<_>>()),
        annotated_ingress(
            "t",
            "balanced",
            1,
            &[("affinity", "cookie"), ("session-cookie-max-age", "60")],
            &[("balanced.test", "/app", "Prefix", "web")],
        ),
        annotated_ingress(
            "t",
            "persistent",
            2,
            &[
                ("affinity", "cookie"),
                ("affinity-mode", "persistent"),
                ("session-cookie-name", "route"),
                ("session-cookie-path", "/"),
                ("session-cookie-samesite", "Strict"),
            ],
            &[("persistent.test", "/app", "Prefix", "web")],
        ),
        annotated_ingress(
            "t",
            "plain",
            3,
            &[],
            &[("plain.test", "/", "Prefix", "web")],
        ),
    ]
    .concat();
    dir.write("all.yaml", &manifests);
    let ingress = Ingress::start(dir.path());

    // (host, cookie name, the attributes after the value)
    let sites = [
        (
            "balanced.test",
            "INGRESSCOOKIE",
            "; Max-Age=60; Path=/app; HttpOnly",
        ),
        (
            "persistent.test",
            "route",
            "; Path=/; HttpOnly; SameSite=Strict",
        ),
    ];
    for version in VERSIONS {
        for (host, name, attributes) in sites {
            let mut sessions = BTreeSet::new();
            for _ in 0..12 {
                let first = curl::get(&ingress, host, "/app/x", version, &[]);
                let cookie = first
                    .header("set-cookie")
                    .unwrap_or_else(|| panic!("{version} {host}: no Set-Cookie in {first:?}"));
                let (pair, rest) = cookie.split_once(';').map_or((cookie, ""), |(p, r)| (p, r));
                assert_eq!(format!(";{rest}"), attributes, "{version} {host}");
                let value = pair
                    .strip_prefix(&format!("{name}="))
                    .expect("the cookie's name");
                assert!(value.contains('|'), "{value}");
                let backend = first.backend();
                for _ in 0..5 {
                    let again = curl::get(&ingress, host, "/app/x", version, &["-b", pair]);
                    assert_eq!(again.backend(), backend, "{version} {host} {pair}");
                    assert_eq!(again.header("set-cookie"), None, "{version} {host}");
                }
                sessions.insert(backend);
            }
            // New sessions still spread over the endpoints.
            assert!(sessions.len() >= 2, "{version} {host}: {sessions:?}");
        }
        // A persistent cookie naming no endpoint starts a new session.
        let stale = curl::get(
            &ingress,
            "persistent.test",
            "/app",
            version,
            &["-b", "route=0000|x"],
        );
        assert!(stale.header("set-cookie").is_some(), "{version}");
        // A route without affinity sets no cookie.
        let plain = curl::get(&ingress, "plain.test", "/", version, &[]);
        assert_eq!(plain.header("set-cookie"), None, "{version}");
    }
}

/// `upstream-hash-by`: one key, one endpoint; many keys, several endpoints.
#[test]
fn upstream_hash_by_keeps_a_key_on_one_endpoint() {
    let backends = [
        Backend::start("a"),
        Backend::start("b"),
        Backend::start("c"),
    ];
    let dir = Scratch::new("annotations-hash-by");
    let manifests = [
        service("t", "web", &backends.iter().collect::<Vec<_>>()),
        annotated_ingress(
            "t",
            "by-uri",
            1,
            &[("upstream-hash-by", "$request_uri")],
            &[("uri.test", "/", "Prefix", "web")],
        ),
        annotated_ingress(
            "t",
            "by-user",
            2,
            &[("upstream-hash-by", "${http_x_user}-fixed")],
            &[("user.test", "/", "Prefix", "web")],
        ),
    ]
    .concat();
    dir.write("all.yaml", &manifests);
    let ingress = Ingress::start(dir.path());
    for version in VERSIONS {
        let mut spread = BTreeSet::new();
        for i in 0..20 {
            let path = format!("/item/{i}?x={i}");
            let first = curl::get(&ingress, "uri.test", &path, version, &[]).backend();
            for _ in 0..3 {
                assert_eq!(
                    curl::get(&ingress, "uri.test", &path, version, &[]).backend(),
                    first,
                    "{version} {path}"
                );
            }
            spread.insert(first);
            let user = format!("X-User: user{i}");
            let first = curl::get(&ingress, "user.test", "/", version, &["-H", &user]).backend();
            for n in 0..3 {
                let path = format!("/other/{n}");
                let again =
                    curl::get(&ingress, "user.test", &path, version, &["-H", &user]).backend();
                assert_eq!(again, first, "{version} {user}");
            }
        }
        assert!(spread.len() >= 2, "{version}: {spread:?}");
    }
}
