//! Fault injection, driven by tests: failing requests, expiring watches, dropping watch
//! connections. (Stopping and restarting the whole server lives on `TestApiServer`.)

use std::sync::{Mutex, MutexGuard, PoisonError};

use tokio_util::sync::CancellationToken;

/// Answer matching requests with an error status, a limited number of times.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailRule {
    /// Substring of `path?query` a request must contain; None matches every request.
    pub path_contains: Option<String>,
    /// HTTP method a request must have; None matches every method.
    pub method: Option<String>,
    /// Status code to answer with, e.g. 500 or 503.
    pub status: u16,
    /// How many more requests this rule fails.
    pub remaining: usize,
}

impl FailRule {
    /// The next `times` requests, whatever they are, get a 500.
    pub fn next(times: usize) -> Self {
        Self {
            path_contains: None,
            method: None,
            status: 500,
            remaining: times,
        }
    }

    /// The next `times` requests whose `path?query` contains `needle` get a 500.
    pub fn matching(needle: impl Into<String>, times: usize) -> Self {
        Self {
            path_contains: Some(needle.into()),
            ..Self::next(times)
        }
    }

    pub fn with_status(mut self, status: u16) -> Self {
        self.status = status;
        self
    }

    pub fn with_method(mut self, method: impl Into<String>) -> Self {
        self.method = Some(method.into());
        self
    }

    fn matches(&self, method: &str, path_and_query: &str) -> bool {
        self.remaining > 0
            && self
                .method
                .as_deref()
                .is_none_or(|m| m.eq_ignore_ascii_case(method))
            && self
                .path_contains
                .as_deref()
                .is_none_or(|n| path_and_query.contains(n))
    }
}

#[derive(Default)]
struct State {
    rules: Vec<FailRule>,
    expire_watches: usize,
    watches_cut: CancellationToken,
}

/// The fault switches of one server. Cheap to call from any thread.
#[derive(Default)]
pub struct Faults {
    state: Mutex<State>,
}

impl Faults {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Adds a failure rule; rules are tried in the order they were added.
    pub fn fail(&self, rule: FailRule) {
        self.lock().rules.push(rule);
    }

    /// The next `times` requests get a 500 InternalError.
    pub fn fail_next(&self, times: usize) {
        self.fail(FailRule::next(times));
    }

    /// The next `times` requests whose `path?query` contains `needle` get a 500.
    pub fn fail_matching(&self, needle: &str, times: usize) {
        self.fail(FailRule::matching(needle, times));
    }

    /// The next `times` watch requests get an ERROR event with a 410 Expired status (HTTP 200,
    /// as the real server sends it), which makes a kube-rs watcher relist.
    pub fn expire_next_watches(&self, times: usize) {
        self.lock().expire_watches += times;
    }

    /// Ends every open watch now, as if the connections broke: each watch response stops
    /// with an error mid-body, so the client sees the connection end without a clean close.
    pub fn drop_watches(&self) {
        let mut state = self.lock();
        state.watches_cut.cancel();
        state.watches_cut = CancellationToken::new();
    }

    /// Removes every pending failure and expiry.
    pub fn clear(&self) {
        let mut state = self.lock();
        state.rules.clear();
        state.expire_watches = 0;
    }

    /// Requests still to be failed, summed over all rules.
    pub fn pending_failures(&self) -> usize {
        self.lock().rules.iter().map(|r| r.remaining).sum()
    }

    pub(super) fn take_failure(&self, method: &str, path_and_query: &str) -> Option<u16> {
        let mut state = self.lock();
        let rule = state
            .rules
            .iter_mut()
            .find(|r| r.matches(method, path_and_query))?;
        rule.remaining -= 1;
        let status = rule.status;
        state.rules.retain(|r| r.remaining > 0);
        Some(status)
    }

    pub(super) fn take_watch_expiry(&self) -> bool {
        let mut state = self.lock();
        if state.expire_watches == 0 {
            return false;
        }
        state.expire_watches -= 1;
        true
    }

    /// Cancelled when `drop_watches` is next called.
    pub(super) fn watch_cut(&self) -> CancellationToken {
        self.lock().watches_cut.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_fail_a_limited_number_of_matching_requests() {
        let faults = Faults::default();
        faults.fail(
            FailRule::matching("/ingresses", 2)
                .with_status(503)
                .with_method("GET"),
        );
        faults.fail_next(1);
        assert_eq!(
            faults.take_failure("POST", "/apis/networking.k8s.io/v1/namespaces/a/ingresses"),
            Some(500)
        );
        assert_eq!(faults.take_failure("GET", "/api/v1/services"), None);
        assert_eq!(
            faults.take_failure("GET", "/apis/networking.k8s.io/v1/ingresses?watch=1"),
            Some(503)
        );
        assert_eq!(
            faults.take_failure("get", "/apis/networking.k8s.io/v1/ingresses"),
            Some(503)
        );
        assert_eq!(
            faults.take_failure("GET", "/apis/networking.k8s.io/v1/ingresses"),
            None
        );
        assert_eq!(faults.pending_failures(), 0);
    }

    #[test]
    fn watch_expiry_and_cuts() {
        let faults = Faults::default();
        faults.expire_next_watches(1);
        assert!(faults.take_watch_expiry());
        assert!(!faults.take_watch_expiry());
        let cut = faults.watch_cut();
        faults.drop_watches();
        assert!(cut.is_cancelled());
        assert!(!faults.watch_cut().is_cancelled());
    }
}
