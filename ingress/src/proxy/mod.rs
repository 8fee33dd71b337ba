//! The HTTP proxy, as a sequence of phases, each with one place to live:
//!
//! ```text
//!   accept (listener.rs: connection caps) → [TLS] → HTTP/1.x (h1/) or HTTP/2 (h2.rs + handle)
//!     request: authority (authority.rs) → target (target.rs) → route (route.rs)
//!            → decide: 404 / redirect / 503 / forward
//!            → rewrite headers (forward.rs) → upstream (pool.rs, h1/streams.rs)
//!            → response → log + metrics (record)
//! ```
//!
//! HTTP/1.x is served by `h1`, which reads and writes the bytes itself; HTTP/2 by hyper, whose
//! requests come to [`Proxy::handle`]. Both call the same authority, target, route and decide
//! functions, so a rule is written once.
//!
//! A request takes the snapshot current when it arrives and keeps its route until it is done, so
//! a configuration change never disturbs a request in flight.

pub mod authority;
pub mod caps;
pub mod forward;
pub mod h1;
pub mod h2;
pub mod idle;
pub mod listener;
pub mod metrics;
pub mod passthrough;
pub mod pool;
pub mod respond;
pub mod route;
pub mod settings;
pub mod tls;
pub mod upstream;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Method, Request, Response, StatusCode, Uri, Version};
use http_body_util::{Either, Full};
use hyper::body::Incoming;

use forward::ClientSide;
use ingress_wire::target;
use pool::{Pool, PoolKey, PoolSettings, UpstreamBody};
use route::Refusal;
pub use settings::ProxySettings;

use crate::proxy::metrics::ProxyMetrics;
use crate::publish::Published;
use crate::snapshot::Route;
use crate::snapshot::backend::{InFlight, Target};
use upstream::UpstreamError;

pub type ProxyBody = Either<idle::IdleBody<UpstreamBody>, Full<Bytes>>;

/// What the proxy knows about one client connection.
#[derive(Clone, Debug)]
pub struct ConnInfo {
    pub peer: SocketAddr,
    pub local_port: u16,
    pub https: bool,
    /// The TLS server name the client sent, if any, lower-case.
    pub sni: Option<String>,
    /// Forwarding header values, made once per connection.
    pub client: ClientSide,
    /// TLS negotiated HTTP/2 by ALPN.
    pub h2: bool,
}

impl ConnInfo {
    pub fn new(peer: SocketAddr, local_port: u16, https: bool) -> Self {
        Self {
            peer,
            local_port,
            https,
            sni: None,
            client: ClientSide::new(peer.ip(), https, local_port),
            h2: false,
        }
    }
}

pub struct Proxy {
    published: Arc<Published>,
    /// HTTP/2 requests' upstream connections (hyper's client, driven inline).
    pool: Arc<Pool>,
    /// The HTTP/1.x path's upstream connections.
    streams: h1::streams::StreamPool,
    metrics: Arc<ProxyMetrics>,
    settings: ProxySettings,
}

static SERVER: HeaderValue = HeaderValue::from_static("ingress");

/// How a request ended, for the access log.
pub(crate) struct Outcome {
    upstream: Option<PoolKey>,
    error: Option<UpstreamError>,
    /// Why the proxy answered it itself, when it refused it.
    refused: Option<&'static str>,
}

/// What to do with a request, decided from its route alone; both HTTP paths act on it.
pub(crate) enum Decision {
    /// Answer locally with this status (404).
    Respond(StatusCode),
    /// Redirect to this location (308).
    Redirect(String),
    /// Refused before routing (400, 421, ...): answered, and an HTTP/1.x connection closes.
    Refuse(Refusal),
    Fail(UpstreamError),
    Forward(Forward),
}

pub(crate) struct Forward {
    key: PoolKey,
    /// Counts toward the endpoint's load (least-loaded picking) until the response head.
    in_flight: Option<InFlight>,
    /// How long the upstream has to send its response head, and may pause in its body.
    timeout: Duration,
    /// The protocols this route lets a client switch to (`Upgrade`).
    upgrades: Arc<[String]>,
}

/// One finished request, for the metrics and the access log.
pub(crate) struct Record<'a> {
    conn: &'a ConnInfo,
    route: Option<&'a Arc<Route>>,
    status: u16,
    elapsed: Duration,
    /// Method and target, when the access log is on.
    request: Option<(&'a str, &'a str)>,
    host: Option<&'a str>,
    version: Version,
    outcome: &'a Outcome,
}

impl Outcome {
    const LOCAL: Outcome = Outcome {
        upstream: None,
        error: None,
        refused: None,
    };

    fn refused(refusal: Refusal) -> Outcome {
        Outcome {
            refused: Some(refusal.reason),
            ..Outcome::LOCAL
        }
    }
}

impl Proxy {
    pub fn new(
        published: Arc<Published>,
        metrics: Arc<ProxyMetrics>,
        settings: ProxySettings,
    ) -> Self {
        let pool_settings = PoolSettings {
            connect_timeout: settings.connect_timeout,
            idle_timeout: Duration::from_secs(55),
            max_idle_per_endpoint: 256,
        };
        Self {
            published,
            pool: Pool::new(pool_settings.clone()),
            streams: h1::streams::StreamPool::new(pool_settings),
            metrics,
            settings,
        }
    }

    pub fn settings(&self) -> &ProxySettings {
        &self.settings
    }

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
        if let (true, Some(hsts)) = (conn.https, &self.settings.hsts) {
            response
                .headers_mut()
                .entry(header::STRICT_TRANSPORT_SECURITY)
                .or_insert_with(|| hsts.clone());
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

    /// The phases for an HTTP/2 request: authority, target, route, decide, forward.
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
                    authority::AuthorityError::Missing => "no :authority and no Host",
                    authority::AuthorityError::Duplicate => "more than one Host header",
                    authority::AuthorityError::Conflict => "Host differs from :authority",
                    authority::AuthorityError::Invalid => "invalid :authority or Host",
                };
                return refuse(Refusal::bad_request(reason), None);
            }
        };
        let host = authority.host.to_string();
        let authority_raw = authority.raw.to_string();
        let raw_target = req.uri().path_and_query().map_or("/", |p| p.as_str());
        let target = match target::parse(raw_target, &self.settings.paths) {
            Ok(t) => t,
            Err(err) => {
                tracing::debug!(peer = %conn.peer, %err, "request target refused");
                return refuse(Refusal::bad_request("invalid request target"), Some(host));
            }
        };
        let route = match self.route(conn, Some(&host), &target) {
            Ok(route) => route,
            Err(refusal) => return refuse(refusal, Some(host)),
        };
        let forwarded_target = target.to_string();
        let original = raw_target.to_string();
        let decision = self.decide(route.as_ref(), conn, Some(&host), &original);
        let (response, outcome) = match decision {
            Decision::Respond(code) => (respond::status(code), Outcome::LOCAL),
            Decision::Redirect(location) => (respond::redirect(&location), Outcome::LOCAL),
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

    /// Everything about a request that depends on its route and not on how it is spoken.
    pub(crate) fn decide(
        &self,
        route: Option<&Arc<Route>>,
        conn: &ConnInfo,
        host: Option<&str>,
        target: &str,
    ) -> Decision {
        let Some(route) = route else {
            return Decision::Respond(StatusCode::NOT_FOUND);
        };
        // Before any redirect: a refused Ingress answers nothing else.
        if let Target::Refused(reason) = &route.backend.target {
            return Decision::Fail(UpstreamError::Refused(reason.clone()));
        }
        if let Some(location) = self.redirect(route, conn, host, target) {
            return Decision::Redirect(location);
        }
        let (key, in_flight) = match &route.backend.target {
            Target::Endpoints(_) => match route.backend.pick() {
                Some(endpoint) => (PoolKey::Addr(endpoint.addr), Some(endpoint.start())),
                None => return Decision::Fail(UpstreamError::NoEndpoints),
            },
            Target::ExternalName(name) => (PoolKey::Name(name.clone()), None),
            Target::Unavailable | Target::Refused(_) => {
                return Decision::Fail(UpstreamError::NoEndpoints);
            }
        };
        Decision::Forward(Forward {
            key,
            in_flight,
            timeout: route
                .options
                .read_timeout
                .unwrap_or(self.settings.response_timeout),
            upgrades: route.options.upgrades.clone(),
        })
    }

    /// Metrics and the access log line, the same for both HTTP paths.
    pub(crate) fn record(&self, r: &Record<'_>) {
        self.metrics.observe_request(r.route, r.status, r.elapsed);
        if let Some(UpstreamError::AddressRefused { refusal, .. }) = &r.outcome.error {
            self.metrics.count_address_refused(*refusal);
        }
        let Some((method, uri)) = r.request else {
            return;
        };
        let outcome = r.outcome;
        let error = match (&outcome.error, outcome.refused) {
            (Some(error), _) => error.to_string(),
            (None, Some(reason)) => reason.to_string(),
            (None, None) => "-".to_string(),
        };
        tracing::info!(
            target: "access",
            client = %r.conn.peer.ip(),
            method = method,
            host = r.host.unwrap_or("-"),
            uri = uri,
            version = ?r.version,
            status = r.status,
            duration_ms = %format_args!("{:.3}", r.elapsed.as_secs_f64() * 1000.0),
            upstream = %outcome.upstream.as_ref().map_or_else(|| "-".to_string(), ToString::to_string),
            ingress = r.route.map(|r| r.ingress.to_string()).as_deref().unwrap_or("-"),
            service = r.route.map(|r| r.backend.service.to_string()).as_deref().unwrap_or("-"),
            error = error,
        );
    }

    /// HTTP to HTTPS redirects (`ssl-redirect`, `force-ssl-redirect`).
    fn redirect(
        &self,
        route: &Route,
        conn: &ConnInfo,
        host: Option<&str>,
        target: &str,
    ) -> Option<String> {
        if conn.https || !route.redirects_to_https() {
            return None;
        }
        let host = host?;
        let port = match self.settings.https_port {
            443 => String::new(),
            p => format!(":{p}"),
        };
        Some(format!("https://{host}{port}{target}"))
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
            ..
        } = forward;
        let (mut parts, body) = req.into_parts();
        forward::rewrite_request(
            &mut parts.headers,
            &conn.client,
            request,
            &self.settings.headers,
        );
        // The upstream is spoken to in origin form with the normalised path that was routed.
        parts.uri = match Uri::try_from(target) {
            Ok(uri) => uri,
            Err(_) => return fail(UpstreamError::Protocol("unusable target".into()), None),
        };
        parts.version = Version::HTTP_11;
        let body = idle::IdleBody::new(body, self.settings.client_body_timeout);
        let upstream_req = Request::from_parts(parts, body);

        let mut response =
            match tokio::time::timeout(timeout, self.pool.send(key.clone(), upstream_req)).await {
                Ok(Ok(response)) => response,
                Ok(Err(err)) => return fail(err, Some(key)),
                Err(_) => return fail(UpstreamError::ResponseTimeout(timeout), Some(key)),
            };
        // The body streams after this returns; the endpoint's load counts until headers.
        drop(in_flight);
        forward::strip_response_hop_by_hop(response.headers_mut());
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

impl Route {
    fn redirects_to_https(&self) -> bool {
        self.options.force_ssl_redirect || (self.tls && self.options.ssl_redirect.unwrap_or(true))
    }
}
