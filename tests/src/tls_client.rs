//! Clients of a gated HTTPS port, as the gate and passthrough tests drive it: raw bytes (a
//! corpus ClientHello, garbage) and how the connection ended; a rustls handshake and one
//! request; writes cut into pieces, as a slow or fragmenting client sends them; and a plain
//! HTTP request.

use std::collections::VecDeque;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant};

use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use crate::netns::SERVER_IP;
use crate::pki::Ca;

/// How long one read, handshake or response may take before the client gives up.
const WAIT: Duration = Duration::from_secs(5);

/// How a connection that sent raw bytes ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ending {
    /// ECONNRESET, this long after the last byte was written.
    Reset(Duration),
    /// FIN without data.
    Closed,
    /// The server sent bytes back (a ServerHello, an alert…): the first ones.
    Answered(Vec<u8>),
    Silent,
}

/// Writes `chunks` (pausing between them) and reports what came back.
pub async fn send_raw(mut stream: TcpStream, chunks: &[&[u8]], pause: Duration) -> Ending {
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
    match tokio::time::timeout(WAIT, stream.read(&mut buf)).await {
        Err(_) => Ending::Silent,
        Ok(Ok(0)) => Ending::Closed,
        Ok(Ok(n)) => Ending::Answered(buf[..n].to_vec()),
        Ok(Err(e)) if e.kind() == io::ErrorKind::ConnectionReset => Ending::Reset(sent.elapsed()),
        Ok(Err(e)) => panic!("client read: {e}"),
    }
}

/// A refusal the client saw at once: a reset within 50 ms of its last byte.
pub fn assert_fast_reset(ending: &Ending, what: &str) {
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

/// What a client making an HTTPS request saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The response status.
    Served(u16),
    /// Reset before the handshake finished.
    Reset,
    Failed(String),
}

/// rustls client configurations: one that verifies against the test CA, one that accepts
/// anything (for connections without SNI, which get the default certificate).
#[derive(Clone)]
pub struct Clients {
    pub verified: Arc<rustls::ClientConfig>,
    pub any: Arc<rustls::ClientConfig>,
}

impl Clients {
    pub fn new(ca: &Ca) -> Clients {
        Clients {
            verified: ca.client_config(&[b"http/1.1"]),
            any: crate::pki::any_server_config(&[b"http/1.1"]),
        }
    }

    /// Both configurations accept any certificate: for names the CA's leaf does not cover.
    pub fn unverified(&self) -> Clients {
        Clients {
            verified: self.any.clone(),
            any: self.any.clone(),
        }
    }
}

/// A TLS handshake (SNI `sni`, or none with the permissive config), then `GET /` with `Host:
/// host` and `Connection: close`.
pub async fn https_get<S>(stream: S, clients: &Clients, sni: Option<&str>, host: &str) -> Outcome
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
    let mut tls = match tokio::time::timeout(WAIT * 2, connect).await {
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
        match tokio::time::timeout(WAIT * 2, tls.read(&mut buf)).await {
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
    status_of(&response)
}

/// `GET /` over plain HTTP with `Host: host`.
pub async fn http_get(mut stream: TcpStream, host: &str) -> Outcome {
    let request = format!("GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    if let Err(e) = stream.write_all(request.as_bytes()).await {
        return Outcome::Failed(format!("write: {e}"));
    }
    let mut response = Vec::new();
    match tokio::time::timeout(WAIT, stream.read_to_end(&mut response)).await {
        Err(_) => return Outcome::Failed("response timed out".into()),
        Ok(Err(e)) if e.kind() == io::ErrorKind::ConnectionReset => return Outcome::Reset,
        Ok(Err(e)) => return Outcome::Failed(format!("read: {e}")),
        Ok(Ok(_)) => {}
    }
    status_of(&response)
}

fn status_of(response: &[u8]) -> Outcome {
    let text = String::from_utf8_lossy(response);
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
pub struct Pieces<S> {
    inner: S,
    cuts: VecDeque<usize>,
    written: usize,
    pause: Duration,
    sleep: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<S> Pieces<S> {
    /// `inner`, cut after each of the byte offsets `cuts` (ascending), with `pause` after each.
    pub fn new(inner: S, cuts: &[usize], pause: Duration) -> Pieces<S> {
        Pieces {
            inner,
            cuts: cuts.iter().copied().collect(),
            written: 0,
            pause,
            sleep: None,
        }
    }
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

/// A stream whose first write goes out with `prefix` in front of it, in one write: a PROXY
/// protocol header and the ClientHello in the same segment, as a load balancer sends them.
pub struct Prefixed<S> {
    inner: S,
    prefix: Vec<u8>,
    /// The first write's bytes, behind the prefix, still to go out; and how many were the
    /// caller's.
    pending: Vec<u8>,
    theirs: usize,
}

impl<S> Prefixed<S> {
    pub fn new(inner: S, prefix: &[u8]) -> Prefixed<S> {
        Prefixed {
            inner,
            prefix: prefix.to_vec(),
            pending: Vec::new(),
            theirs: 0,
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Prefixed<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        if !this.prefix.is_empty() {
            this.pending = std::mem::take(&mut this.prefix);
            this.pending.extend_from_slice(buf);
            this.theirs = buf.len();
        }
        if this.pending.is_empty() {
            return Pin::new(&mut this.inner).poll_write(cx, buf);
        }
        // The caller writes the same bytes again after a Pending, as AsyncWrite requires.
        while !this.pending.is_empty() {
            let n = ready!(Pin::new(&mut this.inner).poll_write(cx, &this.pending))?;
            this.pending.drain(..n);
        }
        Poll::Ready(Ok(this.theirs))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Prefixed<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

/// A real ClientHello for `name`, as rustls writes it.
pub fn client_hello(name: &str) -> Vec<u8> {
    let config = Ca::new("unused").client_config(&[]);
    let mut conn = rustls::ClientConnection::new(
        config,
        ServerName::try_from(name.to_string()).expect("a DNS name"),
    )
    .expect("a client connection");
    let mut out = Vec::new();
    conn.write_tls(&mut out).expect("write the ClientHello");
    out
}
