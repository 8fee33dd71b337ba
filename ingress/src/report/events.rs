//! Diagnostics as Warning Events on the offending Ingress (or the `--configmap` ConfigMap), so
//! `kubectl describe ingress` (or `configmap`) says what is wrong.
//!
//! ```text
//!   diagnostic appears ──> create Event  <ingress>.<hash(uid, reason, message)>
//!   persists ────────────> nothing (however many rebuilds)
//!   resolved, reappears ─> PATCH that Event's series: count + 1, lastObservedTime
//! ```
//!
//! The Event name is derived from what it says, so a restarted controller or a new leader that
//! finds the diagnostic still there gets `409 AlreadyExists` and adopts the Event instead of
//! repeating it. Events go through `events.k8s.io/v1` with the `create` and `patch` verbs only.

use std::collections::HashMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::{Event, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;
use tokio::sync::watch;

use super::Pass;
use super::{ReportMetrics, ResultLabels};
use crate::diagnostics::{Diagnostic, DiagnosticKind, Severity, Subject};
use crate::snapshot::Snapshot;
use crate::store::{Kind, ObjectKey};

/// The `reportingController` of our Events.
pub const CONTROLLER: &str = "ingress.rs/controller";

/// One diagnostic on one incarnation of an Ingress (or of the ConfigMap).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Key {
    /// Ingress or ConfigMap.
    object: Kind,
    ingress: ObjectKey,
    uid: Option<String>,
    kind: DiagnosticKind,
    message: String,
}

pub struct EventWriter {
    client: Client,
    identity: String,
    metrics: Arc<ReportMetrics>,
    /// Diagnostics whose Event says they are current.
    active: std::collections::HashSet<Key>,
    /// How often each Event has been observed, for its series when a diagnostic comes back.
    counts: HashMap<Key, i32>,
}

impl EventWriter {
    pub fn new(client: Client, identity: &str, metrics: Arc<ReportMetrics>) -> Self {
        Self {
            client,
            identity: identity.to_string(),
            metrics,
            active: Default::default(),
            counts: HashMap::new(),
        }
    }

    pub fn forget(&mut self) {
        self.active.clear();
        self.counts.clear();
    }

    /// Publishes an Event for each diagnostic that appeared since the last pass, while
    /// `leading` stays true.
    pub async fn reconcile(
        &mut self,
        snapshot: &Snapshot,
        leading: &watch::Receiver<bool>,
    ) -> Pass {
        let current: Vec<(&Diagnostic, Key)> = snapshot
            .diagnostics
            .iter()
            .filter(|d| worth_an_event(d))
            .filter_map(|d| {
                let (object, key, uid) = regarding(snapshot, d)?;
                Some((
                    d,
                    Key {
                        object,
                        ingress: key.clone(),
                        uid,
                        kind: d.kind,
                        message: d.message.clone(),
                    },
                ))
            })
            .collect();
        let still: std::collections::HashSet<&Key> = current.iter().map(|(_, k)| k).collect();
        self.active.retain(|k| still.contains(k));
        // Counts outlive a resolution (that is their point) but not the object.
        self.counts.retain(|k, _| match k.object {
            Kind::ConfigMap => snapshot
                .config_map
                .as_ref()
                .is_some_and(|(key, uid)| *key == k.ingress && *uid == k.uid),
            _ => snapshot
                .ingresses
                .get(&k.ingress)
                .is_some_and(|m| m.uid == k.uid),
        });
        let mut pass = Pass::Done;
        for (diagnostic, key) in current {
            if self.active.contains(&key) {
                continue;
            }
            if !*leading.borrow() {
                return Pass::Done;
            }
            match self.publish(diagnostic, &key).await {
                Ok(()) => {
                    self.active.insert(key);
                }
                Err(err) => {
                    self.metrics
                        .events_published
                        .get_or_create(&ResultLabels { result: "error" })
                        .inc();
                    tracing::warn!(ingress = %key.ingress, reason = %key.kind, %err, "cannot publish event; retrying with backoff");
                    pass = Pass::Retry;
                    if !matches!(err, kube::Error::Api(_)) {
                        break;
                    }
                }
            }
        }
        pass
    }

    async fn publish(&mut self, diagnostic: &Diagnostic, key: &Key) -> Result<(), kube::Error> {
        let api: Api<Event> = Api::namespaced(self.client.clone(), &key.ingress.namespace);
        let name = event_name(key);
        if let Some(count) = self.counts.get(key).copied() {
            // Seen before by this leader: the same Event happens again.
            let count = count.saturating_add(1);
            let series = EventSeries {
                count,
                last_observed_time: MicroTime(Timestamp::now()),
            };
            match api
                .patch(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({ "series": series })),
                )
                .await
            {
                Ok(_) => {
                    self.counts.insert(key.clone(), count);
                    self.metrics
                        .events_published
                        .get_or_create(&ResultLabels { result: "ok" })
                        .inc();
                    tracing::info!(ingress = %key.ingress, reason = %key.kind, count, "event observed again");
                    return Ok(());
                }
                // Events expire (an hour, by default): start a new one.
                Err(kube::Error::Api(status)) if status.code == 404 => {}
                Err(err) => return Err(err),
            }
        }
        let event = Event {
            metadata: ObjectMeta {
                name: Some(name),
                namespace: Some(key.ingress.namespace.clone()),
                ..Default::default()
            },
            event_time: Some(MicroTime(Timestamp::now())),
            type_: Some(
                match diagnostic.severity {
                    Severity::Error | Severity::Warning => "Warning",
                }
                .into(),
            ),
            reason: Some(diagnostic.kind.as_str().into()),
            note: Some(truncate(&diagnostic.message)),
            action: Some("Sync".into()),
            reporting_controller: Some(CONTROLLER.into()),
            reporting_instance: Some(truncate_to(&self.identity, 128)),
            regarding: Some(ObjectReference {
                api_version: Some(
                    match key.object {
                        Kind::ConfigMap => "v1",
                        _ => "networking.k8s.io/v1",
                    }
                    .into(),
                ),
                kind: Some(key.object.as_str().into()),
                namespace: Some(key.ingress.namespace.clone()),
                name: Some(key.ingress.name.clone()),
                uid: key.uid.clone(),
                ..Default::default()
            }),
            ..Default::default()
        };
        match api.create(&PostParams::default(), &event).await {
            Ok(_) => {
                self.metrics
                    .events_published
                    .get_or_create(&ResultLabels { result: "ok" })
                    .inc();
                tracing::info!(ingress = %key.ingress, reason = %key.kind, "event published");
            }
            // An earlier leader (or an earlier run of this one) already said so.
            Err(kube::Error::Api(status)) if status.code == 409 => {
                tracing::debug!(ingress = %key.ingress, reason = %key.kind, "event already published");
            }
            Err(err) => return Err(err),
        }
        self.counts.entry(key.clone()).or_insert(1);
        Ok(())
    }
}

/// The object a diagnostic's Event regards, with its uid: an owned Ingress, or the ConfigMap
/// `--configmap` names (when it exists).
fn regarding<'s>(
    snapshot: &'s Snapshot,
    d: &'s Diagnostic,
) -> Option<(Kind, &'s ObjectKey, Option<String>)> {
    if let Some(ingress) = d.subject.ingress() {
        let meta = snapshot.ingresses.get(ingress)?;
        return Some((Kind::Ingress, ingress, meta.uid.clone()));
    }
    match (&d.subject, &snapshot.config_map) {
        (
            Subject::Object {
                kind: Kind::ConfigMap,
                key,
            },
            Some((config_map, uid)),
        ) if key == config_map => Some((Kind::ConfigMap, key, uid.clone())),
        _ => None,
    }
}

/// Configuration mistakes get Events; an empty endpoint list is a runtime state that comes and
/// goes with rollouts, and stays a diagnostic only.
fn worth_an_event(d: &Diagnostic) -> bool {
    d.kind != DiagnosticKind::NoReadyEndpoints
}

/// `<ingress name>.<16 hex digits>`: a stable function of the Ingress's uid, the reason and the
/// message, short enough for an object name (at most 253 characters).
fn event_name(key: &Key) -> String {
    let mut hash = Fnv1a::default();
    for part in [
        key.uid.as_deref().unwrap_or(""),
        key.kind.as_str(),
        &key.message,
    ] {
        hash.write(part.as_bytes());
        hash.write(&[0]);
    }
    // Each dot-separated part of a name must end alphanumeric.
    format!(
        "{}.{:016x}",
        truncate_to(&key.ingress.name, 200).trim_end_matches(['.', '-']),
        hash.0
    )
}

/// FNV-1a, 64 bit: stable across Rust versions and builds, unlike `DefaultHasher`, so every
/// version of the controller names an Event the same way.
struct Fnv1a(u64);

impl Default for Fnv1a {
    fn default() -> Self {
        Fnv1a(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv1a {
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
}

/// Event notes are limited to 1 KiB by the API server.
fn truncate(message: &str) -> String {
    if message.len() <= 1000 {
        message.to_string()
    } else {
        format!("{}…", truncate_to(message, 1000))
    }
}

fn truncate_to(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str, uid: &str, kind: DiagnosticKind, message: &str) -> Key {
        Key {
            object: Kind::Ingress,
            ingress: ObjectKey::new("ns", name),
            uid: Some(uid.into()),
            kind,
            message: message.into(),
        }
    }

    #[test]
    fn event_names_are_stable_and_distinct() {
        let a = key(
            "web",
            "u1",
            DiagnosticKind::ServiceNotFound,
            "service \"a\" not found",
        );
        assert_eq!(event_name(&a), event_name(&a.clone()));
        assert!(event_name(&a).starts_with("web."));
        let others = [
            key(
                "web",
                "u2",
                DiagnosticKind::ServiceNotFound,
                "service \"a\" not found",
            ),
            key(
                "web",
                "u1",
                DiagnosticKind::ServicePortNotFound,
                "service \"a\" not found",
            ),
            key(
                "web",
                "u1",
                DiagnosticKind::ServiceNotFound,
                "service \"b\" not found",
            ),
        ];
        for other in &others {
            assert_ne!(event_name(&a), event_name(other), "{other:?}");
        }
        // FNV-1a of the empty input is its offset basis: the function is the published one.
        assert_eq!(Fnv1a::default().0, 0xcbf2_9ce4_8422_2325);
        let mut h = Fnv1a::default();
        h.write(b"a");
        assert_eq!(h.0, 0xaf63_dc4c_8601_ec8c);
        let long = key(&"x".repeat(253), "u", DiagnosticKind::InvalidRegex, "m");
        assert!(event_name(&long).len() <= 253);
    }

    #[test]
    fn notes_are_cut_on_a_character_boundary() {
        assert_eq!(truncate("short"), "short");
        let long = "é".repeat(600);
        let cut = truncate(&long);
        assert!(cut.len() <= 1003 && cut.ends_with('…'));
    }
}
