//! The access phase: whether this client may reach the route's backend at all.
//!
//! Today one rule: an Ingress that asks for an access control this controller cannot honour is
//! not served (503), so a protected path never turns public. Allow-lists, authentication and
//! rate limits read their policy here as they arrive.

use super::Decision;
use crate::proxy::upstream::UpstreamError;
use crate::snapshot::policy::AccessPolicy;

/// `Some` decision when the request must not go further.
pub(crate) fn check(policy: &AccessPolicy) -> Option<Decision> {
    policy
        .refused
        .as_ref()
        .map(|reason| Decision::Fail(UpstreamError::Refused(reason.clone())))
}
