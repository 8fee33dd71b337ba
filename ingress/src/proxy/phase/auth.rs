//! Authentication: the part of the access phase that may wait (a bcrypt check on the blocking
//! pool). The synchronous phases decide that a request must authenticate (`access.rs`, with
//! `satisfy`); both protocol paths then await [`Proxy::authorize`] before anything is sent
//! upstream, and only for a request that would otherwise be forwarded (a redirect, a CORS
//! preflight or a 413 is answered first, as nginx answers those before its access phase).
//!
//! ```text
//!   basic   Authorization: Basic b64(user:password)
//!             missing, malformed, unknown user, wrong password ─> 401 WWW-Authenticate: Basic realm="…"
//!             bcrypt: a recent success for the same (hash, user, password)? ─> allowed
//!                     else on the blocking pool, at most one check per core at a time
//!             allowed ─> Authorization is not sent upstream (ingress-nginx clears it)
//! ```
//!
//! bcrypt is made to be slow (tens of milliseconds at htpasswd's usual costs): run on the async
//! threads it would stall every connection they serve, so it runs on tokio's blocking pool, and a
//! semaphore keeps a flood of wrong passwords from occupying more than the cores. A browser sends
//! the same credentials with every request, so successes are remembered for a while, keyed by
//! SHA-1 over the stored hash, the user and the password: the key reveals nothing usable, a
//! changed Secret (another hash) never matches an old entry, and failures are never remembered.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine as _;
use http::{HeaderName, HeaderValue, StatusCode, header};
use sha1::{Digest as _, Sha1};
use tokio::sync::Semaphore;

use super::cors::SetHeaders;
use super::{Decision, RequestHeaders};
use crate::proxy::Proxy;
use crate::snapshot::Route;
use crate::snapshot::annotations::auth::BasicAuth;
use crate::snapshot::annotations::htpasswd::PasswordHash;

/// How long a successful bcrypt check is remembered.
const SUCCESS_TTL: Duration = Duration::from_secs(300);
/// The most successes remembered; beyond it the expired ones go, then all of them.
const SUCCESS_ENTRIES: usize = 4096;

/// What a request brings to authentication, copied out of it: the check awaits, and the
/// request's own buffers are not held across that.
pub(crate) struct Pending {
    authorization: Option<Vec<u8>>,
}

impl Pending {
    pub(crate) fn of(headers: &dyn RequestHeaders) -> Pending {
        Pending {
            authorization: headers.header("authorization").map(<[u8]>::to_vec),
        }
    }
}

/// A request let through: what changes on its way upstream and back.
#[derive(Debug, Default)]
pub(crate) struct Granted {
    /// Request headers set (`Some`) or removed (`None`) on the way upstream.
    pub(crate) upstream: Vec<(HeaderName, Option<HeaderValue>)>,
    /// `Set-Cookie` values added to the client's response.
    pub(crate) cookies: Vec<HeaderValue>,
}

/// A request turned away by authentication: its status, where to go (a redirect), and the
/// headers of the answer (`WWW-Authenticate`, `Set-Cookie`).
#[derive(Debug)]
pub(crate) struct Denial {
    pub(crate) status: StatusCode,
    pub(crate) location: Option<String>,
    pub(crate) headers: SetHeaders,
}

/// The proxy's authentication state, shared by every request.
pub(crate) struct AuthState {
    successes: SuccessCache,
    /// One bcrypt check per core at a time.
    costly: Semaphore,
}

impl Default for AuthState {
    fn default() -> Self {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        Self {
            successes: SuccessCache::default(),
            costly: Semaphore::new(cores),
        }
    }
}

impl Proxy {
    /// The decision for a request after authentication: `decision` itself, with what
    /// authentication adds when it forwards, or the denial. Only a request the phases would
    /// send toward the backend (a forward, or a 503 for want of endpoints, which nginx too
    /// answers only after its access phase), on a route that asks for authentication
    /// (`pending`), is checked.
    pub(crate) async fn authorize(
        &self,
        route: Option<&Arc<Route>>,
        pending: Option<Pending>,
        decision: Decision,
    ) -> Decision {
        let (Some(pending), Some(route)) = (pending, route) else {
            return decision;
        };
        let auth = &route.policy.access.auth;
        let mut granted = Granted::default();
        if let Some(basic) = &auth.basic {
            let result = self.basic(basic, pending.authorization.as_deref()).await;
            self.metrics.count_auth("basic", result.label());
            if let Err(denial) = result.into_result() {
                return Decision::Deny(denial);
            }
            // ingress-nginx clears Authorization (`proxy_set_header Authorization ""`): the
            // password stays at the edge.
            granted.upstream.push((header::AUTHORIZATION, None));
        }
        match decision {
            Decision::Forward(mut forward) => {
                forward.auth = Some(granted);
                Decision::Forward(forward)
            }
            other => other,
        }
    }

    async fn basic(&self, basic: &BasicAuth, authorization: Option<&[u8]>) -> BasicResult {
        let Some((user, password)) = authorization.and_then(parse_basic) else {
            return BasicResult::Denied(challenge(basic));
        };
        let Some(hash) = basic.credentials.get(&user) else {
            tracing::debug!(%user, secret = %basic.secret, "basic auth: unknown user");
            return BasicResult::Denied(challenge(basic));
        };
        if !hash.is_costly() {
            return if hash.verify(&password) {
                BasicResult::Allowed
            } else {
                BasicResult::Denied(challenge(basic))
            };
        }
        let key = success_key(hash, &user, &password);
        if self.auth.successes.hit(&key) {
            return BasicResult::Cached;
        }
        // The semaphore is never closed, so acquiring only waits.
        let Ok(_slot) = self.auth.costly.acquire().await else {
            return BasicResult::Denied(challenge(basic));
        };
        let hash: PasswordHash = hash.clone();
        let ok = tokio::task::spawn_blocking(move || hash.verify(&password))
            .await
            .unwrap_or(false);
        if ok {
            self.auth.successes.insert(key);
            BasicResult::Allowed
        } else {
            tracing::debug!(%user, secret = %basic.secret, "basic auth: wrong password");
            BasicResult::Denied(challenge(basic))
        }
    }
}

enum BasicResult {
    Allowed,
    Cached,
    Denied(Denial),
}

impl BasicResult {
    fn label(&self) -> &'static str {
        match self {
            BasicResult::Allowed => "allowed",
            BasicResult::Cached => "cached",
            BasicResult::Denied(_) => "denied",
        }
    }

    fn into_result(self) -> Result<(), Denial> {
        match self {
            BasicResult::Allowed | BasicResult::Cached => Ok(()),
            BasicResult::Denied(denial) => Err(denial),
        }
    }
}

/// 401 with the route's realm, as nginx's `auth_basic` answers.
fn challenge(basic: &BasicAuth) -> Denial {
    let value = HeaderValue::from_bytes(format!("Basic realm=\"{}\"", basic.realm).as_bytes())
        .unwrap_or_else(|_| HeaderValue::from_static("Basic realm=\"\""));
    Denial {
        status: StatusCode::UNAUTHORIZED,
        location: None,
        headers: vec![(header::WWW_AUTHENTICATE, value)],
    }
}

/// `Basic b64(user:password)` as nginx reads it: the scheme in any case, the user non-empty and
/// UTF-8, the password everything after the first colon.
fn parse_basic(value: &[u8]) -> Option<(String, Vec<u8>)> {
    let scheme = value.get(..6)?;
    if !scheme.eq_ignore_ascii_case(b"basic ") {
        return None;
    }
    let encoded = value.get(6..)?.trim_ascii();
    let engine = base64::engine::GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        base64::engine::GeneralPurposeConfig::new()
            .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent),
    );
    let decoded = engine.decode(encoded).ok()?;
    let colon = decoded.iter().position(|&b| b == b':')?;
    if colon == 0 {
        return None;
    }
    let user = std::str::from_utf8(&decoded[..colon]).ok()?.to_string();
    Some((user, decoded[colon + 1..].to_vec()))
}

fn success_key(hash: &PasswordHash, user: &str, password: &[u8]) -> [u8; 20] {
    Sha1::new()
        .chain_update(hash.fingerprint())
        .chain_update([0])
        .chain_update(user.as_bytes())
        .chain_update([0])
        .chain_update(password)
        .finalize()
        .into()
}

/// Recent successful bcrypt checks, bounded in number and age.
#[derive(Default)]
struct SuccessCache {
    entries: Mutex<HashMap<[u8; 20], Instant>>,
}

impl SuccessCache {
    fn hit(&self, key: &[u8; 20]) -> bool {
        let entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        entries
            .get(key)
            .is_some_and(|&until| Instant::now() < until)
    }

    fn insert(&self, key: [u8; 20]) {
        let now = Instant::now();
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        if entries.len() >= SUCCESS_ENTRIES {
            entries.retain(|_, until| now < *until);
            if entries.len() >= SUCCESS_ENTRIES {
                entries.clear();
            }
        }
        entries.insert(key, now + SUCCESS_TTL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn basic_credentials_are_read_as_nginx_reads_them() {
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        let cases: Vec<(Vec<u8>, Option<(&str, &[u8])>)> = vec![
            (
                format!("Basic {}", b64("alice:pw")).into_bytes(),
                Some(("alice", b"pw")),
            ),
            (
                format!("basic {}", b64("alice:pw")).into_bytes(),
                Some(("alice", b"pw")),
            ),
            (
                format!("BASIC  {} ", b64("alice:pw")).into_bytes(),
                Some(("alice", b"pw")),
            ),
            (
                format!("Basic {}", b64("alice:p:w")).into_bytes(),
                Some(("alice", b"p:w")),
            ),
            (
                format!("Basic {}", b64("alice:")).into_bytes(),
                Some(("alice", b"")),
            ),
            // Unpadded base64 is accepted, as nginx's decoder does.
            (b"Basic YWxpY2U6cHc".to_vec(), Some(("alice", b"pw"))),
            (format!("Basic {}", b64(":pw")).into_bytes(), None),
            (format!("Basic {}", b64("alicepw")).into_bytes(), None),
            (format!("Bearer {}", b64("alice:pw")).into_bytes(), None),
            (b"Basic !!!notbase64".to_vec(), None),
            (b"Basic".to_vec(), None),
            (b"".to_vec(), None),
            (b"Basic /w==".to_vec(), None),
        ];
        for (value, want) in cases {
            let got = parse_basic(&value);
            let got = got.as_ref().map(|(u, p)| (u.as_str(), p.as_slice()));
            assert_eq!(got, want, "{}", String::from_utf8_lossy(&value));
        }
    }

    #[test]
    fn the_success_cache_keys_on_hash_user_and_password() {
        let hash = PasswordHash::parse("{PLAIN}a").expect("parses");
        let other = PasswordHash::parse("{PLAIN}b").expect("parses");
        let key = success_key(&hash, "alice", b"a");
        assert_ne!(key, success_key(&other, "alice", b"a"));
        assert_ne!(key, success_key(&hash, "alicea", b""));
        assert_ne!(key, success_key(&hash, "alice", b"b"));
        let cache = SuccessCache::default();
        assert!(!cache.hit(&key));
        cache.insert(key);
        assert!(cache.hit(&key));
        for n in 0..SUCCESS_ENTRIES {
            let mut k = [0u8; 20];
            k[..8].copy_from_slice(&(n as u64).to_be_bytes());
            cache.insert(k);
        }
        let entries = cache.entries.lock().map(|e| e.len()).unwrap_or_default();
        assert!(entries <= SUCCESS_ENTRIES, "{entries}");
    }
}
