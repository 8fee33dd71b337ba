//! The admin listener: `/healthz` (the process is alive), `/readyz` (a synced snapshot is being
//! served and the process is not draining), `/metrics` (Prometheus text) and `/routes` (what
//! `ingress check` prints, for the live snapshot).
//!
//! ```text
//!   peer ── cap (per peer; all peers but this host's) ── header timeout ── idle timeout
//!     /healthz /readyz   anyone (the kubelet probes the node's address on a hostNetwork pod)
//!     /metrics           anyone unless --admin-remote-access=probes (Prometheus scrapes it)
//!     /routes            loopback only unless --admin-remote-access=all: it lists every host,
//!                        including names the gate hides, Services, pod IPs and Secret names
//! ```
//!
//! It binds `--admin-bind`, apart from the proxy's `--bind`, and every connection is bounded:
//! a client that sends part of a request head, or stops reading a response, is closed.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio::time::{Instant, Sleep};
use tokio_util::sync::CancellationToken;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::check;
use crate::publish::Published;
use crate::telemetry::Telemetry;

/// What the admin listener counts.
#[derive(Default)]
pub struct AdminMetrics {
    /// Connections closed on accept by the per-peer or remote cap.
    pub connections_refused: Counter,
    /// 1 when `/readyz` answers 200 (set on each probe and scrape).
    pub ready: Gauge,
}

impl AdminMetrics {
    pub fn register(registry: &mut Registry) -> AdminMetrics {
        let metrics = AdminMetrics::default();
        registry.register(
            "admin_connections_refused",
            "Admin-port connections closed on accept because their peer (or remote peers together) reached the connection cap",
            metrics.connections_refused.clone(),
        );
        registry.register("ready", "1 when /readyz answers 200", metrics.ready.clone());
        metrics
    }
}

/// Readiness inputs besides the snapshot.
#[derive(Default)]
pub struct Health {
    listening: AtomicBool,
    draining: AtomicBool,
}

impl Health {
    pub fn set_listening(&self) {
        self.listening.store(true, Ordering::Release);
    }

    pub fn set_draining(&self) {
        self.draining.store(true, Ordering::Release);
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }

    /// Why the process is not ready, or `None` if it is.
    fn not_ready(&self, published: &Published) -> Option<&'static str> {
        if self.draining.load(Ordering::Acquire) {
            Some("draining")
        } else if !published.has_synced() {
            Some("waiting for the first snapshot")
        } else if !self.listening.load(Ordering::Acquire) {
            Some("listeners not bound")
        } else {
            None
        }
    }
}

/// Which admin paths answer peers other than loopback (`--admin-remote-access`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RemoteAccess {
    /// `/healthz` and `/readyz` only.
    Probes,
    /// The probes and `/metrics`.
    #[default]
    Metrics,
    /// Everything, `/routes` included.
    All,
}

impl RemoteAccess {
    /// Whether `path` answers a peer that is not on loopback.
    fn allows(self, path: &str) -> bool {
        match path {
            "/healthz" | "/readyz" => true,
            "/metrics" => self != RemoteAccess::Probes,
            _ => self == RemoteAccess::All,
        }
    }
}

/// A request head must arrive whole within this long, and the next one on a kept-alive
/// connection too (hyper restarts the timer when a connection goes idle).
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
/// A connection on which no byte moves either way for this long (a client that stopped
/// reading its response) is closed.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// Open connections from one peer address.
pub const MAX_CONNECTIONS_PER_PEER: usize = 8;
/// Open connections from peers other than this host: a remote client cannot crowd out the
/// kubelet's probes, which come from this host's own address.
pub const MAX_REMOTE_CONNECTIONS: usize = 64;
/// Largest request head buffered, in bytes.
const MAX_HEAD_BYTES: usize = 16 * 1024;

pub struct Admin {
    pub published: Arc<Published>,
    pub telemetry: Arc<Telemetry>,
    pub metrics: AdminMetrics,
    pub health: Arc<Health>,
    pub remote_access: RemoteAccess,
    /// Open connections by peer address.
    open: Mutex<HashMap<IpAddr, usize>>,
}

impl Admin {
    pub fn new(
        published: Arc<Published>,
        telemetry: Arc<Telemetry>,
        metrics: AdminMetrics,
        health: Arc<Health>,
        remote_access: RemoteAccess,
    ) -> Self {
        Self {
            published,
            telemetry,
            metrics,
            health,
            remote_access,
            open: Mutex::new(HashMap::new()),
        }
    }

    pub async fn serve(self: Arc<Self>, listener: TcpListener, stop: CancellationToken) {
        loop {
            let (stream, peer) = tokio::select! {
                () = stop.cancelled() => return,
                accepted = listener.accept() => match accepted {
                    Ok(pair) => pair,
                    Err(err) => {
                        tracing::warn!(%err, "admin accept failed");
                        continue;
                    }
                },
            };
            let local = stream
                .local_addr()
                .map(|a| a.ip())
                .unwrap_or(IpAddr::from([0, 0, 0, 0]));
            let Some(slot) = self.clone().admit(peer.ip(), local) else {
                self.metrics.connections_refused.inc();
                tracing::debug!(%peer, "admin connection limit reached; closed");
                drop(stream);
                continue;
            };
            let admin = self.clone();
            let loopback = is_loopback(peer.ip());
            tokio::spawn(async move {
                let service = service_fn(move |req| {
                    let admin = admin.clone();
                    async move { Ok::<_, Infallible>(admin.answer(&req, loopback)) }
                });
                if let Err(err) = http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(HEADER_TIMEOUT)
                    .max_buf_size(MAX_HEAD_BYTES)
                    .serve_connection(
                        TokioIo::new(IdleTimeout::new(stream, IDLE_TIMEOUT)),
                        service,
                    )
                    .await
                {
                    tracing::debug!(%err, %peer, "admin connection closed");
                }
                drop(slot);
            });
        }
    }

    /// Takes a connection slot for `peer`, or `None` if it is over its cap. A peer on loopback
    /// or on this host's own address (`local`, the address it connected to) only counts
    /// against the per-peer cap.
    fn admit(self: Arc<Self>, peer: IpAddr, local: IpAddr) -> Option<Slot> {
        let this_host = is_loopback(peer) || peer == local;
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let remote: usize = open
            .iter()
            .filter(|(ip, _)| !is_loopback(**ip))
            .map(|(_, n)| *n)
            .sum();
        let from_peer = open.get(&peer).copied().unwrap_or(0);
        if from_peer >= MAX_CONNECTIONS_PER_PEER || (!this_host && remote >= MAX_REMOTE_CONNECTIONS)
        {
            return None;
        }
        *open.entry(peer).or_default() += 1;
        drop(open);
        Some(Slot { admin: self, peer })
    }

    fn answer(&self, req: &Request<Incoming>, loopback: bool) -> Response<Full<Bytes>> {
        if req.method() != Method::GET && req.method() != Method::HEAD {
            return text(StatusCode::METHOD_NOT_ALLOWED, "GET only\n".into());
        }
        let path = req.uri().path();
        if !loopback && !self.remote_access.allows(path) {
            return text(
                StatusCode::FORBIDDEN,
                "answered on loopback only (see --admin-remote-access)\n".into(),
            );
        }
        match path {
            "/healthz" => text(StatusCode::OK, "ok\n".into()),
            "/readyz" => {
                let reason = self.health.not_ready(&self.published);
                self.metrics.ready.set(i64::from(reason.is_none()));
                match reason {
                    None => text(StatusCode::OK, "ready\n".into()),
                    Some(why) => text(
                        StatusCode::SERVICE_UNAVAILABLE,
                        format!("not ready: {why}\n"),
                    ),
                }
            }
            "/metrics" => {
                self.metrics
                    .ready
                    .set(i64::from(self.health.not_ready(&self.published).is_none()));
                let mut response = text(StatusCode::OK, self.telemetry.encode());
                response.headers_mut().insert(
                    header::CONTENT_TYPE,
                    header::HeaderValue::from_static(
                        "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    ),
                );
                response
            }
            "/routes" => {
                let snapshot = self.published.load_full();
                text(
                    StatusCode::OK,
                    check::render_text(&check::report(&snapshot)),
                )
            }
            _ => text(
                StatusCode::NOT_FOUND,
                "not found: try /healthz /readyz /metrics /routes\n".into(),
            ),
        }
    }
}

/// An admitted connection; gives its slot back when the connection ends.
struct Slot {
    admin: Arc<Admin>,
    peer: IpAddr,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut open = self.admin.open.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = open.get_mut(&self.peer) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                open.remove(&self.peer);
            }
        }
    }
}

/// Loopback, including IPv4-mapped IPv6 loopback (`::ffff:127.0.0.1`) from a dual-stack socket.
fn is_loopback(ip: IpAddr) -> bool {
    crate::snapshot::address::canonical(ip).is_loopback()
}

/// Fails reads and writes once nothing has moved for `timeout`, so a peer that stalls halfway
/// through a response cannot hold its connection open.
struct IdleTimeout<T> {
    io: T,
    timeout: Duration,
    sleep: Pin<Box<Sleep>>,
}

impl<T> IdleTimeout<T> {
    fn new(io: T, timeout: Duration) -> Self {
        Self {
            io,
            timeout,
            sleep: Box::pin(tokio::time::sleep(timeout)),
        }
    }

    /// On progress, pushes the deadline back; while waiting, fails once it has passed.
    fn watch<R>(
        &mut self,
        cx: &mut Context<'_>,
        poll: Poll<std::io::Result<R>>,
    ) -> Poll<std::io::Result<R>> {
        match poll {
            Poll::Ready(result) => {
                let deadline = Instant::now() + self.timeout;
                self.sleep.as_mut().reset(deadline);
                Poll::Ready(result)
            }
            Poll::Pending => match self.sleep.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "admin connection idle",
                ))),
                Poll::Pending => Poll::Pending,
            },
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for IdleTimeout<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = &mut *self;
        let poll = Pin::new(&mut this.io).poll_read(cx, buf);
        this.watch(cx, poll)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for IdleTimeout<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = &mut *self;
        let poll = Pin::new(&mut this.io).poll_write(cx, buf);
        this.watch(cx, poll)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = &mut *self;
        let poll = Pin::new(&mut this.io).poll_flush(cx);
        this.watch(cx, poll)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

fn text(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}
