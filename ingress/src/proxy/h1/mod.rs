//! HTTP/1.x, read and written by the proxy itself: one task drives the client connection and
//! the upstream connection, and copies bytes instead of building `http::Request`s.
//!
//! ```text
//!   read head (request.rs: httparse + RFC 9112's framing and Host rules) ─ refused ─> 4xx/5xx,
//!        │                                                                           close
//!        ├─ h2c preface ───────────────────────────────> HTTP/2 (hyper), with the bytes read
//!   authority → target → route (shared with HTTP/2) → decide
//!        │
//!   404 / redirect / 503 ─────────────> local response
//!   forward (exchange.rs): upstream head written by the proxy → body relayed with the proxy's
//!        framing (small bodies sent with the head; others streamed, chunked re-encoded)
//!        → response head (response.rs) → body relayed as framed → log + metrics
//!   upgrade (tunnel.rs): a fresh upstream connection; 101 → bytes both ways until idle
//!   HTTP/2-only upstream (bridge.rs): the HTTP/2 path's forwarding and pool, the response
//!        written back in HTTP/1.1 framing; an upgrade there is refused (501)
//!        │
//!   next request on the same connection
//! ```
//!
//! Every wait is bounded: the next request's first byte (`--client-keepalive-timeout`), a
//! request head (`--header-read-timeout`), each pause in a request body
//! (`--client-body-timeout`), each stalled write to the client (`--client-send-timeout`) or to
//! the upstream (`--upstream-send-timeout`), and the upstream's response (`proxy-read-timeout`).
//! Memory per connection is bounded too: a head of at most `--max-header-size`, a body buffered
//! only when it is at most [`BUFFERED_BODY`], and fixed-size buffers otherwise.
//!
//! hyper served these requests once, beside this path; two parsers of one connection's bytes
//! could disagree about where a request ends or what it targets, and each such disagreement is
//! a way past routing. Now hyper parses HTTP/1.1 only in tests, as the reference this parser is
//! checked against.

mod bridge;
mod deadline;
mod exchange;
pub mod response;
mod tunnel;

use std::pin::pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Buf, BytesMut};
use http::{StatusCode, Version as HttpVersion};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

use crate::proxy::rewind::Rewind;
use deadline::Deadline;
use ingress_wire::request::{self, BodyFraming, RequestParse, Version};
use response::ResponseContext;

use super::access_log::{Logged, Meter};
use super::phase::error_page::{self, ErrorRequest};
use super::phase::response as phase_response;
use super::phase::route::Refusal;
use super::phase::{Phased, RequestHeaders, RequestView};
use super::settings::HttpSettings;
pub(crate) use super::streams::{MAX_RESPONSE_HEAD, READ_SIZE};
use super::trace::{self, RequestTrace};
use super::{ConnInfo, Decision, Outcome, Proxy, Record};
use crate::snapshot::Route;
use crate::snapshot::global::GlobalSettings;
use crate::snapshot::policy::Wire;
use ingress_wire::header::usable_request_id;

/// Room made for a client's next request head: most are well under this, and an idle
/// kept-alive connection holds its buffer.
const HEAD_READ: usize = 4 * 1024;
/// Request bodies up to this size are read whole and sent with the head, so the request can be
/// retried on a fresh connection; larger ones are streamed.
pub const BUFFERED_BODY: u64 = 16 * 1024;

/// How a connection left this path.
pub enum Ended<IO> {
    Closed,
    /// It is HTTP/2 with prior knowledge: the bytes read so far go back in front of the stream.
    H2c(Rewind<IO>),
}

/// Serves HTTP/1.x requests on `io` until the client closes, an error or a timeout closes it,
/// shutdown begins, or the client turns out to speak HTTP/2.
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
        client_due: Deadline::new(),
        upstream_due: Deadline::new(),
        send_timeout: proxy.published.load().global.timeouts.send,
        meter: Meter::default(),
        log_buffer: Vec::new(),
    };
    let mut stopped = pin!(stop.cancelled());
    let mut waiting_since = Instant::now();
    loop {
        let prepared = match client.next_request(stopped.as_mut(), waiting_since).await {
            Next::Request(prepared) => prepared,
            Next::H2c => {
                let Client { inbuf, io, .. } = client;
                return Ended::H2c(Rewind::new(inbuf.freeze(), io));
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
    /// The upstream request head (and a buffered body), kept whole so it can be sent again on
    /// a fresh connection.
    request: Vec<u8>,
    /// The client's response head, with the first body bytes behind it.
    response: Vec<u8>,
    /// Reads from and writes to the client.
    client_due: Deadline,
    /// Reads from and writes to the upstream.
    upstream_due: Deadline,
    /// How long a write to the upstream may block: the current request's route's.
    send_timeout: Duration,
    /// The current request's sizes and upstream timings, for the access log.
    meter: Meter,
    /// The last request's access-log buffer, for the next one's.
    log_buffer: Vec<u8>,
}

// A request is moved through these once; boxing it would allocate once per request.
#[allow(clippy::large_enum_variant)]
enum Next {
    Request(Prepared),
    H2c,
    Closed,
}

/// A request read and decided; its upstream head (if any) is in `Client::request`, and its
/// body (if any) is still to be read from `Client::inbuf` and the connection.
struct Prepared {
    started: Instant,
    /// When the phases (authentication included) let it go upstream: the upstream's
    /// deadlines count from here, so an auth service's time is not taken from them.
    forwarded: Instant,
    action: Decision,
    route: Option<Arc<Route>>,
    head_request: bool,
    idempotent: bool,
    close: bool,
    http10: bool,
    expect_continue: bool,
    body: BodyFraming,
    /// The protocol asked for in `Upgrade`, when the route allows it.
    upgrade: Option<Vec<u8>>,
    /// The request as the HTTP/2 path's forwarding takes it, when its upstream speaks HTTP/2
    /// only (its head is then not in `Client::request`).
    bridged: Option<Box<bridge::Bridged>>,
    /// What the access log keeps of the request, when it is on.
    logged: Option<Logged>,
    method: http::Method,
    /// The host named, when metrics are kept per host.
    host: Option<Box<str>>,
    /// The request's own client, when trusted forwarded headers name one.
    client: Option<Box<ConnInfo>>,
    /// The global settings of the snapshot it was decided on.
    global: Arc<GlobalSettings>,
    /// `add-headers` with variables, expanded for this request, for an answer the proxy
    /// makes itself (else `global`'s literal ones).
    own_headers: Option<Arc<crate::snapshot::annotations::snippet::ResponseEdits>>,
    /// Its spans, with `--otlp-endpoint`.
    trace: Option<RequestTrace>,
    /// `custom-http-errors` on its route (or, unrouted, the global list): what the error
    /// backend is told.
    errors: Option<Box<ErrorRequest>>,
}

impl<IO: AsyncRead + AsyncWrite + Unpin> Client<'_, IO> {
    /// Reads until a whole request head is buffered, and decides what to do with it.
    async fn next_request(
        &mut self,
        mut stopped: std::pin::Pin<&mut tokio_util::sync::WaitForCancellationFuture<'_>>,
        waiting_since: Instant,
    ) -> Next {
        // Until the first byte of the next request: the keep-alive timeout; from then on, the
        // head must be whole within the header timeout.
        let idle_due = waiting_since + self.settings.keepalive_timeout;
        self.client_due.set(if self.inbuf.is_empty() {
            idle_due
        } else {
            waiting_since + self.settings.header_read_timeout
        });
        let mut first_byte_seen = !self.inbuf.is_empty();
        loop {
            if !self.inbuf.is_empty() {
                if !first_byte_seen {
                    first_byte_seen = true;
                    self.client_due
                        .set(Instant::now() + self.settings.header_read_timeout);
                }
                match self.prepare().await {
                    Parsed::Ready(prepared) => return Next::Request(prepared),
                    Parsed::H2c => return Next::H2c,
                    Parsed::Partial if self.inbuf.len() < self.settings.max_header_size => {}
                    Parsed::Partial => {
                        let refusal = Refusal {
                            status: StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                            reason: "request head too large",
                        };
                        return Next::Request(self.refused(refusal));
                    }
                }
            }
            self.inbuf.reserve(HEAD_READ);
            let read = tokio::select! {
                biased;
                () = stopped.as_mut(), if self.inbuf.is_empty() => return Next::Closed,
                () = self.client_due.expired() => {
                    tracing::debug!(peer = %self.conn.peer, waited_for_first_byte = !first_byte_seen, "request head not received in time");
                    return Next::Closed;
                }
                read = self.io.read_buf(&mut self.inbuf) => read,
            };
            if !matches!(read, Ok(n) if n > 0) {
                return Next::Closed;
            }
        }
    }

    /// Parses the buffered head and runs the phases up to the decision (awaiting
    /// authentication, when the route has it), writing the upstream head. On success the head's
    /// bytes are consumed from `inbuf`.
    async fn prepare(&mut self) -> Parsed {
        let mut storage = [httparse::EMPTY_HEADER; request::MAX_HEADERS];
        let req = match request::parse(&self.inbuf, &mut storage) {
            RequestParse::Complete(req) => req,
            RequestParse::Partial => return Parsed::Partial,
            RequestParse::H2Preface => return Parsed::H2c,
            RequestParse::Reject(rejection) => {
                let refusal = Refusal {
                    status: rejection.status,
                    reason: rejection.reason,
                };
                return Parsed::Ready(self.refused(refusal));
            }
        };
        let started = Instant::now();
        let proxy = self.proxy;
        let host = req.authority.as_ref().map(|a| a.host.as_ref());
        let fresh_id = super::forward::new_request_id();
        let logged = proxy.settings.access_log.then(|| {
            let id = req
                .headers
                .header("x-request-id")
                .filter(|id| usable_request_id(id))
                .unwrap_or(&fresh_id);
            Logged::new_in(
                std::mem::take(&mut self.log_buffer),
                req.method,
                &req.target,
                host,
                if req.version == Version::Http10 {
                    "HTTP/1.0"
                } else {
                    "HTTP/1.1"
                },
                |name| req.headers.header(name),
                id,
            )
        });
        let authority = req.authority.as_ref().map(|a| a.raw);
        let mut trace = proxy.tracing.as_ref().and_then(|tracing| {
            let started = trace::Started {
                method: req.method,
                target: &req.target,
                host,
                protocol: if req.version == Version::Http10 {
                    "1.0"
                } else {
                    "1.1"
                },
                client: self.conn.peer.ip(),
                at: started,
            };
            tracing.start(&started, &req.headers)
        });
        let phases_at = Instant::now();
        let phased = proxy.request_phases(
            self.conn,
            RequestView {
                method: req.method,
                host,
                authority,
                target: &req.target,
                headers: &req.headers,
                body_len: match req.body {
                    BodyFraming::Length(n) => Some(n),
                    BodyFraming::None => Some(0),
                    BodyFraming::Chunked => None,
                },
                // What `write_upstream` sends: the client's usable id, else `fresh_id`.
                request_id: req
                    .headers
                    .header("x-request-id")
                    .filter(|id| usable_request_id(id))
                    .unwrap_or(&fresh_id),
            },
        );
        let Phased {
            target: phased_target,
            route,
            decision,
            conn: client,
            global,
            auth,
            own_headers,
        } = phased;
        let facts = client.as_deref().unwrap_or(self.conn).client.facts();
        let errors = error_page::plan(route.as_ref(), &global).map(|plan| {
            let id = req
                .headers
                .header("x-request-id")
                .filter(|id| usable_request_id(id))
                .unwrap_or(&fresh_id);
            Box::new(ErrorRequest {
                plan,
                head: req.is_head(),
                original_uri: req.target.to_string(),
                accept: req
                    .headers
                    .header("accept")
                    .and_then(|v| http::HeaderValue::from_bytes(v).ok()),
                request_id: String::from_utf8_lossy(id).into_owned(),
                host: host.map(str::to_string),
                client: client
                    .as_deref()
                    .unwrap_or(self.conn)
                    .client
                    .client_ip
                    .clone(),
                connect: global.timeouts.connect,
                read: global.timeouts.read,
                keepalive: error_page::keepalive(&global.keepalive),
            })
        });
        let decision = proxy.authorize(route.as_ref(), auth, decision).await;
        if let (Some(tracing), Some(trace)) = (&proxy.tracing, &trace) {
            tracing.phases(trace, phases_at, route.as_deref(), decision.name());
        }
        // An HTTP/2-only upstream is reached through the HTTP/2 path's forwarding (bridge.rs),
        // which cannot switch protocols: RFC 8441's extended CONNECT is not spoken upstream,
        // so an upgrade the route would allow is refused rather than sent as a plain request.
        let action = match decision {
            Decision::Forward(forward)
                if forward.wire == Wire::Http2
                    && req.upgrade.is_some_and(|u| allowed(&forward.upgrades, u)) =>
            {
                Decision::Refuse(Refusal {
                    status: StatusCode::NOT_IMPLEMENTED,
                    reason: "protocol upgrades (WebSocket) are not supported to an HTTP/2-only upstream",
                })
            }
            other => other,
        };
        let mut upgrade = None;
        let mut bridged = None;
        if let (Decision::Forward(forward), Some(target)) = (&action, &phased_target) {
            upgrade = req
                .upgrade
                .filter(|u| {
                    forward.wire != Wire::Http2
                        && req.body == BodyFraming::None
                        && allowed(&forward.upgrades, u)
                })
                .map(<[u8]>::to_vec);
            // The upstream span's context replaces the client's traceparent.
            let traced = match (&proxy.tracing, &mut trace) {
                (Some(tracing), Some(trace)) => tracing.upstream(trace, &forward.key),
                _ => Vec::new(),
            };
            // Authentication's edits win over a snippet's for the same name: what the auth
            // service vouched for is what the upstream sees.
            let auth_set = forward
                .auth
                .as_ref()
                .map_or(&[][..], |g| g.upstream.as_slice());
            let set_headers: Vec<(&str, Option<&[u8]>)> = forward
                .request_headers
                .as_deref()
                .map(|edits| {
                    edits
                        .set
                        .iter()
                        .filter(|(n, _)| !auth_set.iter().any(|(a, _)| a == n))
                        .map(|(n, v)| (n.as_str(), v.as_ref().map(http::HeaderValue::as_bytes)))
                        .collect::<Vec<_>>()
                })
                .unwrap_or_default()
                .into_iter()
                .chain(
                    auth_set
                        .iter()
                        .map(|(n, v)| (n.as_str(), v.as_ref().map(http::HeaderValue::as_bytes))),
                )
                .chain(traced.iter().map(|(n, v)| (*n, Some(v.as_bytes()))))
                .collect();
            // A request without an authority (HTTP/1.0 with no Host) names the upstream; the
            // address is written out only then, as this runs for every request.
            let key_text;
            let authority = match &req.authority {
                Some(a) => a.raw,
                None => {
                    key_text = forward.key.to_string();
                    key_text.as_str()
                }
            };
            if forward.wire == Wire::Http2 {
                bridged = Some(Box::new(bridge::Bridged::new(
                    &req,
                    target.to_string(),
                    authority,
                    &fresh_id,
                    traced,
                )));
            } else {
                request::write_upstream(
                    &mut self.request,
                    &req,
                    &request::Upstream {
                        target,
                        authority,
                        host: forward.vhost.as_deref(),
                        client: facts,
                        underscores: forward.underscores,
                        body: req.body.into(),
                        upgrade: upgrade.is_some(),
                        new_request_id: fresh_id,
                        forwarded_prefix: forward.forwarded_prefix.as_deref(),
                        set_headers: &set_headers,
                    },
                );
            }
        }
        let refused = matches!(action, Decision::Refuse(_));
        let prepared = Prepared {
            started,
            forwarded: Instant::now(),
            action,
            route,
            head_request: req.is_head(),
            idempotent: req.idempotent(),
            close: req.close || refused,
            http10: req.version == Version::Http10,
            expect_continue: req.expect_continue,
            body: req.body,
            upgrade,
            bridged,
            logged,
            method: http::Method::from_bytes(req.method.as_bytes()).unwrap_or_default(),
            host: proxy
                .metrics
                .compat
                .as_ref()
                .filter(|c| c.per_host())
                .and(host)
                .map(Box::from),
            client,
            global,
            own_headers,
            trace,
            errors,
        };
        let head_len = req.head_len;
        self.meter = Meter {
            request_bytes: head_len as u64,
            ..Meter::default()
        };
        self.inbuf.advance(head_len);
        Parsed::Ready(prepared)
    }

    /// A request refused before it was understood: answered, then the connection closes.
    fn refused(&mut self, refusal: Refusal) -> Prepared {
        tracing::debug!(peer = %self.conn.peer, status = refusal.status.as_u16(), reason = refusal.reason, "request refused");
        Prepared {
            started: Instant::now(),
            forwarded: Instant::now(),
            action: Decision::Refuse(refusal),
            route: None,
            head_request: false,
            idempotent: false,
            close: true,
            http10: false,
            expect_continue: false,
            body: BodyFraming::None,
            upgrade: None,
            bridged: None,
            logged: self.proxy.settings.access_log.then(|| {
                let id = super::forward::new_request_id();
                Logged::new("-", "-", None, "-", |_| None, &id)
            }),
            // Not a method anyone sent: counted as `OTHER`.
            method: http::Method::from_bytes(b"-").unwrap_or_default(),
            host: None,
            client: None,
            global: self.proxy.published.load().global.clone(),
            own_headers: None,
            trace: None,
            errors: None,
        }
    }

    /// Answers one request. Returns when it finished, or `None` if the connection must close.
    async fn serve_one(&mut self, mut prepared: Prepared) -> Option<Instant> {
        let global = prepared.global.clone();
        let hsts = phase_response::hsts(&global, self.conn.https).map(http::HeaderValue::as_bytes);
        let server = phase_response::server(&global).as_bytes();
        let mut action = std::mem::replace(
            &mut prepared.action,
            Decision::Respond(StatusCode::NOT_FOUND),
        );
        let upgrade = prepared.upgrade.take();
        let own_headers = prepared.own_headers.take();
        // Moved out of the decision, which only the HTTP/2 bridge reads them from again.
        let (set_cookie, set_headers, edits, rewrite) = match &mut action {
            Decision::Forward(forward) if forward.wire == Wire::Http2 => (
                forward.set_cookie.clone(),
                forward.set_headers.clone(),
                forward.response_headers.clone(),
                forward.response_rewrite.clone(),
            ),
            Decision::Forward(forward) => (
                forward.set_cookie.take(),
                std::mem::take(&mut forward.set_headers),
                forward.response_headers.take(),
                forward.response_rewrite.take(),
            ),
            Decision::Preflight(set) => (None, std::mem::take(set), None, None),
            Decision::Deny(denial) => (None, std::mem::take(&mut denial.headers), None, None),
            _ => (None, Vec::new(), None, None),
        };
        // Authentication's edits of the request went into its head (`prepare`); its cookies
        // are for the response.
        // A forward to an HTTP/2-only upstream keeps them: the HTTP/2 path's forwarding
        // (bridge.rs) applies both.
        let granted = match &mut action {
            Decision::Forward(forward) if forward.wire != Wire::Http2 => forward.auth.take(),
            _ => None,
        };
        let mut ctx = ResponseContext {
            head_request: prepared.head_request,
            close: prepared.close || self.stop.is_cancelled(),
            hsts,
            server,
            http10: prepared.http10,
            upgrade: upgrade.as_deref(),
            set_cookie: set_cookie.as_deref().map(str::as_bytes),
            auth: granted.as_ref(),
            set_headers: &set_headers,
            edits: edits.as_deref(),
            rewrite: rewrite.as_deref(),
            own_headers: phase_response::own_edits(own_headers.as_deref(), &global),
        };
        let (status, outcome, keep_open) = match action {
            Decision::Forward(forward) if forward.wire == Wire::Http2 => {
                self.bridge(forward, &mut prepared, &mut ctx).await
            }
            Decision::Forward(forward) if upgrade.is_some() => {
                self.upgrade(forward, &prepared, &mut ctx).await
            }
            Decision::Forward(forward) => self.exchange(forward, &prepared, &mut ctx).await,
            local => {
                // A body nobody will read: skipped when it is already here, else the
                // connection closes after the answer.
                ctx.close |= !self.skip_body(prepared.body);
                // Only the proxy's own 404/413 and upstream failures can be listed codes:
                // refusals, redirects and authentication's answers are never replaced.
                let pageable = matches!(local, Decision::Respond(_) | Decision::Fail(_));
                let (code, location, outcome) = match local {
                    Decision::Respond(code) => (code, None, Outcome::LOCAL),
                    Decision::Preflight(_) => (StatusCode::NO_CONTENT, None, Outcome::LOCAL),
                    Decision::Redirect(code, location) => (code, Some(location), Outcome::LOCAL),
                    Decision::Refuse(refusal) => (refusal.status, None, Outcome::refused(refusal)),
                    Decision::Deny(denial) => (denial.status, denial.location, Outcome::LOCAL),
                    Decision::Fail(error) => (
                        error.status(),
                        None,
                        Outcome {
                            error: Some(error),
                            ..Outcome::LOCAL
                        },
                    ),
                    Decision::Forward(_) => unreachable_forward(),
                };
                // custom-http-errors: the proxy's own 404 (no route) and upstream failures
                // (503 no endpoint, 502, 504) are listed codes too.
                let listed = pageable
                    && prepared
                        .errors
                        .as_ref()
                        .is_some_and(|e| e.plan.wants(code.as_u16(), false));
                if listed && let Some(errors) = prepared.errors.take() {
                    let (status, keep_open) = self.error_page(&errors, code, &ctx).await;
                    (status, outcome, keep_open)
                } else {
                    response::write_local(&mut self.response, code, location.as_deref(), &ctx);
                    self.meter.body_bytes_sent = local_body_len(&self.response);
                    (code.as_u16(), outcome, self.write_response().await)
                }
            }
        };
        let finished = Instant::now();
        if let Some(trace) = prepared.trace.take() {
            trace.finish(status, &self.meter);
        }
        self.proxy.record(&Record {
            conn: prepared.client.as_deref().unwrap_or(self.conn),
            route: prepared.route.as_ref(),
            status,
            elapsed: finished.saturating_duration_since(prepared.started),
            finished,
            logged: prepared.logged.as_ref(),
            meter: &self.meter,
            method: prepared.method.as_str(),
            host: prepared.host.as_deref(),
            version: if prepared.http10 {
                HttpVersion::HTTP_10
            } else {
                HttpVersion::HTTP_11
            },
            outcome: &outcome,
        });
        if let Some(logged) = prepared.logged.take() {
            self.log_buffer = logged.into_buffer();
        }
        (keep_open && !ctx.close).then_some(finished)
    }

    /// Drops a request body that is already whole in the buffer. Returns false if it is not
    /// (the connection must then close, as the rest of it would be read as the next request).
    fn skip_body(&mut self, body: BodyFraming) -> bool {
        match body {
            BodyFraming::None => true,
            BodyFraming::Length(n) => match usize::try_from(n) {
                Ok(n) if n <= self.inbuf.len() => {
                    self.inbuf.advance(n);
                    self.meter.request_bytes += n as u64;
                    true
                }
                _ => false,
            },
            BodyFraming::Chunked => false,
        }
    }

    /// Answers with the error backend's page for `code` (`custom-http-errors`), or, when it
    /// cannot give one, with the proxy's own page for `code`. Returns the status sent and
    /// whether the client connection is still usable.
    async fn error_page(
        &mut self,
        errors: &ErrorRequest,
        code: StatusCode,
        ctx: &ResponseContext<'_>,
    ) -> (u16, bool) {
        let status = match error_page::fetch(&self.proxy.pages, errors, code).await {
            Some(page) => {
                response::write_page(&mut self.response, &page, ctx);
                page.status.as_u16()
            }
            None => {
                response::write_local(&mut self.response, code, None, ctx);
                code.as_u16()
            }
        };
        self.meter.body_bytes_sent = local_body_len(&self.response);
        (status, self.write_response().await)
    }

    async fn write_response(&mut self) -> bool {
        let timeout = self.proxy.settings.client_send_timeout;
        write_timed(&mut self.io, &self.response, &mut self.client_due, timeout)
            .await
            .is_ok()
            && self.io.flush().await.is_ok()
    }
}

/// The body length of a response the proxy made itself (`out` holds its whole head and body).
fn local_body_len(out: &[u8]) -> u64 {
    out.windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map_or(0, |head| (out.len() - head - 4) as u64)
}

#[allow(clippy::large_enum_variant)]
enum Parsed {
    Partial,
    H2c,
    Ready(Prepared),
}

/// `decide` never returns a forward into the local-answer branch; this keeps the match total
/// without a panic.
fn unreachable_forward() -> (StatusCode, Option<String>, Outcome) {
    (StatusCode::INTERNAL_SERVER_ERROR, None, Outcome::LOCAL)
}

/// Whether every protocol an `Upgrade` header offers is one the route allows.
fn allowed(upgrades: &[String], offered: &[u8]) -> bool {
    let mut any = false;
    for token in ingress_wire::header::tokens(offered) {
        let name = token.split(|&b| b == b'/').next().unwrap_or(token);
        if !upgrades
            .iter()
            .any(|u| u.as_bytes().eq_ignore_ascii_case(name))
        {
            return false;
        }
        any = true;
    }
    any
}

/// Writes all of `buf`, failing if the peer takes none of it for `timeout`.
async fn write_timed<W: AsyncWrite + Unpin>(
    w: &mut W,
    buf: &[u8],
    due: &mut Deadline,
    timeout: Duration,
) -> std::io::Result<()> {
    due.set(Instant::now() + timeout);
    tokio::select! {
        biased;
        written = w.write_all(buf) => written,
        () = due.expired() => Err(std::io::ErrorKind::TimedOut.into()),
    }
}

/// Reads into `buf`, failing if nothing arrives for `timeout`; `Ok(0)` is end of stream.
async fn read_timed<R: AsyncRead + Unpin>(
    r: &mut R,
    buf: &mut BytesMut,
    due: &mut Deadline,
    timeout: Duration,
) -> std::io::Result<usize> {
    due.set(Instant::now() + timeout);
    buf.reserve(READ_SIZE);
    tokio::select! {
        biased;
        read = r.read_buf(buf) => read,
        () = due.expired() => Err(std::io::ErrorKind::TimedOut.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upgrade_offers() {
        let websocket = ["websocket".to_string()];
        let cases: &[(&[u8], bool)] = &[
            (b"websocket", true),
            (b"WebSocket", true),
            (b"websocket/13", true),
            (b"h2c", false),
            (b"websocket, h2c", false),
            (b"", false),
            (b" , ", false),
        ];
        for (offered, want) in cases {
            assert_eq!(
                allowed(&websocket, offered),
                *want,
                "{}",
                String::from_utf8_lossy(offered)
            );
        }
    }
}
