//! The site every kernel-gate test of the real proxy runs against: its own server and client
//! network namespaces joined by a veth link (MTU 1500, one MSS per packet), a backend, a
//! certificate from a test CA, manifests serving some host names, and the proxies started on
//! them in the server namespace on ports 80, 443 and 10254.
//!
//! ```text
//!   client ns 10.231.0.2                 veth               server ns 10.231.0.1
//!   curl, openssl s_client,  ───────────────────────────►  ingress :443 --mode ebpf|userspace
//!   rustls, raw bytes                                        └► test backend on 127.0.0.1
//!                                  the test thread lives here: admin :10254, bpftool, pins
//! ```

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use crate::manifests::service;
use crate::modes::Mode;
use crate::netns::{NetPair, SERVER_IP};
use crate::pins::PinDir;
use crate::pki::{Ca, Leaf, secret_yaml};
use crate::preflight::{Needs, preflight};
use crate::process::{Ingress, IngressBuilder, Ports};
use crate::scrape::Scrape;
use crate::scratch::Scratch;
use crate::tls_client::{Clients, Ending, Outcome, https_get, send_raw};
use crate::upstream::Backend;

/// The real ports inside the server namespace; each test has its own namespace, so they are
/// free.
pub const MAIN: Ports = Ports {
    http: 80,
    https: 443,
    admin: 10254,
};
/// A second proxy beside the first, for comparing the modes on identical input.
pub const SECOND: Ports = Ports {
    http: 8080,
    https: 8443,
    admin: 10255,
};
/// How long one client step may take.
pub const STEP: Duration = Duration::from_secs(5);
/// How long a proxy may take to become ready.
pub const READY: Duration = Duration::from_secs(30);
pub const KNOWN: &str = "known.test";
pub const WILDCARD: &str = "*.wild.test";
/// Every name the site's certificate covers; the tests serve subsets of them.
pub const CERT_NAMES: [&str; 6] = [
    KNOWN,
    WILDCARD,
    "stay.test",
    "new.test",
    "gone.test",
    "chromium.example.test",
];

/// Field order is drop order: the backend stops and the files go before the namespaces.
pub struct Site {
    pub backend: Backend,
    leaf: Leaf,
    ca_file: PathBuf,
    pub clients: Clients,
    pub dir: Scratch,
    pub pins: PinDir,
    pub pair: NetPair,
}

impl Site {
    /// Namespaces, backend and manifests serving `hosts`. `None` when skipping. The calling
    /// thread moves into the server namespace: the proxies it starts, the backend, the admin
    /// scrapes and bpftool all live there; clients are made in the client namespace.
    pub fn new(tag: &str, hosts: &[&str]) -> Option<Site> {
        if !preflight(Needs::KernelBinary) {
            return None;
        }
        // Guards first, so a failing step still removes the pins and the namespaces.
        let pins = PinDir::new(&format!("proxy-{tag}"));
        let pair = NetPair::create(tag).expect("create network namespaces");
        pair.server.enter().expect("enter the server namespace");
        let dir = Scratch::new(&format!("kernel-proxy-{tag}"));
        std::fs::create_dir_all(dir.path().join("manifests")).expect("manifests dir");
        let backend = Backend::start("web");
        let ca = Ca::new("kernel proxy test CA");
        let leaf = ca.server("site", &CERT_NAMES);
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

    pub fn manifests(&self) -> PathBuf {
        self.dir.path().join("manifests")
    }

    /// Replaces the Ingress (atomically, as a ConfigMap mount does) with one serving `hosts`.
    pub fn write_hosts(&self, hosts: &[&str]) {
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

    /// A proxy as every one here runs: on the site's manifests and pins, bound to every
    /// address on the main ports, in userspace mode until told otherwise.
    pub fn proxy(&self) -> IngressBuilder {
        Ingress::builder()
            .manifests(&self.manifests())
            .pin_dir(self.pins.path())
            .bind("0.0.0.0")
            .ports(MAIN)
            .args(["--access-log", "false"])
            .ready_within(READY)
    }

    /// Starts a proxy in `mode` on the main ports with `extra` flags and waits until it is ready.
    pub fn start(&self, mode: Mode, extra: &[&str]) -> Ingress {
        self.proxy().mode(mode).args(extra.iter().copied()).start()
    }

    /// A socket in the client namespace, connected to the server's `port`.
    pub async fn connect(&self, port: u16) -> TcpStream {
        self.pair.client.connect(server(port), STEP).await
    }

    pub async fn send(&self, port: u16, chunks: &[&[u8]], pause: Duration) -> Ending {
        send_raw(self.connect(port).await, chunks, pause).await
    }

    pub async fn https_get(&self, port: u16, sni: Option<&str>, host: &str) -> Outcome {
        https_get(self.connect(port).await, &self.clients, sni, host).await
    }

    /// `curl https://<name>/` verified against the test CA; the HTTP status, or `None` if
    /// curl failed (with its exit code).
    pub async fn curl(&self, name: &str) -> Result<u16, Option<i32>> {
        self.curl_port(name, MAIN.https).await
    }

    /// `curl` against the HTTPS listener on `port`.
    pub async fn curl_port(&self, name: &str, port: u16) -> Result<u16, Option<i32>> {
        self.curl_from(name, port, "/", None).await
    }

    /// `curl https://<name>:<port><path>`, from the client namespace's `source` address
    /// (`--interface`) when given, else its main one.
    pub async fn curl_from(
        &self,
        name: &str,
        port: u16,
        path: &str,
        source: Option<IpAddr>,
    ) -> Result<u16, Option<i32>> {
        self.curl_to(IpAddr::V4(SERVER_IP), name, port, path, source, &[])
            .await
    }

    /// As [`curl_from`](Self::curl_from), to the server's address `server` (IPv4 or IPv6) and
    /// with `extra` curl arguments (`--haproxy-protocol`, say): the status, or curl's exit code
    /// when it failed.
    pub async fn curl_to(
        &self,
        server: IpAddr,
        name: &str,
        port: u16,
        path: &str,
        source: Option<IpAddr>,
        extra: &[&str],
    ) -> Result<u16, Option<i32>> {
        let mut cmd = self.pair.client.command("curl");
        if let Some(source) = source {
            cmd.arg("--interface").arg(source.to_string());
        }
        let server = match server {
            IpAddr::V4(v4) => v4.to_string(),
            IpAddr::V6(v6) => format!("[{v6}]"),
        };
        let out = cmd
            .args([
                "-s",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code}",
                "--max-time",
                "5",
            ])
            .args(extra)
            .arg("--cacert")
            .arg(&self.ca_file)
            .arg("--resolve")
            .arg(format!("{name}:{port}:{server}"))
            .arg(format!("https://{name}:{port}{path}"))
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
    pub async fn openssl(&self, sni: Option<&str>, host: &str) -> String {
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

/// The server's `port`, as the client namespace reaches it.
pub fn server(port: u16) -> SocketAddr {
    SocketAddr::new(IpAddr::V4(SERVER_IP), port)
}

/// Polls `/metrics` until `done` holds (counters move a moment after a client sees the end).
pub async fn scrape_until(proxy: &Ingress, what: &str, done: impl Fn(&Scrape) -> bool) -> Scrape {
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

/// The lines in which a proxy in `--mode auto` said it fell back to userspace.
pub fn fallback_lines(logs: &str) -> Vec<&str> {
    logs.lines()
        .filter(|l| l.contains("falling back to userspace"))
        .collect()
}
