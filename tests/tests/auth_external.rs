//! External auth (`auth-url` and its companions) through the real binary with curl (HTTP/1.1
//! and h2c) and exact bytes, against an auth service the test starts
//! (`ingress_tests::auth_service`): what the subrequest carries, what each answer makes of the
//! request, oauth2-proxy's documented contract, the cache, keepalive, and every way the auth
//! service can fail, none of which may let a request through.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use ingress_tests::auth_service::AuthService;
use ingress_tests::curl::{self, VERSIONS};
use ingress_tests::manifests::{annotated_ingress, service};
use ingress_tests::path_tricks;
use ingress_tests::process::Ingress;
use ingress_tests::raw::exchange;
use ingress_tests::scratch::Scratch;
use ingress_tests::upstream::Backend;

const RESPONSE_HEADERS: &str =
    "X-Auth-Request-User, X-Auth-Request-Email, Authorization, X-Auth-Request-Groups";

struct Site {
    ingress: Ingress,
    auth: AuthService,
    app: Backend,
    admin: Backend,
    _dir: Scratch,
}

fn start() -> Site {
    let auth = AuthService::start();
    let app = Backend::start("app");
    let admin = Backend::start("admin");
    let dir = Scratch::new("auth-external");
    // A port nothing listens on: bound, then released.
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap()
    };
    let guarded = |name: &str, day: u8, host: &str, annotations: &[(&str, &str)]| {
        annotated_ingress("t", name, day, annotations, &[(host, "/", "Prefix", "app")])
    };
    let url = |path: &str| auth.url(path);
    let (ok, deny) = (url("/ok"), url("/deny"));
    let oauth2_url = format!("http://$host:{}/oauth2/auth", auth.addr.port());
    let manifests = [
        service("t", "app", &[&app]),
        service("t", "admin", &[&admin]),
        guarded(
            "ok",
            1,
            "ok.test",
            &[
                ("auth-url", &ok),
                ("auth-response-headers", RESPONSE_HEADERS),
            ],
        ),
        guarded("deny", 2, "deny.test", &[("auth-url", &deny)]),
        guarded(
            "signin",
            3,
            "signin.test",
            &[
                ("auth-url", &deny),
                ("auth-signin", "https://login.example/start"),
            ],
        ),
        // oauth2-proxy's documented ingress-nginx annotations, on a host that resolves.
        guarded(
            "oauth2",
            4,
            "localhost",
            &[
                ("auth-url", &oauth2_url),
                (
                    "auth-signin",
                    "https://$host/oauth2/start?rd=$escaped_request_uri",
                ),
                (
                    "auth-response-headers",
                    "X-Auth-Request-User,X-Auth-Request-Email,Authorization",
                ),
            ],
        ),
        guarded("forbid", 5, "forbid.test", &[("auth-url", &url("/forbid"))]),
        guarded("broken", 6, "broken.test", &[("auth-url", &url("/broken"))]),
        guarded("moved", 7, "moved.test", &[("auth-url", &url("/moved"))]),
        guarded(
            "slow",
            8,
            "slow.test",
            &[("auth-url", &url("/slow")), ("proxy-read-timeout", "1")],
        ),
        guarded(
            "refused",
            9,
            "refused.test",
            &[("auth-url", &format!("http://{closed}/ok"))],
        ),
        guarded("closes", 10, "closes.test", &[("auth-url", &url("/close"))]),
        guarded(
            "cached",
            11,
            "cached.test",
            &[
                ("auth-url", &url("/count")),
                ("auth-cache-key", "$http_authorization"),
                ("auth-cache-duration", "200 30s"),
                ("auth-response-headers", "X-Auth-Request-User"),
            ],
        ),
        guarded(
            "uncached",
            12,
            "uncached.test",
            &[
                ("auth-url", &url("/count")),
                ("auth-response-headers", "X-Auth-Request-User"),
            ],
        ),
        guarded(
            "kept",
            13,
            "kept.test",
            &[("auth-url", &ok), ("auth-keepalive", "4")],
        ),
        guarded(
            "always",
            14,
            "always.test",
            &[("auth-url", &ok), ("auth-always-set-cookie", "true")],
        ),
        guarded(
            "method",
            15,
            "method.test",
            &[
                (
                    "auth-url",
                    &format!("{ok}?from=$host&uri=$escaped_request_uri"),
                ),
                ("auth-method", "POST"),
                ("auth-request-redirect", "https://$host/back"),
            ],
        ),
        // Path tricks: `/` open, `/admin` behind an auth service that says no.
        annotated_ingress(
            "t",
            "tricks-open",
            16,
            &[],
            &[("tricks.test", "/", "Prefix", "app")],
        ),
        annotated_ingress(
            "t",
            "tricks-admin",
            17,
            &[("auth-url", &deny)],
            &[("tricks.test", "/admin", "Prefix", "admin")],
        ),
        // Refused: never served open.
        guarded(
            "configmap",
            18,
            "configmap.test",
            &[("auth-url", &ok), ("auth-proxy-set-headers", "t/headers")],
        ),
        guarded(
            "snippet",
            19,
            "snippet.test",
            &[
                ("auth-url", &ok),
                ("auth-snippet", "proxy_set_header X-A b;"),
            ],
        ),
        guarded(
            "badurl",
            20,
            "badurl.test",
            &[("auth-url", "auth.svc/check")],
        ),
        guarded(
            "badvar",
            21,
            "badvar.test",
            &[("auth-url", "http://$nonsense/check")],
        ),
        // auth-signin-redirect-param: the parameter the signin URL gets.
        guarded(
            "param",
            23,
            "param.test",
            &[
                ("auth-url", &deny),
                ("auth-signin", "https://login.example/start"),
                ("auth-signin-redirect-param", "return_to"),
            ],
        ),
        // A cache entry for a second; kept connections for two checks each, idle for a second.
        guarded(
            "brief",
            24,
            "brief.test",
            &[
                ("auth-url", &url("/count")),
                ("auth-cache-key", "$http_authorization"),
                ("auth-cache-duration", "200 1s"),
                ("auth-response-headers", "X-Auth-Request-User"),
            ],
        ),
        guarded(
            "recycled",
            25,
            "recycled.test",
            &[
                ("auth-url", &ok),
                ("auth-keepalive", "4"),
                ("auth-keepalive-requests", "2"),
                ("auth-keepalive-timeout", "1"),
            ],
        ),
        // satisfy any with an allow-list naming the client: the auth service is not asked.
        guarded(
            "any",
            22,
            "any.test",
            &[
                ("auth-url", &deny),
                ("auth-response-headers", "X-Auth-Request-User"),
                ("satisfy", "any"),
                ("allowlist-source-range", "127.0.0.1/32"),
            ],
        ),
    ]
    .concat();
    dir.write("all.yaml", &manifests);
    Site {
        ingress: Ingress::start(dir.path()),
        auth,
        app,
        admin,
        _dir: dir,
    }
}

#[test]
fn a_2xx_copies_the_response_headers_and_the_subrequest_is_ingress_nginxs() {
    let site = start();
    for version in VERSIONS {
        let before = site.auth.requests();
        let reply = curl::get(
            &site.ingress,
            "ok.test",
            "/app/page?q=1",
            version,
            &[
                "-H",
                "Authorization: Bearer from-client",
                "-H",
                "X-Auth-Request-Groups: admins",
                "-H",
                "X-Auth-Request-User: mallory",
                "-H",
                "Cookie: a=b",
                "-X",
                "POST",
                "--data-binary",
                "a body the auth service must not see",
            ],
        );
        assert_eq!(reply.backend(), "app", "{version}: {reply:?}");
        let echo = reply.echo().unwrap();
        let upstream = |name: &str| echo.headers.get(name).map(String::as_str);
        assert_eq!(upstream("x-auth-request-user"), Some("alice"), "{version}");
        assert_eq!(upstream("x-auth-request-email"), Some("alice@example.com"));
        assert_eq!(
            upstream("authorization"),
            Some("Bearer from-auth"),
            "{version}"
        );
        assert_eq!(
            upstream("x-auth-request-groups"),
            None,
            "{version}: a listed header the auth service did not send must not come from the client"
        );
        assert_eq!(
            echo.body_len, 36,
            "{version}: the body still reaches the backend"
        );
        assert_eq!(
            reply.header("set-cookie"),
            Some("session=fresh; Path=/"),
            "{version}"
        );

        assert_eq!(
            site.auth.requests(),
            before + 1,
            "{version}: one subrequest"
        );
        let seen = site.auth.seen().pop().unwrap();
        assert_eq!(seen.method, "GET", "{version}");
        assert_eq!(seen.path, "/ok", "{version}");
        assert!(
            seen.body.is_empty(),
            "{version}: the body went to the auth service"
        );
        let want = [
            ("host", "127.0.0.1"),
            ("x-original-url", "http://ok.test/app/page?q=1"),
            ("x-original-method", "POST"),
            ("x-sent-from", "nginx-ingress-controller"),
            ("x-real-ip", "127.0.0.1"),
            ("x-forwarded-for", "127.0.0.1"),
            ("x-auth-request-redirect", "/app/page?q=1"),
            ("authorization", "Bearer from-client"),
            ("cookie", "a=b"),
        ];
        for (name, value) in want {
            assert_eq!(seen.header(name), Some(value), "{version} {name}: {seen:?}");
        }
        for absent in ["content-length", "transfer-encoding", "x-forwarded-proto"] {
            assert_eq!(seen.header(absent), None, "{version} {absent}: {seen:?}");
        }
    }
    // auth-method, variables in auth-url, auth-request-redirect.
    let reply = curl::get(&site.ingress, "method.test", "/x%20y?a=1", "--http1.1", &[]);
    assert_eq!(reply.backend(), "app", "{reply:?}");
    let seen = site.auth.seen().pop().unwrap();
    assert_eq!(seen.method, "POST");
    assert_eq!(seen.path, "/ok?from=method.test&uri=%2Fx%2520y%3Fa%3D1");
    assert_eq!(seen.header("x-original-uri"), Some("/x%20y?a=1"));
    assert_eq!(seen.header("x-scheme"), Some("http"));
    assert_eq!(
        seen.header("x-auth-request-redirect"),
        Some("https://method.test/back")
    );
}

#[test]
fn denials_and_failures_never_reach_the_backend() {
    let site = start();
    for version in VERSIONS {
        let reply = curl::get(&site.ingress, "deny.test", "/", version, &[]);
        assert_eq!(reply.status, 401, "{version}: {reply:?}");
        assert_eq!(
            reply.header("www-authenticate"),
            Some("Bearer realm=\"auth\"")
        );
        assert_eq!(
            reply.header("set-cookie"),
            None,
            "{version}: without auth-always-set-cookie a 401 carries no cookie (nginx's add_header)"
        );

        let reply = curl::get(&site.ingress, "param.test", "/path?q=1", version, &[]);
        assert_eq!(reply.status, 302, "{version}: {reply:?}");
        assert_eq!(
            reply.header("location"),
            Some("https://login.example/start?return_to=http://param.test%2Fpath%3Fq%3D1"),
            "{version}: auth-signin-redirect-param"
        );

        let reply = curl::get(&site.ingress, "signin.test", "/path?q=1", version, &[]);
        assert_eq!(reply.status, 302, "{version}: {reply:?}");
        assert_eq!(
            reply.header("location"),
            Some("https://login.example/start?rd=http://signin.test%2Fpath%3Fq%3D1"),
            "{version}"
        );
        assert_eq!(
            reply.header("set-cookie"),
            Some("csrf=1; Path=/"),
            "{version}"
        );

        assert_eq!(
            curl::get(&site.ingress, "forbid.test", "/", version, &[]).status,
            403
        );
        for host in ["broken.test", "moved.test", "refused.test", "closes.test"] {
            let reply = curl::get(&site.ingress, host, "/", version, &[]);
            assert_eq!(reply.status, 500, "{version} {host}: {reply:?}");
        }
        let started = Instant::now();
        let reply = curl::get(&site.ingress, "slow.test", "/", version, &[]);
        assert_eq!(reply.status, 500, "{version} slow: {reply:?}");
        assert!(
            started.elapsed() < Duration::from_millis(2900),
            "{version}: the slow auth service was waited for: {:?}",
            started.elapsed()
        );
        for host in [
            "configmap.test",
            "snippet.test",
            "badurl.test",
            "badvar.test",
        ] {
            let reply = curl::get(&site.ingress, host, "/", version, &[]);
            assert_eq!(reply.status, 503, "{version} {host}: {reply:?}");
        }
    }
    // A gRPC client gets the denial as gRPC reads it.
    for (host, code) in [
        ("deny.test", "16"),
        ("forbid.test", "7"),
        ("broken.test", "2"),
    ] {
        let reply = curl::get(
            &site.ingress,
            host,
            "/pkg.Service/Method",
            "--http2-prior-knowledge",
            &["-H", "Content-Type: application/grpc", "-X", "POST"],
        );
        assert_eq!(reply.status, 200, "{host}: {reply:?}");
        assert_eq!(reply.header("grpc-status"), Some(code), "{host}: {reply:?}");
    }
    assert_eq!(
        site.app.served(),
        0,
        "a denied or failed check reached the backend"
    );
    let metric = |result| {
        site.ingress
            .metric(
                "ingress_auth_requests_total",
                &[("kind", "external"), ("result", result)],
            )
            .unwrap_or(0.0)
    };
    assert_eq!(metric("allowed"), 0.0);
    assert!(metric("denied") >= 4.0, "denied {}", metric("denied"));
    assert!(metric("forbidden") >= 2.0);
    assert!(metric("error") >= 10.0, "error {}", metric("error"));
    // satisfy any: the allow-listed client is not sent to the auth service at all.
    let before = site.auth.requests();
    for version in VERSIONS {
        let reply = curl::get(
            &site.ingress,
            "any.test",
            "/",
            version,
            &["-H", "X-Auth-Request-User: admin"],
        );
        assert_eq!(reply.backend(), "app", "{version}");
        assert_eq!(
            reply.echo().unwrap().headers.get("x-auth-request-user"),
            None,
            "{version}: a client's own X-Auth-Request-User reached the backend"
        );
    }
    assert_eq!(site.auth.requests(), before);
}

#[test]
fn oauth2_proxys_documented_integration_works() {
    let site = start();
    for version in VERSIONS {
        let reply = curl::get(&site.ingress, "localhost", "/dashboard?tab=1", version, &[]);
        assert_eq!(reply.status, 302, "{version}: {reply:?}");
        assert_eq!(
            reply.header("location"),
            Some("https://localhost/oauth2/start?rd=%2Fdashboard%3Ftab%3D1"),
            "{version}"
        );
        let reply = curl::get(
            &site.ingress,
            "localhost",
            "/dashboard",
            version,
            &["-H", "Cookie: _oauth2_proxy=good"],
        );
        assert_eq!(reply.backend(), "app", "{version}: {reply:?}");
        let echo = reply.echo().unwrap();
        assert_eq!(
            echo.headers.get("x-auth-request-user").map(String::as_str),
            Some("alice")
        );
        assert_eq!(
            echo.headers.get("authorization"),
            None,
            "{version}: listed, not answered, so not sent"
        );
        let seen = site.auth.seen().pop().unwrap();
        assert_eq!(seen.header("host"), Some("localhost"));
        assert_eq!(
            seen.header("x-original-url"),
            Some("http://localhost/dashboard")
        );
    }
}

#[test]
fn answers_are_cached_by_key_and_connections_kept_alive() {
    let site = start();
    let user = |host: &str, token: &str, version: &str| {
        let reply = curl::get(
            &site.ingress,
            host,
            "/",
            version,
            &["-H", &format!("Authorization: Bearer {token}")],
        );
        assert_eq!(reply.backend(), "app", "{host} {version}: {reply:?}");
        reply.echo().unwrap().headers["x-auth-request-user"].clone()
    };
    let before = site.auth.requests();
    let first = user("cached.test", "one", "--http1.1");
    for version in VERSIONS {
        assert_eq!(
            user("cached.test", "one", version),
            first,
            "{version}: cached"
        );
    }
    assert_eq!(
        site.auth.requests(),
        before + 1,
        "one subrequest for three requests"
    );
    assert_ne!(
        user("cached.test", "two", "--http1.1"),
        first,
        "another key asks again"
    );
    assert_eq!(site.auth.requests(), before + 2);
    // auth-cache-duration: an entry lives as long as its status's duration.
    let before = site.auth.requests();
    user("brief.test", "one", "--http1.1");
    user("brief.test", "one", "--http1.1");
    assert_eq!(site.auth.requests(), before + 1, "cached within the second");
    pause(std::time::Duration::from_millis(1200));
    user("brief.test", "one", "--http1.1");
    assert_eq!(
        site.auth.requests(),
        before + 2,
        "asked again once it expired"
    );
    // Without auth-cache-key every request asks.
    let a = user("uncached.test", "one", "--http1.1");
    let b = user("uncached.test", "one", "--http2-prior-knowledge");
    assert_ne!(a, b);
    assert!(
        site.ingress
            .metric(
                "ingress_auth_requests_total",
                &[("kind", "external"), ("result", "cached")]
            )
            .unwrap_or(0.0)
            >= 2.0
    );

    // auth-keepalive: sequential checks share a connection; without it, one each.
    let connections = site.auth.connections();
    for _ in 0..6 {
        let reply = curl::get(&site.ingress, "kept.test", "/", "--http1.1", &[]);
        assert_eq!(reply.backend(), "app");
    }
    let kept = site.auth.connections() - connections;
    assert!(kept <= 2, "{kept} connections for 6 kept-alive checks");
    // auth-keepalive-requests 2: a kept connection serves two checks, then a new one is made;
    // auth-keepalive-timeout 1: one idle longer is not reused.
    let connections = site.auth.connections();
    for _ in 0..6 {
        let reply = curl::get(&site.ingress, "recycled.test", "/", "--http1.1", &[]);
        assert_eq!(reply.backend(), "app");
    }
    assert_eq!(
        site.auth.connections() - connections,
        3,
        "two checks per kept connection"
    );
    let connections = site.auth.connections();
    curl::get(&site.ingress, "recycled.test", "/", "--http1.1", &[]);
    pause(std::time::Duration::from_millis(1500));
    curl::get(&site.ingress, "recycled.test", "/", "--http1.1", &[]);
    assert_eq!(
        site.auth.connections() - connections,
        2,
        "a connection idle past auth-keepalive-timeout is not reused"
    );
    let connections = site.auth.connections();
    for _ in 0..3 {
        let reply = curl::get(&site.ingress, "ok.test", "/", "--http1.1", &[]);
        assert_eq!(reply.backend(), "app");
    }
    assert_eq!(
        site.auth.connections() - connections,
        3,
        "no keepalive: one connection each"
    );
}

#[test]
fn cookies_follow_nginxs_add_header_rules() {
    let site = start();
    for version in VERSIONS {
        // The backend answers 500: nginx's add_header (without always) adds nothing then.
        let reply = curl::get(&site.ingress, "ok.test", "/?status=500", version, &[]);
        assert_eq!(reply.status, 500, "{version}");
        assert_eq!(reply.header("set-cookie"), None, "{version}");
        let reply = curl::get(&site.ingress, "always.test", "/?status=500", version, &[]);
        assert_eq!(reply.status, 500, "{version}");
        assert_eq!(
            reply.header("set-cookie"),
            Some("session=fresh; Path=/"),
            "{version}"
        );
    }
}

#[test]
fn path_tricks_do_not_skip_the_auth_service() {
    let site = start();
    let denied = site.auth.requests();
    // The edge-hardening corpus: each target refused (400), denied by the auth service (401)
    // or routed to the open backend.
    for target in path_tricks::toward("admin", "open") {
        let target = target.as_str();
        let raw = format!("GET {target} HTTP/1.1\r\nHost: tricks.test\r\n\r\n");
        let reply = exchange(site.ingress.http, raw.as_bytes());
        assert!(
            matches!(reply.status, 400 | 401) || reply.echo().backend == "app",
            "{target}: {} {}",
            reply.status,
            reply.text()
        );
        for version in VERSIONS
            .iter()
            .filter(|_| path_tricks::curl_can_send(target))
        {
            let reply = curl::get(&site.ingress, "tricks.test", target, version, &[]);
            assert!(
                matches!(reply.status, 400 | 401) || reply.backend() == "app",
                "{version} {target}: {reply:?}"
            );
        }
    }
    assert_eq!(
        site.admin.served(),
        0,
        "a trick reached the protected backend"
    );
    assert!(site.auth.requests() > denied, "the auth service was asked");
}

#[test]
fn an_https_auth_service_is_reached_over_tls() {
    use ingress_tests::https_upstream::{HttpsBackend, HttpsOptions};
    use ingress_tests::pki::Ca;
    let ca = Ca::new("auth CA");
    let leaf = ca.server("auth.example", &["auth.example"]);
    // The echo answers 200 to anything: every check passes, over TLS.
    let service = HttpsBackend::start("auth", &leaf, HttpsOptions::default());
    let app = Backend::start("app");
    let dir = Scratch::new("auth-external-https");
    let url = format!("https://{}/check", service.addr);
    dir.write(
        "all.yaml",
        &[
            service_manifest(&app),
            annotated_ingress(
                "t",
                "tls",
                1,
                &[("auth-url", &url)],
                &[("tls.test", "/", "Prefix", "app")],
            ),
        ]
        .concat(),
    );
    let ingress = Ingress::start(dir.path());
    for version in VERSIONS {
        let reply = curl::get(&ingress, "tls.test", "/", version, &[]);
        assert_eq!(reply.backend(), "app", "{version}: {reply:?}");
    }
    assert_eq!(
        service.served(),
        2,
        "each check went to the HTTPS auth service"
    );
    assert!(!service.handshakes().is_empty());
}

fn service_manifest(app: &Backend) -> String {
    service("t", "app", &[app])
}

/// Waits out a cache entry's or an idle connection's lifetime; these tests are synchronous.
#[expect(
    clippy::disallowed_methods,
    reason = "a plain #[test] with no runtime: a blocking sleep is what it should do"
)]
fn pause(how_long: std::time::Duration) {
    std::thread::sleep(how_long);
}
