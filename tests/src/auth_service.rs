//! An auth service for `auth-url` tests: a real HTTP/1.1 server (the scripted upstream) that
//! records every subrequest and answers by the path it is asked for, so an Ingress picks the
//! behaviour with its `auth-url`.
//!
//! ```text
//!   /ok          200  X-Auth-Request-User: alice, X-Auth-Request-Email, Authorization: Bearer
//!                     from-auth, Set-Cookie: session=fresh
//!   /deny        401  WWW-Authenticate: Bearer realm="auth", Set-Cookie: csrf=1
//!   /forbid      403
//!   /broken      500
//!   /moved       302  (neither 2xx, 401 nor 403: an error)
//!   /slow        200 after 3 s
//!   /count       200  X-Auth-Request-User: <how many checks so far>
//!   /oauth2/auth 200 (X-Auth-Request-User: alice) with the cookie _oauth2_proxy=good, else 401
//!   /close       the connection closes without an answer
//! ```

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::scripted::{Answer, Scripted, Seen};

pub struct AuthService {
    pub addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    server: Scripted,
}

impl AuthService {
    pub fn start() -> AuthService {
        let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let counted = Arc::new(AtomicUsize::new(0));
        let record = seen.clone();
        let server = Scripted::start(move |request| {
            record.lock().unwrap().push(request.clone());
            let path = request.path.split('?').next().unwrap_or_default();
            match path {
                "/ok" => Answer::Bytes(response(
                    "200 OK",
                    &[
                        ("X-Auth-Request-User", "alice"),
                        ("X-Auth-Request-Email", "alice@example.com"),
                        ("Authorization", "Bearer from-auth"),
                        ("Set-Cookie", "session=fresh; Path=/"),
                    ],
                )),
                "/deny" => Answer::Bytes(response(
                    "401 Unauthorized",
                    &[
                        ("WWW-Authenticate", "Bearer realm=\"auth\""),
                        ("Set-Cookie", "csrf=1; Path=/"),
                    ],
                )),
                "/forbid" => Answer::Bytes(response("403 Forbidden", &[])),
                "/broken" => Answer::Bytes(response("500 Internal Server Error", &[])),
                "/moved" => Answer::Bytes(response("302 Found", &[("Location", "/elsewhere")])),
                "/slow" => {
                    std::thread::sleep(Duration::from_secs(3));
                    Answer::Bytes(response("200 OK", &[("X-Auth-Request-User", "late")]))
                }
                "/count" => {
                    let n = counted.fetch_add(1, Ordering::SeqCst) + 1;
                    Answer::Bytes(response(
                        "200 OK",
                        &[("X-Auth-Request-User", &n.to_string())],
                    ))
                }
                "/oauth2/auth" => {
                    let signed_in = request
                        .header("cookie")
                        .is_some_and(|c| c.split(';').any(|c| c.trim() == "_oauth2_proxy=good"));
                    if signed_in {
                        Answer::Bytes(response(
                            "202 Accepted",
                            &[
                                ("X-Auth-Request-User", "alice"),
                                ("X-Auth-Request-Email", "alice@example.com"),
                            ],
                        ))
                    } else {
                        Answer::Bytes(response("401 Unauthorized", &[]))
                    }
                }
                "/close" => Answer::Close,
                _ => Answer::Bytes(response("404 Not Found", &[])),
            }
        });
        AuthService {
            addr: server.addr,
            seen,
            server,
        }
    }

    /// `http://<addr><path>`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Every subrequest so far, in order.
    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// Subrequests so far.
    pub fn requests(&self) -> usize {
        self.server.requests()
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> usize {
        self.server.connections()
    }
}

/// A response with `status`, `headers` and a short body.
fn response(status: &str, headers: &[(&str, &str)]) -> Vec<u8> {
    let body = "auth service body\n";
    let mut out = format!("HTTP/1.1 {status}\r\nContent-Length: {}\r\n", body.len());
    for (name, value) in headers {
        out.push_str(&format!("{name}: {value}\r\n"));
    }
    out.push_str("\r\n");
    out.push_str(body);
    out.into_bytes()
}
