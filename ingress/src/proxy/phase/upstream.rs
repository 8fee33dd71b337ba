//! The upstream phase: which endpoint a forwarded request goes to, and how long it may take.
//!
//! Endpoints are picked by the backend (power of two choices on requests in flight); an
//! ExternalName is resolved, and its address judged, when the connection is made. A backend
//! with no endpoint falls back to the route's `default-backend` Service, when it has one.

use std::sync::Arc;
use std::time::Duration;

use super::{Decision, Forward, RequestHeaders, affinity};
use crate::proxy::pool::PoolKey;
use crate::proxy::upstream::UpstreamError;
use crate::snapshot::Route;
use crate::snapshot::backend::{Backend, InFlight, Target};

/// The forward for a request on `route`, or the failure that replaces it.
/// `backend` is the route's, or its canary's (the canary phase chose).
pub(crate) fn forward(
    route: &Arc<Route>,
    backend: &Backend,
    headers: &dyn RequestHeaders,
    https: bool,
    default_timeout: Duration,
    forwarded_prefix: Option<Arc<str>>,
    hash_key: Option<&[u8]>,
) -> Decision {
    let policy = &route.policy.upstream;
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
                        None => backend.pick().cloned(),
                    },
                };
                picked.map(|endpoint| (PoolKey::Addr(endpoint.addr), Some(endpoint.start())))
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
    Decision::Forward(Forward {
        key,
        in_flight,
        timeout: policy.read_timeout.unwrap_or(default_timeout),
        upgrades: policy.upgrades.clone(),
        forwarded_prefix,
        set_cookie,
        set_headers: Vec::new(),
        max_body: policy.max_body,
        request_headers: policy.request_headers.clone(),
        response_headers: None,
        response_rewrite: None,
    })
}
