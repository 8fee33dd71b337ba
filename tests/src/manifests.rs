//! YAML for test configurations: a Service with an EndpointSlice pointing at test backends, and
//! Ingresses written inline by each test.

use std::fmt::Write as _;
use std::net::SocketAddr;

use crate::upstream::Backend;

/// A Service (port 80, named `http`) and one EndpointSlice listing `backends` as ready
/// endpoints. All backends must share a port number only if they share an address, so each
/// backend gets its own slice.
pub fn service(namespace: &str, name: &str, backends: &[&Backend]) -> String {
    let addrs: Vec<SocketAddr> = backends.iter().map(|b| b.addr).collect();
    service_at(namespace, name, &addrs)
}

/// The same for upstreams given by address.
pub fn service_at(namespace: &str, name: &str, backends: &[SocketAddr]) -> String {
    let mut out = format!(
        "---\napiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: {namespace}}}\nspec: {{ports: [{{name: http, port: 80}}]}}\n"
    );
    for (i, backend) in backends.iter().enumerate() {
        let _ = write!(
            out,
            "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: {name}-{i}, namespace: {namespace}, labels: {{kubernetes.io/service-name: {name}}}}}\naddressType: IPv4\nports: [{{name: http, port: {port}}}]\nendpoints: [{{addresses: [\"{ip}\"], conditions: {{ready: true}}}}]\n",
            port = backend.port(),
            ip = backend.ip(),
        );
    }
    out
}

/// The Service `name` on `backend` and the Ingress `name` routing all of `host` to it: the
/// smallest site, for the many tests about something other than routing.
pub fn one_route(namespace: &str, name: &str, host: &str, backend: &Backend) -> String {
    service(namespace, name, &[backend]) + &ingress(namespace, name, &[(host, "/", "Prefix", name)])
}

/// An Ingress of class `ingress` with one rule per `(host, path, pathType, service)`; an empty
/// host makes a host-less rule.
pub fn ingress(namespace: &str, name: &str, rules: &[(&str, &str, &str, &str)]) -> String {
    let mut out = format!(
        "---\napiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {{name: {name}, namespace: {namespace}}}\nspec:\n  ingressClassName: ingress\n  rules:\n"
    );
    for (host, path, path_type, service) in rules {
        if host.is_empty() {
            out.push_str("  - http:\n");
        } else {
            let _ = writeln!(out, "  - host: \"{host}\"\n    http:");
        }
        let _ = writeln!(
            out,
            "      paths:\n      - {{path: \"{path}\", pathType: {path_type}, backend: {{service: {{name: {service}, port: {{number: 80}}}}}}}}"
        );
    }
    out
}

/// `ingress` (YAML from [`ingress`]) with a `tls` section serving `host` with the Secret
/// `secret`.
pub fn with_tls(ingress: &str, host: &str, secret: &str) -> String {
    ingress.replace(
        "  rules:\n",
        &format!("  tls: [{{hosts: [{host}], secretName: {secret}}}]\n  rules:\n"),
    )
}

/// An Ingress like [`ingress`], created at `day` of January 2024 (older wins conflicts), with
/// `annotations` given by their ingress-nginx name (the `nginx.ingress.kubernetes.io/` prefix
/// is added).
pub fn annotated_ingress(
    namespace: &str,
    name: &str,
    day: u8,
    annotations: &[(&str, &str)],
    rules: &[(&str, &str, &str, &str)],
) -> String {
    let mut meta = format!(
        "metadata:\n  name: {name}\n  namespace: {namespace}\n  creationTimestamp: \"2024-01-{day:02}T00:00:00Z\"\n"
    );
    if !annotations.is_empty() {
        meta.push_str("  annotations:\n");
        for (key, value) in annotations {
            let _ = writeln!(meta, "    nginx.ingress.kubernetes.io/{key}: {value:?}");
        }
    }
    ingress(namespace, name, rules).replacen(
        &format!("metadata: {{name: {name}, namespace: {namespace}}}\n"),
        &meta,
        1,
    )
}

/// A ConfigMap with `data` (each value quoted, so `$` and `:` stay as written).
pub fn config_map(namespace: &str, name: &str, data: &[(&str, &str)]) -> String {
    let mut out = format!(
        "---\napiVersion: v1\nkind: ConfigMap\nmetadata: {{name: {name}, namespace: {namespace}}}\ndata:\n"
    );
    if data.is_empty() {
        out = out.replace("data:\n", "data: {}\n");
    }
    for (key, value) in data {
        let _ = writeln!(out, "  {key}: {value:?}");
    }
    out
}

/// An `Opaque` Secret with `data` as its `stringData` (each value a literal block, so htpasswd
/// lines keep their `$`s and colons).
pub fn opaque_secret(namespace: &str, name: &str, data: &[(&str, &str)]) -> String {
    let mut out = format!(
        "---\napiVersion: v1\nkind: Secret\nmetadata: {{name: {name}, namespace: {namespace}}}\ntype: Opaque\nstringData:\n"
    );
    for (key, value) in data {
        let _ = writeln!(out, "  {key}: |");
        for line in value.lines() {
            let _ = writeln!(out, "    {line}");
        }
    }
    out
}
