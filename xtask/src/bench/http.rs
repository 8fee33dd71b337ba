//! Plain HTTP/1.1 keep-alive through each proxy to the same upstream.

use anyhow::{Context, Result};

use super::rig::{self, Rig};
use super::{Bench, median, procs, wrk};

pub fn run(bench: &Bench) -> Result<()> {
    let rig = Rig::start(bench, &[])?;
    let ngx_url = format!("http://127.0.0.1:{}/", rig::NGINX_HTTP);
    let ing_url = format!("http://127.0.0.1:{}/", rig::INGRESS_HTTP);
    compare("HTTP/1.1 keep-alive", bench, &ngx_url, &ing_url, None)?;
    // The same with rate limits that never refuse (limit-rps and limit-connections): what
    // counting every request costs each proxy.
    compare_on(
        "HTTP/1.1 keep-alive with limit-rps and limit-connections (never reached)",
        bench,
        rig::LIMITED_HOST,
        &ngx_url,
        &ing_url,
        None,
    )?;
    let timeout = std::time::Duration::from_secs(20);
    procs::wait_http(&ngx_url, rig::TLS_HOST, timeout).context("nginx to the TLS upstream")?;
    procs::wait_http(&ing_url, rig::TLS_HOST, timeout).context("ingress to the TLS upstream")?;
    // The same through a TLS upstream connection (kept alive; nginx reuses TLS sessions with
    // proxy_ssl_session_reuse, ingress with its per-policy session cache).
    compare_on(
        "HTTP/1.1 keep-alive to an HTTPS upstream (backend-protocol: HTTPS)",
        bench,
        rig::TLS_HOST,
        &ngx_url,
        &ing_url,
        None,
    )?;
    drop(rig);
    Ok(())
}

/// Interleaves nginx and ingress runs and prints the medians and the ratio.
pub fn compare(
    title: &str,
    bench: &Bench,
    nginx_url: &str,
    ingress_url: &str,
    header: Option<&str>,
) -> Result<()> {
    compare_on(title, bench, rig::HOST, nginx_url, ingress_url, header)
}

/// [`compare`] for requests naming `host`.
pub fn compare_on(
    title: &str,
    bench: &Bench,
    host: &str,
    nginx_url: &str,
    ingress_url: &str,
    header: Option<&str>,
) -> Result<()> {
    let warm = std::time::Duration::from_secs(1);
    wrk::run(nginx_url, host, warm, bench.connections, header)?;
    wrk::run(ingress_url, host, warm, bench.connections, header)?;
    let (mut n, mut i) = (Vec::new(), Vec::new());
    for _ in 0..bench.rounds {
        n.push(wrk::run(
            nginx_url,
            host,
            bench.duration,
            bench.connections,
            header,
        )?);
        i.push(wrk::run(
            ingress_url,
            host,
            bench.duration,
            bench.connections,
            header,
        )?);
    }
    let summary = |runs: &[wrk::Load]| {
        (
            median(runs.iter().map(|l| l.requests_per_sec).collect()),
            median(runs.iter().map(|l| l.p50_ms).collect()),
            median(runs.iter().map(|l| l.p99_ms).collect()),
        )
    };
    let (nr, n50, n99) = summary(&n);
    let (ir, i50, i99) = summary(&i);
    writeln!(
        bench.report,
        "\n## {title} ({} connections, median of {} rounds)",
        bench.connections, bench.rounds
    );
    writeln!(
        bench.report,
        "{:<10} {:>12} {:>10} {:>10}",
        "proxy", "requests/s", "p50 ms", "p99 ms"
    );
    writeln!(
        bench.report,
        "{:<10} {:>12.0} {:>10.3} {:>10.3}",
        "nginx", nr, n50, n99
    );
    writeln!(
        bench.report,
        "{:<10} {:>12.0} {:>10.3} {:>10.3}",
        "ingress", ir, i50, i99
    );
    writeln!(
        bench.report,
        "ratio ingress/nginx: requests/s {:.2}x, p99 {:.2}x (lower is better)",
        ir / nr,
        i99 / n99
    );
    writeln!(
        bench.report,
        "rounds (requests/s): nginx {:?} ingress {:?}",
        n.iter()
            .map(|l| l.requests_per_sec.round())
            .collect::<Vec<_>>(),
        i.iter()
            .map(|l| l.requests_per_sec.round())
            .collect::<Vec<_>>()
    );
    Ok(())
}
