//! The request is what is routed, and what is routed is what the upstream reads: each way a
//! client could make the two differ, sent as exact bytes to the real binary.
//!
//! ```text
//!   t.example  /admin → admin      p.example  /public → public      (nothing else on p.example)
//!              /      → public
//! ```
//!
//! Every refused request must reach no backend at all, so each case checks the backends'
//! request counters as well as the status.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::disallowed_methods)]

use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use ingress_tests::manifests::{ingress, service, service_at};
use ingress_tests::path_tricks;
use ingress_tests::pki::{Ca, secret_yaml};
use ingress_tests::process::Ingress;
use ingress_tests::raw::{RawConn, exchange, get};
use ingress_tests::scratch::Scratch;
use ingress_tests::scripted::{Answer, Scripted};
use ingress_tests::upstream::Backend;

struct Site {
    ingress: Ingress,
    public: Backend,
    admin: Backend,
    _dir: Scratch,
}

impl Site {
    fn start(name: &str, args: &[&str]) -> Site {
        let (public, admin) = (Backend::start("public"), Backend::start("admin"));
        let dir = Scratch::new(name);
        dir.write(
            "a.yaml",
            &(service("t", "public", &[&public])
                + &service("t", "admin", &[&admin])
                + &ingress(
                    "t",
                    "gated",
                    &[
                        ("t.example", "/admin", "Prefix", "admin"),
                        ("t.example", "/", "Prefix", "public"),
                    ],
                )
                + &ingress(
                    "t",
                    "narrow",
                    &[("p.example", "/public", "Prefix", "public")],
                )),
        );
        let ingress = Ingress::builder()
            .manifests(dir.path())
            .args(args.iter().copied())
            .start();
        Site {
            ingress,
            public,
            admin,
            _dir: dir,
        }
    }

    /// Sends `raw`, expects `status`, and that no backend saw anything.
    fn refused(&self, raw: &str, status: u16) {
        let before = (self.public.served(), self.admin.served());
        let mut conn = RawConn::connect(self.ingress.http);
        let reply = conn.exchange(raw.as_bytes());
        assert_eq!(reply.status, status, "{raw:?}: {}", reply.text());
        assert_eq!(
            (self.public.served(), self.admin.served()),
            before,
            "{raw:?} reached a backend"
        );
        assert!(
            conn.closes_within(Duration::from_secs(2)).is_some(),
            "{raw:?}: the connection stays open after a refusal"
        );
    }

    /// Sends `raw` and returns which backend answered and the URI it saw.
    fn routed(&self, raw: &str) -> (String, String) {
        let reply = exchange(self.ingress.http, raw.as_bytes());
        assert_eq!(reply.status, 200, "{raw:?}: {}", reply.text());
        let echo = reply.echo();
        (echo.backend, echo.uri)
    }
}

#[test]
fn a_fragment_or_a_byte_uris_forbid_is_refused_before_routing() {
    let site = Site::start("edge-fragment", &[]);
    for target in [
        "/admin/secret#/../../x",
        "/internal#/../public",
        "/a#b",
        "/a?b#c",
        "/a{b}",
        "/a\\b",
        "/a\"b",
        "/a<b>",
        "/a|b",
        "/a^b",
        "/a`b",
        "/caf\u{e9}",
        "/a%zz",
        "/a%00b",
    ] {
        let host = if target.contains("internal") {
            "p.example"
        } else {
            "t.example"
        };
        site.refused(&get(host, target), 400);
    }
    // What browsers send unescaped in a query still works; a quote is not among it.
    assert_eq!(
        site.routed(&get("t.example", "/x?q={a}|b^c`d\\e")),
        ("public".into(), "/x?q={a}|b^c`d\\e".into())
    );
    site.refused(&get("t.example", "/x?q=\"a\""), 400);
}

#[test]
fn what_is_routed_is_what_the_upstream_reads() {
    let site = Site::start("edge-paths", &[]);
    let cases: &[(&str, &str, &str, &str)] = &[
        ("t.example", "/admin/x", "admin", "/admin/x"),
        ("t.example", "/public/../admin/x", "admin", "/admin/x"),
        ("t.example", "/public/%2e%2e/admin/x", "admin", "/admin/x"),
        ("t.example", "//admin//x", "admin", "/admin/x"),
        ("t.example", "/ADMIN/x", "public", "/ADMIN/x"),
        ("t.example", "/adm%69n/x?y=1", "admin", "/admin/x?y=1"),
        ("p.example", "/public/./x//y/../z", "public", "/public/x/z"),
        // An encoded slash inside a segment that routes the same either way: kept encoded.
        ("p.example", "/public/a%2fb", "public", "/public/a%2Fb"),
    ];
    for (host, target, backend, uri) in cases {
        assert_eq!(
            site.routed(&get(host, target)),
            (backend.to_string(), uri.to_string()),
            "{host}{target}"
        );
    }
    // Decoding the slash would route these elsewhere (or nowhere): refused.
    site.refused(&get("p.example", "/public/..%2Finternal"), 400);
    site.refused(&get("p.example", "/public/..%2finternal"), 400);
    site.refused(&get("p.example", "/public/..%5Cinternal"), 400);
    site.refused(&get("t.example", "/x/..%2Fadmin/secret"), 400);
    // Dot-segments a Java server reads with their parameters, and paths above the root.
    site.refused(&get("p.example", "/public/..;/admin"), 400);
    site.refused(&get("t.example", "/../admin"), 400);
    site.refused(&get("t.example", "/a/%2e%2e/%2e%2e/admin"), 400);
    // The shared corpus the access-control tests aim at their protected paths: each refused,
    // or normalised to the path it names.
    for template in path_tricks::REFUSED {
        let target = path_tricks::fill(template, "admin", "public");
        site.refused(&get("t.example", &target), 400);
    }
    for (template, normal) in path_tricks::NORMALISED {
        let target = path_tricks::fill(template, "admin", "public");
        let normal = path_tricks::fill(normal, "admin", "public");
        assert_eq!(
            site.routed(&get("t.example", &target)),
            ("admin".to_string(), normal),
            "{target}"
        );
    }
}

#[test]
fn escaped_slashes_as_configured() {
    let reject = Site::start("edge-slash-reject", &["--escaped-slashes", "reject"]);
    reject.refused(&get("p.example", "/public/a%2Fb"), 400);
    reject.refused(&get("p.example", "/public/a%5cb"), 400);
    assert_eq!(
        reject.routed(&get("p.example", "/public/a/b")).1,
        "/public/a/b"
    );

    let unescape = Site::start("edge-slash-unescape", &["--escaped-slashes", "unescape"]);
    assert_eq!(
        unescape.routed(&get("p.example", "/public/a%2Fb")),
        ("public".into(), "/public/a/b".into())
    );
    assert_eq!(
        unescape.routed(&get("t.example", "/x/..%2Fadmin/y")),
        ("admin".into(), "/admin/y".into())
    );
    let reply = exchange(
        unescape.ingress.http,
        get("p.example", "/public/..%2Finternal").as_bytes(),
    );
    assert_eq!(
        reply.status, 404,
        "routed as /internal, which p.example has not"
    );

    let unmerged = Site::start("edge-slash-unmerged", &["--merge-slashes", "false"]);
    assert_eq!(
        unmerged.routed(&get("p.example", "/public//x")).1,
        "/public//x"
    );
}

#[test]
fn one_host_is_routed_and_the_same_host_is_forwarded() {
    let site = Site::start("edge-host", &[]);
    site.refused(
        "GET /admin HTTP/1.1\r\nHost: p.example\r\nHost: t.example\r\n\r\n",
        400,
    );
    site.refused(
        "GET /admin HTTP/1.1\r\nHost: t.example\r\nHost: t.example\r\n\r\n",
        400,
    );
    site.refused("GET /admin HTTP/1.1\r\n\r\n", 400);
    site.refused(
        "GET /admin HTTP/1.1\r\nHost: t.example:80@evil\r\n\r\n",
        400,
    );
    site.refused("GET /admin HTTP/1.1\r\nHost: evil@t.example\r\n\r\n", 400);
    site.refused(
        "GET /admin HTTP/1.1\r\nHost: t.example, p.example\r\n\r\n",
        400,
    );
    site.refused(
        "GET http://evil@t.example/admin HTTP/1.1\r\nHost: t.example\r\n\r\n",
        400,
    );
    // The absolute-form target's authority replaces Host, and is the Host forwarded.
    let reply = exchange(
        site.ingress.http,
        b"GET http://t.example/admin/x HTTP/1.1\r\nHost: p.example\r\n\r\n",
    );
    assert_eq!(reply.status, 200);
    let echo = reply.echo();
    assert_eq!(
        (echo.backend.as_str(), echo.uri.as_str()),
        ("admin", "/admin/x")
    );
    assert_eq!(
        echo.headers.get("host").map(String::as_str),
        Some("t.example")
    );
    assert_eq!(
        echo.headers.get("x-forwarded-host").map(String::as_str),
        Some("t.example")
    );
    // HTTP/1.0 without Host names no virtual host: nothing here serves that.
    let reply = exchange(site.ingress.http, b"GET /admin HTTP/1.0\r\n\r\n");
    assert_eq!(reply.status, 404);
}

/// An HTTP/2 request over a plain connection (h2c prior knowledge), with `:authority` from
/// `uri` and any extra headers.
async fn h2c(addr: std::net::SocketAddr, uri: &str, headers: &[(&str, &str)]) -> (u16, Bytes) {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    h2_over(stream, uri, headers).await
}

async fn h2_over<S>(stream: S, uri: &str, headers: &[(&str, &str)]) -> (u16, Bytes)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(stream),
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    let mut req = Request::get(uri);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let response = sender
        .send_request(req.body(Full::new(Bytes::new())).unwrap())
        .await
        .unwrap();
    let status = response.status().as_u16();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, body)
}

#[tokio::test(flavor = "multi_thread")]
async fn http2_requests_follow_the_same_rules() {
    let site = Site::start("edge-h2", &[]);
    let addr = site.ingress.http;
    let (status, body) = h2c(addr, "http://t.example/admin/x", &[]).await;
    assert_eq!(status, 200, "{body:?}");
    let echo: ingress_tests::upstream::Echo = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        (echo.backend.as_str(), echo.uri.as_str()),
        ("admin", "/admin/x")
    );

    let before = (site.public.served(), site.admin.served());
    // :authority and host disagree.
    let (status, _) = h2c(addr, "http://p.example/admin/x", &[("host", "t.example")]).await;
    assert_eq!(status, 400, "host differs from :authority");
    // Bytes a URI may not hold, which the http crate lets through.
    for path in ["/a{b}", "/a\"b", "/a|b", "/a^b", "/a\\b"] {
        let (status, _) = h2c(addr, &format!("http://t.example{path}"), &[]).await;
        assert_eq!(status, 400, "{path}");
    }
    let (status, _) = h2c(addr, "http://p.example/public/..%2Finternal", &[]).await;
    assert_eq!(status, 400);
    let (status, _) = h2c(addr, "http://t.example:80@evil/admin", &[]).await;
    assert_eq!(status, 400, "userinfo in :authority");
    assert_eq!((site.public.served(), site.admin.served()), before);

    let (status, body) = h2c(addr, "http://t.example/public/../admin/y", &[]).await;
    assert_eq!(status, 200);
    let echo: ingress_tests::upstream::Echo = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        (echo.backend.as_str(), echo.uri.as_str()),
        ("admin", "/admin/y")
    );
}

/// Two tenants with certificates of their own, and one certificate that covers two names.
struct Tenants {
    ingress: Ingress,
    ca: Ca,
    web: Backend,
    _dir: Scratch,
}

fn tls_ingress(host: &str, secret: &str) -> String {
    format!(
        "---\napiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {{name: {host}, namespace: t}}\nspec:\n  ingressClassName: ingress\n  tls: [{{hosts: [\"{host}\"], secretName: {secret}}}]\n  rules:\n  - host: \"{host}\"\n    http: {{paths: [{{path: /, pathType: Prefix, backend: {{service: {{name: web, port: {{number: 80}}}}}}}}]}}\n"
    )
}

impl Tenants {
    fn start(name: &str, args: &[&str]) -> Tenants {
        let web = Backend::start("web");
        let ca = Ca::new("edge CA");
        let leaf = |n: &[&str]| ca.server(n[0], n);
        let (a, b, shared) = (
            leaf(&["a.example"]),
            leaf(&["b.example"]),
            leaf(&["c.example", "d.example"]),
        );
        let dir = Scratch::new(name);
        dir.write(
            "a.yaml",
            &(service("t", "web", &[&web])
                + &secret_yaml("t", "a", &a.chain, &a.key)
                + &secret_yaml("t", "b", &b.chain, &b.key)
                + &secret_yaml("t", "cd", &shared.chain, &shared.key)
                + &tls_ingress("a.example", "a")
                + &tls_ingress("b.example", "b")
                + &tls_ingress("c.example", "cd")
                + &tls_ingress("d.example", "cd")
                + &ingress("t", "plain", &[("plain.example", "/", "Prefix", "web")])),
        );
        let ingress = Ingress::builder()
            .manifests(dir.path())
            .args(args.iter().copied())
            .start();
        Tenants {
            ingress,
            ca,
            web,
            _dir: dir,
        }
    }

    /// The status of `GET / Host: host` on a TLS connection that sent `sni`.
    fn status(&self, sni: Option<&str>, host: &str) -> u16 {
        let config = match sni {
            Some(_) => self.ca.client_config(&[b"http/1.1"]),
            None => ingress_tests::pki::any_server_config(&[b"http/1.1"]),
        };
        let mut conn = RawConn::connect_tls(self.ingress.https, sni, config);
        conn.exchange(get(host, "/").as_bytes()).status
    }
}

#[test]
fn a_tls_connection_only_reaches_hosts_its_certificate_was_chosen_for() {
    let t = Tenants::start("edge-sni", &[]);
    let cases: &[(Option<&str>, &str, u16)] = &[
        (Some("a.example"), "a.example", 200),
        (Some("a.example"), "A.Example:443", 200),
        (Some("a.example"), "b.example", 421),
        (Some("b.example"), "a.example", 421),
        // One certificate for both names: a browser may coalesce them on one connection.
        (Some("c.example"), "d.example", 200),
        (Some("c.example"), "a.example", 421),
        // A host with no certificate of its own is served the default one; so is no SNI.
        (Some("a.example"), "plain.example", 421),
        (None, "plain.example", 200),
        (None, "127.0.0.1", 404),
        (None, "a.example", 421),
    ];
    let before = t.web.served();
    for (sni, host, want) in cases {
        assert_eq!(t.status(*sni, host), *want, "sni {sni:?} host {host}");
    }
    let served = cases.iter().filter(|c| c.2 == 200).count();
    assert_eq!(t.web.served() - before, served, "421s reached the backend");

    let lax = Tenants::start("edge-sni-any", &["--no-sni-requests", "any"]);
    assert_eq!(lax.status(None, "a.example"), 200);
    assert_eq!(lax.status(Some("a.example"), "b.example"), 421);
}

#[tokio::test(flavor = "multi_thread")]
async fn http2_over_tls_is_misdirected_the_same_way() {
    let t = Tenants::start("edge-sni-h2", &[]);
    let config = t.ca.client_config(&[b"h2"]);
    let connector = tokio_rustls::TlsConnector::from(config);
    let tls = |sni: &'static str| {
        let connector = connector.clone();
        let addr = t.ingress.https;
        async move {
            let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
            let name = rustls::pki_types::ServerName::try_from(sni).unwrap();
            connector.connect(name, tcp).await.unwrap()
        }
    };
    let (status, _) = h2_over(tls("a.example").await, "https://a.example/", &[]).await;
    assert_eq!(status, 200);
    let (status, _) = h2_over(tls("a.example").await, "https://b.example/", &[]).await;
    assert_eq!(status, 421);
    let (status, _) = h2_over(tls("c.example").await, "https://d.example/", &[]).await;
    assert_eq!(status, 200);
}

#[test]
fn only_allowed_protocols_may_switch() {
    let web = Backend::start("web");
    let dir = Scratch::new("edge-upgrade");
    let allow_h2c = "---\napiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {name: h2c, namespace: t, annotations: {ingress.rs/upgrades: \"websocket, h2c\"}}\nspec:\n  ingressClassName: ingress\n  rules:\n  - host: h2c.example\n    http: {paths: [{path: /, pathType: Prefix, backend: {service: {name: web, port: {number: 80}}}}]}\n";
    dir.write(
        "a.yaml",
        &(service("t", "web", &[&web])
            + &ingress("t", "plain", &[("u.example", "/", "Prefix", "web")])
            + allow_h2c),
    );
    let ingress = Ingress::start(dir.path());
    // h2c is not allowed here: the backend (which switches to anything it is asked for) sees
    // an ordinary request, without Upgrade.
    let reply = exchange(
        ingress.http,
        b"GET / HTTP/1.1\r\nHost: u.example\r\nUpgrade: h2c\r\nConnection: Upgrade, HTTP2-Settings\r\nHTTP2-Settings: AAMAAABkAAQAAP__\r\n\r\n",
    );
    assert_eq!(reply.status, 200);
    let echo = reply.echo();
    assert!(!echo.headers.contains_key("upgrade"), "{:?}", echo.headers);
    assert!(!echo.headers.contains_key("http2-settings"));
    // A mixed offer is not allowed either.
    let reply = exchange(
        ingress.http,
        b"GET / HTTP/1.1\r\nHost: u.example\r\nUpgrade: websocket, h2c\r\nConnection: Upgrade\r\n\r\n",
    );
    assert_eq!(reply.status, 200);
    // WebSocket is, and the tunnel carries bytes both ways.
    let mut conn = RawConn::connect(ingress.http);
    let reply = conn.exchange(
        b"GET /ws HTTP/1.1\r\nHost: u.example\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
    );
    assert_eq!(reply.status, 101);
    assert_eq!(reply.header("upgrade"), Some("websocket"));
    conn.send(b"hello through the tunnel");
    let mut echoed = [0u8; 24];
    conn.read_exact(&mut echoed);
    assert_eq!(&echoed, b"hello through the tunnel");
    // Where an operator allowed h2c, it switches.
    let reply = exchange(
        ingress.http,
        b"GET / HTTP/1.1\r\nHost: h2c.example\r\nUpgrade: h2c\r\nConnection: Upgrade, HTTP2-Settings\r\nHTTP2-Settings: AAMAAABkAAQAAP__\r\n\r\n",
    );
    assert_eq!(reply.status, 101);
}

#[test]
fn headers_the_proxy_sets_cannot_be_spoofed() {
    let site = Site::start("edge-trust", &[]);
    let reply = exchange(
        site.ingress.http,
        concat!(
            "GET /x?y=1 HTTP/1.1\r\nHost: t.example\r\n",
            "X-Forwarded-For: 203.0.113.9\r\n",
            "X-Real-IP: 203.0.113.9\r\n",
            "X-Forwarded-Proto: https\r\n",
            "X-Forwarded-Scheme: https\r\n",
            "X-Scheme: https\r\n",
            "X-Forwarded-Host: admin.internal\r\n",
            "X-Forwarded-Port: 443\r\n",
            "X-Original-URI: /admin\r\n",
            "X-Forwarded-Prefix: /admin\r\n",
            "Forwarded: for=203.0.113.9;proto=https\r\n",
            "X_Forwarded_For: 203.0.113.9\r\n",
            "X-Auth_User: root\r\n",
            "Proxy: http://evil.example\r\n",
            "X-Keep: kept\r\n",
            "\r\n"
        )
        .as_bytes(),
    );
    assert_eq!(reply.status, 200);
    let echo = reply.echo();
    let h = |name: &str| echo.headers.get(name).map(String::as_str);
    let port = site.ingress.http.port().to_string();
    let expected: &[(&str, Option<&str>)] = &[
        ("x-forwarded-for", Some("127.0.0.1")),
        ("x-original-forwarded-for", Some("203.0.113.9")),
        ("x-real-ip", Some("127.0.0.1")),
        ("x-forwarded-proto", Some("http")),
        ("x-forwarded-scheme", Some("http")),
        ("x-scheme", Some("http")),
        ("x-forwarded-host", Some("t.example")),
        ("x-forwarded-port", Some(port.as_str())),
        ("x-original-uri", Some("/x?y=1")),
        ("x-forwarded-prefix", None),
        ("forwarded", None),
        ("x_forwarded_for", None),
        ("x-auth_user", None),
        ("proxy", None),
        ("x-keep", Some("kept")),
    ];
    for (name, want) in expected {
        assert_eq!(h(name), *want, "{name}");
    }

    // Allowed underscores pass, but never as a header the proxy sets or drops: a backend that
    // reads `_` as `-` (CGI, WSGI, Rack, PHP) would believe these over the proxy's own.
    let lax = Site::start("edge-underscores", &["--enable-underscores-in-headers"]);
    let reply = exchange(
        lax.ingress.http,
        concat!(
            "GET / HTTP/1.1\r\n",
            "Host: t.example\r\n",
            "X-Auth_User: root\r\n",
            "X_Real_IP: 203.0.113.9\r\n",
            "X_Forwarded_For: 203.0.113.9\r\n",
            "x-forwarded_proto: https\r\n",
            "ssl_client_verify: SUCCESS\r\n",
            "SSL_CLIENT_SUBJECT_DN: CN=admin\r\n",
            "X_Forwarded_Prefix: /admin\r\n",
            "Content_Length: 5\r\n",
            "\r\n"
        )
        .as_bytes(),
    );
    let echo = reply.echo();
    let h = |name: &str| echo.headers.get(name).map(String::as_str);
    assert_eq!(h("x-auth_user"), Some("root"));
    assert_eq!(h("x-real-ip"), Some("127.0.0.1"));
    for name in [
        "x_real_ip",
        "x_forwarded_for",
        "x-forwarded_proto",
        "ssl_client_verify",
        "ssl_client_subject_dn",
        "x_forwarded_prefix",
        "content_length",
    ] {
        assert_eq!(h(name), None, "{name}");
    }
}

/// The classic request-smuggling vectors: each is refused, or framed one way only, and the
/// upstream never reads a request the proxy did not route.
#[test]
fn smuggling_vectors_never_reach_an_upstream_ambiguously() {
    let site = Site::start("edge-smuggling", &[]);
    let smuggled = "GET /admin/smuggled HTTP/1.1\r\nHost: t.example\r\n\r\n";
    let refused: &[(&str, u16)] = &[
        // CL.TE and TE.CL.
        (
            "POST / HTTP/1.1\r\nHost: t.example\r\nContent-Length: 6\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nX",
            400,
        ),
        (
            "POST / HTTP/1.1\r\nHost: t.example\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n8\r\nSMUGGLED\r\n0\r\n\r\n",
            400,
        ),
        // TE.TE obfuscations.
        (
            "POST / HTTP/1.1\r\nHost: t.example\r\nTransfer-Encoding: xchunked\r\n\r\n0\r\n\r\n",
            501,
        ),
        (
            "POST / HTTP/1.1\r\nHost: t.example\r\nTransfer-Encoding : chunked\r\n\r\n0\r\n\r\n",
            400,
        ),
        (
            "POST / HTTP/1.1\r\nHost: t.example\r\nTransfer-Encoding: chunked\r\nTransfer-encoding: x\r\n\r\n0\r\n\r\n",
            501,
        ),
        (
            "POST / HTTP/1.1\r\nHost: t.example\r\nTransfer-Encoding:\tchunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
            400,
        ),
        (
            "POST / HTTP/1.1\r\nHost: t.example\r\nTransfer-Encoding: chunked, identity\r\n\r\n0\r\n\r\n",
            501,
        ),
        (
            "POST / HTTP/1.1\r\nHost: t.example\r\nTransfer-Encoding:\r\n chunked\r\n\r\n0\r\n\r\n",
            400,
        ),
        (
            "POST / HTTP/1.1\r\nHost: t.example\r\nX: y\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
            200,
        ),
        (
            "POST / HTTP/1.0\r\nHost: t.example\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
            400,
        ),
        // Content-Length tricks.
        (
            "POST / HTTP/1.1\r\nHost: t.example\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!",
            400,
        ),
        (
            "POST / HTTP/1.1\r\nHost: t.example\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello",
            400,
        ),
        (
            "POST / HTTP/1.1\r\nHost: t.example\r\nContent-Length: 5, 5\r\n\r\nhello",
            400,
        ),
        (
            "POST / HTTP/1.1\r\nHost: t.example\r\nContent-Length: +5\r\n\r\nhello",
            400,
        ),
        (
            "POST / HTTP/1.1\r\nHost: t.example\r\nContent-Length: 5 \r\n\r\nhello",
            200,
        ),
        (
            "POST / HTTP/1.1\r\nHost: t.example\r\nContent-Length: 0x05\r\n\r\nhello",
            400,
        ),
        // obs-fold, bare CR, a space before the colon, a NUL.
        (
            "GET / HTTP/1.1\r\nHost: t.example\r\nX: a\r\n b\r\n\r\n",
            400,
        ),
        ("GET / HTTP/1.1\r\nHost: t.example\r\nX: a\rb\r\n\r\n", 400),
        ("GET / HTTP/1.1\r\nHost : t.example\r\n\r\n", 400),
        ("GET / HTTP/1.1\r\nHost: t.example\r\nX: \0\r\n\r\n", 400),
        // Chunk-size and chunk-extension tricks.
        (
            "POST / HTTP/1.1\r\nHost: t.example\r\nTransfer-Encoding: chunked\r\n\r\n0x5\r\nhello\r\n0\r\n\r\n",
            400,
        ),
        (
            "POST / HTTP/1.1\r\nHost: t.example\r\nTransfer-Encoding: chunked\r\n\r\n-5\r\nhello\r\n0\r\n\r\n",
            400,
        ),
        (
            "POST / HTTP/1.1\r\nHost: t.example\r\nTransfer-Encoding: chunked\r\n\r\n5 xyz\r\nhello\r\n0\r\n\r\n",
            400,
        ),
        (
            "POST / HTTP/1.1\r\nHost: t.example\r\nTransfer-Encoding: chunked\r\n\r\n1;a\nb\r\nX\r\n0\r\n\r\n",
            400,
        ),
        (
            "POST / HTTP/1.1\r\nHost: t.example\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhelloXX0\r\n\r\n",
            400,
        ),
        (
            "POST / HTTP/1.1\r\nHost: t.example\r\nTransfer-Encoding: chunked\r\n\r\n10000000000000000\r\n",
            400,
        ),
        (
            "POST / HTTP/1.1\r\nHost: t.example\r\nTransfer-Encoding: chunked\r\n\r\n5\nhello\n0\n\n",
            400,
        ),
    ];
    for (request, status) in refused {
        let before = site.admin.served();
        let mut conn = RawConn::connect(site.ingress.http);
        conn.send(request.as_bytes());
        conn.send(smuggled.as_bytes());
        let reply = conn.reply();
        assert_eq!(reply.status, *status, "{request:?}: {}", reply.text());
        if *status == 200 {
            // Framed one way: the next request on the connection is the proxy's to route.
            let next = conn.reply();
            assert_eq!(next.echo().uri, "/admin/smuggled", "{request:?}");
        } else {
            assert!(
                conn.closes_within(Duration::from_secs(5)).is_some(),
                "{request:?}: still open after a refusal"
            );
            assert_eq!(
                site.admin.served(),
                before,
                "{request:?} smuggled a request"
            );
        }
    }
    // A chunked body arrives re-encoded: what the upstream reads is what the proxy read.
    let reply = exchange(
        site.ingress.http,
        b"POST / HTTP/1.1\r\nHost: t.example\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=\"a;b\"\r\nhello\r\n6\r\n world\r\n0\r\nTrailer-Smuggle: x\r\n\r\n",
    );
    assert_eq!(reply.status, 200);
    assert_eq!(reply.echo().body_len, 11);
}

#[test]
fn upstream_responses_are_cleaned_before_the_client_sees_them() {
    let upstream = Scripted::start(|seen| {
        Answer::Bytes(match seen.path.as_str() {
            "/no-content" => b"HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\n".to_vec(),
            "/continue" => b"HTTP/1.1 100 Continue\r\nContent-Length: 3\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok".to_vec(),
            "/status-99" => b"HTTP/1.1 099 Odd\r\nContent-Length: 2\r\n\r\nok".to_vec(),
            "/status-600" => b"HTTP/1.1 600 Odd\r\nContent-Length: 2\r\n\r\nok".to_vec(),
            "/both" => format!("HTTP/1.1 200 OK\r\nX-Connection: {}\r\nTransfer-Encoding: chunked\r\nContent-Length: 100\r\n\r\n2\r\nok\r\n0\r\n\r\n", seen.connection).into_bytes(),
            "/gzip-chunked" => b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n".to_vec(),
            _ => format!("HTTP/1.1 200 OK\r\nX-Connection: {}\r\nContent-Length: 4\r\n\r\nfine", seen.connection).into_bytes(),
        })
    });
    let dir = Scratch::new("edge-responses");
    dir.write(
        "a.yaml",
        &(service_at("t", "up", &[upstream.addr])
            + &ingress("t", "r", &[("r.example", "/", "Prefix", "up")])),
    );
    let ingress = Ingress::start(dir.path());
    let mut conn = RawConn::connect(ingress.http);
    let reply = conn.exchange(get("r.example", "/no-content").as_bytes());
    assert_eq!(reply.status, 204);
    assert_eq!(reply.header("content-length"), None);
    // A 1xx is passed on, without the Content-Length it should not have had.
    let reply = conn.exchange(get("r.example", "/continue").as_bytes());
    assert_eq!(reply.status, 100);
    assert_eq!(reply.header("content-length"), None);
    let reply = conn.reply();
    assert_eq!((reply.status, reply.text().as_str()), (200, "ok"));
    for path in ["/status-99", "/status-600"] {
        let reply = exchange(ingress.http, get("r.example", path).as_bytes());
        assert_eq!(reply.status, 502, "{path}");
    }
    let reply = exchange(ingress.http, get("r.example", "/gzip-chunked").as_bytes());
    assert_eq!(reply.header("transfer-encoding"), Some("gzip, chunked"));
    assert_eq!(
        reply.text(),
        "abc",
        "relayed still gzip-coded, as the header says"
    );
    // After a response with both framing headers, its upstream connection is never reused:
    // the next request goes to another connection (an idle one, or a new one).
    let mut conn = RawConn::connect(ingress.http);
    let both = conn.exchange(get("r.example", "/both").as_bytes());
    assert_eq!(both.text(), "ok");
    let after = conn.exchange(get("r.example", "/after").as_bytes());
    assert_eq!(after.text(), "fine");
    assert_ne!(
        after.header("x-connection"),
        both.header("x-connection"),
        "reused after TE+CL"
    );
    let again = conn.exchange(get("r.example", "/again").as_bytes());
    assert_eq!(again.text(), "fine");
    assert_eq!(
        again.header("x-connection"),
        after.header("x-connection"),
        "an ordinary one is reused"
    );
    // An HTTP/1.0 client gets the chunked body de-chunked, and no 1xx.
    let reply = exchange(
        ingress.http,
        b"GET /continue HTTP/1.0\r\nHost: r.example\r\n\r\n",
    );
    assert_eq!((reply.status, reply.text().as_str()), (200, "ok"));
    let reply = exchange(
        ingress.http,
        b"GET /both HTTP/1.0\r\nHost: r.example\r\n\r\n",
    );
    assert_eq!(reply.header("transfer-encoding"), None);
    assert_eq!(reply.text(), "ok");
}

#[test]
fn refusals_are_counted_and_logged_with_their_reason() {
    let site = Site::start("edge-log", &[]);
    site.refused(&get("t.example", "/a#b"), 400);
    // Logs are written by a background thread, and the request is recorded after its answer.
    assert!(
        site.ingress
            .wait_for_log("invalid request target", Duration::from_secs(5)),
        "the access log says why: {}",
        site.ingress.logs()
    );
    assert_eq!(
        site.ingress
            .metric("ingress_requests_total", &[("status", "400")]),
        Some(1.0)
    );
}
