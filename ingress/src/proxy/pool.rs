//! Upstream HTTP/1.1 connections for HTTP/2 requests: one keep-alive pool per endpoint, with
//! each connection driven inline by the task that uses it.
//!
//! ```text
//!   checkout(endpoint) ── idle connection (still open?) ──┐
//!                     └── none: connect (timeout) ────────┤
//!   send: poll the connection and the response together ──┤  one task, no hand-off
//!   response body: polls the connection as it streams ────┤
//!   body finished and connection reusable → back to idle ─┘  (dropped early → closed)
//! ```
//!
//! hyper's pooled client runs every connection as its own task and hands each request to it
//! through a channel, which costs two task wake-ups per request; a proxy forwarding small
//! requests spends a large share of its time there. Driving the connection from the request's
//! own task removes both, and hyper still does all of the HTTP/1.1 work.

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::FutureExt;
use http::{Request, Response};
use http_body_util::BodyExt;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::client::conn::{TrySendError, http1};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use super::upstream::UpstreamError;
use crate::snapshot::backend::ExternalName;

/// Boxed: the connection's state is large, and a checked-out connection travels inside the
/// response body, which is moved several times per request.
type Conn = Box<http1::Connection<TokioIo<TcpStream>, RequestBody>>;

/// A client's request body on its way upstream, failing if the client pauses too long.
pub type RequestBody = super::idle::IdleBody<Incoming>;

/// Where a pooled connection goes: an endpoint address, or a DNS name for ExternalName.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum PoolKey {
    Addr(SocketAddr),
    Name(Arc<ExternalName>),
}

impl std::fmt::Display for PoolKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PoolKey::Addr(a) => write!(f, "{a}"),
            PoolKey::Name(name) => write!(f, "{name}"),
        }
    }
}

pub struct Pool {
    idle: Mutex<HashMap<PoolKey, Vec<Idle>, foldhash::fast::RandomState>>,
    settings: PoolSettings,
}

#[derive(Clone, Debug)]
pub struct PoolSettings {
    pub connect_timeout: Duration,
    /// Idle connections older than this are closed rather than reused; below the 60 s most
    /// servers use, so the upstream rarely closes a connection we are about to use.
    pub idle_timeout: Duration,
    pub max_idle_per_endpoint: usize,
}

struct Idle {
    sender: http1::SendRequest<RequestBody>,
    conn: Conn,
    since: Instant,
}

/// A connection checked out for one request.
pub struct Checked {
    sender: http1::SendRequest<RequestBody>,
    conn: Conn,
    key: PoolKey,
    pool: Arc<Pool>,
    /// It served a request before, so a failure to send may just mean the upstream closed it.
    reused: bool,
}

impl Pool {
    pub fn new(settings: PoolSettings) -> Arc<Self> {
        Arc::new(Self {
            idle: Mutex::new(HashMap::default()),
            settings,
        })
    }

    /// Sends `req` to `key` and returns the response, whose body keeps the connection going. A
    /// request that a reused connection could not even start is retried once on a new one.
    pub async fn send(
        self: &Arc<Self>,
        key: PoolKey,
        req: Request<RequestBody>,
    ) -> Result<Response<UpstreamBody>, UpstreamError> {
        let mut checked = self.checkout(&key).await?;
        let outcome = checked.send(req).await;
        match outcome {
            Ok(response) => Ok(response.map(|body| UpstreamBody {
                body,
                checked: Some(checked),
                done: false,
            })),
            Err(mut err) if checked.reused => match err.take_message() {
                Some(req) => {
                    drop(checked);
                    let mut fresh = self.connect(&key).await?;
                    match fresh.send(req).await {
                        Ok(response) => Ok(response.map(|body| UpstreamBody {
                            body,
                            checked: Some(fresh),
                            done: false,
                        })),
                        Err(err) => Err(UpstreamError::from_hyper(err.into_error())),
                    }
                }
                None => Err(UpstreamError::from_hyper(err.into_error())),
            },
            Err(err) => Err(UpstreamError::from_hyper(err.into_error())),
        }
    }

    async fn checkout(self: &Arc<Self>, key: &PoolKey) -> Result<Checked, UpstreamError> {
        while let Some(mut idle) = self.pop(key) {
            // Let the connection notice a close that arrived while it sat idle.
            let closed = (&mut idle.conn).now_or_never().is_some();
            if !closed
                && idle.sender.is_ready()
                && idle.since.elapsed() < self.settings.idle_timeout
            {
                return Ok(Checked {
                    sender: idle.sender,
                    conn: idle.conn,
                    key: key.clone(),
                    pool: self.clone(),
                    reused: true,
                });
            }
        }
        self.connect(key).await
    }

    fn pop(&self, key: &PoolKey) -> Option<Idle> {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        idle.get_mut(key).and_then(Vec::pop)
    }

    async fn connect(self: &Arc<Self>, key: &PoolKey) -> Result<Checked, UpstreamError> {
        let stream = self.open(key).await?;
        let (sender, conn) = http1::Builder::new()
            .handshake(TokioIo::new(stream))
            .await
            .map_err(UpstreamError::from_hyper)?;
        Ok(Checked {
            sender,
            conn: Box::new(conn),
            key: key.clone(),
            pool: self.clone(),
            reused: false,
        })
    }

    async fn open(&self, key: &PoolKey) -> Result<TcpStream, UpstreamError> {
        open(key, self.settings.connect_timeout).await
    }

    fn checkin(&self, checked: Checked) {
        let Checked {
            sender, conn, key, ..
        } = checked;
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        let list = idle.entry(key).or_default();
        if list.len() < self.settings.max_idle_per_endpoint {
            list.push(Idle {
                sender,
                conn,
                since: Instant::now(),
            });
        }
    }

    /// Idle connections held right now, for tests and metrics.
    pub fn idle_count(&self) -> usize {
        self.idle
            .lock()
            .map(|i| i.values().map(Vec::len).sum())
            .unwrap_or(0)
    }
}

/// Opens a new connection to `key`, with Nagle off: requests and responses are written whole.
/// Both HTTP paths (hyper's and the HTTP/1.1 fast path) connect through here.
pub async fn open(key: &PoolKey, timeout: Duration) -> Result<TcpStream, UpstreamError> {
    let connect = async {
        let stream = match key {
            // Endpoint addresses were judged when the snapshot was built.
            PoolKey::Addr(addr) => TcpStream::connect(addr)
                .await
                .map_err(|e| UpstreamError::Connect(e.to_string()))?,
            PoolKey::Name(name) => connect_to_any(&resolve_external(name).await?).await?,
        };
        let _ = stream.set_nodelay(true);
        Ok(stream)
    };
    tokio::time::timeout(timeout, connect)
        .await
        .map_err(|_| UpstreamError::ConnectTimeout)?
}

/// Resolves an ExternalName with the system resolver (on each new connection, so DNS changes
/// apply) and judges every address it returns: one refused address refuses the name, since a
/// name that resolves to this node's loopback is a mistake or an attack either way. The caller
/// connects to the addresses returned, never to the name, so what was judged is what is used.
pub async fn resolve_external(name: &ExternalName) -> Result<Vec<SocketAddr>, UpstreamError> {
    let addrs: Vec<SocketAddr> = tokio::net::lookup_host((name.host.as_str(), name.port))
        .await
        .map_err(|e| UpstreamError::Connect(format!("resolving {name}: {e}")))?
        .collect();
    for addr in &addrs {
        if let Err(refusal) = name.addresses.check(addr.ip()) {
            tracing::warn!(
                external_name = %name,
                addr = %addr.ip(),
                reason = refusal.as_str(),
                "ExternalName resolved to an address refused as a backend (--allow-local-backends)"
            );
            return Err(UpstreamError::AddressRefused {
                name: name.to_string(),
                addr: addr.ip(),
                refusal,
            });
        }
    }
    Ok(addrs)
}

/// Connects to the first address that accepts, in the resolver's order.
pub async fn connect_to_any(addrs: &[SocketAddr]) -> Result<TcpStream, UpstreamError> {
    let mut last = None;
    for addr in addrs {
        match TcpStream::connect(addr).await {
            Ok(stream) => return Ok(stream),
            Err(err) => last = Some(err),
        }
    }
    Err(UpstreamError::Connect(match last {
        Some(err) => err.to_string(),
        None => "the name resolved to no address".into(),
    }))
}

impl Checked {
    /// Polls the connection while waiting for the response head.
    async fn send(
        &mut self,
        req: Request<RequestBody>,
    ) -> Result<Response<Incoming>, TrySendError<Request<RequestBody>>> {
        let response = self.sender.try_send_request(req);
        let mut response = std::pin::pin!(response);
        let conn = &mut self.conn;
        let mut conn_done = false;
        std::future::poll_fn(|cx| {
            if !conn_done && let Poll::Ready(result) = Pin::new(&mut *conn).poll(cx) {
                conn_done = true;
                if let Err(err) = result {
                    tracing::debug!(%err, "upstream connection ended");
                }
            }
            response.as_mut().poll(cx)
        })
        .await
    }
}

/// A response body from a pooled connection. Polling it drives the connection; when it ends
/// cleanly the connection goes back to the pool, and if it is dropped early the connection is
/// closed, since a half-read response cannot be resumed.
pub struct UpstreamBody {
    body: Incoming,
    checked: Option<Checked>,
    done: bool,
}

impl UpstreamBody {
    fn finish(&mut self) {
        self.done = true;
        if let Some(mut checked) = self.checked.take() {
            // One more turn lets hyper move the connection to idle so it reports ready.
            let closed = (&mut checked.conn).now_or_never().is_some();
            if !closed && checked.sender.is_ready() {
                checked.pool.clone().checkin(checked);
            }
        }
    }
}

impl Body for UpstreamBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = &mut *self;
        if let Some(checked) = this.checked.as_mut()
            && let Poll::Ready(result) = Pin::new(&mut checked.conn).poll(cx)
        {
            // The connection finished (closed or failed); the body reports any error itself.
            if let Err(err) = result {
                tracing::debug!(%err, "upstream connection ended mid-body");
            }
            this.checked = None;
        }
        let frame = Pin::new(&mut this.body).poll_frame(cx);
        if let Poll::Ready(None) = frame {
            this.finish();
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        self.done || self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

impl Drop for UpstreamBody {
    fn drop(&mut self) {
        // Bodies that are empty by definition (HEAD, 204, 304) are never polled to the end.
        if !self.done && self.body.is_end_stream() {
            self.finish();
        }
    }
}

/// Collects a body; used by tests.
pub async fn collect(body: UpstreamBody) -> Result<Bytes, hyper::Error> {
    Ok(body.collect().await?.to_bytes())
}
