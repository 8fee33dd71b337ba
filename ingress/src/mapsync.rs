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
//! snapshots is present at every instant (see `gate::policy`); a host's source ranges
//! (SOURCES) are written before any name points at them and removed after none does, and a
//! name whose ranges change is not judged by the kernel until the swap (`GateSources::union`).
//!
//! A snapshot not built from synced sources (generation 0, what `Published` holds before the
//! first publish) is never written: the pinned HOSTS of a previous run stay as they are until
//! the first real snapshot replaces them, diffed against what is really in the map.

use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::registry::Registry;

use crate::gate::{Gate, GateError, SyncReport};
use crate::publish::PublishHook;
use crate::snapshot::Snapshot;
use crate::snapshot::gate_sources::GateSources;
use crate::snapshot::sni::SniPolicy;

/// Where the kernel's host map is written: the gate, or a recording stand-in in tests.
pub trait HostMap: Send + Sync {
    /// Moves the map to `policy` of snapshot `generation`, adding before removing.
    fn sync_hosts(&self, policy: &SniPolicy, generation: u64) -> Result<SyncReport, GateError>;

    /// Moves the map to snapshot `generation` when it already holds `policy`'s names.
    fn sync_generation(&self, policy: &SniPolicy, generation: u64) -> Result<(), GateError> {
        self.sync_hosts(policy, generation).map(|_| ())
    }
}

impl HostMap for Gate {
    fn sync_hosts(&self, policy: &SniPolicy, generation: u64) -> Result<SyncReport, GateError> {
        Gate::sync_hosts(self, policy, generation)
    }

    fn sync_generation(&self, policy: &SniPolicy, generation: u64) -> Result<(), GateError> {
        Gate::sync_config(self, policy, generation)
    }
}

pub struct MapSync<M: HostMap = Gate> {
    map: Arc<M>,
    errors: Counter,
    /// Whether the map holds the last published snapshot's names (every sync since the last
    /// full one succeeded): then a publish that keeps the names only records its generation,
    /// rather than converting and diffing every name twice.
    in_step: std::sync::atomic::AtomicBool,
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

impl<M: HostMap> MapSync<M> {
    pub fn new(map: Arc<M>, errors: Counter) -> Self {
        Self {
            map,
            errors,
            in_step: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Whether the publish from `old` to `new` keeps every name and every name's source
    /// policy, and the map is known to hold them (`old` was written, and nothing failed since).
    fn names_unchanged(&self, new: &Snapshot, old: &Snapshot) -> bool {
        old.generation != 0
            && self.in_step.load(std::sync::atomic::Ordering::Acquire)
            && new.sni.names == old.sni.names
            && new.sni.sources == old.sni.sources
    }

    fn sync(&self, policy: &SniPolicy, generation: u64) {
        self.in_step
            .store(false, std::sync::atomic::Ordering::Release);
        match self.map.sync_hosts(policy, generation) {
            Ok(report) => {
                if !report.rejected.is_empty() {
                    tracing::warn!(names = ?report.rejected, "host names that cannot be kernel keys (they can never match a ClientHello)");
                }
                tracing::debug!(
                    generation,
                    upserted = report.upserted,
                    removed = report.removed,
                    "kernel host map synced"
                );
                self.in_step
                    .store(true, std::sync::atomic::Ordering::Release);
            }
            Err(err) => {
                self.errors.inc();
                tracing::error!(%err, generation, "kernel host map sync failed");
            }
        }
    }
}

impl<M: HostMap> PublishHook for MapSync<M> {
    fn before(&self, new: &Snapshot, old: &Snapshot) {
        if new.generation == 0 || self.names_unchanged(new, old) {
            return;
        }
        self.sync(&union_policy(&new.sni, &old.sni), new.generation);
    }

    fn after(&self, new: &Snapshot, old: &Snapshot) {
        if new.generation == 0 {
            return;
        }
        if self.names_unchanged(new, old) {
            if let Err(err) = self.map.sync_generation(&new.sni, new.generation) {
                self.in_step
                    .store(false, std::sync::atomic::Ordering::Release);
                self.errors.inc();
                tracing::error!(%err, generation = new.generation, "kernel gate config sync failed");
            }
            return;
        }
        self.sync(&new.sni, new.generation);
    }
}

/// What the kernel must admit while a publish from `old` to `new` is under way: both
/// snapshots' names (a name in both keeps the action `new` gives it), a catch-all if either
/// has one, `new`'s answer for connections that name no host, and the source policies of both
/// (a name whose policy changes is not judged by source until the swap: see
/// [`GateSources::union`]).
pub fn union_policy(new: &SniPolicy, old: &SniPolicy) -> SniPolicy {
    let mut union = new.clone();
    for (name, action) in &old.names {
        union.names.entry(name.clone()).or_insert(*action);
    }
    union.catch_all |= old.catch_all;
    union.sources = GateSources::union(&new.sources, &old.sources);
    union
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::sync::Mutex;

    use proptest::prelude::*;

    use super::*;
    use crate::publish::Published;
    use crate::snapshot::sni::{Action, Admit};

    /// A host map that applies each sync as the gate does (upserts, then removals) and keeps
    /// the names it holds.
    #[derive(Default)]
    struct Recorded {
        names: Mutex<BTreeSet<String>>,
        /// (full sync or generation only, generation)
        calls: Mutex<Vec<(&'static str, u64)>>,
    }

    impl HostMap for Recorded {
        fn sync_generation(&self, _: &SniPolicy, generation: u64) -> Result<(), GateError> {
            self.calls.lock().unwrap().push(("generation", generation));
            Ok(())
        }

        fn sync_hosts(&self, policy: &SniPolicy, generation: u64) -> Result<SyncReport, GateError> {
            self.calls.lock().unwrap().push(("hosts", generation));
            let mut names = self.names.lock().unwrap();
            let upserted = policy.names.len();
            names.extend(policy.names.keys().cloned());
            let before = names.len();
            names.retain(|name| policy.names.contains_key(name));
            Ok(SyncReport {
                upserted,
                removed: before - names.len(),
                rejected: Vec::new(),
            })
        }
    }

    fn snapshot(generation: u64, names: &[&str]) -> Snapshot {
        let mut snapshot = Snapshot {
            generation,
            ..Snapshot::default()
        };
        snapshot.sni.names = names
            .iter()
            .map(|n| (n.to_string(), Action::Pass))
            .collect();
        snapshot
    }

    /// Checks, at every hook call after the map sync's, that every name of the snapshot the
    /// proxy can see right then is in the kernel map.
    struct Invariant {
        published: std::sync::Weak<Published>,
        map: Arc<Recorded>,
        violations: Mutex<Vec<String>>,
    }

    impl Invariant {
        fn check(&self, when: &str) {
            let Some(published) = self.published.upgrade() else {
                return;
            };
            let serving = published.load();
            let kernel = self.map.names.lock().unwrap();
            for name in serving.sni.names.keys() {
                if !kernel.contains(name) {
                    self.violations.lock().unwrap().push(format!(
                        "{when} generation {}: {name} is served but not in the kernel map",
                        serving.generation
                    ));
                }
            }
        }
    }

    impl PublishHook for Invariant {
        fn before(&self, _new: &Snapshot, _old: &Snapshot) {
            self.check("before");
        }
        fn after(&self, _new: &Snapshot, _old: &Snapshot) {
            self.check("after");
        }
    }

    fn published_with_sync() -> (Arc<Published>, Arc<Recorded>, Arc<Invariant>) {
        let published = Published::new();
        let map = Arc::new(Recorded::default());
        let sync = MapSync::new(map.clone(), Counter::default());
        published.add_hook(Arc::new(sync));
        let invariant = Arc::new(Invariant {
            published: Arc::downgrade(&published),
            map: map.clone(),
            violations: Mutex::new(Vec::new()),
        });
        published.add_hook(invariant.clone());
        (published, map, invariant)
    }

    #[test]
    fn the_union_holds_both_snapshots_names_and_the_newer_rule() {
        let old = snapshot(1, &["a.test", "both.test"]).sni;
        let mut new = snapshot(2, &["b.test"]).sni;
        new.names.insert("both.test".into(), Action::Passthrough);
        new.unnamed.no_sni = Admit::Reject;
        let union = union_policy(&new, &old);
        let names: Vec<&str> = union.names.keys().map(String::as_str).collect();
        assert_eq!(names, ["a.test", "b.test", "both.test"]);
        assert_eq!(union.names["both.test"], Action::Passthrough);
        assert_eq!(union.unnamed.no_sni, Admit::Reject);
        assert!(!union.catch_all);
        let mut catch_all = old;
        catch_all.catch_all = true;
        assert!(union_policy(&new, &catch_all).catch_all);
    }

    #[test]
    fn a_publish_adds_before_the_swap_and_removes_after_it() {
        let (published, map, invariant) = published_with_sync();
        published.publish(Arc::new(snapshot(1, &["a.test", "b.test"])));
        assert_eq!(
            *map.names.lock().unwrap(),
            BTreeSet::from(["a.test".into(), "b.test".into()])
        );
        published.publish(Arc::new(snapshot(2, &["b.test", "c.test"])));
        assert_eq!(
            *map.names.lock().unwrap(),
            BTreeSet::from(["b.test".into(), "c.test".into()])
        );
        assert!(invariant.violations.lock().unwrap().is_empty());
    }

    #[test]
    fn a_publish_that_keeps_every_name_only_records_its_generation() {
        let (published, map, invariant) = published_with_sync();
        published.publish(Arc::new(snapshot(1, &["a.test"])));
        published.publish(Arc::new(snapshot(2, &["a.test"])));
        published.publish(Arc::new(snapshot(3, &["a.test", "b.test"])));
        published.publish(Arc::new(snapshot(4, &["a.test", "b.test"])));
        assert_eq!(
            *map.calls.lock().unwrap(),
            [
                ("hosts", 1),
                ("hosts", 1),
                ("generation", 2),
                ("hosts", 3),
                ("hosts", 3),
                ("generation", 4),
            ]
        );
        assert!(invariant.violations.lock().unwrap().is_empty());
    }

    /// A name whose source policy changes must reach the kernel's SOURCES map, though the names
    /// themselves stay the same.
    #[test]
    fn a_publish_that_changes_a_source_policy_writes_the_map() {
        let (published, map, invariant) = published_with_sync();
        let with_sources = |generation, allow: &str| {
            let mut snapshot = snapshot(generation, &["a.test"]);
            let policy = crate::snapshot::sources::SourcePolicy {
                allow: Some(Arc::from([allow.parse().unwrap()])),
                deny: Arc::from([]),
            };
            snapshot.sni.sources = crate::snapshot::gate_sources::GateSources::assign(
                [("a.test".to_string(), policy)].into(),
            );
            snapshot
        };
        published.publish(Arc::new(with_sources(1, "10.0.0.0/8")));
        published.publish(Arc::new(with_sources(2, "192.168.0.0/16")));
        published.publish(Arc::new(with_sources(3, "192.168.0.0/16")));
        assert_eq!(
            *map.calls.lock().unwrap(),
            [
                ("hosts", 1),
                ("hosts", 1),
                ("hosts", 2),
                ("hosts", 2),
                ("generation", 3),
            ]
        );
        assert!(invariant.violations.lock().unwrap().is_empty());
    }

    #[test]
    fn a_snapshot_from_unsynced_sources_is_never_written() {
        let (published, map, _) = published_with_sync();
        map.names.lock().unwrap().insert("pinned.test".into());
        published.publish(Arc::new(snapshot(0, &[])));
        assert!(map.names.lock().unwrap().contains("pinned.test"));
    }

    proptest! {
        /// For any sequence of snapshots, no name the proxy serves is ever missing from the
        /// kernel map, and after each publish the map holds exactly the new names.
        #[test]
        fn no_served_name_is_ever_missing_from_the_kernel_map(
            steps in proptest::collection::vec(
                proptest::collection::btree_set("[a-e]\\.test", 0..5),
                1..12,
            )
        ) {
            let (published, map, invariant) = published_with_sync();
            for (i, names) in steps.iter().enumerate() {
                let names: Vec<&str> = names.iter().map(String::as_str).collect();
                published.publish(Arc::new(snapshot(i as u64 + 1, &names)));
                let want: BTreeSet<String> = names.iter().map(|n| n.to_string()).collect();
                prop_assert_eq!(&*map.names.lock().unwrap(), &want);
            }
            let violations = invariant.violations.lock().unwrap();
            prop_assert!(violations.is_empty(), "{:?}", *violations);
        }
    }
}
