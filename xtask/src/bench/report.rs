//! The results file: what each section printed, kept in `docs/benchmark-results.md` with when,
//! where and from which commit it was measured, so nobody copies numbers by hand.
//!
//! ```text
//!   writeln!(bench.report, ...) ──► stdout
//!                 └──► the running section's lines ──finish(section)──► the results file
//!                                      (that section's part replaced; the parts of sections
//!                                       this run did not measure kept)
//! ```
//!
//! Each part sits between `<!-- section: NAME -->` and `<!-- /section: NAME -->` markers, so a
//! run finds and replaces its own parts and leaves the rest byte for byte.

use std::cell::{Cell, RefCell};
use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result};

use crate::workspace::Workspace;

/// Where the results go, relative to the workspace root.
pub const RESULTS: &str = "docs/benchmark-results.md";

/// Sections in the order the bench runs them, which is the order of the file.
const ORDER: [&str; 9] = [
    "http",
    "https",
    "auth",
    "memory",
    "kube",
    "passthrough",
    "gate",
    "accuracy",
    "slow",
];

/// Collects what the running section prints.
pub struct Report {
    root: PathBuf,
    stamp: String,
    lines: RefCell<Vec<String>>,
    skipped: Cell<bool>,
}

impl Report {
    /// `setup` describes the run's length (rounds, duration, connections).
    pub fn new(ws: &Workspace, quick: bool, setup: &str) -> Report {
        let mode = if quick { "quick" } else { "full" };
        Report {
            root: ws.root.clone(),
            stamp: format!(
                "Measured {} · {} · {} · {mode} ({setup})",
                utc_now(),
                commit(&ws.root),
                machine()
            ),
            lines: RefCell::new(Vec::new()),
            skipped: Cell::new(false),
        }
    }

    /// What `writeln!(bench.report, ...)` calls: the line goes to stdout, as every section's
    /// report always did, and into the section's part of the results file.
    pub fn write_fmt(&self, args: fmt::Arguments<'_>) {
        let text = args.to_string();
        self.line(text.strip_suffix('\n').unwrap_or(&text).to_string());
    }

    fn line(&self, text: String) {
        println!("{text}");
        self.lines.borrow_mut().push(text);
    }

    /// A section that cannot run on this machine: printed, but the file keeps the section's
    /// last real results rather than trading them for a note.
    pub fn skip(&self, text: String) {
        self.line(text);
        self.skipped.set(true);
    }

    /// Ends `section`: its lines replace its part of the results file.
    pub fn finish(&self, section: &str) -> Result<()> {
        let lines = self.lines.take();
        let path = self.root.join(RESULTS);
        if self.skipped.replace(false) {
            println!("({section}: skipped, its last results in {RESULTS} are kept)");
            return Ok(());
        }
        let old = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
        };
        let text = replace_part(&old, section, &part(section, &self.stamp, &lines));
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
        println!("({section}: results written to {})", path.display());
        Ok(())
    }
}

const PREAMBLE: &str = "# Benchmark results

Written by `cargo xtask bench`, never by hand: a run replaces the parts of the sections it ran
and keeps the others, so parts can come from different runs; each says when, from which commit
and on which machine it was measured. What each section measures, and its goals, is in
[Benchmarks](benchmarks.md). Compare ratios against the peer measured in the same run, not
absolute numbers across machines.
";

/// One section's part of the file: a heading, the stamp, and the lines as printed.
fn part(section: &str, stamp: &str, lines: &[String]) -> String {
    let body = lines.join("\n");
    format!(
        "<!-- section: {section} -->\n## `{section}`\n\n{stamp}\n\n```text\n{}\n```\n<!-- /section: {section} -->\n",
        body.trim_matches('\n')
    )
}

/// The file with `section`'s part replaced by `new`, every other part kept, in bench order.
fn replace_part(old: &str, section: &str, new: &str) -> String {
    let mut parts: Vec<(String, String)> = parts(old)
        .into_iter()
        .filter(|(name, _)| name != section)
        .collect();
    parts.push((section.to_string(), new.to_string()));
    // Known sections in bench order; any other (from an older bench) after them, as found.
    let rank = |name: &str| ORDER.iter().position(|s| *s == name).unwrap_or(ORDER.len());
    parts.sort_by_key(|(name, _)| rank(name));
    let mut text = PREAMBLE.to_string();
    for (_, part) in parts {
        text.push('\n');
        text.push_str(&part);
    }
    text
}

/// The parts of an existing file, by section name, in file order.
fn parts(text: &str) -> Vec<(String, String)> {
    let mut found = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find("<!-- section: ") {
        let after = &rest[start + "<!-- section: ".len()..];
        let Some(name_end) = after.find(" -->") else {
            break;
        };
        let name = &after[..name_end];
        let close = format!("<!-- /section: {name} -->\n");
        let Some(end) = rest[start..].find(&close) else {
            break;
        };
        let end = start + end + close.len();
        found.push((name.to_string(), rest[start..end].to_string()));
        rest = &rest[end..];
    }
    found
}

/// The time now in UTC, from `date` (the xtask has no calendar code of its own).
fn utc_now() -> String {
    output(Command::new("date").args(["-u", "+%Y-%m-%d %H:%M UTC"]))
        .unwrap_or_else(|| "at an unknown time".into())
}

/// The commit measured, and whether the tree differed from it (the results file aside, which
/// earlier sections of this very run may have written).
fn commit(root: &Path) -> String {
    let git = |args: &[&str]| output(Command::new("git").arg("-C").arg(root).args(args));
    let Some(head) = git(&["rev-parse", "--short=12", "HEAD"]) else {
        return "commit unknown".into();
    };
    let exclude = format!(":(exclude){RESULTS}");
    let status = git(&[
        "status",
        "--porcelain",
        "--untracked-files=no",
        "--",
        ".",
        &exclude,
    ]);
    match status.as_deref() {
        Some("") => format!("commit {head}"),
        Some(_) => format!("commit {head} with uncommitted changes"),
        None => format!("commit {head} (tree state unknown)"),
    }
}

/// CPU model and count, and the kernel, as `uname` reports it.
fn machine() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| {
            let (key, value) = l.split_once(':')?;
            matches!(key.trim(), "model name" | "Model" | "cpu model").then(|| value.trim())
        })
        .unwrap_or("unknown CPU");
    let kernel = output(Command::new("uname").args(["-srm"])).unwrap_or_else(|| "unknown".into());
    format!("{model} × {} CPUs · {kernel}", super::procs::cpus())
}

/// A command's trimmed standard output, if it ran and succeeded.
fn output(cmd: &mut Command) -> Option<String> {
    let out = cmd.output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(sections: &[(&str, &str)]) -> String {
        let mut text = String::new();
        for (name, body) in sections {
            text = replace_part(&text, name, &part(name, "stamp", &[(*body).to_string()]));
        }
        text
    }

    #[test]
    fn a_run_replaces_its_sections_and_keeps_the_others() {
        let before = file(&[("gate", "gate 1"), ("http", "http 1")]);
        let after = replace_part(&before, "http", &part("http", "later", &["http 2".into()]));
        let names: Vec<String> = parts(&after).into_iter().map(|(n, _)| n).collect();
        assert_eq!(names, ["http", "gate"]);
        assert!(after.contains("gate 1"));
        assert!(after.contains("http 2") && after.contains("later"));
        assert!(!after.contains("http 1"));
        assert!(after.starts_with(PREAMBLE));
    }

    #[test]
    fn unknown_sections_are_kept_after_the_known_ones() {
        let before = file(&[("retired", "old"), ("kube", "k")]);
        let names: Vec<String> = parts(&before).into_iter().map(|(n, _)| n).collect();
        assert_eq!(names, ["kube", "retired"]);
    }

    #[test]
    fn printed_blank_lines_around_a_section_are_trimmed() {
        let text = part("http", "s", &["\n## HTTP".into(), "a".into()]);
        assert!(text.contains("```text\n## HTTP\na\n```"));
    }
}
