//! The request target, as the route phase sees it: validated once and normalised once, so the
//! path a request is routed by is the path its upstream is sent.
//!
//! ```text
//!   raw target ─ a byte RFC 3986 does not allow (`#`, space, controls, non-ASCII, `"<>` …)? ─> 400
//!      │ split at the first `?`
//!      ├─ path ─ `%XX` well formed, not `%00`?                                     no ─> 400
//!      │         `%XX` of an unreserved character: decoded; other escapes: hex upper-cased
//!      │         `%2F` / `%5C` (encoded `/` and `\`): --escaped-slashes
//!      │              keep: stay encoded (routing is checked against the decoded form)
//!      │              reject: 400    unescape: become `/`
//!      │         dot-segments resolved (above the root, or `..;x`, `.;x`: 400)
//!      │         repeated slashes merged (--merge-slashes)
//!      └─ query ─ passed on as sent
//!   Target { path: routed and forwarded, query, decoded: the keep-mode cross-check }
//! ```
//!
//! Backends decode `%2F` to `/` and resolve `..` after it (nginx does; so does almost every
//! application server), and some (Tomcat, Spring) read `..;x` as `..`. A path an upstream would
//! read differently from how it was routed is how requests get past routing rules, so either the
//! ambiguity is refused or the upstream is sent the one reading that was routed.

use std::borrow::Cow;
use std::fmt;

/// What to do with an encoded slash (`%2F`) or backslash (`%5C`) in a path, as Envoy names the
/// choices.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum EscapedSlashes {
    /// Leave them encoded, in routing and upstream; the request is refused (400) if decoding
    /// them would route it anywhere else. Keeps APIs that put `%2F` in a path segment working.
    #[default]
    Keep,
    /// Refuse every request whose path has one (400).
    Reject,
    /// Decode them to `/` and route and forward the decoded path.
    Unescape,
}

/// How paths are normalised; from flags.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PathSettings {
    pub escaped_slashes: EscapedSlashes,
    /// `//` becomes `/` (nginx's `merge_slashes`, on by default there too).
    pub merge_slashes: bool,
}

impl Default for PathSettings {
    fn default() -> Self {
        Self {
            escaped_slashes: EscapedSlashes::Keep,
            merge_slashes: true,
        }
    }
}

/// Why a request target is refused; every one of these is a 400.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TargetError {
    #[error("the request target is not an absolute path")]
    NotOriginForm,
    #[error("the request target contains a fragment ('#')")]
    Fragment,
    #[error("the request target contains byte 0x{0:02x}, which a URI may not")]
    Byte(u8),
    #[error("malformed percent-escape in the path")]
    BadEscape,
    #[error("the path contains an encoded NUL")]
    Nul,
    #[error("the path contains an encoded slash or backslash")]
    EscapedSlash,
    #[error("the path climbs above the root")]
    AboveRoot,
    #[error("a dot-segment with parameters ('..;' or '.;')")]
    DotParameters,
}

/// A validated, normalised request target.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target<'a> {
    /// The path routing matches and the upstream is sent.
    pub path: Cow<'a, str>,
    /// Everything after the first `?`, without it.
    pub query: Option<&'a str>,
    /// In `keep` mode, when the path has `%2F` or `%5C`: the path as an upstream that decodes
    /// them resolves it. Routing must pick the same route for both.
    pub decoded: Option<String>,
}

impl Target<'_> {
    /// `path?query`, as the upstream is sent it.
    pub fn write(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self.path.as_bytes());
        if let Some(query) = self.query {
            out.push(b'?');
            out.extend_from_slice(query.as_bytes());
        }
    }

    /// Whether the upstream is sent exactly the bytes the client sent.
    pub fn unchanged(&self) -> bool {
        matches!(self.path, Cow::Borrowed(_))
    }
}

impl fmt::Display for Target<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.path)?;
        if let Some(query) = self.query {
            write!(f, "?{query}")?;
        }
        Ok(())
    }
}

/// Validates and normalises an origin-form target (`/path?query`).
pub fn parse<'a>(raw: &'a str, settings: &PathSettings) -> Result<Target<'a>, TargetError> {
    if !raw.starts_with('/') {
        return Err(TargetError::NotOriginForm);
    }
    let (path, query) = match raw.split_once('?') {
        Some((path, query)) => (path, Some(query)),
        None => (raw, None),
    };
    check_bytes(path, path_byte)?;
    if let Some(query) = query {
        check_bytes(query, query_byte)?;
    }
    let path = normalize(path, settings.escaped_slashes, settings.merge_slashes)?;
    let decoded = match settings.escaped_slashes {
        EscapedSlashes::Keep if has_escaped_slash(&path) => {
            Some(normalize(&path, EscapedSlashes::Unescape, settings.merge_slashes)?.into_owned())
        }
        _ => None,
    };
    Ok(Target {
        path,
        query,
        decoded,
    })
}

fn check_bytes(part: &str, allowed: fn(u8) -> bool) -> Result<(), TargetError> {
    match part.bytes().find(|&b| !allowed(b)) {
        None => Ok(()),
        Some(b'#') => Err(TargetError::Fragment),
        Some(b) => Err(TargetError::Byte(b)),
    }
}

/// `pchar` and `/` (RFC 3986 section 3.3): unreserved, sub-delims, `:`, `@`, and escapes.
fn path_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=:@/%".contains(&b)
}

/// RFC 3986's query characters, plus the ones browsers send unescaped in a query (the WHATWG URL
/// standard leaves `{ } | \ ^` and the backtick alone there), so real query strings keep
/// working. A query is never routed on.
fn query_byte(b: u8) -> bool {
    path_byte(b) || b"?{}|\\^`".contains(&b)
}

fn has_escaped_slash(path: &str) -> bool {
    path.contains("%2F") || path.contains("%5C")
}

/// Whether a path is already in normal form, which nearly every path is.
fn is_normal(path: &str, merge_slashes: bool) -> bool {
    let needs_work = path.contains('%')
        || (merge_slashes && path.contains("//"))
        || path.split('/').any(is_dot_like);
    !needs_work
}

/// `.`, `..`, and the same with `;parameters` after them.
fn is_dot_like(segment: &str) -> bool {
    let name = segment.split(';').next().unwrap_or(segment);
    name == "." || name == ".."
}

fn normalize(
    path: &str,
    escaped_slashes: EscapedSlashes,
    merge_slashes: bool,
) -> Result<Cow<'_, str>, TargetError> {
    if is_normal(path, merge_slashes) {
        return Ok(Cow::Borrowed(path));
    }
    let decoded = decode(path, escaped_slashes)?;
    let mut segments: Vec<&str> = Vec::new();
    let mut parts = decoded.split('/').skip(1).peekable();
    let mut trailing = false;
    while let Some(segment) = parts.next() {
        let last = parts.peek().is_none();
        match segment {
            "." => trailing = last,
            ".." => {
                if segments.pop().is_none() {
                    return Err(TargetError::AboveRoot);
                }
                trailing = last;
            }
            s if is_dot_like(s) => return Err(TargetError::DotParameters),
            "" if merge_slashes => trailing = last,
            s => {
                segments.push(s);
                trailing = false;
            }
        }
    }
    let mut out = String::with_capacity(decoded.len());
    for segment in &segments {
        out.push('/');
        out.push_str(segment);
    }
    if out.is_empty() || trailing {
        out.push('/');
    }
    Ok(Cow::Owned(out))
}

/// Decodes escapes of unreserved characters, upper-cases the rest, and applies the encoded-slash
/// choice. The output is ASCII, and its only escapes are `%XX` with upper-case hex.
fn decode(path: &str, escaped_slashes: EscapedSlashes) -> Result<String, TargetError> {
    let bytes = path.as_bytes();
    let mut out = String::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if b != b'%' {
            out.push(char::from(b));
            i += 1;
            continue;
        }
        let (Some(h), Some(l)) = (
            bytes.get(i + 1).copied().and_then(hex),
            bytes.get(i + 2).copied().and_then(hex),
        ) else {
            return Err(TargetError::BadEscape);
        };
        i += 3;
        let c = h * 16 + l;
        match c {
            0 => return Err(TargetError::Nul),
            b'/' | b'\\' => match escaped_slashes {
                EscapedSlashes::Reject => return Err(TargetError::EscapedSlash),
                EscapedSlashes::Unescape => out.push('/'),
                EscapedSlashes::Keep => push_escape(&mut out, c),
            },
            c if c.is_ascii_alphanumeric() || b"-._~".contains(&c) => out.push(char::from(c)),
            c => push_escape(&mut out, c),
        }
    }
    Ok(out)
}

fn push_escape(out: &mut String, c: u8) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    out.push('%');
    out.push(char::from(HEX[usize::from(c >> 4)]));
    out.push(char::from(HEX[usize::from(c & 0xf)]));
}

fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEEP: PathSettings = PathSettings {
        escaped_slashes: EscapedSlashes::Keep,
        merge_slashes: true,
    };

    fn show(raw: &str, settings: &PathSettings) -> String {
        match parse(raw, settings) {
            Ok(t) => match &t.decoded {
                Some(d) => format!("{t} decoded={d}"),
                None => t.to_string(),
            },
            Err(e) => format!("error: {e:?}"),
        }
    }

    #[test]
    fn targets_in_keep_mode() {
        let cases: &[(&str, &str)] = &[
            ("/", "/"),
            ("/a/b?x=1&y=2", "/a/b?x=1&y=2"),
            ("/a//b", "/a/b"),
            ("//a", "/a"),
            ("/a/./b", "/a/b"),
            ("/public/../admin", "/admin"),
            ("/public/%2e%2e/admin", "/admin"),
            ("/public/%2E%2E/admin", "/admin"),
            ("/a/b/", "/a/b/"),
            ("/a/b/..", "/a/"),
            ("/a/b/.", "/a/b/"),
            ("/a/.", "/a/"),
            ("/a/..", "/"),
            ("/%41%62c", "/Abc"),
            ("/a%7eb", "/a~b"),
            ("/%e2%82%ac", "/%E2%82%AC"),
            ("/a;v=1/b", "/a;v=1/b"),
            ("/a?b=%zz", "/a?b=%zz"),
            ("/a?{\"x\"}", "error: Byte(34)"),
            ("/a?q={x}|y^z`\\", "/a?q={x}|y^z`\\"),
            ("/a?b#c", "error: Fragment"),
            ("/admin/secret#/../../x", "error: Fragment"),
            ("/internal#/../public", "error: Fragment"),
            ("/a b", "error: Byte(32)"),
            ("/a\tb", "error: Byte(9)"),
            ("/a{b}", "error: Byte(123)"),
            ("/a\\b", "error: Byte(92)"),
            ("/a\"b", "error: Byte(34)"),
            ("/a<b>", "error: Byte(60)"),
            ("/a|b", "error: Byte(124)"),
            ("/a^b", "error: Byte(94)"),
            ("/a\u{e9}", "error: Byte(195)"),
            ("/a\x7f", "error: Byte(127)"),
            ("/a%", "error: BadEscape"),
            ("/a%4", "error: BadEscape"),
            ("/a%zz", "error: BadEscape"),
            ("/a%00b", "error: Nul"),
            ("/../etc", "error: AboveRoot"),
            ("/a/../../etc", "error: AboveRoot"),
            ("/%2e%2e/x", "error: AboveRoot"),
            ("/public/..;/admin", "error: DotParameters"),
            ("/public/.;x/admin", "error: DotParameters"),
            ("/public/%2e%2e;/admin", "error: DotParameters"),
            ("/a/..b/c", "/a/..b/c"),
            (
                "/public/..%2Finternal",
                "/public/..%2Finternal decoded=/internal",
            ),
            (
                "/public/..%2finternal",
                "/public/..%2Finternal decoded=/internal",
            ),
            (
                "/public/..%5Cinternal",
                "/public/..%5Cinternal decoded=/internal",
            ),
            (
                "/api/v4/projects/group%2Fproject",
                "/api/v4/projects/group%2Fproject decoded=/api/v4/projects/group/project",
            ),
            ("/a/%2F..%2F..%2Fetc", "error: AboveRoot"),
            ("a/b", "error: NotOriginForm"),
            ("*", "error: NotOriginForm"),
            ("http://a/", "error: NotOriginForm"),
        ];
        for (raw, want) in cases {
            assert_eq!(show(raw, &KEEP), *want, "{raw:?}");
        }
    }

    #[test]
    fn escaped_slash_choices_and_slash_merging() {
        let reject = PathSettings {
            escaped_slashes: EscapedSlashes::Reject,
            ..KEEP
        };
        let unescape = PathSettings {
            escaped_slashes: EscapedSlashes::Unescape,
            ..KEEP
        };
        let unmerged = PathSettings {
            merge_slashes: false,
            ..KEEP
        };
        let cases: &[(&str, &PathSettings, &str)] = &[
            ("/public/..%2Finternal", &reject, "error: EscapedSlash"),
            ("/a%5Cb", &reject, "error: EscapedSlash"),
            ("/a/b", &reject, "/a/b"),
            ("/public/..%2Finternal", &unescape, "/internal"),
            ("/a%5cb", &unescape, "/a/b"),
            ("/a%2F%2Fb", &unescape, "/a/b"),
            ("/a//b", &unmerged, "/a//b"),
            // Without merging, `..` removes the empty segment as RFC 3986 section 5.2.4 does.
            ("/a//../b", &unmerged, "/a/b"),
            ("/a//../b", &KEEP, "/b"),
        ];
        for (raw, settings, want) in cases {
            assert_eq!(show(raw, settings), *want, "{raw:?} {settings:?}");
        }
    }

    #[test]
    fn normal_paths_are_borrowed() {
        for raw in ["/", "/a/b/c", "/a.b/c..d/.e", "/a;b=c"] {
            let t = parse(raw, &KEEP).unwrap();
            assert!(t.unchanged(), "{raw}");
        }
        assert!(!parse("/a/../b", &KEEP).unwrap().unchanged());
    }
}
