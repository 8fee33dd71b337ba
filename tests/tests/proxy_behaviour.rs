//! What users expect of a proxy: forwarding headers, hop-by-hop stripping, HTTP/2, WebSocket
//! upgrades, status codes for upstream failures, timeouts and header limits.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::disallowed_methods)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::Request;
use http_body_util::Full;
use ingress_tests::client::{self, get, send};
use ingress_tests::manifests::{ingress, one_route, service};
use ingress_tests::ports::free_port;
use ingress_tests::process::Ingress;
use ingress_tests::scratch::Scratch;
use ingress_tests::upstream::Backend;

fn write_one_route(dir: &Scratch, backend: &Backend, host: &str) {
    dir.write("a.yaml", &one_route("t", "web", host, backend));
}

#[tokio::test(flavor = "multi_thread")]
async fn forwarding_headers_and_hop_by_hop() {
    let web = Backend::start("web");
    let dir = Scratch::new("headers");
    write_one_route(&dir, &web, "h.example.com");
    let ingress = Ingress::start(dir.path());
    let req = Request::get(ingress.url("/x?y=1"))
        .header("host", "h.example.com")
        .header("x-forwarded-for", "203.0.113.9")
        .header("x-forwarded-proto", "https")
        .header("connection", "x-drop-me")
        .header("x-drop-me", "secret")
        .header("proxy-authorization", "Basic Zm9v")
        .header("x-keep", "kept")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let reply = send(&client::http1(), req).await.unwrap();
    assert_eq!(reply.status, 200);
    assert_eq!(reply.headers.get("server").unwrap(), "ingress");
    let echo = reply.echo().expect("backend echo");
    let h = |name: &str| echo.headers.get(name).cloned();
    assert_eq!(echo.uri, "/x?y=1");
    assert_eq!(h("host").as_deref(), Some("h.example.com"));
    assert_eq!(
        h("x-forwarded-for").as_deref(),
        Some("127.0.0.1"),
        "the peer, as ingress-nginx sets it; a client cannot add hops"
    );
    assert_eq!(
        h("x-original-forwarded-for").as_deref(),
        Some("203.0.113.9")
    );
    assert_eq!(h("x-real-ip").as_deref(), Some("127.0.0.1"));
    assert_eq!(
        h("x-forwarded-proto").as_deref(),
        Some("http"),
        "a client cannot claim https"
    );
    assert_eq!(h("x-forwarded-host").as_deref(), Some("h.example.com"));
    assert_eq!(h("x-forwarded-port"), Some(ingress.http.port().to_string()));
    assert_eq!(h("x-keep").as_deref(), Some("kept"));
    assert!(h("x-request-id").is_some_and(|id| id.len() == 32));
    assert_eq!(
        h("x-drop-me"),
        None,
        "headers named in Connection are hop-by-hop"
    );
    assert_eq!(h("proxy-authorization"), None);
}

#[tokio::test(flavor = "multi_thread")]
async fn http2_downstream() {
    let web = Backend::start("web");
    let dir = Scratch::new("h2");
    write_one_route(&dir, &web, "h2.example.com");
    let ingress = Ingress::start(dir.path());
    // Speak h2c directly over a socket so :authority names the virtual host while the bytes go
    // to loopback, as a real client resolving h2.example.com to this node would.
    let stream = tokio::net::TcpStream::connect(ingress.http).await.unwrap();
    let (mut sender, connection) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(stream),
    )
    .await
    .unwrap();
    tokio::spawn(connection);
    let req = Request::post("http://h2.example.com/upload")
        .body(Full::new(Bytes::from(vec![7u8; 100_000])))
        .unwrap();
    let response = sender.send_request(req).await.unwrap();
    assert_eq!(response.version(), http::Version::HTTP_2);
    let status = response.status();
    let body = http_body_util::BodyExt::collect(response.into_body())
        .await
        .unwrap()
        .to_bytes();
    let reply = ingress_tests::client::Reply {
        status,
        headers: Default::default(),
        body,
    };
    assert_eq!(reply.status, 200, "{}", reply.text());
    let echo = reply.echo().unwrap();
    assert_eq!(echo.body_len, 100_000);
    assert_eq!(echo.method, "POST");
}

#[tokio::test(flavor = "multi_thread")]
async fn websocket_upgrade_round_trips() {
    let web = Backend::start("ws");
    let dir = Scratch::new("ws");
    write_one_route(&dir, &web, "ws.example.com");
    let ingress = Ingress::start(dir.path());
    let mut stream = TcpStream::connect(ingress.http).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    write!(
        stream,
        "GET /chat HTTP/1.1\r\nHost: ws.example.com\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
    .unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        stream.read_exact(&mut byte).unwrap();
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).to_ascii_lowercase();
    assert!(head.starts_with("http/1.1 101"), "{head}");
    assert!(head.contains("upgrade: websocket"), "{head}");
    for message in [
        &b"hello"[..],
        &[0u8, 255, 1, 254][..],
        &vec![b'x'; 50_000][..],
    ] {
        stream.write_all(message).unwrap();
        let mut echoed = vec![0u8; message.len()];
        stream.read_exact(&mut echoed).unwrap();
        assert_eq!(echoed, message);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn upstream_failures_map_to_status_codes() {
    let slow = Backend::start("slow");
    let dir = Scratch::new("status");
    let closed = free_port();
    let yaml = service("t", "slow", &[&slow])
        + &format!(
            "---\napiVersion: v1\nkind: Service\nmetadata: {{name: closed, namespace: t}}\nspec: {{ports: [{{name: http, port: 80}}]}}\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: closed-1, namespace: t, labels: {{kubernetes.io/service-name: closed}}}}\naddressType: IPv4\nports: [{{name: http, port: {closed}}}]\nendpoints: [{{addresses: [\"127.0.0.1\"]}}]\n"
        )
        + "---\napiVersion: v1\nkind: Service\nmetadata: {name: empty, namespace: t}\nspec: {ports: [{name: http, port: 80}]}\n"
        + &ingress(
            "t",
            "status",
            &[
                ("s.example.com", "/slow", "Prefix", "slow"),
                ("s.example.com", "/closed", "Prefix", "closed"),
                ("s.example.com", "/empty", "Prefix", "empty"),
                ("s.example.com", "/missing", "Prefix", "missing"),
            ],
        );
    dir.write("a.yaml", &yaml);
    let ingress = Ingress::builder()
        .manifests(dir.path())
        .args(["--upstream-response-timeout", "300ms"])
        .start();
    let http = client::http1();
    let status = |path: &'static str| {
        let http = http.clone();
        let url = ingress.url(path);
        async move { get(&http, &url, "s.example.com").await.status.as_u16() }
    };
    assert_eq!(status("/slow?delay_ms=10").await, 200);
    let started = Instant::now();
    assert_eq!(status("/slow?delay_ms=2000").await, 504);
    assert!(
        started.elapsed() < Duration::from_millis(1500),
        "timed out late: {:?}",
        started.elapsed()
    );
    assert_eq!(status("/closed").await, 502);
    assert_eq!(status("/empty").await, 503);
    assert_eq!(status("/missing").await, 503);
    // The log is written from a background thread.
    for status in ["status=504", "status=502"] {
        assert!(
            ingress.wait_for_log(status, Duration::from_secs(5)),
            "access log records failures:\n{}",
            ingress.logs()
        );
    }
}

#[test]
fn slow_headers_time_out_and_huge_headers_are_refused() {
    let web = Backend::start("web");
    let dir = Scratch::new("limits");
    write_one_route(&dir, &web, "l.example.com");
    let ingress = Ingress::builder()
        .manifests(dir.path())
        .args([
            "--header-read-timeout",
            "300ms",
            "--max-header-size",
            "8192",
        ])
        .start();

    // A client that never finishes its headers is cut off.
    let mut slow = TcpStream::connect(ingress.http).unwrap();
    slow.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    slow.write_all(b"GET / HTTP/1.1\r\nHost: l.example.com\r\n")
        .unwrap();
    let started = Instant::now();
    let mut buf = Vec::new();
    let _ = slow.read_to_end(&mut buf);
    let waited = started.elapsed();
    assert!(
        waited < Duration::from_secs(3),
        "slow client held the connection for {waited:?}"
    );

    // A head larger than the limit gets 431.
    let mut big = TcpStream::connect(ingress.http).unwrap();
    big.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let filler = "a".repeat(16 * 1024);
    let _ = write!(
        big,
        "GET / HTTP/1.1\r\nHost: l.example.com\r\nX-Big: {filler}\r\n\r\n"
    );
    let mut reply = String::new();
    let _ = big.read_to_string(&mut reply);
    assert!(
        reply.starts_with("HTTP/1.1 431"),
        "got {:?}",
        reply.lines().next()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn upstream_connections_are_kept_alive_and_reused() {
    let web = Backend::start("web");
    let dir = Scratch::new("keepalive");
    write_one_route(&dir, &web, "k.example.com");
    let ingress = Ingress::start(dir.path());
    let http = client::http1();
    for i in 0..50 {
        let reply = get(&http, &ingress.url(&format!("/{i}")), "k.example.com").await;
        assert_eq!(reply.status, 200);
    }
    // HEAD answers have no body to read to the end; the connection must still go back.
    for _ in 0..5 {
        let req = Request::head(ingress.url("/"))
            .header("host", "k.example.com")
            .body(Full::new(Bytes::new()))
            .unwrap();
        assert_eq!(send(&http, req).await.unwrap().status, 200);
    }
    assert_eq!(web.served(), 55);
    assert_eq!(
        web.connections(),
        1,
        "sequential requests share one upstream connection"
    );

    // Concurrent requests open more connections, which are then reused too.
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let (http, url) = (http.clone(), ingress.url("/?delay_ms=50"));
        tasks.push(tokio::spawn(async move {
            get(&http, &url, "k.example.com").await.status
        }));
    }
    for t in tasks {
        assert_eq!(t.await.unwrap(), 200);
    }
    let after_burst = web.connections();
    assert!(after_burst <= 9, "{after_burst}");
    for _ in 0..20 {
        get(&http, &ingress.url("/"), "k.example.com").await;
    }
    assert_eq!(
        web.connections(),
        after_burst,
        "no new connections once the pool is warm"
    );
}
