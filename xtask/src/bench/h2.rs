//! HTTP/2 over TLS from clients, through each proxy to the same HTTP/1.1 upstream: ingress,
//! nginx (`listen ... ssl http2`) and haproxy (`mode http`, `alpn h2`), side by side, one proxy
//! core each.
//!
//! ```text
//!   core 1: h2load (64 connections × 10 concurrent streams), the upstream (nginx, 200)
//!   core 0: the proxy under test, one worker/thread
//! ```
//!
//! Reported per proxy: requests/s, p99 (from h2load's per-request log) and requests per proxy
//! CPU-second, medians of interleaved rounds, and ingress's ratios to each peer. Goal (issue
//! 15): ahead of haproxy. Then ingress alone: what an HTTP/2 request costs it (64×10 and 64×1)
//! against one on its HTTP/1.1 fast path (wrk, 64 keep-alive connections), all over TLS; the
//! goal is HTTP/2 at the fast path's cost.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, ensure};

use super::procs::{self, Running};
use super::{Bench, median, rig, tls, write, wrk};

const UPSTREAM: u16 = 19500;
const NGINX: u16 = 19543;
const HAPROXY: u16 = 19544;
const INGRESS: u16 = 19545;
const INGRESS_HTTP: u16 = 19580;
const INGRESS_ADMIN: u16 = 19257;
const CONNECTIONS: u32 = 64;
const STREAMS: u32 = 10;

/// One h2load run, as every HTTP/2 section reports it.
pub(super) struct Measured {
    pub(super) requests_per_sec: f64,
    pub(super) p99_ms: f64,
    pub(super) per_cpu_second: f64,
}

pub fn run(bench: &Bench) -> Result<()> {
    procs::require("haproxy")?;
    procs::ensure_free(&[
        UPSTREAM,
        NGINX,
        HAPROXY,
        INGRESS,
        INGRESS_HTTP,
        INGRESS_ADMIN,
    ])?;
    tls::resolve_to_loopback(rig::HOST)?;
    let dir = bench.scratch("h2")?;
    let (cert, key) = certificate(&dir)?;
    let _upstream = start_upstream(&dir)?;
    let mut proxies = [
        ("nginx", NGINX, start_nginx(&dir, &cert, &key)?),
        ("haproxy", HAPROXY, start_haproxy(&dir, &cert, &key)?),
        ("ingress", INGRESS, start_ingress(bench, &dir, &cert, &key)?),
    ];
    let timeout = Duration::from_secs(20);
    for (name, port, process) in &mut proxies {
        wait_h2(*port, timeout).with_context(|| format!("{name} over h2"))?;
        process.ensure_running(name)?;
    }
    let mut runs: Vec<Vec<Measured>> = vec![Vec::new(), Vec::new(), Vec::new()];
    for (_, port, process) in &proxies {
        load(&dir, *port, process, Duration::from_secs(1))?;
    }
    for _ in 0..bench.rounds {
        for (i, (_, port, process)) in proxies.iter().enumerate() {
            runs[i].push(load(&dir, *port, process, bench.duration)?);
        }
    }
    writeln!(
        bench.report,
        "\n## HTTP/2 over TLS, {CONNECTIONS} connections × {STREAMS} streams, to an HTTP/1.1 upstream (median of {} rounds)",
        bench.rounds
    );
    writeln!(
        bench.report,
        "{:<10} {:>12} {:>10} {:>22}",
        "proxy", "requests/s", "p99 ms", "requests/CPU-second"
    );
    let summary = |runs: &[Measured]| {
        (
            median(runs.iter().map(|m| m.requests_per_sec).collect()),
            median(runs.iter().map(|m| m.p99_ms).collect()),
            median(runs.iter().map(|m| m.per_cpu_second).collect()),
        )
    };
    let results: Vec<(f64, f64, f64)> = runs.iter().map(|r| summary(r)).collect();
    for ((name, _, _), (rate, p99, per_cpu)) in proxies.iter().zip(&results) {
        writeln!(
            bench.report,
            "{:<10} {:>12.0} {:>10.3} {:>22.0}",
            name, rate, p99, per_cpu
        );
    }
    let (ingress, nginx, haproxy) = (results[2], results[0], results[1]);
    let fast_path = same_cost(bench, &dir, &proxies[2].2)?;
    writeln!(
        bench.report,
        "ratio ingress/haproxy: requests/s {:.2}x, p99 {:.2}x, per CPU-second {:.2}x (goal: ahead of haproxy)",
        ingress.0 / haproxy.0,
        ingress.1 / haproxy.1,
        ingress.2 / haproxy.2
    );
    writeln!(
        bench.report,
        "ratio ingress/nginx: requests/s {:.2}x, p99 {:.2}x, per CPU-second {:.2}x",
        ingress.0 / nginx.0,
        ingress.1 / nginx.1,
        ingress.2 / nginx.2
    );
    writeln!(
        bench.report,
        "ingress, requests per proxy CPU-second over TLS: HTTP/2 {CONNECTIONS}×{STREAMS} {:.0}, HTTP/2 {CONNECTIONS}×1 {:.0}, HTTP/1.1 fast path (wrk, {CONNECTIONS} keep-alive connections) {:.0}",
        ingress.2, fast_path.h2_single, fast_path.h1
    );
    writeln!(
        bench.report,
        "ratio HTTP/2 / HTTP/1.1 per CPU-second: {:.2}x with {STREAMS} streams, {:.2}x with 1 (goal: HTTP/2 at the fast path's cost, 1.00x or more)",
        ingress.2 / fast_path.h1,
        fast_path.h2_single / fast_path.h1
    );
    Ok(())
}

/// What an HTTP/2 request costs ingress against one on its HTTP/1.1 fast path, both over TLS
/// to the same upstream: medians of requests per proxy CPU-second.
struct SameCost {
    h2_single: f64,
    h1: f64,
}

fn same_cost(bench: &Bench, dir: &Path, ingress: &Running) -> Result<SameCost> {
    let url = format!("https://{}:{INGRESS}/", rig::HOST);
    let (mut h2_single, mut h1) = (Vec::new(), Vec::new());
    for _ in 0..bench.rounds {
        let single = h2load(dir, ingress, (CONNECTIONS, 1), bench.duration, &[], &url)?;
        h2_single.push(single.per_cpu_second);
        let before = ingress.cpu_time()?;
        let load = wrk::run(&url, rig::HOST, bench.duration, CONNECTIONS, None)?;
        let cpu = ingress.cpu_time()?.saturating_sub(before);
        ensure!(
            load.all_answered(),
            "{url} over HTTP/1.1: not every request was answered: {load:?}"
        );
        h1.push(load.requests as f64 / cpu.as_secs_f64().max(0.001));
    }
    Ok(SameCost {
        h2_single: median(h2_single),
        h1: median(h1),
    })
}

/// One h2load run against `port`: its rate, its p99 and the proxy's CPU per request.
fn load(dir: &Path, port: u16, proxy: &Running, duration: Duration) -> Result<Measured> {
    let url = format!("https://{}:{port}/", rig::HOST);
    h2load(dir, proxy, (CONNECTIONS, STREAMS), duration, &[], &url)
}

/// One h2load run (`connections` × `streams`, on CPU 1) against `url` with `extra` arguments:
/// its rate, its p99 (from h2load's per-request log) and `proxy`'s CPU per request. Fails when
/// more than 1% of the requests failed, since a rate of failures measures nothing.
pub(super) fn h2load(
    dir: &Path,
    proxy: &Running,
    (connections, streams): (u32, u32),
    duration: Duration,
    extra: &[String],
    url: &str,
) -> Result<Measured> {
    let log = dir.join("h2load-requests.log");
    let before = proxy.cpu_time()?;
    let out = procs::pinned(1, "h2load")
        .args([
            "-t1",
            &format!("-c{connections}"),
            &format!("-m{streams}"),
            &format!("-D{}", duration.as_secs().max(1)),
        ])
        .args(extra)
        .arg(format!("--log-file={}", log.display()))
        .arg(url)
        .output()
        .context("running h2load")?;
    let cpu = proxy.cpu_time()?.saturating_sub(before);
    let text = String::from_utf8_lossy(&out.stdout);
    let rate: f64 = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("finished in "))
        .and_then(|l| l.split(", ").nth(1))
        .and_then(|r| r.trim_end_matches(" req/s").parse().ok())
        .with_context(|| format!("unexpected h2load output:\n{text}"))?;
    let log_text = std::fs::read_to_string(&log).context("reading h2load's request log")?;
    let mut latencies: Vec<f64> = Vec::new();
    let mut failed = 0u64;
    for line in log_text.lines() {
        let mut columns = line.split('\t');
        let (_, status, micros) = (columns.next(), columns.next(), columns.next());
        match (status, micros.and_then(|m| m.trim().parse::<f64>().ok())) {
            (Some("200"), Some(us)) => latencies.push(us / 1000.0),
            _ => failed += 1,
        }
    }
    ensure!(
        !latencies.is_empty() && failed * 100 <= latencies.len() as u64,
        "{url}: {failed} of {} requests failed:\n{text}",
        latencies.len() as u64 + failed
    );
    latencies.sort_by(f64::total_cmp);
    let p99 = latencies[(latencies.len() * 99 / 100).min(latencies.len() - 1)];
    let _ = std::fs::remove_file(&log);
    Ok(Measured {
        requests_per_sec: rate,
        p99_ms: p99,
        per_cpu_second: latencies.len() as f64 / cpu.as_secs_f64().max(0.001),
    })
}

fn wait_h2(port: u16, timeout: Duration) -> Result<()> {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        let out = Command::new("curl")
            .args([
                "-sk",
                "--http2",
                "-o",
                "/dev/null",
                "-w",
                "%{http_version} %{http_code}",
            ])
            .args(["--resolve", &format!("{}:{port}:127.0.0.1", rig::HOST)])
            .arg(format!("https://{}:{port}/", rig::HOST))
            .output()?;
        if String::from_utf8_lossy(&out.stdout) == "2 200" {
            return Ok(());
        }
        ensure!(
            std::time::Instant::now() < deadline,
            "no HTTP/2 200 on port {port}: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

pub(super) fn certificate(dir: &Path) -> Result<(std::path::PathBuf, std::path::PathBuf)> {
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    let status = Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-days",
            "30",
        ])
        .args([
            "-subj",
            &format!("/CN={}", rig::HOST),
            "-addext",
            &format!("subjectAltName=DNS:{}", rig::HOST),
        ])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output()?;
    ensure!(status.status.success(), "openssl req failed");
    Ok((cert, key))
}

fn start_upstream(dir: &Path) -> Result<Running> {
    write(
        &dir.join("upstream.conf"),
        &format!(
            "worker_processes 1; daemon off; pid {d}/upstream.pid; error_log {d}/upstream-error.log;\n\
             events {{ worker_connections 8192; }}\n\
             http {{ access_log off; server {{ listen 127.0.0.1:{UPSTREAM} backlog=4096; keepalive_requests 100000000;\n\
             location / {{ return 200 \"hello from the upstream\\n\"; }} }} }}\n",
            d = dir.display()
        ),
    )?;
    let mut cmd = procs::pinned(1, "nginx");
    cmd.args(["-p", &dir.to_string_lossy(), "-c"])
        .arg(dir.join("upstream.conf"));
    let upstream = Running::start("h2 upstream", cmd, &dir.join("upstream.log"))?;
    procs::wait_http(
        &format!("http://127.0.0.1:{UPSTREAM}/"),
        rig::HOST,
        Duration::from_secs(20),
    )?;
    Ok(upstream)
}

/// nginx with the forwarding headers ingress-nginx's template sets, as the rig's.
fn start_nginx(dir: &Path, cert: &Path, key: &Path) -> Result<Running> {
    write(
        &dir.join("nginx.conf"),
        &format!(
            "worker_processes 1; daemon off; pid {d}/nginx.pid; error_log {d}/nginx-error.log;\n\
             events {{ worker_connections 8192; }}\n\
             http {{ access_log off;\n\
             upstream backend {{ server 127.0.0.1:{UPSTREAM}; keepalive 128; }}\n\
             server {{ listen 127.0.0.1:{NGINX} ssl http2 backlog=4096;\n\
             ssl_certificate {cert}; ssl_certificate_key {key}; ssl_protocols TLSv1.3; ssl_session_tickets off;\n\
             keepalive_requests 100000000; http2_max_requests 100000000; http2_max_concurrent_streams 128;\n\
             location / {{ proxy_pass http://backend; proxy_http_version 1.1; proxy_set_header Connection \"\";\n\
             proxy_set_header Host $host; proxy_set_header X-Forwarded-For $remote_addr;\n\
             proxy_set_header X-Real-IP $remote_addr; proxy_set_header X-Forwarded-Proto $scheme;\n\
             proxy_set_header X-Forwarded-Host $host; proxy_set_header X-Forwarded-Port $server_port;\n\
             proxy_set_header X-Request-ID $request_id; }} }} }}\n",
            d = dir.display(),
            cert = cert.display(),
            key = key.display()
        ),
    )?;
    let mut cmd = procs::pinned(0, "nginx");
    cmd.args(["-p", &dir.to_string_lossy(), "-c"])
        .arg(dir.join("nginx.conf"));
    Running::start("nginx", cmd, &dir.join("nginx.log"))
}

/// haproxy, one thread, terminating TLS with ALPN h2 and setting the same forwarding headers.
fn start_haproxy(dir: &Path, cert: &Path, key: &Path) -> Result<Running> {
    let combined = dir.join("combined.pem");
    let pem = std::fs::read_to_string(cert)? + &std::fs::read_to_string(key)?;
    write(&combined, &pem)?;
    write(
        &dir.join("haproxy.cfg"),
        &format!(
            "global\n  nbthread 1\n  maxconn 1000\n  ssl-default-bind-options ssl-min-ver TLSv1.3\n\
             defaults\n  mode http\n  timeout connect 5s\n  timeout client 120s\n  timeout server 120s\n  option http-keep-alive\n\
             frontend h2\n  bind 127.0.0.1:{HAPROXY} ssl crt {combined} alpn h2,http/1.1\n\
             \x20 option forwardfor\n\
             \x20 http-request set-header X-Real-IP %[src]\n\
             \x20 http-request set-header X-Forwarded-Proto https\n\
             \x20 http-request set-header X-Forwarded-Host %[req.hdr(host)]\n\
             \x20 http-request set-header X-Forwarded-Port %[dst_port]\n\
             \x20 unique-id-format %{{+X}}o\\ %ci:%cp_%fi:%fp_%Ts_%rt\n\
             \x20 http-request set-header X-Request-ID %[unique-id]\n\
             \x20 default_backend up\n\
             backend up\n  http-reuse always\n  server up 127.0.0.1:{UPSTREAM}\n",
            combined = combined.display()
        ),
    )?;
    let mut cmd = procs::pinned(0, "haproxy");
    cmd.arg("-db").arg("-f").arg(dir.join("haproxy.cfg"));
    Running::start("haproxy", cmd, &dir.join("haproxy.log"))
}

fn start_ingress(bench: &Bench, dir: &Path, cert: &Path, key: &Path) -> Result<Running> {
    let manifests = dir.join("manifests");
    std::fs::create_dir_all(&manifests)?;
    let indent = |path: &Path| -> Result<String> {
        Ok(std::fs::read_to_string(path)?
            .lines()
            .map(|l| format!("    {l}\n"))
            .collect())
    };
    write(
        &manifests.join("h2.yaml"),
        &format!(
            "apiVersion: v1\nkind: Service\nmetadata: {{name: upstream, namespace: bench}}\nspec: {{ports: [{{name: http, port: 80}}]}}\n---\n\
             apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: upstream-1, namespace: bench, labels: {{kubernetes.io/service-name: upstream}}}}\n\
             addressType: IPv4\nports: [{{name: http, port: {UPSTREAM}}}]\nendpoints: [{{addresses: [\"127.0.0.1\"]}}]\n---\n\
             apiVersion: v1\nkind: Secret\nmetadata: {{name: bench-tls, namespace: bench}}\ntype: kubernetes.io/tls\nstringData:\n  tls.crt: |\n{crt}  tls.key: |\n{key}---\n\
             apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {{name: bench, namespace: bench}}\n\
             spec:\n  ingressClassName: ingress\n  tls: [{{hosts: [{host}], secretName: bench-tls}}]\n  rules:\n  - host: {host}\n    http: {{paths: [{{path: /, pathType: Prefix, backend: {{service: {{name: upstream, port: {{number: 80}}}}}}}}]}}\n",
            crt = indent(cert)?,
            key = indent(key)?,
            host = rig::HOST,
        ),
    )?;
    let mut cmd = procs::pinned(0, &bench.ingress.to_string_lossy());
    cmd.arg("--manifests")
        .arg(&manifests)
        .args([
            "--bind",
            "127.0.0.1",
            "--worker-threads",
            "1",
            "--access-log",
            "false",
            "--log-level",
            "warn",
        ])
        .args([
            "--http-port",
            &INGRESS_HTTP.to_string(),
            "--https-port",
            &INGRESS.to_string(),
            "--admin-port",
            &INGRESS_ADMIN.to_string(),
        ]);
    Running::start("ingress", cmd, &dir.join("ingress.log"))
}
