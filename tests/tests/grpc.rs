//! gRPC through the real binary, with a real gRPC stack on both sides (Python grpcio, from
//! `tests/grpc/peer.py`; `cargo xtask setup` installs it): unary, server-, client- and
//! bidirectional streaming with trailers, a status from the server, a client deadline, over h2c
//! to a `GRPC` backend and over TLS (ALPN h2) to the proxy and on to a `GRPCS` backend. The
//! proxy's own errors are gRPC-shaped: an upstream that is down or a Service without endpoints
//! is UNAVAILABLE with a `grpc-message`, and a gRPC server that never sends trailers is an
//! error, not a success. Other routes are untouched.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ingress_tests::manifests::service_at;
use ingress_tests::pki::{Ca, secret_yaml};
use ingress_tests::process::Ingress;
use ingress_tests::scratch::Scratch;
use ingress_tests::upstream::Backend;
use serde_json::Value;

fn peer_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("grpc")
        .join("peer.py")
}

/// `python3 peer.py serve`: a grpcio server on loopback, stopped when dropped.
struct GrpcServer {
    child: Child,
    port: u16,
}

impl GrpcServer {
    fn start(tls: Option<(&Path, &Path)>) -> GrpcServer {
        let mut cmd = Command::new("python3");
        cmd.arg(peer_script()).arg("serve");
        if let Some((cert, key)) = tls {
            cmd.arg("--tls").arg(cert).arg(key);
        }
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3 runs (grpcio: cargo xtask setup)");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("the server prints its port");
        let port = line.trim().parse().unwrap_or_else(|_| {
            panic!("no port from the gRPC server ({line:?}); is grpcio installed?")
        });
        GrpcServer { child, port }
    }

    fn addr(&self) -> std::net::SocketAddr {
        std::net::SocketAddr::from(([127, 0, 0, 1], self.port))
    }
}

impl Drop for GrpcServer {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs every call of `peer.py call` against `target` with `:authority` `authority`.
async fn calls(target: &str, authority: &str, ca: Option<&Path>) -> Value {
    let mut cmd = tokio::process::Command::new("python3");
    cmd.arg(peer_script()).args(["call", target, authority]);
    if let Some(ca) = ca {
        cmd.arg("--ca").arg(ca);
    }
    let out = tokio::time::timeout(Duration::from_secs(60), cmd.output())
        .await
        .expect("the gRPC client finished in time")
        .expect("python3 runs");
    let text = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(text.trim()).unwrap_or_else(|e| {
        panic!(
            "client output {text:?} ({e}); stderr: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// The whole gRPC scenario's expectations.
fn assert_all_calls(got: &Value, what: &str) {
    let ctx = || format!("{what}: {got:#}");
    assert_eq!(got["unary"]["reply"], "hello", "{}", ctx());
    assert_eq!(got["unary"]["trailers"]["x-trailer"], "unary", "{}", ctx());
    assert_eq!(got["unary_fail"]["code"], "NOT_FOUND", "{}", ctx());
    assert_eq!(got["unary_fail"]["details"], "no such thing", "{}", ctx());
    assert_eq!(
        got["unary_fail"]["trailers"]["x-trailer"],
        "unary",
        "{}",
        ctx()
    );
    assert_eq!(got["server_stream"]["count"], 50, "{}", ctx());
    assert_eq!(got["server_stream"]["last"], "item-49", "{}", ctx());
    assert_eq!(
        got["server_stream"]["trailers"]["x-trailer"],
        "stream",
        "{}",
        ctx()
    );
    assert_eq!(got["client_stream"], "200", "{}", ctx());
    assert_eq!(got["bidi"]["count"], 20, "{}", ctx());
    assert_eq!(got["bidi"]["last"], "m19", "{}", ctx());
    assert_eq!(got["deadline"]["code"], "DEADLINE_EXCEEDED", "{}", ctx());
}

fn ingress_yaml(name: &str, host: &str, service: &str, protocol: &str, tls: bool) -> String {
    let tls = if tls {
        format!("  tls:\n  - hosts: [{host}]\n    secretName: front\n")
    } else {
        String::new()
    };
    format!(
        "---\napiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata:\n  name: {name}\n  namespace: t\n  annotations:\n    nginx.ingress.kubernetes.io/backend-protocol: \"{protocol}\"\n    nginx.ingress.kubernetes.io/ssl-redirect: \"false\"\nspec:\n  ingressClassName: ingress\n{tls}  rules:\n  - host: {host}\n    http:\n      paths:\n      - {{path: /, pathType: Prefix, backend: {{service: {{name: {service}, port: {{number: 80}}}}}}}}\n"
    )
}

async fn wait_for_route(ingress: &Ingress, host: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !ingress.admin_get("/routes").1.contains(host) {
        assert!(Instant::now() < deadline, "{host} never routed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A plaintext HTTP/2 server that never answers any stream, and ignores `grpc-timeout`.
async fn silent_server() -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let Ok(mut conn) = h2::server::handshake(stream).await else {
                    return;
                };
                let mut held = Vec::new();
                while let Some(Ok(stream)) = conn.accept().await {
                    held.push(stream);
                }
            });
        }
    });
    addr
}

/// A plaintext HTTP/2 server that answers every stream with headers and data but never sends
/// trailers, then resets the stream: a gRPC server that breaks the protocol.
async fn no_trailers_server() -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let Ok(mut conn) = h2::server::handshake(stream).await else {
                    return;
                };
                while let Some(Ok((_req, mut respond))) = conn.accept().await {
                    let response = http::Response::builder()
                        .header("content-type", "application/grpc")
                        .body(())
                        .expect("response");
                    if let Ok(mut send) = respond.send_response(response, false) {
                        let _ = send.send_data(bytes::Bytes::from_static(b"\0\0\0\0\x01x"), false);
                        send.send_reset(h2::Reason::INTERNAL_ERROR);
                    }
                }
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread")]
async fn grpc_over_h2c_and_tls_with_grpc_shaped_errors() {
    let dir = Scratch::new("grpc");
    let ca = Ca::new("grpc CA");
    let front = ca.server("grpcs.example", &["grpcs.example"]);
    let back = ca.server("back", &["back.t.svc"]);
    let cert = dir.write("back.crt", &back.chain);
    let key = dir.write("back.key", &back.key);
    let ca_file = dir.write("ca.crt", &ca.pem);

    let plain = GrpcServer::start(None);
    let secure = GrpcServer::start(Some((&cert, &key)));
    let broken = no_trailers_server().await;
    let silent = silent_server().await;
    let web = Backend::start("web");
    // A port nothing listens on: bound, then closed.
    let down = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr")
    };

    let mut yaml = String::new();
    yaml += &service_at("t", "plain", &[plain.addr()]);
    yaml += &service_at("t", "secure", &[secure.addr()]);
    yaml += &service_at("t", "broken", &[broken]);
    yaml += &service_at("t", "silent", &[silent]);
    yaml += &service_at("t", "down", &[down]);
    yaml += &service_at("t", "empty", &[]);
    yaml += &service_at("t", "web", &[web.addr]);
    yaml += &secret_yaml("t", "front", &front.chain, &front.key);
    yaml += &ingress_yaml("plain", "grpc.example", "plain", "GRPC", false);
    yaml += &ingress_yaml("secure", "grpcs.example", "secure", "GRPCS", true);
    yaml += &ingress_yaml("broken", "broken.example", "broken", "GRPC", false);
    yaml += &ingress_yaml("silent", "silent.example", "silent", "GRPC", false);
    yaml += &ingress_yaml("down", "down.example", "down", "GRPC", false);
    yaml += &ingress_yaml("empty", "empty.example", "empty", "GRPC", false);
    yaml += &ingress_yaml("web", "web.example", "web", "HTTP", false);
    dir.write("grpc.yaml", &yaml);
    let ingress = Ingress::builder().manifests(dir.path()).start();
    wait_for_route(&ingress, "web.example").await;

    // h2c client → h2c upstream.
    let got = calls(&ingress.http.to_string(), "grpc.example", None).await;
    assert_all_calls(&got, "h2c");
    // TLS client (ALPN h2) → TLS upstream (ALPN h2, verification off as by default).
    let got = calls(
        &format!("localhost:{}", ingress.https.port()),
        "grpcs.example",
        Some(&ca_file),
    )
    .await;
    assert_all_calls(&got, "tls");
    // The proxy itself gives up at the client's deadline (grpc-timeout), in gRPC form: curl
    // waits 10 s, the upstream never answers (and ignores grpc-timeout), the deadline is
    // 300 ms.
    let started = Instant::now();
    let frame = dir.write("frame.bin", "\0\0\0\0\x01x");
    let out = tokio::process::Command::new("curl")
        .args([
            "-s",
            "-o",
            "/dev/null",
            "-D",
            "-",
            "--max-time",
            "10",
            "--http2-prior-knowledge",
        ])
        .args(["-H", "content-type: application/grpc", "-H", "te: trailers"])
        .args(["-H", "grpc-timeout: 300m", "-H", "host: silent.example"])
        .arg("--data-binary")
        .arg(format!("@{}", frame.display()))
        .arg(format!("http://{}/test.Echo/Slow", ingress.http))
        .output()
        .await
        .expect("curl runs");
    let head = String::from_utf8_lossy(&out.stdout).to_ascii_lowercase();
    assert!(
        started.elapsed() < Duration::from_millis(2900),
        "{:?}",
        started.elapsed()
    );
    assert!(head.starts_with("http/2 200"), "{head}");
    assert!(head.contains("grpc-status: 4"), "{head}");
    assert!(
        head.contains("grpc-message: no response headers within"),
        "{head}"
    );

    // Errors the proxy makes: gRPC-shaped, UNAVAILABLE, with a message.
    for host in ["down.example", "empty.example"] {
        let got = calls(&ingress.http.to_string(), host, None).await;
        assert_eq!(got["unary"]["code"], "UNAVAILABLE", "{host}: {got:#}");
        let details = got["unary"]["details"].as_str().unwrap_or("");
        assert!(
            details.contains("connect") || details.contains("no ready endpoints"),
            "{host}: {got:#}"
        );
    }
    // A server that never sends trailers: a failed call, never OK.
    let got = calls(&ingress.http.to_string(), "broken.example", None).await;
    assert!(got["unary"]["code"].is_string(), "{got:#}");
    assert_ne!(got["unary"]["code"], "OK", "{got:#}");

    // HTTP/1.1 to an HTTP/2-only route: a clear 502, counted as a protocol error.
    let (status, _) = ingress_tests::client::blocking_get(ingress.http, "/", "grpc.example");
    assert_eq!(status, 502);
    assert!(
        ingress
            .metric("ingress_upstream_errors_total", &[("kind", "protocol")])
            .unwrap_or(0.0)
            >= 1.0
    );

    // Other routes are untouched.
    let (status, body) = ingress_tests::client::blocking_get(ingress.http, "/", "web.example");
    assert_eq!(status, 200, "{body}");
}
