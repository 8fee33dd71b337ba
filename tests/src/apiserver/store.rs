//! The in-memory object store: one lock, one resourceVersion counter, a bounded change history.
//!
//! Every write happens under the lock and is, in the same critical section, given the next
//! resourceVersion, appended to the history and broadcast. A watch that subscribes under
//! the same lock therefore sees each change exactly once: from the history if it happened
//! before the subscription, from the channel if after.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use serde_json::{Value, json};
use tokio::sync::broadcast;

use super::objects;
use super::resource::ResourceDef;

/// Namespaces every cluster starts with.
const DEFAULT_NAMESPACES: [&str; 4] = ["default", "kube-system", "kube-public", "kube-node-lease"];

/// How many changes a watcher may fall behind before its watch is ended (it then resumes
/// from the history, or relists after a 410).
const CHANNEL_CAPACITY: usize = 4096;

/// Where one object lives. Resources that are views of another (events.k8s.io Events) use
/// the key of their storage.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectKey {
    pub group: &'static str,
    pub version: &'static str,
    pub resource: &'static str,
    /// Empty for cluster-scoped objects.
    pub namespace: String,
    pub name: String,
}

impl ObjectKey {
    pub fn new(def: &ResourceDef, namespace: Option<&str>, name: &str) -> Self {
        let (group, version, resource) = def.storage();
        let namespace = if def.namespaced {
            namespace.unwrap_or_default()
        } else {
            ""
        };
        Self {
            group,
            version,
            resource,
            namespace: namespace.to_string(),
            name: name.to_string(),
        }
    }

    fn in_storage_of(&self, def: &ResourceDef) -> bool {
        (self.group, self.version, self.resource) == def.storage()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeKind {
    Added,
    Modified,
    Deleted,
}

/// One committed write, in stored form.
#[derive(Debug)]
pub struct Change {
    pub rv: u64,
    pub kind: ChangeKind,
    pub key: ObjectKey,
    /// The new object; for a delete, the last state with the deletion's resourceVersion.
    pub object: Value,
    /// The object before the change, if there was one.
    pub old: Option<Value>,
}

/// What a watch resuming from a resourceVersion gets: the changes it missed, in order,
/// and a receiver for every change after them.
pub struct Replay {
    pub backlog: Vec<Arc<Change>>,
    pub changes: broadcast::Receiver<Arc<Change>>,
}

/// Shared handle to the store.
#[derive(Clone)]
pub struct Store {
    inner: Arc<Mutex<Inner>>,
}

pub struct Inner {
    objects: BTreeMap<ObjectKey, Value>,
    rv: u64,
    history: VecDeque<Arc<Change>>,
    history_limit: usize,
    /// Watches from a resourceVersion below this have lost changes: they get 410 Expired.
    oldest_rv: u64,
    changes: broadcast::Sender<Arc<Change>>,
}

impl Store {
    pub fn new(history_limit: usize) -> Self {
        let (changes, _) = broadcast::channel(CHANNEL_CAPACITY);
        let mut inner = Inner {
            objects: BTreeMap::new(),
            rv: 0,
            history: VecDeque::new(),
            history_limit: history_limit.max(1),
            oldest_rv: 0,
            changes,
        };
        inner.seed();
        Self {
            inner: Arc::new(Mutex::new(inner)),
        }
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic elsewhere under this lock leaves consistent maps (every mutation is a single
        // insert/remove), so the data is still good to serve.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Creates each object (its `apiVersion` and `kind` say what it is) as a create through
    /// the API would, with system fields and defaults, but without a request each: for seeding
    /// tens of thousands of objects before a controller starts. A namespace must exist before
    /// objects in it. Returns how many were stored.
    pub fn seed(
        &self,
        objects: impl IntoIterator<Item = Value>,
    ) -> std::result::Result<usize, String> {
        let mut inner = self.lock();
        let mut stored = 0;
        for mut object in objects {
            let api_version = object["apiVersion"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            let kind = object["kind"].as_str().unwrap_or_default().to_string();
            let def = super::resource_for_kind(&api_version, &kind)
                .ok_or_else(|| format!("no resource for {api_version} {kind}"))?;
            let namespace = objects::meta(&object, "namespace").map(str::to_string);
            objects::check_type(def, &mut object).map_err(|e| format!("{kind}: {e:?}"))?;
            objects::prepare_create(def, namespace.as_deref(), &mut object, inner.rv + 1)
                .map_err(|e| format!("{kind}: {e:?}"))?;
            let name = objects::meta(&object, "name")
                .unwrap_or_default()
                .to_string();
            let key = ObjectKey::new(def, namespace.as_deref(), &name);
            inner.put(key, def.store_form(object));
            stored += 1;
        }
        Ok(stored)
    }

    /// The last resourceVersion handed out.
    pub fn resource_version(&self) -> u64 {
        self.lock().rv
    }

    /// The oldest resourceVersion a watch can still start from.
    pub fn oldest_resource_version(&self) -> u64 {
        self.lock().oldest_rv
    }

    /// One object, as `def` presents it.
    pub fn get(&self, def: &ResourceDef, namespace: Option<&str>, name: &str) -> Option<Value> {
        let key = ObjectKey::new(def, namespace, name);
        self.lock().get(&key).cloned().map(|v| def.present(v))
    }

    /// All objects of `def` (in `namespace`, if given), as `def` presents them.
    pub fn list(&self, def: &ResourceDef, namespace: Option<&str>) -> Vec<Value> {
        self.lock()
            .list(def, namespace)
            .into_iter()
            .map(|(_, v)| def.present(v))
            .collect()
    }

    /// Forgets every change so far: every resourceVersion handed out becomes too old to
    /// watch from, as after a kube-apiserver restart whose watch cache starts later.
    pub fn reset_history(&self) {
        self.lock().reset_history();
    }

    /// Deletes everything (without watch events) and starts over with the default namespaces.
    /// The resourceVersion counter keeps counting, so old versions read as expired, not reused.
    pub fn wipe(&self) {
        let mut inner = self.lock();
        inner.objects.clear();
        inner.reset_history();
        inner.seed();
    }
}

impl Inner {
    fn seed(&mut self) {
        let Some(namespaces) = super::resource("", "v1", "namespaces") else {
            return;
        };
        for name in DEFAULT_NAMESPACES {
            let key = ObjectKey::new(namespaces, None, name);
            if self.objects.contains_key(&key) {
                continue;
            }
            let mut ns = json!({"metadata": {"name": name}});
            let seq = self.rv + 1;
            if objects::check_type(namespaces, &mut ns).is_ok()
                && objects::prepare_create(namespaces, None, &mut ns, seq).is_ok()
            {
                self.put(key, ns);
            }
        }
    }

    pub fn rv(&self) -> u64 {
        self.rv
    }

    pub fn oldest_rv(&self) -> u64 {
        self.oldest_rv
    }

    pub fn get(&self, key: &ObjectKey) -> Option<&Value> {
        self.objects.get(key)
    }

    /// Stored objects of `def`'s storage, optionally in one namespace.
    pub fn list(&self, def: &ResourceDef, namespace: Option<&str>) -> Vec<(ObjectKey, Value)> {
        self.objects
            .iter()
            .filter(|(k, _)| k.in_storage_of(def) && namespace.is_none_or(|ns| k.namespace == ns))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    pub fn keys(&self) -> impl Iterator<Item = &ObjectKey> {
        self.objects.keys()
    }

    pub fn namespace_exists(&self, name: &str) -> bool {
        self.objects
            .keys()
            .any(|k| k.group.is_empty() && k.resource == "namespaces" && k.name == name)
    }

    /// Stores `object` under `key` with the next resourceVersion; returns what was stored.
    pub fn put(&mut self, key: ObjectKey, mut object: Value) -> Value {
        self.rv += 1;
        if let Some(meta) = objects::meta_mut(&mut object) {
            meta.insert("resourceVersion".into(), json!(self.rv.to_string()));
        }
        let old = self.objects.insert(key.clone(), object.clone());
        let kind = if old.is_some() {
            ChangeKind::Modified
        } else {
            ChangeKind::Added
        };
        self.record(Change {
            rv: self.rv,
            kind,
            key,
            object: object.clone(),
            old,
        });
        object
    }

    /// Removes the object; the returned last state carries the deletion's resourceVersion.
    pub fn remove(&mut self, key: &ObjectKey) -> Option<Value> {
        let old = self.objects.remove(key)?;
        self.rv += 1;
        let mut object = old.clone();
        if let Some(meta) = objects::meta_mut(&mut object) {
            meta.insert("resourceVersion".into(), json!(self.rv.to_string()));
        }
        self.record(Change {
            rv: self.rv,
            kind: ChangeKind::Deleted,
            key: key.clone(),
            object: object.clone(),
            old: Some(old),
        });
        Some(object)
    }

    fn record(&mut self, change: Change) {
        let change = Arc::new(change);
        self.history.push_back(Arc::clone(&change));
        while self.history.len() > self.history_limit {
            if let Some(evicted) = self.history.pop_front() {
                self.oldest_rv = evicted.rv;
            }
        }
        // No receivers is fine: nobody is watching.
        let _ = self.changes.send(change);
    }

    fn reset_history(&mut self) {
        self.rv += 1;
        self.history.clear();
        self.oldest_rv = self.rv;
    }

    /// Changes after `rv`, and a receiver for every later one; None if some are lost.
    pub fn subscribe_from(&self, rv: u64) -> Option<Replay> {
        if rv < self.oldest_rv {
            return None;
        }
        let backlog = self.history.iter().filter(|c| c.rv > rv).cloned().collect();
        Some(Replay {
            backlog,
            changes: self.changes.subscribe(),
        })
    }

    /// A receiver for changes after the current resourceVersion.
    pub fn subscribe_now(&self) -> broadcast::Receiver<Arc<Change>> {
        self.changes.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret(name: &str) -> (ObjectKey, Value) {
        let def = super::super::resource("", "v1", "secrets").unwrap();
        (
            ObjectKey::new(def, Some("default"), name),
            json!({"metadata": {"name": name, "namespace": "default"}}),
        )
    }

    #[test]
    fn every_write_gets_the_next_resource_version() {
        let store = Store::new(100);
        let start = store.resource_version();
        let mut inner = store.lock();
        let (key, obj) = secret("a");
        let stored = inner.put(key.clone(), obj.clone());
        assert_eq!(
            stored["metadata"]["resourceVersion"],
            (start + 1).to_string()
        );
        let stored = inner.put(key.clone(), obj);
        assert_eq!(
            stored["metadata"]["resourceVersion"],
            (start + 2).to_string()
        );
        let deleted = inner.remove(&key).unwrap();
        assert_eq!(
            deleted["metadata"]["resourceVersion"],
            (start + 3).to_string()
        );
        assert!(inner.remove(&key).is_none());
        assert_eq!(inner.rv(), start + 3);
    }

    #[test]
    fn subscriptions_replay_history_and_expire_when_it_is_gone() {
        let store = Store::new(3);
        let mut inner = store.lock();
        let base = inner.rv();
        for name in ["a", "b", "c", "d", "e"] {
            let (key, obj) = secret(name);
            inner.put(key, obj);
        }
        // Five changes, three kept: base+3..=base+5 replayable, so from base+2 onwards is fine.
        let replay = inner.subscribe_from(base + 2).unwrap();
        let rvs: Vec<u64> = replay.backlog.iter().map(|c| c.rv).collect();
        assert_eq!(rvs, [base + 3, base + 4, base + 5]);
        assert!(inner.subscribe_from(base + 1).is_none());
        assert!(inner.subscribe_from(base + 5).unwrap().backlog.is_empty());
    }

    #[test]
    fn reset_history_expires_every_issued_version() {
        let store = Store::new(100);
        let before = store.resource_version();
        store.reset_history();
        assert!(store.lock().subscribe_from(before).is_none());
        let now = store.resource_version();
        assert!(store.lock().subscribe_from(now).is_some());
    }

    #[test]
    fn wipe_keeps_the_default_namespaces_and_the_counter() {
        let store = Store::new(100);
        let namespaces = super::super::resource("", "v1", "namespaces").unwrap();
        let (key, obj) = secret("a");
        store.lock().put(key.clone(), obj);
        let before = store.resource_version();
        store.wipe();
        assert!(store.lock().get(&key).is_none());
        assert_eq!(store.list(namespaces, None).len(), DEFAULT_NAMESPACES.len());
        assert!(store.resource_version() > before);
    }
}
