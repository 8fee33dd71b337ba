//! Process lifecycle: readiness, admin endpoints, graceful shutdown, live reload, `check` and
//! `version`, and isolation of bad input.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::disallowed_methods)]

use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use ingress_tests::client::{self, get, try_get};
use ingress_tests::manifests::{ingress, one_route, service};
use ingress_tests::process::{Ingress, binary, check};
use ingress_tests::scratch::Scratch;
use ingress_tests::upstream::Backend;

#[test]
fn admin_endpoints_and_metrics() {
    let web = Backend::start("web");
    let dir = Scratch::new("admin");
    dir.write("a.yaml", &one_route("t", "web", "m.example.com", &web));
    let ingress = Ingress::start(dir.path());
    assert_eq!(ingress.admin_get("/healthz"), (200, "ok\n".into()));
    assert_eq!(ingress.admin_get("/readyz").0, 200);
    for _ in 0..3 {
        assert_eq!(
            ingress_tests::client::blocking_get(ingress.http, "/", "m.example.com").0,
            200
        );
    }
    assert_eq!(
        ingress_tests::client::blocking_get(ingress.http, "/", "none.example.com").0,
        404
    );
    let metrics = ingress.metrics();
    let value = |name: &str, labels: &[(&str, &str)]| {
        ingress_tests::client::metric_value(&metrics, name, labels)
    };
    assert_eq!(
        value(
            "ingress_requests_total",
            &[("ingress", "web"), ("service", "web"), ("status", "200")]
        ),
        Some(3.0)
    );
    assert_eq!(
        value(
            "ingress_requests_total",
            &[("ingress", ""), ("status", "404")]
        ),
        Some(1.0)
    );
    assert_eq!(
        value(
            "ingress_request_duration_seconds_count",
            &[("ingress", "web")]
        ),
        Some(3.0)
    );
    assert!(value("ingress_snapshot_generation", &[]).is_some_and(|g| g >= 1.0));
    assert!(value("ingress_snapshot_build_seconds_count", &[]).is_some_and(|n| n >= 1.0));
    assert_eq!(
        value(
            "ingress_config_errors",
            &[("kind", "ServiceNotFound"), ("severity", "error")]
        ),
        Some(0.0)
    );
    let routes = ingress.admin_get("/routes").1;
    assert!(
        routes.contains("m.example.com") && routes.contains("t/web:80"),
        "{routes}"
    );
}

#[test]
fn readiness_waits_for_the_first_snapshot_and_drops_on_sigterm() {
    let slow = Backend::start("slow");
    let dir = Scratch::new("drain");
    dir.write("a.yaml", &one_route("t", "slow", "d.example.com", &slow));
    let mut ingress = Ingress::builder()
        .manifests(dir.path())
        .args(["--drain-timeout", "5s"])
        .start();
    let http = ingress.http;
    let in_flight = std::thread::spawn(move || {
        ingress_tests::client::blocking_get(http, "/?delay_ms=1500", "d.example.com")
    });
    std::thread::sleep(Duration::from_millis(300));
    ingress.terminate();
    let deadline = Instant::now() + Duration::from_secs(1);
    while ingress.admin_get("/readyz").0 == 200 {
        assert!(
            Instant::now() < deadline,
            "readiness stayed true after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_millis(100));
    assert!(
        std::net::TcpStream::connect(http).is_err(),
        "still accepting after SIGTERM"
    );
    let (status, body) = in_flight.join().unwrap();
    assert_eq!(status, 200, "in-flight request finished: {body}");
    assert_eq!(
        ingress.wait_exit(Duration::from_secs(5)),
        Some(0),
        "logs:\n{}",
        ingress.logs()
    );
}

#[test]
fn drain_timeout_bounds_shutdown() {
    let slow = Backend::start("slow");
    let dir = Scratch::new("drain-timeout");
    dir.write("a.yaml", &one_route("t", "slow", "d.example.com", &slow));
    let mut ingress = Ingress::builder()
        .manifests(dir.path())
        .args(["--drain-timeout", "300ms"])
        .start();
    let http = ingress.http;
    let _stuck = std::thread::spawn(move || {
        ingress_tests::client::blocking_get(http, "/?delay_ms=10000", "d.example.com")
    });
    std::thread::sleep(Duration::from_millis(200));
    let started = Instant::now();
    ingress.terminate();
    assert_eq!(ingress.wait_exit(Duration::from_secs(5)), Some(0));
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "exit took {:?}",
        started.elapsed()
    );
}

#[test]
fn bad_input_is_isolated_and_reported() {
    let web = Backend::start("web");
    let dir = Scratch::new("bad");
    dir.write(
        "good.yaml",
        &(service("t", "web", &[&web])
            + &ingress("t", "good", &[("good.example.com", "/", "Prefix", "web")])),
    );
    dir.write(
        "broken.yaml",
        "apiVersion: v1\nkind: Service\nmetadata: [this is not a map\n",
    );
    dir.write(
        "bad-refs.yaml",
        &ingress(
            "t",
            "bad",
            &[
                ("bad.example.com", "/", "Prefix", "missing-service"),
                ("bad.example.com", "/re(", "ImplementationSpecific", "web"),
                ("bad.example.com", "/ok", "Prefix", "web"),
            ],
        ),
    );
    let ingress = Ingress::start(dir.path());
    assert_eq!(
        ingress_tests::client::blocking_get(ingress.http, "/", "good.example.com").0,
        200
    );
    assert_eq!(
        ingress_tests::client::blocking_get(ingress.http, "/ok", "bad.example.com").0,
        200
    );
    assert_eq!(
        ingress_tests::client::blocking_get(ingress.http, "/", "bad.example.com").0,
        503
    );
    for kind in ["ManifestInvalid", "ServiceNotFound", "InvalidRegex"] {
        assert_eq!(
            ingress.metric(
                "ingress_config_errors",
                &[("kind", kind), ("severity", "error")]
            ),
            Some(1.0),
            "{kind}"
        );
    }
    // The log is written by a background thread: wait for each line rather than race it.
    for needle in ["ServiceNotFound", "InvalidRegex", "ManifestInvalid"] {
        assert!(
            ingress.wait_for_log(needle, Duration::from_secs(5)),
            "log mentions {needle}:\n{}",
            ingress.logs()
        );
    }

    let out = check(dir.path(), &[]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "check fails on errors:\n{text}");
    for needle in [
        "good.example.com",
        "t/web:80",
        "127.0.0.1:",
        "ServiceNotFound",
        "InvalidRegex",
        "ManifestInvalid",
        "broken.yaml",
    ] {
        assert!(
            text.contains(needle),
            "check output mentions {needle}:\n{text}"
        );
    }
    std::fs::remove_file(dir.path().join("broken.yaml")).unwrap();
    std::fs::remove_file(dir.path().join("bad-refs.yaml")).unwrap();
    let out = check(dir.path(), &[]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let out = check(dir.path(), &["--output", "json"]);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json output");
    assert_eq!(json["routes"][0]["host"], "good.example.com");
}

#[test]
fn version_says_whether_ebpf_is_embedded() {
    let out = Command::new(binary()).arg("version").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    assert!(text.starts_with("ingress "), "{text}");
    assert!(
        text.contains("eBPF object embedded") || text.contains("userspace-only build"),
        "{text}"
    );
}

#[test]
fn json_logs_and_one_access_line_per_request() {
    let web = Backend::start("web");
    let dir = Scratch::new("json");
    dir.write("a.yaml", &one_route("t", "web", "j.example.com", &web));
    let ingress = Ingress::builder()
        .manifests(dir.path())
        .args(["--log-format", "json"])
        .start();
    for i in 0..5 {
        ingress_tests::client::blocking_get(ingress.http, &format!("/req-{i}"), "j.example.com");
    }
    // Access lines are written in batches by a background thread: wait for the last one.
    assert!(
        ingress.wait_for_log("/req-4", Duration::from_secs(5)),
        "{}",
        ingress.logs()
    );
    let logs = ingress.logs();
    let access: Vec<serde_json::Value> = logs
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["target"] == "access")
        .collect();
    assert_eq!(access.len(), 5, "{logs}");
    assert_eq!(access[0]["status"], 200);
    assert_eq!(access[0]["host"], "j.example.com");
    assert_eq!(access[2]["uri"], "/req-2");
}

/// Rewrites the manifests while 2000 requests are in flight: every request succeeds, and
/// traffic moves from the old backend to the new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn live_reload_under_load_loses_nothing() {
    let (old, new) = (Backend::start("old"), Backend::start("new"));
    let dir = Scratch::new("reload");
    let config = |b: &Backend| one_route("t", "web", "r.example.com", b);
    dir.write("a.yaml", &config(&old));
    let ingress = Ingress::start(dir.path());
    let http = client::http1();
    let url = ingress.url("/?delay_ms=5");
    let failures = Arc::new(AtomicUsize::new(0));
    let total = 2000;
    let concurrency = 50;
    let next = Arc::new(AtomicUsize::new(0));
    let mut workers = Vec::new();
    for _ in 0..concurrency {
        let (http, url, failures, next) =
            (http.clone(), url.clone(), failures.clone(), next.clone());
        workers.push(tokio::spawn(async move {
            let mut seen = Vec::new();
            while next.fetch_add(1, Ordering::Relaxed) < total {
                match try_get(&http, &url, "r.example.com").await {
                    Ok(reply) if reply.status == 200 => seen.push(reply.backend()),
                    Ok(reply) => {
                        failures.fetch_add(1, Ordering::Relaxed);
                        eprintln!("failed: {} {}", reply.status, reply.text());
                    }
                    Err(e) => {
                        failures.fetch_add(1, Ordering::Relaxed);
                        eprintln!("failed: {e}");
                    }
                }
            }
            seen
        }));
    }
    // Swap the backend while roughly a quarter of the requests are done.
    while next.load(Ordering::Relaxed) < total / 4 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    dir.replace("a.yaml", &config(&new));
    let mut order = Vec::new();
    for w in workers {
        order.extend(w.await.unwrap());
    }
    assert_eq!(
        failures.load(Ordering::Relaxed),
        0,
        "zero failed requests across the reload"
    );
    assert_eq!(order.len(), total);
    assert!(
        old.served() > 0 && new.served() > 0,
        "old {} new {}",
        old.served(),
        new.served()
    );
    // After the change has settled, everything goes to the new backend.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let before = old.served();
    for _ in 0..20 {
        assert_eq!(get(&http, &url, "r.example.com").await.backend(), "new");
    }
    assert_eq!(old.served(), before);
}
