//! Which certificate each host is served with: Ingress `spec.tls` entries resolved to Secrets,
//! checked, and laid out for lookup by SNI (exact, then wildcard, then the default).
//!
//! A broken certificate never breaks the host: the host is served with the default certificate
//! and the problem becomes a diagnostic on the Ingress.

use std::collections::HashMap;
use std::sync::Arc;

use k8s_openapi::api::networking::v1::Ingress;

use super::host::{self, HostPattern, HostTable};
use crate::diagnostics::{Diagnostic, DiagnosticKind, Subject};
use crate::snapshot::certs::{self, CertError, Certificate};
use crate::store::{Kind, ObjectKey, Store};

#[derive(Clone, Debug)]
pub struct TlsSettings {
    /// `--default-certificate`: a Secret served when no Ingress certificate applies.
    pub default_certificate: Option<ObjectKey>,
    /// Served when `default_certificate` is unset or unusable.
    pub self_signed: Arc<Certificate>,
    /// Unix seconds: expiry is judged against this, so a build stays a pure function.
    pub now: i64,
}

/// SNI → certificate.
#[derive(Debug, Default)]
pub struct TlsTable {
    pub hosts: HostTable<Arc<Certificate>>,
    /// `None` only in the empty snapshot served before the first sync.
    pub default: Option<Arc<Certificate>>,
    /// Every certificate loaded from a Secret and in use, for the expiry metrics.
    pub loaded: Vec<Arc<Certificate>>,
}

impl TlsTable {
    /// The certificate for a handshake. `sni` must already be lowercase.
    pub fn resolve(&self, sni: Option<&str>) -> Option<&Arc<Certificate>> {
        sni.and_then(|name| self.hosts.lookup_named(name))
            .or(self.default.as_ref())
    }
}

/// Certificates loaded from Secrets, kept from one build to the next: parsing a certificate
/// and checking its key is the costly part, and a Secret that did not change gives the same one.
/// One Secret gives one `Arc`, which is how two Ingresses naming it are known to agree.
#[derive(Debug, Default)]
pub struct CertLoader {
    loaded: HashMap<ObjectKey, Result<Arc<Certificate>, LoadError>>,
}

impl CertLoader {
    pub fn load(
        &mut self,
        store: &Store,
        secret_key: &ObjectKey,
    ) -> Result<Arc<Certificate>, LoadError> {
        self.loaded
            .entry(secret_key.clone())
            .or_insert_with(|| match store.secrets.get(secret_key) {
                None => Err(LoadError::NotFound),
                Some(secret) => certs::from_secret(secret_key, secret)
                    .map(Arc::new)
                    .map_err(LoadError::Cert),
            })
            .clone()
    }

    /// Drops what was loaded from a Secret that changed.
    pub fn forget(&mut self, secret_key: &ObjectKey) {
        self.loaded.remove(secret_key);
    }
}

/// An Ingress asking for `cert` (from Secret `secret`) on `pattern`; the oldest Ingress wins.
#[derive(Clone, Debug)]
pub struct TlsClaim {
    pub pattern: HostPattern,
    pub cert: Arc<Certificate>,
    pub secret: ObjectKey,
}

/// One Ingress's `spec.tls`, judged on its own.
#[derive(Debug, Default)]
pub struct IngressTls {
    /// The host patterns it declares TLS for (with or without a usable certificate: those
    /// redirect to HTTPS either way).
    pub declared: Vec<HostPattern>,
    /// The usable certificates it asks for, by host.
    pub claims: Vec<TlsClaim>,
    /// The Secrets it named, and the certificates whose validity it judged.
    pub secrets: Vec<ObjectKey>,
    pub judged: Vec<Arc<Certificate>>,
}

/// Judges one Ingress's `spec.tls`, recording its problems in `diagnostics`.
pub fn compile_ingress(
    store: &Store,
    settings: &TlsSettings,
    loader: &mut CertLoader,
    key: &ObjectKey,
    ingress: &Ingress,
    diagnostics: &mut Vec<Diagnostic>,
) -> IngressTls {
    let mut out = IngressTls::default();
    let subject = Subject::object(Kind::Ingress, key);
    let Some(spec) = &ingress.spec else {
        return out;
    };
    let rule_hosts = || -> Vec<String> {
        spec.rules
            .iter()
            .flatten()
            .filter_map(|r| r.host.clone())
            .collect()
    };
    for entry in spec.tls.iter().flatten() {
        // Without `hosts`, an entry applies to every host of the Ingress's rules.
        let names = entry
            .hosts
            .clone()
            .filter(|h| !h.is_empty())
            .unwrap_or_else(rule_hosts);
        let patterns: Vec<HostPattern> = names
            .iter()
            .filter_map(|name| match host::parse_pattern(Some(name)) {
                Ok(p) => Some(p),
                Err(err) => {
                    diagnostics.push(Diagnostic::error(
                        DiagnosticKind::InvalidHost,
                        subject.clone(),
                        format!("spec.tls: {err}"),
                    ));
                    None
                }
            })
            .collect();
        out.declared.extend(patterns.iter().cloned());
        let Some(secret_name) = entry.secret_name.as_deref().filter(|s| !s.is_empty()) else {
            continue;
        };
        let secret_key = ObjectKey::new(key.namespace.clone(), secret_name);
        out.secrets.push(secret_key.clone());
        let cert = match loader.load(store, &secret_key) {
            Ok(cert) => cert,
            Err(err) => {
                diagnostics.push(Diagnostic::error(
                    cert_error_kind(&err),
                    subject.clone(),
                    format!(
                        "secret {secret_key}: {err}; hosts {} use the default certificate",
                        list(&patterns)
                    ),
                ));
                continue;
            }
        };
        out.judged.push(cert.clone());
        if let Some(problem) = cert.validity_problem(settings.now) {
            diagnostics.push(Diagnostic::error(
                DiagnosticKind::CertificateExpired,
                subject.clone(),
                format!("secret {secret_key}: certificate {problem}; hosts {} use the default certificate", list(&patterns)),
            ));
            continue;
        }
        for pattern in patterns {
            if !cert.covers(&pattern) {
                diagnostics.push(Diagnostic::error(
                    DiagnosticKind::CertificateHostMismatch,
                    subject.clone(),
                    format!(
                        "secret {secret_key}: certificate names [{}] do not cover {pattern}; it uses the default certificate",
                        cert.dns_names.join(", ")
                    ),
                ));
                continue;
            }
            out.claims.push(TlsClaim {
                pattern,
                cert: cert.clone(),
                secret: secret_key.clone(),
            });
        }
    }
    out
}

/// The certificate one host pattern is served with: the first claim, in Ingress order, wins;
/// a later claim with another certificate is a warning on its Ingress.
pub fn settle<'c>(
    claims: impl Iterator<Item = (&'c ObjectKey, &'c TlsClaim)>,
    diagnostics: &mut Vec<Diagnostic>,
) -> Option<Arc<Certificate>> {
    let mut winner: Option<(&Arc<Certificate>, &ObjectKey)> = None;
    for (ingress, claim) in claims {
        match winner {
            None => winner = Some((&claim.cert, ingress)),
            Some((existing, owner)) if !Arc::ptr_eq(existing, &claim.cert) => {
                diagnostics.push(Diagnostic::warning(
                    DiagnosticKind::ConflictingRule,
                    Subject::object(Kind::Ingress, ingress),
                    format!(
                        "the certificate for {} is already set by Ingress {owner}; secret {} is not used for it",
                        claim.pattern, claim.secret
                    ),
                ));
            }
            Some(_) => {}
        }
    }
    winner.map(|(cert, _)| cert.clone())
}

/// The certificate served when no Ingress certificate applies.
pub fn default_certificate(
    store: &Store,
    settings: &TlsSettings,
    loader: &mut CertLoader,
    diagnostics: &mut Vec<Diagnostic>,
) -> Arc<Certificate> {
    let Some(secret_key) = &settings.default_certificate else {
        return settings.self_signed.clone();
    };
    let subject = Subject::object(Kind::Secret, secret_key);
    match loader.load(store, secret_key) {
        Ok(cert) => {
            if let Some(problem) = cert.validity_problem(settings.now) {
                diagnostics.push(Diagnostic::warning(
                    DiagnosticKind::CertificateExpired,
                    subject,
                    format!("--default-certificate: certificate {problem}; served anyway"),
                ));
            }
            cert
        }
        Err(err) => {
            diagnostics.push(Diagnostic::error(
                cert_error_kind(&err),
                subject,
                format!("--default-certificate: {err}; serving the self-signed certificate"),
            ));
            settings.self_signed.clone()
        }
    }
}

/// Every certificate in use that was loaded from a Secret, in host order, then the default's.
pub fn loaded<'c>(
    hosts: impl Iterator<Item = &'c Arc<Certificate>>,
    default: &Arc<Certificate>,
) -> Vec<Arc<Certificate>> {
    let mut loaded: Vec<Arc<Certificate>> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for cert in hosts {
        if seen.insert(Arc::as_ptr(cert)) {
            loaded.push(cert.clone());
        }
    }
    if !matches!(default.source, certs::CertSource::SelfSigned)
        && !seen.contains(&Arc::as_ptr(default))
    {
        loaded.push(default.clone());
    }
    loaded
}

/// Why a referenced Secret gave no certificate.
#[derive(Clone, Debug, thiserror::Error)]
pub enum LoadError {
    #[error("not found")]
    NotFound,
    #[error(transparent)]
    Cert(CertError),
}

fn cert_error_kind(err: &LoadError) -> DiagnosticKind {
    match err {
        LoadError::NotFound => DiagnosticKind::SecretNotFound,
        LoadError::Cert(CertError::KeyMismatch) => DiagnosticKind::CertificateKeyMismatch,
        LoadError::Cert(_) => DiagnosticKind::SecretInvalid,
    }
}

fn list(patterns: &[HostPattern]) -> String {
    let names: Vec<String> = patterns.iter().map(ToString::to_string).collect();
    format!("[{}]", names.join(", "))
}
