//! The kernel SNI gate through the real proxy, as root. Each test makes its own server and
//! client network namespaces joined by a veth link (MTU 1500, one MSS per packet), starts the
//! real `ingress` binary in the server namespace on ports 80, 443 and 10254 with manifests it
//! writes, and drives it from the client namespace with curl, openssl, rustls and raw writers.
//!
//! ```text
//!   client ns 10.231.0.2                 veth               server ns 10.231.0.1
//!   curl, openssl s_client,  ───────────────────────────►  ingress :443 --mode ebpf|userspace
//!   rustls, raw bytes                                        └► test backend on 127.0.0.1
//!                                  the test thread lives here: admin :10254, bpftool, pins
//! ```
//!
//! Most scenarios run in both modes, because a client must not be able to tell them apart; the
//! kernel's own counters (`ingress_ebpf_gate_total`) are checked in eBPF mode.
//!
//! Without root, kernel BTF or an embedded eBPF object the tests print a loud skip notice and
//! pass — unless CI=true, where that is a failure.

// Setup helpers fail the test with a message, as the test bodies do.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use serde::Deserialize as _;
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant};

use ingress::client_hello;
use ingress_tests::client::{blocking_get, metric_value};
use ingress_tests::manifests::service;
use ingress_tests::netns::{NetPair, SERVER_IP};
use ingress_tests::pki::{Ca, KeyFormat, KeyKind, Leaf, secret_yaml};
use ingress_tests::process::binary;
use ingress_tests::rawtcp::{Answer, Damage, RawTcp};
use ingress_tests::scratch::Scratch;
use ingress_tests::tcx::StandIn;
use ingress_tests::upstream::Backend;
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpSocket, TcpStream};
use tokio_rustls::TlsConnector;

/// Ports inside the server namespace; each test has its own, so the real ones are free.
#[derive(Clone, Copy)]
struct Ports {
    http: u16,
    https: u16,
    admin: u16,
}

const MAIN: Ports = Ports {
    http: 80,
    https: 443,
    admin: 10254,
};
/// A second proxy beside the first, for comparing the modes on identical input.
const SECOND: Ports = Ports {
    http: 8080,
    https: 8443,
    admin: 10255,
};
const STEP: Duration = Duration::from_secs(5);
const READY: Duration = Duration::from_secs(30);
const KNOWN: &str = "known.test";
const WILDCARD: &str = "*.wild.test";
/// Every name the site's certificate covers; the tests serve subsets of them.
const CERT_NAMES: [&str; 6] = [
    KNOWN,
    WILDCARD,
    "stay.test",
    "new.test",
    "gone.test",
    "chromium.example.test",
];
/// The capabilities deploy/daemonset.yaml grants, in setpriv's spelling.
const DAEMONSET_CAPS: [&str; 4] = ["bpf", "perfmon", "net_admin", "net_bind_service"];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Ebpf,
    Userspace,
}

impl Mode {
    fn flag(self) -> &'static str {
        match self {
            Mode::Ebpf => "ebpf",
            Mode::Userspace => "userspace",
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Skipping

/// Skips (or, under CI=true, fails) when this machine cannot run kernel tests.
fn skip_or_fail(why: &str) {
    if ingress_tests::in_ci() {
        panic!("kernel proxy test cannot run under CI=true: {why}");
    }
    eprintln!("\n**************** SKIPPED kernel proxy test: {why} ****************\n");
}

fn preflight() -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        skip_or_fail("not root");
        return false;
    }
    if !Path::new("/sys/kernel/btf/vmlinux").exists() {
        skip_or_fail("the kernel has no BTF");
        return false;
    }
    let version = Command::new(binary())
        .arg("version")
        .output()
        .expect("ingress version");
    let version = String::from_utf8_lossy(&version.stdout);
    if !version.contains("(eBPF object embedded)") {
        skip_or_fail(&format!(
            "the ingress binary carries no eBPF object ({}); run `cargo xtask build` first",
            version.trim()
        ));
        return false;
    }
    true
}

// ---------------------------------------------------------------------------------------------
// The site: namespaces, a backend, a certificate, manifests, and proxies started on them

/// A per-test pin directory, removed on drop.
struct PinDir(PathBuf);

impl Drop for PinDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Field order is drop order: the backend stops and the files go before the namespaces.
struct Site {
    backend: Backend,
    leaf: Leaf,
    ca_file: PathBuf,
    clients: Clients,
    dir: Scratch,
    pins: PinDir,
    pair: NetPair,
}

impl Site {
    /// Namespaces, backend and manifests serving `hosts`. `None` when skipping. The calling
    /// thread moves into the server namespace: the proxies it starts, the backend, the admin
    /// scrapes and bpftool all live there; clients are made in the client namespace.
    fn new(tag: &str, hosts: &[&str]) -> Option<Site> {
        if !preflight() {
            return None;
        }
        let pins = PinDir(PathBuf::from(format!(
            "/sys/fs/bpf/ingress-test-proxy-{tag}-{}",
            std::process::id()
        )));
        let pair = NetPair::create(tag).expect("create network namespaces");
        pair.server.enter().expect("enter the server namespace");
        let dir = Scratch::new(&format!("kernel-proxy-{tag}"));
        std::fs::create_dir_all(dir.path().join("manifests")).expect("manifests dir");
        let backend = Backend::start("web");
        let ca = Ca::new("kernel proxy test CA");
        let leaf = ca.leaf(
            "site",
            &CERT_NAMES,
            KeyKind::EcdsaP256,
            KeyFormat::Pkcs8,
            false,
        );
        let ca_file = dir.write("ca.pem", &ca.pem);
        let site = Site {
            backend,
            leaf,
            ca_file,
            clients: Clients::new(&ca),
            dir,
            pins,
            pair,
        };
        site.write_hosts(hosts);
        Some(site)
    }

    fn manifests(&self) -> PathBuf {
        self.dir.path().join("manifests")
    }

    /// Replaces the Ingress (atomically, as a ConfigMap mount does) with one serving `hosts`.
    fn write_hosts(&self, hosts: &[&str]) {
        let mut yaml = service("t", "web", &[&self.backend])
            + &secret_yaml("t", "site-tls", &self.leaf.chain, &self.leaf.key);
        let covered: Vec<String> = hosts
            .iter()
            .filter(|h| CERT_NAMES.contains(h))
            .map(|h| format!("\"{h}\""))
            .collect();
        yaml += &format!(
            "---\napiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {{name: site, namespace: t}}\nspec:\n  ingressClassName: ingress\n  tls: [{{hosts: [{}], secretName: site-tls}}]\n  rules:\n",
            covered.join(", ")
        );
        for host in hosts {
            yaml += &format!(
                "  - host: \"{host}\"\n    http: {{paths: [{{path: /, pathType: Prefix, backend: {{service: {{name: web, port: {{number: 80}}}}}}}}]}}\n"
            );
        }
        let tmp = self.dir.path().join(".site.yaml.tmp");
        std::fs::write(&tmp, yaml).expect("write manifests");
        std::fs::rename(&tmp, self.manifests().join("site.yaml")).expect("rename manifests");
    }

    /// The flags every proxy here runs with, then `extra`.
    fn args(&self, mode: &str, ports: Ports, extra: &[&str]) -> Vec<String> {
        let mut args: Vec<String> = vec![
            "--manifests".into(),
            self.manifests().display().to_string(),
            "--mode".into(),
            mode.into(),
            "--bpf-pin-dir".into(),
            self.pins.0.display().to_string(),
            "--bind".into(),
            "0.0.0.0".into(),
            "--http-port".into(),
            ports.http.to_string(),
            "--https-port".into(),
            ports.https.to_string(),
            "--admin-port".into(),
            ports.admin.to_string(),
            "--access-log".into(),
            "false".into(),
            "--log-level".into(),
            std::env::var("INGRESS_TEST_LOG").unwrap_or_else(|_| "info".into()),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        args
    }

    /// Starts a proxy in `mode` on the main ports and waits until it is ready.
    async fn start(&self, mode: Mode, extra: &[&str]) -> Proxy {
        let proxy = self.spawn(&[], &self.args(mode.flag(), MAIN, extra), MAIN);
        proxy.wait_ready().await;
        proxy
    }

    /// Starts `ingress args…` (behind `wrapper…`, e.g. setpriv) without waiting.
    fn spawn(&self, wrapper: &[String], args: &[String], ports: Ports) -> Proxy {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let log = self.dir.path().join(format!("ingress-{n}.log"));
        let out = std::fs::File::create(&log).expect("log file");
        let err = out.try_clone().expect("log file");
        let mut cmd = match wrapper.split_first() {
            Some((program, rest)) => {
                let mut cmd = Command::new(program);
                cmd.args(rest).arg(binary());
                cmd
            }
            None => Command::new(binary()),
        };
        // Spawned from this thread, so the child starts in the server namespace.
        let child = cmd
            .args(args)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .expect("spawn ingress");
        // The admin port listens on --admin-bind (0.0.0.0 unless given); a wildcard is reached
        // through loopback.
        let bind = args
            .iter()
            .position(|a| a == "--admin-bind")
            .and_then(|at| args.get(at + 1))
            .and_then(|ip| ip.parse::<IpAddr>().ok());
        let admin_ip = match bind {
            Some(ip) if !ip.is_unspecified() => ip,
            Some(IpAddr::V6(_)) => IpAddr::from(std::net::Ipv6Addr::LOCALHOST),
            _ => IpAddr::from(std::net::Ipv4Addr::LOCALHOST),
        };
        Proxy {
            child,
            log,
            ports,
            admin_ip,
        }
    }

    /// A socket in the client namespace, connected to the server's `port`.
    async fn connect(&self, port: u16) -> TcpStream {
        let socket = client_sockets(&self.pair, 1).pop().expect("a socket");
        let stream = tokio::time::timeout(STEP, socket.connect(server(port)))
            .await
            .expect("connect in time")
            .expect("connect");
        stream.set_nodelay(true).expect("nodelay");
        stream
    }

    async fn send(&self, port: u16, chunks: &[&[u8]], pause: Duration) -> Ending {
        send_raw(self.connect(port).await, chunks, pause).await
    }

    async fn https_get(&self, port: u16, sni: Option<&str>, host: &str) -> Outcome {
        https_get(self.connect(port).await, &self.clients, sni, host).await
    }

    /// `curl https://<name>/` verified against the test CA; the HTTP status, or `None` if
    /// curl failed (with its exit code).
    async fn curl(&self, name: &str) -> Result<u16, Option<i32>> {
        self.curl_port(name, MAIN.https).await
    }

    /// `curl` against the HTTPS listener on `port`.
    async fn curl_port(&self, name: &str, port: u16) -> Result<u16, Option<i32>> {
        let out = self
            .pair
            .client
            .command("curl")
            .args([
                "-s",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code}",
                "--max-time",
                "5",
            ])
            .arg("--cacert")
            .arg(&self.ca_file)
            .arg("--resolve")
            .arg(format!("{name}:{port}:{SERVER_IP}"))
            .arg(format!("https://{name}:{port}/"))
            .kill_on_drop(true)
            .output();
        let out = tokio::time::timeout(STEP * 2, out)
            .await
            .expect("curl finished")
            .expect("run curl");
        let code = String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .unwrap_or(0);
        if out.status.success() && code != 0 {
            Ok(code)
        } else {
            Err(out.status.code())
        }
    }

    /// `openssl s_client` sending one HTTP request: its stdout (empty if it was reset).
    async fn openssl(&self, sni: Option<&str>, host: &str) -> String {
        let mut cmd = self.pair.client.command("openssl");
        cmd.args(["s_client", "-quiet", "-connect"])
            .arg(format!("{SERVER_IP}:{}", MAIN.https));
        match sni {
            Some(name) => {
                cmd.args(["-servername", name, "-verify_return_error", "-CAfile"])
                    .arg(&self.ca_file);
            }
            None => {
                cmd.arg("-noservername");
            }
        }
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("run openssl");
        let mut stdin = child.stdin.take().expect("stdin");
        let request = format!("GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
        // A reset connection makes openssl exit before it reads this: a failed write is fine.
        let _ = stdin.write_all(request.as_bytes()).await;
        let out = tokio::time::timeout(STEP * 2, child.wait_with_output())
            .await
            .expect("openssl finished")
            .expect("openssl output");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

fn server(port: u16) -> SocketAddr {
    SocketAddr::new(IpAddr::V4(SERVER_IP), port)
}

/// `n` sockets made in the client namespace (a socket stays in the namespace it was made in).
fn client_sockets(pair: &NetPair, n: usize) -> Vec<TcpSocket> {
    pair.client
        .run(move || {
            (0..n)
                .map(|_| TcpSocket::new_v4().expect("client socket"))
                .collect()
        })
        .expect("client namespace thread")
}

// ---------------------------------------------------------------------------------------------
// A running proxy

struct Proxy {
    child: Child,
    log: PathBuf,
    ports: Ports,
    admin_ip: IpAddr,
}

impl Proxy {
    fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn admin(&self) -> SocketAddr {
        SocketAddr::new(self.admin_ip, self.ports.admin)
    }

    fn scrape(&self) -> Scrape {
        let (status, body) = blocking_get(self.admin(), "/metrics", "localhost");
        assert_eq!(status, 200, "/metrics; logs:\n{}", self.logs());
        Scrape(body)
    }

    async fn wait_ready(&self) {
        let deadline = Instant::now() + READY;
        loop {
            if blocking_get(self.admin(), "/readyz", "localhost").0 == 200 {
                return;
            }
            // A proxy that exited at startup (it is a zombie until reaped) will not become
            // ready; say so now rather than after the whole wait.
            let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid()));
            let exited = stat.map_or(true, |s| {
                s.rsplit_once(')')
                    .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'))
            });
            assert!(
                !exited,
                "ingress exited before it was ready; logs:\n{}",
                self.logs()
            );
            assert!(
                Instant::now() < deadline,
                "ingress not ready within {READY:?}; logs:\n{}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn signal(&self, signal: libc::c_int) {
        let pid = libc::pid_t::try_from(self.pid()).expect("pid");
        // SAFETY: signalling our own child, which has not been reaped yet.
        assert_eq!(unsafe { libc::kill(pid, signal) }, 0, "kill {pid}");
    }

    /// Waits for the process to end.
    async fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "ingress still running after {timeout:?}; logs:\n{}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One `/metrics` answer.
struct Scrape(String);

impl Scrape {
    fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        metric_value(&self.0, name, labels).unwrap_or(0.0)
    }

    /// The sum of every sample of `name`, whatever its labels.
    fn sum(&self, name: &str) -> f64 {
        self.0
            .lines()
            .filter(|l| l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} ")))
            .filter_map(|l| l.rsplit_once(' ').and_then(|(_, v)| v.parse::<f64>().ok()))
            .sum()
    }

    /// `ingress_sni_gate_total{reason}`: the decisions the proxy acted on.
    fn gate(&self, reason: &str) -> f64 {
        self.value("ingress_sni_gate_total", &[("reason", reason)])
    }

    /// `ingress_ebpf_gate_total{counter}`: the kernel's own count.
    fn kernel(&self, counter: &str) -> f64 {
        self.value("ingress_ebpf_gate_total", &[("counter", counter)])
    }

    fn handshakes(&self) -> f64 {
        self.sum("ingress_tls_handshakes_total")
    }

    fn has(&self, name: &str) -> bool {
        self.0.lines().any(|l| l.starts_with(name))
    }
}

const REASONS: [&str; 6] = [
    "pass",
    "unknown",
    "no_sni",
    "malformed",
    "not_tls",
    "passthrough",
];

/// The reasons whose counter moved between two scrapes (one, or none if nothing was decided).
fn moved(before: &Scrape, after: &Scrape, counter: impl Fn(&Scrape, &str) -> f64) -> Vec<String> {
    REASONS
        .iter()
        .filter(|r| counter(after, r) > counter(before, r))
        .map(|r| r.to_string())
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Clients

/// How a connection that sent raw bytes ended.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Ending {
    /// ECONNRESET, this long after the last byte was written.
    Reset(Duration),
    /// FIN without data.
    Closed,
    /// The server sent bytes back (a ServerHello, an alert…): the first ones.
    Answered(Vec<u8>),
    Silent,
}

/// Writes `chunks` (pausing between them) and reports what came back.
async fn send_raw(mut stream: TcpStream, chunks: &[&[u8]], pause: Duration) -> Ending {
    let mut sent = Instant::now();
    for (i, chunk) in chunks.iter().enumerate() {
        if i > 0 {
            tokio::time::sleep(pause).await;
        }
        sent = Instant::now();
        if let Err(e) = stream.write_all(chunk).await {
            return match e.kind() {
                io::ErrorKind::ConnectionReset | io::ErrorKind::BrokenPipe => {
                    Ending::Reset(sent.elapsed())
                }
                _ => panic!("client write: {e}"),
            };
        }
    }
    let mut buf = [0u8; 1024];
    match tokio::time::timeout(STEP, stream.read(&mut buf)).await {
        Err(_) => Ending::Silent,
        Ok(Ok(0)) => Ending::Closed,
        Ok(Ok(n)) => Ending::Answered(buf[..n].to_vec()),
        Ok(Err(e)) if e.kind() == io::ErrorKind::ConnectionReset => Ending::Reset(sent.elapsed()),
        Ok(Err(e)) => panic!("client read: {e}"),
    }
}

/// What a client making an HTTPS request saw.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Outcome {
    /// The response status.
    Served(u16),
    /// Reset before the handshake finished.
    Reset,
    Failed(String),
}

/// rustls client configurations: one that verifies against the test CA, one that accepts
/// anything (for connections without SNI, which get the default certificate).
#[derive(Clone)]
struct Clients {
    verified: Arc<rustls::ClientConfig>,
    any: Arc<rustls::ClientConfig>,
}

impl Clients {
    fn new(ca: &Ca) -> Clients {
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let mut any = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .expect("protocol versions")
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider)))
            .with_no_client_auth();
        any.alpn_protocols = vec![b"http/1.1".to_vec()];
        Clients {
            verified: ca.client_config(&[b"http/1.1"]),
            any: Arc::new(any),
        }
    }
}

/// Accepts every certificate, still checking handshake signatures.
#[derive(Debug)]
struct AnyCertificate(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &[rustls::pki_types::CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// A TLS handshake (SNI `sni`, or none with the permissive config), then `GET /` with `Host:
/// host` and `Connection: close`.
async fn https_get<S>(stream: S, clients: &Clients, sni: Option<&str>, host: &str) -> Outcome
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let (config, name) = match sni {
        Some(name) => (
            clients.verified.clone(),
            ServerName::try_from(name.to_string()).expect("a DNS name"),
        ),
        // rustls sends no server_name for an IP address.
        None => (clients.any.clone(), ServerName::IpAddress(SERVER_IP.into())),
    };
    let connect = TlsConnector::from(config).connect(name, stream);
    let mut tls = match tokio::time::timeout(STEP * 2, connect).await {
        Err(_) => return Outcome::Failed("handshake timed out".into()),
        Ok(Err(e)) if e.kind() == io::ErrorKind::ConnectionReset => return Outcome::Reset,
        Ok(Err(e)) => return Outcome::Failed(format!("handshake: {e}")),
        Ok(Ok(tls)) => tls,
    };
    let request = format!("GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    if let Err(e) = tls.write_all(request.as_bytes()).await {
        return Outcome::Failed(format!("write: {e}"));
    }
    let mut response = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout(STEP * 2, tls.read(&mut buf)).await {
            Err(_) => return Outcome::Failed("response timed out".into()),
            Ok(Ok(0)) => break,
            Ok(Ok(n)) => response.extend_from_slice(&buf[..n]),
            // Some servers close without close_notify once the response is complete.
            Ok(Err(e)) if e.kind() == io::ErrorKind::UnexpectedEof && !response.is_empty() => {
                break;
            }
            Ok(Err(e)) => return Outcome::Failed(format!("read: {e}")),
        }
    }
    let text = String::from_utf8_lossy(&response);
    match text
        .strip_prefix("HTTP/1.1 ")
        .and_then(|rest| rest.get(..3))
        .and_then(|code| code.parse().ok())
    {
        Some(status) => Outcome::Served(status),
        None => Outcome::Failed(format!("no status line in {text:?}")),
    }
}

/// Writes through to `inner`, but stops at each cut offset and pauses before writing more, so a
/// ClientHello leaves in pieces, as a slow or fragmenting client sends it.
struct Pieces<S> {
    inner: S,
    cuts: VecDeque<usize>,
    written: usize,
    pause: Duration,
    sleep: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Pieces<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        if let Some(sleep) = this.sleep.as_mut() {
            ready!(sleep.as_mut().poll(cx));
            this.sleep = None;
        }
        let limit = match this.cuts.front() {
            Some(&cut) => (cut - this.written).min(buf.len()),
            None => buf.len(),
        };
        let n = ready!(Pin::new(&mut this.inner).poll_write(cx, &buf[..limit]))?;
        this.written += n;
        if this.cuts.front() == Some(&this.written) {
            this.cuts.pop_front();
            this.sleep = Some(Box::pin(tokio::time::sleep(this.pause)));
        }
        Poll::Ready(Ok(n))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Pieces<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

fn corpus(file: &str) -> Vec<u8> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("data/clienthello")
        .join(file);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// `bytes` with every occurrence of `from` replaced by `to` (same length, so every length field
/// stays right).
fn renamed(bytes: &[u8], from: &str, to: &str) -> Vec<u8> {
    assert_eq!(from.len(), to.len());
    let mut out = bytes.to_vec();
    let mut found = 0;
    let mut at = 0;
    while let Some(pos) = out[at..]
        .windows(from.len())
        .position(|w| w == from.as_bytes())
    {
        let start = at + pos;
        out[start..start + to.len()].copy_from_slice(to.as_bytes());
        at = start + to.len();
        found += 1;
    }
    assert!(found > 0, "{from} is not in the hello");
    out
}

fn assert_fast_reset(ending: &Ending, what: &str) {
    match ending {
        Ending::Reset(after) => {
            eprintln!("{what}: reset {after:?} after the last byte");
            assert!(
                *after < Duration::from_millis(50),
                "{what}: reset took {after:?}"
            );
        }
        other => panic!("{what}: expected a reset, got {other:?}"),
    }
}

/// Polls `/metrics` until `done` holds (counters move a moment after a client sees the end).
async fn scrape_until(proxy: &Proxy, what: &str, done: impl Fn(&Scrape) -> bool) -> Scrape {
    let deadline = Instant::now() + STEP;
    loop {
        let scrape = proxy.scrape();
        if done(&scrape) {
            return scrape;
        }
        assert!(Instant::now() < deadline, "{what}; metrics:\n{}", scrape.0);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

// ---------------------------------------------------------------------------------------------
// Known, unknown, wildcard

async fn known_names_are_served_to_curl_and_openssl(mode: Mode) {
    let Some(site) = Site::new(&format!("known-{}", mode.flag()), &[KNOWN]) else {
        return;
    };
    let proxy = site.start(mode, &[]).await;
    let before = proxy.scrape();
    assert_eq!(
        before.value("ingress_ebpf_enabled", &[]),
        f64::from(mode == Mode::Ebpf)
    );

    assert_eq!(
        site.curl(KNOWN).await,
        Ok(200),
        "curl; logs:\n{}",
        proxy.logs()
    );
    let out = site.openssl(Some(KNOWN), KNOWN).await;
    assert!(out.starts_with("HTTP/1.1 200"), "openssl got {out:?}");
    assert!(
        out.contains("\"backend\":\"web\""),
        "the backend answered: {out:?}"
    );

    let after = scrape_until(&proxy, "two handshakes", |s| {
        s.value("ingress_tls_handshakes_total", &[("result", "ok")]) >= 2.0
    })
    .await;
    assert_eq!(after.gate("pass") - before.gate("pass"), 2.0);
    if mode == Mode::Ebpf {
        assert_eq!(after.kernel("pass") - before.kernel("pass"), 2.0);
        // Both hellos fit one segment, so the TC program passed them before accept and their
        // sockets never joined SOCKS.
        assert_eq!(
            after.kernel("passed_before_accept") - before.kernel("passed_before_accept"),
            2.0
        );
        assert_eq!(
            after.kernel("sock_added") - before.kernel("sock_added"),
            0.0
        );
    }
}

#[tokio::test]
async fn known_names_are_served_to_curl_and_openssl_ebpf() {
    known_names_are_served_to_curl_and_openssl(Mode::Ebpf).await;
}

#[tokio::test]
async fn known_names_are_served_to_curl_and_openssl_userspace() {
    known_names_are_served_to_curl_and_openssl(Mode::Userspace).await;
}

async fn an_unknown_name_is_reset_within_50_ms_before_any_handshake(mode: Mode) {
    let Some(site) = Site::new(&format!("unknown-{}", mode.flag()), &[KNOWN]) else {
        return;
    };
    let proxy = site.start(mode, &[]).await;
    let before = proxy.scrape();

    // curl's own hello, naming curl.example.test, which nothing serves.
    let ending = site
        .send(MAIN.https, &[&corpus("curl-tls13.bin")], Duration::ZERO)
        .await;
    assert_fast_reset(&ending, "curl's hello for an unknown name");
    let after = scrape_until(&proxy, "one unknown decision", |s| {
        s.gate("unknown") > before.gate("unknown")
    })
    .await;
    assert_eq!(after.gate("unknown") - before.gate("unknown"), 1.0);
    assert_eq!(
        after.handshakes(),
        before.handshakes(),
        "a handshake started"
    );
    if mode == Mode::Ebpf {
        assert_eq!(after.kernel("unknown") - before.kernel("unknown"), 1.0);
        assert_eq!(after.kernel("dropped") - before.kernel("dropped"), 1.0);
    }

    // Real clients see the reset as a failed connection.
    assert_eq!(site.curl("nobody.test").await.map_err(|_| ()), Err(()));
    assert_eq!(site.openssl(Some("nobody.test"), "nobody.test").await, "");
    let last = scrape_until(&proxy, "three unknown decisions", |s| {
        s.gate("unknown") >= before.gate("unknown") + 3.0
    })
    .await;
    assert_eq!(
        last.handshakes(),
        before.handshakes(),
        "a handshake started"
    );
    if mode == Mode::Ebpf {
        assert_eq!(last.kernel("unknown") - before.kernel("unknown"), 3.0);
    }
    assert!(!proxy.logs().contains("ERROR"), "{}", proxy.logs());
}

#[tokio::test]
async fn an_unknown_name_is_reset_within_50_ms_before_any_handshake_ebpf() {
    an_unknown_name_is_reset_within_50_ms_before_any_handshake(Mode::Ebpf).await;
}

#[tokio::test]
async fn an_unknown_name_is_reset_within_50_ms_before_any_handshake_userspace() {
    an_unknown_name_is_reset_within_50_ms_before_any_handshake(Mode::Userspace).await;
}

/// The TC program resets a whole single-segment ClientHello for an unknown name before the
/// kernel makes a socket: on IPv4 through the veth and on IPv6 through loopback, nothing is
/// accepted and sock_ops never sees a socket. With `--gate-interfaces none` the same hello is
/// judged after accept, as fast.
#[tokio::test]
async fn an_unknown_name_is_reset_before_accept_unless_the_early_reset_is_off() {
    let Some(site) = Site::new("before-accept", &[KNOWN]) else {
        return;
    };
    let hello = corpus("curl-tls13.bin");
    let dual_stack = |ports: Ports, extra: &[&str]| {
        let mut args = site.args("ebpf", ports, extra);
        let bind = args
            .iter()
            .position(|a| a == "0.0.0.0")
            .expect("--bind value");
        args[bind] = "::".into();
        args
    };
    let accepted = |s: &Scrape| s.value("ingress_connections_total", &[("listener", "https")]);
    let send_v6 = |port: u16| {
        let hello = hello.clone();
        async move {
            // This thread lives in the server namespace: ::1 is its loopback.
            let stream = TcpStream::connect(("::1", port))
                .await
                .expect("connect to ::1");
            send_raw(stream, &[&hello], Duration::ZERO).await
        }
    };

    let proxy = site.spawn(&[], &dual_stack(MAIN, &[]), MAIN);
    proxy.wait_ready().await;
    let before = proxy.scrape();
    let ending = site.send(MAIN.https, &[&hello], Duration::ZERO).await;
    assert_fast_reset(&ending, "IPv4 through the veth");
    assert_fast_reset(&send_v6(MAIN.https).await, "IPv6 through loopback");
    let after = scrape_until(&proxy, "two unknown decisions", |s| {
        s.gate("unknown") >= before.gate("unknown") + 2.0
    })
    .await;
    let delta = |name: &str| after.kernel(name) - before.kernel(name);
    assert_eq!(delta("reset_before_accept_unknown"), 2.0, "{}", after.0);
    assert_eq!(delta("unknown"), 2.0);
    assert_eq!(delta("sock_added"), 0.0, "a socket was made");
    assert_eq!(
        accepted(&after),
        accepted(&before),
        "a connection was accepted"
    );
    assert_eq!(after.gate("unknown") - before.gate("unknown"), 2.0);
    assert_eq!(after.handshakes(), before.handshakes());
    // A known name in one segment is passed there too, and its socket never joins SOCKS.
    assert_eq!(site.curl(KNOWN).await, Ok(200), "{}", proxy.logs());
    let known = scrape_until(&proxy, "one pass", |s| s.gate("pass") > after.gate("pass")).await;
    let delta = |name: &str| known.kernel(name) - after.kernel(name);
    assert_eq!(delta("passed_before_accept"), 1.0, "{}", known.0);
    assert_eq!(delta("pass"), 1.0);
    assert_eq!(delta("sock_added"), 0.0);
    drop(proxy);

    let proxy = site.spawn(
        &[],
        &dual_stack(SECOND, &["--gate-interfaces", "none"]),
        SECOND,
    );
    proxy.wait_ready().await;
    let before = proxy.scrape();
    let ending = site.send(SECOND.https, &[&hello], Duration::ZERO).await;
    assert_fast_reset(&ending, "IPv4, early reset off");
    assert_fast_reset(&send_v6(SECOND.https).await, "IPv6, early reset off");
    let after = scrape_until(&proxy, "two unknown decisions", |s| {
        s.gate("unknown") >= before.gate("unknown") + 2.0
    })
    .await;
    let delta = |name: &str| after.kernel(name) - before.kernel(name);
    assert_eq!(delta("reset_before_accept_unknown"), 0.0, "{}", after.0);
    assert_eq!(delta("unknown"), 2.0);
    assert_eq!(delta("sock_added"), 2.0);
    assert_eq!(accepted(&after) - accepted(&before), 2.0);
    assert_eq!(site.curl_port(KNOWN, SECOND.https).await, Ok(200));
    let known = scrape_until(&proxy, "one pass", |s| s.gate("pass") > after.gate("pass")).await;
    let delta = |name: &str| known.kernel(name) - after.kernel(name);
    assert_eq!(delta("passed_before_accept"), 0.0, "{}", known.0);
    assert_eq!(delta("sock_added"), 1.0);
}

async fn a_wildcard_admits_one_label_and_no_more(mode: Mode) {
    let Some(site) = Site::new(&format!("wild-{}", mode.flag()), &[WILDCARD]) else {
        return;
    };
    let proxy = site.start(mode, &[]).await;
    let before = proxy.scrape();
    let cases = [
        ("a.wild.test", true),
        ("A.Wild.Test", true),
        ("b.a.wild.test", false),
        ("wild.test", false),
    ];
    for (name, admitted) in cases {
        let out = site.openssl(Some(name), name).await;
        if admitted {
            assert!(out.starts_with("HTTP/1.1 200"), "{name}: {out:?}");
        } else {
            assert_eq!(out, "", "{name} should be reset");
        }
    }
    assert_eq!(site.curl("c.wild.test").await, Ok(200));
    let after = scrape_until(&proxy, "five decisions", |s| {
        s.gate("pass") + s.gate("unknown") >= before.gate("pass") + before.gate("unknown") + 5.0
    })
    .await;
    assert_eq!(after.gate("pass") - before.gate("pass"), 3.0);
    assert_eq!(after.gate("unknown") - before.gate("unknown"), 2.0);
    if mode == Mode::Ebpf {
        assert_eq!(after.kernel("pass") - before.kernel("pass"), 3.0);
        assert_eq!(after.kernel("unknown") - before.kernel("unknown"), 2.0);
    }
}

#[tokio::test]
async fn a_wildcard_admits_one_label_and_no_more_ebpf() {
    a_wildcard_admits_one_label_and_no_more(Mode::Ebpf).await;
}

#[tokio::test]
async fn a_wildcard_admits_one_label_and_no_more_userspace() {
    a_wildcard_admits_one_label_and_no_more(Mode::Userspace).await;
}

// ---------------------------------------------------------------------------------------------
// Hellos in pieces

async fn a_client_hello_in_three_writes_is_served(mode: Mode) {
    let Some(site) = Site::new(&format!("split-{}", mode.flag()), &[KNOWN]) else {
        return;
    };
    let proxy = site.start(mode, &[]).await;
    let before = proxy.scrape();
    // rustls' ClientHello leaves as the 5-byte record header, 145 bytes, then the rest.
    let pieces = Pieces {
        inner: site.connect(MAIN.https).await,
        cuts: VecDeque::from([5, 150]),
        written: 0,
        pause: Duration::from_millis(100),
        sleep: None,
    };
    let outcome = https_get(pieces, &site.clients, Some(KNOWN), KNOWN).await;
    assert_eq!(outcome, Outcome::Served(200), "logs:\n{}", proxy.logs());
    let after = proxy.scrape();
    assert_eq!(after.gate("pass") - before.gate("pass"), 1.0);
    if mode == Mode::Ebpf {
        assert!(
            after.kernel("parser_waited") > before.kernel("parser_waited"),
            "the kernel never saw a partial record"
        );
    }
}

#[tokio::test]
async fn a_client_hello_in_three_writes_is_served_ebpf() {
    a_client_hello_in_three_writes_is_served(Mode::Ebpf).await;
}

#[tokio::test]
async fn a_client_hello_in_three_writes_is_served_userspace() {
    a_client_hello_in_three_writes_is_served(Mode::Userspace).await;
}

async fn chromiums_two_segment_hello_with_the_name_in_the_second(mode: Mode) {
    // Chromium's post-quantum hello: 1929 bytes, server_name at byte 1640, past the first
    // segment's payload on this MTU-1500 link.
    let hello = corpus("chromium-2.bin");
    assert!(hello.len() > 1500);
    let Some(site) = Site::new(
        &format!("chromium-{}", mode.flag()),
        &["chromium.example.test"],
    ) else {
        return;
    };
    let proxy = site.start(mode, &[]).await;
    let before = proxy.scrape();

    // Known: admitted, and rustls answers with its ServerHello.
    let ending = site.send(MAIN.https, &[&hello], Duration::ZERO).await;
    match &ending {
        Ending::Answered(bytes) => assert_eq!(&bytes[..3], &[0x16, 0x03, 0x03], "a handshake"),
        other => panic!("expected rustls to answer, got {other:?}"),
    }
    let after = scrape_until(&proxy, "one pass", |s| s.gate("pass") > before.gate("pass")).await;
    if mode == Mode::Ebpf {
        assert_eq!(after.kernel("pass") - before.kernel("pass"), 1.0);
        assert!(
            after.kernel("parser_waited") > before.kernel("parser_waited"),
            "the hello arrived in one segment, so this proves nothing"
        );
    }

    // The same hello for a name of the same length that nothing serves: reset.
    let unknown = renamed(&hello, "chromium.example.test", "chromium.unknown.test");
    let ending = site.send(MAIN.https, &[&unknown], Duration::ZERO).await;
    assert_fast_reset(&ending, "Chromium's hello for an unknown name");
    let last = scrape_until(&proxy, "one unknown", |s| {
        s.gate("unknown") > after.gate("unknown")
    })
    .await;
    if mode == Mode::Ebpf {
        assert_eq!(last.kernel("unknown") - after.kernel("unknown"), 1.0);
    }
}

#[tokio::test]
async fn chromiums_two_segment_hello_with_the_name_in_the_second_ebpf() {
    chromiums_two_segment_hello_with_the_name_in_the_second(Mode::Ebpf).await;
}

#[tokio::test]
async fn chromiums_two_segment_hello_with_the_name_in_the_second_userspace() {
    chromiums_two_segment_hello_with_the_name_in_the_second(Mode::Userspace).await;
}

// ---------------------------------------------------------------------------------------------
// Hand-written packets: segments out of order, a wrong checksum, the same segment twice

/// A connection from the raw peer (see `ingress_tests::rawtcp`) to the server's `port`,
/// handshake done, nothing sent.
fn raw_connect(site: &Site, port: u16) -> RawTcp {
    static NEXT: std::sync::atomic::AtomicU16 = std::sync::atomic::AtomicU16::new(0);
    let local_port = 41000 + NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let link = site
        .pair
        .raw_link()
        .expect("a packet socket in the client namespace");
    RawTcp::connect(link, local_port, (SERVER_IP, port), STEP).expect("the raw handshake")
}

/// What the server did next, from a blocking wait off the runtime's thread.
async fn raw_answer(conn: RawTcp) -> (RawTcp, Answer) {
    tokio::task::spawn_blocking(move || {
        let answer = conn.answer(STEP).expect("reading the server's answer");
        (conn, answer)
    })
    .await
    .expect("the answer thread")
}

fn assert_server_hello(answer: &Answer, what: &str) {
    match answer {
        Answer::Data(bytes) => assert_eq!(&bytes[..3], &[0x16, 0x03, 0x03], "{what}: a handshake"),
        other => panic!("{what}: expected a ServerHello, got {other:?}"),
    }
}

/// A two-segment ClientHello whose second segment arrives first (the first was lost, or
/// overtaken): the connection is served. Only the first segment of a connection can be
/// judged on its own; a later one, seen first, is the middle of a record.
async fn a_hello_whose_first_segment_arrives_second_is_served(mode: Mode) {
    let hello = corpus("chromium-2.bin");
    let Some(site) = Site::new(
        &format!("reorder-{}", mode.flag()),
        &["chromium.example.test"],
    ) else {
        return;
    };
    let proxy = site.start(mode, &[]).await;
    let before = proxy.scrape();
    // The second piece starts with a byte no TLS record starts with, as most cuts do.
    let cut = 1400;
    assert!(!(20..=24).contains(&hello[cut]), "pick another cut");
    let mut conn = raw_connect(&site, MAIN.https);
    conn.send_at(
        u32::try_from(cut).unwrap(),
        &hello[cut..],
        Damage::default(),
    )
    .expect("send the second segment");
    tokio::time::sleep(Duration::from_millis(50)).await;
    conn.send_at(0, &hello[..cut], Damage::default())
        .expect("send the first segment");
    let (mut conn, answer) = raw_answer(conn).await;
    assert_server_hello(&answer, "reordered Chromium hello");
    conn.reset(u32::try_from(hello.len()).unwrap())
        .expect("reset");
    let after = scrape_until(&proxy, "one pass", |s| s.gate("pass") > before.gate("pass")).await;
    assert_eq!(after.gate("pass") - before.gate("pass"), 1.0);
    if mode == Mode::Ebpf {
        assert_eq!(after.kernel("pass") - before.kernel("pass"), 1.0);
        assert_eq!(
            after.kernel("dropped"),
            before.kernel("dropped"),
            "{}",
            after.0
        );
    }
}

#[tokio::test]
async fn a_hello_whose_first_segment_arrives_second_is_served_ebpf() {
    a_hello_whose_first_segment_arrives_second_is_served(Mode::Ebpf).await;
}

#[tokio::test]
async fn a_hello_whose_first_segment_arrives_second_is_served_userspace() {
    a_hello_whose_first_segment_arrives_second_is_served(Mode::Userspace).await;
}

/// A first segment with a wrong TCP checksum naming a served host, then, with the same
/// sequence number, a real ClientHello for a name nothing serves, in two segments: TCP
/// discards the first, so only the second hello exists, and it is reset. Whatever looked at
/// the discarded segment (the TC hook runs before the checksum is checked) must not decide
/// for the bytes TCP accepted.
async fn an_early_pass_holds_only_for_the_bytes_tcp_accepted(mode: Mode) {
    let known = corpus("curl-tls13.bin");
    let unknown = renamed(&known, "curl.example.test", "curl.unknown.test");
    let Some(site) = Site::new(&format!("badsum-{}", mode.flag()), &["curl.example.test"]) else {
        return;
    };
    let proxy = site.start(mode, &[]).await;
    let before = proxy.scrape();
    let mut conn = raw_connect(&site, MAIN.https);
    conn.send_at(0, &known, Damage { bad_checksum: true })
        .expect("the damaged segment");
    tokio::time::sleep(Duration::from_millis(20)).await;
    // 100 bytes: the record header promises more, so this piece cannot be judged alone.
    conn.send_at(0, &unknown[..100], Damage::default())
        .expect("the first piece");
    tokio::time::sleep(Duration::from_millis(20)).await;
    conn.send_at(100, &unknown[100..], Damage::default())
        .expect("the second piece");
    let (_conn, answer) = raw_answer(conn).await;
    assert!(
        matches!(answer, Answer::Reset(_)),
        "a name nothing serves got {answer:?}; logs:\n{}",
        proxy.logs()
    );
    let after = scrape_until(&proxy, "one unknown", |s| {
        s.gate("unknown") > before.gate("unknown")
    })
    .await;
    assert_eq!(after.gate("unknown") - before.gate("unknown"), 1.0);
    assert_eq!(after.gate("pass"), before.gate("pass"));
    assert_eq!(
        after.handshakes(),
        before.handshakes(),
        "a handshake started"
    );
}

#[tokio::test]
async fn an_early_pass_holds_only_for_the_bytes_tcp_accepted_ebpf() {
    an_early_pass_holds_only_for_the_bytes_tcp_accepted(Mode::Ebpf).await;
}

#[tokio::test]
async fn an_early_pass_holds_only_for_the_bytes_tcp_accepted_userspace() {
    an_early_pass_holds_only_for_the_bytes_tcp_accepted(Mode::Userspace).await;
}

/// The first segment passed once (its copy then lost: a wrong checksum here), the name
/// removed, and the same segment again: the client is reset, and nothing the first copy left
/// in the kernel outlives the connection.
async fn a_retransmitted_first_segment_after_its_name_went_is_reset_and_leaves_nothing(mode: Mode) {
    let hello = corpus("curl-tls13.bin");
    let Some(site) = Site::new(
        &format!("retrans-{}", mode.flag()),
        &["curl.example.test", KNOWN],
    ) else {
        return;
    };
    let proxy = site.start(mode, &[]).await;
    let generation = |s: &Scrape| s.value("ingress_snapshot_generation", &[]);
    let mut conn = raw_connect(&site, MAIN.https);
    conn.send_at(0, &hello, Damage { bad_checksum: true })
        .expect("the lost copy");
    tokio::time::sleep(Duration::from_millis(20)).await;
    let published = generation(&proxy.scrape());
    site.write_hosts(&[KNOWN]);
    scrape_until(&proxy, "the change published", |s| {
        generation(s) > published
    })
    .await;
    let before = proxy.scrape();
    conn.send_at(0, &hello, Damage::default())
        .expect("the retransmission");
    let (_conn, answer) = raw_answer(conn).await;
    assert!(matches!(answer, Answer::Reset(_)), "got {answer:?}");
    let after = scrape_until(&proxy, "one unknown", |s| {
        s.gate("unknown") > before.gate("unknown")
    })
    .await;
    assert_eq!(after.gate("pass"), before.gate("pass"));
    if mode == Mode::Ebpf {
        assert_eq!(
            after.kernel("passed_before_accept"),
            before.kernel("passed_before_accept")
        );
        assert_eq!(
            map_entries(&site.pins.0.join("passed_early")),
            0,
            "a pass record outlived its connection"
        );
    }
}

#[tokio::test]
async fn a_retransmitted_first_segment_after_its_name_went_is_reset_and_leaves_nothing_ebpf() {
    a_retransmitted_first_segment_after_its_name_went_is_reset_and_leaves_nothing(Mode::Ebpf).await;
}

#[tokio::test]
async fn a_retransmitted_first_segment_after_its_name_went_is_reset_and_leaves_nothing_userspace() {
    a_retransmitted_first_segment_after_its_name_went_is_reset_and_leaves_nothing(Mode::Userspace)
        .await;
}

/// Entries in a pinned map (bpftool's dump; 0 if the map is empty).
fn map_entries(pin: &Path) -> usize {
    bpftool(&["map", "dump", "pinned", pin.to_str().expect("utf-8 path")])
        .as_array()
        .map_or(0, Vec::len)
}

// ---------------------------------------------------------------------------------------------
// One busy CPU

/// Pins the calling thread to `cpu`.
fn pin_thread(cpu: usize) {
    // SAFETY: an all-zero cpu_set_t is empty; CPU_SET only sets a bit in it.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: a valid set of the size passed, for the calling thread (0).
    let rc = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    assert_eq!(rc, 0, "sched_setaffinity: {}", io::Error::last_os_error());
}

/// UDP datagrams to the server's discard port as fast as one thread on `cpu` sends them, until
/// `stop`: the kernel receives each one in softirq on that CPU, which interrupts whatever runs
/// there in process context (a stream verdict run by the strparser's work, say).
fn softirq_load(
    pair: &NetPair,
    cpu: usize,
    stop: Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<u64> {
    let socket = pair
        .client
        .run(|| std::net::UdpSocket::bind("0.0.0.0:0").expect("udp socket"))
        .expect("client namespace thread");
    std::thread::spawn(move || {
        pin_thread(cpu);
        let target = SocketAddr::from((SERVER_IP, 9));
        let payload = [0u8; 64];
        let mut sent = 0;
        let deadline = Instant::now() + Duration::from_secs(120);
        while !stop.load(std::sync::atomic::Ordering::Relaxed) && Instant::now() < deadline {
            if socket.send_to(&payload, target).is_ok() {
                sent += 1;
            }
        }
        sent
    })
}

/// Many two-segment ClientHellos for a served name with the proxy on one CPU, clients and a
/// softirq flood on both: a decision running in process context (the strparser's work) is
/// interrupted by decisions running in softirq on the same CPU. None may be refused (a
/// workspace shared between them made the inner one see the outer one's extensions as
/// duplicates), and once it is over no workspace is left claimed or with bits set.
async fn split_hellos_on_one_busy_cpu_are_never_refused(mode: Mode) {
    const N: usize = 2000;
    const AT_ONCE: usize = 16;
    let hello = Arc::new(corpus("chromium-2.bin"));
    let Some(site) = Site::new(&format!("busy-{}", mode.flag()), &["chromium.example.test"]) else {
        return;
    };
    let taskset: Vec<String> = ["taskset", "-c", "0"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let proxy = site.spawn(&taskset, &site.args(mode.flag(), MAIN, &[]), MAIN);
    proxy.wait_ready().await;
    let before = proxy.scrape();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flood = softirq_load(&site.pair, 0, stop.clone());
    // The strparser's work runs on whichever CPU is free: load the other one too.
    let other = softirq_load(&site.pair, 1, stop.clone());

    let sockets = Arc::new(std::sync::Mutex::new(client_sockets(&site.pair, N)));
    let outcomes = Arc::new(std::sync::Mutex::new(BTreeMap::<String, usize>::new()));
    let mut clients = Vec::new();
    for i in 0..AT_ONCE {
        let (sockets, outcomes, hello) = (sockets.clone(), outcomes.clone(), hello.clone());
        clients.push(std::thread::spawn(move || {
            pin_thread(i % 2);
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            runtime.block_on(async move {
                loop {
                    let Some(socket) = sockets.lock().expect("sockets").pop() else {
                        return;
                    };
                    let ending = match socket.connect(server(MAIN.https)).await {
                        Ok(stream) => {
                            let _ = stream.set_nodelay(true);
                            match send_raw(stream, &[&hello], Duration::ZERO).await {
                                Ending::Answered(bytes) if bytes.starts_with(&[0x16, 3, 3]) => {
                                    "served".to_string()
                                }
                                other => format!("{other:?}"),
                            }
                        }
                        Err(e) => format!("connect: {e}"),
                    };
                    *outcomes
                        .lock()
                        .expect("outcomes")
                        .entry(ending)
                        .or_default() += 1;
                }
            });
        }));
    }
    for client in clients {
        tokio::task::spawn_blocking(move || client.join().expect("client thread"))
            .await
            .expect("join");
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let datagrams = tokio::task::spawn_blocking(move || {
        flood.join().expect("flood") + other.join().expect("flood")
    })
    .await
    .expect("join");
    let outcomes = outcomes.lock().expect("outcomes").clone();
    eprintln!("{mode:?}: {outcomes:?}, {datagrams} datagrams of softirq load");
    assert_eq!(
        outcomes.get("served").copied().unwrap_or(0),
        N,
        "a served name was refused: {outcomes:?}"
    );
    let after = scrape_until(&proxy, "every pass counted", |s| {
        s.gate("pass") >= before.gate("pass") + N as f64
    })
    .await;
    assert_eq!(after.gate("malformed"), before.gate("malformed"));
    if mode == Mode::Ebpf {
        assert_eq!(
            after.kernel("malformed"),
            before.kernel("malformed"),
            "{}",
            after.0
        );
        assert_eq!(after.kernel("pass") - before.kernel("pass"), N as f64);
        // Pins of a build that keeps its workspaces pinned (older ones did not).
        if site.pins.0.join("workspace_busy").exists() {
            let seen = ingress::gate::pinned_workspaces(&site.pins.0).expect("workspaces");
            assert_eq!(
                (seen.claimed, seen.dirty_words),
                (0, 0),
                "a workspace was left claimed or dirty: {seen:?}"
            );
        }
    }
}

#[tokio::test]
async fn split_hellos_on_one_busy_cpu_are_never_refused_ebpf() {
    split_hellos_on_one_busy_cpu_are_never_refused(Mode::Ebpf).await;
}

#[tokio::test]
async fn split_hellos_on_one_busy_cpu_are_never_refused_userspace() {
    split_hellos_on_one_busy_cpu_are_never_refused(Mode::Userspace).await;
}

/// Stream verdicts in process context (the strparser's work, which parses a hello that came
/// before accept) interrupted on their CPU by stream verdicts in softirq (hellos whose second
/// segment lands after accept): every packet the server receives is processed on CPU 0 (RPS)
/// while the proxy and the clients keep CPU 1 busy, so the work runs on CPU 0 too. Each run
/// has a workspace of its own: not one served name is refused (sharing one, the inner run
/// found the outer one's extensions in its duplicate bitmap and called the hello malformed),
/// and none is left claimed or dirty.
#[tokio::test]
async fn a_verdict_interrupted_on_its_cpu_never_disturbs_the_interrupting_one() {
    const N: usize = 3000;
    let hello = Arc::new(corpus("chromium-2.bin"));
    let Some(site) = Site::new("nested", &["chromium.example.test"]) else {
        return;
    };
    let taskset: Vec<String> = ["taskset", "-c", "1"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let proxy = site.spawn(&taskset, &site.args("ebpf", MAIN, &[]), MAIN);
    proxy.wait_ready().await;
    // Received packets on the server's end of the link are processed on CPU 0, whichever CPU
    // sent them (`ip netns exec` mounts the namespace's own /sys for this one command).
    let rps = Command::new("ip")
        .args(["netns", "exec", site.pair.server.name(), "sh", "-c"])
        .arg("echo 1 > /sys/class/net/veth0/queues/rx-0/rps_cpus")
        .status()
        .expect("ip netns exec");
    assert!(rps.success(), "setting rps_cpus");
    let before = proxy.scrape();

    let sockets = Arc::new(std::sync::Mutex::new(client_sockets(&site.pair, N)));
    let outcomes = Arc::new(std::sync::Mutex::new(BTreeMap::<String, usize>::new()));
    let mut clients = Vec::new();
    for i in 0..8 {
        let (sockets, outcomes, hello) = (sockets.clone(), outcomes.clone(), hello.clone());
        clients.push(std::thread::spawn(move || {
            pin_thread(1);
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            runtime.block_on(async move {
                loop {
                    let Some(socket) = sockets.lock().expect("sockets").pop() else {
                        return;
                    };
                    let ending = match socket.connect(server(MAIN.https)).await {
                        Ok(stream) => {
                            let _ = stream.set_nodelay(true);
                            // Half the clients send the hello at once (parsed by the work,
                            // after accept's peek), half pause before its second segment
                            // (parsed in softirq as it lands).
                            let (first, rest) = hello.split_at(1000);
                            let pause = if i % 2 == 0 {
                                Duration::ZERO
                            } else {
                                Duration::from_millis(2)
                            };
                            match send_raw(stream, &[first, rest], pause).await {
                                Ending::Answered(bytes) if bytes.starts_with(&[0x16, 3, 3]) => {
                                    "served".to_string()
                                }
                                other => format!("{other:?}"),
                            }
                        }
                        Err(e) => format!("connect: {e}"),
                    };
                    *outcomes
                        .lock()
                        .expect("outcomes")
                        .entry(ending)
                        .or_default() += 1;
                }
            });
        }));
    }
    for client in clients {
        tokio::task::spawn_blocking(move || client.join().expect("client thread"))
            .await
            .expect("join");
    }
    let outcomes = outcomes.lock().expect("outcomes").clone();
    let after = scrape_until(&proxy, "every decision counted", |s| {
        REASONS
            .iter()
            .map(|r| s.kernel(r) - before.kernel(r))
            .sum::<f64>()
            >= N as f64
    })
    .await;
    eprintln!(
        "{outcomes:?}; kernel pass {} malformed {} parser_waited {}",
        after.kernel("pass") - before.kernel("pass"),
        after.kernel("malformed") - before.kernel("malformed"),
        after.kernel("parser_waited") - before.kernel("parser_waited"),
    );
    assert_eq!(
        outcomes.get("served").copied().unwrap_or(0),
        N,
        "a served name was refused: {outcomes:?}"
    );
    assert_eq!(
        after.kernel("malformed"),
        before.kernel("malformed"),
        "{}",
        after.0
    );
    if site.pins.0.join("workspace_busy").exists() {
        let seen = ingress::gate::pinned_workspaces(&site.pins.0).expect("workspaces");
        assert_eq!((seen.claimed, seen.dirty_words), (0, 0), "{seen:?}");
    }
}

// ---------------------------------------------------------------------------------------------
// A flood of connections that never finish their ClientHello

/// This process's open-file limit, the soft one raised to the hard one (children inherit it).
fn raise_nofile() -> u64 {
    // SAFETY: getrlimit writes into the struct it is given.
    let mut limit: libc::rlimit = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) };
    assert_eq!(rc, 0, "getrlimit: {}", io::Error::last_os_error());
    // With CAP_SYS_RESOURCE the hard limit can be raised too (up to fs.nr_open).
    let raised = libc::rlimit {
        rlim_cur: limit.rlim_max.max(100_000),
        rlim_max: limit.rlim_max.max(100_000),
    };
    // SAFETY: a valid rlimit; raising the hard limit needs CAP_SYS_RESOURCE.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
        return raised.rlim_cur;
    }
    limit.rlim_cur = limit.rlim_max;
    // SAFETY: a valid rlimit within the hard limit.
    let rc = unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) };
    assert_eq!(rc, 0, "setrlimit: {}", io::Error::last_os_error());
    limit.rlim_cur
}

/// `count` connections at `rate` per second, each sending the first `prefix.len()` bytes of a
/// ClientHello (the header promises more) and then holding on until the server ends it or
/// `hold` passes. Runs on its own thread; returns how the connections ended.
fn partial_hello_flood(
    pair: &NetPair,
    prefix: Vec<u8>,
    count: usize,
    rate: u32,
    hold: Duration,
) -> std::thread::JoinHandle<BTreeMap<String, usize>> {
    let sockets = client_sockets(pair, count);
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async move {
            let prefix = Arc::new(prefix);
            let started = Instant::now();
            let mut tasks = tokio::task::JoinSet::new();
            for (i, socket) in sockets.into_iter().enumerate() {
                let due = started + Duration::from_secs_f64(i as f64 / f64::from(rate));
                tokio::time::sleep_until(due.into()).await;
                let prefix = prefix.clone();
                tasks.spawn(async move {
                    let connect = tokio::time::timeout(hold, socket.connect(server(MAIN.https)));
                    let Ok(Ok(mut stream)) = connect.await else {
                        return "connect failed".to_string();
                    };
                    if stream.write_all(&prefix).await.is_err() {
                        return "write failed".to_string();
                    }
                    let mut buf = [0u8; 64];
                    match tokio::time::timeout(hold, stream.read(&mut buf)).await {
                        Err(_) => "held to the end".to_string(),
                        Ok(Ok(0)) => "closed".to_string(),
                        Ok(Ok(_)) => "answered".to_string(),
                        Ok(Err(e)) if e.kind() == io::ErrorKind::ConnectionReset => {
                            "reset".to_string()
                        }
                        Ok(Err(e)) => format!("{:?}", e.kind()),
                    }
                });
            }
            let mut tally = BTreeMap::new();
            while let Some(done) = tasks.join_next().await {
                *tally.entry(done.expect("flood task")).or_default() += 1;
            }
            tally
        })
    })
}

/// 3,300 connections a second that send a record header and stall, each held for the gate
/// timeout, as many at once as the process limits allow (the test and the proxy each hold one
/// descriptor per connection). Known names, arriving in pieces (so through the socket path)
/// all the while, are all served: no per-connection record of theirs is evicted or refused for
/// want of room.
async fn a_flood_of_stalled_hellos_never_costs_a_known_name(mode: Mode) {
    const RATE: u32 = 3300;
    // Each mode's flood takes nearly all of this process's descriptors: one at a time.
    static ONE_FLOOD: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    let _flood = ONE_FLOOD.lock().await;
    let Some(site) = Site::new(&format!("stalled-{}", mode.flag()), &[KNOWN]) else {
        return;
    };
    // Room for the known traffic and everything else the test and the proxy hold.
    let count = usize::try_from(raise_nofile().saturating_sub(2000))
        .unwrap_or(usize::MAX)
        .min(40_000);
    eprintln!(
        "{count} stalled connections (more than 32,768: {})",
        count > 32_768
    );
    site.pair
        .client
        .exec(
            "sysctl",
            &["-qw", "net.ipv4.ip_local_port_range=1024 65535"],
        )
        .expect("port range");
    // The flood comes from one address, in more connections than the connection caps allow
    // one client (or all of them); this measures the gate's own per-connection state, so the
    // caps (edge_limits.rs tests them) are off.
    let proxy = site
        .start(
            mode,
            &[
                "--max-connections",
                "0",
                "--max-connections-per-client",
                "0",
            ],
        )
        .await;
    let before = proxy.scrape();
    // Records can no longer be evicted whatever the flood's size: the per-connection maps are
    // plain hashes (an LRU evicted the freshest records first), each sized for every
    // connection SOCKS can hold. A machine whose descriptor limit cannot be raised past the
    // old LRU's 32,768 (no CAP_SYS_RESOURCE) floods with what it has.
    for map in ["verdicts"].iter().filter(|_| mode == Mode::Ebpf) {
        let pin = site.pins.0.join(map);
        let info = bpftool(&["map", "show", "pinned", pin.to_str().expect("utf-8 path")]);
        assert_eq!(info["type"], "hash", "{map}: {info}");
        assert!(
            info["max_entries"].as_u64() >= Some(65_536),
            "{map} is smaller than SOCKS: {info}"
        );
    }

    let hello = corpus("curl-tls13.bin");
    let flood = partial_hello_flood(
        &site.pair,
        hello[..100].to_vec(),
        count,
        RATE,
        Duration::from_secs(20),
    );
    let flooding = Instant::now();
    let flood_time = Duration::from_secs_f64(count as f64 / f64::from(RATE));
    let mut known: BTreeMap<String, usize> = BTreeMap::new();
    let mut during = Vec::new();
    while flooding.elapsed() < flood_time + Duration::from_secs(3) {
        let round = (0..4).map(|_| async {
            let pieces = Pieces {
                inner: site.connect(MAIN.https).await,
                cuts: VecDeque::from([5, 150]),
                written: 0,
                pause: Duration::from_millis(20),
                sleep: None,
            };
            https_get(pieces, &site.clients, Some(KNOWN), KNOWN).await
        });
        for outcome in futures_util::future::join_all(round).await {
            *known.entry(format!("{outcome:?}")).or_default() += 1;
        }
        during.push(proxy.scrape());
    }
    let tally = tokio::task::spawn_blocking(move || flood.join().expect("flood thread"))
        .await
        .expect("join");
    let after = proxy.scrape();
    eprintln!("{mode:?}: known {known:?}\n  flood {tally:?}");
    if mode == Mode::Ebpf {
        for counter in [
            "sock_added",
            "sock_add_failed",
            "record_failed",
            "parser_waited",
            "pass",
        ] {
            eprintln!(
                "  {counter}: {}",
                after.kernel(counter) - before.kernel(counter)
            );
        }
    }
    let served = known
        .get(&format!("{:?}", Outcome::Served(200)))
        .copied()
        .unwrap_or(0);
    let total: usize = known.values().sum();
    assert!(
        total >= 40,
        "too little known traffic to mean anything: {known:?}"
    );
    assert_eq!(
        served, total,
        "a known name failed during the flood: {known:?}"
    );
    if mode == Mode::Ebpf {
        // Room for every stalled connection: none was left to userspace for want of space.
        assert_eq!(
            after.kernel("sock_add_failed"),
            before.kernel("sock_add_failed")
        );
        assert_eq!(
            after.kernel("record_failed"),
            before.kernel("record_failed")
        );
    }
}

/// Admission is over once the first record is handed to TLS: a connection the gate admitted keeps
/// no per-connection record in the kernel while it stays open, whichever path admitted it
/// (single-segment hellos before accept, split ones on the socket). Records that lived until
/// the connection closed were what the LRU evicted under a flood.
#[tokio::test]
async fn admitted_connections_hold_no_kernel_records_while_open() {
    let Some(site) = Site::new("admitted", &[KNOWN]) else {
        return;
    };
    let proxy = site.start(Mode::Ebpf, &[]).await;
    // A hello that fits one segment: X25519 alone (rustls's default post-quantum key share
    // makes its hello longer than the veth's MSS).
    let one_segment = {
        let provider = Arc::new(rustls::crypto::CryptoProvider {
            kx_groups: vec![rustls::crypto::aws_lc_rs::kx_group::X25519],
            ..rustls::crypto::aws_lc_rs::default_provider()
        });
        let mut config = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .expect("protocol versions")
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider)))
            .with_no_client_auth();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Arc::new(config)
    };
    let before = proxy.scrape();
    let mut open = Vec::new();
    for i in 0..20 {
        let (cuts, config) = if i % 2 == 0 {
            (VecDeque::new(), one_segment.clone())
        } else {
            (VecDeque::from([5, 150]), site.clients.verified.clone())
        };
        let pieces = Pieces {
            inner: site.connect(MAIN.https).await,
            cuts,
            written: 0,
            pause: Duration::from_millis(20),
            sleep: None,
        };
        let name = ServerName::try_from(KNOWN.to_string()).expect("a DNS name");
        let mut tls =
            tokio::time::timeout(STEP * 2, TlsConnector::from(config).connect(name, pieces))
                .await
                .expect("handshake in time")
                .unwrap_or_else(|e| panic!("#{i}: handshake: {e}; logs:\n{}", proxy.logs()));
        let request = format!("GET / HTTP/1.1\r\nHost: {KNOWN}\r\n\r\n");
        tls.write_all(request.as_bytes()).await.expect("request");
        let mut buf = [0u8; 4096];
        let n = tokio::time::timeout(STEP * 2, tls.read(&mut buf))
            .await
            .expect("response in time")
            .expect("response");
        assert!(
            buf[..n].starts_with(b"HTTP/1.1 200"),
            "#{i}: {}",
            String::from_utf8_lossy(&buf[..n])
        );
        open.push(tls);
    }
    let after = scrape_until(&proxy, "20 passes", |s| {
        s.kernel("pass") >= before.kernel("pass") + 20.0
    })
    .await;
    // Both paths were taken: some before accept, some on the socket.
    assert!(
        after.kernel("passed_before_accept") > before.kernel("passed_before_accept"),
        "no hello was decided before accept"
    );
    assert!(
        after.kernel("sock_added") > before.kernel("sock_added"),
        "no hello was decided on the socket"
    );
    for map in ["verdicts", "passed_early"] {
        assert_eq!(
            map_entries(&site.pins.0.join(map)),
            0,
            "{map} holds records of {} connections that are open and past admission",
            open.len()
        );
    }
    drop(open);
}

#[tokio::test]
async fn a_flood_of_stalled_hellos_never_costs_a_known_name_ebpf() {
    a_flood_of_stalled_hellos_never_costs_a_known_name(Mode::Ebpf).await;
}

#[tokio::test]
async fn a_flood_of_stalled_hellos_never_costs_a_known_name_userspace() {
    a_flood_of_stalled_hellos_never_costs_a_known_name(Mode::Userspace).await;
}

// ---------------------------------------------------------------------------------------------
// Behind a firewall

/// The rule ufw, firewalld and most hardening guides install, on the interface clients come
/// in through: unknown names must still be reset at once, never left to time out.
async fn a_refused_client_is_reset_behind_a_firewall_that_drops_invalid(mode: Mode) {
    let Some(site) = Site::new(&format!("firewall-{}", mode.flag()), &[KNOWN]) else {
        return;
    };
    let proxy = site.start(mode, &[]).await;
    site.pair
        .server
        .exec(
            "iptables",
            &[
                "-I",
                "INPUT",
                "-i",
                "veth0",
                "-m",
                "conntrack",
                "--ctstate",
                "INVALID",
                "-j",
                "DROP",
            ],
        )
        .expect("iptables (install it with `cargo xtask setup`)");
    let before = proxy.scrape();
    let mut endings = Vec::new();
    for i in 0..10 {
        let started = Instant::now();
        let result = site.curl(&format!("nobody-{i}.test")).await;
        endings.push((result, started.elapsed()));
    }
    eprintln!("{mode:?} behind the firewall: {endings:?}");
    for (i, (result, took)) in endings.iter().enumerate() {
        // curl: (35) Recv failure: Connection reset by peer.
        assert_eq!(
            *result,
            Err(Some(35)),
            "client {i}; logs:\n{}",
            proxy.logs()
        );
        assert!(*took < Duration::from_secs(1), "client {i} took {took:?}");
    }
    assert_eq!(
        site.curl(KNOWN).await,
        Ok(200),
        "the known name behind the firewall"
    );
    let after = scrape_until(&proxy, "ten unknown", |s| {
        s.gate("unknown") >= before.gate("unknown") + 10.0
    })
    .await;
    assert_eq!(after.gate("unknown") - before.gate("unknown"), 10.0);
    if mode == Mode::Ebpf {
        // Counted once each: what happened, not every segment that was judged.
        let delta = |c: &str| after.kernel(c) - before.kernel(c);
        assert_eq!(delta("unknown"), 10.0, "{}", after.0);
        assert_eq!(delta("dropped"), 10.0, "{}", after.0);
        // Each reset sent from the TC hook, once: none left to a retransmission.
        assert_eq!(delta("reset_before_accept_unknown"), 10.0, "{}", after.0);
        assert_eq!(delta("early_reset_unsent"), 0.0, "{}", after.0);
    }
}

#[tokio::test]
async fn a_refused_client_is_reset_behind_a_firewall_that_drops_invalid_ebpf() {
    a_refused_client_is_reset_behind_a_firewall_that_drops_invalid(Mode::Ebpf).await;
}

#[tokio::test]
async fn a_refused_client_is_reset_behind_a_firewall_that_drops_invalid_userspace() {
    a_refused_client_is_reset_behind_a_firewall_that_drops_invalid(Mode::Userspace).await;
}

// ---------------------------------------------------------------------------------------------
// Other listeners on the same port

/// Another server's listener on port 443, on an address `--bind` leaves free (and deferring
/// accept, as nginx's `listen … deferred` does): its clients are none of the gate's business,
/// whatever name they send and however their hello arrives.
async fn another_listener_on_the_port_is_left_alone(mode: Mode) {
    const OTHER: std::net::Ipv4Addr = std::net::Ipv4Addr::new(10, 231, 0, 9);
    let Some(site) = Site::new(&format!("other-{}", mode.flag()), &[KNOWN]) else {
        return;
    };
    site.pair
        .server
        .ip(&["addr", "add", "10.231.0.9/24", "dev", "veth0"])
        .expect("a second address");
    let mut args = site.args(mode.flag(), MAIN, &[]);
    let bind = args.iter().position(|a| a == "0.0.0.0").expect("--bind");
    args[bind] = SERVER_IP.to_string();
    let proxy = site.spawn(&[], &args, MAIN);
    proxy.wait_ready().await;
    let before = proxy.scrape();

    // The other server: reads what its client sends, then answers "other".
    let listener = std::net::TcpListener::bind((OTHER, 443)).expect("bind the other listener");
    defer_accept_std(&listener);
    listener.set_nonblocking(true).expect("nonblocking");
    let listener = tokio::net::TcpListener::from_std(listener).expect("tokio listener");
    let (tx, mut received) = tokio::sync::mpsc::unbounded_channel();
    let server = tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                return;
            };
            let tx = tx.clone();
            tokio::spawn(async move {
                let mut got = Vec::new();
                let mut buf = [0u8; 4096];
                while let Ok(Ok(n)) =
                    tokio::time::timeout(Duration::from_millis(300), stream.read(&mut buf)).await
                {
                    if n == 0 {
                        break;
                    }
                    got.extend_from_slice(&buf[..n]);
                }
                let _ = stream.write_all(b"other").await;
                let _ = tx.send(got);
            });
        }
    });

    let unknown_one = corpus("curl-tls13.bin");
    let unknown_two = renamed(
        &corpus("chromium-2.bin"),
        "chromium.example.test",
        "chromium.unknown.test",
    );
    for (what, hello) in [
        ("one segment", &unknown_one),
        ("two segments", &unknown_two),
    ] {
        let socket = client_sockets(&site.pair, 1).pop().expect("a socket");
        let stream = tokio::time::timeout(STEP, socket.connect(SocketAddr::from((OTHER, 443))))
            .await
            .expect("connect in time")
            .expect("connect");
        let ending = send_raw(stream, &[hello], Duration::ZERO).await;
        assert_eq!(
            ending,
            Ending::Answered(b"other".to_vec()),
            "{what}: the other server did not answer; logs:\n{}",
            proxy.logs()
        );
        let got = tokio::time::timeout(STEP, received.recv())
            .await
            .expect("the other server finished")
            .expect("a report");
        assert_eq!(&got, hello, "{what}: the other server got other bytes");
    }
    server.abort();
    let after = proxy.scrape();
    let total = |s: &Scrape| REASONS.iter().map(|r| s.gate(r)).sum::<f64>();
    assert_eq!(total(&after), total(&before), "the proxy decided something");
    if mode == Mode::Ebpf {
        for counter in [
            "unknown",
            "dropped",
            "sock_added",
            "reset_before_accept_unknown",
        ] {
            assert_eq!(after.kernel(counter), before.kernel(counter), "{counter}");
        }
    }
    // The proxy's own address is still gated.
    assert_eq!(site.curl(KNOWN).await, Ok(200));
    assert_eq!(site.curl("nobody.test").await, Err(Some(35)));
}

#[tokio::test]
async fn another_listener_on_the_port_is_left_alone_ebpf() {
    another_listener_on_the_port_is_left_alone(Mode::Ebpf).await;
}

#[tokio::test]
async fn another_listener_on_the_port_is_left_alone_userspace() {
    another_listener_on_the_port_is_left_alone(Mode::Userspace).await;
}

/// TCP_DEFER_ACCEPT on a listener: its connections wait in the SYN queue for their first data.
fn defer_accept_std(listener: &std::net::TcpListener) {
    use std::os::fd::AsRawFd;
    let seconds: libc::c_int = 5;
    // SAFETY: a valid socket and an int option of the size passed.
    let rc = unsafe {
        libc::setsockopt(
            listener.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_DEFER_ACCEPT,
            (&raw const seconds).cast(),
            libc::socklen_t::try_from(std::mem::size_of::<libc::c_int>()).unwrap(),
        )
    };
    assert_eq!(rc, 0, "TCP_DEFER_ACCEPT: {}", io::Error::last_os_error());
}

// ---------------------------------------------------------------------------------------------
// Another TC program on the hook

/// A CNI's TC program on the interface (a stand-in that returns TC_ACT_OK, as Cilium's do):
/// the early reset is attached ahead of it, so it still runs; a program attached ahead of it
/// later is reported (a warning and `ingress_ebpf_early_reset_shadowed`), and connections
/// through that interface are still judged, after accept.
#[tokio::test]
async fn a_cni_program_on_the_hook_neither_hides_the_early_reset_nor_goes_unreported() {
    let Some(site) = Site::new("tcx", &[KNOWN]) else {
        return;
    };
    let _cni = StandIn::attach_first(&site.pair.server, "veth0").expect("the stand-in attaches");
    let proxy = site.start(Mode::Ebpf, &[]).await;
    let shadowed = |s: &Scrape| {
        s.value(
            "ingress_ebpf_early_reset_shadowed",
            &[("interface", "veth0")],
        )
    };
    let hello = corpus("curl-tls13.bin");
    let before = proxy.scrape();
    assert_eq!(shadowed(&before), 0.0, "{}", before.0);
    let ending = site.send(MAIN.https, &[&hello], Duration::ZERO).await;
    assert_fast_reset(&ending, "unknown name with a CNI program on the hook");
    let after = scrape_until(&proxy, "one unknown", |s| {
        s.kernel("unknown") > before.kernel("unknown")
    })
    .await;
    assert_eq!(
        after.kernel("reset_before_accept_unknown") - before.kernel("reset_before_accept_unknown"),
        1.0,
        "the early reset did not run: {}",
        after.0
    );

    // The CNI restarts and puts itself first again.
    let late = StandIn::attach_first(&site.pair.server, "veth0").expect("attach again");
    let deadline = Instant::now() + Duration::from_secs(15);
    while shadowed(&proxy.scrape()) != 1.0 {
        assert!(
            Instant::now() < deadline,
            "shadowing not reported; logs:\n{}",
            proxy.logs()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let logs = proxy.logs();
    assert!(
        logs.contains("another TC program runs before the early reset") && logs.contains("standin"),
        "{logs}"
    );
    // Still refused: after accept now.
    let before = proxy.scrape();
    let ending = site.send(MAIN.https, &[&hello], Duration::ZERO).await;
    assert_fast_reset(
        &ending,
        "unknown name behind a program that shadows the early reset",
    );
    let after = scrape_until(&proxy, "one unknown", |s| {
        s.kernel("unknown") > before.kernel("unknown")
    })
    .await;
    let delta = |c: &str| after.kernel(c) - before.kernel(c);
    assert_eq!(delta("reset_before_accept_unknown"), 0.0, "{}", after.0);
    assert_eq!(delta("sock_added"), 1.0, "{}", after.0);

    drop(late);
    let deadline = Instant::now() + Duration::from_secs(15);
    while shadowed(&proxy.scrape()) != 0.0 {
        assert!(Instant::now() < deadline, "{}", proxy.logs());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        proxy.logs().contains("the early reset runs first again"),
        "{}",
        proxy.logs()
    );
}

// ---------------------------------------------------------------------------------------------
// No SNI, garbage, plain HTTP

async fn no_sni_garbage_and_plain_http_follow_the_flags(mode: Mode) {
    let Some(site) = Site::new(&format!("cases-{}", mode.flag()), &[KNOWN]) else {
        return;
    };
    // Defaults: no SNI is served (default certificate); the rest is reset. A request on it
    // for a host that has a certificate of its own is misdirected (--no-sni-requests).
    let proxy = site.start(mode, &[]).await;
    let before = proxy.scrape();
    let out = site.openssl(None, KNOWN).await;
    assert!(
        out.starts_with("HTTP/1.1 421"),
        "openssl without SNI: {out:?}"
    );
    assert_eq!(
        site.https_get(MAIN.https, None, KNOWN).await,
        Outcome::Served(421)
    );
    for (file, reason) in [
        ("garbage.bin", "not_tls"),
        ("http-get.bin", "not_tls"),
        ("synth-duplicate-sni.bin", "malformed"),
    ] {
        let seen = proxy.scrape();
        let ending = site
            .send(MAIN.https, &[&corpus(file)], Duration::ZERO)
            .await;
        assert_fast_reset(&ending, file);
        let after = scrape_until(&proxy, file, |s| s.gate(reason) > seen.gate(reason)).await;
        assert_eq!(
            moved(&seen, &after, Scrape::gate),
            vec![reason.to_string()],
            "{file}"
        );
        if mode == Mode::Ebpf {
            assert_eq!(
                moved(&seen, &after, Scrape::kernel),
                vec![reason.to_string()],
                "{file}"
            );
        }
    }
    // Plain HTTP on the HTTPS port, from curl.
    let out = site
        .pair
        .client
        .command("curl")
        .args(["-s", "--max-time", "5"])
        .arg(format!("http://{SERVER_IP}:{}/", MAIN.https))
        .output()
        .await
        .expect("curl");
    assert_eq!(
        out.status.code(),
        Some(56),
        "curl: connection reset while receiving"
    );
    let after = scrape_until(&proxy, "three not_tls", |s| {
        s.gate("not_tls") >= before.gate("not_tls") + 3.0
    })
    .await;
    assert_eq!(after.gate("no_sni") - before.gate("no_sni"), 2.0);
    assert_eq!(
        after.handshakes() - before.handshakes(),
        2.0,
        "only the no-SNI ones"
    );
    drop(proxy);

    // The other way round: no SNI reset, plain HTTP admitted (and then failed by TLS).
    let proxy = site
        .start(mode, &["--no-sni", "reject", "--not-tls", "accept"])
        .await;
    let before = proxy.scrape();
    let ending = site
        .send(
            MAIN.https,
            &[&corpus("openssl-tls13-nosni.bin")],
            Duration::ZERO,
        )
        .await;
    assert_fast_reset(&ending, "no SNI under --no-sni reject");
    let ending = site
        .send(MAIN.https, &[&corpus("http-get.bin")], Duration::ZERO)
        .await;
    assert!(
        !matches!(ending, Ending::Reset(_)),
        "plain HTTP is handed to TLS under --not-tls accept, got {ending:?}"
    );
    let after = scrape_until(&proxy, "a failed handshake", |s| {
        s.value("ingress_tls_handshakes_total", &[("result", "failed")]) >= 1.0
    })
    .await;
    assert_eq!(after.gate("no_sni") - before.gate("no_sni"), 1.0);
    assert_eq!(after.gate("not_tls") - before.gate("not_tls"), 1.0);
    if mode == Mode::Ebpf {
        assert_eq!(after.kernel("no_sni") - before.kernel("no_sni"), 1.0);
        assert_eq!(after.kernel("not_tls") - before.kernel("not_tls"), 1.0);
        assert_eq!(after.kernel("dropped") - before.kernel("dropped"), 1.0);
    }
}

#[tokio::test]
async fn no_sni_garbage_and_plain_http_follow_the_flags_ebpf() {
    no_sni_garbage_and_plain_http_follow_the_flags(Mode::Ebpf).await;
}

#[tokio::test]
async fn no_sni_garbage_and_plain_http_follow_the_flags_userspace() {
    no_sni_garbage_and_plain_http_follow_the_flags(Mode::Userspace).await;
}

// ---------------------------------------------------------------------------------------------
// 1000 concurrent mixed connections

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Known,
    Unknown,
    Wildcard,
    Deeper,
    NoSni,
    Garbage,
    PlainHttp,
}

impl Kind {
    const ALL: [Kind; 7] = [
        Kind::Known,
        Kind::Unknown,
        Kind::Wildcard,
        Kind::Deeper,
        Kind::NoSni,
        Kind::Garbage,
        Kind::PlainHttp,
    ];

    fn expected(self) -> Outcome {
        match self {
            Kind::Known | Kind::Wildcard => Outcome::Served(200),
            // Admitted and handshaken, but the host it asks for has a certificate of its own.
            Kind::NoSni => Outcome::Served(421),
            _ => Outcome::Reset,
        }
    }

    fn reason(self) -> &'static str {
        match self {
            Kind::Known | Kind::Wildcard => "pass",
            Kind::Unknown | Kind::Deeper => "unknown",
            Kind::NoSni => "no_sni",
            Kind::Garbage | Kind::PlainHttp => "not_tls",
        }
    }

    async fn run(self, i: usize, stream: TcpStream, clients: Clients) -> Outcome {
        let sni = match self {
            Kind::Known => Some(KNOWN.to_string()),
            Kind::Unknown => Some(format!("nobody-{i}.test")),
            Kind::Wildcard => Some(format!("w{i}.wild.test")),
            Kind::Deeper => Some(format!("x.w{i}.wild.test")),
            Kind::NoSni => None,
            Kind::Garbage | Kind::PlainHttp => {
                let file = if self == Kind::Garbage {
                    "garbage.bin"
                } else {
                    "http-get.bin"
                };
                return match send_raw(stream, &[&corpus(file)], Duration::ZERO).await {
                    Ending::Reset(_) => Outcome::Reset,
                    other => Outcome::Failed(format!("{other:?}")),
                };
            }
        };
        https_get(stream, &clients, sni.as_deref(), KNOWN).await
    }
}

async fn a_thousand_concurrent_mixed_connections_are_all_classified(mode: Mode) {
    const N: usize = 1000;
    let Some(site) = Site::new(&format!("mixed-{}", mode.flag()), &[KNOWN, WILDCARD]) else {
        return;
    };
    let proxy = site.start(mode, &[]).await;
    let before = proxy.scrape();
    let sockets = client_sockets(&site.pair, N);
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for (i, socket) in sockets.into_iter().enumerate() {
        let kind = Kind::ALL[i % Kind::ALL.len()];
        let clients = site.clients.clone();
        tasks.spawn(async move {
            let outcome = match socket.connect(server(MAIN.https)).await {
                Ok(stream) => {
                    let _ = stream.set_nodelay(true);
                    kind.run(i, stream, clients).await
                }
                Err(e) => Outcome::Failed(format!("connect: {e}")),
            };
            (kind, outcome)
        });
    }
    let mut tally: BTreeMap<(Kind, String), usize> = BTreeMap::new();
    let mut wrong = Vec::new();
    let all = async {
        while let Some(joined) = tasks.join_next().await {
            let (kind, outcome) = joined.expect("client task");
            *tally.entry((kind, format!("{outcome:?}"))).or_default() += 1;
            if outcome != kind.expected() {
                wrong.push(format!("{kind:?}: {outcome:?}"));
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(180), all)
        .await
        .expect("1000 connections finished within 3 minutes");
    eprintln!("{N} connections in {:?} ({mode:?}):", started.elapsed());
    for ((kind, outcome), count) in &tally {
        eprintln!("  {kind:?} -> {outcome}: {count}");
    }
    assert!(
        wrong.is_empty(),
        "{} of {N} misclassified, e.g.:\n{}\nlogs:\n{}",
        wrong.len(),
        wrong
            .iter()
            .take(20)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n"),
        proxy.logs()
    );

    // The proxy's counters (and the kernel's) agree with what the clients saw.
    let mut want: BTreeMap<&str, f64> = BTreeMap::new();
    for i in 0..N {
        *want
            .entry(Kind::ALL[i % Kind::ALL.len()].reason())
            .or_default() += 1.0;
    }
    let after = scrape_until(&proxy, "every decision counted", |s| {
        REASONS
            .iter()
            .map(|r| s.gate(r) - before.gate(r))
            .sum::<f64>()
            >= N as f64
    })
    .await;
    for reason in REASONS {
        let want = want.get(reason).copied().unwrap_or(0.0);
        assert_eq!(
            after.gate(reason) - before.gate(reason),
            want,
            "proxy {reason}"
        );
        if mode == Mode::Ebpf {
            assert_eq!(
                after.kernel(reason) - before.kernel(reason),
                want,
                "kernel {reason}"
            );
        }
    }
    let served = want["pass"] + want["no_sni"];
    assert_eq!(
        after.value("ingress_tls_handshakes_total", &[("result", "ok")])
            - before.value("ingress_tls_handshakes_total", &[("result", "ok")]),
        served
    );
    assert_eq!(
        after.handshakes() - before.handshakes(),
        served,
        "no other handshakes"
    );
    if mode == Mode::Ebpf {
        for counter in ["sock_add_failed", "event_lost", "record_failed"] {
            assert_eq!(after.kernel(counter), 0.0, "{counter}");
        }
    }
}

#[tokio::test]
async fn a_thousand_concurrent_mixed_connections_are_all_classified_ebpf() {
    a_thousand_concurrent_mixed_connections_are_all_classified(Mode::Ebpf).await;
}

#[tokio::test]
async fn a_thousand_concurrent_mixed_connections_are_all_classified_userspace() {
    a_thousand_concurrent_mixed_connections_are_all_classified(Mode::Userspace).await;
}

// ---------------------------------------------------------------------------------------------
// Route changes under load

/// Opens new connections to `name` until `stop`, one after another, and tallies the outcomes.
async fn hammer(
    site: &Site,
    name: &'static str,
    verify: bool,
    stop: &tokio::sync::watch::Receiver<bool>,
) -> BTreeMap<String, usize> {
    let mut tally = BTreeMap::new();
    let clients = if verify {
        site.clients.clone()
    } else {
        Clients {
            verified: site.clients.any.clone(),
            any: site.clients.any.clone(),
        }
    };
    while !*stop.borrow() {
        let stream = site.connect(MAIN.https).await;
        let local = stream.local_addr().ok();
        let started = Instant::now();
        let outcome = https_get(stream, &clients, Some(name), name).await;
        if matches!(outcome, Outcome::Failed(_)) {
            eprintln!(
                "{name} from {local:?} failed after {:?}: {outcome:?}",
                started.elapsed()
            );
        }
        *tally.entry(format!("{outcome:?}")).or_default() += 1;
    }
    tally
}

async fn a_route_change_under_load_never_resets_a_still_valid_name(mode: Mode) {
    let before_hosts = ["stay.test", "gone.test"];
    let after_hosts = ["stay.test", "new.test"];
    let Some(site) = Site::new(&format!("change-{}", mode.flag()), &before_hosts) else {
        return;
    };
    let proxy = site.start(mode, &[]).await;
    let generation = |s: &Scrape| s.value("ingress_snapshot_generation", &[]);
    let (stop_tx, stop) = tokio::sync::watch::channel(false);

    let load = async {
        let stays =
            futures_util::future::join_all((0..4).map(|_| hammer(&site, "stay.test", true, &stop)));
        let (stays, gone, new) = tokio::join!(
            stays,
            hammer(&site, "gone.test", false, &stop),
            hammer(&site, "new.test", false, &stop)
        );
        let mut stay: BTreeMap<String, usize> = BTreeMap::new();
        for tally in stays {
            for (outcome, count) in tally {
                *stay.entry(outcome).or_default() += count;
            }
        }
        (stay, gone, new)
    };
    let changes = async {
        let mut published = generation(&proxy.scrape());
        // 21 changes, ending on the new hosts, each waited for so every one happens under load.
        for i in 0..21 {
            tokio::time::sleep(Duration::from_millis(60)).await;
            site.write_hosts(if i % 2 == 0 {
                &after_hosts
            } else {
                &before_hosts
            });
            let deadline = Instant::now() + STEP;
            loop {
                let now = generation(&proxy.scrape());
                if now > published {
                    published = now;
                    break;
                }
                assert!(Instant::now() < deadline, "change {i} was not published");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        stop_tx.send(true).expect("stop");
    };
    let ((stay, gone, new), ()) = tokio::join!(load, changes);
    eprintln!("{mode:?}: stay.test {stay:?}\n  gone.test {gone:?}\n  new.test {new:?}");
    let ok = stay
        .get(&format!("{:?}", Outcome::Served(200)))
        .copied()
        .unwrap_or(0);
    let total: usize = stay.values().sum();
    assert_eq!(
        ok,
        total,
        "stay.test, valid throughout, was not always served: {stay:?}; logs:\n{}",
        proxy.logs()
    );
    assert!(
        total >= 40,
        "too little load to mean anything: {total} connections"
    );
    for (name, tally) in [("gone.test", &gone), ("new.test", &new)] {
        for outcome in tally.keys() {
            assert!(
                outcome == &format!("{:?}", Outcome::Reset) || outcome.starts_with("Served"),
                "{name}: {outcome}"
            );
        }
    }

    // Settled on the new hosts: the added name is served, the removed one is reset.
    assert_eq!(
        site.https_get(MAIN.https, Some("new.test"), "new.test")
            .await,
        Outcome::Served(200)
    );
    assert_eq!(
        site.https_get(MAIN.https, Some("gone.test"), "gone.test")
            .await,
        Outcome::Reset
    );
    let scrape = proxy.scrape();
    assert_eq!(scrape.value("ingress_gate_sync_errors_total", &[]), 0.0);
    if mode == Mode::Ebpf {
        let hosts = host_names(&site.pins.0);
        assert_eq!(
            hosts,
            BTreeSet::from(["new.test".to_string(), "stay.test".to_string()]),
            "the kernel holds exactly the served names"
        );
    }
}

#[tokio::test]
async fn a_route_change_under_load_never_resets_a_still_valid_name_ebpf() {
    a_route_change_under_load_never_resets_a_still_valid_name(Mode::Ebpf).await;
}

#[tokio::test]
async fn a_route_change_under_load_never_resets_a_still_valid_name_userspace() {
    a_route_change_under_load_never_resets_a_still_valid_name(Mode::Userspace).await;
}

// ---------------------------------------------------------------------------------------------
// Startup: nothing is answered before the configuration is loaded

/// What probing one port from the moment the process started saw.
#[derive(Debug, Default)]
struct Probed {
    /// Connections refused: the port was not open yet.
    refused: usize,
    served: usize,
    /// Anything else: a 404 for a served host, a reset, a failed handshake.
    wrong: Vec<String>,
}

/// Probes HTTP and HTTPS for `host` from now on, one connection after another, until each
/// has been served `want` times (or `limit` passes): a closed port is fine, as it is for a
/// load balancer's health check, and anything but the right answer is not. The right answer
/// over HTTPS is 200; over HTTP it is the redirect to HTTPS a host with TLS gets (308).
async fn probe_from_start(site: &Site, host: &str, want: usize, limit: Duration) -> [Probed; 2] {
    let mut seen = [Probed::default(), Probed::default()];
    let deadline = Instant::now() + limit;
    while seen.iter().any(|p| p.served < want) && Instant::now() < deadline {
        for (https, probed) in seen.iter_mut().enumerate() {
            if probed.served >= want {
                continue;
            }
            let port = if https == 1 { MAIN.https } else { MAIN.http };
            let socket = client_sockets(&site.pair, 1).pop().expect("a socket");
            let stream = match tokio::time::timeout(STEP, socket.connect(server(port))).await {
                Ok(Ok(stream)) => stream,
                Ok(Err(e)) if e.kind() == io::ErrorKind::ConnectionRefused => {
                    probed.refused += 1;
                    continue;
                }
                other => {
                    probed.wrong.push(format!("connect: {other:?}"));
                    continue;
                }
            };
            let (outcome, right) = if https == 1 {
                (
                    https_get(stream, &site.clients, Some(host), host).await,
                    200,
                )
            } else {
                (http_get(stream, host).await, 308)
            };
            match outcome {
                Outcome::Served(status) if status == right => probed.served += 1,
                other => probed.wrong.push(format!("{other:?}")),
            }
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    seen
}

/// `GET /` over plain HTTP with `Host: host`.
async fn http_get(mut stream: TcpStream, host: &str) -> Outcome {
    let request = format!("GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    if let Err(e) = stream.write_all(request.as_bytes()).await {
        return Outcome::Failed(format!("write: {e}"));
    }
    let mut response = Vec::new();
    match tokio::time::timeout(STEP, stream.read_to_end(&mut response)).await {
        Err(_) => return Outcome::Failed("response timed out".into()),
        Ok(Err(e)) if e.kind() == io::ErrorKind::ConnectionReset => return Outcome::Reset,
        Ok(Err(e)) => return Outcome::Failed(format!("read: {e}")),
        Ok(Ok(_)) => {}
    }
    let text = String::from_utf8_lossy(&response);
    match text
        .strip_prefix("HTTP/1.1 ")
        .and_then(|rest| rest.get(..3))
        .and_then(|code| code.parse().ok())
    {
        Some(status) => Outcome::Served(status),
        None => Outcome::Failed(format!("no status line in {text:?}")),
    }
}

fn assert_startup(mode: Mode, what: &str, seen: &[Probed; 2], proxy: &Proxy) {
    eprintln!("{mode:?} {what}: http {:?}\n  https {:?}", seen[0], seen[1]);
    for (name, probed) in ["http", "https"].iter().zip(seen) {
        assert!(
            probed.wrong.is_empty(),
            "{what}, {name}: answered before the configuration was loaded: {:?}; logs:\n{}",
            probed.wrong,
            proxy.logs()
        );
        assert!(probed.served > 0, "{what}, {name}: never served");
    }
}

/// 3,000 Ingresses from manifests: from the moment the process starts, a served host is either
/// not answered at all (the ports are closed) or answered right, over HTTP and HTTPS.
async fn nothing_is_answered_before_the_manifests_are_loaded(mode: Mode) {
    let Some(site) = Site::new(&format!("startup-{}", mode.flag()), &[KNOWN]) else {
        return;
    };
    let mut many = String::new();
    for i in 0..3000 {
        many += &ingress_tests::manifests::ingress(
            "t",
            &format!("filler-{i}"),
            &[(&format!("h{i}.filler.test"), "/", "Prefix", "web")],
        );
    }
    std::fs::write(site.manifests().join("many.yaml"), many).expect("write manifests");
    let proxy = site.spawn(&[], &site.args(mode.flag(), MAIN, &[]), MAIN);
    let seen = probe_from_start(&site, KNOWN, 20, Duration::from_secs(60)).await;
    assert_startup(mode, "3,000 Ingresses from manifests", &seen, &proxy);
}

#[tokio::test]
async fn nothing_is_answered_before_the_manifests_are_loaded_ebpf() {
    nothing_is_answered_before_the_manifests_are_loaded(Mode::Ebpf).await;
}

#[tokio::test]
async fn nothing_is_answered_before_the_manifests_are_loaded_userspace() {
    nothing_is_answered_before_the_manifests_are_loaded(Mode::Userspace).await;
}

/// The Kubernetes source at the kube benchmark's scale (10,000 Ingresses, 10,000 Services,
/// 20,000 EndpointSlices, and the site's own objects): the same from process start.
async fn nothing_is_answered_before_the_cluster_is_synced(mode: Mode) {
    use ingress_tests::apiserver::{ServerOptions, TestApiServer};
    let Some(site) = Site::new(&format!("startup-kube-{}", mode.flag()), &[KNOWN]) else {
        return;
    };
    // The API server lives in the server namespace (this thread's), on its loopback.
    let api = TestApiServer::start_with(ServerOptions::default())
        .await
        .expect("test API server");
    let mut objects = vec![
        serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "t"}}),
        serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "bench"}}),
        serde_json::json!({"apiVersion": "networking.k8s.io/v1", "kind": "IngressClass", "metadata": {"name": "ingress"}, "spec": {"controller": "ingress.rs/controller"}}),
    ];
    let site_yaml =
        std::fs::read_to_string(site.manifests().join("site.yaml")).expect("site manifests");
    for document in serde_yaml_ng::Deserializer::from_str(&site_yaml) {
        let value = serde_json::Value::deserialize(document).expect("a manifest");
        if !value.is_null() {
            objects.push(value);
        }
    }
    for i in 0..10_000 {
        objects.push(serde_json::json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": format!("svc-{i}"), "namespace": "bench"}, "spec": {"ports": [{"name": "http", "port": 80}]}}));
        for k in 0..2 {
            objects.push(serde_json::json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "metadata": {"name": format!("svc-{i}-{k}"), "namespace": "bench", "labels": {"kubernetes.io/service-name": format!("svc-{i}")}}, "addressType": "IPv4", "ports": [{"name": "http", "port": 8080}], "endpoints": [{"addresses": [format!("10.{}.{}.{}", (i >> 8) & 255, i & 255, k + 1)], "conditions": {"ready": true}}]}));
        }
        objects.push(serde_json::json!({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress", "metadata": {"name": format!("ing-{i}"), "namespace": "bench"}, "spec": {"ingressClassName": "ingress", "rules": [{"host": format!("h{i}.bench.test"), "http": {"paths": [{"path": "/", "pathType": "Prefix", "backend": {"service": {"name": format!("svc-{i}"), "port": {"number": 80}}}}]}}]}}));
    }
    let stored = api.store().seed(objects).expect("seed the cluster");
    assert!(stored > 40_000, "{stored}");
    let kubeconfig = site.dir.path().join("kubeconfig");
    api.write_kubeconfig(&kubeconfig).expect("kubeconfig");
    let mut args = site.args(mode.flag(), MAIN, &[]);
    let at = args
        .iter()
        .position(|a| a == "--manifests")
        .expect("--manifests");
    args[at] = "--kubeconfig".into();
    args[at + 1] = kubeconfig.display().to_string();
    // The backend runs on this host, which the Kubernetes source refuses unless told.
    args.push("--allow-local-backends".into());
    args.push("true".into());
    let proxy = site.spawn(&[], &args, MAIN);
    let seen = probe_from_start(&site, KNOWN, 20, Duration::from_secs(120)).await;
    assert_startup(
        mode,
        "the Kubernetes source with 40,000 objects",
        &seen,
        &proxy,
    );
    drop(proxy);
    api.stop().await;
}

#[tokio::test]
async fn nothing_is_answered_before_the_cluster_is_synced_ebpf() {
    nothing_is_answered_before_the_cluster_is_synced(Mode::Ebpf).await;
}

#[tokio::test]
async fn nothing_is_answered_before_the_cluster_is_synced_userspace() {
    nothing_is_answered_before_the_cluster_is_synced(Mode::Userspace).await;
}

// ---------------------------------------------------------------------------------------------
// Restarts and the kernel state left behind

fn bpftool(args: &[&str]) -> serde_json::Value {
    // A listing walks object ids and then opens each one; an object of a parallel test that goes
    // away in between fails the whole listing, so try again a few times.
    let mut attempt = 0;
    let out = loop {
        let out = Command::new("bpftool")
            .arg("--json")
            .args(args)
            .output()
            .expect("run bpftool");
        attempt += 1;
        if out.status.success() || attempt == 5 {
            break out;
        }
        #[expect(
            clippy::disallowed_methods,
            reason = "a synchronous helper; 50 ms on a listing that just failed"
        )]
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(
        out.status.success(),
        "bpftool {args:?}: {}{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    serde_json::from_slice(&out.stdout).expect("bpftool json")
}

/// The names in a pinned HOSTS map.
fn host_names(pins: &Path) -> BTreeSet<String> {
    let hosts = pins.join("hosts");
    bpftool(&["map", "dump", "pinned", hosts.to_str().expect("utf-8 path")])
        .as_array()
        .expect("a dump")
        .iter()
        // With --json, bpftool gives the raw bytes as "key" and the BTF view as "formatted".
        .map(|entry| {
            entry["formatted"]["key"]["name"]
                .as_str()
                .unwrap_or_else(|| panic!("no readable name in {entry}"))
                .to_string()
        })
        .collect()
}

/// The pins the policy and counters live in: kept across restarts. Every other pin belongs to
/// one run.
const KEPT_PINS: [&str; 3] = ["config", "counters", "hosts"];

/// Ids of the maps pinned under `pins`, by pin name.
fn pinned_maps(pins: &Path) -> BTreeMap<String, u64> {
    std::fs::read_dir(pins)
        .expect("pin dir")
        .map(|entry| {
            entry
                .expect("pin")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .map(|name| {
            let pin = pins.join(&name);
            let info = bpftool(&["map", "show", "pinned", pin.to_str().expect("utf-8 path")]);
            (name, info["id"].as_u64().expect("map id"))
        })
        .collect()
}

/// Loaded programs using any of `maps`: (id, name).
fn programs_using(maps: &BTreeSet<u64>) -> Vec<(u64, String)> {
    bpftool(&["prog", "show"])
        .as_array()
        .expect("programs")
        .iter()
        .filter(|p| {
            p["map_ids"].as_array().is_some_and(|ids| {
                ids.iter()
                    .any(|id| id.as_u64().is_some_and(|id| maps.contains(&id)))
            })
        })
        .map(|p| {
            (
                p["id"].as_u64().expect("prog id"),
                p["name"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

/// TCX links by program id, counted. bpftool 7.1 (Debian's) names the type only by number (11,
/// BPF_LINK_TYPE_TCX) and shows no device; newer ones say "tcx".
fn tc_attached() -> BTreeMap<u64, usize> {
    let mut found = BTreeMap::<u64, usize>::new();
    for link in bpftool(&["link", "show"]).as_array().expect("links") {
        let tcx = link["type"] == "tcx" || link["type"] == 11;
        if let (true, Some(id)) = (tcx, link["prog_id"].as_u64()) {
            *found.entry(id).or_default() += 1;
        }
    }
    found
}

/// Every program id attached to some cgroup.
fn cgroup_attached() -> BTreeSet<u64> {
    bpftool(&["cgroup", "tree"])
        .as_array()
        .expect("cgroups")
        .iter()
        .flat_map(|cg| cg["programs"].as_array().cloned().unwrap_or_default())
        .filter_map(|p| p["id"].as_u64())
        .collect()
}

fn map_exists(id: u64) -> bool {
    Command::new("bpftool")
        .args(["map", "show", "id", &id.to_string()])
        .output()
        .expect("bpftool")
        .status
        .success()
}

/// Known names served and unknown ones reset, `n` of each, a few at a time.
async fn some_load(site: &Site, proxy: &Proxy, n: usize) {
    for i in 0..n {
        let unknown = format!("nobody-{i}.test");
        let (served, reset) = tokio::join!(
            site.https_get(MAIN.https, Some(KNOWN), KNOWN),
            site.https_get(MAIN.https, Some(&unknown), KNOWN)
        );
        assert_eq!(
            served,
            Outcome::Served(200),
            "#{i}; logs:\n{}",
            proxy.logs()
        );
        assert_eq!(reset, Outcome::Reset, "#{i}; logs:\n{}", proxy.logs());
    }
}

#[tokio::test]
async fn load_then_restart_on_the_same_pins_then_load_again() {
    let Some(site) = Site::new("restart", &[KNOWN]) else {
        return;
    };
    let pins = site.pins.0.clone();
    let mut first = site.start(Mode::Ebpf, &[]).await;
    some_load(&site, &first, 30).await;
    let counted = scrape_until(&first, "30 passes", |s| s.kernel("pass") >= 30.0).await;
    let maps = pinned_maps(&pins);
    for pin in KEPT_PINS.iter().chain(&["socks", "verdicts"]) {
        assert!(maps.contains_key(*pin), "{pin} is not pinned: {maps:?}");
    }
    let ids: BTreeSet<u64> = maps.values().copied().collect();
    let programs = programs_using(&ids);
    let names: BTreeSet<&str> = programs.iter().map(|(_, n)| n.as_str()).collect();
    for program in [
        "gate_probe",
        "gate_parser",
        "gate_verdict",
        "gate_sock_ops",
        "gate_early",
    ] {
        assert!(
            names.contains(program),
            "{program} is not loaded: {programs:?}"
        );
    }
    let sock_ops = programs
        .iter()
        .find(|(_, n)| n == "gate_sock_ops")
        .map(|(id, _)| *id)
        .expect("sock_ops");
    assert!(
        cgroup_attached().contains(&sock_ops),
        "sock_ops is attached"
    );
    let early = programs
        .iter()
        .find(|(_, n)| n == "gate_early")
        .map(|(id, _)| *id)
        .expect("gate_early");
    // Both of the server namespace's interfaces: its loopback and its end of the veth.
    assert_eq!(tc_attached().get(&early), Some(&2), "gate_early links");
    assert!(
        first.logs().contains("early_reset=[\"lo\", "),
        "{}",
        first.logs()
    );

    // SIGTERM: a clean exit detaches everything and unpins only the per-socket maps.
    first.signal(libc::SIGTERM);
    let status = first.wait_exit(Duration::from_secs(40)).await;
    assert!(status.success(), "{status}; logs:\n{}", first.logs());
    assert!(
        first.logs().contains("kernel gate detached"),
        "{}",
        first.logs()
    );
    assert_eq!(
        programs_using(&ids),
        vec![],
        "programs outlived the process that loaded them"
    );
    assert!(
        !cgroup_attached().contains(&sock_ops),
        "sock_ops still attached"
    );
    assert!(
        !tc_attached().contains_key(&early),
        "gate_early still attached"
    );
    let left = pinned_maps(&pins);
    assert_eq!(
        left.keys().map(String::as_str).collect::<Vec<_>>(),
        KEPT_PINS,
        "only the policy and the counters stay pinned"
    );
    // A program's maps are released after an RCU grace period and a workqueue run, once the
    // program itself is already gone from the listing: give the kernel a bounded moment.
    for (pin, id) in &maps {
        if !KEPT_PINS.contains(&pin.as_str()) {
            let released = Instant::now();
            while map_exists(*id) && released.elapsed() < Duration::from_secs(5) {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            assert!(!map_exists(*id), "{pin} (map {id}) outlived its run by 5 s");
        }
    }
    assert_eq!(host_names(&pins), BTreeSet::from([KNOWN.to_string()]));

    // Start again on the same pins: the policy maps and counters are reused.
    let second = site.start(Mode::Ebpf, &[]).await;
    let reused = pinned_maps(&pins);
    for pin in KEPT_PINS {
        assert_eq!(reused[pin], maps[pin], "{pin} was replaced, not reused");
    }
    assert!(
        !second.logs().contains("replacing a pinned map"),
        "{}",
        second.logs()
    );
    some_load(&site, &second, 30).await;
    let last = scrape_until(&second, "60 passes", |s| s.kernel("pass") >= 60.0).await;
    assert!(
        last.kernel("pass") >= counted.kernel("pass") + 30.0,
        "counters survive"
    );
    assert!(last.kernel("unknown") >= counted.kernel("unknown") + 30.0);
    drop(second);
}

/// An interface that appears after startup (a pod's veth on a node) gets the early reset at the
/// next rescan, and one that goes away is forgotten.
#[tokio::test]
async fn interfaces_that_come_and_go_are_followed() {
    let Some(site) = Site::new("rescan", &[KNOWN]) else {
        return;
    };
    let proxy = site.start(Mode::Ebpf, &[]).await;
    // Which interfaces the proxy logged as newly attached, or as detached.
    let changed = |which: &str| -> Vec<String> {
        proxy
            .logs()
            .lines()
            .filter(|l| l.contains("early reset (TC ingress) interfaces changed"))
            .filter_map(|l| {
                let (attached, detached) = l.split_once(" detached=")?;
                Some(
                    if which == "attached" {
                        attached
                    } else {
                        detached
                    }
                    .to_string(),
                )
            })
            .collect()
    };
    let mentions = |lines: &[String], name: &str| lines.iter().any(|l| l.contains(name));
    assert!(!mentions(&changed("attached"), "ingtest0"));
    site.pair
        .server
        .ip(&[
            "link", "add", "ingtest0", "type", "veth", "peer", "name", "ingtest1",
        ])
        .expect("add a veth pair");
    let deadline = Instant::now() + Duration::from_secs(15);
    while !mentions(&changed("attached"), "ingtest0") {
        assert!(
            Instant::now() < deadline,
            "never attached:\n{}",
            proxy.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    site.pair
        .server
        .ip(&["link", "del", "ingtest0"])
        .expect("delete the veth pair");
    while !mentions(&changed("detached"), "ingtest0") {
        assert!(
            Instant::now() < deadline,
            "never forgotten:\n{}",
            proxy.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(site.curl(KNOWN).await, Ok(200));
}

#[tokio::test]
async fn a_killed_proxy_leaves_no_gate_attached_and_a_restart_replaces_its_remains() {
    let Some(site) = Site::new("killed", &[KNOWN]) else {
        return;
    };
    let pins = site.pins.0.clone();
    let mut first = site.start(Mode::Ebpf, &[]).await;
    some_load(&site, &first, 5).await;
    let maps = pinned_maps(&pins);
    let ids: BTreeSet<u64> = maps.values().copied().collect();
    let programs = programs_using(&ids);
    let find = |name: &str| {
        programs
            .iter()
            .find(|(_, n)| n == name)
            .map(|(id, _)| *id)
            .unwrap_or_else(|| panic!("{name} is not loaded: {programs:?}"))
    };
    let (sock_ops, early) = (find("gate_sock_ops"), find("gate_early"));
    assert!(tc_attached().contains_key(&early), "gate_early is attached");

    first.signal(libc::SIGKILL);
    first.wait_exit(STEP).await;
    // The cgroup and TCX links died with the process, so nothing gates any more; the
    // per-socket pins (and the stream programs attached to SOCKS) remain until the next start
    // replaces them.
    assert!(
        !cgroup_attached().contains(&sock_ops),
        "sock_ops outlived a SIGKILL"
    );
    assert!(
        !tc_attached().contains_key(&early),
        "gate_early outlived a SIGKILL"
    );
    assert!(pins.join("socks").exists() && pins.join("verdicts").exists());

    let second = site.start(Mode::Ebpf, &[]).await;
    let logs = second.logs();
    for pin in ["socks", "verdicts"] {
        assert!(
            logs.contains(&format!(
                "replacing a pinned map path={}",
                pins.join(pin).display()
            )),
            "{pin} not replaced:\n{logs}"
        );
    }
    assert!(!map_exists(maps["socks"]), "the old SOCKS is gone");
    let left: Vec<String> = programs_using(&BTreeSet::from([maps["socks"], maps["verdicts"]]))
        .into_iter()
        .map(|(_, n)| n)
        .collect();
    assert!(
        left.is_empty(),
        "programs of the killed run remain: {left:?}"
    );
    some_load(&site, &second, 5).await;
}

/// Two processes on one pin directory: the second does not load the gate (`--mode ebpf` fails
/// naming the first's pid; `--mode auto` falls back with one log line), and when it exits the
/// first's pins, policy and gate are exactly as they were.
#[tokio::test]
async fn a_second_instance_on_the_same_pins_is_refused_and_harms_nothing() {
    let Some(site) = Site::new("shared-pins", &[KNOWN]) else {
        return;
    };
    let pins = site.pins.0.clone();
    let first = site.start(Mode::Ebpf, &[]).await;
    let maps = pinned_maps(&pins);
    let hosts = host_names(&pins);
    let owner = format!("is in use by another ingress process (pid {})", first.pid());

    let mut second = site.spawn(&[], &site.args("ebpf", SECOND, &[]), SECOND);
    let status = second.wait_exit(Duration::from_secs(20)).await;
    let logs = second.logs();
    assert!(!status.success(), "a second owner started:\n{logs}");
    assert!(
        logs.contains("--mode ebpf: the kernel gate did not load") && logs.contains(&owner),
        "the reason is missing:\n{logs}"
    );

    let third = site.spawn(&[], &site.args("auto", SECOND, &[]), SECOND);
    third.wait_ready().await;
    let logs = third.logs();
    let lines = fallback_lines(&logs);
    assert_eq!(lines.len(), 1, "{logs}");
    assert!(lines[0].contains(&owner), "{}", lines[0]);
    assert_eq!(third.scrape().value("ingress_ebpf_enabled", &[]), 0.0);
    assert_eq!(site.curl_port(KNOWN, SECOND.https).await, Ok(200));
    drop(third);

    assert_eq!(
        pinned_maps(&pins),
        maps,
        "the first instance's pins changed"
    );
    assert_eq!(host_names(&pins), hosts);
    let before = first.scrape();
    assert_eq!(site.curl(KNOWN).await, Ok(200));
    assert_fast_reset(
        &site
            .send(MAIN.https, &[&corpus("curl-tls13.bin")], Duration::ZERO)
            .await,
        "the first instance still refuses unknown names",
    );
    let after = scrape_until(&first, "one unknown", |s| {
        s.kernel("unknown") > before.kernel("unknown")
    })
    .await;
    assert_eq!(
        after.kernel("reset_before_accept_unknown") - before.kernel("reset_before_accept_unknown"),
        1.0,
        "{}",
        after.0
    );
}

/// A restart reuses the pinned HOSTS as they are: nothing is written to them until a snapshot
/// from synced sources is published, and then only what changed.
#[tokio::test]
async fn a_restart_never_empties_the_pinned_hosts() {
    let Some(site) = Site::new("restart-hosts", &[KNOWN, "stay.test"]) else {
        return;
    };
    let pins = site.pins.0.clone();
    let mut first = site.start(Mode::Ebpf, &[]).await;
    first.signal(libc::SIGTERM);
    assert!(first.wait_exit(Duration::from_secs(40)).await.success());
    let hosts = host_names(&pins);
    assert_eq!(
        hosts,
        BTreeSet::from([KNOWN.to_string(), "stay.test".to_string()])
    );
    let id = pinned_maps(&pins)["hosts"];

    let mut args = site.args("ebpf", MAIN, &[]);
    let level = args
        .iter()
        .position(|a| a == "--log-level")
        .expect("--log-level");
    args[level + 1] = "info,ingress::gate=debug".into();
    let second = site.spawn(&[], &args, MAIN);
    second.wait_ready().await;
    let logs = second.logs();
    let removals: Vec<&str> = logs
        .lines()
        .filter(|l| l.contains("kernel host policy synced") && !l.contains("removed=0"))
        .collect();
    assert!(
        removals.is_empty(),
        "names were removed from the pinned HOSTS at startup: {removals:?}"
    );
    assert_eq!(pinned_maps(&pins)["hosts"], id, "HOSTS was replaced");
    assert_eq!(host_names(&pins), hosts);
    assert_eq!(site.curl(KNOWN).await, Ok(200));
}

// ---------------------------------------------------------------------------------------------
// Modes that cannot load

#[tokio::test]
async fn ebpf_mode_fails_at_startup_with_the_reason() {
    let Some(site) = Site::new("fail", &[KNOWN]) else {
        return;
    };
    let not_bpffs = site.dir.path().join("not-bpffs");
    let cases: [(&[&str], &str); 3] = [
        (
            &["--bpf-cgroup", "/nonexistent/cgroup"],
            "opening cgroup /nonexistent/cgroup",
        ),
        (
            &["--gate-interfaces", "lo,nosuch0"],
            "early reset: nosuch0: absent, or neither Ethernet nor loopback",
        ),
        (
            &["--bpf-pin-dir", not_bpffs.to_str().unwrap()],
            "is not on a bpf filesystem",
        ),
    ];
    for (extra, reason) in cases {
        let mut args = site.args("ebpf", MAIN, &[]);
        // The later --bpf-pin-dir replaces the site's.
        if extra[0] == "--bpf-pin-dir" {
            let at = args.iter().position(|a| a == "--bpf-pin-dir").unwrap();
            args.drain(at..at + 2);
        }
        args.extend(extra.iter().map(|s| s.to_string()));
        let mut proxy = site.spawn(&[], &args, MAIN);
        let status = proxy.wait_exit(Duration::from_secs(20)).await;
        let logs = proxy.logs();
        assert!(!status.success(), "{extra:?} started:\n{logs}");
        assert!(
            logs.contains("error: --mode ebpf: the kernel gate did not load")
                && logs.contains(reason),
            "{extra:?}: the reason is missing:\n{logs}"
        );
        assert!(
            !logs.contains("listening"),
            "{extra:?} listened before failing:\n{logs}"
        );
    }
}

/// The policy holds in the fallback: known served, unknown reset fast, wildcard one label only.
async fn check_userspace_policy(site: &Site, proxy: &Proxy) {
    let scrape = proxy.scrape();
    assert_eq!(scrape.value("ingress_ebpf_enabled", &[]), 0.0);
    assert!(
        !scrape.has("ingress_ebpf_gate_total"),
        "kernel counters in userspace mode"
    );
    assert_eq!(
        site.https_get(MAIN.https, Some(KNOWN), KNOWN).await,
        Outcome::Served(200)
    );
    assert_eq!(
        site.https_get(MAIN.https, Some("a.wild.test"), KNOWN).await,
        Outcome::Served(200)
    );
    let ending = site
        .send(MAIN.https, &[&corpus("curl-tls13.bin")], Duration::ZERO)
        .await;
    assert_fast_reset(&ending, "fallback: unknown name");
    assert_eq!(
        site.https_get(MAIN.https, Some("b.a.wild.test"), KNOWN)
            .await,
        Outcome::Reset
    );
    let after = scrape_until(proxy, "four decisions", |s| {
        s.gate("pass") - scrape.gate("pass") >= 2.0
            && s.gate("unknown") - scrape.gate("unknown") >= 2.0
    })
    .await;
    assert_eq!(after.gate("pass") - scrape.gate("pass"), 2.0);
    assert_eq!(after.gate("unknown") - scrape.gate("unknown"), 2.0);
}

fn fallback_lines(logs: &str) -> Vec<&str> {
    logs.lines()
        .filter(|l| l.contains("falling back to userspace"))
        .collect()
}

#[tokio::test]
async fn auto_mode_falls_back_with_one_log_line_when_the_cgroup_is_wrong() {
    let Some(site) = Site::new("auto-cgroup", &[KNOWN, WILDCARD]) else {
        return;
    };
    let proxy = site
        .start_auto(&[], &["--bpf-cgroup", "/nonexistent/cgroup"])
        .await;
    let logs = proxy.logs();
    let lines = fallback_lines(&logs);
    assert_eq!(lines.len(), 1, "{logs}");
    assert!(
        lines[0].contains("/nonexistent/cgroup"),
        "the reason: {}",
        lines[0]
    );
    assert!(lines[0].contains("WARN"), "{}", lines[0]);
    check_userspace_policy(&site, &proxy).await;
    assert!(!site.pins.0.join("hosts").exists(), "nothing was pinned");
}

#[tokio::test]
async fn auto_mode_falls_back_with_one_log_line_without_privileges() {
    let Some(site) = Site::new("auto-nobody", &[KNOWN, WILDCARD]) else {
        return;
    };
    // Nobody, allowed only to bind :443 — no BPF, no pins.
    let wrapper = setpriv(Some(65534), &["net_bind_service"]);
    let proxy = site.start_auto(&wrapper, &[]).await;
    let logs = proxy.logs();
    let lines = fallback_lines(&logs);
    assert_eq!(lines.len(), 1, "{logs}");
    eprintln!("{}", lines[0]);
    check_userspace_policy(&site, &proxy).await;
}

impl Site {
    async fn start_auto(&self, wrapper: &[String], extra: &[&str]) -> Proxy {
        let proxy = self.spawn(wrapper, &self.args("auto", MAIN, extra), MAIN);
        proxy.wait_ready().await;
        proxy
    }
}

// ---------------------------------------------------------------------------------------------
// The DaemonSet's capabilities

/// `setpriv` arguments that run the binary with exactly `caps` (effective, permitted, inherited,
/// ambient and bounding), as `uid` or, for `None`, as root — which is what a container with
/// `capabilities: {drop: [ALL], add: caps}` and `USER 0` gets.
fn setpriv(uid: Option<u32>, caps: &[&str]) -> Vec<String> {
    let set = std::iter::once("-all".to_string())
        .chain(caps.iter().map(|c| format!("+{c}")))
        .collect::<Vec<_>>()
        .join(",");
    let mut args: Vec<String> = vec!["setpriv".into()];
    if let Some(uid) = uid {
        args.extend([
            "--reuid".into(),
            uid.to_string(),
            "--regid".into(),
            uid.to_string(),
            "--clear-groups".into(),
        ]);
    }
    args.extend([
        "--inh-caps".into(),
        set.clone(),
        "--ambient-caps".into(),
        set.clone(),
        "--bounding-set".into(),
        set,
    ]);
    args
}

/// Capability numbers from linux/capability.h.
fn cap_bit(name: &str) -> u64 {
    match name {
        "net_bind_service" => 1 << 10,
        "net_admin" => 1 << 12,
        "perfmon" => 1 << 38,
        "bpf" => 1 << 39,
        other => panic!("unexpected capability {other}"),
    }
}

/// The `capabilities.add` list of deploy/daemonset.yaml, lowercased.
fn daemonset_caps() -> Vec<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/daemonset.yaml");
    let yaml: serde_json::Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(&path).expect("daemonset.yaml"))
            .expect("daemonset yaml");
    let context = &yaml["spec"]["template"]["spec"]["containers"][0]["securityContext"];
    assert_eq!(context["privileged"], serde_json::Value::Bool(false));
    assert_eq!(context["capabilities"]["drop"], serde_json::json!(["ALL"]));
    context["capabilities"]["add"]
        .as_array()
        .expect("capabilities.add")
        .iter()
        .map(|c| c.as_str().expect("a name").to_ascii_lowercase())
        .collect()
}

fn status_caps(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let hex = status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .expect("capability line")
        .trim();
    u64::from_str_radix(hex, 16).expect("hex capabilities")
}

/// Gating works: a known name served, an unknown one reset, and the kernel counted both.
async fn check_kernel_gates(site: &Site, proxy: &Proxy) {
    let before = proxy.scrape();
    assert_eq!(
        before.value("ingress_ebpf_enabled", &[]),
        1.0,
        "{}",
        proxy.logs()
    );
    assert_eq!(
        site.https_get(MAIN.https, Some(KNOWN), KNOWN).await,
        Outcome::Served(200)
    );
    let ending = site
        .send(MAIN.https, &[&corpus("curl-tls13.bin")], Duration::ZERO)
        .await;
    assert_fast_reset(&ending, "unknown name");
    let after = scrape_until(proxy, "the kernel counted", |s| {
        s.kernel("pass") > before.kernel("pass") && s.kernel("unknown") > before.kernel("unknown")
    })
    .await;
    assert_eq!(after.handshakes() - before.handshakes(), 1.0);
}

#[tokio::test]
async fn the_daemonset_capabilities_are_exactly_what_ebpf_mode_needs() {
    let caps = daemonset_caps();
    assert_eq!(
        caps, DAEMONSET_CAPS,
        "deploy/daemonset.yaml changed; update this test"
    );
    let Some(site) = Site::new("caps", &[KNOWN]) else {
        return;
    };
    let want: u64 = DAEMONSET_CAPS.iter().map(|c| cap_bit(c)).sum();

    // As the container runs it: uid 0 with only these capabilities.
    let args = site.args("ebpf", MAIN, &[]);
    let proxy = site.spawn(&setpriv(None, &DAEMONSET_CAPS), &args, MAIN);
    proxy.wait_ready().await;
    assert_eq!(
        status_caps(proxy.pid(), "CapEff:"),
        want,
        "the emulation is exact"
    );
    assert_eq!(
        status_caps(proxy.pid(), "CapBnd:"),
        want,
        "the emulation is exact"
    );
    check_kernel_gates(&site, &proxy).await;
    drop(proxy);

    // As an unprivileged uid with the same capabilities, given a pin directory it owns.
    let _ = std::fs::remove_dir_all(&site.pins.0);
    std::fs::create_dir_all(&site.pins.0).expect("pin dir");
    let path = std::ffi::CString::new(site.pins.0.to_str().unwrap()).unwrap();
    // SAFETY: a valid path; chown has no other preconditions.
    assert_eq!(unsafe { libc::chown(path.as_ptr(), 65534, 65534) }, 0);
    let proxy = site.spawn(&setpriv(Some(65534), &DAEMONSET_CAPS), &args, MAIN);
    proxy.wait_ready().await;
    assert_eq!(status_caps(proxy.pid(), "CapEff:"), want);
    check_kernel_gates(&site, &proxy).await;
    drop(proxy);
    let _ = std::fs::remove_dir_all(&site.pins.0);

    // And none of them is superfluous: without any one, --mode ebpf fails at startup.
    for missing in DAEMONSET_CAPS {
        let fewer: Vec<&str> = DAEMONSET_CAPS
            .iter()
            .copied()
            .filter(|c| *c != missing)
            .collect();
        let mut proxy = site.spawn(&setpriv(None, &fewer), &args, MAIN);
        let status = proxy.wait_exit(Duration::from_secs(20)).await;
        let logs = proxy.logs();
        assert!(!status.success(), "started without {missing}:\n{logs}");
        let line = logs
            .lines()
            .find(|l| l.starts_with("error:"))
            .unwrap_or_default();
        eprintln!("without {missing}: {}", &line[..line.len().min(200)]);
        assert!(
            line.contains("Operation not permitted") || line.contains("Permission denied"),
            "without {missing}: {logs}"
        );
        let _ = std::fs::remove_dir_all(&site.pins.0);
    }
}

// ---------------------------------------------------------------------------------------------
// Parity: both modes, the same bytes, the same decisions

/// What the proxy did with one connection, as seen from outside.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    /// The `ingress_sni_gate_total` reason that moved (none: nothing was decided).
    reason: Vec<String>,
    /// Whether a TLS handshake was attempted.
    handshake: bool,
    /// How the client's connection ended: "reset" (fast), "slow reset", "answered", "closed".
    ending: &'static str,
    /// eBPF mode: the kernel counter that moved.
    kernel: Vec<String>,
}

async fn observe(site: &Site, proxy: &Proxy, bytes: &[u8]) -> Seen {
    let before = proxy.scrape();
    let ending = site.send(proxy.ports.https, &[bytes], Duration::ZERO).await;
    let ending = match ending {
        Ending::Reset(after) if after < Duration::from_millis(500) => "reset",
        Ending::Reset(_) => "slow reset",
        Ending::Answered(_) => "answered",
        Ending::Closed => "closed",
        Ending::Silent => "silent",
    };
    // The client has closed its end; give the proxy a moment to finish with the connection
    // (a decision, and for admitted ones the failed handshake that follows).
    let total = |s: &Scrape| REASONS.iter().map(|r| s.gate(r)).sum::<f64>();
    let deadline = Instant::now() + Duration::from_secs(3);
    let mut after = proxy.scrape();
    loop {
        let decided = total(&after) > total(&before);
        let admitted = after.handshakes() > before.handshakes();
        let dropped = decided && ending.contains("reset");
        if (decided && (admitted || dropped)) || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        after = proxy.scrape();
    }
    Seen {
        reason: moved(&before, &after, Scrape::gate),
        handshake: after.handshakes() > before.handshakes(),
        ending,
        kernel: moved(&before, &after, Scrape::kernel),
    }
}

/// The decision the userspace parser makes on `bytes` with `known` names: the reason label.
fn parser_reason(bytes: &[u8], known: &BTreeSet<String>) -> Option<&'static str> {
    match client_hello::peek(bytes) {
        client_hello::Peek::NeedMore(_) => None,
        client_hello::Peek::Done(hello) => Some(match client_hello::gate(&hello) {
            Ok(name) if known.contains(name.as_str()) => "pass",
            Ok(_) => "unknown",
            Err(client_hello::Reason::NoSni) => "no_sni",
            Err(client_hello::Reason::Malformed) => "malformed",
            Err(client_hello::Reason::NotTls) => "not_tls",
        }),
    }
}

#[tokio::test]
async fn every_corpus_hello_and_mutant_gets_the_same_decision_in_both_modes() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("data/clienthello");
    let mut inputs: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
        .expect("corpus dir")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".bin"))
        .map(|n| {
            let bytes = corpus(&n);
            (n, bytes)
        })
        .collect();
    inputs.sort();
    assert!(inputs.len() >= 20, "the corpus went missing");
    // Every name in the corpus but curl's is served, so both pass and unknown happen.
    let known: BTreeSet<String> = inputs
        .iter()
        .filter_map(|(_, b)| {
            client_hello::gate(&client_hello::parse(b))
                .ok()
                .map(|n| n.to_string())
        })
        .filter(|n| n != "curl.example.test")
        .collect();
    // Mutants, as a fuzzer finds them: a fixed xorshift so a failure names a reproducible case.
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let seeds: Vec<(String, Vec<u8>)> =
        ["curl-tls13.bin", "openssl-tls12-sni.bin", "chromium-2.bin"]
            .iter()
            .map(|f| (f.to_string(), corpus(f)))
            .collect();
    for (file, original) in &seeds {
        for case in 0..25 {
            let mut bytes = original.clone();
            for _ in 0..1 + next() % 3 {
                let at = usize::try_from(next()).unwrap() % bytes.len();
                bytes[at] = next().to_le_bytes()[0];
            }
            inputs.push((format!("{file} mutant #{case}"), bytes));
        }
    }
    for case in 0..10 {
        let len = 1 + usize::try_from(next() % 600).unwrap();
        let bytes: Vec<u8> = (0..len).map(|_| next().to_le_bytes()[0]).collect();
        inputs.push((format!("random #{case}"), bytes));
    }

    let hosts: Vec<&str> = known.iter().map(String::as_str).collect();
    let Some(site) = Site::new("parity", &hosts) else {
        return;
    };
    // Short timeouts, so a record that never completes ends the same way in both, quickly.
    let extra = ["--gate-timeout", "1s", "--tls-handshake-timeout", "1s"];
    let ebpf = site.start(Mode::Ebpf, &extra).await;
    let userspace = site.spawn(&[], &site.args("userspace", SECOND, &extra), SECOND);
    userspace.wait_ready().await;

    let mut differences = Vec::new();
    let mut decided = BTreeMap::<String, usize>::new();
    for (label, bytes) in &inputs {
        let kernel = observe(&site, &ebpf, bytes).await;
        let user = observe(&site, &userspace, bytes).await;
        eprintln!("{label:40} ebpf {kernel:?}\n{:40} user {user:?}", "");
        let want = parser_reason(bytes, &known);
        let same = kernel.reason == user.reason
            && kernel.handshake == user.handshake
            && kernel.ending == user.ending
            // The kernel's own counter agrees with what the proxy acted on.
            && kernel.kernel == kernel.reason
            && kernel.reason.iter().map(String::as_str).eq(want);
        if !same {
            differences.push(format!(
                "{label}: ebpf {kernel:?}, userspace {user:?}, parser {want:?}"
            ));
        }
        *decided.entry(kernel.reason.join(",")).or_default() += 1;
    }
    eprintln!("{} inputs by decision: {decided:?}", inputs.len());
    assert!(
        differences.is_empty(),
        "{} of {} differ:\n{}",
        differences.len(),
        inputs.len(),
        differences.join("\n")
    );
    for reason in ["pass", "unknown", "no_sni", "malformed", "not_tls"] {
        assert!(
            decided.contains_key(reason),
            "no input decided {reason}: {decided:?}"
        );
    }
}
