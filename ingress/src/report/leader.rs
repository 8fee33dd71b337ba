//! Leader election over a `coordination.k8s.io/v1` Lease (kube-lease-manager). The returned
//! channel says whether this instance currently holds the Lease; it starts false, and a manager
//! that fails is rebuilt after a pause, so an unreachable API server only delays leadership.

use std::time::Duration;

use kube::Client;
use kube_lease_manager::LeaseManagerBuilder;
use tokio::sync::watch;

#[derive(Clone, Debug)]
pub struct LeaseSettings {
    pub name: String,
    pub namespace: String,
    /// Seconds a holder's claim is valid after its last renewal.
    pub duration: u64,
    /// Seconds before expiry at which the holder renews.
    pub grace: u64,
}

pub fn elect(client: Client, settings: LeaseSettings, identity: String) -> watch::Receiver<bool> {
    let (tx, rx) = watch::channel(false);
    tokio::spawn(async move {
        let mut delay = Duration::from_millis(500);
        loop {
            let manager = LeaseManagerBuilder::new(client.clone(), settings.name.clone())
                .with_namespace(settings.namespace.clone())
                .with_identity(identity.clone())
                .with_duration(settings.duration)
                .with_grace(settings.grace)
                .build()
                .await;
            let manager = match manager {
                Ok(m) => m,
                Err(err) => {
                    tracing::warn!(%err, lease = %settings.name, "cannot set up leader election; retrying");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(30));
                    continue;
                }
            };
            delay = Duration::from_millis(500);
            let (mut state, task) = manager.watch().await;
            loop {
                let leading = *state.borrow_and_update();
                if tx.send_replace(leading) != leading {
                    tracing::info!(leading, lease = %settings.name, "leadership changed");
                }
                if state.changed().await.is_err() {
                    break;
                }
                if tx.is_closed() {
                    return;
                }
            }
            tx.send_replace(false);
            if let Ok(Err(err)) = task.await {
                tracing::warn!(%err, "leader election ended; restarting it");
            }
            tokio::time::sleep(delay).await;
        }
    });
    rx
}
