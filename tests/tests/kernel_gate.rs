//! The kernel SNI gate end to end, as root: each test makes its own server and client network
//! namespaces joined by a veth link, loads a gate pinned in its own directory, runs a small
//! TLS-less server that calls the gate API for every accepted connection, and drives it with
//! openssl, curl and raw byte writers.
//!
//! Without root or kernel BTF, or in a build without the eBPF object, the tests print a loud
//! skip notice and pass — unless CI=true, where that is a failure.

// Setup helpers fail the test with a message, as the test bodies do.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ingress::client_hello;
use ingress::gate::{
    Admission, CaseAction, Gate, GateError, GateOptions, HostAction, HostPolicy, KernelLog, Reason,
    Verdict, counter,
};
use ingress_tests::netns::{NetPair, SERVER_IP};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

const PORT: u16 = 443;
const STEP: Duration = Duration::from_secs(5);

/// What the test server saw for one connection.
#[derive(Debug)]
struct Served {
    admission: Admission,
    /// The bytes `take_first_record` returned, for passes.
    record: Option<Vec<u8>>,
}

/// What a raw client saw after sending its bytes.
#[derive(Debug)]
enum Ending {
    Reset(Duration),
    Closed,
    Silent,
}

struct Harness {
    // Field order is drop order: the gate detaches before its namespaces go.
    gate: Arc<Gate>,
    served: mpsc::UnboundedReceiver<Served>,
    server: AbortOnDrop,
    pins: PinDir,
    pair: NetPair,
}

/// A per-test pin directory, removed on drop.
struct PinDir(PathBuf);

impl Drop for PinDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Skips (or, under CI=true, fails) when this machine cannot run kernel tests.
fn skip_or_fail(why: &str) {
    if ingress_tests::in_ci() {
        panic!("kernel gate test cannot run under CI=true: {why}");
    }
    eprintln!("\n**************** SKIPPED kernel gate test: {why} ****************\n");
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
    true
}

fn corpus(file: &str) -> Vec<u8> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("data/clienthello")
        .join(file);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn pin_dir(tag: &str) -> PathBuf {
    PathBuf::from(format!(
        "/sys/fs/bpf/ingress-test-{tag}-{}",
        std::process::id()
    ))
}

impl Harness {
    /// Namespaces, a gate with `policy`, and the test server. `None` when skipping.
    async fn start(tag: &str, policy: HostPolicy) -> Option<Harness> {
        Self::start_in(tag, policy, pin_dir(tag), KernelLog::Off).await
    }

    async fn start_in(
        tag: &str,
        policy: HostPolicy,
        pins: PathBuf,
        kernel_log: KernelLog,
    ) -> Option<Harness> {
        Self::start_serving(tag, policy, pins, kernel_log, Server::Report).await
    }

    async fn start_serving(
        tag: &str,
        policy: HostPolicy,
        pins: PathBuf,
        kernel_log: KernelLog,
        kind: Server,
    ) -> Option<Harness> {
        if !preflight() {
            return None;
        }
        // Guards first, so a failing load still removes the pins and the namespaces.
        let pins = PinDir(pins);
        let pair = NetPair::create(tag).expect("create network namespaces");
        // This test's thread (and its current-thread runtime) now lives in the server namespace:
        // the listener is created here, and the gate gates this namespace only.
        pair.server.enter().expect("enter the server namespace");
        let gate = match load(&pins.0, policy, kernel_log) {
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
        Some(Harness {
            gate,
            served,
            server,
            pins,
            pair,
        })
    }

    /// Connects from the client namespace, writes `chunks` with `pause` between them, and
    /// reports how the connection ended after the last write.
    async fn send(&self, chunks: &[&[u8]], pause: Duration) -> Ending {
        let socket = self
            .pair
            .client
            .run(tokio::net::TcpSocket::new_v4)
            .expect("client namespace thread")
            .expect("client socket");
        let mut stream = socket
            .connect(SocketAddr::from((SERVER_IP, PORT)))
            .await
            .expect("connect");
        stream.set_nodelay(true).expect("nodelay");
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

    async fn next(&mut self) -> Served {
        tokio::time::timeout(STEP, self.served.recv())
            .await
            .expect("the server saw no connection in time")
            .expect("the server stopped")
    }

    /// Runs a client in the client namespace and returns what the server saw.
    async fn run_client(&mut self, program: &str, args: &[&str]) -> Served {
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
fn register(gate: &Gate, listener: &TcpListener) {
    use std::os::fd::AsFd;
    gate.register_listener(listener.as_fd())
        .expect("register the listener");
}

fn load(pins: &Path, policy: HostPolicy, kernel_log: KernelLog) -> Result<Gate, GateError> {
    Gate::load(GateOptions {
        pin_dir: pins.to_path_buf(),
        https_ports: vec![PORT],
        policy: Some(policy),
        verdict_timeout: Duration::from_secs(3),
        // Explicit, not from tracing: tests run on parallel threads, and tracing caches
        // per-callsite interest across them.
        kernel_log,
        ..GateOptions::default()
    })
}

/// What the harness's server does with each connection.
#[derive(Clone, Copy)]
enum Server {
    /// Admits it, takes the first record, and reports both (`serve`).
    Report,
    /// Admits it, takes the first record, then talks as a TLS server would (`converse`).
    Converse,
}

/// The test server: the accept loop a proxy runs in eBPF mode, minus TLS.
async fn serve(listener: TcpListener, gate: Arc<Gate>, tx: mpsc::UnboundedSender<Served>) {
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

async fn wait_for_sole_owner(mut gate: Arc<Gate>) -> Gate {
    for _ in 0..100 {
        match Arc::try_unwrap(gate) {
            Ok(gate) => return gate,
            Err(shared) => gate = shared,
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the gate is still shared after a second");
}

fn passed(served: &Served) -> Verdict {
    match served.admission {
        Admission::Pass(v) => v,
        ref other => panic!("expected a pass, got {other:?}"),
    }
}

fn dropped(served: &Served) -> Verdict {
    match served.admission {
        Admission::Drop(v) => v,
        ref other => panic!("expected a drop, got {other:?}"),
    }
}

/// The name the userspace parser reads from a record the gate handed over.
fn sni_of(record: &[u8]) -> Option<String> {
    let parsed = client_hello::parse(record);
    client_hello::gate(&parsed)
        .ok()
        .map(|name| name.to_string())
}

fn policy(names: &[&str]) -> HostPolicy {
    names.iter().fold(HostPolicy::default(), |p, n| {
        p.with_host(n, HostAction::Pass)
    })
}

#[tokio::test]
async fn openssl_and_curl_with_a_known_name_pass() {
    let policy = policy(&["openssl.example.test", "curl.example.test"]);
    let Some(mut h) = Harness::start("known", policy).await else {
        return;
    };
    let target = format!("{SERVER_IP}:{PORT}");

    let served = h
        .run_client(
            "openssl",
            &[
                "s_client",
                "-connect",
                &target,
                "-servername",
                "openssl.example.test",
            ],
        )
        .await;
    let verdict = passed(&served);
    assert_eq!(verdict.reason, Reason::Pass);
    let record = served.record.expect("a record");
    assert_eq!(
        record.len(),
        verdict.record_len as usize,
        "exactly the first record"
    );
    assert_eq!(sni_of(&record).as_deref(), Some("openssl.example.test"));

    let resolve = format!("curl.example.test:{PORT}:{SERVER_IP}");
    let served = h
        .run_client(
            "curl",
            &[
                "-sk",
                "--max-time",
                "3",
                "--resolve",
                &resolve,
                "https://curl.example.test/",
            ],
        )
        .await;
    assert_eq!(passed(&served).reason, Reason::Pass);
    assert_eq!(
        sni_of(&served.record.expect("a record")).as_deref(),
        Some("curl.example.test")
    );
    assert!(h.gate.counters().expect("counters").get(counter::PASS) >= 2);
}

#[tokio::test]
async fn an_unknown_name_is_reset_within_50_ms_and_nothing_is_read() {
    let Some(mut h) = Harness::start("unknown", policy(&["other.example.test"])).await else {
        return;
    };
    let hello = corpus("curl-tls13.bin");
    let ending = h.send(&[&hello], Duration::ZERO).await;
    match ending {
        Ending::Reset(after) => {
            eprintln!("unknown name reset {after:?} after the ClientHello was written");
            assert!(after < Duration::from_millis(50), "reset took {after:?}");
        }
        other => panic!("expected a reset, got {other:?}"),
    }
    let served = h.next().await;
    assert_eq!(dropped(&served).reason, Reason::Unknown);
    assert!(served.record.is_none());

    let target = format!("{SERVER_IP}:{PORT}");
    let served = h
        .run_client(
            "openssl",
            &[
                "s_client",
                "-connect",
                &target,
                "-servername",
                "nobody.example.test",
            ],
        )
        .await;
    assert_eq!(dropped(&served).reason, Reason::Unknown);
    let counters = h.gate.counters().expect("counters");
    assert!(
        counters.get(counter::UNKNOWN) >= 2 && counters.get(counter::DROPPED) >= 2,
        "{counters:?}"
    );
}

#[tokio::test]
async fn a_wildcard_admits_one_label_and_no_more() {
    let Some(mut h) = Harness::start("wild", policy(&["*.wild.test"])).await else {
        return;
    };
    let target = format!("{SERVER_IP}:{PORT}");
    let cases = [
        ("a.wild.test", true),
        ("A.Wild.Test", true),
        ("b.a.wild.test", false),
        ("wild.test", false),
    ];
    for (name, admitted) in cases {
        let served = h
            .run_client(
                "openssl",
                &["s_client", "-connect", &target, "-servername", name],
            )
            .await;
        if admitted {
            assert_eq!(passed(&served).reason, Reason::Pass, "{name}");
        } else {
            assert_eq!(dropped(&served).reason, Reason::Unknown, "{name}");
        }
    }
}

#[tokio::test]
async fn a_client_hello_split_over_three_writes_is_still_classified() {
    let Some(mut h) = Harness::start("split", policy(&["curl.example.test"])).await else {
        return;
    };
    let hello = corpus("curl-tls13.bin");
    let (header, rest) = hello.split_at(5);
    let (middle, tail) = rest.split_at(rest.len() / 2);
    let ending = h
        .send(&[header, middle, tail], Duration::from_millis(100))
        .await;
    assert!(matches!(ending, Ending::Closed), "{ending:?}");
    let served = h.next().await;
    assert_eq!(passed(&served).reason, Reason::Pass);
    assert_eq!(
        served.record.as_deref(),
        Some(hello.as_slice()),
        "the whole record, in order"
    );
    let waited = h
        .gate
        .counters()
        .expect("counters")
        .get(counter::PARSER_WAITED);
    assert!(
        waited >= 1,
        "the parser never saw a partial record for a hello written in three parts"
    );
}

#[tokio::test]
async fn a_two_segment_client_hello_with_the_name_in_the_second_segment() {
    // Chromium's post-quantum hello: 1929 bytes, server_name at byte 1640, past one MTU-1500
    // segment's payload, so the verdict needs both segments.
    let hello = corpus("chromium-2.bin");
    assert!(hello.len() > 1500);
    let Some(mut h) = Harness::start("twoseg", policy(&["chromium.example.test"])).await else {
        return;
    };
    let ending = h.send(&[&hello], Duration::ZERO).await;
    assert!(matches!(ending, Ending::Closed), "{ending:?}");
    let served = h.next().await;
    assert_eq!(passed(&served).reason, Reason::Pass);
    assert_eq!(served.record.as_deref(), Some(hello.as_slice()));
    // Proof that the record really arrived in pieces: the parser had to wait for more.
    let waited = h
        .gate
        .counters()
        .expect("counters")
        .get(counter::PARSER_WAITED);
    assert!(
        waited >= 1,
        "the parser never waited, so the hello came in one packet"
    );

    h.gate
        .sync_hosts(&policy(&["other.example.test"]))
        .expect("sync");
    let ending = h.send(&[&hello], Duration::ZERO).await;
    assert!(matches!(ending, Ending::Reset(_)), "{ending:?}");
    assert_eq!(dropped(&h.next().await).reason, Reason::Unknown);
}

#[tokio::test]
async fn no_sni_garbage_and_plain_http_follow_the_configured_policy() {
    let strict = HostPolicy {
        no_sni: CaseAction::Drop,
        malformed: CaseAction::Drop,
        not_tls: CaseAction::Drop,
        ..policy(&["curl.example.test"])
    };
    let Some(mut h) = Harness::start("cases", strict.clone()).await else {
        return;
    };
    let cases = [
        ("openssl-tls13-nosni.bin", Reason::NoSni),
        ("garbage.bin", Reason::NotTls),
        ("http-get.bin", Reason::NotTls),
        ("synth-duplicate-sni.bin", Reason::Malformed),
    ];
    for (file, reason) in cases {
        let ending = h.send(&[&corpus(file)], Duration::ZERO).await;
        assert!(matches!(ending, Ending::Reset(_)), "{file}: {ending:?}");
        assert_eq!(dropped(&h.next().await).reason, reason, "{file}");
    }

    let lenient = HostPolicy {
        not_tls: CaseAction::Pass,
        no_sni: CaseAction::Pass,
        ..strict
    };
    h.gate.sync_hosts(&lenient).expect("sync");
    let http = corpus("http-get.bin");
    let ending = h.send(&[&http], Duration::ZERO).await;
    assert!(matches!(ending, Ending::Closed), "{ending:?}");
    let served = h.next().await;
    assert_eq!(passed(&served).reason, Reason::NotTls);
    assert_eq!(served.record.as_deref(), Some(http.as_slice()));
    let nosni = corpus("openssl-tls13-nosni.bin");
    h.send(&[&nosni], Duration::ZERO).await;
    assert_eq!(passed(&h.next().await).reason, Reason::NoSni);
}

#[tokio::test]
async fn a_restart_reuses_the_pinned_policy_and_replaces_per_socket_state() {
    let pins = pin_dir("restart");
    let first = policy(&["curl.example.test", "keep.example.test"]);
    let Some(mut h) =
        Harness::start_in("restart", first.clone(), pins.clone(), KernelLog::Off).await
    else {
        return;
    };
    h.send(&[&corpus("curl-tls13.bin")], Duration::ZERO).await;
    assert_eq!(passed(&h.next().await).reason, Reason::Pass);
    let passes_before = h.gate.counters().expect("counters").get(counter::PASS);

    // Stop: the per-socket pins go, the policy stays pinned.
    let Harness {
        gate,
        pins: pin_guard,
        pair,
        server,
        ..
    } = h;
    drop(server);
    // The server's connection tasks may still hold the gate for a moment.
    let gate = wait_for_sole_owner(gate).await;
    drop(gate);
    tokio::time::sleep(Duration::from_millis(50)).await;
    for (file, kept) in [
        ("hosts", true),
        ("config", true),
        ("counters", true),
        ("verdicts", false),
        ("socks", false),
    ] {
        assert_eq!(pins.join(file).exists(), kept, "{file} after stop");
    }

    // Start again on the same pins: the policy is already there, nothing to write.
    let gate = Arc::new(load(&pins, first.clone(), KernelLog::Off).expect("reload"));
    let report = gate.sync_hosts(&first).expect("sync");
    assert_eq!((report.upserted, report.removed), (0, 0), "{report:?}");
    assert!(
        gate.counters().expect("counters").get(counter::PASS) >= passes_before,
        "counters survive"
    );
    let listener = TcpListener::bind((SERVER_IP, PORT)).await.expect("rebind");
    register(&gate, &listener);
    let (tx, served) = mpsc::unbounded_channel();
    let server = AbortOnDrop(tokio::spawn(serve(listener, gate.clone(), tx)));
    let mut h = Harness {
        gate,
        served,
        server,
        pins: pin_guard,
        pair,
    };
    let ending = h.send(&[&corpus("curl-tls13.bin")], Duration::ZERO).await;
    assert!(matches!(ending, Ending::Closed), "{ending:?}");
    assert_eq!(passed(&h.next().await).reason, Reason::Pass);

    // And a policy change after the restart removes only what it must.
    let report = h
        .gate
        .sync_hosts(&policy(&["keep.example.test"]))
        .expect("sync");
    assert_eq!((report.upserted, report.removed), (0, 1), "{report:?}");
    h.send(&[&corpus("curl-tls13.bin")], Duration::ZERO).await;
    assert_eq!(dropped(&h.next().await).reason, Reason::Unknown);
}

#[tokio::test]
async fn bpftool_map_dump_shows_host_names() {
    let names = policy(&["shop.example.test", "*.apps.example.test"]);
    let names = HostPolicy {
        hosts: names.hosts,
        ..HostPolicy::default()
    }
    .with_host("tls.example.test", HostAction::Passthrough);
    let Some(h) = Harness::start("bpftool", names).await else {
        return;
    };
    let hosts = bpftool_dump(&h.pins.0.join("hosts"));
    for name in [
        "shop.example.test",
        "*.apps.example.test",
        "tls.example.test",
    ] {
        let shown = format!("\"name\": \"{name}\"");
        assert!(
            hosts.contains(&shown),
            "{name} is not readable in:\n{hosts}"
        );
    }
    assert!(
        hosts.contains("\"action\": 2"),
        "the passthrough action shows:\n{hosts}"
    );

    let config = bpftool_dump(&h.pins.0.join("config"));
    for field in [
        "\"netns_cookie\"",
        "\"catch_all\": 0",
        "\"port_count\": 1",
        "443",
    ] {
        assert!(config.contains(field), "{field} is not in:\n{config}");
    }
    let counters = bpftool_dump(&h.pins.0.join("counters"));
    assert!(
        counters.contains("\"cpu\""),
        "per-CPU values are not shown:\n{counters}"
    );
}

fn bpftool_dump(pin: &Path) -> String {
    let out = std::process::Command::new("bpftool")
        .args(["map", "dump", "pinned"])
        .arg(pin)
        .output()
        .expect("run bpftool");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    eprintln!("bpftool map dump pinned {}:\n{text}", pin.display());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

#[tokio::test]
async fn corpus_verdicts_match_the_userspace_parser() {
    // Every corpus name but one is known, so both pass and unknown are exercised.
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("data/clienthello");
    let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
        .expect("corpus dir")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".bin"))
        .map(|n| {
            let bytes = corpus(&n);
            (n, bytes)
        })
        .collect();
    files.sort();
    let mut known: Vec<String> = files
        .iter()
        .filter_map(|(_, b)| sni_of(b))
        .filter(|n| n != "curl.example.test")
        .collect();
    known.sort();
    known.dedup();
    let known_refs: Vec<&str> = known.iter().map(String::as_str).collect();
    let Some(h) = Harness::start("corpus", policy(&known_refs)).await else {
        return;
    };

    let mut mismatches = Vec::new();
    for (file, bytes) in &files {
        let parsed = client_hello::parse(bytes);
        let (want_reason, want_name) = match client_hello::gate(&parsed) {
            Ok(name) if known.iter().any(|k| k == name.as_str()) => {
                (Reason::Pass, Some(name.to_string()))
            }
            Ok(name) => (Reason::Unknown, Some(name.to_string())),
            Err(client_hello::Reason::NoSni) => (Reason::NoSni, None),
            Err(client_hello::Reason::Malformed) => (Reason::Malformed, None),
            Err(client_hello::Reason::NotTls) => (Reason::NotTls, None),
        };
        let got = h
            .gate
            .probe(bytes)
            .unwrap_or_else(|e| panic!("{file}: probe: {e}"));
        eprintln!(
            "{file:32} kernel {:?} {:?} ({} bytes)",
            got.reason, got.name, got.record_len
        );
        if got.reason != want_reason || got.name != want_name {
            mismatches.push(format!(
                "{file}: kernel {:?} {:?}, userspace {want_reason:?} {want_name:?}",
                got.reason, got.name
            ));
        }
    }
    assert!(
        mismatches.is_empty(),
        "kernel and userspace disagree:\n{}",
        mismatches.join("\n")
    );
    assert!(files.len() >= 20, "the corpus went missing");
}

/// SO_LINGER {on, 0}: closing the socket sends an RST.
fn reset_on_close(stream: &tokio::net::TcpStream) {
    use std::os::fd::AsRawFd;
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    let len = libc::socklen_t::try_from(std::mem::size_of::<libc::linger>()).unwrap();
    // SAFETY: a valid socket and a linger struct of the size passed.
    let rc = unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&raw const linger).cast(),
            len,
        )
    };
    assert_eq!(rc, 0, "SO_LINGER: {}", std::io::Error::last_os_error());
}

/// A `tracing` writer into a shared buffer.
#[derive(Clone)]
struct Capture(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("capture lock").extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn kernel_debug_logs_reach_tracing() {
    use tracing_subscriber::layer::SubscriberExt;

    // This gate loads with kernel logging on (so the verifier must accept the logging code
    // too), and its events task, on this thread's runtime, forwards the programs' records to
    // this thread's subscriber.
    let captured = Capture(Arc::new(std::sync::Mutex::new(Vec::new())));
    let writer = captured.clone();
    let subscriber = tracing_subscriber::registry()
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(move || writer.clone())
                .with_ansi(false),
        )
        .with(
            tracing_subscriber::filter::Targets::new()
                .with_target("ingress::gate::kernel", tracing::Level::DEBUG),
        );
    let _guard = tracing::subscriber::set_default(subscriber);

    let policy = policy(&["curl.example.test"]);
    let Some(mut h) = Harness::start_in("logs", policy, pin_dir("logs"), KernelLog::Debug).await
    else {
        return;
    };
    h.send(&[&corpus("curl-tls13.bin")], Duration::ZERO).await;
    assert_eq!(passed(&h.next().await).reason, Reason::Pass);
    let wanted = [
        "ingress::gate::kernel: gated socket",
        "ingress::gate::kernel: verdict socket",
    ];
    let mut text = String::new();
    for _ in 0..100 {
        text = String::from_utf8_lossy(&captured.0.lock().expect("capture lock")).into_owned();
        if wanted.iter().all(|w| text.contains(w)) {
            eprintln!("captured:\n{text}");
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("missing kernel log lines {wanted:?} in:\n{text}");
}

#[tokio::test]
async fn verdict_records_never_outlive_their_sockets() {
    let Some(mut h) = Harness::start("reap", policy(&["curl.example.test"])).await else {
        return;
    };
    // Served connections: the kernel deletes each record as its socket closes.
    h.send(&[&corpus("curl-tls13.bin")], Duration::ZERO).await;
    assert_eq!(passed(&h.next().await).reason, Reason::Pass);
    h.send(&[&corpus("openssl-tls13-sni.bin")], Duration::ZERO)
        .await;
    assert_eq!(dropped(&h.next().await).reason, Reason::Unknown);

    // A connection that resets before userspace ever accepts it: only the kernel can clean up.
    let reaped_before = h
        .gate
        .counters()
        .expect("counters")
        .get(counter::RECORD_REAPED);
    drop(std::mem::replace(
        &mut h.server,
        AbortOnDrop(tokio::spawn(async {})),
    ));
    tokio::time::sleep(Duration::from_millis(20)).await;
    let listener = TcpListener::bind((SERVER_IP, PORT)).await.expect("rebind");
    register(&h.gate, &listener);
    let socket = h
        .pair
        .client
        .run(tokio::net::TcpSocket::new_v4)
        .expect("thread")
        .expect("socket");
    let mut stream = socket
        .connect(SocketAddr::from((SERVER_IP, PORT)))
        .await
        .expect("connect");
    stream
        .write_all(&corpus("curl-tls13.bin"))
        .await
        .expect("write");
    tokio::time::sleep(Duration::from_millis(50)).await;
    reset_on_close(&stream);
    drop(stream);

    let mut records = usize::MAX;
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let dump = bpftool_dump(&h.pins.0.join("verdicts"));
        let parsed: serde_json::Value = serde_json::from_str(&dump).expect("bpftool json");
        records = parsed.as_array().map_or(usize::MAX, Vec::len);
        if records == 0 {
            break;
        }
    }
    assert_eq!(records, 0, "verdict records left behind");
    let counters = h.gate.counters().expect("counters");
    assert!(
        counters.get(counter::RECORD_REAPED) > reaped_before,
        "the kernel did not reap: {counters:?}"
    );
    drop(listener);
}

#[tokio::test]
async fn mutated_hellos_get_the_same_verdict_from_kernel_and_userspace() {
    let Some(h) = Harness::start(
        "mutants",
        policy(&["curl.example.test", "chromium.example.test"]),
    )
    .await
    else {
        return;
    };
    // A fixed xorshift, so a failure names a reproducible case.
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut mismatches = Vec::new();
    let mut checked = 0;
    for file in [
        "curl-tls13.bin",
        "openssl-tls12-sni.bin",
        "chromium-1.bin",
        "synth-ech-grease.bin",
    ] {
        let original = corpus(file);
        for case in 0..400 {
            let mut bytes = original.clone();
            for _ in 0..1 + next() % 3 {
                let at = usize::try_from(next()).unwrap() % bytes.len();
                bytes[at] = next().to_le_bytes()[0];
            }
            if next() % 8 == 0 {
                bytes.truncate(usize::try_from(next()).unwrap() % bytes.len());
            }
            let parsed = client_hello::parse(&bytes);
            let want = match client_hello::gate(&parsed) {
                Ok(name)
                    if ["curl.example.test", "chromium.example.test"].contains(&name.as_str()) =>
                {
                    (Reason::Pass, Some(name.to_string()))
                }
                Ok(name) => (Reason::Unknown, Some(name.to_string())),
                Err(client_hello::Reason::NoSni) => (Reason::NoSni, None),
                Err(client_hello::Reason::Malformed) => (Reason::Malformed, None),
                Err(client_hello::Reason::NotTls) => (Reason::NotTls, None),
            };
            let got = h
                .gate
                .probe(&bytes)
                .unwrap_or_else(|e| panic!("{file} #{case}: probe: {e}"));
            checked += 1;
            if (got.reason, got.name.clone()) != want {
                mismatches.push(format!(
                    "{file} #{case}: kernel {:?} {:?}, userspace {want:?}",
                    got.reason, got.name
                ));
            }
        }
    }
    assert!(
        mismatches.is_empty(),
        "{} of {checked} differ:\n{}",
        mismatches.len(),
        mismatches.join("\n")
    );
}

/// A TLS 1.2-style ClientHello record with the given extensions, in order.
fn build_hello(extensions: &[(u16, Vec<u8>)]) -> Vec<u8> {
    let mut body = vec![3, 3];
    body.extend_from_slice(&[7; 32]); // random
    body.push(0); // session id
    body.extend_from_slice(&[0, 2, 0x13, 0x01]); // one cipher suite
    body.extend_from_slice(&[1, 0]); // null compression
    let mut block = Vec::new();
    for (kind, data) in extensions {
        block.extend_from_slice(&kind.to_be_bytes());
        block.extend_from_slice(&u16::try_from(data.len()).unwrap().to_be_bytes());
        block.extend_from_slice(data);
    }
    body.extend_from_slice(&u16::try_from(block.len()).unwrap().to_be_bytes());
    body.extend_from_slice(&block);
    let mut handshake = vec![1];
    handshake.extend_from_slice(&u32::try_from(body.len()).unwrap().to_be_bytes()[1..]);
    handshake.extend_from_slice(&body);
    let mut record = vec![22, 3, 1];
    record.extend_from_slice(&u16::try_from(handshake.len()).unwrap().to_be_bytes());
    record.extend_from_slice(&handshake);
    record
}

fn sni(name: &[u8]) -> (u16, Vec<u8>) {
    let mut entry = vec![0];
    entry.extend_from_slice(&u16::try_from(name.len()).unwrap().to_be_bytes());
    entry.extend_from_slice(name);
    let mut data = u16::try_from(entry.len()).unwrap().to_be_bytes().to_vec();
    data.extend_from_slice(&entry);
    (0, data)
}

fn alpn(protocols: &[&[u8]]) -> (u16, Vec<u8>) {
    let mut list = Vec::new();
    for p in protocols {
        list.push(u8::try_from(p.len()).unwrap());
        list.extend_from_slice(p);
    }
    let mut data = u16::try_from(list.len()).unwrap().to_be_bytes().to_vec();
    data.extend_from_slice(&list);
    (16, data)
}

#[tokio::test]
async fn edge_cases_get_the_same_verdict_from_kernel_and_userspace() {
    let long = |n: usize| {
        let mut name = vec![b'a'; n];
        for i in (60..n).step_by(61) {
            name[i] = b'.';
        }
        name
    };
    let many = |n: u16| {
        (0..n)
            .map(|i| (0x1000 + i, vec![]))
            .chain([sni(b"ok.test")])
            .collect::<Vec<_>>()
    };
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("plain name", build_hello(&[sni(b"ok.test")])),
        ("upper case", build_hello(&[sni(b"OK.Test")])),
        ("underscore", build_hello(&[sni(b"_dmarc.ok.test")])),
        ("wildcard child", build_hello(&[sni(b"x.wild.test")])),
        ("wildcard grandchild", build_hello(&[sni(b"y.x.wild.test")])),
        ("253 bytes", build_hello(&[sni(&long(253))])),
        ("254 bytes", build_hello(&[sni(&long(254))])),
        ("star", build_hello(&[sni(b"*.wild.test")])),
        ("leading dot", build_hello(&[sni(b".ok.test")])),
        ("double dot", build_hello(&[sni(b"ok..test")])),
        ("trailing dot", build_hello(&[sni(b"ok.test.")])),
        ("empty name", build_hello(&[sni(b"")])),
        ("space", build_hello(&[sni(b"ok test")])),
        ("high byte", build_hello(&[sni(b"ok\xc3\xa9.test")])),
        (
            "sni after alpn",
            build_hello(&[alpn(&[b"h2"]), sni(b"ok.test")]),
        ),
        (
            "empty alpn entry",
            build_hello(&[sni(b"ok.test"), alpn(&[b"h2", b""])]),
        ),
        (
            "empty alpn list",
            build_hello(&[sni(b"ok.test"), (16, vec![0, 0])]),
        ),
        (
            "odd versions",
            build_hello(&[sni(b"ok.test"), (43, vec![3, 3, 4, 3])]),
        ),
        (
            "even versions",
            build_hello(&[sni(b"ok.test"), (43, vec![2, 3, 4])]),
        ),
        (
            "duplicate other",
            build_hello(&[sni(b"ok.test"), (5, vec![]), (5, vec![])]),
        ),
        ("32 extensions", build_hello(&many(31))),
        ("33 extensions", build_hello(&many(32))),
        ("two names", {
            let (_, mut one) = sni(b"ok.test");
            let (_, two) = sni(b"b.test");
            one.extend_from_slice(&two[2..]);
            let len = u16::try_from(one.len() - 2).unwrap();
            one[..2].copy_from_slice(&len.to_be_bytes());
            build_hello(&[(0, one)])
        }),
        (
            "name type 1",
            build_hello(&[(0, vec![0, 4, 1, 0, 1, b'a'])]),
        ),
        ("no extensions", build_hello(&[])),
    ];
    let known = ["ok.test", "*.wild.test", "_dmarc.ok.test"];
    let Some(h) = Harness::start("edges", policy(&known)).await else {
        return;
    };
    let mut mismatches = Vec::new();
    for (label, bytes) in &cases {
        let parsed = client_hello::parse(bytes);
        let want = match client_hello::gate(&parsed) {
            Ok(name) => {
                let wild = name
                    .split_once('.')
                    .map(|(_, parent)| format!("*.{parent}"));
                let hit = known.contains(&name.as_str())
                    || wild.is_some_and(|w| known.contains(&w.as_str()));
                (
                    if hit { Reason::Pass } else { Reason::Unknown },
                    Some(name.to_string()),
                )
            }
            Err(client_hello::Reason::NoSni) => (Reason::NoSni, None),
            Err(client_hello::Reason::Malformed) => (Reason::Malformed, None),
            Err(client_hello::Reason::NotTls) => (Reason::NotTls, None),
        };
        let got = h
            .gate
            .probe(bytes)
            .unwrap_or_else(|e| panic!("{label}: probe: {e}"));
        eprintln!(
            "{label:20} kernel {:?} {:?}",
            got.reason,
            got.name.as_deref().map(|n| &n[..n.len().min(40)])
        );
        if (got.reason, got.name.clone()) != want {
            mismatches.push(format!(
                "{label}: kernel {:?} {:?}, userspace {want:?}",
                got.reason, got.name
            ));
        }
    }
    assert!(mismatches.is_empty(), "{}", mismatches.join("\n"));
}

/// After taking the first record, answers at once and waits for the client's next bytes, as a
/// TLS server sends its ServerHello and waits for the client's Finished; reports whether they
/// came (a `Served` with the admission and `Some(b"ping")`, or `None` after 3 s).
async fn converse(listener: TcpListener, gate: Arc<Gate>, tx: mpsc::UnboundedSender<Served>) {
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

/// A two-segment ClientHello goes through SOCKS; the server answers as soon as it has the
/// record and the socket left SOCKS, and the client replies at once. The reply must reach the
/// server: a TLS client's Finished lost there leaves the handshake to time out.
#[tokio::test]
async fn bytes_sent_right_after_the_first_record_reach_the_server() {
    const N: usize = 1200;
    const AT_ONCE: usize = 6;
    let hello = Arc::new(corpus("chromium-2.bin"));
    let Some(mut h) = Harness::start_serving(
        "after",
        policy(&["chromium.example.test"]),
        pin_dir("after"),
        KernelLog::Off,
        Server::Converse,
    )
    .await
    else {
        return;
    };
    let sockets = h
        .pair
        .client
        .run(|| {
            (0..N)
                .map(|_| tokio::net::TcpSocket::new_v4().expect("client socket"))
                .collect::<Vec<_>>()
        })
        .expect("client namespace thread");
    let sockets = Arc::new(std::sync::Mutex::new(sockets));
    let mut clients = tokio::task::JoinSet::new();
    for _ in 0..AT_ONCE {
        let (sockets, hello) = (sockets.clone(), hello.clone());
        clients.spawn(async move {
            loop {
                let Some(socket) = sockets.lock().expect("sockets").pop() else {
                    return;
                };
                let mut stream = socket
                    .connect(SocketAddr::from((SERVER_IP, PORT)))
                    .await
                    .expect("connect");
                stream.set_nodelay(true).expect("nodelay");
                // The hello leaves as two segments with a moment between them, as a client
                // on a real network sends it: the first one makes the socket, the second
                // completes the record after the server has accepted.
                let (first, second) = hello.split_at(1000);
                stream.write_all(first).await.expect("write the hello");
                tokio::time::sleep(Duration::from_millis(1)).await;
                stream.write_all(second).await.expect("write the hello");
                let mut answer = [0u8; 5];
                tokio::time::timeout(STEP, stream.read_exact(&mut answer))
                    .await
                    .expect("the server answered in time")
                    .expect("read the answer");
                stream.write_all(b"ping").await.expect("write the reply");
                let mut pong = [0u8; 4];
                let _ = tokio::time::timeout(STEP, stream.read_exact(&mut pong)).await;
            }
        });
    }
    let mut lost = 0;
    for i in 0..N {
        let served = h.next().await;
        assert!(
            matches!(served.admission, Admission::Pass(_)),
            "#{i}: {served:?}"
        );
        if served.record.as_deref() != Some(b"ping".as_slice()) {
            lost += 1;
        }
    }
    while clients.join_next().await.is_some() {}
    assert_eq!(lost, 0, "{lost} of {N} replies never reached the server");
    let seen = ingress::gate::pinned_workspaces(&h.pins.0).expect("workspaces");
    assert_eq!((seen.claimed, seen.dirty_words), (0, 0), "{seen:?}");
}
