//! `--metrics-compat ingress-nginx` through the real binary and a real Prometheus (Debian's):
//! under HTTP/1.1 and HTTP/2 traffic (answered by a backend, by the proxy with 404, and 503 for
//! a Service that does not exist), every PromQL expression of ingress-nginx's two Grafana
//! dashboards (`tests/data/ingress-nginx/*.queries.json`) evaluates without error and returns
//! series, so do its Helm chart's sample alerts (`alerts.json`), and the request metrics carry
//! exactly ingress-nginx's label names.
//!
//! ```text
//!   curl ──> ingress :http/:https ──> backend
//!   prometheus ──scrape 1 s──> ingress :admin /metrics
//! ```

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ingress_tests::curl::{self, VERSIONS};
use ingress_tests::manifests::{annotated_ingress, service};
use ingress_tests::pki::{Ca, secret_yaml};
use ingress_tests::ports::free_port;
use ingress_tests::preflight::preflight_tool;
use ingress_tests::process::Ingress;
use ingress_tests::scratch::Scratch;
use ingress_tests::upstream::Backend;
use serde_json::Value;

/// Grafana's variables as a user sees them with "All" selected, and its range variables.
const VARIABLES: [(&str, &str); 5] = [
    ("$controller_class", ".*"),
    ("$controller", ".*"),
    ("$exported_namespace", ".*"),
    ("$namespace", ".*"),
    ("$ingress", ".*"),
];

/// Queries that are empty when all is well: ingress-nginx's "Last Config Failed" counts the
/// instances whose last reload failed.
const EMPTY_WHEN_HEALTHY: [&str; 1] = ["Last Config Failed"];

struct Prometheus(Child);

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn queries() -> Vec<(String, String)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("data/ingress-nginx");
    let mut all = Vec::new();
    for file in [
        "nginx.queries.json",
        "request-handling-performance.queries.json",
    ] {
        let text = std::fs::read_to_string(dir.join(file)).unwrap();
        let entries: Vec<Value> = serde_json::from_str(&text).unwrap();
        for entry in entries {
            let mut expr = entry["expr"].as_str().unwrap().to_string();
            for (name, value) in VARIABLES {
                expr = expr.replace(name, value);
            }
            all.push((entry["panel"].as_str().unwrap().to_string(), expr));
        }
    }
    assert!(all.len() > 25, "{} queries", all.len());
    all
}

fn query(prometheus: u16, expr: &str) -> Result<Value, String> {
    let out = Command::new("curl")
        .args(["-s", "--max-time", "5", "--get", "--data-urlencode"])
        .arg(format!("query={expr}"))
        .arg(format!("http://127.0.0.1:{prometheus}/api/v1/query"))
        .output()
        .map_err(|e| e.to_string())?;
    let answer: Value = serde_json::from_slice(&out.stdout)
        .map_err(|e| format!("{e}: {}", String::from_utf8_lossy(&out.stdout)))?;
    if answer["status"] != "success" {
        return Err(answer.to_string());
    }
    Ok(answer["data"]["result"].clone())
}

#[test]
#[allow(clippy::disallowed_methods)] // a plain blocking test: no async runtime to stall
fn ingress_nginx_dashboards_read_the_compat_metrics() {
    if !preflight_tool("prometheus") {
        return;
    }
    let web = Backend::start("web");
    let dir = Scratch::new("metrics-compat");
    let ca = Ca::new("compat CA");
    let leaf = ca.server("compat.test", &["compat.test"]);
    let front = annotated_ingress(
        "shop",
        "front",
        1,
        &[("ssl-redirect", "false")],
        &[("compat.test", "/", "Prefix", "web")],
    )
    .replace(
        "  rules:\n",
        "  tls: [{hosts: [compat.test], secretName: compat-tls}]\n  rules:\n",
    );
    dir.write(
        "all.yaml",
        &[
            service("shop", "web", &[&web]),
            secret_yaml("shop", "compat-tls", &leaf.chain, &leaf.key),
            front,
            annotated_ingress(
                "shop",
                "broken",
                2,
                &[],
                &[("broken.test", "/api", "Prefix", "missing")],
            ),
        ]
        .concat(),
    );
    let ingress = Ingress::builder()
        .manifests(dir.path())
        .args(["--metrics-compat", "ingress-nginx"])
        .env("POD_NAME", "ingress-test-0")
        .env("POD_NAMESPACE", "ingress-system")
        .start();

    // The request family's labels, exactly ingress-nginx's (without --metrics-per-host).
    curl::get(&ingress, "compat.test", "/", VERSIONS[0], &[]);
    let text = ingress.metrics();
    let line = text
        .lines()
        .find(|l| {
            l.starts_with("nginx_ingress_controller_requests_total{")
                || l.starts_with("nginx_ingress_controller_requests{")
        })
        .unwrap_or_else(|| panic!("no request series:\n{text}"));
    let labels: BTreeSet<&str> = line
        .split_once('{')
        .unwrap()
        .1
        .split(',')
        .filter_map(|kv| kv.split_once('=').map(|(k, _)| k.trim()))
        .collect();
    let want: BTreeSet<&str> = [
        "controller_namespace",
        "controller_class",
        "controller_pod",
        "status",
        "method",
        "path",
        "namespace",
        "ingress",
        "service",
        "canary",
    ]
    .into();
    assert_eq!(labels, want, "{line}");
    assert!(line.contains("controller_pod=\"ingress-test-0\""), "{line}");
    assert!(
        line.contains("controller_namespace=\"ingress-system\""),
        "{line}"
    );

    let port = free_port();
    let config = dir.write(
        "prometheus.yml",
        &format!(
            "global: {{scrape_interval: 1s}}\n\
             scrape_configs:\n  - job_name: ingress\n    static_configs: [{{targets: ['{}']}}]\n",
            ingress.admin
        ),
    );
    let log = std::fs::File::create(dir.path().join("prometheus.log")).unwrap();
    let _prometheus = Prometheus(
        Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("tsdb").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start prometheus"),
    );
    let prometheus_log =
        || std::fs::read_to_string(dir.path().join("prometheus.log")).unwrap_or_default();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match query(port, "up") {
            Ok(r) if r.to_string().contains("\"1\"") => break,
            other => assert!(
                Instant::now() < deadline,
                "prometheus never scraped the proxy: {other:?}\n{}",
                prometheus_log()
            ),
        }
        std::thread::sleep(Duration::from_millis(200));
    }

    // Traffic over a few scrapes: answered, 404, 503, over both protocol paths.
    for _ in 0..5 {
        for version in VERSIONS {
            assert_eq!(
                curl::get(&ingress, "compat.test", "/", version, &[]).status,
                200
            );
            assert_eq!(
                curl::get(&ingress, "compat.test", "/x", version, &["-X", "POST"]).status,
                200
            );
            assert_eq!(
                curl::get(&ingress, "nobody.test", "/", version, &[]).status,
                404
            );
            assert_eq!(
                curl::get(&ingress, "broken.test", "/api", version, &[]).status,
                503
            );
        }
        std::thread::sleep(Duration::from_millis(600));
    }
    std::thread::sleep(Duration::from_millis(2500));

    let mut failures = Vec::new();
    for (panel, expr) in queries() {
        let empty_ok = EMPTY_WHEN_HEALTHY.contains(&panel.as_str());
        match query(port, &expr) {
            Ok(result) if empty_ok => {
                if result.as_array().is_some_and(|r| !r.is_empty()) {
                    failures.push(format!(
                        "{panel}: expected no series (all healthy), got {result} for {expr}"
                    ));
                }
            }
            Ok(result) if result.as_array().is_some_and(|r| !r.is_empty()) => {}
            Ok(result) => failures.push(format!("{panel}: no series for {expr} ({result})")),
            Err(err) => failures.push(format!("{panel}: {expr}: {err}")),
        }
    }
    assert!(
        failures.is_empty(),
        "ingress-nginx dashboard queries:\n{}\nmetrics:\n{}",
        failures.join("\n"),
        ingress.metrics()
    );
    // What "Last Config Failed" counts exists, and says the last publish succeeded.
    let last = query(
        port,
        "nginx_ingress_controller_config_last_reload_successful",
    )
    .unwrap();
    assert!(last.to_string().contains("\"1\""), "{last}");

    // The chart's sample alerts: each evaluates, and what its threshold compares has series.
    let alerts = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("data/ingress-nginx/alerts.json"),
    )
    .unwrap();
    let alerts: Vec<Value> = serde_json::from_str(&alerts).unwrap();
    assert_eq!(alerts.len(), 4);
    for alert in alerts {
        let name = alert["alert"].as_str().unwrap();
        for (what, expr) in [("expr", &alert["expr"]), ("series", &alert["series"])] {
            let expr = expr.as_str().unwrap();
            let result = query(port, expr).unwrap_or_else(|e| panic!("{name} {what}: {e}"));
            if what == "series" {
                assert!(
                    result.as_array().is_some_and(|r| !r.is_empty()),
                    "{name}: no series for {expr}"
                );
            }
        }
    }
}
