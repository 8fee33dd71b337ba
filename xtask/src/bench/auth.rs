//! Access control through each proxy, side by side: basic auth (apr1, and bcrypt at cost 5),
//! external auth (an auth service answering 200), uncached and cached, and a source allow-list,
//! ingress against nginx doing the same (`auth_basic`, `auth_request`, `proxy_cache`,
//! `allow`/`deny`).
//!
//! ```text
//!   core 1: wrk, the upstream (nginx, 200) and the auth service (nginx, 200 + X-Auth-Request-User)
//!   core 0: ingress or nginx, one worker; both keep connections to the upstream and the auth
//!           service alive (auth-keepalive / keepalive)
//!   paths:  /apr1 /bcrypt   basic auth, the same htpasswd
//!           /external       auth-url, every request asks
//!           /cached         auth-url with auth-cache-key $http_authorization (nginx: proxy_cache)
//!           /allow          whitelist-source-range of four ranges, the client in the last
//!                           (nginx: allow × 4; deny all), judged per request after the head
//! ```
//!
//! Every request must be answered 2xx: a proxy that refused them would look fast, so a run with
//! any other answer fails the section rather than printing its rate.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, ensure};

use super::procs::{self, Running};
use super::{Bench, median, write, wrk};

const HOST: &str = "auth.bench.local";
const UPSTREAM: u16 = 19100;
const AUTH: u16 = 19101;
const NGINX: u16 = 19180;
const INGRESS: u16 = 19181;
const INGRESS_HTTPS: u16 = 19445;
const INGRESS_ADMIN: u16 = 19255;
/// `alice:password` (apr1) and `bob:U*U` (bcrypt, cost 5: OpenBSD's test vector).
const HTPASSWD: &str = "alice:$apr1$lZL6V/ci$eIMz/iKDkbtys/uU7LEK00\nbob:$2a$05$CCCCCCCCCCCCCCCCCCCCC.E5YPO9kmyuRGyh0XouQYb4YMJKvyOeW\n";
const ALICE: &str = "Authorization: Basic YWxpY2U6cGFzc3dvcmQ=";
/// The allow-list: the client (127.0.0.1) is in the last range, so every range is looked at.
const ALLOW: &str = "10.0.0.0/8,172.16.0.0/12,192.168.0.0/16,127.0.0.1/32";
const BOB: &str = "Authorization: Basic Ym9iOlUqVQ==";

pub fn run(bench: &Bench) -> Result<()> {
    procs::ensure_free(&[UPSTREAM, AUTH, NGINX, INGRESS, INGRESS_HTTPS, INGRESS_ADMIN])?;
    let dir = bench.scratch("auth")?;
    let _peers = start_peers(&dir)?;
    let mut nginx = start_nginx(&dir)?;
    let mut ingress = start_ingress(bench, &dir)?;
    let timeout = Duration::from_secs(20);
    for (path, header) in [
        ("/apr1", ALICE),
        ("/bcrypt", BOB),
        ("/external", ALICE),
        ("/cached", ALICE),
        ("/allow", ALICE),
    ] {
        for port in [NGINX, INGRESS] {
            wait_authorized(port, path, header, timeout)
                .with_context(|| format!("{path} on port {port}"))?;
        }
    }
    nginx.ensure_running("nginx")?;
    ingress.ensure_running("ingress")?;
    writeln!(
        bench.report,
        "\nEvery request authenticated and answered 2xx; both proxies keep connections to the upstream and the auth service alive."
    );
    for (title, path, header) in [
        ("basic auth, apr1 (htpasswd -m)", "/apr1", ALICE),
        (
            "basic auth, bcrypt cost 5 (htpasswd -B -C 5)",
            "/bcrypt",
            BOB,
        ),
        (
            "external auth (auth-url), every request asks",
            "/external",
            ALICE,
        ),
        (
            "external auth, cached (auth-cache-key $http_authorization; nginx proxy_cache)",
            "/cached",
            ALICE,
        ),
        (
            "source allow-list (whitelist-source-range; nginx allow/deny)",
            "/allow",
            ALICE,
        ),
    ] {
        compare(bench, title, path, header)?;
    }
    Ok(())
}

/// Interleaved rounds, medians, the ratio; fails on any answer but 2xx.
fn compare(bench: &Bench, title: &str, path: &str, header: &str) -> Result<()> {
    let url = |port: u16| format!("http://127.0.0.1:{port}{path}");
    let warm = Duration::from_secs(1);
    let (mut n, mut i) = (Vec::new(), Vec::new());
    wrk::run(&url(NGINX), HOST, warm, bench.connections, Some(header))?;
    wrk::run(&url(INGRESS), HOST, warm, bench.connections, Some(header))?;
    for _ in 0..bench.rounds {
        for (port, runs) in [(NGINX, &mut n), (INGRESS, &mut i)] {
            let load = wrk::run(
                &url(port),
                HOST,
                bench.duration,
                bench.connections,
                Some(header),
            )?;
            ensure!(
                load.all_answered(),
                "{title}: port {port} answered {} of {} requests with something other than 2xx ({} socket errors, {} of them timeouts)",
                load.non_2xx,
                load.requests,
                load.socket_errors,
                load.timeouts
            );
            runs.push(load);
        }
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
        "\n## {title} ({} connections, median of {} rounds)",
        bench.connections, bench.rounds
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
        "ratio ingress/nginx: requests/s {:.2}x, p99 {:.2}x (lower is better)",
        ir / nr,
        i99 / n99
    );
    Ok(())
}

/// The upstream and the auth service: one nginx worker on CPU 1.
fn start_peers(dir: &Path) -> Result<Running> {
    write(
        &dir.join("peers.conf"),
        &format!(
            "worker_processes 1; daemon off; pid {d}/peers.pid; error_log {d}/peers-error.log;\n\
             events {{ worker_connections 8192; }}\n\
             http {{ access_log off;\n\
             server {{ listen 127.0.0.1:{UPSTREAM} backlog=4096; keepalive_requests 100000000;\n\
             location / {{ return 200 \"hello from the upstream\\n\"; }} }}\n\
             server {{ listen 127.0.0.1:{AUTH} backlog=4096; keepalive_requests 100000000;\n\
             location / {{ add_header X-Auth-Request-User alice; return 200 \"ok\\n\"; }} }} }}\n",
            d = dir.display()
        ),
    )?;
    let mut cmd = procs::pinned(1, "nginx");
    cmd.args(["-p", &dir.to_string_lossy(), "-c"])
        .arg(dir.join("peers.conf"));
    let peers = Running::start("auth peers", cmd, &dir.join("peers.log"))?;
    procs::wait_http(
        &format!("http://127.0.0.1:{UPSTREAM}/"),
        HOST,
        Duration::from_secs(20),
    )?;
    Ok(peers)
}

/// nginx doing what ingress-nginx's template does for these annotations.
fn start_nginx(dir: &Path) -> Result<Running> {
    write(&dir.join("htpasswd"), HTPASSWD)?;
    let proxy = "proxy_pass http://backend; proxy_http_version 1.1; proxy_set_header Connection \"\"; \
                 proxy_set_header Host $host; proxy_set_header X-Forwarded-For $remote_addr; \
                 proxy_set_header X-Real-IP $remote_addr; proxy_set_header X-Forwarded-Proto $scheme; \
                 proxy_set_header X-Forwarded-Host $host; proxy_set_header X-Request-ID $request_id;";
    let auth_location = "internal; proxy_pass http://authsvc/check; proxy_pass_request_body off; \
                 proxy_set_header Content-Length \"\"; proxy_set_header X-Forwarded-Proto \"\"; \
                 proxy_set_header Host auth.svc; proxy_set_header X-Original-URL $scheme://$http_host$request_uri; \
                 proxy_set_header X-Original-Method $request_method; proxy_set_header X-Sent-From \"nginx-ingress-controller\"; \
                 proxy_set_header X-Real-IP $remote_addr; proxy_set_header X-Forwarded-For $remote_addr; \
                 proxy_set_header X-Auth-Request-Redirect $request_uri; proxy_http_version 1.1; proxy_set_header Connection \"\";";
    write(
        &dir.join("nginx.conf"),
        &format!(
            "worker_processes 1; daemon off; pid {d}/nginx.pid; error_log {d}/nginx-error.log;\n\
             events {{ worker_connections 8192; }}\n\
             http {{ access_log off;\n\
             proxy_cache_path {d}/auth-cache levels=1:2 keys_zone=auth_cache:10m max_size=128m inactive=30m use_temp_path=off;\n\
             upstream backend {{ server 127.0.0.1:{UPSTREAM}; keepalive 128; }}\n\
             upstream authsvc {{ server 127.0.0.1:{AUTH}; keepalive 128; }}\n\
             server {{ listen 127.0.0.1:{NGINX} backlog=4096; keepalive_requests 100000000;\n\
             location = /_auth {{ {auth_location} }}\n\
             location = /_auth_cached {{ {auth_location} proxy_cache auth_cache; proxy_cache_valid 200 202 401 5m; proxy_cache_key $http_authorization; }}\n\
             location /apr1 {{ auth_basic \"bench\"; auth_basic_user_file {d}/htpasswd; proxy_set_header Authorization \"\"; {proxy} }}\n\
             location /bcrypt {{ auth_basic \"bench\"; auth_basic_user_file {d}/htpasswd; proxy_set_header Authorization \"\"; {proxy} }}\n\
             location /external {{ auth_request /_auth; auth_request_set $user $upstream_http_x_auth_request_user; proxy_set_header X-Auth-Request-User $user; {proxy} }}\n\
             location /cached {{ auth_request /_auth_cached; auth_request_set $user $upstream_http_x_auth_request_user; proxy_set_header X-Auth-Request-User $user; {proxy} }}\n\
             location /allow {{ {allow} deny all; {proxy} }} }} }}\n",
            allow = ALLOW
                .split(',')
                .map(|r| format!("allow {r};"))
                .collect::<Vec<_>>()
                .join(" "),
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
    let htpasswd: String = HTPASSWD.lines().map(|l| format!("    {l}\n")).collect();
    let ingress = |name: &str, path: &str, annotations: &str| {
        format!(
            "---\napiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata:\n  name: {name}\n  namespace: bench\n  annotations:\n{annotations}\
             spec:\n  ingressClassName: ingress\n  rules:\n  - host: {HOST}\n    http: {{paths: [{{path: {path}, pathType: Prefix, backend: {{service: {{name: upstream, port: {{number: 80}}}}}}}}]}}\n"
        )
    };
    let basic = "    nginx.ingress.kubernetes.io/auth-type: basic\n    nginx.ingress.kubernetes.io/auth-secret: users\n    nginx.ingress.kubernetes.io/auth-realm: bench\n";
    let external = format!(
        "    nginx.ingress.kubernetes.io/auth-url: \"http://127.0.0.1:{AUTH}/check\"\n    nginx.ingress.kubernetes.io/auth-response-headers: X-Auth-Request-User\n    nginx.ingress.kubernetes.io/auth-keepalive: \"128\"\n"
    );
    let cached = format!(
        "{external}    nginx.ingress.kubernetes.io/auth-cache-key: \"$http_authorization\"\n    nginx.ingress.kubernetes.io/auth-cache-duration: \"200 202 401 5m\"\n"
    );
    write(
        &manifests.join("auth.yaml"),
        &format!(
            "apiVersion: v1\nkind: Service\nmetadata: {{name: upstream, namespace: bench}}\nspec: {{ports: [{{name: http, port: 80}}]}}\n---\n\
             apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: upstream-1, namespace: bench, labels: {{kubernetes.io/service-name: upstream}}}}\n\
             addressType: IPv4\nports: [{{name: http, port: {UPSTREAM}}}]\nendpoints: [{{addresses: [\"127.0.0.1\"]}}]\n---\n\
             apiVersion: v1\nkind: Secret\nmetadata: {{name: users, namespace: bench}}\ntype: Opaque\nstringData:\n  auth: |\n{htpasswd}{}{}{}{}{}",
            ingress("apr1", "/apr1", basic),
            ingress("bcrypt", "/bcrypt", basic),
            ingress("external", "/external", &external),
            ingress("cached", "/cached", &cached),
            ingress(
                "allow",
                "/allow",
                &format!("    nginx.ingress.kubernetes.io/whitelist-source-range: \"{ALLOW}\"\n")
            ),
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

/// Waits until `path` answers 200 with `header` (and 401 without: the auth is on).
fn wait_authorized(port: u16, path: &str, header: &str, timeout: Duration) -> Result<()> {
    let deadline = std::time::Instant::now() + timeout;
    let status = |with: bool| -> Result<String> {
        let mut cmd = std::process::Command::new("curl");
        cmd.args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "-H"])
            .arg(format!("Host: {HOST}"));
        if with {
            cmd.args(["-H", header]);
        }
        let out = cmd.arg(format!("http://127.0.0.1:{port}{path}")).output()?;
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    };
    loop {
        if status(true)? == "200" {
            break;
        }
        ensure!(
            std::time::Instant::now() < deadline,
            "port {port}{path} did not answer 200 with credentials within {timeout:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    if path.starts_with("/apr1") || path.starts_with("/bcrypt") {
        let without = status(false)?;
        ensure!(
            without == "401",
            "port {port}{path} without credentials: {without}"
        );
    }
    Ok(())
}
