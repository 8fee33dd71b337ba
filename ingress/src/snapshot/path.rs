//! Path matching, as the Ingress v1 documentation specifies it.
//!
//! - `Exact`: the whole path, case-sensitive.
//! - `Prefix`: element-wise on `/`-separated segments; a trailing slash on either side is ignored.
//!   `/foo` matches `/foo`, `/foo/` and `/foo/bar`, never `/foobar`.
//! - `ImplementationSpecific`: a regular expression (the `regex` crate's syntax) anchored at the
//!   start of the path; it need not match to the end.
//!
//! Precedence: the longest declared path wins; on equal length Exact beats Prefix beats a
//! regular expression; then the older Ingress (rules are added oldest first and ties keep
//! insertion order).
//!
//! ingress-nginx's regex mode ([`PathMatcher::nginx_regex`]): on a host where any Ingress sets
//! `use-regex` or `rewrite-target`, every path of that host, whatever its type and Ingress, is
//! the case-insensitive regex `^PATH` (nginx's `location ~* "^PATH"`), and the first match wins
//! in ingress-nginx's order: longer path text first, then the greater text, then the older
//! Ingress. So `/foo` there matches `/FOO` and `/foobar`, and `/foo/[a-z]+` beats `/foo/bar`.

use regex::Regex;

use super::prefix_shape::PrefixShape;

/// How a rule matches, after validation.
#[derive(Clone, Debug)]
pub enum PathKind {
    Exact,
    Prefix,
    Regex(PathRegex),
}

/// A regex path: the compiled regex, and its shape when it has one of the few that are
/// matched without the engine ([`PrefixShape`]).
#[derive(Clone, Debug)]
pub struct PathRegex {
    regex: Regex,
    shape: Option<PrefixShape>,
}

impl PathRegex {
    fn new(regex: Regex, path: &str, case_insensitive: bool) -> PathRegex {
        PathRegex {
            regex,
            shape: PrefixShape::of(path, case_insensitive),
        }
    }

    pub fn is_match(&self, request_path: &str) -> bool {
        self.shape
            .as_ref()
            .and_then(|shape| shape.is_match(request_path))
            .unwrap_or_else(|| self.regex.is_match(request_path))
    }
}

impl PathKind {
    fn rank(&self) -> u8 {
        match self {
            PathKind::Exact => 2,
            PathKind::Prefix => 1,
            PathKind::Regex(_) => 0,
        }
    }

    pub fn as_str(&self) -> &'static str {
        match self {
            PathKind::Exact => "Exact",
            PathKind::Prefix => "Prefix",
            PathKind::Regex(_) => "ImplementationSpecific",
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PathError {
    #[error("path {0:?} must start with '/'")]
    NotAbsolute(String),
    #[error("invalid regular expression {path:?}: {reason}")]
    Regex { path: String, reason: String },
    #[error("unknown pathType {0:?} (expected Exact, Prefix or ImplementationSpecific)")]
    UnknownType(String),
}

/// Regexes larger than this are refused, so one tenant cannot make routing slow for all.
pub(crate) const REGEX_SIZE_LIMIT: usize = 256 * 1024;

/// Validates a rule's path and type.
pub fn compile(path: &str, path_type: &str) -> Result<PathKind, PathError> {
    match path_type {
        "Exact" | "Prefix" if !path.starts_with('/') => Err(PathError::NotAbsolute(path.into())),
        "Exact" => Ok(PathKind::Exact),
        "Prefix" => Ok(PathKind::Prefix),
        "ImplementationSpecific" => regex::RegexBuilder::new(&format!("^(?:{path})"))
            .size_limit(REGEX_SIZE_LIMIT)
            .build()
            .map(|regex| PathKind::Regex(PathRegex::new(regex, path, false)))
            .map_err(|e| PathError::Regex {
                path: path.into(),
                reason: e.to_string(),
            }),
        other => Err(PathError::UnknownType(other.into())),
    }
}

/// A path as ingress-nginx's regex mode reads it: `(?i)^` followed by the path's text.
pub fn compile_nginx_regex(path: &str) -> Result<PathKind, PathError> {
    regex::RegexBuilder::new(&format!("(?i)^{path}"))
        .size_limit(REGEX_SIZE_LIMIT)
        .build()
        .map(|regex| PathKind::Regex(PathRegex::new(regex, path, true)))
        .map_err(|e| PathError::Regex {
            path: path.into(),
            reason: e.to_string(),
        })
}

/// One matchable path and what it leads to.
#[derive(Clone, Debug)]
pub struct PathRule<T> {
    pub path: String,
    pub kind: PathKind,
    pub target: T,
}

impl<T> PathRule<T> {
    pub fn matches(&self, request_path: &str) -> bool {
        match &self.kind {
            PathKind::Exact => self.path == request_path,
            PathKind::Prefix => prefix_matches(&self.path, request_path),
            PathKind::Regex(re) => re.is_match(request_path),
        }
    }

    /// The length precedence is ranked by. A Prefix rule's trailing slash does not count, so
    /// `/foo/` and `/foo` rank alike, as they match alike.
    fn declared_len(&self) -> usize {
        match self.kind {
            PathKind::Prefix => trim_trailing_slash(&self.path).len(),
            _ => self.path.len(),
        }
    }
}

/// The rules of one host, ordered by precedence so the first match is the answer.
#[derive(Clone, Debug)]
pub struct PathMatcher<T> {
    rules: Vec<PathRule<T>>,
}

impl<T> Default for PathMatcher<T> {
    fn default() -> Self {
        Self { rules: Vec::new() }
    }
}

impl<T> PathMatcher<T> {
    /// Builds a matcher from rules in insertion order (oldest Ingress first).
    pub fn new(mut rules: Vec<PathRule<T>>) -> Self {
        // Stable sort: equal keys keep insertion order, which is the "older wins" tie-break.
        rules.sort_by(|a, b| {
            b.declared_len()
                .cmp(&a.declared_len())
                .then(b.kind.rank().cmp(&a.kind.rank()))
        });
        Self { rules }
    }

    /// A matcher in ingress-nginx's regex-mode order (see the module's documentation): rules in
    /// insertion order (oldest Ingress first), each already compiled by [`compile_nginx_regex`].
    pub fn nginx_regex(mut rules: Vec<PathRule<T>>) -> Self {
        // Two stable sorts, as ingress-nginx's controller does them.
        rules.sort_by(|a, b| b.path.cmp(&a.path));
        rules.sort_by_key(|rule| std::cmp::Reverse(rule.path.len()));
        Self { rules }
    }

    pub fn find(&self, request_path: &str) -> Option<&PathRule<T>> {
        self.rules.iter().find(|rule| rule.matches(request_path))
    }

    pub fn rules(&self) -> &[PathRule<T>] {
        &self.rules
    }

    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }
}

fn trim_trailing_slash(path: &str) -> &str {
    let trimmed = path.trim_end_matches('/');
    if trimmed.is_empty() { "/" } else { trimmed }
}

/// Element-wise prefix: every segment of `prefix` equals the request's segment at the same
/// position. Empty segments from a trailing slash are ignored on both sides.
fn prefix_matches(prefix: &str, request: &str) -> bool {
    let prefix = trim_trailing_slash(prefix);
    if prefix == "/" {
        return request.starts_with('/');
    }
    let request_trimmed = trim_trailing_slash(request);
    match request_trimmed.strip_prefix(prefix) {
        Some(rest) => rest.is_empty() || rest.starts_with('/'),
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matcher(rules: &[(&str, &str)]) -> PathMatcher<usize> {
        PathMatcher::new(
            rules
                .iter()
                .enumerate()
                .map(|(i, (ty, path))| PathRule {
                    path: path.to_string(),
                    kind: compile(path, ty).expect("valid rule"),
                    target: i,
                })
                .collect(),
        )
    }

    /// The examples table of the Kubernetes Ingress documentation, row by row, plus the
    /// precedence rules stated beside it.
    #[test]
    fn kubernetes_documentation_examples() {
        let p = "Prefix";
        let e = "Exact";
        // (rules, request, index of the winning rule or None)
        let cases: &[(&[(&str, &str)], &str, Option<usize>)] = &[
            (&[(p, "/")], "/", Some(0)),
            (&[(p, "/")], "/anything/at/all", Some(0)),
            (&[(e, "/foo")], "/foo", Some(0)),
            (&[(e, "/foo")], "/bar", None),
            (&[(e, "/foo")], "/foo/", None),
            (&[(e, "/foo/")], "/foo", None),
            (&[(p, "/foo")], "/foo", Some(0)),
            (&[(p, "/foo")], "/foo/", Some(0)),
            (&[(p, "/foo/")], "/foo", Some(0)),
            (&[(p, "/foo/")], "/foo/", Some(0)),
            (&[(p, "/aaa/bb")], "/aaa/bbb", None),
            (&[(p, "/aaa/bbb")], "/aaa/bbb", Some(0)),
            (&[(p, "/aaa/bbb/")], "/aaa/bbb", Some(0)),
            (&[(p, "/aaa/bbb")], "/aaa/bbb/", Some(0)),
            (&[(p, "/aaa/bbb")], "/aaa/bbbxyz", None),
            (&[(p, "/"), (p, "/aaa")], "/aaa/ccc", Some(1)),
            (
                &[(p, "/"), (p, "/aaa"), (p, "/aaa/bbb")],
                "/aaa/bbb",
                Some(2),
            ),
            (&[(p, "/"), (p, "/aaa"), (p, "/aaa/bbb")], "/ccc", Some(0)),
            (&[(p, "/aaa")], "/ccc", None),
            (&[(e, "/foo"), (p, "/foo")], "/foo", Some(0)),
            (&[(p, "/foo"), (e, "/foo")], "/foo", Some(1)),
            (&[(p, "/foo"), (e, "/foo")], "/foo/x", Some(0)),
            (
                &[(p, "/aaa/bbb"), (e, "/aaa/bbb/ccc")],
                "/aaa/bbb/ccc",
                Some(1),
            ),
            (
                &[(p, "/aaa/bbb"), (e, "/aaa/bbb/ccc")],
                "/aaa/bbb/ccc/",
                Some(0),
            ),
        ];
        for (rules, request, want) in cases {
            let m = matcher(rules);
            let got = m.find(request).map(|r| r.target);
            assert_eq!(got, *want, "rules {rules:?} request {request}");
        }
    }

    #[test]
    fn regex_paths_are_anchored_at_the_start() {
        let i = "ImplementationSpecific";
        let cases: &[(&[(&str, &str)], &str, Option<usize>)] = &[
            (&[(i, "/api/v[0-9]+")], "/api/v2/users", Some(0)),
            (&[(i, "/api/v[0-9]+")], "/x/api/v2", None),
            (&[(i, "/api/v[0-9]+$")], "/api/v2/users", None),
            (&[(i, "(?i)/API")], "/api", Some(0)),
            (&[(i, "/API")], "/api", None),
            // Longest declared path first, regardless of type.
            (
                &[(i, "/a.*"), ("Prefix", "/abc/def")],
                "/abc/def/g",
                Some(1),
            ),
            (&[("Prefix", "/ab"), (i, "/abc.*")], "/abcd", Some(1)),
            // Equal length: Prefix beats a regex.
            (&[(i, "/abc"), ("Prefix", "/abc")], "/abc", Some(1)),
        ];
        for (rules, request, want) in cases {
            let got = matcher(rules).find(request).map(|r| r.target);
            assert_eq!(got, *want, "rules {rules:?} request {request}");
        }
    }

    /// ingress-nginx's docs/user-guide/ingress-path-matching.md, and what its `~*` modifier does
    /// to Exact and Prefix paths on such a host.
    #[test]
    fn nginx_regex_mode() {
        let nginx = |paths: &[&str]| {
            PathMatcher::nginx_regex(
                paths
                    .iter()
                    .enumerate()
                    .map(|(i, p)| PathRule {
                        path: p.to_string(),
                        kind: compile_nginx_regex(p).expect("valid"),
                        target: i,
                    })
                    .collect(),
            )
        };
        let cases: &[(&[&str], &str, Option<usize>)] = &[
            // The documentation's example: service1 /foo/bar, service2 /foo/bar/, service3
            // /foo/bar/(.+).
            (
                &["/foo/bar", "/foo/bar/", "/foo/bar/(.+)"],
                "/foo/bar/1",
                Some(2),
            ),
            (
                &["/foo/bar", "/foo/bar/", "/foo/bar/(.+)"],
                "/foo/bar/",
                Some(1),
            ),
            (
                &["/foo/bar", "/foo/bar/", "/foo/bar/(.+)"],
                "/foo/bar",
                Some(0),
            ),
            // Its warning: the regex is longer, so it wins over the "exact" text.
            (
                &["/foo/bar/bar", "/foo/bar/[A-Z0-9]{3}"],
                "/foo/bar/bar",
                Some(1),
            ),
            // Case-insensitive, and a prefix of the text, not of segments.
            (&["/foo"], "/FOO", Some(0)),
            (&["/foo"], "/foobar", Some(0)),
            (&["/foo"], "/x/foo", None),
            // Equal length: the greater text first, whatever the order of the Ingresses.
            (&["/a.", "/ab"], "/ab", Some(1)),
            (&["/ab", "/a."], "/ab", Some(0)),
            (&["/", "/api"], "/api/x", Some(1)),
            (&["/", "/api"], "/other", Some(0)),
        ];
        for (paths, request, want) in cases {
            let got = nginx(paths).find(request).map(|r| r.target);
            assert_eq!(got, *want, "paths {paths:?} request {request}");
        }
        assert!(compile_nginx_regex("/a(").is_err());
    }

    #[test]
    fn invalid_rules() {
        assert_eq!(
            compile("foo", "Prefix").unwrap_err(),
            PathError::NotAbsolute("foo".into())
        );
        assert_eq!(
            compile("", "Exact").unwrap_err(),
            PathError::NotAbsolute("".into())
        );
        assert!(matches!(
            compile("/a(", "ImplementationSpecific"),
            Err(PathError::Regex { .. })
        ));
        assert!(matches!(
            compile("/a", "Glob"),
            Err(PathError::UnknownType(_))
        ));
        let huge = format!("/{}", "(a|b)*".repeat(5000));
        assert!(
            matches!(
                compile(&huge, "ImplementationSpecific"),
                Err(PathError::Regex { .. })
            ),
            "an expensive regex is refused"
        );
    }
}
