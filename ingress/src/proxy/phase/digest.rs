//! Digest auth (`auth-type: digest`, RFC 2617 with `qop=auth`, MD5), as the nginx module
//! ingress-nginx loads for it (`ngx_http_auth_digest`) answers, with its defaults, which
//! ingress-nginx never changes.
//!
//! ```text
//!   client address failed 5 times in the last 300 s ─> 401 without a challenge (evasion)
//!   no or malformed Authorization: Digest ...       ─> 401 WWW-Authenticate: Digest
//!                                                      algorithm="MD5", qop="auth", realm, nonce
//!   user@realm unknown, uri not the request's,
//!   wrong response, nonce not ours, nc reused       ─> a failure, and a fresh challenge
//!   nonce older than 60 s unused, 10 s after its
//!   first use, or nc beyond 19                      ─> a failure, a challenge with stale="true"
//!                                                      (browsers retry without asking the user)
//!   otherwise                                       ─> allowed: Authentication-Info (rspauth),
//!                                                      the address's failures forgotten
//! ```
//!
//! The module keeps every nonce it hands out in shared memory. Here a nonce carries its own
//! issue time and a MAC under a key made at start, so a challenge costs no state and a flood
//! of unauthenticated requests cannot fill a table; state is kept only from a nonce's first
//! successful use (which `nc` values were used, so none is replayed), until it could no longer
//! be accepted. Like the module's shared memory, nonces belong to one instance: behind a
//! balancer that spreads one client's connections over several, clients re-authenticate.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::Instant;

use http::{HeaderValue, StatusCode, header};
use md5::{Digest as _, Md5};
use sha1::Sha1;
use subtle::ConstantTimeEq;

use super::Denial;
use crate::snapshot::annotations::auth::DigestAuth;

/// How long a challenge may wait for its first answer (`auth_digest_timeout`).
const TIMEOUT_S: u32 = 60;
/// How long a nonce is accepted after its first successful use (`auth_digest_expires`).
const EXPIRES_S: u32 = 10;
/// `nc` values a nonce accepts: 1 to 19 (`auth_digest_replays`).
const REPLAYS: u32 = 20;
/// Failures from one address before its requests are ignored (`auth_digest_maxtries`).
const MAX_TRIES: u32 = 5;
/// For how long (`auth_digest_evasion_time`).
const EVASION_S: u32 = 300;
/// The most nonces in use at once (the module's 4 MiB of shared memory holds about as many).
const MAX_NONCES: usize = 65_536;
/// The most addresses whose failures are counted at once.
const MAX_TRACKED: usize = 65_536;

/// The request as the check needs it.
pub(crate) struct DigestFacts {
    pub(crate) method: String,
    /// The target as sent (`$request_uri`), which the `uri` field must name.
    pub(crate) request_uri: String,
    pub(crate) client: IpAddr,
}

/// What a check decided.
pub(crate) enum DigestResult {
    /// In, with the `Authentication-Info` header for the response.
    Allowed(Option<HeaderValue>),
    Denied(Denial),
    /// A nonce no longer accepted: a challenge with `stale="true"`.
    Stale(Denial),
    /// Too many failures from this address lately.
    Evading(Denial),
    /// The table of nonces in use is full (503, as the module's out of shared memory).
    Full(Denial),
}

impl DigestResult {
    pub(crate) fn label(&self) -> &'static str {
        match self {
            DigestResult::Allowed(_) => "allowed",
            DigestResult::Denied(_) => "denied",
            DigestResult::Stale(_) => "stale",
            DigestResult::Evading(_) => "evading",
            DigestResult::Full(_) => "full",
        }
    }
}

/// The nonces in use and the failures per address, shared by every digest route.
pub(crate) struct DigestState {
    key: [u8; 32],
    start: Instant,
    nonces: Mutex<HashMap<u64, Used>>,
    failures: Mutex<HashMap<IpAddr, Failures>>,
}

/// A nonce after its first successful use.
struct Used {
    /// Accepted until then (seconds since start).
    expires: u32,
    /// Kept until then: a nonce forgotten while still inside its first window would be
    /// accepted again from scratch.
    forget: u32,
    /// Bit n: `nc` n was used.
    used: u32,
}

struct Failures {
    count: u32,
    /// Counted failures lapse, and evasion ends, then.
    until: u32,
}

impl DigestState {
    pub(crate) fn new() -> DigestState {
        let mut key = [0u8; 32];
        // Only the MAC's strength depends on it; should the random source fail, a key from
        // the clock and the allocator still differs per process.
        if rustls::crypto::aws_lc_rs::default_provider()
            .secure_random
            .fill(&mut key)
            .is_err()
        {
            let seed = Sha1::new()
                .chain_update(format!("{:?}{:p}", std::time::SystemTime::now(), &key))
                .finalize();
            key[..20].copy_from_slice(&seed);
        }
        DigestState {
            key,
            start: Instant::now(),
            nonces: Mutex::default(),
            failures: Mutex::default(),
        }
    }

    fn now(&self) -> u32 {
        u32::try_from(self.start.elapsed().as_secs()).unwrap_or(u32::MAX)
    }

    /// The decision for a request with `authorization` on a route with `digest`.
    pub(crate) fn check(
        &self,
        digest: &DigestAuth,
        facts: &DigestFacts,
        authorization: Option<&[u8]>,
    ) -> DigestResult {
        self.check_at(digest, facts, authorization, self.now())
    }

    /// [`check`](Self::check) at `now` seconds after start.
    fn check_at(
        &self,
        digest: &DigestAuth,
        facts: &DigestFacts,
        authorization: Option<&[u8]>,
        now: u32,
    ) -> DigestResult {
        if self.evading(facts.client, now) {
            return DigestResult::Evading(Denial {
                status: StatusCode::UNAUTHORIZED,
                location: None,
                headers: Vec::new(),
            });
        }
        // A request without usable credentials is asked for them, and is no failure.
        let Some(fields) = authorization.and_then(Fields::parse) else {
            return DigestResult::Denied(self.challenge(digest, now, false));
        };
        match self.verify(digest, facts, &fields, now) {
            Verdict::Allowed(info) => {
                self.forget_failures(facts.client);
                DigestResult::Allowed(info)
            }
            Verdict::Full => DigestResult::Full(Denial {
                status: StatusCode::SERVICE_UNAVAILABLE,
                location: None,
                headers: Vec::new(),
            }),
            Verdict::Refused { stale } => {
                self.count_failure(facts.client, now);
                if stale {
                    DigestResult::Stale(self.challenge(digest, now, true))
                } else {
                    tracing::debug!(user = %String::from_utf8_lossy(fields.username), secret = %digest.secret, "digest auth refused");
                    DigestResult::Denied(self.challenge(digest, now, false))
                }
            }
        }
    }

    fn verify(
        &self,
        digest: &DigestAuth,
        facts: &DigestFacts,
        fields: &Fields<'_>,
        now: u32,
    ) -> Verdict {
        let refused = Verdict::Refused { stale: false };
        let (Ok(user), Ok(realm)) = (
            std::str::from_utf8(fields.username),
            std::str::from_utf8(fields.realm),
        ) else {
            return refused;
        };
        let Some(ha1) = digest.users.ha1(user, realm) else {
            return refused;
        };
        // The uri must be the request's target, or (as .NET's client sends it) the target
        // without its query.
        let target = facts.request_uri.as_bytes();
        let names_target = target == fields.uri
            || (target.starts_with(fields.uri) && target.get(fields.uri.len()) == Some(&b'?'));
        if !names_target {
            return refused;
        }
        let ha2 = hex(&Md5::new()
            .chain_update(facts.method.as_bytes())
            .chain_update(b":")
            .chain_update(fields.uri)
            .finalize());
        let expected = response(ha1, fields, &ha2);
        if !bool::from(expected.as_slice().ct_eq(fields.response)) {
            return refused;
        }
        // The password is right; now whether this nonce and nc may still be used.
        let Some(nc) = parse_nc(fields.nc) else {
            return refused;
        };
        if nc == 0 || nc >= REPLAYS {
            return Verdict::Refused { stale: true };
        }
        let Some((id, issued)) = self.nonce_id(fields.nonce) else {
            return refused;
        };
        let mut nonces = self.nonces.lock().unwrap_or_else(|e| e.into_inner());
        match nonces.get_mut(&id) {
            Some(used) if used.expires <= now => return Verdict::Refused { stale: true },
            Some(used) if used.used & (1 << nc) != 0 => return refused,
            Some(used) => used.used |= 1 << nc,
            None if now >= issued.saturating_add(TIMEOUT_S) => {
                return Verdict::Refused { stale: true };
            }
            None => {
                if nonces.len() >= MAX_NONCES {
                    nonces.retain(|_, used| used.forget > now);
                    if nonces.len() >= MAX_NONCES {
                        tracing::warn!(
                            "digest auth: {MAX_NONCES} nonces in use; refusing new sessions until some expire"
                        );
                        return Verdict::Full;
                    }
                }
                let expires = now.saturating_add(EXPIRES_S);
                nonces.insert(
                    id,
                    Used {
                        expires,
                        forget: expires.max(issued.saturating_add(TIMEOUT_S)),
                        used: 1 << nc,
                    },
                );
            }
        }
        drop(nonces);
        // rspauth: the response hash again, with ":uri" for HA2, so the client can tell the
        // server knew HA1 too.
        let ha2 = hex(&Md5::new()
            .chain_update(b":")
            .chain_update(fields.uri)
            .finalize());
        let rspauth = response(ha1, fields, &ha2);
        let info = [
            &b"qop=\"auth\", rspauth=\""[..],
            &rspauth,
            b"\", cnonce=\"",
            fields.cnonce,
            b"\", nc=",
            fields.nc,
        ]
        .concat();
        // A cnonce that cannot be echoed in a quoted string leaves the header out.
        let echoable = !fields.cnonce.iter().any(|&b| b == b'"' || b == b'\\');
        Verdict::Allowed(
            echoable
                .then(|| HeaderValue::from_bytes(&info).ok())
                .flatten(),
        )
    }

    /// 401 with a new nonce for `digest`'s realm.
    fn challenge(&self, digest: &DigestAuth, now: u32, stale: bool) -> Denial {
        let rnd = fastrand::u32(..);
        let nonce = format!("{now:08x}{rnd:08x}{:016x}", self.mac(now, rnd));
        let stale = if stale { ", stale=\"true\"" } else { "" };
        let value = format!(
            "Digest algorithm=\"MD5\", qop=\"auth\", realm=\"{}\", nonce=\"{nonce}\"{stale}",
            digest.realm
        );
        Denial {
            status: StatusCode::UNAUTHORIZED,
            location: None,
            // The realm was checked for quotes, backslashes and controls when the snapshot
            // was built; an unusable value still answers 401, without the challenge.
            headers: HeaderValue::from_str(&value)
                .map(|v| vec![(header::WWW_AUTHENTICATE, v)])
                .unwrap_or_default(),
        }
    }

    /// SHA-1 over the key, the nonce's two numbers and the key again: the input has one fixed
    /// length, so the MAC cannot be extended to another.
    fn mac(&self, issued: u32, rnd: u32) -> u64 {
        let digest = Sha1::new()
            .chain_update(self.key)
            .chain_update(issued.to_be_bytes())
            .chain_update(rnd.to_be_bytes())
            .chain_update(self.key)
            .finalize();
        let mut first = [0u8; 8];
        first.copy_from_slice(&digest[..8]);
        u64::from_be_bytes(first)
    }

    /// A nonce this instance made: its id (issue time and random part) and issue time.
    fn nonce_id(&self, nonce: &[u8]) -> Option<(u64, u32)> {
        // Hex digits only: from_str_radix would also take a sign, another spelling of a nonce.
        if nonce.len() != 32 || !nonce.iter().all(u8::is_ascii_hexdigit) {
            return None;
        }
        let field = |range: std::ops::Range<usize>| {
            std::str::from_utf8(nonce.get(range)?)
                .ok()
                .and_then(|s| u64::from_str_radix(s, 16).ok())
        };
        let issued = u32::try_from(field(0..8)?).ok()?;
        let rnd = u32::try_from(field(8..16)?).ok()?;
        let mac = field(16..32)?;
        let ours = self
            .mac(issued, rnd)
            .to_be_bytes()
            .ct_eq(&mac.to_be_bytes());
        bool::from(ours).then_some((u64::from(issued) << 32 | u64::from(rnd), issued))
    }

    fn evading(&self, client: IpAddr, now: u32) -> bool {
        let failures = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        failures
            .get(&client)
            .is_some_and(|f| f.count >= MAX_TRIES && now < f.until)
    }

    fn count_failure(&self, client: IpAddr, now: u32) {
        let mut failures = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        if failures.len() >= MAX_TRACKED && !failures.contains_key(&client) {
            failures.retain(|_, f| f.until > now);
            if failures.len() >= MAX_TRACKED {
                return;
            }
        }
        let entry = failures
            .entry(client)
            .or_insert(Failures { count: 0, until: 0 });
        // Outside the window the count starts again.
        entry.count = if now > entry.until {
            1
        } else {
            entry.count + 1
        };
        entry.until = now.saturating_add(EVASION_S);
    }

    fn forget_failures(&self, client: IpAddr) {
        let mut failures = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        failures.remove(&client);
    }
}

enum Verdict {
    Allowed(Option<HeaderValue>),
    Refused { stale: bool },
    Full,
}

/// MD5(HA1:nonce:nc:cnonce:qop:HA2) in lower-case hex.
fn response(ha1: &[u8; 32], fields: &Fields<'_>, ha2: &[u8; 32]) -> [u8; 32] {
    hex(&Md5::new()
        .chain_update(ha1)
        .chain_update(b":")
        .chain_update(fields.nonce)
        .chain_update(b":")
        .chain_update(fields.nc)
        .chain_update(b":")
        .chain_update(fields.cnonce)
        .chain_update(b":")
        .chain_update(fields.qop)
        .chain_update(b":")
        .chain_update(ha2)
        .finalize())
}

fn hex(digest: &[u8]) -> [u8; 32] {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = [0u8; 32];
    for (i, byte) in digest.iter().take(16).enumerate() {
        out[2 * i] = DIGITS[usize::from(byte >> 4)];
        out[2 * i + 1] = DIGITS[usize::from(byte & 0xf)];
    }
    out
}

/// `nc`: eight hex digits as RFC 2617 writes it; the module reads any hex number.
fn parse_nc(nc: &[u8]) -> Option<u32> {
    if nc.is_empty() || nc.len() > 8 || !nc.iter().all(u8::is_ascii_hexdigit) {
        return None;
    }
    u32::from_str_radix(std::str::from_utf8(nc).ok()?, 16).ok()
}

/// The fields of `Authorization: Digest ...` the check reads, each required and non-empty.
#[derive(Debug, PartialEq, Eq)]
struct Fields<'a> {
    username: &'a [u8],
    realm: &'a [u8],
    nonce: &'a [u8],
    uri: &'a [u8],
    qop: &'a [u8],
    nc: &'a [u8],
    cnonce: &'a [u8],
    response: &'a [u8],
}

impl<'a> Fields<'a> {
    /// RFC 7235's `auth-param`s after the scheme: `name=token` or `name="quoted"`, separated
    /// by commas and whitespace. A quoted value with a backslash escape is refused rather than
    /// unescaped: no client escapes these fields, and the bytes hashed must be the ones sent.
    fn parse(value: &'a [u8]) -> Option<Fields<'a>> {
        let value = value.trim_ascii_start();
        let scheme_end = value.iter().position(|&b| b == b' ' || b == b'\t')?;
        if !value[..scheme_end].eq_ignore_ascii_case(b"digest") {
            return None;
        }
        let mut rest = &value[scheme_end..];
        let mut fields: [Option<&[u8]>; 8] = [None; 8];
        const NAMES: [&[u8]; 8] = [
            b"username",
            b"realm",
            b"nonce",
            b"uri",
            b"qop",
            b"nc",
            b"cnonce",
            b"response",
        ];
        loop {
            rest = rest.trim_ascii_start();
            while let [b',', tail @ ..] = rest {
                rest = tail.trim_ascii_start();
            }
            if rest.is_empty() {
                break;
            }
            let name_end = rest.iter().position(|&b| b == b'=')?;
            let name = &rest[..name_end];
            if name.is_empty() || !name.iter().all(|&b| is_token(b)) {
                return None;
            }
            rest = &rest[name_end + 1..];
            let value;
            if let [b'"', tail @ ..] = rest {
                let close = tail.iter().position(|&b| b == b'"')?;
                value = &tail[..close];
                if value.iter().any(|&b| b == b'\\' || b.is_ascii_control()) {
                    return None;
                }
                rest = &tail[close + 1..];
            } else {
                let end = rest
                    .iter()
                    .position(|&b| !is_token(b))
                    .unwrap_or(rest.len());
                value = &rest[..end];
                rest = &rest[end..];
            }
            let after = rest.trim_ascii_start();
            if !(after.is_empty() || after.starts_with(b",")) {
                return None;
            }
            if let Some(slot) = NAMES.iter().position(|n| n.eq_ignore_ascii_case(name)) {
                fields[slot] = Some(value);
            }
        }
        let [username, realm, nonce, uri, qop, nc, cnonce, response] = fields;
        let required = |f: Option<&'a [u8]>| f.filter(|v| !v.is_empty());
        Some(Fields {
            username: required(username)?,
            realm: required(realm)?,
            nonce: required(nonce)?,
            uri: required(uri)?,
            qop: required(qop)?,
            nc: required(nc)?,
            cnonce: required(cnonce)?,
            response: required(response)?,
        })
    }
}

/// RFC 9110's `tchar`.
fn is_token(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

#[cfg(test)]
mod tests;
