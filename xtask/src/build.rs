//! `cargo xtask build`: the eBPF object, then the ingress binary with it embedded.

use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::build_ebpf;
use crate::toolchain::RouteArg;
use crate::workspace::Workspace;

#[derive(clap::Args)]
pub struct Args {
    /// Build the ingress binary with the release profile.
    #[arg(long)]
    pub release: bool,
    #[command(flatten)]
    pub route: RouteArg,
}

pub fn run(args: &Args) -> Result<()> {
    let object = build_ebpf::run(&build_ebpf::Args {
        release: args.release,
        route: RouteArg {
            route: args.route.route,
        },
    })?;
    let ws = Workspace::locate()?;
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.args(["build", "--package", "ingress"])
        // Named explicitly so the embed does not depend on build.rs finding the target dir.
        .env("INGRESS_EBPF_OBJECT", &object)
        .current_dir(&ws.root);
    if args.release {
        cmd.arg("--release");
    }
    let status = cmd.status().context("running cargo build")?;
    if !status.success() {
        bail!("building ingress failed ({status})");
    }
    Ok(())
}
