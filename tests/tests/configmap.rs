//! ingress-nginx's global ConfigMap (`--configmap`) in manifests mode, through the real binary
//! with curl: its keys override the flags and apply live when the file changes (no restart),
//! annotations still override it, a key that is not applied is reported by `ingress check`
//! with why, and removing it brings the flags' values back.

// A plain #[test] with no runtime: blocking sleeps between polls are what it should do.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::disallowed_methods)]

use std::time::Duration;

use ingress_tests::curl;
use ingress_tests::manifests::{self, annotated_ingress, service};
use ingress_tests::pki::{Ca, secret_yaml};
use ingress_tests::poll::eventually;
use ingress_tests::process::{Ingress, check};
use ingress_tests::scratch::Scratch;
use ingress_tests::upstream::Backend;

const FLAG: &str = "t/ingress-config";

/// The ConfigMap `--configmap` names, holding `data`.
fn config_map(data: &[(&str, &str)]) -> String {
    manifests::config_map("t", "ingress-config", data)
}

#[test]
fn configmap_keys_apply_live_and_annotations_override_them() {
    let web = Backend::start("web");
    let ca = Ca::new("test CA");
    let leaf = ca.server("site", &["secure.test"]);
    let dir = Scratch::new("configmap-live");
    let secure = "---\napiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {name: secure, namespace: t}\nspec:\n  ingressClassName: ingress\n  tls: [{hosts: [secure.test], secretName: site}]\n  rules:\n  - host: secure.test\n    http: {paths: [{path: /, pathType: Prefix, backend: {service: {name: web, port: {number: 80}}}}]}\n";
    dir.write(
        "site.yaml",
        &[
            service("t", "web", &[&web]),
            secret_yaml("t", "site", &leaf.chain, &leaf.key),
            secure.to_string(),
            annotated_ingress(
                "t",
                "plain",
                1,
                &[],
                &[("plain.test", "/", "Prefix", "web")],
            ),
            annotated_ingress(
                "t",
                "own",
                2,
                &[("proxy-body-size", "4k")],
                &[("own.test", "/", "Prefix", "web")],
            ),
        ]
        .concat(),
    );
    dir.write(
        "config.yaml",
        &config_map(&[
            ("proxy-body-size", "8k"),
            ("hsts", "false"),
            ("load-balance", "ewma"),
        ]),
    );
    let ca_file = dir.write("ca.pem", &ca.pem);
    let body = dir.write("body", &"x".repeat(9 * 1024));
    let small = dir.write("small", &"x".repeat(5 * 1024));
    let ingress = Ingress::builder()
        .manifests(dir.path())
        .args(["--configmap", FLAG])
        .start();
    let post = |host: &str, file: &std::path::Path| -> u16 {
        curl::status(&[
            "-H",
            &format!("Host: {host}"),
            "--data-binary",
            &format!("@{}", file.display()),
            &ingress.url("/upload"),
        ])
    };
    let port = ingress.https.port();
    let hsts = || -> Option<String> {
        let head = curl::verified_https_head(&ca_file, "secure.test", port, "/");
        assert!(head.starts_with("HTTP/"), "no HTTPS answer: {head}");
        head.lines().find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("strict-transport-security: ")
                .map(|v| v.trim().to_string())
        })
    };
    // The ConfigMap's 8k, not the flag's 1m; the annotation's 4k beats the ConfigMap.
    assert_eq!(post("plain.test", &body), 413);
    assert_eq!(post("plain.test", &small), 200);
    assert_eq!(post("own.test", &small), 413);
    assert_eq!(hsts(), None, "hsts: false in the ConfigMap");

    // `ingress check` reports the key that is not applied, and why.
    let checked = check(dir.path(), &["--configmap", FLAG]);
    let report = String::from_utf8_lossy(&checked.stdout);
    assert!(
        report.contains("ConfigMap t/ingress-config")
            && report.contains("load-balance: ignored, not supported"),
        "{report}"
    );

    // A change to the file applies live.
    dir.replace(
        "config.yaml",
        &config_map(&[
            ("proxy-body-size", "16k"),
            ("hsts", "true"),
            ("hsts-max-age", "600"),
            ("hsts-preload", "true"),
        ]),
    );
    eventually("the new body limit", 200, || post("plain.test", &body));
    assert_eq!(
        hsts().as_deref(),
        Some("max-age=600; preload"),
        "the ConfigMap's HSTS"
    );
    assert_eq!(post("own.test", &small), 413, "the annotation still wins");

    // An invalid value keeps the default (the flag's), and says so.
    dir.replace(
        "config.yaml",
        &config_map(&[("proxy-body-size", "lots"), ("hsts", "on")]),
    );
    eventually(
        "the flags' HSTS",
        Some("max-age=31536000".to_string()),
        hsts,
    );
    assert_eq!(post("plain.test", &body), 200, "the flag's 1m");
    assert!(
        ingress.wait_for_log("InvalidConfigValue", Duration::from_secs(5)),
        "{}",
        ingress.logs()
    );

    // upstream-keepalive-connections: kept idle connections are reused (one connection for
    // three requests); with 0 none is kept (one connection each).
    let fresh = |n: usize| {
        let before = web.connections();
        for _ in 0..n {
            assert_eq!(post("plain.test", &small), 200);
        }
        web.connections() - before
    };
    fresh(1);
    assert_eq!(fresh(3), 0, "pooled connections are reused");
    dir.replace(
        "config.yaml",
        &config_map(&[("upstream-keepalive-connections", "0")]),
    );
    eventually("no idle upstream connection kept", 3, || fresh(3));

    // Without the ConfigMap the flags apply again.
    dir.replace("config.yaml", &config_map(&[("proxy-body-size", "8k")]));
    eventually("the ConfigMap's limit again", 413, || {
        post("plain.test", &body)
    });
    std::fs::remove_file(dir.path().join("config.yaml")).unwrap();
    eventually("the flag's limit", 200, || post("plain.test", &body));
    assert!(
        ingress.wait_for_log("ConfigMapNotFound", Duration::from_secs(5)),
        "{}",
        ingress.logs()
    );
}

/// The ConfigMap's global access keys, live: `whitelist-source-range` and
/// `denylist-source-range` for routes whose Ingress sets no list of its own (403), a range
/// that does not parse refusing those routes (503, never open), and `limit-req-status-code`
/// for a route over its `limit-rps`.
#[test]
fn global_source_ranges_and_the_limit_status_apply_live() {
    let web = Backend::start("web");
    let dir = Scratch::new("configmap-access");
    dir.write(
        "site.yaml",
        &[
            service("t", "web", &[&web]),
            annotated_ingress(
                "t",
                "plain",
                1,
                &[],
                &[("plain.test", "/", "Prefix", "web")],
            ),
            annotated_ingress(
                "t",
                "own",
                2,
                &[("whitelist-source-range", "127.0.0.1/32")],
                &[("own.test", "/", "Prefix", "web")],
            ),
            // One a second with nginx's default burst of 5: a quick run of 20 goes over. Its own
            // deny-list keeps the global one off it.
            annotated_ingress(
                "t",
                "limited",
                3,
                &[("limit-rps", "1"), ("denylist-source-range", "10.0.0.0/8")],
                &[("limited.test", "/", "Prefix", "web")],
            ),
        ]
        .concat(),
    );
    dir.write(
        "config.yaml",
        &config_map(&[("whitelist-source-range", "10.0.0.0/8")]),
    );
    let ingress = Ingress::builder()
        .manifests(dir.path())
        .args(["--configmap", FLAG])
        .start();
    let status = |host: &str| curl::get(&ingress, host, "/", "--http1.1", &[]).status;
    assert_eq!(status("plain.test"), 403, "outside the global allow-list");
    assert_eq!(status("own.test"), 200, "the Ingress's own list wins");

    dir.replace(
        "config.yaml",
        &config_map(&[
            ("denylist-source-range", "127.0.0.0/8"),
            ("limit-req-status-code", "429"),
        ]),
    );
    // Each list is its own default, as ingress-nginx's parsers take them: an Ingress with its
    // own allow-list and no deny-list gets the global deny-list.
    eventually("the global deny-list", 403, || status("own.test"));
    assert_eq!(status("plain.test"), 403);
    let limited: Vec<u16> = (0..20).map(|_| status("limited.test")).collect();
    assert!(
        limited.contains(&429) && !limited.contains(&503),
        "limit-req-status-code 429: {limited:?}"
    );

    // A range that does not parse: the routes that would use it are refused, not served open.
    dir.replace(
        "config.yaml",
        &config_map(&[("whitelist-source-range", "10.0.0.0/33")]),
    );
    eventually("the invalid range refusing", 503, || status("plain.test"));
    assert_eq!(
        status("own.test"),
        200,
        "its own allow-list is not the invalid one"
    );
    dir.replace("config.yaml", &config_map(&[]));
    eventually("no global range", 200, || status("plain.test"));
}
