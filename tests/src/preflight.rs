//! Whether this machine can run a root or kernel test: one rule for every test file. Without
//! what a test needs it prints a loud skip notice and passes, except under `CI=true`, where a
//! test that could not run is a failure (a skipped kernel suite must never look green there).

use std::path::Path;
use std::process::Command;
use std::sync::OnceLock;

use crate::modes::Mode;

/// What a test needs from the machine, each level including the one before.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Needs {
    /// Root: network namespaces, veth links, iptables.
    Root,
    /// Root and kernel BTF: loading the gate from the library (which reports a missing eBPF
    /// object itself, at load).
    Kernel,
    /// Root, BTF and an `ingress` binary that carries its eBPF object: the real proxy in
    /// `--mode ebpf`.
    KernelBinary,
}

impl Needs {
    /// What the real proxy in `mode` needs: userspace mode only needs the namespaces.
    pub fn proxy(mode: Mode) -> Needs {
        match mode {
            Mode::Ebpf => Needs::KernelBinary,
            Mode::Userspace => Needs::Root,
        }
    }
}

/// True when the test can run; otherwise skips (see [`skip_or_fail`]) and returns false.
pub fn preflight(needs: Needs) -> bool {
    match missing(needs) {
        None => true,
        Some(why) => {
            skip_or_fail(&why);
            false
        }
    }
}

/// True when `program` is on `PATH` (`cargo xtask setup` installs every one the tests run);
/// otherwise skips, or fails under CI=true, and returns false.
pub fn preflight_tool(program: &str) -> bool {
    let found = std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(program).is_file()));
    if !found {
        skip_or_fail(&format!(
            "{program} is not installed (cargo xtask setup installs it)"
        ));
    }
    found
}

/// Skips the calling test with a loud notice, or, under CI=true, fails it.
pub fn skip_or_fail(why: &str) {
    // libtest names each test's thread after the test (unless it runs them all on main).
    let current = std::thread::current();
    let test = current
        .name()
        .filter(|name| *name != "main")
        .unwrap_or("kernel test");
    if crate::in_ci() {
        panic!("{test} cannot run under CI=true: {why}");
    }
    eprintln!("\n**************** SKIPPED {test}: {why} ****************\n");
}

fn missing(needs: Needs) -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not root".into());
    }
    if needs >= Needs::Kernel && !Path::new("/sys/kernel/btf/vmlinux").exists() {
        return Some("the kernel has no BTF".into());
    }
    if needs >= Needs::KernelBinary {
        let version = binary_version();
        if !version.contains("(eBPF object embedded)") {
            return Some(format!(
                "the ingress binary carries no eBPF object ({version}); run `cargo xtask build` first"
            ));
        }
    }
    None
}

/// `ingress version`, asked once per test binary.
fn binary_version() -> &'static str {
    static VERSION: OnceLock<String> = OnceLock::new();
    VERSION.get_or_init(|| {
        let out = Command::new(crate::process::binary())
            .arg("version")
            .output()
            .expect("ingress version");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    })
}
