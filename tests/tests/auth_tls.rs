//! Client certificates (`auth-tls-*`) through the real binary with curl and `openssl s_client`
//! holding real client certificates: valid, expired, from another CA, revoked by the Secret's
//! CRL, missing, and with a CN that `auth-tls-match-cn` refuses, from an unknown CA under
//! `optional_no_ca`, and through an intermediate against `auth-tls-verify-depth` 1 and 2; over
//! HTTP/1.1 and HTTP/2. As
//! nginx does it, the handshake completes and the request is answered 400 (or redirected to
//! `auth-tls-error-page`); only hosts with `auth-tls-secret` send a CertificateRequest; the
//! `ssl-client-*` headers reach the upstream from the proxy only, never from the client.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use ingress_tests::Mode;
use ingress_tests::curl::{self, Reply};
use ingress_tests::manifests::{annotated_ingress, service};
use ingress_tests::pki::{Ca, Leaf, ca_secret_yaml};
use ingress_tests::process::Ingress;
use ingress_tests::scratch::Scratch;
use ingress_tests::upstream::Backend;

const HTTPS_VERSIONS: [&str; 2] = ["--http1.1", "--http2"];

struct Client {
    cert: PathBuf,
    key: PathBuf,
}

impl Client {
    fn write(dir: &Scratch, name: &str, leaf: &Leaf) -> Client {
        Client {
            cert: dir.write(&format!("{name}.crt"), &leaf.chain),
            key: dir.write(&format!("{name}.key"), &leaf.key),
        }
    }

    fn args(&self) -> Vec<String> {
        vec![
            "--cert".into(),
            self.cert.display().to_string(),
            "--key".into(),
            self.key.display().to_string(),
        ]
    }
}

fn get(
    ingress: &Ingress,
    host: &str,
    version: &str,
    client: Option<&Client>,
    extra: &[&str],
) -> Reply {
    let mut args: Vec<String> = client.map(Client::args).unwrap_or_default();
    args.extend(extra.iter().map(|s| s.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    curl::https_get(ingress, host, "/", version, &args)
        .unwrap_or_else(|| panic!("{version} {host}: no HTTP reply (the handshake must complete)"))
}

/// What `openssl s_client` says about the CertificateRequest for `sni`, and the status line of
/// a request sent on the connection, presenting `client` if given.
fn s_client(ingress: &Ingress, sni: &str, client: Option<&Client>) -> (String, String) {
    let mut cmd = Command::new("openssl");
    cmd.args([
        "s_client",
        "-connect",
        &ingress.https.to_string(),
        "-servername",
        sni,
        "-ign_eof",
    ]);
    if let Some(client) = client {
        cmd.arg("-cert")
            .arg(&client.cert)
            .arg("-key")
            .arg(&client.key);
    }
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("openssl runs");
    child
        .stdin
        .as_mut()
        .unwrap()
        .write_all(format!("GET / HTTP/1.1\r\nHost: {sni}\r\nConnection: close\r\n\r\n").as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    // s_client's session dump and the response can interleave on stdout: find the status
    // line anywhere.
    let status = text
        .find("HTTP/1.1 ")
        .and_then(|i| text[i..].split("\r\n").next())
        .unwrap_or("")
        .to_string();
    (text, status)
}

fn rfc2253_subject(cert: &PathBuf) -> String {
    let out = Command::new("openssl")
        .args(["x509", "-noout", "-subject", "-nameopt", "RFC2253", "-in"])
        .arg(cert)
        .output()
        .expect("openssl runs");
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .trim_start_matches("subject=")
        .to_string()
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() + 1 {
            let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap();
            out.push(u8::from_str_radix(hex, 16).unwrap());
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).unwrap()
}

#[test]
fn client_certificates_as_nginx_checks_them_userspace() {
    client_certificates_as_nginx_checks_them(Mode::Userspace);
}

/// The kernel gate admits the name before accept; what follows must not differ.
#[test]
fn client_certificates_as_nginx_checks_them_ebpf() {
    client_certificates_as_nginx_checks_them(Mode::Ebpf);
}

fn client_certificates_as_nginx_checks_them(mode: Mode) {
    let web = Backend::start("web");
    let ca = Ca::new("client CA");
    let rogue_ca = Ca::new("rogue CA");
    let dir = Scratch::new("auth-tls");
    let alice = Client::write(&dir, "alice", &ca.client("alice", 10, false));
    let bob = Client::write(&dir, "bob", &ca.client("bob", 13, false));
    let expired = Client::write(&dir, "expired", &ca.client("alice", 11, true));
    let revoked = Client::write(&dir, "revoked", &ca.client("alice", 12, false));
    let rogue = Client::write(&dir, "rogue", &rogue_ca.client("alice", 10, false));
    // Two links below the Secret's CA: accepted only where auth-tls-verify-depth allows 2.
    let intermediate = ca.intermediate("client intermediate");
    let mut deep = intermediate.client("dave", 14, false);
    deep.chain.push_str(&intermediate.pem);
    let deep = Client::write(&dir, "deep", &deep);
    let crl = ca.crl(&[12]);
    let manifests = [
        service("t", "web", &[&web]),
        ca_secret_yaml("t", "ca", &ca.pem, Some(&crl)),
        // Without a CRL: with one, nginx checks every link of a chain (CRL_CHECK_ALL), and the
        // intermediate publishes none, so a chain through it would fail for that alone.
        ca_secret_yaml("t", "ca-no-crl", &ca.pem, None),
        annotated_ingress(
            "t",
            "strict",
            1,
            &[
                ("auth-tls-secret", "t/ca"),
                ("auth-tls-pass-certificate-to-upstream", "true"),
            ],
            &[("strict.test", "/", "Prefix", "web")],
        ),
        annotated_ingress(
            "t",
            "cn",
            2,
            &[
                ("auth-tls-secret", "ca"),
                ("auth-tls-match-cn", "CN=(alice|carol)"),
            ],
            &[("cn.test", "/", "Prefix", "web")],
        ),
        annotated_ingress(
            "t",
            "optional",
            3,
            &[
                ("auth-tls-secret", "t/ca"),
                ("auth-tls-verify-client", "optional"),
            ],
            &[("optional.test", "/", "Prefix", "web")],
        ),
        annotated_ingress(
            "t",
            "errpage",
            4,
            &[
                ("auth-tls-secret", "t/ca"),
                ("auth-tls-error-page", "https://login.example.com/cert"),
            ],
            &[("errpage.test", "/", "Prefix", "web")],
        ),
        annotated_ingress(
            "t",
            "broken",
            5,
            &[("auth-tls-secret", "t/missing")],
            &[("broken.test", "/", "Prefix", "web")],
        ),
        annotated_ingress("t", "open", 6, &[], &[("open.test", "/", "Prefix", "web")]),
        annotated_ingress(
            "t",
            "no-ca",
            10,
            &[
                ("auth-tls-secret", "t/ca"),
                ("auth-tls-verify-client", "optional_no_ca"),
            ],
            &[("no-ca.test", "/", "Prefix", "web")],
        ),
        annotated_ingress(
            "t",
            "depth",
            11,
            &[
                ("auth-tls-secret", "t/ca-no-crl"),
                ("auth-tls-verify-depth", "2"),
            ],
            &[("depth.test", "/", "Prefix", "web")],
        ),
        annotated_ingress(
            "t",
            "shallow",
            12,
            &[("auth-tls-secret", "t/ca-no-crl")],
            &[("shallow.test", "/", "Prefix", "web")],
        ),
        annotated_ingress(
            "t",
            "off",
            9,
            &[
                ("auth-tls-secret", "t/ca"),
                ("auth-tls-verify-client", "off"),
            ],
            &[("off.test", "/", "Prefix", "web")],
        ),
        // An Ingress whose auth-tls cannot be applied keeps its whole host closed, the other
        // Ingress's paths on it included (nginx protects the server as a whole).
        annotated_ingress(
            "t",
            "shared-open",
            7,
            &[],
            &[("shared.test", "/", "Prefix", "web")],
        ),
        annotated_ingress(
            "t",
            "shared-broken",
            8,
            &[("auth-tls-secret", "t/missing")],
            &[("shared.test", "/admin", "Prefix", "web")],
        ),
    ]
    .concat();
    dir.write("all.yaml", &manifests);
    let ingress = Ingress::builder().manifests(dir.path()).mode(mode).start();

    for version in HTTPS_VERSIONS {
        // (host, client certificate, status)
        let cases: [(&str, Option<&Client>, u16); 15] = [
            ("strict.test", Some(&alice), 200),
            ("strict.test", Some(&bob), 200),
            ("strict.test", None, 400),
            ("strict.test", Some(&expired), 400),
            ("strict.test", Some(&rogue), 400),
            ("strict.test", Some(&revoked), 400),
            ("cn.test", Some(&alice), 200),
            ("cn.test", Some(&bob), 403),
            ("cn.test", None, 400),
            ("optional.test", None, 200),
            ("optional.test", Some(&alice), 200),
            ("optional.test", Some(&rogue), 400),
            ("open.test", None, 200),
            ("broken.test", Some(&alice), 503),
            ("shared.test", Some(&alice), 503),
        ];
        for (host, client, status) in cases {
            let before = web.served();
            let reply = get(&ingress, host, version, client, &[]);
            assert_eq!(
                reply.status,
                status,
                "{version} {host} with {:?}",
                client.map(|c| &c.cert)
            );
            if status != 200 {
                assert_eq!(
                    web.served(),
                    before,
                    "{version} {host}: the backend saw nothing"
                );
            }
        }

        // optional_no_ca: a certificate from an unknown CA passes, with what nginx reports of
        // it; any other failure (expired) is still a 400. verify-depth: the default 1 refuses a
        // chain through an intermediate, 2 takes it.
        let cases: [(&str, Option<&Client>, u16, Option<&str>); 9] = [
            ("no-ca.test", Some(&rogue), 200, Some("FAILED:")),
            ("no-ca.test", None, 200, Some("NONE")),
            ("no-ca.test", Some(&alice), 200, Some("SUCCESS")),
            ("no-ca.test", Some(&expired), 400, None),
            ("shallow.test", Some(&deep), 400, None),
            ("shallow.test", Some(&alice), 200, Some("SUCCESS")),
            ("depth.test", Some(&deep), 200, Some("SUCCESS")),
            ("depth.test", Some(&alice), 200, Some("SUCCESS")),
            ("depth.test", Some(&rogue), 400, None),
        ];
        for (host, client, status, verify) in cases {
            let before = web.served();
            let reply = get(&ingress, host, version, client, &[]);
            let who = client.map(|c| &c.cert);
            assert_eq!(reply.status, status, "{version} {host} with {who:?}");
            match verify {
                Some(verify) => {
                    let echo = reply.echo().expect("echo");
                    let got = echo.headers.get("ssl-client-verify").map(String::as_str);
                    assert!(
                        got.is_some_and(|v| v.starts_with(verify)),
                        "{version} {host} with {who:?}: ssl-client-verify {got:?}"
                    );
                }
                None => assert_eq!(
                    web.served(),
                    before,
                    "{version} {host}: the backend saw nothing"
                ),
            }
        }

        // The headers nginx sets, from the proxy alone: a client's own copies are dropped.
        let spoof = [
            "-H",
            "ssl-client-verify: SUCCESS",
            "-H",
            "ssl-client-subject-dn: CN=admin",
            "-H",
            "ssl-client-issuer-dn: CN=client CA",
            "-H",
            "ssl-client-cert: forged",
        ];
        let echo = get(&ingress, "strict.test", version, Some(&alice), &spoof)
            .echo()
            .expect("echo");
        assert_eq!(
            echo.headers.get("ssl-client-verify").map(String::as_str),
            Some("SUCCESS")
        );
        assert_eq!(
            echo.headers.get("ssl-client-subject-dn").cloned(),
            Some(rfc2253_subject(&alice.cert)),
            "{version}: the subject as nginx's $ssl_client_s_dn (RFC 2253)"
        );
        assert_eq!(
            echo.headers.get("ssl-client-issuer-dn").map(String::as_str),
            Some("CN=client CA")
        );
        let escaped = echo
            .headers
            .get("ssl-client-cert")
            .expect("ssl-client-cert");
        assert!(
            escaped.starts_with("-----BEGIN%20CERTIFICATE-----%0A"),
            "{escaped}"
        );
        assert_eq!(
            percent_decode(escaped),
            std::fs::read_to_string(&alice.cert)
                .unwrap()
                .replace("\r\n", "\n")
        );
        // Without pass-certificate-to-upstream the certificate itself is not sent.
        let echo = get(&ingress, "cn.test", version, Some(&alice), &spoof)
            .echo()
            .expect("echo");
        assert_eq!(
            echo.headers.get("ssl-client-verify").map(String::as_str),
            Some("SUCCESS")
        );
        assert!(
            !echo.headers.contains_key("ssl-client-cert"),
            "{version}: {echo:?}"
        );
        let echo = get(&ingress, "optional.test", version, None, &spoof)
            .echo()
            .expect("echo");
        assert_eq!(
            echo.headers.get("ssl-client-verify").map(String::as_str),
            Some("NONE")
        );
        assert!(
            !echo.headers.contains_key("ssl-client-subject-dn"),
            "{version}: {echo:?}"
        );
        // verify-client off: no certificate is asked for, the request passes, NONE upstream.
        let echo = get(&ingress, "off.test", version, Some(&alice), &spoof)
            .echo()
            .expect("echo");
        assert_eq!(
            echo.headers.get("ssl-client-verify").map(String::as_str),
            Some("NONE")
        );
        let echo = get(&ingress, "open.test", version, Some(&alice), &spoof)
            .echo()
            .expect("echo");
        for name in [
            "ssl-client-verify",
            "ssl-client-subject-dn",
            "ssl-client-issuer-dn",
            "ssl-client-cert",
        ] {
            assert!(
                !echo.headers.contains_key(name),
                "{version}: {name} reached the upstream of a host without auth-tls"
            );
        }

        // auth-tls-error-page: a redirect instead of the 400 page.
        let reply = get(&ingress, "errpage.test", version, None, &[]);
        assert_eq!(reply.status, 302, "{version}");
        assert_eq!(
            reply.header("location"),
            Some("https://login.example.com/cert")
        );
        assert_eq!(
            get(&ingress, "errpage.test", version, Some(&alice), &[]).status,
            200
        );

        // A connection whose SNI chose no client certificate cannot carry a request for a host
        // that requires one, whatever its Host says.
        let before = web.served();
        let reply = get(
            &ingress,
            "open.test",
            version,
            Some(&alice),
            &["-H", "Host: strict.test"],
        );
        assert_eq!(
            reply.status, 421,
            "{version}: Host strict.test on an open.test connection"
        );
        assert_eq!(web.served(), before);
    }

    // Plain HTTP to a host that requires a certificate is never served.
    let reply = curl::get(&ingress, "strict.test", "/", "--http1.1", &[]);
    assert_eq!(reply.status, 400);
    assert_eq!(
        curl::get(&ingress, "open.test", "/", "--http1.1", &[]).status,
        200
    );

    // openssl: only hosts with auth-tls send a CertificateRequest, naming the Secret's CA; the
    // handshake completes either way and HTTP answers.
    let (text, _) = s_client(&ingress, "off.test", None);
    assert!(
        text.contains("No client certificate CA names sent"),
        "verify-client off asks for nothing: {text}"
    );
    let (text, status) = s_client(&ingress, "open.test", None);
    assert!(
        text.contains("No client certificate CA names sent"),
        "{text}"
    );
    assert_eq!(status, "HTTP/1.1 200 OK", "{text}");
    let (text, status) = s_client(&ingress, "strict.test", None);
    assert!(
        text.contains("Acceptable client certificate CA names"),
        "{text}"
    );
    assert!(
        text.contains("CN=client CA") || text.contains("CN = client CA"),
        "{text}"
    );
    assert_eq!(status, "HTTP/1.1 400 Bad Request");
    let (text, status) = s_client(&ingress, "strict.test", Some(&alice));
    assert_eq!(status, "HTTP/1.1 200 OK", "{text}");
    let (_, status) = s_client(&ingress, "strict.test", Some(&revoked));
    assert_eq!(status, "HTTP/1.1 400 Bad Request");

    // `ingress check` names what refused the broken Ingress.
    let out = Command::new(ingress_tests::process::binary())
        .args(["check", "--manifests"])
        .arg(dir.path())
        .output()
        .expect("ingress check runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("t/missing"), "{text}");
}

/// A keep-alive HTTP/1.1 request on `tls`; the status.
async fn request(
    tls: &mut tokio_rustls::client::TlsStream<tokio::net::TcpStream>,
    host: &str,
) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    tls.write_all(format!("GET / HTTP/1.1\r\nHost: {host}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    // Read the head, then as much body as Content-Length says.
    loop {
        let n = tls.read(&mut chunk).await.unwrap();
        assert!(
            n > 0,
            "closed before a response: {:?}",
            String::from_utf8_lossy(&buf)
        );
        buf.extend_from_slice(&chunk[..n]);
        let text = String::from_utf8_lossy(&buf).into_owned();
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let length: usize = head
                .lines()
                .find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.eq_ignore_ascii_case("content-length")
                        .then(|| v.trim().parse().ok())?
                })
                .unwrap_or(0);
            if body.len() >= length {
                return head.split_whitespace().nth(1).unwrap().parse().unwrap();
            }
        }
    }
}

/// The rules a connection was verified against are the ones it keeps: once the CA Secret
/// changes, a request on an older connection is sent to open a new one (421), and the new
/// connection is judged by the new rules.
#[tokio::test]
async fn a_changed_ca_applies_to_new_connections() {
    let web = Backend::start("web");
    let ca = Ca::new("client CA");
    let next_ca = Ca::new("next client CA");
    let alice = ca.client("alice", 10, false);
    let dir = Scratch::new("auth-tls-rotation");
    let manifests = |ca_pem: &str| {
        [
            service("t", "web", &[&web]),
            ca_secret_yaml("t", "ca", ca_pem, None),
            annotated_ingress(
                "t",
                "strict",
                1,
                &[("auth-tls-secret", "t/ca")],
                &[("strict.test", "/", "Prefix", "web")],
            ),
        ]
        .concat()
    };
    dir.write("all.yaml", &manifests(&ca.pem));
    let ingress = Ingress::start(dir.path());
    let connector = tokio_rustls::TlsConnector::from(
        ingress_tests::pki::any_server_config_with_client_cert(&[b"http/1.1"], &alice),
    );
    let connect = || async {
        let tcp = tokio::net::TcpStream::connect(ingress.https).await.unwrap();
        let name = rustls::pki_types::ServerName::try_from("strict.test").unwrap();
        connector.connect(name, tcp).await.unwrap()
    };
    let mut old = connect().await;
    assert_eq!(request(&mut old, "strict.test").await, 200);
    let generation = ingress.metric("ingress_snapshot_generation", &[]).unwrap();
    dir.replace("all.yaml", &manifests(&next_ca.pem));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while ingress
        .metric("ingress_snapshot_generation", &[])
        .unwrap_or_default()
        <= generation
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the new CA was not applied"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(
        request(&mut old, "strict.test").await,
        421,
        "the connection was verified against the old CA"
    );
    let mut new = connect().await;
    assert_eq!(
        request(&mut new, "strict.test").await,
        400,
        "alice's CA is no longer trusted"
    );
}
