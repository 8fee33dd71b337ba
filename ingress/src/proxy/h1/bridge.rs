//! HTTP/1.x clients of HTTP/2-only upstreams (`backend-protocol: GRPC`/`GRPCS`, a Service port's
//! `appProtocol: kubernetes.io/h2c`), as nginx's `grpc_pass` serves them: the request goes
//! through the HTTP/2 path's forwarding (`Proxy::forward`: header rewriting, the multiplexed
//! pool, retries, timeouts), and the response comes back in HTTP/1.1 framing.
//!
//! ```text
//!   prepare (mod.rs): phases as for any request → Bridged (method, headers, targets)
//!   body pump: client bytes (Content-Length, or chunked decoded) → a one-piece channel ─┐
//!   Proxy::forward → multiplexed pool → response head                                   │ one task,
//!   head → HTTP/1.1 by response::rewrite (Server, Date, HSTS, edits, framing, close)    │ polled
//!   body: the upstream's content-length as is; else chunked, its trailers only to a     │ together
//!         client that sent `TE: trailers`; HTTP/1.0: until close; HEAD/204/304: none ────┘
//! ```
//!
//! An upgrade (WebSocket) is refused with 501 before it gets here: RFC 8441's extended CONNECT
//! is not spoken to upstreams. The client connection stays open for its next request unless
//! the body was not read to its end (the upstream answered early, or the client stalled).

use std::pin::pin;
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use http_body_util::BodyExt;
use hyper::body::Body;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

use ingress_wire::chunked::{self, Chunked};
use ingress_wire::request::{BodyFraming, RequestHead};

use super::deadline::Deadline;
use super::response::{self, Framing, ResponseContext, ResponseParse};
use super::{Client, Prepared, READ_SIZE, write_timed};
use crate::proxy::access_log::UpstreamMeter;
use crate::proxy::pool::ClientBody;
use crate::proxy::upstream::UpstreamError;
use crate::proxy::{Forward, Outcome, ProxyBody, forward, respond};

/// An HTTP/1.x request as the HTTP/2 path's forwarding takes it.
pub(super) struct Bridged {
    method: http::Method,
    /// The client's headers (hop-by-hop ones are removed by `forward::rewrite_request`), the
    /// request id the access log names, and the upstream span's context.
    headers: HeaderMap,
    /// The routed (and rewritten) target, in origin form.
    target: String,
    /// The authority the client named, as it named it.
    authority: String,
    /// The target as the client sent it (`X-Original-URI`).
    original: String,
    /// The client sent `TE: trailers`: it may be sent the upstream's trailers.
    trailers: bool,
}

impl Bridged {
    pub(super) fn new(
        req: &RequestHead<'_, '_>,
        target: String,
        authority: &str,
        fresh_id: &[u8],
        traced: Vec<(&'static str, HeaderValue)>,
    ) -> Self {
        let mut headers = HeaderMap::with_capacity(req.headers.len() + 2);
        for h in req.headers {
            // The parser admitted only valid names and values; one `http` rejects is dropped.
            if let (Ok(name), Ok(value)) = (
                HeaderName::from_bytes(h.name.as_bytes()),
                HeaderValue::from_bytes(h.value),
            ) {
                headers.append(name, value);
            }
        }
        // The id the access log names is the one the upstream is sent.
        let usable = headers
            .get(&forward::X_REQUEST_ID)
            .is_some_and(|id| ingress_wire::header::usable_request_id(id.as_bytes()));
        if !usable && let Ok(id) = HeaderValue::from_bytes(fresh_id) {
            headers.insert(forward::X_REQUEST_ID.clone(), id);
        }
        // The upstream span's context replaces the client's traceparent.
        for (name, value) in traced {
            headers.insert(name, value);
        }
        let trailers = headers.get_all(header::TE).iter().any(|v| {
            ingress_wire::header::tokens(v.as_bytes()).any(|t| {
                let coding = t.split(|&b| b == b';').next().unwrap_or(t).trim_ascii();
                coding.eq_ignore_ascii_case(b"trailers")
            })
        });
        Self {
            method: http::Method::from_bytes(req.method.as_bytes()).unwrap_or_default(),
            headers,
            target,
            authority: authority.to_string(),
            original: req.target.to_string(),
            trailers,
        }
    }
}

/// How reading the client's body ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pumped {
    Done,
    /// The upstream stopped taking it (it answered, or its stream ended): the rest is unread.
    UpstreamStopped,
    ClientGone,
    Stalled,
    Malformed,
}

/// What became of the exchange, before anything the proxy answers itself is written.
enum Relayed {
    /// The upstream's response (or, for a gRPC request, the gRPC-shaped failure) was written.
    Sent { status: u16, keep_open: bool },
    /// The proxy answers with `code` itself; `upstream` when it is the upstream's status (an
    /// intercepted `custom-http-errors` one).
    Own { code: StatusCode, upstream: bool },
}

impl<IO: AsyncRead + AsyncWrite + Unpin> Client<'_, IO> {
    /// Forwards a request to an HTTP/2-only upstream and answers the client in HTTP/1.x.
    /// Returns the status, the outcome, and whether the client connection can carry another
    /// request.
    pub(super) async fn bridge(
        &mut self,
        forward: Forward,
        p: &mut Prepared,
        ctx: &mut ResponseContext<'_>,
    ) -> (u16, Outcome, bool) {
        let Some(bridged) = p.bridged.take() else {
            // `prepare` makes one for every forward to an HTTP/2 upstream with a target.
            let error = UpstreamError::Protocol("no request to send".into());
            return self
                .answer_own(p, ctx, error.status(), false, Outcome::LOCAL)
                .await;
        };
        let Bridged {
            method,
            headers,
            target,
            authority,
            original,
            trailers,
        } = *bridged;
        self.meter.canary = forward.canary;
        let grpc = respond::is_grpc(&headers);
        let (pieces, body) = match p.body {
            BodyFraming::None | BodyFraming::Length(0) => (None, ClientBody::Empty),
            framing => {
                let (tx, rx) = mpsc::channel(1);
                let length = match framing {
                    BodyFraming::Length(n) => Some(n),
                    _ => None,
                };
                let body = ClientBody::H1 {
                    pieces: rx,
                    length,
                    ended: false,
                };
                (Some(tx), body)
            }
        };
        let waiting = match p.body {
            BodyFraming::None => false,
            BodyFraming::Length(n) => (self.inbuf.len() as u64) < n,
            BodyFraming::Chunked => true,
        };
        if p.expect_continue && waiting && !self.continue_client().await {
            return (499, client_gone(None), false);
        }
        let mut req = http::Request::new(body);
        *req.method_mut() = method;
        *req.headers_mut() = headers;
        let vhost = forward.vhost.clone();
        let side = forward::RequestSide {
            host: vhost.as_deref(),
            authority: &authority,
            original_uri: &original,
        };
        let proxy = self.proxy;
        let conn = p.client.as_deref().unwrap_or(self.conn);
        let body_timeout = proxy.settings.client_body_timeout;
        let send_timeout = proxy.settings.client_send_timeout;
        ctx.close |= self.stop.is_cancelled();
        // The route's cookies and headers are already in the response (`Proxy::forward`).
        let head_ctx = ResponseContext {
            set_cookie: None,
            auth: None,
            set_headers: &[],
            ..*ctx
        };
        let head_request = p.head_request;
        let errors = p.errors.as_deref();
        let framing = p.body;
        let upstream_started = Instant::now();
        let mut taken = 0u64;
        let mut body_sent = 0u64;
        let (relayed, outcome, pumped) = {
            let (mut rd, mut wr) = tokio::io::split(&mut self.io);
            let inbuf = &mut self.inbuf;
            let out = &mut self.response;
            let client_due = &mut self.client_due;
            let mut pumped = pieces.is_none().then_some(Pumped::Done);
            let mut pump = pin!(async {
                match pieces {
                    Some(tx) => pump(&mut rd, inbuf, framing, tx, body_timeout, &mut taken).await,
                    None => Pumped::Done,
                }
            });
            let mut forwarded = pin!(proxy.forward(req, forward, &target, &side, conn));
            let (response, outcome) = loop {
                tokio::select! {
                    sent = &mut forwarded => break sent,
                    done = &mut pump, if pumped.is_none() => pumped = Some(done),
                }
            };
            let status = response.status();
            let answered = outcome.error.is_none() && outcome.upstream.is_some();
            let intercepted =
                answered && errors.is_some_and(|e| e.plan.wants(status.as_u16(), true));
            let relayed = if intercepted || !(answered || grpc) {
                // Dropped unread: its stream is reset, nothing of it reaches the client.
                drop(response);
                Relayed::Own {
                    code: status,
                    upstream: answered,
                }
            } else {
                let mut head = Vec::with_capacity(512);
                h1_head(&response, head_request, &mut head);
                match response::rewrite(&head, &head_ctx, out) {
                    ResponseParse::Complete(parsed) if !parsed.informational => {
                        let relay = relay_body(
                            &mut wr,
                            out,
                            response.into_body(),
                            &parsed,
                            trailers,
                            client_due,
                            send_timeout,
                            &mut body_sent,
                        );
                        let mut relay = pin!(relay);
                        let written = loop {
                            tokio::select! {
                                written = &mut relay => break written,
                                done = &mut pump, if pumped.is_none() => pumped = Some(done),
                            }
                        };
                        Relayed::Sent {
                            status: status.as_u16(),
                            keep_open: written && !parsed.close_client,
                        }
                    }
                    _ => {
                        tracing::debug!(
                            status = status.as_u16(),
                            "an HTTP/2 upstream's response head cannot be given in HTTP/1.1"
                        );
                        Relayed::Own {
                            code: StatusCode::BAD_GATEWAY,
                            upstream: false,
                        }
                    }
                }
            };
            (relayed, outcome, pumped)
        };
        self.meter.request_bytes += taken;
        // A body not read to its end would be taken for the next request.
        if pumped != Some(Pumped::Done) {
            ctx.close = true;
        }
        match relayed {
            Relayed::Sent { status, keep_open } => {
                self.meter.body_bytes_sent += body_sent;
                self.meter.upstream = outcome.upstream.clone().map(|key| {
                    let mut meter = if outcome.error.is_none() {
                        UpstreamMeter::answered(key, upstream_started, status)
                    } else {
                        UpstreamMeter::failed(key, upstream_started)
                    };
                    meter.finish(body_sent);
                    meter
                });
                (status, outcome, keep_open && !ctx.close)
            }
            Relayed::Own { code, upstream } => {
                self.meter.upstream = outcome.upstream.clone().map(|key| {
                    if upstream {
                        UpstreamMeter::answered(key, upstream_started, code.as_u16())
                    } else {
                        UpstreamMeter::failed(key, upstream_started)
                    }
                });
                let (code, outcome) = match pumped {
                    Some(Pumped::ClientGone) => return (499, client_gone(outcome.upstream), false),
                    Some(Pumped::Stalled) => (
                        StatusCode::REQUEST_TIMEOUT,
                        refused(outcome, "the request body stalled"),
                    ),
                    Some(Pumped::Malformed) => (
                        StatusCode::BAD_REQUEST,
                        refused(outcome, "malformed chunked request body"),
                    ),
                    _ => (code, outcome),
                };
                self.answer_own(p, ctx, code, upstream, outcome).await
            }
        }
    }

    /// Answers with the proxy's own page for `code`, or the error backend's
    /// (`custom-http-errors`) when it wants `code`.
    async fn answer_own(
        &mut self,
        p: &Prepared,
        ctx: &ResponseContext<'_>,
        code: StatusCode,
        upstream: bool,
        outcome: Outcome,
    ) -> (u16, Outcome, bool) {
        let pageable = outcome.refused.is_none();
        if let Some(errors) = p
            .errors
            .as_deref()
            .filter(|e| pageable && e.plan.wants(code.as_u16(), upstream))
        {
            let (status, keep_open) = self.error_page(errors, code, ctx).await;
            return (status, outcome, keep_open);
        }
        response::write_local(&mut self.response, code, None, ctx);
        self.meter.body_bytes_sent = super::local_body_len(&self.response);
        (code.as_u16(), outcome, self.write_response().await)
    }
}

fn client_gone(upstream: Option<crate::proxy::pool::PoolKey>) -> Outcome {
    Outcome {
        upstream,
        error: Some(UpstreamError::Protocol("client went away".into())),
        refused: None,
    }
}

fn refused(outcome: Outcome, reason: &'static str) -> Outcome {
    Outcome {
        upstream: outcome.upstream,
        error: None,
        refused: Some(reason),
    }
}

/// Reads the client's body from `inbuf` and the connection (a chunked one decoded: its
/// extensions and trailers dropped) and hands it to the upstream's stream a piece at a time.
/// Dropping `tx` without the final `None` resets that stream.
async fn pump<R: AsyncRead + Unpin>(
    rd: &mut R,
    inbuf: &mut BytesMut,
    framing: BodyFraming,
    tx: mpsc::Sender<Option<Bytes>>,
    timeout: Duration,
    taken: &mut u64,
) -> Pumped {
    let mut left = match framing {
        BodyFraming::Length(n) => n,
        _ => 0,
    };
    let mut decoder = (framing == BodyFraming::Chunked).then(Chunked::default);
    loop {
        let (piece, done) = match &mut decoder {
            None => {
                let n = usize::try_from(left).unwrap_or(usize::MAX).min(inbuf.len());
                left -= n as u64;
                *taken += n as u64;
                (inbuf.split_to(n).freeze(), left == 0)
            }
            Some(decoder) => {
                let mut piece = BytesMut::new();
                let mut done = false;
                while !inbuf.is_empty() && !done {
                    let step = match decoder.decode(inbuf) {
                        Ok(step) => step,
                        Err(err) => {
                            tracing::debug!(%err, "malformed chunked request body");
                            return Pumped::Malformed;
                        }
                    };
                    piece.extend_from_slice(&inbuf[step.data.clone()]);
                    done = step.done;
                    inbuf.advance(step.consumed);
                    *taken += step.consumed as u64;
                }
                (piece.freeze(), done)
            }
        };
        if !piece.is_empty() && tx.send(Some(piece)).await.is_err() {
            return Pumped::UpstreamStopped;
        }
        if done {
            // The upstream may have stopped listening already; the body was read whole anyway.
            let _ = tx.send(None).await;
            return Pumped::Done;
        }
        inbuf.reserve(READ_SIZE);
        // The upstream's side ending stops the wait, so an early answer is not held up by a
        // client that is still thinking.
        let read = tokio::select! {
            read = tokio::time::timeout(timeout, rd.read_buf(inbuf)) => read,
            () = tx.closed() => return Pumped::UpstreamStopped,
        };
        match read {
            Ok(Ok(n)) if n > 0 => {}
            Ok(_) => return Pumped::ClientGone,
            Err(_) => {
                tracing::debug!("request body stalled");
                return Pumped::Stalled;
            }
        }
    }
}

/// The upstream's response head as an HTTP/1.1 head, for `response::rewrite` to make the
/// client's from, as it does an HTTP/1.1 upstream's: its content-length kept, else a chunked
/// body (or none, for a stream already ended, and where no body may follow).
fn h1_head(response: &http::Response<ProxyBody>, head_request: bool, out: &mut Vec<u8>) {
    let status = response.status();
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(status.as_str().as_bytes());
    out.extend_from_slice(b" \r\n");
    for (name, value) in response.headers() {
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    let bodiless = head_request
        || status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED;
    if !bodiless && !response.headers().contains_key(header::CONTENT_LENGTH) {
        if response.body().is_end_stream() {
            out.extend_from_slice(b"content-length: 0\r\n");
        } else {
            out.extend_from_slice(b"transfer-encoding: chunked\r\n");
        }
    }
    out.extend_from_slice(b"\r\n");
}

/// Writes the head in `out`, then the body as `parsed` frames it. Returns whether all of it
/// was written; a body cut short or stalled can only be told by disconnecting.
#[allow(clippy::too_many_arguments)]
async fn relay_body<W: AsyncWrite + Unpin>(
    wr: &mut W,
    out: &mut Vec<u8>,
    mut body: ProxyBody,
    parsed: &response::Response,
    trailers_wanted: bool,
    due: &mut Deadline,
    timeout: Duration,
    sent: &mut u64,
) -> bool {
    if write_timed(wr, out, due, timeout).await.is_err() {
        return false;
    }
    if parsed.framing == Framing::Empty {
        return wr.flush().await.is_ok();
    }
    let chunk = matches!(parsed.framing, Framing::Chunked(_)) && !parsed.dechunk;
    let mut trailers = None;
    loop {
        let frame = match body.frame().await {
            None => break,
            Some(Ok(frame)) => frame,
            Some(Err(err)) => {
                tracing::debug!(%err, "HTTP/2 upstream's response body failed");
                return false;
            }
        };
        let data = match frame.into_data() {
            Ok(data) => data,
            Err(frame) => {
                trailers = frame.into_trailers().ok();
                continue;
            }
        };
        if data.is_empty() {
            continue;
        }
        out.clear();
        if chunk {
            chunked::encode_chunk(&data, out);
        } else {
            out.extend_from_slice(&data);
        }
        if write_timed(wr, out, due, timeout).await.is_err() {
            return false;
        }
        *sent += data.len() as u64;
        // Pieces are written as they come: a streaming response reaches the client at once.
        if wr.flush().await.is_err() {
            return false;
        }
    }
    if chunk {
        out.clear();
        match trailers.filter(|_| trailers_wanted) {
            Some(fields) => {
                out.extend_from_slice(b"0\r\n");
                for (name, value) in &fields {
                    out.extend_from_slice(name.as_str().as_bytes());
                    out.extend_from_slice(b": ");
                    out.extend_from_slice(value.as_bytes());
                    out.extend_from_slice(b"\r\n");
                }
                out.extend_from_slice(b"\r\n");
            }
            None => out.extend_from_slice(chunked::LAST_CHUNK),
        }
        if write_timed(wr, out, due, timeout).await.is_err() {
            return false;
        }
    }
    out.clear();
    wr.flush().await.is_ok()
}

#[cfg(test)]
mod tests {
    use http_body_util::{Either, Full};

    use super::*;

    fn upstream(
        status: u16,
        length: Option<&'static str>,
        body: &'static str,
    ) -> http::Response<ProxyBody> {
        let mut response =
            http::Response::new(Either::Right(Either::Right(Full::new(Bytes::from(body)))));
        *response.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::OK);
        if let Some(length) = length {
            response
                .headers_mut()
                .insert(header::CONTENT_LENGTH, HeaderValue::from_static(length));
        }
        response
            .headers_mut()
            .insert("x-a", HeaderValue::from_static("1"));
        response
    }

    #[test]
    fn h1_heads_keep_a_length_else_chunk_a_body_that_may_follow() {
        let cases: &[(u16, Option<&'static str>, &'static str, bool, &str)] = &[
            // (status, content-length, body, HEAD request) -> head
            (
                200,
                Some("3"),
                "abc",
                false,
                "content-length: 3\r\nx-a: 1\r\n",
            ),
            (
                200,
                None,
                "abc",
                false,
                "x-a: 1\r\ntransfer-encoding: chunked\r\n",
            ),
            (200, None, "", false, "x-a: 1\r\ncontent-length: 0\r\n"),
            (200, None, "abc", true, "x-a: 1\r\n"),
            (204, None, "", false, "x-a: 1\r\n"),
            (304, None, "", false, "x-a: 1\r\n"),
        ];
        for &(status, length, body, head, want) in cases {
            let mut out = Vec::new();
            h1_head(&upstream(status, length, body), head, &mut out);
            assert_eq!(
                String::from_utf8_lossy(&out),
                format!("HTTP/1.1 {status} \r\n{want}\r\n"),
                "{status} {length:?} {body:?} head={head}"
            );
        }
    }
}
