//! `default-backend` through the real binary, over HTTP/1.1 and h2c with curl: a route whose
//! Service has no endpoint is answered by the annotation's Service; one whose Service has
//! endpoints is not; without the annotation the empty Service answers 503.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use ingress_tests::curl::{self, VERSIONS};
use ingress_tests::manifests::{annotated_ingress, service};
use ingress_tests::process::Ingress;
use ingress_tests::scratch::Scratch;
use ingress_tests::upstream::Backend;

#[test]
fn a_backend_without_endpoints_falls_back_to_the_default_backend() {
    let (web, errors) = (Backend::start("web"), Backend::start("errors"));
    let dir = Scratch::new("annotations-default-backend");
    let manifests = [
        service("t", "web", &[&web]),
        service("t", "empty", &[]),
        service("t", "errors", &[&errors]),
        annotated_ingress(
            "t",
            "fallback",
            1,
            &[("default-backend", "errors")],
            &[
                ("fallback.test", "/", "Prefix", "empty"),
                ("fallback.test", "/web", "Prefix", "web"),
            ],
        ),
        annotated_ingress(
            "t",
            "plain",
            2,
            &[],
            &[("plain.test", "/", "Prefix", "empty")],
        ),
    ]
    .concat();
    dir.write("all.yaml", &manifests);
    let ingress = Ingress::start(dir.path());
    for version in VERSIONS {
        let reply = curl::get(&ingress, "fallback.test", "/page", version, &[]);
        assert_eq!(reply.status, 200, "{version}");
        assert_eq!(reply.backend(), "errors", "{version}");
        let reply = curl::get(&ingress, "fallback.test", "/web/x", version, &[]);
        assert_eq!(reply.backend(), "web", "{version}");
        let reply = curl::get(&ingress, "plain.test", "/page", version, &[]);
        assert_eq!(reply.status, 503, "{version}");
    }
}
