//! The import graph of this crate, checked: imports run the way the data flows.
//!
//! ```text
//!   clock object ─ diagnostics ─ store ─ source, snapshot ─ publish ─ gate
//!     ─ proxy mapsync report check ─ telemetry ─ admin ─ cli ─ run
//! ```
//!
//! Two rules, read from the `crate::…` and `super::…` paths in every non-test source file:
//! - a top-level module only imports modules of a lower layer in [`LAYERS`];
//! - within every directory, the modules beside each other form no cycle (a module's
//!   children count as one with it).
//!
//! A failure names the offending edge or cycle and the file that makes it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Lower layers first. A module may import only from layers before its own.
const LAYERS: &[&[&str]] = &[
    // Vocabulary: what everything else speaks (the ClientHello parser is a crate of its own).
    &["clock", "errors", "object"],
    &["diagnostics"],
    &["store"],
    // Sources fill the store; the snapshot is a pure function of it.
    &["source", "snapshot"],
    &["publish"],
    // The kernel's programs and maps, which consumers drive.
    &["gate"],
    // Consumers of the published snapshot.
    &["proxy", "mapsync", "report", "check", "migration"],
    &["telemetry"],
    &["admin"],
    &["cli"],
    &["run"],
];

type Module = Vec<String>;

/// Every module file under `src`, by module path, with its source minus comments and tests.
fn modules(src: &Path) -> BTreeMap<Module, (PathBuf, String)> {
    let mut out = BTreeMap::new();
    let mut dirs = vec![src.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        let entries = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        for entry in entries {
            let path = entry.unwrap_or_else(|e| panic!("{e}")).path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            let Some(rel) = path.strip_prefix(src).ok().and_then(|r| r.to_str()) else {
                continue;
            };
            let Some(rel) = rel.strip_suffix(".rs") else {
                continue;
            };
            let mut parts: Module = rel.split('/').map(str::to_string).collect();
            let last = parts.last().map(String::as_str);
            // The binary and test-only files are not part of the library's graph.
            if matches!(last, Some("main" | "tests" | "layering")) {
                continue;
            }
            if matches!(last, Some("mod" | "lib")) {
                parts.pop();
            }
            let text = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            out.insert(parts, (path, without_tests(&without_comments(&text))));
        }
    }
    out
}

fn without_comments(text: &str) -> String {
    text.lines()
        .map(|line| match line.find("//") {
            Some(at) => &line[..at],
            None => line,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Drops every `#[cfg(test)]` item (a `mod tests { … }` block, or a `mod tests;` line).
fn without_tests(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(at) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..at]);
        let after = &rest[at..];
        let end = match (after.find('{'), after.find(';')) {
            (Some(open), Some(semi)) if semi < open => semi + 1,
            (Some(open), _) => {
                let mut depth = 0usize;
                let mut end = after.len();
                for (i, c) in after[open..].char_indices() {
                    match c {
                        '{' => depth += 1,
                        '}' => {
                            depth -= 1;
                            if depth == 0 {
                                end = open + i + 1;
                                break;
                            }
                        }
                        _ => {}
                    }
                }
                end
            }
            (None, Some(semi)) => semi + 1,
            (None, None) => after.len(),
        };
        rest = &after[end..];
    }
    out.push_str(rest);
    out
}

/// The modules `module`'s source refers to through `crate::` and `super::` paths, each resolved
/// to the longest module path that exists.
fn references(module: &Module, text: &str, known: &BTreeSet<Module>) -> BTreeSet<Module> {
    static PATH: std::sync::LazyLock<regex::Regex> = std::sync::LazyLock::new(|| {
        regex::Regex::new(r"\b(crate|super)((?:::\w+)+)").unwrap_or_else(|e| panic!("{e}"))
    });
    let mut out = BTreeSet::new();
    for caps in PATH.captures_iter(text) {
        let mut segments: Vec<&str> = caps[2].split("::").skip(1).collect();
        let mut base: Module = if &caps[1] == "crate" {
            Vec::new()
        } else {
            module[..module.len().saturating_sub(1)].to_vec()
        };
        while segments.first() == Some(&"super") {
            base.pop();
            segments.remove(0);
        }
        let mut path = base.clone();
        path.extend(segments.iter().map(|s| s.to_string()));
        let target = (0..=path.len())
            .rev()
            .map(|n| path[..n].to_vec())
            .find(|candidate| known.contains(candidate))
            .unwrap_or(base);
        if &target != module {
            out.insert(target);
        }
    }
    out
}

struct Graph {
    files: BTreeMap<Module, PathBuf>,
    edges: BTreeMap<Module, BTreeSet<Module>>,
}

fn graph() -> Graph {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let modules = modules(&src);
    let known: BTreeSet<Module> = modules.keys().cloned().collect();
    let mut files = BTreeMap::new();
    let mut edges = BTreeMap::new();
    for (module, (path, text)) in modules {
        edges.insert(module.clone(), references(&module, &text, &known));
        files.insert(module, path);
    }
    Graph { files, edges }
}

fn layer_of(top: &str) -> Option<usize> {
    LAYERS.iter().position(|layer| layer.contains(&top))
}

#[test]
fn top_level_modules_import_only_lower_layers() {
    let graph = graph();
    let mut wrong = Vec::new();
    for (from, targets) in &graph.edges {
        let Some(from_top) = from.first() else {
            continue;
        };
        let Some(from_layer) = layer_of(from_top) else {
            wrong.push(format!("{from_top} is in no layer of LAYERS"));
            continue;
        };
        for to in targets {
            let Some(to_top) = to.first() else { continue };
            if to_top == from_top {
                continue;
            }
            match layer_of(to_top) {
                Some(to_layer) if to_layer < from_layer => {}
                _ => wrong.push(format!(
                    "{} imports {} ({from_top} may only import layers below its own)",
                    graph.files[from].display(),
                    to.join("::")
                )),
            }
        }
    }
    wrong.sort();
    wrong.dedup();
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn modules_beside_each_other_form_no_cycle() {
    let graph = graph();
    let mut cycles = Vec::new();
    for parent in graph.files.keys() {
        // Edges between the children of `parent`, each child standing for its whole subtree.
        let depth = parent.len();
        let child = |m: &Module| -> Option<String> {
            (m.len() > depth && m[..depth] == parent[..]).then(|| m[depth].clone())
        };
        let mut between: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (from, targets) in &graph.edges {
            let Some(a) = child(from) else { continue };
            for to in targets {
                if let Some(b) = child(to).filter(|b| *b != a) {
                    between.entry(a.clone()).or_default().insert(b);
                }
            }
        }
        if let Some(cycle) = find_cycle(&between) {
            let mut named: Vec<String> = cycle
                .iter()
                .map(|m| {
                    let mut path = parent.clone();
                    path.push(m.clone());
                    path.join("::")
                })
                .collect();
            named.push(named[0].clone());
            cycles.push(named.join(" -> "));
        }
    }
    assert!(cycles.is_empty(), "import cycles:\n{}", cycles.join("\n"));
}

/// One cycle in `graph`, if there is any.
fn find_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        state: &mut BTreeMap<String, bool>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        state.insert(node.to_string(), true);
        stack.push(node.to_string());
        for next in graph.get(node).into_iter().flatten() {
            match state.get(next) {
                Some(true) => {
                    let at = stack.iter().position(|n| n == next).unwrap_or(0);
                    return Some(stack[at..].to_vec());
                }
                Some(false) => {}
                None => {
                    if let Some(cycle) = visit(next, graph, state, stack) {
                        return Some(cycle);
                    }
                }
            }
        }
        stack.pop();
        state.insert(node.to_string(), false);
        None
    }
    let mut state = BTreeMap::new();
    for node in graph.keys() {
        if !state.contains_key(node) {
            let mut stack = Vec::new();
            if let Some(cycle) = visit(node, graph, &mut state, &mut stack) {
                return Some(cycle);
            }
        }
    }
    None
}

#[test]
fn the_checker_sees_what_it_checks() {
    let graph = graph();
    let proxy: Module = vec!["proxy".into()];
    let publish: Module = vec!["publish".into()];
    // A known edge is found, and test modules are left out.
    assert!(
        graph.edges[&proxy].contains(&publish),
        "{:?}",
        graph.edges[&proxy]
    );
    assert!(
        !graph
            .files
            .keys()
            .any(|m| m.last().is_some_and(|l| l == "tests"))
    );
    // A cycle is recognised.
    let mut looped = BTreeMap::new();
    looped.insert("a".to_string(), BTreeSet::from(["b".to_string()]));
    looped.insert("b".to_string(), BTreeSet::from(["a".to_string()]));
    assert!(find_cycle(&looped).is_some());
    looped.remove("b");
    assert!(find_cycle(&looped).is_none());
    // Comments and test blocks do not count.
    let stripped = without_tests(&without_comments(
        "use crate::a; // crate::b\n#[cfg(test)]\nmod tests { use crate::c; }\n",
    ));
    assert!(stripped.contains("crate::a") && !stripped.contains("crate::b"));
    assert!(!stripped.contains("crate::c"));
}
