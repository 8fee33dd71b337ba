//! ConfigMaps from the Kubernetes API: kubectl writes them to the test API server, the real
//! binary watches ConfigMaps (all of them, as ingress-nginx), and a change or a delete of the
//! `--configmap` one, or of one an Ingress's `custom-headers` names, applies live, shown by
//! real requests; a change to a ConfigMap nothing references builds no snapshot.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod kube_support;

use std::time::Duration;

use ingress_tests::curl;
use ingress_tests::manifests::{ingress, service};
use ingress_tests::process::Ingress;
use ingress_tests::scratch::Scratch;
use ingress_tests::upstream::Backend;
use kube_support::{CLASS, Cluster, TIMEOUT, eventually, wait_ready};

fn config_map(name: &str, body_size: &str) -> String {
    format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: {name}, namespace: ingress-system}}\ndata: {{proxy-body-size: \"{body_size}\", enable-brotli: \"true\"}}\n"
    )
}

/// The status of a POST of `file` to `plain.test` (curl, off the runtime's workers).
async fn post(ingress: &Ingress, file: &std::path::Path) -> u16 {
    let (data, url) = (format!("@{}", file.display()), ingress.url("/upload"));
    tokio::task::spawn_blocking(move || {
        curl::status(&["-H", "Host: plain.test", "--data-binary", &data, &url])
    })
    .await
    .expect("curl task")
}

async fn wait_status(ingress: &Ingress, file: &std::path::Path, want: u16, what: &str) {
    eventually(what, TIMEOUT, async || match post(ingress, file).await {
        status if status == want => Ok(()),
        status => Err(status.to_string()),
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_configmap_is_watched_live() {
    let web = Backend::start("web");
    let scratch = Scratch::new("kube-configmap");
    let body = scratch.write("body", &"x".repeat(9 * 1024));
    let cluster = Cluster::start().await;
    cluster
        .apply(
            &[
                CLASS.to_string(),
                service("app", "web", &[&web]),
                ingress("app", "plain", &[("plain.test", "/", "Prefix", "web")]),
                config_map("ingress-config", "8k"),
                // Another ConfigMap beside it is never read.
                config_map("unrelated", "1k"),
            ]
            .join("---\n"),
        )
        .await;
    let proc = cluster
        .ingress()
        .args(["--configmap", "ingress-system/ingress-config"])
        .start();
    wait_ready(&proc).await;
    wait_status(&proc, &body, 413, "the ConfigMap's 8k from the start").await;

    cluster.apply(&config_map("ingress-config", "16k")).await;
    wait_status(&proc, &body, 200, "16k after kubectl apply").await;
    cluster.apply(&config_map("unrelated", "1")).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        post(&proc, &body).await,
        200,
        "another ConfigMap changed nothing"
    );

    cluster.apply(&config_map("ingress-config", "4k")).await;
    wait_status(&proc, &body, 413, "4k after kubectl apply").await;
    cluster
        .ok(&[
            "delete",
            "configmap",
            "ingress-config",
            "-n",
            "ingress-system",
        ])
        .await;
    wait_status(&proc, &body, 200, "the flag's 1m after kubectl delete").await;

    // ConfigMaps are listed and watched cluster-wide (without --watch-namespace), unfiltered.
    let requests = cluster.controller_requests(|r| r.path.contains("configmaps"));
    assert!(!requests.is_empty(), "ConfigMaps are watched");
    for r in &requests {
        assert_eq!(r.path, "/api/v1/configmaps", "{r:?}");
        assert_eq!(r.param("fieldSelector"), None, "{r:?}");
    }
    // The key this controller does not apply is reported with why, in the log and as an Event
    // on the ConfigMap once this instance leads.
    assert!(
        proc.wait_for_log("enable-brotli: ignored", Duration::from_secs(5)),
        "{}",
        proc.logs()
    );
    cluster.apply(&config_map("ingress-config", "8k")).await;
    let described = eventually("an Event on the ConfigMap", TIMEOUT, async || {
        let described = cluster
            .ok(&[
                "describe",
                "configmap",
                "ingress-config",
                "-n",
                "ingress-system",
            ])
            .await;
        if described.contains("UnsupportedConfigKey") && described.contains("enable-brotli") {
            Ok(described)
        } else {
            Err(described)
        }
    })
    .await;
    assert!(described.contains("Warning"), "{described}");
}

/// The status and one header of a GET of `/` on `host`.
async fn header(ingress: &Ingress, host: &str, name: &str) -> (u16, Option<String>) {
    let out = tokio::process::Command::new("curl")
        .args(["-s", "-o", "/dev/null", "-D", "-", "--max-time", "10"])
        .args(["-H", &format!("Host: {host}")])
        .arg(ingress.url("/"))
        .output()
        .await
        .unwrap();
    let head = String::from_utf8_lossy(&out.stdout).into_owned();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let value = head.lines().find_map(|line| {
        let (n, v) = line.split_once(':')?;
        n.eq_ignore_ascii_case(name).then(|| v.trim().to_string())
    });
    (status, value)
}

fn headers_map(value: &str) -> String {
    format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: headers, namespace: app}}\ndata: {{X-Custom: \"{value}\"}}\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn custom_headers_follow_their_configmap_live() {
    let web = Backend::start("web");
    let cluster = Cluster::start().await;
    let annotated = ingress("app", "custom", &[("custom.test", "/", "Prefix", "web")]).replacen(
        "metadata: {name: custom, namespace: app}",
        "metadata:\n  name: custom\n  namespace: app\n  annotations: {nginx.ingress.kubernetes.io/custom-headers: app/headers}",
        1,
    );
    cluster
        .apply(
            &[
                CLASS.to_string(),
                service("app", "web", &[&web]),
                annotated,
                "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: ingress-config, namespace: ingress-system}\ndata: {global-allowed-response-headers: X-Custom}\n".to_string(),
            ]
            .join("---\n"),
        )
        .await;
    let proc = cluster
        .ingress()
        .args(["--configmap", "ingress-system/ingress-config"])
        .start();
    wait_ready(&proc).await;
    let probe = async |want: (u16, Option<&str>), what: &str| {
        eventually(what, TIMEOUT, async || {
            let got = header(&proc, "custom.test", "x-custom").await;
            if (got.0, got.1.as_deref()) == want {
                Ok(())
            } else {
                Err(format!("{got:?}"))
            }
        })
        .await;
    };
    probe((503, None), "refused while its ConfigMap is missing").await;
    cluster.apply(&headers_map("one")).await;
    probe((200, Some("one")), "served once the ConfigMap exists").await;
    cluster.apply(&headers_map("two")).await;
    probe((200, Some("two")), "the edited value").await;

    // A ConfigMap nothing references: no snapshot is built for it.
    let publishes = || proc.metric("ingress_snapshot_publishes_total", &[]);
    let before = publishes();
    assert!(before.is_some(), "{}", proc.metrics());
    cluster.apply(&config_map("unrelated", "1k")).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        publishes(),
        before,
        "an unreferenced ConfigMap rebuilt nothing"
    );

    cluster
        .ok(&["delete", "configmap", "headers", "-n", "app"])
        .await;
    probe((503, None), "refused again once deleted").await;
}

/// With --watch-namespace, the ConfigMaps of that namespace are watched, and the global one
/// outside it by name: both are read (the headers from one, the body limit from the other).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_watch_namespace_the_global_configmap_is_watched_by_name() {
    let web = Backend::start("web");
    let scratch = Scratch::new("kube-configmap-namespace");
    let body = scratch.write("body", &"x".repeat(9 * 1024));
    let cluster = Cluster::start().await;
    let annotated = ingress("app", "plain", &[("plain.test", "/", "Prefix", "web")]).replacen(
        "metadata: {name: plain, namespace: app}",
        "metadata:\n  name: plain\n  namespace: app\n  annotations: {nginx.ingress.kubernetes.io/custom-headers: headers}",
        1,
    );
    cluster
        .apply(
            &[
                CLASS.to_string(),
                service("app", "web", &[&web]),
                annotated,
                headers_map("one"),
                "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: ingress-config, namespace: ingress-system}\ndata: {proxy-body-size: 8k, global-allowed-response-headers: X-Custom}\n".to_string(),
            ]
            .join("---\n"),
        )
        .await;
    let proc = cluster
        .ingress()
        .args(["--watch-namespace", "app"])
        .args(["--configmap", "ingress-system/ingress-config"])
        .start();
    wait_ready(&proc).await;
    wait_status(&proc, &body, 413, "the global ConfigMap's 8k").await;
    assert_eq!(
        header(&proc, "plain.test", "x-custom").await,
        (200, Some("one".to_string()))
    );
    let requests = cluster.controller_requests(|r| r.path.contains("configmaps"));
    assert!(
        requests
            .iter()
            .any(|r| r.path == "/api/v1/namespaces/app/configmaps"
                && r.param("fieldSelector").is_none()),
        "{requests:?}"
    );
    for r in requests
        .iter()
        .filter(|r| r.path.contains("ingress-system"))
    {
        assert_eq!(
            r.param("fieldSelector").as_deref(),
            Some("metadata.name=ingress-config"),
            "{r:?}"
        );
    }
    // Every watch expires: both ConfigMap watches relist, and neither relist drops what the
    // other one holds.
    let lists = |ns: &str| {
        cluster
            .controller_requests(|r| {
                r.path == format!("/api/v1/namespaces/{ns}/configmaps")
                    && r.param("watch").is_none()
            })
            .len()
    };
    let before = (lists("app"), lists("ingress-system"));
    cluster.server.faults().expire_next_watches(7);
    cluster.server.faults().drop_watches();
    eventually("both relisted", TIMEOUT, async || {
        let now = (lists("app"), lists("ingress-system"));
        if now.0 > before.0 && now.1 > before.1 {
            Ok(())
        } else {
            Err(format!("{before:?} -> {now:?}"))
        }
    })
    .await;
    cluster.apply(&headers_map("two")).await;
    eventually("the edited header", TIMEOUT, async || {
        match header(&proc, "plain.test", "x-custom").await {
            (200, Some(v)) if v == "two" => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    wait_status(&proc, &body, 413, "the global ConfigMap kept").await;
}
