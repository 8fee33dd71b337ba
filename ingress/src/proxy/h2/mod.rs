//! HTTP/2 connections (ALPN `h2`, or h2c with prior knowledge), served by hyper, with every wait
//! bounded by a watchdog beside the connection:
//!
//! ```text
//!   no request within --header-read-timeout of the connection (a cut-short preface, a
//!     preface and SETTINGS then silence)                            → closed
//!   no stream open for --client-keepalive-timeout                  → GOAWAY, closed
//!   a write to the client blocked for --client-send-timeout        → closed
//!   a dead peer: PING every --http2-ping-interval, no ACK within
//!     --http2-ping-timeout                                         → closed (hyper)
//!   a stream's request body paused for --client-body-timeout       → that stream fails (idle.rs)
//! ```
//!
//! Memory per connection is bounded by HTTP/2 flow control: the client may have at most one
//! connection window of request data in flight, and each stream buffers at most
//! [`MAX_SEND_BUF`] of response data the client is not reading.

mod request;

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_util::sync::CancellationToken;

use crate::proxy::settings::HttpSettings;
use crate::proxy::{ConnInfo, Proxy, ProxyBody};

/// Streams one client may have open at once (nginx's `http2_max_concurrent_streams`).
pub const MAX_STREAMS: u32 = 128;
/// Response bytes buffered per stream for a client that does not read them.
pub const MAX_SEND_BUF: usize = 64 * 1024;
/// Request bytes a client may send on one stream before the proxy reads them.
const STREAM_WINDOW: u32 = 256 * 1024;
/// And on the whole connection.
const CONNECTION_WINDOW: u32 = 1024 * 1024;

pub fn builder(settings: &HttpSettings) -> hyper::server::conn::http2::Builder<TokioExecutor> {
    let mut builder = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
    builder
        .timer(TokioTimer::new())
        .max_header_list_size(u32::try_from(settings.max_header_size).unwrap_or(u32::MAX))
        .max_concurrent_streams(MAX_STREAMS)
        .max_send_buf_size(MAX_SEND_BUF)
        .initial_stream_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .keep_alive_interval(Some(settings.http2_ping_interval))
        .keep_alive_timeout(settings.http2_ping_timeout);
    builder
}

/// Serves one HTTP/2 connection until it ends, the watchdog closes it, or shutdown drains it.
pub async fn serve<IO>(
    proxy: Arc<Proxy>,
    builder: &hyper::server::conn::http2::Builder<TokioExecutor>,
    io: IO,
    conn: ConnInfo,
    settings: &HttpSettings,
    stop: &CancellationToken,
) where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let send_timeout = proxy.settings().client_send_timeout;
    let activity = Arc::new(Activity::new());
    let conn = Arc::new(conn);
    let peer = conn.peer;
    let io = Watched {
        inner: io,
        activity: activity.clone(),
    };
    let streams = activity.clone();
    let service = service_fn(move |req| {
        let guard = streams.open();
        let proxy = proxy.clone();
        let conn = conn.clone();
        // Boxed: the request's future is some 10 KB, and hyper moves the service's future into
        // its stream task and tokio moves that into the task's cell; a pointer is all they copy.
        Box::pin(async move {
            let response = proxy.handle(req, conn).await?;
            Ok::<_, std::convert::Infallible>(response.map(|body| Tracked {
                body,
                _guard: guard,
            }))
        })
    });
    let mut connection = std::pin::pin!(builder.serve_connection(TokioIo::new(io), service));
    let limits = Limits {
        header: settings.header_read_timeout,
        keepalive: settings.keepalive_timeout,
        send: send_timeout,
    };
    let started = Instant::now();
    let mut draining = false;
    loop {
        let next = activity.next_check(started, &limits, draining);
        tokio::select! {
            result = connection.as_mut() => {
                if let Err(err) = result {
                    tracing::debug!(%peer, %err, "HTTP/2 connection ended with an error");
                }
                return;
            }
            () = stop.cancelled(), if !draining => {
                connection.as_mut().graceful_shutdown();
                draining = true;
            }
            () = tokio::time::sleep_until(next.into()) => {
                match activity.verdict(started, &limits) {
                    Verdict::Fine => {}
                    Verdict::Idle if !draining => {
                        tracing::debug!(%peer, "HTTP/2 connection idle; closing");
                        connection.as_mut().graceful_shutdown();
                        draining = true;
                    }
                    Verdict::Idle => {}
                    Verdict::Close(why) => {
                        tracing::debug!(%peer, why, "HTTP/2 connection closed");
                        return;
                    }
                }
            }
        }
    }
}

/// The watchdog's timeouts.
struct Limits {
    /// For the first request.
    header: Duration,
    /// With no stream open.
    keepalive: Duration,
    /// For a blocked write.
    send: Duration,
}

/// What the watchdog concluded.
enum Verdict {
    Fine,
    /// No stream for the keep-alive timeout: say GOAWAY.
    Idle,
    /// Drop the connection now.
    Close(&'static str),
}

/// What the watchdog knows about one connection. Times are milliseconds since the connection
/// started (0: never).
struct Activity {
    base: Instant,
    streams: AtomicUsize,
    requested: AtomicBool,
    /// When the last stream ended.
    idle_since: AtomicU64,
    /// When a write to the client first found the socket full, if it still is.
    blocked_since: AtomicU64,
}

impl Activity {
    fn new() -> Self {
        Self {
            base: Instant::now(),
            streams: AtomicUsize::new(0),
            requested: AtomicBool::new(false),
            idle_since: AtomicU64::new(0),
            blocked_since: AtomicU64::new(0),
        }
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.base.elapsed().as_millis())
            .unwrap_or(u64::MAX)
            .max(1)
    }

    fn at(&self, ms: u64) -> Instant {
        self.base + Duration::from_millis(ms)
    }

    fn open(self: &Arc<Self>) -> StreamGuard {
        self.requested.store(true, Ordering::Relaxed);
        self.streams.fetch_add(1, Ordering::Relaxed);
        StreamGuard(self.clone())
    }

    fn verdict(&self, started: Instant, limits: &Limits) -> Verdict {
        let now = Instant::now();
        let blocked = self.blocked_since.load(Ordering::Relaxed);
        if blocked != 0 && now >= self.at(blocked) + limits.send {
            return Verdict::Close("writes to the client stalled");
        }
        if !self.requested.load(Ordering::Relaxed) {
            if now >= started + limits.header {
                return Verdict::Close("no request in time");
            }
            return Verdict::Fine;
        }
        if self.streams.load(Ordering::Relaxed) == 0
            && now >= self.at(self.idle_since.load(Ordering::Relaxed)) + limits.keepalive
        {
            return Verdict::Idle;
        }
        Verdict::Fine
    }

    /// When to look again: the soonest moment a verdict could change without a stream opening.
    fn next_check(&self, started: Instant, limits: &Limits, draining: bool) -> Instant {
        let now = Instant::now();
        let blocked = self.blocked_since.load(Ordering::Relaxed);
        let mut next = now + limits.send;
        if blocked != 0 {
            next = next.min(self.at(blocked) + limits.send);
        }
        if !self.requested.load(Ordering::Relaxed) {
            next = next.min(started + limits.header);
        } else if !draining && self.streams.load(Ordering::Relaxed) == 0 {
            next = next.min(self.at(self.idle_since.load(Ordering::Relaxed)) + limits.keepalive);
        }
        next.max(now + Duration::from_millis(10))
    }
}

/// Counts an open stream until its response body is done with.
struct StreamGuard(Arc<Activity>);

impl Drop for StreamGuard {
    fn drop(&mut self) {
        if self.0.streams.fetch_sub(1, Ordering::Relaxed) == 1 {
            self.0.idle_since.store(self.0.now_ms(), Ordering::Relaxed);
        }
    }
}

/// A response body that keeps its stream counted while hyper sends it.
pub struct Tracked {
    body: ProxyBody,
    _guard: StreamGuard,
}

impl Body for Tracked {
    type Data = Bytes;
    type Error = <ProxyBody as Body>::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// The connection's stream, noting when writes block and unblock.
struct Watched<IO> {
    inner: IO,
    activity: Arc<Activity>,
}

impl<IO> Watched<IO> {
    fn wrote(&self, result: &Poll<std::io::Result<usize>>) {
        let blocked = &self.activity.blocked_since;
        match result {
            Poll::Pending => {
                if blocked.load(Ordering::Relaxed) == 0 {
                    blocked.store(self.activity.now_ms(), Ordering::Relaxed);
                }
            }
            Poll::Ready(_) => blocked.store(0, Ordering::Relaxed),
        }
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Watched<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Watched<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let result = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.wrote(&result);
        result
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let result = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.wrote(&result);
        result
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
