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
//! ends' checksums and the far side's view of half-closes and resets are asserted.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;

use super::payload::{End, Sha256, drain, ending, send_pattern};
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
                            tokio::spawn(serve_one(acceptor.clone(), stream, tx.clone()));
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

    pub async fn next(&mut self) -> Served {
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

async fn serve_one(acceptor: TlsAcceptor, stream: TcpStream, tx: mpsc::UnboundedSender<Served>) {
    let _ = stream.set_nodelay(true);
    let Ok(mut tls) = acceptor.accept(stream).await else {
        return;
    };
    let mut report = Served {
        command: None,
        received: 0,
        digest: Vec::new(),
        end: End::Eof,
    };
    let mut command = [0u8; 1];
    match tls.read(&mut command).await {
        Ok(1) => report.command = Some(command[0]),
        Ok(_) => {
            let _ = tx.send(report);
            return;
        }
        Err(e) => {
            report.end = ending(&e);
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
                        report.received += n as u64;
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
            if tls.read_exact(&mut len).await.is_err() {
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
            let (received, digest, end) = drain(&mut tls).await;
            report.received = received;
            report.digest = digest;
            report.end = end;
        }
        b'R' => {
            linger_zero(tls.get_ref().0);
            drop(tls);
        }
        b'W' => {
            let (received, digest, end) = drain(&mut tls).await;
            report.received = received;
            report.digest = digest;
            report.end = end;
        }
        _ => {}
    }
    let _ = tx.send(report);
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
