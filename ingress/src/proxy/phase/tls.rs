//! The TLS phase, per request: a request on a TLS connection may only name a host the
//! connection's certificate was chosen for (421 Misdirected Request otherwise, RFC 9110
//! section 15.5.20; a browser that coalesced the request onto this connection retries it on a
//! new one). The gate's verdict and the handshake itself happen per connection, in `proxy::tls`.

use http::StatusCode;

use super::identity::ConnInfo;
use super::route::Refusal;
use crate::snapshot::host::HostPattern;
use crate::snapshot::tls::TlsTable;

/// A TLS connection that sent no SNI.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum NoSniRequests {
    /// Its requests may only name hosts served with the default certificate (others get 421).
    #[default]
    DefaultCertificate,
    /// Its requests are routed by Host alone, as ingress-nginx does.
    Any,
}

/// Refuses a request on a TLS connection that names a host its certificate was not chosen for.
pub(crate) fn check(
    tls: &TlsTable,
    conn: &ConnInfo,
    host: Option<&str>,
    no_sni: NoSniRequests,
) -> Result<(), Refusal> {
    match host {
        Some(host) if conn.https && misdirected(tls, conn.sni.as_deref(), host, no_sni) => {
            Err(Refusal {
                status: StatusCode::MISDIRECTED_REQUEST,
                reason: "the host is not served by this connection's certificate",
            })
        }
        _ => Ok(()),
    }
}

/// Whether a request on a TLS connection names a host its certificate was not chosen for.
///
/// Allowed: the host is the SNI itself; the certificate the SNI selected covers the host by its
/// names; or both select the same certificate. Without SNI the connection was served the default
/// certificate, and `no_sni` decides.
pub fn misdirected(tls: &TlsTable, sni: Option<&str>, host: &str, no_sni: NoSniRequests) -> bool {
    if sni.is_some_and(|sni| sni.eq_ignore_ascii_case(host)) {
        return false;
    }
    if sni.is_none() && no_sni == NoSniRequests::Any {
        return false;
    }
    let chosen = tls.resolve(sni);
    let for_host = tls.resolve(Some(host));
    match (chosen, for_host) {
        (Some(a), Some(b)) if std::sync::Arc::ptr_eq(a, b) => false,
        (Some(cert), _) => !cert.covers(&HostPattern::Exact(host.to_string())),
        // No certificate at all (nothing synced yet): nothing to disagree with.
        (None, _) => false,
    }
}
