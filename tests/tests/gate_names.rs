//! Which names and ClientHellos the gate admits, through the real proxy in both modes (a
//! client must not be able to tell them apart): known names served to curl, openssl and rustls;
//! unknown ones reset within 50 ms before any handshake (before accept, from the TC hook, unless
//! that is off); a wildcard one label deep; hellos in pieces and Chromium's two-segment one; no
//! SNI, garbage and plain HTTP under each flag; and every corpus hello and mutant decided alike
//! in both modes and by the userspace parser.
//!
//! The site (namespaces, backend, certificate, manifests, proxies) is `ingress_tests::gate_site`.
//! Without root, kernel BTF or an embedded eBPF object the tests print a loud skip notice and
//! pass — unless CI=true, where that is a failure.

// Setup helpers fail the test with a message, as the test bodies do.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use ingress::client_hello;
use ingress_tests::corpus::{self, Xorshift, corpus, renamed};
use ingress_tests::gate_site::{KNOWN, MAIN, SECOND, Site, WILDCARD, scrape_until};
use ingress_tests::netns::SERVER_IP;
use ingress_tests::process::{Ingress, Ports};
use ingress_tests::scrape::{REASONS, Scrape, moved};
use ingress_tests::tls_client::{Ending, Outcome, Pieces, assert_fast_reset, https_get, send_raw};
use ingress_tests::{Mode, both_modes};
use tokio::net::TcpStream;

both_modes!(known_names_are_served_to_curl_and_openssl);

async fn known_names_are_served_to_curl_and_openssl(mode: Mode) {
    let Some(site) = Site::new(&format!("known-{}", mode.flag()), &[KNOWN]) else {
        return;
    };
    let proxy = site.start(mode, &[]);
    let before = proxy.scrape();
    assert_eq!(
        before.value("ingress_ebpf_enabled", &[]),
        f64::from(mode == Mode::Ebpf)
    );

    assert_eq!(
        site.curl(KNOWN).await,
        Ok(200),
        "curl; logs:\n{}",
        proxy.logs()
    );
    let out = site.openssl(Some(KNOWN), KNOWN).await;
    assert!(out.starts_with("HTTP/1.1 200"), "openssl got {out:?}");
    assert!(
        out.contains("\"backend\":\"web\""),
        "the backend answered: {out:?}"
    );

    let after = scrape_until(&proxy, "two handshakes", |s| {
        s.value("ingress_tls_handshakes_total", &[("result", "ok")]) >= 2.0
    })
    .await;
    assert_eq!(after.gate("pass") - before.gate("pass"), 2.0);
    if mode == Mode::Ebpf {
        assert_eq!(after.kernel("pass") - before.kernel("pass"), 2.0);
        // Both hellos fit one segment, so the TC program passed them before accept and their
        // sockets never joined SOCKS.
        assert_eq!(
            after.kernel("passed_before_accept") - before.kernel("passed_before_accept"),
            2.0
        );
        assert_eq!(
            after.kernel("sock_added") - before.kernel("sock_added"),
            0.0
        );
    }
}

both_modes!(an_unknown_name_is_reset_within_50_ms_before_any_handshake);

async fn an_unknown_name_is_reset_within_50_ms_before_any_handshake(mode: Mode) {
    let Some(site) = Site::new(&format!("unknown-{}", mode.flag()), &[KNOWN]) else {
        return;
    };
    let proxy = site.start(mode, &[]);
    let before = proxy.scrape();

    // curl's own hello, naming curl.example.test, which nothing serves.
    let ending = site
        .send(MAIN.https, &[&corpus("curl-tls13.bin")], Duration::ZERO)
        .await;
    assert_fast_reset(&ending, "curl's hello for an unknown name");
    let after = scrape_until(&proxy, "one unknown decision", |s| {
        s.gate("unknown") > before.gate("unknown")
    })
    .await;
    assert_eq!(after.gate("unknown") - before.gate("unknown"), 1.0);
    assert_eq!(
        after.handshakes(),
        before.handshakes(),
        "a handshake started"
    );
    if mode == Mode::Ebpf {
        assert_eq!(after.kernel("unknown") - before.kernel("unknown"), 1.0);
        assert_eq!(after.kernel("dropped") - before.kernel("dropped"), 1.0);
    }

    // Real clients see the reset as a failed connection.
    assert_eq!(site.curl("nobody.test").await.map_err(|_| ()), Err(()));
    assert_eq!(site.openssl(Some("nobody.test"), "nobody.test").await, "");
    let last = scrape_until(&proxy, "three unknown decisions", |s| {
        s.gate("unknown") >= before.gate("unknown") + 3.0
    })
    .await;
    assert_eq!(
        last.handshakes(),
        before.handshakes(),
        "a handshake started"
    );
    if mode == Mode::Ebpf {
        assert_eq!(last.kernel("unknown") - before.kernel("unknown"), 3.0);
    }
    assert!(!proxy.logs().contains("ERROR"), "{}", proxy.logs());
}

/// The TC program resets a whole single-segment ClientHello for an unknown name before the
/// kernel makes a socket: on IPv4 through the veth and on IPv6 through loopback, nothing is
/// accepted and sock_ops never sees a socket. With `--gate-interfaces none` the same hello is
/// judged after accept, as fast.
#[tokio::test]
async fn an_unknown_name_is_reset_before_accept_unless_the_early_reset_is_off() {
    let Some(site) = Site::new("before-accept", &[KNOWN]) else {
        return;
    };
    let hello = corpus("curl-tls13.bin");
    let dual_stack = |ports: Ports| site.proxy().ebpf().bind("::").ports(ports);
    let accepted = |s: &Scrape| s.value("ingress_connections_total", &[("listener", "https")]);
    let send_v6 = |port: u16| {
        let hello = hello.clone();
        async move {
            // This thread lives in the server namespace: ::1 is its loopback.
            let stream = TcpStream::connect(("::1", port))
                .await
                .expect("connect to ::1");
            send_raw(stream, &[&hello], Duration::ZERO).await
        }
    };

    let proxy = dual_stack(MAIN).start();
    let before = proxy.scrape();
    let ending = site.send(MAIN.https, &[&hello], Duration::ZERO).await;
    assert_fast_reset(&ending, "IPv4 through the veth");
    assert_fast_reset(&send_v6(MAIN.https).await, "IPv6 through loopback");
    let after = scrape_until(&proxy, "two unknown decisions", |s| {
        s.gate("unknown") >= before.gate("unknown") + 2.0
    })
    .await;
    let delta = |name: &str| after.kernel(name) - before.kernel(name);
    assert_eq!(delta("reset_before_accept_unknown"), 2.0, "{}", after.0);
    assert_eq!(delta("unknown"), 2.0);
    assert_eq!(delta("sock_added"), 0.0, "a socket was made");
    assert_eq!(
        accepted(&after),
        accepted(&before),
        "a connection was accepted"
    );
    assert_eq!(after.gate("unknown") - before.gate("unknown"), 2.0);
    assert_eq!(after.handshakes(), before.handshakes());
    // A known name in one segment is passed there too, and its socket never joins SOCKS.
    assert_eq!(site.curl(KNOWN).await, Ok(200), "{}", proxy.logs());
    let known = scrape_until(&proxy, "one pass", |s| s.gate("pass") > after.gate("pass")).await;
    let delta = |name: &str| known.kernel(name) - after.kernel(name);
    assert_eq!(delta("passed_before_accept"), 1.0, "{}", known.0);
    assert_eq!(delta("pass"), 1.0);
    assert_eq!(delta("sock_added"), 0.0);
    drop(proxy);

    let proxy = dual_stack(SECOND)
        .args(["--gate-interfaces", "none"])
        .start();
    let before = proxy.scrape();
    let ending = site.send(SECOND.https, &[&hello], Duration::ZERO).await;
    assert_fast_reset(&ending, "IPv4, early reset off");
    assert_fast_reset(&send_v6(SECOND.https).await, "IPv6, early reset off");
    let after = scrape_until(&proxy, "two unknown decisions", |s| {
        s.gate("unknown") >= before.gate("unknown") + 2.0
    })
    .await;
    let delta = |name: &str| after.kernel(name) - before.kernel(name);
    assert_eq!(delta("reset_before_accept_unknown"), 0.0, "{}", after.0);
    assert_eq!(delta("unknown"), 2.0);
    assert_eq!(delta("sock_added"), 2.0);
    assert_eq!(accepted(&after) - accepted(&before), 2.0);
    assert_eq!(site.curl_port(KNOWN, SECOND.https).await, Ok(200));
    let known = scrape_until(&proxy, "one pass", |s| s.gate("pass") > after.gate("pass")).await;
    let delta = |name: &str| known.kernel(name) - after.kernel(name);
    assert_eq!(delta("passed_before_accept"), 0.0, "{}", known.0);
    assert_eq!(delta("sock_added"), 1.0);
}

both_modes!(a_wildcard_admits_one_label_and_no_more);

async fn a_wildcard_admits_one_label_and_no_more(mode: Mode) {
    let Some(site) = Site::new(&format!("wild-{}", mode.flag()), &[WILDCARD]) else {
        return;
    };
    let proxy = site.start(mode, &[]);
    let before = proxy.scrape();
    let cases = [
        ("a.wild.test", true),
        ("A.Wild.Test", true),
        ("b.a.wild.test", false),
        ("wild.test", false),
    ];
    for (name, admitted) in cases {
        let out = site.openssl(Some(name), name).await;
        if admitted {
            assert!(out.starts_with("HTTP/1.1 200"), "{name}: {out:?}");
        } else {
            assert_eq!(out, "", "{name} should be reset");
        }
    }
    assert_eq!(site.curl("c.wild.test").await, Ok(200));
    let after = scrape_until(&proxy, "five decisions", |s| {
        s.gate("pass") + s.gate("unknown") >= before.gate("pass") + before.gate("unknown") + 5.0
    })
    .await;
    assert_eq!(after.gate("pass") - before.gate("pass"), 3.0);
    assert_eq!(after.gate("unknown") - before.gate("unknown"), 2.0);
    if mode == Mode::Ebpf {
        assert_eq!(after.kernel("pass") - before.kernel("pass"), 3.0);
        assert_eq!(after.kernel("unknown") - before.kernel("unknown"), 2.0);
    }
}

both_modes!(a_client_hello_in_three_writes_is_served);

async fn a_client_hello_in_three_writes_is_served(mode: Mode) {
    let Some(site) = Site::new(&format!("split-{}", mode.flag()), &[KNOWN]) else {
        return;
    };
    let proxy = site.start(mode, &[]);
    let before = proxy.scrape();
    // rustls' ClientHello leaves as the 5-byte record header, 145 bytes, then the rest.
    let pieces = Pieces::new(
        site.connect(MAIN.https).await,
        &[5, 150],
        Duration::from_millis(100),
    );
    let outcome = https_get(pieces, &site.clients, Some(KNOWN), KNOWN).await;
    assert_eq!(outcome, Outcome::Served(200), "logs:\n{}", proxy.logs());
    let after = proxy.scrape();
    assert_eq!(after.gate("pass") - before.gate("pass"), 1.0);
    if mode == Mode::Ebpf {
        assert!(
            after.kernel("parser_waited") > before.kernel("parser_waited"),
            "the kernel never saw a partial record"
        );
    }
}

both_modes!(chromiums_two_segment_hello_with_the_name_in_the_second);

async fn chromiums_two_segment_hello_with_the_name_in_the_second(mode: Mode) {
    // Chromium's post-quantum hello: 1929 bytes, server_name at byte 1640, past the first
    // segment's payload on this MTU-1500 link.
    let hello = corpus("chromium-2.bin");
    assert!(hello.len() > 1500);
    let Some(site) = Site::new(
        &format!("chromium-{}", mode.flag()),
        &["chromium.example.test"],
    ) else {
        return;
    };
    let proxy = site.start(mode, &[]);
    let before = proxy.scrape();

    // Known: admitted, and rustls answers with its ServerHello.
    let ending = site.send(MAIN.https, &[&hello], Duration::ZERO).await;
    match &ending {
        Ending::Answered(bytes) => assert_eq!(&bytes[..3], &[0x16, 0x03, 0x03], "a handshake"),
        other => panic!("expected rustls to answer, got {other:?}"),
    }
    let after = scrape_until(&proxy, "one pass", |s| s.gate("pass") > before.gate("pass")).await;
    if mode == Mode::Ebpf {
        assert_eq!(after.kernel("pass") - before.kernel("pass"), 1.0);
        assert!(
            after.kernel("parser_waited") > before.kernel("parser_waited"),
            "the hello arrived in one segment, so this proves nothing"
        );
    }

    // The same hello for a name of the same length that nothing serves: reset.
    let unknown = renamed(&hello, "chromium.example.test", "chromium.unknown.test");
    let ending = site.send(MAIN.https, &[&unknown], Duration::ZERO).await;
    assert_fast_reset(&ending, "Chromium's hello for an unknown name");
    let last = scrape_until(&proxy, "one unknown", |s| {
        s.gate("unknown") > after.gate("unknown")
    })
    .await;
    if mode == Mode::Ebpf {
        assert_eq!(last.kernel("unknown") - after.kernel("unknown"), 1.0);
    }
}

both_modes!(no_sni_garbage_and_plain_http_follow_the_flags);

async fn no_sni_garbage_and_plain_http_follow_the_flags(mode: Mode) {
    let Some(site) = Site::new(&format!("cases-{}", mode.flag()), &[KNOWN]) else {
        return;
    };
    // Defaults: no SNI is served (default certificate); the rest is reset. A request on it
    // for a host that has a certificate of its own is misdirected (--no-sni-requests).
    let proxy = site.start(mode, &[]);
    let before = proxy.scrape();
    let out = site.openssl(None, KNOWN).await;
    assert!(
        out.starts_with("HTTP/1.1 421"),
        "openssl without SNI: {out:?}"
    );
    assert_eq!(
        site.https_get(MAIN.https, None, KNOWN).await,
        Outcome::Served(421)
    );
    for (file, reason) in [
        ("garbage.bin", "not_tls"),
        ("http-get.bin", "not_tls"),
        ("synth-duplicate-sni.bin", "malformed"),
    ] {
        let seen = proxy.scrape();
        let ending = site
            .send(MAIN.https, &[&corpus(file)], Duration::ZERO)
            .await;
        assert_fast_reset(&ending, file);
        let after = scrape_until(&proxy, file, |s| s.gate(reason) > seen.gate(reason)).await;
        assert_eq!(
            moved(&seen, &after, Scrape::gate),
            vec![reason.to_string()],
            "{file}"
        );
        if mode == Mode::Ebpf {
            assert_eq!(
                moved(&seen, &after, Scrape::kernel),
                vec![reason.to_string()],
                "{file}"
            );
        }
    }
    // Plain HTTP on the HTTPS port, from curl.
    let out = site
        .pair
        .client
        .command("curl")
        .args(["-s", "--max-time", "5"])
        .arg(format!("http://{SERVER_IP}:{}/", MAIN.https))
        .output()
        .await
        .expect("curl");
    assert_eq!(
        out.status.code(),
        Some(56),
        "curl: connection reset while receiving"
    );
    let after = scrape_until(&proxy, "three not_tls", |s| {
        s.gate("not_tls") >= before.gate("not_tls") + 3.0
    })
    .await;
    assert_eq!(after.gate("no_sni") - before.gate("no_sni"), 2.0);
    assert_eq!(
        after.handshakes() - before.handshakes(),
        2.0,
        "only the no-SNI ones"
    );
    drop(proxy);

    // The other way round: no SNI reset, plain HTTP admitted (and then failed by TLS).
    let proxy = site.start(mode, &["--no-sni", "reject", "--not-tls", "accept"]);
    let before = proxy.scrape();
    let ending = site
        .send(
            MAIN.https,
            &[&corpus("openssl-tls13-nosni.bin")],
            Duration::ZERO,
        )
        .await;
    assert_fast_reset(&ending, "no SNI under --no-sni reject");
    let ending = site
        .send(MAIN.https, &[&corpus("http-get.bin")], Duration::ZERO)
        .await;
    assert!(
        !matches!(ending, Ending::Reset(_)),
        "plain HTTP is handed to TLS under --not-tls accept, got {ending:?}"
    );
    let after = scrape_until(&proxy, "a failed handshake", |s| {
        s.value("ingress_tls_handshakes_total", &[("result", "failed")]) >= 1.0
    })
    .await;
    assert_eq!(after.gate("no_sni") - before.gate("no_sni"), 1.0);
    assert_eq!(after.gate("not_tls") - before.gate("not_tls"), 1.0);
    if mode == Mode::Ebpf {
        assert_eq!(after.kernel("no_sni") - before.kernel("no_sni"), 1.0);
        assert_eq!(after.kernel("not_tls") - before.kernel("not_tls"), 1.0);
        assert_eq!(after.kernel("dropped") - before.kernel("dropped"), 1.0);
    }
}

/// What the proxy did with one connection, as seen from outside.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    /// The `ingress_sni_gate_total` reason that moved (none: nothing was decided).
    reason: Vec<String>,
    /// Whether a TLS handshake was attempted.
    handshake: bool,
    /// How the client's connection ended: "reset" (fast), "slow reset", "answered", "closed".
    ending: &'static str,
    /// eBPF mode: the kernel counter that moved.
    kernel: Vec<String>,
}

async fn observe(site: &Site, proxy: &Ingress, bytes: &[u8]) -> Seen {
    let before = proxy.scrape();
    let ending = site
        .send(proxy.https.port(), &[bytes], Duration::ZERO)
        .await;
    let ending = match ending {
        Ending::Reset(after) if after < Duration::from_millis(500) => "reset",
        Ending::Reset(_) => "slow reset",
        Ending::Answered(_) => "answered",
        Ending::Closed => "closed",
        Ending::Silent => "silent",
    };
    // The client has closed its end; give the proxy a moment to finish with the connection
    // (a decision, and for admitted ones the failed handshake that follows).
    let total = |s: &Scrape| REASONS.iter().map(|r| s.gate(r)).sum::<f64>();
    let deadline = Instant::now() + Duration::from_secs(3);
    let mut after = proxy.scrape();
    loop {
        let decided = total(&after) > total(&before);
        let admitted = after.handshakes() > before.handshakes();
        let dropped = decided && ending.contains("reset");
        if (decided && (admitted || dropped)) || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        after = proxy.scrape();
    }
    Seen {
        reason: moved(&before, &after, Scrape::gate),
        handshake: after.handshakes() > before.handshakes(),
        ending,
        kernel: moved(&before, &after, Scrape::kernel),
    }
}

/// The decision the userspace parser makes on `bytes` with `known` names: the reason label.
fn parser_reason(bytes: &[u8], known: &BTreeSet<String>) -> Option<&'static str> {
    match client_hello::peek(bytes) {
        client_hello::Peek::NeedMore(_) => None,
        client_hello::Peek::Done(hello) => Some(match client_hello::gate(&hello) {
            Ok(name) if known.contains(name.as_str()) => "pass",
            Ok(_) => "unknown",
            Err(reason) => reason.as_str(),
        }),
    }
}

#[tokio::test]
async fn every_corpus_hello_and_mutant_gets_the_same_decision_in_both_modes() {
    let mut inputs = corpus::all();
    assert!(inputs.len() >= 20, "the corpus went missing");
    // Every name in the corpus but curl's is served, so both pass and unknown happen.
    let known: BTreeSet<String> = inputs
        .iter()
        .filter_map(|(_, b)| {
            client_hello::gate(&client_hello::parse(b))
                .ok()
                .map(|n| n.to_string())
        })
        .filter(|n| n != "curl.example.test")
        .collect();
    // Mutants, as a fuzzer finds them: a fixed xorshift so a failure names a reproducible case.
    let mut random = Xorshift::new(0x2545_f491_4f6c_dd1d);
    let seeds: Vec<(String, Vec<u8>)> =
        ["curl-tls13.bin", "openssl-tls12-sni.bin", "chromium-2.bin"]
            .iter()
            .map(|f| (f.to_string(), corpus(f)))
            .collect();
    for (file, original) in &seeds {
        for case in 0..25 {
            let mut bytes = original.clone();
            for _ in 0..1 + random.next_u64() % 3 {
                let at = random.below(bytes.len());
                bytes[at] = random.byte();
            }
            inputs.push((format!("{file} mutant #{case}"), bytes));
        }
    }
    for case in 0..10 {
        let len = 1 + random.below(600);
        let bytes: Vec<u8> = (0..len).map(|_| random.byte()).collect();
        inputs.push((format!("random #{case}"), bytes));
    }

    let hosts: Vec<&str> = known.iter().map(String::as_str).collect();
    let Some(site) = Site::new("parity", &hosts) else {
        return;
    };
    // Short timeouts, so a record that never completes ends the same way in both, quickly.
    let extra = ["--gate-timeout", "1s", "--tls-handshake-timeout", "1s"];
    let ebpf = site.start(Mode::Ebpf, &extra);
    let userspace = site.proxy().ports(SECOND).args(extra).start();

    let mut differences = Vec::new();
    let mut decided = BTreeMap::<String, usize>::new();
    for (label, bytes) in &inputs {
        let kernel = observe(&site, &ebpf, bytes).await;
        let user = observe(&site, &userspace, bytes).await;
        eprintln!("{label:40} ebpf {kernel:?}\n{:40} user {user:?}", "");
        let want = parser_reason(bytes, &known);
        let same = kernel.reason == user.reason
            && kernel.handshake == user.handshake
            && kernel.ending == user.ending
            // The kernel's own counter agrees with what the proxy acted on.
            && kernel.kernel == kernel.reason
            && kernel.reason.iter().map(String::as_str).eq(want);
        if !same {
            differences.push(format!(
                "{label}: ebpf {kernel:?}, userspace {user:?}, parser {want:?}"
            ));
        }
        *decided.entry(kernel.reason.join(",")).or_default() += 1;
    }
    eprintln!("{} inputs by decision: {decided:?}", inputs.len());
    assert!(
        differences.is_empty(),
        "{} of {} differ:\n{}",
        differences.len(),
        inputs.len(),
        differences.join("\n")
    );
    for reason in ["pass", "unknown", "no_sni", "malformed", "not_tls"] {
        assert!(
            decided.contains_key(reason),
            "no input decided {reason}: {decided:?}"
        );
    }
}
