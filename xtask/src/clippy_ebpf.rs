//! `cargo xtask clippy-ebpf`: clippy for the eBPF crate on its real target. The host crates are
//! linted by plain `cargo clippy`; linting them together would unify features and hide problems.

use anyhow::{Context, Result, bail};

use crate::toolchain::{RouteArg, Toolchain};
use crate::workspace::Workspace;

pub fn run(args: &RouteArg) -> Result<()> {
    let ws = Workspace::locate()?;
    let toolchain = Toolchain::detect(args.route)?;
    // Its own target dir: clippy's driver and flags would otherwise invalidate build-ebpf's cache.
    let target_dir = ws.target_dir.join("ebpf-clippy");
    let status = toolchain
        .cargo("clippy")
        .args(["--package", "ingress-ebpf", "--bins", "--target-dir"])
        .arg(&target_dir)
        .args(["--", "-D", "warnings"])
        .current_dir(&ws.root)
        .status()
        .context("running cargo clippy for the eBPF crate")?;
    if !status.success() {
        bail!("clippy found problems in ingress-ebpf ({status})");
    }
    Ok(())
}
