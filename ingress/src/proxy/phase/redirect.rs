//! The redirect phase: answers made from the route's policy instead of the upstream's.
//!
//! Today: plain HTTP on a route that wants HTTPS (`ssl-redirect`, `force-ssl-redirect`) gets a
//! 308 to the same host and target on the HTTPS port.

use super::Decision;
use super::identity::ConnInfo;
use crate::proxy::Proxy;
use crate::snapshot::policy::RedirectPolicy;

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
    Some(Decision::Redirect(format!("https://{host}{port}{target}")))
}
