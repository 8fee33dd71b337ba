//! What a realistic route policy costs, in each proxy: the same HTTP/1.1 keep-alive load on a
//! plain route and on one with ingress-nginx's regex path, `rewrite-target`, CORS and cookie
//! affinity, through ingress and through nginx configured the way ingress-nginx's template
//! configures it, side by side.
//!
//! ```text
//!   core 1: wrk (Origin: http://app.bench.local), the upstream (nginx, two ports, 200)
//!   core 0: ingress or nginx, one worker
//!   plain.bench.local  /                 → upstream
//!   policy.bench.local /api(/|$)(.*)     use-regex, rewrite-target /$2, enable-cors (an
//!                                        allow-listed origin), affinity: cookie → upstream
//! ```
//!
//! wrk sends no cookie back, so every request is a new session: each response carries a new
//! `Set-Cookie`, the affinity's most expensive case. nginx has no cookie affinity of its own
//! (ingress-nginx's is Lua); it stands in with `hash $cookie_INGRESSCOOKIE consistent` and a
//! `Set-Cookie` added when the request had none. Goal: the policy costs ingress at most 10%
//! of the plain route's requests/s.

use std::path::Path;
use std::time::Duration;

use anyhow::{Result, ensure};

use super::procs::{self, Running};
use super::{Bench, median, quartiles, write, wrk};

const UPSTREAM_A: u16 = 19300;
const UPSTREAM_B: u16 = 19301;
const NGINX: u16 = 19380;
const INGRESS: u16 = 19381;
const INGRESS_HTTPS: u16 = 19446;
const INGRESS_ADMIN: u16 = 19256;
const PLAIN: &str = "plain.bench.local";
const POLICY: &str = "policy.bench.local";
const ORIGIN: &str = "Origin: http://app.bench.local";

pub fn run(bench: &Bench) -> Result<()> {
    procs::ensure_free(&[
        UPSTREAM_A,
        UPSTREAM_B,
        NGINX,
        INGRESS,
        INGRESS_HTTPS,
        INGRESS_ADMIN,
    ])?;
    let dir = bench.scratch("policy")?;
    let _upstream = start_upstream(&dir)?;
    let mut nginx = start_nginx(&dir)?;
    let mut ingress = start_ingress(bench, &dir)?;
    let timeout = Duration::from_secs(20);
    for port in [NGINX, INGRESS] {
        procs::wait_http(&format!("http://127.0.0.1:{port}/"), PLAIN, timeout)?;
        procs::wait_http(
            &format!("http://127.0.0.1:{port}/api/items"),
            POLICY,
            timeout,
        )?;
    }
    nginx.ensure_running("nginx")?;
    ingress.ensure_running("ingress")?;

    let targets = [
        ("nginx", NGINX, PLAIN, "/"),
        ("nginx", NGINX, POLICY, "/api/items"),
        ("ingress", INGRESS, PLAIN, "/"),
        ("ingress", INGRESS, POLICY, "/api/items"),
    ];
    let mut runs: Vec<Vec<wrk::Load>> = vec![Vec::new(); targets.len()];
    // The proxy's CPU time in each measured slice: wrk and the upstream share CPU 1, and when
    // it is full, requests/s also moves with what wrk spends reading the policy route's longer
    // answers (its CORS headers and Set-Cookie); per proxy CPU-second it does not.
    let mut cpu: Vec<Duration> = vec![Duration::ZERO; targets.len()];
    // CPU 1's busy and total ticks in each target's slices: whether the load's core was full.
    let mut load_core = vec![(0u64, 0u64); targets.len()];
    let warm = Duration::from_secs(1);
    for (_, port, host, path) in targets {
        let url = format!("http://127.0.0.1:{port}{path}");
        wrk::run(&url, host, warm, bench.connections, Some(ORIGIN))?;
    }
    let (slices, slice) = bench.goal_slices();
    for round in 0..slices {
        for i in Bench::slice_order(round, targets.len()) {
            let (name, port, host, path) = targets[i];
            let url = format!("http://127.0.0.1:{port}{path}");
            // Unmeasured: the caches become this target's (see `goal_slices`).
            wrk::run(&url, host, warm, bench.connections, Some(ORIGIN))?;
            let proxy = if name == "nginx" { &nginx } else { &ingress };
            let before = proxy.cpu_time()?;
            let core_before = core_ticks(1);
            let load = wrk::run(&url, host, slice, bench.connections, Some(ORIGIN))?;
            cpu[i] += proxy.cpu_time()?.saturating_sub(before);
            if let (Some((b0, t0)), Some((b1, t1))) = (core_before, core_ticks(1)) {
                load_core[i].0 += b1.saturating_sub(b0);
                load_core[i].1 += t1.saturating_sub(t0);
            }
            ensure!(
                load.all_answered(),
                "{name} {host}{path}: {} of {} answers were not 2xx ({} socket errors, {} of them timeouts)",
                load.non_2xx,
                load.requests,
                load.socket_errors,
                load.timeouts
            );
            runs[i].push(load);
        }
    }
    // Requests over the time they took, all slices together.
    let rate = |i: usize| {
        let requests: u64 = runs[i].iter().map(|l| l.requests).sum();
        let seconds: f64 = runs[i]
            .iter()
            .map(|l| l.requests as f64 / l.requests_per_sec.max(1.0))
            .sum();
        requests as f64 / seconds.max(f64::EPSILON)
    };
    let p99 = |i: usize| median(runs[i].iter().map(|l| l.p99_ms).collect());
    // Requests per second of the proxy's own CPU, all slices together.
    let per_cpu = |i: usize| {
        let requests: u64 = runs[i].iter().map(|l| l.requests).sum();
        requests as f64 / cpu[i].as_secs_f64().max(f64::EPSILON)
    };
    writeln!(
        bench.report,
        "\n## Route policy: regex + rewrite-target + CORS + cookie affinity vs a plain route ({} connections, {} alternating slices of {:?})",
        bench.connections, slices, slice
    );
    writeln!(
        bench.report,
        "{:<10} {:<8} {:>12} {:>10} {:>22}",
        "proxy", "route", "requests/s", "p99 ms", "requests per CPU-s"
    );
    for (i, (name, _, host, _)) in targets.into_iter().enumerate() {
        let route = if host == PLAIN { "plain" } else { "policy" };
        writeln!(
            bench.report,
            "{:<10} {:<8} {:>12.0} {:>10.3} {:>22.0}",
            name,
            route,
            rate(i),
            p99(i),
            per_cpu(i)
        );
    }
    // Each proxy's policy route against its plain route: the rates over all slices (wrk's own
    // time, not the nominal slice: a `-d1s` run lasts 1.0 s or 1.1 s, as wrk checks its
    // deadline on a 100 ms timer), and the spread of the slice pairs' own ratios.
    let ratio = |policy: usize, plain: usize| rate(policy) / rate(plain).max(1.0);
    let spread = |policy: usize, plain: usize| {
        let [q1, q2, q3] = quartiles(
            runs[policy]
                .iter()
                .zip(&runs[plain])
                .map(|(p, q)| p.requests_per_sec / q.requests_per_sec.max(1.0))
                .collect(),
        );
        format!("median {q2:.2}, middle half {q1:.2}-{q3:.2}")
    };
    writeln!(
        bench.report,
        "policy/plain requests/s: nginx {:.2}x, ingress {:.2}x (goal for ingress: at least 0.90x)",
        ratio(1, 0),
        ratio(3, 2)
    );
    writeln!(
        bench.report,
        "policy/plain requests per proxy CPU-second: nginx {:.2}x, ingress {:.2}x (the policy's cost to the proxy alone)",
        per_cpu(1) / per_cpu(0).max(f64::EPSILON),
        per_cpu(3) / per_cpu(2).max(f64::EPSILON)
    );
    let busy = |i: usize| 100.0 * load_core[i].0 as f64 / load_core[i].1.max(1) as f64;
    writeln!(
        bench.report,
        "CPU 1 (wrk and the upstream) busy during the slices: nginx plain {:.0}%, policy {:.0}%; ingress plain {:.0}%, policy {:.0}%",
        busy(0),
        busy(1),
        busy(2),
        busy(3)
    );
    writeln!(
        bench.report,
        "policy/plain slice by slice: nginx {}; ingress {}",
        spread(1, 0),
        spread(3, 2)
    );
    writeln!(
        bench.report,
        "ratio ingress/nginx on the policy route: requests/s {:.2}x, p99 {:.2}x (lower is better)",
        rate(3) / rate(1),
        p99(3) / p99(1)
    );
    Ok(())
}

/// CPU `n`'s busy and total ticks since boot, from /proc/stat (busy: all but idle and iowait).
fn core_ticks(n: usize) -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let name = format!("cpu{n}");
    let line = stat
        .lines()
        .find(|l| l.split_whitespace().next() == Some(name.as_str()))?;
    let ticks: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|t| t.parse().ok())
        .collect();
    let total: u64 = ticks.iter().sum();
    let idle = ticks.get(3).copied().unwrap_or(0) + ticks.get(4).copied().unwrap_or(0);
    Some((total.saturating_sub(idle), total))
}

/// The upstream: one nginx worker on CPU 1, on two ports (two endpoints to be sticky to).
fn start_upstream(dir: &Path) -> Result<Running> {
    write(
        &dir.join("upstream.conf"),
        &format!(
            "worker_processes 1; daemon off; pid {d}/upstream.pid; error_log {d}/upstream-error.log;\n\
             events {{ worker_connections 8192; }}\n\
             http {{ access_log off;\n\
             server {{ listen 127.0.0.1:{UPSTREAM_A} backlog=4096; listen 127.0.0.1:{UPSTREAM_B} backlog=4096;\n\
             keepalive_requests 100000000; location / {{ return 200 \"hello from the upstream\\n\"; }} }} }}\n",
            d = dir.display()
        ),
    )?;
    let mut cmd = procs::pinned(1, "nginx");
    cmd.args(["-p", &dir.to_string_lossy(), "-c"])
        .arg(dir.join("upstream.conf"));
    let upstream = Running::start("policy upstream", cmd, &dir.join("upstream.log"))?;
    procs::wait_http(
        &format!("http://127.0.0.1:{UPSTREAM_A}/"),
        PLAIN,
        Duration::from_secs(20),
    )?;
    Ok(upstream)
}

/// nginx as ingress-nginx's template writes these: a case-insensitive regex location, the
/// rewrite, the CORS headers for an allowed origin, and the forwarding headers.
fn start_nginx(dir: &Path) -> Result<Running> {
    let forward = "proxy_http_version 1.1; proxy_set_header Connection \"\"; \
                   proxy_set_header Host $host; proxy_set_header X-Forwarded-For $remote_addr; \
                   proxy_set_header X-Real-IP $remote_addr; proxy_set_header X-Forwarded-Proto $scheme; \
                   proxy_set_header X-Forwarded-Host $host; proxy_set_header X-Request-ID $request_id;";
    // The CORS values are empty for an origin that is not allowed, and nginx adds no header
    // whose value is empty: the template's `if ($cors = true)`, without `if`.
    let cors_headers = "add_header Access-Control-Allow-Origin $cors_origin always; \
                        add_header Access-Control-Allow-Credentials $cors_credentials always; \
                        add_header Access-Control-Allow-Methods $cors_methods always; \
                        add_header Access-Control-Allow-Headers $cors_headers always; \
                        add_header Access-Control-Max-Age $cors_max_age always;";
    write(
        &dir.join("nginx.conf"),
        &format!(
            "worker_processes 1; daemon off; pid {d}/nginx.pid; error_log {d}/nginx-error.log;\n\
             events {{ worker_connections 8192; }}\n\
             http {{ access_log off;\n\
             map $http_origin $cors_origin {{ ~*^http://app\\.bench\\.local$ $http_origin; default \"\"; }}\n\
             map $cors_origin $cors_credentials {{ \"\" \"\"; default true; }}\n\
             map $cors_origin $cors_methods {{ \"\" \"\"; default \"GET, PUT, POST, DELETE, PATCH, OPTIONS\"; }}\n\
             map $cors_origin $cors_headers {{ \"\" \"\"; default \"DNT,Keep-Alive,User-Agent,X-Requested-With,If-Modified-Since,Cache-Control,Content-Type,Range,Authorization\"; }}\n\
             map $cors_origin $cors_max_age {{ \"\" \"\"; default 1728000; }}\n\
             map $cookie_INGRESSCOOKIE $new_session {{ \"\" \"INGRESSCOOKIE=$request_id; Path=/api; HttpOnly\"; default \"\"; }}\n\
             upstream plain {{ server 127.0.0.1:{UPSTREAM_A}; server 127.0.0.1:{UPSTREAM_B}; keepalive 128; }}\n\
             upstream sticky {{ hash $cookie_INGRESSCOOKIE consistent; server 127.0.0.1:{UPSTREAM_A}; server 127.0.0.1:{UPSTREAM_B}; keepalive 128; }}\n\
             server {{ listen 127.0.0.1:{NGINX} backlog=4096; server_name {PLAIN}; keepalive_requests 100000000;\n\
             location / {{ proxy_pass http://plain; {forward} }} }}\n\
             server {{ listen 127.0.0.1:{NGINX}; server_name {POLICY}; keepalive_requests 100000000;\n\
             location ~* \"^/api(/|$)(.*)\" {{ {cors_headers} add_header Set-Cookie $new_session;\n\
             rewrite \"(?i)/api(/|$)(.*)\" /$2 break; proxy_pass http://sticky; {forward} }} }} }}\n",
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
    let slice = |name: &str, port: u16| {
        format!(
            "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: {name}, namespace: bench, labels: {{kubernetes.io/service-name: upstream}}}}\n\
             addressType: IPv4\nports: [{{name: http, port: {port}}}]\nendpoints: [{{addresses: [\"127.0.0.1\"]}}]\n"
        )
    };
    write(
        &manifests.join("policy.yaml"),
        &format!(
            "apiVersion: v1\nkind: Service\nmetadata: {{name: upstream, namespace: bench}}\nspec: {{ports: [{{name: http, port: 80}}]}}\n\
             {a}{b}---\n\
             apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {{name: plain, namespace: bench}}\n\
             spec:\n  ingressClassName: ingress\n  rules:\n  - host: {PLAIN}\n    http: {{paths: [{{path: /, pathType: Prefix, backend: {{service: {{name: upstream, port: {{number: 80}}}}}}}}]}}\n---\n\
             apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata:\n  name: policy\n  namespace: bench\n  annotations:\n\
             \x20   nginx.ingress.kubernetes.io/use-regex: \"true\"\n\
             \x20   nginx.ingress.kubernetes.io/rewrite-target: /$2\n\
             \x20   nginx.ingress.kubernetes.io/enable-cors: \"true\"\n\
             \x20   nginx.ingress.kubernetes.io/cors-allow-origin: \"http://app.bench.local\"\n\
             \x20   nginx.ingress.kubernetes.io/affinity: cookie\n\
             \x20   nginx.ingress.kubernetes.io/session-cookie-path: /api\n\
             spec:\n  ingressClassName: ingress\n  rules:\n  - host: {POLICY}\n    http: {{paths: [{{path: \"/api(/|$)(.*)\", pathType: ImplementationSpecific, backend: {{service: {{name: upstream, port: {{number: 80}}}}}}}}]}}\n",
            a = slice("upstream-a", UPSTREAM_A),
            b = slice("upstream-b", UPSTREAM_B),
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
