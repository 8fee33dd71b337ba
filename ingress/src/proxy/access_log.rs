//! The access log: what one request line says, in this project's structured form or in
//! ingress-nginx's default `upstream` format, byte for byte, so the log shippers' parsers that
//! read ingress-nginx's lines read ours.
//!
//! ```text
//!   request read   ── Logged: method, target, host, Referer, User-Agent, Basic user, request id
//!   request done   ── Meter: bytes in and out, the upstream's address, status and timings
//!                  ── Record (phase/mod.rs) ── response.rs: metrics, then one line:
//!                       --access-log-format text      a `tracing` event (target `access`)
//!                       --access-log-format json      json_line(): the same event's JSON object
//!                       --access-log-format upstream  upstream_line(): nginx's log_format
//!                  ── json and upstream lines: formatted into a buffer the thread reuses, then
//!                     copied into log_lines.rs's buffer, which one thread writes in batches
//! ```
//!
//! The `json` and `upstream` lines are written here, not by `tracing`'s formatter: at full load
//! the event machinery (a visitor per field, serde per value, a channel send per line) cost a
//! fifth of the proxy's requests per second. The wall clock is formatted once a second.
//!
//! `upstream` is ingress-nginx's `log-format-upstream` default:
//!
//! ```text
//! $remote_addr - $remote_user [$time_local] "$request" $status $body_bytes_sent "$http_referer"
//! "$http_user_agent" $request_length $request_time [$proxy_upstream_name]
//! [$proxy_alternative_upstream_name] $upstream_addr $upstream_response_length
//! $upstream_response_time $upstream_status $req_id
//! ```
//!
//! Every byte that came from a client or an upstream is escaped as nginx's `escape=default`
//! does (`"`, `\` and bytes outside printable ASCII become `\xHH`), so a header can never
//! start a new line or close a quoted field early.

use std::cell::Cell;
use std::fmt::Write as _;
use std::io::Write as _;
use std::net::IpAddr;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::Engine as _;

use super::connect::PoolKey;
use crate::snapshot::Route;
use crate::snapshot::backend::{Backend, PortRef};

/// How access-log lines are written (`--access-log-format`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AccessFormat {
    /// A `tracing` event with named fields, rendered as text.
    #[default]
    Event,
    /// The same fields as a JSON object, written here.
    Json,
    /// ingress-nginx's default `upstream` line.
    Upstream,
}

/// What the access log keeps of a request from when it was read; made only when the access
/// log is on. Every field's bytes sit in one buffer, not one per field, and an HTTP/1.x
/// connection hands that buffer on to its next request (at full load the allocator showed in
/// the access log's cost).
#[derive(Clone, Debug, Default)]
pub(crate) struct Logged {
    text: Vec<u8>,
    method: Span,
    /// The request target as the client sent it.
    target: Span,
    host: Option<Span>,
    referer: Option<Span>,
    user_agent: Option<Span>,
    /// The user of a `Basic` `Authorization` header, as nginx's `$remote_user`.
    user: Option<Span>,
    /// The `X-Request-ID` sent upstream: the client's when usable, else a new one.
    request_id: Span,
    /// `HTTP/1.0`, `HTTP/1.1` or `HTTP/2.0`, as nginx writes `$server_protocol`.
    pub(crate) protocol: &'static str,
}

/// Where one field sits in [`Logged::text`].
#[derive(Clone, Copy, Debug, Default)]
struct Span {
    start: usize,
    end: usize,
}

impl Logged {
    pub(crate) fn new<'h>(
        method: &str,
        target: &str,
        host: Option<&str>,
        protocol: &'static str,
        header: impl Fn(&str) -> Option<&'h [u8]>,
        request_id: &[u8],
    ) -> Self {
        Self::new_in(
            Vec::new(),
            method,
            target,
            host,
            protocol,
            header,
            request_id,
        )
    }

    /// As [`Logged::new`], in `text`: the buffer of a connection's previous request, so a
    /// keep-alive connection allocates none per request (at full load the allocator showed in
    /// the access log's cost).
    pub(crate) fn new_in<'h>(
        mut text: Vec<u8>,
        method: &str,
        target: &str,
        host: Option<&str>,
        protocol: &'static str,
        header: impl Fn(&str) -> Option<&'h [u8]>,
        request_id: &[u8],
    ) -> Self {
        let referer = header("referer");
        let user_agent = header("user-agent");
        let authorization = header("authorization");
        let size = [
            Some(method.as_bytes()),
            Some(target.as_bytes()),
            host.map(str::as_bytes),
            referer,
            user_agent,
            authorization,
            Some(request_id),
        ]
        .iter()
        .map(|field| field.map_or(0, <[u8]>::len))
        .sum();
        text.clear();
        text.reserve(size);
        let mut keep = |bytes: &[u8]| {
            let start = text.len();
            text.extend_from_slice(bytes);
            Span {
                start,
                end: text.len(),
            }
        };
        let method = keep(method.as_bytes());
        let target = keep(target.as_bytes());
        let host = host.map(|host| keep(host.as_bytes()));
        let referer = referer.map(&mut keep);
        let user_agent = user_agent.map(&mut keep);
        // Lossy, so that the field reads as a `str`; a usable id is printable ASCII anyway, and
        // ASCII (checked a word at a time) is kept as it is.
        let request_id = if request_id.is_ascii() {
            keep(request_id)
        } else {
            keep(String::from_utf8_lossy(request_id).as_bytes())
        };
        let user = authorization.and_then(|value| basic_user(value, &mut text));
        Self {
            text,
            method,
            target,
            host,
            referer,
            user_agent,
            user,
            request_id,
            protocol,
        }
    }

    /// The buffer, for the connection's next request; a freak one (a huge header) is not kept.
    pub(crate) fn into_buffer(self) -> Vec<u8> {
        if self.text.capacity() > 4096 {
            Vec::new()
        } else {
            self.text
        }
    }

    pub(crate) fn method(&self) -> &str {
        self.str(self.method)
    }

    pub(crate) fn target(&self) -> &str {
        self.str(self.target)
    }

    pub(crate) fn host(&self) -> Option<&str> {
        self.host.map(|span| self.str(span))
    }

    pub(crate) fn request_id(&self) -> &str {
        self.str(self.request_id)
    }

    fn referer(&self) -> Option<&[u8]> {
        self.referer.map(|span| self.bytes(span))
    }

    fn user_agent(&self) -> Option<&[u8]> {
        self.user_agent.map(|span| self.bytes(span))
    }

    fn user(&self) -> Option<&[u8]> {
        self.user.map(|span| self.bytes(span))
    }

    /// A field copied from a `str` (UTF-8, so written as it is into a JSON string), without
    /// checking it again: the line's formatters take these.
    fn text(&self, span: Span) -> &[u8] {
        self.bytes(span)
    }

    fn bytes(&self, span: Span) -> &[u8] {
        self.text.get(span.start..span.end).unwrap_or_default()
    }

    /// A field that was copied from a `str` (never the decoded user), so the fallback is
    /// never taken.
    fn str(&self, span: Span) -> &str {
        std::str::from_utf8(self.bytes(span)).unwrap_or_default()
    }
}

/// The user of `Basic <base64(user:password)>`, as nginx reads `$remote_user`: whatever the
/// route's authentication, and nothing when the header is not that. Decoded onto the end of
/// `text`, and its place there.
fn basic_user(value: &[u8], text: &mut Vec<u8>) -> Option<Span> {
    let (scheme, rest) = value.split_at_checked(6)?;
    if !scheme.eq_ignore_ascii_case(b"basic ") {
        return None;
    }
    let start = text.len();
    if base64::engine::general_purpose::STANDARD
        .decode_vec(rest.trim_ascii(), text)
        .is_err()
    {
        text.truncate(start);
        return None;
    }
    let decoded = text.get(start..).unwrap_or_default();
    let end = start
        + decoded
            .iter()
            .position(|b| *b == b':')
            .unwrap_or(decoded.len());
    if end == start {
        text.truncate(start);
        return None;
    }
    text.truncate(end);
    Some(Span { start, end })
}

/// ingress-nginx's name for a backend: `<namespace>-<service>-<port>`.
pub(crate) fn upstream_name(backend: &Backend) -> String {
    format!(
        "{}-{}-{}",
        backend.service.namespace, backend.service.name, backend.port
    )
}

/// What one request moved, and what its upstream did, as the protocol path measured it: the
/// access log's sizes and upstream fields.
#[derive(Clone, Debug, Default)]
pub(crate) struct Meter {
    /// Bytes read from the client for this request: its head and its body (nginx's
    /// `$request_length`; for HTTP/2, the decoded header fields and the body).
    pub(crate) request_bytes: u64,
    /// Response body bytes written to the client (`$body_bytes_sent`).
    pub(crate) body_bytes_sent: u64,
    /// The canary phase sent the request to the route's canary.
    pub(crate) canary: bool,
    /// The last upstream tried, if any.
    pub(crate) upstream: Option<UpstreamMeter>,
}

/// The upstream side of one request.
#[derive(Clone, Debug)]
pub(crate) struct UpstreamMeter {
    pub(crate) addr: PoolKey,
    /// When the first attempt began: nginx's upstream times count from there.
    pub(crate) started: Instant,
    /// From `started` to the response head, or to giving up.
    pub(crate) spent: Duration,
    /// Its response, when one came.
    pub(crate) response: Option<UpstreamResponse>,
}

/// An upstream's response, measured from the first attempt.
#[derive(Clone, Copy, Debug)]
pub(crate) struct UpstreamResponse {
    pub(crate) status: u16,
    /// Until its head was read.
    pub(crate) header: Duration,
    /// Until its body was passed on.
    pub(crate) response: Duration,
    /// Its body's bytes.
    pub(crate) length: u64,
}

impl UpstreamMeter {
    /// An upstream, first tried at `started`, that has just answered with `status`; the body
    /// is still to come.
    pub(crate) fn answered(addr: PoolKey, started: Instant, status: u16) -> Self {
        let header = started.elapsed();
        Self {
            addr,
            started,
            spent: header,
            response: Some(UpstreamResponse {
                status,
                header,
                response: header,
                length: 0,
            }),
        }
    }

    /// An upstream, first tried at `started`, that gave no response.
    pub(crate) fn failed(addr: PoolKey, started: Instant) -> Self {
        Self {
            addr,
            started,
            spent: started.elapsed(),
            response: None,
        }
    }

    /// The body has been passed on: `length` bytes, by now.
    pub(crate) fn finish(&mut self, length: u64) {
        if let Some(r) = &mut self.response {
            r.length = length;
            r.response = self.started.elapsed();
        }
    }
}

/// Everything one access-log line says.
pub(crate) struct Line<'a> {
    pub(crate) client: IpAddr,
    pub(crate) logged: &'a Logged,
    pub(crate) status: u16,
    pub(crate) elapsed: Duration,
    pub(crate) route: Option<&'a Route>,
    pub(crate) meter: &'a Meter,
    /// The client's HTTP version.
    pub(crate) version: http::Version,
    /// The upstream the request went to, when it went to one.
    pub(crate) upstream: Option<&'a PoolKey>,
    /// Why it failed or was refused, when it was.
    pub(crate) error: Option<&'a dyn std::fmt::Display>,
    /// When the line is written.
    pub(crate) now: SystemTime,
}

/// Appends one line of ingress-nginx's `upstream` format to `out`, without the newline.
pub(crate) fn upstream_line(out: &mut Vec<u8>, l: &Line<'_>) {
    let meter = l.meter;
    let mut numbers = itoa::Buffer::new();
    write_ip(out, l.client);
    out.extend_from_slice(b" - ");
    escaped_or_dash(out, l.logged.user());
    out.extend_from_slice(b" [");
    out.extend_from_slice(&clock(l.now).local);
    out.extend_from_slice(b"] \"");
    escape(out, l.logged.text(l.logged.method));
    out.push(b' ');
    escape(out, l.logged.text(l.logged.target));
    out.push(b' ');
    out.extend_from_slice(l.logged.protocol.as_bytes());
    out.extend_from_slice(b"\" ");
    out.extend_from_slice(numbers.format(l.status).as_bytes());
    out.push(b' ');
    out.extend_from_slice(numbers.format(meter.body_bytes_sent).as_bytes());
    out.extend_from_slice(b" \"");
    escaped_or_dash(out, l.logged.referer());
    out.extend_from_slice(b"\" \"");
    escaped_or_dash(out, l.logged.user_agent());
    out.extend_from_slice(b"\" ");
    out.extend_from_slice(numbers.format(meter.request_bytes).as_bytes());
    out.push(b' ');
    seconds(out, l.elapsed);
    out.extend_from_slice(b" [");
    // ingress-nginx names the upstream of a request it did not route `upstream-default-backend`.
    match l.route {
        Some(route) => write_upstream_name(out, &route.backend),
        None => out.extend_from_slice(b"upstream-default-backend"),
    }
    out.extend_from_slice(b"] [");
    if let (Some(route), true) = (l.route, meter.canary)
        && let Some(canary) = &route.policy.canary
    {
        write_upstream_name(out, &canary.backend);
    }
    out.extend_from_slice(b"] ");
    match &meter.upstream {
        Some(up) => {
            write_key(out, &up.addr);
            out.push(b' ');
            match up.response {
                Some(times) => {
                    out.extend_from_slice(numbers.format(times.length).as_bytes());
                    out.push(b' ');
                    seconds(out, times.response);
                    out.push(b' ');
                    out.extend_from_slice(numbers.format(times.status).as_bytes());
                    out.push(b' ');
                }
                // Tried, but no response: as nginx, no bytes, the time spent trying, and the
                // status the proxy answered with (502, 504).
                None => {
                    out.extend_from_slice(b"0 ");
                    seconds(out, up.spent);
                    out.push(b' ');
                    out.extend_from_slice(numbers.format(l.status).as_bytes());
                    out.push(b' ');
                }
            }
        }
        None => out.extend_from_slice(b"- - - - "),
    }
    out.extend_from_slice(l.logged.text(l.logged.request_id));
}

/// Appends the JSON access line to `out`, without the newline: the object tracing-subscriber's
/// JSON formatter wrote for the access event (same keys, order, value types and escaping), so
/// parsers of earlier lines read these.
pub(crate) fn json_line(out: &mut Vec<u8>, l: &Line<'_>) {
    let meter = l.meter;
    let upstream = meter.upstream.as_ref();
    let answered = upstream.and_then(|u| u.response);
    let mut numbers = itoa::Buffer::new();
    out.extend_from_slice(b"{\"timestamp\":\"");
    let clock = clock(l.now);
    out.extend_from_slice(&clock.iso);
    out.push(b'.');
    let micros = l
        .now
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_micros());
    out.extend_from_slice(&six_digits(micros));
    out.extend_from_slice(b"Z\",\"level\":\"INFO\",\"client\":\"");
    write_ip(out, l.client);
    out.extend_from_slice(b"\",\"method\":");
    json_str(out, l.logged.text(l.logged.method));
    out.extend_from_slice(b",\"host\":");
    json_str(out, l.logged.host.map_or(b"-", |span| l.logged.text(span)));
    out.extend_from_slice(b",\"uri\":");
    json_str(out, l.logged.text(l.logged.target));
    out.extend_from_slice(b",\"version\":\"");
    out.extend_from_slice(version_debug(l.version).as_bytes());
    out.extend_from_slice(b"\",\"status\":");
    out.extend_from_slice(numbers.format(l.status).as_bytes());
    out.extend_from_slice(b",\"duration_ms\":\"");
    milliseconds(out, l.elapsed);
    out.extend_from_slice(b"\",\"request_bytes\":");
    out.extend_from_slice(numbers.format(meter.request_bytes).as_bytes());
    out.extend_from_slice(b",\"body_bytes_sent\":");
    out.extend_from_slice(numbers.format(meter.body_bytes_sent).as_bytes());
    out.extend_from_slice(b",\"upstream\":\"");
    match l.upstream {
        Some(key) => write_key(out, key),
        None => out.push(b'-'),
    }
    out.extend_from_slice(b"\",\"upstream_status\":");
    out.extend_from_slice(numbers.format(answered.map_or(0, |a| a.status)).as_bytes());
    out.extend_from_slice(b",\"upstream_header_ms\":\"");
    milliseconds(out, answered.map_or(Duration::ZERO, |a| a.header));
    out.extend_from_slice(b"\",\"upstream_response_ms\":\"");
    milliseconds(
        out,
        upstream.map_or(Duration::ZERO, |u| answered.map_or(u.spent, |a| a.response)),
    );
    out.extend_from_slice(b"\",\"upstream_bytes\":");
    out.extend_from_slice(numbers.format(answered.map_or(0, |a| a.length)).as_bytes());
    out.extend_from_slice(b",\"ingress\":\"");
    match l.route {
        Some(route) => json_object_key(out, &route.ingress),
        None => out.push(b'-'),
    }
    out.extend_from_slice(b"\",\"service\":\"");
    match l.route {
        Some(route) => json_object_key(out, &route.backend.service),
        None => out.push(b'-'),
    }
    out.extend_from_slice(b"\",\"canary\":");
    out.extend_from_slice(if meter.canary { b"true" } else { b"false" });
    out.extend_from_slice(b",\"request_id\":");
    json_str(out, l.logged.text(l.logged.request_id));
    out.extend_from_slice(b",\"error\":\"");
    match l.error {
        Some(error) => {
            let _ = write!(JsonText(out), "{error}");
        }
        None => out.push(b'-'),
    }
    out.extend_from_slice(b"\",\"target\":\"access\"}");
}

/// `version` as its `Debug` form writes it (the text tracing's JSON lines carried), without
/// the formatting machinery.
fn version_debug(version: http::Version) -> &'static str {
    match version {
        http::Version::HTTP_09 => "HTTP/0.9",
        http::Version::HTTP_10 => "HTTP/1.0",
        http::Version::HTTP_11 => "HTTP/1.1",
        http::Version::HTTP_2 => "HTTP/2.0",
        http::Version::HTTP_3 => "HTTP/3.0",
        _ => "-",
    }
}

/// `value` (UTF-8) as a JSON string, quoted.
fn json_str(out: &mut Vec<u8>, value: &[u8]) {
    out.push(b'"');
    json_escape(out, value);
    out.push(b'"');
}

/// The inside of a JSON string, escaped as serde_json escapes it: `"` and `\` with a backslash,
/// the control characters below U+0020 as `\b \t \n \f \r` or `\u00xx`; everything else as it
/// is. `bytes` are UTF-8 (a `str`'s, or a `Logged` field copied from one), so the result is.
fn json_escape(out: &mut Vec<u8>, bytes: &[u8]) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    // Nearly every value needs no escape at all: one pass, then one copy. The pass looks at
    // every byte without stopping early, which the compiler turns into a few vector compares.
    let any_escaped = bytes.iter().fold(false, |any, &b| {
        any | (b < 0x20) | (b == b'"') | (b == b'\\')
    });
    if !any_escaped {
        out.extend_from_slice(bytes);
        return;
    }
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let escaped: &[u8] = match b {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            0x08 => b"\\b",
            b'\t' => b"\\t",
            b'\n' => b"\\n",
            0x0c => b"\\f",
            b'\r' => b"\\r",
            0..=0x1f => &[
                b'\\',
                b'u',
                b'0',
                b'0',
                HEX[usize::from(b >> 4)],
                HEX[usize::from(b & 0xf)],
            ],
            _ => continue,
        };
        out.extend_from_slice(&bytes[start..i]);
        out.extend_from_slice(escaped);
        start = i + 1;
    }
    out.extend_from_slice(&bytes[start..]);
}

/// A `fmt::Write` that appends what it is given as the inside of a JSON string: how
/// `Display` values reach a line with no `String` in between.
struct JsonText<'a>(&'a mut Vec<u8>);

impl std::fmt::Write for JsonText<'_> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        json_escape(self.0, s.as_bytes());
        Ok(())
    }
}

/// ingress-nginx's name for a backend, `<namespace>-<service>-<port>`, appended to `out`
/// (escaped, though Kubernetes names need none).
fn write_upstream_name(out: &mut Vec<u8>, backend: &Backend) {
    escape(out, backend.service.namespace.as_bytes());
    out.push(b'-');
    escape(out, backend.service.name.as_bytes());
    out.push(b'-');
    match &backend.port {
        PortRef::Number(n) => out.extend_from_slice(itoa::Buffer::new().format(*n).as_bytes()),
        PortRef::Name(name) => escape(out, name.as_bytes()),
    }
}

/// An address as `Display` writes it; IPv4 without the formatting machinery, it being nearly
/// every line's.
fn write_ip(out: &mut Vec<u8>, ip: IpAddr) {
    match ip {
        IpAddr::V4(v4) => {
            // Digit by digit into a buffer on the stack, then one copy: a line has two of
            // these, and a copy per octet (a `memcpy` call each) showed in its cost.
            let mut text = [0u8; 15];
            let mut len = 0;
            let mut put = |byte: u8| {
                if let Some(slot) = text.get_mut(len) {
                    *slot = byte;
                    len += 1;
                }
            };
            for (i, octet) in v4.octets().into_iter().enumerate() {
                if i > 0 {
                    put(b'.');
                }
                if octet >= 100 {
                    put(b'0' + octet / 100);
                }
                if octet >= 10 {
                    put(b'0' + octet / 10 % 10);
                }
                put(b'0' + octet % 10);
            }
            out.extend_from_slice(text.get(..len).unwrap_or_default());
        }
        IpAddr::V6(v6) => {
            let _ = write!(out, "{v6}");
        }
    }
}

/// An upstream as `Display` writes it (`10.1.2.3:8080`, `[2001:db8::1]:80`, or the external
/// name, escaped for a JSON string, which a DNS name never needs).
fn write_key(out: &mut Vec<u8>, key: &PoolKey) {
    match key {
        PoolKey::Addr(std::net::SocketAddr::V4(addr)) => {
            write_ip(out, IpAddr::V4(*addr.ip()));
            out.push(b':');
            out.extend_from_slice(itoa::Buffer::new().format(addr.port()).as_bytes());
        }
        other => {
            let _ = write!(JsonText(out), "{other}");
        }
    }
}

/// `namespace/name` (or `name` alone) inside a JSON string, as `ObjectKey`'s `Display`.
fn json_object_key(out: &mut Vec<u8>, key: &crate::object::ObjectKey) {
    if !key.namespace.is_empty() {
        json_escape(out, key.namespace.as_bytes());
        out.push(b'/');
    }
    json_escape(out, key.name.as_bytes());
}

// The two below count in `u64` (whole seconds, then the fraction), not in `Duration`'s
// `u128` totals: a `u128` division is a library call, and a line has up to four of these.

/// Seconds with millisecond resolution, as nginx's `$request_time`.
fn seconds(out: &mut Vec<u8>, d: Duration) {
    out.extend_from_slice(itoa::Buffer::new().format(d.as_secs()).as_bytes());
    out.push(b'.');
    out.extend_from_slice(&six_digits(d.subsec_millis())[3..]);
}

/// Milliseconds with three decimals (microseconds, rounded to the nearest).
fn milliseconds(out: &mut Vec<u8>, d: Duration) {
    // Microseconds rounded, in (seconds, microseconds below a second); the rounding may carry.
    let rounded = (d.subsec_nanos() + 500) / 1000;
    let (secs, micros) = if rounded == 1_000_000 {
        (d.as_secs().saturating_add(1), 0)
    } else {
        (d.as_secs(), rounded)
    };
    let whole_ms = secs
        .saturating_mul(1000)
        .saturating_add(u64::from(micros / 1000));
    out.extend_from_slice(itoa::Buffer::new().format(whole_ms).as_bytes());
    out.push(b'.');
    out.extend_from_slice(&six_digits(micros % 1000)[3..]);
}

/// `n` (below a million) in six digits, zero-padded.
fn six_digits(n: u32) -> [u8; 6] {
    let mut out = [b'0'; 6];
    let mut n = n % 1_000_000;
    for digit in out.iter_mut().rev() {
        *digit = b'0' + (n % 10) as u8;
        n /= 10;
    }
    out
}

fn escaped_or_dash(out: &mut Vec<u8>, bytes: Option<&[u8]>) {
    match bytes {
        Some(b) if !b.is_empty() => escape(out, b),
        _ => out.push(b'-'),
    }
}

/// nginx's `escape=default`: `"`, `\`, and bytes below 0x20 or above 0x7e as `\xHH`.
fn escape(out: &mut Vec<u8>, bytes: &[u8]) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    // As in `json_escape`: a value with nothing to escape (nearly every one) is found with
    // vector compares and copied whole.
    let any_escaped = bytes.iter().fold(false, |any, &b| {
        any | (b == b'"') | (b == b'\\') | !(0x20..=0x7e).contains(&b)
    });
    if !any_escaped {
        out.extend_from_slice(bytes);
        return;
    }
    // Runs that need no escape are copied whole.
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        if b == b'"' || b == b'\\' || !(0x20..=0x7e).contains(&b) {
            out.extend_from_slice(&bytes[start..i]);
            out.extend_from_slice(&[
                b'\\',
                b'x',
                HEX[usize::from(b >> 4)],
                HEX[usize::from(b & 0xf)],
            ]);
            start = i + 1;
        }
    }
    out.extend_from_slice(&bytes[start..]);
}

/// One second of wall-clock time, as the access lines write it.
#[derive(Clone, Copy)]
struct Second {
    at: u64,
    /// `$time_local`: `26/Nov/2026:21:46:28 +0000` (the proxy logs in UTC).
    local: [u8; 26],
    /// `2026-11-26T21:46:28`, the JSON timestamp without its fraction.
    iso: [u8; 19],
}

/// The wall-clock time of `at`, a moment the request path already read from the monotonic
/// clock (when the response ended), so a line reads no clock of its own: the wall clock is read
/// once a second per thread, and `at` placed after that reading by the monotonic clock.
/// Between two readings the two clocks drift apart by NTP's slew at most (well under a
/// millisecond), and a step of the wall clock shows within a second. nginx's own `$msec` and
/// `$time_local` are cached per event-loop turn the same way.
pub(crate) fn wall_clock(at: Instant) -> SystemTime {
    thread_local! {
        static ANCHOR: Cell<Option<(Instant, SystemTime)>> = const { Cell::new(None) };
    }
    ANCHOR.with(|anchor| {
        if let Some((instant, wall)) = anchor.get()
            && let Some(since) = at.checked_duration_since(instant)
            && since < Duration::from_secs(1)
        {
            return wall + since;
        }
        let (instant, wall) = (Instant::now(), SystemTime::now());
        anchor.set(Some((instant, wall)));
        match at.checked_duration_since(instant) {
            Some(after) => wall + after,
            None => wall
                .checked_sub(instant.saturating_duration_since(at))
                .unwrap_or(wall),
        }
    })
}

/// The second `now` falls in, formatted at most once a second per thread.
fn clock(now: SystemTime) -> Second {
    thread_local! {
        static CACHED: Cell<Option<Second>> = const { Cell::new(None) };
    }
    let at = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    CACHED.with(|cached| match cached.get() {
        Some(second) if second.at == at => second,
        _ => {
            let second = format_second(at);
            cached.set(Some(second));
            second
        }
    })
}

/// The UTC calendar fields of `at` (seconds since the epoch), formatted.
fn format_second(at: u64) -> Second {
    const MONTHS: [&[u8; 3]; 12] = [
        b"Jan", b"Feb", b"Mar", b"Apr", b"May", b"Jun", b"Jul", b"Aug", b"Sep", b"Oct", b"Nov",
        b"Dec",
    ];
    let (year, month, day) = civil_from_days(at / 86_400);
    let secs = at % 86_400;
    let two = |n: u64| {
        let d = six_digits(u32::try_from(n % 100).unwrap_or(0));
        [d[4], d[5]]
    };
    let year4 = six_digits(u32::try_from(year % 10_000).unwrap_or(0));
    let year4 = [year4[2], year4[3], year4[4], year4[5]];
    let (hh, mm, ss) = (two(secs / 3600), two(secs / 60 % 60), two(secs % 60));
    let (mo, dd) = (two(u64::from(month)), two(u64::from(day)));
    let name = MONTHS[usize::from(month.clamp(1, 12) - 1)];
    let mut local = [0u8; 26];
    let parts: [&[u8]; 11] = [
        &dd, b"/", name, b"/", &year4, b":", &hh, b":", &mm, b":", &ss,
    ];
    let mut at_byte = 0;
    for part in parts.iter().chain([&b" +0000"[..]].iter()) {
        local[at_byte..at_byte + part.len()].copy_from_slice(part);
        at_byte += part.len();
    }
    let mut iso = [0u8; 19];
    let parts: [&[u8]; 11] = [
        &year4, b"-", &mo, b"-", &dd, b"T", &hh, b":", &mm, b":", &ss,
    ];
    let mut at_byte = 0;
    for part in parts {
        iso[at_byte..at_byte + part.len()].copy_from_slice(part);
        at_byte += part.len();
    }
    Second { at, local, iso }
}

/// The proleptic Gregorian (year, month, day) of a day count since 1970-01-01 (Howard
/// Hinnant's `civil_from_days`, for days on or after the epoch).
fn civil_from_days(days: u64) -> (u64, u8, u8) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    (
        year,
        u8::try_from(month).unwrap_or(1),
        u8::try_from(day).unwrap_or(1),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_written_as_debug_writes_them() {
        for version in [
            http::Version::HTTP_09,
            http::Version::HTTP_10,
            http::Version::HTTP_11,
            http::Version::HTTP_2,
            http::Version::HTTP_3,
        ] {
            assert_eq!(version_debug(version), format!("{version:?}"));
        }
    }

    #[test]
    fn basic_user_is_read_as_nginx_reads_it() {
        let cases: &[(&[u8], Option<&[u8]>)] = &[
            (b"Basic YWxpY2U6c2VjcmV0", Some(b"alice")),
            (b"basic YWxpY2U6c2VjcmV0", Some(b"alice")),
            (b"Basic   YWxpY2U6c2VjcmV0  ", Some(b"alice")),
            // "alice" alone, no colon: still the user.
            (b"Basic YWxpY2U=", Some(b"alice")),
            (b"Basic OnNlY3JldA==", None),
            (b"Bearer YWxpY2U6c2VjcmV0", None),
            (b"Basic !!!", None),
            (b"Basic", None),
            (b"", None),
        ];
        for (header, want) in cases {
            let headers = |name: &str| match name {
                "authorization" => Some(*header),
                "referer" => Some(&b"https://from.example/"[..]),
                "user-agent" => Some(&b"curl/8"[..]),
                _ => None,
            };
            let logged = Logged::new("GET", "/p?q", Some("h.example"), "HTTP/1.1", headers, b"id");
            let context = String::from_utf8_lossy(header);
            assert_eq!(logged.user(), *want, "{context:?}");
            // The user is decoded into the same buffer as the rest: nothing else moves.
            assert_eq!(
                (logged.method(), logged.target(), logged.host()),
                ("GET", "/p?q", Some("h.example")),
                "{context:?}"
            );
            assert_eq!(
                (logged.referer(), logged.user_agent(), logged.request_id()),
                (
                    Some(&b"https://from.example/"[..]),
                    Some(&b"curl/8"[..]),
                    "id"
                ),
                "{context:?}"
            );
        }
    }

    #[test]
    fn a_reused_buffer_keeps_nothing_of_the_last_request() {
        let long = |name: &str| match name {
            "referer" => Some(&b"https://a-much-longer-referer.example/with/a/path"[..]),
            "user-agent" => Some(&b"agent/1"[..]),
            "authorization" => Some(&b"Basic YWxpY2U6c2VjcmV0"[..]),
            _ => None,
        };
        let first = Logged::new(
            "POST",
            "/first/long/path",
            Some("a.example"),
            "HTTP/1.1",
            long,
            b"id-1",
        );
        let buffer = first.into_buffer();
        assert!(
            buffer.capacity() > 0,
            "the buffer is kept for the next request"
        );
        let second = Logged::new_in(buffer, "GET", "/", None, "HTTP/1.0", |_| None, b"id-2");
        assert_eq!(
            (
                second.method(),
                second.target(),
                second.host(),
                second.request_id()
            ),
            ("GET", "/", None, "id-2")
        );
        assert_eq!(
            (second.referer(), second.user_agent(), second.user()),
            (None, None, None)
        );
        // A freak request's buffer (a huge header) is not kept.
        let huge = vec![b'x'; 10_000];
        let big = Logged::new(
            "GET",
            "/",
            None,
            "HTTP/1.1",
            |name| (name == "user-agent").then_some(&huge[..]),
            b"id",
        );
        assert_eq!(big.into_buffer().capacity(), 0);
    }

    #[test]
    fn escaping_keeps_each_line_one_line_and_each_quote_closed() {
        let cases: &[(&[u8], &str)] = &[
            (b"curl/8.0", "curl/8.0"),
            (b"a\"b", "a\\x22b"),
            (b"a\\b", "a\\x5Cb"),
            (b"a\r\nb", "a\\x0D\\x0Ab"),
            (b"\x7f\xff", "\\x7F\\xFF"),
            (b"caf\xc3\xa9", "caf\\xC3\\xA9"),
        ];
        for (raw, want) in cases {
            let mut out = Vec::new();
            escape(&mut out, raw);
            assert_eq!(String::from_utf8_lossy(&out), *want);
        }
        // Every byte, between two that need nothing: the fast path and the slow one agree.
        for b in 0..=255u8 {
            let mut out = Vec::new();
            escape(&mut out, &[b'x', b, b'y']);
            let middle = if b == b'"' || b == b'\\' || !(0x20..=0x7e).contains(&b) {
                format!("\\x{b:02X}")
            } else {
                char::from(b).to_string()
            };
            assert_eq!(
                String::from_utf8_lossy(&out),
                format!("x{middle}y"),
                "byte {b:#04x}"
            );
        }
    }

    #[test]
    fn json_strings_are_escaped_as_serde_json_escapes_them() {
        // Hostile bytes reach the JSON line as `&str` (the request id through
        // `from_utf8_lossy`): invalid UTF-8 is U+FFFD by then.
        let hostile: &[&[u8]] = &[
            b"",
            b"plain/1.0",
            b"a\"b",
            b"a\\b",
            b"\\\"",
            b"line\r\nbreak",
            b"\x00\x01\x07\x08\x09\x0a\x0b\x0c\x0d\x1b\x1f\x20",
            b"\x7f",
            b"caf\xc3\xa9 \xe2\x80\xa8 \xf0\x9f\x98\x80",
            b"\xff\xfe invalid \xc3 utf-8 \xed\xa0\x80",
            b"</script>{\"a\":1}",
        ];
        for raw in hostile {
            let text = String::from_utf8_lossy(raw);
            let mut out = Vec::new();
            json_str(&mut out, text.as_bytes());
            let want = serde_json::to_vec(&*text).unwrap_or_default();
            assert_eq!(
                String::from_utf8_lossy(&out),
                String::from_utf8_lossy(&want),
                "{raw:?}"
            );
            let back: String = serde_json::from_slice(&out)
                .unwrap_or_else(|e| panic!("{raw:?} is not a JSON string: {e}"));
            assert_eq!(back, text);
            // The same through `Display`, split at every byte the formatter may split at.
            let mut via_display = Vec::new();
            let _ =
                std::fmt::Write::write_fmt(&mut JsonText(&mut via_display), format_args!("{text}"));
            assert_eq!(via_display, out[1..out.len() - 1], "{raw:?}");
        }
    }

    #[test]
    fn json_control_bytes_have_their_short_or_unicode_escapes() {
        let cases: &[(&str, &str)] = &[
            ("\u{8}", "\\b"),
            ("\t", "\\t"),
            ("\n", "\\n"),
            ("\u{c}", "\\f"),
            ("\r", "\\r"),
            ("\u{0}", "\\u0000"),
            ("\u{1b}", "\\u001b"),
            ("\u{1f}", "\\u001f"),
            ("\u{7f}", "\u{7f}"),
            ("\"", "\\\""),
            ("\\", "\\\\"),
            ("/", "/"),
        ];
        for (raw, want) in cases {
            let mut out = Vec::new();
            json_escape(&mut out, raw.as_bytes());
            assert_eq!(String::from_utf8_lossy(&out), *want, "{raw:?}");
        }
    }

    /// The JSON object tracing-subscriber's formatter (`json().flatten_event(true)`) wrote for
    /// the access event before this module wrote the line itself, for the same values: the
    /// event is the one the proxy emitted, field for field.
    fn formatted_by_tracing(l: &Line<'_>) -> String {
        #[derive(Clone, Default)]
        struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);
        impl std::io::Write for Captured {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                if let Ok(mut kept) = self.0.lock() {
                    kept.extend_from_slice(buf);
                }
                Ok(buf.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Captured {
            type Writer = Captured;
            fn make_writer(&'a self) -> Captured {
                self.clone()
            }
        }
        let captured = Captured::default();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(captured.clone())
            .json()
            .flatten_event(true)
            .finish();
        let (logged, meter) = (l.logged, l.meter);
        let upstream = meter.upstream.as_ref();
        let answered = upstream.and_then(|u| u.response);
        let error = l.error.map_or_else(|| "-".to_string(), ToString::to_string);
        tracing::subscriber::with_default(subscriber, || {
            tracing::info!(
                target: "access",
                client = %l.client,
                method = logged.method(),
                host = logged.host().unwrap_or("-"),
                uri = logged.target(),
                version = ?l.version,
                status = l.status,
                duration_ms = %format_args!("{:.3}", l.elapsed.as_secs_f64() * 1000.0),
                request_bytes = meter.request_bytes,
                body_bytes_sent = meter.body_bytes_sent,
                upstream = %l.upstream.map_or_else(|| "-".to_string(), ToString::to_string),
                upstream_status = answered.map_or(0, |a| a.status),
                upstream_header_ms = %format_args!("{:.3}", answered.map_or(0.0, |a| a.header.as_secs_f64() * 1000.0)),
                upstream_response_ms = %format_args!("{:.3}", upstream.map_or(0.0, |u| answered.map_or(u.spent, |a| a.response).as_secs_f64() * 1000.0)),
                upstream_bytes = answered.map_or(0, |a| a.length),
                ingress = "-",
                service = "-",
                canary = meter.canary,
                request_id = logged.request_id(),
                error = error,
            );
        });
        let bytes = captured.0.lock().map(|b| b.clone()).unwrap_or_default();
        String::from_utf8_lossy(&bytes).trim_end().to_string()
    }

    #[test]
    fn json_lines_are_the_objects_tracing_wrote() {
        let hostile = Logged::new(
            "GET",
            "/a\"b\\c\u{1}\u{7f}?q=</script>",
            Some("h\u{e9}st\r\n.example"),
            "HTTP/1.1",
            |_| None,
            b"id\xff\"\n",
        );
        let plain = Logged::new(
            "POST",
            "/",
            None,
            "HTTP/2.0",
            |_| None,
            b"0123456789abcdef0123456789abcdef",
        );
        let addr = PoolKey::Addr(([10, 1, 2, 3], 8080).into());
        let started = Instant::now();
        let answered = Meter {
            request_bytes: 112,
            body_bytes_sent: 24,
            canary: true,
            upstream: Some(UpstreamMeter {
                addr: addr.clone(),
                started,
                spent: Duration::from_micros(301),
                response: Some(UpstreamResponse {
                    status: 200,
                    header: Duration::from_micros(301),
                    response: Duration::from_micros(1_318),
                    length: 24,
                }),
            }),
        };
        let failed = Meter {
            upstream: Some(UpstreamMeter {
                addr: addr.clone(),
                started,
                spent: Duration::from_millis(5_000),
                response: None,
            }),
            ..Meter::default()
        };
        let refusal = "source address not allowed \"x\"";
        let cases: [(
            &Logged,
            &Meter,
            Option<&PoolKey>,
            Option<&dyn std::fmt::Display>,
            u16,
        ); 4] = [
            (&hostile, &answered, Some(&addr), None, 200),
            (&plain, &Meter::default(), None, Some(&refusal), 403),
            (
                &plain,
                &failed,
                Some(&addr),
                Some(&"upstream timed out"),
                504,
            ),
            (&hostile, &Meter::default(), None, None, 404),
        ];
        for (n, (logged, meter, upstream, error, status)) in cases.into_iter().enumerate() {
            let line = Line {
                client: "2001:db8::7"
                    .parse()
                    .unwrap_or(IpAddr::from([127, 0, 0, 1])),
                logged,
                status,
                elapsed: Duration::from_micros(412_250),
                route: None,
                meter,
                version: if n % 2 == 0 {
                    http::Version::HTTP_11
                } else {
                    http::Version::HTTP_2
                },
                upstream,
                error,
                now: SystemTime::now(),
            };
            let mut ours = Vec::new();
            json_line(&mut ours, &line);
            let ours = String::from_utf8_lossy(&ours).into_owned();
            let theirs = formatted_by_tracing(&line);
            // Everything after the timestamp is the same, byte for byte; the timestamp has the
            // same shape (the two were taken at different instants).
            let after = |s: &str| s.split_once("Z\",").map(|(_, rest)| rest.to_string());
            assert_eq!(after(&ours), after(&theirs), "case {n}");
            assert!(after(&ours).is_some(), "{ours}");
            let stamp = |s: &str| s.split_once("Z\",").map(|(head, _)| head.len());
            assert_eq!(stamp(&ours), stamp(&theirs), "{ours}\n{theirs}");
            assert!(
                serde_json::from_str::<serde_json::Value>(&ours).is_ok(),
                "{ours}"
            );
        }
    }

    #[test]
    fn addresses_are_written_as_display_writes_them() {
        for ip in [
            "127.0.0.1",
            "0.0.0.0",
            "255.255.255.255",
            "10.1.2.3",
            "9.99.100.199",
            "200.20.2.0",
            "2001:db8::7",
            "::1",
        ] {
            let ip: IpAddr = ip.parse().unwrap_or_else(|e| panic!("{ip}: {e}"));
            let mut out = Vec::new();
            write_ip(&mut out, ip);
            assert_eq!(String::from_utf8_lossy(&out), ip.to_string());
        }
        for addr in ["10.1.2.3:8080", "127.0.0.1:1", "[2001:db8::1]:443"] {
            let key = PoolKey::Addr(addr.parse().unwrap_or_else(|e| panic!("{addr}: {e}")));
            let mut out = Vec::new();
            write_key(&mut out, &key);
            assert_eq!(String::from_utf8_lossy(&out), key.to_string());
        }
        for (namespace, name, want) in [("shop", "front", "shop/front"), ("", "alone", "alone")] {
            let mut out = Vec::new();
            json_object_key(&mut out, &crate::object::ObjectKey::new(namespace, name));
            assert_eq!(String::from_utf8_lossy(&out), want);
        }
    }

    #[test]
    fn calendar_fields_are_utc() {
        let cases: &[(u64, &str, &str)] = &[
            (0, "01/Jan/1970:00:00:00 +0000", "1970-01-01T00:00:00"),
            (
                951_782_400,
                "29/Feb/2000:00:00:00 +0000",
                "2000-02-29T00:00:00",
            ),
            (
                1_795_729_588,
                "26/Nov/2026:21:46:28 +0000",
                "2026-11-26T21:46:28",
            ),
            (
                4_133_980_799,
                "31/Dec/2100:23:59:59 +0000",
                "2100-12-31T23:59:59",
            ),
            (
                253_402_300_799,
                "31/Dec/9999:23:59:59 +0000",
                "9999-12-31T23:59:59",
            ),
        ];
        for (at, local, iso) in cases {
            let second = format_second(*at);
            assert_eq!(String::from_utf8_lossy(&second.local), *local, "{at}");
            assert_eq!(String::from_utf8_lossy(&second.iso), *iso, "{at}");
            // The same as the HTTP date of that second, in nginx's order.
            let http = httpdate::fmt_http_date(UNIX_EPOCH + Duration::from_secs(*at));
            let parts: Vec<&str> = http.split(' ').collect();
            assert_eq!(
                format!("{}/{}/{}:{} +0000", parts[1], parts[2], parts[3], parts[4]),
                *local
            );
        }
    }

    #[test]
    fn the_cached_second_follows_the_clock() {
        let at = UNIX_EPOCH + Duration::from_secs(1_795_729_588);
        let first = clock(at);
        assert_eq!(&first.local, b"26/Nov/2026:21:46:28 +0000");
        let next = clock(at + Duration::from_millis(1_500));
        assert_eq!(&next.local, b"26/Nov/2026:21:46:29 +0000");
        assert_eq!(&clock(at).iso, b"2026-11-26T21:46:28");
    }

    /// A line's timestamp comes from the moment its response ended, placed by the monotonic
    /// clock after a wall-clock reading at most a second old.
    #[test]
    fn wall_clock_places_moments_after_one_reading() {
        let off_by = |a: SystemTime, b: SystemTime| {
            a.duration_since(b)
                .unwrap_or_else(|e| e.duration())
                .as_millis()
        };
        let start = Instant::now();
        let wall = SystemTime::now();
        // The first call reads the wall clock; `start` is a moment before that reading.
        assert!(off_by(wall_clock(start), wall) < 50);
        // Later moments within the second keep their distance from each other exactly.
        let (a, b) = (
            start + Duration::from_millis(100),
            start + Duration::from_millis(350),
        );
        assert_eq!(
            wall_clock(b).duration_since(wall_clock(a)).unwrap(),
            Duration::from_millis(250)
        );
        // A moment more than a second after the reading takes a new one (and is placed after
        // it by as much as it is later).
        let later = Instant::now() + Duration::from_millis(1_500);
        let expected = SystemTime::now() + Duration::from_millis(1_500);
        assert!(off_by(wall_clock(later), expected) < 50);
        // And a moment before the newest reading is placed before it.
        assert!(off_by(wall_clock(start), wall) < 50);
    }

    #[test]
    fn seconds_have_millisecond_resolution() {
        for (d, want) in [
            (Duration::ZERO, "0.000"),
            (Duration::from_micros(1_500), "0.001"),
            (Duration::from_millis(12_345), "12.345"),
            (Duration::new(3, 999_999_999), "3.999"),
            (Duration::new(86_400 * 400, 7_000_000), "34560000.007"),
        ] {
            let mut out = Vec::new();
            seconds(&mut out, d);
            assert_eq!(String::from_utf8_lossy(&out), want);
        }
    }

    #[test]
    fn milliseconds_have_three_decimals() {
        for (d, want) in [
            (Duration::ZERO, "0.000"),
            (Duration::from_nanos(499), "0.000"),
            (Duration::from_nanos(1_500), "0.002"),
            (Duration::from_micros(123_456), "123.456"),
            (Duration::from_secs(2), "2000.000"),
            // Rounding up carries into the next millisecond, and the next second.
            (Duration::from_nanos(999_500), "1.000"),
            (Duration::new(1, 999_999_600), "2000.000"),
            (Duration::new(61, 234_567_499), "61234.567"),
        ] {
            let mut out = Vec::new();
            milliseconds(&mut out, d);
            assert_eq!(String::from_utf8_lossy(&out), want, "{d:?}");
        }
    }
}
