//! Diagnostics as Warning Events on the offending Ingress, read the way an operator reads them:
//! `kubectl describe ingress`. One Event per problem, however many rebuilds happen, across
//! restarts too; a problem that goes away and comes back is counted on the same Event.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod kube_support;

use std::time::Duration;

use ingress_tests::client;
use ingress_tests::manifests::{ingress, service, with_tls};
use ingress_tests::pki::{Ca, secret_yaml};
use ingress_tests::upstream::Backend;
use kube_support::{
    CLASS, Cluster, TIMEOUT, eventually, metric, wait_leading, wait_ready, wait_routed,
};
use serde_json::Value;

/// (Ingress, Event reason, a fragment of its message)
const CASES: &[(&str, &str, &str)] = &[
    ("missing-service", "ServiceNotFound", "nope"),
    ("missing-port", "ServicePortNotFound", "8080"),
    ("missing-secret", "SecretNotFound", "absent-tls"),
    ("garbage-secret", "SecretInvalid", "garbage-tls"),
    (
        "mismatched-secret",
        "CertificateKeyMismatch",
        "mismatched-tls",
    ),
    ("bad-regex", "InvalidRegex", "(unclosed"),
    ("conflict-b", "ConflictingRule", "conflict-a"),
];

fn manifests(web: &Backend) -> String {
    let ca = Ca::new("events CA");
    let one = ca.server("mismatched.example.com", &["mismatched.example.com"]);
    let other = ca.server("other", &["other"]);
    let garbage = "---\napiVersion: v1\nkind: Secret\nmetadata: {name: garbage-tls, namespace: app}\ntype: kubernetes.io/tls\nstringData: {tls.crt: not a certificate, tls.key: not a key}\n";
    let mut yaml = CLASS.to_string()
        + &service("app", "web", &[web])
        + garbage
        + &secret_yaml("app", "mismatched-tls", &one.chain, &other.key);
    yaml += &ingress(
        "app",
        "missing-service",
        &[("missing-service.example.com", "/", "Prefix", "nope")],
    );
    yaml += &ingress(
        "app",
        "missing-port",
        &[("missing-port.example.com", "/", "Prefix", "web")],
    )
    .replace("number: 80", "number: 8080");
    yaml += &with_tls(
        &ingress(
            "app",
            "missing-secret",
            &[("missing-secret.example.com", "/", "Prefix", "web")],
        ),
        "missing-secret.example.com",
        "absent-tls",
    );
    yaml += &with_tls(
        &ingress(
            "app",
            "garbage-secret",
            &[("garbage.example.com", "/", "Prefix", "web")],
        ),
        "garbage.example.com",
        "garbage-tls",
    );
    yaml += &with_tls(
        &ingress(
            "app",
            "mismatched-secret",
            &[("mismatched.example.com", "/", "Prefix", "web")],
        ),
        "mismatched.example.com",
        "mismatched-tls",
    );
    yaml += &ingress(
        "app",
        "bad-regex",
        &[(
            "regex.example.com",
            "/(unclosed",
            "ImplementationSpecific",
            "web",
        )],
    );
    yaml += &ingress(
        "app",
        "conflict-a",
        &[("conflict.example.com", "/", "Prefix", "web")],
    );
    yaml
}

/// Events in the namespace, as (reason, regarding name, count) from `kubectl get events -o json`.
async fn events(cluster: &Cluster) -> Vec<(String, String, i64)> {
    let json = cluster
        .ok(&["get", "events", "-n", "app", "-o", "json"])
        .await;
    let list: Value = serde_json::from_str(&json).expect("kubectl printed JSON");
    let mut out: Vec<(String, String, i64)> = list["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|e| {
            let s = |v: &Value| v.as_str().unwrap_or_default().to_string();
            (
                s(&e["reason"]),
                s(&e["involvedObject"]["name"]),
                e["count"]
                    .as_i64()
                    .or_else(|| e["series"]["count"].as_i64())
                    .unwrap_or(1),
            )
        })
        .collect();
    out.sort();
    out
}

async fn described_with(cluster: &Cluster, name: &str, wanted: &[&str]) -> String {
    eventually(
        &format!("describe ingress {name} shows {wanted:?}"),
        TIMEOUT,
        async || {
            let events = cluster.described_events("app", name).await;
            if wanted.iter().all(|w| events.contains(w)) {
                Ok(events)
            } else {
                Err(events)
            }
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn diagnostics_become_deduplicated_warning_events() {
    let web = Backend::start("web");
    let cluster = Cluster::start().await;
    cluster.apply(&manifests(&web)).await;
    // The conflicting Ingress comes second, so it is the newer one.
    cluster
        .apply(&ingress(
            "app",
            "conflict-b",
            &[("conflict.example.com", "/", "Prefix", "web")],
        ))
        .await;
    let proc = cluster.instance("first", "192.0.2.1", "2s").start();
    wait_ready(&proc).await;
    for (name, reason, fragment) in CASES {
        let shown = described_with(&cluster, name, &["Warning", reason, fragment]).await;
        assert_eq!(shown.matches(reason).count(), 1, "{name}: {shown}");
    }
    // Healthy Ingresses get no Event.
    assert!(
        !cluster
            .described_events("app", "conflict-a")
            .await
            .contains("Warning")
    );
    let published = events(&cluster).await;
    assert_eq!(published.len(), CASES.len(), "{published:?}");
    assert!(
        published.iter().all(|(_, _, count)| *count == 1),
        "{published:?}"
    );

    // Unrelated changes rebuild the snapshot several times: no Event is repeated.
    let http = client::http1();
    for i in 0..4 {
        cluster
            .apply(&service("app", &format!("unrelated-{i}"), &[&web]))
            .await;
        cluster
            .apply(&ingress(
                "app",
                &format!("fine-{i}"),
                &[(&format!("fine-{i}.example.com"), "/", "Prefix", "web")],
            ))
            .await;
        wait_routed(
            &http,
            &proc,
            &format!("fine-{i}.example.com"),
            "web",
            TIMEOUT,
        )
        .await;
    }
    // The status of the last new Ingress: the reporter caught up.
    cluster.wait_address("app", "fine-3", "192.0.2.1").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        events(&cluster).await,
        published,
        "events after unrelated rebuilds"
    );
    let generation = metric(&proc, "ingress_snapshot_generation", &[])
        .await
        .unwrap_or(0.0);
    assert!(
        generation >= 5.0,
        "several rebuilds happened ({generation})"
    );

    // Resolved, then back: the same Event, counted twice.
    cluster.apply(&service("app", "nope", &[&web])).await;
    wait_routed(&http, &proc, "missing-service.example.com", "web", TIMEOUT).await;
    cluster
        .ok(&["delete", "service", "nope", "-n", "app"])
        .await;
    wait_routed(
        &http,
        &proc,
        "missing-service.example.com",
        "<503>",
        TIMEOUT,
    )
    .await;
    described_with(
        &cluster,
        "missing-service",
        &["ServiceNotFound", "(x2 over"],
    )
    .await;
    let after = events(&cluster).await;
    assert_eq!(after.len(), CASES.len(), "{after:?}");
    assert!(
        after.contains(&("ServiceNotFound".into(), "missing-service".into(), 2)),
        "{after:?}"
    );

    // Every creation and the one repetition, nothing else.
    let written = metric(&proc, "ingress_events_published_total", &[("result", "ok")]).await;
    assert_eq!(written, Some(CASES.len() as f64 + 1.0));

    // A restart (a new process, another identity) finds its Events already there.
    drop(proc);
    let second = cluster.instance("second", "192.0.2.1", "2s").start();
    wait_ready(&second).await;
    wait_leading(&second, true).await;
    let posts = || {
        cluster.requests_by("second", |r| {
            r.method == "POST" && r.path == "/apis/events.k8s.io/v1/namespaces/app/events"
        })
    };
    eventually(
        "the new leader looked at every diagnostic",
        TIMEOUT,
        async || {
            if posts().len() >= CASES.len() {
                Ok(())
            } else {
                Err(format!("{:?}", posts()))
            }
        },
    )
    .await;
    assert!(posts().iter().all(|r| r.status == 409), "{:?}", posts());
    assert_eq!(events(&cluster).await, after, "events after a restart");
    assert_eq!(
        metric(
            &second,
            "ingress_events_published_total",
            &[("result", "ok")]
        )
        .await
        .unwrap_or(0.0),
        0.0,
        "nothing new to say"
    );
}

/// Only the Lease holder publishes Events: a follower with the same diagnostics writes none.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn only_the_leader_publishes_events() {
    let web = Backend::start("web");
    let cluster = Cluster::start().await;
    cluster
        .apply(
            &(CLASS.to_string()
                + &service("app", "web", &[&web])
                + &ingress(
                    "app",
                    "missing-service",
                    &[("missing-service.example.com", "/", "Prefix", "nope")],
                )),
        )
        .await;
    let leader = cluster
        .ingress()
        .args(["--pod-name", "leader", "--lease-duration", "15s"])
        .start();
    wait_ready(&leader).await;
    wait_leading(&leader, true).await;
    let follower = cluster
        .ingress()
        .args(["--pod-name", "follower", "--lease-duration", "15s"])
        .start();
    wait_ready(&follower).await;
    described_with(&cluster, "missing-service", &["ServiceNotFound", "nope"]).await;
    cluster
        .apply(
            &ingress(
                "app",
                "missing-port",
                &[("missing-port.example.com", "/", "Prefix", "web")],
            )
            .replace("number: 80", "number: 8080"),
        )
        .await;
    described_with(&cluster, "missing-port", &["ServicePortNotFound", "8080"]).await;
    assert_eq!(metric(&follower, "ingress_leader", &[]).await, Some(0.0));
    let by =
        |who: &str| cluster.requests_by(who, |r| r.path.contains("/events") && r.method != "GET");
    assert_eq!(by("leader").len(), 2, "{:?}", by("leader"));
    assert!(by("follower").is_empty(), "{:?}", by("follower"));
}
