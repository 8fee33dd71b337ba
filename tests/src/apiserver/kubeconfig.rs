//! A kubeconfig pointing at the server, for `kubectl --kubeconfig` and `KUBECONFIG`.

use serde_json::json;

/// The kubeconfig document for a server at `url` (plain http: kubectl accepts
/// `server: http://...` without TLS), with `namespace` as the context's default namespace.
pub fn document(url: &str, namespace: &str) -> String {
    let config = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "test", "cluster": {"server": url}}],
        "users": [{"name": "test", "user": {}}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test", "namespace": namespace}}],
        "current-context": "test",
        "preferences": {},
    });
    // JSON is YAML; serializing as YAML keeps the file readable when a test fails.
    serde_yaml_ng::to_string(&config).unwrap_or_else(|_| config.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kube_rs_reads_it() {
        let yaml = document("http://127.0.0.1:1234", "prod");
        let config = kube::config::Kubeconfig::from_yaml(&yaml).unwrap();
        assert_eq!(config.current_context.as_deref(), Some("test"));
        let cluster = config.clusters[0].cluster.as_ref().unwrap();
        assert_eq!(cluster.server.as_deref(), Some("http://127.0.0.1:1234"));
        assert_eq!(
            config.contexts[0]
                .context
                .as_ref()
                .unwrap()
                .namespace
                .as_deref(),
            Some("prod")
        );
    }
}
