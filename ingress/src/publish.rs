//! Publishing: sources' events → store → one snapshot build → one atomic swap.
//!
//! ```text
//!   SourceEvent ──> Pipeline (coalesces a burst, builds once) ──> Published
//!                                                                  ├─ hooks.before(new, old)   kernel: add names
//!                                                                  ├─ ArcSwap::store(new)      proxy sees it
//!                                                                  ├─ hooks.after(new, old)    kernel: remove names
//!                                                                  └─ watch channel            reporter, metrics
//! ```
//!
//! The hook order is what keeps the kernel and the proxy from disagreeing about a name that is
//! valid before and after a change: the kernel learns new names before the proxy serves them and
//! forgets old names only after the proxy stopped serving them.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use tokio::sync::{mpsc, watch};

use crate::diagnostics::{Diagnostic, Severity};
use crate::snapshot::{BuildSettings, Snapshot};
use crate::store::{SourceEvent, Store};

/// Something that must see each snapshot change in step with the swap.
pub trait PublishHook: Send + Sync {
    /// Runs before `new` becomes visible to the proxy.
    fn before(&self, new: &Snapshot, old: &Snapshot);
    /// Runs after `new` is visible to the proxy.
    fn after(&self, new: &Snapshot, old: &Snapshot);
}

/// The current snapshot, readable from any task without locks.
pub struct Published {
    current: ArcSwap<Snapshot>,
    changes: watch::Sender<Arc<Snapshot>>,
    synced: AtomicBool,
    hooks: std::sync::Mutex<Vec<Arc<dyn PublishHook>>>,
}

impl Published {
    pub fn new() -> Arc<Self> {
        let empty = Arc::new(Snapshot::default());
        let (changes, _) = watch::channel(empty.clone());
        Arc::new(Self {
            current: ArcSwap::new(empty),
            changes,
            synced: AtomicBool::new(false),
            hooks: std::sync::Mutex::new(Vec::new()),
        })
    }

    pub fn load(&self) -> arc_swap::Guard<Arc<Snapshot>> {
        self.current.load()
    }

    pub fn load_full(&self) -> Arc<Snapshot> {
        self.current.load_full()
    }

    pub fn subscribe(&self) -> watch::Receiver<Arc<Snapshot>> {
        self.changes.subscribe()
    }

    /// True once a snapshot built from fully synced sources has been published.
    pub fn has_synced(&self) -> bool {
        self.synced.load(Ordering::Acquire)
    }

    /// Resolves once a snapshot built from fully synced sources has been published.
    pub async fn synced(&self) {
        // Subscribed before the check, so a publish in between is still seen as a change.
        let mut changes = self.changes.subscribe();
        while !self.has_synced() {
            if changes.changed().await.is_err() {
                // The sender lives in `self`; it cannot be gone while we borrow it.
                std::future::pending::<()>().await;
            }
        }
    }

    pub fn add_hook(&self, hook: Arc<dyn PublishHook>) {
        // A poisoned lock means a hook panicked while registering; keep serving regardless.
        let mut hooks = self.hooks.lock().unwrap_or_else(|e| e.into_inner());
        hooks.push(hook.clone());
        hook.before(&self.load(), &Snapshot::default());
        hook.after(&self.load(), &Snapshot::default());
    }

    /// Removes every hook (at shutdown, so what they hold can be released).
    pub fn clear_hooks(&self) {
        self.hooks.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }

    /// Makes `new` the current snapshot, running the hooks around the swap.
    pub fn publish(&self, new: Arc<Snapshot>) {
        let hooks = self.hooks.lock().unwrap_or_else(|e| e.into_inner());
        let old = self.current.load_full();
        for hook in hooks.iter() {
            hook.before(&new, &old);
        }
        self.current.store(new.clone());
        for hook in hooks.iter() {
            hook.after(&new, &old);
        }
        self.synced.store(true, Ordering::Release);
        self.changes.send_replace(new);
    }
}

/// How long builds take; everything else about a snapshot is read from it at scrape time.
#[derive(Clone)]
pub struct PipelineMetrics {
    pub build_seconds: Histogram,
}

impl PipelineMetrics {
    pub fn register(registry: &mut Registry) -> PipelineMetrics {
        let build_seconds =
            Histogram::new([0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5]);
        registry.register(
            "snapshot_build_seconds",
            "Time to build a routing snapshot from the store",
            build_seconds.clone(),
        );
        PipelineMetrics { build_seconds }
    }
}

pub struct Pipeline {
    pub settings: BuildSettings,
    pub published: Arc<Published>,
    pub metrics: PipelineMetrics,
    /// How long the stream must be quiet before a build.
    pub debounce: Duration,
    /// A build happens at most this long after the first event of a burst, however busy.
    pub max_delay: Duration,
    /// Rebuild at least this often even without changes, so certificate expiry is re-judged.
    pub refresh: Duration,
}

impl Pipeline {
    /// Runs the pipeline on a thread of its own: a snapshot build is CPU work that must not
    /// occupy a proxy worker, and it must not depend on how many workers there are.
    pub fn spawn(
        self,
        events: mpsc::UnboundedReceiver<SourceEvent>,
    ) -> std::io::Result<std::thread::JoinHandle<()>> {
        std::thread::Builder::new()
            .name("snapshot-builder".into())
            .spawn(move || {
                match tokio::runtime::Builder::new_current_thread()
                    .enable_time()
                    .build()
                {
                    Ok(runtime) => runtime.block_on(self.run(events)),
                    Err(err) => tracing::error!(%err, "cannot start the snapshot builder"),
                }
            })
    }

    pub async fn run(self, mut events: mpsc::UnboundedReceiver<SourceEvent>) {
        let mut store = Store::default();
        let mut synced = false;
        let mut generation = 0;
        let mut refresh = tokio::time::interval(self.refresh);
        refresh.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        refresh.tick().await;
        loop {
            let first = tokio::select! {
                event = events.recv() => match event {
                    Some(event) => Some(event),
                    None => return,
                },
                _ = refresh.tick() => None,
            };
            if let Some(first) = first {
                synced |= store.apply_event(first);
            }
            let deadline = tokio::time::Instant::now() + self.max_delay;
            loop {
                let quiet = tokio::time::sleep(self.debounce);
                tokio::select! {
                    event = events.recv() => match event {
                        Some(event) => synced |= store.apply_event(event),
                        None => break,
                    },
                    () = quiet => break,
                    () = tokio::time::sleep_until(deadline) => break,
                }
            }
            if !synced {
                continue;
            }
            generation += 1;
            let started = Instant::now();
            let mut settings = self.settings.clone();
            settings.tls.now = crate::clock::unix_now();
            // This runs on the pipeline's own thread (see `spawn`), so building blocks no proxy task.
            let snapshot = Snapshot::build(&store, &settings, generation);
            let build_time = started.elapsed();
            let old = self.published.load_full();
            log_diagnostic_changes(&old.diagnostics, &snapshot.diagnostics);
            self.metrics.build_seconds.observe(build_time.as_secs_f64());
            tracing::info!(
                generation,
                hosts = snapshot.hosts.len(),
                ingresses = snapshot.ingresses.len(),
                diagnostics = snapshot.diagnostics.len(),
                build_ms = %format_args!("{:.3}", build_time.as_secs_f64() * 1000.0),
                "snapshot published"
            );
            self.published.publish(Arc::new(snapshot));
        }
    }
}

/// Logs each diagnostic once when it appears and once when it is resolved, instead of the whole
/// list on every rebuild.
fn log_diagnostic_changes(old: &[Diagnostic], new: &[Diagnostic]) {
    let old: BTreeSet<&Diagnostic> = old.iter().collect();
    let new_set: BTreeSet<&Diagnostic> = new.iter().collect();
    for d in new_set.difference(&old) {
        match d.severity {
            Severity::Error => {
                tracing::error!(kind = %d.kind, subject = %d.subject, "{}", d.message)
            }
            Severity::Warning => {
                tracing::warn!(kind = %d.kind, subject = %d.subject, "{}", d.message)
            }
        }
    }
    for d in old.difference(&new_set) {
        tracing::info!(kind = %d.kind, subject = %d.subject, "resolved: {}", d.message);
    }
}
