//! Leader election over a `coordination.k8s.io/v1` Lease, with the semantics of client-go's
//! `leaderelection`:
//!
//! ```text
//!   every retry period:  GET Lease ── decide() ──> Wait          (someone else holds a live claim)
//!                                            └──> Take / Renew  ──> PUT with resourceVersion
//!                                                                    409: someone raced us, Wait
//! ```
//!
//! Time is judged on the local monotonic clock only, so clock skew between nodes does not
//! matter: a claim held by someone else counts as live until `leaseDurationSeconds` after *we*
//! last saw it change, and our own leadership ends `renew_deadline` after the start of our last
//! successful renewal. Since `renew_deadline < duration`, a holder that cannot reach the API
//! server (or is partitioned from it) stops acting as leader before anyone else may take over.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::PostParams;
use kube::{Api, Client};
use tokio::sync::watch;
use tokio::time::Instant;

#[derive(Clone, Debug)]
pub struct LeaseSettings {
    pub name: String,
    pub namespace: String,
    /// How long a claim lasts without renewal (`leaseDurationSeconds`).
    pub duration: Duration,
    /// The holder gives up if it could not renew for this long.
    pub renew_deadline: Duration,
    /// Time between attempts to acquire or renew.
    pub retry: Duration,
}

impl LeaseSettings {
    /// client-go's proportions (15 s / 10 s / 2 s): renew deadline 2/3 and retry period 1/6 of
    /// the duration, which is at least one second (the Lease counts whole seconds).
    pub fn new(name: impl Into<String>, namespace: impl Into<String>, duration: Duration) -> Self {
        let whole = duration.as_secs() + u64::from(duration.subsec_nanos() > 0);
        let duration = Duration::from_secs(whole.max(1));
        Self {
            name: name.into(),
            namespace: namespace.into(),
            duration,
            renew_deadline: duration * 2 / 3,
            retry: duration / 6,
        }
    }
}

/// Runs the election in the background. The channel is true while this instance holds the
/// Lease; the task ends when every receiver is gone.
pub fn elect(client: Client, settings: LeaseSettings, identity: String) -> watch::Receiver<bool> {
    let (tx, rx) = watch::channel(false);
    let mut elector = Elector {
        api: Api::namespaced(client, &settings.namespace),
        settings,
        identity,
        observed: None,
    };
    tokio::spawn(async move {
        let mut leading_until: Option<Instant> = None;
        let mut failing = false;
        loop {
            let started = Instant::now();
            // A renewal that cannot finish before our claim lapses is as good as failed.
            let limit = leading_until.unwrap_or(started + elector.settings.renew_deadline);
            let leading =
                match tokio::time::timeout_at(limit, elector.try_acquire_or_renew(started)).await {
                    Ok(Ok(held)) => {
                        failing = false;
                        leading_until = held.then(|| started + elector.settings.renew_deadline);
                        held
                    }
                    Ok(Err(err)) => {
                        log_failure(&mut failing, &elector.settings.name, &err.to_string());
                        leading_until.is_some_and(|until| Instant::now() < until)
                    }
                    Err(_) => {
                        log_failure(&mut failing, &elector.settings.name, "timed out");
                        leading_until.is_some_and(|until| Instant::now() < until)
                    }
                };
            if !leading {
                leading_until = None;
            }
            let changed =
                tx.send_if_modified(|current| std::mem::replace(current, leading) != leading);
            if changed {
                tracing::info!(leading, lease = %elector.settings.name, identity = %elector.identity, "leadership changed");
            }
            if tx.is_closed() {
                return;
            }
            let mut next = started + elector.settings.retry;
            if let Some(until) = leading_until {
                next = next.min(until);
            }
            tokio::time::sleep_until(next).await;
        }
    });
    rx
}

fn log_failure(failing: &mut bool, lease: &str, err: &str) {
    if *failing {
        tracing::debug!(lease, err, "leader election: cannot reach the Lease");
    } else {
        tracing::warn!(
            lease,
            err,
            "leader election: cannot reach the Lease; retrying (a holder steps down at its renew deadline)"
        );
    }
    *failing = true;
}

struct Elector {
    api: Api<Lease>,
    settings: LeaseSettings,
    identity: String,
    /// The claim as last seen, and when we first saw it so.
    observed: Option<(Claim, Instant)>,
}

impl Elector {
    /// One round: true if we hold the Lease afterwards.
    async fn try_acquire_or_renew(&mut self, now: Instant) -> Result<bool, kube::Error> {
        let Some(mut lease) = self.api.get_opt(&self.settings.name).await? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.settings.name.clone()),
                    ..Default::default()
                },
                spec: Some(self.claim_spec(None)),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(created) => {
                    self.observe(&created, now);
                    Ok(true)
                }
                Err(kube::Error::Api(status)) if status.code == 409 => Ok(false),
                Err(err) => Err(err),
            };
        };
        self.observe(&lease, now);
        let Some((claim, seen)) = &self.observed else {
            return Ok(false);
        };
        match decide(claim, *seen, now, &self.identity, self.settings.duration) {
            Decision::Wait => Ok(false),
            Decision::Claim => {
                lease.spec = Some(self.claim_spec(lease.spec.as_ref()));
                // The resourceVersion from the GET makes this a compare-and-swap.
                match self
                    .api
                    .replace(&self.settings.name, &PostParams::default(), &lease)
                    .await
                {
                    Ok(replaced) => {
                        self.observe(&replaced, now);
                        Ok(true)
                    }
                    Err(kube::Error::Api(status)) if status.code == 409 => Ok(false),
                    Err(err) => Err(err),
                }
            }
        }
    }

    fn observe(&mut self, lease: &Lease, now: Instant) {
        let claim = Claim::of(lease.spec.as_ref());
        if self
            .observed
            .as_ref()
            .is_none_or(|(seen, _)| *seen != claim)
        {
            self.observed = Some((claim, now));
        }
    }

    /// Our claim: a renewal keeps `acquireTime` and the transition count, a takeover bumps it.
    fn claim_spec(&self, previous: Option<&LeaseSpec>) -> LeaseSpec {
        let now = MicroTime(Timestamp::now());
        let ours =
            previous.and_then(|p| p.holder_identity.as_deref()) == Some(self.identity.as_str());
        let transitions = previous.and_then(|p| p.lease_transitions).unwrap_or(0);
        let had_holder = previous
            .and_then(|p| p.holder_identity.as_deref())
            .is_some_and(|h| !h.is_empty());
        LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: Some(
                i32::try_from(self.settings.duration.as_secs()).unwrap_or(i32::MAX),
            ),
            acquire_time: if ours {
                previous.and_then(|p| p.acquire_time.clone())
            } else {
                Some(now.clone())
            },
            renew_time: Some(now),
            lease_transitions: Some(if ours || !had_holder {
                transitions
            } else {
                transitions.saturating_add(1)
            }),
            ..Default::default()
        }
    }
}

/// What matters of a Lease for deciding: who holds it, for how long, and its last renewal (a
/// changed renewal is how we see that the holder is alive).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Claim {
    holder: Option<String>,
    duration: Option<Duration>,
    renewed: Option<String>,
}

impl Claim {
    fn of(spec: Option<&LeaseSpec>) -> Self {
        Claim {
            holder: spec
                .and_then(|s| s.holder_identity.clone())
                .filter(|h| !h.is_empty()),
            duration: spec
                .and_then(|s| s.lease_duration_seconds)
                .and_then(|d| u64::try_from(d).ok())
                .map(Duration::from_secs),
            renewed: spec
                .and_then(|s| s.renew_time.as_ref())
                .map(|t| t.0.to_string()),
        }
    }
}

#[derive(Debug, PartialEq, Eq)]
enum Decision {
    /// Someone else holds a live claim.
    Wait,
    /// Take the Lease, or renew our own claim.
    Claim,
}

/// Whether to claim the Lease, judging a foreign claim by how long ago we saw it change.
fn decide(
    claim: &Claim,
    seen: Instant,
    now: Instant,
    identity: &str,
    our_duration: Duration,
) -> Decision {
    match claim.holder.as_deref() {
        None => Decision::Claim,
        Some(holder) if holder == identity => Decision::Claim,
        Some(_) => {
            let duration = claim.duration.unwrap_or(our_duration);
            if now.saturating_duration_since(seen) >= duration {
                Decision::Claim
            } else {
                Decision::Wait
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(holder: Option<&str>, secs: Option<u64>) -> Claim {
        Claim {
            holder: holder.map(Into::into),
            duration: secs.map(Duration::from_secs),
            renewed: Some("t".into()),
        }
    }

    #[test]
    fn decides_like_client_go() {
        let seen = Instant::now();
        let ours = Duration::from_secs(15);
        let cases = [
            (claim(None, None), 0, Decision::Claim, "free"),
            (
                claim(Some("me"), Some(15)),
                0,
                Decision::Claim,
                "our own: renew",
            ),
            (
                claim(Some("other"), Some(15)),
                0,
                Decision::Wait,
                "fresh foreign claim",
            ),
            (
                claim(Some("other"), Some(15)),
                14,
                Decision::Wait,
                "not yet expired by our clock",
            ),
            (
                claim(Some("other"), Some(15)),
                15,
                Decision::Claim,
                "expired by our clock",
            ),
            (
                claim(Some("other"), Some(5)),
                6,
                Decision::Claim,
                "their duration counts",
            ),
            (
                claim(Some("other"), None),
                14,
                Decision::Wait,
                "no duration: ours",
            ),
        ];
        for (claim, after, want, why) in cases {
            assert_eq!(
                decide(&claim, seen, seen + Duration::from_secs(after), "me", ours),
                want,
                "{why}"
            );
        }
    }

    #[test]
    fn settings_keep_client_go_proportions() {
        let s = LeaseSettings::new("l", "ns", Duration::from_secs(15));
        assert_eq!(
            (s.duration, s.renew_deadline, s.retry),
            (
                Duration::from_secs(15),
                Duration::from_secs(10),
                Duration::from_millis(2500)
            )
        );
        let s = LeaseSettings::new("l", "ns", Duration::from_millis(300));
        assert_eq!(
            s.duration,
            Duration::from_secs(1),
            "whole seconds, at least one"
        );
        assert!(s.renew_deadline < s.duration && s.retry < s.renew_deadline);
    }
}
