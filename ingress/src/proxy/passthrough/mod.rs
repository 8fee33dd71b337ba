//! TLS passthrough: connections whose ClientHello names an `ssl-passthrough` host go, still
//! encrypted, to a ready endpoint of the host's Service; the backend terminates TLS itself.
//!
//! ```text
//!   HTTPS accept → gate verdict / userspace SNI decision = passthrough (tls::accept)
//!     → route by SNI (snapshot.passthrough) → pick an endpoint (P2C on open connections)
//!     → connect (--upstream-connect-timeout)
//!     → eBPF mode:      Gate::splice: the kernel moves the bytes; this task only watches
//!                       (any setup step failing → the userspace copy, counted)
//!       userspace mode: copy both directions through the proxy
//!     → half-closes and resets carried across; --passthrough-idle-timeout closes quiet ones
//! ```
//!
//! Nothing here terminates TLS or reads past the first record, so paths, headers and the
//! proxy's certificates play no part. A connection that cannot reach a backend is reset, as
//! an unknown name is.

mod copy;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::net::TcpStream;

use crate::gate::{Gate, SpliceStep};
use crate::proxy::metrics::ProxyMetrics;
use crate::proxy::metrics::passthrough::{EndLabels, Failure, Mode, ModeLabels, RouteModeLabels};
use crate::proxy::pool::{self, PoolKey};
use crate::proxy::upstream::UpstreamError;
use crate::publish::Published;
use crate::snapshot::Route;
use crate::snapshot::backend::{InFlight, Target};

/// Timeouts, from flags.
#[derive(Clone, Copy, Debug)]
pub struct PassthroughSettings {
    pub connect_timeout: Duration,
    /// A connection on which nothing moved for this long is closed.
    pub idle_timeout: Duration,
}

/// What serving one passthrough connection needs.
pub struct Passthrough<'a> {
    pub published: &'a Published,
    pub metrics: &'a ProxyMetrics,
    /// The kernel gate, in eBPF mode: connections are spliced through it.
    pub gate: Option<&'a Gate>,
    pub settings: PassthroughSettings,
}

impl Passthrough<'_> {
    /// Serves `client`, whose first bytes (`prefix`, the ClientHello) are already read, until
    /// either side ends. Resets the client if there is nowhere to send it.
    pub async fn serve(
        &self,
        client: TcpStream,
        prefix: Vec<u8>,
        sni: Option<&str>,
        peer: SocketAddr,
    ) {
        let metrics = &self.metrics.passthrough;
        let route = sni.and_then(|name| {
            self.published
                .load()
                .passthrough
                .lookup_named(name)
                .cloned()
        });
        let Some(route) = route else {
            metrics.fail(Failure::NoRoute);
            tracing::debug!(%peer, sni = sni.unwrap_or("-"), "no passthrough route; reset");
            reset(client);
            return;
        };
        let (upstream, target, _in_flight) = match self.connect(&route, peer.ip()).await {
            Ok(connected) => connected,
            Err(failure) => {
                metrics.fail(failure);
                tracing::debug!(%peer, sni = sni.unwrap_or("-"), service = %route.backend.service, reason = failure.as_str(), "passthrough upstream unavailable; reset");
                reset(client);
                return;
            }
        };
        let started = Instant::now();
        let bytes = metrics.byte_counters(&route.labels);
        let idle = self.settings.idle_timeout;
        let (mode, end) = match self.gate {
            Some(gate) => match gate.splice(client, upstream, &prefix).await {
                Ok(splice) => {
                    let _active = self.open(&route, Mode::Kernel);
                    let end = splice
                        .run(idle, |moved| {
                            bytes[0].inc_by(moved.to_upstream);
                            bytes[1].inc_by(moved.to_client);
                        })
                        .await;
                    (Mode::Kernel, end)
                }
                Err(unspliced) if unspliced.step == SpliceStep::Prefix => {
                    metrics.fail(Failure::UpstreamWrite);
                    tracing::debug!(%peer, upstream = %target, error = %unspliced.error, "passthrough upstream failed on the first record; reset");
                    reset(unspliced.client);
                    reset(unspliced.upstream);
                    return;
                }
                Err(unspliced) => {
                    metrics.fallback(unspliced.step);
                    tracing::debug!(%peer, step = unspliced.step.as_str(), error = %unspliced.error, "splice failed; copying in userspace");
                    let _active = self.open(&route, Mode::Userspace);
                    let end =
                        copy::run(unspliced.client, unspliced.upstream, &prefix, idle, &bytes)
                            .await;
                    (Mode::Userspace, end)
                }
            },
            None => {
                let _active = self.open(&route, Mode::Userspace);
                (
                    Mode::Userspace,
                    copy::run(client, upstream, &prefix, idle, &bytes).await,
                )
            }
        };
        metrics
            .ended
            .get_or_create(&EndLabels {
                mode: mode.as_str(),
                how: end.as_str(),
            })
            .inc();
        tracing::debug!(
            %peer,
            sni = sni.unwrap_or("-"),
            upstream = %target,
            mode = mode.as_str(),
            end = end.as_str(),
            duration_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
            "passthrough connection ended"
        );
    }

    /// Connects to an endpoint of the route's backend, picked as requests pick theirs; the
    /// endpoint counts the connection as in flight until the guard drops.
    async fn connect(
        &self,
        route: &Arc<Route>,
        client: std::net::IpAddr,
    ) -> Result<(TcpStream, String, Option<InFlight>), Failure> {
        if route.policy.access.refused.is_some() {
            return Err(Failure::Refused);
        }
        if !route.policy.access.sources.admits(client) {
            return Err(Failure::SourceRefused);
        }
        let (key, in_flight) = match &route.backend.target {
            Target::Endpoints(_) => {
                let endpoint = route
                    .backend
                    .pick(route.policy.upstream.balance)
                    .ok_or(Failure::NoEndpoint)?;
                (PoolKey::Addr(endpoint.addr), Some(endpoint.start(false)))
            }
            // Resolved and judged on each connection, as for HTTP routes.
            Target::ExternalName(name) => (PoolKey::Name(name.clone()), None),
            Target::Unavailable => return Err(Failure::NoEndpoint),
        };
        let target = key.to_string();
        match pool::open(&key, self.settings.connect_timeout).await {
            Ok(stream) => Ok((stream, target, in_flight)),
            Err(UpstreamError::ConnectTimeout) => Err(Failure::ConnectTimeout),
            Err(UpstreamError::AddressRefused { refusal, .. }) => {
                self.metrics.count_address_refused(refusal);
                Err(Failure::AddressRefused)
            }
            Err(_) => Err(Failure::ConnectError),
        }
    }

    /// Counts a connection as served in `mode` and open until the guard drops.
    fn open(&self, route: &Route, mode: Mode) -> ActiveGuard {
        let metrics = &self.metrics.passthrough;
        let labels = &route.labels;
        metrics
            .connections
            .get_or_create(&RouteModeLabels {
                namespace: labels.namespace.clone(),
                ingress: labels.ingress.clone(),
                service: labels.service.clone(),
                mode: mode.as_str(),
            })
            .inc();
        let gauge = metrics
            .active
            .get_or_create(&ModeLabels {
                mode: mode.as_str(),
            })
            .clone();
        gauge.inc();
        ActiveGuard(gauge)
    }
}

/// Decrements `passthrough_active` when the connection ends, however it ends.
struct ActiveGuard(prometheus_client::metrics::gauge::Gauge);

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// Closes with an RST (SO_LINGER 0).
fn reset(stream: TcpStream) {
    let _ = socket2::SockRef::from(&stream).set_linger(Some(Duration::ZERO));
    drop(stream);
}
