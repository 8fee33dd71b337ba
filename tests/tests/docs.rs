//! `docs/` is the operator's reference: every flag, its environment twin, and every metric the
//! binary can export must be documented there. These tests read the real binary's `--help` and
//! a real `/metrics` scrape, so a new flag or metric without docs fails here. The last test
//! follows every relative link in README.md and `docs/` to a file, and to a heading when it
//! names one, so moving a section cannot leave a dead link behind.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use ingress_tests::manifests;
use ingress_tests::process::{Ingress, binary};
use ingress_tests::scratch::Scratch;
use ingress_tests::upstream::Backend;
use pulldown_cmark::{Event, Options, Parser, Tag, TagEnd};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

/// Every `docs/*.md`, sorted.
fn docs_pages() -> Vec<PathBuf> {
    let dir = workspace().join("docs");
    let mut pages: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|entry| entry.expect("docs entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "md"))
        .collect();
    pages.sort();
    assert!(pages.len() > 5, "only {} pages in docs/", pages.len());
    pages
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// The whole reference, every page of `docs/` one after the other.
fn reference() -> String {
    docs_pages().iter().map(|page| read(page)).collect()
}

fn help(args: &[&str]) -> String {
    let out = Command::new(binary())
        .args(args)
        .arg("--help")
        .output()
        .expect("run ingress --help");
    assert!(out.status.success(), "{args:?} --help failed");
    String::from_utf8(out.stdout).expect("utf-8 help")
}

/// `--flag` names and `[env: NAME=…]` twins as clap prints them.
fn flags_and_envs(help: &str) -> (BTreeSet<String>, BTreeSet<String>) {
    let mut flags = BTreeSet::new();
    let mut envs = BTreeSet::new();
    for line in help.lines() {
        let trimmed = line.trim_start();
        if let Some(rest) = trimmed.strip_prefix("--") {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                .collect();
            if !["help", "version"].contains(&name.as_str()) {
                flags.insert(format!("--{name}"));
            }
        }
        if let Some(at) = line.find("[env: ") {
            let name: String = line[at + 6..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            envs.insert(name);
        }
    }
    (flags, envs)
}

#[test]
fn every_flag_and_its_environment_twin_is_in_the_docs() {
    let docs = reference();
    let mut missing = Vec::new();
    let mut seen = 0;
    for command in [&[][..], &["check"][..]] {
        let (flags, envs) = flags_and_envs(&help(command));
        seen += flags.len();
        for flag in flags {
            if !docs.contains(&format!("`{flag}")) {
                missing.push(flag);
            }
        }
        for env in envs {
            if !docs.contains(&format!("`{env}`")) {
                missing.push(env);
            }
        }
    }
    assert!(
        seen > 30,
        "only {seen} flags parsed from --help; the parser is broken"
    );
    assert!(missing.is_empty(), "not documented in docs/: {missing:?}");
}

#[test]
fn every_exported_metric_is_in_the_docs() {
    let backend = Backend::start("web");
    let scratch = Scratch::new("docs-metrics");
    scratch.write(
        "svc.yaml",
        &manifests::service("default", "web", &[&backend]),
    );
    scratch.write(
        "ing.yaml",
        &manifests::ingress("default", "web", &[("docs.test", "/", "Prefix", "web")]),
    );
    let ingress = Ingress::start(scratch.path());
    // One request so that per-route families have a sample as well as a TYPE line.
    let (status, _) = ingress.admin_get("/metrics");
    assert_eq!(status, 200);
    let _ = ingress_tests::client::blocking_get(ingress.http, "/", "docs.test");
    let text = ingress.metrics();
    let names: BTreeSet<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert!(
        names.len() > 15,
        "only {} metric families scraped",
        names.len()
    );
    let docs = reference();
    let missing: Vec<&str> = names
        .into_iter()
        .filter(|name| {
            // OpenMetrics names counters without `_total` in TYPE lines.
            !docs.contains(&format!("`{name}`")) && !docs.contains(&format!("`{name}_total`"))
        })
        .collect();
    assert!(missing.is_empty(), "not documented in docs/: {missing:?}");
}

#[test]
fn relative_links_lead_to_files_and_headings_that_exist() {
    let root = workspace();
    let mut files = vec![root.join("README.md")];
    files.extend(docs_pages());
    let mut anchors: BTreeMap<PathBuf, BTreeSet<String>> = BTreeMap::new();
    let mut checked = 0;
    let mut broken = Vec::new();
    for file in &files {
        let dir = file.parent().expect("a file has a directory");
        for target in links(&read(file)) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            checked += 1;
            let (path, anchor) = target.split_once('#').unwrap_or((&target, ""));
            let resolved = if path.is_empty() {
                file.clone()
            } else {
                dir.join(path)
            };
            let shown = format!(
                "{}: ({target})",
                file.strip_prefix(&root).unwrap_or(file).display()
            );
            if !resolved.exists() {
                broken.push(format!("{shown}: no such file"));
                continue;
            }
            if anchor.is_empty() || resolved.extension().is_none_or(|ext| ext != "md") {
                continue;
            }
            let known = anchors
                .entry(resolved.clone())
                .or_insert_with(|| heading_anchors(&read(&resolved)));
            if !known.contains(anchor) {
                broken.push(format!("{shown}: no heading with anchor #{anchor}"));
            }
        }
    }
    assert!(
        checked > 20,
        "only {checked} relative links found; the link parser is broken"
    );
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn anchors_follow_githubs_rules() {
    let text = "# The `ingress` command\n## Falling back, and timeouts\n## Metrics\n\
                ## Metrics\n## Routing: Ingress v1 as specified\n## 10,000 hosts × 2 — p99\n\
                ```\n# not a heading\n```\n";
    let expected: BTreeSet<String> = [
        "the-ingress-command",
        "falling-back-and-timeouts",
        "metrics",
        "metrics-1",
        "routing-ingress-v1-as-specified",
        "10000-hosts--2--p99",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    assert_eq!(heading_anchors(text), expected);
}

fn markdown(text: &str) -> Parser<'_> {
    Parser::new_ext(text, Options::ENABLE_TABLES)
}

/// The destinations of every link and image.
fn links(text: &str) -> Vec<String> {
    markdown(text)
        .filter_map(|event| match event {
            Event::Start(Tag::Link { dest_url, .. } | Tag::Image { dest_url, .. }) => {
                Some(dest_url.to_string())
            }
            _ => None,
        })
        .collect()
}

/// The anchors GitHub gives a page's headings: the heading's text lowercased, characters other
/// than letters, digits, `-`, `_` and spaces removed, spaces turned into `-`, and `-1`, `-2`, …
/// appended to repeats.
fn heading_anchors(text: &str) -> BTreeSet<String> {
    let mut anchors = BTreeSet::new();
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut heading: Option<String> = None;
    for event in markdown(text) {
        match event {
            Event::Start(Tag::Heading { .. }) => heading = Some(String::new()),
            Event::Text(t) | Event::Code(t) => {
                if let Some(h) = heading.as_mut() {
                    h.push_str(&t);
                }
            }
            Event::End(TagEnd::Heading(_)) => {
                let slug: String = heading
                    .take()
                    .unwrap_or_default()
                    .to_lowercase()
                    .chars()
                    .filter(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | ' '))
                    .map(|c| if c == ' ' { '-' } else { c })
                    .collect();
                let count = seen.entry(slug.clone()).or_insert(0);
                anchors.insert(if *count == 0 {
                    slug
                } else {
                    format!("{slug}-{count}")
                });
                *count += 1;
            }
            _ => {}
        }
    }
    anchors
}

/// The annotation status table in docs/annotations.md is the registry the snapshot judges
/// annotations by, row for row, so the migration reference cannot drift from the code.
#[test]
fn every_annotation_of_the_registry_is_in_the_docs_with_its_status() {
    use ingress::snapshot::annotations::registry::ANNOTATIONS;
    let page = read(&workspace().join("docs").join("annotations.md"));
    let missing: Vec<String> = ANNOTATIONS
        .iter()
        .map(|a| {
            let status = a.status.as_str();
            format!("| `{}` | {} | {status} |", a.name, a.category)
        })
        .filter(|row| !page.contains(row.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "rows missing from docs/annotations.md: {missing:#?}"
    );
    // Row for row: a stale row beside the right one (a merge that kept both) would tell a
    // reader two statuses.
    let mut seen = std::collections::BTreeMap::new();
    for line in page.lines() {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        if let [_, name, category, _status, _] = cells[..]
            && let Some(name) = name.strip_prefix('`').and_then(|n| n.strip_suffix('`'))
            && ANNOTATIONS
                .iter()
                .any(|a| a.name == name && a.category.to_string() == category)
        {
            *seen.entry(name.to_string()).or_insert(0) += 1;
        }
    }
    let twice: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        twice.is_empty(),
        "annotations with more than one status row in docs/annotations.md: {twice:?}"
    );
}
