//! The upstream phase: which endpoint a forwarded request goes to, how it is spoken to (the
//! route's protocol: TLS or not, HTTP/1.1 or HTTP/2, gRPC errors), and how long it may take.
//!
//! Endpoints are picked by the backend (`load-balance`; by default the less loaded of two
//! random ones); an
//! ExternalName is resolved, and its address judged, when the connection is made.

use std::sync::Arc;
use std::time::Duration;

use super::{Decision, Forward};
use crate::proxy::connect::Transport;
use crate::proxy::pool::PoolKey;
use crate::proxy::upstream::UpstreamError;
use crate::snapshot::Route;
use crate::snapshot::backend::Target;
use crate::snapshot::policy::Balance;

/// The timeouts of routes that set none: the flags'.
pub(crate) struct Defaults {
    pub(crate) response: Duration,
    pub(crate) connect: Duration,
    pub(crate) send: Duration,
}

/// The forward for a request on `route` that came over HTTPS or not, or the failure that
/// replaces it.
pub(crate) fn forward(route: &Arc<Route>, https: bool, defaults: &Defaults) -> Decision {
    let policy = &route.policy.upstream;
    let (key, in_flight) = match &route.backend.target {
        Target::Endpoints(_) => match route.backend.pick(policy.balance) {
            Some(endpoint) => (
                PoolKey::Addr(endpoint.addr),
                Some(endpoint.start(policy.balance == Balance::Ewma)),
            ),
            None => return Decision::Fail(UpstreamError::NoEndpoints),
        },
        Target::ExternalName(name) => (PoolKey::Name(name.clone()), None),
        Target::Unavailable => return Decision::Fail(UpstreamError::NoEndpoints),
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
        upgrades: policy.upgrades.clone(),
    })
}
