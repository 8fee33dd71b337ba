//! Custom error pages (`custom-http-errors`, part of the response phase): a response whose code
//! is listed is replaced by a page of the error backend, on both HTTP paths.
//!
//! ```text
//!   plan(route, global)   the Ingress's list (+ its default-backend, else the global default
//!                         backend), else the ConfigMap's list (+ the global default backend);
//!                         none, or no error backend → None: nothing is ever replaced
//!   wants(code, upstream) listed, and (for the upstream's own response) intercept not disabled
//!   fetch                 GET / (HEAD / for HEAD) on one endpoint of the error backend, with
//!                         X-Code, X-Format, X-Original-URI, X-Namespace, X-Ingress-Name,
//!                         X-Service-Name, X-Service-Port, X-Request-ID, X-Forwarded-For, Host
//!                         → its status, Content-Type and body (bounded)
//!                         fails → None: the caller answers the original code itself, never
//!                         asking again (the page's own code is not judged: no loop)
//! ```
//!
//! The path asked for is `/`, as ingress-nginx's `@custom_…` locations rewrite it (`rewrite
//! (.*) / break`); the request's own target is in `X-Original-URI`. The upstream's response
//! whose code was listed is not read: its connection is closed (HTTP/1.1) or its stream reset
//! (HTTP/2) by the caller dropping it.
//!
//! Connections to the error backend are kept alive for the next page ([`PagePool`], `kept.rs`),
//! as ingress-nginx keeps its upstreams': a connection per page left a TIME_WAIT socket on the
//! proxy per error, and a flood of 404s could use up its ports.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Request, StatusCode, header};
use http_body_util::{BodyExt, Empty, Limited};

use crate::proxy::connect;
use crate::proxy::kept::{self, Keepalive, Kept, Sender};
use crate::proxy::pool::PoolKey;
use crate::snapshot::Route;
use crate::snapshot::backend::{Backend, Target};
use crate::snapshot::global::{GlobalSettings, UpstreamKeepalive};
use crate::snapshot::policy::Balance;

/// The largest page read from the error backend; a larger one is not used (the proxy's own
/// page is sent instead), so a connection holds at most this much of it.
const MAX_PAGE: usize = 1 << 20;

/// What applies to one request: the codes, the error backend, and what the headers say of the
/// route.
#[derive(Clone, Debug)]
pub(crate) struct ErrorPlan {
    codes: Arc<[u16]>,
    backend: Arc<Backend>,
    intercept: bool,
    /// `X-Namespace`, `X-Ingress-Name`, `X-Service-Name`, `X-Service-Port`: the route's (empty
    /// for a request no route took, as nginx's default server leaves them).
    namespace: Arc<str>,
    ingress: Arc<str>,
    service: Arc<str>,
    port: Arc<str>,
}

/// The error pages for a request on `route` (`None`: no route took it) under `global`.
pub(crate) fn plan(route: Option<&Arc<Route>>, global: &GlobalSettings) -> Option<ErrorPlan> {
    // Run for every request: nothing is cloned until a list with an error backend applies.
    let own = route.and_then(|r| r.policy.response.errors.as_deref());
    let (codes, backend, intercept) = match own {
        Some(pages) => (
            &pages.codes,
            pages.backend.as_ref().or(global.error_backend.as_ref())?,
            pages.intercept,
        ),
        None => (
            &global.custom_http_errors,
            global.error_backend.as_ref()?,
            !global.disable_intercept,
        ),
    };
    if codes.is_empty() {
        return None;
    }
    let (codes, backend) = (codes.clone(), backend.0.clone());
    let empty = || Arc::<str>::from("");
    Some(ErrorPlan {
        codes,
        backend,
        intercept,
        namespace: route.map_or_else(empty, |r| r.labels.namespace.clone()),
        ingress: route.map_or_else(empty, |r| r.labels.ingress.clone()),
        service: route.map_or_else(empty, |r| r.labels.service.clone()),
        port: route.map_or_else(empty, |r| Arc::from(r.backend.port.to_string())),
    })
}

impl ErrorPlan {
    /// Whether a response with `code` is replaced: `upstream` is true for the upstream's own
    /// response, false for one the proxy makes (no route, no endpoint, a failed upstream).
    pub(crate) fn wants(&self, code: u16, upstream: bool) -> bool {
        self.codes.binary_search(&code).is_ok() && (self.intercept || !upstream)
    }
}

/// What of the client's request the error backend is told.
#[derive(Clone, Debug)]
pub(crate) struct ErrorRequest {
    pub(crate) plan: ErrorPlan,
    /// HEAD asks with HEAD; everything else with GET.
    pub(crate) head: bool,
    /// The target as the client sent it (`X-Original-URI`, nginx's `$request_uri`).
    pub(crate) original_uri: String,
    /// The client's `Accept` (`X-Format`).
    pub(crate) accept: Option<HeaderValue>,
    pub(crate) request_id: String,
    /// The client's `Host` (nginx's `$best_http_host`).
    pub(crate) host: Option<String>,
    /// The client's address (`X-Forwarded-For`, nginx's `$remote_addr`).
    pub(crate) client: HeaderValue,
    /// The ConfigMap's (or the flags') `proxy-connect-timeout` and `proxy-read-timeout`, as
    /// ingress-nginx's error locations inherit them: the page must come within both.
    pub(crate) connect: Duration,
    pub(crate) read: Duration,
    /// How the connection the page came on is kept for the next one ([`keepalive`]).
    pub(crate) keepalive: Keepalive,
}

/// Marks a response that is an error page replacing the upstream's (HTTP/2 path): the
/// response phase's edits of the upstream's headers do not apply to it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Replaced;

/// The error backend's answer.
#[derive(Debug)]
pub(crate) struct Page {
    pub(crate) status: StatusCode,
    pub(crate) content_type: Option<HeaderValue>,
    pub(crate) body: Bytes,
    /// Its `Content-Length`: the body's, or for HEAD (no body) the one the backend announced,
    /// as nginx passes it on; `None` (no `Content-Length` at all) when a HEAD page's backend
    /// announced none, or something that is not one number: a length it would not stand by is
    /// not passed on, and an invented one (0) would be a lie about the GET's body.
    pub(crate) length: Option<u64>,
}

/// Idle connections to error backends, by endpoint: runtime state of the proxy, kept across
/// snapshots.
pub(crate) type PagePool = Kept<PoolKey>;

/// How connections to an error backend are kept: as the upstreams' (ingress-nginx's error
/// backend is one of its upstreams), by the ConfigMap's `upstream-keepalive-connections` and
/// `-timeout`, however many requests they carried.
pub(crate) fn keepalive(upstreams: &UpstreamKeepalive) -> Keepalive {
    Keepalive {
        connections: upstreams.max_idle,
        requests: u32::MAX,
        timeout: upstreams.idle_timeout,
    }
}

/// Asks the error backend for the page of `code`, within the request's connect and read
/// timeouts, on a kept connection when `pool` has one (a new one once if that fails). `None`
/// when it cannot answer (no endpoint, a failure, a timeout, a page over [`MAX_PAGE`]); the
/// caller then answers `code` itself.
pub(crate) async fn fetch(
    pool: &PagePool,
    request: &ErrorRequest,
    code: StatusCode,
) -> Option<Page> {
    let (plan, connect, read) = (&request.plan, request.connect, request.read);
    let key = match &plan.backend.target {
        Target::Endpoints(_) => PoolKey::Addr(plan.backend.pick(Balance::default())?.addr),
        Target::ExternalName(name) => PoolKey::Name(name.clone()),
        Target::Unavailable => return None,
    };
    let ask = async {
        // A kept connection the backend has just closed fails before it answers.
        if let Some(idle) = pool.checkout(&key, request.keepalive)
            && let Some((page, sender)) = ask_on(idle.sender, request, code).await
        {
            pool.checkin(&key, sender, idle.used + 1, request.keepalive);
            return Some(page);
        }
        let stream = connect::open(&key, connect).await.ok()?;
        let sender = kept::handshake(stream, "error backend").await.ok()?;
        let (page, sender) = ask_on(sender, request, code).await?;
        pool.checkin(&key, sender, 1, request.keepalive);
        Some(page)
    };
    let page = tokio::time::timeout(read + connect, ask)
        .await
        .ok()
        .flatten();
    if page.is_none() {
        tracing::debug!(backend = %plan.backend.service, code = code.as_u16(), "the error backend did not answer; the proxy's own page is sent");
    }
    page
}

/// One page on `sender`: the page, and the connection, free for the next one (its body was
/// read to the end; a page too large or broken costs the connection).
async fn ask_on(
    mut sender: Sender,
    request: &ErrorRequest,
    code: StatusCode,
) -> Option<(Page, Sender)> {
    sender.ready().await.ok()?;
    let response = sender.send_request(build(request, code)?).await.ok()?;
    let (parts, body) = response.into_parts();
    let body = Limited::new(body, MAX_PAGE)
        .collect()
        .await
        .ok()?
        .to_bytes();
    let announced = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        // Digits only: `u64::from_str` would take a leading `+`.
        .filter(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|v| v.parse::<u64>().ok());
    let page = Page {
        status: parts.status,
        content_type: parts.headers.get(header::CONTENT_TYPE).cloned(),
        length: if request.head {
            announced
        } else {
            Some(body.len() as u64)
        },
        body: if request.head { Bytes::new() } else { body },
    };
    Some((page, sender))
}

/// The request for the page, as ingress-nginx's `@custom_<upstream>_<code>` location makes it.
fn build(request: &ErrorRequest, code: StatusCode) -> Option<Request<Empty<Bytes>>> {
    let plan = &request.plan;
    let value = |s: &str| HeaderValue::from_str(s).unwrap_or_else(|_| HeaderValue::from_static(""));
    let host = request
        .host
        .clone()
        .unwrap_or_else(|| plan.backend.service.name.to_string());
    Request::builder()
        .method(if request.head { "HEAD" } else { "GET" })
        .uri("/")
        .header(header::HOST, value(&host))
        .header("x-code", code.as_str())
        .header(
            "x-format",
            request
                .accept
                .clone()
                .unwrap_or_else(|| HeaderValue::from_static("")),
        )
        .header("x-original-uri", value(&request.original_uri))
        .header("x-namespace", value(&plan.namespace))
        .header("x-ingress-name", value(&plan.ingress))
        .header("x-service-name", value(&plan.service))
        .header("x-service-port", value(&plan.port))
        .header("x-request-id", value(&request.request_id))
        .header("x-forwarded-for", request.client.clone())
        .body(Empty::new())
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::backend::PortRef;
    use crate::snapshot::policy::{ErrorPages, Fallback, RoutePolicy};
    use crate::snapshot::{Route, RouteLabels};
    use crate::store::ObjectKey;

    fn backend(name: &str) -> Arc<Backend> {
        Arc::new(Backend {
            service: ObjectKey::new("ns", name),
            port: PortRef::Number(80),
            target: Target::Unavailable,
            next: Default::default(),
            app_protocol: None,
        })
    }

    fn route(errors: Option<ErrorPages>) -> Arc<Route> {
        let mut policy = RoutePolicy::default();
        policy.response.errors = errors.map(Arc::new);
        Arc::new(Route {
            ingress: ObjectKey::new("ns", "web"),
            tls: false,
            backend: backend("app"),
            policy: Arc::new(policy),
            labels: RouteLabels {
                namespace: "ns".into(),
                ingress: "web".into(),
                service: "app".into(),
                path: "/".into(),
            },
        })
    }

    #[test]
    fn which_list_and_which_backend() {
        let global_backend = backend("global");
        let own_backend = backend("own");
        let with_global = GlobalSettings {
            custom_http_errors: Arc::from([404, 503]),
            error_backend: Some(Fallback(global_backend.clone())),
            ..GlobalSettings::default()
        };
        let list_only = GlobalSettings {
            custom_http_errors: Arc::from([404]),
            ..GlobalSettings::default()
        };
        let nothing = GlobalSettings::default();
        let own = |backend: Option<&Arc<Backend>>, intercept| ErrorPages {
            codes: Arc::from([418, 500]),
            backend: backend.cloned().map(Fallback),
            intercept,
        };
        // (route's own list, global, want: (codes, backend, intercept) or nothing)
        let cases: Vec<(
            Option<ErrorPages>,
            &GlobalSettings,
            Option<(&[u16], &str, bool)>,
        )> = vec![
            (None, &with_global, Some((&[404, 503], "global", true))),
            (None, &list_only, None),
            (None, &nothing, None),
            (
                Some(own(Some(&own_backend), true)),
                &with_global,
                Some((&[418, 500], "own", true)),
            ),
            (
                Some(own(None, true)),
                &with_global,
                Some((&[418, 500], "global", true)),
            ),
            (Some(own(None, true)), &list_only, None),
            (
                Some(own(Some(&own_backend), false)),
                &list_only,
                Some((&[418, 500], "own", false)),
            ),
            // An empty annotation overrides the ConfigMap's list: nothing is replaced.
            (
                Some(ErrorPages {
                    codes: Arc::from([]),
                    backend: None,
                    intercept: true,
                }),
                &with_global,
                None,
            ),
        ];
        for (i, (errors, global, want)) in cases.into_iter().enumerate() {
            let route = route(errors);
            let got = plan(Some(&route), global);
            let got = got
                .as_ref()
                .map(|p| (&*p.codes, &*p.backend.service.name, p.intercept));
            assert_eq!(got, want, "case {i}");
        }
        let unrouted = plan(None, &with_global).expect("the global list applies unrouted");
        assert_eq!(&*unrouted.ingress, "");
        let routed = plan(Some(&route(None)), &with_global).expect("global list");
        assert_eq!(
            (
                &*routed.namespace,
                &*routed.ingress,
                &*routed.service,
                &*routed.port
            ),
            ("ns", "web", "app", "80")
        );
    }

    #[test]
    fn intercept_only_judges_upstream_answers() {
        let mut plan = plan(
            None,
            &GlobalSettings {
                custom_http_errors: Arc::from([404, 503]),
                error_backend: Some(Fallback(backend("global"))),
                ..GlobalSettings::default()
            },
        )
        .expect("plan");
        assert!(plan.wants(404, true) && plan.wants(503, false));
        assert!(!plan.wants(500, true) && !plan.wants(500, false));
        plan.intercept = false;
        assert!(!plan.wants(404, true));
        assert!(plan.wants(503, false));
    }
}
