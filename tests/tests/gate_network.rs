//! The gate when the network misbehaves or is shared, through the real proxy: segments out of
//! order, a first segment with a wrong checksum, the same first segment again after its name
//! went (hand-written packets, `ingress_tests::rawtcp`); a firewall that drops conntrack-INVALID
//! packets; another server's listener on the same port; a CNI's TC program on the hook; and
//! interfaces that come and go. Each client must see what it would see on a clean network, in
//! both modes where a mode applies.
//!
//! The site (namespaces, backend, certificate, manifests, proxies) is `ingress_tests::gate_site`.
//! Without root, kernel BTF or an embedded eBPF object the tests print a loud skip notice and
//! pass — unless CI=true, where that is a failure.

// Setup helpers fail the test with a message, as the test bodies do.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use ingress_tests::bpftool;
use ingress_tests::corpus::{corpus, renamed};
use ingress_tests::gate_site::{KNOWN, MAIN, STEP, Site, scrape_until};
use ingress_tests::netns::SERVER_IP;
use ingress_tests::rawtcp::{Answer, Damage, RawTcp};
use ingress_tests::scrape::{REASONS, Scrape};
use ingress_tests::sockopt::defer_accept;
use ingress_tests::tcx::StandIn;
use ingress_tests::tls_client::{Ending, assert_fast_reset, send_raw};
use ingress_tests::{Mode, both_modes};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A connection from the raw peer (see `ingress_tests::rawtcp`) to the server's `port`,
/// handshake done, nothing sent.
fn raw_connect(site: &Site, port: u16) -> RawTcp {
    static NEXT: std::sync::atomic::AtomicU16 = std::sync::atomic::AtomicU16::new(0);
    let local_port = 41000 + NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let link = site
        .pair
        .raw_link()
        .expect("a packet socket in the client namespace");
    RawTcp::connect(link, local_port, (SERVER_IP, port), STEP).expect("the raw handshake")
}

/// What the server did next, from a blocking wait off the runtime's thread.
async fn raw_answer(conn: RawTcp) -> (RawTcp, Answer) {
    tokio::task::spawn_blocking(move || {
        let answer = conn.answer(STEP).expect("reading the server's answer");
        (conn, answer)
    })
    .await
    .expect("the answer thread")
}

fn assert_server_hello(answer: &Answer, what: &str) {
    match answer {
        Answer::Data(bytes) => assert_eq!(&bytes[..3], &[0x16, 0x03, 0x03], "{what}: a handshake"),
        other => panic!("{what}: expected a ServerHello, got {other:?}"),
    }
}

both_modes!(a_hello_whose_first_segment_arrives_second_is_served);

/// A two-segment ClientHello whose second segment arrives first (the first was lost, or
/// overtaken): the connection is served. Only the first segment of a connection can be
/// judged on its own; a later one, seen first, is the middle of a record.
async fn a_hello_whose_first_segment_arrives_second_is_served(mode: Mode) {
    let hello = corpus("chromium-2.bin");
    let Some(site) = Site::new(
        &format!("reorder-{}", mode.flag()),
        &["chromium.example.test"],
    ) else {
        return;
    };
    let proxy = site.start(mode, &[]);
    let before = proxy.scrape();
    // The second piece starts with a byte no TLS record starts with, as most cuts do.
    let cut = 1400;
    assert!(!(20..=24).contains(&hello[cut]), "pick another cut");
    let mut conn = raw_connect(&site, MAIN.https);
    conn.send_at(
        u32::try_from(cut).unwrap(),
        &hello[cut..],
        Damage::default(),
    )
    .expect("send the second segment");
    tokio::time::sleep(Duration::from_millis(50)).await;
    conn.send_at(0, &hello[..cut], Damage::default())
        .expect("send the first segment");
    let (mut conn, answer) = raw_answer(conn).await;
    assert_server_hello(&answer, "reordered Chromium hello");
    conn.reset(u32::try_from(hello.len()).unwrap())
        .expect("reset");
    let after = scrape_until(&proxy, "one pass", |s| s.gate("pass") > before.gate("pass")).await;
    assert_eq!(after.gate("pass") - before.gate("pass"), 1.0);
    if mode == Mode::Ebpf {
        assert_eq!(after.kernel("pass") - before.kernel("pass"), 1.0);
        assert_eq!(
            after.kernel("dropped"),
            before.kernel("dropped"),
            "{}",
            after.0
        );
    }
}

both_modes!(an_early_pass_holds_only_for_the_bytes_tcp_accepted);

/// A first segment with a wrong TCP checksum naming a served host, then, with the same
/// sequence number, a real ClientHello for a name nothing serves, in two segments: TCP
/// discards the first, so only the second hello exists, and it is reset. Whatever looked at
/// the discarded segment (the TC hook runs before the checksum is checked) must not decide
/// for the bytes TCP accepted.
async fn an_early_pass_holds_only_for_the_bytes_tcp_accepted(mode: Mode) {
    let known = corpus("curl-tls13.bin");
    let unknown = renamed(&known, "curl.example.test", "curl.unknown.test");
    let Some(site) = Site::new(&format!("badsum-{}", mode.flag()), &["curl.example.test"]) else {
        return;
    };
    let proxy = site.start(mode, &[]);
    let before = proxy.scrape();
    let mut conn = raw_connect(&site, MAIN.https);
    conn.send_at(0, &known, Damage { bad_checksum: true })
        .expect("the damaged segment");
    tokio::time::sleep(Duration::from_millis(20)).await;
    // 100 bytes: the record header promises more, so this piece cannot be judged alone.
    conn.send_at(0, &unknown[..100], Damage::default())
        .expect("the first piece");
    tokio::time::sleep(Duration::from_millis(20)).await;
    conn.send_at(100, &unknown[100..], Damage::default())
        .expect("the second piece");
    let (_conn, answer) = raw_answer(conn).await;
    assert!(
        matches!(answer, Answer::Reset(_)),
        "a name nothing serves got {answer:?}; logs:\n{}",
        proxy.logs()
    );
    let after = scrape_until(&proxy, "one unknown", |s| {
        s.gate("unknown") > before.gate("unknown")
    })
    .await;
    assert_eq!(after.gate("unknown") - before.gate("unknown"), 1.0);
    assert_eq!(after.gate("pass"), before.gate("pass"));
    assert_eq!(
        after.handshakes(),
        before.handshakes(),
        "a handshake started"
    );
}

both_modes!(a_retransmitted_first_segment_after_its_name_went_is_reset_and_leaves_nothing);

/// The first segment passed once (its copy then lost: a wrong checksum here), the name
/// removed, and the same segment again: the client is reset, and nothing the first copy left
/// in the kernel outlives the connection.
async fn a_retransmitted_first_segment_after_its_name_went_is_reset_and_leaves_nothing(mode: Mode) {
    let hello = corpus("curl-tls13.bin");
    let Some(site) = Site::new(
        &format!("retrans-{}", mode.flag()),
        &["curl.example.test", KNOWN],
    ) else {
        return;
    };
    let proxy = site.start(mode, &[]);
    let generation = |s: &Scrape| s.value("ingress_snapshot_generation", &[]);
    let mut conn = raw_connect(&site, MAIN.https);
    conn.send_at(0, &hello, Damage { bad_checksum: true })
        .expect("the lost copy");
    tokio::time::sleep(Duration::from_millis(20)).await;
    let published = generation(&proxy.scrape());
    site.write_hosts(&[KNOWN]);
    scrape_until(&proxy, "the change published", |s| {
        generation(s) > published
    })
    .await;
    let before = proxy.scrape();
    conn.send_at(0, &hello, Damage::default())
        .expect("the retransmission");
    let (_conn, answer) = raw_answer(conn).await;
    assert!(matches!(answer, Answer::Reset(_)), "got {answer:?}");
    let after = scrape_until(&proxy, "one unknown", |s| {
        s.gate("unknown") > before.gate("unknown")
    })
    .await;
    assert_eq!(after.gate("pass"), before.gate("pass"));
    if mode == Mode::Ebpf {
        assert_eq!(
            after.kernel("passed_before_accept"),
            before.kernel("passed_before_accept")
        );
        assert_eq!(
            bpftool::map_entries(&site.pins.join("passed_early")),
            0,
            "a pass record outlived its connection"
        );
    }
}

both_modes!(a_refused_client_is_reset_behind_a_firewall_that_drops_invalid);

/// The rule ufw, firewalld and most hardening guides install, on the interface clients come
/// in through: unknown names must still be reset at once, never left to time out.
async fn a_refused_client_is_reset_behind_a_firewall_that_drops_invalid(mode: Mode) {
    let Some(site) = Site::new(&format!("firewall-{}", mode.flag()), &[KNOWN]) else {
        return;
    };
    let proxy = site.start(mode, &[]);
    site.pair
        .server
        .exec(
            "iptables",
            &[
                "-I",
                "INPUT",
                "-i",
                "veth0",
                "-m",
                "conntrack",
                "--ctstate",
                "INVALID",
                "-j",
                "DROP",
            ],
        )
        .expect("iptables (install it with `cargo xtask setup`)");
    let before = proxy.scrape();
    let mut endings = Vec::new();
    for i in 0..10 {
        let started = Instant::now();
        let result = site.curl(&format!("nobody-{i}.test")).await;
        endings.push((result, started.elapsed()));
    }
    eprintln!("{mode:?} behind the firewall: {endings:?}");
    for (i, (result, took)) in endings.iter().enumerate() {
        // curl: (35) Recv failure: Connection reset by peer.
        assert_eq!(
            *result,
            Err(Some(35)),
            "client {i}; logs:\n{}",
            proxy.logs()
        );
        assert!(*took < Duration::from_secs(1), "client {i} took {took:?}");
    }
    assert_eq!(
        site.curl(KNOWN).await,
        Ok(200),
        "the known name behind the firewall"
    );
    let after = scrape_until(&proxy, "ten unknown", |s| {
        s.gate("unknown") >= before.gate("unknown") + 10.0
    })
    .await;
    assert_eq!(after.gate("unknown") - before.gate("unknown"), 10.0);
    if mode == Mode::Ebpf {
        // Counted once each: what happened, not every segment that was judged.
        let delta = |c: &str| after.kernel(c) - before.kernel(c);
        assert_eq!(delta("unknown"), 10.0, "{}", after.0);
        assert_eq!(delta("dropped"), 10.0, "{}", after.0);
        // Each reset sent from the TC hook, once: none left to a retransmission.
        assert_eq!(delta("reset_before_accept_unknown"), 10.0, "{}", after.0);
        assert_eq!(delta("early_reset_unsent"), 0.0, "{}", after.0);
    }
}

both_modes!(another_listener_on_the_port_is_left_alone);

/// Another server's listener on port 443, on an address `--bind` leaves free (and deferring
/// accept, as nginx's `listen … deferred` does): its clients are none of the gate's business,
/// whatever name they send and however their hello arrives.
async fn another_listener_on_the_port_is_left_alone(mode: Mode) {
    const OTHER: std::net::Ipv4Addr = std::net::Ipv4Addr::new(10, 231, 0, 9);
    let Some(site) = Site::new(&format!("other-{}", mode.flag()), &[KNOWN]) else {
        return;
    };
    site.pair
        .server
        .ip(&["addr", "add", "10.231.0.9/24", "dev", "veth0"])
        .expect("a second address");
    let proxy = site.proxy().mode(mode).bind(&SERVER_IP.to_string()).start();
    let before = proxy.scrape();

    // The other server: reads what its client sends, then answers "other".
    let listener = std::net::TcpListener::bind((OTHER, 443)).expect("bind the other listener");
    defer_accept(&listener);
    listener.set_nonblocking(true).expect("nonblocking");
    let listener = tokio::net::TcpListener::from_std(listener).expect("tokio listener");
    let (tx, mut received) = tokio::sync::mpsc::unbounded_channel();
    let server = tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                return;
            };
            let tx = tx.clone();
            tokio::spawn(async move {
                let mut got = Vec::new();
                let mut buf = [0u8; 4096];
                while let Ok(Ok(n)) =
                    tokio::time::timeout(Duration::from_millis(300), stream.read(&mut buf)).await
                {
                    if n == 0 {
                        break;
                    }
                    got.extend_from_slice(&buf[..n]);
                }
                let _ = stream.write_all(b"other").await;
                let _ = tx.send(got);
            });
        }
    });

    let unknown_one = corpus("curl-tls13.bin");
    let unknown_two = renamed(
        &corpus("chromium-2.bin"),
        "chromium.example.test",
        "chromium.unknown.test",
    );
    for (what, hello) in [
        ("one segment", &unknown_one),
        ("two segments", &unknown_two),
    ] {
        let socket = site.pair.client.tcp_sockets(1).pop().expect("a socket");
        let stream = tokio::time::timeout(STEP, socket.connect(SocketAddr::from((OTHER, 443))))
            .await
            .expect("connect in time")
            .expect("connect");
        let ending = send_raw(stream, &[hello], Duration::ZERO).await;
        assert_eq!(
            ending,
            Ending::Answered(b"other".to_vec()),
            "{what}: the other server did not answer; logs:\n{}",
            proxy.logs()
        );
        let got = tokio::time::timeout(STEP, received.recv())
            .await
            .expect("the other server finished")
            .expect("a report");
        assert_eq!(&got, hello, "{what}: the other server got other bytes");
    }
    server.abort();
    let after = proxy.scrape();
    let total = |s: &Scrape| REASONS.iter().map(|r| s.gate(r)).sum::<f64>();
    assert_eq!(total(&after), total(&before), "the proxy decided something");
    if mode == Mode::Ebpf {
        for counter in [
            "unknown",
            "dropped",
            "sock_added",
            "reset_before_accept_unknown",
        ] {
            assert_eq!(after.kernel(counter), before.kernel(counter), "{counter}");
        }
    }
    // The proxy's own address is still gated.
    assert_eq!(site.curl(KNOWN).await, Ok(200));
    assert_eq!(site.curl("nobody.test").await, Err(Some(35)));
}

/// A CNI's TC program on the interface (a stand-in that returns TC_ACT_OK, as Cilium's do):
/// the early reset is attached ahead of it, so it still runs; a program attached ahead of it
/// later is reported (a warning and `ingress_ebpf_early_reset_shadowed`), and connections
/// through that interface are still judged, after accept.
#[tokio::test]
async fn a_cni_program_on_the_hook_neither_hides_the_early_reset_nor_goes_unreported() {
    let Some(site) = Site::new("tcx", &[KNOWN]) else {
        return;
    };
    let _cni = StandIn::attach_first(&site.pair.server, "veth0").expect("the stand-in attaches");
    let proxy = site.start(Mode::Ebpf, &[]);
    let shadowed = |s: &Scrape| {
        s.value(
            "ingress_ebpf_early_reset_shadowed",
            &[("interface", "veth0")],
        )
    };
    let hello = corpus("curl-tls13.bin");
    let before = proxy.scrape();
    assert_eq!(shadowed(&before), 0.0, "{}", before.0);
    let ending = site.send(MAIN.https, &[&hello], Duration::ZERO).await;
    assert_fast_reset(&ending, "unknown name with a CNI program on the hook");
    let after = scrape_until(&proxy, "one unknown", |s| {
        s.kernel("unknown") > before.kernel("unknown")
    })
    .await;
    assert_eq!(
        after.kernel("reset_before_accept_unknown") - before.kernel("reset_before_accept_unknown"),
        1.0,
        "the early reset did not run: {}",
        after.0
    );

    // The CNI restarts and puts itself first again.
    let late = StandIn::attach_first(&site.pair.server, "veth0").expect("attach again");
    let deadline = Instant::now() + Duration::from_secs(15);
    while shadowed(&proxy.scrape()) != 1.0 {
        assert!(
            Instant::now() < deadline,
            "shadowing not reported; logs:\n{}",
            proxy.logs()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The warning is written by the log thread, which may still be on its way when the gauge
    // already reads 1.
    assert!(
        proxy.wait_for_log(
            "another TC program runs before the early reset",
            Duration::from_secs(5)
        ),
        "{}",
        proxy.logs()
    );
    let logs = proxy.logs();
    assert!(logs.contains("standin"), "{logs}");
    // Still refused: after accept now.
    let before = proxy.scrape();
    let ending = site.send(MAIN.https, &[&hello], Duration::ZERO).await;
    assert_fast_reset(
        &ending,
        "unknown name behind a program that shadows the early reset",
    );
    let after = scrape_until(&proxy, "one unknown", |s| {
        s.kernel("unknown") > before.kernel("unknown")
    })
    .await;
    let delta = |c: &str| after.kernel(c) - before.kernel(c);
    assert_eq!(delta("reset_before_accept_unknown"), 0.0, "{}", after.0);
    assert_eq!(delta("sock_added"), 1.0, "{}", after.0);

    drop(late);
    let deadline = Instant::now() + Duration::from_secs(15);
    while shadowed(&proxy.scrape()) != 0.0 {
        assert!(Instant::now() < deadline, "{}", proxy.logs());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        proxy.logs().contains("the early reset runs first again"),
        "{}",
        proxy.logs()
    );
}

/// An interface that appears after startup (a pod's veth on a node) gets the early reset at the
/// next rescan, and one that goes away is forgotten.
#[tokio::test]
async fn interfaces_that_come_and_go_are_followed() {
    let Some(site) = Site::new("rescan", &[KNOWN]) else {
        return;
    };
    let proxy = site.start(Mode::Ebpf, &[]);
    // Which interfaces the proxy logged as newly attached, or as detached.
    let changed = |which: &str| -> Vec<String> {
        proxy
            .logs()
            .lines()
            .filter(|l| l.contains("early reset (TC ingress) interfaces changed"))
            .filter_map(|l| {
                let (attached, detached) = l.split_once(" detached=")?;
                Some(
                    if which == "attached" {
                        attached
                    } else {
                        detached
                    }
                    .to_string(),
                )
            })
            .collect()
    };
    let mentions = |lines: &[String], name: &str| lines.iter().any(|l| l.contains(name));
    assert!(!mentions(&changed("attached"), "ingtest0"));
    site.pair
        .server
        .ip(&[
            "link", "add", "ingtest0", "type", "veth", "peer", "name", "ingtest1",
        ])
        .expect("add a veth pair");
    let deadline = Instant::now() + Duration::from_secs(15);
    while !mentions(&changed("attached"), "ingtest0") {
        assert!(
            Instant::now() < deadline,
            "never attached:\n{}",
            proxy.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    site.pair
        .server
        .ip(&["link", "del", "ingtest0"])
        .expect("delete the veth pair");
    while !mentions(&changed("detached"), "ingtest0") {
        assert!(
            Instant::now() < deadline,
            "never forgotten:\n{}",
            proxy.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(site.curl(KNOWN).await, Ok(200));
}
