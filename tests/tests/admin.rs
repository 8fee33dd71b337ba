//! The admin listener through the real binary: which paths answer which peers, and that no
//! connection on the admin port is held open by a client that stalls or floods it.

// Plain threads and blocking sockets: no async runtime here, so blocking calls block nothing.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::disallowed_methods)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use ingress_tests::client::blocking_get;
use ingress_tests::netns::{NetPair, SERVER_IP};
use ingress_tests::process::Ingress;
use ingress_tests::scratch::Scratch;

/// The admin server's header timeout (`ingress::admin::HEADER_TIMEOUT`).
const HEADER_TIMEOUT: Duration = ingress::admin::HEADER_TIMEOUT;

/// Reads until the server closes, and says how long that took (or `None` if it did not close
/// within `limit`).
fn time_until_closed(stream: &mut TcpStream, limit: Duration) -> Option<Duration> {
    let started = Instant::now();
    stream.set_read_timeout(Some(limit)).unwrap();
    let mut buf = [0u8; 4096];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return Some(started.elapsed()),
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {
                return Some(started.elapsed());
            }
            Err(_) => return None,
        }
        if started.elapsed() > limit {
            return None;
        }
    }
}

#[test]
fn a_partial_head_on_the_admin_port_is_closed_within_the_header_timeout() {
    let dir = Scratch::new("admin-slow");
    let ingress = Ingress::start(dir.path());
    let mut cases: Vec<(&str, &[u8])> = vec![
        ("partial head", b"GET /metrics HTTP/1.1\r\nHo"),
        ("nothing at all", b""),
        (
            "a whole request, then half of the next",
            b"GET /healthz HTTP/1.1\r\nHost: a\r\n\r\nGET /met",
        ),
    ];
    for (what, bytes) in cases.drain(..) {
        let mut stream = TcpStream::connect(ingress.admin).unwrap();
        stream.write_all(bytes).unwrap();
        let closed = time_until_closed(&mut stream, HEADER_TIMEOUT * 3);
        let closed =
            closed.unwrap_or_else(|| panic!("{what}: still open after {:?}", HEADER_TIMEOUT * 3));
        eprintln!("{what}: closed after {closed:?} (header timeout {HEADER_TIMEOUT:?})");
        assert!(
            closed >= HEADER_TIMEOUT - Duration::from_millis(500)
                && closed <= HEADER_TIMEOUT + Duration::from_secs(2),
            "{what}: closed after {closed:?}"
        );
    }
    // The admin port still answers.
    assert_eq!(ingress.admin_get("/healthz").0, 200);
}

#[test]
fn one_peer_cannot_hold_more_than_its_share_of_admin_connections() {
    let dir = Scratch::new("admin-cap");
    let ingress = Ingress::start(dir.path());
    let cap = ingress::admin::MAX_CONNECTIONS_PER_PEER;
    let held: Vec<TcpStream> = (0..cap)
        .map(|_| {
            let mut s = TcpStream::connect(ingress.admin).unwrap();
            s.write_all(b"GET /metrics HTTP/1.1\r\nHo").unwrap();
            s
        })
        .collect();
    // Let the server accept them all before the one over the cap.
    std::thread::sleep(Duration::from_millis(300));
    let mut over = TcpStream::connect(ingress.admin).unwrap();
    let _ = over.write_all(b"GET /healthz HTTP/1.1\r\nHost: a\r\n\r\n");
    let closed = time_until_closed(&mut over, Duration::from_secs(2));
    assert!(closed.is_some(), "the connection over the cap was served");
    // Once the held ones time out, the peer is served again, and the refusal was counted.
    drop(held);
    let deadline = Instant::now() + HEADER_TIMEOUT * 2;
    loop {
        if let Some(n) = ingress.metric("ingress_admin_connections_refused_total", &[]) {
            assert!(n >= 1.0, "refusals counted: {n}");
            break;
        }
        assert!(Instant::now() < deadline, "admin port never answered again");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// (path, status) pairs as a peer on the other end of a veth sees them, for each
/// `--admin-remote-access`; loopback peers get every path whatever the setting.
#[test]
fn diagnostic_paths_answer_loopback_only_unless_asked() {
    let pair = NetPair::create("adm").expect("network namespaces (root)");
    let dir = Scratch::new("admin-remote");
    let cases: &[(Option<&str>, [u16; 4])] = &[
        (None, [200, 200, 200, 403]),
        (Some("probes"), [200, 200, 403, 403]),
        (Some("metrics"), [200, 200, 200, 403]),
        (Some("all"), [200, 200, 200, 200]),
    ];
    let paths = ["/healthz", "/readyz", "/metrics", "/routes"];
    for (access, want) in cases {
        let manifests = dir.path().to_path_buf();
        let extra: Vec<String> = access
            .map(|a| vec!["--admin-remote-access".to_string(), a.to_string()])
            .unwrap_or_default();
        let ingress = pair
            .server
            .run(move || {
                Ingress::builder()
                    .manifests(&manifests)
                    .admin_bind("0.0.0.0")
                    .args(extra)
                    .no_wait()
                    .start()
            })
            .unwrap();
        let remote = SocketAddr::new(SERVER_IP.into(), ingress.admin.port());
        let got: Vec<u16> = pair
            .client
            .run(move || {
                let deadline = Instant::now() + Duration::from_secs(20);
                while blocking_get(remote, "/readyz", "admin").0 != 200 {
                    assert!(Instant::now() < deadline, "not ready over the veth");
                    std::thread::sleep(Duration::from_millis(50));
                }
                paths
                    .iter()
                    .map(|p| blocking_get(remote, p, "admin").0)
                    .collect()
            })
            .unwrap();
        assert_eq!(got, want, "{access:?}; logs:\n{}", ingress.logs());
        let local = ingress.admin;
        let on_loopback: Vec<u16> = pair
            .server
            .run(move || {
                paths
                    .iter()
                    .map(|p| blocking_get(local, p, "admin").0)
                    .collect()
            })
            .unwrap();
        assert_eq!(on_loopback, [200; 4], "{access:?} from loopback");
    }
}
