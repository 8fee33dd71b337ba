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

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::ByteString;
    use k8s_openapi::api::core::v1::Secret;

    use super::*;
    use crate::proxy::phase::identity::ClientCert;
    use crate::snapshot::annotations::auth_tls::{AuthTls, VerifyClient};
    use crate::snapshot::client_auth::{PresentedCert, Verification};
    use crate::store::ObjectKey;

    fn auth(error_page: Option<&str>, match_cn: Option<&str>) -> Arc<ClientAuth> {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca = params.self_signed(&key).unwrap().pem();
        let secret = Secret {
            data: Some(BTreeMap::from([(
                "ca.crt".to_string(),
                ByteString(ca.into_bytes()),
            )])),
            ..Default::default()
        };
        let options = AuthTls {
            secret: (None, "ca".into()),
            verify: VerifyClient::On,
            depth: 1,
            error_page: error_page.map(str::to_string),
            pass_certificate: true,
            match_cn: match_cn.map(|r| regex::Regex::new(r).unwrap()),
        };
        Arc::new(ClientAuth::from_secret(&ObjectKey::new("t", "ca"), &secret, &options).unwrap())
    }

    fn conn(cert: Option<ClientCert>) -> ConnInfo {
        let mut conn = ConnInfo::new("192.0.2.1:5000".parse().unwrap(), 443, true);
        conn.client_cert = cert.map(Arc::new);
        conn
    }

    fn presented(subject: &str) -> PresentedCert {
        PresentedCert {
            subject_dn: subject.into(),
            issuer_dn: "CN=ca".into(),
            escaped_pem: "-----BEGIN%20CERTIFICATE-----%0A".into(),
        }
    }

    #[test]
    fn what_a_request_gets() {
        let strict = auth(None, None);
        let paged = auth(Some("https://login.example.com/cert"), None);
        let cn = auth(None, Some("CN=alice"));
        let failed = Verification::Failed {
            reason: "certificate has expired",
            unknown_issuer: false,
        };
        let ok = |a: &Arc<ClientAuth>, subject| {
            ClientCert::new(a.clone(), Verification::Success, presented(subject))
        };
        let cases: Vec<(&Arc<ClientAuth>, ConnInfo, Result<(), CertRefusal>)> = vec![
            (&strict, conn(Some(ok(&strict, "CN=bob"))), Ok(())),
            // A connection set up for other rules (or none) cannot carry the request.
            (&strict, conn(None), Err(CertRefusal::Misdirected)),
            (
                &strict,
                conn(Some(ok(&paged, "CN=bob"))),
                Err(CertRefusal::Misdirected),
            ),
            (
                &strict,
                conn(Some(ClientCert::new(
                    strict.clone(),
                    failed.clone(),
                    presented("CN=bob"),
                ))),
                Err(CertRefusal::BadRequest),
            ),
            (
                &strict,
                conn(Some(ClientCert::new(
                    strict.clone(),
                    Verification::None,
                    PresentedCert::default(),
                ))),
                Err(CertRefusal::BadRequest),
            ),
            (
                &paged,
                conn(Some(ClientCert::new(
                    paged.clone(),
                    failed,
                    presented("CN=bob"),
                ))),
                Err(CertRefusal::ErrorPage(
                    "https://login.example.com/cert".into(),
                )),
            ),
            (&cn, conn(Some(ok(&cn, "CN=alice"))), Ok(())),
            (
                &cn,
                conn(Some(ok(&cn, "CN=bob"))),
                Err(CertRefusal::Forbidden),
            ),
        ];
        for (i, (auth, conn, want)) in cases.into_iter().enumerate() {
            let got = client_certificate(auth, &conn).map(|_| ());
            assert_eq!(got, want, "case {i}");
        }
        // The headers upstream, made once per connection; empty values are not sent.
        let cert = ClientCert::new(strict.clone(), Verification::None, PresentedCert::default());
        let set: Vec<(String, Option<String>)> = cert
            .headers
            .set
            .iter()
            .map(|(n, v)| {
                (
                    n.to_string(),
                    v.as_ref().map(|v| v.to_str().unwrap().to_string()),
                )
            })
            .collect();
        assert_eq!(
            set,
            [
                ("ssl-client-verify".to_string(), Some("NONE".to_string())),
                ("ssl-client-subject-dn".to_string(), None),
                ("ssl-client-issuer-dn".to_string(), None),
                ("ssl-client-cert".to_string(), None),
            ]
        );
    }
}
