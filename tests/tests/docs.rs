//! The README is the operator's reference: every flag, its environment twin, and every metric
//! the binary can export must be documented there. These tests read the real binary's `--help`
//! and a real `/metrics` scrape, so a new flag or metric without docs fails here.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use ingress_tests::manifests;
use ingress_tests::process::{Ingress, binary};
use ingress_tests::scratch::Scratch;
use ingress_tests::upstream::Backend;

fn readme() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .join("README.md");
    std::fs::read_to_string(path).expect("read README.md")
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
fn every_flag_and_its_environment_twin_is_in_the_readme() {
    let readme = readme();
    let mut missing = Vec::new();
    let mut seen = 0;
    for command in [&[][..], &["check"][..]] {
        let (flags, envs) = flags_and_envs(&help(command));
        seen += flags.len();
        for flag in flags {
            if !readme.contains(&format!("`{flag}")) {
                missing.push(flag);
            }
        }
        for env in envs {
            if !readme.contains(&format!("`{env}`")) {
                missing.push(env);
            }
        }
    }
    assert!(
        seen > 30,
        "only {seen} flags parsed from --help; the parser is broken"
    );
    assert!(
        missing.is_empty(),
        "not documented in README.md: {missing:?}"
    );
}

#[test]
fn every_exported_metric_is_in_the_readme() {
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
    let readme = readme();
    let missing: Vec<&str> = names
        .into_iter()
        .filter(|name| {
            // OpenMetrics names counters without `_total` in TYPE lines.
            !readme.contains(&format!("`{name}`")) && !readme.contains(&format!("`{name}_total`"))
        })
        .collect();
    assert!(
        missing.is_empty(),
        "not documented in README.md: {missing:?}"
    );
}
