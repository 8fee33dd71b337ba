//! `ingress check` and the admin `/routes` page: the resolved routing table and every
//! diagnostic, rendered from a snapshot.

use std::fmt::Write as _;

use serde::Serialize;

use crate::diagnostics::Diagnostic;
use crate::snapshot::backend::Target;
use crate::snapshot::{Route, Snapshot};

/// One row of the routing table.
#[derive(Debug, Serialize, PartialEq, Eq)]
pub struct RouteRow {
    pub host: String,
    pub path: String,
    pub path_type: String,
    pub ingress: String,
    pub backend: String,
    pub endpoints: Vec<String>,
    pub tls: bool,
    /// TLS passthrough: routed by SNI, TLS left to the backend, paths not matched.
    pub passthrough: bool,
    /// Why this route is not served (it answers 503), if it is refused.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refused: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct Report<'a> {
    pub generation: u64,
    pub routes: Vec<RouteRow>,
    pub diagnostics: &'a [Diagnostic],
}

pub fn report(snapshot: &Snapshot) -> Report<'_> {
    let mut routes = Vec::new();
    for (pattern, vhost) in snapshot.hosts.iter() {
        for rule in vhost.paths.rules() {
            routes.push(row(
                pattern.to_string(),
                rule.path.clone(),
                rule.kind.as_str(),
                &rule.target,
            ));
        }
        if let Some(default) = &vhost.default_backend {
            routes.push(row(pattern.to_string(), "(default)".into(), "-", default));
        }
    }
    for (pattern, route) in snapshot.passthrough.iter() {
        let mut passthrough = row(pattern.to_string(), "*".into(), "Passthrough", route);
        passthrough.passthrough = true;
        routes.push(passthrough);
    }
    if let Some(default) = &snapshot.default_backend {
        routes.push(row("(default backend)".into(), "*".into(), "-", default));
    }
    Report {
        generation: snapshot.generation,
        routes,
        diagnostics: &snapshot.diagnostics,
    }
}

fn row(host: String, path: String, path_type: &str, route: &Route) -> RouteRow {
    let endpoints = match &route.backend.target {
        Target::Endpoints(e) => e.iter().map(|e| e.addr.to_string()).collect(),
        Target::ExternalName(name) => vec![format!("dns:{name}")],
        Target::Unavailable => Vec::new(),
    };
    RouteRow {
        host,
        path,
        path_type: path_type.into(),
        ingress: route.ingress.to_string(),
        backend: format!("{}:{}", route.backend.service, route.backend.port),
        endpoints,
        tls: route.tls,
        passthrough: false,
        refused: route.policy.access.refused.as_deref().map(str::to_string),
    }
}

/// Endpoint lists longer than this are abbreviated in the text table.
const MAX_LISTED_ENDPOINTS: usize = 4;

pub fn render_text(report: &Report<'_>) -> String {
    let mut out = String::new();
    let header = ["HOST", "PATH", "TYPE", "INGRESS", "BACKEND", "ENDPOINTS"];
    let rows: Vec<[String; 6]> = report
        .routes
        .iter()
        .map(|r| {
            let endpoints = if r.refused.is_some() {
                "refused (503)".to_string()
            } else if r.endpoints.is_empty() {
                "none (503)".to_string()
            } else if r.endpoints.len() > MAX_LISTED_ENDPOINTS {
                format!(
                    "{} (+{} more)",
                    r.endpoints[..MAX_LISTED_ENDPOINTS].join(","),
                    r.endpoints.len() - MAX_LISTED_ENDPOINTS
                )
            } else {
                r.endpoints.join(",")
            };
            [
                r.host.clone(),
                r.path.clone(),
                r.path_type.clone(),
                r.ingress.clone(),
                r.backend.clone(),
                endpoints,
            ]
        })
        .collect();
    let mut widths = header.map(str::len);
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.len());
        }
    }
    let _ = writeln!(out, "ROUTES (snapshot generation {})", report.generation);
    write_row(&mut out, &header.map(String::from), &widths);
    if rows.is_empty() {
        out.push_str("(none)\n");
    }
    for row in &rows {
        write_row(&mut out, row, &widths);
    }
    let _ = writeln!(out, "\nDIAGNOSTICS ({})", report.diagnostics.len());
    if report.diagnostics.is_empty() {
        out.push_str("(none)\n");
    }
    for d in report.diagnostics {
        let _ = writeln!(
            out,
            "{:<7} {:<24} {}: {}",
            d.severity.as_str(),
            d.kind.as_str(),
            d.subject,
            d.message
        );
    }
    out
}

fn write_row(out: &mut String, cells: &[String; 6], widths: &[usize; 6]) {
    let mut line = String::new();
    for (cell, width) in cells.iter().zip(widths) {
        let _ = write!(line, "{cell:<width$}  ");
    }
    out.push_str(line.trim_end());
    out.push('\n');
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::sync::Arc;

    use super::*;
    use crate::snapshot::BuildSettings;
    use crate::snapshot::class::ClassSelector;
    use crate::source::manifests;
    use crate::store::Store;

    fn snapshot(yaml: &str) -> Snapshot {
        let parsed = manifests::parse_file(Path::new("test.yaml"), yaml);
        assert!(parsed.diagnostics.is_empty(), "{:?}", parsed.diagnostics);
        let mut store = Store::default();
        for object in parsed.objects {
            store.apply(object);
        }
        let settings = BuildSettings {
            class: ClassSelector {
                ingress_class: "ingress".into(),
                controller_class: "ingress.rs/controller".into(),
            },
            tls: crate::snapshot::tls::TlsSettings {
                default_certificate: None,
                self_signed: Arc::new(crate::snapshot::certs::self_signed().expect("self-signed")),
                now: 1_900_000_000,
            },
            backends: Default::default(),
            unsupported_access: Default::default(),
            unnamed: Default::default(),
            global: Default::default(),
            config_map: None,
        };
        Snapshot::build(&store, &settings, 1)
    }

    const YAML: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: db, namespace: data}
spec: {ports: [{name: tls, port: 5432}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: db-1, namespace: data, labels: {kubernetes.io/service-name: db}}
addressType: IPv4
ports: [{name: tls, port: 5432}]
endpoints: [{addresses: ["10.0.0.7"]}]
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: data}
spec: {ports: [{name: http, port: 80}]}
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: db
  namespace: data
  annotations: {nginx.ingress.kubernetes.io/ssl-passthrough: "true"}
spec:
  ingressClassName: ingress
  rules:
  - host: db.example.com
    http: {paths: [{path: /, pathType: Prefix, backend: {service: {name: db, port: {number: 5432}}}}]}
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: web, namespace: data}
spec:
  ingressClassName: ingress
  rules:
  - host: www.example.com
    http: {paths: [{path: /, pathType: Prefix, backend: {service: {name: web, port: {number: 80}}}}]}
"#;

    #[test]
    fn passthrough_routes_are_marked_in_the_table_and_the_json() {
        let snap = snapshot(YAML);
        let report = report(&snap);
        let marked: Vec<(&str, &str, &str, bool)> = report
            .routes
            .iter()
            .map(|r| {
                (
                    r.host.as_str(),
                    r.path.as_str(),
                    r.path_type.as_str(),
                    r.passthrough,
                )
            })
            .collect();
        let cases = [
            ("db.example.com", "*", "Passthrough", true),
            ("www.example.com", "/", "Prefix", false),
        ];
        for case in cases {
            assert!(marked.contains(&case), "{case:?} missing from {marked:?}");
        }
        let pass = report
            .routes
            .iter()
            .find(|r| r.passthrough)
            .expect("a passthrough row");
        assert_eq!(pass.backend, "data/db:5432");
        assert_eq!(pass.endpoints, vec!["10.0.0.7:5432".to_string()]);

        let text = render_text(&report);
        let line = text
            .lines()
            .find(|l| l.starts_with("db.example.com") && l.contains("Passthrough"))
            .unwrap_or_else(|| panic!("no passthrough row in\n{text}"));
        assert!(line.contains("10.0.0.7:5432"), "{line}");
        let json = serde_json::to_value(&report.routes).expect("json");
        assert!(
            json.as_array()
                .expect("rows")
                .iter()
                .any(|r| r["host"] == "db.example.com" && r["passthrough"] == true),
            "{json}"
        );
    }
}
