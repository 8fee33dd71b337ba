//! `limit-rpm`, `limit-rps`, `limit-connections`, `limit-burst-multiplier` and
//! `limit-whitelist` through the real binary with curl, over HTTP/1.1 and h2c: nginx's
//! `limit_req burst=rate*multiplier nodelay` (the burst plus one served at once, then the rest
//! answered 503 without reaching the backend), one zone per Ingress shared by its paths, keyed by
//! the client address; the buckets outlive a configuration change that leaves the policy alone;
//! `limit-rate` paces responses (and an unreadable one refuses the Ingress).

// Plain threads, no runtime: blocking sleeps are what a test of time wants here.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::disallowed_methods)]

use std::time::{Duration, Instant};

use ingress_tests::curl::{self, VERSIONS};
use ingress_tests::manifests::{annotated_ingress, service};
use ingress_tests::process::Ingress;
use ingress_tests::scratch::Scratch;
use ingress_tests::upstream::Backend;

fn statuses(ingress: &Ingress, host: &str, path: &str, version: &str, n: usize) -> Vec<u16> {
    (0..n)
        .map(|_| curl::get(ingress, host, path, version, &[]).status)
        .collect()
}

fn count(statuses: &[u16], status: u16) -> usize {
    statuses.iter().filter(|&&s| s == status).count()
}

fn wait_for_generation_after(ingress: &Ingress, generation: f64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while ingress
        .metric("ingress_snapshot_generation", &[])
        .unwrap_or_default()
        <= generation
    {
        assert!(Instant::now() < deadline, "the change was not applied");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn manifests(web: &Backend, extra: &str) -> String {
    [
        service("t", "web", &[web]),
        // 2 per minute, burst 2 * 1: three at once, then one every 30 s.
        annotated_ingress(
            "t",
            "rpm",
            1,
            &[("limit-rpm", "2"), ("limit-burst-multiplier", "1")],
            &[
                ("rpm.test", "/a", "Prefix", "web"),
                ("rpm.test", "/b", "Prefix", "web"),
            ],
        ),
        annotated_ingress(
            "t",
            "rpm-h2",
            2,
            &[("limit-rpm", "2"), ("limit-burst-multiplier", "1")],
            &[("rpm-h2.test", "/", "Prefix", "web")],
        ),
        // The default multiplier, 5: 1 rps has a burst of 5, six at once.
        annotated_ingress(
            "t",
            "rps",
            3,
            &[("limit-rps", "1")],
            &[("rps.test", "/", "Prefix", "web")],
        ),
        annotated_ingress(
            "t",
            "allowed",
            4,
            &[("limit-rpm", "1"), ("limit-whitelist", "127.0.0.0/8, ::1")],
            &[("allowed.test", "/", "Prefix", "web")],
        ),
        annotated_ingress(
            "t",
            "conn",
            5,
            &[("limit-connections", "1")],
            &[("conn.test", "/", "Prefix", "web")],
        ),
        // 64 KiB/s (after nginx's one second of allowance).
        annotated_ingress(
            "t",
            "bandwidth",
            6,
            &[("limit-rate", "64")],
            &[("bandwidth.test", "/", "Prefix", "web")],
        ),
        // The first 256 KiB at full speed.
        annotated_ingress(
            "t",
            "bandwidth-after",
            8,
            &[("limit-rate", "64"), ("limit-rate-after", "256")],
            &[("bandwidth-after.test", "/", "Prefix", "web")],
        ),
        // A paced download holds its limit-connections slot until its last byte.
        annotated_ingress(
            "t",
            "paced-conn",
            10,
            &[("limit-rate", "64"), ("limit-connections", "1")],
            &[("paced-conn.test", "/", "Prefix", "web")],
        ),
        annotated_ingress(
            "t",
            "bandwidth-bad",
            9,
            &[("limit-rate", "fast")],
            &[("bandwidth-bad.test", "/", "Prefix", "web")],
        ),
        extra.to_string(),
    ]
    .concat()
}

#[test]
fn nginx_limit_req_and_limit_conn() {
    let web = Backend::start("web");
    let dir = Scratch::new("rate-limits");
    dir.write("all.yaml", &manifests(&web, ""));
    let ingress = Ingress::start(dir.path());

    // limit-rpm: three at once, the rest 503, and the backend never sees those.
    let before = web.served();
    let got = statuses(&ingress, "rpm.test", "/a", VERSIONS[0], 5);
    assert_eq!(got, [200, 200, 200, 503, 503], "HTTP/1.1");
    assert_eq!(web.served() - before, 3);
    // The zone is the Ingress's: its other path is limited too.
    assert_eq!(statuses(&ingress, "rpm.test", "/b", VERSIONS[0], 1), [503]);
    // HTTP/2 on its own Ingress (its own zone).
    let got = statuses(&ingress, "rpm-h2.test", "/", VERSIONS[1], 5);
    assert_eq!(got, [200, 200, 200, 503, 503], "h2c");
    assert_eq!(
        ingress.metric(
            "ingress_rate_limited_total",
            &[("namespace", "t"), ("ingress", "rpm"), ("reason", "rpm")]
        ),
        Some(3.0)
    );

    // limit-rps with the default multiplier: 1 + 5 at once, then about one a second.
    let got = statuses(&ingress, "rps.test", "/", VERSIONS[0], 9);
    assert!(count(&got, 200) >= 6 && count(&got, 200) <= 7, "{got:?}");
    assert_eq!(&got[..6], [200; 6], "{got:?}");
    assert_eq!(got[8], 503, "{got:?}");
    std::thread::sleep(Duration::from_millis(2100));
    let got = statuses(&ingress, "rps.test", "/", VERSIONS[1], 2);
    assert_eq!(got[0], 200, "refilled after two seconds: {got:?}");

    // limit-whitelist: the allow-listed client is never limited.
    let got = statuses(&ingress, "allowed.test", "/", VERSIONS[0], 5);
    assert_eq!(got, [200; 5]);

    // limit-connections 1: a second request while the first is in flight (the backend holds
    // it for a second) is refused, on either protocol; after it, one is admitted again.
    for version in VERSIONS {
        let slow = {
            let url = ingress.url("/?delay_ms=1500");
            let version = version.to_string();
            std::thread::spawn(move || {
                curl::write_out("%{http_code}", &[&version, "-H", "Host: conn.test", &url])
            })
        };
        std::thread::sleep(Duration::from_millis(500));
        assert_eq!(
            statuses(&ingress, "conn.test", "/", version, 1),
            [503],
            "{version}: a second concurrent request"
        );
        assert_eq!(slow.join().unwrap(), "200", "{version}");
        assert_eq!(
            statuses(&ingress, "conn.test", "/", version, 1),
            [200],
            "{version}: the first is done"
        );
    }
    assert_eq!(
        ingress.metric(
            "ingress_rate_limited_total",
            &[
                ("namespace", "t"),
                ("ingress", "conn"),
                ("reason", "connections")
            ]
        ),
        Some(2.0)
    );

    // limit-rate: 256 KiB at 64 KiB/s with one second's allowance take about 3 s; with
    // limit-rate-after 256 KiB, or without a limit, they take no time.
    for version in VERSIONS {
        let timed = |host: &str| {
            let started = Instant::now();
            let reply = curl::get(&ingress, host, "/?size=262144", version, &[]);
            assert_eq!(
                (reply.status, reply.body.len()),
                (200, 262_144),
                "{version} {host}"
            );
            started.elapsed()
        };
        let limited = timed("bandwidth.test");
        assert!(
            limited >= Duration::from_millis(2500) && limited < Duration::from_secs(6),
            "{version}: {limited:?}"
        );
        let after = timed("bandwidth-after.test");
        assert!(after < Duration::from_millis(1500), "{version}: {after:?}");
        let open = timed("conn.test");
        assert!(open < Duration::from_millis(1500), "{version}: {open:?}");
    }
    // limit-connections counts a request until its response is sent, not only until its head:
    // while a paced 256 KiB download runs (about 3 s), a second request is refused.
    for version in VERSIONS {
        let download = {
            let url = ingress.url("/?size=262144");
            let version = version.to_string();
            std::thread::spawn(move || {
                std::process::Command::new("curl")
                    .args([
                        "-s",
                        "-o",
                        "/dev/null",
                        "-w",
                        "%{http_code} %{size_download}",
                    ])
                    .args([&version, "-H", "Host: paced-conn.test", &url])
                    .output()
                    .unwrap()
            })
        };
        std::thread::sleep(Duration::from_millis(1500));
        assert_eq!(
            statuses(&ingress, "paced-conn.test", "/", version, 1),
            [503],
            "{version}: the download still holds the slot"
        );
        let out = download.join().unwrap();
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "200 262144",
            "{version}"
        );
        assert_eq!(
            statuses(&ingress, "paced-conn.test", "/", version, 1),
            [200]
        );
    }

    // A limit-rate that does not parse refuses the Ingress, never serves it unlimited.
    assert_eq!(
        statuses(&ingress, "bandwidth-bad.test", "/", VERSIONS[0], 1),
        [503]
    );

    // A configuration change that leaves the policy alone keeps the buckets.
    let generation = ingress.metric("ingress_snapshot_generation", &[]).unwrap();
    dir.replace(
        "all.yaml",
        &manifests(
            &web,
            &annotated_ingress("t", "new", 7, &[], &[("new.test", "/", "Prefix", "web")]),
        ),
    );
    wait_for_generation_after(&ingress, generation);
    assert_eq!(statuses(&ingress, "new.test", "/", VERSIONS[0], 1), [200]);
    assert_eq!(
        statuses(&ingress, "rpm.test", "/a", VERSIONS[0], 1),
        [503],
        "still limited after an unrelated change"
    );
}

/// The client a rate limit counts is the one the identity phase believes: behind a load
/// balancer speaking PROXY protocol, the address its header names (exact bytes), so each real
/// client has its own bucket and `limit-whitelist` judges the real address.
#[test]
fn limits_count_the_client_a_proxy_header_names() {
    use ingress_tests::raw::RawConn;
    let web = Backend::start("web");
    let dir = Scratch::new("rate-limits-proxy-protocol");
    dir.write(
        "all.yaml",
        &[
            service("t", "web", &[&web]),
            annotated_ingress(
                "t",
                "rpm",
                1,
                &[
                    ("limit-rpm", "1"),
                    ("limit-burst-multiplier", "1"),
                    ("limit-whitelist", "10.0.0.0/8"),
                ],
                &[("rpm.test", "/", "Prefix", "web")],
            ),
        ]
        .concat(),
    );
    let ingress = Ingress::builder()
        .manifests(dir.path())
        .args(["--use-proxy-protocol"])
        .start();
    let port = ingress.http.port();
    let status = |client: &str| {
        let mut conn = RawConn::connect(ingress.http);
        conn.exchange(
            format!(
                "PROXY TCP4 {client} 127.0.0.1 40000 {port}\r\nGET / HTTP/1.1\r\nHost: rpm.test\r\nConnection: close\r\n\r\n"
            )
            .as_bytes(),
        )
        .status
    };
    // 1 per minute, burst 1: two at once per client, then 503.
    let first: Vec<u16> = (0..3).map(|_| status("203.0.113.9")).collect();
    assert_eq!(first, [200, 200, 503]);
    let second: Vec<u16> = (0..3).map(|_| status("203.0.113.10")).collect();
    assert_eq!(second, [200, 200, 503], "another client has its own bucket");
    let allowed: Vec<u16> = (0..4).map(|_| status("10.1.2.3")).collect();
    assert_eq!(allowed, [200; 4], "limit-whitelist judges the named client");
}
