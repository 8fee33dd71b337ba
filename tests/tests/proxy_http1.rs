//! The HTTP/1.x path with raw sockets on both sides: every way a response body can be framed,
//! request bodies of every framing one after another on one connection, pipelining, retries of
//! kept-alive upstream connections that turn out closed, and shutdown of idle connections.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::disallowed_methods)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use ingress_tests::manifests::{ingress, service, service_at};
use ingress_tests::ports::listen_loopback;
use ingress_tests::process::Ingress;
use ingress_tests::scratch::Scratch;
use ingress_tests::upstream::{Backend, Echo};

const BIG: usize = 1024 * 1024;

/// The bytes of the large body: a period that is not a power of two, so a misplaced chunk shows.
fn pattern(i: usize) -> u8 {
    u8::try_from(i % 251).unwrap_or(0)
}

/// An upstream that answers by path with exactly the bytes a test needs.
struct Scripted {
    addr: SocketAddr,
    connections: Arc<AtomicUsize>,
}

impl Scripted {
    fn start() -> Scripted {
        let listener = listen_loopback();
        let addr = listener.local_addr().unwrap();
        let connections = Arc::new(AtomicUsize::new(0));
        let counter = connections.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { return };
                counter.fetch_add(1, Ordering::SeqCst);
                std::thread::spawn(move || serve_scripted(stream));
            }
        });
        Scripted { addr, connections }
    }
}

fn serve_scripted(stream: TcpStream) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut out = stream;
    let mut served = 0;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let mut parts = line.split_whitespace();
        let (method, path) = (
            parts.next().unwrap_or("").to_string(),
            parts.next().unwrap_or("").to_string(),
        );
        let mut length = 0usize;
        loop {
            let mut header = String::new();
            if reader.read_line(&mut header).unwrap_or(0) == 0 {
                return;
            }
            if header == "\r\n" {
                break;
            }
            if let Some((name, value)) = header.split_once(':')
                && name.eq_ignore_ascii_case("content-length")
            {
                length = value.trim().parse().unwrap();
            }
        }
        let mut body = vec![0; length];
        reader.read_exact(&mut body).unwrap();
        let reply: Vec<u8> = match path.as_str() {
            "/chunked" => b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\nX-Trailer: t\r\n\r\n".to_vec(),
            "/close" => {
                let _ = out.write_all(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nuntil the upstream closes");
                return;
            }
            "/big" => {
                let mut r = format!("HTTP/1.1 200 OK\r\nContent-Length: {BIG}\r\n\r\n").into_bytes();
                if method != "HEAD" {
                    r.extend((0..BIG).map(pattern));
                }
                r
            }
            "/no-content" => b"HTTP/1.1 204 No Content\r\nX-Was: empty\r\n\r\n".to_vec(),
            "/hints" => b"HTTP/1.1 103 Early Hints\r\nLink: </s.css>\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok".to_vec(),
            "/garbage" => b"NOT HTTP AT ALL\r\n\r\n".to_vec(),
            "/drop-reused" if served > 0 => return,
            // Answers, then closes as an upstream's idle timeout would, with no warning.
            "/then-close" => {
                let _ = out.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok");
                return;
            }
            _ => {
                let text = format!("{method} {path} body={} served={served}", body.len());
                format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{text}", text.len()).into_bytes()
            }
        };
        if out.write_all(&reply).is_err() {
            return;
        }
        served += 1;
    }
}

/// One response as a client reads it.
#[derive(Debug)]
struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// Reads one response, decoding whichever framing it has.
fn read_reply(reader: &mut BufReader<TcpStream>, head_request: bool) -> Reply {
    let mut line = String::new();
    reader.read_line(&mut line).expect("status line");
    let status: u16 = line
        .split_whitespace()
        .nth(1)
        .unwrap_or_else(|| panic!("no status in {line:?}"))
        .parse()
        .unwrap();
    let mut headers = Vec::new();
    loop {
        let mut header = String::new();
        reader.read_line(&mut header).unwrap();
        if header == "\r\n" || header.is_empty() {
            break;
        }
        let (n, v) = header.split_once(':').unwrap();
        headers.push((n.trim().to_string(), v.trim().to_string()));
    }
    let mut reply = Reply {
        status,
        headers,
        body: Vec::new(),
    };
    if head_request || status < 200 || status == 204 || status == 304 {
        return reply;
    }
    if reply.header("transfer-encoding") == Some("chunked") {
        loop {
            let mut size = String::new();
            reader.read_line(&mut size).unwrap();
            let size = usize::from_str_radix(size.trim().split(';').next().unwrap(), 16).unwrap();
            if size == 0 {
                // Trailers, then the empty line.
                loop {
                    let mut t = String::new();
                    reader.read_line(&mut t).unwrap();
                    if t == "\r\n" {
                        break;
                    }
                }
                break;
            }
            let mut chunk = vec![0; size + 2];
            reader.read_exact(&mut chunk).unwrap();
            reply.body.extend_from_slice(&chunk[..size]);
        }
    } else if let Some(len) = reply.header("content-length") {
        let mut body = vec![0; len.parse().unwrap()];
        reader.read_exact(&mut body).unwrap();
        reply.body = body;
    } else {
        reader.read_to_end(&mut reply.body).unwrap();
    }
    reply
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

fn get(host: &str, path: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n")
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
    let (scripted, web) = (Scripted::start(), Backend::start("web"));
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
    assert_eq!(scripted.connections.load(Ordering::SeqCst), 1);

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
    let (scripted, web) = (Scripted::start(), Backend::start("web"));
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
    let (scripted, web) = (Scripted::start(), Backend::start("web"));
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
    assert_eq!(scripted.connections.load(Ordering::SeqCst), 2);
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
    assert_eq!(scripted.connections.load(Ordering::SeqCst), 2);

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
    let (scripted, web) = (Scripted::start(), Backend::start("web"));
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
