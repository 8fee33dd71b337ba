//! TLS termination with real clients: certificate choice by SNI (openssl s_client), HTTP/2 by
//! ALPN (curl and hyper), rotation under load, the redirect matrix, broken certificates, key
//! formats, and the userspace SNI gate.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use ingress_tests::client::blocking_get;
use ingress_tests::curl;
use ingress_tests::manifests::{ingress, one_route, service};
use ingress_tests::pki::{Ca, KeyFormat, KeyKind, secret_yaml};
use ingress_tests::process::{Ingress, check};
use ingress_tests::scratch::Scratch;
use ingress_tests::upstream::Backend;

const FAKE_CN: &str = "Ingress Controller Fake Certificate";

/// The subject CN `openssl s_client` is served for `sni` (None: no SNI), or `None` if the
/// connection was refused or reset before a certificate arrived.
fn served_cn(ingress: &Ingress, sni: Option<&str>) -> Option<String> {
    let mut cmd = Command::new("openssl");
    cmd.args(["s_client", "-connect", &ingress.https.to_string()]);
    match sni {
        Some(name) => cmd.args(["-servername", name]),
        None => cmd.arg("-noservername"),
    };
    let out = cmd
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .stdout(Stdio::piped())
        .output()
        .expect("openssl runs");
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find_map(|l| l.strip_prefix("subject="))
        .map(|s| {
            s.split(',')
                .find_map(|part| {
                    part.trim()
                        .strip_prefix("CN")
                        .map(|v| v.trim_start_matches([' ', '=']).to_string())
                })
                .unwrap_or_default()
        })
}

fn one_host(name: &str, secret: &str) -> String {
    format!(
        "---\napiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {{name: {}, namespace: t}}\nspec:\n  ingressClassName: ingress\n  tls: [{{hosts: [\"{name}\"], secretName: {secret}}}]\n  rules:\n  - host: \"{name}\"\n    http: {{paths: [{{path: /, pathType: Prefix, backend: {{service: {{name: web, port: {{number: 80}}}}}}}}]}}\n",
        secret
    )
}

#[test]
fn certificate_choice_by_sni() {
    let web = Backend::start("web");
    let ca = Ca::new("test CA");
    let exact = ca.server("exact", &["exact.example.com"]);
    let wild = ca.server("wild", &["*.wild.example.com"]);
    let dir = Scratch::new("tls-sni");
    let yaml = service("t", "web", &[&web])
        + &secret_yaml("t", "exact", &exact.chain, &exact.key)
        + &secret_yaml("t", "wild", &wild.chain, &wild.key)
        + &one_host("exact.example.com", "exact")
        + &one_host("*.wild.example.com", "wild")
        + &ingress("t", "notls", &[("notls.example.com", "/", "Prefix", "web")]);
    dir.write("a.yaml", &yaml);
    let ingress = Ingress::start(dir.path());
    let cases = [
        (Some("exact.example.com"), Some("exact")),
        (Some("EXACT.example.com"), Some("exact")),
        (Some("a.wild.example.com"), Some("wild")),
        (Some("notls.example.com"), Some(FAKE_CN)),
        (None, Some(FAKE_CN)),
        // Unknown names are reset by the SNI gate before any TLS work.
        (Some("unknown.example.com"), None),
        (Some("b.a.wild.example.com"), None),
    ];
    for (sni, want) in cases {
        assert_eq!(served_cn(&ingress, sni).as_deref(), want, "sni {sni:?}");
    }
    assert_eq!(
        ingress.metric("ingress_sni_gate_total", &[("reason", "unknown")]),
        Some(2.0)
    );
    assert_eq!(
        ingress.metric("ingress_sni_gate_total", &[("reason", "no_sni")]),
        Some(1.0)
    );
}

#[test]
fn key_formats_and_chains() {
    let web = Backend::start("web");
    let ca = Ca::new("test CA");
    let dir = Scratch::new("tls-keys");
    let mut yaml = service("t", "web", &[&web]);
    let cases = [
        ("ec-pkcs8", KeyKind::EcdsaP256, KeyFormat::Pkcs8),
        ("ec-sec1", KeyKind::EcdsaP256, KeyFormat::Traditional),
        ("rsa-pkcs8", KeyKind::Rsa2048, KeyFormat::Pkcs8),
        ("rsa-pkcs1", KeyKind::Rsa2048, KeyFormat::Traditional),
    ];
    for (name, kind, format) in cases {
        let host = format!("{name}.example.com");
        let leaf = ca.leaf(name, &[&host], kind, format, false);
        if matches!(format, KeyFormat::Traditional) {
            assert!(
                leaf.key.contains("BEGIN RSA PRIVATE KEY")
                    || leaf.key.contains("BEGIN EC PRIVATE KEY"),
                "{}",
                leaf.key
            );
        }
        yaml += &secret_yaml("t", name, &leaf.chain, &leaf.key);
        yaml += &one_host(&host, name);
    }
    dir.write("a.yaml", &yaml);
    let ingress = Ingress::start(dir.path());
    for (name, _, _) in cases {
        assert_eq!(
            served_cn(&ingress, Some(&format!("{name}.example.com"))).as_deref(),
            Some(name)
        );
    }
    // The chain verifies against the CA alone, so the intermediate (here the CA) was sent.
    let ca_file = dir.write("ca.pem", &ca.pem);
    let out = Command::new("openssl")
        .args([
            "s_client",
            "-connect",
            &ingress.https.to_string(),
            "-servername",
            "rsa-pkcs1.example.com",
            "-verify_return_error",
            "-CAfile",
        ])
        .arg(&ca_file)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("Verify return code: 0 (ok)"), "{text}");
}

#[test]
fn curl_http2_over_tls() {
    let web = Backend::start("web");
    let ca = Ca::new("test CA");
    let leaf = ca.server("curl", &["curl.example.com"]);
    let dir = Scratch::new("tls-curl");
    dir.write(
        "a.yaml",
        &(service("t", "web", &[&web])
            + &secret_yaml("t", "c", &leaf.chain, &leaf.key)
            + &one_host("curl.example.com", "c")),
    );
    let ca_file = dir.write("ca.pem", &ca.pem);
    let ingress = Ingress::start(dir.path());
    let port = ingress.https.port();
    for (flag, want) in [("--http2", "200 2"), ("--http1.1", "200 1.1")] {
        let out = Command::new("curl")
            .args([
                "-s",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code} %{http_version}",
                flag,
                "--cacert",
            ])
            .arg(&ca_file)
            .args([
                "--resolve",
                &format!("curl.example.com:{port}:127.0.0.1"),
                &format!("https://curl.example.com:{port}/"),
            ])
            .output()
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout), want, "{flag}");
    }
}

/// A hyper client over tokio-rustls, negotiating `alpn`; returns (status, http version, body).
async fn hyper_tls_get(
    ingress: &Ingress,
    ca: &Ca,
    host: &str,
    path: &str,
    alpn: &'static [u8],
) -> Result<(u16, http::Version, Bytes), String> {
    let connector = tokio_rustls::TlsConnector::from(ca.client_config(&[alpn]));
    let tcp = tokio::net::TcpStream::connect(ingress.https)
        .await
        .map_err(|e| e.to_string())?;
    let name =
        rustls::pki_types::ServerName::try_from(host.to_string()).map_err(|e| e.to_string())?;
    let tls = connector
        .connect(name, tcp)
        .await
        .map_err(|e| e.to_string())?;
    let io = hyper_util::rt::TokioIo::new(tls);
    let req = Request::get(format!("https://{host}{path}"))
        .header("host", host)
        .body(Full::new(Bytes::new()))
        .map_err(|e| e.to_string())?;
    let response = if alpn == b"h2" {
        let (mut sender, conn) =
            hyper::client::conn::http2::handshake(hyper_util::rt::TokioExecutor::new(), io)
                .await
                .map_err(|e| e.to_string())?;
        tokio::spawn(conn);
        sender.send_request(req).await.map_err(|e| e.to_string())?
    } else {
        let (mut sender, conn) = hyper::client::conn::http1::handshake(io)
            .await
            .map_err(|e| e.to_string())?;
        tokio::spawn(conn);
        sender.send_request(req).await.map_err(|e| e.to_string())?
    };
    let (status, version) = (response.status().as_u16(), response.version());
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    Ok((status, version, body))
}

#[tokio::test(flavor = "multi_thread")]
async fn hyper_client_h2_and_h1_over_tls() {
    let web = Backend::start("web");
    let ca = Ca::new("test CA");
    let leaf = ca.server("hyper", &["hyper.example.com"]);
    let dir = Scratch::new("tls-hyper");
    dir.write(
        "a.yaml",
        &(service("t", "web", &[&web])
            + &secret_yaml("t", "h", &leaf.chain, &leaf.key)
            + &one_host("hyper.example.com", "h")),
    );
    let ingress = Ingress::builder()
        .manifests(dir.path())
        .args(["--hsts", "--hsts-max-age", "600"])
        .start();
    let (status, version, body) = hyper_tls_get(&ingress, &ca, "hyper.example.com", "/x", b"h2")
        .await
        .unwrap();
    assert_eq!((status, version), (200, http::Version::HTTP_2));
    let echo: ingress_tests::upstream::Echo = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        echo.headers.get("x-forwarded-proto").map(String::as_str),
        Some("https")
    );
    assert_eq!(
        echo.headers.get("x-forwarded-port"),
        Some(&ingress.https.port().to_string())
    );
    let (status, version, _) = hyper_tls_get(&ingress, &ca, "hyper.example.com", "/x", b"http/1.1")
        .await
        .unwrap();
    assert_eq!((status, version), (200, http::Version::HTTP_11));
}

/// Rotates the Secret while clients keep making new TLS connections: every request succeeds,
/// new handshakes get the new certificate, and a connection opened before keeps working.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rotation_under_load() {
    let web = Backend::start("web");
    let ca = Ca::new("test CA");
    let v1 = ca.server("v1", &["rot.example.com"]);
    let v2 = ca.server("v2", &["rot.example.com"]);
    let dir = Scratch::new("tls-rotate");
    let base = service("t", "web", &[&web]) + &one_host("rot.example.com", "rot");
    dir.write("app.yaml", &base);
    dir.write("secret.yaml", &secret_yaml("t", "rot", &v1.chain, &v1.key));
    let ingress = Ingress::start(dir.path());
    assert_eq!(
        served_cn(&ingress, Some("rot.example.com")).as_deref(),
        Some("v1")
    );

    // A keep-alive connection opened before the rotation.
    let connector = tokio_rustls::TlsConnector::from(ca.client_config(&[b"http/1.1"]));
    let tcp = tokio::net::TcpStream::connect(ingress.https).await.unwrap();
    let tls = connector
        .connect(
            rustls::pki_types::ServerName::try_from("rot.example.com").unwrap(),
            tcp,
        )
        .await
        .unwrap();
    let (mut old_conn, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
            .await
            .unwrap();
    tokio::spawn(conn);

    let ingress = Arc::new(ingress);
    let ca = Arc::new(ca);
    let stop = Arc::new(AtomicBool::new(false));
    let (ok, failed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let mut workers = Vec::new();
    for _ in 0..8 {
        let (ingress, ca, stop, ok, failed) = (
            ingress.clone(),
            ca.clone(),
            stop.clone(),
            ok.clone(),
            failed.clone(),
        );
        workers.push(tokio::spawn(async move {
            let deadline = Instant::now() + Duration::from_secs(20);
            while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
                match hyper_tls_get(&ingress, &ca, "rot.example.com", "/", b"http/1.1").await {
                    Ok((200, _, _)) => ok.fetch_add(1, Ordering::Relaxed),
                    other => {
                        eprintln!("failed: {other:?}");
                        failed.fetch_add(1, Ordering::Relaxed)
                    }
                };
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    dir.replace("secret.yaml", &secret_yaml("t", "rot", &v2.chain, &v2.key));
    let deadline = Instant::now() + Duration::from_secs(5);
    let ingress_ref = ingress.clone();
    loop {
        let cn = tokio::task::spawn_blocking({
            let i = ingress_ref.clone();
            move || served_cn(&i, Some("rot.example.com"))
        })
        .await
        .unwrap();
        if cn.as_deref() == Some("v2") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "rotation never reached new handshakes (still {cn:?})"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.await.unwrap();
    }
    assert_eq!(failed.load(Ordering::Relaxed), 0);
    assert!(
        ok.load(Ordering::Relaxed) > 50,
        "only {} requests",
        ok.load(Ordering::Relaxed)
    );
    let req = Request::get("/")
        .header("host", "rot.example.com")
        .body(Full::new(Bytes::new()))
        .unwrap();
    assert_eq!(
        old_conn.send_request(req).await.unwrap().status(),
        200,
        "a connection from before the rotation still works"
    );
}

#[test]
fn redirect_matrix() {
    let web = Backend::start("web");
    let ca = Ca::new("test CA");
    let leaf = ca.server("r", &["tls.example.com", "noredirect.example.com"]);
    let dir = Scratch::new("tls-redirect");
    let annotated = |name: &str, annotation: &str, tls: bool| {
        let tls_block = if tls {
            format!("  tls: [{{hosts: [\"{name}\"], secretName: r}}]\n")
        } else {
            String::new()
        };
        format!(
            "---\napiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata:\n  name: {}\n  namespace: t\n  annotations: {{{annotation}}}\nspec:\n  ingressClassName: ingress\n{tls_block}  rules:\n  - host: \"{name}\"\n    http: {{paths: [{{path: /, pathType: Prefix, backend: {{service: {{name: web, port: {{number: 80}}}}}}}}]}}\n",
            name.split('.').next().unwrap_or("x")
        )
    };
    let yaml = service("t", "web", &[&web])
        + &secret_yaml("t", "r", &leaf.chain, &leaf.key)
        + &annotated("tls.example.com", "", true)
        + &annotated(
            "noredirect.example.com",
            "nginx.ingress.kubernetes.io/ssl-redirect: \"false\"",
            true,
        )
        + &annotated("plain.example.com", "", false)
        + &annotated(
            "forced.example.com",
            "nginx.ingress.kubernetes.io/force-ssl-redirect: \"true\"",
            false,
        )
        + &annotated(
            "ownprefix.example.com",
            "ingress.rs/force-ssl-redirect: \"true\"",
            false,
        );
    dir.write("a.yaml", &yaml);
    let ingress = Ingress::start(dir.path());
    let port = ingress.https.port();
    let redirect = |host: &str, path: &str| -> (u16, String) {
        let text = curl::write_out(
            "%{http_code} %{redirect_url}",
            &[
                "-X",
                "POST",
                "-H",
                &format!("Host: {host}"),
                &ingress.url(path),
            ],
        );
        let (code, url) = text.split_once(' ').unwrap_or((&text, ""));
        (code.parse().unwrap_or(0), url.to_string())
    };
    assert_eq!(
        redirect("tls.example.com", "/a?b=c"),
        (308, format!("https://tls.example.com:{port}/a?b=c"))
    );
    assert_eq!(redirect("noredirect.example.com", "/").0, 200);
    assert_eq!(redirect("plain.example.com", "/").0, 200);
    assert_eq!(redirect("forced.example.com", "/x").0, 308);
    assert_eq!(redirect("ownprefix.example.com", "/x").0, 308);
}

#[test]
fn hsts_on_https_only() {
    let web = Backend::start("web");
    let ca = Ca::new("test CA");
    let leaf = ca.server("h", &["hsts.example.com"]);
    let dir = Scratch::new("tls-hsts");
    dir.write(
        "a.yaml",
        &(service("t", "web", &[&web])
            + &secret_yaml("t", "h", &leaf.chain, &leaf.key)
            + &one_host("hsts.example.com", "h")),
    );
    let ca_file = dir.write("ca.pem", &ca.pem);
    let ingress = Ingress::builder()
        .manifests(dir.path())
        .args([
            "--hsts",
            "--hsts-max-age",
            "600",
            "--hsts-include-subdomains",
        ])
        .start();
    let head = curl::verified_https_head(&ca_file, "hsts.example.com", ingress.https.port(), "/")
        .to_ascii_lowercase();
    assert!(
        head.contains("strict-transport-security: max-age=600; includesubdomains"),
        "{head}"
    );
    let out = Command::new("curl")
        .args([
            "-s",
            "-D",
            "-",
            "-o",
            "/dev/null",
            "-H",
            "Host: hsts.example.com",
        ])
        .arg(ingress.url("/"))
        .output()
        .unwrap();
    let head = String::from_utf8_lossy(&out.stdout).to_ascii_lowercase();
    assert!(
        head.starts_with("http/1.1 308") && !head.contains("strict-transport-security"),
        "plain HTTP carries no HSTS: {head}"
    );
}

#[test]
fn broken_certificates_fall_back_and_are_reported() {
    let web = Backend::start("web");
    let ca = Ca::new("test CA");
    let good = ca.server("good", &["good.example.com"]);
    let other = ca.server("other", &["mismatch.example.com"]);
    let expired = ca.leaf(
        "expired",
        &["expired.example.com"],
        KeyKind::EcdsaP256,
        KeyFormat::Pkcs8,
        true,
    );
    let wrong_name = ca.server("wrongname", &["elsewhere.example.com"]);
    let dir = Scratch::new("tls-broken");
    let yaml = service("t", "web", &[&web])
        + &secret_yaml("t", "good", &good.chain, &good.key)
        + &secret_yaml("t", "mismatch", &other.chain, &good.key)
        + &secret_yaml("t", "expired", &expired.chain, &expired.key)
        + &secret_yaml("t", "wrongname", &wrong_name.chain, &wrong_name.key)
        + &one_host("good.example.com", "good")
        + &one_host("missing.example.com", "missing")
        + &one_host("mismatch.example.com", "mismatch")
        + &one_host("expired.example.com", "expired")
        + &one_host("sans.example.com", "wrongname");
    dir.write("a.yaml", &yaml);
    let ingress = Ingress::start(dir.path());
    assert_eq!(
        served_cn(&ingress, Some("good.example.com")).as_deref(),
        Some("good")
    );
    for host in ["missing", "mismatch", "expired", "sans"] {
        assert_eq!(
            served_cn(&ingress, Some(&format!("{host}.example.com"))).as_deref(),
            Some(FAKE_CN),
            "{host}"
        );
        // The host still routes over HTTPS with the default certificate.
    }
    for kind in [
        "SecretNotFound",
        "CertificateKeyMismatch",
        "CertificateExpired",
        "CertificateHostMismatch",
    ] {
        assert_eq!(
            ingress.metric(
                "ingress_config_errors",
                &[("kind", kind), ("severity", "error")]
            ),
            Some(1.0),
            "{kind}"
        );
    }
    let expires_in = ingress
        .metric(
            "ingress_certificate_expires_in_seconds",
            &[("namespace", "t"), ("secret", "good")],
        )
        .expect("expiry metric");
    assert!(expires_in > 365.0 * 86400.0, "{expires_in}");
    let out = check(dir.path(), &[]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1));
    for needle in [
        "secret t/missing: not found",
        "does not match the certificate",
        "expired",
        "do not cover sans.example.com",
    ] {
        assert!(text.contains(needle), "check mentions {needle:?}:\n{text}");
    }
    assert_eq!(
        blocking_get(ingress.http, "/", "good.example.com").0,
        308,
        "TLS hosts redirect plain HTTP"
    );
}

// A plain #[test]: no runtime here for a blocking connect to stall.
#[allow(clippy::disallowed_methods)]
#[test]
fn non_tls_and_garbage_on_the_https_port_are_reset() {
    let web = Backend::start("web");
    let dir = Scratch::new("tls-garbage");
    dir.write("a.yaml", &one_route("t", "web", "g.example.com", &web));
    let ingress = Ingress::start(dir.path());
    for (payload, reason) in [
        (
            &b"GET / HTTP/1.1\r\nHost: g.example.com\r\n\r\n"[..],
            "not_tls",
        ),
        (
            &[0x16, 0x03, 0x01, 0x00, 0x05, 2, 0, 0, 1, 0][..],
            "malformed",
        ),
    ] {
        let mut stream = std::net::TcpStream::connect(ingress.https).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(3)))
            .unwrap();
        stream.write_all(payload).unwrap();
        let mut buf = [0u8; 64];
        let started = Instant::now();
        let result = std::io::Read::read(&mut stream, &mut buf);
        assert!(
            matches!(&result, Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset),
            "{reason}: expected a reset, got {result:?}"
        );
        assert!(started.elapsed() < Duration::from_millis(500));
        assert_eq!(
            ingress.metric("ingress_sni_gate_total", &[("reason", reason)]),
            Some(1.0),
            "{reason}"
        );
    }
    assert_eq!(
        ingress.metric("ingress_tls_handshakes_total", &[("result", "ok")]),
        None,
        "no handshake was attempted"
    );
}

/// TLS clients speak first, so the HTTPS listener defers accept until their first bytes arrive:
/// a client that connects and says nothing is not yet the proxy's connection, and costs it no
/// task. Once it speaks, it is accepted and judged at once.
// A plain #[test]: no runtime here for a blocking connect to stall.
#[allow(clippy::disallowed_methods)]
#[test]
fn a_silent_client_is_not_accepted_until_it_speaks() {
    let web = Backend::start("web");
    let dir = Scratch::new("tls-deferred");
    dir.write("a.yaml", &one_route("t", "web", "d.example.com", &web));
    let ingress = Ingress::start(dir.path());
    let accepted = || {
        ingress
            .metric("ingress_connections_total", &[("listener", "https")])
            .unwrap_or(0.0)
    };
    let before = accepted();
    let mut stream = std::net::TcpStream::connect(ingress.https).unwrap();
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(accepted(), before, "accepted before the client sent a byte");

    stream
        .set_read_timeout(Some(Duration::from_secs(3)))
        .unwrap();
    stream
        .write_all(b"GET / HTTP/1.1\r\nHost: d.example.com\r\n\r\n")
        .unwrap();
    let mut buf = [0u8; 64];
    let result = std::io::Read::read(&mut stream, &mut buf);
    assert!(
        matches!(&result, Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset),
        "plain HTTP on the HTTPS port: expected a reset, got {result:?}"
    );
    assert_eq!(accepted(), before + 1.0, "accepted once it spoke");
}
