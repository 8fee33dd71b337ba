//! `--configmap` from the Kubernetes API: kubectl writes the ConfigMap to the test API server,
//! the real binary watches that one object (by name, so RBAC can grant it alone), and a change
//! or a delete applies live, shown by real requests.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod kube_support;

use std::time::Duration;

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

/// The status of a POST of `file` to `plain.test`.
async fn post(ingress: &Ingress, file: &std::path::Path) -> u16 {
    let out = tokio::process::Command::new("curl")
        .args([
            "-s",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "--max-time",
            "10",
        ])
        .args(["-H", "Host: plain.test"])
        .args(["--data-binary", &format!("@{}", file.display())])
        .arg(ingress.url("/upload"))
        .output()
        .await
        .unwrap();
    String::from_utf8_lossy(&out.stdout).parse().unwrap_or(0)
}

async fn wait_status(ingress: &Ingress, file: &std::path::Path, want: u16, what: &str) {
    eventually(what, TIMEOUT, async || match post(ingress, file).await {
        status if status == want => Ok(()),
        status => Err(status.to_string()),
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_configmap_is_watched_live_by_name() {
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

    // Only that one object was ever asked for, by namespace and name.
    let requests = cluster.controller_requests(|r| r.path.contains("configmaps"));
    assert!(!requests.is_empty(), "the ConfigMap was watched");
    for r in &requests {
        assert!(
            r.path
                .starts_with("/api/v1/namespaces/ingress-system/configmaps"),
            "{r:?}"
        );
        assert_eq!(
            r.param("fieldSelector").as_deref(),
            Some("metadata.name=ingress-config"),
            "{r:?}"
        );
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
