//! How TLS passthrough connections end, and what they leave behind, in eBPF mode (spliced) and
//! userspace mode (copied): five hundred at once, and every way a splice ends (either side
//! closing or resetting mid-stream, the idle timeout), return the proxy to its baseline of
//! descriptors, tasks and splice-map entries; the idle and upstream connect timeouts apply.
//!
//! The site (three namespaces, the backends, the proxy) is `ingress_tests::passthrough`.
//! Without root, or in eBPF mode without kernel BTF or an embedded eBPF object, the tests print
//! a loud skip notice and pass — unless CI=true, where that is a failure.

// Setup helpers fail the test with a message, as the test bodies do.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use ingress_tests::passthrough::payload::{MIB, drain, send_pattern};
use ingress_tests::passthrough::{BLACKHOLE, DB, STEP, Site};
use ingress_tests::sockopt::linger_zero;
use ingress_tests::tls_client::client_hello;
use ingress_tests::{Mode, both_modes};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

both_modes!(five_hundred_concurrent_connections_leave_nothing_behind);

async fn five_hundred_concurrent_connections_leave_nothing_behind(mode: Mode) {
    let Some(mut site) = Site::start("many", mode, &[]).await else {
        return;
    };
    const N: usize = 500;
    // One connection first, so lazily created state is part of the baseline.
    let mut warm = site.tls(DB).await;
    warm.write_all(b"E").await.unwrap();
    warm.shutdown().await.unwrap();
    drain(&mut warm).await;
    let _ = site.backend.next().await;
    site.wait_idle().await;
    let before = baseline(&site);
    assert_eq!(before.active, 0);
    if let Some(entries) = before.entries {
        assert_eq!(entries, ingress::gate::PinnedSpliceEntries::default());
    }

    let mut open = Vec::with_capacity(N);
    for batch in 0..N / 50 {
        let handshakes = (0..50).map(|_| async {
            let mut tls = site.tls(DB).await;
            // tokio-rustls may keep a small write buffered until flushed.
            tls.write_all(b"Eping").await.unwrap();
            tls.flush().await.unwrap();
            let mut echo = [0u8; 4];
            tls.read_exact(&mut echo).await.unwrap();
            assert_eq!(&echo, b"ping");
            tls
        });
        let batch_open = tokio::time::timeout(
            Duration::from_secs(60),
            futures_util::future::join_all(handshakes),
        )
        .await
        .unwrap_or_else(|_| panic!("batch {batch} did not open in time"));
        open.extend(batch_open);
    }
    let deadline = Instant::now() + STEP;
    while count(site.passthrough_metric("ingress_passthrough_active")) < N as u64 {
        assert!(
            Instant::now() < deadline,
            "{} open",
            site.passthrough_metric("ingress_passthrough_active")
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let during = baseline(&site);
    eprintln!("{mode:?}: before {before:?}, with {N} open {during:?}");
    assert!(
        during.fds >= before.fds + 2 * N,
        "each connection holds two sockets"
    );
    if let Some(entries) = during.entries {
        assert_eq!(
            (entries.splices, entries.splice_socks),
            (2 * N, 2 * N),
            "both sockets of each are spliced"
        );
    }

    // Half end with a FIN from the client, half with a reset.
    let mut closes = Vec::new();
    for (i, mut tls) in open.into_iter().enumerate() {
        if i % 2 == 0 {
            closes.push(async move {
                tls.shutdown().await.unwrap();
                drain(&mut tls).await;
            });
        } else {
            linger_zero(tls.get_ref().0);
            drop(tls);
        }
    }
    tokio::time::timeout(
        Duration::from_secs(60),
        futures_util::future::join_all(closes),
    )
    .await
    .expect("closed in time");
    for _ in 0..N {
        let _ = site.backend.next().await;
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let after = baseline(&site);
        if after == before {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not back to the baseline: before {before:?}, after {after:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let ended = |how| {
        site.metric(
            "ingress_passthrough_ended_total",
            &[("mode", mode.label()), ("how", how)],
        )
    };
    assert_eq!(ended("closed") + ended("client_reset"), (N + 1) as f64);
    assert!(ended("client_reset") >= (N / 2) as f64);
    site.assert_spliced();
}

both_modes!(every_way_a_splice_ends_leaves_nothing_behind);

/// Every way a passthrough connection ends, many at once and with bytes still moving when it
/// does: the client closes, the upstream closes, either side resets mid-stream, the idle
/// timeout closes it. Afterwards the proxy is back where it started, and every splice map is
/// empty: an entry left behind is never deleted, and once the maps fill every passthrough
/// falls back to copying.
async fn every_way_a_splice_ends_leaves_nothing_behind(mode: Mode) {
    const EACH: usize = 40;
    // Long enough that a connection whose client is merely slow to be scheduled (200 start at
    // once, on a busy machine) is not taken for an idle one before it sends its first bytes.
    let extra = ["--passthrough-idle-timeout", "3s"];
    let Some(mut site) = Site::start("ends", mode, &extra).await else {
        return;
    };
    let mut warm = site.tls(DB).await;
    warm.write_all(b"E").await.unwrap();
    warm.shutdown().await.unwrap();
    drain(&mut warm).await;
    let _ = site.backend.next().await;
    site.wait_idle().await;
    let before = baseline(&site);
    if let Some(entries) = before.entries {
        assert_eq!(entries, ingress::gate::PinnedSpliceEntries::default());
    }

    let site_ref = &site;
    let one = |way: usize| async move {
        let mut tls = site_ref.tls(DB).await;
        match way {
            // The client closes after an exchange.
            0 => {
                tls.write_all(b"Eping").await.unwrap();
                tls.shutdown().await.unwrap();
                drain(&mut tls).await;
            }
            // The upstream sends, closes its side, and the client follows.
            1 => {
                tls.write_all(b"S").await.unwrap();
                tls.write_all(&(256 * 1024u64).to_le_bytes()).await.unwrap();
                tls.flush().await.unwrap();
                drain(&mut tls).await;
                let _ = tls.shutdown().await;
            }
            // The client resets in the middle of sending.
            2 => {
                tls.write_all(b"W").await.unwrap();
                let _ = send_pattern(&mut tls, MIB / 2).await;
                linger_zero(tls.get_ref().0);
                drop(tls);
            }
            // The upstream resets while the client is still sending.
            3 => {
                tls.write_all(b"R").await.unwrap();
                let _ = send_pattern(&mut tls, MIB).await;
                drain(&mut tls).await;
            }
            // Quiet until the idle timeout.
            _ => {
                tls.write_all(b"Eping").await.unwrap();
                tls.flush().await.unwrap();
                let mut echo = [0u8; 4];
                tls.read_exact(&mut echo).await.unwrap();
                drain(&mut tls).await;
            }
        }
    };
    let all = (0..5 * EACH).map(|i| one(i % 5));
    tokio::time::timeout(
        Duration::from_secs(120),
        futures_util::future::join_all(all),
    )
    .await
    .expect("every connection ended in time");
    site.backend.settle(Duration::from_secs(2)).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let after = baseline(&site);
        if after == before {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not back to the baseline: before {before:?}, after {after:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let ended = |how| {
        site.metric(
            "ingress_passthrough_ended_total",
            &[("mode", mode.label()), ("how", how)],
        )
    };
    eprintln!(
        "{mode:?}: closed {}, client_reset {}, upstream_reset {}, idle {}",
        ended("closed"),
        ended("client_reset"),
        ended("upstream_reset"),
        ended("idle")
    );
    assert!(
        ended("idle") >= EACH as f64,
        "the idle timeout ended {}",
        ended("idle")
    );
}

both_modes!(idle_and_connect_timeouts_apply);

async fn idle_and_connect_timeouts_apply(mode: Mode) {
    let extra = [
        "--passthrough-idle-timeout",
        "2s",
        "--upstream-connect-timeout",
        "500ms",
    ];
    let Some(mut site) = Site::start("timeouts", mode, &extra).await else {
        return;
    };
    // Quiet after one exchange: closed by the proxy after the idle timeout, on both sides.
    let mut tls = site.tls(DB).await;
    tls.write_all(b"Eping").await.unwrap();
    tls.flush().await.unwrap();
    let mut echo = [0u8; 4];
    tls.read_exact(&mut echo).await.unwrap();
    let quiet = Instant::now();
    let mut buf = [0u8; 16];
    let ended = tokio::time::timeout(STEP, tls.read(&mut buf))
        .await
        .expect("closed by the idle timeout");
    let after = quiet.elapsed();
    assert!(
        (Duration::from_millis(1900)..Duration::from_secs(5)).contains(&after),
        "closed after {after:?}: {ended:?}"
    );
    let served = site.backend.next().await;
    assert_eq!(served.received, 4);
    site.wait_idle().await;
    assert_eq!(
        site.metric(
            "ingress_passthrough_ended_total",
            &[("mode", mode.label()), ("how", "idle")]
        ),
        1.0
    );

    // An endpoint that never answers: the client is reset once the connect timeout passes.
    let mut tcp = site.tcp().await;
    let hello = client_hello(BLACKHOLE);
    let sent = Instant::now();
    tcp.write_all(&hello).await.unwrap();
    let result = tokio::time::timeout(STEP, tcp.read(&mut buf))
        .await
        .expect("an answer in time");
    let after = sent.elapsed();
    let err = result.expect_err("a reset");
    assert_eq!(err.kind(), std::io::ErrorKind::ConnectionReset);
    assert!(
        (Duration::from_millis(450)..Duration::from_secs(3)).contains(&after),
        "reset after {after:?}"
    );
    assert_eq!(
        site.metric(
            "ingress_passthrough_failures_total",
            &[("reason", "connect_timeout")]
        ),
        1.0
    );
}

/// What must return to where it was once connections are gone.
#[derive(Debug, PartialEq, Eq)]
struct Baseline {
    fds: usize,
    tasks: u64,
    active: u64,
    entries: Option<ingress::gate::PinnedSpliceEntries>,
}

/// A metric sample that counts something, as an integer.
#[expect(
    clippy::cast_possible_truncation,
    reason = "counts and gauges of connections and tasks are small non-negative integers"
)]
fn count(value: f64) -> u64 {
    value as u64
}

fn baseline(site: &Site) -> Baseline {
    Baseline {
        fds: site.fds(),
        tasks: count(site.metric("ingress_runtime_alive_tasks", &[])),
        active: count(site.passthrough_metric("ingress_passthrough_active")),
        entries: site.splice_entries(),
    }
}
