//! Every request the server answered, for tests to assert on how a client talks to it.

use std::collections::VecDeque;
use std::sync::{Mutex, MutexGuard, PoisonError};

/// Bound on kept records, so a long test cannot grow the log without limit.
const MAX_RECORDS: usize = 100_000;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestRecord {
    pub method: String,
    pub path: String,
    /// The raw (still percent-encoded) query string, without `?`.
    pub query: String,
    pub content_type: Option<String>,
    pub accept: Option<String>,
    pub user_agent: Option<String>,
    /// The response status (for a watch: the status of the response head).
    pub status: u16,
}

impl RequestRecord {
    /// A decoded query parameter, e.g. `param("fieldSelector") == Some("type=kubernetes.io/tls")`.
    pub fn param(&self, key: &str) -> Option<String> {
        form_urlencoded::parse(self.query.as_bytes())
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.into_owned())
    }

    pub fn is_watch(&self) -> bool {
        self.param("watch").is_some_and(|w| w == "1" || w == "true")
            || self.path.contains("/watch/")
    }
}

#[derive(Default)]
pub struct RequestLog {
    records: Mutex<VecDeque<RequestRecord>>,
}

impl RequestLog {
    fn lock(&self) -> MutexGuard<'_, VecDeque<RequestRecord>> {
        self.records.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn push(&self, record: RequestRecord) {
        let mut records = self.lock();
        if records.len() >= MAX_RECORDS {
            records.pop_front();
        }
        records.push_back(record);
    }

    /// Every record, oldest first.
    pub fn all(&self) -> Vec<RequestRecord> {
        self.lock().iter().cloned().collect()
    }

    /// Records `keep` accepts, oldest first.
    pub fn matching(&self, keep: impl Fn(&RequestRecord) -> bool) -> Vec<RequestRecord> {
        self.lock().iter().filter(|r| keep(r)).cloned().collect()
    }

    pub fn clear(&self) {
        self.lock().clear();
    }

    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }
}
