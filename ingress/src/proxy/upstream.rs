//! Upstream failures, and the status codes operators expect for each.

use std::time::Duration;

use http::StatusCode;

use crate::snapshot::address::Refusal;

/// Why a request could not be answered by an upstream.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    #[error("no ready endpoints")]
    NoEndpoints,
    #[error("connect: {0}")]
    Connect(String),
    #[error("connect timed out")]
    ConnectTimeout,
    #[error("no response headers within {0:?}")]
    ResponseTimeout(Duration),
    #[error("upstream: {0}")]
    Protocol(String),
    /// An ExternalName resolved to an address backends may not have.
    #[error("{name} resolved to {addr}, {refusal}; refused as a backend")]
    AddressRefused {
        name: String,
        addr: std::net::IpAddr,
        refusal: Refusal,
    },
    /// The route is not served (an access-control annotation that cannot be honoured).
    #[error("not served: {0}")]
    Refused(std::sync::Arc<str>),
    /// TLS to the upstream failed: its certificate, the handshake, or the route's TLS policy.
    #[error("upstream TLS {kind}: {msg}", kind = .0.as_str(), msg = .1)]
    Tls(TlsFailure, String),
}

/// What part of TLS to an upstream failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TlsFailure {
    /// The upstream's certificate is refused by `proxy-ssl-verify` (expired, wrong name,
    /// unknown issuer, too deep).
    Certificate,
    /// The handshake failed otherwise (not TLS, no common version, an alert).
    Handshake,
    /// The route's TLS policy cannot be used (verification asked for without a CA).
    Config,
}

impl TlsFailure {
    pub fn as_str(self) -> &'static str {
        match self {
            TlsFailure::Certificate => "certificate",
            TlsFailure::Handshake => "handshake",
            TlsFailure::Config => "config",
        }
    }
}

impl UpstreamError {
    pub fn status(&self) -> StatusCode {
        match self {
            UpstreamError::NoEndpoints | UpstreamError::Refused(_) => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            UpstreamError::Connect(_)
            | UpstreamError::Tls(..)
            | UpstreamError::Protocol(_)
            | UpstreamError::AddressRefused { .. } => StatusCode::BAD_GATEWAY,
            UpstreamError::ConnectTimeout | UpstreamError::ResponseTimeout(_) => {
                StatusCode::GATEWAY_TIMEOUT
            }
        }
    }

    /// The metric label of this error (`ingress_upstream_errors_total{kind}`).
    pub fn kind(&self) -> &'static str {
        match self {
            UpstreamError::NoEndpoints => "no_endpoints",
            UpstreamError::Connect(_) => "connect",
            UpstreamError::ConnectTimeout => "connect_timeout",
            UpstreamError::ResponseTimeout(_) => "response_timeout",
            UpstreamError::Protocol(_) => "protocol",
            UpstreamError::AddressRefused { .. } => "address_refused",
            UpstreamError::Refused(_) => "refused",
            UpstreamError::Tls(TlsFailure::Certificate, _) => "tls_certificate",
            UpstreamError::Tls(TlsFailure::Handshake, _) => "tls_handshake",
            UpstreamError::Tls(TlsFailure::Config, _) => "tls_config",
        }
    }

    pub fn from_hyper(err: hyper::Error) -> Self {
        UpstreamError::Protocol(crate::errors::chain(&err))
    }

    pub fn from_h2(err: &h2::Error) -> Self {
        UpstreamError::Protocol(crate::errors::chain(err))
    }
}
