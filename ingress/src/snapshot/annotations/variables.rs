//! Values with nginx variables (`$host`, `${http_x_user}`), as `auth-url`, its companions and
//! the ConfigMaps of headers write them: parsed once in the snapshot, expanded per request
//! by the proxy with that request's values.

/// A value with nginx variables (`$host`, `${host}`), expanded per request by
/// [`Template::expand`] with the request's values.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Template {
    parts: Vec<Part>,
    text: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Part {
    Literal(String),
    Var(Var),
}

/// The nginx variables a template may use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Var {
    /// `$host`: the request's host, lower-case, without a port.
    Host,
    /// `$http_host`, `$best_http_host`: the `Host` as sent.
    HttpHost,
    /// `$request_uri`: the target as sent.
    RequestUri,
    /// `$escaped_request_uri`: it percent-encoded as a query value (`set_escape_uri`).
    EscapedRequestUri,
    /// `$scheme`, `$pass_access_scheme`.
    Scheme,
    /// `$uri`: the normalised path.
    Uri,
    /// `$args`, `$query_string`.
    Args,
    /// `$is_args`: `?` when there is a query.
    IsArgs,
    /// `$remote_addr`.
    RemoteAddr,
    /// `$request_method`.
    Method,
    /// `$remote_user`: the user of `Authorization: Basic`, if any.
    RemoteUser,
    /// `$server_port`: the port the request came in on.
    ServerPort,
    /// `$request_id`: the request's id, the `X-Request-ID` the upstream is sent (the client's
    /// when usable, else one the proxy made).
    RequestId,
    /// `$http_NAME`: a request header (`_` for `-`).
    Header(String),
    /// `$cookie_NAME`.
    Cookie(String),
    /// `$arg_NAME`: a query parameter.
    Arg(String),
}

impl Template {
    /// Parses `text`; an unknown variable or a lone `$` is an error (nginx refuses the
    /// configuration for either).
    pub fn parse(text: &str) -> Result<Template, String> {
        let mut parts = Vec::new();
        let mut literal = String::new();
        let mut rest = text;
        while let Some(at) = rest.find('$') {
            literal.push_str(&rest[..at]);
            let after = &rest[at + 1..];
            let (name, tail) = if let Some(braced) = after.strip_prefix('{') {
                let end = braced
                    .find('}')
                    .ok_or_else(|| format!("unclosed \"${{\" in {text:?}"))?;
                (&braced[..end], &braced[end + 1..])
            } else {
                let end = after
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .unwrap_or(after.len());
                (&after[..end], &after[end..])
            };
            if name.is_empty() {
                return Err(format!("a \"$\" without a variable name in {text:?}"));
            }
            let var = Var::named(name).ok_or_else(|| {
                format!("${name} is not a variable this controller knows (see docs/annotations.md)")
            })?;
            if !literal.is_empty() {
                parts.push(Part::Literal(std::mem::take(&mut literal)));
            }
            parts.push(Part::Var(var));
            rest = tail;
        }
        literal.push_str(rest);
        if !literal.is_empty() {
            parts.push(Part::Literal(literal));
        }
        Ok(Template {
            parts,
            text: text.to_string(),
        })
    }

    /// The template as written.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// Whether it has no variable.
    pub fn is_literal(&self) -> bool {
        self.parts.iter().all(|p| matches!(p, Part::Literal(_)))
    }

    /// The value for a request, each variable's value given by `value`.
    pub fn expand(&self, value: impl Fn(&Var) -> String) -> String {
        let mut out = String::new();
        for part in &self.parts {
            match part {
                Part::Literal(text) => out.push_str(text),
                Part::Var(var) => out.push_str(&value(var)),
            }
        }
        out
    }
}

impl Var {
    fn named(name: &str) -> Option<Var> {
        Some(match name {
            "host" => Var::Host,
            "http_host" | "best_http_host" => Var::HttpHost,
            "request_uri" => Var::RequestUri,
            "escaped_request_uri" => Var::EscapedRequestUri,
            "scheme" | "pass_access_scheme" => Var::Scheme,
            "uri" | "document_uri" => Var::Uri,
            "args" | "query_string" => Var::Args,
            "is_args" => Var::IsArgs,
            "remote_addr" => Var::RemoteAddr,
            "request_method" => Var::Method,
            "remote_user" => Var::RemoteUser,
            "server_port" => Var::ServerPort,
            "request_id" => Var::RequestId,
            _ => {
                let named = |prefix: &str| {
                    name.strip_prefix(prefix)
                        .filter(|n| !n.is_empty())
                        .map(str::to_ascii_lowercase)
                };
                if let Some(header) = named("http_") {
                    Var::Header(header.replace('_', "-"))
                } else if let Some(cookie) = name.strip_prefix("cookie_").filter(|n| !n.is_empty())
                {
                    Var::Cookie(cookie.to_string())
                } else if let Some(arg) = name.strip_prefix("arg_").filter(|n| !n.is_empty()) {
                    Var::Arg(arg.to_string())
                } else {
                    return None;
                }
            }
        })
    }
}
