//! The kernel SNI gate loaded from the library, without the proxy: a gate pinned in its own
//! directory, gating a server network namespace, and a small TLS-less server there that calls
//! the gate API for every accepted connection and reports what it saw. Clients (openssl, curl,
//! raw byte writers) run in the client namespace of a [`NetPair`].
//!
//! ```text
//!   client ns ── veth ──► server ns: Gate (pinned in PinDir) + serve/converse on :443
//!                                     └► Served { admission, record } to the test
//! ```

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ingress::client_hello;
use ingress::gate::{Action, Admission, Gate, GateError, GateOptions, KernelLog, KernelVerdict};
use ingress::snapshot::sni::SniPolicy;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

use crate::netns::{NetPair, SERVER_IP};
use crate::pins::PinDir;
use crate::preflight::{Needs, preflight, skip_or_fail};

pub const PORT: u16 = 443;
pub const STEP: Duration = Duration::from_secs(5);

/// What the test server saw for one connection.
#[derive(Debug)]
pub struct Served {
    pub admission: Admission,
    /// The bytes `take_first_record` returned, for passes (`converse`: the client's reply).
    pub record: Option<Vec<u8>>,
}

/// What a raw client saw after sending its bytes.
#[derive(Debug)]
pub enum Ending {
    Reset(Duration),
    Closed,
    Silent,
}

/// What the harness's server does with each connection.
#[derive(Clone, Copy)]
pub enum Server {
    /// Admits it, takes the first record, and reports both (`serve`).
    Report,
    /// Admits it, takes the first record, then talks as a TLS server would (`converse`).
    Converse,
}

pub struct GateServer {
    // Field order is drop order: the gate detaches before its namespaces go.
    pub gate: Arc<Gate>,
    pub served: mpsc::UnboundedReceiver<Served>,
    pub server: AbortOnDrop,
    pub pins: PinDir,
    pub pair: NetPair,
}

/// A task aborted when this drops.
pub struct AbortOnDrop(pub tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl GateServer {
    /// Namespaces, a gate with `policy`, and the reporting server. `None` when skipping.
    pub async fn start(tag: &str, policy: SniPolicy) -> Option<GateServer> {
        Self::start_in(tag, policy, PinDir::new(tag), KernelLog::Off).await
    }

    /// As [`start`](Self::start), pinned in `pins` and logging from the kernel as told.
    pub async fn start_in(
        tag: &str,
        policy: SniPolicy,
        pins: PinDir,
        kernel_log: KernelLog,
    ) -> Option<GateServer> {
        Self::start_serving(tag, policy, pins, kernel_log, Server::Report).await
    }

    pub async fn start_serving(
        tag: &str,
        policy: SniPolicy,
        pins: PinDir,
        kernel_log: KernelLog,
        kind: Server,
    ) -> Option<GateServer> {
        Self::start_with(tag, policy, pins, kernel_log, kind, false).await
    }

    /// As [`start`](Self::start), for a listener whose connections start with a PROXY
    /// protocol header (`GateOptions::proxy_protocol`).
    pub async fn start_behind_proxy_protocol(tag: &str, policy: SniPolicy) -> Option<GateServer> {
        Self::start_with(
            tag,
            policy,
            PinDir::new(tag),
            KernelLog::Off,
            Server::Report,
            true,
        )
        .await
    }

    async fn start_with(
        tag: &str,
        policy: SniPolicy,
        pins: PinDir,
        kernel_log: KernelLog,
        kind: Server,
        proxy_protocol: bool,
    ) -> Option<GateServer> {
        if !preflight(Needs::Kernel) {
            return None;
        }
        // Guards first (the pins came in as one), so a failing load still removes the pins
        // and the namespaces.
        let pair = NetPair::create(tag).expect("create network namespaces");
        // This test's thread (and its current-thread runtime) now lives in the server namespace:
        // the listener is created here, and the gate gates this namespace only.
        pair.server.enter().expect("enter the server namespace");
        let gate = match load_with(pins.path(), policy, kernel_log, proxy_protocol) {
            Ok(gate) => gate,
            Err(GateError::NotEmbedded) => {
                skip_or_fail(
                    "this build carries no eBPF object (run `cargo xtask build-ebpf` first)",
                );
                return None;
            }
            Err(e) => panic!("the gate should load as root with BTF: {e}"),
        };
        let gate = Arc::new(gate);
        let listener = TcpListener::bind((SERVER_IP, PORT))
            .await
            .expect("bind the HTTPS port");
        register(&gate, &listener);
        let (tx, served) = mpsc::unbounded_channel();
        let server = AbortOnDrop(match kind {
            Server::Report => tokio::spawn(serve(listener, gate.clone(), tx)),
            Server::Converse => tokio::spawn(converse(listener, gate.clone(), tx)),
        });
        Some(GateServer {
            gate,
            served,
            server,
            pins,
            pair,
        })
    }

    /// Connects from the client namespace, writes `chunks` with `pause` between them, and
    /// reports how the connection ended after the last write.
    pub async fn send(&self, chunks: &[&[u8]], pause: Duration) -> Ending {
        let mut stream = self
            .pair
            .client
            .connect(SocketAddr::from((SERVER_IP, PORT)), STEP)
            .await;
        for (i, chunk) in chunks.iter().enumerate() {
            if i > 0 {
                tokio::time::sleep(pause).await;
            }
            stream.write_all(chunk).await.expect("write");
        }
        let sent = Instant::now();
        let mut buf = [0u8; 1024];
        loop {
            match tokio::time::timeout(STEP, stream.read(&mut buf)).await {
                Err(_) => return Ending::Silent,
                Ok(Ok(0)) => return Ending::Closed,
                Ok(Ok(_)) => continue,
                Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionReset => {
                    return Ending::Reset(sent.elapsed());
                }
                Ok(Err(e)) => panic!("client read: {e}"),
            }
        }
    }

    /// What the server saw for the next connection.
    pub async fn next(&mut self) -> Served {
        tokio::time::timeout(STEP, self.served.recv())
            .await
            .expect("the server saw no connection in time")
            .expect("the server stopped")
    }

    /// Runs a client in the client namespace and returns what the server saw.
    pub async fn run_client(&mut self, program: &str, args: &[&str]) -> Served {
        let mut child = self
            .pair
            .client
            .command(program)
            .args(args)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("{program}: {e}"));
        let served = self.next().await;
        let _ = tokio::time::timeout(STEP, child.wait()).await;
        served
    }
}

/// Tells the gate this listener is the one it judges for.
pub fn register(gate: &Gate, listener: &TcpListener) {
    use std::os::fd::AsFd;
    gate.register_listener(listener.as_fd())
        .expect("register the listener");
}

/// Loads a gate for [`PORT`] pinned in `pins`.
pub fn load(pins: &Path, policy: SniPolicy, kernel_log: KernelLog) -> Result<Gate, GateError> {
    load_with(pins, policy, kernel_log, false)
}

/// As [`load`], expecting a PROXY protocol header in front of every ClientHello when told.
pub fn load_with(
    pins: &Path,
    policy: SniPolicy,
    kernel_log: KernelLog,
    proxy_protocol: bool,
) -> Result<Gate, GateError> {
    Gate::load(GateOptions {
        proxy_protocol,
        pin_dir: pins.to_path_buf(),
        https_ports: vec![PORT],
        // The policy carries the expectation once synced, as a snapshot's does.
        policy: Some(SniPolicy {
            proxy_protocol,
            ..policy
        }),
        verdict_timeout: Duration::from_secs(3),
        // Explicit, not from tracing: tests run on parallel threads, and tracing caches
        // per-callsite interest across them.
        kernel_log,
        ..GateOptions::default()
    })
}

/// The test server: the accept loop a proxy runs in eBPF mode, minus TLS.
pub async fn serve(listener: TcpListener, gate: Arc<Gate>, tx: mpsc::UnboundedSender<Served>) {
    loop {
        let Ok((mut stream, _)) = listener.accept().await else {
            return;
        };
        let gate = gate.clone();
        let tx = tx.clone();
        tokio::spawn(async move {
            let admission = gate.admit(&stream).await.expect("admit");
            let record = match admission {
                Admission::Drop(_) => {
                    gate.reject(stream).expect("reject");
                    None
                }
                Admission::Pass(verdict)
                | Admission::Passthrough(verdict)
                | Admission::Deferred(verdict) => Some(
                    gate.take_first_record(&mut stream, &verdict)
                        .await
                        .expect("take the first record"),
                ),
                Admission::Ungated | Admission::Timeout => None,
            };
            let _ = tx.send(Served { admission, record });
        });
    }
}

/// After taking the first record, answers at once and waits for the client's next bytes, as a
/// TLS server sends its ServerHello and waits for the client's Finished; reports whether they
/// came (a `Served` with the admission and `Some(b"ping")`, or `None` after 3 s).
pub async fn converse(listener: TcpListener, gate: Arc<Gate>, tx: mpsc::UnboundedSender<Served>) {
    loop {
        let Ok((mut stream, _)) = listener.accept().await else {
            return;
        };
        let gate = gate.clone();
        let tx = tx.clone();
        tokio::spawn(async move {
            let admission = gate.admit(&stream).await.expect("admit");
            let mut record = None;
            if let Admission::Pass(verdict) = admission
                && gate.take_first_record(&mut stream, &verdict).await.is_ok()
                && stream.write_all(b"hello").await.is_ok()
            {
                let mut ping = [0u8; 4];
                let read =
                    tokio::time::timeout(Duration::from_secs(3), stream.read_exact(&mut ping));
                if let Ok(Ok(_)) = read.await {
                    let _ = stream.write_all(b"pong").await;
                    record = Some(ping.to_vec());
                }
            }
            let _ = tx.send(Served { admission, record });
        });
    }
}

/// The gate, once the server's connection tasks (which may hold it for a moment) let go.
pub async fn wait_for_sole_owner(mut gate: Arc<Gate>) -> Gate {
    for _ in 0..100 {
        match Arc::try_unwrap(gate) {
            Ok(gate) => return gate,
            Err(shared) => gate = shared,
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the gate is still shared after a second");
}

/// The verdict of a pass, or a panic naming what it was instead.
pub fn passed(served: &Served) -> KernelVerdict {
    match served.admission {
        Admission::Pass(v) => v,
        ref other => panic!("expected a pass, got {other:?}"),
    }
}

/// The verdict of a drop, or a panic naming what it was instead.
pub fn dropped(served: &Served) -> KernelVerdict {
    match served.admission {
        Admission::Drop(v) => v,
        ref other => panic!("expected a drop, got {other:?}"),
    }
}

/// The name the userspace parser reads from a record the gate handed over.
pub fn sni_of(record: &[u8]) -> Option<String> {
    let parsed = client_hello::parse(record);
    client_hello::gate(&parsed)
        .ok()
        .map(|name| name.to_string())
}

/// A policy passing exactly `names`.
pub fn policy(names: &[&str]) -> SniPolicy {
    // Every case without a name is left to userspace unless a test says otherwise.
    names
        .iter()
        .fold(ingress::gate::policy::admitting_unnamed(), |p, n| {
            p.with_host(n, Action::Pass)
        })
}
