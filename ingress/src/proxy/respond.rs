//! Responses the proxy makes itself. Short plain-text bodies: a person with curl should see
//! what happened, and a browser should not get an HTML page that looks like an application's.

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use http_body_util::{Either, Full};

use super::ProxyBody;

pub fn status(code: StatusCode) -> Response<ProxyBody> {
    let body = Bytes::from(status_text(code));
    let mut response = Response::new(Either::Right(Either::Right(Full::new(body))));
    *response.status_mut() = code;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

/// The error backend's page (`custom-http-errors`): its status, `Content-Type` and body.
pub(crate) fn page(page: crate::proxy::phase::error_page::Page) -> Response<ProxyBody> {
    // A HEAD page has no body but says the length the backend announced, if it did.
    let announced = page
        .length
        .filter(|length| *length != page.body.len() as u64);
    let mut response = Response::new(Either::Right(Either::Right(Full::new(page.body))));
    *response.status_mut() = page.status;
    if let Some(length) = announced {
        response
            .headers_mut()
            .insert(header::CONTENT_LENGTH, HeaderValue::from(length));
    }
    if let Some(content_type) = page.content_type {
        response
            .headers_mut()
            .insert(header::CONTENT_TYPE, content_type);
    }
    response
}

/// The body of a response the proxy makes itself: the code and its reason.
pub fn status_text(code: StatusCode) -> String {
    let reason = code.canonical_reason().unwrap_or("");
    format!("{} {reason}\n", code.as_u16())
}

/// A CORS preflight answered by the proxy: 204, no body, the CORS headers.
pub fn preflight(headers: Vec<(http::HeaderName, HeaderValue)>) -> Response<ProxyBody> {
    let mut response = Response::new(Either::Right(Either::Right(Full::new(Bytes::new()))));
    *response.status_mut() = StatusCode::NO_CONTENT;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    for (name, value) in headers {
        response.headers_mut().insert(name, value);
    }
    response
}

/// A request turned away by authentication: its status (or redirect) with its headers
/// (`WWW-Authenticate`, `Set-Cookie`), appended so that several cookies all arrive.
pub(crate) fn denial(denial: crate::proxy::phase::Denial) -> Response<ProxyBody> {
    let mut response = match &denial.location {
        Some(location) => redirect(denial.status, location),
        None => status(denial.status),
    };
    for (name, value) in denial.headers {
        response.headers_mut().append(name, value);
    }
    response
}

/// A redirect with `code`: 308 for `ssl-redirect` (keeps the method and body, as ingress-nginx
/// sends), 302 for `app-root`, the annotation's code for the redirect annotations.
pub fn redirect(code: StatusCode, location: &str) -> Response<ProxyBody> {
    let mut response = status(code);
    match HeaderValue::from_str(location) {
        Ok(v) => {
            response.headers_mut().insert(header::LOCATION, v);
            response
        }
        Err(_) => status(StatusCode::BAD_REQUEST),
    }
}

/// Whether a request is gRPC (`content-type: application/grpc`, `+proto`, `+json`, …): its
/// client reads `grpc-status`, not the HTTP status.
pub fn is_grpc(headers: &http::HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"))
}

/// An error the proxy makes itself for a gRPC request, in the form gRPC clients read (a
/// trailers-only response, as Envoy sends): HTTP 200, `grpc-status` and `grpc-message`. The
/// code follows the HTTP status the request would have had (gRPC's HTTP-to-status mapping),
/// except that the proxy's own timeouts are DEADLINE_EXCEEDED.
pub fn grpc_error(code: StatusCode, message: &str) -> Response<ProxyBody> {
    let status = grpc_status(code);
    let mut response = Response::new(Either::Right(Either::Right(Full::new(Bytes::new()))));
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    headers.insert("grpc-status", HeaderValue::from(status));
    // grpc-message is percent-encoded (gRPC over HTTP/2, "Responses").
    let encoded: String = message
        .bytes()
        .map(|b| {
            if (0x20..0x7f).contains(&b) && b != b'%' {
                char::from(b).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect();
    if let Ok(value) = HeaderValue::from_str(&encoded) {
        headers.insert("grpc-message", value);
    }
    response
}

/// The client's deadline, `grpc-timeout` (1–8 digits and a unit: `H`, `M`, `S`, `m`, `u`,
/// `n`); `None` when absent or malformed.
pub fn grpc_timeout(headers: &http::HeaderMap) -> Option<std::time::Duration> {
    use std::time::Duration;
    let value = headers.get("grpc-timeout")?.to_str().ok()?;
    let split = value.len().checked_sub(1)?;
    let (digits, unit) = value.split_at(split);
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n.checked_mul(3600)?),
        "M" => Duration::from_secs(n.checked_mul(60)?),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

/// gRPC's status for an HTTP status the proxy would have answered with.
pub fn grpc_status(code: StatusCode) -> u16 {
    match code.as_u16() {
        400 => 13,             // INTERNAL
        401 => 16,             // UNAUTHENTICATED
        403 => 7,              // PERMISSION_DENIED
        404 => 12,             // UNIMPLEMENTED
        408 | 504 => 4,        // DEADLINE_EXCEEDED (the proxy's own timeouts)
        429 | 502 | 503 => 14, // UNAVAILABLE
        _ => 2,                // UNKNOWN
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_errors_are_trailers_only_with_the_mapped_status() {
        let cases = [
            (StatusCode::BAD_GATEWAY, "14"),
            (StatusCode::SERVICE_UNAVAILABLE, "14"),
            (StatusCode::GATEWAY_TIMEOUT, "4"),
            (StatusCode::NOT_FOUND, "12"),
            (StatusCode::BAD_REQUEST, "13"),
            (StatusCode::IM_A_TEAPOT, "2"),
        ];
        for (code, want) in cases {
            let response = grpc_error(code, "upstream: 100% broken\n");
            assert_eq!(response.status(), StatusCode::OK);
            let h = response.headers();
            assert_eq!(h["grpc-status"], want, "{code}");
            assert_eq!(h["content-type"], "application/grpc");
            assert_eq!(h["grpc-message"], "upstream: 100%25 broken%0A");
        }
    }

    #[test]
    fn grpc_timeouts() {
        use std::time::Duration;
        let cases = [
            ("1S", Some(Duration::from_secs(1))),
            ("250m", Some(Duration::from_millis(250))),
            ("2H", Some(Duration::from_secs(7200))),
            ("3M", Some(Duration::from_secs(180))),
            ("10u", Some(Duration::from_micros(10))),
            ("99999999n", Some(Duration::from_nanos(99_999_999))),
            ("123456789S", None),
            ("S", None),
            ("1s", None),
            ("-1S", None),
            ("", None),
        ];
        for (value, want) in cases {
            let mut h = http::HeaderMap::new();
            if let Ok(v) = HeaderValue::from_str(value) {
                h.insert("grpc-timeout", v);
            }
            assert_eq!(grpc_timeout(&h), want, "{value:?}");
        }
    }

    #[test]
    fn grpc_requests_by_content_type() {
        let with = |ct: &str| {
            let mut h = http::HeaderMap::new();
            h.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_str(ct).unwrap_or(HeaderValue::from_static("x")),
            );
            is_grpc(&h)
        };
        assert!(with("application/grpc"));
        assert!(with("application/grpc+proto"));
        assert!(!with("application/json"));
        assert!(!is_grpc(&http::HeaderMap::new()));
    }
}
