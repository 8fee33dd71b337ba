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
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use tokio::sync::{mpsc, watch};

use crate::diagnostics::{Diagnostic, Severity};
use crate::snapshot::{BuildCache, BuildKind, BuildSettings, Snapshot};
use crate::store::{Changes, SourceEvent, Store};

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
    /// Snapshots published, and when the last one was (Unix seconds).
    pub publishes: Counter,
    pub last_publish: Gauge,
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
        let publishes = Counter::default();
        registry.register(
            "snapshot_publishes",
            "Routing snapshots published",
            publishes.clone(),
        );
        let last_publish = Gauge::default();
        registry.register(
            "snapshot_last_publish_timestamp_seconds",
            "When the last routing snapshot was published, as Unix time",
            last_publish.clone(),
        );
        PipelineMetrics {
            build_seconds,
            publishes,
            last_publish,
        }
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

    /// Whether `event` can change the snapshot built from `store`: every event can, except a
    /// change to a ConfigMap nothing references (ConfigMaps are watched whole; most belong to
    /// other software, some rewritten every few seconds).
    fn matters(&self, event: &SourceEvent, store: &Store) -> bool {
        let key = match event {
            SourceEvent::Apply(object @ crate::store::Object::ConfigMap(_)) => object.key(),
            SourceEvent::Delete(crate::store::Kind::ConfigMap, key) => key.clone(),
            _ => return true,
        };
        crate::snapshot::referenced_config_maps(store, self.settings.config_map.as_ref())
            .contains(&key)
    }

    pub async fn run(self, mut events: mpsc::UnboundedReceiver<SourceEvent>) {
        let mut store = Store::default();
        let mut cache = BuildCache::default();
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
            // A refresh tick always builds; events only when one of them can change it.
            let refreshing = first.is_none();
            let mut changed = refreshing;
            if let Some(first) = first {
                changed |= self.matters(&first, &store);
                synced |= store.apply_event(first);
            }
            let deadline = tokio::time::Instant::now() + self.max_delay;
            loop {
                let quiet = tokio::time::sleep(self.debounce);
                tokio::select! {
                    event = events.recv() => match event {
                        Some(event) => {
                            changed |= self.matters(&event, &store);
                            synced |= store.apply_event(event);
                        }
                        None => break,
                    },
                    () = quiet => break,
                    () = tokio::time::sleep_until(deadline) => break,
                }
            }
            if !synced || !changed {
                continue;
            }
            generation += 1;
            let started = Instant::now();
            let mut settings = self.settings.clone();
            settings.tls.now = crate::clock::unix_now();
            // A refresh builds from nothing: whatever an incremental build could get wrong
            // lasts one refresh period at most.
            let changes = match refreshing {
                true => {
                    store.take_changes();
                    Changes::everything()
                }
                false => store.take_changes(),
            };
            // This runs on the pipeline's own thread (see `spawn`), so building blocks no proxy task.
            let snapshot = cache.build(&store, &settings, generation, &changes);
            let build_time = started.elapsed();
            let old = self.published.load_full();
            log_diagnostic_changes(&old.diagnostics, &snapshot.diagnostics);
            self.metrics.build_seconds.observe(build_time.as_secs_f64());
            let kind = match cache.last_kind() {
                BuildKind::Full => "full".to_string(),
                BuildKind::Incremental { ingresses } => {
                    format!("incremental ({ingresses} Ingresses)")
                }
            };
            tracing::info!(
                generation,
                build = %kind,
                hosts = snapshot.hosts.len(),
                ingresses = snapshot.ingresses.len(),
                diagnostics = snapshot.diagnostics.len(),
                build_ms = %format_args!("{:.3}", build_time.as_secs_f64() * 1000.0),
                "snapshot published"
            );
            self.published.publish(Arc::new(snapshot));
            self.metrics.publishes.inc();
            self.metrics.last_publish.set(crate::clock::unix_now());
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

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use k8s_openapi::api::core::v1::Service;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use tokio::time::Instant as TokioInstant;

    use super::*;
    use crate::store::Object;

    /// Records, for each hook call, which generations it was given and which the proxy saw.
    struct Recording {
        published: std::sync::Weak<Published>,
        calls: Mutex<Vec<(&'static str, u64, u64, u64)>>,
    }

    impl Recording {
        fn note(&self, phase: &'static str, new: &Snapshot, old: &Snapshot) {
            let serving = self
                .published
                .upgrade()
                .map_or(u64::MAX, |p| p.load().generation);
            self.calls
                .lock()
                .unwrap()
                .push((phase, new.generation, old.generation, serving));
        }
    }

    impl PublishHook for Recording {
        fn before(&self, new: &Snapshot, old: &Snapshot) {
            self.note("before", new, old);
        }
        fn after(&self, new: &Snapshot, old: &Snapshot) {
            self.note("after", new, old);
        }
    }

    fn generation(n: u64) -> Arc<Snapshot> {
        Arc::new(Snapshot {
            generation: n,
            ..Snapshot::default()
        })
    }

    #[test]
    fn hooks_run_before_the_swap_with_the_old_snapshot_and_after_it_with_the_new() {
        let published = Published::new();
        let recording = Arc::new(Recording {
            published: Arc::downgrade(&published),
            calls: Mutex::new(Vec::new()),
        });
        published.add_hook(recording.clone());
        assert!(!published.has_synced());
        published.publish(generation(1));
        published.publish(generation(2));
        assert!(published.has_synced());
        // (phase, new, old, what the proxy saw during the call)
        assert_eq!(
            *recording.calls.lock().unwrap(),
            [
                // Registering catches the hook up with what is published.
                ("before", 0, 0, 0),
                ("after", 0, 0, 0),
                ("before", 1, 0, 0),
                ("after", 1, 0, 1),
                ("before", 2, 1, 1),
                ("after", 2, 1, 2),
            ]
        );
        published.clear_hooks();
        published.publish(generation(3));
        assert_eq!(recording.calls.lock().unwrap().len(), 6);
    }

    #[tokio::test]
    async fn synced_resolves_on_the_first_publish_only() {
        let published = Published::new();
        let waiting = tokio::spawn({
            let published = published.clone();
            async move { published.synced().await }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        published.publish(generation(1));
        tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("synced() resolved")
            .expect("task");
        // Already synced: resolves at once.
        tokio::time::timeout(Duration::from_secs(5), published.synced())
            .await
            .expect("synced() again");
    }

    fn service(name: &str) -> SourceEvent {
        SourceEvent::Apply(Object::Service(Arc::new(Service {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("t".into()),
                ..ObjectMeta::default()
            },
            ..Service::default()
        })))
    }

    /// A pipeline with a 100 ms debounce and a 500 ms cap, on paused time.
    fn pipeline() -> (Arc<Published>, mpsc::UnboundedSender<SourceEvent>) {
        let published = Published::new();
        let (tx, rx) = mpsc::unbounded_channel();
        let pipeline = Pipeline {
            settings: crate::snapshot::testing::settings(),
            published: published.clone(),
            metrics: PipelineMetrics {
                build_seconds: Histogram::new([1.0]),
                publishes: Counter::default(),
                last_publish: Gauge::default(),
            },
            debounce: Duration::from_millis(100),
            max_delay: Duration::from_millis(500),
            refresh: Duration::from_secs(3600),
        };
        tokio::spawn(pipeline.run(rx));
        (published, tx)
    }

    /// When each of the next `n` publishes happened, from `start`.
    async fn next_publishes(
        published: &Published,
        start: TokioInstant,
        n: usize,
    ) -> Vec<(u64, Duration)> {
        let mut changes = published.subscribe();
        let mut out = Vec::new();
        while out.len() < n {
            tokio::time::timeout(Duration::from_secs(60), changes.changed())
                .await
                .expect("a publish")
                .expect("sender alive");
            let generation = changes.borrow_and_update().generation;
            out.push((generation, start.elapsed()));
        }
        out
    }

    #[tokio::test(start_paused = true)]
    async fn a_burst_is_built_once_when_it_goes_quiet() {
        let (published, tx) = pipeline();
        let start = TokioInstant::now();
        let builds = tokio::spawn({
            let published = published.clone();
            async move { next_publishes(&published, start, 1).await }
        });
        tx.send(SourceEvent::Synced).unwrap();
        for i in 0..5 {
            tx.send(service(&format!("s{i}"))).unwrap();
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let builds = builds.await.unwrap();
        // The last event came at 80 ms; 100 ms of quiet later, one build.
        assert_eq!(builds, [(1, Duration::from_millis(180))]);
        // Nothing more without events.
        let mut changes = published.subscribe();
        assert!(
            tokio::time::timeout(Duration::from_secs(10), changes.changed())
                .await
                .is_err()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_stream_that_never_goes_quiet_is_built_at_least_every_max_delay() {
        let (published, tx) = pipeline();
        tx.send(SourceEvent::Synced).unwrap();
        let start = TokioInstant::now();
        let builds = tokio::spawn({
            let published = published.clone();
            async move { next_publishes(&published, start, 3).await }
        });
        // An event every 50 ms, never 100 ms of quiet, for 1.6 s.
        for i in 0..32 {
            tx.send(service(&format!("s{i}"))).unwrap();
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let builds = builds.await.unwrap();
        let generations: Vec<u64> = builds.iter().map(|(g, _)| *g).collect();
        assert_eq!(generations, [1, 2, 3]);
        // Each build comes at most the 500 ms cap after the burst it ends began, and a burst
        // begins with the first event after the previous build: at most one 50 ms event
        // interval later. (Where in that interval depends on how the paused clock was
        // advanced while a build ran, so an exact multiple of 500 ms is not promised.)
        let mut previous = Duration::ZERO;
        for (_, at) in &builds {
            let gap = at.saturating_sub(previous);
            assert!(
                gap >= Duration::from_millis(500) && gap <= Duration::from_millis(550),
                "a build {gap:?} after the previous one, not within the 500 ms cap of its burst: {builds:?}"
            );
            previous = *at;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn nothing_is_built_before_the_sources_are_synced() {
        let (published, tx) = pipeline();
        let mut changes = published.subscribe();
        tx.send(service("early")).unwrap();
        assert!(
            tokio::time::timeout(Duration::from_secs(5), changes.changed())
                .await
                .is_err(),
            "built before the sources were synced"
        );
        assert!(!published.has_synced());
        tx.send(SourceEvent::Synced).unwrap();
        tokio::time::timeout(Duration::from_secs(5), changes.changed())
            .await
            .expect("built once synced")
            .unwrap();
        assert!(published.has_synced());
        assert_eq!(published.load().generation, 1);
    }
}
