//! What the proxy counts: requests by route and status, their durations, connections by
//! listener, the userspace gate's decisions, TLS handshakes, refused backend addresses, and
//! passthrough (its own module). Registered into the process's registry at startup.
//!
//! ```text
//!   publish: after swap ── RouteStatsTable: a slot per route of the new snapshot (a route
//!                           kept from the last one keeps its slot)
//!   request done ── table[route] (no label hashing) ── histogram + 200 counter, the slot's
//!                   handles made at the route's first request
//!                   else (a route from an older snapshot) ── the families, by labels
//!
//! A route's series exist from its first request: an idle route costs a slot, not series
//! that every scrape would carry (at 10,000 routes, tens of MiB of text per scrape).
//! ```
//!
//! The per-route handles live here, beside the snapshot and keyed by route, so building a
//! snapshot stays pure and the snapshot holds no telemetry.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use arc_swap::ArcSwap;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;

pub mod compat;
pub mod passthrough;

use crate::gate::{Gate, counter};
use crate::proxy::rate_limit::Limited;
use crate::publish::PublishHook;
use crate::snapshot::address::Refusal;
use crate::snapshot::sni::Reason;
use crate::snapshot::{Route, RouteLabels, Snapshot};
use passthrough::PassthroughMetrics;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub namespace: Arc<str>,
    pub ingress: Arc<str>,
    pub service: Arc<str>,
    pub status: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteOnlyLabels {
    pub namespace: Arc<str>,
    pub ingress: Arc<str>,
    pub service: Arc<str>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    pub kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AuthLabels {
    pub kind: &'static str,
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ListenerLabels {
    pub listener: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RefusedLabels {
    pub listener: &'static str,
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RateLimitedLabels {
    pub namespace: Arc<str>,
    pub ingress: Arc<str>,
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub reason: &'static str,
}

/// Latency buckets from 1 ms to 60 s: proxies serve both cache hits and slow reports.
const LATENCY_BUCKETS: [f64; 14] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 60.0,
];

pub struct ProxyMetrics {
    requests: Family<RequestLabels, Counter>,
    pub connections: Family<ListenerLabels, Counter>,
    pub connections_active: Family<ListenerLabels, Gauge>,
    pub connections_refused: Family<RefusedLabels, Counter>,
    /// Connections closed because their PROXY protocol header was missing or bad.
    pub proxy_protocol_errors: Family<RefusedLabels, Counter>,
    pub tls_handshakes: Family<ResultLabels, Counter>,
    /// The gate's decisions made after accept (userspace mode, or what the kernel left to
    /// userspace); `ingress_sni_gate_total` adds the kernel's before-accept ones to these.
    pub sni_gate: Family<ReasonLabels, Counter>,
    upstream_address_refused: Family<ReasonLabels, Counter>,
    upstream_errors: Family<KindLabels, Counter>,
    auth_requests: Family<AuthLabels, Counter>,
    rate_limited: Family<RateLimitedLabels, Counter>,
    pub passthrough: PassthroughMetrics,
    routes: RouteStatsTable,
    unrouted: OnceLock<RouteStats>,
    /// `--metrics-compat ingress-nginx`.
    pub compat: Option<compat::CompatMetrics>,
}

impl ProxyMetrics {
    /// `gate`, in eBPF mode, adds its before-accept resets to `ingress_sni_gate_total`.
    pub fn register(
        registry: &mut Registry,
        gate: Option<&Arc<Gate>>,
        compat: Option<compat::CompatMetrics>,
    ) -> Arc<ProxyMetrics> {
        let requests = Family::<RequestLabels, Counter>::default();
        registry.register(
            "requests",
            "HTTP requests by Ingress, Service and response status",
            requests.clone(),
        );
        let request_duration = Family::<RouteOnlyLabels, Histogram>::new_with_constructor(
            (|| Histogram::new(LATENCY_BUCKETS)) as fn() -> Histogram,
        );
        registry.register(
            "request_duration_seconds",
            "Time from request to response headers, by Ingress and Service",
            request_duration.clone(),
        );
        let connections = Family::<ListenerLabels, Counter>::default();
        registry.register(
            "connections",
            "Accepted client connections by listener",
            connections.clone(),
        );
        let connections_active = Family::<ListenerLabels, Gauge>::default();
        registry.register(
            "connections_active",
            "Open client connections by listener",
            connections_active.clone(),
        );
        let connections_refused = Family::<RefusedLabels, Counter>::default();
        registry.register(
            "connections_refused",
            "Client connections closed on accept because a connection cap was reached, by listener and cap (max_connections, max_connections_per_client)",
            connections_refused.clone(),
        );
        let proxy_protocol_errors = Family::<RefusedLabels, Counter>::default();
        registry.register(
            "proxy_protocol_errors",
            "Connections closed because they did not start with a valid PROXY protocol header (--use-proxy-protocol), by listener and reason (timeout, closed, invalid, too_long)",
            proxy_protocol_errors.clone(),
        );
        let tls_handshakes = Family::<ResultLabels, Counter>::default();
        registry.register(
            "tls_handshakes",
            "TLS handshakes attempted after the SNI gate admitted the connection, by result (ok, failed, timeout)",
            tls_handshakes.clone(),
        );
        let upstream_address_refused = Family::<ReasonLabels, Counter>::default();
        for refusal in Refusal::ALL {
            // A zero sample for each reason, so alerts see the series before it first moves.
            drop(upstream_address_refused.get_or_create(&ReasonLabels {
                reason: refusal.as_str(),
            }));
        }
        registry.register(
            "upstream_address_refused",
            "Connections not made because an ExternalName resolved to an address refused as a backend, by reason (loopback, link_local, unspecified, host_address)",
            upstream_address_refused.clone(),
        );
        let upstream_errors = Family::<KindLabels, Counter>::default();
        registry.register(
            "upstream_errors",
            "Requests the proxy answered itself because the upstream failed, by kind (connect, connect_timeout, response_timeout, protocol, tls_certificate, tls_handshake, tls_config, no_endpoints, address_refused, refused)",
            upstream_errors.clone(),
        );
        let auth_requests = Family::<AuthLabels, Counter>::default();
        registry.register(
            "auth_requests",
            "Authentication decisions on routes with basic or external auth, by kind (basic, external) and result (allowed, cached, denied, forbidden, error)",
            auth_requests.clone(),
        );
        let rate_limited = Family::<RateLimitedLabels, Counter>::default();
        registry.register(
            "rate_limited",
            "Requests refused by limit-rps, limit-rpm or limit-connections, by Ingress and reason (rps, rpm, connections, overflow: the zone is full of active clients)",
            rate_limited.clone(),
        );
        let sni_gate = Family::<ReasonLabels, Counter>::default();
        registry.register_collector(Box::new(SniGateTotals::new(sni_gate.clone(), gate)));
        let passthrough = PassthroughMetrics::register(registry);
        let metrics = ProxyMetrics {
            routes: RouteStatsTable::new(requests.clone(), request_duration),
            requests,
            connections,
            connections_active,
            connections_refused,
            proxy_protocol_errors,
            tls_handshakes,
            sni_gate,
            upstream_address_refused,
            upstream_errors,
            auth_requests,
            rate_limited,
            passthrough,
            unrouted: OnceLock::new(),
            compat,
        };
        Arc::new(metrics)
    }

    /// The publish hook that keeps the per-route handles in step with the snapshot.
    pub fn route_table(self: &Arc<Self>) -> Arc<dyn PublishHook> {
        Arc::new(RouteTableHook(self.clone()))
    }

    /// Counts one request. Routes of the published snapshot find their handles in the table;
    /// the rare request on a route of an older snapshot, or of a newer one whose publish has
    /// not finished, goes through the families.
    pub fn observe_request(&self, route: Option<&Arc<Route>>, status: u16, elapsed: Duration) {
        let table = self.routes.current.load();
        let found;
        let stats = match route {
            Some(route) => match table.get(&key(route)) {
                Some((_, slot)) => slot.get_or_init(|| self.routes.stats_for(&route.labels)),
                None => {
                    found = self.routes.stats_for(&route.labels);
                    &found
                }
            },
            None => self.unrouted.get_or_init(|| {
                self.routes.stats_for(&RouteLabels {
                    namespace: empty(),
                    ingress: empty(),
                    service: empty(),
                    path: empty(),
                })
            }),
        };
        stats.duration.observe(elapsed.as_secs_f64());
        if status == 200 {
            stats.ok.inc();
        } else {
            let labels = &stats.labels;
            self.requests
                .get_or_create(&RequestLabels {
                    namespace: labels.namespace.clone(),
                    ingress: labels.ingress.clone(),
                    service: labels.service.clone(),
                    status,
                })
                .inc();
        }
    }

    pub fn count_address_refused(&self, refusal: Refusal) {
        self.upstream_address_refused
            .get_or_create(&ReasonLabels {
                reason: refusal.as_str(),
            })
            .inc();
    }

    /// Counts a request that failed upstream, by [`UpstreamError::kind`].
    ///
    /// [`UpstreamError::kind`]: crate::proxy::upstream::UpstreamError::kind
    pub fn count_upstream_error(&self, kind: &'static str) {
        self.upstream_errors
            .get_or_create(&KindLabels { kind })
            .inc();
    }

    /// Counts one authentication decision (`ingress_auth_requests_total`).
    pub fn count_auth(&self, kind: &'static str, result: &'static str) {
        self.auth_requests
            .get_or_create(&AuthLabels { kind, result })
            .inc();
    }

    /// Counts a request refused by the route's rate limits.
    pub fn count_rate_limited(&self, route: &RouteLabels, limited: Limited) {
        self.rate_limited
            .get_or_create(&RateLimitedLabels {
                namespace: route.namespace.clone(),
                ingress: route.ingress.clone(),
                reason: limited.as_str(),
            })
            .inc();
    }

    pub fn count_gate(&self, reason: Reason) {
        self.sni_gate
            .get_or_create(&ReasonLabels {
                reason: reason.as_str(),
            })
            .inc();
    }

    /// Routes with handles in the table (for tests).
    pub fn tracked_routes(&self) -> usize {
        self.routes.current.load().len()
    }
}

fn empty() -> Arc<str> {
    Arc::from("")
}

/// Metric handles for one route.
#[derive(Clone, Debug)]
struct RouteStats {
    duration: Histogram,
    ok: Counter,
    labels: RouteLabels,
}

type Table = HashMap<usize, (Arc<Route>, Arc<OnceLock<RouteStats>>), foldhash::fast::RandomState>;

/// Handles by route, keyed by the route's address. Each entry holds its route, so an address
/// in the table is never reused by another route while the entry exists.
struct RouteStatsTable {
    current: ArcSwap<Table>,
    requests: Family<RequestLabels, Counter>,
    request_duration: Family<RouteOnlyLabels, Histogram>,
}

fn key(route: &Arc<Route>) -> usize {
    Arc::as_ptr(route) as usize
}

impl RouteStatsTable {
    fn new(
        requests: Family<RequestLabels, Counter>,
        request_duration: Family<RouteOnlyLabels, Histogram>,
    ) -> Self {
        Self {
            current: ArcSwap::from_pointee(Table::default()),
            requests,
            request_duration,
        }
    }

    fn stats_for(&self, labels: &RouteLabels) -> RouteStats {
        let route = RouteOnlyLabels {
            namespace: labels.namespace.clone(),
            ingress: labels.ingress.clone(),
            service: labels.service.clone(),
        };
        let ok = RequestLabels {
            namespace: labels.namespace.clone(),
            ingress: labels.ingress.clone(),
            service: labels.service.clone(),
            status: 200,
        };
        RouteStats {
            duration: self.request_duration.get_or_create(&route).clone(),
            ok: self.requests.get_or_create(&ok).clone(),
            labels: labels.clone(),
        }
    }

    /// The table for `snapshot`'s routes, reusing the handles of routes already in it.
    fn with(&self, snapshot: &Snapshot) -> Table {
        let old = self.current.load();
        let mut table = Table::with_capacity_and_hasher(old.len(), Default::default());
        let routes = snapshot.routes();
        for route in routes {
            let k = key(route);
            if table.contains_key(&k) {
                continue;
            }
            let slot = match old.get(&k) {
                Some((_, slot)) => slot.clone(),
                None => Arc::default(),
            };
            table.insert(k, (route.clone(), slot));
        }
        table
    }
}

/// Replaces the table with the new snapshot's routes once it is visible. Nothing is done before
/// the swap, which would delay every publish by a copy of the table: a request on a route not
/// yet in the table counts through the metric families, into the same series.
struct RouteTableHook(Arc<ProxyMetrics>);

impl PublishHook for RouteTableHook {
    fn before(&self, _new: &Snapshot, _old: &Snapshot) {}

    fn after(&self, new: &Snapshot, _old: &Snapshot) {
        let routes = &self.0.routes;
        routes.current.store(Arc::new(routes.with(new)));
    }
}

/// `ingress_sni_gate_total{reason}`: every HTTPS connection the gate decided, in either mode and
/// at either stage — the proxy's own count after accept, plus, in eBPF mode, the connections the
/// kernel reset before accept (counted since this process loaded the gate, as the proxy's are).
struct SniGateTotals {
    after_accept: Family<ReasonLabels, Counter>,
    gate: Option<(std::sync::Weak<Gate>, [u64; BEFORE_ACCEPT.len()])>,
}

/// The reasons a connection can be reset before accept, with their kernel counters.
const BEFORE_ACCEPT: [(Reason, u32); 5] = [
    (Reason::Unknown, counter::RESET_BEFORE_ACCEPT_UNKNOWN),
    (Reason::NoSni, counter::RESET_BEFORE_ACCEPT_NO_SNI),
    (Reason::Malformed, counter::RESET_BEFORE_ACCEPT_MALFORMED),
    (Reason::NotTls, counter::RESET_BEFORE_ACCEPT_NOT_TLS),
    (
        Reason::SourceRefused,
        counter::RESET_BEFORE_ACCEPT_SOURCE_REFUSED,
    ),
];

impl SniGateTotals {
    fn new(after_accept: Family<ReasonLabels, Counter>, gate: Option<&Arc<Gate>>) -> Self {
        let gate = gate.map(|gate| {
            let baseline = before_accept(gate);
            (Arc::downgrade(gate), baseline)
        });
        SniGateTotals { after_accept, gate }
    }
}

/// The kernel's before-accept counts, in `BEFORE_ACCEPT` order (zeros if unreadable).
fn before_accept(gate: &Gate) -> [u64; BEFORE_ACCEPT.len()] {
    let counters = gate.counters().ok();
    BEFORE_ACCEPT.map(|(_, index)| counters.as_ref().map_or(0, |c| c.get(index)))
}

impl std::fmt::Debug for SniGateTotals {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SniGateTotals")
    }
}

impl Collector for SniGateTotals {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let kernel = self
            .gate
            .as_ref()
            .and_then(|(gate, baseline)| Some((gate.upgrade()?, baseline)))
            .map(|(gate, baseline)| {
                let now = before_accept(&gate);
                std::array::from_fn::<u64, { BEFORE_ACCEPT.len() }, _>(|i| {
                    now[i].saturating_sub(baseline[i])
                })
            })
            .unwrap_or_default();
        let mut family = encoder.encode_descriptor(
            "sni_gate",
            "HTTPS connections decided by the SNI gate, by reason (pass, unknown, no_sni, malformed, not_tls, passthrough, source_refused); in eBPF mode this includes connections the kernel reset before accept",
            None,
            prometheus_client::metrics::MetricType::Counter,
        )?;
        for reason in Reason::ALL {
            let labels = ReasonLabels {
                reason: reason.as_str(),
            };
            let before = BEFORE_ACCEPT
                .iter()
                .zip(kernel)
                .find(|((r, _), _)| *r == reason)
                .map_or(0, |(_, n)| n);
            let value = self.after_accept.get_or_create(&labels).get() + before;
            ConstCounter::new(value).encode(family.encode_family(&labels)?)?;
        }
        Ok(())
    }
}
