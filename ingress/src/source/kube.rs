//! The Kubernetes source: one watch per kind, fed into the same store as the manifests source.
//!
//! ```text
//!   watcher(Ingress)        ─┐
//!   watcher(IngressClass)    │   Init … InitApply* … InitDone ─> SourceEvent::ReplaceKind (atomic)
//!   watcher(Service)         ├─> Apply / Delete              ─> SourceEvent::Apply / Delete
//!   watcher(EndpointSlice)   │   every watch listed once     ─> SourceEvent::Synced
//!   watcher(Secret, -types)  │
//!   watcher(ConfigMap)       │   in the watched namespaces (all by default), as ingress-nginx
//!   watcher(ConfigMap,       ┘   the --configmap one, by name, only when --watch-namespace
//!     metadata.name=NAME)        leaves its namespace out (ReplaceIn: its own scope)
//! ```
//!
//! ConfigMaps are read whole because what an Ingress or the global ConfigMap references
//! (`custom-headers`, `auth-proxy-set-headers`, `add-headers`, `proxy-set-headers`) can be any
//! of them and may appear later; the pipeline builds a snapshot only for a change to one that
//! is referenced (`snapshot::referenced_config_maps`), so the ConfigMaps other controllers
//! rewrite all day cost memory, not rebuilds.
//!
//! A relist (after a 410 Gone, a dropped watch, or an API server restart) is buffered and handed
//! over whole, so the store never passes through a state where a route is missing. While the API
//! server is unreachable the watchers back off and retry; the last snapshot keeps serving.

use std::fmt::Debug;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::{Ingress, IngressClass};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;
use tokio::sync::mpsc;

use crate::store::SourceEvent;
use crate::store::{Kind, Object};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// The Secrets an Ingress can name: TLS certificates (`kubernetes.io/tls`), and the `Opaque`
/// ones `auth-secret`, `auth-tls-secret` and `proxy-ssl-secret` point at (ingress-nginx's docs
/// make them with `kubectl create secret generic`). A field selector cannot say "tls or
/// Opaque", so the watch names what it leaves out instead: the types no annotation can use, of
/// which Helm's release records and service-account tokens are most of a cluster's Secret
/// bytes. RBAC is unchanged (it cannot express a field selector either).
pub const SECRET_FIELD_SELECTOR: &str = "type!=helm.sh/release.v1,\
    type!=kubernetes.io/service-account-token,\
    type!=kubernetes.io/dockerconfigjson,\
    type!=kubernetes.io/dockercfg,\
    type!=kubernetes.io/basic-auth,\
    type!=kubernetes.io/ssh-auth,\
    type!=bootstrap.kubernetes.io/token";

const ALL_KINDS: [Kind; 6] = [
    Kind::Ingress,
    Kind::IngressClass,
    Kind::Service,
    Kind::EndpointSlice,
    Kind::Secret,
    Kind::ConfigMap,
];

/// The sync bit of the by-name watch of the `--configmap` one outside `--watch-namespace`.
const GLOBAL_CONFIG_MAP_BIT: u8 = 1 << 7;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    pub kind: &'static str,
}

/// What the watches count: failures by kind, and when each kind last heard from the API server.
#[derive(Default)]
pub struct WatchMetrics {
    pub errors: Family<KindLabels, Counter>,
    pub last_sync: Family<KindLabels, Gauge>,
}

impl WatchMetrics {
    pub fn register(registry: &mut Registry) -> Arc<WatchMetrics> {
        let metrics = WatchMetrics::default();
        registry.register(
            "kube_watch_errors",
            "Kubernetes watch failures by kind; each is retried with backoff (a relist follows)",
            metrics.errors.clone(),
        );
        registry.register(
            "kube_last_sync_timestamp_seconds",
            "Unix time of the last list or watch event received, by kind",
            metrics.last_sync.clone(),
        );
        Arc::new(metrics)
    }
}

pub struct KubeSource {
    pub client: Client,
    /// Limit namespaced kinds to one namespace (`--watch-namespace`).
    pub namespace: Option<String>,
    pub metrics: Arc<WatchMetrics>,
    /// `--configmap`: the global ConfigMap (watched by name of its own when `namespace`
    /// leaves it out).
    pub config_map: Option<crate::store::ObjectKey>,
}

impl KubeSource {
    /// Starts the watches (six, seven with a `--configmap` outside `--watch-namespace`). They
    /// run until the sender's receiver is gone.
    pub fn start(self, events: mpsc::UnboundedSender<SourceEvent>) {
        let global_apart = self.global_outside_namespace();
        let synced = Arc::new(SyncTracker::new(global_apart.is_some()));
        let namespaced = |client: &Client| -> (
            Api<Ingress>,
            Api<Service>,
            Api<EndpointSlice>,
            Api<Secret>,
            Api<ConfigMap>,
        ) {
            match &self.namespace {
                Some(ns) => (
                    Api::namespaced(client.clone(), ns),
                    Api::namespaced(client.clone(), ns),
                    Api::namespaced(client.clone(), ns),
                    Api::namespaced(client.clone(), ns),
                    Api::namespaced(client.clone(), ns),
                ),
                None => (
                    Api::all(client.clone()),
                    Api::all(client.clone()),
                    Api::all(client.clone()),
                    Api::all(client.clone()),
                    Api::all(client.clone()),
                ),
            }
        };
        let (ingresses, services, slices, secrets, config_maps) = namespaced(&self.client);
        let classes: Api<IngressClass> = Api::all(self.client.clone());
        let ctx = |kind: Kind| Watch {
            kind,
            scope: Scope::Kind,
            sync_bit: 1 << (kind as u8),
            events: events.clone(),
            synced: synced.clone(),
            metrics: self.metrics.clone(),
        };
        tokio::spawn(
            ctx(Kind::Ingress).run(ingresses, watcher::Config::default(), |o| {
                Object::Ingress(Arc::new(o))
            }),
        );
        tokio::spawn(
            ctx(Kind::IngressClass).run(classes, watcher::Config::default(), |o| {
                Object::IngressClass(Arc::new(o))
            }),
        );
        tokio::spawn(
            ctx(Kind::Service).run(services, watcher::Config::default(), |o| {
                Object::Service(Arc::new(o))
            }),
        );
        tokio::spawn(
            ctx(Kind::EndpointSlice).run(slices, watcher::Config::default(), |o| {
                Object::EndpointSlice(Arc::new(o))
            }),
        );
        tokio::spawn(ctx(Kind::Secret).run(
            secrets,
            watcher::Config::default().fields(SECRET_FIELD_SELECTOR),
            |o| Object::Secret(Arc::new(o)),
        ));
        // With --watch-namespace, a relist of the namespace's ConfigMaps must not drop the
        // global one the other watch keeps, and the reverse.
        let scope = match &self.namespace {
            Some(ns) if global_apart.is_some() => Scope::In {
                namespace: ns.clone(),
                name: None,
            },
            _ => Scope::Kind,
        };
        tokio::spawn(
            Watch {
                scope,
                ..ctx(Kind::ConfigMap)
            }
            .run(config_maps, watcher::Config::default(), |o| {
                Object::ConfigMap(Arc::new(o))
            }),
        );
        if let Some(key) = global_apart {
            let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), &key.namespace);
            tokio::spawn(
                Watch {
                    scope: Scope::In {
                        namespace: key.namespace.clone(),
                        name: Some(key.name.clone()),
                    },
                    sync_bit: GLOBAL_CONFIG_MAP_BIT,
                    ..ctx(Kind::ConfigMap)
                }
                .run(
                    api,
                    watcher::Config::default().fields(&config_map_selector(&key.name)),
                    |o| Object::ConfigMap(Arc::new(o)),
                ),
            );
        }
    }

    /// The `--configmap` one when `--watch-namespace` does not cover it.
    fn global_outside_namespace(&self) -> Option<crate::store::ObjectKey> {
        match (&self.config_map, &self.namespace) {
            (Some(key), Some(ns)) if key.namespace != *ns => Some(key.clone()),
            _ => None,
        }
    }
}

/// What a watch's (re)list replaces in the store.
#[derive(Clone, Debug)]
enum Scope {
    /// Every object of the kind.
    Kind,
    /// Those of one namespace (one object of it, with `name`).
    In {
        namespace: String,
        name: Option<String>,
    },
}

/// The field selector that narrows a ConfigMap watch to the one object.
pub fn config_map_selector(name: &str) -> String {
    format!("metadata.name={name}")
}

/// Drops what routing never reads but every object carries: `managedFields` and kubectl's
/// copy of the whole object in `last-applied-configuration`. On a large cluster these are most
/// of the bytes the store would otherwise hold.
fn slim<K: Resource>(mut object: K) -> K {
    let meta = object.meta_mut();
    meta.managed_fields = None;
    if let Some(annotations) = meta.annotations.as_mut() {
        annotations.remove(LAST_APPLIED);
    }
    object
}

const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// Remembers which kinds have completed their first list, and says `Synced` once.
struct SyncTracker {
    listed: AtomicU8,
    /// The watches' bits: one per kind, and the global ConfigMap's own watch.
    all: u8,
}

impl Default for SyncTracker {
    fn default() -> Self {
        Self::new(false)
    }
}

impl SyncTracker {
    fn new(global_apart: bool) -> Self {
        let mut all: u8 = ALL_KINDS.iter().fold(0, |acc, k| acc | (1 << (*k as u8)));
        if global_apart {
            all |= GLOBAL_CONFIG_MAP_BIT;
        }
        Self {
            listed: AtomicU8::new(0),
            all,
        }
    }

    /// Marks a watch (its bit) listed; true exactly once, when the last one completes.
    fn mark(&self, bit: u8) -> bool {
        let all = self.all;
        let before = self.listed.fetch_or(bit, Ordering::AcqRel);
        before != all && (before | bit) == all
    }
}

struct Watch {
    kind: Kind,
    scope: Scope,
    sync_bit: u8,
    events: mpsc::UnboundedSender<SourceEvent>,
    synced: Arc<SyncTracker>,
    metrics: Arc<WatchMetrics>,
}

impl Watch {
    async fn run<K>(self, api: Api<K>, config: watcher::Config, wrap: fn(K) -> Object)
    where
        K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
    {
        let labels = KindLabels {
            kind: self.kind.as_str(),
        };
        let mut stream = watcher::watcher(api, config)
            .backoff(WatchBackoff::default())
            .boxed();
        let mut relist: Option<Vec<Object>> = None;
        while let Some(item) = stream.next().await {
            let event = match item {
                Ok(event) => event,
                Err(err) => {
                    self.metrics.errors.get_or_create(&labels).inc();
                    tracing::warn!(kind = %self.kind, %err, "watch failed; retrying with backoff, the last snapshot keeps serving");
                    continue;
                }
            };
            let sent = match event {
                Event::Init => {
                    relist = Some(Vec::new());
                    true
                }
                Event::InitApply(object) => {
                    relist.get_or_insert_with(Vec::new).push(wrap(slim(object)));
                    true
                }
                Event::InitDone => {
                    let objects = relist.take().unwrap_or_default();
                    tracing::info!(kind = %self.kind, objects = objects.len(), "listed");
                    let event = match &self.scope {
                        Scope::Kind => SourceEvent::ReplaceKind(self.kind, objects),
                        Scope::In { namespace, name } => SourceEvent::ReplaceIn {
                            kind: self.kind,
                            namespace: namespace.clone(),
                            name: name.clone(),
                            objects,
                        },
                    };
                    let ok = self.events.send(event).is_ok();
                    self.metrics
                        .last_sync
                        .get_or_create(&labels)
                        .set(crate::clock::unix_now());
                    if self.synced.mark(self.sync_bit) {
                        tracing::info!("all watches listed; building the first snapshot");
                        let _ = self.events.send(SourceEvent::Synced);
                    }
                    ok
                }
                Event::Apply(object) => {
                    self.metrics
                        .last_sync
                        .get_or_create(&labels)
                        .set(crate::clock::unix_now());
                    self.events
                        .send(SourceEvent::Apply(wrap(slim(object))))
                        .is_ok()
                }
                Event::Delete(object) => {
                    self.metrics
                        .last_sync
                        .get_or_create(&labels)
                        .set(crate::clock::unix_now());
                    let key = wrap(object).key();
                    self.events
                        .send(SourceEvent::Delete(self.kind, key))
                        .is_ok()
                }
            };
            if !sent {
                return;
            }
        }
    }
}

/// How long a failed list or watch waits before it is retried: exponential from 200 ms to 10 s,
/// with ±25% jitter so the replicas of a DaemonSet do not retry in step. kube-rs's default goes
/// up to 30 s; 10 s keeps the time from an API server's return to fresh routes short, at five
/// requests per replica per 10 s while it is away.
#[derive(Debug)]
struct WatchBackoff {
    next: Duration,
}

const BACKOFF_FIRST: Duration = Duration::from_millis(200);
const BACKOFF_MAX: Duration = Duration::from_secs(10);

impl Default for WatchBackoff {
    fn default() -> Self {
        Self {
            next: BACKOFF_FIRST,
        }
    }
}

impl Iterator for WatchBackoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let delay = self.next;
        self.next = (self.next * 2).min(BACKOFF_MAX);
        Some(delay.mul_f64(0.75 + fastrand::f64() / 2.0))
    }
}

impl kube::runtime::utils::Backoff for WatchBackoff {
    fn reset(&mut self) {
        self.next = BACKOFF_FIRST;
    }
}

/// Builds a client from `--kubeconfig`, else `KUBECONFIG` or `~/.kube/config`, else the
/// in-cluster service account. `instance` goes into the User-Agent (`ingress/<version>
/// (<instance>)`), so API server audit logs tell the replicas apart.
pub async fn client(
    kubeconfig: Option<&std::path::Path>,
    instance: &str,
) -> Result<Client, KubeError> {
    let mut config = match kubeconfig {
        // A KUBECONFIG list (a:b) is merged the way kubectl merges it.
        Some(path) if path.to_string_lossy().contains(':') => kube::Config::infer()
            .await
            .map_err(|e| KubeError::Config(e.to_string()))?,
        Some(path) => {
            let kubeconfig = kube::config::Kubeconfig::read_from(path)
                .map_err(|e| KubeError::Config(e.to_string()))?;
            kube::Config::from_custom_kubeconfig(
                kubeconfig,
                &kube::config::KubeConfigOptions::default(),
            )
            .await
            .map_err(|e| KubeError::Config(e.to_string()))?
        }
        None => kube::Config::infer()
            .await
            .map_err(|e| KubeError::Config(e.to_string()))?,
    };
    let agent = format!("ingress/{} ({instance})", env!("CARGO_PKG_VERSION"));
    let agent = http::HeaderValue::from_str(&agent).unwrap_or_else(|_| {
        http::HeaderValue::from_static(concat!("ingress/", env!("CARGO_PKG_VERSION")))
    });
    config.headers.push((http::header::USER_AGENT, agent));
    Client::try_from(config).map_err(|e| KubeError::Client(e.to_string()))
}

/// Lists every kind once into a store: what `ingress check` reads from a cluster (with the
/// `--configmap` one, when `namespace` leaves it out).
pub async fn list_once(
    kubeconfig: Option<&std::path::Path>,
    namespace: Option<&str>,
    config_map: Option<&crate::store::ObjectKey>,
) -> Result<crate::store::Store, KubeError> {
    use kube::api::ListParams;
    let client = client(kubeconfig, "check").await?;
    let mut store = crate::store::Store::default();
    async fn list<K>(
        api: Api<K>,
        params: &ListParams,
        wrap: fn(K) -> Object,
        store: &mut crate::store::Store,
    ) -> Result<(), KubeError>
    where
        K: Resource + Clone + DeserializeOwned + Debug,
    {
        for object in api
            .list(params)
            .await
            .map_err(|e| KubeError::Client(e.to_string()))?
        {
            store.apply(wrap(object));
        }
        Ok(())
    }
    let all = ListParams::default();
    let secrets = ListParams::default().fields(SECRET_FIELD_SELECTOR);
    macro_rules! scoped {
        () => {
            match namespace {
                Some(ns) => Api::namespaced(client.clone(), ns),
                None => Api::all(client.clone()),
            }
        };
    }
    list::<Ingress>(
        scoped!(),
        &all,
        |o| Object::Ingress(Arc::new(o)),
        &mut store,
    )
    .await?;
    list::<IngressClass>(
        Api::all(client.clone()),
        &all,
        |o| Object::IngressClass(Arc::new(o)),
        &mut store,
    )
    .await?;
    list::<Service>(
        scoped!(),
        &all,
        |o| Object::Service(Arc::new(o)),
        &mut store,
    )
    .await?;
    list::<EndpointSlice>(
        scoped!(),
        &all,
        |o| Object::EndpointSlice(Arc::new(o)),
        &mut store,
    )
    .await?;
    list::<Secret>(
        scoped!(),
        &secrets,
        |o| Object::Secret(Arc::new(o)),
        &mut store,
    )
    .await?;
    list::<ConfigMap>(
        scoped!(),
        &all,
        |o| Object::ConfigMap(Arc::new(o)),
        &mut store,
    )
    .await?;
    if let Some(key) = config_map.filter(|k| namespace.is_some_and(|ns| ns != k.namespace)) {
        list::<ConfigMap>(
            Api::namespaced(client.clone(), &key.namespace),
            &ListParams::default().fields(&config_map_selector(&key.name)),
            |o| Object::ConfigMap(Arc::new(o)),
            &mut store,
        )
        .await?;
    }
    Ok(store)
}

#[derive(Debug, thiserror::Error)]
pub enum KubeError {
    #[error("kubeconfig: {0}")]
    Config(String),
    #[error("kubernetes client: {0}")]
    Client(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slim_keeps_what_routing_reads() {
        let ingress: k8s_openapi::api::networking::v1::Ingress =
            serde_json::from_value(serde_json::json!({
                "metadata": {
                    "name": "web", "namespace": "shop",
                    "annotations": {
                        LAST_APPLIED: "{\"huge\": true}",
                        "nginx.ingress.kubernetes.io/ssl-redirect": "false"
                    },
                    "managedFields": [{"manager": "kubectl", "operation": "Apply"}]
                },
                "spec": {"ingressClassName": "ingress"}
            }))
            .unwrap();
        let slimmed = slim(ingress.clone());
        assert_eq!(slimmed.metadata.managed_fields, None);
        let annotations = slimmed.metadata.annotations.clone().unwrap();
        assert_eq!(
            annotations.keys().collect::<Vec<_>>(),
            ["nginx.ingress.kubernetes.io/ssl-redirect"]
        );
        assert_eq!(slimmed.spec, ingress.spec);
        assert_eq!(slimmed.metadata.name, ingress.metadata.name);
    }

    #[test]
    fn synced_once_after_every_kind() {
        let bit = |kind: Kind| 1u8 << (kind as u8);
        let t = SyncTracker::default();
        assert!(!t.mark(bit(Kind::Ingress)));
        assert!(!t.mark(bit(Kind::Ingress)));
        assert!(!t.mark(bit(Kind::Service)));
        assert!(!t.mark(bit(Kind::IngressClass)));
        assert!(!t.mark(bit(Kind::Secret)));
        assert!(!t.mark(bit(Kind::ConfigMap)));
        assert!(t.mark(bit(Kind::EndpointSlice)));
        assert!(
            !t.mark(bit(Kind::EndpointSlice)),
            "a relist later does not sync again"
        );
        let t = SyncTracker::new(true);
        for kind in ALL_KINDS {
            assert!(
                !t.mark(bit(kind)),
                "{kind}: the global ConfigMap's own watch is still to come"
            );
        }
        assert!(t.mark(GLOBAL_CONFIG_MAP_BIT));
    }

    #[test]
    fn backoff_grows_to_its_cap_and_resets() {
        use kube::runtime::utils::Backoff;
        let mut b = WatchBackoff::default();
        let delays: Vec<Duration> = b.by_ref().take(12).collect();
        let within =
            |d: Duration, base: Duration| d >= base.mul_f64(0.75) && d <= base.mul_f64(1.25);
        assert!(within(delays[0], BACKOFF_FIRST), "{delays:?}");
        assert!(within(delays[1], BACKOFF_FIRST * 2), "{delays:?}");
        assert!(
            delays[6..].iter().all(|d| within(*d, BACKOFF_MAX)),
            "{delays:?}"
        );
        b.reset();
        assert!(within(b.next().unwrap(), BACKOFF_FIRST));
    }
}
