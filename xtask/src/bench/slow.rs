//! Slow and silent clients by the thousand, one kind at a time, while known-host traffic runs:
//! what the proxy's memory does, when it closes them, and what the real traffic sees.
//!
//! ```text
//!   core 0: ingress (one worker)                core 1: wrk (known host) + slow-clients
//!   per kind: N clients connect from 50 loopback addresses and stall; wrk runs meanwhile;
//!             RSS sampled every 200 ms; each client notes when the proxy closed it
//! ```
//!
//! Kinds: a cut-short HTTP/2 preface, a preface and SETTINGS then silence, TLS with ALPN h2 then
//! silence, a partial request head (HTTP port and admin port), 15 KiB of a 16 KiB body (the
//! largest the proxy buffers), and 60 KiB of a 64 KiB body (streamed to `/upload`, where the
//! upstream waits for the whole body before it answers, as an application reading a form
//! would). A quick run uses 5-second timeouts so each kind takes seconds, not the defaults'
//! minute.

use std::io::Read;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, ensure};

use super::procs;
use super::rig::{self, Rig};
use super::{Bench, wrk};

struct Kind {
    name: &'static str,
    /// `slow-clients --kind`.
    flag: &'static str,
    port: u16,
}

const KINDS: &[Kind] = &[
    Kind {
        name: "cut-short HTTP/2 preface",
        flag: "h2-cut-preface",
        port: rig::INGRESS_HTTP,
    },
    Kind {
        name: "HTTP/2 preface + SETTINGS, then silence",
        flag: "h2-settings",
        port: rig::INGRESS_HTTP,
    },
    Kind {
        name: "TLS + ALPN h2, then silence",
        flag: "tls-h2",
        port: rig::INGRESS_HTTPS,
    },
    Kind {
        name: "partial request head",
        flag: "partial-head",
        port: rig::INGRESS_HTTP,
    },
    Kind {
        name: "partial head, admin port",
        flag: "partial-head",
        port: rig::INGRESS_ADMIN,
    },
    Kind {
        name: "15 KiB of a 16 KiB body",
        flag: "partial-body",
        port: rig::INGRESS_HTTP,
    },
    Kind {
        name: "60 KiB of a 64 KiB body, streamed",
        flag: "streamed-body",
        port: rig::INGRESS_HTTP,
    },
];

pub fn run(bench: &Bench, quick: bool) -> Result<()> {
    raise_file_limit(200_000);
    let (count, timeout) = if quick {
        (2000, Duration::from_secs(5))
    } else {
        (5000, Duration::ZERO)
    };
    let timeout_args: Vec<String> = if quick {
        [
            "--header-read-timeout",
            "--client-body-timeout",
            "--client-keepalive-timeout",
            "--tls-handshake-timeout",
        ]
        .iter()
        .flat_map(|flag| [flag.to_string(), "5s".to_string()])
        .collect()
    } else {
        Vec::new()
    };
    // The longest default timeout among the kinds (the body timeout) bounds each kind's hold.
    let longest = if quick {
        timeout
    } else {
        Duration::from_secs(60)
    };
    let hold = longest + Duration::from_secs(15);
    let args: Vec<&str> = timeout_args.iter().map(String::as_str).collect();
    let rig = Rig::start(bench, &args)?;
    let slow_clients = slow_clients_binary(bench, quick)?;
    let url = format!("http://127.0.0.1:{}/", rig::INGRESS_HTTP);
    let load_time = bench.duration.max(Duration::from_secs(4));

    writeln!(
        bench.report,
        "\n## Slow clients: {count} of each kind beside known-host traffic (wrk, {} connections, {load_time:?}); timeouts {}",
        bench.connections,
        if quick {
            "5 s (quick)"
        } else {
            "at their defaults (head 30 s, body 60 s, admin head 5 s)"
        }
    );
    let idle_rss = rig.ingress.rss_kib()?;
    let base = wrk::run(&url, rig::HOST, load_time, bench.connections, None)?;
    writeln!(
        bench.report,
        "idle RSS {:.1} MiB; known host alone: {:.0} requests/s, p99 {:.2} ms, {:.2}% answered",
        idle_rss as f64 / 1024.0,
        base.requests_per_sec,
        base.p99_ms,
        base.success_rate() * 100.0
    );
    writeln!(
        bench.report,
        "{:<42} {:>9} {:>8} {:>8} {:>10} {:>10} {:>8} {:>9} {:>9} {:>8}",
        "kind",
        "peak RSS",
        "per conn",
        "refused",
        "closed p50",
        "closed p99",
        "open",
        "known r/s",
        "known p99",
        "answered"
    );
    for kind in KINDS {
        let peak = Arc::new(AtomicU64::new(0));
        let done = Arc::new(AtomicBool::new(false));
        let pid = rig.ingress.pid();
        let sampler = {
            let (peak, done) = (peak.clone(), done.clone());
            std::thread::spawn(move || {
                while !done.load(Ordering::Relaxed) {
                    if let Some(rss) = rss_kib(pid) {
                        peak.fetch_max(rss, Ordering::Relaxed);
                    }
                    std::thread::sleep(Duration::from_millis(200));
                }
            })
        };
        let before = rig.ingress.rss_kib()?;
        let mut clients = procs::pinned(1, &slow_clients.to_string_lossy())
            .args(["--kind", kind.flag])
            .args(["--connect", &format!("127.0.0.1:{}", kind.port)])
            .args(["--count", &count.to_string()])
            .args(["--hold", &format!("{}s", hold.as_secs())])
            .args(["--host", rig::HOST])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("starting slow-clients")?;
        // Let them connect (2000 a second), then measure the known host beside them.
        std::thread::sleep(Duration::from_millis(500 + count as u64 / 2));
        let load = wrk::run(&url, rig::HOST, load_time, bench.connections, None)?;
        let mut out = String::new();
        clients
            .stdout
            .take()
            .context("slow-clients stdout")?
            .read_to_string(&mut out)?;
        let status = clients.wait()?;
        done.store(true, Ordering::Relaxed);
        let _ = sampler.join();
        ensure!(status.success(), "slow-clients failed: {out}");
        let summary: serde_json::Value =
            serde_json::from_str(out.trim()).with_context(|| format!("slow-clients said {out}"))?;
        let number = |key: &str| summary[key].as_f64().unwrap_or(f64::NAN);
        let peak = peak.load(Ordering::Relaxed);
        let accepted = number("closed") + number("still_open");
        let per_conn = (peak.saturating_sub(before)) as f64 / accepted.max(1.0);
        writeln!(
            bench.report,
            "{:<42} {:>6.1} MiB {:>5.1} KiB {:>8} {:>9.1} s {:>9.1} s {:>8} {:>9.0} {:>6.2} ms {:>7.2}%",
            kind.name,
            peak as f64 / 1024.0,
            per_conn,
            // Connections closed within a second were refused by a cap, or not made at all.
            number("not_connected") + number("closed_within_1s"),
            number("closed_p50_s"),
            number("closed_p99_s"),
            number("still_open"),
            load.requests_per_sec,
            load.p99_ms,
            load.success_rate() * 100.0
        );
        // Let the proxy settle before the next kind.
        std::thread::sleep(Duration::from_secs(1));
    }
    writeln!(
        bench.report,
        "(refused: closed within 1 s of the last byte sent, by a connection cap or the admin port's per-peer limit, or never connected; open: still open when the {}-second hold ended)",
        hold.as_secs()
    );
    drop(rig);
    Ok(())
}

fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// Thousands of sockets on each side: the soft limit is raised to the hard one (children, the
/// proxy among them, inherit it).
fn raise_file_limit(want: u64) {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct it is given, which lives on this stack.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return;
    }
    limit.rlim_cur = limit.rlim_max.min(want);
    // SAFETY: setrlimit reads the struct, which is initialised above.
    let _ = unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) };
}

/// The generator from the tests crate, built like the gate section's flood client.
fn slow_clients_binary(bench: &Bench, quick: bool) -> Result<PathBuf> {
    let release = bench.ingress.parent().context("release directory")?;
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let ws = crate::workspace::Workspace::locate()?;
    let mut cmd = Command::new(cargo);
    cmd.args(["build", "-p", "ingress-tests", "--bin", "slow-clients"])
        .current_dir(&ws.root);
    let dir = if quick {
        release.parent().context("target directory")?.join("debug")
    } else {
        cmd.arg("--release");
        if ws.object_path().is_file() {
            cmd.env("INGRESS_EBPF_OBJECT", ws.object_path());
        }
        release.to_path_buf()
    };
    let status = cmd.status()?;
    ensure!(status.success(), "building slow-clients failed");
    Ok(dir.join("slow-clients"))
}
