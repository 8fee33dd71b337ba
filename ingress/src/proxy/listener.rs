//! Accept loops. Each accepted connection gets its own task; the loop itself only accepts, so a
//! slow handshake never delays the next client.
//!
//! ```text
//!   accept → connection caps (caps.rs: over --max-connections or --max-connections-per-client:
//!            closed at once, counted) → screen (the kernel gate's early verdict: reset before
//!            a task exists) → task: handshake (TLS) → HTTP/1.x (h1) or HTTP/2 (h2)
//! ```
//!
//! Shutdown: the loop stops accepting when told to, then every open connection is asked to
//! finish its in-flight requests for at most the drain timeout: idle HTTP/1.x connections close
//! at once, busy ones after their response (with `Connection: close`), and HTTP/2 ones after a
//! GOAWAY and their open streams.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::caps::{ConnectionCaps, Permit};
use super::h1;
use super::metrics::{ListenerLabels, ProxyMetrics, RefusedLabels};
use super::proxy_protocol;
use super::rewind::Rewind;
pub use super::settings::HttpSettings;
use super::{ConnInfo, Proxy, h2};

/// What every connection is served with.
pub struct Serving {
    pub proxy: Arc<Proxy>,
    pub http: HttpSettings,
    h2: hyper::server::conn::http2::Builder<hyper_util::rt::TokioExecutor>,
}

impl Serving {
    pub fn new(proxy: Arc<Proxy>, http: HttpSettings) -> Self {
        Self {
            h2: h2::builder(&http),
            proxy,
            http,
        }
    }

    async fn serve<IO>(&self, io: IO, conn: ConnInfo, stop: &CancellationToken)
    where
        IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let io = if conn.h2 {
            Rewind::new(bytes::Bytes::new(), io)
        } else {
            match h1::serve(&self.proxy, io, &conn, &self.http, stop).await {
                h1::Ended::Closed => return,
                h1::Ended::H2c(io) => io,
            }
        };
        h2::serve(self.proxy.clone(), &self.h2, io, conn, &self.http, stop).await;
    }
}

/// Reads the connection's PROXY protocol header and makes the client it names the connection's
/// client, counted against its own cap. `false`: the connection is to be closed (logged and
/// counted here).
async fn believe_proxy_header(
    stream: &mut TcpStream,
    conn: &mut ConnInfo,
    permit: &mut Permit,
    timeout: Duration,
    listener: &'static str,
    metrics: &ProxyMetrics,
    proxy: &Proxy,
) -> bool {
    let result = proxy_protocol::read_header(stream, timeout).await;
    believe(result, conn, permit, listener, metrics, proxy)
}

/// Acts on a PROXY protocol header read: the client it names becomes the connection's client
/// when the peer is trusted to name it, counted against its own cap. `false`: the connection
/// is to be closed (logged and counted here).
fn believe(
    result: Result<Option<std::net::SocketAddr>, proxy_protocol::ProxyHeaderError>,
    conn: &mut ConnInfo,
    permit: &mut Permit,
    listener: &'static str,
    metrics: &ProxyMetrics,
    proxy: &Proxy,
) -> bool {
    match result {
        Ok(source) => {
            if let Some(client) = source {
                if proxy.believes_proxy_header_from(conn.peer.ip()) {
                    conn.believe(client);
                } else {
                    tracing::debug!(listener, peer = %conn.peer, named = %client, "PROXY protocol header from a peer outside proxy-real-ip-cidr: the peer stays the client");
                }
            }
            match permit.claim_client(conn.peer.ip()) {
                Ok(()) => true,
                Err(refused) => {
                    metrics
                        .connections_refused
                        .get_or_create(&RefusedLabels {
                            listener,
                            reason: refused.as_str(),
                        })
                        .inc();
                    tracing::debug!(listener, client = %conn.peer, reason = refused.as_str(), "connection refused");
                    false
                }
            }
        }
        Err(err) => {
            metrics
                .proxy_protocol_errors
                .get_or_create(&RefusedLabels {
                    listener,
                    reason: err.as_str(),
                })
                .inc();
            tracing::debug!(listener, peer = %conn.peer, %err, "connection closed: no valid PROXY protocol header");
            false
        }
    }
}

/// The PROXY protocol step for a handshake that reads the header itself (see
/// [`Handshake::reads_proxy_header`]).
pub struct ProxyHeaderStep<'a> {
    permit: &'a mut Permit,
    timeout: Duration,
    listener: &'static str,
    metrics: &'a ProxyMetrics,
    proxy: &'a Proxy,
}

impl ProxyHeaderStep<'_> {
    /// Takes the header off `taken` (bytes already read, which start with it) or, when they
    /// hold none of it yet, off the socket; whatever followed it stays in `taken`. Then as
    /// `believe_proxy_header`: `false` closes the connection.
    pub async fn run(
        self,
        stream: &mut TcpStream,
        taken: &mut Vec<u8>,
        conn: &mut ConnInfo,
    ) -> bool {
        let result = proxy_protocol::take_header(stream, taken, self.timeout).await;
        believe(
            result,
            conn,
            self.permit,
            self.listener,
            self.metrics,
            self.proxy,
        )
    }
}

/// Turns an accepted TCP connection into the stream HTTP is spoken over (plain, or TLS).
pub trait Handshake: Send + Sync + 'static {
    type Io: AsyncRead + AsyncWrite + Unpin + Send + 'static;
    /// What `screen` learned, for `handshake`.
    type Screened: Send + 'static;
    /// Runs in the accept loop, before the connection has a task: it must not block. `None`
    /// means it closed the connection (and logged and counted why).
    fn screen(
        &self,
        stream: std::net::TcpStream,
        conn: &ConnInfo,
    ) -> Option<(std::net::TcpStream, Self::Screened)>;
    /// With `--use-proxy-protocol`: whether `handshake` reads the PROXY protocol header
    /// itself, with the step it is then given. The kernel gate frames the header together
    /// with the first record, so nothing may read it off the socket before the verdict.
    fn reads_proxy_header(&self) -> bool {
        false
    }
    /// `None` closes the connection (the reason is logged and counted by the implementation).
    /// `header` is `Some` only when `reads_proxy_header` and the listener expects one.
    fn handshake(
        &self,
        stream: TcpStream,
        screened: Self::Screened,
        conn: ConnInfo,
        header: Option<ProxyHeaderStep<'_>>,
    ) -> impl Future<Output = Option<(Self::Io, ConnInfo)>> + Send;
}

/// Plain HTTP: nothing to do.
pub struct Plain;

impl Handshake for Plain {
    type Io = TcpStream;
    type Screened = ();
    fn screen(
        &self,
        stream: std::net::TcpStream,
        _: &ConnInfo,
    ) -> Option<(std::net::TcpStream, ())> {
        Some((stream, ()))
    }
    async fn handshake(
        &self,
        stream: TcpStream,
        (): (),
        conn: ConnInfo,
        _: Option<ProxyHeaderStep<'_>>,
    ) -> Option<(Self::Io, ConnInfo)> {
        Some((stream, conn))
    }
}

pub struct Listener<H> {
    pub name: &'static str,
    pub listener: TcpListener,
    pub handshake: Arc<H>,
    pub https: bool,
    /// Shared by every listener: the caps are per process.
    pub caps: Arc<ConnectionCaps>,
    /// `--proxy-protocol-header-timeout`: how long a PROXY protocol header may take, when the
    /// published snapshot says connections start with one (`use-proxy-protocol`).
    pub proxy_header_timeout: Duration,
}

impl<H: Handshake> Listener<H> {
    pub async fn run(
        self,
        serving: Arc<Serving>,
        metrics: Arc<ProxyMetrics>,
        stop: CancellationToken,
        drain_timeout: Duration,
    ) {
        let connections = TaskTracker::new();
        let labels = ListenerLabels {
            listener: self.name,
        };
        let local_port = self
            .listener
            .local_addr()
            .map(|a| a.port())
            .unwrap_or_default();
        let listener = match self.listener.into_std().and_then(|l| {
            // SAFETY: the AsyncFd owns the listener, so its fd stays open and unchanged.
            unsafe { AsyncFd::register(l) }.map_err(|e| e.into_parts().1)
        }) {
            Ok(listener) => listener,
            Err(err) => {
                tracing::error!(listener = self.name, %err, "cannot watch the listening socket");
                return;
            }
        };
        loop {
            let (stream, peer) = tokio::select! {
                () = stop.cancelled() => break,
                accepted = accept(&listener) => match accepted {
                    Ok(pair) => pair,
                    Err(err) => {
                        // EMFILE and friends: back off briefly instead of spinning.
                        tracing::warn!(listener = self.name, %err, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
            };
            metrics.connections.get_or_create(&labels).inc();
            // Read at each accept, so a ConfigMap change applies to the next connection, from
            // the same snapshot the kernel gate was set from.
            let proxy_protocol = serving
                .proxy
                .published
                .load()
                .global
                .proxy_protocol
                .then_some(self.proxy_header_timeout);
            // Behind the PROXY protocol the peer is the load balancer: the client is counted
            // once its header names it.
            let admitted = match proxy_protocol {
                Some(_) => self.caps.admit_total(),
                None => self.caps.admit(peer.ip()),
            };
            let mut permit = match admitted {
                Ok(permit) => permit,
                Err(refused) => {
                    metrics
                        .connections_refused
                        .get_or_create(&RefusedLabels {
                            listener: self.name,
                            reason: refused.as_str(),
                        })
                        .inc();
                    tracing::debug!(listener = self.name, %peer, reason = refused.as_str(), "connection refused");
                    drop(stream);
                    continue;
                }
            };
            let conn = ConnInfo::new(peer, local_port, self.https);
            let Some((stream, screened)) = self.handshake.screen(stream, &conn) else {
                continue;
            };
            let stream = match TcpStream::from_std(stream) {
                Ok(stream) => stream,
                Err(err) => {
                    tracing::warn!(listener = self.name, %err, "cannot register a connection");
                    continue;
                }
            };
            let _ = stream.set_nodelay(true);
            let handshake = self.handshake.clone();
            let serving = serving.clone();
            let stop = stop.clone();
            let active = metrics.connections_active.get_or_create(&labels).clone();
            let (caps, metrics) = (self.caps.clone(), metrics.clone());
            let name = self.name;
            connections.spawn(async move {
                active.inc();
                let mut stream = stream;
                let mut conn = conn;
                let reads_header = handshake.reads_proxy_header();
                let believed = match proxy_protocol {
                    Some(timeout) if !reads_header => {
                        believe_proxy_header(
                            &mut stream,
                            &mut conn,
                            &mut permit,
                            timeout,
                            name,
                            &metrics,
                            &serving.proxy,
                        )
                        .await
                    }
                    _ => true,
                };
                let step = match proxy_protocol {
                    Some(timeout) if reads_header => Some(ProxyHeaderStep {
                        permit: &mut permit,
                        timeout,
                        listener: name,
                        metrics: &metrics,
                        proxy: &serving.proxy,
                    }),
                    _ => None,
                };
                if believed
                    && let Some((io, conn)) =
                        handshake.handshake(stream, screened, conn, step).await
                {
                    serving.serve(io, conn, &stop).await;
                }
                active.dec();
                drop(permit);
                drop(caps);
            });
        }
        drop(listener);
        tracing::info!(
            listener = self.name,
            "stopped accepting; draining open connections"
        );
        connections.close();
        if tokio::time::timeout(drain_timeout, connections.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                listener = self.name,
                ?drain_timeout,
                "drain timeout reached; closing remaining connections"
            );
        }
    }
}

/// Accepts one connection as a plain non-blocking socket, not yet known to the reactor.
async fn accept(
    listener: &AsyncFd<std::net::TcpListener>,
) -> std::io::Result<(std::net::TcpStream, std::net::SocketAddr)> {
    loop {
        let mut ready = listener.readable().await?;
        let accepted = ready.try_io(|l| {
            let (socket, addr) = socket2::SockRef::from(l.get_ref())
                .accept4(libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC)?;
            let peer = addr.as_socket().ok_or_else(|| {
                std::io::Error::new(std::io::ErrorKind::InvalidData, "not an IP peer")
            })?;
            Ok((std::net::TcpStream::from(socket), peer))
        });
        match accepted {
            Ok(result) => return result,
            // Readiness was stale: wait again.
            Err(_would_block) => continue,
        }
    }
}

/// Holds connections back in the kernel until their first bytes arrive (or `wait` passes),
/// as TCP_DEFER_ACCEPT does: for a protocol where the client speaks first.
pub fn defer_accept(listener: &TcpListener, wait: Duration) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let seconds = libc::c_int::try_from(wait.as_secs().max(1)).unwrap_or(libc::c_int::MAX);
    // SAFETY: a valid socket fd and a pointer to a c_int of the stated size.
    let rc = unsafe {
        libc::setsockopt(
            listener.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_DEFER_ACCEPT,
            std::ptr::from_ref(&seconds).cast(),
            4, // size_of::<c_int>()
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}
