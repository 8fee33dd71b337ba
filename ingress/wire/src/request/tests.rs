use super::*;
use crate::target::{self, PathSettings};

fn parse_text(text: &[u8]) -> String {
    let mut storage = [httparse::EMPTY_HEADER; MAX_HEADERS];
    match parse(text, &mut storage) {
        RequestParse::Partial => "partial".into(),
        RequestParse::H2Preface => "h2".into(),
        RequestParse::Reject(r) => format!("{} {}", r.status.as_u16(), r.reason),
        RequestParse::Complete(r) => format!(
            "{} {} {:?} host={} body={:?} close={} continue={} upgrade={} len={}",
            r.method,
            r.target,
            r.version,
            r.authority.as_ref().map_or("-", |a| a.raw),
            r.body,
            r.close,
            r.expect_continue,
            r.upgrade
                .map_or("-".into(), |u| String::from_utf8_lossy(u).into_owned()),
            r.head_len
        ),
    }
}

#[test]
fn request_heads() {
    let cases: &[(&[u8], &str)] = &[
        (
            b"GET / HTTP/1.1\r\nHost: a\r\n\r\n",
            "GET / Http11 host=a body=None close=false continue=false upgrade=- len=27",
        ),
        (
            b"GET /x?y HTTP/1.1\r\nhost: a.b:8080\r\nConnection: keep-alive, Close\r\n\r\n",
            "GET /x?y Http11 host=a.b:8080 body=None close=true continue=false upgrade=- len=68",
        ),
        (
            b"POST /f HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello",
            "POST /f Http11 host=a body=Length(5) close=false continue=false upgrade=- len=48",
        ),
        (
            b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n",
            "POST / Http11 host=a body=None close=false continue=false upgrade=- len=47",
        ),
        (
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n",
            "POST / Http11 host=a body=Chunked close=false continue=false upgrade=- len=56",
        ),
        (
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: CHUNKED\r\n\r\n",
            "POST / Http11 host=a body=Chunked close=false continue=false upgrade=- len=56",
        ),
        (
            b"PUT / HTTP/1.1\r\nHost: a\r\nExpect: 100-Continue\r\nContent-Length: 5\r\n\r\n",
            "PUT / Http11 host=a body=Length(5) close=false continue=true upgrade=- len=68",
        ),
        (
            b"GET / HTTP/1.0\r\n\r\n",
            "GET / Http10 host=- body=None close=true continue=false upgrade=- len=18",
        ),
        (
            b"GET / HTTP/1.0\r\nExpect: 100-continue\r\n\r\n",
            "GET / Http10 host=- body=None close=true continue=false upgrade=- len=40",
        ),
        (
            b"GET http://a.example/x?y HTTP/1.1\r\nHost: b.example\r\n\r\n",
            "GET /x?y Http11 host=a.example body=None close=false continue=false upgrade=- len=54",
        ),
        (
            b"GET https://a.example HTTP/1.1\r\nHost: a.example\r\n\r\n",
            "GET / Http11 host=a.example body=None close=false continue=false upgrade=- len=51",
        ),
        (
            b"GET HTTP://a.example?q HTTP/1.1\r\nHost: a.example\r\n\r\n",
            "GET /?q Http11 host=a.example body=None close=false continue=false upgrade=- len=52",
        ),
        (
            b"GET / HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n",
            "GET / Http11 host=a body=None close=false continue=false upgrade=websocket len=68",
        ),
        (
            b"GET / HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\n\r\n",
            "GET / Http11 host=a body=None close=false continue=false upgrade=- len=47",
        ),
        (
            b"GET / HTTP/1.1\nHost: a\n\n",
            "GET / Http11 host=a body=None close=false continue=false upgrade=- len=24",
        ),
        (b"GET / HTTP/1.1\r\nHost: a\r\n", "partial"),
        (b"PRI * HTTP/2.0\r\n", "partial"),
        (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", "h2"),
        (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00", "h2"),
        // Host.
        (b"GET / HTTP/1.1\r\n\r\n", "400 no Host header"),
        (
            b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
            "400 more than one Host header",
        ),
        (
            b"GET / HTTP/1.1\r\nHost: a\r\nHost: a\r\n\r\n",
            "400 more than one Host header",
        ),
        (b"GET / HTTP/1.1\r\nHost: a:80@evil\r\n\r\n", "400 invalid Host header"),
        (b"GET / HTTP/1.1\r\nHost: \r\n\r\n", "400 invalid Host header"),
        (b"GET / HTTP/1.1\r\nHost: a b\r\n\r\n", "400 invalid Host header"),
        (b"GET http://a/ HTTP/1.1\r\n\r\n", "400 no Host header"),
        (
            b"GET http://a@b/ HTTP/1.1\r\nHost: b\r\n\r\n",
            "400 invalid authority in the target",
        ),
        (
            b"GET / HTTP/1.0\r\nHost: a\r\nHost: b\r\n\r\n",
            "400 more than one Host header",
        ),
        // Framing: the smuggling classics.
        (
            b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
            "400 both Transfer-Encoding and Content-Length",
        ),
        (
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n",
            "400 both Transfer-Encoding and Content-Length",
        ),
        (
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, identity\r\n\r\n",
            "501 a transfer coding other than chunked",
        ),
        (
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
            "501 a transfer coding other than chunked",
        ),
        (
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: xchunked\r\n\r\n",
            "501 a transfer coding other than chunked",
        ),
        (
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
            "400 invalid Transfer-Encoding",
        ),
        (
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, chunked\r\n\r\n",
            "400 invalid Transfer-Encoding",
        ),
        (
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding:\r\n\r\n",
            "400 invalid Transfer-Encoding",
        ),
        (
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding : chunked\r\n\r\n",
            "400 malformed request head",
        ),
        (
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer_Encoding: chunked\r\nContent-Length: 5\r\n\r\n",
            "POST / Http11 host=a body=Length(5) close=false continue=false upgrade=- len=75",
        ),
        (
            b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n",
            "400 Transfer-Encoding in HTTP/1.0",
        ),
        (
            b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n",
            "400 more than one Content-Length",
        ),
        (
            b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5, 5\r\n\r\n",
            "400 invalid Content-Length",
        ),
        (
            b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: +5\r\n\r\n",
            "400 invalid Content-Length",
        ),
        (
            b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 0x5\r\n\r\n",
            "400 invalid Content-Length",
        ),
        (
            b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 99999999999999999999\r\n\r\n",
            "400 invalid Content-Length",
        ),
        (
            b"GET / HTTP/1.1\r\nHost: a\r\nX: a\r\n b\r\n\r\n",
            "400 malformed request head",
        ),
        (
            b"GET / HTTP/1.1\r\nHost: a\r\nX: a\rb\r\n\r\n",
            "400 malformed request head",
        ),
        (b"GET / HTTP/1.1\r\nBad Header: x\r\n\r\n", "400 malformed request head"),
        (b"GET / HTTP/1.1\r\n Host: a\r\n\r\n", "400 malformed request head"),
        (b"\x16\x03\x01\x00", "400 malformed request head"),
        // Methods, targets, versions, expectations.
        (b"CONNECT a:443 HTTP/1.1\r\nHost: a\r\n\r\n", "400 CONNECT is not served"),
        (b"TRACE / HTTP/1.1\r\nHost: a\r\n\r\n", "405 TRACE is not served"),
        (
            b"OPTIONS * HTTP/1.1\r\nHost: a\r\n\r\n",
            "400 the request target is not a path",
        ),
        (
            b"GET ftp://a/x HTTP/1.1\r\nHost: a\r\n\r\n",
            "400 the request target's scheme is not http or https",
        ),
        (b"GET / HTTP/2.0\r\nHost: a\r\n\r\n", "505 unsupported HTTP version"),
        (b"GET / HTTP/1.2\r\nHost: a\r\n\r\n", "505 unsupported HTTP version"),
        (b"GET / HTTP/x\r\nHost: a\r\n\r\n", "400 malformed request head"),
        (
            b"GET / HTTP/1.1\r\nHost: a\r\nExpect: foo\r\n\r\n",
            "417 unsupported expectation",
        ),
    ];
    for (input, want) in cases {
        assert_eq!(
            parse_text(input),
            *want,
            "{:?}",
            String::from_utf8_lossy(input)
        );
    }
    let many: String = (0..=MAX_HEADERS).map(|i| format!("X-{i}: v\r\n")).collect();
    let text = format!("GET / HTTP/1.1\r\nHost: a\r\n{many}\r\n");
    assert_eq!(parse_text(text.as_bytes()), "431 too many header lines");
}

#[test]
fn upstream_framing_and_upgrades() {
    let client = ClientFacts {
        ip: b"192.0.2.7",
        forwarded_for: b"192.0.2.7",
        port: b"80",
        https: false,
        host: None,
    };
    let paths = PathSettings::default();
    let cases: &[(&[u8], UpstreamBody, bool, &[&str], &[&str])] = &[
        (
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n",
            UpstreamBody::Chunked,
            false,
            &["transfer-encoding: chunked"],
            &["content-length"],
        ),
        (
            b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 7\r\nExpect: 100-continue\r\n\r\n",
            UpstreamBody::Length(7),
            false,
            &["content-length: 7"],
            &["expect", "transfer-encoding"],
        ),
        (
            b"GET / HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\nConnection: Upgrade, x-hop\r\nX-Hop: 1\r\nSec-WebSocket-Key: k\r\n\r\n",
            UpstreamBody::None,
            true,
            &["upgrade: websocket", "connection: upgrade", "Sec-WebSocket-Key: k"],
            &["x-hop"],
        ),
        (
            b"GET / HTTP/1.1\r\nHost: a\r\nUpgrade: h2c\r\nConnection: Upgrade, HTTP2-Settings\r\nHTTP2-Settings: AAMAAABkAAQAAP__\r\n\r\n",
            UpstreamBody::None,
            false,
            &[],
            &["upgrade", "connection", "http2-settings"],
        ),
    ];
    for (input, body, upgrade, present, absent) in cases {
        let mut storage = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let RequestParse::Complete(req) = parse(input, &mut storage) else {
            panic!("not complete: {input:?}");
        };
        let target = target::parse(&req.target, &paths).unwrap();
        let mut out = Vec::new();
        write_upstream(
            &mut out,
            &req,
            &Upstream {
                host: None,
                target: &target,
                authority: "a",
                client,
                underscores: false,
                body: *body,
                upgrade: *upgrade,
                new_request_id: [b'0'; 32],
                forwarded_prefix: None,
                set_headers: &[],
            },
        );
        let text = String::from_utf8(out).unwrap();
        for line in *present {
            assert!(
                text.contains(&format!("\r\n{line}\r\n")),
                "{line:?} in {text}"
            );
        }
        for name in *absent {
            let lower = text.to_ascii_lowercase();
            assert!(
                !lower.contains(&format!("\r\n{name}:")),
                "{name:?} in {text}"
            );
        }
        assert_eq!(text.matches("\r\nhost: ").count(), 1, "{text}");
    }
}

/// A route's `proxy_set_header`s: the client's header of each name is dropped (every copy, any
/// case), the route's value sent once; `None` sends none; a value that could split the head is
/// never written, whatever the caller passed.
#[test]
fn route_set_headers_replace_the_clients() {
    let client = ClientFacts {
        ip: b"192.0.2.1",
        forwarded_for: b"192.0.2.1",
        port: b"80",
        https: false,
        host: None,
    };
    let paths = PathSettings::default();
    let input = b"GET / HTTP/1.1\r\nHost: a\r\nX-Tenant: spoofed\r\nx-tenant: again\r\nAuthorization: secret\r\nX-Keep: k\r\n\r\n";
    let mut storage = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let RequestParse::Complete(req) = parse(input, &mut storage) else {
        panic!("not complete");
    };
    let target = target::parse(&req.target, &paths).unwrap();
    let mut out = Vec::new();
    let set: &[(&str, Option<&[u8]>)] = &[
        ("x-tenant", Some(b"acme")),
        ("authorization", None),
        ("x-evil", Some(b"a\r\nx-injected: 1")),
    ];
    write_upstream(
        &mut out,
        &req,
        &Upstream {
            host: None,
            target: &target,
            authority: "a",
            client,
            underscores: false,
            body: UpstreamBody::None,
            upgrade: false,
            new_request_id: [b'0'; 32],
            forwarded_prefix: None,
            set_headers: set,
        },
    );
    let text = String::from_utf8(out).unwrap();
    let lower = text.to_ascii_lowercase();
    assert_eq!(lower.matches("\r\nx-tenant:").count(), 1, "{text}");
    assert!(text.contains("\r\nx-tenant: acme\r\n"), "{text}");
    assert!(!lower.contains("authorization"), "{text}");
    assert!(
        !lower.contains("x-injected") && !lower.contains("x-evil"),
        "{text}"
    );
    assert!(text.contains("\r\nX-Keep: k\r\n"), "{text}");
}
