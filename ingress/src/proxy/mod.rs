//! The HTTP proxy: listeners, the TLS accept phase, the two protocol paths, and the request
//! phases they share.
//!
//! ```text
//!   listener.rs  accept: connection caps → [tls/: the gate's verdict, then rustls, or a
//!                passthrough backend] → HTTP/1.x (h1/) or HTTP/2 (h2/)
//!   phase/       identity → tls → route → access → redirect → upstream → response,
//!                the same for both protocol paths (see phase/mod.rs)
//!   h1/          HTTP/1.x read and written by the proxy itself; upstream streams (h1/streams.rs)
//!   h2/          HTTP/2 served by hyper; upstream requests through hyper's client (pool.rs)
//!   forward.rs   the header rules between client and upstream, for both paths
//!   connect.rs   upstream connections: TCP, and TLS with the route's proxy-ssl-* policy
//!   multiplex.rs HTTP/2 upstreams (GRPC, GRPCS, h2c): multiplexed connections per endpoint
//! ```
//!
//! A request takes the snapshot current when it arrives and keeps its route until it is done, so
//! a configuration change never disturbs a request in flight.

pub mod caps;
pub mod connect;
pub mod forward;
pub mod h1;
pub mod h2;
pub mod idle;
pub mod listener;
pub mod metrics;
pub mod multiplex;
pub mod passthrough;
pub mod phase;
pub mod pool;
pub mod proxy_protocol;
pub mod rate_limit;
pub mod respond;
pub mod rewind;
pub mod settings;
pub mod tls;
pub mod upstream;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{Either, Full};

use crate::proxy::metrics::ProxyMetrics;
use crate::publish::Published;
pub use phase::identity::ConnInfo;
pub(crate) use phase::{Decision, Forward, Outcome, Record};
use pool::{Pool, PoolSettings, UpstreamBody};
pub use settings::ProxySettings;

/// A response body: from an HTTP/1.1 upstream, from an HTTP/2 one, or made by the proxy.
pub type ProxyBody =
    Either<idle::IdleBody<UpstreamBody>, Either<idle::IdleBody<multiplex::H2Body>, Full<Bytes>>>;

pub struct Proxy {
    published: Arc<Published>,
    /// HTTP/2 requests' upstream connections (hyper's client, driven inline).
    pool: Arc<Pool>,
    /// HTTP/2 upstreams' multiplexed connections.
    h2_pool: Arc<multiplex::H2Pool>,
    /// The HTTP/1.x path's upstream connections.
    streams: h1::streams::StreamPool,
    metrics: Arc<ProxyMetrics>,
    settings: ProxySettings,
    /// The buckets of `limit-*`: runtime state beside the snapshot, kept across its swaps.
    rate_limits: rate_limit::RateLimiters,
}

impl Proxy {
    pub fn new(
        published: Arc<Published>,
        metrics: Arc<ProxyMetrics>,
        settings: ProxySettings,
    ) -> Self {
        let pool_settings = PoolSettings {
            idle_timeout: Duration::from_secs(55),
            max_idle_per_endpoint: 256,
        };
        let connectors = Arc::new(connect::Connectors::default());
        Self {
            published,
            pool: Pool::new(pool_settings.clone(), connectors.clone()),
            h2_pool: multiplex::H2Pool::new(connectors.clone()),
            streams: h1::streams::StreamPool::new(pool_settings, connectors),
            metrics,
            settings,
            rate_limits: rate_limit::RateLimiters::default(),
        }
    }

    pub fn settings(&self) -> &ProxySettings {
        &self.settings
    }
}
