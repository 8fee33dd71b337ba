//! The kernel gate behind PROXY protocol (`--use-proxy-protocol`, issue 17 item 1): the
//! programs skip a v1 or v2 header to judge the ClientHello behind it, refuse a connection
//! without a valid one as userspace does, and judge source ranges by the client it names.
//!
//! ```text
//!   probe (BPF_PROG_TEST_RUN)   header + every corpus hello, and broken headers, against
//!                               `proxy_protocol::parse` + `client_hello::parse`
//!   GateServer (socket path)    header split over segments, header + a 2 KB hello in pieces
//!   the real proxy, --mode ebpf client ns ──curl --haproxy-protocol──────────────► :443
//!     (TC path and socket path) client ns ──v1──► haproxy ──send-proxy-v2────────► :443
//! ```
//!
//! Without root, kernel BTF or an embedded eBPF object the tests print a loud skip notice and
//! pass — unless CI=true, where that is a failure.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::{IpAddr, SocketAddr};
use std::process::Stdio;
use std::time::{Duration, Instant};

use ingress::client_hello;
use ingress::gate::{Reason, counter};
use ingress::proxy::proxy_protocol::{self, Parse};
use ingress_tests::corpus::{self, corpus};
use ingress_tests::gate_server::{Ending, GateServer, dropped, passed, policy, sni_of};
use ingress_tests::gate_site::{KNOWN, MAIN, STEP, Site, scrape_until};
use ingress_tests::netns::{CLIENT_IP, SERVER_IP};
use ingress_tests::preflight::preflight_tool;
use ingress_tests::tls_client::{self, Outcome, Pieces, Prefixed, https_get};
use ingress_tests::{Mode, both_modes};
use tokio::io::AsyncWriteExt;

fn v1_tcp4(client: &str) -> Vec<u8> {
    format!("PROXY TCP4 {client} 10.0.0.1 50000 443\r\n").into_bytes()
}

/// A v2 header: `command` 0 (LOCAL) or 1 (PROXY), `family` byte, addresses and TLVs.
fn v2(command: u8, family: u8, body: &[u8]) -> Vec<u8> {
    let mut out = b"\r\n\r\n\0\r\nQUIT\n".to_vec();
    out.push(0x20 | command);
    out.push(family);
    out.extend_from_slice(&u16::try_from(body.len()).unwrap().to_be_bytes());
    out.extend_from_slice(body);
    out
}

fn v2_tcp4(client: [u8; 4]) -> Vec<u8> {
    let body = [&client[..], &[10, 0, 0, 1], &[0xC3, 0x50, 0x01, 0xBB]].concat();
    v2(1, 0x11, &body)
}

fn v2_tcp6_with_tlv() -> Vec<u8> {
    let mut body = "2001:db8::7"
        .parse::<std::net::Ipv6Addr>()
        .unwrap()
        .octets()
        .to_vec();
    body.extend_from_slice(
        &"2001:db8::1"
            .parse::<std::net::Ipv6Addr>()
            .unwrap()
            .octets(),
    );
    body.extend_from_slice(&[0xC3, 0x50, 0x01, 0xBB]);
    // An AWS NLB's VPC endpoint TLV.
    body.extend_from_slice(&[0xEA, 0x00, 0x05, 0x01, b'v', b'p', b'c', b'e']);
    v2(1, 0x21, &body)
}

/// The headers load balancers send, by name.
fn headers() -> Vec<(&'static str, Vec<u8>)> {
    vec![
        ("v1 TCP4", v1_tcp4("203.0.113.7")),
        (
            "v1 TCP6",
            b"PROXY TCP6 2001:db8::7 2001:db8::1 50000 443\r\n".to_vec(),
        ),
        ("v1 UNKNOWN", b"PROXY UNKNOWN\r\n".to_vec()),
        ("v2 TCP4", v2_tcp4([203, 0, 113, 7])),
        ("v2 TCP6 + TLV", v2_tcp6_with_tlv()),
        ("v2 LOCAL", v2(0, 0x00, &[])),
    ]
}

/// Both parsers' verdict: (dropped, reason, name). A connection userspace refuses for its
/// header is a drop whatever follows; the kernel says malformed for it.
type Verdict = (bool, Reason, Option<String>);

/// What userspace makes of `bytes` at the start of a connection: `proxy_protocol::parse`, then
/// the ClientHello behind the header, under the harness's policy (names in `known` pass, every
/// unnamed case is admitted).
fn userspace(bytes: &[u8], known: &[&str]) -> Verdict {
    let Parse::Header { len, .. } = proxy_protocol::parse(bytes) else {
        return (true, Reason::Malformed, None);
    };
    let parsed = client_hello::parse(&bytes[len..]);
    match client_hello::gate(&parsed) {
        Ok(name) if known.contains(&name.as_str()) => (false, Reason::Pass, Some(name.to_string())),
        Ok(name) => (true, Reason::Unknown, Some(name.to_string())),
        Err(reason) => (false, reason, None),
    }
}

/// The kernel's verdict on `bytes`, then userspace's own parse of the header of a connection
/// the kernel passed (as `TlsHandshake` does before TLS): the end result for the client.
fn kernel(h: &GateServer, label: &str, bytes: &[u8]) -> (Verdict, u32) {
    let got = h
        .gate
        .probe(bytes)
        .unwrap_or_else(|e| panic!("{label}: probe: {e}"));
    let mut verdict = (got.drop, got.reason, got.name.clone());
    if !got.drop && !matches!(proxy_protocol::parse(bytes), Parse::Header { .. }) {
        verdict = (true, Reason::Malformed, None);
    }
    (verdict, got.record_len)
}

#[tokio::test]
async fn corpus_hellos_behind_every_header_get_the_same_verdict() {
    let files = corpus::all();
    let known = ["openssl.example.test", "chromium.example.test"];
    let Some(h) = GateServer::start_behind_proxy_protocol("pp-corpus", policy(&known)).await else {
        return;
    };
    let mut mismatches = Vec::new();
    let mut checked = 0;
    for (header_name, header) in headers() {
        for (file, hello) in &files {
            let bytes = [header.as_slice(), hello].concat();
            let label = format!("{header_name} + {file}");
            let want = userspace(&bytes, &known);
            let (got, record_len) = kernel(&h, &label, &bytes);
            if got != want {
                mismatches.push(format!("{label}: kernel {got:?}, userspace {want:?}"));
            }
            // A whole record behind the header: the message is exactly header + record.
            if let Ok(parsed) = client_hello::parse(hello) {
                let want_len = header.len() + parsed.record_len;
                if record_len as usize != want_len {
                    mismatches.push(format!("{label}: record_len {record_len}, want {want_len}"));
                }
            }
            checked += 1;
        }
    }
    assert!(mismatches.is_empty(), "{}", mismatches.join("\n"));
    assert!(checked >= 6 * 20, "the corpus went missing");
    // Every pass above had a valid header; nothing counted as a refused header.
    let counters = h.gate.counters().expect("counters");
    assert_eq!(
        counters.get(counter::PROXY_HEADER_REFUSED),
        0,
        "{counters:?}"
    );
}

#[tokio::test]
async fn broken_headers_are_refused_as_userspace_refuses_them() {
    let hello = corpus("openssl-tls13-sni.bin");
    let known = ["openssl.example.test"];
    let with_hello = |header: &[u8]| [header, hello.as_slice()].concat();
    let mut long_v1 = b"PROXY UNKNOWN ".to_vec();
    long_v1.resize(105, b'x');
    long_v1.extend_from_slice(b"\r\n");
    let mut huge_v2 = v2(1, 0x11, &[0; 12]);
    huge_v2[14..16].copy_from_slice(&4081u16.to_be_bytes());
    // (label, bytes, refused by both)
    let cases: Vec<(&str, Vec<u8>, bool)> = vec![
        ("no header", hello.clone(), true),
        ("truncated v1", b"PROXY TCP4 203.0.".to_vec(), true),
        (
            "truncated v2",
            v2_tcp4([203, 0, 113, 7])[..20].to_vec(),
            true,
        ),
        (
            "v1 lower case",
            with_hello(b"proxy TCP4 203.0.113.7 10.0.0.1 1 2\r\n"),
            true,
        ),
        (
            "v1 TCP5",
            with_hello(b"PROXY TCP5 203.0.113.7 10.0.0.1 1 2\r\n"),
            true,
        ),
        ("v1 bad octet", with_hello(&v1_tcp4("203.0.113.999")), true),
        (
            "v1 leading zero",
            with_hello(&v1_tcp4("203.0.113.07")),
            true,
        ),
        ("v1 three octets", with_hello(&v1_tcp4("203.0.113")), true),
        ("v1 LF only", with_hello(b"PROXY UNKNOWN\n"), true),
        (
            "v1 108 bytes",
            with_hello(&[&long_v1[..105], b"x\r\n"].concat()),
            true,
        ),
        ("v1 107 bytes", with_hello(&long_v1[..]), false),
        // The kernel leaves the destination and ports to userspace, which refuses it.
        (
            "v1 bad port",
            with_hello(b"PROXY TCP4 203.0.113.7 10.0.0.1 99999 443\r\n"),
            true,
        ),
        (
            "v2 version 3",
            with_hello(&{
                let mut h = v2_tcp4([1, 2, 3, 4]);
                h[12] = 0x31;
                h
            }),
            true,
        ),
        ("v2 command 2", with_hello(&v2(2, 0x11, &[0; 12])), true),
        ("v2 family 4", with_hello(&v2(1, 0x41, &[0; 12])), true),
        ("v2 protocol 3", with_hello(&v2(1, 0x13, &[0; 12])), true),
        ("v2 IPv4 short", with_hello(&v2(1, 0x11, &[0; 8])), true),
        ("v2 past 4096 bytes", huge_v2, true),
        ("v2 AF_UNIX", with_hello(&v2(1, 0x31, &[0; 216])), false),
        ("header without hello", v2_tcp4([203, 0, 113, 7]), false),
    ];
    let Some(h) = GateServer::start_behind_proxy_protocol("pp-broken", policy(&known)).await else {
        return;
    };
    let mut mismatches = Vec::new();
    for (label, bytes, refused) in &cases {
        let want = userspace(bytes, &known);
        let (got, _) = kernel(&h, label, bytes);
        eprintln!("{label:24} kernel {got:?} userspace {want:?}");
        if got != want || got.0 != *refused {
            mismatches.push(format!(
                "{label}: kernel {got:?}, userspace {want:?}, refused {refused}"
            ));
        }
    }
    assert!(mismatches.is_empty(), "{}", mismatches.join("\n"));
    let counters = h.gate.counters().expect("counters");
    assert!(
        counters.get(counter::PROXY_HEADER_REFUSED) >= 14,
        "{counters:?}"
    );
}

/// The socket path: the stream parser frames the header and the first record as one message,
/// however they are cut into segments, and userspace gets exactly those bytes.
#[tokio::test]
async fn the_parser_frames_header_and_record_across_segments() {
    let known = ["openssl.example.test", "chromium.example.test"];
    let Some(mut h) = GateServer::start_behind_proxy_protocol("pp-split", policy(&known)).await
    else {
        return;
    };
    let pause = Duration::from_millis(50);

    // The header alone split in two, then the hello.
    let header = v1_tcp4("203.0.113.7");
    let hello = corpus("openssl-tls13-sni.bin");
    let ending = h.send(&[&header[..9], &header[9..], &hello], pause).await;
    assert!(!matches!(ending, Ending::Reset(_)), "{ending:?}");
    let served = h.next().await;
    let verdict = passed(&served);
    let record = served.record.expect("a record");
    assert_eq!(
        record,
        [header.as_slice(), &hello].concat(),
        "header and record, exactly"
    );
    assert_eq!(verdict.record_len as usize, record.len());

    // A v2 header and a 2 KB post-quantum hello, cut inside the header and twice in the hello.
    let header = v2_tcp4([198, 51, 100, 20]);
    let hello = corpus("chromium-1.bin");
    assert!(hello.len() > 1500, "{} bytes", hello.len());
    let message = [header.as_slice(), &hello].concat();
    let ending = h
        .send(&[&message[..10], &message[10..900], &message[900..]], pause)
        .await;
    assert!(!matches!(ending, Ending::Reset(_)), "{ending:?}");
    let served = h.next().await;
    assert_eq!(passed(&served).reason, Reason::Pass);
    let record = served.record.expect("a record");
    assert_eq!(record, message);
    assert_eq!(
        sni_of(&record[header.len()..]).as_deref(),
        Some("chromium.example.test")
    );

    // An unknown name behind a valid header, and a hello without a header: reset, nothing read.
    let header = v2_tcp4([203, 0, 113, 7]);
    let unknown = corpus("curl-tls13.bin");
    for (label, chunks, reason) in [
        (
            "unknown",
            vec![header.clone(), unknown.clone()],
            Reason::Unknown,
        ),
        ("no header", vec![unknown.clone()], Reason::Malformed),
    ] {
        let refs: Vec<&[u8]> = chunks.iter().map(Vec::as_slice).collect();
        let ending = h.send(&refs, pause).await;
        assert!(matches!(ending, Ending::Reset(_)), "{label}: {ending:?}");
        let served = h.next().await;
        assert_eq!(dropped(&served).reason, reason, "{label}");
        assert!(served.record.is_none(), "{label}");
    }
    let counters = h.gate.counters().expect("counters");
    assert_eq!(
        counters.get(counter::PROXY_HEADER_REFUSED),
        1,
        "{counters:?}"
    );
    assert!(counters.get(counter::PARSER_WAITED) >= 2, "{counters:?}");
}

/// The range the site's ranged host allows, and two clients a header can name.
/// As long as the name in the corpus's openssl hello, so that hello can name it (and under
/// the site certificate's wildcard).
const RANGED: &str = "openssl-ab.wild.test";
const INSIDE: &str = "203.0.113.9";
const OUTSIDE: &str = "198.51.100.20";

/// The site: `KNOWN` for anyone, `RANGED` only for 203.0.113.0/24.
fn site(tag: &str) -> Option<Site> {
    let site = Site::new(tag, &[KNOWN])?;
    let yaml = format!(
        "---\napiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata:\n  name: ranged\n  namespace: t\n  annotations:\n    nginx.ingress.kubernetes.io/whitelist-source-range: \"203.0.113.0/24\"\nspec:\n  ingressClassName: ingress\n  tls: [{{hosts: [\"{RANGED}\"], secretName: site-tls}}]\n  rules:\n  - host: \"{RANGED}\"\n    http: {{paths: [{{path: /, pathType: Prefix, backend: {{service: {{name: web, port: {{number: 80}}}}}}}}]}}\n"
    );
    let tmp = site.dir.path().join(".ranged.yaml.tmp");
    std::fs::write(&tmp, yaml).expect("write manifests");
    std::fs::rename(&tmp, site.manifests().join("ranged.yaml")).expect("rename manifests");
    Some(site)
}

/// `curl --haproxy-protocol https://<name>/` from the client namespace: the status, or the
/// exit code when curl failed.
async fn curl_proxied(site: &Site, name: &str) -> Result<u16, Option<i32>> {
    curl_https(site, name, true).await
}

/// `curl https://<name>/` from the client namespace, with a PROXY v1 header when `proxied`.
async fn curl_https(site: &Site, name: &str, proxied: bool) -> Result<u16, Option<i32>> {
    let extra: &[&str] = if proxied {
        &["--haproxy-protocol"]
    } else {
        &[]
    };
    site.curl_to(IpAddr::V4(SERVER_IP), name, MAIN.https, "/", None, extra)
        .await
}

/// `GET /` over TLS for `name` behind `header`: in the same segment as the ClientHello (the
/// TC path judges it before accept), or when `split` on its own, then the hello in pieces (the
/// socket path, after the parser reassembled them).
async fn get_after(site: &Site, header: &[u8], name: &str, split: bool) -> Outcome {
    let mut stream = site.connect(MAIN.https).await;
    if split {
        stream.write_all(header).await.expect("write the header");
        let pieces = Pieces::new(stream, &[5, 150], Duration::from_millis(100));
        https_get(pieces, &site.clients, Some(name), name).await
    } else {
        https_get(
            Prefixed::new(stream, header),
            &site.clients,
            Some(name),
            name,
        )
        .await
    }
}

fn accepted(s: &ingress_tests::scrape::Scrape) -> f64 {
    s.value("ingress_connections_total", &[("listener", "https")])
}

/// The real proxy in eBPF mode starts with `--use-proxy-protocol`, serves curl's v1 header
/// and raw v2 ones, resets an unknown name before accept, and refuses by the header's client.
#[tokio::test]
async fn ebpf_mode_serves_behind_proxy_protocol() {
    let Some(site) = site("pp-ebpf") else {
        return;
    };
    let proxy = site.start(Mode::Ebpf, &["--use-proxy-protocol"]);
    assert!(proxy.logs().contains("eBPF mode"), "{}", proxy.logs());

    assert_eq!(
        curl_proxied(&site, KNOWN).await,
        Ok(200),
        "{}",
        proxy.logs()
    );
    // curl names its own address (10.231.0.2): outside the ranged host's allow-list.
    assert!(curl_proxied(&site, RANGED).await.is_err());

    let header = |client: &str| v1_tcp4(client);
    // rustls's hello (post-quantum key share) and the header span two segments: the socket
    // path judges these.
    assert_eq!(
        get_after(&site, &header(INSIDE), RANGED, false).await,
        Outcome::Served(200),
        "{}",
        proxy.logs()
    );
    let v2_inside = v2_tcp4([203, 0, 113, 9]);
    assert_eq!(
        get_after(&site, &v2_inside, RANGED, true).await,
        Outcome::Served(200),
        "a split hello behind a v2 header"
    );

    let before = proxy.scrape();
    // The header and openssl's hello in one segment: judged by the TC program before accept.
    let hello = corpus::renamed(
        &corpus("openssl-tls13-sni.bin"),
        "openssl.example.test",
        RANGED,
    );
    let send = async |bytes: Vec<u8>| site.send(MAIN.https, &[&bytes], Duration::ZERO).await;
    let inside = send([header(INSIDE), hello.clone()].concat()).await;
    assert!(
        matches!(inside, tls_client::Ending::Answered(_)),
        "a ServerHello: {inside:?}"
    );
    let outside = send([header(OUTSIDE), hello.clone()].concat()).await;
    assert!(
        matches!(outside, tls_client::Ending::Reset(_)),
        "{outside:?}"
    );
    let unknown = send([header(INSIDE), corpus("curl-tls13.bin")].concat()).await;
    assert!(
        matches!(unknown, tls_client::Ending::Reset(_)),
        "{unknown:?}"
    );
    let bare = send(hello.clone()).await;
    assert!(matches!(bare, tls_client::Ending::Reset(_)), "{bare:?}");
    // curl with an unknown name: it writes its header on its own, so whichever path sees the
    // connection whole refuses it.
    assert!(curl_proxied(&site, "nobody.wild.test").await.is_err());
    // The socket path refuses by the header's client too.
    assert_eq!(
        get_after(&site, &header(OUTSIDE), RANGED, true).await,
        Outcome::Reset
    );

    let after = scrape_until(&proxy, "the refusals", |s| {
        s.kernel("proxy_header_refused") > before.kernel("proxy_header_refused")
            && s.kernel("unknown") >= before.kernel("unknown") + 2.0
            && s.kernel("source_refused") >= before.kernel("source_refused") + 2.0
    })
    .await;
    let delta = |name: &str| after.kernel(name) - before.kernel(name);
    assert_eq!(delta("passed_before_accept"), 1.0, "{}", after.0);
    assert_eq!(delta("source_refused"), 2.0, "{}", after.0);
    assert_eq!(
        delta("reset_before_accept_source_refused"),
        1.0,
        "{}",
        after.0
    );
    assert_eq!(delta("unknown"), 2.0, "{}", after.0);
    let curl_early = delta("reset_before_accept_unknown") - 1.0;
    assert!(curl_early == 0.0 || curl_early == 1.0, "{}", after.0);
    assert_eq!(delta("reset_before_accept_malformed"), 1.0, "{}", after.0);
    assert_eq!(delta("proxy_header_refused"), 1.0, "{}", after.0);
    // Accepted: the early pass, the split hello the socket path refused, and curl's unknown
    // name if the socket path refused it.
    assert_eq!(
        accepted(&after) - accepted(&before),
        3.0 - curl_early,
        "{}",
        after.0
    );
    eprintln!(
        "curl's unknown name reset before accept: {}",
        curl_early == 1.0
    );
    assert!(!proxy.logs().contains("ERROR"), "{}", proxy.logs());
}

both_modes!(the_configmap_switches_proxy_protocol_live);

/// The ConfigMap's `use-proxy-protocol`, without the flag: on, the listeners and the kernel
/// gate expect the header (also after a publish that changes no name, which rewrites the
/// gate's CONFIG); off again, plain clients are served and headers are refused, with no
/// restart.
async fn the_configmap_switches_proxy_protocol_live(mode: Mode) {
    let Some(site) = site(&format!("pp-live-{}", mode.flag())) else {
        return;
    };
    let write_config = |on: bool| {
        let yaml = format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: ingress-config, namespace: t}}\ndata: {{use-proxy-protocol: \"{on}\"}}\n"
        );
        let tmp = site.dir.path().join(".config.yaml.tmp");
        std::fs::write(&tmp, yaml).expect("write the ConfigMap");
        std::fs::rename(&tmp, site.manifests().join("config.yaml")).expect("rename");
    };
    write_config(true);
    let proxy = site.start(mode, &["--configmap", "t/ingress-config"]);
    assert_eq!(
        curl_https(&site, KNOWN, true).await,
        Ok(200),
        "{}",
        proxy.logs()
    );
    assert!(curl_https(&site, KNOWN, false).await.is_err());

    // A publish that keeps every name: the gate rewrites only its CONFIG, which must keep
    // expecting the header.
    let generation =
        |s: &ingress_tests::scrape::Scrape| s.value("ingress_snapshot_generation", &[]);
    let before = generation(&proxy.scrape());
    let tmp = site.dir.path().join(".other.yaml.tmp");
    std::fs::write(
        &tmp,
        "apiVersion: v1\nkind: Service\nmetadata: {name: other, namespace: t}\nspec: {ports: [{port: 80}]}\n",
    )
    .expect("write a Service");
    std::fs::rename(&tmp, site.manifests().join("other.yaml")).expect("rename");
    scrape_until(&proxy, "a publish that keeps every name", |s| {
        generation(s) > before
    })
    .await;
    assert_eq!(
        curl_https(&site, KNOWN, true).await,
        Ok(200),
        "after a publish that kept every name: {}",
        proxy.logs()
    );
    assert!(curl_https(&site, KNOWN, false).await.is_err());

    write_config(false);
    let deadline = Instant::now() + STEP;
    while curl_https(&site, KNOWN, false).await != Ok(200) {
        assert!(
            Instant::now() < deadline,
            "plain clients are not served after use-proxy-protocol: false: {}",
            proxy.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(curl_https(&site, KNOWN, true).await.is_err());
    // The plain clients refused while it was on: by the kernel, or by the listener.
    let after = proxy.scrape();
    let refused = match mode {
        Mode::Ebpf => after.kernel("proxy_header_refused"),
        Mode::Userspace => after.value(
            "ingress_proxy_protocol_errors_total",
            &[("listener", "https"), ("reason", "invalid")],
        ),
    };
    assert!(refused >= 2.0, "{}", after.0);
    assert!(!proxy.logs().contains("ERROR"), "{}", proxy.logs());
}

both_modes!(behind_haproxy_send_proxy_v2);

/// haproxy in the client namespace as the load balancer: it accepts the test's v1 header (the
/// "real" client) and sends its own v2 header on to the proxy; both modes give the same
/// verdicts, by the name and by the client the header names.
async fn behind_haproxy_send_proxy_v2(mode: Mode) {
    if !preflight_tool("haproxy") {
        return;
    }
    let Some(site) = site(&format!("pp-haproxy-{}", mode.flag())) else {
        return;
    };
    let proxy = site.start(mode, &["--use-proxy-protocol"]);
    let front = SocketAddr::new(IpAddr::V4(CLIENT_IP), 8443);
    let config = site.dir.write(
        "haproxy.cfg",
        &format!(
            "global\n  maxconn 100\ndefaults\n  mode tcp\n  timeout connect 5s\n  timeout client 10s\n  timeout server 10s\n\
             frontend https_in\n  bind {front} accept-proxy\n  default_backend ingress\n\
             backend ingress\n  server ingress {SERVER_IP}:{} send-proxy-v2\n",
            MAIN.https
        ),
    );
    let _haproxy = site
        .pair
        .client
        .command("haproxy")
        .arg("-db")
        .arg("-f")
        .arg(&config)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("start haproxy");
    let deadline = Instant::now() + STEP;
    loop {
        let socket = site.pair.client.tcp_sockets(1).pop().expect("a socket");
        if let Ok(Ok(_)) = tokio::time::timeout(STEP, socket.connect(front)).await {
            break;
        }
        assert!(Instant::now() < deadline, "haproxy did not start");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let through = async |client: &str, name: &str| {
        let socket = site.pair.client.tcp_sockets(1).pop().expect("a socket");
        let mut stream = socket.connect(front).await.expect("connect to haproxy");
        stream.write_all(&v1_tcp4(client)).await.expect("header");
        https_get(stream, &site.clients, Some(name), name).await
    };

    let before = proxy.scrape();
    assert_eq!(
        through(INSIDE, KNOWN).await,
        Outcome::Served(200),
        "{}",
        proxy.logs()
    );
    assert_eq!(through(INSIDE, RANGED).await, Outcome::Served(200));
    assert!(!matches!(
        through(OUTSIDE, RANGED).await,
        Outcome::Served(_)
    ));
    // haproxy sees the reset as its server failing; its client sees the connection end.
    assert!(!matches!(
        through(INSIDE, "nobody.test").await,
        Outcome::Served(_)
    ));
    let after = scrape_until(&proxy, "the refusals", |s| {
        s.gate("source_refused") > before.gate("source_refused")
            && s.gate("unknown") > before.gate("unknown")
    })
    .await;
    let gate = |name: &str| after.gate(name) - before.gate(name);
    assert_eq!(gate("source_refused"), 1.0, "{}", after.0);
    assert_eq!(gate("unknown"), 1.0, "{}", after.0);
    assert_eq!(gate("pass"), 2.0, "{}", after.0);
    if mode == Mode::Ebpf {
        let kernel = |name: &str| after.kernel(name) - before.kernel(name);
        assert_eq!(kernel("source_refused"), 1.0, "{}", after.0);
        assert_eq!(kernel("unknown"), 1.0, "{}", after.0);
        assert_eq!(kernel("proxy_header_refused"), 0.0, "{}", after.0);
    }
}
