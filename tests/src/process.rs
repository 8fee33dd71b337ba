//! The real `ingress` binary as a child process: built once per test run, started with the
//! flags a test asks for, and killed when the handle drops. Every test starts it here, whether
//! on free loopback ports or on fixed ports inside a network namespace, behind a wrapper
//! (`setpriv`, `taskset`) or not.
//!
//! Ready means this process says so (`/readyz` answers `ready`) while it is alive: a port handed
//! out by `free_port` can be taken by another test's listener before ingress binds it, and that
//! listener may answer too; a process that exited will never be ready.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::modes::Mode;
use crate::pins::PinDir;
use crate::ports::free_port;
use crate::scrape::Scrape;
use crate::scratch::Scratch;

/// Path of the `ingress` binary, built on first use with the same Cargo the tests run under,
/// so `cargo test` alone is enough. `INGRESS_BIN` overrides it.
pub fn binary() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        if let Ok(path) = std::env::var("INGRESS_BIN") {
            return PathBuf::from(path);
        }
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .expect("workspace root");
        let status = Command::new(cargo)
            .args(["build", "-q", "-p", "ingress", "--bin", "ingress"])
            .current_dir(workspace)
            .status()
            .expect("run cargo build for the ingress binary");
        assert!(status.success(), "building the ingress binary failed");
        let target = std::env::var("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|_| workspace.join("target"));
        let bin = target.join("debug").join("ingress");
        assert!(bin.exists(), "{} missing after build", bin.display());
        bin
    })
}

/// `ingress check --manifests DIR` and `flags` (`--output json`, `--configmap …`): what an
/// operator runs before deploying. Its output and exit code are the test's to judge.
pub fn check(manifests: &Path, flags: &[&str]) -> std::process::Output {
    Command::new(binary())
        .arg("check")
        .arg("--manifests")
        .arg(manifests)
        .args(flags)
        .output()
        .expect("run ingress check")
}

/// The ports an instance listens on. Inside a test's own network namespace they can be the real
/// ones; on the shared host they come from `free_port`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ports {
    pub http: u16,
    pub https: u16,
    pub admin: u16,
}

/// A running `ingress`.
pub struct Ingress {
    child: Option<Child>,
    pub http: SocketAddr,
    pub https: SocketAddr,
    pub admin: SocketAddr,
    pub log: PathBuf,
    /// The bpffs directory this instance pins its maps in, if it was given one.
    pub pin_dir: Option<PathBuf>,
    /// A pin directory the instance owns (eBPF mode without one given), removed on drop.
    _own_pins: Option<PinDir>,
    _scratch: Scratch,
}

/// Where an instance pins its maps.
enum Pins {
    /// Nowhere, unless the mode needs it: then a directory of its own.
    Default,
    /// A directory the test owns, kept across restarts.
    At(PathBuf),
}

/// Builder for a test instance.
pub struct IngressBuilder {
    manifests: Option<PathBuf>,
    kubeconfig: Option<PathBuf>,
    mode: &'static str,
    pins: Pins,
    args: Vec<String>,
    env: Vec<(String, String)>,
    wrapper: Vec<String>,
    wait_ready: bool,
    ready_within: Duration,
    bind: String,
    admin_bind: String,
    ports: Option<Ports>,
    log_level: String,
}

impl Ingress {
    pub fn builder() -> IngressBuilder {
        IngressBuilder {
            manifests: None,
            kubeconfig: None,
            mode: Mode::Userspace.flag(),
            pins: Pins::Default,
            args: Vec::new(),
            env: Vec::new(),
            wrapper: Vec::new(),
            wait_ready: true,
            ready_within: Duration::from_secs(20),
            bind: "127.0.0.1".into(),
            admin_bind: "127.0.0.1".into(),
            ports: None,
            log_level: std::env::var("INGRESS_TEST_LOG").unwrap_or_else(|_| "info".into()),
        }
    }

    /// Starts on `dir` with default flags and waits until ready.
    pub fn start(dir: &Path) -> Ingress {
        Ingress::builder().manifests(dir).start()
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(Child::id).unwrap_or_default()
    }

    /// Everything the process has logged so far.
    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until the log contains `needle` (the process writes its log from a background
    /// thread), for at most `timeout`.
    pub fn wait_for_log(&self, needle: &str, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            if self.logs().contains(needle) {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.http, path)
    }

    /// A plain GET to the admin port, returning (status, body). Uses a blocking std socket so it
    /// works from sync and async tests alike.
    pub fn admin_get(&self, path: &str) -> (u16, String) {
        crate::client::blocking_get(self.admin, path, "localhost")
    }

    pub fn metrics(&self) -> String {
        self.admin_get("/metrics").1
    }

    /// The value of the first sample of `name` whose labels contain every `labels` pair.
    pub fn metric(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        crate::client::metric_value(&self.metrics(), name, labels)
    }

    /// One `/metrics` answer; the scrape itself must succeed.
    pub fn scrape(&self) -> Scrape {
        let (status, body) = self.admin_get("/metrics");
        assert_eq!(status, 200, "/metrics; logs:\n{}", self.logs());
        Scrape(body)
    }

    pub fn wait_ready(&self, timeout: Duration) {
        if let Err(why) = self.try_wait_ready(timeout) {
            panic!("{why}; logs:\n{}", self.logs());
        }
    }

    fn try_wait_ready(&self, timeout: Duration) -> Result<(), String> {
        let deadline = Instant::now() + timeout;
        loop {
            if !alive(self.pid()) {
                return Err("ingress exited before it was ready".into());
            }
            if self.admin_get("/readyz") == (200, "ready\n".to_string()) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(format!("ingress not ready within {timeout:?}"));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Sends SIGTERM.
    pub fn terminate(&self) {
        if let Ok(pid) = libc::pid_t::try_from(self.pid()) {
            // SAFETY: signalling our own child; an error (it already exited) is ignored.
            unsafe { libc::kill(pid, libc::SIGTERM) };
        }
    }

    /// Sends `signal`, which must reach the process.
    pub fn signal(&self, signal: libc::c_int) {
        let pid = libc::pid_t::try_from(self.pid()).expect("pid");
        // SAFETY: signalling our own child, which has not been reaped yet.
        assert_eq!(unsafe { libc::kill(pid, signal) }, 0, "kill {pid}");
    }

    /// Waits for exit, returning the exit code.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<i32> {
        self.try_wait_exit(timeout).and_then(|status| status.code())
    }

    /// Waits for exit, which must come within `timeout`.
    pub fn exit_status(&mut self, timeout: Duration) -> ExitStatus {
        match self.try_wait_exit(timeout) {
            Some(status) => status,
            None => panic!(
                "ingress still running after {timeout:?}; logs:\n{}",
                self.logs()
            ),
        }
    }

    fn try_wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        let child = self.child.as_mut()?;
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                return Some(status);
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// CPU time (user + system) the process has used so far, from /proc/<pid>/stat.
    pub fn cpu_time(&self) -> Duration {
        let pid = self.pid();
        // A wrapper (INGRESS_BIN pointing at a script) would be measured instead of the proxy.
        let exe = std::fs::read_link(format!("/proc/{pid}/exe")).expect("the proxy's exe");
        assert_eq!(
            exe.file_name(),
            binary().file_name(),
            "pid {pid} is not the ingress binary itself"
        );
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("the proxy's stat");
        // Fields after the command name (which may hold spaces), counted from `state` (3rd).
        let fields: Vec<&str> = stat
            .rsplit_once(')')
            .expect("stat has a command name")
            .1
            .split_whitespace()
            .collect();
        let ticks = |field: usize| -> u64 { fields[field - 3].parse().expect("a tick count") };
        // SAFETY: sysconf has no preconditions.
        let per_second = u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) })
            .expect("a positive clock tick rate");
        Duration::from_millis((ticks(14) + ticks(15)) * 1000 / per_second)
    }

    /// Open file descriptors, not counting sockets on local port `except` (the admin port,
    /// whose scrapes come and go on their own schedule).
    pub fn open_fds(&self, except: u16) -> usize {
        let pid = self.pid();
        let port = format!(":{except:04X} ");
        let mut skipped = std::collections::HashSet::new();
        for table in ["tcp", "tcp6"] {
            let text =
                std::fs::read_to_string(format!("/proc/{pid}/net/{table}")).unwrap_or_default();
            for line in text.lines().skip(1) {
                let fields: Vec<&str> = line.split_whitespace().collect();
                // local_address is the 2nd field, inode the 10th.
                if fields.len() > 9 && format!("{} ", fields[1]).ends_with(&port) {
                    skipped.insert(fields[9].to_string());
                }
            }
        }
        std::fs::read_dir(format!("/proc/{pid}/fd"))
            .map(|dir| {
                dir.filter_map(|entry| std::fs::read_link(entry.ok()?.path()).ok())
                    .filter(|target| {
                        let target = target.to_string_lossy();
                        let inode = target
                            .strip_prefix("socket:[")
                            .and_then(|t| t.strip_suffix(']'));
                        !inode.is_some_and(|i| skipped.contains(i))
                    })
                    .count()
            })
            .unwrap_or(0)
    }
}

impl Drop for Ingress {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl IngressBuilder {
    pub fn manifests(mut self, dir: &Path) -> Self {
        self.manifests = Some(dir.to_path_buf());
        self
    }

    /// `--kubeconfig`: the Kubernetes source instead of manifests.
    pub fn kubeconfig(mut self, path: &Path) -> Self {
        self.kubeconfig = Some(path.to_path_buf());
        self
    }

    pub fn arg(mut self, arg: impl Into<String>) -> Self {
        self.args.push(arg.into());
        self
    }

    pub fn args<I: IntoIterator<Item = S>, S: Into<String>>(mut self, args: I) -> Self {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    pub fn env(mut self, key: &str, value: &str) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }

    /// `--mode`: in eBPF mode without a [`pin_dir`](Self::pin_dir) the instance pins in a
    /// directory of its own (the default mode for tests is userspace, so concurrent tests never
    /// share kernel state).
    pub fn mode(mut self, mode: Mode) -> Self {
        self.mode = mode.flag();
        self
    }

    /// `--mode ebpf`.
    pub fn ebpf(self) -> Self {
        self.mode(Mode::Ebpf)
    }

    /// `--mode auto`: eBPF if it loads, userspace (with one log line saying why) if not.
    pub fn auto_mode(mut self) -> Self {
        self.mode = "auto";
        self
    }

    /// `--bpf-pin-dir`, whatever the mode: a directory the test owns and keeps across restarts.
    pub fn pin_dir(mut self, dir: &Path) -> Self {
        self.pins = Pins::At(dir.to_path_buf());
        self
    }

    /// `--bind` (default 127.0.0.1).
    pub fn bind(mut self, addr: &str) -> Self {
        self.bind = addr.into();
        self
    }

    /// `--admin-bind` (default 127.0.0.1).
    pub fn admin_bind(mut self, addr: &str) -> Self {
        self.admin_bind = addr.into();
        self
    }

    /// Fixed ports, for an instance alone in its network namespace (default: free ports).
    pub fn ports(mut self, ports: Ports) -> Self {
        self.ports = Some(ports);
        self
    }

    /// Runs the binary behind `wrapper…` (`setpriv …`, `taskset -c 0`), which must exec it.
    pub fn wrapper<I: IntoIterator<Item = S>, S: Into<String>>(mut self, wrapper: I) -> Self {
        self.wrapper = wrapper.into_iter().map(Into::into).collect();
        self
    }

    /// `--log-level` (default `INGRESS_TEST_LOG`, or info).
    pub fn log_level(mut self, level: &str) -> Self {
        self.log_level = level.into();
        self
    }

    /// How long [`start`](Self::start) waits for readiness (default 20 s).
    pub fn ready_within(mut self, timeout: Duration) -> Self {
        self.ready_within = timeout;
        self
    }

    pub fn no_wait(mut self) -> Self {
        self.wait_ready = false;
        self
    }

    /// Starts the process and, unless told not to, waits until it is ready. A start on free
    /// ports that lost one of them to another test is retried on new ports.
    pub fn start(self) -> Ingress {
        for _ in 0..3 {
            let ingress = self.spawn();
            if !self.wait_ready {
                return ingress;
            }
            match ingress.try_wait_ready(self.ready_within) {
                Ok(()) => return ingress,
                Err(_)
                    if self.ports.is_none()
                        && ingress.logs().contains("Address already in use") =>
                {
                    continue;
                }
                Err(why) => panic!("{why}; logs:\n{}", ingress.logs()),
            }
        }
        panic!("ingress could not get free ports in 3 attempts");
    }

    fn spawn(&self) -> Ingress {
        let scratch = Scratch::new("ingress-proc");
        let log = scratch.path().join("ingress.log");
        let ports = self.ports.unwrap_or_else(|| Ports {
            http: free_port(),
            https: free_port(),
            admin: free_port(),
        });
        let mut cmd = match self.wrapper.split_first() {
            Some((program, rest)) => {
                let mut cmd = Command::new(program);
                cmd.args(rest).arg(binary());
                cmd
            }
            None => Command::new(binary()),
        };
        if let Some(dir) = &self.manifests {
            cmd.arg("--manifests").arg(dir);
        }
        if let Some(path) = &self.kubeconfig {
            cmd.arg("--kubeconfig").arg(path);
        }
        let own_pins = match (&self.pins, self.mode == Mode::Ebpf.flag()) {
            (Pins::Default, true) => Some(PinDir::new("proc")),
            _ => None,
        };
        let pin_dir = match &self.pins {
            Pins::At(dir) => Some(dir.clone()),
            Pins::Default => own_pins.as_ref().map(|p| p.path().to_path_buf()),
        };
        cmd.args(["--mode", self.mode]);
        if let Some(dir) = &pin_dir {
            cmd.arg("--bpf-pin-dir").arg(dir);
        }
        cmd.args(["--bind", &self.bind, "--admin-bind", &self.admin_bind])
            .args(["--http-port", &ports.http.to_string()])
            .args(["--https-port", &ports.https.to_string()])
            .args(["--admin-port", &ports.admin.to_string()])
            .args(["--log-level", &self.log_level])
            .args(&self.args)
            .stdin(Stdio::null());
        // One open file for both streams, so neither writes over the other's lines.
        let out = std::fs::File::create(&log).expect("log file");
        let err = out.try_clone().expect("log file");
        cmd.stdout(out).stderr(err);
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        // Spawned from this thread, so the child starts in this thread's network namespace.
        let child = cmd.spawn().expect("spawn ingress");
        let bind = reachable(&self.bind);
        Ingress {
            child: Some(child),
            http: SocketAddr::new(bind, ports.http),
            https: SocketAddr::new(bind, ports.https),
            admin: SocketAddr::new(reachable(&self.admin_bind), ports.admin),
            log,
            pin_dir,
            _own_pins: own_pins,
            _scratch: scratch,
        }
    }
}

/// Where a client reaches a listener bound to `bind`: that address, or loopback for a wildcard.
fn reachable(bind: &str) -> IpAddr {
    match bind.parse::<IpAddr>() {
        Ok(ip) if !ip.is_unspecified() => ip,
        Ok(IpAddr::V6(_)) => IpAddr::from(Ipv6Addr::LOCALHOST),
        _ => IpAddr::from(Ipv4Addr::LOCALHOST),
    }
}

/// The process exists and is not a zombie.
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            // The state follows the parenthesised command name, which may contain spaces.
            let after = stat.rsplit_once(')')?.1;
            after.split_whitespace().next().map(|state| state != "Z")
        })
        .unwrap_or(false)
}
