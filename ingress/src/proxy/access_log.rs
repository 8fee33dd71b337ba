//! The access log: what one request line says, in this project's structured form or in
//! ingress-nginx's default `upstream` format, byte for byte, so the log shippers' parsers that
//! read ingress-nginx's lines read ours.
//!
//! ```text
//!   request read   ── Logged: method, target, host, Referer, User-Agent, Basic user, request id
//!   request done   ── Meter: bytes in and out, the upstream's address, status and timings
//!                  ── Record (phase/mod.rs) ── response.rs: metrics, then one line:
//!                       --access-log-format text|json  a `tracing` event (target `access`)
//!                       --access-log-format upstream   upstream_line(): nginx's log_format
//! ```
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
use std::net::IpAddr;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::Engine as _;

use super::connect::PoolKey;
use crate::snapshot::Route;
use crate::snapshot::backend::Backend;

/// How access-log lines are written (`--access-log-format`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AccessFormat {
    /// A `tracing` event with named fields, rendered as text or JSON.
    #[default]
    Event,
    /// ingress-nginx's default `upstream` line.
    Upstream,
}

/// What the access log keeps of a request from when it was read; made only when the access
/// log is on.
#[derive(Clone, Debug, Default)]
pub(crate) struct Logged {
    pub(crate) method: String,
    /// The request target as the client sent it.
    pub(crate) target: String,
    pub(crate) host: Option<String>,
    /// `HTTP/1.0`, `HTTP/1.1` or `HTTP/2.0`, as nginx writes `$server_protocol`.
    pub(crate) protocol: &'static str,
    pub(crate) referer: Option<Vec<u8>>,
    pub(crate) user_agent: Option<Vec<u8>>,
    /// The user name of a `Basic` `Authorization` header, as nginx's `$remote_user`.
    pub(crate) user: Option<Vec<u8>>,
    /// The `X-Request-ID` sent upstream: the client's when usable, else a new one.
    pub(crate) request_id: String,
}

impl Logged {
    pub(crate) fn new<'h>(
        method: &str,
        target: &str,
        host: Option<&str>,
        protocol: &'static str,
        header: impl Fn(&str) -> Option<&'h [u8]>,
        request_id: String,
    ) -> Self {
        let owned = |name| header(name).map(<[u8]>::to_vec);
        Self {
            method: method.to_string(),
            target: target.to_string(),
            host: host.map(str::to_string),
            protocol,
            referer: owned("referer"),
            user_agent: owned("user-agent"),
            user: header("authorization").and_then(basic_user),
            request_id,
        }
    }
}

/// The user of `Basic <base64(user:password)>`, as nginx reads `$remote_user`: whatever the
/// route's authentication, and nothing when the header is not that.
fn basic_user(value: &[u8]) -> Option<Vec<u8>> {
    let (scheme, rest) = value.split_at_checked(6)?;
    if !scheme.eq_ignore_ascii_case(b"basic ") {
        return None;
    }
    let encoded = rest.trim_ascii();
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .ok()?;
    let user = decoded.split(|b| *b == b':').next()?;
    (!user.is_empty()).then(|| user.to_vec())
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

/// Everything one `upstream` line needs.
pub(crate) struct Line<'a> {
    pub(crate) client: IpAddr,
    pub(crate) logged: &'a Logged,
    pub(crate) status: u16,
    pub(crate) elapsed: Duration,
    pub(crate) route: Option<&'a Route>,
    pub(crate) meter: &'a Meter,
    /// `$time_local`, from [`time_local`].
    pub(crate) time: &'a str,
}

/// One line of ingress-nginx's `upstream` format, without the newline.
pub(crate) fn upstream_line(l: &Line<'_>) -> String {
    let mut out = String::with_capacity(256);
    let meter = l.meter;
    let _ = write!(out, "{} - ", l.client);
    escaped_or_dash(&mut out, l.logged.user.as_deref());
    let _ = write!(out, " [{}] \"", l.time);
    escape(&mut out, l.logged.method.as_bytes());
    out.push(' ');
    escape(&mut out, l.logged.target.as_bytes());
    out.push(' ');
    out.push_str(l.logged.protocol);
    let _ = write!(out, "\" {} {} \"", l.status, meter.body_bytes_sent);
    escaped_or_dash(&mut out, l.logged.referer.as_deref());
    out.push_str("\" \"");
    escaped_or_dash(&mut out, l.logged.user_agent.as_deref());
    let _ = write!(out, "\" {} {} [", meter.request_bytes, seconds(l.elapsed));
    // ingress-nginx names the upstream of a request it did not route `upstream-default-backend`.
    match l.route {
        Some(route) => out.push_str(&upstream_name(&route.backend)),
        None => out.push_str("upstream-default-backend"),
    }
    out.push_str("] [");
    if let (Some(route), true) = (l.route, meter.canary)
        && let Some(canary) = &route.policy.canary
    {
        out.push_str(&upstream_name(&canary.backend));
    }
    out.push_str("] ");
    match &meter.upstream {
        Some(up) => {
            let _ = write!(out, "{} ", up.addr);
            match up.response {
                Some(times) => {
                    let _ = write!(
                        out,
                        "{} {} {} ",
                        times.length,
                        seconds(times.response),
                        times.status
                    );
                }
                // Tried, but no response: as nginx, no bytes, the time spent trying, and the
                // status the proxy answered with (502, 504).
                None => {
                    let _ = write!(out, "0 {} {} ", seconds(up.spent), l.status);
                }
            }
        }
        None => out.push_str("- - - - "),
    }
    out.push_str(&l.logged.request_id);
    out
}

/// Seconds with millisecond resolution, as nginx's `$request_time`.
fn seconds(d: Duration) -> String {
    let ms = d.as_millis();
    format!("{}.{:03}", ms / 1000, ms % 1000)
}

fn escaped_or_dash(out: &mut String, bytes: Option<&[u8]>) {
    match bytes {
        Some(b) if !b.is_empty() => escape(out, b),
        _ => out.push('-'),
    }
}

/// nginx's `escape=default`: `"`, `\`, and bytes below 0x20 or above 0x7e as `\xHH`.
fn escape(out: &mut String, bytes: &[u8]) {
    for &b in bytes {
        if b == b'"' || b == b'\\' || !(0x20..=0x7e).contains(&b) {
            let _ = write!(out, "\\x{b:02X}");
        } else {
            out.push(char::from(b));
        }
    }
}

/// `$time_local` for now (`26/Nov/2026:21:46:28 +0000`; the proxy logs in UTC), made at
/// most once a second per thread.
pub(crate) fn time_local() -> String {
    thread_local! {
        static CACHED: Cell<(u64, [u8; 26])> = const { Cell::new((u64::MAX, [0; 26])) };
    }
    let now = SystemTime::now();
    let second = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let text = CACHED.with(|cached| {
        let (at, text) = cached.get();
        if at == second {
            return text;
        }
        let text = local_from_http_date(&httpdate::fmt_http_date(now));
        cached.set((second, text));
        text
    });
    String::from_utf8_lossy(&text).into_owned()
}

/// `Thu, 26 Nov 2026 21:46:28 GMT` → `26/Nov/2026:21:46:28 +0000`: the same fields, in
/// nginx's order.
fn local_from_http_date(http: &str) -> [u8; 26] {
    let mut out = [b'-'; 26];
    let mut parts = http.split(' ').skip(1);
    let (Some(day), Some(month), Some(year), Some(time)) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return out;
    };
    let text = format!("{day}/{month}/{year}:{time} +0000");
    let len = text.len().min(out.len());
    out[..len].copy_from_slice(&text.as_bytes()[..len]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

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
            assert_eq!(
                basic_user(header).as_deref(),
                *want,
                "{:?}",
                String::from_utf8_lossy(header)
            );
        }
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
            let mut out = String::new();
            escape(&mut out, raw);
            assert_eq!(out, *want);
        }
    }

    #[test]
    fn time_local_has_nginx_shape() {
        assert_eq!(
            &local_from_http_date("Thu, 26 Nov 2026 21:46:28 GMT"),
            b"26/Nov/2026:21:46:28 +0000"
        );
        assert_eq!(&local_from_http_date("garbage"), &[b'-'; 26]);
        let now = time_local();
        assert_eq!(now.len(), 26, "{now}");
        assert!(now.ends_with(" +0000"), "{now}");
    }

    #[test]
    fn seconds_have_millisecond_resolution() {
        for (d, want) in [
            (Duration::ZERO, "0.000"),
            (Duration::from_micros(1_500), "0.001"),
            (Duration::from_millis(12_345), "12.345"),
        ] {
            assert_eq!(seconds(d), want);
        }
    }
}
