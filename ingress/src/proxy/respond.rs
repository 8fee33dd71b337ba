//! Responses the proxy makes itself. Short plain-text bodies: a person with curl should see
//! what happened, and a browser should not get an HTML page that looks like an application's.

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use http_body_util::{Either, Full};

use super::ProxyBody;

pub fn status(code: StatusCode) -> Response<ProxyBody> {
    let body = Bytes::from(status_text(code));
    let mut response = Response::new(Either::Right(Full::new(body)));
    *response.status_mut() = code;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

/// The body of a response the proxy makes itself: the code and its reason.
pub fn status_text(code: StatusCode) -> String {
    let reason = code.canonical_reason().unwrap_or("");
    format!("{} {reason}\n", code.as_u16())
}

/// A CORS preflight answered by the proxy: 204, no body, the CORS headers.
pub fn preflight(headers: Vec<(http::HeaderName, HeaderValue)>) -> Response<ProxyBody> {
    let mut response = Response::new(Either::Right(Full::new(Bytes::new())));
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
