//! The redirect phase: answers made from the route's policy instead of the upstream's.
//!
//! - `app-root` (the host's policy, before routing): a request for exactly `/` gets a 302 to
//!   `$scheme://$http_host<app-root>`, the query dropped, as ingress-nginx's server block does.
//! - plain HTTP on a route that wants HTTPS (`ssl-redirect`, `force-ssl-redirect`) gets a 308 to
//!   the same host and target on the HTTPS port.

use http::StatusCode;
use ingress_wire::target::Target;

use super::Decision;
use super::identity::ConnInfo;
use crate::proxy::Proxy;
use crate::snapshot::policy::{HostPolicy, RedirectPolicy};

/// `Some` redirect when the host's `app-root` applies to the request.
pub(crate) fn app_root(
    policy: &HostPolicy,
    conn: &ConnInfo,
    authority: Option<&str>,
    target: &Target<'_>,
) -> Option<Decision> {
    let root = policy.app_root.as_deref()?;
    if target.path != "/" {
        return None;
    }
    let scheme = if conn.https { "https" } else { "http" };
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
    if conn.https || !policy.to_https {
        return None;
    }
    let host = host?;
    let port = match proxy.settings.https_port {
        443 => String::new(),
        p => format!(":{p}"),
    };
    Some(Decision::Redirect(
        StatusCode::PERMANENT_REDIRECT,
        format!("https://{host}{port}{target}"),
    ))
}
