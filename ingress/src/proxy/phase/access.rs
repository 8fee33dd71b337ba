//! The access phase: whether this client may reach the route's backend at all.
//!
//! In order: an Ingress that asks for an access control this controller cannot honour is not
//! served (503), so a protected path never turns public; then its source ranges (403, as
//! ingress-nginx answers) and whether it must authenticate, combined by `satisfy`:
//!
//! ```text
//!   satisfy all (default)   outside the ranges ─> 403; inside ─> authenticate (if any)
//!   satisfy any             explicitly allowed (in the allow-list, not denied) ─> in, no auth
//!                           otherwise, with authentication ─> authenticate (its answer stands)
//!                           otherwise ─> the ranges decide (403)
//! ```
//!
//! The authentication itself may wait (bcrypt, an auth service), so it runs after the
//! synchronous phases, in `auth.rs`. Rate limits read their policy here as they arrive.

use http::StatusCode;

use super::Decision;
use super::identity::ConnInfo;
use crate::proxy::upstream::UpstreamError;
use crate::snapshot::annotations::auth::Satisfy;
use crate::snapshot::policy::AccessPolicy;

/// What the access phase makes of a request.
#[expect(
    clippy::large_enum_variant,
    reason = "made and matched once per request, never stored: boxing would allocate per refusal"
)]
pub(crate) enum Verdict {
    /// Nothing stops it here.
    Pass,
    /// It must not go further: this is the answer.
    Stop(Decision),
    /// It may go on once it has authenticated (`auth.rs`).
    Authenticate,
}

pub(crate) fn check(policy: &AccessPolicy, conn: &ConnInfo) -> Verdict {
    if let Some(reason) = &policy.refused {
        return Verdict::Stop(Decision::Fail(UpstreamError::Refused(reason.clone())));
    }
    let client = conn.peer.ip();
    let admitted = policy.sources.admits(client);
    let auth = policy.auth.is_on();
    match policy.auth.satisfy {
        // nginx's `satisfy any`: only an `allow` rule that matches counts as passing; a
        // client no rule names (no allow-list) must authenticate.
        Satisfy::Any if auth && admitted && policy.sources.allow.is_some() => Verdict::Pass,
        Satisfy::Any if auth => Verdict::Authenticate,
        _ if !admitted => {
            tracing::debug!(%client, "source address outside the route's ranges");
            Verdict::Stop(Decision::Respond(StatusCode::FORBIDDEN))
        }
        _ if auth => Verdict::Authenticate,
        _ => Verdict::Pass,
    }
}
