//! HTTPS through each proxy: TLS 1.3 with the same ECDSA P-256 certificate.
//!
//! - keep-alive requests/s and p99 (wrk over TLS);
//! - new TLS connections: h2load opens connections at a fixed rate, one request each, with SNI;
//!   the proxy's CPU time for them gives handshakes per proxy CPU-second. On two cores the
//!   client's ECDSA verification costs more than the server's signature, so the client would cap
//!   a "maximum rate" test; CPU per handshake is the comparison that measures the proxy.

use std::time::Duration;

use anyhow::{Context, Result};

use super::procs::{self, Running};
use super::rig::{self, Rig};
use super::{Bench, http, median};

pub fn run(bench: &Bench) -> Result<()> {
    let rig = Rig::start(bench, &[])?;
    resolve_to_loopback(rig::HOST)?;
    http::compare(
        "HTTPS keep-alive (TLS 1.3, ECDSA P-256)",
        bench,
        &format!("https://{}:{}/", rig::HOST, rig::NGINX_HTTPS),
        &format!("https://{}:{}/", rig::HOST, rig::INGRESS_HTTPS),
        None,
    )?;
    let rate: u32 = if bench.duration.as_secs() < 6 {
        300
    } else {
        500
    };
    let seconds: u32 = if bench.duration.as_secs() < 6 { 4 } else { 8 };
    let (mut n, mut i) = (Vec::new(), Vec::new());
    for _ in 0..bench.rounds {
        n.push(new_connections(
            &rig.nginx,
            rig::NGINX_HTTPS,
            rate,
            seconds,
        )?);
        i.push(new_connections(
            &rig.ingress,
            rig::INGRESS_HTTPS,
            rate,
            seconds,
        )?);
    }
    let per_cpu = |runs: &[Handshakes]| median(runs.iter().map(|h| h.per_cpu_second).collect());
    let ok = |runs: &[Handshakes]| median(runs.iter().map(|h| h.succeeded as f64).collect());
    let (np, ip) = (per_cpu(&n), per_cpu(&i));
    writeln!(
        bench.report,
        "\n## New TLS 1.3 connections ({rate}/s for {seconds}s, one request each, median of {} rounds)",
        bench.rounds
    );
    writeln!(
        bench.report,
        "{:<10} {:>14} {:>22}",
        "proxy", "succeeded", "handshakes/CPU-second"
    );
    writeln!(
        bench.report,
        "{:<10} {:>14.0} {:>22.0}",
        "nginx",
        ok(&n),
        np
    );
    writeln!(
        bench.report,
        "{:<10} {:>14.0} {:>22.0}",
        "ingress",
        ok(&i),
        ip
    );
    writeln!(
        bench.report,
        "ratio ingress/nginx: handshakes per CPU-second {:.2}x",
        ip / np
    );
    drop(rig);
    Ok(())
}

struct Handshakes {
    succeeded: u64,
    per_cpu_second: f64,
}

fn new_connections(proxy: &Running, port: u16, rate: u32, seconds: u32) -> Result<Handshakes> {
    let total = rate * seconds;
    let before = proxy.cpu_time()?;
    let out = procs::pinned(1, "h2load")
        .args([
            "--h1",
            "-t1",
            &format!("-c{total}"),
            &format!("-n{total}"),
            &format!("-r{}", rate / 10),
            "--rate-period=100ms",
        ])
        .arg(format!("--connect-to=127.0.0.1:{port}"))
        // The URL's host is the SNI and the Host header both; an extra `-H host:` would make
        // h2load send Host twice, which both servers rightly answer with 400.
        .arg(format!("https://{}:{port}/", rig::HOST))
        .output()
        .context("running h2load")?;
    std::thread::sleep(Duration::from_millis(200));
    let cpu = proxy.cpu_time()?.saturating_sub(before);
    let text = String::from_utf8_lossy(&out.stdout);
    let succeeded = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("requests:"))
        .and_then(|l| {
            l.split(',')
                .find_map(|p| p.trim().strip_suffix(" succeeded").map(str::to_string))
        })
        .and_then(|v| v.trim().parse().ok())
        .with_context(|| format!("unexpected h2load output:\n{text}"))?;
    // Handshakes per CPU-second over failed requests would measure nothing; say so instead.
    if succeeded < u64::from(total) / 2 {
        anyhow::bail!("only {succeeded} of {total} h2load requests succeeded:\n{text}");
    }
    Ok(Handshakes {
        succeeded,
        per_cpu_second: succeeded as f64 / cpu.as_secs_f64().max(0.001),
    })
}

/// wrk takes its SNI from the URL's host and has no `--connect-to`: with `https://127.0.0.1/`
/// it would send the IP literal as the server name, which the SNI gate (rightly) resets. So the
/// bench host must resolve to loopback; `/etc/hosts` gets the entry if it lacks one.
pub(super) fn resolve_to_loopback(host: &str) -> Result<()> {
    use std::net::ToSocketAddrs;
    let resolves = (host, 443)
        .to_socket_addrs()
        .is_ok_and(|mut addrs| addrs.any(|a| a.ip().is_loopback()));
    if resolves {
        return Ok(());
    }
    println!("adding `127.0.0.1 {host}` to /etc/hosts so wrk sends {host} as the TLS server name");
    let mut hosts = std::fs::OpenOptions::new()
        .append(true)
        .open("/etc/hosts")
        .context("opening /etc/hosts (the HTTPS bench needs root)")?;
    std::io::Write::write_all(&mut hosts, format!("127.0.0.1 {host}\n").as_bytes())
        .context("writing /etc/hosts")?;
    Ok(())
}
