//! A known name from a refused source: what refusing a client outside a host's
//! `whitelist-source-range` costs the proxy, by where it is refused, in one run (issue 17).
//!
//! ```text
//!   bench.local: whitelist-source-range 127.0.0.1/32 (one Ingress, path /)
//!   flood from 198.18.0.2 (an address added to the namespace's loopback; 198.18.0.0/15 is the
//!   range RFC 2544 sets aside for benchmarks), SNI bench.local, against in turn:
//!
//!   ebpf         :19744  the kernel's SOURCES lookup: a TCP reset before accept (or, for a
//!                        split hello, the verdict and a linger-0 close with nothing read)
//!   userspace    :19745  the userspace gate: accept, read the ClientHello, reset
//!   ingress-403  :19746  the same binary where the gate cannot judge the host (a second Ingress
//!                        adds bench.local/open without the range, so its routes disagree): a
//!                        full handshake, then the access phase's 403
//!   nginx-403    :19747  nginx with `allow 127.0.0.1/32; deny all;`, what ingress-nginx
//!                        renders for the annotation: a full handshake (OpenSSL), then 403
//!
//!   allowed: wrk from 127.0.0.1 to https://bench.local/ on the same port, alone and beside the flood
//! ```
//!
//! The 403 path measured against is `ingress-403`: the same binary, TLS stack, certificate and
//! worker thread as the two gates, so ebpf/ingress-403 is the refusal point and nothing else.
//! `nginx-403` is what an operator migrating from ingress-nginx runs today; its ratio mixes in
//! OpenSSL against rustls, so it is printed beside, not instead. For the two 403 targets the
//! flood (`sni-flood --request`) completes the handshake and sends `GET /` (`Connection:
//! close`), reads the status line, and resets; a flood that stopped after its hello would cost
//! them less than a real client does, and a flood client gains nothing by sending less once the
//! server answers.
//!
//! Refused is what the flood client saw: a reset from the gates, a 403 from the others (the
//! proxies' counters are printed beside as a check). Proxy CPU is user + system of the process
//! and its children (nginx's worker) from the kernel's per-process CPU clock, over the flood
//! alone. As in the unknown-name part, on loopback the kernel's receive path, where an eBPF gate
//! runs, is charged to the flood client, so the two together are printed too; with `--request`
//! that column also holds the client's own handshakes. Numbers are printed, never judged.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, ensure};

use super::{
    EBPF, FloodReport, Mode, Plan, Site, USERSPACE, certificate, family_sum, indented, sample,
};
use crate::bench::report::Report;
use crate::bench::{median, rig, tls, write, wrk};

/// The refused client's address, added to the namespace's loopback.
pub(super) const REFUSED_SOURCE: &str = "198.18.0.2";
/// The source-restricted host. wrk takes its server name from the URL, so the name must resolve
/// to loopback: the rig's host, which `/etc/hosts` gets if it lacks it.
const RESTRICTED_HOST: &str = rig::HOST;
const ALLOWED_RANGE: &str = "127.0.0.1/32";
const RESTRICTED_PATH_OPEN: &str = "/open";

/// Ingress in userspace mode on manifests where the restricted host's routes disagree.
pub(super) const FORBIDDEN: Mode = Mode {
    name: "ingress-403",
    http: 19083,
    https: 19746,
    admin: 19256,
};
/// nginx with `allow`/`deny`; it has no admin port and no plain HTTP listener.
pub(super) const NGINX: Mode = Mode {
    name: "nginx-403",
    http: 0,
    https: 19747,
    admin: 0,
};
const TARGETS: [Mode; 4] = [EBPF, USERSPACE, FORBIDDEN, NGINX];

/// What the site needs beyond the unknown-name part's files.
pub(super) struct Files {
    /// The 403 path's manifests directory.
    pub(super) forbidden_manifests: PathBuf,
    pub(super) nginx_conf: PathBuf,
}

/// Writes the restricted host into `manifests` (the gates' directory), a copy of it with the
/// disagreeing route for the 403 path, and nginx's configuration.
pub(super) fn site_files(dir: &Path, manifests: &Path) -> Result<Files> {
    tls::resolve_to_loopback(RESTRICTED_HOST)?;
    let (cert, key) = certificate(dir, RESTRICTED_HOST, "restricted-")?;
    let restricted = format!(
        "apiVersion: v1\nkind: Secret\nmetadata: {{name: restricted-tls, namespace: bench}}\ntype: kubernetes.io/tls\nstringData:\n  tls.crt: |\n{crt}  tls.key: |\n{key}---\n\
         apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {{name: restricted, namespace: bench, annotations: {{nginx.ingress.kubernetes.io/ssl-redirect: \"false\", nginx.ingress.kubernetes.io/whitelist-source-range: \"{ALLOWED_RANGE}\"}}}}\n\
         spec:\n  ingressClassName: ingress\n  tls: [{{hosts: [{RESTRICTED_HOST}], secretName: restricted-tls}}]\n  rules:\n  - host: {RESTRICTED_HOST}\n    http: {{paths: [{{path: /, pathType: Prefix, backend: {{service: {{name: upstream, port: {{number: 80}}}}}}}}]}}\n",
        crt = indented(&cert)?,
        key = indented(&key)?
    );
    write(&manifests.join("restricted.yaml"), &restricted)?;

    let forbidden_manifests = dir.join("manifests-403");
    std::fs::create_dir_all(&forbidden_manifests)?;
    std::fs::copy(
        manifests.join("gate.yaml"),
        forbidden_manifests.join("gate.yaml"),
    )
    .context("copying gate.yaml")?;
    write(&forbidden_manifests.join("restricted.yaml"), &restricted)?;
    // One route of the host without the range: the gate can no longer judge the host's clients
    // by source (`snapshot::gate_sources`), so they reach the access phase of `/`.
    write(
        &forbidden_manifests.join("open.yaml"),
        &format!(
            "apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {{name: restricted-open, namespace: bench, annotations: {{nginx.ingress.kubernetes.io/ssl-redirect: \"false\"}}}}\n\
             spec:\n  ingressClassName: ingress\n  rules:\n  - host: {RESTRICTED_HOST}\n    http: {{paths: [{{path: {RESTRICTED_PATH_OPEN}, pathType: Prefix, backend: {{service: {{name: upstream, port: {{number: 80}}}}}}}}]}}\n"
        ),
    )?;

    let nginx_conf = dir.join("nginx-403.conf");
    write(
        &nginx_conf,
        &format!(
            "worker_processes 1; daemon off; pid {d}/nginx-403.pid; error_log {d}/nginx-403-error.log;\n\
             events {{ worker_connections 8192; }}\n\
             http {{ access_log off;\n\
             upstream backend {{ server 127.0.0.1:{upstream}; keepalive 128; }}\n\
             server {{ listen 127.0.0.1:{port} ssl backlog=4096; server_name {RESTRICTED_HOST};\n\
             ssl_certificate {cert}; ssl_certificate_key {key}; ssl_protocols TLSv1.3; ssl_session_tickets off;\n\
             keepalive_requests 100000000;\n\
             location / {{ allow {ALLOWED_RANGE}; deny all;\n\
             proxy_pass http://backend; proxy_http_version 1.1; proxy_set_header Connection \"\"; proxy_set_header Host $host; }} }} }}\n",
            d = dir.display(),
            upstream = super::UPSTREAM_PORT,
            port = NGINX.https,
            cert = cert.display(),
            key = key.display()
        ),
    )?;
    Ok(Files {
        forbidden_manifests,
        nginx_conf,
    })
}

/// Every target serves the allowed client, and each refuses the refused source the way this
/// part says it does: otherwise the comparison would measure something else.
pub(super) fn wait_ready(site: &Site, dir: &Path) -> Result<()> {
    for mode in TARGETS {
        site.wait_serving(mode, RESTRICTED_HOST)
            .with_context(|| format!("{} (logs in {})", mode.name, dir.display()))?;
        let out = site
            .ns
            .command(None, "curl")
            .args([
                "-sk",
                "--max-time",
                "5",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code}",
            ])
            .args(["--interface", REFUSED_SOURCE])
            .arg(format!("https://{RESTRICTED_HOST}:{}/", mode.https))
            .output()?;
        let code = String::from_utf8_lossy(&out.stdout).into_owned();
        let refused_by_gate = mode.name == EBPF.name || mode.name == USERSPACE.name;
        if refused_by_gate {
            // curl prints 000 when the connection was reset before any response.
            ensure!(
                code == "000",
                "{}: the refused source got HTTP {code}, not a reset",
                mode.name
            );
        } else {
            ensure!(
                code == "403",
                "{}: the refused source got {code}, not 403",
                mode.name
            );
        }
    }
    Ok(())
}

/// One round of one target.
pub(super) struct SourceRound {
    /// Allowed traffic alone.
    quiet: wrk::Load,
    flood: FloodReport,
    proxy_cpu: Duration,
    counters: Counters,
    /// Allowed traffic beside the flood.
    loud: wrk::Load,
    loud_flood: FloodReport,
}

/// How much each counter moved over the flood alone (0 where the target has none).
#[derive(Default)]
struct Counters {
    /// `ingress_sni_gate_total{reason="source_refused"}`.
    gate_refused: f64,
    /// `ingress_ebpf_gate_total{counter="reset_before_accept_source_refused"}`.
    before_accept: f64,
    /// `ingress_tls_handshakes_total`, every result.
    handshakes: f64,
    /// `ingress_requests_total` with `status="403"`.
    forbidden: f64,
}

impl Counters {
    fn between(before: &str, after: &str) -> Counters {
        let delta = |series: &str| sample(after, series) - sample(before, series);
        Counters {
            gate_refused: delta("ingress_sni_gate_total{reason=\"source_refused\"}"),
            before_accept: delta(
                "ingress_ebpf_gate_total{counter=\"reset_before_accept_source_refused\"}",
            ),
            handshakes: family_sum(after, "ingress_tls_handshakes_total")
                - family_sum(before, "ingress_tls_handshakes_total"),
            forbidden: status_sum(after, "403") - status_sum(before, "403"),
        }
    }
}

/// Every round of every target, the targets rotating which goes first.
pub(super) fn run(
    site: &Site,
    plan: &Plan,
    rounds: usize,
) -> Result<Vec<(Mode, Vec<SourceRound>)>> {
    for mode in TARGETS {
        site.wrk_host(
            mode,
            RESTRICTED_HOST,
            Duration::from_secs(1),
            plan.connections,
        )?;
    }
    let mut results: Vec<(Mode, Vec<SourceRound>)> =
        TARGETS.iter().map(|&mode| (mode, Vec::new())).collect();
    for round in 0..rounds {
        for step in 0..results.len() {
            let index = (round + step) % results.len();
            if let Some((mode, runs)) = results.get_mut(index) {
                runs.push(one_round(site, *mode, plan)?);
            }
        }
    }
    Ok(results)
}

fn one_round(site: &Site, mode: Mode, plan: &Plan) -> Result<SourceRound> {
    let mut args = vec!["--name", RESTRICTED_HOST, "--bind", REFUSED_SOURCE];
    let answered = mode.name == FORBIDDEN.name || mode.name == NGINX.name;
    if answered {
        args.push("--request");
    }
    let quiet = site.wrk_host(mode, RESTRICTED_HOST, plan.phase, plan.connections)?;

    let proxy = site.proxy(mode);
    let scrape = || -> Result<String> {
        if mode.admin == 0 {
            Ok(String::new())
        } else {
            site.scrape(mode)
        }
    };
    let before = scrape()?;
    let cpu_before = proxy.cpu_time()?;
    let flood = FloodReport::parse(&site.flood_with(mode, plan, &args)?.finish()?)?;
    let proxy_cpu = proxy.cpu_time()?.saturating_sub(cpu_before);
    // Counters land when the proxy has finished with a connection; give the last ones a moment.
    std::thread::sleep(Duration::from_millis(200));
    let counters = Counters::between(&before, &scrape()?);

    let running = site.flood_with(mode, plan, &args)?;
    let loud = site.wrk_host(mode, RESTRICTED_HOST, plan.phase, plan.connections);
    // Collect the flood even when wrk failed, so it never outlives the round.
    let loud_flood = FloodReport::parse(&running.finish()?)?;
    let loud = loud?;
    Ok(SourceRound {
        quiet,
        flood,
        proxy_cpu,
        counters,
        loud,
        loud_flood,
    })
}

/// The sum of `ingress_requests_total` over series with this status.
fn status_sum(text: &str, status: &str) -> f64 {
    let label = format!("status=\"{status}\"");
    text.lines()
        .filter(|l| l.starts_with("ingress_requests_total{") && l.contains(&label))
        .filter_map(|l| l.rsplit_once(' ').and_then(|(_, v)| v.parse::<f64>().ok()))
        .sum()
}

impl SourceRound {
    /// What the flood client saw refused: resets from a gate, 403s from the others.
    fn refused(&self) -> f64 {
        self.flood.reset + self.flood.forbidden
    }

    fn proxy_per_1k(&self) -> f64 {
        self.proxy_cpu.as_secs_f64() * 1e6 / self.refused().max(1.0)
    }

    fn machine_per_1k(&self) -> f64 {
        (self.proxy_cpu.as_secs_f64() * 1000.0 + self.flood.cpu_ms) * 1000.0
            / self.refused().max(1.0)
    }
}

pub(super) fn report(
    out: &Report,
    plan: &Plan,
    rounds: usize,
    results: &[(Mode, Vec<SourceRound>)],
) {
    writeln!(
        out,
        "\n## A known name from a refused source: the gates vs the 403 path (median of {rounds} rounds)"
    );
    writeln!(
        out,
        "flood: {} new connections/s for {}s from {REFUSED_SOURCE}, SNI {RESTRICTED_HOST}, whose Ingress has whitelist-source-range {ALLOWED_RANGE}",
        super::FLOOD_RATE,
        plan.phase.as_secs()
    );
    writeln!(
        out,
        "ebpf, userspace: that host in each mode; ingress-403: the same binary (userspace mode) with a second Ingress adding {RESTRICTED_HOST}{RESTRICTED_PATH_OPEN} without the range, so no gate judges the host and / answers 403 after a full handshake; nginx-403: nginx `allow {ALLOWED_RANGE}; deny all;` (ingress-nginx's rendering), 403 after a full handshake"
    );
    writeln!(
        out,
        "the 403 targets' flood completes the handshake and sends GET / before its reset; allowed: wrk from 127.0.0.1, {} keep-alive connections to https://{RESTRICTED_HOST}/",
        plan.connections
    );

    writeln!(out, "\n### Refusing the flood (flood alone)");
    writeln!(
        out,
        "{:<12} {:>9} {:>8} {:>12} {:>13} {:>14} {:>12} {:>8} {:>15} {:>14} {:>16} {:>13}",
        "target",
        "launched",
        "refused",
        "not refused",
        "gate refused",
        "before accept",
        "TLS started",
        "403s",
        "refusal p50 ms",
        "refusal p99 ms",
        "proxy CPU ms/1k",
        "client ms/1k"
    );
    let mut proxy = Vec::new();
    let mut machine = Vec::new();
    for (mode, runs) in results {
        let m = |f: &dyn Fn(&SourceRound) -> f64| median(runs.iter().map(f).collect());
        let answered = mode.name == FORBIDDEN.name || mode.name == NGINX.name;
        let (p50, p99) = if answered {
            (
                m(&|r| r.flood.forbidden_p50_ms),
                m(&|r| r.flood.forbidden_p99_ms),
            )
        } else {
            (m(&|r| r.flood.reset_p50_ms), m(&|r| r.flood.reset_p99_ms))
        };
        let per_1k = m(&SourceRound::proxy_per_1k);
        proxy.push((mode.name, per_1k));
        machine.push((mode.name, m(&SourceRound::machine_per_1k)));
        // nginx has no counters: a dash, not a zero that would read as measured.
        let counter = |f: &dyn Fn(&SourceRound) -> f64| {
            if mode.admin == 0 {
                "-".to_string()
            } else {
                format!("{:.0}", m(f))
            }
        };
        writeln!(
            out,
            "{:<12} {:>9.0} {:>8.0} {:>12.0} {:>13} {:>14} {:>12} {:>8} {:>15.2} {:>14.2} {:>16.1} {:>13.1}",
            mode.name,
            m(&|r| r.flood.launched),
            m(&SourceRound::refused),
            m(&|r| r.flood.not_refused),
            counter(&|r| r.counters.gate_refused),
            counter(&|r| r.counters.before_accept),
            counter(&|r| r.counters.handshakes),
            counter(&|r| r.counters.forbidden),
            p50,
            p99,
            per_1k,
            m(&|r| r.flood.cpu_ms * 1000.0 / r.refused().max(1.0))
        );
    }
    let value = |list: &[(&str, f64)], name: &str| {
        list.iter()
            .find(|(n, _)| *n == name)
            .map_or(f64::NAN, |(_, v)| *v)
    };
    for (what, list) in [
        ("proxy CPU per 1000 refused", &proxy),
        ("proxy + flood client CPU per 1000 refused", &machine),
    ] {
        writeln!(
            out,
            "ratio {what}: ebpf/ingress-403 {:.3}x, userspace/ingress-403 {:.3}x, ebpf/nginx-403 {:.3}x, ingress-403/nginx-403 {:.2}x",
            value(list, EBPF.name) / value(list, FORBIDDEN.name),
            value(list, USERSPACE.name) / value(list, FORBIDDEN.name),
            value(list, EBPF.name) / value(list, NGINX.name),
            value(list, FORBIDDEN.name) / value(list, NGINX.name)
        );
    }
    writeln!(
        out,
        "(refused: as the flood client saw it, a reset (ebpf, userspace) or a 403; gate refused: ingress_sni_gate_total{{reason=\"source_refused\"}};"
    );
    writeln!(
        out,
        " before accept: ingress_ebpf_gate_total{{counter=\"reset_before_accept_source_refused\"}}; TLS started: ingress_tls_handshakes_total; 403s: ingress_requests_total{{status=\"403\"}};"
    );
    writeln!(
        out,
        " refusal latency: to the reset from the hello written, or to the 403's status line from the TCP connect, the handshake and the client's own share of it (on its one thread) included;"
    );
    writeln!(
        out,
        " client: the flood's own CPU, on loopback including the kernel receive path where the eBPF gate runs, and for the 403 targets its own handshakes{})",
        if plan.quick {
            "; --quick uses a debug-built flood client, so this column is inflated"
        } else {
            ""
        }
    );

    writeln!(
        out,
        "\n### Allowed traffic (127.0.0.1, keep-alive HTTPS to {RESTRICTED_HOST}) while the refused source floods"
    );
    writeln!(
        out,
        "{:<12} {:>14} {:>10} {:>16} {:>10} {:>10} {:>14}",
        "target", "rps no flood", "p99 ms", "rps with flood", "p99 ms", "kept", "flood refused"
    );
    for (mode, runs) in results {
        let m = |f: &dyn Fn(&SourceRound) -> f64| median(runs.iter().map(f).collect());
        writeln!(
            out,
            "{:<12} {:>14.0} {:>10.3} {:>16.0} {:>10.3} {:>9.2}x {:>14.0}",
            mode.name,
            m(&|r| r.quiet.requests_per_sec),
            m(&|r| r.quiet.p99_ms),
            m(&|r| r.loud.requests_per_sec),
            m(&|r| r.loud.p99_ms),
            m(&|r| r.loud.requests_per_sec / r.quiet.requests_per_sec),
            m(&|r| r.loud_flood.reset + r.loud_flood.forbidden)
        );
    }
    writeln!(
        out,
        "(kept: requests/s with the flood / without, per round; wrk shares CPU 1 with the flood client, whose handshakes against the 403 targets take that CPU from wrk too)"
    );
    for (mode, runs) in results {
        let list = |f: &dyn Fn(&SourceRound) -> f64| runs.iter().map(f).collect::<Vec<_>>();
        writeln!(
            out,
            "rounds {}: proxy CPU ms/1k refused {:.1?}, kept {:.2?}",
            mode.name,
            list(&SourceRound::proxy_per_1k),
            list(&|r| r.loud.requests_per_sec / r.quiet.requests_per_sec)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_requests_by_status() {
        let text = "# TYPE ingress_requests_total counter\n\
            ingress_requests_total{namespace=\"bench\",ingress=\"restricted\",service=\"upstream\",status=\"403\"} 1500\n\
            ingress_requests_total{namespace=\"\",ingress=\"\",service=\"\",status=\"403\"} 2\n\
            ingress_requests_total{namespace=\"bench\",ingress=\"restricted\",service=\"upstream\",status=\"200\"} 7\n\
            ingress_requests_total_other{status=\"403\"} 9\n";
        for (status, want) in [("403", 1502.0), ("200", 7.0), ("404", 0.0)] {
            assert_eq!(status_sum(text, status), want, "status {status}");
        }
    }

    #[test]
    fn reads_what_the_flood_client_saw() {
        let gate = r#"{"launched":2000,"reset":1990,"closed":0,"answered":0,"forbidden":0,"other_status":0,"silent":4,"connect_failed":0,"error":0,"unfinished":6,"cpu_ms":50.0,"reset_p50_ms":0.1,"reset_p99_ms":0.4,"forbidden_p50_ms":null,"forbidden_p99_ms":null,"hello_bytes":1500}"#;
        let answered = r#"{"launched":2000,"reset":0,"closed":1,"answered":0,"forbidden":1995,"other_status":3,"silent":0,"connect_failed":0,"error":1,"unfinished":0,"cpu_ms":900.0,"reset_p50_ms":null,"reset_p99_ms":null,"forbidden_p50_ms":1.5,"forbidden_p99_ms":4.0,"hello_bytes":1500}"#;
        for (text, refused, not_refused, not_reset) in
            [(gate, 1990.0, 10.0, 10.0), (answered, 1995.0, 5.0, 2000.0)]
        {
            let report = FloodReport::parse(text).unwrap_or_else(|e| panic!("{e:#}: {text}"));
            assert_eq!(report.reset + report.forbidden, refused, "{text}");
            assert_eq!(report.not_refused, not_refused, "{text}");
            assert_eq!(report.not_reset, not_reset, "{text}");
        }
    }
}
