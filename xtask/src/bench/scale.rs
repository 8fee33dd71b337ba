//! Memory and snapshot build time: idle, and with 10,000 Ingress hosts (plus, as a controller
//! would see in a large cluster, 10,000 Services and 20,000 EndpointSlices).

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use super::procs::{self, Running};
use super::{Bench, write};

const ADMIN: u16 = 19354;

pub fn run(bench: &Bench) -> Result<()> {
    writeln!(bench.report, "\n## Memory and snapshot build time");
    writeln!(
        bench.report,
        "{:<44} {:>10} {:>16} {:>14}",
        "configuration", "RSS MiB", "first build ms", "rebuild ms"
    );
    let idle = bench.scratch("idle")?;
    write(&idle.join("one.yaml"), &config(1, 1, 1))?;
    measure(bench, "idle: 1 Ingress", &idle, false)?;
    let hosts = bench.scratch("hosts")?;
    write(&hosts.join("hosts.yaml"), &config(10_000, 1, 1))?;
    measure(bench, "10,000 Ingress hosts", &hosts, true)?;
    let cluster = bench.scratch("cluster")?;
    write(&cluster.join("cluster.yaml"), &config(10_000, 10_000, 2))?;
    measure(
        bench,
        "10k Ingresses, 10k Services, 20k slices",
        &cluster,
        true,
    )?;
    Ok(())
}

/// `ingresses` Ingresses (one host each) spread over `services` Services, each Service with
/// `slices_per_service` EndpointSlices of two endpoints.
fn config(ingresses: usize, services: usize, slices_per_service: usize) -> String {
    let mut out = String::with_capacity(ingresses * 400 + services * 600);
    for s in 0..services {
        let _ = write!(
            out,
            "---\napiVersion: v1\nkind: Service\nmetadata: {{name: svc-{s}, namespace: bench}}\nspec: {{ports: [{{name: http, port: 80}}]}}\n"
        );
        for k in 0..slices_per_service {
            let _ = write!(
                out,
                "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: svc-{s}-{k}, namespace: bench, labels: {{kubernetes.io/service-name: svc-{s}}}}}\naddressType: IPv4\nports: [{{name: http, port: 8080}}]\nendpoints: [{{addresses: [\"10.{}.{}.{}\"]}}, {{addresses: [\"10.{}.{}.{}\"]}}]\n",
                (s >> 8) & 255,
                s & 255,
                2 * k + 1,
                (s >> 8) & 255,
                s & 255,
                2 * k + 2
            );
        }
    }
    for i in 0..ingresses {
        let _ = write!(
            out,
            "---\napiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {{name: ing-{i}, namespace: bench}}\nspec:\n  ingressClassName: ingress\n  rules:\n  - host: h{i}.bench.local\n    http: {{paths: [{{path: /, pathType: Prefix, backend: {{service: {{name: svc-{}, port: {{number: 80}}}}}}}}]}}\n",
            i % services
        );
    }
    out
}

fn measure(bench: &Bench, label: &str, dir: &std::path::Path, rebuild: bool) -> Result<()> {
    let mut cmd = procs::pinned(0, &bench.ingress.to_string_lossy());
    cmd.arg("--manifests")
        .arg(dir)
        .args([
            "--bind",
            "127.0.0.1",
            "--http-port",
            "19180",
            "--https-port",
            "19543",
            "--admin-port",
            &ADMIN.to_string(),
        ])
        .args(["--worker-threads", "1", "--log-level", "warn"]);
    let ingress = Running::start("ingress", cmd, &dir.join("ingress.log"))?;
    let metrics_url = format!("http://127.0.0.1:{ADMIN}/metrics");
    let deadline = Instant::now() + Duration::from_secs(120);
    while procs::metric(
        &procs::fetch(&metrics_url).unwrap_or_default(),
        "ingress_snapshot_generation",
    )
    .unwrap_or(0.0)
        < 1.0
    {
        anyhow::ensure!(Instant::now() < deadline, "no snapshot within 120s");
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_secs(1));
    let metrics = procs::fetch(&metrics_url)?;
    let first = procs::metric(&metrics, "ingress_snapshot_build_seconds_sum")
        .context("build time metric")?;
    let rss = ingress.rss_kib()? as f64 / 1024.0;
    let rebuild_ms = if rebuild {
        // Touch the directory: the source re-reads it and the pipeline builds again.
        let marker = dir.join("zz-touch.yaml");
        write(&marker, "# touched by the benchmark\n")?;
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let m = procs::fetch(&metrics_url).unwrap_or_default();
            if procs::metric(&m, "ingress_snapshot_generation").unwrap_or(0.0) >= 2.0 {
                let total =
                    procs::metric(&m, "ingress_snapshot_build_seconds_sum").unwrap_or(first);
                break format!("{:.1}", (total - first) * 1000.0);
            }
            anyhow::ensure!(Instant::now() < deadline, "no rebuild within 120s");
            std::thread::sleep(Duration::from_millis(50));
        }
    } else {
        "-".to_string()
    };
    writeln!(
        bench.report,
        "{:<44} {:>10.1} {:>16.1} {:>14}",
        label,
        rss,
        first * 1000.0,
        rebuild_ms
    );
    drop(ingress);
    Ok(())
}
