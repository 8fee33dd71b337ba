//! A test Kubernetes API server (see issue: Kubernetes controller).
