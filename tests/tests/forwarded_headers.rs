//! Trusted forwarded headers (`--use-forwarded-headers`, `--proxy-real-ip-cidr`,
//! `--compute-full-forwarded-for`) through the real binary, with exact bytes from two loopback
//! addresses: 127.0.0.2 plays the trusted balancer, 127.0.0.1 a client that connects directly.
//! The client the chain names (walked from the right past trusted hops only) is what the
//! source range judges, what the backend is told in `X-Forwarded-For`/`X-Real-IP` and what the
//! access log shows; a spoofed chain from an untrusted peer changes nothing. HTTP/2 (curl,
//! h2c) is judged the same way, and with PROXY protocol the PROXY-named client is the peer.
//!
//! ```text
//!   127.0.0.1 ──"X-Forwarded-For: 203.0.113.9"──> ingress   not believed: 127.0.0.1 is judged
//!   127.0.0.2 ──"X-Forwarded-For: …, 203.0.113.9"──> ingress believed: 203.0.113.9 is judged
//! ```

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::IpAddr;
use std::time::Duration;

use ingress_tests::curl;
use ingress_tests::manifests::{annotated_ingress, service};
use ingress_tests::process::Ingress;
use ingress_tests::raw::{RawConn, Reply};
use ingress_tests::scratch::Scratch;
use ingress_tests::upstream::Backend;

const DIRECT: &str = "127.0.0.1";
const BALANCER: &str = "127.0.0.2";

/// `ranged.test` admits only 203.0.113.0/24; `open.test` anyone; `secure.test` redirects
/// plain HTTP to HTTPS.
fn site(dir: &Scratch, web: &Backend) {
    dir.write(
        "site.yaml",
        &[
            service("t", "web", &[web]),
            annotated_ingress(
                "t",
                "ranged",
                1,
                &[("allowlist-source-range", "203.0.113.0/24")],
                &[("ranged.test", "/", "Prefix", "web")],
            ),
            annotated_ingress("t", "open", 2, &[], &[("open.test", "/", "Prefix", "web")]),
            annotated_ingress(
                "t",
                "secure",
                3,
                &[("force-ssl-redirect", "true")],
                &[("secure.test", "/", "Prefix", "web")],
            ),
        ]
        .concat(),
    );
}

fn send(ingress: &Ingress, from: &str, host: &str, headers: &str) -> Reply {
    let source: IpAddr = from.parse().unwrap();
    let request =
        format!("GET /who HTTP/1.1\r\nHost: {host}\r\n{headers}Connection: close\r\n\r\n");
    RawConn::connect_from(source, ingress.http).exchange(request.as_bytes())
}

fn told(reply: &Reply, header: &str) -> Option<String> {
    assert_eq!(reply.status, 200, "{}", reply.text());
    reply.echo().headers.get(header).cloned()
}

#[test]
fn only_trusted_hops_are_believed() {
    let web = Backend::start("web");
    let dir = Scratch::new("forwarded-trusted");
    site(&dir, &web);
    let ingress = Ingress::builder()
        .manifests(dir.path())
        .args([
            "--use-forwarded-headers",
            "--proxy-real-ip-cidr",
            "127.0.0.2/32, 10.0.0.0/8",
        ])
        .start();
    // (peer, X-Forwarded-For header lines, the client the proxy must believe)
    let cases: &[(&str, &str, &str)] = &[
        // Spoofed from an untrusted peer: not believed.
        (DIRECT, "X-Forwarded-For: 203.0.113.9\r\n", DIRECT),
        // From the balancer: believed.
        (BALANCER, "X-Forwarded-For: 203.0.113.9\r\n", "203.0.113.9"),
        // The client's own claim in front of the balancer's entry is not believed.
        (
            BALANCER,
            "X-Forwarded-For: 203.0.113.50, 198.51.100.7\r\n",
            "198.51.100.7",
        ),
        // Trusted hops are walked past; an untrusted one in the middle stops the walk.
        (
            BALANCER,
            "X-Forwarded-For: 203.0.113.9, 198.51.100.7, 10.0.0.3\r\n",
            "198.51.100.7",
        ),
        (
            BALANCER,
            "X-Forwarded-For: 203.0.113.9, 10.0.0.3, 10.1.2.3\r\n",
            "203.0.113.9",
        ),
        // Malformed entries stop the walk at the last trusted hop.
        (
            BALANCER,
            "X-Forwarded-For: 203.0.113.9, garbage\r\n",
            BALANCER,
        ),
        (
            BALANCER,
            "X-Forwarded-For: 203.0.113.9, unknown, 10.0.0.4\r\n",
            "10.0.0.4",
        ),
        (BALANCER, "X-Forwarded-For: 203.0.113.999\r\n", BALANCER),
        (
            BALANCER,
            "X-Forwarded-For: 203.0.113.9:5555\r\n",
            "203.0.113.9",
        ),
        // Several headers are one list, in the order they came.
        (
            BALANCER,
            "X-Forwarded-For: 198.51.100.1\r\nX-Forwarded-For: 203.0.113.9\r\n",
            "203.0.113.9",
        ),
        (
            BALANCER,
            "X-Forwarded-For: 203.0.113.9\r\nX-Forwarded-For: 198.51.100.1\r\n",
            "198.51.100.1",
        ),
        // No header: the peer.
        (BALANCER, "", BALANCER),
    ];
    for (peer, headers, client) in cases {
        let open = send(&ingress, peer, "open.test", headers);
        assert_eq!(
            told(&open, "x-real-ip").as_deref(),
            Some(*client),
            "{peer} {headers:?}"
        );
        assert_eq!(
            told(&open, "x-forwarded-for").as_deref(),
            Some(*client),
            "{peer} {headers:?}"
        );
        let ranged = send(&ingress, peer, "ranged.test", headers);
        let admitted = client.starts_with("203.0.113.");
        assert_eq!(
            ranged.status,
            if admitted { 200 } else { 403 },
            "{peer} {headers:?}: the source range judges {client}"
        );
    }
    // The access log names the believed client.
    assert!(
        ingress.wait_for_log("client=198.51.100.7", Duration::from_secs(5)),
        "{}",
        ingress.logs()
    );

    // An over-long chain: the walk stops within its bound at a trusted hop, never reaching the
    // claim at the far left.
    let hops: Vec<String> = (0..100)
        .map(|i| format!("10.0.{}.{}", i / 200, i % 200 + 1))
        .collect();
    let long = format!("X-Forwarded-For: 203.0.113.9, {}\r\n", hops.join(", "));
    assert_eq!(send(&ingress, BALANCER, "ranged.test", &long).status, 403);
    let client = told(&send(&ingress, BALANCER, "open.test", &long), "x-real-ip").unwrap();
    assert!(client.starts_with("10.0."), "{client}");
    // A header past the head limit is refused whole (431), before anything is believed.
    let huge = format!(
        "X-Forwarded-For: {}203.0.113.9\r\n",
        "10.0.0.1, ".repeat(4000)
    );
    assert_eq!(send(&ingress, BALANCER, "ranged.test", &huge).status, 431);

    // X-Forwarded-Proto from the balancer: TLS ended in front, so no redirect to HTTPS; from
    // anyone else it is not believed.
    let proto = "X-Forwarded-Proto: https\r\nX-Forwarded-Port: 443\r\nX-Forwarded-Host: www.example.com\r\n";
    let behind = send(&ingress, BALANCER, "secure.test", proto);
    assert_eq!(told(&behind, "x-forwarded-proto").as_deref(), Some("https"));
    assert_eq!(told(&behind, "x-forwarded-port").as_deref(), Some("443"));
    assert_eq!(
        told(&behind, "x-forwarded-host").as_deref(),
        Some("www.example.com")
    );
    let direct = send(&ingress, DIRECT, "secure.test", proto);
    assert_eq!(direct.status, 308, "{}", direct.text());
    let direct = send(&ingress, DIRECT, "open.test", proto);
    assert_eq!(told(&direct, "x-forwarded-proto").as_deref(), Some("http"));
    assert_eq!(
        told(&direct, "x-forwarded-host").as_deref(),
        Some("open.test")
    );

    // HTTP/2 (h2c) is judged the same way.
    let h2 = |from: &str, xff: &str| {
        curl::write_out(
            "%{http_code}",
            &[
                "--http2-prior-knowledge",
                "--interface",
                from,
                "-H",
                "Host: ranged.test",
                "-H",
                &format!("X-Forwarded-For: {xff}"),
                &ingress.url("/who"),
            ],
        )
    };
    assert_eq!(h2(BALANCER, "198.51.100.1, 203.0.113.9"), "200");
    let reply = ingress_tests::curl::get(
        &ingress,
        "open.test",
        "/who",
        "--http2-prior-knowledge",
        &[
            "--interface",
            BALANCER,
            "-H",
            "X-Forwarded-For: 198.51.100.1, 203.0.113.9",
            "-H",
            "X-Forwarded-Proto: https",
            "-H",
            "X-Forwarded-Host: www.example.com",
        ],
    );
    let echo = reply.echo().expect("echo");
    for (header, want) in [
        ("x-real-ip", "203.0.113.9"),
        ("x-forwarded-for", "203.0.113.9"),
        ("x-forwarded-proto", "https"),
        ("x-forwarded-host", "www.example.com"),
        ("x-original-forwarded-for", "198.51.100.1, 203.0.113.9"),
    ] {
        assert_eq!(
            echo.headers.get(header).map(String::as_str),
            Some(want),
            "h2 {header}"
        );
    }
    assert_eq!(h2(BALANCER, "203.0.113.9, 198.51.100.1"), "403");
    assert_eq!(h2(DIRECT, "203.0.113.9"), "403");
}

/// Without `--proxy-real-ip-cidr` only the connecting peer is trusted: the one address it
/// appended is believed, never what the client wrote in front of it (ingress-nginx's default,
/// `0.0.0.0/0`, would believe that too). Without `--use-forwarded-headers` nothing is.
#[test]
fn without_ranges_only_the_peers_own_entry_is_believed() {
    let web = Backend::start("web");
    let dir = Scratch::new("forwarded-peer-only");
    site(&dir, &web);
    let ingress = Ingress::builder()
        .manifests(dir.path())
        .args(["--use-forwarded-headers"])
        .start();
    let spoof = "X-Forwarded-For: 203.0.113.9, 198.51.100.7\r\n";
    assert_eq!(send(&ingress, BALANCER, "ranged.test", spoof).status, 403);
    let reply = send(&ingress, BALANCER, "open.test", spoof);
    assert_eq!(told(&reply, "x-real-ip").as_deref(), Some("198.51.100.7"));
    let honest = "X-Forwarded-For: 198.51.100.7, 203.0.113.9\r\n";
    assert_eq!(send(&ingress, BALANCER, "ranged.test", honest).status, 200);
    drop(ingress);

    let off = Ingress::start(dir.path());
    let reply = send(&off, BALANCER, "open.test", honest);
    assert_eq!(told(&reply, "x-real-ip").as_deref(), Some(BALANCER));
    assert_eq!(
        told(&reply, "x-original-forwarded-for").as_deref(),
        Some("198.51.100.7, 203.0.113.9")
    );
    assert_eq!(send(&off, BALANCER, "ranged.test", honest).status, 403);
}

/// `--compute-full-forwarded-for`: the upstream gets the incoming list with the peer appended;
/// the client judged is still the one the walk finds.
#[test]
fn compute_full_forwarded_for_appends_the_peer() {
    let web = Backend::start("web");
    let dir = Scratch::new("forwarded-full");
    site(&dir, &web);
    let ingress = Ingress::builder()
        .manifests(dir.path())
        .args([
            "--use-forwarded-headers",
            "--compute-full-forwarded-for",
            "--proxy-real-ip-cidr",
            "127.0.0.2",
        ])
        .start();
    let reply = send(
        &ingress,
        BALANCER,
        "open.test",
        "X-Forwarded-For: 198.51.100.1, 203.0.113.9\r\n",
    );
    assert_eq!(
        told(&reply, "x-forwarded-for").as_deref(),
        Some("198.51.100.1, 203.0.113.9, 127.0.0.2")
    );
    assert_eq!(told(&reply, "x-real-ip").as_deref(), Some("203.0.113.9"));
    let reply = send(&ingress, DIRECT, "open.test", "");
    assert_eq!(told(&reply, "x-forwarded-for").as_deref(), Some(DIRECT));
}

/// With PROXY protocol the client the PROXY header names is the peer whose forwarded hops are
/// judged. Every hop believed must be in `proxy-real-ip-cidr`, the load balancer that sends the
/// PROXY header (here, the test on 127.0.0.1) included.
#[test]
fn behind_proxy_protocol_the_named_client_is_the_peer() {
    let web = Backend::start("web");
    let dir = Scratch::new("forwarded-proxy-protocol");
    site(&dir, &web);
    let ingress = Ingress::builder()
        .manifests(dir.path())
        .args([
            "--use-proxy-protocol",
            "--use-forwarded-headers",
            "--proxy-real-ip-cidr",
            "10.0.0.0/8,127.0.0.1/32",
        ])
        .start();
    let via = |named: &str, host: &str| {
        let request = format!(
            "PROXY TCP4 {named} 127.0.0.1 40000 {port}\r\nGET /who HTTP/1.1\r\nHost: {host}\r\nX-Forwarded-For: 203.0.113.9\r\nConnection: close\r\n\r\n",
            port = ingress.http.port()
        );
        RawConn::connect(ingress.http).exchange(request.as_bytes())
    };
    // A trusted hop named by the balancer: its forwarded client is believed.
    assert_eq!(via("10.1.1.1", "ranged.test").status, 200);
    assert_eq!(
        told(&via("10.1.1.1", "open.test"), "x-real-ip").as_deref(),
        Some("203.0.113.9")
    );
    // An untrusted client named by the balancer: its header is its own claim, not believed.
    assert_eq!(via("198.51.100.1", "ranged.test").status, 403);
    assert_eq!(
        told(&via("198.51.100.1", "open.test"), "x-real-ip").as_deref(),
        Some("198.51.100.1")
    );
}
