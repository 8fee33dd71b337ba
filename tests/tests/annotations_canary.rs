//! ingress-nginx's canary annotations through the real binary, over HTTP/1.1 and h2c with
//! curl: a canary Ingress with the same host and path as a main one takes the requests its
//! header, cookie or weight says (in that order), keeps the main's other annotations, and
//! serves nothing where there is no main Ingress.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use ingress_tests::curl::{self, VERSIONS};
use ingress_tests::manifests::{annotated_ingress, service};
use ingress_tests::process::Ingress;
use ingress_tests::scratch::Scratch;
use ingress_tests::upstream::Backend;

#[test]
fn canary_by_header_cookie_and_weight() {
    let (main, canary) = (Backend::start("main"), Backend::start("canary"));
    let dir = Scratch::new("annotations-canary");
    let mut manifests = service("t", "main", &[&main]) + &service("t", "canary", &[&canary]);
    // (host, canary annotations)
    let sites: &[(&str, &[(&str, &str)])] = &[
        ("header.test", &[("canary-by-header", "X-Canary")]),
        (
            "value.test",
            &[
                ("canary-by-header", "X-Canary"),
                ("canary-by-header-value", "DoCanary"),
                ("canary-by-cookie", "CanaryCookie"),
            ],
        ),
        (
            "pattern.test",
            &[
                ("canary-by-header", "X-Canary"),
                ("canary-by-header-pattern", "^Do[A-Z][a-z]+y$"),
            ],
        ),
        (
            "cookie.test",
            &[
                ("canary-by-cookie", "CanaryCookie"),
                ("canary-weight", "100"),
            ],
        ),
        (
            "all.test",
            &[("canary-weight", "200"), ("canary-weight-total", "200")],
        ),
        ("split.test", &[("canary-weight", "50")]),
    ];
    for (i, (host, annotations)) in sites.iter().enumerate() {
        let day = u8::try_from(2 * i + 1).unwrap();
        let mut canary_annotations = vec![("canary", "true"), ("x-forwarded-prefix", "/ignored")];
        canary_annotations.extend_from_slice(annotations);
        manifests += &annotated_ingress(
            "t",
            &format!("main-{i}"),
            day + 1,
            &[("rewrite-target", "/rewritten")],
            &[(host, "/app", "Prefix", "main")],
        );
        // Older than its main Ingress, and still its canary.
        manifests += &annotated_ingress(
            "t",
            &format!("canary-{i}"),
            day,
            &canary_annotations,
            &[(host, "/app", "Prefix", "canary")],
        );
    }
    // A canary without a main Ingress serves nothing.
    manifests += &annotated_ingress(
        "t",
        "lonely",
        30,
        &[("canary", "true"), ("canary-by-header", "X-Canary")],
        &[("lonely.test", "/app", "Prefix", "canary")],
    );
    dir.write("all.yaml", &manifests);
    let ingress = Ingress::start(dir.path());

    // (host, extra curl arguments, backend)
    let cases: &[(&str, &[&str], &str)] = &[
        ("header.test", &[], "main"),
        ("header.test", &["-H", "X-Canary: always"], "canary"),
        ("header.test", &["-H", "x-canary: always"], "canary"),
        ("header.test", &["-H", "X-Canary: never"], "main"),
        ("header.test", &["-H", "X-Canary: sometimes"], "main"),
        ("value.test", &["-H", "X-Canary: DoCanary"], "canary"),
        ("value.test", &["-H", "X-Canary: always"], "main"),
        // A header that does not match falls through to the cookie.
        (
            "value.test",
            &["-H", "X-Canary: no", "-b", "CanaryCookie=always"],
            "canary",
        ),
        ("value.test", &["-b", "a=1; CanaryCookie=always"], "canary"),
        ("value.test", &["-b", "CanaryCookie=never"], "main"),
        ("pattern.test", &["-H", "X-Canary: DoCanary"], "canary"),
        ("pattern.test", &["-H", "X-Canary: Docanary"], "main"),
        // Cookie before the weight of 100.
        ("cookie.test", &["-b", "CanaryCookie=never"], "main"),
        ("cookie.test", &["-b", "CanaryCookie=always"], "canary"),
        ("cookie.test", &[], "canary"),
        ("all.test", &[], "canary"),
        ("lonely.test", &["-H", "X-Canary: always"], "<404>"),
    ];
    for version in VERSIONS {
        for (host, extra, want) in cases {
            let reply = curl::get(&ingress, host, "/app/x?q=1", version, extra);
            assert_eq!(reply.backend(), *want, "{version} {host} {extra:?}");
            // Canary or not, the main Ingress's rewrite applies, and the canary's own
            // annotation does not.
            if let Some(echo) = reply.echo() {
                assert_eq!(echo.uri, "/rewritten?q=1", "{version} {host} {extra:?}");
                assert_eq!(echo.headers.get("x-forwarded-prefix"), None);
            }
        }
        // A weight of 50: both backends within a bounded number of requests (the chance of
        // one side never showing in 60 is 2^-59).
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..60 {
            seen.insert(curl::get(&ingress, "split.test", "/app", version, &[]).backend());
            if seen.len() == 2 {
                break;
            }
        }
        assert_eq!(
            seen.into_iter().collect::<Vec<_>>(),
            ["canary", "main"],
            "{version}"
        );
    }
}

/// With affinity on the main Ingress, a session stays on the backend it began on, canary or
/// not (`affinity-canary-behavior: sticky`, the default); `legacy` lets the canary rules decide.
#[test]
fn sessions_stay_with_their_backend_unless_the_canary_is_legacy() {
    let (main, canary) = (Backend::start("main"), Backend::start("canary"));
    let dir = Scratch::new("annotations-canary-affinity");
    let mut manifests = service("t", "main", &[&main]) + &service("t", "canary", &[&canary]);
    for (i, (host, behaviour)) in [("sticky.test", "sticky"), ("legacy.test", "legacy")]
        .into_iter()
        .enumerate()
    {
        let day = u8::try_from(2 * i + 1).unwrap();
        manifests += &annotated_ingress(
            "t",
            &format!("main-{i}"),
            day,
            &[("affinity", "cookie")],
            &[(host, "/", "Prefix", "main")],
        );
        manifests += &annotated_ingress(
            "t",
            &format!("canary-{i}"),
            day + 1,
            &[
                ("canary", "true"),
                ("canary-by-header", "X-Canary"),
                ("affinity-canary-behavior", behaviour),
            ],
            &[(host, "/", "Prefix", "canary")],
        );
    }
    dir.write("all.yaml", &manifests);
    let ingress = Ingress::start(dir.path());
    let session = |reply: &curl::Reply| {
        reply
            .header("set-cookie")
            .and_then(|c| c.split(';').next())
            .map(str::to_string)
            .expect("a session cookie")
    };
    for version in VERSIONS {
        for (host, with_main_session) in [("sticky.test", "main"), ("legacy.test", "canary")] {
            // A session begun on each backend.
            let on_main = curl::get(&ingress, host, "/", version, &["-H", "X-Canary: never"]);
            assert_eq!(on_main.backend(), "main");
            let main_cookie = session(&on_main);
            let on_canary = curl::get(&ingress, host, "/", version, &["-H", "X-Canary: always"]);
            assert_eq!(on_canary.backend(), "canary");
            let canary_cookie = session(&on_canary);
            // The header now asks for the other backend each time.
            let got = curl::get(
                &ingress,
                host,
                "/",
                version,
                &["-H", "X-Canary: always", "-b", &main_cookie],
            );
            assert_eq!(got.backend(), with_main_session, "{version} {host}");
            let got = curl::get(
                &ingress,
                host,
                "/",
                version,
                &["-H", "X-Canary: never", "-b", &canary_cookie],
            );
            let want = if host == "sticky.test" {
                "canary"
            } else {
                "main"
            };
            assert_eq!(got.backend(), want, "{version} {host}");
        }
    }
}
