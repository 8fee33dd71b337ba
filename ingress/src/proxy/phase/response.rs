//! The response phase: what every response gets from the proxy (its `Server`, and HSTS on
//! HTTPS), and what every finished request leaves behind (metrics, the access log line).

use std::cell::RefCell;
use std::sync::Arc;

use http::{HeaderName, HeaderValue};

use super::Record;
use super::auth::RequestFacts;
use crate::proxy::Proxy;
use crate::proxy::access_log::{self, AccessFormat};
use crate::proxy::metrics::compat::Observed;
use crate::proxy::upstream::UpstreamError;
use crate::snapshot::annotations::auth::Template;
use crate::snapshot::annotations::snippet::ResponseEdits;
use crate::snapshot::annotations::upstream_rewrite::UpstreamRewrite;
use crate::snapshot::global::GlobalSettings;
use crate::snapshot::policy::ResponsePolicy;

/// The `Server` header of every response.
pub(crate) static SERVER: HeaderValue = HeaderValue::from_static("ingress");
/// The same with `server-tokens` on.
pub(crate) static SERVER_VERSION: HeaderValue =
    HeaderValue::from_static(concat!("ingress/", env!("CARGO_PKG_VERSION")));

/// The `Server` value the global settings ask for.
pub(crate) fn server(global: &GlobalSettings) -> &'static HeaderValue {
    if global.server_tokens {
        &SERVER_VERSION
    } else {
        &SERVER
    }
}

/// The `Strict-Transport-Security` value for a response on a connection that is HTTPS or not.
pub(crate) fn hsts(global: &GlobalSettings, https: bool) -> Option<&HeaderValue> {
    global.hsts_header.as_ref().filter(|_| https)
}

/// The edits of the upstream's response headers on a route with `policy` (a snippet's
/// `add_header`, `more_set_headers`, `more_clear_headers`): HTTP/1.x applies them as it writes
/// the head, HTTP/2 with [`ResponseEdits::apply`], after the proxy's own `Server`.
pub(crate) fn edits(policy: &ResponsePolicy) -> Option<Arc<ResponseEdits>> {
    policy.headers.clone()
}

/// `add-headers` on one of the proxy's own answers (404, 503, a redirect, an upstream
/// failure), `own` being the request's ([`super::Phased::own_headers`]): each header the
/// answer does not already carry (the proxy's framing, `Server`,
/// `Location` and the like stay its own). The HTTP/2 path; HTTP/1.x writes the same with
/// [`own_headers`] as it writes the head.
pub(crate) fn add_own_headers(own: Option<&ResponseEdits>, headers: &mut http::HeaderMap) {
    for (name, value) in own_headers(own, &|name| headers.contains_key(name)) {
        headers.insert(name.clone(), value.clone());
    }
}

/// The `add-headers` of an answer the proxy makes itself: the request's, expanded when some
/// have variables ([`super::Phased::own_headers`]), else the snapshot's literal ones.
pub(crate) fn own_edits<'a>(
    request: Option<&'a ResponseEdits>,
    global: &'a GlobalSettings,
) -> Option<&'a ResponseEdits> {
    request.or(global.own_response_headers.as_deref())
}

/// The `add-headers` an own answer gets: those whose names `present` says it lacks.
pub(crate) fn own_headers<'g>(
    own: Option<&'g ResponseEdits>,
    present: &dyn Fn(&HeaderName) -> bool,
) -> Vec<(&'g HeaderName, &'g HeaderValue)> {
    own.iter()
        .flat_map(|edits| edits.replace.iter())
        .filter_map(|(n, v)| v.as_ref().map(|v| (n, v)))
        .filter(|(n, _)| !present(n))
        .collect()
}

/// The response edits made for one request (a route's, with its templates expanded), carried
/// from the upstream phase to where HTTP/2 applies them, in the response's extensions.
#[derive(Clone)]
pub(crate) struct RequestEdits(pub(crate) Arc<ResponseEdits>);

/// `edits` with the route's header templates (`add-headers` values with nginx variables)
/// expanded for this request; a value that expands to nothing, or to bytes no header may
/// carry, sets no header.
pub(crate) fn expand(
    edits: Option<Arc<ResponseEdits>>,
    templates: &[(HeaderName, Template)],
    facts: &RequestFacts,
) -> Option<Arc<ResponseEdits>> {
    if templates.is_empty() {
        return edits;
    }
    let mut out = edits.as_deref().cloned().unwrap_or_default();
    for (name, template) in templates {
        let value = facts.expand_header(template);
        out.replace.push((name.clone(), value));
    }
    Some(Arc::new(out))
}

/// The rewrites of the upstream's `Location`, `Refresh` and `Set-Cookie` on a route with
/// `policy` (`proxy-redirect-*`, `proxy-cookie-*`).
pub(crate) fn rewrites(policy: &ResponsePolicy) -> Option<Arc<UpstreamRewrite>> {
    policy.rewrite.clone()
}

/// Rewrites the upstream's headers in `headers` (the HTTP/2 path; HTTP/1.x does it as it
/// writes each header).
pub(crate) fn rewrite_headers(rewrite: &UpstreamRewrite, headers: &mut http::HeaderMap) {
    for (name, value) in headers.iter_mut() {
        if let Some(new) = rewrite
            .rewrite(name.as_str(), value.as_bytes())
            .and_then(|v| HeaderValue::from_bytes(&v).ok())
        {
            *value = new;
        }
    }
}

impl Proxy {
    /// Metrics and the access log line, the same for both HTTP paths.
    pub(crate) fn record(&self, r: &Record<'_>) {
        self.observe(r);
        self.finished(r);
    }

    /// What is said of a request once its response has ended: ingress-nginx's metrics (with
    /// `--metrics-compat`) and the access log line.
    pub(crate) fn finished(&self, r: &Record<'_>) {
        if let Some(compat) = &self.metrics.compat {
            compat.observe(&Observed {
                route: r.route.map(Arc::as_ref),
                status: r.status,
                method: r.method,
                host: r.host,
                elapsed: r.elapsed,
                meter: r.meter,
            });
        }
        self.log(r);
    }

    /// The metrics of a finished request (or, for HTTP/2, of one whose head was sent).
    pub(crate) fn observe(&self, r: &Record<'_>) {
        self.metrics.observe_request(r.route, r.status, r.elapsed);
        if let Some(error) = &r.outcome.error {
            if let UpstreamError::AddressRefused { refusal, .. } = error {
                self.metrics.count_address_refused(*refusal);
            }
            self.metrics.count_upstream_error(error.kind());
            if let UpstreamError::Tls(..) = error {
                // Worth a line even with the access log off: the route's TLS settings or the
                // upstream's certificate need someone's attention.
                tracing::warn!(
                    upstream = %r.outcome.upstream.as_ref().map_or_else(|| "-".to_string(), ToString::to_string),
                    ingress = r.route.map(|r| r.ingress.to_string()).as_deref().unwrap_or("-"),
                    %error,
                    "TLS to the upstream failed"
                );
            }
        }
    }

    /// The access log line of a finished request.
    pub(crate) fn log(&self, r: &Record<'_>) {
        let Some(logged) = r.logged else {
            return;
        };
        let outcome = r.outcome;
        if let Some(lines) = &self.settings.log_lines
            && self.settings.access_format != AccessFormat::Event
        {
            thread_local! {
                // One line's buffer per thread, kept between requests.
                static LINE: RefCell<Vec<u8>> = RefCell::new(Vec::with_capacity(1024));
            }
            let error: Option<&dyn std::fmt::Display> = match (&outcome.error, &outcome.refused) {
                (Some(error), _) => Some(error),
                (None, Some(reason)) => Some(reason),
                (None, None) => None,
            };
            let line = access_log::Line {
                client: r.conn.peer.ip(),
                logged,
                status: r.status,
                elapsed: r.elapsed,
                route: r.route.map(Arc::as_ref),
                meter: r.meter,
                version: r.version,
                upstream: outcome.upstream.as_ref(),
                error,
                now: access_log::wall_clock(r.finished),
            };
            LINE.with_borrow_mut(|buf| {
                buf.clear();
                if self.settings.access_format == AccessFormat::Upstream {
                    access_log::upstream_line(buf, &line);
                } else {
                    access_log::json_line(buf, &line);
                }
                buf.push(b'\n');
                lines.push(buf);
                // A freak line (a huge header) does not keep its memory.
                if buf.capacity() > 64 * 1024 {
                    *buf = Vec::with_capacity(1024);
                }
            });
            return;
        }
        let error = match (&outcome.error, outcome.refused) {
            (Some(error), _) => error.to_string(),
            (None, Some(reason)) => reason.to_string(),
            (None, None) => "-".to_string(),
        };
        let upstream = r.meter.upstream.as_ref();
        let answered = upstream.and_then(|u| u.response);
        tracing::info!(
            target: "access",
            client = %r.conn.peer.ip(),
            method = logged.method(),
            host = logged.host().unwrap_or("-"),
            uri = logged.target(),
            version = ?r.version,
            status = r.status,
            duration_ms = %format_args!("{:.3}", r.elapsed.as_secs_f64() * 1000.0),
            request_bytes = r.meter.request_bytes,
            body_bytes_sent = r.meter.body_bytes_sent,
            upstream = %outcome.upstream.as_ref().map_or_else(|| "-".to_string(), ToString::to_string),
            upstream_status = answered.map_or(0, |a| a.status),
            upstream_header_ms = %format_args!("{:.3}", answered.map_or(0.0, |a| a.header.as_secs_f64() * 1000.0)),
            upstream_response_ms = %format_args!("{:.3}", upstream.map_or(0.0, |u| answered.map_or(u.spent, |a| a.response).as_secs_f64() * 1000.0)),
            upstream_bytes = answered.map_or(0, |a| a.length),
            ingress = r.route.map(|r| r.ingress.to_string()).as_deref().unwrap_or("-"),
            service = r.route.map(|r| r.backend.service.to_string()).as_deref().unwrap_or("-"),
            canary = r.meter.canary,
            request_id = logged.request_id(),
            error = error,
        );
    }
}
