//! HTTP/2 upstreams misbehaving, through the real binary (`appProtocol: kubernetes.io/h2c`,
//! h2c clients from curl): a stream refused with REFUSED_STREAM, and a GOAWAY whose last stream
//! id is below the request's, are both retried on a new connection and answered; a GOAWAY storm
//! (every connection refused that way) is a 502, not a hang; many streams at once are spread
//! over more than one upstream connection, and over as many as the upstream's
//! `SETTINGS_MAX_CONCURRENT_STREAMS` needs. Servers are written with the h2 crate, which lets a
//! test do what a well-behaved server would not.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use ingress_tests::manifests::service_at;
use ingress_tests::process::Ingress;
use ingress_tests::scratch::Scratch;

/// What the server does with the first stream of each connection.
#[derive(Clone, Copy)]
enum First {
    /// RST_STREAM(REFUSED_STREAM) on the first connection's first stream only.
    RefuseOnce,
    /// GOAWAY(last stream id 0, NO_ERROR) on the first connection, before any stream is read.
    GoAwayOnce,
    /// GOAWAY on every connection.
    GoAwayAlways,
    /// Answer every stream after a pause, so streams pile up.
    Slow,
    /// As `Slow`, allowing at most [`FEW_STREAMS`] streams at once per connection.
    SlowFewStreams,
}

/// The `SETTINGS_MAX_CONCURRENT_STREAMS` of [`First::SlowFewStreams`].
const FEW_STREAMS: u32 = 20;

struct Counters {
    connections: AtomicUsize,
    answered: AtomicUsize,
}

async fn h2_server(first: First) -> (SocketAddr, Arc<Counters>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let counters = Arc::new(Counters {
        connections: AtomicUsize::new(0),
        answered: AtomicUsize::new(0),
    });
    let c = counters.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let n = c.connections.fetch_add(1, Ordering::Relaxed);
            let c = c.clone();
            tokio::spawn(async move {
                let mut builder = h2::server::Builder::new();
                builder.max_concurrent_streams(match first {
                    First::SlowFewStreams => FEW_STREAMS,
                    _ => 1000,
                });
                let Ok(mut conn) = builder.handshake::<_, Bytes>(stream).await else {
                    return;
                };
                let go_away = match first {
                    First::GoAwayOnce => n == 0,
                    First::GoAwayAlways => true,
                    _ => false,
                };
                if go_away {
                    conn.abrupt_shutdown(h2::Reason::NO_ERROR);
                    // Drive the connection so the GOAWAY is written, then let it close.
                    let _ = tokio::time::timeout(Duration::from_secs(2), async {
                        while conn.accept().await.is_some() {}
                    })
                    .await;
                    return;
                }
                let mut refused = false;
                while let Some(Ok((_req, mut respond))) = conn.accept().await {
                    if matches!(first, First::RefuseOnce) && n == 0 && !refused {
                        refused = true;
                        respond.send_reset(h2::Reason::REFUSED_STREAM);
                        continue;
                    }
                    let c = c.clone();
                    tokio::spawn(async move {
                        if matches!(first, First::Slow | First::SlowFewStreams) {
                            tokio::time::sleep(Duration::from_millis(500)).await;
                        }
                        let response = http::Response::builder()
                            .status(200)
                            .body(())
                            .expect("response");
                        if let Ok(mut send) = respond.send_response(response, false) {
                            let _ = send.send_data(Bytes::from_static(b"ok"), true);
                            c.answered.fetch_add(1, Ordering::Relaxed);
                        }
                    });
                }
            });
        }
    });
    (addr, counters)
}

async fn curl(ingress: &Ingress, host: &str) -> (u16, String) {
    let out = tokio::process::Command::new("curl")
        .args([
            "-s",
            "--max-time",
            "10",
            "-w",
            "\n%{http_code}",
            "--http2-prior-knowledge",
        ])
        .args(["-H", &format!("Host: {host}")])
        .arg(ingress.url("/"))
        .output()
        .await
        .expect("curl runs");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, status) = text.rsplit_once('\n').unwrap_or(("", &text));
    (status.trim().parse().unwrap_or(0), body.to_string())
}

/// `n` requests at once on one HTTP/2 connection to the proxy; how many were answered 200.
async fn parallel(ingress: &Ingress, host: &str, n: usize) -> usize {
    let url = ingress.url("/");
    let urls: Vec<String> = (0..n).map(|_| url.clone()).collect();
    let out = tokio::process::Command::new("curl")
        .args([
            "-s",
            "--max-time",
            "20",
            "--http2-prior-knowledge",
            "--parallel",
            "--parallel-max",
            &n.to_string(),
        ])
        .args([
            "--parallel-immediate",
            "-H",
            &format!("Host: {host}"),
            "-w",
            "%{http_code}\n",
        ])
        .args(&urls)
        .output()
        .await
        .expect("curl runs");
    // Bodies ("ok") and codes interleave in curl's output; each code ends its line.
    String::from_utf8_lossy(&out.stdout)
        .matches("200\n")
        .count()
}

fn h2c_route(name: &str, addr: SocketAddr) -> String {
    let service = service_at("t", name, &[addr]).replace(
        "{name: http, port: 80}",
        "{name: http, port: 80, appProtocol: kubernetes.io/h2c}",
    );
    format!(
        "{service}---\napiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {{name: {name}, namespace: t}}\nspec:\n  ingressClassName: ingress\n  rules:\n  - host: {name}.example\n    http:\n      paths:\n      - {{path: /, pathType: Prefix, backend: {{service: {{name: {name}, port: {{number: 80}}}}}}}}\n"
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn refused_streams_and_goaway_are_retried_storms_fail_and_load_spreads() {
    let (refuse, refuse_n) = h2_server(First::RefuseOnce).await;
    let (goaway, goaway_n) = h2_server(First::GoAwayOnce).await;
    let (storm, storm_n) = h2_server(First::GoAwayAlways).await;
    let (slow, slow_n) = h2_server(First::Slow).await;
    let (few, few_n) = h2_server(First::SlowFewStreams).await;
    let dir = Scratch::new("upstream-h2");
    let yaml = [
        h2c_route("refuse", refuse),
        h2c_route("goaway", goaway),
        h2c_route("storm", storm),
        h2c_route("slow", slow),
        h2c_route("few", few),
    ]
    .concat();
    dir.write("h2.yaml", &yaml);
    let ingress = Ingress::builder().manifests(dir.path()).start();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !ingress.admin_get("/routes").1.contains("few.example") {
        assert!(Instant::now() < deadline, "never routed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let (status, body) = curl(&ingress, "refuse.example").await;
    assert_eq!(
        (status, body.as_str()),
        (200, "ok"),
        "REFUSED_STREAM retried:\n{}",
        ingress.logs()
    );
    assert_eq!(refuse_n.answered.load(Ordering::Relaxed), 1);
    assert!(refuse_n.connections.load(Ordering::Relaxed) >= 2);

    let (status, body) = curl(&ingress, "goaway.example").await;
    assert_eq!(
        (status, body.as_str()),
        (200, "ok"),
        "GOAWAY retried:\n{}",
        ingress.logs()
    );
    assert!(goaway_n.connections.load(Ordering::Relaxed) >= 2);

    let started = Instant::now();
    let (status, _) = curl(&ingress, "storm.example").await;
    assert_eq!(status, 502, "a GOAWAY storm fails cleanly");
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "{:?}",
        started.elapsed()
    );
    // Tried, then once more, and no more than that.
    assert!(storm_n.connections.load(Ordering::Relaxed) <= 3);

    // 250 concurrent streams from one client connection: more than one connection upstream
    // (100 streams each at most), all answered.
    assert_eq!(parallel(&ingress, "slow.example", 250).await, 250);
    assert_eq!(slow_n.answered.load(Ordering::Relaxed), 250);
    let conns = slow_n.connections.load(Ordering::Relaxed);
    assert!(
        (2..=10).contains(&conns),
        "{conns} upstream connections for 250 streams"
    );

    // An upstream that takes 20 streams at once per connection: 100 at once need 5
    // connections; none waits queued behind a full one.
    let started = Instant::now();
    assert_eq!(parallel(&ingress, "few.example", 100).await, 100);
    assert_eq!(few_n.answered.load(Ordering::Relaxed), 100);
    let conns = few_n.connections.load(Ordering::Relaxed);
    assert!(
        (5..=12).contains(&conns),
        "{conns} upstream connections for 100 streams, 20 per connection"
    );
    // Each answer takes 500 ms; streams queued behind full connections would take 2.5 s.
    assert!(
        started.elapsed() < Duration::from_millis(2000),
        "{:?}",
        started.elapsed()
    );

    // The proxy is still fine for everyone else.
    let (status, _) = curl(&ingress, "refuse.example").await;
    assert_eq!(status, 200);
}
