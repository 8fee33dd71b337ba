//! Prometheus metrics, served on the admin port at `/metrics`.
//!
//! Every metric is registered here, once, so the README's metric reference can be checked
//! against one file. Names follow the `ingress_` prefix; units are in the name.

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::diagnostics::{DiagnosticKind, Severity};
use crate::snapshot::address::Refusal;
use crate::snapshot::sni::GateReason;
use crate::snapshot::{Route, RouteLabels, Snapshot};
use crate::tls::certs::CertSource;

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
    pub severity: &'static str,
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
pub struct ReasonLabels {
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CertLabels {
    pub namespace: String,
    pub secret: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindOnlyLabels {
    pub kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BuildLabels {
    pub version: &'static str,
    pub ebpf_object: &'static str,
}

/// Metric handles for one route, cached on the route by the first request it serves.
#[derive(Debug)]
pub struct RouteStats {
    duration: Histogram,
    ok: Counter,
    labels: RouteLabels,
}

pub struct Metrics {
    registry: Registry,
    unrouted: std::sync::OnceLock<RouteStats>,
    pub requests: Family<RequestLabels, Counter>,
    pub request_duration: Family<RouteOnlyLabels, Histogram>,
    pub snapshot_generation: Gauge,
    pub snapshot_build_seconds: Histogram,
    pub snapshot_hosts: Gauge,
    pub config_errors: Family<KindLabels, Gauge>,
    pub connections: Family<ListenerLabels, Counter>,
    pub connections_active: Family<ListenerLabels, Gauge>,
    pub connections_refused: Family<RefusedLabels, Counter>,
    pub ebpf_enabled: Gauge,
    pub gate_sync_errors: Counter,
    pub ready: Gauge,
    pub tls_handshakes: Family<ResultLabels, Counter>,
    pub sni_gate: Family<ReasonLabels, Counter>,
    pub certificate_expiry: Family<CertLabels, Gauge>,
    pub certificate_expires_in: Family<CertLabels, Gauge>,
    pub kube_watch_errors: Family<KindOnlyLabels, Counter>,
    pub kube_last_sync: Family<KindOnlyLabels, Gauge>,
    pub leader: Gauge,
    pub status_updates: Family<ResultLabels, Counter>,
    pub events_published: Family<ResultLabels, Counter>,
    pub upstream_address_refused: Family<ReasonLabels, Counter>,
    pub admin_connections_refused: Counter,
    pub passthrough: crate::passthrough::PassthroughMetrics,
}

/// Latency buckets from 1 ms to 60 s: proxies serve both cache hits and slow reports.
const LATENCY_BUCKETS: [f64; 14] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 60.0,
];

impl Metrics {
    pub fn new(ebpf_object: bool, gate: Option<Arc<crate::gate::Gate>>) -> Self {
        let mut registry = Registry::with_prefix("ingress");
        if let Some(gate) = &gate {
            registry.register_collector(Box::new(crate::mapsync::KernelCounters(Arc::downgrade(
                gate,
            ))));
        }
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
        let snapshot_generation = Gauge::default();
        registry.register(
            "snapshot_generation",
            "Generation of the routing snapshot being served",
            snapshot_generation.clone(),
        );
        let snapshot_build_seconds =
            Histogram::new([0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5]);
        registry.register(
            "snapshot_build_seconds",
            "Time to build a routing snapshot from the store",
            snapshot_build_seconds.clone(),
        );
        let snapshot_hosts = Gauge::default();
        registry.register(
            "snapshot_hosts",
            "Host patterns in the routing snapshot being served",
            snapshot_hosts.clone(),
        );
        let config_errors = Family::<KindLabels, Gauge>::default();
        registry.register(
            "config_errors",
            "Configuration problems in the snapshot being served, by kind and severity",
            config_errors.clone(),
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
        let ebpf_enabled = Gauge::default();
        registry.register(
            "ebpf_enabled",
            "1 when the kernel SNI gate is loaded, 0 in userspace mode",
            ebpf_enabled.clone(),
        );
        let gate_sync_errors = Counter::default();
        registry.register(
            "gate_sync_errors",
            "Failed writes of the kernel host map",
            gate_sync_errors.clone(),
        );
        let ready = Gauge::default();
        registry.register("ready", "1 when /readyz answers 200", ready.clone());
        let tls_handshakes = Family::<ResultLabels, Counter>::default();
        registry.register(
            "tls_handshakes",
            "TLS handshakes attempted after the SNI gate admitted the connection, by result (ok, failed, timeout)",
            tls_handshakes.clone(),
        );
        let sni_gate = Family::<ReasonLabels, Counter>::default();
        registry.register_collector(Box::new(crate::mapsync::SniGateTotals::new(
            sni_gate.clone(),
            gate.as_ref(),
        )));
        let certificate_expiry = Family::<CertLabels, Gauge>::default();
        registry.register(
            "certificate_expiry_timestamp_seconds",
            "notAfter of each certificate served from a Secret, as Unix time",
            certificate_expiry.clone(),
        );
        let certificate_expires_in = Family::<CertLabels, Gauge>::default();
        registry.register(
            "certificate_expires_in_seconds",
            "Seconds until each certificate served from a Secret expires (negative once expired)",
            certificate_expires_in.clone(),
        );
        let kube_watch_errors = Family::<KindOnlyLabels, Counter>::default();
        registry.register(
            "kube_watch_errors",
            "Kubernetes watch failures by kind; each is retried with backoff (a relist follows)",
            kube_watch_errors.clone(),
        );
        let kube_last_sync = Family::<KindOnlyLabels, Gauge>::default();
        registry.register(
            "kube_last_sync_timestamp_seconds",
            "Unix time of the last list or watch event received, by kind",
            kube_last_sync.clone(),
        );
        let leader = Gauge::default();
        registry.register(
            "leader",
            "1 while this instance holds the status-writer Lease",
            leader.clone(),
        );
        let status_updates = Family::<ResultLabels, Counter>::default();
        registry.register(
            "status_updates",
            "Ingress status writes by result (ok, error)",
            status_updates.clone(),
        );
        let events_published = Family::<ResultLabels, Counter>::default();
        registry.register(
            "events_published",
            "Kubernetes Events published for diagnostics, by result (ok, error)",
            events_published.clone(),
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
        let admin_connections_refused = Counter::default();
        registry.register(
            "admin_connections_refused",
            "Admin-port connections closed on accept because their peer (or remote peers together) reached the connection cap",
            admin_connections_refused.clone(),
        );
        let build_info = Family::<BuildLabels, Gauge>::default();
        build_info
            .get_or_create(&BuildLabels {
                version: env!("CARGO_PKG_VERSION"),
                ebpf_object: if ebpf_object { "embedded" } else { "absent" },
            })
            .set(1);
        registry.register(
            "build_info",
            "Version, and whether the eBPF object is embedded",
            build_info,
        );
        for kind in DiagnosticKind::ALL {
            for severity in [Severity::Error, Severity::Warning] {
                config_errors
                    .get_or_create(&KindLabels {
                        kind: kind.as_str(),
                        severity: severity.as_str(),
                    })
                    .set(0);
            }
        }
        let passthrough = crate::passthrough::PassthroughMetrics::register(&mut registry);
        Self {
            registry,
            unrouted: std::sync::OnceLock::new(),
            requests,
            request_duration,
            snapshot_generation,
            snapshot_build_seconds,
            snapshot_hosts,
            config_errors,
            connections,
            connections_active,
            connections_refused,
            ebpf_enabled,
            gate_sync_errors,
            ready,
            tls_handshakes,
            sni_gate,
            certificate_expiry,
            certificate_expires_in,
            kube_watch_errors,
            kube_last_sync,
            leader,
            status_updates,
            events_published,
            upstream_address_refused,
            admin_connections_refused,
            passthrough,
        }
    }

    pub fn count_address_refused(&self, refusal: Refusal) {
        self.upstream_address_refused
            .get_or_create(&ReasonLabels {
                reason: refusal.as_str(),
            })
            .inc();
    }

    pub fn count_gate(&self, reason: GateReason) {
        self.sni_gate
            .get_or_create(&ReasonLabels {
                reason: reason.as_str(),
            })
            .inc();
    }

    /// Recomputes the seconds-to-expiry gauges; called at scrape time so they move with the
    /// clock, not only when the configuration changes.
    pub fn refresh_certificates(&self, snapshot: &Snapshot, now: i64) {
        self.certificate_expiry.clear();
        self.certificate_expires_in.clear();
        for cert in &snapshot.tls.loaded {
            if let CertSource::Secret(key) = &cert.source {
                let labels = CertLabels {
                    namespace: key.namespace.clone(),
                    secret: key.name.clone(),
                };
                self.certificate_expiry
                    .get_or_create(&labels)
                    .set(cert.not_after);
                self.certificate_expires_in
                    .get_or_create(&labels)
                    .set(cert.not_after - now);
            }
        }
    }

    /// Access to the registry for subsystems that register their own metrics at startup.
    pub fn registry_mut(&mut self) -> &mut Registry {
        &mut self.registry
    }

    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }

    /// Counts one request. The route's handles for its histogram and its 200 counter are looked
    /// up once per snapshot and cached on the route, so the common request takes no lock.
    pub fn observe_request(&self, route: Option<&Route>, status: u16, elapsed: Duration) {
        let stats = match route {
            Some(route) => route.stats.get_or_init(|| self.stats_for(&route.labels)),
            None => self.unrouted.get_or_init(|| {
                self.stats_for(&RouteLabels {
                    namespace: empty(),
                    ingress: empty(),
                    service: empty(),
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

    pub fn observe_snapshot(&self, snapshot: &Snapshot, build_time: Duration) {
        self.snapshot_generation
            .set(i64::try_from(snapshot.generation).unwrap_or(i64::MAX));
        self.snapshot_build_seconds
            .observe(build_time.as_secs_f64());
        self.snapshot_hosts
            .set(i64::try_from(snapshot.hosts.len()).unwrap_or(i64::MAX));
        let counts = snapshot.diagnostic_counts_by_severity();
        for kind in DiagnosticKind::ALL {
            for severity in [Severity::Error, Severity::Warning] {
                let n = counts.get(&(*kind, severity)).copied().unwrap_or(0);
                self.config_errors
                    .get_or_create(&KindLabels {
                        kind: kind.as_str(),
                        severity: severity.as_str(),
                    })
                    .set(i64::try_from(n).unwrap_or(i64::MAX));
            }
        }
    }
}

fn empty() -> Arc<str> {
    Arc::from("")
}
