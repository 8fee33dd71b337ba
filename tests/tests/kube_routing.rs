//! Routing from the Kubernetes API: real kubectl writes to the test API server, the real binary
//! watches it, and real traffic shows where requests go.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod kube_support;

use std::time::{Duration, Instant};

use ingress_tests::client;
use ingress_tests::manifests::{ingress, service, with_tls};
use ingress_tests::pki::{Ca, secret_yaml};
use ingress_tests::upstream::Backend;
use kube_support::{
    CLASS, Cluster, TIMEOUT, Traffic, assert_answered_by, eventually, metric, wait_ready,
    wait_routed, who,
};

/// Routable within a second of `kubectl apply`; a backend change under continuous traffic moves
/// it with no failed request; an EndpointSlice change does too; delete → 404.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn apply_change_and_delete_follow_kubectl() {
    let (a, b, c) = (
        Backend::start("a"),
        Backend::start("b"),
        Backend::start("c"),
    );
    let cluster = Cluster::start().await;
    cluster
        .apply(
            &(CLASS.to_string()
                + &service("app", "web-a", &[&a])
                + &service("app", "web-b", &[&b])),
        )
        .await;
    let proc = cluster.ingress().start();
    wait_ready(&proc).await;
    let http = client::http1();
    assert_eq!(who(&http, &proc, "app.example.com", "/").await, "<404>");

    cluster
        .apply(&ingress(
            "app",
            "web",
            &[("app.example.com", "/", "Prefix", "web-a")],
        ))
        .await;
    let applied = Instant::now();
    wait_routed(&http, &proc, "app.example.com", "a", TIMEOUT).await;
    let latency = applied.elapsed();
    assert!(
        latency < Duration::from_secs(1),
        "routable {latency:?} after kubectl apply returned"
    );

    // Move the Ingress to another Service while traffic flows.
    let traffic = Traffic::start(&proc, "app.example.com", Duration::from_secs(60));
    traffic.wait_more(50).await;
    cluster
        .apply(&ingress(
            "app",
            "web",
            &[("app.example.com", "/", "Prefix", "web-b")],
        ))
        .await;
    wait_routed(&http, &proc, "app.example.com", "b", TIMEOUT).await;
    traffic.wait_more(50).await;
    // Move the Service's endpoints: its EndpointSlice now lists backend c instead of b.
    cluster.apply(&service("app", "web-b", &[&c])).await;
    wait_routed(&http, &proc, "app.example.com", "c", TIMEOUT).await;
    traffic.wait_more(50).await;
    let answers = traffic.stop().await;
    assert_answered_by(
        &answers,
        &["a", "b", "c"],
        "failed requests during the changes",
    );
    let order: Vec<&str> = answers.iter().map(|a| a.backend.as_str()).collect();
    let first_b = order.iter().position(|b| *b == "b").expect("b answered");
    let first_c = order.iter().position(|b| *b == "c").expect("c answered");
    assert!(
        !order[first_b..].contains(&"a"),
        "a answered again after the switch to b"
    );
    assert!(
        !order[first_c..].contains(&"b"),
        "b answered again after the switch to c"
    );

    cluster.ok(&["delete", "ingress", "web", "-n", "app"]).await;
    let deleted = Instant::now();
    wait_routed(&http, &proc, "app.example.com", "<404>", TIMEOUT).await;
    assert!(
        deleted.elapsed() < Duration::from_secs(1),
        "still routed {:?} after kubectl delete returned",
        deleted.elapsed()
    );
}

/// `--watch-namespace` limits every namespaced watch to one namespace; IngressClasses stay
/// cluster-wide.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn watch_namespace_limits_scope() {
    let (inside, outside) = (Backend::start("inside"), Backend::start("outside"));
    let cluster = Cluster::start().await;
    cluster
        .apply(
            &(CLASS.to_string()
                + &service("mine", "web", &[&inside])
                + &service("theirs", "web", &[&outside])
                + &ingress("mine", "web", &[("mine.example.com", "/", "Prefix", "web")])
                + &ingress(
                    "theirs",
                    "web",
                    &[("theirs.example.com", "/", "Prefix", "web")],
                )),
        )
        .await;
    let proc = cluster
        .ingress()
        .args(["--watch-namespace", "mine"])
        .start();
    wait_ready(&proc).await;
    let http = client::http1();
    assert_eq!(who(&http, &proc, "mine.example.com", "/").await, "inside");
    assert_eq!(who(&http, &proc, "theirs.example.com", "/").await, "<404>");
    // A change outside the namespace is not seen either.
    cluster
        .apply(&ingress(
            "theirs",
            "other",
            &[("other.example.com", "/", "Prefix", "web")],
        ))
        .await;
    cluster
        .apply(&ingress(
            "mine",
            "other",
            &[("other.example.com", "/", "Prefix", "web")],
        ))
        .await;
    wait_routed(&http, &proc, "other.example.com", "inside", TIMEOUT).await;

    let watched = cluster.controller_requests(|r| r.method == "GET");
    let namespaced = ["/ingresses", "/services", "/endpointslices", "/secrets"];
    for kind in namespaced {
        let hits: Vec<_> = watched.iter().filter(|r| r.path.ends_with(kind)).collect();
        assert!(!hits.is_empty(), "no list or watch of {kind}");
        for r in hits {
            assert!(
                r.path.contains("/namespaces/mine/"),
                "{kind} read outside the namespace: {}",
                r.path
            );
        }
    }
    assert!(
        watched
            .iter()
            .any(|r| r.path == "/apis/networking.k8s.io/v1/ingressclasses"),
        "IngressClasses are cluster-scoped"
    );
}

/// Secrets are listed and watched with the field selector that leaves out the types no Ingress
/// can name: a TLS Secret and an `Opaque` one (as `kubectl create secret generic` makes) both
/// serve their certificates, and a Helm release record is never read.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn secrets_an_ingress_can_name_and_no_others() {
    let web = Backend::start("web");
    let cluster = Cluster::start().await;
    let ca = Ca::new("kube test CA");
    let leaf = |host: &str| ca.server(host, &[host]);
    let (secure, generic, helm) = (
        leaf("secure.example.com"),
        leaf("generic.example.com"),
        leaf("helm.example.com"),
    );
    let tls_ingress = |name: &str, host: &str, secret: &str| {
        with_tls(
            &ingress("app", name, &[(host, "/", "Prefix", "web")]),
            host,
            secret,
        )
    };
    let retyped =
        |yaml: String, ty: &str| yaml.replace("type: kubernetes.io/tls", &format!("type: {ty}"));
    cluster
        .apply(
            &(CLASS.to_string()
                + &service("app", "web", &[&web])
                + &secret_yaml("app", "secure-tls", &secure.chain, &secure.key)
                + &retyped(
                    secret_yaml("app", "generic-tls", &generic.chain, &generic.key),
                    "Opaque",
                )
                + &retyped(
                    secret_yaml("app", "helm-tls", &helm.chain, &helm.key),
                    "helm.sh/release.v1",
                )
                + &tls_ingress("secure", "secure.example.com", "secure-tls")
                + &tls_ingress("generic", "generic.example.com", "generic-tls")
                + &tls_ingress("helm", "helm.example.com", "helm-tls")),
        )
        .await;
    let proc = cluster.ingress().start();
    wait_ready(&proc).await;
    for secret in ["secure-tls", "generic-tls"] {
        eventually(
            &format!("certificate loaded from the Secret {secret}"),
            TIMEOUT,
            async || match metric(
                &proc,
                "ingress_certificate_expiry_timestamp_seconds",
                &[("namespace", "app"), ("secret", secret)],
            )
            .await
            {
                Some(v) if v > 0.0 => Ok(()),
                other => Err(format!("{other:?}")),
            },
        )
        .await;
    }
    assert_eq!(
        metric(
            &proc,
            "ingress_certificate_expiry_timestamp_seconds",
            &[("namespace", "app"), ("secret", "helm-tls")],
        )
        .await,
        None,
        "a Helm release record was read as a certificate"
    );
    let secret_reads = cluster.controller_requests(|r| r.path.ends_with("/secrets"));
    assert!(
        secret_reads.iter().any(|r| r.is_watch()) && secret_reads.iter().any(|r| !r.is_watch()),
        "{secret_reads:?}"
    );
    for r in &secret_reads {
        assert_eq!(
            r.param("fieldSelector").as_deref(),
            Some(ingress::source::kube::SECRET_FIELD_SELECTOR),
            "{r:?}"
        );
    }
    let http = client::http1();
    // Plain HTTP to a TLS host redirects: the Ingress and its Secret both arrived.
    assert_eq!(who(&http, &proc, "secure.example.com", "/").await, "<308>");
}
