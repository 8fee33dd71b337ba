//! Sources fill the store: a directory of manifests, or the Kubernetes API.

pub mod kube;
pub mod manifests;
pub mod watch;
