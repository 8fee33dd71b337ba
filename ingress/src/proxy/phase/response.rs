//! The response phase: what every response gets from the proxy (its `Server`, and HSTS on
//! HTTPS), and what every finished request leaves behind (metrics, the access log line).

use std::sync::Arc;

use http::HeaderValue;

use super::Record;
use crate::proxy::Proxy;
use crate::proxy::upstream::UpstreamError;
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
}
