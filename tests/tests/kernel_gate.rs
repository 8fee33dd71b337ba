//! The kernel SNI gate end to end, as root: each test makes its own server and client network
//! namespaces joined by a veth link, loads a gate pinned in its own directory, runs a small
//! TLS-less server that calls the gate API for every accepted connection, and drives it with
//! openssl, curl and raw byte writers.
//!
//! The harness (namespaces, the gate, the test server) is `ingress_tests::gate_server`. Without
//! root or kernel BTF, or in a build without the eBPF object, the tests print a loud skip notice
//! and pass — unless CI=true, where that is a failure.

// Setup helpers fail the test with a message, as the test bodies do.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use ingress::client_hello;
use ingress::gate::{Action, Admission, KernelLog, Reason, counter};
use ingress::snapshot::sni::{Admit, SniPolicy, UnnamedPolicy};
use ingress_tests::bpftool;
use ingress_tests::corpus::{self, Xorshift, corpus};
use ingress_tests::gate_server::{
    AbortOnDrop, Ending, GateServer, PORT, STEP, Server, dropped, load, passed, policy, register,
    serve, sni_of, wait_for_sole_owner,
};
use ingress_tests::netns::SERVER_IP;
use ingress_tests::pins::PinDir;
use ingress_tests::sockopt::linger_zero;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

#[tokio::test]
async fn openssl_and_curl_with_a_known_name_pass() {
    let policy = policy(&["openssl.example.test", "curl.example.test"]);
    let Some(mut h) = GateServer::start("known", policy).await else {
        return;
    };
    let target = format!("{SERVER_IP}:{PORT}");

    let served = h
        .run_client(
            "openssl",
            &[
                "s_client",
                "-connect",
                &target,
                "-servername",
                "openssl.example.test",
            ],
        )
        .await;
    let verdict = passed(&served);
    assert_eq!(verdict.reason, Reason::Pass);
    let record = served.record.expect("a record");
    assert_eq!(
        record.len(),
        verdict.record_len as usize,
        "exactly the first record"
    );
    assert_eq!(sni_of(&record).as_deref(), Some("openssl.example.test"));

    let resolve = format!("curl.example.test:{PORT}:{SERVER_IP}");
    let served = h
        .run_client(
            "curl",
            &[
                "-sk",
                "--max-time",
                "3",
                "--resolve",
                &resolve,
                "https://curl.example.test/",
            ],
        )
        .await;
    assert_eq!(passed(&served).reason, Reason::Pass);
    assert_eq!(
        sni_of(&served.record.expect("a record")).as_deref(),
        Some("curl.example.test")
    );
    assert!(h.gate.counters().expect("counters").get(counter::PASS) >= 2);
}

#[tokio::test]
async fn an_unknown_name_is_reset_within_50_ms_and_nothing_is_read() {
    let Some(mut h) = GateServer::start("unknown", policy(&["other.example.test"])).await else {
        return;
    };
    let hello = corpus("curl-tls13.bin");
    let ending = h.send(&[&hello], Duration::ZERO).await;
    match ending {
        Ending::Reset(after) => {
            eprintln!("unknown name reset {after:?} after the ClientHello was written");
            assert!(after < Duration::from_millis(50), "reset took {after:?}");
        }
        other => panic!("expected a reset, got {other:?}"),
    }
    let served = h.next().await;
    assert_eq!(dropped(&served).reason, Reason::Unknown);
    assert!(served.record.is_none());

    let target = format!("{SERVER_IP}:{PORT}");
    let served = h
        .run_client(
            "openssl",
            &[
                "s_client",
                "-connect",
                &target,
                "-servername",
                "nobody.example.test",
            ],
        )
        .await;
    assert_eq!(dropped(&served).reason, Reason::Unknown);
    let counters = h.gate.counters().expect("counters");
    assert!(
        counters.get(counter::UNKNOWN) >= 2 && counters.get(counter::DROPPED) >= 2,
        "{counters:?}"
    );
}

#[tokio::test]
async fn a_wildcard_admits_one_label_and_no_more() {
    let Some(mut h) = GateServer::start("wild", policy(&["*.wild.test"])).await else {
        return;
    };
    let target = format!("{SERVER_IP}:{PORT}");
    let cases = [
        ("a.wild.test", true),
        ("A.Wild.Test", true),
        ("b.a.wild.test", false),
        ("wild.test", false),
    ];
    for (name, admitted) in cases {
        let served = h
            .run_client(
                "openssl",
                &["s_client", "-connect", &target, "-servername", name],
            )
            .await;
        if admitted {
            assert_eq!(passed(&served).reason, Reason::Pass, "{name}");
        } else {
            assert_eq!(dropped(&served).reason, Reason::Unknown, "{name}");
        }
    }
}

#[tokio::test]
async fn a_client_hello_split_over_three_writes_is_still_classified() {
    let Some(mut h) = GateServer::start("split", policy(&["curl.example.test"])).await else {
        return;
    };
    let hello = corpus("curl-tls13.bin");
    let (header, rest) = hello.split_at(5);
    let (middle, tail) = rest.split_at(rest.len() / 2);
    let ending = h
        .send(&[header, middle, tail], Duration::from_millis(100))
        .await;
    assert!(matches!(ending, Ending::Closed), "{ending:?}");
    let served = h.next().await;
    assert_eq!(passed(&served).reason, Reason::Pass);
    assert_eq!(
        served.record.as_deref(),
        Some(hello.as_slice()),
        "the whole record, in order"
    );
    let waited = h
        .gate
        .counters()
        .expect("counters")
        .get(counter::PARSER_WAITED);
    assert!(
        waited >= 1,
        "the parser never saw a partial record for a hello written in three parts"
    );
}

#[tokio::test]
async fn a_two_segment_client_hello_with_the_name_in_the_second_segment() {
    // Chromium's post-quantum hello: 1929 bytes, server_name at byte 1640, past one MTU-1500
    // segment's payload, so the verdict needs both segments.
    let hello = corpus("chromium-2.bin");
    assert!(hello.len() > 1500);
    let Some(mut h) = GateServer::start("twoseg", policy(&["chromium.example.test"])).await else {
        return;
    };
    let ending = h.send(&[&hello], Duration::ZERO).await;
    assert!(matches!(ending, Ending::Closed), "{ending:?}");
    let served = h.next().await;
    assert_eq!(passed(&served).reason, Reason::Pass);
    assert_eq!(served.record.as_deref(), Some(hello.as_slice()));
    // Proof that the record really arrived in pieces: the parser had to wait for more.
    let waited = h
        .gate
        .counters()
        .expect("counters")
        .get(counter::PARSER_WAITED);
    assert!(
        waited >= 1,
        "the parser never waited, so the hello came in one packet"
    );

    h.gate
        .sync_hosts(&policy(&["other.example.test"]), 0)
        .expect("sync");
    let ending = h.send(&[&hello], Duration::ZERO).await;
    assert!(matches!(ending, Ending::Reset(_)), "{ending:?}");
    assert_eq!(dropped(&h.next().await).reason, Reason::Unknown);
}

#[tokio::test]
async fn no_sni_garbage_and_plain_http_follow_the_configured_policy() {
    let strict = SniPolicy {
        unnamed: UnnamedPolicy {
            no_sni: Admit::Reject,
            malformed: Admit::Reject,
            not_tls: Admit::Reject,
        },
        ..policy(&["curl.example.test"])
    };
    let Some(mut h) = GateServer::start("cases", strict.clone()).await else {
        return;
    };
    let cases = [
        ("openssl-tls13-nosni.bin", Reason::NoSni),
        ("garbage.bin", Reason::NotTls),
        ("http-get.bin", Reason::NotTls),
        ("synth-duplicate-sni.bin", Reason::Malformed),
    ];
    for (file, reason) in cases {
        let ending = h.send(&[&corpus(file)], Duration::ZERO).await;
        assert!(matches!(ending, Ending::Reset(_)), "{file}: {ending:?}");
        assert_eq!(dropped(&h.next().await).reason, reason, "{file}");
    }

    let lenient = SniPolicy {
        unnamed: UnnamedPolicy {
            not_tls: Admit::Accept,
            no_sni: Admit::Accept,
            ..strict.unnamed
        },
        ..strict
    };
    h.gate.sync_hosts(&lenient, 0).expect("sync");
    let http = corpus("http-get.bin");
    let ending = h.send(&[&http], Duration::ZERO).await;
    assert!(matches!(ending, Ending::Closed), "{ending:?}");
    let served = h.next().await;
    assert_eq!(passed(&served).reason, Reason::NotTls);
    assert_eq!(served.record.as_deref(), Some(http.as_slice()));
    let nosni = corpus("openssl-tls13-nosni.bin");
    h.send(&[&nosni], Duration::ZERO).await;
    assert_eq!(passed(&h.next().await).reason, Reason::NoSni);
}

#[tokio::test]
async fn a_restart_reuses_the_pinned_policy_and_replaces_per_socket_state() {
    let pin_guard = PinDir::new("restart");
    let pins = pin_guard.path().to_path_buf();
    let first = policy(&["curl.example.test", "keep.example.test"]);
    let Some(mut h) =
        GateServer::start_in("restart", first.clone(), pin_guard, KernelLog::Off).await
    else {
        return;
    };
    h.send(&[&corpus("curl-tls13.bin")], Duration::ZERO).await;
    assert_eq!(passed(&h.next().await).reason, Reason::Pass);
    let passes_before = h.gate.counters().expect("counters").get(counter::PASS);

    // Stop: the per-socket pins go, the policy stays pinned.
    let GateServer {
        gate,
        pins: pin_guard,
        pair,
        server,
        ..
    } = h;
    drop(server);
    // The server's connection tasks may still hold the gate for a moment.
    let gate = wait_for_sole_owner(gate).await;
    drop(gate);
    tokio::time::sleep(Duration::from_millis(50)).await;
    for (file, kept) in [
        ("hosts", true),
        ("sources", true),
        ("config", true),
        ("counters", true),
        ("verdicts", false),
        ("socks", false),
    ] {
        assert_eq!(pins.join(file).exists(), kept, "{file} after stop");
    }

    // Start again on the same pins: the policy is already there, nothing to write.
    let gate = Arc::new(load(&pins, first.clone(), KernelLog::Off).expect("reload"));
    let report = gate.sync_hosts(&first, 0).expect("sync");
    assert_eq!((report.upserted, report.removed), (0, 0), "{report:?}");
    assert!(
        gate.counters().expect("counters").get(counter::PASS) >= passes_before,
        "counters survive"
    );
    let listener = TcpListener::bind((SERVER_IP, PORT)).await.expect("rebind");
    register(&gate, &listener);
    let (tx, served) = mpsc::unbounded_channel();
    let server = AbortOnDrop(tokio::spawn(serve(listener, gate.clone(), tx)));
    let mut h = GateServer {
        gate,
        served,
        server,
        pins: pin_guard,
        pair,
    };
    let ending = h.send(&[&corpus("curl-tls13.bin")], Duration::ZERO).await;
    assert!(matches!(ending, Ending::Closed), "{ending:?}");
    assert_eq!(passed(&h.next().await).reason, Reason::Pass);

    // And a policy change after the restart removes only what it must.
    let report = h
        .gate
        .sync_hosts(&policy(&["keep.example.test"]), 0)
        .expect("sync");
    assert_eq!((report.upserted, report.removed), (0, 1), "{report:?}");
    h.send(&[&corpus("curl-tls13.bin")], Duration::ZERO).await;
    assert_eq!(dropped(&h.next().await).reason, Reason::Unknown);
}

#[tokio::test]
async fn bpftool_map_dump_shows_host_names() {
    let names = policy(&["shop.example.test", "*.apps.example.test"]);
    let names = SniPolicy {
        names: names.names,
        ..SniPolicy::default()
    }
    .with_host("tls.example.test", Action::Passthrough);
    let Some(h) = GateServer::start("bpftool", names).await else {
        return;
    };
    let hosts = bpftool::dump_text(&h.pins.join("hosts"));
    for name in [
        "shop.example.test",
        "*.apps.example.test",
        "tls.example.test",
    ] {
        let shown = format!("\"name\": \"{name}\"");
        assert!(
            hosts.contains(&shown),
            "{name} is not readable in:\n{hosts}"
        );
    }
    assert!(
        hosts.contains("\"action\": 2"),
        "the passthrough action shows:\n{hosts}"
    );

    let config = bpftool::dump_text(&h.pins.join("config"));
    for field in [
        "\"netns_cookie\"",
        "\"catch_all\": 0",
        "\"port_count\": 1",
        "443",
    ] {
        assert!(config.contains(field), "{field} is not in:\n{config}");
    }
    let counters = bpftool::dump_text(&h.pins.join("counters"));
    assert!(
        counters.contains("\"cpu\""),
        "per-CPU values are not shown:\n{counters}"
    );
}

#[tokio::test]
async fn corpus_verdicts_match_the_userspace_parser() {
    // Every corpus name but one is known, so both pass and unknown are exercised.
    let files = corpus::all();
    let mut known: Vec<String> = files
        .iter()
        .filter_map(|(_, b)| sni_of(b))
        .filter(|n| n != "curl.example.test")
        .collect();
    known.sort();
    known.dedup();
    let known_refs: Vec<&str> = known.iter().map(String::as_str).collect();
    let Some(h) = GateServer::start("corpus", policy(&known_refs)).await else {
        return;
    };

    let mut mismatches = Vec::new();
    for (file, bytes) in &files {
        let parsed = client_hello::parse(bytes);
        let (want_reason, want_name) = match client_hello::gate(&parsed) {
            Ok(name) if known.iter().any(|k| k == name.as_str()) => {
                (Reason::Pass, Some(name.to_string()))
            }
            Ok(name) => (Reason::Unknown, Some(name.to_string())),
            Err(reason) => (reason, None),
        };
        let got = h
            .gate
            .probe(bytes)
            .unwrap_or_else(|e| panic!("{file}: probe: {e}"));
        eprintln!(
            "{file:32} kernel {:?} {:?} ({} bytes)",
            got.reason, got.name, got.record_len
        );
        if got.reason != want_reason || got.name != want_name {
            mismatches.push(format!(
                "{file}: kernel {:?} {:?}, userspace {want_reason:?} {want_name:?}",
                got.reason, got.name
            ));
        }
    }
    assert!(
        mismatches.is_empty(),
        "kernel and userspace disagree:\n{}",
        mismatches.join("\n")
    );
    assert!(files.len() >= 20, "the corpus went missing");
}

/// A `tracing` writer into a shared buffer.
#[derive(Clone)]
struct Capture(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("capture lock").extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn kernel_debug_logs_reach_tracing() {
    use tracing_subscriber::layer::SubscriberExt;

    // This gate loads with kernel logging on (so the verifier must accept the logging code
    // too), and its events task, on this thread's runtime, forwards the programs' records to
    // this thread's subscriber.
    let captured = Capture(Arc::new(std::sync::Mutex::new(Vec::new())));
    let writer = captured.clone();
    let subscriber = tracing_subscriber::registry()
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(move || writer.clone())
                .with_ansi(false),
        )
        .with(
            tracing_subscriber::filter::Targets::new()
                .with_target("ingress::gate::kernel", tracing::Level::DEBUG),
        );
    let _guard = tracing::subscriber::set_default(subscriber);

    let policy = policy(&["curl.example.test"]);
    let Some(mut h) =
        GateServer::start_in("logs", policy, PinDir::new("logs"), KernelLog::Debug).await
    else {
        return;
    };
    h.send(&[&corpus("curl-tls13.bin")], Duration::ZERO).await;
    assert_eq!(passed(&h.next().await).reason, Reason::Pass);
    let wanted = [
        "ingress::gate::kernel: gated socket",
        "ingress::gate::kernel: verdict socket",
    ];
    let mut text = String::new();
    for _ in 0..100 {
        text = String::from_utf8_lossy(&captured.0.lock().expect("capture lock")).into_owned();
        if wanted.iter().all(|w| text.contains(w)) {
            eprintln!("captured:\n{text}");
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("missing kernel log lines {wanted:?} in:\n{text}");
}

#[tokio::test]
async fn verdict_records_never_outlive_their_sockets() {
    let Some(mut h) = GateServer::start("reap", policy(&["curl.example.test"])).await else {
        return;
    };
    // Served connections: the kernel deletes each record as its socket closes.
    h.send(&[&corpus("curl-tls13.bin")], Duration::ZERO).await;
    assert_eq!(passed(&h.next().await).reason, Reason::Pass);
    h.send(&[&corpus("openssl-tls13-sni.bin")], Duration::ZERO)
        .await;
    assert_eq!(dropped(&h.next().await).reason, Reason::Unknown);

    // A connection that resets before userspace ever accepts it: only the kernel can clean up.
    let reaped_before = h
        .gate
        .counters()
        .expect("counters")
        .get(counter::RECORD_REAPED);
    drop(std::mem::replace(
        &mut h.server,
        AbortOnDrop(tokio::spawn(async {})),
    ));
    tokio::time::sleep(Duration::from_millis(20)).await;
    let listener = TcpListener::bind((SERVER_IP, PORT)).await.expect("rebind");
    register(&h.gate, &listener);
    let socket = h
        .pair
        .client
        .run(tokio::net::TcpSocket::new_v4)
        .expect("thread")
        .expect("socket");
    let mut stream = socket
        .connect(SocketAddr::from((SERVER_IP, PORT)))
        .await
        .expect("connect");
    stream
        .write_all(&corpus("curl-tls13.bin"))
        .await
        .expect("write");
    tokio::time::sleep(Duration::from_millis(50)).await;
    linger_zero(&stream);
    drop(stream);

    let mut records = usize::MAX;
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let dump = bpftool::dump_text(&h.pins.join("verdicts"));
        let parsed: serde_json::Value = serde_json::from_str(&dump).expect("bpftool json");
        records = parsed.as_array().map_or(usize::MAX, Vec::len);
        if records == 0 {
            break;
        }
    }
    assert_eq!(records, 0, "verdict records left behind");
    let counters = h.gate.counters().expect("counters");
    assert!(
        counters.get(counter::RECORD_REAPED) > reaped_before,
        "the kernel did not reap: {counters:?}"
    );
    drop(listener);
}

#[tokio::test]
async fn mutated_hellos_get_the_same_verdict_from_kernel_and_userspace() {
    let Some(h) = GateServer::start(
        "mutants",
        policy(&["curl.example.test", "chromium.example.test"]),
    )
    .await
    else {
        return;
    };
    // A fixed xorshift, so a failure names a reproducible case.
    let mut random = Xorshift::new(0x9e37_79b9_7f4a_7c15);
    let mut mismatches = Vec::new();
    let mut checked = 0;
    for file in [
        "curl-tls13.bin",
        "openssl-tls12-sni.bin",
        "chromium-1.bin",
        "synth-ech-grease.bin",
    ] {
        let original = corpus(file);
        for case in 0..400 {
            let mut bytes = original.clone();
            for _ in 0..1 + random.next_u64() % 3 {
                let at = random.below(bytes.len());
                bytes[at] = random.byte();
            }
            if random.next_u64().is_multiple_of(8) {
                bytes.truncate(random.below(bytes.len()));
            }
            let parsed = client_hello::parse(&bytes);
            let want = match client_hello::gate(&parsed) {
                Ok(name)
                    if ["curl.example.test", "chromium.example.test"].contains(&name.as_str()) =>
                {
                    (Reason::Pass, Some(name.to_string()))
                }
                Ok(name) => (Reason::Unknown, Some(name.to_string())),
                Err(reason) => (reason, None),
            };
            let got = h
                .gate
                .probe(&bytes)
                .unwrap_or_else(|e| panic!("{file} #{case}: probe: {e}"));
            checked += 1;
            if (got.reason, got.name.clone()) != want {
                mismatches.push(format!(
                    "{file} #{case}: kernel {:?} {:?}, userspace {want:?}",
                    got.reason, got.name
                ));
            }
        }
    }
    assert!(
        mismatches.is_empty(),
        "{} of {checked} differ:\n{}",
        mismatches.len(),
        mismatches.join("\n")
    );
}

/// A TLS 1.2-style ClientHello record with the given extensions, in order.
fn build_hello(extensions: &[(u16, Vec<u8>)]) -> Vec<u8> {
    let mut body = vec![3, 3];
    body.extend_from_slice(&[7; 32]); // random
    body.push(0); // session id
    body.extend_from_slice(&[0, 2, 0x13, 0x01]); // one cipher suite
    body.extend_from_slice(&[1, 0]); // null compression
    let mut block = Vec::new();
    for (kind, data) in extensions {
        block.extend_from_slice(&kind.to_be_bytes());
        block.extend_from_slice(&u16::try_from(data.len()).unwrap().to_be_bytes());
        block.extend_from_slice(data);
    }
    body.extend_from_slice(&u16::try_from(block.len()).unwrap().to_be_bytes());
    body.extend_from_slice(&block);
    let mut handshake = vec![1];
    handshake.extend_from_slice(&u32::try_from(body.len()).unwrap().to_be_bytes()[1..]);
    handshake.extend_from_slice(&body);
    let mut record = vec![22, 3, 1];
    record.extend_from_slice(&u16::try_from(handshake.len()).unwrap().to_be_bytes());
    record.extend_from_slice(&handshake);
    record
}

fn sni(name: &[u8]) -> (u16, Vec<u8>) {
    let mut entry = vec![0];
    entry.extend_from_slice(&u16::try_from(name.len()).unwrap().to_be_bytes());
    entry.extend_from_slice(name);
    let mut data = u16::try_from(entry.len()).unwrap().to_be_bytes().to_vec();
    data.extend_from_slice(&entry);
    (0, data)
}

fn alpn(protocols: &[&[u8]]) -> (u16, Vec<u8>) {
    let mut list = Vec::new();
    for p in protocols {
        list.push(u8::try_from(p.len()).unwrap());
        list.extend_from_slice(p);
    }
    let mut data = u16::try_from(list.len()).unwrap().to_be_bytes().to_vec();
    data.extend_from_slice(&list);
    (16, data)
}

#[tokio::test]
async fn edge_cases_get_the_same_verdict_from_kernel_and_userspace() {
    let long = |n: usize| {
        let mut name = vec![b'a'; n];
        for i in (60..n).step_by(61) {
            name[i] = b'.';
        }
        name
    };
    let many = |n: u16| {
        (0..n)
            .map(|i| (0x1000 + i, vec![]))
            .chain([sni(b"ok.test")])
            .collect::<Vec<_>>()
    };
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("plain name", build_hello(&[sni(b"ok.test")])),
        ("upper case", build_hello(&[sni(b"OK.Test")])),
        ("underscore", build_hello(&[sni(b"_dmarc.ok.test")])),
        ("wildcard child", build_hello(&[sni(b"x.wild.test")])),
        ("wildcard grandchild", build_hello(&[sni(b"y.x.wild.test")])),
        ("253 bytes", build_hello(&[sni(&long(253))])),
        ("254 bytes", build_hello(&[sni(&long(254))])),
        ("star", build_hello(&[sni(b"*.wild.test")])),
        ("leading dot", build_hello(&[sni(b".ok.test")])),
        ("double dot", build_hello(&[sni(b"ok..test")])),
        ("trailing dot", build_hello(&[sni(b"ok.test.")])),
        ("empty name", build_hello(&[sni(b"")])),
        ("space", build_hello(&[sni(b"ok test")])),
        ("high byte", build_hello(&[sni(b"ok\xc3\xa9.test")])),
        (
            "sni after alpn",
            build_hello(&[alpn(&[b"h2"]), sni(b"ok.test")]),
        ),
        (
            "empty alpn entry",
            build_hello(&[sni(b"ok.test"), alpn(&[b"h2", b""])]),
        ),
        (
            "empty alpn list",
            build_hello(&[sni(b"ok.test"), (16, vec![0, 0])]),
        ),
        (
            "odd versions",
            build_hello(&[sni(b"ok.test"), (43, vec![3, 3, 4, 3])]),
        ),
        (
            "even versions",
            build_hello(&[sni(b"ok.test"), (43, vec![2, 3, 4])]),
        ),
        (
            "duplicate other",
            build_hello(&[sni(b"ok.test"), (5, vec![]), (5, vec![])]),
        ),
        ("32 extensions", build_hello(&many(31))),
        ("33 extensions", build_hello(&many(32))),
        ("two names", {
            let (_, mut one) = sni(b"ok.test");
            let (_, two) = sni(b"b.test");
            one.extend_from_slice(&two[2..]);
            let len = u16::try_from(one.len() - 2).unwrap();
            one[..2].copy_from_slice(&len.to_be_bytes());
            build_hello(&[(0, one)])
        }),
        (
            "name type 1",
            build_hello(&[(0, vec![0, 4, 1, 0, 1, b'a'])]),
        ),
        ("no extensions", build_hello(&[])),
    ];
    let known = ["ok.test", "*.wild.test", "_dmarc.ok.test"];
    let Some(h) = GateServer::start("edges", policy(&known)).await else {
        return;
    };
    let mut mismatches = Vec::new();
    for (label, bytes) in &cases {
        let parsed = client_hello::parse(bytes);
        let want = match client_hello::gate(&parsed) {
            Ok(name) => {
                let wild = name
                    .split_once('.')
                    .map(|(_, parent)| format!("*.{parent}"));
                let hit = known.contains(&name.as_str())
                    || wild.is_some_and(|w| known.contains(&w.as_str()));
                (
                    if hit { Reason::Pass } else { Reason::Unknown },
                    Some(name.to_string()),
                )
            }
            Err(reason) => (reason, None),
        };
        let got = h
            .gate
            .probe(bytes)
            .unwrap_or_else(|e| panic!("{label}: probe: {e}"));
        eprintln!(
            "{label:20} kernel {:?} {:?}",
            got.reason,
            got.name.as_deref().map(|n| &n[..n.len().min(40)])
        );
        if (got.reason, got.name.clone()) != want {
            mismatches.push(format!(
                "{label}: kernel {:?} {:?}, userspace {want:?}",
                got.reason, got.name
            ));
        }
    }
    assert!(mismatches.is_empty(), "{}", mismatches.join("\n"));
}

/// A two-segment ClientHello goes through SOCKS; the server answers as soon as it has the
/// record and the socket left SOCKS, and the client replies at once. The reply must reach the
/// server: a TLS client's Finished lost there leaves the handshake to time out.
#[tokio::test]
async fn bytes_sent_right_after_the_first_record_reach_the_server() {
    const N: usize = 1200;
    const AT_ONCE: usize = 6;
    let hello = Arc::new(corpus("chromium-2.bin"));
    let Some(mut h) = GateServer::start_serving(
        "after",
        policy(&["chromium.example.test"]),
        PinDir::new("after"),
        KernelLog::Off,
        Server::Converse,
    )
    .await
    else {
        return;
    };
    let sockets = h
        .pair
        .client
        .run(|| {
            (0..N)
                .map(|_| tokio::net::TcpSocket::new_v4().expect("client socket"))
                .collect::<Vec<_>>()
        })
        .expect("client namespace thread");
    let sockets = Arc::new(std::sync::Mutex::new(sockets));
    let mut clients = tokio::task::JoinSet::new();
    for _ in 0..AT_ONCE {
        let (sockets, hello) = (sockets.clone(), hello.clone());
        clients.spawn(async move {
            loop {
                let Some(socket) = sockets.lock().expect("sockets").pop() else {
                    return;
                };
                let mut stream = socket
                    .connect(SocketAddr::from((SERVER_IP, PORT)))
                    .await
                    .expect("connect");
                stream.set_nodelay(true).expect("nodelay");
                // The hello leaves as two segments with a moment between them, as a client
                // on a real network sends it: the first one makes the socket, the second
                // completes the record after the server has accepted.
                let (first, second) = hello.split_at(1000);
                stream.write_all(first).await.expect("write the hello");
                tokio::time::sleep(Duration::from_millis(1)).await;
                stream.write_all(second).await.expect("write the hello");
                let mut answer = [0u8; 5];
                tokio::time::timeout(STEP, stream.read_exact(&mut answer))
                    .await
                    .expect("the server answered in time")
                    .expect("read the answer");
                stream.write_all(b"ping").await.expect("write the reply");
                let mut pong = [0u8; 4];
                let _ = tokio::time::timeout(STEP, stream.read_exact(&mut pong)).await;
            }
        });
    }
    let mut lost = 0;
    for i in 0..N {
        let served = h.next().await;
        assert!(
            matches!(served.admission, Admission::Pass(_)),
            "#{i}: {served:?}"
        );
        if served.record.as_deref() != Some(b"ping".as_slice()) {
            lost += 1;
        }
    }
    while clients.join_next().await.is_some() {}
    assert_eq!(lost, 0, "{lost} of {N} replies never reached the server");
    let seen = ingress::gate::pinned_workspaces(h.pins.path()).expect("workspaces");
    assert_eq!((seen.claimed, seen.dirty_words), (0, 0), "{seen:?}");
}
