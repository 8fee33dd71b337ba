//! Connections to auth services (`auth-url`): the upstream connection code's TCP, DNS and TLS
//! (`connect.rs`), hyper's HTTP/1.1 client on top, and `auth-keepalive`'s idle connections.
//!
//! ```text
//!   send(endpoint) ── an idle connection (auth-keepalive > 0, younger than -timeout)? ──┐
//!                 └── none: Connectors::open (resolve, judge addresses, TCP, TLS) ───────┤
//!   request, no body ── response head within the route's read timeout ── body read ─────┤
//!   reused fewer than auth-keepalive-requests times, room in the idle list ── back ──────┘
//! ```
//!
//! A request body is never sent (nginx's `proxy_pass_request_body off`): the idle connections
//! are `kept.rs`'s, shared with the error pages; what is shared with the upstream pools is how
//! a connection is made. TLS to an auth service is nginx's default for
//! the auth location: SNI on, the certificate not verified.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Empty, Limited};

use super::connect::{Connectors, PoolKey, Transport};
use super::kept::{self, Kept, Sender};
use super::upstream::UpstreamError;
use crate::snapshot::annotations::auth::Keepalive;
use crate::snapshot::backend::ExternalName;
use crate::snapshot::policy::{UpstreamTls, Wire};

/// The most of an auth service's response body read (and dropped) so its connection can be
/// reused; a larger one closes the connection instead.
const MAX_BODY: usize = 64 * 1024;

/// Where an auth service is.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Endpoint {
    pub https: bool,
    pub host: String,
    pub port: u16,
}

/// Connections to auth services, with the idle ones `auth-keepalive` keeps.
pub struct AuthClient {
    connectors: Arc<Connectors>,
    /// By endpoint and keepalive settings: as each nginx location's auth has its own upstream
    /// block, a route never takes a connection another route's limits kept.
    idle: Kept<(Endpoint, Keepalive)>,
}

/// How long each step may take.
#[derive(Clone, Copy, Debug)]
pub struct Timeouts {
    pub connect: Duration,
    pub read: Duration,
}

impl AuthClient {
    pub fn new(connectors: Arc<Connectors>) -> Self {
        Self {
            connectors,
            idle: Kept::default(),
        }
    }

    /// Sends the request `make` builds to `endpoint` and returns the response head (its body
    /// read and dropped). A reused connection that fails before answering is replaced by a new
    /// one once.
    pub async fn send(
        &self,
        endpoint: &Endpoint,
        name: &ExternalName,
        make: impl Fn() -> Request<Empty<Bytes>>,
        keepalive: Keepalive,
        timeouts: Timeouts,
    ) -> Result<http::response::Parts, UpstreamError> {
        // nginx's proxy_read_timeout for the auth location: the answer must come within the
        // route's read timeout of the request being sent; a kept-alive connection that fails
        // is not retried after that.
        let read = timeouts.read;
        let timed_out = || UpstreamError::ResponseTimeout(read);
        let pool = (endpoint.clone(), keepalive);
        if let Some(idle) = self.idle.checkout(&pool, keepalive) {
            match tokio::time::timeout(read, Self::exchange(idle.sender, make())).await {
                Ok(Ok((parts, sender))) => {
                    if let Some(sender) = sender {
                        self.idle.checkin(&pool, sender, idle.used + 1, keepalive);
                    }
                    return Ok(parts);
                }
                Ok(Err(err)) => {
                    tracing::debug!(?endpoint, %err, "auth service: a kept-alive connection failed; trying a new one");
                }
                Err(_) => return Err(timed_out()),
            }
        }
        let sender = self.connect(endpoint, name, timeouts.connect).await?;
        let (parts, sender) = tokio::time::timeout(read, Self::exchange(sender, make()))
            .await
            .map_err(|_| timed_out())??;
        if let Some(sender) = sender {
            self.idle.checkin(&pool, sender, 1, keepalive);
        }
        Ok(parts)
    }

    async fn exchange(
        mut sender: Sender,
        request: Request<Empty<Bytes>>,
    ) -> Result<(http::response::Parts, Option<Sender>), UpstreamError> {
        sender.ready().await.map_err(UpstreamError::from_hyper)?;
        let response: Response<hyper::body::Incoming> = sender
            .send_request(request)
            .await
            .map_err(UpstreamError::from_hyper)?;
        let (parts, body) = response.into_parts();
        // Read to its end, so the connection can carry the next check; a body that is too
        // large or broken only costs the connection.
        let reusable = Limited::new(body, MAX_BODY).collect().await.is_ok();
        Ok((parts, reusable.then_some(sender)))
    }

    async fn connect(
        &self,
        endpoint: &Endpoint,
        name: &ExternalName,
        timeout: Duration,
    ) -> Result<Sender, UpstreamError> {
        let key = PoolKey::Name(Arc::new(name.clone()));
        let transport = if endpoint.https {
            Transport::Tls(Arc::new(UpstreamTls {
                send_sni: true,
                name: Some(endpoint.host.clone()),
                ..UpstreamTls::default()
            }))
        } else {
            Transport::Plain
        };
        let stream = self
            .connectors
            .open(&key, &transport, Wire::Http1, timeout)
            .await?;
        kept::handshake(stream, "auth service")
            .await
            .map_err(UpstreamError::from_hyper)
    }
}
