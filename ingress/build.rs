//! Embeds the eBPF object when one has been built, so one binary carries its kernel programs.
//!
//! Looks for `INGRESS_EBPF_OBJECT`, else `<target dir>/ebpf-object/ingress-ebpf.o` (where
//! `cargo xtask build-ebpf` writes it). Without either, the binary is userspace-only:
//! `gate::EMBEDDED_OBJECT` is `None` and no eBPF toolchain is needed to build it.

use std::env;
use std::path::{Path, PathBuf};

const OBJECT_ENV: &str = "INGRESS_EBPF_OBJECT";
const OBJECT_DIR: &str = "ebpf-object";
const OBJECT_FILE: &str = "ingress-ebpf.o";

fn main() {
    println!("cargo:rerun-if-env-changed={OBJECT_ENV}");
    let object = match env::var_os(OBJECT_ENV) {
        Some(path) => {
            let path = PathBuf::from(path);
            if !path.is_file() {
                panic!("{OBJECT_ENV}={} is not a file", path.display());
            }
            println!("cargo:rerun-if-changed={}", path.display());
            Some(path)
        }
        None => {
            let dir = target_dir().join(OBJECT_DIR);
            // Watching a directory that exists (even empty) reruns this script when the object
            // appears or changes; watching a missing path would rerun it on every build.
            let _ = std::fs::create_dir_all(&dir);
            println!("cargo:rerun-if-changed={}", dir.display());
            Some(dir.join(OBJECT_FILE)).filter(|p| p.is_file())
        }
    };
    if let Some(path) = object {
        println!("cargo:rustc-cfg=ebpf_embedded");
        println!(
            "cargo:rustc-env=INGRESS_EBPF_OBJECT_PATH={}",
            path.display()
        );
    }
}

/// Cargo's target directory: the ancestor of OUT_DIR that cargo marked with CACHEDIR.TAG, which
/// works however the directory was chosen (flag, environment or config file).
fn target_dir() -> PathBuf {
    let out = env::var_os("OUT_DIR")
        .map(PathBuf::from)
        .unwrap_or_default();
    if let Some(dir) = out.ancestors().find(|a| a.join("CACHEDIR.TAG").is_file()) {
        return dir.to_path_buf();
    }
    if let Some(dir) = env::var_os("CARGO_TARGET_DIR") {
        return PathBuf::from(dir);
    }
    let manifest = env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_default();
    manifest.parent().unwrap_or(Path::new(".")).join("target")
}
