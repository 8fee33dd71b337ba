//! The HTTP/1.1 fast path: what most requests are (a head, and no body or a small one) is
//! proxied without building `http::Request`s, by one task that drives the client connection
//! and the upstream connection itself.
//!
//! ```text
//!   read head (httparse) ── anything unusual ──> hand the bytes and the stream to hyper
//!        │                                        (HTTP/1.0, upgrades, Expect, chunked or
//!        │                                         large bodies, malformed heads, h2c)
//!   route + decide (the same Proxy::decide as hyper's path)
//!        │
//!   404 / redirect / 503 ─────────────> local response
//!   forward: rewrite the head byte for byte → pooled upstream stream → response head
//!        → relay the body as it is framed (length, chunked, until close) → log + metrics
//!        → next request on the same connection
//! ```
//!
//! Profiles of the hyper server + client pair showed a flat cost spread over building and
//! dropping requests, responses and header maps twice per request; this path copies bytes
//! instead, and keeps every rule (forwarding headers, hop-by-hop stripping, status codes,
//! timeouts, metrics, access log) in shared, table-tested functions.

pub mod chunked;
mod deadline;
pub mod head;
pub mod rewind;
pub mod streams;

use std::pin::pin;
use std::sync::Arc;
use std::time::Instant;

use bytes::{Buf, BytesMut};
use http::{StatusCode, Version};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

use deadline::Deadline;
use head::{Framing, RequestParse, ResponseContext, ResponseParse};
use rewind::Rewind;
use streams::Upstream;

use super::listener::HttpSettings;
use super::upstream::UpstreamError;
use super::{ConnInfo, Decision, Forward, Outcome, Proxy, Record};
use crate::snapshot::Route;
use crate::snapshot::host::request_host;

/// Room made for a client's next request head: most are well under this, and an idle
/// kept-alive connection holds its buffer.
const HEAD_READ: usize = 4 * 1024;
/// Bytes asked for per read of an upstream response.
const READ_SIZE: usize = 16 * 1024;
/// Largest upstream response head accepted (then 502).
const MAX_RESPONSE_HEAD: usize = 64 * 1024;

/// How a connection left the fast path.
pub enum Ended<IO> {
    Closed,
    /// The next request is hyper's: the bytes read so far go back in front of the stream.
    HandOff(Rewind<IO>),
}

/// Serves HTTP/1.1 requests on `io` until the client closes, an error closes it, shutdown
/// begins, or a request needs hyper.
pub async fn serve<IO>(
    proxy: &Proxy,
    io: IO,
    conn: &ConnInfo,
    settings: &HttpSettings,
    stop: &CancellationToken,
) -> Ended<IO>
where
    IO: AsyncRead + AsyncWrite + Unpin,
{
    let mut client = Client {
        proxy,
        conn,
        settings,
        stop,
        io,
        inbuf: BytesMut::with_capacity(HEAD_READ),
        request: Vec::with_capacity(1024),
        response: Vec::with_capacity(1024),
        headers_due: Deadline::new(),
        response_due: Deadline::new(),
    };
    let mut stopped = pin!(stop.cancelled());
    let mut waiting_since = Instant::now();
    loop {
        let prepared = match client.next_request(stopped.as_mut(), waiting_since).await {
            Next::Request(prepared) => prepared,
            Next::HandOff => {
                let Client { inbuf, io, .. } = client;
                return Ended::HandOff(Rewind::new(inbuf.freeze(), io));
            }
            Next::Closed => return Ended::Closed,
        };
        match client.serve_one(prepared).await {
            Some(finished) => waiting_since = finished,
            None => {
                let _ = client.io.shutdown().await;
                return Ended::Closed;
            }
        }
    }
}

struct Client<'a, IO> {
    proxy: &'a Proxy,
    conn: &'a ConnInfo,
    settings: &'a HttpSettings,
    stop: &'a CancellationToken,
    io: IO,
    inbuf: BytesMut,
    /// The upstream request, kept whole so it can be sent again on a fresh connection.
    request: Vec<u8>,
    /// The client's response head, with the first body bytes behind it.
    response: Vec<u8>,
    headers_due: Deadline,
    response_due: Deadline,
}

enum Next {
    Request(Prepared),
    HandOff,
    Closed,
}

/// A request read and decided; its upstream head (if any) is in `Client::request`.
struct Prepared {
    head_len: usize,
    body_len: usize,
    started: Instant,
    action: Decision,
    route: Option<Arc<Route>>,
    head_request: bool,
    idempotent: bool,
    close: bool,
    /// Method, target and host, when the access log is on.
    logged: Option<(String, String, Option<String>)>,
}

/// Why an exchange with the upstream failed.
enum Failure {
    /// A reused connection failed before any answer: worth one more try on a new one.
    Stale(UpstreamError),
    Error(UpstreamError),
}

enum Parsed {
    Partial,
    HandOff,
    Ready(Prepared),
}

impl<IO: AsyncRead + AsyncWrite + Unpin> Client<'_, IO> {
    /// Reads until a whole request head (and its small body) is buffered.
    async fn next_request(
        &mut self,
        mut stopped: std::pin::Pin<&mut tokio_util::sync::WaitForCancellationFuture<'_>>,
        waiting_since: Instant,
    ) -> Next {
        self.headers_due
            .set(waiting_since + self.settings.header_read_timeout);
        let prepared = loop {
            if !self.inbuf.is_empty() {
                match self.prepare() {
                    Parsed::Ready(prepared) => break prepared,
                    Parsed::Partial if self.inbuf.len() < self.settings.max_header_size => {}
                    // Too large, or not ours: hyper answers (431, 400) or serves it.
                    Parsed::Partial | Parsed::HandOff => return Next::HandOff,
                }
            }
            self.inbuf.reserve(HEAD_READ);
            let read = tokio::select! {
                biased;
                () = stopped.as_mut(), if self.inbuf.is_empty() => return Next::Closed,
                () = self.headers_due.expired() => {
                    tracing::debug!(peer = %self.conn.peer, "request head not received in time");
                    return Next::Closed;
                }
                read = self.io.read_buf(&mut self.inbuf) => read,
            };
            if !matches!(read, Ok(n) if n > 0) {
                return Next::Closed;
            }
        };
        // A small body, read whole so the request can be sent (and resent) in one write.
        let total = prepared.head_len + prepared.body_len;
        while self.inbuf.len() < total {
            self.inbuf.reserve(total - self.inbuf.len());
            let read = tokio::select! {
                () = self.headers_due.expired() => return Next::Closed,
                read = self.io.read_buf(&mut self.inbuf) => read,
            };
            if !matches!(read, Ok(n) if n > 0) {
                return Next::Closed;
            }
        }
        if matches!(prepared.action, Decision::Forward(_)) {
            self.request
                .extend_from_slice(&self.inbuf[prepared.head_len..total]);
        }
        self.inbuf.advance(total);
        Next::Request(prepared)
    }

    /// Parses the buffered head and decides what to do with it, writing the upstream head.
    fn prepare(&mut self) -> Parsed {
        let mut storage = [httparse::EMPTY_HEADER; head::MAX_HEADERS];
        let req = match head::parse_request(&self.inbuf, &mut storage) {
            RequestParse::Complete(req) => req,
            RequestParse::Partial => return Parsed::Partial,
            RequestParse::HandOff => return Parsed::HandOff,
        };
        let started = Instant::now();
        let host = std::str::from_utf8(req.host).ok().and_then(request_host);
        let path = req.target.split_once('?').map_or(req.target, |(p, _)| p);
        let route = self.proxy.route_for(host.as_deref(), path);
        let action = self
            .proxy
            .decide(route.as_ref(), self.conn, host.as_deref(), req.target);
        if matches!(action, Decision::Forward(_)) {
            head::write_upstream_head(&mut self.request, &req, &self.conn.client);
        }
        let logged = self.proxy.settings.access_log.then(|| {
            (
                req.method.to_string(),
                req.target.to_string(),
                host.as_deref().map(str::to_string),
            )
        });
        Parsed::Ready(Prepared {
            head_len: req.head_len,
            body_len: req.body_len,
            started,
            action,
            route,
            head_request: req.is_head(),
            idempotent: req.idempotent(),
            close: req.close,
            logged,
        })
    }

    /// Answers one request. Returns when it finished, or `None` if the connection must close.
    async fn serve_one(&mut self, prepared: Prepared) -> Option<Instant> {
        let hsts = self
            .proxy
            .settings
            .hsts
            .as_ref()
            .filter(|_| self.conn.https)
            .map(http::HeaderValue::as_bytes);
        let mut ctx = ResponseContext {
            head_request: prepared.head_request,
            close: prepared.close || self.stop.is_cancelled(),
            hsts,
        };
        let Prepared {
            action,
            started,
            idempotent,
            ..
        } = prepared;
        let (status, outcome, keep_open) = match action {
            Decision::Respond(code) => {
                head::write_local(&mut self.response, code, None, &ctx);
                (code.as_u16(), Outcome::LOCAL, self.write_response().await)
            }
            Decision::Redirect(location) => {
                let code = StatusCode::PERMANENT_REDIRECT;
                head::write_local(&mut self.response, code, Some(&location), &ctx);
                (code.as_u16(), Outcome::LOCAL, self.write_response().await)
            }
            Decision::Fail(error) => {
                let code = error.status();
                head::write_local(&mut self.response, code, None, &ctx);
                let outcome = Outcome {
                    upstream: None,
                    error: Some(error),
                };
                (code.as_u16(), outcome, self.write_response().await)
            }
            Decision::Forward(forward) => {
                self.exchange(forward, started, idempotent, &mut ctx).await
            }
        };
        let finished = Instant::now();
        let logged = prepared.logged.as_ref();
        self.proxy.record(&Record {
            conn: self.conn,
            route: prepared.route.as_deref(),
            status,
            elapsed: finished.saturating_duration_since(started),
            request: logged.map(|(m, t, _)| (m.as_str(), t.as_str())),
            host: logged.and_then(|(_, _, h)| h.as_deref()),
            version: Version::HTTP_11,
            outcome: &outcome,
        });
        (keep_open && !ctx.close).then_some(finished)
    }

    /// Sends the request upstream and relays the response. Returns the status, the outcome,
    /// and whether the client connection can carry another request.
    async fn exchange(
        &mut self,
        forward: Forward,
        started: Instant,
        idempotent: bool,
        ctx: &mut ResponseContext<'_>,
    ) -> (u16, Outcome, bool) {
        let Forward {
            key,
            in_flight,
            timeout,
        } = forward;
        self.response_due.set(started + timeout);
        let streams = &self.proxy.streams;
        let first = tokio::select! {
            up = streams.checkout(&key, started) => up,
            () = self.response_due.expired() => Err(UpstreamError::ResponseTimeout(timeout)),
        };
        let mut result = match first {
            Ok(up) => self.send(up, idempotent, timeout, ctx).await,
            Err(error) => Err(Failure::Error(error)),
        };
        if let Err(Failure::Stale(error)) = &result {
            tracing::debug!(upstream = %key, %error, "kept-alive upstream connection was closed; retrying on a new one");
            let fresh = tokio::select! {
                up = streams.connect(&key) => up,
                () = self.response_due.expired() => Err(UpstreamError::ResponseTimeout(timeout)),
            };
            result = match fresh {
                Ok(up) => self.send(up, idempotent, timeout, ctx).await,
                Err(error) => Err(Failure::Error(error)),
            };
        }
        drop(in_flight);
        let (response, up) = match result {
            Ok(pair) => pair,
            Err(Failure::Stale(error) | Failure::Error(error)) => {
                let code = error.status();
                head::write_local(&mut self.response, code, None, ctx);
                let outcome = Outcome {
                    upstream: Some(key),
                    error: Some(error),
                };
                return (code.as_u16(), outcome, self.write_response().await);
            }
        };
        ctx.close |= response.close_client;
        let status = response.status;
        let (keep_open, up) = self.relay(response, up).await;
        if let Some(up) = up {
            streams.checkin(&key, up, Instant::now());
        }
        let outcome = Outcome {
            upstream: Some(key),
            error: None,
        };
        (status, outcome, keep_open)
    }

    /// Writes the request and reads the response head into `self.response`, passing any 1xx
    /// heads on to the client.
    async fn send(
        &mut self,
        mut up: Upstream,
        idempotent: bool,
        timeout: std::time::Duration,
        ctx: &mut ResponseContext<'_>,
    ) -> Result<(head::Response, Upstream), Failure> {
        let reused = up.reused;
        let stale_or = |error: UpstreamError, retry: bool| {
            if reused && retry {
                Failure::Stale(error)
            } else {
                Failure::Error(error)
            }
        };
        if let Err(err) = up.stream.write_all(&self.request).await {
            return Err(stale_or(UpstreamError::Protocol(err.to_string()), true));
        }
        let mut answered = false;
        loop {
            if !up.buf.is_empty() {
                answered = true;
                // Shutdown may have begun while the upstream worked: say so in this response.
                ctx.close |= self.stop.is_cancelled();
                match head::rewrite_response(&up.buf, ctx, &mut self.response) {
                    ResponseParse::Complete(response) if response.informational => {
                        up.buf.advance(response.head_len);
                        if self.io.write_all(&self.response).await.is_err() {
                            let error = UpstreamError::Protocol("client went away".into());
                            return Err(Failure::Error(error));
                        }
                        continue;
                    }
                    ResponseParse::Complete(response) => {
                        up.buf.advance(response.head_len);
                        return Ok((response, up));
                    }
                    ResponseParse::Partial if up.buf.len() < MAX_RESPONSE_HEAD => {}
                    ResponseParse::Partial => {
                        let error = UpstreamError::Protocol("response head too large".into());
                        return Err(Failure::Error(error));
                    }
                    ResponseParse::Invalid(why) => {
                        return Err(Failure::Error(UpstreamError::Protocol(why.into())));
                    }
                }
            }
            up.buf.reserve(READ_SIZE);
            let read = tokio::select! {
                read = up.stream.read_buf(&mut up.buf) => read,
                () = self.response_due.expired() => {
                    return Err(Failure::Error(UpstreamError::ResponseTimeout(timeout)));
                }
            };
            match read {
                Ok(0) => {
                    let error =
                        UpstreamError::Protocol("connection closed before a response".into());
                    return Err(stale_or(error, !answered && idempotent));
                }
                Ok(_) => {}
                Err(err) => {
                    let error = UpstreamError::Protocol(err.to_string());
                    return Err(stale_or(error, !answered && idempotent));
                }
            }
        }
    }

    /// Relays the response head and body. Returns whether the client connection is still
    /// usable, and the upstream connection if it can be reused.
    async fn relay(
        &mut self,
        response: head::Response,
        mut up: Upstream,
    ) -> (bool, Option<Upstream>) {
        let mut framing = response.framing;
        let Ok((n, mut done)) = framing.take(&up.buf) else {
            return (false, None);
        };
        self.response.extend_from_slice(&up.buf[..n]);
        up.buf.advance(n);
        if !self.write_response().await {
            return (false, None);
        }
        while !done {
            if up.buf.is_empty() {
                up.buf.reserve(READ_SIZE);
                match up.stream.read_buf(&mut up.buf).await {
                    Ok(0) if framing == Framing::UntilClose => break,
                    Ok(n) if n > 0 => {}
                    // Cut short: the client cannot be told, only disconnected.
                    _ => return (false, None),
                }
            }
            let Ok((n, end)) = framing.take(&up.buf) else {
                return (false, None);
            };
            if self.io.write_all(&up.buf[..n]).await.is_err() {
                return (false, None);
            }
            up.buf.advance(n);
            done = end;
        }
        if self.io.flush().await.is_err() {
            return (false, None);
        }
        let reusable = done && response.reusable && up.buf.is_empty();
        (true, reusable.then_some(up))
    }

    async fn write_response(&mut self) -> bool {
        self.io.write_all(&self.response).await.is_ok() && self.io.flush().await.is_ok()
    }
}
