//! The dashboard and the alerts in deploy/monitoring, checked by a real Prometheus (Debian's)
//! scraping the real binary in eBPF mode under traffic: every panel's PromQL evaluates without
//! error and returns series, every alert rule is loaded and evaluates healthily, and promtool
//! checks the rules and proves each alert fires on its condition (alerts-test.yaml).
//!
//! ```text
//!   client ns: curl (known, unknown, passthrough, 503)  ──veth──>  server ns: ingress :443 :80
//!                                                                   prometheus :9090 ─scrape 1s─> :10254
//! ```

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use ingress_tests::gate_site::{KNOWN, MAIN, Site};
use ingress_tests::manifests::service;
use ingress_tests::netns::SERVER_IP;
use ingress_tests::preflight::preflight_tool;
use ingress_tests::{Mode, scratch::Scratch};
use serde_json::Value;

const PROMETHEUS: &str = "127.0.0.1:9090";
/// What `$__rate_interval` becomes: several 1 s scrapes, covering the traffic just sent.
const RATE_INTERVAL: &str = "15s";

fn monitoring_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/monitoring")
}

/// The rules file inside the PrometheusRule: its `spec`.
fn rules_yaml() -> String {
    let text = std::fs::read_to_string(monitoring_dir().join("prometheus-rules.yaml")).unwrap();
    let rule: Value = serde_yaml_ng::from_str(&text).unwrap();
    assert_eq!(rule["kind"], "PrometheusRule");
    serde_yaml_ng::to_string(&rule["spec"]).unwrap()
}

/// Every PromQL expression of the dashboard, with Grafana's variables replaced by what a user
/// sees with "All" selected.
fn dashboard_queries() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(monitoring_dir().join("grafana-dashboard.json")).unwrap();
    let dashboard: Value = serde_json::from_str(&text).unwrap();
    let variables: Vec<&str> = dashboard["templating"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap())
        .collect();
    assert_eq!(variables, ["datasource", "namespace", "ingress"]);
    let mut queries = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"]
                .as_str()
                .unwrap()
                .replace("$__rate_interval", RATE_INTERVAL)
                .replace("$namespace", ".*")
                .replace("$ingress", ".*");
            assert!(!expr.contains('$'), "an unknown variable in {expr}");
            queries.push((panel["title"].as_str().unwrap().to_string(), expr));
        }
    }
    assert!(queries.len() >= 20, "{} queries", queries.len());
    queries
}

#[test]
fn promtool_checks_the_rules_and_proves_each_alert() {
    if !preflight_tool("promtool") {
        return;
    }
    let dir = Scratch::new("promtool");
    dir.write("rules.yaml", &rules_yaml());
    std::fs::copy(
        monitoring_dir().join("alerts-test.yaml"),
        dir.path().join("alerts-test.yaml"),
    )
    .unwrap();
    for args in [
        &["check", "rules", "rules.yaml"][..],
        &["test", "rules", "alerts-test.yaml"],
    ] {
        let out = std::process::Command::new("promtool")
            .args(args)
            .current_dir(dir.path())
            .output()
            .expect("promtool runs");
        assert!(
            out.status.success(),
            "promtool {args:?}:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // Every alert has a unit test.
    let rules: Value = serde_yaml_ng::from_str(&rules_yaml()).unwrap();
    let tests = std::fs::read_to_string(monitoring_dir().join("alerts-test.yaml")).unwrap();
    for rule in rules["groups"][0]["rules"].as_array().unwrap() {
        let name = rule["alert"].as_str().unwrap();
        assert!(
            tests.contains(&format!("alertname: {name}\n")),
            "{name} has no test"
        );
    }
}

#[tokio::test]
async fn prometheus_evaluates_every_dashboard_query_and_alert_against_the_binary() {
    if !preflight_tool("prometheus") {
        return;
    }
    let Some(site) = Site::new("monitoring", &[KNOWN]) else {
        return;
    };
    // Beside the site's Ingress: a TLS-passthrough host (to a plain HTTP backend: the bytes
    // still flow and are counted) and a host whose Service does not exist (a configuration
    // error, and 503s).
    let extra = service("t", "plain", &[&site.backend])
        + "---\napiVersion: networking.k8s.io/v1\nkind: Ingress\n\
           metadata: {name: through, namespace: t, annotations: {nginx.ingress.kubernetes.io/ssl-passthrough: \"true\"}}\n\
           spec:\n  ingressClassName: ingress\n  rules:\n  - host: new.test\n    http: {paths: [{path: /, pathType: Prefix, backend: {service: {name: plain, port: {number: 80}}}}]}\n\
           ---\napiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {name: broken, namespace: t}\n\
           spec:\n  ingressClassName: ingress\n  rules:\n  - host: stay.test\n    http: {paths: [{path: /, pathType: Prefix, backend: {service: {name: missing, port: {number: 80}}}}]}\n";
    std::fs::write(site.manifests().join("extra.yaml"), extra).unwrap();
    let proxy = site.start(Mode::Ebpf, &[]);

    let rules = site.dir.write("rules.yaml", &rules_yaml());
    let config = site.dir.write(
        "prometheus.yml",
        &format!(
            "global: {{scrape_interval: 1s, evaluation_interval: 1s}}\n\
             rule_files: [{}]\n\
             scrape_configs:\n  - job_name: ingress\n    static_configs: [{{targets: ['127.0.0.1:{}']}}]\n",
            rules.display(),
            MAIN.admin
        ),
    );
    let data = site.dir.path().join("tsdb");
    let log = std::fs::File::create(site.dir.path().join("prometheus.log")).unwrap();
    let _prometheus = site
        .pair
        .server
        .command("prometheus")
        .arg(format!("--config.file={}", config.display()))
        .arg(format!("--storage.tsdb.path={}", data.display()))
        .arg(format!("--web.listen-address={PROMETHEUS}"))
        .stdout(Stdio::null())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .expect("start prometheus");
    let prometheus_log =
        || std::fs::read_to_string(site.dir.path().join("prometheus.log")).unwrap_or_default();

    // Prometheus up and scraping the proxy.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let up = query(&site, "up").await;
        if up.as_ref().is_ok_and(|r| value_of(r) == Some(1.0)) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "prometheus never scraped the proxy: {up:?}\n{}",
            prometheus_log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // Traffic of every kind the dashboard shows, spread over a few scrapes.
    for round in 0..4 {
        for _ in 0..5 {
            assert_eq!(site.curl(KNOWN).await, Ok(200), "round {round}");
        }
        assert!(
            site.curl("gone.test").await.is_err(),
            "an unknown name is refused"
        );
        let _ = site.curl("new.test").await; // passthrough to plain HTTP: the handshake fails
        let status = plain_http(&site, "stay.test").await;
        assert_eq!(status, "503", "a Service that does not exist");
        tokio::time::sleep(Duration::from_millis(700)).await;
    }
    // Two more scrapes after the last request.
    tokio::time::sleep(Duration::from_millis(2500)).await;

    let mut failures = Vec::new();
    for (panel, expr) in dashboard_queries() {
        match query(&site, &expr).await {
            Ok(result) if result.as_array().is_some_and(|r| !r.is_empty()) => {}
            Ok(result) => failures.push(format!("{panel}: no series for {expr} ({result})")),
            Err(err) => failures.push(format!("{panel}: {expr}: {err}")),
        }
    }
    assert!(
        failures.is_empty(),
        "dashboard queries:\n{}\nmetrics:\n{}",
        failures.join("\n"),
        proxy.metrics()
    );

    // Every alert rule loaded and evaluated without error.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let rules = api(&site, "/api/v1/rules").await.unwrap();
        let all: Vec<&Value> = rules["groups"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|g| g["rules"].as_array().unwrap())
            .collect();
        let unhealthy: Vec<String> = all
            .iter()
            .filter(|r| r["health"] != "ok")
            .map(|r| format!("{} {} {}", r["name"], r["health"], r["lastError"]))
            .collect();
        if all.len() == 8 && unhealthy.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{} rules, unhealthy: {unhealthy:?}",
            all.len()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // And the live configuration error is one the alert would see.
    let errors = query(
        &site,
        "sum by (kind) (ingress_config_errors{severity=\"error\"}) > 0",
    )
    .await
    .unwrap();
    assert!(errors.to_string().contains("ServiceNotFound"), "{errors}");
}

/// `curl http://<server>/` with `Host: host` from the client namespace: the status code.
async fn plain_http(site: &Site, host: &str) -> String {
    let out = site
        .pair
        .client
        .command("curl")
        .args([
            "-s",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "--max-time",
            "5",
        ])
        .args(["-H", &format!("Host: {host}")])
        .arg(format!("http://{SERVER_IP}:{}/", MAIN.http))
        .output()
        .await
        .expect("curl");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// An instant query: the `result` array, or the error Prometheus gave.
async fn query(site: &Site, expr: &str) -> Result<Value, String> {
    let body = api_query(site, expr).await?;
    Ok(body["data"]["result"].clone())
}

/// The single value of a one-series result.
fn value_of(result: &Value) -> Option<f64> {
    result.as_array()?.first()?["value"][1]
        .as_str()?
        .parse()
        .ok()
}

async fn api_query(site: &Site, expr: &str) -> Result<Value, String> {
    let out = site
        .pair
        .server
        .command("curl")
        .args(["-s", "--max-time", "5", "--data-urlencode"])
        .arg(format!("query={expr}"))
        .arg(format!("http://{PROMETHEUS}/api/v1/query"))
        .output()
        .await
        .map_err(|e| e.to_string())?;
    parse_answer(&out.stdout)
}

async fn api(site: &Site, path: &str) -> Result<Value, String> {
    let out = site
        .pair
        .server
        .command("curl")
        .args(["-s", "--max-time", "5"])
        .arg(format!("http://{PROMETHEUS}{path}"))
        .output()
        .await
        .map_err(|e| e.to_string())?;
    Ok(parse_answer(&out.stdout)?["data"].clone())
}

fn parse_answer(stdout: &[u8]) -> Result<Value, String> {
    let body: Value = serde_json::from_slice(stdout)
        .map_err(|e| format!("{e}: {}", String::from_utf8_lossy(stdout)))?;
    if body["status"] == "success" {
        Ok(body)
    } else {
        Err(format!("{}: {}", body["errorType"], body["error"]))
    }
}
