//! The route phase, shared by the HTTP/1.1 and HTTP/2 paths: from a validated authority and a
//! normalised target to a route, on one snapshot.
//!
//! ```text
//!   TLS connection and the host was not what its certificate was chosen for ─> 421
//!   routing path (target.rs) ─ snapshot.route(host, path) ─┐
//!   keep mode, `%2F` in the path: the decoded path must ───┴─ same route, else 400
//!   reach the same route
//! ```

use std::sync::Arc;

use http::StatusCode;

use super::authority;
use super::{ConnInfo, Proxy};
use crate::snapshot::Route;
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

impl Proxy {
    /// The route for a request, from the snapshot current when it arrives.
    pub(crate) fn route(
        &self,
        conn: &ConnInfo,
        host: Option<&str>,
        target: &Target<'_>,
    ) -> Result<Option<Arc<Route>>, Refusal> {
        let snapshot = self.published.load();
        if conn.https
            && let Some(host) = host
            && authority::misdirected(
                &snapshot.tls,
                conn.sni.as_deref(),
                host,
                self.settings.no_sni_requests,
            )
        {
            return Err(Refusal {
                status: StatusCode::MISDIRECTED_REQUEST,
                reason: "the host is not served by this connection's certificate",
            });
        }
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
        Ok(route.cloned())
    }
}
