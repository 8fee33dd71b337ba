//! `cargo xtask build-ebpf`: compile ingress-ebpf, make its name fields readable in bpftool
//! (see `btf`), check the result parses as aya will load it, and put it where
//! `ingress/build.rs` finds it.

use std::fs;
use std::path::PathBuf;

use anyhow::{Context, Result, bail};

use crate::btf;
use crate::toolchain::{RouteArg, TARGET, Toolchain};
use crate::workspace::Workspace;

#[derive(clap::Args)]
pub struct Args {
    /// Accepted for symmetry with `build`: the eBPF object is always optimised, because the
    /// verifier rejects what an unoptimised build emits.
    #[arg(long)]
    pub release: bool,
    #[command(flatten)]
    pub route: RouteArg,
}

/// Builds the object and returns its stable path.
pub fn run(args: &Args) -> Result<PathBuf> {
    let ws = Workspace::locate()?;
    let toolchain = Toolchain::detect(args.route.route)?;
    eprintln!(
        "building ingress-ebpf for {TARGET} ({:?} route)",
        toolchain.route
    );
    let target_dir = ws.ebpf_target_dir();
    let status = toolchain
        .cargo("build")
        .args([
            "--package",
            "ingress-ebpf",
            "--bins",
            "--release",
            "--target-dir",
        ])
        .arg(&target_dir)
        // BTF for maps and programs: debug info in, BTF out of bpf-linker. CPU v3 (kernel 5.1+,
        // far below what the gate needs anyway) for the atomic compare-and-swap the workspace
        // claims rely on (see ingress-ebpf/src/work.rs).
        .env(
            "CARGO_ENCODED_RUSTFLAGS",
            "-Cdebuginfo=2\x1f-Clink-arg=--btf\x1f-Ctarget-cpu=v3",
        )
        .current_dir(&ws.root)
        .status()
        .context("running cargo for the eBPF crate")?;
    if !status.success() {
        bail!("building ingress-ebpf failed ({status})");
    }
    let built = target_dir.join(TARGET).join("release").join("ingress-ebpf");
    let elf = fs::read(&built).with_context(|| format!("reading {}", built.display()))?;
    let elf = btf::mark_name_fields(&elf, &btf::NAME_FIELDS)
        .with_context(|| format!("rewriting the BTF of {}", built.display()))?;
    aya_obj::Object::parse(&elf).context("the rewritten object no longer parses")?;

    let object = ws.object_path();
    // Rewriting an identical file would still bump its mtime and rebuild the ingress crate.
    if fs::read(&object).ok().as_deref() != Some(elf.as_slice()) {
        let dir = object.parent().context("object path has no parent")?;
        fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let tmp = object.with_extension("o.tmp");
        fs::write(&tmp, &elf).with_context(|| format!("writing {}", tmp.display()))?;
        fs::rename(&tmp, &object).with_context(|| format!("writing {}", object.display()))?;
    }
    eprintln!("eBPF object: {}", object.display());
    Ok(object)
}
