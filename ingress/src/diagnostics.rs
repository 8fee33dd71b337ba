//! What is wrong, and on which object.
//!
//! Diagnostics are data in the snapshot. The log, the `ingress_config_errors` metric, Kubernetes
//! Events and `ingress check` all render the same list; none of them re-derives it.

use std::fmt;

use serde::Serialize;

use crate::object::{Kind, ObjectKey};

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// Part of the configuration is not served as written.
    Error,
    /// Served, but probably not what was meant.
    Warning,
}

impl Severity {
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Error => "error",
            Severity::Warning => "warning",
        }
    }
}

/// Every kind of problem, named once. The name is the metric label and the Event reason, so
/// adding a variant is the whole job of making a new failure countable.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum DiagnosticKind {
    ManifestUnreadable,
    ManifestInvalid,
    UnsupportedKind,
    DuplicateObject,
    InvalidHost,
    InvalidPath,
    InvalidRegex,
    ConflictingRule,
    ServiceNotFound,
    ServicePortNotFound,
    NoReadyEndpoints,
    UnsupportedBackend,
    InvalidAnnotation,
    SecretNotFound,
    SecretInvalid,
    CertificateKeyMismatch,
    CertificateExpired,
    CertificateHostMismatch,
    PassthroughPathsIgnored,
    ExternalNameDisabled,
    BackendAddressRefused,
    UnsupportedAnnotation,
    /// A canary Ingress path that no main Ingress serves (same host, path and type): unused.
    CanaryUnmatched,
    /// A ConfigMap key whose value does not parse: the default stays.
    InvalidConfigValue,
    /// A ConfigMap key this controller does not apply (or reads at startup only).
    UnsupportedConfigKey,
    /// A ConfigMap that is named does not exist: `--configmap` (flag defaults apply), one of
    /// headers the global one names (none of its headers), or one an Ingress names (refused).
    ConfigMapNotFound,
}

impl DiagnosticKind {
    /// The metric label value and Event reason.
    pub fn as_str(self) -> &'static str {
        match self {
            DiagnosticKind::ManifestUnreadable => "ManifestUnreadable",
            DiagnosticKind::ManifestInvalid => "ManifestInvalid",
            DiagnosticKind::UnsupportedKind => "UnsupportedKind",
            DiagnosticKind::DuplicateObject => "DuplicateObject",
            DiagnosticKind::InvalidHost => "InvalidHost",
            DiagnosticKind::InvalidPath => "InvalidPath",
            DiagnosticKind::InvalidRegex => "InvalidRegex",
            DiagnosticKind::ConflictingRule => "ConflictingRule",
            DiagnosticKind::ServiceNotFound => "ServiceNotFound",
            DiagnosticKind::ServicePortNotFound => "ServicePortNotFound",
            DiagnosticKind::NoReadyEndpoints => "NoReadyEndpoints",
            DiagnosticKind::UnsupportedBackend => "UnsupportedBackend",
            DiagnosticKind::InvalidAnnotation => "InvalidAnnotation",
            DiagnosticKind::SecretNotFound => "SecretNotFound",
            DiagnosticKind::SecretInvalid => "SecretInvalid",
            DiagnosticKind::CertificateKeyMismatch => "CertificateKeyMismatch",
            DiagnosticKind::CertificateExpired => "CertificateExpired",
            DiagnosticKind::CertificateHostMismatch => "CertificateHostMismatch",
            DiagnosticKind::PassthroughPathsIgnored => "PassthroughPathsIgnored",
            DiagnosticKind::ExternalNameDisabled => "ExternalNameDisabled",
            DiagnosticKind::BackendAddressRefused => "BackendAddressRefused",
            DiagnosticKind::UnsupportedAnnotation => "UnsupportedAnnotation",
            DiagnosticKind::CanaryUnmatched => "CanaryUnmatched",
            DiagnosticKind::InvalidConfigValue => "InvalidConfigValue",
            DiagnosticKind::UnsupportedConfigKey => "UnsupportedConfigKey",
            DiagnosticKind::ConfigMapNotFound => "ConfigMapNotFound",
        }
    }

    pub const ALL: &'static [DiagnosticKind] = &[
        DiagnosticKind::ManifestUnreadable,
        DiagnosticKind::ManifestInvalid,
        DiagnosticKind::UnsupportedKind,
        DiagnosticKind::DuplicateObject,
        DiagnosticKind::InvalidHost,
        DiagnosticKind::InvalidPath,
        DiagnosticKind::InvalidRegex,
        DiagnosticKind::ConflictingRule,
        DiagnosticKind::ServiceNotFound,
        DiagnosticKind::ServicePortNotFound,
        DiagnosticKind::NoReadyEndpoints,
        DiagnosticKind::UnsupportedBackend,
        DiagnosticKind::InvalidAnnotation,
        DiagnosticKind::SecretNotFound,
        DiagnosticKind::SecretInvalid,
        DiagnosticKind::CertificateKeyMismatch,
        DiagnosticKind::CertificateExpired,
        DiagnosticKind::CertificateHostMismatch,
        DiagnosticKind::PassthroughPathsIgnored,
        DiagnosticKind::ExternalNameDisabled,
        DiagnosticKind::BackendAddressRefused,
        DiagnosticKind::UnsupportedAnnotation,
        DiagnosticKind::CanaryUnmatched,
        DiagnosticKind::InvalidConfigValue,
        DiagnosticKind::UnsupportedConfigKey,
        DiagnosticKind::ConfigMapNotFound,
    ];
}

impl fmt::Display for DiagnosticKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The thing a diagnostic is about: a Kubernetes object, or a file the manifests source read.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum Subject {
    Object { kind: Kind, key: ObjectKey },
    File { path: String },
}

impl Subject {
    pub fn object(kind: Kind, key: &ObjectKey) -> Self {
        Subject::Object {
            kind,
            key: key.clone(),
        }
    }

    /// The Ingress an Event should be attached to, if this is about one.
    pub fn ingress(&self) -> Option<&ObjectKey> {
        match self {
            Subject::Object {
                kind: Kind::Ingress,
                key,
            } => Some(key),
            _ => None,
        }
    }
}

impl fmt::Display for Subject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Subject::Object { kind, key } => write!(f, "{kind} {key}"),
            Subject::File { path } => write!(f, "file {path}"),
        }
    }
}

impl Serialize for Kind {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl Serialize for ObjectKey {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct Diagnostic {
    pub severity: Severity,
    pub kind: DiagnosticKind,
    pub subject: Subject,
    pub message: String,
}

impl Diagnostic {
    pub fn error(kind: DiagnosticKind, subject: Subject, message: impl Into<String>) -> Self {
        Self {
            severity: Severity::Error,
            kind,
            subject,
            message: message.into(),
        }
    }

    pub fn warning(kind: DiagnosticKind, subject: Subject, message: impl Into<String>) -> Self {
        Self {
            severity: Severity::Warning,
            kind,
            subject,
            message: message.into(),
        }
    }
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {} {}: {}",
            self.severity.as_str(),
            self.kind,
            self.subject,
            self.message
        )
    }
}
