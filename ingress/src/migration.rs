//! The migration report of `ingress check`: for each Ingress this controller owns, every
//! ingress-nginx (or `ingress.rs/`) annotation it carries and what became of it here, so an
//! operator moving off ingress-nginx sees before switching what will behave differently.
//!
//! ```text
//!   store (the Ingress's annotations) ─┐
//!   registry (category, status)        ├─> per annotation: applied | invalid | ignored | refused
//!   snapshot (diagnostics, refusals)  ─┘    and a summary
//! ```
//!
//! Pure: the same store and snapshot give the same report.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use crate::diagnostics::{DiagnosticKind, Subject};
use crate::object::{Kind, ObjectKey};
use crate::snapshot::Snapshot;
use crate::snapshot::annotations::registry::{self, Category, Status};
use crate::snapshot::annotations::{NGINX_PREFIX, PREFIX, UnsupportedAccess};
use crate::store::Store;

/// What became of one annotation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Outcome {
    /// Honoured as ingress-nginx honours it.
    Applied,
    /// Honoured here, but its value does not parse: not applied (an access control that does
    /// not parse refuses its Ingress instead).
    Invalid,
    /// Not honoured; the Ingress is served without it.
    Ignored,
    /// Not honoured, and it is access control: the Ingress is not served (503).
    Refused,
    /// Accepted, its value checked, but what it tunes does not exist here (why says so).
    NoOp,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Applied => "applied",
            Outcome::Invalid => "invalid",
            Outcome::Ignored => "ignored",
            Outcome::Refused => "refused",
            Outcome::NoOp => "no-op",
        }
    }
}

#[derive(Debug, Serialize, PartialEq, Eq)]
pub struct AnnotationRow {
    pub key: String,
    pub category: Category,
    pub outcome: Outcome,
    /// Why, in a sentence, when it was not simply applied.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
}

#[derive(Debug, Serialize, PartialEq, Eq)]
pub struct IngressRow {
    pub ingress: String,
    /// Whether its paths are served (false: refused, at least one of its paths answers 503).
    pub served: bool,
    pub annotations: Vec<AnnotationRow>,
}

#[derive(Debug, Default, Serialize, PartialEq, Eq)]
pub struct Summary {
    pub ingresses: usize,
    /// Ingresses with at least one annotation not applied.
    pub ingresses_affected: usize,
    pub ingresses_refused: usize,
    pub annotations: usize,
    pub applied: usize,
    pub invalid: usize,
    pub ignored: usize,
    pub refused: usize,
    pub no_op: usize,
}

#[derive(Debug, Serialize, PartialEq, Eq)]
pub struct Migration {
    pub ingresses: Vec<IngressRow>,
    pub summary: Summary,
}

/// The report for every Ingress the snapshot owns.
pub fn report(store: &Store, snapshot: &Snapshot, unsupported: UnsupportedAccess) -> Migration {
    let mut rows = Vec::new();
    let mut summary = Summary::default();
    for key in snapshot.ingresses.keys() {
        let Some(ingress) = store.ingresses.get(key) else {
            continue;
        };
        let annotations = ingress.metadata.annotations.clone().unwrap_or_default();
        let invalid = invalid_messages(snapshot, key);
        let served = !refused(snapshot, key);
        let mut row = IngressRow {
            ingress: key.to_string(),
            served,
            annotations: Vec::new(),
        };
        for annotation in annotations.keys() {
            if let Some(judged) = judge(annotation, &invalid, unsupported) {
                row.annotations.push(judged);
            }
        }
        summary.ingresses += 1;
        summary.ingresses_refused += usize::from(!served);
        summary.ingresses_affected += usize::from(
            row.annotations
                .iter()
                .any(|a| a.outcome != Outcome::Applied),
        );
        for a in &row.annotations {
            summary.annotations += 1;
            match a.outcome {
                Outcome::Applied => summary.applied += 1,
                Outcome::Invalid => summary.invalid += 1,
                Outcome::Ignored => summary.ignored += 1,
                Outcome::Refused => summary.refused += 1,
                Outcome::NoOp => summary.no_op += 1,
            }
        }
        rows.push(row);
    }
    Migration {
        ingresses: rows,
        summary,
    }
}

/// One annotation key, or `None` when it belongs to another tool.
fn judge(key: &str, invalid: &[&str], unsupported: UnsupportedAccess) -> Option<AnnotationRow> {
    let (name, entry) = match key.strip_prefix(PREFIX) {
        Some(name) => (
            name,
            registry::lookup_own(name).or_else(|| registry::lookup(name)),
        ),
        None => {
            let name = key.strip_prefix(NGINX_PREFIX)?;
            (name, registry::lookup(name))
        }
    };
    let category = entry.map_or_else(|| registry::category_of_unknown(name), |e| e.category);
    let supported = entry.is_some_and(|e| e.status == Status::Supported);
    let no_op = entry
        .filter(|e| e.status == Status::NoOp)
        .and_then(|e| registry::no_op_reason(e.name));
    // Diagnostics name their annotation in full, or (older messages) start with its short name.
    let about_it = |m: &&&str| {
        m.contains(key)
            || m.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with([' ', ':']))
    };
    let (outcome, why) = if let Some(reason) = no_op {
        match invalid.iter().find(about_it) {
            Some(message) => (Outcome::Invalid, Some((*message).to_string())),
            None => (Outcome::NoOp, Some(reason.to_string())),
        }
    } else if supported {
        match invalid.iter().find(about_it) {
            Some(message) => (Outcome::Invalid, Some((*message).to_string())),
            None => (Outcome::Applied, None),
        }
    } else {
        let what = if entry.is_some() {
            "not supported by this controller"
        } else {
            "not an ingress-nginx annotation (a typo, or newer than this controller)"
        };
        match (category, unsupported) {
            (Category::AccessControl, UnsupportedAccess::Refuse) => (
                Outcome::Refused,
                Some(format!(
                    "{what}; it is access control, so the Ingress is not served (503) rather than served without it"
                )),
            ),
            (Category::AccessControl, UnsupportedAccess::Ignore) => (
                Outcome::Ignored,
                Some(format!(
                    "{what}; served WITHOUT this access control (--unsupported-access-annotations=ignore)"
                )),
            ),
            _ => (Outcome::Ignored, Some(format!("{what}; it has no effect"))),
        }
    };
    Some(AnnotationRow {
        key: key.to_string(),
        category,
        outcome,
        why,
    })
}

/// The messages of the `InvalidAnnotation` diagnostics about one Ingress (each names its
/// annotation), and of the ones about what an annotation names: a ConfigMap or a Secret that is
/// missing or unusable (`auth-secret`, `auth-tls-secret`, `proxy-ssl-secret`).
fn invalid_messages<'s>(snapshot: &'s Snapshot, key: &ObjectKey) -> Vec<&'s str> {
    let subject = Subject::object(Kind::Ingress, key);
    snapshot
        .diagnostics
        .iter()
        .filter(|d| {
            matches!(
                d.kind,
                DiagnosticKind::InvalidAnnotation
                    | DiagnosticKind::ConfigMapNotFound
                    | DiagnosticKind::SecretNotFound
                    | DiagnosticKind::SecretInvalid
                    | DiagnosticKind::CertificateKeyMismatch
            ) && d.subject == subject
        })
        .map(|d| d.message.as_str())
        .collect()
}

/// Whether any of the Ingress's routes is refused (an access control it cannot honour).
fn refused(snapshot: &Snapshot, key: &ObjectKey) -> bool {
    snapshot
        .routes()
        .chain(snapshot.passthrough.iter().map(|(_, route)| route))
        .filter(|route| &route.ingress == key)
        // Any path, not the first: global auth refuses route by route, and an Ingress whose
        // ACME path stays up while its other paths answer 503 is not served.
        .any(|route| route.policy.access.refused.is_some())
}

pub fn render_text(migration: &Migration) -> String {
    let mut out = String::new();
    let s = &migration.summary;
    let _ = writeln!(
        out,
        "\nMIGRATION FROM INGRESS-NGINX: {} Ingresses, {} annotations: {} applied, {} no-op, {} invalid, {} ignored, {} refused; {} Ingresses with an annotation not applied, {} not served",
        s.ingresses,
        s.annotations,
        s.applied,
        s.no_op,
        s.invalid,
        s.ignored,
        s.refused,
        s.ingresses_affected,
        s.ingresses_refused
    );
    let mut by_outcome: BTreeMap<Outcome, usize> = BTreeMap::new();
    for row in &migration.ingresses {
        if row.annotations.is_empty() {
            continue;
        }
        let served = if row.served { "" } else { " (NOT SERVED: 503)" };
        let _ = writeln!(out, "Ingress {}{served}", row.ingress);
        for a in &row.annotations {
            *by_outcome.entry(a.outcome).or_default() += 1;
            let _ = write!(
                out,
                "  {:<8} {} [{}]",
                a.outcome.as_str(),
                a.key,
                a.category
            );
            if let Some(why) = &a.why {
                let _ = write!(out, ": {why}");
            }
            out.push('\n');
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::testing::settings;

    fn migration(yaml: &str, unsupported: UnsupportedAccess) -> Migration {
        migration_with(yaml, unsupported, None)
    }

    fn migration_with(
        yaml: &str,
        unsupported: UnsupportedAccess,
        config_map: Option<ObjectKey>,
    ) -> Migration {
        let parsed = crate::source::manifests::parse_file(std::path::Path::new("t.yaml"), yaml);
        assert!(parsed.diagnostics.is_empty(), "{:?}", parsed.diagnostics);
        let mut store = Store::default();
        for object in parsed.objects {
            store.apply(object);
        }
        let mut settings = settings();
        settings.unsupported_access = unsupported;
        settings.config_map = config_map;
        let snapshot = Snapshot::build(&store, &settings, 1);
        report(&store, &snapshot, unsupported)
    }

    const SERVICE: &str = "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: t}\nspec: {ports: [{port: 80}]}\n";

    fn ingress(name: &str, annotations: &[(&str, &str)]) -> String {
        let annotations: Vec<String> = annotations
            .iter()
            .map(|(k, v)| format!("{k}: \"{v}\""))
            .collect();
        format!(
            "---\napiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {{name: {name}, namespace: t, annotations: {{{}}}}}\nspec:\n  ingressClassName: ingress\n  rules:\n  - host: {name}.example.com\n    http: {{paths: [{{path: /, pathType: Prefix, backend: {{service: {{name: web, port: {{number: 80}}}}}}}}]}}\n",
            annotations.join(", ")
        )
    }

    /// Global auth refuses route by route: an Ingress whose ACME path (exempt, first in the
    /// table) stays up while its other paths answer 503 is reported as not served.
    #[test]
    fn an_ingress_with_any_refused_path_is_not_served() {
        let yaml = SERVICE.to_string()
            + "---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: config, namespace: t}\ndata: {global-auth-url: \"global.example/check\"}\n"
            + "---\napiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {name: mixed, namespace: t}\nspec:\n  ingressClassName: ingress\n  rules:\n  - host: mixed.example.com\n    http: {paths: [{path: /.well-known/acme-challenge, pathType: Prefix, backend: {service: {name: web, port: {number: 80}}}}, {path: /, pathType: Prefix, backend: {service: {name: web, port: {number: 80}}}}]}\n";
        let got = migration_with(
            &yaml,
            UnsupportedAccess::Refuse,
            Some(ObjectKey::new("t", "config")),
        );
        let rows: Vec<(&str, bool)> = got
            .ingresses
            .iter()
            .map(|r| (r.ingress.as_str(), r.served))
            .collect();
        assert_eq!(rows, [("t/mixed", false)]);
        assert_eq!(got.summary.ingresses_refused, 1);
    }

    #[test]
    fn a_missing_configmap_of_headers_is_invalid_and_not_served() {
        let n = |s: &str| format!("nginx.ingress.kubernetes.io/{s}");
        let yaml = SERVICE.to_string() + &ingress("headers", &[(&n("custom-headers"), "t/gone")]);
        let got = migration(&yaml, UnsupportedAccess::Refuse);
        let row = &got.ingresses[0];
        assert!(!row.served);
        assert_eq!(row.annotations[0].outcome, Outcome::Invalid);
        let why = row.annotations[0].why.as_deref().unwrap_or_default();
        assert!(why.contains("ConfigMap t/gone does not exist"), "{why}");
    }

    /// An annotation naming a Secret that does not exist is not applied, whichever way its
    /// diagnostic names it; access control without its Secret is also not served.
    #[test]
    fn annotations_naming_missing_secrets_are_invalid() {
        let n = |s: &str| format!("nginx.ingress.kubernetes.io/{s}");
        let yaml = SERVICE.to_string()
            + &ingress(
                "basic",
                &[(&n("auth-type"), "basic"), (&n("auth-secret"), "gone")],
            )
            + &ingress("mtls", &[(&n("auth-tls-secret"), "t/gone")])
            + &ingress(
                "upstream",
                &[
                    (&n("backend-protocol"), "HTTPS"),
                    (&n("proxy-ssl-secret"), "t/gone"),
                ],
            );
        let got = migration(&yaml, UnsupportedAccess::Refuse);
        let judged = |ingress: &str, annotation: &str| {
            let row = got
                .ingresses
                .iter()
                .find(|r| r.ingress == ingress)
                .unwrap_or_else(|| panic!("{ingress} has no row"));
            let a = row
                .annotations
                .iter()
                .find(|a| a.key == n(annotation))
                .unwrap_or_else(|| panic!("{ingress}: no {annotation}"));
            (row.served, a.outcome, a.why.clone().unwrap_or_default())
        };
        for (ingress, annotation, served) in [
            ("t/basic", "auth-secret", false),
            ("t/mtls", "auth-tls-secret", false),
            ("t/upstream", "proxy-ssl-secret", true),
        ] {
            let (is_served, outcome, why) = judged(ingress, annotation);
            assert_eq!(outcome, Outcome::Invalid, "{ingress} {annotation}");
            assert!(why.contains("not found"), "{ingress}: {why}");
            assert_eq!(is_served, served, "{ingress}");
        }
        assert_eq!(judged("t/upstream", "backend-protocol").1, Outcome::Applied);
    }

    #[test]
    fn enable_global_auth_is_applied_and_its_typos_are_invalid() {
        let n = |s: &str| format!("nginx.ingress.kubernetes.io/{s}");
        let yaml = SERVICE.to_string()
            + &ingress("opted", &[(&n("enable-global-auth"), "false")])
            + &ingress("typo", &[(&n("enable-global-auth"), "nope")]);
        let got = migration(&yaml, UnsupportedAccess::Refuse);
        let rows: Vec<(&str, bool, Outcome)> = got
            .ingresses
            .iter()
            .map(|r| (r.ingress.as_str(), r.served, r.annotations[0].outcome))
            .collect();
        assert_eq!(
            rows,
            [
                ("t/opted", true, Outcome::Applied),
                ("t/typo", true, Outcome::Invalid)
            ]
        );
    }

    #[test]
    fn each_annotation_is_judged_as_the_snapshot_judged_it() {
        let n = |s: &str| format!("nginx.ingress.kubernetes.io/{s}");
        let yaml = SERVICE.to_string()
            + &ingress(
                "plain",
                &[
                    (&n("ssl-redirect"), "false"),
                    (&n("proxy-read-timeout"), "forever"),
                    (&n("configuration-snippet"), "more_set_headers x"),
                    (&n("not-a-real-one"), "x"),
                    ("example.com/owner", "team-a"),
                ],
            )
            + &ingress("guarded", &[(&n("auth-snippet"), "http://auth/")])
            + &ingress("ranged", &[(&n("allowlist-source-range"), "10.0.0.0/8")])
            + &ingress("bare", &[])
            + &ingress(
                "buffered",
                &[
                    (&n("proxy-buffering"), "on"),
                    (&n("proxy-buffer-size"), "lots"),
                ],
            );
        let got = migration(&yaml, UnsupportedAccess::Refuse);
        let outcomes = |name: &str| -> Vec<(String, Outcome)> {
            got.ingresses
                .iter()
                .find(|r| r.ingress == format!("t/{name}"))
                .unwrap()
                .annotations
                .iter()
                .map(|a| (a.key.clone(), a.outcome))
                .collect()
        };
        assert_eq!(
            outcomes("plain"),
            vec![
                (n("configuration-snippet"), Outcome::Invalid),
                (n("not-a-real-one"), Outcome::Ignored),
                (n("proxy-read-timeout"), Outcome::Invalid),
                (n("ssl-redirect"), Outcome::Applied),
            ],
            "other tools' annotations are left out"
        );
        assert_eq!(
            outcomes("guarded"),
            vec![(n("auth-snippet"), Outcome::Refused)]
        );
        assert_eq!(
            outcomes("buffered"),
            vec![
                (n("proxy-buffer-size"), Outcome::Invalid),
                (n("proxy-buffering"), Outcome::NoOp),
            ],
            "a no-op's value is still checked"
        );
        assert_eq!(
            outcomes("ranged"),
            vec![(n("allowlist-source-range"), Outcome::Applied)]
        );
        let served: Vec<(String, bool)> = got
            .ingresses
            .iter()
            .map(|r| (r.ingress.clone(), r.served))
            .collect();
        assert_eq!(
            served,
            vec![
                ("t/bare".to_string(), true),
                ("t/buffered".to_string(), true),
                ("t/guarded".to_string(), false),
                ("t/plain".to_string(), true),
                ("t/ranged".to_string(), true),
            ]
        );
        assert_eq!(
            got.summary,
            Summary {
                ingresses: 5,
                ingresses_affected: 3,
                ingresses_refused: 1,
                annotations: 8,
                applied: 2,
                invalid: 3,
                ignored: 1,
                refused: 1,
                no_op: 1,
            }
        );
        let text = render_text(&got);
        assert!(
            text.contains("Ingress t/guarded (NOT SERVED: 503)"),
            "{text}"
        );
        assert!(
            text.contains("no-op    nginx.ingress.kubernetes.io/proxy-buffering [upstream]: responses are always streamed"),
            "{text}"
        );
        assert!(
            text.contains("invalid  nginx.ingress.kubernetes.io/proxy-read-timeout [upstream]: nginx.ingress.kubernetes.io/proxy-read-timeout: \"forever\""),
            "{text}"
        );

        // With the refusal turned off, the same access control is ignored and served.
        let ignored = migration(&yaml, UnsupportedAccess::Ignore);
        let guarded = ignored
            .ingresses
            .iter()
            .find(|r| r.ingress == "t/guarded")
            .unwrap();
        assert!(guarded.served);
        assert_eq!(guarded.annotations[0].outcome, Outcome::Ignored);
        assert!(
            guarded.annotations[0]
                .why
                .as_deref()
                .is_some_and(|w| w.contains("WITHOUT"))
        );
    }
}
