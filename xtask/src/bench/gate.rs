//! The kernel SNI gate against userspace mode, in one run, inside a network namespace this
//! section creates and deletes:
//!
//! ```text
//!   netns ingress-bench-gate-<pid>, loopback only, with 198.18.0.2 added to it (a refused source)
//!   core 0: ingress --mode ebpf       :19744  (own cgroup v2 and pin dir: the gate sees only it)
//!           ingress --mode userspace  :19745
//!           ingress --mode userspace  :19746  the 403 path (see `sources`)
//!           nginx                     :19747  allow/deny, ingress-nginx's 403 (see `sources`)
//!   core 1: upstream nginx :19000, and one load at a time:
//!           sni-flood  N new connections/s, each a real ClientHello with a random unknown name,
//!                      or with a known name from the refused source (`sources`)
//!           wrk        known host (SNI localhost), HTTPS keep-alive
//!           h2load     known host, new TLS connections at a fixed rate, one request each
//! ```
//!
//! First the unknown-name flood, per round and mode (the modes alternate which goes first):
//! 1. wrk alone: the known traffic's requests/s and p99 without a flood;
//! 2. the flood alone: proxy CPU per 1000 rejected connections (ingress_sni_gate_total, which
//!    counts the ones the kernel reset before accept too);
//! 3. the flood and wrk together: what the flood costs the known traffic.
//!
//! Then, after every flood, h2load alone: known-host handshakes per proxy CPU-second, the gate's
//! overhead on them, in [`HANDSHAKE_SLICES`] slices per mode, the modes taking turns. One short
//! run per round (600 handshakes, about 0.15 CPU-seconds, right after a flood) put this ratio
//! anywhere from +5% to +26% between runs of the same code; the sum over many slices, away from
//! the floods' aftermath, is what is compared.
//!
//! On loopback the kernel receives a packet in the sender's softirq, so the work an eBPF gate
//! does on the flood's ClientHellos (the TC program, or the parser and verdict) is charged to the
//! flood client, not to the proxy. The flood client's CPU is printed beside the proxy's for that
//! reason, and so is the two together: all the work the machine did per rejected connection.
//!
//! Then a known name flooded from a source outside its `whitelist-source-range`, refused by the
//! kernel, by the userspace gate and on the 403 path: see [`sources`].
//!
//! The known name is `localhost` because wrk takes its SNI from the URL and has no way to
//! connect elsewhere; that is also the one name that resolves without touching /etc/hosts
//! (`sources` uses the rig's `bench.local`, added there if missing, as the HTTPS section does).
//! Numbers are printed, never judged.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use serde_json::Value;

use super::procs::{self, Running};
use super::report::Report;
use super::{Bench, median, write, wrk};

mod sources;

const HOST: &str = "localhost";
const BEFORE_ACCEPT: &str = "ingress_ebpf_gate_total{counter=\"reset_before_accept_unknown\"}";
const UPSTREAM_PORT: u16 = 19000;
/// Unknown names per second in the flood.
const FLOOD_RATE: u32 = 1000;
/// A flood connection's patience, to connect and then for the proxy's reaction.
const FLOOD_TIMEOUT: &str = "2s";
/// How long either proxy may take to be ready and serve the known name.
const READY: Duration = Duration::from_secs(30);

#[derive(Clone, Copy)]
struct Mode {
    name: &'static str,
    http: u16,
    https: u16,
    admin: u16,
}

const EBPF: Mode = Mode {
    name: "ebpf",
    http: 19081,
    https: 19744,
    admin: 19254,
};
const USERSPACE: Mode = Mode {
    name: "userspace",
    http: 19082,
    https: 19745,
    admin: 19255,
};

pub fn run(bench: &Bench, quick: bool) -> Result<()> {
    if let Some(why) = unavailable(bench) {
        // The tests hold CI to a loaded gate; a benchmark that silently measured nothing there
        // would hide the same failure.
        if std::env::var("CI").is_ok_and(|v| v == "true" || v == "1") {
            bail!("gate benchmark cannot run under CI=true: {why}");
        }
        bench
            .report
            .skip(format!("\n## Kernel SNI gate: skipped ({why})"));
        return Ok(());
    }
    let started = Instant::now();
    let flood = flood_binary(bench, quick)?;
    sweep_leftovers();
    let phase = if quick {
        Duration::from_secs(2)
    } else {
        bench.duration / 2
    };
    let handshake_rate: u32 = if quick { 300 } else { 500 };
    let site = Site::start(bench)?;
    let plan = Plan {
        flood,
        phase,
        handshake_rate,
        connections: bench.connections,
        quick,
    };

    // Warm both proxies (TLS session state, the upstream pool) before anything is measured.
    for mode in [EBPF, USERSPACE] {
        site.wrk(mode, Duration::from_secs(1), plan.connections)?;
    }
    let mut results: Vec<(Mode, Vec<Round>)> = vec![(EBPF, Vec::new()), (USERSPACE, Vec::new())];
    for round in 0..bench.rounds {
        let order = if round % 2 == 0 { [0, 1] } else { [1, 0] };
        for index in order {
            let (mode, rounds) = &mut results[index];
            rounds.push(site.round(*mode, &plan)?);
        }
    }
    // Handshakes alone, once every flood is over, the modes taking turns.
    let mut handshakes: Vec<Vec<Handshakes>> = vec![Vec::new(); results.len()];
    for slice in 0..HANDSHAKE_SLICES {
        let order = if slice % 2 == 0 { [0, 1] } else { [1, 0] };
        for index in order {
            handshakes[index].push(site.handshakes(results[index].0, &plan)?);
        }
    }
    report(&bench.report, &plan, bench.rounds, &results, &handshakes);
    let refused = sources::run(&site, &plan, bench.rounds)?;
    sources::report(&bench.report, &plan, bench.rounds, &refused);
    drop(site);
    writeln!(
        bench.report,
        "(gate section: {:.0} s including its build)",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Why this machine cannot run the section, if it cannot.
pub(super) fn unavailable(bench: &Bench) -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("needs root: network namespaces, cgroups and eBPF".into());
    }
    if !Path::new("/sys/kernel/btf/vmlinux").exists() {
        return Some("the kernel has no BTF".into());
    }
    for tool in ["nsenter", "ip", "curl", "openssl"] {
        if let Err(e) = procs::require(tool) {
            return Some(e.to_string());
        }
    }
    if cgroup2_mount().is_none() {
        return Some("no cgroup v2 mount".into());
    }
    let version = Command::new(&bench.ingress).arg("version").output();
    match version {
        Ok(out) if String::from_utf8_lossy(&out.stdout).contains("(eBPF object embedded)") => None,
        Ok(out) => Some(format!(
            "the benchmarked binary carries no eBPF object ({})",
            String::from_utf8_lossy(&out.stdout).trim()
        )),
        Err(e) => Some(format!("running {}: {e}", bench.ingress.display())),
    }
}

/// The flood generator from the tests crate. A full run builds it in release like the proxies;
/// `--quick` (CI) takes the debug build the test step already made, as the kube section does
/// with its API server, which spares a release build of the tests crate and only inflates the
/// flood client's own CPU column.
fn flood_binary(bench: &Bench, quick: bool) -> Result<PathBuf> {
    let release = bench.ingress.parent().context("release directory")?;
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let ws = crate::workspace::Workspace::locate()?;
    let mut cmd = Command::new(cargo);
    cmd.args(["build", "-p", "ingress-tests", "--bin", "sni-flood"])
        .current_dir(&ws.root);
    let dir = if quick {
        release.parent().context("target directory")?.join("debug")
    } else {
        cmd.arg("--release");
        // The environment `cargo xtask build --release` gives the ingress crate: any difference
        // reruns its build script and recompiles it, and the next bench run would undo that.
        if ws.object_path().is_file() {
            cmd.env("INGRESS_EBPF_OBJECT", ws.object_path());
        }
        release.to_path_buf()
    };
    let status = cmd.status()?;
    ensure!(status.success(), "building sni-flood failed");
    Ok(dir.join("sni-flood"))
}

struct Plan {
    flood: PathBuf,
    phase: Duration,
    handshake_rate: u32,
    connections: u32,
    quick: bool,
}

impl Plan {
    fn flood_count(&self) -> u64 {
        u64::from(FLOOD_RATE) * self.phase.as_secs().max(1)
    }
}

// ---------------------------------------------------------------------------------------------
// One round of one mode

struct Round {
    /// Known traffic alone.
    quiet: wrk::Load,
    /// The flood alone.
    flood: FloodRun,
    /// Known traffic beside the flood.
    loud: wrk::Load,
    /// The flood that ran beside it.
    loud_flood: FloodReport,
}

struct FloodRun {
    report: FloodReport,
    /// `ingress_sni_gate_total{reason="unknown"}` moved by this much.
    rejected: f64,
    /// `ingress_ebpf_gate_total{counter="unknown"}` moved by this much (0 in userspace mode).
    kernel_unknown: f64,
    /// Of those, reset by the TC program before the kernel made a socket (never accepted).
    before_accept: f64,
    /// TLS handshakes the proxy started for the flood (each one would be a failure).
    handshakes: f64,
    proxy_cpu: Duration,
}

/// What `sni-flood` printed.
struct FloodReport {
    launched: f64,
    reset: f64,
    not_reset: f64,
    /// `--request`: answered 403.
    forbidden: f64,
    /// Neither reset nor answered 403.
    not_refused: f64,
    forbidden_p50_ms: f64,
    forbidden_p99_ms: f64,
    cpu_ms: f64,
    reset_p50_ms: f64,
    reset_p99_ms: f64,
    hello_bytes: f64,
}

impl FloodReport {
    fn parse(text: &str) -> Result<FloodReport> {
        let value: Value = serde_json::from_str(text.trim())
            .with_context(|| format!("unexpected sni-flood output: {text}"))?;
        let number = |key: &str| value.get(key).and_then(Value::as_f64).unwrap_or(f64::NAN);
        let not_refused = [
            "closed",
            "answered",
            "other_status",
            "silent",
            "connect_failed",
            "error",
            "unfinished",
        ]
        .iter()
        .map(|k| number(k))
        .sum::<f64>();
        Ok(FloodReport {
            launched: number("launched"),
            reset: number("reset"),
            not_reset: not_refused + number("forbidden"),
            forbidden: number("forbidden"),
            not_refused,
            forbidden_p50_ms: number("forbidden_p50_ms"),
            forbidden_p99_ms: number("forbidden_p99_ms"),
            cpu_ms: number("cpu_ms"),
            reset_p50_ms: number("reset_p50_ms"),
            reset_p99_ms: number("reset_p99_ms"),
            hello_bytes: number("hello_bytes"),
        })
    }
}

/// Slices of new known-host handshakes per mode (each `handshake_rate` for the plan's phase).
const HANDSHAKE_SLICES: usize = 8;

#[derive(Clone)]
struct Handshakes {
    succeeded: f64,
    /// The proxy's CPU meanwhile.
    cpu: Duration,
}

impl Handshakes {
    fn per_cpu_second(&self) -> f64 {
        self.succeeded / self.cpu.as_secs_f64().max(0.001)
    }
}

impl Site {
    fn round(&self, mode: Mode, plan: &Plan) -> Result<Round> {
        let quiet = self.wrk(mode, plan.phase, plan.connections)?;

        let proxy = self.proxy(mode);
        let before = self.scrape(mode)?;
        let cpu_before = cpu_time(proxy.pid())?;
        let report = FloodReport::parse(&self.flood(mode, plan)?.finish()?)?;
        let proxy_cpu = cpu_time(proxy.pid())?.saturating_sub(cpu_before);
        // The proxy counts a rejection when it has reset the socket; give the last ones a
        // moment to land before reading the counters.
        std::thread::sleep(Duration::from_millis(200));
        let after = self.scrape(mode)?;
        let flood = FloodRun {
            report,
            rejected: sample(&after, "ingress_sni_gate_total{reason=\"unknown\"}")
                - sample(&before, "ingress_sni_gate_total{reason=\"unknown\"}"),
            kernel_unknown: sample(&after, "ingress_ebpf_gate_total{counter=\"unknown\"}")
                - sample(&before, "ingress_ebpf_gate_total{counter=\"unknown\"}"),
            before_accept: sample(&after, BEFORE_ACCEPT) - sample(&before, BEFORE_ACCEPT),
            handshakes: family_sum(&after, "ingress_tls_handshakes_total")
                - family_sum(&before, "ingress_tls_handshakes_total"),
            proxy_cpu,
        };

        let running = self.flood(mode, plan)?;
        let loud = self.wrk(mode, plan.phase, plan.connections);
        // Collect the flood even when wrk failed, so it never outlives the round.
        let loud_flood = FloodReport::parse(&running.finish()?)?;
        let loud = loud?;
        Ok(Round {
            quiet,
            flood,
            loud,
            loud_flood,
        })
    }
}

// ---------------------------------------------------------------------------------------------
// The site: namespace, cgroup, pins, certificate, upstream, and the two proxies

/// Field order is drop order: processes stop before the cgroup, pins and namespace go.
struct Site {
    ebpf: Running,
    userspace: Running,
    /// `sources`: ingress where the gate cannot judge the restricted host, so its access phase
    /// answers 403.
    forbidden: Running,
    /// `sources`: nginx refusing the same clients with `allow`/`deny`, as ingress-nginx does.
    nginx: Running,
    _upstream: Running,
    _cgroup: Cgroup,
    _pins: PinDir,
    ns: NetNs,
}

impl Site {
    fn start(bench: &Bench) -> Result<Site> {
        let dir = bench.scratch("gate")?;
        let ns = NetNs::create(&format!("ingress-bench-gate-{}", std::process::id()))?;
        let cgroup = Cgroup::create(&format!("ingress-bench-gate-{}", std::process::id()))?;
        let pins = PinDir(PathBuf::from(format!(
            "/sys/fs/bpf/ingress-bench-gate-{}",
            std::process::id()
        )));
        let manifests = site_files(&dir, HOST, UPSTREAM_PORT)?;
        let restricted = sources::site_files(&dir, &manifests)?;
        ip(&[
            "-n",
            &ns.name,
            "addr",
            "add",
            &format!("{}/32", sources::REFUSED_SOURCE),
            "dev",
            "lo",
        ])?;

        write(
            &dir.join("upstream.conf"),
            &format!(
                "worker_processes 1; daemon off; pid {d}/upstream.pid; error_log {d}/upstream-error.log;\n\
                 events {{ worker_connections 8192; }}\n\
                 http {{ access_log off; server {{ listen 127.0.0.1:{UPSTREAM_PORT} backlog=4096; keepalive_requests 100000000;\n\
                 location / {{ return 200 \"hello from the upstream\\n\"; }} }} }}\n",
                d = dir.display()
            ),
        )?;
        let mut upstream_cmd = ns.command(Some(1), "nginx");
        upstream_cmd
            .args(["-p", &dir.to_string_lossy(), "-c"])
            .arg(dir.join("upstream.conf"));
        let upstream = Running::start("upstream", upstream_cmd, &dir.join("upstream.log"))?;

        // `--mode` is the mode's name but for the 403 path's proxy, userspace with its own
        // manifests.
        let proxy_args = |mode: Mode| -> Vec<String> {
            let (flag, manifests) = if mode.name == sources::FORBIDDEN.name {
                (USERSPACE.name, &restricted.forbidden_manifests)
            } else {
                (mode.name, &manifests)
            };
            let mut args: Vec<String> = vec![
                "--manifests".into(),
                manifests.display().to_string(),
                "--mode".into(),
                flag.into(),
                "--bind".into(),
                "127.0.0.1".into(),
                "--http-port".into(),
                mode.http.to_string(),
                "--https-port".into(),
                mode.https.to_string(),
                "--admin-port".into(),
                mode.admin.to_string(),
                "--worker-threads".into(),
                "1".into(),
                "--access-log".into(),
                "false".into(),
                "--log-level".into(),
                "warn".into(),
            ];
            if mode.name == EBPF.name {
                args.extend([
                    "--bpf-pin-dir".into(),
                    pins.0.display().to_string(),
                    "--bpf-cgroup".into(),
                    cgroup.path.display().to_string(),
                ]);
            }
            args
        };
        // The eBPF proxy joins its own cgroup before it listens: sock_ops sees the children of
        // listeners made inside the cgroup it is attached to, and nothing else on the machine.
        let mut ebpf_cmd = ns.command(None, "sh");
        ebpf_cmd
            .args(["-c", "echo 0 > \"$0\" && exec \"$@\""])
            .arg(cgroup.path.join("cgroup.procs"));
        if procs::cpus() > 1 {
            ebpf_cmd.args(["taskset", "-c", "0"]);
        }
        ebpf_cmd.arg(&bench.ingress).args(proxy_args(EBPF));
        let ebpf = Running::start("ingress (ebpf)", ebpf_cmd, &dir.join("ingress-ebpf.log"))?;
        let mut userspace_cmd = ns.command(Some(0), &bench.ingress.to_string_lossy());
        userspace_cmd.args(proxy_args(USERSPACE));
        let userspace = Running::start(
            "ingress (userspace)",
            userspace_cmd,
            &dir.join("ingress-userspace.log"),
        )?;
        let mut forbidden_cmd = ns.command(Some(0), &bench.ingress.to_string_lossy());
        forbidden_cmd.args(proxy_args(sources::FORBIDDEN));
        let forbidden = Running::start(
            "ingress (403 path)",
            forbidden_cmd,
            &dir.join("ingress-403.log"),
        )?;
        let mut nginx_cmd = ns.command(Some(0), "nginx");
        nginx_cmd
            .args(["-p", &dir.to_string_lossy(), "-c"])
            .arg(&restricted.nginx_conf);
        let nginx = Running::start("nginx (403)", nginx_cmd, &dir.join("nginx-403.log"))?;

        let site = Site {
            ebpf,
            userspace,
            forbidden,
            nginx,
            _upstream: upstream,
            _cgroup: cgroup,
            _pins: pins,
            ns,
        };
        for (mode, log) in [
            (EBPF, "ingress-ebpf.log"),
            (USERSPACE, "ingress-userspace.log"),
        ] {
            site.wait_ready(mode)
                .with_context(|| format!("log {}", dir.join(log).display()))?;
        }
        sources::wait_ready(&site, &dir)?;
        let enabled = |mode: Mode| -> Result<f64> {
            Ok(procs::metric(&site.scrape(mode)?, "ingress_ebpf_enabled").unwrap_or(f64::NAN))
        };
        let (on, off) = (enabled(EBPF)?, enabled(USERSPACE)?);
        ensure!(
            on == 1.0 && off == 0.0,
            "ingress_ebpf_enabled is {on} in eBPF mode and {off} in userspace mode"
        );
        Ok(site)
    }

    fn proxy(&self, mode: Mode) -> &Running {
        match mode.name {
            name if name == EBPF.name => &self.ebpf,
            name if name == sources::FORBIDDEN.name => &self.forbidden,
            name if name == sources::NGINX.name => &self.nginx,
            _ => &self.userspace,
        }
    }

    fn wait_ready(&self, mode: Mode) -> Result<()> {
        self.wait_serving(mode, HOST)
    }

    /// Until `host` answers 200 on `mode`'s HTTPS port (from 127.0.0.1).
    fn wait_serving(&self, mode: Mode, host: &str) -> Result<()> {
        let deadline = Instant::now() + READY;
        let url = format!("https://{host}:{}/", mode.https);
        loop {
            let out = self
                .ns
                .command(None, "curl")
                .args([
                    "-sk",
                    "--max-time",
                    "2",
                    "-o",
                    "/dev/null",
                    "-w",
                    "%{http_code}",
                ])
                .arg(&url)
                .output()?;
            if out.stdout == b"200" {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "ingress --mode {} did not serve {url} within {READY:?}",
                    mode.name
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn scrape(&self, mode: Mode) -> Result<String> {
        let out = self
            .ns
            .command(None, "curl")
            .args(["-s", "--max-time", "5"])
            .arg(format!("http://127.0.0.1:{}/metrics", mode.admin))
            .output()?;
        ensure!(
            out.status.success(),
            "scraping /metrics of the {} proxy failed",
            mode.name
        );
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    fn wrk(&self, mode: Mode, duration: Duration, connections: u32) -> Result<wrk::Load> {
        self.wrk_host(mode, HOST, duration, connections)
    }

    fn wrk_host(
        &self,
        mode: Mode,
        host: &str,
        duration: Duration,
        connections: u32,
    ) -> Result<wrk::Load> {
        let out = self
            .ns
            .command(Some(1), "wrk")
            .args([
                "-t1",
                &format!("-c{connections}"),
                &format!("-d{}s", duration.as_secs().max(1)),
                "--latency",
            ])
            .arg(format!("https://{host}:{}/", mode.https))
            .output()
            .context("running wrk")?;
        let text = String::from_utf8_lossy(&out.stdout);
        let load = wrk::parse(&text).with_context(|| {
            format!(
                "unexpected wrk output:\n{text}{}",
                String::from_utf8_lossy(&out.stderr)
            )
        })?;
        // Socket errors mean the known name was refused or reset: the comparison would be void.
        if let Some(line) = text.lines().find(|l| l.contains("Socket errors")) {
            println!("note: wrk against {} reported {}", mode.name, line.trim());
        }
        Ok(load)
    }

    /// Starts the flood (bounded by count and by time) against `mode`'s HTTPS port.
    fn flood(&self, mode: Mode, plan: &Plan) -> Result<Flood> {
        self.flood_with(mode, plan, &[])
    }

    /// The same with more `sni-flood` arguments (a fixed name, a source, `--request`).
    fn flood_with(&self, mode: Mode, plan: &Plan, extra: &[&str]) -> Result<Flood> {
        let count = plan.flood_count();
        // Time to launch everything, then for the last connections' timeouts, with room to
        // spare; the flood stops itself at this limit whatever happens.
        let limit = plan.phase.as_secs() + 10;
        let child = self
            .ns
            .command(Some(1), &plan.flood.to_string_lossy())
            .arg("--connect")
            .arg(format!("127.0.0.1:{}", mode.https))
            .args(["--rate", &FLOOD_RATE.to_string()])
            .args(["--count", &count.to_string()])
            .args(["--timeout", FLOOD_TIMEOUT])
            .args(["--limit", &format!("{limit}s")])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("starting sni-flood")?;
        Ok(Flood(Some(child)))
    }

    fn handshakes(&self, mode: Mode, plan: &Plan) -> Result<Handshakes> {
        let rate = plan.handshake_rate;
        let total = u64::from(rate) * plan.phase.as_secs().max(1);
        let proxy = self.proxy(mode);
        let before = cpu_time(proxy.pid())?;
        let out = self
            .ns
            .command(Some(1), "h2load")
            .args([
                "--h1",
                "-t1",
                &format!("-c{total}"),
                &format!("-n{total}"),
                &format!("-r{}", rate / 10),
                // This h2load (nghttp2 1.52) takes "100ms" but refuses "0.1s".
                "--rate-period=100ms",
            ])
            .arg(format!("https://{HOST}:{}/", mode.https))
            .output()
            .context("running h2load")?;
        std::thread::sleep(Duration::from_millis(200));
        let cpu = cpu_time(proxy.pid())?.saturating_sub(before);
        let text = String::from_utf8_lossy(&out.stdout);
        let succeeded: f64 = text
            .lines()
            .find_map(|l| l.trim().strip_prefix("requests:"))
            .and_then(|l| {
                l.split(',')
                    .find_map(|p| p.trim().strip_suffix(" succeeded").map(str::to_string))
            })
            .and_then(|v| v.trim().parse().ok())
            .with_context(|| {
                format!(
                    "unexpected h2load output:\n{text}{}",
                    String::from_utf8_lossy(&out.stderr)
                )
            })?;
        Ok(Handshakes { succeeded, cpu })
    }
}

/// A running `sni-flood`, killed if dropped before it finishes.
struct Flood(Option<std::process::Child>);

impl Flood {
    /// Waits for the flood to end and returns its report.
    fn finish(mut self) -> Result<String> {
        let child = self.0.take().context("flood already finished")?;
        let out = child.wait_with_output().context("waiting for sni-flood")?;
        ensure!(
            out.status.success(),
            "sni-flood failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

impl Drop for Flood {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A certificate for `host` and manifests routing it to the upstream on `upstream_port`; returns
/// the manifests directory.
pub(super) fn site_files(dir: &Path, host: &str, upstream_port: u16) -> Result<PathBuf> {
    let (cert, key) = certificate(dir, host, "")?;
    let manifests = dir.join("manifests");
    std::fs::create_dir_all(&manifests)?;
    write(
        &manifests.join("gate.yaml"),
        &format!(
            "apiVersion: v1\nkind: Service\nmetadata: {{name: upstream, namespace: bench}}\nspec: {{ports: [{{name: http, port: 80}}]}}\n---\n\
             apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: upstream-1, namespace: bench, labels: {{kubernetes.io/service-name: upstream}}}}\n\
             addressType: IPv4\nports: [{{name: http, port: {upstream_port}}}]\nendpoints: [{{addresses: [\"127.0.0.1\"]}}]\n---\n\
             apiVersion: v1\nkind: Secret\nmetadata: {{name: gate-tls, namespace: bench}}\ntype: kubernetes.io/tls\nstringData:\n  tls.crt: |\n{crt}  tls.key: |\n{key}---\n\
             apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {{name: gate, namespace: bench, annotations: {{nginx.ingress.kubernetes.io/ssl-redirect: \"false\"}}}}\n\
             spec:\n  ingressClassName: ingress\n  tls: [{{hosts: [{host}], secretName: gate-tls}}]\n  rules:\n  - host: {host}\n    http: {{paths: [{{path: /, pathType: Prefix, backend: {{service: {{name: upstream, port: {{number: 80}}}}}}}}]}}\n",
            crt = indented(&cert)?,
            key = indented(&key)?
        ),
    )?;
    Ok(manifests)
}

/// A self-signed ECDSA P-256 certificate for `host`: `{stem}cert.pem` and `{stem}key.pem` in
/// `dir`.
fn certificate(dir: &Path, host: &str, stem: &str) -> Result<(PathBuf, PathBuf)> {
    let (cert, key) = (
        dir.join(format!("{stem}cert.pem")),
        dir.join(format!("{stem}key.pem")),
    );
    let out = Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-days",
            "30",
        ])
        .args([
            "-subj",
            &format!("/CN={host}"),
            "-addext",
            &format!("subjectAltName=DNS:{host}"),
        ])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output()?;
    ensure!(out.status.success(), "openssl req failed");
    Ok((cert, key))
}

/// A PEM file's lines indented for a YAML block scalar under `stringData`.
fn indented(path: &Path) -> Result<String> {
    Ok(std::fs::read_to_string(path)?
        .lines()
        .map(|l| format!("    {l}\n"))
        .collect())
}

// ---------------------------------------------------------------------------------------------
// Namespace, cgroup and pin directory, each removed on drop

/// A network namespace with only loopback, deleted on drop.
pub(super) struct NetNs {
    pub(super) name: String,
}

impl NetNs {
    pub(super) fn create(name: &str) -> Result<NetNs> {
        ip(&["netns", "add", name])?;
        let ns = NetNs { name: name.into() };
        ip(&["-n", name, "link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// `program` inside the namespace (entered with nsenter, which unlike `ip netns exec` keeps
    /// the host's /sys and so the cgroup2 mount), pinned to `cpu` when given.
    pub(super) fn command(&self, cpu: Option<usize>, program: &str) -> Command {
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--net=/run/netns/{}", self.name));
        if let Some(cpu) = cpu.filter(|_| procs::cpus() > 1) {
            cmd.args(["taskset", "-c", &cpu.to_string()]);
        }
        cmd.arg(program);
        cmd
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        if let Err(e) = ip(&["netns", "del", &self.name]) {
            eprintln!("removing network namespace {}: {e:#}", self.name);
        }
    }
}

pub(super) fn ip(args: &[&str]) -> Result<()> {
    let out = Command::new("ip").args(args).output()?;
    ensure!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(())
}

/// A child of the cgroup v2 root, removed on drop (after its processes are gone).
pub(super) struct Cgroup {
    pub(super) path: PathBuf,
}

impl Cgroup {
    pub(super) fn create(name: &str) -> Result<Cgroup> {
        let root = cgroup2_mount().context("no cgroup v2 mount")?;
        let path = root.join(name);
        std::fs::create_dir(&path).with_context(|| format!("creating {}", path.display()))?;
        Ok(Cgroup { path })
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        // A killed process leaves its cgroup a moment after it has been reaped.
        for _ in 0..50 {
            if std::fs::remove_dir(&self.path).is_ok() || !self.path.exists() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        eprintln!("could not remove cgroup {}", self.path.display());
    }
}

/// Where cgroup v2 is mounted: `/sys/fs/cgroup` on most machines, `/sys/fs/cgroup/unified` in
/// hybrid mode.
fn cgroup2_mount() -> Option<PathBuf> {
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    mounts.lines().find_map(|line| {
        let (before, after) = line.split_once(" - ")?;
        (after.split_whitespace().next() == Some("cgroup2"))
            .then(|| before.split_whitespace().nth(4).map(PathBuf::from))
            .flatten()
    })
}

/// The gate's private pin directory, removed on drop.
pub(super) struct PinDir(pub(super) PathBuf);

impl Drop for PinDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Removes what an interrupted earlier run left: namespaces, cgroups and pin directories named
/// for a process that no longer exists (`ingress-bench-gate-<pid>`, with or without a suffix).
pub(super) fn sweep_leftovers() {
    const PREFIX: &str = "ingress-bench-gate-";
    let stale = |name: &str| {
        name.strip_prefix(PREFIX)
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<u32>().ok())
            .is_some_and(|pid| !Path::new(&format!("/proc/{pid}")).exists())
    };
    let mut dirs = vec![PathBuf::from("/run/netns"), PathBuf::from("/sys/fs/bpf")];
    dirs.extend(cgroup2_mount());
    for dir in dirs {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if !stale(&name) {
                continue;
            }
            let path = entry.path();
            let removed = if dir.ends_with("netns") {
                ip(&["netns", "del", &name])
            } else if dir.ends_with("bpf") {
                std::fs::remove_dir_all(&path).map_err(Into::into)
            } else {
                std::fs::remove_dir(&path).map_err(Into::into)
            };
            match removed {
                Ok(()) => println!("removed {} left by an earlier run", path.display()),
                Err(e) => eprintln!("removing {}: {e:#}", path.display()),
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Measuring

/// CPU time of every live thread of `pid`, in nanoseconds from the scheduler: /proc/<pid>/stat
/// counts in 10 ms ticks, too coarse for a few thousand rejected connections.
fn cpu_time(pid: u32) -> Result<Duration> {
    let mut total = 0u64;
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task"))
        .with_context(|| format!("process {pid} is gone"))?;
    for task in tasks.flatten() {
        // A thread may exit between the listing and the read.
        let Ok(stat) = std::fs::read_to_string(task.path().join("schedstat")) else {
            continue;
        };
        total += stat
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0);
    }
    Ok(Duration::from_nanos(total))
}

/// The value of one exact series (`name{labels}`), 0 when absent.
pub(super) fn sample(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| {
            l.strip_prefix(series)
                .and_then(|rest| rest.strip_prefix(' '))
                .and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or(0.0)
}

/// The sum of every series of a metric family.
fn family_sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .filter_map(|l| l.rsplit_once(' ').and_then(|(_, v)| v.parse::<f64>().ok()))
        .sum()
}

// ---------------------------------------------------------------------------------------------
// Reporting

fn report(
    out: &Report,
    plan: &Plan,
    rounds: usize,
    results: &[(Mode, Vec<Round>)],
    handshakes: &[Vec<Handshakes>],
) {
    let hello = results
        .first()
        .and_then(|(_, r)| r.first())
        .map_or(f64::NAN, |r| r.flood.report.hello_bytes);
    writeln!(
        out,
        "\n## Kernel SNI gate: eBPF mode vs userspace mode (median of {rounds} rounds)"
    );
    writeln!(
        out,
        "flood: {FLOOD_RATE} new connections/s for {}s, each a {hello:.0}-byte ClientHello (rustls) with a random unknown name",
        plan.phase.as_secs()
    );
    writeln!(
        out,
        "known: wrk, {} HTTPS keep-alive connections to {HOST}; handshakes: h2load, {}/s for {}s, one request each",
        plan.connections,
        plan.handshake_rate,
        plan.phase.as_secs()
    );

    writeln!(out, "\n### Rejecting the flood (flood alone)");
    writeln!(
        out,
        "{:<10} {:>9} {:>9} {:>8} {:>12} {:>14} {:>12} {:>11} {:>11} {:>16} {:>13}",
        "mode",
        "launched",
        "rejected",
        "not RST",
        "kernel drop",
        "before accept",
        "TLS started",
        "RST p50 ms",
        "RST p99 ms",
        "proxy CPU ms/1k",
        "client ms/1k"
    );
    let mut per_1k = Vec::new();
    let mut node_per_1k = Vec::new();
    for (mode, runs) in results {
        let m = |f: &dyn Fn(&Round) -> f64| median(runs.iter().map(f).collect());
        let proxy_per_1k =
            m(&|r| r.flood.proxy_cpu.as_secs_f64() * 1000.0 / r.flood.rejected.max(1.0) * 1000.0);
        let client_per_1k = m(&|r| r.flood.report.cpu_ms / r.flood.report.reset.max(1.0) * 1000.0);
        per_1k.push(proxy_per_1k);
        node_per_1k.push(m(&|r| {
            (r.flood.proxy_cpu.as_secs_f64() * 1000.0 + r.flood.report.cpu_ms)
                / r.flood.rejected.max(1.0)
                * 1000.0
        }));
        writeln!(
            out,
            "{:<10} {:>9.0} {:>9.0} {:>8.0} {:>12.0} {:>14.0} {:>12.0} {:>11.2} {:>11.2} {:>16.1} {:>13.1}",
            mode.name,
            m(&|r| r.flood.report.launched),
            m(&|r| r.flood.rejected),
            m(&|r| r.flood.report.not_reset),
            m(&|r| r.flood.kernel_unknown),
            m(&|r| r.flood.before_accept),
            m(&|r| r.flood.handshakes),
            m(&|r| r.flood.report.reset_p50_ms),
            m(&|r| r.flood.report.reset_p99_ms),
            proxy_per_1k,
            client_per_1k
        );
    }
    if let [ebpf, userspace] = per_1k.as_slice() {
        writeln!(
            out,
            "ratio ebpf/userspace: proxy CPU per 1000 rejected {:.2}x (target <= 0.5x)",
            ebpf / userspace
        );
    }
    if let [ebpf, userspace] = node_per_1k.as_slice() {
        writeln!(
            out,
            "ratio ebpf/userspace: proxy + flood client CPU per 1000 rejected {:.2}x (all the work on this machine, wherever the kernel charged it)",
            ebpf / userspace
        );
    }
    writeln!(
        out,
        "(rejected: ingress_sni_gate_total{{reason=\"unknown\"}}; kernel drop: ingress_ebpf_gate_total{{counter=\"unknown\"}};"
    );
    writeln!(
        out,
        " before accept: of those, reset by the TC program before a socket existed (counter=\"reset_before_accept_unknown\");"
    );
    writeln!(
        out,
        " client: the flood's own CPU, which on loopback includes the kernel receive path where the eBPF gate runs{})",
        if plan.quick {
            "; --quick uses a debug-built flood client, so this column is inflated"
        } else {
            ""
        }
    );

    writeln!(
        out,
        "\n### Known-host keep-alive HTTPS while the flood runs"
    );
    writeln!(
        out,
        "{:<10} {:>14} {:>10} {:>16} {:>10} {:>10} {:>12}",
        "mode", "rps no flood", "p99 ms", "rps with flood", "p99 ms", "kept", "flood RST"
    );
    for (mode, runs) in results {
        let m = |f: &dyn Fn(&Round) -> f64| median(runs.iter().map(f).collect());
        let quiet = m(&|r| r.quiet.requests_per_sec);
        let loud = m(&|r| r.loud.requests_per_sec);
        writeln!(
            out,
            "{:<10} {:>14.0} {:>10.3} {:>16.0} {:>10.3} {:>9.2}x {:>12.0}",
            mode.name,
            quiet,
            m(&|r| r.quiet.p99_ms),
            loud,
            m(&|r| r.loud.p99_ms),
            m(&|r| r.loud.requests_per_sec / r.quiet.requests_per_sec),
            m(&|r| r.loud_flood.reset)
        );
    }
    writeln!(
        out,
        "(kept: requests/s with the flood / without, per round; target for ebpf >= 0.9x)"
    );

    writeln!(
        out,
        "\n### New known-host TLS handshakes, no flood ({HANDSHAKE_SLICES} alternating slices per mode, after the floods)"
    );
    writeln!(
        out,
        "{:<10} {:>12} {:>24}",
        "mode", "succeeded", "handshakes/CPU-second"
    );
    // All slices together: handshakes over the proxy CPU they took.
    let mut rates = Vec::new();
    for ((mode, _), slices) in results.iter().zip(handshakes) {
        let succeeded: f64 = slices.iter().map(|h| h.succeeded).sum();
        let cpu: f64 = slices.iter().map(|h| h.cpu.as_secs_f64()).sum();
        let rate = succeeded / cpu.max(0.001);
        rates.push(rate);
        writeln!(out, "{:<10} {:>12.0} {:>24.0}", mode.name, succeeded, rate);
    }
    if let [ebpf, userspace] = rates.as_slice() {
        writeln!(
            out,
            "gate overhead on handshakes per proxy CPU-second: {:+.1}% (1 - ebpf/userspace; target <= 5%)",
            (1.0 - ebpf / userspace) * 100.0
        );
    }
    if let [ebpf, userspace] = handshakes {
        let [q1, q2, q3] = super::quartiles(
            ebpf.iter()
                .zip(userspace)
                .map(|(e, u)| 1.0 - e.per_cpu_second() / u.per_cpu_second().max(f64::EPSILON))
                .map(|overhead| overhead * 100.0)
                .collect(),
        );
        writeln!(
            out,
            "gate overhead slice by slice: median {q2:+.1}%, middle half {q1:+.1}% to {q3:+.1}%"
        );
    }
    for ((mode, _), slices) in results.iter().zip(handshakes) {
        let rates: Vec<f64> = slices.iter().map(Handshakes::per_cpu_second).collect();
        writeln!(out, "slices {}: handshakes/CPU-s {rates:.0?}", mode.name);
    }

    for (mode, runs) in results {
        let list = |f: &dyn Fn(&Round) -> f64| runs.iter().map(f).collect::<Vec<_>>();
        writeln!(
            out,
            "rounds {}: proxy CPU ms/1k rejected {:.1?}, kept {:.2?}",
            mode.name,
            list(&|r| r.flood.proxy_cpu.as_secs_f64() * 1e6 / r.flood.rejected.max(1.0)),
            list(&|r| r.loud.requests_per_sec / r.quiet.requests_per_sec)
        );
    }
}
