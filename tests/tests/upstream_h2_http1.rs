//! HTTP/1.x clients of upstreams that speak HTTP/2 only (`backend-protocol: GRPC`, a Service
//! port's `appProtocol: kubernetes.io/h2c`), through the real binary: curl over `--http1.1` and
//! `--http1.0`, and raw sockets for the exact bytes. The request goes upstream over HTTP/2
//! without its hop-by-hop headers, bodies (Content-Length and chunked) arrive whole, and the
//! response comes back framed for the client: its content-length, else chunked (trailers only
//! for `TE: trailers`), or until close for HTTP/1.0; HEAD and 204 without a body; the client
//! connection kept alive; a WebSocket upgrade refused with 501. The phases still apply (CORS,
//! upstream-vhost, source ranges), errors are gRPC-shaped only for gRPC requests, and a
//! `GRPCS` upstream is reached over TLS with ALPN `h2`.

// Plain blocking tests: no async runtime here to block.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::disallowed_methods)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use ingress_tests::auth_service::AuthService;
use ingress_tests::curl;
use ingress_tests::h2c_upstream::H2cUpstream;
use ingress_tests::manifests::{annotated_ingress, ingress, service_at};
use ingress_tests::process::Ingress;
use ingress_tests::raw::RawConn;
use ingress_tests::scratch::Scratch;

const HOSTS: [&str; 2] = ["grpc.example", "h2c.example"];

/// One upstream behind two routes: `grpc.example` by `backend-protocol: GRPC`,
/// `h2c.example` by `appProtocol: kubernetes.io/h2c`.
fn start(upstream: &H2cUpstream, extra: &[(&str, String)]) -> (Scratch, Ingress) {
    let dir = Scratch::new("upstream-h2-http1");
    let grpc = service_at("t", "grpc", &[upstream.addr])
        + &annotated_ingress(
            "t",
            "grpc",
            1,
            &[("backend-protocol", "GRPC")],
            &[("grpc.example", "/", "Prefix", "grpc")],
        );
    let h2c = service_at("t", "h2c", &[upstream.addr]).replace(
        "{name: http, port: 80}",
        "{name: http, port: 80, appProtocol: kubernetes.io/h2c}",
    ) + &ingress("t", "h2c", &[("h2c.example", "/", "Prefix", "h2c")]);
    // The phases still run: CORS and upstream-vhost on one route, a source range on another,
    // and an upstream that is down.
    let phased = service_at("t", "phased", &[upstream.addr]).replace(
        "{name: http, port: 80}",
        "{name: http, port: 80, appProtocol: kubernetes.io/h2c}",
    ) + &annotated_ingress(
        "t",
        "phased",
        1,
        &[("enable-cors", "true"), ("upstream-vhost", "inner.example")],
        &[("phased.example", "/", "Prefix", "phased")],
    ) + &annotated_ingress(
        "t",
        "denied",
        1,
        &[("whitelist-source-range", "10.0.0.0/8")],
        &[("denied.example", "/", "Prefix", "phased")],
    );
    let down_addr = std::net::SocketAddr::from(([127, 0, 0, 1], ingress_tests::ports::free_port()));
    let down = service_at("t", "down", &[down_addr])
        + &annotated_ingress(
            "t",
            "down",
            1,
            &[("backend-protocol", "GRPC")],
            &[("down.example", "/", "Prefix", "down")],
        );
    let extra_yaml: String = extra.iter().map(|(_, yaml)| yaml.as_str()).collect();
    dir.write(
        "routes.yaml",
        &(grpc + &h2c + &phased + &down + &extra_yaml),
    );
    let ingress = Ingress::builder().manifests(dir.path()).start();
    let deadline = Instant::now() + Duration::from_secs(10);
    while ![
        HOSTS[0],
        HOSTS[1],
        "phased.example",
        "denied.example",
        "down.example",
    ]
    .iter()
    .chain(extra.iter().map(|(host, _)| host))
    .all(|h| ingress.admin_get("/routes").1.contains(h))
    {
        assert!(
            Instant::now() < deadline,
            "never routed:\n{}",
            ingress.logs()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    (dir, ingress)
}

/// Sends `request` on a new connection and reads until the proxy closes it.
fn raw_until_close(ingress: &Ingress, request: &str) -> String {
    let mut stream = TcpStream::connect(ingress.http).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    stream.write_all(request.as_bytes()).expect("send");
    let mut out = Vec::new();
    stream.read_to_end(&mut out).expect("read until close");
    String::from_utf8_lossy(&out).into_owned()
}

/// The head with the `date` value masked, and the body.
fn masked(reply: &str) -> (String, String) {
    let (head, body) = reply.split_once("\r\n\r\n").expect("a whole head");
    let head = head
        .split("\r\n")
        .map(|line| {
            if line.to_ascii_lowercase().starts_with("date: ") {
                "date: *".to_string()
            } else {
                line.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\r\n");
    (head, body.to_string())
}

#[test]
fn curl_http1_clients_get_and_post_through_an_h2_only_upstream() {
    let upstream = H2cUpstream::start();
    let (_dir, ingress) = start(&upstream, &[]);
    for host in HOSTS {
        for version in ["--http1.1", "--http1.0"] {
            let what = format!("{host} {version}");
            // GET: sent as HTTP/2, without the client's hop-by-hop headers.
            let reply = curl::get(
                &ingress,
                host,
                "/echo?q=1",
                version,
                &[
                    "-H",
                    "Connection: keep-alive, X-Hop",
                    "-H",
                    "X-Hop: listed in Connection",
                    "-H",
                    "Keep-Alive: timeout=5",
                    "-H",
                    "TE: gzip",
                    "-H",
                    "X-Kept: yes",
                ],
            );
            assert_eq!(reply.status, 200, "{what}: {reply:?}\n{}", ingress.logs());
            assert!(
                reply.body.starts_with("GET /echo?q=1 HTTP/2.0\n"),
                "{what}: {}",
                reply.body
            );
            assert!(
                reply.body.contains(&format!(":authority: {host}\n")),
                "{what}: {}",
                reply.body
            );
            assert!(
                reply.body.contains("x-kept: yes\n"),
                "{what}: {}",
                reply.body
            );
            assert!(
                reply.body.contains("x-forwarded-for: 127.0.0.1\n"),
                "{what}: {}",
                reply.body
            );
            for hop in ["connection:", "keep-alive:", "te:", "x-hop:", "host:"] {
                assert!(
                    !reply.body.lines().any(|l| l.starts_with(hop)),
                    "{what}: {hop} went upstream: {}",
                    reply.body
                );
            }
            assert_eq!(
                reply.header("content-length"),
                Some(reply.body.len().to_string().as_str()),
                "{what}"
            );
            assert_eq!(reply.header("transfer-encoding"), None, "{what}");

            // The upstream's content-length is kept.
            let reply = curl::get(&ingress, host, "/length", version, &[]);
            assert_eq!(
                (
                    reply.status,
                    reply.body.as_str(),
                    reply.header("content-length")
                ),
                (200, "0123456789", Some("10")),
                "{what}"
            );

            // A body with Content-Length arrives whole.
            let reply = curl::get(
                &ingress,
                host,
                "/echo",
                version,
                &["--data-binary", "a=1&b=2"],
            );
            assert_eq!(reply.status, 200, "{what}: {reply:?}");
            assert!(reply.body.starts_with("POST /echo HTTP/2.0\n"), "{what}");
            assert!(reply.body.contains("content-length: 7\n"), "{what}");
            assert!(
                reply.body.ends_with("\n\na=1&b=2"),
                "{what}: {}",
                reply.body
            );

            // No content-length from the upstream: chunked for HTTP/1.1, until close for 1.0.
            let reply = curl::get(&ingress, host, "/stream", version, &[]);
            assert_eq!((reply.status, reply.body.as_str()), (200, "hello world"));
            assert_eq!(reply.header("content-length"), None, "{what}");
            if version == "--http1.1" {
                assert_eq!(reply.header("transfer-encoding"), Some("chunked"), "{what}");
            } else {
                assert_eq!(reply.header("transfer-encoding"), None, "{what}");
                assert_eq!(reply.header("connection"), Some("close"), "{what}");
            }

            let reply = curl::get(&ingress, host, "/nothing", version, &[]);
            assert_eq!((reply.status, reply.body.as_str()), (204, ""), "{what}");
        }
        // A chunked upload (HTTP/1.1 only) is decoded and sent as DATA, without its framing.
        let reply = curl::get(
            &ingress,
            host,
            "/echo",
            "--http1.1",
            &[
                "-H",
                "Transfer-Encoding: chunked",
                "--data-binary",
                "streamed body",
            ],
        );
        assert_eq!(reply.status, 200, "{host}: {reply:?}\n{}", ingress.logs());
        assert!(
            !reply.body.contains("transfer-encoding"),
            "{host}: {}",
            reply.body
        );
        assert!(
            reply.body.ends_with("\n\nstreamed body"),
            "{host}: {}",
            reply.body
        );
    }
    // Both routes, every request: one multiplexed upstream connection (or a few), not one each.
    assert!(upstream.connections() <= 2, "{}", upstream.connections());
}

#[test]
fn raw_http1_framing_trailers_keepalive_and_upgrades() {
    let upstream = H2cUpstream::start();
    let (_dir, ingress) = start(&upstream, &[]);
    let server = {
        let reply = raw_until_close(
            &ingress,
            "GET /length HTTP/1.1\r\nHost: h2c.example\r\nConnection: close\r\n\r\n",
        );
        let (head, _) = masked(&reply);
        head.lines()
            .find_map(|l| l.strip_prefix("server: "))
            .map(str::to_string)
            .unwrap_or_else(|| panic!("no server header: {head}"))
    };

    // The exact head: the upstream's content-length and date, the proxy's server.
    let reply = raw_until_close(
        &ingress,
        "GET /length HTTP/1.1\r\nHost: grpc.example\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(
        masked(&reply),
        (
            format!(
                "HTTP/1.1 200 OK\r\ndate: *\r\nserver: {server}\r\ncontent-length: 10\r\nconnection: close"
            ),
            "0123456789".to_string()
        ),
        "{reply:?}"
    );

    // No content-length: chunked, and the trailers only for a client that asked for them.
    let reply = raw_until_close(
        &ingress,
        "GET /trailers HTTP/1.1\r\nHost: grpc.example\r\nTE: trailers\r\nConnection: close\r\n\r\n",
    );
    let (head, body) = masked(&reply);
    assert!(head.contains("\r\ntransfer-encoding: chunked"), "{head}");
    assert_eq!(
        body, "4\r\ndata\r\n0\r\ngrpc-status: 0\r\nx-trailer: yes\r\n\r\n",
        "{reply:?}"
    );
    let reply = raw_until_close(
        &ingress,
        "GET /trailers HTTP/1.1\r\nHost: grpc.example\r\nConnection: close\r\n\r\n",
    );
    let (_, body) = masked(&reply);
    assert_eq!(body, "4\r\ndata\r\n0\r\n\r\n", "{reply:?}");

    // HTTP/1.0 without a length from the upstream: the body until close, not chunked.
    let reply = raw_until_close(
        &ingress,
        "GET /stream HTTP/1.0\r\nHost: h2c.example\r\n\r\n",
    );
    assert_eq!(
        masked(&reply),
        (
            format!("HTTP/1.1 200 OK\r\ndate: *\r\nserver: {server}\r\nconnection: close"),
            "hello world".to_string()
        ),
        "{reply:?}"
    );

    // One client connection, several requests: HEAD (no body follows its content-length), a
    // chunked upload, a Content-Length upload, a streamed response, a 204.
    let mut conn = RawConn::connect(ingress.http);
    conn.send(b"HEAD /length HTTP/1.1\r\nHost: h2c.example\r\n\r\n");
    let head = conn.reply_to_head();
    assert_eq!(
        (head.status, head.header("content-length")),
        (200, Some("10")),
        "{head:?}"
    );
    let reply = conn.exchange(
        b"POST /echo HTTP/1.1\r\nHost: h2c.example\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nx-t: 1\r\n\r\n",
    );
    assert_eq!(reply.status, 200);
    let text = reply.text();
    assert!(text.ends_with("\n\nhello world"), "{text}");
    assert!(
        !text.contains("x-t:"),
        "request trailers are dropped: {text}"
    );
    let reply =
        conn.exchange(b"POST /echo HTTP/1.1\r\nHost: grpc.example\r\nContent-Length: 3\r\n\r\nabc");
    assert!(reply.text().ends_with("\n\nabc"), "{}", reply.text());
    let reply = conn.exchange(b"GET /stream HTTP/1.1\r\nHost: grpc.example\r\n\r\n");
    assert_eq!((reply.status, reply.text().as_str()), (200, "hello world"));
    let reply = conn.exchange(b"GET /nothing HTTP/1.1\r\nHost: grpc.example\r\n\r\n");
    assert_eq!(reply.status, 204);
    let reply = conn.exchange(b"GET /length HTTP/1.1\r\nHost: grpc.example\r\n\r\n");
    assert_eq!(
        (reply.status, reply.text().as_str()),
        (200, "0123456789"),
        "the connection is still good after all of them"
    );

    // A large upload, sent faster than one channel piece: whole, in order.
    let big: String = (0..200_000)
        .map(|i| char::from(b'a' + (i % 26) as u8))
        .collect();
    let reply = conn.exchange(
        format!(
            "POST /echo HTTP/1.1\r\nHost: h2c.example\r\nContent-Length: {}\r\n\r\n{big}",
            big.len()
        )
        .as_bytes(),
    );
    assert_eq!(reply.status, 200);
    assert!(reply.text().ends_with(&format!("\n\n{big}")), "large body");

    // An upgrade cannot be carried to an HTTP/2-only upstream: 501, said plainly.
    let reply = raw_until_close(
        &ingress,
        "GET /ws HTTP/1.1\r\nHost: h2c.example\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
    );
    assert!(reply.starts_with("HTTP/1.1 501 "), "{reply:?}");
}

#[test]
fn phases_errors_and_expect_continue_on_http1_to_h2_routes() {
    let upstream = H2cUpstream::start();
    let auth = AuthService::start();
    let guarded = |name: &str, path: &str| {
        annotated_ingress(
            "t",
            name,
            1,
            &[
                ("auth-url", &auth.url(path)),
                ("auth-response-headers", "X-Auth-Request-User"),
            ],
            &[(&format!("{name}.example"), "/", "Prefix", "phased")],
        )
    };
    let (_dir, ingress) = start(
        &upstream,
        &[
            ("authed.example", guarded("authed", "/ok")),
            ("refused.example", guarded("refused", "/deny")),
        ],
    );

    // External auth: what the auth service vouched for goes upstream; its refusal does not.
    let reply = curl::get(&ingress, "authed.example", "/echo", "--http1.1", &[]);
    assert_eq!(reply.status, 200, "{reply:?}\n{}", ingress.logs());
    assert!(
        reply.body.contains("x-auth-request-user: alice\n"),
        "{}",
        reply.body
    );
    let reply = curl::get(&ingress, "refused.example", "/echo", "--http1.1", &[]);
    assert_eq!(reply.status, 401, "{reply:?}");
    assert!(reply.header("www-authenticate").is_some(), "{reply:?}");

    // CORS is added to the response, upstream-vhost becomes the :authority.
    let reply = curl::get(
        &ingress,
        "phased.example",
        "/echo",
        "--http1.1",
        &["-H", "Origin: https://app.example"],
    );
    assert_eq!(reply.status, 200, "{reply:?}\n{}", ingress.logs());
    assert!(
        reply.header("access-control-allow-origin").is_some(),
        "{reply:?}"
    );
    assert!(
        reply.body.contains(":authority: inner.example\n"),
        "{}",
        reply.body
    );
    assert!(
        reply.body.contains("x-forwarded-host: phased.example\n"),
        "{}",
        reply.body
    );

    // Access control refuses before anything goes upstream.
    let reply = curl::get(&ingress, "denied.example", "/echo", "--http1.1", &[]);
    assert_eq!(reply.status, 403, "{reply:?}");

    // An upstream that is down: the proxy's plain 502 for a plain request, a gRPC-shaped
    // UNAVAILABLE for a gRPC one.
    let reply = curl::get(&ingress, "down.example", "/", "--http1.1", &[]);
    assert_eq!(reply.status, 502, "{reply:?}");
    assert_eq!(reply.header("grpc-status"), None, "{reply:?}");
    let reply = curl::get(
        &ingress,
        "down.example",
        "/pkg.Service/Call",
        "--http1.1",
        &[
            "-H",
            "Content-Type: application/grpc",
            "-H",
            "TE: trailers",
            "--data-binary",
            "",
        ],
    );
    assert_eq!(
        (reply.status, reply.header("grpc-status")),
        (200, Some("14")),
        "{reply:?}"
    );

    // Expect: 100-continue: told to go on, then the body arrives whole, on a connection that
    // stays usable.
    let mut conn = RawConn::connect(ingress.http);
    let interim = conn.exchange(
        b"POST /echo HTTP/1.1\r\nHost: h2c.example\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n",
    );
    assert_eq!(interim.status, 100);
    let reply = conn.exchange(b"hello");
    assert_eq!(reply.status, 200);
    assert!(reply.text().ends_with("\n\nhello"), "{}", reply.text());
    let reply = conn.exchange(b"GET /length HTTP/1.1\r\nHost: h2c.example\r\n\r\n");
    assert_eq!((reply.status, reply.text().as_str()), (200, "0123456789"));
}

#[test]
fn http1_clients_reach_a_grpcs_upstream_over_tls_with_alpn_h2() {
    use ingress_tests::https_upstream::{HttpsBackend, HttpsOptions};
    use ingress_tests::pki::Ca;

    let ca = Ca::new("upstream CA");
    let leaf = ca.server("secure.t.svc", &["secure.t.svc"]);
    // HTTP/2 only: a client that cannot agree to h2 is refused by the handshake.
    let backend = HttpsBackend::start(
        "secure",
        &leaf,
        HttpsOptions {
            alpn: vec![b"h2".to_vec()],
            ..HttpsOptions::default()
        },
    );
    let dir = Scratch::new("upstream-h2-http1-tls");
    let yaml = service_at("t", "secure", &[backend.addr])
        + &annotated_ingress(
            "t",
            "secure",
            1,
            &[("backend-protocol", "GRPCS")],
            &[("grpcs.example", "/", "Prefix", "secure")],
        );
    dir.write("routes.yaml", &yaml);
    let ingress = Ingress::builder().manifests(dir.path()).start();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !ingress.admin_get("/routes").1.contains("grpcs.example") {
        assert!(
            Instant::now() < deadline,
            "never routed:\n{}",
            ingress.logs()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    for version in ["--http1.1", "--http1.0"] {
        let reply = curl::get(
            &ingress,
            "grpcs.example",
            "/over-tls",
            version,
            &["--data-binary", "payload"],
        );
        assert_eq!(
            reply.status,
            200,
            "{version}: {reply:?}\n{}",
            ingress.logs()
        );
        let echo = reply.echo().expect("the backend's echo");
        assert_eq!(
            (echo.backend.as_str(), echo.method.as_str(), echo.body_len),
            ("secure", "POST", 7),
            "{version}"
        );
    }
    let handshakes = backend.handshakes();
    assert!(!handshakes.is_empty());
    assert!(
        handshakes
            .iter()
            .all(|h| h.alpn.as_deref() == Some(&b"h2"[..])),
        "{handshakes:?}"
    );
}
