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
            routes.push(row(pattern.to_string(), rule.path.clone(), rule.kind.as_str(), &rule.target));
        }
        if let Some(default) = &vhost.default_backend {
            routes.push(row(pattern.to_string(), "(default)".into(), "-", default));
        }
    }
    if let Some(default) = &snapshot.default_backend {
        routes.push(row("(default backend)".into(), "*".into(), "-", default));
    }
    Report { generation: snapshot.generation, routes, diagnostics: &snapshot.diagnostics }
}

fn row(host: String, path: String, path_type: &str, route: &Route) -> RouteRow {
    let endpoints = match &route.backend.target {
        Target::Endpoints(e) => e.iter().map(|e| e.addr.to_string()).collect(),
        Target::ExternalName { host, port } => vec![format!("dns:{host}:{port}")],
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
            let endpoints = if r.endpoints.is_empty() {
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
            [r.host.clone(), r.path.clone(), r.path_type.clone(), r.ingress.clone(), r.backend.clone(), endpoints]
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
        let _ = writeln!(out, "{:<7} {:<24} {}: {}", d.severity.as_str(), d.kind.as_str(), d.subject, d.message);
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
