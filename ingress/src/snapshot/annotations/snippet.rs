//! `configuration-snippet` and `server-snippet`, never executed: nginx configuration is no
//! promise of this project. Most real snippets only set headers, so a strict allow-listed
//! subset is read into typed header actions, and only with `--allow-snippet-annotations`
//! (ingress-nginx's `allow-snippet-annotations`, off by default since v1.9):
//!
//! ```text
//!   add_header NAME VALUE [always];       response: appended (2xx/3xx nginx codes, or always)
//!   more_set_headers "Name: value" ...;   response: replaces the upstream's ("Name:" clears)
//!   more_clear_headers Name ...;          response: removed
//!   proxy_set_header NAME VALUE;          request: replaces the client's ("" removes)
//! ```
//!
//! Values are literals, tokenised as nginx does (quotes, backslash escapes, `#` comments); a
//! `$variable`, an option (`-s`, `-t`), a wildcard, a block or any other directive rejects the
//! whole snippet, with the line and directive that did, and nothing of it is applied.

use std::fmt;

use http::{HeaderName, HeaderValue};

/// The header actions of one snippet, or of an Ingress's two snippets merged.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HeaderActions {
    pub request: RequestEdits,
    pub response: ResponseEdits,
}

/// `proxy_set_header`: per name, the value sent upstream instead of the client's (`None`:
/// not sent, nginx's empty value). The last directive for a name wins.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RequestEdits {
    pub set: Vec<(HeaderName, Option<HeaderValue>)>,
}

/// What a snippet does to the response.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ResponseEdits {
    /// `more_set_headers` / `more_clear_headers`: per name, the upstream's values are removed
    /// and this one set (`None`: cleared). In directive order, the last for a name wins.
    pub replace: Vec<(HeaderName, Option<HeaderValue>)>,
    /// `add_header`: appended to the response.
    pub add: Vec<AddHeader>,
}

/// One `add_header`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AddHeader {
    pub name: HeaderName,
    pub value: HeaderValue,
    /// `always`: on every status; otherwise only on nginx's list (see [`ResponseEdits::adds`]).
    pub always: bool,
}

impl RequestEdits {
    pub fn is_empty(&self) -> bool {
        self.set.is_empty()
    }

    /// Whether the client's header `name` is replaced (or removed).
    pub fn replaces(&self, name: &str) -> bool {
        self.set
            .iter()
            .any(|(n, _)| n.as_str().eq_ignore_ascii_case(name))
    }
}

impl ResponseEdits {
    pub fn is_empty(&self) -> bool {
        self.replace.is_empty() && self.add.is_empty()
    }

    /// Whether the upstream's header `name` is removed (replaced or cleared).
    pub fn replaces(&self, name: &str) -> bool {
        self.replace
            .iter()
            .any(|(n, _)| n.as_str().eq_ignore_ascii_case(name))
    }

    /// The headers to write on a response with `status`: the replacements, then the
    /// `add_header`s nginx adds on it (200, 201, 204, 206, 301, 302, 303, 304, 307, 308,
    /// unless `always`).
    pub fn emitted(&self, status: u16) -> impl Iterator<Item = (&HeaderName, &HeaderValue)> {
        let listed = matches!(
            status,
            200 | 201 | 204 | 206 | 301 | 302 | 303 | 304 | 307 | 308
        );
        self.replace
            .iter()
            .filter_map(|(n, v)| v.as_ref().map(|v| (n, v)))
            .chain(
                self.add
                    .iter()
                    .filter(move |a| a.always || listed)
                    .map(|a| (&a.name, &a.value)),
            )
    }

    /// Applies these edits to a response header map with `status` (the HTTP/2 path).
    pub fn apply(&self, status: u16, headers: &mut http::HeaderMap) {
        for (name, _) in &self.replace {
            headers.remove(name);
        }
        for (name, value) in self.emitted(status) {
            headers.append(name.clone(), value.clone());
        }
    }
}

/// Which snippet annotation: they differ in what nginx lets them inherit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `configuration-snippet`: the location block.
    Location,
    /// `server-snippet`: the server block.
    Server,
}

/// Why a snippet is not applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {directive}: {reason}")]
pub struct SnippetError {
    pub line: usize,
    /// The directive's name (or the token where one was expected).
    pub directive: String,
    pub reason: Reason,
}

/// What in a snippet is outside the allow-listed subset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reason {
    /// Not one of the four header directives.
    NotAllowed,
    /// A `{` block.
    Block,
    /// A `$variable`: only literal values are read.
    Variable,
    /// The wrong number of arguments, or a malformed one.
    Arguments(&'static str),
    /// An option of the headers-more module (`-s`, `-t`) or a wildcard name.
    Option(String),
    /// A header name that is not an HTTP token, or a value with control characters.
    Header(String),
    /// A header the proxy owns (framing, hop-by-hop, forwarding, Host).
    Reserved(String),
    /// A quote left open, or a directive without its `;`.
    Unterminated,
    /// `proxy_set_header` in a `server-snippet`: ingress-nginx's locations set their own, so
    /// a server-level one never reaches the upstream there either.
    NotInherited,
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::NotAllowed => f.write_str(
                "not one of add_header, more_set_headers, more_clear_headers, proxy_set_header",
            ),
            Reason::Block => f.write_str("blocks are not read"),
            Reason::Variable => f.write_str("$variables are not read; only literal values"),
            Reason::Arguments(what) => f.write_str(what),
            Reason::Option(o) => write!(f, "{o:?}: options and wildcards are not supported"),
            Reason::Header(h) => write!(f, "{h:?} is not a valid header"),
            Reason::Reserved(h) => write!(f, "{h:?} is set by the proxy itself"),
            Reason::Unterminated => f.write_str("unterminated (a quote or the final ';')"),
            Reason::NotInherited => f.write_str(
                "in a server-snippet it never reaches the upstream (ingress-nginx's locations set their own proxy headers)",
            ),
        }
    }
}

/// One token and the line it starts on.
struct Token {
    text: String,
    line: usize,
    /// Written in quotes (so `;`/`{` inside are literal).
    quoted: bool,
}

/// Splits `text` into directives as nginx's `ngx_conf_read_token` does: whitespace separates,
/// `;` ends a directive, `#` starts a comment, `"…"`/`'…'` quote, `\` escapes.
fn directives(text: &str) -> Result<Vec<Vec<Token>>, SnippetError> {
    let mut out = Vec::new();
    let mut current: Vec<Token> = Vec::new();
    let mut chars = text.chars().peekable();
    let mut line = 1;
    let err = |line, directive: &[Token], reason| SnippetError {
        line,
        directive: directive
            .first()
            .map_or_else(String::new, |t| t.text.clone()),
        reason,
    };
    while let Some(&c) = chars.peek() {
        match c {
            '\n' => {
                line += 1;
                chars.next();
            }
            c if c.is_whitespace() => {
                chars.next();
            }
            '#' => {
                while chars.peek().is_some_and(|&c| c != '\n') {
                    chars.next();
                }
            }
            ';' => {
                chars.next();
                if current.is_empty() {
                    return Err(err(line, &current, Reason::Arguments("an empty directive")));
                }
                out.push(std::mem::take(&mut current));
            }
            '{' | '}' => {
                let directive = if current.is_empty() {
                    vec![Token {
                        text: c.to_string(),
                        line,
                        quoted: false,
                    }]
                } else {
                    std::mem::take(&mut current)
                };
                return Err(err(line, &directive, Reason::Block));
            }
            '"' | '\'' => {
                let quote = c;
                chars.next();
                let start = line;
                let mut text = String::new();
                loop {
                    match chars.next() {
                        None => return Err(err(start, &current, Reason::Unterminated)),
                        Some('\\') => match chars.next() {
                            Some('n') => text.push('\n'),
                            Some('t') => text.push('\t'),
                            Some('r') => text.push('\r'),
                            Some(c @ ('"' | '\'' | '\\')) => text.push(c),
                            Some(c) => {
                                text.push('\\');
                                text.push(c);
                            }
                            None => return Err(err(start, &current, Reason::Unterminated)),
                        },
                        Some(c) if c == quote => break,
                        Some(c) => {
                            if c == '\n' {
                                line += 1;
                            }
                            text.push(c);
                        }
                    }
                }
                current.push(Token {
                    text,
                    line: start,
                    quoted: true,
                });
            }
            _ => {
                let mut text = String::new();
                while let Some(&c) = chars.peek() {
                    if c.is_whitespace() || matches!(c, ';' | '{' | '}' | '"' | '\'') {
                        break;
                    }
                    chars.next();
                    if c == '\\' {
                        match chars.next() {
                            Some('n') => text.push('\n'),
                            Some('t') => text.push('\t'),
                            Some('r') => text.push('\r'),
                            Some(c @ ('"' | '\'' | '\\')) => text.push(c),
                            Some(c) => {
                                text.push('\\');
                                text.push(c);
                            }
                            None => text.push('\\'),
                        }
                    } else {
                        text.push(c);
                    }
                }
                current.push(Token {
                    text,
                    line,
                    quoted: false,
                });
            }
        }
    }
    if !current.is_empty() {
        return Err(err(current[0].line, &current, Reason::Unterminated));
    }
    Ok(out)
}

/// Reads a snippet of `kind` into header actions, or says which line is outside the subset.
pub fn parse(text: &str, kind: Kind) -> Result<HeaderActions, SnippetError> {
    let mut actions = HeaderActions::default();
    for directive in directives(text)? {
        // `directives` never yields an empty directive; skipping one keeps this total.
        let Some((name, args)) = directive.split_first() else {
            continue;
        };
        let fail = |reason| SnippetError {
            line: name.line,
            directive: name.text.clone(),
            reason,
        };
        if name.quoted {
            return Err(fail(Reason::NotAllowed));
        }
        if args.iter().any(|a| a.text.contains('$')) {
            return Err(fail(Reason::Variable));
        }
        match name.text.as_str() {
            "add_header" => {
                let always = match args {
                    [_, _] => false,
                    [_, _, a] if a.text == "always" => true,
                    _ => {
                        return Err(fail(Reason::Arguments(
                            "add_header takes a name, a value and an optional 'always'",
                        )));
                    }
                };
                let name = response_name(&args[0].text).map_err(fail)?;
                let value = value(&args[1].text).map_err(fail)?;
                actions.response.add.push(AddHeader {
                    name,
                    value,
                    always,
                });
            }
            "more_set_headers" | "more_clear_headers" => {
                if args.is_empty() {
                    return Err(fail(Reason::Arguments("at least one header")));
                }
                for arg in args {
                    if arg.text.starts_with('-') {
                        return Err(fail(Reason::Option(arg.text.clone())));
                    }
                    let (header, set) = if name.text == "more_set_headers" {
                        let Some((n, v)) = arg.text.split_once(':') else {
                            return Err(fail(Reason::Arguments(
                                "more_set_headers takes \"Name: value\" arguments",
                            )));
                        };
                        let v = v.trim_matches([' ', '\t']);
                        (n.trim(), (!v.is_empty()).then_some(v))
                    } else {
                        (arg.text.as_str(), None)
                    };
                    if header.contains('*') {
                        return Err(fail(Reason::Option(header.to_string())));
                    }
                    let header = response_name(header).map_err(fail)?;
                    let set = set.map(value).transpose().map_err(fail)?;
                    actions.response.replace.retain(|(n, _)| *n != header);
                    actions.response.replace.push((header, set));
                }
            }
            "proxy_set_header" => {
                let [n, v] = args else {
                    return Err(fail(Reason::Arguments(
                        "proxy_set_header takes a name and a value",
                    )));
                };
                if kind == Kind::Server {
                    return Err(fail(Reason::NotInherited));
                }
                let header = request_name(&n.text).map_err(fail)?;
                let set = (!v.text.is_empty())
                    .then(|| value(&v.text))
                    .transpose()
                    .map_err(fail)?;
                actions.request.set.retain(|(n, _)| *n != header);
                actions.request.set.push((header, set));
            }
            _ => return Err(fail(Reason::NotAllowed)),
        }
    }
    Ok(actions)
}

/// An Ingress's `server-snippet` and `configuration-snippet` together, as nginx inherits
/// them: a location's `add_header`s (or headers-more directives) replace the server's, which
/// apply only when the location has none of that kind.
pub fn merge(server: Option<HeaderActions>, location: Option<HeaderActions>) -> HeaderActions {
    let server = server.unwrap_or_default();
    let location = location.unwrap_or_default();
    HeaderActions {
        request: location.request,
        response: ResponseEdits {
            replace: if location.response.replace.is_empty() {
                server.response.replace
            } else {
                location.response.replace
            },
            add: if location.response.add.is_empty() {
                server.response.add
            } else {
                location.response.add
            },
        },
    }
}

/// Headers that frame or route a response, which a snippet may not touch.
pub(super) fn response_name(name: &str) -> Result<HeaderName, Reason> {
    let header =
        HeaderName::from_bytes(name.as_bytes()).map_err(|_| Reason::Header(name.into()))?;
    match ingress_wire::header::kind(header.as_str()) {
        ingress_wire::header::Kind::ContentLength
        | ingress_wire::header::Kind::TransferEncoding
        | ingress_wire::header::Kind::Connection
        | ingress_wire::header::Kind::Upgrade
        | ingress_wire::header::Kind::HopByHop => Err(Reason::Reserved(name.into())),
        _ => Ok(header),
    }
}

/// Request headers a snippet may set: none the proxy writes itself or that frame the request.
pub(super) fn request_name(name: &str) -> Result<HeaderName, Reason> {
    let header =
        HeaderName::from_bytes(name.as_bytes()).map_err(|_| Reason::Header(name.into()))?;
    match ingress_wire::header::kind(header.as_str()) {
        // `Forwarded`, `Proxy` and `X-Forwarded-Prefix` too: the proxy drops the client's as
        // spoofable, and sets the last itself for a rewrite.
        ingress_wire::header::Kind::Other => Ok(header),
        _ => Err(Reason::Reserved(name.into())),
    }
}

fn value(value: &str) -> Result<HeaderValue, Reason> {
    HeaderValue::from_str(value).map_err(|_| Reason::Header(value.into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(actions: &HeaderActions) -> String {
        let v = |v: &Option<HeaderValue>| {
            v.as_ref()
                .map_or("-".to_string(), |v| v.to_str().unwrap_or("?").to_string())
        };
        let mut out = Vec::new();
        for (n, value) in &actions.request.set {
            out.push(format!("req {n}={}", v(value)));
        }
        for (n, value) in &actions.response.replace {
            out.push(format!("set {n}={}", v(value)));
        }
        for a in &actions.response.add {
            let always = if a.always { " always" } else { "" };
            out.push(format!(
                "add {}={}{always}",
                a.name,
                a.value.to_str().unwrap_or("?")
            ));
        }
        out.join("; ")
    }

    #[test]
    fn real_world_snippets() {
        // (snippet, kind, the actions or the error)
        let cases: &[(&str, Kind, Result<&str, &str>)] = &[
            (
                "more_set_headers \"X-Frame-Options: DENY\";\nmore_set_headers \"X-Content-Type-Options: nosniff\";",
                Kind::Location,
                Ok("set x-frame-options=DENY; set x-content-type-options=nosniff"),
            ),
            (
                "add_header Cache-Control \"no-store, no-cache, must-revalidate\";",
                Kind::Location,
                Ok("add cache-control=no-store, no-cache, must-revalidate"),
            ),
            (
                "add_header Strict-Transport-Security 'max-age=31536000; includeSubDomains' always;",
                Kind::Location,
                Ok("add strict-transport-security=max-age=31536000; includeSubDomains always"),
            ),
            (
                "  # security headers\n  more_clear_headers Server;\n  more_clear_headers \"X-Powered-By\" X-AspNet-Version;\n",
                Kind::Server,
                Ok("set server=-; set x-powered-by=-; set x-aspnet-version=-"),
            ),
            (
                "proxy_set_header X-Tenant acme;\nproxy_set_header Authorization \"\";",
                Kind::Location,
                Ok("req x-tenant=acme; req authorization=-"),
            ),
            (
                "more_set_headers \"X-A: 1\" 'X-B:2' \"X-C:\";",
                Kind::Location,
                Ok("set x-a=1; set x-b=2; set x-c=-"),
            ),
            // The last directive for a name wins.
            (
                "more_set_headers \"X-A: 1\"; more_clear_headers X-A; more_set_headers \"X-A: 3\";",
                Kind::Location,
                Ok("set x-a=3"),
            ),
            (
                "add_header X-Escaped \"say \\\"hi\\\"\"; add_header X-Bare a\\ b;",
                Kind::Location,
                Ok("add x-escaped=say \"hi\"; add x-bare=a\\ b"),
            ),
            ("", Kind::Location, Ok("")),
            ("# nothing\n", Kind::Location, Ok("")),
            // Outside the subset: the whole snippet, with line and directive.
            (
                "more_set_headers \"X-A: 1\";\nproxy_set_header X-Real-IP $remote_addr;",
                Kind::Location,
                Err("line 2: proxy_set_header: $variables"),
            ),
            (
                "more_set_headers \"X-A: 1\";\n\nrewrite ^/old /new break;",
                Kind::Location,
                Err("line 3: rewrite: not one of"),
            ),
            (
                "location /admin { deny all; }",
                Kind::Server,
                Err("line 1: location: blocks"),
            ),
            (
                "if ($http_x_debug) { return 403; }",
                Kind::Location,
                Err("line 1: if: blocks"),
            ),
            (
                "more_set_headers -s 404 \"X-A: 1\";",
                Kind::Location,
                Err("line 1: more_set_headers: \"-s\""),
            ),
            (
                "more_clear_headers 'X-Hidden-*';",
                Kind::Location,
                Err("wildcards"),
            ),
            (
                "add_header X-A 1 sometimes;",
                Kind::Location,
                Err("line 1: add_header: add_header takes"),
            ),
            (
                "add_header X-A \"1\"",
                Kind::Location,
                Err("line 1: add_header: unterminated"),
            ),
            ("add_header X-A \"1;", Kind::Location, Err("unterminated")),
            (
                "proxy_set_header Host example.com;",
                Kind::Location,
                Err("\"Host\" is set by the proxy"),
            ),
            (
                "proxy_set_header X-Forwarded-Proto https;",
                Kind::Location,
                Err("set by the proxy"),
            ),
            (
                "proxy_set_header Proxy http://evil;",
                Kind::Location,
                Err("set by the proxy"),
            ),
            (
                "more_set_headers \"Content-Length: 0\";",
                Kind::Location,
                Err("set by the proxy"),
            ),
            (
                "add_header \"Bad Name\" x;",
                Kind::Location,
                Err("is not a valid header"),
            ),
            (
                "more_set_headers \"X-A\";",
                Kind::Location,
                Err("\"Name: value\""),
            ),
            (
                "proxy_set_header X-A b;",
                Kind::Server,
                Err("never reaches the upstream"),
            ),
            (
                "lua_need_request_body on;",
                Kind::Location,
                Err("lua_need_request_body"),
            ),
            (";", Kind::Location, Err("empty directive")),
        ];
        for (snippet, kind, want) in cases {
            match (parse(snippet, *kind), want) {
                (Ok(actions), Ok(want)) => assert_eq!(render(&actions), *want, "{snippet}"),
                (Err(err), Err(want)) => {
                    let message = err.to_string();
                    assert!(message.contains(want), "{snippet}: {message}");
                }
                (got, _) => panic!("{snippet}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn add_header_follows_nginxs_status_list_unless_always() {
        let actions = parse(
            "add_header X-A a; add_header X-B b always; more_set_headers 'X-C: c';",
            Kind::Location,
        )
        .expect("valid");
        let names = |status| {
            actions
                .response
                .emitted(status)
                .map(|(n, _)| n.as_str().to_string())
                .collect::<Vec<_>>()
                .join(",")
        };
        assert_eq!(names(200), "x-c,x-a,x-b");
        assert_eq!(names(308), "x-c,x-a,x-b");
        assert_eq!(names(404), "x-c,x-b");
        assert_eq!(names(502), "x-c,x-b");
        let mut headers = http::HeaderMap::new();
        headers.insert("x-c", HeaderValue::from_static("upstream"));
        headers.insert("x-a", HeaderValue::from_static("upstream"));
        actions.response.apply(200, &mut headers);
        let all = |n: &str| {
            headers
                .get_all(n)
                .iter()
                .map(|v| v.to_str().unwrap().to_string())
                .collect::<Vec<_>>()
        };
        assert_eq!(all("x-c"), ["c"]);
        assert_eq!(all("x-a"), ["upstream", "a"]);
        assert_eq!(all("x-b"), ["b"]);
    }

    #[test]
    fn a_locations_header_directives_replace_the_servers() {
        let server = parse("add_header X-S s; more_set_headers 'X-M: s';", Kind::Server).ok();
        let only_add = parse("add_header X-L l;", Kind::Location).ok();
        assert_eq!(
            render(&merge(server.clone(), only_add)),
            "set x-m=s; add x-l=l"
        );
        assert_eq!(render(&merge(server.clone(), None)), "set x-m=s; add x-s=s");
        let only_more = parse(
            "more_set_headers 'X-M: l'; proxy_set_header X-R r;",
            Kind::Location,
        )
        .ok();
        assert_eq!(
            render(&merge(server, only_more)),
            "req x-r=r; set x-m=l; add x-s=s"
        );
    }
}
