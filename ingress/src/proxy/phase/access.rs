//! The access phase: whether this client may reach the route's backend at all.
//!
//! In order: an Ingress that asks for an access control this controller cannot honour is not
//! served (503), so a protected path never turns public; then its source ranges (403, as
//! ingress-nginx answers). Authentication and rate limits read their policy here as they
//! arrive.

use http::StatusCode;

use super::Decision;
use super::identity::ConnInfo;
use crate::proxy::upstream::UpstreamError;
use crate::snapshot::policy::AccessPolicy;

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
