//! Follows a manifests directory: any change under it re-reads the whole directory and hands
//! the new store to the pipeline. Editors and ConfigMap mounts change files in bursts (write a
//! temp file, rename, swap a symlink), so changes are coalesced before reading.

use std::path::{Path, PathBuf};
use std::time::Duration;

use notify::{RecommendedWatcher, RecursiveMode, Watcher};
use tokio::sync::mpsc;

use super::manifests;
use crate::store::SourceEvent;

/// How long the directory must be quiet before it is read again.
const SETTLE: Duration = Duration::from_millis(50);

#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    #[error("cannot watch {path}: {source}")]
    Watch {
        path: PathBuf,
        source: notify::Error,
    },
}

/// Keeps the watch alive; dropping it stops following the directory.
pub struct DirWatch {
    _watcher: RecommendedWatcher,
}

/// Reads `dir` once, sends it as the initial, synced state, then follows it.
pub fn start(
    dir: &Path,
    events: mpsc::UnboundedSender<SourceEvent>,
) -> Result<DirWatch, WatchError> {
    let (changed_tx, mut changed_rx) = mpsc::unbounded_channel::<()>();
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        let relevant = match &event {
            Ok(e) => !matches!(e.kind, notify::EventKind::Access(_)),
            Err(_) => true,
        };
        if relevant {
            let _ = changed_tx.send(());
        }
    })
    .map_err(|source| WatchError::Watch {
        path: dir.to_path_buf(),
        source,
    })?;
    watcher
        .watch(dir, RecursiveMode::Recursive)
        .map_err(|source| WatchError::Watch {
            path: dir.to_path_buf(),
            source,
        })?;

    let _ = events.send(SourceEvent::Replace(Box::new(manifests::load_dir(dir))));
    let _ = events.send(SourceEvent::Synced);

    let dir = dir.to_path_buf();
    tokio::spawn(async move {
        while changed_rx.recv().await.is_some() {
            // Drain the burst: wait until no change arrived for SETTLE.
            while let Ok(Some(())) = tokio::time::timeout(SETTLE, changed_rx.recv()).await {}
            let read_dir = dir.clone();
            match tokio::task::spawn_blocking(move || manifests::load_dir(&read_dir)).await {
                Ok(store) => {
                    tracing::info!(dir = %dir.display(), objects = store.len(), "manifests changed");
                    if events.send(SourceEvent::Replace(Box::new(store))).is_err() {
                        return;
                    }
                }
                Err(err) => tracing::error!(%err, "reading manifests failed"),
            }
        }
    });
    Ok(DirWatch { _watcher: watcher })
}
