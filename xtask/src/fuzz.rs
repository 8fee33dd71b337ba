//! The fuzz targets in `ingress/fuzz` (their own workspace: nightly, sanitizer flags), built
//! with cargo-fuzz. `cargo xtask test` builds them, so a change that breaks a target fails CI
//! even though nobody fuzzes in CI; `cargo xtask fuzz TARGET` runs one for a while.

use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, bail};

use crate::workspace::Workspace;

/// Every target, as named in `ingress/fuzz/Cargo.toml`.
pub const TARGETS: &[&str] = &["client_hello", "h1_differential"];

#[derive(clap::Args)]
pub struct Args {
    /// The target to run.
    #[arg(value_parser = clap::builder::PossibleValuesParser::new(TARGETS))]
    pub target: String,
    /// How long to run it.
    #[arg(long, default_value = "5m", value_parser = humantime::parse_duration)]
    pub time: Duration,
}

fn cargo_fuzz(ws: &Workspace) -> Command {
    let mut cmd = Command::new("cargo");
    cmd.arg("+nightly")
        .arg("fuzz")
        .current_dir(ws.root.join("ingress/fuzz"))
        // rustup's proxy picks the toolchain; the one that runs xtask must not leak into it.
        .env_remove("RUSTC")
        .env_remove("RUSTUP_TOOLCHAIN")
        .env_remove("CARGO");
    cmd
}

/// Builds every fuzz target.
pub fn build(ws: &Workspace) -> Result<()> {
    for target in TARGETS {
        let status = cargo_fuzz(ws)
            .args(["build", target])
            .status()
            .context("running cargo +nightly fuzz (cargo xtask setup installs cargo-fuzz)")?;
        if !status.success() {
            bail!("building the fuzz target {target} failed ({status})");
        }
    }
    Ok(())
}

/// Runs one target on its seed corpus, keeping what it finds in a scratch corpus.
pub fn run(args: &Args) -> Result<()> {
    let ws = Workspace::locate()?;
    let scratch = ws.target_dir.join("fuzz-corpus").join(&args.target);
    std::fs::create_dir_all(&scratch)?;
    let seeds = format!("corpus/{}", args.target);
    let status = cargo_fuzz(&ws)
        .args(["run", &args.target])
        .arg(&scratch)
        .arg(&seeds)
        .arg("--")
        .arg(format!("-max_total_time={}", args.time.as_secs()))
        .status()?;
    if !status.success() {
        bail!(
            "the fuzzer stopped on a finding ({status}); see ingress/fuzz/artifacts/{}",
            args.target
        );
    }
    Ok(())
}
