//! The gate's false rejects and false admits, counted with real clients across a veth, in both
//! modes:
//!
//! ```text
//!   netns ingress-bench-gate-<pid>-client
//!     10.238.0.2   Chromium, curl (single segment)       the server advertises MSS 1460
//!     10.238.0.3   curl (split)                          the server advertises MSS 256
//!        | veth, offloads off (every segment crosses as the client's TCP cut it)
//!   netns ingress-bench-gate-<pid>-server
//!     10.238.0.1   ingress --mode ebpf :19846 (own cgroup and pin dir), --mode userspace :19847
//!                  (each binds its HTTP, HTTPS and admin ports to this address)
//!     127.0.0.1    upstream nginx :19100
//! ```
//!
//! Each client fetches a fixed number of URLs per mode, alternating a name an Ingress serves
//! (`known.accuracy.test`) and a fresh name nothing serves. Chromium runs headless with a fresh
//! profile every time, so every fetch is a full handshake; its post-quantum ClientHello (about
//! 1.8 kB) crosses in two segments. curl's (about 0.5 kB) crosses in one from 10.238.0.2 and, to
//! 10.238.0.3, in two or three: the server's route to that address advertises a 256-byte MSS.
//!
//! A known name that is not served is a false reject; an unknown name that is served (the
//! handshake completed and an HTTP answer came back, whatever its status) is a false admit.
//! Anything else (a timeout, a TLS error) is printed as "other" with its reason, never folded
//! into either. Numbers are printed, never judged.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};

use super::gate::{Cgroup, NetNs, PinDir, ip, sample, site_files};
use super::procs::{self, Running};
use super::report::Report;
use super::{Bench, write};

const KNOWN: &str = "known.accuracy.test";
const DOMAIN: &str = "accuracy.test";
const SERVER_IP: &str = "10.238.0.1";
/// The client address whose segments are full-size.
const WHOLE_IP: &str = "10.238.0.2";
/// The client address the server advertises a small MSS to.
const SPLIT_IP: &str = "10.238.0.3";
const SPLIT_MSS: u16 = 256;
const UPSTREAM_PORT: u16 = 19100;
const BODY: &str = "served by the accuracy upstream";
/// How long one fetch may take, connect to last byte.
const FETCH_TIMEOUT: Duration = Duration::from_secs(15);
const READY: Duration = Duration::from_secs(30);

/// The kernel counters printed per client in eBPF mode: which path judged the connections.
/// `sock_added` is the socket path (split hellos); `parser_waited` only moves when the stream
/// parser ran while the record was still short, which segments sent back to back rarely allow
/// (the whole record is usually queued by the time it runs).
const KERNEL_COUNTERS: &[&str] = &[
    "pass",
    "unknown",
    "sock_added",
    "parser_waited",
    "passed_before_accept",
    "reset_before_accept_unknown",
    "early_not_first",
    "deferred",
    "early_reset_unsent",
];

#[derive(Clone, Copy)]
struct Mode {
    name: &'static str,
    https: u16,
    http: u16,
    admin: u16,
}

const MODES: [Mode; 2] = [
    Mode {
        name: "ebpf",
        https: 19846,
        http: 19086,
        admin: 19256,
    },
    Mode {
        name: "userspace",
        https: 19847,
        http: 19087,
        admin: 19257,
    },
];

#[derive(Clone, Copy, PartialEq)]
enum Client {
    Chromium,
    CurlSingle,
    CurlSplit,
}

impl Client {
    fn label(self) -> &'static str {
        match self {
            Client::Chromium => "chromium (2 segments)",
            Client::CurlSingle => "curl (1 segment)",
            Client::CurlSplit => "curl (split, MSS 256)",
        }
    }
}

/// What one fetch came to.
enum Outcome {
    /// The handshake completed and an answer came back; `ours` when it is the upstream's body.
    Served { ours: bool },
    /// Reset or closed before the handshake completed.
    Refused,
    /// Anything else, with the client's reason.
    Other(String),
}

#[derive(Default)]
struct Tally {
    known: usize,
    known_served: usize,
    known_refused: usize,
    unknown: usize,
    unknown_refused: usize,
    unknown_served: usize,
    others: Vec<String>,
    kernel: Vec<(&'static str, f64)>,
}

impl Tally {
    fn add(&mut self, known: bool, outcome: Outcome) {
        match (known, outcome) {
            (true, Outcome::Served { ours: true }) => self.known_served += 1,
            (true, Outcome::Refused) => self.known_refused += 1,
            (false, Outcome::Refused) => self.unknown_refused += 1,
            (false, Outcome::Served { .. }) => self.unknown_served += 1,
            (true, Outcome::Served { ours: false }) => {
                self.others
                    .push("known: served, not the upstream's body".into());
            }
            (known, Outcome::Other(why)) => self.others.push(format!(
                "{}: {why}",
                if known { "known" } else { "unknown" }
            )),
        }
        if known {
            self.known += 1;
        } else {
            self.unknown += 1;
        }
    }
}

pub fn run(bench: &Bench, quick: bool) -> Result<()> {
    if let Some(why) = super::gate::unavailable(bench).or_else(|| {
        ["chromium", "ethtool", "timeout"]
            .iter()
            .find_map(|tool| procs::require(tool).err().map(|e| e.to_string()))
    }) {
        if std::env::var("CI").is_ok_and(|v| v == "true" || v == "1") {
            bail!("gate accuracy benchmark cannot run under CI=true: {why}");
        }
        bench
            .report
            .skip(format!("\n## Kernel SNI gate accuracy: skipped ({why})"));
        return Ok(());
    }
    let started = Instant::now();
    let (chromium_count, curl_count) = if quick { (5, 20) } else { (20, 100) };
    let site = Site::start(bench)?;
    let mut results = Vec::new();
    for mode in MODES {
        for (client, count) in [
            (Client::Chromium, chromium_count),
            (Client::CurlSingle, curl_count),
            (Client::CurlSplit, curl_count),
        ] {
            results.push((mode, client, site.tally(mode, client, count)?));
        }
    }
    report(&bench.report, chromium_count, curl_count, &results);
    drop(site);
    writeln!(
        bench.report,
        "(accuracy section: {:.0} s)",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

fn report(
    out: &Report,
    chromium_count: usize,
    curl_count: usize,
    results: &[(Mode, Client, Tally)],
) {
    writeln!(
        out,
        "\n## Kernel SNI gate accuracy: real clients across a veth, both modes"
    );
    writeln!(
        out,
        "per mode: chromium {chromium_count} fetches, each curl {curl_count}, alternating {KNOWN} and a fresh unknown name"
    );
    writeln!(
        out,
        "{:<10} {:<22} {:>6} {:>7} {:>14} {:>6} {:>8} {:>8} {:>13} {:>6}",
        "mode",
        "client",
        "known",
        "served",
        "false reject",
        "other",
        "unknown",
        "refused",
        "false admit",
        "other"
    );
    let (mut false_rejects, mut false_admits) = (0, 0);
    for (mode, client, t) in results {
        let known_other = t.known - t.known_served - t.known_refused;
        let unknown_other = t.unknown - t.unknown_refused - t.unknown_served;
        false_rejects += t.known - t.known_served;
        false_admits += t.unknown_served;
        writeln!(
            out,
            "{:<10} {:<22} {:>6} {:>7} {:>14} {:>6} {:>8} {:>8} {:>13} {:>6}",
            mode.name,
            client.label(),
            t.known,
            t.known_served,
            t.known_refused,
            known_other,
            t.unknown,
            t.unknown_refused,
            t.unknown_served,
            unknown_other
        );
    }
    writeln!(
        out,
        "false rejects (known names not served, refused or other): {false_rejects}; false admits (unknown names served): {false_admits}"
    );
    for (mode, client, t) in results {
        for other in &t.others {
            writeln!(out, "other, {} {}: {other}", mode.name, client.label());
        }
    }
    writeln!(
        out,
        "kernel counters moved per client in eBPF mode (ingress_ebpf_gate_total):"
    );
    for (mode, client, t) in results {
        if t.kernel.is_empty() {
            continue;
        }
        let mut line = String::new();
        for (name, value) in &t.kernel {
            let _ = write!(line, " {name}={value:.0}");
        }
        writeln!(out, "  {} {}:{line}", mode.name, client.label());
    }
}

// ---------------------------------------------------------------------------------------------
// The site

/// Field order is drop order: processes stop before the cgroup, pins and namespaces go.
struct Site {
    _ebpf: Running,
    _userspace: Running,
    _upstream: Running,
    _cgroup: Cgroup,
    _pins: PinDir,
    client: NetNs,
    server: NetNs,
    dir: PathBuf,
}

impl Site {
    fn start(bench: &Bench) -> Result<Site> {
        let pid = std::process::id();
        let dir = bench.scratch("gate-accuracy")?;
        let server = NetNs::create(&format!("ingress-bench-gate-{pid}-server"))?;
        let client = NetNs::create(&format!("ingress-bench-gate-{pid}-client"))?;
        wire(&server, &client)?;
        let cgroup = Cgroup::create(&format!("ingress-bench-gate-{pid}-accuracy"))?;
        let pins = PinDir(PathBuf::from(format!(
            "/sys/fs/bpf/ingress-bench-gate-{pid}-accuracy"
        )));
        let manifests = site_files(&dir, KNOWN, UPSTREAM_PORT)?;

        write(
            &dir.join("upstream.conf"),
            &format!(
                "worker_processes 1; daemon off; pid {d}/upstream.pid; error_log {d}/upstream-error.log;\n\
                 events {{ worker_connections 1024; }}\n\
                 http {{ access_log off; server {{ listen 127.0.0.1:{UPSTREAM_PORT};\n\
                 location / {{ return 200 \"{BODY}\\n\"; }} }} }}\n",
                d = dir.display()
            ),
        )?;
        let mut upstream_cmd = server.command(None, "nginx");
        upstream_cmd
            .args(["-p", &dir.to_string_lossy(), "-c"])
            .arg(dir.join("upstream.conf"));
        let upstream = Running::start("upstream", upstream_cmd, &dir.join("upstream.log"))?;

        let proxy_args = |mode: Mode| -> Vec<String> {
            let mut args: Vec<String> = [
                "--manifests",
                &manifests.display().to_string(),
                "--mode",
                mode.name,
                "--bind",
                SERVER_IP,
                "--http-port",
                &mode.http.to_string(),
                "--https-port",
                &mode.https.to_string(),
                "--admin-port",
                &mode.admin.to_string(),
                "--access-log",
                "false",
                "--log-level",
                "warn",
            ]
            .map(String::from)
            .to_vec();
            if mode.name == "ebpf" {
                args.extend([
                    "--bpf-pin-dir".into(),
                    pins.0.display().to_string(),
                    "--bpf-cgroup".into(),
                    cgroup.path.display().to_string(),
                ]);
            }
            args
        };
        // The eBPF proxy joins its own cgroup before it listens, so its sock_ops program sees
        // only its own connections.
        let mut ebpf_cmd = server.command(None, "sh");
        ebpf_cmd
            .args(["-c", "echo 0 > \"$0\" && exec \"$@\""])
            .arg(cgroup.path.join("cgroup.procs"))
            .arg(&bench.ingress)
            .args(proxy_args(MODES[0]));
        let ebpf = Running::start("ingress (ebpf)", ebpf_cmd, &dir.join("ingress-ebpf.log"))?;
        let mut userspace_cmd = server.command(None, &bench.ingress.to_string_lossy());
        userspace_cmd.args(proxy_args(MODES[1]));
        let userspace = Running::start(
            "ingress (userspace)",
            userspace_cmd,
            &dir.join("ingress-userspace.log"),
        )?;
        let site = Site {
            _ebpf: ebpf,
            _userspace: userspace,
            _upstream: upstream,
            _cgroup: cgroup,
            _pins: pins,
            client,
            server,
            dir,
        };
        for mode in MODES {
            site.wait_ready(mode).with_context(|| {
                format!(
                    "log {}",
                    site.dir
                        .join(format!("ingress-{}.log", mode.name))
                        .display()
                )
            })?;
        }
        Ok(site)
    }

    fn wait_ready(&self, mode: Mode) -> Result<()> {
        let deadline = Instant::now() + READY;
        loop {
            if let Outcome::Served { ours: true } = self.curl(mode, KNOWN, WHOLE_IP)? {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "ingress --mode {} did not serve {KNOWN} within {READY:?}",
                    mode.name
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn tally(&self, mode: Mode, client: Client, count: usize) -> Result<Tally> {
        let before = self.scrape(mode)?;
        let mut tally = Tally::default();
        for i in 0..count {
            let known = i % 2 == 0;
            let host = if known {
                KNOWN.to_string()
            } else {
                format!("unknown-{}-{i}.{DOMAIN}", std::process::id())
            };
            let outcome = match client {
                Client::Chromium => self.chromium(mode, &host)?,
                Client::CurlSingle => self.curl(mode, &host, WHOLE_IP)?,
                Client::CurlSplit => self.curl(mode, &host, SPLIT_IP)?,
            };
            tally.add(known, outcome);
        }
        if mode.name == "ebpf" {
            let after = self.scrape(mode)?;
            for name in KERNEL_COUNTERS {
                let series = format!("ingress_ebpf_gate_total{{counter=\"{name}\"}}");
                tally
                    .kernel
                    .push((name, sample(&after, &series) - sample(&before, &series)));
            }
        }
        Ok(tally)
    }

    fn curl(&self, mode: Mode, host: &str, from: &str) -> Result<Outcome> {
        let out = self
            .client
            .command(None, "curl")
            .args(["-sk", "--interface", from, "--max-time"])
            .arg(FETCH_TIMEOUT.as_secs().to_string())
            .args(["-w", "\n%{http_code}", "--resolve"])
            .arg(format!("{host}:{}:{SERVER_IP}", mode.https))
            .arg(format!("https://{host}:{}/", mode.https))
            .output()
            .context("running curl")?;
        let text = String::from_utf8_lossy(&out.stdout);
        let status = text.rsplit('\n').next().unwrap_or("").trim();
        Ok(match out.status.code() {
            Some(0) => Outcome::Served {
                ours: status == "200" && text.contains(BODY),
            },
            // 35: the TLS handshake failed (reset or closed by the peer); 56: receive failure.
            Some(35 | 56) if status == "000" => Outcome::Refused,
            code => Outcome::Other(format!("curl exit {code:?}, HTTP status {status}")),
        })
    }

    fn chromium(&self, mode: Mode, host: &str) -> Result<Outcome> {
        let profile = self.dir.join("chromium-profile");
        let _ = std::fs::remove_dir_all(&profile);
        let mut cmd = self.client.command(None, "timeout");
        cmd.arg(FETCH_TIMEOUT.as_secs().to_string())
            .args([
                "chromium",
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                // The certificate is self-signed; the gate decides before it is ever sent.
                "--ignore-certificate-errors",
            ])
            .arg(format!("--user-data-dir={}", profile.display()))
            .arg(format!("--host-resolver-rules=MAP *.{DOMAIN} {SERVER_IP}"))
            .arg("--dump-dom")
            .arg(format!("https://{host}:{}/", mode.https));
        let out = cmd.output().context("running chromium")?;
        let _ = std::fs::remove_dir_all(&profile);
        let dom = String::from_utf8_lossy(&out.stdout);
        let log = String::from_utf8_lossy(&out.stderr);
        // Headless Chromium logs a failed navigation as "Page load failed: net::ERR_...".
        let failure = log
            .lines()
            .find_map(|l| l.split_once("Page load failed: ").map(|(_, e)| e.trim()));
        Ok(match failure {
            Some("net::ERR_CONNECTION_RESET" | "net::ERR_CONNECTION_CLOSED") => Outcome::Refused,
            Some(other) => Outcome::Other(format!("chromium: {other}")),
            None if out.status.code() == Some(124) => {
                Outcome::Other("chromium: no answer within the timeout".into())
            }
            None if !dom.trim().is_empty() => Outcome::Served {
                ours: dom.contains(BODY),
            },
            None => Outcome::Other(format!(
                "chromium exited {:?} with no page and no reason",
                out.status.code()
            )),
        })
    }

    fn scrape(&self, mode: Mode) -> Result<String> {
        let out = self
            .server
            .command(None, "curl")
            .args(["-s", "--max-time", "5"])
            .arg(format!("http://{SERVER_IP}:{}/metrics", mode.admin))
            .output()?;
        ensure!(
            out.status.success(),
            "scraping /metrics of the {} proxy failed",
            mode.name
        );
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

/// The veth between the namespaces, offloads off so segments cross as TCP cut them, and the
/// server's small-MSS route to [`SPLIT_IP`].
fn wire(server: &NetNs, client: &NetNs) -> Result<()> {
    ip(&[
        "link",
        "add",
        "acc-srv",
        "netns",
        &server.name,
        "type",
        "veth",
        "peer",
        "name",
        "acc-cli",
        "netns",
        &client.name,
    ])?;
    for (ns, dev, addrs) in [
        (server, "acc-srv", vec![format!("{SERVER_IP}/24")]),
        (
            client,
            "acc-cli",
            vec![format!("{WHOLE_IP}/24"), format!("{SPLIT_IP}/24")],
        ),
    ] {
        for addr in &addrs {
            ip(&["-n", &ns.name, "addr", "add", addr, "dev", dev])?;
        }
        ip(&["-n", &ns.name, "link", "set", dev, "up"])?;
        offloads_off(ns, dev)?;
    }
    ip(&[
        "-n",
        &server.name,
        "route",
        "add",
        &format!("{SPLIT_IP}/32"),
        "dev",
        "acc-srv",
        "advmss",
        &SPLIT_MSS.to_string(),
    ])
}

fn offloads_off(ns: &NetNs, dev: &str) -> Result<()> {
    let out = ns
        .command(None, "ethtool")
        .args(["-K", dev, "tso", "off", "gso", "off", "gro", "off"])
        .args(["tx", "off", "rx", "off"])
        .output()
        .context("running ethtool")?;
    ensure!(
        out.status.success(),
        "ethtool -K {dev}: {}",
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(())
}
