//! The HTTP/1.x path with raw sockets on both sides: every way a response body can be framed,
//! request bodies of every framing one after another on one connection, pipelining, retries of
//! kept-alive upstream connections that turn out closed, and shutdown of idle connections.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::disallowed_methods)]

use std::io::{BufReader, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use ingress_tests::manifests::{ingress, service, service_at};
use ingress_tests::process::Ingress;
use ingress_tests::raw::{Reply, get, read_reply};
use ingress_tests::scratch::Scratch;
use ingress_tests::scripted::{Answer, Scripted, ok};
use ingress_tests::upstream::{Backend, Echo};

const BIG: usize = 1024 * 1024;

/// The bytes of the large body: a period that is not a power of two, so a misplaced chunk shows.
fn pattern(i: usize) -> u8 {
    u8::try_from(i % 251).unwrap_or(0)
}

/// The upstream every test here talks to: answers by path with exactly the bytes a test needs.
fn scripted() -> Scripted {
    Scripted::start(|seen| {
        let (method, path) = (seen.method.as_str(), seen.path.as_str());
        match path {
            "/chunked" => Answer::Bytes(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\nX-Trailer: t\r\n\r\n".to_vec()),
            "/close" => Answer::BytesThenClose(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nuntil the upstream closes".to_vec()),
            "/big" => {
                let mut r = format!("HTTP/1.1 200 OK\r\nContent-Length: {BIG}\r\n\r\n").into_bytes();
                if method != "HEAD" {
                    r.extend((0..BIG).map(pattern));
                }
                Answer::Bytes(r)
            }
            "/no-content" => Answer::Bytes(b"HTTP/1.1 204 No Content\r\nX-Was: empty\r\n\r\n".to_vec()),
            "/hints" => Answer::Bytes(b"HTTP/1.1 103 Early Hints\r\nLink: </s.css>\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok".to_vec()),
            "/garbage" => Answer::Bytes(b"NOT HTTP AT ALL\r\n\r\n".to_vec()),
            "/drop-reused" if seen.served_on_connection > 0 => Answer::Close,
            // Answers, then closes as an upstream's idle timeout would, with no warning.
            "/then-close" => Answer::BytesThenClose(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok".to_vec()),
            _ => Answer::Bytes(ok(&format!(
                "{method} {path} body={} served={}",
                seen.body.len(),
                seen.served_on_connection
            ))),
        }
    })
}

fn connect(ingress: &Ingress) -> (TcpStream, BufReader<TcpStream>) {
    let stream = TcpStream::connect(ingress.http).unwrap_or_else(|err| {
        panic!(
            "connect to {}: {err}; ingress logs:\n{}",
            ingress.http,
            ingress.logs()
        )
    });
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let reader = BufReader::new(stream.try_clone().unwrap());
    (stream, reader)
}

fn setup(name: &str, scripted: &Scripted, web: &Backend) -> (Scratch, Ingress) {
    let dir = Scratch::new(name);
    dir.write(
        "a.yaml",
        &(service_at("t", "scripted", &[scripted.addr])
            + &service("t", "web", &[web])
            + &ingress(
                "t",
                "fast",
                &[
                    ("s.example.com", "/", "Prefix", "scripted"),
                    ("w.example.com", "/", "Prefix", "web"),
                ],
            )),
    );
    let ingress = Ingress::start(dir.path());
    (dir, ingress)
}

#[test]
fn every_response_framing_reaches_the_client_intact() {
    let (scripted, web) = (scripted(), Backend::start("web"));
    let (_dir, ingress) = setup("framing", &scripted, &web);
    let (mut stream, mut reader) = connect(&ingress);
    let host = "s.example.com";

    stream.write_all(get(host, "/chunked").as_bytes()).unwrap();
    let reply = read_reply(&mut reader, false);
    assert_eq!((reply.status, reply.text().as_str()), (200, "hello world"));
    assert_eq!(reply.header("server"), Some("ingress"));

    stream.write_all(get(host, "/big").as_bytes()).unwrap();
    let reply = read_reply(&mut reader, false);
    assert_eq!(reply.body.len(), BIG);
    assert!(reply.body.iter().enumerate().all(|(i, &b)| b == pattern(i)));

    stream
        .write_all(format!("HEAD /big HTTP/1.1\r\nHost: {host}\r\n\r\n").as_bytes())
        .unwrap();
    let reply = read_reply(&mut reader, true);
    assert_eq!(
        reply.header("content-length"),
        Some(BIG.to_string().as_str())
    );

    stream
        .write_all(get(host, "/no-content").as_bytes())
        .unwrap();
    let reply = read_reply(&mut reader, false);
    assert_eq!((reply.status, reply.header("x-was")), (204, Some("empty")));

    stream.write_all(get(host, "/hints").as_bytes()).unwrap();
    let early = read_reply(&mut reader, false);
    assert_eq!(
        (early.status, early.header("link")),
        (103, Some("</s.css>"))
    );
    let reply = read_reply(&mut reader, false);
    assert_eq!((reply.status, reply.text().as_str()), (200, "ok"));

    stream.write_all(get(host, "/echo").as_bytes()).unwrap();
    let reply = read_reply(&mut reader, false);
    assert_eq!(
        reply.text(),
        "GET /echo body=0 served=5",
        "one kept-alive upstream connection"
    );
    assert_eq!(scripted.connections(), 1);

    // A body that ends when the upstream closes: the client is told, and closed after it.
    stream.write_all(get(host, "/close").as_bytes()).unwrap();
    let reply = read_reply(&mut reader, false);
    assert_eq!(reply.text(), "until the upstream closes");
    assert_eq!(reply.header("connection"), Some("close"));

    let (mut stream, mut reader) = connect(&ingress);
    stream.write_all(get(host, "/garbage").as_bytes()).unwrap();
    assert_eq!(read_reply(&mut reader, false).status, 502);
    stream.write_all(get(host, "/echo").as_bytes()).unwrap();
    assert_eq!(
        read_reply(&mut reader, false).status,
        200,
        "the client connection survives a bad upstream"
    );
}

#[test]
fn bodies_of_every_framing_follow_each_other_on_one_connection() {
    let (scripted, web) = (scripted(), Backend::start("web"));
    let (_dir, ingress) = setup("handoff", &scripted, &web);
    let host = "w.example.com";
    let echo = |reply: &Reply| -> Echo { serde_json::from_slice(&reply.body).unwrap() };

    let (mut stream, mut reader) = connect(&ingress);
    stream.write_all(get(host, "/first").as_bytes()).unwrap();
    assert_eq!(echo(&read_reply(&mut reader, false)).uri, "/first");
    // A small body is sent with the head; a chunked one is streamed, re-encoded.
    stream
        .write_all(
            format!(
                "POST /small HTTP/1.1\r\nHost: {host}\r\nContent-Length: 11\r\n\r\nhello world"
            )
            .as_bytes(),
        )
        .unwrap();
    let e = echo(&read_reply(&mut reader, false));
    assert_eq!((e.method.as_str(), e.body_len), ("POST", 11));
    stream
        .write_all(format!("POST /chunked HTTP/1.1\r\nHost: {host}\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n").as_bytes())
        .unwrap();
    let e = echo(&read_reply(&mut reader, false));
    assert_eq!((e.uri.as_str(), e.body_len), ("/chunked", 5));
    stream.write_all(get(host, "/after").as_bytes()).unwrap();
    let reply = read_reply(&mut reader, false);
    assert_eq!(echo(&reply).uri, "/after");
    assert_eq!(
        echo(&reply)
            .headers
            .get("x-forwarded-for")
            .map(String::as_str),
        Some("127.0.0.1")
    );

    // Pipelined: three requests in one write, answered in order.
    let (mut stream, mut reader) = connect(&ingress);
    let three = get(host, "/p1") + &get(host, "/p2") + &get(host, "/p3");
    stream.write_all(three.as_bytes()).unwrap();
    for want in ["/p1", "/p2", "/p3"] {
        assert_eq!(echo(&read_reply(&mut reader, false)).uri, want);
    }

    // HTTP/1.0.
    let (mut stream, mut reader) = connect(&ingress);
    stream
        .write_all(format!("GET /old HTTP/1.0\r\nHost: {host}\r\n\r\n").as_bytes())
        .unwrap();
    let reply = read_reply(&mut reader, false);
    assert_eq!(echo(&reply).uri, "/old");

    // The client asks to close: told so, then closed.
    let (mut stream, mut reader) = connect(&ingress);
    stream
        .write_all(
            format!("GET /bye HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .unwrap();
    let reply = read_reply(&mut reader, false);
    assert_eq!(reply.header("connection"), Some("close"));
    let mut rest = Vec::new();
    assert_eq!(
        reader.read_to_end(&mut rest).unwrap(),
        0,
        "closed after the response"
    );

    // Local answers on the fast path: 404 for an unknown host, and the connection lives on.
    let (mut stream, mut reader) = connect(&ingress);
    stream
        .write_all(get("nobody.example.com", "/").as_bytes())
        .unwrap();
    let reply = read_reply(&mut reader, false);
    assert_eq!(
        (reply.status, reply.text().as_str()),
        (404, "404 Not Found\n")
    );
    stream.write_all(get(host, "/again").as_bytes()).unwrap();
    assert_eq!(echo(&read_reply(&mut reader, false)).uri, "/again");
}

#[test]
fn closed_upstream_connections_are_retried_only_when_safe() {
    let (scripted, web) = (scripted(), Backend::start("web"));
    let (_dir, ingress) = setup("retry", &scripted, &web);
    let host = "s.example.com";
    let (mut stream, mut reader) = connect(&ingress);
    // The upstream answers a connection's first request and drops it at the second, as an
    // upstream closing an idle kept-alive connection does when the request crosses the close.
    stream
        .write_all(get(host, "/drop-reused").as_bytes())
        .unwrap();
    assert_eq!(read_reply(&mut reader, false).status, 200);
    stream
        .write_all(get(host, "/drop-reused").as_bytes())
        .unwrap();
    let reply = read_reply(&mut reader, false);
    assert_eq!(
        (reply.status, reply.text().as_str()),
        (200, "GET /drop-reused body=0 served=0"),
        "a GET is sent again on a new connection"
    );
    assert_eq!(scripted.connections(), 2);
    stream
        .write_all(
            format!("POST /drop-reused HTTP/1.1\r\nHost: {host}\r\nContent-Length: 1\r\n\r\nx")
                .as_bytes(),
        )
        .unwrap();
    assert_eq!(
        read_reply(&mut reader, false).status,
        502,
        "a POST may have been acted on, so it is not sent twice"
    );
    assert_eq!(scripted.connections(), 2);

    // A pooled connection the upstream has since closed is noticed before it is used, so even
    // a POST, which is never resent, gets through.
    stream
        .write_all(get(host, "/then-close").as_bytes())
        .unwrap();
    assert_eq!(read_reply(&mut reader, false).status, 200);
    std::thread::sleep(Duration::from_millis(200));
    stream
        .write_all(
            format!("POST /echo HTTP/1.1\r\nHost: {host}\r\nContent-Length: 1\r\n\r\nx").as_bytes(),
        )
        .unwrap();
    let reply = read_reply(&mut reader, false);
    assert_eq!(
        (reply.status, reply.text().as_str()),
        (200, "POST /echo body=1 served=0")
    );
}

#[test]
fn shutdown_closes_idle_connections_and_finishes_busy_ones() {
    let (scripted, web) = (scripted(), Backend::start("web"));
    let (_dir, ingress) = setup("shutdown", &scripted, &web);
    let host = "w.example.com";
    let (mut idle, mut idle_reader) = connect(&ingress);
    idle.write_all(get(host, "/").as_bytes()).unwrap();
    assert_eq!(read_reply(&mut idle_reader, false).status, 200);

    let (mut busy, mut busy_reader) = connect(&ingress);
    busy.write_all(get(host, "/?delay_ms=1500").as_bytes())
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let started = Instant::now();
    ingress.terminate();

    let mut rest = Vec::new();
    assert_eq!(idle_reader.read_to_end(&mut rest).unwrap(), 0);
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "the idle connection closed at once, not after {:?}",
        started.elapsed()
    );
    let reply = read_reply(&mut busy_reader, false);
    assert_eq!(reply.status, 200, "the request in flight finished");
    assert_eq!(reply.header("connection"), Some("close"));
}
