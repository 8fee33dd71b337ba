//! Session affinity (`affinity: cookie`): the endpoint a request goes to when its route's
//! policy asks for one, and the cookie that keeps the client there; and `upstream-hash-by`,
//! the endpoint of a key made from the request.
//!
//! ```text
//!   cookie NAME = "<key>|<backend key>"  (ingress-nginx's format; the backend key is not
//!                                         checked, as ingress-nginx's balancer does not)
//!     balanced:   endpoint = the key's by rendezvous hashing          (any key maps)
//!     persistent: endpoint whose address hashes to the key, if any
//!   otherwise: balanced → a random key and its endpoint; persistent → the route's
//!              load-balance pick and its address's key; either way Set-Cookie
//!   a retry: the same endpoint when the cookie named it (unless change-on-failure), else a new
//!            session on an endpoint not tried, whose Set-Cookie replaces the first one
//!
//!   upstream-hash-by key → its endpoint (rendezvous); with -subset: key → subset N
//!            (rendezvous over the subsets), a random member per request, retries within it
//! ```

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use super::RequestHeaders;
use super::identity::ConnInfo;
use super::samesite;
use crate::proxy::pool::PoolKey;
use crate::snapshot::annotations::affinity::{Affinity, Mode, StableHasher, stable_hash};
use crate::snapshot::annotations::hash::{HashKey, Piece};
use crate::snapshot::backend::{Backend, Endpoint, PortRef};
use crate::snapshot::policy::Balance;

/// What the affinity phase chose for a request: the endpoint, the `Set-Cookie` when the client
/// must be told (a new session), and what a retry of the request needs.
pub(crate) struct Chosen {
    pub(crate) endpoint: Arc<Endpoint>,
    pub(crate) set_cookie: Option<String>,
    pub(crate) sticky: Sticky,
}

/// What a retry (`proxy-next-upstream`) of a request on an affinity route needs: ingress-nginx's
/// `sticky.lua` asks its balancer again on every attempt, and that answer depends on whether
/// the request's cookie named a live endpoint and on `session-cookie-change-on-failure`.
#[derive(Clone, Debug)]
pub(crate) struct Sticky {
    affinity: Arc<Affinity>,
    /// The request's cookie named the endpoint of the first attempt.
    from_cookie: bool,
    https: bool,
    samesite_none_ok: bool,
}

/// The endpoint for a request with `affinity` on `backend`, `None` when the backend has no
/// endpoint. A new session's endpoint is chosen by `balance` (the route's `load-balance`) in
/// persistent mode, by a random key in balanced mode.
pub(crate) fn pick(
    backend: &Backend,
    affinity: &Arc<Affinity>,
    balance: Balance,
    headers: &dyn RequestHeaders,
    https: bool,
) -> Option<Chosen> {
    let endpoints = backend.endpoints();
    let samesite_none_ok = !(affinity.conditional_samesite_none
        && headers
            .header("user-agent")
            .is_some_and(samesite::incompatible));
    let mut sticky = Sticky {
        affinity: affinity.clone(),
        from_cookie: false,
        https,
        samesite_none_ok,
    };
    let key = headers
        .cookie(&affinity.name)
        .and_then(|v| v.split(|&b| b == b'|').next())
        .filter(|k| !k.is_empty());
    if let Some(key) = key {
        let found = match affinity.mode {
            Mode::Balanced => rendezvous(endpoints, key),
            Mode::Persistent => {
                let wanted = hex_key(key);
                endpoints
                    .iter()
                    .find(|e| wanted.is_some_and(|k| k == endpoint_hash(e)))
            }
        };
        if let Some(endpoint) = found {
            sticky.from_cookie = true;
            return Some(Chosen {
                endpoint: endpoint.clone(),
                set_cookie: None,
                sticky,
            });
        }
    }
    let (endpoint, set_cookie) = new_session(backend, &sticky, balance, &[])?;
    Some(Chosen {
        endpoint,
        set_cookie: Some(set_cookie),
        sticky,
    })
}

/// The endpoint for another attempt of a request on an affinity route after the attempts on
/// `tried` failed (the last one last), with the `Set-Cookie` that replaces the first attempt's
/// when the session moves; `None` when there is no endpoint left to try.
///
/// As ingress-nginx's `sticky.lua`: a request whose cookie named its endpoint goes back to that
/// endpoint, the cookie unchanged, unless `session-cookie-change-on-failure`; otherwise (that
/// option, or a new session) a new session starts on an endpoint not tried yet.
pub(crate) fn repick(
    backend: &Backend,
    sticky: &Sticky,
    balance: Balance,
    tried: &[PoolKey],
) -> Option<(Arc<Endpoint>, Option<String>)> {
    if sticky.from_cookie && !sticky.affinity.change_on_failure {
        let last = tried.last()?;
        let same = backend
            .endpoints()
            .iter()
            .find(|e| PoolKey::Addr(e.addr) == *last)?;
        return Some((same.clone(), None));
    }
    let (endpoint, cookie) = new_session(backend, sticky, balance, tried)?;
    Some((endpoint, Some(cookie)))
}

/// How many random keys a balanced session draws to find one that maps to an endpoint not
/// tried yet (ingress-nginx draws 20; with two endpoints and one failed, 64 draws all missing is
/// 2^-64).
const KEY_DRAWS: usize = 64;

/// A new session on an endpoint not in `tried`: the endpoint and its `Set-Cookie`.
fn new_session(
    backend: &Backend,
    sticky: &Sticky,
    balance: Balance,
    tried: &[PoolKey],
) -> Option<(Arc<Endpoint>, String)> {
    let untried = |e: &Arc<Endpoint>| !tried.contains(&PoolKey::Addr(e.addr));
    let endpoints = backend.endpoints();
    let (endpoint, key) = match sticky.affinity.mode {
        Mode::Balanced => (0..KEY_DRAWS).find_map(|_| {
            let mut key = [0; 32];
            key[..16].copy_from_slice(&hex16(fastrand::u64(..)));
            key[16..].copy_from_slice(&hex16(fastrand::u64(..)));
            let endpoint = rendezvous(endpoints, &key)?;
            untried(endpoint).then(|| (endpoint.clone(), SessionKey::Random(key)))
        })?,
        Mode::Persistent => {
            let endpoint = backend
                .pick(balance)
                .filter(|e| untried(e))
                .or_else(|| endpoints.iter().find(|e| untried(e)))?
                .clone();
            let key = SessionKey::Endpoint(endpoint_key(&endpoint));
            (endpoint, key)
        }
    };
    let cookie = set_cookie(
        &sticky.affinity,
        key.as_bytes(),
        &backend_key(backend),
        sticky.https,
        sticky.samesite_none_ok,
    );
    Some((endpoint, cookie))
}

/// A new session's key: 32 random hex digits (balanced) or the endpoint's 16 (persistent).
enum SessionKey {
    Random([u8; 32]),
    Endpoint([u8; 16]),
}

impl SessionKey {
    fn as_bytes(&self) -> &[u8] {
        match self {
            SessionKey::Random(key) => key,
            SessionKey::Endpoint(key) => key,
        }
    }
}

/// `n` as 16 lowercase hex digits, as `format!("{n:016x}")` writes it.
fn hex16(n: u64) -> [u8; 16] {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut out = [0; 16];
    for (i, digit) in out.iter_mut().enumerate() {
        *digit = HEX[((n >> (60 - 4 * i)) & 0xf) as usize];
    }
    out
}

/// The second half of the cookie: which backend (Service and port) the session is on, so a
/// canary can keep its sessions (ingress-nginx's `backend_key`). The hash of the Service's and
/// the port's `Display` text, fed piece by piece: this runs for every new session.
pub(crate) fn backend_key(backend: &Backend) -> [u8; 16] {
    let service = &backend.service;
    let hasher = if service.namespace.is_empty() {
        StableHasher::new().pieces_part(&[service.name.as_bytes()])
    } else {
        StableHasher::new().pieces_part(&[
            service.namespace.as_bytes(),
            b"/",
            service.name.as_bytes(),
        ])
    };
    let hash = match &backend.port {
        PortRef::Number(n) => hasher.pieces_part(&[itoa::Buffer::new().format(*n).as_bytes()]),
        PortRef::Name(name) => hasher.pieces_part(&[name.as_bytes()]),
    }
    .finish();
    hex16(hash)
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

/// One subset of a backend's endpoints (`upstream-hash-by-subset`), as ingress-nginx's
/// `chashsubset.lua` makes them: the endpoints in order, cut into runs of `size`, the last run
/// filled up from the first endpoints; `set` is the run's number from 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Subset {
    set: usize,
    size: usize,
}

impl Subset {
    /// The subset `key` maps to among `endpoints`, `None` when there is none. The key picks the
    /// subset (ingress-nginx's `set1`, `set2`, …) by rendezvous hashing, so that a change in the number
    /// of subsets moves only the keys of the subsets that came or went; which endpoints a subset
    /// holds follows their order (by address), as ingress-nginx's follows its endpoint list.
    pub(crate) fn of(endpoints: &[Arc<Endpoint>], size: usize, key: &[u8]) -> Option<Subset> {
        if endpoints.is_empty() {
            return None;
        }
        let size = size.max(1);
        let sets = endpoints.len().div_ceil(size);
        // The subset's number stands for its name; no allocation per subset and request.
        let set =
            (0..sets).max_by_key(|&i| stable_hash(&[key, b"set", &(i as u64).to_le_bytes()]))?;
        Some(Subset { set, size })
    }

    /// The subset's members (a short last run repeats the first endpoints, so one may appear
    /// twice and be picked twice as often, as in ingress-nginx).
    pub(crate) fn members(
        self,
        endpoints: &[Arc<Endpoint>],
    ) -> impl Iterator<Item = &Arc<Endpoint>> {
        let n = endpoints.len();
        let start = self.set.saturating_mul(self.size);
        (start..start.saturating_add(self.size))
            .filter_map(move |k| endpoints.get(k.checked_rem(n)?))
    }

    /// A random member: each request of a key goes to one of its subset's endpoints.
    pub(crate) fn pick(self, endpoints: &[Arc<Endpoint>]) -> Option<&Arc<Endpoint>> {
        self.members(endpoints)
            .nth(fastrand::usize(..self.size.max(1)))
    }

    /// A random member not in `tried`, for a retry: a key stays in its subset, as it does in
    /// ingress-nginx; `None` when every member was tried.
    pub(crate) fn repick<'e>(
        self,
        endpoints: &'e [Arc<Endpoint>],
        tried: &[PoolKey],
    ) -> Option<&'e Arc<Endpoint>> {
        let mut members: Vec<&Arc<Endpoint>> = self
            .members(endpoints)
            .filter(|e| !tried.contains(&PoolKey::Addr(e.addr)))
            .collect();
        members.sort_by_key(|e| e.addr);
        members.dedup_by_key(|e| e.addr);
        members
            .get(fastrand::usize(..members.len().max(1)))
            .copied()
    }
}

/// A persistent key: the endpoint's address, hashed.
fn endpoint_key(endpoint: &Endpoint) -> [u8; 16] {
    hex16(endpoint_hash(endpoint))
}

fn endpoint_hash(endpoint: &Endpoint) -> u64 {
    addr_part(StableHasher::new(), endpoint).finish()
}

/// `hasher` fed the endpoint's address as its `Display` text (made with the snapshot).
fn addr_part(hasher: StableHasher, endpoint: &Endpoint) -> StableHasher {
    hasher.part(endpoint.addr_text().as_bytes())
}

/// A persistent cookie key as the hash it spells: exactly what [`endpoint_key`] writes (16
/// lowercase hex digits), anything else names no endpoint.
fn hex_key(key: &[u8]) -> Option<u64> {
    let digits = key.len() == 16 && key.iter().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    digits
        .then(|| std::str::from_utf8(key).ok())
        .flatten()
        .and_then(|k| u64::from_str_radix(k, 16).ok())
}

/// The endpoint whose hash with `key` is highest: adding or removing an endpoint moves only
/// the keys that it wins or held.
fn rendezvous<'e>(endpoints: &'e [Arc<Endpoint>], key: &[u8]) -> Option<&'e Arc<Endpoint>> {
    // The key's part is hashed once; each endpoint continues from a copy.
    let seeded = StableHasher::new().part(key);
    endpoints
        .iter()
        .max_by_key(|e| addr_part(seeded, e).finish())
}

/// The cookie, with ingress-nginx's attributes: `HttpOnly` always, `Secure` on HTTPS unless
/// the annotation says, `Path` the route's unless set.
fn set_cookie(
    affinity: &Affinity,
    key: &[u8],
    backend_key: &[u8],
    https: bool,
    samesite_none_ok: bool,
) -> String {
    // Built by pushing pieces: this runs for every new session.
    let mut out = String::with_capacity(128);
    out.push_str(&affinity.name);
    out.push('=');
    // Both keys are hex digits.
    out.extend(key.iter().map(|&b| char::from(b)));
    out.push('|');
    out.extend(backend_key.iter().map(|&b| char::from(b)));
    if let Some(seconds) = affinity.expires {
        let at = SystemTime::now() + Duration::from_secs(seconds.min(10 * 365 * 86_400));
        out.push_str("; Expires=");
        out.push_str(&httpdate::fmt_http_date(at));
    }
    if let Some(seconds) = affinity.max_age {
        out.push_str("; Max-Age=");
        out.push_str(itoa::Buffer::new().format(seconds));
    }
    if let Some(domain) = &affinity.domain {
        out.push_str("; Domain=");
        out.push_str(domain);
    }
    out.push_str("; Path=");
    out.push_str(affinity.path.as_deref().unwrap_or("/"));
    if affinity.secure.unwrap_or(https) {
        out.push_str("; Secure");
    }
    out.push_str("; HttpOnly");
    if let Some(samesite) = affinity
        .samesite
        .filter(|s| *s != "None" || samesite_none_ok)
    {
        out.push_str("; SameSite=");
        out.push_str(samesite);
    }
    out
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;

    use super::*;

    fn endpoints(n: u8) -> Vec<Arc<Endpoint>> {
        (1..=n)
            .map(|i| Arc::new(Endpoint::new(format!("10.0.0.{i}:80").parse().unwrap())))
            .collect()
    }

    fn backend(n: u8) -> Backend {
        Backend {
            service: crate::object::ObjectKey::new("t", "web"),
            port: crate::snapshot::backend::PortRef::Number(80),
            target: crate::snapshot::backend::Target::Endpoints(endpoints(n)),
            next: std::sync::atomic::AtomicUsize::new(0),
            app_protocol: None,
        }
    }

    fn affinity(mode: Mode, change_on_failure: bool) -> Arc<Affinity> {
        Arc::new(Affinity {
            change_on_failure,
            ..Affinity::new(mode)
        })
    }

    /// The request headers of a client that sends back `set_cookie`'s pair (none: no cookie).
    fn sending(set_cookie: Option<&str>) -> http::HeaderMap {
        let mut headers = http::HeaderMap::new();
        if let Some(pair) = set_cookie.and_then(|c| c.split(';').next()) {
            headers.insert(http::header::COOKIE, pair.parse().unwrap());
        }
        headers
    }

    fn key(e: &Endpoint) -> PoolKey {
        PoolKey::Addr(e.addr)
    }

    #[test]
    fn persistent_new_sessions_follow_the_routes_load_balance() {
        let backend = backend(3);
        let persistent = affinity(Mode::Persistent, false);
        let picked: Vec<_> = (0..30)
            .map(|_| {
                let chosen = pick(
                    &backend,
                    &persistent,
                    Balance::RoundRobin,
                    &sending(None),
                    false,
                )
                .unwrap();
                assert!(chosen.set_cookie.is_some());
                chosen.endpoint.addr
            })
            .collect();
        // round_robin: each endpoint in turn, not two random ones.
        let all = backend.endpoints();
        for (i, addr) in picked.iter().enumerate() {
            assert_eq!(*addr, all[i % 3].addr, "session {i}: {picked:?}");
        }
    }

    /// A retry of a request on an affinity route, as ingress-nginx's `sticky.lua` balances it:
    /// (mode, change-on-failure, the request had a cookie) -> the retry stays on the failed
    /// endpoint (with no new cookie), or moves with a cookie that names where it went.
    #[test]
    fn retries_stay_or_move_with_their_cookie() {
        let backend = backend(3);
        let all = backend.endpoints();
        let cases = [
            (Mode::Balanced, false, true, true),
            (Mode::Persistent, false, true, true),
            (Mode::Balanced, true, true, false),
            (Mode::Persistent, true, true, false),
            // A new session moves whatever change-on-failure says: it has no endpoint yet.
            (Mode::Balanced, false, false, false),
            (Mode::Persistent, false, false, false),
        ];
        for (mode, change, with_cookie, stays) in cases {
            let label = format!("{mode:?} change-on-failure {change} cookie {with_cookie}");
            let affinity = affinity(mode, change);
            for round in 0..20 {
                let first = pick(
                    &backend,
                    &affinity,
                    Balance::RoundRobin,
                    &sending(None),
                    false,
                )
                .unwrap();
                let cookie = first.set_cookie.clone();
                let chosen = if with_cookie {
                    // The client comes back with its cookie: the same endpoint, no Set-Cookie.
                    let again = pick(
                        &backend,
                        &affinity,
                        Balance::RoundRobin,
                        &sending(cookie.as_deref()),
                        false,
                    )
                    .unwrap();
                    assert_eq!(again.endpoint.addr, first.endpoint.addr, "{label}");
                    assert_eq!(again.set_cookie, None, "{label}");
                    again
                } else {
                    first
                };
                let failed = key(&chosen.endpoint);
                let (next, moved) = repick(
                    &backend,
                    &chosen.sticky,
                    Balance::RoundRobin,
                    std::slice::from_ref(&failed),
                )
                .unwrap();
                if stays {
                    assert_eq!(key(&next), failed, "{label} round {round}");
                    assert_eq!(moved, None, "{label}");
                    continue;
                }
                assert_ne!(key(&next), failed, "{label} round {round}");
                let moved = moved.unwrap_or_else(|| panic!("{label}: no new cookie"));
                // The new cookie brings the client back to where the retry went.
                let back = pick(
                    &backend,
                    &affinity,
                    Balance::RoundRobin,
                    &sending(Some(&moved)),
                    false,
                )
                .unwrap();
                assert_eq!(back.endpoint.addr, next.addr, "{label} {moved}");
                assert_eq!(back.set_cookie, None, "{label}");
                // Every endpoint tried: nothing left for a moving session.
                let tried: Vec<PoolKey> = all.iter().map(|e| key(e)).collect();
                assert!(
                    repick(&backend, &chosen.sticky, Balance::RoundRobin, &tried).is_none(),
                    "{label}"
                );
            }
        }
    }

    #[test]
    fn subsets_as_chashsubset_makes_them() {
        // (endpoints, size) -> each subset's members, by endpoint index.
        let cases: &[(u8, usize, &[&[usize]])] = &[
            (6, 3, &[&[0, 1, 2], &[3, 4, 5]]),
            // The last subset is filled up from the first endpoints.
            (7, 3, &[&[0, 1, 2], &[3, 4, 5], &[6, 0, 1]]),
            (2, 3, &[&[0, 1, 0]]),
            (1, 3, &[&[0, 0, 0]]),
            (3, 1, &[&[0], &[1], &[2]]),
        ];
        for (n, size, want) in cases {
            let all = endpoints(*n);
            let mut seen = vec![false; want.len()];
            for k in 0..400 {
                let key = format!("/item/{k}");
                let subset = Subset::of(&all, *size, key.as_bytes()).unwrap();
                let members: Vec<usize> = subset
                    .members(&all)
                    .map(|e| all.iter().position(|a| a.addr == e.addr).unwrap())
                    .collect();
                let at = want.iter().position(|w| *w == members).unwrap_or_else(|| {
                    panic!("{n} endpoints, size {size}: {members:?} is not a subset")
                });
                seen[at] = true;
                // The same key, the same subset; a request goes to one of its members.
                assert_eq!(Subset::of(&all, *size, key.as_bytes()), Some(subset));
                let picked = subset.pick(&all).unwrap();
                assert!(subset.members(&all).any(|e| e.addr == picked.addr));
            }
            assert!(
                seen.iter().all(|s| *s),
                "{n}/{size}: keys reach every subset"
            );
        }
        assert_eq!(Subset::of(&[], 3, b"k"), None);
    }

    #[test]
    fn a_subset_spreads_a_key_over_its_members_and_retries_within_it() {
        let all = endpoints(9);
        let subset = Subset::of(&all, 3, b"/same").unwrap();
        let members: Vec<_> = subset.members(&all).map(|e| e.addr).collect();
        let mut hit = std::collections::BTreeSet::new();
        for _ in 0..200 {
            hit.insert(subset.pick(&all).unwrap().addr);
        }
        assert_eq!(hit.len(), 3, "{hit:?}");
        let failed = [PoolKey::Addr(members[0])];
        for _ in 0..50 {
            let next = subset.repick(&all, &failed).unwrap();
            assert!(members[1..].contains(&next.addr), "{next:?}");
        }
        let tried: Vec<PoolKey> = members.iter().map(|a| PoolKey::Addr(*a)).collect();
        assert!(subset.repick(&all, &tried).is_none());
    }

    #[test]
    fn subsets_keep_their_keys_when_one_is_added() {
        // 6 endpoints in 2 subsets, then 7 in 3: a key whose subset still exists keeps it
        // (the members of the last subset change, as in ingress-nginx).
        let six = endpoints(6);
        let seven = endpoints(7);
        let mut moved = 0;
        for k in 0..600 {
            let key = format!("k{k}");
            let before = Subset::of(&six, 3, key.as_bytes()).unwrap();
            let after = Subset::of(&seven, 3, key.as_bytes()).unwrap();
            if before != after {
                assert_eq!(after.set, 2, "{key} moved between old subsets");
                moved += 1;
            }
        }
        assert!((100..=300).contains(&moved), "{moved} of 600 moved");
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
    fn persistent_keys_are_read_as_written() {
        let e = Endpoint::new("10.0.0.7:8080".parse().unwrap());
        let written = String::from_utf8_lossy(&endpoint_key(&e)).into_owned();
        assert_eq!(hex_key(written.as_bytes()), Some(endpoint_hash(&e)));
        for other in [
            written.to_uppercase(),
            format!("{written}0"),
            written[1..].to_string(),
            format!("+{}", &written[1..]),
            String::new(),
        ] {
            assert_eq!(hex_key(other.as_bytes()), None, "{other:?}");
        }
    }

    #[test]
    fn hand_written_keys_hash_what_display_writes() {
        let addrs = [
            "0.0.0.0:0",
            "10.1.2.3:8080",
            "255.255.255.255:65535",
            "127.0.0.1:80",
            "[2001:db8::1]:443",
            "[::1]:1",
        ];
        for addr in addrs {
            let addr: SocketAddr = addr.parse().unwrap_or_else(|e| panic!("{addr}: {e}"));
            let seeded = StableHasher::new().part(b"key");
            assert_eq!(
                addr_part(seeded, &Endpoint::new(addr)).finish(),
                seeded.display_part(&addr).finish(),
                "{addr}"
            );
        }
        for n in [0, 1, 0xfff, u64::MAX, 0x0123_4567_89ab_cdef] {
            assert_eq!(hex16(n).as_slice(), format!("{n:016x}").as_bytes());
        }
        let services = [("shop", "front"), ("", "alone")];
        let ports = [PortRef::Number(8080), PortRef::Name("http".into())];
        for ((namespace, name), port) in services.into_iter().zip(ports) {
            let mut backend = backend(1);
            backend.service = crate::object::ObjectKey::new(namespace, name);
            backend.port = port;
            let by_display = StableHasher::new()
                .display_part(&backend.service)
                .display_part(&backend.port)
                .finish();
            assert_eq!(
                backend_key(&backend).as_slice(),
                format!("{by_display:016x}").as_bytes()
            );
        }
    }

    #[test]
    fn cookie_attributes() {
        let base = Affinity {
            path: Some("/app".into()),
            ..Affinity::new(Mode::Balanced)
        };
        assert_eq!(
            set_cookie(&base, b"k", b"b", false, true),
            "INGRESSCOOKIE=k|b; Path=/app; HttpOnly"
        );
        assert_eq!(
            set_cookie(&base, b"k", b"b", true, true),
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
            set_cookie(&full, b"k", b"b", true, true),
            "INGRESSCOOKIE=k|b; Max-Age=60; Domain=example.com; Path=/app; HttpOnly; SameSite=None"
        );
        // A browser that mishandles SameSite=None is not sent it; Lax and Strict are always sent.
        assert_eq!(
            set_cookie(&full, b"k", b"b", true, false),
            "INGRESSCOOKIE=k|b; Max-Age=60; Domain=example.com; Path=/app; HttpOnly"
        );
        let lax = Affinity {
            samesite: Some("Lax"),
            ..full.clone()
        };
        assert!(set_cookie(&lax, b"k", b"b", true, false).ends_with("; SameSite=Lax"));
        let expiring = Affinity {
            expires: Some(3600),
            ..base
        };
        assert!(set_cookie(&expiring, b"k", b"b", false, true).contains("; Expires="));
    }
}
