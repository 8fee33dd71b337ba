//! gRPC through each proxy: ingress (`backend-protocol: GRPC`) against nginx (`grpc_pass`,
//! kept-alive upstream connections), both terminating TLS with ALPN h2; unary calls and
//! server-streaming calls (ten replies each), from h2load sending gRPC-framed bodies. Twice,
//! to two peers:
//!
//! ```text
//!   core 1: h2load (16 connections × 10 streams) and the peer:
//!             grpcio (`tests/grpc/peer.py`, Python, 16 threads): a real gRPC server
//!             nghttpd: an h2c server answering each call at once from a file, with the
//!                      trailer grpc-status: 0 (what a gRPC reply is on the wire; the ten
//!                      streamed replies come in one DATA frame, not ten)
//!   core 0: the proxy under test, one worker
//! ```
//!
//! The two answer different questions. grpcio sets the pace (some 7,000 calls/s on its share
//! of the core): both proxies idle between calls, and a call's CPU includes waking up for it.
//! nghttpd outpaces both proxies: each runs flat out, and calls per CPU-second is the cost of
//! proxying a call. Goal (issue 15): ahead of nginx per proxy CPU-second. The rate and p99 are
//! printed beside it.

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::Duration;

use anyhow::{Context, Result};

use super::h2::Measured;
use super::procs::{self, Running};
use super::{Bench, h2, median, rig, tls, write};

const NGINX: u16 = 19643;
const INGRESS: u16 = 19645;
const INGRESS_HTTP: u16 = 19680;
const INGRESS_ADMIN: u16 = 19258;
/// nghttpd, the peer that answers from files.
const FILES: u16 = 19647;
const CONNECTIONS: u32 = 16;
const STREAMS: u32 = 10;

/// The grpcio server, stopped (its stdin closed) when dropped.
struct Peer {
    child: Child,
    port: u16,
}

impl Drop for Peer {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn run(bench: &Bench, workspace: &Path) -> Result<()> {
    procs::require("python3")?;
    procs::ensure_free(&[NGINX, INGRESS, INGRESS_HTTP, INGRESS_ADMIN, FILES])?;
    tls::resolve_to_loopback(rig::HOST)?;
    procs::require("nghttpd")?;
    let dir = bench.scratch("grpc")?;
    let (cert, key) = h2::certificate(&dir)?;
    let unary = payload(&dir, "unary", b"hello")?;
    let stream = payload(&dir, "stream", b"10")?;
    let peer = start_peer(workspace)?;
    let to = "to grpcio";
    compare(bench, &dir, (&cert, &key), peer.port, to, (&unary, &stream))?;
    drop(peer);
    let files = start_files(&dir)?;
    let to = "to nghttpd answering from files (the proxy is the bottleneck)";
    compare(
        bench,
        &dir,
        (&cert, &key),
        files.port,
        to,
        (&unary, &stream),
    )?;
    Ok(())
}

/// Both proxies in front of the peer on `port`, both methods, printed under `to`.
fn compare(
    bench: &Bench,
    dir: &Path,
    (cert, key): (&Path, &Path),
    port: u16,
    to: &str,
    (unary, stream): (&Path, &Path),
) -> Result<()> {
    let mut nginx = start_nginx(dir, cert, key, port)?;
    let mut ingress = start_ingress(bench, dir, cert, key, port)?;
    for (name, port, process) in [
        ("nginx", NGINX, &mut nginx),
        ("ingress", INGRESS, &mut ingress),
    ] {
        load(
            dir,
            port,
            process,
            "/test.Echo/Unary",
            unary,
            Duration::from_secs(1),
        )
        .with_context(|| format!("{name}: a first gRPC call"))?;
        process.ensure_running(name)?;
    }
    for (title, method, body) in [
        ("unary", "/test.Echo/Unary", unary),
        (
            "server streaming, 10 replies",
            "/test.Echo/ServerStream",
            stream,
        ),
    ] {
        let (mut n, mut i) = (Vec::new(), Vec::new());
        for _ in 0..bench.rounds {
            n.push(load(dir, NGINX, &nginx, method, body, bench.duration)?);
            i.push(load(dir, INGRESS, &ingress, method, body, bench.duration)?);
        }
        let summary = |runs: &[Measured]| {
            (
                median(runs.iter().map(|m| m.requests_per_sec).collect()),
                median(runs.iter().map(|m| m.p99_ms).collect()),
                median(runs.iter().map(|m| m.per_cpu_second).collect()),
            )
        };
        let (nr, n99, ncpu) = summary(&n);
        let (ir, i99, icpu) = summary(&i);
        writeln!(
            bench.report,
            "\n## gRPC {title} over TLS, {CONNECTIONS} connections × {STREAMS} streams, {to} (median of {} rounds)",
            bench.rounds
        );
        writeln!(
            bench.report,
            "{:<10} {:>10} {:>10} {:>20}",
            "proxy", "calls/s", "p99 ms", "calls/CPU-second"
        );
        writeln!(
            bench.report,
            "{:<10} {:>10.0} {:>10.3} {:>20.0}",
            "nginx", nr, n99, ncpu
        );
        writeln!(
            bench.report,
            "{:<10} {:>10.0} {:>10.3} {:>20.0}",
            "ingress", ir, i99, icpu
        );
        writeln!(
            bench.report,
            "ratio ingress/nginx: calls per proxy CPU-second {:.2}x (goal: ahead), calls/s {:.2}x, p99 {:.2}x",
            icpu / ncpu,
            ir / nr,
            i99 / n99
        );
    }
    Ok(())
}

/// A gRPC message as a request body, in a file for h2load.
fn payload(dir: &Path, name: &str, text: &[u8]) -> Result<PathBuf> {
    let path = dir.join(format!("{name}.grpc"));
    std::fs::write(&path, message(text)?)?;
    Ok(path)
}

/// One gRPC message on the wire: the uncompressed flag, the length, the bytes.
fn message(text: &[u8]) -> Result<Vec<u8>> {
    let mut out = vec![0u8];
    out.extend_from_slice(&u32::try_from(text.len())?.to_be_bytes());
    out.extend_from_slice(text);
    Ok(out)
}

fn load(
    dir: &Path,
    port: u16,
    proxy: &Running,
    method: &str,
    body: &Path,
    duration: Duration,
) -> Result<Measured> {
    let extra = [
        format!("-d{}", body.display()),
        "-H".into(),
        "content-type: application/grpc".into(),
        "-H".into(),
        "te: trailers".into(),
    ];
    let url = format!("https://{}:{port}{method}", rig::HOST);
    h2::h2load(dir, proxy, (CONNECTIONS, STREAMS), duration, &extra, &url)
}

fn start_peer(workspace: &Path) -> Result<Peer> {
    let script = workspace.join("tests/grpc/peer.py");
    let mut child = procs::pinned(1, "python3")
        .arg(&script)
        .arg("serve")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("starting {}", script.display()))?;
    let stdout = child.stdout.take().context("the peer's stdout")?;
    let mut line = String::new();
    std::io::BufReader::new(stdout).read_line(&mut line)?;
    let port = line
        .trim()
        .parse()
        .with_context(|| format!("the gRPC peer printed {line:?}, not its port"))?;
    Ok(Peer { child, port })
}

/// nghttpd on CPU 1, h2c on [`FILES`], answering any call to the two methods with the reply a
/// gRPC server would send (the file: one message, or ten) and the trailer `grpc-status: 0`,
/// whatever the request (nghttpd reads a request body and serves the path's file).
fn start_files(dir: &Path) -> Result<Files> {
    let root = dir.join("files");
    let methods = root.join("test.Echo");
    std::fs::create_dir_all(&methods)?;
    std::fs::write(methods.join("Unary"), message(b"hello")?)?;
    let mut replies = Vec::new();
    for i in 0..10 {
        replies.extend(message(format!("item-{i}").as_bytes())?);
    }
    std::fs::write(methods.join("ServerStream"), replies)?;
    let mut cmd = procs::pinned(1, "nghttpd");
    cmd.args(["--no-tls", "-a", "127.0.0.1", "-d"])
        .arg(&root)
        .args(["--trailer", "grpc-status: 0", &FILES.to_string()]);
    let running = Running::start("nghttpd", cmd, &dir.join("nghttpd.log"))?;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", FILES)).is_err() {
        anyhow::ensure!(
            std::time::Instant::now() < deadline,
            "nghttpd did not listen on {FILES} within 10 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(Files {
        _running: running,
        port: FILES,
    })
}

/// The nghttpd peer, stopped when dropped.
struct Files {
    _running: Running,
    port: u16,
}

fn start_nginx(dir: &Path, cert: &Path, key: &Path, peer: u16) -> Result<Running> {
    write(
        &dir.join("nginx.conf"),
        &format!(
            "worker_processes 1; daemon off; pid {d}/nginx.pid; error_log {d}/nginx-error.log;\n\
             events {{ worker_connections 8192; }}\n\
             http {{ access_log off;\n\
             upstream grpcbackend {{ server 127.0.0.1:{peer}; keepalive 64; }}\n\
             server {{ listen 127.0.0.1:{NGINX} ssl http2 backlog=4096;\n\
             ssl_certificate {cert}; ssl_certificate_key {key}; ssl_protocols TLSv1.3;\n\
             keepalive_requests 100000000; http2_max_requests 100000000;\n\
             location / {{ grpc_pass grpc://grpcbackend; grpc_set_header X-Forwarded-For $remote_addr;\n\
             grpc_set_header X-Real-IP $remote_addr; grpc_set_header X-Request-ID $request_id; }} }} }}\n",
            d = dir.display(),
            cert = cert.display(),
            key = key.display()
        ),
    )?;
    let mut cmd = procs::pinned(0, "nginx");
    cmd.args(["-p", &dir.to_string_lossy(), "-c"])
        .arg(dir.join("nginx.conf"));
    Running::start("nginx", cmd, &dir.join("nginx.log"))
}

fn start_ingress(bench: &Bench, dir: &Path, cert: &Path, key: &Path, peer: u16) -> Result<Running> {
    let manifests = dir.join("manifests");
    std::fs::create_dir_all(&manifests)?;
    let indent = |path: &Path| -> Result<String> {
        Ok(std::fs::read_to_string(path)?
            .lines()
            .map(|l| format!("    {l}\n"))
            .collect())
    };
    write(
        &manifests.join("grpc.yaml"),
        &format!(
            "apiVersion: v1\nkind: Service\nmetadata: {{name: peer, namespace: bench}}\nspec: {{ports: [{{name: grpc, port: 50051}}]}}\n---\n\
             apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: peer-1, namespace: bench, labels: {{kubernetes.io/service-name: peer}}}}\n\
             addressType: IPv4\nports: [{{name: grpc, port: {peer}}}]\nendpoints: [{{addresses: [\"127.0.0.1\"]}}]\n---\n\
             apiVersion: v1\nkind: Secret\nmetadata: {{name: bench-tls, namespace: bench}}\ntype: kubernetes.io/tls\nstringData:\n  tls.crt: |\n{crt}  tls.key: |\n{key}---\n\
             apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata:\n  name: grpc\n  namespace: bench\n  annotations: {{nginx.ingress.kubernetes.io/backend-protocol: GRPC}}\n\
             spec:\n  ingressClassName: ingress\n  tls: [{{hosts: [{host}], secretName: bench-tls}}]\n  rules:\n  - host: {host}\n    http: {{paths: [{{path: /, pathType: Prefix, backend: {{service: {{name: peer, port: {{number: 50051}}}}}}}}]}}\n",
            crt = indent(cert)?,
            key = indent(key)?,
            host = rig::HOST,
        ),
    )?;
    let mut cmd = procs::pinned(0, &bench.ingress.to_string_lossy());
    cmd.arg("--manifests")
        .arg(&manifests)
        .args([
            "--bind",
            "127.0.0.1",
            "--worker-threads",
            "1",
            "--access-log",
            "false",
            "--log-level",
            "warn",
        ])
        .args([
            "--http-port",
            &INGRESS_HTTP.to_string(),
            "--https-port",
            &INGRESS.to_string(),
            "--admin-port",
            &INGRESS_ADMIN.to_string(),
        ]);
    let process = Running::start("ingress", cmd, &dir.join("ingress.log"))?;
    procs::wait_http(
        &format!("http://127.0.0.1:{INGRESS_ADMIN}/readyz"),
        "localhost",
        Duration::from_secs(20),
    )?;
    Ok(process)
}
