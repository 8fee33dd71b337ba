//! A request's way through the proxy, as named phases, each in one module that reads its part
//! of the route's typed policy (`snapshot::policy`). HTTP/1.x (`h1`) and HTTP/2 (`h2`) both run
//! [`Proxy::request_phases`] and act on the [`Decision`] it returns, so a rule is written once.
//!
//! ```text
//!   identity  (identity.rs)  who the client is: the peer, and the forwarding values made from it
//!   ── per request, on the snapshot current when it arrives ──
//!   (the target is validated and normalised first: a request that cannot be read gets 400)
//!   tls       (tls.rs)       a host the connection's certificate was not chosen for → 421
//!   route     (route.rs)     host + normalised path → route; none → 404; an encoded slash that
//!                            would route elsewhere once decoded → 400
//!   access    (access.rs)    the route's access policy: a refused Ingress → 503
//!   redirect  (redirect.rs)  plain HTTP on a route that wants HTTPS → 308
//!   upstream  (upstream.rs)  endpoint, response timeout, upgrades allowed → Forward
//!   ── the protocol path forwards, then ──
//!   response  (response.rs)  Server and HSTS headers; metrics and the access log
//! ```
//!
//! A request keeps the route (and so the policy) it was decided on until it is done: a
//! configuration change never disturbs a request in flight.

pub mod access;
pub mod identity;
pub mod redirect;
pub mod response;
pub mod route;
pub mod tls;
pub mod upstream;

use std::sync::Arc;
use std::time::Duration;

use http::{StatusCode, Version};
use ingress_wire::target::{self, Target};

use super::Proxy;
use super::connect::Transport;
use super::pool::PoolKey;
use super::upstream::UpstreamError;
use crate::snapshot::Route;
use crate::snapshot::backend::InFlight;
use crate::snapshot::policy::{NextUpstream, Wire};
use identity::ConnInfo;
use route::Refusal;

/// What to do with a request; both HTTP paths act on it.
pub(crate) enum Decision {
    /// Answer locally with this status (404).
    Respond(StatusCode),
    /// Redirect to this location (308).
    Redirect(String),
    /// Refused before routing (400, 421, ...): answered, and an HTTP/1.x connection closes.
    Refuse(Refusal),
    /// Not forwarded, with the error that says why (503 for a refused route or no endpoint).
    Fail(UpstreamError),
    Forward(Forward),
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
    /// The protocols this route lets a client switch to (`Upgrade`).
    pub(crate) upgrades: Arc<[String]>,
}

/// A request after the phases: its normalised target (when it could be read), its route (when
/// it has one), and what to do.
pub(crate) struct Phased<'t> {
    pub(crate) target: Option<Target<'t>>,
    pub(crate) route: Option<Arc<Route>>,
    pub(crate) decision: Decision,
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
    pub(crate) status: u16,
    pub(crate) elapsed: Duration,
    /// Method and target, when the access log is on.
    pub(crate) request: Option<(&'a str, &'a str)>,
    pub(crate) host: Option<&'a str>,
    pub(crate) version: Version,
    pub(crate) outcome: &'a Outcome,
}

impl Proxy {
    /// Runs the request phases for a request naming `host` (validated; `None` for an HTTP/1.0
    /// request without one) and `raw_target` (as the client sent it).
    pub(crate) fn request_phases<'t>(
        &self,
        conn: &ConnInfo,
        host: Option<&str>,
        raw_target: &'t str,
    ) -> Phased<'t> {
        let refused = |refusal: Refusal, target: Option<Target<'t>>| Phased {
            target,
            route: None,
            decision: Decision::Refuse(refusal),
        };
        let target = match target::parse(raw_target, &self.settings.paths) {
            Ok(target) => target,
            Err(err) => {
                tracing::debug!(peer = %conn.peer, %err, "request target refused");
                return refused(Refusal::bad_request("invalid request target"), None);
            }
        };
        let snapshot = self.published.load();
        if let Err(refusal) = tls::check(&snapshot.tls, conn, host, self.settings.no_sni_requests) {
            return refused(refusal, Some(target));
        }
        let route = match route::find(&snapshot, host, &target) {
            Ok(Some(route)) => route.clone(),
            Ok(None) => {
                return Phased {
                    target: Some(target),
                    route: None,
                    decision: Decision::Respond(StatusCode::NOT_FOUND),
                };
            }
            Err(refusal) => return refused(refusal, Some(target)),
        };
        let decision = access::check(&route.policy.access)
            .or_else(|| redirect::check(&route.policy.redirect, conn, host, raw_target, self))
            .unwrap_or_else(|| {
                let defaults = upstream::Defaults {
                    response: self.settings.response_timeout,
                    connect: self.settings.connect_timeout,
                    send: self.settings.upstream_send_timeout,
                };
                upstream::forward(&route, conn.https, &defaults)
            });
        Phased {
            target: Some(target),
            route: Some(route),
            decision,
        }
    }
}
