//! The upstream phase: which endpoint a forwarded request goes to, and how long it may take.
//!
//! Endpoints are picked by the backend (power of two choices on requests in flight); an
//! ExternalName is resolved, and its address judged, when the connection is made.

use std::sync::Arc;
use std::time::Duration;

use super::{Decision, Forward, RequestHeaders, affinity};
use crate::proxy::pool::PoolKey;
use crate::proxy::upstream::UpstreamError;
use crate::snapshot::Route;
use crate::snapshot::backend::{Backend, Target};

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
    let (key, in_flight) = match &backend.target {
        Target::Endpoints(_) => {
            let picked = match &policy.affinity {
                Some(affinity) => {
                    affinity::pick(backend, affinity, headers, https).map(|(endpoint, cookie)| {
                        set_cookie = cookie;
                        endpoint
                    })
                }
                None => match hash_key {
                    Some(key) => affinity::by_key(backend, key).cloned(),
                    None => backend.pick().cloned(),
                },
            };
            match picked {
                Some(endpoint) => (PoolKey::Addr(endpoint.addr), Some(endpoint.start())),
                None => return Decision::Fail(UpstreamError::NoEndpoints),
            }
        }
        Target::ExternalName(name) => (PoolKey::Name(name.clone()), None),
        Target::Unavailable => return Decision::Fail(UpstreamError::NoEndpoints),
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
