//! `--use-proxy-protocol` through the real binary on loopback: the client a PROXY protocol
//! header names (v1 text or v2 binary, sent as exact bytes, and by Debian's haproxy with
//! `send-proxy-v2` in front, as a cloud load balancer sends it) is the client the backend is
//! told about and the client source ranges judge, on HTTP and HTTPS; a connection without a
//! valid header is closed and counted. The kernel gate's side is in gate_proxy_protocol.rs.
//!
//! ```text
//!   test client ──"PROXY TCP4 203.0.113.9 …"──> haproxy (accept-proxy) ──v2──> ingress :http/:https
//!   test client ──"PROXY …" or v2 bytes──────────────────────────────────────> ingress
//! ```

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::process::Stdio;
use std::time::{Duration, Instant};

use ingress_tests::manifests::service;
use ingress_tests::pki::{Ca, secret_yaml};
use ingress_tests::ports::free_port;
use ingress_tests::preflight::preflight_tool;
use ingress_tests::process::Ingress;
use ingress_tests::scratch::Scratch;
use ingress_tests::tls_client::{Clients, Outcome, https_get};
use ingress_tests::upstream::{Backend, Echo};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const WAIT: Duration = Duration::from_secs(5);

/// `open.test` serves anyone; `ranged.test` (with TLS) only 203.0.113.0/24.
fn manifests(dir: &Scratch, web: &Backend, ca: &Ca) {
    let leaf = ca.server("ranged", &["ranged.test", "open.test"]);
    let ingress = |name: &str, host: &str, annotations: &str, tls: bool| {
        let tls = if tls {
            format!("  tls: [{{hosts: [{host}], secretName: site-tls}}]\n")
        } else {
            String::new()
        };
        format!(
            "---\napiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {{name: {name}, namespace: t, annotations: {{{annotations}}}}}\nspec:\n  ingressClassName: ingress\n{tls}  rules:\n  - host: {host}\n    http: {{paths: [{{path: /, pathType: Prefix, backend: {{service: {{name: web, port: {{number: 80}}}}}}}}]}}\n"
        )
    };
    dir.write(
        "site.yaml",
        &(service("t", "web", &[web])
            + &secret_yaml("t", "site-tls", &leaf.chain, &leaf.key)
            + &ingress("open", "open.test", "", false)
            + &ingress(
                "ranged",
                "ranged.test",
                "nginx.ingress.kubernetes.io/allowlist-source-range: \"203.0.113.0/24\", nginx.ingress.kubernetes.io/ssl-redirect: \"false\"",
                true,
            )),
    );
}

fn v1(client: &str, port: u16) -> Vec<u8> {
    format!("PROXY TCP4 {client} 127.0.0.1 40000 {port}\r\n").into_bytes()
}

/// A v2 `PROXY` header for a TCP over IPv4 connection from `client`.
fn v2(client: [u8; 4], port: u16) -> Vec<u8> {
    let mut out = b"\r\n\r\n\0\r\nQUIT\n".to_vec();
    out.extend_from_slice(&[0x21, 0x11, 0x00, 0x0c]);
    out.extend_from_slice(&client);
    out.extend_from_slice(&[127, 0, 0, 1]);
    out.extend_from_slice(&40000u16.to_be_bytes());
    out.extend_from_slice(&port.to_be_bytes());
    out
}

/// Sends `prefix` then a GET for `host`: the status and, when a backend answered, what it saw.
async fn get(to: SocketAddr, prefix: &[u8], host: &str) -> (String, Option<Echo>) {
    let mut stream = TcpStream::connect(to).await.unwrap();
    let request = format!("GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    stream
        .write_all(&[prefix, request.as_bytes()].concat())
        .await
        .unwrap();
    let mut response = Vec::new();
    let _ = tokio::time::timeout(WAIT, stream.read_to_end(&mut response)).await;
    let text = String::from_utf8_lossy(&response).into_owned();
    let status = text.get(9..12).unwrap_or("closed").to_string();
    let echo = text
        .split_once("\r\n\r\n")
        .and_then(|(_, body)| serde_json::from_str::<Echo>(body).ok());
    (status, echo)
}

fn forwarded_for(echo: &Option<Echo>) -> (Option<&str>, Option<&str>) {
    let header = |name: &str| {
        echo.as_ref()
            .and_then(|e| e.headers.get(name))
            .map(String::as_str)
    };
    (header("x-forwarded-for"), header("x-real-ip"))
}

#[tokio::test(flavor = "multi_thread")]
async fn the_client_a_proxy_header_names_is_the_client() {
    let web = Backend::start("web");
    let ca = Ca::new("proxy protocol test CA");
    let dir = Scratch::new("proxy-protocol");
    manifests(&dir, &web, &ca);
    // --mode auto: the kernel gate, where it loads, judges the ClientHello behind the header
    // (gate_proxy_protocol.rs tests that path in a network namespace).
    let ingress = Ingress::builder()
        .manifests(dir.path())
        .auto_mode()
        .args([
            "--use-proxy-protocol",
            "--proxy-protocol-header-timeout",
            "1s",
        ])
        .start();

    // Exact bytes, both versions: the backend is told the named client, and source ranges
    // judge it.
    let (status, echo) = get(ingress.http, &v1("203.0.113.9", 80), "open.test").await;
    assert_eq!(status, "200");
    assert_eq!(
        forwarded_for(&echo),
        (Some("203.0.113.9"), Some("203.0.113.9"))
    );
    let (status, echo) = get(ingress.http, &v2([198, 51, 100, 20], 80), "open.test").await;
    assert_eq!(status, "200");
    assert_eq!(forwarded_for(&echo).0, Some("198.51.100.20"));
    assert_eq!(
        get(ingress.http, &v2([203, 0, 113, 7], 80), "ranged.test")
            .await
            .0,
        "200"
    );
    assert_eq!(
        get(ingress.http, &v1("198.51.100.20", 80), "ranged.test")
            .await
            .0,
        "403"
    );
    // A health check (v2 LOCAL) keeps the TCP peer.
    let local = [
        b"\r\n\r\n\0\r\nQUIT\n".as_slice(),
        &[0x20, 0x00, 0x00, 0x00],
    ]
    .concat();
    let (status, echo) = get(ingress.http, &local, "open.test").await;
    assert_eq!(
        (status.as_str(), forwarded_for(&echo).0),
        ("200", Some("127.0.0.1"))
    );
    // curl's own v1 header over plain HTTP, naming its own address: served where no range
    // applies, refused (403) by ranged.test's allow-list.
    for version in ingress_tests::curl::VERSIONS {
        let haproxy = ["--haproxy-protocol"];
        let open = ingress_tests::curl::get(&ingress, "open.test", "/", version, &haproxy);
        assert_eq!(open.status, 200, "{version}: {open:?}");
        let ranged = ingress_tests::curl::get(&ingress, "ranged.test", "/", version, &haproxy);
        assert_eq!(ranged.status, 403, "{version}: {ranged:?}");
    }

    // No header, a bad one, or one that never finishes: closed without an answer.
    let served = web.served();
    assert_eq!(get(ingress.http, b"", "open.test").await.0, "closed");
    assert_eq!(
        get(
            ingress.http,
            b"PROXY TCP4 203.0.113.999 127.0.0.1 1 2\r\n",
            "open.test"
        )
        .await
        .0,
        "closed"
    );
    let mut silent = TcpStream::connect(ingress.http).await.unwrap();
    silent.write_all(b"PROXY TCP4 203.0.").await.unwrap();
    let started = Instant::now();
    let mut byte = [0u8; 1];
    let read = tokio::time::timeout(WAIT, silent.read(&mut byte)).await;
    assert!(matches!(read, Ok(Ok(0)) | Ok(Err(_))), "{read:?}");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "the header timeout closed it"
    );
    assert_eq!(web.served(), served, "nothing reached the backend");
    for (reason, want) in [("invalid", 2.0), ("timeout", 1.0)] {
        assert_eq!(
            ingress.metric(
                "ingress_proxy_protocol_errors_total",
                &[("listener", "http"), ("reason", reason)]
            ),
            Some(want),
            "{reason}"
        );
    }

    // HTTPS: the header comes before the ClientHello, and the SNI gate judges the client it
    // names by the host's ranges: refused before any handshake, as without PROXY protocol.
    let clients = Clients::new(&ca);
    for (client, want) in [
        ([203, 0, 113, 7], Outcome::Served(200)),
        ([198, 51, 100, 20], Outcome::Reset),
    ] {
        let mut stream = TcpStream::connect(ingress.https).await.unwrap();
        stream.write_all(&v2(client, 443)).await.unwrap();
        let got = https_get(stream, &clients, Some("ranged.test"), "ranged.test").await;
        assert_eq!(got, want, "{client:?}");
    }
    let stream = TcpStream::connect(ingress.https).await.unwrap();
    assert!(
        !matches!(
            https_get(stream, &clients, Some("ranged.test"), "ranged.test").await,
            Outcome::Served(_)
        ),
        "a ClientHello without a header is not served"
    );
}

/// With `proxy-real-ip-cidr`, only a peer inside it is believed (ingress-nginx's
/// `set_real_ip_from`): a header from any other peer is still required, but the peer stays the
/// client, so it can name no address of its choosing to pass a source range or to the backend.
#[tokio::test(flavor = "multi_thread")]
async fn a_proxy_header_from_an_untrusted_peer_is_not_believed() {
    let web = Backend::start("web");
    let ca = Ca::new("proxy protocol trust CA");
    let dir = Scratch::new("proxy-protocol-trust");
    manifests(&dir, &web, &ca);
    for (trusted, want_open, want_ranged) in [
        // The test connects from 127.0.0.1: trusted, the header names the client.
        ("127.0.0.0/8", Some("203.0.113.7"), "200"),
        // Not trusted: the peer stays the client, and the range (203.0.113.0/24) refuses it.
        ("10.0.0.0/8", Some("127.0.0.1"), "403"),
    ] {
        let ingress = Ingress::builder()
            .manifests(dir.path())
            .auto_mode()
            .args(["--use-proxy-protocol", "--proxy-real-ip-cidr", trusted])
            .start();
        let (status, echo) = get(ingress.http, &v2([203, 0, 113, 7], 80), "open.test").await;
        assert_eq!(status, "200", "{trusted}");
        assert_eq!(forwarded_for(&echo).1, want_open, "{trusted}");
        let (status, _) = get(ingress.http, &v2([203, 0, 113, 7], 80), "ranged.test").await;
        assert_eq!(status, want_ranged, "{trusted}");
        // Without a header the connection is still closed: the listener speaks PROXY protocol.
        assert_eq!(get(ingress.http, b"", "open.test").await.0, "closed");
    }
}

/// haproxy in front, as a load balancer: it accepts the test's header (the "real" client) and
/// sends its own v2 header on, over HTTP and HTTPS.
#[tokio::test(flavor = "multi_thread")]
async fn behind_haproxy_send_proxy_v2() {
    if !preflight_tool("haproxy") {
        return;
    }
    let web = Backend::start("web");
    let ca = Ca::new("proxy protocol test CA");
    let dir = Scratch::new("proxy-protocol-haproxy");
    manifests(&dir, &web, &ca);
    let ingress = Ingress::builder()
        .manifests(dir.path())
        .args(["--use-proxy-protocol"])
        .start();
    let (front_http, front_https) = (free_port(), free_port());
    let config = dir.write(
        "haproxy.cfg",
        &format!(
            "global\n  maxconn 100\ndefaults\n  mode tcp\n  timeout connect 5s\n  timeout client 10s\n  timeout server 10s\n\
             frontend http_in\n  bind 127.0.0.1:{front_http} accept-proxy\n  default_backend ingress_http\n\
             backend ingress_http\n  server ingress {} send-proxy-v2\n\
             frontend https_in\n  bind 127.0.0.1:{front_https} accept-proxy\n  default_backend ingress_https\n\
             backend ingress_https\n  server ingress {} send-proxy-v2\n",
            ingress.http, ingress.https
        ),
    );
    let _haproxy = tokio::process::Command::new("haproxy")
        .arg("-db")
        .arg("-f")
        .arg(&config)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("start haproxy");
    let front_http: SocketAddr = ([127, 0, 0, 1], front_http).into();
    let front_https: SocketAddr = ([127, 0, 0, 1], front_https).into();
    let deadline = Instant::now() + WAIT;
    while TcpStream::connect(front_https).await.is_err() {
        assert!(Instant::now() < deadline, "haproxy did not start");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let (status, echo) = get(front_http, &v1("203.0.113.9", 80), "open.test").await;
    assert_eq!(status, "200");
    assert_eq!(
        forwarded_for(&echo),
        (Some("203.0.113.9"), Some("203.0.113.9"))
    );
    assert_eq!(
        get(front_http, &v1("198.51.100.20", 80), "ranged.test")
            .await
            .0,
        "403"
    );
    let clients = Clients::new(&ca);
    let mut stream = TcpStream::connect(front_https).await.unwrap();
    stream.write_all(&v1("203.0.113.9", 443)).await.unwrap();
    let got = https_get(stream, &clients, Some("ranged.test"), "ranged.test").await;
    assert_eq!(got, Outcome::Served(200));
    // Refused at the SNI gate by the named client: haproxy then ends its client's connection.
    let mut stream = TcpStream::connect(front_https).await.unwrap();
    stream.write_all(&v1("198.51.100.20", 443)).await.unwrap();
    let got = https_get(stream, &clients, Some("ranged.test"), "ranged.test").await;
    assert!(!matches!(got, Outcome::Served(_)), "{got:?}");
}
