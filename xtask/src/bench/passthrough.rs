//! TLS passthrough bulk transfer: ingress splicing in the kernel (eBPF mode) against ingress
//! copying in userspace and haproxy (`mode tcp`, SNI routing with `req.ssl_sni`, with and
//! without `option splice-auto`), in one run, inside a namespace pair this section creates and
//! always deletes.
//!
//! ```text
//!   client ns  10.237.0.2 ── veth ── 10.237.0.1  server ns
//!   core 1: the load (one thread per          core 0: the proxies, one measured at a time
//!           direction per connection)                 ingress --mode ebpf        :19601
//!                                                     ingress --mode userspace   :19602
//!                                                     haproxy                    :19603
//!                                                     haproxy, option splice-auto :19604
//!                                             core 1: the backend, 127.0.0.1:19500
//! ```
//!
//! Each connection opens with a real ClientHello naming the passthrough host, so the kernel
//! gate, ingress's userspace parser and haproxy's `req.ssl_sni` all route it; after it both
//! ends stream raw bytes at each other at once. The backend is a plain TCP source and sink
//! behind that ClientHello, not a TLS server: the proxies never look past the first record, and
//! without encryption the load generator's CPU does not cap the transfer.
//!
//! Per run: wall time, the proxy's CPU (its threads' scheduler run time) and the machine's busy
//! CPU (/proc/stat, every core). The key figure is bytes per proxy CPU-second. Spliced bytes
//! move in softirq and workqueue context, charged to no process, so the machine column is
//! printed beside it: it counts the kernel's share too (and the load generator, the same for
//! every proxy, and whatever else the machine runs). Proxies take turns round by round and the
//! median round is reported. Nothing passes or fails on a number.

use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, mpsc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};

use super::procs::{self, Running};
use super::report::Report;
use super::{Bench, median, write};

const SERVER_IP: Ipv4Addr = Ipv4Addr::new(10, 237, 0, 1);
const CLIENT_IP: Ipv4Addr = Ipv4Addr::new(10, 237, 0, 2);
const BACKEND_PORT: u16 = 19500;
/// The passthrough host: the only name any proxy routes.
const HOST: &str = "db.bench.local";
/// Namespace names start with this, then the bench's pid.
const NS_PREFIX: &str = "ingress-bench-pt-";
/// How long any one socket operation of the load may block before the run is abandoned.
const IO_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a proxy may take to route its first connection.
const READY: Duration = Duration::from_secs(30);
const CHUNK: usize = 256 * 1024;
/// The backend's answer to the ClientHello. A TLS client sends nothing more (bar at most its
/// early data) until the server's first flight arrives; the load keeps to that.
const GREETING: &[u8; 8] = b"SRVHELLO";
const MIB: u64 = 1 << 20;

/// One proxy under test, listening in the server namespace.
struct Proxy {
    name: &'static str,
    port: u16,
    process: Running,
    /// ingress's admin port, for its counters.
    admin: Option<u16>,
}

/// One measured transfer.
#[derive(Clone, Copy)]
struct Sample {
    wall: Duration,
    proxy_cpu: Duration,
    machine_cpu: Duration,
    bytes: u64,
}

impl Sample {
    fn mib_per_s(&self) -> f64 {
        self.bytes as f64 / MIB as f64 / self.wall.as_secs_f64().max(1e-9)
    }

    fn mib_per_proxy_cpu_s(&self) -> f64 {
        self.bytes as f64 / MIB as f64 / self.proxy_cpu.as_secs_f64().max(1e-6)
    }

    fn mib_per_machine_cpu_s(&self) -> f64 {
        self.bytes as f64 / MIB as f64 / self.machine_cpu.as_secs_f64().max(1e-6)
    }
}

/// How much a run moves.
#[derive(Clone, Copy)]
struct Load {
    connections: usize,
    /// Bytes each way per connection.
    per_connection: u64,
}

pub fn run(bench: &Bench, quick: bool) -> Result<()> {
    writeln!(bench.report, "\n## TLS passthrough bulk transfer");
    if let Some(why) = unavailable() {
        bench.report.skip(format!("skipped: {why}"));
        return Ok(());
    }
    sweep_leftovers();
    let load = Load {
        connections: 4,
        per_connection: if quick { 128 * MIB } else { 512 * MIB },
    };
    let dir = bench.scratch("passthrough")?;
    let pair = Pair::create()?;
    let backend = Backend::start(&pair)?;
    let hello = client_hello(HOST);

    let ebpf = ebpf_unavailable(&bench.ingress);
    let pins = PinDir(PathBuf::from(format!(
        "/sys/fs/bpf/{NS_PREFIX}{}",
        std::process::id()
    )));
    let manifests = manifests(&dir)?;
    let mut proxies = Vec::new();
    match &ebpf {
        None => proxies.push(start_ingress(
            bench,
            &pair,
            &dir,
            &manifests,
            "ebpf",
            19601,
            Some(&pins.0),
        )?),
        Some(why) => writeln!(bench.report, "ingress ebpf: not measured ({why})"),
    }
    proxies.push(start_ingress(
        bench,
        &pair,
        &dir,
        &manifests,
        "userspace",
        19602,
        None,
    )?);
    proxies.push(start_haproxy(&pair, &dir, "haproxy", 19603, false)?);
    proxies.push(start_haproxy(&pair, &dir, "haproxy splice", 19604, true)?);
    for proxy in &proxies {
        wait_routed(&pair, &backend, proxy, &hello)
            .with_context(|| format!("{} never routed a connection", proxy.name))?;
    }

    writeln!(
        bench.report,
        "{} connections, {} MiB each way per connection ({} MiB per run), {} rounds; backend: a plain TCP source and sink behind a real ClientHello for {HOST}, so nothing is encrypted and the proxies route on SNI alone",
        load.connections,
        load.per_connection / MIB,
        load.connections as u64 * load.per_connection * 2 / MIB,
        bench.rounds
    );
    let mut samples: Vec<Vec<Sample>> = vec![Vec::new(); proxies.len()];
    for round in 0..bench.rounds {
        // Each round starts with a different proxy, so none always runs first.
        for turn in 0..proxies.len() {
            let index = (round + turn) % proxies.len();
            let proxy = &proxies[index];
            let sample = measure(&pair, &backend, proxy, &hello, load)
                .with_context(|| format!("{}, round {}", proxy.name, round + 1))?;
            samples[index].push(sample);
        }
    }
    report(&bench.report, &proxies, &samples);
    if let Some(proxy) = proxies.iter().find(|p| p.name == "ingress ebpf") {
        print_splice_counts(&bench.report, &pair, proxy)?;
    }
    // Processes stop before their pins go, and the namespaces last.
    drop(proxies);
    drop(pins);
    drop(backend);
    drop(pair);
    Ok(())
}

/// Why the section cannot run here, if it cannot.
fn unavailable() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("needs root for network namespaces".into());
    }
    for tool in ["haproxy", "nsenter", "ip", "curl"] {
        if procs::require(tool).is_err() {
            return Some(format!("{tool} is not installed"));
        }
    }
    None
}

/// Why eBPF mode cannot be measured, if it cannot.
fn ebpf_unavailable(ingress: &Path) -> Option<String> {
    if !Path::new("/sys/kernel/btf/vmlinux").exists() {
        return Some("the kernel has no BTF".into());
    }
    let version = Command::new(ingress).arg("version").output();
    match version {
        Ok(out) if String::from_utf8_lossy(&out.stdout).contains("(eBPF object embedded)") => None,
        Ok(_) => Some("the binary carries no eBPF object".into()),
        Err(e) => Some(format!("running {}: {e}", ingress.display())),
    }
}

// ---------------------------------------------------------------------------------------------
// Measuring

fn measure(
    pair: &Pair,
    backend: &Backend,
    proxy: &Proxy,
    hello: &[u8],
    load: Load,
) -> Result<Sample> {
    let cpu_before = thread_cpu(proxy.process.pid())?;
    let machine_before = machine_busy()?;
    let wall = transfer(pair, backend, proxy.port, hello, load)?;
    let machine_cpu = machine_busy()?.saturating_sub(machine_before);
    let proxy_cpu = thread_cpu(proxy.process.pid())?.saturating_sub(cpu_before);
    Ok(Sample {
        wall,
        proxy_cpu,
        machine_cpu,
        bytes: load.connections as u64 * load.per_connection * 2,
    })
}

/// Runs `load` through the proxy on `port`; checks every byte arrived both ways; returns the
/// wall time from the first connect to the last byte.
fn transfer(
    pair: &Pair,
    backend: &Backend,
    port: u16,
    hello: &[u8],
    load: Load,
) -> Result<Duration> {
    let started = Instant::now();
    let target = SocketAddr::from((SERVER_IP, port));
    let clients: Vec<JoinHandle<Result<u64>>> = (0..load.connections)
        .map(|_| {
            let hello = hello.to_vec();
            spawn_in(&pair.client_path(), 1, move || {
                client(target, &hello, load.per_connection)
            })
        })
        .collect();
    for client in clients {
        let received = client
            .join()
            .map_err(|_| anyhow::anyhow!("a client thread panicked"))??;
        ensure!(
            received == load.per_connection,
            "a client received {received} of {} bytes",
            load.per_connection
        );
    }
    let wall = started.elapsed();
    for _ in 0..load.connections {
        let received = backend
            .served
            .recv_timeout(IO_TIMEOUT)
            .context("the backend reported no connection")?;
        ensure!(
            received == load.per_connection,
            "the backend received {received} of {} bytes",
            load.per_connection
        );
    }
    Ok(wall)
}

/// One connection, in the order TLS has it: the ClientHello, the backend's answer (as a
/// ServerHello would be), then how many bytes the backend is to send, and `bytes` each way at
/// once. Returns how many bytes came back before the backend's EOF.
fn client(target: SocketAddr, hello: &[u8], bytes: u64) -> Result<u64> {
    let mut stream = TcpStream::connect_timeout(&target, IO_TIMEOUT)
        .with_context(|| format!("connecting to {target}"))?;
    stream.set_read_timeout(Some(IO_TIMEOUT))?;
    stream.set_write_timeout(Some(IO_TIMEOUT))?;
    stream.set_nodelay(true)?;
    stream.write_all(hello)?;
    let mut answer = [0u8; GREETING.len()];
    stream
        .read_exact(&mut answer)
        .context("waiting for the backend's answer to the ClientHello")?;
    ensure!(answer == *GREETING, "the backend answered {answer:?}");
    stream.write_all(&bytes.to_le_bytes())?;
    let sender = {
        let stream = stream.try_clone()?;
        std::thread::spawn(move || send(&stream, bytes))
    };
    let received = drain(&mut stream);
    sender
        .join()
        .map_err(|_| anyhow::anyhow!("a sender thread panicked"))?
        .context("sending")?;
    received.context("receiving")
}

/// Writes `bytes` bytes, then half-closes.
fn send(mut stream: &TcpStream, bytes: u64) -> std::io::Result<()> {
    let chunk = vec![0x5au8; CHUNK];
    let mut left = bytes;
    while left > 0 {
        let n = usize::try_from(left.min(CHUNK as u64)).unwrap_or(CHUNK);
        stream.write_all(chunk.get(..n).unwrap_or(&chunk))?;
        left -= n as u64;
    }
    stream.shutdown(std::net::Shutdown::Write)
}

/// Reads to EOF; the byte count.
fn drain(stream: &mut TcpStream) -> std::io::Result<u64> {
    let mut buf = vec![0u8; CHUNK];
    let mut total = 0u64;
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return Ok(total),
            Ok(n) => total += n as u64,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// Retries a one-byte transfer until the proxy routes it: it is listening, has its routes and,
/// in eBPF mode, its gate.
fn wait_routed(pair: &Pair, backend: &Backend, proxy: &Proxy, hello: &[u8]) -> Result<()> {
    let deadline = Instant::now() + READY;
    let probe = Load {
        connections: 1,
        per_connection: 1,
    };
    loop {
        let outcome = transfer(pair, backend, proxy.port, hello, probe);
        match outcome {
            Ok(_) => return Ok(()),
            Err(e) if Instant::now() > deadline => return Err(e),
            Err(_) => {
                // A half-served probe may have left a report behind.
                while backend.served.try_recv().is_ok() {}
                std::thread::sleep(Duration::from_millis(200));
            }
        }
    }
}

/// Scheduler run time of every thread of `pid` (nanosecond resolution, unlike the tick counts
/// of /proc/<pid>/stat, which a spliced transfer barely moves).
fn thread_cpu(pid: u32) -> Result<Duration> {
    let mut total = 0u64;
    for entry in std::fs::read_dir(format!("/proc/{pid}/task"))? {
        let path = entry?.path().join("schedstat");
        // A thread that exited between the listing and the read has nothing to add.
        let Ok(text) = std::fs::read_to_string(path) else {
            continue;
        };
        total += text
            .split_whitespace()
            .next()
            .and_then(|ns| ns.parse::<u64>().ok())
            .unwrap_or(0);
    }
    Ok(Duration::from_nanos(total))
}

/// Busy time of every CPU together, from the first line of /proc/stat.
fn machine_busy() -> Result<Duration> {
    let stat = std::fs::read_to_string("/proc/stat")?;
    let line = stat.lines().next().context("empty /proc/stat")?;
    let fields: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal: all but idle and iowait are busy.
    let busy: u64 = fields
        .iter()
        .take(8)
        .enumerate()
        .filter(|(i, _)| *i != 3 && *i != 4)
        .map(|(_, v)| v)
        .sum();
    // SAFETY: sysconf has no preconditions.
    let hz = u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) })
        .unwrap_or(100)
        .max(1);
    Ok(Duration::from_millis(busy * 1000 / hz))
}

fn report(out: &Report, proxies: &[Proxy], samples: &[Vec<Sample>]) {
    let medians: Vec<Sample> = samples
        .iter()
        .map(|runs| {
            let pick = |f: fn(&Sample) -> f64| median(runs.iter().map(f).collect());
            // Each column's own median, carried in a sample for the printing below.
            Sample {
                wall: Duration::from_secs_f64(pick(|s| s.wall.as_secs_f64())),
                proxy_cpu: Duration::from_secs_f64(pick(|s| s.proxy_cpu.as_secs_f64())),
                machine_cpu: Duration::from_secs_f64(pick(|s| s.machine_cpu.as_secs_f64())),
                bytes: runs.first().map(|s| s.bytes).unwrap_or(0),
            }
        })
        .collect();
    let per_proxy_cpu: Vec<f64> = samples
        .iter()
        .map(|runs| median(runs.iter().map(Sample::mib_per_proxy_cpu_s).collect()))
        .collect();
    let per_machine_cpu: Vec<f64> = samples
        .iter()
        .map(|runs| median(runs.iter().map(Sample::mib_per_machine_cpu_s).collect()))
        .collect();
    let throughput: Vec<f64> = samples
        .iter()
        .map(|runs| median(runs.iter().map(Sample::mib_per_s).collect()))
        .collect();
    writeln!(
        out,
        "{:<16} {:>10} {:>11} {:>14} {:>12} {:>16}",
        "proxy", "MiB/s", "proxy CPU", "MiB/proxy-CPU-s", "machine CPU", "MiB/machine-CPU-s"
    );
    for (i, proxy) in proxies.iter().enumerate() {
        writeln!(
            out,
            "{:<16} {:>10.0} {:>10.3}s {:>14.0} {:>11.2}s {:>16.0}",
            proxy.name,
            throughput[i],
            medians[i].proxy_cpu.as_secs_f64(),
            per_proxy_cpu[i],
            medians[i].machine_cpu.as_secs_f64(),
            per_machine_cpu[i],
        );
    }
    let find = |name: &str| proxies.iter().position(|p| p.name == name);
    let Some(ebpf) = find("ingress ebpf") else {
        return;
    };
    for (other, target) in [
        ("ingress userspace", "target >= 1.5x"),
        ("haproxy", "target > 1x"),
        ("haproxy splice", "target > 1x"),
    ] {
        if let Some(o) = find(other) {
            writeln!(
                out,
                "ratio ingress ebpf/{other}: bytes per proxy CPU-second {:.2}x ({target}), per machine CPU-second {:.2}x, throughput {:.2}x",
                per_proxy_cpu[ebpf] / per_proxy_cpu[o],
                per_machine_cpu[ebpf] / per_machine_cpu[o],
                throughput[ebpf] / throughput[o],
            );
        }
    }
    let rounds = |i: usize| {
        samples[i]
            .iter()
            .map(|s| s.mib_per_proxy_cpu_s().round())
            .collect::<Vec<_>>()
    };
    let all: Vec<String> = proxies
        .iter()
        .enumerate()
        .map(|(i, p)| format!("{} {:?}", p.name, rounds(i)))
        .collect();
    writeln!(out, "rounds (MiB per proxy CPU-second): {}", all.join(", "));
}

/// What ingress counted: connections spliced and fallbacks to the copy.
fn print_splice_counts(report: &Report, pair: &Pair, proxy: &Proxy) -> Result<()> {
    let Some(admin) = proxy.admin else {
        return Ok(());
    };
    let out = Command::new("nsenter")
        .arg(format!("--net={}", pair.server_path().display()))
        .args(["curl", "-s", &format!("http://127.0.0.1:{admin}/metrics")])
        .output()
        .context("reading ingress metrics")?;
    let text = String::from_utf8_lossy(&out.stdout);
    let sum = |name: &str, label: &str| -> f64 {
        text.lines()
            .filter(|l| l.starts_with(name) && l.contains(label))
            .filter_map(|l| l.rsplit_once(' ').and_then(|(_, v)| v.parse::<f64>().ok()))
            // An empty float sum is -0, which prints as "-0".
            .sum::<f64>()
            + 0.0
    };
    writeln!(
        report,
        "ingress ebpf counted {:.0} connections spliced in the kernel, {:.0} copied in userspace, {:.0} fallbacks, {:.0} redirected messages, {:.0} retransmissions trimmed",
        sum("ingress_passthrough_connections_total{", "mode=\"kernel\""),
        sum(
            "ingress_passthrough_connections_total{",
            "mode=\"userspace\""
        ),
        sum("ingress_passthrough_fallbacks_total{", ""),
        sum("ingress_ebpf_gate_total{", "counter=\"splice_redirected\""),
        sum("ingress_ebpf_gate_total{", "counter=\"splice_trimmed\""),
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// The proxies

fn manifests(dir: &Path) -> Result<PathBuf> {
    let manifests = dir.join("manifests");
    std::fs::create_dir_all(&manifests)?;
    write(
        &manifests.join("passthrough.yaml"),
        &format!(
            "apiVersion: v1\nkind: Service\nmetadata: {{name: db, namespace: bench}}\nspec: {{ports: [{{name: tls, port: 443}}]}}\n---\n\
             apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: db-1, namespace: bench, labels: {{kubernetes.io/service-name: db}}}}\n\
             addressType: IPv4\nports: [{{name: tls, port: {BACKEND_PORT}}}]\nendpoints: [{{addresses: [\"127.0.0.1\"]}}]\n---\n\
             apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {{name: db, namespace: bench, annotations: {{nginx.ingress.kubernetes.io/ssl-passthrough: \"true\"}}}}\n\
             spec:\n  ingressClassName: ingress\n  rules:\n  - host: {HOST}\n    http: {{paths: [{{path: /, pathType: Prefix, backend: {{service: {{name: db, port: {{number: 443}}}}}}}}]}}\n"
        ),
    )?;
    Ok(manifests)
}

fn start_ingress(
    bench: &Bench,
    pair: &Pair,
    dir: &Path,
    manifests: &Path,
    mode: &str,
    port: u16,
    pins: Option<&Path>,
) -> Result<Proxy> {
    let admin = port + 100;
    let mut cmd = pair.in_server(0, &bench.ingress.to_string_lossy());
    cmd.arg("--manifests")
        .arg(manifests)
        .args(["--mode", mode, "--bind", "0.0.0.0", "--worker-threads", "1"])
        .args(["--access-log", "false", "--log-level", "warn"])
        .args(["--https-port", &port.to_string()])
        .args(["--http-port", &(port + 50).to_string()])
        .args(["--admin-port", &admin.to_string()]);
    if let Some(pins) = pins {
        cmd.arg("--bpf-pin-dir").arg(pins);
    }
    let process = Running::start("ingress", cmd, &dir.join(format!("ingress-{mode}.log")))?;
    Ok(Proxy {
        name: if mode == "ebpf" {
            "ingress ebpf"
        } else {
            "ingress userspace"
        },
        port,
        process,
        admin: Some(admin),
    })
}

fn start_haproxy(
    pair: &Pair,
    dir: &Path,
    name: &'static str,
    port: u16,
    splice: bool,
) -> Result<Proxy> {
    let config = dir.join(format!("haproxy-{port}.cfg"));
    write(
        &config,
        &format!(
            "global\n  nbthread 1\n  maxconn 1000\n\
             defaults\n  mode tcp\n  timeout connect 5s\n  timeout client 120s\n  timeout server 120s\n{splice}\
             frontend passthrough\n  bind 0.0.0.0:{port}\n  tcp-request inspect-delay 5s\n\
             \x20 tcp-request content accept if {{ req.ssl_hello_type 1 }}\n\
             \x20 use_backend db if {{ req.ssl_sni -i {HOST} }}\n\
             backend db\n  server db 127.0.0.1:{BACKEND_PORT}\n",
            splice = if splice { "  option splice-auto\n" } else { "" },
        ),
    )?;
    let mut cmd = pair.in_server(0, "haproxy");
    cmd.arg("-db").arg("-f").arg(&config);
    let process = Running::start("haproxy", cmd, &dir.join(format!("haproxy-{port}.log")))?;
    Ok(Proxy {
        name,
        port,
        process,
        admin: None,
    })
}

// ---------------------------------------------------------------------------------------------
// The backend: a TCP source and sink behind the ClientHello

/// Field order is drop order: stop the accept loop before it is joined.
struct Backend {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Result<()>>>,
    /// Bytes received on each connection served, in the order they ended.
    served: mpsc::Receiver<u64>,
}

impl Backend {
    fn start(pair: &Pair) -> Result<Backend> {
        let stop = Arc::new(AtomicBool::new(false));
        let (served_tx, served) = mpsc::channel();
        let (bound_tx, bound) = mpsc::channel();
        let flag = stop.clone();
        let thread = spawn_in(&pair.server_path(), 1, move || {
            let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, BACKEND_PORT))?;
            listener.set_nonblocking(true)?;
            let _ = bound_tx.send(());
            while !flag.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((stream, _)) => {
                        let served = served_tx.clone();
                        // Threads start in this thread's namespace and on its CPU.
                        std::thread::spawn(move || {
                            if let Ok(received) = serve(stream) {
                                let _ = served.send(received);
                            }
                        });
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(2));
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            Ok(())
        });
        bound
            .recv_timeout(Duration::from_secs(10))
            .context("the backend did not start")?;
        Ok(Backend {
            stop,
            thread: Some(thread),
            served,
        })
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Skips the ClientHello record and answers it, reads how many bytes to send, sends them while
/// reading to EOF; returns the bytes read after the header.
fn serve(mut stream: TcpStream) -> Result<u64> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(IO_TIMEOUT))?;
    stream.set_write_timeout(Some(IO_TIMEOUT))?;
    stream.set_nodelay(true)?;
    let mut header = [0u8; 5];
    stream.read_exact(&mut header)?;
    let record = usize::from(u16::from_be_bytes([header[3], header[4]]));
    let mut skipped = vec![0u8; record];
    stream.read_exact(&mut skipped)?;
    stream.write_all(GREETING)?;
    let mut want = [0u8; 8];
    stream.read_exact(&mut want)?;
    let sender = {
        let stream = stream.try_clone()?;
        let bytes = u64::from_le_bytes(want);
        std::thread::spawn(move || send(&stream, bytes))
    };
    let received = drain(&mut stream)?;
    sender
        .join()
        .map_err(|_| anyhow::anyhow!("a backend sender panicked"))??;
    Ok(received)
}

/// A TLS 1.3 ClientHello for `name`, as a browser-like client sends it: SNI, supported
/// versions, groups, signature algorithms and an X25519 key share (random bytes: nothing
/// here completes a handshake).
fn client_hello(name: &str) -> Vec<u8> {
    let ext = |kind: u16, body: &[u8]| -> Vec<u8> {
        let mut e = kind.to_be_bytes().to_vec();
        e.extend_from_slice(&u16::try_from(body.len()).unwrap_or(0).to_be_bytes());
        e.extend_from_slice(body);
        e
    };
    let name = name.as_bytes();
    let name_len = u16::try_from(name.len()).unwrap_or(0);
    let mut sni = (name_len + 3).to_be_bytes().to_vec();
    sni.push(0);
    sni.extend_from_slice(&name_len.to_be_bytes());
    sni.extend_from_slice(name);
    let mut key_share = vec![0x00, 0x24, 0x00, 0x1d, 0x00, 0x20];
    key_share.extend((0u8..32).map(|i| i.wrapping_mul(37).wrapping_add(11)));
    let extensions = [
        ext(0, &sni),
        ext(43, &[0x02, 0x03, 0x04]),
        ext(10, &[0x00, 0x02, 0x00, 0x1d]),
        ext(13, &[0x00, 0x04, 0x04, 0x03, 0x08, 0x04]),
        ext(51, &key_share),
    ]
    .concat();
    let mut body = vec![0x03, 0x03];
    body.extend((0u8..32).map(|i| i.wrapping_mul(29).wrapping_add(3)));
    body.push(32);
    body.extend((0u8..32).map(|i| i.wrapping_mul(13).wrapping_add(7)));
    body.extend_from_slice(&[0x00, 0x06, 0x13, 0x01, 0x13, 0x02, 0x13, 0x03]);
    body.extend_from_slice(&[0x01, 0x00]);
    body.extend_from_slice(&u16::try_from(extensions.len()).unwrap_or(0).to_be_bytes());
    body.extend_from_slice(&extensions);
    let mut handshake = vec![0x01];
    handshake.extend_from_slice(&u32::try_from(body.len()).unwrap_or(0).to_be_bytes()[1..]);
    handshake.extend_from_slice(&body);
    let mut record = vec![0x16, 0x03, 0x01];
    record.extend_from_slice(&u16::try_from(handshake.len()).unwrap_or(0).to_be_bytes());
    record.extend_from_slice(&handshake);
    record
}

// ---------------------------------------------------------------------------------------------
// Namespaces, threads and pins

/// The server and client namespaces joined by a veth link; deleted on drop.
struct Pair {
    server: String,
    client: String,
}

impl Pair {
    fn create() -> Result<Pair> {
        let base = format!("{NS_PREFIX}{}", std::process::id());
        let pair = Pair {
            server: format!("{base}-s"),
            client: format!("{base}-c"),
        };
        // From here on, drop deletes whatever was made.
        ip(&["netns", "add", &pair.server])?;
        ip(&["netns", "add", &pair.client])?;
        ip(&[
            "link",
            "add",
            "pt-s",
            "netns",
            &pair.server,
            "type",
            "veth",
            "peer",
            "name",
            "pt-c",
            "netns",
            &pair.client,
        ])?;
        for (ns, dev, addr) in [
            (&pair.server, "pt-s", SERVER_IP),
            (&pair.client, "pt-c", CLIENT_IP),
        ] {
            ip(&["-n", ns, "addr", "add", &format!("{addr}/24"), "dev", dev])?;
            ip(&["-n", ns, "link", "set", dev, "up"])?;
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
        }
        Ok(pair)
    }

    fn server_path(&self) -> PathBuf {
        Path::new("/run/netns").join(&self.server)
    }

    fn client_path(&self) -> PathBuf {
        Path::new("/run/netns").join(&self.client)
    }

    /// `program` in the server namespace (nsenter execs it, so the pid is the program's), on
    /// `cpu` when the machine has more than one.
    fn in_server(&self, cpu: usize, program: &str) -> Command {
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--net={}", self.server_path().display()));
        if procs::cpus() > 1 {
            cmd.args(["taskset", "-c", &cpu.to_string()]);
        }
        cmd.arg(program);
        cmd
    }
}

impl Drop for Pair {
    fn drop(&mut self) {
        for ns in [&self.client, &self.server] {
            let _ = ip(&["netns", "del", ns]);
        }
    }
}

fn ip(args: &[&str]) -> Result<()> {
    let out = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .context("running ip")?;
    if !out.status.success() {
        bail!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// Deletes namespaces a killed earlier run left behind (their pid is gone).
fn sweep_leftovers() {
    let Ok(out) = Command::new("ip").args(["netns", "list"]).output() else {
        return;
    };
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Some(name) = line.split_whitespace().next() else {
            continue;
        };
        let Some(pid) = name
            .strip_prefix(NS_PREFIX)
            .and_then(|rest| rest.split('-').next())
        else {
            continue;
        };
        if !Path::new("/proc").join(pid).exists() {
            let _ = ip(&["netns", "del", name]);
        }
    }
}

/// Runs `f` on a new thread inside the namespace at `ns`, pinned to `cpu` when the machine has
/// more than one. Threads it starts inherit both.
fn spawn_in<T: Send + 'static>(
    ns: &Path,
    cpu: usize,
    f: impl FnOnce() -> Result<T> + Send + 'static,
) -> JoinHandle<Result<T>> {
    let ns = ns.to_path_buf();
    std::thread::spawn(move || {
        let file = std::fs::File::open(&ns).with_context(|| format!("opening {}", ns.display()))?;
        // SAFETY: a namespace descriptor; setns moves only this thread.
        if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            return Err(std::io::Error::last_os_error()).context("setns");
        }
        if procs::cpus() > 1 {
            // SAFETY: an all-zero cpu_set_t is an empty set.
            let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
            // SAFETY: `cpu` (0 or 1) is far below the set's capacity.
            unsafe { libc::CPU_SET(cpu, &mut set) };
            // SAFETY: `set` is a valid cpu_set_t of the size passed; 0 is this thread.
            let rc =
                unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
            if rc != 0 {
                return Err(std::io::Error::last_os_error()).context("sched_setaffinity");
            }
        }
        f()
    })
}

/// A bpffs pin directory, removed on drop.
struct PinDir(PathBuf);

impl Drop for PinDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The ClientHello's length fields agree with each other and the name is where a parser
    /// looks for it.
    #[test]
    fn client_hello_is_well_framed() {
        let hello = client_hello("db.bench.local");
        let record = usize::from(u16::from_be_bytes([hello[3], hello[4]]));
        assert_eq!(hello.len(), 5 + record);
        assert_eq!(hello[5], 0x01, "a ClientHello");
        let body = usize::from(hello[6]) << 16 | usize::from(hello[7]) << 8 | usize::from(hello[8]);
        assert_eq!(record, 4 + body);
        // version, random, session id, suites, compression, then the extensions length.
        let ext_at = 9 + 2 + 32 + 1 + 32 + 2 + 6 + 2;
        let ext_len = usize::from(u16::from_be_bytes([hello[ext_at], hello[ext_at + 1]]));
        assert_eq!(hello.len(), ext_at + 2 + ext_len);
        // The first extension is server_name, holding the name.
        assert_eq!(&hello[ext_at + 2..ext_at + 4], &[0, 0]);
        let name = &hello[ext_at + 2 + 4 + 5..][..14];
        assert_eq!(name, b"db.bench.local");
    }
}
