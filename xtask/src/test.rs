//! `cargo xtask test`: everything CI checks, in the order that fails fastest.
//!
//! 1. `cargo fmt --check` (every crate, the eBPF one included);
//! 2. the dependency checks, a second each (`crate::deps`): `cargo machete` for unused
//!    dependencies, `cargo deny check licenses bans sources` against deny.toml, and
//!    `cargo deny check advisories` when the RustSec database can be fetched in time;
//! 3. clippy `-D warnings` on the host crates, then on the eBPF crate for its own target;
//! 4. the eBPF object, then the ingress binary with it embedded;
//! 5. the fuzz targets (cargo-fuzz on nightly), built but not run;
//! 6. `cargo test` for the host crates, kernel tests included (they fail rather than skip when
//!    `CI=true` and eBPF cannot load), and the fuzz corpora as ordinary tests.
//!
//! Outside CI a missing tool (eBPF toolchain, cargo-fuzz, cargo-machete, cargo-deny) is a
//! warning and its step is skipped; with `CI=true` it fails the run. `cargo xtask setup`
//! installs them all.

use std::process::Command;

use anyhow::{Result, bail};

use crate::toolchain::RouteArg;
use crate::workspace::Workspace;

#[derive(clap::Args)]
pub struct Args {
    /// Extra arguments for `cargo test` (after `--`), e.g. a test name filter.
    #[arg(last = true)]
    pub cargo_test_args: Vec<String>,
}

pub fn run(args: &Args) -> Result<()> {
    let ws = Workspace::locate()?;
    let ci = std::env::var("CI").is_ok_and(|v| v == "true" || v == "1");
    let cargo = || {
        let mut cmd = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
        cmd.current_dir(&ws.root);
        cmd
    };
    step(
        "cargo fmt --check",
        cargo().args(["fmt", "--all", "--check"]),
    )?;
    let dependency_checks: [(&str, fn(&Workspace) -> Result<()>); 2] = [
        ("machete", crate::deps::machete),
        ("deny", crate::deps::deny),
    ];
    for (tool, check) in dependency_checks {
        if !ci && !crate::setup::cargo_tool_installed(tool) {
            eprintln!("warning: cargo-{tool} is not installed (cargo xtask setup); skipped");
            continue;
        }
        check(&ws)?;
    }
    step(
        "clippy (host crates)",
        cargo().args(["clippy", "--all-targets", "--", "-D", "warnings"]),
    )?;
    match crate::clippy_ebpf::run(&RouteArg { route: None }) {
        Ok(()) => {}
        Err(err) if !ci => eprintln!("warning: clippy for the eBPF crate skipped: {err:#}"),
        Err(err) => return Err(err.context("clippy for the eBPF crate")),
    }
    match crate::build::run(&crate::build::Args {
        release: false,
        route: RouteArg { route: None },
    }) {
        Ok(()) => {}
        Err(err) if !ci => eprintln!(
            "warning: no eBPF toolchain ({err:#}); kernel tests will report themselves skipped"
        ),
        Err(err) => return Err(err.context("building the eBPF object")),
    }
    eprintln!("==> fuzz targets (build only)");
    match crate::fuzz::build(&ws) {
        Ok(()) => {}
        Err(err) if !ci => eprintln!("warning: fuzz targets not built: {err:#}"),
        Err(err) => return Err(err.context("building the fuzz targets")),
    }
    step(
        "cargo test",
        // One failing test binary must not hide the others' results from a CI log.
        cargo()
            .args(["test", "--no-fail-fast", "--"])
            .args(&args.cargo_test_args),
    )?;
    Ok(())
}

fn step(name: &str, cmd: &mut Command) -> Result<()> {
    eprintln!("==> {name}");
    let status = cmd.status()?;
    if !status.success() {
        bail!("{name} failed ({status})");
    }
    Ok(())
}
