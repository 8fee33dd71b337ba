//! TLS passthrough through the real proxy: three network namespaces in a line, the real
//! `ingress` binary in the middle one, the backends (see [`backend`]) in the last, and clients
//! in the first.
//!
//! ```text
//!   client ns 10.241.0.2 ── veth ── 10.241.0.1  proxy ns  10.241.1.1 ── veth ── 10.241.1.2 backend ns
//!   rustls / openssl                     ingress :443                        TLS server :8443
//!   (trusts only the backend's CA)       the test thread lives here:         raw TCP :9000
//!                                        admin :10254, pins, /proc/<pid>
//! ```
//!
//! The proxy serves four hosts on :443: [`DB`] passed through to the TLS backend, [`RAW`] to the
//! plain TCP one, [`BLACKHOLE`] to an address nobody answers, and [`WWW`] terminated by the
//! proxy itself with a certificate from the site's own CA.

pub mod backend;
pub mod payload;
pub mod tap;

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use rustls::pki_types::ServerName;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

use crate::client::metric_value;
use crate::modes::Mode;
use crate::netns::NetChain;
use crate::pki::{Ca, Leaf, secret_yaml};
use crate::preflight::{Needs, preflight};
use crate::process::{Ingress, Ports};
use crate::scratch::Scratch;
use crate::upstream::Backend;
use backend::{RawBackend, TlsBackend};
use tap::Tap;

pub const BACKEND_PORT: u16 = 8443;
/// In the backend's subnet, answered by nobody: connects to it hang until they time out.
pub const NOBODY_IP: Ipv4Addr = Ipv4Addr::new(10, 241, 1, 77);
pub const HTTPS: u16 = 443;
pub const ADMIN: u16 = 10254;

/// The passthrough host; the backend's certificate names it.
pub const DB: &str = "db.passthrough.test";
/// A host the proxy terminates TLS for, on the same port.
pub const WWW: &str = "www.passthrough.test";
/// A passthrough host whose only endpoint never answers.
pub const BLACKHOLE: &str = "void.passthrough.test";
/// A passthrough host whose backend is plain TCP: it records every byte it receives.
pub const RAW: &str = "raw.passthrough.test";
pub const RAW_PORT: u16 = 9000;

/// How long one step (a connect, a handshake, a backend report) may take.
pub const STEP: Duration = Duration::from_secs(10);

/// Everything one test needs. Field order is drop order: the proxy dies first, the namespaces
/// go last.
pub struct Site {
    pub proxy: Ingress,
    pub backend: TlsBackend,
    pub raw_backend: RawBackend,
    pub http_backend: Option<Backend>,
    pub backend_ca: Ca,
    pub backend_ca_file: PathBuf,
    pub site_ca: Ca,
    pub dir: Scratch,
    pub mode: Mode,
    pub net: NetChain,
}

impl Drop for Site {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        // What the proxy and the proxy namespace's TCP stack counted, and what the proxy
        // logged, for the failure.
        let metrics = self.proxy.metrics();
        let counted = metrics.lines().filter(|l| {
            l.starts_with("ingress_ebpf_gate_total") || l.starts_with("ingress_passthrough")
        });
        eprintln!("---- proxy counters ----");
        for line in counted {
            eprintln!("{line}");
        }
        if let Ok(out) = Command::new("nstat").args(["-a"]).output() {
            eprintln!(
                "---- nstat -a ----\n{}",
                String::from_utf8_lossy(&out.stdout)
            );
        }
        eprintln!(
            "---- ingress log ----\n{}---- end of log ----",
            self.proxy.logs()
        );
    }
}

impl Site {
    /// Namespaces, the backends and the proxy in `mode` with `extra` flags. `None` when
    /// skipping. The calling thread moves into the proxy namespace.
    pub async fn start(tag: &str, mode: Mode, extra: &[&str]) -> Option<Site> {
        if !preflight(Needs::proxy(mode)) {
            return None;
        }
        let net = NetChain::create(tag).expect("create network namespaces");
        net.proxy.enter().expect("enter the proxy namespace");
        let backend_ca = Ca::new("passthrough backend CA");
        let backend_leaf = backend_ca.server(DB, &[DB]);
        let backend = TlsBackend::start(&net.backend, &backend_leaf);
        let raw_backend = RawBackend::start(&net.backend);
        let site_ca = Ca::new("passthrough site CA");
        let site_leaf = site_ca.server(WWW, &[WWW]);
        // A plain HTTP backend for the terminated host, on the proxy namespace's loopback.
        let http_backend = Backend::start("www");
        let dir = Scratch::new("passthrough-site");
        let backend_ca_file = dir.write("backend-ca.pem", &backend_ca.pem);
        dir.write("manifests/site.yaml", &manifests(&http_backend, &site_leaf));
        let proxy = Ingress::builder()
            .manifests(&dir.path().join("manifests"))
            .mode(mode)
            .bind("0.0.0.0")
            .ports(Ports {
                http: 80,
                https: HTTPS,
                admin: ADMIN,
            })
            .log_level("info,ingress::proxy::passthrough=debug,ingress::gate::splice=debug")
            .args(["--access-log", "false"])
            .args(extra.iter().copied())
            .ready_within(Duration::from_secs(60))
            .start();
        Some(Site {
            proxy,
            backend,
            raw_backend,
            http_backend: Some(http_backend),
            backend_ca,
            backend_ca_file,
            site_ca,
            dir,
            mode,
            net,
        })
    }

    /// A TCP connection from the client namespace to the proxy's HTTPS port.
    pub async fn tcp(&self) -> TcpStream {
        self.net
            .client
            .connect(SocketAddr::from((NetChain::PROXY_IP, HTTPS)), STEP)
            .await
    }

    /// A TLS session to `name` through the proxy, verified against the backend's CA only, over
    /// a tap that keeps the ciphertext (`tls.get_ref().0.log()`, for
    /// [`TlsBackend::next_from`]).
    pub async fn tls(&self, name: &str) -> TlsStream<Tap<TcpStream>> {
        let tcp = Tap::new(self.tcp().await);
        let connector = TlsConnector::from(self.backend_ca.client_config(&[]));
        let name = ServerName::try_from(name.to_string()).expect("server name");
        tokio::time::timeout(STEP, connector.connect(name, tcp))
            .await
            .expect("handshake in time")
            .expect("handshake with the backend's certificate")
    }

    /// A sample of the proxy's metrics; 0 when there is none.
    pub fn metric(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.proxy.metric(name, labels).unwrap_or(0.0)
    }

    /// A passthrough metric of this site's mode.
    pub fn passthrough_metric(&self, name: &str) -> f64 {
        self.metric(name, &[("mode", self.mode.label())])
    }

    /// Open file descriptors of the proxy, not counting admin-port sockets: the metrics
    /// scrapes that measure the baseline come and go on their own schedule.
    pub fn fds(&self) -> usize {
        self.proxy.open_fds(ADMIN)
    }

    /// Entries in the pinned splice maps (eBPF mode only).
    pub fn splice_entries(&self) -> Option<ingress::gate::PinnedSpliceEntries> {
        let pins = self.proxy.pin_dir.as_ref()?;
        Some(ingress::gate::pinned_entries(pins).expect("read the pinned splice maps"))
    }

    /// Waits until the proxy shows no open passthrough connection.
    pub async fn wait_idle(&self) {
        let deadline = Instant::now() + STEP;
        while self.passthrough_metric("ingress_passthrough_active") != 0.0 {
            assert!(
                Instant::now() < deadline,
                "passthrough connections stay open"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// In eBPF mode: the kernel moved bytes, and no connection fell back to userspace.
    pub fn assert_spliced(&self) {
        if self.mode != Mode::Ebpf {
            return;
        }
        let metrics = self.proxy.metrics();
        let redirected = metric_value(
            &metrics,
            "ingress_ebpf_gate_total",
            &[("counter", "splice_redirected")],
        );
        assert!(
            redirected.unwrap_or(0.0) > 0.0,
            "the kernel redirected nothing:\n{metrics}"
        );
        let fallbacks: f64 = metrics
            .lines()
            .filter(|l| l.starts_with("ingress_passthrough_fallbacks_total{"))
            .filter_map(|l| l.rsplit_once(' ').and_then(|(_, v)| v.parse::<f64>().ok()))
            .sum();
        assert_eq!(fallbacks, 0.0, "splices fell back to userspace:\n{metrics}");
    }
}

fn manifests(http_backend: &Backend, site_leaf: &Leaf) -> String {
    let slice = |name: &str, ip: Ipv4Addr, port: u16| {
        format!(
            "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: {name}-1, namespace: pt, labels: {{kubernetes.io/service-name: {name}}}}}\naddressType: IPv4\nports: [{{name: tls, port: {port}}}]\nendpoints: [{{addresses: [\"{ip}\"], conditions: {{ready: true}}}}]\n"
        )
    };
    let service = |name: &str| {
        format!(
            "---\napiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: pt}}\nspec: {{ports: [{{name: tls, port: 443}}]}}\n"
        )
    };
    let passthrough = |name: &str, host: &str, service: &str| {
        format!(
            "---\napiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata:\n  name: {name}\n  namespace: pt\n  annotations: {{nginx.ingress.kubernetes.io/ssl-passthrough: \"true\"}}\nspec:\n  ingressClassName: ingress\n  rules:\n  - host: {host}\n    http: {{paths: [{{path: /, pathType: Prefix, backend: {{service: {{name: {service}, port: {{number: 443}}}}}}}}]}}\n"
        )
    };
    let www_ip = match http_backend.addr.ip() {
        std::net::IpAddr::V4(ip) => ip,
        other => panic!("backend on {other}"),
    };
    let www = format!(
        "---\napiVersion: v1\nkind: Service\nmetadata: {{name: www, namespace: pt}}\nspec: {{ports: [{{name: tls, port: 80}}]}}\n{}{}---\napiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {{name: www, namespace: pt}}\nspec:\n  ingressClassName: ingress\n  tls: [{{hosts: [{WWW}], secretName: www-tls}}]\n  rules:\n  - host: {WWW}\n    http: {{paths: [{{path: /, pathType: Prefix, backend: {{service: {{name: www, port: {{number: 80}}}}}}}}]}}\n",
        slice("www", www_ip, http_backend.addr.port()),
        secret_yaml("pt", "www-tls", &site_leaf.chain, &site_leaf.key),
    );
    [
        service("db"),
        slice("db", NetChain::BACKEND_IP, BACKEND_PORT),
        passthrough("db", DB, "db"),
        service("void"),
        slice("void", NOBODY_IP, BACKEND_PORT),
        passthrough("void", BLACKHOLE, "void"),
        service("raw"),
        slice("raw", NetChain::BACKEND_IP, RAW_PORT),
        passthrough("raw", RAW, "raw"),
        www,
    ]
    .concat()
}
