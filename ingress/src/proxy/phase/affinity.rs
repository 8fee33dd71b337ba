//! Session affinity (`affinity: cookie`): the endpoint a request goes to when its route's
//! policy asks for one, and the cookie that keeps the client there; and `upstream-hash-by`,
//! the endpoint of a key made from the request.
//!
//! ```text
//!   cookie NAME = "<key>|<backend key>"  (ingress-nginx's format; the backend key is not
//!                                         checked, as ingress-nginx's balancer does not)
//!     balanced:   endpoint = the key's by rendezvous hashing          (any key maps)
//!     persistent: endpoint whose address hashes to the key, if any
//!   otherwise: balanced → a random key and its endpoint; persistent → the usual pick and its
//!              address's key; either way Set-Cookie
//! ```

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use super::RequestHeaders;
use super::identity::ConnInfo;
use super::samesite;
use crate::snapshot::annotations::affinity::{Affinity, Mode, stable_hash};
use crate::snapshot::annotations::hash::{HashKey, Piece};
use crate::snapshot::backend::{Backend, Endpoint};
use crate::snapshot::policy::Balance;

/// The endpoint for a request with `affinity` on `backend`, and the `Set-Cookie` value when the
/// client must be told (a new session); `None` when the backend has no endpoint.
pub(crate) fn pick(
    backend: &Backend,
    affinity: &Affinity,
    headers: &dyn RequestHeaders,
    https: bool,
) -> Option<(Arc<Endpoint>, Option<String>)> {
    let endpoints = backend.endpoints();
    let key = headers
        .cookie(&affinity.name)
        .and_then(|v| v.split(|&b| b == b'|').next())
        .filter(|k| !k.is_empty());
    if let Some(key) = key {
        let found = match affinity.mode {
            Mode::Balanced => rendezvous(endpoints, key),
            Mode::Persistent => endpoints.iter().find(|e| endpoint_key(e).as_bytes() == key),
        };
        if let Some(endpoint) = found {
            return Some((endpoint.clone(), None));
        }
    }
    let (endpoint, key) = match affinity.mode {
        Mode::Balanced => {
            let key = format!("{:016x}{:016x}", fastrand::u64(..), fastrand::u64(..));
            (rendezvous(endpoints, key.as_bytes())?.clone(), key)
        }
        Mode::Persistent => {
            let endpoint = backend.pick(Balance::default())?.clone();
            let key = endpoint_key(&endpoint);
            (endpoint, key)
        }
    };
    let backend_key = backend_key(backend);
    let samesite_none_ok = !(affinity.conditional_samesite_none
        && headers
            .header("user-agent")
            .is_some_and(samesite::incompatible));
    Some((
        endpoint,
        Some(set_cookie(
            affinity,
            &key,
            &backend_key,
            https,
            samesite_none_ok,
        )),
    ))
}

/// The second half of the cookie: which backend (Service and port) the session is on, so a
/// canary can keep its sessions (ingress-nginx's `backend_key`).
pub(crate) fn backend_key(backend: &Backend) -> String {
    format!(
        "{:016x}",
        stable_hash(&[
            backend.service.to_string().as_bytes(),
            backend.port.to_string().as_bytes()
        ])
    )
}

/// The backend key of the session cookie a request carries, if any.
pub(crate) fn session_backend<'h>(
    affinity: &Affinity,
    headers: &'h dyn RequestHeaders,
) -> Option<&'h [u8]> {
    let value = headers.cookie(&affinity.name)?;
    let at = value.iter().position(|&b| b == b'|')?;
    value.get(at + 1..)
}

/// The value of an `upstream-hash-by` key for a request: `raw_target` as sent, `path`
/// normalised, `query` its query. A variable the request lacks is empty, as in nginx.
pub(crate) fn hash_key(
    key: &HashKey,
    conn: &ConnInfo,
    host: Option<&str>,
    raw_target: &str,
    path: &str,
    query: Option<&str>,
    headers: &dyn RequestHeaders,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(raw_target.len() + 16);
    for piece in &key.pieces {
        match piece {
            Piece::Text(text) => out.extend_from_slice(text.as_bytes()),
            Piece::RequestUri => out.extend_from_slice(raw_target.as_bytes()),
            Piece::Uri => out.extend_from_slice(path.as_bytes()),
            Piece::RemoteAddr => out.extend_from_slice(conn.client.client_ip.as_bytes()),
            Piece::Host => out.extend_from_slice(host.unwrap_or("").as_bytes()),
            Piece::Header(name) => out.extend_from_slice(headers.header(name).unwrap_or(b"")),
            Piece::Cookie(name) => out.extend_from_slice(headers.cookie(name).unwrap_or(b"")),
            Piece::Arg(name) => {
                let value = query
                    .into_iter()
                    .flat_map(|q| q.split('&'))
                    .find_map(|pair| {
                        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
                        (k == name).then_some(v)
                    });
                out.extend_from_slice(value.unwrap_or("").as_bytes());
            }
        }
    }
    out
}

/// The endpoint of `key` among the backend's (`upstream-hash-by`).
pub(crate) fn by_key<'b>(backend: &'b Backend, key: &[u8]) -> Option<&'b Arc<Endpoint>> {
    rendezvous(backend.endpoints(), key)
}

/// A persistent key: the endpoint's address, hashed.
fn endpoint_key(endpoint: &Endpoint) -> String {
    format!(
        "{:016x}",
        stable_hash(&[endpoint.addr.to_string().as_bytes()])
    )
}

/// The endpoint whose hash with `key` is highest: adding or removing an endpoint moves only
/// the keys that it wins or held.
fn rendezvous<'e>(endpoints: &'e [Arc<Endpoint>], key: &[u8]) -> Option<&'e Arc<Endpoint>> {
    endpoints
        .iter()
        .max_by_key(|e| stable_hash(&[key, e.addr.to_string().as_bytes()]))
}

/// The cookie, with ingress-nginx's attributes: `HttpOnly` always, `Secure` on HTTPS unless
/// the annotation says, `Path` the route's unless set.
fn set_cookie(
    affinity: &Affinity,
    key: &str,
    backend_key: &str,
    https: bool,
    samesite_none_ok: bool,
) -> String {
    let mut out = format!("{}={key}|{backend_key}", affinity.name);
    if let Some(seconds) = affinity.expires {
        let at = SystemTime::now() + Duration::from_secs(seconds.min(10 * 365 * 86_400));
        let _ = write!(out, "; Expires={}", httpdate::fmt_http_date(at));
    }
    if let Some(seconds) = affinity.max_age {
        let _ = write!(out, "; Max-Age={seconds}");
    }
    if let Some(domain) = &affinity.domain {
        let _ = write!(out, "; Domain={domain}");
    }
    let _ = write!(out, "; Path={}", affinity.path.as_deref().unwrap_or("/"));
    if affinity.secure.unwrap_or(https) {
        out.push_str("; Secure");
    }
    out.push_str("; HttpOnly");
    if let Some(samesite) = affinity
        .samesite
        .filter(|s| *s != "None" || samesite_none_ok)
    {
        let _ = write!(out, "; SameSite={samesite}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::annotations::affinity::DEFAULT_COOKIE;

    fn endpoints(n: u8) -> Vec<Arc<Endpoint>> {
        (1..=n)
            .map(|i| Arc::new(Endpoint::new(format!("10.0.0.{i}:80").parse().unwrap())))
            .collect()
    }

    #[test]
    fn rendezvous_moves_only_the_keys_of_the_endpoint_that_changed() {
        let five = endpoints(5);
        let four = &five[..4];
        let keys: Vec<String> = (0..500).map(|i| format!("key{i}")).collect();
        let mut moved = 0;
        for key in &keys {
            let a = rendezvous(&five, key.as_bytes()).unwrap();
            let b = rendezvous(four, key.as_bytes()).unwrap();
            if a.addr != b.addr {
                // Only keys that were on the removed endpoint move.
                assert_eq!(a.addr, five[4].addr, "{key}");
                moved += 1;
            }
        }
        assert!((50..=150).contains(&moved), "{moved} of 500 moved");
        assert!(rendezvous(&[], b"k").is_none());
    }

    #[test]
    fn cookie_attributes() {
        let base = Affinity {
            mode: Mode::Balanced,
            name: DEFAULT_COOKIE.into(),
            path: Some("/app".into()),
            domain: None,
            max_age: None,
            expires: None,
            samesite: None,
            conditional_samesite_none: false,
            secure: None,
        };
        assert_eq!(
            set_cookie(&base, "k", "b", false, true),
            "INGRESSCOOKIE=k|b; Path=/app; HttpOnly"
        );
        assert_eq!(
            set_cookie(&base, "k", "b", true, true),
            "INGRESSCOOKIE=k|b; Path=/app; Secure; HttpOnly"
        );
        let full = Affinity {
            domain: Some("example.com".into()),
            max_age: Some(60),
            samesite: Some("None"),
            conditional_samesite_none: false,
            secure: Some(false),
            ..base.clone()
        };
        assert_eq!(
            set_cookie(&full, "k", "b", true, true),
            "INGRESSCOOKIE=k|b; Max-Age=60; Domain=example.com; Path=/app; HttpOnly; SameSite=None"
        );
        // A browser that mishandles SameSite=None is not sent it; Lax and Strict are always sent.
        assert_eq!(
            set_cookie(&full, "k", "b", true, false),
            "INGRESSCOOKIE=k|b; Max-Age=60; Domain=example.com; Path=/app; HttpOnly"
        );
        let lax = Affinity {
            samesite: Some("Lax"),
            ..full.clone()
        };
        assert!(set_cookie(&lax, "k", "b", true, false).ends_with("; SameSite=Lax"));
        let expiring = Affinity {
            expires: Some(3600),
            ..base
        };
        assert!(set_cookie(&expiring, "k", "b", false, true).contains("; Expires="));
    }
}
