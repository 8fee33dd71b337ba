//! Authentication: the part of the access phase that may wait (a bcrypt check on the blocking
//! pool). The synchronous phases decide that a request must authenticate (`access.rs`, with
//! `satisfy`); both protocol paths then await [`Proxy::authorize`] before anything is sent
//! upstream, and only for a request that would otherwise be forwarded (a redirect, a CORS
//! preflight or a 413 is answered first, as nginx answers those before its access phase).
//!
//! ```text
//!   basic     Authorization: Basic b64(user:password)
//!               missing, malformed, unknown user, wrong password ─> 401 WWW-Authenticate: Basic realm="…"
//!               bcrypt, MD5-crypt: a recent success for the same (hash, user, password)?
//!                       ─> allowed; else bcrypt on the blocking pool, at most one check per
//!                       core at a time, MD5-crypt inline
//!               allowed ─> Authorization is not sent upstream (ingress-nginx clears it)
//!   digest    Authorization: Digest ... against the route's htdigest users (`digest.rs`)
//!               allowed ─> Authentication-Info on the response; Authorization cleared
//!   external  auth-url expanded ─> cached answer (auth-cache-key)? ─> else a subrequest:
//!               the client's headers, no body, X-Original-URL, X-Original-Method, X-Sent-From,
//!               X-Real-IP, X-Forwarded-For, X-Auth-Request-Redirect (nginx's auth location)
//!               2xx ─> allowed: auth-response-headers copied onto the upstream request (one
//!                      the answer lacks is removed from it), Set-Cookie to the client on a
//!                      2xx/3xx response (any, with auth-always-set-cookie)
//!               401 ─> 302 to auth-signin (?rd=…) with Set-Cookie, or 401 with its
//!                      WWW-Authenticate
//!               403 ─> 403
//!               anything else, unreachable, too slow ─> 500: never an open door
//! ```
//!
//! bcrypt is made to be slow (tens of milliseconds at htpasswd's usual costs): run on the async
//! threads it would stall every connection they serve, so it runs on tokio's blocking pool, and a
//! semaphore keeps a flood of wrong passwords from occupying more than the cores. A browser sends
//! the same credentials with every request, so successes are remembered for a while, keyed by
//! SHA-1 over the stored hash, the user and the password: the key reveals nothing usable, a
//! changed Secret (another hash) never matches an old entry, and failures are never remembered.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine as _;
use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, StatusCode, header};
use http_body_util::Empty;
use ingress_wire::target::Target;
use sha1::{Digest as _, Sha1};
use tokio::sync::Semaphore;

use super::cors::SetHeaders;
use super::digest::{DigestFacts, DigestResult, DigestState};
use super::identity::ConnInfo;
use super::{Decision, Denial, RequestHeaders, RequestView};
use crate::proxy::Proxy;
use crate::proxy::auth_client::{AuthClient, Endpoint, Timeouts};
use crate::proxy::connect::Connectors;
use crate::snapshot::Route;
use crate::snapshot::annotations::auth::{BasicAuth, ExternalAuth, Template, Var};
use crate::snapshot::annotations::configmap_headers::HeaderSetting;
use crate::snapshot::annotations::htpasswd::PasswordHash;
use crate::snapshot::backend::ExternalName;
use crate::snapshot::policy::AuthPolicy;

/// How long a successful bcrypt check is remembered.
const SUCCESS_TTL: Duration = Duration::from_secs(300);
/// The most successes remembered; beyond it the expired ones go, then all of them.
const SUCCESS_ENTRIES: usize = 4096;

/// The most answers of auth services remembered (`auth-cache-key`).
const CACHED_ANSWERS: usize = 10_000;

/// What a request brings to authentication, copied out of it: the check awaits, and the
/// request's own buffers are not held across that.
pub(crate) struct Pending {
    authorization: Option<Vec<u8>>,
    /// For an auth service: the request, as its variables and headers need it.
    external: Option<Arc<RequestFacts>>,
    /// For digest auth: the method, target and client the response hash covers.
    digest: Option<DigestFacts>,
}

impl Pending {
    pub(crate) fn of(
        headers: &dyn RequestHeaders,
        external: Option<Arc<RequestFacts>>,
        digest: Option<DigestFacts>,
    ) -> Pending {
        Pending {
            authorization: headers.header("authorization").map(<[u8]>::to_vec),
            external,
            digest,
        }
    }
}

/// The request as nginx's variables and the auth subrequest see it.
pub(crate) struct RequestFacts {
    method: String,
    /// Validated, lower-case, without a port (`$host`).
    host: String,
    /// As sent (`$http_host`).
    http_host: String,
    /// As sent (`$request_uri`).
    request_uri: String,
    https: bool,
    /// Normalised (`$uri`).
    path: String,
    query: Option<String>,
    peer: IpAddr,
    server_port: u16,
    headers: Vec<(String, Vec<u8>)>,
    /// `$request_id`: the `X-Request-ID` the upstream is sent.
    request_id: String,
}

/// The request's [`RequestFacts`], made the first time a phase needs them: the route's header
/// templates, the auth subrequest and the own answers' `add-headers` all read the same ones.
pub(crate) type SharedFacts = std::cell::OnceCell<Arc<RequestFacts>>;

impl RequestFacts {
    /// The facts in `shared`, made from the request first if no phase needed them yet.
    pub(crate) fn shared<'s>(
        shared: &'s SharedFacts,
        conn: &ConnInfo,
        request: &RequestView<'_, '_>,
        target: &Target<'_>,
    ) -> &'s Arc<RequestFacts> {
        shared.get_or_init(|| Arc::new(RequestFacts::of(conn, request, target)))
    }

    pub(crate) fn of(
        conn: &ConnInfo,
        request: &RequestView<'_, '_>,
        target: &Target<'_>,
    ) -> RequestFacts {
        let RequestView {
            method,
            host,
            authority,
            target: raw_target,
            headers,
            request_id,
            ..
        } = *request;
        let mut all = Vec::new();
        headers.each(&mut |name, value| all.push((name.to_ascii_lowercase(), value.to_vec())));
        RequestFacts {
            method: method.to_string(),
            host: host.unwrap_or_default().to_string(),
            http_host: authority.or(host).unwrap_or_default().to_string(),
            request_uri: raw_target.to_string(),
            https: conn.https,
            path: target.path.to_string(),
            query: target.query.map(str::to_string),
            peer: conn.peer.ip().to_canonical(),
            server_port: conn.local_port,
            headers: all,
            request_id: String::from_utf8_lossy(request_id).into_owned(),
        }
    }

    fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_slice())
    }

    fn scheme(&self) -> &'static str {
        if self.https { "https" } else { "http" }
    }

    /// A ConfigMap header's value for this request; `None`: the header is not sent (an
    /// empty value, or a variable's bytes that cannot be a header value).
    pub(crate) fn header_value(&self, setting: &HeaderSetting) -> Option<HeaderValue> {
        match setting {
            HeaderSetting::Literal(value) => Some(value.clone()),
            HeaderSetting::Clear => None,
            HeaderSetting::Template(template) => self.expand_header(template),
        }
    }

    /// A header value made from `template` for this request (`None`: empty, or bytes no
    /// header may carry).
    pub(crate) fn expand_header(&self, template: &Template) -> Option<HeaderValue> {
        let value = template.expand(|v| self.var(v));
        (!value.is_empty())
            .then(|| HeaderValue::from_str(&value).ok())
            .flatten()
    }

    /// The value of an nginx variable for this request (empty when it has none).
    fn var(&self, var: &Var) -> String {
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        match var {
            Var::Host => self.host.clone(),
            Var::HttpHost => self.http_host.clone(),
            Var::RequestUri => self.request_uri.clone(),
            Var::EscapedRequestUri => escape_component(&self.request_uri),
            Var::Scheme => self.scheme().to_string(),
            Var::Uri => self.path.clone(),
            Var::Args => self.query.clone().unwrap_or_default(),
            Var::IsArgs => if self.query.is_some() { "?" } else { "" }.to_string(),
            Var::RemoteAddr => self.peer.to_string(),
            Var::Method => self.method.clone(),
            Var::RemoteUser => self
                .header("authorization")
                .and_then(parse_basic)
                .map(|(user, _)| user)
                .unwrap_or_default(),
            Var::ServerPort => self.server_port.to_string(),
            Var::RequestId => self.request_id.clone(),
            Var::Header(name) => self.header(name).map(text).unwrap_or_default(),
            Var::Cookie(name) => {
                let cookies = self
                    .headers
                    .iter()
                    .filter(|(n, _)| n == "cookie")
                    .map(|(_, v)| v.as_slice());
                super::canary::find_cookie(cookies, name)
                    .map(text)
                    .unwrap_or_default()
            }
            Var::Arg(name) => self
                .query
                .as_deref()
                .and_then(|q| {
                    q.split('&').find_map(|pair| {
                        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
                        (k == name).then(|| v.to_string())
                    })
                })
                .unwrap_or_default(),
        }
    }
}

/// `set_escape_uri`: everything but letters, digits and `-._~` percent-encoded, so the value
/// is safe inside a query parameter (`rd=$escaped_request_uri`).
fn escape_component(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for b in value.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A request let through: what changes on its way upstream and back.
#[derive(Debug, Default)]
pub(crate) struct Granted {
    /// Request headers set (`Some`) or removed (`None`) on the way upstream.
    pub(crate) upstream: Vec<(HeaderName, Option<HeaderValue>)>,
    /// `Set-Cookie` values added to the client's response: with a 2xx or 3xx status (nginx's
    /// `add_header`), or any with `cookies_always` (`auth-always-set-cookie`).
    pub(crate) cookies: Vec<HeaderValue>,
    pub(crate) cookies_always: bool,
    /// Digest auth's `Authentication-Info`, on the response whatever its status (the module
    /// adds it to the response's headers as it lets the request in).
    pub(crate) info: Option<HeaderValue>,
}

impl Granted {
    /// What a route's authentication changes on a request it did not check (`satisfy any`
    /// and an allow-listed client): the headers it would have set, cleared. `None` when the
    /// route has no authentication.
    pub(crate) fn unchecked(policy: &AuthPolicy) -> Option<Granted> {
        let mut upstream = Vec::new();
        if policy.basic.is_some() || policy.digest.is_some() {
            upstream.push((header::AUTHORIZATION, None));
        }
        if let Some(external) = &policy.external {
            upstream.extend(copied_headers(
                &external.response_headers,
                &HeaderMap::new(),
            ));
        }
        (!upstream.is_empty()).then(|| Granted {
            upstream,
            ..Granted::default()
        })
    }

    /// The cookies for a response with `status`.
    pub(crate) fn cookies_for(&self, status: u16) -> &[HeaderValue] {
        let listed = matches!(
            status,
            200 | 201 | 204 | 206 | 301 | 302 | 303 | 304 | 307 | 308
        );
        if listed || self.cookies_always {
            &self.cookies
        } else {
            &[]
        }
    }
}

/// The proxy's authentication state, shared by every request.
pub(crate) struct AuthState {
    digest: DigestState,
    successes: SuccessCache,
    /// One bcrypt check per core at a time.
    costly: Semaphore,
    client: AuthClient,
    answers: AnswerCache,
}

impl AuthState {
    pub(crate) fn new(connectors: Arc<Connectors>) -> Self {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        Self {
            digest: DigestState::new(),
            successes: SuccessCache::default(),
            costly: Semaphore::new(cores),
            client: AuthClient::new(connectors),
            answers: AnswerCache::default(),
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
        if let (Some(digest), Some(facts)) = (&auth.digest, &pending.digest) {
            let result = self
                .auth
                .digest
                .check(digest, facts, pending.authorization.as_deref());
            self.metrics.count_auth("digest", result.label());
            match result {
                DigestResult::Allowed(info) => granted.info = info,
                DigestResult::Denied(denial)
                | DigestResult::Stale(denial)
                | DigestResult::Evading(denial)
                | DigestResult::Full(denial) => return Decision::Deny(denial),
            }
            // As for basic auth: ingress-nginx clears it on a digest route too.
            granted.upstream.push((header::AUTHORIZATION, None));
        }
        if let (Some(external), Some(facts)) = (&auth.external, &pending.external) {
            let upstream = &route.policy.upstream;
            // The route's timeouts, else the global ones (flags, or the ConfigMap's).
            let global = self.published.load().global.timeouts;
            let timeouts = Timeouts {
                connect: upstream.connect_timeout.unwrap_or(global.connect),
                read: upstream.read_timeout.unwrap_or(global.read),
            };
            let (answer, cached) = self.ask(external, facts, timeouts).await;
            let verdict = verdict(external, facts, &answer);
            let result = match (&verdict, cached) {
                (_, true) => "cached",
                (Ok(_), false) => "allowed",
                (Err(d), false) if d.status == StatusCode::FORBIDDEN => "forbidden",
                (Err(d), false) if d.status == StatusCode::INTERNAL_SERVER_ERROR => "error",
                (Err(_), false) => "denied",
            };
            self.metrics.count_auth("external", result);
            match verdict {
                Ok(edits) => {
                    granted
                        .upstream
                        .retain(|(n, _)| !edits.upstream.iter().any(|(e, _)| e == n));
                    granted.upstream.extend(edits.upstream);
                    granted.cookies = edits.cookies;
                    granted.cookies_always = edits.cookies_always;
                }
                Err(denial) => return Decision::Deny(denial),
            }
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
        if !hash.is_slow() {
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
        if !hash.is_costly() {
            // MD5-crypt: slow enough to remember, quick enough to check here.
            return if hash.verify(&password) {
                self.auth.successes.insert(key);
                BasicResult::Allowed
            } else {
                BasicResult::Denied(challenge(basic))
            };
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

impl Proxy {
    /// The auth service's answer for `facts`, from the cache when `auth-cache-key` allows, and
    /// whether it came from there.
    async fn ask(
        &self,
        external: &ExternalAuth,
        facts: &RequestFacts,
        timeouts: Timeouts,
    ) -> (Answer, bool) {
        let cache_key = external.cache_key.as_ref().map(|key| {
            let key = key.expand(|v| facts.var(v));
            let mut digest = Sha1::new()
                .chain_update(external.url.as_str())
                .chain_update([0])
                .chain_update(facts.host.as_bytes())
                .chain_update([0]);
            digest.update(key.as_bytes());
            <[u8; 20]>::from(digest.finalize())
        });
        if let Some(key) = &cache_key
            && let Some(answer) = self.auth.answers.get(key)
        {
            return (answer, true);
        }
        let answer = self.subrequest(external, facts, timeouts).await;
        if let (Some(key), Answer::Status(status, headers)) = (cache_key, &answer)
            && let Some(ttl) = external.cache_ttl(status.as_u16())
            && cacheable(headers)
        {
            self.auth.answers.insert(key, answer.clone(), ttl);
        }
        (answer, false)
    }

    async fn subrequest(
        &self,
        external: &ExternalAuth,
        facts: &RequestFacts,
        timeouts: Timeouts,
    ) -> Answer {
        let url = external.url.expand(|v| facts.var(v));
        let Some((endpoint, path)) = endpoint_of(&url) else {
            tracing::warn!(%url, "auth-url: not a usable URL once expanded; answering 500");
            return Answer::Failed;
        };
        let method = external
            .method
            .as_deref()
            .and_then(|m| Method::from_bytes(m.as_bytes()).ok())
            .unwrap_or(Method::GET);
        let headers = subrequest_headers(external, facts, &endpoint.host);
        let name = ExternalName {
            host: endpoint.host.clone(),
            port: endpoint.port,
            addresses: external.addresses.clone(),
        };
        let make = || {
            let mut request = Request::new(Empty::<Bytes>::new());
            *request.method_mut() = method.clone();
            *request.uri_mut() = path.clone();
            *request.headers_mut() = headers.clone();
            if external.keepalive.connections == 0 {
                request
                    .headers_mut()
                    .insert(header::CONNECTION, HeaderValue::from_static("close"));
            }
            request
        };
        match self
            .auth
            .client
            .send(&endpoint, &name, make, external.keepalive, timeouts)
            .await
        {
            Ok(parts) => Answer::Status(parts.status, parts.headers),
            Err(err) => {
                tracing::warn!(%url, %err, "auth service unreachable or too slow; answering 500");
                Answer::Failed
            }
        }
    }
}

/// What an auth service said.
#[derive(Clone, Debug)]
enum Answer {
    Status(StatusCode, HeaderMap),
    /// No answer: unreachable, too slow, broken.
    Failed,
}

/// nginx's `proxy_cache` does not store an answer that sets a cookie or forbids caching.
fn cacheable(headers: &HeaderMap) -> bool {
    let forbids = headers.get_all(header::CACHE_CONTROL).iter().any(|v| {
        let v = v.as_bytes().to_ascii_lowercase();
        [&b"no-store"[..], b"no-cache", b"private"]
            .iter()
            .any(|d| v.windows(d.len()).any(|w| w == *d))
    });
    !headers.contains_key(header::SET_COOKIE) && !forbids
}

/// The decision an auth service's answer makes, as nginx's `auth_request` in ingress-nginx's
/// template.
fn verdict(
    external: &ExternalAuth,
    facts: &RequestFacts,
    answer: &Answer,
) -> Result<Granted, Denial> {
    let error = || Denial {
        status: StatusCode::INTERNAL_SERVER_ERROR,
        location: None,
        headers: Vec::new(),
    };
    let Answer::Status(status, headers) = answer else {
        return Err(error());
    };
    let cookies: Vec<HeaderValue> = headers
        .get_all(header::SET_COOKIE)
        .iter()
        .cloned()
        .collect();
    let cookie_headers = |wanted: bool| -> SetHeaders {
        if wanted {
            cookies
                .iter()
                .map(|c| (header::SET_COOKIE, c.clone()))
                .collect()
        } else {
            Vec::new()
        }
    };
    match status.as_u16() {
        200..=299 => Ok(Granted {
            upstream: copied_headers(&external.response_headers, headers),
            cookies: cookies.clone(),
            cookies_always: external.always_set_cookie,
            info: None,
        }),
        401 => match &external.signin {
            // `error_page 401 = <signin location>`: a 302 there, with the auth cookies.
            Some(signin) => Err(Denial {
                status: StatusCode::FOUND,
                location: Some(signin.expand(|v| facts.var(v))),
                headers: cookie_headers(true),
            }),
            None => {
                let mut out: SetHeaders = headers
                    .get_all(header::WWW_AUTHENTICATE)
                    .iter()
                    .map(|v| (header::WWW_AUTHENTICATE, v.clone()))
                    .collect();
                out.extend(cookie_headers(external.always_set_cookie));
                Err(Denial {
                    status: StatusCode::UNAUTHORIZED,
                    location: None,
                    headers: out,
                })
            }
        },
        403 => Err(Denial {
            status: StatusCode::FORBIDDEN,
            location: None,
            headers: cookie_headers(external.always_set_cookie),
        }),
        other => {
            tracing::warn!(
                status = other,
                url = external.url.as_str(),
                "auth service answered neither 2xx, 401 nor 403; answering 500"
            );
            Err(error())
        }
    }
}

/// `auth-response-headers` from a 2xx answer: each name the answer has (several values joined
/// with `, `), and each it lacks removed, so a client can never supply one itself.
fn copied_headers(names: &[String], answer: &HeaderMap) -> Vec<(HeaderName, Option<HeaderValue>)> {
    names
        .iter()
        .filter_map(|name| {
            let header = HeaderName::from_bytes(name.as_bytes()).ok()?;
            let values: Vec<&[u8]> = answer
                .get_all(&header)
                .iter()
                .map(HeaderValue::as_bytes)
                .collect();
            let value = match values.as_slice() {
                [] => None,
                [one] => HeaderValue::from_bytes(one).ok(),
                many => HeaderValue::from_bytes(&many.join(&b", "[..])).ok(),
            };
            Some((header, value))
        })
        .collect()
}

/// The expanded `auth-url` as where to connect and what to ask for.
fn endpoint_of(url: &str) -> Option<(Endpoint, http::Uri)> {
    let uri: http::Uri = url.parse().ok()?;
    let https = match uri.scheme_str()? {
        "http" => false,
        "https" => true,
        _ => return None,
    };
    let host = uri.host()?.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() {
        return None;
    }
    let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
    let path = uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .parse::<http::Uri>()
        .ok()?;
    Some((
        Endpoint {
            https,
            host: host.to_ascii_lowercase(),
            port,
        },
        path,
    ))
}

/// Headers the proxy sets on the subrequest itself, or must not pass on from the client.
const NOT_PASSED: &[&str] = &[
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "upgrade",
    "expect",
    "x-original-url",
    "x-original-method",
    "x-original-uri",
    "x-sent-from",
    "x-real-ip",
    "x-forwarded-for",
    "x-forwarded-host",
    "x-forwarded-port",
    "x-forwarded-proto",
    "x-forwarded-scheme",
    "x-scheme",
    "x-auth-request-redirect",
    "x-request-id",
];

/// The subrequest's headers, as ingress-nginx's auth location sets them: the client's
/// (`proxy_pass_request_headers on`) less framing, hop-by-hop and forwarding headers, and
/// nginx's own.
fn subrequest_headers(external: &ExternalAuth, facts: &RequestFacts, host: &str) -> HeaderMap {
    let mut out = HeaderMap::new();
    for (name, value) in &facts.headers {
        if NOT_PASSED.contains(&name.as_str()) {
            continue;
        }
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_bytes(value),
        ) {
            out.append(name, value);
        }
    }
    let mut set = |name: &'static str, value: &str| {
        if let Ok(value) = HeaderValue::from_str(value) {
            out.insert(HeaderName::from_static(name), value);
        }
    };
    set("host", host);
    set(
        "x-original-url",
        &format!(
            "{}://{}{}",
            facts.scheme(),
            facts.http_host,
            facts.request_uri
        ),
    );
    set("x-original-method", &facts.method);
    set("x-sent-from", "nginx-ingress-controller");
    let peer = facts.peer.to_string();
    set("x-real-ip", &peer);
    set("x-forwarded-for", &peer);
    let redirect = external
        .request_redirect
        .as_ref()
        .map_or_else(|| facts.request_uri.clone(), |t| t.expand(|v| facts.var(v)));
    set("x-auth-request-redirect", &redirect);
    // The id the upstream is sent too, as nginx's $request_id in the auth location.
    let request_id = facts.request_id.clone();
    set("x-request-id", &request_id);
    if external.method.is_some() {
        set("x-original-uri", &facts.request_uri);
        set("x-scheme", facts.scheme());
    }
    // auth-proxy-set-headers: after nginx's own, as its `proxy_set_header` lines come after
    // them in the auth location; an empty value (or one a variable made invalid) sends none.
    for (name, setting) in &external.proxy_set_headers {
        out.remove(name);
        if let Some(value) = facts.header_value(setting) {
            out.insert(name.clone(), value);
        }
    }
    out
}

/// Auth services' answers under their `auth-cache-key`, bounded in number and age.
#[derive(Default)]
struct AnswerCache {
    entries: Mutex<HashMap<[u8; 20], (Answer, Instant)>>,
}

impl AnswerCache {
    fn get(&self, key: &[u8; 20]) -> Option<Answer> {
        let entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        entries
            .get(key)
            .filter(|(_, until)| Instant::now() < *until)
            .map(|(answer, _)| answer.clone())
    }

    fn insert(&self, key: [u8; 20], answer: Answer, ttl: Duration) {
        let now = Instant::now();
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        if entries.len() >= CACHED_ANSWERS {
            entries.retain(|_, (_, until)| now < *until);
            if entries.len() >= CACHED_ANSWERS {
                entries.clear();
            }
        }
        entries.insert(key, (answer, now + ttl));
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

    fn facts() -> RequestFacts {
        RequestFacts {
            method: "POST".into(),
            host: "app.example".into(),
            http_host: "app.example:8080".into(),
            request_uri: "/a b?x=1&y=2".into(),
            https: true,
            path: "/a b".into(),
            query: Some("x=1&y=2".into()),
            peer: "192.0.2.7".parse().expect("ip"),
            server_port: 443,
            request_id: "0123456789abcdef0123456789abcdef".into(),
            headers: vec![
                ("cookie".into(), b"a=1; _oauth2_proxy=tok".to_vec()),
                ("x-api-key".into(), b"k".to_vec()),
                ("authorization".into(), b"Basic YWxpY2U6cHc=".to_vec()),
                ("x-forwarded-host".into(), b"evil.example".to_vec()),
                ("content-length".into(), b"12".to_vec()),
            ],
        }
    }

    #[test]
    fn variables_take_the_requests_values() {
        let f = facts();
        let cases = [
            (Var::Host, "app.example"),
            (Var::HttpHost, "app.example:8080"),
            (Var::RequestUri, "/a b?x=1&y=2"),
            (Var::EscapedRequestUri, "%2Fa%20b%3Fx%3D1%26y%3D2"),
            (Var::Scheme, "https"),
            (Var::Uri, "/a b"),
            (Var::Args, "x=1&y=2"),
            (Var::IsArgs, "?"),
            (Var::RemoteAddr, "192.0.2.7"),
            (Var::Method, "POST"),
            (Var::RemoteUser, "alice"),
            (Var::ServerPort, "443"),
            (Var::Header("x-api-key".into()), "k"),
            (Var::Header("x-missing".into()), ""),
            (Var::Cookie("_oauth2_proxy".into()), "tok"),
            (Var::Arg("y".into()), "2"),
            (Var::Arg("z".into()), ""),
        ];
        for (var, want) in cases {
            assert_eq!(f.var(&var), want, "{var:?}");
        }
    }

    fn external() -> ExternalAuth {
        let annotations = std::collections::BTreeMap::from([
            (
                "nginx.ingress.kubernetes.io/auth-url".to_string(),
                "https://$host/oauth2/auth".to_string(),
            ),
            (
                "nginx.ingress.kubernetes.io/auth-response-headers".to_string(),
                "X-Auth-Request-User, Authorization".to_string(),
            ),
        ]);
        crate::snapshot::annotations::auth::external(Some(&annotations), &Default::default())
            .expect("parses")
            .expect("auth-url")
    }

    #[test]
    fn answers_make_nginxs_decisions() {
        let f = facts();
        let with = |status: u16, headers: &[(&str, &str)]| {
            let mut map = HeaderMap::new();
            for (n, v) in headers {
                map.append(
                    HeaderName::from_bytes(n.as_bytes()).expect("name"),
                    HeaderValue::from_str(v).expect("value"),
                );
            }
            Answer::Status(StatusCode::from_u16(status).expect("status"), map)
        };
        let ext = external();
        // 2xx: listed headers copied; one the answer lacks is removed; several joined.
        let granted = verdict(
            &ext,
            &f,
            &with(
                202,
                &[
                    ("x-auth-request-user", "alice"),
                    ("x-auth-request-user", "bob"),
                    ("set-cookie", "s=1"),
                    ("x-other", "x"),
                ],
            ),
        )
        .expect("allowed");
        let upstream: Vec<(String, Option<String>)> = granted
            .upstream
            .iter()
            .map(|(n, v)| {
                (
                    n.to_string(),
                    v.as_ref()
                        .map(|v| v.to_str().unwrap_or_default().to_string()),
                )
            })
            .collect();
        assert_eq!(
            upstream,
            [
                (
                    "x-auth-request-user".to_string(),
                    Some("alice, bob".to_string())
                ),
                ("authorization".to_string(), None),
            ]
        );
        assert_eq!(granted.cookies_for(200).len(), 1);
        assert_eq!(granted.cookies_for(302).len(), 1);
        assert!(
            granted.cookies_for(500).is_empty(),
            "add_header without always"
        );
        assert!(granted.cookies_for(404).is_empty());
        // 401 without auth-signin: 401 with the service's challenge, no cookie.
        let denial = verdict(
            &ext,
            &f,
            &with(
                401,
                &[("www-authenticate", "Bearer"), ("set-cookie", "c=1")],
            ),
        )
        .expect_err("denied");
        assert_eq!(denial.status, StatusCode::UNAUTHORIZED);
        assert_eq!(denial.headers.len(), 1);
        // 401 with auth-signin: a 302 with the cookie.
        let signin = ExternalAuth {
            signin: Some(
                crate::snapshot::annotations::auth::Template::parse(
                    "https://$host/start?rd=$escaped_request_uri",
                )
                .expect("template"),
            ),
            ..external()
        };
        let denial = verdict(&signin, &f, &with(401, &[("set-cookie", "c=1")])).expect_err("302");
        assert_eq!(denial.status, StatusCode::FOUND);
        assert_eq!(
            denial.location.as_deref(),
            Some("https://app.example/start?rd=%2Fa%20b%3Fx%3D1%26y%3D2")
        );
        assert_eq!(denial.headers.len(), 1);
        for (status, want) in [
            (403, StatusCode::FORBIDDEN),
            (404, StatusCode::INTERNAL_SERVER_ERROR),
            (302, StatusCode::INTERNAL_SERVER_ERROR),
            (500, StatusCode::INTERNAL_SERVER_ERROR),
            (100, StatusCode::INTERNAL_SERVER_ERROR),
        ] {
            let got = verdict(&ext, &f, &with(status, &[])).expect_err("not allowed");
            assert_eq!(got.status, want, "{status}");
        }
        assert_eq!(
            verdict(&ext, &f, &Answer::Failed)
                .expect_err("failed")
                .status,
            StatusCode::INTERNAL_SERVER_ERROR
        );
    }

    #[test]
    fn the_subrequest_carries_what_nginxs_auth_location_sets() {
        let headers = subrequest_headers(&external(), &facts(), "auth.example");
        let get = |n: &str| headers.get(n).and_then(|v| v.to_str().ok());
        assert_eq!(get("host"), Some("auth.example"));
        assert_eq!(
            get("x-original-url"),
            Some("https://app.example:8080/a b?x=1&y=2")
        );
        assert_eq!(get("x-original-method"), Some("POST"));
        assert_eq!(get("x-sent-from"), Some("nginx-ingress-controller"));
        assert_eq!(get("x-real-ip"), Some("192.0.2.7"));
        assert_eq!(get("x-forwarded-for"), Some("192.0.2.7"));
        assert_eq!(get("x-auth-request-redirect"), Some("/a b?x=1&y=2"));
        assert_eq!(get("cookie"), Some("a=1; _oauth2_proxy=tok"));
        assert_eq!(get("authorization"), Some("Basic YWxpY2U6cHc="));
        assert_eq!(
            get("x-forwarded-host"),
            None,
            "a client's forwarding header"
        );
        assert_eq!(get("content-length"), None, "no body is sent");
        assert_eq!(get("x-original-uri"), None, "only with auth-method");
        assert!(get("x-request-id").is_some_and(|id| id.len() == 32));
    }

    #[test]
    fn expanded_urls_and_cacheability() {
        let cases = [
            (
                "http://auth.svc/check",
                Some((false, "auth.svc", 80, "/check")),
            ),
            (
                "https://Auth.Example:8443/a?b=c",
                Some((true, "auth.example", 8443, "/a?b=c")),
            ),
            ("http://[::1]:9/x", Some((false, "::1", 9, "/x"))),
            ("http://auth.svc", Some((false, "auth.svc", 80, "/"))),
            ("ftp://auth.svc/", None),
            ("http:///x", None),
            ("http://a b/", None),
        ];
        for (url, want) in cases {
            let got = endpoint_of(url);
            let got = got
                .as_ref()
                .map(|(e, p)| (e.https, e.host.as_str(), e.port, p.to_string()));
            let want = want.map(|(h, n, p, path)| (h, n, p, path.to_string()));
            assert_eq!(got, want, "{url}");
        }
        let map = |pairs: &[(&str, &str)]| {
            pairs
                .iter()
                .map(|(n, v)| {
                    (
                        HeaderName::from_bytes(n.as_bytes()).expect("name"),
                        HeaderValue::from_str(v).expect("value"),
                    )
                })
                .collect::<HeaderMap>()
        };
        assert!(cacheable(&map(&[("x-auth-request-user", "a")])));
        assert!(!cacheable(&map(&[("set-cookie", "a=1")])));
        assert!(!cacheable(&map(&[("cache-control", "no-store")])));
        assert!(!cacheable(&map(&[("cache-control", "max-age=0, Private")])));
        assert!(cacheable(&map(&[("cache-control", "max-age=60")])));
    }
}
