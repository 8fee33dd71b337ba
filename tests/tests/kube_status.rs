//! Ingress status and the Lease: `kubectl get ingress` shows the ADDRESS, only the Lease holder
//! writes it, another instance takes over when the holder goes, and losing the Lease stops
//! status writes and nothing else.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod kube_support;

use std::time::Duration;

use ingress_tests::client;
use ingress_tests::manifests::service;
use ingress_tests::upstream::Backend;
use kube_support::{
    Cluster, TIMEOUT, eventually, is_leader, metric, status_writes, tail, wait_leading, wait_ready,
    wait_routed, web_ingress, web_site, who,
};

const LEASE: &str = "ingress-controller-leader";

/// Someone else (kubectl) writes `ip` into the status of the Ingress `app/web`.
async fn overwrite_web_status(cluster: &Cluster, ip: &str) {
    let patch = format!(r#"{{"status":{{"loadBalancer":{{"ingress":[{{"ip":"{ip}"}}]}}}}}}"#);
    cluster
        .ok(&[
            "patch",
            "ingress",
            "web",
            "-n",
            "app",
            "--subresource=status",
            "--type=merge",
            "-p",
            &patch,
        ])
        .await;
}

/// `--publish-address` lands in status and in the ADDRESS column of owned Ingresses only; it
/// is written once (not on every rebuild), and restored if someone overwrites it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn publish_address_in_kubectl_get_ingress() {
    let web = Backend::start("web");
    let cluster = Cluster::start().await;
    let theirs =
        web_ingress("theirs").replace("ingressClassName: ingress", "ingressClassName: other");
    cluster.apply(&(web_site(&web) + &theirs)).await;
    let proc = cluster
        .ingress()
        .args(["--publish-address", "203.0.113.7", "--pod-name", "solo"])
        .start();
    wait_ready(&proc).await;
    cluster.wait_address("app", "web", "203.0.113.7").await;
    assert!(is_leader(&proc).await);
    assert_eq!(cluster.lease_holder("default", LEASE).await, "solo");

    // A new Ingress gets the address; rebuilds for unrelated changes write nothing again.
    cluster.apply(&web_ingress("second")).await;
    cluster.wait_address("app", "second", "203.0.113.7").await;
    let writes = status_writes(&cluster, "solo").len();
    for i in 0..3 {
        cluster
            .apply(&service("app", &format!("unrelated-{i}"), &[&web]))
            .await;
    }
    let http = client::http1();
    cluster.apply(&web_ingress("probe")).await;
    wait_routed(&http, &proc, "probe.example.com", "web", TIMEOUT).await;
    cluster.wait_address("app", "probe", "203.0.113.7").await;
    assert_eq!(
        status_writes(&cluster, "solo").len(),
        writes + 1,
        "only the new Ingress was written"
    );
    assert_eq!(
        cluster.address("app", "theirs").await,
        "",
        "another class's Ingress is left alone"
    );
    assert!(
        status_writes(&cluster, "solo")
            .iter()
            .all(|r| !r.path.ends_with("/theirs/status"))
    );

    // Someone else overwrites the status: the leader puts it back.
    overwrite_web_status(&cluster, "192.0.2.99").await;
    cluster.wait_address("app", "web", "203.0.113.7").await;
    assert!(
        metric(&proc, "ingress_status_updates_total", &[("result", "ok")])
            .await
            .unwrap_or(0.0)
            >= 4.0
    );
}

/// Without `--publish-address`, the address is the ExternalIP (else InternalIP) of the Node
/// named by NODE_NAME, read through the API.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn node_address_from_node_name() {
    let web = Backend::start("web");
    let cluster = Cluster::start().await;
    cluster.apply(&web_site(&web)).await;
    for (node, addresses) in [
        (
            "node-a",
            r#"[{"type":"InternalIP","address":"10.1.2.3"},{"type":"ExternalIP","address":"198.51.100.4"},{"type":"Hostname","address":"node-a"}]"#,
        ),
        (
            "node-b",
            r#"[{"type":"Hostname","address":"node-b"},{"type":"InternalIP","address":"10.9.9.9"}]"#,
        ),
    ] {
        cluster
            .apply(&format!(
                "apiVersion: v1\nkind: Node\nmetadata: {{name: {node}}}\n"
            ))
            .await;
        let patch = format!(r#"{{"status":{{"addresses":{addresses}}}}}"#);
        cluster
            .ok(&[
                "patch",
                "node",
                node,
                "--subresource=status",
                "--type=merge",
                "-p",
                &patch,
            ])
            .await;
    }
    let first = cluster
        .ingress()
        .env("NODE_NAME", "node-a")
        .args(["--pod-name", "on-a", "--lease-duration", "2s"])
        .start();
    wait_ready(&first).await;
    cluster.wait_address("app", "web", "198.51.100.4").await;
    let node_reads = cluster.controller_requests(|r| r.path.starts_with("/api/v1/nodes"));
    assert!(
        node_reads.len() == 1 && node_reads[0].path == "/api/v1/nodes/node-a",
        "the node is read once: {node_reads:?}"
    );
    // The instance on the other node takes over when the first goes, and publishes its own
    // node's InternalIP.
    drop(first);
    let second = cluster
        .ingress()
        .env("NODE_NAME", "node-b")
        .args(["--pod-name", "on-b", "--lease-duration", "2s"])
        .start();
    wait_ready(&second).await;
    cluster.wait_address("app", "web", "10.9.9.9").await;
}

/// Two instances: only the Lease holder writes status (the request log says who PUTs); when it
/// stops, the other takes over and writes its own address, and traffic never depended on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn only_the_lease_holder_writes_status() {
    let web = Backend::start("web");
    let cluster = Cluster::start().await;
    cluster.apply(&web_site(&web)).await;
    let start = |name: &str, address: &str| cluster.instance(name, address, "2s").start();
    let mut one = Some(start("one", "192.0.2.1"));
    let two = start("two", "192.0.2.2");
    wait_ready(one.as_ref().unwrap()).await;
    wait_ready(&two).await;
    let leader = eventually("exactly one leader", TIMEOUT, async || {
        match (
            is_leader(one.as_ref().unwrap()).await,
            is_leader(&two).await,
        ) {
            (true, false) => Ok("one"),
            (false, true) => Ok("two"),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let (follower, follower_address) = if leader == "one" {
        ("two", "192.0.2.2")
    } else {
        ("one", "192.0.2.1")
    };
    let leader_address = if leader == "one" {
        "192.0.2.1"
    } else {
        "192.0.2.2"
    };
    cluster.wait_address("app", "web", leader_address).await;
    assert_eq!(cluster.lease_holder("default", LEASE).await, leader);
    cluster.apply(&web_ingress("more")).await;
    cluster.wait_address("app", "more", leader_address).await;
    // Both follow the API and both serve; only the leader writes.
    let http = client::http1();
    for proc in [one.as_ref().unwrap(), &two] {
        wait_routed(&http, proc, "more.example.com", "web", TIMEOUT).await;
    }
    assert!(status_writes(&cluster, leader).len() >= 2);
    assert!(
        status_writes(&cluster, follower).is_empty(),
        "the follower wrote status"
    );

    // The leader goes away (killed: no chance to release the Lease). The follower takes over
    // after the Lease expires and writes its own address.
    let (survivor, gone) = if leader == "one" {
        (two, one.take())
    } else {
        (one.take().unwrap(), Some(two))
    };
    drop(gone);
    wait_leading(&survivor, true).await;
    assert_eq!(cluster.lease_holder("default", LEASE).await, follower);
    cluster.wait_address("app", "web", follower_address).await;
    cluster.wait_address("app", "more", follower_address).await;
    assert!(!status_writes(&cluster, follower).is_empty());
    assert_eq!(who(&http, &survivor, "web.example.com", "/").await, "web");
}

/// Someone else takes the Lease: our instance stops writing status at once but keeps serving
/// and following changes; when the intruder's claim expires, it leads and writes again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lost_lease_stops_status_writes_and_nothing_else() {
    let web = Backend::start("web");
    let cluster = Cluster::start().await;
    cluster.apply(&web_site(&web)).await;
    let proc = cluster.instance("ours", "192.0.2.10", "3s").start();
    wait_ready(&proc).await;
    cluster.wait_address("app", "web", "192.0.2.10").await;

    // An intruder claims the Lease for 6 seconds from now.
    let now = jiff::Timestamp::now().to_string();
    let steal = format!(
        r#"{{"spec":{{"holderIdentity":"intruder","leaseDurationSeconds":6,"renewTime":"{now}","acquireTime":"{now}"}}}}"#
    );
    cluster
        .ok(&[
            "patch",
            "lease",
            LEASE,
            "-n",
            "default",
            "--type=merge",
            "-p",
            &steal,
        ])
        .await;
    wait_leading(&proc, false).await;
    let writes = status_writes(&cluster, "ours").len();
    overwrite_web_status(&cluster, "192.0.2.99").await;
    // Routing goes on: a new Ingress is served, but nobody writes its status.
    cluster.apply(&web_ingress("during")).await;
    let http = client::http1();
    wait_routed(&http, &proc, "during.example.com", "web", TIMEOUT).await;
    assert_eq!(cluster.address("app", "web").await, "192.0.2.99");
    assert_eq!(cluster.address("app", "during").await, "");
    assert_eq!(
        status_writes(&cluster, "ours").len(),
        writes,
        "status written without the Lease"
    );

    // The intruder never renews: six seconds after its claim, plus our own wait, we lead again.
    wait_leading(&proc, true).await;
    assert_eq!(cluster.lease_holder("default", LEASE).await, "ours");
    cluster.wait_address("app", "web", "192.0.2.10").await;
    cluster.wait_address("app", "during", "192.0.2.10").await;
}

/// `--publish-service`: the ADDRESS follows a LoadBalancer Service's status as a cloud fills it
/// in and changes it; while it is pending nothing is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn publish_service_addresses_follow_the_service() {
    let web = Backend::start("web");
    let cluster = Cluster::start().await;
    cluster
        .apply(
            &(web_site(&web)
                + "---\napiVersion: v1\nkind: Namespace\nmetadata: {name: edge}\n"
                + "---\napiVersion: v1\nkind: Service\nmetadata: {name: controller, namespace: edge}\n"
                + "spec: {type: LoadBalancer, externalIPs: [198.51.100.9], ports: [{name: https, port: 443}]}\n"),
        )
        .await;
    let proc = cluster
        .ingress()
        .args(["--publish-service", "edge/controller", "--pod-name", "lb"])
        .start();
    wait_ready(&proc).await;
    // Pending: only the external IP is known, which ingress-nginx publishes too.
    cluster.wait_address("app", "web", "198.51.100.9").await;

    let set_lb = async |entries: &str| {
        let patch = format!(r#"{{"status":{{"loadBalancer":{{"ingress":{entries}}}}}}}"#);
        cluster
            .ok(&[
                "patch",
                "service",
                "controller",
                "-n",
                "edge",
                "--subresource=status",
                "--type=merge",
                "-p",
                &patch,
            ])
            .await;
    };
    set_lb(r#"[{"ip":"203.0.113.20"},{"hostname":"lb.example.com"}]"#).await;
    cluster
        .wait_address("app", "web", "198.51.100.9,203.0.113.20,lb.example.com")
        .await;
    set_lb(r#"[{"ip":"203.0.113.21"}]"#).await;
    cluster
        .wait_address("app", "web", "198.51.100.9,203.0.113.21")
        .await;
    let writes = status_writes(&cluster, "lb").len();
    assert_eq!(writes, 3, "one write per change of address");
    assert!(
        cluster
            .controller_requests(|r| r.path.starts_with("/api/v1/namespaces/edge/services"))
            .iter()
            .all(|r| r.param("fieldSelector").as_deref() == Some("metadata.name=controller")),
        "only the named Service is read"
    );
}

/// `--update-status=false`: nothing is written even with an address to publish, and the
/// controller still serves and still leads (Events are still its job).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn update_status_false_writes_no_status() {
    let web = Backend::start("web");
    let cluster = Cluster::start().await;
    cluster.apply(&web_site(&web)).await;
    let proc = cluster
        .ingress()
        .args([
            "--publish-address",
            "203.0.113.7",
            "--update-status=false",
            "--pod-name",
            "quiet",
        ])
        .start();
    wait_ready(&proc).await;
    wait_leading(&proc, true).await;
    // A write, were there one, would follow the first snapshot within milliseconds.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(status_writes(&cluster, "quiet").is_empty());
    assert_eq!(cluster.address("app", "web").await, "");
    let log = proc.logs();
    assert!(log.contains("--update-status=false"), "{}", tail(&log));
}
