//! Diagnostics as Warning Events on the offending Ingress, so `kubectl describe ingress` says
//! what is wrong. Each diagnostic is published once when it appears; while it persists, rebuilds
//! publish nothing, and if it is resolved and comes back it is published again.

use std::collections::HashSet;
use std::sync::Arc;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};

use crate::diagnostics::{Diagnostic, DiagnosticKind, Severity};
use crate::metrics::{Metrics, ResultLabels};
use crate::snapshot::Snapshot;
use crate::store::ObjectKey;

/// The `reportingController` of our Events.
pub const CONTROLLER: &str = "ingress.rs/controller";

type Key = (ObjectKey, DiagnosticKind, String);

pub struct EventWriter {
    recorder: Recorder,
    metrics: Arc<Metrics>,
    published: HashSet<Key>,
}

impl EventWriter {
    pub fn new(client: Client, identity: &str, metrics: Arc<Metrics>) -> Self {
        let reporter = Reporter { controller: CONTROLLER.into(), instance: Some(identity.into()) };
        Self { recorder: Recorder::new(client, reporter), metrics, published: HashSet::new() }
    }

    pub fn forget(&mut self) {
        self.published.clear();
    }

    pub async fn reconcile(&mut self, snapshot: &Snapshot) {
        let current: Vec<(&Diagnostic, Key)> = snapshot
            .diagnostics
            .iter()
            .filter(|d| worth_an_event(d))
            .filter_map(|d| d.subject.ingress().map(|key| (d, (key.clone(), d.kind, d.message.clone()))))
            .collect();
        let still: HashSet<&Key> = current.iter().map(|(_, k)| k).collect();
        self.published.retain(|k| still.contains(k));
        for (diagnostic, key) in current {
            if self.published.contains(&key) {
                continue;
            }
            let Some(meta) = snapshot.ingresses.get(&key.0) else { continue };
            let reference = ObjectReference {
                api_version: Some("networking.k8s.io/v1".into()),
                kind: Some("Ingress".into()),
                namespace: Some(key.0.namespace.clone()),
                name: Some(key.0.name.clone()),
                uid: meta.uid.clone(),
                ..Default::default()
            };
            let event = Event {
                type_: match diagnostic.severity {
                    Severity::Error | Severity::Warning => EventType::Warning,
                },
                reason: diagnostic.kind.as_str().into(),
                note: Some(truncate(&diagnostic.message)),
                action: "Sync".into(),
                secondary: None,
            };
            match self.recorder.publish(&event, &reference).await {
                Ok(()) => {
                    self.metrics.events_published.get_or_create(&ResultLabels { result: "ok" }).inc();
                    self.published.insert(key);
                }
                Err(err) => {
                    self.metrics.events_published.get_or_create(&ResultLabels { result: "error" }).inc();
                    tracing::warn!(ingress = %key.0, %err, "cannot publish event; will retry on the next change");
                }
            }
        }
    }
}

/// Configuration mistakes get Events; an empty endpoint list is a runtime state that comes and
/// goes with rollouts, and stays a diagnostic only.
fn worth_an_event(d: &Diagnostic) -> bool {
    d.kind != DiagnosticKind::NoReadyEndpoints
}

/// Events notes are limited to 1 KiB by the API server.
fn truncate(message: &str) -> String {
    const MAX: usize = 1000;
    if message.len() <= MAX {
        return message.to_string();
    }
    let mut end = MAX;
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &message[..end])
}
