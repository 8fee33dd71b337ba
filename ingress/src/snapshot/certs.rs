//! Certificates: parsing `kubernetes.io/tls` Secrets into rustls keys, checking them, and the
//! self-signed fallback. Pure functions of their inputs (the clock is a parameter).

use std::sync::Arc;

use k8s_openapi::api::core::v1::Secret;
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use x509_parser::extensions::GeneralName;

use crate::snapshot::host::HostPattern;
use crate::store::ObjectKey;

/// The Secret keys of a `kubernetes.io/tls` Secret.
pub const TLS_CRT: &str = "tls.crt";
pub const TLS_KEY: &str = "tls.key";

/// Where a served certificate came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CertSource {
    Secret(ObjectKey),
    /// Generated at startup because no `--default-certificate` was given.
    SelfSigned,
}

/// A certificate ready to serve, with what operators need to know about it.
#[derive(Debug)]
pub struct Certificate {
    pub key: Arc<CertifiedKey>,
    pub source: CertSource,
    /// Validity, as Unix seconds.
    pub not_before: i64,
    pub not_after: i64,
    /// DNS subject alternative names of the leaf.
    pub dns_names: Vec<String>,
}

#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum CertError {
    #[error("secret has no {0:?} key")]
    MissingField(&'static str),
    #[error("{field}: {reason}")]
    Pem { field: &'static str, reason: String },
    #[error("tls.crt holds no certificate")]
    NoCertificate,
    #[error("the private key does not match the certificate")]
    KeyMismatch,
    #[error("unsupported private key: {0}")]
    UnsupportedKey(String),
    #[error("cannot parse the certificate: {0}")]
    BadCertificate(String),
    #[error("cannot generate a self-signed certificate: {0}")]
    Generate(String),
}

/// The process-wide rustls crypto provider (aws-lc-rs).
pub fn provider() -> &'static Arc<rustls::crypto::CryptoProvider> {
    static PROVIDER: std::sync::LazyLock<Arc<rustls::crypto::CryptoProvider>> =
        std::sync::LazyLock::new(|| Arc::new(rustls::crypto::aws_lc_rs::default_provider()));
    &PROVIDER
}

/// Parses a TLS Secret's chain and key. Chains (leaf first, then intermediates), RSA, ECDSA and
/// Ed25519 keys, and PKCS#1, PKCS#8 and SEC1 PEM are all accepted.
pub fn from_secret(key: &ObjectKey, secret: &Secret) -> Result<Certificate, CertError> {
    let data = secret.data.as_ref();
    let field = |name: &'static str| {
        data.and_then(|d| d.get(name))
            .map(|b| b.0.as_slice())
            .ok_or(CertError::MissingField(name))
    };
    let mut cert = from_pem(field(TLS_CRT)?, field(TLS_KEY)?)?;
    cert.source = CertSource::Secret(key.clone());
    Ok(cert)
}

pub fn from_pem(crt: &[u8], key: &[u8]) -> Result<Certificate, CertError> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(crt)
        .collect::<Result<_, _>>()
        .map_err(|e| CertError::Pem {
            field: TLS_CRT,
            reason: e.to_string(),
        })?;
    if chain.is_empty() {
        return Err(CertError::NoCertificate);
    }
    let key = PrivateKeyDer::from_pem_slice(key).map_err(|e| CertError::Pem {
        field: TLS_KEY,
        reason: e.to_string(),
    })?;
    let certified = CertifiedKey::from_der(chain, key, provider()).map_err(|e| match e {
        rustls::Error::InconsistentKeys(_) => CertError::KeyMismatch,
        other => CertError::UnsupportedKey(other.to_string()),
    })?;
    describe(certified, CertSource::SelfSigned)
}

fn describe(certified: CertifiedKey, source: CertSource) -> Result<Certificate, CertError> {
    let leaf = certified
        .end_entity_cert()
        .map_err(|e| CertError::BadCertificate(e.to_string()))?;
    let (_, parsed) = x509_parser::parse_x509_certificate(leaf.as_ref())
        .map_err(|e| CertError::BadCertificate(e.to_string()))?;
    let validity = parsed.validity();
    let (not_before, not_after) = (
        validity.not_before.timestamp(),
        validity.not_after.timestamp(),
    );
    let dns_names = parsed
        .subject_alternative_name()
        .ok()
        .flatten()
        .map(|san| {
            san.value
                .general_names
                .iter()
                .filter_map(|n| match n {
                    GeneralName::DNSName(d) => Some(d.to_ascii_lowercase()),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default();
    Ok(Certificate {
        key: Arc::new(certified),
        source,
        not_before,
        not_after,
        dns_names,
    })
}

impl Certificate {
    /// Whether the certificate's names cover `host` as a client would check it (RFC 6125: a
    /// `*.foo.com` name covers exactly one label). A wildcard host needs a wildcard name.
    pub fn covers(&self, host: &HostPattern) -> bool {
        match host {
            HostPattern::Exact(h) => self.dns_names.iter().any(|n| name_matches(n, h)),
            HostPattern::Wildcard(parent) => self
                .dns_names
                .iter()
                .any(|n| n.strip_prefix("*.") == Some(parent)),
            HostPattern::Any => true,
        }
    }

    /// `Some(reason)` if the certificate is not valid at `now` (Unix seconds). The reason
    /// names the moment, not the distance to it, so that it reads the same at every build
    /// (and a diagnostic is logged once, not again at each rebuild).
    pub fn validity_problem(&self, now: i64) -> Option<String> {
        if now > self.not_after {
            Some(format!("expired at {}", rfc3339(self.not_after)))
        } else if now < self.not_before {
            Some(format!("not valid before {}", rfc3339(self.not_before)))
        } else {
            None
        }
    }
}

fn rfc3339(unix: i64) -> String {
    let at =
        std::time::UNIX_EPOCH + std::time::Duration::from_secs(u64::try_from(unix).unwrap_or(0));
    humantime::format_rfc3339_seconds(at).to_string()
}

fn name_matches(san: &str, host: &str) -> bool {
    if san == host {
        return true;
    }
    match (san.strip_prefix("*."), host.split_once('.')) {
        (Some(parent), Some((first, rest))) => !first.is_empty() && rest == parent,
        _ => false,
    }
}

/// The certificate served when nothing else applies and no `--default-certificate` is given:
/// self-signed, ECDSA P-256, for `ingress.local`, like ingress-nginx's fake certificate.
pub fn self_signed() -> Result<Certificate, CertError> {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
        .map_err(|e| CertError::Generate(e.to_string()))?;
    let mut params = rcgen::CertificateParams::new(vec!["ingress.local".to_string()])
        .map_err(|e| CertError::Generate(e.to_string()))?;
    params.distinguished_name.push(
        rcgen::DnType::CommonName,
        "Ingress Controller Fake Certificate",
    );
    let cert = params
        .self_signed(&key)
        .map_err(|e| CertError::Generate(e.to_string()))?;
    from_pem(cert.pem().as_bytes(), key.serialize_pem().as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn generate(names: &[&str], not_after: (i32, u8, u8)) -> (String, String) {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let mut params =
            rcgen::CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>())
                .unwrap();
        params.not_before = rcgen::date_time_ymd(2020, 1, 1);
        params.not_after = rcgen::date_time_ymd(not_after.0, not_after.1, not_after.2);
        let cert = params.self_signed(&key).unwrap();
        (cert.pem(), key.serialize_pem())
    }

    #[test]
    fn parses_and_describes() {
        let (crt, key) = generate(&["a.example.com", "*.b.example.com"], (2099, 1, 1));
        let cert = from_pem(crt.as_bytes(), key.as_bytes()).unwrap();
        assert_eq!(cert.dns_names, ["a.example.com", "*.b.example.com"]);
        assert_eq!(cert.validity_problem(cert.not_before + 10), None);
        assert!(
            cert.validity_problem(cert.not_after + 86_400)
                .unwrap()
                .starts_with("expired at 20")
        );
        assert!(
            cert.validity_problem(cert.not_before - 60)
                .unwrap()
                .starts_with("not valid before 20")
        );
    }

    #[test]
    fn rejects_broken_material() {
        let (crt, key) = generate(&["a.example.com"], (2099, 1, 1));
        let (_, other_key) = generate(&["a.example.com"], (2099, 1, 1));
        let cases: Vec<(&[u8], &[u8], fn(&CertError) -> bool)> = vec![
            (crt.as_bytes(), other_key.as_bytes(), |e| {
                *e == CertError::KeyMismatch
            }),
            (b"", key.as_bytes(), |e| *e == CertError::NoCertificate),
            (b"not pem at all", key.as_bytes(), |e| {
                *e == CertError::NoCertificate
            }),
            (crt.as_bytes(), b"", |e| {
                matches!(
                    e,
                    CertError::Pem {
                        field: "tls.key",
                        ..
                    }
                )
            }),
            (crt.as_bytes(), crt.as_bytes(), |e| {
                matches!(
                    e,
                    CertError::Pem {
                        field: "tls.key",
                        ..
                    }
                )
            }),
            (
                b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
                key.as_bytes(),
                |e| {
                    matches!(
                        e,
                        CertError::UnsupportedKey(_)
                            | CertError::BadCertificate(_)
                            | CertError::KeyMismatch
                    )
                },
            ),
        ];
        for (i, (crt, key, check)) in cases.into_iter().enumerate() {
            let err = from_pem(crt, key).expect_err(&format!("case {i} must fail"));
            assert!(check(&err), "case {i}: {err:?}");
        }
    }

    #[test]
    fn chains_keep_intermediates() {
        let ca_key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca = ca_params.self_signed(&ca_key).unwrap();
        let issuer = rcgen::Issuer::new(ca_params, ca_key);
        let leaf_key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let leaf = rcgen::CertificateParams::new(vec!["leaf.example.com".to_string()])
            .unwrap()
            .signed_by(&leaf_key, &issuer)
            .unwrap();
        let chain = format!("{}{}", leaf.pem(), ca.pem());
        let cert = from_pem(chain.as_bytes(), leaf_key.serialize_pem().as_bytes()).unwrap();
        assert_eq!(cert.key.cert.len(), 2);
        assert_eq!(cert.dns_names, ["leaf.example.com"]);
    }

    #[test]
    fn self_signed_fallback() {
        let cert = self_signed().unwrap();
        assert_eq!(cert.dns_names, ["ingress.local"]);
        assert_eq!(cert.source, CertSource::SelfSigned);
    }

    #[test]
    fn san_coverage() {
        let cert = Certificate {
            key: self_signed().unwrap().key,
            source: CertSource::SelfSigned,
            not_before: 0,
            not_after: 0,
            dns_names: vec!["shop.example.com".into(), "*.api.example.com".into()],
        };
        let cases = [
            (HostPattern::Exact("shop.example.com".into()), true),
            (HostPattern::Exact("v1.api.example.com".into()), true),
            (HostPattern::Exact("a.v1.api.example.com".into()), false),
            (HostPattern::Exact("api.example.com".into()), false),
            (HostPattern::Exact("other.example.com".into()), false),
            (HostPattern::Wildcard("api.example.com".into()), true),
            (HostPattern::Wildcard("example.com".into()), false),
        ];
        for (host, want) in cases {
            assert_eq!(cert.covers(&host), want, "{host}");
        }
    }
}
