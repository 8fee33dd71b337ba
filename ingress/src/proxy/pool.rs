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
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
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

use super::connect::{Connectors, Transport, UpstreamStream};
pub use super::connect::{PoolKey, connect_to_any, open, resolve_external};
use super::upstream::UpstreamError;
use crate::publish::PublishHook;
use crate::snapshot::Snapshot;
use crate::snapshot::global::UpstreamKeepalive;
use crate::snapshot::policy::Wire;

/// Idle connections are kept per endpoint and transport.
type IdleKey = (PoolKey, Transport);

/// Boxed: the connection's state is large, and a checked-out connection travels inside the
/// response body, which is moved several times per request.
type Conn = Box<http1::Connection<TokioIo<UpstreamStream>, RequestBody>>;

/// A client's request body on its way upstream, failing if the client pauses too long.
pub type RequestBody = super::idle::IdleBody<ClientBody>;

/// A request body as a client sends it: an HTTP/2 stream's (hyper's), or one the HTTP/1.x path
/// reads itself and hands over a piece at a time (`h1::bridge`, for HTTP/2-only upstreams).
pub enum ClientBody {
    /// None at all: the upstream's stream ends with the head.
    Empty,
    H2(Incoming),
    /// Pieces read from an HTTP/1.x client, then `None` for its end. The channel holds one
    /// piece, so the client is read no faster than the upstream takes it. A channel closed
    /// without that `None` (the client went away or stalled, or sent a malformed chunk) fails
    /// the body, so the upstream's stream is reset and never sees a cut-short body as whole.
    H1 {
        pieces: tokio::sync::mpsc::Receiver<Option<Bytes>>,
        /// The declared `Content-Length`, for the size hint.
        length: Option<u64>,
        ended: bool,
    },
}

/// Why a body an HTTP/1.x client was sending did not arrive whole.
#[derive(Debug, thiserror::Error)]
#[error("the client's request body was cut short")]
pub struct CutShort;

impl Body for ClientBody {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        match self.get_mut() {
            Self::Empty => Poll::Ready(None),
            Self::H2(body) => Pin::new(body).poll_frame(cx).map_err(Into::into),
            Self::H1 { ended: true, .. } => Poll::Ready(None),
            Self::H1 { pieces, ended, .. } => match pieces.poll_recv(cx) {
                Poll::Pending => Poll::Pending,
                Poll::Ready(Some(Some(piece))) => Poll::Ready(Some(Ok(Frame::data(piece)))),
                Poll::Ready(Some(None)) => {
                    *ended = true;
                    Poll::Ready(None)
                }
                Poll::Ready(None) => Poll::Ready(Some(Err(CutShort.into()))),
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Self::Empty => true,
            Self::H2(body) => body.is_end_stream(),
            Self::H1 { ended, .. } => *ended,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Self::Empty => SizeHint::with_exact(0),
            Self::H2(body) => body.size_hint(),
            Self::H1 {
                length: Some(n), ..
            } => SizeHint::with_exact(*n),
            Self::H1 { length: None, .. } => SizeHint::default(),
        }
    }
}

pub struct Pool {
    idle: Mutex<HashMap<IdleKey, Vec<Idle>, foldhash::fast::RandomState>>,
    settings: Arc<PoolLimits>,
    connectors: Arc<Connectors>,
}

/// How many idle upstream connections are kept and for how long: the ConfigMap's
/// `upstream-keepalive-connections` and `upstream-keepalive-timeout`, set from each published
/// snapshot by [`PoolLimitsHook`] and read with one atomic load where a pool needs them.
#[derive(Debug)]
pub struct PoolLimits {
    idle_timeout_ms: AtomicU64,
    max_idle_per_endpoint: AtomicUsize,
}

impl PoolLimits {
    pub fn new(keepalive: &UpstreamKeepalive) -> Arc<Self> {
        let limits = Arc::new(Self {
            idle_timeout_ms: AtomicU64::new(0),
            max_idle_per_endpoint: AtomicUsize::new(0),
        });
        limits.set(keepalive);
        limits
    }

    pub fn set(&self, keepalive: &UpstreamKeepalive) {
        let ms = u64::try_from(keepalive.idle_timeout.as_millis()).unwrap_or(u64::MAX);
        self.idle_timeout_ms.store(ms, Ordering::Relaxed);
        self.max_idle_per_endpoint
            .store(keepalive.max_idle, Ordering::Relaxed);
    }

    /// Idle connections older than this are closed rather than reused.
    pub fn idle_timeout(&self) -> Duration {
        Duration::from_millis(self.idle_timeout_ms.load(Ordering::Relaxed))
    }

    /// Idle connections kept per endpoint (and protocol); `0` keeps none.
    pub fn max_idle_per_endpoint(&self) -> usize {
        self.max_idle_per_endpoint.load(Ordering::Relaxed)
    }
}

/// Keeps [`PoolLimits`] in step with the published snapshot's global settings.
pub struct PoolLimitsHook(pub Arc<PoolLimits>);

impl PublishHook for PoolLimitsHook {
    fn before(&self, _new: &Snapshot, _old: &Snapshot) {}

    fn after(&self, new: &Snapshot, _old: &Snapshot) {
        self.0.set(&new.global.keepalive);
    }
}

struct Idle {
    sender: http1::SendRequest<RequestBody>,
    conn: Conn,
    since: Instant,
}

/// A request that could not be sent, with the request itself when no connection could be made
/// for it (nothing of it reached an upstream, so it can go to another: `proxy-next-upstream`).
pub struct SendError {
    pub error: UpstreamError,
    pub unsent: Option<Request<RequestBody>>,
}

impl SendError {
    pub fn unsent(error: UpstreamError, req: Request<RequestBody>) -> Self {
        Self {
            error,
            unsent: Some(req),
        }
    }

    pub fn sent(error: UpstreamError) -> Self {
        Self {
            error,
            unsent: None,
        }
    }
}

/// A connection checked out for one request.
pub struct Checked {
    sender: http1::SendRequest<RequestBody>,
    conn: Conn,
    key: IdleKey,
    pool: Arc<Pool>,
    /// It served a request before, so a failure to send may just mean the upstream closed it.
    reused: bool,
}

impl Pool {
    pub fn new(settings: Arc<PoolLimits>, connectors: Arc<Connectors>) -> Arc<Self> {
        Arc::new(Self {
            idle: Mutex::new(HashMap::default()),
            settings,
            connectors,
        })
    }

    /// Sends `req` to `key` and returns the response, whose body keeps the connection going. A
    /// request that a reused connection could not even start is retried once on a new one.
    pub async fn send(
        self: &Arc<Self>,
        key: PoolKey,
        transport: Transport,
        connect_timeout: Duration,
        req: Request<RequestBody>,
    ) -> Result<Response<UpstreamBody>, SendError> {
        let key = (key, transport);
        let mut checked = match self.checkout(&key, connect_timeout).await {
            Ok(checked) => checked,
            Err(error) => return Err(SendError::unsent(error, req)),
        };
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
                    let mut fresh = match self.connect(&key, connect_timeout).await {
                        Ok(fresh) => fresh,
                        Err(error) => return Err(SendError::unsent(error, req)),
                    };
                    match fresh.send(req).await {
                        Ok(response) => Ok(response.map(|body| UpstreamBody {
                            body,
                            checked: Some(fresh),
                            done: false,
                        })),
                        Err(err) => {
                            Err(SendError::sent(UpstreamError::from_hyper(err.into_error())))
                        }
                    }
                }
                None => Err(SendError::sent(UpstreamError::from_hyper(err.into_error()))),
            },
            Err(err) => Err(SendError::sent(UpstreamError::from_hyper(err.into_error()))),
        }
    }

    async fn checkout(
        self: &Arc<Self>,
        key: &IdleKey,
        connect_timeout: Duration,
    ) -> Result<Checked, UpstreamError> {
        while let Some(mut idle) = self.pop(key) {
            // Let the connection notice a close that arrived while it sat idle.
            let closed = (&mut idle.conn).now_or_never().is_some();
            if !closed
                && idle.sender.is_ready()
                && idle.since.elapsed() < self.settings.idle_timeout()
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
        self.connect(key, connect_timeout).await
    }

    fn pop(&self, key: &IdleKey) -> Option<Idle> {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        idle.get_mut(key).and_then(Vec::pop)
    }

    async fn connect(
        self: &Arc<Self>,
        key: &IdleKey,
        connect_timeout: Duration,
    ) -> Result<Checked, UpstreamError> {
        let (target, transport) = key;
        let stream = self
            .connectors
            .open(target, transport, Wire::Http1, connect_timeout)
            .await?;
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

    fn checkin(&self, checked: Checked) {
        let Checked {
            sender, conn, key, ..
        } = checked;
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        let list = idle.entry(key).or_default();
        if list.len() < self.settings.max_idle_per_endpoint() {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_http1_body_ends_only_when_its_end_was_sent() {
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        let mut whole = ClientBody::H1 {
            pieces: rx,
            length: Some(1),
            ended: false,
        };
        let sender = tokio::spawn(async move {
            tx.send(Some(Bytes::from_static(b"a"))).await.ok();
            tx.send(None).await.ok();
        });
        let first = whole.frame().await.and_then(Result::ok);
        assert_eq!(
            first.and_then(|f| f.into_data().ok()),
            Some(Bytes::from_static(b"a"))
        );
        assert!(whole.frame().await.is_none());
        assert!(whole.is_end_stream());
        sender.await.ok();

        let (tx, rx) = tokio::sync::mpsc::channel(1);
        let mut cut = ClientBody::H1 {
            pieces: rx,
            length: None,
            ended: false,
        };
        tx.send(Some(Bytes::from_static(b"a"))).await.ok();
        drop(tx);
        assert!(matches!(cut.frame().await, Some(Ok(_))));
        assert!(
            matches!(cut.frame().await, Some(Err(_))),
            "a body whose sender went away without its end is an error, not an end"
        );
    }
}
