//! A request's way through the proxy, as named phases, each in one module that reads its part
//! of the route's typed policy (`snapshot::policy`). HTTP/1.x (`h1`) and HTTP/2 (`h2`) both run
//! [`Proxy::request_phases`] and act on the [`Decision`] it returns, so a rule is written once.
//!
//! ```text
//!   identity  (identity.rs)  who the client is: the peer, and the forwarding values made from it
//!   ── per request, on the snapshot current when it arrives ──
//!   (the target is validated and normalised first: a request that cannot be read gets 400)
//!   tls       (tls.rs)       a host the connection's certificate was not chosen for → 421;
//!                            auth-tls: a connection set up for other client-certificate rules
//!                            → 421, a missing or bad certificate → 400 (or 302 to the error
//!                            page), match-cn → 403; plain HTTP → only a redirect to HTTPS
//!   route     (route.rs)     host + normalised path → route; none → 404; an encoded slash that
//!                            would route elsewhere once decoded → 400
//!   access    (access.rs)    the route's access policy: a refused Ingress → 503; a client
//!                            outside its source ranges → 403 (with `satisfy`); over its rate
//!                            limits → 503 (the buckets: proxy::rate_limit); whether it must
//!                            authenticate
//!   cors      (cors.rs)      enable-cors: OPTIONS from an allowed origin → 204; headers to set
//!   redirect  (redirect.rs)  before routing, the host's: from-to-www → 308, app-root → 302;
//!                            the route's: permanent-/temporal-redirect → their code; plain
//!                            HTTP on a route that wants HTTPS → 308
//!   rewrite   (rewrite.rs)   rewrite-target: the path sent upstream; X-Forwarded-Prefix
//!   canary    (canary.rs)    a route with a canary: its header, cookie, weight → which backend
//!             (mod.rs)       a declared body over proxy-body-size → 413 (a streamed one is
//!                            counted by the protocol path)
//!   upstream  (upstream.rs)  endpoint (affinity.rs: by the session cookie), response timeout,
//!                            upgrades allowed, a snippet's proxy_set_header; no endpoint →
//!                            the default-backend annotation's Service → Forward
//!   auth      (auth.rs)      awaited by the protocol path for a request that would be
//!                            forwarded: basic auth → 401; the auth service (auth-url) →
//!                            401/302/403/500; or the forward with its edits
//!   ── the protocol path forwards, then ──
//!   response  (response.rs)  Server and HSTS headers; a snippet's header actions on the
//!                            upstream's response; metrics and the access log
//!             (error_page.rs) custom-http-errors: a listed code (the upstream's, or the
//!                            proxy's own 404/502/503/504) → the error backend's page
//! ```
//!
//! A request keeps the route (and so the policy) it was decided on until it is done: a
//! configuration change never disturbs a request in flight.

pub mod access;
pub mod affinity;
pub mod auth;
pub mod canary;
pub mod cors;
pub mod digest;
pub mod error_page;
pub mod identity;
pub mod redirect;
pub mod response;
pub mod rewrite;
pub mod route;
pub mod samesite;
pub mod tls;
pub mod upstream;

use std::sync::Arc;
use std::time::{Duration, Instant};

use http::{StatusCode, Version};
use ingress_wire::target::{self, Target};

use super::access_log::{Logged, Meter};
use super::connect::Transport;
use super::pool::PoolKey;
use super::rate_limit::ConnectionGuard;
use super::upstream::UpstreamError;
use super::{Proxy, rate_limit};
use crate::snapshot::annotations::rate_limit::Bandwidth;
use crate::snapshot::annotations::snippet::{RequestEdits, ResponseEdits};
use crate::snapshot::annotations::upstream_rewrite::UpstreamRewrite;
use crate::snapshot::backend::InFlight;
use crate::snapshot::global::GlobalSettings;
use crate::snapshot::policy::{NextUpstream, Wire};
use crate::snapshot::{Route, Snapshot};
use identity::ConnInfo;
use route::Refusal;

/// The request's headers, as the phases that read them need them; each protocol path
/// implements it over its own representation.
pub(crate) trait RequestHeaders {
    /// The first value of the header `name` (lower-case).
    fn header(&self, name: &str) -> Option<&[u8]>;
    /// The value of the cookie `name` in the `Cookie` headers.
    fn cookie(&self, name: &str) -> Option<&[u8]>;
    /// Every value of the header `name` (lower-case), in the order they came.
    fn all(&self, name: &str) -> Vec<&[u8]>;
    /// Every header, in order (an auth subrequest passes the client's on).
    fn each(&self, f: &mut dyn FnMut(&str, &[u8]));
}

impl RequestHeaders for http::HeaderMap {
    fn header(&self, name: &str) -> Option<&[u8]> {
        self.get(name).map(http::HeaderValue::as_bytes)
    }

    fn all(&self, name: &str) -> Vec<&[u8]> {
        self.get_all(name)
            .iter()
            .map(http::HeaderValue::as_bytes)
            .collect()
    }

    fn cookie(&self, name: &str) -> Option<&[u8]> {
        canary::find_cookie(
            self.get_all(http::header::COOKIE)
                .iter()
                .map(http::HeaderValue::as_bytes),
            name,
        )
    }

    fn each(&self, f: &mut dyn FnMut(&str, &[u8])) {
        for (name, value) in self {
            f(name.as_str(), value.as_bytes());
        }
    }
}

impl RequestHeaders for &[httparse::Header<'_>] {
    fn header(&self, name: &str) -> Option<&[u8]> {
        self.iter()
            .find(|h| h.name.eq_ignore_ascii_case(name))
            .map(|h| h.value)
    }

    fn all(&self, name: &str) -> Vec<&[u8]> {
        self.iter()
            .filter(|h| h.name.eq_ignore_ascii_case(name))
            .map(|h| h.value)
            .collect()
    }

    fn cookie(&self, name: &str) -> Option<&[u8]> {
        canary::find_cookie(
            self.iter()
                .filter(|h| h.name.eq_ignore_ascii_case("cookie"))
                .map(|h| h.value),
            name,
        )
    }

    fn each(&self, f: &mut dyn FnMut(&str, &[u8])) {
        for h in *self {
            f(h.name, h.value);
        }
    }
}

/// What the phases read of a request, from either protocol path.
#[derive(Clone, Copy)]
pub(crate) struct RequestView<'r, 't> {
    pub(crate) method: &'r str,
    /// Validated; `None` for an HTTP/1.0 request without one.
    pub(crate) host: Option<&'r str>,
    /// The `Host` (or `:authority`) as sent, port included, for redirects that keep it.
    pub(crate) authority: Option<&'r str>,
    /// The target as the client sent it.
    pub(crate) target: &'t str,
    pub(crate) headers: &'r dyn RequestHeaders,
    /// The body's declared length, when it has one.
    pub(crate) body_len: Option<u64>,
    /// The id the upstream is sent as `X-Request-ID` (`$request_id`): the client's when
    /// usable, else the one the proxy made for this request.
    pub(crate) request_id: &'r [u8],
}

/// A request turned away by authentication: its status, where to go (a redirect), and the
/// headers of the answer (`WWW-Authenticate`, `Set-Cookie`).
#[derive(Debug)]
pub(crate) struct Denial {
    pub(crate) status: StatusCode,
    pub(crate) location: Option<String>,
    pub(crate) headers: cors::SetHeaders,
}

/// What to do with a request; both HTTP paths act on it.
#[expect(
    clippy::large_enum_variant,
    reason = "one per request, moved twice: boxing the forward would add an allocation per request"
)]
pub(crate) enum Decision {
    /// Answer locally with this status (404).
    Respond(StatusCode),
    /// Redirect to this location with this status (3xx).
    Redirect(StatusCode, String),
    /// A CORS preflight answered by the proxy: 204 with these headers.
    Preflight(cors::SetHeaders),
    /// Refused before routing (400, 421, ...): answered, and an HTTP/1.x connection closes.
    Refuse(Refusal),
    /// Not forwarded, with the error that says why (503 for a refused route or no endpoint).
    Fail(UpstreamError),
    /// Turned away by authentication (401 with a challenge, 403, a redirect to sign in).
    Deny(Denial),
    Forward(Forward),
}

impl Decision {
    /// What was decided, in a word (for traces).
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Decision::Respond(_) => "respond",
            Decision::Redirect(..) => "redirect",
            Decision::Preflight(_) => "preflight",
            Decision::Refuse(_) => "refuse",
            Decision::Fail(_) => "fail",
            Decision::Deny(_) => "deny",
            Decision::Forward(_) => "forward",
        }
    }
}

/// Where and how a request goes upstream.
pub(crate) struct Forward {
    pub(crate) key: PoolKey,
    /// Cleartext or TLS (with the route's `proxy-ssl-*`).
    pub(crate) transport: Transport,
    /// HTTP/1.1 or HTTP/2 to the upstream.
    pub(crate) wire: Wire,
    /// Counts toward the endpoint's load (least-loaded picking) until the response head.
    pub(crate) in_flight: Option<InFlight>,
    /// How long the upstream has to send its response head, and may pause in its body.
    pub(crate) timeout: Duration,
    /// For a new upstream connection, TCP and TLS (`proxy-connect-timeout`).
    pub(crate) connect_timeout: Duration,
    /// How long a write to the upstream may block (`proxy-send-timeout`).
    pub(crate) send_timeout: Duration,
    /// The `Host` sent upstream instead of the client's (`upstream-vhost`).
    pub(crate) vhost: Option<Arc<str>>,
    /// When a failed attempt is made again on another endpoint.
    pub(crate) next_upstream: NextUpstream,
    /// Where such an attempt goes.
    pub(crate) reselect: upstream::Reselect,
    /// The protocols this route lets a client switch to (`Upgrade`).
    pub(crate) upgrades: Arc<[String]>,
    /// `X-Forwarded-Prefix` for the upstream (a rewritten request's `x-forwarded-prefix`).
    pub(crate) forwarded_prefix: Option<Arc<str>>,
    /// `Set-Cookie` for the response: a new affinity session.
    pub(crate) set_cookie: Option<String>,
    /// Headers set on the upstream's response, replacing its own (CORS).
    pub(crate) set_headers: cors::SetHeaders,
    /// The largest request body to pass on (`proxy-body-size`): a streamed body that grows
    /// past it ends the request with 413.
    pub(crate) max_body: Option<u64>,
    /// Request headers set instead of the client's (a snippet's `proxy_set_header`).
    pub(crate) request_headers: Option<Arc<RequestEdits>>,
    /// The response phase's edits of the upstream's response headers (a snippet's).
    pub(crate) response_headers: Option<Arc<ResponseEdits>>,
    /// The response phase's rewrites of the upstream's `Location` and `Set-Cookie`.
    pub(crate) response_rewrite: Option<Arc<UpstreamRewrite>>,
    /// The canary phase chose the route's canary (the access log's alternative upstream).
    pub(crate) canary: bool,
    /// Pass on request header names with `_` (`enable-underscores-in-headers`).
    pub(crate) underscores: bool,
    /// What authentication changes: request headers sent upstream, cookies for the client.
    pub(crate) auth: Option<auth::Granted>,
    /// `limit-connections`: this request counts against its client until this is dropped,
    /// with the response sent.
    pub(crate) limit_guard: Option<ConnectionGuard>,
    /// `limit-rate`: the pace the response is sent at.
    pub(crate) bandwidth: Option<Bandwidth>,
}

/// A request after the phases: its normalised target (when it could be read), its route (when
/// it has one), and what to do.
pub(crate) struct Phased<'t> {
    pub(crate) target: Option<Target<'t>>,
    pub(crate) route: Option<Arc<Route>>,
    pub(crate) decision: Decision,
    /// The client of this request when trusted forwarded headers make it differ from the
    /// connection's: what forwarding headers, the access log and every phase after identity
    /// read.
    pub(crate) conn: Option<Box<ConnInfo>>,
    /// The global settings of the snapshot the request was decided on.
    pub(crate) global: Arc<GlobalSettings>,
    /// The request must authenticate before its forward goes anywhere ([`Proxy::authorize`]).
    pub(crate) auth: Option<auth::Pending>,
    /// `add-headers` for an answer the proxy makes itself to this request, when some of them
    /// have nginx variables (expanded for it); else `global`'s literal ones apply.
    pub(crate) own_headers: Option<Arc<ResponseEdits>>,
}

/// How a request ended, for the access log.
pub(crate) struct Outcome {
    pub(crate) upstream: Option<PoolKey>,
    pub(crate) error: Option<UpstreamError>,
    /// Why the proxy answered it itself, when it refused it.
    pub(crate) refused: Option<&'static str>,
}

impl Outcome {
    pub(crate) const LOCAL: Outcome = Outcome {
        upstream: None,
        error: None,
        refused: None,
    };

    pub(crate) fn refused(refusal: Refusal) -> Outcome {
        Outcome {
            refused: Some(refusal.reason),
            ..Outcome::LOCAL
        }
    }
}

/// One finished request, for the metrics and the access log.
pub(crate) struct Record<'a> {
    pub(crate) conn: &'a ConnInfo,
    pub(crate) route: Option<&'a Arc<Route>>,
    pub(crate) method: &'a str,
    /// The host the request named, when a consumer wants it (the access log, or metrics per
    /// host).
    pub(crate) host: Option<&'a str>,
    pub(crate) status: u16,
    pub(crate) elapsed: Duration,
    /// When the response ended (the end of `elapsed`): the access line's timestamp.
    pub(crate) finished: Instant,
    /// What the access log keeps of the request, when it is on.
    pub(crate) logged: Option<&'a Logged>,
    pub(crate) version: Version,
    pub(crate) outcome: &'a Outcome,
    pub(crate) meter: &'a Meter,
}

/// What [`Proxy::decide`] found: the target, the route, the decision, and the authentication
/// still to do.
type Decided<'t> = (
    Option<Target<'t>>,
    Option<Arc<Route>>,
    Decision,
    Option<auth::Pending>,
);

impl Proxy {
    /// Runs the request phases for one request (see [`RequestView`]): first the client
    /// identity (per request only when forwarded headers are trusted), then the rest on the
    /// snapshot current when the request arrived.
    pub(crate) fn request_phases<'t>(
        &self,
        conn: &ConnInfo,
        request: RequestView<'_, 't>,
    ) -> Phased<'t> {
        let snapshot = self.published.load();
        let own = conn.for_request(&snapshot.global.forwarded, request.headers);
        let client = own.as_deref().unwrap_or(conn);
        let facts = auth::SharedFacts::new();
        let (target, route, decision, auth) = self.decide(&snapshot, client, request, &facts);
        // add-headers with variables, should the proxy answer this request itself (a 404, a
        // redirect, an upstream failure): made from the request as the client sent it, as
        // nginx's http-level more_set_headers makes them.
        let own_headers = snapshot
            .global
            .own_response_templates
            .as_deref()
            .zip(target.as_ref())
            .and_then(|(templates, target)| {
                let facts = auth::RequestFacts::shared(&facts, client, &request, target);
                response::expand(
                    snapshot.global.own_response_headers.clone(),
                    templates,
                    facts,
                )
            });
        Phased {
            target,
            route,
            decision,
            conn: own,
            global: snapshot.global.clone(),
            auth,
            own_headers,
        }
    }

    fn decide<'t>(
        &self,
        snapshot: &Snapshot,
        conn: &ConnInfo,
        request: RequestView<'_, 't>,
        facts: &auth::SharedFacts,
    ) -> Decided<'t> {
        let RequestView {
            method,
            host,
            authority,
            target: raw_target,
            headers,
            body_len,
            request_id: _,
        } = request;
        let refused = |refusal: Refusal, target: Option<Target<'t>>| {
            (target, None, Decision::Refuse(refusal), None)
        };
        let mut target = match target::parse(raw_target, &self.settings.paths) {
            Ok(target) => target,
            Err(err) => {
                tracing::debug!(peer = %conn.peer, %err, "request target refused");
                return refused(Refusal::bad_request("invalid request target"), None);
            }
        };
        if let Err(refusal) = tls::check(&snapshot.tls, conn, host, self.settings.no_sni_requests) {
            return refused(refusal, Some(target));
        }
        // Client certificates: decided on HTTPS before anything else of the host; a plain HTTP
        // request to such a host is only ever redirected to HTTPS (below).
        let vhost_policy = snapshot.host(host).map(|vhost| &vhost.policy);
        if let Some(reason) = vhost_policy
            .filter(|p| p.client_auth.is_none())
            .and_then(|p| p.client_auth_error.as_ref())
        {
            return (
                Some(target),
                None,
                Decision::Fail(UpstreamError::Refused(reason.clone())),
                None,
            );
        }
        let client_auth = vhost_policy.and_then(|p| p.client_auth.as_ref());
        let mut cert_headers = None;
        if let Some(auth) = client_auth
            && conn.https
        {
            match tls::client_certificate(auth, conn) {
                Ok(headers) => cert_headers = headers,
                Err(refusal) => {
                    return (Some(target), None, refusal.decision(), None);
                }
            }
        }
        let plain_to_protected = client_auth.is_some() && !conn.https;
        if let Some(decision) = snapshot
            .host(host)
            .and_then(|vhost| redirect::host(&vhost.policy, conn, authority, raw_target, &target))
        {
            return (Some(target), None, decision, None);
        }
        let route = match route::find(snapshot, host, &target) {
            Ok(Some(route)) => route.clone(),
            Ok(None) => {
                return (
                    Some(target),
                    None,
                    Decision::Respond(StatusCode::NOT_FOUND),
                    None,
                );
            }
            Err(refusal) => return refused(refusal, Some(target)),
        };
        let cors = cors::check(route.policy.response.cors.as_deref(), method, headers);
        let (access, authenticate) = match access::check(&route.policy.access, conn) {
            access::Verdict::Pass => (None, false),
            access::Verdict::Stop(decision) => (Some(decision), false),
            access::Verdict::Authenticate => (None, true),
        };
        // Rate limits count every request the ranges let through, before authentication (as
        // nginx's limit_req runs before its access phase's auth).
        let mut limit_guard = None;
        let decision = access
            .or_else(|| {
                match access::rate_limit(&route.policy.access, conn, &self.rate_limits) {
                    Ok(guard) => {
                        limit_guard = guard;
                        None
                    }
                    Err(limited) => {
                        self.metrics.count_rate_limited(&route.labels, limited);
                        let status = match limited {
                            rate_limit::Limited::Connections => snapshot.global.limit_conn_status,
                            _ => snapshot.global.limit_req_status,
                        };
                        // The ConfigMap allows 400..=599 only, so this is a status.
                        let status = StatusCode::from_u16(status)
                            .unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
                        Some(Decision::Respond(status))
                    }
                }
            })
            .or_else(|| match &cors {
                cors::Verdict::Preflight(set) => Some(Decision::Preflight(set.clone())),
                _ => None,
            })
            .or_else(|| redirect::check(&route.policy.redirect, conn, host, raw_target, self))
            .unwrap_or_else(|| {
                if plain_to_protected {
                    tracing::debug!(peer = %conn.peer, "plain HTTP request to a host that requires a client certificate");
                    return Decision::Respond(StatusCode::BAD_REQUEST);
                }
                if let Some(limit) = route.policy.upstream.max_body
                    && body_len.is_some_and(|n| n > limit)
                {
                    return Decision::Respond(StatusCode::PAYLOAD_TOO_LARGE);
                }
                // The key is made from the request as the client sent it, before any rewrite.
                let hash_key = route.policy.upstream.hash_by.as_deref().map(|key| {
                    affinity::hash_key(
                        key,
                        conn,
                        host,
                        raw_target,
                        &target.path,
                        target.query,
                        headers,
                    )
                });
                let prefix = rewrite::apply(&route.policy.rewrite, &mut target);
                let backend = canary::backend(&route, headers);
                let timeouts = &snapshot.global.timeouts;
                let defaults = upstream::Defaults {
                    response: timeouts.read,
                    connect: timeouts.connect,
                    send: timeouts.send,
                };
                let mut decision = upstream::forward(
                    &route,
                    backend,
                    headers,
                    conn.https,
                    &defaults,
                    prefix,
                    hash_key.as_deref(),
                );
                if let (Decision::Forward(forward), cors::Verdict::Headers(set)) =
                    (&mut decision, cors)
                {
                    forward.set_headers = set;
                }
                let canary = !Arc::ptr_eq(backend, &route.backend);
                if let Decision::Forward(forward) = &mut decision {
                    forward.canary = canary;
                    forward.limit_guard = limit_guard;
                    forward.response_headers = response::edits(&route.policy.response);
                    // add-headers and proxy-set-headers values with nginx variables: made
                    // for this request, from it as the client sent it.
                    let response_templates = route.policy.response.header_templates.as_deref();
                    let request_templates = route.policy.upstream.request_templates.as_deref();
                    if response_templates.is_some() || request_templates.is_some() {
                        let facts = auth::RequestFacts::shared(facts, conn, &request, &target);
                        forward.response_headers = response::expand(
                            forward.response_headers.take(),
                            response_templates.unwrap_or_default(),
                            facts,
                        );
                        forward.request_headers = upstream::expand(
                            forward.request_headers.take(),
                            request_templates.unwrap_or_default(),
                            facts,
                        );
                    }
                    forward.response_rewrite = response::rewrites(&route.policy.response);
                    forward.underscores = snapshot.global.underscores;
                    if let Some(cert) = cert_headers {
                        forward.request_headers = Some(match forward.request_headers.take() {
                            None => cert,
                            // The route's own edits, then the certificate's, which win.
                            Some(route_edits) => Arc::new(RequestEdits {
                                set: route_edits.set.iter().chain(&cert.set).cloned().collect(),
                            }),
                        });
                    }
                }
                decision
            });
        // Only a request headed for the backend authenticates (a forward, or its 503 for want
        // of endpoints): redirects, preflights and 413s are answered first, as nginx answers
        // them before its access phase.
        let auth = (authenticate && matches!(decision, Decision::Forward(_) | Decision::Fail(_)))
            .then(|| {
                let external =
                    route.policy.access.auth.external.is_some().then(|| {
                        auth::RequestFacts::shared(facts, conn, &request, &target).clone()
                    });
                let digest =
                    route
                        .policy
                        .access
                        .auth
                        .digest
                        .is_some()
                        .then(|| digest::DigestFacts {
                            method: request.method.to_string(),
                            request_uri: request.target.to_string(),
                            client: conn.peer.ip().to_canonical(),
                        });
                auth::Pending::of(headers, external, digest)
            });
        // A request `satisfy any` let in by its address is not checked, but its location's
        // header settings still apply in ingress-nginx: Authorization cleared on a basic-auth
        // route, and each auth-response-headers name set from an answer there was none of
        // (so removed), so a client never supplies them itself.
        let mut decision = decision;
        if auth.is_none()
            && let Decision::Forward(forward) = &mut decision
        {
            forward.auth = auth::Granted::unchecked(&route.policy.access.auth);
        }
        (Some(target), Some(route), decision, auth)
    }
}
