//! HTTP/2 to upstreams (`GRPC`, `GRPCS`, `appProtocol: kubernetes.io/h2c`): multiplexed
//! connections per endpoint and transport, through hyper's HTTP/2 client.
//!
//! ```text
//!   send(key, transport, req)
//!     ├─ a live connection with a free stream (in flight < MAX_STREAMS_PER_CONN) → reuse it
//!     └─ none: open one (TCP, TLS with ALPN h2, HTTP/2 handshake), add it to the list; one
//!        opening at a time per endpoint, the requests waiting behind it share what it opened
//!   the stream is refused before the upstream read any of it (REFUSED_STREAM, above a
//!   GOAWAY's last stream id, or its connection closed before it was handed over), or the
//!   connection was lost under an idempotent request before any answer, and none of its body
//!   was sent → once more on a new connection
//!   response body: counts against its connection until it ends or is dropped
//! ```
//!
//! hyper does not expose the peer's `SETTINGS_MAX_CONCURRENT_STREAMS`, so each connection takes
//! at most [`MAX_STREAMS_PER_CONN`] streams at once; a peer allowing fewer makes hyper queue the
//! surplus on that connection rather than fail it. A connection that received GOAWAY or closed
//! is dropped from the list and never chosen again, and one idle for [`IDLE_TIMEOUT`] is
//! closed.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::client::conn::http2;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};

use super::connect::{Connectors, PoolKey, Transport};
use super::pool::SendError;
use super::upstream::UpstreamError;
use crate::snapshot::policy::Wire;

/// Streams one upstream connection carries at once before another is opened.
pub const MAX_STREAMS_PER_CONN: usize = 100;

/// A request body on its way to an HTTP/2 upstream.
pub type RequestBody = super::pool::RequestBody;

pub struct H2Pool {
    conns: Mutex<HashMap<(PoolKey, Transport), Endpoint, foldhash::fast::RandomState>>,
    connectors: Arc<Connectors>,
    keepalive: Duration,
}

/// One endpoint's connections, and the lock that lets one task at a time open another (the
/// others wait for it and share it rather than each opening their own).
#[derive(Default)]
struct Endpoint {
    conns: Vec<Conn>,
    opening: Arc<tokio::sync::Mutex<()>>,
}

#[derive(Clone)]
struct Conn {
    sender: http2::SendRequest<Replayable>,
    in_flight: Arc<Load>,
}

/// A connection's streams in flight, and since when it has had none.
struct Load {
    streams: AtomicUsize,
    born: Instant,
    /// Milliseconds after `born` when the last stream ended.
    idle_since_ms: AtomicU64,
}

impl Load {
    fn load(&self, order: Ordering) -> usize {
        self.streams.load(order)
    }

    fn fetch_add(&self, n: usize, order: Ordering) -> usize {
        self.streams.fetch_add(n, order)
    }

    /// Idle (no stream) for at least `idle`.
    fn idle_for(&self, idle: Duration) -> bool {
        self.streams.load(Ordering::Relaxed) == 0
            && self.born.elapsed()
                >= Duration::from_millis(self.idle_since_ms.load(Ordering::Relaxed)) + idle
    }
}

/// Connections idle this long are closed (dropping the last sender ends the connection with
/// GOAWAY), so an endpoint that left its Service does not keep one open forever.
const IDLE_TIMEOUT: Duration = Duration::from_secs(90);

/// Whether a connection is worth keeping.
fn alive(conn: &Conn) -> bool {
    !conn.sender.is_closed() && !conn.in_flight.idle_for(IDLE_TIMEOUT)
}

impl H2Pool {
    pub fn new(connectors: Arc<Connectors>) -> Arc<Self> {
        Arc::new(Self {
            conns: Mutex::new(HashMap::default()),
            connectors,
            keepalive: Duration::from_secs(30),
        })
    }

    /// Sends `req` and returns the response head; its body holds the stream's place on its
    /// connection until it ends.
    pub async fn send(
        self: &Arc<Self>,
        key: &PoolKey,
        transport: &Transport,
        connect_timeout: Duration,
        req: Request<RequestBody>,
    ) -> Result<Response<H2Body>, SendError> {
        let (parts, body) = req.into_parts();
        let slot = Arc::new(Mutex::new(Some(body)));
        let mut fresh = false;
        loop {
            let opened = match (fresh, self.pick(key, transport)) {
                (false, Some(conn)) => Ok(conn),
                (false, None) => self.open_shared(key, transport, connect_timeout).await,
                (true, _) => self.open(key, transport, connect_timeout).await,
            };
            let conn = match opened {
                Ok(conn) => conn,
                Err(error) => {
                    // Nothing was sent: the request can go elsewhere, body and all.
                    let body = slot.lock().ok().and_then(|mut s| s.take());
                    return Err(match body {
                        Some(body) => SendError::unsent(error, Request::from_parts(parts, body)),
                        None => SendError::sent(error),
                    });
                }
            };
            let guard = StreamGuard(conn.in_flight.clone());
            let body = Replayable {
                slot: slot.clone(),
                inner: None,
                started: false,
            };
            let request = Request::from_parts(parts.clone(), body);
            let mut sender = conn.sender.clone();
            // A connection that closed (a GOAWAY read, the peer gone) after it was picked and
            // before the request was handed to it sent nothing of it: as refused.
            let (sent, handed) = match sender.ready().await {
                Ok(()) => (sender.send_request(request).await, true),
                Err(err) => (Err(err), false),
            };
            match sent {
                Ok(response) => {
                    return Ok(response.map(|body| H2Body {
                        body,
                        _guard: guard,
                    }));
                }
                Err(err) => {
                    drop(guard);
                    let refused =
                        !handed || refused(&err) || (parts.method.is_idempotent() && lost(&err));
                    self.forget(key, transport, &conn);
                    // Retried once, and only while the body is still whole.
                    let whole = slot.lock().map(|s| s.is_some()).unwrap_or(false);
                    if refused && whole && !fresh {
                        tracing::debug!(upstream = %key, %err, "HTTP/2 stream refused; retrying on a new connection");
                        fresh = true;
                        continue;
                    }
                    return Err(SendError::sent(UpstreamError::from_hyper(err)));
                }
            }
        }
    }

    /// A live connection with a free stream.
    fn pick(&self, key: &PoolKey, transport: &Transport) -> Option<Conn> {
        let mut conns = self.conns.lock().unwrap_or_else(|e| e.into_inner());
        let list = &mut conns.get_mut(&(key.clone(), transport.clone()))?.conns;
        list.retain(alive);
        let conn = list
            .iter()
            .filter(|c| c.in_flight.load(Ordering::Relaxed) < MAX_STREAMS_PER_CONN)
            .min_by_key(|c| c.in_flight.load(Ordering::Relaxed))?;
        conn.in_flight.fetch_add(1, Ordering::Relaxed);
        Some(conn.clone())
    }

    /// A new connection, or the one another request just opened if it has room: one opening at
    /// a time per endpoint, so a burst of requests does not open a connection each.
    async fn open_shared(
        &self,
        key: &PoolKey,
        transport: &Transport,
        connect_timeout: Duration,
    ) -> Result<Conn, UpstreamError> {
        let opening = {
            let mut conns = self.conns.lock().unwrap_or_else(|e| e.into_inner());
            conns
                .entry((key.clone(), transport.clone()))
                .or_default()
                .opening
                .clone()
        };
        let _turn = opening.lock().await;
        if let Some(conn) = self.pick(key, transport) {
            return Ok(conn);
        }
        self.open(key, transport, connect_timeout).await
    }

    async fn open(
        &self,
        key: &PoolKey,
        transport: &Transport,
        connect_timeout: Duration,
    ) -> Result<Conn, UpstreamError> {
        let stream = self
            .connectors
            .open(key, transport, Wire::Http2, connect_timeout)
            .await?;
        if let Transport::Tls(_) = transport
            && stream.alpn() != Some(b"h2")
        {
            return Err(UpstreamError::Protocol(
                "the upstream did not agree to HTTP/2 (ALPN h2)".into(),
            ));
        }
        let mut builder = http2::Builder::new(TokioExecutor::new());
        builder
            .timer(TokioTimer::new())
            .keep_alive_interval(self.keepalive)
            .keep_alive_timeout(Duration::from_secs(20))
            .keep_alive_while_idle(true)
            .initial_stream_window_size(256 * 1024)
            .initial_connection_window_size(1024 * 1024);
        let handshake = builder.handshake(TokioIo::new(stream));
        let (sender, connection) = tokio::time::timeout(connect_timeout, handshake)
            .await
            .map_err(|_| UpstreamError::ConnectTimeout)?
            .map_err(UpstreamError::from_hyper)?;
        let upstream = key.to_string();
        tokio::spawn(async move {
            if let Err(err) = connection.await {
                tracing::debug!(%upstream, %err, "HTTP/2 upstream connection ended");
            }
        });
        let conn = Conn {
            sender,
            in_flight: Arc::new(Load {
                streams: AtomicUsize::new(1),
                born: Instant::now(),
                idle_since_ms: AtomicU64::new(0),
            }),
        };
        let mut conns = self.conns.lock().unwrap_or_else(|e| e.into_inner());
        // Opening is rare: a good moment to drop every idle or closed connection, and the
        // endpoints left with none (ones no route names any more are never picked again).
        conns.retain(|_, endpoint| {
            endpoint.conns.retain(alive);
            !endpoint.conns.is_empty() || Arc::strong_count(&endpoint.opening) > 1
        });
        conns
            .entry((key.clone(), transport.clone()))
            .or_default()
            .conns
            .push(conn.clone());
        Ok(conn)
    }

    fn forget(&self, key: &PoolKey, transport: &Transport, conn: &Conn) {
        if !conn.sender.is_closed() {
            return;
        }
        let mut conns = self.conns.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(endpoint) = conns.get_mut(&(key.clone(), transport.clone())) {
            endpoint
                .conns
                .retain(|c| !Arc::ptr_eq(&c.in_flight, &conn.in_flight));
        }
    }

    /// Connections open now, for tests and metrics.
    pub fn connection_count(&self) -> usize {
        self.conns
            .lock()
            .map(|c| c.values().map(|e| e.conns.len()).sum())
            .unwrap_or(0)
    }
}

/// Whether the upstream refused the stream without processing it: REFUSED_STREAM, or a GOAWAY
/// whose last stream id is below it (RFC 9113 §8.7: safe to retry).
fn refused(err: &hyper::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = source {
        if let Some(h2) = e.downcast_ref::<h2::Error>() {
            return h2.reason() == Some(h2::Reason::REFUSED_STREAM)
                || (h2.is_go_away() && h2.reason() == Some(h2::Reason::NO_ERROR));
        }
        source = e.source();
    }
    err.is_canceled()
}

/// Whether the connection ended under the request before any answer: the peer closed or
/// reset it (a server closing an idle connection as the request went out, or one whose GOAWAY
/// never arrived). Whether the peer read the request is unknown, so only an idempotent
/// request is sent again, as nginx's `proxy_next_upstream error` does.
fn lost(err: &(dyn std::error::Error + 'static)) -> bool {
    use std::io::ErrorKind::{BrokenPipe, ConnectionAborted, ConnectionReset, UnexpectedEof};
    let mut source = Some(err);
    while let Some(e) = source {
        let io = e
            .downcast_ref::<h2::Error>()
            .and_then(h2::Error::get_io)
            .or_else(|| e.downcast_ref::<std::io::Error>());
        if let Some(io) = io {
            return matches!(
                io.kind(),
                BrokenPipe | ConnectionReset | ConnectionAborted | UnexpectedEof
            );
        }
        source = e.source();
    }
    false
}

/// Counts a stream against its connection.
struct StreamGuard(Arc<Load>);

impl Drop for StreamGuard {
    fn drop(&mut self) {
        if self.0.streams.fetch_sub(1, Ordering::Relaxed) == 1 {
            let ms = u64::try_from(self.0.born.elapsed().as_millis()).unwrap_or(u64::MAX);
            self.0.idle_since_ms.store(ms, Ordering::Relaxed);
        }
    }
}

/// A request body that can be handed to a second connection if the first refused the stream
/// before any of it was sent: it stays in a shared slot until the first frame is asked for.
pub struct Replayable {
    slot: Arc<Mutex<Option<RequestBody>>>,
    inner: Option<RequestBody>,
    started: bool,
}

impl Body for Replayable {
    type Data = Bytes;
    type Error = <RequestBody as Body>::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        if !this.started {
            this.started = true;
            this.inner = this.slot.lock().ok().and_then(|mut s| s.take());
        }
        match this.inner.as_mut() {
            Some(body) => Pin::new(body).poll_frame(cx),
            None => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        match (&self.inner, self.started) {
            (Some(body), _) => body.is_end_stream(),
            (None, true) => true,
            (None, false) => self
                .slot
                .lock()
                .map(|s| s.as_ref().is_none_or(Body::is_end_stream))
                .unwrap_or(true),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match (&self.inner, self.started) {
            (Some(body), _) => body.size_hint(),
            // hyper asks before the first frame: a declared length is sent as content-length.
            (None, false) => self
                .slot
                .lock()
                .ok()
                .and_then(|s| s.as_ref().map(Body::size_hint))
                .unwrap_or_default(),
            (None, true) => SizeHint::with_exact(0),
        }
    }
}

/// A response body from an HTTP/2 upstream, trailers included.
pub struct H2Body {
    body: Incoming,
    _guard: StreamGuard,
}

impl Body for H2Body {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_connection_lost_under_the_request_counts_as_lost() {
        use std::io::{Error, ErrorKind};
        #[derive(Debug)]
        struct Wrapped(Error);
        impl std::fmt::Display for Wrapped {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "wrapped: {}", self.0)
            }
        }
        impl std::error::Error for Wrapped {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        for (kind, want) in [
            (ErrorKind::BrokenPipe, true),
            (ErrorKind::ConnectionReset, true),
            (ErrorKind::ConnectionAborted, true),
            (ErrorKind::UnexpectedEof, true),
            (ErrorKind::TimedOut, false),
            (ErrorKind::InvalidData, false),
        ] {
            assert_eq!(lost(&Error::from(kind)), want, "{kind:?}");
            assert_eq!(lost(&Wrapped(Error::from(kind))), want, "wrapped {kind:?}");
        }
        assert!(!lost(&std::fmt::Error));
    }

    #[test]
    fn a_connection_is_idle_only_without_streams_for_the_whole_timeout() {
        let Some(born) = Instant::now().checked_sub(Duration::from_secs(100)) else {
            return;
        };
        let load = |streams: usize, idle_since_s: u64| Load {
            streams: AtomicUsize::new(streams),
            born,
            idle_since_ms: AtomicU64::new(idle_since_s * 1000),
        };
        let cases = [
            // (streams, idle since (s after birth, 100 s ago)) -> idle for 90 s
            (0, 0, true),
            (0, 5, true),
            (0, 20, false),
            (1, 0, false),
        ];
        for (streams, since, want) in cases {
            assert_eq!(
                load(streams, since).idle_for(IDLE_TIMEOUT),
                want,
                "{streams} {since}"
            );
        }
        // A stream ending marks the moment.
        let l = Arc::new(load(1, 0));
        drop(StreamGuard(l.clone()));
        assert!(!l.idle_for(IDLE_TIMEOUT));
        assert_eq!(l.load(Ordering::Relaxed), 0);
    }
}
