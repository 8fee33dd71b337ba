//! How to compile Rust for `bpfel-unknown-none` here. Two routes, both needing `-Z build-std=core`
//! (so the core library's sources) and bpf-linker:
//!
//! - rustup: a nightly toolchain with the `rust-src` component — the usual developer laptop.
//! - debian: Debian's `rustc-web` (a stable rustc, unlocked with `RUSTC_BOOTSTRAP=1`) with its
//!   sources from `rust-web-src`, and `cargo-web`. This is what `cargo xtask setup` installs.
//!
//! `auto` takes the first route that is complete, rustup first.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

pub const TARGET: &str = "bpfel-unknown-none";
const DEBIAN_RUSTC: &str = "/usr/bin/rustc";
const DEBIAN_CARGO: &str = "/usr/bin/cargo";
const DEBIAN_CARGO_CLIPPY: &str = "/usr/bin/cargo-clippy";
const NIGHTLY: &str = "nightly";
const INSTALL_RUST_SRC: &str =
    "install rust-src: rustup component add rust-src --toolchain nightly";

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Route {
    Debian,
    Rustup,
}

#[derive(clap::Args)]
pub struct RouteArg {
    /// Force a toolchain route instead of detecting one.
    #[arg(long, value_enum)]
    pub route: Option<Route>,
}

pub struct Toolchain {
    pub route: Route,
}

impl Toolchain {
    pub fn detect(forced: Option<Route>) -> Result<Toolchain> {
        let linker = bpf_linker();
        let route = match forced {
            Some(Route::Rustup) => {
                rustup_problem().map_or(Ok(()), |p| Err(anyhow::anyhow!("rustup route: {p}")))?;
                Route::Rustup
            }
            Some(Route::Debian) => {
                debian_problem().map_or(Ok(()), |p| Err(anyhow::anyhow!("debian route: {p}")))?;
                Route::Debian
            }
            None => match (rustup_problem(), debian_problem()) {
                (None, _) => Route::Rustup,
                (Some(_), None) => Route::Debian,
                (Some(rustup), Some(debian)) => bail!(
                    "no toolchain can build for {TARGET}:\n  rustup route: {rustup}\n  debian \
                     route: {debian} (`cargo xtask setup` installs it)"
                ),
            },
        };
        if linker.is_none() {
            bail!(
                "bpf-linker is not on PATH or in ~/.cargo/bin; install it with `cargo install \
                 bpf-linker` (on Debian: `cargo xtask setup`)"
            );
        }
        Ok(Toolchain { route })
    }

    /// `cargo <subcommand>` for the BPF target, with the route's compiler and a clean
    /// environment (the outer `cargo xtask` leaves rustup and flag variables behind).
    pub fn cargo(&self, subcommand: &str) -> Command {
        let mut cmd = match self.route {
            Route::Rustup => {
                let mut cmd = Command::new("rustup");
                cmd.args(["run", NIGHTLY, "cargo", subcommand]);
                cmd
            }
            Route::Debian if subcommand == "clippy" => {
                // Debian's cargo-clippy drives its own clippy-driver, matching /usr/bin/rustc.
                let mut cmd = Command::new(DEBIAN_CARGO_CLIPPY);
                cmd.arg("clippy").env("CARGO", DEBIAN_CARGO);
                cmd
            }
            Route::Debian => {
                let mut cmd = Command::new(DEBIAN_CARGO);
                cmd.arg(subcommand);
                cmd
            }
        };
        for var in [
            "RUSTC",
            "RUSTC_WRAPPER",
            "RUSTC_WORKSPACE_WRAPPER",
            "RUSTFLAGS",
            "CARGO_ENCODED_RUSTFLAGS",
            "CARGO_BUILD_RUSTFLAGS",
            "CARGO_TARGET_DIR",
            "RUSTUP_TOOLCHAIN",
        ] {
            cmd.env_remove(var);
        }
        if self.route == Route::Debian {
            cmd.env("RUSTC", DEBIAN_RUSTC).env("RUSTC_BOOTSTRAP", "1");
        }
        if let Some(dir) = bpf_linker().and_then(|l| l.parent().map(Path::to_path_buf)) {
            cmd.env("PATH", path_with(&dir));
        }
        cmd.args(["--target", TARGET, "-Z", "build-std=core"]);
        cmd
    }
}

/// Why the rustup route cannot build, or `None` if it can.
fn rustup_problem() -> Option<String> {
    let sysroot = match output(
        Command::new("rustup").args(["run", NIGHTLY, "rustc", "--print", "sysroot"]),
    ) {
        Ok(s) => s,
        Err(_) => {
            return Some("no rustup nightly toolchain (rustup toolchain install nightly)".into());
        }
    };
    if !has_core_sources(Path::new(&sysroot)) {
        return Some(INSTALL_RUST_SRC.into());
    }
    None
}

/// Why the Debian route cannot build, or `None` if it can.
fn debian_problem() -> Option<String> {
    if !Path::new(DEBIAN_RUSTC).exists() || !Path::new(DEBIAN_CARGO).exists() {
        return Some(format!(
            "no {DEBIAN_RUSTC} and {DEBIAN_CARGO} (packages rustc-web, cargo-web)"
        ));
    }
    let sysroot = match output(Command::new(DEBIAN_RUSTC).args(["--print", "sysroot"])) {
        Ok(s) => s,
        Err(e) => return Some(format!("{DEBIAN_RUSTC} --print sysroot: {e:#}")),
    };
    if !has_core_sources(Path::new(&sysroot)) {
        return Some(format!(
            "no core library sources under {sysroot} (package rust-web-src)"
        ));
    }
    None
}

fn has_core_sources(sysroot: &Path) -> bool {
    sysroot
        .join("lib/rustlib/src/rust/library/core/Cargo.toml")
        .is_file()
}

/// bpf-linker on PATH, else where `cargo install` puts it.
pub fn bpf_linker() -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(home_cargo_bin())
        .map(|dir| dir.join("bpf-linker"))
        .find(|p| p.is_file())
}

fn home_cargo_bin() -> Option<PathBuf> {
    std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cargo")))
        .map(|c| c.join("bin"))
}

fn path_with(dir: &Path) -> OsString {
    let current = std::env::var_os("PATH").unwrap_or_default();
    let dirs = std::iter::once(dir.to_path_buf()).chain(std::env::split_paths(&current));
    std::env::join_paths(dirs).unwrap_or(current)
}

fn output(cmd: &mut Command) -> Result<String> {
    let out = cmd.output().with_context(|| format!("running {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}
