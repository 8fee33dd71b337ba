//! Host ↔ certificate agreement on TLS connections: a request may only name a host the
//! connection's certificate was chosen for (421 otherwise). Parsing the authority itself is
//! `ingress_wire::authority`'s.

pub use ingress_wire::authority::{Authority, AuthorityError, of_h2, parse};

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

/// Whether a request on a TLS connection names a host its certificate was not chosen for, so
/// it must be answered `421 Misdirected Request` (RFC 9110 section 15.5.20). A browser that
/// coalesced the request onto this connection retries it on a new one.
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
