use super::*;

fn respond(upstream: &str, ctx: ResponseContext<'_>) -> (ResponseParse, String) {
    let mut out = Vec::new();
    let parsed = rewrite(upstream.as_bytes(), &ctx, &mut out);
    let text = String::from_utf8(out)
        .unwrap()
        .lines()
        .filter(|l| !l.starts_with("date: "))
        .collect::<Vec<_>>()
        .join("|");
    (parsed, text)
}

const PLAIN: ResponseContext<'static> = ResponseContext {
    head_request: false,
    close: false,
    hsts: None,
    server: b"ingress",
    http10: false,
    upgrade: None,
    set_cookie: None,
    auth: None,
    set_headers: &[],
    edits: None,
    rewrite: None,
    own_headers: None,
};

/// A complete head with everything but `head_len` (checked against the input separately).
fn head(status: u16, framing: Framing, reusable: bool, close_client: bool) -> ResponseParse {
    ResponseParse::Complete(Response {
        head_len: 0,
        status,
        framing,
        reusable,
        close_client,
        informational: false,
        switching: false,
        dechunk: false,
        withheld: false,
    })
}

#[test]
fn response_heads_and_their_framing() {
    let hsts = ResponseContext {
        hsts: Some(b"max-age=60"),
        ..PLAIN
    };
    let http10 = ResponseContext {
        http10: true,
        ..PLAIN
    };
    let websocket = ResponseContext {
        upgrade: Some(b"websocket"),
        ..PLAIN
    };
    let chunked = Framing::Chunked(Chunked::default());
    let cases: Vec<(&str, ResponseContext<'_>, ResponseParse, &str)> = vec![
        (
            "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nServer: nginx\r\nX-A: 1\r\n\r\nhello",
            PLAIN,
            head(200, Framing::Length(5), true, false),
            "HTTP/1.1 200 OK|X-A: 1|server: ingress|content-length: 5|",
        ),
        // Both: chunked wins, Content-Length is dropped, and the connection is not reused.
        (
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 9\r\n\r\n",
            PLAIN,
            head(200, chunked, false, false),
            "HTTP/1.1 200 OK|server: ingress|transfer-encoding: chunked|",
        ),
        // Codings other than chunked stay on the bytes, so the header says so.
        (
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
            PLAIN,
            head(200, chunked, true, false),
            "HTTP/1.1 200 OK|server: ingress|transfer-encoding: gzip, chunked|",
        ),
        (
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n",
            PLAIN,
            head(200, Framing::UntilClose, false, true),
            "HTTP/1.1 200 OK|server: ingress|transfer-encoding: gzip|connection: close|",
        ),
        (
            "HTTP/1.1 200 OK\r\nConnection: close, x-hop\r\nX-Hop: 1\r\nContent-Length: 0\r\n\r\n",
            PLAIN,
            head(200, Framing::Length(0), false, false),
            "HTTP/1.1 200 OK|server: ingress|content-length: 0|",
        ),
        (
            "HTTP/1.1 200 OK\r\n\r\n",
            PLAIN,
            head(200, Framing::UntilClose, false, true),
            "HTTP/1.1 200 OK|server: ingress|connection: close|",
        ),
        (
            "HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\n",
            PLAIN,
            head(200, Framing::Length(2), false, false),
            "HTTP/1.1 200 OK|server: ingress|content-length: 2|",
        ),
        (
            "HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\n",
            PLAIN,
            head(200, Framing::Length(2), true, false),
            "HTTP/1.1 200 OK|server: ingress|content-length: 2|",
        ),
        (
            "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n",
            ResponseContext {
                head_request: true,
                close: true,
                ..PLAIN
            },
            head(200, Framing::Empty, true, true),
            "HTTP/1.1 200 OK|server: ingress|content-length: 5|connection: close|",
        ),
        (
            "HTTP/1.1 304 Not Modified\r\nETag: x\r\n\r\n",
            hsts,
            head(304, Framing::Empty, true, false),
            "HTTP/1.1 304 Not Modified|ETag: x|server: ingress|strict-transport-security: max-age=60|",
        ),
        // No Content-Length on a 204, whatever the upstream said.
        (
            "HTTP/1.1 204 No Content\r\nContent-Length: 7\r\n\r\n",
            PLAIN,
            head(204, Framing::Empty, true, false),
            "HTTP/1.1 204 No Content|server: ingress|",
        ),
        (
            "HTTP/1.1 200 OK\r\nStrict-Transport-Security: max-age=1\r\nContent-Length: 0\r\n\r\n",
            hsts,
            head(200, Framing::Length(0), true, false),
            "HTTP/1.1 200 OK|Strict-Transport-Security: max-age=1|server: ingress|content-length: 0|",
        ),
        (
            "HTTP/1.1 103 Early Hints\r\nLink: </a.css>\r\nContent-Length: 3\r\n\r\n",
            PLAIN,
            ResponseParse::Complete(Response {
                head_len: 0,
                status: 103,
                framing: Framing::Empty,
                reusable: true,
                close_client: false,
                informational: true,
                switching: false,
                dechunk: false,
                withheld: false,
            }),
            "HTTP/1.1 103 Early Hints|Link: </a.css>|",
        ),
        // HTTP/1.0 clients: no 1xx, no chunked framing.
        (
            "HTTP/1.1 100 Continue\r\n\r\n",
            http10,
            ResponseParse::Complete(Response {
                head_len: 0,
                status: 100,
                framing: Framing::Empty,
                reusable: true,
                close_client: false,
                informational: true,
                switching: false,
                dechunk: false,
                withheld: true,
            }),
            "",
        ),
        (
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
            http10,
            ResponseParse::Complete(Response {
                head_len: 0,
                status: 200,
                framing: chunked,
                reusable: true,
                close_client: true,
                informational: false,
                switching: false,
                dechunk: true,
                withheld: false,
            }),
            "HTTP/1.1 200 OK|server: ingress|connection: close|",
        ),
        (
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
            http10,
            ResponseParse::Invalid("a transfer coding an HTTP/1.0 client cannot be sent"),
            "",
        ),
        (
            "HTTP/1.1 101 Switching Protocols\r\nUpgrade: WebSocket\r\nConnection: upgrade\r\nSec-WebSocket-Accept: x\r\n\r\n",
            websocket,
            ResponseParse::Complete(Response {
                head_len: 0,
                status: 101,
                framing: Framing::Empty,
                reusable: true,
                close_client: false,
                informational: false,
                switching: true,
                dechunk: false,
                withheld: false,
            }),
            "HTTP/1.1 101 Switching Protocols|Sec-WebSocket-Accept: x|upgrade: WebSocket|connection: upgrade|",
        ),
        (
            "HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\n\r\n",
            websocket,
            ResponseParse::Invalid("switched to a protocol that was not asked for"),
            "",
        ),
        (
            "HTTP/1.1 101 Switching Protocols\r\n\r\n",
            PLAIN,
            ResponseParse::Invalid("switching protocols without an upgrade"),
            "",
        ),
        (
            "HTTP/1.1 200 OK\r\nContent-Le",
            PLAIN,
            ResponseParse::Partial,
            "",
        ),
        (
            "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
            PLAIN,
            ResponseParse::Invalid("invalid content-length"),
            "",
        ),
        (
            "HTTP/1.1 099 Odd\r\nContent-Length: 0\r\n\r\n",
            PLAIN,
            ResponseParse::Invalid("status code outside 100-599"),
            "",
        ),
        (
            "HTTP/1.1 600 Odd\r\nContent-Length: 0\r\n\r\n",
            PLAIN,
            ResponseParse::Invalid("status code outside 100-599"),
            "",
        ),
        (
            "SSH-2.0-OpenSSH\r\n\r\n",
            PLAIN,
            ResponseParse::Invalid("malformed response head"),
            "",
        ),
    ];
    for (upstream, ctx, want, want_text) in cases {
        let (mut got, text) = respond(upstream, ctx);
        if let ResponseParse::Complete(r) = &mut got {
            let end = upstream.find("\r\n\r\n").unwrap() + 4;
            assert_eq!(r.head_len, end, "{upstream:?}");
            r.head_len = 0;
        }
        assert_eq!(got, want, "{upstream:?}");
        if matches!(got, ResponseParse::Complete(_)) {
            assert_eq!(text, want_text, "{upstream:?}");
        }
    }
}

#[test]
fn local_responses() {
    let mut out = Vec::new();
    write_local(
        &mut out,
        StatusCode::PERMANENT_REDIRECT,
        Some("https://a/x"),
        &ResponseContext {
            close: true,
            ..PLAIN
        },
    );
    let text = String::from_utf8(out).unwrap();
    assert!(
        text.starts_with("HTTP/1.1 308 Permanent Redirect\r\n"),
        "{text}"
    );
    assert!(text.contains("\r\nlocation: https://a/x\r\n"), "{text}");
    assert!(text.contains("\r\nconnection: close\r\n"), "{text}");
    assert!(text.ends_with("\r\n\r\n308 Permanent Redirect\n"), "{text}");
    let mut out = Vec::new();
    write_local(
        &mut out,
        StatusCode::NOT_FOUND,
        None,
        &ResponseContext {
            head_request: true,
            ..PLAIN
        },
    );
    let text = String::from_utf8(out).unwrap();
    assert!(text.contains("content-length: 14\r\n"), "{text}");
    assert!(text.ends_with("\r\n\r\n"), "HEAD has no body: {text}");
}

#[test]
fn dates_are_http_dates() {
    let date = http_date();
    let text = std::str::from_utf8(&date).unwrap();
    assert!(httpdate::parse_http_date(text).is_ok(), "{text}");
}

/// add-headers on an own answer: each header it does not carry yet, once.
#[test]
fn local_responses_get_the_global_add_headers_they_lack() {
    use http::{HeaderName, HeaderValue};
    let own = ResponseEdits {
        replace: vec![
            (
                HeaderName::from_static("x-frame-options"),
                Some(HeaderValue::from_static("DENY")),
            ),
            (
                HeaderName::from_static("server"),
                Some(HeaderValue::from_static("evil")),
            ),
            (
                HeaderName::from_static("location"),
                Some(HeaderValue::from_static("/elsewhere")),
            ),
        ],
        add: Vec::new(),
    };
    // (a Location of its own, headers expected, headers not expected)
    let cases: [(Option<&str>, &[&str], &[&str]); 2] = [
        (
            None,
            &[
                "x-frame-options: DENY",
                "server: ingress",
                "location: /elsewhere",
            ],
            &["server: evil"],
        ),
        (
            Some("https://a/"),
            &["x-frame-options: DENY", "location: https://a/"],
            &["location: /elsewhere", "server: evil"],
        ),
    ];
    for (location, present, absent) in cases {
        let mut out = Vec::new();
        let code = if location.is_some() {
            StatusCode::FOUND
        } else {
            StatusCode::NOT_FOUND
        };
        write_local(
            &mut out,
            code,
            location,
            &ResponseContext {
                own_headers: Some(&own),
                ..PLAIN
            },
        );
        let text = String::from_utf8(out).unwrap();
        for header in present {
            assert_eq!(
                text.matches(&format!("\r\n{header}\r\n")).count(),
                1,
                "{header}: {text}"
            );
        }
        for header in absent {
            assert!(!text.contains(header), "{header}: {text}");
        }
    }
}
