//! The Kubernetes source, measured through the in-memory test API server (`test-apiserver`,
//! built from the tests crate) and the release binary watching it.
//!
//! ```text
//!   this process ──PATCH Ingress──> test-apiserver (CPU 1) ──watch──> ingress (CPU 0)
//!        │                                                              │
//!        └──── GET / (keep-alive, polled every 0.5 ms) ────────────────┘──> nginx "blue" | "green"
//! ```
//!
//! - Event-to-routable latency: the time from sending an API write that moves an Ingress to
//!   the other Service until the first request through the proxy answered by that Service's
//!   backend. It includes the API server's write and watch fan-out, the debounce (default
//!   10 ms quiet time), the snapshot build and the swap, plus up to one polling interval.
//! - Scale: 10,000 Ingresses, 10,000 Services and 20,000 EndpointSlices created through the
//!   API, then the controller started against them: time to ready (lists + first build), RSS,
//!   and the time of a build after a single change (incremental: it redoes the changed
//!   Ingress and what shares its host), with the latency at that size and the goal it has.
//!
//! Numbers are printed, never judged.

// xtask is synchronous: there is no runtime for a blocking sleep or connect to stall.
#![allow(clippy::disallowed_methods)]

use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use serde_json::{Value, json};

use super::procs::{self, Running};
use super::report::Report;
use super::{Bench, write};

/// The scale goals (issue: builds that cost what changed): printed, never judged.
const GOAL_P99_MS: f64 = 20.0;
const GOAL_RSS_MIB: f64 = 239.0;

const API_PORT: u16 = 19600;
const HTTP_PORT: u16 = 19280;
const HTTPS_PORT: u16 = 19643;
const ADMIN_PORT: u16 = 19454;
const BLUE_PORT: u16 = 19010;
const GREEN_PORT: u16 = 19011;
const NS: &str = "bench";
/// Time between polls of the proxy while waiting for a change to be routable.
const POLL: Duration = Duration::from_micros(500);

pub fn run(bench: &Bench, quick: bool) -> Result<()> {
    let apiserver = apiserver_binary(bench, quick)?;
    let dir = bench.scratch("kube")?;
    let _upstreams = upstreams(&dir)?;
    let updates = if quick { 200 } else { 1000 };
    let scale_flips = if quick { 10 } else { 50 };

    writeln!(
        bench.report,
        "\n## Kubernetes source (through the test API server)"
    );
    writeln!(
        bench.report,
        "method: PATCH an Ingress to the other Service, then GET through the proxy every {POLL:?} on a"
    );
    writeln!(
        bench.report,
        "keep-alive connection until the other backend answers; latency = first such answer - write sent."
    );
    writeln!(
        bench.report,
        "It includes the API write and watch delivery, the 10 ms debounce, the build and the swap."
    );
    if quick {
        writeln!(
            bench.report,
            "(--quick: {updates} updates and {scale_flips} at scale, and a debug-built API server; run without --quick for 1000 and 50)"
        );
    }

    let small = dir.join("small");
    std::fs::create_dir_all(&small)?;
    let api = ApiServer::start(&apiserver, &small)?;
    let mut client = api.client()?;
    create_base(&mut client, 1, 1, 1)?;
    let ingress = start_ingress(bench, &small)?;
    wait_ready(Duration::from_secs(60))?;
    let latencies = flip(&mut client, "ing-0", "h0.bench.local", updates)?;
    report(
        &bench.report,
        &format!("event to routable, 1 Ingress, {updates} updates"),
        &latencies,
    );
    drop(ingress);
    drop(api);

    let large = dir.join("large");
    std::fs::create_dir_all(&large)?;
    let api = ApiServer::start(&apiserver, &large)?;
    let mut client = api.client()?;
    let loading = Instant::now();
    let objects = create_base(&mut client, 10_000, 10_000, 2)?;
    writeln!(
        bench.report,
        "loaded {objects} objects through the API server in {:.1} s",
        loading.elapsed().as_secs_f64()
    );
    let started = Instant::now();
    let ingress = start_ingress(bench, &large)?;
    wait_ready(Duration::from_secs(300))?;
    let ready = started.elapsed();
    std::thread::sleep(Duration::from_secs(2));
    let scraped = metrics()?;
    let first_build = procs::metric(&scraped, "ingress_snapshot_build_seconds_sum")
        .context("build time metric")?;
    let (sum_before, count_before) = build_totals(&scraped)?;
    let rss_ready = ingress.rss_kib()? as f64 / 1024.0;
    let latencies = flip(&mut client, "ing-0", "h0.bench.local", scale_flips)?;
    let (sum_after, count_after) = build_totals(&metrics()?)?;
    let rss_after = ingress.rss_kib()? as f64 / 1024.0;
    let rebuilds = count_after - count_before;
    ensure!(rebuilds > 0.0, "no rebuild happened");
    writeln!(
        bench.report,
        "\n### 10,000 Ingresses, 10,000 Services, 20,000 EndpointSlices (from the API)"
    );
    writeln!(
        bench.report,
        "{:<44} {:>12}",
        "start to ready (lists + first build)",
        format!("{:.2} s", ready.as_secs_f64())
    );
    writeln!(
        bench.report,
        "{:<44} {:>12}",
        "first build",
        format!("{:.1} ms", first_build * 1000.0)
    );
    writeln!(
        bench.report,
        "{:<44} {:>12}",
        format!("build after one change, mean of {rebuilds}"),
        format!("{:.1} ms", (sum_after - sum_before) / rebuilds * 1000.0)
    );
    writeln!(
        bench.report,
        "{:<44} {:>12}",
        "RSS when ready",
        format!("{rss_ready:.1} MiB")
    );
    writeln!(
        bench.report,
        "{:<44} {:>12}",
        format!("RSS after {scale_flips} updates"),
        format!("{rss_after:.1} MiB")
    );
    report(
        &bench.report,
        &format!("event to routable at this size, {scale_flips} updates"),
        &latencies,
    );
    let p99 = percentile(&latencies, 990);
    let met = |ok: bool| if ok { "met" } else { "NOT met" };
    writeln!(
        bench.report,
        "goal at this size: p99 event to routable < {GOAL_P99_MS} ms: {p99:.1} ms, {}; RSS <= {GOAL_RSS_MIB} MiB: {rss_after:.1} MiB, {}",
        met(p99 < GOAL_P99_MS),
        met(rss_after <= GOAL_RSS_MIB),
    );
    drop(ingress);
    drop(api);
    Ok(())
}

/// `test-apiserver` from the tests crate. A full run builds it in release like the binary under
/// test; `--quick` (CI) takes the debug build the test step already made, which spares a second
/// release build of the whole dependency tree and only makes the API server's own share of the
/// latency pessimistic.
fn apiserver_binary(bench: &Bench, quick: bool) -> Result<PathBuf> {
    let release = bench.ingress.parent().context("release directory")?;
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let ws = crate::workspace::Workspace::locate()?;
    let mut args = vec!["build", "-p", "ingress-tests", "--bin", "test-apiserver"];
    if !quick {
        args.push("--release");
    }
    let status = Command::new(cargo)
        .args(&args)
        .current_dir(&ws.root)
        .status()?;
    ensure!(status.success(), "building test-apiserver failed");
    let dir = if quick {
        release.parent().context("target directory")?.join("debug")
    } else {
        release.to_path_buf()
    };
    Ok(dir.join("test-apiserver"))
}

/// Two nginx servers that answer with their colour.
fn upstreams(dir: &Path) -> Result<Running> {
    write(
        &dir.join("upstreams.conf"),
        &format!(
            "worker_processes 1; daemon off; pid {d}/upstreams.pid; error_log {d}/upstreams-error.log;\n\
             events {{ worker_connections 1024; }}\n\
             http {{ access_log off; keepalive_requests 100000000;\n\
             server {{ listen 127.0.0.1:{BLUE_PORT}; location / {{ return 200 \"blue\"; }} }}\n\
             server {{ listen 127.0.0.1:{GREEN_PORT}; location / {{ return 200 \"green\"; }} }} }}\n",
            d = dir.display()
        ),
    )?;
    let mut cmd = procs::pinned(1, "nginx");
    cmd.args(["-p", &dir.to_string_lossy(), "-c"])
        .arg(dir.join("upstreams.conf"));
    let mut running = Running::start("upstreams", cmd, &dir.join("upstreams.log"))?;
    procs::wait_http(
        &format!("http://127.0.0.1:{BLUE_PORT}/"),
        "x",
        Duration::from_secs(10),
    )?;
    procs::wait_http(
        &format!("http://127.0.0.1:{GREEN_PORT}/"),
        "x",
        Duration::from_secs(10),
    )?;
    running.ensure_running("the upstream nginx")?;
    Ok(running)
}

/// Stopped when dropped.
struct ApiServer {
    _process: Running,
}

impl ApiServer {
    fn start(binary: &Path, dir: &Path) -> Result<ApiServer> {
        let kubeconfig = dir.join("kubeconfig");
        let _ = std::fs::remove_file(&kubeconfig);
        let mut cmd = procs::pinned(1, &binary.to_string_lossy());
        // History long enough that loading 40,000 objects never expires a watch.
        cmd.args([
            "--port",
            &API_PORT.to_string(),
            "--history",
            "200000",
            "--kubeconfig",
        ])
        .arg(&kubeconfig)
        .env("RUST_LOG", "warn");
        let process = Running::start("test-apiserver", cmd, &dir.join("apiserver.log"))?;
        let deadline = Instant::now() + Duration::from_secs(20);
        while !kubeconfig.exists() || Api::connect().is_err() {
            ensure!(Instant::now() < deadline, "test-apiserver did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(ApiServer { _process: process })
    }

    fn client(&self) -> Result<Api> {
        Api::connect()
    }
}

/// The IngressClass, `services` Services of `slices` EndpointSlices each, and `ingresses`
/// Ingresses (host h<i>.bench.local → svc-<i mod services>). svc-0 and svc-1 point at the blue
/// and green upstreams, the others at unroutable addresses. Returns the number of objects.
fn create_base(api: &mut Api, ingresses: usize, services: usize, slices: usize) -> Result<usize> {
    let mut count = 0;
    api.create("/apis/networking.k8s.io/v1/ingressclasses", &json!({"apiVersion": "networking.k8s.io/v1", "kind": "IngressClass", "metadata": {"name": "ingress"}, "spec": {"controller": "ingress.rs/controller"}}))?;
    count += 1;
    for s in 0..services.max(2) {
        api.create(&format!("/api/v1/namespaces/{NS}/services"), &json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": format!("svc-{s}"), "namespace": NS}, "spec": {"ports": [{"name": "http", "port": 80}]}}))?;
        count += 1;
        for k in 0..slices {
            // svc-0 and svc-1 serve from the blue and green upstreams; their other slices hold
            // endpoints that are not ready, so only the upstream is ever chosen.
            let (port, ready) = match s {
                0 if k == 0 => (BLUE_PORT, true),
                1 if k == 0 => (GREEN_PORT, true),
                0 | 1 => (8080, false),
                _ => (8080, true),
            };
            let endpoints: Vec<Value> = if port == 8080 {
                (1..=2).map(|e| json!({"addresses": [format!("10.{}.{}.{}", (s >> 8) & 255, s & 255, 2 * k + e)], "conditions": {"ready": ready}})).collect()
            } else {
                vec![json!({"addresses": ["127.0.0.1"], "conditions": {"ready": true}})]
            };
            api.create(
                &format!("/apis/discovery.k8s.io/v1/namespaces/{NS}/endpointslices"),
                &json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "metadata": {"name": format!("svc-{s}-{k}"), "namespace": NS, "labels": {"kubernetes.io/service-name": format!("svc-{s}")}}, "addressType": "IPv4", "ports": [{"name": "http", "port": port}], "endpoints": endpoints}),
            )?;
            count += 1;
        }
    }
    for i in 0..ingresses {
        api.create(
            &format!("/apis/networking.k8s.io/v1/namespaces/{NS}/ingresses"),
            &ingress(i, &format!("svc-{}", i % services.max(1))),
        )?;
        count += 1;
    }
    Ok(count)
}

fn ingress(i: usize, service: &str) -> Value {
    json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
        "metadata": {"name": format!("ing-{i}"), "namespace": NS},
        "spec": {"ingressClassName": "ingress", "rules": [rule(&format!("h{i}.bench.local"), service)]},
    })
}

fn rule(host: &str, service: &str) -> Value {
    json!({"host": host, "http": {"paths": [{"path": "/", "pathType": "Prefix", "backend": {"service": {"name": service, "port": {"number": 80}}}}]}})
}

fn start_ingress(bench: &Bench, dir: &Path) -> Result<Running> {
    let mut cmd = procs::pinned(0, &bench.ingress.to_string_lossy());
    // The bench's nginx backends listen on loopback, which the Kubernetes source refuses
    // unless told otherwise.
    cmd.arg("--kubeconfig")
        .arg(dir.join("kubeconfig"))
        .arg("--allow-local-backends")
        .args([
            "--bind",
            "127.0.0.1",
            "--http-port",
            &HTTP_PORT.to_string(),
            "--https-port",
            &HTTPS_PORT.to_string(),
        ])
        .args([
            "--admin-port",
            &ADMIN_PORT.to_string(),
            "--worker-threads",
            "1",
            "--access-log",
            "false",
            "--log-level",
            "warn",
        ])
        .args(["--pod-name", "bench", "--lease-namespace", NS]);
    Running::start("ingress", cmd, &dir.join("ingress.log"))
}

fn wait_ready(timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(mut conn) = TcpStream::connect(("127.0.0.1", ADMIN_PORT))
            && let Ok((200, _)) = request(&mut conn, "GET", "/readyz", "localhost", None)
        {
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "ingress not ready within {timeout:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn metrics() -> Result<String> {
    let mut conn = TcpStream::connect(("127.0.0.1", ADMIN_PORT))?;
    Ok(request(&mut conn, "GET", "/metrics", "localhost", None)?.1)
}

fn build_totals(metrics: &str) -> Result<(f64, f64)> {
    let sum = procs::metric(metrics, "ingress_snapshot_build_seconds_sum").context("build sum")?;
    let count =
        procs::metric(metrics, "ingress_snapshot_build_seconds_count").context("build count")?;
    Ok((sum, count))
}

/// Moves Ingress `name` between svc-0 (blue) and svc-1 (green) `times` times, measuring each
/// move from the write to the first answer from the new colour.
fn flip(api: &mut Api, name: &str, host: &str, times: usize) -> Result<Vec<Duration>> {
    let mut proxy = TcpStream::connect(("127.0.0.1", HTTP_PORT))?;
    proxy.set_nodelay(true)?;
    let deadline = Instant::now() + Duration::from_secs(60);
    // Start from blue.
    api.patch(name, &rule(host, "svc-0"))?;
    while request(&mut proxy, "GET", "/", host, None)
        .map(|r| r.1)
        .unwrap_or_default()
        != "blue"
    {
        ensure!(Instant::now() < deadline, "{host} never routed to blue");
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut latencies = Vec::with_capacity(times);
    for i in 0..times {
        let (service, colour) = if i % 2 == 0 {
            ("svc-1", "green")
        } else {
            ("svc-0", "blue")
        };
        // A short, varying pause so updates do not fall into a rhythm with the debounce timer.
        std::thread::sleep(Duration::from_millis(5 + (i as u64 * 7) % 11));
        let sent = Instant::now();
        api.patch(name, &rule(host, service))?;
        loop {
            let answer = match request(&mut proxy, "GET", "/", host, None) {
                Ok((_, body)) => body,
                Err(_) => {
                    proxy = TcpStream::connect(("127.0.0.1", HTTP_PORT))?;
                    proxy.set_nodelay(true)?;
                    String::new()
                }
            };
            if answer == colour {
                latencies.push(sent.elapsed());
                break;
            }
            if sent.elapsed() > Duration::from_secs(10) {
                bail!("update {i}: {host} not routed to {colour} within 10 s");
            }
            std::thread::sleep(POLL);
        }
    }
    Ok(latencies)
}

/// The nearest-rank percentile (in thousandths) of latencies, in milliseconds.
fn percentile(latencies: &[Duration], per_mille: usize) -> f64 {
    let mut ms: Vec<f64> = latencies.iter().map(|d| d.as_secs_f64() * 1000.0).collect();
    ms.sort_by(|a, b| a.total_cmp(b));
    ms.get((ms.len() * per_mille).div_ceil(1000).max(1) - 1)
        .copied()
        .unwrap_or(f64::NAN)
}

fn report(out: &Report, title: &str, latencies: &[Duration]) {
    let ms: Vec<f64> = latencies.iter().map(|d| d.as_secs_f64() * 1000.0).collect();
    let pct = |per_mille: usize| percentile(latencies, per_mille);
    let mean = ms.iter().sum::<f64>() / ms.len().max(1) as f64;
    let mut line = String::new();
    let _ = write!(
        line,
        "{title}: p50 {:.1} ms, p90 {:.1} ms, p99 {:.1} ms, max {:.1} ms, mean {mean:.1} ms",
        pct(500),
        pct(900),
        pct(990),
        pct(1000)
    );
    writeln!(out, "{line}");
    let within = ms.iter().filter(|v| **v <= 100.0).count();
    writeln!(out, "  {within} of {} within 100 ms", ms.len());
}

/// A keep-alive HTTP/1.1 connection to the test API server.
struct Api {
    conn: TcpStream,
}

impl Api {
    fn connect() -> Result<Api> {
        let conn = TcpStream::connect(("127.0.0.1", API_PORT))?;
        conn.set_nodelay(true)?;
        Ok(Api { conn })
    }

    fn create(&mut self, path: &str, object: &Value) -> Result<()> {
        let body = serde_json::to_vec(object)?;
        let (status, text) = request(
            &mut self.conn,
            "POST",
            path,
            "localhost",
            Some(("application/json", &body)),
        )?;
        ensure!(status == 201, "POST {path}: {status} {text}");
        Ok(())
    }

    /// Replaces the rules of Ingress `name` (a merge patch replaces lists whole).
    fn patch(&mut self, name: &str, rule: &Value) -> Result<()> {
        let path = format!("/apis/networking.k8s.io/v1/namespaces/{NS}/ingresses/{name}");
        let body = serde_json::to_vec(&json!({"spec": {"rules": [rule]}}))?;
        let (status, text) = request(
            &mut self.conn,
            "PATCH",
            &path,
            "localhost",
            Some(("application/merge-patch+json", &body)),
        )?;
        ensure!(status == 200, "PATCH {path}: {status} {text}");
        Ok(())
    }
}

/// One request on a keep-alive connection; returns the status and the body (Content-Length or
/// chunked).
fn request(
    conn: &mut TcpStream,
    method: &str,
    path: &str,
    host: &str,
    body: Option<(&str, &[u8])>,
) -> Result<(u16, String)> {
    conn.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut head =
        format!("{method} {path} HTTP/1.1\r\nHost: {host}\r\nAccept: application/json\r\n");
    if let Some((content_type, bytes)) = body {
        let _ = write!(
            head,
            "Content-Type: {content_type}\r\nContent-Length: {}\r\n",
            bytes.len()
        );
    }
    head.push_str("\r\n");
    let mut out = head.into_bytes();
    if let Some((_, bytes)) = body {
        out.extend_from_slice(bytes);
    }
    conn.write_all(&out)?;
    let mut buf = Vec::with_capacity(4096);
    let mut chunk = [0u8; 16384];
    let header_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = conn.read(&mut chunk)?;
        ensure!(n > 0, "connection closed");
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..header_end]).to_ascii_lowercase();
    let status: u16 = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .context("status line")?;
    let mut rest = buf[header_end..].to_vec();
    let content_length = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse::<usize>().ok());
    let body = if let Some(len) = content_length {
        while rest.len() < len {
            let n = conn.read(&mut chunk)?;
            ensure!(n > 0, "connection closed mid-body");
            rest.extend_from_slice(&chunk[..n]);
        }
        rest.truncate(len);
        rest
    } else if head.contains("transfer-encoding: chunked") {
        dechunk(conn, rest)?
    } else {
        rest
    };
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

fn dechunk(conn: &mut TcpStream, mut raw: Vec<u8>) -> Result<Vec<u8>> {
    let mut body = Vec::new();
    let mut chunk = [0u8; 16384];
    let mut pos = 0;
    loop {
        // Make sure a whole size line is buffered.
        let line_end = loop {
            if let Some(i) = raw[pos..].windows(2).position(|w| w == b"\r\n") {
                break pos + i;
            }
            let n = conn.read(&mut chunk)?;
            ensure!(n > 0, "connection closed mid-chunk");
            raw.extend_from_slice(&chunk[..n]);
        };
        let size_text = String::from_utf8_lossy(&raw[pos..line_end]);
        let size = usize::from_str_radix(size_text.split(';').next().unwrap_or("").trim(), 16)
            .context("chunk size")?;
        let data_start = line_end + 2;
        // The chunk, its CRLF, and for the last chunk the final CRLF.
        while raw.len() < data_start + size + 2 {
            let n = conn.read(&mut chunk)?;
            ensure!(n > 0, "connection closed mid-chunk");
            raw.extend_from_slice(&chunk[..n]);
        }
        if size == 0 {
            return Ok(body);
        }
        body.extend_from_slice(&raw[data_start..data_start + size]);
        pos = data_start + size + 2;
    }
}
