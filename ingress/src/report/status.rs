//! Ingress status: `status.loadBalancer.ingress` of every owned Ingress names the published
//! addresses, so `kubectl get ingress` shows an ADDRESS. While there is no address (none
//! configured, or a `--publish-service` LoadBalancer still pending) status is left alone.
//!
//! Writes use GET then PUT on the `status` subresource (the `update` verb only) and are made
//! only for Ingresses whose status differs. A write is remembered until the watch shows it, so
//! rebuilds in between do not write again; if the watch shows yet another value (someone else
//! wrote meanwhile), it is written again.

use std::collections::HashMap;
use std::sync::Arc;

use k8s_openapi::api::networking::v1::{Ingress, IngressLoadBalancerStatus, IngressStatus};
use kube::api::PostParams;
use kube::{Api, Client};
use tokio::sync::watch;

use super::Pass;
use super::address::PublishAddress;
use super::{ReportMetrics, ResultLabels};
use crate::snapshot::Snapshot;
use crate::store::ObjectKey;

pub struct StatusWriter {
    client: Client,
    addresses: watch::Receiver<Vec<PublishAddress>>,
    metrics: Arc<ReportMetrics>,
    /// Written, but not yet seen back through the watch: the addresses the Ingress had before.
    pending: HashMap<ObjectKey, Vec<String>>,
}

impl StatusWriter {
    pub fn new(
        client: Client,
        addresses: watch::Receiver<Vec<PublishAddress>>,
        metrics: Arc<ReportMetrics>,
    ) -> Self {
        Self {
            client,
            addresses,
            metrics,
            pending: HashMap::new(),
        }
    }

    pub fn forget(&mut self) {
        self.pending.clear();
    }

    /// Brings every owned Ingress's status to the addresses, while `leading` stays true.
    pub async fn reconcile(
        &mut self,
        snapshot: &Snapshot,
        leading: &watch::Receiver<bool>,
    ) -> Pass {
        let addresses = self.addresses.borrow_and_update().clone();
        if addresses.is_empty() {
            return Pass::Done;
        }
        let want: Vec<String> = addresses.iter().map(PublishAddress::as_string).collect();
        self.pending
            .retain(|key, _| snapshot.ingresses.contains_key(key));
        let mut pass = Pass::Done;
        let mut written = 0usize;
        for (key, meta) in snapshot.ingresses.iter() {
            if sorted(&meta.addresses) == want {
                self.pending.remove(key);
                continue;
            }
            if self.pending.get(key) == Some(&meta.addresses) {
                continue;
            }
            if !*leading.borrow() {
                return Pass::Done;
            }
            match self.write(key, &addresses).await {
                Ok(()) => {
                    tracing::debug!(ingress = %key, addresses = ?want, "status updated");
                    self.metrics
                        .status_updates
                        .get_or_create(&ResultLabels { result: "ok" })
                        .inc();
                    self.pending.insert(key.clone(), meta.addresses.clone());
                    written += 1;
                }
                // Deleted since the snapshot was built; its deletion is on the way.
                Err(kube::Error::Api(status)) if status.code == 404 => {}
                Err(err) => {
                    self.metrics
                        .status_updates
                        .get_or_create(&ResultLabels { result: "error" })
                        .inc();
                    tracing::warn!(ingress = %key, %err, "cannot update status; retrying with backoff");
                    pass = Pass::Retry;
                    // Without an answer from the API server, the other Ingresses would fail
                    // the same way: stop here and retry the whole pass later.
                    if !matches!(err, kube::Error::Api(_)) {
                        break;
                    }
                }
            }
        }
        if written > 0 {
            tracing::info!(ingresses = written, addresses = ?want, "Ingress status updated");
        }
        pass
    }

    async fn write(
        &self,
        key: &ObjectKey,
        addresses: &[PublishAddress],
    ) -> Result<(), kube::Error> {
        let api: Api<Ingress> = Api::namespaced(self.client.clone(), &key.namespace);
        // A conflict means someone changed the object between our read and write: read again.
        let mut attempts = 0;
        loop {
            let mut ingress = api.get_status(&key.name).await?;
            ingress.status = Some(IngressStatus {
                load_balancer: Some(IngressLoadBalancerStatus {
                    ingress: Some(addresses.iter().map(PublishAddress::status_entry).collect()),
                }),
            });
            match api
                .replace_status(&key.name, &PostParams::default(), &ingress)
                .await
            {
                Ok(_) => return Ok(()),
                Err(kube::Error::Api(status)) if status.code == 409 && attempts < 3 => {
                    attempts += 1
                }
                Err(err) => return Err(err),
            }
        }
    }
}

/// The addresses an Ingress has, in the order written ones have.
fn sorted(addresses: &[String]) -> Vec<String> {
    let mut list = addresses.to_vec();
    list.sort();
    list.dedup();
    list
}
