//! A bpffs directory of a test's own for the gate's pinned maps, removed on drop, so a test
//! never shares kernel state with another and leaves nothing pinned behind.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

/// `/sys/fs/bpf/ingress-test-<tag>-<pid>-<n>`; the directory itself is made by whoever pins
/// into it first (the gate, or the test).
pub struct PinDir(PathBuf);

impl PinDir {
    pub fn new(tag: &str) -> PinDir {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        PinDir(PathBuf::from(format!(
            "/sys/fs/bpf/ingress-test-{tag}-{}-{n}",
            std::process::id()
        )))
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    /// The pin `name` in this directory.
    pub fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for PinDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
