//! Response heads for HTTP/1.x clients: an upstream's head parsed and rewritten byte for byte,
//! and the responses the proxy makes itself.
//!
//! ```text
//!   upstream head ─ status 100..=599, else 502 ─ 101 only when an upgrade was asked for
//!      │ framing (RFC 9112 section 6.3): HEAD, 1xx, 204, 304 → none;
//!      │   Transfer-Encoding ending in chunked → chunked (its Content-Length dropped, and the
//!      │   upstream connection is not reused after such a message);
//!      │   other codings → until close; Content-Length; else until close
//!      └> client head: hop-by-hop headers dropped, `Server: ingress`, Date, HSTS; codings kept
//!         as they are (the body is relayed still encoded); no Content-Length on 1xx and 204;
//!         HTTP/1.0 clients get no chunked framing (the body is de-chunked, and the connection
//!         closes after it) and no 1xx heads
//! ```

use std::cell::Cell;
use std::time::{SystemTime, UNIX_EPOCH};

use http::StatusCode;

use ingress_wire::chunked::{ChunkError, Chunked};
use ingress_wire::header::{self, Kind, tokens};
use ingress_wire::request::{MAX_HEADERS, push};
use ingress_wire::response::{HeadFacts, Parsed, parse};

use crate::snapshot::annotations::snippet::ResponseEdits;
use crate::snapshot::annotations::upstream_rewrite::UpstreamRewrite;

/// How a response body is delimited, as the upstream sends it.
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
    pub fn take(&mut self, avail: &[u8]) -> Result<(usize, bool), ChunkError> {
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
    /// The `Server` value (`server-tokens`).
    pub server: &'a [u8],
    /// The client spoke HTTP/1.0: no chunked framing, no 1xx.
    pub http10: bool,
    /// The protocol the request asked to switch to; only then is a 101 acceptable.
    pub upgrade: Option<&'a [u8]>,
    /// A `Set-Cookie` the proxy adds to the upstream's response (a new affinity session).
    pub set_cookie: Option<&'a [u8]>,
    /// What authentication granted: its `Set-Cookie`s for the client (an auth service's).
    pub(crate) auth: Option<&'a crate::proxy::phase::auth::Granted>,
    /// Headers the proxy sets on the response (CORS), replacing the upstream's of these names.
    pub set_headers: &'a [(http::HeaderName, http::HeaderValue)],
    /// A snippet's edits of the upstream's headers (the response phase's).
    pub edits: Option<&'a ResponseEdits>,
    /// `proxy-redirect-*`, `proxy-cookie-*` (the response phase's).
    pub rewrite: Option<&'a UpstreamRewrite>,
    /// `add-headers` (literal values) for the proxy's own answers.
    pub own_headers: Option<&'a ResponseEdits>,
}

#[derive(Debug, PartialEq, Eq)]
pub struct Response {
    pub head_len: usize,
    pub status: u16,
    pub framing: Framing,
    /// The upstream connection may serve another request afterwards.
    pub reusable: bool,
    /// The client connection must close afterwards.
    pub close_client: bool,
    /// A 1xx head other than 101: another head follows.
    pub informational: bool,
    /// 101: the connection becomes a tunnel.
    pub switching: bool,
    /// The body is chunked but the client is HTTP/1.0: send it de-chunked.
    pub dechunk: bool,
    /// An HTTP/1.0 client is not sent this 1xx head.
    pub withheld: bool,
}

#[derive(Debug, PartialEq, Eq)]
pub enum ResponseParse {
    Partial,
    Invalid(&'static str),
    Complete(Response),
}

/// Parses the upstream's response head in `buf` and writes the client's into `out`.
pub fn rewrite(buf: &[u8], ctx: &ResponseContext<'_>, out: &mut Vec<u8>) -> ResponseParse {
    let mut storage = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let (head_len, status, version, headers) = match parse(buf, &mut storage) {
        Parsed::Complete {
            len,
            status,
            minor,
            headers,
        } => (len, status, minor, headers),
        Parsed::Partial => return ResponseParse::Partial,
        Parsed::Invalid(why) => return ResponseParse::Invalid(why),
    };
    let switching = status == 101;
    if switching && ctx.upgrade.is_none() {
        return ResponseParse::Invalid("switching protocols without an upgrade");
    }
    let informational = (100..200).contains(&status) && !switching;
    let facts = match ingress_wire::response::facts(headers, version) {
        Ok(facts) => facts,
        Err(why) => return ResponseParse::Invalid(why),
    };
    let HeadFacts {
        length,
        chunked,
        coded,
        lists_headers,
        upgrade_to,
        has_date,
        has_hsts,
        keep_alive,
    } = facts;
    if switching
        && !upgrade_to
            .zip(ctx.upgrade)
            .is_some_and(|(to, asked)| same_protocol(to, asked))
    {
        return ResponseParse::Invalid("switched to a protocol that was not asked for");
    }
    // Codings other than chunked are relayed still applied; HTTP/1.0 has no way to say so.
    let other_codings = coded && !(chunked && single_chunked(headers));
    if ctx.http10 && other_codings && !informational {
        return ResponseParse::Invalid("a transfer coding an HTTP/1.0 client cannot be sent");
    }
    let bodiless = informational || switching || status == 204 || status == 304;
    let framing = if bodiless || ctx.head_request {
        Framing::Empty
    } else if chunked {
        Framing::Chunked(Chunked::default())
    } else if coded {
        Framing::UntilClose
    } else if let Some(n) = length {
        Framing::Length(n)
    } else {
        Framing::UntilClose
    };
    let dechunk = ctx.http10 && matches!(framing, Framing::Chunked(_));
    let close_client = ctx.close || framing == Framing::UntilClose || dechunk;
    let withheld = informational && ctx.http10;

    out.clear();
    if withheld {
        return ResponseParse::Complete(Response {
            head_len,
            status,
            framing,
            reusable: true,
            close_client,
            informational,
            switching,
            dechunk,
            withheld,
        });
    }
    let reason = StatusCode::from_u16(status)
        .ok()
        .and_then(|s| s.canonical_reason())
        .unwrap_or("");
    push(
        out,
        &[
            b"HTTP/1.1 ",
            itoa::Buffer::new().format(status).as_bytes(),
            b" ",
            reason.as_bytes(),
            b"\r\n",
        ],
    );
    for h in headers {
        match header::kind(h.name) {
            Kind::Connection
            | Kind::HopByHop
            | Kind::Upgrade
            | Kind::TransferEncoding
            | Kind::Server
            | Kind::ContentLength => continue,
            _ if lists_headers && listed(headers, h.name) => continue,
            _ if ctx
                .set_headers
                .iter()
                .any(|(name, _)| name.as_str().eq_ignore_ascii_case(h.name)) =>
            {
                continue;
            }
            _ if !informational && ctx.edits.is_some_and(|e| e.replaces(h.name)) => continue,
            _ => {}
        }
        let rewritten = ctx
            .rewrite
            .filter(|_| !informational)
            .and_then(|r| r.rewrite(h.name, h.value))
            .filter(|v| v.iter().all(|&b| b == b'\t' || (b' '..0x7f).contains(&b)));
        let value = rewritten.as_deref().unwrap_or(h.value);
        push(out, &[h.name.as_bytes(), b": ", value, b"\r\n"]);
    }
    if !informational {
        for (name, value) in ctx.set_headers {
            push(
                out,
                &[name.as_str().as_bytes(), b": ", value.as_bytes(), b"\r\n"],
            );
        }
    }
    if switching {
        if let Some(to) = upgrade_to {
            push(out, &[b"upgrade: ", to, b"\r\nconnection: upgrade\r\n"]);
        }
    } else if !informational {
        if !ctx.edits.is_some_and(|e| e.replaces("server")) {
            out.extend_from_slice(b"server: ");
            out.extend_from_slice(ctx.server);
            out.extend_from_slice(b"\r\n");
        }
        for (name, value) in ctx.edits.into_iter().flat_map(|e| e.emitted(status)) {
            push(
                out,
                &[name.as_str().as_bytes(), b": ", value.as_bytes(), b"\r\n"],
            );
        }
        if !has_date {
            push(out, &[b"date: ", &http_date(), b"\r\n"]);
        }
        if let (Some(hsts), false) = (ctx.hsts, has_hsts) {
            push(out, &[b"strict-transport-security: ", hsts, b"\r\n"]);
        }
        if let Some(cookie) = ctx.set_cookie {
            push(out, &[b"set-cookie: ", cookie, b"\r\n"]);
        }
        for cookie in ctx.auth.map_or(&[][..], |g| g.cookies_for(status)) {
            push(out, &[b"set-cookie: ", cookie.as_bytes(), b"\r\n"]);
        }
        if let Some(info) = ctx.auth.and_then(|g| g.info.as_ref()) {
            push(out, &[b"authentication-info: ", info.as_bytes(), b"\r\n"]);
        }
        if coded && !dechunk {
            write_codings(out, headers);
        } else if let (Some(n), false) = (length, coded || status == 204) {
            push(
                out,
                &[
                    b"content-length: ",
                    itoa::Buffer::new().format(n).as_bytes(),
                    b"\r\n",
                ],
            );
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
        // A message with both Transfer-Encoding and Content-Length may have been framed
        // differently by someone on the way: never trust that connection again.
        reusable: keep_alive && framing != Framing::UntilClose && !facts.both_framings(),
        close_client,
        informational,
        switching,
        dechunk,
        withheld,
    })
}

/// Whether the codings are exactly `chunked`.
fn single_chunked(headers: &[httparse::Header<'_>]) -> bool {
    let mut codings = headers
        .iter()
        .filter(|h| header::kind(h.name) == Kind::TransferEncoding)
        .flat_map(|h| tokens(h.value));
    codings
        .next()
        .is_some_and(|c| c.eq_ignore_ascii_case(b"chunked"))
        && codings.next().is_none()
}

/// `transfer-encoding:` with every coding the upstream applied, in order.
fn write_codings(out: &mut Vec<u8>, headers: &[httparse::Header<'_>]) {
    out.extend_from_slice(b"transfer-encoding: ");
    let mut first = true;
    for h in headers
        .iter()
        .filter(|h| header::kind(h.name) == Kind::TransferEncoding)
    {
        for coding in tokens(h.value) {
            if !first {
                out.extend_from_slice(b", ");
            }
            out.extend_from_slice(coding);
            first = false;
        }
    }
    out.extend_from_slice(b"\r\n");
}

/// Upgrade tokens compare without case and without a version (`websocket`, `WebSocket/13`).
fn same_protocol(a: &[u8], b: &[u8]) -> bool {
    let name = |v: &[u8]| -> Vec<u8> {
        let first = tokens(v).next().unwrap_or(v);
        let name = first.split(|&c| c == b'/').next().unwrap_or(first);
        name.to_ascii_lowercase()
    };
    name(a) == name(b)
}

fn listed(headers: &[httparse::Header<'_>], name: &str) -> bool {
    header::connection_lists(
        headers
            .iter()
            .filter(|h| header::kind(h.name) == Kind::Connection)
            .map(|h| h.value),
        name,
    )
}

/// A response the proxy makes itself (400, 404, 421, 503, a redirect, 502 and 504), with the
/// body text `respond::status` uses.
pub fn write_local(
    out: &mut Vec<u8>,
    code: StatusCode,
    location: Option<&str>,
    ctx: &ResponseContext<'_>,
) {
    // A 204 (the CORS preflight) has no body.
    let body = if code == StatusCode::NO_CONTENT {
        String::new()
    } else {
        crate::proxy::respond::status_text(code)
    };
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
            b"\r\nserver: ",
            ctx.server,
            b"\r\ndate: ",
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
    for (name, value) in ctx.set_headers {
        push(
            out,
            &[name.as_str().as_bytes(), b": ", value.as_bytes(), b"\r\n"],
        );
    }
    // add-headers, each the answer does not already carry (as the HTTP/2 path).
    let written = |name: &http::HeaderName| {
        matches!(
            name.as_str(),
            "content-type" | "content-length" | "server" | "date" | "connection"
        ) || (name == "location" && location.is_some())
            || (name == "strict-transport-security" && ctx.hsts.is_some())
            || ctx.set_headers.iter().any(|(n, _)| n == name)
    };
    for (name, value) in crate::proxy::phase::response::own_headers(ctx.own_headers, &written) {
        push(
            out,
            &[name.as_str().as_bytes(), b": ", value.as_bytes(), b"\r\n"],
        );
    }
    if ctx.close {
        out.extend_from_slice(b"connection: close\r\n");
    }
    out.extend_from_slice(b"\r\n");
    if !ctx.head_request {
        out.extend_from_slice(body.as_bytes());
    }
}

/// The error backend's page (`custom-http-errors`) as the client's response: its status,
/// `Content-Type` and body, with the headers the proxy adds to its own answers.
pub(crate) fn write_page(
    out: &mut Vec<u8>,
    page: &crate::proxy::phase::error_page::Page,
    ctx: &ResponseContext<'_>,
) {
    let code = page.status;
    out.clear();
    push(
        out,
        &[
            b"HTTP/1.1 ",
            code.as_str().as_bytes(),
            b" ",
            code.canonical_reason().unwrap_or("").as_bytes(),
            b"\r\nserver: ",
            ctx.server,
            b"\r\ndate: ",
            &http_date(),
            b"\r\n",
        ],
    );
    // Only a HEAD page can lack one: its response has no body to frame.
    if let Some(length) = page.length {
        let mut digits = itoa::Buffer::new();
        push(
            out,
            &[
                b"content-length: ",
                digits.format(length).as_bytes(),
                b"\r\n",
            ],
        );
    }
    if let Some(content_type) = &page.content_type {
        push(out, &[b"content-type: ", content_type.as_bytes(), b"\r\n"]);
    }
    if let Some(hsts) = ctx.hsts {
        push(out, &[b"strict-transport-security: ", hsts, b"\r\n"]);
    }
    for (name, value) in ctx.set_headers {
        push(
            out,
            &[name.as_str().as_bytes(), b": ", value.as_bytes(), b"\r\n"],
        );
    }
    if ctx.close {
        out.extend_from_slice(b"connection: close\r\n");
    }
    out.extend_from_slice(b"\r\n");
    if !ctx.head_request {
        out.extend_from_slice(&page.body);
    }
}

/// The current time as an HTTP date, formatted at most once a second.
pub fn http_date() -> [u8; 29] {
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
mod tests;
