//! The upstream side: one pooled HTTP/1.1 client for every endpoint (the pool is keyed by
//! endpoint address, so each endpoint gets its own keep-alive connections), and the mapping of
//! failures to the status codes operators expect.

use std::error::Error as _;
use std::time::Duration;

use http::StatusCode;
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};

pub type UpstreamClient = Client<HttpConnector, Incoming>;

/// How long an idle pooled upstream connection is kept; below the usual 60-75 s server-side
/// keep-alive timeouts would be safer, but upstream closes are retried for idempotent requests.
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(55);

pub fn client(connect_timeout: Duration) -> UpstreamClient {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    connector.set_connect_timeout(Some(connect_timeout));
    connector.set_keepalive(Some(Duration::from_secs(60)));
    // ExternalName Services are resolved here, per new connection, through the system resolver.
    Client::builder(TokioExecutor::new())
        .pool_idle_timeout(POOL_IDLE_TIMEOUT)
        .pool_timer(TokioTimer::new())
        .timer(TokioTimer::new())
        .build(connector)
}

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
}

impl UpstreamError {
    pub fn status(&self) -> StatusCode {
        match self {
            UpstreamError::NoEndpoints => StatusCode::SERVICE_UNAVAILABLE,
            UpstreamError::Connect(_) | UpstreamError::Protocol(_) => StatusCode::BAD_GATEWAY,
            UpstreamError::ConnectTimeout | UpstreamError::ResponseTimeout(_) => StatusCode::GATEWAY_TIMEOUT,
        }
    }

    pub fn from_client(err: hyper_util::client::legacy::Error) -> Self {
        let detail = chain(&err);
        if err.is_connect() {
            if detail.contains("timed out") || detail.contains("timeout") {
                UpstreamError::ConnectTimeout
            } else {
                UpstreamError::Connect(detail)
            }
        } else {
            UpstreamError::Protocol(detail)
        }
    }
}

fn chain(err: &hyper_util::client::legacy::Error) -> String {
    let mut out = err.to_string();
    let mut source = err.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}
