//! The TLS phase, per request: a request on a TLS connection may only name a host the
//! connection's certificate was chosen for (421 Misdirected Request otherwise, RFC 9110
//! section 15.5.20; a browser that coalesced the request onto this connection retries it on a
//! new one). The gate's verdict and the handshake itself happen per connection, in `proxy::tls`.
//!
//! Client certificates (`auth-tls-*`), per request, for a host that has them:
//!
//! ```text
//!   plain HTTP                         the redirect to HTTPS if the route has one, else 400
//!   the connection's SNI chose other   421: the client must open a connection for this host
//!     rules (or none)                  (a Host that differs from the SNI cannot skip them)
//!   then ClientAuth::admit             pass (with ssl-client-* headers upstream), 400 or a
//!                                      302 to auth-tls-error-page, 403 for match-cn
//! ```

use std::sync::Arc;

use http::StatusCode;

use super::Decision;
use super::identity::ConnInfo;
use super::route::Refusal;
use crate::snapshot::annotations::snippet::RequestEdits;
use crate::snapshot::client_auth::{Admission, ClientAuth};
use crate::snapshot::host::HostPattern;
use crate::snapshot::tls::TlsTable;

/// Why a request did not pass its host's client-certificate rules.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum CertRefusal {
    /// The connection's SNI chose other rules (or none): 421.
    Misdirected,
    /// Missing or bad certificate: 400.
    BadRequest,
    /// The same, with `auth-tls-error-page`: 302 there.
    ErrorPage(Arc<str>),
    /// `auth-tls-match-cn`: 403.
    Forbidden,
}

impl CertRefusal {
    pub(crate) fn decision(self) -> Decision {
        match self {
            CertRefusal::Misdirected => Decision::Refuse(Refusal {
                status: StatusCode::MISDIRECTED_REQUEST,
                reason: "the connection was not set up for this host's client certificate rules",
            }),
            CertRefusal::BadRequest => Decision::Respond(StatusCode::BAD_REQUEST),
            CertRefusal::ErrorPage(page) => Decision::Redirect(StatusCode::FOUND, page.to_string()),
            CertRefusal::Forbidden => Decision::Respond(StatusCode::FORBIDDEN),
        }
    }
}

/// What the client-certificate rules of the request's host make of it: `Ok` with the headers
/// for the upstream, or why not.
pub(crate) fn client_certificate(
    auth: &Arc<ClientAuth>,
    conn: &ConnInfo,
) -> Result<Option<Arc<RequestEdits>>, CertRefusal> {
    let Some(cert) = conn
        .client_cert
        .as_ref()
        .filter(|c| Arc::ptr_eq(&c.auth, auth) || *c.auth == **auth)
    else {
        return Err(CertRefusal::Misdirected);
    };
    match auth.admit(&cert.verification, &cert.presented.subject_dn) {
        Admission::Pass => Ok(Some(cert.headers.clone())),
        Admission::Refuse {
            error_page: Some(page),
        } => Err(CertRefusal::ErrorPage(page)),
        Admission::Refuse { error_page: None } => {
            tracing::debug!(peer = %conn.peer, verify = %cert.verification.header_value(), "client certificate refused");
            Err(CertRefusal::BadRequest)
        }
        Admission::Forbidden => {
            tracing::debug!(peer = %conn.peer, subject = %cert.presented.subject_dn, "client certificate does not match auth-tls-match-cn");
            Err(CertRefusal::Forbidden)
        }
    }
}

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
