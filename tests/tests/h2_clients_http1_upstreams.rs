//! HTTP/2 clients of HTTP/1.1 upstreams, through the real binary: the exchange the proxy writes
//! itself on the HTTP/1.x path's kept connections. A scripted upstream sends the exact bytes
//! (odd heads, both framing headers, a close mid-body), and says which connection served each
//! request, so a test can tell a reused connection from a new one.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::convert::Infallible;
use std::net::SocketAddr;

use bytes::Bytes;
use http::{Method, Request};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Empty, Full, StreamBody};
use hyper::body::Frame;

use ingress_tests::manifests::{ingress, service_at};
use ingress_tests::process::Ingress;
use ingress_tests::scratch::Scratch;
use ingress_tests::scripted::{Answer, Scripted, Seen};

/// What the client got: the status (0 when the stream was reset before one), two headers, and
/// the body (or the error that ended it).
#[derive(Debug)]
struct Got {
    status: u16,
    connection: Option<String>,
    content_length: Option<String>,
    body: Result<Bytes, String>,
}

/// An HTTP/2 connection to the proxy (h2c prior knowledge).
async fn h2c(
    addr: SocketAddr,
) -> hyper::client::conn::http2::SendRequest<BoxBody<Bytes, Infallible>> {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (sender, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(stream),
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    sender
}

async fn send(
    sender: &mut hyper::client::conn::http2::SendRequest<BoxBody<Bytes, Infallible>>,
    method: Method,
    path: &str,
    body: BoxBody<Bytes, Infallible>,
) -> Got {
    sender.ready().await.unwrap();
    let req = Request::builder()
        .method(method)
        .uri(format!("http://r.example{path}"))
        .body(body)
        .unwrap();
    let response = match sender.send_request(req).await {
        Ok(response) => response,
        // A stream reset before the response head: no status at all.
        Err(err) => {
            return Got {
                status: 0,
                connection: None,
                content_length: None,
                body: Err(format!("{err:?}")),
            };
        }
    };
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .map(|v| v.to_str().unwrap().to_string())
    };
    let (status, connection, content_length) = (
        response.status().as_u16(),
        header("x-connection"),
        header("content-length"),
    );
    let body = response
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .map_err(|e| format!("{e:?}"));
    Got {
        status,
        connection,
        content_length,
        body,
    }
}

fn empty() -> BoxBody<Bytes, Infallible> {
    Empty::new().boxed()
}

fn start(name: &str, upstream: &Scripted) -> (Scratch, Ingress) {
    let dir = Scratch::new(name);
    dir.write(
        "a.yaml",
        &(service_at("t", "up", &[upstream.addr])
            + &ingress("t", "r", &[("r.example", "/", "Prefix", "up")])),
    );
    let ingress = Ingress::start(dir.path());
    (dir, ingress)
}

fn answer(seen: &Seen) -> Answer {
    let c = seen.connection;
    let head = |rest: &str| format!("HTTP/1.1 200 OK\r\nX-Connection: {c}\r\n{rest}").into_bytes();
    match seen.path.as_str() {
        "/chunked" => Answer::Bytes(head(
            "Transfer-Encoding: chunked\r\n\r\n3\r\nhel\r\n2\r\nlo\r\n0\r\nx-t: 1\r\n\r\n",
        )),
        "/continue" => Answer::Bytes(
            format!("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nX-Connection: {c}\r\nContent-Length: 2\r\n\r\nok")
                .into_bytes(),
        ),
        "/no-content" => Answer::Bytes(b"HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\n".to_vec()),
        "/status-600" => Answer::Bytes(b"HTTP/1.1 600 Odd\r\nContent-Length: 2\r\n\r\nok".to_vec()),
        "/both" => Answer::Bytes(head(
            "Transfer-Encoding: chunked\r\nContent-Length: 100\r\n\r\n2\r\nok\r\n0\r\n\r\n",
        )),
        "/until-close" => Answer::BytesThenClose(head("\r\nall of it")),
        "/cut" => Answer::BytesThenClose(head("Content-Length: 10\r\n\r\nabc")),
        "/close-after" => Answer::BytesThenClose(head("Content-Length: 4\r\n\r\nfine")),
        "/upload" => {
            let text = format!(
                "{} cl={} te={} body={}",
                seen.method,
                seen.header("content-length").unwrap_or("-"),
                seen.header("transfer-encoding").unwrap_or("-"),
                String::from_utf8_lossy(&seen.body)
            );
            Answer::Bytes(head(&format!("Content-Length: {}\r\n\r\n{text}", text.len())))
        }
        _ => Answer::Bytes(head("Content-Length: 4\r\n\r\nfine")),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn responses_are_framed_for_http2_and_connections_kept_only_when_clean() {
    let upstream = Scripted::start(answer);
    let (_dir, ingress) = start("h2-h1-responses", &upstream);
    let mut h2 = h2c(ingress.http).await;

    let got = send(&mut h2, Method::GET, "/chunked", empty()).await;
    assert_eq!(
        (got.status, got.body.as_deref().ok()),
        (200, Some(&b"hello"[..])),
        "{got:?}"
    );
    let got = send(&mut h2, Method::GET, "/continue", empty()).await;
    assert_eq!(
        (got.status, got.body.as_deref().ok()),
        (200, Some(&b"ok"[..])),
        "{got:?}"
    );
    let got = send(&mut h2, Method::GET, "/no-content", empty()).await;
    assert_eq!(
        (got.status, got.body.as_deref().ok()),
        (204, Some(&b""[..])),
        "{got:?}"
    );
    assert_eq!(got.content_length, None, "a 204 says no length");
    let got = send(&mut h2, Method::GET, "/status-600", empty()).await;
    assert_eq!(got.status, 502, "{got:?}");
    let got = send(&mut h2, Method::GET, "/until-close", empty()).await;
    assert_eq!(
        (got.status, got.body.as_deref().ok()),
        (200, Some(&b"all of it"[..])),
        "{got:?}"
    );
    let got = send(&mut h2, Method::HEAD, "/head", empty()).await;
    assert_eq!(
        (got.status, got.content_length.as_deref()),
        (200, Some("4")),
        "{got:?}"
    );
    assert_eq!(got.body.as_deref().ok(), Some(&b""[..]), "HEAD has no body");

    // A body the upstream cut short is an error for the client, never a short success.
    // (The reset may overtake the head, which then never arrives.)
    let got = send(&mut h2, Method::GET, "/cut", empty()).await;
    assert!(matches!(got.status, 0 | 200), "{got:?}");
    assert!(got.body.is_err(), "a cut-short body ended cleanly: {got:?}");

    // Kept alive: one connection serves request after request.
    let first = send(&mut h2, Method::GET, "/a", empty()).await;
    let second = send(&mut h2, Method::GET, "/b", empty()).await;
    assert_eq!(first.body.as_deref().ok(), Some(&b"fine"[..]));
    assert_eq!(
        first.connection, second.connection,
        "an ordinary response's connection is reused"
    );

    // After a response with both framing headers, its connection is never used again.
    let both = send(&mut h2, Method::GET, "/both", empty()).await;
    assert_eq!(both.body.as_deref().ok(), Some(&b"ok"[..]), "{both:?}");
    assert_eq!(
        both.content_length, None,
        "the Content-Length beside chunked is dropped"
    );
    let after = send(&mut h2, Method::GET, "/after", empty()).await;
    assert_eq!(after.body.as_deref().ok(), Some(&b"fine"[..]));
    assert_ne!(after.connection, both.connection, "reused after TE+CL");
}

#[tokio::test(flavor = "multi_thread")]
async fn uploads_reach_the_upstream_whole_with_the_proxys_framing() {
    let upstream = Scripted::start(answer);
    let (_dir, ingress) = start("h2-h1-uploads", &upstream);
    let mut h2 = h2c(ingress.http).await;

    let known = Full::new(Bytes::from_static(b"abc")).boxed();
    let got = send(&mut h2, Method::POST, "/upload", known).await;
    assert_eq!(
        got.body.as_deref().ok(),
        Some(&b"POST cl=3 te=- body=abc"[..]),
        "{got:?}"
    );

    // No length declared: chunked to the upstream, which reads the pieces as one body.
    let pieces = futures_util::stream::iter(
        [&b"ab"[..], &b"cd"[..]].map(|p| Ok::<_, Infallible>(Frame::data(Bytes::from_static(p)))),
    );
    let streamed = StreamBody::new(pieces).boxed();
    let got = send(&mut h2, Method::POST, "/upload", streamed).await;
    assert_eq!(
        got.body.as_deref().ok(),
        Some(&b"POST cl=- te=chunked body=abcd"[..]),
        "{got:?}"
    );

    let got = send(&mut h2, Method::POST, "/upload", empty()).await;
    assert_eq!(
        got.body.as_deref().ok(),
        Some(&b"POST cl=0 te=- body="[..]),
        "{got:?}"
    );
    let got = send(&mut h2, Method::GET, "/upload", empty()).await;
    assert_eq!(
        got.body.as_deref().ok(),
        Some(&b"GET cl=- te=- body="[..]),
        "{got:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_kept_connection_the_upstream_closed_is_not_a_failure() {
    let upstream = Scripted::start(answer);
    let (_dir, ingress) = start("h2-h1-stale", &upstream);
    let mut h2 = h2c(ingress.http).await;
    // Each answer closes its connection: whether the proxy sees the close before reuse or
    // only when its request fails there, the request is served (retried on a new one).
    for round in 0..5 {
        let got = send(&mut h2, Method::GET, "/close-after", empty()).await;
        assert_eq!(
            (got.status, got.body.as_deref().ok()),
            (200, Some(&b"fine"[..])),
            "round {round}: {got:?}"
        );
    }
    assert_eq!(
        upstream.requests(),
        5,
        "each request reached the upstream once"
    );
}
