//! ingress-nginx's redirect annotations through the real binary, over HTTP/1.1 and h2c with
//! curl: `permanent-redirect` and `temporal-redirect` with their codes, `from-to-www-redirect`,
//! `server-alias`, and the HTTPS redirect's exact `Location` with `preserve-trailing-slash`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use ingress_tests::curl::{self, VERSIONS};
use ingress_tests::manifests::{annotated_ingress, service};
use ingress_tests::process::Ingress;
use ingress_tests::scratch::Scratch;
use ingress_tests::upstream::Backend;

#[test]
fn redirect_annotations_answer_as_ingress_nginx_does() {
    let web = Backend::start("web");
    let dir = Scratch::new("annotations-redirects");
    let root = |host: &'static str| [(host, "/", "Prefix", "web")];
    let manifests = [
        service("t", "web", &[&web]),
        annotated_ingress(
            "t",
            "moved",
            1,
            &[("permanent-redirect", "https://new.test/landing?from=old")],
            &root("moved.test"),
        ),
        annotated_ingress(
            "t",
            "moved308",
            2,
            &[
                ("permanent-redirect", "http://new.test"),
                ("permanent-redirect-code", "308"),
            ],
            &root("moved308.test"),
        ),
        annotated_ingress(
            "t",
            "away",
            3,
            &[
                ("temporal-redirect", "http://tmp.test/x"),
                ("temporal-redirect-code", "307"),
                ("permanent-redirect", "http://ignored.test/"),
            ],
            &root("away.test"),
        ),
        annotated_ingress(
            "t",
            "www",
            4,
            &[
                ("from-to-www-redirect", "true"),
                ("server-alias", "alias.test, *.aliases.test"),
            ],
            &root("shop.test"),
        ),
        annotated_ingress(
            "t",
            "forced",
            5,
            &[("force-ssl-redirect", "true")],
            &root("forced.test"),
        ),
        annotated_ingress(
            "t",
            "slash",
            6,
            &[
                ("force-ssl-redirect", "true"),
                ("preserve-trailing-slash", "true"),
            ],
            &root("slash.test"),
        ),
    ]
    .concat();
    dir.write("all.yaml", &manifests);
    let ingress = Ingress::start(dir.path());
    let http = ingress.http.port();
    let https = ingress.https.port();

    // (host, path, status, Location or the backend that answered)
    let cases: Vec<(&str, &str, u16, String)> = vec![
        (
            "moved.test",
            "/a/b?c=d",
            301,
            "https://new.test/landing?from=old".into(),
        ),
        ("moved308.test", "/", 308, "http://new.test".into()),
        ("away.test", "/a", 307, "http://tmp.test/x".into()),
        (
            "www.shop.test",
            "/foo",
            308,
            format!("http://shop.test:{http}/foo"),
        ),
        (
            "www.shop.test",
            "/foo/?a=1",
            308,
            format!("http://shop.test:{http}/foo/?a=1"),
        ),
        (
            "www.shop.test",
            "/",
            308,
            format!("http://shop.test:{http}"),
        ),
        ("shop.test", "/foo", 200, "web".into()),
        ("alias.test", "/foo", 200, "web".into()),
        ("x.aliases.test", "/foo", 200, "web".into()),
        (
            "forced.test",
            "/a/?q=1",
            308,
            format!("https://forced.test:{https}/a/?q=1"),
        ),
        (
            "forced.test",
            "/a/",
            308,
            format!("https://forced.test:{https}/a"),
        ),
        (
            "forced.test",
            "/",
            308,
            format!("https://forced.test:{https}"),
        ),
        (
            "slash.test",
            "/a/",
            308,
            format!("https://slash.test:{https}/a/"),
        ),
        (
            "slash.test",
            "/",
            308,
            format!("https://slash.test:{https}/"),
        ),
    ];
    for version in VERSIONS {
        for (host, path, status, want) in &cases {
            let reply = curl::get(&ingress, host, path, version, &[]);
            assert_eq!(reply.status, *status, "{version} {host}{path}: {reply:?}");
            let got = match reply.status {
                200 => reply.backend(),
                _ => reply.header("location").unwrap_or("-").to_string(),
            };
            assert_eq!(&got, want, "{version} {host}{path}");
        }
    }
    assert_eq!(web.served(), 3 * VERSIONS.len());
}
