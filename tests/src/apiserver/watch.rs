//! Watch responses: a chunked body of newline-delimited `WatchEvent`s.
//!
//! The stream lives inside the response body, so a client that goes away (or a server
//! stop that drops the connection) drops it; nothing is left running.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::Stream;
use serde_json::{Value, json};
use tokio::sync::broadcast;
use tokio::time::{Instant, Interval};
use tokio_util::sync::CancellationToken;

use super::resource::ResourceDef;
use super::selectors::{FieldSelector, LabelSelector};
use super::status::ApiError;
use super::store::{Change, ChangeKind, ObjectKey, Store};
use super::table::{self, Column};

/// Where a watch starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// Synthetic ADDED events for the current state first; with `end_bookmark`, followed by
    /// the `k8s.io/initial-events-end` bookmark (`sendInitialEvents=true`).
    CurrentState { end_bookmark: bool },
    /// Only changes after the current resourceVersion.
    Now,
    /// Changes after this resourceVersion.
    After(u64),
}

pub struct WatchRequest {
    pub def: &'static ResourceDef,
    pub namespace: Option<String>,
    pub labels: LabelSelector,
    pub fields: FieldSelector,
    pub start: Start,
    /// Bookmark period, if the client allowed bookmarks.
    pub bookmarks: Option<Duration>,
    pub timeout: Option<Duration>,
    /// Cancelled to break the connection (fault injection).
    pub cut: CancellationToken,
    /// Send each object as a one-row Table (`kubectl get -w` asks for that).
    pub table: Option<TableFormat>,
}

/// How to print objects as Tables: the columns, and `includeObject`.
pub struct TableFormat {
    pub columns: &'static [Column],
    pub include_object: Option<String>,
}

impl TableFormat {
    fn render(&self, object: &Value) -> Value {
        let rv = object
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
            .unwrap_or_default();
        table::table(
            self.columns,
            std::slice::from_ref(object),
            rv,
            self.include_object.as_deref(),
        )
    }
}

/// The error that ends a watch body abruptly, so the client sees a broken connection.
#[derive(Debug, thiserror::Error)]
#[error("watch connection dropped by fault injection")]
pub struct WatchCut;

/// A stream that sends one ERROR event and ends, as the real server reports watch failures.
pub fn error_stream(
    error: &ApiError,
) -> impl Stream<Item = Result<Bytes, WatchCut>> + Send + use<> {
    let line = event_line("ERROR", &error.to_status());
    futures_util::stream::iter([Ok(line)])
}

fn event_line(kind: &str, object: &Value) -> Bytes {
    let mut line = serde_json::to_vec(&json!({"type": kind, "object": object})).unwrap_or_default();
    line.push(b'\n');
    Bytes::from(line)
}

struct Watch {
    req: WatchRequest,
    pending: VecDeque<Bytes>,
    backlog: VecDeque<Arc<Change>>,
    changes: broadcast::Receiver<Arc<Change>>,
    /// The resourceVersion this watch has seen every change up to; bookmarks carry it.
    progress: u64,
    bookmarks: Option<Interval>,
    deadline: Option<Instant>,
    finished: bool,
}

/// Opens a watch; an error is sent to the client as an ERROR event.
pub fn open(
    store: &Store,
    req: WatchRequest,
) -> Result<impl Stream<Item = Result<Bytes, WatchCut>> + Send + use<>, ApiError> {
    let mut pending = VecDeque::new();
    let (backlog, changes, progress) = {
        let inner = store.lock();
        let current = inner.rv();
        match req.start {
            Start::CurrentState { end_bookmark } => {
                for (_, object) in inner.list(req.def, req.namespace.as_deref()) {
                    let object = req.def.present(object);
                    if req.labels.matches(&object) && req.fields.matches(&object) {
                        pending.push_back(object_line(&req, "ADDED", &object));
                    }
                }
                if end_bookmark {
                    pending.push_back(bookmark(req.def, current, true));
                }
                (VecDeque::new(), inner.subscribe_now(), current)
            }
            Start::Now => (VecDeque::new(), inner.subscribe_now(), current),
            Start::After(rv) if rv > current => {
                return Err(ApiError::TooLargeResourceVersion {
                    requested: rv,
                    current,
                });
            }
            Start::After(rv) => match inner.subscribe_from(rv) {
                Some(replay) => (replay.backlog.into(), replay.changes, rv),
                None => {
                    return Err(ApiError::Expired {
                        requested: rv,
                        oldest: inner.oldest_rv(),
                    });
                }
            },
        }
    };
    let bookmarks = req.bookmarks.map(|period| {
        let period = period.max(Duration::from_millis(10));
        let first = Instant::now()
            .checked_add(period)
            .unwrap_or_else(Instant::now);
        tokio::time::interval_at(first, period)
    });
    // A timeout too far away to represent is no timeout.
    let deadline = req.timeout.and_then(|t| Instant::now().checked_add(t));
    let watch = Watch {
        req,
        pending,
        backlog,
        changes,
        progress,
        bookmarks,
        deadline,
        finished: false,
    };
    Ok(futures_util::stream::unfold(
        watch,
        |mut watch| async move {
            let item = watch.next().await?;
            Some((item, watch))
        },
    ))
}

fn object_line(req: &WatchRequest, kind: &str, object: &Value) -> Bytes {
    match &req.table {
        Some(format) => event_line(kind, &format.render(object)),
        None => event_line(kind, object),
    }
}

fn bookmark(def: &ResourceDef, rv: u64, initial_events_end: bool) -> Bytes {
    let mut object = json!({
        "kind": def.kind,
        "apiVersion": def.api_version(),
        "metadata": {"resourceVersion": rv.to_string()},
    });
    if initial_events_end {
        object["metadata"]["annotations"] = json!({"k8s.io/initial-events-end": "true"});
    }
    event_line("BOOKMARK", &object)
}

async fn tick(interval: &mut Option<Interval>) {
    match interval {
        Some(interval) => {
            interval.tick().await;
        }
        None => std::future::pending().await,
    }
}

async fn until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

impl Watch {
    async fn next(&mut self) -> Option<Result<Bytes, WatchCut>> {
        loop {
            if let Some(line) = self.pending.pop_front() {
                return Some(Ok(line));
            }
            if self.finished {
                return None;
            }
            if let Some(change) = self.backlog.pop_front() {
                self.progress = change.rv;
                if let Some(line) = self.event_for(&change) {
                    return Some(Ok(line));
                }
                continue;
            }
            tokio::select! {
                biased;
                () = self.req.cut.cancelled() => {
                    self.finished = true;
                    return Some(Err(WatchCut));
                }
                () = until(self.deadline) => return None,
                received = self.changes.recv() => match received {
                    Ok(change) => {
                        self.progress = change.rv;
                        if let Some(line) = self.event_for(&change) {
                            return Some(Ok(line));
                        }
                    }
                    // Too slow, or the store is gone: end cleanly; the client resumes from
                    // its last resourceVersion, out of the history.
                    Err(_) => return None,
                },
                () = tick(&mut self.bookmarks) => return Some(Ok(bookmark(self.req.def, self.progress, false))),
            }
        }
    }

    fn wants(&self, key: &ObjectKey) -> bool {
        (key.group, key.version, key.resource) == self.req.def.storage()
            && self
                .req
                .namespace
                .as_deref()
                .is_none_or(|ns| key.namespace == ns)
    }

    fn selects(&self, object: &Value) -> bool {
        self.req.labels.matches(object) && self.req.fields.matches(object)
    }

    /// The event this watcher sees for a change: an object moving out of the selection is
    /// DELETED, one moving in is ADDED, as with kube-apiserver's filtered watches.
    fn event_for(&self, change: &Change) -> Option<Bytes> {
        if !self.wants(&change.key) {
            return None;
        }
        let object = self.req.def.present(change.object.clone());
        let now = self.selects(&object);
        let before = change
            .old
            .clone()
            .map(|old| self.req.def.present(old))
            .is_some_and(|old| self.selects(&old));
        let kind = match change.kind {
            ChangeKind::Added if now => "ADDED",
            ChangeKind::Modified if now && before => "MODIFIED",
            ChangeKind::Modified if now => "ADDED",
            ChangeKind::Modified if before => "DELETED",
            ChangeKind::Deleted if now || before => "DELETED",
            _ => return None,
        };
        Some(object_line(&self.req, kind, &object))
    }
}
