//! Source ranges at the gate (issue 17 item 2), through the real proxy in both modes: a client
//! inside a host's allow-list completes TLS and gets 200; one outside it, or inside a deny range
//! nested in the allow-list, is reset before any handshake: in eBPF mode before accept, by the
//! TC program's SOURCES lookup (the kernel's counter moves, the proxy accepts nothing), in
//! userspace mode after accept with the same reason. A host whose paths differ in policy is not
//! judged by the gate: the access phase's 403 answers. A split ClientHello is judged by the
//! stream verdict, and a passthrough host's allow-list (set live) by the gate too; IPv6 clients
//! are judged by their own address, against IPv6 and IPv4-only lists. One corpus of
//! addresses, IPv4 and IPv6, gets the same verdict from the kernel's own LPM lookup in the
//! loaded trie as from the access phase.
//!
//! ```text
//!   client ns 10.231.0.2 (allowed) ─┐
//!             10.231.0.3 (refused) ─┴─ veth ─► server ns 10.231.0.1 ingress :443
//! ```
//!
//! Without root, kernel BTF or an embedded eBPF object the tests print a loud skip notice and
//! pass — unless CI=true, where that is a failure (`gate_site`'s preflight).

// Setup helpers fail the test with a message, as the test bodies do.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use ingress_tests::bpftool;
use ingress_tests::gate_site::{KNOWN, MAIN, STEP, Site, scrape_until, server};
use ingress_tests::netns::CLIENT_IP;
use ingress_tests::scrape::Scrape;
use ingress_tests::tls_client::{Outcome, Pieces, https_get};
use ingress_tests::{Mode, both_modes};
use tokio::net::TcpStream;

/// The client namespace's second address: outside every allow-list below.
const OTHER_IP: Ipv4Addr = Ipv4Addr::new(10, 231, 0, 3);
/// Allows the client's main address only.
const ALLOWED: &str = "stay.test";
/// Allows the whole /24 but denies `OTHER_IP` inside it.
const NESTED: &str = "new.test";
/// `/` allows the client's main address only, `/open` (another Ingress) has no ranges.
const MIXED: &str = "gone.test";

/// An Ingress `name` on `host` and `path` to the site's backend, with TLS and `annotations`.
fn ingress(name: &str, host: &str, path: &str, annotations: &[(&str, &str)]) -> String {
    let mut out = format!(
        "---\napiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata:\n  name: {name}\n  namespace: t\n"
    );
    if !annotations.is_empty() {
        out += "  annotations:\n";
        for (key, value) in annotations {
            out += &format!("    nginx.ingress.kubernetes.io/{key}: \"{value}\"\n");
        }
    }
    out += &format!(
        "spec:\n  ingressClassName: ingress\n  tls: [{{hosts: [\"{host}\"], secretName: site-tls}}]\n  rules:\n  - host: \"{host}\"\n    http: {{paths: [{{path: {path}, pathType: Prefix, backend: {{service: {{name: web, port: {{number: 80}}}}}}}}]}}\n"
    );
    out
}

/// The site with the ranged Ingresses beside the plain `KNOWN` one, and the client's second
/// address.
fn site(tag: &str) -> Option<Site> {
    let site = Site::new(tag, &[KNOWN])?;
    let only_client = format!("{CLIENT_IP}/32");
    let yaml = [
        ingress(
            "allowed",
            ALLOWED,
            "/",
            &[("whitelist-source-range", &only_client)],
        ),
        ingress(
            "nested",
            NESTED,
            "/",
            &[
                ("allowlist-source-range", "10.231.0.0/24"),
                ("denylist-source-range", &format!("{OTHER_IP}")),
            ],
        ),
        ingress(
            "mixed-ranged",
            MIXED,
            "/",
            &[("whitelist-source-range", &only_client)],
        ),
        ingress("mixed-open", MIXED, "/open", &[]),
    ]
    .concat();
    let tmp = site.dir.path().join(".ranges.yaml.tmp");
    std::fs::write(&tmp, yaml).expect("write manifests");
    std::fs::rename(&tmp, site.manifests().join("ranges.yaml")).expect("rename manifests");
    site.pair
        .client
        .ip(&["addr", "add", &format!("{OTHER_IP}/24"), "dev", "veth0"])
        .expect("a second client address");
    Some(site)
}

fn accepted(s: &Scrape) -> f64 {
    s.value("ingress_connections_total", &[("listener", "https")])
}

both_modes!(clients_outside_a_hosts_ranges_are_refused_at_the_gate);

async fn clients_outside_a_hosts_ranges_are_refused_at_the_gate(mode: Mode) {
    let Some(site) = site(&format!("src-{}", mode.flag())) else {
        return;
    };
    let proxy = site.start(mode, &[]);
    let (client, other) = (IpAddr::V4(CLIENT_IP), IpAddr::V4(OTHER_IP));
    let curl = |host: &'static str, path: &'static str, from: IpAddr| {
        site.curl_from(host, MAIN.https, path, Some(from))
    };

    // Inside the ranges: served, from either address where both are allowed.
    assert_eq!(
        curl(ALLOWED, "/", client).await,
        Ok(200),
        "{}",
        proxy.logs()
    );
    assert_eq!(curl(NESTED, "/", client).await, Ok(200));
    assert_eq!(
        curl(KNOWN, "/", other).await,
        Ok(200),
        "no ranges, no refusal"
    );

    let before = proxy.scrape();
    // Outside the allow-list, and inside a deny range nested in one: reset, no handshake.
    assert!(
        curl(ALLOWED, "/", other).await.is_err(),
        "outside the allow-list"
    );
    assert!(
        curl(NESTED, "/", other).await.is_err(),
        "in the nested deny range"
    );
    let after = scrape_until(&proxy, "two source refusals", |s| {
        s.gate("source_refused") >= before.gate("source_refused") + 2.0
    })
    .await;
    assert_eq!(
        after.gate("source_refused") - before.gate("source_refused"),
        2.0
    );
    assert_eq!(
        after.handshakes(),
        before.handshakes(),
        "a handshake started"
    );
    if mode == Mode::Ebpf {
        let delta = |name: &str| after.kernel(name) - before.kernel(name);
        assert_eq!(delta("source_refused"), 2.0, "{}", after.0);
        assert_eq!(
            delta("reset_before_accept_source_refused"),
            2.0,
            "{}",
            after.0
        );
        assert_eq!(
            accepted(&after),
            accepted(&before),
            "a connection was accepted"
        );
    }

    // Paths that differ in policy: the gate admits, the access phase answers.
    assert_eq!(curl(MIXED, "/", other).await, Ok(403));
    assert_eq!(curl(MIXED, "/open", other).await, Ok(200));
    assert_eq!(curl(MIXED, "/", client).await, Ok(200));
    let last = proxy.scrape();
    assert_eq!(
        last.gate("source_refused"),
        after.gate("source_refused"),
        "the mixed host was judged at the gate"
    );

    if mode == Mode::Ebpf {
        // The ranges are readable in the pinned trie, with BTF.
        let dump = bpftool::dump_text(&site.pins.path().join("sources"));
        assert!(dump.contains("\"verdict\": 2"), "{dump}");
        assert!(dump.contains("\"policy\""), "{dump}");
        let hosts = bpftool::dump_text(&site.pins.path().join("hosts"));
        assert!(hosts.contains("\"policy\""), "{hosts}");
    }
    assert!(!proxy.logs().contains("ERROR"), "{}", proxy.logs());
}

/// A connection to the HTTPS port from the client namespace's address `from`.
async fn connect_from(site: &Site, from: Ipv4Addr) -> TcpStream {
    let socket = site.pair.client.tcp_sockets(1).pop().expect("a socket");
    socket
        .bind(SocketAddr::new(IpAddr::V4(from), 0))
        .expect("bind the client address");
    let stream = tokio::time::timeout(STEP, socket.connect(server(MAIN.https)))
        .await
        .expect("connect in time")
        .expect("connect");
    stream.set_nodelay(true).expect("nodelay");
    stream
}

both_modes!(a_split_client_hello_is_judged_by_source_on_the_socket_path);

/// A ClientHello in pieces is not judged by the TC program but by the stream verdict, after
/// the kernel reassembled it: the same ranges apply there, with the socket's remote address.
async fn a_split_client_hello_is_judged_by_source_on_the_socket_path(mode: Mode) {
    let Some(site) = site(&format!("srcsplit-{}", mode.flag())) else {
        return;
    };
    let proxy = site.start(mode, &[]);
    let split = |stream| Pieces::new(stream, &[5, 150], Duration::from_millis(100));

    let before = proxy.scrape();
    let stream = split(connect_from(&site, CLIENT_IP).await);
    let outcome = https_get(stream, &site.clients, Some(ALLOWED), ALLOWED).await;
    assert_eq!(outcome, Outcome::Served(200), "logs:\n{}", proxy.logs());

    let stream = split(connect_from(&site, OTHER_IP).await);
    let outcome = https_get(stream, &site.clients, Some(ALLOWED), ALLOWED).await;
    assert_eq!(outcome, Outcome::Reset, "logs:\n{}", proxy.logs());
    let after = scrape_until(&proxy, "one source refusal", |s| {
        s.gate("source_refused") > before.gate("source_refused")
    })
    .await;
    assert_eq!(
        after.gate("source_refused") - before.gate("source_refused"),
        1.0
    );
    assert_eq!(after.gate("pass") - before.gate("pass"), 1.0);
    if mode == Mode::Ebpf {
        let delta = |name: &str| after.kernel(name) - before.kernel(name);
        assert_eq!(delta("source_refused"), 1.0, "{}", after.0);
        // Judged after reassembly, by the stream verdict: not before accept.
        assert_eq!(delta("reset_before_accept_source_refused"), 0.0);
        assert!(delta("parser_waited") >= 2.0, "the hellos arrived whole");
    }
}

both_modes!(a_passthrough_hosts_ranges_refuse_at_the_gate);

/// An `ssl-passthrough` host with an allow-list: its one route decides, so the gate judges it.
/// The allowed client reaches the backend's own TLS; the other address is reset without the
/// backend ever being dialled.
async fn a_passthrough_hosts_ranges_refuse_at_the_gate(mode: Mode) {
    use ingress_tests::netns::NetChain;
    use ingress_tests::passthrough::{DB, HTTPS, Site as PassSite};
    use ingress_tests::tls_client::{client_hello, send_raw};

    let Some(site) = PassSite::start(&format!("srcpt-{}", mode.flag()), mode, &[]).await else {
        return;
    };
    let other = Ipv4Addr::new(10, 241, 0, 3);
    site.net
        .client
        .ip(&["addr", "add", &format!("{other}/24"), "dev", "c0"])
        .expect("a second client address");
    // The db Ingress is the first passthrough one in the site's manifests: give it an
    // allow-list of the client's main address, live.
    let file = site.dir.path().join("manifests/site.yaml");
    let yaml = std::fs::read_to_string(&file).expect("read manifests");
    let plain = "annotations: {nginx.ingress.kubernetes.io/ssl-passthrough: \"true\"}";
    let ranged = format!(
        "annotations: {{nginx.ingress.kubernetes.io/ssl-passthrough: \"true\", nginx.ingress.kubernetes.io/whitelist-source-range: \"{}/32\"}}",
        NetChain::CLIENT_IP
    );
    assert!(yaml.contains(plain), "{yaml}");
    let tmp = site.dir.path().join("manifests/.site.yaml.tmp");
    std::fs::write(&tmp, yaml.replacen(plain, &ranged, 1)).expect("write manifests");
    std::fs::rename(&tmp, &file).expect("rename manifests");

    let hello = client_hello(DB);
    let refused = || site.metric("ingress_sni_gate_total", &[("reason", "source_refused")]);
    let kernel = |counter: &str| site.metric("ingress_ebpf_gate_total", &[("counter", counter)]);
    let before_kernel = kernel("source_refused");
    // Until the new snapshot is published the other address still gets through; then it is
    // reset at the gate.
    let deadline = std::time::Instant::now() + STEP;
    loop {
        let socket = site.net.client.tcp_sockets(1).pop().expect("a socket");
        socket
            .bind(SocketAddr::new(IpAddr::V4(other), 0))
            .expect("bind the other address");
        let stream = tokio::time::timeout(
            STEP,
            socket.connect(SocketAddr::from((NetChain::PROXY_IP, HTTPS))),
        )
        .await
        .expect("connect in time")
        .expect("connect");
        send_raw(stream, &[&hello], Duration::ZERO).await;
        if refused() >= 1.0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never refused by source:\n{}",
            site.proxy.metrics()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(refused(), 1.0);
    if mode == Mode::Ebpf {
        // rustls' hello (with its post-quantum key share) takes two segments on this link, so
        // the stream verdict decides it rather than the TC program.
        assert_eq!(
            kernel("source_refused") - before_kernel,
            1.0,
            "{}",
            site.proxy.metrics()
        );
    }
    assert_eq!(
        site.passthrough_metric("ingress_passthrough_failures_total"),
        0.0,
        "the access phase was reached"
    );
    // The allowed client still reaches the backend's own TLS.
    let mut tls = site.tls(DB).await;
    use tokio::io::AsyncWriteExt;
    tls.write_all(b"E").await.expect("command");
    tls.flush().await.expect("flush");
}

/// One corpus for both halves: the kernel's own longest-prefix match in the SOURCES trie the
/// gate loaded (an LPM lookup from userspace is the kernel's), and the access phase's
/// `SourcePolicy::admits`, agree on every address, IPv4 and IPv6: range edges, their
/// neighbours, nested deny ranges, and a spread of addresses from a fixed generator.
#[tokio::test]
#[expect(
    clippy::cast_possible_truncation,
    reason = "addresses are cut from wider random words and neighbours on purpose"
)]
async fn the_kernels_longest_match_is_the_access_phase_verdict_on_one_corpus() {
    use aya::maps::lpm_trie::{Key, LpmTrie};
    use aya::maps::{Map, MapData};
    use ingress::snapshot::gate_sources::{GateSources, mapped_addr};
    use ingress::snapshot::sources::{SourcePolicy, parse_ranges};
    use ingress_common::{SourceData, SourceValue, source_verdict};
    use ingress_tests::gate_server::{GateServer, policy};
    use std::collections::BTreeMap;

    let ranges = |allow: Option<&str>, deny: &str| SourcePolicy {
        allow: allow.map(|a| parse_ranges(a).expect("allow").expect("a list")),
        deny: parse_ranges(deny).expect("deny").unwrap_or_default(),
    };
    let policies = [
        ("allow-one.test", ranges(Some("10.1.2.3"), "")),
        (
            "nested.test",
            ranges(Some("10.0.0.0/8, 192.168.0.0/16"), "10.9.0.0/16, 10.9.9.9"),
        ),
        (
            "deny-only.test",
            ranges(None, "203.0.113.0/24, 2001:db8:dead::/48"),
        ),
        (
            "v6.test",
            ranges(Some("2001:db8::/32, ::1"), "2001:db8:bad::/64"),
        ),
        (
            "mixed.test",
            ranges(Some("0.0.0.0/1, fd00::/8"), "127.0.0.0/8, fd00:1::/32"),
        ),
    ];
    let sources = GateSources::assign(
        policies
            .iter()
            .map(|(name, p)| (name.to_string(), p.clone()))
            .collect::<BTreeMap<_, _>>(),
    );
    let mut sni = policy(&policies.iter().map(|(n, _)| *n).collect::<Vec<_>>());
    sni.sources = sources.clone();
    let Some(h) = GateServer::start("src-corpus", sni).await else {
        return;
    };
    let map = MapData::from_pin(h.pins.path().join(ingress::gate::pins::SOURCES))
        .expect("the pinned SOURCES map");
    let trie: LpmTrie<MapData, SourceData, SourceValue> =
        LpmTrie::try_from(Map::LpmTrie(map)).expect("an LPM trie");

    // The corpus: every range's first and last address and their neighbours, then addresses
    // from a fixed 64-bit LCG, half IPv4, half IPv6 (some inside 2001:db8::/32).
    let mut corpus: Vec<std::net::IpAddr> = Vec::new();
    for (_, p) in &policies {
        for net in p.allow.iter().flat_map(|a| a.iter()).chain(p.deny.iter()) {
            for addr in [net.network(), net.broadcast()] {
                corpus.push(addr);
                let bits = match addr {
                    IpAddr::V4(a) => u128::from(u32::from(a)),
                    IpAddr::V6(a) => u128::from(a),
                };
                for neighbour in [bits.wrapping_sub(1), bits.wrapping_add(1)] {
                    corpus.push(match addr {
                        IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::from(neighbour as u32)),
                        IpAddr::V6(_) => IpAddr::V6(std::net::Ipv6Addr::from(neighbour)),
                    });
                }
            }
        }
    }
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = || {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        state
    };
    for i in 0..4000 {
        let high = next();
        corpus.push(if i % 2 == 0 {
            // Bias toward the ranges above: the top byte from a few that occur in them.
            let top = [10u32, 192, 203, 127, 1, 200][(high >> 61) as usize % 6];
            IpAddr::V4(Ipv4Addr::from(top << 24 | (high as u32 & 0x00ff_ffff)))
        } else {
            let prefix: u128 =
                [0x2001_0db8, 0xfd00_0001, 0xfd00_0000, 0x2001_0db9][(high >> 62) as usize];
            IpAddr::V6(std::net::Ipv6Addr::from(
                prefix << 96 | u128::from(next()) << 32 | u128::from(high as u32),
            ))
        });
    }

    let (mut checked, mut refused) = (0, 0);
    for (id, p) in &sources.policies {
        for client in &corpus {
            let key = Key::new(
                SourceData::FULL_BITS,
                SourceData {
                    policy: *id,
                    addr: mapped_addr(*client).octets(),
                },
            );
            let kernel = trie
                .get(&key, 0)
                .expect("every policy has a /0 entry")
                .verdict;
            let want = if p.admits(*client) {
                source_verdict::ADMIT
            } else {
                source_verdict::REFUSE
            };
            assert_eq!(kernel, want, "policy {p:?}, client {client}");
            checked += 1;
            refused += usize::from(kernel == source_verdict::REFUSE);
        }
    }
    assert!(checked > 20_000, "{checked}");
    assert!(
        refused > checked / 10 && refused < checked * 9 / 10,
        "both verdicts are exercised: {refused} of {checked} refused"
    );
    eprintln!("{checked} (policy, client) pairs agree, {refused} refused");
}

both_modes!(ipv6_clients_are_judged_by_their_own_address);

/// IPv6 through the gate, in both modes: the veth pair gets IPv6 addresses and the proxy
/// listens dual-stack. A host whose allow-list is an IPv6 range (with a deny address nested in
/// it) admits a client inside it and resets one on the deny address before any handshake (in
/// eBPF mode, the TC program reads the client from the IPv6 header); a host whose allow-list
/// is IPv4 only refuses every IPv6 client; a host without ranges serves them.
async fn ipv6_clients_are_judged_by_their_own_address(mode: Mode) {
    const SERVER_V6: &str = "fd00:231::1";
    const CLIENT_V6: &str = "fd00:231::2";
    const OTHER_V6: &str = "fd00:231::3";
    const V6_HOST: &str = "v6.wild.test";
    let Some(site) = site(&format!("src6-{}", mode.flag())) else {
        return;
    };
    // nodad: usable at once, without duplicate address detection's wait.
    for (ns, addr) in [
        (&site.pair.server, SERVER_V6),
        (&site.pair.client, CLIENT_V6),
        (&site.pair.client, OTHER_V6),
    ] {
        ns.ip(&[
            "addr",
            "add",
            &format!("{addr}/64"),
            "dev",
            "veth0",
            "nodad",
        ])
        .expect("an IPv6 address");
    }
    let tmp = site.dir.path().join(".v6.yaml.tmp");
    std::fs::write(
        &tmp,
        ingress(
            "v6",
            V6_HOST,
            "/",
            &[
                ("allowlist-source-range", "fd00:231::/64"),
                ("denylist-source-range", OTHER_V6),
            ],
        ),
    )
    .expect("write manifests");
    std::fs::rename(&tmp, site.manifests().join("v6.yaml")).expect("rename manifests");
    let proxy = site.proxy().mode(mode).bind("::").start();
    let curl6 = async |name: &str, from: &str| -> Result<u16, Option<i32>> {
        let (server, from) = (SERVER_V6.parse().expect("v6"), from.parse().expect("v6"));
        site.curl_to(server, name, MAIN.https, "/", Some(from), &[])
            .await
    };

    let deadline = std::time::Instant::now() + STEP;
    // The listener and the routes are up; the first IPv6 exchange may wait for neighbour
    // discovery.
    while curl6(KNOWN, OTHER_V6).await != Ok(200) {
        assert!(
            std::time::Instant::now() < deadline,
            "no ranges: served over IPv6\n{}",
            proxy.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(curl6(V6_HOST, CLIENT_V6).await, Ok(200), "{}", proxy.logs());

    let before = proxy.scrape();
    assert!(
        curl6(V6_HOST, OTHER_V6).await.is_err(),
        "the deny address nested in the IPv6 allow-list"
    );
    assert!(
        curl6(ALLOWED, CLIENT_V6).await.is_err(),
        "an IPv4-only allow-list"
    );
    let after = scrape_until(&proxy, "two source refusals", |s| {
        s.gate("source_refused") >= before.gate("source_refused") + 2.0
    })
    .await;
    assert_eq!(
        after.gate("source_refused") - before.gate("source_refused"),
        2.0
    );
    assert_eq!(
        after.handshakes(),
        before.handshakes(),
        "a handshake started"
    );
    if mode == Mode::Ebpf {
        let delta = |name: &str| after.kernel(name) - before.kernel(name);
        assert_eq!(delta("source_refused"), 2.0, "{}", after.0);
        // curl's hello is one segment: the TC program judged both from the IPv6 header.
        assert_eq!(
            delta("reset_before_accept_source_refused"),
            2.0,
            "{}",
            after.0
        );
    }
    assert!(!proxy.logs().contains("ERROR"), "{}", proxy.logs());
}
