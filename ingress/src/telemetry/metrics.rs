//! The registry, the build and mode gauges, and the metrics read from the published snapshot.
//!
//! Names follow the `ingress_` prefix; units are in the name. docs/metrics.md lists every one.

use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::registry::Registry;

use crate::diagnostics::{DiagnosticKind, Severity};
use crate::publish::Published;
use crate::snapshot::Snapshot;
use crate::snapshot::certs::CertSource;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    version: &'static str,
    ebpf_object: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: &'static str,
    severity: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CertLabels {
    namespace: String,
    secret: String,
}

/// The process's registry. Subsystems register into it through [`Telemetry::registry_mut`]
/// while the process starts; afterwards it is shared read-only and encoded on each scrape.
pub struct Telemetry {
    registry: Registry,
    /// `--metrics-compat`: another controller's names, whole (no `ingress_` prefix).
    compat: Registry,
    /// 1 when the kernel gate is loaded, 0 in userspace mode.
    pub ebpf_enabled: Gauge,
}

impl Telemetry {
    /// The registry with the build gauge, the mode gauge and the snapshot's metrics.
    pub fn new(ebpf_object: bool, published: Arc<Published>) -> Self {
        let mut registry = Registry::with_prefix("ingress");
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
        let ebpf_enabled = Gauge::default();
        registry.register(
            "ebpf_enabled",
            "1 when the kernel SNI gate is loaded, 0 in userspace mode",
            ebpf_enabled.clone(),
        );
        registry.register_collector(Box::new(SnapshotMetrics { published }));
        Self {
            registry,
            compat: Registry::default(),
            ebpf_enabled,
        }
    }

    /// For the `--metrics-compat` families, registered under their own whole names.
    pub fn compat_registry_mut(&mut self) -> &mut Registry {
        &mut self.compat
    }

    /// For subsystems registering their metrics at startup.
    pub fn registry_mut(&mut self) -> &mut Registry {
        &mut self.registry
    }

    /// The OpenMetrics text of every registered metric.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        let mut compat = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut compat, &self.compat);
        // One exposition: the first one's end marker goes, the second's closes both.
        if compat.len() > EOF.len() {
            if out.ends_with(EOF) {
                out.truncate(out.len() - EOF.len());
            }
            out.push_str(&compat);
        }
        out
    }
}

const EOF: &str = "# EOF\n";

/// What the published snapshot says, read once per scrape from the snapshot current then:
/// its generation and size, its diagnostics by kind, and its certificates' expiry (against the
/// clock at scrape time, so the seconds-to-expiry move without a configuration change).
struct SnapshotMetrics {
    published: Arc<Published>,
}

impl std::fmt::Debug for SnapshotMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SnapshotMetrics")
    }
}

impl Collector for SnapshotMetrics {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let snapshot = self.published.load_full();
        gauge(
            &mut encoder,
            "snapshot_generation",
            "Generation of the routing snapshot being served",
            saturate(snapshot.generation),
        )?;
        gauge(
            &mut encoder,
            "snapshot_hosts",
            "Host patterns in the routing snapshot being served",
            saturate(snapshot.hosts.len() as u64),
        )?;
        encode_diagnostics(&mut encoder, &snapshot)?;
        encode_certificates(&mut encoder, &snapshot, crate::clock::unix_now())
    }
}

fn saturate(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn gauge(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    value: i64,
) -> Result<(), std::fmt::Error> {
    let gauge = ConstGauge::new(value);
    let metric = encoder.encode_descriptor(name, help, None, gauge.metric_type())?;
    gauge.encode(metric)
}

/// Every kind and severity, zero or not, so alerts see each series before it first moves.
fn encode_diagnostics(
    encoder: &mut DescriptorEncoder,
    snapshot: &Snapshot,
) -> Result<(), std::fmt::Error> {
    let counts = snapshot.diagnostic_counts_by_severity();
    let mut family = encoder.encode_descriptor(
        "config_errors",
        "Configuration problems in the snapshot being served, by kind and severity",
        None,
        MetricType::Gauge,
    )?;
    for kind in DiagnosticKind::ALL {
        for severity in [Severity::Error, Severity::Warning] {
            let n = counts.get(&(*kind, severity)).copied().unwrap_or(0);
            let labels = KindLabels {
                kind: kind.as_str(),
                severity: severity.as_str(),
            };
            ConstGauge::new(saturate(n as u64)).encode(family.encode_family(&labels)?)?;
        }
    }
    Ok(())
}

fn encode_certificates(
    encoder: &mut DescriptorEncoder,
    snapshot: &Snapshot,
    now: i64,
) -> Result<(), std::fmt::Error> {
    // One series per Secret, however many hosts or Ingresses use it.
    let from_secrets: std::collections::BTreeMap<(String, String), i64> = snapshot
        .tls
        .loaded
        .iter()
        .filter_map(|cert| match &cert.source {
            CertSource::Secret(key) => {
                Some(((key.namespace.clone(), key.name.clone()), cert.not_after))
            }
            CertSource::SelfSigned => None,
        })
        .collect();
    let from_secrets: Vec<(CertLabels, i64)> = from_secrets
        .into_iter()
        .map(|((namespace, secret), not_after)| (CertLabels { namespace, secret }, not_after))
        .collect();
    let mut family = encoder.encode_descriptor(
        "certificate_expiry_timestamp_seconds",
        "notAfter of each certificate served from a Secret, as Unix time",
        None,
        MetricType::Gauge,
    )?;
    for (labels, not_after) in &from_secrets {
        ConstGauge::new(*not_after).encode(family.encode_family(labels)?)?;
    }
    let mut family = encoder.encode_descriptor(
        "certificate_expires_in_seconds",
        "Seconds until each certificate served from a Secret expires (negative once expired)",
        None,
        MetricType::Gauge,
    )?;
    for (labels, not_after) in &from_secrets {
        ConstGauge::new(not_after - now).encode(family.encode_family(labels)?)?;
    }
    Ok(())
}
