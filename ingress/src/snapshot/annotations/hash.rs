//! `upstream-hash-by`: the key a route's requests are spread by, as text and nginx variables
//! (`$request_uri`, `${host}-x`, …), parsed once; the proxy's upstream phase evaluates it.
//! With `upstream-hash-by-subset` the key picks a subset of `upstream-hash-by-subset-size`
//! endpoints rather than one, and each request a random member of it (ingress-nginx's
//! `chashsubset`).

use std::fmt;

/// A parsed key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HashKey {
    raw: String,
    pub pieces: Vec<Piece>,
    /// `upstream-hash-by-subset: "true"`: the size of the subsets (at least 1); `None` hashes
    /// to one endpoint.
    pub subset: Option<usize>,
}

/// ingress-nginx's `upstream-hash-by-subset-size` when it is not set (or set to 0).
pub const DEFAULT_SUBSET_SIZE: usize = 3;

/// One part of a key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Piece {
    Text(String),
    /// `$request_uri`: the target as the client sent it.
    RequestUri,
    /// `$uri`: the normalised path.
    Uri,
    /// `$remote_addr` (and `$binary_remote_addr`): the client's address.
    RemoteAddr,
    /// `$host`.
    Host,
    /// `$http_NAME`: a request header (lower-case, `_` read as `-`).
    Header(String),
    /// `$cookie_NAME`.
    Cookie(String),
    /// `$arg_NAME`: a query parameter.
    Arg(String),
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum HashKeyError {
    #[error("{0:?} is empty")]
    Empty(String),
    #[error(
        "${1} in {0:?} is not a variable supported here (request_uri, uri, remote_addr, binary_remote_addr, host, http_*, cookie_*, arg_*)"
    )]
    Variable(String, String),
    #[error("{0:?} has an unclosed ${{")]
    Unclosed(String),
}

impl HashKey {
    pub fn parse(value: &str) -> Result<HashKey, HashKeyError> {
        if value.trim().is_empty() {
            return Err(HashKeyError::Empty(value.into()));
        }
        let mut pieces = Vec::new();
        let mut rest = value;
        while !rest.is_empty() {
            let Some(at) = rest.find('$') else {
                pieces.push(Piece::Text(rest.into()));
                break;
            };
            if at > 0 {
                pieces.push(Piece::Text(rest[..at].into()));
            }
            let after = &rest[at + 1..];
            let (name, next) = if let Some(braced) = after.strip_prefix('{') {
                let end = braced
                    .find('}')
                    .ok_or_else(|| HashKeyError::Unclosed(value.into()))?;
                (&braced[..end], &braced[end + 1..])
            } else {
                let end = after
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .unwrap_or(after.len());
                (&after[..end], &after[end..])
            };
            pieces.push(
                variable(name).ok_or_else(|| HashKeyError::Variable(value.into(), name.into()))?,
            );
            rest = next;
        }
        Ok(HashKey {
            raw: value.into(),
            pieces,
            subset: None,
        })
    }
}

fn variable(name: &str) -> Option<Piece> {
    let suffix = |prefix: &str| {
        name.strip_prefix(prefix)
            .filter(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'))
    };
    Some(match name {
        "request_uri" => Piece::RequestUri,
        "uri" => Piece::Uri,
        "remote_addr" | "binary_remote_addr" => Piece::RemoteAddr,
        "host" => Piece::Host,
        _ => {
            if let Some(h) = suffix("http_") {
                Piece::Header(h.to_ascii_lowercase().replace('_', "-"))
            } else if let Some(c) = suffix("cookie_") {
                Piece::Cookie(c.into())
            } else {
                Piece::Arg(suffix("arg_")?.into())
            }
        }
    })
}

impl fmt::Display for HashKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.raw)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys() {
        let t = |s: &str| Piece::Text(s.into());
        let cases: Vec<(&str, Vec<Piece>)> = vec![
            ("$request_uri", vec![Piece::RequestUri]),
            ("$request_uri$host", vec![Piece::RequestUri, Piece::Host]),
            (
                "${request_uri}-text-value",
                vec![Piece::RequestUri, t("-text-value")],
            ),
            ("$remote_addr", vec![Piece::RemoteAddr]),
            ("$binary_remote_addr", vec![Piece::RemoteAddr]),
            ("$http_x_user_id", vec![Piece::Header("x-user-id".into())]),
            ("$cookie_session", vec![Piece::Cookie("session".into())]),
            (
                "a-$arg_id-b",
                vec![t("a-"), Piece::Arg("id".into()), t("-b")],
            ),
            ("$uri/x", vec![Piece::Uri, t("/x")]),
            ("text", vec![t("text")]),
        ];
        for (value, want) in cases {
            let key = HashKey::parse(value).unwrap_or_else(|e| panic!("{value}: {e}"));
            assert_eq!(key.pieces, want, "{value}");
            assert_eq!(key.to_string(), value);
        }
        for bad in [
            "",
            " ",
            "$",
            "$scheme",
            "${host",
            "$http_",
            "$upstream_addr",
        ] {
            assert!(HashKey::parse(bad).is_err(), "{bad:?}");
        }
    }
}
