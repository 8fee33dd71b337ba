//! The redirect phase: answers made from the route's policy instead of the upstream's.
//!
//! Before routing, from the host's policy (ingress-nginx's server blocks):
//! - `from-to-www-redirect`: a host made only to redirect gets a 308 to
//!   `<scheme>://<to>:<port><target>`, one trailing `/` removed (ingress-nginx's
//!   `ngx_srv_redirect.lua`); the port is the one the request came in on.
//! - `app-root`: a request for exactly `/` gets a 302 to `<scheme>://<Host as sent><app-root>`,
//!   the query dropped.
//!
//! After routing, from the route's policy (its location):
//! - `temporal-redirect` / `permanent-redirect`: the annotation's code and URL, as is.
//! - plain HTTP on a route that wants HTTPS (`ssl-redirect`, `force-ssl-redirect`): 308 to
//!   `https://<host><target>`, one trailing `/` removed unless `preserve-trailing-slash`
//!   (ingress-nginx's `lua_ingress.lua`); `:<port>` is added when the HTTPS port is not 443.

use http::StatusCode;
use ingress_wire::target::Target;

use super::Decision;
use super::identity::ConnInfo;
use crate::proxy::Proxy;
use crate::snapshot::policy::{HostPolicy, RedirectPolicy};

/// `Some` redirect when the host's policy answers the request before routing: `raw_target`
/// as the client sent it, `target` normalised.
pub(crate) fn host(
    policy: &HostPolicy,
    conn: &ConnInfo,
    authority: Option<&str>,
    raw_target: &str,
    target: &Target<'_>,
) -> Option<Decision> {
    let scheme = if conn.https { "https" } else { "http" };
    if let Some(to) = policy.www_redirect.as_deref() {
        let uri = raw_target.strip_suffix('/').unwrap_or(raw_target);
        return Some(Decision::Redirect(
            StatusCode::PERMANENT_REDIRECT,
            format!("{scheme}://{to}:{}{uri}", conn.local_port),
        ));
    }
    let root = policy.app_root.as_deref()?;
    if target.path != "/" {
        return None;
    }
    let authority = authority?;
    Some(Decision::Redirect(
        StatusCode::FOUND,
        format!("{scheme}://{authority}{root}"),
    ))
}

/// `Some` redirect when the request is answered with one.
pub(crate) fn check(
    policy: &RedirectPolicy,
    conn: &ConnInfo,
    host: Option<&str>,
    target: &str,
    proxy: &Proxy,
) -> Option<Decision> {
    if let Some(redirect) = &policy.to_url {
        let code = StatusCode::from_u16(redirect.code).unwrap_or(StatusCode::MOVED_PERMANENTLY);
        return Some(Decision::Redirect(code, redirect.url.to_string()));
    }
    // The scheme the client used: the connection's, or the one a trusted proxy names in
    // X-Forwarded-Proto (so TLS ended at a balancer in front does not redirect forever).
    if conn.client.https || !policy.to_https {
        return None;
    }
    let host = host?;
    let target = if policy.preserve_trailing_slash {
        target
    } else {
        target.strip_suffix('/').unwrap_or(target)
    };
    let port = match proxy.settings.https_port {
        443 => String::new(),
        p => format!(":{p}"),
    };
    Some(Decision::Redirect(
        StatusCode::PERMANENT_REDIRECT,
        format!("https://{host}{port}{target}"),
    ))
}
