//! Every connection is bounded in time: slow and silent clients and upstreams, each sent as
//! the exact bytes an attacker would, against the real binary with short timeouts; and the
//! connection caps, in all and per client.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::disallowed_methods)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use ingress_tests::manifests::{ingress, one_route, service, service_at};
use ingress_tests::process::Ingress;
use ingress_tests::raw::{RawConn, get};
use ingress_tests::scratch::Scratch;
use ingress_tests::scripted::{Answer, Scripted};
use ingress_tests::upstream::Backend;

/// Every timeout at one second, so each case takes about that long.
const SHORT: &[&str] = &[
    "--header-read-timeout",
    "1s",
    "--client-keepalive-timeout",
    "1s",
    "--client-body-timeout",
    "1s",
    "--client-send-timeout",
    "1s",
    "--upstream-send-timeout",
    "1s",
    "--upstream-response-timeout",
    "1s",
];

/// How long past its timeout a connection may take to be closed on a busy test machine.
const SLACK: Duration = Duration::from_secs(3);

struct Rig {
    ingress: Ingress,
    _web: Backend,
    _dir: Scratch,
}

fn rig(name: &str, upstream: Option<SocketAddr>, extra: &[&str]) -> Rig {
    let web = Backend::start("web");
    let dir = Scratch::new(name);
    let mut yaml = one_route("t", "web", "w.example", &web);
    if let Some(addr) = upstream {
        yaml += &service_at("t", "up", &[addr]);
        yaml += &ingress("t", "up", &[("u.example", "/", "Prefix", "up")]);
    }
    dir.write("a.yaml", &yaml);
    // A flag given in `extra` replaces its one-second default.
    let short = SHORT
        .chunks(2)
        .filter(|pair| !extra.contains(&pair[0]))
        .flatten()
        .copied();
    let ingress = Ingress::builder()
        .manifests(dir.path())
        .args(short)
        .args(extra.iter().copied())
        .start();
    Rig {
        ingress,
        _web: web,
        _dir: dir,
    }
}

fn assert_closed(conn: &mut RawConn, what: &str) -> Duration {
    let took = conn
        .closes_within(Duration::from_secs(1) + SLACK)
        .unwrap_or_else(|| panic!("{what}: still open"));
    assert!(
        took >= Duration::from_millis(800),
        "{what}: closed after {took:?}, before its timeout"
    );
    took
}

#[test]
fn silent_and_slow_clients_are_closed_on_time() {
    let rig = rig("limits-slow", None, &[]);
    let addr = rig.ingress.http;
    let cases: &[(&str, &[u8])] = &[
        ("nothing at all", b""),
        ("a partial head", b"GET / HTTP/1.1\r\nHo"),
        ("a cut-short HTTP/2 preface", b"PRI * HTTP/2.0\r\n"),
        (
            "a whole HTTP/2 preface, no SETTINGS",
            b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
        ),
        (
            "an HTTP/2 preface and SETTINGS, then silence",
            b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00",
        ),
    ];
    for (what, bytes) in cases {
        let mut conn = RawConn::connect(addr);
        conn.send(bytes);
        assert_closed(&mut conn, what);
    }
    // A kept-alive connection waits for its next request only so long.
    let mut conn = RawConn::connect(addr);
    assert_eq!(conn.exchange(get("w.example", "/").as_bytes()).status, 200);
    assert_closed(&mut conn, "an idle kept-alive connection");
}

#[test]
fn a_stalled_request_body_is_answered_408_and_closed() {
    let rig = rig("limits-body", None, &[]);
    for (what, head, part) in [
        (
            "a Content-Length body",
            "POST / HTTP/1.1\r\nHost: w.example\r\nContent-Length: 60000\r\n\r\n",
            vec![b'x'; 30_000],
        ),
        (
            "a small Content-Length body",
            "POST / HTTP/1.1\r\nHost: w.example\r\nContent-Length: 100\r\n\r\n",
            vec![b'x'; 50],
        ),
        (
            "a chunked body",
            "POST / HTTP/1.1\r\nHost: w.example\r\nTransfer-Encoding: chunked\r\n\r\n",
            b"10\r\n0123456789abcdef\r\n".to_vec(),
        ),
    ] {
        let mut conn = RawConn::connect(rig.ingress.http);
        conn.send(head.as_bytes());
        conn.send(&part);
        let started = Instant::now();
        let reply = conn.reply();
        // A small body is read before the upstream is asked; a large one is streamed to it.
        // Either way the client is told it was too slow.
        assert_eq!(reply.status, 408, "{what}: {}", reply.text());
        assert!(started.elapsed() >= Duration::from_millis(800), "{what}");
        conn.closes_within(SLACK)
            .unwrap_or_else(|| panic!("{what}: still open"));
    }
}

/// An upstream that accepts and then neither reads nor answers.
fn black_hole() -> (SocketAddr, std::thread::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let thread = std::thread::spawn(move || {
        let mut held = Vec::new();
        listener.set_nonblocking(true).unwrap();
        let until = Instant::now() + Duration::from_secs(30);
        while Instant::now() < until {
            match listener.accept() {
                Ok((stream, _)) => held.push(stream),
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    });
    (addr, thread)
}

#[test]
fn an_upstream_that_stops_reading_or_answering_is_given_up_on() {
    let (hole, _thread) = black_hole();
    // The upload below is far over the default 1m body limit, which would answer it 413 at
    // once; this test is about an upstream that stops reading.
    let rig = rig("limits-upstream", Some(hole), &["--proxy-body-size", "0"]);
    // It never answers: 504 after the response timeout.
    let mut conn = RawConn::connect(rig.ingress.http);
    let started = Instant::now();
    let reply = conn.exchange(get("u.example", "/").as_bytes());
    assert_eq!(reply.status, 504);
    assert!(started.elapsed() >= Duration::from_millis(800));
    // It never reads a large upload: the write stalls, and the client is told.
    let mut stream = TcpStream::connect(rig.ingress.http).unwrap();
    stream
        .set_write_timeout(Some(Duration::from_secs(3)))
        .unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    const UPLOAD: usize = 256 * 1024 * 1024;
    write!(
        stream,
        "POST / HTTP/1.1\r\nHost: u.example\r\nContent-Length: {UPLOAD}\r\n\r\n"
    )
    .unwrap();
    let block = vec![b'x'; 64 * 1024];
    let mut sent = 0;
    while sent < UPLOAD {
        match stream.write(&block) {
            Ok(n) => sent += n,
            Err(_) => break,
        }
    }
    assert!(sent < UPLOAD, "the whole upload went into a black hole");
    let reply = ingress_tests::raw::read_reply(&mut std::io::BufReader::new(stream), false);
    assert_eq!(reply.status, 502, "{}", reply.text());
}

/// An upstream that sends its head and half its body, then pauses for `pause`.
fn pauses_mid_body(pause: Duration) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming().take(4) {
            let Ok(mut stream) = stream else { return };
            std::thread::spawn(move || {
                let mut head = [0u8; 4096];
                let _ = stream.read(&mut head);
                let _ = stream.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhalf.");
                std::thread::sleep(pause);
                let _ = stream.write_all(b"rest.");
            });
        }
    });
    addr
}

#[test]
fn an_upstream_that_pauses_mid_response_is_cut_off() {
    let rig = rig(
        "limits-pause",
        Some(pauses_mid_body(Duration::from_secs(6))),
        &[],
    );
    let mut stream = TcpStream::connect(rig.ingress.http).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(1) + SLACK))
        .unwrap();
    stream.write_all(get("u.example", "/").as_bytes()).unwrap();
    let started = Instant::now();
    let mut got = Vec::new();
    let read = stream.read_to_end(&mut got);
    assert!(read.is_ok(), "not closed: {read:?}");
    let took = started.elapsed();
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{text}");
    assert!(
        text.ends_with("\r\n\r\nhalf."),
        "only what came before the pause: {text}"
    );
    assert!(
        took >= Duration::from_millis(800) && took < Duration::from_secs(1) + SLACK,
        "{took:?}"
    );
}

#[test]
fn a_client_that_stops_reading_is_dropped() {
    const BIG: usize = 64 * 1024 * 1024;
    let upstream = Scripted::start(|_| {
        let mut bytes = format!("HTTP/1.1 200 OK\r\nContent-Length: {BIG}\r\n\r\n").into_bytes();
        bytes.resize(bytes.len() + BIG, b'x');
        Answer::Bytes(bytes)
    });
    let rig = rig("limits-reader", Some(upstream.addr), &[]);
    let mut stream = TcpStream::connect(rig.ingress.http).unwrap();
    stream
        .write_all(get("u.example", "/big").as_bytes())
        .unwrap();
    let active = || {
        rig.ingress
            .metric("ingress_connections_active", &[("listener", "http")])
            .unwrap_or(0.0)
    };
    let until = Instant::now() + Duration::from_secs(5);
    while active() < 1.0 && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(active(), 1.0);
    // The client reads nothing; the socket buffers fill, and the proxy's writes stall.
    let started = Instant::now();
    while active() > 0.0 && started.elapsed() < Duration::from_secs(1) + SLACK + SLACK {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(active(), 0.0, "the connection is still held");
    assert!(started.elapsed() >= Duration::from_millis(500));
    let mut sink = Vec::new();
    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
    let _ = stream.read_to_end(&mut sink);
    assert!(sink.len() < BIG, "the whole body arrived after all");
}

#[tokio::test(flavor = "multi_thread")]
async fn http2_connections_are_watched() {
    let rig = rig("limits-h2", None, &[]);
    let addr = rig.ingress.http;
    // After a request, an HTTP/2 connection with no stream is closed after the keep-alive
    // timeout (GOAWAY).
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(stream),
    )
    .await
    .unwrap();
    let conn = tokio::spawn(conn);
    let req = http::Request::get("http://w.example/")
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .unwrap();
    let response = sender.send_request(req).await.unwrap();
    assert_eq!(response.status(), 200);
    drop(response);
    let started = Instant::now();
    let ended = tokio::time::timeout(Duration::from_secs(1) + SLACK, conn).await;
    assert!(ended.is_ok(), "the idle HTTP/2 connection is still open");
    assert!(started.elapsed() >= Duration::from_millis(800));
}

/// One HTTP/2 frame: type, flags, stream and payload.
struct Frame {
    kind: u8,
    flags: u8,
    payload: Vec<u8>,
}

const PING: u8 = 0x6;
const SETTINGS: u8 = 0x4;
const ACK: u8 = 0x1;

fn read_frame(stream: &mut TcpStream) -> std::io::Result<Frame> {
    let mut head = [0u8; 9];
    stream.read_exact(&mut head)?;
    let len = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
    let mut payload = vec![0u8; len];
    stream.read_exact(&mut payload)?;
    Ok(Frame {
        kind: head[3],
        flags: head[4],
        payload,
    })
}

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = u32::try_from(payload.len()).unwrap().to_be_bytes();
    let mut out = vec![len[1], len[2], len[3], kind, flags];
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// A peer that stops answering PINGs (a client whose network went away without a FIN) is
/// closed once a PING goes unanswered for the PING timeout, even with a request open; a peer
/// that answers them keeps its connection as long as its request lasts.
#[test]
fn http2_peers_that_stop_answering_pings_are_closed() {
    let (hole, _thread) = black_hole();
    let rig = rig(
        "limits-ping",
        Some(hole),
        &[
            "--http2-ping-interval",
            "1s",
            "--http2-ping-timeout",
            "1s",
            "--upstream-response-timeout",
            "20s",
            "--client-keepalive-timeout",
            "20s",
        ],
    );
    for answers in [true, false] {
        let mut stream = TcpStream::connect(rig.ingress.http).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        // Prior knowledge h2c: the preface, empty SETTINGS, and a GET to the black hole, whose
        // header block is `:method GET`, `:scheme http`, `:path /` (static table) and a literal
        // `:authority u.example`.
        let mut hello = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        hello.extend(frame(SETTINGS, 0, 0, &[]));
        let mut block = vec![0x82, 0x86, 0x84, 0x01, 9];
        block.extend_from_slice(b"u.example");
        hello.extend(frame(0x1, 0x4 | 0x1, 1, &block));
        stream.write_all(&hello).unwrap();
        let started = Instant::now();
        let mut pings = 0;
        let closed = loop {
            if started.elapsed() > Duration::from_secs(6) {
                break None;
            }
            match read_frame(&mut stream) {
                Ok(f) if f.kind == SETTINGS && f.flags & ACK == 0 => {
                    stream.write_all(&frame(SETTINGS, ACK, 0, &[])).unwrap();
                }
                Ok(f) if f.kind == PING && f.flags & ACK == 0 => {
                    pings += 1;
                    if answers {
                        stream.write_all(&frame(PING, ACK, 0, &f.payload)).unwrap();
                    }
                }
                Ok(_) => {}
                Err(err)
                    if matches!(
                        err.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                Err(_) => break Some(started.elapsed()),
            }
        };
        assert!(
            pings >= 1,
            "answers={answers}: no PING in {:?}",
            started.elapsed()
        );
        if answers {
            assert_eq!(closed, None, "closed although every PING was answered");
            assert!(pings >= 3, "one PING a second, got {pings}");
        } else {
            let closed = closed.expect("still open although no PING was answered");
            assert!(
                closed >= Duration::from_millis(1800) && closed < Duration::from_secs(2) + SLACK,
                "closed after {closed:?}: one interval and one timeout were due"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_tls_client_that_negotiates_http2_and_says_nothing_is_closed() {
    let web = Backend::start("web");
    let ca = ingress_tests::pki::Ca::new("limits CA");
    let leaf = ca.leaf(
        "s.example",
        &["s.example"],
        ingress_tests::pki::KeyKind::EcdsaP256,
        ingress_tests::pki::KeyFormat::Pkcs8,
        false,
    );
    let dir = Scratch::new("limits-tls");
    dir.write(
        "a.yaml",
        &(service("t", "web", &[&web])
            + &ingress_tests::pki::secret_yaml("t", "s", &leaf.chain, &leaf.key)
            + "---\napiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {name: s, namespace: t}\nspec:\n  ingressClassName: ingress\n  tls: [{hosts: [s.example], secretName: s}]\n  rules:\n  - host: s.example\n    http: {paths: [{path: /, pathType: Prefix, backend: {service: {name: web, port: {number: 80}}}}]}\n"),
    );
    let ingress = Ingress::builder()
        .manifests(dir.path())
        .args(SHORT.iter().copied())
        .start();
    let connector = tokio_rustls::TlsConnector::from(ca.client_config(&[b"h2"]));
    let tcp = tokio::net::TcpStream::connect(ingress.https).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("s.example").unwrap();
    let mut tls = connector.connect(name, tcp).await.unwrap();
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let started = Instant::now();
    let mut buf = Vec::new();
    let read = tokio::time::timeout(
        Duration::from_secs(1) + SLACK,
        tokio::io::AsyncReadExt::read_to_end(&mut tls, &mut buf),
    )
    .await;
    assert!(read.is_ok(), "still open");
    assert!(started.elapsed() >= Duration::from_millis(800));
}

#[test]
fn connection_caps_close_the_excess_at_once_and_count_it() {
    let rig = rig(
        "limits-caps",
        None,
        &[
            "--max-connections",
            "4",
            "--max-connections-per-client",
            "2",
            "--client-keepalive-timeout",
            "30s",
        ],
    );
    let addr = rig.ingress.http;
    let from = |ip: &str| {
        let socket =
            socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        socket
            .bind(&format!("{ip}:0").parse::<SocketAddr>().unwrap().into())
            .unwrap();
        socket.connect(&addr.into()).unwrap();
        let stream: TcpStream = socket.into();
        stream
            .set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        stream
    };
    let alive = |stream: &mut TcpStream| -> bool {
        let mut byte = [0u8; 1];
        match stream.read(&mut byte) {
            Ok(0) => false,
            Ok(_) => true,
            Err(err) => matches!(
                err.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ),
        }
    };
    let mut a1 = from("127.0.0.1");
    let mut a2 = from("127.0.0.1");
    let mut a3 = from("127.0.0.1");
    assert!(alive(&mut a1) && alive(&mut a2));
    assert!(!alive(&mut a3), "a third connection from one client");
    let mut b1 = from("127.0.0.2");
    let mut b2 = from("127.0.0.2");
    assert!(alive(&mut b1) && alive(&mut b2));
    let mut c1 = from("127.0.0.3");
    assert!(!alive(&mut c1), "a fifth connection in all");
    let refused = |reason: &str| {
        rig.ingress
            .metric("ingress_connections_refused_total", &[("reason", reason)])
    };
    assert_eq!(refused("max_connections_per_client"), Some(1.0));
    assert_eq!(refused("max_connections"), Some(1.0));
    // Places come back when connections close.
    drop(a1);
    std::thread::sleep(Duration::from_millis(200));
    let mut c2 = from("127.0.0.3");
    assert!(alive(&mut c2));
    c2.write_all(get("w.example", "/").as_bytes()).unwrap();
    c2.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut reply = [0u8; 12];
    c2.read_exact(&mut reply).unwrap();
    assert_eq!(&reply, b"HTTP/1.1 200");
}
