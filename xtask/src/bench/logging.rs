//! What the access log and tracing cost: the same HTTP/1.1 keep-alive load through ingress with
//! access lines off, as JSON events, and in ingress-nginx's `upstream` format (written to stdout,
//! a pipe that a reader on CPU 1 files, as a container runtime takes a container's stdout), and with OpenTelemetry tracing at a 1%
//! and a 100% sample ratio (spans exported over OTLP/HTTP to the rig's upstream nginx, which
//! answers 200 to anything). The configurations are interleaved round by round (a fresh rig
//! each time, in reverse order every other round), and each is reported as the median of its
//! ratios to the "off" run of the same round (goals: at most 5% fewer requests/s with the log
//! on; tracing off costs nothing, as "off" is also the untraced path). nginx is not involved;
//! its rig process idles.
//!
//! Each run is also measured as requests per CPU-second of the ingress process (all its
//! threads: the log writer's `write`s count): on a shared machine, requests/s move with the
//! neighbours' load on CPU 0, CPU per request much less.

use anyhow::Result;

use super::rig::{self, Rig};
use super::{Bench, median, wrk};

/// The rig's upstream, which answers `200` to an OTLP export as to anything else.
const SINK: &str = "http://127.0.0.1:19000/v1/traces";

const CONFIGS: [(&str, &[&str]); 5] = [
    ("off", &[]),
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

/// A run with the access log on must have written a line per request it measured: a log
/// that silently wrote nothing (a filter, a format that fell back) would look free.
fn ensure_logged(bench: &Bench, requests: u64) -> Result<()> {
    let log = bench.dir.join("rig").join("ingress.log");
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

pub fn run(bench: &Bench) -> Result<()> {
    let url = format!("http://127.0.0.1:{}/", rig::INGRESS_HTTP);
    let mut runs: Vec<Vec<(wrk::Load, f64)>> = vec![Vec::new(); CONFIGS.len()];
    let rounds = bench.goal_rounds();
    for round in 0..rounds {
        // Every other round runs the configurations backwards, so none is always measured
        // first (or last) when the shared machine's load drifts across a round.
        let mut order: Vec<usize> = (0..CONFIGS.len()).collect();
        if round % 2 == 1 {
            order.reverse();
        }
        for i in order {
            let args = CONFIGS[i].1;
            let rig = Rig::start(bench, args)?;
            wrk::run(
                &url,
                rig::HOST,
                std::time::Duration::from_secs(1),
                bench.connections,
                None,
            )?;
            let before = rig.ingress.cpu_time()?;
            let load = wrk::run(&url, rig::HOST, bench.duration, bench.connections, None)?;
            if args.contains(&"--access-log-format") {
                ensure_logged(bench, load.requests)?;
            }
            // After the log check: the writer thread's last batch is the run's cost too.
            let cpu = rig.ingress.cpu_time()?.saturating_sub(before);
            let per_cpu_second = load.requests as f64 / cpu.as_secs_f64().max(0.001);
            runs[i].push((load, per_cpu_second));
            drop(rig);
        }
    }
    writeln!(
        bench.report,
        "\n## Access log and tracing cost: HTTP/1.1 keep-alive through ingress ({} connections, median of {} rounds)",
        bench.connections, rounds
    );
    writeln!(
        bench.report,
        "{:<16} {:>12} {:>10} {:>10} {:>10} {:>16} {:>10}",
        "observability", "requests/s", "p50 ms", "p99 ms", "vs off", "requests/CPU-s", "vs off"
    );
    // "vs off" pairs each run with the "off" run of its own round (the runs of a round are
    // seconds apart, rounds a minute): the median of those ratios, so that a round in which the
    // shared machine was faster or slower for everyone does not count as the log's cost.
    let vs_off = |i: usize, value: fn(&(wrk::Load, f64)) -> f64| -> Vec<f64> {
        runs[i]
            .iter()
            .zip(&runs[0])
            .map(|(run, off)| value(run) / value(off))
            .collect()
    };
    let rate_of: fn(&(wrk::Load, f64)) -> f64 = |(l, _)| l.requests_per_sec;
    let cpu_of: fn(&(wrk::Load, f64)) -> f64 = |(_, c)| *c;
    for (i, ((name, _), loads)) in CONFIGS.iter().zip(&runs).enumerate() {
        writeln!(
            bench.report,
            "{:<16} {:>12.0} {:>10.3} {:>10.3} {:>9.2}x {:>16.0} {:>9.2}x",
            name,
            median(loads.iter().map(rate_of).collect()),
            median(loads.iter().map(|(l, _)| l.p50_ms).collect()),
            median(loads.iter().map(|(l, _)| l.p99_ms).collect()),
            median(vs_off(i, rate_of)),
            median(loads.iter().map(cpu_of).collect()),
            median(vs_off(i, cpu_of))
        );
    }
    let rounds_of = |i: usize| {
        vs_off(i, rate_of)
            .iter()
            .map(|r| format!("{r:.2}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    writeln!(
        bench.report,
        "requests/s vs off, round by round: json [{}], upstream [{}] (goal: at least 0.95x)",
        rounds_of(1),
        rounds_of(2)
    );
    Ok(())
}
