//! One HTTP/2 request, from hyper's `Request` to the response: the same phases as HTTP/1.x
//! (`proxy::phase`), then the request rewritten for an HTTP/1.1 upstream and sent through the
//! pool.
//!
//! ```text
//!   CONNECT / TRACE → refused
//!   :authority and Host (ingress_wire::authority::of_h2): missing, two, or disagreeing → 400
//!   request_phases (tls, route, access, redirect, upstream) → Decision
//!   authorize (auth): basic auth, awaited → the forward with its edits, or a denial
//!   Forward: headers rewritten (forward.rs) → pool.send, bounded by the route's timeout
//!   response: Server, HSTS, record
//! ```
//!
//! `Proxy::forward` is also how the HTTP/1.x path reaches an HTTP/2-only upstream
//! (`h1/bridge.rs`): one place sends requests to upstreams for both client protocols.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use http::header::{self, HeaderValue};
use http::{Method, Request, Response, StatusCode, Uri, Version};
use http_body_util::Either;
use hyper::body::Incoming;
use ingress_wire::authority::{self, AuthorityError};
use ingress_wire::header::usable_request_id;

use crate::proxy::access_log::{Logged, Meter, UpstreamMeter};
use crate::proxy::connect::Transport;
use crate::proxy::phase::error_page::{self, ErrorRequest};
use crate::proxy::phase::identity::ConnInfo;
use crate::proxy::phase::response;
use crate::proxy::phase::route::Refusal;
use crate::proxy::phase::upstream;
use crate::proxy::phase::{Decision, Forward, Outcome, Phased, Record, RequestView};
use crate::proxy::pool::PoolKey;
use crate::proxy::pool::{ClientBody, SendError};
use crate::proxy::trace::{self, RequestTrace};
use crate::proxy::upstream::UpstreamError;
use crate::proxy::{Proxy, ProxyBody, forward, idle, respond};
use crate::snapshot::Route;
use crate::snapshot::annotations::snippet::ResponseEdits;
use crate::snapshot::global::GlobalSettings;
use crate::snapshot::policy::Wire;

impl Proxy {
    /// Serves one HTTP/2 request.
    pub async fn handle(
        self: Arc<Self>,
        mut req: Request<Incoming>,
        conn: Arc<ConnInfo>,
    ) -> Result<Response<ProxyBody>, Infallible> {
        let started = Instant::now();
        let logged = self.settings.access_log.then(|| logged(&mut req));
        let method = req.method().clone();
        let mut meter = Meter {
            request_bytes: request_bytes(&req),
            ..Meter::default()
        };
        let mut trace = None;
        let (mut response, route, host, outcome, client, global, own_headers) = self
            .serve_h2(req, &conn, &mut meter, &mut trace, started)
            .await;
        // The client as this request named it (trusted forwarded headers), else the connection's.
        let conn = client.map_or(conn, |client| Arc::new(*client));
        response
            .headers_mut()
            .insert(header::SERVER, response::server(&global).clone());
        if let Some(hsts) = response::hsts(&global, conn.https) {
            response
                .headers_mut()
                .entry(header::STRICT_TRANSPORT_SECURITY)
                .or_insert_with(|| hsts.clone());
        }
        // The upstream's response (not one the proxy made, nor an error page that replaced
        // it) gets the route's header edits, as on the HTTP/1.1 path.
        let upstreams = response
            .extensions()
            .get::<error_page::Replaced>()
            .is_none();
        let from_upstream =
            route.is_some() && outcome.upstream.is_some() && outcome.error.is_none() && upstreams;
        if let (Some(route), true) = (&route, from_upstream)
            && let Some(edits) = response
                .extensions_mut()
                .remove::<response::RequestEdits>()
                .map(|made| made.0)
                .or_else(|| response::edits(&route.policy.response))
        {
            let status = response.status().as_u16();
            edits.apply(status, response.headers_mut());
        }
        // The proxy's own answers get the ConfigMap's add-headers (nginx's http-level
        // more_set_headers reaches them); an error page keeps the error backend's headers.
        if !from_upstream && upstreams {
            let own = response::own_edits(own_headers.as_deref(), &global);
            response::add_own_headers(own, response.headers_mut());
        }
        if let (Some(route), Some(_), None, true) =
            (&route, &outcome.upstream, &outcome.error, upstreams)
            && let Some(rewrite) = response::rewrites(&route.policy.response)
        {
            response::rewrite_headers(&rewrite, response.headers_mut());
        }
        *response.version_mut() = Version::HTTP_2;
        let status = response.status().as_u16();
        let finished = Instant::now();
        let record = |meter| Record {
            conn: &conn,
            route: route.as_ref(),
            method: method.as_str(),
            host: host.as_deref(),
            status,
            elapsed: finished.saturating_duration_since(started),
            finished,
            logged: logged.as_ref(),
            version: Version::HTTP_2,
            outcome: &outcome,
            meter,
        };
        // An upstream's body streams after this returns: what is said of the whole request
        // (the access line, ingress-nginx's metrics) waits for its end, to say how much was
        // sent and how long it took. The proxy's own answers are whole already.
        let streamed = !matches!(response.body(), Either::Right(Either::Right(_)));
        let at_end = logged.is_some() || self.metrics.compat.is_some();
        if !(streamed && (at_end || trace.is_some())) {
            meter.body_bytes_sent = hyper::body::Body::size_hint(response.body())
                .exact()
                .unwrap_or(0);
            if let Some(trace) = trace {
                trace.finish(status, &meter);
            }
            self.record(&record(&meter));
            return Ok(response);
        }
        self.observe(&record(&meter));
        let proxy = self.clone();
        let upstream = outcome.upstream.clone();
        let route = route.clone();
        let on_end: idle::OnEnd = Box::new(move |sent| {
            meter.body_bytes_sent = sent;
            if let Some(up) = &mut meter.upstream {
                up.finish(sent);
            }
            if let Some(trace) = trace {
                trace.finish(status, &meter);
            }
            let finished = Instant::now();
            proxy.finished(&Record {
                conn: &conn,
                route: route.as_ref(),
                method: method.as_str(),
                host: host.as_deref(),
                status,
                elapsed: finished.saturating_duration_since(started),
                finished,
                logged: logged.as_ref(),
                version: Version::HTTP_2,
                outcome: &Outcome {
                    upstream,
                    error: None,
                    refused: None,
                },
                meter: &meter,
            });
        });
        match response.body_mut() {
            Either::Left(body) => body.on_end(on_end),
            Either::Right(Either::Left(body)) => body.on_end(on_end),
            Either::Right(Either::Right(_)) => {}
        }
        Ok(response)
    }

    async fn serve_h2(
        &self,
        mut req: Request<Incoming>,
        conn: &ConnInfo,
        meter: &mut Meter,
        trace: &mut Option<RequestTrace>,
        started: Instant,
    ) -> (
        Response<ProxyBody>,
        Option<Arc<Route>>,
        Option<String>,
        Outcome,
        Option<Box<ConnInfo>>,
        Arc<GlobalSettings>,
        Option<Arc<ResponseEdits>>,
    ) {
        let refuse = |refusal: Refusal, host: Option<String>| {
            (
                respond::status(refusal.status),
                None,
                host,
                Outcome::refused(refusal),
                None,
                self.published.load().global.clone(),
                None,
            )
        };
        match *req.method() {
            Method::CONNECT => return refuse(Refusal::bad_request("CONNECT is not served"), None),
            Method::TRACE => {
                let refusal = Refusal {
                    status: StatusCode::METHOD_NOT_ALLOWED,
                    reason: "TRACE is not served",
                };
                return refuse(refusal, None);
            }
            _ => {}
        }
        let grpc = respond::is_grpc(req.headers());
        let authority = authority::of_h2(
            req.uri().authority().map(|a| a.as_str()),
            req.headers()
                .get_all(header::HOST)
                .iter()
                .map(HeaderValue::as_bytes),
        );
        let authority = match authority {
            Ok(a) => a,
            Err(err) => {
                let reason = match err {
                    AuthorityError::Missing => "no :authority and no Host",
                    AuthorityError::Duplicate => "more than one Host header",
                    AuthorityError::Conflict => "Host differs from :authority",
                    AuthorityError::Invalid => "invalid :authority or Host",
                };
                return refuse(Refusal::bad_request(reason), None);
            }
        };
        let host = authority.host.to_string();
        let authority_raw = authority.raw.to_string();
        let original = req
            .uri()
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .to_string();
        if let Some(tracing) = &self.tracing {
            let started = trace::Started {
                method: req.method().as_str(),
                target: &original,
                host: Some(&host),
                protocol: "2",
                client: conn.peer.ip(),
                at: started,
            };
            *trace = tracing.start(&started, req.headers());
        }
        // `$request_id` is the id the upstream is sent: made now when the client sent none
        // usable, so forwarding keeps it (as the access log does).
        if !req
            .headers()
            .get(&forward::X_REQUEST_ID)
            .is_some_and(|id| usable_request_id(id.as_bytes()))
            && let Ok(id) = HeaderValue::from_bytes(&forward::new_request_id())
        {
            req.headers_mut().insert(forward::X_REQUEST_ID.clone(), id);
        }
        let phases_at = Instant::now();
        let Phased {
            target,
            route,
            decision,
            conn: client,
            global,
            auth,
            own_headers,
        } = self.request_phases(
            conn,
            RequestView {
                method: req.method().as_str(),
                host: Some(&host),
                authority: Some(&authority_raw),
                target: &original,
                headers: req.headers(),
                body_len: hyper::body::Body::size_hint(req.body()).exact(),
                request_id: req
                    .headers()
                    .get(&forward::X_REQUEST_ID)
                    .map_or(&[][..], HeaderValue::as_bytes),
            },
        );
        let forwarded_target = target.map(|t| t.to_string()).unwrap_or_default();
        let decision = self.authorize(route.as_ref(), auth, decision).await;
        if let (Some(tracing), Some(trace)) = (&self.tracing, &*trace) {
            tracing.phases(trace, phases_at, route.as_deref(), decision.name());
        }
        if !matches!(decision, Decision::Forward(_)) {
            drain(req.body_mut()).await;
        }
        // custom-http-errors (not for gRPC, whose errors are grpc-status): what the error
        // backend is told, taken before the request is moved upstream; and which of the
        // proxy's own answers may be replaced (its 404/413 and upstream failures, never a
        // refusal, a redirect or authentication's answer).
        let plan = error_page::plan(route.as_ref(), &global).filter(|_| !grpc);
        // The page's X-Request-ID is the one the upstream is sent: made here when the client
        // sent none (as the access log does), so forwarding keeps it.
        let usable_id = req
            .headers()
            .get(&forward::X_REQUEST_ID)
            .is_some_and(|id| usable_request_id(id.as_bytes()));
        if plan.is_some()
            && !usable_id
            && let Ok(id) = HeaderValue::from_bytes(&forward::new_request_id())
        {
            req.headers_mut().insert(forward::X_REQUEST_ID.clone(), id);
        }
        let errors = plan.map(|plan| {
            let client = client.as_deref().unwrap_or(conn);
            ErrorRequest {
                plan,
                head: req.method() == Method::HEAD,
                original_uri: original.clone(),
                accept: req.headers().get(header::ACCEPT).cloned(),
                request_id: req
                    .headers()
                    .get(&forward::X_REQUEST_ID)
                    .map(|id| String::from_utf8_lossy(id.as_bytes()).into_owned())
                    .unwrap_or_default(),
                host: Some(host.clone()),
                client: client.client.client_ip.clone(),
                connect: global.timeouts.connect,
                read: global.timeouts.read,
                keepalive: error_page::keepalive(&global.keepalive),
            }
        });
        let pageable = matches!(decision, Decision::Respond(_) | Decision::Fail(_));
        let (response, outcome) = match decision {
            Decision::Respond(code) => (respond::status(code), Outcome::LOCAL),
            Decision::Redirect(code, location) => {
                (respond::redirect(code, &location), Outcome::LOCAL)
            }
            Decision::Preflight(set) => (respond::preflight(set), Outcome::LOCAL),
            Decision::Refuse(refusal) => {
                (respond::status(refusal.status), Outcome::refused(refusal))
            }
            Decision::Fail(error) => (
                if grpc {
                    respond::grpc_error(error.status(), &error.to_string())
                } else {
                    respond::status(error.status())
                },
                Outcome {
                    error: Some(error),
                    ..Outcome::LOCAL
                },
            ),
            // A gRPC client reads grpc-status (401 → UNAUTHENTICATED, 403 → PERMISSION_DENIED,
            // 500 → UNKNOWN), with the denial's headers beside it.
            Decision::Deny(denial) if grpc && denial.location.is_none() => {
                let reason = denial.status.canonical_reason().unwrap_or("denied");
                let mut response = respond::grpc_error(denial.status, reason);
                for (name, value) in denial.headers {
                    response.headers_mut().append(name, value);
                }
                (response, Outcome::LOCAL)
            }
            Decision::Deny(denial) => (respond::denial(denial), Outcome::LOCAL),
            Decision::Forward(forward) => {
                let vhost = forward.vhost.clone();
                let request = forward::RequestSide {
                    host: vhost.as_deref(),
                    authority: &authority_raw,
                    original_uri: &original,
                };
                meter.canary = forward.canary;
                // The upstream span's context replaces the client's traceparent.
                if let (Some(tracing), Some(trace)) = (&self.tracing, trace.as_mut()) {
                    for (name, value) in tracing.upstream(trace, &forward.key) {
                        req.headers_mut().insert(name, value);
                    }
                }
                let upstream_started = Instant::now();
                let (response, outcome) = self
                    .forward(
                        req.map(ClientBody::H2),
                        forward,
                        &forwarded_target,
                        &request,
                        client.as_deref().unwrap_or(conn),
                    )
                    .await;
                meter.upstream = outcome.upstream.clone().map(|key| {
                    if outcome.error.is_none() {
                        UpstreamMeter::answered(key, upstream_started, response.status().as_u16())
                    } else {
                        UpstreamMeter::failed(key, upstream_started)
                    }
                });
                (response, outcome)
            }
        };
        // The upstream's own answer (intercepted unless disabled), or the proxy's own.
        let own = pageable || outcome.error.is_some();
        let upstream_answer = !own && outcome.upstream.is_some();
        let code = response.status();
        let response = match errors
            .filter(|e| (own || upstream_answer) && e.plan.wants(code.as_u16(), !own))
        {
            // The upstream's response is dropped unread: hyper resets its stream (or closes
            // its HTTP/1.1 connection), so none of it is passed on or pooled half-read.
            Some(errors) => {
                drop(response);
                let mut page = match error_page::fetch(&self.pages, &errors, code).await {
                    Some(page) => respond::page(page),
                    None => respond::status(code),
                };
                page.extensions_mut().insert(error_page::Replaced);
                page
            }
            None => response,
        };
        (
            response,
            route,
            Some(host),
            outcome,
            client,
            global,
            own_headers,
        )
    }

    /// Sends a request through the pool its route's protocol needs, retrying
    /// (`proxy-next-upstream`) what was not sent, and returns the upstream's response with the
    /// route's cookies and headers added, or the failure as a response. HTTP/2 clients' requests
    /// come here, and HTTP/1.x clients' ones to HTTP/2-only upstreams (`h1::bridge`).
    pub(crate) async fn forward(
        &self,
        req: Request<ClientBody>,
        forward: Forward,
        target: &str,
        request: &forward::RequestSide<'_>,
        conn: &ConnInfo,
    ) -> (Response<ProxyBody>, Outcome) {
        let started = std::time::Instant::now();
        let grpc = respond::is_grpc(req.headers());
        let fail = |error: UpstreamError, upstream: Option<PoolKey>| {
            (
                if grpc {
                    respond::grpc_error(error.status(), &error.to_string())
                } else {
                    respond::status(error.status())
                },
                Outcome {
                    upstream,
                    error: Some(error),
                    refused: None,
                },
            )
        };
        let Forward {
            mut key,
            transport,
            wire,
            mut in_flight,
            timeout,
            forwarded_prefix,
            mut set_cookie,
            set_headers,
            max_body,
            connect_timeout,
            next_upstream,
            reselect,
            request_headers,
            response_headers,
            underscores,
            auth,
            limit_guard,
            bandwidth,
            ..
        } = forward;
        let mut auth = auth.unwrap_or_default();
        let auth_headers = std::mem::take(&mut auth.upstream);
        // proxy-next-upstream, for attempts that could not connect: the request comes back
        // unsent and goes to another endpoint.
        let mut tried = vec![key.clone()];
        let mut retry = |error: &UpstreamError, key: &mut PoolKey, in_flight: &mut Option<_>| {
            let next = upstream::retry(&reselect, &next_upstream, &tried, started, error)?;
            tracing::debug!(upstream = %key, next = %next.key, %error, "trying the next upstream (proxy-next-upstream)");
            *key = next.key;
            *in_flight = Some(next.in_flight);
            // An affinity session that moved: its cookie replaces the first attempt's.
            if next.set_cookie.is_some() {
                set_cookie = next.set_cookie;
            }
            tried.push(key.clone());
            Some(())
        };
        let (mut parts, body) = req.into_parts();
        // gRPC needs `te: trailers` to reach an HTTP/2 upstream; it is hop-by-hop otherwise.
        let te_trailers = parts
            .headers
            .get(header::TE)
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"trailers"));
        // The client's gRPC deadline bounds the wait as well as the route's timeout.
        let timeout = match respond::grpc_timeout(&parts.headers).filter(|_| grpc) {
            Some(deadline) => timeout.min(deadline),
            None => timeout,
        };
        forward::rewrite_request(
            &mut parts.headers,
            &conn.client,
            request,
            &forward::HeaderOptions { underscores },
        );
        if underscores {
            let snippet_set = request_headers
                .iter()
                .flat_map(|e| e.set.iter().map(|(n, _)| n));
            let auth_set = auth_headers.iter().map(|(n, _)| n);
            forward::drop_underscore_aliases(&mut parts.headers, snippet_set.chain(auth_set));
        }
        for (name, value) in request_headers.iter().flat_map(|edits| edits.set.iter()) {
            parts.headers.remove(name);
            if let Some(value) = value {
                parts.headers.insert(name.clone(), value.clone());
            }
        }
        // Authentication's edits last: what the auth service vouched for replaces anything
        // the client or a snippet put under the same name.
        for (name, value) in auth_headers {
            parts.headers.remove(&name);
            if let Some(value) = value {
                parts.headers.insert(name, value);
            }
        }
        if let Some(prefix) = forwarded_prefix.and_then(|p| HeaderValue::from_str(&p).ok()) {
            parts
                .headers
                .insert(forward::X_FORWARDED_PREFIX.clone(), prefix);
        }
        // The upstream is spoken to in origin form with the normalised path that was routed.
        parts.uri = match Uri::try_from(target) {
            Ok(uri) => uri,
            Err(_) => return fail(UpstreamError::Protocol("unusable target".into()), None),
        };
        let mut body = idle::IdleBody::new(body, self.settings.client_body_timeout);
        // proxy-body-size: a body that grows past the limit ends the exchange with 413.
        let too_large = Arc::new(AtomicBool::new(false));
        if let Some(limit) = max_body {
            body = body.limited(limit, too_large.clone());
        }
        if wire == Wire::Http2 {
            // HTTP/2 carries the authority in :authority, from the URI, not in Host.
            let authority = parts
                .headers
                .remove(header::HOST)
                .and_then(|h| h.to_str().ok().map(str::to_string))
                .unwrap_or_else(|| key.to_string());
            let scheme = match transport {
                Transport::Plain => "http",
                Transport::Tls(_) => "https",
            };
            parts.uri = match Uri::try_from(format!("{scheme}://{authority}{target}")) {
                Ok(uri) => uri,
                Err(_) => return fail(UpstreamError::Protocol("unusable target".into()), None),
            };
            parts.version = Version::HTTP_2;
            if te_trailers {
                parts
                    .headers
                    .insert(header::TE, HeaderValue::from_static("trailers"));
            }
            let mut upstream_req = Request::from_parts(parts, body);
            let mut response = loop {
                let sent = tokio::time::timeout(
                    timeout,
                    self.h2_pool
                        .send(&key, &transport, connect_timeout, upstream_req),
                )
                .await;
                match sent {
                    Ok(Ok(response)) => break response,
                    Ok(Err(SendError {
                        error,
                        unsent: Some(again),
                    })) if retry(&error, &mut key, &mut in_flight).is_some() => {
                        upstream_req = again;
                    }
                    Ok(Err(_)) if too_large.load(Ordering::Relaxed) => {
                        return (
                            respond::status(StatusCode::PAYLOAD_TOO_LARGE),
                            Outcome::LOCAL,
                        );
                    }
                    Ok(Err(err)) => return fail(err.error, Some(key)),
                    Err(_) => return fail(UpstreamError::ResponseTimeout(timeout), Some(key)),
                }
            };
            drop(in_flight);
            finish_response(
                &mut response,
                response_headers.as_ref(),
                set_cookie,
                set_headers,
                &auth,
            );
            let response = response.map(|body| {
                Either::Right(Either::Left(
                    idle::IdleBody::new(body, timeout)
                        .holding(limit_guard)
                        .paced(bandwidth),
                ))
            });
            let outcome = Outcome {
                upstream: Some(key),
                error: None,
                refused: None,
            };
            return (response, outcome);
        }
        parts.version = Version::HTTP_11;
        let mut upstream_req = Request::from_parts(parts, body);
        let mut response = loop {
            let sent = tokio::time::timeout(
                timeout,
                self.pool.send(
                    key.clone(),
                    transport.clone(),
                    connect_timeout,
                    upstream_req,
                ),
            )
            .await;
            match sent {
                Ok(Ok(response)) => break response,
                Ok(Err(SendError {
                    error,
                    unsent: Some(again),
                })) if retry(&error, &mut key, &mut in_flight).is_some() => {
                    upstream_req = again;
                }
                Ok(Err(_)) if too_large.load(Ordering::Relaxed) => {
                    return (
                        respond::status(StatusCode::PAYLOAD_TOO_LARGE),
                        Outcome::LOCAL,
                    );
                }
                Ok(Err(err)) => return fail(err.error, Some(key)),
                Err(_) => return fail(UpstreamError::ResponseTimeout(timeout), Some(key)),
            }
        };
        // The body streams after this returns; the endpoint's load counts until headers.
        drop(in_flight);
        finish_response(
            &mut response,
            response_headers.as_ref(),
            set_cookie,
            set_headers,
            &auth,
        );
        let response = response.map(|body| {
            Either::Left(
                idle::IdleBody::new(body, timeout)
                    .holding(limit_guard)
                    .paced(bandwidth),
            )
        });
        (
            response,
            Outcome {
                upstream: Some(key),
                error: None,
                refused: None,
            },
        )
    }
}

/// An upstream's response as the client gets it, whichever protocol the upstream spoke: its
/// hop-by-hop headers removed, then the affinity cookie, the headers the route sets (CORS),
/// and authentication's cookies added.
fn finish_response<B>(
    response: &mut Response<B>,
    response_headers: Option<&Arc<crate::snapshot::annotations::snippet::ResponseEdits>>,
    set_cookie: Option<String>,
    set_headers: crate::proxy::phase::cors::SetHeaders,
    auth: &crate::proxy::phase::auth::Granted,
) {
    forward::strip_response_hop_by_hop(response.headers_mut());
    // The edits made for this request (with its variables filled in) are applied where the
    // response is written, and only if it is still the upstream's.
    if let Some(edits) = response_headers {
        response
            .extensions_mut()
            .insert(response::RequestEdits(edits.clone()));
    }
    if let Some(cookie) = set_cookie.and_then(|c| HeaderValue::from_str(&c).ok()) {
        response.headers_mut().append(header::SET_COOKIE, cookie);
    }
    for (name, value) in set_headers {
        response.headers_mut().insert(name, value);
    }
    for cookie in auth.cookies_for(response.status().as_u16()) {
        response
            .headers_mut()
            .append(header::SET_COOKIE, cookie.clone());
    }
    if let Some(info) = &auth.info {
        response.headers_mut().insert(
            http::HeaderName::from_static("authentication-info"),
            info.clone(),
        );
    }
}

/// What the access log keeps of an HTTP/2 request. A request without a usable `X-Request-ID`
/// is given one here, so the id logged is the id the upstream is sent (the header rewrite keeps
/// a usable one).
fn logged(req: &mut Request<Incoming>) -> Logged {
    let usable = req
        .headers()
        .get(&forward::X_REQUEST_ID)
        .is_some_and(|id| usable_request_id(id.as_bytes()));
    if !usable && let Ok(id) = HeaderValue::from_bytes(&forward::new_request_id()) {
        req.headers_mut().insert(forward::X_REQUEST_ID.clone(), id);
    }
    let headers = req.headers();
    let id = headers
        .get(&forward::X_REQUEST_ID)
        .map_or(&b""[..], HeaderValue::as_bytes);
    let host = req.uri().host();
    Logged::new(
        req.method().as_str(),
        req.uri()
            .path_and_query()
            .map_or("/", http::uri::PathAndQuery::as_str),
        host,
        "HTTP/2.0",
        |name| headers.get(name).map(HeaderValue::as_bytes),
        id,
    )
}

/// nginx's `$request_length` for an HTTP/2 request: its decoded header fields (as HPACK counts
/// a field: name, value and 32 bytes) and its declared body.
fn request_bytes(req: &Request<Incoming>) -> u64 {
    let fields: usize = req
        .headers()
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len() + 32)
        .sum();
    let pseudo = req.method().as_str().len()
        + req.uri().path_and_query().map_or(1, |p| p.as_str().len())
        + req.uri().authority().map_or(0, |a| a.as_str().len());
    let body = hyper::body::Body::size_hint(req.body())
        .exact()
        .unwrap_or(0);
    (fields + pseudo) as u64 + body
}

/// The most of a locally answered request's body that is read before answering: the initial
/// flow-control window, all a client may send before it must wait for us anyway.
const DRAIN_BYTES: usize = 65_535;
/// And for how long.
const DRAIN_TIME: std::time::Duration = std::time::Duration::from_secs(1);

/// Reads and drops what remains of a request body the proxy answers itself (a 413 for a body
/// over the limit, a redirect, a refusal), up to the flow-control window and for at most a
/// second. A response that ends the stream while the client is still sending makes hyper reset
/// the stream, and clients report that reset instead of the answer; a body that fits the
/// window has then already arrived, and a larger one is cut off as before.
async fn drain(body: &mut Incoming) {
    use http_body_util::BodyExt;
    let read = async {
        let mut seen = 0usize;
        while seen <= DRAIN_BYTES {
            match body.frame().await {
                Some(Ok(frame)) => {
                    seen += frame.data_ref().map_or(0, |d| d.len());
                }
                Some(Err(_)) | None => return,
            }
        }
    };
    let _ = tokio::time::timeout(DRAIN_TIME, read).await;
}
