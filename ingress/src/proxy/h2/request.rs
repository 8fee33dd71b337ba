//! One HTTP/2 request, from hyper's `Request` to the response: the same phases as HTTP/1.x
//! (`proxy::phase`), then the request rewritten for an HTTP/1.1 upstream and sent through the
//! pool.
//!
//! ```text
//!   CONNECT / TRACE → refused
//!   :authority and Host (ingress_wire::authority::of_h2): missing, two, or disagreeing → 400
//!   request_phases (tls, route, access, redirect, upstream) → Decision
//!   Forward: headers rewritten (forward.rs) → pool.send, bounded by the route's timeout
//!   response: Server, HSTS, record
//! ```

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use http::header::{self, HeaderValue};
use http::{Method, Request, Response, StatusCode, Uri, Version};
use http_body_util::Either;
use hyper::body::Incoming;
use ingress_wire::authority::{self, AuthorityError};

use crate::proxy::phase::identity::ConnInfo;
use crate::proxy::phase::response::{self, SERVER};
use crate::proxy::phase::route::Refusal;
use crate::proxy::phase::{Decision, Forward, Outcome, Phased, Record, RequestView};
use crate::proxy::pool::PoolKey;
use crate::proxy::upstream::UpstreamError;
use crate::proxy::{Proxy, ProxyBody, forward, idle, respond};
use crate::snapshot::Route;

impl Proxy {
    /// Serves one HTTP/2 request.
    pub async fn handle(
        self: Arc<Self>,
        req: Request<Incoming>,
        conn: Arc<ConnInfo>,
    ) -> Result<Response<ProxyBody>, Infallible> {
        let started = Instant::now();
        let logged = self
            .settings
            .access_log
            .then(|| (req.method().to_string(), req.uri().to_string()));
        let (mut response, route, host, outcome) = self.serve_h2(req, &conn).await;
        response
            .headers_mut()
            .insert(header::SERVER, SERVER.clone());
        if let Some(hsts) = self.hsts(conn.https) {
            response
                .headers_mut()
                .entry(header::STRICT_TRANSPORT_SECURITY)
                .or_insert_with(|| hsts.clone());
        }
        // The upstream's response (not one the proxy made) gets the route's header edits.
        if let (Some(route), Some(_), None) = (&route, &outcome.upstream, &outcome.error)
            && let Some(edits) = response::edits(&route.policy.response)
        {
            let status = response.status().as_u16();
            edits.apply(status, response.headers_mut());
        }
        if let (Some(route), Some(_), None) = (&route, &outcome.upstream, &outcome.error)
            && let Some(rewrite) = response::rewrites(&route.policy.response)
        {
            response::rewrite_headers(&rewrite, response.headers_mut());
        }
        *response.version_mut() = Version::HTTP_2;
        self.record(&Record {
            conn: &conn,
            route: route.as_ref(),
            status: response.status().as_u16(),
            elapsed: started.elapsed(),
            request: logged.as_ref().map(|(m, u)| (m.as_str(), u.as_str())),
            host: host.as_deref(),
            version: Version::HTTP_2,
            outcome: &outcome,
        });
        Ok(response)
    }

    async fn serve_h2(
        &self,
        req: Request<Incoming>,
        conn: &ConnInfo,
    ) -> (
        Response<ProxyBody>,
        Option<Arc<Route>>,
        Option<String>,
        Outcome,
    ) {
        let refuse = |refusal: Refusal, host: Option<String>| {
            (
                respond::status(refusal.status),
                None,
                host,
                Outcome::refused(refusal),
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
        let Phased {
            target,
            route,
            decision,
        } = self.request_phases(
            conn,
            RequestView {
                method: req.method().as_str(),
                host: Some(&host),
                authority: Some(&authority_raw),
                target: &original,
                headers: req.headers(),
                body_len: hyper::body::Body::size_hint(req.body()).exact(),
            },
        );
        let forwarded_target = target.map(|t| t.to_string()).unwrap_or_default();
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
                respond::status(error.status()),
                Outcome {
                    error: Some(error),
                    ..Outcome::LOCAL
                },
            ),
            Decision::Forward(forward) => {
                let request = forward::RequestSide {
                    authority: &authority_raw,
                    original_uri: &original,
                };
                self.forward(req, forward, &forwarded_target, &request, conn)
                    .await
            }
        };
        (response, route, Some(host), outcome)
    }

    async fn forward(
        &self,
        req: Request<Incoming>,
        forward: Forward,
        target: &str,
        request: &forward::RequestSide<'_>,
        conn: &ConnInfo,
    ) -> (Response<ProxyBody>, Outcome) {
        let fail = |error: UpstreamError, upstream: Option<PoolKey>| {
            (
                respond::status(error.status()),
                Outcome {
                    upstream,
                    error: Some(error),
                    refused: None,
                },
            )
        };
        let Forward {
            key,
            in_flight,
            timeout,
            forwarded_prefix,
            set_cookie,
            set_headers,
            max_body,
            request_headers,
            ..
        } = forward;
        let (mut parts, body) = req.into_parts();
        forward::rewrite_request(
            &mut parts.headers,
            &conn.client,
            request,
            &self.settings.headers,
        );
        for (name, value) in request_headers.iter().flat_map(|edits| edits.set.iter()) {
            parts.headers.remove(name);
            if let Some(value) = value {
                parts.headers.insert(name.clone(), value.clone());
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
        parts.version = Version::HTTP_11;
        let mut body = idle::IdleBody::new(body, self.settings.client_body_timeout);
        let too_large = Arc::new(AtomicBool::new(false));
        if let Some(limit) = max_body {
            body = body.limited(limit, too_large.clone());
        }
        let upstream_req = Request::from_parts(parts, body);

        let mut response =
            match tokio::time::timeout(timeout, self.pool.send(key.clone(), upstream_req)).await {
                Ok(Ok(response)) => response,
                Ok(Err(_)) if too_large.load(Ordering::Relaxed) => {
                    return (
                        respond::status(StatusCode::PAYLOAD_TOO_LARGE),
                        Outcome::LOCAL,
                    );
                }
                Ok(Err(err)) => return fail(err, Some(key)),
                Err(_) => return fail(UpstreamError::ResponseTimeout(timeout), Some(key)),
            };
        // The body streams after this returns; the endpoint's load counts until headers.
        drop(in_flight);
        forward::strip_response_hop_by_hop(response.headers_mut());
        if let Some(cookie) = set_cookie.and_then(|c| HeaderValue::from_str(&c).ok()) {
            response.headers_mut().append(header::SET_COOKIE, cookie);
        }
        for (name, value) in set_headers {
            response.headers_mut().insert(name, value);
        }
        let response = response.map(|body| Either::Left(idle::IdleBody::new(body, timeout)));
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
