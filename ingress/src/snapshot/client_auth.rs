//! Client certificates (`auth-tls-*`): the CA Secret parsed into a typed verifier, the
//! verification of a presented chain, and what a request may do with the outcome, with nginx's
//! semantics. Pure: the build parses the Secret, and the proxy passes the time in.
//!
//! ```text
//!   handshake (proxy::tls)   the host's ClientAuth chosen by SNI: a CertificateRequest naming
//!                            its CAs (unless verify-client is off); the handshake completes
//!                            whatever the client sends, as nginx's does
//!   after it                 ClientAuth::verify(chain, now) → Verification, once per connection
//!   per request (phase/tls)  ClientAuth::admit(verification, subject DN):
//!     on              SUCCESS → pass;  NONE / FAILED → 400 (or 302 to auth-tls-error-page)
//!     optional        SUCCESS / NONE → pass;  FAILED → 400 (or 302)
//!     optional_no_ca  as optional, and FAILED because the issuer is unknown → pass
//!     off             nothing asked, NONE → pass
//!     then match-cn   the subject DN must match the regex, else 403
//! ```

use std::sync::Arc;

use k8s_openapi::api::core::v1::Secret;
use rustls::DistinguishedName;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, CertificateRevocationListDer, TrustAnchor, UnixTime};
use webpki::{CertRevocationList, OwnedCertRevocationList};

use super::annotations::auth_tls::{AuthTls, VerifyClient};
use super::certs;
use crate::store::ObjectKey;

/// The keys ingress-nginx reads from an `auth-tls-secret`.
pub const CA_CRT: &str = "ca.crt";
pub const CA_CRL: &str = "ca.crl";

/// A host's client-certificate rules, with the CA bundle (and CRLs) parsed.
#[derive(Debug)]
pub struct ClientAuth {
    pub secret: ObjectKey,
    pub verify: VerifyClient,
    /// `auth-tls-verify-depth`: at most `depth - 1` intermediates between the client's
    /// certificate and a CA of the bundle (1: issued by one of the CAs directly).
    pub depth: u32,
    pub error_page: Option<Arc<str>>,
    pub pass_certificate: bool,
    pub match_cn: Option<regex::Regex>,
    /// The CA names sent in the CertificateRequest, so a client can pick its certificate.
    pub subjects: Vec<DistinguishedName>,
    cas: Vec<CertificateDer<'static>>,
    anchors: Vec<TrustAnchor<'static>>,
    crl_der: Vec<Vec<u8>>,
    crls: Vec<CertRevocationList<'static>>,
}

impl PartialEq for ClientAuth {
    fn eq(&self, other: &Self) -> bool {
        std::ptr::eq(self, other)
            || (self.secret == other.secret
                && self.verify == other.verify
                && self.depth == other.depth
                && self.error_page == other.error_page
                && self.pass_certificate == other.pass_certificate
                && self.match_cn.as_ref().map(regex::Regex::as_str)
                    == other.match_cn.as_ref().map(regex::Regex::as_str)
                && self.cas == other.cas
                && self.crl_der == other.crl_der)
    }
}

impl Eq for ClientAuth {}

#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum ClientAuthError {
    #[error("secret has no {0:?} key")]
    MissingField(&'static str),
    #[error("{field}: {reason}")]
    Pem { field: &'static str, reason: String },
    #[error("{0} holds no certificate")]
    NoCertificate(&'static str),
    #[error("ca.crt: a certificate is not usable as a CA: {0}")]
    BadCa(String),
    #[error("ca.crl: {0}")]
    BadCrl(String),
}

/// What verifying a client's certificate found, as nginx's `$ssl_client_verify` says it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verification {
    Success,
    /// No certificate was sent (or none was asked for).
    None,
    /// `reason` as OpenSSL words it; `unknown_issuer` for the one failure `optional_no_ca`
    /// accepts.
    Failed {
        reason: &'static str,
        unknown_issuer: bool,
    },
}

impl Verification {
    /// `ssl-client-verify`'s value.
    pub fn header_value(&self) -> String {
        match self {
            Verification::Success => "SUCCESS".into(),
            Verification::None => "NONE".into(),
            Verification::Failed { reason, .. } => format!("FAILED:{reason}"),
        }
    }
}

/// What a request gets from the client-certificate rules.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Admission {
    Pass,
    /// nginx's 495/496, answered 400; or a 302 to `auth-tls-error-page`.
    Refuse {
        error_page: Option<Arc<str>>,
    },
    /// `auth-tls-match-cn` does not match: 403.
    Forbidden,
}

impl ClientAuth {
    /// Parses the Secret `auth-tls-secret` names, with the options of the annotations.
    pub fn from_secret(
        key: &ObjectKey,
        secret: &Secret,
        options: &AuthTls,
    ) -> Result<ClientAuth, ClientAuthError> {
        let data = secret.data.as_ref();
        let field = |name: &'static str| data.and_then(|d| d.get(name)).map(|b| b.0.as_slice());
        let crt = field(CA_CRT).ok_or(ClientAuthError::MissingField(CA_CRT))?;
        let cas: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(crt)
            .collect::<Result<_, _>>()
            .map_err(|e| ClientAuthError::Pem {
                field: CA_CRT,
                reason: e.to_string(),
            })?;
        if cas.is_empty() {
            return Err(ClientAuthError::NoCertificate(CA_CRT));
        }
        let anchors = cas
            .iter()
            .map(|der| {
                webpki::anchor_from_trusted_cert(der)
                    .map(|a| a.to_owned())
                    .map_err(|e| ClientAuthError::BadCa(format!("{e:?}")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let subjects = anchors
            .iter()
            .map(|a| DistinguishedName::in_sequence(a.subject.as_ref()))
            .collect();
        let mut crl_der = Vec::new();
        let mut crls = Vec::new();
        if let Some(pem) = field(CA_CRL) {
            let ders: Vec<CertificateRevocationListDer<'static>> =
                CertificateRevocationListDer::pem_slice_iter(pem)
                    .collect::<Result<_, _>>()
                    .map_err(|e| ClientAuthError::Pem {
                        field: CA_CRL,
                        reason: e.to_string(),
                    })?;
            if ders.is_empty() && !pem.trim_ascii().is_empty() {
                return Err(ClientAuthError::BadCrl("holds no X509 CRL block".into()));
            }
            for der in ders {
                let crl = OwnedCertRevocationList::from_der(der.as_ref())
                    .map_err(|e| ClientAuthError::BadCrl(format!("{e:?}")))?;
                crl_der.push(der.as_ref().to_vec());
                crls.push(CertRevocationList::from(crl));
            }
        }
        Ok(ClientAuth {
            secret: key.clone(),
            verify: options.verify,
            depth: options.depth,
            error_page: options.error_page.as_deref().map(Arc::from),
            pass_certificate: options.pass_certificate,
            match_cn: options.match_cn.clone(),
            subjects,
            cas,
            anchors,
            crl_der,
            crls,
        })
    }

    /// Whether the handshake asks for a certificate.
    pub fn requests_certificate(&self) -> bool {
        self.verify != VerifyClient::Off
    }

    /// Verifies a client's chain (leaf first) for client authentication at `now`, against the
    /// CAs, the CRLs (every certificate of the chain must have a current CRL from its issuer
    /// when any CRL is given, as nginx's `ssl_crl` checks the whole chain) and the depth.
    pub fn verify(&self, chain: &[CertificateDer<'_>], now: UnixTime) -> Verification {
        let Some((leaf, intermediates)) = chain.split_first() else {
            return Verification::None;
        };
        let failed = |reason| Verification::Failed {
            reason,
            unknown_issuer: false,
        };
        let Ok(cert) = webpki::EndEntityCert::try_from(leaf) else {
            return failed("unable to decode the certificate");
        };
        let crl_refs: Vec<&CertRevocationList<'_>> = self.crls.iter().collect();
        let revocation = webpki::RevocationOptionsBuilder::new(&crl_refs)
            .ok()
            .map(|b| {
                b.with_depth(webpki::RevocationCheckDepth::Chain)
                    .with_status_policy(webpki::UnknownStatusPolicy::Deny)
                    .with_expiration_policy(webpki::ExpirationPolicy::Enforce)
                    .build()
            });
        let max_intermediates = usize::try_from(self.depth.saturating_sub(1)).unwrap_or(0);
        let depth = |path: &webpki::VerifiedPath<'_>| {
            if path.intermediate_certificates().count() > max_intermediates {
                Err(webpki::Error::MaximumPathDepthExceeded)
            } else {
                Ok(())
            }
        };
        let result = cert.verify_for_usage(
            certs::provider().signature_verification_algorithms.all,
            &self.anchors,
            intermediates,
            now,
            webpki::KeyUsage::client_auth(),
            revocation,
            Some(&depth),
        );
        match result {
            Ok(_) => Verification::Success,
            Err(err) => Verification::Failed {
                reason: reason(&err),
                unknown_issuer: err == webpki::Error::UnknownIssuer,
            },
        }
    }

    /// What a request may do, given its connection's verification and the subject DN of the
    /// certificate it presented (empty without one).
    pub fn admit(&self, verification: &Verification, subject_dn: &str) -> Admission {
        let refuse = || Admission::Refuse {
            error_page: self.error_page.clone(),
        };
        let verified = match (self.verify, verification) {
            (_, Verification::Success) => true,
            (VerifyClient::On, _) => false,
            (
                VerifyClient::OptionalNoCa,
                Verification::Failed {
                    unknown_issuer: true,
                    ..
                },
            ) => true,
            (VerifyClient::Off, _) | (_, Verification::None) => true,
            (_, Verification::Failed { .. }) => false,
        };
        if !verified {
            return refuse();
        }
        match &self.match_cn {
            Some(regex) if !regex.is_match(subject_dn) => Admission::Forbidden,
            _ => Admission::Pass,
        }
    }
}

/// OpenSSL's words for a verification error, as nginx puts them in `$ssl_client_verify`.
fn reason(err: &webpki::Error) -> &'static str {
    match err {
        webpki::Error::CertExpired { .. } => "certificate has expired",
        webpki::Error::CertNotValidYet { .. } => "certificate is not yet valid",
        webpki::Error::UnknownIssuer => "unable to get local issuer certificate",
        webpki::Error::CertRevoked => "certificate revoked",
        webpki::Error::UnknownRevocationStatus => "unable to get certificate CRL",
        webpki::Error::CrlExpired { .. } => "CRL has expired",
        webpki::Error::MaximumPathDepthExceeded => "certificate chain too long",
        webpki::Error::InvalidSignatureForPublicKey => "certificate signature failure",
        webpki::Error::RequiredEkuNotFoundContext(_) => "unsupported certificate purpose",
        _ => "certificate verify failed",
    }
}

/// The values a connection's client certificate gives the request headers, made once per
/// connection.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PresentedCert {
    /// RFC 2253 (nginx's `$ssl_client_s_dn`), empty without a certificate.
    pub subject_dn: String,
    pub issuer_dn: String,
    /// The leaf as PEM, URL-escaped (nginx's `$ssl_client_escaped_cert`).
    pub escaped_pem: String,
}

impl PresentedCert {
    pub fn of(leaf: &CertificateDer<'_>) -> PresentedCert {
        let (subject_dn, issuer_dn) = match x509_parser::parse_x509_certificate(leaf.as_ref()) {
            Ok((_, cert)) => (rfc2253(cert.subject()), rfc2253(cert.issuer())),
            Err(_) => (String::new(), String::new()),
        };
        let pem = pem::encode_config(
            &pem::Pem::new("CERTIFICATE", leaf.as_ref()),
            pem::EncodeConfig::new().set_line_ending(pem::LineEnding::LF),
        );
        PresentedCert {
            subject_dn,
            issuer_dn,
            escaped_pem: percent_encoding::utf8_percent_encode(&pem, URI_COMPONENT).to_string(),
        }
    }
}

/// What nginx's `ngx_escape_uri(NGX_ESCAPE_URI_COMPONENT)` escapes: everything but letters,
/// digits and `-._~!$'()*,`.
const URI_COMPONENT: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~')
    .remove(b'!')
    .remove(b'$')
    .remove(b'\'')
    .remove(b'(')
    .remove(b')')
    .remove(b'*')
    .remove(b',');

/// A name as RFC 2253 writes it (OpenSSL's `XN_FLAG_RFC2253`, nginx's `$ssl_client_s_dn`):
/// the last RDN first, `,` between RDNs, `+` inside one, special characters escaped.
pub fn rfc2253(name: &x509_parser::x509::X509Name<'_>) -> String {
    let registry = x509_parser::objects::oid_registry();
    let mut rdns: Vec<String> = Vec::new();
    for rdn in name.iter() {
        let parts: Vec<String> = rdn
            .iter()
            .map(|atv| {
                let oid = atv.attr_type();
                let key = x509_parser::objects::oid2abbrev(oid, registry)
                    .map(str::to_string)
                    .unwrap_or_else(|_| oid.to_id_string());
                match atv.as_str() {
                    Ok(value) => format!("{key}={}", escape_dn_value(value)),
                    Err(_) => {
                        let hex: String = atv
                            .attr_value()
                            .data
                            .iter()
                            .map(|b| format!("{b:02x}"))
                            .collect();
                        format!("{key}=#{hex}")
                    }
                }
            })
            .collect();
        rdns.push(parts.join("+"));
    }
    rdns.reverse();
    rdns.join(",")
}

/// RFC 2253 escaping as OpenSSL does it: the special characters with a backslash, control
/// characters and every byte of a non-ASCII character as `\XX`, so the value is a valid
/// header value.
fn escape_dn_value(value: &str) -> String {
    use std::fmt::Write as _;
    let mut out = String::with_capacity(value.len());
    let last = value.chars().count().saturating_sub(1);
    for (i, c) in value.chars().enumerate() {
        if !c.is_ascii() || c.is_ascii_control() {
            let mut buf = [0u8; 4];
            for b in c.encode_utf8(&mut buf).bytes() {
                let _ = write!(out, "\\{b:02X}");
            }
            continue;
        }
        let special = matches!(c, ',' | '+' | '"' | '\\' | '<' | '>' | ';')
            || (i == 0 && (c == '#' || c == ' '))
            || (i == last && c == ' ');
        if special {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::ByteString;
    use rcgen::{
        BasicConstraints, CertificateParams, CertificateRevocationListParams, DnType, IsCa, Issuer,
        KeyIdMethod, KeyPair, KeyUsagePurpose, RevocationReason, RevokedCertParams, SerialNumber,
    };

    use super::*;

    struct Ca {
        cert: rcgen::Certificate,
        issuer: Issuer<'static, KeyPair>,
    }

    fn ca(name: &str) -> Ca {
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let cert = params.self_signed(&key).unwrap();
        Ca {
            cert,
            issuer: Issuer::new(params, key),
        }
    }

    fn client(ca: &Ca, cn: &str, serial: u64, not_after: i32) -> CertificateDer<'static> {
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params
            .distinguished_name
            .push(DnType::OrganizationName, "Example, Inc");
        params.distinguished_name.push(DnType::CommonName, cn);
        params.serial_number = Some(SerialNumber::from(serial));
        params.not_before = rcgen::date_time_ymd(2020, 1, 1);
        params.not_after = rcgen::date_time_ymd(not_after, 1, 1);
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        params.signed_by(&key, &ca.issuer).unwrap().der().clone()
    }

    fn secret(crt: &str, crl: Option<&str>) -> Secret {
        let mut data = BTreeMap::new();
        data.insert(CA_CRT.to_string(), ByteString(crt.as_bytes().to_vec()));
        if let Some(crl) = crl {
            data.insert(CA_CRL.to_string(), ByteString(crl.as_bytes().to_vec()));
        }
        Secret {
            data: Some(data),
            ..Default::default()
        }
    }

    fn options(verify: VerifyClient, match_cn: Option<&str>) -> AuthTls {
        AuthTls {
            secret: (None, "ca".into()),
            verify,
            depth: 1,
            error_page: None,
            pass_certificate: false,
            match_cn: match_cn.map(|r| regex::Regex::new(r).unwrap()),
        }
    }

    fn now() -> UnixTime {
        // 2030-01-01
        UnixTime::since_unix_epoch(std::time::Duration::from_secs(1_893_456_000))
    }

    #[test]
    fn verification_outcomes() {
        let good_ca = ca("Good CA");
        let other_ca = ca("Other CA");
        let crl = CertificateRevocationListParams {
            this_update: rcgen::date_time_ymd(2020, 1, 1),
            next_update: rcgen::date_time_ymd(2099, 1, 1),
            crl_number: SerialNumber::from(1u64),
            issuing_distribution_point: None,
            revoked_certs: vec![RevokedCertParams {
                serial_number: SerialNumber::from(66u64),
                revocation_time: rcgen::date_time_ymd(2021, 1, 1),
                reason_code: Some(RevocationReason::KeyCompromise),
                invalidity_date: None,
            }],
            key_identifier_method: KeyIdMethod::Sha256,
        }
        .signed_by(&good_ca.issuer)
        .unwrap()
        .pem()
        .unwrap();
        let key = ObjectKey::new("default", "ca");
        let plain = ClientAuth::from_secret(
            &key,
            &secret(&good_ca.cert.pem(), None),
            &options(VerifyClient::On, None),
        )
        .unwrap();
        let with_crl = ClientAuth::from_secret(
            &key,
            &secret(&good_ca.cert.pem(), Some(&crl)),
            &options(VerifyClient::On, None),
        )
        .unwrap();
        let valid = client(&good_ca, "alice", 7, 2099);
        let expired = client(&good_ca, "alice", 8, 2025);
        let foreign = client(&other_ca, "mallory", 9, 2099);
        let revoked = client(&good_ca, "eve", 66, 2099);
        let fails = |reason, unknown_issuer| Verification::Failed {
            reason,
            unknown_issuer,
        };
        let cases: Vec<(&ClientAuth, Vec<CertificateDer<'static>>, Verification)> = vec![
            (&plain, vec![], Verification::None),
            (&plain, vec![valid.clone()], Verification::Success),
            (
                &plain,
                vec![expired.clone()],
                fails("certificate has expired", false),
            ),
            (
                &plain,
                vec![foreign.clone()],
                fails("unable to get local issuer certificate", true),
            ),
            (&plain, vec![revoked.clone()], Verification::Success),
            (&with_crl, vec![valid.clone()], Verification::Success),
            (
                &with_crl,
                vec![revoked.clone()],
                fails("certificate revoked", false),
            ),
        ];
        for (i, (auth, chain, want)) in cases.into_iter().enumerate() {
            assert_eq!(auth.verify(&chain, now()), want, "case {i}");
        }
    }

    #[test]
    fn depth_limits_intermediates() {
        let root = ca("Root");
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, "Intermediate");
        let intermediate_cert = params.signed_by(&key, &root.issuer).unwrap();
        let intermediate = Ca {
            cert: intermediate_cert,
            issuer: Issuer::new(params, key),
        };
        let leaf = client(&intermediate, "bob", 3, 2099);
        let chain = vec![leaf, intermediate.cert.der().clone()];
        let key = ObjectKey::new("default", "ca");
        for (depth, want) in [(1, false), (2, true)] {
            let mut opts = options(VerifyClient::On, None);
            opts.depth = depth;
            let auth =
                ClientAuth::from_secret(&key, &secret(&root.cert.pem(), None), &opts).unwrap();
            assert_eq!(
                auth.verify(&chain, now()) == Verification::Success,
                want,
                "depth {depth}"
            );
        }
    }

    #[test]
    fn admission_by_mode() {
        let root = ca("Root");
        let key = ObjectKey::new("default", "ca");
        let unknown = Verification::Failed {
            reason: "unable to get local issuer certificate",
            unknown_issuer: true,
        };
        let expired = Verification::Failed {
            reason: "certificate has expired",
            unknown_issuer: false,
        };
        let refuse = Admission::Refuse { error_page: None };
        use Verification::{None as NoCert, Success};
        let cases = [
            (VerifyClient::On, Success, Admission::Pass),
            (VerifyClient::On, NoCert, refuse.clone()),
            (VerifyClient::On, expired.clone(), refuse.clone()),
            (VerifyClient::On, unknown.clone(), refuse.clone()),
            (VerifyClient::Optional, NoCert, Admission::Pass),
            (VerifyClient::Optional, unknown.clone(), refuse.clone()),
            (VerifyClient::OptionalNoCa, unknown.clone(), Admission::Pass),
            (VerifyClient::OptionalNoCa, expired.clone(), refuse.clone()),
            (VerifyClient::OptionalNoCa, NoCert, Admission::Pass),
            (VerifyClient::Off, NoCert, Admission::Pass),
        ];
        for (verify, verification, want) in cases {
            let auth = ClientAuth::from_secret(
                &key,
                &secret(&root.cert.pem(), None),
                &options(verify, None),
            )
            .unwrap();
            assert_eq!(
                auth.admit(&verification, ""),
                want,
                "{verify:?} {verification:?}"
            );
        }
        let cn = ClientAuth::from_secret(
            &key,
            &secret(&root.cert.pem(), None),
            &options(VerifyClient::On, Some("CN=(alice|bob)")),
        )
        .unwrap();
        assert_eq!(cn.admit(&Success, "CN=alice,O=Example"), Admission::Pass);
        assert_eq!(
            cn.admit(&Success, "CN=carol,O=Example"),
            Admission::Forbidden
        );
        assert_eq!(cn.admit(&NoCert, ""), refuse);
    }

    #[test]
    fn secret_problems() {
        let root = ca("Root");
        let key = ObjectKey::new("default", "ca");
        let opts = options(VerifyClient::On, None);
        let no_crt = Secret {
            data: Some(BTreeMap::new()),
            ..Default::default()
        };
        assert_eq!(
            ClientAuth::from_secret(&key, &no_crt, &opts).unwrap_err(),
            ClientAuthError::MissingField("ca.crt")
        );
        assert_eq!(
            ClientAuth::from_secret(&key, &secret("garbage", None), &opts).unwrap_err(),
            ClientAuthError::NoCertificate("ca.crt")
        );
        assert!(matches!(
            ClientAuth::from_secret(&key, &secret(&root.cert.pem(), Some("garbage")), &opts),
            Err(ClientAuthError::BadCrl(_))
        ));
        assert!(matches!(
            ClientAuth::from_secret(
                &key,
                &secret(
                    "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
                    None
                ),
                &opts
            ),
            Err(ClientAuthError::BadCa(_) | ClientAuthError::Pem { .. })
        ));
    }

    #[test]
    fn presented_certificate_headers() {
        let root = ca("Root");
        let leaf = client(&root, "alice+admin", 5, 2099);
        let presented = PresentedCert::of(&leaf);
        // rcgen writes the CN first; RFC 2253 names the last RDN first, as `openssl x509
        // -nameopt RFC2253` prints it.
        assert_eq!(presented.subject_dn, "O=Example\\, Inc,CN=alice\\+admin");
        assert_eq!(presented.issuer_dn, "CN=Root");
        assert!(
            presented
                .escaped_pem
                .starts_with("-----BEGIN%20CERTIFICATE-----%0A"),
            "{}",
            presented.escaped_pem
        );
        assert!(
            presented
                .escaped_pem
                .ends_with("-----END%20CERTIFICATE-----%0A")
        );
        assert!(!presented.escaped_pem.contains(['+', '/', '=', '\n', ' ']));
    }
}
