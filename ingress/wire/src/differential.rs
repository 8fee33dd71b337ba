//! This crate's HTTP/1.x reading and writing, checked against hyper's reading of the same bytes.
//! The fuzz target (`ingress/fuzz/fuzz_targets/h1_differential.rs`) and the corpus test
//! (`tests/tests/h1_differential.rs`) both call [`check`].
//!
//! ```text
//!   client bytes ─ ours: requests accepted, each framed, until one is refused ─┐
//!        │                                                                   ├─ every request we
//!        └─ hyper's server: the requests it delivers ──────────────────────────┘  accept, hyper
//!                                                                               reads the same way
//!   ours → the upstream bytes the proxy would send ─ hyper reads exactly ours, with the
//!                                                    normalised target and the one Host
//! ```
//!
//! Refusing what hyper accepts is fine (the proxy is the stricter reader on purpose). Accepting
//! what hyper refuses, or framing anything differently, is a finding: two HTTP implementations
//! disagreeing about where a message ends is how requests are smuggled.

use std::cell::RefCell;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::chunked::{self, Chunked};
use crate::request::{
    self, BodyFraming, ClientFacts, MAX_HEADERS, RequestParse, Upstream, UpstreamBody,
};
use crate::target::{self, PathSettings};

/// One request, as a reader delivered it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Read {
    pub method: String,
    /// Origin form.
    pub target: String,
    /// The absolute-form target's authority, else the Host header's.
    pub host: Option<String>,
    pub body: Vec<u8>,
}

/// What this crate makes of some client bytes.
#[derive(Debug, Default)]
pub struct Ours {
    /// The requests accepted, as the client sent them.
    pub requests: Vec<Read>,
    /// The same requests as the upstream is sent them (normalised target, the proxy's Host).
    pub forwarded: Vec<Read>,
    /// The bytes the upstream is sent for them.
    pub upstream: Vec<u8>,
}

/// The Host an HTTP/1.0 request without one is sent with.
const NO_HOST: &str = "upstream.test";

/// Reads `input` as the proxy does, stopping at the first request it refuses, cannot finish,
/// or after which the connection stops being HTTP (an upgrade, HTTP/2).
pub fn ours(input: &[u8]) -> Ours {
    let mut out = Ours::default();
    let mut at = 0;
    let paths = PathSettings::default();
    while at < input.len() {
        let buf = &input[at..];
        let mut storage = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let req = match request::parse(buf, &mut storage) {
            RequestParse::Complete(req) => req,
            _ => break,
        };
        let Ok(target) = target::parse(&req.target, &paths) else {
            break;
        };
        let body_start = req.head_len;
        let (body, consumed) = match req.body {
            BodyFraming::None => (Vec::new(), 0),
            BodyFraming::Length(n) => {
                let Some(end) = usize::try_from(n)
                    .ok()
                    .and_then(|n| body_start.checked_add(n))
                else {
                    break;
                };
                match buf.get(body_start..end) {
                    Some(body) => (body.to_vec(), end - body_start),
                    None => break,
                }
            }
            BodyFraming::Chunked => match dechunk(&buf[body_start..]) {
                Some(pair) => pair,
                None => break,
            },
        };
        let authority = req.authority.as_ref().map(|a| a.raw);
        let host = authority.unwrap_or(NO_HOST);
        let mut head = Vec::new();
        request::write_upstream(
            &mut head,
            &req,
            &Upstream {
                host: None,
                target: &target,
                authority: host,
                client: ClientFacts {
                    ip: b"192.0.2.1",
                    forwarded_for: b"192.0.2.1",
                    port: b"80",
                    https: false,
                    host: None,
                },
                underscores: false,
                body: match req.body {
                    BodyFraming::None => UpstreamBody::None,
                    BodyFraming::Length(n) => UpstreamBody::Length(n),
                    BodyFraming::Chunked => UpstreamBody::Chunked,
                },
                upgrade: false,
                new_request_id: [b'0'; 32],
                forwarded_prefix: None,
                set_headers: &[],
            },
        );
        out.upstream.extend_from_slice(&head);
        match req.body {
            BodyFraming::Chunked => {
                chunked::encode_chunk(&body, &mut out.upstream);
                out.upstream.extend_from_slice(chunked::LAST_CHUNK);
            }
            _ => out.upstream.extend_from_slice(&body),
        }
        out.requests.push(Read {
            method: req.method.to_string(),
            target: req.target.to_string(),
            host: authority.map(str::to_string),
            body: body.clone(),
        });
        out.forwarded.push(Read {
            method: req.method.to_string(),
            target: target.to_string(),
            host: Some(host.to_string()),
            body,
        });
        if req.upgrade.is_some() || req.close {
            break;
        }
        at += body_start + consumed;
    }
    out
}

fn dechunk(buf: &[u8]) -> Option<(Vec<u8>, usize)> {
    let mut decoder = Chunked::default();
    let mut body = Vec::new();
    let mut at = 0;
    loop {
        let step = decoder.decode(&buf[at..]).ok()?;
        body.extend_from_slice(&buf[at..][step.data.clone()]);
        at += step.consumed;
        if step.done {
            return Some((body, at));
        }
        if step.consumed == 0 || at >= buf.len() {
            return None;
        }
    }
}

thread_local! {
    static RUNTIME: RefCell<Option<tokio::runtime::Runtime>> = const { RefCell::new(None) };
}

/// Header lines the proxy adds to a request on its way upstream, at most: an upstream must be
/// read with room for them on top of the client's.
const ADDED_HEADERS: usize = 16;

/// The requests hyper's HTTP/1.1 server delivers for `input`, in order, reading at most
/// `max_headers` header lines per request (hyper's default is the proxy's own limit).
pub fn hyper_reads(input: &[u8], max_headers: usize) -> Vec<Read> {
    RUNTIME.with(|cell| {
        let mut cell = cell.borrow_mut();
        let runtime = cell.get_or_insert_with(|| {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap_or_else(|err| panic!("a runtime for the oracle: {err}"))
        });
        runtime.block_on(hyper_reads_async(input, max_headers))
    })
}

async fn hyper_reads_async(input: &[u8], max_headers: usize) -> Vec<Read> {
    let seen: Arc<Mutex<Vec<Read>>> = Arc::default();
    let (mut client, server) = tokio::io::duplex(input.len() + 64 * 1024);
    let record = seen.clone();
    let service = service_fn(move |req: http::Request<hyper::body::Incoming>| {
        let record = record.clone();
        async move {
            let method = req.method().to_string();
            let uri = req.uri();
            let target = uri
                .path_and_query()
                .map_or_else(|| uri.path().to_string(), |p| p.as_str().to_string());
            // An absolute-form target with an empty path (`http://a?q`) is `/?q` in origin form.
            let target = if target.starts_with('/') {
                target
            } else {
                format!("/{target}")
            };
            let host = uri.authority().map(|a| a.as_str().to_string()).or_else(|| {
                req.headers()
                    .get(http::header::HOST)
                    .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
            });
            let body = req
                .into_body()
                .collect()
                .await
                .map(|b| b.to_bytes().to_vec());
            if let Ok(body) = body {
                record.lock().unwrap_or_else(|e| e.into_inner()).push(Read {
                    method,
                    target,
                    host,
                    body,
                });
            }
            Ok::<_, Infallible>(http::Response::new(Full::new(Bytes::new())))
        }
    });
    let serve = hyper::server::conn::http1::Builder::new()
        .half_close(true)
        .max_headers(max_headers)
        .serve_connection(hyper_util::rt::TokioIo::new(server), service);
    let feed = async {
        let _ = client.write_all(input).await;
        let _ = client.shutdown().await;
        let mut sink = Vec::new();
        let _ = client.read_to_end(&mut sink).await;
    };
    let _ = tokio::time::timeout(Duration::from_secs(5), async {
        let (_served, ()) = tokio::join!(serve, feed);
    })
    .await;
    let mut seen = seen.lock().unwrap_or_else(|e| e.into_inner());
    std::mem::take(&mut *seen)
}

/// The property: every request this crate accepts, hyper reads the same way from the client's
/// bytes; and hyper reads the bytes the upstream would be sent exactly as this crate meant them.
pub fn check(input: &[u8]) -> Result<(), String> {
    let ours = ours(input);
    if ours.requests.is_empty() {
        return Ok(());
    }
    let theirs = hyper_reads(input, MAX_HEADERS);
    for (i, mine) in ours.requests.iter().enumerate() {
        match theirs.get(i) {
            Some(read) if same_request(read, mine) => {}
            Some(read) => {
                return Err(format!(
                    "request {i}: we read {mine:?}, hyper read {read:?}"
                ));
            }
            None => {
                return Err(format!(
                    "request {i}: we accepted {mine:?}; hyper delivered only {} request(s)",
                    theirs.len()
                ));
            }
        }
    }
    canonical(&ours.upstream, ours.forwarded.len())?;
    let upstream = hyper_reads(&ours.upstream, MAX_HEADERS + ADDED_HEADERS);
    if upstream != ours.forwarded {
        return Err(format!(
            "the upstream bytes {:?} read as {upstream:?}, meant as {:?}",
            String::from_utf8_lossy(&ours.upstream),
            ours.forwarded
        ));
    }
    Ok(())
}

/// Whatever any server makes of them, the upstream heads leave nothing to choose between: one
/// Host, at most one framing header (a Content-Length, or `Transfer-Encoding: chunked`),
/// nothing hop-by-hop, nothing the client set that the proxy sets.
fn canonical(upstream: &[u8], count: usize) -> Result<(), String> {
    let mut at = 0;
    for i in 0..count {
        let mut storage = [httparse::EMPTY_HEADER; MAX_HEADERS + 16];
        let mut head = httparse::Request::new(&mut storage);
        let len = match head.parse(&upstream[at..]) {
            Ok(httparse::Status::Complete(len)) => len,
            other => return Err(format!("upstream head {i} does not parse: {other:?}")),
        };
        let count_of = |name: &str| {
            head.headers
                .iter()
                .filter(|h| h.name.eq_ignore_ascii_case(name))
                .count()
        };
        if count_of("host") != 1 {
            return Err(format!(
                "upstream head {i} has {} Host headers",
                count_of("host")
            ));
        }
        let (lengths, codings) = (count_of("content-length"), count_of("transfer-encoding"));
        if lengths + codings > 1 {
            return Err(format!(
                "upstream head {i} has {lengths} Content-Length and {codings} Transfer-Encoding"
            ));
        }
        for h in head.headers.iter() {
            let name = h.name.to_ascii_lowercase();
            let forbidden = matches!(
                name.as_str(),
                "connection"
                    | "keep-alive"
                    | "te"
                    | "trailer"
                    | "upgrade"
                    | "expect"
                    | "proxy-connection"
                    | "forwarded"
                    | "x-forwarded-prefix"
                    | "proxy"
            ) || name.contains('_');
            let set_once = matches!(
                name.as_str(),
                "x-forwarded-for" | "x-real-ip" | "x-forwarded-host" | "x-original-uri"
            ) && count_of(&name) != 1;
            if forbidden || set_once {
                return Err(format!("upstream head {i} carries {name}"));
            }
            if name == "transfer-encoding" && !h.value.eq_ignore_ascii_case(b"chunked") {
                return Err(format!(
                    "upstream head {i}: transfer-encoding {:?}",
                    h.value
                ));
            }
        }
        at += len;
        // Skip the body as the head frames it.
        if let Some(h) = head
            .headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case("content-length"))
        {
            let n: usize = std::str::from_utf8(h.value)
                .ok()
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| format!("upstream head {i}: content-length {:?}", h.value))?;
            at += n;
        } else if count_of("transfer-encoding") == 1 {
            let (_, used) = dechunk(&upstream[at..])
                .ok_or_else(|| format!("upstream body {i} is not a whole chunked body"))?;
            at += used;
        }
    }
    if at != upstream.len() {
        return Err(format!(
            "{} bytes after the last upstream request",
            upstream.len() - at
        ));
    }
    Ok(())
}

/// hyper keeps an absolute-form target whole; compare its origin part.
fn same_request(theirs: &Read, ours: &Read) -> bool {
    let host_matches = match (&theirs.host, &ours.host) {
        (Some(a), Some(b)) => a.eq_ignore_ascii_case(b),
        (None, None) => true,
        _ => false,
    };
    theirs.method == ours.method
        && theirs.target == ours.target
        && host_matches
        && theirs.body == ours.body
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agrees_on_ordinary_requests() {
        let input = b"GET /a HTTP/1.1\r\nHost: a\r\n\r\nPOST /b?c HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\nxyzPOST /c HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n2;x=y\r\nhi\r\n0\r\nT: v\r\n\r\n";
        let ours = ours(input);
        assert_eq!(ours.requests.len(), 3);
        assert_eq!(ours.requests[2].body, b"hi");
        check(input).unwrap();
    }

    #[test]
    fn a_disagreement_is_reported() {
        // hyper takes the first Content-Length when two agree; pretend we read another body.
        let input = b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\n\r\nx";
        let theirs = hyper_reads(input, MAX_HEADERS);
        assert_eq!(theirs.len(), 1);
        let wrong = Read {
            body: b"y".to_vec(),
            ..theirs[0].clone()
        };
        assert!(!same_request(&theirs[0], &wrong));
    }
}
