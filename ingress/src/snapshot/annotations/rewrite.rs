//! The values of ingress-nginx's path annotations: `rewrite-target` (a path with `$1`..`$9`),
//! `app-root` and `x-forwarded-prefix` (plain paths).
//!
//! ```text
//!   "/api/$2"  ─ parse ─> Template [Literal("/api/"), Group(2)]
//!   expand(template, captures of the route's regex on the request path) ─> "/api/users"
//! ```
//!
//! ingress-nginx accepts these values when they match `^/?[-._~a-zA-Z0-9/:$]*$`, and writes them
//! into nginx's configuration, where `$name` would be an nginx variable. Here only `$1`..`$9`
//! mean something; any other `$`, and an absolute URL (which nginx's `rewrite` turns into a
//! redirect), are refused.

use std::fmt;

/// A parsed `rewrite-target`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Template {
    raw: String,
    pieces: Vec<Piece>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Piece {
    Literal(String),
    /// `$N`, 1..=9.
    Group(usize),
}

/// Why a path annotation's value is refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ValueError {
    #[error("{0:?} may only contain letters, digits and -._~/:$")]
    Characters(String),
    #[error("{0:?}: only $1 to $9 (capture groups) are supported after '$', not nginx variables")]
    Variable(String),
    #[error("{0:?} is an absolute URL; a rewrite target is a path")]
    Absolute(String),
    #[error("{0:?} is empty")]
    Empty(String),
    #[error("{0:?} must be a path starting with '/'")]
    NotAPath(String),
}

/// ingress-nginx's `RegexPathWithCapture`, less the optional leading slash it allows anyway.
fn allowed(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"-._~/:$".contains(&b)
}

impl Template {
    pub fn parse(value: &str) -> Result<Template, ValueError> {
        if value.is_empty() {
            return Err(ValueError::Empty(value.into()));
        }
        if !value.bytes().all(allowed) {
            return Err(ValueError::Characters(value.into()));
        }
        if value.contains("://") {
            return Err(ValueError::Absolute(value.into()));
        }
        let mut pieces = Vec::new();
        let mut literal = String::new();
        let mut bytes = value.bytes().peekable();
        while let Some(b) = bytes.next() {
            if b != b'$' {
                literal.push(char::from(b));
                continue;
            }
            match bytes.next() {
                Some(d @ b'1'..=b'9') => {
                    if !literal.is_empty() {
                        pieces.push(Piece::Literal(std::mem::take(&mut literal)));
                    }
                    pieces.push(Piece::Group(usize::from(d - b'0')));
                }
                _ => return Err(ValueError::Variable(value.into())),
            }
        }
        if !literal.is_empty() {
            pieces.push(Piece::Literal(literal));
        }
        Ok(Template {
            raw: value.into(),
            pieces,
        })
    }

    pub fn as_str(&self) -> &str {
        &self.raw
    }

    /// The path the template makes from a match's capture groups (`group(n)`, empty for a group
    /// that did not take part). Always starts with `/`.
    pub fn expand<'a>(&self, group: impl Fn(usize) -> Option<&'a str>) -> String {
        let mut out = String::with_capacity(self.raw.len() + 32);
        for piece in &self.pieces {
            match piece {
                Piece::Literal(s) => out.push_str(s),
                Piece::Group(n) => out.push_str(group(*n).unwrap_or("")),
            }
        }
        if !out.starts_with('/') {
            out.insert(0, '/');
        }
        out
    }
}

impl fmt::Display for Template {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.raw)
    }
}

/// `app-root` and `x-forwarded-prefix`: a literal path.
pub fn literal_path(value: &str) -> Result<&str, ValueError> {
    if value.is_empty() {
        return Err(ValueError::Empty(value.into()));
    }
    if !value.bytes().all(allowed) {
        return Err(ValueError::Characters(value.into()));
    }
    if value.contains('$') {
        return Err(ValueError::Variable(value.into()));
    }
    if !value.starts_with('/') || value.starts_with("//") {
        return Err(ValueError::NotAPath(value.into()));
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_expand_capture_groups() {
        let groups = ["/something/new", "/", "new"];
        let group = |n: usize| groups.get(n - 1).copied();
        // (annotation, expansion with $1="/something/new" $2="/" $3="new")
        let cases = [
            ("/", "/"),
            ("/$3", "/new"),
            ("$1", "/something/new"),
            ("/api$1", "/api/something/new"),
            ("/x/$3/$2", "/x/new//"),
            ("/$9", "/"),
            ("$3", "/new"),
            ("/a:b~c_d.e-f", "/a:b~c_d.e-f"),
        ];
        for (value, want) in cases {
            let template = Template::parse(value).unwrap_or_else(|e| panic!("{value}: {e}"));
            assert_eq!(template.expand(group), want, "{value}");
            assert_eq!(template.as_str(), value);
        }
    }

    #[test]
    fn invalid_templates() {
        let cases = [
            ("", ValueError::Empty(String::new())),
            ("/a b", ValueError::Characters("/a b".into())),
            ("/a?b=1", ValueError::Characters("/a?b=1".into())),
            ("/a\n", ValueError::Characters("/a\n".into())),
            ("/$uri", ValueError::Variable("/$uri".into())),
            ("/$0", ValueError::Variable("/$0".into())),
            ("/x$", ValueError::Variable("/x$".into())),
            (
                "http://evil.example/$1",
                ValueError::Absolute("http://evil.example/$1".into()),
            ),
        ];
        for (value, want) in cases {
            assert_eq!(Template::parse(value), Err(want), "{value}");
        }
    }

    #[test]
    fn literal_paths() {
        assert_eq!(literal_path("/app"), Ok("/app"));
        assert_eq!(literal_path("/a/b-c_d"), Ok("/a/b-c_d"));
        for bad in [
            "",
            "app",
            "//evil.example",
            "/$1",
            "/a b",
            "/a?x",
            "http://x/",
        ] {
            assert!(literal_path(bad).is_err(), "{bad}");
        }
    }
}
