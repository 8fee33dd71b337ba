//! The upstream annotations besides the protocol, through the real binary: `upstream-vhost`
//! (the Host sent upstream; `X-Forwarded-Host` keeps the client's), `proxy-connect-timeout` (an
//! upstream whose accept queue is full answers no SYN: 504 at the route's timeout, not the
//! flag's), `service-upstream` (the ClusterIP, not the endpoints) and `load-balance:
//! round_robin` (each endpoint in turn), over HTTP/1.1 and h2c.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use ingress_tests::manifests::service_at;
use ingress_tests::process::Ingress;
use ingress_tests::scratch::Scratch;
use ingress_tests::upstream::{Backend, Echo};

fn ingress(name: &str, service: &str, port: u16, annotations: &[(&str, &str)]) -> String {
    let annotations: String = annotations
        .iter()
        .map(|(k, v)| format!("    nginx.ingress.kubernetes.io/{k}: \"{v}\"\n"))
        .collect();
    format!(
        "---\napiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata:\n  name: {name}\n  namespace: t\n  annotations:\n    x: y\n{annotations}spec:\n  ingressClassName: ingress\n  rules:\n  - host: {name}.example\n    http:\n      paths:\n      - {{path: /, pathType: Prefix, backend: {{service: {{name: {service}, port: {{number: {port}}}}}}}}}\n"
    )
}

async fn curl(ingress: &Ingress, host: &str, version: &str) -> (u16, String) {
    let out = tokio::process::Command::new("curl")
        .args(["-s", "--max-time", "15", "-w", "\n%{http_code}", version])
        .args(["-H", &format!("Host: {host}")])
        .arg(ingress.url("/"))
        .output()
        .await
        .expect("curl runs");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, status) = text.rsplit_once('\n').unwrap_or(("", &text));
    (status.trim().parse().unwrap_or(0), body.to_string())
}

fn echo(body: &str) -> Echo {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"))
}

const VERSIONS: [&str; 2] = ["--http1.1", "--http2-prior-knowledge"];

#[tokio::test(flavor = "multi_thread")]
async fn vhost_connect_timeout_service_upstream_and_round_robin() {
    let web = Backend::start("web");
    let cluster = Backend::start("cluster-ip");
    let rr: Vec<Backend> = (0..3).map(|i| Backend::start(&format!("rr{i}"))).collect();
    // A listener that never accepts, its queue filled: further SYNs are dropped.
    let full =
        socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).expect("socket");
    full.bind(&std::net::SocketAddr::from(([127, 0, 0, 1], 0)).into())
        .expect("bind");
    full.listen(0).expect("listen");
    let full_addr = full.local_addr().expect("addr").as_socket().expect("inet");
    let _fillers: Vec<std::net::TcpStream> = (0..4)
        .filter_map(|_| {
            std::net::TcpStream::connect_timeout(&full_addr, Duration::from_millis(200)).ok()
        })
        .collect();

    let dir = Scratch::new("upstream-annotations");
    let mut yaml = String::new();
    yaml += &service_at("t", "web", &[web.addr]);
    yaml += &service_at("t", "full", &[full_addr]);
    let rr_addrs: Vec<_> = rr.iter().map(|b| b.addr).collect();
    yaml += &service_at("t", "rr", &rr_addrs);
    // A Service whose ClusterIP (loopback here) reaches `cluster`, and whose endpoints are `web`.
    yaml += &format!(
        "---\napiVersion: v1\nkind: Service\nmetadata: {{name: both, namespace: t}}\nspec: {{clusterIP: 127.0.0.1, ports: [{{name: http, port: {}}}]}}\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: both-0, namespace: t, labels: {{kubernetes.io/service-name: both}}}}\naddressType: IPv4\nports: [{{name: http, port: {}}}]\nendpoints: [{{addresses: [\"127.0.0.1\"], conditions: {{ready: true}}}}]\n",
        cluster.addr.port(),
        web.addr.port()
    );
    yaml += &ingress(
        "vhost",
        "web",
        80,
        &[("upstream-vhost", "internal.example:8080")],
    );
    yaml += &ingress(
        "slow-connect",
        "full",
        80,
        &[("proxy-connect-timeout", "1")],
    );
    yaml += &ingress(
        "cluster",
        "both",
        cluster.addr.port(),
        &[("service-upstream", "true")],
    );
    yaml += &ingress("endpoints", "both", cluster.addr.port(), &[]);
    yaml += &ingress("rr", "rr", 80, &[("load-balance", "round_robin")]);
    dir.write("annotations.yaml", &yaml);
    let ingress = Ingress::builder().manifests(dir.path()).start();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !ingress.admin_get("/routes").1.contains("rr.example") {
        assert!(Instant::now() < deadline, "never routed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    for version in VERSIONS {
        let (status, body) = curl(&ingress, "vhost.example", version).await;
        assert_eq!(status, 200, "{version}: {body}");
        let seen = echo(&body);
        assert_eq!(seen.headers["host"], "internal.example:8080", "{version}");
        assert_eq!(
            seen.headers["x-forwarded-host"], "vhost.example",
            "{version}"
        );

        let (status, body) = curl(&ingress, "cluster.example", version).await;
        assert_eq!(
            (status, echo(&body).backend.as_str()),
            (200, "cluster-ip"),
            "{version}"
        );
        let (status, body) = curl(&ingress, "endpoints.example", version).await;
        assert_eq!(
            (status, echo(&body).backend.as_str()),
            (200, "web"),
            "{version}"
        );

        let mut served = Vec::new();
        for _ in 0..6 {
            let (status, body) = curl(&ingress, "rr.example", version).await;
            assert_eq!(status, 200);
            served.push(echo(&body).backend);
        }
        for b in &rr {
            let n = served.iter().filter(|s| **s == b.name).count();
            assert_eq!(n, 2, "{version}: round robin gave {served:?}");
        }
    }

    for version in VERSIONS {
        let started = Instant::now();
        let (status, _) = curl(&ingress, "slow-connect.example", version).await;
        let took = started.elapsed();
        assert_eq!(status, 504, "{version}");
        // The route's 1 s, not the flag's 5 s.
        assert!(
            took >= Duration::from_millis(900) && took < Duration::from_secs(4),
            "{version}: {took:?}"
        );
    }
}

/// An endpoint that takes each request and closes without answering.
fn hang_up_endpoint() -> std::net::SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let mut buf = [0u8; 4096];
            let _ = std::io::Read::read(&mut stream, &mut buf);
        }
    });
    addr
}

/// `proxy-next-upstream`: Services with a failing endpoint and a live one, taken in turn
/// (`round_robin`). By default (ingress-nginx's `error timeout`, 3 tries) every GET reaches the
/// live one; a POST the failing endpoint took and dropped is repeated only with
/// `non_idempotent`, while one that found no connection at all always moves on; `off` and
/// `tries: 1` answer the failures. Over HTTP/1.1, and h2c for what reaches no connection.
#[tokio::test(flavor = "multi_thread")]
async fn next_upstream_moves_failed_requests_to_another_endpoint() {
    let live = Backend::start("live");
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr")
    };
    let hang_up = hang_up_endpoint();
    let dir = Scratch::new("next-upstream");
    let mut yaml = service_at("t", "hangup", &[hang_up, live.addr]);
    yaml += &service_at("t", "dead", &[dead, live.addr]);
    let rr = ("load-balance", "round_robin");
    yaml += &ingress("default", "hangup", 80, &[rr]);
    yaml += &ingress("off", "hangup", 80, &[rr, ("proxy-next-upstream", "off")]);
    yaml += &ingress(
        "posts",
        "hangup",
        80,
        &[rr, ("proxy-next-upstream", "error timeout non_idempotent")],
    );
    yaml += &ingress(
        "one-try",
        "hangup",
        80,
        &[rr, ("proxy-next-upstream-tries", "1")],
    );
    yaml += &ingress("refused", "dead", 80, &[rr]);
    dir.write("next.yaml", &yaml);
    let ingress = Ingress::builder().manifests(dir.path()).start();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !ingress.admin_get("/routes").1.contains("refused.example") {
        assert!(Instant::now() < deadline, "never routed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let statuses = |host: &'static str, post: bool, version: &'static str| {
        let ingress = &ingress;
        async move {
            let mut out = Vec::new();
            for _ in 0..6 {
                let mut cmd = tokio::process::Command::new("curl");
                cmd.args(["-s", "-o", "/dev/null", "-w", "%{http_code}", version])
                    .args(["-H", &format!("Host: {host}")]);
                if post {
                    cmd.args(["-d", "x=1"]);
                }
                let out_ = cmd.arg(ingress.url("/")).output().await.expect("curl runs");
                out.push(
                    String::from_utf8_lossy(&out_.stdout)
                        .parse::<u16>()
                        .unwrap_or(0),
                );
            }
            out
        }
    };
    let h1 = "--http1.1";
    let failures = |s: &[u16]| s.iter().filter(|s| **s == 502).count();
    assert_eq!(statuses("default.example", false, h1).await, [200; 6]);
    let off = statuses("off.example", false, h1).await;
    assert_eq!(failures(&off), 3, "{off:?}");
    let one = statuses("one-try.example", false, h1).await;
    assert_eq!(failures(&one), 3, "{one:?}");
    let posts = statuses("default.example", true, h1).await;
    assert_eq!(failures(&posts), 3, "taken, so not repeated: {posts:?}");
    assert_eq!(statuses("posts.example", true, h1).await, [200; 6]);
    for version in VERSIONS {
        assert_eq!(
            statuses("refused.example", true, version).await,
            [200; 6],
            "{version}"
        );
    }
    assert_eq!(live.served(), 6 + 3 + 3 + 3 + 6 + 12);
}
