//! The canary choice: which backend a request on a route with a canary goes to, by the rules
//! of the canary Ingress (`snapshot::annotations::canary`: header, then cookie, then weight).
//!
//! ```text
//!   route.policy.canary ─ none ──────────────────────────────> route.backend
//!        ├─ affinity on the route, sticky canary, and a session cookie naming one of the
//!        │  two backends ─────────────────────────────────────> that backend
//!        └─ rules.choose(header value, cookie value, roll) ─ yes ─> canary.backend
//!                                                           no ──> route.backend
//! ```

use std::sync::Arc;

use super::{RequestHeaders, affinity};
use crate::snapshot::Route;
use crate::snapshot::backend::Backend;

/// The backend for a request on `route`: its own, or its canary's.
pub(crate) fn backend<'r>(route: &'r Route, headers: &dyn RequestHeaders) -> &'r Arc<Backend> {
    let Some(canary) = &route.policy.canary else {
        return &route.backend;
    };
    // ingress-nginx's `affinity-canary-behavior: sticky`: a session stays where it began.
    if let Some(affinity) = route.policy.upstream.affinity.as_deref()
        && canary.sticky
        && let Some(session) = affinity::session_backend(affinity, headers)
    {
        if session == affinity::backend_key(&canary.backend) {
            return &canary.backend;
        }
        if session == affinity::backend_key(&route.backend) {
            return &route.backend;
        }
    }
    let rules = &canary.rules;
    let header = rules
        .header
        .as_deref()
        .and_then(|name| headers.header(name));
    let cookie = rules
        .cookie
        .as_deref()
        .and_then(|name| headers.cookie(name));
    if rules.choose(header, cookie, |total| fastrand::u32(1..=total)) {
        tracing::debug!(canary = %canary.ingress, service = %canary.backend.service, "canary chosen");
        &canary.backend
    } else {
        &route.backend
    }
}

/// The value of cookie `name` among `Cookie` header values, as nginx's `$cookie_NAME` finds
/// it: the first `name=value` pair, pairs separated by `;` (and `,`, which some clients
/// use), spaces around them ignored.
pub(crate) fn find_cookie<'a>(
    values: impl Iterator<Item = &'a [u8]>,
    name: &str,
) -> Option<&'a [u8]> {
    values
        .flat_map(|value| value.split(|&b| b == b';' || b == b','))
        .map(<[u8]>::trim_ascii)
        .find_map(|pair| {
            let eq = pair.iter().position(|&b| b == b'=')?;
            let (key, value) = (&pair[..eq], &pair[eq + 1..]);
            (key == name.as_bytes()).then_some(value)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cookies_as_nginx_finds_them() {
        let cases: &[(&[&str], &str, Option<&str>)] = &[
            (
                &["a=1; CanaryByCookie=always; b=2"],
                "CanaryByCookie",
                Some("always"),
            ),
            (
                &["a=1", "CanaryByCookie=never"],
                "CanaryByCookie",
                Some("never"),
            ),
            (
                &["CanaryByCookie=x; CanaryByCookie=always"],
                "CanaryByCookie",
                Some("x"),
            ),
            (&["canarybycookie=always"], "CanaryByCookie", None),
            (&["XCanaryByCookie=always"], "CanaryByCookie", None),
            (&["CanaryByCookie"], "CanaryByCookie", None),
            (&["CanaryByCookie="], "CanaryByCookie", Some("")),
            (&[], "CanaryByCookie", None),
        ];
        for (values, name, want) in cases {
            let got = find_cookie(values.iter().map(|v| v.as_bytes()), name);
            assert_eq!(got, want.map(str::as_bytes), "{values:?} {name}");
        }
    }
}
