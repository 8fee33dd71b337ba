//! MapSync: keeps the kernel gate's HOSTS map in step with the published snapshot, and exports
//! the kernel's counters.
//!
//! ```text
//!   before swap:  HOSTS = names(old) ∪ names(new)   new names admitted before the proxy serves them
//!   swap:         the proxy reads the new snapshot
//!   after swap:   HOSTS = names(new)                old names dropped once the proxy stopped
//! ```
//!
//! Within each sync the gate writes additions before removals, so a name valid in both
//! snapshots is present at every instant (see `gate::policy`).
//!
//! A snapshot not built from synced sources (generation 0, what `Published` holds before the
//! first publish) is never written: the pinned HOSTS of a previous run stay as they are until
//! the first real snapshot replaces them, diffed against what is really in the map.

use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::registry::Registry;

use crate::gate::{CaseAction, Gate, HostAction as KernelAction, HostPolicy, HostRule};
use crate::publish::PublishHook;
use crate::snapshot::Snapshot;
use crate::snapshot::sni::{Admit, HostAction, UnnamedPolicy};

pub struct MapSync {
    gate: Arc<Gate>,
    unnamed: UnnamedPolicy,
    errors: Counter,
}

/// Registers the sync's error counter (in either mode, so the series always exists) and, with a
/// gate, the kernel's own counters, read at scrape time (the gate held weakly, so shutdown can
/// drop it and detach). Returns the error counter, for [`MapSync::new`].
pub fn register_metrics(registry: &mut Registry, gate: Option<&Arc<Gate>>) -> Counter {
    let errors = Counter::default();
    registry.register(
        "gate_sync_errors",
        "Failed writes of the kernel host map",
        errors.clone(),
    );
    if let Some(gate) = gate {
        registry.register_collector(Box::new(KernelCounters(Arc::downgrade(gate))));
    }
    errors
}

impl MapSync {
    pub fn new(gate: Arc<Gate>, unnamed: UnnamedPolicy, errors: Counter) -> Self {
        Self {
            gate,
            unnamed,
            errors,
        }
    }

    fn sync(&self, policy: &HostPolicy) {
        match self.gate.sync_hosts(policy) {
            Ok(report) => {
                if !report.rejected.is_empty() {
                    tracing::warn!(names = ?report.rejected, "host names that cannot be kernel keys (they can never match a ClientHello)");
                }
                tracing::debug!(
                    generation = policy.generation,
                    upserted = report.upserted,
                    removed = report.removed,
                    "kernel host map synced"
                );
            }
            Err(err) => {
                self.errors.inc();
                tracing::error!(%err, generation = policy.generation, "kernel host map sync failed");
            }
        }
    }
}

impl PublishHook for MapSync {
    fn before(&self, new: &Snapshot, old: &Snapshot) {
        if new.generation == 0 {
            return;
        }
        let mut union = kernel_policy(new, &self.unnamed);
        let previous = kernel_policy(old, &self.unnamed);
        for (name, rule) in previous.hosts {
            union.hosts.entry(name).or_insert(rule);
        }
        union.catch_all |= previous.catch_all;
        self.sync(&union);
    }

    fn after(&self, new: &Snapshot, _old: &Snapshot) {
        if new.generation == 0 {
            return;
        }
        self.sync(&kernel_policy(new, &self.unnamed));
    }
}

/// The snapshot's SNI policy as the kernel map holds it.
pub fn kernel_policy(snapshot: &Snapshot, unnamed: &UnnamedPolicy) -> HostPolicy {
    let case = |admit: Admit| match admit {
        Admit::Accept => CaseAction::Pass,
        Admit::Reject => CaseAction::Drop,
    };
    HostPolicy {
        generation: snapshot.generation,
        hosts: snapshot
            .sni
            .names
            .iter()
            .map(|(name, action)| {
                let action = match action {
                    HostAction::Terminate => KernelAction::Pass,
                    HostAction::Passthrough => KernelAction::Passthrough,
                };
                (
                    name.clone(),
                    HostRule {
                        action,
                        route_id: 0,
                    },
                )
            })
            .collect(),
        catch_all: snapshot.sni.catch_all,
        no_sni: case(unnamed.no_sni),
        malformed: case(unnamed.malformed),
        not_tls: case(unnamed.not_tls),
    }
}

/// The kernel's per-CPU counters, summed at scrape time, as `ingress_ebpf_gate_total{counter}`.
/// Holds the gate weakly so shutdown can drop it (and detach) while metrics still exist.
pub struct KernelCounters(pub std::sync::Weak<Gate>);

impl std::fmt::Debug for KernelCounters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KernelCounters")
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CounterLabels {
    counter: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct InterfaceLabels {
    interface: String,
}

impl Collector for KernelCounters {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(gate) = self.0.upgrade() else {
            return Ok(());
        };
        let shadowed = gate.early_reset_shadowed();
        let mut family = encoder.encode_descriptor(
            "ebpf_early_reset_shadowed",
            "1 for each interface where another TC program runs before the early reset (which then may never see a packet: those connections are judged after accept), 0 where it runs first",
            None,
            prometheus_client::metrics::MetricType::Gauge,
        )?;
        for interface in gate.early_reset_interfaces() {
            let value = i64::from(shadowed.iter().any(|s| s.interface == interface));
            let labels = InterfaceLabels { interface };
            prometheus_client::metrics::gauge::ConstGauge::new(value)
                .encode(family.encode_family(&labels)?)?;
        }
        let Ok(counters) = gate.counters() else {
            return Ok(());
        };
        let mut family = encoder.encode_descriptor(
            // The registry adds the `ingress_` prefix.
            "ebpf_gate",
            "Kernel SNI gate counters (summed over CPUs): decisions by reason, and bookkeeping",
            None,
            prometheus_client::metrics::MetricType::Counter,
        )?;
        for (counter, value) in counters.iter() {
            let labels = CounterLabels { counter };
            ConstCounter::new(value).encode(family.encode_family(&labels)?)?;
        }
        Ok(())
    }
}
