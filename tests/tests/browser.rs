//! A real browser (Debian's Chromium, headless) through the real binary, for what only a
//! browser decides: whether a cross-origin `fetch` with a custom header gets past the CORS
//! preflight the proxy answers (and is refused for an origin that is not allowed), and whether
//! the affinity cookie the proxy sets is stored and sent back, keeping a session on one
//! endpoint.
//!
//! ```text
//!   chromium (host-resolver: *.test → 127.0.0.1) ── http://app.test:<port>/  the page (a test server)
//!        page JS ── fetch ──> api.test (enable-cors)      ── echo backends
//!                  └─ fetch ──> app.test/who (affinity)   ── echo backends a, b
//! ```

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::convert::Infallible;
use std::process::Command;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use ingress_tests::manifests::{annotated_ingress, service, service_at};
use ingress_tests::preflight::preflight_tool;
use ingress_tests::process::Ingress;
use ingress_tests::scratch::Scratch;
use ingress_tests::upstream::Backend;

/// A server that answers every request with one HTML page.
struct Page {
    addr: std::net::SocketAddr,
    _thread: std::thread::JoinHandle<()>,
}

impl Page {
    fn start(html: String) -> Page {
        let listener = ingress_tests::ports::listen_loopback();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let html: Arc<str> = html.into();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                while let Ok((stream, _)) = listener.accept().await {
                    let html = html.clone();
                    tokio::spawn(async move {
                        let service = service_fn(move |_: Request<hyper::body::Incoming>| {
                            let html = html.clone();
                            async move {
                                let mut response =
                                    Response::new(Full::new(Bytes::from(html.to_string())));
                                response.headers_mut().insert(
                                    "content-type",
                                    "text/html; charset=utf-8".parse().unwrap(),
                                );
                                Ok::<_, Infallible>(response)
                            }
                        });
                        let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                            .serve_connection(TokioIo::new(stream), service)
                            .await;
                    });
                }
            });
        });
        Page {
            addr,
            _thread: thread,
        }
    }
}

/// The page's `<title>` once its script has run: Chromium's DOM after the load, with virtual
/// time to let the fetches finish.
fn title_after_scripts(ingress: &Ingress, dir: &Scratch, url_path: &str) -> String {
    let profile = dir
        .path()
        .join(format!("profile-{}", url_path.replace('/', "")));
    let out = Command::new("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--virtual-time-budget=10000",
            "--host-resolver-rules=MAP *.test 127.0.0.1",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg("--dump-dom")
        .arg(format!("http://app.test:{}{url_path}", ingress.http.port()))
        .output()
        .expect("run chromium");
    let dom = String::from_utf8_lossy(&out.stdout).into_owned();
    dom.split_once("<title>")
        .and_then(|(_, rest)| rest.split_once("</title>"))
        .map(|(title, _)| title.to_string())
        .unwrap_or_else(|| {
            panic!(
                "no title in the DOM:\n{dom}\n{}",
                String::from_utf8_lossy(&out.stderr)
            )
        })
}

const SCRIPT: &str = r#"<!doctype html><html><head><title>pending</title></head><body><script>
async function run() {
  const port = location.port;
  const results = [];
  // Allowed origin, a method and a header that need a preflight.
  try {
    const r = await fetch(`http://api.test:${port}/data`, {method: "PUT", headers: {"X-Custom": "1"}});
    const j = await r.json();
    results.push("cors:" + r.status + ":" + j.backend + ":" + j.method);
  } catch (e) { results.push("cors:blocked"); }
  // The same from a route whose allow-list does not hold this page's origin.
  try {
    await fetch(`http://other-api.test:${port}/data`, {method: "PUT", headers: {"X-Custom": "1"}});
    results.push("other:allowed");
  } catch (e) { results.push("other:blocked"); }
  // Same origin, five times: the affinity cookie keeps one endpoint.
  const seen = [];
  for (let i = 0; i < 5; i++) {
    const r = await fetch("/who", {cache: "no-store"});
    seen.push((await r.json()).backend);
  }
  results.push("sticky:" + seen.join(","));
  results.push("cookie:" + (document.cookie.includes("route=") ? "script-visible" : "httponly"));
  document.title = results.join(" ");
}
run();
</script></body></html>"#;

#[test]
fn a_browser_passes_the_preflight_and_keeps_its_session() {
    if !preflight_tool("chromium") {
        return;
    }
    let (a, b, api, other) = (
        Backend::start("a"),
        Backend::start("b"),
        Backend::start("api"),
        Backend::start("other"),
    );
    let dir = Scratch::new("browser");
    let ingress_port_placeholder = "PORT";
    let page = Page::start(SCRIPT.to_string());
    let manifests = [
        service_at("web", "page", &[page.addr]),
        service("web", "pair", &[&a, &b]),
        service("web", "api", &[&api]),
        service("web", "other", &[&other]),
        annotated_ingress(
            "web",
            "page",
            1,
            &[],
            &[("app.test", "/", "Prefix", "page")],
        ),
        annotated_ingress(
            "web",
            "who",
            2,
            &[("affinity", "cookie"), ("session-cookie-name", "route")],
            &[("app.test", "/who", "Prefix", "pair")],
        ),
        annotated_ingress(
            "web",
            "api",
            3,
            &[
                ("enable-cors", "true"),
                (
                    "cors-allow-origin",
                    &format!("http://app.test:{ingress_port_placeholder}"),
                ),
                ("cors-allow-methods", "GET, PUT"),
                ("cors-allow-headers", "X-Custom"),
            ],
            &[("api.test", "/", "Prefix", "api")],
        ),
        annotated_ingress(
            "web",
            "other-api",
            4,
            &[
                ("enable-cors", "true"),
                ("cors-allow-origin", "https://elsewhere.example"),
                ("cors-allow-headers", "X-Custom"),
            ],
            &[("other-api.test", "/", "Prefix", "other")],
        ),
    ]
    .concat();
    // The origin names the proxy's port, known once it has one: written before start with
    // the port the builder will use.
    let ports = ingress_tests::process::Ports {
        http: ingress_tests::ports::free_port(),
        https: ingress_tests::ports::free_port(),
        admin: ingress_tests::ports::free_port(),
    };
    dir.write(
        "all.yaml",
        &manifests.replace(ingress_port_placeholder, &ports.http.to_string()),
    );
    let ingress = Ingress::builder()
        .manifests(dir.path())
        .ports(ports)
        .start();
    let title = title_after_scripts(&ingress, &dir, "/");
    let parts: Vec<&str> = title.split(' ').collect();
    assert_eq!(parts.first().copied(), Some("cors:200:api:PUT"), "{title}");
    assert_eq!(parts.get(1).copied(), Some("other:blocked"), "{title}");
    let sticky = parts
        .get(2)
        .and_then(|p| p.strip_prefix("sticky:"))
        .unwrap_or_else(|| panic!("{title}"));
    let backends: Vec<&str> = sticky.split(',').collect();
    assert_eq!(backends.len(), 5, "{title}");
    assert!(
        backends.iter().all(|b| *b == backends[0]) && ["a", "b"].contains(&backends[0]),
        "one endpoint for the session: {title}"
    );
    // HttpOnly: the page's script cannot read the session cookie.
    assert_eq!(parts.get(3).copied(), Some("cookie:httponly"), "{title}");
    // The preflight was the proxy's: the api backend saw the PUT only. The other route's
    // preflight, from an origin it does not allow, was forwarded (as ingress-nginx does), got
    // no CORS headers, and the browser never sent the PUT.
    assert_eq!(api.served(), 1, "{title}");
    assert_eq!(other.served(), 1, "{title}");
}
