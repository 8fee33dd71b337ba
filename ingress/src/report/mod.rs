//! Reporting back to Kubernetes: Ingress status and Warning Events, written only by the holder
//! of a Lease so a DaemonSet of many pods writes once.
//!
//! ```text
//!   Lease (leader.rs) ── leading? ──┐
//!   published snapshots ────────────┼─> status.rs: status.loadBalancer.ingress = the address
//!   retry timer (after a failure) ──┘─> events.rs: one Warning Event per new diagnostic
//! ```
//!
//! Losing the Lease stops these writes and nothing else: every pod keeps serving traffic.

pub mod address;
pub mod events;
pub mod leader;
pub mod status;

use std::sync::Arc;
use std::time::Duration;

use kube::Client;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::sync::watch;

use crate::publish::Published;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    pub result: &'static str,
}

/// What reporting counts: whether this instance leads, and how its writes went.
#[derive(Default)]
pub struct ReportMetrics {
    pub leader: Gauge,
    pub status_updates: Family<ResultLabels, Counter>,
    pub events_published: Family<ResultLabels, Counter>,
}

impl ReportMetrics {
    pub fn register(registry: &mut Registry) -> Arc<ReportMetrics> {
        let metrics = ReportMetrics::default();
        registry.register(
            "leader",
            "1 while this instance holds the status-writer Lease",
            metrics.leader.clone(),
        );
        registry.register(
            "status_updates",
            "Ingress status writes by result (ok, error)",
            metrics.status_updates.clone(),
        );
        registry.register(
            "events_published",
            "Kubernetes Events published for diagnostics, by result (ok, error)",
            metrics.events_published.clone(),
        );
        Arc::new(metrics)
    }
}

/// How a pass of writes ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pass {
    /// Everything the snapshot asks for is written (or nothing is ours to write).
    Done,
    /// Something failed; try again later even if nothing changes.
    Retry,
}

pub struct Reporter {
    pub client: Client,
    pub published: Arc<Published>,
    pub metrics: Arc<ReportMetrics>,
    pub lease: leader::LeaseSettings,
    /// The addresses written into Ingress status, as they change; empty leaves status alone.
    pub addresses: watch::Receiver<Vec<address::PublishAddress>>,
    /// Names this instance in Events and in the Lease.
    pub identity: String,
}

/// Retries after failed writes start here and double up to [`MAX_RETRY`].
const FIRST_RETRY: Duration = Duration::from_millis(500);
const MAX_RETRY: Duration = Duration::from_secs(30);

impl Reporter {
    pub async fn run(self) {
        let mut leader = leader::elect(
            self.client.clone(),
            self.lease.clone(),
            self.identity.clone(),
        );
        let mut snapshots = self.published.subscribe();
        let mut addresses = self.addresses.clone();
        let mut status = status::StatusWriter::new(
            self.client.clone(),
            self.addresses.clone(),
            self.metrics.clone(),
        );
        let mut events =
            events::EventWriter::new(self.client.clone(), &self.identity, self.metrics.clone());
        let mut retry: Option<Duration> = None;
        loop {
            let leading = *leader.borrow_and_update();
            snapshots.borrow_and_update();
            self.metrics.leader.set(i64::from(leading));
            if leading && self.published.has_synced() {
                let snapshot = self.published.load_full();
                let status_pass = status.reconcile(&snapshot, &leader).await;
                let events_pass = events.reconcile(&snapshot, &leader).await;
                retry = if status_pass == Pass::Retry || events_pass == Pass::Retry {
                    Some(retry.map_or(FIRST_RETRY, |d| (d * 2).min(MAX_RETRY)))
                } else {
                    None
                };
            } else if !leading {
                // A new leader starts from what the API server says; so do we, if we lead again.
                status.forget();
                events.forget();
                retry = None;
            }
            tokio::select! {
                changed = leader.changed() => if changed.is_err() { return },
                changed = snapshots.changed() => if changed.is_err() { return },
                // A closed address channel (a fixed list, sent once) is simply never ready again.
                Ok(()) = addresses.changed() => {}
                () = tokio::time::sleep(retry.unwrap_or(MAX_RETRY)), if retry.is_some() => {}
            }
        }
    }
}
