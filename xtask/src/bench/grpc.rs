//! gRPC through each proxy to the same grpcio server (`tests/grpc/peer.py`): ingress
//! (`backend-protocol: GRPC`) against nginx (`grpc_pass`, kept-alive upstream connections),
//! both terminating TLS with ALPN h2; unary calls and server-streaming calls (ten replies
//! each), from h2load sending gRPC-framed bodies.
//!
//! ```text
//!   core 1: h2load (16 connections × 10 streams), the grpcio server (Python, 16 threads)
//!   core 0: the proxy under test, one worker
//! ```
//!
//! The Python server bounds the rate of both proxies alike, so the comparison is the proxy's
//! CPU per call (calls per proxy CPU-second; goal, issue 15: ahead of nginx), with the rate and
//! p99 beside it.

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
    procs::ensure_free(&[NGINX, INGRESS, INGRESS_HTTP, INGRESS_ADMIN])?;
    tls::resolve_to_loopback(rig::HOST)?;
    let dir = bench.scratch("grpc")?;
    let (cert, key) = h2::certificate(&dir)?;
    let peer = start_peer(workspace)?;
    let mut nginx = start_nginx(&dir, &cert, &key, peer.port)?;
    let mut ingress = start_ingress(bench, &dir, &cert, &key, peer.port)?;
    let unary = payload(&dir, "unary", b"hello")?;
    let stream = payload(&dir, "stream", b"10")?;
    for (name, port, process) in [
        ("nginx", NGINX, &mut nginx),
        ("ingress", INGRESS, &mut ingress),
    ] {
        load(
            &dir,
            port,
            process,
            "/test.Echo/Unary",
            &unary,
            Duration::from_secs(1),
        )
        .with_context(|| format!("{name}: a first gRPC call"))?;
        process.ensure_running(name)?;
    }
    for (title, method, body) in [
        ("unary", "/test.Echo/Unary", &unary),
        (
            "server streaming, 10 replies",
            "/test.Echo/ServerStream",
            &stream,
        ),
    ] {
        let (mut n, mut i) = (Vec::new(), Vec::new());
        for _ in 0..bench.rounds {
            n.push(load(&dir, NGINX, &nginx, method, body, bench.duration)?);
            i.push(load(&dir, INGRESS, &ingress, method, body, bench.duration)?);
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
            "\n## gRPC {title} over TLS, {CONNECTIONS} connections × {STREAMS} streams, to grpcio (median of {} rounds)",
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
    drop(peer);
    Ok(())
}

/// A gRPC message as a request body: the uncompressed flag, the length, the bytes.
fn payload(dir: &Path, name: &str, message: &[u8]) -> Result<PathBuf> {
    let mut body = vec![0u8];
    body.extend_from_slice(&u32::try_from(message.len())?.to_be_bytes());
    body.extend_from_slice(message);
    let path = dir.join(format!("{name}.grpc"));
    std::fs::write(&path, body)?;
    Ok(path)
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
