//! Message heads for the HTTP/1.1 fast path: parsed by httparse, rewritten byte for byte with
//! the rules `forward.rs` applies to a `HeaderMap`, so both paths send upstreams the same
//! headers (the tests below hold them to the same answers).
//!
//! Anything this path does not handle is a hand-off: the request goes to hyper untouched.

use std::cell::Cell;
use std::time::{SystemTime, UNIX_EPOCH};

use http::StatusCode;

use super::chunked::Chunked;
use crate::proxy::forward::{self, ClientSide};

/// As many header lines as hyper accepts.
pub const MAX_HEADERS: usize = 100;
/// Request bodies up to this size are read whole and sent with the head; larger ones stream
/// through hyper.
pub const MAX_BUFFERED_BODY: usize = 64 * 1024;

/// A request head, borrowed from the connection's read buffer.
#[derive(Debug)]
pub struct Request<'h, 'b> {
    pub method: &'b str,
    /// Origin form: the path and query.
    pub target: &'b str,
    pub headers: &'h [httparse::Header<'b>],
    pub head_len: usize,
    pub host: &'b [u8],
    pub body_len: usize,
    /// The client asked to close the connection after this request.
    pub close: bool,
    /// A `Connection` header names other headers, which must not be forwarded.
    pub lists_headers: bool,
}

impl Request<'_, '_> {
    pub fn is_head(&self) -> bool {
        self.method == "HEAD"
    }

    /// Whether sending it twice does no more than sending it once (RFC 9110 section 9.2.2), so
    /// it may be retried on a fresh connection when a kept-alive one turned out to be closed.
    pub fn idempotent(&self) -> bool {
        matches!(
            self.method,
            "GET" | "HEAD" | "OPTIONS" | "TRACE" | "PUT" | "DELETE"
        )
    }
}

#[derive(Debug)]
pub enum RequestParse<'h, 'b> {
    /// More bytes are needed.
    Partial,
    /// Valid or not, this is hyper's to handle: HTTP/1.0, absolute-form targets, upgrades,
    /// `Expect`, chunked or large bodies, malformed heads (hyper answers 400 or 431).
    HandOff,
    Complete(Request<'h, 'b>),
}

pub fn parse_request<'h, 'b>(
    buf: &'b [u8],
    storage: &'h mut [httparse::Header<'b>],
) -> RequestParse<'h, 'b> {
    let mut req = httparse::Request::new(storage);
    let head_len = match req.parse(buf) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return RequestParse::Partial,
        Err(_) => return RequestParse::HandOff,
    };
    let (Some(method), Some(target), Some(1)) = (req.method, req.path, req.version) else {
        return RequestParse::HandOff;
    };
    if !target.starts_with('/') {
        return RequestParse::HandOff;
    }
    let headers: &'h [httparse::Header<'b>] = req.headers;
    let (mut host, mut body_len, mut close, mut lists_headers) = (None, None, false, false);
    for h in headers {
        match kind(h.name) {
            Kind::Host if host.is_none() => host = Some(h.value),
            Kind::ContentLength if body_len.is_none() => match content_length(h.value) {
                Some(n) if n <= MAX_BUFFERED_BODY => body_len = Some(n),
                _ => return RequestParse::HandOff,
            },
            Kind::Connection => {
                for token in tokens(h.value) {
                    if token.eq_ignore_ascii_case(b"close") {
                        close = true;
                    } else if token.eq_ignore_ascii_case(b"upgrade") {
                        return RequestParse::HandOff;
                    } else if !token.eq_ignore_ascii_case(b"keep-alive") {
                        lists_headers = true;
                    }
                }
            }
            Kind::Host
            | Kind::ContentLength
            | Kind::TransferEncoding
            | Kind::Expect
            | Kind::Upgrade => return RequestParse::HandOff,
            _ => {}
        }
    }
    let Some(host) = host else {
        return RequestParse::HandOff;
    };
    RequestParse::Complete(Request {
        method,
        target,
        headers,
        head_len,
        host,
        body_len: body_len.unwrap_or(0),
        close,
        lists_headers,
    })
}

/// Writes the head sent upstream: hop-by-hop headers (and those `Connection` lists) dropped,
/// the forwarding headers set as `forward::add_forwarding` sets them, a request id added.
pub fn write_upstream_head(out: &mut Vec<u8>, req: &Request<'_, '_>, client: &ClientSide) {
    out.clear();
    push(
        out,
        &[
            req.method.as_bytes(),
            b" ",
            req.target.as_bytes(),
            b" HTTP/1.1\r\n",
        ],
    );
    let mut has_request_id = false;
    for h in req.headers {
        match kind(h.name) {
            Kind::Connection
            | Kind::HopByHop
            | Kind::Upgrade
            | Kind::TransferEncoding
            | Kind::Forwarding => continue,
            Kind::RequestId => has_request_id = true,
            Kind::Host | Kind::ContentLength => {}
            _ if req.lists_headers && listed_in_connection(req.headers, h.name) => continue,
            _ => {}
        }
        push(out, &[h.name.as_bytes(), b": ", h.value, b"\r\n"]);
    }
    let ip = client.client_ip.as_bytes();
    out.extend_from_slice(b"x-forwarded-for: ");
    for h in req.headers {
        if h.name.eq_ignore_ascii_case("x-forwarded-for")
            && let Some(value) = forward::chain_value(h.value)
        {
            push(out, &[value, b", "]);
        }
    }
    let proto: &[u8] = if client.https { b"https" } else { b"http" };
    push(
        out,
        &[
            ip,
            b"\r\nx-real-ip: ",
            ip,
            b"\r\nx-forwarded-proto: ",
            proto,
            b"\r\nx-forwarded-scheme: ",
            proto,
            b"\r\nx-forwarded-port: ",
            client.port.as_bytes(),
            b"\r\nx-forwarded-host: ",
            req.host,
            b"\r\n",
        ],
    );
    if !has_request_id {
        push(
            out,
            &[b"x-request-id: ", &forward::new_request_id(), b"\r\n"],
        );
    }
    out.extend_from_slice(b"\r\n");
}

/// How a response body is delimited (RFC 9112 section 6.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Framing {
    Empty,
    Length(u64),
    Chunked(Chunked),
    /// Until the upstream closes: the client connection closes after it too.
    UntilClose,
}

impl Framing {
    /// Of `avail`, the next bytes from the upstream, how many belong to the body, and whether
    /// the body ended there.
    pub fn take(&mut self, avail: &[u8]) -> Result<(usize, bool), super::chunked::ChunkError> {
        match self {
            Framing::Empty => Ok((0, true)),
            Framing::Length(left) => {
                let n = usize::try_from(*left)
                    .unwrap_or(usize::MAX)
                    .min(avail.len());
                *left -= n as u64;
                Ok((n, *left == 0))
            }
            Framing::Chunked(chunked) => chunked.advance(avail),
            Framing::UntilClose => Ok((avail.len(), false)),
        }
    }
}

/// What the client-facing response depends on besides the upstream's head.
#[derive(Clone, Copy, Debug)]
pub struct ResponseContext<'a> {
    pub head_request: bool,
    /// The client connection closes after this response.
    pub close: bool,
    /// `Strict-Transport-Security`, when the connection is HTTPS and HSTS is on.
    pub hsts: Option<&'a [u8]>,
}

#[derive(Debug, PartialEq, Eq)]
pub struct Response {
    pub head_len: usize,
    pub status: u16,
    pub framing: Framing,
    /// The upstream connection may serve another request afterwards.
    pub reusable: bool,
    /// The client connection must close afterwards (the body ends when the upstream closes).
    pub close_client: bool,
    /// A 1xx head: another head follows.
    pub informational: bool,
}

#[derive(Debug, PartialEq, Eq)]
pub enum ResponseParse {
    Partial,
    Invalid(&'static str),
    Complete(Response),
}

/// Parses the upstream's response head in `buf` and writes the client's into `out`.
pub fn rewrite_response(buf: &[u8], ctx: &ResponseContext<'_>, out: &mut Vec<u8>) -> ResponseParse {
    let mut storage = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut res = httparse::Response::new(&mut storage);
    let head_len = match res.parse(buf) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return ResponseParse::Partial,
        Err(_) => return ResponseParse::Invalid("malformed response head"),
    };
    let (Some(status), Some(version)) = (res.code, res.version) else {
        return ResponseParse::Invalid("malformed response head");
    };
    if status == 101 {
        return ResponseParse::Invalid("switching protocols without an upgrade");
    }
    let headers: &[httparse::Header<'_>] = res.headers;
    let informational = (100..200).contains(&status);
    let mut length = None;
    let (mut chunked, mut other_coding) = (false, false);
    let mut keep_alive = version == 1;
    let mut lists_headers = false;
    let (mut has_date, mut has_hsts) = (false, false);
    for h in headers {
        match kind(h.name) {
            Kind::ContentLength => match (content_length(h.value), length) {
                (Some(n), None) => length = Some(n),
                (Some(n), Some(m)) if n == m => {}
                _ => return ResponseParse::Invalid("invalid content-length"),
            },
            Kind::TransferEncoding => {
                // Only the last coding says how the message ends.
                chunked = tokens(h.value)
                    .last()
                    .is_some_and(|t| t.eq_ignore_ascii_case(b"chunked"));
                other_coding = !chunked;
            }
            Kind::Connection => {
                for token in tokens(h.value) {
                    if token.eq_ignore_ascii_case(b"close") {
                        keep_alive = false;
                    } else if token.eq_ignore_ascii_case(b"keep-alive") {
                        keep_alive |= version == 0;
                    } else {
                        lists_headers = true;
                    }
                }
            }
            Kind::Date => has_date = true,
            Kind::Hsts => has_hsts = true,
            _ => {}
        }
    }
    let framing = if informational || ctx.head_request || status == 204 || status == 304 {
        Framing::Empty
    } else if chunked {
        Framing::Chunked(Chunked::default())
    } else if other_coding {
        Framing::UntilClose
    } else if let Some(n) = length {
        Framing::Length(n as u64)
    } else {
        Framing::UntilClose
    };
    let close_client = ctx.close || framing == Framing::UntilClose;

    out.clear();
    let mut code = itoa::Buffer::new();
    let reason = StatusCode::from_u16(status)
        .ok()
        .and_then(|s| s.canonical_reason())
        .unwrap_or("");
    push(
        out,
        &[
            b"HTTP/1.1 ",
            code.format(status).as_bytes(),
            b" ",
            reason.as_bytes(),
            b"\r\n",
        ],
    );
    for h in headers {
        match kind(h.name) {
            Kind::Connection
            | Kind::HopByHop
            | Kind::Upgrade
            | Kind::TransferEncoding
            | Kind::Server => continue,
            // Written below, once, unless the body is chunked (RFC 9112 section 6.3).
            Kind::ContentLength => continue,
            _ if lists_headers && listed_in_connection(headers, h.name) => continue,
            _ => {}
        }
        push(out, &[h.name.as_bytes(), b": ", h.value, b"\r\n"]);
    }
    if !informational {
        out.extend_from_slice(b"server: ingress\r\n");
        if !has_date {
            push(out, &[b"date: ", &http_date(), b"\r\n"]);
        }
        if let (Some(hsts), false) = (ctx.hsts, has_hsts) {
            push(out, &[b"strict-transport-security: ", hsts, b"\r\n"]);
        }
        match (framing, length) {
            (Framing::Chunked(_), _) => out.extend_from_slice(b"transfer-encoding: chunked\r\n"),
            (_, Some(n)) if !chunked && !other_coding => {
                push(
                    out,
                    &[
                        b"content-length: ",
                        itoa::Buffer::new().format(n).as_bytes(),
                        b"\r\n",
                    ],
                );
            }
            _ => {}
        }
        if close_client {
            out.extend_from_slice(b"connection: close\r\n");
        }
    }
    out.extend_from_slice(b"\r\n");
    ResponseParse::Complete(Response {
        head_len,
        status,
        framing,
        reusable: keep_alive && framing != Framing::UntilClose,
        close_client,
        informational,
    })
}

/// A response the proxy makes itself (404, 503, a redirect, 502 and 504), with the body text
/// `respond::status` uses.
pub fn write_local(
    out: &mut Vec<u8>,
    code: StatusCode,
    location: Option<&str>,
    ctx: &ResponseContext<'_>,
) {
    let body = crate::proxy::respond::status_text(code);
    out.clear();
    push(
        out,
        &[
            b"HTTP/1.1 ",
            code.as_str().as_bytes(),
            b" ",
            code.canonical_reason().unwrap_or("").as_bytes(),
            b"\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: ",
            itoa::Buffer::new().format(body.len()).as_bytes(),
            b"\r\nserver: ingress\r\ndate: ",
            &http_date(),
            b"\r\n",
        ],
    );
    if let Some(location) = location {
        push(out, &[b"location: ", location.as_bytes(), b"\r\n"]);
    }
    if let Some(hsts) = ctx.hsts {
        push(out, &[b"strict-transport-security: ", hsts, b"\r\n"]);
    }
    if ctx.close {
        out.extend_from_slice(b"connection: close\r\n");
    }
    out.extend_from_slice(b"\r\n");
    if !ctx.head_request {
        out.extend_from_slice(body.as_bytes());
    }
}

fn push(out: &mut Vec<u8>, parts: &[&[u8]]) {
    for part in parts {
        out.extend_from_slice(part);
    }
}

/// The headers the fast path treats specially.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Host,
    ContentLength,
    TransferEncoding,
    Expect,
    Upgrade,
    Connection,
    /// Hop-by-hop headers other than the ones above (RFC 9110 section 7.6.1 and the
    /// non-standard ones proxies have historically honoured).
    HopByHop,
    /// Set by the proxy for this hop; whatever the client sent is replaced.
    Forwarding,
    RequestId,
    Server,
    Date,
    Hsts,
    Other,
}

/// By length first: this runs for every header line in both directions.
fn kind(name: &str) -> Kind {
    let is = |known: &str| name.eq_ignore_ascii_case(known);
    match name.len() {
        2 if is("te") => Kind::HopByHop,
        4 if is("host") => Kind::Host,
        4 if is("date") => Kind::Date,
        6 if is("expect") => Kind::Expect,
        6 if is("server") => Kind::Server,
        7 if is("upgrade") => Kind::Upgrade,
        7 if is("trailer") => Kind::HopByHop,
        9 if is("x-real-ip") => Kind::Forwarding,
        10 if is("connection") => Kind::Connection,
        10 if is("keep-alive") => Kind::HopByHop,
        12 if is("x-request-id") => Kind::RequestId,
        14 if is("content-length") => Kind::ContentLength,
        15 if is("x-forwarded-for") => Kind::Forwarding,
        16 if is("proxy-connection") => Kind::HopByHop,
        16 if is("x-forwarded-port") || is("x-forwarded-host") => Kind::Forwarding,
        17 if is("transfer-encoding") => Kind::TransferEncoding,
        17 if is("x-forwarded-proto") => Kind::Forwarding,
        18 if is("proxy-authenticate") => Kind::HopByHop,
        18 if is("x-forwarded-scheme") => Kind::Forwarding,
        19 if is("proxy-authorization") => Kind::HopByHop,
        25 if is("strict-transport-security") => Kind::Hsts,
        _ => Kind::Other,
    }
}

/// The comma-separated tokens of a header value, trimmed.
fn tokens(value: &[u8]) -> impl Iterator<Item = &[u8]> {
    value
        .split(|&b| b == b',')
        .map(<[u8]>::trim_ascii)
        .filter(|t| !t.is_empty())
}

fn listed_in_connection(headers: &[httparse::Header<'_>], name: &str) -> bool {
    headers
        .iter()
        .filter(|h| h.name.eq_ignore_ascii_case("connection"))
        .flat_map(|h| tokens(h.value))
        .any(|t| t.eq_ignore_ascii_case(name.as_bytes()))
}

fn content_length(value: &[u8]) -> Option<usize> {
    if value.is_empty() || value.len() > 18 || !value.iter().all(u8::is_ascii_digit) {
        return None;
    }
    value.iter().try_fold(0usize, |n, d| {
        n.checked_mul(10)?.checked_add(usize::from(d - b'0'))
    })
}

/// The current time as an HTTP date, formatted at most once a second.
fn http_date() -> [u8; 29] {
    thread_local! {
        static CACHED: Cell<(u64, [u8; 29])> = const { Cell::new((u64::MAX, [0; 29])) };
    }
    let now = SystemTime::now();
    let second = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    CACHED.with(|cached| {
        let (at, text) = cached.get();
        if at == second {
            return text;
        }
        let mut text = [b' '; 29];
        let formatted = httpdate::fmt_http_date(now);
        let len = formatted.len().min(29);
        text[..len].copy_from_slice(&formatted.as_bytes()[..len]);
        cached.set((second, text));
        text
    })
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use http::{HeaderMap, HeaderName, HeaderValue};

    use super::*;

    fn parse(text: &str) -> String {
        let mut storage = [httparse::EMPTY_HEADER; MAX_HEADERS];
        match parse_request(text.as_bytes(), &mut storage) {
            RequestParse::Partial => "partial".into(),
            RequestParse::HandOff => "hand-off".into(),
            RequestParse::Complete(r) => format!(
                "{} {} host={} body={} close={} len={}",
                r.method,
                r.target,
                String::from_utf8_lossy(r.host),
                r.body_len,
                r.close,
                r.head_len
            ),
        }
    }

    #[test]
    fn requests_the_fast_path_takes_and_leaves() {
        let big = format!(
            "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: {}\r\n\r\n",
            MAX_BUFFERED_BODY + 1
        );
        let cases: &[(&str, &str)] = &[
            (
                "GET / HTTP/1.1\r\nHost: a\r\n\r\n",
                "GET / host=a body=0 close=false len=27",
            ),
            (
                "GET /x?y HTTP/1.1\r\nhost: a.b:8080\r\nConnection: keep-alive, Close\r\n\r\n",
                "GET /x?y host=a.b:8080 body=0 close=true len=68",
            ),
            (
                "POST /f HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello",
                "POST /f host=a body=5 close=false len=48",
            ),
            ("GET / HTTP/1.1\r\nHost: a\r\n", "partial"),
            ("GET / HTTP/1.0\r\nHost: a\r\n\r\n", "hand-off"),
            ("GET http://a/ HTTP/1.1\r\nHost: a\r\n\r\n", "hand-off"),
            ("OPTIONS * HTTP/1.1\r\nHost: a\r\n\r\n", "hand-off"),
            ("GET / HTTP/1.1\r\n\r\n", "hand-off"),
            ("GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", "hand-off"),
            (
                "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n",
                "hand-off",
            ),
            (
                "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n",
                "hand-off",
            ),
            (
                "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: +5\r\n\r\n",
                "hand-off",
            ),
            (&big, "hand-off"),
            (
                "POST / HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n",
                "hand-off",
            ),
            (
                "GET / HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n",
                "hand-off",
            ),
            (
                "GET / HTTP/1.1\r\nHost: a\r\nConnection: upgrade\r\n\r\n",
                "hand-off",
            ),
            ("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", "hand-off"),
            ("GET / HTTP/1.1\r\nBad Header: x\r\n\r\n", "hand-off"),
            ("\x16\x03\x01\x00", "hand-off"),
        ];
        for (input, want) in cases {
            assert_eq!(parse(input), *want, "{input:?}");
        }
    }

    /// The fast path's upstream head and forward.rs's HeaderMap rewrite agree.
    #[test]
    fn upstream_heads_match_the_header_map_rules() {
        let ip: IpAddr = "192.0.2.7".parse().unwrap();
        let cases: &[(&[(&str, &str)], bool)] = &[
            (&[("host", "shop.example.com:8080")], false),
            (
                &[
                    ("Host", "a"),
                    ("X-Forwarded-For", "10.0.0.1"),
                    ("x-forwarded-for", "10.0.0.2, 10.0.0.3"),
                    ("X-Forwarded-Proto", "https"),
                    ("X-Real-IP", "1.1.1.1"),
                    ("X-Forwarded-Host", "evil"),
                    ("Accept", "*/*"),
                ],
                true,
            ),
            (
                &[
                    ("host", "a"),
                    ("connection", "x-secret, keep-alive"),
                    ("x-secret", "1"),
                    ("keep-alive", "timeout=5"),
                    ("te", "trailers"),
                    ("trailer", "x"),
                    ("proxy-authorization", "basic x"),
                    ("proxy-connection", "keep-alive"),
                    ("x-other", "2"),
                    ("x-request-id", "abc"),
                ],
                false,
            ),
            (&[("host", "a"), ("x-forwarded-for", "  ")], false),
            (&[("host", "a"), ("content-length", "3")], false),
        ];
        for (pairs, https) in cases {
            let client = ClientSide::new(ip, *https, if *https { 443 } else { 80 });
            let mut text = "GET /p?q=1 HTTP/1.1\r\n".to_string();
            for (k, v) in *pairs {
                text.push_str(&format!("{k}: {v}\r\n"));
            }
            text.push_str("\r\n");
            let mut storage = [httparse::EMPTY_HEADER; MAX_HEADERS];
            let RequestParse::Complete(req) = parse_request(text.as_bytes(), &mut storage) else {
                panic!("not complete: {text:?}");
            };
            let mut out = Vec::new();
            write_upstream_head(&mut out, &req, &client);

            let mut fast = HeaderMap::new();
            let mut storage = [httparse::EMPTY_HEADER; MAX_HEADERS];
            let mut parsed = httparse::Request::new(&mut storage);
            assert!(parsed.parse(&out).unwrap().is_complete(), "{out:?}");
            assert_eq!(parsed.path, Some("/p?q=1"));
            for h in parsed.headers.iter() {
                fast.append(
                    HeaderName::from_bytes(h.name.as_bytes()).unwrap(),
                    HeaderValue::from_bytes(h.value).unwrap(),
                );
            }

            let mut slow = HeaderMap::new();
            for (k, v) in *pairs {
                slow.append(
                    HeaderName::from_bytes(k.as_bytes()).unwrap(),
                    HeaderValue::from_str(v).unwrap(),
                );
            }
            let host = slow.get("host").cloned();
            forward::strip_hop_by_hop(&mut slow, false);
            forward::add_forwarding(&mut slow, &client, host.as_ref());
            forward::ensure_request_id(&mut slow);

            let names = |m: &HeaderMap| {
                let mut n: Vec<String> = m.keys().map(|k| k.to_string()).collect();
                n.sort();
                n
            };
            assert_eq!(names(&fast), names(&slow), "{pairs:?}");
            for name in slow.keys() {
                if name == "x-request-id" && !pairs.iter().any(|(k, _)| *k == "x-request-id") {
                    assert_eq!(fast.get(name).unwrap().len(), 32);
                    continue;
                }
                let all = |m: &HeaderMap| {
                    m.get_all(name)
                        .iter()
                        .map(|v| v.to_str().unwrap().to_string())
                        .collect::<Vec<_>>()
                };
                assert_eq!(all(&fast), all(&slow), "{pairs:?} {name}");
            }
        }
    }

    fn respond(upstream: &str, ctx: ResponseContext<'_>) -> (ResponseParse, String) {
        let mut out = Vec::new();
        let parsed = rewrite_response(upstream.as_bytes(), &ctx, &mut out);
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
    };

    #[test]
    fn response_heads_and_their_framing() {
        // head_len is checked against the input separately.
        let head = |status, framing, reusable, close_client| {
            ResponseParse::Complete(Response {
                head_len: 0,
                status,
                framing,
                reusable,
                close_client,
                informational: false,
            })
        };
        let hsts = ResponseContext {
            hsts: Some(b"max-age=60"),
            ..PLAIN
        };
        let cases: &[(&str, ResponseContext<'_>, ResponseParse, &str)] = &[
            (
                "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nServer: nginx\r\nX-A: 1\r\n\r\nhello",
                PLAIN,
                head(200, Framing::Length(5), true, false),
                "HTTP/1.1 200 OK|X-A: 1|server: ingress|content-length: 5|",
            ),
            (
                "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 9\r\n\r\n",
                PLAIN,
                head(200, Framing::Chunked(Chunked::default()), true, false),
                "HTTP/1.1 200 OK|server: ingress|transfer-encoding: chunked|",
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
                    hsts: None,
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
            (
                "HTTP/1.1 200 OK\r\nStrict-Transport-Security: max-age=1\r\nContent-Length: 0\r\n\r\n",
                hsts,
                head(200, Framing::Length(0), true, false),
                "HTTP/1.1 200 OK|Strict-Transport-Security: max-age=1|server: ingress|content-length: 0|",
            ),
            (
                "HTTP/1.1 103 Early Hints\r\nLink: </a.css>\r\n\r\n",
                PLAIN,
                ResponseParse::Complete(Response {
                    head_len: 0,
                    status: 103,
                    framing: Framing::Empty,
                    reusable: true,
                    close_client: false,
                    informational: true,
                }),
                "HTTP/1.1 103 Early Hints|Link: </a.css>|",
            ),
            (
                "HTTP/1.1 200 OK\r\nContent-Le",
                PLAIN,
                ResponseParse::Partial,
                "|",
            ),
            (
                "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
                PLAIN,
                ResponseParse::Invalid("invalid content-length"),
                "",
            ),
            (
                "HTTP/1.1 101 Switching Protocols\r\n\r\n",
                PLAIN,
                ResponseParse::Invalid("switching protocols without an upgrade"),
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
            let (mut got, text) = respond(upstream, *ctx);
            if let ResponseParse::Complete(r) = &mut got {
                let end = upstream.find("\r\n\r\n").unwrap() + 4;
                assert_eq!(r.head_len, end, "{upstream:?}");
                r.head_len = 0;
            }
            assert_eq!(&got, want, "{upstream:?}");
            if matches!(got, ResponseParse::Complete(_)) {
                assert_eq!(text, *want_text, "{upstream:?}");
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
    fn header_kinds_cover_forward_rs_lists() {
        for name in &forward::HOP_BY_HOP {
            for spelled in [
                name.as_str().to_string(),
                name.as_str().to_ascii_uppercase(),
            ] {
                assert!(
                    matches!(
                        kind(&spelled),
                        Kind::Connection | Kind::HopByHop | Kind::TransferEncoding
                    ),
                    "{spelled}"
                );
            }
        }
        for name in [
            &forward::X_FORWARDED_FOR,
            &forward::X_FORWARDED_PROTO,
            &forward::X_FORWARDED_HOST,
            &forward::X_FORWARDED_PORT,
            &forward::X_FORWARDED_SCHEME,
            &forward::X_REAL_IP,
        ] {
            assert_eq!(kind(name.as_str()), Kind::Forwarding, "{name}");
        }
        assert_eq!(kind("X-Request-Id"), Kind::RequestId);
        assert_eq!(kind("x-forwarded-fox"), Kind::Other);
    }

    #[test]
    fn dates_are_http_dates() {
        let date = http_date();
        let text = std::str::from_utf8(&date).unwrap();
        assert!(httpdate::parse_http_date(text).is_ok(), "{text}");
    }
}
