//! The upstream phase: which endpoint a forwarded request goes to, how it is spoken to (the
//! route's protocol: TLS or not, HTTP/1.1 or HTTP/2, gRPC errors), and how long it may take.
//!
//! Endpoints are picked by the backend (`load-balance`; by default the less loaded of two
//! random ones); an ExternalName is resolved, and its address judged, when the connection is
//! made. A backend with no endpoint falls back to the route's `default-backend` Service, when
//! it has one.
//!
//! A retry (`proxy-next-upstream`) picks again from the backend the first attempt used (the
//! route's, its canary's, or the `default-backend`), the way the first was picked: by
//! `load-balance`, by the affinity session (`session-cookie-change-on-failure`), or within the
//! key's `upstream-hash-by-subset`; [`Reselect`] carries what it needs in the [`Forward`].

use std::sync::Arc;
use std::time::Duration;

use super::auth::RequestFacts;
use super::{Decision, Forward, RequestHeaders, affinity};
use crate::proxy::connect::Transport;
use crate::proxy::pool::PoolKey;
use crate::proxy::upstream::UpstreamError;
use crate::snapshot::Route;
use crate::snapshot::annotations::auth::Template;
use crate::snapshot::annotations::snippet::RequestEdits;
use crate::snapshot::backend::{Backend, Endpoint, InFlight, Target};
use crate::snapshot::policy::{Balance, NextUpstream};

/// The timeouts of routes that set none: the flags'.
pub(crate) struct Defaults {
    pub(crate) response: Duration,
    pub(crate) connect: Duration,
    pub(crate) send: Duration,
}

/// The forward for a request on `route` that came over HTTPS or not, or the failure that
/// replaces it. `backend` is the route's, or its canary's (the canary phase chose).
#[allow(clippy::too_many_arguments)]
pub(crate) fn forward(
    route: &Arc<Route>,
    backend: &Arc<Backend>,
    headers: &dyn RequestHeaders,
    https: bool,
    defaults: &Defaults,
    forwarded_prefix: Option<Arc<str>>,
    hash_key: Option<&[u8]>,
) -> Decision {
    let policy = &route.policy.upstream;
    let ewma = policy.balance == Balance::Ewma;
    let mut set_cookie = None;
    let mut pick = |backend: &Arc<Backend>| -> Option<(PoolKey, Option<InFlight>, Reselect)> {
        let reselect = |how| Reselect {
            backend: Some(backend.clone()),
            balance: policy.balance,
            how,
        };
        match &backend.target {
            Target::Endpoints(endpoints) => {
                let (endpoint, how) = match (&policy.affinity, hash_key) {
                    (Some(affinity), _) => {
                        let chosen =
                            affinity::pick(backend, affinity, policy.balance, headers, https)?;
                        set_cookie = chosen.set_cookie;
                        (chosen.endpoint, Repick::Sticky(chosen.sticky))
                    }
                    (None, Some(key)) => match policy.hash_by.as_ref().and_then(|h| h.subset) {
                        Some(size) => {
                            let subset = affinity::Subset::of(endpoints, size, key)?;
                            (subset.pick(endpoints)?.clone(), Repick::Subset(subset))
                        }
                        None => (affinity::by_key(backend, key)?.clone(), Repick::Balance),
                    },
                    (None, None) => (backend.pick(policy.balance)?.clone(), Repick::Balance),
                };
                Some((
                    PoolKey::Addr(endpoint.addr),
                    Some(endpoint.start(ewma)),
                    reselect(how),
                ))
            }
            Target::ExternalName(name) => Some((PoolKey::Name(name.clone()), None, Reselect::NONE)),
            Target::Unavailable => None,
        }
    };
    // `default-backend`: the route's backend without an endpoint falls back to it.
    let picked = pick(backend).or_else(|| {
        let fallback = policy.fallback.as_ref()?;
        pick(&fallback.0)
    });
    let Some((key, in_flight, reselect)) = picked else {
        return Decision::Fail(UpstreamError::NoEndpoints);
    };
    let transport = if policy.protocol.tls(https) {
        Transport::Tls(policy.tls.clone())
    } else {
        Transport::Plain
    };
    Decision::Forward(Forward {
        key,
        transport,
        wire: policy.protocol.wire(),
        in_flight,
        timeout: policy.read_timeout.unwrap_or(defaults.response),
        connect_timeout: policy.connect_timeout.unwrap_or(defaults.connect),
        send_timeout: policy.send_timeout.unwrap_or(defaults.send),
        vhost: policy.vhost.clone(),
        next_upstream: policy.next_upstream,
        reselect,
        upgrades: policy.upgrades.clone(),
        forwarded_prefix,
        set_cookie,
        set_headers: Vec::new(),
        max_body: policy.max_body,
        request_headers: policy.request_headers.clone(),
        response_headers: None,
        response_rewrite: None,
        canary: false,
        underscores: false,
        auth: None,
        limit_guard: None,
        bandwidth: route.policy.response.bandwidth,
    })
}

/// How a retry (`proxy-next-upstream`) picks its endpoint: from the backend the first attempt's
/// endpoint came from (the route's, its canary's, or its `default-backend`), the way the first
/// was picked.
#[derive(Clone, Debug)]
pub(crate) struct Reselect {
    /// `None`: nothing to pick from (an ExternalName is one name, resolved when connecting).
    backend: Option<Arc<Backend>>,
    /// The route's `load-balance`.
    balance: Balance,
    how: Repick,
}

#[derive(Clone, Debug)]
enum Repick {
    /// The balancer's choice if not tried yet, else the first endpoint not tried.
    Balance,
    /// `affinity: cookie` (see [`affinity::repick`]).
    Sticky(affinity::Sticky),
    /// `upstream-hash-by-subset`: another member of the key's subset.
    Subset(affinity::Subset),
}

impl Reselect {
    const NONE: Reselect = Reselect {
        backend: None,
        balance: Balance::TwoChoices,
        how: Repick::Balance,
    };
}

/// The next attempt of a failed request: its endpoint, the load it counts toward, and the
/// `Set-Cookie` that replaces the first attempt's when an affinity session moved.
pub(crate) struct Attempt {
    pub(crate) key: PoolKey,
    pub(crate) in_flight: InFlight,
    pub(crate) set_cookie: Option<String>,
}

/// Another endpoint for a failed request (`proxy-next-upstream`) after the attempts on `tried`
/// (the last one last), with `tries` the route's `proxy-next-upstream-tries`; `None` when there
/// is none to try.
pub(crate) fn next_endpoint(reselect: &Reselect, tried: &[PoolKey], tries: u32) -> Option<Attempt> {
    let backend = reselect.backend.as_ref()?;
    let endpoints = backend.endpoints();
    let balance = reselect.balance;
    let untried = |e: &&Arc<Endpoint>| !tried.contains(&PoolKey::Addr(e.addr));
    let (endpoint, set_cookie) = match &reselect.how {
        Repick::Balance => (
            backend
                .pick(balance)
                .filter(untried)
                .or_else(|| endpoints.iter().find(untried))?
                .clone(),
            None,
        ),
        Repick::Sticky(sticky) => {
            // A session kept on its endpoint is tried there as many times as the route allows;
            // `proxy-next-upstream-tries: 0` ("as many as there are endpoints") bounds it too.
            if tries == 0 && tried.len() >= endpoints.len().max(1) {
                return None;
            }
            affinity::repick(backend, sticky, balance, tried)?
        }
        Repick::Subset(subset) => (subset.repick(endpoints, tried)?.clone(), None),
    };
    Some(Attempt {
        key: PoolKey::Addr(endpoint.addr),
        in_flight: endpoint.start(balance == Balance::Ewma),
        set_cookie,
    })
}

/// The next attempt of a request forwarded as `reselect` says, that began at `started`, after
/// `error` on the endpoints `tried`, if `next` allows one (`proxy-next-upstream`).
pub(crate) fn retry(
    reselect: &Reselect,
    next: &NextUpstream,
    tried: &[PoolKey],
    started: std::time::Instant,
    error: &UpstreamError,
) -> Option<Attempt> {
    let attempts = u32::try_from(tried.len()).unwrap_or(u32::MAX);
    let in_time = next.within.is_none_or(|w| started.elapsed() < w);
    if !in_time || !next.allows_another(attempts) || !retries_on(next, error) {
        return None;
    }
    next_endpoint(reselect, tried, next.tries)
}

/// Whether `error` failed before anything of the request reached the upstream (no connection
/// could be made), so that even a request that must not be repeated can go elsewhere.
pub(crate) fn nothing_sent(error: &UpstreamError) -> bool {
    matches!(
        error,
        UpstreamError::Connect(_) | UpstreamError::ConnectTimeout | UpstreamError::Tls(..)
    )
}

/// Whether `error`, on an attempt that sent the client nothing, is one `next` retries on:
/// `error` for a connection that failed or broke before a response head, `timeout` for a
/// connect or response-head timeout.
pub(crate) fn retries_on(next: &NextUpstream, error: &UpstreamError) -> bool {
    match error {
        UpstreamError::Connect(_) | UpstreamError::Protocol(_) | UpstreamError::Tls(..) => {
            next.error
        }
        UpstreamError::ConnectTimeout | UpstreamError::ResponseTimeout(_) => next.timeout,
        UpstreamError::NoEndpoints
        | UpstreamError::AddressRefused { .. }
        | UpstreamError::Refused(_) => false,
    }
}

/// `edits` with the route's request header templates (`proxy-set-headers` values with nginx
/// variables) expanded for this request; a value that expands to nothing, or to bytes no
/// header may carry, removes the header (nginx sends none for an empty value).
pub(crate) fn expand(
    edits: Option<Arc<RequestEdits>>,
    templates: &[(http::HeaderName, Template)],
    facts: &RequestFacts,
) -> Option<Arc<RequestEdits>> {
    if templates.is_empty() {
        return edits;
    }
    let mut out = edits.as_deref().cloned().unwrap_or_default();
    for (name, template) in templates {
        let value = facts.expand_header(template);
        out.set.push((name.clone(), value));
    }
    Some(Arc::new(out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::annotations::affinity::{Affinity, Mode};

    fn backend(name: &str, addrs: &[&str]) -> Arc<Backend> {
        Arc::new(Backend {
            service: crate::object::ObjectKey::new("t", name),
            port: crate::snapshot::backend::PortRef::Number(80),
            target: Target::Endpoints(
                addrs
                    .iter()
                    .map(|a| Arc::new(Endpoint::new(a.parse().unwrap())))
                    .collect(),
            ),
            next: std::sync::atomic::AtomicUsize::new(0),
            app_protocol: None,
        })
    }

    fn key(addr: &str) -> PoolKey {
        PoolKey::Addr(addr.parse().unwrap())
    }

    /// Where the next attempt goes: (how the first was picked, tried) -> the next endpoint.
    #[test]
    fn next_attempts() {
        let canary = backend("canary", &["10.0.1.1:80", "10.0.1.2:80"]);
        let balanced = Reselect {
            backend: Some(canary.clone()),
            balance: Balance::RoundRobin,
            how: Repick::Balance,
        };
        // A session whose cookie named 10.0.1.1, kept there (change-on-failure off).
        let affinity = Arc::new(Affinity::new(Mode::Persistent));
        let new = affinity::pick(
            &canary,
            &affinity,
            Balance::RoundRobin,
            &http::HeaderMap::new(),
            false,
        )
        .unwrap();
        let mut headers = http::HeaderMap::new();
        let pair = new.set_cookie.unwrap();
        let pair = pair.split(';').next().unwrap();
        headers.insert(http::header::COOKIE, pair.parse().unwrap());
        let kept =
            affinity::pick(&canary, &affinity, Balance::RoundRobin, &headers, false).unwrap();
        let at = kept.endpoint.addr.to_string();
        let sticky = Reselect {
            backend: Some(canary.clone()),
            balance: Balance::RoundRobin,
            how: Repick::Sticky(kept.sticky),
        };
        let other = if at == "10.0.1.1:80" {
            "10.0.1.2:80"
        } else {
            "10.0.1.1:80"
        };
        // (how, tried, proxy-next-upstream-tries) -> the next endpoint
        let cases: Vec<(&Reselect, Vec<PoolKey>, u32, Option<PoolKey>)> = vec![
            // The backend the first attempt came from (a canary's), not another.
            (
                &balanced,
                vec![key("10.0.1.1:80")],
                3,
                Some(key("10.0.1.2:80")),
            ),
            (
                &balanced,
                vec![key("10.0.1.2:80")],
                3,
                Some(key("10.0.1.1:80")),
            ),
            (
                &balanced,
                vec![key("10.0.1.1:80"), key("10.0.1.2:80")],
                0,
                None,
            ),
            (&sticky, vec![key(&at)], 3, Some(key(&at))),
            // The tries limit is `retry`'s to apply; 0 ("as many as there are endpoints")
            // bounds attempts on the one endpoint too.
            (&sticky, vec![key(&at), key(&at)], 3, Some(key(&at))),
            (&sticky, vec![key(&at), key(&at)], 0, None),
            (&Reselect::NONE, vec![key(other)], 3, None),
        ];
        for (reselect, tried, tries, want) in cases {
            let got = next_endpoint(reselect, &tried, tries).map(|a| a.key);
            assert_eq!(got, want, "{reselect:?} {tried:?} {tries}");
        }
    }

    #[test]
    fn which_errors_are_retried() {
        let both = NextUpstream::default();
        let error_only = NextUpstream {
            timeout: false,
            ..both
        };
        let cases = [
            (UpstreamError::Connect("refused".into()), true, true),
            (UpstreamError::Protocol("closed".into()), true, true),
            (UpstreamError::ConnectTimeout, true, false),
            (
                UpstreamError::ResponseTimeout(Duration::from_secs(1)),
                true,
                false,
            ),
            (UpstreamError::NoEndpoints, false, false),
        ];
        for (error, with_both, with_error_only) in cases {
            assert_eq!(retries_on(&both, &error), with_both, "{error}");
            assert_eq!(retries_on(&error_only, &error), with_error_only, "{error}");
        }
    }
}
