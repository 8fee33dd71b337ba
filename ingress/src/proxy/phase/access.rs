//! The access phase: whether this client may reach the route's backend at all.
//!
//! In order: an Ingress that asks for an access control this controller cannot honour is not
//! served (503), so a protected path never turns public; then its source ranges (403, as
//! ingress-nginx answers); then its rate limits (503 by default, as `limit_req_status` and
//! `limit_conn_status`). Authentication reads its policy here as it arrives.

use http::StatusCode;

use super::Decision;
use super::identity::ConnInfo;
use crate::proxy::rate_limit::{ConnectionGuard, Limited, RateLimiters};
use crate::proxy::upstream::UpstreamError;
use crate::snapshot::policy::AccessPolicy;

/// `limit-rps`, `limit-rpm`, `limit-connections`, after the checks above: `Err` when the client
/// is over a limit (answered with the limit's status); the guard counts the request toward
/// `limit-connections` until it is dropped.
pub(crate) fn rate_limit(
    policy: &AccessPolicy,
    conn: &ConnInfo,
    limiters: &RateLimiters,
) -> Result<Option<ConnectionGuard>, Limited> {
    let Some(limit) = &policy.rate_limit else {
        return Ok(None);
    };
    limiters.admit(limit, conn.peer.ip()).inspect_err(|limited| {
        tracing::debug!(client = %conn.peer.ip(), zone = %limit.zone, reason = limited.as_str(), "rate limited");
    })
}

/// `Some` decision when the request must not go further.
pub(crate) fn check(policy: &AccessPolicy, conn: &ConnInfo) -> Option<Decision> {
    if let Some(reason) = &policy.refused {
        return Some(Decision::Fail(UpstreamError::Refused(reason.clone())));
    }
    let client = conn.peer.ip();
    if !policy.sources.admits(client) {
        tracing::debug!(%client, "source address outside the route's ranges");
        return Some(Decision::Respond(StatusCode::FORBIDDEN));
    }
    None
}
