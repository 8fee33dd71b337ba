//! The upstream phase: which endpoint a forwarded request goes to, how it is spoken to (the
//! route's protocol: TLS or not, HTTP/1.1 or HTTP/2, gRPC errors), and how long it may take.
//!
//! Endpoints are picked by the backend (power of two choices on requests in flight); an
//! ExternalName is resolved, and its address judged, when the connection is made.

use std::sync::Arc;
use std::time::Duration;

use super::{Decision, Forward};
use crate::proxy::connect::Transport;
use crate::proxy::pool::PoolKey;
use crate::proxy::upstream::UpstreamError;
use crate::snapshot::Route;
use crate::snapshot::backend::Target;

/// The forward for a request on `route` that came over HTTPS or not, or the failure that
/// replaces it.
pub(crate) fn forward(route: &Arc<Route>, https: bool, default_timeout: Duration) -> Decision {
    let (key, in_flight) = match &route.backend.target {
        Target::Endpoints(_) => match route.backend.pick() {
            Some(endpoint) => (PoolKey::Addr(endpoint.addr), Some(endpoint.start())),
            None => return Decision::Fail(UpstreamError::NoEndpoints),
        },
        Target::ExternalName(name) => (PoolKey::Name(name.clone()), None),
        Target::Unavailable => return Decision::Fail(UpstreamError::NoEndpoints),
    };
    let policy = &route.policy.upstream;
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
        timeout: policy.read_timeout.unwrap_or(default_timeout),
        upgrades: policy.upgrades.clone(),
    })
}
