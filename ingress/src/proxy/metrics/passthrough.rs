//! Passthrough metrics: connections and bytes per route, how connections ended, and what
//! failed. Registered with the rest of the proxy's metrics.

use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::registry::Registry;

use crate::gate::SpliceStep;
use crate::snapshot::RouteLabels;

/// `kernel`: spliced by the gate; `userspace`: copied by the proxy (userspace mode, or a
/// fallback from a failed splice).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Mode {
    Kernel,
    Userspace,
}

impl Mode {
    pub fn as_str(&self) -> &'static str {
        match self {
            Mode::Kernel => "kernel",
            Mode::Userspace => "userspace",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteModeLabels {
    pub namespace: Arc<str>,
    pub ingress: Arc<str>,
    pub service: Arc<str>,
    pub mode: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteDirectionLabels {
    pub namespace: Arc<str>,
    pub ingress: Arc<str>,
    pub service: Arc<str>,
    /// `upstream` (client to backend) or `client` (backend to client).
    pub direction: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ModeLabels {
    pub mode: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EndLabels {
    pub mode: &'static str,
    pub how: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StepLabels {
    pub step: &'static str,
}

/// Why a passthrough connection could not be served; it is reset.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Failure {
    /// The name has no passthrough route in the current snapshot (it changed since the gate
    /// decided).
    NoRoute,
    /// The route's Service has no ready endpoint.
    NoEndpoint,
    ConnectError,
    ConnectTimeout,
    /// The upstream failed while taking the client's first bytes.
    UpstreamWrite,
    /// The route's Ingress is not served (an access-control annotation it cannot honour).
    Refused,
    /// An ExternalName resolved to an address refused as a backend.
    AddressRefused,
    /// The client's address is outside the route's source ranges.
    SourceRefused,
}

impl Failure {
    pub const ALL: [Failure; 8] = [
        Failure::NoRoute,
        Failure::NoEndpoint,
        Failure::ConnectError,
        Failure::ConnectTimeout,
        Failure::UpstreamWrite,
        Failure::Refused,
        Failure::AddressRefused,
        Failure::SourceRefused,
    ];

    pub fn as_str(&self) -> &'static str {
        match self {
            Failure::NoRoute => "no_route",
            Failure::NoEndpoint => "no_endpoint",
            Failure::ConnectError => "connect_error",
            Failure::ConnectTimeout => "connect_timeout",
            Failure::UpstreamWrite => "upstream_write",
            Failure::Refused => "refused",
            Failure::AddressRefused => "address_refused",
            Failure::SourceRefused => "source_refused",
        }
    }
}

/// The fallback steps that can be counted (the prefix step is a failure, not a fallback).
const FALLBACK_STEPS: [SpliceStep; 5] = [
    SpliceStep::Socket,
    SpliceStep::Entries,
    SpliceStep::UpstreamSocket,
    SpliceStep::ClientSocket,
    SpliceStep::Kernel,
];

pub struct PassthroughMetrics {
    pub connections: Family<RouteModeLabels, Counter>,
    pub bytes: Family<RouteDirectionLabels, Counter>,
    pub active: Family<ModeLabels, Gauge>,
    pub ended: Family<EndLabels, Counter>,
    pub failures: Family<ReasonLabels, Counter>,
    pub fallbacks: Family<StepLabels, Counter>,
}

impl PassthroughMetrics {
    pub fn register(registry: &mut Registry) -> PassthroughMetrics {
        let metrics = PassthroughMetrics {
            connections: Family::default(),
            bytes: Family::default(),
            active: Family::default(),
            ended: Family::default(),
            failures: Family::default(),
            fallbacks: Family::default(),
        };
        registry.register(
            "passthrough_connections",
            "TLS passthrough connections by route and mode (kernel: spliced; userspace: copied)",
            metrics.connections.clone(),
        );
        registry.register(
            "passthrough_bytes",
            "TLS passthrough bytes by route and direction (upstream: from the client; client: to it)",
            metrics.bytes.clone(),
        );
        registry.register(
            "passthrough_active",
            "Open TLS passthrough connections by mode",
            metrics.active.clone(),
        );
        registry.register(
            "passthrough_ended",
            "Ended TLS passthrough connections by mode and how (closed, client_reset, upstream_reset, idle)",
            metrics.ended.clone(),
        );
        registry.register(
            "passthrough_failures",
            "TLS passthrough connections reset before reaching a backend, by reason",
            metrics.failures.clone(),
        );
        registry.register(
            "passthrough_fallbacks",
            "TLS passthrough connections copied in userspace because splicing failed, by step",
            metrics.fallbacks.clone(),
        );
        for mode in [Mode::Kernel, Mode::Userspace] {
            let _ = metrics.active.get_or_create(&ModeLabels {
                mode: mode.as_str(),
            });
        }
        for failure in Failure::ALL {
            let _ = metrics.failures.get_or_create(&ReasonLabels {
                reason: failure.as_str(),
            });
        }
        for step in FALLBACK_STEPS {
            let _ = metrics.fallbacks.get_or_create(&StepLabels {
                step: step.as_str(),
            });
        }
        registry.register_collector(Box::new(RuntimeTasks));
        metrics
    }

    pub fn fail(&self, failure: Failure) {
        self.failures
            .get_or_create(&ReasonLabels {
                reason: failure.as_str(),
            })
            .inc();
    }

    pub fn fallback(&self, step: SpliceStep) {
        self.fallbacks
            .get_or_create(&StepLabels {
                step: step.as_str(),
            })
            .inc();
    }

    /// The byte counters of one route: (client → upstream, upstream → client).
    pub fn byte_counters(&self, route: &RouteLabels) -> [Counter; 2] {
        ["upstream", "client"].map(|direction| {
            self.bytes
                .get_or_create(&RouteDirectionLabels {
                    namespace: route.namespace.clone(),
                    ingress: route.ingress.clone(),
                    service: route.service.clone(),
                    direction,
                })
                .clone()
        })
    }
}

/// The runtime's live task count at scrape time: each passthrough connection is one task, so a
/// leak of connections shows here as well as in `passthrough_active`.
#[derive(Debug)]
struct RuntimeTasks;

impl Collector for RuntimeTasks {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return Ok(());
        };
        let tasks = i64::try_from(runtime.metrics().num_alive_tasks()).unwrap_or(i64::MAX);
        let gauge = ConstGauge::new(tasks);
        let metric = encoder.encode_descriptor(
            // The registry adds the `ingress_` prefix.
            "runtime_alive_tasks",
            "Tasks alive in the proxy's async runtime",
            None,
            gauge.metric_type(),
        )?;
        gauge.encode(metric)
    }
}
