//! HTTP/1.x request heads: parsed by httparse, judged by RFC 9112's rules on framing and Host,
//! and written to the upstream in one canonical form.
//!
//! ```text
//!   bytes ─ h2c preface? ──────────────────────────────> HTTP/2 (hyper)
//!     │ httparse (malformed 400, too many headers 431, unknown version 505)
//!     │ method: CONNECT 400, TRACE 405
//!     │ target: origin-form | absolute-form (its authority replaces Host) | else 400
//!     │ Host: HTTP/1.1 needs exactly one, valid (400); HTTP/1.0 at most one
//!     │ framing: Transfer-Encoding exactly `chunked` (other codings 501), never with
//!     │          Content-Length, never in HTTP/1.0 (400); one Content-Length, digits only (400)
//!     │ Expect: 100-continue, or 417
//!     └> RequestHead ─ write_upstream: METHOD normalised-target HTTP/1.1, the proxy's Host and
//!                      forwarding headers, the client's other headers (header.rs), and the
//!                      body framed by the proxy (Content-Length, or chunked re-encoded)
//! ```
//!
//! The upstream never sees the client's bytes for anything that decides where a message ends or
//! what it is for, only the proxy's reading of them, so an upstream that parses differently has
//! nothing ambiguous to parse.

use std::borrow::Cow;

use http::StatusCode;

use crate::authority::{self, Authority};
use crate::header::{self, Kind, tokens};
use crate::target::Target;

/// As many header lines as hyper accepts.
pub const MAX_HEADERS: usize = 100;

/// The HTTP/2 connection preface, which a client speaking h2c with prior knowledge sends first.
pub const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Version {
    Http10,
    Http11,
}

/// How a request body is delimited (RFC 9112 section 6.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BodyFraming {
    None,
    Length(u64),
    Chunked,
}

/// A request head, borrowed from the connection's read buffer.
#[derive(Debug)]
pub struct RequestHead<'h, 'b> {
    pub method: &'b str,
    pub version: Version,
    /// Origin form: the path and query, as the client sent them.
    pub target: Cow<'b, str>,
    /// The absolute-form target's authority, else the Host header's. `None` only for an
    /// HTTP/1.0 request without Host.
    pub authority: Option<Authority<'b>>,
    pub headers: &'h [httparse::Header<'b>],
    pub head_len: usize,
    pub body: BodyFraming,
    /// `Expect: 100-continue` on an HTTP/1.1 request.
    pub expect_continue: bool,
    /// The client connection closes after this request.
    pub close: bool,
    /// The `Upgrade` value, when `Connection` asks for an upgrade.
    pub upgrade: Option<&'b [u8]>,
    /// `Connection` names headers other than its own tokens.
    pub lists_headers: bool,
}

impl RequestHead<'_, '_> {
    pub fn is_head(&self) -> bool {
        self.method == "HEAD"
    }

    /// Whether sending it twice does no more than sending it once (RFC 9110 section 9.2.2), so
    /// it may be retried on a fresh connection when a kept-alive one turned out to be closed.
    pub fn idempotent(&self) -> bool {
        matches!(self.method, "GET" | "HEAD" | "OPTIONS" | "PUT" | "DELETE")
    }
}

/// Why a request is answered by the proxy before routing; the connection closes after.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rejection {
    pub status: StatusCode,
    pub reason: &'static str,
}

#[derive(Debug)]
pub enum RequestParse<'h, 'b> {
    /// More bytes are needed.
    Partial,
    /// The HTTP/2 connection preface: the connection is HTTP/2's.
    H2Preface,
    Complete(RequestHead<'h, 'b>),
    Reject(Rejection),
}

fn reject<'h, 'b>(status: StatusCode, reason: &'static str) -> RequestParse<'h, 'b> {
    RequestParse::Reject(Rejection { status, reason })
}

pub fn parse<'h, 'b>(
    buf: &'b [u8],
    storage: &'h mut [httparse::Header<'b>],
) -> RequestParse<'h, 'b> {
    if buf.starts_with(H2_PREFACE) {
        return RequestParse::H2Preface;
    }
    if H2_PREFACE.starts_with(buf) {
        return RequestParse::Partial;
    }
    let mut req = httparse::Request::new(storage);
    let head_len = match req.parse(buf) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return RequestParse::Partial,
        Err(httparse::Error::TooManyHeaders) => {
            return reject(
                StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                "too many header lines",
            );
        }
        Err(httparse::Error::Version) if names_a_version(buf) => {
            return reject(
                StatusCode::HTTP_VERSION_NOT_SUPPORTED,
                "unsupported HTTP version",
            );
        }
        Err(_) => return reject(StatusCode::BAD_REQUEST, "malformed request head"),
    };
    let (Some(method), Some(raw_target), Some(minor)) = (req.method, req.path, req.version) else {
        return reject(StatusCode::BAD_REQUEST, "malformed request head");
    };
    let version = if minor == 1 {
        Version::Http11
    } else {
        Version::Http10
    };
    match method {
        "CONNECT" => return reject(StatusCode::BAD_REQUEST, "CONNECT is not served"),
        "TRACE" => return reject(StatusCode::METHOD_NOT_ALLOWED, "TRACE is not served"),
        _ => {}
    }
    let (target, target_authority) = match split_target(raw_target) {
        Ok(pair) => pair,
        Err(reason) => return reject(StatusCode::BAD_REQUEST, reason),
    };
    let headers: &'h [httparse::Header<'b>] = req.headers;

    let mut host = None;
    let mut hosts = 0;
    let mut length = None;
    let mut lengths = 0;
    let (mut te_seen, mut chunked, mut other_coding, mut last_chunked) = (false, 0, false, false);
    let mut expect = None;
    let mut upgrade = None;
    let (mut close, mut wants_upgrade, mut lists_headers) = (false, false, false);
    for h in headers {
        match header::kind(h.name) {
            Kind::Host => {
                hosts += 1;
                host = Some(h.value);
            }
            Kind::ContentLength => {
                lengths += 1;
                length = content_length(h.value);
            }
            Kind::TransferEncoding => {
                te_seen = true;
                for coding in tokens(h.value) {
                    last_chunked = coding.eq_ignore_ascii_case(b"chunked");
                    if last_chunked {
                        chunked += 1;
                    } else {
                        other_coding = true;
                    }
                }
            }
            Kind::Expect => expect = Some(h.value),
            Kind::Upgrade => upgrade = Some(h.value),
            Kind::Connection => {
                for token in tokens(h.value) {
                    if token.eq_ignore_ascii_case(b"close") {
                        close = true;
                    } else if token.eq_ignore_ascii_case(b"keep-alive") {
                        // The default for HTTP/1.1; HTTP/1.0 connections close regardless.
                    } else if token.eq_ignore_ascii_case(b"upgrade") {
                        wants_upgrade = true;
                    } else {
                        lists_headers = true;
                    }
                }
            }
            _ => {}
        }
    }

    let body = match (te_seen, lengths) {
        (true, _) if version == Version::Http10 => {
            return reject(StatusCode::BAD_REQUEST, "Transfer-Encoding in HTTP/1.0");
        }
        (true, 0) if other_coding => {
            return reject(
                StatusCode::NOT_IMPLEMENTED,
                "a transfer coding other than chunked",
            );
        }
        (true, 0) if chunked == 1 && last_chunked => BodyFraming::Chunked,
        (true, 0) => return reject(StatusCode::BAD_REQUEST, "invalid Transfer-Encoding"),
        (true, _) => {
            return reject(
                StatusCode::BAD_REQUEST,
                "both Transfer-Encoding and Content-Length",
            );
        }
        (false, 0) => BodyFraming::None,
        (false, 1) => match length {
            Some(0) => BodyFraming::None,
            Some(n) => BodyFraming::Length(n),
            None => return reject(StatusCode::BAD_REQUEST, "invalid Content-Length"),
        },
        (false, _) => return reject(StatusCode::BAD_REQUEST, "more than one Content-Length"),
    };

    if hosts > 1 {
        return reject(StatusCode::BAD_REQUEST, "more than one Host header");
    }
    if hosts == 0 && version == Version::Http11 {
        return reject(StatusCode::BAD_REQUEST, "no Host header");
    }
    let host = match host.map(std::str::from_utf8) {
        None => None,
        Some(Ok(value)) => match authority::parse(value) {
            Ok(a) => Some(a),
            Err(_) => return reject(StatusCode::BAD_REQUEST, "invalid Host header"),
        },
        Some(Err(_)) => return reject(StatusCode::BAD_REQUEST, "invalid Host header"),
    };
    // RFC 9112 section 3.2.2: the target's authority replaces Host.
    let authority = match target_authority {
        Some(raw) => match authority::parse(raw) {
            Ok(a) => Some(a),
            Err(_) => return reject(StatusCode::BAD_REQUEST, "invalid authority in the target"),
        },
        None => host,
    };

    let expect_continue = match (expect, version) {
        (None, _) | (Some(_), Version::Http10) => false,
        (Some(value), Version::Http11)
            if value.trim_ascii().eq_ignore_ascii_case(b"100-continue") =>
        {
            true
        }
        (Some(_), Version::Http11) => {
            return reject(StatusCode::EXPECTATION_FAILED, "unsupported expectation");
        }
    };
    // HTTP/1.0 connections close after one exchange; persistent ones are rare enough not to be
    // worth HTTP/1.0's keep-alive rules.
    let close = close || version == Version::Http10;
    let upgrade = upgrade.filter(|_| wants_upgrade && version == Version::Http11);

    RequestParse::Complete(RequestHead {
        method,
        version,
        target,
        authority,
        headers,
        head_len,
        body,
        expect_continue,
        close,
        upgrade,
        lists_headers,
    })
}

/// Whether a head that httparse refused for its version at least names one (`HTTP/2.0`,
/// `HTTP/1.2`): that is a 505, anything else a 400.
fn names_a_version(buf: &[u8]) -> bool {
    let line = buf.split(|&b| b == b'\n').next().unwrap_or(buf);
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    line.rsplit(|&b| b == b' ')
        .next()
        .and_then(|v| v.strip_prefix(b"HTTP/"))
        .is_some_and(|v| matches!(v, [a, b'.', b] if a.is_ascii_digit() && b.is_ascii_digit()))
}

/// Splits an absolute-form target into its authority and origin-form rest; an origin-form one
/// is returned as it is. Other forms are refused.
fn split_target(raw: &str) -> Result<(Cow<'_, str>, Option<&str>), &'static str> {
    if raw.starts_with('/') {
        return Ok((Cow::Borrowed(raw), None));
    }
    let scheme_end = raw.find("://").ok_or("the request target is not a path")?;
    let scheme = &raw[..scheme_end];
    if !scheme.eq_ignore_ascii_case("http") && !scheme.eq_ignore_ascii_case("https") {
        return Err("the request target's scheme is not http or https");
    }
    let rest = &raw[scheme_end + 3..];
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, origin) = rest.split_at(end);
    let origin = if origin.starts_with('/') {
        Cow::Borrowed(origin)
    } else {
        Cow::Owned(format!("/{origin}"))
    };
    Ok((origin, Some(authority)))
}

/// A `Content-Length` value: digits only, at most 18 of them.
pub fn content_length(value: &[u8]) -> Option<u64> {
    if value.is_empty() || value.len() > 18 || !value.iter().all(u8::is_ascii_digit) {
        return None;
    }
    value.iter().try_fold(0u64, |n, d| {
        n.checked_mul(10)?.checked_add(u64::from(d - b'0'))
    })
}

/// How the body is framed to the upstream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UpstreamBody {
    None,
    Length(u64),
    Chunked,
}

impl From<BodyFraming> for UpstreamBody {
    fn from(framing: BodyFraming) -> Self {
        match framing {
            BodyFraming::None => UpstreamBody::None,
            BodyFraming::Length(n) => UpstreamBody::Length(n),
            BodyFraming::Chunked => UpstreamBody::Chunked,
        }
    }
}

/// What the upstream is told about the client side of the connection.
#[derive(Clone, Copy, Debug)]
pub struct ClientFacts<'a> {
    /// `X-Real-IP`.
    pub ip: &'a [u8],
    /// `X-Forwarded-For`: the client's address, or a list ending in the peer's.
    pub forwarded_for: &'a [u8],
    /// `X-Forwarded-Port`: the port the client connected to.
    pub port: &'a [u8],
    /// `X-Forwarded-Proto`, `X-Forwarded-Scheme` and `X-Scheme`.
    pub https: bool,
    /// `X-Forwarded-Host` named by a trusted proxy, instead of the request's authority.
    pub host: Option<&'a [u8]>,
}

/// Everything the upstream head is written from.
pub struct Upstream<'a> {
    pub target: &'a Target<'a>,
    /// `Host` and `X-Forwarded-Host`.
    pub authority: &'a str,
    /// A `Host` to send instead of `authority` (`upstream-vhost`); `X-Forwarded-Host` keeps
    /// the client's.
    pub host: Option<&'a str>,
    pub client: ClientFacts<'a>,
    /// Pass on header names with `_`.
    pub underscores: bool,
    pub body: UpstreamBody,
    /// Pass `Upgrade` on, with `Connection: upgrade`.
    pub upgrade: bool,
    /// The request id to send when the client's is missing or unusable.
    pub new_request_id: [u8; 32],
    /// `X-Forwarded-Prefix`, when the route's policy sets one (validated as a literal path when
    /// the snapshot was built; the client's own is dropped as spoofable).
    pub forwarded_prefix: Option<&'a str>,
    /// Headers the route sets instead of the client's (a snippet's `proxy_set_header`), by
    /// name; `None` drops the client's. Names were checked by the snapshot to be none this
    /// writer sets itself; values are checked again here.
    pub set_headers: &'a [(&'a str, Option<&'a [u8]>)],
}

/// Writes the head sent upstream.
pub fn write_upstream(out: &mut Vec<u8>, req: &RequestHead<'_, '_>, up: &Upstream<'_>) {
    out.clear();
    push(out, &[req.method.as_bytes(), b" "]);
    up.target.write(out);
    out.extend_from_slice(b" HTTP/1.1\r\nhost: ");
    out.extend_from_slice(up.host.unwrap_or(up.authority).as_bytes());
    out.extend_from_slice(b"\r\n");
    let mut request_id = None;
    let mut chain = Vec::new();
    for h in req.headers {
        let kind = header::kind(h.name);
        match kind {
            Kind::RequestId if request_id.is_none() && header::usable_request_id(h.value) => {
                request_id = Some(h.value);
            }
            Kind::Forwarding if h.name.eq_ignore_ascii_case("x-forwarded-for") => {
                if let Some(value) = header::chain_value(h.value) {
                    if !chain.is_empty() {
                        chain.extend_from_slice(b", ");
                    }
                    chain.extend_from_slice(value);
                }
            }
            Kind::Upgrade if up.upgrade => push(out, &[b"upgrade: ", h.value, b"\r\n"]),
            _ => {}
        }
        if !header::passes(h.name, kind, up.underscores)
            || (req.lists_headers && listed_in_connection(req.headers, h.name))
            || up
                .set_headers
                .iter()
                .any(|(name, _)| header::same_name(name, h.name))
        {
            continue;
        }
        push(out, &[h.name.as_bytes(), b": ", h.value, b"\r\n"]);
    }
    for (name, value) in up.set_headers {
        if let Some(value) =
            value.filter(|v| v.iter().all(|&b| b == b'\t' || (b' '..0x7f).contains(&b)))
        {
            push(out, &[name.as_bytes(), b": ", value, b"\r\n"]);
        }
    }
    if up.upgrade {
        out.extend_from_slice(b"connection: upgrade\r\n");
    }
    match up.body {
        UpstreamBody::None => {}
        UpstreamBody::Length(n) => push(
            out,
            &[
                b"content-length: ",
                itoa::Buffer::new().format(n).as_bytes(),
                b"\r\n",
            ],
        ),
        UpstreamBody::Chunked => out.extend_from_slice(b"transfer-encoding: chunked\r\n"),
    }
    let ip = up.client.ip;
    let proto: &[u8] = if up.client.https { b"https" } else { b"http" };
    push(
        out,
        &[
            b"x-forwarded-for: ",
            up.client.forwarded_for,
            b"\r\nx-real-ip: ",
            ip,
            b"\r\nx-forwarded-proto: ",
            proto,
            b"\r\nx-forwarded-scheme: ",
            proto,
            b"\r\nx-scheme: ",
            proto,
            b"\r\nx-forwarded-port: ",
            up.client.port,
            b"\r\nx-forwarded-host: ",
            up.client.host.unwrap_or(up.authority.as_bytes()),
            b"\r\nx-original-uri: ",
            req.target.as_bytes(),
            b"\r\n",
        ],
    );
    if !chain.is_empty() {
        push(out, &[b"x-original-forwarded-for: ", &chain, b"\r\n"]);
    }
    // Validated by the snapshot; checked again so this writer can never split a header.
    if let Some(prefix) = up
        .forwarded_prefix
        .filter(|p| p.bytes().all(|b| b.is_ascii_graphic()))
    {
        push(out, &[b"x-forwarded-prefix: ", prefix.as_bytes(), b"\r\n"]);
    }
    let id = request_id.unwrap_or(&up.new_request_id);
    push(out, &[b"x-request-id: ", id, b"\r\n\r\n"]);
}

fn listed_in_connection(headers: &[httparse::Header<'_>], name: &str) -> bool {
    header::connection_lists(
        headers
            .iter()
            .filter(|h| header::kind(h.name) == Kind::Connection)
            .map(|h| h.value),
        name,
    )
}

pub fn push(out: &mut Vec<u8>, parts: &[&[u8]]) {
    for part in parts {
        out.extend_from_slice(part);
    }
}

#[cfg(test)]
mod tests;
