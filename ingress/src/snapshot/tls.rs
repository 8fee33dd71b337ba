//! Which certificate each host is served with: Ingress `spec.tls` entries resolved to Secrets,
//! checked, and laid out for lookup by SNI (exact, then wildcard, then the default).
//!
//! A broken certificate never breaks the host: the host is served with the default certificate
//! and the problem becomes a diagnostic on the Ingress.

use std::collections::{BTreeMap, HashMap};
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

pub struct TlsBuilder<'s> {
    store: &'s Store,
    settings: &'s TlsSettings,
    loaded: HashMap<ObjectKey, Result<Arc<Certificate>, LoadError>>,
    hosts: BTreeMap<HostPattern, (Arc<Certificate>, ObjectKey)>,
}

impl<'s> TlsBuilder<'s> {
    pub fn new(store: &'s Store, settings: &'s TlsSettings) -> Self {
        Self {
            store,
            settings,
            loaded: HashMap::new(),
            hosts: BTreeMap::new(),
        }
    }

    /// Adds one Ingress's `spec.tls`; returns the host patterns it declares TLS for (with or
    /// without a usable certificate: those redirect to HTTPS either way).
    pub fn add_ingress(
        &mut self,
        key: &ObjectKey,
        ingress: &Ingress,
        diagnostics: &mut Vec<Diagnostic>,
    ) -> Vec<HostPattern> {
        let subject = Subject::object(Kind::Ingress, key);
        let Some(spec) = &ingress.spec else {
            return Vec::new();
        };
        let rule_hosts = || -> Vec<String> {
            spec.rules
                .iter()
                .flatten()
                .filter_map(|r| r.host.clone())
                .collect()
        };
        let mut declared = Vec::new();
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
            declared.extend(patterns.iter().cloned());
            let Some(secret_name) = entry.secret_name.as_deref().filter(|s| !s.is_empty()) else {
                continue;
            };
            let secret_key = ObjectKey::new(key.namespace.clone(), secret_name);
            let cert = match self.load(&secret_key) {
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
            if let Some(problem) = cert.validity_problem(self.settings.now) {
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
                match self.hosts.get(&pattern) {
                    None => {
                        self.hosts.insert(pattern, (cert.clone(), key.clone()));
                    }
                    Some((existing, owner)) if !Arc::ptr_eq(existing, &cert) => {
                        diagnostics.push(Diagnostic::warning(
                            DiagnosticKind::ConflictingRule,
                            subject.clone(),
                            format!("the certificate for {pattern} is already set by Ingress {owner}; secret {secret_key} is not used for it"),
                        ));
                    }
                    Some(_) => {}
                }
            }
        }
        declared
    }

    fn load(&mut self, secret_key: &ObjectKey) -> Result<Arc<Certificate>, LoadError> {
        let store = self.store;
        // A certificate loaded earlier in this build was read from the Secret all the same.
        store.note_read(Kind::Secret, secret_key);
        self.loaded
            .entry(secret_key.clone())
            .or_insert_with(|| match store.secret(secret_key) {
                None => Err(LoadError::NotFound),
                Some(secret) => certs::from_secret(secret_key, secret)
                    .map(Arc::new)
                    .map_err(LoadError::Cert),
            })
            .clone()
    }

    /// The certificate for names no Ingress gives one.
    pub fn default_certificate(&mut self, diagnostics: &mut Vec<Diagnostic>) -> Arc<Certificate> {
        match &self.settings.default_certificate {
            None => self.settings.self_signed.clone(),
            Some(secret_key) => {
                let subject = Subject::object(Kind::Secret, secret_key);
                match self.load(secret_key) {
                    Ok(cert) => {
                        if let Some(problem) = cert.validity_problem(self.settings.now) {
                            diagnostics.push(Diagnostic::warning(
                                DiagnosticKind::CertificateExpired,
                                subject,
                                format!(
                                    "--default-certificate: certificate {problem}; served anyway"
                                ),
                            ));
                        }
                        cert
                    }
                    Err(err) => {
                        diagnostics.push(Diagnostic::error(
                            cert_error_kind(&err),
                            subject,
                            format!(
                                "--default-certificate: {err}; serving the self-signed certificate"
                            ),
                        ));
                        self.settings.self_signed.clone()
                    }
                }
            }
        }
    }

    /// The times at which a certificate this builder loaded becomes valid or expires: a build
    /// at another time judges them the same unless one of these lies in between.
    pub fn validity_bounds(&self) -> impl Iterator<Item = i64> + '_ {
        self.loaded
            .values()
            .flatten()
            .flat_map(|cert| [cert.not_before, cert.not_after])
    }

    /// Host pattern → its certificate, as the Ingresses added so far chose them.
    pub fn into_hosts(self) -> BTreeMap<HostPattern, Arc<Certificate>> {
        self.hosts
            .into_iter()
            .map(|(pattern, (cert, _))| (pattern, cert))
            .collect()
    }
}

/// The distinct certificates a table serves, one per Secret and in Secret order (the
/// self-signed default is not one), for the expiry metric.
pub fn loaded(
    hosts: &HostTable<Arc<Certificate>>,
    default: &Arc<Certificate>,
) -> Vec<Arc<Certificate>> {
    let mut by_secret = BTreeMap::new();
    for cert in hosts.values().chain([default]) {
        if let certs::CertSource::Secret(key) = &cert.source {
            by_secret.entry(key).or_insert_with(|| cert.clone());
        }
    }
    by_secret.into_values().collect()
}

#[derive(Clone, Debug, thiserror::Error)]
enum LoadError {
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
