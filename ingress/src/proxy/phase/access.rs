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
//! synchronous phases, in `auth.rs`. Then the rate limits ([`rate_limit`]: 503 by default, as
//! `limit_req_status` and `limit_conn_status`).

use http::StatusCode;

use super::Decision;
use super::identity::ConnInfo;
use crate::proxy::rate_limit::{ConnectionGuard, Limited, RateLimiters};
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::snapshot::annotations::auth::BasicAuth;
    use crate::snapshot::annotations::htpasswd::Credentials;
    use crate::snapshot::policy::AuthPolicy;
    use crate::snapshot::sources::{SourcePolicy, parse_ranges};
    use crate::store::ObjectKey;

    #[derive(Debug, PartialEq)]
    enum Want {
        Pass,
        Forbidden,
        Refused,
        Authenticate,
    }

    #[test]
    fn satisfy_combines_the_ranges_and_authentication_as_nginx() {
        let ranges = |s: &str| parse_ranges(s).expect("ranges");
        let allow = SourcePolicy {
            allow: ranges("10.0.0.0/8"),
            deny: Arc::from([]),
        };
        let deny = SourcePolicy {
            allow: None,
            deny: ranges("10.0.0.1").unwrap_or_else(|| Arc::from([])),
        };
        let basic = Some(Arc::new(BasicAuth {
            realm: Arc::from(""),
            credentials: Credentials::default(),
            secret: ObjectKey::new("ns", "s"),
        }));
        let inside = "10.1.2.3:5000";
        let listed = "10.0.0.1:5000";
        let outside = "192.0.2.1:5000";
        // (sources, auth on, satisfy, client) -> verdict
        let cases = [
            (
                SourcePolicy::default(),
                false,
                Satisfy::All,
                outside,
                Want::Pass,
            ),
            (allow.clone(), false, Satisfy::All, outside, Want::Forbidden),
            (allow.clone(), false, Satisfy::Any, outside, Want::Forbidden),
            (allow.clone(), false, Satisfy::All, inside, Want::Pass),
            (
                SourcePolicy::default(),
                true,
                Satisfy::All,
                outside,
                Want::Authenticate,
            ),
            (
                allow.clone(),
                true,
                Satisfy::All,
                inside,
                Want::Authenticate,
            ),
            (allow.clone(), true, Satisfy::All, outside, Want::Forbidden),
            (allow.clone(), true, Satisfy::Any, inside, Want::Pass),
            (
                allow.clone(),
                true,
                Satisfy::Any,
                outside,
                Want::Authenticate,
            ),
            // No allow-list: nobody is allowed by a rule, so everyone authenticates.
            (
                SourcePolicy::default(),
                true,
                Satisfy::Any,
                inside,
                Want::Authenticate,
            ),
            (deny.clone(), true, Satisfy::Any, inside, Want::Authenticate),
            (deny.clone(), true, Satisfy::Any, listed, Want::Authenticate),
            (deny.clone(), true, Satisfy::All, listed, Want::Forbidden),
        ];
        for (sources, auth, satisfy, client, want) in cases {
            let policy = AccessPolicy {
                refused: None,
                sources: sources.clone(),
                rate_limit: None,
                auth: AuthPolicy {
                    basic: if auth { basic.clone() } else { None },
                    satisfy,
                    ..AuthPolicy::default()
                },
            };
            let conn = ConnInfo::new(client.parse().expect("addr"), 80, false);
            let got = match check(&policy, &conn) {
                Verdict::Pass => Want::Pass,
                Verdict::Authenticate => Want::Authenticate,
                Verdict::Stop(Decision::Respond(StatusCode::FORBIDDEN)) => Want::Forbidden,
                Verdict::Stop(Decision::Fail(_)) => Want::Refused,
                Verdict::Stop(_) => panic!("unexpected stop"),
            };
            assert_eq!(got, want, "{sources:?} auth={auth} {satisfy:?} {client}");
        }
        let refused = AccessPolicy {
            refused: Some(Arc::from("no")),
            ..AccessPolicy::default()
        };
        let conn = ConnInfo::new(inside.parse().expect("addr"), 80, false);
        assert!(matches!(
            check(&refused, &conn),
            Verdict::Stop(Decision::Fail(_))
        ));
    }
}
