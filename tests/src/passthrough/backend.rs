//! The passthrough backends, each on a thread of its own in the backend namespace:
//! - a TLS server with its own certificate (from its own CA) on :8443, which reads one command
//!   byte after its handshake:
//!   - `E` echo every byte; at EOF send `DONE` + byte count + SHA-256 of what arrived, then close;
//!   - `S` + u64 n: send n pattern bytes, close its write side, then read to EOF and report;
//!   - `R` reset the connection (RST) at once;
//!   - `W` read until the connection ends and report whether it was reset;
//! - a plain TCP server on :9000 that records every byte it receives.
//!
//! Every connection they served is reported to the test (bytes, digest, how it ended), so both
//! ends' checksums and the far side's view of half-closes and resets are asserted. That
//! includes connections whose handshake failed (a reset can overtake the client's Finished) and
//! connections whose bytes arrived damaged: rustls then reports a bad record, or (in debug
//! builds, after this side's own close_notify) panics on its `!sent_fatal_alert` assertion as
//! it tries to send the alert; a panicking connection task is reported too. A damaged stream is
//! reported with what the tap under the session saw (see [`super::tap`]), so the test's failure
//! says where the bytes went wrong rather than timing out.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;

use super::payload::{End, Sha256, ending, send_pattern};
use super::tap::{Tap, TapLog, describe, framing_break, pattern_mismatch};
use super::{BACKEND_PORT, RAW_PORT, STEP};
use crate::netns::{NetChain, NetNs};
use crate::pki::Leaf;
use crate::sockopt::linger_zero;

/// What the backend saw on one connection.
#[derive(Clone, Debug)]
pub struct Served {
    pub command: Option<u8>,
    pub received: u64,
    pub digest: Vec<u8>,
    pub end: End,
    /// Set when the bytes that arrived were not the TLS stream the client sent (rustls
    /// rejected a record, or panicked doing so): what went wrong and what the tap saw.
    pub damage: Option<String>,
    /// The ciphertext this connection read and wrote.
    pub raw: TapLog,
    /// What the connection's task has seen so far, shared with the task that reports it if
    /// it panics.
    progress: Arc<std::sync::Mutex<Progress>>,
}

/// The command, the plaintext count and the plaintext after the command byte (the first
/// [`CHECKED`] bytes, for the pattern check).
#[derive(Debug, Default)]
struct Progress {
    command: Option<u8>,
    received: u64,
    plain: Vec<u8>,
}

/// Plaintext bytes kept per connection to compare against the client's pattern.
const CHECKED: usize = 16 * super::payload::MIB;

impl Served {
    fn new(raw: TapLog, progress: Arc<std::sync::Mutex<Progress>>) -> Served {
        let (command, received) = {
            let seen = lock(&progress);
            (seen.command, seen.received)
        };
        Served {
            command,
            received,
            digest: Vec::new(),
            end: End::Eof,
            damage: None,
            raw,
            progress,
        }
    }

    fn set_command(&mut self, command: u8) {
        self.command = Some(command);
        lock(&self.progress).command = Some(command);
    }

    /// Counts and keeps plaintext that arrived.
    fn take(&mut self, data: &[u8]) {
        self.received += data.len() as u64;
        let mut seen = lock(&self.progress);
        seen.received = self.received;
        let room = CHECKED.saturating_sub(seen.plain.len()).min(data.len());
        seen.plain.extend_from_slice(&data[..room]);
    }

    /// Records a TLS-level failure (`what`) with the backend's own view of the stream: how much
    /// plaintext arrived and whether it was the pattern, and where the ciphertext's record
    /// framing broke.
    fn damaged(&mut self, what: &str) {
        let raw = self.raw.lock();
        let seen = lock(&self.progress);
        let plain = match pattern_mismatch(&seen.plain) {
            None => format!(
                "all {} plaintext bytes kept match the pattern",
                seen.plain.len()
            ),
            Some(at) => format!("the plaintext departs from the pattern at byte {at}"),
        };
        let framing = framing_break(&raw.read)
            .unwrap_or_else(|| "every record header received is plausible".into());
        self.damage = Some(format!(
            "{what}; command {:?}; {} plaintext bytes received ({plain}); {} ciphertext bytes received, {}; {framing}",
            self.command.map(char::from),
            self.received,
            raw.read_total,
            sha256_hex(&raw.read),
        ));
    }
}

fn sha256_hex(data: &[u8]) -> String {
    let mut hash = Sha256::new();
    hash.update(data);
    let digest: String = hash.finish().iter().map(|b| format!("{b:02x}")).collect();
    format!("SHA-256 of those kept {digest}")
}

/// A rustls error surfaces from tokio-rustls as `InvalidData`; resets and EOFs do not.
fn is_tls_error(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::InvalidData
}

/// Field order is drop order: stop the server before the thread is joined.
pub struct TlsBackend {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
    served: mpsc::UnboundedReceiver<Served>,
}

impl Drop for TlsBackend {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl TlsBackend {
    pub fn start(ns: &NetNs, leaf: &Leaf) -> TlsBackend {
        let config = server_config(leaf);
        let (tx, served) = mpsc::unbounded_channel();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let (bound_tx, bound_rx) = std::sync::mpsc::channel();
        let thread = ns.spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("backend runtime");
            runtime.block_on(async move {
                let listener = TcpListener::bind((NetChain::BACKEND_IP, BACKEND_PORT))
                    .await
                    .expect("bind the backend");
                bound_tx.send(()).expect("report bound");
                let acceptor = TlsAcceptor::from(config);
                let mut stop_rx = stop_rx;
                loop {
                    tokio::select! {
                        _ = &mut stop_rx => break,
                        accepted = listener.accept() => {
                            let Ok((stream, _)) = accepted else { continue };
                            let _ = stream.set_nodelay(true);
                            let stream = Tap::new(stream);
                            // Shared with the task that reports a panic.
                            let report = Served::new(stream.log(), Arc::default());
                            let (raw, progress) = (report.raw.clone(), report.progress.clone());
                            let task = tokio::spawn(serve_one(acceptor.clone(), stream, report, tx.clone()));
                            tokio::spawn(report_panic(task, raw, progress, tx.clone()));
                        }
                    }
                }
            });
        });
        bound_rx
            .recv_timeout(STEP)
            .expect("the backend did not start");
        TlsBackend {
            stop: Some(stop_tx),
            thread: Some(thread),
            served,
        }
    }

    /// The next connection's report; fails the test if its stream arrived damaged.
    pub async fn next(&mut self) -> Served {
        let served = self.next_report().await;
        if let Some(damage) = &served.damage {
            panic!("the backend received a damaged stream: {damage}");
        }
        served
    }

    /// As [`TlsBackend::next`], and on damage compares the ciphertext the backend read with
    /// what the client (whose tap is `client`) wrote: the first differing byte and where the
    /// bytes found there came from.
    pub async fn next_from(&mut self, client: &TapLog) -> Served {
        let served = self.next_report().await;
        if let Some(damage) = &served.damage {
            let comparison = {
                let (sent, got) = (client.lock(), served.raw.lock());
                describe(&sent.written, sent.written_total, &got.read, got.read_total)
            };
            panic!(
                "the backend received a damaged stream: {damage}\nclient → backend ciphertext: {comparison}"
            );
        }
        served
    }

    async fn next_report(&mut self) -> Served {
        tokio::time::timeout(STEP, self.served.recv())
            .await
            .expect("the backend reported no connection in time")
            .expect("the backend stopped")
    }

    /// Takes reports until none arrives for `quiet`; how many there were.
    pub async fn settle(&mut self, quiet: Duration) -> usize {
        let mut n = 0;
        while let Ok(Some(_)) = tokio::time::timeout(quiet, self.served.recv()).await {
            n += 1;
        }
        n
    }
}

fn server_config(leaf: &Leaf) -> Arc<rustls::ServerConfig> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let chain = CertificateDer::pem_slice_iter(leaf.chain.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .expect("chain");
    let key = PrivateKeyDer::from_pem_slice(leaf.key.as_bytes()).expect("key");
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .expect("server certificate");
    Arc::new(config)
}

/// Reports a connection whose task panicked (rustls' debug assertion on a bad record after
/// this side's close_notify), with what its tap saw, instead of leaving the test to time out.
async fn report_panic(
    task: tokio::task::JoinHandle<()>,
    raw: TapLog,
    progress: Arc<std::sync::Mutex<Progress>>,
    tx: mpsc::UnboundedSender<Served>,
) {
    let Err(e) = task.await else { return };
    let Ok(panic) = e.try_into_panic() else {
        return;
    };
    let message = panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a non-text panic".into());
    let mut report = Served::new(raw, progress);
    report.end = End::Other(format!("panicked: {message}"));
    report.damaged(&format!("the connection task panicked: {message}"));
    let _ = tx.send(report);
}

async fn serve_one(
    acceptor: TlsAcceptor,
    stream: Tap<TcpStream>,
    mut report: Served,
    tx: mpsc::UnboundedSender<Served>,
) {
    let mut tls = match acceptor.accept(stream).await {
        Ok(tls) => tls,
        // Reported, not dropped: a reset can reach this side before the client's Finished
        // does, and the test waits for a report of every connection.
        Err(e) => {
            eprintln!("backend: the handshake failed: {e}");
            report.end = ending(&e);
            if is_tls_error(&e) {
                report.damaged(&format!("the handshake failed: {e}"));
            }
            let _ = tx.send(report);
            return;
        }
    };
    let mut command = [0u8; 1];
    match tls.read(&mut command).await {
        Ok(1) => report.set_command(command[0]),
        Ok(_) => {
            let _ = tx.send(report);
            return;
        }
        Err(e) => {
            report.end = ending(&e);
            if is_tls_error(&e) {
                report.damaged(&format!("reading the command failed: {e}"));
            }
            let _ = tx.send(report);
            return;
        }
    }
    match command[0] {
        b'E' => {
            let mut hash = Sha256::new();
            let mut buf = vec![0u8; 256 * 1024];
            loop {
                match tls.read(&mut buf).await {
                    Ok(0) => break,
                    Ok(n) => {
                        hash.update(&buf[..n]);
                        report.take(&buf[..n]);
                        // tokio-rustls may keep a write buffered until flushed.
                        let echoed = match tls.write_all(&buf[..n]).await {
                            Ok(()) => tls.flush().await,
                            Err(e) => Err(e),
                        };
                        if let Err(e) = echoed {
                            eprintln!(
                                "backend: echo write failed after {} bytes: {e}",
                                report.received
                            );
                            report.end = ending(&e);
                            break;
                        }
                    }
                    Err(e) => {
                        eprintln!("backend: read failed after {} bytes: {e}", report.received);
                        report.end = ending(&e);
                        if is_tls_error(&e) {
                            report.damaged(&format!("echo read failed: {e}"));
                        }
                        break;
                    }
                }
            }
            report.digest = hash.finish();
            if report.end == End::Eof {
                let mut trailer = b"DONE".to_vec();
                trailer.extend_from_slice(&report.received.to_le_bytes());
                trailer.extend_from_slice(&report.digest);
                let _ = tls.write_all(&trailer).await;
                let _ = tls.shutdown().await;
            }
        }
        b'S' => {
            let mut len = [0u8; 8];
            if let Err(e) = tls.read_exact(&mut len).await {
                report.end = ending(&e);
                if is_tls_error(&e) {
                    report.damaged(&format!("reading the length failed: {e}"));
                }
                let _ = tx.send(report);
                return;
            }
            let (written, _) = send_pattern(
                &mut tls,
                usize::try_from(u64::from_le_bytes(len)).expect("a length that fits"),
            )
            .await
            .expect("send the pattern");
            assert_eq!(written as u64, u64::from_le_bytes(len));
            tls.shutdown()
                .await
                .expect("close the backend's write side");
            drain_into(&mut tls, &mut report).await;
        }
        b'R' => {
            linger_zero(tls.get_ref().0);
            drop(tls);
        }
        b'W' => drain_into(&mut tls, &mut report).await,
        _ => {}
    }
    let _ = tx.send(report);
}

/// Reads to the end into `report`: count, digest, plaintext kept for the pattern check, and
/// how it ended (damage included).
async fn drain_into<S: tokio::io::AsyncRead + Unpin>(stream: &mut S, report: &mut Served) {
    let mut hash = Sha256::new();
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        match stream.read(&mut buf).await {
            Ok(0) => break,
            Ok(n) => {
                hash.update(&buf[..n]);
                report.take(&buf[..n]);
            }
            Err(e) => {
                report.end = ending(&e);
                if is_tls_error(&e) {
                    report.damaged(&format!("read failed: {e}"));
                }
                break;
            }
        }
    }
    report.digest = hash.finish();
}

/// A plain TCP backend in the backend namespace: reads each connection's first record and
/// then up to a newline, reports every byte it got, answers `got <count>` and closes its side.
/// Field order is drop order: stop the accept loop before joining it.
pub struct RawBackend {
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    received: mpsc::UnboundedReceiver<Vec<u8>>,
}

impl Drop for RawBackend {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl RawBackend {
    pub fn start(ns: &NetNs) -> RawBackend {
        let (tx, received) = mpsc::unbounded_channel();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let (bound_tx, bound_rx) = std::sync::mpsc::channel();
        let thread = ns.spawn(move || {
            let listener = std::net::TcpListener::bind((NetChain::BACKEND_IP, RAW_PORT))
                .expect("bind the raw backend");
            listener.set_nonblocking(true).expect("nonblocking");
            bound_tx.send(()).expect("report bound");
            while !flag.load(std::sync::atomic::Ordering::Relaxed) {
                match listener.accept() {
                    Ok((mut stream, _)) => {
                        let tx = tx.clone();
                        std::thread::spawn(move || {
                            use std::io::{Read, Write};
                            stream.set_nonblocking(false).expect("blocking");
                            stream.set_read_timeout(Some(STEP)).expect("read timeout");
                            // The ClientHello record first (it may hold any byte), then the
                            // client's line.
                            let mut got = vec![0u8; 5];
                            if stream.read_exact(&mut got).is_ok() {
                                let len = usize::from(u16::from_be_bytes([got[3], got[4]]));
                                got.resize(5 + len, 0);
                                let _ = stream.read_exact(&mut got[5..]);
                            }
                            let mut byte = [0u8; 1];
                            while !got.ends_with(b"\n") {
                                match stream.read(&mut byte) {
                                    Ok(1) => got.push(byte[0]),
                                    _ => break,
                                }
                            }
                            let _ = stream.write_all(format!("got {}", got.len()).as_bytes());
                            let _ = stream.shutdown(std::net::Shutdown::Write);
                            let _ = tx.send(got);
                            let _ = std::io::copy(&mut stream, &mut std::io::sink());
                        });
                    }
                    // A thread of its own, not a tokio worker: sleeping blocks nothing else.
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        bound_rx
            .recv_timeout(STEP)
            .expect("the raw backend did not start");
        RawBackend {
            stop,
            thread: Some(thread),
            received,
        }
    }

    pub async fn next(&mut self) -> Vec<u8> {
        tokio::time::timeout(STEP, self.received.recv())
            .await
            .expect("the raw backend reported no connection in time")
            .expect("the raw backend stopped")
    }
}

fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panicking connection task leaves whole values behind: still worth reporting.
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
