//! `canary` and its rules, as ingress-nginx's `balancer.lua` applies them to each request.
//!
//! ```text
//!   canary-by-header H present?
//!     canary-by-header-value V set:    H == V → canary        else fall through
//!     else canary-by-header-pattern P: P matches H → canary   no match → fall through
//!                                      P did not compile → main (and no fall through)
//!     else: "always" → canary, "never" → main, other → fall through
//!   canary-by-cookie C present: "always" → canary, "never" → main, other → fall through
//!   canary-weight W of canary-weight-total T (T below 100 counts as 100): a roll in 1..=T ≤ W
//! ```

use std::collections::BTreeMap;

use regex::Regex;

use super::lookup;

/// What a canary Ingress asks for.
#[derive(Clone, Debug)]
pub struct Rules {
    /// `canary-by-header`, lower-case.
    pub header: Option<String>,
    pub header_match: HeaderMatch,
    /// `canary-by-cookie`.
    pub cookie: Option<String>,
    /// `canary-weight`.
    pub weight: u32,
    /// `canary-weight-total`, at least 100 (ingress-nginx reads less as 100).
    pub weight_total: u32,
}

/// How the `canary-by-header` value is judged.
#[derive(Clone, Debug)]
pub enum HeaderMatch {
    /// `always` and `never`.
    AlwaysNever,
    /// `canary-by-header-value`: exactly this.
    Value(String),
    /// `canary-by-header-pattern`: the regex matches somewhere in it.
    Pattern(Regex),
    /// A pattern that did not compile: ingress-nginx's match errors, and the request goes to
    /// the main backend.
    Broken,
}

impl PartialEq for Rules {
    fn eq(&self, other: &Self) -> bool {
        let matcher = |m: &HeaderMatch| match m {
            HeaderMatch::AlwaysNever => "a".to_string(),
            HeaderMatch::Value(v) => format!("v{v}"),
            HeaderMatch::Pattern(p) => format!("p{}", p.as_str()),
            HeaderMatch::Broken => "b".to_string(),
        };
        self.header == other.header
            && matcher(&self.header_match) == matcher(&other.header_match)
            && self.cookie == other.cookie
            && self.weight == other.weight
            && self.weight_total == other.weight_total
    }
}

impl Eq for Rules {}

impl Rules {
    /// Whether a request goes to the canary: `header` and `cookie` are the request's values of
    /// the named header and cookie, `roll` returns a uniform number in `1..=total`.
    pub fn choose(
        &self,
        header: Option<&[u8]>,
        cookie: Option<&[u8]>,
        roll: impl FnOnce(u32) -> u32,
    ) -> bool {
        if let (Some(_), Some(value)) = (&self.header, header) {
            match &self.header_match {
                HeaderMatch::Value(want) if value == want.as_bytes() => return true,
                HeaderMatch::Value(_) => {}
                HeaderMatch::Pattern(pattern) => {
                    if std::str::from_utf8(value).is_ok_and(|v| pattern.is_match(v)) {
                        return true;
                    }
                }
                HeaderMatch::Broken => return false,
                HeaderMatch::AlwaysNever => match value {
                    b"always" => return true,
                    b"never" => return false,
                    _ => {}
                },
            }
        }
        if let (Some(_), Some(value)) = (&self.cookie, cookie) {
            match value {
                b"always" => return true,
                b"never" => return false,
                _ => {}
            }
        }
        self.weight > 0 && roll(self.weight_total) <= self.weight
    }
}

/// Header and cookie names: RFC 9110 tokens.
fn token(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// The canary rules of an Ingress, `None` when it is not a canary. Problems are pushed to
/// `errors`; a canary-* annotation without `canary: "true"` leaves the Ingress a main one, as
/// in ingress-nginx.
pub(super) fn parse(
    annotations: &BTreeMap<String, String>,
    enabled: bool,
    errors: &mut Vec<String>,
) -> Option<Rules> {
    let names = [
        "canary-by-header",
        "canary-by-header-value",
        "canary-by-header-pattern",
        "canary-by-cookie",
        "canary-weight",
        "canary-weight-total",
    ];
    if !enabled {
        if let Some((key, _)) = names.iter().find_map(|n| lookup(annotations, n)) {
            errors.push(format!(
                "{key} is set but canary is not \"true\": this Ingress is not a canary, and serves its paths as a main Ingress (as in ingress-nginx)"
            ));
        }
        return None;
    }
    let mut rules = Rules {
        header: None,
        header_match: HeaderMatch::AlwaysNever,
        cookie: None,
        weight: 0,
        weight_total: 100,
    };
    let mut name_of = |name: &str| -> Option<String> {
        let (key, value) = lookup(annotations, name)?;
        let value = value.trim();
        if token(value) {
            Some(value.to_string())
        } else {
            errors.push(format!("{key}: {value:?} is not a header or cookie name"));
            None
        }
    };
    rules.header = name_of("canary-by-header").map(|h| h.to_ascii_lowercase());
    rules.cookie = name_of("canary-by-cookie");
    if let Some((_, value)) = lookup(annotations, "canary-by-header-value") {
        rules.header_match = HeaderMatch::Value(value.to_string());
    } else if let Some((key, value)) = lookup(annotations, "canary-by-header-pattern") {
        rules.header_match = match regex::RegexBuilder::new(value)
            .size_limit(crate::snapshot::path::REGEX_SIZE_LIMIT)
            .build()
        {
            Ok(pattern) => HeaderMatch::Pattern(pattern),
            Err(err) => {
                errors.push(format!(
                    "{key}: {value:?} is not a regular expression ({err}); a request with the header goes to the main backend"
                ));
                HeaderMatch::Broken
            }
        };
    }
    if let Some((key, value)) = lookup(annotations, "canary-weight-total") {
        match value.trim().parse::<u32>() {
            Ok(total) if total >= 1 => rules.weight_total = total.max(100),
            _ => errors.push(format!(
                "{key}: {value:?} is not a positive whole number; 100 is used"
            )),
        }
    }
    if let Some((key, value)) = lookup(annotations, "canary-weight") {
        match value.trim().parse::<u32>() {
            Ok(weight) if weight <= rules.weight_total => rules.weight = weight,
            _ => errors.push(format!(
                "{key}: {value:?} is not a whole number in 0..={}; the weight is 0",
                rules.weight_total
            )),
        }
    }
    Some(rules)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(pairs: &[(&str, &str)]) -> (Option<Rules>, usize) {
        let map: BTreeMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (format!("nginx.ingress.kubernetes.io/{k}"), v.to_string()))
            .collect();
        let enabled = map
            .get("nginx.ingress.kubernetes.io/canary")
            .is_some_and(|v| v == "true");
        let mut errors = Vec::new();
        let rules = parse(&map, enabled, &mut errors);
        (rules, errors.len())
    }

    /// The request-time precedence, from ingress-nginx's balancer.lua and its e2e tests.
    #[test]
    fn header_then_cookie_then_weight() {
        let header = ("canary-by-header", "CanaryByHeader");
        let cookie = ("canary-by-cookie", "CanaryByCookie");
        let on = ("canary", "true");
        // (annotations, header value, cookie value, roll, to the canary)
        type Case<'a> = (
            Vec<(&'a str, &'a str)>,
            Option<&'a str>,
            Option<&'a str>,
            u32,
            bool,
        );
        let cases: Vec<Case> = vec![
            (vec![on, header], Some("always"), None, 100, true),
            (vec![on, header], Some("never"), None, 1, false),
            (vec![on, header], Some("other"), None, 1, false),
            (vec![on, header], None, None, 1, false),
            // never stops before the weight; another value falls through to it.
            (
                vec![on, header, ("canary-weight", "100")],
                Some("never"),
                None,
                1,
                false,
            ),
            (
                vec![on, header, ("canary-weight", "100")],
                Some("badvalue"),
                None,
                1,
                true,
            ),
            (
                vec![on, header, ("canary-by-header-value", "DoCanary")],
                Some("DoCanary"),
                None,
                1,
                true,
            ),
            (
                vec![on, header, ("canary-by-header-value", "DoCanary")],
                Some("always"),
                None,
                1,
                false,
            ),
            (
                vec![on, header, ("canary-by-header-value", "DoCanary")],
                Some("docanary"),
                None,
                1,
                false,
            ),
            (
                vec![on, header, ("canary-by-header-pattern", "^Do[A-Z][a-z]+y$")],
                Some("DoCanary"),
                None,
                1,
                true,
            ),
            (
                vec![on, header, ("canary-by-header-pattern", "^Do[A-Z][a-z]+y$")],
                Some("Docanary"),
                None,
                1,
                false,
            ),
            // The value wins over the pattern.
            (
                vec![
                    on,
                    header,
                    ("canary-by-header-value", "DoCanary"),
                    ("canary-by-header-pattern", "^Do[A-Z][a-z]+y$"),
                ],
                Some("DoCananry"),
                None,
                1,
                false,
            ),
            // A broken pattern sends a request with the header to the main backend, even with
            // the cookie set to always.
            (
                vec![
                    on,
                    header,
                    cookie,
                    ("canary-by-header-pattern", "[][**da?$&*"),
                ],
                Some("DoCanary"),
                Some("always"),
                1,
                false,
            ),
            (
                vec![
                    on,
                    header,
                    cookie,
                    ("canary-by-header-pattern", "[][**da?$&*"),
                ],
                None,
                Some("always"),
                1,
                true,
            ),
            // The header before the cookie.
            (
                vec![on, header, cookie],
                Some("never"),
                Some("always"),
                1,
                false,
            ),
            (
                vec![on, header, cookie],
                Some("always"),
                Some("never"),
                1,
                true,
            ),
            (vec![on, header, cookie], Some("x"), Some("always"), 1, true),
            (vec![on, cookie], None, Some("never"), 1, false),
            (
                vec![on, cookie, ("canary-weight", "100")],
                None,
                Some("never"),
                1,
                false,
            ),
            (
                vec![on, cookie, ("canary-weight", "100")],
                None,
                Some("x"),
                100,
                true,
            ),
            // Weight: a roll in 1..=total at most the weight.
            (vec![on, ("canary-weight", "0")], None, None, 1, false),
            (vec![on, ("canary-weight", "50")], None, None, 50, true),
            (vec![on, ("canary-weight", "50")], None, None, 51, false),
            (
                vec![on, ("canary-weight", "100"), ("canary-weight-total", "200")],
                None,
                None,
                100,
                true,
            ),
            (
                vec![on, ("canary-weight", "100"), ("canary-weight-total", "200")],
                None,
                None,
                101,
                false,
            ),
        ];
        for (pairs, h, c, roll, want) in cases {
            let (rules, _) = rules(&pairs);
            let rules = rules.expect("a canary");
            let got = rules.choose(h.map(str::as_bytes), c.map(str::as_bytes), |total| {
                assert!(roll <= total, "{pairs:?}: roll {roll} of {total}");
                roll
            });
            assert_eq!(got, want, "{pairs:?} header {h:?} cookie {c:?} roll {roll}");
        }
    }

    #[test]
    fn parsing_and_its_problems() {
        // (annotations, a canary?, weight, total, errors)
        let cases: Vec<(Vec<(&str, &str)>, bool, u32, u32, usize)> = vec![
            (vec![], false, 0, 0, 0),
            (vec![("canary", "false")], false, 0, 0, 0),
            (vec![("canary", "true")], true, 0, 100, 0),
            (vec![("canary-weight", "10")], false, 0, 0, 1),
            (
                vec![("canary", "true"), ("canary-weight", "10")],
                true,
                10,
                100,
                0,
            ),
            (
                vec![("canary", "true"), ("canary-weight", "101")],
                true,
                0,
                100,
                1,
            ),
            (
                vec![("canary", "true"), ("canary-weight", "-1")],
                true,
                0,
                100,
                1,
            ),
            (
                vec![
                    ("canary", "true"),
                    ("canary-weight", "150"),
                    ("canary-weight-total", "200"),
                ],
                true,
                150,
                200,
                0,
            ),
            (
                vec![
                    ("canary", "true"),
                    ("canary-weight", "5"),
                    ("canary-weight-total", "10"),
                ],
                true,
                5,
                100,
                0,
            ),
            (
                vec![("canary", "true"), ("canary-weight-total", "0")],
                true,
                0,
                100,
                1,
            ),
            (
                vec![("canary", "true"), ("canary-by-header", "Bad Header")],
                true,
                0,
                100,
                1,
            ),
            (
                vec![("canary", "true"), ("canary-by-cookie", "a;b")],
                true,
                0,
                100,
                1,
            ),
            (
                vec![("canary", "true"), ("canary-by-header-pattern", "(")],
                true,
                0,
                100,
                1,
            ),
        ];
        for (pairs, canary, weight, total, errors) in cases {
            let (got, errs) = rules(&pairs);
            assert_eq!(got.is_some(), canary, "{pairs:?}");
            if let Some(rules) = got {
                assert_eq!(
                    (rules.weight, rules.weight_total),
                    (weight, total),
                    "{pairs:?}"
                );
            }
            assert_eq!(errs, errors, "{pairs:?}");
        }
    }
}
