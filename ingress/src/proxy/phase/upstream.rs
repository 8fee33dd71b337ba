//! The upstream phase: which endpoint a forwarded request goes to, how it is spoken to (the
//! route's protocol: TLS or not, HTTP/1.1 or HTTP/2, gRPC errors), and how long it may take.
//!
//! Endpoints are picked by the backend (`load-balance`; by default the less loaded of two
//! random ones); an ExternalName is resolved, and its address judged, when the connection is
//! made. A backend with no endpoint falls back to the route's `default-backend` Service, when
//! it has one.

use std::sync::Arc;
use std::time::Duration;

use super::auth::RequestFacts;
use super::{Decision, Forward, RequestHeaders, affinity};
use crate::proxy::connect::Transport;
use crate::proxy::pool::PoolKey;
use crate::proxy::upstream::UpstreamError;
use crate::snapshot::Route;
use crate::snapshot::annotations::auth::Template;
use crate::snapshot::annotations::snippet::RequestEdits;
use crate::snapshot::backend::{Backend, Endpoint, InFlight, Target};
use crate::snapshot::policy::{Balance, NextUpstream};

/// The timeouts of routes that set none: the flags'.
pub(crate) struct Defaults {
    pub(crate) response: Duration,
    pub(crate) connect: Duration,
    pub(crate) send: Duration,
}

/// The forward for a request on `route` that came over HTTPS or not, or the failure that
/// replaces it. `backend` is the route's, or its canary's (the canary phase chose).
#[allow(clippy::too_many_arguments)]
pub(crate) fn forward(
    route: &Arc<Route>,
    backend: &Backend,
    headers: &dyn RequestHeaders,
    https: bool,
    defaults: &Defaults,
    forwarded_prefix: Option<Arc<str>>,
    hash_key: Option<&[u8]>,
) -> Decision {
    let policy = &route.policy.upstream;
    let ewma = policy.balance == Balance::Ewma;
    let mut set_cookie = None;
    let mut pick = |backend: &Backend| -> Option<(PoolKey, Option<InFlight>)> {
        match &backend.target {
            Target::Endpoints(_) => {
                let picked = match &policy.affinity {
                    Some(affinity) => affinity::pick(backend, affinity, headers, https).map(
                        |(endpoint, cookie)| {
                            set_cookie = cookie;
                            endpoint
                        },
                    ),
                    None => match hash_key {
                        Some(key) => affinity::by_key(backend, key).cloned(),
                        None => backend.pick(policy.balance).cloned(),
                    },
                };
                picked.map(|endpoint| (PoolKey::Addr(endpoint.addr), Some(endpoint.start(ewma))))
            }
            Target::ExternalName(name) => Some((PoolKey::Name(name.clone()), None)),
            Target::Unavailable => None,
        }
    };
    // `default-backend`: the route's backend without an endpoint falls back to it.
    let picked = pick(backend).or_else(|| {
        let fallback = policy.fallback.as_ref()?;
        pick(&fallback.0)
    });
    let Some((key, in_flight)) = picked else {
        return Decision::Fail(UpstreamError::NoEndpoints);
    };
    let transport = if policy.protocol.tls(https) {
        Transport::Tls(policy.tls.clone())
    } else {
        Transport::Plain
    };
    Decision::Forward(Forward {
        key,
        transport,
        wire: policy.protocol.wire(),
        in_flight,
        timeout: policy.read_timeout.unwrap_or(defaults.response),
        connect_timeout: policy.connect_timeout.unwrap_or(defaults.connect),
        send_timeout: policy.send_timeout.unwrap_or(defaults.send),
        vhost: policy.vhost.clone(),
        next_upstream: policy.next_upstream,
        upgrades: policy.upgrades.clone(),
        forwarded_prefix,
        set_cookie,
        set_headers: Vec::new(),
        max_body: policy.max_body,
        request_headers: policy.request_headers.clone(),
        response_headers: None,
        response_rewrite: None,
        canary: false,
        underscores: false,
        auth: None,
        limit_guard: None,
        bandwidth: route.policy.response.bandwidth,
    })
}

/// Another endpoint for a failed request (`proxy-next-upstream`): the balancer's choice if it
/// was not tried yet, else the first endpoint not tried; `None` when every one was.
pub(crate) fn next_endpoint(route: &Route, tried: &[PoolKey]) -> Option<(PoolKey, InFlight)> {
    let Target::Endpoints(endpoints) = &route.backend.target else {
        return None;
    };
    let balance = route.policy.upstream.balance;
    let untried = |e: &&Arc<Endpoint>| !tried.contains(&PoolKey::Addr(e.addr));
    let endpoint = route
        .backend
        .pick(balance)
        .filter(untried)
        .or_else(|| endpoints.iter().find(untried))?;
    Some((
        PoolKey::Addr(endpoint.addr),
        endpoint.start(balance == Balance::Ewma),
    ))
}

/// The endpoint for the next attempt of a request on `route` that began at `started`, after
/// `error` on the endpoints `tried`, if `next` allows one (`proxy-next-upstream`).
pub(crate) fn retry(
    route: Option<&Arc<Route>>,
    next: &NextUpstream,
    tried: &[PoolKey],
    started: std::time::Instant,
    error: &UpstreamError,
) -> Option<(PoolKey, InFlight)> {
    let attempts = u32::try_from(tried.len()).unwrap_or(u32::MAX);
    let in_time = next.within.is_none_or(|w| started.elapsed() < w);
    if !in_time || !next.allows_another(attempts) || !retries_on(next, error) {
        return None;
    }
    next_endpoint(route?, tried)
}

/// Whether `error` failed before anything of the request reached the upstream (no connection
/// could be made), so that even a request that must not be repeated can go elsewhere.
pub(crate) fn nothing_sent(error: &UpstreamError) -> bool {
    matches!(
        error,
        UpstreamError::Connect(_) | UpstreamError::ConnectTimeout | UpstreamError::Tls(..)
    )
}

/// Whether `error`, on an attempt that sent the client nothing, is one `next` retries on:
/// `error` for a connection that failed or broke before a response head, `timeout` for a
/// connect or response-head timeout.
pub(crate) fn retries_on(next: &NextUpstream, error: &UpstreamError) -> bool {
    match error {
        UpstreamError::Connect(_) | UpstreamError::Protocol(_) | UpstreamError::Tls(..) => {
            next.error
        }
        UpstreamError::ConnectTimeout | UpstreamError::ResponseTimeout(_) => next.timeout,
        UpstreamError::NoEndpoints
        | UpstreamError::AddressRefused { .. }
        | UpstreamError::Refused(_) => false,
    }
}

/// `edits` with the route's request header templates (`proxy-set-headers` values with nginx
/// variables) expanded for this request; a value that expands to nothing, or to bytes no
/// header may carry, removes the header (nginx sends none for an empty value).
pub(crate) fn expand(
    edits: Option<Arc<RequestEdits>>,
    templates: &[(http::HeaderName, Template)],
    facts: &RequestFacts,
) -> Option<Arc<RequestEdits>> {
    if templates.is_empty() {
        return edits;
    }
    let mut out = edits.as_deref().cloned().unwrap_or_default();
    for (name, template) in templates {
        let value = facts.expand_header(template);
        out.set.push((name.clone(), value));
    }
    Some(Arc::new(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn which_errors_are_retried() {
        let both = NextUpstream::default();
        let error_only = NextUpstream {
            timeout: false,
            ..both
        };
        let cases = [
            (UpstreamError::Connect("refused".into()), true, true),
            (UpstreamError::Protocol("closed".into()), true, true),
            (UpstreamError::ConnectTimeout, true, false),
            (
                UpstreamError::ResponseTimeout(Duration::from_secs(1)),
                true,
                false,
            ),
            (UpstreamError::NoEndpoints, false, false),
        ];
        for (error, with_both, with_error_only) in cases {
            assert_eq!(retries_on(&both, &error), with_both, "{error}");
            assert_eq!(retries_on(&error_only, &error), with_error_only, "{error}");
        }
    }
}
