//! Ingress status: `status.loadBalancer.ingress` of every owned Ingress names this node's
//! address, so `kubectl get ingress` shows an ADDRESS.
//!
//! Writes use GET then PUT on the `status` subresource (the `update` verb only) and are made
//! only for Ingresses whose status differs. A write is remembered until the watch shows it, so
//! unrelated rebuilds in between do not write again.

use std::collections::HashMap;
use std::sync::Arc;

use k8s_openapi::api::networking::v1::{Ingress, IngressLoadBalancerStatus, IngressStatus};
use kube::api::PostParams;
use kube::{Api, Client};

use super::address::PublishAddress;
use crate::metrics::{Metrics, ResultLabels};
use crate::snapshot::Snapshot;
use crate::store::ObjectKey;

pub struct StatusWriter {
    client: Client,
    address: Option<PublishAddress>,
    metrics: Arc<Metrics>,
    /// Written, but not yet seen back through the watch.
    pending: HashMap<ObjectKey, String>,
}

impl StatusWriter {
    pub fn new(client: Client, address: Option<PublishAddress>, metrics: Arc<Metrics>) -> Self {
        Self { client, address, metrics, pending: HashMap::new() }
    }

    pub fn forget(&mut self) {
        self.pending.clear();
    }

    pub async fn reconcile(&mut self, snapshot: &Snapshot) {
        let Some(address) = self.address.clone() else { return };
        let want = address.as_string();
        self.pending.retain(|key, _| snapshot.ingresses.contains_key(key));
        for (key, meta) in &snapshot.ingresses {
            if meta.addresses == [want.clone()] {
                self.pending.remove(key);
                continue;
            }
            if self.pending.get(key) == Some(&want) {
                continue;
            }
            match self.write(key, &address).await {
                Ok(()) => {
                    tracing::info!(ingress = %key, address = %want, "status updated");
                    self.metrics.status_updates.get_or_create(&ResultLabels { result: "ok" }).inc();
                    self.pending.insert(key.clone(), want.clone());
                }
                Err(err) => {
                    tracing::warn!(ingress = %key, %err, "cannot update status; will retry on the next change");
                    self.metrics.status_updates.get_or_create(&ResultLabels { result: "error" }).inc();
                }
            }
        }
    }

    async fn write(&self, key: &ObjectKey, address: &PublishAddress) -> Result<(), kube::Error> {
        let api: Api<Ingress> = Api::namespaced(self.client.clone(), &key.namespace);
        // A conflict means someone changed the object between our read and write: read again.
        let mut attempts = 0;
        loop {
            let mut ingress = api.get_status(&key.name).await?;
            ingress.status = Some(IngressStatus {
                load_balancer: Some(IngressLoadBalancerStatus { ingress: Some(vec![address.status_entry()]) }),
            });
            match api.replace_status(&key.name, &PostParams::default(), &ingress).await {
                Ok(_) => return Ok(()),
                Err(kube::Error::Api(status)) if status.code == 409 && attempts < 3 => attempts += 1,
                Err(err) => return Err(err),
            }
        }
    }
}
