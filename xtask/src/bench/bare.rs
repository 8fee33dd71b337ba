//! HTTP/1.1 keep-alive against a bare nginx reverse proxy: one worker, `upstream { keepalive
//! 256; }`, `proxy_http_version 1.1`, `proxy_set_header Connection ""` and nothing else (no
//! forwarding headers, access log off), the configuration of an independent run that measured
//! this proxy at 0.85× (issue 15). The `http` section's nginx sets ingress-nginx's forwarding
//! headers as ingress does; this one does the least a proxy can, so the ratio says what the
//! proxy's own per-request work costs against nginx's floor.
//!
//! ```text
//!   core 1: wrk (64 connections), the upstream (nginx, 200)
//!   core 0: ingress (--worker-threads 1, access log off) or the bare nginx
//! ```

use std::path::Path;
use std::time::Duration;

use anyhow::Result;

use super::procs::{self, Running};
use super::{Bench, median, write, wrk};

const HOST: &str = "bare.bench.local";
const UPSTREAM: u16 = 19700;
const NGINX: u16 = 19780;
const INGRESS: u16 = 19781;
const INGRESS_HTTPS: u16 = 19747;
const INGRESS_ADMIN: u16 = 19259;
const CONNECTIONS: u32 = 64;

pub fn run(bench: &Bench) -> Result<()> {
    procs::ensure_free(&[UPSTREAM, NGINX, INGRESS, INGRESS_HTTPS, INGRESS_ADMIN])?;
    let dir = bench.scratch("bare")?;
    let _upstream = start_upstream(&dir)?;
    let mut nginx = start_nginx(&dir)?;
    let mut ingress = start_ingress(bench, &dir)?;
    let timeout = Duration::from_secs(20);
    for port in [NGINX, INGRESS] {
        procs::wait_http(&format!("http://127.0.0.1:{port}/"), HOST, timeout)?;
    }
    nginx.ensure_running("nginx")?;
    ingress.ensure_running("ingress")?;
    let url = |port: u16| format!("http://127.0.0.1:{port}/");
    let warm = Duration::from_secs(1);
    wrk::run(&url(NGINX), HOST, warm, CONNECTIONS, None)?;
    wrk::run(&url(INGRESS), HOST, warm, CONNECTIONS, None)?;
    let (mut n, mut i) = (Vec::new(), Vec::new());
    for _ in 0..bench.rounds {
        n.push(wrk::run(
            &url(NGINX),
            HOST,
            bench.duration,
            CONNECTIONS,
            None,
        )?);
        i.push(wrk::run(
            &url(INGRESS),
            HOST,
            bench.duration,
            CONNECTIONS,
            None,
        )?);
    }
    let summary = |runs: &[wrk::Load]| {
        (
            median(runs.iter().map(|l| l.requests_per_sec).collect()),
            median(runs.iter().map(|l| l.p99_ms).collect()),
        )
    };
    let ((nr, n99), (ir, i99)) = (summary(&n), summary(&i));
    writeln!(
        bench.report,
        "\n## HTTP/1.1 keep-alive against a bare nginx ({CONNECTIONS} connections, median of {} rounds)",
        bench.rounds
    );
    writeln!(
        bench.report,
        "{:<10} {:>12} {:>10}",
        "proxy", "requests/s", "p99 ms"
    );
    writeln!(bench.report, "{:<10} {:>12.0} {:>10.3}", "nginx", nr, n99);
    writeln!(bench.report, "{:<10} {:>12.0} {:>10.3}", "ingress", ir, i99);
    writeln!(
        bench.report,
        "ratio ingress/nginx: requests/s {:.2}x (goal: at least 1.2x), p99 {:.2}x (lower is better)",
        ir / nr,
        i99 / n99
    );
    Ok(())
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
    let upstream = Running::start("bare upstream", cmd, &dir.join("upstream.log"))?;
    procs::wait_http(
        &format!("http://127.0.0.1:{UPSTREAM}/"),
        HOST,
        Duration::from_secs(20),
    )?;
    Ok(upstream)
}

fn start_nginx(dir: &Path) -> Result<Running> {
    write(
        &dir.join("nginx.conf"),
        &format!(
            "worker_processes 1; daemon off; pid {d}/nginx.pid; error_log {d}/nginx-error.log;\n\
             events {{ worker_connections 8192; }}\n\
             http {{ access_log off;\n\
             upstream backend {{ server 127.0.0.1:{UPSTREAM}; keepalive 256; }}\n\
             server {{ listen 127.0.0.1:{NGINX} backlog=4096; keepalive_requests 100000000;\n\
             location / {{ proxy_pass http://backend; proxy_http_version 1.1; proxy_set_header Connection \"\"; }} }} }}\n",
            d = dir.display()
        ),
    )?;
    let mut cmd = procs::pinned(0, "nginx");
    cmd.args(["-p", &dir.to_string_lossy(), "-c"])
        .arg(dir.join("nginx.conf"));
    Running::start("nginx", cmd, &dir.join("nginx.log"))
}

fn start_ingress(bench: &Bench, dir: &Path) -> Result<Running> {
    let manifests = dir.join("manifests");
    std::fs::create_dir_all(&manifests)?;
    write(
        &manifests.join("bare.yaml"),
        &format!(
            "apiVersion: v1\nkind: Service\nmetadata: {{name: upstream, namespace: bench}}\nspec: {{ports: [{{name: http, port: 80}}]}}\n---\n\
             apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: upstream-1, namespace: bench, labels: {{kubernetes.io/service-name: upstream}}}}\n\
             addressType: IPv4\nports: [{{name: http, port: {UPSTREAM}}}]\nendpoints: [{{addresses: [\"127.0.0.1\"]}}]\n---\n\
             apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {{name: bare, namespace: bench}}\n\
             spec:\n  ingressClassName: ingress\n  rules:\n  - host: {HOST}\n    http: {{paths: [{{path: /, pathType: Prefix, backend: {{service: {{name: upstream, port: {{number: 80}}}}}}}}]}}\n"
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
            &INGRESS.to_string(),
            "--https-port",
            &INGRESS_HTTPS.to_string(),
            "--admin-port",
            &INGRESS_ADMIN.to_string(),
        ]);
    Running::start("ingress", cmd, &dir.join("ingress.log"))
}
