//! The HTTP proxy, as a sequence of phases, each with one place to live:
//!
//! ```text
//!   accept (listener.rs) → [TLS] → request: route (snapshot) → redirect? → pick endpoint
//!        → rewrite headers (forward.rs) → upstream (upstream.rs) → response → log + metrics
//! ```
//!
//! A request takes the snapshot current when it arrives and keeps its route until it is done, so
//! a configuration change never disturbs a request in flight.

pub mod forward;
pub mod h1;
pub mod listener;
pub mod pool;
pub mod respond;
pub mod upstream;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::uri::PathAndQuery;
use http::{Request, Response, StatusCode, Uri, Version};
use http_body_util::{Either, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;

use pool::{Pool, PoolKey, PoolSettings, UpstreamBody};

use crate::metrics::Metrics;
use crate::publish::Published;
use crate::snapshot::Route;
use crate::snapshot::backend::{InFlight, Target};
use crate::snapshot::host::request_host;
use crate::snapshot::path::normalize;
use forward::ClientSide;
use upstream::UpstreamError;

pub type ProxyBody = Either<UpstreamBody, Full<Bytes>>;

#[derive(Clone, Debug)]
pub struct ProxySettings {
    pub connect_timeout: Duration,
    pub response_timeout: Duration,
    pub access_log: bool,
    /// The HTTPS port clients use, for redirect locations.
    pub https_port: u16,
    /// The `Strict-Transport-Security` value added to HTTPS responses, if enabled.
    pub hsts: Option<HeaderValue>,
}

/// What the proxy knows about one client connection.
#[derive(Clone, Debug)]
pub struct ConnInfo {
    pub peer: SocketAddr,
    pub local_port: u16,
    pub https: bool,
    /// The TLS server name the client sent, if any.
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
    pool: Arc<Pool>,
    /// The HTTP/1.1 fast path's upstream connections.
    streams: h1::streams::StreamPool,
    metrics: Arc<Metrics>,
    settings: ProxySettings,
}

static SERVER: HeaderValue = HeaderValue::from_static("ingress");

/// How a request ended, for the access log.
pub(crate) struct Outcome {
    upstream: Option<PoolKey>,
    error: Option<UpstreamError>,
}

/// What to do with a request, decided from its route alone; both HTTP paths act on it.
pub(crate) enum Decision {
    /// Answer locally with this status (404).
    Respond(StatusCode),
    /// Redirect to this location (308).
    Redirect(String),
    Fail(UpstreamError),
    Forward(Forward),
}

pub(crate) struct Forward {
    key: PoolKey,
    /// Counts toward the endpoint's load (least-loaded picking) until the response head.
    in_flight: Option<InFlight>,
    /// How long the upstream has to send its response head.
    timeout: Duration,
}

/// One finished request, for the metrics and the access log.
pub(crate) struct Record<'a> {
    conn: &'a ConnInfo,
    route: Option<&'a Route>,
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
    };
}

impl Proxy {
    pub fn new(published: Arc<Published>, metrics: Arc<Metrics>, settings: ProxySettings) -> Self {
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

    pub async fn handle(
        self: Arc<Self>,
        req: Request<Incoming>,
        conn: Arc<ConnInfo>,
    ) -> Result<Response<ProxyBody>, Infallible> {
        let started = Instant::now();
        let client_version = req.version();
        let authority = request_authority(&req);
        let host = authority
            .as_ref()
            .and_then(|a| a.to_str().ok())
            .and_then(request_host);
        let route = self.route_for(host.as_deref(), req.uri().path());
        // Only what the access log needs survives the request being moved upstream.
        let logged = self
            .settings
            .access_log
            .then(|| (req.method().clone(), req.uri().to_string()));
        let target = req.uri().path_and_query().map_or("/", PathAndQuery::as_str);
        let (mut response, outcome) =
            match self.decide(route.as_ref(), &conn, host.as_deref(), target) {
                Decision::Respond(code) => (respond::status(code), Outcome::LOCAL),
                Decision::Redirect(location) => (respond::redirect(&location), Outcome::LOCAL),
                Decision::Fail(error) => (
                    respond::status(error.status()),
                    Outcome {
                        upstream: None,
                        error: Some(error),
                    },
                ),
                Decision::Forward(forward) => {
                    self.forward(req, forward, authority.as_ref(), &conn).await
                }
            };
        response
            .headers_mut()
            .insert(header::SERVER, SERVER.clone());
        if let (true, Some(hsts)) = (conn.https, &self.settings.hsts) {
            response
                .headers_mut()
                .entry(header::STRICT_TRANSPORT_SECURITY)
                .or_insert_with(|| hsts.clone());
        }
        // The upstream may speak HTTP/1.0; the client gets the version it asked with.
        *response.version_mut() = client_version;
        self.record(&Record {
            conn: &conn,
            route: route.as_deref(),
            status: response.status().as_u16(),
            elapsed: started.elapsed(),
            request: logged.as_ref().map(|(m, u)| (m.as_str(), u.as_str())),
            host: host.as_deref(),
            version: client_version,
            outcome: &outcome,
        });
        Ok(response)
    }

    /// The route for a request, from the snapshot current when it arrives.
    pub(crate) fn route_for(&self, host: Option<&str>, path: &str) -> Option<Arc<Route>> {
        let snapshot = self.published.load();
        snapshot.route(host, &normalize(path)).cloned()
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
            error = outcome.error.as_ref().map(ToString::to_string).as_deref().unwrap_or("-"),
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
        mut req: Request<Incoming>,
        forward: Forward,
        authority: Option<&HeaderValue>,
        conn: &ConnInfo,
    ) -> (Response<ProxyBody>, Outcome) {
        let fail = |error: UpstreamError, upstream: Option<PoolKey>| {
            (
                respond::status(error.status()),
                Outcome {
                    upstream,
                    error: Some(error),
                },
            )
        };
        let Forward {
            key,
            in_flight,
            timeout,
        } = forward;

        let upgrade = req.version() == Version::HTTP_11 && forward::is_upgrade(req.headers());
        let client_upgrade = upgrade.then(|| hyper::upgrade::on(&mut req));
        let (mut parts, body) = req.into_parts();
        forward::strip_hop_by_hop(&mut parts.headers, upgrade);
        forward::add_forwarding(&mut parts.headers, &conn.client, authority);
        forward::ensure_request_id(&mut parts.headers);
        if !parts.headers.contains_key(header::HOST) {
            // HTTP/2 carries the host in :authority; an HTTP/1.1 upstream needs a Host header.
            if let Some(value) = authority {
                parts.headers.insert(header::HOST, value.clone());
            }
        }
        // The upstream is spoken to in origin form; the Host header names the virtual host.
        let origin = parts
            .uri
            .path_and_query()
            .cloned()
            .unwrap_or_else(|| PathAndQuery::from_static("/"));
        parts.uri = Uri::from(origin);
        parts.version = Version::HTTP_11;
        let upstream_req = Request::from_parts(parts, body);

        if let Some(client_upgrade) = client_upgrade {
            let mut response =
                match tokio::time::timeout(timeout, self.pool.send_upgrade(&key, upstream_req))
                    .await
                {
                    Ok(Ok(response)) => response,
                    Ok(Err(err)) => return fail(err, Some(key)),
                    Err(_) => return fail(UpstreamError::ResponseTimeout(timeout), Some(key)),
                };
            let switching = response.status() == StatusCode::SWITCHING_PROTOCOLS;
            if switching {
                let upstream_upgrade = hyper::upgrade::on(&mut response);
                tokio::spawn(tunnel(client_upgrade, upstream_upgrade, in_flight));
            }
            forward::strip_hop_by_hop(response.headers_mut(), switching);
            // An upgrade answer carries no body; a refusal's body is dropped with its connection.
            let response = response.map(|_| Either::Right(Full::new(Bytes::new())));
            return (
                response,
                Outcome {
                    upstream: Some(key),
                    error: None,
                },
            );
        }
        let mut response =
            match tokio::time::timeout(timeout, self.pool.send(key.clone(), upstream_req)).await {
                Ok(Ok(response)) => response,
                Ok(Err(err)) => return fail(err, Some(key)),
                Err(_) => return fail(UpstreamError::ResponseTimeout(timeout), Some(key)),
            };
        // The body streams after this returns; the endpoint's load counts until headers.
        drop(in_flight);
        forward::strip_hop_by_hop(response.headers_mut(), false);
        (
            response.map(Either::Left),
            Outcome {
                upstream: Some(key),
                error: None,
            },
        )
    }
}

impl Route {
    fn redirects_to_https(&self) -> bool {
        self.options.force_ssl_redirect || (self.tls && self.options.ssl_redirect.unwrap_or(true))
    }
}

/// The host the client asked for: the URI's authority (HTTP/2, absolute-form HTTP/1.1) or the
/// Host header. A header value, so passing it on costs a reference count, not a copy.
fn request_authority(req: &Request<Incoming>) -> Option<HeaderValue> {
    if let Some(authority) = req.uri().authority() {
        return HeaderValue::from_str(authority.as_str()).ok();
    }
    req.headers().get(header::HOST).cloned()
}

/// Copies bytes both ways once client and upstream have both switched protocols.
async fn tunnel(
    client: hyper::upgrade::OnUpgrade,
    upstream: hyper::upgrade::OnUpgrade,
    in_flight: Option<crate::snapshot::backend::InFlight>,
) {
    let (client, upstream) = match tokio::try_join!(client, upstream) {
        Ok(pair) => pair,
        Err(err) => {
            tracing::debug!(%err, "upgrade failed");
            return;
        }
    };
    let mut client = TokioIo::new(client);
    let mut upstream = TokioIo::new(upstream);
    if let Err(err) = tokio::io::copy_bidirectional(&mut client, &mut upstream).await {
        tracing::debug!(%err, "upgraded connection ended");
    }
    drop(in_flight);
}
