//! Reporting back to Kubernetes: Ingress status and Warning Events, written only by the holder
//! of a Lease so a DaemonSet of many pods writes once.
//!
//! ```text
//!   Lease (leader.rs) ── leader? ──┐
//!   published snapshots ───────────┼─> status.rs: status.loadBalancer.ingress = node address
//!                                  └─> events.rs: one Warning Event per new diagnostic
//! ```
//!
//! Losing the Lease stops these writes and nothing else: every pod keeps serving traffic.

pub mod address;
pub mod events;
pub mod leader;
pub mod status;

use std::sync::Arc;

use kube::Client;

use crate::metrics::Metrics;
use crate::publish::Published;

pub struct Reporter {
    pub client: Client,
    pub published: Arc<Published>,
    pub metrics: Arc<Metrics>,
    pub lease: leader::LeaseSettings,
    /// The address written into Ingress status; `None` leaves status alone.
    pub address: Option<address::PublishAddress>,
    /// Names this instance in Events and in the Lease.
    pub identity: String,
}

impl Reporter {
    pub async fn run(self) {
        let mut leader = leader::elect(self.client.clone(), self.lease.clone(), self.identity.clone());
        let mut snapshots = self.published.subscribe();
        let mut status = status::StatusWriter::new(self.client.clone(), self.address.clone(), self.metrics.clone());
        let mut events = events::EventWriter::new(self.client.clone(), &self.identity, self.metrics.clone());
        loop {
            let is_leader = *leader.borrow_and_update();
            self.metrics.leader.set(i64::from(is_leader));
            if is_leader && self.published.has_synced() {
                let snapshot = self.published.load_full();
                status.reconcile(&snapshot).await;
                events.reconcile(&snapshot).await;
            } else if !is_leader {
                // A new leader starts from scratch; so do we, if we lead again later.
                status.forget();
                events.forget();
            }
            tokio::select! {
                changed = leader.changed() => if changed.is_err() { return },
                changed = snapshots.changed() => if changed.is_err() { return },
            }
        }
    }
}
