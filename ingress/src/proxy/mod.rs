//! The HTTP proxy: listeners, the TLS accept phase, the two protocol paths, and the request
//! phases they share.
//!
//! ```text
//!   listener.rs  accept: connection caps → [tls/: the gate's verdict, then rustls, or a
//!                passthrough backend] → HTTP/1.x (h1/) or HTTP/2 (h2/)
//!   phase/       identity → tls → route → access → redirect → upstream → response,
//!                the same for both protocol paths (see phase/mod.rs)
//!   h1/          HTTP/1.x read and written by the proxy itself
//!   streams.rs   kept HTTP/1.1 upstream connections, for both client protocols
//!   h2/          HTTP/2 served by hyper; HTTP/1.1 upstreams through pool.rs, on h1's streams
//!   forward.rs   the header rules between client and upstream, for both paths
//!   connect.rs   upstream connections: TCP, and TLS with the route's proxy-ssl-* policy
//!   auth_client.rs  connections to auth services (auth-url), on connect.rs
//!   access_log.rs, log_lines.rs  access-log lines, and the buffer every log line goes through
//!   multiplex.rs HTTP/2 upstreams (GRPC, GRPCS, h2c): multiplexed connections per endpoint
//! ```
//!
//! A request takes the snapshot current when it arrives and keeps its route until it is done, so
//! a configuration change never disturbs a request in flight.

pub mod access_log;
pub mod auth_client;
pub mod caps;
pub mod connect;
pub mod forward;
pub mod h1;
pub mod h2;
pub mod idle;
pub mod kept;
pub mod listener;
pub mod log_lines;
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
pub mod streams;
pub mod tls;
pub mod trace;
pub mod upstream;

use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{Either, Full};

use crate::proxy::metrics::ProxyMetrics;
use crate::publish::Published;
pub use phase::identity::ConnInfo;
pub(crate) use phase::{Decision, Forward, Outcome, Record};
use pool::{Pool, PoolLimits, PoolLimitsHook, UpstreamBody};
pub use settings::ProxySettings;

/// A response body: from an HTTP/1.1 upstream, from an HTTP/2 one, or made by the proxy.
pub type ProxyBody =
    Either<idle::IdleBody<UpstreamBody>, Either<idle::IdleBody<multiplex::H2Body>, Full<Bytes>>>;

pub struct Proxy {
    published: Arc<Published>,
    /// HTTP/2 requests' exchanges with HTTP/1.1 upstreams, on `streams`' connections.
    pool: Arc<Pool>,
    /// HTTP/2 upstreams' multiplexed connections.
    h2_pool: Arc<multiplex::H2Pool>,
    /// Kept HTTP/1.1 upstream connections, for both client protocols.
    streams: Arc<streams::StreamPool>,
    metrics: Arc<ProxyMetrics>,
    settings: ProxySettings,
    /// `--otlp-endpoint`: request spans; `None` (the default) costs nothing.
    tracing: Option<Arc<trace::Tracing>>,
    /// Basic auth's recent successes and its limit on concurrent bcrypt checks; auth services'
    /// connections and cached answers.
    auth: phase::auth::AuthState,
    /// The buckets of `limit-*`: runtime state beside the snapshot, kept across its swaps.
    rate_limits: rate_limit::RateLimiters,
    /// Kept connections to error backends (`custom-http-errors`).
    pages: phase::error_page::PagePool,
}

impl Proxy {
    pub fn new(
        published: Arc<Published>,
        metrics: Arc<ProxyMetrics>,
        settings: ProxySettings,
    ) -> Self {
        // The ConfigMap's upstream-keepalive-* apply live: the hook follows every snapshot
        // published from now on, and the current one is read after it is added, so none is
        // missed.
        let limits = PoolLimits::new(&published.load().global.keepalive);
        published.add_hook(Arc::new(PoolLimitsHook(limits.clone())));
        limits.set(&published.load().global.keepalive);
        let connectors = Arc::new(connect::Connectors::default());
        let streams = Arc::new(streams::StreamPool::new(limits, connectors.clone()));
        Self {
            published,
            pool: Pool::new(streams.clone()),
            h2_pool: multiplex::H2Pool::new(connectors.clone()),
            streams,
            metrics,
            settings,
            tracing: None,
            auth: phase::auth::AuthState::new(connectors),
            rate_limits: rate_limit::RateLimiters::default(),
            pages: phase::error_page::PagePool::default(),
        }
    }

    /// Whether the PROXY protocol header a connection from `peer` sent is believed: with
    /// `proxy-real-ip-cidr` set, only from those ranges (ingress-nginx's `set_real_ip_from`
    /// for `real_ip_header proxy_protocol`), else from any peer (ingress-nginx's default,
    /// `0.0.0.0/0`). An unbelieved header is still required and read, and the peer stays the
    /// client.
    pub fn believes_proxy_header_from(&self, peer: std::net::IpAddr) -> bool {
        let peer = peer.to_canonical();
        self.published
            .load()
            .global
            .forwarded
            .trusted
            .as_ref()
            .is_none_or(|nets| nets.iter().any(|net| net.contains(&peer)))
    }

    /// Traces requests with `tracing` (W3C trace context and OpenTelemetry spans).
    pub fn with_tracing(mut self, tracing: Option<Arc<trace::Tracing>>) -> Self {
        self.tracing = tracing;
        self
    }

    pub fn settings(&self) -> &ProxySettings {
        &self.settings
    }
}
