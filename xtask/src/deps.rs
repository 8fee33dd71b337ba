//! The dependency checks `cargo xtask test` runs right after `cargo fmt`, since both take about a
//! second and need no build:
//!
//! ```text
//!   cargo machete --skip-target-dir     a dependency no source file names (fuzz crate included)
//!   cargo deny check licenses bans sources
//!                                       deny.toml: allowed licenses, no avoidable duplicate
//!                                       versions, crates.io only
//!   cargo deny check advisories         only when `cargo deny fetch db` gets the RustSec
//!                                       database within FETCH_LIMIT; otherwise one line says so
//! ```
//!
//! `cargo xtask setup` installs both tools (see [`crate::setup::CARGO_TOOLS`]).

use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::workspace::Workspace;

/// How long the advisory database may take to fetch. A clone of it takes seconds where the
/// network reaches github.com; where it does not, the fetch fails at once or hangs.
const FETCH_LIMIT: Duration = Duration::from_secs(60);

fn cargo(ws: &Workspace) -> Command {
    let mut cmd = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    // cargo-machete takes CARGO_PKG_NAME (which `cargo run` set for xtask) to mean it was run
    // directly rather than as `cargo machete`, and then reads "machete" as a path.
    cmd.current_dir(&ws.root).env_remove("CARGO_PKG_NAME");
    cmd
}

/// Unused dependencies. machete reads sources rather than building, so it can be wrong both
/// ways; a false positive goes in `[package.metadata.cargo-machete] ignored`, with a reason.
pub fn machete(ws: &Workspace) -> Result<()> {
    run(
        "cargo machete",
        cargo(ws).args(["machete", "--skip-target-dir"]),
    )
}

/// deny.toml's licenses, bans and sources always; advisories if the database can be had.
pub fn deny(ws: &Workspace) -> Result<()> {
    run(
        "cargo deny check licenses bans sources",
        cargo(ws).args(["deny", "check", "licenses", "bans", "sources"]),
    )?;
    match fetch_advisory_db(ws) {
        Ok(()) => run(
            "cargo deny check advisories",
            cargo(ws).args(["deny", "--offline", "check", "advisories"]),
        ),
        Err(why) => {
            eprintln!("==> cargo deny check advisories skipped: no RustSec database ({why})");
            Ok(())
        }
    }
}

/// `cargo deny fetch db`, killed (with the git it runs) if it outlasts [`FETCH_LIMIT`].
fn fetch_advisory_db(ws: &Workspace) -> Result<(), String> {
    let mut child = cargo(ws)
        .args(["deny", "fetch", "db"])
        // git must fail rather than ask for credentials.
        .env("GIT_TERMINAL_PROMPT", "0")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        // Its own process group, so a timeout ends cargo, cargo-deny and git together.
        .process_group(0)
        .spawn()
        .map_err(|e| format!("running cargo deny fetch db: {e}"))?;
    let deadline = Instant::now() + FETCH_LIMIT;
    loop {
        match child.try_wait() {
            Ok(Some(status)) if status.success() => return Ok(()),
            Ok(Some(status)) => return Err(format!("cargo deny fetch db failed, {status}")),
            Ok(None) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(100));
            }
            Ok(None) => {
                if let Ok(pgid) = i32::try_from(child.id()) {
                    // SAFETY: kill has no memory preconditions; the group is the child's own
                    // (process_group(0) above) and the child is not yet reaped, so its id and
                    // group id cannot have been reused.
                    unsafe { libc::kill(-pgid, libc::SIGKILL) };
                }
                let _ = child.wait();
                return Err(format!(
                    "cargo deny fetch db took over {}s",
                    FETCH_LIMIT.as_secs()
                ));
            }
            Err(e) => return Err(format!("waiting for cargo deny fetch db: {e}")),
        }
    }
}

fn run(name: &str, cmd: &mut Command) -> Result<()> {
    eprintln!("==> {name}");
    let status = cmd
        .status()
        .with_context(|| format!("running {name} (cargo xtask setup installs it)"))?;
    if !status.success() {
        bail!("{name} failed ({status})");
    }
    Ok(())
}
