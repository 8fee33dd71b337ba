//! Regex paths of the few shapes nearly every Ingress writes, matched without a regex engine.
//!
//! ```text
//!   LITERAL              /app          ─> the path starts with LITERAL
//!   LITERAL(.*)          /app/(.*)     ─> … and $1 is the rest
//!   LITERAL(/|$)(.*)     /app(/|$)(.*) ─> … followed by '/' or the end; $1 "/" or "", $2 the rest
//! ```
//!
//! The third is ingress-nginx's documented `rewrite-target` recipe, and in its regex mode every
//! plain path of the host becomes the first. The regex engine answers these with a DFA scan and,
//! for captures, a second engine; a byte comparison answers them in a fraction of that, on a
//! request path every request of such a route pays for.
//!
//! A shape is recognised on the parsed pattern (`regex-syntax`'s HIR), never on its text, and the
//! answer is only given where it is certainly the regex's: an ASCII literal, on an ASCII path
//! with no newline (`.` does not match one). Anything else is `None`, and the regex decides.

use regex_syntax::hir::HirKind;

/// A pattern's shape: a literal prefix and what may follow it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PrefixShape {
    literal: Box<[u8]>,
    tail: Tail,
    case_insensitive: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Tail {
    /// Nothing: the match ends with the literal.
    None,
    /// `(.*)`: group 1 is the rest.
    Rest,
    /// `(/|$)(.*)`: group 1 is `/` or empty (at the end), group 2 the rest.
    SlashOrEndRest,
}

/// The capture groups of a match, as byte ranges of the path: the whole match, `$1`, `$2`.
pub type Groups = [Option<(usize, usize)>; 3];

impl PrefixShape {
    /// The shape of `pattern` (as written in the Ingress, without the `^` and `(?i)` the matcher
    /// adds), or `None` when it has none of these shapes.
    pub fn of(pattern: &str, case_insensitive: bool) -> Option<PrefixShape> {
        let hir = regex_syntax::parse(pattern).ok()?;
        let literal: &[u8] = match hir.kind() {
            HirKind::Literal(literal) => &literal.0,
            HirKind::Concat(parts) => match parts.first().map(|p| p.kind()) {
                Some(HirKind::Literal(literal)) => &literal.0,
                _ => &[],
            },
            _ => &[],
        };
        if !literal.is_ascii() {
            return None;
        }
        // The literal as text (ASCII, so UTF-8), escaped back into a pattern: the shape is the
        // one whose parse equals the pattern's, both under the flags the matcher compiles with
        // (so an inline `(?-i)` in the pattern is not taken for a case-insensitive literal).
        let escaped = regex_syntax::escape(std::str::from_utf8(literal).ok()?);
        let flags = if case_insensitive { "(?i)" } else { "" };
        let compiled = regex_syntax::parse(&format!("{flags}{pattern}")).ok()?;
        let tail = [
            (Tail::None, ""),
            (Tail::Rest, "(.*)"),
            (Tail::SlashOrEndRest, "(/|$)(.*)"),
        ]
        .into_iter()
        .find(|(_, tail)| {
            regex_syntax::parse(&format!("{flags}{escaped}{tail}"))
                .ok()
                .as_ref()
                == Some(&compiled)
        })?
        .0;
        Some(PrefixShape {
            literal: literal.into(),
            tail,
            case_insensitive,
        })
    }

    /// Whether the pattern, anchored at the path's start, matches `path`; `None` when only the
    /// regex can say.
    pub fn is_match(&self, path: &str) -> Option<bool> {
        if !path.is_ascii() {
            return None;
        }
        // Past the literal only `(/|$)` can fail: `(.*)` matches the empty string, so a newline
        // in the rest does not matter here.
        Some(self.after_literal(path).is_some_and(|rest| {
            self.tail != Tail::SlashOrEndRest || rest.is_empty() || rest.starts_with(b"/")
        }))
    }

    /// The groups of the pattern's match anchored at the path's start: `Some(None)` when there
    /// is none, `None` when only the regex can say.
    pub fn captures(&self, path: &str) -> Option<Option<Groups>> {
        if !path.is_ascii() || path.contains('\n') {
            return None;
        }
        let Some(rest) = self.after_literal(path) else {
            return Some(None);
        };
        let at = self.literal.len();
        let end = path.len();
        Some(match self.tail {
            Tail::None => Some([Some((0, at)), None, None]),
            Tail::Rest => Some([Some((0, end)), Some((at, end)), None]),
            Tail::SlashOrEndRest if rest.is_empty() => {
                Some([Some((0, end)), Some((at, at)), Some((at, end))])
            }
            Tail::SlashOrEndRest if rest.starts_with(b"/") => {
                Some([Some((0, end)), Some((at, at + 1)), Some((at + 1, end))])
            }
            Tail::SlashOrEndRest => None,
        })
    }

    /// What follows the literal, when the path starts with it (ASCII; without case when the
    /// pattern is case-insensitive).
    fn after_literal<'p>(&self, path: &'p str) -> Option<&'p [u8]> {
        let path = path.as_bytes();
        let head = path.get(..self.literal.len())?;
        let same = if self.case_insensitive {
            head.eq_ignore_ascii_case(&self.literal)
        } else {
            *head == *self.literal
        };
        same.then(|| &path[self.literal.len()..])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_are_recognised_on_the_parsed_pattern() {
        let cases: &[(&str, Option<(&[u8], Tail)>)] = &[
            ("/api", Some((b"/api", Tail::None))),
            ("/", Some((b"/", Tail::None))),
            ("/app/(.*)", Some((b"/app/", Tail::Rest))),
            ("/api(/|$)(.*)", Some((b"/api", Tail::SlashOrEndRest))),
            // The same regex written differently is the same shape.
            ("/ap[i](/|$)(.*)", Some((b"/api", Tail::SlashOrEndRest))),
            (r"/a\-b(.*)", Some((b"/a-b", Tail::Rest))),
            ("(.*)", Some((b"", Tail::Rest))),
            // Not these shapes: the regex decides.
            ("/a.b", None),
            ("/api(/|$)(.+)", None),
            ("/api(/|$)(?P<rest>.*)", None),
            ("/api($|/)(.*)", None),
            ("/api/(.*)/x", None),
            ("/a|/b", None),
            ("/über(.*)", None),
            ("/a(", None),
        ];
        for (pattern, want) in cases {
            let want = want.map(|(l, t)| (l.to_vec(), t));
            for case_insensitive in [true, false] {
                let got = PrefixShape::of(pattern, case_insensitive)
                    .map(|s| (s.literal.to_vec(), s.tail));
                assert_eq!(got, want, "{pattern} (case-insensitive {case_insensitive})");
            }
        }
        // Inline flags that change what the literal matches leave it to the regex.
        assert_eq!(PrefixShape::of("(?-i)/Foo", true), None);
        assert_eq!(PrefixShape::of("(?i)/foo", false), None);
    }

    /// Every answer the shape gives is the regex's, on paths chosen to hit each edge: case,
    /// the literal's end, a newline, non-ASCII (where Unicode case folding may match).
    #[test]
    fn answers_equal_the_regex() {
        let patterns = [
            "/api(/|$)(.*)",
            "/API(/|$)(.*)",
            "/api",
            "/",
            "/app/(.*)",
            "/spike(.*)",
            "(.*)",
        ];
        let paths = [
            "",
            "/",
            "/api",
            "/api/",
            "/API/x",
            "/Api/items?x",
            "/apix",
            "/apI/a/b/c",
            "/ap",
            "/api/a\nb",
            "/api\n",
            "/api/é",
            "/ſpike",
            "/spike",
            "/SPIKE/x",
            "/app",
            "/app/",
            "/APP/x/y",
            "/x/api/y",
            "/spi\u{212a}e",
            "/\u{212a}",
        ];
        for pattern in patterns {
            for case_insensitive in [true, false] {
                let flags = if case_insensitive { "(?i)" } else { "" };
                let shape = PrefixShape::of(pattern, case_insensitive)
                    .unwrap_or_else(|| panic!("{pattern} has a shape"));
                let routing = regex::Regex::new(&format!("{flags}^(?:{pattern})")).unwrap();
                let capturing = regex::Regex::new(&format!("{flags}^{pattern}")).unwrap();
                for path in paths {
                    let label = format!("{flags}{pattern} on {path:?}");
                    if let Some(matched) = shape.is_match(path) {
                        assert_eq!(matched, routing.is_match(path), "{label}");
                    } else {
                        assert!(!path.is_ascii(), "{label}: undecided on an ASCII path");
                    }
                    let Some(groups) = shape.captures(path) else {
                        assert!(!path.is_ascii() || path.contains('\n'), "{label}");
                        continue;
                    };
                    let want = capturing.captures(path).map(|c| {
                        let mut out: Groups = [None; 3];
                        for (i, slot) in out.iter_mut().enumerate() {
                            *slot = c.get(i).map(|m| (m.start(), m.end()));
                        }
                        out
                    });
                    assert_eq!(groups, want, "{label}");
                }
            }
        }
    }
}
