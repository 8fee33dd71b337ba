//! Where things live: the workspace root, cargo's target directory, and the stable path of the
//! built eBPF object that `ingress/build.rs` looks for.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

/// The object's directory under the target directory. `ingress/build.rs` uses the same name.
pub const OBJECT_DIR: &str = "ebpf-object";
pub const OBJECT_FILE: &str = "ingress-ebpf.o";
/// The eBPF crate's own cargo target directory, under the host one: its `-Z build-std` artifacts
/// and flags must never invalidate the host build's.
pub const EBPF_TARGET_DIR: &str = "ebpf";

pub struct Workspace {
    pub root: PathBuf,
    pub target_dir: PathBuf,
}

impl Workspace {
    /// Asks cargo, so `CARGO_TARGET_DIR` and `build.target-dir` in any config file both count.
    pub fn locate() -> Result<Workspace> {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .context("xtask is not inside a workspace")?
            .to_path_buf();
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let output = Command::new(&cargo)
            .args(["metadata", "--no-deps", "--format-version", "1"])
            .current_dir(&root)
            .output()
            .context("running cargo metadata")?;
        if !output.status.success() {
            bail!(
                "cargo metadata failed: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        let metadata: serde_json::Value =
            serde_json::from_slice(&output.stdout).context("parsing cargo metadata")?;
        let target_dir = metadata
            .get("target_directory")
            .and_then(|v| v.as_str())
            .context("cargo metadata has no target_directory")?;
        Ok(Workspace {
            root,
            target_dir: PathBuf::from(target_dir),
        })
    }

    pub fn ebpf_target_dir(&self) -> PathBuf {
        self.target_dir.join(EBPF_TARGET_DIR)
    }

    pub fn object_path(&self) -> PathBuf {
        self.target_dir.join(OBJECT_DIR).join(OBJECT_FILE)
    }
}
