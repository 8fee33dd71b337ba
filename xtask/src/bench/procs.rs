//! Processes under benchmark: started pinned to a CPU, stopped on drop, measured from /proc.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

pub fn cpus() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

pub fn require(tool: &str) -> Result<()> {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .stdout(Stdio::null())
        .status()?
        .success();
    if !found {
        bail!("{tool} is not installed; run `cargo xtask setup`");
    }
    Ok(())
}

/// A command pinned to `cpu` (when the machine has more than one).
pub fn pinned(cpu: usize, program: &str) -> Command {
    if cpus() > 1 {
        let mut cmd = Command::new("taskset");
        cmd.args(["-c", &cpu.to_string(), program]);
        cmd
    } else {
        Command::new(program)
    }
}

/// A background process killed when dropped.
pub struct Running {
    child: Child,
    /// The process that reads `child`'s output from a pipe into its log, if it has one.
    reader: Option<Child>,
}

impl Running {
    pub fn start(name: &'static str, mut cmd: Command, log: &Path) -> Result<Running> {
        let out = std::fs::File::create(log)?;
        let err = out.try_clone()?;
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .with_context(|| format!("starting {name}"))?;
        Ok(Running {
            child,
            reader: None,
        })
    }

    /// Like [`Running::start`], but the process writes its output into a pipe that `cat`,
    /// pinned to `reader_cpu`, copies into `log`: a proxy in a container writes its stdout
    /// into a pipe the container runtime reads and files, so the filing is not the proxy's
    /// work (ingress-nginx's access log is `/dev/stdout` for the same reason).
    pub fn start_piped(
        name: &'static str,
        mut cmd: Command,
        log: &Path,
        reader_cpu: usize,
    ) -> Result<Running> {
        let (read, write) = std::io::pipe()?;
        let mut reader = pinned(reader_cpu, "cat");
        let reader = reader
            .stdin(read)
            .stdout(std::fs::File::create(log)?)
            .stderr(Stdio::null())
            .spawn()
            .context("starting the log reader")?;
        let child = cmd
            .stdin(Stdio::null())
            .stdout(write.try_clone()?)
            .stderr(write)
            .spawn()
            .with_context(|| format!("starting {name}"))?;
        // `cmd` still holds the pipe's write end: closed here, so the reader sees the end of
        // its input when the child exits.
        drop(cmd);
        Ok(Running {
            child,
            reader: Some(reader),
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Fails if the process has exited (a proxy that could not bind, say), so a benchmark never
    /// measures whatever else answered on its port.
    pub fn ensure_running(&mut self, name: &str) -> Result<()> {
        match self.child.try_wait()? {
            None => Ok(()),
            Some(status) => anyhow::bail!("{name} exited ({status}); see its log"),
        }
    }

    /// Resident memory, in KiB.
    pub fn rss_kib(&self) -> Result<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid()))?;
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .context("VmRSS missing")
    }

    /// User plus system CPU time consumed so far, including threads and live child
    /// processes: nginx does its work in workers forked from the process we started.
    pub fn cpu_time(&self) -> Result<Duration> {
        let pid = self.pid();
        let mut total = process_cpu(pid).context("reading the proxy's CPU time")?;
        for child in children(pid) {
            // A child may exit between the listing and the read; it then counts for nothing.
            total += process_cpu(child).unwrap_or_default();
        }
        Ok(total)
    }
}

/// A process's CPU time from its POSIX CPU-time clock, to the nanosecond: the 10 ms ticks of
/// /proc/PID/stat are a 7% error on the ~150 ms a short `--quick` phase costs. The ticks are
/// the fallback.
fn process_cpu(pid: u32) -> Option<Duration> {
    let mut clock: libc::clockid_t = 0;
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    let pid_t = libc::pid_t::try_from(pid).ok()?;
    // SAFETY: both pointers are to live locals of the types the calls expect.
    let read = unsafe {
        libc::clock_getcpuclockid(pid_t, &raw mut clock) == 0
            && libc::clock_gettime(clock, &raw mut now) == 0
    };
    if read {
        let secs = u64::try_from(now.tv_sec).ok()?;
        let nanos = u32::try_from(now.tv_nsec).ok()?;
        return Some(Duration::new(secs, nanos));
    }
    // SAFETY: sysconf has no preconditions.
    let hz = u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) })
        .unwrap_or(100)
        .max(1);
    Some(Duration::from_millis(process_ticks(pid)? * 1000 / hz))
}

/// The fields of /proc/PID/stat after the parenthesised command name (which may hold spaces).
fn stat_fields(pid: u32) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    Some(rest.split_whitespace().map(str::to_string).collect())
}

/// utime + stime in clock ticks (fields 14 and 15, 1-based, of /proc/PID/stat).
fn process_ticks(pid: u32) -> Option<u64> {
    let fields = stat_fields(pid)?;
    let field = |i: usize| fields.get(i).and_then(|v| v.parse::<u64>().ok());
    Some(field(11)? + field(12)?)
}

/// Live processes whose parent is `pid` (field 4 of /proc/PID/stat).
fn children(pid: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&p| {
            stat_fields(p)
                .and_then(|f| f.get(1)?.parse::<u32>().ok())
                .is_some_and(|parent| parent == pid)
        })
        .collect()
}

impl Drop for Running {
    /// SIGTERM first, and SIGKILL only if that is ignored: killing an nginx master outright
    /// orphans its worker, which keeps the listening sockets and would answer the next
    /// section's traffic in place of the nginx that section starts (which could not bind).
    fn drop(&mut self) {
        stop(&mut self.child);
        // The reader ends once it has filed what the child wrote; it is stopped only if it
        // lingers.
        if let Some(reader) = &mut self.reader {
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline && matches!(reader.try_wait(), Ok(None)) {
                std::thread::sleep(Duration::from_millis(20));
            }
            stop(reader);
        }
    }
}

/// SIGTERM, then SIGKILL after 5 s if `child` is still there.
fn stop(child: &mut Child) {
    if let Ok(pid) = libc::pid_t::try_from(child.id()) {
        // SAFETY: kill has no memory preconditions; the pid is our unreaped child.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// Waits until `url` answers 200 (curl), or fails after `timeout`.
/// Fails if something already listens on a loopback port the bench is about to use: a leftover
/// proxy from an interrupted run would otherwise answer in place of the one being measured.
pub fn ensure_free(ports: &[u16]) -> Result<()> {
    for &port in ports {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            anyhow::bail!(
                "127.0.0.1:{port} is already in use (a leftover benchmark process? `ss -ltnp sport = :{port}` shows whose)"
            );
        }
    }
    Ok(())
}

pub fn wait_http(url: &str, host: &str, timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        let out = Command::new("curl")
            .args([
                "-sk",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code}",
                "-H",
                &format!("Host: {host}"),
                url,
            ])
            .output()?;
        if out.stdout == b"200" {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("{url} (Host {host}) did not answer 200 within {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Fetches a URL's body with curl.
pub fn fetch(url: &str) -> Result<String> {
    let out = Command::new("curl").args(["-s", url]).output()?;
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The value of an unlabelled Prometheus sample.
pub fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        l.strip_prefix(name)
            .and_then(|rest| rest.strip_prefix(' '))
            .and_then(|v| v.trim().parse().ok())
    })
}
