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
}

impl UpstreamError {
    pub fn status(&self) -> StatusCode {
        match self {
            UpstreamError::NoEndpoints | UpstreamError::Refused(_) => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            UpstreamError::Connect(_)
            | UpstreamError::Protocol(_)
            | UpstreamError::AddressRefused { .. } => StatusCode::BAD_GATEWAY,
            UpstreamError::ConnectTimeout | UpstreamError::ResponseTimeout(_) => {
                StatusCode::GATEWAY_TIMEOUT
            }
        }
    }

    pub fn from_hyper(err: hyper::Error) -> Self {
        UpstreamError::Protocol(crate::errors::chain(&err))
    }
}
