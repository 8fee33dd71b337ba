//! `proxy-redirect-from`/`-to`, `proxy-cookie-domain` and `proxy-cookie-path`: the text the
//! upstream's `Location`/`Refresh` and `Set-Cookie` headers carry is rewritten as nginx's
//! `proxy_redirect`, `proxy_cookie_domain` and `proxy_cookie_path` (with literal strings) do.
//!
//! ```text
//!   Location, Refresh     starts with FROM (case-sensitive)          → TO + the rest
//!   Set-Cookie Domain=    equals FROM (case-insensitive, a leading . kept) → TO
//!   Set-Cookie Path=      starts with FROM (case-sensitive)          → TO + the rest
//! ```

/// The rewrites of one route, each `(from, to)`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UpstreamRewrite {
    pub redirect: Option<(String, String)>,
    pub cookie_domain: Option<(String, String)>,
    pub cookie_path: Option<(String, String)>,
}

impl UpstreamRewrite {
    pub fn is_empty(&self) -> bool {
        self.redirect.is_none() && self.cookie_domain.is_none() && self.cookie_path.is_none()
    }

    /// The new value of the response header `name` with `value`, when one of the rewrites
    /// changes it.
    pub fn rewrite(&self, name: &str, value: &[u8]) -> Option<Vec<u8>> {
        if name.eq_ignore_ascii_case("location") || name.eq_ignore_ascii_case("refresh") {
            let (from, to) = self.redirect.as_ref()?;
            return replace_in(value, name, from, to);
        }
        if !name.eq_ignore_ascii_case("set-cookie")
            || (self.cookie_domain.is_none() && self.cookie_path.is_none())
        {
            return None;
        }
        let text = std::str::from_utf8(value).ok()?;
        let mut changed = false;
        let parts: Vec<String> = text
            .split(';')
            .enumerate()
            .map(|(i, part)| {
                let rewritten = (i > 0).then(|| self.attribute(part)).flatten();
                changed |= rewritten.is_some();
                rewritten.unwrap_or_else(|| part.to_string())
            })
            .collect();
        changed.then(|| parts.join(";").into_bytes())
    }

    /// One `Set-Cookie` attribute (with its leading spaces), rewritten.
    fn attribute(&self, part: &str) -> Option<String> {
        let (key, value) = part.split_once('=')?;
        let attr = key.trim();
        if attr.eq_ignore_ascii_case("domain") {
            let (from, to) = self.cookie_domain.as_ref()?;
            let dot = usize::from(value.starts_with('.'));
            value[dot..]
                .eq_ignore_ascii_case(from)
                .then(|| format!("{key}={}{to}", &value[..dot]))
        } else if attr.eq_ignore_ascii_case("path") {
            let (from, to) = self.cookie_path.as_ref()?;
            value
                .strip_prefix(from.as_str())
                .map(|rest| format!("{key}={to}{rest}"))
        } else {
            None
        }
    }
}

/// `Location: FROM…` → `TO…`; `Refresh: N; url=FROM…` → `N; url=TO…`.
fn replace_in(value: &[u8], name: &str, from: &str, to: &str) -> Option<Vec<u8>> {
    let text = std::str::from_utf8(value).ok()?;
    if name.eq_ignore_ascii_case("location") {
        return text
            .strip_prefix(from)
            .map(|rest| format!("{to}{rest}").into_bytes());
    }
    let at = text.to_ascii_lowercase().find("url=")? + 4;
    text[at..]
        .strip_prefix(from)
        .map(|rest| format!("{}{to}{rest}", &text[..at]).into_bytes())
}

/// A `proxy-cookie-domain`/`-path` value: `off`, or `FROM TO` (two words, as nginx's
/// directive takes them). `Ok(None)` is off.
pub fn parse_pair(value: &str) -> Result<Option<(String, String)>, String> {
    let words: Vec<&str> = value.split_ascii_whitespace().collect();
    match words.as_slice() {
        ["off"] => Ok(None),
        [from, to] if literal(from) && literal(to) => Ok(Some((from.to_string(), to.to_string()))),
        _ => Err(format!(
            "{value:?} is not \"off\" or two literal words FROM TO (no $variables or regexes)"
        )),
    }
}

/// Text nginx would take literally, and that may go into a header.
pub fn literal(s: &str) -> bool {
    !s.is_empty()
        && !s.starts_with('~')
        && s.bytes()
            .all(|b| b.is_ascii_graphic() && b != b'$' && b != b';')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rewrite() -> UpstreamRewrite {
        UpstreamRewrite {
            redirect: Some((
                "http://internal:8080/".into(),
                "https://shop.example/".into(),
            )),
            cookie_domain: Some(("internal.local".into(), "shop.example".into())),
            cookie_path: Some(("/app".into(), "/shop".into())),
        }
    }

    #[test]
    fn headers_are_rewritten_as_nginx_does() {
        let r = rewrite();
        // (header, value, rewritten)
        let cases = [
            (
                "Location",
                "http://internal:8080/a?b=c",
                Some("https://shop.example/a?b=c"),
            ),
            ("location", "http://other/a", None),
            ("Location", "HTTP://internal:8080/a", None),
            (
                "Refresh",
                "5; url=http://internal:8080/x",
                Some("5; url=https://shop.example/x"),
            ),
            (
                "Set-Cookie",
                "a=1; Domain=internal.local; Path=/app/x",
                Some("a=1; Domain=shop.example; Path=/shop/x"),
            ),
            (
                "Set-Cookie",
                "a=1;domain=.INTERNAL.local",
                Some("a=1;domain=.shop.example"),
            ),
            (
                "Set-Cookie",
                "a=1; Domain=sub.internal.local; Path=/other",
                None,
            ),
            // The cookie's own value is never touched.
            ("Set-Cookie", "Path=/app; Secure", None),
            ("X-Other", "http://internal:8080/", None),
        ];
        for (name, value, want) in cases {
            let got = r.rewrite(name, value.as_bytes());
            assert_eq!(
                got.as_deref().map(|v| std::str::from_utf8(v).unwrap()),
                want,
                "{name}: {value}"
            );
        }
    }

    #[test]
    fn pairs() {
        assert_eq!(parse_pair("off"), Ok(None));
        assert_eq!(
            parse_pair(" a.local  b.example "),
            Ok(Some(("a.local".into(), "b.example".into())))
        );
        for bad in ["", "a", "a b c", "$host b", "~^a b", "a b;c"] {
            assert!(parse_pair(bad).is_err(), "{bad:?}");
        }
    }
}
