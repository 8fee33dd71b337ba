//! CORS (`enable-cors`), as ingress-nginx's `CORS` template does it: after access, before the
//! redirects.
//!
//! ```text
//!   Origin allowed by the route's policy?  no ─> nothing (OPTIONS goes upstream like any request)
//!     OPTIONS ─> 204 from the proxy: the CORS headers, Content-Type text/plain, no body
//!     other   ─> forwarded; the CORS headers replace the upstream's own in the response
//! ```

use http::{HeaderName, HeaderValue, header};

use super::RequestHeaders;
use crate::snapshot::annotations::cors::Cors;

/// Headers the proxy sets on a response, replacing the upstream's of the same name.
pub(crate) type SetHeaders = Vec<(HeaderName, HeaderValue)>;

/// What CORS makes of a request.
pub(crate) enum Verdict {
    /// Not a CORS request for this route.
    None,
    /// Answer 204 with these headers.
    Preflight(SetHeaders),
    /// Forward, and set these on the response.
    Headers(SetHeaders),
}

/// The verdict for a request with `method` and `headers` on a route with `cors`.
pub(crate) fn check(cors: Option<&Cors>, method: &str, headers: &dyn RequestHeaders) -> Verdict {
    let Some(cors) = cors else {
        return Verdict::None;
    };
    let Some(origin) = cors.allow_origin(headers.header("origin")) else {
        return Verdict::None;
    };
    let origin = if origin == b"*" {
        HeaderValue::from_static("*")
    } else {
        match HeaderValue::from_bytes(origin) {
            Ok(origin) => origin,
            Err(_) => return Verdict::None,
        }
    };
    // The rest was made with the snapshot; a clone shares its bytes.
    let mut set: SetHeaders = Vec::with_capacity(1 + cors.fixed.len());
    set.push((header::ACCESS_CONTROL_ALLOW_ORIGIN, origin));
    set.extend(cors.fixed.iter().cloned());
    if method == "OPTIONS" {
        Verdict::Preflight(set)
    } else {
        Verdict::Headers(set)
    }
}
