//! The API server misbehaving, while traffic flows: unreachable at start, watches expiring
//! (410 Gone) or dropped, down mid-run, restarted with and without its state, the Lease
//! unreachable. Routes keep serving throughout, and the metrics say what happened.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod kube_support;

use std::time::{Duration, Instant};

use ingress_tests::apiserver::RestartOptions;
use ingress_tests::client;
use ingress_tests::manifests::{ingress, service};
use ingress_tests::process::Ingress;
use ingress_tests::upstream::Backend;
use kube_support::{
    CLASS, Cluster, TIMEOUT, Traffic, admin_get, assert_answered_by, eventually, metric,
    status_writes, tail, wait_leading, wait_ready, wait_routed, web_ingress, web_site, who,
};

const KINDS: [&str; 6] = [
    "Ingress",
    "IngressClass",
    "Service",
    "EndpointSlice",
    "Secret",
    "ConfigMap",
];

async fn total_watch_errors(proc: &Ingress) -> f64 {
    let mut sum = 0.0;
    for kind in KINDS {
        sum += metric(proc, "ingress_kube_watch_errors_total", &[("kind", kind)])
            .await
            .unwrap_or(0.0);
    }
    sum
}

/// Waits until at least `at_least` watch errors were counted, over all kinds.
async fn wait_watch_errors(proc: &Ingress, at_least: f64) {
    eventually("watch errors counted", TIMEOUT, async || {
        let errors = total_watch_errors(proc).await;
        if errors >= at_least {
            Ok(())
        } else {
            Err(format!("{errors} of {at_least}\n{}", tail(&proc.logs())))
        }
    })
    .await;
}

/// Lists (not watches) of Ingresses the controller made so far.
fn ingress_lists(cluster: &Cluster) -> usize {
    cluster
        .controller_requests(|r| {
            r.method == "GET" && r.path.ends_with("/ingresses") && !r.is_watch()
        })
        .len()
}

/// Waits until the controller lists Ingresses again: more than the `lists` counted before.
async fn wait_relisted(cluster: &Cluster, proc: &Ingress, lists: usize, what: &str) {
    eventually(what, TIMEOUT, async || {
        if ingress_lists(cluster) > lists {
            Ok(())
        } else {
            Err(tail(&proc.logs()))
        }
    })
    .await;
}

/// When the controller last synced `kind` from the API (Unix seconds).
async fn last_sync(proc: &Ingress, kind: &str) -> Option<f64> {
    metric(
        proc,
        "ingress_kube_last_sync_timestamp_seconds",
        &[("kind", kind)],
    )
    .await
}

/// The Services `web-a` on `a` and `web-b` on `b`, and the Ingress `app/web` routing
/// `web.example.com` to `web-a`: a route that a test can move (to `web-b`) and tell which way
/// each request went.
fn a_and_b(a: &Backend, b: &Backend) -> String {
    CLASS.to_string()
        + &service("app", "web-a", &[a])
        + &service("app", "web-b", &[b])
        + &web_routed_to("web-a")
}

/// The Ingress `app/web` routing `web.example.com` to `service`.
fn web_routed_to(service: &str) -> String {
    ingress("app", "web", &[("web.example.com", "/", "Prefix", service)])
}

fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// The API server is down when the controller starts: not ready, nothing served, watch errors
/// counted; once it is back, the first snapshot is built and readiness follows.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn unreachable_at_start_then_ready_after_first_sync() {
    let web = Backend::start("web");
    let cluster = Cluster::start().await;
    cluster.apply(&web_site(&web)).await;
    cluster.server.stop().await;
    let proc = cluster.ingress().start();
    wait_watch_errors(&proc, 5.0).await;
    // Nothing is answered from a configuration that is not loaded: the proxy's ports stay
    // closed (a client is refused, not told 404) and readiness says why.
    let http = client::http1();
    let down_since = Instant::now();
    while down_since.elapsed() < Duration::from_secs(2) {
        let (status, body) = admin_get(&proc, "/readyz").await;
        assert_eq!(status, 503, "ready without a sync: {body}");
        let got = who(&http, &proc, "web.example.com", "/").await;
        assert!(
            got.starts_with("<error:") && got.contains("Connection refused"),
            "answered before the first sync: {got}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(metric(&proc, "ingress_ready", &[]).await, Some(0.0));
    assert_eq!(
        metric(&proc, "ingress_snapshot_generation", &[]).await,
        Some(0.0),
        "no snapshot before the first sync"
    );

    let resumed = Instant::now();
    cluster.server.resume().await.unwrap();
    wait_ready(&proc).await;
    // Retries back off to at most 10 s (plus jitter).
    assert!(
        resumed.elapsed() < Duration::from_secs(15),
        "ready {:?} after the API server came back",
        resumed.elapsed()
    );
    assert_eq!(who(&http, &proc, "web.example.com", "/").await, "web");
    for kind in KINDS {
        let synced = last_sync(&proc, kind).await.unwrap_or(0.0);
        assert!(unix_now() - synced < 60.0, "{kind} last sync {synced}");
    }
}

/// Watches expire (410 Gone) or break, again and again, while a change is made: every relist
/// replaces its kind at once, so no request ever misses its route, and the change arrives.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn expired_and_dropped_watches_relist_without_a_gap() {
    let (a, b) = (Backend::start("a"), Backend::start("b"));
    let cluster = Cluster::start().await;
    cluster.apply(&a_and_b(&a, &b)).await;
    let proc = cluster.ingress().start();
    wait_ready(&proc).await;
    let traffic = Traffic::start(&proc, "web.example.com", Duration::from_secs(120));
    traffic.wait_more(50).await;
    for round in 0..3 {
        let (lists, errors) = (ingress_lists(&cluster), total_watch_errors(&proc).await);
        // Every watch breaks now, and the six re-watches get 410 Expired: all kinds relist.
        cluster.server.faults().expire_next_watches(6);
        cluster.server.faults().drop_watches();
        if round == 1 {
            // A change made while the watches are down arrives through the relist.
            cluster.apply(&web_routed_to("web-b")).await;
        }
        wait_relisted(&cluster, &proc, lists, "Ingresses relisted").await;
        wait_watch_errors(&proc, errors + 6.0).await;
        traffic.wait_more(50).await;
    }
    let http = client::http1();
    wait_routed(&http, &proc, "web.example.com", "b", TIMEOUT).await;
    // The server's history is forgotten (a restart that keeps etcd): every watch resumes from
    // a resourceVersion that is now too old, and relists.
    let lists = ingress_lists(&cluster);
    cluster
        .server
        .restart(RestartOptions {
            reset_history: true,
            downtime: Duration::from_millis(500),
            ..Default::default()
        })
        .await
        .unwrap();
    wait_relisted(&cluster, &proc, lists, "relist after restart").await;
    traffic.wait_more(50).await;
    let answers = traffic.stop().await;
    assert_answered_by(&answers, &["a", "b"], "requests missed their route");
    assert_eq!(admin_get(&proc, "/readyz").await.0, 200);
}

/// The API server goes away mid-run: traffic is unaffected, readiness stays, and when it is
/// back, changes made meanwhile arrive.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn api_server_down_mid_run_keeps_serving() {
    let (a, b) = (Backend::start("a"), Backend::start("b"));
    let cluster = Cluster::start().await;
    cluster.apply(&a_and_b(&a, &b)).await;
    let proc = cluster
        .ingress()
        .args(["--publish-address", "192.0.2.5", "--lease-duration", "3s"])
        .start();
    wait_ready(&proc).await;
    wait_leading(&proc, true).await;
    let synced_before = last_sync(&proc, "Ingress").await.unwrap();
    let traffic = Traffic::start(&proc, "web.example.com", Duration::from_secs(120));
    traffic.wait_more(50).await;

    cluster.server.stop().await;
    let errors = total_watch_errors(&proc).await;
    let down = Instant::now();
    while down.elapsed() < Duration::from_secs(3) {
        assert_eq!(
            admin_get(&proc, "/readyz").await.0,
            200,
            "readiness follows the API server"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    traffic.wait_more(50).await;
    assert!(
        total_watch_errors(&proc).await > errors,
        "watch errors while down"
    );
    // Leadership lapses at the renew deadline (2 s of a 3 s Lease); serving does not.
    wait_leading(&proc, false).await;

    cluster.server.resume().await.unwrap();
    cluster.apply(&web_routed_to("web-b")).await;
    let http = client::http1();
    wait_routed(&http, &proc, "web.example.com", "b", TIMEOUT).await;
    traffic.wait_more(20).await;
    let answers = traffic.stop().await;
    assert_answered_by(&answers, &["a", "b"], "failed requests");
    let synced_after = last_sync(&proc, "Ingress").await.unwrap();
    assert!(
        synced_after > synced_before,
        "last sync moved: {synced_before} -> {synced_after}"
    );
    wait_leading(&proc, true).await;
}

/// A restart that loses the API server's state (which a real one never does: etcd keeps it) is
/// taken at its word: after the relist nothing is routed, because nothing exists; readiness
/// stays (the controller is synced with what the API says). Re-creating the objects brings
/// the routes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn wiped_restart_follows_the_api_server() {
    let web = Backend::start("web");
    let cluster = Cluster::start().await;
    let yaml = web_site(&web);
    cluster.apply(&yaml).await;
    let proc = cluster.ingress().start();
    wait_ready(&proc).await;
    let http = client::http1();
    assert_eq!(who(&http, &proc, "web.example.com", "/").await, "web");

    cluster
        .server
        .restart(RestartOptions {
            wipe_state: true,
            downtime: Duration::from_millis(200),
            ..Default::default()
        })
        .await
        .unwrap();
    // A 404 once the empty relist arrived.
    wait_routed(&http, &proc, "web.example.com", "<404>", TIMEOUT).await;
    assert_eq!(admin_get(&proc, "/readyz").await.0, 200);
    cluster.apply(&yaml).await;
    wait_routed(&http, &proc, "web.example.com", "web", TIMEOUT).await;
}

/// The Lease cannot be read or written (the API answers 500 for it) while everything else
/// works: the leader steps down at its renew deadline and stops writing status, traffic and
/// routing go on; once the Lease is reachable it leads again and catches up.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn unreachable_lease_stops_status_writes_only() {
    let web = Backend::start("web");
    let cluster = Cluster::start().await;
    cluster.apply(&web_site(&web)).await;
    let proc = cluster.instance("lonely", "192.0.2.20", "3s").start();
    wait_ready(&proc).await;
    cluster.wait_address("app", "web", "192.0.2.20").await;
    let traffic = Traffic::start(&proc, "web.example.com", Duration::from_secs(120));
    cluster.server.faults().fail_matching("/leases/", 100_000);
    let failing = Instant::now();
    wait_leading(&proc, false).await;
    // The renew deadline is 2/3 of the lease duration; a retry period later at the latest.
    assert!(
        failing.elapsed() < Duration::from_secs(4),
        "stepped down after {:?}",
        failing.elapsed()
    );
    let writes = status_writes(&cluster, "lonely").len();
    cluster.apply(&web_ingress("new")).await;
    let http = client::http1();
    wait_routed(&http, &proc, "new.example.com", "web", TIMEOUT).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        status_writes(&cluster, "lonely").len(),
        writes,
        "status written without the Lease"
    );
    assert_eq!(cluster.address("app", "new").await, "");

    cluster.server.faults().clear();
    // The status of the new Ingress, once leading again.
    cluster.wait_address("app", "new", "192.0.2.20").await;
    assert_eq!(metric(&proc, "ingress_leader", &[]).await, Some(1.0));
    let answers = traffic.stop().await;
    assert_answered_by(&answers, &["web"], "failed requests");
}
