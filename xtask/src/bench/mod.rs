//! `cargo xtask bench`: the proxy against nginx, measured in one run on one machine.
//!
//! ```text
//!   core 0: the proxy under test (ingress with one worker thread, or nginx with one worker)
//!   core 1: the load generator and the shared upstream (nginx, one worker, returning 200)
//! ```
//!
//! Machines are noisy, so every claim is a ratio against nginx measured in the same run, with
//! the two proxies interleaved round by round and the median round reported. Nothing here
//! passes or fails on a number: it prints them, and writes them to `docs/benchmark-results.md`
//! with the date, commit and machine (see `report`), so nobody copies them by hand.

mod accuracy;
mod auth;
mod bare;
mod gate;
mod grpc;
mod h2;
mod http;
mod kube;
mod logging;
mod passthrough;
mod policy;
mod procs;
mod report;
mod rig;
mod scale;
mod slow;
mod tls;
mod wrk;

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};

use self::report::Report;
use crate::toolchain::RouteArg;
use crate::workspace::Workspace;

#[derive(clap::Args)]
pub struct Args {
    /// Shorter runs (for CI): fewer rounds, shorter load.
    #[arg(long)]
    pub quick: bool,
    /// Only these sections (http, bare, https, h2, grpc, auth, policy, logging, memory, scale, kube,
    /// gate, accuracy, passthrough, slow); default all. `gate` includes `accuracy`.
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
}

/// Everything a section needs.
pub struct Bench {
    pub ingress: PathBuf,
    pub dir: PathBuf,
    pub rounds: usize,
    pub duration: Duration,
    pub connections: u32,
    /// What the sections print: `writeln!(bench.report, ...)` prints a line and keeps it.
    pub report: Report,
}

impl Bench {
    /// How a section whose goal is a ratio within a few percent of its line (policy, logging)
    /// measures: many short slices, the configurations it compares taking turns, each ratio the sum of one configuration's requests over the
    /// other's. On a shared two-CPU machine the load of the neighbours changes within seconds:
    /// two 1-second slices in a row of the same route differed by up to 20%, and one 4-second
    /// round's ratio by up to ±10%, wider than the margin these goals are judged by. Slices a
    /// second apart meet the same disturbances, and sums over many of them average them out.
    /// `--quick`: 32 slices of 1 s; a full run: 48 of 2 s.
    ///
    /// Each slice starts at a different place in the order (the order turns by one), so no
    /// configuration follows itself from one slice to the next, and each measured run comes
    /// after an unmeasured second of the same load ([`Bench::slice_order`]): the CPU's caches
    /// are then the measured configuration's own, whichever ran before it.
    pub fn goal_slices(&self) -> (usize, Duration) {
        (
            16 * self.rounds,
            Duration::from_secs((self.duration.as_secs() / 4).max(1)),
        )
    }

    /// The order of slice `round` over `n` configurations (three or more): turned by one per
    /// slice.
    pub fn slice_order(round: usize, n: usize) -> impl Iterator<Item = usize> {
        (0..n).map(move |j| (j + round) % n)
    }

    pub fn scratch(&self, name: &str) -> Result<PathBuf> {
        let path = self.dir.join(name);
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).with_context(|| format!("creating {}", path.display()))?;
        Ok(path)
    }
}

pub fn run(args: &Args) -> Result<()> {
    let ws = Workspace::locate()?;
    let ingress = release_binary(&ws)?;
    for tool in ["nginx", "wrk", "h2load", "taskset"] {
        procs::require(tool)?;
    }
    let rounds = if args.quick { 2 } else { 3 };
    let duration = Duration::from_secs(if args.quick { 4 } else { 10 });
    let connections = 32;
    let setup = format!("{rounds} rounds of {duration:?}, {connections} connections");
    let bench = Bench {
        ingress,
        dir: ws.target_dir.join("bench"),
        rounds,
        duration,
        connections,
        report: Report::new(&ws, args.quick, &setup),
    };
    let wanted = |name: &str| args.only.is_empty() || args.only.iter().any(|o| o == name);
    println!(
        "ingress benchmark: {} rounds of {:?}, {} connections, proxies pinned to CPU 0, load and upstream to CPU 1",
        bench.rounds, bench.duration, bench.connections
    );
    if procs::cpus() < 2 {
        println!("note: fewer than 2 CPUs; pinning is skipped and numbers are less meaningful");
    }
    // Each section's results are written as soon as it ends, so a later failure keeps them.
    if wanted("http") {
        http::run(&bench)?;
        bench.report.finish("http")?;
    }
    if wanted("bare") {
        bare::run(&bench)?;
        bench.report.finish("bare")?;
    }
    if wanted("https") {
        tls::run(&bench)?;
        bench.report.finish("https")?;
    }
    if wanted("h2") {
        h2::run(&bench)?;
        bench.report.finish("h2")?;
    }
    if wanted("grpc") {
        grpc::run(&bench, &ws.root)?;
        bench.report.finish("grpc")?;
    }
    if wanted("auth") {
        auth::run(&bench)?;
        bench.report.finish("auth")?;
    }
    if wanted("policy") {
        policy::run(&bench)?;
        bench.report.finish("policy")?;
    }
    if wanted("logging") {
        logging::run(&bench)?;
        bench.report.finish("logging")?;
    }
    if wanted("memory") || wanted("scale") {
        scale::run(&bench)?;
        bench.report.finish("memory")?;
    }
    if wanted("kube") {
        kube::run(&bench, args.quick)?;
        bench.report.finish("kube")?;
    }
    if wanted("passthrough") {
        passthrough::run(&bench, args.quick)?;
        bench.report.finish("passthrough")?;
    }
    if wanted("gate") {
        gate::run(&bench, args.quick)?;
        bench.report.finish("gate")?;
    }
    if wanted("gate") || wanted("accuracy") {
        accuracy::run(&bench, args.quick)?;
        bench.report.finish("accuracy")?;
    }
    if wanted("slow") {
        slow::run(&bench, args.quick)?;
        bench.report.finish("slow")?;
    }
    Ok(())
}

/// The release binary with eBPF embedded when the toolchain is there, else userspace-only.
fn release_binary(ws: &Workspace) -> Result<PathBuf> {
    if let Err(err) = crate::build::run(&crate::build::Args {
        release: true,
        route: RouteArg { route: None },
    }) {
        eprintln!("bench: eBPF build failed ({err:#}); benchmarking the userspace-only binary");
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let status = std::process::Command::new(cargo)
            .args(["build", "--release", "-p", "ingress"])
            .current_dir(&ws.root)
            .status()?;
        anyhow::ensure!(status.success(), "cargo build --release -p ingress failed");
    }
    Ok(ws.target_dir.join("release").join("ingress"))
}

/// The median of a list of numbers (the upper one for an even count).
/// The first quartile, the median and the third quartile of `values`.
pub fn quartiles(mut values: Vec<f64>) -> [f64; 3] {
    values.sort_by(|a, b| a.total_cmp(b));
    let at = |q: usize| {
        values
            .get(values.len() * q / 4)
            .copied()
            .unwrap_or(f64::NAN)
    };
    [at(1), at(2), at(3)]
}

pub fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    values.get(values.len() / 2).copied().unwrap_or(f64::NAN)
}

pub fn write(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every slice runs each configuration once, and none runs twice in a row across the
    /// boundary of two slices (it would then start with its own caches warm).
    #[test]
    fn slices_turn_so_nothing_follows_itself() {
        for n in 3..=5 {
            let slices: Vec<Vec<usize>> = (0..16)
                .map(|r| Bench::slice_order(r, n).collect())
                .collect();
            for (r, order) in slices.iter().enumerate() {
                let mut sorted = order.clone();
                sorted.sort_unstable();
                assert_eq!(sorted, (0..n).collect::<Vec<_>>(), "slice {r} of {n}");
            }
            for pair in slices.windows(2) {
                assert_ne!(pair[0].last(), pair[1].first(), "{n}: {pair:?}");
            }
        }
    }

    #[test]
    fn quartiles_of_a_list() {
        assert_eq!(quartiles(vec![4.0, 1.0, 3.0, 2.0]), [2.0, 3.0, 4.0]);
        assert_eq!(quartiles(vec![1.0]), [1.0, 1.0, 1.0]);
        assert!(quartiles(Vec::new())[1].is_nan());
    }
}
