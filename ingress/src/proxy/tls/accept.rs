//! The HTTPS accept path:
//!
//! ```text
//!   userspace mode: accept → read the first TLS record (bounded, with a deadline)
//!                          → parse the ClientHello → SNI gate decision
//!   eBPF mode:      accept → the kernel parsed it already → await its verdict by socket cookie
//!                          (dropped: nothing was read) → read exactly the first record
//!                   passed before accept (by the TC hook, which saw the segment before TCP
//!                          checked it) or deferred by the kernel → read the first record and
//!                          decide as userspace mode does, on the bytes TCP delivered
//!   then:  drop: RST at once, nothing answered
//!          pass: rustls handshake over (recorded bytes + socket) → HTTP; the ClientHello's
//!                name picks the server configuration: a host with auth-tls-secret asks
//!                for a client certificate, verified once the handshake is done
//!          passthrough: the recorded bytes and the socket go to the backend untouched
//!                       (`crate::proxy::passthrough`; spliced in the kernel in eBPF mode)
//! ```
//!
//! Rejected connections are reset (SO_LINGER 0) rather than answered with a TLS alert, so a
//! client sees the same thing whether the kernel gate or this code rejected it.

use std::net::IpAddr;
use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;

use crate::client_hello::{self, Peek};
use crate::gate::{Admission, Gate, Screened};
use crate::proxy::ConnInfo;
use crate::proxy::listener::{Handshake, ProxyHeaderStep};
use crate::proxy::metrics::ProxyMetrics;
use crate::proxy::passthrough::{Passthrough, PassthroughSettings};
use crate::proxy::phase::identity::ClientCert;
use crate::proxy::rewind::Rewind;
use crate::proxy::tls::resolver::ServerConfigs;
use crate::publish::Published;
use crate::snapshot::client_auth::{ClientAuth, PresentedCert, Verification};
use crate::snapshot::sni::{self, Action, Reason};

pub struct TlsHandshake {
    /// The server configuration per handshake (with or without a client certificate request).
    pub configs: Arc<ServerConfigs>,
    pub published: Arc<Published>,
    /// How long a client may take to send its ClientHello and finish the handshake.
    pub handshake_timeout: Duration,
    pub metrics: Arc<ProxyMetrics>,
    /// The kernel gate, in eBPF mode.
    pub gate: Option<Arc<Gate>>,
    pub passthrough: PassthroughSettings,
}

/// How reading the first record ended.
enum FirstRecord {
    Decided {
        bytes: Vec<u8>,
        verdict: Action,
        reason: Reason,
        sni: Option<String>,
    },
    /// The client went away or sent nothing in time.
    Closed,
}

impl Handshake for TlsHandshake {
    type Io = TlsStream<Rewind<TcpStream>>;
    /// eBPF mode: the socket's cookie and, usually, the kernel's verdict already.
    type Screened = Option<Screened>;

    /// eBPF mode: a connection the kernel already dropped is reset here, in the accept loop,
    /// having cost one getsockopt beyond accept and close.
    fn screen(
        &self,
        stream: std::net::TcpStream,
        conn: &ConnInfo,
    ) -> Option<(std::net::TcpStream, Option<Screened>)> {
        let Some(gate) = &self.gate else {
            return Some((stream, None));
        };
        match gate.screen(stream.as_fd()) {
            Ok(Screened {
                early: Some(Admission::Drop(kernel)),
                ..
            }) => {
                let reason = kernel.reason;
                self.metrics.count_gate(reason);
                tracing::debug!(peer = %conn.peer, %reason, "connection rejected by the kernel gate");
                let _ = socket2::SockRef::from(&stream).set_linger(Some(Duration::ZERO));
                drop(stream);
                None
            }
            Ok(screened) => Some((stream, Some(screened))),
            // `admit` tries again, and reports what fails.
            Err(_) => Some((stream, None)),
        }
    }

    /// The kernel gate frames a PROXY protocol header together with the first record: the
    /// header is read here, after the verdict, from the bytes it hands over.
    fn reads_proxy_header(&self) -> bool {
        self.gate.is_some()
    }

    async fn handshake(
        &self,
        mut stream: TcpStream,
        screened: Option<Screened>,
        mut conn: ConnInfo,
        header: Option<ProxyHeaderStep<'_>>,
    ) -> Option<(Self::Io, ConnInfo)> {
        let first = match &self.gate {
            Some(gate) => {
                self.kernel_first_record(gate, &mut stream, screened, &mut conn, header)
                    .await
            }
            None => tokio::time::timeout(
                self.handshake_timeout,
                self.read_first_record(&mut stream, conn.peer.ip()),
            )
            .await
            .unwrap_or(FirstRecord::Closed),
        };
        let (bytes, sni) = match first {
            FirstRecord::Closed => {
                self.close(stream);
                return None;
            }
            FirstRecord::Decided {
                bytes,
                verdict,
                reason,
                sni,
            } => {
                self.metrics.count_gate(reason);
                match verdict {
                    Action::Pass => (bytes, sni),
                    Action::Passthrough => {
                        self.pass_through(stream, bytes, sni.as_deref(), &conn)
                            .await;
                        return None;
                    }
                    // Userspace never defers; a deferral reaching here is treated as a refusal.
                    Action::Drop | Action::Defer => {
                        tracing::debug!(peer = %conn.peer, %reason, sni = sni.as_deref().unwrap_or("-"), "connection rejected");
                        self.close(stream);
                        return None;
                    }
                }
            }
        };
        conn.sni = sni;
        let recorded = Rewind::new(bytes.into(), stream);
        let result = |r: &'static str| crate::proxy::metrics::ResultLabels { result: r };
        match tokio::time::timeout(self.handshake_timeout, self.accept(recorded)).await {
            Ok(Ok((tls, client_auth))) => {
                self.metrics
                    .tls_handshakes
                    .get_or_create(&result("ok"))
                    .inc();
                // A connection the kernel passed before accept had no first record read here.
                let session = tls.get_ref().1;
                if conn.sni.is_none() {
                    conn.sni = session.server_name().map(str::to_ascii_lowercase);
                }
                conn.h2 = session.alpn_protocol() == Some(b"h2");
                if let Some(auth) = client_auth {
                    let chain = session.peer_certificates().unwrap_or_default();
                    let verification = if auth.requests_certificate() {
                        auth.verify(chain, rustls_pki_types::UnixTime::now())
                    } else {
                        Verification::None
                    };
                    let presented = chain.first().map(PresentedCert::of).unwrap_or_default();
                    tracing::debug!(peer = %conn.peer, verify = %verification.header_value(), subject = %presented.subject_dn, "client certificate");
                    conn.client_cert =
                        Some(Arc::new(ClientCert::new(auth, verification, presented)));
                }
                Some((tls, conn))
            }
            Ok(Err(err)) => {
                self.metrics
                    .tls_handshakes
                    .get_or_create(&result("failed"))
                    .inc();
                tracing::debug!(peer = %conn.peer, %err, "TLS handshake failed");
                None
            }
            Err(_) => {
                self.metrics
                    .tls_handshakes
                    .get_or_create(&result("timeout"))
                    .inc();
                None
            }
        }
    }
}

impl TlsHandshake {
    /// The rustls handshake, with the server configuration the ClientHello's name selects:
    /// one that asks for a client certificate when that name's host has `auth-tls-secret`
    /// (with the rules it was chosen by), the plain one otherwise.
    async fn accept(
        &self,
        io: Rewind<TcpStream>,
    ) -> std::io::Result<(TlsStream<Rewind<TcpStream>>, Option<Arc<ClientAuth>>)> {
        let start =
            tokio_rustls::LazyConfigAcceptor::new(rustls::server::Acceptor::default(), io).await?;
        let name = start
            .client_hello()
            .server_name()
            .map(str::to_ascii_lowercase);
        let client_auth = self
            .published
            .load()
            .host(name.as_deref())
            .and_then(|vhost| vhost.policy.client_auth.clone());
        let config = self.configs.for_handshake(client_auth.as_deref());
        let tls = start.into_stream(config).await?;
        Ok((tls, client_auth))
    }

    /// eBPF mode: the kernel has parsed the ClientHello already. Dropped connections are reset
    /// without a byte read; admitted ones hand over their first record, read exactly once.
    /// With `header` (PROXY protocol), what the kernel hands over is the header and the first
    /// record behind it: the header is taken off and believed (or the connection closed) before
    /// anything else, and where userspace decides, it decides for the client it names.
    async fn kernel_first_record(
        &self,
        gate: &Gate,
        stream: &mut TcpStream,
        screened: Option<Screened>,
        conn: &mut ConnInfo,
        header: Option<ProxyHeaderStep<'_>>,
    ) -> FirstRecord {
        // Takes the PROXY header off the front of `bytes` (or the socket); `false`: close.
        let mut header = header;
        let mut take_header =
            async |stream: &mut TcpStream, bytes: &mut Vec<u8>, conn: &mut ConnInfo| -> bool {
                match header.take() {
                    Some(step) => step.run(stream, bytes, conn).await,
                    None => true,
                }
            };
        let admission = match screened {
            Some(screened) => gate.admit_screened(stream, screened).await,
            None => gate.admit(stream).await,
        };
        let (verdict, kernel) = match admission {
            Ok(Admission::Drop(v)) => (Action::Drop, v),
            // Passed before accept: the TC hook judged a segment before TCP's checksum and
            // sequence checks, so it may not be the one TCP delivered. The name is read again
            // from the bytes that did arrive, with the snapshot's policy; a parse is cheap.
            Ok(Admission::Pass(v)) if v.record_len == 0 => {
                if let Err(err) = gate.take_first_record(stream, &v).await {
                    tracing::debug!(%err, "releasing an early-passed connection's record");
                }
                let mut bytes = Vec::new();
                if !take_header(stream, &mut bytes, conn).await {
                    return FirstRecord::Closed;
                }
                return self
                    .userspace_first_record(stream, bytes, conn.peer.ip())
                    .await;
            }
            Ok(Admission::Pass(v)) => (Action::Pass, v),
            Ok(Admission::Passthrough(v)) => (Action::Passthrough, v),
            // The kernel could not decide: it holds the record like a pass; decide here.
            Ok(Admission::Deferred(v)) => {
                return match gate.take_first_record(stream, &v).await {
                    Ok(mut bytes) => {
                        if !take_header(stream, &mut bytes, conn).await {
                            return FirstRecord::Closed;
                        }
                        self.userspace_first_record(stream, bytes, conn.peer.ip())
                            .await
                    }
                    Err(err) => {
                        tracing::debug!(%err, "reading a deferred first record failed");
                        FirstRecord::Closed
                    }
                };
            }
            // The kernel did not take this socket (a map was full, or it arrived before the
            // listener was registered): decide here instead.
            Ok(Admission::Ungated) => {
                let mut bytes = Vec::new();
                if !take_header(stream, &mut bytes, conn).await {
                    return FirstRecord::Closed;
                }
                return self
                    .userspace_first_record(stream, bytes, conn.peer.ip())
                    .await;
            }
            Ok(Admission::Timeout) => return FirstRecord::Closed,
            Err(err) => {
                tracing::debug!(%err, "kernel gate admission failed");
                return FirstRecord::Closed;
            }
        };
        let reason = kernel.reason;
        if verdict == Action::Drop {
            return FirstRecord::Decided {
                bytes: Vec::new(),
                verdict,
                reason,
                sni: None,
            };
        }
        match gate.take_first_record(stream, &kernel).await {
            Ok(mut bytes) => {
                // The kernel judged the header's client already; userspace checks the header
                // again in full (the kernel leaves part of v1's grammar to it) and believes it.
                if !take_header(stream, &mut bytes, conn).await {
                    return FirstRecord::Closed;
                }
                let sni = match client_hello::peek(&bytes) {
                    Peek::Done(Ok(hello)) => hello.server_name.map(|n| n.as_str().to_owned()),
                    _ => None,
                };
                FirstRecord::Decided {
                    bytes,
                    verdict,
                    reason,
                    sni,
                }
            }
            Err(err) => {
                tracing::debug!(%err, "reading the first record after the kernel verdict failed");
                FirstRecord::Closed
            }
        }
    }

    /// `read_first_record` within the handshake timeout.
    async fn userspace_first_record(
        &self,
        stream: &mut TcpStream,
        bytes: Vec<u8>,
        client: IpAddr,
    ) -> FirstRecord {
        tokio::time::timeout(
            self.handshake_timeout,
            self.read_first_record_from(stream, bytes, client),
        )
        .await
        .unwrap_or(FirstRecord::Closed)
    }

    /// Userspace mode: reads until the first record is whole (or decidable from its header),
    /// then decides with the same policy the kernel applies.
    async fn read_first_record(&self, stream: &mut TcpStream, client: IpAddr) -> FirstRecord {
        self.read_first_record_from(stream, Vec::with_capacity(2048), client)
            .await
    }

    /// `read_first_record`, starting with `bytes` already read.
    async fn read_first_record_from(
        &self,
        stream: &mut TcpStream,
        mut bytes: Vec<u8>,
        client: IpAddr,
    ) -> FirstRecord {
        loop {
            let decision = match client_hello::peek(&bytes) {
                Peek::NeedMore(_) => None,
                Peek::Done(hello) => {
                    let snapshot = self.published.load();
                    let (verdict, reason) = sni::decide_for(&snapshot.sni, &hello, client);
                    let name = hello
                        .as_ref()
                        .ok()
                        .and_then(|h| h.server_name.as_ref())
                        .map(|n| n.as_str().to_owned());
                    Some((verdict, reason, name))
                }
            };
            if let Some((verdict, reason, sni)) = decision {
                return FirstRecord::Decided {
                    bytes,
                    verdict,
                    reason,
                    sni,
                };
            }
            // `peek` never asks for more than one maximal record, so this read is bounded.
            match stream.read_buf(&mut bytes).await {
                Ok(0) | Err(_) => return FirstRecord::Closed,
                Ok(_) => {}
            }
        }
    }

    /// Hands the connection to its passthrough backend and serves it until it ends; in eBPF
    /// mode the kernel splices it.
    async fn pass_through(
        &self,
        stream: TcpStream,
        bytes: Vec<u8>,
        sni: Option<&str>,
        conn: &ConnInfo,
    ) {
        let passthrough = Passthrough {
            published: &self.published,
            metrics: &self.metrics,
            gate: self.gate.as_deref(),
            settings: self.passthrough,
        };
        passthrough.serve(stream, bytes, sni, conn.peer).await;
    }

    /// Resets a connection that will not be served.
    fn close(&self, stream: TcpStream) {
        reset(stream);
    }
}

/// Closes with an RST: SO_LINGER 0 makes close(2) abort the connection instead of a FIN.
pub fn reset(stream: TcpStream) {
    let _ = socket2::SockRef::from(&stream).set_linger(Some(Duration::ZERO));
    drop(stream);
}
