//! The shared rig: one upstream, nginx as the peer proxy, ingress as the proxy under test, both
//! serving the same host over HTTP and HTTPS (TLS 1.3, ECDSA P-256, one certificate). nginx sets
//! the forwarding headers ingress-nginx's template sets, so both proxies do the same work.
//!
//! A second host, [`TLS_HOST`], reaches the same upstream over TLS (TLS 1.3, kept alive): nginx
//! with `proxy_pass https://`, `proxy_ssl_session_reuse on` and `proxy_ssl_protocols TLSv1.3`
//! (Debian's nginx 1.22 leaves TLS 1.3 out by default), ingress with
//! `backend-protocol: HTTPS`.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result};

use super::procs::{self, Running};
use super::{Bench, write};

pub const HOST: &str = "bench.local";
pub const UPSTREAM_PORT: u16 = 19000;
/// The upstream's TLS port, and the host both proxies send there.
pub const UPSTREAM_TLS_PORT: u16 = 19001;
pub const TLS_HOST: &str = "tls.bench.local";
/// A third host, the same as [`HOST`] with rate limits that never refuse (limit-rps of a million
/// and limit-connections of 60,000, nginx's limit_conn maximum; limit_req and limit_conn alike):
/// their cost.
pub const LIMITED_HOST: &str = "limited.bench.local";
pub const NGINX_HTTP: u16 = 19080;
pub const NGINX_HTTPS: u16 = 19443;
pub const INGRESS_HTTP: u16 = 19081;
pub const INGRESS_HTTPS: u16 = 19444;
pub const INGRESS_ADMIN: u16 = 19254;

pub struct Rig {
    /// Kept only to be stopped with the rig.
    _upstream: Running,
    pub nginx: Running,
    pub ingress: Running,
}

impl Rig {
    pub fn start(bench: &Bench, extra_args: &[&str]) -> Result<Rig> {
        procs::ensure_free(&[
            UPSTREAM_PORT,
            UPSTREAM_TLS_PORT,
            NGINX_HTTP,
            NGINX_HTTPS,
            INGRESS_HTTP,
            INGRESS_HTTPS,
            INGRESS_ADMIN,
        ])?;
        let dir = bench.scratch("rig")?;
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
                &format!("/CN={HOST}"),
                "-addext",
                &format!("subjectAltName=DNS:{HOST}"),
            ])
            .arg("-keyout")
            .arg(&key)
            .arg("-out")
            .arg(&cert)
            .output()?;
        anyhow::ensure!(status.status.success(), "openssl req failed");

        write(
            &dir.join("upstream.conf"),
            &format!(
                "worker_processes 1; daemon off; pid {d}/upstream.pid; error_log {d}/upstream-error.log;\n\
             events {{ worker_connections 8192; }}\n\
             http {{ access_log off; server {{ listen 127.0.0.1:{UPSTREAM_PORT} backlog=4096; keepalive_requests 100000000;\n\
             location / {{ return 200 \"hello from the upstream\\n\"; }}\n\
             location /upload {{ client_max_body_size 1m; proxy_pass http://127.0.0.1:{UPSTREAM_PORT}/; }} }}\n\
             server {{ listen 127.0.0.1:{UPSTREAM_TLS_PORT} ssl backlog=4096; keepalive_requests 100000000;\n\
             ssl_certificate {cert}; ssl_certificate_key {key}; ssl_protocols TLSv1.3;\n\
             location / {{ return 200 \"hello from the upstream\\n\"; }} }} }}\n",
                d = dir.display(),
                cert = cert.display(),
                key = key.display()
            ),
        )?;
        write(
            &dir.join("proxy.conf"),
            &format!(
                "worker_processes 1; daemon off; pid {d}/proxy.pid; error_log {d}/proxy-error.log;\n\
             events {{ worker_connections 8192; }}\n\
             http {{ access_log off;\n\
             limit_req_zone $binary_remote_addr zone=bench_rps:10m rate=1000000r/s;\n\
             limit_conn_zone $binary_remote_addr zone=bench_conn:10m;\n\
             upstream backend {{ server 127.0.0.1:{UPSTREAM_PORT}; keepalive 128; }}\n\
             server {{ listen 127.0.0.1:{NGINX_HTTP} backlog=4096; listen 127.0.0.1:{NGINX_HTTPS} ssl http2 backlog=4096;\n\
             ssl_certificate {cert}; ssl_certificate_key {key}; ssl_protocols TLSv1.3; ssl_session_tickets off;\n\
             keepalive_requests 100000000;\n\
             location / {{ proxy_pass http://backend; proxy_http_version 1.1; proxy_set_header Connection \"\";\n\
             proxy_set_header Host $host; proxy_set_header X-Forwarded-For $remote_addr;\n\
             proxy_set_header X-Original-Forwarded-For $http_x_forwarded_for; proxy_set_header X-Real-IP $remote_addr;\n\
             proxy_set_header X-Forwarded-Proto $scheme; proxy_set_header X-Forwarded-Scheme $scheme; proxy_set_header X-Scheme $scheme;\n\
             proxy_set_header X-Forwarded-Host $host; proxy_set_header X-Forwarded-Port $server_port;\n\
             proxy_set_header X-Original-URI $request_uri; proxy_set_header X-Request-ID $request_id; }} }}\n\
             server {{ listen 127.0.0.1:{NGINX_HTTP}; server_name {LIMITED_HOST}; keepalive_requests 100000000;\n\
             location / {{ limit_req zone=bench_rps burst=5000000 nodelay; limit_conn bench_conn 60000;\n\
             proxy_pass http://backend; proxy_http_version 1.1; proxy_set_header Connection \"\";\n\
             proxy_set_header Host $host; proxy_set_header X-Forwarded-For $remote_addr;\n\
             proxy_set_header X-Original-Forwarded-For $http_x_forwarded_for; proxy_set_header X-Real-IP $remote_addr;\n\
             proxy_set_header X-Forwarded-Proto $scheme; proxy_set_header X-Forwarded-Scheme $scheme; proxy_set_header X-Scheme $scheme;\n\
             proxy_set_header X-Forwarded-Host $host; proxy_set_header X-Forwarded-Port $server_port;\n\
             proxy_set_header X-Original-URI $request_uri; proxy_set_header X-Request-ID $request_id; }} }}\n\
             upstream backend_tls {{ server 127.0.0.1:{UPSTREAM_TLS_PORT}; keepalive 128; }}\n\
             server {{ listen 127.0.0.1:{NGINX_HTTP}; server_name {TLS_HOST}; keepalive_requests 100000000;\n\
             location / {{ proxy_pass https://backend_tls; proxy_ssl_session_reuse on; proxy_ssl_protocols TLSv1.3; proxy_http_version 1.1; proxy_set_header Connection \"\";\n\
             proxy_set_header Host $host; proxy_set_header X-Forwarded-For $remote_addr;\n\
             proxy_set_header X-Original-Forwarded-For $http_x_forwarded_for; proxy_set_header X-Real-IP $remote_addr;\n\
             proxy_set_header X-Forwarded-Proto $scheme; proxy_set_header X-Forwarded-Scheme $scheme; proxy_set_header X-Scheme $scheme;\n\
             proxy_set_header X-Forwarded-Host $host; proxy_set_header X-Forwarded-Port $server_port;\n\
             proxy_set_header X-Original-URI $request_uri; proxy_set_header X-Request-ID $request_id; }} }} }}\n",
                d = dir.display(),
                cert = cert.display(),
                key = key.display()
            ),
        )?;
        let mut upstream_cmd = procs::pinned(1, "nginx");
        upstream_cmd
            .args(["-p", &dir.to_string_lossy(), "-c"])
            .arg(dir.join("upstream.conf"));
        let mut upstream = Running::start("upstream", upstream_cmd, &dir.join("upstream.log"))?;
        let mut nginx_cmd = procs::pinned(0, "nginx");
        nginx_cmd
            .args(["-p", &dir.to_string_lossy(), "-c"])
            .arg(dir.join("proxy.conf"));
        let mut nginx = Running::start("nginx", nginx_cmd, &dir.join("nginx.log"))?;

        let manifests = dir.join("manifests");
        std::fs::create_dir_all(&manifests)?;
        let indent = |path: &PathBuf| -> Result<String> {
            Ok(std::fs::read_to_string(path)?
                .lines()
                .map(|l| format!("    {l}\n"))
                .collect())
        };
        write(
            &manifests.join("bench.yaml"),
            &format!(
                "apiVersion: v1\nkind: Service\nmetadata: {{name: upstream, namespace: bench}}\nspec: {{ports: [{{name: http, port: 80}}]}}\n---\n\
             apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: upstream-1, namespace: bench, labels: {{kubernetes.io/service-name: upstream}}}}\n\
             addressType: IPv4\nports: [{{name: http, port: {UPSTREAM_PORT}}}]\nendpoints: [{{addresses: [\"127.0.0.1\"]}}]\n---\n\
             apiVersion: v1\nkind: Secret\nmetadata: {{name: bench-tls, namespace: bench}}\ntype: kubernetes.io/tls\nstringData:\n  tls.crt: |\n{crt}  tls.key: |\n{key}---\n\
             apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {{name: bench, namespace: bench, annotations: {{nginx.ingress.kubernetes.io/ssl-redirect: \"false\"}}}}\n\
             spec:\n  ingressClassName: ingress\n  tls: [{{hosts: [{HOST}], secretName: bench-tls}}]\n  rules:\n  - host: {HOST}\n    http: {{paths: [{{path: /, pathType: Prefix, backend: {{service: {{name: upstream, port: {{number: 80}}}}}}}}]}}\n---\n\
             apiVersion: v1\nkind: Service\nmetadata: {{name: upstream-tls, namespace: bench}}\nspec: {{ports: [{{name: https, port: 443}}]}}\n---\n\
             apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: upstream-tls-1, namespace: bench, labels: {{kubernetes.io/service-name: upstream-tls}}}}\n\
             addressType: IPv4\nports: [{{name: https, port: {UPSTREAM_TLS_PORT}}}]\nendpoints: [{{addresses: [\"127.0.0.1\"]}}]\n---\n\
             apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {{name: bench-tls-upstream, namespace: bench, annotations: {{nginx.ingress.kubernetes.io/backend-protocol: HTTPS}}}}\n\
             spec:\n  ingressClassName: ingress\n  rules:\n  - host: {TLS_HOST}\n    http: {{paths: [{{path: /, pathType: Prefix, backend: {{service: {{name: upstream-tls, port: {{number: 443}}}}}}}}]}}\n---\n\
             apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {{name: bench-limited, namespace: bench, annotations: {{nginx.ingress.kubernetes.io/limit-rps: \"1000000\", nginx.ingress.kubernetes.io/limit-connections: \"60000\"}}}}\n\
             spec:\n  ingressClassName: ingress\n  rules:\n  - host: {LIMITED_HOST}\n    http: {{paths: [{{path: /, pathType: Prefix, backend: {{service: {{name: upstream, port: {{number: 80}}}}}}}}]}}\n",
                crt = indent(&cert)?,
                key = indent(&key)?
            ),
        )?;
        let mut ingress = start_ingress(bench, 0, extra_args)?;

        let timeout = Duration::from_secs(20);
        procs::wait_http(&format!("http://127.0.0.1:{UPSTREAM_PORT}/"), HOST, timeout)
            .context("upstream")?;
        procs::wait_http(&format!("http://127.0.0.1:{NGINX_HTTP}/"), HOST, timeout)
            .context("nginx")?;
        procs::wait_http(&format!("http://127.0.0.1:{INGRESS_HTTP}/"), HOST, timeout)
            .context("ingress")?;
        // Answering is not enough: a leftover process on the same port would answer too.
        upstream.ensure_running("the upstream nginx")?;
        nginx.ensure_running("nginx")?;
        ingress.ensure_running("ingress")?;
        Ok(Rig {
            _upstream: upstream,
            nginx,
            ingress,
        })
    }
}

/// The ports of the `k`-th ingress of a rig: the rig's own (0), or another's beside it.
pub fn ingress_ports(k: usize) -> (u16, u16, u16) {
    let step = u16::try_from(k).map_or(u16::MAX, |k| k.saturating_mul(10));
    (
        INGRESS_HTTP.saturating_add(step),
        INGRESS_HTTPS.saturating_add(step),
        INGRESS_ADMIN.saturating_add(step),
    )
}

/// Starts the `k`-th ingress on the rig's manifests (a rig started first wrote them), pinned to
/// CPU 0, its output piped into `ingress.log` (`ingress-k.log` for k > 0).
pub fn start_ingress(bench: &Bench, k: usize, extra_args: &[&str]) -> Result<Running> {
    let dir = bench.dir.join("rig");
    let (http, https, admin) = ingress_ports(k);
    let mut cmd = procs::pinned(0, &bench.ingress.to_string_lossy());
    // Defaults a section may override (clap refuses a flag given twice).
    let defaults = [("--access-log", "false"), ("--log-level", "warn")]
        .into_iter()
        .filter(|(flag, _)| !extra_args.contains(flag))
        .flat_map(|(flag, value)| [flag, value]);
    cmd.arg("--manifests")
        .arg(dir.join("manifests"))
        .args(["--bind", "127.0.0.1", "--worker-threads", "1"])
        .args(defaults)
        .args([
            "--http-port",
            &http.to_string(),
            "--https-port",
            &https.to_string(),
            "--admin-port",
            &admin.to_string(),
        ])
        .args(extra_args);
    Running::start_piped("ingress", cmd, &log_of(bench, k), 1)
}

/// Where the `k`-th ingress of the rig writes its output.
pub fn log_of(bench: &Bench, k: usize) -> PathBuf {
    let name = if k == 0 {
        "ingress.log".to_string()
    } else {
        format!("ingress-{k}.log")
    };
    bench.dir.join("rig").join(name)
}
