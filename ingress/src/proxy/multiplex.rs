//! HTTP/2 to upstreams (`GRPC`, `GRPCS`, `appProtocol: kubernetes.io/h2c`): multiplexed
//! connections per endpoint and transport, spoken with the `h2` crate.
//!
//! ```text
//!   send(key, transport, req)
//!     ├─ a live connection with a free stream (in flight < the peer's
//!     │  SETTINGS_MAX_CONCURRENT_STREAMS, and < MAX_STREAMS_PER_CONN) → reuse it
//!     └─ none: open one (TCP, TLS with ALPN h2, HTTP/2 handshake), add it to the list; one
//!        opening at a time per endpoint, the requests waiting behind it share what it opened
//!   request body: sent from the request's own task while it is at hand (a unary gRPC call's
//!     one message); one that is still coming is pumped by a task of its own, in step with
//!     the upstream's flow-control window, so the client is read no faster than the upstream
//!     takes it, and a bidirectional stream flows both ways at once
//!   the stream is refused before the upstream read any of it (REFUSED_STREAM, above a
//!   GOAWAY's last stream id, or its connection closed before it was handed over), or the
//!   connection was lost under an idempotent request before any answer, and none of its body
//!   was sent → once more on a new connection
//!   response body: DATA frames, then the trailers; the window is given back as the client
//!     takes each frame; counts against its connection until it ends or is dropped
//! ```
//!
//! A connection that received GOAWAY or closed is dropped from the list and never chosen
//! again, one idle for [`IDLE_TIMEOUT`] is closed, and one whose PING goes unanswered for
//! [`PING_TIMEOUT`] is closed with its streams failed.

use std::collections::HashMap;
use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant};

use bytes::Bytes;
use h2::client::SendRequest;
use h2::{RecvStream, SendStream};
use http::{HeaderMap, Request, Response, header};
use http_body_util::BodyExt;
use hyper::body::{Body, Frame, SizeHint};

use super::connect::{Connectors, PoolKey, Transport};
use super::pool::SendError;
use super::upstream::UpstreamError;
use crate::snapshot::policy::Wire;

/// Streams one upstream connection carries at once before another is opened, when the peer
/// allows more (its `SETTINGS_MAX_CONCURRENT_STREAMS`, which h2 assumes to be this until the
/// peer's settings arrive).
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
    sender: SendRequest<Bytes>,
    in_flight: Arc<Load>,
}

impl Conn {
    /// Whether another stream may start on this connection now: below what the peer allows.
    fn has_room(&self) -> bool {
        let allowed = self
            .sender
            .current_max_send_streams()
            .min(MAX_STREAMS_PER_CONN);
        self.in_flight.load(Ordering::Relaxed) < allowed
    }
}

/// A connection's streams in flight, whether it still takes new ones, and since when it has
/// had none.
struct Load {
    streams: AtomicUsize,
    born: Instant,
    /// Milliseconds after `born` when the last stream ended.
    idle_since_ms: AtomicU64,
    /// The connection ended (its task saw it close, or it failed a PING).
    closed: std::sync::atomic::AtomicBool,
}

impl Load {
    fn new(streams: usize) -> Self {
        Load {
            streams: AtomicUsize::new(streams),
            born: Instant::now(),
            idle_since_ms: AtomicU64::new(0),
            closed: std::sync::atomic::AtomicBool::new(false),
        }
    }

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

/// How long a PING may go unanswered before its connection is taken for dead.
const PING_TIMEOUT: Duration = Duration::from_secs(20);

/// Whether a connection is worth keeping.
fn alive(conn: &Conn) -> bool {
    !conn.in_flight.closed.load(Ordering::Relaxed) && !conn.in_flight.idle_for(IDLE_TIMEOUT)
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
        let (mut parts, body) = req.into_parts();
        let end_stream = body.is_end_stream();
        // A body of known length says so, as an HTTP/1.1 request's would (hyper's client did
        // the same): a zero only where the method gives a body meaning.
        if let Some(length) = body.size_hint().exact()
            && (length != 0 || !bodiless_method(&parts.method))
            && !parts.headers.contains_key(header::CONTENT_LENGTH)
        {
            parts
                .headers
                .insert(header::CONTENT_LENGTH, http::HeaderValue::from(length));
        }
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
                // A peer that went away before it answered the handshake (a GOAWAY as it
                // opened, as a server shutting down sends) read nothing: once more.
                Err(Opening::WentAway) if !fresh => {
                    fresh = true;
                    continue;
                }
                Err(error) => {
                    let error = error.into_upstream();
                    // Nothing was sent: the request can go elsewhere, body and all.
                    let body = slot.lock().ok().and_then(|mut s| s.take());
                    return Err(match body {
                        Some(body) => SendError::unsent(error, Request::from_parts(parts, body)),
                        None => SendError::sent(error),
                    });
                }
            };
            let guard = StreamGuard(conn.in_flight.clone());
            // Held by whoever waits for the response, then by its body: when they are gone
            // (a timeout, the client left, the response ended), a body still being sent stops.
            let (waiting, gone) = tokio::sync::oneshot::channel::<std::convert::Infallible>();
            let head = Request::from_parts(parts.clone(), ());
            // A connection that closed (a GOAWAY read, the peer gone) after it was picked and
            // before the request was handed to it sent nothing of it: as refused.
            let (sent, handed) = match conn.sender.clone().ready().await {
                Ok(mut sender) => match sender.send_request(head, end_stream) {
                    Ok((response, stream)) => {
                        if !end_stream {
                            send_body(&slot, stream, gone).await;
                        }
                        (response.await, true)
                    }
                    Err(err) => (Err(err), false),
                },
                Err(err) => (Err(err), false),
            };
            match sent {
                Ok(response) => {
                    let length = content_length(response.headers());
                    return Ok(response.map(|body| H2Body {
                        body,
                        data_done: false,
                        length,
                        _guard: guard,
                        _waiting: waiting,
                    }));
                }
                Err(err) => {
                    drop(guard);
                    let refused =
                        !handed || refused(&err) || (parts.method.is_idempotent() && lost(&err));
                    self.forget(key, transport, &conn);
                    // Retried once, and only while the body is still whole.
                    let whole = end_stream || slot.lock().map(|s| s.is_some()).unwrap_or(false);
                    if refused && whole && !fresh {
                        tracing::debug!(upstream = %key, %err, "HTTP/2 stream refused; retrying on a new connection");
                        fresh = true;
                        continue;
                    }
                    if !end_stream && let Some(body) = slot.lock().ok().and_then(|mut s| s.take()) {
                        return Err(SendError::unsent(
                            UpstreamError::from_h2(&err),
                            Request::from_parts(parts, body),
                        ));
                    }
                    return Err(SendError::sent(UpstreamError::from_h2(&err)));
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
            .filter(|c| c.has_room())
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
    ) -> Result<Conn, Opening> {
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
    ) -> Result<Conn, Opening> {
        let stream = self
            .connectors
            .open(key, transport, Wire::Http2, connect_timeout)
            .await?;
        if let Transport::Tls(_) = transport
            && stream.alpn() != Some(b"h2")
        {
            return Err(Opening::Failed(UpstreamError::Protocol(
                "the upstream did not agree to HTTP/2 (ALPN h2)".into(),
            )));
        }
        let handshake = h2::client::Builder::new()
            .initial_max_send_streams(MAX_STREAMS_PER_CONN)
            .initial_window_size(256 * 1024)
            .initial_connection_window_size(1024 * 1024)
            .enable_push(false)
            .handshake::<_, Bytes>(stream);
        let (sender, mut connection) = tokio::time::timeout(connect_timeout, handshake)
            .await
            .map_err(|_| UpstreamError::ConnectTimeout)?
            .map_err(|err| UpstreamError::from_h2(&err))?;
        let load = Arc::new(Load::new(1));
        let ping = connection.ping_pong().ok_or_else(|| {
            UpstreamError::Protocol("HTTP/2 connection without its PING handle".into())
        })?;
        let upstream = key.to_string();
        let watched = load.clone();
        let keepalive = self.keepalive;
        let (opened, ready) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            let ended = drive(&mut connection, ping, keepalive, opened).await;
            watched.closed.store(true, Ordering::Relaxed);
            if let Err(err) = ended {
                tracing::debug!(%upstream, %err, "HTTP/2 upstream connection ended");
            }
        });
        // Not handed out before the peer answered: a peer that is not HTTP/2 (an HTTP/1.1
        // server on an h2c port) fails here, with the request still unsent.
        match tokio::time::timeout(connect_timeout, ready).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(None))) | Ok(Err(_)) => return Err(Opening::WentAway),
            Ok(Ok(Err(Some(err)))) => {
                return Err(Opening::Failed(UpstreamError::Protocol(format!(
                    "HTTP/2 handshake: {err}"
                ))));
            }
            Err(_) => return Err(Opening::Failed(UpstreamError::ConnectTimeout)),
        }
        let conn = Conn {
            sender,
            in_flight: load,
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
        let closed = conn.in_flight.closed.load(Ordering::Relaxed) || closed_now(&conn.sender);
        if !closed {
            return;
        }
        conn.in_flight.closed.store(true, Ordering::Relaxed);
        let mut conns = self.conns.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(endpoint) = conns.get_mut(&(key.clone(), transport.clone())) {
            endpoint
                .conns
                .retain(|c| !Arc::ptr_eq(&c.in_flight, &conn.in_flight));
        }
    }
}

/// Why a connection could not be opened.
enum Opening {
    /// The peer closed it before answering the handshake (a GOAWAY, or a close that crossed
    /// the handshake's PING): no request was on it.
    WentAway,
    Failed(UpstreamError),
}

impl Opening {
    fn into_upstream(self) -> UpstreamError {
        match self {
            Opening::WentAway => UpstreamError::Protocol(
                "HTTP/2 handshake: the upstream closed the connection before answering".into(),
            ),
            Opening::Failed(error) => error,
        }
    }
}

impl From<UpstreamError> for Opening {
    fn from(error: UpstreamError) -> Self {
        Opening::Failed(error)
    }
}

/// Whether a sender's connection failed or was told to go away, without waiting.
fn closed_now(sender: &SendRequest<Bytes>) -> bool {
    let mut cx = Context::from_waker(std::task::Waker::noop());
    matches!(sender.clone().poll_ready(&mut cx), Poll::Ready(Err(_)))
}

/// Drives a connection. Its first PING tells `opened` that the peer speaks HTTP/2 and that its
/// SETTINGS (sent before it answers, and read in order) are known, so the first streams
/// respect its `SETTINGS_MAX_CONCURRENT_STREAMS`; then it PINGs the peer every `interval`, and
/// a peer that does not answer within [`PING_TIMEOUT`] is taken for gone (dropping the
/// connection fails its streams).
async fn drive<C>(
    connection: &mut C,
    mut ping: h2::PingPong,
    interval: Duration,
    opened: tokio::sync::oneshot::Sender<Result<(), Option<String>>>,
) -> Result<(), String>
where
    C: Future<Output = Result<(), h2::Error>> + Unpin,
{
    match ping_once(connection, &mut ping).await {
        Pinged::Answered => {
            let _ = opened.send(Ok(()));
        }
        // Closed before answering, cleanly (a GOAWAY) or under the PING (the peer's close
        // crossing it): it went away (`None`). Else how it failed (not HTTP/2, say).
        Pinged::Ended(ended) => {
            let why = match &ended {
                Ok(()) => None,
                Err(Ended::Error(err)) if lost(err) => None,
                Err(other) => Some(other.to_string()),
            };
            let _ = opened.send(Err(why));
            return ended.map_err(|err| err.to_string());
        }
    }
    loop {
        let pause = tokio::time::sleep(interval);
        tokio::select! {
            ended = &mut *connection => return ended.map_err(|err| err.to_string()),
            () = pause => {}
        }
        if let Pinged::Ended(ended) = ping_once(connection, &mut ping).await {
            return ended.map_err(|err| err.to_string());
        }
    }
}

enum Pinged {
    Answered,
    /// The connection ended (or is ended for not answering).
    Ended(Result<(), Ended>),
}

/// Why a connection ended other than by closing cleanly.
#[derive(Debug, thiserror::Error)]
enum Ended {
    #[error("{0}")]
    Error(h2::Error),
    #[error("no PING answer within {PING_TIMEOUT:?}")]
    Unanswered,
}

/// One PING, the connection driven meanwhile.
async fn ping_once<C>(connection: &mut C, ping: &mut h2::PingPong) -> Pinged
where
    C: Future<Output = Result<(), h2::Error>> + Unpin,
{
    let pong = tokio::time::timeout(PING_TIMEOUT, ping.ping(h2::Ping::opaque()));
    tokio::select! {
        ended = &mut *connection => Pinged::Ended(ended.map_err(Ended::Error)),
        answered = pong => match answered {
            Ok(Ok(_)) => Pinged::Answered,
            Ok(Err(err)) => Pinged::Ended(Err(Ended::Error(err))),
            Err(_) => Pinged::Ended(Err(Ended::Unanswered)),
        },
    }
}

/// Sends the request body on `stream`: what is at hand now from this task, and the rest, if it
/// is still coming, from a task of its own (the response may begin before the body ends, as a
/// bidirectional gRPC stream's does).
async fn send_body(
    slot: &Arc<Mutex<Option<RequestBody>>>,
    stream: SendStream<Bytes>,
    gone: tokio::sync::oneshot::Receiver<std::convert::Infallible>,
) {
    let Some(body) = slot.lock().ok().and_then(|mut s| s.take()) else {
        return;
    };
    let mut pump = Box::pin(pump_body(body, stream, gone));
    // One poll here: a body already read (nearly every unary call) goes out without a task.
    let done = poll_fn(|cx| Poll::Ready(pump.as_mut().poll(cx).is_ready())).await;
    if !done {
        tokio::spawn(pump);
    }
}

/// [`copy_body`], until the response's side is `gone` (nobody waits for the response any more,
/// or its body was dropped): then the stream is reset, as the rest of the body would go nowhere.
async fn pump_body(
    body: RequestBody,
    mut stream: SendStream<Bytes>,
    gone: tokio::sync::oneshot::Receiver<std::convert::Infallible>,
) {
    let abandoned = tokio::select! {
        biased;
        () = copy_body(body, &mut stream) => false,
        _ = gone => true,
    };
    if abandoned {
        stream.send_reset(h2::Reason::CANCEL);
    }
}

/// Copies `body` into `stream` in step with the stream's send window, then ends it (with the
/// body's trailers, if any). A body that fails (the client went away, `proxy-body-size`) resets
/// the stream; a stream the upstream reset ends the copy.
async fn copy_body(mut body: RequestBody, stream: &mut SendStream<Bytes>) {
    loop {
        let frame = tokio::select! {
            biased;
            frame = body.frame() => frame,
            _ = poll_fn(|cx| stream.poll_reset(cx)) => return,
        };
        let frame = match frame {
            None => {
                let _ = stream.send_data(Bytes::new(), true);
                return;
            }
            Some(Err(_)) => {
                stream.send_reset(h2::Reason::CANCEL);
                return;
            }
            Some(Ok(frame)) => frame,
        };
        let mut data = match frame.into_data() {
            Ok(data) => data,
            Err(frame) => {
                if let Ok(trailers) = frame.into_trailers() {
                    let _ = stream.send_trailers(trailers);
                } else {
                    let _ = stream.send_data(Bytes::new(), true);
                }
                return;
            }
        };
        let last = body.is_end_stream();
        if data.is_empty() && !last {
            continue;
        }
        loop {
            let granted = if data.is_empty() {
                0
            } else {
                stream.reserve_capacity(data.len());
                match poll_fn(|cx| stream.poll_capacity(cx)).await {
                    Some(Ok(0)) => continue,
                    Some(Ok(n)) => n,
                    // The stream was reset or the connection closed.
                    _ => return,
                }
            };
            let piece = data.split_to(granted.min(data.len()));
            let end = last && data.is_empty();
            if stream.send_data(piece, end).is_err() {
                return;
            }
            if data.is_empty() {
                break;
            }
        }
        if last {
            return;
        }
    }
}

/// Methods whose request body has no defined meaning (RFC 9110 §9.3).
fn bodiless_method(method: &http::Method) -> bool {
    matches!(
        *method,
        http::Method::GET | http::Method::HEAD | http::Method::DELETE | http::Method::CONNECT
    )
}

/// The response's declared length, which h2 holds its DATA frames to.
fn content_length(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .parse()
        .ok()
}

/// Whether the upstream refused the stream without processing it: REFUSED_STREAM, or a GOAWAY
/// whose last stream id is below it (RFC 9113 §8.7: safe to retry).
fn refused(err: &h2::Error) -> bool {
    err.reason() == Some(h2::Reason::REFUSED_STREAM)
        || (err.is_go_away() && err.reason() == Some(h2::Reason::NO_ERROR))
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

/// A response body from an HTTP/2 upstream: its DATA frames, then its trailers. Each frame's
/// bytes are given back to the stream's window as the frame is taken, so the upstream sends no
/// faster than the client reads.
pub struct H2Body {
    body: RecvStream,
    data_done: bool,
    length: Option<u64>,
    _guard: StreamGuard,
    /// Dropped with the body: a request body still being sent stops (see [`pump_body`]).
    _waiting: tokio::sync::oneshot::Sender<std::convert::Infallible>,
}

impl Body for H2Body {
    type Data = Bytes;
    type Error = h2::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, h2::Error>>> {
        let this = &mut *self;
        if !this.data_done {
            match ready!(this.body.poll_data(cx)) {
                Some(Ok(data)) => {
                    let _ = this.body.flow_control().release_capacity(data.len());
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                Some(Err(err)) => return Poll::Ready(Some(Err(err))),
                None => this.data_done = true,
            }
        }
        match ready!(this.body.poll_trailers(cx)) {
            Ok(Some(trailers)) => Poll::Ready(Some(Ok(Frame::trailers(trailers)))),
            Ok(None) => Poll::Ready(None),
            Err(err) => Poll::Ready(Some(Err(err))),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.length
            .map_or_else(SizeHint::default, SizeHint::with_exact)
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
            closed: std::sync::atomic::AtomicBool::new(false),
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
