//! Sources fill the store: a directory of manifests, or (later) the Kubernetes API.

pub mod manifests;
