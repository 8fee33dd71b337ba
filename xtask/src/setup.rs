//! `cargo xtask setup`: install what the Debian eBPF route and the tests need. Idempotent and
//! silent when nothing is missing; otherwise it says what it runs, and runs `apt-get update` at
//! most once.
//!
//! ```text
//!   Debian packages   PACKAGES: the compiler route, then the tools tests and benchmarks drive
//!   cargo tools       CARGO_TOOLS: cargo-fuzz, cargo-machete, cargo-deny (cargo install --locked)
//!   Python packages   PYTHON_PACKAGES: grpcio, the gRPC stack on both sides of tests/grpc.rs
//!   bpf-linker        built against the Debian LLVM
//! ```
//!
//! On a fresh machine the cargo tools are a few minutes of setup's time (docs/development.md
//! has the measured figures).

use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::toolchain::bpf_linker;

/// Debian packages: the compiler route (rustc, cargo, core sources, clippy, the LLVM that
/// bpf-linker links against), then the tools the tests and benchmarks drive.
pub const PACKAGES: &[&str] = &[
    "rustc-web",
    "cargo-web",
    "rust-web-src",
    "rust-web-clippy",
    "llvm-22-dev",
    "libpolly-22-dev",
    // Everything from here on is only for tests and benchmarks.
    "nginx",
    "haproxy",
    "wrk",
    "nghttp2-client",
    // nghttpd: the gRPC bench's peer that answers from files, so the proxies are what is busy.
    "nghttp2-server",
    "curl",
    "openssl",
    "kubectl",
    "bpftool",
    "chromium",
    "iproute2",
    // Veth offloads off (ethtool), and the node firewall the gate's refusals must get through.
    "ethtool",
    "iptables",
    // The dashboard and alert queries in deploy/monitoring are checked by a real Prometheus
    // (and promtool, in the same package).
    "prometheus",
];

/// Cargo subcommands the checks run, and the crates that provide them: cargo-fuzz builds the
/// fuzz targets, machete and deny check the dependencies (`crate::deps`).
pub const CARGO_TOOLS: &[(&str, &str)] = &[
    ("fuzz", "cargo-fuzz"),
    ("machete", "cargo-machete"),
    ("deny", "cargo-deny"),
];

/// Python modules the tests import, and the PyPI packages that provide them (`pip install
/// --user` when the module does not import; Debian's python3-grpcio is years older).
pub const PYTHON_PACKAGES: &[(&str, &str)] = &[("grpc", "grpcio")];

/// Release-profile overrides for `cargo install`: these are tools, and how fast they build
/// matters more on a fresh CI machine than how fast they run (about a second each here).
const FAST_INSTALL: &[(&str, &str)] = &[
    ("CARGO_PROFILE_RELEASE_LTO", "off"),
    ("CARGO_PROFILE_RELEASE_CODEGEN_UNITS", "16"),
];

/// How many of [`PACKAGES`] the eBPF build itself needs.
const BUILD_PACKAGES: usize = 6;

const LLVM_PREFIX: &str = "/usr/lib/llvm-22";

#[derive(clap::Args)]
pub struct Args {
    /// Only what building the eBPF object needs, not the test and benchmark tools (for images).
    #[arg(long)]
    pub build_only: bool,
}

pub fn run(args: &Args) -> Result<()> {
    if !Path::new("/usr/bin/dpkg-query").exists() {
        bail!(
            "setup only knows Debian; elsewhere install a nightly toolchain with rust-src and \
             bpf-linker (`cargo install bpf-linker`), then use `--route rustup`"
        );
    }
    let wanted = if args.build_only {
        &PACKAGES[..BUILD_PACKAGES]
    } else {
        PACKAGES
    };
    let missing: Vec<&str> = wanted.iter().copied().filter(|p| !installed(p)).collect();
    if !missing.is_empty() {
        run_root(Command::new("apt-get").arg("update").arg("-q"))?;
        run_root(
            Command::new("apt-get")
                .args(["install", "-y", "-q", "--no-install-recommends"])
                .args(&missing)
                .env("DEBIAN_FRONTEND", "noninteractive"),
        )?;
    }
    if !args.build_only {
        for (module, package) in PYTHON_PACKAGES {
            if !python_module_installed(module) {
                let pip = |extra: &[&str]| {
                    run_shown(
                        Command::new("python3")
                            .args(["-m", "pip", "install", "--user", "--quiet"])
                            .args(extra)
                            .arg(package),
                    )
                };
                // Debian's own python3 refuses user installs without the flag (PEP 668); a
                // pyenv or venv python takes them, and older pips do not know the flag.
                if pip(&[]).is_err() {
                    pip(&["--break-system-packages"])?;
                }
            }
        }
        for (subcommand, krate) in CARGO_TOOLS {
            if !cargo_tool_installed(subcommand) {
                let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
                run_shown(
                    Command::new(cargo)
                        .args(["install", krate, "--locked"])
                        .envs(FAST_INSTALL.iter().copied()),
                )?;
            }
        }
    }
    if bpf_linker().is_none() {
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        run_shown(
            Command::new(cargo)
                .args([
                    "install",
                    "bpf-linker",
                    "--no-default-features",
                    "--features",
                    "llvm-22",
                ])
                .env("LLVM_PREFIX", LLVM_PREFIX),
        )?;
    }
    Ok(())
}

/// Whether `cargo <subcommand>` runs (every tool in [`CARGO_TOOLS`] answers `--version`).
pub fn cargo_tool_installed(subcommand: &str) -> bool {
    Command::new("cargo")
        .args([subcommand, "--version"])
        // Set by `cargo run` for xtask; cargo-machete would take it to mean it was run directly.
        .env_remove("CARGO_PKG_NAME")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Whether `python3 -c "import MODULE"` works.
fn python_module_installed(module: &str) -> bool {
    Command::new("python3")
        .args(["-c", &format!("import {module}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Asks dpkg's database rather than apt, which would take its lock and print.
fn installed(package: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${db:Status-Status}", package])
        .output()
        .is_ok_and(|o| o.status.success() && o.stdout == b"installed")
}

fn run_root(cmd: &mut Command) -> Result<()> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        return run_shown(cmd);
    }
    // sudo resets the environment, so variables travel as `env K=V` arguments.
    let mut sudo = Command::new("sudo");
    sudo.arg("env");
    for (key, value) in cmd.get_envs() {
        if let Some(value) = value {
            let mut pair = key.to_os_string();
            pair.push("=");
            pair.push(value);
            sudo.arg(pair);
        }
    }
    sudo.arg(cmd.get_program()).args(cmd.get_args());
    run_shown(&mut sudo)
}

fn run_shown(cmd: &mut Command) -> Result<()> {
    eprintln!("setup: {}", describe(cmd));
    let status = cmd
        .status()
        .with_context(|| format!("running {}", describe(cmd)))?;
    if !status.success() {
        bail!("{} failed ({status})", describe(cmd));
    }
    Ok(())
}

fn describe(cmd: &Command) -> String {
    let env = cmd
        .get_envs()
        .filter_map(|(k, v)| Some(format!("{}={} ", k.to_string_lossy(), v?.to_string_lossy())));
    let args = cmd.get_args().map(|a| a.to_string_lossy().into_owned());
    let program = cmd.get_program().to_string_lossy().into_owned();
    env.chain(std::iter::once(program))
        .chain(args.map(|a| format!(" {a}")))
        .collect()
}
