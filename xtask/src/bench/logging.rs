//! What the access log and tracing cost: the same HTTP/1.1 keep-alive load through ingress with
//! access lines off, as JSON events, and in ingress-nginx's `upstream` format (written to
//! stdout, a pipe that a reader on CPU 1 files, as a container runtime takes a container's
//! stdout), and with OpenTelemetry tracing at a 1% and a 100% sample ratio (spans exported over
//! OTLP/HTTP to the rig's upstream nginx, which answers 200 to anything).
//!
//! Each configuration is its own ingress process, all running at once on CPU 0 and taking turns
//! in short slices, each after an unmeasured second of its own (see [`Bench::goal_slices`]), so that
//! each configuration meets the shared machine's disturbances as often as "off" does. Each is
//! reported over all its slices against "off" (goals: at most 5% fewer requests/s with the log
//! on; tracing off costs nothing, as "off" is also the untraced path), with the spread of the
//! slice pairs' own ratios. A second "off" process is measured like the others: its ratio says
//! how far apart two identical configurations come out in the same run. nginx is not involved;
//! its rig process idles.
//!
//! Each is also measured as requests per CPU-second of its process (all its threads: the log
//! writer's `write`s count).

use std::time::Duration;

use anyhow::Result;

use super::procs;
use super::rig::{self, Rig};
use super::{Bench, median, quartiles, wrk};

/// The rig's upstream, which answers `200` to an OTLP export as to anything else.
const SINK: &str = "http://127.0.0.1:19000/v1/traces";

const CONFIGS: [(&str, &[&str]); 6] = [
    ("off", &[]),
    // The same as "off", in a process of its own: how far apart two identical configurations
    // come out in this run, the resolution of every other row's "vs off".
    ("off, again", &[]),
    (
        "json",
        &[
            "--access-log",
            "true",
            "--access-log-format",
            "json",
            "--log-level",
            "warn,access=info",
        ],
    ),
    (
        "upstream",
        &[
            "--access-log",
            "true",
            "--access-log-format",
            "upstream",
            "--log-level",
            "warn,access=info",
        ],
    ),
    (
        "traced 1%",
        &["--otlp-endpoint", SINK, "--otel-sampler-ratio", "0.01"],
    ),
    (
        "traced 100%",
        &["--otlp-endpoint", SINK, "--otel-sampler-ratio", "1"],
    ),
];

/// A configuration with the access log on must have written a line per request it measured:
/// a log that silently wrote nothing (a filter, a format that fell back) would look free.
fn ensure_logged(bench: &Bench, k: usize, requests: u64) -> Result<()> {
    let log = rig::log_of(bench, k);
    // The writer thread may still be finishing its last batch.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let lines = std::fs::read(&log)?.iter().filter(|b| **b == b'\n').count() as u64;
        if lines >= requests {
            return Ok(());
        }
        anyhow::ensure!(
            std::time::Instant::now() < deadline,
            "{}: {lines} lines for {requests} requests",
            log.display()
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// One slice of one configuration: its load, and the CPU its process spent meanwhile.
#[derive(Clone)]
struct Slice {
    load: wrk::Load,
    cpu: Duration,
}

pub fn run(bench: &Bench) -> Result<()> {
    // Every configuration runs at once, each its own process on CPU 0 (idle but for its own
    // slices), so the slices can take turns a second apart. All in userspace mode: instances
    // would share the kernel gate's pins, and the HTTP port measured here is not gated anyway.
    let with_mode = |args: &[&'static str]| -> Vec<&'static str> {
        args.iter()
            .copied()
            .chain(["--mode", "userspace"])
            .collect()
    };
    let rig = Rig::start(bench, &with_mode(CONFIGS[0].1))?;
    let mut others = Vec::new();
    for (k, (_, args)) in CONFIGS.iter().enumerate().skip(1) {
        others.push(rig::start_ingress(bench, k, &with_mode(args))?);
    }
    let url = |k: usize| format!("http://127.0.0.1:{}/", rig::ingress_ports(k).0);
    for (k, process) in others.iter_mut().enumerate() {
        procs::wait_http(&url(k + 1), rig::HOST, Duration::from_secs(20))?;
        process.ensure_running("ingress")?;
    }
    let process = |k: usize| if k == 0 { &rig.ingress } else { &others[k - 1] };
    for k in 0..CONFIGS.len() {
        wrk::run(
            &url(k),
            rig::HOST,
            Duration::from_secs(1),
            bench.connections,
            None,
        )?;
    }
    let (slices, slice) = bench.goal_slices();
    let mut runs: Vec<Vec<Slice>> = vec![Vec::new(); CONFIGS.len()];
    let warm = Duration::from_secs(1);
    for round in 0..slices {
        for k in Bench::slice_order(round, CONFIGS.len()) {
            // Unmeasured: the caches become this configuration's (see `goal_slices`).
            wrk::run(&url(k), rig::HOST, warm, bench.connections, None)?;
            let before = process(k).cpu_time()?;
            let load = wrk::run(&url(k), rig::HOST, slice, bench.connections, None)?;
            let cpu = process(k).cpu_time()?.saturating_sub(before);
            runs[k].push(Slice { load, cpu });
        }
    }
    for (k, (_, args)) in CONFIGS.iter().enumerate() {
        if args.contains(&"--access-log-format") {
            ensure_logged(bench, k, runs[k].iter().map(|s| s.load.requests).sum())?;
        }
    }
    writeln!(
        bench.report,
        "\n## Access log and tracing cost: HTTP/1.1 keep-alive through ingress ({} connections, {} alternating slices of {:?})",
        bench.connections, slices, slice
    );
    writeln!(
        bench.report,
        "{:<16} {:>12} {:>10} {:>10} {:>10} {:>16} {:>10}",
        "observability", "requests/s", "p50 ms", "p99 ms", "vs off", "requests/CPU-s", "vs off"
    );
    // All slices together: requests over the time (or CPU) they took. The slices are of equal
    // length, so "vs off" in requests/s is one configuration's requests over the "off" one's.
    let requests = |k: usize| runs[k].iter().map(|s| s.load.requests as f64).sum::<f64>();
    let seconds = |k: usize| {
        runs[k]
            .iter()
            .map(|s| s.load.requests as f64 / s.load.requests_per_sec.max(1.0))
            .sum::<f64>()
    };
    let per_cpu = |k: usize| {
        requests(k)
            / runs[k]
                .iter()
                .map(|s| s.cpu.as_secs_f64())
                .sum::<f64>()
                .max(0.001)
    };
    for (k, (name, _)) in CONFIGS.iter().enumerate() {
        writeln!(
            bench.report,
            "{:<16} {:>12.0} {:>10.3} {:>10.3} {:>9.2}x {:>16.0} {:>9.2}x",
            name,
            requests(k) / seconds(k).max(f64::EPSILON),
            median(runs[k].iter().map(|s| s.load.p50_ms).collect()),
            median(runs[k].iter().map(|s| s.load.p99_ms).collect()),
            requests(k) / requests(0).max(1.0),
            per_cpu(k),
            per_cpu(k) / per_cpu(0)
        );
    }
    let spread = |k: usize| {
        let [q1, q2, q3] = quartiles(
            runs[k]
                .iter()
                .zip(&runs[0])
                .map(|(s, off)| s.load.requests as f64 / (off.load.requests as f64).max(1.0))
                .collect(),
        );
        format!("median {q2:.2}, middle half {q1:.2}-{q3:.2}")
    };
    writeln!(
        bench.report,
        "requests/s vs off, slice by slice: off, again {}; json {}; upstream {} (goal: at least 0.95x)",
        spread(1),
        spread(2),
        spread(3)
    );
    Ok(())
}
