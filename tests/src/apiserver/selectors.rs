//! Label and field selectors: the `labelSelector` / `fieldSelector` query parameters.
//!
//! Grammar as in apimachinery `pkg/labels` and `pkg/fields`: label requirements are `k`, `!k`,
//! `k=v`, `k==v`, `k!=v`, `k in (a,b)`, `k notin (a,b)`, `k>1`, `k<1`, comma-separated; field
//! terms are `path=v`, `path==v`, `path!=v` with `\,` `\=` `\\` escapes.

use serde_json::Value;

use super::resource::ResourceDef;

#[derive(Debug, Clone, PartialEq, Eq)]
enum LabelOp {
    Exists,
    DoesNotExist,
    Equals(String),
    NotEquals(String),
    In(Vec<String>),
    NotIn(Vec<String>),
    GreaterThan(i64),
    LessThan(i64),
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct LabelRequirement {
    key: String,
    op: LabelOp,
}

/// A parsed `labelSelector`; the empty selector matches everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSelector(Vec<LabelRequirement>);

#[derive(Debug, Clone, PartialEq, Eq)]
struct FieldRequirement {
    path: &'static str,
    value: String,
    equal: bool,
}

/// A parsed `fieldSelector`, resolved against the resource's supported field labels.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldSelector(Vec<FieldRequirement>);

#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    Word(String),
    Not,
    Eq,
    DoubleEq,
    NotEq,
    Gt,
    Lt,
    Open,
    Close,
    Comma,
}

fn tokenize(input: &str) -> Result<Vec<Token>, String> {
    let mut tokens = Vec::new();
    let mut chars = input.chars().peekable();
    while let Some(&c) = chars.peek() {
        match c {
            ' ' | '\t' | '\n' => {
                chars.next();
            }
            '!' => {
                chars.next();
                if chars.peek() == Some(&'=') {
                    chars.next();
                    tokens.push(Token::NotEq);
                } else {
                    tokens.push(Token::Not);
                }
            }
            '=' => {
                chars.next();
                if chars.peek() == Some(&'=') {
                    chars.next();
                    tokens.push(Token::DoubleEq);
                } else {
                    tokens.push(Token::Eq);
                }
            }
            '>' | '<' | '(' | ')' | ',' => {
                chars.next();
                tokens.push(match c {
                    '>' => Token::Gt,
                    '<' => Token::Lt,
                    '(' => Token::Open,
                    ')' => Token::Close,
                    _ => Token::Comma,
                });
            }
            _ => {
                let mut word = String::new();
                while let Some(&c) = chars.peek() {
                    if " \t\n!=<>(),".contains(c) {
                        break;
                    }
                    word.push(c);
                    chars.next();
                }
                tokens.push(Token::Word(word));
            }
        }
    }
    Ok(tokens)
}

fn valid_label_key(key: &str) -> bool {
    let name = key.rsplit('/').next().unwrap_or_default();
    !name.is_empty()
        && name.len() <= 63
        && key.matches('/').count() <= 1
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c))
}

fn valid_label_value(value: &str) -> bool {
    value.len() <= 63
        && value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
}

struct Parser {
    tokens: Vec<Token>,
    pos: usize,
}

impl Parser {
    fn peek(&self) -> Option<&Token> {
        self.tokens.get(self.pos)
    }

    fn next(&mut self) -> Option<Token> {
        let token = self.tokens.get(self.pos).cloned();
        self.pos += 1;
        token
    }

    fn key(&mut self) -> Result<String, String> {
        match self.next() {
            Some(Token::Word(key)) if valid_label_key(&key) => Ok(key),
            Some(Token::Word(key)) => Err(format!("invalid label key {key:?}")),
            other => Err(format!("expected a label key, found {other:?}")),
        }
    }

    /// A value that may be empty (`a=` selects an empty value).
    fn value(&mut self) -> Result<String, String> {
        match self.peek() {
            Some(Token::Word(_)) => match self.next() {
                Some(Token::Word(value)) if valid_label_value(&value) => Ok(value),
                other => Err(format!("invalid label value {other:?}")),
            },
            None | Some(Token::Comma) | Some(Token::Close) => Ok(String::new()),
            other => Err(format!("expected a label value, found {other:?}")),
        }
    }

    fn set(&mut self) -> Result<Vec<String>, String> {
        if self.next() != Some(Token::Open) {
            return Err("expected '(' after in/notin".into());
        }
        let mut values = vec![self.value()?];
        loop {
            match self.next() {
                Some(Token::Comma) => values.push(self.value()?),
                Some(Token::Close) => return Ok(values),
                other => return Err(format!("expected ',' or ')', found {other:?}")),
            }
        }
    }

    fn number(&mut self) -> Result<i64, String> {
        match self.next() {
            Some(Token::Word(n)) => n.parse().map_err(|_| format!("{n:?} is not an integer")),
            other => Err(format!("expected an integer, found {other:?}")),
        }
    }

    fn requirement(&mut self) -> Result<LabelRequirement, String> {
        if self.peek() == Some(&Token::Not) {
            self.next();
            let key = self.key()?;
            return Ok(LabelRequirement {
                key,
                op: LabelOp::DoesNotExist,
            });
        }
        let key = self.key()?;
        let op = match self.peek().cloned() {
            None | Some(Token::Comma) => LabelOp::Exists,
            Some(Token::Eq) | Some(Token::DoubleEq) => {
                self.next();
                LabelOp::Equals(self.value()?)
            }
            Some(Token::NotEq) => {
                self.next();
                LabelOp::NotEquals(self.value()?)
            }
            Some(Token::Gt) => {
                self.next();
                LabelOp::GreaterThan(self.number()?)
            }
            Some(Token::Lt) => {
                self.next();
                LabelOp::LessThan(self.number()?)
            }
            Some(Token::Word(w)) if w == "in" => {
                self.next();
                LabelOp::In(self.set()?)
            }
            Some(Token::Word(w)) if w == "notin" => {
                self.next();
                LabelOp::NotIn(self.set()?)
            }
            Some(other) => return Err(format!("unexpected {other:?} after key {key:?}")),
        };
        Ok(LabelRequirement { key, op })
    }
}

impl LabelSelector {
    pub fn parse(input: &str) -> Result<Self, String> {
        let mut parser = Parser {
            tokens: tokenize(input)?,
            pos: 0,
        };
        let mut requirements = Vec::new();
        if parser.peek().is_none() {
            return Ok(Self(requirements));
        }
        loop {
            requirements.push(parser.requirement()?);
            match parser.next() {
                None => return Ok(Self(requirements)),
                Some(Token::Comma) => {}
                Some(other) => {
                    return Err(format!("unexpected {other:?} in label selector {input:?}"));
                }
            }
        }
    }

    pub fn matches(&self, object: &Value) -> bool {
        let labels = object.pointer("/metadata/labels");
        let label = |key: &str| labels.and_then(|l| l.get(key)).and_then(Value::as_str);
        self.0.iter().all(|r| match (&r.op, label(&r.key)) {
            (LabelOp::Exists, found) => found.is_some(),
            (LabelOp::DoesNotExist, found) => found.is_none(),
            (LabelOp::Equals(want), found) => found == Some(want.as_str()),
            (LabelOp::NotEquals(want), found) => found != Some(want.as_str()),
            (LabelOp::In(set), found) => found.is_some_and(|v| set.iter().any(|s| s == v)),
            (LabelOp::NotIn(set), found) => !found.is_some_and(|v| set.iter().any(|s| s == v)),
            (LabelOp::GreaterThan(n), found) => found
                .and_then(|v| v.parse::<i64>().ok())
                .is_some_and(|v| v > *n),
            (LabelOp::LessThan(n), found) => found
                .and_then(|v| v.parse::<i64>().ok())
                .is_some_and(|v| v < *n),
        })
    }
}

/// Splits on `sep` outside backslash escapes, keeping escapes in place.
fn split_unescaped(input: &str, sep: char) -> Vec<String> {
    let mut parts = vec![String::new()];
    let mut escaped = false;
    for c in input.chars() {
        if escaped {
            escaped = false;
        } else if c == '\\' {
            escaped = true;
        } else if c == sep {
            parts.push(String::new());
            continue;
        }
        if let Some(last) = parts.last_mut() {
            last.push(c);
        }
    }
    parts
}

fn unescape_field_value(value: &str) -> Result<String, String> {
    let mut out = String::new();
    let mut chars = value.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some(e @ ('\\' | ',' | '=')) => out.push(e),
                other => {
                    return Err(format!(
                        "invalid escape sequence \\{other:?} in field selector value"
                    ));
                }
            },
            ',' | '=' => return Err(format!("unescaped {c:?} in field selector value")),
            _ => out.push(c),
        }
    }
    Ok(out)
}

/// The string form kube-apiserver compares a field with; absent fields compare as "".
fn field_string(object: &Value, path: &str) -> String {
    let found = path.split('.').try_fold(object, |v, key| v.get(key));
    match found {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Bool(b)) => b.to_string(),
        Some(Value::Number(n)) => n.to_string(),
        _ => String::new(),
    }
}

impl FieldSelector {
    pub fn parse(input: &str, def: &ResourceDef) -> Result<Self, String> {
        let mut requirements = Vec::new();
        if input.trim().is_empty() {
            return Ok(Self(requirements));
        }
        for term in split_unescaped(input, ',') {
            let (label, value, equal) = if let Some((l, v)) = term.split_once("!=") {
                (l, v, false)
            } else if let Some((l, v)) = term.split_once("==") {
                (l, v, true)
            } else if let Some((l, v)) = term.split_once('=') {
                (l, v, true)
            } else {
                return Err(format!(
                    "invalid selector: '{input}'; can't understand '{term}'"
                ));
            };
            let label = label.trim();
            let path = def
                .field_path(label)
                .ok_or_else(|| format!("field label not supported: {label}"))?;
            requirements.push(FieldRequirement {
                path,
                value: unescape_field_value(value)?,
                equal,
            });
        }
        Ok(Self(requirements))
    }

    pub fn matches(&self, object: &Value) -> bool {
        self.0
            .iter()
            .all(|r| (field_string(object, r.path) == r.value) == r.equal)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn label_selectors() {
        let obj =
            json!({"metadata": {"labels": {"app": "web", "tier": "front", "n": "5", "empty": ""}}});
        let cases = [
            ("", true),
            ("app", true),
            ("!app", false),
            ("!missing", true),
            ("app=web", true),
            ("app==web", true),
            ("app = web", true),
            ("app=api", false),
            ("app!=api", true),
            ("missing!=api", true),
            ("app=web,tier=front", true),
            ("app=web,tier=back", false),
            ("app in (api, web)", true),
            ("app in (api)", false),
            ("missing in (api)", false),
            ("app notin (api)", true),
            ("app notin (web,api)", false),
            ("missing notin (api)", true),
            ("n>4", true),
            ("n<5", false),
            ("app>4", false),
            ("empty=", true),
            ("empty in (,x)", true),
            ("app in (web),tier notin (back),!missing", true),
            ("example.com/role", false),
        ];
        for (selector, want) in cases {
            let parsed =
                LabelSelector::parse(selector).unwrap_or_else(|e| panic!("{selector:?}: {e}"));
            assert_eq!(parsed.matches(&obj), want, "{selector:?}");
        }
        assert!(LabelSelector::parse("").unwrap().matches(&json!({})));
    }

    #[test]
    fn bad_label_selectors_are_errors() {
        for selector in [
            "app in web",
            "app in (web",
            "=web",
            "app=(web)",
            "a,",
            "app >",
            "app > x",
            "a/b/c=d",
        ] {
            assert!(
                LabelSelector::parse(selector).is_err(),
                "{selector:?} parsed"
            );
        }
    }

    #[test]
    fn field_selectors() {
        let secrets = crate::apiserver::resource("", "v1", "secrets").unwrap();
        let obj = json!({"metadata": {"name": "tls,1", "namespace": "prod"}, "type": "kubernetes.io/tls"});
        let cases = [
            ("", true),
            ("type=kubernetes.io/tls", true),
            ("type==kubernetes.io/tls", true),
            ("type!=kubernetes.io/tls", false),
            ("type=Opaque", false),
            ("metadata.namespace=prod,type=kubernetes.io/tls", true),
            ("metadata.namespace=prod,type=Opaque", false),
            ("metadata.name=tls\\,1", true),
            ("metadata.name!=other", true),
        ];
        for (selector, want) in cases {
            let parsed = FieldSelector::parse(selector, secrets)
                .unwrap_or_else(|e| panic!("{selector:?}: {e}"));
            assert_eq!(parsed.matches(&obj), want, "{selector:?}");
        }
    }

    #[test]
    fn unsupported_field_labels_are_rejected_like_the_real_server() {
        let secrets = crate::apiserver::resource("", "v1", "secrets").unwrap();
        let nodes = crate::apiserver::resource("", "v1", "nodes").unwrap();
        let err = FieldSelector::parse("spec.foo=bar", secrets).unwrap_err();
        assert_eq!(err, "field label not supported: spec.foo");
        assert!(FieldSelector::parse("metadata.namespace=x", nodes).is_err());
        assert!(FieldSelector::parse("type", secrets).is_err());
        assert!(FieldSelector::parse("type=a=b", secrets).is_err());
    }

    #[test]
    fn event_field_selectors_use_their_aliases() {
        let events = crate::apiserver::resource("", "v1", "events").unwrap();
        let event = json!({"involvedObject": {"kind": "Ingress", "name": "web", "uid": "u1"}, "source": {"component": "ingress"}});
        let selector = FieldSelector::parse(
            "involvedObject.kind=Ingress,involvedObject.name=web,involvedObject.uid=u1,source=ingress",
            events,
        )
        .unwrap();
        assert!(selector.matches(&event));
    }
}
