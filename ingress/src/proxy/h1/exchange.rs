//! One request forwarded: the upstream connection, the request body, the response.
//!
//! ```text
//!   body ≤ BUFFERED_BODY: read whole → head + body in one write ─┐ a reused connection that
//!                                                                │ fails before answering is
//!   larger or chunked: head → body streamed (chunked re-encoded) │ retried once on a new one
//!        the upstream answering early stops the upload ──────────┤ (idempotent requests only,
//!                                                                │ once bytes were taken)
//!   response head (1xx passed on) → body relayed as framed ──────┘
//! ```

use std::time::Instant;

use bytes::Buf;
use http::StatusCode;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};

use ingress_wire::chunked::{self, Chunked};
use ingress_wire::request::BodyFraming;

use super::response::{self, Framing, ResponseContext, ResponseParse};
use super::{
    BUFFERED_BODY, Client, MAX_RESPONSE_HEAD, Prepared, READ_SIZE, read_timed, write_timed,
};
use crate::proxy::access_log::UpstreamMeter;
use crate::proxy::phase::upstream;
use crate::proxy::streams::Upstream;
use crate::proxy::upstream::UpstreamError;
use crate::proxy::{Forward, Outcome};
use crate::snapshot::annotations::rate_limit::Bandwidth;

/// Why an exchange with the upstream failed.
pub(super) enum Failure {
    /// A reused connection failed before any answer: worth one more try on a new one.
    Stale(UpstreamError),
    Error(UpstreamError),
    /// The client went away: nothing can be answered.
    ClientGone,
    /// The client paused too long in its body (408) or sent a malformed one (400).
    Client(StatusCode, &'static str),
}

/// How the request body goes upstream.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Upload {
    /// No body, or a small one already appended to the head: one write, which can be repeated.
    WithHead,
    Stream(BodyFraming),
}

/// How sending the request ended.
enum Sent {
    /// All of it; read the response.
    Complete,
    /// The upstream answered before the body was all sent: the rest of it is never read, so
    /// the client connection closes after the response.
    AnsweredEarly,
}

impl<IO: AsyncRead + AsyncWrite + Unpin> Client<'_, IO> {
    /// Sends the request upstream and relays the response. Returns the status, the outcome,
    /// and whether the client connection can carry another request.
    pub(super) async fn exchange(
        &mut self,
        forward: Forward,
        p: &Prepared,
        ctx: &mut ResponseContext<'_>,
    ) -> (u16, Outcome, bool) {
        let Forward {
            mut key,
            transport,
            mut in_flight,
            timeout,
            max_body,
            connect_timeout,
            send_timeout,
            next_upstream,
            reselect,
            canary,
            bandwidth,
            ..
        } = forward;
        self.send_timeout = send_timeout;
        self.meter.canary = canary;
        let upload = self.buffer_small_body(p).await;
        let upstream_started = Instant::now();
        // After a failure reading the body, part of it may be unread: treat it as streamed.
        let sent_as = upload
            .as_ref()
            .ok()
            .copied()
            .unwrap_or(Upload::Stream(p.body));
        let response_due = p.forwarded + timeout;
        self.upstream_due.set(response_due);
        let streams = &self.proxy.streams;
        let mut result = match upload {
            Ok(upload) => {
                let first = tokio::select! {
                    up = streams.checkout(&key, &transport, connect_timeout, p.forwarded) => up,
                    () = self.upstream_due.expired() => Err(UpstreamError::ResponseTimeout(timeout)),
                };
                match first {
                    Ok(up) => self.send(up, upload, p, timeout, max_body, ctx).await,
                    Err(error) => Err(Failure::Error(error)),
                }
            }
            Err(failure) => Err(failure),
        };
        let upload = sent_as;
        if let Err(Failure::Stale(error)) = &result {
            tracing::debug!(upstream = %key, %error, "kept-alive upstream connection was closed; retrying on a new one");
            self.upstream_due.set(response_due);
            let fresh = tokio::select! {
                up = streams.connect(&key, &transport, connect_timeout) => up,
                () = self.upstream_due.expired() => Err(UpstreamError::ResponseTimeout(timeout)),
            };
            result = match fresh {
                Ok(up) => self.send(up, upload, p, timeout, max_body, ctx).await,
                Err(error) => Err(Failure::Error(error)),
            };
        }
        // proxy-next-upstream: a request that can be sent again goes to another endpoint; one
        // that never reached an upstream (no connection) always can.
        let replayable =
            matches!(upload, Upload::WithHead) && (p.idempotent || next_upstream.non_idempotent);
        let mut tried = vec![key.clone()];
        // An affinity session that moved to another endpoint: its cookie replaces the first
        // attempt's in the response.
        let mut moved_cookie: Option<String> = None;
        while let Err(Failure::Error(error)) = &result {
            if !replayable && !upstream::nothing_sent(error) {
                break;
            }
            let next = upstream::retry(&reselect, &next_upstream, &tried, p.forwarded, error);
            let Some(next) = next else {
                break;
            };
            tracing::debug!(upstream = %key, next = %next.key, %error, "trying the next upstream (proxy-next-upstream)");
            drop(in_flight);
            in_flight = Some(next.in_flight);
            key = next.key;
            if next.set_cookie.is_some() {
                moved_cookie = next.set_cookie;
            }
            tried.push(key.clone());
            self.upstream_due.set(Instant::now() + timeout);
            let up = tokio::select! {
                up = streams.checkout(&key, &transport, connect_timeout, Instant::now()) => up,
                () = self.upstream_due.expired() => Err(UpstreamError::ResponseTimeout(timeout)),
            };
            result = match up {
                Ok(up) => {
                    let mut attempt = *ctx;
                    if let Some(cookie) = &moved_cookie {
                        attempt.set_cookie = Some(cookie.as_bytes());
                    }
                    let sent = self
                        .send(up, upload, p, timeout, max_body, &mut attempt)
                        .await;
                    ctx.close |= attempt.close;
                    sent
                }
                Err(error) => Err(Failure::Error(error)),
            };
        }
        drop(in_flight);
        let (response, up, early) = match result {
            Ok(triple) => triple,
            Err(Failure::ClientGone) => {
                self.meter.upstream = Some(UpstreamMeter::failed(key.clone(), upstream_started));
                let outcome = Outcome {
                    upstream: Some(key),
                    error: Some(UpstreamError::Protocol("client went away".into())),
                    refused: None,
                };
                return (499, outcome, false);
            }
            Err(Failure::Client(code, reason)) => {
                ctx.close = true;
                response::write_local(&mut self.response, code, None, ctx);
                self.meter.body_bytes_sent = super::local_body_len(&self.response);
                let outcome = Outcome {
                    upstream: Some(key),
                    error: None,
                    refused: Some(reason),
                };
                return (code.as_u16(), outcome, self.write_response().await);
            }
            Err(Failure::Stale(error) | Failure::Error(error)) => {
                // A body part-way read cannot be resumed by the next request.
                ctx.close |= !matches!(upload, Upload::WithHead);
                let code = error.status();
                self.meter.upstream = Some(UpstreamMeter::failed(key.clone(), upstream_started));
                let outcome = Outcome {
                    upstream: Some(key),
                    error: Some(error),
                    refused: None,
                };
                // custom-http-errors: an upstream failure (502, 504) is the proxy's own answer.
                if let Some(errors) = p
                    .errors
                    .as_deref()
                    .filter(|e| e.plan.wants(code.as_u16(), false))
                {
                    let (status, keep_open) = self.error_page(errors, code, ctx).await;
                    return (status, outcome, keep_open);
                }
                response::write_local(&mut self.response, code, None, ctx);
                self.meter.body_bytes_sent = super::local_body_len(&self.response);
                return (code.as_u16(), outcome, self.write_response().await);
            }
        };
        // custom-http-errors: the upstream's answer with a listed code is replaced by the error
        // backend's page. Its head is not sent and its body never read: the upstream
        // connection is closed (dropped) rather than drained, so nothing of it reaches the
        // client and no unread body is left on a pooled connection.
        if let Some(errors) = p
            .errors
            .as_deref()
            .filter(|e| !response.switching && e.plan.wants(response.status, true))
        {
            drop(up);
            self.meter.upstream = Some(UpstreamMeter::answered(
                key.clone(),
                upstream_started,
                response.status,
            ));
            // An upload the upstream cut short leaves unread body on the client connection.
            ctx.close |= early;
            let code = StatusCode::from_u16(response.status).unwrap_or(StatusCode::BAD_GATEWAY);
            let (status, keep_open) = self.error_page(errors, code, ctx).await;
            let outcome = Outcome {
                upstream: Some(key),
                error: None,
                refused: None,
            };
            return (status, outcome, keep_open && !early);
        }
        let status = response.status;
        self.meter.upstream = Some(UpstreamMeter::answered(
            key.clone(),
            upstream_started,
            status,
        ));
        let (keep_open, up) = self.relay(response, up, timeout, bandwidth).await;
        let sent = self.meter.body_bytes_sent;
        if let Some(upstream) = &mut self.meter.upstream {
            upstream.finish(sent);
        }
        if let Some(up) = up.filter(|_| !early) {
            streams.checkin(&key, &transport, up, Instant::now());
        }
        let outcome = Outcome {
            upstream: Some(key),
            error: None,
            refused: None,
        };
        (status, outcome, keep_open && !early)
    }

    /// A small `Content-Length` body is read whole (after `100 Continue`, if asked for) and
    /// put behind the head, so the request goes out in one write and can be sent again.
    async fn buffer_small_body(&mut self, p: &Prepared) -> Result<Upload, Failure> {
        let n = match p.body {
            BodyFraming::None => return Ok(Upload::WithHead),
            BodyFraming::Length(n) if n <= BUFFERED_BODY => n,
            framing => return Ok(Upload::Stream(framing)),
        };
        // BUFFERED_BODY fits in usize.
        let n = usize::try_from(n).unwrap_or(usize::MAX);
        if p.expect_continue && self.inbuf.len() < n && !self.continue_client().await {
            return Err(Failure::ClientGone);
        }
        let timeout = self.proxy.settings.client_body_timeout;
        while self.inbuf.len() < n {
            match read_timed(&mut self.io, &mut self.inbuf, &mut self.client_due, timeout).await {
                Ok(read) if read > 0 => {}
                Err(err) if err.kind() == std::io::ErrorKind::TimedOut => {
                    tracing::debug!(peer = %self.conn.peer, "request body stalled");
                    return Err(Failure::Client(
                        StatusCode::REQUEST_TIMEOUT,
                        "the request body stalled",
                    ));
                }
                _ => return Err(Failure::ClientGone),
            }
        }
        self.request.extend_from_slice(&self.inbuf[..n]);
        self.inbuf.advance(n);
        self.meter.request_bytes += n as u64;
        Ok(Upload::WithHead)
    }

    /// Tells an `Expect: 100-continue` client to send its body.
    pub(super) async fn continue_client(&mut self) -> bool {
        let timeout = self.proxy.settings.client_send_timeout;
        write_timed(
            &mut self.io,
            b"HTTP/1.1 100 Continue\r\n\r\n",
            &mut self.client_due,
            timeout,
        )
        .await
        .is_ok()
    }

    /// Writes the request (and its body) and reads the response head into `self.response`,
    /// passing 1xx heads on to the client.
    async fn send(
        &mut self,
        mut up: Upstream,
        upload: Upload,
        p: &Prepared,
        timeout: std::time::Duration,
        max_body: Option<u64>,
        ctx: &mut ResponseContext<'_>,
    ) -> Result<(response::Response, Upstream, bool), Failure> {
        let reused = up.reused;
        let stale_or = |error: UpstreamError, retry: bool| {
            if reused && retry {
                Failure::Stale(error)
            } else {
                Failure::Error(error)
            }
        };
        let send_timeout = self.send_timeout;
        if let Err(err) = write_timed(
            &mut up.stream,
            &self.request,
            &mut self.upstream_due,
            send_timeout,
        )
        .await
        {
            // Nothing of a streamed body has been taken from the client yet.
            return Err(stale_or(UpstreamError::Protocol(err.to_string()), true));
        }
        let mut early = false;
        if let Upload::Stream(framing) = upload {
            if p.expect_continue && !self.continue_client().await {
                return Err(Failure::ClientGone);
            }
            match self.stream_body(&mut up, framing, max_body).await? {
                Sent::Complete => {}
                Sent::AnsweredEarly => early = true,
            }
        }
        // The upstream's time to answer counts from the request, or from the end of an upload.
        self.upstream_due.set(match upload {
            Upload::WithHead => p.forwarded + timeout,
            Upload::Stream(_) => Instant::now() + timeout,
        });
        let retry_allowed = p.idempotent && matches!(upload, Upload::WithHead);
        let mut answered = false;
        loop {
            if !up.buf.is_empty() {
                answered = true;
                // Shutdown may have begun while the upstream worked: say so in this response.
                ctx.close |= self.stop.is_cancelled();
                match response::rewrite(&up.buf, ctx, &mut self.response) {
                    ResponseParse::Complete(response) if response.informational => {
                        up.buf.advance(response.head_len);
                        if !response.withheld && !self.write_response().await {
                            return Err(Failure::ClientGone);
                        }
                        continue;
                    }
                    ResponseParse::Complete(response) => {
                        up.buf.advance(response.head_len);
                        return Ok((response, up, early));
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
                read = tokio::io::AsyncReadExt::read_buf(&mut up.stream, &mut up.buf) => read,
                () = self.upstream_due.expired() => {
                    return Err(Failure::Error(UpstreamError::ResponseTimeout(timeout)));
                }
            };
            match read {
                Ok(0) => {
                    let error =
                        UpstreamError::Protocol("connection closed before a response".into());
                    return Err(stale_or(error, !answered && retry_allowed));
                }
                Ok(_) => {}
                Err(err) => {
                    let error = UpstreamError::Protocol(err.to_string());
                    return Err(stale_or(error, !answered && retry_allowed));
                }
            }
        }
    }

    /// Streams a request body from the client to the upstream: a `Content-Length` body as it
    /// is, a chunked one re-encoded (extensions and trailers dropped), so the upstream reads
    /// the framing the proxy read. Stops if the upstream answers first, and with 413 when a
    /// chunked body grows past `max_body` (a declared length was judged before).
    async fn stream_body(
        &mut self,
        up: &mut Upstream,
        framing: BodyFraming,
        max_body: Option<u64>,
    ) -> Result<Sent, Failure> {
        let mut received: u64 = 0;
        let body_timeout = self.proxy.settings.client_body_timeout;
        let send_timeout = self.send_timeout;
        let mut left = match framing {
            BodyFraming::Length(n) => n,
            _ => 0,
        };
        let mut chunked = (framing == BodyFraming::Chunked).then(Chunked::default);
        let mut out = Vec::with_capacity(READ_SIZE + 32);
        loop {
            out.clear();
            let done = match &mut chunked {
                None => {
                    let n = usize::try_from(left)
                        .unwrap_or(usize::MAX)
                        .min(self.inbuf.len());
                    out.extend_from_slice(&self.inbuf[..n]);
                    self.inbuf.advance(n);
                    self.meter.request_bytes += n as u64;
                    left -= n as u64;
                    left == 0
                }
                Some(decoder) => {
                    let mut done = false;
                    while !self.inbuf.is_empty() && !done {
                        let step = match decoder.decode(&self.inbuf) {
                            Ok(step) => step,
                            Err(err) => {
                                tracing::debug!(peer = %self.conn.peer, %err, "malformed chunked request body");
                                return Err(Failure::Client(
                                    StatusCode::BAD_REQUEST,
                                    "malformed chunked request body",
                                ));
                            }
                        };
                        received = received.saturating_add(step.data.len() as u64);
                        if max_body.is_some_and(|limit| received > limit) {
                            return Err(Failure::Client(
                                StatusCode::PAYLOAD_TOO_LARGE,
                                "request body larger than proxy-body-size",
                            ));
                        }
                        chunked::encode_chunk(&self.inbuf[step.data.clone()], &mut out);
                        done = step.done;
                        self.inbuf.advance(step.consumed);
                        self.meter.request_bytes += step.consumed as u64;
                    }
                    if done {
                        out.extend_from_slice(chunked::LAST_CHUNK);
                    }
                    done
                }
            };
            if !out.is_empty()
                && write_timed(&mut up.stream, &out, &mut self.upstream_due, send_timeout)
                    .await
                    .is_err()
            {
                // The upstream may have answered and closed; its answer is worth reading.
                return if up.answered_early() {
                    Ok(Sent::AnsweredEarly)
                } else {
                    Err(Failure::Error(UpstreamError::Protocol(
                        "upstream stopped reading the request body".into(),
                    )))
                };
            }
            if done {
                return Ok(Sent::Complete);
            }
            self.client_due.set(Instant::now() + body_timeout);
            self.inbuf.reserve(READ_SIZE);
            tokio::select! {
                biased;
                ready = up.stream.readable() => {
                    if ready.is_ok() && up.answered_early() {
                        return Ok(Sent::AnsweredEarly);
                    }
                }
                read = tokio::io::AsyncReadExt::read_buf(&mut self.io, &mut self.inbuf) => {
                    if !matches!(read, Ok(n) if n > 0) {
                        return Err(Failure::ClientGone);
                    }
                }
                () = self.client_due.expired() => {
                    tracing::debug!(peer = %self.conn.peer, "request body stalled");
                    return Err(Failure::Client(
                        StatusCode::REQUEST_TIMEOUT,
                        "the request body stalled",
                    ));
                }
            }
        }
    }

    /// Relays the response head and body. Returns whether the client connection is still
    /// usable, and the upstream connection if it can be reused.
    pub(super) async fn relay(
        &mut self,
        response: response::Response,
        mut up: Upstream,
        timeout: std::time::Duration,
        bandwidth: Option<Bandwidth>,
    ) -> (bool, Option<Upstream>) {
        let mut framing = response.framing;
        // limit-rate: bytes written so far, head included, as nginx counts `c->sent`.
        let started = Instant::now();
        let mut sent: u64 = 0;
        let mut dechunk = response.dechunk.then(Chunked::default);
        let send_timeout = self.proxy.settings.client_send_timeout;
        let mut done = false;
        let mut first = true;
        // The first write carries the head (already in `self.response`): not body bytes.
        let mut head_left = self.response.len() as u64;
        loop {
            if !up.buf.is_empty() || first {
                let taken = match &mut dechunk {
                    None => framing.take(&up.buf).map(|(n, end)| {
                        self.response.extend_from_slice(&up.buf[..n]);
                        (n, end)
                    }),
                    Some(decoder) => {
                        let mut consumed = 0;
                        let mut end = false;
                        while consumed < up.buf.len() && !end {
                            match decoder.decode(&up.buf[consumed..]) {
                                Ok(step) => {
                                    let data = &up.buf[consumed..][step.data.clone()];
                                    self.response.extend_from_slice(data);
                                    consumed += step.consumed;
                                    end = step.done;
                                }
                                Err(err) => {
                                    tracing::debug!(%err, "malformed chunked response");
                                    return (false, None);
                                }
                            }
                        }
                        Ok((consumed, end))
                    }
                };
                let Ok((n, end)) = taken else {
                    return (false, None);
                };
                up.buf.advance(n);
                done = end;
                first = false;
                if !self.response.is_empty() {
                    let written = write_timed(
                        &mut self.io,
                        &self.response,
                        &mut self.client_due,
                        send_timeout,
                    )
                    .await;
                    let len = self.response.len() as u64;
                    sent = sent.saturating_add(len);
                    self.response.clear();
                    if written.is_err() {
                        return (false, None);
                    }
                    let head = head_left.min(len);
                    head_left -= head;
                    self.meter.body_bytes_sent += len - head;
                    // Paced before the next write; after the last one there is nothing to pace.
                    if !done
                        && let Some(pause) =
                            bandwidth.and_then(|b| b.delay(sent, started.elapsed()))
                    {
                        tokio::time::sleep(pause).await;
                    }
                }
            }
            if done {
                break;
            }
            match read_timed(&mut up.stream, &mut up.buf, &mut self.upstream_due, timeout).await {
                Ok(0) if framing == Framing::UntilClose => break,
                Ok(n) if n > 0 => {}
                // Cut short or stalled: the client cannot be told, only disconnected.
                _ => return (false, None),
            }
        }
        if self.io.flush().await.is_err() {
            return (false, None);
        }
        let reusable = done && response.reusable && up.buf.is_empty();
        (!response.close_client, reusable.then_some(up))
    }
}
