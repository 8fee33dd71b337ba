//! The real `ingress` binary as a child process: built once per test run, started on free
//! loopback ports, and killed when the handle drops.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::ports::free_port;
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

/// A running `ingress`.
pub struct Ingress {
    child: Option<Child>,
    pub http: SocketAddr,
    pub https: SocketAddr,
    pub admin: SocketAddr,
    pub log: PathBuf,
    /// The bpffs directory this instance pins its maps in (eBPF mode), removed on drop.
    pub pin_dir: Option<PathBuf>,
    _scratch: Scratch,
}

/// Builder for a test instance.
pub struct IngressBuilder {
    manifests: Option<PathBuf>,
    ebpf: bool,
    args: Vec<String>,
    env: Vec<(String, String)>,
    wait_ready: bool,
    admin_bind: String,
}

impl Ingress {
    pub fn builder() -> IngressBuilder {
        IngressBuilder {
            manifests: None,
            ebpf: false,
            args: Vec::new(),
            env: Vec::new(),
            wait_ready: true,
            admin_bind: "127.0.0.1".into(),
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

    pub fn wait_ready(&self, timeout: Duration) {
        if let Err(why) = self.try_wait_ready(timeout) {
            panic!("{why}; logs:\n{}", self.logs());
        }
    }

    /// Ready means this process says so: a port handed out by `free_port` can be taken by
    /// another test's listener before ingress binds it, and that listener may answer too.
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
        let _ = Command::new("kill")
            .args(["-TERM", &self.pid().to_string()])
            .status();
    }

    /// Waits for exit, returning the exit code.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<i32> {
        let deadline = Instant::now() + timeout;
        let child = self.child.as_mut()?;
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                return status.code();
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Ingress {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if let Some(dir) = &self.pin_dir {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

impl IngressBuilder {
    pub fn manifests(mut self, dir: &Path) -> Self {
        self.manifests = Some(dir.to_path_buf());
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

    /// Runs with `--mode ebpf` and a pin directory of its own (the default mode for tests is
    /// userspace, so concurrent tests never share kernel state).
    pub fn ebpf(mut self) -> Self {
        self.ebpf = true;
        self
    }

    /// `--admin-bind` (default 127.0.0.1).
    pub fn admin_bind(mut self, addr: &str) -> Self {
        self.admin_bind = addr.into();
        self
    }

    pub fn no_wait(mut self) -> Self {
        self.wait_ready = false;
        self
    }

    /// Starts the process and, unless told not to, waits until it is ready. A start that lost
    /// one of its ports to another test is retried on new ports.
    pub fn start(self) -> Ingress {
        for _ in 0..3 {
            let ingress = self.spawn();
            if !self.wait_ready {
                return ingress;
            }
            match ingress.try_wait_ready(Duration::from_secs(20)) {
                Ok(()) => return ingress,
                Err(_) if ingress.logs().contains("Address already in use") => continue,
                Err(why) => panic!("{why}; logs:\n{}", ingress.logs()),
            }
        }
        panic!("ingress could not get free ports in 3 attempts");
    }

    fn spawn(&self) -> Ingress {
        let scratch = Scratch::new("ingress-proc");
        let log = scratch.path().join("ingress.log");
        let (http, https, admin) = (free_port(), free_port(), free_port());
        let mut cmd = Command::new(binary());
        if let Some(dir) = &self.manifests {
            cmd.arg("--manifests").arg(dir);
        }
        let pin_dir = self.ebpf.then(|| {
            static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
            let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            PathBuf::from(format!(
                "/sys/fs/bpf/ingress-test-{}-{n}",
                std::process::id()
            ))
        });
        match &pin_dir {
            Some(dir) => {
                cmd.args(["--mode", "ebpf", "--bpf-pin-dir"]).arg(dir);
            }
            None => {
                cmd.args(["--mode", "userspace"]);
            }
        }
        cmd.args(["--bind", "127.0.0.1", "--admin-bind", &self.admin_bind])
            .args(["--http-port", &http.to_string()])
            .args(["--https-port", &https.to_string()])
            .args(["--admin-port", &admin.to_string()])
            .args(["--log-level", "info"])
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(Stdio::from(std::fs::File::create(&log).expect("log file")))
            .stderr(Stdio::from(
                std::fs::File::options()
                    .append(true)
                    .open(&log)
                    .expect("log file"),
            ));
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().expect("spawn ingress");
        let ip = std::net::Ipv4Addr::LOCALHOST.into();
        Ingress {
            child: Some(child),
            http: SocketAddr::new(ip, http),
            https: SocketAddr::new(ip, https),
            admin: SocketAddr::new(ip, admin),
            log,
            pin_dir,
            _scratch: scratch,
        }
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
