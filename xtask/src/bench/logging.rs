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
//! writer's `write`s count). Then "off", its twin and the two access-log formats run side by
//! side, all under load at once ([`side_by_side`]): the goal's figure, each one's requests per
//! CPU-second against "off" in the same moments.

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

/// Every measured request was answered 2xx: a configuration that failed fast (a broken
/// format, a refused route) would otherwise look cheap.
fn ensure_answered(k: usize, load: &wrk::Load) -> Result<()> {
    anyhow::ensure!(
        load.all_answered(),
        "{}: {} of {} answers were not 2xx ({} socket errors, {} of them timeouts)",
        CONFIGS[k].0,
        load.non_2xx,
        load.requests,
        load.socket_errors,
        load.timeouts
    );
    Ok(())
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
            ensure_answered(k, &load)?;
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
    // All slices together: requests over the time (or CPU) they took. The time is wrk's own
    // measure of each slice: a `-d1s` run lasts 1.0 s or 1.1 s (wrk checks its deadline on a
    // 100 ms timer), so counting requests alone would favour whichever configuration drew more
    // long slices.
    let requests = |k: usize| runs[k].iter().map(|s| s.load.requests as f64).sum::<f64>();
    let seconds = |k: usize| {
        runs[k]
            .iter()
            .map(|s| s.load.requests as f64 / s.load.requests_per_sec.max(1.0))
            .sum::<f64>()
    };
    let rate = |k: usize| requests(k) / seconds(k).max(f64::EPSILON);
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
            rate(k),
            median(runs[k].iter().map(|s| s.load.p50_ms).collect()),
            median(runs[k].iter().map(|s| s.load.p99_ms).collect()),
            rate(k) / rate(0).max(1.0),
            per_cpu(k),
            per_cpu(k) / per_cpu(0)
        );
    }
    let spread = |k: usize| {
        spread_of(
            runs[k]
                .iter()
                .zip(&runs[0])
                .map(|(s, off)| s.load.requests_per_sec / off.load.requests_per_sec.max(1.0))
                .collect(),
        )
    };
    writeln!(
        bench.report,
        "requests/s vs off, slice by slice: off, again {}; json {}; upstream {}",
        spread(1),
        spread(2),
        spread(3)
    );
    let together = side_by_side(bench, url, process)?;
    let compared: Vec<String> = SIDE_BY_SIDE
        .iter()
        .enumerate()
        .skip(1)
        .map(|(i, &k)| {
            format!(
                "{} {:.3}x (rounds: {})",
                CONFIGS[k].0,
                together.against_off(i),
                spread_of(together.round_ratios(i))
            )
        })
        .collect();
    writeln!(
        bench.report,
        "side by side ({} at once on CPU 0, {} rounds of {:?}), requests per proxy CPU-second vs off: {} (goal: at least 0.95x)",
        SIDE_BY_SIDE.len(),
        together.rounds.len(),
        together.length,
        compared.join("; ")
    );
    Ok(())
}

/// The median and middle half of some ratios, as the report prints them.
fn spread_of(ratios: Vec<f64>) -> String {
    let [q1, q2, q3] = quartiles(ratios);
    format!("median {q2:.2}, middle half {q1:.2}-{q3:.2}")
}

/// The configurations (indices into [`CONFIGS`]) that [`side_by_side`] runs at once: "off"
/// first, its twin, and the two access-log formats (the goal's).
const SIDE_BY_SIDE: [usize; 4] = [0, 1, 2, 3];

/// What [`side_by_side`] measured: per round, the requests and CPU seconds of each entry of
/// [`SIDE_BY_SIDE`], in its order.
struct Together {
    length: Duration,
    rounds: Vec<[(f64, f64); SIDE_BY_SIDE.len()]>,
}

/// Requests per CPU-second.
fn per_cpu((requests, cpu): (f64, f64)) -> f64 {
    requests / cpu.max(0.001)
}

impl Together {
    /// Entry `i`'s requests per CPU-second over all rounds against "off"'s (entry 0).
    fn against_off(&self, i: usize) -> f64 {
        let total = |i: usize| {
            self.rounds
                .iter()
                .fold((0.0, 0.0), |(r, c), round| (r + round[i].0, c + round[i].1))
        };
        per_cpu(total(i)) / per_cpu(total(0)).max(f64::EPSILON)
    }

    /// Round by round, entry `i`'s requests per CPU-second against "off"'s.
    fn round_ratios(&self, i: usize) -> Vec<f64> {
        self.rounds
            .iter()
            .map(|round| per_cpu(round[i]) / per_cpu(round[0]).max(f64::EPSILON))
            .collect()
    }
}

/// The configurations of [`SIDE_BY_SIDE`] under load all at once: one wrk each on CPU 1, the
/// processes sharing CPU 0. The slices above take turns, so a configuration is compared with
/// "off" a second or two later; this machine's speed moves by up to 2x from one second to the
/// next (in a local run the same configuration's slices ranged from 35k to 66k requests/s).
/// Side by side, every configuration meets the same moments, and each one's requests per
/// CPU-second of its own process is its cost per request with the core full (CPU 0 was 98%
/// busy in a local run). Two identical processes ("off", "off, again") came out at 0.98x to
/// 1.01x of each other this way in 16 local runs.
fn side_by_side<'p>(
    bench: &Bench,
    url: impl Fn(usize) -> String,
    process: impl Fn(usize) -> &'p procs::Running,
) -> Result<Together> {
    let length = Duration::from_secs((bench.duration.as_secs() / 2).max(2));
    let connections = bench.connections;
    let all_at_once = |d: Duration| -> Result<Vec<wrk::Load>> {
        std::thread::scope(|scope| {
            let runs: Vec<_> = SIDE_BY_SIDE
                .iter()
                .map(|&k| {
                    let url = url(k);
                    scope.spawn(move || wrk::run(&url, rig::HOST, d, connections, None))
                })
                .collect();
            runs.into_iter()
                .map(|run| {
                    run.join()
                        .unwrap_or_else(|_| Err(anyhow::anyhow!("a wrk thread panicked")))
                })
                .collect()
        })
    };
    let cpu = || -> Result<Vec<Duration>> {
        SIDE_BY_SIDE
            .iter()
            .map(|&k| process(k).cpu_time())
            .collect()
    };
    let mut rounds = Vec::new();
    for _ in 0..4 * bench.rounds {
        all_at_once(Duration::from_secs(1))?;
        let before = cpu()?;
        let loads = all_at_once(length)?;
        let after = cpu()?;
        for (&k, load) in SIDE_BY_SIDE.iter().zip(&loads) {
            ensure_answered(k, load)?;
        }
        let mut round = [(0.0, 0.0); SIDE_BY_SIDE.len()];
        for (i, slot) in round.iter_mut().enumerate() {
            *slot = (
                loads[i].requests as f64,
                after[i].saturating_sub(before[i]).as_secs_f64(),
            );
        }
        rounds.push(round);
    }
    Ok(Together { length, rounds })
}
