//! The route phase, on one snapshot: from a validated host and a normalised target to a route.
//!
//! ```text
//!   routing path (ingress_wire::target) ─ snapshot.route(host, path) ─┐
//!   keep mode, `%2F` in the path: the decoded path must ──────────────┴─ same route, else 400
//!   reach the same route
//! ```
//!
//! What is routed is what is forwarded: the upstream is sent the same normalised target.

use std::sync::Arc;

use http::StatusCode;

use crate::snapshot::{Route, Snapshot};
use ingress_wire::target::Target;

/// A request refused by the proxy before it reaches any route, with the reason the log gives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub status: StatusCode,
    pub reason: &'static str,
}

impl Refusal {
    pub const fn bad_request(reason: &'static str) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            reason,
        }
    }
}

/// The route for a request, `None` for a 404.
pub(crate) fn find<'s>(
    snapshot: &'s Snapshot,
    host: Option<&str>,
    target: &Target<'_>,
) -> Result<Option<&'s Arc<Route>>, Refusal> {
    let route = snapshot.route(host, &target.path);
    if let Some(decoded) = &target.decoded {
        let other = snapshot.route(host, decoded);
        let same = match (route, other) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            (None, None) => true,
            _ => false,
        };
        if !same {
            return Err(Refusal::bad_request(
                "an encoded slash in the path would route the request elsewhere once decoded",
            ));
        }
    }
    Ok(route)
}
