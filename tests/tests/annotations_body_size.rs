//! `proxy-body-size` and `--proxy-body-size` through the real binary, over HTTP/1.1 and h2c
//! with curl: a declared body over the route's limit is answered 413 without reaching the
//! backend, a streamed (chunked, or h2 without a length) one is cut off with 413, and the
//! default limit is ingress-nginx's 1m. The buffering annotations beside it are accepted as
//! no-ops: served as before, and `ingress check` says so.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use ingress_tests::curl::{self, VERSIONS};
use ingress_tests::manifests::{annotated_ingress, service};
use ingress_tests::process::{Ingress, check};
use ingress_tests::scratch::Scratch;
use ingress_tests::upstream::Backend;

#[test]
fn bodies_over_the_routes_limit_get_413() {
    let web = Backend::start("web");
    let dir = Scratch::new("annotations-body-size");
    let manifests = [
        service("t", "web", &[&web]),
        annotated_ingress(
            "t",
            "small",
            1,
            &[("proxy-body-size", "8k")],
            &[("small.test", "/", "Prefix", "web")],
        ),
        annotated_ingress(
            "t",
            "default",
            2,
            &[],
            &[("default.test", "/", "Prefix", "web")],
        ),
        annotated_ingress(
            "t",
            "open",
            3,
            &[("proxy-body-size", "0")],
            &[("open.test", "/", "Prefix", "web")],
        ),
    ]
    .concat();
    dir.write("all.yaml", &manifests);
    let body = |n: usize| {
        let path = dir.write(&format!("body-{n}"), &"x".repeat(n));
        format!("@{}", path.display())
    };
    let (kib8, kib9, mib2) = (body(8 * 1024), body(9 * 1024), body(2 << 20));
    let ingress = Ingress::start(dir.path());
    // (host, body file, chunked, status)
    let cases = [
        ("small.test", &kib8, false, 200),
        ("small.test", &kib9, false, 413),
        ("small.test", &kib9, true, 413),
        ("small.test", &kib8, true, 200),
        ("default.test", &kib9, false, 200),
        ("default.test", &mib2, false, 413),
        ("default.test", &mib2, true, 413),
        ("open.test", &mib2, false, 200),
        ("open.test", &mib2, true, 200),
    ];
    for version in VERSIONS {
        for (host, file, chunked, status) in &cases {
            // An h2 upload refused while the client still has more than a flow-control window
            // to send ends in a stream reset that curl reports instead of the 413 (see
            // docs/annotations.md); h2 is checked with bodies that fit the window.
            if version == VERSIONS[1] && file.as_str() == mib2.as_str() && *status == 413 {
                continue;
            }
            let before = web.served();
            let mut args = vec!["--data-binary", file.as_str()];
            if *chunked {
                args.extend(["-H", "Transfer-Encoding: chunked"]);
            }
            let reply = curl::get(&ingress, host, "/upload", version, &args);
            assert_eq!(
                reply.status, *status,
                "{version} {host} {file} chunked {chunked}"
            );
            if *status == 413 && !chunked {
                assert_eq!(
                    web.served(),
                    before,
                    "{version} {host}: refused before the backend"
                );
            }
            if *status == 200 {
                let echo = reply.echo().expect("echo");
                assert_eq!(
                    u64::try_from(echo.body_len).unwrap(),
                    std::fs::metadata(&file[1..]).unwrap().len()
                );
            }
        }
    }
}

#[test]
fn buffering_annotations_are_accepted_no_ops_and_reported_so() {
    let web = Backend::start("web");
    let dir = Scratch::new("annotations-buffering");
    let manifests = [
        service("t", "web", &[&web]),
        annotated_ingress(
            "t",
            "buffered",
            1,
            &[
                ("proxy-buffering", "on"),
                ("proxy-request-buffering", "on"),
                ("proxy-buffer-size", "16k"),
                ("client-body-buffer-size", "1m"),
                ("proxy-body-size", "8k"),
            ],
            &[("buffered.test", "/", "Prefix", "web")],
        ),
        annotated_ingress(
            "t",
            "typo",
            2,
            &[("proxy-buffering", "yes")],
            &[("typo.test", "/", "Prefix", "web")],
        ),
    ]
    .concat();
    dir.write("all.yaml", &manifests);
    let body = dir.write("body", &"x".repeat(9 * 1024));
    let body = format!("@{}", body.display());
    let ingress = Ingress::start(dir.path());
    for version in VERSIONS {
        let reply = curl::get(&ingress, "buffered.test", "/", version, &[]);
        assert_eq!(reply.status, 200, "{version}");
        // proxy-body-size is enforced with request buffering asked for or not (HTTP/1.1 only:
        // over h2 curl may report the stream reset that follows an early 413 instead of the
        // 413, see docs/annotations.md; bodies_over_the_routes_limit_get_413 meets it too).
        if version == VERSIONS[0] {
            let reply = curl::get(
                &ingress,
                "buffered.test",
                "/",
                version,
                &["--data-binary", &body],
            );
            assert_eq!(reply.status, 413, "{version}");
        }
    }
    let out = check(dir.path(), &["--output", "json"]);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let rows = |name: &str| -> Vec<(String, String)> {
        json["migration"]["ingresses"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["ingress"] == format!("t/{name}"))
            .expect("row")["annotations"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| {
                (
                    a["key"]
                        .as_str()
                        .unwrap()
                        .rsplit('/')
                        .next()
                        .unwrap()
                        .to_string(),
                    a["outcome"].as_str().unwrap().to_string(),
                )
            })
            .collect()
    };
    let pairs = |v: &[(&str, &str)]| -> Vec<(String, String)> {
        v.iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    };
    assert_eq!(
        rows("buffered"),
        pairs(&[
            ("client-body-buffer-size", "no-op"),
            ("proxy-body-size", "applied"),
            ("proxy-buffer-size", "no-op"),
            ("proxy-buffering", "no-op"),
            ("proxy-request-buffering", "no-op"),
        ])
    );
    assert_eq!(rows("typo"), pairs(&[("proxy-buffering", "invalid")]));
    assert_eq!(
        json["migration"]["summary"]["no_op"], 4,
        "{}",
        json["migration"]
    );
}
